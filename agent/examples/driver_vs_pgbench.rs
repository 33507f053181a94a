//! Benchmarks: pgfleet's driver against pgbench (same server, same script,
//! same clients and threads, alternating rounds), and pgfleet's loader
//! against `pgbench -i` and `pgbench -i -I dtGvp` at the same scale.
//! Prints markdown tables of medians and ratios.
//!
//!   cargo run --release -p pgfleet-agent --example driver_vs_pgbench -- [SECONDS] [ROUNDS] [SCALE]

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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(secs, rounds, scale))
}

async fn run(secs: u64, rounds: usize, scale: u64) -> anyhow::Result<()> {
    let (cluster, root) = common::cluster(&[
        ("shared_buffers", "256MB"),
        ("max_wal_size", "4GB"),
        ("max_connections", "50"),
    ])
    .await?;
    let pg = cluster.pg.clone();
    let result = bench(&cluster, &pg, secs, rounds, scale).await;
    cluster.teardown().await?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn pgbench(pg: &PgBin, cluster: &Cluster, args: &[String]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(pg.tool("pgbench"))
        .args(args)
        .arg(cluster.conninfo())
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "pgbench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
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
) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let ctx = CellContext {
        cell_id: "bench".into(),
        cluster,
        events: tx,
        cancel: CancellationToken::new(),
    };
    let init = InitParams {
        scale,
        fillfactor: 100,
        partitions: 0,
        load_connections: 0,
    };

    // ---- loader
    println!("## Loader: pgfleet pgbench-init vs pgbench -i, scale {scale}, {rounds} rounds\n");
    let (mut ours, mut client_side, mut server_side) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let t = Instant::now();
        pgbench_init::load(&ctx, &init).await?;
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        pgbench(
            pg,
            cluster,
            &["-i".into(), "-q".into(), "-s".into(), scale.to_string()],
        )
        .await?;
        client_side.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        pgbench(
            pg,
            cluster,
            &[
                "-i".into(),
                "-q".into(),
                "-I".into(),
                "dtGvp".into(),
                "-s".into(),
                scale.to_string(),
            ],
        )
        .await?;
        server_side.push(t.elapsed().as_secs_f64());
    }
    let (o, c, s) = (median(&ours), median(&client_side), median(&server_side));
    println!("| loader | seconds (median) | speed-up of pgfleet |\n|---|---|---|");
    println!(
        "| pgfleet pgbench-init ({} connections) | {o:.2} | 1.00 |",
        pgfleet_agent::host::cores()
    );
    println!("| pgbench -i | {c:.2} | {:.2} |", c / o);
    println!("| pgbench -i -I dtGvp | {s:.2} | {:.2} |", s / o);

    // ---- driver
    pgbench_init::load(&ctx, &init).await?;
    println!(
        "\n## Driver: pgfleet vs pgbench -M prepared, 8 clients, 2 threads, {secs} s x {rounds} rounds\n"
    );
    println!(
        "| script | pgfleet tps | pgbench tps | ratio | pgfleet CPU µs/txn | pgbench CPU µs/txn |\n|---|---|---|---|---|---|"
    );
    for name in ["select-only", "random-update"] {
        let text = driver::builtin(name).unwrap_or_default();
        let file =
            std::env::temp_dir().join(format!("pgfleet-bench-{name}-{}.sql", std::process::id()));
        std::fs::write(&file, text)?;
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
                    ("scale".into(), Value::Int(scale as i64)),
                    ("naccounts".into(), Value::Int(scale as i64 * 100_000)),
                ]),
                seed: 42,
            };
            let c0 = common::cpu_seconds(libc::RUSAGE_SELF);
            let pgc = cluster.pg_config();
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
                cluster,
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
                    file.display().to_string(),
                ],
            )
            .await?;
            let n = grab(&out, "number of transactions actually processed: ").unwrap_or(1.0);
            cb.push((common::cpu_seconds(libc::RUSAGE_CHILDREN) - c0) / n * 1e6);
            b.push(grab(&out, "tps = ").ok_or_else(|| anyhow::anyhow!("no tps in {out}"))?);
        }
        let _ = std::fs::remove_file(&file);
        let (x, y) = (median(&a), median(&b));
        println!(
            "| {name} | {x:.0} | {y:.0} | {:.3} | {:.1} | {:.1} |",
            x / y,
            median(&ca),
            median(&cb)
        );
    }
    Ok(())
}
