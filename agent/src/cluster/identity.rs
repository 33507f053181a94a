//! Who a cluster's processes run as.

use nix::unistd::User;

use crate::{Error, Result};

/// Who the server runs as: the agent's own user, or (when the agent is root)
/// an unprivileged account such as `postgres`.
#[derive(Debug, Clone)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
}

impl RunAs {
    /// Root cannot run PostgreSQL: pick `pg_user` then. Otherwise run as self.
    pub fn resolve(pg_user: &str) -> Result<Option<RunAs>> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(None);
        }
        let user = User::from_name(pg_user)
            .map_err(|e| Error::Provision(format!("looking up user `{pg_user}`: {e}")))?
            .ok_or_else(|| {
                Error::Provision(format!(
                    "the agent runs as root and PostgreSQL refuses to; user `{pg_user}` does not \
                     exist: create it (useradd --system {pg_user}) or pass --pg-user NAME"
                ))
            })?;
        if user.uid.is_root() {
            return Err(Error::Provision(format!(
                "--pg-user `{pg_user}` is root; PostgreSQL refuses to run as root"
            )));
        }
        Ok(Some(RunAs {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            name: pg_user.to_string(),
        }))
    }
}
