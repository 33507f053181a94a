//! `pgbench`: load the pgbench schema (`pgbench_init::load`), then run a
//! pgbench-style script with the built-in driver (`crate::driver`) and report
//! pgbench's figures, plus what PostgreSQL itself saw during the measured
//! window: average page read time (pg_stat_database, `track_io_timing`) and
//! WAL sync time per sync (pg_stat_wal, `track_wal_io_timing`).

use std::collections::HashMap;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use super::pgbench_init::{self, InitParams};
use super::{CellContext, Output, Point};
use crate::driver::script::{Script, Value};
use crate::driver::{self, DriverConfig};
use crate::sampler::Sampler;
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellProgress, agent_message::Msg};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub scale: u64,
    #[serde(default = "fillfactor")]
    pub fillfactor: u32,
    #[serde(default)]
    pub partitions: u32,
    #[serde(default)]
    pub load_connections: u32,
    /// A built-in script name; `script_text` wins when given.
    #[serde(default = "default_script")]
    pub script: String,
    #[serde(default)]
    pub script_text: Option<String>,
    #[serde(default = "one")]
    pub clients: u32,
    #[serde(default = "one")]
    pub threads: u32,
    #[serde(default)]
    pub duration_s: Option<f64>,
    #[serde(default)]
    pub transactions: Option<u64>,
    #[serde(default)]
    pub warmup_s: f64,
    #[serde(default)]
    pub rate: Option<f64>,
    #[serde(default)]
    pub latency_limit_ms: Option<f64>,
    #[serde(default = "max_tries")]
    pub max_tries: u32,
    #[serde(default)]
    pub defines: HashMap<String, Json>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// `pgfleet` (the built-in driver) or `pgbench` (the real binary, its
    /// per-transaction log turned into the same results).
    #[serde(default = "default_driver")]
    pub driver: String,
}

fn default_driver() -> String {
    "pgfleet".into()
}

fn fillfactor() -> u32 {
    100
}
fn default_script() -> String {
    "tpcb-like".into()
}
fn one() -> u32 {
    1
}
fn max_tries() -> u32 {
    10
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "pgbench".into(),
        message,
    }
}

pub fn run<'a>(ctx: &'a mut CellContext<'_>, params: &'a Json) -> BoxFuture<'a, Result<Output>> {
    async move {
        let p: Params = serde_json::from_value(params.clone()).map_err(|e| werr(format!("bad parameters: {e}")))?;
        let (name, text) = match &p.script_text {
            Some(t) => ("script".to_string(), t.clone()),
            None => (
                p.script.clone(),
                driver::builtin(&p.script)
                    .ok_or_else(|| werr(format!("unknown built-in script `{}`", p.script)))?
                    .to_string(),
            ),
        };
        let script = Script::parse(&name, &text).map_err(|e| werr(e.to_string()))?;
        if p.duration_s.is_none() == p.transactions.is_none() {
            return Err(werr("give exactly one of duration_s and transactions".into()));
        }

        let client = ctx.cluster.connect().await?;
        let init = InitParams {
            scale: p.scale,
            fillfactor: p.fillfactor,
            partitions: p.partitions,
            load_connections: p.load_connections,
        };
        let loaded = pgbench_init::load(ctx, &init).await?;
        client.batch_execute("CHECKPOINT").await?;

        let mut vars = HashMap::from([
            ("scale".to_string(), Value::Int(p.scale as i64)),
            ("naccounts".to_string(), Value::Int((p.scale * 100_000) as i64)),
        ]);
        for (k, v) in &p.defines {
            let val = match v {
                Json::Number(n) if n.is_i64() => Value::Int(n.as_i64().unwrap_or(0)),
                Json::Number(n) => Value::Double(n.as_f64().unwrap_or(0.0)),
                Json::Bool(b) => Value::Bool(*b),
                other => return Err(werr(format!("define `{k}`: {other} is not a number or boolean"))),
            };
            vars.insert(k.clone(), val);
        }
        let seed = p.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        });
        let cfg = DriverConfig {
            script,
            clients: p.clients.max(1),
            threads: p.threads.max(1),
            duration: p.duration_s.map(Duration::from_secs_f64),
            transactions: p.transactions,
            warmup: Duration::from_secs_f64(p.warmup_s.max(0.0)),
            rate: p.rate,
            latency_limit: p.latency_limit_ms.map(|ms| Duration::from_secs_f64(ms / 1000.0)),
            max_tries: p.max_tries.max(1),
            vars,
            seed,
        };

        let sampler = Sampler::start(ctx.cluster, Duration::from_secs(1), ctx.events.clone(), ctx.cell_id.clone()).await?;
        let (events, cell_id) = (ctx.events.clone(), ctx.cell_id.clone());
        let progress = move |done: f64, total: f64| {
            let _ = events.try_send(AgentMessage {
                msg: Some(Msg::Progress(CellProgress {
                    cell_id: cell_id.clone(),
                    phase: "measure".into(),
                    done: done as u64,
                    total: total as u64,
                    message: format!("{done:.0}/{total:.0} s"),
                })),
            });
        };
        let result = match p.driver.as_str() {
            "pgbench" => {
                progress(0.0, (cfg.warmup + cfg.duration.unwrap_or_default()).as_secs_f64());
                driver::pgbench_bin::run(&cfg, &text, &ctx.cluster.pg, &ctx.cluster.conninfo(), ctx.cluster.dir(), &ctx.cancel).await
            }
            "pgfleet" => {
                let (pg, cancel) = (ctx.cluster.pg_config(), ctx.cancel.clone());
                tokio::task::spawn_blocking(move || driver::run_blocking(cfg, pg, cancel, progress))
                    .await
                    .map_err(|e| werr(format!("driver thread: {e}")))?
            }
            other => return Err(werr(format!("unknown driver `{other}`: allowed pgfleet, pgbench"))),
        }
        .map_err(|e| if ctx.cancel.is_cancelled() { Error::Cancelled(e.0) } else { werr(e.0) })?;
        let internals = sampler.finish().await?;

        for (i, s) in result.per_second.iter().enumerate() {
            ctx.sample(
                "second",
                &json!({"second": i + 1, "tps": s.transactions,
                        "latency_ms_mean": if s.transactions > 0 { s.latency_sum_us as f64 / s.transactions as f64 / 1000.0 } else { f64::NAN },
                        "latency_ms_p50": s.quantile_us(0.5).map(|us| us / 1000.0),
                        "latency_ms_p99": s.quantile_us(0.99).map(|us| us / 1000.0),
                        "latency_ms_max": s.latency_max_us as f64 / 1000.0}),
            )
            .await?;
        }
        let h = &result.histogram;
        Ok(Output {
            points: vec![Point {
                params: json!({
                    "script": name, "driver": p.driver, "scale": p.scale, "clients": p.clients.max(1), "threads": p.threads.max(1),
                    "duration_s": p.duration_s, "transactions_per_client": p.transactions,
                    "rate": p.rate, "latency_limit_ms": p.latency_limit_ms, "warmup_s": p.warmup_s,
                }),
                metrics: json!({
                    "tps": result.tps(),
                    "latency_ms_mean": h.mean() / 1000.0,
                    "latency_ms_p50": result.latency_ms(0.5),
                    "latency_ms_p90": result.latency_ms(0.9),
                    "latency_ms_p99": result.latency_ms(0.99),
                    "latency_ms_p999": result.latency_ms(0.999),
                    "latency_ms_max": h.max() as f64 / 1000.0,
                    "transactions": result.transactions,
                    "failures": result.failures_total(),
                    "failures_by_class": result.failures,
                    "retries": result.retries,
                    "skipped": result.skipped,
                    "late": result.late,
                    "page_read_ms_avg": internals.per("database.blk_read_time_ms", "database.blks_read"),
                    "blocks_read": internals.total("database.blks_read"),
                    "wal_sync_ms_avg": internals.per("wal.wal_sync_time_ms", "wal.wal_sync"),
                    "wal_syncs": internals.total("wal.wal_sync"),
                    "checkpoints": internals.checkpoints,
                    "top_wait_events": internals.top_waits.iter()
                        .map(|(e, share)| json!({"event": e, "share": share})).collect::<Vec<_>>(),
                    "rows_loaded": loaded.rows,
                    "load_seconds": loaded.seconds,
                    "load_step_seconds": loaded.step_map(),
                }),
            }],
        })
    }
    .boxed()
}
