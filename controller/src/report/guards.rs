//! Fair-comparison guards: what differs between the instance classes
//! besides their storage (PostgreSQL version and settings, CPUs, memory),
//! and whether a storage comparison's data fits in the memory its clusters
//! have (then reads come from memory and the result measures WAL flushes,
//! not reads). report.json: `differences: [{class, baseline, differs}]`
//! and `warnings: [text]`; report.md and the terminal show the warnings.

use serde_json::{Value as Json, json};

/// Each class against the first (the baseline of every comparison).
pub fn differences(classes: &Json) -> Vec<Json> {
    let Some(map) = classes.as_object() else {
        return Vec::new();
    };
    let mut it = map.iter();
    let Some((base_name, base)) = it.next() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, c) in it {
        // Like with like: a class none of whose cells reported the
        // cluster's own view (none ended with a result) is not compared.
        let unmeasured: Vec<&str> = [(base_name, base), (name, c)]
            .into_iter()
            .filter(|(_, x)| x["measured"] == false)
            .map(|(n, _)| n.as_str())
            .collect();
        if !unmeasured.is_empty() {
            out.push(json!({"class": name, "baseline": base_name, "differs": [], "unmeasured": unmeasured}));
            continue;
        }
        let mut differs = Vec::new();
        let mut field = |what: &str, a: &Json, b: &Json| {
            if !a.is_null() && !b.is_null() && a != b {
                differs.push(format!("{what}: {} vs {}", show(b), show(a)));
            }
        };
        field(
            "PostgreSQL",
            &c["postgres"]["version"],
            &base["postgres"]["version"],
        );
        let (cs, bs) = (&c["postgres"]["settings"], &base["postgres"]["settings"]);
        let mut keys: Vec<&String> = cs
            .as_object()
            .into_iter()
            .chain(bs.as_object())
            .flat_map(|m| m.keys())
            .collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            field(&format!("setting {k}"), &cs[k.as_str()], &bs[k.as_str()]);
        }
        let emulated = |x: &Json| x["instance"]["emulated"] == true;
        let memory = |x: &Json| {
            if emulated(x) && x["instance"]["memory_bytes"].as_u64().unwrap_or(0) > 0 {
                x["instance"]["memory_bytes"].clone()
            } else {
                x["host"]["memory_bytes"].clone()
            }
        };
        let cpus = |x: &Json| {
            if emulated(x) && x["instance"]["cpus"].as_u64().unwrap_or(0) > 0 {
                x["instance"]["cpus"].clone()
            } else {
                x["host"]["cores"].clone()
            }
        };
        field("memory bytes", &memory(c), &memory(base));
        field("CPUs", &cpus(c), &cpus(base));
        field(
            "instance type",
            &c["instance"]["type"],
            &base["instance"]["type"],
        );
        out.push(json!({"class": name, "baseline": base_name, "differs": differs}));
    }
    out
}

fn show(v: &Json) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// The warnings of a run's report: classes that differ in more than their
/// storage, and the scenario's plan warnings (data that fits in memory)
/// with the memory the clusters really had.
pub fn warnings(diffs: &[Json], plan: &[String], compared: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = diffs
        .iter()
        .filter(|d| d["differs"].as_array().is_some_and(|a| !a.is_empty()))
        // Only classes some result compares: classes that ran different
        // entries (scans on one, writes on the other) are not a comparison.
        .filter(|d| d["class"].as_str().is_some_and(|c| compared.contains(&c)))
        .map(|d| {
            format!(
                "warning: classes `{}` and `{}` differ in more than their storage ({}): their comparison measures that too",
                d["baseline"].as_str().unwrap_or(""),
                d["class"].as_str().unwrap_or(""),
                d["differs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Json::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })
        .collect();
    let mut unmeasured: Vec<&str> = diffs
        .iter()
        .flat_map(|d| d["unmeasured"].as_array().into_iter().flatten())
        .filter_map(Json::as_str)
        .collect();
    unmeasured.sort();
    unmeasured.dedup();
    for class in unmeasured {
        out.push(format!(
            "warning: no cell of class `{class}` reported its environment (none ended with a result), so whether it differs from the other classes in more than its storage is unknown"
        ));
    }
    out.extend(plan.iter().cloned());
    out
}

/// Datasets that did not behave as planned, per cell: a published copy
/// that did not match its manifest (discarded, built again: the store or
/// its disk is suspect), a build that could not be published (later cells
/// load again), a restored cell whose data could not be read back into the
/// page cache (it starts colder than a built one would).
pub fn datasets(cells: &[crate::store::CellRow]) -> Vec<String> {
    let mut out = Vec::new();
    for c in cells {
        let Some(d) = c.environment.as_ref().map(|e| &e["dataset"]) else {
            continue;
        };
        let fp = d["fingerprint"].as_str().unwrap_or("");
        if let Some(why) = d["discarded"].as_str() {
            out.push(format!(
                "warning: cell {}: the published dataset {fp} did not match its manifest ({why}); it was discarded and built again: check the store's disk",
                c.cell_id
            ));
        }
        if let Some(why) = d["not_published"].as_str() {
            out.push(format!(
                "warning: cell {}: dataset {fp} was built but not published ({why}); later cells load it again",
                c.cell_id
            ));
        }
        if d["cache"]
            .as_str()
            .is_some_and(|c| c.starts_with("evicted"))
        {
            out.push(format!(
                "warning: cell {}: its dataset could not be read back into the page cache (no pg_prewarm in this PostgreSQL): it measured from a colder cache than a cell that loads its own data",
                c.cell_id
            ));
        }
    }
    out
}

/// Emulated instances that ran at once on one host and together asked for
/// more CPUs or memory than it has: each then got less than it emulates,
/// and the comparison measured the crowding too (four 1-CPU instances on
/// two cores). The scheduler keeps them apart unless the scenario says
/// `oversubscribe: true`; this is the check on what happened: the peak
/// over the cells' own start and end times, per host.
pub fn oversubscribed(classes: &Json, cells: &[crate::store::CellRow]) -> Vec<String> {
    use pgfleet_proto::workload::approx_bytes;
    // (time, +1 start / -1 end, class, instances)
    let mut events: std::collections::BTreeMap<&str, Vec<(&str, i8, &str, u64)>> =
        Default::default();
    for c in cells {
        let class = &classes[c.instance_class.as_str()];
        let (Some(host), Some(start), Some(end)) = (
            class["host"]["hostname"].as_str(),
            c.started_at.as_deref(),
            c.finished_at.as_deref(),
        ) else {
            continue;
        };
        if class["measured"] != true || class["instance"]["emulated"] != true {
            continue;
        }
        let roles = pgfleet_proto::workload::Params::from_json(&c.workload, &c.params.to_string())
            .map_or(1, |p| p.roles().len()) as u64;
        let e = events.entry(host).or_default();
        e.push((start, 1, c.instance_class.as_str(), roles));
        e.push((end, -1, c.instance_class.as_str(), roles));
    }
    let mut out = Vec::new();
    for (host, mut ev) in events {
        // Ends before starts at the same instant: back to back is not at once.
        ev.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
        let (cores, host_memory) = ev
            .first()
            .map(|e| {
                let h = &classes[e.2]["host"];
                (
                    h["cores"].as_u64().unwrap_or(0),
                    h["memory_bytes"].as_u64().unwrap_or(0),
                )
            })
            .unwrap_or_default();
        let mut running: std::collections::BTreeMap<&str, u64> = Default::default();
        let (mut peak_cpus, mut peak_memory) = (0u64, 0u64);
        let (mut at_cpus, mut at_memory) = (String::new(), String::new());
        for (_, delta, class, n) in ev {
            let r = running.entry(class).or_default();
            *r = if delta > 0 {
                *r + n
            } else {
                r.saturating_sub(n)
            };
            let (mut cpus, mut memory) = (0, 0);
            for (k, n) in &running {
                let i = &classes[*k]["instance"];
                cpus += n * i["cpus"].as_u64().unwrap_or(0);
                memory += n * i["memory_bytes"].as_u64().unwrap_or(0);
            }
            let which = || {
                running
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| format!("{n} x `{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if cpus > peak_cpus {
                (peak_cpus, at_cpus) = (cpus, which());
            }
            if memory > peak_memory {
                (peak_memory, at_memory) = (memory, which());
            }
        }
        if cores > 0 && peak_cpus > cores {
            out.push(format!(
                "warning: the emulated instances that ran at once on host {host} ({at_cpus}) asked for {peak_cpus} CPUs together and the host has {cores}: they got less than they emulate. \
                 Remove `oversubscribe: true` (the scheduler then keeps them apart), give fewer CPUs, or a larger host"
            ));
        }
        if host_memory > 0 && peak_memory > host_memory {
            out.push(format!(
                "warning: the emulated instances that ran at once on host {host} ({at_memory}) asked for {} of memory together and the host has {}: they got less than they emulate",
                approx_bytes(peak_memory),
                approx_bytes(host_memory)
            ));
        }
    }
    out
}

/// Share of an emulated cap a probe must reach (and may exceed) before the
/// report says the host did not deliver the profile (or the cap did not
/// bind): a short probe's own spread stays inside it.
pub const DELIVERED_TOLERANCE: f64 = 0.2;

/// Emulated storage profiles whose caps the host did not deliver to the
/// agent's fio probe in the cluster's cgroups (`storage.delivered`): below
/// the cap, a host disk slower than the emulated device (or busy with the
/// other classes' cells) set the class's figures and the comparison
/// measures the host; above it, the throttling did not bind. A probe that
/// could not run says so.
pub fn delivered(classes: &Json) -> Vec<String> {
    let Some(map) = classes.as_object() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, c) in map {
        let storage = &c["storage"];
        let d = &storage["delivered"];
        if storage["emulated"] != true || d.is_null() {
            continue;
        }
        let profile = storage["profile"].as_str().unwrap_or("?");
        if let Some(e) = d["error"].as_str() {
            out.push(format!(
                "warning: class `{name}`: what its emulated storage profile `{profile}` delivers was not checked ({e})"
            ));
            continue;
        }
        for (cap, unit) in [
            ("read_iops", "read IOPS"),
            ("write_iops", "write IOPS"),
            ("read_mbps", "MiB/s of reads"),
            ("write_mbps", "MiB/s of writes"),
        ] {
            let (Some(asked), Some(got)) = (d[cap]["asked"].as_f64(), d[cap]["delivered"].as_f64())
            else {
                continue;
            };
            if asked <= 0.0 {
                continue;
            }
            let share = got / asked;
            if share < 1.0 - DELIVERED_TOLERANCE {
                out.push(format!(
                    "warning: class `{name}`: its storage profile `{profile}` emulates {asked:.0} {unit}, and the host delivered {got:.0} ({:.0} %) to a fio probe in the class's cgroups: \
                     this host's disk (or the other cells using it at once) set the class's figures, not the profile, and ratios against it are off by as much. \
                     Run on a faster disk, or fewer cells at once",
                    100.0 * share
                ));
            } else if share > 1.0 + DELIVERED_TOLERANCE {
                out.push(format!(
                    "warning: class `{name}`: its storage profile `{profile}` caps {unit} at {asked:.0}, and a fio probe in the class's cgroups got {got:.0} ({:.0} %): \
                     the cap did not bind, so the class ran faster than the profile",
                    100.0 * share
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_the_host_did_not_deliver_are_warned_about() {
        let class = |emulated: bool, delivered: Json| json!({"storage": {"profile": "custom", "emulated": emulated, "delivered": delivered}});
        let classes = json!({
            "fine": class(true, json!({"read_iops": {"asked": 3000, "delivered": 2950.0},
                                       "write_mbps": {"asked": 125, "delivered": 131.0}})),
            "slow": class(true, json!({"read_iops": {"asked": 10_000_000, "delivered": 41_000.0}})),
            "loose": class(true, json!({"write_iops": {"asked": 300, "delivered": 900.0}})),
            "nofio": class(true, json!({"error": "`fio` was not found on the agent's host"})),
            "host": class(false, json!({"read_iops": {"asked": 3000, "delivered": 10.0}})),
        });
        let w = delivered(&classes);
        assert_eq!(w.len(), 3, "{w:#?}");
        assert!(
            w.iter().any(|w| w.contains("class `slow`")
                && w.contains("emulates 10000000 read IOPS")
                && w.contains("delivered 41000 (0 %)")),
            "{w:#?}"
        );
        assert!(
            w.iter().any(|w| w.contains("class `loose`")
                && w.contains("did not bind")
                && w.contains("(300 %)")),
            "{w:#?}"
        );
        assert!(
            w.iter()
                .any(|w| w.contains("class `nofio`") && w.contains("not checked")),
            "{w:#?}"
        );
    }

    #[test]
    fn datasets_that_misbehaved_are_warned_about() {
        let cell = |id: &str, d: Json| crate::store::CellRow {
            cell_id: id.into(),
            workload: "pgbench".into(),
            instance_class: "local".into(),
            params: Json::Null,
            state: "succeeded".into(),
            agent_id: None,
            error: None,
            environment: Some(json!({ "dataset": d })),
            started_at: None,
            finished_at: None,
        };
        let fine = cell(
            "a",
            json!({"fingerprint": "pgbench-s1-x", "how": "restored", "cache": "rewarmed"}),
        );
        assert!(datasets(&[fine]).is_empty());
        let w = datasets(&[
            cell(
                "b",
                json!({"fingerprint": "pgbench-s1-x", "how": "built", "cache": "rewarmed",
                             "discarded": "base/5/16384: SHA-256 0a differs"}),
            ),
            cell(
                "c",
                json!({"fingerprint": "pgbench-s1-x", "how": "built", "cache": "rewarmed",
                             "not_published": "the store has 1 GiB free"}),
            ),
            cell(
                "d",
                json!({"fingerprint": "pgbench-s1-x", "how": "restored",
                             "cache": "evicted (no pg_prewarm)"}),
            ),
        ]);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("cell b") && w[0].contains("SHA-256"), "{w:?}");
        assert!(
            w[1].contains("cell c") && w[1].contains("load it again"),
            "{w:?}"
        );
        assert!(w[2].contains("cell d") && w[2].contains("colder"), "{w:?}");
    }

    fn class(version: &str, sb: &str, mem: u64, emulated: bool) -> Json {
        json!({"postgres": {"version": version, "settings": {"shared_buffers": sb, "fsync": "on"}},
               "host": {"cores": 2, "memory_bytes": 24u64 << 30},
               "instance": {"emulated": emulated, "memory_bytes": mem, "cpus": 1, "type": ""},
               "storage": {"profile": "nvme"}})
    }

    #[test]
    fn instances_that_ran_at_once_beyond_their_host_are_warned_about() {
        let c = |agents: &[&str], cpus: u64, host: &str| {
            json!({"measured": true, "agents": agents,
                   "host": {"hostname": host, "cores": 2, "memory_bytes": 24u64 << 30},
                   "instance": {"emulated": true, "cpus": cpus, "memory_bytes": 1u64 << 30}})
        };
        let params = pgfleet_proto::workload::plan_entry("{kind: pgbench, scale: 1}")
            .unwrap()
            .remove(0)
            .1
            .to_json();
        let cell = |id: &str, class: &str, start: &str, end: &str| crate::store::CellRow {
            cell_id: id.into(),
            workload: "pgbench".into(),
            instance_class: class.into(),
            params: serde_json::from_str(&params).unwrap(),
            state: "succeeded".into(),
            agent_id: None,
            error: None,
            environment: None,
            started_at: Some(format!("2026-12-03T08:{start}Z")),
            finished_at: Some(format!("2026-12-03T08:{end}Z")),
        };
        let one_host = json!({"nvme": c(&["a", "b"], 1, "h"), "gp3": c(&["c", "d"], 1, "h")});
        // The storage suite as a user ran it: 2 + 2 cells of 1 CPU at once
        // on 2 cores.
        let crowded = [
            cell("n1", "nvme", "00:00", "01:00"),
            cell("n2", "nvme", "00:01", "01:00"),
            cell("g1", "gp3", "00:02", "01:00"),
            cell("g2", "gp3", "00:03", "01:00"),
        ];
        let w = oversubscribed(&one_host, &crowded);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("asked for 4 CPUs") && w[0].contains("has 2"),
            "{w:?}"
        );
        assert!(w[0].contains("2 x `gp3`, 2 x `nvme`"), "{w:?}");
        // Two at a time (what the scheduler does): no warning, even back
        // to back at the same instant.
        let apart = [
            cell("n1", "nvme", "00:00", "01:00"),
            cell("g1", "gp3", "00:00", "01:00"),
            cell("n2", "nvme", "01:00", "02:00"),
            cell("g2", "gp3", "01:00", "02:00"),
        ];
        assert!(oversubscribed(&one_host, &apart).is_empty());
        // The same at once on two hosts fits.
        let two_hosts = json!({"nvme": c(&["a", "b"], 1, "h1"), "gp3": c(&["c", "d"], 1, "h2")});
        assert!(oversubscribed(&two_hosts, &crowded).is_empty());
    }

    #[test]
    fn a_class_without_a_measured_environment_is_not_compared_and_says_so() {
        // The registration's short version against a cell's full one: not
        // a difference, an unknown.
        let mut slow = class("15.18", "128MB", 96 << 20, true);
        slow["measured"] = json!(false);
        let mut fast = class("15.18 (Debian 15.18-0+deb12u1)", "128MB", 96 << 20, true);
        fast["measured"] = json!(true);
        let d = differences(&json!({"fast": fast, "slow": slow}));
        assert_eq!(d[0]["differs"], json!([]));
        let w = warnings(&d, &[], &["slow"]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("no cell of class `slow` reported its environment"),
            "{w:?}"
        );
        assert!(!w[0].contains("differ in more than"), "{w:?}");
    }

    #[test]
    fn differences_besides_storage_are_named() {
        // Classes are compared with the first (in name order).
        let same = json!({"a": class("15.18", "128MB", 96 << 20, true), "b": class("15.18", "128MB", 96 << 20, true)});
        let d = differences(&same);
        assert_eq!(d[0]["differs"], json!([]));
        assert!(warnings(&d, &[], &["b"]).is_empty());
        let other = json!({"a": class("15.18", "128MB", 96 << 20, true), "b": class("16.4", "1GB", 0, false)});
        let d = differences(&other);
        let list: Vec<&str> = d[0]["differs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert!(list.contains(&"PostgreSQL: 15.18 vs 16.4"), "{list:?}");
        assert!(
            list.contains(&"setting shared_buffers: 128MB vs 1GB"),
            "{list:?}"
        );
        assert!(
            list.iter()
                .any(|x| x.starts_with("memory bytes: 100663296 vs")),
            "{list:?}"
        );
        assert!(list.contains(&"CPUs: 1 vs 2"), "{list:?}");
        let w = warnings(&d, &["warning: plan".into()], &["b"]);
        assert_eq!(w.len(), 2);
        // Classes no result compares (each ran its own entries): no warning
        // about their differences.
        assert_eq!(warnings(&d, &[], &[]), Vec::<String>::new());
        assert!(
            w[0].contains("differ in more than their storage"),
            "{}",
            w[0]
        );
    }
}
