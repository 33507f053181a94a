//! Benchmark (issue 46): pgbench's tables loaded three ways in one cluster,
//! in alternating rounds: `pgbench -i` (the standard tool), pgfleet's copy
//! loader and pgfleet's direct load; and fio's sequential write on the same
//! file system as the limit. Prints a markdown table of medians: seconds,
//! the speed-up against `pgbench -i`, the write step's bandwidth and its
//! share of fio's, and the machine's CPU seconds per GB loaded (every
//! process: the server's backends and the agent's writers alike).
//!
//!   cargo run --release -p pgfleet-agent --example direct_load -- [SCALE] [ROUNDS]

mod common;

use std::time::Instant;

use pgfleet_agent::workload::pgbench_init::{self, InitParams, LoadMethod};
use pgfleet_agent::workload::{CellContext, median};
use tokio_util::sync::CancellationToken;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let scale: u64 = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let rounds: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (cluster, root) = common::cluster(&[
            ("shared_buffers", "1GB"),
            ("max_wal_size", "16GB"),
            ("checkpoint_timeout", "30min"),
        ])
        .await?;
        let r = bench(&cluster, scale, rounds).await;
        cluster.teardown().await?;
        let _ = std::fs::remove_dir_all(&root);
        r
    })
}

/// Busy CPU seconds of the whole machine (every core), from /proc/stat.
fn machine_cpu_seconds() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = text.lines().next().unwrap_or_default();
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle, iowait.
    let busy: f64 = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, x)| x)
        .sum();
    busy / 100.0
}

/// fio's sequential write of `gib` GiB in 1 MiB blocks, O_DIRECT at queue
/// depth 8 (the device's bandwidth, as BENCHMARKS' fio table measures
/// it), fsynced at the end, in `dir`: MB/s.
async fn fio(dir: &std::path::Path, gib: u64) -> anyhow::Result<f64> {
    let out = tokio::process::Command::new("fio")
        .args([
            "--name=seq",
            "--rw=write",
            "--bs=1M",
            &format!("--size={gib}G"),
            "--ioengine=libaio",
            "--direct=1",
            "--iodepth=8",
            "--end_fsync=1",
            "--output-format=json",
        ])
        .arg(format!("--directory={}", dir.display()))
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let _ = std::fs::remove_file(dir.join("seq.0.0"));
    Ok(v["jobs"][0]["write"]["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6)
}

async fn bench(
    cluster: &pgfleet_agent::cluster::Cluster,
    scale: u64,
    rounds: usize,
) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let ctx = CellContext::new("bench", cluster, tx, CancellationToken::new());
    let p = |m| InitParams {
        scale,
        fillfactor: 100,
        partitions: 0,
        load_connections: 0,
        load_method: m,
    };
    let gb = p(LoadMethod::Direct).data_bytes() as f64 / 1e9;
    let superuser = format!("{} options='-c search_path=public'", cluster.conninfo());
    let pg = cluster.pg.clone();
    // An untimed load first: a fresh cluster's first load also creates its
    // WAL segments; and the direct load's self-check runs once per build.
    pgbench_init::load(&ctx, &p(LoadMethod::Copy)).await?;
    pgbench_init::load(&ctx, &p(LoadMethod::Direct)).await?;
    let names = ["pgbench -i", "pgfleet copy", "pgfleet direct"];
    let mut secs = vec![vec![]; 3];
    let mut cpu = vec![vec![]; 3];
    let mut write_bw = vec![];
    let mut fio_bw = vec![];
    let dir = cluster.data_dir().to_path_buf();
    for round in 0..rounds {
        for (i, name) in names.iter().enumerate() {
            // Each load starts from a checkpointed, quiet cluster.
            cluster.connect().await?.batch_execute("CHECKPOINT").await?;
            let (t, c) = (Instant::now(), machine_cpu_seconds());
            match i {
                0 => {
                    let out = tokio::process::Command::new(pg.tool("pgbench"))
                        .args(["-i", "-q", "-s", &scale.to_string()])
                        .arg(&superuser)
                        .output()
                        .await?;
                    anyhow::ensure!(
                        out.status.success(),
                        "pgbench -i: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                1 => {
                    pgbench_init::load(&ctx, &p(LoadMethod::Copy)).await?;
                }
                _ => {
                    let l = pgbench_init::load(&ctx, &p(LoadMethod::Direct)).await?;
                    anyhow::ensure!(l.method == LoadMethod::Direct, "direct refused: {}", l.note);
                    let write = l.steps.iter().find(|s| s.0 == "write").map_or(0.0, |s| s.1);
                    write_bw.push(gb * 1e3 / write.max(1e-9));
                    eprintln!("round {round}: {name} steps {:?}", l.steps);
                }
            }
            // A load ends with its data on disk: the next one's CHECKPOINT
            // would otherwise pay for this one's dirty pages.
            cluster.connect().await?.batch_execute("CHECKPOINT").await?;
            secs[i].push(t.elapsed().as_secs_f64());
            cpu[i].push(machine_cpu_seconds() - c);
            eprintln!("round {round}: {name} {:.1} s", t.elapsed().as_secs_f64());
        }
        fio_bw.push(fio(&dir, 8).await?);
        eprintln!("round {round}: fio {:.0} MB/s", fio_bw.last().unwrap());
    }
    let base = median(&secs[0]);
    let fio_mb = median(&fio_bw);
    println!(
        "## Direct load: scale {scale} ({gb:.1} GB of heap and key), {rounds} rounds, medians\n\n\
         fio sequential write (1 MiB, O_DIRECT, queue depth 8, fsync at the end) on the same file system: {fio_mb:.0} MB/s\n\n\
         | loader | seconds | speed-up vs pgbench -i | write step MB/s (share of fio) | machine CPU s per GB |\n|---|---|---|---|---|"
    );
    for (i, name) in names.iter().enumerate() {
        let s = median(&secs[i]);
        let bw = if i == 2 {
            let w = median(&write_bw);
            format!("{w:.0} ({:.0} %)", 100.0 * w / fio_mb)
        } else {
            "-".into()
        };
        println!(
            "| {name} | {s:.1} | {:.2}x | {bw} | {:.1} |",
            base / s,
            median(&cpu[i]) / gb
        );
    }
    Ok(())
}
