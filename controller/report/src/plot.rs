//! Minimal SVG line charts (no font or image dependencies): one line per
//! series, linear axes with ticks, a legend.

const W: f64 = 720.0;
const H: f64 = 420.0;
const L: f64 = 70.0;
const R: f64 = 150.0;
const T: f64 = 40.0;
const B: f64 = 50.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Its colour (`class_color`: one per instance class in every plot of
    /// a report); None: by its place in the chart.
    pub color: Option<&'static str>,
}

/// A span of the x axis to shade and name (a fault's window).
pub struct Mark {
    pub from: f64,
    pub to: f64,
    pub label: String,
    /// Its colour (a class's); None: the default.
    pub color: Option<&'static str>,
}

/// An instance class's colour, the same in every plot of a report: by the
/// class's place among the report's classes (`environment.instance_classes`).
pub fn class_color(doc: &crate::Report, class: &str) -> &'static str {
    let i = doc
        .environment
        .instance_classes
        .keys()
        .position(|k| k == class)
        .unwrap_or_else(|| pgfleet_scenario::stats::seed_of(class) as usize);
    COLORS[i % COLORS.len()]
}

fn esc(s: &str) -> String {
    pgfleet_proto::escape::xml(s)
}

/// "Nice" tick step for a range.
fn step(range: f64) -> f64 {
    if range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    let nice = if n < 1.5 {
        1.0
    } else if n < 3.5 {
        2.0
    } else if n < 7.5 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    line_chart_marked(title, x_label, y_label, series, &[])
}

/// `line_chart` with spans of the x axis shaded and labelled (`marks`,
/// drawn under the lines).
pub fn line_chart_marked(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    marks: &[Mark],
) -> String {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite());
    // A marked chart shows its stretch of the axis (a fault's seconds),
    // others start at 0.
    let lo = xs.clone().fold(f64::INFINITY, f64::min);
    let (x0, x1) = (
        if marks.is_empty() || !lo.is_finite() {
            lo.min(0.0)
        } else {
            lo
        },
        xs.fold(f64::NEG_INFINITY, f64::max)
            .max(if lo.is_finite() { lo + 1.0 } else { 1.0 })
            .max(1.0),
    );
    let y1 = ys.fold(0.0, f64::max);
    let ystep = step(y1);
    let y1 = (y1 / ystep).ceil().max(1.0) * ystep;
    let xstep = step(x1 - x0);
    let px = |x: f64| L + (x - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - y / y1 * (H - T - B);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>
"#,
        (L + W - R) / 2.0,
        esc(title)
    );
    let mut y = 0.0;
    while y <= y1 + ystep / 2.0 {
        let (x2, yy, tx, ty, label) = (W - R, py(y), L - 6.0, py(y) + 4.0, fmt(y));
        s += &format!(
            r##"<line x1="{L}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>
"##
        );
        y += ystep;
    }
    let mut x = (x0 / xstep).ceil() * xstep;
    while x <= x1 + xstep / 2.0 {
        s += &format!(
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#eee"/><text x="{0:.1}" y="{3}" text-anchor="middle">{4}</text>
"##,
            px(x),
            T,
            H - B,
            H - B + 16.0,
            fmt(x)
        );
        x += xstep;
    }
    s += &format!(
        r##"<line x1="{L}" x2="{L}" y1="{T}" y2="{}" stroke="black"/><line x1="{L}" x2="{}" y1="{}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>
"##,
        H - B,
        W - R,
        H - B,
        H - B,
        (L + W - R) / 2.0,
        H - 12.0,
        esc(x_label),
        (T + H - B) / 2.0,
        esc(y_label)
    );
    for (i, m) in marks.iter().enumerate() {
        let (a, b) = (px(m.from.clamp(x0, x1)), px(m.to.clamp(x0, x1)));
        let c = m.color.unwrap_or("#b2182b");
        s += &format!(
            r##"<rect x="{a:.1}" y="{T}" width="{:.1}" height="{}" fill="{c}" fill-opacity="0.15"/><text x="{:.1}" y="{}" font-size="11" fill="{c}">{}</text>
"##,
            (b - a).max(1.5),
            H - B - T,
            a + 3.0,
            T + 12.0 + 14.0 * i as f64,
            esc(&m.label)
        );
    }
    for (i, se) in series.iter().enumerate() {
        let c = se.color.unwrap_or(COLORS[i % COLORS.len()]);
        let pts: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
            .collect();
        s += &format!(
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in se.points.iter().filter(|p| p.1.is_finite()) {
            s += &format!(
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"/>"#,
                px(p.0),
                py(p.1)
            );
        }
        let ly = T + 10.0 + i as f64 * 20.0;
        s += &format!(
            r#"
<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>
"#,
            W - R + 15.0,
            W - R + 40.0,
            W - R + 46.0,
            ly + 4.0,
            esc(&se.name)
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_a_line_per_series_and_escapes_text() {
        let svg = line_chart(
            "a < b",
            "x",
            "y",
            &[
                Series {
                    name: "one".into(),
                    points: vec![(0.0, 1.0), (50.0, 2.0)],
                    color: None,
                },
                Series {
                    name: "two".into(),
                    points: vec![(0.0, 3.0), (50.0, f64::NAN)],
                    color: Some("#123456"),
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(
            svg.contains(r##"stroke="#123456""##),
            "a series' own colour"
        );
        assert!(svg.contains("a &lt; b"));
        assert_eq!(step(10.0), 2.0);
        assert_eq!(step(0.9), 0.2);
        // A class keeps its colour in every plot of a report.
        let doc: crate::Report = serde_json::from_value(
            serde_json::json!({"environment": {"instance_classes": {"gp3": {}, "nvme": {}}}}),
        )
        .unwrap();
        assert_eq!(class_color(&doc, "gp3"), COLORS[0]);
        assert_eq!(class_color(&doc, "nvme"), COLORS[1]);
    }
}
