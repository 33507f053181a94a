//! `compression-analysis` (SPEC Experiment 4, seeds/004's
//! `csm_compress_analysis`, on stock PostgreSQL): how well each 8 KiB page
//! of a dataset's relations would compress, and what fixed-size compressed
//! slots would cost.
//!
//! For each relation (tables, indexes and materialized views of the
//! dataset; TOAST relations excluded, as page compression excludes them)
//! and each sample fraction, a deterministic systematic sample of its pages
//! (n = ceil(f × pages); page i of the sample is block floor((i + ½) ×
//! pages / n), the same blocks on every run) is read with pageinspect's
//! `get_raw_page` and each page compressed with zstd (level configurable;
//! the article uses the maximum), lz4 (liblz4's `LZ4_compress_default`, as
//! PostgreSQL calls it) and pglz (PostgreSQL's algorithm and default
//! strategy, ported: give up when nothing matched in the first 1 KiB of
//! output or when the result would not save 25 %; a page pglz gives up on is
//! stored raw, 8,192 bytes).
//!
//! Slots: a compressed page is stored as `slot_header_bytes` + its
//! compressed bytes in a fixed slot of 1, 2 or 4 KiB; what does not fit goes
//! to an overflow area allocated in 1 KiB units (the unit seeds/004's
//! figures imply: 623 pages of 2,223 bytes project to 1,911,808 bytes in
//! 1 KiB slots, i.e. 2 overflow units each). A page whose compressed form
//! with header is not smaller than 8,192 bytes is stored raw (one slot plus
//! the rest as overflow). Projected size = sampled pages' slots + overflow,
//! scaled by pages / sampled pages.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::pgbench_init::{self, InitParams};
use super::{
    Better, CLUSTER_BASE_BYTES, Capacity, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate, Field,
    KindParams, KindSpec, Metric, or,
};

pub const DESCRIPTION: &str = "compress a deterministic sample of each relation's 8 KiB pages with zstd / lz4 / pglz: average size, overflow of 1/2/4 KiB slots, projected size, CPU per page (seeds/004)";
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "avg_compressed_bytes",
        "bytes",
        Better::Lower,
        "a sampled page's mean compressed size",
    ),
    Metric::new(
        "cpu_us_per_page",
        "µs",
        Better::Lower,
        "CPU time to compress one page",
    ),
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &["scale", "fillfactor", "json_documents"];

pub const DATASETS: &[&str] = &["pgbench", "json", "sql"];
pub const ALGORITHMS: &[&str] = &["zstd", "lz4", "pglz"];
pub const PAGE_BYTES: u64 = 8192;
pub const SLOTS: [u64; 3] = [1024, 2048, 4096];
/// Overflow is allocated in units of this many bytes.
pub const OVERFLOW_UNIT: u64 = 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// `pgbench` (default: its tables at `scale`), `json` (toast-probe's
    /// order documents, `json_documents` of them, stored inline as far as
    /// they fit) or `sql` (the relations `setup_sql` creates).
    #[serde(default)]
    pub dataset: Option<Spanned<String>>,
    #[serde(default)]
    pub scale: Option<Spanned<u64>>,
    #[serde(default)]
    pub fillfactor: Option<Spanned<u32>>,
    #[serde(default)]
    pub load_connections: Option<Spanned<u32>>,
    /// With dataset pgbench: `direct` (default) or `copy`.
    #[serde(default)]
    pub load_method: Option<Spanned<String>>,
    #[serde(default)]
    pub json_documents: Option<Spanned<u32>>,
    #[serde(default)]
    pub setup_sql: Option<Spanned<String>>,
    /// Only these relations (default: every table, index and materialized
    /// view in the public schema after the dataset is loaded).
    #[serde(default)]
    pub relations: Option<Vec<Spanned<String>>>,
    /// Sample fractions, each in (0, 1] (default 0.01, 0.1, 1).
    #[serde(default)]
    pub sample_fractions: Option<Vec<Spanned<f64>>>,
    #[serde(default)]
    pub algorithms: Option<Vec<Spanned<String>>>,
    /// zstd's level (default 22, the maximum, as seeds/004).
    #[serde(default)]
    pub zstd_level: Option<Spanned<i32>>,
    /// Bytes stored with each compressed page in its slot (default 8: the
    /// compressed length and the algorithm, an assumption: seeds/004 does
    /// not publish its header).
    #[serde(default)]
    pub slot_header_bytes: Option<Spanned<u32>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub dataset: String,
    pub init: Option<InitParams>,
    pub json_documents: u32,
    pub setup_sql: String,
    pub relations: Vec<String>,
    pub sample_fractions: Vec<f64>,
    pub algorithms: Vec<String>,
    pub zstd_level: i32,
    pub slot_header_bytes: u32,
}

/// A point: one relation, one sample fraction, one algorithm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub relation: String,
    /// `r` table, `i` index, `m` materialized view.
    pub relkind: String,
    pub sample_fraction: f64,
    pub algorithm: String,
    /// zstd's level (for every algorithm's point, so points group alike).
    pub zstd_level: i32,
    pub slot_header_bytes: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// The relation's pages and size.
    pub relation_pages: u64,
    pub relation_bytes: u64,
    pub pages_analysed: u64,
    /// Mean compressed bytes per page (a pglz give-up counts 8,192).
    pub avg_compressed_bytes: f64,
    /// Raw bytes / compressed bytes over the sample.
    pub ratio: f64,
    /// Pages pglz gave up on (0 for the others).
    pub pages_incompressible: u64,
    /// Share (%) of sampled pages that, with the slot header, do not fit
    /// a 1 / 2 / 4 KiB slot.
    pub over_1k_pct: f64,
    pub over_2k_pct: f64,
    pub over_4k_pct: f64,
    /// Projected relation size with 1 / 2 / 4 KiB slots, overflow included.
    pub projected_1k_bytes: u64,
    pub projected_2k_bytes: u64,
    pub projected_4k_bytes: u64,
    /// The sample's own slots + overflow (what csm_compress_analysis shows
    /// as compressed_relation_size_*).
    pub sample_1k_bytes: u64,
    pub sample_2k_bytes: u64,
    pub sample_4k_bytes: u64,
    /// CPU time compressing (the agent thread's), total and per page.
    pub cpu_ms: f64,
    pub cpu_us_per_page: f64,
    /// Wall time reading the sample's pages from the server.
    pub read_ms: f64,
}

pub type Point = super::Point<PointParams, Metrics>;

/// Slot bytes of one page compressed to `compressed` bytes: (fits, slot +
/// overflow bytes).
pub fn slot_bytes(compressed: u64, header: u64, slot: u64) -> (bool, u64) {
    let stored = (compressed + header).min(PAGE_BYTES + header);
    let stored = if compressed + header >= PAGE_BYTES {
        PAGE_BYTES
    } else {
        stored
    };
    if stored <= slot {
        (true, slot)
    } else {
        (
            false,
            slot + (stored - slot).div_ceil(OVERFLOW_UNIT) * OVERFLOW_UNIT,
        )
    }
}

/// The blocks a fraction samples out of `pages`: n = ceil(f × pages), page
/// i at floor((i + ½) × pages / n). Deterministic; all of them at 1.
pub fn sample_blocks(pages: u64, fraction: f64) -> Vec<u64> {
    if pages == 0 {
        return Vec::new();
    }
    let n = ((pages as f64 * fraction).ceil() as u64).clamp(1, pages);
    (0..n)
        .map(|i| (((2 * i + 1) as u128 * pages as u128) / (2 * n as u128)) as u64)
        .collect()
}

impl KindSpec for Spec {
    type Params = Params;

    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        if let Some(d) = &self.dataset {
            f.one_of(d, "dataset", DATASETS, "dataset")?;
        }
        let dataset = or(&self.dataset, "pgbench".to_string());
        let init = if dataset == "pgbench" {
            Some(pgbench_init::check(
                f,
                &self.scale,
                &self.fillfactor,
                &None,
                &self.load_connections,
                &self.load_method,
            )?)
        } else {
            for (key, given) in [
                ("scale", self.scale.as_ref().map(|s| s.referenced)),
                ("fillfactor", self.fillfactor.as_ref().map(|s| s.referenced)),
            ] {
                if let Some(at) = given {
                    return f.err(
                        at,
                        key,
                        format!("applies to dataset pgbench, not {dataset}"),
                    );
                }
            }
            None
        };
        f.in_range(&self.json_documents, "json_documents", 1, 10_000_000, "")?;
        let setup_sql = or(&self.setup_sql, String::new());
        if dataset == "sql" && setup_sql.trim().is_empty() {
            let at = self.dataset.as_ref().map_or(f.kind_at, |d| d.referenced);
            return f.err(
                at,
                "setup_sql",
                "dataset sql needs setup_sql: the statements that create and fill the relations to analyse",
            );
        }
        let fractions = match &self.sample_fractions {
            None => vec![0.01, 0.1, 1.0],
            Some(l) if l.is_empty() => {
                return f.err(f.kind_at, "sample_fractions", "must not be empty");
            }
            Some(l) => {
                for (j, x) in l.iter().enumerate() {
                    if !(x.value > 0.0 && x.value <= 1.0) {
                        return f.err(
                            x.referenced,
                            &format!("sample_fractions[{j}]"),
                            format!("{} is out of range: allowed above 0 and at most 1 (1 = every page)", x.value),
                        );
                    }
                }
                l.iter().map(|x| x.value).collect()
            }
        };
        let algorithms = f.names(
            &self.algorithms,
            "algorithms",
            ALGORITHMS,
            "algorithm",
            ALGORITHMS,
        )?;
        f.in_range(&self.zstd_level, "zstd_level", 1, 22, "")?;
        f.in_range(
            &self.slot_header_bytes,
            "slot_header_bytes",
            0,
            512,
            " bytes",
        )?;
        let relations = self
            .relations
            .as_ref()
            .map(|l| l.iter().map(|r| r.value.clone()).collect())
            .unwrap_or_default();
        Ok(vec![(
            dataset.clone(),
            Params {
                dataset,
                init,
                json_documents: or(&self.json_documents, 10_000),
                setup_sql,
                relations,
                sample_fractions: fractions,
                algorithms,
                zstd_level: or(&self.zstd_level, 22),
                slot_header_bytes: or(&self.slot_header_bytes, 8),
            },
        )])
    }
}

/// Assumed compression speed per page across the algorithms (zstd at its
/// maximum level dominates), for estimates only.
const ESTIMATE_SECONDS_PER_PAGE: f64 = 0.003;

impl KindParams for Params {
    fn check(&self) -> Result<(), String> {
        use super::within;
        if let Some(i) = &self.init {
            i.check()?;
        }
        within("json_documents", self.json_documents, 1, 10_000_000)?;
        within("zstd_level", self.zstd_level, 1, 22)?;
        within("slot_header_bytes", self.slot_header_bytes, 0, 512)?;
        within("setup_sql bytes", self.setup_sql.len(), 0, 1 << 20)?;
        for x in &self.sample_fractions {
            if !(*x > 0.0 && *x <= 1.0) {
                return Err(format!(
                    "sample_fractions: {x} is out of range: allowed above 0 and at most 1"
                ));
            }
        }
        for r in &self.relations {
            within("relations[] name bytes", r.len(), 1, 200)?;
        }
        Ok(())
    }
    fn estimate(&self, c: &Capacity) -> Estimate {
        let (load, bytes) = match &self.init {
            Some(i) => {
                let e = i.estimate(c);
                (e.seconds, e.disk_bytes)
            }
            None => (
                ESTIMATE_CLUSTER_SECONDS + self.json_documents as f64 * 0.001,
                CLUSTER_BASE_BYTES + self.json_documents as u64 * 10_000,
            ),
        };
        let pages = bytes.saturating_sub(CLUSTER_BASE_BYTES) as f64 / PAGE_BYTES as f64;
        let share: f64 = self.sample_fractions.iter().sum();
        let measured =
            pages * share * ESTIMATE_SECONDS_PER_PAGE * self.algorithms.len() as f64 / 3.0;
        Estimate {
            seconds: load + measured,
            measured_seconds: measured,
            disk_bytes: bytes,
            // Its own tables, or pgbench's loaded for it (not a dataset).
            prepare_seconds: (load - ESTIMATE_CLUSTER_SECONDS).max(0.0),
            ..Estimate::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_deterministic_and_spread() {
        assert_eq!(
            sample_blocks(100, 0.1),
            vec![5, 15, 25, 35, 45, 55, 65, 75, 85, 95]
        );
        assert_eq!(sample_blocks(100, 1.0), (0..100).collect::<Vec<_>>());
        assert_eq!(sample_blocks(7, 0.01), vec![3]);
        assert_eq!(sample_blocks(0, 0.5), Vec::<u64>::new());
        assert_eq!(sample_blocks(16394, 0.01).len(), 164);
    }

    #[test]
    fn slots_follow_the_articles_figures() {
        // seeds/004: 623 pages of zstd's 2,223 bytes on average.
        let (fits, b) = slot_bytes(2223, 8, 1024);
        assert!(!fits);
        assert_eq!(b, 1024 + 2048);
        assert_eq!(slot_bytes(2223, 8, 2048), (false, 2048 + 1024));
        assert_eq!(slot_bytes(2223, 8, 4096), (true, 4096));
        // An incompressible page is stored raw: one slot and the rest.
        assert_eq!(slot_bytes(8300, 8, 2048), (false, 8192));
        assert_eq!(slot_bytes(1016, 8, 1024), (true, 1024));
    }

    #[test]
    fn keys_are_checked() {
        let e = super::super::plan_entry(
            "{kind: compression-analysis, scale: 1, sample_fractions: [0.1, 0]}",
        )
        .unwrap_err();
        assert!(
            e.contains("sample_fractions[1]") && e.contains("out of range"),
            "{e}"
        );
        let e = super::super::plan_entry("{kind: compression-analysis, dataset: sql}").unwrap_err();
        assert!(e.contains("setup_sql"), "{e}");
        let e = super::super::plan_entry("{kind: compression-analysis, dataset: json, scale: 3}")
            .unwrap_err();
        assert!(e.contains("scale") && e.contains("dataset pgbench"), "{e}");
        let e = super::super::plan_entry(
            "{kind: compression-analysis, scale: 1, algorithms: [zstd, brotli]}",
        )
        .unwrap_err();
        assert!(e.contains("unknown algorithm `brotli`"), "{e}");
    }
}
