//! `pgbench`: load the pgbench schema (`pgbench_init::load`), then run a
//! pgbench-style script with the built-in driver (`crate::driver`) and report
//! pgbench's figures, plus what PostgreSQL itself saw during the measured
//! window: average page read time (pg_stat_database, `track_io_timing`) and
//! WAL sync time per sync (pg_stat_wal, `track_wal_io_timing`).

use super::context::{CellContext, Output};
use super::drive::{drive, per_second};
use crate::Result;
use futures::FutureExt;
use futures::future::BoxFuture;

use pgfleet_proto::workload::fault::FaultMetrics;
pub use pgfleet_proto::workload::pgbench::{Metrics, Params, PointParams};
use pgfleet_proto::workload::{Cache, Point};

/// Loads (its dataset, before), hands the cluster to the workload role,
/// drives the script, and reports pgbench's figures.
pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        let client = ctx.cluster.connect().await?;
        let loaded = ctx.loaded()?;
        client.batch_execute("CHECKPOINT").await?;
        if p.cache == Cache::Cold {
            drop(client);
            let bytes = ctx.cluster.make_cold().await?;
            tracing::info!(cell = %ctx.cell_id, bytes, "cache cold: restarted, database files evicted");
        }
        // The script is scenario text: it runs as the workload role, which
        // owns the tables from here on (the sampler reads statistics as it).
        ctx.cluster.hand_over().await?;
        let super::drive::Driven {
            result,
            internals,
            faults,
        } = drive(ctx, &ctx.cluster.workload_server(), &p.drive, p.init.scale).await?;
        for s in per_second(&result) {
            ctx.sample("second", &s).await?;
        }
        let d = &p.drive;
        let h = &result.histogram;
        // Steadiness is judged over whole seconds of a timed window (one
        // that `duration_s: auto` ended early has a part second last).
        let tps: Vec<f64> = result
            .per_second
            .iter()
            .take(d.duration_s.unwrap_or(0.0).min(result.elapsed_s) as usize)
            .map(|s| s.transactions as f64)
            .collect();
        let drift = pgfleet_proto::workload::steady::drift(&tps);
        Ok(Output::of(&[Point {
            params: PointParams {
                script: d.script.clone(),
                driver: d.driver.clone(),
                scale: p.init.scale,
                clients: d.clients.max(1),
                threads: d.threads.max(1),
                duration_s: d.duration_s,
                until_steady: d.until_steady,
                transactions_per_client: d.transactions,
                rate: d.rate,
                latency_limit_ms: d.latency_limit_ms,
                warmup_s: d.warmup_s,
                cache: p.cache,
                faults: d.faults.clone(),
            },
            metrics: Metrics {
                tps: result.tps(),
                latency_ms_mean: h.mean() / 1000.0,
                latency_ms_p50: result.latency_ms(0.5),
                latency_ms_p90: result.latency_ms(0.9),
                latency_ms_p99: result.latency_ms(0.99),
                latency_ms_p999: result.latency_ms(0.999),
                latency_ms_max: h.max() as f64 / 1000.0,
                latency_histogram_us: h
                    .iter_recorded()
                    .map(|v| [v.value_iterated_to(), v.count_at_value()])
                    .collect(),
                transactions: result.transactions,
                failures: result.failures_total(),
                failures_by_class: result.failures.clone(),
                retries: result.retries,
                skipped: result.skipped,
                late: result.late,
                device_ios_per_txn: internals.device_ios_per_transaction(),
                window_s: d.duration_s.map(|_| result.elapsed_s),
                steady: drift.map(|d| d.steady),
                drift_pct: drift.map(|d| d.drift_pct),
                drift_interval_pct: drift.map(|d| d.interval_pct),
                drift_abs_pct: drift.map(|d| d.drift_pct.abs()),
                internals,
                load: loaded,
                fault_metrics: FaultMetrics::of(&faults),
                faults,
            },
        }]))
    }
    .boxed()
}
