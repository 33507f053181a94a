//! Which PostgreSQL settings a scenario may set: one judgement, made by the
//! controller at validation (located in the scenario file) and again by the
//! agent before it writes a cluster's configuration.
//!
//! - **Reserved**: what the agent manages itself (its port, addresses, files,
//!   the server log it reads failures from). Never settable.
//! - **Host access**: settings that run a command, load code or name a file
//!   on the agent's host (`archive_command`, `shared_preload_libraries`,
//!   `external_pid_file`, …). Each would let scenario text act on the agent's
//!   host as the cluster's OS user, so they are settable only where the
//!   workload has the `allow_shell` opt-in (and `serve` permits it).

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

/// Settings that act on the agent's host, with what each does.
pub const HOST_ACCESS: &[(&str, &str)] = &[
    ("archive_command", "runs a shell command"),
    ("archive_library", "loads a library into the server"),
    ("archive_cleanup_command", "runs a shell command"),
    ("restore_command", "runs a shell command"),
    ("recovery_end_command", "runs a shell command"),
    ("ssl_passphrase_command", "runs a shell command"),
    (
        "shared_preload_libraries",
        "loads a library into the server",
    ),
    ("local_preload_libraries", "loads a library into the server"),
    (
        "session_preload_libraries",
        "loads a library into the server",
    ),
    (
        "dynamic_library_path",
        "chooses where libraries are loaded from",
    ),
    ("jit_provider", "loads a library into the server"),
    ("external_pid_file", "writes a file on the agent's host"),
    ("log_directory", "writes files on the agent's host"),
    ("stats_temp_directory", "writes files on the agent's host"),
    ("ssl_cert_file", "reads a file on the agent's host"),
    ("ssl_key_file", "reads a file on the agent's host"),
    ("ssl_ca_file", "reads a file on the agent's host"),
    ("ssl_crl_file", "reads a file on the agent's host"),
    ("ssl_crl_dir", "reads files on the agent's host"),
    ("ssl_dh_params_file", "reads a file on the agent's host"),
    ("krb_server_keyfile", "reads a file on the agent's host"),
];

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
    let lower = name.to_ascii_lowercase();
    if RESERVED.contains(&lower.as_str()) {
        return Err(format!("`{name}` is managed by pgfleet and cannot be set"));
    }
    if let Some((_, what)) = HOST_ACCESS.iter().find(|(n, _)| *n == lower)
        && !allow_shell
    {
        return Err(format!(
            "`{name}` {what} as the cluster's OS user: refused unless the workload sets allow_shell: true (and, under `pgfleet serve`, the server was started with --allow-shell-scenarios)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn reserved_and_host_settings_are_judged() {
        assert!(check("shared_buffers", "128MB", false).is_ok());
        assert!(check("my.custom", "x", false).is_ok());
        let e = check("port", "5432", true).unwrap_err();
        assert!(e.contains("managed by pgfleet"), "{e}");
        let e = check("archive_command", "id > /tmp/x", false).unwrap_err();
        assert!(
            e.contains("runs a shell command") && e.contains("allow_shell"),
            "{e}"
        );
        assert!(check("archive_command", "true", true).is_ok());
        // Case does not get around it: PostgreSQL's names are case-insensitive.
        assert!(check("Shared_Preload_Libraries", "x", false).is_err());
        assert!(check("bad name", "x", true).is_err());
        assert!(check("work_mem", "1\nshared_preload_libraries='x'", true).is_err());
    }
}
