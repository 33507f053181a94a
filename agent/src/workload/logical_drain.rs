//! `logical-drain`: two roles on two agents. The publisher's agent serves
//! its cluster (set up by the kind's settings: `wal_level = logical`, ...)
//! until released. The subscriber's agent, the lead, drives the whole
//! measurement over SQL connections to both clusters, as a replication
//! client would:
//!
//! 1. Wait for the publisher's endpoint (relayed by the controller): its
//!    agent reports it once its cluster holds pgbench's tables, the cell's
//!    dataset (restored from the dataset store or loaded there, with the
//!    load's figures), so this wait has no bound of its own: a publisher
//!    that fails ends the cell.
//! 2. Create the same tables with their keys in its own cluster, plus a
//!    one-row marker table on both: loaded like the publisher's when the
//!    load is direct (the same rows: pgbench's are determined by the keys),
//!    empty otherwise.
//! 3. Publication on the publisher, subscription here over the relayed
//!    endpoint; wait for the initial sync (nothing to copy after a direct
//!    load: `copy_data = false`). Its seconds include the subscriber's load.
//! 4. `ALTER SUBSCRIPTION ... DISABLE` (apply paused, the slot keeps WAL),
//!    then random UPDATEs on the publisher until the slot retains the target
//!    backlog (`pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)`);
//!    then one marker row committed after the backlog.
//! 5. `ALTER SUBSCRIPTION ... ENABLE`, timed until the marker is visible
//!    here (apply is in commit order, so the whole backlog is applied),
//!    sampling the lag every second.
//! 6. Row count and an order-independent checksum of pgbench_accounts on
//!    both sides; spill statistics; subscription, slot and publication
//!    dropped on every path that reaches the clusters.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_postgres::Client;

use super::context::{CellContext, Output};
use super::drive::{DriveParams, drive_until};
use super::fault;
use super::pgbench_init;
use crate::cluster::Server;
use crate::{Error, Result};
use pgfleet_proto::workload::Point;
use pgfleet_proto::workload::fault::{Fault, FaultFigures, FaultKind, FaultMetrics};
pub use pgfleet_proto::workload::logical_drain::{
    Lag, Metrics, NAME, PUBLISHER, Params, PointParams, SUBSCRIBER,
};
use tokio_util::sync::CancellationToken;

/// The marker table (named with its schema: the agent's superuser sessions
/// search pg_catalog only).
const MARKER: &str = "public.pgfleet_drain_marker";

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        match ctx.role.as_str() {
            PUBLISHER => {
                // The subscriber drives its backlog as the workload role.
                ctx.cluster.hand_over().await?;
                ctx.serve_until_released().await
            }
            SUBSCRIBER => {
                let publisher = ctx.peer(PUBLISHER).await?;
                let loaded: pgbench_init::Metrics = serde_json::from_str(&publisher.loaded_json)
                    .map_err(|e| Error::Peer {
                        role: PUBLISHER.into(),
                        message: format!("its cluster came without pgbench's load figures: {e}"),
                    })?;
                // A direct load fills the subscriber as the publisher was
                // filled (pgbench's rows are determined by the keys): its
                // seconds count as the initial sync's.
                let preloaded = if p.init.load_method == pgbench_init::LoadMethod::Direct {
                    ctx.progress("sync", 0, 1, "loading the subscriber's tables directly");
                    Some(pgbench_init::load(ctx, &p.init).await?.seconds)
                } else {
                    None
                };
                // The publisher may run another major version than this
                // subscriber: its own, read once connected.
                let mut driven = Server::of_workload(&publisher, 0);
                let mut publisher = Server::of(&publisher, 0);
                let here = ctx.cluster.connect().await?;
                let there = publisher.connect().await.map_err(|e| Error::Peer {
                    role: PUBLISHER.into(),
                    message: format!(
                        "cannot connect to {}: {e}",
                        publisher.conninfo_without_password()
                    ),
                })?;
                let major: i32 = there
                    .query_one(
                        "SELECT current_setting('server_version_num')::int / 10000",
                        &[],
                    )
                    .await?
                    .get(0);
                publisher.major = major.max(0) as u32;
                driven.major = publisher.major;
                let measured = measure(
                    ctx, p, &publisher, &driven, loaded, &here, &there, preloaded,
                )
                .await;
                // Whatever happened, leave no subscription, slot or
                // publication behind (a slot pins the publisher's WAL).
                let cleanup = drop_replication(&here, &there).await;
                let out = measured?;
                cleanup?;
                Ok(out)
            }
            other => Err(werr(format!(
                "unknown role `{other}`: allowed {SUBSCRIBER}, {PUBLISHER}"
            ))),
        }
    }
    .boxed()
}

/// An error of a statement run on the publisher's cluster.
fn on_publisher(e: tokio_postgres::Error) -> Error {
    Error::Peer {
        role: PUBLISHER.into(),
        message: crate::pg_text(&e),
    }
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "logical-drain".into(),
        message,
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    ctx: &CellContext<'_>,
    p: &Params,
    publisher: &Server,
    // The publisher as its workload role: the backlog's writer.
    driven: &Server,
    loaded: pgbench_init::Metrics,
    here: &Client,
    there: &Client,
    preloaded: Option<f64>,
) -> Result<Output> {
    let timeout = Duration::from_secs_f64(p.timeout_s);
    let initial_sync_seconds =
        subscribe(ctx, p, publisher, here, there, timeout, preloaded).await?;
    let backlog = build_backlog(ctx, p, driven, here, there, timeout).await?;
    let drained = drain(ctx, p, &backlog, (here, there), publisher, timeout).await?;

    // Both sides at once: each scans its own cluster.
    let (h, t) = tokio::join!(checksum(here), checksum(there));
    let ((rows_here, sum_here), (rows_there, sum_there)) = (h?, t?);
    let spill = there
        .query_opt(
            "SELECT spill_txns, spill_bytes, stream_txns, total_txns, total_bytes \
             FROM pg_stat_replication_slots WHERE slot_name = $1",
            &[&NAME],
        )
        .await
        .ok()
        .flatten();
    let stat = |i: usize| spill.as_ref().map(|r| r.get::<_, i64>(i).max(0) as u64);
    Ok(Output::of(&[Point {
        params: PointParams {
            scale: p.init.scale,
            backlog_target_bytes: p.backlog_bytes,
            clients: p.clients,
            faults: p.faults.clone(),
        },
        metrics: Metrics {
            backlog_bytes: backlog.bytes,
            backlog_target_bytes: p.backlog_bytes,
            backlog_seconds: backlog.seconds,
            backlog_transactions: backlog.transactions,
            drain_seconds: drained.seconds,
            drain_mb_per_s: backlog.bytes as f64 / (1 << 20) as f64 / drained.seconds.max(1e-9),
            initial_sync_seconds,
            rows_match: rows_here == rows_there && sum_here == sum_there,
            rows: rows_here,
            spill_txns: stat(0),
            spill_bytes: stat(1),
            stream_txns: stat(2),
            total_txns: stat(3),
            total_bytes: stat(4),
            internals: drained.internals,
            load: loaded,
            fault_metrics: FaultMetrics::of(&drained.faults),
            faults: drained.faults,
        },
    }]))
}

/// Steps 2-3: the subscriber's empty tables, the marker on both sides, the
/// publication and the subscription; returns the initial sync's seconds.
async fn subscribe(
    ctx: &CellContext<'_>,
    p: &Params,
    publisher: &Server,
    here: &Client,
    there: &Client,
    timeout: Duration,
    preloaded: Option<f64>,
) -> Result<f64> {
    // The subscriber's tables: loaded already when the load is direct
    // (`run`; the subscription then copies nothing), else pgbench's schema
    // with its keys and no rows, which the initial sync fills through one
    // COPY.
    let started = Instant::now();
    if preloaded.is_none() {
        for stmt in pgbench_init::ddl(&p.init) {
            here.batch_execute(&stmt).await?;
        }
        here.batch_execute(
            "ALTER TABLE public.pgbench_accounts ADD PRIMARY KEY (aid); \
             ALTER TABLE public.pgbench_branches ADD PRIMARY KEY (bid); \
             ALTER TABLE public.pgbench_tellers ADD PRIMARY KEY (tid)",
        )
        .await?;
    }
    let marker = format!("CREATE TABLE {MARKER} (id int PRIMARY KEY, at timestamptz)");
    here.batch_execute(&marker).await?;
    there.batch_execute(&marker).await.map_err(on_publisher)?;
    there
        .batch_execute(&format!(
            "CREATE PUBLICATION {NAME} FOR TABLE public.pgbench_accounts, {MARKER}"
        ))
        .await
        .map_err(on_publisher)?;

    ctx.progress("sync", 0, 1, "initial sync");
    here.batch_execute(&format!(
        "CREATE SUBSCRIPTION {NAME} CONNECTION '{}' PUBLICATION {NAME} WITH (copy_data = {})",
        publisher.conninfo.replace('\'', "''"),
        preloaded.is_none()
    ))
    .await?;
    wait(ctx, timeout, "the initial sync", || async {
        let n: i64 = here
            .query_one(
                "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'",
                &[],
            )
            .await?
            .get(0);
        Ok(n == 0)
    })
    .await?;
    Ok(started.elapsed().as_secs_f64() + preloaded.unwrap_or(0.0))
}

/// The backlog the slot retained, ending at `target`, the publisher's WAL
/// position after the marker.
struct Backlog {
    bytes: u64,
    seconds: f64,
    transactions: u64,
    target: String,
}

/// Step 4: apply paused, random UPDATEs on the publisher until its slot
/// retains the target backlog, then the marker committed after it.
async fn build_backlog(
    ctx: &CellContext<'_>,
    p: &Params,
    driven: &Server,
    here: &Client,
    there: &Client,
    timeout: Duration,
) -> Result<Backlog> {
    // Pause apply; the slot now keeps every WAL byte the publisher writes.
    here.batch_execute(&format!("ALTER SUBSCRIPTION {NAME} DISABLE"))
        .await?;
    wait(ctx, timeout, "the subscription to stop", || async {
        let active: bool = there
            .query_one(
                "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1",
                &[&NAME],
            )
            .await.map_err(on_publisher)?
            .get(0);
        Ok(!active)
    })
    .await?;

    let started = Instant::now();
    let stop = tokio_util::sync::CancellationToken::new();
    let drive = DriveParams {
        script: "random-update".into(),
        script_text: None,
        clients: p.clients,
        threads: p.threads,
        duration_s: Some(p.timeout_s),
        transactions: None,
        warmup_s: 0.0,
        rate: None,
        latency_limit_ms: None,
        max_tries: 10,
        defines: Default::default(),
        seed: None,
        driver: "pgfleet".into(),
        allow_shell: false,
        faults: Vec::new(),
        until_steady: false,
    };
    let builder = drive_until(ctx, driven, None, &drive, p.init.scale, Some(&stop));
    tokio::pin!(builder);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let driven = loop {
        tokio::select! {
            r = &mut builder => break r.map_err(|e| match e {
                Error::Cancelled(_) => e,
                other => Error::Peer { role: PUBLISHER.into(), message: format!("building the backlog: {other}") },
            })?,
            _ = tick.tick() => {
                let retained = slot_lag(there, None).await?;
                ctx.progress("backlog", retained.min(p.backlog_bytes), p.backlog_bytes, format!("{} MiB retained", retained >> 20));
                if retained >= p.backlog_bytes {
                    stop.cancel();
                }
            }
        }
    };
    if !stop.is_cancelled() {
        return Err(werr(format!(
            "the backlog did not reach {} bytes within timeout_s = {} s (raise timeout_s or clients)",
            p.backlog_bytes, p.timeout_s
        )));
    }
    let seconds = started.elapsed().as_secs_f64();
    // The marker commits after the whole backlog: seeing it here means
    // everything before it was applied.
    there
        .batch_execute(&format!("INSERT INTO {MARKER} VALUES (1, now())"))
        .await
        .map_err(on_publisher)?;
    let target: String = there
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(on_publisher)?
        .get(0);
    Ok(Backlog {
        bytes: slot_lag(there, Some(&target)).await?,
        seconds,
        transactions: driven.result.transactions,
        target,
    })
}

struct Drained {
    seconds: f64,
    internals: pgfleet_proto::workload::Internals,
    faults: Vec<FaultFigures>,
}

/// Step 5: apply resumed, timed until the marker is visible here, the lag
/// sampled every second (one sample each side of the drain at least).
async fn drain(
    ctx: &CellContext<'_>,
    p: &Params,
    backlog: &Backlog,
    (here, there): (&Client, &Client),
    publisher: &Server,
    timeout: Duration,
) -> Result<Drained> {
    let target = backlog.target.as_str();
    let sampler = ctx.sample_own_cluster().await?;
    let t0 = Instant::now();
    here.batch_execute(&format!("ALTER SUBSCRIPTION {NAME} ENABLE"))
        .await?;
    // The lag series starts at the whole backlog and (below) ends drained,
    // however short the drain.
    ctx.sample(
        "lag",
        &Lag {
            second: 0.0,
            lag_bytes: received_lag(here, target).await?,
            slot_lag_bytes: backlog.bytes,
        },
    )
    .await?;
    let phase: fault::Phase = Default::default();
    let done = CancellationToken::new();
    let (seconds, cuts) = tokio::join!(
        async {
            let r = apply_until_marker(ctx, p, backlog, (here, there), t0, timeout, &phase).await;
            done.cancel();
            r
        },
        partitions(
            ctx,
            &p.faults,
            publisher,
            (here, there),
            target,
            t0,
            (&phase, &done)
        ),
    );
    let seconds = seconds?;
    let drained_at = t0 + Duration::from_secs_f64(seconds);
    let faults = cuts?
        .into_iter()
        .map(|c| FaultFigures {
            lag_bytes_at_heal: Some(c.lag_at_heal),
            catch_up_s: Some(drained_at.saturating_duration_since(c.healed).as_secs_f64()),
            ..FaultFigures::new(
                FaultKind::Partition,
                c.fault.label(),
                c.start.duration_since(t0).as_secs_f64(),
                c.healed.duration_since(t0).as_secs_f64(),
            )
        })
        .collect();
    ctx.sample("lag", &lag_at(here, there, target, seconds).await?)
        .await?;
    Ok(Drained {
        seconds,
        internals: sampler.finish().await?.internals(),
        faults,
    })
}

/// Waits until the marker committed after the backlog has been applied,
/// sampling the lag every second; returns the seconds since `t0`.
async fn apply_until_marker(
    ctx: &CellContext<'_>,
    p: &Params,
    backlog: &Backlog,
    (here, there): (&Client, &Client),
    t0: Instant,
    timeout: Duration,
    phase: &fault::Phase,
) -> Result<f64> {
    let target = backlog.target.as_str();
    let mut next_sample = Duration::from_secs(1);
    loop {
        ctx.check_cancel()?;
        let seen: i64 = here
            .query_one(&format!("SELECT count(*) FROM {MARKER}"), &[])
            .await?
            .get(0);
        if seen > 0 {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > timeout {
            return Err(werr(format!(
                "the backlog did not drain within timeout_s = {} s",
                p.timeout_s
            )));
        }
        if t0.elapsed() >= next_sample {
            next_sample += Duration::from_secs(1);
            let lag = lag_at(here, there, target, t0.elapsed().as_secs_f64()).await?;
            let now = *phase.lock().unwrap_or_else(|e| e.into_inner());
            ctx.progress(
                now.unwrap_or("drain"),
                backlog.bytes.saturating_sub(lag.lag_bytes),
                backlog.bytes.max(1),
                format!("{} MiB to go", lag.lag_bytes >> 20),
            );
            ctx.sample("lag", &lag).await?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A partition as it happened.
struct Cutted {
    fault: Fault,
    start: Instant,
    healed: Instant,
    lag_at_heal: u64,
}

/// The drain's `partition` faults, each `at_s` after apply resumed (`t0`)
/// unless the drain is over by then: the network between this cluster's
/// server and the publisher's cut for `duration_s` (`Cluster::cut_from`),
/// then healed; the lag still to receive when it heals.
async fn partitions(
    ctx: &CellContext<'_>,
    faults: &[Fault],
    publisher: &Server,
    (here, there): (&Client, &Client),
    target: &str,
    t0: Instant,
    (phase, done): (&fault::Phase, &CancellationToken),
) -> Result<Vec<Cutted>> {
    let mut out = Vec::new();
    let (host, port) = match (
        publisher.config.get_hosts().first(),
        publisher.config.get_ports().first(),
    ) {
        (Some(tokio_postgres::config::Host::Tcp(h)), Some(p)) => (h.clone(), *p),
        _ if faults.is_empty() => return Ok(out),
        _ => return Err(werr("a partition needs the publisher's TCP address".into())),
    };
    for f in faults {
        tokio::select! {
            _ = tokio::time::sleep_until((t0 + Duration::from_secs_f64(f.at_s)).into()) => {}
            _ = fault::over(ctx, done) => break,
        }
        // The apply worker's end of its connection, as the publisher sees it.
        let connected: Option<i32> = there
            .query_opt(
                "SELECT client_port FROM pg_stat_replication WHERE application_name = $1",
                &[&NAME],
            )
            .await
            .map_err(on_publisher)?
            .and_then(|r| r.get(0));
        fault::set_phase(ctx, phase, Some(fault::phase_name(f.kind)));
        let start = Instant::now();
        let cut =
            ctx.cluster
                .cut_from(&host, port, connected.and_then(|p| u16::try_from(p).ok()))?;
        fault::mark(ctx, f, "start", start.duration_since(t0).as_secs_f64()).await;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(f.duration_s)) => {}
            _ = fault::over(ctx, done) => {}
        }
        let lag_at_heal = received_lag(here, target).await?;
        cut.heal()?;
        let healed = Instant::now();
        fault::set_phase(ctx, phase, None);
        fault::mark(ctx, f, "end", healed.duration_since(t0).as_secs_f64()).await;
        out.push(Cutted {
            fault: f.clone(),
            start,
            healed,
            lag_at_heal,
        });
    }
    Ok(out)
}

/// Polls `done` every 100 ms until it holds; fails naming `what` after
/// `timeout`, or when the cell is cancelled.
async fn wait<F, Fut>(ctx: &CellContext<'_>, timeout: Duration, what: &str, done: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let started = Instant::now();
    loop {
        ctx.check_cancel()?;
        if done().await? {
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(werr(format!(
                "timed out after {timeout:?} waiting for {what}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// WAL the slot retains: from its confirmed position to `to` (default: the
/// publisher's current position).
async fn slot_lag(there: &Client, to: Option<&str>) -> Result<u64> {
    let row = there
        .query_one(
            "SELECT coalesce(pg_wal_lsn_diff(coalesce($2::text::pg_lsn, pg_current_wal_lsn()), confirmed_flush_lsn), 0)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&NAME, &to],
        )
        .await
        .map_err(|e| Error::Peer {
            role: PUBLISHER.into(),
            message: format!("reading the slot `{NAME}`: {}", crate::pg_text(&e)),
        })?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// The lag to `target` at `second` of the drain: still to receive here,
/// still retained by the slot there.
async fn lag_at(here: &Client, there: &Client, target: &str, second: f64) -> Result<Lag> {
    Ok(Lag {
        second,
        lag_bytes: received_lag(here, target).await?,
        slot_lag_bytes: slot_lag(there, Some(target)).await?,
    })
}

/// WAL the subscriber has still to receive up to `target`.
async fn received_lag(here: &Client, target: &str) -> Result<u64> {
    let row = here
        .query_one(
            "SELECT coalesce(max(pg_wal_lsn_diff($1::text::pg_lsn, received_lsn)), pg_wal_lsn_diff($1::text::pg_lsn, '0/0'))::int8 \
             FROM pg_stat_subscription WHERE subname = $2",
            &[&target, &NAME],
        )
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// pgbench_accounts' rows and a checksum that does not depend on order.
async fn checksum(c: &Client) -> Result<(u64, String)> {
    let r = c
        .query_one(
            "SELECT count(*), coalesce(sum(hashtext(aid::text || ':' || abalance::text)::numeric), 0)::text FROM public.pgbench_accounts",
            &[],
        )
        .await?;
    Ok((r.get::<_, i64>(0) as u64, r.get(1)))
}

/// Drops the subscription (and with it the slot on the publisher), any slot
/// left, and the publication. Errors of an unreachable side are reported,
/// after trying the other.
async fn drop_replication(here: &Client, there: &Client) -> Result<()> {
    let exists: i64 = here
        .query_one(
            "SELECT count(*) FROM pg_subscription WHERE subname = $1",
            &[&NAME],
        )
        .await?
        .get(0);
    let mut first_err = None;
    if exists > 0 {
        // Dropping an enabled subscription drops its slot remotely; if the
        // publisher cannot be reached, detach the slot and drop it there.
        if let Err(e) = here
            .batch_execute(&format!("DROP SUBSCRIPTION {NAME}"))
            .await
        {
            tracing::warn!(error = %e, "dropping the subscription with its slot failed; detaching");
            let r = here
                .batch_execute(&format!(
                    "ALTER SUBSCRIPTION {NAME} DISABLE; ALTER SUBSCRIPTION {NAME} SET (slot_name = NONE); DROP SUBSCRIPTION {NAME}"
                ))
                .await;
            if let Err(e) = r {
                first_err.get_or_insert(Error::from(e));
            }
        }
    }
    let r = there
        .batch_execute(&format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{NAME}' AND NOT active; \
             DROP PUBLICATION IF EXISTS {NAME}"
        ))
        .await;
    if let Err(e) = r {
        first_err.get_or_insert(Error::from(e));
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
