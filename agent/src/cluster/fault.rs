//! What faults do to a cluster: a crash (every server process killed at
//! once, then crash recovery) and a window of other I/O caps. Both put the
//! cluster back as it was on every path: a crash's server is the
//! cluster's child again (teardown stops it), a caps window's guard writes
//! the class's caps back when dropped (a cancelled cell drops it too).

use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::throttle::{self, Caps};
use super::{Cluster, evict_file};
use crate::{Error, Result};

/// A crash and the recovery after it.
#[derive(Debug, Clone)]
pub struct Crashed {
    /// When the server's processes were killed.
    pub killed: Instant,
    /// When it accepted connections again.
    pub accepting: Instant,
    /// The WAL crash recovery replayed (`redo starts at` to `redo done at`
    /// in the server log; 0 when it logged `redo is not required`), and
    /// how long the redo took by the server's own count.
    pub wal_replayed_bytes: Option<u64>,
    pub redo_s: Option<f64>,
}

impl Cluster {
    /// Kills every process of the server at once (SIGKILL to the
    /// postmaster and each of its children, backends and auxiliary
    /// processes, as a power loss would stop them), drops the cluster's files from the page
    /// cache (pages the kernel has not written yet stay: a power loss would
    /// lose them, and recovery rewrites them from the WAL), and starts it
    /// again: crash recovery replays the WAL since the last checkpoint, at
    /// the class's caps. Fails when the server is not back `within`, with
    /// its log's reason. The cell's watch on the server does not fire.
    pub async fn crash(&self, within: Duration) -> Result<Crashed> {
        self.restarting.store(true, SeqCst);
        let r = self.crash_and_start(within).await;
        // A server that did not come back stays "restarting": the cell
        // fails with the crash's error (and the log's reason), not with
        // the watch's "the server exited".
        if r.is_ok() {
            self.restarting.store(false, SeqCst);
        }
        r
    }

    async fn crash_and_start(&self, within: Duration) -> Result<Crashed> {
        let child = self.child().take();
        let Some(mut child) = child else {
            return Err(Error::Provision("no running server to crash".into()));
        };
        let pid = child
            .id()
            .ok_or_else(|| Error::Provision("the server had exited before the crash".into()))?;
        // The postmaster's children (backends, auxiliary processes) each
        // lead a process group of their own (PostgreSQL calls setsid()):
        // found by their parent, stopped first so that it forks no other
        // (an autovacuum worker, a connection's backend) meanwhile, and
        // killed before it: a child that outlived the postmaster by an
        // instant would see its death pipe close and log "terminating
        // connection due to unexpected postmaster exit", which no power
        // loss does.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        // kill() returns before the stop takes: one fork may still land.
        let stopping = Instant::now() + Duration::from_secs(2);
        while !matches!(
            state_of(pid as i32).as_deref(),
            Some("T" | "t" | "Z") | None
        ) && Instant::now() < stopping
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let children = children_of(pid);
        let killed = Instant::now();
        for c in &children {
            let _ = killpg(Pid::from_raw(*c), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(*c), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = child.wait().await;
        // None may hold the shared memory or write a file when the server
        // starts again.
        let deadline = Instant::now() + Duration::from_secs(30);
        while children.iter().any(|c| alive(*c)) {
            if Instant::now() > deadline {
                return Err(Error::Provision(format!(
                    "the crashed server's processes ({children:?}) did not exit within 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let data = self.data.clone();
        tokio::task::spawn_blocking(move || evict_tree(&data))
            .await
            .map_err(|e| Error::Provision(format!("evicting after the crash: {e}")))??;
        let log = self.dir.join("postgres.log");
        let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        self.start_within(within).await.map_err(|e| {
            Error::Provision(format!("the server did not come back from the crash: {e}"))
        })?;
        let accepting = Instant::now();
        let text = std::fs::read(&log).unwrap_or_default();
        let after = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
        let (wal_replayed_bytes, redo_s) = redo_of(&after);
        Ok(Crashed {
            killed,
            accepting,
            wal_replayed_bytes,
            redo_s,
        })
    }

    /// The cluster's storage caps set to `caps` until the returned guard is
    /// dropped (or `restore`d), which writes the class's caps back. Err
    /// where the cluster's storage is not capped by pgfleet.
    pub fn caps_window(&self, caps: Caps) -> Result<CapsWindow<'_>> {
        let original = self.spec.caps;
        if !original.is_capped() {
            return Err(Error::Provision(
                "the class's storage is not emulated (no caps): a stall or degrade cannot change it".into(),
            ));
        }
        let served = self.volume.as_ref().is_some_and(|v| v.served().is_some());
        if caps.latency != original.latency && !served {
            return Err(Error::Provision(
                "a degrade's latency_ms changes a served volume's latency (a profile with latency, gp3), and this cluster's storage is rate caps only".into(),
            ));
        }
        let target = match &self.capped_device {
            Some(_) if served => Target::Served,
            Some(dev) => Target::Device(dev.clone()),
            None => {
                let cg = self
                    .cgroups
                    .iter()
                    .find(|c| throttle::is_io_cgroup(&c.path))
                    .ok_or_else(|| {
                        Error::Provision(
                            "the cluster has no block-I/O cgroup or device of its own to cap"
                                .into(),
                        )
                    })?;
                Target::Cgroup(cg.path.clone(), throttle::device_of(self.storage_dir())?)
            }
        };
        let mut w = CapsWindow {
            cluster: self,
            target,
            original,
            budget: None,
            restored: false,
        };
        w.apply(caps, false)?;
        Ok(w)
    }
}

enum Target {
    /// The volume the agent serves (`ebs`): its pacer takes the caps.
    Served,
    /// The cluster's own device, capped device-wide (`cap_device`).
    Device(String),
    /// A block-I/O cgroup and the device its rules name.
    Cgroup(std::path::PathBuf, String),
}

/// A window of other storage caps; dropping it writes the class's back.
pub struct CapsWindow<'a> {
    cluster: &'a Cluster,
    target: Target,
    original: Caps,
    /// The window's own budget, for a combined class.
    budget: Option<throttle::Budget>,
    restored: bool,
}

impl CapsWindow<'_> {
    /// Writes `caps`; `back`: the class's own, with its budget.
    fn apply(&mut self, caps: Caps, back: bool) -> Result<()> {
        match &self.target {
            Target::Served => {
                if let Some(s) = self.cluster.volume.as_ref().and_then(|v| v.served()) {
                    s.set_caps(caps);
                }
                Ok(())
            }
            Target::Device(dev) => {
                // The class's budget thread would rewrite the rules: it stops
                // for the window, and starts again after.
                let mut slot = self
                    .cluster
                    .budget
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                drop(slot.take());
                drop(self.budget.take());
                throttle::uncap_device(dev);
                throttle::cap_device(dev, caps)?;
                if caps.combined {
                    let b = throttle::Budget::start(dev, caps)?;
                    if back {
                        *slot = Some(b);
                    } else {
                        self.budget = Some(b);
                    }
                }
                Ok(())
            }
            Target::Cgroup(cg, dev) => throttle::recap_cgroup(cg, dev, caps),
        }
    }

    /// Writes the class's caps back (what dropping does, with its error).
    pub fn restore(mut self) -> Result<()> {
        self.restored = true;
        self.apply(self.original, true)
    }
}

impl Drop for CapsWindow<'_> {
    fn drop(&mut self) {
        if !self.restored {
            self.restored = true;
            if let Err(e) = self.apply(self.original, true) {
                tracing::error!("putting the storage caps back after a fault: {e}");
            }
        }
    }
}

/// The comment that names a cluster's network cut in the firewall's rules.
pub fn cut_tag(cluster_dir: &Path) -> String {
    format!("pgfleet-cut-{:016x}", super::path_hash(cluster_dir))
}

impl Cluster {
    /// Cuts the network between this cluster's server and `peer`
    /// (`host`:`port`, another cluster): packets of the server's processes
    /// (its OS user's) to the peer are dropped, new connections included,
    /// and so are the peer's packets to `connected_port`, the server's end
    /// of an existing connection. The agent's own sessions to the peer are
    /// not cut. Until the returned guard heals it (or is dropped). Needs
    /// iptables and CAP_NET_ADMIN in the agent's network namespace.
    pub fn cut_from(&self, host: &str, port: u16, connected_port: Option<u16>) -> Result<Cut> {
        let uid = self.spec.run_as.as_ref().map(|u| u.uid).ok_or_else(|| {
            Error::Provision(
                "a partition tells the server's packets from the agent's by the server's OS user: run the agent as root, so the server runs as its own user".into(),
            )
        })?;
        // The peer's address as it reported it reaches iptables' argv:
        // an IP address, nothing else.
        let host: std::net::IpAddr = host.parse().map_err(|_| {
            Error::Provision(format!(
                "a partition needs the peer's IP address, not `{host}`"
            ))
        })?;
        let host = host.to_string();
        let host = host.as_str();
        let tag = cut_tag(&self.dir);
        let (port, uid) = (port.to_string(), uid.to_string());
        // Each rule drops what it matches, tagged with the cluster.
        let dropping = |chain: &str, matches: &[&str]| -> Vec<String> {
            let tail = ["-m", "comment", "--comment", &tag, "-j", "DROP"];
            std::iter::once(chain)
                .chain(matches.iter().copied())
                .chain(tail)
                .map(str::to_string)
                .collect()
        };
        let mut rules = vec![dropping(
            "OUTPUT",
            &[
                "-p",
                "tcp",
                "-d",
                host,
                "--dport",
                &port,
                "-m",
                "owner",
                "--uid-owner",
                &uid,
            ],
        )];
        if let Some(cp) = connected_port {
            let cp = cp.to_string();
            rules.push(dropping(
                "INPUT",
                &["-p", "tcp", "-s", host, "--sport", &port, "--dport", &cp],
            ));
        }
        let mut cut = Cut { rules: Vec::new() };
        for r in rules {
            iptables("-I", &r)?;
            cut.rules.push(r);
        }
        Ok(cut)
    }
}

/// A network cut; healing it (or dropping it) removes its rules.
pub struct Cut {
    rules: Vec<Vec<String>>,
}

impl Cut {
    /// Removes the rules (what dropping does, with its error).
    pub fn heal(mut self) -> Result<()> {
        self.remove()
    }

    /// Removes every rule still in place; the first error, after trying all.
    fn remove(&mut self) -> Result<()> {
        let mut first = Ok(());
        for r in std::mem::take(&mut self.rules) {
            if let Err(e) = iptables("-D", &r) {
                first = first.and(Err(e));
            }
        }
        first
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::error!("healing a network cut: {e}");
        }
    }
}

/// `iptables`, found where Debian puts it.
fn iptables_command() -> std::process::Command {
    let mut c = std::process::Command::new("iptables");
    c.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    c
}

/// Runs `iptables -w <op> <rule>` (`-I` inserts, `-D` deletes).
fn iptables(op: &str, rule: &[String]) -> Result<()> {
    let out = iptables_command()
        .arg("-w")
        .arg(op)
        .args(rule)
        .output()
        .map_err(|e| {
            Error::Provision(format!(
                "a partition needs iptables where the subscriber's agent runs: {e}"
            ))
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Provision(format!(
        "iptables {op} {}: {} (a partition needs iptables and CAP_NET_ADMIN where the subscriber's agent runs)",
        rule.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Removes the cut of a cluster an earlier agent left (`reap_stale`).
pub fn reap_cut(cluster_dir: &Path) {
    let tag = cut_tag(cluster_dir);
    let Ok(out) = iptables_command().args(["-w", "-S"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rule) = line.strip_prefix("-A ")
            && line.contains(&tag)
        {
            let r: Vec<String> = rule.split_whitespace().map(str::to_string).collect();
            let _ = iptables("-D", &r);
        }
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The state letter of `pid` in /proc (`R`, `S`, `T`, `Z`...), None when
/// it is gone.
fn state_of(pid: i32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(s.rsplit_once(')')?.1.split_whitespace().next()?.to_string())
}

/// Whether `pid` still runs (exists and is not a zombie).
fn alive(pid: i32) -> bool {
    state_of(pid).is_some_and(|st| st != "Z")
}

/// Drops every file under `dir` from the page cache (clean pages only).
fn evict_tree(dir: &Path) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            evict_tree(&e.path())?;
        } else if t.is_file() {
            // A file removed meanwhile is nothing to evict.
            let _ = evict_file(&e.path());
        }
    }
    Ok(())
}

/// The WAL a crash recovery replayed and its redo's elapsed seconds, from
/// the server log written since the start: `redo starts at A` and `redo
/// done at B … elapsed: N s` (B − A bytes), or `redo is not required` (0).
pub fn redo_of(log: &str) -> (Option<u64>, Option<f64>) {
    let lsn_after = |line: &str, key: &str| -> Option<u64> {
        let rest = &line[line.find(key)? + key.len()..];
        let token: String = rest
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '/')
            .collect();
        let (hi, lo) = token.split_once('/')?;
        Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
    };
    let (mut start, mut done, mut elapsed) = (None, None, None);
    for line in log.lines() {
        if line.contains("redo is not required") {
            return (Some(0), Some(0.0));
        }
        if let Some(a) = lsn_after(line, "redo starts at ") {
            start = Some(a);
        }
        if let Some(b) = lsn_after(line, "redo done at ") {
            done = Some(b);
            elapsed = line
                .split("elapsed: ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok());
        }
    }
    match (start, done) {
        (Some(a), Some(b)) => (Some(b.saturating_sub(a)), elapsed),
        _ => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::redo_of;

    #[test]
    fn the_replayed_wal_comes_from_the_log() {
        // PostgreSQL 15's lines, and 18's zero-padded LSNs.
        let pg15 = "2026-12-07 04:00:00.000 UTC [9] LOG:  database system was interrupted; last known up at ...\n\
                    2026-12-07 04:00:00.010 UTC [9] LOG:  redo starts at 0/14EE7E8\n\
                    2026-12-07 04:00:00.500 UTC [9] LOG:  redo done at 0/2C05B48 system usage: CPU: user: 0.04 s, system: 0.01 s, elapsed: 0.48 s\n";
        assert_eq!(redo_of(pg15), (Some(0x2C05B48 - 0x14EE7E8), Some(0.48)));
        let pg18 = "LOG:  redo starts at 1/00FF0000\nLOG:  redo done at 1/01FF0000 system usage: CPU: user: 1.00 s, system: 0.20 s, elapsed: 2.50 s\n";
        assert_eq!(redo_of(pg18), (Some(0x0100_0000), Some(2.5)));
        assert_eq!(
            redo_of("LOG:  redo is not required\n"),
            (Some(0), Some(0.0))
        );
        assert_eq!(redo_of("LOG:  database system is ready\n"), (None, None));
    }
}
