//! A class's figure for one metric, as summaries, checks and `compare` use
//! it: for latency quantiles (`latency_ms_p50`, `_p90`, `_p99`, `_p999`)
//! when every cluster of the class sent its latency histogram, the
//! quantile of the merged distribution (all the class's transactions
//! together); for everything else, the median over the class's clusters.
//! Intervals resample clusters either way.

use crate::document::{ClassFigures, Summary};

use pgfleet_scenario::stats::{self, Histograms, Interval};

/// The quantile a metric names, for metrics read off a latency histogram.
fn quantile_of(metric: &str) -> Option<f64> {
    match metric {
        "latency_ms_p50" => Some(0.5),
        "latency_ms_p90" => Some(0.9),
        "latency_ms_p99" => Some(0.99),
        "latency_ms_p999" => Some(0.999),
        _ => None,
    }
}

/// Whether more of `kind`'s `metric` is better, as the kind declares it
/// (`pgfleet_proto::workload::Metric`). A metric no kind declares (one an
/// older pgfleet compared, read from its report) counts as lower-is-better,
/// as durations, latencies and sizes are.
pub fn higher_is_better(kind: &str, metric: &str) -> bool {
    pgfleet_proto::workload::metric(kind, metric)
        .is_some_and(|m| m.better == pgfleet_proto::workload::Better::Higher)
}

/// The class's figure for `metric` in the first summary of `kind` that
/// has one (e.g. a class's pgbench TPS), from report.json's `summaries`.
pub fn first_value(summaries: &[Summary], kind: &str, class: &str, metric: &str) -> Option<f64> {
    summaries
        .iter()
        .filter(|s| s.workload == kind)
        .find_map(|s| s.figure(class, metric))
        .map(|f| f.value)
}

pub struct Figure {
    values: Vec<f64>,
    merged: Option<(Histograms, f64)>,
}

impl Figure {
    /// A class's figure of `metric` at a point (`None`: not measured).
    pub fn of(class: &ClassFigures, metric: &str) -> Option<Figure> {
        Figure::of_values(class, metric, &class.metrics.get(metric)?.values)
    }

    /// The figure of these cluster values of `metric`, with the class's
    /// latency histograms where the metric is a quantile of them.
    pub fn of_values(class: &ClassFigures, metric: &str, values: &[f64]) -> Option<Figure> {
        if values.is_empty() {
            return None;
        }
        let merged = quantile_of(metric).and_then(|q| {
            let hs = class.latency_histograms_us.as_ref()?;
            (hs.len() == values.len()).then(|| (Histograms::new(hs), q))
        });
        Some(Figure {
            values: values.to_vec(),
            merged,
        })
    }

    pub fn clusters(&self) -> usize {
        self.values.len()
    }

    /// Whether the figure is a merged distribution's quantile.
    pub fn merged(&self) -> bool {
        self.merged.is_some()
    }

    /// The figure over clusters `idx` (a resample may repeat one).
    pub fn at(&self, idx: &[usize]) -> f64 {
        match &self.merged {
            Some((h, q)) => h.quantile(idx, *q) / 1000.0,
            None => stats::median(&idx.iter().map(|&i| self.values[i]).collect::<Vec<_>>()),
        }
    }

    pub fn value(&self) -> f64 {
        self.at(&(0..self.clusters()).collect::<Vec<_>>())
    }

    pub fn interval(&self, level: f64, seed: u64) -> Interval {
        stats::bootstrap(self.clusters(), level, seed, |i| self.at(i))
    }

    /// `self / base` and its interval.
    pub fn ratio(&self, base: &Figure, level: f64, seed: u64) -> (f64, Interval) {
        let i = stats::bootstrap_ratio(
            (self.clusters(), |i: &[usize]| self.at(i)),
            (base.clusters(), |i: &[usize]| base.at(i)),
            level,
            seed,
        );
        (self.value() / base.value(), i)
    }
}

#[cfg(test)]
mod tests {
    use super::higher_is_better;

    /// The direction is the kind's declaration, not a guess from the name:
    /// fio's IOPS (which no name rule caught) are better higher.
    #[test]
    fn a_metrics_direction_is_what_its_kind_declares() {
        assert!(higher_is_better("fio", "iops"));
        assert!(higher_is_better("pgbench", "tps"));
        assert!(higher_is_better("vacuum-bloat", "heap_mb_per_s"));
        assert!(!higher_is_better("pgbench", "latency_ms_p99"));
        assert!(!higher_is_better("logical-drain", "drain_seconds"));
        // Every compared metric of every kind is declared one way or the other.
        for k in pgfleet_proto::workload::KINDS {
            for m in k.compared {
                assert_eq!(
                    higher_is_better(k.name, m.name),
                    m.better == pgfleet_proto::workload::Better::Higher
                );
                assert!(
                    !m.unit.is_empty() && !m.description.is_empty(),
                    "{}.{}",
                    k.name,
                    m.name
                );
            }
        }
    }
}
