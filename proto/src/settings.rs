//! Which PostgreSQL settings a scenario may set: one judgement, made by the
//! controller at validation (located in the scenario file) and again by the
//! agent before it writes a cluster's configuration. An allowlist, derived
//! from PostgreSQL's own metadata, not a list of bad names:
//!
//! 1. **Known names only.** The name must be one `pg_settings` lists on
//!    PostgreSQL 15, 17, 18 or 19 (`data/pg_settings_N.tsv`: name, type,
//!    context, category, as the servers report them; a test compares them
//!    with live servers). Config-file directives (`include`,
//!    `include_if_exists`, `include_dir`) and custom or extension names
//!    (`plperl.on_init`, …) are not settings and are refused.
//! 2. **Never**: what the agent manages (`RESERVED`) and read-only settings
//!    (context `internal`).
//! 3. **Host access** (only with the `allow_shell` opt-in): a category whose
//!    settings name files, load code or decide where logs go
//!    (`HOST_CATEGORIES`), any free-text (`string`) setting but a few whose
//!    text is a name, never a path or command (`PLAIN_STRINGS`), and the
//!    short list of `EXCEPTIONS` (each with its reason).
//! 4. **Values** of what is allowed without the opt-in are plain words
//!    (`plain_value`): no quotes, no line breaks, no `..`.
//!
//! A name judged differently by two versions gets the stricter verdict.
//! SECURITY.md carries the table `markdown_table` generates (a test keeps it
//! current).

/// Settings the agent manages; an `Assign` may not set them.
pub const RESERVED: &[&str] = &[
    "port",
    "listen_addresses",
    "unix_socket_directories",
    "unix_socket_group",
    "unix_socket_permissions",
    "data_directory",
    "hba_file",
    "ident_file",
    "config_file",
    // The agent reads the server's log (postgres.log beside PGDATA) to
    // explain a failure; a collector would move it.
    "logging_collector",
];

/// Settings no cell can use, with why: refused even with `allow_shell`.
pub const NEVER: &[(&str, &str)] = &[(
    "synchronous_standby_names",
    "a cell's cluster has no synchronous standby, so every commit (the agent's provisioning too) would wait for one forever",
)];

/// Categories whose settings reach the host, with why.
pub const HOST_CATEGORIES: &[(&str, &str)] = &[
    ("File Locations", "names files on the agent's host"),
    (
        "Client Connection Defaults / Shared Library Preloading",
        "loads libraries into the server",
    ),
    (
        "Connections and Authentication / SSL",
        "reads key and certificate files or runs a passphrase command",
    ),
    (
        "Reporting and Logging / Where to Log",
        "decides where the server writes files",
    ),
    (
        "Developer Options",
        "switches off the server's own safety checks (catalog changes, checksums, damaged pages)",
    ),
];

/// Free-text settings whose text is a name or a list of names (a time zone,
/// a locale, a standby, a tablespace), never a path, command or library.
pub const PLAIN_STRINGS: &[&str] = &[
    "application_name",
    "client_encoding",
    "cluster_name",
    "datestyle",
    "default_tablespace",
    // An access method's name: only installed ones resolve.
    "default_table_access_method",
    "default_text_search_config",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "log_connections",
    // `%` escapes and words; `LOG_LINE_PREFIX_CHARS` widens its value.
    "log_line_prefix",
    "log_timezone",
    // Schema names; the agent's superuser sessions set their own in the
    // startup packet, which beats the configuration file.
    "search_path",
    "temp_tablespaces",
    "timezone",
    // A file name PostgreSQL itself restricts to letters, under its
    // share directory's timezonesets.
    "timezone_abbreviations",
];

/// What `log_line_prefix` may hold besides a plain value's characters:
/// its `%` escapes and the punctuation prefixes use.
pub const LOG_LINE_PREFIX_CHARS: &str = "%[]:@=<>|";

/// Values of host-access settings that reach nothing, allowed without the
/// opt-in: an `archive_command` that archives nowhere (what benchmarks of
/// archiving's overhead set).
pub const HARMLESS_VALUES: &[(&str, &[&str])] = &[("archive_command", &["true", "/bin/true", ""])];

/// Settings of the contrib modules people benchmark with, which
/// `pg_settings` lists only once their library is loaded: known names,
/// plain values. Setting one loads nothing (that needs
/// `shared_preload_libraries`, an opt-in setting).
pub const EXTENSION_SETTINGS: &[&str] = &[
    "auto_explain.log_analyze",
    "auto_explain.log_buffers",
    "auto_explain.log_format",
    "auto_explain.log_level",
    "auto_explain.log_min_duration",
    "auto_explain.log_nested_statements",
    "auto_explain.log_parameter_max_length",
    "auto_explain.log_settings",
    "auto_explain.log_timing",
    "auto_explain.log_triggers",
    "auto_explain.log_verbose",
    "auto_explain.log_wal",
    "auto_explain.sample_rate",
    "pg_stat_statements.max",
    "pg_stat_statements.save",
    "pg_stat_statements.track",
    "pg_stat_statements.track_planning",
    "pg_stat_statements.track_utility",
];

/// Settings of a harmless type and category that still cross a boundary.
pub const EXCEPTIONS: &[(&str, &str)] = &[(
    "lo_compat_privileges",
    "turns off the privilege checks on large objects",
)];

const PG15: &str = include_str!("../data/pg_settings_15.tsv");
const PG17: &str = include_str!("../data/pg_settings_17.tsv");
const PG18: &str = include_str!("../data/pg_settings_18.tsv");
const PG19: &str = include_str!("../data/pg_settings_19.tsv");

/// The PostgreSQL versions whose `pg_settings` the judgement knows.
pub const VERSIONS: &[(u32, &str)] = &[(15, PG15), (17, PG17), (18, PG18), (19, PG19)];

/// One row of `pg_settings` (the columns the judgement reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting<'a> {
    pub name: &'a str,
    pub vartype: &'a str,
    pub context: &'a str,
    pub category: &'a str,
}

/// The rows of one version's table.
pub fn rows(table: &str) -> impl Iterator<Item = Setting<'_>> {
    table.lines().filter(|l| !l.is_empty()).filter_map(|l| {
        let mut f = l.split('\t');
        Some(Setting {
            name: f.next()?,
            vartype: f.next()?,
            context: f.next()?,
            category: f.next()?,
        })
    })
}

/// How a setting is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Any scenario may set it (a plain value).
    Allowed,
    /// Only a workload with `allow_shell` (why).
    HostAccess(String),
    /// Never (why).
    Refused(String),
}

/// The verdict on one version's row.
pub fn judge(s: &Setting) -> Verdict {
    let lower = s.name.to_ascii_lowercase();
    if RESERVED.contains(&lower.as_str()) {
        return Verdict::Refused("managed by pgfleet".into());
    }
    if let Some((_, why)) = NEVER.iter().find(|(n, _)| *n == lower) {
        return Verdict::Refused((*why).into());
    }
    if s.context == "internal" {
        return Verdict::Refused(
            "read-only (context internal: fixed when PostgreSQL was built or initdb ran)".into(),
        );
    }
    if let Some((_, why)) = HOST_CATEGORIES.iter().find(|(c, _)| *c == s.category) {
        return Verdict::HostAccess(format!("{why} (category {})", s.category));
    }
    if let Some((_, why)) = EXCEPTIONS.iter().find(|(n, _)| *n == lower) {
        return Verdict::HostAccess((*why).into());
    }
    if s.vartype == "string" && !PLAIN_STRINGS.contains(&lower.as_str()) {
        return Verdict::HostAccess(
            "takes free text, where a path, a command, a library or a connection string can hide"
                .into(),
        );
    }
    Verdict::Allowed
}

/// The stricter verdict over every version that lists `name`; None when
/// none does (and is not one of `EXTENSION_SETTINGS`).
pub fn verdict(name: &str) -> Option<Verdict> {
    if EXTENSION_SETTINGS
        .iter()
        .any(|n| n.eq_ignore_ascii_case(name))
    {
        return Some(Verdict::Allowed);
    }
    let rank = |v: &Verdict| match v {
        Verdict::Allowed => 0,
        Verdict::HostAccess(_) => 1,
        Verdict::Refused(_) => 2,
    };
    VERSIONS
        .iter()
        .flat_map(|(_, t)| rows(t))
        .filter(|s| s.name.eq_ignore_ascii_case(name))
        .map(|s| judge(&s))
        .max_by_key(rank)
}

/// A value any scenario may give: words of letters, digits and
/// `_ . , + - / ( ) *` and spaces (a size, a number, an enum's label, a time
/// zone, a list of names); no quotes, no `..`, at most 256 bytes.
pub fn plain_value(value: &str) -> bool {
    plain_with(value, "")
}

fn plain_with(value: &str, extra: &str) -> bool {
    value.len() <= 256
        && !value.contains("..")
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " _.,+-/()*".contains(c) || extra.contains(c))
}

/// A plain value for `name` (`log_line_prefix` takes its escapes too).
fn plain_for(name: &str, value: &str) -> bool {
    if name.eq_ignore_ascii_case("log_line_prefix") {
        plain_with(value, LOG_LINE_PREFIX_CHARS)
    } else {
        plain_value(value)
    }
}

/// Whether `name` may be set on a cluster, and if not, why (a sentence that
/// says what to do). `allow_shell`: the workload has the host-access opt-in.
pub fn check(name: &str, value: &str, allow_shell: bool) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 63
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Err(format!("`{name}` is not a PostgreSQL setting name"));
    }
    // A configuration file line ends at a newline; a NUL ends the file's
    // text for the server.
    if value.contains(['\n', '\r', '\0']) {
        return Err(format!(
            "the value of `{name}` has a line break or NUL: a setting's value is one line"
        ));
    }
    if value.len() > 4096 {
        return Err(format!(
            "the value of `{name}` is {} bytes long: at most 4096",
            value.len()
        ));
    }
    let harmless = HARMLESS_VALUES
        .iter()
        .any(|(n, vs)| n.eq_ignore_ascii_case(name) && vs.contains(&value.trim()));
    match verdict(name) {
        Some(Verdict::HostAccess(_)) if harmless => Ok(()),
        None => Err(format!(
            "`{name}` is not a setting PostgreSQL 15 or 18 lists in pg_settings: only those may be set \
             (config-file directives such as include_if_exists, and custom or extension settings, are refused)"
        )),
        Some(Verdict::Refused(why)) => Err(format!("`{name}` cannot be set: {why}")),
        Some(Verdict::HostAccess(why)) if !allow_shell => Err(format!(
            "`{name}` {why}, acting on the agent's host as the cluster's OS user: refused unless the \
             workload sets allow_shell: true (and, under `pgfleet serve`, the server was started with \
             --allow-shell-scenarios)"
        )),
        Some(Verdict::Allowed) if !allow_shell && !plain_for(name, value) => Err(format!(
            "the value of `{name}` is not a plain value: use letters, digits, spaces and _ . , + - / ( ) * only \
             (no quotes, no ..), at most 256 bytes"
        )),
        Some(_) => Ok(()),
    }
}

/// SECURITY.md's settings table: per category (over both versions), what
/// any scenario may set, what needs `allow_shell` and what never can, with
/// the reasons.
pub fn markdown_table() -> String {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Row {
        allowed: usize,
        host: Vec<String>,
        never: Vec<String>,
        why: std::collections::BTreeSet<String>,
    }
    let mut by: BTreeMap<String, Row> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for (_, t) in VERSIONS {
        for s in rows(t) {
            if !seen.insert(s.name.to_string()) {
                continue;
            }
            let r = by.entry(s.category.to_string()).or_default();
            match verdict(s.name).unwrap_or(Verdict::Refused(String::new())) {
                Verdict::Allowed => r.allowed += 1,
                Verdict::HostAccess(w) => {
                    r.host.push(format!("`{}`", s.name));
                    r.why.insert(w);
                }
                Verdict::Refused(w) => {
                    r.never.push(format!("`{}`", s.name));
                    r.why.insert(w);
                }
            }
        }
    }
    let mut out = String::from(
        "| category (PostgreSQL 15 and 18) | allowed | only with allow_shell | never | why |\n|---|---|---|---|---|\n",
    );
    for (cat, r) in by {
        let list = |v: &Vec<String>| {
            if v.is_empty() {
                "".to_string()
            } else {
                v.join(", ")
            }
        };
        out += &format!(
            "| {cat} | {} | {} | {} | {} |\n",
            r.allowed,
            list(&r.host),
            list(&r.never),
            r.why.into_iter().collect::<Vec<_>>().join("; ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_judges_by_metadata() {
        assert!(check("shared_buffers", "128MB", false).is_ok());
        assert!(check("default_toast_compression", "lz4", false).is_ok());
        assert!(check("TimeZone", "Europe/Berlin", false).is_ok());
        let e = check("port", "5432", true).unwrap_err();
        assert!(e.contains("managed by pgfleet"), "{e}");
        let e = check("archive_command", "id > /tmp/x", false).unwrap_err();
        assert!(e.contains("free text") && e.contains("allow_shell"), "{e}");
        assert!(check("archive_command", "true", true).is_ok());
        // What reaches nothing needs no opt-in (issue 60's "not too eager").
        assert!(check("archive_command", "true", false).is_ok());
        assert!(check("archive_command", "/bin/true", false).is_ok());
        assert!(check("archive_command", "true; id", false).is_err());
        assert!(check("search_path", "bench, public", false).is_ok());
        assert!(check("log_line_prefix", "%m [%p] %q%u@%d ", false).is_ok());
        assert!(check("timezone_abbreviations", "Default", false).is_ok());
        assert!(check("default_table_access_method", "heap", false).is_ok());
        assert!(check("pg_stat_statements.track", "all", false).is_ok());
        assert!(check("auto_explain.log_min_duration", "250ms", false).is_ok());
        assert!(check("pg_stat_statements.bogus", "1", true).is_err());
        // A standby no cell has: every commit would wait forever.
        let e = check("synchronous_standby_names", "*", true).unwrap_err();
        assert!(e.contains("wait for one forever"), "{e}");
        // Config-file directives and custom names are not settings.
        for d in [
            "include",
            "include_if_exists",
            "include_dir",
            "my.custom",
            "plperl.on_init",
        ] {
            let e = check(d, "/etc/passwd", true).unwrap_err();
            assert!(e.contains("not a setting PostgreSQL"), "{d}: {e}");
        }
        // The attack's other half: a log line prefix is free text.
        assert!(check("log_line_prefix", "archive_command = 'id' #", false).is_err());
        // Case does not get around it: PostgreSQL's names are case-insensitive.
        assert!(check("Shared_Preload_Libraries", "x", false).is_err());
        assert!(check("bad name", "x", true).is_err());
        assert!(check("work_mem", "1\nshared_preload_libraries='x'", true).is_err());
        // Values: plain words only.
        assert!(check("work_mem", "64MB' include '/etc/passwd", false).is_err());
        assert!(check("TimeZone", "../../../../etc/passwd", false).is_err());
        // Read-only, and the developer switches.
        assert!(
            check("block_size", "4096", true)
                .unwrap_err()
                .contains("read-only")
        );
        assert!(check("allow_system_table_mods", "on", false).is_err());
        assert!(check("zero_damaged_pages", "on", false).is_err());
        assert!(check("lo_compat_privileges", "on", false).is_err());
    }

    #[test]
    fn every_listed_setting_has_a_verdict() {
        for (v, t) in VERSIONS {
            let n = rows(t).count();
            assert!(n > 300, "PostgreSQL {v}: {n} rows");
            for s in rows(t) {
                assert!(verdict(s.name).is_some(), "{}", s.name);
            }
        }
        // PostgreSQL 18 made log_connections a string: the stricter verdict
        // over both would refuse it, so it is one of the plain strings.
        assert_eq!(verdict("log_connections"), Some(Verdict::Allowed));
    }

    /// SECURITY.md carries the generated table (`PGFLEET_BLESS=1` rewrites it).
    #[test]
    fn security_md_carries_the_settings_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../SECURITY.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = (
            "<!-- settings table: begin -->\n",
            "<!-- settings table: end -->",
        );
        let (Some(a), Some(b)) = (text.find(begin), text.find(end)) else {
            panic!("SECURITY.md lacks the settings table markers");
        };
        let current = &text[a + begin.len()..b];
        let want = markdown_table();
        if current != want {
            if std::env::var_os("PGFLEET_BLESS").is_some() {
                let new = format!("{}{want}{}", &text[..a + begin.len()], &text[b..]);
                std::fs::write(&path, new).unwrap();
            } else {
                panic!(
                    "SECURITY.md's settings table is stale: run PGFLEET_BLESS=1 cargo test -p pgfleet-proto settings"
                );
            }
        }
    }
}
