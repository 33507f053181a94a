//! report.md: run summary, cells, environment, and per workload the
//! article-style tables with their plots.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value as Json;

use super::plot::{Series, line_chart};

const MODES: &[&str] = &["external", "pglz", "lz4"];

/// Returns the markdown and the plots it embeds (file name, SVG).
pub fn render(doc: &Json) -> (String, Vec<(String, String)>) {
    let mut md = String::new();
    let mut plots = Vec::new();
    let s = |v: &Json| v.as_str().unwrap_or("").to_string();
    let _ = writeln!(md, "# pgfleet run {}\n", s(&doc["run_id"]));
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(
        md,
        "| scenario | `{}` ({}) |",
        s(&doc["scenario"]),
        s(&doc["scenario_path"])
    );
    let _ = writeln!(md, "| status | **{}** |", s(&doc["status"]));
    let _ = writeln!(md, "| started | {} |", s(&doc["started_at"]));
    let _ = writeln!(md, "| finished | {} |\n", s(&doc["finished_at"]));

    let _ = writeln!(md, "## Environment\n");
    let _ = writeln!(
        md,
        "| instance class | agents | PostgreSQL | storage | host | settings |\n|---|---|---|---|---|---|"
    );
    if let Some(classes) = doc["environment"]["instance_classes"].as_object() {
        for (name, c) in classes {
            let agents: Vec<String> = c["agents"]
                .as_array()
                .map(|a| a.iter().map(s).collect())
                .unwrap_or_default();
            let settings: Vec<String> = c["postgres"]["settings"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
                .unwrap_or_default();
            let caps = &c["storage"]["caps"];
            let capped = ["read_iops", "write_iops", "read_mbps", "write_mbps"]
                .iter()
                .any(|k| caps[*k].as_u64().unwrap_or(0) > 0);
            let emulated = match (c["storage"]["emulated"].as_bool().unwrap_or(false), capped) {
                (true, _) => format!(
                    "emulated: {}/{} IOPS, {}/{} MiB/s read/write",
                    caps["read_iops"], caps["write_iops"], caps["read_mbps"], caps["write_mbps"]
                ),
                (false, true) => "caps NOT applied (emulate: false), the disk as is".to_string(),
                (false, false) => "real".to_string(),
            };
            let mem = c["host"]["memory_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64;
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} ({emulated}) | {} cores, {mem:.1} GiB | {} |",
                agents.join(", "),
                s(&c["postgres"]["version"]),
                s(&c["storage"]["profile"]),
                c["host"]["cores"],
                settings.join(", ")
            );
        }
    }

    let _ = writeln!(
        md,
        "\n## Cells\n\n| cell | agent | state | error |\n|---|---|---|---|"
    );
    for c in doc["cells"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            s(&c["cell_id"]),
            s(&c["agent"]),
            s(&c["state"]),
            s(&c["error"]).replace('|', "\\|").replace('\n', " ")
        );
    }

    let results: Vec<&Json> = doc["results"].as_array().into_iter().flatten().collect();
    toast_slice(&mut md, &mut plots, &results);
    loader(&mut md, &results);
    driver(&mut md, &mut plots, doc);
    (md, plots)
}

fn ms(v: &Json) -> String {
    v.as_f64()
        .map(|x| format!("{x:.3}"))
        .unwrap_or_else(|| "–".into())
}

/// One section per (instance class, dataset, value size): latency table,
/// storage/buffers table, and the latency-vs-offset plot.
fn toast_slice(md: &mut String, plots: &mut Vec<(String, String)>, results: &[&Json]) {
    let mut groups: BTreeMap<(String, String, u64), Vec<&Json>> = BTreeMap::new();
    for r in results.iter().filter(|r| r["workload"] == "toast-slice") {
        let key = (
            r["instance_class"].as_str().unwrap_or("").to_string(),
            r["params"]["dataset"].as_str().unwrap_or("").to_string(),
            r["params"]["value_bytes"].as_u64().unwrap_or(0),
        );
        groups.entry(key).or_default().push(r);
    }
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## toast-slice: {} bytes out of one large value\n\nLatency is the mean of each timed run of the prepared \
         query, median over repeats (as pgbench's `latency average` in the article). Buffers are from a warm \
         `EXPLAIN (ANALYZE, BUFFERS)` read by primary key.",
        results
            .first()
            .and_then(|r| r["params"]["slice_bytes"].as_u64())
            .unwrap_or(100)
    );
    for ((class, dataset, size), rs) in groups {
        let mut offsets: Vec<(u64, String)> = rs
            .iter()
            .map(|r| {
                (
                    r["params"]["offset"].as_u64().unwrap_or(0),
                    r["params"]["offset_label"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect();
        offsets.sort();
        offsets.dedup();
        let modes: Vec<&str> = MODES
            .iter()
            .copied()
            .filter(|m| rs.iter().any(|r| r["params"]["storage_mode"] == *m))
            .collect();
        let find = |m: &str, o: u64| {
            rs.iter().find(|r| {
                r["params"]["storage_mode"] == m && r["params"]["offset"].as_u64() == Some(o)
            })
        };
        let _ = writeln!(
            md,
            "\n### {dataset}, {} ({class})\n",
            crate::scenario::plan::human_bytes(size)
        );
        let header: Vec<String> = offsets
            .iter()
            .map(|(b, l)| format!("{l} (byte {b})"))
            .collect();
        let _ = writeln!(
            md,
            "Latency, ms (p50 / p99 in the JSON):\n\n| storage | {} |\n|---|{}",
            header.join(" | "),
            "---|".repeat(offsets.len())
        );
        for m in &modes {
            let cells: Vec<String> = offsets
                .iter()
                .map(|(o, _)| {
                    find(m, *o)
                        .map(|r| ms(&r["metrics"]["latency_ms_mean"]))
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let _ = writeln!(md, "| {} | {} |", m.to_uppercase(), cells.join(" | "));
        }
        let _ = writeln!(
            md,
            "\nStorage and shared buffers (hit / read):\n\n| storage | stored bytes | compression | external | {} |\n|---|---|---|---|{}",
            header.join(" | "),
            "---|".repeat(offsets.len())
        );
        for m in &modes {
            let Some(first) = offsets.iter().find_map(|(o, _)| find(m, *o)) else {
                continue;
            };
            let mt = &first["metrics"];
            let bufs: Vec<String> = offsets
                .iter()
                .map(|(o, _)| {
                    find(m, *o)
                        .map(|r| {
                            format!(
                                "{} / {}",
                                r["metrics"]["buffers_shared_hit"],
                                r["metrics"]["buffers_shared_read"]
                            )
                        })
                        .unwrap_or_else(|| "–".into())
                })
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                m.to_uppercase(),
                mt["stored_bytes"],
                mt["compression"].as_str().unwrap_or("none"),
                if mt["external"].as_bool().unwrap_or(false) {
                    "yes"
                } else {
                    "no"
                },
                bufs.join(" | ")
            );
        }
        let series: Vec<Series> = modes
            .iter()
            .map(|m| Series {
                name: m.to_uppercase(),
                points: offsets
                    .iter()
                    .filter_map(|(o, _)| {
                        find(m, *o).map(|r| {
                            (
                                (*o - 1) as f64 / size.max(1) as f64 * 100.0,
                                r["metrics"]["latency_ms_mean"].as_f64().unwrap_or(f64::NAN),
                            )
                        })
                    })
                    .collect(),
            })
            .collect();
        let name = format!(
            "toast-slice-{class}-{dataset}-{}.svg",
            crate::scenario::plan::human_bytes(size)
        );
        let svg = line_chart(
            &format!(
                "toast-slice: {dataset} {} ({class})",
                crate::scenario::plan::human_bytes(size)
            ),
            "offset, % of the value",
            "latency, ms",
            &series,
        );
        let _ = writeln!(md, "\n![latency against offset per storage mode]({name})");
        plots.push((name, svg));
    }
}

fn num(v: &Json, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

fn loader(md: &mut String, results: &[&Json]) {
    let rs: Vec<&&Json> = results
        .iter()
        .filter(|r| r["workload"] == "pgbench-init")
        .collect();
    if rs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## pgbench-init: loading\n\n| cell | agent | scale | connections | rows | seconds | rows/s |\n|---|---|---|---|---|---|---|"
    );
    for r in rs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r["cell_id"].as_str().unwrap_or(""),
            r["agent"].as_str().unwrap_or(""),
            r["params"]["scale"],
            r["params"]["load_connections"],
            r["metrics"]["rows_loaded"],
            num(&r["metrics"]["load_seconds"], 2),
            num(&r["metrics"]["rows_per_second"], 0)
        );
    }
}

/// pgbench: every cell's figures, per-class medians, ratios, TPS over time.
fn driver(md: &mut String, plots: &mut Vec<(String, String)>, doc: &Json) {
    let rs: Vec<&Json> = doc["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["workload"] == "pgbench")
        .collect();
    if rs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## pgbench: transactions\n\nLatency from each transaction's (scheduled) start, ms. Page read time is \
         pg_stat_database's blk_read_time per block read; WAL sync time is pg_stat_wal's per sync, over the measured window.\n\n\
         | cell | agent | script | clients/threads | tps | p50 | p90 | p99 | max | transactions | failures | page read ms | WAL sync ms | checkpoints | top wait events |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in &rs {
        let m = &r["metrics"];
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["cell_id"].as_str().unwrap_or(""),
            r["agent"].as_str().unwrap_or(""),
            r["params"]["script"].as_str().unwrap_or(""),
            r["params"]["clients"],
            r["params"]["threads"],
            num(&m["tps"], 1),
            num(&m["latency_ms_p50"], 3),
            num(&m["latency_ms_p90"], 3),
            num(&m["latency_ms_p99"], 3),
            num(&m["latency_ms_max"], 3),
            m["transactions"],
            m["failures"],
            num(&m["page_read_ms_avg"], 3),
            num(&m["wal_sync_ms_avg"], 3),
            m["checkpoints"],
            m["top_wait_events"]
                .as_array()
                .into_iter()
                .flatten()
                .take(3)
                .map(|w| format!(
                    "{} {:.0} %",
                    w["event"].as_str().unwrap_or(""),
                    w["share"].as_f64().unwrap_or(0.0) * 100.0
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (gi, sm) in doc["summaries"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let script = sm["script"].as_str().unwrap_or("");
        let _ = writeln!(
            md,
            "\n### {script}: per instance class (median over clusters, min–max)\n\n\
             | class | clusters | tps | latency p50 ms | page read ms | WAL sync ms |\n|---|---|---|---|---|---|"
        );
        let Some(classes) = sm["classes"].as_object() else {
            continue;
        };
        let cell = |c: &Json, k: &str, d: usize| {
            let x = &c[k];
            if x.is_null() {
                "–".to_string()
            } else {
                format!(
                    "{} ({}–{})",
                    num(&x["median"], d),
                    num(&x["min"], d),
                    num(&x["max"], d)
                )
            }
        };
        for (name, c) in classes {
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} |",
                c["cells"],
                cell(c, "tps", 1),
                cell(c, "latency_ms_p50", 3),
                cell(c, "page_read_ms_avg", 3),
                cell(c, "wal_sync_ms_avg", 3)
            );
        }
        let ratios: Vec<String> = doc["comparisons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["script"] == script && c["metric"] == "tps")
            .map(|c| {
                format!(
                    "{} / {} = **{}x**",
                    c["class"].as_str().unwrap_or(""),
                    c["baseline_class"].as_str().unwrap_or(""),
                    num(&c["ratio"], 2)
                )
            })
            .collect();
        if !ratios.is_empty() {
            let _ = writeln!(md, "\nTPS ratio: {}", ratios.join(", "));
        }
        // TPS and p99 latency over time: per class, the mean over its
        // cells of each second.
        let over_time = |field: &str| -> Vec<Series> {
            classes
                .keys()
                .map(|class| {
                    let mut sums: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
                    for r in rs.iter().filter(|r| {
                        r["instance_class"] == class.as_str() && r["params"]["script"] == script
                    }) {
                        let id = r["cell_id"].as_str().unwrap_or("");
                        for p in doc["timeseries"][id].as_array().into_iter().flatten() {
                            if let Some(v) = p[field].as_f64() {
                                let e = sums.entry(p["second"].as_u64().unwrap_or(0)).or_default();
                                e.0 += v;
                                e.1 += 1;
                            }
                        }
                    }
                    Series {
                        name: class.clone(),
                        points: sums
                            .into_iter()
                            .map(|(s, (t, n))| (s as f64, t / n as f64))
                            .collect(),
                    }
                })
                .collect()
        };
        for (field, file, title, y, alt) in [
            (
                "tps",
                "tps",
                "TPS over time per class",
                "transactions per second",
                "TPS over time per instance class",
            ),
            (
                "latency_ms_p99",
                "p99",
                "p99 latency over time per class",
                "p99 latency (ms)",
                "p99 latency over time per instance class",
            ),
        ] {
            let series = over_time(field);
            if series.iter().any(|s| !s.points.is_empty()) {
                let name = format!("pgbench-{gi}-{script}-{file}.svg");
                plots.push((
                    name.clone(),
                    line_chart(&format!("{script}: {title}"), "second", y, &series),
                ));
                let _ = writeln!(md, "\n![{alt}]({name})");
            }
        }
    }
}
