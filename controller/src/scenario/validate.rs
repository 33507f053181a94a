//! Value and range checks after parsing. Every error carries the location of
//! the offending value (kept by `Spanned`), its field path, and what is
//! allowed.

use std::collections::BTreeSet;

use serde_saphyr::{Location, Spanned};

use super::{OffsetSpec, Scenario, WorkloadSpec};

pub const TOAST_STORAGE_MODES: &[&str] = &["external", "pglz", "lz4"];
pub const TOAST_DATASETS: &[&str] = &["abcd", "mixed", "incompressible"];
pub const WORKLOAD_KINDS: &[&str] = &["toast-slice", "pgbench-init", "pgbench"];
pub const STORAGE_PROFILES: &[&str] = &["nvme", "gp3", "custom"];
/// PostgreSQL's bytea limit.
const MAX_VALUE_BYTES: u64 = 1 << 30;

pub type Invalid = (Location, String, String);

fn err<T>(
    loc: Location,
    field: impl Into<String>,
    message: impl Into<String>,
) -> Result<T, Invalid> {
    Err((loc, field.into(), message.into()))
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 40
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

pub fn validate(s: &Scenario) -> Result<(), Invalid> {
    if !is_name(&s.name.value) {
        return err(
            s.name.referenced,
            "name",
            format!(
                "`{}` is not a valid name: use 1-40 of a-z, 0-9, `-`, `_`, starting with a letter or digit",
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
            if st.profile.value == "custom" && caps.iter().all(|(_, v)| v.is_none()) {
                return err(
                    st.profile.referenced,
                    at("storage.profile"),
                    "profile `custom` needs at least one of read_iops, write_iops, read_mbps, write_mbps",
                );
            }
        }
        if let Some(pg) = &f.postgres {
            for (k, v) in &pg.settings {
                let field = at(&format!("postgres.settings.{k}"));
                if !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                    || k.is_empty()
                {
                    return err(
                        v.referenced,
                        field,
                        format!("`{k}` is not a PostgreSQL setting name"),
                    );
                }
                if pgfleet_proto::RESERVED_SETTINGS.contains(&k.as_str()) {
                    return err(
                        v.referenced,
                        field,
                        format!("`{k}` is managed by pgfleet and cannot be set"),
                    );
                }
            }
        }
    }
    if s.workloads.value.is_empty() {
        return err(
            s.workloads.referenced,
            "workloads",
            "no workloads: list at least one",
        );
    }
    for (i, w) in s.workloads.value.iter().enumerate() {
        validate_workload(i, w, &classes)?;
    }
    Ok(())
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

/// The keys each workload kind takes (besides `kind`, `on`, `replicas`).
pub const KIND_KEYS: &[(&str, &[&str])] = &[
    (
        "toast-slice",
        &[
            "storage_modes",
            "datasets",
            "value_bytes",
            "offsets",
            "slice_bytes",
            "duration_s",
            "repeats",
            "warmup_s",
        ],
    ),
    (
        "pgbench-init",
        &["scale", "fillfactor", "partitions", "load_connections"],
    ),
    (
        "pgbench",
        &[
            "scale",
            "fillfactor",
            "partitions",
            "load_connections",
            "script",
            "script_text",
            "clients",
            "threads",
            "duration_s",
            "transactions",
            "warmup_s",
            "rate",
            "latency_limit_ms",
            "max_tries",
            "defines",
            "seed",
            "driver",
        ],
    ),
];

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

fn validate_workload(
    i: usize,
    w: &WorkloadSpec,
    classes: &BTreeSet<String>,
) -> Result<(), Invalid> {
    let at = |k: &str| format!("workloads[{i}].{k}");
    one_of(&w.kind, at("kind"), WORKLOAD_KINDS, "workload kind")?;
    if let Some(on) = &w.on {
        for (j, c) in on.iter().enumerate() {
            if !classes.contains(&c.value) {
                return err(
                    c.referenced,
                    at(&format!("on[{j}]")),
                    format!(
                        "`{}` is not an instance class of the fleet: allowed {}",
                        c.value,
                        classes.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                );
            }
        }
    }
    let allowed = KIND_KEYS
        .iter()
        .find(|(k, _)| *k == w.kind.value)
        .map(|(_, keys)| *keys)
        .unwrap_or(&[]);
    for (key, loc) in w.keys() {
        if key != "replicas" && !allowed.contains(&key) {
            return err(
                loc,
                at(key),
                format!(
                    "`{key}` does not apply to kind {}: its keys are {}",
                    w.kind.value,
                    allowed.join(", ")
                ),
            );
        }
    }
    in_range(&w.replicas, at("replicas"), 1, 64, "")?;
    in_range(&w.duration_s, at("duration_s"), 0.001, 86_400.0, " seconds")?;
    in_range(&w.warmup_s, at("warmup_s"), 0.0, 3_600.0, " seconds")?;
    match w.kind.value.as_str() {
        "toast-slice" => validate_toast_slice(w, &at),
        _ => validate_pgbench(w, &at),
    }
}

fn validate_toast_slice(w: &WorkloadSpec, at: &dyn Fn(&str) -> String) -> Result<(), Invalid> {
    in_range(
        &w.value_bytes,
        at("value_bytes"),
        1024,
        MAX_VALUE_BYTES,
        " (bytea's limit)",
    )?;
    let value_bytes = w
        .value_bytes
        .as_ref()
        .map(|v| v.value)
        .unwrap_or(10 * 1024 * 1024);
    for (key, list, allowed, what) in [
        (
            "storage_modes",
            &w.storage_modes,
            TOAST_STORAGE_MODES,
            "storage mode",
        ),
        ("datasets", &w.datasets, TOAST_DATASETS, "dataset"),
    ] {
        if let Some(list) = list {
            if list.is_empty() {
                return err(
                    w.kind.referenced,
                    at(key),
                    format!("must not be empty: allowed {}", allowed.join(", ")),
                );
            }
            let mut seen = BTreeSet::new();
            for (j, m) in list.iter().enumerate() {
                one_of(m, at(&format!("{key}[{j}]")), allowed, what)?;
                if !seen.insert(&m.value) {
                    return err(
                        m.referenced,
                        at(&format!("{key}[{j}]")),
                        format!("`{}` is listed twice", m.value),
                    );
                }
            }
        }
    }
    if let Some(offsets) = &w.offsets {
        if offsets.is_empty() {
            return err(w.kind.referenced, at("offsets"), "must not be empty");
        }
        for (j, o) in offsets.iter().enumerate() {
            resolve_offset(&o.value, value_bytes)
                .or_else(|m| err(o.referenced, at(&format!("offsets[{j}]")), m))?;
        }
    }
    in_range(
        &w.slice_bytes,
        at("slice_bytes"),
        1,
        value_bytes,
        " (value_bytes)",
    )?;
    in_range(&w.repeats, at("repeats"), 1, 1000, "")
}

fn validate_pgbench(w: &WorkloadSpec, at: &dyn Fn(&str) -> String) -> Result<(), Invalid> {
    if w.scale.is_none() {
        return err(
            w.kind.referenced,
            at("scale"),
            "is required: the pgbench scale (100,000 accounts each)",
        );
    }
    in_range(&w.scale, at("scale"), 1, 1_000_000, "")?;
    in_range(&w.fillfactor, at("fillfactor"), 10, 100, "")?;
    in_range(&w.partitions, at("partitions"), 0, 10_000, "")?;
    in_range(
        &w.load_connections,
        at("load_connections"),
        0,
        256,
        " (0: one per core)",
    )?;
    if w.kind.value != "pgbench" {
        return Ok(());
    }
    in_range(&w.clients, at("clients"), 1, 10_000, "")?;
    let clients = w.clients.as_ref().map(|c| c.value).unwrap_or(1);
    in_range(
        &w.threads,
        at("threads"),
        1,
        clients,
        " (no more threads than clients)",
    )?;
    in_range(&w.transactions, at("transactions"), 1, u64::MAX, "")?;
    in_range(&w.rate, at("rate"), 0.001, 1e9, " transactions per second")?;
    in_range(
        &w.latency_limit_ms,
        at("latency_limit_ms"),
        0.001,
        3.6e6,
        " ms",
    )?;
    in_range(&w.max_tries, at("max_tries"), 1, 1000, "")?;
    if let Some(d) = &w.driver {
        one_of(d, at("driver"), &["pgfleet", "pgbench"], "driver")?;
        let total = w.duration_s.as_ref().map(|x| x.value).unwrap_or(0.0)
            + w.warmup_s.as_ref().map(|x| x.value).unwrap_or(0.0);
        if d.value == "pgbench"
            && let Some(ds) = &w.duration_s
            && total.fract() != 0.0
        {
            return err(
                ds.referenced,
                at("duration_s"),
                format!(
                    "driver: pgbench runs whole seconds (pgbench -T): duration_s + warmup_s is {total}, make it e.g. {}",
                    total.ceil()
                ),
            );
        }
    }
    if let (Some(d), Some(_)) = (&w.duration_s, &w.transactions) {
        return err(
            d.referenced,
            at("duration_s"),
            "give duration_s or transactions, not both",
        );
    }
    if let (Some(s), Some(_)) = (&w.script, &w.script_text) {
        return err(
            s.referenced,
            at("script"),
            "give script (a built-in) or script_text, not both",
        );
    }
    if let Some(s) = &w.script
        && pgfleet_agent::driver::builtin(&s.value).is_none()
    {
        let names: Vec<&str> = pgfleet_agent::driver::BUILTIN_SCRIPTS
            .iter()
            .map(|b| b.0)
            .collect();
        return err(
            s.referenced,
            at("script"),
            format!(
                "unknown built-in script `{}`: allowed {}",
                s.value,
                names.join(", ")
            ),
        );
    }
    if let Some(t) = &w.script_text {
        pgfleet_agent::driver::script::Script::parse("script_text", &t.value).or_else(|e| {
            err(
                t.referenced,
                at("script_text"),
                format!("line {} of the script: {}", e.line, e.message),
            )
        })?;
    }
    if let Some(d) = &w.defines {
        for (k, v) in d {
            if !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || k.is_empty() {
                return err(
                    v.referenced,
                    at(&format!("defines.{k}")),
                    format!("`{k}` is not a variable name (letters, digits, _)"),
                );
            }
            if let super::SettingValue::Str(s) = &v.value {
                return err(
                    v.referenced,
                    at(&format!("defines.{k}")),
                    format!("`{s}` is not a number or boolean"),
                );
            }
        }
    }
    Ok(())
}

/// `"p%"` of a value of `n` bytes is byte floor(n * p / 100) + 1 (so 0% is
/// byte 1 and 50% of 10 MiB is 5,242,881); a number is a 1-based byte
/// position as substring() takes it.
pub fn resolve_offset(o: &OffsetSpec, n: u64) -> Result<u64, String> {
    let byte = match o {
        OffsetSpec::Byte(b) => *b,
        OffsetSpec::Text(t) => {
            let t = t.trim();
            if let Some(p) = t.strip_suffix('%') {
                let p: f64 = p.trim().parse().map_err(|_| {
                    format!("`{t}` is not a percentage: write e.g. \"50%\" or a byte position")
                })?;
                if !(0.0..100.0).contains(&p) {
                    return Err(format!(
                        "`{t}` is out of range: percentages must be at least 0% and below 100%"
                    ));
                }
                ((n as f64 * p / 100.0).floor() as u64) + 1
            } else {
                t.parse().map_err(|_| format!("`{t}` is not an offset: write a percentage such as \"50%\" or a 1-based byte position"))?
            }
        }
    };
    if byte == 0 || byte > n {
        return Err(format!(
            "byte position {byte} is outside the value: allowed 1..={n} (value_bytes)"
        ));
    }
    Ok(byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_follow_the_article() {
        let n = 10 * 1024 * 1024;
        let pct = |s: &str| resolve_offset(&OffsetSpec::Text(s.into()), n).unwrap();
        assert_eq!(pct("0%"), 1);
        assert_eq!(pct("50%"), 5_242_881);
        assert_eq!(pct("90%"), 9_437_185);
        assert_eq!(resolve_offset(&OffsetSpec::Byte(7), n).unwrap(), 7);
        assert_eq!(pct("42"), 42);
        assert!(resolve_offset(&OffsetSpec::Text("100%".into()), n).is_err());
        assert!(resolve_offset(&OffsetSpec::Byte(0), n).is_err());
        assert!(resolve_offset(&OffsetSpec::Byte(n + 1), n).is_err());
    }
}
