//! Value and range checks after parsing. Every error carries the location of
//! the offending value (kept by `Spanned`), its field path, and what is
//! allowed.

use std::collections::BTreeSet;

use serde_saphyr::{Location, Spanned};

use super::{OffsetSpec, Scenario, WorkloadSpec};

pub const TOAST_STORAGE_MODES: &[&str] = &["external", "pglz", "lz4"];
pub const TOAST_DATASETS: &[&str] = &["abcd", "mixed", "incompressible"];
pub const WORKLOAD_KINDS: &[&str] = &["toast-slice"];
pub const STORAGE_PROFILES: &[&str] = &["nvme"];
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
        if let Some(st) = &f.storage
            && !STORAGE_PROFILES.contains(&st.profile.value.as_str())
        {
            let hint = if ["gp3", "custom"].contains(&st.profile.value.as_str()) {
                " (throttled profiles need block-I/O emulation, which this version does not have yet)"
            } else {
                ""
            };
            return err(
                st.profile.referenced,
                at("storage.profile"),
                format!(
                    "unknown storage profile `{}`{hint}: allowed {}",
                    st.profile.value,
                    STORAGE_PROFILES.join(", ")
                ),
            );
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
    // toast-slice (the only kind so far).
    let value_bytes = w
        .value_bytes
        .as_ref()
        .map(|v| v.value)
        .unwrap_or(10 * 1024 * 1024);
    if let Some(v) = &w.value_bytes
        && !(1024..=MAX_VALUE_BYTES).contains(&v.value)
    {
        return err(
            v.referenced,
            at("value_bytes"),
            format!(
                "{} is out of range: allowed 1024..={MAX_VALUE_BYTES} (bytea's limit)",
                v.value
            ),
        );
    }
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
    if let Some(v) = &w.slice_bytes
        && !(1..=value_bytes).contains(&v.value)
    {
        return err(
            v.referenced,
            at("slice_bytes"),
            format!(
                "{} is out of range: allowed 1..={value_bytes} (value_bytes)",
                v.value
            ),
        );
    }
    if let Some(v) = &w.duration_s
        && !(v.value > 0.0 && v.value <= 86_400.0)
    {
        return err(
            v.referenced,
            at("duration_s"),
            format!(
                "{} is out of range: allowed more than 0 and at most 86400 seconds",
                v.value
            ),
        );
    }
    if let Some(v) = &w.warmup_s
        && !(v.value >= 0.0 && v.value <= 3_600.0)
    {
        return err(
            v.referenced,
            at("warmup_s"),
            format!("{} is out of range: allowed 0..=3600 seconds", v.value),
        );
    }
    if let Some(v) = &w.repeats
        && !(1..=1000).contains(&v.value)
    {
        return err(
            v.referenced,
            at("repeats"),
            format!("{} is out of range: allowed 1..=1000", v.value),
        );
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
