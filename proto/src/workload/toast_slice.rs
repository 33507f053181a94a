//! `toast-slice` (SPEC Experiment 2, seeds/000): read `slice_bytes` from
//! the middle of one large bytea value stored EXTERNAL / pglz / lz4.
//!
//! One cell per (entry, instance class, dataset): it measures every storage
//! mode and offset of that dataset on one fresh cluster.

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{
    Better, CLUSTER_BASE_BYTES, Cache, Capacity, Checked, ESTIMATE_CLUSTER_SECONDS, Estimate,
    Field, KindParams, KindSpec, Metric, Work, human_bytes, or,
};

pub const DESCRIPTION: &str =
    "substring() of a large bytea value stored EXTERNAL / pglz / lz4: storage, buffers, latency";
/// Summarized per class and compared between classes in reports.
pub const COMPARED: &[Metric] = &[
    Metric::new(
        "latency_ms_p50",
        "ms",
        Better::Lower,
        "median latency of a slice read",
    ),
    Metric::new(
        "latency_ms_p99",
        "ms",
        Better::Lower,
        "99th percentile latency of a slice read",
    ),
    Metric::new(
        "buffers_shared_hit",
        "buffers",
        Better::Lower,
        "shared buffers a read touched",
    ),
];
/// Keys a scenario may sweep: a list of values is one point per value.
pub const SWEPT: &[&str] = &["value_bytes", "slice_bytes"];

pub const STORAGE_MODES: &[&str] = &["external", "pglz", "lz4", "default"];
/// What an entry naming no `storage_modes` compares (the articles' three).
pub const DEFAULT_STORAGE_MODES: &[&str] = &["external", "pglz", "lz4"];
pub const DATASETS: &[&str] = &["abcd", "mixed", "incompressible"];
/// PostgreSQL's bytea limit.
const MAX_VALUE_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageMode {
    External,
    Pglz,
    Lz4,
    /// EXTENDED with the server's `default_toast_compression` (pglz up to
    /// 18; what 19 stores by default is what this mode measures).
    Default,
}

impl StorageMode {
    pub fn parse(s: &str) -> Option<StorageMode> {
        [
            StorageMode::External,
            StorageMode::Pglz,
            StorageMode::Lz4,
            StorageMode::Default,
        ]
        .into_iter()
        .find(|m| m.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            StorageMode::External => "external",
            StorageMode::Pglz => "pglz",
            StorageMode::Lz4 => "lz4",
            StorageMode::Default => "default",
        }
    }
    pub fn table(self) -> String {
        format!("toast_{}", self.name())
    }
    pub fn ddl(self) -> String {
        let t = self.table();
        format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id bigint PRIMARY KEY, payload bytea); ALTER TABLE {t} {};",
            self.alter_column("payload")
        )
    }
    /// The `ALTER TABLE` clauses that give `column` this mode (PostgreSQL 15
    /// lacks `CREATE TABLE ... STORAGE`).
    pub fn alter_column(self, column: &str) -> String {
        match self {
            StorageMode::External => format!("ALTER COLUMN {column} SET STORAGE EXTERNAL"),
            StorageMode::Default => format!("ALTER COLUMN {column} SET STORAGE EXTENDED"),
            StorageMode::Pglz | StorageMode::Lz4 => format!(
                "ALTER COLUMN {column} SET STORAGE EXTENDED, ALTER COLUMN {column} SET COMPRESSION {}",
                self.name()
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dataset {
    /// Repeating `ABCD`: extremely compressible.
    Abcd,
    /// 64-byte blocks: 32 repeating ASCII bytes + the 32 hex chars of an md5.
    Mixed,
    /// Concatenated binary md5 digests: does not compress.
    Incompressible,
}

impl Dataset {
    pub fn parse(s: &str) -> Option<Dataset> {
        [Dataset::Abcd, Dataset::Mixed, Dataset::Incompressible]
            .into_iter()
            .find(|d| d.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            Dataset::Abcd => "abcd",
            Dataset::Mixed => "mixed",
            Dataset::Incompressible => "incompressible",
        }
    }
    /// A SQL expression of one bytea of exactly `$1` (bigint) bytes, built
    /// in memory (never compressed) from generate_series.
    pub fn sql(self) -> &'static str {
        match self {
            Dataset::Abcd => {
                "SELECT substring(convert_to(repeat('ABCD', ($1::bigint / 4 + 1)::int), 'UTF8') FROM 1 FOR $1::bigint::int)"
            }
            Dataset::Mixed => {
                "SELECT substring(convert_to(string_agg(repeat(chr(65 + (i % 26)::int), 32) || md5(i::text), '' ORDER BY i), 'UTF8') FROM 1 FOR $1::bigint::int) \
                 FROM generate_series(0, $1::bigint / 64) AS i"
            }
            Dataset::Incompressible => {
                "SELECT substring(string_agg(decode(md5(i::text), 'hex'), ''::bytea ORDER BY i) FROM 1 FOR $1::bigint::int) \
                 FROM generate_series(0, $1::bigint / 16) AS i"
            }
        }
    }
}

/// The scenario keys of `kind: toast-slice`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    #[serde(default)]
    pub storage_modes: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub datasets: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub value_bytes: Option<Spanned<u64>>,
    /// `"50%"` of the value or a 1-based byte position.
    #[serde(default)]
    pub offsets: Option<Vec<Spanned<OffsetSpec>>>,
    #[serde(default)]
    pub slice_bytes: Option<Spanned<u64>>,
    #[serde(default)]
    pub duration_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub repeats: Option<Spanned<u32>>,
    #[serde(default)]
    pub warmup_s: Option<Spanned<f64>>,
    /// `warm` (default: a warm-up, then a closed loop of reads from
    /// memory, as the article measured) or `cold` (each repeat is one read
    /// after the cluster restarted and its files left the page cache:
    /// what a read from the storage costs).
    #[serde(default)]
    pub cache: Option<Spanned<String>>,
}

/// `"50%"` (of the value) or an absolute 1-based byte position.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum OffsetSpec {
    Byte(u64),
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offset {
    /// As the scenario wrote it ("50%" or "5242881").
    pub label: String,
    /// 1-based byte position, as substring() takes it.
    pub byte: u64,
}

/// One cell: one dataset, every storage mode and offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub storage_modes: Vec<StorageMode>,
    pub dataset: Dataset,
    pub value_bytes: u64,
    pub offsets: Vec<Offset>,
    pub slice_bytes: u32,
    pub duration_s: f64,
    pub repeats: u32,
    pub warmup_s: f64,
    #[serde(default)]
    pub cache: Cache,
}

/// A measured point's parameters: one storage mode at one offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointParams {
    pub storage_mode: StorageMode,
    pub dataset: Dataset,
    pub value_bytes: u64,
    pub offset: u64,
    pub offset_label: String,
    pub slice_bytes: u32,
    #[serde(default)]
    pub cache: Cache,
}

/// A measured point's figures: physical storage of the value, the slice
/// query's buffers (EXPLAIN ANALYZE) and its latency (median over repeats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub stored_bytes: i64,
    /// NULL (None) = not compressed.
    pub compression: Option<String>,
    pub external: bool,
    pub toast_chunks: i64,
    pub buffers_shared_hit: i64,
    pub buffers_shared_read: i64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_mean: f64,
    pub calls: u64,
    pub repeats: u32,
}

pub type Point = super::Point<PointParams, Metrics>;

impl KindSpec for Spec {
    type Params = Params;

    fn plan(&self, f: &Field) -> Checked<Vec<(String, Params)>> {
        f.in_range(
            &self.value_bytes,
            "value_bytes",
            1024,
            MAX_VALUE_BYTES,
            " (bytea's limit)",
        )?;
        let value_bytes = or(&self.value_bytes, 10 * 1024 * 1024);
        let lists = [
            f.names(
                &self.storage_modes,
                "storage_modes",
                STORAGE_MODES,
                "storage mode",
                DEFAULT_STORAGE_MODES,
            )?,
            f.names(&self.datasets, "datasets", DATASETS, "dataset", &["mixed"])?,
        ];
        let offsets = match &self.offsets {
            Some(o) if o.is_empty() => return f.err(f.kind_at, "offsets", "must not be empty"),
            Some(o) => o.clone(),
            None => ["0%", "50%", "90%"]
                .iter()
                .map(|s| Spanned {
                    value: OffsetSpec::Text(s.to_string()),
                    referenced: f.kind_at,
                    defined: f.kind_at,
                })
                .collect(),
        };
        let mut resolved = Vec::new();
        for (j, o) in offsets.iter().enumerate() {
            let byte = resolve_offset(&o.value, value_bytes)
                .or_else(|m| f.err(o.referenced, &format!("offsets[{j}]"), m))?;
            let label = match &o.value {
                OffsetSpec::Byte(b) => b.to_string(),
                OffsetSpec::Text(t) => t.trim().to_string(),
            };
            resolved.push(Offset { label, byte });
        }
        f.in_range(
            &self.slice_bytes,
            "slice_bytes",
            1,
            value_bytes.min(i32::MAX as u64),
            " (value_bytes)",
        )?;
        f.in_range(&self.repeats, "repeats", 1, 1000, "")?;
        f.in_range(&self.duration_s, "duration_s", 0.001, 86_400.0, " seconds")?;
        f.in_range(&self.warmup_s, "warmup_s", 0.0, 3_600.0, " seconds")?;
        let cache = f.cache(&self.cache, Cache::Warm)?;
        let modes: Vec<StorageMode> = lists[0]
            .iter()
            .filter_map(|m| StorageMode::parse(m))
            .collect();
        Ok(lists[1]
            .iter()
            .filter_map(|d| Dataset::parse(d))
            .map(|dataset| {
                (
                    format!("{}-{}", dataset.name(), human_bytes(value_bytes)),
                    Params {
                        storage_modes: modes.clone(),
                        dataset,
                        value_bytes,
                        offsets: resolved.clone(),
                        slice_bytes: or(&self.slice_bytes, 100) as u32,
                        duration_s: or(&self.duration_s, 30.0),
                        repeats: or(&self.repeats, 5),
                        warmup_s: or(&self.warmup_s, 0.5),
                        cache,
                    },
                )
            })
            .collect())
    }
}

impl KindParams for Params {
    fn check(&self) -> Result<(), String> {
        use super::within;
        within("value_bytes", self.value_bytes, 1024, MAX_VALUE_BYTES)?;
        within(
            "slice_bytes",
            u64::from(self.slice_bytes),
            1,
            self.value_bytes,
        )?;
        within("repeats", self.repeats, 1, 1000)?;
        within("duration_s", self.duration_s, 0.001, 86_400.0)?;
        within("offsets", self.offsets.len(), 1, 1000)?;
        for o in &self.offsets {
            within("offsets[].byte", o.byte, 1, self.value_bytes)?;
        }
        Ok(())
    }
    fn estimate(&self, c: &Capacity) -> Estimate {
        let modes = self.storage_modes.len() as u64;
        // A cold read costs a restart (a checkpoint, then start-up): ~2 s.
        let per_read = if self.cache == Cache::Cold {
            2.0
        } else {
            self.duration_s
        };
        let measured = self.repeats as f64 * (modes * self.offsets.len() as u64) as f64 * per_read;
        // The value is built in memory, written to each table (TOAST and
        // WAL), read back to verify, vacuumed.
        let setup = Work::bulk_write(3.0 * (modes * self.value_bytes) as f64).seconds(c);
        Estimate {
            seconds: ESTIMATE_CLUSTER_SECONDS + setup + self.warmup_s + measured,
            measured_seconds: measured,
            // Each table holds at most the raw value; WAL holds it again.
            disk_bytes: CLUSTER_BASE_BYTES + 2 * modes * self.value_bytes,
            prepare_seconds: setup + self.warmup_s,
            ..Estimate::default()
        }
    }
}

/// `"p%"` of a value of `n` bytes is byte floor(n * p / 100) + 1 (so 0% is
/// byte 1 and 50% of 10 MiB is 5,242,881); a number is a 1-based byte
/// position as substring() takes it.
pub fn resolve_offset(o: &OffsetSpec, n: u64) -> Result<u64, String> {
    let byte = match o {
        OffsetSpec::Byte(b) => *b,
        OffsetSpec::Text(t) => {
            let t = t.trim();
            if let Some(p) = t.strip_suffix('%') {
                let p: f64 = p.trim().parse().map_err(|_| {
                    format!("`{t}` is not a percentage: write e.g. \"50%\" or a byte position")
                })?;
                if !(0.0..100.0).contains(&p) {
                    return Err(format!(
                        "`{t}` is out of range: percentages must be at least 0% and below 100%"
                    ));
                }
                ((n as f64 * p / 100.0).floor() as u64) + 1
            } else {
                t.parse().map_err(|_| format!("`{t}` is not an offset: write a percentage such as \"50%\" or a 1-based byte position"))?
            }
        }
    };
    if byte == 0 || byte > n {
        return Err(format!(
            "byte position {byte} is outside the value: allowed 1..={n} (value_bytes)"
        ));
    }
    Ok(byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_follow_the_article() {
        let n = 10 * 1024 * 1024;
        let pct = |s: &str| resolve_offset(&OffsetSpec::Text(s.into()), n).unwrap();
        assert_eq!(pct("0%"), 1);
        assert_eq!(pct("50%"), 5_242_881);
        assert_eq!(pct("90%"), 9_437_185);
        assert_eq!(resolve_offset(&OffsetSpec::Byte(7), n).unwrap(), 7);
        assert_eq!(pct("42"), 42);
        assert!(resolve_offset(&OffsetSpec::Text("100%".into()), n).is_err());
        assert!(resolve_offset(&OffsetSpec::Byte(0), n).is_err());
        assert!(resolve_offset(&OffsetSpec::Byte(n + 1), n).is_err());
    }

    #[test]
    fn the_article_matrix_is_ninety_minutes_of_measurement() {
        // scenarios/toast-slice.yaml: 3 modes x 3 offsets x 5 repeats x 30 s
        // per dataset, 4 cells.
        let p = Params {
            storage_modes: vec![StorageMode::External, StorageMode::Pglz, StorageMode::Lz4],
            dataset: Dataset::Mixed,
            value_bytes: 10 << 20,
            offsets: (0..3)
                .map(|i| Offset {
                    label: i.to_string(),
                    byte: i + 1,
                })
                .collect(),
            slice_bytes: 100,
            duration_s: 30.0,
            repeats: 5,
            warmup_s: 0.5,
            cache: Cache::Warm,
        };
        let e = p.estimate(&super::super::Capacity::host());
        assert_eq!(e.measured_seconds, 1350.0);
        assert!(e.seconds > 1350.0 && e.seconds < 1400.0, "{e:?}");
        assert!(e.disk_bytes > 60 << 20 && e.disk_bytes < 200 << 20, "{e:?}");
    }
}
