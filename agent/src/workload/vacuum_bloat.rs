//! `vacuum-bloat`: load pgbench's schema, leave `bloat_bytes` of dead
//! tuples in pgbench_accounts, then time one VACUUM of it.
//!
//! 1. Load (the parallel loader), autovacuum off for pgbench_accounts, and a
//!    CHECKPOINT so the load's dirty pages are not VACUUM's to write.
//! 2. Bloat: from the average live tuple size, the number of rows whose
//!    update leaves `bloat_bytes` of dead versions; those rows are updated
//!    in ascending `aid` ranges (each range its own transaction, so progress
//!    shows and no snapshot holds the whole pass). Each update of a full
//!    fillfactor-100 page is non-HOT: the old version stays as a dead tuple
//!    in its page and the primary key gets a new entry, as in the seeds.
//! 3. Measure: `pgstattuple` (contrib) when the server has it — exact dead
//!    tuple count and bytes; otherwise the statistics views (dead tuples
//!    from pg_stat_user_tables, bytes from the average tuple size).
//! 4. CHECKPOINT; with `cache: cold` (default) the table's files leave the
//!    OS page cache, so VACUUM reads from the storage under test (shared
//!    buffers keep what they hold); then `VACUUM (options) pgbench_accounts`, timed, while
//!    `pg_stat_progress_vacuum` is sampled every second (samples `vacuum`)
//!    and the sampler takes PostgreSQL's I/O figures over the same window.
//! 5. Measure again: the dead tuples VACUUM removed.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::context::{CellContext, Output};
use super::pgbench_init;
use crate::{Error, Result};
pub use pgfleet_proto::workload::vacuum_bloat::{Metrics, Params, PointParams, Progress};
use pgfleet_proto::workload::{Cache, Point};

/// What pgbench_accounts holds at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableState {
    pub table_bytes: u64,
    pub index_bytes: u64,
    pub live_tuples: u64,
    pub live_tuple_bytes: u64,
    pub dead_tuples: u64,
    pub dead_tuple_bytes: u64,
}

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        let client = ctx.cluster.connect().await?;
        let loaded = ctx.loaded()?;
        client
            .batch_execute("ALTER TABLE public.pgbench_accounts SET (autovacuum_enabled = false); CHECKPOINT")
            .await?;
        let exact = client
            .batch_execute(
                "CREATE SCHEMA IF NOT EXISTS pgfleet_agent; \
                 REVOKE ALL ON SCHEMA pgfleet_agent FROM PUBLIC; \
                 CREATE EXTENSION IF NOT EXISTS pgstattuple WITH SCHEMA pgfleet_agent",
            )
            .await
            .is_ok();
        let method = if exact { "pgstattuple_approx" } else { "statistics" };
        let mut steps = std::collections::BTreeMap::new();
        let mut step = |name: &str, since: Instant| {
            *steps.entry(name.to_string()).or_insert(0.0) += since.elapsed().as_secs_f64();
        };
        let at = Instant::now();
        let fresh = measure(&client, exact).await?;
        step("measure", at);
        let avg = fresh.live_tuple_bytes as f64 / fresh.live_tuples.max(1) as f64;
        let rows_total = p.init.scale * pgbench_init::ACCOUNTS_PER_BRANCH;
        let rows = ((p.bloat_bytes as f64 / avg.max(1.0)).ceil() as u64).min(rows_total);

        let bloat_started = Instant::now();
        let chunk = (rows / 100).max(10_000);
        let mut first = 1;
        while first <= rows {
            ctx.check_cancel()?;
            let last = (first + chunk - 1).min(rows);
            client
                .execute(
                    &format!("UPDATE public.pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN {first} AND {last}"),
                    &[],
                )
                .await?;
            ctx.progress("bloat", last, rows, format!("{last}/{rows} rows updated"));
            first = last + 1;
        }
        let bloat_seconds = bloat_started.elapsed().as_secs_f64();
        step("bloat", bloat_started);
        let at = Instant::now();
        let bloated = measure(&client, exact).await?;
        step("measure", at);
        ctx.sample("bloat", &serde_json::json!({
            "method": method, "rows_updated": rows, "avg_tuple_bytes": avg,
            "table_bytes": bloated.table_bytes, "index_bytes": bloated.index_bytes,
            "dead_tuples": bloated.dead_tuples, "dead_tuple_bytes": bloated.dead_tuple_bytes,
        }))
        .await?;
        let at = Instant::now();
        client.batch_execute("CHECKPOINT").await?;
        step("checkpoint", at);
        let at = Instant::now();
        let evicted_bytes = match p.cache {
            Cache::Cold => ctx.cluster.evict_from_page_cache(&client, "public.pgbench_accounts").await?,
            Cache::Warm => 0,
        };
        step("evict", at);

        let sampler = ctx.sample_own_cluster().await?;
        let (vacuum_client, mut notices) = ctx.cluster.connect_with_notices().await?;
        let sql = p.vacuum_sql_qualified();
        let started = Instant::now();
        let vacuum = vacuum_client.batch_execute(&sql);
        tokio::pin!(vacuum);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(1), Duration::from_secs(1));
        let (mut heap_blks_total, mut index_vacuum_count) = (0, 0);
        loop {
            tokio::select! {
                r = &mut vacuum => {
                    r?;
                    break;
                }
                _ = tick.tick() => {
                    if let Some(pr) = progress(&client, started).await? {
                        heap_blks_total = heap_blks_total.max(pr.heap_blks_total);
                        index_vacuum_count = index_vacuum_count.max(pr.index_vacuum_count);
                        ctx.progress("vacuum", pr.heap_blks_scanned, pr.heap_blks_total.max(1), format!("{} ({:.0} s)", pr.phase, pr.second));
                        ctx.sample("vacuum", &pr).await?;
                    }
                }
            }
        }
        let vacuum_seconds = started.elapsed().as_secs_f64();
        let internals = sampler.finish().await?.internals();
        // The connection hands notices over before the command's reply.
        let mut verbose = Vec::new();
        while let Ok(n) = notices.try_recv() {
            verbose.push(n);
        }
        if let Some(n) = index_scans(&verbose) {
            index_vacuum_count = index_vacuum_count.max(n);
        }
        if !verbose.is_empty() {
            ctx.sample("vacuum_verbose", &serde_json::json!({ "messages": verbose })).await?;
        }
        let after = measure(&client, exact).await?;
        if heap_blks_total == 0 {
            heap_blks_total = bloated.table_bytes / 8192;
        }
        // VACUUM's end as a last progress sample (a VACUUM shorter than a
        // second has no other): every heap block scanned.
        ctx.sample(
            "vacuum",
            &Progress {
                second: vacuum_seconds,
                phase: "done".into(),
                heap_blks_total,
                heap_blks_scanned: heap_blks_total,
                heap_blks_vacuumed: heap_blks_total,
                index_vacuum_count,
            },
        )
        .await?;
        Ok(Output::of(&[Point {
            params: PointParams {
                scale: p.init.scale,
                bloat_target_bytes: p.bloat_bytes,
                vacuum: p.vacuum_sql(),
                cache: p.cache,
            },
            metrics: Metrics {
                bloat_bytes: bloated.dead_tuple_bytes,
                bloat_target_bytes: p.bloat_bytes,
                bloat_method: method.into(),
                rows_updated: rows,
                bloat_seconds,
                table_bytes: bloated.table_bytes,
                index_bytes: bloated.index_bytes,
                dead_tuples_before: bloated.dead_tuples,
                dead_tuples_after: after.dead_tuples,
                dead_tuples_removed: bloated.dead_tuples.saturating_sub(after.dead_tuples),
                vacuum_seconds,
                heap_mb_per_s: bloated.table_bytes as f64 / (1 << 20) as f64 / vacuum_seconds.max(1e-9),
                heap_blks_total,
                index_vacuum_count,
                evicted_bytes,
                prepare_step_seconds: steps,
                internals,
                load: loaded,
            },
        }]))
    }
    .boxed()
}

/// pgbench_accounts' size and live / dead tuples: exact with pgstattuple,
/// else from the statistics views.
pub async fn measure(client: &tokio_postgres::Client, exact: bool) -> Result<TableState> {
    let sizes = client
        .query_one(
            "SELECT pg_relation_size('public.pgbench_accounts')::int8, pg_indexes_size('public.pgbench_accounts')::int8",
            &[],
        )
        .await?;
    let (table_bytes, index_bytes) = (sizes.get::<_, i64>(0) as u64, sizes.get::<_, i64>(1) as u64);
    if exact {
        // pgstattuple_approx reads only the pages the visibility map does
        // not mark all-visible, which hold every dead tuple: the dead
        // figures are exact, the live ones estimated for the pages it
        // skips (from their free space). pgstattuple would read the whole
        // table on each of the three measures: at scale 1,000 on an
        // emulated gp3, 3 x 13 GB at 125 MiB/s, five minutes of the cell
        // (BENCHMARKS.md, "The scale ladder"); at the seeds' scale hours.
        let r = client
            .query_one(
                "SELECT approx_tuple_count::int8, dead_tuple_count::int8, dead_tuple_len::int8, \
                 (SELECT avg(pg_column_size(a))::float8 FROM (SELECT * FROM public.pgbench_accounts LIMIT 10000) a) \
                 FROM pgfleet_agent.pgstattuple_approx('public.pgbench_accounts')",
                &[],
            )
            .await?;
        let g = |i| r.get::<_, i64>(i).max(0) as u64;
        // Its live bytes of a skipped page are the page less its free
        // space (headers and line pointers included): the live tuples'
        // length is sampled instead (a whole-row datum's size is the
        // tuple's length, header included).
        let avg = r.get::<_, Option<f64>>(3).unwrap_or(0.0);
        return Ok(TableState {
            table_bytes,
            index_bytes,
            live_tuples: g(0),
            live_tuple_bytes: (avg * g(0) as f64) as u64,
            dead_tuples: g(1),
            dead_tuple_bytes: g(2),
        });
    }
    // The statistics collector flushes a backend's counts when it goes idle
    // (at most once a second): force it where the server can, and wait.
    let _ = client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _ = client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await;
    let r = client
        .query_one(
            "SELECT n_live_tup::int8, n_dead_tup::int8, (SELECT avg(pg_column_size(a))::float8 FROM (SELECT * FROM public.pgbench_accounts LIMIT 10000) a) \
             FROM pg_stat_user_tables WHERE schemaname = 'public' AND relname = 'pgbench_accounts'",
            &[],
        )
        .await?;
    let (live, dead, avg) = (
        r.get::<_, i64>(0).max(0) as u64,
        r.get::<_, i64>(1).max(0) as u64,
        r.get::<_, Option<f64>>(2).unwrap_or(0.0),
    );
    Ok(TableState {
        table_bytes,
        index_bytes,
        live_tuples: live,
        live_tuple_bytes: (live as f64 * avg) as u64,
        dead_tuples: dead,
        dead_tuple_bytes: (dead as f64 * avg) as u64,
    })
}

/// Index vacuum passes from `VACUUM (VERBOSE)`'s report: "index scans: N"
/// (PostgreSQL 15+), else one "scanned index ... to remove" line per pass
/// over the first index (older servers).
pub fn index_scans(messages: &[String]) -> Option<u64> {
    let text = messages.join("\n");
    if let Some(i) = text.find("index scans: ") {
        let digits: String = text[i + 13..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        return digits.parse().ok();
    }
    let first_index = text.lines().find_map(|l| {
        l.strip_prefix("scanned index \"")
            .and_then(|r| r.split('"').next())
    })?;
    Some(
        text.lines()
            .filter(|l| l.starts_with(&format!("scanned index \"{first_index}\"")))
            .count() as u64,
    )
}

/// One row of `pg_stat_progress_vacuum` for pgbench_accounts, if VACUUM is
/// at work on it.
async fn progress(client: &tokio_postgres::Client, started: Instant) -> Result<Option<Progress>> {
    let row = client
        .query_opt(
            "SELECT phase, heap_blks_total::int8, heap_blks_scanned::int8, heap_blks_vacuumed::int8, index_vacuum_count::int8 \
             FROM pg_stat_progress_vacuum WHERE relid = 'public.pgbench_accounts'::regclass",
            &[],
        )
        .await
        .map_err(Error::from)?;
    Ok(row.map(|r| {
        let g = |i| r.get::<_, i64>(i).max(0) as u64;
        Progress {
            second: started.elapsed().as_secs_f64(),
            phase: r.get(0),
            heap_blks_total: g(1),
            heap_blks_scanned: g(2),
            heap_blks_vacuumed: g(3),
            index_vacuum_count: g(4),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::index_scans;

    #[test]
    fn index_scans_from_either_verbose_format() {
        let v15 = "finished vacuuming \"postgres.public.pgbench_accounts\": index scans: 2\npages: 0 removed, 9962 remain";
        assert_eq!(index_scans(&[v15.to_string()]), Some(2));
        let v13 = [
            "scanned index \"pgbench_accounts_pkey\" to remove 178956 row versions",
            "scanned index \"pgbench_accounts_pkey\" to remove 29027 row versions",
        ]
        .map(String::from);
        assert_eq!(index_scans(&v13), Some(2));
        assert_eq!(index_scans(&["vacuuming \"x\"".to_string()]), None);
    }
}
