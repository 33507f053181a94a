//! Whether a measured window was steady: the drift of its per-second
//! throughput. A least-squares line through the means of ten equal blocks
//! of the window (blocks, so the seconds' autocorrelation does not narrow
//! the interval: block means of a stationary series are near independent),
//! its slope's 95 % interval from Student's t with 8 degrees of freedom,
//! both given as the change over the whole window in percent of its mean.
//! A window **drifts** when that interval excludes zero and the drift is
//! larger than `DRIFT_PCT`: a run that never reached a steady state (gp3's
//! burst credits running out, a cache still filling) is flagged instead of
//! averaged into a figure. Shorter windows than `MIN_SECONDS` are not
//! judged.

use serde::{Deserialize, Serialize};

/// A drift over the window smaller than this is no drift.
pub const DRIFT_PCT: f64 = 10.0;

/// The shortest window judged (ten blocks of two seconds).
pub const MIN_SECONDS: usize = 20;

const BLOCKS: usize = 10;

/// Student's t, two-sided 95 %, 8 degrees of freedom (BLOCKS - 2).
const T_95_8: f64 = 2.306;

/// A window's drift.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// The fitted change from the window's start to its end, in percent of
    /// its mean throughput (negative: it fell).
    pub drift_pct: f64,
    /// Its 95 % interval.
    pub interval_pct: [f64; 2],
    /// No material, significant drift (see the module's text).
    pub steady: bool,
}

/// The drift of `per_second` (one throughput figure a second); None when
/// the window is shorter than `MIN_SECONDS` or had no throughput.
pub fn drift(per_second: &[f64]) -> Option<Drift> {
    let n = per_second.len();
    if n < MIN_SECONDS {
        return None;
    }
    let size = n / BLOCKS;
    // The window's end is what matters most: whole blocks from its end.
    let series = &per_second[n - size * BLOCKS..];
    let mean = series.iter().sum::<f64>() / series.len() as f64;
    if mean <= 0.0 || !mean.is_finite() {
        return None;
    }
    let points: Vec<(f64, f64)> = series
        .chunks(size)
        .enumerate()
        .map(|(i, c)| {
            let x = (i as f64 + 0.5) * size as f64;
            (x, c.iter().sum::<f64>() / c.len() as f64)
        })
        .collect();
    let k = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / k;
    let my = points.iter().map(|p| p.1).sum::<f64>() / k;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let ssr: f64 = points
        .iter()
        .map(|p| (p.1 - (my + slope * (p.0 - mx))).powi(2))
        .sum();
    let se = (ssr / (k - 2.0) / sxx).sqrt();
    let span = series.len() as f64;
    let pct = |s: f64| s * span / mean * 100.0;
    let interval_pct = [pct(slope - T_95_8 * se), pct(slope + T_95_8 * se)];
    let drift_pct = pct(slope);
    let significant = interval_pct[0] > 0.0 || interval_pct[1] < 0.0;
    Some(Drift {
        drift_pct,
        interval_pct,
        steady: !(significant && drift_pct.abs() > DRIFT_PCT),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded generator of normal noise (Box-Muller on a xorshift).
    fn noise(seed: u64, n: usize, sd: f64) -> Vec<f64> {
        let mut s = seed;
        let mut u = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (a, b) = (u().max(1e-12), u());
                sd * (-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()
            })
            .collect()
    }

    /// On synthetic windows of known drift: a flat one with 5 % noise is
    /// steady in at least 98 % of seeds, a 20 % fall over the window drifts
    /// in every seed, and the 95 % interval covers the true drift in
    /// 90-100 % of them.
    #[test]
    fn drift_is_found_where_it_is_and_not_where_it_is_not() {
        let n = 60;
        let mut flagged_flat = 0;
        let mut covered = 0;
        // The true drift: a 200-TPS fall over a window whose mean is 901.67.
        let truth = -200.0 / (1000.0 * (1.0 - 0.2 * 29.5 / 60.0)) * 100.0;
        for seed in 1..=200u64 {
            let flat: Vec<f64> = noise(seed, n, 50.0).iter().map(|e| 1000.0 + e).collect();
            let d = drift(&flat).unwrap();
            if !d.steady {
                flagged_flat += 1;
            }
            let falling: Vec<f64> = noise(seed + 1000, n, 50.0)
                .iter()
                .enumerate()
                .map(|(i, e)| 1000.0 * (1.0 - 0.2 * i as f64 / n as f64) + e)
                .collect();
            let d = drift(&falling).unwrap();
            assert!(!d.steady, "seed {seed}: {d:?}");
            assert!((d.drift_pct - truth).abs() < 10.0, "seed {seed}: {d:?}");
            assert!(d.interval_pct[0] < d.drift_pct && d.drift_pct < d.interval_pct[1]);
            if d.interval_pct[0] <= truth && truth <= d.interval_pct[1] {
                covered += 1;
            }
        }
        assert!(
            flagged_flat <= 4,
            "{flagged_flat} of 200 flat windows flagged"
        );
        // The 95 % interval holds the true drift about 95 % of the time.
        assert!(
            (180..=200).contains(&covered),
            "{covered} of 200 intervals cover"
        );
        // PostgresBench's gp3 runs fell 5,092 → 4,636 → 4,362 TPS run after
        // run; one run falling like that within its window is flagged.
        let gp3: Vec<f64> = (0..600)
            .map(|i| 5092.0 - (5092.0 - 4362.0) * i as f64 / 600.0)
            .collect();
        assert!(!drift(&gp3).unwrap().steady);
        assert!(drift(&[1.0; 19]).is_none(), "too short to judge");
        assert!(drift(&[0.0; 30]).is_none(), "no throughput");
    }
}
