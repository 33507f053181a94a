//! Provisioning PostgreSQL clusters: initdb into the agent's data root, start
//! the postmaster as an unprivileged OS user, apply settings, listen on
//! loopback on a free port, and tear down on every path.
//!
//! Lifetime rules (the invariants the tests check):
//! - The postmaster is started directly (not through `pg_ctl`) as the agent's
//!   child, in its own process group, with a parent-death signal (SIGQUIT,
//!   PostgreSQL's immediate shutdown): if the agent is SIGKILLed the cluster
//!   goes with it.
//! - `Cluster::teardown` stops the server (fast, then immediate, then kill) and
//!   removes its directory; `Drop` does the same, synchronously, for paths that
//!   never reach `teardown` (panics, cancelled futures).
//! - Everything a cluster owns lives under `<data_root>/clusters/<name>/`, so a
//!   restarted agent (or `pgfleet-agent cleanup`) can remove stale clusters.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::pgbin::PgBin;
use crate::{Error, Result};

pub mod device;
pub mod ebs;
mod fault;
pub mod identity;
pub mod throttle;
pub mod volume;
pub use fault::{CapsWindow, Crashed, Cut};
pub use identity::RunAs;
use throttle::Caps;

/// The agent's own role: loading, probes, statistics, CHECKPOINT, cache
/// eviction. No scenario text runs as it.
pub const SUPERUSER: &str = "pgfleet";

/// The role scenario SQL runs as (pgbench scripts and their defines,
/// `setup_sql`): owns the workload's tables, may create in the `postgres`
/// database (not own it: an owner could `ALTER DATABASE … SET`), reads
/// statistics (`pg_monitor`), and has none of the roles that reach the host
/// (`pg_execute_server_program`, `pg_read_server_files`,
/// `pg_write_server_files`). A superuser only with `allow_shell`.
pub const WORKLOAD_ROLE: &str = "pgfleet_workload";

/// What every superuser session of the agent starts with (in the startup
/// packet, so it beats `ALTER DATABASE/ROLE … SET` and no call site can
/// forget it): names resolve in `pg_catalog` only, never in a schema the
/// workload role can create objects in (CVE-2018-1058's advice). The
/// agent's own SQL names its tables with their schema (`public.…`).
pub const SUPERUSER_OPTIONS: &str = "-c search_path=pg_catalog,pg_temp";

/// The schema of the agent's own objects: extensions it calls (pageinspect,
/// pgstattuple, pg_prewarm) and the tables of kinds that measure the
/// agent's own data (toast-probe, toast-slice, read-write). Only the
/// superuser can create in it (no grant to anyone).
pub const AGENT_SCHEMA: &str = "pgfleet_agent";

/// What a superuser session over the agent's own tables starts with: its
/// schema first (where unqualified names are created), then the catalog.
/// Still no schema the workload role can create objects in.
pub const OWN_OPTIONS: &str = "-c search_path=pgfleet_agent,pg_catalog,pg_temp";

/// A PostgreSQL server the agent connects to: its own cluster, or a peer
/// role's (over the network, with the endpoint the peer reported).
#[derive(Debug, Clone)]
pub struct Server {
    pub config: tokio_postgres::Config,
    /// The same as a libpq connection string (for pgbench, subscriptions).
    pub conninfo: String,
    /// Its major version.
    pub major: u32,
}

impl Server {
    /// A peer's server as its superuser (what the peer reported), with the
    /// search path pinned (`SUPERUSER_OPTIONS`).
    pub fn of(ep: &pgfleet_proto::v1::Endpoint, major: u32) -> Server {
        Server::peer(ep, &ep.user, &ep.password, Some(SUPERUSER_OPTIONS), major)
    }

    /// A peer's server as its workload role, for what the scenario's data
    /// sees (scripts the agent drives there): no superuser involved.
    pub fn of_workload(ep: &pgfleet_proto::v1::Endpoint, major: u32) -> Server {
        Server::peer(ep, WORKLOAD_ROLE, &ep.workload_password, None, major)
    }

    fn peer(
        ep: &pgfleet_proto::v1::Endpoint,
        user: &str,
        password: &str,
        options: Option<&str>,
        major: u32,
    ) -> Server {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&ep.host)
            .port(ep.port as u16)
            .user(user)
            .password(password)
            .dbname(&ep.dbname)
            .application_name("pgfleet-agent")
            .connect_timeout(Duration::from_secs(10));
        let port = ep.port.to_string();
        let mut info = vec![
            ("host", ep.host.as_str()),
            ("port", port.as_str()),
            ("user", user),
            ("password", password),
            ("dbname", ep.dbname.as_str()),
        ];
        if let Some(o) = options {
            config.options(o);
            info.push(("options", o));
        }
        Server {
            config,
            conninfo: quote_conninfo(&info),
            major,
        }
    }

    /// The password, for a tool that reads it from its environment
    /// (`PGPASSWORD`, private to the process) rather than from a command
    /// line every local user can read.
    pub fn password(&self) -> Option<String> {
        self.config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
    }

    /// `conninfo` without the password (for command lines and messages).
    pub fn conninfo_without_password(&self) -> String {
        let host = match self.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".to_string(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        quote_conninfo(&[
            ("host", &host),
            ("port", &port.to_string()),
            ("user", self.config.get_user().unwrap_or("")),
            ("dbname", self.config.get_dbname().unwrap_or("postgres")),
        ])
    }

    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let (client, conn) = self.config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }
}

/// What to provision.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub pg: PgBin,
    /// `<data_root>/clusters`
    pub clusters_dir: PathBuf,
    /// Directory name under `clusters_dir` (the cell id).
    pub name: String,
    pub run_as: Option<RunAs>,
    pub settings: BTreeMap<String, String>,
    /// Addresses to listen on besides 127.0.0.1 (the agent's address, when
    /// peers on other hosts must reach the cluster).
    pub listen: Vec<std::net::IpAddr>,
    /// Peers' addresses admitted by pg_hba.conf (scram-sha-256, exactly
    /// these hosts; databases and replication).
    pub peers: Vec<std::net::IpAddr>,
    /// Storage caps to emulate (block-I/O throttling); uncapped = as is.
    pub caps: Caps,
    /// The workload has the `allow_shell` opt-in: host-access settings may
    /// be set and the workload role is a superuser.
    pub allow_shell: bool,
    /// Run the server in a block-I/O cgroup that counts its device bytes
    /// (`io_bytes`), capped or not. Needs root.
    pub account_io: bool,
    /// The emulated instance's memory (page cache included; 0 = the host's)
    /// and CPUs (0 = the host's).
    pub memory_bytes: u64,
    pub cpus: u32,
}

/// A running cluster. Dropping it stops the server and removes its files.
pub struct Cluster {
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    password: String,
    /// `WORKLOAD_ROLE`'s password.
    workload_password: String,
    /// The postmaster; replaced by `restart`.
    child: std::sync::Mutex<Option<Child>>,
    /// Set while `restart` has the server down on purpose.
    restarting: std::sync::atomic::AtomicBool,
    /// What it was provisioned with (a restart starts it the same way).
    spec: ClusterSpec,
    /// The cgroups emulating the instance and its storage (none when
    /// nothing is emulated).
    cgroups: Vec<throttle::Cgroup>,
    /// The emulated instance's memory (0: the host's).
    memory_bytes: u64,
    /// Its own block device (`ClusterSpec::account_io` as root, where the
    /// host has the tools): PGDATA lives in it and its bytes are exact.
    volume: Option<volume::Volume>,
    /// The cluster's own device (`major:minor`) when its caps are
    /// device-wide (`throttle::cap_device`).
    capped_device: Option<String>,
    /// Its reads and writes sharing one budget on that device (gp3); a
    /// fault that changes the caps replaces it for its window.
    budget: std::sync::Mutex<Option<throttle::Budget>>,
    pub pg: PgBin,
}

impl Cluster {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The unprivileged OS user its server runs as (None: the agent's own).
    pub fn run_as(&self) -> Option<&RunAs> {
        self.spec.run_as.as_ref()
    }
    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The superuser's password (a published dataset's manifest keeps it:
    /// a restore connects with it once, then sets its own).
    pub fn superuser_password(&self) -> &str {
        &self.password
    }
    /// The cgroups the server runs in (instance and storage emulation).
    pub fn cgroups(&self) -> Vec<&Path> {
        self.cgroups.iter().map(|c| c.path.as_path()).collect()
    }
    /// Bytes (read, written) the device has done for the cluster: its own
    /// volume's, exact (every write, writeback included), or else its
    /// block-I/O cgroup's (on cgroup v1 without the writeback the kernel's
    /// flushers do). None when it has neither (see
    /// `ClusterSpec::account_io`); `device_source` says which.
    pub fn io_bytes(&self) -> Option<(u64, u64)> {
        if let Some(v) = &self.volume {
            return v.stat().map(|s| (s.read_bytes, s.write_bytes));
        }
        self.cgroups
            .iter()
            .find_map(|c| throttle::io_bytes(&c.path))
    }
    /// The stat file of the cluster's own device, when it has one: every
    /// I/O there is the cluster's (what a sampler counts per transaction).
    pub fn device_stat_file(&self) -> Option<PathBuf> {
        self.volume.as_ref().map(|v| v.stat_file())
    }
    /// The emulated instance's memory its processes are held to, page
    /// cache included (0: the host's).
    pub fn memory_bytes(&self) -> u64 {
        self.spec.memory_bytes
    }
    /// The agent's side of the cluster's volume when the agent serves it
    /// (a profile with per-I/O latency, `ebs`).
    pub fn served(&self) -> Option<&ebs::Served> {
        self.volume.as_ref().and_then(|v| v.served())
    }
    /// The cluster's own device (`major:minor`) when its storage caps hold
    /// device-wide, for every writer (cgroup v1 with its own volume).
    pub fn capped_device(&self) -> Option<&str> {
        self.capped_device.as_deref()
    }
    /// Where `io_bytes` comes from, for reports.
    pub fn device_source(&self) -> Option<&'static str> {
        if self.volume.is_some() {
            Some("the cluster's own loop device (exact)")
        } else if self.io_bytes().is_some() {
            Some("the cluster's block-I/O cgroup (on cgroup v1 without buffered writeback)")
        } else {
            None
        }
    }
    /// The directory on the class's storage where the cluster's data is:
    /// its own volume, or its directory. A kind's scratch files go here.
    pub fn storage_dir(&self) -> &Path {
        self.volume.as_ref().map_or(&self.dir, |v| v.dir())
    }
    /// The storage caps the cluster was provisioned with (the class's).
    pub fn spec_caps(&self) -> Caps {
        self.spec.caps
    }
    pub fn pid(&self) -> Option<u32> {
        self.child().as_ref().and_then(|c| c.id())
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// initdb, configure, start, wait until it accepts connections.
    pub async fn provision(spec: &ClusterSpec) -> Result<Cluster> {
        let mut cluster = Cluster::prepare_off_runtime(spec).await?;
        cluster.initdb(spec).await?;
        crate::failpoint::hit("initdb")?;
        cluster.boot(None).await?;
        Ok(cluster)
    }

    /// A cluster whose data directory a dataset restore fills (`restore`
    /// gets the empty directory, which it creates): then configured and
    /// started as `provision` would. `password` is the superuser's in the
    /// restored data; the cluster's own replaces it before anything else
    /// connects, and the workload role gets a new one too.
    pub async fn provision_restored<F, Fut>(
        spec: &ClusterSpec,
        password: &str,
        restore: F,
    ) -> Result<Cluster>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let mut cluster = Cluster::prepare_off_runtime(spec).await?;
        restore(cluster.data.clone()).await?;
        cluster.boot(Some(password.to_string())).await?;
        Ok(cluster)
    }

    /// Whether a cluster of `spec` gets a block device of its own (a loop
    /// device and filesystem under its directory): where its device bytes
    /// must be exact, and where capped storage must cap every writer (on
    /// cgroup v1 a blkio cgroup does not see buffered writeback).
    pub fn own_volume(spec: &ClusterSpec) -> bool {
        (spec.account_io
            || ebs::emulates_latency(&spec.caps)
            || (spec.caps.is_capped() && throttle::v1()))
            && volume::available()
    }

    /// `prepare` on a blocking thread: its volume's mkfs and mount take
    /// seconds on a busy host, which on the runtime's threads would hold
    /// up the agent's heartbeats (two agents on two cores lost their
    /// leases at a first cell).
    async fn prepare_off_runtime(spec: &ClusterSpec) -> Result<Cluster> {
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || Cluster::prepare(&spec))
            .await
            .map_err(|e| Error::Provision(format!("preparing the cluster's directory: {e}")))?
    }

    /// The cluster's directory, empty, owned by its OS user; no server yet.
    /// From here on, Drop removes the directory on any error.
    fn prepare(spec: &ClusterSpec) -> Result<Cluster> {
        for (name, value) in &spec.settings {
            pgfleet_proto::settings::check(name, value, spec.allow_shell)
                .map_err(|why| Error::Provision(format!("setting refused: {why}")))?;
        }
        let dir = spec.clusters_dir.join(&spec.name);
        if dir.exists() {
            remove_tree(&dir)?;
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let mut cluster = Cluster {
            data: dir.join("data"),
            dir,
            port: 0,
            password: random_hex(16)?,
            workload_password: random_hex(16)?,
            child: Default::default(),
            restarting: Default::default(),
            spec: spec.clone(),
            cgroups: Vec::new(),
            memory_bytes: spec.memory_bytes,
            volume: None,
            capped_device: None,
            budget: std::sync::Mutex::new(None),
            pg: spec.pg.clone(),
        };
        std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("chmod cluster dir", e))?;
        if let Some(u) = &spec.run_as {
            nix::unistd::chown(&cluster.dir, Some(u.uid.into()), Some(u.gid.into())).map_err(
                |e| {
                    Error::Provision(format!(
                        "chown {} to {}: {e}",
                        cluster.dir.display(),
                        u.name
                    ))
                },
            )?;
            check_reachable(&cluster.dir, u)?;
        }
        // Its own volume where its device bytes must be exact, and where
        // capped storage must cap everything written to it: on cgroup v1 a
        // blkio cgroup does not see buffered writeback (loads,
        // checkpoints), the volume's device-wide caps do (`boot`).
        // A profile with per-I/O latency is a volume the agent serves
        // (`ebs`): its caps and latency hold there, for every writer.
        let served = ebs::emulates_latency(&spec.caps).then_some(spec.caps);
        if served.is_some() && !(ebs::available() && volume::available()) {
            return Err(Error::Provision(
                "the class's storage profile answers each I/O with a network volume's latency, which the agent emulates with a volume it serves over FUSE: that needs root, /dev/fuse, losetup and mkfs.ext4 (in a pod: a privileged container with /dev/fuse). Run the agent as root; or give the class `emulate: false` (the disk as is), or `profile: custom` caps (rates without latency, no FUSE)".into(),
            ));
        }
        if Cluster::own_volume(spec) {
            // Sparse: it takes the disk the data takes, up to what is free.
            let size = (crate::host::free_bytes(&cluster.dir).unwrap_or(0) / 10 * 9).max(1 << 30);
            let owner = spec.run_as.as_ref().map(|u| (u.uid, u.gid));
            match volume::Volume::create(&cluster.dir, size, owner, served) {
                Ok(v) if v.served().is_some() => {
                    cluster.data = v.dir().join("data");
                    let dev = v.dev_number();
                    cluster.volume = Some(v);
                    cluster.capped_device = Some(dev?);
                    crate::failpoint::hit("caps")?;
                }
                Err(e) if served.is_some() => return Err(e),
                Ok(v) => {
                    cluster.data = v.dir().join("data");
                    // The caps on the cluster's own device from the first
                    // byte: a dataset restored into it is written at the
                    // class's speed, as onto the real device.
                    let dev = v.dev_number();
                    cluster.volume = Some(v);
                    if spec.caps.is_capped() && throttle::v1() {
                        let dev = dev?;
                        throttle::cap_device(&dev, spec.caps)?;
                        if spec.caps.combined {
                            *cluster.budget.get_mut().unwrap_or_else(|e| e.into_inner()) =
                                Some(throttle::Budget::start(&dev, spec.caps)?);
                        }
                        cluster.capped_device = Some(dev);
                    }
                    crate::failpoint::hit("caps")?;
                }
                Err(e) => tracing::warn!(
                    "no volume of its own for cluster {} ({e}); its device bytes come from its cgroup",
                    spec.name
                ),
            }
        }
        Ok(cluster)
    }

    /// Cgroups, configuration, start on a free port, roles. `restored`:
    /// the superuser password in a restored data directory.
    async fn boot(&mut self, restored: Option<String>) -> Result<()> {
        let spec = self.spec.clone();
        let mut limits = throttle::Limits {
            caps: spec.caps,
            memory_bytes: spec.memory_bytes,
            cpus: spec.cpus,
            account_io: spec.account_io,
        };
        if spec.caps.combined && self.capped_device.is_none() && spec.caps.is_capped() {
            tracing::warn!(
                "cluster {}: its reads and writes are capped each on its own, not as one budget (that needs its own device on cgroup v1)",
                spec.name
            );
        }
        if self.capped_device.is_some() {
            // Capped since `prepare`, for every writer: its processes stay
            // in the root blkio cgroup (v1 limits are not hierarchical) and
            // its bytes come from the device.
            limits.caps = Caps::default();
            limits.account_io = false;
        }
        if limits.any() {
            let name = format!("{}-{:016x}", spec.name, path_hash(&self.dir));
            // The device under the data: the cluster's own volume's when it
            // has one, so the caps apply to it.
            let under = self.storage_dir().to_path_buf();
            self.cgroups = throttle::create(&name, &under, &limits, spec.run_as.as_ref())?;
            // Recorded so a later `reap_stale` can remove them.
            let paths: Vec<String> = self
                .cgroups
                .iter()
                .map(|c| c.path.to_string_lossy().to_string())
                .collect();
            std::fs::write(self.dir.join("cgroup"), paths.join("\n"))
                .map_err(|e| Error::io("recording the cgroups", e))?;
        }
        // Until the restored data's superuser has the cluster's own password,
        // connect with the old one.
        let own = match restored {
            Some(old) => Some(std::mem::replace(&mut self.password, old)),
            None => None,
        };
        // A free port can be taken between probing and binding: retry.
        let mut last = String::new();
        for _ in 0..5 {
            self.port = free_port()?;
            self.write_config(&spec)?;
            match self.start().await {
                Ok(()) => {
                    if let Some(own) = own {
                        let client = self.connect().await?;
                        client
                            .batch_execute(&format!("ALTER ROLE {SUPERUSER} PASSWORD '{own}'"))
                            .await
                            .map_err(|e| {
                                Error::Provision(format!("taking over the restored cluster: {e}"))
                            })?;
                        self.password = own;
                    }
                    crate::failpoint::hit("start")?;
                    self.create_workload_role().await?;
                    return Ok(());
                }
                Err(Error::Provision(msg))
                    if msg.contains("could not bind") || msg.contains("Address already in use") =>
                {
                    last = msg;
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Provision(format!(
            "no free port after 5 tries: {last}"
        )))
    }

    async fn initdb(&self, spec: &ClusterSpec) -> Result<()> {
        let pwfile = self.dir.join("pwfile");
        std::fs::write(&pwfile, format!("{}\n", self.password))
            .map_err(|e| Error::io("writing pwfile", e))?;
        if let Some(u) = &spec.run_as {
            nix::unistd::chown(&pwfile, Some(u.uid.into()), Some(u.gid.into()))
                .map_err(|e| Error::Provision(format!("chown pwfile: {e}")))?;
        }
        let mut cmd = Command::new(spec.pg.tool("initdb"));
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync"])
            .arg("--auth-host=scram-sha-256")
            .arg("--auth-local=peer")
            .arg(format!("--pwfile={}", pwfile.display()))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        apply_identity(&mut cmd, spec.run_as.as_ref());
        let out = cmd
            .output()
            .await
            .map_err(|e| Error::Provision(format!("running initdb: {e}")))?;
        let _ = std::fs::remove_file(&pwfile);
        if !out.status.success() {
            return Err(Error::Provision(format!(
                "initdb failed ({}): {}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr), 10)
            )));
        }
        Ok(())
    }

    fn write_config(&self, spec: &ClusterSpec) -> Result<()> {
        let mut conf =
            String::from("# written by pgfleet; settings below override postgresql.conf\n");
        let listen: Vec<String> = std::iter::once("127.0.0.1".to_string())
            .chain(spec.listen.iter().map(|a| a.to_string()))
            .collect();
        conf += &format!("listen_addresses = '{}'\n", listen.join(","));
        conf += &format!("port = {}\n", self.port);
        conf += "unix_socket_directories = ''\n";
        conf += "logging_collector = off\n";
        // PostgreSQL's own view of I/O time (page read and WAL sync time in
        // reports); a scenario may turn them off again.
        conf += "track_io_timing = on\n";
        if spec.pg.major >= 14 {
            conf += "track_wal_io_timing = on\n";
        }
        for (k, v) in &spec.settings {
            conf += &format!("{k} = '{}'\n", v.replace('\\', "\\\\").replace('\'', "''"));
        }
        let path = self.data.join("pgfleet.conf");
        std::fs::write(&path, conf).map_err(|e| Error::io("writing pgfleet.conf", e))?;
        self.admit_peers(&spec.peers)?;
        let main = self.data.join("postgresql.conf");
        let text =
            std::fs::read_to_string(&main).map_err(|e| Error::io("reading postgresql.conf", e))?;
        if !text.contains("include 'pgfleet.conf'") {
            std::fs::write(&main, text + "\ninclude 'pgfleet.conf'\n")
                .map_err(|e| Error::io("writing postgresql.conf", e))?;
        }
        if let Some(u) = &spec.run_as {
            nix::unistd::chown(&path, Some(u.uid.into()), Some(u.gid.into()))
                .map_err(|e| Error::Provision(format!("chown pgfleet.conf: {e}")))?;
        }
        Ok(())
    }

    async fn start(&self) -> Result<()> {
        self.start_within(Duration::from_secs(60)).await
    }

    /// Starts the server and waits until it accepts connections, at most
    /// `within` (crash recovery may take long).
    async fn start_within(&self, within: Duration) -> Result<()> {
        let spec = &self.spec;
        let log_path = self.dir.join("postgres.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Error::io("opening postgres.log", e))?;
        let mut cmd = self.contained(&spec.pg.tool("postgres"), libc::SIGQUIT)?;
        cmd.arg("-D")
            .arg(&self.data)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| Error::io("log fd", e))?)
            .stderr(log);
        let child = cmd
            .spawn()
            .map_err(|e| Error::Provision(format!("starting postgres: {e}")))?;
        self.join_cgroups(&child, "postgres")?;
        *self.child() = Some(child);
        let deadline = Instant::now() + within;
        loop {
            let exited = {
                let mut child = self.child();
                let status = child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                if status.is_some() {
                    *child = None;
                }
                status
            };
            if let Some(status) = exited {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(Error::Provision(format!(
                    "postgres exited during start-up ({status}): {}",
                    tail(&text, 10)
                )));
            }
            match self.connect().await {
                Ok(_) => return Ok(()),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => {
                    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                    return Err(Error::Provision(format!(
                        "postgres did not accept connections within {} s: {e}; its log ({}) ends: {}",
                        within.as_secs(),
                        log_path.display(),
                        tail(&text, 5)
                    )));
                }
            }
        }
    }

    /// A command that runs like the server: as its user, in its own
    /// process group, without the caller's PG* environment, killed with
    /// `death_signal` if the agent dies, and (cgroup v1) in the cluster's
    /// cgroups from before exec, so the instance's and the storage's limits
    /// apply to it from its first I/O. After `spawn`, `join_cgroups` moves
    /// it into the cgroups it could not join itself (v2).
    pub fn contained(&self, program: &Path, death_signal: i32) -> Result<Command> {
        let mut cmd = Command::new(program);
        cmd.process_group(0);
        apply_identity(&mut cmd, self.spec.run_as.as_ref());
        let parent = std::process::id();
        let join: Vec<std::ffi::CString> = self
            .cgroups
            .iter()
            .filter(|c| c.self_join)
            .map(|c| {
                std::ffi::CString::new(c.path.join("cgroup.procs").as_os_str().as_encoded_bytes())
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Provision(format!("cgroup path: {e}")))?;
        // SAFETY: only async-signal-safe calls (prctl, getppid, open, write,
        // close, _exit). The death signal is set after the uid switch, which
        // clears it.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    death_signal as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                for procs in &join {
                    // "0" moves the writing process into the cgroup.
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Moves a child started by `contained` into the cgroups it could not
    /// join before exec (cgroup v2).
    pub fn join_cgroups(&self, child: &Child, what: &str) -> Result<()> {
        for cg in self.cgroups.iter().filter(|c| !c.self_join) {
            let Some(pid) = child.id() else { break };
            std::fs::write(cg.path.join("cgroup.procs"), pid.to_string()).map_err(|e| {
                Error::Provision(format!("moving {what} into {}: {e}", cg.path.display()))
            })?;
        }
        Ok(())
    }

    /// Creates `WORKLOAD_ROLE` and gives it the `postgres` database (and so,
    /// from PostgreSQL 15, its `public` schema).
    async fn create_workload_role(&self) -> Result<()> {
        let client = self.connect().await?;
        let attrs = if self.spec.allow_shell {
            "SUPERUSER"
        } else {
            "NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        };
        // A restored cluster has the role already (with the builder's
        // password): it gets this cluster's password and attributes.
        let mut sql = format!(
            "DO $$BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{WORKLOAD_ROLE}') THEN
                 CREATE ROLE {WORKLOAD_ROLE};
               END IF;
             END$$;
             ALTER ROLE {WORKLOAD_ROLE} LOGIN {attrs} PASSWORD '{}';
             GRANT pg_monitor TO {WORKLOAD_ROLE};
             ALTER DATABASE postgres OWNER TO {SUPERUSER};
             GRANT CONNECT, CREATE, TEMPORARY ON DATABASE postgres TO {WORKLOAD_ROLE};
             GRANT ALL ON SCHEMA public TO {WORKLOAD_ROLE};
             CREATE SCHEMA IF NOT EXISTS {AGENT_SCHEMA} AUTHORIZATION {SUPERUSER};
             ALTER SCHEMA {AGENT_SCHEMA} OWNER TO {SUPERUSER};
             REVOKE ALL ON SCHEMA {AGENT_SCHEMA} FROM PUBLIC;",
            self.workload_password
        );
        // pgbench scripts checkpoint; PostgreSQL 15 has a role for it.
        if self.pg.major >= 15 {
            sql += &format!("GRANT pg_checkpoint TO {WORKLOAD_ROLE};");
        }
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| Error::Provision(format!("creating the workload role: {e}")))
    }

    /// Gives the workload role every relation of the `public` schema the
    /// agent created (loaded tables, their indexes and sequences), so the
    /// scenario's SQL, running as that role, may update, vacuum and
    /// truncate them. Called after the agent's load, before scenario SQL.
    pub async fn hand_over(&self) -> Result<()> {
        let client = self.connect().await?;
        let sql = format!(
            "DO $$DECLARE r record; BEGIN
               FOR r IN SELECT c.oid::regclass AS name FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
                   AND pg_get_userbyid(c.relowner) <> '{WORKLOAD_ROLE}'
                   -- a sequence owned by a column moves with its table
                   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid
                     AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
                     AND c.relkind = 'S')
               LOOP
                 EXECUTE format('ALTER TABLE %s OWNER TO {WORKLOAD_ROLE}', r.name);
               END LOOP;
             END$$"
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| Error::Provision(format!("handing the tables to the workload role: {e}")))
    }

    /// Admits each peer address to every database and to replication with
    /// scram-sha-256 (initdb's pg_hba.conf admits loopback only).
    /// The section is rewritten each time: a restored data directory
    /// carries no other cell's peers.
    fn admit_peers(&self, peers: &[std::net::IpAddr]) -> Result<()> {
        const SECTION: &str = "\n# pgfleet: this cell's peers\n";
        let hba = self.data.join("pg_hba.conf");
        let text =
            std::fs::read_to_string(&hba).map_err(|e| Error::io("reading pg_hba.conf", e))?;
        let had = text.contains(SECTION);
        let mut text = match text.split_once(SECTION) {
            Some((before, _)) => before.to_string(),
            None => text,
        };
        if peers.is_empty() {
            if had {
                std::fs::write(&hba, text).map_err(|e| Error::io("writing pg_hba.conf", e))?;
            }
            return Ok(());
        }
        text += SECTION;
        for p in peers {
            let mask = if p.is_ipv4() { 32 } else { 128 };
            for db in ["all", "replication"] {
                let line = format!("host {db} all {p}/{mask} scram-sha-256\n");
                if !text.contains(&line) {
                    text += &line;
                }
            }
        }
        std::fs::write(&hba, text).map_err(|e| Error::io("writing pg_hba.conf", e))
    }

    /// Where a peer on `host` reaches this cluster: as the superuser (for
    /// publications, slots, statistics) and as the workload role (for
    /// driving scripts over the data).
    pub fn endpoint(&self, host: &str) -> pgfleet_proto::v1::Endpoint {
        pgfleet_proto::v1::Endpoint {
            host: host.to_string(),
            port: self.port as u32,
            user: SUPERUSER.to_string(),
            password: self.password.clone(),
            dbname: "postgres".to_string(),
            loaded_json: String::new(),
            workload_password: self.workload_password.clone(),
        }
    }

    /// Whether the postmaster is still running (not exited, not a zombie).
    pub fn server_alive(&self) -> bool {
        self.pid().is_some_and(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().chars().next())
                })
                .is_some_and(|state| state != Some('Z'))
        })
    }

    /// The server log's last lines that say why something failed: PANIC,
    /// FATAL and ERROR messages, crashes and kills, a full disk, OOM.
    fn log_reasons(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        let mut lines: Vec<String> = log
            .lines()
            .rev()
            .filter(|l| {
                [
                    "PANIC:",
                    "FATAL:",
                    "ERROR:",
                    "No space left",
                    "terminated by signal",
                    "was terminated",
                    "out of memory",
                ]
                .iter()
                .any(|k| l.contains(k))
            })
            .take(4)
            .map(str::to_string)
            .collect();
        lines.reverse();
        lines
    }

    /// Resolves when the postmaster has exited (crash, OOM kill, kill -9):
    /// a cell waiting on something else notices its server is gone.
    pub async fn exited(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        while self.server_alive() || self.restarting.load(SeqCst) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Adds the server's own reason to a workload error when the client
    /// alone cannot know it: the connection broke, or the server is gone
    /// (a crash, an OOM kill, a full disk). The reason comes from the
    /// server log's last PANIC / FATAL / ERROR lines and crash reports.
    pub async fn explain_failure(&self, e: Error) -> Error {
        let alive = self.server_alive();
        let client_only = match &e {
            Error::Postgres(pe) => pe.as_db_error().is_none(),
            Error::Cancelled(_) | Error::ServerFailed { .. } | Error::Peer { .. } => return e,
            other => {
                let t = other.to_string();
                t.contains("connection") || t.contains("closed") || t.contains("terminat")
            }
        };
        if alive && !client_only {
            return e;
        }
        // The client can see its connection break before the server has
        // logged why (the postmaster logs a killed backend once it reaped
        // it): give the log a moment.
        let mut lines = Vec::new();
        for _ in 0..20 {
            lines = self.log_reasons();
            if !lines.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut why = if alive {
            String::new()
        } else {
            "the PostgreSQL server is no longer running".to_string()
        };
        if self.memory_bytes > 0 && lines.iter().any(|l| l.contains("signal 9")) {
            lines.push(format!(
                "(a process killed with signal 9 in an instance of {} MiB is most likely the memory cgroup's OOM kill: \
                 raise the class's instance.memory, or lower shared_buffers / maintenance_work_mem / work_mem)",
                self.memory_bytes >> 20
            ));
        }
        if !lines.is_empty() {
            if !why.is_empty() {
                why += "; ";
            }
            why += &format!(
                "its log ({}) says: {}",
                self.dir.join("postgres.log").display(),
                lines.join(" | ")
            );
        }
        if why.is_empty() {
            return e;
        }
        Error::ServerFailed {
            cause: Box::new(e),
            server: why,
        }
    }

    /// A new connection whose server notices (INFO, NOTICE, WARNING: e.g.
    /// `VACUUM (VERBOSE)`'s report) arrive on the returned channel.
    pub async fn connect_with_notices(
        &self,
    ) -> Result<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    )> {
        use futures::StreamExt;
        let (client, mut conn) = self.pg_config().connect(tokio_postgres::NoTls).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(Ok(m)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notice(n) = m {
                    let _ = tx.send(n.message().to_string());
                }
            }
        });
        Ok((client, rx))
    }

    /// Evicts the files of `relation` (heap, its indexes and TOAST, every
    /// segment and fork) from the OS page cache with
    /// `posix_fadvise(DONTNEED)`, so the next reads reach the storage under
    /// test. Only clean pages are dropped: CHECKPOINT first. Returns the
    /// bytes of the files. Shared buffers are not touched.
    pub async fn evict_from_page_cache(
        &self,
        client: &tokio_postgres::Client,
        relation: &str,
    ) -> Result<u64> {
        let rows = client
            .query(
                "SELECT pg_relation_filepath(c.oid) FROM pg_class c \
                 WHERE c.oid = $1::text::regclass \
                    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::text::regclass) \
                    OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = $1::text::regclass)",
                &[&relation],
            )
            .await?;
        let mut bytes = 0;
        for r in rows {
            let Some(rel) = r.get::<_, Option<String>>(0) else {
                continue;
            };
            let base = self.data.join(rel);
            for fork in ["", "_fsm", "_vm"] {
                for seg in 0.. {
                    let mut name = base.clone().into_os_string();
                    name.push(fork);
                    if seg > 0 {
                        name.push(format!(".{seg}"));
                    }
                    let Some(n) = evict_file(Path::new(&name))? else {
                        break;
                    };
                    bytes += n;
                }
            }
        }
        Ok(bytes)
    }

    /// Stops the server (a fast shutdown: a checkpoint, then exit) and
    /// starts it again the same way, in the same cgroups: its shared
    /// buffers start empty. The cell's watch on the server (`exited`) does
    /// not fire meanwhile.
    pub async fn restart(&self) -> Result<()> {
        match self.pause().await {
            Ok(()) => self.resume().await,
            Err(e) => {
                self.restarting
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Stops the server cleanly (a fast shutdown: a checkpoint, then exit)
    /// until `resume`; the cell's watch on the server (`exited`) does not
    /// fire meanwhile. The data directory is then consistent on disk.
    pub async fn pause(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.restarting.store(true, SeqCst);
        async {
            let child = self.child().take();
            if let Some(mut child) = child {
                for (sig, wait) in [(Signal::SIGINT, 120), (Signal::SIGQUIT, 10)] {
                    if let Some(pid) = child.id() {
                        let _ = kill(Pid::from_raw(pid as i32), sig);
                    }
                    if tokio::time::timeout(Duration::from_secs(wait), child.wait())
                        .await
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
                return Err(Error::Provision(
                    "the server did not stop within 130 s for a restart".into(),
                ));
            }
            Ok(())
        }
        .await
    }

    /// Starts the server `pause` stopped, the same way, in the same cgroups.
    pub async fn resume(&self) -> Result<()> {
        let started = self.start().await;
        self.restarting
            .store(false, std::sync::atomic::Ordering::SeqCst);
        started
    }

    /// Makes the cache cold before a measurement: CHECKPOINT, a restart
    /// (shared buffers empty), then every file of the current database
    /// (`base/<oid>/`) evicted from the OS page cache with
    /// `posix_fadvise(DONTNEED)`; other clusters' pages stay. Returns the
    /// bytes evicted.
    pub async fn make_cold(&self) -> Result<u64> {
        let client = self.connect().await?;
        client.batch_execute("CHECKPOINT").await?;
        let oid: u32 = client
            .query_one(
                "SELECT oid FROM pg_database WHERE datname = current_database()",
                &[],
            )
            .await?
            .get(0);
        drop(client);
        self.restart().await?;
        let dir = self.data.join("base").join(oid.to_string());
        let mut bytes = 0;
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                bytes += evict_file(&e.path())?.unwrap_or(0);
            }
        }
        Ok(bytes)
    }

    /// This cluster as a `Server` (loopback) for the agent's own steps: as
    /// the superuser, with `SUPERUSER_OPTIONS`.
    pub fn server(&self) -> Server {
        self.loopback(SUPERUSER, &self.password, Some(SUPERUSER_OPTIONS))
    }

    /// This cluster as a `Server` for scenario SQL: as `WORKLOAD_ROLE`, with
    /// the search path its own settings give it.
    pub fn workload_server(&self) -> Server {
        self.loopback(WORKLOAD_ROLE, &self.workload_password, None)
    }

    /// This cluster as a `Server` over the agent's own tables, in
    /// `AGENT_SCHEMA` (see `OWN_OPTIONS`; the driver reads them by their
    /// unqualified names).
    pub fn own_server(&self) -> Server {
        self.loopback(SUPERUSER, &self.password, Some(OWN_OPTIONS))
    }

    /// The one builder of this cluster's loopback `Server`s: the same
    /// settings as a tokio-postgres config and as a libpq string.
    fn loopback(&self, user: &str, password: &str, options: Option<&str>) -> Server {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user(user)
            .password(password)
            .dbname("postgres")
            .application_name("pgfleet-agent")
            .connect_timeout(Duration::from_secs(5));
        let port = self.port.to_string();
        let mut info = vec![
            ("host", "127.0.0.1"),
            ("port", port.as_str()),
            ("user", user),
            ("password", password),
            ("dbname", "postgres"),
        ];
        if let Some(o) = options {
            config.options(o);
            info.push(("options", o));
        }
        Server {
            config,
            conninfo: quote_conninfo(&info),
            major: self.pg.major,
        }
    }

    /// A new connection as the superuser over loopback TCP.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        self.server().connect().await
    }

    /// A new superuser connection for a kind that works on the agent's own
    /// tables (`own_server`).
    pub async fn connect_own(&self) -> Result<tokio_postgres::Client> {
        self.own_server().connect().await
    }

    /// Connection settings (superuser, loopback TCP), for callers that open
    /// connections on their own runtime (the driver's client threads). Every
    /// superuser session of the agent comes from `server()`: each starts
    /// with `SUPERUSER_OPTIONS`, so no call site can forget them.
    pub fn pg_config(&self) -> tokio_postgres::Config {
        self.server().config
    }

    /// A libpq connection string (for standard tools such as pgbench/psql),
    /// as the superuser: with `SUPERUSER_OPTIONS` too.
    pub fn conninfo(&self) -> String {
        self.server().conninfo
    }

    /// Stops the server (fast shutdown, then immediate, then SIGKILL) and
    /// removes the cluster's directory.
    pub async fn teardown(mut self) -> Result<()> {
        let child = self.child().take();
        if let Some(mut child) = child {
            let steps = [
                (Signal::SIGINT, Duration::from_secs(30)),
                (Signal::SIGQUIT, Duration::from_secs(10)),
                (Signal::SIGKILL, Duration::from_secs(10)),
            ];
            for (sig, wait) in steps {
                if let Some(pid) = child.id() {
                    let _ = kill(Pid::from_raw(pid as i32), sig);
                }
                if tokio::time::timeout(wait, child.wait()).await.is_ok() {
                    break;
                }
            }
        }
        for cg in std::mem::take(&mut self.cgroups) {
            throttle::remove_path(&cg.path)?;
        }
        // The budget's thread stops before its device's rules go.
        drop(
            self.budget
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(mut v) = self.volume.take() {
            v.remove()?;
        }
        let dir = std::mem::take(&mut self.dir);
        remove_tree(&dir)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let child = self.child().take();
        if let Some(mut child) = child {
            stop_blocking(&mut child);
        }
        for cg in std::mem::take(&mut self.cgroups) {
            let _ = throttle::remove_path(&cg.path);
        }
        drop(
            self.budget
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(mut v) = self.volume.take() {
            let _ = v.remove();
        }
        if !self.dir.as_os_str().is_empty() {
            let _ = remove_tree(&self.dir);
        }
    }
}

/// Drops a file's pages from the OS page cache; its size, or None when
/// it does not exist.
fn evict_file(path: &Path) -> Result<Option<u64>> {
    let Ok(f) = std::fs::File::open(path) else {
        return Ok(None);
    };
    let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; advice only.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(Error::io(
            format!("evicting {} from the page cache", path.display()),
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(Some(bytes))
}

/// Immediate shutdown, synchronously (for Drop).
fn stop_blocking(child: &mut Child) {
    let Some(pid) = child.id() else { return };
    for (sig, wait) in [(Signal::SIGQUIT, 10), (Signal::SIGKILL, 5)] {
        let _ = kill(Pid::from_raw(pid as i32), sig);
        let deadline = Instant::now() + Duration::from_secs(wait);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn apply_identity(cmd: &mut Command, run_as: Option<&RunAs>) {
    // The server and its tools inherit nothing of the agent's environment
    // (its secrets: a dataset store's credentials, a caller's PG*) but the
    // program path, the locale and the time zone.
    cmd.env_clear();
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| {
            matches!(k, "PATH" | "LANG" | "LANGUAGE" | "TZ") || k.starts_with("LC_")
        }) {
            cmd.env(k, v);
        }
    }
    if let Some(u) = run_as {
        cmd.uid(u.uid).gid(u.gid);
        cmd.env("HOME", "/")
            .env("USER", &u.name)
            .env("LOGNAME", &u.name);
    }
}

/// The server's user must be able to reach its directory: every ancestor
/// needs the execute bit for it.
fn check_reachable(dir: &Path, u: &RunAs) -> Result<()> {
    let mut p = dir.parent();
    while let Some(d) = p {
        if let Ok(meta) = std::fs::metadata(d) {
            use std::os::unix::fs::MetadataExt;
            let mode = meta.mode();
            let ok = (meta.uid() == u.uid && mode & 0o100 != 0)
                || (meta.gid() == u.gid && mode & 0o010 != 0)
                || mode & 0o001 != 0;
            if !ok {
                return Err(Error::Provision(format!(
                    "user `{}` cannot reach {} ({} is mode {:o}); choose a --data-root under a \
                     directory others can traverse (e.g. /tmp or /var/lib/pgfleet)",
                    u.name,
                    dir.display(),
                    d.display(),
                    mode & 0o7777
                )));
            }
        }
        p = d.parent();
    }
    Ok(())
}

/// A short stable hash of a path (FNV-1a), to keep cgroup names unique
/// across agents and runs.
fn path_hash(p: &Path) -> u64 {
    p.as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// A libpq connection string, each value quoted as libpq reads it (a value
/// from a peer cannot add a keyword).
pub fn quote_conninfo(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("probing a free port", e))?;
    Ok(l.local_addr()
        .map_err(|e| Error::io("probing a free port", e))?
        .port())
}

fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| Error::io("reading /dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn remove_tree(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
    }
}

/// Removes every cluster left under `clusters_dir` by an earlier agent that
/// died: stops its postmaster (by the pid in `postmaster.pid`, if that process
/// still runs `postgres`) and deletes the directory. Returns how many were
/// removed.
pub fn reap_stale(clusters_dir: &Path) -> Result<usize> {
    let entries = match std::fs::read_dir(clusters_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(format!("reading {}", clusters_dir.display()), e)),
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let dir = entry.path();
        for data in [dir.join("data"), dir.join("volume/data")] {
            if let Some(pid) = postmaster_pid(&data) {
                stop_pid(pid);
            }
        }
        if let Ok(cgs) = std::fs::read_to_string(dir.join("cgroup")) {
            for cg in cgs.lines().filter(|l| !l.trim().is_empty()) {
                throttle::remove_path(Path::new(cg.trim()))?;
            }
        }
        volume::reap(&dir)?;
        fault::reap_cut(&dir);
        remove_tree(&dir)?;
        n += 1;
    }
    Ok(n)
}

fn postmaster_pid(data: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    // Only signal a process that is a postgres server using this data dir.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    (cmdline.contains("postgres") && cmdline.contains(&*data.to_string_lossy())).then_some(pid)
}

fn stop_pid(pid: i32) {
    let alive = |pid| kill(Pid::from_raw(pid), None).is_ok();
    for (sig, wait) in [(Signal::SIGQUIT, 10), (Signal::SIGKILL, 5)] {
        let _ = kill(Pid::from_raw(pid), sig);
        let deadline = Instant::now() + Duration::from_secs(wait);
        while Instant::now() < deadline && alive(pid) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !alive(pid) {
            return;
        }
    }
}
