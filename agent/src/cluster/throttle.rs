//! Instance emulation: the cluster's server processes go into cgroups that
//! make this host behave like the instance under test.
//! - Storage: block-I/O throttling on the device behind the data directory
//!   (cgroup v1 `blkio.throttle.*`, v2 `io.max`), so a local disk behaves
//!   like a capped network volume (gp3: 3,000 IOPS, 125 MiB/s).
//! - Memory: a memory cgroup (v1 `memory.limit_in_bytes`, v2 `memory.max`)
//!   that counts the page cache of the cluster's files, so reads of a
//!   dataset larger than the instance's memory reach the device, as on the
//!   real instance.
//! - CPUs: CPU time of that many CPUs (v1 `cpu.cfs_quota_us`, v2
//!   `cpu.max`), not pinned: clusters of several agents on one host share
//!   its cores as the scheduler sees fit.
//!
//! cgroup v1 has a hierarchy per controller, so a cluster may have up to
//! three cgroups; v2 one. The postmaster joins them itself, before exec (it
//! writes `0` to each `cgroup.procs`, which the agent made writable for the
//! server's user), so every process it forks is limited from the start. The
//! cgroups are removed after the server stops; their paths are kept in the
//! cluster's directory so `reap_stale` can remove them after an agent died.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::device::DeviceStat;
use super::identity::RunAs;
use crate::{Error, Result};

/// I/O caps; 0 means uncapped (the type the environment reports).
pub use pgfleet_proto::environment::Caps;

/// What to emulate; zero / empty fields are not limited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub caps: Caps,
    /// Memory, page cache included.
    pub memory_bytes: u64,
    pub cpus: u32,
    /// A block-I/O cgroup even without caps, to count the device bytes.
    pub account_io: bool,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.caps.is_capped() || self.memory_bytes > 0 || self.cpus > 0 || self.account_io
    }
}

/// cgroup v1's throttling layer counts a cgroup's bytes only on devices it
/// has a rule for: accounting without a cap sets this (never reached) one.
const NO_CAP_BPS: u64 = 1 << 50;

/// (read, written) bytes of a block-I/O cgroup over every device: v1
/// `blkio.throttle.io_service_bytes` ("<dev> Read <n>"), v2 `io.stat`
/// ("<dev> rbytes=<n> wbytes=<n> ..."). None for other cgroups.
pub fn io_bytes(path: &Path) -> Option<(u64, u64)> {
    if let Ok(t) = std::fs::read_to_string(path.join("blkio.throttle.io_service_bytes")) {
        let (mut r, mut w) = (0, 0);
        for line in t.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if let [_, op, n] = f[..] {
                let n: u64 = n.parse().unwrap_or(0);
                match op {
                    "Read" => r += n,
                    "Write" => w += n,
                    _ => {}
                }
            }
        }
        return Some((r, w));
    }
    let t = std::fs::read_to_string(path.join("io.stat")).ok()?;
    let (mut r, mut w) = (0, 0);
    for kv in t.split_whitespace() {
        if let Some(n) = kv.strip_prefix("rbytes=") {
            r += n.parse::<u64>().unwrap_or(0);
        } else if let Some(n) = kv.strip_prefix("wbytes=") {
            w += n.parse::<u64>().unwrap_or(0);
        }
    }
    Some((r, w))
}

const CG_ROOT: &str = "/sys/fs/cgroup";
const V1_ROOT: &str = "/sys/fs/cgroup/blkio";
const V2_ROOT: &str = "/sys/fs/cgroup";

/// A created cgroup; `remove` (or `remove_path`) deletes it once empty.
#[derive(Debug)]
pub struct Cgroup {
    pub path: PathBuf,
    /// cgroup v1 lets the server join by itself before exec; v2 requires
    /// write access to a common ancestor, so the agent moves it after spawn.
    pub self_join: bool,
}

/// `major:minor` of the whole disk holding `dir` (throttling applies to
/// disks, not partitions).
pub fn device_of(dir: &Path) -> Result<String> {
    let meta =
        std::fs::metadata(dir).map_err(|e| Error::io(format!("stat {}", dir.display()), e))?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return Err(Error::Provision(format!(
            "{} is on a filesystem without a block device (tmpfs, overlay, ...): its I/O cannot be throttled; \
             put the data dir on a disk (--data-dir) or set `emulate: false`",
            dir.display()
        )));
    }
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if sys.join("partition").exists()
        && let Ok(parent) = std::fs::read_to_string(sys.join("../dev"))
    {
        return Ok(parent.trim().to_string());
    }
    Ok(format!("{major}:{minor}"))
}

/// Creates the cgroups `limits` need (each `pgfleet/<name>` in its
/// hierarchy), writable for `run_as` so the postmaster can join them.
/// On any error, what was created is removed.
pub fn create(
    name: &str,
    data_dir: &Path,
    limits: &Limits,
    run_as: Option<&RunAs>,
) -> Result<Vec<Cgroup>> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Provision(
            "emulating an instance or a capped storage profile needs root (cgroups); run the agent as root, \
             or set `emulate: false` on the class's storage / instance to run unlimited (the report will say so)"
                .into(),
        ));
    }
    let v2 = !Path::new(CG_ROOT).join("memory").exists()
        && Path::new(CG_ROOT).join("cgroup.controllers").exists();
    let mut made: Vec<Cgroup> = Vec::new();
    let r = (|| -> Result<()> {
        if limits.caps.is_capped() || limits.account_io {
            made.push(create_io(name, data_dir, limits.caps, run_as)?);
        }
        if v2 {
            if limits.memory_bytes > 0 || limits.cpus > 0 {
                made.push(create_v2(name, limits, run_as)?);
            }
            return Ok(());
        }
        if limits.memory_bytes > 0 {
            let cg = v1_group("memory", name, run_as)?;
            made.push(cg);
            let cg = made.last().expect("just pushed");
            write(
                &cg.path.join("memory.limit_in_bytes"),
                &limits.memory_bytes.to_string(),
            )?;
        }
        if limits.cpus > 0 {
            let cg = v1_group("cpu", name, run_as)?;
            made.push(cg);
            let cg = made.last().expect("just pushed");
            write(&cg.path.join("cpu.cfs_period_us"), "100000")?;
            write(
                &cg.path.join("cpu.cfs_quota_us"),
                &(limits.cpus as u64 * 100_000).to_string(),
            )?;
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(made),
        Err(e) => {
            for cg in &made {
                let _ = remove_path(&cg.path);
            }
            Err(e)
        }
    }
}

/// `pgfleet/<name>` in a cgroup v1 hierarchy, its `cgroup.procs` owned by
/// `run_as`.
fn v1_group(controller: &str, name: &str, run_as: Option<&RunAs>) -> Result<Cgroup> {
    let parent = Path::new(CG_ROOT).join(controller).join("pgfleet");
    let path = parent.join(name);
    if path.exists() {
        let _ = std::fs::remove_dir(&path);
    }
    mkdir(&parent)?;
    mkdir(&path)?;
    if let Some(u) = run_as {
        nix::unistd::chown(
            &path.join("cgroup.procs"),
            Some(u.uid.into()),
            Some(u.gid.into()),
        )
        .map_err(|e| Error::Provision(format!("chown {}/cgroup.procs: {e}", path.display())))?;
    }
    Ok(Cgroup {
        path,
        self_join: true,
    })
}

/// cgroup v2: memory and CPU time in one `pgfleet-mem/<name>` (the io
/// cgroup is its own, see `create_io`).
fn create_v2(name: &str, limits: &Limits, _run_as: Option<&RunAs>) -> Result<Cgroup> {
    let root = Path::new(V2_ROOT);
    let parent = root.join("pgfleet-instance");
    let path = parent.join(name);
    mkdir(&parent)?;
    write(&root.join("cgroup.subtree_control"), "+memory +cpu")?;
    write(&parent.join("cgroup.subtree_control"), "+memory +cpu")?;
    mkdir(&path)?;
    if limits.memory_bytes > 0 {
        write(&path.join("memory.max"), &limits.memory_bytes.to_string())?;
    }
    if limits.cpus > 0 {
        write(
            &path.join("cpu.max"),
            &format!("{} 100000", limits.cpus as u64 * 100_000),
        )?;
    }
    Ok(Cgroup {
        path,
        self_join: false,
    })
}

/// The block-I/O cgroup `pgfleet/<name>` with the caps on the device behind
/// `data_dir`, writable for `run_as` so the postmaster can join it.
fn create_io(name: &str, data_dir: &Path, caps: Caps, run_as: Option<&RunAs>) -> Result<Cgroup> {
    let dev = device_of(data_dir)?;
    let v1 = Path::new(V1_ROOT)
        .join("blkio.throttle.read_iops_device")
        .exists();
    let v2 = std::fs::read_to_string(Path::new(V2_ROOT).join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"));
    let root = if v1 {
        PathBuf::from(V1_ROOT)
    } else if v2 {
        PathBuf::from(V2_ROOT)
    } else {
        return Err(Error::Provision(
            "this host has neither cgroup v1 blkio nor cgroup v2 io: capped storage cannot be emulated; \
             set `emulate: false` to run uncapped"
                .into(),
        ));
    };
    let parent = root.join("pgfleet");
    let path = parent.join(name);
    if path.exists() {
        let _ = std::fs::remove_dir(&path);
    }
    // Another agent may remove the empty parent between our two mkdirs.
    let mut made = Err(Error::Provision(format!(
        "could not create {}",
        path.display()
    )));
    for _ in 0..5 {
        mkdir(&parent)?;
        if !v1 {
            // v2: the io controller must be enabled for pgfleet/'s children.
            write(&root.join("cgroup.subtree_control"), "+io")?;
            write(&parent.join("cgroup.subtree_control"), "+io")?;
        }
        made = mkdir(&path);
        if made.is_ok() {
            break;
        }
    }
    made?;
    let cg = Cgroup {
        path,
        self_join: v1,
    };
    let apply = || -> Result<()> {
        if v1 {
            let b = 1024 * 1024;
            // Uncapped (accounting only): a rule that never throttles, so
            // the bytes are counted.
            let bps = |mbps: u64| {
                if caps.is_capped() {
                    mbps * b
                } else {
                    NO_CAP_BPS
                }
            };
            for (file, v) in [
                ("blkio.throttle.read_iops_device", caps.read_iops),
                ("blkio.throttle.write_iops_device", caps.write_iops),
                ("blkio.throttle.read_bps_device", bps(caps.read_mbps)),
                ("blkio.throttle.write_bps_device", bps(caps.write_mbps)),
            ] {
                if v > 0 {
                    write(&cg.path.join(file), &format!("{dev} {v}"))?;
                }
            }
        } else {
            write(&cg.path.join("io.max"), &io_max(&dev, caps))?;
        }
        if let Some(u) = run_as.filter(|_| v1) {
            nix::unistd::chown(
                &cg.path.join("cgroup.procs"),
                Some(u.uid.into()),
                Some(u.gid.into()),
            )
            .map_err(|e| Error::Provision(format!("chown cgroup.procs: {e}")))?;
        }
        Ok(())
    };
    match apply() {
        Ok(()) => Ok(cg),
        Err(e) => {
            let _ = remove_path(&cg.path);
            Err(e)
        }
    }
}

/// Removes a cgroup once its processes are gone (bounded wait), and the
/// shared `pgfleet` parent when it is left empty.
pub fn remove_path(path: &Path) -> Result<()> {
    let removed = (|| {
        for _ in 0..100 {
            match std::fs::remove_dir(path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        std::fs::remove_dir(path)
            .map_err(|e| Error::io(format!("removing cgroup {}", path.display()), e))
    })();
    if let Some(parent) = path.parent().filter(|p| {
        p.file_name()
            .is_some_and(|n| n == "pgfleet" || n == "pgfleet-instance")
    }) {
        // Fails harmlessly while other clusters still use it.
        let _ = std::fs::remove_dir(parent);
    }
    removed
}

/// Pids currently in a cgroup (for tests and diagnostics).
pub fn pids(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn mkdir(p: &Path) -> Result<()> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io(format!("creating cgroup {}", p.display()), e)),
    }
}

fn write(p: &Path, v: &str) -> Result<()> {
    std::fs::write(p, v)
        .map_err(|e| Error::Provision(format!("writing `{v}` to {}: {e}", p.display())))
}

/// Whether block I/O is throttled through cgroup v1's blkio hierarchy.
pub fn v1() -> bool {
    Path::new(V1_ROOT)
        .join("blkio.throttle.read_iops_device")
        .exists()
}

/// Caps device `dev` (`major:minor`, a cluster's own loop device) for
/// everything that reaches it from cgroup v1's root blkio cgroup: the
/// kernel's writeback as well as processes that stay in the root (v1
/// limits are not hierarchical, so the cluster's processes must not join a
/// blkio cgroup of their own). The device then behaves as the emulated
/// volume, whoever writes to it. `uncap_device` undoes it.
pub fn cap_device(dev: &str, caps: Caps) -> Result<()> {
    let root = Path::new(V1_ROOT);
    for (file, v) in [
        ("blkio.throttle.read_iops_device", caps.read_iops),
        ("blkio.throttle.write_iops_device", caps.write_iops),
        ("blkio.throttle.read_bps_device", caps.read_mbps << 20),
        ("blkio.throttle.write_bps_device", caps.write_mbps << 20),
    ] {
        if v > 0 {
            write(&root.join(file), &format!("{dev} {v}"))?;
        }
    }
    Ok(())
}

/// Rewrites the caps of a cluster's block-I/O cgroup `cg` on device `dev`
/// (made by `create_io`): every rule, 0 removing one. What a fault that
/// changes the caps for a window writes, and writes back.
pub fn recap_cgroup(cg: &Path, dev: &str, caps: Caps) -> Result<()> {
    if cg.join("blkio.throttle.read_iops_device").exists() {
        for (file, v) in [
            ("blkio.throttle.read_iops_device", caps.read_iops),
            ("blkio.throttle.write_iops_device", caps.write_iops),
            ("blkio.throttle.read_bps_device", caps.read_mbps << 20),
            ("blkio.throttle.write_bps_device", caps.write_mbps << 20),
        ] {
            write(&cg.join(file), &format!("{dev} {v}"))?;
        }
        return Ok(());
    }
    write(&cg.join("io.max"), &io_max(dev, caps))
}

/// cgroup v2's `io.max` line for `caps` on `dev` (0: `max`, uncapped).
fn io_max(dev: &str, caps: Caps) -> String {
    let f = |v: u64, scale: u64| {
        if v == 0 {
            "max".to_string()
        } else {
            (v * scale).to_string()
        }
    };
    format!(
        "{dev} riops={} wiops={} rbps={} wbps={}",
        f(caps.read_iops, 1),
        f(caps.write_iops, 1),
        f(caps.read_mbps, 1 << 20),
        f(caps.write_mbps, 1 << 20)
    )
}

/// Whether `cg` is a block-I/O cgroup (v1 blkio or v2 with io.max).
pub fn is_io_cgroup(cg: &Path) -> bool {
    cg.join("blkio.throttle.read_iops_device").exists() || cg.join("io.max").exists()
}

/// How often `Budget` splits a combined budget again.
pub const BUDGET_TICK: Duration = Duration::from_millis(250);

/// A device whose reads and writes share one budget (`Caps::combined`: EBS
/// counts gp3's IOPS and MiB/s over both), where the kernel caps each
/// direction on its own: a thread that every `BUDGET_TICK` reads the
/// device's counters (`/sys/dev/block/<dev>/stat`) and rewrites its v1
/// throttle rules (`cap_device`) with each budget split between reads and
/// writes by what they used (`split`). The rules' sum never exceeds the
/// budget. Dropping it stops the thread (before the device's rules go).
pub struct Budget {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Budget {
    /// Splits `caps`' budgets on `dev` from now on: each direction starts
    /// with half of each.
    pub fn start(dev: &str, caps: Caps) -> Result<Budget> {
        let iops = caps.read_iops.max(caps.write_iops);
        let bps = caps.read_mbps.max(caps.write_mbps) << 20;
        let mut rules = Rules {
            iops: (iops, (iops / 2, iops - iops / 2)),
            bps: (bps, (bps / 2, bps - bps / 2)),
        };
        rules.write(dev)?;
        let dev = dev.to_string();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("io-budget-{dev}"))
            .spawn(move || {
                let mut last = (std::time::Instant::now(), DeviceStat::of(&dev));
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(BUDGET_TICK)
                {
                    let now = (std::time::Instant::now(), DeviceStat::of(&dev));
                    if let (Some(a), Some(b)) = (last.1, now.1) {
                        let secs = now.0.duration_since(last.0).as_secs_f64().max(1e-3);
                        let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
                        let iops = (rate(a.reads, b.reads), rate(a.writes, b.writes));
                        let bps = (
                            rate(a.read_bytes, b.read_bytes),
                            rate(a.write_bytes, b.write_bytes),
                        );
                        let next = Rules {
                            iops: (rules.iops.0, split(rules.iops.0, rules.iops.1, iops)),
                            bps: (rules.bps.0, split(rules.bps.0, rules.bps.1, bps)),
                        };
                        if (next.iops, next.bps) != (rules.iops, rules.bps) {
                            if let Err(e) = next.write(&dev) {
                                tracing::warn!("splitting the I/O budget of device {dev}: {e}");
                            }
                            rules = next;
                        }
                    }
                    last = now;
                }
            })
            .map_err(|e| Error::io("starting the I/O budget's thread", e))?;
        Ok(Budget {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A device's throttle rules under a budget: (budget, (read cap, write
/// cap)) for IOPS and for bytes/s; a budget of 0 is uncapped.
struct Rules {
    iops: (u64, (u64, u64)),
    bps: (u64, (u64, u64)),
}

impl Rules {
    fn write(&self, dev: &str) -> Result<()> {
        let root = Path::new(V1_ROOT);
        for (file, budget, v) in [
            (
                "blkio.throttle.read_iops_device",
                self.iops.0,
                self.iops.1.0,
            ),
            (
                "blkio.throttle.write_iops_device",
                self.iops.0,
                self.iops.1.1,
            ),
            ("blkio.throttle.read_bps_device", self.bps.0, self.bps.1.0),
            ("blkio.throttle.write_bps_device", self.bps.0, self.bps.1.1),
        ] {
            if budget > 0 {
                write(&root.join(file), &format!("{dev} {v}"))?;
            }
        }
        Ok(())
    }
}

/// One budget's split for the next tick, from each direction's cap and
/// use in the last (per second): max-min fair between reads and writes.
/// A direction using at least 90 % of its cap wants more than it got. Both
/// wanting more: half each. One: the other gets what it used and a quarter
/// more (at most half the budget), it the rest. Neither: each keeps its
/// use plus half of what is left. Each gets at least a fiftieth, so a
/// direction that wakes up is seen; the two never sum above the budget.
pub fn split(budget: u64, cap: (u64, u64), used: (f64, f64)) -> (u64, u64) {
    if budget < 2 {
        return (budget, budget);
    }
    let b = budget as f64;
    let floor = (b / 50.0).max(1.0);
    let wants = |cap: u64, used: f64| used >= 0.9 * cap as f64;
    let read = match (wants(cap.0, used.0), wants(cap.1, used.1)) {
        (true, true) => b / 2.0,
        (true, false) => b - (used.1 * 1.25).clamp(floor, b / 2.0),
        (false, true) => (used.0 * 1.25).clamp(floor, b / 2.0),
        (false, false) => used.0 + (b - used.0 - used.1).max(0.0) / 2.0,
    };
    let read = (read.round() as u64).clamp(floor as u64, budget - floor as u64);
    (read, budget - read)
}

/// Removes `cap_device`'s rules on `dev` (best effort: a rule that is not
/// there is nothing to remove).
pub fn uncap_device(dev: &str) {
    let root = Path::new(V1_ROOT);
    for file in [
        "blkio.throttle.read_iops_device",
        "blkio.throttle.write_iops_device",
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
    ] {
        let has = std::fs::read_to_string(root.join(file))
            .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().next() == Some(dev)));
        if has {
            let _ = write(&root.join(file), &format!("{dev} 0"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A combined budget follows demand, max-min fair, and never sums
    /// above the budget.
    #[test]
    fn a_combined_budget_goes_where_the_demand_is() {
        let b = 400;
        // Writes idle, reads at their cap: reads take all but the floor.
        assert_eq!(split(b, (200, 200), (200.0, 0.0)), (392, 8));
        // Both at their caps: half each, whatever the split was.
        assert_eq!(split(b, (392, 8), (390.0, 8.0)), (200, 200));
        // Writes want 100 of a 200 cap, reads all they can get.
        assert_eq!(split(b, (200, 200), (200.0, 100.0)), (275, 125));
        // Writes want more than half: half each once both want more.
        assert_eq!(split(b, (100, 300), (100.0, 250.0)), (200, 200));
        // Neither at its cap: each keeps its use and half the rest.
        assert_eq!(split(b, (200, 200), (50.0, 30.0)), (210, 190));
        // An idle device: half each.
        assert_eq!(split(b, (392, 8), (0.0, 0.0)), (200, 200));
        // Tiny budgets keep at least one each.
        assert_eq!(split(2, (1, 1), (1.0, 0.0)), (1, 1));
        for cap in [(1, 399), (200, 200), (399, 1)] {
            for used in [
                (0.0, 0.0),
                (500.0, 0.0),
                (0.0, 500.0),
                (500.0, 500.0),
                (150.0, 150.0),
            ] {
                let (r, w) = split(b, cap, used);
                assert_eq!(r + w, b, "{cap:?} {used:?}");
                assert!(r >= 8 && w >= 8, "{cap:?} {used:?}");
            }
        }
        assert_eq!(split(0, (0, 0), (10.0, 10.0)), (0, 0));
        assert_eq!(split(1, (1, 1), (1.0, 1.0)), (1, 1));
    }

    #[test]
    fn device_of_a_disk_backed_dir_is_a_whole_disk() {
        let dev = device_of(&std::env::temp_dir()).unwrap_or_default();
        if let Some((maj, min)) = dev.split_once(':') {
            assert!(maj.parse::<u32>().unwrap() > 0);
            assert!(!Path::new(&format!("/sys/dev/block/{maj}:{min}/partition")).exists());
        }
        assert!(
            device_of(Path::new("/proc"))
                .unwrap_err()
                .to_string()
                .contains("without a block device")
        );
    }
}
