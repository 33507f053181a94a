//! The commit ledger under `crash` faults (see `driver::Ledger`): the
//! table the driver's clients write a row into in each transaction they
//! commit, made before the run; after it (the server recovered from every
//! crash), which acknowledged rows are gone, each counted against the
//! crash that took it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::context::CellContext;
use super::fault::Injected;
use crate::Result;
use crate::cluster::{SUPERUSER, WORKLOAD_ROLE};
use crate::driver::{LEDGER_TABLE, Ledger, UNACKNOWLEDGED};
use pgfleet_proto::workload::fault::{FaultFigures, FaultKind};

/// A ledger row's commit acknowledged this late after a kill still counts
/// against that crash: the reply was in the client's socket before it.
const ACK_AFTER_KILL: Duration = Duration::from_millis(100);

/// Makes the ledger's table afresh (a reused cluster may hold a run's
/// before): the agent's, in a schema of its own; the clients' role may
/// insert into it and do nothing else there. No index, no autovacuum:
/// an append the size of a few bytes per commit.
pub async fn prepare(ctx: &CellContext<'_>) -> Result<()> {
    let (schema, _) = LEDGER_TABLE.split_once('.').expect("a qualified name");
    ctx.cluster
        .connect()
        .await?
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE;
             CREATE SCHEMA {schema} AUTHORIZATION {SUPERUSER};
             REVOKE ALL ON SCHEMA {schema} FROM PUBLIC;
             GRANT USAGE ON SCHEMA {schema} TO {WORKLOAD_ROLE};
             CREATE TABLE {LEDGER_TABLE} (client int NOT NULL, seq bigint NOT NULL)
               WITH (autovacuum_enabled = off);
             GRANT INSERT ON {LEDGER_TABLE} TO {WORKLOAD_ROLE};"
        ))
        .await?;
    Ok(())
}

/// When each acknowledged commit whose row is not in the table was
/// acknowledged, in order. Rows the table holds that no client wrote
/// (a script may insert its own) are ignored.
pub async fn lost(ctx: &CellContext<'_>, ledger: &Ledger) -> Result<Vec<Instant>> {
    let mut present: HashMap<u32, Vec<bool>> = ledger
        .clients
        .iter()
        .map(|(id, acks)| (*id, vec![false; acks.len()]))
        .collect();
    let client = ctx.cluster.connect().await?;
    let rows = client
        .query_raw(
            &format!("SELECT client, seq FROM {LEDGER_TABLE}"),
            std::iter::empty::<i32>(),
        )
        .await?;
    futures::pin_mut!(rows);
    while let Some(row) = rows.next().await {
        let row = row?;
        let (c, seq): (i32, i64) = (row.get(0), row.get(1));
        if let (Ok(c), Ok(seq)) = (u32::try_from(c), usize::try_from(seq))
            && let Some(slot) = present.get_mut(&c).and_then(|p| p.get_mut(seq))
        {
            *slot = true;
        }
    }
    let mut out: Vec<Instant> = ledger
        .clients
        .iter()
        .flat_map(|(id, acks)| {
            let present = &present[id];
            acks.iter()
                .zip(present)
                .filter(|(ms, here)| **ms != UNACKNOWLEDGED && !**here)
                .map(|(ms, _)| ledger.t0 + Duration::from_millis(u64::from(*ms)))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Each crash's ledger figures: the commits acknowledged since the crash
/// before it (the run's start for the first) up to its kill, those of them
/// lost, and how long before the kill the earliest lost one was
/// acknowledged. A lost commit acknowledged after the last crash (which
/// no crash explains) counts against the last. `figures` and `injected`
/// are in the same order.
pub fn attribute(
    figures: &mut [FaultFigures],
    injected: &[Injected],
    ledger: &Ledger,
    lost: &[Instant],
) {
    let kills: Vec<(usize, Instant)> = injected
        .iter()
        .enumerate()
        .filter(|(_, i)| i.fault.kind == FaultKind::Crash)
        .map(|(k, i)| (k, i.start))
        .collect();
    let acks: Vec<Instant> = ledger
        .clients
        .iter()
        .flat_map(|(_, a)| a.iter())
        .filter(|ms| **ms != UNACKNOWLEDGED)
        .map(|ms| ledger.t0 + Duration::from_millis(u64::from(*ms)))
        .collect();
    let mut from: Option<Instant> = None;
    for (n, (k, kill)) in kills.iter().enumerate() {
        let to = *kill + ACK_AFTER_KILL;
        let last = n + 1 == kills.len();
        let within = |t: &Instant| from.is_none_or(|f| *t > f) && (last || *t <= to);
        let of_it: Vec<&Instant> = lost.iter().filter(|t| within(t)).collect();
        let f = &mut figures[*k];
        f.acknowledged = Some(acks.iter().filter(|t| within(t) && **t <= to).count() as u64);
        f.acknowledged_lost = Some(of_it.len() as u64);
        f.lost_window_ms = of_it
            .first()
            .map(|t| kill.saturating_duration_since(**t).as_secs_f64() * 1e3);
        from = Some(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfleet_proto::workload::fault::Fault;

    fn crash_at(t: Instant) -> Injected {
        let fault = Fault {
            kind: FaultKind::Crash,
            at_s: 0.0,
            duration_s: 0.0,
            iops: 0,
            mbps: 0,
            latency_ms: 0.0,
            recovery_timeout_s: 900.0,
        };
        Injected::new(fault, t, t + Duration::from_secs(1))
    }

    fn blank(kind: FaultKind) -> FaultFigures {
        FaultFigures::new(kind, String::new(), 0.0, 0.0)
    }

    #[test]
    fn each_lost_commit_counts_against_the_crash_that_followed_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two clients; crashes at 1 s and 3 s; client 0's seq 2 never
        // acknowledged (in flight at the first crash).
        let ledger = Ledger {
            t0,
            clients: vec![
                (0, vec![100, 900, UNACKNOWLEDGED, 2_000, 2_950]),
                (1, vec![500, 1_050, 2_990, 3_500]),
            ],
        };
        // Lost: 900 (the first crash's, 100 ms before it), 1,050 (acked
        // 50 ms after the kill: still the first's), 2,950 (the second's),
        // and 3,500 (after every crash: counted against the last).
        let lost = vec![at(900), at(1_050), at(2_950), at(3_500)];
        let stall = blank(FaultKind::Stall);
        let mut figures = vec![blank(FaultKind::Crash), stall, blank(FaultKind::Crash)];
        let injected = vec![
            crash_at(at(1_000)),
            crash_at(at(2_000)),
            crash_at(at(3_000)),
        ];
        let mut injected = injected;
        injected[1].fault.kind = FaultKind::Stall;
        attribute(&mut figures, &injected, &ledger, &lost);
        assert_eq!(figures[0].acknowledged, Some(4), "100, 900, 500, 1,050");
        assert_eq!(figures[0].acknowledged_lost, Some(2));
        assert!((figures[0].lost_window_ms.unwrap() - 100.0).abs() < 1e-6);
        assert_eq!(
            figures[1].acknowledged_lost, None,
            "a stall has no ledger figure"
        );
        assert_eq!(
            figures[2].acknowledged,
            Some(3),
            "2,000, 2,950, 2,990 (3,500 is after it)"
        );
        assert_eq!(figures[2].acknowledged_lost, Some(2));
        assert!((figures[2].lost_window_ms.unwrap() - 50.0).abs() < 1e-6);
    }

    #[test]
    fn nothing_lost_is_zero_not_absent() {
        let t0 = Instant::now();
        let ledger = Ledger {
            t0,
            clients: vec![(0, vec![10, 20])],
        };
        let mut figures = vec![blank(FaultKind::Crash)];
        attribute(
            &mut figures,
            &[crash_at(t0 + Duration::from_secs(1))],
            &ledger,
            &[],
        );
        assert_eq!(figures[0].acknowledged, Some(2));
        assert_eq!(figures[0].acknowledged_lost, Some(0));
        assert_eq!(figures[0].lost_window_ms, None);
    }
}
