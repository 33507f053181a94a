//! PostgreSQL's own statistics, sampled at a fixed interval during measured
//! phases: pg_stat_database (commits, blocks read/hit, read time),
//! pg_stat_bgwriter (checkpoints, buffers), pg_stat_wal (PostgreSQL 14+:
//! records, bytes, writes, syncs, sync time) and the wait events of active
//! client backends from pg_stat_activity. Each tick sends a `pg_stat` sample
//! of per-interval deltas; `finish` returns what a cell reports: checkpoints
//! and the top wait events. (pg_stat_io, PostgreSQL 16+, is not sampled yet.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellSample, agent_message::Msg};

const DATABASE: &str = "SELECT xact_commit::float8, xact_rollback::float8, blks_read::float8, blks_hit::float8, \
     blk_read_time::float8, blk_write_time::float8 FROM pg_stat_database WHERE datname = current_database()";
const DATABASE_COLS: &[&str] = &[
    "xact_commit",
    "xact_rollback",
    "blks_read",
    "blks_hit",
    "blk_read_time_ms",
    "blk_write_time_ms",
];
const BGWRITER: &str = "SELECT checkpoints_timed::float8, checkpoints_req::float8, checkpoint_write_time::float8, \
     checkpoint_sync_time::float8, buffers_checkpoint::float8, buffers_clean::float8, buffers_backend::float8 FROM pg_stat_bgwriter";
const BGWRITER_COLS: &[&str] = &[
    "checkpoints_timed",
    "checkpoints_req",
    "checkpoint_write_time_ms",
    "checkpoint_sync_time_ms",
    "buffers_checkpoint",
    "buffers_clean",
    "buffers_backend",
];
const WAL: &str = "SELECT wal_records::float8, wal_bytes::float8, wal_write::float8, wal_sync::float8, \
     wal_write_time::float8, wal_sync_time::float8 FROM pg_stat_wal";
const WAL_COLS: &[&str] = &[
    "wal_records",
    "wal_bytes",
    "wal_write",
    "wal_sync",
    "wal_write_time_ms",
    "wal_sync_time_ms",
];
const WAITS: &str = "SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, 'running'), count(*)::float8 \
     FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1";

pub struct Sampler {
    stop: CancellationToken,
    task: JoinHandle<Result<Summary>>,
}

/// What a cell reports from the samples.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub samples: u64,
    pub checkpoints: f64,
    /// (wait event, share of sampled active backends), most frequent first.
    pub top_waits: Vec<(String, f64)>,
}

impl Sampler {
    pub async fn start(
        cluster: &Cluster,
        interval: Duration,
        events: mpsc::Sender<AgentMessage>,
        cell_id: String,
    ) -> Result<Sampler> {
        let client = cluster.connect().await?;
        let wal = cluster.pg.major >= 14;
        let stop = CancellationToken::new();
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut prev = snapshot(&client, wal).await?;
            let first = prev.clone();
            let mut waits: BTreeMap<String, f64> = BTreeMap::new();
            let mut samples = 0;
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = s.cancelled() => break,
                }
                let now = snapshot(&client, wal).await?;
                let mut data = serde_json::Map::new();
                data.insert("t".into(), json!(started.elapsed().as_secs_f64()));
                for (group, cols) in [
                    ("database", DATABASE_COLS),
                    ("bgwriter", BGWRITER_COLS),
                    ("wal", WAL_COLS),
                ] {
                    let delta: serde_json::Map<String, Json> = cols
                        .iter()
                        .filter_map(|c| {
                            let key = format!("{group}.{c}");
                            Some((c.to_string(), json!(now.get(&key)? - prev.get(&key)?)))
                        })
                        .collect();
                    if !delta.is_empty() {
                        data.insert(group.into(), Json::Object(delta));
                    }
                }
                let w: BTreeMap<String, f64> = client
                    .query(WAITS, &[])
                    .await?
                    .iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, f64>(1)))
                    .collect();
                for (k, v) in &w {
                    *waits.entry(k.clone()).or_default() += v;
                }
                data.insert("waits".into(), json!(w));
                let _ = events
                    .send(AgentMessage {
                        msg: Some(Msg::Sample(CellSample {
                            cell_id: cell_id.clone(),
                            kind: "pg_stat".into(),
                            data: Some(pgfleet_proto::json_to_struct(&Json::Object(data))),
                        })),
                    })
                    .await;
                samples += 1;
                prev = now;
            }
            let d = |k: &str| {
                prev.get(k)
                    .zip(first.get(k))
                    .map(|(a, b)| a - b)
                    .unwrap_or(0.0)
            };
            let total: f64 = waits.values().sum();
            let mut top: Vec<(String, f64)> = waits
                .into_iter()
                .map(|(k, v)| (k, v / total.max(1.0)))
                .collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top.truncate(5);
            Ok(Summary {
                samples,
                checkpoints: d("bgwriter.checkpoints_timed") + d("bgwriter.checkpoints_req"),
                top_waits: top,
            })
        });
        Ok(Sampler { stop, task })
    }

    pub async fn finish(self) -> Result<Summary> {
        self.stop.cancel();
        self.task
            .await
            .map_err(|e| Error::Session(format!("sampler task: {e}")))?
    }
}

/// Cumulative counters as `group.column` -> value.
async fn snapshot(client: &tokio_postgres::Client, wal: bool) -> Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    let mut groups = vec![
        ("database", DATABASE, DATABASE_COLS),
        ("bgwriter", BGWRITER, BGWRITER_COLS),
    ];
    if wal {
        groups.push(("wal", WAL, WAL_COLS));
    }
    for (group, sql, cols) in groups {
        let row = client.query_one(sql, &[]).await?;
        for (i, c) in cols.iter().enumerate() {
            m.insert(format!("{group}.{c}"), row.get::<_, f64>(i));
        }
    }
    Ok(m)
}
