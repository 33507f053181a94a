//! Benchmark: the `compression-analysis` workload against a plain baseline
//! on the same cluster, and its sampling error.
//!
//! 1. pgbench's tables at SCALE (the agent's loader).
//! 2. Per algorithm, ROUNDS times, alternating: the workload analysing every
//!    page of pgbench_accounts (`get_raw_page` in batches of 256 through the
//!    server, compression on a blocking thread), then the baseline: the
//!    table's file read with `pg_read_binary_file` in 1 MiB chunks (no
//!    buffer manager, sequential) and each 8 KiB page compressed with the
//!    same library, on this thread. Pages per second (wall) of each, median
//!    over rounds, and their ratio.
//! 3. One run at 1 %, 10 % and 100 %: each sample's error against 100 %.
//!
//!   cargo run --release -p pgfleet-agent --example compression_vs_baseline -- [SCALE] [ROUNDS]

mod common;

use std::time::Instant;

use pgfleet_agent::workload::compression_analysis::PageCompressor;
use pgfleet_agent::workload::{self, CellContext, median};
use pgfleet_proto::workload::compression_analysis::{Metrics, PointParams};
use pgfleet_proto::workload::plan_entry;
use tokio_util::sync::CancellationToken;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let scale: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(scale, rounds))
}

async fn run(scale: u64, rounds: usize) -> anyhow::Result<()> {
    let (cluster, root) = common::cluster(&[("shared_buffers", "256MB")]).await?;
    let result = bench(&cluster, scale, rounds).await;
    cluster.teardown().await?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn run_kind(
    cluster: &pgfleet_agent::cluster::Cluster,
    entry: &str,
) -> anyhow::Result<workload::Output> {
    let params = plan_entry(entry).map_err(anyhow::Error::msg)?.remove(0).1;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let mut ctx = CellContext::new("bench", cluster, tx, CancellationToken::new());
    Ok(workload::run(&mut ctx, &params).await?)
}

fn points(out: &workload::Output) -> Vec<(PointParams, Metrics)> {
    out.points
        .iter()
        .map(|p| {
            (
                serde_json::from_str(&p.params_json).unwrap(),
                serde_json::from_str(&p.metrics_json).unwrap(),
            )
        })
        .collect()
}

/// The baseline: the file in 1 MiB chunks, every page compressed here.
async fn baseline(client: &tokio_postgres::Client, alg: &str) -> anyhow::Result<u64> {
    let path: String = client
        .query_one("SELECT pg_relation_filepath('pgbench_accounts')", &[])
        .await?
        .get(0);
    let size: i64 = client
        .query_one("SELECT pg_relation_size('pgbench_accounts')", &[])
        .await?
        .get(0);
    // Segments of 1 GiB: `path`, `path.1`, ...
    let (seg, chunk) = (1i64 << 30, 1i64 << 20);
    let mut c = PageCompressor::new(22)?;
    let mut pages = 0;
    let mut off = 0;
    while off < size {
        let (n, within) = (off / seg, off % seg);
        let file = if n == 0 {
            path.clone()
        } else {
            format!("{path}.{n}")
        };
        let len = chunk.min(size - off);
        let bytes: Vec<u8> = client
            .query_one(
                "SELECT pg_read_binary_file($1, $2, $3)",
                &[&file, &within, &len],
            )
            .await?
            .get(0);
        for page in bytes.chunks(8192) {
            c.size(alg, page)?;
            pages += 1;
        }
        off += len;
    }
    Ok(pages)
}

async fn bench(
    cluster: &pgfleet_agent::cluster::Cluster,
    scale: u64,
    rounds: usize,
) -> anyhow::Result<()> {
    let t = Instant::now();
    run_kind(cluster, &format!("{{kind: pgbench-init, scale: {scale}}}")).await?;
    eprintln!("loaded scale {scale} in {:.1} s", t.elapsed().as_secs_f64());
    let client = cluster.connect().await?;
    let pages: i64 = client
        .query_one("SELECT pg_relation_size('pgbench_accounts') / 8192", &[])
        .await?
        .get(0);
    println!(
        "pgbench_accounts at scale {scale}: {pages} pages ({} MiB); {rounds} rounds, medians\n",
        (pages * 8192) >> 20
    );
    println!(
        "| algorithm | workload pages/s | baseline pages/s | workload / baseline | workload CPU µs/page |\n|---|---|---|---|---|"
    );
    for alg in ["zstd", "lz4", "pglz"] {
        let (mut ours, mut base, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            let out = run_kind(
                cluster,
                &format!(
                    "{{kind: compression-analysis, dataset: sql, setup_sql: \"SELECT 1\", relations: [pgbench_accounts], \
                      sample_fractions: [1], algorithms: [{alg}], zstd_level: 22}}"
                ),
            )
            .await?;
            let s = t.elapsed().as_secs_f64();
            let (_, m) = &points(&out)[0];
            ours.push(m.pages_analysed as f64 / s);
            cpu.push(m.cpu_us_per_page);
            let t = Instant::now();
            let n = baseline(&client, alg).await?;
            base.push(n as f64 / t.elapsed().as_secs_f64());
        }
        let (o, b) = (median(&ours), median(&base));
        println!(
            "| {alg} | {o:.0} | {b:.0} | {:.2} | {:.1} |",
            o / b,
            median(&cpu)
        );
    }
    let out = run_kind(
        cluster,
        "{kind: compression-analysis, dataset: sql, setup_sql: \"SELECT 1\", relations: [pgbench_accounts], \
          sample_fractions: [0.01, 0.1, 1], zstd_level: 22}",
    )
    .await?;
    let pts = points(&out);
    println!("\nSampling error against the full analysis (pgbench_accounts):\n");
    println!(
        "| algorithm | sample | pages | avg bytes | avg size error % | over 2 KiB % | 2 KiB projection error % |\n|---|---|---|---|---|---|---|"
    );
    for alg in ["zstd", "lz4", "pglz"] {
        let full = &pts
            .iter()
            .find(|(p, _)| p.algorithm == alg && p.sample_fraction == 1.0)
            .unwrap()
            .1;
        for (p, m) in pts.iter().filter(|(p, _)| p.algorithm == alg) {
            let err = |a: f64, b: f64| 100.0 * (a - b) / b;
            println!(
                "| {alg} | {}% | {} | {:.0} | {:+.2} | {:.1} | {:+.2} |",
                p.sample_fraction * 100.0,
                m.pages_analysed,
                m.avg_compressed_bytes,
                err(m.avg_compressed_bytes, full.avg_compressed_bytes),
                m.over_2k_pct,
                err(m.projected_2k_bytes as f64, full.projected_2k_bytes as f64),
            );
        }
    }
    Ok(())
}
