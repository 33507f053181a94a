//! `toast-slice`: read `slice_bytes` from the middle of one large bytea value
//! stored three ways (seeds/000, SPEC Experiment 2).
//!
//! Per cell (one dataset, one value size, on a fresh cluster):
//! 1. Setup: one table per storage mode (`toast_external`, `toast_pglz`,
//!    `toast_lz4`), `ALTER TABLE ... SET STORAGE / SET COMPRESSION` (PostgreSQL
//!    15 lacks `CREATE TABLE ... STORAGE`), and row `id = 2` generated
//!    server-side by an expression, so every table compresses from an
//!    uncompressed datum (copying a value between tables would copy its
//!    compressed form as-is).
//! 2. Verify: per value, stored bytes (`pg_column_size`), compression method
//!    (`pg_column_compression`, NULL = none) and whether it lives in the TOAST
//!    table (its chunks are counted there; each table holds one value).
//! 3. Explain: `EXPLAIN (ANALYZE, BUFFERS)` of the slice query per point,
//!    warm, read by primary key: shared hit / read.
//! 4. Measure: the prepared query
//!    `SELECT octet_length(substring(payload FROM $1 FOR $2)) FROM t WHERE id = $3`
//!    in a closed loop for `duration_s`, one HDR histogram per repeat; repeats
//!    are interleaved across points so drift hits every point alike. A point's
//!    figure is the median over its repeats. With `cache: cold` each repeat
//!    is instead one read right after the cluster restarted and its files
//!    left the page cache (no warm-up): a read from the storage.

use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::json;

use super::context::{CellContext, Output, RepeatSummary, closed_loop, explain_buffers, median};
use crate::{Error, Result};
use pgfleet_proto::workload::Cache;

const ROW_ID: i64 = 2;
pub const QUERY: &str =
    "SELECT octet_length(substring(payload FROM $1 FOR $2)) FROM {table} WHERE id = $3";

pub use pgfleet_proto::workload::toast_slice::{
    Dataset, Metrics, Offset, Params, Point as TypedPoint, PointParams, StorageMode,
};

/// Physical storage of one value.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub stored_bytes: i64,
    pub raw_bytes: i64,
    pub compression: Option<String>,
    pub external: bool,
    pub toast_chunks: i64,
}

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        if p.storage_modes.is_empty() || p.offsets.is_empty() || p.repeats == 0 {
            return Err(werr("storage_modes, offsets and repeats must not be empty".into()));
        }
        if p.value_bytes > i32::MAX as u64 || p.value_bytes == 0 {
            return Err(werr(format!("value_bytes {} is outside 1..=2^31-1", p.value_bytes)));
        }
        for o in &p.offsets {
            if o.byte == 0 || o.byte > p.value_bytes {
                return Err(werr(format!("offset {} (byte {}) is outside the value (1..={})", o.label, o.byte, p.value_bytes)));
            }
        }
        let client = ctx.cluster.connect_own().await?;

        ctx.progress("load", 0, p.storage_modes.len() as u64, format!("{} x {} B", p.dataset.name(), p.value_bytes));
        setup(&client, p).await?;
        ctx.check_cancel()?;

        let mut stored = Vec::new();
        for (i, mode) in p.storage_modes.iter().enumerate() {
            let s = verify(&client, *mode).await?;
            ctx.sample(
                "storage",
                &json!({
                    "storage_mode": mode.name(), "dataset": p.dataset.name(), "value_bytes": p.value_bytes,
                    "stored_bytes": s.stored_bytes, "raw_bytes": s.raw_bytes, "compression": s.compression,
                    "external": s.external, "toast_chunks": s.toast_chunks,
                }),
            )
            .await?;
            ctx.progress("verify", i as u64 + 1, p.storage_modes.len() as u64, mode.name());
            stored.push(s);
        }

        // Read by primary key, as the article does (a one-row table would
        // otherwise be read by a sequential scan).
        client.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off").await?;

        let mut buffers = Vec::new();
        for mode in &p.storage_modes {
            let mut per_offset = Vec::new();
            for o in &p.offsets {
                ctx.check_cancel()?;
                let b = explain(&client, *mode, o.byte, p.slice_bytes).await?;
                ctx.sample(
                    "explain",
                    &json!({"storage_mode": mode.name(), "offset": o.byte, "offset_label": o.label,
                            "shared_hit": b.0, "shared_read": b.1, "node": b.2, "execution_ms": b.3}),
                )
                .await?;
                per_offset.push(b);
            }
            buffers.push(per_offset);
        }

        let mut stmts = Vec::new();
        for mode in &p.storage_modes {
            stmts.push(client.prepare(&QUERY.replace("{table}", &mode.table())).await?);
        }
        let cold = p.cache == Cache::Cold;
        // Warm-up: each point briefly, not recorded.
        let warm = Duration::from_secs_f64(p.warmup_s.max(0.0) / (stmts.len() * p.offsets.len()) as f64);
        for stmt in &stmts {
            for o in &p.offsets {
                if !cold {
                    measure(&client, stmt, o.byte, p.slice_bytes, p.value_bytes, warm, &ctx.cancel).await?;
                }
            }
        }

        let total = (p.repeats as usize * stmts.len() * p.offsets.len()) as u64;
        let mut done = 0;
        // repeats[mode][offset] = per-repeat summaries
        let mut summaries = vec![vec![Vec::<RepeatSummary>::new(); p.offsets.len()]; stmts.len()];
        let dur = Duration::from_secs_f64(p.duration_s);
        for r in 0..p.repeats {
            for (mi, mode) in p.storage_modes.iter().enumerate() {
                for (oi, o) in p.offsets.iter().enumerate() {
                    ctx.progress(
                        "measure",
                        done,
                        total,
                        format!("{} @{} repeat {}/{}", mode.name(), o.label, r + 1, p.repeats),
                    );
                    let s = if cold {
                        // One read from a cold cache: restart (the old
                        // session ends with it), evict, connect, read.
                        ctx.cluster.make_cold().await?;
                        let c = ctx.cluster.connect_own().await?;
                        let stmt = c.prepare(&QUERY.replace("{table}", &mode.table())).await?;
                        measure(&c, &stmt, o.byte, p.slice_bytes, p.value_bytes, Duration::ZERO, &ctx.cancel).await?
                    } else {
                        measure(&client, &stmts[mi], o.byte, p.slice_bytes, p.value_bytes, dur, &ctx.cancel).await?
                    };
                    ctx.sample(
                        "repeat",
                        &json!({"storage_mode": mode.name(), "offset": o.byte, "offset_label": o.label,
                                "repeat": r + 1, "calls": s.calls, "latency_ms_mean": s.mean_ms,
                                "latency_ms_p50": s.p50_ms, "latency_ms_p99": s.p99_ms, "latency_ms_max": s.max_ms}),
                    )
                    .await?;
                    summaries[mi][oi].push(s);
                    done += 1;
                }
            }
        }
        ctx.progress("measure", total, total, "done");

        let mut points = Vec::new();
        for (mi, mode) in p.storage_modes.iter().enumerate() {
            for (oi, o) in p.offsets.iter().enumerate() {
                let reps = &summaries[mi][oi];
                let pick = |f: fn(&RepeatSummary) -> f64| median(&reps.iter().map(f).collect::<Vec<_>>());
                let (hit, read, _, _) = &buffers[mi][oi];
                let s = &stored[mi];
                points.push(TypedPoint {
                    params: PointParams {
                        storage_mode: *mode,
                        dataset: p.dataset,
                        value_bytes: p.value_bytes,
                        offset: o.byte,
                        offset_label: o.label.clone(),
                        slice_bytes: p.slice_bytes,
                        cache: p.cache,
                    },
                    metrics: Metrics {
                        stored_bytes: s.stored_bytes,
                        compression: s.compression.clone(),
                        external: s.external,
                        toast_chunks: s.toast_chunks,
                        buffers_shared_hit: *hit,
                        buffers_shared_read: *read,
                        latency_ms_p50: pick(|r| r.p50_ms),
                        latency_ms_p99: pick(|r| r.p99_ms),
                        latency_ms_mean: pick(|r| r.mean_ms),
                        calls: reps.iter().map(|r| r.calls).sum::<u64>(),
                        repeats: reps.len() as u32,
                    },
                });
            }
        }
        Ok(Output::of(&points))
    }
    .boxed()
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "toast-slice".into(),
        message,
    }
}

/// Creates the tables and their values, and checks they hold the same bytes.
pub async fn setup(client: &tokio_postgres::Client, p: &Params) -> Result<()> {
    for mode in &p.storage_modes {
        client.batch_execute(&mode.ddl()).await.map_err(|e| {
            werr(format!(
                "creating {} failed: {} (does this server support {} compression?)",
                mode.table(),
                db_message(&e),
                mode.name()
            ))
        })?;
        let insert = format!(
            "INSERT INTO {} (id, payload) {}",
            mode.table(),
            p.dataset
                .sql()
                .replacen("SELECT ", &format!("SELECT {ROW_ID}, "), 1)
        );
        client.execute(&insert, &[&(p.value_bytes as i64)]).await?;
    }
    // Every table must hold the same bytes, or the comparison is meaningless.
    let mut digests = Vec::new();
    for mode in &p.storage_modes {
        let row = client
            .query_one(
                &format!("SELECT md5(payload), octet_length(payload)::bigint FROM {} WHERE id = {ROW_ID}", mode.table()),
                &[],
            )
            .await?;
        let len: i64 = row.get(1);
        if len as u64 != p.value_bytes {
            return Err(werr(format!(
                "{} holds {len} bytes, expected {}",
                mode.table(),
                p.value_bytes
            )));
        }
        digests.push(row.get::<_, String>(0));
    }
    if digests.windows(2).any(|w| w[0] != w[1]) {
        return Err(werr("the tables hold different values".into()));
    }
    client.batch_execute("VACUUM ANALYZE").await?;
    client.batch_execute("CHECKPOINT").await?;
    Ok(())
}

/// Reads how the value of row `id = 2` is physically stored.
pub async fn verify(client: &tokio_postgres::Client, mode: StorageMode) -> Result<Stored> {
    let t = mode.table();
    let row = client
        .query_one(
            &format!(
                "SELECT pg_column_size(payload)::bigint, octet_length(payload)::bigint, pg_column_compression(payload) \
                 FROM {t} WHERE id = {ROW_ID}"
            ),
            &[],
        )
        .await?;
    // PostgreSQL 15 has no pg_column_toast_chunk_id(): each table holds one
    // value, so its TOAST table's chunks are that value's.
    let toast: String = client
        .query_one(
            &format!(
                "SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = '{t}'::regclass"
            ),
            &[],
        )
        .await?
        .get(0);
    let chunks: i64 = client
        .query_one(&format!("SELECT count(*) FROM {toast}"), &[])
        .await?
        .get(0);
    Ok(Stored {
        stored_bytes: row.get(0),
        raw_bytes: row.get(1),
        compression: row.get(2),
        external: chunks > 0,
        toast_chunks: chunks,
    })
}

/// Warm `EXPLAIN (ANALYZE, BUFFERS)` of one point: (shared hit, shared read,
/// plan node type, execution ms).
pub async fn explain(
    client: &tokio_postgres::Client,
    mode: StorageMode,
    offset: u64,
    slice: u32,
) -> Result<(i64, i64, String, f64)> {
    let sql = format!(
        "SELECT octet_length(substring(payload FROM {offset} FOR {slice})) FROM {} WHERE id = {ROW_ID}",
        mode.table()
    );
    explain_buffers(client, &sql).await
}

/// Executes the prepared slice query (`QUERY`) until `dur` elapses (see
/// `closed_loop`), and checks every answer's length.
pub async fn measure(
    client: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    offset: u64,
    slice_bytes: u32,
    value_bytes: u64,
    dur: Duration,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<RepeatSummary> {
    let expected = (slice_bytes as u64).min(value_bytes - offset + 1) as i32;
    let (off, len, id) = (offset as i32, slice_bytes as i32, ROW_ID);
    closed_loop(dur, cancel, || async {
        let row = client.query_one(stmt, &[&off, &len, &id]).await?;
        let got: i32 = row.get(0);
        if got != expected {
            return Err(werr(format!(
                "slice at {offset} returned {got} bytes, expected {expected}"
            )));
        }
        Ok(())
    })
    .await
}

fn db_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}
