//! The agent's check of what the controller sends before anything acts on
//! it: every string that becomes a path, an identifier, a connection string
//! or a configuration line, and every size and count (the kind's own
//! `KindParams::check`). The controller validated all of it already; the
//! agent's host is the agent's to protect, so it checks again and refuses a
//! cell with a clear error instead of touching the disk.

use pgfleet_proto::v1::{Assign, Endpoint};
use pgfleet_proto::workload::Params;

pub use pgfleet_proto::is_safe_id;

fn role_ok(s: &str) -> bool {
    s.len() <= 40
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Checks an assignment; returns its parameters, or why it is refused.
pub fn check(a: &Assign) -> Result<Params, String> {
    if !is_safe_id(&a.cell_id) {
        return Err(format!(
            "refused an assignment whose cell id {:?} is not 1-128 of letters, digits, `.`, `_`, `-`, `:` (it names a directory under the data root)",
            clip(&a.cell_id)
        ));
    }
    if !a.run_id.is_empty() && !is_safe_id(&a.run_id) {
        return Err(format!(
            "refused: run id {:?} is not an id",
            clip(&a.run_id)
        ));
    }
    if !role_ok(&a.role) {
        return Err(format!(
            "refused: role {:?} is not a role name",
            clip(&a.role)
        ));
    }
    if a.traceparent.len() > 128 || !a.traceparent.is_ascii() {
        return Err("refused: the traceparent is not a W3C traceparent".into());
    }
    for p in &a.peers {
        if !role_ok(&p.role) || !is_safe_id(&p.agent_id) {
            return Err(format!(
                "refused: peer {:?} / {:?} is not a role and agent id",
                clip(&p.role),
                clip(&p.agent_id)
            ));
        }
        if !p.address.is_empty() && p.address.parse::<std::net::IpAddr>().is_err() {
            return Err(format!(
                "refused: peer address {:?} is not an IP address",
                clip(&p.address)
            ));
        }
    }
    let params = Params::from_json(&a.workload, &a.params_json)?;
    params
        .check()
        .map_err(|why| format!("refused the {} cell's parameters: {why}", a.workload))?;
    for (k, v) in &a.settings {
        pgfleet_proto::settings::check(k, v, params.allow_shell())
            .map_err(|why| format!("refused a setting: {why}"))?;
    }
    Ok(params)
}

/// Checks a peer's endpoint (relayed from another agent) before it becomes
/// a connection string.
pub fn check_endpoint(e: &Endpoint) -> Result<(), String> {
    let ident = |s: &str| {
        !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if e.host.parse::<std::net::IpAddr>().is_err() {
        return Err(format!(
            "peer host {:?} is not an IP address",
            clip(&e.host)
        ));
    }
    if e.port == 0 || e.port > 65535 {
        return Err(format!("peer port {} is not a port", e.port));
    }
    if !ident(&e.user) || !ident(&e.dbname) {
        return Err("peer user or database is not an identifier".into());
    }
    for p in [&e.password, &e.workload_password] {
        if p.len() > 256 || p.chars().any(|c| c.is_control()) {
            return Err("peer password is not a password".into());
        }
    }
    if e.loaded_json.len() > MAX_LOADED_JSON {
        return Err(format!(
            "peer load figures are {} bytes (at most {MAX_LOADED_JSON})",
            e.loaded_json.len()
        ));
    }
    Ok(())
}

/// A role's load figures are a few numbers per load step.
const MAX_LOADED_JSON: usize = 64 << 10;

/// At most 80 characters of an untrusted string, for an error message.
fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign(cell: &str, params: &str) -> Assign {
        Assign {
            cell_id: cell.into(),
            run_id: "r1".into(),
            workload: "pgbench-init".into(),
            params_json: params.into(),
            ..Default::default()
        }
    }
    const OK: &str = r#"{"scale":1,"fillfactor":100,"partitions":0,"load_connections":0}"#;

    #[test]
    fn paths_sizes_counts_and_settings_are_checked() {
        assert!(check(&assign("run1-c0", OK)).is_ok());
        for bad in ["../../x", "", ".hidden", "a/b", "x\0y", &"x".repeat(200)] {
            let e = check(&assign(bad, OK)).unwrap_err();
            assert!(e.contains("cell id"), "{bad}: {e}");
        }
        let huge = OK.replace("\"scale\":1", "\"scale\":1000000000");
        let e = check(&assign("c", &huge)).unwrap_err();
        assert!(e.contains("scale") && e.contains("out of range"), "{e}");
        let negative = OK.replace("\"partitions\":0", "\"partitions\":-1");
        let e = check(&assign("c", &negative)).unwrap_err();
        assert!(
            e.contains("parameters of pgbench-init") && e.contains("-1"),
            "{e}"
        );
        let mut a = assign("c", OK);
        a.settings.insert("archive_command".into(), "id".into());
        let e = check(&a).unwrap_err();
        assert!(
            e.contains("archive_command") && e.contains("allow_shell"),
            "{e}"
        );
        let mut a = assign("c", OK);
        a.peers.push(pgfleet_proto::v1::Peer {
            role: "publisher".into(),
            agent_id: "a1".into(),
            address: "host=evil".into(),
        });
        assert!(check(&a).unwrap_err().contains("peer address"));
    }

    #[test]
    fn endpoints_cannot_add_connection_keywords() {
        let mut e = Endpoint {
            host: "10.0.0.2".into(),
            port: 5432,
            user: "pgfleet".into(),
            password: "abc".into(),
            dbname: "postgres".into(),
            loaded_json: String::new(),
            workload_password: "def".into(),
        };
        assert!(check_endpoint(&e).is_ok());
        e.loaded_json = "x".repeat(MAX_LOADED_JSON + 1);
        assert!(check_endpoint(&e).unwrap_err().contains("load figures"));
        e.loaded_json.clear();
        e.dbname = "postgres sslmode=disable".into();
        assert!(check_endpoint(&e).is_err());
    }
}
