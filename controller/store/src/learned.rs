//! Estimates learned from what earlier cells took.
//!
//! The model (`Work` over a class's `Capacity`) runs on rates measured on
//! one reference host; another host's disk copies, loads and flushes at
//! its own speed, and some steps the model gets wrong everywhere. The store
//! keeps each cell's estimate beside what it took, so a plan corrects each
//! cell by the cells before it that the model saw alike: same kind, same
//! class capacity (`PlannedCell::estimate_key`) and the same dataset step
//! (built, restored, reused, loaded). A past cell's key comes from planning
//! its run's stored scenario again, so every stored run teaches, older ones
//! included. The correction is the median, over the newest `CELLS` such
//! cells, of what each took over its estimate: the report's "took / estimated"
//! (a whole cell's, since a kind's timed part is not always the scenario's
//! fixed window: VACUUM's is the model's guess too). A cell with no such
//! history keeps the model's estimate.

use std::collections::BTreeMap;

use crate::Store;
use pgfleet_scenario::plan::{Factor, PlannedCell};

/// How many of the newest alike cells a correction is the median of.
pub const CELLS: usize = 5;
/// Cells read from the store, newest first, and the runs whose scenarios
/// are planned again to key them (each plan is a parse: a submission to a
/// long-lived `serve` pays for these): enough for `CELLS` of each of the
/// keys the store's recent runs used.
pub const SCAN: usize = 1_000;
pub const RUNS: usize = 50;
/// A correction is kept within these bounds: a cell that ended far from
/// its estimate for a reason of its own (a disk filling up, a host busy
/// with something else) moves a median of few cells a long way.
const BOUNDS: (f64, f64) = (0.2, 5.0);
/// Cells estimated at less than this teach nothing (the ratio of two small
/// numbers).
const MIN_ESTIMATE_SECONDS: f64 = 1.0;

/// A past cell as learning sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Past {
    /// `PlannedCell::estimate_key`.
    pub key: String,
    /// How it came by its data (`environment.dataset.how`; `none`).
    pub how: String,
    pub took_seconds: f64,
    pub estimate_seconds: f64,
}

/// The corrections a store teaches, by estimate key and dataset step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learned {
    factors: BTreeMap<(String, String), Factor>,
}

/// What `Learned::apply` changed in a plan.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Applied {
    /// Cells whose estimate was corrected.
    pub cells: usize,
    /// The smallest and largest correction applied.
    pub min: f64,
    pub max: f64,
}

impl Learned {
    /// The corrections of the store's newest succeeded cells (of its newest
    /// `RUNS` runs with any). A run whose stored scenario no longer plans
    /// (written for an older pgfleet) teaches nothing.
    pub fn read(store: &Store) -> crate::Result<Learned> {
        let rows = store.past_estimates(SCAN)?;
        let mut plans: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut past = Vec::with_capacity(rows.len());
        for r in rows {
            if !plans.contains_key(&r.run_id) {
                if plans.len() == RUNS {
                    break;
                }
                let cells = store
                    .scenario_yaml(&r.run_id)?
                    .and_then(|y| {
                        pgfleet_scenario::parse(std::path::Path::new("scenario.yaml"), &y).ok()
                    })
                    .map(|sc| pgfleet_scenario::plan::plan(&sc))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| (c.cell_id.clone(), c.estimate_key()))
                    .collect();
                plans.insert(r.run_id.clone(), cells);
            }
            if let Some(key) = plans[&r.run_id].get(&r.cell_id) {
                past.push(Past {
                    key: key.clone(),
                    how: r.how,
                    took_seconds: r.took_seconds,
                    estimate_seconds: r.estimate_seconds,
                });
            }
        }
        Ok(Learned::of(&past))
    }

    /// The corrections of `past`, newest first.
    pub fn of(past: &[Past]) -> Learned {
        let mut ratios: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
        for p in past {
            if p.estimate_seconds < MIN_ESTIMATE_SECONDS || !p.took_seconds.is_finite() {
                continue;
            }
            let mine = ratios.entry((p.key.clone(), p.how.clone())).or_default();
            if mine.len() < CELLS {
                mine.push((p.took_seconds / p.estimate_seconds).clamp(BOUNDS.0, BOUNDS.1));
            }
        }
        let factors = ratios
            .into_iter()
            .map(|(k, r)| {
                let ratio = crate::stats::median(&r);
                (
                    k,
                    Factor {
                        ratio,
                        cells: r.len(),
                    },
                )
            })
            .collect();
        Learned { factors }
    }

    /// The correction for cells of `key` coming by their data as `how`.
    pub fn factor(&self, key: &str, how: &str) -> Option<Factor> {
        self.factors
            .get(&(key.to_string(), how.to_string()))
            .copied()
    }

    /// Corrects each cell's estimate (and its estimate as a load of its
    /// own, for the plan without reuse) where earlier cells teach one.
    pub fn apply(&self, cells: &mut [PlannedCell]) -> Applied {
        let mut applied = Applied::default();
        for c in cells.iter_mut() {
            let key = c.estimate_key();
            let fresh = if c.params.dataset().is_some() {
                "loaded"
            } else {
                "none"
            };
            c.learned_fresh = self.factor(&key, fresh);
            c.learned = self.factor(&key, c.how());
            if let Some(f) = c.learned {
                c.estimate = f.scale(c.estimate);
                if applied.cells == 0 {
                    (applied.min, applied.max) = (f.ratio, f.ratio);
                }
                applied.cells += 1;
                applied.min = applied.min.min(f.ratio);
                applied.max = applied.max.max(f.ratio);
            }
        }
        applied
    }
}

impl Applied {
    /// A line for `validate` and the run's start, when anything was learned.
    pub fn describe(&self, of: usize) -> Option<String> {
        (self.cells > 0).then(|| {
            let range = if (self.max - self.min).abs() < 0.005 {
                format!("{:.2}x", self.min)
            } else {
                format!("{:.2}x to {:.2}x", self.min, self.max)
            };
            format!(
                "estimates learned: {} of {of} cells corrected by what earlier cells of their kind, class and dataset step took ({range} the model's estimate)",
                self.cells
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn past(key: &str, how: &str, took: f64, estimate: f64) -> Past {
        Past {
            key: key.into(),
            how: how.into(),
            took_seconds: took,
            estimate_seconds: estimate,
        }
    }

    /// The median of the newest cells' took/estimated, per key and step;
    /// older cells past `CELLS`, tiny estimates and outliers beyond the
    /// bounds do not move it.
    #[test]
    fn corrections_are_the_median_of_the_newest_alike_cells() {
        let mut p = vec![
            // newest first
            past("k", "restored", 150.0, 100.0),   // 1.5
            past("k", "restored", 200.0, 100.0),   // 2.0
            past("k", "restored", 120.0, 100.0),   // 1.2
            past("k", "built", 50.0, 100.0),       // 0.5
            past("k", "restored", 30.0, 0.5),      // too small to teach
            past("k", "restored", 9_000.0, 100.0), // clamped to 5
            past("k", "restored", 100.0, 100.0),   // 1.0
        ];
        // Older than the newest five of ("k", "restored"): ignored.
        p.push(past("k", "restored", 1_000.0, 100.0));
        let l = Learned::of(&p);
        let f = l.factor("k", "restored").unwrap();
        assert_eq!(f.cells, 5);
        assert!((f.ratio - 1.5).abs() < 1e-9, "{f:?}");
        assert_eq!(l.factor("k", "built").unwrap().ratio, 0.5);
        assert_eq!(l.factor("k", "loaded"), None);
        assert_eq!(l.factor("other", "restored"), None);
        // An even count: the mean of the middle two.
        let l = Learned::of(&[past("k", "none", 10.0, 10.0), past("k", "none", 20.0, 10.0)]);
        assert!((l.factor("k", "none").unwrap().ratio - 1.5).abs() < 1e-9);
    }

    /// Applying scales the estimate (its load with it) of the cells whose
    /// key and step have history, and only theirs.
    #[test]
    fn applying_scales_the_cells_with_history() {
        let s = pgfleet_scenario::parse(
            std::path::Path::new("s.yaml"),
            "name: s\nfleet:\n  - name: a\n    count: 1\n  - name: b\n    count: 1\nworkloads:\n  - kind: pgbench\n    scale: 2\n    duration_s: 30\n",
        )
        .unwrap();
        let mut cells = pgfleet_scenario::plan::plan(&s);
        assert_eq!(cells.len(), 2);
        let model: Vec<_> = cells.iter().map(|c| c.estimate()).collect();
        // One class's cell builds the dataset, the other's restores it:
        // teach only the restore.
        let restoring = cells.iter().position(|c| c.how() == "restored").unwrap();
        let key = cells[restoring].estimate_key();
        let m = model[restoring];
        let learned = Learned::of(&[past(&key, "restored", 3.0 * m.seconds, m.seconds)]);
        let applied = learned.apply(&mut cells);
        assert_eq!((applied.cells, applied.min, applied.max), (1, 3.0, 3.0));
        let e = cells[restoring].estimate();
        assert!(
            (e.seconds - 3.0 * m.seconds).abs() < 1e-6,
            "{e:?} from {m:?}"
        );
        assert!((e.load_seconds - 3.0 * m.load_seconds).abs() < 1e-6);
        assert_eq!(e.measured_seconds, m.measured_seconds);
        let other = 1 - restoring;
        assert_eq!(cells[other].how(), "built");
        assert_eq!(cells[other].estimate(), model[other]);
        assert_eq!(cells[other].learned, None);
        assert!(
            applied
                .describe(cells.len())
                .unwrap()
                .starts_with("estimates learned: 1 of 2 cells corrected")
        );
        assert_eq!(Learned::default().apply(&mut cells).describe(2), None);
    }
}
