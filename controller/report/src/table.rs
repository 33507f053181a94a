//! What report.md's sections are written with: a kind's typed rows, the
//! plots a section embeds, tables by class, number formats. Sections,
//! history and compare use these; `markdown` assembles the sections.

use std::fmt::Write;

use pgfleet_proto::workload::Kind;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;

use crate::document::{MetricFigure, Report, ResultRow};
use crate::plot::{Mark, Series, line_chart_marked};

/// One result of a kind with its point typed as the kind defines it
/// (`pgfleet_proto::workload::<kind>::{PointParams, Metrics}`): what a
/// section reads.
pub struct Row<'a, P, M> {
    pub cell_id: &'a str,
    pub class: &'a str,
    pub agent: &'a str,
    pub params: P,
    pub metrics: M,
    /// The result as stored in report.json (to match it with its summary).
    pub raw: &'a ResultRow,
}

/// Plots a section embeds: (file name, SVG).
pub type Plots = Vec<(String, String)>;

/// A kind's section of report.md: the markdown, its plots, the whole
/// report document, and the kind's results.
pub type Section<P, M> = fn(&mut String, &mut Plots, &Report, &[Row<P, M>]);

/// A point of a plot.
pub type XY = (f64, f64);

/// A plot of a kind's per-second samples (`doc.samples.<kind>.<cell>`),
/// one line per cell named by its class and replica, drawn by
/// `samples_plot`.
pub struct SamplesPlot<S, M> {
    /// The sample kind (`vacuum`, `lag`).
    pub sample: &'static str,
    pub file: &'static str,
    pub title: &'static str,
    pub x_label: &'static str,
    pub y_label: &'static str,
    /// (x, y) from a sample.
    pub point: fn(&S) -> Option<XY>,
    /// The first and last points from the cell's result (e.g. 0 % at
    /// second 0, 100 % when VACUUM ended), so a short run still draws its
    /// whole course.
    pub edges: fn(&M) -> [Option<XY>; 2],
    /// Stretches of the x axis to shade in the cell's class colour (a
    /// fault's window): (from, to, label).
    pub spans: fn(&M) -> Vec<(f64, f64, String)>,
}

/// No stretch of the axis shaded.
pub fn no_spans<M>(_: &M) -> Vec<(f64, f64, String)> {
    Vec::new()
}

/// Draws `plot` over `rows`; embedded in report.md when any cell has
/// points.
pub fn samples_plot<P, M, S: DeserializeOwned>(
    md: &mut String,
    plots: &mut Plots,
    doc: &Report,
    rows: &[Row<P, M>],
    plot: &SamplesPlot<S, M>,
) {
    let series: Vec<Series> = rows
        .iter()
        .map(|r| {
            let [first, last] = (plot.edges)(&r.metrics);
            let points = first
                .into_iter()
                .chain(
                    doc.samples
                        .get(plot.sample)
                        .and_then(|by_cell| by_cell.get(r.cell_id))
                        .into_iter()
                        .flatten()
                        .filter_map(|s| S::deserialize(s).ok())
                        .filter_map(|s| (plot.point)(&s)),
                )
                .chain(last)
                .collect();
            let replica = r
                .cell_id
                .rsplit_once("-r")
                .map(|(_, n)| format!(" r{n}"))
                .unwrap_or_default();
            Series {
                name: format!("{}{replica}", r.class),
                points,
                color: Some(super::plot::class_color(doc, r.class)),
            }
        })
        .collect();
    let marks: Vec<Mark> = rows
        .iter()
        .flat_map(|r| {
            (plot.spans)(&r.metrics)
                .into_iter()
                .map(|(from, to, label)| Mark {
                    from,
                    to,
                    label,
                    color: Some(super::plot::class_color(doc, r.class)),
                })
        })
        .collect();
    if series.iter().any(|s| s.points.len() > 1) {
        plots.push((
            plot.file.to_string(),
            line_chart_marked(plot.title, plot.x_label, plot.y_label, &series, &marks),
        ));
        let _ = writeln!(md, "\n![{}]({})", plot.title, plot.file);
    }
}

/// A section's rows by instance class, in the classes' order.
pub fn by_class<'r, 'a, P, M>(
    rows: &'r [Row<'a, P, M>],
) -> std::collections::BTreeMap<&'a str, Vec<&'r Row<'a, P, M>>> {
    let mut m: std::collections::BTreeMap<&str, Vec<&Row<P, M>>> = Default::default();
    for r in rows {
        m.entry(r.class).or_default().push(r);
    }
    m
}

/// A figure for a table: a JSON value or a typed one; absent is "–".
pub trait Number {
    fn number(&self) -> Option<f64>;
}

impl Number for Json {
    fn number(&self) -> Option<f64> {
        self.as_f64()
    }
}

macro_rules! number {
    ($($t:ty),*) => {$(
        impl Number for $t {
            fn number(&self) -> Option<f64> {
                Some(*self as f64).filter(|x| x.is_finite())
            }
        }
    )*};
}
number!(f64, f32, u64, u32, i64, i32, usize);

impl<T: Number> Number for Option<T> {
    fn number(&self) -> Option<f64> {
        self.as_ref().and_then(Number::number)
    }
}

impl<T: Number + ?Sized> Number for &T {
    fn number(&self) -> Option<f64> {
        (**self).number()
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(v: impl Number) -> String {
    num(v.number().map(|b| b / (1u64 << 20) as f64), 1)
}

/// A column of a per-class table: header, metric, decimals; `bytes` columns
/// show the median in MiB.
pub struct Column {
    pub header: &'static str,
    pub metric: &'static str,
    pub digits: usize,
    pub bytes: bool,
}

/// A seconds figure the seeds published per storage class, for the ratio
/// line under a per-class table.
pub struct Seeds {
    pub what: &'static str,
    pub metric: &'static str,
    pub nvme_s: f64,
    pub ebs_s: f64,
}

/// The per-class table of a kind's summaries (median over its clusters,
/// min–max) and each class's ratio to the first for `seeds.metric`, next
/// to the seeds' EBS gp3 / NVMe ratio.
pub fn class_table(
    md: &mut String,
    doc: &Report,
    kind: Kind,
    title: &str,
    columns: &[Column],
    seeds: &Seeds,
) {
    for sm in doc.summaries_of(kind.name()) {
        let headers: Vec<&str> = columns.iter().map(|c| c.header).collect();
        let _ = writeln!(
            md,
            "\n### {title} per instance class (median over clusters, min–max)\n\n| class | cells | {} |\n|---|---|{}",
            headers.join(" | "),
            "---|".repeat(columns.len())
        );
        for (name, c) in &sm.classes {
            let cells: Vec<String> = columns
                .iter()
                .map(|col| figure_cell(c.metrics.get(col.metric), col.digits, col.bytes))
                .collect();
            let _ = writeln!(md, "| {name} | {} | {} |", c.cells, cells.join(" | "));
        }
    }
    for c in doc
        .comparisons
        .iter()
        .filter(|c| c.workload == kind.name() && c.metric == seeds.metric)
    {
        let _ = writeln!(
            md,
            "\n{} ratio: {} / {} = **{}x** (seeds/002: EBS gp3 / NVMe = {:.0} / {:.0} s = {:.2}x)",
            seeds.what,
            c.class,
            c.baseline_class,
            num(c.ratio, 2),
            seeds.ebs_s,
            seeds.nvme_s,
            seeds.ebs_s / seeds.nvme_s
        );
    }
}

/// A class's figure in a table: `value (min–max)`, or the value in MiB
/// for `bytes`; `–` where it was not measured.
pub fn figure_cell(f: Option<&MetricFigure>, digits: usize, bytes: bool) -> String {
    let value = f.map(|f| f.value);
    if bytes {
        return mib(value);
    }
    format!(
        "{} ({}–{})",
        num(value, digits),
        num(f.and_then(|f| f.min), digits),
        num(f.and_then(|f| f.max), digits)
    )
}

pub fn ms(v: impl Number) -> String {
    num(v, 3)
}

/// A figure with about 3 significant digits: 0.0123, 1.23, 123, 12346.
pub fn sig(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let a = x.abs();
    let d = if a == 0.0 || a >= 100.0 {
        0
    } else if a >= 1.0 {
        2
    } else {
        (2.0 - a.log10().floor()) as usize
    };
    format!("{x:.d$}")
}

pub fn num(v: impl Number, digits: usize) -> String {
    v.number()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

/// The mean over `cells` of `field` at each of their seconds (second n
/// covers [n - 1, n) of the measured window) that `keep` takes.
pub(crate) fn class_means<'a>(
    doc: &Report,
    cells: impl Iterator<Item = &'a str>,
    field: fn(&crate::document::Second) -> Option<f64>,
    keep: impl Fn(u64) -> bool,
) -> std::collections::BTreeMap<u64, f64> {
    let mut sums: std::collections::BTreeMap<u64, (f64, u32)> = Default::default();
    for cell in cells {
        for p in doc.timeseries.get(cell).into_iter().flatten() {
            let sec = p.second.unwrap_or(0);
            if let Some(v) = field(p).filter(|_| keep(sec)) {
                let e = sums.entry(sec).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(s, (t, n))| (s, t / n as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Second {
        second: f64,
        left: f64,
    }

    struct Figures {
        seconds: f64,
        cut: Option<(f64, f64)>,
    }

    /// A samples plot draws a line per cell from its samples and edges,
    /// and shades each cell's spans in its class's colour with their label.
    #[test]
    fn a_samples_plot_shades_each_cells_spans_in_its_class_colour() {
        let doc: Report = serde_json::from_value(serde_json::json!({"run_id": "r",
            "environment": {"instance_classes": {"fast": {}, "slow": {}}},
            "samples": {"left": {
                "w0-fast-0": [{"second": 1.0, "left": 80.0}, {"second": 2.0, "left": 40.0}],
                "w0-slow-0": [{"second": 1.0, "left": 90.0}]}}}))
        .unwrap();
        let raw = ResultRow::default();
        let row = |cell_id, class, cut| Row {
            cell_id,
            class,
            agent: "a",
            params: (),
            metrics: Figures { seconds: 3.0, cut },
            raw: &raw,
        };
        let rows = [
            row("w0-fast-0", "fast", Some((1.5, 2.5))),
            row("w0-slow-0", "slow", None),
        ];
        let plot = SamplesPlot {
            sample: "left",
            file: "left.svg",
            title: "What is left",
            x_label: "second",
            y_label: "%",
            point: |s: &Second| Some((s.second, s.left)),
            edges: |m: &Figures| [Some((0.0, 100.0)), Some((m.seconds, 0.0))],
            spans: |m: &Figures| {
                m.cut
                    .iter()
                    .map(|(a, b)| (*a, *b, "partition for 1 s".to_string()))
                    .collect()
            },
        };
        let (mut md, mut plots) = (String::new(), Plots::new());
        samples_plot(&mut md, &mut plots, &doc, &rows, &plot);
        assert!(md.contains("![What is left](left.svg)"), "{md}");
        let svg = &plots[0].1;
        let fast = crate::plot::class_color(&doc, "fast");
        assert_ne!(fast, crate::plot::class_color(&doc, "slow"));
        assert_eq!(svg.matches("fill-opacity").count(), 1, "{svg}");
        assert!(
            svg.contains(&format!(r#"fill="{fast}" fill-opacity"#)),
            "{svg}"
        );
        assert!(svg.contains("partition for 1 s"), "{svg}");
        // Without spans, nothing shaded.
        let plain = SamplesPlot {
            spans: no_spans,
            ..plot
        };
        let mut plots = Plots::new();
        samples_plot(&mut String::new(), &mut plots, &doc, &rows, &plain);
        assert!(!plots[0].1.contains("fill-opacity"), "{}", plots[0].1);
    }
}
