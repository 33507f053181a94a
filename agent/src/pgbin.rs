//! Finding the PostgreSQL server binaries: `--pg-bin` / `PGFLEET_PG_BIN`;
//! else `--pg-version N`, by default `installs::DEFAULT` (18): the host's
//! packages, then an install of `deploy/postgres/install.sh`
//! (`pgfleet_proto::installs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// A directory holding `initdb` and `postgres`, and the server's version.
#[derive(Debug, Clone)]
pub struct PgBin {
    pub dir: PathBuf,
    /// e.g. "15.18"
    pub version: String,
    pub major: u32,
}

impl PgBin {
    /// `explicit` is the flag or environment variable; it wins when given.
    /// Without it: the default version (`installs::DEFAULT`), wherever
    /// `find_version` finds it.
    pub fn find(explicit: Option<&Path>) -> Result<PgBin> {
        let Some(dir) = explicit else {
            return PgBin::find_version(pgfleet_proto::installs::DEFAULT).map_err(|e| {
                Error::PgBin(format!(
                    "{e}; or pass --pg-bin DIR / set PGFLEET_PG_BIN to run another build"
                ))
            });
        };
        if !(dir.join("initdb").is_file() && dir.join("postgres").is_file()) {
            return Err(Error::PgBin(format!(
                "{} holds no `initdb` and `postgres`: pass the bin directory of a PostgreSQL install \
                 (e.g. /usr/lib/postgresql/15/bin), or --pg-version N",
                dir.display()
            )));
        }
        let version = server_version(dir)?;
        let major = pgfleet_proto::installs::major(&version)
            .parse()
            .unwrap_or(0);
        Ok(PgBin {
            dir: dir.to_path_buf(),
            version,
            major,
        })
    }

    /// Version `major`, wherever `pgfleet_proto::installs` finds it.
    pub fn find_version(major: u32) -> Result<PgBin> {
        let dir = pgfleet_proto::installs::find(major)
            .ok_or_else(|| Error::PgBin(pgfleet_proto::installs::missing(major)))?;
        let pg = PgBin::find(Some(&dir))?;
        if pg.major != major {
            return Err(Error::PgBin(format!(
                "{} holds PostgreSQL {}, not {major}",
                dir.display(),
                pg.version
            )));
        }
        Ok(pg)
    }

    /// `pg_config --configure`'s text; empty when it cannot run.
    pub fn configure(&self) -> String {
        Command::new(self.tool("pg_config"))
            .arg("--configure")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }

    pub fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// What a sandboxed program of this install must see: the install's
    /// root (its programs load that root's libraries) for an install of
    /// `deploy/postgres/install.sh`, else the version's directory
    /// (`/usr/lib/postgresql/N`, beside the host's libraries).
    pub fn visible_root(&self) -> PathBuf {
        pgfleet_proto::installs::install_root(&self.dir)
            .unwrap_or_else(|| self.dir.parent().unwrap_or(&self.dir).to_path_buf())
    }
}

/// Parses `postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)` -> `15.18`.
fn server_version(dir: &Path) -> Result<String> {
    let out = Command::new(dir.join("postgres"))
        .arg("--version")
        .output()
        .map_err(|e| Error::PgBin(format!("running {}/postgres --version: {e}", dir.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_version(&text)
        .ok_or_else(|| Error::PgBin(format!("could not read a version from `{}`", text.trim())))
}

fn parse_version(text: &str) -> Option<String> {
    let rest = text.split("(PostgreSQL)").nth(1)?.trim();
    let v = rest.split_whitespace().next()?;
    v.chars()
        .next()
        .filter(|c| c.is_ascii_digit())
        .map(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debian_version_string() {
        assert_eq!(
            parse_version("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n").as_deref(),
            Some("15.18")
        );
        assert_eq!(
            parse_version("postgres (PostgreSQL) 18beta1").as_deref(),
            Some("18beta1")
        );
        assert_eq!(parse_version("garbage"), None);
    }
}
