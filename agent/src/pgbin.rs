//! Finding the PostgreSQL server binaries: `--pg-bin` / `PGFLEET_PG_BIN`;
//! `--pg-version N` (the host's packages, then an install of
//! `deploy/postgres/install.sh`: `pgfleet_proto::installs`); else
//! `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`.

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
    pub fn find(explicit: Option<&Path>) -> Result<PgBin> {
        let mut tried = Vec::new();
        let candidates: Vec<PathBuf> = match explicit {
            Some(p) => vec![p.to_path_buf()],
            None => {
                let mut c = Vec::new();
                if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
                    && out.status.success()
                {
                    c.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
                }
                c.extend(newest_debian_bindirs());
                c
            }
        };
        for dir in candidates {
            if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
                let version = server_version(&dir)?;
                let major = version
                    .split('.')
                    .next()
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(0);
                return Ok(PgBin {
                    dir,
                    version,
                    major,
                });
            }
            tried.push(dir.display().to_string());
        }
        Err(Error::PgBin(format!(
            "no directory with `initdb` and `postgres` found (tried: {}); install PostgreSQL \
             (Debian: apt-get install postgresql) or pass --pg-bin DIR / set PGFLEET_PG_BIN",
            if tried.is_empty() {
                "nothing: pg_config absent and /usr/lib/postgresql empty".to_string()
            } else {
                tried.join(", ")
            }
        )))
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

/// `/usr/lib/postgresql/<major>/bin`, highest major first.
fn newest_debian_bindirs() -> Vec<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, e.path().join("bin")))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, p)| p).collect()
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
