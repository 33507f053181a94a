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

use super::RunAs;
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
            let f = |v: u64, scale: u64| {
                if v == 0 {
                    "max".to_string()
                } else {
                    (v * scale).to_string()
                }
            };
            write(
                &cg.path.join("io.max"),
                &format!(
                    "{dev} riops={} wiops={} rbps={} wbps={}",
                    f(caps.read_iops, 1),
                    f(caps.write_iops, 1),
                    f(caps.read_mbps, 1 << 20),
                    f(caps.write_mbps, 1 << 20)
                ),
            )?;
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
