//! Benchmark: pgfleet's toast-slice measurement loop against
//! `pgbench -M prepared` on the same cluster, the same points, alternating.
//!
//! For each point (storage mode x offset of one 10 MiB "mixed" value) and
//! each round, pgfleet's loop runs for D seconds, then pgbench runs the same
//! query (same prepared protocol, 1 client, 1 thread) for D seconds. Prints a
//! markdown table: median over rounds of the mean latency of each, their
//! ratio, and client CPU per call (pgfleet: this process; pgbench: the child).
//!
//!   cargo run --release -p pgfleet-agent --example toast_vs_pgbench -- [SECONDS] [ROUNDS]

mod common;

use std::time::Duration;

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::pgbin::PgBin;
use pgfleet_agent::workload::median;
use pgfleet_agent::workload::toast_slice::{self, Dataset, Offset, Params, QUERY, StorageMode};
use tokio_util::sync::CancellationToken;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    // One thread, so this process's CPU is the measuring client's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(secs, rounds))
}

async fn run(secs: f64, rounds: usize) -> anyhow::Result<()> {
    let (cluster, root) = common::cluster(&[("shared_buffers", "128MB")]).await?;
    let pg = cluster.pg.clone();
    let result = bench(&cluster, &pg, secs, rounds).await;
    cluster.teardown().await?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn bench(cluster: &Cluster, pg: &PgBin, secs: f64, rounds: usize) -> anyhow::Result<()> {
    let value_bytes = 10 * 1024 * 1024;
    let offsets = [("0%", 1u64), ("50%", 5_242_881), ("90%", 9_437_185)];
    let modes = [StorageMode::External, StorageMode::Pglz, StorageMode::Lz4];
    let params = Params {
        storage_modes: modes.to_vec(),
        dataset: Dataset::Mixed,
        value_bytes,
        offsets: offsets
            .iter()
            .map(|(l, b)| Offset {
                label: l.to_string(),
                byte: *b,
            })
            .collect(),
        slice_bytes: 100,
        duration_s: secs,
        repeats: rounds as u32,
        warmup_s: 0.5,
        cache: pgfleet_proto::workload::Cache::Warm,
    };
    let client = cluster.connect().await?;
    toast_slice::setup(&client, &params).await?;
    client
        .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await?;
    let cancel = CancellationToken::new();
    let dur = Duration::from_secs_f64(secs);
    let script_dir =
        std::env::temp_dir().join(format!("pgfleet-bench-scripts-{}", std::process::id()));
    std::fs::create_dir_all(&script_dir)?;

    println!(
        "pgfleet toast-slice loop vs pgbench -M prepared: mixed 10 MiB, 100 bytes, {secs} s x {rounds} rounds per point, alternating\n"
    );
    println!(
        "| point | pgfleet ms | pgbench ms | ratio pgfleet/pgbench | pgfleet CPU µs/call | pgbench CPU µs/call |"
    );
    println!("|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for mode in modes {
        let stmt = client
            .prepare(&QUERY.replace("{table}", &mode.table()))
            .await?;
        let script = script_dir.join(format!("{}.sql", mode.name()));
        std::fs::write(
            &script,
            format!(
                "SELECT octet_length(substring(payload FROM :off FOR 100)) FROM {} WHERE id = 2;\n",
                mode.table()
            ),
        )?;
        for (label, byte) in offsets {
            // Warm both paths once.
            toast_slice::measure(
                &client,
                &stmt,
                byte,
                100,
                value_bytes,
                Duration::from_millis(300),
                &cancel,
            )
            .await?;
            let (mut ours, mut theirs, mut our_cpu, mut their_cpu) =
                (vec![], vec![], vec![], vec![]);
            for _ in 0..rounds {
                let c0 = common::cpu_seconds(libc::RUSAGE_SELF);
                let s = toast_slice::measure(&client, &stmt, byte, 100, value_bytes, dur, &cancel)
                    .await?;
                our_cpu.push((common::cpu_seconds(libc::RUSAGE_SELF) - c0) / s.calls as f64 * 1e6);
                ours.push(s.mean_ms);

                let c0 = common::cpu_seconds(libc::RUSAGE_CHILDREN);
                let out = tokio::process::Command::new(pg.tool("pgbench"))
                    .args(["-n", "-M", "prepared", "-c", "1", "-j", "1", "-T"])
                    .arg(format!("{}", secs.ceil() as u64))
                    .arg("-f")
                    .arg(&script)
                    .arg("-D")
                    .arg(format!("off={byte}"))
                    .arg(cluster.conninfo())
                    // Same plan as pgfleet (read by primary key), without an extra statement.
                    .env(
                        "PGOPTIONS",
                        "-c enable_seqscan=off -c enable_bitmapscan=off",
                    )
                    .output()
                    .await?;
                let text = String::from_utf8_lossy(&out.stdout);
                anyhow::ensure!(
                    out.status.success(),
                    "pgbench failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let lat = grab(&text, "latency average = ")
                    .ok_or_else(|| anyhow::anyhow!("no latency in {text}"))?;
                let n = grab(&text, "number of transactions actually processed: ").unwrap_or(1.0);
                their_cpu.push((common::cpu_seconds(libc::RUSAGE_CHILDREN) - c0) / n * 1e6);
                theirs.push(lat);
            }
            let (a, b) = (median(&ours), median(&theirs));
            ratios.push(a / b);
            println!(
                "| {} @{label} | {a:.3} | {b:.3} | {:.3} | {:.1} | {:.1} |",
                mode.name().to_uppercase(),
                a / b,
                median(&our_cpu),
                median(&their_cpu)
            );
        }
    }
    println!("\nmedian ratio over points: {:.3}", median(&ratios));
    let _ = std::fs::remove_dir_all(&script_dir);
    Ok(())
}

/// The number after `key` in pgbench's output.
fn grab(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}
