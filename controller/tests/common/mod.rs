//! Helpers for the cross-process tests: real `pgfleet` and `pgfleet-agent`
//! binaries, real PostgreSQL clusters, each test in its own scratch dir.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("pgfleet-e2e-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch { dir }
    }
    pub fn store(&self) -> PathBuf {
        self.dir.join("store/pgfleet.db")
    }
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
    pub fn out(&self) -> PathBuf {
        self.dir.join("out")
    }
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
    /// `pgfleet run` with this scratch's store, data dir and out dir.
    pub fn run_cmd(&self, scenario: &Path, extra: &[&str]) -> Command {
        self.run_cmd_with(&pgfleet(), &agent_bin(), scenario, extra)
    }
    /// `run_cmd` with other `pgfleet` / `pgfleet-agent` binaries.
    pub fn run_cmd_with(
        &self,
        pgfleet: &Path,
        agent: &Path,
        scenario: &Path,
        extra: &[&str],
    ) -> Command {
        let mut c = Command::new(pgfleet);
        c.arg("--store")
            .arg(self.store())
            .arg("run")
            .arg(scenario)
            .arg("--out")
            .arg(self.out())
            .arg("--data-dir")
            .arg(self.data())
            .arg("--agent-bin")
            .arg(agent)
            .args(extra);
        c
    }
    pub fn report(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.out().join("report.json")).expect("report.json");
        serde_json::from_str(&text).unwrap()
    }
    /// Asserts nothing pgfleet created for this test is left: no process
    /// mentions the data dir, the data dir holds nothing but the dataset
    /// store (kept across runs by design), no cluster port listens.
    pub fn assert_clean(&self, ports: &[u16]) {
        let procs = processes_mentioning(&self.data());
        assert!(procs.is_empty(), "processes left behind: {procs:?}");
        let left = leftovers(&self.data());
        assert!(left.is_empty(), "data left behind: {left:?}");
        for p in ports {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", *p)).is_err(),
                "port {p} still listening"
            );
        }
        let host = host_leftovers(&self.dir);
        assert!(host.is_empty(), "left on the host: {host:?}");
    }
}

/// What pgfleet may have made on the host for a test under `dir` and left:
/// mounts under it, loop devices backed by its files, and block-I/O
/// throttle rules on loop devices no longer attached (a rule outliving its
/// volume caps whoever attaches that device next; rules go before their
/// devices, so no other test's cell in flight shows here).
pub fn host_leftovers(dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for m in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
        if Path::new(m).starts_with(dir) {
            left.push(format!("mount {m}"));
        }
    }
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file"))
            && Path::new(b.trim()).starts_with(dir)
        {
            left.push(format!("loop device /dev/{name} on {}", b.trim()));
        }
    }
    for f in [
        "blkio.throttle.read_iops_device",
        "blkio.throttle.write_iops_device",
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
    ] {
        let rules =
            std::fs::read_to_string(Path::new("/sys/fs/cgroup/blkio").join(f)).unwrap_or_default();
        for dev in rules.lines().filter_map(|l| l.split_whitespace().next()) {
            let attached = Path::new(&format!("/sys/dev/block/{dev}/loop/backing_file")).exists();
            if dev.starts_with("7:") && !attached {
                left.push(format!("{f} rule on detached loop device {dev}"));
            }
        }
    }
    left
}

/// What is left under `dir` besides dataset stores (a `datasets`
/// directory, kept across runs by design, and the directories that hold
/// nothing else), with no unfinished build inside them.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == "datasets") {
            left.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|b| b.to_string_lossy().contains(".building-")),
            );
        } else if p.is_dir() {
            let inner = leftovers(&p);
            if inner.is_empty() && std::fs::read_dir(&p).into_iter().flatten().count() == 0 {
                left.push(p);
            }
            left.extend(inner);
        } else {
            left.push(p);
        }
    }
    left
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn pgfleet() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pgfleet"))
}

/// `pgfleet-agent` is built into the same target directory.
pub fn agent_bin() -> PathBuf {
    let p = pgfleet().with_file_name("pgfleet-agent");
    assert!(
        p.is_file(),
        "{} missing: build the workspace (cargo build --workspace)",
        p.display()
    );
    p
}

/// (pid, cmdline) of live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &Path) -> Vec<(u32, String)> {
    let needle = needle.to_string_lossy().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .unwrap_or_default()
            .contains(") Z ");
        if cmd.contains(&needle) && !zombie {
            out.push((pid, cmd));
        }
    }
    out
}

/// SIGKILLs the `pgfleet-agent` with `agent_id` among the processes that
/// mention `data_dir`; returns when it was killed.
pub fn kill_agent(data_dir: &Path, agent_id: &str) -> chrono::DateTime<chrono::Utc> {
    let procs = processes_mentioning(data_dir);
    let agent = procs
        .iter()
        .find(|(_, cmd)| {
            cmd.contains("pgfleet-agent run") && cmd.contains(&format!("--agent-id {agent_id} "))
        })
        .unwrap_or_else(|| panic!("agent {agent_id} not found in {procs:?}"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0 as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    chrono::Utc::now()
}

pub fn ports(report: &serde_json::Value) -> Vec<u16> {
    // Cells record their cluster's port in the store's environment; the
    // report keeps the first per class, the store has them all.
    let mut v = Vec::new();
    if let Some(classes) = report["environment"]["instance_classes"].as_object() {
        for c in classes.values() {
            if let Some(p) = c["postgres"]["port"].as_u64() {
                v.push(p as u16);
            }
        }
    }
    v
}

pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A CA, and a server certificate for `names` signed by it: writes
/// `ca.pem`, `server.pem` (the chain: server, then CA) and `server.key`.
pub fn certificates(dir: &Path, names: &[&str]) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(
        dir.join("server.pem"),
        format!("{}{}", server.pem(), ca.pem()),
    )
    .unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

/// A TCP port free on loopback right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The break-in corpus's files (`scenarios/attacks/*.yaml`), sorted.
pub fn attack_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/attacks");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// A test that cannot run here (not root, no cgroup v1, a tool missing)
/// says why and returns; where `PGFLEET_REQUIRE_PRIVILEGES` is set (CI,
/// which runs as root on cgroup v1) it fails instead, so nothing there
/// passes without testing.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("PGFLEET_REQUIRE_PRIVILEGES").is_none(),
        "this test would skip ({why}), but PGFLEET_REQUIRE_PRIVILEGES is set: this host must run it"
    );
    eprintln!("skipped: {why}");
}
