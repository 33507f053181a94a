//! Benchmarks: pgfleet's driver against pgbench (same server, same script,
//! same clients and threads, alternating rounds), and pgfleet's loader
//! against `pgbench -i` and `pgbench -i -I dtGvp` at the same scale.
//! Prints markdown tables of medians and ratios.
//!
//!   cargo run --release -p pgfleet-agent --example driver_vs_pgbench -- [SECONDS] [ROUNDS] [SCALE] [all|loader|driver]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::driver::script::{Script, Value};
use pgfleet_agent::driver::{self, DriverConfig};
use pgfleet_agent::pgbin::PgBin;
use pgfleet_agent::workload::pgbench_init::{self, InitParams};
use pgfleet_agent::workload::{CellContext, median};
use tokio_util::sync::CancellationToken;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let secs: u64 = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let rounds: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let scale: u64 = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(10);
    let only = a.get(4).cloned().unwrap_or_else(|| "all".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(secs, rounds, scale, &only))
}

async fn run(secs: u64, rounds: usize, scale: u64, only: &str) -> anyhow::Result<()> {
    let (cluster, root) = common::cluster(&[
        ("shared_buffers", "256MB"),
        ("max_wal_size", "4GB"),
        ("max_connections", "50"),
    ])
    .await?;
    let pg = cluster.pg.clone();
    let result = bench(&cluster, &pg, secs, rounds, scale, only).await;
    cluster.teardown().await?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// Runs pgbench on `conninfo`.
async fn pgbench(pg: &PgBin, conninfo: &str, args: &[String]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(pg.tool("pgbench"))
        .args(args)
        .arg(conninfo)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "pgbench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// A file removed when it goes out of scope, on every path (a failed
/// round included).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn grab(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

async fn bench(
    cluster: &Cluster,
    pg: &PgBin,
    secs: u64,
    rounds: usize,
    scale: u64,
    only: &str,
) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let ctx = CellContext::new("bench", cluster, tx, CancellationToken::new());
    let init = InitParams {
        scale,
        fillfactor: 100,
        partitions: 0,
        load_connections: 0,
        load_method: pgbench_init::LoadMethod::Copy,
    };
    if only != "driver" {
        loader(&ctx, cluster, pg, &init, rounds).await?;
    }
    if only == "loader" {
        return Ok(());
    }
    // Both drivers run as the workload role on the tables handed to it,
    // as a cell's do.
    pgbench_init::load(&ctx, &init).await?;
    cluster.hand_over().await?;
    driver_rounds(cluster, pg, secs, rounds, scale).await
}

/// pgfleet's loader in its modes against `pgbench -i`'s, alternating,
/// `rounds` times: the medians as a Markdown table.
async fn loader(
    ctx: &CellContext<'_>,
    cluster: &Cluster,
    pg: &PgBin,
    init: &InitParams,
    rounds: usize,
) -> anyhow::Result<()> {
    let scale = init.scale;
    println!("## Loader: pgfleet pgbench-init vs pgbench -i, scale {scale}, {rounds} rounds\n");
    let scale_s = scale.to_string();
    let pgbench_runs: [(&str, Vec<&str>); 3] = [
        ("pgbench -i", vec!["-i", "-q", "-s", &scale_s]),
        (
            "pgbench -i -I dtGvp",
            vec!["-i", "-q", "-I", "dtGvp", "-s", &scale_s],
        ),
        (
            "pgbench -i --partitions 2",
            vec!["-i", "-q", "--partitions", "2", "-s", &scale_s],
        ),
    ];
    let ours_runs = [
        ("pgfleet, default (load_connections: 0)", 0, 0),
        ("pgfleet, 2 connections", 2, 0),
        ("pgfleet, 1 connection (COPY FREEZE)", 1, 0),
        ("pgfleet, 2 partitions (COPY FREEZE each)", 2, 2),
        ("pgfleet, 2 partitions, 1 connection", 1, 2),
    ];
    let verbose = std::env::var_os("VERBOSE").is_some();
    // The superuser's sessions search pg_catalog only (the agent's own
    // statements name their schemas); pgbench -i's do not: `public`, as
    // the loader's tables are.
    let superuser = format!("{} options='-c search_path=public'", cluster.conninfo());
    // One untimed load first: the first load of a fresh cluster also
    // creates its WAL segments (later ones recycle them), which made
    // whichever loader ran first look up to 1.6x slower.
    pgbench_init::load(ctx, init).await?;
    let mut ours = vec![vec![]; ours_runs.len()];
    let mut theirs = vec![vec![]; pgbench_runs.len()];
    for _ in 0..rounds {
        for (i, (_, conns, partitions)) in ours_runs.iter().enumerate() {
            let p = InitParams {
                load_connections: *conns,
                partitions: *partitions,
                ..init.clone()
            };
            let t = Instant::now();
            let l = pgbench_init::load(ctx, &p).await?;
            ours[i].push(t.elapsed().as_secs_f64());
            if verbose {
                eprintln!("{}: {:?}", ours_runs[i].0, l.steps);
            }
        }
        for (i, (_, args)) in pgbench_runs.iter().enumerate() {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let t = Instant::now();
            let out = pgbench(pg, &superuser, &args).await?;
            theirs[i].push(t.elapsed().as_secs_f64());
            if verbose {
                eprintln!(
                    "{}: {}",
                    pgbench_runs[i].0,
                    out.lines().last().unwrap_or_default()
                );
            }
        }
    }
    let best_flat = median(&theirs[0]).min(median(&theirs[1]));
    let part = median(&theirs[2]);
    println!(
        "| loader | seconds (median) | min-max | speed-up vs the faster pgbench mode |\n|---|---|---|---|"
    );
    let row = |name: &str, v: &[f64], base: f64| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), x| (a.min(*x), b.max(*x)));
        println!(
            "| {name} | {:.2} | {lo:.2}-{hi:.2} | {:.2}x |",
            median(v),
            base / median(v)
        );
    };
    for (i, (name, _, partitions)) in ours_runs.iter().enumerate() {
        row(
            name,
            &ours[i],
            if *partitions > 0 { part } else { best_flat },
        );
    }
    for (i, (name, _)) in pgbench_runs.iter().enumerate() {
        row(name, &theirs[i], if i == 2 { part } else { best_flat });
    }
    Ok(())
}

/// pgfleet's driver against `pgbench -M prepared` on the built-in scripts,
/// alternating, `rounds` times: TPS, their ratio per round, client CPU.
async fn driver_rounds(
    cluster: &Cluster,
    pg: &PgBin,
    secs: u64,
    rounds: usize,
    scale: u64,
) -> anyhow::Result<()> {
    println!(
        "\n## Driver: pgfleet vs pgbench -M prepared, 8 clients, 2 threads, {secs} s x {rounds} rounds\n"
    );
    println!(
        "| script | pgfleet tps | pgbench tps | ratio (median of rounds) | ratio min-max | pgfleet CPU µs/txn | pgbench CPU µs/txn |\n|---|---|---|---|---|---|---|"
    );
    for name in ["select-only", "random-update"] {
        let text = driver::builtin(name).unwrap_or_default();
        let file = TempFile(
            std::env::temp_dir().join(format!("pgfleet-bench-{name}-{}.sql", std::process::id())),
        );
        std::fs::write(&file.0, text)?;
        let (mut a, mut b, mut ca, mut cb) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            let cfg = DriverConfig {
                script: Script::parse(name, text)?,
                clients: 8,
                threads: 2,
                duration: Some(Duration::from_secs(secs)),
                transactions: None,
                warmup: Duration::ZERO,
                rate: None,
                latency_limit: None,
                max_tries: 10,
                vars: HashMap::from([
                    ("scale".into(), Value::Int(scale as i64).into()),
                    (
                        "naccounts".into(),
                        Value::Int(scale as i64 * 100_000).into(),
                    ),
                ]),
                shell: None,
                seed: 42,
                stop_when: None,
                live: None,
                reconnect: false,
                ledger: false,
            };
            let c0 = common::cpu_seconds(libc::RUSAGE_SELF);
            let pgc = cluster.workload_server().config;
            let r = tokio::task::spawn_blocking(move || {
                driver::run_blocking(cfg, pgc, CancellationToken::new(), |_, _| {})
            })
            .await?
            .map_err(|e| anyhow::anyhow!(e.0))?;
            ca.push(
                (common::cpu_seconds(libc::RUSAGE_SELF) - c0) / r.transactions.max(1) as f64 * 1e6,
            );
            a.push(r.tps());

            let c0 = common::cpu_seconds(libc::RUSAGE_CHILDREN);
            let out = pgbench(
                pg,
                &cluster.workload_server().conninfo,
                &[
                    "-n".into(),
                    "-M".into(),
                    "prepared".into(),
                    "-c".into(),
                    "8".into(),
                    "-j".into(),
                    "2".into(),
                    "-T".into(),
                    secs.to_string(),
                    "-D".into(),
                    format!("naccounts={}", scale * 100_000),
                    "-D".into(),
                    format!("scale={scale}"),
                    "-f".into(),
                    file.0.display().to_string(),
                ],
            )
            .await?;
            let n = grab(&out, "number of transactions actually processed: ").unwrap_or(1.0);
            cb.push((common::cpu_seconds(libc::RUSAGE_CHILDREN) - c0) / n * 1e6);
            b.push(grab(&out, "tps = ").ok_or_else(|| anyhow::anyhow!("no tps in {out}"))?);
        }
        drop(file);
        // Rounds alternate the two tools, so each round's ratio is a
        // paired comparison under the same machine conditions.
        let ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x / y).collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), r| (l.min(*r), h.max(*r)));
        println!(
            "| {name} | {:.0} | {:.0} | {:.3} | {lo:.3}-{hi:.3} | {:.1} | {:.1} |",
            median(&a),
            median(&b),
            median(&ratios),
            median(&ca),
            median(&cb)
        );
    }
    Ok(())
}
