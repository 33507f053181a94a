//! `pgbench-init`: pgbench's schema at a scale, loaded in parallel (the
//! agent's loader, `pgbench -i -I dtGvp` semantics). Also the first step of
//! `pgbench` and `vacuum-bloat`, which embed `InitParams`.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{
    Better, Capacity, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate, Field, KindParams, KindSpec,
    Metric, Work, or,
};

pub const DESCRIPTION: &str =
    "load the pgbench schema at a scale, in parallel: rows, seconds, rows/s";
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "load_seconds",
        "s",
        Better::Lower,
        "time to load pgbench's tables and build their keys",
    ),
    Metric::new(
        "rows_per_second",
        "rows/s",
        Better::Higher,
        "rows loaded per second",
    ),
];
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
/// The loader's CPU seconds per scale unit on one core of the reference
/// host (PostgreSQL 15, release build; BENCHMARKS.md "Loader"): generating
/// and COPYing a flat table with one backend took 0.06-0.1 s per unit
/// from scale 10 to 1,000, the primary key 0.03-0.04 s on two cores; the
/// schema, the vacuum and the checkpoint after ~2 s at any scale.
pub const LOAD_CPU_SECONDS_PER_SCALE: f64 = 0.065;
pub const KEYS_CPU_SECONDS_PER_SCALE: f64 = 0.06;
pub const LOAD_FIXED_SECONDS: f64 = 2.0;
/// A direct load's CPU seconds per scale unit (generating and checksumming
/// ~15 MB of pages on one core) and its fixed seconds (the self-check on a
/// build's first load, the stop and start of the server, the VACUUM of
/// all-frozen tables). Measured: BENCHMARKS.md "Direct load".
pub const DIRECT_CPU_SECONDS_PER_SCALE: f64 = 0.006;
pub const DIRECT_FIXED_SECONDS: f64 = 3.0;
/// Pages ANALYZE samples at default_statistics_target 100.
pub const ANALYZE_SAMPLE_PAGES: u64 = 30_000;

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
            /// `direct` (the default: the agent writes the tables' files)
            /// or `copy` (COPY FREEZE over connections, then CREATE INDEX).
            #[serde(default)]
            pub load_method: Option<::serde_saphyr::Spanned<String>>,
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
                    &self.load_method,
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
    /// How the rows get there. Records from before this key loaded by COPY.
    #[serde(default)]
    pub load_method: LoadMethod,
}

/// How pgbench's tables are loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadMethod {
    /// `COPY ... FREEZE` of generated rows over connections (the server
    /// parses every row), VACUUM, then `ADD PRIMARY KEY` (a sort).
    #[default]
    Copy,
    /// The agent writes pgbench_accounts' heap, visibility map and key as
    /// the server's own files, in parallel, at the device's speed; where a
    /// build fails the agent's self-check it loads by `copy` instead.
    Direct,
}

impl LoadMethod {
    pub const NAMES: &[&str] = &["direct", "copy"];
    pub fn name(self) -> &'static str {
        match self {
            LoadMethod::Copy => "copy",
            LoadMethod::Direct => "direct",
        }
    }
}

pub type Params = InitParams;

/// The load's figures (also part of `pgbench` and `vacuum-bloat` metrics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub rows_loaded: u64,
    pub load_seconds: f64,
    pub rows_per_second: f64,
    /// Seconds per step, as pgbench -i reports them: schema, generate
    /// (COPY), vacuum, primary keys; a direct load: schema, write (the
    /// files, keys included), restart, vacuum.
    pub load_step_seconds: std::collections::BTreeMap<String, f64>,
    /// How the rows were loaded ("copy" or "direct"): what was asked,
    /// unless the build refused `direct` (then `load_method_note` says why).
    #[serde(default)]
    pub load_method: String,
    /// Why a direct load ran as copy ("" otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub load_method_note: String,
}

pub type Point = super::Point<InitParams, Metrics>;

/// Checks the loader keys of any kind that loads (`scale` required).
pub fn check(
    f: &Field,
    scale: &Option<Spanned<u64>>,
    fillfactor: &Option<Spanned<u32>>,
    partitions: &Option<Spanned<u32>>,
    load_connections: &Option<Spanned<u32>>,
    load_method: &Option<Spanned<String>>,
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
    if let Some(m) = load_method {
        f.one_of(m, "load_method", LoadMethod::NAMES, "load method")?;
    }
    Ok(InitParams {
        scale: or(scale, 1),
        fillfactor: or(fillfactor, 100),
        partitions: or(partitions, 0),
        load_connections: or(load_connections, 0),
        load_method: match load_method.as_ref().map(|m| m.value.as_str()) {
            Some("copy") => LoadMethod::Copy,
            _ => LoadMethod::Direct,
        },
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
            load_seconds: self.load_seconds(&Capacity::host()),
        }
    }

    /// Backends the load keeps busy: one per partition up to the cores (or
    /// `load_connections`), one for a flat table.
    fn load_threads(&self, cpus: f64) -> f64 {
        match (self.partitions, self.load_connections) {
            (0, 0) => 1.0,
            (p, 0) => (p as f64).min(cpus),
            (_, n) => n as f64,
        }
    }

    /// Seconds of the load on a class: generating and COPYing the rows
    /// (CPU-bound on an uncapped disk, write-bound under a cap: heap, its
    /// WAL and the checkpoint after), then the primary keys (parallel
    /// workers sorting in memory).
    pub fn load_seconds(&self, c: &Capacity) -> f64 {
        let scale = self.scale as f64;
        // VACUUM ANALYZE samples up to 30,000 pages at random: from the
        // device when the heap does not fit the instance's memory (80 s of
        // a 112 s load at scale 64 in 128 MiB at 375 read IOPS).
        let heap = self.accounts_heap_bytes();
        let sampled = if c.memory_bytes > 0 && heap > c.memory_bytes {
            (heap / 8192).min(ANALYZE_SAMPLE_PAGES) as f64
        } else {
            0.0
        };
        let analyze = Work::default().random_reads(sampled);
        if self.load_method == LoadMethod::Direct {
            // Every page written once (no WAL, no sort), generated on
            // every core.
            let write = Work::cpu(scale * DIRECT_CPU_SECONDS_PER_SCALE, c.cpus.max(1.0))
                .writing(self.data_bytes() as f64);
            return LOAD_FIXED_SECONDS
                + DIRECT_FIXED_SECONDS
                + write.seconds(c)
                + analyze.seconds(c);
        }
        let generate = Work::cpu(
            scale * LOAD_CPU_SECONDS_PER_SCALE,
            self.load_threads(c.cpus),
        )
        .writing(2.0 * self.accounts_heap_bytes() as f64);
        let keys = Work::cpu(scale * KEYS_CPU_SECONDS_PER_SCALE, 2.0)
            .writing(2.0 * (self.scale * ACCOUNTS_INDEX_BYTES_PER_SCALE) as f64);
        LOAD_FIXED_SECONDS + generate.seconds(c) + analyze.seconds(c) + keys.seconds(c)
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
    fn estimate(&self, c: &Capacity) -> Estimate {
        let load = ESTIMATE_CLUSTER_SECONDS + self.load_seconds(c);
        Estimate {
            seconds: load,
            measured_seconds: 0.0,
            disk_bytes: super::pgdata_bytes(self.data_bytes()),
            load_seconds: load,
            ..Estimate::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Capacity, KindParams, Params, plan_entry};
    use crate::environment::Caps;

    fn init(text: &str) -> super::InitParams {
        match plan_entry(text).unwrap().remove(0).1 {
            Params::PgbenchInit(p) => p,
            other => panic!("{other:?}"),
        }
    }

    /// A load's estimate follows the class: CPU-bound on an uncapped disk
    /// (the reference host's measured rate), write-bound under gp3's
    /// 125 MiB/s, and partitions spread over the class's CPUs.
    #[test]
    fn the_load_estimate_follows_the_class_cpus_and_caps() {
        let (two, gp3) = Capacity::two_cores_and_gp3();
        let flat = init("{kind: pgbench-init, scale: 100, load_method: copy}");
        // 0.065 s per scale unit on one backend, then the key on two cores.
        let uncapped = flat.load_seconds(&two);
        assert!((uncapped - (2.0 + 6.5 + 3.0)).abs() < 0.5, "{uncapped}");
        // Heap and its WAL (2 x 1.34 GB) at 131 MB/s: ~20 s, then the key.
        let capped = flat.load_seconds(&gp3);
        assert!((22.0..32.0).contains(&capped), "{capped}");
        // BENCHMARKS.md measured 33.3 s for this load under gp3's caps.
        assert!((capped - 33.3).abs() / 33.3 < 0.3, "{capped}");
        let parts = init("{kind: pgbench-init, scale: 100, partitions: 4, load_method: copy}");
        let one = Capacity { cpus: 1.0, ..two };
        assert!(parts.load_seconds(&two) < parts.load_seconds(&one));
        // A flat table loads on one backend; only its key uses the second CPU.
        let fewer = flat.load_seconds(&one) - flat.load_seconds(&two);
        assert!((fewer - 3.0).abs() < 0.5, "{fewer}");
        // In an instance smaller than the heap, ANALYZE's sample is read
        // from the device: 30,000 pages at 375 IOPS (gp3 scaled by 0.125).
        let small = Capacity {
            memory_bytes: 128 << 20,
            caps: Caps {
                read_iops: 375,
                ..gp3.caps
            },
            ..gp3
        };
        let analyze = flat.load_seconds(&small) - flat.load_seconds(&gp3);
        assert!((analyze - 80.0).abs() < 1.0, "{analyze}");
        let e = flat.estimate(&gp3);
        assert_eq!(e.seconds, e.load_seconds);
        assert!(e.seconds > flat.estimate(&two).seconds);
    }

    /// A direct load writes each page once at the device's speed (no WAL,
    /// no sort): under gp3's 125 MiB/s, the heap and key of scale 100
    /// (1.6 GB) in ~12 s against copy's ~30; direct is the default, copy
    /// is there by name, anything else is refused with the choices.
    #[test]
    fn a_direct_load_is_bound_by_the_write_bandwidth() {
        let (two, gp3) = Capacity::two_cores_and_gp3();
        let direct = init("{kind: pgbench-init, scale: 100}");
        assert_eq!(direct.load_method, super::LoadMethod::Direct);
        let copy = init("{kind: pgbench-init, scale: 100, load_method: copy}");
        assert_eq!(copy.load_method, super::LoadMethod::Copy);
        let d = direct.load_seconds(&gp3);
        let bytes = direct.data_bytes() as f64;
        let at_cap = bytes / (125.0 * 1048576.0);
        assert!((d - 5.0 - at_cap).abs() < 1.0, "{d} vs {at_cap}");
        assert!(d < 0.7 * copy.load_seconds(&gp3), "{d}");
        // Uncapped, at scale 1,000: 6 s of generation over two cores and
        // 15.7 GB written, against one backend's 65 s of COPY and the sort.
        let big = |m: &str| {
            init(&format!(
                "{{kind: pgbench-init, scale: 1000, load_method: {m}}}"
            ))
        };
        let (d, c) = (
            big("direct").load_seconds(&two),
            big("copy").load_seconds(&two),
        );
        assert!(d < c / 3.0, "{d} {c}");
        let e = plan_entry("{kind: pgbench-init, scale: 1, load_method: fast}").unwrap_err();
        assert!(e.contains("load_method") && e.contains("direct"), "{e}");
    }

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
