//! Value and range checks after parsing. Every error carries the location of
//! the offending value (kept by `Spanned`), its field path, and what is
//! allowed.

use std::collections::{BTreeMap, BTreeSet};

use serde_saphyr::{Location, Spanned};

use pgfleet_proto::workload::{Field, Invalid, Params};

use super::{CleanupSpec, FleetEntry, Scenario, Unit, WorkloadEntry};

pub const STORAGE_PROFILES: &[&str] = &["nvme", "gp3", "custom"];

fn err<T>(
    at: Location,
    field: impl Into<String>,
    message: impl Into<String>,
) -> Result<T, Invalid> {
    Err(Invalid {
        at,
        field: field.into(),
        message: message.into(),
        value_line: 0,
    })
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 40
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// A scenario's name: a class's rules with upper case too (`TPC-B`): it
/// names no file or Kubernetes object, only runs, series and reports.
fn is_scenario_name(s: &str) -> bool {
    is_name(&s.to_ascii_lowercase())
}

/// Checks the fleet and every workload entry; returns each entry's cells
/// (id stem, parameters), defaults applied.
pub fn validate(s: &Scenario) -> Result<Vec<Vec<Unit>>, Invalid> {
    if !is_scenario_name(&s.name.value) {
        return err(
            s.name.referenced,
            "name",
            format!(
                "`{}` is not a valid name: use 1-40 of A-Z, a-z, 0-9, `-`, `_`, starting with a letter or digit",
                s.name.value
            ),
        );
    }
    if s.fleet.value.is_empty() {
        return err(
            s.fleet.referenced,
            "fleet",
            "the fleet is empty: list at least one instance class",
        );
    }
    let mut classes = BTreeSet::new();
    let counts: BTreeMap<String, u32> = s
        .fleet
        .value
        .iter()
        .map(|f| (f.name.value.clone(), f.count()))
        .collect();
    for (i, f) in s.fleet.value.iter().enumerate() {
        let at = |k: &str| format!("fleet[{i}].{k}");
        if !is_name(&f.name.value) {
            return err(
                f.name.referenced,
                at("name"),
                format!(
                    "`{}` is not a valid instance class name: use 1-40 of a-z, 0-9, `-`, `_`",
                    f.name.value
                ),
            );
        }
        if !classes.insert(f.name.value.clone()) {
            return err(
                f.name.referenced,
                at("name"),
                format!("instance class `{}` is listed twice", f.name.value),
            );
        }
        validate_fleet_entry(s, i, f)?;
    }
    validate_checks(s, &classes)?;
    if let Some(c) = &s.cleanup {
        validate_cleanup(c)?;
    }
    if s.workloads.value.is_empty() {
        return err(
            s.workloads.referenced,
            "workloads",
            "no workloads: list at least one",
        );
    }
    refuse_cells_over(s, MAX_CELLS)?;
    let entries = s
        .workloads
        .value
        .iter()
        .enumerate()
        .map(|(i, w)| validate_workload(i, w, s, &counts))
        .collect::<Result<Vec<_>, _>>()?;
    validate_settings(s, &entries)?;
    Ok(entries)
}

/// The most cells one scenario may plan (entries × classes × sweep points
/// × replicas). Counted before any cell is built, so a short text cannot
/// make the planner spend minutes and hundreds of megabytes (ten
/// kilobytes of YAML once planned 163,840 cells). `serve --max-cells`
/// lowers it for submissions; the at-scale suites plan a few hundred.
pub const MAX_CELLS: u64 = 5_000;

/// How many cells each entry plans, from counts alone (nothing built).
pub fn cells_per_entry(s: &Scenario) -> Vec<u64> {
    s.workloads
        .value
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let classes = match &w.on {
                Some(on) => on.len().max(1),
                None => s.fleet.value.len().max(1),
            } as u64;
            let points = s.sweeps.get(i).map_or(1, |p| p.points()).max(1) as u64;
            classes * points * u64::from(w.replicas().max(1))
        })
        .collect()
}

/// Refuses a scenario planning more than `max` cells, at the entry where
/// the count passes it.
pub fn refuse_cells_over(s: &Scenario, max: u64) -> Result<(), Invalid> {
    let mut total = 0u64;
    for (i, n) in cells_per_entry(s).into_iter().enumerate() {
        total = total.saturating_add(n);
        if total > max {
            let w = &s.workloads.value[i];
            let (at, field) = match &w.replicas {
                Some(r) => (r.referenced, format!("workloads[{i}].replicas")),
                None => (w.kind.referenced, format!("workloads[{i}]")),
            };
            return err(
                at,
                field,
                format!(
                    "the scenario plans more than {max} cells here ({n} for this entry: classes × sweep points × replicas; {total} so far): split it into several runs, or sweep fewer values"
                ),
            );
        }
    }
    Ok(())
}

/// One fleet entry's count, storage, instance, Kubernetes and price keys
/// (its name is checked with the others').
fn validate_fleet_entry(s: &Scenario, i: usize, f: &FleetEntry) -> Result<(), Invalid> {
    let at = |k: &str| format!("fleet[{i}].{k}");
    if let Some(v) = f.postgres.as_ref().and_then(|p| p.version.as_ref())
        && !pgfleet_proto::installs::SUPPORTED.contains(&v.value)
    {
        return err(
            v.referenced,
            at("postgres.version"),
            format!(
                "PostgreSQL {} is not a version pgfleet runs: allowed {} (a major version; `deploy/postgres/install.sh N` installs one)",
                v.value,
                pgfleet_proto::installs::SUPPORTED
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if let Some(c) = &f.count
        && !(1..=64).contains(&c.value)
    {
        return err(
            c.referenced,
            at("count"),
            format!("{} is out of range: allowed 1..=64", c.value),
        );
    }
    if let Some(st) = &f.storage {
        validate_storage(st, &at)?;
    }
    if let Some(inst) = &f.instance {
        if let Some(t) = &inst.instance_type
            && (t.value.is_empty()
                || t.value.len() > 64
                || !t
                    .value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return err(
                t.referenced,
                at("instance.type"),
                format!(
                    "`{}` is not an instance type: use letters, digits, `.`, `-`, `_` (e.g. m6id.4xlarge)",
                    t.value
                ),
            );
        }
        if let Some(m) = &inst.memory {
            let n = m
                .value
                .bytes()
                .or_else(|e| err(m.referenced, at("instance.memory"), e))?;
            if n < 64 << 20 {
                return err(
                    m.referenced,
                    at("instance.memory"),
                    format!(
                        "{n} bytes is out of range: allowed at least 64MiB (PostgreSQL needs room beside shared_buffers)"
                    ),
                );
            }
        }
        in_range(&inst.cpus, at("instance.cpus"), 1, 1024, "")?;
    }
    if let Some(k) = &f.kubernetes {
        validate_kubernetes(k, &at)?;
    }
    if let Some(p) = &f.price {
        validate_price(s, p, &at)?;
    }
    Ok(())
}

/// A fleet entry's `storage:` (profile, caps, emulation, Kubernetes volume).
fn validate_storage(st: &super::StorageSpec, at: &dyn Fn(&str) -> String) -> Result<(), Invalid> {
    one_of(
        &st.profile,
        at("storage.profile"),
        STORAGE_PROFILES,
        "storage profile",
    )?;
    let caps = [
        ("read_iops", &st.read_iops),
        ("write_iops", &st.write_iops),
        ("read_mbps", &st.read_mbps),
        ("write_mbps", &st.write_mbps),
    ];
    for (k, v) in caps {
        if let Some(v) = v {
            if st.profile.value != "custom" {
                return err(
                    v.referenced,
                    at(&format!("storage.{k}")),
                    format!(
                        "caps apply to profile `custom` only; `{}` has fixed caps",
                        st.profile.value
                    ),
                );
            }
            in_range(
                &Some(v.clone()),
                at(&format!("storage.{k}")),
                1,
                10_000_000,
                "",
            )?;
        }
    }
    if let Some(sc) = &st.storage_class
        && !is_dns_subdomain(&sc.value)
    {
        return err(
            sc.referenced,
            at("storage.storage_class"),
            format!(
                "`{}` is not a StorageClass name: use lower-case letters, digits, `-` and `.` (e.g. gp3)",
                sc.value
            ),
        );
    }
    if let Some(h) = &st.hydrate
        && !pgfleet_proto::dataset::HYDRATE_MODES.contains(&h.value.as_str())
    {
        return err(
            h.referenced,
            at("storage.hydrate"),
            format!(
                "unknown hydrate mode `{}`: use `read-all` (read every block of a snapshot's datasets before measuring) or `none`",
                h.value
            ),
        );
    }
    if let Some(sz) = &st.size {
        let n = sz
            .value
            .bytes()
            .or_else(|e| err(sz.referenced, at("storage.size"), e))?;
        if n < 1 << 30 {
            return err(
                sz.referenced,
                at("storage.size"),
                format!("{n} bytes is out of range: allowed at least 1GiB"),
            );
        }
    }
    for (key, v, lo, hi) in [
        (
            "iops",
            &st.iops,
            super::GP3_BASELINE_IOPS,
            super::GP3_MAX_IOPS,
        ),
        (
            "mbps",
            &st.mbps,
            super::GP3_BASELINE_MIBPS,
            super::GP3_MAX_MIBPS,
        ),
    ] {
        if let Some(x) = v {
            if st.profile.value != "gp3" {
                return err(
                    x.referenced,
                    at(&format!("storage.{key}")),
                    "provisioned IOPS and throughput are profile `gp3`'s (for other caps use `profile: custom` with read_iops, write_iops, read_mbps, write_mbps)",
                );
            }
            in_range(&Some(x.clone()), at(&format!("storage.{key}")), lo, hi, "")?;
        }
    }
    if let Some(t) = &st.instance_store {
        if st.profile.value != "nvme" {
            return err(
                t.referenced,
                at("storage.instance_store"),
                "an instance store is profile `nvme`'s: use `profile: nvme`",
            );
        }
        if super::instance_store(&t.value).is_none() {
            let known: Vec<&str> = super::INSTANCE_STORE.iter().map(|i| i.0).collect();
            return err(
                t.referenced,
                at("storage.instance_store"),
                format!(
                    "no published figures for `{}`: allowed {}",
                    t.value,
                    known.join(", ")
                ),
            );
        }
    }
    if let Some(x) = &st.scale {
        let scalable = st.profile.value == "gp3"
            || (st.profile.value == "nvme" && st.instance_store.is_some());
        if !scalable {
            return err(
                x.referenced,
                at("storage.scale"),
                "scale applies to a published profile: `gp3`, or `nvme` with `instance_store` (a `custom` profile gives its caps as they are)",
            );
        }
        if !(x.value > 0.0 && x.value <= 1.0) {
            return err(
                x.referenced,
                at("storage.scale"),
                format!(
                    "{} is out of range: allowed above 0, up to 1 (the instance's share of the device's IOPS)",
                    x.value
                ),
            );
        }
    }
    if st.profile.value == "custom" && caps.iter().all(|(_, v)| v.is_none()) {
        return err(
            st.profile.referenced,
            at("storage.profile"),
            "profile `custom` needs at least one of read_iops, write_iops, read_mbps, write_mbps",
        );
    }
    Ok(())
}

/// `cleanup:`: what happens to a Kubernetes run's objects at its end.
fn validate_cleanup(c: &CleanupSpec) -> Result<(), Invalid> {
    for (k, v) in [("on_success", &c.on_success), ("on_failure", &c.on_failure)] {
        if let Some(v) = v {
            one_of(v, format!("cleanup.{k}"), &["delete", "keep"], "cleanup")?;
        }
    }
    if let Some(t) = &c.ttl {
        match crate::parse_ttl(&t.value) {
            Some(d) if (60..=30 * 86400).contains(&d.as_secs()) => {}
            Some(_) => {
                return err(
                    t.referenced,
                    "cleanup.ttl",
                    format!("ttl `{}` is out of range: allowed 1m to 30d", t.value),
                );
            }
            None => {
                return err(
                    t.referenced,
                    "cleanup.ttl",
                    format!(
                        "`{}` is not a duration: write a whole number and s, m, h or d, e.g. 24h",
                        t.value
                    ),
                );
            }
        }
    }
    Ok(())
}

/// A class's PostgreSQL settings: names, values, and the ones pgfleet
/// refuses (`pgfleet_proto::settings`: reserved ones always; those that act
/// on the agent's host unless every workload on the class has allow_shell).
fn validate_settings(s: &Scenario, entries: &[Vec<Unit>]) -> Result<(), Invalid> {
    for (i, f) in s.fleet.value.iter().enumerate() {
        let Some(pg) = &f.postgres else { continue };
        let class = &f.name.value;
        let runs_here = |w: &WorkloadEntry| {
            w.on.as_ref()
                .is_none_or(|on| on.iter().any(|c| &c.value == class))
                || w.roles
                    .as_ref()
                    .is_some_and(|r| r.values().any(|c| &c.value == class))
        };
        let allow_shell = s
            .workloads
            .value
            .iter()
            .zip(entries)
            .filter(|(w, _)| runs_here(w))
            .all(|(_, cells)| cells.iter().all(|u| u.params.allow_shell()));
        for (k, v) in &pg.settings {
            pgfleet_proto::settings::check(k, &v.value.to_string(), allow_shell).or_else(
                |why| {
                    err(
                        v.referenced,
                        format!("fleet[{i}].postgres.settings.{k}"),
                        why,
                    )
                },
            )?;
        }
    }
    Ok(())
}

/// A DNS subdomain name, as Kubernetes object names are.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A label key (`[prefix/]name`) or a label value (`name`, may be empty).
fn is_label(s: &str, key: bool) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) if key => (Some(p), n),
        _ => (None, s),
    };
    let name_ok = name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && (name.is_empty()
            || (name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name.ends_with(|c: char| c.is_ascii_alphanumeric())));
    name_ok && (!key || !name.is_empty()) && prefix.is_none_or(is_dns_subdomain)
}

fn validate_kubernetes(k: &super::KubeSpec, at: &dyn Fn(&str) -> String) -> Result<(), Invalid> {
    if let Some(r) = &k.requests {
        if let Some(c) = &r.cpu
            && !(c.value >= 0.001 && c.value <= 1024.0)
        {
            return err(
                c.referenced,
                at("kubernetes.requests.cpu"),
                format!("{} is out of range: allowed 0.001..=1024 CPUs", c.value),
            );
        }
        if let Some(m) = &r.memory {
            let n = m
                .value
                .bytes()
                .or_else(|e| err(m.referenced, at("kubernetes.requests.memory"), e))?;
            if n < 64 << 20 {
                return err(
                    m.referenced,
                    at("kubernetes.requests.memory"),
                    format!("{n} bytes is out of range: allowed at least 64MiB"),
                );
            }
        }
    }
    for (j, t) in k.tolerations.iter().enumerate() {
        let field = |f: &str| at(&format!("kubernetes.tolerations[{j}].{f}"));
        if let Some(key) = &t.key
            && !is_label(&key.value, true)
        {
            return err(
                key.referenced,
                field("key"),
                format!("`{}` is not a taint key", key.value),
            );
        }
        if let Some(op) = &t.operator {
            one_of(
                op,
                field("operator"),
                &["Equal", "Exists"],
                "toleration operator",
            )?;
            if op.value == "Exists"
                && let Some(v) = &t.value
            {
                return err(
                    v.referenced,
                    field("value"),
                    "operator `Exists` takes no value: remove it, or use `Equal`",
                );
            }
        }
        if let Some(v) = &t.value
            && !is_label(&v.value, false)
        {
            return err(
                v.referenced,
                field("value"),
                format!("`{}` is not a taint value", v.value),
            );
        }
        if let Some(e) = &t.effect {
            one_of(
                e,
                field("effect"),
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
                "taint effect",
            )?;
        }
    }
    for (key, v) in &k.node_selector {
        let field = at(&format!("kubernetes.node_selector.{key}"));
        if !is_label(key, true) {
            return err(
                v.referenced,
                field,
                format!("`{key}` is not a node label key"),
            );
        }
        if !is_label(&v.value, false) {
            return err(
                v.referenced,
                field,
                format!("`{}` is not a label value", v.value),
            );
        }
    }
    Ok(())
}

/// The workload entries a check reads (its `workload:`, else all) and the
/// check's metric among those they compare between classes.
fn checked_entries<'s>(
    s: &'s Scenario,
    workload: Option<&Spanned<usize>>,
    metric: &Spanned<String>,
    base: &str,
    at: &dyn Fn(&str) -> String,
) -> Result<Vec<(usize, &'s WorkloadEntry)>, Invalid> {
    // The metrics the selected workload entries compare between classes.
    let entries: Vec<(usize, &WorkloadEntry)> = match workload {
        Some(w) => match s.workloads.value.get(w.value) {
            Some(e) => vec![(w.value, e)],
            None => {
                return err(
                    w.referenced,
                    at(&format!("{base}.workload")),
                    format!(
                        "{} is out of range: the scenario has {} workload entries (0-based)",
                        w.value,
                        s.workloads.value.len()
                    ),
                );
            }
        },
        None => s.workloads.value.iter().enumerate().collect(),
    };
    let mut allowed: Vec<&str> = Vec::new();
    for (_, e) in &entries {
        for m in pgfleet_proto::workload::info(&e.kind.value)
            .map(|k| k.compared)
            .unwrap_or(&[])
        {
            if !allowed.contains(&m.name) {
                allowed.push(m.name);
            }
        }
    }
    if !allowed.contains(&metric.value.as_str()) {
        let field = match base {
            "metric" => "metric.name",
            "history" => "history.metric",
            _ => "ratio.metric",
        };
        return err(
            metric.referenced,
            at(field),
            format!(
                "unknown metric `{}`: the workloads checked compare {}",
                metric.value,
                allowed.join(", ")
            ),
        );
    }
    Ok(entries)
}

/// The scenario's `checks:`: unique names, the figure each reads (metric,
/// class, workload entry, `at`) and its bounds.
fn validate_checks(s: &Scenario, classes: &BTreeSet<String>) -> Result<(), Invalid> {
    let mut names = BTreeSet::new();
    for (i, c) in s.checks.iter().enumerate() {
        let at = |k: &str| format!("checks[{i}].{k}");
        if c.name.value.trim().is_empty() || c.name.value.len() > 200 {
            return err(
                c.name.referenced,
                at("name"),
                "a check needs a name of 1-200 characters",
            );
        }
        if !names.insert(c.name.value.clone()) {
            return err(
                c.name.referenced,
                at("name"),
                format!("check `{}` is listed twice", c.name.value),
            );
        }
        let (metric, class, workload, base) = match (&c.metric, &c.ratio, &c.history) {
            (Some(m), None, None) => (&m.name, &m.class, &m.workload, "metric"),
            (None, None, Some(h)) => {
                validate_history_check(c, h, &at)?;
                (&h.metric, &h.class, &h.workload, "history")
            }
            (None, Some(r), None) => {
                validate_ratio_check(s, r, classes, &at)?;
                (&r.metric, &r.class, &r.workload, "ratio")
            }
            _ => {
                return err(
                    c.name.referenced,
                    at("name"),
                    "a check has one of `metric: {name, class}`, `ratio: {metric, class, baseline}` or `history: {metric, class, max_drop}`",
                );
            }
        };
        known_class(class, at(&format!("{base}.class")), classes)?;
        let entries = checked_entries(s, workload.as_ref(), metric, base, &at)?;
        for (key, v) in &c.at {
            check_at(s, &entries, key, v, at(&format!("at.{key}")))?;
        }
        if c.min.is_none() && c.max.is_none() && c.history.is_none() {
            return err(
                c.name.referenced,
                at("name"),
                "a check needs `min`, `max` or both",
            );
        }
        for b in [&c.min, &c.max].into_iter().flatten() {
            if !b.value.is_finite() {
                return err(b.referenced, at("max"), "a bound must be a finite number");
            }
        }
        if let (Some(lo), Some(hi)) = (&c.min, &c.max)
            && lo.value > hi.value
        {
            return err(
                hi.referenced,
                at("max"),
                format!("max {} is below min {}", hi.value, lo.value),
            );
        }
        in_range(&c.confidence, at("confidence"), 0.5, 0.999, "")?;
        if let Some(x) = &c.inconclusive {
            one_of(
                x,
                at("inconclusive"),
                &["fail", "pass"],
                "inconclusive outcome",
            )?;
        }
    }
    Ok(())
}

/// A history check: its allowed drop, window, labels and settings that
/// may vary; its bound is `max_drop`, not min or max.
fn validate_history_check(
    c: &crate::CheckSpec,
    h: &crate::HistoryRef,
    at: &dyn Fn(&str) -> String,
) -> Result<(), Invalid> {
    if crate::parse_percent(&h.max_drop.value).is_none() {
        return err(
            h.max_drop.referenced,
            at("history.max_drop"),
            format!(
                "`{}` is not a percentage: write how much worse the run may be than the earlier runs, e.g. `5%` (0 to 99.9)",
                h.max_drop.value
            ),
        );
    }
    if let Some(w) = &h.window
        && !(3..=1000).contains(&w.value)
    {
        return err(
            w.referenced,
            at("history.window"),
            format!("{} earlier runs: a window is 3 to 1000 runs", w.value),
        );
    }
    for l in &h.same_labels {
        if let Err(e) = crate::labels::parse_one(&format!("{}=", l.value)) {
            return err(l.referenced, at("history.same_labels"), e);
        }
    }
    for v in &h.vary {
        let name_ok = !v.value.is_empty()
            && v.value.len() <= 63
            && v.value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
        if !name_ok {
            return err(
                v.referenced,
                at("history.vary"),
                format!(
                    "`{}` is not a PostgreSQL setting name (e.g. synchronous_commit)",
                    v.value
                ),
            );
        }
    }
    if let Some(b) = c.min.as_ref().or(c.max.as_ref()) {
        return err(
            b.referenced,
            at(if c.min.is_some() { "min" } else { "max" }),
            "a history check's bound is its `max_drop`: leave out min and max",
        );
    }
    Ok(())
}

/// A ratio check: a baseline class, a baseline entry of the same kind, or
/// both.
fn validate_ratio_check(
    s: &Scenario,
    r: &crate::RatioRef,
    classes: &BTreeSet<String>,
    at: &dyn Fn(&str) -> String,
) -> Result<(), Invalid> {
    match (&r.baseline, &r.baseline_workload) {
        (None, None) => {
            return err(
                r.class.referenced,
                at("ratio"),
                "a ratio needs `baseline` (a class) or `baseline_workload` (an entry of workloads), or both",
            );
        }
        (Some(b), None) if b.value == r.class.value => {
            return err(
                b.referenced,
                at("ratio.baseline"),
                "the baseline must be another class than `class` (or give `baseline_workload`)",
            );
        }
        _ => {}
    }
    if let Some(b) = &r.baseline {
        known_class(b, at("ratio.baseline"), classes)?;
    }
    if let Some(bw) = &r.baseline_workload {
        let Some(w) = &r.workload else {
            return err(
                bw.referenced,
                at("ratio.baseline_workload"),
                "`baseline_workload` compares with `workload`: give both (indexes in workloads, from 0)",
            );
        };
        let kind = |i: usize| s.workloads.value.get(i).map(|e| e.kind.value.clone());
        match (kind(w.value), kind(bw.value)) {
            (Some(a), Some(b)) if a == b && w.value != bw.value => {}
            (Some(_), Some(_)) if w.value == bw.value => {
                return err(
                    bw.referenced,
                    at("ratio.baseline_workload"),
                    "the baseline entry must be another entry than `workload`",
                );
            }
            (Some(a), Some(b)) => {
                return err(
                    bw.referenced,
                    at("ratio.baseline_workload"),
                    format!(
                        "entry {} is `{b}`, entry {} is `{a}`: compare entries of one kind",
                        bw.value, w.value
                    ),
                );
            }
            _ => {
                return err(
                    bw.referenced,
                    at("ratio.baseline_workload"),
                    format!(
                        "{} is out of range: the scenario has {} workload entries (0-based)",
                        bw.value,
                        s.workloads.value.len()
                    ),
                );
            }
        }
    }
    Ok(())
}

fn validate_price(
    s: &Scenario,
    p: &crate::PriceSpec,
    at: &dyn Fn(&str) -> String,
) -> Result<(), Invalid> {
    let all = [
        ("instance_hour", &p.instance_hour),
        ("storage_gb_month", &p.storage_gb_month),
        ("storage_gb", &p.storage_gb),
        ("iops_month", &p.iops_month),
        ("iops", &p.iops),
        ("throughput_mbps_month", &p.throughput_mbps_month),
        ("throughput_mbps", &p.throughput_mbps),
    ];
    for (key, v) in all {
        if let Some(x) = v
            && !(x.value.is_finite() && x.value >= 0.0)
        {
            return err(
                x.referenced,
                at(&format!("price.{key}")),
                format!("{} is not a price or quantity: use a number >= 0", x.value),
            );
        }
    }
    // A monthly price needs the quantity it is billed for, and back.
    for (rate, qty) in [(1, 2), (3, 4), (5, 6)] {
        let ((rk, rv), (qk, qv)) = (all[rate], all[qty]);
        match (rv, qv) {
            (Some(x), None) => {
                return err(
                    x.referenced,
                    at(&format!("price.{rk}")),
                    format!("`{rk}` is per unit: give `{qk}`, the quantity billed"),
                );
            }
            (None, Some(x)) => {
                return err(
                    x.referenced,
                    at(&format!("price.{qk}")),
                    format!("`{qk}` needs its price: give `{rk}`"),
                );
            }
            _ => {}
        }
    }
    match &s.currency {
        None => {
            let first = all.iter().find_map(|(_, v)| v.as_ref());
            let at_ = first.map_or(s.name.referenced, |x| x.referenced);
            err(
                at_,
                "currency".to_string(),
                "prices need the currency they are in: add `currency: USD` (or EUR, ...) at the scenario's top level",
            )
        }
        Some(c) if c.value.trim().is_empty() || c.value.len() > 8 => err(
            c.referenced,
            "currency".to_string(),
            "a currency is a short name such as USD or EUR (1-8 characters)",
        ),
        _ => Ok(()),
    }
}

fn known_class(
    c: &Spanned<String>,
    field: String,
    classes: &BTreeSet<String>,
) -> Result<(), Invalid> {
    if classes.contains(&c.value) {
        return Ok(());
    }
    err(
        c.referenced,
        field,
        format!(
            "`{}` is not an instance class of the fleet: allowed {}",
            c.value,
            classes.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    )
}

fn one_of(v: &Spanned<String>, field: String, allowed: &[&str], what: &str) -> Result<(), Invalid> {
    if allowed.contains(&v.value.as_str()) {
        Ok(())
    } else {
        err(
            v.referenced,
            field,
            format!(
                "unknown {what} `{}`: allowed {}",
                v.value,
                allowed.join(", ")
            ),
        )
    }
}

/// `v` (when given) must lie in `lo..=hi`.
fn in_range<T: PartialOrd + std::fmt::Display + Copy>(
    v: &Option<Spanned<T>>,
    field: String,
    lo: T,
    hi: T,
    unit: &str,
) -> Result<(), Invalid> {
    match v {
        Some(x) if !(x.value >= lo && x.value <= hi) => err(
            x.referenced,
            field,
            format!("{} is out of range: allowed {lo}..={hi}{unit}", x.value),
        ),
        _ => Ok(()),
    }
}

/// A check's `at: {key: value}` names a point of the sweep of one of the
/// entries it checks.
fn check_at(
    s: &Scenario,
    entries: &[(usize, &WorkloadEntry)],
    key: &str,
    v: &Spanned<super::SettingValue>,
    field: String,
) -> Result<(), Invalid> {
    use super::sweep::{same_value, value_json};
    let want = value_json(&v.value.to_string());
    let axes: Vec<(usize, &super::sweep::Axis)> = entries
        .iter()
        .filter_map(|(i, _)| {
            let a = s.sweeps.get(*i)?.axes.iter().find(|a| a.key == key)?;
            Some((*i, a))
        })
        .collect();
    if axes.is_empty() {
        let swept: BTreeSet<&str> = entries
            .iter()
            .filter_map(|(i, _)| s.sweeps.get(*i))
            .flat_map(|w| w.axes.iter().map(|a| a.key.as_str()))
            .collect();
        return err(
            v.referenced,
            field,
            if swept.is_empty() {
                format!(
                    "`{key}` is not swept: `at` picks a point of a sweep, and the entries checked sweep nothing (give a key a list, e.g. `clients: [1, 4, 16]`)"
                )
            } else {
                format!(
                    "`{key}` is not swept by the entries checked: they sweep {}",
                    swept.into_iter().collect::<Vec<_>>().join(", ")
                )
            },
        );
    }
    if !axes
        .iter()
        .any(|(_, a)| a.values.iter().any(|x| same_value(&value_json(x), &want)))
    {
        let (i, a) = axes[0];
        return err(
            v.referenced,
            field,
            format!(
                "{} is not a point of the sweep: workloads[{i}] sweeps {key} over {}",
                v.value,
                a.values.join(", ")
            ),
        );
    }
    Ok(())
}

/// The keys every kind takes, then the kind's own checks and cells: each
/// point of the entry's sweep is checked by the kind as an entry of its own.
fn validate_workload(
    i: usize,
    w: &WorkloadEntry,
    s: &Scenario,
    counts: &BTreeMap<String, u32>,
) -> Result<Vec<Unit>, Invalid> {
    let classes: BTreeSet<String> = counts.keys().cloned().collect();
    let f = Field::new(format!("workloads[{i}]"), w.kind.referenced);
    if let Some(on) = &w.on {
        for (j, c) in on.iter().enumerate() {
            if !classes.contains(&c.value) {
                return err(
                    c.referenced,
                    f.at(&format!("on[{j}]")),
                    format!(
                        "`{}` is not an instance class of the fleet: allowed {}",
                        c.value,
                        classes.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                );
            }
        }
    }
    in_range(&w.replicas, f.at("replicas"), 1, 64, "")?;
    let sweep = s.sweeps.get(i).cloned().unwrap_or_default();
    let mut units = Vec::new();
    let points = match s.points.get(i) {
        Some(p) if !p.is_empty() => p.as_slice(),
        _ => std::slice::from_ref(w),
    };
    for (n, point) in points.iter().enumerate() {
        let planned = point.spec.plan(&f).map_err(|mut e| {
            if !sweep.axes.is_empty() {
                let at: Vec<String> = sweep
                    .at(n)
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                e.message = format!("{} (at the sweep's point {})", e.message, at.join(", "));
            }
            e
        })?;
        for (stem, params) in planned {
            units.push(Unit {
                stem: format!("{stem}{}", sweep.id_suffix(n)),
                params,
                point: sweep.at(n),
            });
        }
    }
    let Some(Unit { params, .. }) = units.first() else {
        return Ok(units);
    };
    check_roles(&f, w, params, counts)?;
    check_fault_storage(&f, w, s)?;
    if let Some(r) = w.reuse_cluster.as_ref().filter(|r| r.value) {
        if params.reset().is_none() {
            return err(
                r.referenced,
                f.at("reuse_cluster"),
                format!(
                    "{} declares no reset that returns a used cluster to its dataset (pgbench does): remove `reuse_cluster`",
                    w.kind.value
                ),
            );
        }
        if w.data.as_ref().is_some_and(|d| d.value == "fresh") {
            return err(
                r.referenced,
                f.at("reuse_cluster"),
                "`reuse_cluster: true` reuses a dataset's cluster, and `data: fresh` loads every cell's own: choose one".to_string(),
            );
        }
    }
    if let Some(d) = &w.data {
        use pgfleet_proto::dataset::Mode;
        if !Mode::NAMES.contains(&d.value.as_str()) {
            return err(
                d.referenced,
                f.at("data"),
                format!(
                    "`{}` is not a data mode: allowed {} (reuse: restore the data from the agent's dataset store when a cell published it; fresh: load it every time)",
                    d.value,
                    Mode::NAMES.join(", ")
                ),
            );
        }
        if params.dataset().is_none() {
            return err(
                d.referenced,
                f.at("data"),
                format!(
                    "{} has no dataset to reuse (its load is its measurement): remove `data`",
                    w.kind.value
                ),
            );
        }
    }
    Ok(units)
}

/// A `stall` or `degrade` fault changes the emulated caps of the class it
/// runs on: every class the entry runs on must have them.
fn check_fault_storage(f: &Field, w: &WorkloadEntry, s: &Scenario) -> Result<(), Invalid> {
    let runs_on = |c: &FleetEntry| {
        w.on.as_ref()
            .is_none_or(|on| on.iter().any(|o| o.value == c.name.value))
    };
    for (j, kind) in w.spec.fault_kinds() {
        if !matches!(kind.value.as_str(), "stall" | "degrade") {
            continue;
        }
        if let Some(c) = s
            .fleet
            .value
            .iter()
            .find(|c| runs_on(c) && !(c.emulate() && c.caps().is_capped()))
        {
            let why = if c.emulate() {
                format!(
                    "its storage profile `{}` has no caps (nvme without instance_store is the disk as is)",
                    c.profile()
                )
            } else {
                "its storage has `emulate: false`".to_string()
            };
            return err(
                kind.referenced,
                f.at(&format!("faults[{j}].kind")),
                format!(
                    "a {} changes the class's emulated I/O caps, and class `{}` has none: {why}; give it capped storage (gp3, custom, nvme with instance_store) or run the entry `on:` classes that have it",
                    kind.value, c.name.value
                ),
            );
        }
    }
    for (j, spec) in w.spec.faults() {
        let Some(l) = &spec.latency_ms else {
            continue;
        };
        if let Some(c) = s
            .fleet
            .value
            .iter()
            .find(|c| runs_on(c) && c.caps().latency.is_zero())
        {
            return err(
                l.referenced,
                f.at(&format!("faults[{j}].latency_ms")),
                format!(
                    "latency_ms changes the per-I/O latency of a volume the agent serves (profile gp3), and class `{}` has storage `{}` without one: run the entry `on:` gp3 classes, or degrade its iops or mbps",
                    c.name.value,
                    c.profile()
                ),
            );
        }
    }
    Ok(())
}

/// A multi-role cell needs one agent per role at once: `roles:` must name
/// the kind's roles and fleet classes, and every class the entry runs on
/// must have enough agents for the roles placed on it.
fn check_roles(
    f: &Field,
    w: &WorkloadEntry,
    params: &Params,
    counts: &BTreeMap<String, u32>,
) -> Result<(), Invalid> {
    let roles = params.roles();
    let named: Vec<&str> = roles.iter().copied().filter(|r| !r.is_empty()).collect();
    for (role, class) in w.roles.iter().flatten() {
        let field = f.at(&format!("roles.{role}"));
        if !named.contains(&role.as_str()) {
            let allowed = if named.is_empty() {
                format!("kind {} has one role, on the cell's class", w.kind.value)
            } else {
                format!("allowed {}", named.join(", "))
            };
            return err(
                class.referenced,
                field,
                format!("unknown role `{role}`: {allowed}"),
            );
        }
        if !counts.contains_key(&class.value) {
            return err(
                class.referenced,
                field,
                format!(
                    "`{}` is not an instance class of the fleet: allowed {}",
                    class.value,
                    counts.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
    for cell_class in counts.keys().filter(|c| {
        w.on.as_ref()
            .is_none_or(|on| on.iter().any(|x| &x.value == *c))
    }) {
        let mut need: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for role in roles {
            need.entry(role_class(w, role, cell_class))
                .or_default()
                .push(role);
        }
        for (class, rs) in need {
            let have = counts.get(class).copied().unwrap_or(0);
            if (rs.len() as u32) > have {
                return err(
                    w.kind.referenced,
                    f.at("kind"),
                    format!(
                        "a {} cell needs {} agents of class `{class}` at once (roles {}), but the fleet has {have}: raise that class's count, or place a role on another class with `roles: {{{}: <class>}}`",
                        w.kind.value,
                        rs.len(),
                        rs.join(", "),
                        rs.last().copied().unwrap_or_default()
                    ),
                );
            }
        }
    }
    Ok(())
}

/// The class a role of a cell of `cell_class` runs on.
pub fn role_class<'a>(w: &'a WorkloadEntry, role: &str, cell_class: &'a str) -> &'a str {
    w.roles
        .as_ref()
        .and_then(|r| r.get(role))
        .map(|c| c.value.as_str())
        .unwrap_or(cell_class)
}
