//! report.md's compression-analysis section: seeds/004's
//! `csm_compress_analysis` table per relation, sample fraction and
//! algorithm, and how close each smaller sample came to the largest.

use crate::Report;
use std::collections::BTreeMap;
use std::fmt::Write;

use pgfleet_proto::workload::compression_analysis::{Metrics, PointParams};

use super::table::{Plots, Row, by_class, mib, num};

type R<'a> = Row<'a, PointParams, Metrics>;

pub fn section(md: &mut String, _plots: &mut Plots, _doc: &Report, results: &[R]) {
    let header = results
        .first()
        .map(|r| r.params.slot_header_bytes)
        .unwrap_or(8);
    let _ = writeln!(
        md,
        "\n## compression-analysis: what page compression would give (seeds/004)\n\n\
         Each sampled 8 KiB page compressed with zstd, lz4 (liblz4, as PostgreSQL) and pglz (PostgreSQL's \
         algorithm and give-up rule; a page it gives up on counts 8,192 bytes). A page needs its compressed \
         bytes plus a slot header (assumed {header} bytes) in its 1 / 2 / 4 KiB slot; the rest goes to overflow \
         in 1 KiB units. Projected size = the sample's slots and overflow scaled to the relation. CPU is the \
         compressing thread's."
    );
    for (class, rs) in by_class(results) {
        let _ = writeln!(
            md,
            "\n### {class}\n\n| relation | size MiB | sample | algorithm | pages | avg bytes | ratio | over 1K % | over 2K % | over 4K % | projected 1K / 2K / 4K MiB | CPU µs/page |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &rs {
            let (p, m) = (&r.params, &r.metrics);
            let _ = writeln!(
                md,
                "| {} ({}) | {} | {}% | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} |",
                p.relation,
                p.relkind,
                mib(m.relation_bytes),
                num(p.sample_fraction * 100.0, 0),
                p.algorithm,
                m.pages_analysed,
                num(m.avg_compressed_bytes, 0),
                num(m.ratio, 2),
                num(m.over_1k_pct, 1),
                num(m.over_2k_pct, 1),
                num(m.over_4k_pct, 1),
                mib(m.projected_1k_bytes),
                mib(m.projected_2k_bytes),
                mib(m.projected_4k_bytes),
                num(m.cpu_us_per_page, 1),
            );
        }
        sampling_error(md, &rs);
    }
}

/// Per relation and algorithm, each smaller sample against the largest:
/// the error of the average size and of the 2 KiB projection, and the
/// difference of the 2 KiB overflow share.
fn sampling_error(md: &mut String, rs: &[&R]) {
    let mut groups: BTreeMap<(&str, &str), Vec<&R>> = BTreeMap::new();
    for r in rs {
        groups
            .entry((&r.params.relation, &r.params.algorithm))
            .or_default()
            .push(r);
    }
    let mut lines = Vec::new();
    for ((rel, alg), mut g) in groups {
        g.sort_by(|a, b| {
            a.params
                .sample_fraction
                .total_cmp(&b.params.sample_fraction)
        });
        let Some(full) = g.last() else { continue };
        let fm = &full.metrics;
        for r in &g[..g.len() - 1] {
            let m = &r.metrics;
            let err = |a: f64, b: f64| {
                if b == 0.0 {
                    f64::NAN
                } else {
                    100.0 * (a - b) / b
                }
            };
            lines.push(format!(
                "| {rel} | {alg} | {}% vs {}% | {} | {:+.2} | {:+.2} | {:+.1} |",
                num(r.params.sample_fraction * 100.0, 0),
                num(full.params.sample_fraction * 100.0, 0),
                m.pages_analysed,
                err(m.avg_compressed_bytes, fm.avg_compressed_bytes),
                err(m.projected_2k_bytes as f64, fm.projected_2k_bytes as f64),
                m.over_2k_pct - fm.over_2k_pct,
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n#### Sampling error (seeds/004: 10 % is practically the full result)\n\n\
         | relation | algorithm | sample vs largest | pages | avg size error % | 2K projection error % | over 2K share diff (points) |\n\
         |---|---|---|---|---|---|---|\n{}",
        lines.join("\n")
    );
}
