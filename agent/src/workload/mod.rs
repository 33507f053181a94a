//! Workloads: what an agent runs inside a provisioned cluster.
//!
//! `BUILTINS` is the table of workloads, pgbench's `builtin_script[]` style:
//! a name (the scenario's `kind`), a one-line description, and the function
//! that runs it.
//!
//! DEVELOPER NOTE — how to add a workload:
//! 1. Write `workload/<name>.rs` with `pub fn run(ctx: &mut CellContext, params: &Json) -> BoxFuture<Result<Output>>`:
//!    deserialize `params` into your own `#[serde(deny_unknown_fields)]`
//!    struct, report progress with `ctx.progress`, raw observations with
//!    `ctx.sample`, and return one `Point` per measured point.
//! 2. Add a row to `BUILTINS` below.
//! 3. On the controller side, add the scenario model and validation in
//!    `controller/src/scenario/` and the planning into cells; the report
//!    renders any points generically, and a workload-specific table can be
//!    added in `controller/src/report/`.
//! 4. Test it against a real cluster (see `agent/tests/`).

use futures::future::BoxFuture;
use serde_json::Value as Json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::{Error, Result};
use pgfleet_proto::v1::{AgentMessage, CellProgress, CellSample, agent_message::Msg};

pub mod pgbench;
pub mod pgbench_init;
pub mod toast_slice;

pub type RunFn = for<'a> fn(&'a mut CellContext<'_>, &'a Json) -> BoxFuture<'a, Result<Output>>;

pub struct Builtin {
    pub name: &'static str,
    pub description: &'static str,
    pub run: RunFn,
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "toast-slice",
        description: "substring() of a large bytea value stored EXTERNAL / pglz / lz4: storage, buffers, latency",
        run: toast_slice::run,
    },
    Builtin {
        name: "pgbench-init",
        description: "load the pgbench schema at a scale, in parallel: rows, seconds, rows/s",
        run: pgbench_init::run,
    },
    Builtin {
        name: "pgbench",
        description: "load, then run a pgbench-style script: tps, latency percentiles, failures, page read and WAL sync time",
        run: pgbench::run,
    },
];

pub fn find(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// One measured point: its parameters and its metrics (report contract).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub params: Json,
    pub metrics: Json,
}

#[derive(Debug, Default)]
pub struct Output {
    pub points: Vec<Point>,
}

/// What a workload gets: the cluster, a way to report, and a cancel signal.
pub struct CellContext<'c> {
    pub cell_id: String,
    pub cluster: &'c Cluster,
    pub events: mpsc::Sender<AgentMessage>,
    pub cancel: CancellationToken,
}

impl CellContext<'_> {
    /// Progress is advisory: when the channel is full it is dropped, never
    /// blocking the measurement.
    pub fn progress(&self, phase: &str, done: u64, total: u64, message: impl Into<String>) {
        let _ = self.events.try_send(AgentMessage {
            msg: Some(Msg::Progress(CellProgress {
                cell_id: self.cell_id.clone(),
                phase: phase.to_string(),
                done,
                total,
                message: message.into(),
            })),
        });
    }

    /// Samples are data: they are queued, never dropped.
    pub async fn sample(&self, kind: &str, data: &Json) -> Result<()> {
        self.events
            .send(AgentMessage {
                msg: Some(Msg::Sample(CellSample {
                    cell_id: self.cell_id.clone(),
                    kind: kind.to_string(),
                    data: Some(pgfleet_proto::json_to_struct(data)),
                })),
            })
            .await
            .map_err(|_| Error::Session("event channel closed".into()))
    }

    pub fn check_cancel(&self) -> Result<()> {
        if self.cancel.is_cancelled() {
            Err(Error::Cancelled("cell cancelled".into()))
        } else {
            Ok(())
        }
    }
}

/// Median of a non-empty slice (mean of the middle two for even lengths).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn builtins_have_unique_names() {
        let mut names: Vec<_> = BUILTINS.iter().map(|b| b.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), BUILTINS.len());
    }
}
