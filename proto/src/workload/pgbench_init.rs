//! `pgbench-init`: pgbench's schema at a scale, loaded in parallel (the
//! agent's loader, `pgbench -i -I dtGvp` semantics). Also the first step of
//! `pgbench` and `vacuum-bloat`, which embed `InitParams`.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{
    CLUSTER_BASE_BYTES, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate, Field, KindParams, KindSpec,
    or,
};

pub const DESCRIPTION: &str =
    "load the pgbench schema at a scale, in parallel: rows, seconds, rows/s";
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[&str] = &["load_seconds", "rows_per_second"];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &["scale", "fillfactor", "partitions", "load_connections"];

/// pgbench's SCALE_32BIT_THRESHOLD: `aid` is bigint from this scale up.
pub const SCALE_BIGINT_THRESHOLD: u64 = 20_000;
pub const ACCOUNTS_PER_BRANCH: u64 = 100_000;
/// Heap bytes of pgbench_accounts per scale unit at fillfactor 100
/// (100,000 rows of ~121 bytes, 61 rows per 8 KiB page: 1,640 pages).
pub const ACCOUNTS_HEAP_BYTES_PER_SCALE: u64 = 1640 * 8192;
/// Its primary key per scale unit (~2.2 MB).
pub const ACCOUNTS_INDEX_BYTES_PER_SCALE: u64 = 275 * 8192;
/// Scale units loaded per second by the loader on one core (measured here:
/// scale 10 in ~1.5 s with two connections, BENCHMARKS.md); kept modest.
pub const LOAD_SCALE_PER_SECOND: f64 = 4.0;

/// Declares a kind's scenario keys (`Spec`) with the loader's ahead of its
/// own: every kind that loads pgbench's schema takes the loader's keys
/// declared here, once, and checks them with `Spec::init`.
macro_rules! with_load_keys {
    ($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            /// pgbench's scale: 100,000 accounts each (required).
            #[serde(default)]
            pub scale: Option<::serde_saphyr::Spanned<u64>>,
            /// pgbench_accounts' fillfactor, 10-100 (default 100).
            #[serde(default)]
            pub fillfactor: Option<::serde_saphyr::Spanned<u32>>,
            /// Range partitions of pgbench_accounts (0, the default: none).
            #[serde(default)]
            pub partitions: Option<::serde_saphyr::Spanned<u32>>,
            /// Loading connections (0, the default: one for a flat table,
            /// one per core over partitions).
            #[serde(default)]
            pub load_connections: Option<::serde_saphyr::Spanned<u32>>,
            $($body)*
        }

        impl $name {
            /// The loader's keys, checked (`pgbench_init::check`).
            pub fn init(
                &self,
                f: &$crate::workload::Field,
            ) -> $crate::workload::Checked<$crate::workload::pgbench_init::InitParams> {
                $crate::workload::pgbench_init::check(
                    f,
                    &self.scale,
                    &self.fillfactor,
                    &self.partitions,
                    &self.load_connections,
                )
            }

            /// Refuses `partitions` for a kind that measures one flat table.
            pub fn flat(&self, f: &$crate::workload::Field, why: &str) -> $crate::workload::Checked<()> {
                match &self.partitions {
                    Some(p) if p.value > 0 => f.err(
                        p.referenced,
                        "partitions",
                        format!("is not taken by this kind: {why}; leave it out"),
                    ),
                    _ => Ok(()),
                }
            }
        }
    };
}
pub(crate) use with_load_keys;

with_load_keys! {
    /// The loader's keys, the whole of `kind: pgbench-init`.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Spec {}
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitParams {
    pub scale: u64,
    pub fillfactor: u32,
    /// Range partitions of pgbench_accounts (0: not partitioned).
    pub partitions: u32,
    /// Loading connections (0: one for a flat table, one per core over
    /// partitions).
    pub load_connections: u32,
}

pub type Params = InitParams;

/// The load's figures (also part of `pgbench` and `vacuum-bloat` metrics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub rows_loaded: u64,
    pub load_seconds: f64,
    pub rows_per_second: f64,
    /// Seconds per step, as pgbench -i reports them: schema, generate
    /// (COPY), vacuum, primary keys.
    pub load_step_seconds: std::collections::BTreeMap<String, f64>,
}

pub type Point = super::Point<InitParams, Metrics>;

/// Checks the loader keys of any kind that loads (`scale` required).
pub fn check(
    f: &Field,
    scale: &Option<Spanned<u64>>,
    fillfactor: &Option<Spanned<u32>>,
    partitions: &Option<Spanned<u32>>,
    load_connections: &Option<Spanned<u32>>,
) -> Checked<InitParams> {
    if scale.is_none() {
        return f.err(
            f.kind_at,
            "scale",
            "is required: the pgbench scale (100,000 accounts each)",
        );
    }
    f.in_range(scale, "scale", 1, MAX_SCALE, "")?;
    f.in_range(fillfactor, "fillfactor", 10, 100, "")?;
    f.in_range(partitions, "partitions", 0, MAX_PARTITIONS, "")?;
    f.in_range(
        load_connections,
        "load_connections",
        0,
        MAX_LOAD_CONNECTIONS,
        " (0: one for a flat table, one per core over partitions)",
    )?;
    Ok(InitParams {
        scale: or(scale, 1),
        fillfactor: or(fillfactor, 100),
        partitions: or(partitions, 0),
        load_connections: or(load_connections, 0),
    })
}

/// The loader's output version: bump it whenever `load` writes other bytes
/// for the same keys (published datasets of the old version are not reused).
pub const LOADER_VERSION: u32 = 1;

impl InitParams {
    /// The loaded schema as a dataset: the keys that shape its bytes. The
    /// number of loading connections does not, except through COPY FREEZE
    /// (frozen rows and an all-visible map from the load itself): partitions
    /// are always loaded so, a flat table only by one connection.
    pub fn as_dataset(&self) -> crate::dataset::Dataset {
        let freeze = self.partitions > 0 || self.load_connections <= 1;
        let mut label = format!("pgbench-s{}", self.scale);
        if self.fillfactor != 100 {
            label += &format!("-ff{}", self.fillfactor);
        }
        if self.partitions > 0 {
            label += &format!("-p{}", self.partitions);
        }
        if !freeze {
            label += "-nofreeze";
        }
        crate::dataset::Dataset {
            loader: "pgbench".into(),
            loader_version: LOADER_VERSION,
            label,
            keys: [
                ("scale", serde_json::json!(self.scale)),
                ("fillfactor", serde_json::json!(self.fillfactor)),
                ("partitions", serde_json::json!(self.partitions)),
                ("copy_freeze", serde_json::json!(freeze)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            bytes: self.data_bytes(),
            load_seconds: self.scale as f64 / LOAD_SCALE_PER_SECOND,
        }
    }

    /// pgbench_accounts' heap at this scale and fillfactor.
    pub fn accounts_heap_bytes(&self) -> u64 {
        self.scale * ACCOUNTS_HEAP_BYTES_PER_SCALE * 100 / self.fillfactor.max(10) as u64
    }
    /// The loaded database: accounts heap and key (branches, tellers are noise).
    pub fn data_bytes(&self) -> u64 {
        self.accounts_heap_bytes() + self.scale * ACCOUNTS_INDEX_BYTES_PER_SCALE
    }
}

impl KindSpec for Spec {
    type Params = InitParams;
    fn plan(&self, f: &Field) -> Checked<Vec<(String, InitParams)>> {
        Ok(vec![("init".into(), self.init(f)?)])
    }
}

const MAX_SCALE: u64 = 1_000_000;
const MAX_PARTITIONS: u32 = 10_000;
const MAX_LOAD_CONNECTIONS: u32 = 256;

impl KindParams for InitParams {
    fn check(&self) -> Result<(), String> {
        super::within("scale", self.scale, 1, MAX_SCALE)?;
        super::within("fillfactor", self.fillfactor, 10, 100)?;
        super::within("partitions", self.partitions, 0, MAX_PARTITIONS)?;
        super::within(
            "load_connections",
            self.load_connections,
            0,
            MAX_LOAD_CONNECTIONS,
        )
    }
    fn estimate(&self) -> Estimate {
        Estimate {
            seconds: ESTIMATE_CLUSTER_SECONDS + self.scale as f64 / LOAD_SCALE_PER_SECOND,
            measured_seconds: 0.0,
            // Data, plus WAL of the load up to max_wal_size (1 GB default).
            disk_bytes: CLUSTER_BASE_BYTES + self.data_bytes() + self.data_bytes().min(1 << 30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Params, plan_entry};

    /// The loader's keys are one declaration: every kind that loads takes
    /// them and checks them alike; kinds measuring one flat table refuse
    /// `partitions` by name.
    #[test]
    fn every_loading_kind_takes_the_loader_keys_alike() {
        for kind in ["pgbench-init", "pgbench", "vacuum-bloat", "logical-drain"] {
            let cells = plan_entry(&format!(
                "{{kind: {kind}, scale: 3, fillfactor: 90, load_connections: 2}}"
            ))
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
            let init = match &cells[0].1 {
                Params::PgbenchInit(p) => p,
                Params::Pgbench(p) => &p.init,
                Params::VacuumBloat(p) => &p.init,
                Params::LogicalDrain(p) => &p.init,
                other => panic!("{kind}: {other:?}"),
            };
            assert_eq!(
                (init.scale, init.fillfactor, init.load_connections),
                (3, 90, 2)
            );
            let e = plan_entry(&format!("{{kind: {kind}, scale: 3, fillfactor: 5}}")).unwrap_err();
            assert!(e.contains("fillfactor"), "{kind}: {e}");
            let e = plan_entry(&format!("{{kind: {kind}}}")).unwrap_err();
            assert!(e.contains("scale") && e.contains("required"), "{kind}: {e}");
        }
        for kind in ["pgbench-init", "pgbench"] {
            plan_entry(&format!("{{kind: {kind}, scale: 3, partitions: 4}}")).unwrap();
        }
        for kind in ["vacuum-bloat", "logical-drain"] {
            let e = plan_entry(&format!("{{kind: {kind}, scale: 3, partitions: 4}}")).unwrap_err();
            assert!(
                e.contains("partitions") && e.contains("not taken by this kind"),
                "{kind}: {e}"
            );
        }
    }
}
