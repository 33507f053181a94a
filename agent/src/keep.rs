//! `reuse_cluster: true`: a succeeded cell's cluster kept for the next
//! cell of its run, dataset and cluster settings on this agent, which
//! reuses it after the kind's reset instead of restoring the dataset.
//!
//! Scenario SQL ran on that cluster as the workload role, and the agent's
//! own superuser sessions will run on it again. So a cluster is kept only
//! when the cell left no catalog object behind (`inventory`: nothing a
//! later superuser session could trip over — a function, trigger, rule,
//! default, policy, type, operator, schema, extension, new table, large
//! object, prepared transaction, replication slot); otherwise it is torn
//! down and the next cell restores, saying why. The reset runs the kind's
//! SQL as the workload role, then as the superuser only fixed statements
//! (the role's and database's settings reset, a checkpoint).
//!
//! One kept cluster per agent at most. Any other cell's start, the idle
//! timer (`IDLE`) and the session's end tear it down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::cluster::{Cluster, ClusterSpec, WORKLOAD_ROLE};
use crate::{Error, Result};
/// A dataset's load figures (`workload::Loaded`, the wire's type).
use pgfleet_proto::workload::pgbench_init::Metrics as Loaded;

/// How long a kept cluster waits for its next cell.
pub const IDLE: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Slot {
    state: Mutex<State>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("keep::Slot")
    }
}

#[derive(Default)]
struct State {
    kept: Option<Kept>,
    /// Why the last cell that asked to keep its cluster did not.
    refused: Option<String>,
    /// Bumped on every keep: the idle timer of an older one does nothing.
    generation: u64,
}

/// A cluster kept after its cell, with what the next cell needs.
pub struct Kept {
    pub cluster: Cluster,
    pub key: String,
    /// The load's figures (the report's, as if loaded).
    pub loaded: Loaded,
    /// The cell whose cluster it is, and how many cells used it.
    pub first_cell: String,
    pub cells: u32,
    /// The catalog as the dataset left it (`inventory`).
    pub inventory: String,
}

/// What a cell may reuse: its run, dataset and every part of the cluster's
/// spec that shapes the server (settings, caps, instance, accounting,
/// shell, addresses).
pub fn key(run_id: &str, fingerprint: &str, spec: &ClusterSpec) -> String {
    format!(
        "{run_id} {fingerprint} {:?} {:?} {} {} {} {} {:?} {:?}",
        spec.settings,
        spec.caps,
        spec.memory_bytes,
        spec.cpus,
        spec.account_io,
        spec.allow_shell,
        spec.listen,
        spec.peers
    )
}

/// What `Slot::take` found for a cell.
pub enum Found {
    /// A kept cluster of the cell's key.
    Reuse(Box<Kept>),
    /// None to reuse, and why when the cell asked for one.
    None(Option<String>),
}

impl Slot {
    /// Takes the kept cluster for a cell of `key` (None: the cell does not
    /// reuse), tearing down one kept for another key.
    pub async fn take(&self, key: Option<&str>) -> Found {
        let (kept, refused) = {
            let mut s = self.state.lock().await;
            (s.kept.take(), s.refused.take())
        };
        match (kept, key) {
            (Some(k), Some(want)) if k.key == want => Found::Reuse(Box::new(k)),
            (Some(k), want) => {
                let first = k.first_cell.clone();
                if let Err(e) = k.cluster.teardown().await {
                    tracing::warn!("tearing down the kept cluster of cell {first}: {e}");
                }
                Found::None(want.map(|_| {
                    format!("the kept cluster (of cell {first}) has another run, dataset or cluster settings")
                }))
            }
            (None, Some(_)) => Found::None(refused),
            (None, None) => Found::None(None),
        }
    }

    /// Keeps `kept` for the next cell; torn down after `IDLE` unless a
    /// cell takes it first.
    pub async fn keep(self: &Arc<Self>, kept: Kept) {
        let generation = {
            let mut s = self.state.lock().await;
            s.generation += 1;
            s.kept = Some(kept);
            s.refused = None;
            s.generation
        };
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(IDLE).await;
            let idle = {
                let mut s = me.state.lock().await;
                if s.generation == generation {
                    s.kept.take()
                } else {
                    None
                }
            };
            if let Some(k) = idle {
                tracing::info!(cell = %k.first_cell, "tearing down a kept cluster no cell took");
                if let Err(e) = k.cluster.teardown().await {
                    tracing::warn!("tearing down an idle kept cluster: {e}");
                }
            }
        });
    }

    /// Records why a cell's cluster was not kept (said by the next cell).
    pub async fn refuse(&self, why: String) {
        self.state.lock().await.refused = Some(why);
    }

    /// Tears down what is kept (the session's end).
    pub async fn clear(&self) {
        let kept = self.state.lock().await.kept.take();
        if let Some(k) = kept {
            let _ = k.cluster.teardown().await;
        }
    }
}

/// The catalog objects a cell could leave behind for a superuser session
/// to run or trip over, as one sorted list (`kind:oid`; relations with
/// their kind, persistence, column count and options, which a later cell
/// would measure differently). Compared before and after a cell: equal
/// means the cell changed nothing but rows.
pub async fn inventory(cluster: &Cluster) -> Result<String> {
    // Objects of initdb have oids below FirstNormalObjectId (16384).
    const SQL: &str = "SELECT coalesce(string_agg(x, ',' ORDER BY x), '') FROM (
        SELECT 'function:' || oid FROM pg_proc WHERE oid >= 16384
        UNION ALL SELECT 'trigger:' || oid FROM pg_trigger
        UNION ALL SELECT 'event trigger:' || oid FROM pg_event_trigger
        UNION ALL SELECT 'rule:' || oid FROM pg_rewrite WHERE oid >= 16384
        UNION ALL SELECT 'policy:' || oid FROM pg_policy
        UNION ALL SELECT 'relation:' || oid || ' ' || relkind::text || relpersistence::text || relnatts
            || coalesce(' ' || array_to_string(reloptions, ' '), '')
            FROM pg_class WHERE oid >= 16384
        UNION ALL SELECT 'default:' || oid FROM pg_attrdef
        UNION ALL SELECT 'constraint:' || oid FROM pg_constraint WHERE oid >= 16384
        UNION ALL SELECT 'type:' || oid FROM pg_type WHERE oid >= 16384
        UNION ALL SELECT 'schema:' || oid FROM pg_namespace WHERE oid >= 16384
        UNION ALL SELECT 'operator:' || oid FROM pg_operator WHERE oid >= 16384
        UNION ALL SELECT 'cast:' || oid FROM pg_cast WHERE oid >= 16384
        UNION ALL SELECT 'extension:' || oid FROM pg_extension WHERE oid >= 16384
        UNION ALL SELECT 'statistics:' || oid FROM pg_statistic_ext
        UNION ALL SELECT 'default privileges:' || oid FROM pg_default_acl
        UNION ALL SELECT 'publication:' || oid FROM pg_publication
        UNION ALL SELECT 'large object:' || oid FROM pg_largeobject_metadata
        UNION ALL SELECT 'database:' || oid FROM pg_database WHERE oid >= 16384
        UNION ALL SELECT 'role:' || oid FROM pg_authid WHERE oid >= 16384
        UNION ALL SELECT 'prepared transaction:' || gid FROM pg_prepared_xacts
        UNION ALL SELECT 'replication slot:' || slot_name FROM pg_replication_slots
    ) t(x)";
    let client = cluster.connect().await?;
    let row = client.query_one(SQL, &[]).await.map_err(|e| {
        Error::Provision(format!(
            "listing the cluster's catalog objects: {}",
            Error::from(e)
        ))
    })?;
    Ok(row.get(0))
}

/// What `after` has that `before` had not, or lost (at most a few named).
pub fn difference(before: &str, after: &str) -> String {
    let set = |s: &str| -> std::collections::BTreeSet<String> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (b, a) = (set(before), set(after));
    let added: Vec<&String> = a.difference(&b).collect();
    let removed: Vec<&String> = b.difference(&a).collect();
    let show = |v: &[&String]| {
        let mut s = v
            .iter()
            .take(5)
            .map(|x| x.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        if v.len() > 5 {
            s += &format!(" and {} more", v.len() - 5);
        }
        s
    };
    match (added.is_empty(), removed.is_empty()) {
        (false, true) => format!("the cell created {}", show(&added)),
        (true, false) => format!("the cell dropped {}", show(&removed)),
        _ => format!(
            "the cell created {} and dropped {}",
            show(&added),
            show(&removed)
        ),
    }
}

/// Brings a kept cluster back to its dataset: the kind's `reset` as the
/// workload role, then the role's and the database's own settings reset
/// and a checkpoint as the superuser; refuses (an error) when its catalog
/// is not the one it was kept with.
pub async fn reset(kept: &Kept, sql: &[&str]) -> Result<f64> {
    let started = Instant::now();
    let now = inventory(&kept.cluster).await?;
    if now != kept.inventory {
        return Err(Error::Provision(format!(
            "its catalog changed while kept: {}",
            difference(&kept.inventory, &now)
        )));
    }
    let workload = kept.cluster.workload_server().connect().await?;
    for statement in sql {
        workload.batch_execute(statement).await.map_err(|e| {
            Error::Provision(format!(
                "the kind's reset ({statement}): {}",
                Error::from(e)
            ))
        })?;
    }
    drop(workload);
    let client = kept.cluster.connect().await?;
    client
        .batch_execute(&format!(
            "ALTER ROLE {WORKLOAD_ROLE} RESET ALL; \
             ALTER ROLE {WORKLOAD_ROLE} IN DATABASE postgres RESET ALL; \
             CHECKPOINT"
        ))
        .await
        .map_err(|e| {
            Error::Provision(format!("resetting the workload role: {}", Error::from(e)))
        })?;
    Ok(started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_difference_names_what_changed() {
        assert_eq!(
            super::difference("relation:1,relation:2", "function:9,relation:1,relation:2"),
            "the cell created function:9"
        );
        let many: Vec<String> = (0..8).map(|i| format!("trigger:{i}")).collect();
        assert_eq!(
            super::difference("", &many.join(",")),
            "the cell created trigger:0, trigger:1, trigger:2, trigger:3, trigger:4 and 3 more"
        );
        assert_eq!(
            super::difference("relation:1", "type:2"),
            "the cell created type:2 and dropped relation:1"
        );
    }
}
