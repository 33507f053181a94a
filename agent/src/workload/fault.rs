//! Faults while a script runs (`faults:`, see `pgfleet_proto::workload::fault`):
//! a task beside the driver on the measured window's clock that injects
//! each fault in turn, marks it in the timeline (a `fault` sample at its
//! start and end; the cell's phase `fault:<kind>` meanwhile, which the
//! dashboards annotate), and, once the driver is done, the figures of how
//! the server and the clients came back, from the driver's seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::context::CellContext;
use crate::driver::{self, SecondStat};
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellProgress, agent_message::Msg};
use pgfleet_proto::workload::fault::{Fault, FaultFigures, FaultKind, STALL_IOPS};

/// The cell's phase while a fault runs (None: `measure`), shared with the
/// driver's progress reports.
pub type Phase = Arc<std::sync::Mutex<Option<&'static str>>>;

/// A fault as it happened (instants on the agent's clock).
#[derive(Debug, Clone)]
pub struct Injected {
    pub fault: Fault,
    pub start: Instant,
    pub end: Instant,
    pub recovery_s: Option<f64>,
    pub wal_replayed_bytes: Option<u64>,
    pub redo_s: Option<f64>,
    pub first_transaction: Option<Instant>,
    pub checkpoint_s: Option<f64>,
    pub buffers_written: Option<u64>,
}

impl Injected {
    /// `fault` from `start` to `end`, with no figure of a kind yet.
    pub fn new(fault: Fault, start: Instant, end: Instant) -> Injected {
        Injected {
            fault,
            start,
            end,
            recovery_s: None,
            wal_replayed_bytes: None,
            redo_s: None,
            first_transaction: None,
            checkpoint_s: None,
            buffers_written: None,
        }
    }
}

pub(crate) fn phase_name(k: FaultKind) -> &'static str {
    match k {
        FaultKind::Crash => "fault:crash",
        FaultKind::Checkpoint => "fault:checkpoint",
        FaultKind::Stall => "fault:stall",
        FaultKind::Degrade => "fault:degrade",
        FaultKind::Partition => "fault:partition",
    }
}

/// Injects `faults` in order, each `at_s` after the driver's measured
/// window started (or once the one before ended, if later), until `done`
/// (the driver finished). A fault that fails (the server did not come
/// back) ends the injection with the server's reason.
pub async fn inject(
    ctx: &CellContext<'_>,
    faults: &[Fault],
    live: &driver::Live,
    phase: &Phase,
    done: &CancellationToken,
) -> Result<Vec<Injected>> {
    let mut out = Vec::new();
    if faults.is_empty() {
        return Ok(out);
    }
    // The window starts once every client is connected.
    let window = loop {
        if let Some(s) = live.start.get() {
            break *s;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            _ = over(ctx, done) => return Ok(out),
        }
    };
    for f in faults {
        tokio::select! {
            _ = tokio::time::sleep_until((window + Duration::from_secs_f64(f.at_s)).into()) => {}
            _ = over(ctx, done) => break,
        }
        let name = phase_name(f.kind);
        set_phase(ctx, phase, Some(name));
        let start = Instant::now();
        mark(ctx, f, "start", start.duration_since(window).as_secs_f64()).await;
        let span = super::context::phase(name);
        let r = {
            let _in = span.enter();
            tracing::info!(cell = %ctx.cell_id, fault = %f.label(), "injecting a fault");
            drop(_in);
            run_one(ctx, f, live, start, done).await
        };
        drop(span);
        set_phase(ctx, phase, None);
        let injected = r?;
        mark(
            ctx,
            f,
            "end",
            injected.end.duration_since(window).as_secs_f64(),
        )
        .await;
        out.push(injected);
    }
    Ok(out)
}

async fn run_one(
    ctx: &CellContext<'_>,
    f: &Fault,
    live: &driver::Live,
    start: Instant,
    done: &CancellationToken,
) -> Result<Injected> {
    let mut i = Injected::new(f.clone(), start, start);
    match f.kind {
        FaultKind::Crash => {
            // Cancelled meanwhile: the cell's teardown stops whatever
            // server the crash had started.
            let c = tokio::select! {
                c = ctx.cluster.crash(Duration::from_secs_f64(f.recovery_timeout_s)) => c?,
                _ = ctx.cancel.cancelled() => {
                    return Err(Error::Cancelled("cancelled during a crash's recovery".into()));
                }
            };
            i.start = c.killed;
            i.end = c.accepting;
            i.recovery_s = Some(c.accepting.duration_since(c.killed).as_secs_f64());
            i.wal_replayed_bytes = c.wal_replayed_bytes;
            i.redo_s = c.redo_s;
            // The clients' first commit on the new server.
            let before = live.committed.load(std::sync::atomic::Ordering::Relaxed);
            loop {
                if live.committed.load(std::sync::atomic::Ordering::Relaxed) > before {
                    i.first_transaction = Some(Instant::now());
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                    _ = over(ctx, done) => break,
                }
            }
        }
        FaultKind::Checkpoint => {
            let client = ctx.cluster.connect().await?;
            let major = ctx.cluster.server().major;
            let sql = if major >= 17 {
                "SELECT buffers_written::float8 FROM pg_stat_checkpointer"
            } else {
                "SELECT buffers_checkpoint::float8 FROM pg_stat_bgwriter"
            };
            let written = |row: tokio_postgres::Row| row.get::<_, f64>(0);
            let before = written(client.query_one(sql, &[]).await?);
            let t = Instant::now();
            client.batch_execute("CHECKPOINT").await?;
            i.end = Instant::now();
            i.checkpoint_s = Some(i.end.duration_since(t).as_secs_f64());
            // The checkpointer reports its counts as it finishes.
            let mut after = before;
            for _ in 0..20 {
                after = written(client.query_one(sql, &[]).await?);
                if after > before {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            i.buffers_written = Some((after - before).max(0.0) as u64);
        }
        FaultKind::Partition => {
            return Err(Error::Workload {
                workload: "pgbench".into(),
                message: "a partition cuts the roles of a logical-drain cell; a script has none"
                    .into(),
            });
        }
        FaultKind::Stall | FaultKind::Degrade => {
            let mut caps = ctx.cluster.spec_caps();
            if f.kind == FaultKind::Stall {
                caps.read_iops = STALL_IOPS;
                caps.write_iops = STALL_IOPS;
            } else {
                if f.iops > 0 {
                    caps.read_iops = f.iops;
                    caps.write_iops = f.iops;
                }
                if f.mbps > 0 {
                    caps.read_mbps = f.mbps;
                    caps.write_mbps = f.mbps;
                }
                if f.latency_ms > 0.0 {
                    let us = (f.latency_ms * 1000.0).round() as u32;
                    caps.latency.read_us = us;
                    caps.latency.write_us = us;
                }
            }
            let window = ctx.cluster.caps_window(caps)?;
            // Failing here, with the fault's caps on, proves the guard
            // puts them back on an error too.
            crate::failpoint::hit("fault")?;
            // Cancelled (the cell, or the driver ended): the guard's drop
            // puts the caps back all the same.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(f.duration_s)) => {}
                _ = over(ctx, done) => {}
            }
            window.restore()?;
            i.end = Instant::now();
        }
    }
    Ok(i)
}

/// Resolves when the driver is done or the cell is cancelled.
pub(crate) async fn over(ctx: &CellContext<'_>, done: &CancellationToken) {
    tokio::select! {
        _ = done.cancelled() => {}
        _ = ctx.cancel.cancelled() => {}
    }
}

/// The cell's phase for the dashboards and the progress bar.
pub(crate) fn set_phase(ctx: &CellContext<'_>, phase: &Phase, now: Option<&'static str>) {
    *phase.lock().unwrap_or_else(|e| e.into_inner()) = now;
    let _ = ctx.events.try_send(AgentMessage {
        msg: Some(Msg::Progress(CellProgress {
            cell_id: ctx.cell_id.clone(),
            phase: now.unwrap_or("measure").into(),
            done: 0,
            total: 0,
            message: now.map_or("fault over".into(), |p| p.to_string()),
        })),
    });
}

/// A `fault` sample: the fault's start or end, seconds into the window.
pub(crate) async fn mark(ctx: &CellContext<'_>, f: &Fault, event: &str, at_s: f64) {
    let _ = ctx
        .sample(
            "fault",
            &serde_json::json!({
                "event": event,
                "kind": f.kind,
                "label": f.label(),
                "at_s": at_s,
            }),
        )
        .await;
}

/// Seconds before a fault that are its baseline, and after its end that
/// are its "after".
const AROUND_S: usize = 10;
/// Back when a second reaches this share of the baseline's TPS.
const BACK_SHARE: f64 = 0.9;

/// The figures of each injected fault from the driver's seconds (index 0
/// is the window's first second); `window` is when the window started.
pub fn figures(
    injected: &[Injected],
    seconds: &[SecondStat],
    window: Instant,
) -> Vec<FaultFigures> {
    let tps = |s: usize| seconds.get(s).map_or(0.0, |x| x.transactions as f64);
    let p99 = |from: usize, to: usize| {
        let mut m = SecondStat::default();
        for s in seconds.iter().take(to).skip(from) {
            m.merge(s);
        }
        m.quantile_us(0.99).map(|us| us / 1000.0)
    };
    let at = |t: Instant| t.saturating_duration_since(window).as_secs_f64();
    injected
        .iter()
        .map(|i| {
            let (start_s, end_s) = (at(i.start), at(i.end));
            let first = start_s.floor() as usize;
            let base_from = first.saturating_sub(AROUND_S);
            let baseline = if first > base_from {
                (base_from..first).map(tps).sum::<f64>() / (first - base_from) as f64
            } else {
                0.0
            };
            // The seconds mostly within the fault: from its start's to the
            // last that began more than half a second before its end (a
            // second barely touched belongs to after; the transactions a
            // stall held count in the second they were due).
            let last = (((end_s - 0.5).ceil().max(0.0)) as usize).max(first + 1);
            let during = (first..last).map(tps).sum::<f64>() / (last - first) as f64;
            let back = (end_s.ceil() as usize..seconds.len())
                .find(|&s| tps(s) >= BACK_SHARE * baseline && baseline > 0.0);
            let lost_to = back.unwrap_or(seconds.len());
            let lost = (first..lost_to).map(|s| baseline - tps(s)).sum::<f64>();
            FaultFigures {
                baseline_tps: baseline,
                tps_during: Some(during),
                latency_ms_p99_during: p99(first, last),
                latency_ms_p99_after: p99(last, last + AROUND_S),
                back_to_90pct_s: back.map(|s| (s as f64 - start_s).max(0.0)),
                transactions_lost: lost.max(0.0),
                recovery_s: i.recovery_s,
                wal_replayed_bytes: i.wal_replayed_bytes,
                redo_s: i.redo_s,
                first_transaction_s: i
                    .first_transaction
                    .map(|t| t.duration_since(i.start).as_secs_f64()),
                checkpoint_s: i.checkpoint_s,
                buffers_written: i.buffers_written,
                ..FaultFigures::new(i.fault.kind, i.fault.label(), start_s, end_s)
            }
        })
        .collect()
}

/// A fault's failure as the cell's: the server's reason is in it.
pub fn failed(e: Error) -> Error {
    match e {
        Error::Cancelled(_) => e,
        other => Error::Workload {
            workload: "pgbench".into(),
            message: format!("a fault failed the cell: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(n: u64, us: u64) -> SecondStat {
        let mut s = SecondStat::default();
        for _ in 0..n {
            s.record(us);
        }
        s
    }

    #[test]
    fn a_crash_is_measured_from_the_seconds_around_it() {
        // 100 tx/s at 1 ms for 10 s, a crash at 10.2 s back at 11.4 s:
        // 20 slow ones in second 10, 40 in second 11, then 95 tx/s.
        let mut secs: Vec<SecondStat> = (0..10).map(|_| second(100, 1000)).collect();
        secs.push(second(20, 50_000));
        secs.push(second(40, 1000));
        secs.extend((0..8).map(|_| second(95, 1000)));
        let w = Instant::now();
        let at = |s: f64| w + Duration::from_secs_f64(s);
        let fault = Fault {
            kind: FaultKind::Crash,
            at_s: 10.0,
            duration_s: 0.0,
            iops: 0,
            mbps: 0,
            latency_ms: 0.0,
            recovery_timeout_s: 900.0,
        };
        let f = figures(
            &[Injected {
                recovery_s: Some(1.2),
                wal_replayed_bytes: Some(1 << 20),
                redo_s: Some(0.3),
                first_transaction: Some(at(11.5)),
                ..Injected::new(fault, at(10.2), at(11.4))
            }],
            &secs,
            w,
        );
        let f = &f[0];
        assert_eq!(f.baseline_tps, 100.0);
        assert_eq!(f.tps_during, Some(20.0), "second 10 (11 is mostly after)");
        assert!((f.back_to_90pct_s.unwrap() - 1.8).abs() < 1e-9, "second 12");
        assert_eq!(f.transactions_lost, 140.0);
        assert!((f.first_transaction_s.unwrap() - 1.3).abs() < 1e-9);
        assert!(f.latency_ms_p99_during.unwrap() > 40.0);
        assert!(f.latency_ms_p99_after.unwrap() < 1.1);
    }

    #[test]
    fn a_fault_never_recovered_from_loses_the_rest() {
        let mut secs: Vec<SecondStat> = (0..5).map(|_| second(50, 1000)).collect();
        secs.extend((0..5).map(|_| second(10, 1000)));
        let w = Instant::now();
        let fault = Fault {
            kind: FaultKind::Stall,
            at_s: 5.0,
            duration_s: 2.0,
            iops: 0,
            mbps: 0,
            latency_ms: 0.0,
            recovery_timeout_s: 900.0,
        };
        let f = &figures(
            &[Injected::new(
                fault,
                w + Duration::from_secs(5),
                w + Duration::from_secs(7),
            )],
            &secs,
            w,
        )[0];
        assert_eq!(f.back_to_90pct_s, None);
        assert_eq!(f.transactions_lost, 200.0);
        assert_eq!(f.label, "stall 2 s at 5 s");
    }
}
