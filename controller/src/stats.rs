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

fn resample_median(v: &[f64], rng: &mut Rng, buf: &mut Vec<f64>) -> f64 {
    buf.clear();
    buf.extend((0..v.len()).map(|_| v[rng.below(v.len())]));
    median(buf)
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
    if v.len() <= 1 {
        let m = median(v);
        return Interval { lo: m, hi: m };
    }
    let mut rng = Rng::new(seed);
    let mut buf = Vec::with_capacity(v.len());
    let stats = (0..RESAMPLES)
        .map(|_| resample_median(v, &mut rng, &mut buf))
        .collect();
    central(stats, level)
}

/// Percentile-bootstrap interval of `median(a) / median(b)`, each side
/// resampled independently.
pub fn ratio_interval(a: &[f64], b: &[f64], level: f64, seed: u64) -> Interval {
    if a.len() <= 1 && b.len() <= 1 {
        let r = median(a) / median(b);
        return Interval { lo: r, hi: r };
    }
    let mut rng = Rng::new(seed);
    let (mut ba, mut bb) = (Vec::new(), Vec::new());
    let stats = (0..RESAMPLES)
        .map(|_| resample_median(a, &mut rng, &mut ba) / resample_median(b, &mut rng, &mut bb))
        .collect();
    central(stats, level)
}

/// How an interval stands against a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The whole interval satisfies the bound.
    Passed,
    /// The whole interval violates it.
    Failed,
    /// The interval straddles it (or there is nothing to judge).
    Inconclusive,
}

impl Verdict {
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
