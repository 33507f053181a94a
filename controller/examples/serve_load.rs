//! Benchmark: `pgfleet serve` under 200 agent sessions.
//!
//! Starts a real `pgfleet serve` process (TLS on the agent session, a join
//! token), connects N simulated agents from this process over real gRPC
//! with TLS, submits a run with one cell per agent, and has every agent
//! heartbeat and stream, per second of the measured window, what a pgbench
//! cell streams (a pg_stat sample, the driver's live second with its
//! latency buckets, both numbered; a progress message), then report. While
//! it runs, polls `GET /v1/runs/{id}` and times it, and scrapes `/metrics`
//! every 5 s as Prometheus would. Prints the server's CPU (cores), peak
//! memory, the wait of agent messages between arrival and handling
//! (p50/p99/max, from the server's log), API and scrape latency, the
//! scrape's size, and whether any agent was falsely lost.
//!
//!   cargo build --release --workspace --bins --examples
//!   target/release/examples/serve_load [AGENTS] [SECONDS] [LIVE_SCALE]   (default 200 60 1)
//!
//! LIVE_SCALE multiplies each live second's transactions (678 per agent):
//! 24 makes ~16,000 per agent-second, the seeds' NVMe rate.
//!
//! Every 5 s it also renders the running run's report (`GET
//! /v1/runs/{id}/report.md`: 200 cells and their live samples, read from the
//! store and rendered while the agents stream), and times it.
//!
//! `SERVE_LOAD_STORE_WRITE_IOPS=N` (root): the store on a slow disk, a loop
//! device with ext4 whose writes `serve`'s block-I/O cgroup holds to N per
//! second (cgroup v1 throttles the writes fsync submits, i.e. every
//! commit's; this kernel has no device-mapper for dm-delay). Removed after.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgfleet_proto::v1::agent_message::Msg;
use pgfleet_proto::v1::agent_session_client::AgentSessionClient;
use pgfleet_proto::v1::controller_message::Msg as CMsg;
use pgfleet_proto::v1::{
    AgentMessage, CellProgress, CellResult, CellSample, CellStatus, Heartbeat, Register,
};
use tokio_stream::wrappers::ReceiverStream;

fn pem_files(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
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
    std::fs::write(dir.join("api.token"), "bench-api-token-0123456789").unwrap();
    std::fs::write(dir.join("join.token"), "bench-join-token-0123456789").unwrap();
}

/// A pg_stat-like sample, about the size the real sampler sends.
fn sample_json(i: u64) -> String {
    let mut m = serde_json::Map::new();
    for k in [
        "xact_commit",
        "xact_rollback",
        "blks_read",
        "blks_hit",
        "tup_returned",
        "tup_fetched",
        "tup_inserted",
        "tup_updated",
        "tup_deleted",
        "blk_read_time",
        "blk_write_time",
        "wal_records",
        "wal_fpi",
        "wal_bytes",
        "wal_write",
        "wal_sync",
        "wal_write_time",
        "wal_sync_time",
        "checkpoints_timed",
        "checkpoints_req",
        "buffers_checkpoint",
        "buffers_backend",
        "buffers_alloc",
    ] {
        m.insert(k.into(), serde_json::json!(i * 1000 + k.len() as u64));
    }
    m.insert("t".into(), serde_json::json!(i));
    m.insert(
        "waits".into(),
        serde_json::json!({"IO:DataFileRead": 3, "LWLock:WALWrite": 1, "Client:ClientRead": 4}),
    );
    serde_json::Value::Object(m).to_string()
}

/// A driver's live second as the pgbench workload sends it: 678 x `scale`
/// transactions spread over a dozen log buckets (0.25 .. 8 ms), a failure.
fn live_json(t: u64, scale: u64) -> String {
    let buckets: Vec<[u64; 2]> = (0..12u64)
        .map(|k| [32 + k * 2, (40 + 3 * k) * scale])
        .collect();
    let transactions: u64 = buckets.iter().map(|b| b[1]).sum();
    serde_json::json!({
        "second": t,
        "transactions": transactions,
        "failures": {"serialization": 1},
        "latency_sum_us": transactions * 900,
        "latency_max_us": 8_100,
        "buckets_per_octave": 4,
        "buckets": buckets,
    })
    .to_string()
}

async fn agent(
    i: usize,
    url: String,
    ca: Vec<u8>,
    token: String,
    measure: Duration,
    sent: Arc<AtomicU64>,
) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| e.to_string())?
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
        )
        .map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
    let mut client = AgentSessionClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel::<AgentMessage>(64);
    let m = |msg| AgentMessage { msg: Some(msg) };
    tx.send(m(Msg::Register(Register {
        agent_id: format!("sim-{i:03}"),
        instance_class: class_of(i),
        postgres_version: "15.18".into(),
        hostname: "bench".into(),
        cores: 2,
        ..Default::default()
    })))
    .await
    .map_err(|e| e.to_string())?;
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let mut inbound = client
        .session(req)
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut heartbeat = tokio::time::interval(Duration::from_secs(2));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut cell: Option<(String, Instant)> = None;
    let mut seq = 0u64;
    let mut sample_seq = 0u64;
    loop {
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(c)) => match c.msg {
                    Some(CMsg::Registered(r)) => {
                        heartbeat = tokio::time::interval(Duration::from_millis(r.heartbeat_interval_ms as u64));
                    }
                    Some(CMsg::Assign(a)) => {
                        sample_seq = 0;
                        cell = Some((a.cell_id, Instant::now()))
                    }
                    Some(CMsg::Shutdown(_)) => return Ok(()),
                    // The run ended: stay connected, idle, like a static agent.
                    Some(CMsg::ResultAck(_)) => cell = None,
                    _ => {}
                },
                Ok(None) => return Ok(()),
                Err(e) => return Err(e.to_string()),
            },
            _ = heartbeat.tick() => {
                seq += 1;
                let _ = tx.send(m(Msg::Heartbeat(Heartbeat { seq }))).await;
                sent.fetch_add(1, Ordering::Relaxed);
            }
            _ = tick.tick() => {
                let Some((id, since)) = cell.clone() else { continue };
                if since.elapsed() >= measure {
                    let _ = tx.send(m(Msg::Result(CellResult {
                        cell_id: id,
                        status: CellStatus::Succeeded as i32,
                        ..Default::default()
                    }))).await;
                    // Wait for the ack.
                    cell = Some((String::new(), Instant::now() + Duration::from_secs(3600)));
                    continue;
                }
                if id.is_empty() { continue; }
                let t = since.elapsed().as_secs();
                // What a pgbench cell streams each second: the sampler's
                // pg_stat figures and the driver's live second, numbered for
                // replay, and its progress.
                sample_seq += 1;
                let _ = tx.send(m(Msg::Sample(CellSample { cell_id: id.clone(), kind: "pg_stat".into(), data_json: sample_json(t), seq: sample_seq }))).await;
                sample_seq += 1;
                let _ = tx.send(m(Msg::Sample(CellSample { cell_id: id.clone(), kind: "live".into(), data_json: live_json(t, live_scale()), seq: sample_seq }))).await;
                let _ = tx.send(m(Msg::Progress(CellProgress { cell_id: id, phase: "measure".into(), done: t, total: measure.as_secs(), message: format!("{t} s") }))).await;
                sent.fetch_add(3, Ordering::Relaxed);
            }
        }
    }
}

/// A class holds at most 64 agents (the scenario's limit): 50 each.
const PER_CLASS: usize = 50;

fn class_of(i: usize) -> String {
    format!("sim{}", i / PER_CLASS)
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of stat (12 and 13 after the name).
    f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

fn get(addr: &str, path: &str, token: &str) -> (u16, String) {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut s = String::new();
    let _ = c.read_to_string(&mut s);
    let code = s
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    (code, s)
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// The third argument: live transactions per agent-second as a multiple of
/// 678 (24: ~16,000, the seeds' NVMe rate).
fn live_scale() -> u64 {
    std::env::args()
        .nth(3)
        .and_then(|x| x.parse().ok())
        .unwrap_or(1)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|x| x.parse().ok()).unwrap_or(200);
    let secs: u64 = args.get(2).and_then(|x| x.parse().ok()).unwrap_or(60);
    let dir = std::env::temp_dir().join(format!("pgfleet-serve-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    pem_files(&dir);
    let slow = std::env::var("SERVE_LOAD_STORE_WRITE_IOPS")
        .ok()
        .and_then(|x| x.parse::<u64>().ok())
        .map(|iops| SlowDisk::new(&dir, iops));
    let mut serve = Serve::start(&dir, slow.as_ref());
    let token = "bench-api-token-0123456789".to_string();

    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let mut agents = Vec::new();
    for i in 0..n {
        agents.push(tokio::spawn(agent(
            i,
            format!("https://{}", serve.grpc),
            ca.clone(),
            "bench-join-token-0123456789".into(),
            Duration::from_secs(secs),
            sent.clone(),
        )));
    }
    // Submit over the API (the simulated agents join meanwhile).
    let run = submit(&serve.api, &token, &load_scenario(n, secs));
    eprintln!("run {run}: {n} simulated agents, {secs} s each");
    wait_all_running(&serve.api, &token, &run, n).await;
    let w = measure_window(&serve, &token, &run, secs, &sent).await;

    // The run ends; the server logs the message waits.
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(line) = serve.log.recv_timeout(Duration::from_millis(500)) {
            let done = line.contains(&format!("run {run} "));
            log.push(line);
            if done {
                break;
            }
        }
    }
    let _ = serve.child.kill();
    let _ = serve.child.wait();
    for a in agents {
        a.abort();
    }
    print_figures(n, w, &log, &run, slow.as_ref());
    drop(slow);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `pgfleet serve` under test (next to this example's directory), its
/// log's lines as they come, and where it listens.
struct Serve {
    child: std::process::Child,
    log: std::sync::mpsc::Receiver<String>,
    api: String,
    grpc: String,
}

impl Serve {
    fn start(dir: &Path, slow: Option<&SlowDisk>) -> Serve {
        let bin: PathBuf = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("pgfleet");
        let store_dir = slow.map_or(dir.to_path_buf(), |s| s.mount.clone());
        // In the slow disk's cgroup from its first write on.
        let mut launcher = match slow {
            Some(s) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!(
                        "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                        s.cgroup.display()
                    ))
                    .arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let mut child = launcher
            .arg("--store")
            .arg(store_dir.join("store.db"))
            .args(["serve", "--bind", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .arg("--api-token-file")
            .arg(dir.join("api.token"))
            .arg("--join-token-file")
            .arg(dir.join("join.token"))
            .arg("--tls-cert")
            .arg(dir.join("server.pem"))
            .arg("--tls-key")
            .arg(dir.join("server.key"))
            .args(["--lease-s", "10", "--registration-timeout-s", "120"])
            .env("PGFLEET_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pgfleet serve (build it: cargo build --release --workspace --bins)");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let after = |marker: &str, end: char| {
            first
                .split(marker)
                .nth(1)
                .unwrap()
                .split(end)
                .next()
                .unwrap()
                .to_string()
        };
        Serve {
            api: after("API on http://", ','),
            grpc: after("gRPC on ", ')'),
            child,
            log: rx,
        }
    }
}

/// One cell per agent: `replicas` cells per class, on the classes that
/// have that many agents (a last, smaller class gets its own entry).
fn load_scenario(n: usize, secs: u64) -> String {
    let mut scenario = "name: serve-load\nfleet:\n".to_string();
    for c in 0..n.div_ceil(PER_CLASS) {
        let count = (n - c * PER_CLASS).min(PER_CLASS);
        scenario.push_str(&format!("  - name: sim{c}\n    count: {count}\n"));
    }
    let full = n / PER_CLASS;
    scenario.push_str("workloads:\n");
    if full > 0 {
        let on: Vec<String> = (0..full).map(|c| format!("sim{c}")).collect();
        scenario.push_str(&format!(
            "  - kind: pgbench\n    scale: 1\n    duration_s: {secs}\n    replicas: {PER_CLASS}\n    on: [{}]\n",
            on.join(", ")
        ));
    }
    if !n.is_multiple_of(PER_CLASS) {
        scenario.push_str(&format!(
            "  - kind: pgbench\n    scale: 1\n    duration_s: {secs}\n    replicas: {}\n    on: [sim{full}]\n",
            n % PER_CLASS
        ));
    }
    scenario
}

/// POST /v1/runs; returns the run's id.
fn submit(api: &str, token: &str, body: &str) -> String {
    let mut c = std::net::TcpStream::connect(api).unwrap();
    write!(
        c,
        "POST /v1/runs HTTP/1.1\r\nhost: {api}\r\nauthorization: Bearer {token}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer
        .split("\"id\":\"")
        .nth(1)
        .and_then(|x| x.split('"').next())
        .unwrap_or_else(|| panic!("submit failed: {answer}"))
        .to_string()
}

/// Waits (up to 2 minutes) until the run's `n` cells all run.
async fn wait_all_running(api: &str, token: &str, run: &str, n: usize) {
    let (api, token, run) = (api.to_string(), token.to_string(), run.to_string());
    let all_running = move || {
        let (_, body) = get(&api, &format!("/v1/runs/{run}"), &token);
        body.split("\"running\":")
            .nth(1)
            .and_then(|x| x.split(',').next())
            .and_then(|x| x.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let start = Instant::now();
    while tokio::task::spawn_blocking(all_running.clone())
        .await
        .unwrap()
        < n
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "cells did not all start"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the measured window showed.
struct Window {
    seconds: f64,
    cores: f64,
    messages: u64,
    rss_mb: f64,
    api_ms: Vec<f64>,
    scrape_ms: Vec<f64>,
    scrape_bytes: usize,
    report_ms: Vec<f64>,
    report_bytes: usize,
}

/// The window while every agent streams: the run's status polled every
/// 250 ms, /metrics scraped and the running run's report rendered every
/// 5 s, serve's CPU and peak memory.
async fn measure_window(
    serve: &Serve,
    token: &str,
    run: &str,
    secs: u64,
    sent: &AtomicU64,
) -> Window {
    let pid = serve.child.id();
    let api = &serve.api;
    let ticks0 = cpu_ticks(pid);
    let t0 = Instant::now();
    let sent0 = sent.load(Ordering::Relaxed);
    let mut api_ms = Vec::new();
    let mut scrape_ms = Vec::new();
    let mut scrape_bytes = 0usize;
    let mut report_ms = Vec::new();
    let mut report_bytes = 0usize;
    let mut last_scrape = Instant::now() - Duration::from_secs(60);
    while t0.elapsed() < Duration::from_secs(secs.saturating_sub(5)) {
        // Prometheus' view: a scrape of /metrics every 5 s.
        if last_scrape.elapsed() >= Duration::from_secs(5) {
            last_scrape = Instant::now();
            let a = api.clone();
            let (code, body) = tokio::task::spawn_blocking(move || get(&a, "/metrics", ""))
                .await
                .unwrap();
            assert_eq!(code, 200);
            scrape_ms.push(last_scrape.elapsed().as_secs_f64() * 1000.0);
            scrape_bytes = body.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
            // A large run's report, rendered from the store meanwhile.
            let (a, r, tk) = (api.clone(), run.to_string(), token.to_string());
            let q = Instant::now();
            let (code, body) = tokio::task::spawn_blocking(move || {
                get(&a, &format!("/v1/runs/{r}/report.md"), &tk)
            })
            .await
            .unwrap();
            assert_eq!(code, 200, "{body}");
            report_ms.push(q.elapsed().as_secs_f64() * 1000.0);
            report_bytes = body.len();
        }
        let (a, r, tk) = (api.clone(), run.to_string(), token.to_string());
        let q = Instant::now();
        let (code, _) = tokio::task::spawn_blocking(move || get(&a, &format!("/v1/runs/{r}"), &tk))
            .await
            .unwrap();
        assert_eq!(code, 200);
        api_ms.push(q.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let hz = 100.0; // USER_HZ
    Window {
        seconds,
        cores: (cpu_ticks(pid) - ticks0) as f64 / hz / seconds,
        messages: sent.load(Ordering::Relaxed) - sent0,
        rss_mb: status_kb(pid, "VmHWM:") as f64 / 1024.0,
        api_ms,
        scrape_ms,
        scrape_bytes,
        report_ms,
        report_bytes,
    }
}

fn print_figures(n: usize, mut w: Window, log: &[String], run: &str, slow: Option<&SlowDisk>) {
    let waits = log
        .iter()
        .find(|l| l.contains("agent messages: wait"))
        .cloned()
        .unwrap_or_default();
    let lost = log.iter().filter(|l| l.contains(" lost")).count();
    let status = log
        .iter()
        .find(|l| l.contains(&format!("run {run} ")))
        .cloned()
        .unwrap_or_default();
    let (window, messages) = (w.seconds, w.messages);
    println!("agents:            {n}");
    println!(
        "window:            {window:.0} s, {messages} agent messages ({:.0}/s)",
        messages as f64 / window
    );
    println!("serve CPU:         {:.3} cores", w.cores);
    println!("serve peak RSS:    {:.0} MiB", w.rss_mb);
    println!(
        "message waits:     {}",
        waits.split("messages=").nth(1).unwrap_or("(not logged)")
    );
    println!(
        "API GET /v1/runs/{{id}}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} requests)",
        quantile(&mut w.api_ms, 0.5),
        quantile(&mut w.api_ms, 0.99),
        quantile(&mut w.api_ms, 1.0),
        w.api_ms.len()
    );
    println!(
        "GET /metrics:      p50 {:.1} ms, max {:.1} ms ({} scrapes), {:.0} KiB",
        quantile(&mut w.scrape_ms, 0.5),
        quantile(&mut w.scrape_ms, 1.0),
        w.scrape_ms.len(),
        w.scrape_bytes as f64 / 1024.0
    );
    println!(
        "GET report.md:     p50 {:.0} ms, max {:.0} ms ({} renders of the running run), {:.0} KiB",
        quantile(&mut w.report_ms, 0.5),
        quantile(&mut w.report_ms, 1.0),
        w.report_ms.len(),
        w.report_bytes as f64 / 1024.0
    );
    if let Some(s) = slow {
        println!(
            "store disk:        a loop device held to {} write IOPS (block-I/O cgroup)",
            s.iops
        );
    }
    println!("agents lost:       {lost}");
    println!("run:               {status}");
}

/// The store's slow disk: a loop device with ext4 mounted under the
/// benchmark's directory, and a block-I/O cgroup holding writes to it to
/// `iops` a second. Unmounted, detached and removed when dropped.
struct SlowDisk {
    iops: u64,
    device: String,
    mount: PathBuf,
    cgroup: PathBuf,
}

impl SlowDisk {
    fn new(dir: &Path, iops: u64) -> SlowDisk {
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("run a setup command");
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let image = dir.join("store.img");
        run(Command::new("truncate").arg("-s").arg("1G").arg(&image));
        let device = run(Command::new("losetup").args(["-f", "--show"]).arg(&image));
        run(Command::new("mkfs.ext4")
            .args(["-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&device));
        let mount = dir.join("store");
        std::fs::create_dir_all(&mount).unwrap();
        run(Command::new("mount").arg(&device).arg(&mount));
        let majmin = run(Command::new("lsblk").args(["-dno", "MAJ:MIN"]).arg(&device));
        let cgroup = PathBuf::from(format!(
            "/sys/fs/cgroup/blkio/pgfleet-serve-load-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&cgroup).unwrap();
        std::fs::write(
            cgroup.join("blkio.throttle.write_iops_device"),
            format!("{} {iops}", majmin.replace(' ', "")),
        )
        .unwrap();
        SlowDisk {
            iops,
            device,
            mount,
            cgroup,
        }
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}
