//! `toast-probe` (SPEC Experiment 3, seeds/003 "what gets TOASTed"): where
//! PostgreSQL puts values of different sizes and contents, per storage mode,
//! and what reading them costs.
//!
//! One cell per (entry, instance class) runs the chosen probes on one fresh
//! cluster. Every probe builds its values server-side from an uncompressed
//! source (an expression, or a table whose column is EXTERNAL), so each
//! table compresses them itself:
//! - `threshold`: `repeat('x', n)` around the TOAST threshold (2,032-byte
//!   rows) → stored size, compression method;
//! - `placement`: the article's four values (short; 10 KB repetitive; 200 KB
//!   random; 1.1 MB repetitive) → inline / compressed inline / external /
//!   compressed and external, heap tuple size, TOAST chunks and bytes;
//! - `window`: `words` random 6-letter words from a vocabulary of V
//!   (`setseed`) → stored size per mode, and whether pglz gave up;
//! - `json`: order documents of 25–100 line items → table and TOAST sizes
//!   and load time per mode;
//! - `reads`: `left(body, 200)` over values of ~1 MB and a 200-byte read at
//!   byte 500,000 → buffers and latency per mode (toast-slice's loop).

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::toast_slice::StorageMode;
use super::{
    Better, ByteSize, CLUSTER_BASE_BYTES, Capacity, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate,
    Field, KindParams, KindSpec, Metric, Work, or,
};

pub const DESCRIPTION: &str = "what gets TOASTed: threshold, placement, compression window, JSON documents, prefix and mid reads per storage mode (seeds/003)";
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "stored_bytes",
        "bytes",
        Better::Lower,
        "bytes the value occupies on disk",
    ),
    Metric::new(
        "load_seconds",
        "s",
        Better::Lower,
        "time to build the values",
    ),
    Metric::new("latency_ms_p50", "ms", Better::Lower, "median read latency"),
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &[
    "json_documents",
    "read_values",
    "read_value_bytes",
    "prefix_chars",
];

pub const PROBES: &[&str] = &["threshold", "placement", "window", "json", "reads"];

/// The article's four placement values (seeds/003), as SQL text
/// expressions: (case, expression).
pub const PLACEMENT_VALUES: &[(&str, &str)] = &[
    ("short", "repeat('x', 200)"),
    ("repetitive-10KB", "repeat('abc', 3400)"),
    (
        "random-200KB",
        "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 6250))",
    ),
    (
        "repetitive-1.1MB",
        "repeat('The quick brown fox jumps over the lazy dog. ', 25000)",
    ),
];

/// The article's published figures (PostgreSQL 18, PlanetScale):
/// (probe, storage mode, case, metric, value). The report prints them
/// beside the measured ones.
pub const ARTICLE: &[(&str, &str, &str, &str, f64)] = &[
    ("threshold", "lz4", "1500", "stored_bytes", 1504.0),
    ("threshold", "lz4", "2000", "stored_bytes", 2004.0),
    ("threshold", "lz4", "2001", "stored_bytes", 26.0),
    ("placement", "lz4", "short", "stored_bytes", 204.0),
    ("placement", "lz4", "repetitive-10KB", "stored_bytes", 60.0),
    (
        "placement",
        "lz4",
        "random-200KB",
        "stored_bytes",
        200_000.0,
    ),
    (
        "placement",
        "lz4",
        "repetitive-1.1MB",
        "stored_bytes",
        4471.0,
    ),
    ("window", "pglz", "V=500", "stored_bytes", 105_457.0),
    ("window", "lz4", "V=500", "stored_bytes", 96_022.0),
    ("window", "pglz", "V=5000", "stored_bytes", 209_999.0),
    ("window", "lz4", "V=5000", "stored_bytes", 177_590.0),
    ("json", "external", "documents", "total_bytes", 103e6),
    ("json", "pglz", "documents", "total_bytes", 19e6),
    ("json", "lz4", "documents", "total_bytes", 24e6),
    ("json", "pglz", "documents", "load_seconds", 1.66),
    ("json", "lz4", "documents", "load_seconds", 0.785),
    ("reads", "external", "prefix", "buffers_shared_hit", 301.0),
    ("reads", "pglz", "prefix", "buffers_shared_hit", 301.0),
    ("reads", "lz4", "prefix", "buffers_shared_hit", 6234.0),
    ("reads", "pglz", "prefix", "latency_ms_p50", 1.0),
    ("reads", "lz4", "prefix", "latency_ms_p50", 16.0),
    ("reads", "external", "mid", "latency_ms_p50", 0.6),
    ("reads", "lz4", "mid", "latency_ms_p50", 43.0),
    ("reads", "pglz", "mid", "latency_ms_p50", 116.0),
];

/// The article's figure for a point, if it published one.
pub fn article(probe: &str, mode: &str, case: &str, metric: &str) -> Option<f64> {
    ARTICLE
        .iter()
        .find(|a| a.0 == probe && a.1 == mode && a.2 == case && a.3 == metric)
        .map(|a| a.4)
}

/// The scenario keys of `kind: toast-probe`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Which probes to run (default: all, in the article's order).
    #[serde(default)]
    pub probes: Option<Vec<Spanned<String>>>,
    /// Storage modes compared (default external, pglz, lz4; `default`:
    /// EXTENDED with the server's own default compression).
    #[serde(default)]
    pub storage_modes: Option<Vec<Spanned<String>>>,
    /// threshold: value lengths in characters (default 1500, 2000, 2001).
    #[serde(default)]
    pub threshold_chars: Option<Vec<Spanned<u32>>>,
    /// window: words per value (default 30,000).
    #[serde(default)]
    pub window_words: Option<Spanned<u32>>,
    /// window: vocabulary sizes (default 500, 5,000).
    #[serde(default)]
    pub window_vocabularies: Option<Vec<Spanned<u32>>>,
    /// `setseed()` before drawing random values (default 0.42).
    #[serde(default)]
    pub seed: Option<Spanned<f64>>,
    /// json: documents (default 10,000).
    #[serde(default)]
    pub json_documents: Option<Spanned<u32>>,
    /// json: line items per document, drawn uniformly (default 25..=100).
    #[serde(default)]
    pub json_items_min: Option<Spanned<u32>>,
    #[serde(default)]
    pub json_items_max: Option<Spanned<u32>>,
    /// json: loads per mode, each timed (default 2, as the article).
    #[serde(default)]
    pub json_loads: Option<Spanned<u32>>,
    /// reads: values (default 100) of `read_value_bytes` (default 1MiB).
    #[serde(default)]
    pub read_values: Option<Spanned<u32>>,
    #[serde(default)]
    pub read_value_bytes: Option<Spanned<ByteSize>>,
    /// reads: characters of the prefix read (default 200).
    #[serde(default)]
    pub prefix_chars: Option<Spanned<u32>>,
    /// reads: 1-based byte of the mid read (default 500,000) and its length
    /// (default 200).
    #[serde(default)]
    pub mid_offset: Option<Spanned<u64>>,
    #[serde(default)]
    pub mid_bytes: Option<Spanned<u32>>,
    /// reads: the measurement loop (toast-slice's): seconds per repeat,
    /// repeats interleaved across points, warm-up.
    #[serde(default)]
    pub duration_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub repeats: Option<Spanned<u32>>,
    #[serde(default)]
    pub warmup_s: Option<Spanned<f64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Probe {
    Threshold,
    Placement,
    Window,
    Json,
    Reads,
}

impl Probe {
    pub fn parse(s: &str) -> Option<Probe> {
        [
            Probe::Threshold,
            Probe::Placement,
            Probe::Window,
            Probe::Json,
            Probe::Reads,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            Probe::Threshold => "threshold",
            Probe::Placement => "placement",
            Probe::Window => "window",
            Probe::Json => "json",
            Probe::Reads => "reads",
        }
    }
}

/// One cell: every chosen probe on one cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub probes: Vec<Probe>,
    pub storage_modes: Vec<StorageMode>,
    pub threshold_chars: Vec<u32>,
    pub window_words: u32,
    pub window_vocabularies: Vec<u32>,
    pub seed: f64,
    pub json_documents: u32,
    pub json_items_min: u32,
    pub json_items_max: u32,
    pub json_loads: u32,
    pub read_values: u32,
    pub read_value_bytes: u64,
    pub prefix_chars: u32,
    pub mid_offset: u64,
    pub mid_bytes: u32,
    pub duration_s: f64,
    pub repeats: u32,
    pub warmup_s: f64,
}

/// A measured point: one probe, one storage mode, one case (`"2001"`,
/// `"random-200KB"`, `"V=500"`, `"documents"`, `"prefix"`, `"mid"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub probe: Probe,
    pub storage_mode: StorageMode,
    pub case: String,
}

/// A point's figures; each probe fills the ones it measures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Uncompressed bytes (`octet_length`); for json, of all documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_bytes: Option<i64>,
    /// `pg_column_size` (one value), or for json and reads the sum over the
    /// values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<i64>,
    /// Compression method, None = stored uncompressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// inline / compressed inline / external / compressed external.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// The heap tuple's length (`lp_len`, pageinspect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_tuple_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toast_chunks: Option<i64>,
    /// Bytes of chunk data in the TOAST table for this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toast_bytes: Option<i64>,
    /// window: the mode compresses, yet stored the value raw (pglz's 25 %
    /// rule or its first-1 KiB rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gave_up: Option<bool>,
    /// json: heap, TOAST (with its index) and their sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toast_table_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<i64>,
    /// json: the median load time, and every load's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loads_seconds: Vec<f64>,
    /// reads: EXPLAIN (ANALYZE, BUFFERS) of the query over all values, warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_shared_hit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_shared_read: Option<i64>,
    /// reads: latency of one read of one value (median over repeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p99: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
}

pub type Point = super::Point<PointParams, Metrics>;

impl KindSpec for Spec {
    type Params = Params;

    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        let probes = f.names(&self.probes, "probes", PROBES, "probe", PROBES)?;
        let modes = f.names(
            &self.storage_modes,
            "storage_modes",
            super::toast_slice::STORAGE_MODES,
            "storage mode",
            super::toast_slice::DEFAULT_STORAGE_MODES,
        )?;
        let threshold_chars = match &self.threshold_chars {
            None => vec![1500, 2000, 2001],
            Some(l) if l.is_empty() => {
                return f.err(f.kind_at, "threshold_chars", "must not be empty");
            }
            Some(l) => {
                for (j, n) in l.iter().enumerate() {
                    if !(1..=1_000_000).contains(&n.value) {
                        return f.err(
                            n.referenced,
                            &format!("threshold_chars[{j}]"),
                            format!("{} is out of range: allowed 1..=1000000", n.value),
                        );
                    }
                }
                l.iter().map(|n| n.value).collect()
            }
        };
        f.in_range(&self.window_words, "window_words", 1, 10_000_000, "")?;
        let window_vocabularies = match &self.window_vocabularies {
            None => vec![500, 5000],
            Some(l) if l.is_empty() => {
                return f.err(f.kind_at, "window_vocabularies", "must not be empty");
            }
            Some(l) => {
                for (j, n) in l.iter().enumerate() {
                    if n.value < 1 {
                        return f.err(
                            n.referenced,
                            &format!("window_vocabularies[{j}]"),
                            "must be at least 1 word",
                        );
                    }
                }
                l.iter().map(|n| n.value).collect()
            }
        };
        f.in_range(&self.seed, "seed", -1.0, 1.0, " (setseed's range)")?;
        f.in_range(&self.json_documents, "json_documents", 1, 10_000_000, "")?;
        f.in_range(&self.json_items_min, "json_items_min", 1, 100_000, "")?;
        f.in_range(&self.json_items_max, "json_items_max", 1, 100_000, "")?;
        let (lo, hi) = (or(&self.json_items_min, 25), or(&self.json_items_max, 100));
        if lo > hi {
            let at = self
                .json_items_max
                .as_ref()
                .map_or(f.kind_at, |s| s.referenced);
            return f.err(
                at,
                "json_items_max",
                format!("{hi} is below json_items_min ({lo})"),
            );
        }
        f.in_range(&self.json_loads, "json_loads", 1, 100, "")?;
        f.in_range(&self.read_values, "read_values", 1, 100_000, "")?;
        let read_value_bytes = f
            .bytes(&self.read_value_bytes, "read_value_bytes", 4096)?
            .unwrap_or(1 << 20);
        if read_value_bytes > 1 << 30 {
            let at = self
                .read_value_bytes
                .as_ref()
                .map_or(f.kind_at, |s| s.referenced);
            return f.err(
                at,
                "read_value_bytes",
                "is out of range: allowed at most 1GiB (a value's limit)",
            );
        }
        f.in_range(&self.prefix_chars, "prefix_chars", 1, 1_000_000, "")?;
        f.in_range(&self.mid_bytes, "mid_bytes", 1, 1_000_000, "")?;
        f.in_range(
            &self.mid_offset,
            "mid_offset",
            1,
            read_value_bytes,
            " (read_value_bytes)",
        )?;
        f.in_range(&self.repeats, "repeats", 1, 1000, "")?;
        f.in_range(&self.duration_s, "duration_s", 0.001, 86_400.0, " seconds")?;
        f.in_range(&self.warmup_s, "warmup_s", 0.0, 3_600.0, " seconds")?;
        let params = Params {
            probes: probes.iter().filter_map(|p| Probe::parse(p)).collect(),
            storage_modes: modes.iter().filter_map(|m| StorageMode::parse(m)).collect(),
            threshold_chars,
            window_words: or(&self.window_words, 30_000),
            window_vocabularies,
            seed: or(&self.seed, 0.42),
            json_documents: or(&self.json_documents, 10_000),
            json_items_min: lo,
            json_items_max: hi,
            json_loads: or(&self.json_loads, 2),
            read_values: or(&self.read_values, 100),
            read_value_bytes,
            prefix_chars: or(&self.prefix_chars, 200),
            mid_offset: or(&self.mid_offset, 500_000).min(read_value_bytes),
            mid_bytes: or(&self.mid_bytes, 200),
            duration_s: or(&self.duration_s, 5.0),
            repeats: or(&self.repeats, 3),
            warmup_s: or(&self.warmup_s, 0.5),
        };
        Ok(vec![("probes".to_string(), params)])
    }
}

impl Params {
    /// Average bytes of one JSON line item as the agent builds it.
    pub const JSON_ITEM_BYTES: u64 = 110;

    fn json_raw_bytes(&self) -> u64 {
        let items = (self.json_items_min + self.json_items_max) as u64 / 2;
        self.json_documents as u64 * (items * Self::JSON_ITEM_BYTES + 60)
    }
}

impl KindParams for Params {
    fn check(&self) -> Result<(), String> {
        use super::within;
        within("window_words", self.window_words, 1, 10_000_000)?;
        within("json_documents", self.json_documents, 1, 10_000_000)?;
        within(
            "json_items_max",
            self.json_items_max,
            self.json_items_min,
            100_000,
        )?;
        within("json_loads", self.json_loads, 1, 100)?;
        within("read_values", self.read_values, 1, 100_000)?;
        within("read_value_bytes", self.read_value_bytes, 4096, 1 << 30)?;
        within("prefix_chars", self.prefix_chars, 1, 1_000_000)?;
        within("mid_bytes", self.mid_bytes, 1, 1_000_000)?;
        within("mid_offset", self.mid_offset, 1, self.read_value_bytes)?;
        within("repeats", self.repeats, 1, 1000)?;
        within("duration_s", self.duration_s, 0.001, 86_400.0)?;
        for t in &self.threshold_chars {
            within("threshold_chars[]", *t, 1, 1 << 30)?;
        }
        for v in &self.window_vocabularies {
            within("window_vocabularies[]", *v, 1, 10_000_000)?;
        }
        Ok(())
    }
    fn estimate(&self, c: &Capacity) -> Estimate {
        let modes = self.storage_modes.len() as u64;
        let mut setup_bytes = 0u64;
        let mut disk = 0u64;
        let mut measured = 0.0;
        for p in &self.probes {
            match p {
                Probe::Threshold | Probe::Placement => {
                    setup_bytes += modes * (2 << 20);
                    disk += modes * (2 << 20);
                }
                Probe::Window => {
                    let b = self.window_words as u64 * 7 * self.window_vocabularies.len() as u64;
                    setup_bytes += modes * b;
                    disk += modes * b;
                }
                Probe::Json => {
                    let raw = self.json_raw_bytes();
                    // The source, then each mode's table `json_loads` times.
                    setup_bytes += raw * (1 + modes * self.json_loads as u64);
                    disk += raw * (1 + modes);
                }
                Probe::Reads => {
                    let raw = self.read_values as u64 * self.read_value_bytes;
                    // A text and a bytea column per mode, and the source.
                    setup_bytes += raw * (1 + 2 * modes);
                    disk += raw * (1 + 2 * modes);
                    measured += 2.0 * modes as f64 * self.repeats as f64 * self.duration_s;
                }
            }
        }
        let prepare = Work::bulk_write(2.0 * setup_bytes as f64).seconds(c) + self.warmup_s;
        Estimate {
            seconds: ESTIMATE_CLUSTER_SECONDS + prepare + measured,
            measured_seconds: measured,
            // WAL holds what was written once more.
            disk_bytes: CLUSTER_BASE_BYTES + 2 * disk,
            prepare_seconds: prepare,
            ..Estimate::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan_entry;
    use super::*;

    #[test]
    fn defaults_are_the_articles() {
        let mut cells = plan_entry("{kind: toast-probe}").unwrap();
        assert_eq!(cells.len(), 1);
        let super::super::Params::ToastProbe(p) = cells.remove(0).1 else {
            panic!("not a toast-probe")
        };
        assert_eq!(p.probes.len(), 5);
        assert_eq!(p.threshold_chars, vec![1500, 2000, 2001]);
        assert_eq!(p.window_vocabularies, vec![500, 5000]);
        assert_eq!((p.window_words, p.seed), (30_000, 0.42));
        assert_eq!(
            (p.json_documents, p.json_items_min, p.json_items_max),
            (10_000, 25, 100)
        );
        assert_eq!(
            (p.read_values, p.read_value_bytes, p.mid_offset),
            (100, 1 << 20, 500_000)
        );
        assert_eq!(
            article("window", "lz4", "V=5000", "stored_bytes"),
            Some(177_590.0)
        );
    }

    #[test]
    fn bad_keys_are_located() {
        let e = plan_entry("{kind: toast-probe, probes: [threshold, toast]}").unwrap_err();
        assert!(
            e.contains("probes[1]") && e.contains("unknown probe `toast`"),
            "{e}"
        );
        let e =
            plan_entry("{kind: toast-probe, json_items_min: 50, json_items_max: 10}").unwrap_err();
        assert!(e.contains("json_items_max") && e.contains("below"), "{e}");
        let e = plan_entry("{kind: toast-probe, read_value_bytes: 8192, mid_offset: 9000}")
            .unwrap_err();
        assert!(
            e.contains("mid_offset") && e.contains("out of range"),
            "{e}"
        );
    }
}
