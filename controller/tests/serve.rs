//! `pgfleet serve` as CI uses it: a real server process, real static agents
//! joining it by class (`pgfleet-agent run --class`), real PostgreSQL
//! clusters, the real HTTP API (raw HTTP/1.1 from the test, and `pgfleet
//! submit | status | cancel | report --server`), and schemathesis fuzzing
//! the served OpenAPI document.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Scratch, agent_bin, free_port, pgfleet, show};

/// A child process stopped (SIGTERM, then SIGKILL) when dropped.
struct Proc {
    child: Child,
    name: String,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig);
    }
    /// SIGTERM and wait (bounded) for it to exit.
    fn stop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{} did not stop on SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

struct Server {
    proc: Proc,
    api: String,
    grpc: u16,
}

/// Starts `pgfleet serve` on the given ports (0: any) and waits until it
/// says where it listens. Its lease is 10 s unless `extra` gives one: long
/// enough that an agent next to another PostgreSQL test is never taken for
/// lost, short enough that a killed one is found quickly. (The test that
/// holds a lease to 3 s runs alone: profile `timed`.)
fn start_serve(s: &Scratch, grpc: u16, http: u16, extra: &[&str]) -> Server {
    start_serve_env(s, grpc, http, extra, &[])
}

/// `start_serve` with environment variables set for the server.
fn start_serve_env(
    s: &Scratch,
    grpc: u16,
    http: u16,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Server {
    let mut child = Command::new(pgfleet())
        .envs(env.iter().copied())
        .arg("--store")
        .arg(s.store())
        .arg("serve")
        .args(["--bind", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--api-token-file")
        .arg(s.dir.join("api.token"))
        .arg("--join-token-file")
        .arg(s.dir.join("join.token"))
        .args(if extra.contains(&"--lease-s") {
            &[][..]
        } else {
            &["--lease-s", "10"][..]
        })
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = s.dir.join("serve.log");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(f, "{line}");
            if line.contains("API on http") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("serve did not start: {}", serve_log(s)));
    let api = line
        .split("API on ")
        .nth(1)
        .and_then(|x| x.split(',').next())
        .unwrap()
        .to_string();
    let grpc = line
        .split("(gRPC on 127.0.0.1:")
        .nth(1)
        .and_then(|x| x.split(')').next())
        .unwrap()
        .parse()
        .unwrap();
    Server {
        proc: Proc {
            child,
            name: "serve".into(),
        },
        api,
        grpc,
    }
}

fn serve_log(s: &Scratch) -> String {
    std::fs::read_to_string(s.dir.join("serve.log")).unwrap_or_default()
}

/// A static agent of `class` joining the server at `grpc`.
fn start_agent(s: &Scratch, id: &str, class: &str, grpc: u16) -> Proc {
    let log = std::fs::File::create(s.dir.join(format!("{id}.log"))).unwrap();
    let child = Command::new(agent_bin())
        .arg("run")
        .args(["--controller", &format!("http://127.0.0.1:{grpc}")])
        .args(["--class", class, "--agent-id", id])
        .arg("--token-file")
        .arg(s.dir.join("join.token"))
        .arg("--data-root")
        .arg(s.data().join(id))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc {
        child,
        name: id.to_string(),
    }
}

fn agent_log(s: &Scratch, id: &str) -> String {
    std::fs::read_to_string(s.dir.join(format!("{id}.log"))).unwrap_or_default()
}

/// One HTTP/1.1 request; returns status, headers (lowercase names) and body.
fn http(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let addr = base.trim_start_matches("http://");
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        req.push_str(&format!("authorization: Bearer {t}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    c.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let chunked = head.to_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, head.to_lowercase(), body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// `pgfleet <args> --server URL --token-file F`.
fn remote(s: &Scratch, api: &str, args: &[&str]) -> Command {
    let mut c = Command::new(pgfleet());
    c.args(args)
        .args(["--server", api])
        .arg("--token-file")
        .arg(s.dir.join("api.token"));
    c
}

fn scenario(s: &Scratch, file: &str, name: &str, classes: &[&str], duration_s: u32) -> PathBuf {
    let mut text = format!("name: {name}\nfleet:\n");
    for c in classes {
        text.push_str(&format!(
            "  - name: {c}\n    count: 1\n    storage: {{ profile: nvme }}\n"
        ));
    }
    text.push_str(&format!(
        "workloads:\n  - kind: pgbench\n    scale: 2\n    script: random-update\n    clients: 2\n    warmup_s: 1\n    duration_s: {duration_s}\n    replicas: 1\n"
    ));
    s.write(file, &text)
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the newest run has a cell of `class` running, then a few
/// seconds more (its cluster is loaded and it measures).
fn wait_for_cell_running(api: &str, token: &str, class: &str) {
    wait_for("a running cell", Duration::from_secs(60), || {
        let (_, _, runs) = http(api, "GET", "/v1/runs", Some(token), &[], "");
        let Some(id) = json(&runs)[0]["id"].as_str().map(str::to_string) else {
            return false;
        };
        let (_, _, run) = http(api, "GET", &format!("/v1/runs/{id}"), Some(token), &[], "");
        json(&run)["cells"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["instance_class"] == class && c["state"] == "running")
        })
    });
    std::thread::sleep(Duration::from_secs(4));
}

fn tokens(s: &Scratch) -> String {
    let api = "api-token-0123456789abcdef";
    std::fs::write(s.dir.join("api.token"), format!("{api}\n")).unwrap();
    std::fs::write(s.dir.join("join.token"), "join-token-0123456789abcdef\n").unwrap();
    api.to_string()
}

fn schemathesis() -> PathBuf {
    let p = std::env::var_os("PGFLEET_SCHEMATHESIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/pgfleet-venv/bin/schemathesis"));
    assert!(
        p.is_file(),
        "{} missing: `python3 -m venv /opt/pgfleet-venv && /opt/pgfleet-venv/bin/pip install schemathesis` (.ci/run does it), or set PGFLEET_SCHEMATHESIS",
        p.display()
    );
    p
}

#[test]
fn ci_submits_to_serve_and_static_agents_run_the_cells() {
    let s = Scratch::new("serve-api");
    let token = tokens(&s);
    let mut server = start_serve(&s, 0, 0, &["--registration-timeout-s", "3"]);
    let api = server.api.clone();

    // Health needs no token; everything else does.
    assert_eq!(http(&api, "GET", "/healthz", None, &[], "").0, 200);
    assert_eq!(http(&api, "GET", "/readyz", None, &[], "").0, 200);
    let (code, head, body) = http(&api, "GET", "/v1/runs", None, &[], "");
    assert_eq!(code, 401, "{body}");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    assert!(body.contains("missing bearer token"), "{body}");
    let (code, _, body) = http(
        &api,
        "GET",
        "/v1/runs",
        Some("wrong-token-0123456789"),
        &[],
        "",
    );
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("wrong bearer token"), "{body}");
    assert_eq!(http(&api, "GET", "/openapi.json", None, &[], "").0, 401);
    let (code, _, doc) = http(&api, "GET", "/openapi.json", Some(&token), &[], "");
    assert_eq!(code, 200);
    assert!(json(&doc)["paths"]["/v1/runs/{id}/events"].is_object());

    // An invalid scenario: 422 with the CLI's located message.
    let bad = s.write(
        "bad.yaml",
        "name: bad\nfleet:\n  - name: a\nworkloads:\n  - kind: pgbench\n    scale: 2\n    clients: 0\n",
    );
    let cli = Command::new(pgfleet())
        .arg("validate")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(2));
    let cli_err = String::from_utf8_lossy(&cli.stderr).to_string();
    let (code, _, body) = http(
        &api,
        "POST",
        "/v1/runs?name=bad.yaml",
        Some(&token),
        &[],
        &std::fs::read_to_string(&bad).unwrap(),
    );
    assert_eq!(code, 422, "{body}");
    let e = json(&body);
    assert_eq!(e["location"]["line"], 7, "{body}");
    assert_eq!(e["location"]["field"], "workloads[0].clients", "{body}");
    let msg = e["error"].as_str().unwrap();
    assert!(cli_err.contains(msg), "CLI: {cli_err}\nAPI: {msg}");
    // Too large: 413, and nothing stored.
    let big = "#".repeat(2 << 20);
    let (code, _, body) = http(&api, "POST", "/v1/runs", Some(&token), &[], &big);
    assert_eq!(code, 413, "{body}");

    // A class no agent has: the run waits for agents, then says which
    // class lacks them and how to add one. With --timeout-s passing
    // first, submit exits 3 and cancels the run.
    let lonely = scenario(&s, "lonely.yaml", "lonely", &["gp3"], 2);
    let out = remote(&s, &api, &["submit"])
        .arg(&lonely)
        .args(["--wait", "--timeout-s", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    let timed_out = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    let out = remote(&s, &api, &["submit"])
        .arg(&lonely)
        .arg("--wait")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("instance class `gp3` needs 1 agent(s); 0 idle")
            && err.contains("pgfleet-agent run --controller URL --class gp3"),
        "{err}"
    );
    let (_, _, body) = http(
        &api,
        "GET",
        &format!("/v1/runs/{timed_out}"),
        Some(&token),
        &[],
        "",
    );
    assert_eq!(json(&body)["status"], "cancelled", "{body}");

    // Two static agents of two classes join.
    let _fast = start_agent(&s, "fast-1", "fast", server.grpc);
    let mut slow = start_agent(&s, "slow-1", "slow", server.grpc);
    wait_for("both agents to join", Duration::from_secs(30), || {
        let (_, _, body) = http(&api, "GET", "/v1/agents", Some(&token), &[], "");
        json(&body).as_array().is_some_and(|a| a.len() == 2)
    });

    // A two-class run, followed to its end by `submit --wait`.
    let two = scenario(&s, "two.yaml", "two-classes", &["fast", "slow"], 3);
    let waiting = remote(&s, &api, &["submit"])
        .arg(&two)
        .arg("--wait")
        .arg("--out")
        .arg(s.out())
        .args(["--label", "commit=4f2a9c1", "--label", "note=a b&c"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    wait_for("the run to start", Duration::from_secs(30), || {
        let (_, _, runs) = http(&api, "GET", "/v1/runs", Some(&token), &[], "");
        json(&runs)[0]["status"] == "running"
    });
    // Meanwhile: a second run with an idempotency key, queued behind it
    // (same classes); the retried submit gets the same run; cancel it.
    let body2 = std::fs::read_to_string(&two).unwrap();
    let key = [("idempotency-key", "ci-job-42")];
    let (code, head, first) = http(
        &api,
        "POST",
        "/v1/runs?name=two.yaml",
        Some(&token),
        &key,
        &body2,
    );
    assert_eq!(code, 202, "{first}");
    let first = json(&first);
    let queued = first["id"].as_str().unwrap().to_string();
    assert!(
        head.contains(&format!("location: /v1/runs/{queued}")),
        "{head}"
    );
    assert_eq!(first["created"], true);
    let (code, _, again) = http(
        &api,
        "POST",
        "/v1/runs?name=two.yaml",
        Some(&token),
        &key,
        &body2,
    );
    assert_eq!(code, 202);
    let again = json(&again);
    assert_eq!(
        again["id"],
        queued.as_str(),
        "a retried submit returns the same run"
    );
    assert_eq!(again["created"], false);
    // The same key with another scenario is refused (never answered with
    // the earlier run); another token's same key names a run of its own.
    let (code, _, body) = http(
        &api,
        "POST",
        "/v1/runs?name=two.yaml",
        Some(&token),
        &key,
        &format!("{body2}\n# another scenario\n"),
    );
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("Idempotency-Key"), "{body}");
    let other = "api-token-other-0123456789abcdef";
    std::fs::write(s.dir.join("api.token"), format!("{token}\n{other}\n")).unwrap();
    let (code, _, body) = http(
        &api,
        "POST",
        "/v1/runs?name=two.yaml",
        Some(other),
        &key,
        &body2,
    );
    assert_eq!(code, 202, "{body}");
    let theirs = json(&body);
    assert_eq!(theirs["created"], true, "{theirs}");
    assert_ne!(theirs["id"], queued.as_str(), "another token's key");
    let (code, _, body) = http(
        &api,
        "DELETE",
        &format!("/v1/runs/{}", theirs["id"].as_str().unwrap()),
        Some(other),
        &[],
        "",
    );
    assert_eq!(code, 202, "{body}");
    // The clients below read the token file as their token: one again.
    std::fs::write(s.dir.join("api.token"), format!("{token}\n")).unwrap();
    let (code, _, body) = http(
        &api,
        "DELETE",
        &format!("/v1/runs/{queued}"),
        Some(&token),
        &[],
        "",
    );
    assert_eq!(code, 202, "{body}");
    let (code, _, body) = http(
        &api,
        "DELETE",
        &format!("/v1/runs/{queued}"),
        Some(&token),
        &[],
        "",
    );
    assert_eq!(code, 409, "cancelling a finished run: {body}");
    let (code, _, _) = http(
        &api,
        "DELETE",
        "/v1/runs/no-such-run",
        Some(&token),
        &[],
        "",
    );
    assert_eq!(code, 404);
    let (_, _, body) = http(
        &api,
        "GET",
        &format!("/v1/runs/{queued}"),
        Some(&token),
        &[],
        "",
    );
    let q = json(&body);
    assert_eq!(q["status"], "cancelled", "{body}");
    assert!(
        q["cells"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "cancelled"),
        "{body}"
    );

    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        show(&out),
        serve_log(&s)
    );
    let run_id = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    let report = s.report();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    let classes: Vec<&str> = cells
        .iter()
        .map(|c| c["instance_class"].as_str().unwrap())
        .collect();
    assert!(
        classes.contains(&"fast") && classes.contains(&"slow"),
        "{classes:?}"
    );
    assert!(cells.iter().all(|c| c["state"] == "succeeded"), "{cells:?}");
    // Its labels came through the query, into the report and the API,
    // which lists by them (`&` and spaces encoded on the way).
    assert_eq!(
        report["labels"],
        serde_json::json!({"commit": "4f2a9c1", "note": "a b&c"})
    );
    let (code, _, body) = http(
        &api,
        "GET",
        "/v1/runs?label=commit%3D4f2a9c1&label=note%3Da%20b%26c",
        Some(&token),
        &[],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let picked: Vec<String> = json(&body)
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(picked, std::slice::from_ref(&run_id), "{body}");
    let (code, _, body) = http(&api, "GET", "/v1/runs?label=commit", Some(&token), &[], "");
    assert!(code == 400 && body.contains("no `=`"), "{code} {body}");
    // The scenario's history: this run, the cancelled one left out.
    let (code, _, body) = http(
        &api,
        "GET",
        "/v1/history?scenario=two-classes&metric=tps",
        Some(&token),
        &[],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let h = json(&body);
    assert_eq!(h["reference"], run_id.as_str(), "{body}");
    assert_eq!(h["runs"].as_array().map(Vec::len), Some(1), "{body}");
    let series = h["series"].as_array().unwrap();
    assert!(
        series.len() == 2
            && series
                .iter()
                .all(|s| s["metric"] == "tps" && s["values"].as_array().map(Vec::len) == Some(1)),
        "one tps series per class: {body}"
    );
    assert!(
        h["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["run_id"] == queued.as_str() && e["reason"] == "it cancelled"),
        "{body}"
    );
    let (code, _, body) = http(&api, "GET", "/v1/history", Some(&token), &[], "");
    assert!(code == 400 && body.contains("?scenario="), "{code} {body}");
    let (code, _, body) = http(
        &api,
        "GET",
        "/v1/history?scenario=nope",
        Some(&token),
        &[],
        "",
    );
    assert!(
        code == 404 && body.contains("no run of scenario `nope`"),
        "{code} {body}"
    );
    // Each agent has its own store (its data root's): each built the one
    // dataset; the controller's record says so.
    let (code, _, body) = http(&api, "GET", "/v1/datasets", Some(&token), &[], "");
    assert_eq!(code, 200, "{body}");
    let ds = json(&body);
    assert_eq!(ds.as_array().map(Vec::len), Some(1), "{body}");
    assert!(
        ds[0]["fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("pgbench-s2-"),
        "{body}"
    );
    let mut builders: Vec<&str> = ds[0]["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["agent_id"].as_str().unwrap())
        .collect();
    builders.sort();
    assert_eq!(builders, ["fast-1", "slow-1"], "{body}");
    assert_eq!(ds[0]["runs"][0], run_id.as_str(), "{body}");
    let md = std::fs::read_to_string(s.out().join("report.md")).unwrap();
    let svgs: Vec<_> = std::fs::read_dir(s.out())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .collect();
    assert!(
        !svgs.is_empty() && md.contains(".svg"),
        "plots come with the report"
    );

    // The finished run's event stream: every cell, then the final status.
    let (code, head, events) = http(
        &api,
        "GET",
        &format!("/v1/runs/{run_id}/events"),
        Some(&token),
        &[],
        "",
    );
    assert_eq!(code, 200);
    assert!(head.contains("text/event-stream"), "{head}");
    assert_eq!(events.matches("event: cell").count(), 2, "{events}");
    assert!(
        events
            .trim_end()
            .ends_with(r#"data: {"type":"run","status":"succeeded"}"#),
        "{events}"
    );
    let status = remote(&s, &api, &["status", &run_id]).output().unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", show(&status));
    assert!(String::from_utf8_lossy(&status.stdout).contains("succeeded, 2/2 cells done"));
    let again = s.dir.join("again");
    let rep = remote(
        &s,
        &api,
        &["report", &run_id, "--out", again.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(rep.status.code(), Some(0), "{}", show(&rep));
    assert_eq!(
        std::fs::read(again.join("report.json")).unwrap(),
        std::fs::read(s.out().join("report.json")).unwrap()
    );

    // An agent killed mid-run: its cell fails within the lease, exit 3,
    // the other class's cell is unaffected.
    let long = scenario(&s, "long.yaml", "long", &["fast", "slow"], 30);
    let waiting = remote(&s, &api, &["submit"])
        .arg(&long)
        .arg("--wait")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_cell_running(&api, &token, "slow");
    slow.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agent slow-1 lost"), "{err}");
    assert!(
        killed.elapsed() < Duration::from_secs(45),
        "{:?}",
        killed.elapsed()
    );
    let _ = slow.child.wait();
    // What the killed agent left: its clusters; the agent's cleanup removes them.
    let cleaned = Command::new(agent_bin())
        .args(["cleanup", "--data-root"])
        .arg(s.data().join("slow-1"))
        .output()
        .unwrap();
    assert!(cleaned.status.success(), "{}", show(&cleaned));

    // The served OpenAPI document, fuzzed: no 5xx, every response as
    // documented. (positive_data_acceptance is off: a scenario is "any
    // string" to the schema, and most strings are not valid scenarios.)
    let st = Command::new(schemathesis())
        .args(["run", &format!("{api}/openapi.json")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        .args(["--max-examples", "25"])
        .env("NO_COLOR", "1")
        .current_dir(&s.dir)
        .output()
        .unwrap();
    assert!(st.status.success(), "schemathesis:\n{}", show(&st));

    server.proc.stop();
    drop(_fast);
    s.assert_clean(&[]);
}

#[test]
fn a_restarted_serve_resumes_its_runs_without_redoing_results() {
    let s = Scratch::new("serve-restart");
    tokens(&s);
    let (grpc, http_port) = (free_port(), free_port());
    let server = start_serve(&s, grpc, http_port, &[]);
    let api = server.api.clone();
    let mut agent = start_agent(&s, "a-1", "local", grpc);
    let two = scenario(&s, "two.yaml", "restart", &["local"], 6);
    // Two cells on one agent, one after the other.
    let text = std::fs::read_to_string(&two)
        .unwrap()
        .replace("replicas: 1", "replicas: 2");
    std::fs::write(&two, text).unwrap();
    let waiting = remote(&s, &api, &["submit"])
        .arg(&two)
        .args(["--wait", "--retry-for-s", "60"])
        .arg("--out")
        .arg(s.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_cell_running(&api, "api-token-0123456789abcdef", "local");
    // The controller dies mid-cell and comes back on the same store.
    let mut server = server;
    server.proc.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = server.proc.child.wait();
    std::thread::sleep(Duration::from_secs(1));
    let mut server = start_serve(&s, grpc, http_port, &[]);

    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        show(&out),
        serve_log(&s)
    );
    assert!(serve_log(&s).contains("resuming run"), "{}", serve_log(&s));
    let log = agent_log(&s, "a-1");
    assert!(log.contains("session lost; reconnecting"), "{log}");
    // Each cell was assigned once: the one running through the restart
    // was not redone.
    assert_eq!(log.matches("assigned cell=").count(), 2, "{log}");
    let report = s.report();
    assert!(
        report["cells"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "succeeded"),
        "{report}"
    );
    server.proc.stop();
    agent.stop();
    s.assert_clean(&[]);
    assert!(Path::new(&s.store()).exists());
}

/// Acknowledged means durable, for samples too: `serve` is SIGKILLed three
/// times while a pgbench cell streams its live seconds, each time while a
/// batch of them has been handed to the sample writer and not committed
/// (fault injection widens that window to 1.5 s). The agent replays what
/// was not acknowledged; every measured second is stored exactly once.
/// (Before acknowledgements waited for the commit, each kill lost the
/// batch in flight.)
#[test]
fn a_serve_killed_between_hand_off_and_commit_loses_no_live_second() {
    let s = Scratch::new("serve-commit-kill");
    let token = tokens(&s);
    let (grpc, http_port) = (free_port(), free_port());
    let fault = [("PGFLEET_FAULT_SAMPLE_COMMIT_DELAY_MS", "1500")];
    let mut server = start_serve_env(&s, grpc, http_port, &[], &fault);
    let api = server.api.clone();
    let mut agent = start_agent(&s, "a-1", "local", grpc);
    let sc = scenario(&s, "live.yaml", "commit-kill", &["local"], 30);
    let waiting = remote(&s, &api, &["submit"])
        .arg(&sc)
        .args(["--wait", "--retry-for-s", "120"])
        .arg("--out")
        .arg(s.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_cell_running(&api, &token, "local");
    let live_stored = || -> usize {
        pgfleet_controller::store::Store::open(&s.store())
            .ok()
            .and_then(|st| {
                let run = st.runs().ok()?.pop()?;
                st.samples(&run.id, "live").ok()
            })
            .map_or(0, |v| v.len())
    };
    for round in 0..3 {
        // Live seconds are flowing; the next batch sits in the writer's
        // 1.5 s pause when the kill comes.
        let before = live_stored();
        wait_for("a live second stored", Duration::from_secs(30), || {
            live_stored() > before
        });
        std::thread::sleep(Duration::from_millis(700));
        server.proc.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = server.proc.child.wait();
        eprintln!(
            "round {round}: killed serve with {} live seconds stored",
            live_stored()
        );
        server = start_serve_env(&s, grpc, http_port, &[], &fault);
    }
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        show(&out),
        serve_log(&s)
    );
    let log = agent_log(&s, "a-1");
    assert!(
        log.contains("replaying samples the controller has not acknowledged"),
        "{log}"
    );
    let store = pgfleet_controller::store::Store::open(&s.store()).unwrap();
    let run = store.runs().unwrap().pop().unwrap();
    let seconds = |kind: &str, field: &str| -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = store
            .samples(&run.id, kind)
            .unwrap()
            .iter()
            .map(|(_, v)| (v["second"].as_u64().unwrap(), v[field].as_u64().unwrap()))
            .collect();
        v.sort();
        v
    };
    let live = seconds("live", "transactions");
    let numbers: Vec<u64> = live.iter().map(|x| x.0).collect();
    assert_eq!(numbers, (1..=30).collect::<Vec<u64>>(), "{live:?}");
    assert_eq!(
        live,
        seconds("second", "tps"),
        "live vs the result's seconds"
    );
    server.proc.stop();
    agent.stop();
    s.assert_clean(&[]);
}

/// The API's own guards: a scenario with allow_shell is refused (403,
/// located) unless serve permits it; a full queue answers 429 with
/// Retry-After; a read-only token reads but cannot submit or cancel; and
/// over TLS (`--http-tls-cert`), `pgfleet submit --ca` reaches it while a
/// plaintext request and a client without the CA do not.
#[test]
fn the_api_refuses_shell_scenarios_full_queues_read_only_writes_and_speaks_tls() {
    let s = Scratch::new("serve-guards");
    let token = tokens(&s);
    let reader = "read-only-token-0123456789abcdef";
    std::fs::write(
        s.dir.join("api.token"),
        format!("{token}\nread-only {reader}\n"),
    )
    .unwrap();
    // No agents join: runs wait for theirs, so later ones stay queued.
    let mut server = start_serve(
        &s,
        0,
        0,
        &["--max-queued-runs", "1", "--registration-timeout-s", "120"],
    );
    let api = server.api.clone();
    let shell = "name: shell\nfleet:\n  - name: local\nworkloads:\n  - kind: pgbench\n    scale: 1\n    script_text: \"SELECT 1;\"\n    transactions: 1\n    allow_shell: true\n";
    let (code, _, body) = http(
        &api,
        "POST",
        "/v1/runs?name=shell.yaml",
        Some(&token),
        &[],
        shell,
    );
    assert_eq!(code, 403, "{body}");
    let b = json(&body);
    assert_eq!(b["location"]["field"], "workloads[0].allow_shell", "{body}");
    assert_eq!(b["location"]["line"], 9, "{body}");
    assert!(
        b["error"]
            .as_str()
            .unwrap()
            .contains("--allow-shell-scenarios"),
        "{body}"
    );

    let sc = std::fs::read_to_string(scenario(&s, "q.yaml", "queued", &["local"], 1)).unwrap();
    let submit = |t: &str| http(&api, "POST", "/v1/runs", Some(t), &[], &sc);
    let (code, _, body) = submit(reader);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("read-only"), "{body}");
    // ... but may plan (nothing is stored: the runs listed below are the
    // two submitted). The plan has each cell's estimate by phase.
    let (code, _, body) = http(&api, "POST", "/v1/plan", Some(reader), &[], &sc);
    assert_eq!(code, 200, "{body}");
    let plan = json(&body);
    let cell = &plan["cells"][0];
    let p = &cell["phases"];
    let sum: f64 = ["data", "prepare", "measure", "other"]
        .iter()
        .map(|k| p[k].as_f64().unwrap())
        .sum();
    let seconds = cell["seconds"].as_f64().unwrap();
    assert!(seconds > 0.0 && (sum - seconds).abs() < 0.5, "{body}");
    assert_eq!(cell["data_step"], "built", "{body}");
    assert!(p["data"].as_f64().unwrap() > 0.0, "{body}");
    assert!(
        plan["shares"]
            .as_str()
            .unwrap()
            .starts_with("data movement "),
        "{body}"
    );
    assert!(
        plan["text"]
            .as_str()
            .unwrap()
            .contains("where the hours go"),
        "{body}"
    );
    // A class naming no version runs the default, 18.
    assert_eq!(plan["postgres_versions"]["local"], 18, "{body}");
    let (code, _, body) = http(
        &api,
        "POST",
        "/v1/plan?name=shell.yaml",
        Some(reader),
        &[],
        shell,
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(json(&body)["location"]["line"], 9, "{body}");
    let (code, _, body) = http(&api, "POST", "/v1/plan", Some(reader), &[], "name: [");
    assert_eq!(code, 422, "{body}");
    // The first starts (waiting for agents), the second waits in the
    // queue, the third finds it full.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (code, _, body) = submit(&token);
        assert_eq!(code, 202, "{body}");
        ids.push(json(&body)["id"].as_str().unwrap().to_string());
        std::thread::sleep(Duration::from_millis(1500));
    }
    let (code, head, body) = submit(&token);
    assert_eq!(code, 429, "{body}");
    assert!(head.contains("retry-after: 30"), "{head}");
    // The read-only token reads runs, and may not cancel them.
    let (code, _, body) = http(&api, "GET", "/v1/runs", Some(reader), &[], "");
    assert_eq!(
        (code, json(&body).as_array().map(Vec::len)),
        (200, Some(2)),
        "{body}"
    );
    let (code, _, _) = http(
        &api,
        "DELETE",
        &format!("/v1/runs/{}", ids[0]),
        Some(reader),
        &[],
        "",
    );
    assert_eq!(code, 403);
    for id in &ids {
        let (code, _, body) = http(
            &api,
            "DELETE",
            &format!("/v1/runs/{id}"),
            Some(&token),
            &[],
            "",
        );
        assert_eq!(code, 202, "{body}");
    }
    server.proc.stop();

    // Over TLS, with the same store; `pgfleet submit` reads one token.
    std::fs::write(s.dir.join("api.token"), format!("{token}\n")).unwrap();
    common::certificates(&s.dir, &["127.0.0.1", "localhost"]);
    let (cert, key, ca) = (
        s.dir.join("server.pem"),
        s.dir.join("server.key"),
        s.dir.join("ca.pem"),
    );
    let mut server = start_serve(
        &s,
        0,
        0,
        &[
            "--http-tls-cert",
            cert.to_str().unwrap(),
            "--http-tls-key",
            key.to_str().unwrap(),
            "--allow-shell-scenarios",
        ],
    );
    let api = server.api.clone();
    assert!(api.starts_with("https://"), "{api}");
    let shell_file = s.write("shell.yaml", shell);
    let out = remote(&s, &api, &["submit"])
        .arg(&shell_file)
        .arg("--ca")
        .arg(&ca)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().len() > 8,
        "{}",
        show(&out)
    );
    // Without the CA the client does not trust the server, and says so.
    let out = remote(&s, &api, &["status", "--retry-for-s", "1"])
        .arg(String::from_utf8_lossy(&out.stdout).trim())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        show(&out).to_lowercase().contains("certificate"),
        "{}",
        show(&out)
    );
    // A plaintext request gets no HTTP answer.
    let (code, _, _) = http(
        &api.replace("https://", "http://"),
        "GET",
        "/healthz",
        None,
        &[],
        "",
    );
    assert_eq!(code, 0);
    server.proc.stop();
    s.assert_clean(&[]);
}

/// A hostile or broken agent cannot stall the controller nor blow up its
/// metrics: while a real agent runs a pgbench cell, a fake agent (a gRPC
/// client speaking the session protocol) of another class floods its own
/// cell with live seconds claiming 10^12 transactions and pg_stat samples
/// naming 100,000 distinct wait events. The real agent is never declared
/// lost (lease 3 s), both cells end, and /metrics stays bounded.
#[test]
fn a_flooding_agent_neither_stalls_the_controller_nor_bloats_its_metrics() {
    use pgfleet_proto::v1::agent_message::Msg;
    use pgfleet_proto::v1::agent_session_client::AgentSessionClient;
    use pgfleet_proto::v1::controller_message::Msg as CMsg;
    use pgfleet_proto::v1::{
        AgentMessage, CellResult, CellSample, CellStatus, Heartbeat, Register,
    };

    let s = Scratch::new("serve-flood");
    let token = tokens(&s);
    let mut server = start_serve(
        &s,
        0,
        0,
        &["--registration-timeout-s", "30", "--lease-s", "3"],
    );
    let api = server.api.clone();
    let mut agent = start_agent(&s, "a-1", "local", server.grpc);
    let sc =
        std::fs::read_to_string(scenario(&s, "f.yaml", "flood", &["local", "flood"], 6)).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc = server.grpc;
    let flooder = rt.spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = AgentSessionClient::new(channel)
            .max_encoding_message_size(pgfleet_proto::MAX_MESSAGE_BYTES);
        let (tx, rx) = tokio::sync::mpsc::channel::<AgentMessage>(64);
        let m = |msg| AgentMessage { msg: Some(msg) };
        tx.send(m(Msg::Register(Register {
            agent_id: "flood-1".into(),
            instance_class: "flood".into(),
            postgres_version: "15.18".into(),
            cores: 2,
            ..Default::default()
        })))
        .await
        .unwrap();
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        req.metadata_mut().insert(
            "authorization",
            "Bearer join-token-0123456789abcdef".parse().unwrap(),
        );
        let mut inbound = client.session(req).await.unwrap().into_inner();
        let waits: serde_json::Map<String, serde_json::Value> = (0..100_000)
            .map(|i| (format!("Flood:event{i}"), serde_json::json!(1)))
            .collect();
        let pg_stat = serde_json::json!({"t": 1, "waits": waits,
            "database": {"xact_commit": 1e300, "blks_read": -5}})
        .to_string();
        let live = serde_json::json!({"second": 1, "transactions": 1_000_000_000_000u64,
            "failures": {"serialization": 1_000_000_000_000u64}, "latency_sum_us": 1,
            "latency_max_us": 1, "buckets_per_octave": 4,
            "buckets": (0..100_000).map(|i| [i, 1_000_000_000_000u64]).collect::<Vec<_>>()})
        .to_string();
        let mut heartbeat = tokio::time::interval(Duration::from_millis(500));
        let (mut seq, mut sent) = (0u64, 0u32);
        let mut cell = None;
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(c)) => match c.msg {
                        Some(CMsg::Assign(a)) => cell = Some(a.cell_id),
                        Some(CMsg::ResultAck(_)) | Some(CMsg::Shutdown(_)) => return sent,
                        _ => {}
                    },
                    _ => return sent,
                },
                _ = heartbeat.tick() => {
                    seq += 1;
                    let _ = tx.send(m(Msg::Heartbeat(Heartbeat { seq }))).await;
                    let Some(id) = cell.clone() else { continue };
                    if sent == 8 {
                        let _ = tx.send(m(Msg::Result(CellResult {
                            cell_id: id,
                            status: CellStatus::Succeeded as i32,
                            ..Default::default()
                        }))).await;
                        sent += 1;
                        continue;
                    }
                    if sent > 8 { continue; }
                    for (kind, data) in [("pg_stat", &pg_stat), ("live", &live)] {
                        let _ = tx.send(m(Msg::Sample(CellSample {
                            cell_id: id.clone(), kind: kind.into(), data_json: data.clone(),
                            seq: (sent * 2 + if kind == "live" { 2 } else { 1 }) as u64,
                        }))).await;
                    }
                    sent += 1;
                }
            }
        }
    });

    let (code, _, body) = http(&api, "POST", "/v1/runs", Some(&token), &[], &sc);
    assert_eq!(code, 202, "{body}");
    let id = json(&body)["id"].as_str().unwrap().to_string();
    let mut run = serde_json::Value::Null;
    wait_for("the run's end", Duration::from_secs(180), || {
        let (_, _, b) = http(
            &api,
            "GET",
            &format!("/v1/runs/{id}"),
            Some(&token),
            &[],
            "",
        );
        run = json(&b);
        matches!(
            run["status"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    });
    // The fake agent stops at its result's acknowledgement or the
    // session's end; a run that ended without either fails here, not hangs.
    let floods = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), flooder).await })
        .unwrap_or_else(|_| {
            panic!(
                "the fake agent was never released: {run}\n{}",
                serve_log(&s)
            )
        })
        .unwrap();
    assert!(floods >= 8, "the fake agent flooded {floods} times");
    // The real agent's cell ran to its end: it was never taken for lost.
    let cells = run["cells"].as_array().unwrap();
    let local = cells
        .iter()
        .find(|c| c["instance_class"] == "local")
        .unwrap();
    assert_eq!(local["state"], "succeeded", "{run}\n{}", serve_log(&s));
    assert!(
        !agent_log(&s, "a-1").contains("session lost"),
        "{}",
        agent_log(&s, "a-1")
    );

    let (code, _, metrics) = http(&api, "GET", "/metrics", None, &[], "");
    assert_eq!(code, 200);
    let series = |name: &str, class: &str| -> Vec<&str> {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(&format!("instance_class=\"{class}\"")))
            .collect()
    };
    let waits = series("pgfleet_postgres_wait_event_backends{", "flood");
    println!(
        "/metrics: {} lines, {} bytes; the flooding class's wait-event series: {}",
        metrics.lines().count(),
        metrics.len(),
        waits.len()
    );
    assert!(
        waits.len() <= pgfleet_controller::metrics::MAX_LABEL_VALUES + 2,
        "{} wait-event series",
        waits.len()
    );
    assert!(waits.iter().any(|l| l.contains("wait_event=\"other\"")));
    let value = |l: &str| -> f64 { l.rsplit(' ').next().unwrap().parse().unwrap() };
    let tx: f64 = series("pgfleet_transactions_total{", "flood")
        .iter()
        .map(|l| value(l))
        .sum();
    assert!(tx <= 8.0 * 1e9 * 2.0, "transactions counted {tx}");
    assert!(
        metrics.len() < 4 << 20,
        "/metrics is {} bytes",
        metrics.len()
    );
    server.proc.stop();
    agent.stop();
    s.assert_clean(&[]);
}

/// The client-only `pgfleet` (cargo feature `server` off: no Kubernetes
/// source, no server; `make test-all` builds it into target/client) is
/// what CI pipelines run: it submits to a real serve, follows the run to
/// its end, downloads the report and exits with the run's code; what it
/// lacks says so with the usage code.
#[test]
fn the_client_only_build_submits_follows_and_downloads_the_report() {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("target/client/pgfleet");
    assert!(
        bin.exists(),
        "{} missing: `make test-all` builds it (cargo build -p pgfleet-controller --no-default-features --bins, copied there)",
        bin.display()
    );
    let s = Scratch::new("serve-client");
    tokens(&s);
    let server = start_serve(&s, 0, 0, &[]);
    let _agent = start_agent(&s, "c-1", "c", server.grpc);
    let sc = scenario(&s, "c.yaml", "client-only", &["c"], 2);
    let out = Command::new(&bin)
        .arg("submit")
        .arg(&sc)
        .args(["--server", &server.api])
        .arg("--token-file")
        .arg(s.dir.join("api.token"))
        .arg("--wait")
        .arg("--out")
        .arg(s.out())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.out().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["status"], "succeeded");
    assert!(s.out().join("report.html").exists());
    // Validating needs no server either.
    let ok = Command::new(&bin)
        .arg("validate")
        .arg(&sc)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", show(&ok));
    for args in [
        &["serve", "--api-token-file", "x"][..],
        &["crd"],
        &["validate", "--kubernetes", sc.to_str().unwrap()],
    ] {
        let out = Command::new(&bin).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", show(&out));
        assert!(
            show(&out).contains("client-only"),
            "{args:?}: {}",
            show(&out)
        );
    }
}

/// Queue admission is atomic: 200 submissions at once against
/// `--max-queued-runs 100` queue at most 100 (plus the one that started,
/// waiting for agents), and every run stored was answered 202, every 202
/// names a stored run.
#[test]
fn concurrent_submissions_never_queue_past_the_bound() {
    let s = Scratch::new("serve-admission");
    let token = tokens(&s);
    let mut server = start_serve(
        &s,
        0,
        0,
        &[
            "--max-queued-runs",
            "100",
            "--registration-timeout-s",
            "600",
        ],
    );
    let api = server.api.clone();
    let sc = std::fs::read_to_string(scenario(&s, "q.yaml", "queued", &["local"], 1)).unwrap();
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..200)
            .map(|_| {
                scope.spawn(|| {
                    let (code, _, body) = http(&api, "POST", "/v1/runs", Some(&token), &[], &sc);
                    (code, body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let accepted: std::collections::BTreeSet<String> = answers
        .iter()
        .filter(|(c, _)| *c == 202)
        .map(|(_, b)| json(b)["id"].as_str().unwrap().to_string())
        .collect();
    let refused = answers.iter().filter(|(c, _)| *c == 429).count();
    assert_eq!(accepted.len() + refused, 200, "{answers:?}");
    let (code, _, body) = http(&api, "GET", "/v1/runs", Some(&token), &[], "");
    assert_eq!(code, 200, "{body}");
    let stored: std::collections::BTreeSet<String> = json(&body)
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(stored, accepted, "every stored run was answered 202");
    assert!(
        (100..=101).contains(&accepted.len()),
        "{} accepted: at most 100 wait, one may have started",
        accepted.len()
    );
    for id in &accepted {
        http(
            &api,
            "DELETE",
            &format!("/v1/runs/{id}"),
            Some(&token),
            &[],
            "",
        );
    }
    server.proc.stop();
}

/// The break-in corpus through `serve` (no --allow-shell-scenarios) with a
/// joined agent: every refused file is refused at submission, located
/// (422; an allow_shell one 403); every contained one runs to its end with
/// no marker written and no host file text in its report or the agent's log.
#[test]
fn the_break_in_corpus_fails_safely_under_serve() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("serve-corpus");
    let token = tokens(&s);
    // A read-only token plans: what it sends must not crash the server.
    let reader = "read-only-token-0123456789abcdef";
    std::fs::write(
        s.dir.join("api.token"),
        format!("{token}\nread-only {reader}\n"),
    )
    .unwrap();
    let markers = s.dir.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o777)).unwrap();
    let server = start_serve(&s, 0, 0, &[]);
    let api = server.api.clone();
    let _agent = start_agent(&s, "a-1", "local", server.grpc);
    let files = common::attack_files();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(f)
            .unwrap()
            .replace("MARKER_DIR", markers.to_str().unwrap());
        let (code, _, body) = http(
            &api,
            "POST",
            &format!("/v1/runs?name={name}"),
            Some(&token),
            &[],
            &text,
        );
        if text.contains("# expect: refused") || text.contains("allow_shell: true") {
            assert!(matches!(code, 403 | 422), "{name}: {code} {body}");
            assert!(
                json(&body)["location"]["line"].as_u64().is_some(),
                "{name}: {body}"
            );
            let (code, _, body) = http(
                &api,
                "POST",
                &format!("/v1/plan?name={name}"),
                Some(reader),
                &[],
                &text,
            );
            assert!(matches!(code, 403 | 422), "plan {name}: {code} {body}");
            let (code, _, _) = http(&api, "GET", "/healthz", None, &[], "");
            assert_eq!(code, 200, "serve is alive after {name}");
            continue;
        }
        assert_eq!(code, 202, "{name}: {body}");
        let id = json(&body)["id"].as_str().unwrap().to_string();
        wait_for(&format!("{name} to end"), Duration::from_secs(180), || {
            let (_, _, run) = http(
                &api,
                "GET",
                &format!("/v1/runs/{id}"),
                Some(&token),
                &[],
                "",
            );
            matches!(json(&run)["status"].as_str(), Some("succeeded" | "failed"))
        });
        let (_, _, md) = http(
            &api,
            "GET",
            &format!("/v1/runs/{id}/report.md"),
            Some(&token),
            &[],
            "",
        );
        assert!(
            !md.contains("root:x:0:0"),
            "{name}: host file text in its report"
        );
        let planted: Vec<_> = std::fs::read_dir(&markers)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(planted.is_empty(), "{name} reached the host: {planted:?}");
    }
    assert!(!agent_log(&s, "a-1").contains("root:x:0:0"));
}

/// Two agents started with one id: the second's registration tells the
/// first to stop (refused, naming the other host), so the pool keeps one
/// agent under the id instead of the two replacing each other many times
/// a second.
#[test]
fn a_second_agent_under_a_live_id_stops_the_first_instead_of_flapping() {
    let s = Scratch::new("twin-ids");
    let token = tokens(&s);
    let mut server = start_serve(&s, 0, 0, &[]);
    let api = server.api.clone();
    let mut first = start_agent(&s, "twin", "local", server.grpc);
    wait_for("the first agent to join", Duration::from_secs(30), || {
        let (_, _, body) = http(&api, "GET", "/v1/agents", Some(&token), &[], "");
        json(&body).as_array().is_some_and(|a| a.len() == 1)
    });
    let log = std::fs::File::create(s.dir.join("twin-2.log")).unwrap();
    let second = Command::new(agent_bin())
        .arg("run")
        .args(["--controller", &format!("http://127.0.0.1:{}", server.grpc)])
        .args(["--class", "local", "--agent-id", "twin"])
        .arg("--token-file")
        .arg(s.dir.join("join.token"))
        .arg("--data-root")
        .arg(s.data().join("twin-2"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut second = Proc {
        child: second,
        name: "twin-2".into(),
    };
    // The first exits, refused, within a few seconds; the second stays.
    let start = Instant::now();
    let status = loop {
        if let Some(st) = first.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the first agent did not stop: {}",
            agent_log(&s, "twin")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "{status}");
    let log = agent_log(&s, "twin");
    assert!(log.contains("agent ids must be unique"), "{log}");
    assert!(
        second.child.try_wait().unwrap().is_none(),
        "the second stays"
    );
    let (_, _, body) = http(&api, "GET", "/v1/agents", Some(&token), &[], "");
    assert_eq!(json(&body).as_array().map(Vec::len), Some(1), "{body}");
    // It registered once: no flapping.
    let second_log = std::fs::read_to_string(s.dir.join("twin-2.log")).unwrap_or_default();
    assert_eq!(second_log.matches("registered").count(), 1, "{second_log}");
    second.stop();
    server.proc.stop();
}
