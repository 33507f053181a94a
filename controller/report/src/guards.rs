//! Fair-comparison guards: what differs between the instance classes
//! besides their storage (PostgreSQL version and settings, CPUs, memory),
//! and whether a storage comparison's data fits in the memory its clusters
//! have (then reads come from memory and the result measures WAL flushes,
//! not reads). report.json: `differences: [{class, baseline, differs}]`
//! and `warnings: [text]`; report.md and the terminal show the warnings.

use std::collections::BTreeMap;

use pgfleet_proto::environment::Environment;
use serde::Deserialize;
use serde_json::Value as Json;

use crate::document::{Difference, ResultRow, dataset_of};
use pgfleet_proto::dataset::Provenance;

pub use crate::document::{ClassEnvironment, Classes};

/// Each class's environment from the store: its agents' registrations,
/// then the first cell of the class that reported its cluster's own view
/// (a single-role cell's environment with a PostgreSQL version).
pub fn class_environments(
    agents: &[pgfleet_store::AgentRow],
    cells: &[pgfleet_store::CellRow],
) -> Classes {
    let mut classes = Classes::new();
    for a in agents {
        let c = classes.entry(a.instance_class.clone()).or_insert_with(|| {
            let i = &a.info;
            let mut env = Environment::default();
            env.postgres.version = i.postgres_version.clone();
            if let Some(s) = &i.storage {
                env.storage.profile = s.profile.clone();
                env.storage.emulated = s.emulated;
                env.storage.caps = s.caps;
            }
            env.host.cores = i.cores;
            env.host.memory_bytes = i.memory_bytes;
            env.host.hostname = i.hostname.clone();
            ClassEnvironment {
                env,
                agents: Vec::new(),
                measured: false,
            }
        });
        c.agents.push(a.agent_id.clone());
    }
    for cell in cells {
        let Some(class) = classes
            .get_mut(&cell.instance_class)
            .filter(|c| !c.measured)
        else {
            continue;
        };
        let Some(env) = cell
            .environment
            .as_ref()
            .and_then(|e| Environment::deserialize(e).ok())
            .filter(|e| !e.postgres.version.is_empty())
        else {
            continue;
        };
        class.env = Environment {
            // Where a cell's data came from is the cell's, not the class's.
            dataset: None,
            ..env
        };
        class.measured = true;
    }
    classes
}

/// Each class against the first (the baseline of every comparison).
pub fn differences(classes: &Classes) -> Vec<Difference> {
    let mut it = classes.iter();
    let Some((base_name, base)) = it.next() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, c) in it {
        // Like with like: a class none of whose cells reported the
        // cluster's own view (none ended with a result) is not compared.
        let unmeasured: Vec<&str> = [(base_name, base), (name, c)]
            .into_iter()
            .filter(|(_, x)| !x.measured)
            .map(|(n, _)| n.as_str())
            .collect();
        if !unmeasured.is_empty() {
            out.push(Difference {
                class: name.clone(),
                baseline: base_name.clone(),
                differs: Vec::new(),
                unmeasured: unmeasured.into_iter().map(str::to_string).collect(),
            });
            continue;
        }
        let (a, b) = (&c.env, &base.env);
        let mut differs = Vec::new();
        // Unknown (empty, 0) on either side is not a difference.
        let mut field = |what: &str, x: String, y: String| {
            let known = |v: &str| !v.is_empty() && v != "0";
            if known(&x) && known(&y) && x != y {
                differs.push(format!("{what}: {y} vs {x}"));
            }
        };
        field(
            "PostgreSQL",
            a.postgres.version.clone(),
            b.postgres.version.clone(),
        );
        let mut keys: Vec<&String> = a
            .postgres
            .settings
            .keys()
            .chain(b.postgres.settings.keys())
            .collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let get = |e: &Environment| e.postgres.settings.get(k).cloned().unwrap_or_default();
            field(&format!("setting {k}"), get(a), get(b));
        }
        field(
            "memory bytes",
            a.memory_bytes().to_string(),
            b.memory_bytes().to_string(),
        );
        field("CPUs", a.cpus().to_string(), b.cpus().to_string());
        field(
            "instance type",
            a.instance.instance_type.clone(),
            b.instance.instance_type.clone(),
        );
        out.push(Difference {
            class: name.clone(),
            baseline: base_name.clone(),
            differs,
            unmeasured: Vec::new(),
        });
    }
    out
}

/// The warnings of a run's report: classes that differ in more than their
/// storage, and the scenario's plan warnings (data that fits in memory)
/// with the memory the clusters really had.
pub fn warnings(diffs: &[Difference], plan: &[String], compared: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = diffs
        .iter()
        .filter(|d| !d.differs.is_empty())
        // Only classes some result compares: classes that ran different
        // entries (scans on one, writes on the other) are not a comparison.
        .filter(|d| compared.contains(&d.class.as_str()))
        .map(|d| {
            format!(
                "warning: classes `{}` and `{}` differ in more than their storage ({}): their comparison measures that too",
                d.baseline,
                d.class,
                d.differs.join("; ")
            )
        })
        .collect();
    let mut unmeasured: Vec<&str> = diffs
        .iter()
        .flat_map(|d| d.unmeasured.iter().map(String::as_str))
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
pub fn datasets(cells: &[pgfleet_store::CellRow]) -> Vec<String> {
    let mut out = Vec::new();
    // Cells whose dataset matches `pred`, named in one warning: "cell(s)
    // <ids> <what>".
    let datasets: Vec<(&str, Provenance)> = cells
        .iter()
        .filter_map(|c| Some((c.cell_id.as_str(), dataset_of(c.environment.as_ref())?)))
        .collect();
    let mut about = |pred: fn(&Provenance) -> bool, what: &str| {
        let ids: Vec<&str> = datasets
            .iter()
            .filter(|(_, d)| pred(d))
            .map(|(id, _)| *id)
            .collect();
        if !ids.is_empty() {
            let s = if ids.len() == 1 { "" } else { "s" };
            out.push(format!("warning: cell{s} {} {what}", ids.join(", ")));
        }
    };
    // `reuse_cluster`: a reused cell starts from the data its previous
    // cell changed, not from the dataset.
    about(
        |d| d.how == "reused",
        "reused a cluster an earlier cell had written to (reuse_cluster): after the kind's reset the data is not the dataset as loaded (pgbench: updated rows moved, indexes grown), so compare them with reused cells, not with built or restored ones (on an emulated gp3 with 2 GiB at scale 200, reused cells ran 28 % fewer TPS: BENCHMARKS.md, \"Reuse in place\")",
    );
    // `--dataset-reflink`: the restored files share the store's blocks.
    about(
        |d| d.method == "reflink",
        "restored data by reflink (the agent's --dataset-reflink): their files shared blocks with the dataset store, so each first write to a block copied it, which a built or copied cluster does not do (on XFS at scale 200: 14-24 % fewer TPS, WAL flushes 0.63-0.72 ms vs 0.49-0.51: BENCHMARKS.md, \"Reflinks\"); compare them with each other, or restore by copy",
    );
    // `hydrate: none`: restored from a volume snapshot's lazy blocks.
    about(
        |d| d.hydration.as_ref().is_some_and(|h| !h.hydrated),
        "restored data from a volume created from a snapshot without reading it first (storage.hydrate: none): such a volume fetches each block from the snapshot on first touch, so their figures include the lazy restore, not only the storage; use `hydrate: read-all` (the default)",
    );
    for (cell_id, d) in &datasets {
        let fp = &d.fingerprint;
        if let Some(why) = &d.discarded {
            out.push(format!(
                "warning: cell {cell_id}: the published dataset {fp} did not match its manifest ({why}); it was discarded and built again: check the store's disk"
            ));
        }
        if let Some(why) = &d.not_published {
            out.push(format!(
                "warning: cell {cell_id}: dataset {fp} was built but not published ({why}); later cells load it again"
            ));
        }
        if d.cache.starts_with("evicted") {
            out.push(format!(
                "warning: cell {cell_id}: its dataset could not be read back into the page cache (no pg_prewarm in this PostgreSQL): it measured from a colder cache than a cell that loads its own data"
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
pub fn oversubscribed(classes: &Classes, cells: &[pgfleet_store::CellRow]) -> Vec<String> {
    use pgfleet_proto::workload::approx_bytes;
    // (time, +1 start / -1 end, class, instances)
    let mut events: std::collections::BTreeMap<&str, Vec<(&str, i8, &str, u64)>> =
        Default::default();
    for c in cells {
        let Some(class) = classes.get(&c.instance_class) else {
            continue;
        };
        let (host, Some(start), Some(end)) = (
            class.env.host.hostname.as_str(),
            c.started_at.as_deref(),
            c.finished_at.as_deref(),
        ) else {
            continue;
        };
        if host.is_empty() || !class.measured || !class.env.instance.emulated {
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
            .and_then(|e| classes.get(e.2))
            .map(|c| (c.env.host.cores, c.env.host.memory_bytes))
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
                if let Some(c) = classes.get(*k) {
                    cpus += n * u64::from(c.env.instance.cpus);
                    memory += n * c.env.instance.memory_bytes;
                }
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
pub fn delivered(classes: &Classes) -> Vec<String> {
    let mut out = Vec::new();
    for (name, c) in classes {
        let storage = &c.env.storage;
        let Some(d) = storage.delivered.as_ref().filter(|_| storage.emulated) else {
            continue;
        };
        let profile = storage.profile.as_str();
        if let Some(e) = &d.error {
            out.push(format!(
                "warning: class `{name}`: what its emulated storage profile `{profile}` delivers was not checked ({e})"
            ));
            continue;
        }
        for (cap, _, unit) in storage.caps.each() {
            let Some(p) = d.of(cap).filter(|p| p.asked > 0.0) else {
                continue;
            };
            let (asked, got) = (p.asked, p.delivered);
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
        for (probe, _, what) in storage.caps.latency.each() {
            let Some(p) = d.of(probe).filter(|p| p.asked > 0.0) else {
                continue;
            };
            let (asked, got) = (p.asked, p.delivered);
            let share = got / asked;
            if (share - 1.0).abs() > DELIVERED_TOLERANCE {
                out.push(format!(
                    "warning: class `{name}`: its storage profile `{profile}` answers {what} in {asked:.2} ms, and one at a time a fio probe on its volume took {got:.2} ms ({:.0} %): \
                     figures that wait on single I/Os (commits at few clients, one process's reads) follow {}, not the profile",
                    100.0 * share,
                    if share > 1.0 { "this host (its disk, or its CPUs busy with other cells)" } else { "an emulation that answered early" }
                ));
            }
        }
    }
    out
}

/// A read cap that a class's cells asked less than this share of did not
/// bind.
pub const UNBOUND_SHARE: f64 = 0.5;

/// Emulated classes whose read cap never bound while another class's did:
/// a cap bounds a rate, so the bound class measures its profile on any
/// host, and the other measures this host's disk (its per-read latency),
/// which differs between hosts, and so does their ratio (BENCHMARKS.md,
/// "Both sides emulated": 22.7x and 10.7x on two hosts, the probe
/// satisfied on both). A measured point's reads per second are its blocks
/// read from outside shared buffers (`blocks_read`, an upper bound of the
/// device's reads) over its measured window (`transactions / tps`).
pub fn unbound(classes: &Classes, results: &[ResultRow]) -> Vec<String> {
    // class -> (its busiest point's blocks read per second, that point's figures)
    let mut asked: BTreeMap<&str, (f64, Busy)> = BTreeMap::new();
    for r in results {
        let (Some(class), Ok(m)) = (r.instance_class.as_deref(), Busy::deserialize(&r.metrics))
        else {
            continue;
        };
        let (Some(blocks), Some(tps), Some(tx)) = (m.internals.blocks_read, m.tps, m.transactions)
        else {
            continue;
        };
        if tps <= 0.0 || tx <= 0.0 {
            continue;
        }
        let per_s = blocks as f64 * tps / tx;
        match asked.get(class) {
            Some((most, _)) if per_s < *most => {}
            _ => {
                asked.insert(class, (per_s, m));
            }
        }
    }
    let share = |class: &str, per_s: f64| {
        let c = classes.get(class).filter(|c| c.env.storage.emulated)?;
        let cap = c.env.storage.caps.read_iops;
        (cap > 0).then(|| (per_s / cap as f64, cap, c.env.storage.profile.as_str()))
    };
    let Some(bound) = asked
        .iter()
        .find(|(c, (per_s, _))| share(c, *per_s).is_some_and(|s| s.0 >= UNBOUND_SHARE))
        .map(|(c, _)| *c)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (class, (per_s, m)) in &asked {
        let Some((sh, cap, profile)) = share(class, *per_s).filter(|s| s.0 < UNBOUND_SHARE) else {
            continue;
        };
        let latency = m.internals.page_read_ms_avg.map_or(String::new(), |ms| {
            format!(" (a page read took {ms:.3} ms)")
        });
        out.push(format!(
            "warning: class `{class}`: its cells read at most {per_s:.0} blocks/s from outside shared buffers, {:.0} % of the {cap} read IOPS its profile `{profile}` emulates, while class `{bound}`'s reads met its cap: \
             `{class}`'s cap never bound, so its figures follow this host's disk{latency} rather than the profile, and ratios against `{bound}` move with the host's per-read latency (BENCHMARKS.md, \"Both sides emulated\": 10.7x to 22.7x over four hosts). \
             {}Compare runs of one host, and read the ratio as this host's",
            100.0 * sh,
            held_back_by(m).map_or(String::new(), |s| format!("{s}. ")),
        ));
    }
    out
}

/// Wait events of one bottleneck: a point's sampled waits summed by these
/// say what held a class back when its storage cap did not.
const BOTTLENECKS: &[(&str, &[&str])] = &[
    (
        "WAL flushes",
        &[
            "LWLock:WALWrite",
            "IO:WALSync",
            "IO:WALWrite",
            "IO:WALInitSync",
        ],
    ),
    ("data file reads", &["IO:DataFileRead"]),
    ("the CPU", &["CPU:running"]),
];

/// What the busiest point of a class whose cap never bound waited on, when
/// one bottleneck of `BOTTLENECKS` took at least a third of its sampled
/// active backends: the mechanism that set its figures instead of the cap
/// (BENCHMARKS.md, "I/O per transaction": nvme's side waits 51-62 % on
/// `LWLock:WALWrite`, the host's WAL fsync behind group commit).
fn held_back_by(m: &Busy) -> Option<String> {
    let waits = &m.internals.top_wait_events;
    let share_of = |events: &[&str]| -> (f64, Vec<String>) {
        let mut named = Vec::new();
        let mut sum = 0.0;
        for w in waits {
            if events.contains(&w.event.as_str()) {
                sum += w.share;
                named.push(format!("{} {:.0} %", w.event, 100.0 * w.share));
            }
        }
        (sum, named)
    };
    let (what, (sum, named)) = BOTTLENECKS
        .iter()
        .map(|(what, events)| (*what, share_of(events)))
        .max_by(|a, b| a.1.0.total_cmp(&b.1.0))?;
    if sum < 1.0 / 3.0 {
        return None;
    }
    let mut s = format!(
        "What held it back instead was {what}: {:.0} % of its sampled active backends waited on them ({})",
        100.0 * sum,
        named.join(", ")
    );
    if what == "WAL flushes" {
        if let Some(ms) = m.internals.wal_sync_ms_avg {
            s.push_str(&format!(", a WAL sync took {ms:.3} ms"));
        }
        s.push_str(
            "; commits queue behind this host's fsync, a latency that a rate cap cannot emulate (it can only slow a device), \
             so this class's side of the ratio is the host's (BENCHMARKS.md, \"I/O per transaction\")",
        );
    }
    Some(s)
}

/// Page writes per transaction below this before some second of a window
/// and at least `DIRTY_AFTER` from it on: shared_buffers filled with dirty
/// pages then.
const CLEAN_BEFORE: f64 = 0.2;
const DIRTY_AFTER: f64 = 0.8;

/// pgbench points whose shared_buffers filled with dirty pages inside the
/// measured window: until then a read takes a free or clean buffer, after
/// it each read first writes a dirty page out, so I/O per transaction
/// about doubles and a capped class's TPS falls (BENCHMARKS.md, "I/O per
/// transaction": gp3 165 TPS, then 75). Such a point's figures average two
/// regimes. From the sampler's per-second `pg_stat` samples
/// (`io.writes` per `database.xact_commit`, after the warm-up); one
/// warning per class and point, counting its cells.
pub fn dirty_fill(results: &[ResultRow], pg_stat: &[(String, Json)]) -> Vec<String> {
    let mut by_cell: BTreeMap<&str, Vec<PgStatSecond>> = BTreeMap::new();
    for (cell, s) in pg_stat {
        if let Ok(s) = PgStatSecond::deserialize(s) {
            by_cell.entry(cell.as_str()).or_default().push(s);
        }
    }
    // (class, point) -> (its parameters, cells, cells that filled, an example).
    type Seen = (Drive, usize, usize, Option<Fill>);
    let mut seen: BTreeMap<(&str, String), Seen> = BTreeMap::new();
    for r in results.iter().filter(|r| r.workload() == "pgbench") {
        let (cell, Some(class)) = (r.cell_id.as_str(), r.instance_class.as_deref()) else {
            continue;
        };
        let p = Drive::deserialize(&Json::Object(r.params.clone())).unwrap_or_default();
        let warmup = p.warmup_s.unwrap_or(0.0);
        let window: Vec<&PgStatSecond> = by_cell
            .get(cell)
            .into_iter()
            .flatten()
            .filter(|s| s.t.is_some_and(|t| t > warmup + 0.5))
            .collect();
        let Some(fill) = filled(&window) else {
            continue;
        };
        let e = seen
            .entry((class, crate::document::params_text(&r.params)))
            .or_insert((p, 0, 0, None));
        e.1 += 1;
        if let Some(f) = fill {
            e.2 += 1;
            e.3.get_or_insert(Fill {
                second: f.second - warmup,
                ..f
            });
        }
    }
    let mut out = Vec::new();
    for ((class, _), (p, cells, n, fill)) in seen {
        let Some(f) = fill else { continue };
        out.push(format!(
            "warning: class `{class}` ({} at {} clients, {} s measured): shared_buffers filled with dirty pages during the measured window, \
             in {n} of its {cells} cells (about second {:.0}): PostgreSQL wrote {:.2} pages out per transaction until then and {:.2} after, \
             each read then first evicting a dirty page, so its figures average two regimes. Measure one: a window that ends before they fill \
             (as the seeds' gp3 did, BENCHMARKS.md \"I/O per transaction\"), or a warm-up that runs past it",
            p.script.as_deref().unwrap_or("pgbench"),
            p.clients.map_or("null".to_string(), |c| c.to_string()),
            p.duration_s.map_or("–".into(), |d| format!("{d:.0}")),
            f.second,
            f.before,
            f.after,
        ));
    }
    out
}

/// A pgbench point's figures the guards read (`unbound`): its rate and
/// what PostgreSQL saw.
#[derive(Debug, Deserialize)]
struct Busy {
    tps: Option<f64>,
    transactions: Option<f64>,
    #[serde(flatten)]
    internals: pgfleet_proto::workload::Internals,
}

/// A pgbench point's driving parameters (`dirty_fill`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Drive {
    script: Option<String>,
    clients: Option<u64>,
    duration_s: Option<f64>,
    warmup_s: Option<f64>,
}

/// The sampler's per-second `pg_stat` deltas, as far as `dirty_fill`
/// reads them.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PgStatSecond {
    /// Seconds since the sampler started.
    t: Option<f64>,
    io: IoCounters,
    database: DatabaseCounters,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct IoCounters {
    writes: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DatabaseCounters {
    xact_commit: Option<f64>,
}

/// Where a window's page writes per transaction went from none to about
/// one per read.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fill {
    /// Seconds from the sampler's start to the first sample at
    /// `DIRTY_AFTER` or more.
    second: f64,
    before: f64,
    after: f64,
}

/// None when the window is too short to tell (fewer than five samples or
/// no page-write counter); Some(None) when it stayed in one regime: no
/// sample at `DIRTY_AFTER`, or less than a tenth of the window on either
/// side of the first that is.
fn filled(window: &[&PgStatSecond]) -> Option<Option<Fill>> {
    if window.len() < 5 || window.iter().any(|s| s.io.writes.is_none()) {
        return None;
    }
    let per = |s: &[&PgStatSecond]| {
        let writes = s.iter().filter_map(|x| x.io.writes).sum::<f64>();
        let commits = s.iter().filter_map(|x| x.database.xact_commit).sum::<f64>();
        writes / commits.max(1.0)
    };
    let Some(i) = window.iter().position(|s| per(&[*s]) >= DIRTY_AFTER) else {
        return Some(None);
    };
    let (clean, dirty) = window.split_at(i);
    let tenth = window.len().div_ceil(10);
    let (before, after) = (per(clean), per(dirty));
    if clean.len() < tenth || dirty.len() < tenth || before >= CLEAN_BEFORE || after < DIRTY_AFTER {
        return Some(None);
    }
    Some(Some(Fill {
        second: dirty[0].t?,
        before,
        after,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// gp3's 70 s of BENCHMARKS.md's "I/O per transaction" (rounded):
    /// clean for 10 s, then a page written per read. With the warm-up
    /// ending at 10 s the window is one regime; without, two; a short
    /// window stays clean; nvme, dirty from the start, is one.
    #[test]
    fn a_window_in_which_shared_buffers_fill_with_dirty_pages_is_warned_about() {
        let samples = |cell: &str, clean_until: u32, secs: u32| -> Vec<(String, Json)> {
            (1..=secs)
                .map(|t| {
                    let (commits, writes) = if t <= clean_until { (165.0, 0.0) } else { (75.0, 130.0) };
                    (cell.to_string(), json!({"t": t as f64 + 0.01, "database": {"xact_commit": commits}, "io": {"writes": writes}}))
                })
                .collect()
        };
        let result = |cell: &str, class: &str, warmup: f64, duration: f64| {
            json!({"cell_id": cell, "instance_class": class, "workload": "pgbench",
                   "params": {"script": "random-update", "clients": 8, "warmup_s": warmup, "duration_s": duration}})
        };
        let mut pg_stat = samples("a1", 10, 70);
        pg_stat.extend(samples("a2", 10, 70));
        pg_stat.extend(samples("b", 10, 70));
        pg_stat.extend(samples("c", 10, 6));
        pg_stat.extend(samples("n", 0, 70));
        let results = [
            result("a1", "gp3", 0.0, 70.0),
            result("a2", "gp3", 0.0, 70.0),
            result("b", "gp3x", 10.0, 60.0),
            result("c", "gp3y", 0.0, 6.0),
            result("n", "nvme", 0.0, 70.0),
        ];
        let results = rows(&results);
        let w = dirty_fill(&results, &pg_stat);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("class `gp3` (random-update at 8 clients, 70 s measured)"),
            "{w:?}"
        );
        assert!(
            w[0].contains("in 2 of its 2 cells (about second 11)"),
            "{w:?}"
        );
        assert!(
            w[0].contains("0.00 pages out per transaction until then and 1.73 after"),
            "{w:?}"
        );
        // A server without the counter, or too few samples: nothing said.
        let none: Vec<(String, Json)> = samples("a1", 10, 70)
            .into_iter()
            .map(|(c, mut s)| {
                s["io"] = json!({});
                (c, s)
            })
            .collect();
        assert!(dirty_fill(&results[..1], &none).is_empty());
    }

    /// Run C of BENCHMARKS.md's "Both sides emulated" (rounded): gp3 read
    /// at its cap, nvme at a few % of its own.
    #[test]
    fn a_class_whose_read_cap_never_bound_beside_one_whose_did_is_warned_about() {
        let class = |profile: &str, read_iops: u64, emulated: bool| json!({"storage": {"profile": profile, "emulated": emulated, "caps": {"read_iops": read_iops}}});
        let point = |class: &str, tps: f64, tx: f64, blocks: f64| {
            json!({"instance_class": class, "metrics": {"tps": tps, "transactions": tx,
                   "blocks_read": blocks as u64, "page_read_ms_avg": 0.748, "wal_sync_ms_avg": 0.81,
                   "top_wait_events": [{"event": "LWLock:WALWrite", "share": 0.55},
                                       {"event": "IO:DataFileRead", "share": 0.2},
                                       {"event": "IO:WALSync", "share": 0.12}]}})
        };
        let env =
            classes(json!({"nvme": class("nvme", 33_542, true), "gp3": class("gp3", 375, true)}));
        let results = [
            point("nvme", 1573.0, 94_380.0, 150_000.0),
            point("nvme", 1500.0, 90_000.0, 90_000.0),
            point("gp3", 147.0, 8_820.0, 21_600.0),
        ];
        let results = rows(&results);
        let w = unbound(&env, &results);
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].contains("class `nvme`: its cells read at most 2500 blocks/s")
                && w[0].contains("7 % of the 33542 read IOPS")
                && w[0].contains("class `gp3`'s reads met its cap")
                && w[0].contains("0.748 ms")
                && w[0].contains("What held it back instead was WAL flushes: 67 %")
                && w[0].contains("LWLock:WALWrite 55 %, IO:WALSync 12 %")
                && w[0].contains("a WAL sync took 0.810 ms"),
            "{w:#?}"
        );
        // Waits spread thin name no bottleneck; CPU-bound ones name the CPU.
        let with_waits = |waits: Json| {
            let mut p = point("nvme", 1573.0, 94_380.0, 150_000.0);
            p["metrics"]["top_wait_events"] = waits;
            [p, point("gp3", 147.0, 8_820.0, 21_600.0)]
        };
        let thin = json!([{"event": "IO:DataFileRead", "share": 0.3}, {"event": "CPU:running", "share": 0.3}]);
        let w = unbound(&env, &rows(&with_waits(thin)));
        assert!(w.len() == 1 && !w[0].contains("held it back"), "{w:#?}");
        let cpu = json!([{"event": "CPU:running", "share": 0.7}, {"event": "LWLock:WALWrite", "share": 0.2}]);
        let w = unbound(&env, &rows(&with_waits(cpu)));
        assert!(
            w[0].contains("held it back instead was the CPU: 70 %") && !w[0].contains("fsync"),
            "{w:#?}"
        );
        // No class bound (both read from memory, say): nothing to say here.
        let idle = [
            point("nvme", 1573.0, 94_380.0, 10.0),
            point("gp3", 147.0, 8_820.0, 10.0),
        ];
        assert!(unbound(&env, &rows(&idle)).is_empty());
        // The host's own disk (not emulated) has no cap to bind.
        let host =
            classes(json!({"nvme": class("nvme", 33_542, false), "gp3": class("gp3", 375, true)}));
        assert!(unbound(&host, &results).is_empty());
    }

    fn rows(v: &[Json]) -> Vec<ResultRow> {
        v.iter()
            .map(|r| serde_json::from_value(r.clone()).unwrap())
            .collect()
    }

    fn classes(j: Json) -> Classes {
        serde_json::from_value(j).unwrap()
    }

    #[test]
    fn profiles_the_host_did_not_deliver_are_warned_about() {
        let class = |emulated: bool, delivered: Json| json!({"storage": {"profile": "custom", "emulated": emulated, "delivered": delivered}});
        let env = json!({
            "fine": class(true, json!({"read_iops": {"asked": 3000, "delivered": 2950.0},
                                       "write_mbps": {"asked": 125, "delivered": 131.0}})),
            "slow": class(true, json!({"read_iops": {"asked": 10_000_000, "delivered": 41_000.0}})),
            "loose": class(true, json!({"write_iops": {"asked": 300, "delivered": 900.0}})),
            "nofio": class(true, json!({"error": "`fio` was not found on the agent's host"})),
            "host": class(false, json!({"read_iops": {"asked": 3000, "delivered": 10.0}})),
        });
        let w = delivered(&classes(env));
        assert_eq!(w.len(), 3, "{w:#?}");
        // A profile with latency: each QD1 figure within ±20 % or warned,
        // slower or faster.
        let served = |read: f64, fsync: f64| {
            json!({"storage": {"profile": "gp3", "emulated": true,
            "caps": {"latency": {"read_us": 1000, "write_us": 1000}},
            "delivered": {"read_latency_ms": {"asked": 1.0, "delivered": read},
                          "write_latency_ms": {"asked": 1.0, "delivered": 1.1},
                          "fdatasync_latency_ms": {"asked": 1.0, "delivered": fsync}}}})
        };
        let l = delivered(&classes(json!({
            "close": served(1.06, 1.15),
            "slow": served(1.3, 1.1),
            "early": served(1.0, 0.7),
        })));
        assert_eq!(l.len(), 2, "{l:#?}");
        assert!(
            l.iter().any(|w| w.contains("class `slow`")
                && w.contains("an 8 KiB read in 1.00 ms")
                && w.contains("took 1.30 ms (130 %)")
                && w.contains("follow this host")),
            "{l:#?}"
        );
        assert!(
            l.iter().any(|w| w.contains("class `early`")
                && w.contains("a WAL-like write and fdatasync")
                && w.contains("answered early")),
            "{l:#?}"
        );
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
        let cell = |id: &str, d: Json| pgfleet_store::CellRow {
            point: Default::default(),
            estimate_seconds: None,
            estimate: None,
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
        let reused = |id: &str| {
            cell(
                id,
                json!({"fingerprint": "pgbench-s1-x", "how": "reused", "reused_from": "a"}),
            )
        };
        let r = datasets(&[reused("r2"), reused("r3")]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].contains("cells r2, r3 reused a cluster"), "{r:?}");
        let restored = |id: &str, method: &str| {
            cell(
                id,
                json!({"fingerprint": "pgbench-s1-x", "how": "restored", "cache": "rewarmed", "method": method}),
            )
        };
        assert!(datasets(&[restored("k1", "copy")]).is_empty());
        let k = datasets(&[restored("k1", "copy"), restored("k2", "reflink")]);
        assert_eq!(k.len(), 1, "{k:?}");
        assert!(k[0].contains("cell k2 restored data by reflink"), "{k:?}");
        let from_snapshot = |id: &str, hydrated: bool| {
            cell(
                id,
                json!({"fingerprint": "pgbench-s1-x", "how": "restored", "cache": "rewarmed",
                       "hydration": {"snapshot": "s", "mode": if hydrated { "read-all" } else { "none" },
                                     "hydrated": hydrated}}),
            )
        };
        assert!(datasets(&[from_snapshot("h1", true)]).is_empty());
        let l = datasets(&[from_snapshot("h1", true), from_snapshot("h2", false)]);
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("cell h2 restored data from a volume created from a snapshot")
                && l[0].contains("hydrate: none"),
            "{l:?}"
        );
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
               "storage": {"profile": "nvme"}, "measured": true})
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
        let cell = |id: &str, class: &str, start: &str, end: &str| pgfleet_store::CellRow {
            point: Default::default(),
            estimate_seconds: None,
            estimate: None,
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
        let one_host =
            classes(json!({"nvme": c(&["a", "b"], 1, "h"), "gp3": c(&["c", "d"], 1, "h")}));
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
        let two_hosts =
            classes(json!({"nvme": c(&["a", "b"], 1, "h1"), "gp3": c(&["c", "d"], 1, "h2")}));
        assert!(oversubscribed(&two_hosts, &crowded).is_empty());
    }

    /// A class's environment: its agents' registrations until a cell
    /// reports its cluster's own view; a multi-role cell's (one per role)
    /// and a cell's dataset are not the class's.
    #[test]
    fn a_class_environment_is_its_first_measured_cells() {
        let agent = |id: &str, class: &str| {
            pgfleet_store::AgentRow {
            agent_id: id.into(),
            instance_class: class.into(),
            info: serde_json::from_value(json!({"postgres_version": "15.18", "cores": 2, "memory_bytes": 1000, "hostname": "h",
                         "storage": {"profile": "gp3", "emulated": true, "caps": {"read_iops": 3000}}})).unwrap(),
            lost_at: None,
        }
        };
        let cell = |class: &str, env: Option<Json>| pgfleet_store::CellRow {
            point: Default::default(),
            estimate_seconds: None,
            estimate: None,
            cell_id: "c".into(),
            workload: "pgbench".into(),
            instance_class: class.into(),
            params: Json::Null,
            state: "succeeded".into(),
            agent_id: None,
            error: None,
            environment: env,
            started_at: None,
            finished_at: None,
        };
        let full = json!({"postgres": {"version": "15.18 (Debian)", "settings": {"fsync": "on"}},
                          "host": {"cores": 2, "memory_bytes": 1000, "hostname": "h"},
                          "storage": {"profile": "gp3", "emulated": true}, "dataset": {"how": "restored"}});
        let c = class_environments(
            &[agent("a1", "gp3"), agent("a2", "gp3"), agent("b1", "roles")],
            &[
                cell("gp3", None),
                cell(
                    "gp3",
                    Some(json!({"dataset": {"how": "already published"}})),
                ),
                cell("gp3", Some(full.clone())),
                cell(
                    "roles",
                    Some(json!({"publisher": full, "subscriber": full})),
                ),
            ],
        );
        let gp3 = &c["gp3"];
        assert!(gp3.measured);
        assert_eq!(gp3.agents, ["a1", "a2"]);
        assert_eq!(gp3.env.postgres.version, "15.18 (Debian)");
        assert_eq!(gp3.env.postgres.settings["fsync"], "on");
        assert_eq!(gp3.env.dataset, None);
        let roles = &c["roles"];
        assert!(!roles.measured, "{roles:?}");
        assert_eq!(roles.env.postgres.version, "15.18");
        assert_eq!(roles.env.storage.caps.read_iops, 3000);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["gp3"]["postgres"]["version"], "15.18 (Debian)");
        assert_eq!(json["roles"]["measured"], false);
    }

    #[test]
    fn a_class_without_a_measured_environment_is_not_compared_and_says_so() {
        // The registration's short version against a cell's full one: not
        // a difference, an unknown.
        let mut slow = class("15.18", "128MB", 96 << 20, true);
        slow["measured"] = json!(false);
        let mut fast = class("15.18 (Debian 15.18-0+deb12u1)", "128MB", 96 << 20, true);
        fast["measured"] = json!(true);
        let d = differences(&classes(json!({"fast": fast, "slow": slow})));
        assert!(d[0].differs.is_empty());
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
        let d = differences(&classes(same));
        assert!(d[0].differs.is_empty());
        assert!(warnings(&d, &[], &["b"]).is_empty());
        let other = json!({"a": class("15.18", "128MB", 96 << 20, true), "b": class("16.4", "1GB", 0, false)});
        let d = differences(&classes(other));
        let list: Vec<&str> = d[0].differs.iter().map(String::as_str).collect();
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
