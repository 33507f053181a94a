//! Change points in a series of runs' figures (`pgfleet history`).
//!
//! E-divisive means (Matteson and James, "A Nonparametric Approach for
//! Multiple Change Point Analysis of Multivariate Data", 2014; what Apache
//! Otava/Hunter and MongoDB's signal processing use) on the series' ranks
//! (so one run far off counts as one high rank, not by its distance), with
//! α = 1: the split
//! of a segment that maximises the scaled energy distance between its two
//! sides is a candidate; a permutation test (the segment's values shuffled
//! `permutations` times, seeded) gives its p-value; a significant split is
//! kept and both sides are searched again (binary segmentation). No side
//! may be shorter than `min_segment` runs, so a single spike is not a
//! change. On a series without a change the chance of reporting one is
//! about `alpha` (measured in the tests and BENCHMARKS.md).

use pgfleet_scenario::stats::{Rng, median};

#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The fewest runs on either side of a change (at least 2).
    pub min_segment: usize,
    /// The significance a split must reach (its permutation p-value).
    pub alpha: f64,
    pub permutations: usize,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            min_segment: 3,
            alpha: 0.05,
            permutations: 199,
            seed: 0x5eed,
        }
    }
}

/// A change: the series moves at `index` (the first run of the new
/// segment).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChangePoint {
    pub index: usize,
    /// The permutation test's p-value of the split.
    pub p_value: f64,
    /// The medians of the segments before and after it.
    pub before: f64,
    pub after: f64,
}

/// Ranks (1-based, ties averaged): the detector works on them, so that a
/// single run far off weighs as one high rank, not as its distance.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// The change points of `x`, in order.
pub fn detect(values: &[f64], opts: &Options) -> Vec<ChangePoint> {
    let x_ranked = ranks(values);
    let x = &x_ranked[..];
    let m = opts.min_segment.max(2);
    let mut found: Vec<(usize, f64)> = Vec::new();
    let mut todo = vec![(0usize, x.len())];
    while let Some((a, b)) = todo.pop() {
        let seg = &x[a..b];
        let Some((tau, q)) = best_split(seg, m) else {
            continue;
        };
        if q <= 0.0 {
            continue;
        }
        // One seed per segment: the same series gives the same answer.
        let mut rng = Rng::new(opts.seed ^ ((a as u64) << 32 | b as u64));
        let mut shuffled = seg.to_vec();
        let mut as_large = 0usize;
        for _ in 0..opts.permutations {
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, rng.below(i + 1));
            }
            if best_split(&shuffled, m).is_some_and(|(_, qp)| qp >= q) {
                as_large += 1;
            }
        }
        let p = (as_large + 1) as f64 / (opts.permutations + 1) as f64;
        if p <= opts.alpha {
            found.push((a + tau, p));
            todo.push((a, a + tau));
            todo.push((a + tau, b));
        }
    }
    found.sort_by_key(|f| f.0);
    let bounds: Vec<usize> = std::iter::once(0)
        .chain(found.iter().map(|f| f.0))
        .chain(std::iter::once(x.len()))
        .collect();
    found
        .iter()
        .enumerate()
        .map(|(i, &(index, p_value))| ChangePoint {
            index,
            p_value,
            before: median(&values[bounds[i]..bounds[i + 1]]),
            after: median(&values[bounds[i + 1]..bounds[i + 2]]),
        })
        .collect()
}

/// The split τ (both sides at least `m` long) maximising
/// Q(τ) = τ(n−τ)/n · (2/(τ(n−τ)) Σ|xᵢ−xⱼ| − 2/(τ(τ−1)) Σ|xᵢ−xₖ| − 2/((n−τ)(n−τ−1)) Σ|xⱼ−xₖ|),
/// between the sides, within the left and within the right; None when the
/// segment is too short to split. O(n²): each step moves one value from
/// the right side to the left and updates the three sums.
fn best_split(v: &[f64], m: usize) -> Option<(usize, f64)> {
    let n = v.len();
    if n < 2 * m {
        return None;
    }
    let d = |i: usize, j: usize| (v[i] - v[j]).abs();
    let (mut within_l, mut within_r, mut between) = (0.0, 0.0, 0.0);
    for i in 0..n {
        for j in i + 1..n {
            match (i < m, j < m) {
                (true, true) => within_l += d(i, j),
                (false, false) => within_r += d(i, j),
                _ => between += d(i, j),
            }
        }
    }
    let mut best: Option<(usize, f64)> = None;
    for tau in m..=n - m {
        let (l, r) = (tau as f64, (n - tau) as f64);
        let q = l * r / n as f64
            * (2.0 * between / (l * r)
                - 2.0 * within_l / (l * (l - 1.0))
                - 2.0 * within_r / (r * (r - 1.0)));
        if best.is_none_or(|(_, b)| q > b) {
            best = Some((tau, q));
        }
        // Move v[tau] to the left side.
        let to_left: f64 = (0..tau).map(|i| d(i, tau)).sum();
        let to_right: f64 = (tau + 1..n).map(|j| d(tau, j)).sum();
        within_l += to_left;
        within_r -= to_right;
        between += to_right - to_left;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Standard normal noise (Box-Muller), seeded.
    fn noise(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|_| {
                let (u, v) = (rng.next_f64().max(1e-12), rng.next_f64());
                (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
            })
            .collect()
    }

    fn with_step(n: usize, at: usize, size: f64, seed: u64) -> Vec<f64> {
        let mut x = noise(n, seed);
        for v in &mut x[at..] {
            *v += size;
        }
        x
    }

    #[test]
    fn a_step_is_found_where_it_is() {
        let x = with_step(30, 18, 4.0, 11);
        let cps = detect(&x, &Options::default());
        assert_eq!(cps.len(), 1, "{cps:?}");
        assert_eq!(cps[0].index, 18);
        assert!(cps[0].after - cps[0].before > 2.0, "{cps:?}");
        assert!(cps[0].p_value <= 0.05);
        // Two steps, both found. (Each segment is tested at `alpha`: on
        // other seeds a segment of noise may add a change, as often as
        // `alpha` says; the rates are measured below.)
        let mut x = with_step(45, 15, 5.0, 8);
        for v in &mut x[30..] {
            *v -= 10.0;
        }
        let at: Vec<usize> = detect(&x, &Options::default())
            .iter()
            .map(|c| c.index)
            .collect();
        assert_eq!(at, [15, 30]);
        // The same series, the same answer.
        assert_eq!(
            detect(&x, &Options::default()),
            detect(&x, &Options::default())
        );
    }

    #[test]
    fn flat_short_and_spiky_series_have_no_change() {
        let o = Options::default();
        assert!(detect(&[], &o).is_empty());
        assert!(detect(&[1.0; 5], &o).is_empty());
        assert!(detect(&[3.0; 40], &o).is_empty());
        // One run far off is a spike, not a change (segments of 3 at least).
        let mut x = noise(30, 3);
        x[20] += 30.0;
        assert!(detect(&x, &o).is_empty(), "{:?}", detect(&x, &o));
        // A change in the last two runs cannot be told from spikes yet.
        let x = with_step(30, 28, 10.0, 4);
        assert!(detect(&x, &o).is_empty());
    }

    /// Over many pure-noise series, a change is reported in about `alpha`
    /// of them; a 3σ step is nearly always found within a run of where it
    /// is, a 2σ step most of the time. `--nocapture` prints the rates, and
    /// PGFLEET_CP_SERIES=2000 measures them on more series (BENCHMARKS.md).
    #[test]
    fn false_alarms_and_detections_over_many_seeds() {
        let o = Options::default();
        let series: u64 = std::env::var("PGFLEET_CP_SERIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300);
        let alarms = (0..series)
            .filter(|&s| !detect(&noise(30, 1000 + s), &o).is_empty())
            .count();
        let rate = alarms as f64 / series as f64;
        let found = |size: f64| {
            (0..series)
                .filter(|&s| {
                    detect(&with_step(30, 15, size, 5000 + s), &o)
                        .iter()
                        .any(|c| c.index.abs_diff(15) <= 1)
                })
                .count() as f64
                / series as f64
        };
        let (found2, found3) = (found(2.0), found(3.0));
        // Detection delay: runs after a 3σ step until it is reported.
        let mut delays: Vec<usize> = (0..100)
            .map(|s| {
                let x = with_step(40, 20, 3.0, 9000 + s);
                (o.min_segment..=20)
                    .find(|&d| {
                        detect(&x[..20 + d], &o)
                            .iter()
                            .any(|c| c.index.abs_diff(20) <= 1)
                    })
                    .unwrap_or(21)
            })
            .collect();
        delays.sort();
        eprintln!(
            "{series} series of 30 runs: false alarms {:.1} %; steps found: 2σ {:.1} %, 3σ {:.1} %; runs after a 3σ step until found (100 series): median {}, p90 {}",
            rate * 100.0,
            found2 * 100.0,
            found3 * 100.0,
            delays[50],
            delays[90]
        );
        assert!(rate <= 0.09, "false-alarm rate {rate}");
        assert!(found2 >= 0.75, "2σ steps found {found2}");
        assert!(found3 >= 0.95, "3σ steps found {found3}");
        assert!(delays[50] <= 5 && delays[90] <= 8, "delays {delays:?}");
    }
}
