//! report.md's section per injected fault (a pgbench point with
//! `faults:`): per class, how the server and the clients came back
//! (medians over the class's clusters, min–max beside), and TPS and p99
//! latency around the fault, one colour per class, the fault's window
//! shaded.

use std::collections::BTreeMap;
use std::fmt::Write;

use pgfleet_proto::workload::fault::FaultFigures;
use pgfleet_proto::workload::pgbench::{Metrics, PointParams};

use super::plot::{Mark, Series, line_chart_marked};
use super::table::{Plots, Row, num};
use crate::Report;
use crate::document::Summary;

/// Seconds shown before a fault's start and after its end.
const BEFORE_S: f64 = 15.0;
const AFTER_S: f64 = 30.0;

/// One section per fault of the summary's point.
pub fn sections(
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    rs: &[&Row<PointParams, Metrics>],
    sm: &Summary,
    file_stem: &str,
) {
    let Some(first) = rs.first() else { return };
    for (k, fault) in first.params.faults.iter().enumerate() {
        let label = fault.label();
        let _ = writeln!(
            md,
            "\n#### Fault {}: {label}\n\n\
             Medians over the class's clusters, min–max in brackets. Times are seconds from the fault's start \
             (a crash: the kill); *back to 90 %* is the first whole second after its end at 90 % of the TPS of the \
             10 s before; *tx lost* the transactions short of that TPS until then. *Acked lost*: of the commits the server \
             acknowledged before a crash (the commit ledger: a row per committed transaction, checked after recovery), \
             those gone after it, and how long before the kill the earliest of them was acknowledged; anything \
             but 0 with `synchronous_commit: on` is data loss.\n\n\
             | class | clusters | recovery s | WAL replayed MB | redo s | first txn s | back to 90 % s | tx lost | acked before | acked lost | lost window ms | TPS before | TPS during | p99 during ms | p99 after ms | checkpoint s | buffers written |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            k + 1
        );
        let mut windows: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for class in sm.classes.keys() {
            let of: Vec<&FaultFigures> = rs
                .iter()
                .filter(|r| r.class == class.as_str())
                .filter_map(|r| r.metrics.faults.get(k))
                .collect();
            if of.is_empty() {
                continue;
            }
            windows.insert(
                class.as_str(),
                of.iter().map(|f| (f.start_s, f.end_s)).collect(),
            );
            let cell = |v: &dyn Fn(&FaultFigures) -> Option<f64>, d: usize| {
                let mut xs: Vec<f64> = of.iter().filter_map(|f| v(f)).collect();
                if xs.is_empty() {
                    return "–".to_string();
                }
                xs.sort_by(f64::total_cmp);
                let med = pgfleet_scenario::stats::median(&xs);
                if xs.len() == 1 {
                    num(med, d)
                } else {
                    format!(
                        "{} ({}–{})",
                        num(med, d),
                        num(xs[0], d),
                        num(xs[xs.len() - 1], d)
                    )
                }
            };
            let _ = writeln!(
                md,
                "| {class} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                of.len(),
                cell(&|f| f.recovery_s, 2),
                cell(&|f| f.wal_replayed_bytes.map(|b| b as f64 / 1e6), 1),
                cell(&|f| f.redo_s, 2),
                cell(&|f| f.first_transaction_s, 2),
                cell(&|f| f.back_to_90pct_s, 1),
                cell(&|f| Some(f.transactions_lost), 0),
                cell(&|f| f.acknowledged.map(|n| n as f64), 0),
                cell(&|f| f.acknowledged_lost.map(|n| n as f64), 0),
                cell(&|f| f.lost_window_ms, 0),
                cell(&|f| Some(f.baseline_tps), 0),
                cell(&|f| f.tps_during, 0),
                cell(&|f| f.latency_ms_p99_during, 2),
                cell(&|f| f.latency_ms_p99_after, 2),
                cell(&|f| f.checkpoint_s, 2),
                cell(&|f| f.buffers_written.map(|b| b as f64), 0),
            );
        }
        let never: Vec<&str> = windows
            .keys()
            .copied()
            .filter(|c| {
                rs.iter()
                    .filter(|r| r.class == *c)
                    .filter_map(|r| r.metrics.faults.get(k))
                    .any(|f| f.back_to_90pct_s.is_none())
            })
            .collect();
        if !never.is_empty() {
            let _ = writeln!(
                md,
                "\nNot back to 90 % before the measured window ended on a cluster of: {}.",
                never.join(", ")
            );
        }
        around(md, plots, doc, rs, sm, &windows, k, &label, file_stem);
    }
}

/// TPS and p99 per class around fault `k`: seconds from the earliest
/// start − `BEFORE_S` to the latest end + `AFTER_S`, each class's fault
/// window (its clusters' median start and end) shaded.
#[allow(clippy::too_many_arguments)]
fn around(
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    rs: &[&Row<PointParams, Metrics>],
    sm: &Summary,
    windows: &BTreeMap<&str, Vec<(f64, f64)>>,
    k: usize,
    label: &str,
    file_stem: &str,
) {
    let all = windows.values().flatten();
    let from = all.clone().map(|w| w.0).fold(f64::INFINITY, f64::min) - BEFORE_S;
    let to = all.map(|w| w.1).fold(f64::NEG_INFINITY, f64::max) + AFTER_S;
    if !from.is_finite() || !to.is_finite() {
        return;
    }
    let marks: Vec<Mark> = windows
        .iter()
        .map(|(class, ws)| {
            let mid = |v: Vec<f64>| {
                let mut v = v;
                v.sort_by(f64::total_cmp);
                pgfleet_scenario::stats::median(&v)
            };
            let (a, b) = (
                mid(ws.iter().map(|w| w.0).collect()),
                mid(ws.iter().map(|w| w.1).collect()),
            );
            Mark {
                from: a,
                to: b,
                label: format!("{class}: {:.1} s", b - a),
                color: Some(super::plot::class_color(doc, class)),
            }
        })
        .collect();
    type Field = fn(&crate::document::Second) -> Option<f64>;
    for (field, file, y) in [
        ((|s| s.tps) as Field, "tps", "transactions per second"),
        ((|s| s.latency_ms_p99) as Field, "p99", "p99 latency (ms)"),
    ] {
        let series: Vec<Series> = sm
            .classes
            .keys()
            .map(|class| {
                let cells = rs.iter().filter(|r| r.class == class.as_str());
                // Second n covers [n - 1, n) of the window: drawn at n - 1.
                let shown = |sec: u64| (from..=to).contains(&(sec.saturating_sub(1) as f64));
                let means = super::table::class_means(doc, cells.map(|r| r.cell_id), field, shown);
                Series {
                    name: class.clone(),
                    points: means
                        .into_iter()
                        .map(|(s, v)| (s.saturating_sub(1) as f64, v))
                        .collect(),
                    color: Some(super::plot::class_color(doc, class)),
                }
            })
            .collect();
        if series.iter().all(|s| s.points.is_empty()) {
            continue;
        }
        let name = format!("{file_stem}-fault-{}-{file}.svg", k + 1);
        plots.push((
            name.clone(),
            line_chart_marked(
                &format!("{label}: {y} per class"),
                "second of the measured window",
                y,
                &series,
                &marks,
            ),
        ));
        let _ = writeln!(md, "\n![{label}: {y} around the fault per class]({name})");
    }
}
