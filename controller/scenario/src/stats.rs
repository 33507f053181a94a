//! Statistics behind verdicts: medians and percentile-bootstrap confidence
//! intervals, reproducible (a fixed seed per figure), and the three-way
//! judgement of an interval against bounds.
//!
//! A class's figure is the median over its clusters (replicas). Its
//! interval resamples those clusters with replacement `RESAMPLES` times and
//! takes the central `level` share of the resampled medians; a ratio
//! resamples both classes independently. With one cluster the interval is
//! the value itself: nothing says how much it would move.

/// Resamples per interval: enough that the interval's ends move by well
/// under a percent of its width from one seed to another.
pub const RESAMPLES: usize = 4000;

/// The median (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// splitmix64: small, fast, and the same sequence everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// A seed from a text (the check's or figure's name), so that a figure's
/// interval is the same on every rendering of the report.
pub fn seed_of(text: &str) -> u64 {
    // FNV-1a
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

/// The central `level` share of `stats` (sorted here).
fn central(mut stats: Vec<f64>, level: f64) -> Interval {
    stats.retain(|x| x.is_finite());
    stats.sort_by(|a, b| a.total_cmp(b));
    if stats.is_empty() {
        return Interval {
            lo: f64::NAN,
            hi: f64::NAN,
        };
    }
    let tail = (1.0 - level) / 2.0;
    let at = |q: f64| {
        let i = (q * (stats.len() - 1) as f64).round() as usize;
        stats[i.min(stats.len() - 1)]
    };
    Interval {
        lo: at(tail),
        hi: at(1.0 - tail),
    }
}

/// Percentile-bootstrap interval of the median of `v` at `level` (0.95).
pub fn median_interval(v: &[f64], level: f64, seed: u64) -> Interval {
    bootstrap(v.len(), level, seed, |i| median(&pick(v, i)))
}

/// Percentile-bootstrap interval of `median(a) / median(b)`, each side
/// resampled independently.
pub fn ratio_interval(a: &[f64], b: &[f64], level: f64, seed: u64) -> Interval {
    bootstrap_ratio(
        (a.len(), |i: &[usize]| median(&pick(a, i))),
        (b.len(), |i: &[usize]| median(&pick(b, i))),
        level,
        seed,
    )
}

fn pick(v: &[f64], idx: &[usize]) -> Vec<f64> {
    idx.iter().map(|&i| v[i]).collect()
}

/// Percentile-bootstrap interval of any statistic of `n` clusters: each
/// resample draws `n` cluster indices with replacement.
pub fn bootstrap(
    n: usize,
    level: f64,
    seed: u64,
    mut stat: impl FnMut(&[usize]) -> f64,
) -> Interval {
    let all: Vec<usize> = (0..n).collect();
    if n <= 1 {
        let x = stat(&all);
        return Interval { lo: x, hi: x };
    }
    let mut rng = Rng::new(seed);
    let mut idx = vec![0; n];
    let stats = (0..RESAMPLES)
        .map(|_| {
            for i in idx.iter_mut() {
                *i = rng.below(n);
            }
            stat(&idx)
        })
        .collect();
    central(stats, level)
}

/// Percentile-bootstrap interval of `a(...) / b(...)`, the two sides'
/// clusters resampled independently.
pub fn bootstrap_ratio(
    (na, mut a): (usize, impl FnMut(&[usize]) -> f64),
    (nb, mut b): (usize, impl FnMut(&[usize]) -> f64),
    level: f64,
    seed: u64,
) -> Interval {
    if na <= 1 && nb <= 1 {
        let r = a(&[0]) / b(&[0]);
        return Interval { lo: r, hi: r };
    }
    let mut rng = Rng::new(seed);
    let (mut ia, mut ib) = (vec![0; na], vec![0; nb]);
    let stats = (0..RESAMPLES)
        .map(|_| {
            for i in ia.iter_mut() {
                *i = rng.below(na);
            }
            for i in ib.iter_mut() {
                *i = rng.below(nb);
            }
            a(&ia) / b(&ib)
        })
        .collect();
    central(stats, level)
}

/// Several clusters' latency histograms (`[value, count]` buckets of HDR
/// histograms with the same precision) laid over one list of bucket
/// values, so that any multiset of clusters merges in one pass.
#[derive(Debug, Clone)]
pub struct Histograms {
    values: Vec<u64>,
    /// Per cluster, its count at each of `values`.
    counts: Vec<Vec<u64>>,
}

impl Histograms {
    pub fn new(clusters: &[Vec<[u64; 2]>]) -> Histograms {
        let mut values: Vec<u64> = clusters.iter().flatten().map(|b| b[0]).collect();
        values.sort_unstable();
        values.dedup();
        let counts = clusters
            .iter()
            .map(|h| {
                let mut c = vec![0u64; values.len()];
                for b in h {
                    if let Ok(i) = values.binary_search(&b[0]) {
                        c[i] += b[1];
                    }
                }
                c
            })
            .collect();
        Histograms { values, counts }
    }

    pub fn clusters(&self) -> usize {
        self.counts.len()
    }

    /// The `q` quantile of the merged distribution of clusters `idx` (each
    /// as many times as it is listed): the smallest bucket value with at
    /// least `q` of the samples at or below it, as HDR histograms answer.
    pub fn quantile(&self, idx: &[usize], q: f64) -> f64 {
        let total: u64 = idx
            .iter()
            .map(|&i| self.counts[i].iter().sum::<u64>())
            .sum();
        if total == 0 {
            return f64::NAN;
        }
        let want = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (j, v) in self.values.iter().enumerate() {
            seen += idx.iter().map(|&i| self.counts[i][j]).sum::<u64>();
            if seen >= want {
                return *v as f64;
            }
        }
        *self.values.last().unwrap_or(&0) as f64
    }
}

/// How an interval stands against a bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The whole interval satisfies the bound.
    Passed,
    /// The whole interval violates it.
    Failed,
    /// The interval straddles it (or there is nothing to judge).
    #[default]
    Inconclusive,
}

impl Verdict {
    /// Whether a check with this verdict passes.
    pub fn passes(self, inconclusive_passes: bool) -> bool {
        match self {
            Verdict::Passed => true,
            Verdict::Failed => false,
            Verdict::Inconclusive => inconclusive_passes,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// Judges `[lo, hi]` against `min <= x <= max` (either bound optional).
pub fn judge(i: Interval, min: Option<f64>, max: Option<f64>) -> Verdict {
    if !(i.lo.is_finite() && i.hi.is_finite()) {
        return Verdict::Inconclusive;
    }
    let inside = min.is_none_or(|m| i.lo >= m) && max.is_none_or(|m| i.hi <= m);
    let outside = min.is_some_and(|m| i.hi < m) || max.is_some_and(|m| i.lo > m);
    if inside {
        Verdict::Passed
    } else if outside {
        Verdict::Failed
    } else {
        Verdict::Inconclusive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Standard normal draws (Box–Muller).
    fn normal(rng: &mut Rng, n: usize, mean: f64, sd: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let (u1, u2) = (rng.next_f64().max(1e-12), rng.next_f64());
                mean + sd * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
            })
            .collect()
    }

    #[test]
    fn the_median_interval_covers_the_true_median_at_its_level() {
        // 200 samples of 40 from N(100, 10): a 90 % interval should hold
        // the true median (100) about 90 % of the time.
        let mut rng = Rng::new(7);
        let mut hits = 0;
        let mut widths = Vec::new();
        for k in 0..200 {
            let v = normal(&mut rng, 40, 100.0, 10.0);
            let i = median_interval(&v, 0.90, k);
            if i.lo <= 100.0 && 100.0 <= i.hi {
                hits += 1;
            }
            widths.push(i.hi - i.lo);
        }
        assert!((165..=195).contains(&hits), "coverage {hits}/200");
        // The median's standard error is sqrt(pi/2)*sd/sqrt(n) ~ 1.98: a
        // 90 % interval is about 2 * 1.645 * 1.98 ~ 6.5 wide.
        let w = median(&widths);
        assert!((4.5..9.0).contains(&w), "median width {w}");
    }

    #[test]
    fn the_ratio_interval_covers_the_true_ratio() {
        let mut rng = Rng::new(11);
        let mut hits = 0;
        for k in 0..100 {
            let a = normal(&mut rng, 30, 400.0, 20.0);
            let b = normal(&mut rng, 30, 100.0, 5.0);
            let i = ratio_interval(&a, &b, 0.95, 1000 + k);
            if i.lo <= 4.0 && 4.0 <= i.hi {
                hits += 1;
            }
            assert!(i.lo < i.hi);
        }
        assert!((88..=100).contains(&hits), "coverage {hits}/100");
    }

    #[test]
    fn intervals_are_reproducible_and_degenerate_for_one_value() {
        let v = [3.0, 9.0, 4.0, 7.0];
        assert_eq!(median_interval(&v, 0.95, 5), median_interval(&v, 0.95, 5));
        assert_eq!(
            median_interval(&[42.0], 0.95, 1),
            Interval { lo: 42.0, hi: 42.0 }
        );
        assert_eq!(
            ratio_interval(&[8.0], &[2.0], 0.95, 1),
            Interval { lo: 4.0, hi: 4.0 }
        );
        let i = median_interval(&v, 0.95, 5);
        assert!(i.lo >= 3.0 && i.hi <= 9.0 && i.lo < i.hi, "{i:?}");
    }

    #[test]
    fn merged_quantiles_equal_those_of_the_concatenated_samples() {
        use hdrhistogram::Histogram;
        // Three clusters with different latency distributions (µs): one
        // fast, one slow, one with a long tail.
        let mut rng = Rng::new(3);
        let mut all = Vec::new();
        let mut hists = Vec::new();
        for (base, spread, n) in [
            (200.0, 50.0, 20_000),
            (900.0, 300.0, 5_000),
            (300.0, 5_000.0, 8_000),
        ] {
            let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
            for x in normal(&mut rng, n, base, spread) {
                let v = x.abs().max(1.0) as u64;
                h.record(v).unwrap();
                all.push(v);
            }
            hists.push(
                h.iter_recorded()
                    .map(|v| [v.value_iterated_to(), v.count_at_value()])
                    .collect::<Vec<_>>(),
            );
        }
        all.sort_unstable();
        let merged = Histograms::new(&hists);
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact =
                all[((q * all.len() as f64).ceil() as usize).clamp(1, all.len()) - 1] as f64;
            let got = merged.quantile(&[0, 1, 2], q);
            assert!(
                (got - exact).abs() <= exact * 0.001 + 1.0,
                "q {q}: merged {got} vs exact {exact}"
            );
        }
        // Not the median of the clusters' own p99s.
        let p99s: Vec<f64> = (0..3).map(|i| merged.quantile(&[i], 0.99)).collect();
        assert!((median(&p99s) - merged.quantile(&[0, 1, 2], 0.99)).abs() > 100.0);
        // A cluster listed twice counts twice.
        assert!(merged.quantile(&[1, 1, 0], 0.5) > merged.quantile(&[0, 0, 1], 0.5));
    }

    #[test]
    fn verdicts() {
        let i = |lo, hi| Interval { lo, hi };
        assert_eq!(judge(i(0.2, 0.4), None, Some(0.5)), Verdict::Passed);
        assert_eq!(judge(i(0.6, 0.9), None, Some(0.5)), Verdict::Failed);
        assert_eq!(judge(i(0.4, 0.6), None, Some(0.5)), Verdict::Inconclusive);
        assert_eq!(judge(i(10.0, 12.0), Some(5.0), Some(20.0)), Verdict::Passed);
        assert_eq!(judge(i(1.0, 2.0), Some(5.0), None), Verdict::Failed);
        assert_eq!(judge(i(4.0, 6.0), Some(5.0), None), Verdict::Inconclusive);
        assert_eq!(
            judge(i(f64::NAN, f64::NAN), Some(5.0), None),
            Verdict::Inconclusive
        );
        assert_eq!(judge(i(5.0, 5.0), Some(5.0), Some(5.0)), Verdict::Passed);
    }
}
