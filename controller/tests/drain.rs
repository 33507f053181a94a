//! Multi-role cells end to end: logical-drain's subscriber and publisher on
//! two agents, each in its own network namespace with its own address (real
//! interfaces, no loopback shortcut), and the faults a two-agent cell must
//! survive: a role's server killed, a peer agent SIGKILLed.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Scratch, ports, show};
use pgfleet_controller::store::Store;

fn root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Network namespaces for agents, each with its own address on one
/// subnet, joined by a bridge that lives in a namespace of its own (so the
/// host's firewall, e.g. Docker's FORWARD policy, does not see the traffic);
/// the controller in the host namespace on a veth to that bridge. Removed
/// on drop, on every path.
struct Net {
    switch: String,
    host_link: String,
    namespaces: Vec<String>,
    prefix: String,
}

impl Net {
    fn new(n: usize) -> Net {
        let id = std::process::id() % 100_000;
        let net = Net {
            switch: format!("pgf-{id}-sw"),
            host_link: format!("pgfc{id}"),
            namespaces: (0..n).map(|i| format!("pgf-{id}-{i}")).collect(),
            prefix: format!("10.231.{}", id % 250),
        };
        net.remove();
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", show(&out));
        };
        let sw = net.switch.as_str();
        ip(&["netns", "add", sw]);
        ip(&["-n", sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", sw, "link", "set", "br0", "up"]);
        let host_peer = format!("pgfs{id}");
        ip(&[
            "link",
            "add",
            &net.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &host_peer,
        ]);
        ip(&["link", "set", &host_peer, "netns", sw]);
        ip(&["-n", sw, "link", "set", &host_peer, "master", "br0", "up"]);
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", net.prefix),
            "dev",
            &net.host_link,
        ]);
        ip(&["link", "set", &net.host_link, "up"]);
        for (i, ns) in net.namespaces.iter().enumerate() {
            let (veth, peer) = (format!("pgfv{id}{i}"), format!("pgfp{id}{i}"));
            ip(&["netns", "add", ns]);
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]);
            ip(&["link", "set", &veth, "netns", ns]);
            ip(&["link", "set", &peer, "netns", sw]);
            ip(&["-n", sw, "link", "set", &peer, "master", "br0", "up"]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}.{}/24", net.prefix, i + 2),
                "dev",
                &veth,
            ]);
            ip(&["-n", ns, "link", "set", &veth, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn controller(&self) -> String {
        format!("{}.1:0", self.prefix)
    }

    /// `pgfleet run scenario` with the controller on the host's link and
    /// an agent in each namespace.
    fn run(&self, s: &Scratch, scenario: &std::path::Path) -> std::process::Output {
        s.run_cmd(
            scenario,
            &[
                "--bind",
                &self.controller(),
                "--agent-netns",
                &self.namespaces.join(","),
            ],
        )
        .output()
        .unwrap()
    }

    fn remove(&self) {
        // Deleting a namespace deletes its veth ends, and with them their peers.
        for ns in self.namespaces.iter().chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}

fn drain_scenario(count: u32, replicas: u32, backlog: &str, extra: &str) -> String {
    format!(
        "name: drain
fleet:
  - name: d
    count: {count}
{extra}workloads:
  - kind: logical-drain
    on: [d]
    scale: 2
    backlog_bytes: {backlog}
    clients: 4
    timeout_s: 300
    replicas: {replicas}
"
    )
}

#[test]
fn drain_between_agents_at_different_network_addresses() {
    if !root() {
        common::skip("network namespaces need root");
        return;
    }
    let net = Net::new(2);
    let s = Scratch::new("drain-netns");
    let target: u64 = 48 << 20;
    let sc = s.write("drain.yaml", &drain_scenario(2, 1, &target.to_string(), ""));
    let out = net.run(&s, &sc);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let r = s.report();
    let res = &r["results"][0];
    assert_eq!(res["workload"], "logical-drain");
    let m = &res["metrics"];
    assert_eq!(m["rows_match"], true, "{m}");
    assert_eq!(m["rows"], 200_000);
    let backlog = m["backlog_bytes"].as_f64().unwrap();
    assert!(
        (backlog - target as f64).abs() / (target as f64) < 0.10,
        "backlog {backlog} vs target {target}"
    );
    assert!(m["drain_seconds"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["drain_mb_per_s"].as_f64().unwrap() > 0.0, "{m}");
    // The two roles ran on the two agents, each in its own namespace: the
    // subscriber reached the publisher at the publisher's namespace address.
    let agents = res["agent"].as_str().unwrap();
    assert!(
        agents.contains("subscriber:d-") && agents.contains("publisher:d-"),
        "{agents}"
    );
    let sub = agents
        .split(", ")
        .find_map(|a| a.strip_prefix("subscriber:"))
        .unwrap();
    let log = std::fs::read_to_string(s.out().join(format!("logs/{sub}.log"))).unwrap();
    let peer_line = log.lines().find(|l| l.contains("peer ready")).unwrap_or("");
    assert!(
        peer_line.contains(&format!("host={}.", net.prefix)),
        "the subscriber got a loopback endpoint: {peer_line}"
    );
    // The kind set what logical replication needs on the publisher, and the
    // cell's environment says so per role.
    let env = &r["cells"][0]["environment"];
    assert_eq!(
        env["publisher"]["postgres"]["settings"]["wal_level"],
        "logical"
    );
    let md = std::fs::read_to_string(s.out().join("report.md")).unwrap();
    assert!(md.contains("## logical-drain"), "{md}");
    s.assert_clean(&ports(&r));
}

/// A partition during the drain: the network between the subscriber's
/// server and the publisher's (in their own namespaces) cut for 4 s, then
/// healed; the backlog still drains, the lag at the heal and the catch-up
/// are measured, and no firewall rule is left in either namespace.
#[test]
fn a_partition_during_the_drain_is_measured_and_healed() {
    if !root() {
        common::skip("network namespaces need root");
        return;
    }
    let net = Net::new(2);
    let s = Scratch::new("drain-partition");
    let scenario = drain_scenario(2, 1, "48MB", "")
        + "    faults: [{ kind: partition, at_s: 0.5, duration_s: 4 }]\n";
    let sc = s.write("drain.yaml", &scenario);
    let out = net.run(&s, &sc);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let r = s.report();
    let m = &r["results"][0]["metrics"];
    assert_eq!(m["rows_match"], true, "{m}");
    let f = &m["faults"][0];
    assert_eq!(f["kind"], "partition", "{m}");
    assert!(f["lag_bytes_at_heal"].as_u64().unwrap() > 0, "{f}");
    assert!(f["catch_up_s"].as_f64().unwrap() > 0.0, "{f}");
    let cut = f["end_s"].as_f64().unwrap() - f["start_s"].as_f64().unwrap();
    assert!((cut - 4.0).abs() < 1.0, "{f}");
    assert!(
        m["drain_seconds"].as_f64().unwrap() > 4.0,
        "the cut held: {m}"
    );
    assert_eq!(
        m["catch_up_seconds"].as_f64(),
        f["catch_up_s"].as_f64(),
        "the compared metric is the partition's"
    );
    let md = std::fs::read_to_string(s.out().join("report.md")).unwrap();
    assert!(md.contains("| partition 4 s at 0.5 s |"), "{md}");
    // The lag plot shades the cut.
    let svg = std::fs::read_to_string(s.out().join("drain-lag.svg")).unwrap();
    assert!(
        svg.contains("fill-opacity") && svg.contains("partition 4 s at 0.5 s"),
        "{svg}"
    );
    for ns in &net.namespaces {
        let rules = Command::new("ip")
            .args(["netns", "exec", ns, "iptables", "-w", "-S"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&rules.stdout);
        assert!(!text.contains("pgfleet-cut"), "{ns}: {text}");
    }
    s.assert_clean(&ports(&r));
}

/// The publisher's cluster holds the cell's dataset: pgbench's tables of
/// that scale, the same dataset as a pgbench cell's. The first drain cell's
/// publisher builds and publishes it; the second drain cell's publisher and
/// the pgbench cell restore it, none loading it again; the lead reports
/// the load figures the publisher's agent had, and the cell's dataset
/// names the publisher's role and agent.
#[test]
fn drain_publishers_build_the_dataset_once_and_restore_it_after() {
    let s = Scratch::new("drain-dataset");
    let mut sc = drain_scenario(2, 2, &(8u64 << 20).to_string(), "");
    sc += "  - kind: pgbench
    on: [d]
    scale: 2
    script: random-update
    duration_s: 2
";
    let sc = s.write("drain-dataset.yaml", &sc);
    let out = s.run_cmd(&sc, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let r = s.report();
    let cells: Vec<&serde_json::Value> = r["cells"].as_array().unwrap().iter().collect();
    let drains: Vec<_> = cells
        .iter()
        .filter(|c| c["cell_id"].as_str().unwrap().starts_with("w0-"))
        .collect();
    assert_eq!(drains.len(), 2, "{cells:?}");
    let how = |c: &serde_json::Value| c["environment"]["dataset"]["how"].clone();
    let mut hows: Vec<_> = drains.iter().map(|c| how(c)).collect();
    hows.sort_by_key(|h| h.to_string());
    assert_eq!(hows, ["built", "restored"], "{drains:?}");
    let fingerprint = drains[0]["environment"]["dataset"]["fingerprint"].clone();
    assert!(fingerprint.is_string(), "{fingerprint}");
    for c in &drains {
        let d = &c["environment"]["dataset"];
        assert_eq!(d["fingerprint"], fingerprint, "{d}");
        assert_eq!(d["role"], "publisher", "{d}");
        assert_eq!(
            d["agent"].as_str().unwrap(),
            role(c["agent"].as_str().unwrap(), "publisher"),
            "{c}"
        );
        // The subscriber's side has no dataset of its own.
        assert!(c["environment"]["subscriber"]["dataset"].is_null(), "{c}");
        assert_eq!(
            c["environment"]["publisher"]["dataset"]["fingerprint"],
            fingerprint
        );
    }
    let pgbench = cells
        .iter()
        .find(|c| c["cell_id"].as_str().unwrap().starts_with("w1-"))
        .unwrap();
    assert_eq!(how(pgbench), "restored", "{pgbench}");
    assert_eq!(
        pgbench["environment"]["dataset"]["fingerprint"],
        fingerprint
    );
    // Both drains measured on the full tables, and report the build's
    // load figures (the restore carries them from the manifest).
    let results: Vec<_> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["workload"] == "logical-drain")
        .collect();
    assert_eq!(results.len(), 2);
    for x in &results {
        let m = &x["metrics"];
        assert_eq!(m["rows_match"], true, "{m}");
        assert_eq!(m["rows"], 200_000, "{m}");
        // accounts, tellers and branches
        assert_eq!(m["rows_loaded"], 200_022, "{m}");
        assert!(m["load_seconds"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert_eq!(
        results[0]["metrics"]["load_seconds"],
        results[1]["metrics"]["load_seconds"]
    );
    let md = std::fs::read_to_string(s.out().join("report.md")).unwrap();
    assert!(md.contains("## Datasets"), "{md}");
    s.assert_clean(&ports(&r));

    // Built ahead of time from drain cells alone: the publisher builds it,
    // the subscriber (the lead) ends only once it has.
    let pgfleet = |args: &[&str]| {
        Command::new(common::pgfleet())
            .arg("--store")
            .arg(s.store())
            .args(args)
            .arg("--data-dir")
            .arg(s.data())
            .output()
            .unwrap()
    };
    let fp = fingerprint.as_str().unwrap();
    let rm = pgfleet(&["datasets", "rm", fp]);
    assert_eq!(rm.status.code(), Some(0), "{}", show(&rm));
    std::fs::remove_dir_all(s.out()).unwrap();
    let only = s.write(
        "drain-only.yaml",
        &drain_scenario(2, 2, &(8u64 << 20).to_string(), ""),
    );
    let build = pgfleet(&[
        "datasets",
        "build",
        only.to_str().unwrap(),
        "--out",
        s.out().to_str().unwrap(),
        "--agent-bin",
        common::agent_bin().to_str().unwrap(),
    ]);
    assert_eq!(build.status.code(), Some(0), "{}", show(&build));
    let text = String::from_utf8_lossy(&build.stdout);
    assert!(text.contains(&format!("succeeded: {fp}")), "{text}");
    assert!(text.contains(" built"), "{text}");
    let list = pgfleet(&["datasets", "list"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains(fp) && text.contains("1 dataset(s)"), "{text}");
    s.assert_clean(&[]);
}

/// The cell's agents and the run id, once every cell runs and `delay` has
/// passed since each cell's subscriber got its peer.
fn wait_running(s: &Scratch, cells: usize, delay: Duration) -> (String, Vec<(String, String)>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "cells never all started");
        std::thread::sleep(Duration::from_millis(300));
        let Ok(store) = Store::open(&s.store()) else {
            continue;
        };
        let Some(run) = store.runs().unwrap().pop() else {
            continue;
        };
        let rows = store.cells(&run.id).unwrap();
        let drains: Vec<_> = rows
            .iter()
            .filter(|c| c.workload == "logical-drain" && c.state == "running")
            .map(|c| (c.cell_id.clone(), c.agent_id.clone().unwrap_or_default()))
            .collect();
        let ready = drains.len() == cells
            && drains.iter().all(|(_, agents)| {
                let sub = agents
                    .split(", ")
                    .find_map(|a| a.strip_prefix("subscriber:"))
                    .unwrap_or("");
                std::fs::read_to_string(s.out().join(format!("logs/{sub}.log")))
                    .is_ok_and(|l| l.contains("peer ready"))
            });
        if ready {
            std::thread::sleep(delay);
            return (run.id, drains);
        }
    }
}

fn role(agents: &str, role: &str) -> String {
    agents
        .split(", ")
        .find_map(|a| a.strip_prefix(&format!("{role}:")))
        .unwrap()
        .to_string()
}

#[test]
fn a_killed_role_server_or_peer_agent_fails_its_cell_and_the_rest_goes_on() {
    let s = Scratch::new("drain-faults");
    let lease = 3.0;
    let other = "  - name: x
    count: 1
";
    let mut sc = drain_scenario(4, 2, "2GiB", other);
    sc += "  - kind: pgbench-init
    on: [x]
    scale: 1
";
    let sc = s.write("faults.yaml", &sc);
    let child = s
        .run_cmd(&sc, &["--lease-s", &lease.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (run, cells) = wait_running(&s, 2, Duration::from_secs(4));
    // Cell 1: its subscriber's PostgreSQL server is killed (an OOM kill).
    let (server_cell, agents) = &cells[0];
    let sub = role(agents, "subscriber");
    let pidfile = s
        .data()
        .join(&run)
        .join(&sub)
        .join("clusters")
        .join(server_cell)
        .join("data/postmaster.pid");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("{}: {e}", pidfile.display()))
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Cell 2: its publisher's agent is SIGKILLed.
    let (agent_cell, agents) = &cells[1];
    let publisher = role(agents, "publisher");
    let killed_at = common::kill_agent(&s.data(), &publisher);

    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    let r = s.report();
    let cell = |id: &str| {
        r["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["cell_id"] == id)
            .unwrap()
            .clone()
    };
    let c1 = cell(server_cell);
    assert_eq!(c1["state"], "failed");
    let e1 = c1["error"].as_str().unwrap();
    assert!(
        e1.contains(&format!("role subscriber ({sub})")) && e1.contains("PostgreSQL server"),
        "{e1}"
    );
    eprintln!("killed server: {e1}");
    let c2 = cell(agent_cell);
    assert_eq!(c2["state"], "failed");
    let e2 = c2["error"].as_str().unwrap();
    eprintln!("killed peer agent: {e2}");
    assert!(e2.contains("role "), "{e2}");
    for c in [&c1, &c2] {
        let at = chrono::DateTime::parse_from_rfc3339(c["finished_at"].as_str().unwrap()).unwrap();
        let took = (at.with_timezone(&chrono::Utc) - killed_at).num_milliseconds() as f64 / 1000.0;
        assert!(
            took <= lease + 2.0,
            "{} failed {took:.1}s after the kills",
            c["cell_id"]
        );
    }
    // The other cell went on.
    let other: Vec<_> = r["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["workload"] == "pgbench-init")
        .collect();
    assert_eq!(other[0]["state"], "succeeded", "{}", other[0]);
    s.assert_clean(&ports(&r));
}
