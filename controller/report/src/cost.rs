//! What a run cost, from the scenario's `price:` per class: each class's
//! price per hour (the instance, and the volume's monthly prices over a
//! 730-hour month), what its cells cost (their wall time on one instance
//! each), and the figures that decide between storage classes: the cost of
//! a million transactions at the class's TPS, of one VACUUM, of one drain.
//!
//! report.json: `costs: {currency, classes: {<class>: {per_hour,
//! breakdown: {instance, storage, iops, throughput}, cells, cell_hours,
//! run, per_million_transactions, per_vacuum, per_drain}}}` (absent without
//! prices; a figure the run did not measure is absent).

use std::collections::BTreeMap;

use crate::document::{ClassCost, Costs, Summary};
use pgfleet_proto::workload::{Kind, Metric, logical_drain, pgbench, vacuum_bloat};
use pgfleet_scenario::Price;
use pgfleet_store::CellRow;

/// The first summary of `kind`'s figure for `class`, when it is one a
/// price can be divided by.
fn figure(summaries: &[Summary], kind: Kind, class: &str, metric: Metric) -> Option<f64> {
    super::figure::first_value(summaries, kind.name(), class, metric.name)
        .filter(|v| v.is_finite() && *v > 0.0)
}

fn hours(c: &CellRow) -> Option<f64> {
    c.seconds().map(|s| s / 3600.0)
}

pub fn costs(
    currency: &str,
    prices: &BTreeMap<String, Price>,
    summaries: &[Summary],
    cells: &[CellRow],
) -> Costs {
    let mut classes = BTreeMap::new();
    for (class, price) in prices {
        let per_hour = price.per_hour();
        let mine: Vec<&CellRow> = cells
            .iter()
            .filter(|c| &c.instance_class == class)
            .collect();
        let cell_hours: f64 = mine.iter().filter_map(|c| hours(c)).sum();
        let v = ClassCost {
            per_hour,
            breakdown: *price,
            cells: mine.len(),
            cell_hours,
            run: cell_hours * per_hour,
            per_million_transactions: figure(summaries, Kind::Pgbench, class, pgbench::TPS)
                .map(|tps| per_hour / (tps * 3600.0) * 1e6),
            per_vacuum: figure(
                summaries,
                Kind::VacuumBloat,
                class,
                vacuum_bloat::VACUUM_SECONDS,
            )
            .map(|s| per_hour * s / 3600.0),
            per_drain: figure(
                summaries,
                Kind::LogicalDrain,
                class,
                logical_drain::DRAIN_SECONDS,
            )
            .map(|s| per_hour * s / 3600.0),
        };
        classes.insert(class.clone(), v);
    }
    Costs {
        currency: currency.to_string(),
        classes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn costs_follow_prices_time_and_figures() {
        let prices = BTreeMap::from([
            (
                "nvme".to_string(),
                Price {
                    instance: 1.0,
                    ..Default::default()
                },
            ),
            (
                "gp3".to_string(),
                Price {
                    instance: 0.5,
                    storage: 0.25,
                    iops: 0.2,
                    throughput: 0.05,
                },
            ),
        ]);
        let summaries: Vec<Summary> = serde_json::from_value(json!([
            {"workload": "pgbench", "classes": {
                "nvme": {"tps": {"value": 10000.0}}, "gp3": {"tps": {"value": 1000.0}}}},
            {"workload": "vacuum-bloat", "classes": {
                "nvme": {"vacuum_seconds": {"value": 36.0}}}},
        ]))
        .unwrap();
        let cell = |class: &str, from: &str, to: &str| CellRow {
            point: Default::default(),
            estimate_seconds: None,
            estimate: None,
            cell_id: "c".into(),
            workload: "pgbench".into(),
            instance_class: class.into(),
            params: json!({}),
            state: "succeeded".into(),
            agent_id: None,
            error: None,
            environment: None,
            started_at: Some(from.into()),
            finished_at: Some(to.into()),
        };
        let cells = vec![
            cell(
                "nvme",
                "2026-12-03T10:00:00.000Z",
                "2026-12-03T10:30:00.000Z",
            ),
            cell(
                "nvme",
                "2026-12-03T11:00:00.000Z",
                "2026-12-03T11:30:00.000Z",
            ),
            cell(
                "gp3",
                "2026-12-03T10:00:00.000Z",
                "2026-12-03T12:00:00.000Z",
            ),
        ];
        let c = costs("USD", &prices, &summaries, &cells);
        assert_eq!(c.currency, "USD");
        let nvme = &c.classes["nvme"];
        assert_eq!(nvme.per_hour, 1.0);
        assert_eq!(nvme.cell_hours, 1.0);
        assert_eq!(nvme.run, 1.0);
        // 10,000 TPS at 1 an hour: 36 M transactions an hour.
        assert!((nvme.per_million_transactions.unwrap() - 1.0 / 36.0).abs() < 1e-12);
        assert!((nvme.per_vacuum.unwrap() - 0.01).abs() < 1e-12);
        let gp3 = &c.classes["gp3"];
        assert_eq!(gp3.per_hour, 1.0);
        assert_eq!(gp3.run, 2.0);
        assert_eq!(gp3.breakdown.iops, 0.2);
        assert!((gp3.per_million_transactions.unwrap() - 10.0 / 36.0).abs() < 1e-12);
        assert!(gp3.per_vacuum.is_none(), "gp3 ran no VACUUM: {gp3:?}");
    }
}
