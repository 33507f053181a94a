//! PostgreSQL's own statistics, sampled at a fixed interval during measured
//! phases: pg_stat_database (commits, blocks read/hit, read time),
//! checkpoints (pg_stat_bgwriter; pg_stat_checkpointer from PostgreSQL 17),
//! WAL (pg_stat_wal, 14+; its write/sync counters come from pg_stat_io from
//! 18 on), relation I/O by pg_stat_io (16+) and the wait events of active
//! client backends from pg_stat_activity. Each tick sends a `pg_stat` sample
//! of per-interval deltas; `finish` takes a last snapshot and returns what a
//! cell reports: totals over the whole window, checkpoints and the top wait
//! events.
//!
//! Where the cluster has a block device of its own, each snapshot also
//! reads that device's counters (group `device`: reads, writes, their bytes
//! and flushes), so a cell reports how many I/Os the storage under test
//! did per transaction, beside what PostgreSQL asked of it.
//!
//! Every group reports the same names whatever the version (e.g.
//! `bgwriter.checkpoints_timed` is pg_stat_checkpointer's `num_timed` on 17+),
//! so reports and dashboards do not depend on the server's version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::Server;
use crate::cluster::device::DeviceStat;
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellSample, agent_message::Msg};
use pgfleet_proto::workload::{Internals, WaitShare};

/// One query of cumulative counters and the names of its columns.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: &'static str,
    pub sql: &'static str,
    pub cols: &'static [&'static str],
}

const DATABASE: Group = Group {
    name: "database",
    sql: "SELECT xact_commit::float8, xact_rollback::float8, blks_read::float8, blks_hit::float8, \
          blk_read_time::float8, blk_write_time::float8 FROM pg_stat_database WHERE datname = current_database()",
    cols: &[
        "xact_commit",
        "xact_rollback",
        "blks_read",
        "blks_hit",
        "blk_read_time_ms",
        "blk_write_time_ms",
    ],
};

const BGWRITER_UP_TO_16: Group = Group {
    name: "bgwriter",
    sql: "SELECT checkpoints_timed::float8, checkpoints_req::float8, checkpoint_write_time::float8, \
          checkpoint_sync_time::float8, buffers_checkpoint::float8, buffers_clean::float8 FROM pg_stat_bgwriter",
    cols: CHECKPOINT_COLS,
};

const BGWRITER_FROM_17: Group = Group {
    name: "bgwriter",
    sql: "SELECT c.num_timed::float8, c.num_requested::float8, c.write_time::float8, c.sync_time::float8, \
          c.buffers_written::float8, b.buffers_clean::float8 FROM pg_stat_checkpointer c, pg_stat_bgwriter b",
    cols: CHECKPOINT_COLS,
};

const CHECKPOINT_COLS: &[&str] = &[
    "checkpoints_timed",
    "checkpoints_req",
    "checkpoint_write_time_ms",
    "checkpoint_sync_time_ms",
    "buffers_checkpoint",
    "buffers_clean",
];

const WAL_14_TO_17: Group = Group {
    name: "wal",
    sql: "SELECT wal_records::float8, wal_bytes::float8, wal_write::float8, wal_sync::float8, \
          wal_write_time::float8, wal_sync_time::float8 FROM pg_stat_wal",
    cols: WAL_COLS,
};

const WAL_FROM_18: Group = Group {
    name: "wal",
    sql: "SELECT w.wal_records::float8, w.wal_bytes::float8, i.writes, i.fsyncs, i.write_time, i.fsync_time \
          FROM pg_stat_wal w, (SELECT coalesce(sum(writes), 0)::float8 AS writes, coalesce(sum(fsyncs), 0)::float8 AS fsyncs, \
          coalesce(sum(write_time), 0)::float8 AS write_time, coalesce(sum(fsync_time), 0)::float8 AS fsync_time \
          FROM pg_stat_io WHERE object = 'wal') i",
    cols: WAL_COLS,
};

const WAL_COLS: &[&str] = &[
    "wal_records",
    "wal_bytes",
    "wal_write",
    "wal_sync",
    "wal_write_time_ms",
    "wal_sync_time_ms",
];

/// Relation I/O of all backends (client backends, checkpointer, bgwriter,
/// autovacuum), PostgreSQL 16+.
const IO_FROM_16: Group = Group {
    name: "io",
    sql: "SELECT coalesce(sum(reads), 0)::float8, coalesce(sum(read_time), 0)::float8, \
          coalesce(sum(writes), 0)::float8, coalesce(sum(write_time), 0)::float8, \
          coalesce(sum(extends), 0)::float8, coalesce(sum(hits), 0)::float8, \
          coalesce(sum(evictions), 0)::float8, coalesce(sum(fsyncs), 0)::float8, \
          coalesce(sum(fsync_time), 0)::float8 FROM pg_stat_io WHERE object = 'relation'",
    cols: &[
        "reads",
        "read_time_ms",
        "writes",
        "write_time_ms",
        "extends",
        "hits",
        "evictions",
        "fsyncs",
        "fsync_time_ms",
    ],
};

/// Before pg_stat_io (up to 15): the relation pages written, from
/// pg_stat_bgwriter (by the checkpointer, the background writer and
/// backends), under pg_stat_io's name.
const IO_UP_TO_15: Group = Group {
    name: "io",
    sql: "SELECT (buffers_checkpoint + buffers_clean + buffers_backend)::float8 FROM pg_stat_bgwriter",
    cols: &["writes"],
};

/// The counter groups a server of this major version has.
pub fn groups(major: u32) -> Vec<Group> {
    let mut g = vec![DATABASE];
    g.push(if major >= 17 {
        BGWRITER_FROM_17
    } else {
        BGWRITER_UP_TO_16
    });
    match major {
        18.. => g.push(WAL_FROM_18),
        14..=17 => g.push(WAL_14_TO_17),
        _ => {}
    }
    g.push(if major >= 16 { IO_FROM_16 } else { IO_UP_TO_15 });
    g
}

const WAITS: &str = "SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, 'running'), count(*)::float8 \
     FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1";

pub struct Sampler {
    stop: CancellationToken,
    task: JoinHandle<Result<Summary>>,
}

/// A sampler dropped without `finish` (its cell failed) stops sampling: its
/// task would otherwise run as long as its server does.
impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The `device` group's columns (see `device_values`).
const DEVICE_COLS: &[&str] = &["reads", "writes", "read_bytes", "write_bytes", "flushes"];

/// What a cell reports from the samples.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub samples: u64,
    /// Transactions the sampler itself committed in the window (each of
    /// its statements is one): `commits` leaves them out.
    pub own_commits: f64,
    pub checkpoints: f64,
    /// (wait event, share of sampled active backends), most frequent first.
    pub top_waits: Vec<(String, f64)>,
    /// Every counter's change from `start` to `finish`, as `group.column`.
    pub totals: BTreeMap<String, f64>,
}

impl Summary {
    /// The change of `group.column` over the window; None if this server
    /// version does not have it.
    pub fn total(&self, key: &str) -> Option<f64> {
        self.totals.get(key).copied()
    }

    /// `time / count` over the window (e.g. ms per page read), None when
    /// the server has neither or nothing was counted.
    pub fn per(&self, time: &str, count: &str) -> Option<f64> {
        let (t, n) = (self.total(time)?, self.total(count)?);
        (n > 0.0).then_some(t / n)
    }

    /// Transactions the workload committed in the window (the database's
    /// commits less the sampler's own statements).
    pub fn commits(&self) -> Option<f64> {
        Some((self.total("database.xact_commit")? - self.own_commits).max(0.0))
    }

    /// The window's figures as every sampling kind reports them.
    pub fn internals(&self) -> Internals {
        let count = |k: &str| self.total(k).map(|v| v.max(0.0) as u64);
        Internals {
            commits: self.commits().map(|c| c as u64),
            page_writes: count("io.writes"),
            wal_writes: count("wal.wal_write"),
            device_reads: count("device.reads"),
            device_writes: count("device.writes"),
            device_read_bytes: count("device.read_bytes"),
            device_write_bytes: count("device.write_bytes"),
            device_flushes: count("device.flushes"),
            page_read_ms_avg: self.per("database.blk_read_time_ms", "database.blks_read"),
            blocks_read: count("database.blks_read"),
            wal_sync_ms_avg: self.per("wal.wal_sync_time_ms", "wal.wal_sync"),
            wal_syncs: count("wal.wal_sync"),
            checkpoints: self.checkpoints.max(0.0) as u64,
            wal_bytes: count("wal.wal_bytes"),
            top_wait_events: self
                .top_waits
                .iter()
                .map(|(event, share)| WaitShare {
                    event: event.clone(),
                    share: *share,
                })
                .collect(),
        }
    }
}

/// How a sampler samples: built with `Sampling::every_second`.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// The stat file of the block device the cluster has to itself
    /// (`Cluster::device_stat_file`), whose counters join each sample.
    pub device: Option<PathBuf>,
    pub interval: Duration,
    /// The window `finish` sums (totals, wait events) starts this long
    /// after the start (a snapshot of its own), where a driver's warm-up
    /// ends and it measures.
    pub warmup: Duration,
    /// The sampler outlives its server's crash: it connects again once the
    /// server is back, and the counters crash recovery reset continue from
    /// where they were (the activity between its last sample and the
    /// crash is not counted).
    pub survive_restarts: bool,
}

impl Sampling {
    /// A sample a second, the window from the start, a restart not
    /// survived.
    pub fn every_second(device: Option<PathBuf>) -> Sampling {
        Sampling {
            device,
            interval: Duration::from_secs(1),
            warmup: Duration::ZERO,
            survive_restarts: false,
        }
    }
}

impl Sampler {
    /// Starts sampling `server` as `how` says; samples stream from now on.
    pub async fn start(
        server: &Server,
        how: Sampling,
        events: mpsc::Sender<AgentMessage>,
        cell_id: String,
    ) -> Result<Sampler> {
        let Sampling {
            device,
            interval,
            warmup,
            survive_restarts,
        } = how;
        let mut client = server.connect().await?;
        let server = server.clone();
        let groups = groups(server.major);
        let stop = CancellationToken::new();
        let s = stop.clone();
        // The first snapshot before returning, so the samples (and without
        // a warm-up, the window) start here.
        let first = snapshot(&client, &groups, device.as_deref()).await?;
        // Each statement of the sampler's is one commit in the database's
        // count: those after the window's first read of pg_stat_database
        // (the first group) are the sampler's own.
        let per_snapshot = groups.len() as f64;
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut prev = first.clone();
            // The window's first snapshot, and the sampler's own commits
            // since (the statements after its pg_stat_database read).
            let mut base = (first, per_snapshot - 1.0);
            let mut in_window = warmup.is_zero();
            let mut waits: BTreeMap<String, f64> = BTreeMap::new();
            let mut samples = 0;
            let mut tick = tokio::time::interval(interval);
            // What counters reset by a crash recovery restart from.
            let mut offsets = Offsets::default();
            tick.tick().await;
            let warmed = tokio::time::sleep_until((started + warmup).into());
            tokio::pin!(warmed);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    // The measured window starts with a snapshot of its own.
                    _ = &mut warmed, if !in_window => {
                        base = (snapshot(&client, &groups, device.as_deref()).await?, per_snapshot - 1.0);
                        in_window = true;
                        continue;
                    }
                    _ = s.cancelled() => break,
                }
                let now = match snapshot(&client, &groups, device.as_deref()).await {
                    Ok(now) => offsets.adjust(now),
                    Err(_) if survive_restarts && client.is_closed() => {
                        let Some(c) = reconnect(&server, &s).await else {
                            break;
                        };
                        client = c;
                        let fresh = snapshot(&client, &groups, device.as_deref()).await?;
                        offsets.restarted(&prev, &fresh);
                        prev = offsets.adjust(fresh);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let mut data = serde_json::Map::new();
                data.insert("t".into(), json!(started.elapsed().as_secs_f64()));
                let sampled = groups.iter().map(|g| (g.name, g.cols));
                let device_group = device.is_some().then_some(("device", DEVICE_COLS));
                for (name, cols) in sampled.chain(device_group) {
                    let delta: serde_json::Map<String, Json> = cols
                        .iter()
                        .filter_map(|c| {
                            let key = format!("{name}.{c}");
                            Some((c.to_string(), json!(now.get(&key)? - prev.get(&key)?)))
                        })
                        .collect();
                    data.insert(name.into(), Json::Object(delta));
                }
                let w: BTreeMap<String, f64> = match client.query(WAITS, &[]).await {
                    Ok(rows) => rows
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, f64>(1)))
                        .collect(),
                    // The server crashed since the snapshot: the next tick
                    // reconnects.
                    Err(_) if survive_restarts => BTreeMap::new(),
                    Err(e) => return Err(e.into()),
                };
                // This tick's snapshot and wait events. (Stopped during the
                // warm-up, the window is all of it.)
                base.1 += per_snapshot + 1.0;
                if in_window {
                    for (k, v) in &w {
                        *waits.entry(k.clone()).or_default() += v;
                    }
                }
                data.insert("waits".into(), json!(w));
                let _ = events
                    .send(AgentMessage {
                        msg: Some(Msg::Sample(CellSample {
                            cell_id: cell_id.clone(),
                            kind: "pg_stat".into(),
                            data_json: Json::Object(data).to_string(),
                            seq: 0,
                        })),
                    })
                    .await;
                samples += 1;
                prev = now;
            }
            let last = match snapshot(&client, &groups, device.as_deref()).await {
                Ok(last) => offsets.adjust(last),
                // Its server went away at the end: the last sample stands.
                Err(_) if survive_restarts => prev,
                Err(e) => return Err(e),
            };
            let (base, own_commits) = base;
            let totals: BTreeMap<String, f64> = last
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v - base.get(k)?)))
                .collect();
            let d = |k: &str| totals.get(k).copied().unwrap_or(0.0);
            let total: f64 = waits.values().sum();
            let mut top: Vec<(String, f64)> = waits
                .into_iter()
                .map(|(k, v)| (k, v / total.max(1.0)))
                .collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top.truncate(5);
            Ok(Summary {
                samples,
                own_commits,
                checkpoints: d("bgwriter.checkpoints_timed") + d("bgwriter.checkpoints_req"),
                top_waits: top,
                totals,
            })
        });
        let sampler = Sampler { stop, task };
        crate::failpoint::hit("sampler")?;
        Ok(sampler)
    }

    pub async fn finish(mut self) -> Result<Summary> {
        self.stop.cancel();
        (&mut self.task)
            .await
            .map_err(|e| Error::Session(format!("sampler task: {e}")))?
    }
}

/// Per counter, what to add to the server's value: after a crash the
/// server's statistics start again from zero, and the window's counters
/// continue from their last sample.
#[derive(Default)]
struct Offsets(BTreeMap<String, f64>);

impl Offsets {
    fn adjust(&self, mut snap: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
        for (k, v) in snap.iter_mut() {
            *v += self.0.get(k).copied().unwrap_or(0.0);
        }
        snap
    }
    /// The server restarted: a counter now below its last (adjusted)
    /// value was reset, and continues from that value.
    fn restarted(&mut self, prev: &BTreeMap<String, f64>, fresh: &BTreeMap<String, f64>) {
        for (k, raw) in fresh {
            let before = self.0.get(k).copied().unwrap_or(0.0);
            if let Some(p) = prev.get(k)
                && raw + before < *p
            {
                self.0.insert(k.clone(), p - raw);
            }
        }
    }
}

/// Connects to `server` again (every 200 ms) until it accepts, or `stop`.
async fn reconnect(server: &Server, stop: &CancellationToken) -> Option<tokio_postgres::Client> {
    loop {
        if let Ok(c) = server.connect().await {
            return Some(c);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.cancelled() => return None,
        }
    }
}

/// Cumulative counters as `group.column` -> value, the device's (when it
/// can be read) as group `device`.
async fn snapshot(
    client: &tokio_postgres::Client,
    groups: &[Group],
    device: Option<&Path>,
) -> Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    for g in groups {
        let row = client.query_one(g.sql, &[]).await?;
        for (i, c) in g.cols.iter().enumerate() {
            m.insert(format!("{}.{c}", g.name), row.get::<_, f64>(i));
        }
    }
    if let Some(d) = device.and_then(DeviceStat::read) {
        for (c, v) in DEVICE_COLS.iter().zip(device_values(&d)) {
            m.insert(format!("device.{c}"), v as f64);
        }
    }
    Ok(m)
}

/// A device's counters in `DEVICE_COLS`' order.
fn device_values(d: &DeviceStat) -> [u64; 5] {
    [d.reads, d.writes, d.read_bytes, d.write_bytes, d.flushes]
}
