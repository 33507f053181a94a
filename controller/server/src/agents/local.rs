//! The local agent source: one `pgfleet-agent` child process per fleet
//! instance, each with its own data root.
//!
//! Children run in their own process group (a terminal's Ctrl-C reaches only
//! the controller, which then shuts them down in order) with a parent-death
//! signal (SIGTERM), so a killed controller does not leave agents behind.
//! After a child exits, `pgfleet-agent cleanup` removes whatever it left
//! (a SIGKILLed agent's clusters), then its data root is deleted.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{AgentSource, Launched};
use crate::events::Event;
use pgfleet_scenario::{FleetEntry, Scenario};
use pgfleet_store::Error;
use pgfleet_store::Result;

#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub agent_bin: PathBuf,
    pub pg_bin: Option<PathBuf>,
    pub pg_user: Option<String>,
    /// Agents' data roots go under `<data_dir>/<run_id>/<agent_id>`.
    pub data_dir: PathBuf,
    /// The agents' dataset store (shared by them: a lock per dataset).
    pub dataset_dir: PathBuf,
    /// The object store behind it (`--dataset-remote`).
    pub dataset_remote: Option<String>,
    /// Network namespaces (made by the user) to start agents in, one after
    /// the other; each agent advertises its namespace's address, so the
    /// clusters of multi-role cells talk over real interfaces. Empty: every
    /// agent on this host's network, peers over loopback.
    pub netns: Vec<String>,
    /// Each agent serves its own /metrics on a free port (of its namespace's
    /// address, else loopback), listed at the controller's /sd/agents.
    pub agent_metrics: bool,
}

struct Child {
    launched: Launched,
    pid: Option<u32>,
    data_root: PathBuf,
    wait: Option<JoinHandle<()>>,
}

/// How local agents reach the controller: its URL, the join token (handed
/// over in a file in the run's directory that only its owner can read), and
/// the CA to trust when the session is TLS.
#[derive(Debug, Clone)]
pub struct Access {
    pub controller: String,
    pub token: String,
    pub ca: Option<PathBuf>,
}

pub struct LocalAgents {
    opts: LocalOptions,
    run_dir: PathBuf,
    children: Vec<Child>,
}

/// The `pgfleet-agent` next to the running `pgfleet`, else from PATH.
pub fn default_agent_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("pgfleet-agent")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("pgfleet-agent"))
}

/// The agents `launch` starts for a fleet: `<class>-<i>` for each instance.
pub fn fleet_agents(scenario: &Scenario) -> Vec<Launched> {
    scenario
        .fleet
        .value
        .iter()
        .flat_map(|f| {
            (0..f.count()).map(|i| Launched {
                agent_id: format!("{}-{i}", f.name.value),
                instance_class: f.name.value.clone(),
            })
        })
        .collect()
}

impl LocalAgents {
    pub async fn launch(
        scenario: &Scenario,
        run_id: &str,
        access: &Access,
        opts: LocalOptions,
        log_dir: &Path,
        events: mpsc::Sender<Event>,
    ) -> Result<LocalAgents> {
        let mut opts = opts;
        // Relative directories are the operator's cwd's: made absolute here,
        // as the agents and PostgreSQL run elsewhere.
        for d in [&mut opts.data_dir, &mut opts.dataset_dir] {
            *d = std::path::absolute(&*d)
                .map_err(|e| Error::Agents(format!("{}: {e}", d.display())))?;
        }
        if opts.data_dir == std::env::temp_dir().join("pgfleet") {
            pgfleet_proto::dataset::check_private(&opts.data_dir)
                .map_err(|e| Error::Agents(format!("{e}; give --data-dir DIR")))?;
        }
        let run_dir = opts.data_dir.join(run_id);
        create_traversable(&run_dir)?;
        std::fs::create_dir_all(log_dir)
            .map_err(|e| Error::Agents(format!("creating {}: {e}", log_dir.display())))?;
        let mut me = LocalAgents {
            opts,
            run_dir,
            children: Vec::new(),
        };
        // A failed start stops the agents already started (and removes the
        // run's directory with them).
        if let Err(e) = me.start_all(scenario, access, log_dir, &events).await {
            for c in &me.children {
                if let Some(pid) = c.pid {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                }
            }
            me.stop_all().await;
            return Err(e);
        }
        Ok(me)
    }

    /// Writes the join token and starts the fleet's agents, each class's
    /// instances in turn, spread over the network namespaces; stops at the
    /// first that fails.
    async fn start_all(
        &mut self,
        scenario: &Scenario,
        access: &Access,
        log_dir: &Path,
        events: &mpsc::Sender<Event>,
    ) -> Result<()> {
        let token_file = self.run_dir.join("join-token");
        write_private(&token_file, access.token.as_bytes())?;
        let mut n = 0;
        for f in &scenario.fleet.value {
            for i in 0..f.count() {
                let agent = Agent {
                    class: f,
                    agent_id: format!("{}-{i}", f.name.value),
                    netns: self.opts.netns.get(n % self.opts.netns.len().max(1)),
                };
                n += 1;
                let child = self
                    .spawn(agent, access, &token_file, log_dir, events)
                    .await?;
                self.children.push(child);
            }
        }
        Ok(())
    }

    /// Starts one agent process (its log in `log_dir`), watched: its exit
    /// is an `Event::Gone`.
    async fn spawn(
        &self,
        agent: Agent<'_>,
        access: &Access,
        token_file: &Path,
        log_dir: &Path,
        events: &mpsc::Sender<Event>,
    ) -> Result<Child> {
        let f = agent.class;
        let agent_id = agent.agent_id;
        let data_root = self.run_dir.join(&agent_id);
        let log_path = log_dir.join(format!("{agent_id}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Error::Agents(format!("creating {}: {e}", log_path.display())))?;
        let mut cmd = match agent.netns {
            Some(ns) => {
                let address = netns_address(ns).await?;
                // `ip netns exec` enters the namespace and execs the
                // agent: same process, so the parent-death signal holds.
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.opts.agent_bin);
                c.arg("run").args(["--advertise-address", &address]);
                if self.opts.agent_metrics {
                    c.args(["--metrics-addr", &format!("{address}:0")]);
                }
                c
            }
            None => {
                let mut c = Command::new(&self.opts.agent_bin);
                c.arg("run");
                if self.opts.agent_metrics {
                    c.args(["--metrics-addr", "127.0.0.1:0"]);
                }
                c
            }
        };
        cmd.args(["--controller", &access.controller])
            .arg("--token-file")
            .arg(token_file)
            .args(["--agent-id", &agent_id])
            .args(["--instance-class", &f.name.value])
            .args(["--storage-profile", &f.profile()])
            .arg("--data-root")
            .arg(&data_root)
            .arg("--dataset-dir")
            .arg(&self.opts.dataset_dir)
            .args(
                self.opts
                    .dataset_remote
                    .iter()
                    .flat_map(|r| ["--dataset-remote", r.as_str()]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| Error::Agents(e.to_string()))?)
            .stderr(log)
            .process_group(0);
        class_args(&mut cmd, f);
        if let Some(ca) = &access.ca {
            cmd.arg("--ca").arg(ca);
        }
        // A class's version wins over the run's --pg-bin; neither: the
        // agent's default (installs::DEFAULT). What the controller was
        // given decides, not what the agent would inherit.
        cmd.env_remove("PGFLEET_PG_BIN")
            .env_remove("PGFLEET_PG_VERSION");
        match f.postgres.as_ref().and_then(|p| p.version.as_ref()) {
            Some(v) => {
                cmd.args(["--pg-version", &v.value.to_string()]);
            }
            None => {
                if let Some(p) = &self.opts.pg_bin {
                    cmd.arg("--pg-bin").arg(p);
                }
            }
        }
        if let Some(u) = &self.opts.pg_user {
            cmd.args(["--pg-user", u]);
        }
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            Error::Agents(format!(
                "starting {}: {e}; build it (cargo build) or pass --agent-bin PATH",
                self.opts.agent_bin.display()
            ))
        })?;
        let launched = Launched {
            agent_id: agent_id.clone(),
            instance_class: f.name.value.clone(),
        };
        let pid = child.id();
        let ev = events.clone();
        let wait = tokio::spawn(async move {
            let status = child
                .wait()
                .await
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            let why = format!("agent process exited ({status}); see its log");
            let _ = ev.send(Event::Gone { agent_id, why }).await;
        });
        Ok(Child {
            launched,
            pid,
            data_root,
            wait: Some(wait),
        })
    }

    async fn stop_all(&mut self) {
        // Told to shut down by the scheduler; give them time to tear down.
        for c in &mut self.children {
            if let Some(w) = c.wait.as_mut() {
                let steps = [
                    (None, 60),
                    (Some(Signal::SIGTERM), 30),
                    (Some(Signal::SIGKILL), 10),
                ];
                for (sig, secs) in steps {
                    if let (Some(sig), Some(pid)) = (sig, c.pid) {
                        let _ = kill(Pid::from_raw(pid as i32), sig);
                    }
                    if tokio::time::timeout(Duration::from_secs(secs), &mut *w)
                        .await
                        .is_ok()
                    {
                        break;
                    }
                }
                c.wait = None;
            }
            cleanup(&self.opts.agent_bin, &c.data_root).await;
        }
        let _ = std::fs::remove_file(self.run_dir.join("join-token"));
        let _ = std::fs::remove_dir(&self.run_dir);
        // The data dir itself goes too when no other run uses it.
        let _ = std::fs::remove_dir(&self.opts.data_dir);
    }
}

/// One agent `launch` starts: its class, id and network namespace (None:
/// the controller's).
struct Agent<'a> {
    class: &'a FleetEntry,
    agent_id: String,
    netns: Option<&'a String>,
}

/// The class's storage caps and instance, as the agent's flags.
fn class_args(cmd: &mut Command, f: &FleetEntry) {
    let caps = f.caps();
    cmd.args(["--read-iops", &caps.read_iops.to_string()])
        .args(["--write-iops", &caps.write_iops.to_string()])
        .args(["--read-mbps", &caps.read_mbps.to_string()])
        .args(["--write-mbps", &caps.write_mbps.to_string()]);
    if caps.combined {
        cmd.arg("--combined-io");
    }
    let l = caps.latency;
    cmd.args(["--read-latency-us", &l.read_us.to_string()])
        .args(["--write-latency-us", &l.write_us.to_string()])
        .args(["--flush-latency-us", &l.flush_us.to_string()]);
    if !f.emulate() {
        cmd.arg("--no-emulate");
    }
    let instance = f.instance();
    if !instance.instance_type.is_empty() {
        cmd.args(["--instance-type", &instance.instance_type]);
    }
    cmd.args(["--memory-bytes", &instance.memory_bytes.to_string()])
        .args(["--cpus", &instance.cpus.to_string()]);
    if !instance.emulate {
        cmd.arg("--no-emulate-instance");
    }
}

/// The child gets SIGTERM when the controller dies (and exits at once if
/// it already has): agents never outlive their controller.
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGTERM as libc::c_ulong,
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
            Ok(())
        });
    }
}

/// Writes `bytes` to a file only its owner can read (the join token).
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| Error::Agents(format!("writing {}: {e}", path.display())))
}

/// The first global IPv4 address in network namespace `ns`.
async fn netns_address(ns: &str) -> Result<String> {
    let out = Command::new("ip")
        .args(["-n", ns, "-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .await
        .map_err(|e| Error::Agents(format!("running `ip -n {ns} addr`: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| {
            Error::Agents(format!(
                "network namespace `{ns}` has no global IPv4 address ({}): create it with `ip netns add {ns}` and give it an interface and address",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })
}

/// Removes the data dirs of this store's runs that are no longer running
/// (a controller that was killed leaves its agents' data roots: the agents
/// stop their clusters on the parent-death signal, but only a controller
/// removes the roots). Each agent root gets `pgfleet-agent cleanup` first.
/// Returns the runs cleaned up.
pub async fn reap_finished_runs(opts: &LocalOptions, store: &pgfleet_store::Store) -> Vec<String> {
    let mut reaped = Vec::new();
    let Ok(entries) = std::fs::read_dir(&opts.data_dir) else {
        return reaped;
    };
    for e in entries.flatten() {
        let id = e.file_name().to_string_lossy().to_string();
        let finished = matches!(store.run(&id), Ok(Some(r)) if r.status != "running");
        if !finished || !e.path().is_dir() {
            continue;
        }
        for agent in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
            cleanup(&opts.agent_bin, &agent.path()).await;
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            reaped.push(id);
        }
    }
    reaped
}

/// Runs `pgfleet-agent cleanup` for a dead agent's data root (stopping
/// clusters a SIGKILLed agent left), then removes the directory.
async fn cleanup(agent_bin: &Path, data_root: &Path) {
    if data_root.exists() {
        let _ = Command::new(agent_bin)
            .arg("cleanup")
            .arg("--data-root")
            .arg(data_root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        let _ = std::fs::remove_dir_all(data_root);
    }
}

impl AgentSource for LocalAgents {
    fn launched(&self) -> Vec<Launched> {
        self.children.iter().map(|c| c.launched.clone()).collect()
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        self.stop_all().boxed()
    }
}

/// Creates `dir` (and its parent, the data dir, where missing) readable
/// and traversable by others, so an unprivileged PostgreSQL user can reach
/// the agents' data roots below. Directories that existed keep their
/// modes (the operator's): the agent reports clearly if one is closed.
fn create_traversable(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let made = pgfleet_proto::dataset::create_new_dirs(dir)
        .map_err(|e| Error::Agents(format!("creating {}: {e}", dir.display())))?;
    for p in made {
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
    }
    Ok(())
}
