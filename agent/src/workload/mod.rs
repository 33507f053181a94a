//! Workloads: what an agent runs inside a provisioned cluster.
//!
//! Each kind's definition (parameters, metrics, validation, estimates) lives
//! in `pgfleet_proto::workload`; this module holds the code that runs it, one
//! file per kind, and `run`, the table that dispatches a cell's typed
//! parameters to it. How to add a kind: see the DEVELOPER NOTE in
//! `proto/src/workload/mod.rs` (here: a file and one line in `run`).

use futures::future::BoxFuture;

use crate::Result;
use pgfleet_proto::workload::{self as kinds, Params};

pub mod compression_analysis;
pub mod context;
pub mod documents;
pub mod drive;
pub mod fault;
pub mod fio;
pub mod ledger;
pub mod logical_drain;
pub mod pgbench;
pub mod pgbench_init;
pub mod read_write;
pub mod toast_probe;
pub mod toast_slice;
pub mod vacuum_bloat;

pub use context::{
    CellContext, Loaded, Output, Point, RepeatSummary, closed_loop, explain_buffers, median, phase,
    to_json,
};

/// Runs a cell's workload: its dataset first, unless the cell restored or
/// loaded it already (`ctx.loaded`), then the table of kinds, one line each.
pub fn run<'a>(ctx: &'a mut CellContext<'_>, params: &'a Params) -> BoxFuture<'a, Result<Output>> {
    use futures::FutureExt;
    async move {
        if ctx.loaded.is_none() {
            let loaded = match load(ctx, params) {
                Some(l) => Some(l.await?),
                None => None,
            };
            ctx.loaded = loaded;
        }
        match params {
            Params::ToastSlice(p) => toast_slice::run(ctx, p),
            Params::PgbenchInit(p) => pgbench_init::run(ctx, p),
            Params::Pgbench(p) => pgbench::run(ctx, p),
            Params::VacuumBloat(p) => vacuum_bloat::run(ctx, p),
            Params::LogicalDrain(p) => logical_drain::run(ctx, p),
            Params::ToastProbe(p) => toast_probe::run(ctx, p),
            Params::CompressionAnalysis(p) => compression_analysis::run(ctx, p),
            Params::ReadWrite(p) => read_write::run(ctx, p),
            Params::Fio(p) => fio::run(ctx, p),
        }
        .await
    }
    .boxed()
}

/// What a class's emulated storage delivers against its caps, measured
/// once per agent at its first cell (the fio kind's probe), for the
/// environment and the report.
pub async fn probe_storage(
    cluster: &crate::cluster::Cluster,
    fio: &std::path::Path,
    caps: crate::cluster::throttle::Caps,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<pgfleet_proto::environment::Delivered> {
    fio::probe(cluster, fio, caps, cancel).await
}

/// Loads a cell's dataset, for kinds that declare one
/// (`KindParams::dataset`), on the role that holds it: one line per kind.
pub fn load<'a>(
    ctx: &'a CellContext<'_>,
    params: &'a Params,
) -> Option<BoxFuture<'a, Result<Loaded>>> {
    use futures::FutureExt;
    params.dataset_of(&ctx.role)?;
    let pgbench = |init: &'a kinds::pgbench_init::InitParams| {
        async move { Ok(pgbench_init::load(ctx, init).await?.metrics()) }.boxed()
    };
    match params {
        Params::Pgbench(p) => Some(pgbench(&p.init)),
        Params::VacuumBloat(p) => Some(pgbench(&p.init)),
        Params::LogicalDrain(p) => Some(pgbench(&p.init)),
        Params::ReadWrite(p) => Some(read_write::load(ctx, p).boxed()),
        _ => None,
    }
}
