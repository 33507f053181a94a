//! The drive step, shared by every kind that runs a pgbench-style script:
//! the built-in driver (or the real pgbench) against a server, its live
//! seconds streamed as samples, the cluster's statistics sampled over the
//! measured window, and its per-second figures.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::context::CellContext;
use super::fault;
use crate::cluster::Server;
use crate::driver::script::{Script, Value, Var};
use crate::driver::{self, DriverConfig, DriverResult};
use crate::sampler::{Sampler, Sampling};
use crate::sandbox::Sandbox;
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellProgress, agent_message::Msg};
use tokio_util::sync::CancellationToken;

use pgfleet_proto::workload::Internals;
use pgfleet_proto::workload::fault::{FaultFigures, FaultKind};
pub use pgfleet_proto::workload::pgbench::{Define, DriveParams, Second};

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "pgbench".into(),
        message,
    }
}

/// Runs a driver script against `server`, the cell's own cluster (the
/// schema loaded at `scale`), sampling its statistics and its device's
/// over the measured window. Shared by every kind that drives a script;
/// the cell's `cancel` stops it.
pub async fn drive(
    ctx: &CellContext<'_>,
    server: &Server,
    d: &DriveParams,
    scale: u64,
) -> Result<Driven> {
    drive_until(ctx, server, ctx.cluster.device_stat_file(), d, scale, None).await
}

/// What a drive measured: the driver's result, the server's statistics
/// over the window, and each injected fault's figures.
pub struct Driven {
    pub result: DriverResult,
    pub internals: Internals,
    pub faults: Vec<FaultFigures>,
}

/// `drive` against any server (a peer's has no `device` here: its
/// device's I/Os are not the cell's cluster's), ended early when `stop`
/// fires (the built-in driver then returns what it measured until then).
/// The workload's faults act on the cell's own cluster.
pub async fn drive_until(
    ctx: &CellContext<'_>,
    server: &Server,
    device: Option<std::path::PathBuf>,
    d: &DriveParams,
    scale: u64,
    stop: Option<&tokio_util::sync::CancellationToken>,
) -> Result<Driven> {
    let text = d.text().map_err(werr)?.to_string();
    // Whatever the scenario's script can steer runs in here (see `sandbox`):
    // the real pgbench, and a shell the workload allows. pgfleet's driver
    // without a shell runs nothing outside the agent, so it makes none.
    let sandbox = if d.driver == "pgbench" || d.may_run_shell() {
        Some(Arc::new(Sandbox::for_cluster(ctx.cluster)?))
    } else {
        None
    };
    let crashes = d.faults.iter().any(|f| f.kind == FaultKind::Crash);
    // A fault that fails ends the driver early (its clients would wait
    // for a server that is not coming back).
    // `duration_s: auto` ends the driver early too, once steady.
    let ended = match (stop, d.faults.is_empty() && !d.until_steady) {
        (Some(s), _) => Some(s.child_token()),
        (None, false) => Some(CancellationToken::new()),
        (None, true) => None,
    };
    let mut cfg = driver_config(d, &text, scale, ended.as_ref(), sandbox.as_ref())?;
    cfg.reconnect = crashes;
    // What a crash must not take: the commits the server acknowledged.
    // Faults act on the cell's own cluster, the one driven then.
    cfg.ledger = crashes && driver::script_commits(&cfg.script);
    if cfg.ledger {
        super::ledger::prepare(ctx).await?;
    }
    let live = Arc::new(driver::Live::default());
    cfg.live = Some(live.clone());
    let sampler = Sampler::start(
        server,
        Sampling {
            warmup: cfg.warmup,
            survive_restarts: crashes,
            ..Sampling::every_second(device)
        },
        ctx.events.clone(),
        ctx.cell_id.clone(),
    )
    .await?;
    let phase: fault::Phase = Default::default();
    let phases_done = CancellationToken::new();
    let (result, (), injected, ()) = tokio::join!(
        async {
            let r = run_driver(
                ctx,
                server,
                cfg,
                &text,
                &d.driver,
                sandbox.as_deref(),
                (ended.as_ref(), &phase),
            )
            .await;
            phases_done.cancel();
            r
        },
        phase_spans(d.warmup_s, &phases_done),
        async {
            let r = fault::inject(ctx, &d.faults, &live, &phase, &phases_done).await;
            if r.is_err()
                && let Some(e) = &ended
            {
                e.cancel();
            }
            r
        },
        async {
            if let (true, Some(e)) = (d.until_steady, &ended) {
                until_steady(&live, e, &phases_done).await;
            }
        }
    );
    let injected = injected.map_err(fault::failed)?;
    let result = match result? {
        Ok(r) => r,
        Err(e) if ctx.cancel.is_cancelled() => return Err(Error::Cancelled(e.0)),
        Err(e) => return Err(werr(e.0)),
    };
    let mut faults = match live.start.get() {
        Some(window) => fault::figures(&injected, &result.per_second, *window),
        None => Vec::new(),
    };
    if let Some(ledger) = &result.ledger
        && faults.len() == injected.len()
    {
        let lost = super::ledger::lost(ctx, ledger).await?;
        super::ledger::attribute(&mut faults, &injected, ledger, &lost);
    }
    Ok(Driven {
        result,
        internals: sampler.finish().await?.internals(),
        faults,
    })
}

/// `duration_s: auto`: each second from `steady::MIN_SECONDS` into the
/// window on, judges the window so far (its whole seconds published at
/// least two seconds ago, so every client has reported them) and ends the
/// driver (`end`) once it is steady; returns when the driver is `done`.
async fn until_steady(live: &driver::Live, end: &CancellationToken, done: &CancellationToken) {
    use pgfleet_proto::workload::steady;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = done.cancelled() => return,
        }
        let Some(start) = live.start.get() else {
            continue;
        };
        let complete = start.elapsed().as_secs().saturating_sub(2) as usize;
        if complete < steady::MIN_SECONDS {
            continue;
        }
        let tps: Vec<f64> = live
            .totals(complete)
            .into_iter()
            .map(|t| t as f64)
            .collect();
        if tps.len() == complete && steady::drift(&tps).is_some_and(|d| d.steady) {
            tracing::info!(
                seconds = complete,
                "the window is steady: ending it (duration_s: auto)"
            );
            end.cancel();
            return;
        }
    }
}

/// The driver's configuration from the workload's parameters: the script
/// (parsed by pgfleet's driver; the real pgbench parses its own, which may
/// use what pgfleet's driver does not run), pgbench's variables and the
/// defines, the seed, and the shell's sandbox where the workload opted in.
fn driver_config(
    d: &DriveParams,
    text: &str,
    scale: u64,
    stop: Option<&tokio_util::sync::CancellationToken>,
    sandbox: Option<&Arc<Sandbox>>,
) -> Result<DriverConfig> {
    let script = if d.driver == "pgbench" {
        Script {
            name: d.script.clone(),
            commands: Vec::new(),
        }
    } else {
        Script::parse(&d.script, text).map_err(|e| werr(e.to_string()))?
    };
    if d.duration_s.is_none() == d.transactions.is_none() {
        return Err(werr(
            "give exactly one of duration_s and transactions".into(),
        ));
    }
    let mut vars = HashMap::from([
        ("scale".to_string(), Var::Value(Value::Int(scale as i64))),
        (
            "naccounts".to_string(),
            Var::Value(Value::Int((scale * 100_000) as i64)),
        ),
    ]);
    for (k, v) in &d.defines {
        let val = match v {
            Define::Int(i) => Var::Value(Value::Int(*i)),
            Define::Float(f) => Var::Value(Value::Double(*f)),
            Define::Bool(b) => Var::Value(Value::Bool(*b)),
            // Text as pgbench's -D keeps it: read when an expression
            // uses it (where text that is no value is "malformed").
            Define::Str(s) => Var::Text(s.as_str().into()),
        };
        vars.insert(k.clone(), val);
    }
    let seed = d.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_nanos() as u64)
            .unwrap_or(1)
    });
    Ok(DriverConfig {
        script,
        clients: d.clients.max(1),
        threads: d.threads.max(1),
        duration: d.duration_s.map(Duration::from_secs_f64),
        transactions: d.transactions,
        warmup: Duration::from_secs_f64(d.warmup_s.max(0.0)),
        rate: d.rate,
        latency_limit: d
            .latency_limit_ms
            .map(|ms| Duration::from_secs_f64(ms / 1000.0)),
        max_tries: d.max_tries.max(1),
        vars,
        // Checked at validation (a superset of both drivers' parsers);
        // checked again here, as the host is ours. Without the opt-in the
        // driver gets no sandbox for a shell, so none can run.
        shell: if d.may_run_shell() {
            if !d.allow_shell {
                return Err(werr(pgfleet_proto::workload::pgbench::SHELL_REFUSED.into()));
            }
            sandbox.cloned()
        } else {
            None
        },
        seed,
        stop_when: stop.cloned(),
        live: None,
        reconnect: false,
        ledger: false,
    })
}

/// Runs the driver `cfg` names (pgfleet's on a blocking thread, its
/// seconds reported live; or the real pgbench in the sandbox), reporting
/// progress. The outer error is the agent's; the inner, the driver's.
async fn run_driver(
    ctx: &CellContext<'_>,
    server: &Server,
    cfg: DriverConfig,
    text: &str,
    driver_name: &str,
    sandbox: Option<&Sandbox>,
    (stop, phase): (Option<&tokio_util::sync::CancellationToken>, &fault::Phase),
) -> Result<std::result::Result<DriverResult, driver::DriverError>> {
    let (events, cell_id, phase) = (ctx.events.clone(), ctx.cell_id.clone(), phase.clone());
    let progress = move |done: f64, total: f64| {
        let now = *phase.lock().unwrap_or_else(|e| e.into_inner());
        let _ = events.try_send(AgentMessage {
            msg: Some(Msg::Progress(CellProgress {
                cell_id: cell_id.clone(),
                phase: now.unwrap_or("measure").into(),
                done: done as u64,
                total: total as u64,
                message: format!("{done:.0}/{total:.0} s"),
            })),
        });
    };
    Ok(match driver_name {
        "pgbench" => {
            progress(
                0.0,
                (cfg.warmup + cfg.duration.unwrap_or_default()).as_secs_f64(),
            );
            if stop.is_some() {
                return Err(werr(
                    "driver: pgbench cannot be stopped early; use driver: pgfleet".into(),
                ));
            }
            driver::pgbench_bin::run(
                &cfg,
                text,
                &ctx.cluster.pg,
                &server.conninfo_without_password(),
                server.password().as_deref(),
                sandbox.ok_or_else(|| werr("no sandbox for pgbench".into()))?,
                &ctx.cancel,
            )
            .await
        }
        "pgfleet" => {
            let (pg, cancel) = (server.config.clone(), ctx.cancel.clone());
            let live = cfg.live.clone().unwrap_or_default();
            let mut cfg = cfg;
            cfg.live = Some(live.clone());
            let done = CancellationToken::new();
            let finished = done.clone();
            let run = async move {
                let r = tokio::task::spawn_blocking(move || {
                    driver::run_blocking(cfg, pg, cancel, progress)
                })
                .await;
                finished.cancel();
                r
            };
            let (r, reported) = tokio::join!(run, report_live(ctx, &live, &done));
            reported?;
            r.map_err(|e| werr(format!("driver thread: {e}")))?
        }
        other => {
            return Err(werr(format!(
                "unknown driver `{other}`: allowed pgfleet, pgbench"
            )));
        }
    })
}

/// The driver's phases as spans: `warm-up` for its first `warmup_s`, then
/// `measure` until `done` (siblings under the current span).
async fn phase_spans(warmup_s: f64, done: &CancellationToken) {
    let parent = tracing::Span::current();
    if warmup_s > 0.0 {
        let _warm = parent.in_scope(|| super::context::phase("warm-up"));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(warmup_s)) => {}
            _ = done.cancelled() => return,
        }
    }
    let _measure = parent.in_scope(|| super::context::phase("measure"));
    done.cancelled().await;
}

/// Sends the driver's live seconds as samples of kind `live` while it runs
/// (each about two seconds after it began, so its clients have published
/// it; a late part of a second is sent as another sample of that second),
/// and what is left once `done` fires.
async fn report_live(
    ctx: &CellContext<'_>,
    live: &driver::Live,
    done: &CancellationToken,
) -> Result<()> {
    loop {
        let last = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            _ = done.cancelled() => true,
        };
        let before = if last {
            None
        } else {
            Some(
                live.start
                    .get()
                    .map_or(0, |s| s.elapsed().as_secs().saturating_sub(1)),
            )
        };
        for (sec, l) in live.take(before) {
            ctx.sample("live", &live_json(sec, &l)).await?;
        }
        if last {
            return Ok(());
        }
    }
}

/// One live second as a sample: counts, the latency sum and maximum, and
/// the non-empty latency buckets (`[index, count]`, `buckets_per_octave`
/// log buckets per power of two of microseconds; see `SecondStat`).
pub fn live_json(sec: u64, l: &driver::LiveSecond) -> serde_json::Value {
    let buckets: Vec<[u64; 2]> = l
        .stat
        .buckets
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, c)| [i as u64, u64::from(*c)])
        .collect();
    serde_json::json!({
        "second": sec + 1,
        "transactions": l.stat.transactions,
        "failures": l.failures,
        "latency_sum_us": l.stat.latency_sum_us,
        "latency_max_us": l.stat.latency_max_us,
        "buckets_per_octave": driver::BUCKETS_PER_OCTAVE,
        "buckets": buckets,
    })
}

/// The run's per-second figures (samples of kind `second`).
pub fn per_second(result: &DriverResult) -> Vec<Second> {
    result
        .per_second
        .iter()
        .enumerate()
        .map(|(i, s)| Second {
            second: i as u64 + 1,
            tps: s.transactions,
            latency_ms_mean: (s.transactions > 0)
                .then(|| s.latency_sum_us as f64 / s.transactions as f64 / 1000.0),
            latency_ms_p50: s.quantile_us(0.5).map(|us| us / 1000.0),
            latency_ms_p99: s.quantile_us(0.99).map(|us| us / 1000.0),
            latency_ms_max: s.latency_max_us as f64 / 1000.0,
        })
        .collect()
}
