//! Estimates learned from what earlier cells took.
//!
//! The model (`Work` over a class's `Capacity`) runs on rates measured on
//! one reference host; another host's disk copies, loads and flushes at
//! its own speed, and some steps the model gets wrong everywhere. The store
//! keeps each cell's estimate by phase (`CellEstimate`: the model's, before
//! corrections) beside what it took and, in its provenance, what moving its
//! data took. A plan corrects each cell by the cells before it whose error
//! has the same cause (`Corrections`):
//! - its data movement by cells of the same class capacity that came by
//!   their data the same way (built, restored, reused, loaded), any kind:
//!   a restore is a copy at the class's rates whatever runs on it after;
//! - the rest (preparing, measuring, provisioning) by cells of its kind and
//!   class capacity, however they came by their data: a restored cell
//!   learns from a built one's measuring.
//!
//! A kind without a dataset learns its whole as the rest. Each correction
//! is the median, over the newest `CELLS` such cells, of what they took
//! over what the model said, within `BOUNDS`; a cell with no such history
//! keeps the model's estimate. Cells stored before estimates had phases
//! teach nothing.

use std::collections::BTreeMap;

use crate::{PastEstimate, Store};
use pgfleet_scenario::plan::{Corrections, Factor, PlannedCell};

/// How many of the newest alike cells a correction is the median of.
pub const CELLS: usize = 5;
/// Cells read from the store, newest first: enough for `CELLS` of each of
/// the keys the store's recent runs used.
pub const SCAN: usize = 1_000;
/// A correction is kept within these bounds: a cell that ended far from
/// its estimate for a reason of its own (a disk filling up, a host busy
/// with something else) moves a median of few cells a long way.
const BOUNDS: (f64, f64) = (0.2, 5.0);
/// Parts estimated at less than this teach nothing (the ratio of two small
/// numbers).
const MIN_ESTIMATE_SECONDS: f64 = 1.0;

/// What a correction is learned for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    /// Moving data: (how, `PlannedCell::capacity_key`).
    Data(String, String),
    /// The rest: `PlannedCell::estimate_key`.
    Work(String),
}

/// The corrections a store teaches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learned {
    factors: BTreeMap<Part, Factor>,
}

/// What `Learned::apply` changed in a plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// Cells whose estimate was corrected.
    pub cells: usize,
    /// The runs the corrections came from, newest first.
    pub runs: Vec<String>,
}

/// A data step as learning keys it: a build or a load with its method
/// (a direct load and a copy load are different models of the same step),
/// a restore or a reuse as it is.
fn data_step(how: &str, method: &str) -> String {
    match how {
        "built" | "loaded" => format!("{how} by {method}"),
        other => other.to_string(),
    }
}

impl Learned {
    /// The corrections of the store's newest `SCAN` succeeded cells.
    pub fn read(store: &Store) -> crate::Result<Learned> {
        Ok(Learned::of(&store.past_estimates(SCAN)?))
    }

    /// The corrections of `past`, newest first.
    pub fn of(past: &[PastEstimate]) -> Learned {
        let mut ratios: BTreeMap<Part, Vec<(f64, String)>> = BTreeMap::new();
        let mut add = |part: Part, took: f64, estimated: f64, run: &str| {
            if estimated < MIN_ESTIMATE_SECONDS || !took.is_finite() || !estimated.is_finite() {
                return;
            }
            let mine = ratios.entry(part).or_default();
            if mine.len() < CELLS {
                mine.push((
                    (took / estimated).clamp(BOUNDS.0, BOUNDS.1),
                    run.to_string(),
                ));
            }
        };
        for p in past {
            let (e, run) = (&p.estimate, p.run_id.as_str());
            let model = e.model.total();
            if e.dataset && p.how != "none" {
                // Cells stored before `load_method` existed all copied.
                let method = match e.load_method.as_str() {
                    "" => "copy",
                    m => m,
                };
                let part = Part::Data(data_step(&p.how, method), e.capacity.clone());
                add(part, p.data_seconds, e.model.data, run);
                let work = p.took_seconds - p.data_seconds;
                if !e.open_ended {
                    add(Part::Work(e.key.clone()), work, model - e.model.data, run);
                }
            } else if !e.dataset && !e.open_ended {
                add(Part::Work(e.key.clone()), p.took_seconds, model, run);
            }
        }
        let factors = ratios
            .into_iter()
            .map(|(k, r)| {
                let mut runs: Vec<String> = Vec::new();
                for (_, run) in &r {
                    if !runs.contains(run) {
                        runs.push(run.clone());
                    }
                }
                let ratios: Vec<f64> = r.iter().map(|(x, _)| *x).collect();
                let f = Factor {
                    ratio: crate::stats::median(&ratios),
                    cells: r.len(),
                    runs,
                };
                (k, f)
            })
            .collect();
        Learned { factors }
    }

    /// The corrections for a cell of kind and capacity `key` (and
    /// `capacity`) coming by its data as `how` (`none`: no dataset; a
    /// build or a load named with its method, `data_step`).
    pub fn corrections(&self, key: &str, capacity: &str, how: &str) -> Corrections {
        let work = self.factors.get(&Part::Work(key.to_string())).cloned();
        let data = match how {
            "none" => work.clone(),
            how => self
                .factors
                .get(&Part::Data(how.to_string(), capacity.to_string()))
                .cloned(),
        };
        Corrections { data, work }
    }

    /// Corrects each cell's estimate (and its estimate as a load of its
    /// own, for the plan without reuse) where earlier cells teach one. The
    /// model's estimate is kept (`PlannedCell::model`): applying twice
    /// corrects it once.
    pub fn apply(&self, cells: &mut [PlannedCell]) -> Applied {
        let mut applied = Applied::default();
        for c in cells.iter_mut() {
            let (key, capacity) = (c.estimate_key(), c.capacity_key());
            let method =
                pgfleet_scenario::plan::load_method(&c.params).map_or("copy", |m| m.name());
            let fresh = if c.params.dataset().is_some() {
                data_step("loaded", method)
            } else {
                "none".to_string()
            };
            c.learned_fresh = self.corrections(&key, &capacity, &fresh);
            c.learned = self.corrections(&key, &capacity, &data_step(c.how(), method));
            let model = *c.model.get_or_insert(c.estimate);
            c.estimate = c.learned.scale(model);
            if !c.learned.is_empty() {
                applied.cells += 1;
                for r in c.learned.runs() {
                    if !applied.runs.iter().any(|x| x == r) {
                        applied.runs.push(r.to_string());
                    }
                }
            }
        }
        applied
    }
}

impl Applied {
    /// A line for `validate` and the run's start, when anything was learned.
    pub fn describe(&self, of: usize) -> Option<String> {
        (self.cells > 0).then(|| {
            let more = self.runs.len().saturating_sub(3);
            format!(
                "estimates learned: {} of {of} cells corrected by what earlier cells took against the model (runs {}{})",
                self.cells,
                self.runs.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
                if more > 0 { format!(" and {more} more") } else { String::new() }
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CellEstimate;
    use pgfleet_proto::workload::Phases;

    /// A past cell of kind-and-capacity `key` in `run`: the model said
    /// `data` + `rest` seconds, it took `took_data` + `took_rest`.
    fn past(run: &str, key: &str, how: &str, model: (f64, f64), took: (f64, f64)) -> PastEstimate {
        PastEstimate {
            run_id: run.into(),
            cell_id: "c".into(),
            how: how.into(),
            took_seconds: took.0 + took.1,
            data_seconds: took.0,
            estimate: CellEstimate {
                key: key.into(),
                capacity: "cap".into(),
                dataset: how != "none",
                model: Phases {
                    data: model.0,
                    measure: model.1,
                    ..Phases::default()
                },
                ..CellEstimate::default()
            },
        }
    }

    /// The median of the newest cells' took/estimated, per part; older
    /// cells past `CELLS`, tiny estimates and outliers beyond the bounds
    /// do not move it. Data movement is learned per way of coming by the
    /// data; the rest per kind and capacity, whatever the data step.
    #[test]
    fn corrections_are_the_median_of_the_newest_alike_cells() {
        let m = (100.0, 100.0);
        let mut p = vec![
            // newest first; (data, rest) took
            past("r6", "k", "restored", m, (150.0, 100.0)),
            past("r5", "k", "restored", m, (200.0, 100.0)),
            past("r4", "k", "restored", m, (120.0, 100.0)),
            past("r3", "k", "built", m, (50.0, 300.0)),
            past("r3", "k", "restored", (0.5, 0.5), (30.0, 30.0)), // too small to teach
            past("r2", "k", "restored", m, (9_000.0, 100.0)),      // clamped to 5
            past("r2", "k", "restored", m, (100.0, 100.0)),
        ];
        // Older than the newest five: ignored.
        p.push(past("r1", "k", "restored", m, (1_000.0, 1_000.0)));
        let l = Learned::of(&p);
        let c = l.corrections("k", "cap", "restored");
        let data = c.data.unwrap();
        assert_eq!(data.cells, 5);
        assert!((data.ratio - 1.5).abs() < 1e-9, "{data:?}");
        assert_eq!(data.runs, ["r6", "r5", "r4", "r2"]);
        // The rest: r6, r5, r4 (1.0), r3's built cell (3.0), r2 (1.0).
        let work = c.work.unwrap();
        assert_eq!((work.cells, work.ratio), (5, 1.0));
        // A build is learned with its method: cells stored before the key
        // copied; a direct build teaches direct builds only.
        assert_eq!(
            l.corrections("k", "cap", "built by copy")
                .data
                .unwrap()
                .ratio,
            0.5
        );
        assert_eq!(l.corrections("k", "cap", "built by direct").data, None);
        assert_eq!(l.corrections("k", "cap", "loaded by copy").data, None);
        let mut direct = past("r7", "k", "built", m, (300.0, 100.0));
        direct.estimate.load_method = "direct".into();
        let l2 = Learned::of(&[direct, p[3].clone()]);
        assert_eq!(
            l2.corrections("k", "cap", "built by direct")
                .data
                .unwrap()
                .ratio,
            3.0
        );
        assert_eq!(
            l2.corrections("k", "cap", "built by copy")
                .data
                .unwrap()
                .ratio,
            0.5
        );
        assert_eq!(l.corrections("k", "other capacity", "restored").data, None);
        assert!(l.corrections("other", "cap", "restored").work.is_none());
        // A kind without a dataset: its whole is the rest.
        let l = Learned::of(&[
            past("a", "t", "none", (0.0, 10.0), (0.0, 10.0)),
            past("b", "t", "none", (0.0, 10.0), (0.0, 20.0)),
        ]);
        let c = l.corrections("t", "cap", "none");
        assert!((c.work.as_ref().unwrap().ratio - 1.5).abs() < 1e-9);
        assert_eq!(c.data, c.work);
    }

    /// A restored cell learns its measuring from the built one's (the
    /// issue's second run: a cell that changed data step started from the
    /// model again), its restore from restores; the timed measurement
    /// keeps its length; applying twice corrects once.
    #[test]
    fn a_restored_cell_learns_from_a_built_ones_measuring() {
        let s = pgfleet_scenario::parse(
            std::path::Path::new("s.yaml"),
            "name: s\nfleet:\n  - name: a\n    count: 1\n  - name: b\n    count: 1\nworkloads:\n  - kind: vacuum-bloat\n    scale: 20\n",
        )
        .unwrap();
        let mut cells = pgfleet_scenario::plan::plan(&s);
        let restoring = cells.iter().position(|c| c.how() == "restored").unwrap();
        let other = 1 - restoring;
        assert_eq!(cells[other].how(), "built");
        let m = cells[restoring].estimate();
        let (key, cap) = (
            cells[restoring].estimate_key(),
            cells[restoring].capacity_key(),
        );
        assert_eq!(key, cells[other].estimate_key(), "two classes alike");
        let p = m.phases();
        // An earlier run built it on this capacity: its rest took twice
        // the model's.
        let mut built = past("r1", &key, "built", (10.0, p.total() - p.data), (10.0, 0.0));
        built.took_seconds = 10.0 + 2.0 * (p.total() - p.data);
        built.estimate.capacity = cap.clone();
        let learned = Learned::of(&[built]);
        let applied = learned.apply(&mut cells);
        assert_eq!(applied.cells, 2);
        assert_eq!(applied.runs, ["r1"]);
        let e = cells[restoring].estimate();
        let q = e.phases();
        assert!((q.data - p.data).abs() < 1e-9, "no restore learned: {q:?}");
        assert!(
            (q.total() - q.data - 2.0 * (p.total() - p.data)).abs() < 1e-6,
            "{q:?} from {p:?}"
        );
        assert_eq!(cells[restoring].learned.data, None);
        assert_eq!(cells[restoring].model_estimate(), m);
        learned.apply(&mut cells);
        assert_eq!(cells[restoring].estimate(), e, "corrected once");
        let line = applied.describe(cells.len()).unwrap();
        assert!(
            line.starts_with("estimates learned: 2 of 2 cells corrected") && line.contains("r1"),
            "{line}"
        );
        assert_eq!(Learned::default().apply(&mut cells).describe(2), None);
        assert_eq!(cells[restoring].estimate(), m, "nothing learned: the model");
    }

    /// A pgbench cell keeps its timed window: the rest's correction goes
    /// to its preparation and provisioning.
    /// A window that ended once steady (`duration_s: auto`) took less than
    /// its longest for no fault of the model's: it teaches its data
    /// movement, not the rest.
    #[test]
    fn an_open_ended_measurement_teaches_only_its_data_movement() {
        let mut auto = past("r1", "pgbench cap", "restored", (10.0, 600.0), (20.0, 30.0));
        auto.estimate.open_ended = true;
        let l = Learned::of(&[auto]);
        let c = l.corrections("pgbench cap", "cap", "restored");
        assert_eq!(c.data.as_ref().map(|f| f.ratio), Some(2.0));
        assert_eq!(c.work, None, "{c:?}");
    }

    #[test]
    fn a_timed_measurement_keeps_its_length() {
        use pgfleet_proto::workload::Estimate;
        let e = Estimate {
            seconds: 100.0,
            measured_seconds: 60.0,
            load_seconds: 20.0,
            prepare_seconds: 10.0,
            ..Estimate::default()
        };
        let f = |ratio| {
            Some(Factor {
                ratio,
                cells: 1,
                runs: vec![],
            })
        };
        let c = Corrections {
            data: f(0.5),
            work: f(1.25),
        };
        let s = c.scale(e);
        assert_eq!(s.load_seconds, 10.0);
        assert_eq!(s.seconds, 10.0 + 100.0);
        assert_eq!(s.measured_seconds, 60.0);
        let p = s.phases();
        assert!((p.prepare + p.other - 40.0).abs() < 1e-9, "{p:?}");
        assert_eq!(c.describe(), "data 0.50x, the rest 1.25x");
    }
}
