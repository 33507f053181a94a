//! A real deployment in containers: the images built from `deploy/images`
//! (base image from Debian packages by debootstrap + `docker import`, no
//! registry), `pgfleet serve` and four agents as containers on a private
//! network, each with its own address, the session on TLS with a join
//! token, and CI's `pgfleet submit --wait` from the host. Then the faults a
//! fleet meets: an agent killed, an agent cut off the network for less than
//! the lease, the controller restarted mid-run. Every container, network and
//! volume is removed at the end, whatever happens.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Scratch, pgfleet, show};

const LEASE_S: u64 = 8;

/// The Docker objects of one test, removed on drop.
struct Deployment {
    prefix: String,
    containers: Vec<String>,
    network: String,
    volume: String,
    subnet: String,
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("running docker: is Docker Engine installed and its daemon running?")
}

fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(out.status.success(), "docker {args:?}: {}", show(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Deployment {
    fn new() -> Deployment {
        let pid = std::process::id();
        let prefix = format!("pgfleet-t{pid}");
        let subnet = format!("10.213.{}.0/24", pid % 250 + 1);
        let d = Deployment {
            network: format!("{prefix}-net"),
            volume: format!("{prefix}-store"),
            containers: Vec::new(),
            prefix,
            subnet,
        };
        docker_ok(&["network", "create", "--subnet", &d.subnet, &d.network]);
        docker_ok(&["volume", "create", &d.volume]);
        d
    }

    /// The address of host `n` on the private network.
    fn ip(&self, n: u8) -> String {
        format!("{}.{n}", self.subnet.trim_end_matches(".0/24"))
    }

    fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    fn controller(&mut self, secrets: &Path, lease_s: u64) {
        let name = self.name("ctl");
        let mount = format!("{}:/run/pgfleet:ro", secrets.display());
        let store = format!("{}:/var/lib/pgfleet", self.volume);
        let lease = lease_s.to_string();
        let ip = self.ip(10);
        // A fixed host port, outside the ephemeral range (a client's
        // outgoing connection could take it while the container restarts).
        let port = (20000..32000)
            .map(|p| p + (std::process::id() as u16 % 10000))
            .map(|p| 20000 + p % 12000)
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .unwrap();
        let publish = format!("127.0.0.1:{port}:8080");
        docker_ok(&[
            "run",
            "-d",
            "--name",
            &name,
            "--hostname",
            "controller",
            "--network",
            &self.network,
            "--ip",
            &ip,
            "--network-alias",
            "controller",
            "-p",
            &publish,
            "-v",
            &mount,
            "-v",
            &store,
            "pgfleet-controller:test",
            "--api-token-file",
            "/run/pgfleet/api.token",
            "--join-token-file",
            "/run/pgfleet/join.token",
            "--tls-cert",
            "/run/pgfleet/server.pem",
            "--tls-key",
            "/run/pgfleet/server.key",
            "--lease-s",
            &lease,
            "--registration-timeout-s",
            "60",
        ]);
        self.containers.push(name);
    }

    fn agent(&mut self, id: &str, class: &str, n: u8, secrets: &Path) {
        let name = self.name(id);
        let mount = format!("{}:/run/pgfleet:ro", secrets.display());
        let ip = self.ip(n);
        docker_ok(&[
            "run",
            "-d",
            "--name",
            &name,
            "--hostname",
            id,
            "--network",
            &self.network,
            "--ip",
            &ip,
            "-v",
            &mount,
            "pgfleet-agent:test",
            "--controller",
            "https://controller:7070",
            "--ca",
            "/run/pgfleet/ca.pem",
            "--class",
            class,
            "--token-file",
            "/run/pgfleet/join.token",
            "--give-up-after-s",
            "120",
        ]);
        self.containers.push(name);
    }

    /// The HTTP API's address on the host.
    fn api(&self) -> String {
        let port = docker_ok(&["port", &self.name("ctl"), "8080/tcp"]);
        let addr = port.lines().next().unwrap_or_default().to_string();
        format!("http://{addr}")
    }

    fn logs(&self, short: &str) -> String {
        let out = docker(&["logs", &self.name(short)]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = docker(&["rm", "-f", "-v", c]);
        }
        let _ = docker(&["network", "rm", &self.network]);
        let _ = docker(&["volume", "rm", "-f", &self.volume]);
    }
}

fn scenario(s: &Scratch, file: &str, duration_s: u32) -> std::path::PathBuf {
    s.write(
        file,
        &format!(
            "name: containers\nfleet:\n  - name: fast\n    count: 2\n  - name: slow\n    count: 2\n\
             workloads:\n  - kind: pgbench\n    scale: 2\n    script: random-update\n    clients: 2\n\
             \x20   warmup_s: 1\n    duration_s: {duration_s}\n    replicas: 2\n"
        ),
    )
}

fn submit(s: &Scratch, api: &str, scenario: &Path, out: &str) -> std::process::Child {
    Command::new(pgfleet())
        .arg("submit")
        .arg(scenario)
        .args(["--server", api, "--wait", "--retry-for-s", "120", "--out"])
        .arg(s.dir.join(out))
        .arg("--token-file")
        .arg(s.dir.join("secrets/api.token"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Cells of the newest run in `state`, read through `pgfleet status`.
fn cells_in(s: &Scratch, api: &str, run: &str, state: &str) -> usize {
    let out = Command::new(pgfleet())
        .args(["status", run, "--server", api])
        .arg("--token-file")
        .arg(s.dir.join("secrets/api.token"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(state))
        .count()
}

fn newest_run(d: &Deployment) -> Option<String> {
    d.logs("ctl")
        .lines()
        .rfind(|l| l.contains("run queued"))
        .and_then(|l| l.split("run=").nth(1))
        .and_then(|x| x.split_whitespace().next())
        .map(str::to_string)
}

fn wait_running(s: &Scratch, d: &Deployment, api: &str, n: usize) -> String {
    let start = Instant::now();
    loop {
        if let Some(run) = newest_run(d)
            && cells_in(s, api, &run, "running") >= n
        {
            // Loaded and measuring.
            std::thread::sleep(Duration::from_secs(3));
            return run;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "cells did not start:\n{}",
            d.logs("ctl")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn finish(child: std::process::Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.code(), show(&out))
}

/// The images (tag `test`), from the binaries under test.
fn build_images() {
    let bin_dir = pgfleet().parent().unwrap().to_path_buf();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let build = Command::new("bash")
        .arg(repo.join("deploy/images/build.sh"))
        .arg("--bin-dir")
        .arg(&bin_dir)
        .args(["--tag", "test"])
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "building the images: {}",
        show(&build)
    );
}

/// The deployment's certificates and tokens, readable by the containers.
fn secrets(s: &Scratch) -> std::path::PathBuf {
    let secrets = s.dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    common::certificates(&secrets, &["controller"]);
    std::fs::write(secrets.join("api.token"), "api-token-0123456789abcdef\n").unwrap();
    std::fs::write(secrets.join("join.token"), "join-token-0123456789abcdef\n").unwrap();
    for f in std::fs::read_dir(&secrets).unwrap().flatten() {
        use std::os::unix::fs::PermissionsExt;
        // The containers' users (pgfleet, postgres) read them.
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    secrets
}

#[test]
fn serve_and_four_agents_in_containers_survive_a_kill_a_cut_and_a_restart() {
    let s = Scratch::new("containers");
    build_images();
    let secrets = secrets(&s);

    let mut d = Deployment::new();
    d.controller(&secrets, LEASE_S);
    for (i, (id, class)) in [
        ("fast-1", "fast"),
        ("fast-2", "fast"),
        ("slow-1", "slow"),
        ("slow-2", "slow"),
    ]
    .into_iter()
    .enumerate()
    {
        d.agent(id, class, 20 + i as u8, &secrets);
    }
    let api = d.api();

    // 1. A two-class run completes; its report comes back.
    let quick = scenario(&s, "quick.yaml", 3);
    let (code, out) = finish(submit(&s, &api, &quick, "out1"));
    assert_eq!(code, Some(0), "{out}\n{}", d.logs("ctl"));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.dir.join("out1/report.json")).unwrap())
            .unwrap();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{report}");
    assert!(cells.iter().all(|c| c["state"] == "succeeded"), "{report}");
    let agents: std::collections::BTreeSet<&str> = cells
        .iter()
        .map(|c| c["agent"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        agents.len(),
        4,
        "each cell on its own agent container: {agents:?}"
    );

    // 2. An agent cut off the network for less than the lease: it comes
    // back on the same address, nothing is lost or run twice.
    let longer = scenario(&s, "longer.yaml", 15);
    let child = submit(&s, &api, &longer, "out2");
    let run = wait_running(&s, &d, &api, 4);
    let fast1 = d.name("fast-1");
    docker_ok(&["network", "disconnect", &d.network, &fast1]);
    std::thread::sleep(Duration::from_secs(LEASE_S / 2));
    docker_ok(&["network", "connect", "--ip", &d.ip(20), &d.network, &fast1]);
    let (code, out) = finish(child);
    assert_eq!(code, Some(0), "{out}\n{}", d.logs("ctl"));
    assert!(!out.contains("lost"), "{out}");
    assert_eq!(
        d.logs("fast-1").matches("assigned cell=").count(),
        2,
        "{}",
        d.logs("fast-1")
    );
    assert_eq!(cells_in(&s, &api, &run, "succeeded"), 4);

    // 3. The controller restarted mid-run: the run resumes and completes;
    // the cells running through the restart are not redone.
    let before: usize = ["fast-1", "fast-2", "slow-1", "slow-2"]
        .iter()
        .map(|a| d.logs(a).matches("assigned cell=").count())
        .sum();
    let child = submit(&s, &api, &longer, "out3");
    wait_running(&s, &d, &api, 4);
    docker_ok(&["restart", "-t", "10", &d.name("ctl")]);
    let (code, out) = finish(child);
    assert_eq!(
        code,
        Some(0),
        "{out}\n{}\n{}",
        d.logs("ctl"),
        docker_ok(&["ps", "-a"])
    );
    assert!(d.logs("ctl").contains("resuming run"), "{}", d.logs("ctl"));
    let after: usize = ["fast-1", "fast-2", "slow-1", "slow-2"]
        .iter()
        .map(|a| d.logs(a).matches("assigned cell=").count())
        .sum();
    assert_eq!(after - before, 4, "each of the 4 cells assigned once");

    // 4. An agent container killed mid-run: its cell fails within the
    // lease, the others finish, submit exits 3, nothing hangs.
    let child = submit(&s, &api, &longer, "out4");
    wait_running(&s, &d, &api, 4);
    docker_ok(&["kill", &d.name("slow-2")]);
    let killed = Instant::now();
    let (code, out) = finish(child);
    assert_eq!(code, Some(3), "{out}\n{}", d.logs("ctl"));
    assert!(out.contains("agent slow-2 lost"), "{out}");
    assert!(
        killed.elapsed() < Duration::from_secs(60),
        "{:?}",
        killed.elapsed()
    );

    drop(d);
    let left = docker_ok(&[
        "ps",
        "-a",
        "--filter",
        &format!("name=pgfleet-t{}", std::process::id()),
        "-q",
    ]);
    assert!(left.is_empty(), "containers left: {left}");
}

/// A compose project, taken down (containers, network, volumes) on drop.
struct Compose {
    project: String,
    file: std::path::PathBuf,
    env: Vec<(String, String)>,
}

impl Compose {
    /// `docker compose` where the engine has the plugin, else Debian's
    /// `docker-compose`.
    fn command(&self, args: &[&str]) -> Output {
        let plugin = Command::new("docker")
            .args(["compose", "version"])
            .output()
            .is_ok_and(|o| o.status.success());
        let mut c = if plugin {
            let mut c = Command::new("docker");
            c.arg("compose");
            c
        } else {
            Command::new("docker-compose")
        };
        c.arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(&self.file)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("docker compose (or docker-compose) runs")
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        let _ = self.command(&["down", "-v", "--remove-orphans"]);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A GET's body, None until it answers 200.
fn get(url: &str) -> Option<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(c, "GET /{path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    c.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    // HTTP/1.0 asked, HTTP/1.0 or 1.1 answered.
    let status = head.lines().next()?;
    (status.split(' ').nth(1) == Some("200")).then(|| body.to_string())
}

/// deploy/compose in one command: `docker compose up` starts serve, two
/// agents of two classes and Prometheus (images from build.sh); a newcomer's
/// `pgfleet submit` of the compose scenario succeeds on both agents, the
/// controller's /metrics answers, and Prometheus scrapes the controller and
/// both agents (found through /sd/agents). Everything is taken down after.
#[test]
fn the_compose_stack_comes_up_in_one_command_and_runs_a_submission() {
    let s = Scratch::new("compose");
    build_images();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let secrets = s.dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let (api_port, prom_port) = (free_port(), free_port());
    let compose = Compose {
        project: format!("pgfleet-c{}", std::process::id()),
        file: repo.join("deploy/compose/compose.yaml"),
        env: vec![
            ("PGFLEET_TAG".into(), "test".into()),
            ("PGFLEET_SECRETS".into(), secrets.display().to_string()),
            ("PGFLEET_HTTP_PORT".into(), api_port.to_string()),
            ("PGFLEET_PROMETHEUS_PORT".into(), prom_port.to_string()),
        ],
    };
    let up = compose.command(&["up", "-d"]);
    assert!(up.status.success(), "compose up: {}", show(&up));
    let api = format!("http://127.0.0.1:{api_port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&format!("{api}/readyz")).is_none() {
        assert!(
            Instant::now() < deadline,
            "serve not ready: {}",
            show(&compose.command(&["logs"]))
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let metrics = get(&format!("{api}/metrics")).expect("/metrics answers");
    assert!(metrics.contains("pgfleet_"), "{metrics}");

    let out = Command::new(pgfleet())
        .arg("submit")
        .arg(repo.join("deploy/compose/scenario.yaml"))
        .args(["--server", &api])
        .arg("--token-file")
        .arg(secrets.join("api.token"))
        .arg("--wait")
        .arg("--out")
        .arg(s.out())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        show(&out),
        show(&compose.command(&["logs"]))
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.out().join("report.json")).unwrap())
            .unwrap();
    let mut classes: Vec<&str> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["instance_class"].as_str().unwrap())
        .collect();
    classes.sort();
    assert_eq!(classes, ["gp3", "nvme"]);

    // Prometheus: the controller and both agents, up.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let targets = get(&format!("http://127.0.0.1:{prom_port}/api/v1/targets"))
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        let up: Vec<String> = targets
            .as_ref()
            .and_then(|t| t["data"]["activeTargets"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|t| t["health"] == "up")
            .map(|t| format!("{} {}", t["labels"]["job"], t["scrapeUrl"]))
            .collect();
        let agents = up.iter().filter(|t| t.contains("pgfleet-agents")).count();
        if up.len() == 3 && agents == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus' targets up: {up:?} ({targets:?})"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Issue 21's long cell, run by hand (about 25 minutes; release binaries,
/// so the images' agent loads at speed):
///
/// ```text
/// cargo test --release -p pgfleet-controller --test containers -- \
///     --ignored --nocapture a_long_cell_survives
/// ```
///
/// One pgbench cell of `PGFLEET_LONG_CELL_S` seconds (default 1,200) at
/// scale `PGFLEET_LONG_CELL_SCALE` (default 100) on one agent container,
/// lease 60 s: a quarter of the way through the measurement its agent is
/// cut off the network for 30 s, half-way the controller container
/// restarts. The cell must succeed, be assigned once, and its live samples
/// (one per measured second, sent as they happen) be stored each exactly
/// once with none missing.
#[test]
#[ignore = "25 minutes: run by hand for BENCHMARKS.md (see the doc comment)"]
fn a_long_cell_survives_a_network_cut_and_a_controller_restart() {
    let env = |k: &str, d: u32| std::env::var(k).ok().map_or(d, |v| v.parse().unwrap());
    let (duration, scale) = (
        env("PGFLEET_LONG_CELL_S", 1200),
        env("PGFLEET_LONG_CELL_SCALE", 100),
    );
    let s = Scratch::new("long-cell");
    let started = Instant::now();
    build_images();
    eprintln!("images built in {:.0} s", started.elapsed().as_secs_f64());
    let secrets = secrets(&s);
    let mut d = Deployment::new();
    d.controller(&secrets, 60);
    d.agent("solo", "a", 20, &secrets);
    let api = d.api();
    let file = s.write(
        "long.yaml",
        &format!(
            "name: long-cell\nfleet:\n  - name: a\nworkloads:\n  - kind: pgbench\n    scale: {scale}\n\
             \x20   script: random-update\n    clients: 2\n    duration_s: {duration}\n"
        ),
    );
    let child = submit(&s, &api, &file, "out");
    let run = wait_running(&s, &d, &api, 1);
    let assigned = Instant::now();
    eprintln!("run {run}: cell assigned");
    // Times from the assignment: the load (scale 100: about 20 s) is over
    // well before a quarter of the cell.
    let measuring = assigned;
    let at = |fraction: f64| {
        let t = Duration::from_secs_f64(f64::from(duration) * fraction);
        if let Some(wait) = t.checked_sub(measuring.elapsed()) {
            std::thread::sleep(wait);
        }
    };
    at(0.25);
    let solo = d.name("solo");
    docker_ok(&["network", "disconnect", &d.network, &solo]);
    let cut = Instant::now();
    eprintln!(
        "{:.0} s in: agent cut off",
        measuring.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(30));
    docker_ok(&["network", "connect", "--ip", &d.ip(20), &d.network, &solo]);
    eprintln!(
        "agent reconnected after {:.1} s",
        cut.elapsed().as_secs_f64()
    );
    at(0.5);
    let restart = Instant::now();
    docker_ok(&["restart", "-t", "10", &d.name("ctl")]);
    eprintln!(
        "{:.0} s in: controller restarted in {:.1} s",
        measuring.elapsed().as_secs_f64(),
        restart.elapsed().as_secs_f64()
    );
    let (code, out) = finish(child);
    eprintln!(
        "run ended {:.0} s after the assignment",
        assigned.elapsed().as_secs_f64()
    );
    assert_eq!(code, Some(0), "{out}\n{}", d.logs("ctl"));
    assert!(d.logs("ctl").contains("resuming run"), "{}", d.logs("ctl"));
    assert_eq!(
        d.logs("solo").matches("assigned cell=").count(),
        1,
        "{}",
        d.logs("solo")
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.dir.join("out/report.json")).unwrap())
            .unwrap();
    let cell = &report["cells"][0];
    assert_eq!(cell["state"], "succeeded", "{report}");
    let cell_id = cell["cell_id"].as_str().unwrap();
    let live = report["samples"]["live"][cell_id].as_array().unwrap();
    let seconds: Vec<u64> = live.iter().filter_map(|x| x["second"].as_u64()).collect();
    let distinct: std::collections::BTreeSet<u64> = seconds.iter().copied().collect();
    assert_eq!(distinct.len(), seconds.len(), "a live second stored twice");
    let last = distinct.last().copied().unwrap_or(0);
    let missing: Vec<u64> = (1..=last).filter(|s| !distinct.contains(s)).collect();
    assert!(missing.is_empty(), "live seconds missing: {missing:?}");
    assert!(last + 5 >= u64::from(duration), "live seconds up to {last}");
    let tps = &report["summaries"][0]["classes"]["a"]["tps"]["value"];
    eprintln!(
        "cell {cell_id}: {} s, {} live seconds stored once each, tps {tps}",
        cell["seconds"],
        distinct.len()
    );
}
