//! Metrics against a real Prometheus: `pgfleet run --metrics-addr` on two
//! storage classes, scraped every second by a Prometheus server (Debian's
//! `prometheus`, on loopback, its own storage directory); then every panel
//! query of every dashboard in `dashboards/` (variables substituted with
//! the run's values) must return data, and the variables' own queries must
//! offer the run's values. `promtool check metrics` on a real scrape;
//! `promtool check rules` and `promtool test rules` on the alerts.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Scratch, free_port, show};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(c, "GET {path} HTTP/1.0\r\nhost: {addr}\r\n\r\n").ok()?;
    let mut s = String::new();
    c.read_to_string(&mut s).ok()?;
    let (head, body) = s.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn promtool(args: &[&str], stdin: Option<&str>, dir: &Path) -> std::process::Output {
    use std::io::Write;
    let mut c = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool missing: apt-get install prometheus (.ci/run does it)");
    if let Some(text) = stdin {
        c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    drop(c.stdin.take());
    c.wait_with_output().unwrap()
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let dir = repo().join("deploy/prometheus");
    let out = promtool(&["check", "rules", "alerts.yaml"], None, &dir);
    assert!(out.status.success(), "{}", show(&out));
    let out = promtool(&["test", "rules", "alerts_test.yaml"], None, &dir);
    assert!(out.status.success(), "{}", show(&out));
    // The operator's PrometheusRule holds the same rules.
    let yaml = |p: PathBuf| -> serde_json::Value {
        serde_saphyr::from_str(&std::fs::read_to_string(&p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let rules = yaml(dir.join("alerts.yaml"));
    let operator = yaml(repo().join("deploy/monitoring/prometheusrule.yaml"));
    assert_eq!(
        operator["spec"]["groups"], rules["groups"],
        "deploy/monitoring/prometheusrule.yaml is out of step with deploy/prometheus/alerts.yaml"
    );
    // Every dashboard becomes a ConfigMap.
    let k = std::fs::read_to_string(repo().join("dashboards/kustomization.yaml")).unwrap();
    for e in std::fs::read_dir(repo().join("dashboards"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".json") {
            assert!(
                k.contains(&format!("- {name}")),
                "dashboards/kustomization.yaml misses {name}"
            );
        }
    }
}

#[test]
fn prometheus_scrapes_a_run_and_every_dashboard_query_returns_data() {
    let s = Scratch::new("metrics");
    let metrics_port = free_port();
    let prom_port = free_port();
    let prom_addr = format!("127.0.0.1:{prom_port}");
    s.write(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: pgfleet\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n\
             \x20 - job_name: pgfleet-agents\n    http_sd_configs:\n      - url: http://127.0.0.1:{metrics_port}/sd/agents\n        refresh_interval: 1s\n"
        ),
    );
    let _prom = Killed(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                s.dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                s.dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(s.dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus missing: apt-get install prometheus (.ci/run does it)"),
    );
    let start = Instant::now();
    while get(&prom_addr, "/-/ready").is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "prometheus did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let scenario = s.write(
        "two.yaml",
        "name: metrics-two-storage\nfleet:\n  - name: fast\n    storage: { profile: nvme }\n  - name: slow\n    storage: { profile: gp3 }\n\
         workloads:\n  - kind: pgbench\n    scale: 4\n    script: random-update\n    clients: 4\n    warmup_s: 1\n    duration_s: 10\n\
         \x20 - kind: toast-slice\n    on: [fast]\n    storage_modes: [external, lz4]\n    value_bytes: 1048576\n    offsets: [\"0%\", \"50%\"]\n    duration_s: 0.3\n    repeats: 2\n    warmup_s: 0.1\n\
         \x20 - kind: vacuum-bloat\n    on: [slow]\n    scale: 8\n    bloat_bytes: 48MB\n\
         \x20 - kind: logical-drain\n    on: [fast]\n    roles: { publisher: slow }\n    scale: 1\n    backlog_bytes: 24MB\n\
         \x20 - kind: pgbench\n    on: [slow]\n    scale: 1\n    script: random-update\n    clients: 2\n    duration_s: 14\n    faults: [{ kind: stall, at_s: 3, duration_s: 3 }]\n",
    );
    let t0 = chrono::Utc::now().timestamp();
    let run = s
        .run_cmd(
            &scenario,
            &["--metrics-addr", &format!("127.0.0.1:{metrics_port}")],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A real scrape mid-run, for promtool; and one of an agent's own
    // /metrics, found the way Prometheus finds it.
    let mut scrape = String::new();
    let mut agent_scrape = String::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90)
        && (scrape.is_empty() || agent_scrape.is_empty())
    {
        if scrape.is_empty()
            && let Some(m) = get(&format!("127.0.0.1:{metrics_port}"), "/metrics")
            && m.contains("pgfleet_postgres_transactions_total{")
        {
            scrape = m;
        }
        if agent_scrape.is_empty()
            && let Some(sd) = get(&format!("127.0.0.1:{metrics_port}"), "/sd/agents")
        {
            let sd: serde_json::Value = serde_json::from_str(&sd).unwrap();
            if let Some(target) = sd[0]["targets"][0].as_str()
                && let Some(m) = get(target, "/metrics")
            {
                agent_scrape = m;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!scrape.is_empty(), "no workload series were ever exposed");
    let checked = promtool(&["check", "metrics"], Some(&scrape), &s.dir);
    assert!(checked.status.success(), "{}\n{scrape}", show(&checked));
    assert!(
        agent_scrape.contains("pgfleet_agent_connected 1"),
        "an agent's /metrics during the run: {agent_scrape}"
    );
    let checked = promtool(&["check", "metrics"], Some(&agent_scrape), &s.dir);
    assert!(
        checked.status.success(),
        "{}\n{agent_scrape}",
        show(&checked)
    );
    let t1 = chrono::Utc::now().timestamp();
    let report = s.report();
    // The stall is in the report: its section, its plots with the window
    // shaded, its figures as the class's.
    let md = std::fs::read_to_string(s.out().join("report.md")).unwrap();
    assert!(md.contains("#### Fault 1: stall 3 s at 3 s"), "{md}");
    let plot = md
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "![stall 3 s at 3 s: transactions per second around the fault per class](",
            )
        })
        .and_then(|l| l.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no TPS plot around the fault: {md}"));
    let svg = std::fs::read_to_string(s.out().join(plot)).unwrap();
    assert!(
        svg.contains("<rect x=") && svg.contains("slow: 3."),
        "{svg}"
    );
    let faults = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|x| x["metrics"]["faults"].as_array().cloned())
        .unwrap_or_default();
    let stalled = report["summaries"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|x| x["classes"]["slow"]["fault_transactions_lost"]["value"].as_f64());
    assert!(stalled.is_some_and(|v| v > 0.0), "{faults:?}");
    let run_id = report["run_id"].as_str().unwrap().to_string();

    let query = |expr: &str| -> serde_json::Value {
        let path = format!(
            "/api/v1/query_range?query={}&start={t0}&end={t1}&step=1",
            urlencode(expr)
        );
        let body = get(&prom_addr, &path).unwrap_or_else(|| panic!("query failed: {expr}"));
        serde_json::from_str(&body).unwrap()
    };
    let mut checked_panels = 0;
    for entry in std::fs::read_dir(repo().join("dashboards"))
        .unwrap()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.ends_with(".json") {
            continue;
        }
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(entry.path()).unwrap()).unwrap();
        assert!(
            d.get("__inputs").is_none(),
            "{name}: no __inputs, so file provisioning works"
        );
        let vars = d["templating"]["list"].as_array().unwrap();
        assert!(
            vars.iter().any(|v| v["type"] == "datasource"),
            "{name}: the datasource is a variable"
        );
        // Each variable's query offers this run's value.
        for v in vars.iter().filter(|v| v["type"] == "query") {
            let q = v["definition"].as_str().unwrap();
            let inner = q.trim_start_matches("label_values(").trim_end_matches(')');
            let (selector, label) = inner.rsplit_once(", ").unwrap();
            let selector = selector
                .replace("$scenario", ".*")
                .replace("$run_id", &run_id)
                .replace("$instance_class", ".*");
            let body = get(
                &prom_addr,
                &format!(
                    "/api/v1/label/{label}/values?match[]={}&start={t0}&end={t1}",
                    urlencode(&selector)
                ),
            )
            .unwrap();
            let want = match label {
                "run_id" => run_id.clone(),
                "scenario" => "metrics-two-storage".into(),
                "instance_class" => "slow".into(),
                other => panic!("{name}: variable on unexpected label {other}"),
            };
            assert!(
                body.contains(&format!("\"{want}\"")),
                "{name}: {q} -> {body}"
            );
        }
        // Annotations (the cells' phases) show this run's phases too.
        for a in d["annotations"]["list"].as_array().into_iter().flatten() {
            let Some(expr) = a["expr"].as_str() else {
                continue;
            };
            let expr = expr
                .replace("$run_id", &run_id)
                .replace("$scenario", "metrics-two-storage")
                .replace("$instance_class", ".*");
            let r = query(&expr);
            let series = r["data"]["result"].as_array().cloned().unwrap_or_default();
            let mut phases: Vec<&str> = series
                .iter()
                .filter_map(|x| x["metric"]["phase"].as_str())
                .collect();
            phases.sort();
            phases.dedup();
            // Short phases may fall between two scrapes; the long ones not
            // (the faults' annotation: the 3-s stall).
            let shown = if a["name"] == "Faults" {
                phases == ["fault:stall"]
            } else {
                phases.contains(&"measure") && phases.len() >= 3
            };
            assert!(
                shown,
                "{name}: annotation `{}` misses phases: {phases:?}",
                a["name"]
            );
        }
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$run_id", &run_id)
                    .replace("$scenario", "metrics-two-storage")
                    .replace("$instance_class", ".*")
                    .replace("$__rate_interval", "5s");
                let r = query(&expr);
                let series = r["data"]["result"].as_array().cloned().unwrap_or_default();
                assert!(
                    !series.is_empty(),
                    "{name}: panel `{}` returns no data: {expr}\n{r}",
                    p["title"]
                );
                checked_panels += 1;
            }
        }
    }
    assert!(checked_panels >= 10, "{checked_panels}");
    // Both storage profiles were seen.
    let tps = query(&format!(
        "sum by (storage_profile) (rate(pgfleet_postgres_transactions_total{{run_id=\"{run_id}\"}}[5s]))"
    ));
    let profiles: Vec<&str> = tps["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["metric"]["storage_profile"].as_str())
        .collect();
    assert!(
        profiles.contains(&"nvme") && profiles.contains(&"gp3"),
        "{profiles:?}"
    );
    // The figures agree: the transactions Prometheus holds for each cell's
    // measured window, over that window, are the report's TPS within 2 %.
    // An instant query at the end, and a series' value for one class.
    let instant = |expr: &str| -> serde_json::Value {
        let path = format!("/api/v1/query?time={t1}&query={}", urlencode(expr));
        let body = get(&prom_addr, &path).unwrap_or_else(|| panic!("query failed: {expr}"));
        serde_json::from_str(&body).unwrap()
    };
    let per_class = |v: &serde_json::Value, class: &str| -> f64 {
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["metric"]["instance_class"] == class)
            .and_then(|x| x["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no series for {class}: {v}"))
    };
    let totals = instant(&format!(
        "sum by (instance_class) (max_over_time(pgfleet_transactions_total{{run_id=\"{run_id}\", workload=\"pgbench\"}}[10m]))"
    ));
    // Per class, the transactions of its pgbench cells (slow runs two:
    // one of them stalled).
    let mut expected: std::collections::BTreeMap<String, f64> = Default::default();
    for r in report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["workload"] == "pgbench")
    {
        let class = r["instance_class"].as_str().unwrap().to_string();
        let tps = r["metrics"]["tps"].as_f64().unwrap();
        let window = r["params"]["duration_s"].as_f64().unwrap_or(10.0);
        *expected.entry(class).or_default() += tps * window;
    }
    for (class, want) in &expected {
        let prom = per_class(&totals, class);
        assert!(
            (prom - want).abs() / want < 0.02,
            "{class}: Prometheus {prom:.0} transactions vs the report's {want:.0}"
        );
    }
    assert_eq!(expected.len(), 2);
    // Each finished cell's declared figures are series, with the report's
    // values, one series per entry (slow's two pgbench entries, one of
    // them stalled, are two).
    let results = instant(&format!(
        "max_over_time(pgfleet_cell_result{{run_id=\"{run_id}\"}}[10m])"
    ));
    let results = results["data"]["result"].as_array().unwrap();
    let mut wanted: std::collections::BTreeMap<(String, String, String, &str), Vec<f64>> =
        Default::default();
    for r in report["results"].as_array().unwrap() {
        let (kind, class, cell) = (
            r["workload"].as_str().unwrap(),
            r["instance_class"].as_str().unwrap(),
            r["cell_id"].as_str().unwrap(),
        );
        let entry = pgfleet_report::entry_of(cell).unwrap().to_string();
        for m in pgfleet_proto::workload::info(kind).unwrap().compared {
            if let Some(want) = r["metrics"][m.name].as_f64() {
                let key = (kind.to_string(), class.to_string(), entry.clone(), m.name);
                wanted.entry(key).or_default().push(want);
            }
        }
    }
    assert!(
        wanted
            .keys()
            .any(|(k, c, e, _)| k == "pgbench" && c == "slow" && e != "0"),
        "slow runs a second pgbench entry: {wanted:?}"
    );
    // (A cell's points, toast-slice's modes and offsets, are a series each.)
    for ((kind, class, entry, metric), wants) in &wanted {
        let unit = pgfleet_proto::workload::metric(kind, metric).unwrap().unit;
        let got: Vec<f64> = results
            .iter()
            .filter(|x| {
                let l = &x["metric"];
                l["workload"] == kind.as_str()
                    && l["instance_class"] == class.as_str()
                    && l["entry"] == entry.as_str()
                    && l["metric"] == *metric
                    && l["unit"] == unit
            })
            .filter_map(|x| x["value"][1].as_str()?.parse().ok())
            .collect();
        assert!(
            got.len() == wants.len()
                && wants
                    .iter()
                    .all(|w| got.iter().any(|g| (g - w).abs() <= 1e-9 * w.abs().max(1.0))),
            "{kind} {class} entry {entry} {metric}: report {wants:?}, pgfleet_cell_result {got:?}"
        );
    }
    // Prometheus found both agents through /sd/agents and scraped them;
    // each agent counted the transactions the controller merged for its
    // class (its last seconds may fall after its last scrape).
    let agents = instant(
        "max by (instance_class) (max_over_time(pgfleet_agent_transactions_total{job=\"pgfleet-agents\"}[10m]))",
    );
    // Every workload's driver transactions (toast-slice's reads too), by class.
    let all = instant(&format!(
        "sum by (instance_class) (max_over_time(pgfleet_transactions_total{{run_id=\"{run_id}\"}}[10m]))"
    ));
    for class in ["fast", "slow"] {
        let (agent, controller) = (per_class(&agents, class), per_class(&all, class));
        assert!(
            agent <= controller && agent >= 0.9 * controller,
            "{class}: the agent counted {agent} transactions, the controller {controller}"
        );
    }
    // The live seconds were stored, numbered, once each.
    let store = pgfleet_controller::store::Store::open(&s.store()).unwrap();
    let live = store.samples(&run_id, "live").unwrap();
    assert!(live.len() >= 2 * 9, "{}", live.len());
    s.assert_clean(&common::ports(&report));
}
