//! Where a PostgreSQL major version is installed on a host: the host's own
//! packages (`/usr/lib/postgresql/N/bin`), then an install of Debian's
//! packages made by `deploy/postgres/install.sh N` (under
//! `PGFLEET_PG_INSTALLS`, default `/opt/pgfleet/postgres`: `N/usr/lib/
//! postgresql/N/bin`, its programs relocated to load that root's own
//! libraries). The agent runs what it finds; `pgfleet run` checks a
//! class's version is here before it starts anything.

use std::path::{Path, PathBuf};

/// The major versions a class may ask for.
pub const SUPPORTED: &[u32] = &[15, 16, 17, 18, 19];

/// The version a class without `postgres: {version}` runs, and an agent
/// given neither `--pg-version` nor `--pg-bin`: 18, as the source articles
/// ran it (18.6 from Debian, with lz4, zstd and io_uring).
pub const DEFAULT: u32 = 18;

/// The major version of a server version ("15.18", "18.6 (Debian
/// 18.6-3)", "19rc1" -> "15", "18", "19"): its leading digits.
pub fn major(version: &str) -> &str {
    let end = version
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(version.len());
    &version[..end]
}

/// Where `deploy/postgres/install.sh` puts its installs.
pub fn installs_root() -> PathBuf {
    std::env::var_os("PGFLEET_PG_INSTALLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/pgfleet/postgres"))
}

/// The directories that may hold version `major`'s `initdb` and
/// `postgres`, in the order they are preferred.
pub fn candidates(major: u32) -> Vec<PathBuf> {
    vec![
        Path::new("/usr/lib/postgresql")
            .join(major.to_string())
            .join("bin"),
        installed_bindir(&installs_root(), major),
    ]
}

/// An install's bin directory under `root`.
pub fn installed_bindir(root: &Path, major: u32) -> PathBuf {
    root.join(major.to_string())
        .join("usr/lib/postgresql")
        .join(major.to_string())
        .join("bin")
}

/// The first candidate holding the server, if any.
pub fn find(major: u32) -> Option<PathBuf> {
    candidates(major)
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file())
}

/// The root of an install `bin` belongs to (the directory
/// `install.sh` marks complete), None for the host's own packages: what a
/// sandbox must see, as its programs load that root's libraries.
pub fn install_root(bin: &Path) -> Option<PathBuf> {
    let root = bin.ancestors().nth(5)?;
    root.join(".complete").is_file().then(|| root.to_path_buf())
}

/// What to tell a user whose host lacks version `major`.
pub fn missing(major: u32) -> String {
    format!(
        "PostgreSQL {major} is not installed here (looked in {}): install it with `sudo deploy/postgres/install.sh {major}` \
         (Debian's packages, relocated under {}), or `apt-get install postgresql-{major}` where the host's Debian has it",
        candidates(major)
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" and "),
        installs_root().display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_installs_root_is_found_from_its_bin_directory() {
        let root = std::env::temp_dir().join(format!("pgfleet-installs-{}", std::process::id()));
        let bin = installed_bindir(&root, 18);
        std::fs::create_dir_all(&bin).unwrap();
        assert_eq!(install_root(&bin), None, "not complete yet");
        std::fs::write(root.join("18/.complete"), "").unwrap();
        assert_eq!(install_root(&bin), Some(root.join("18")));
        assert_eq!(install_root(Path::new("/usr/lib/postgresql/15/bin")), None);
        assert!(missing(19).contains("install.sh 19"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
