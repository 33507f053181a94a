//! Datasets: the data a cell's measurement starts from (pgbench's tables at
//! a scale, …), built once, published to a store and restored by later cells
//! that need the same bytes.
//!
//! What both sides agree on lives here: what a kind declares (`Dataset`:
//! a label for people and the keys that shape the bytes), the on-disk
//! facts of the PostgreSQL build that change them (`Format`), the
//! fingerprint of the two, the manifest a published dataset carries, and the
//! layout of a local store, which the agent writes and `pgfleet datasets`
//! reads:
//!
//! ```text
//! <store>/<fingerprint>/manifest.json   written last: its presence publishes
//! <store>/<fingerprint>/data/…          PGDATA after a clean shutdown
//! <store>/<fingerprint>.lock            flock: exclusive while building or
//!                                       removing, shared while restoring
//! <store>/.building-<fingerprint>-…     a build in progress (never read;
//!                                       removed by the next builder)
//! ```

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Bytes per second and core of a restore (a copy checking SHA-256) or a
/// publish, for estimates: restores ran at 772-823 MB/s on two threads on
/// the reference 2-core host at scales 100 and 500 (BENCHMARKS.md,
/// "Datasets").
pub const ESTIMATE_COPY_BYTES_PER_SECOND: f64 = 400e6;
/// Bytes per second and core of reading a restored dataset back through
/// the server (`rewarm`): 0.7 s for scale 64's ~1 GB uncapped; under a
/// cap, the cap (7.7 s at 125 MiB/s).
pub const ESTIMATE_REWARM_BYTES_PER_SECOND: f64 = 1.4e9;

/// What an agent does with the datasets a volume snapshot brought before a
/// cell uses them (`storage.hydrate`, the agent's `--hydrate`): `read-all`
/// reads every block (such a volume fetches blocks lazily on first touch),
/// `none` leaves them lazy.
pub const HYDRATE_MODES: &[&str] = &["read-all", "none"];

/// The local store's layout and manifest version.
pub const STORE_FORMAT: u32 = 1;
/// The progress phase a cell reports once its dataset is in its cluster
/// (built and published, or restored): the scheduler then starts the cells
/// it held for that dataset.
pub const READY_PHASE: &str = "dataset-ready";

/// Whether a workload's cells reuse a published dataset (`reuse`, the
/// default) or load their own every time (`fresh`); `build` is `pgfleet
/// datasets build`'s: publish the dataset if it is not, measure nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Reuse,
    Fresh,
    Build,
}

impl Mode {
    /// The modes a scenario may give (`build` is the command's).
    pub const NAMES: &[&str] = &["reuse", "fresh"];

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "reuse" | "" => Some(Mode::Reuse),
            "fresh" => Some(Mode::Fresh),
            "build" => Some(Mode::Build),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Reuse => "reuse",
            Mode::Fresh => "fresh",
            Mode::Build => "build",
        }
    }
}

/// What a kind declares about its data (`KindParams::dataset`): the loader
/// and its output version (bumped whenever the loader writes other bytes),
/// a label people read, and the keys that shape the bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub loader: String,
    pub loader_version: u32,
    pub label: String,
    pub keys: BTreeMap<String, serde_json::Value>,
    /// Bytes of the loaded data and seconds to load it (the kind's
    /// estimates; no part of the fingerprint).
    pub bytes: u64,
    pub load_seconds: f64,
}

impl Dataset {
    /// Bytes of its PGDATA as published.
    pub fn pgdata_bytes(&self) -> u64 {
        pgdata_bytes(self.bytes)
    }
    /// What makes two cells of one plan need the same bytes: the loader
    /// and its data-shaping keys (the fingerprint without the PostgreSQL
    /// build, which only an agent knows).
    pub fn plan_key(&self) -> String {
        serde_json::json!([self.loader, self.keys]).to_string()
    }
}

/// The PostgreSQL build's facts that change the on-disk format: the major
/// version, block sizes, segment size, and how pgfleet runs initdb (data
/// checksums, encoding, locale).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Format {
    pub postgres_major: u32,
    pub block_size_kb: u32,
    pub wal_block_size_kb: u32,
    pub segment_size_gb: u32,
    pub checksums: bool,
    pub encoding: String,
    pub locale: String,
}

impl Format {
    /// The format of a build: `configure` is `pg_config --configure`'s
    /// output (empty when unknown: PostgreSQL's defaults, which is what
    /// every packaged build uses).
    pub fn of(postgres_major: u32, configure: &str, checksums: bool) -> Format {
        let flag = |name: &str, default: u32| {
            configure
                .split_whitespace()
                .map(|w| w.trim_matches('\''))
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or(default)
        };
        Format {
            postgres_major,
            block_size_kb: flag("--with-blocksize", 8),
            wal_block_size_kb: flag("--with-wal-blocksize", 8),
            segment_size_gb: flag("--with-segsize", 1),
            checksums,
            encoding: "UTF8".into(),
            locale: "C".into(),
        }
    }
}

/// The fingerprint: the label (for people) and 16 hex digits of the SHA-256
/// of the format and the dataset's loader and keys. Two cells with one
/// fingerprint need the same bytes.
pub fn fingerprint(format: &Format, dataset: &Dataset) -> String {
    let canonical = serde_json::json!({
        "store_format": STORE_FORMAT,
        "format": format,
        "loader": dataset.loader,
        "loader_version": dataset.loader_version,
        "keys": dataset.keys,
    });
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    format!("{}-{}", dataset.label, &hex(&digest)[..16])
}

/// Lower-case hex of bytes.
/// Refuses a default directory in a shared place (`/tmp/pgfleet`) that
/// someone else could have prepared: it must be a real directory (not a
/// link), owned by this user or root, and writable by no one else. A
/// missing one is fine (it is made with this user's modes).
pub fn check_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let why = if m.file_type().is_symlink() {
        Some("is a symbolic link".to_string())
    } else if !m.is_dir() {
        Some("is not a directory".to_string())
    } else if m.uid() != me && m.uid() != 0 {
        Some(format!(
            "belongs to uid {}, not to this user ({me})",
            m.uid()
        ))
    } else if m.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by others (mode {:o})",
            m.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}: pgfleet will not keep clusters under a directory another user may have prepared",
                dir.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Creates `path` and its missing parents; returns the directories it
/// made, outermost first, so a caller sets modes on those alone and never
/// changes a directory the operator already had.
pub fn create_new_dirs(path: &Path) -> io::Result<Vec<PathBuf>> {
    let missing: Vec<PathBuf> = path
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err())
        .map(Path::to_path_buf)
        .collect();
    std::fs::create_dir_all(path)?;
    Ok(missing.into_iter().rev().collect())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A published dataset's manifest (`<fingerprint>/manifest.json`, mode 0600
/// in a store only its owner can read: it holds the cluster's superuser
/// password, which a restore needs to take the cluster over).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub store_format: u32,
    pub fingerprint: String,
    pub dataset: Dataset,
    pub format: Format,
    /// e.g. "15.18"
    pub postgres_version: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The cell and host that built it.
    pub built_by: String,
    pub host: String,
    /// Seconds to build (load, vacuum, checkpoint) and to publish (copy).
    pub build_seconds: f64,
    pub publish_seconds: f64,
    /// The loader's own figures (the kind's load metrics), reported by the
    /// cells that restore it.
    pub load: serde_json::Value,
    pub superuser_password: String,
    /// Every directory and file of PGDATA, relative to `data/`.
    pub dirs: Vec<String>,
    pub files: Vec<FileEntry>,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

impl Manifest {
    /// The manifest of a published dataset, or None when `dir` holds none
    /// (not published, or published by another store format or a pgfleet
    /// whose manifest this one cannot read: the next build replaces it).
    pub fn read(dir: &Path) -> io::Result<Option<Manifest>> {
        let text = match std::fs::read_to_string(dir.join("manifest.json")) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match serde_json::from_str::<Manifest>(&text) {
            Ok(m) if m.store_format == STORE_FORMAT => Ok(Some(m)),
            Ok(_) => Ok(None),
            Err(e) => {
                tracing::warn!(
                    manifest = %dir.join("manifest.json").display(),
                    "unreadable dataset manifest (another pgfleet version's?), treated as not published: {e}"
                );
                Ok(None)
            }
        }
    }
}

/// A local dataset store: a directory on the agent's host.
#[derive(Debug, Clone)]
pub struct LocalStore {
    pub dir: PathBuf,
}

/// A held lock on one fingerprint (released when dropped).
pub struct Lock {
    _file: File,
}

impl LocalStore {
    pub fn new(dir: impl Into<PathBuf>) -> LocalStore {
        LocalStore { dir: dir.into() }
    }

    /// Creates the store (mode 0700: manifests hold passwords). A store
    /// that exists keeps its mode (the operator's choice; its manifests
    /// are 0600 whatever it is).
    pub fn create(&self) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        for d in create_new_dirs(&self.dir)? {
            if d == self.dir {
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))?;
            }
        }
        Ok(())
    }

    /// Where a published dataset lives.
    pub fn path(&self, fingerprint: &str) -> PathBuf {
        self.dir.join(fingerprint)
    }

    /// Its manifest, if published.
    pub fn find(&self, fingerprint: &str) -> io::Result<Option<Manifest>> {
        Manifest::read(&self.path(fingerprint))
    }

    /// Takes the fingerprint's lock, exclusive (build, remove) or shared
    /// (restore), without waiting: None when someone else holds it.
    pub fn try_lock(&self, fingerprint: &str, exclusive: bool) -> io::Result<Option<Lock>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(format!("{fingerprint}.lock")))?;
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        } | libc::LOCK_NB;
        // SAFETY: a valid open descriptor; flock has no memory effects.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(Some(Lock { _file: file }));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(e)
        }
    }

    /// A fresh directory for a build of `fingerprint` (call with the
    /// exclusive lock held): earlier builds' leftovers (a builder killed
    /// half-way) are removed first.
    pub fn building_dir(&self, fingerprint: &str) -> io::Result<PathBuf> {
        self.remove_unfinished(fingerprint)?;
        use std::os::unix::fs::DirBuilderExt;
        let dir = self
            .dir
            .join(format!(".building-{fingerprint}-{}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(dir)
    }

    fn remove_unfinished(&self, fingerprint: &str) -> io::Result<()> {
        let prefix = format!(".building-{fingerprint}-");
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                remove_all(&e.path())?;
            }
        }
        Ok(())
    }

    /// Publishes a finished build: `building` holds `data/` and
    /// `manifest.json`; one rename makes it visible (call with the
    /// exclusive lock held).
    pub fn publish(&self, building: &Path, fingerprint: &str) -> io::Result<()> {
        let to = self.path(fingerprint);
        remove_all(&to)?;
        std::fs::rename(building, &to)?;
        // The rename is durable once the store directory is.
        File::open(&self.dir)?.sync_all()
    }

    /// Removes a published dataset (call with the exclusive lock held),
    /// first its manifest, so a half-removed one is never restored.
    pub fn discard(&self, fingerprint: &str) -> io::Result<()> {
        let dir = self.path(fingerprint);
        match std::fs::remove_file(dir.join("manifest.json")) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        remove_all(&dir)
    }

    /// Every published dataset, oldest first, with the bytes it holds.
    pub fn list(&self) -> io::Result<Vec<Manifest>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut found = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || !e.path().is_dir() {
                continue;
            }
            if let Some(m) = Manifest::read(&e.path())? {
                found.push(m);
            }
        }
        found.sort_by_key(|m| (m.created_at, m.fingerprint.clone()));
        Ok(found)
    }

    /// Removes a dataset unless a cell holds its lock (building or
    /// restoring it). Err(WouldBlock) then; NotFound when there is none.
    pub fn remove(&self, fingerprint: &str) -> io::Result<u64> {
        if !crate::is_safe_id(fingerprint) || !self.path(fingerprint).is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no dataset {fingerprint} in {}", self.dir.display()),
            ));
        }
        let Some(_lock) = self.try_lock(fingerprint, true)? else {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "dataset {fingerprint} is being built or restored by a cell: try again when it is done"
                ),
            ));
        };
        let bytes = self.find(fingerprint)?.map(|m| m.bytes).unwrap_or(0);
        self.discard(fingerprint)?;
        let _ = std::fs::remove_file(self.dir.join(format!("{fingerprint}.lock")));
        Ok(bytes)
    }
}

fn remove_all(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Bytes of an empty cluster (catalog, first WAL segments).
pub const CLUSTER_BASE_BYTES: u64 = 64 << 20;
/// PGDATA holding `data` bytes after a load: the data, the load's WAL up
/// to max_wal_size (1 GB default), an empty cluster's catalog.
pub fn pgdata_bytes(data: u64) -> u64 {
    CLUSTER_BASE_BYTES + data + data.min(1 << 30)
}

/// What happened to a cell's data, for its report (`environment.dataset`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Provenance {
    pub fingerprint: String,
    /// The dataset without the PostgreSQL build (`Dataset::plan_key`):
    /// what the controller matches a plan's cells by.
    pub plan_key: String,
    pub label: String,
    /// `built` (loaded here and published), `restored` (from the store),
    /// `loaded` (`data: fresh`: loaded here, not published), `reused`
    /// (the previous cell's cluster, reset: `reuse_cluster`).
    pub how: String,
    pub store: String,
    pub bytes: u64,
    /// Seconds waiting for another cell building the same dataset.
    pub wait_seconds: f64,
    pub load_seconds: f64,
    pub publish_seconds: f64,
    pub restore_seconds: f64,
    pub restore_mb_per_s: f64,
    /// `copy` (checked file by file against the manifest's SHA-256) or
    /// `reflink` (shared extents; sizes checked).
    pub method: String,
    /// Why a built dataset was not published (the cell went on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_published: Option<String>,
    /// A published dataset found not to match its manifest, discarded and
    /// built again by this cell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discarded: Option<String>,
    /// Where a restored dataset came from.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub built_by: String,
    pub built_at: u64,
    /// The remote store (`--dataset-remote`), when there is one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub remote: String,
    /// Seconds and MB/s (of the data, uncompressed) of downloading it from the remote
    /// store into the local one, when it came from there.
    #[serde(skip_serializing_if = "is_zero")]
    pub download_seconds: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub download_mb_per_s: f64,
    /// Seconds and compressed bytes of uploading a built dataset.
    #[serde(skip_serializing_if = "is_zero")]
    pub upload_seconds: f64,
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub uploaded_bytes: u64,
    /// Why the remote store was not used (unreachable, a failed upload):
    /// the cell went on without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_error: Option<String>,
    /// `rewarmed`: the server freshly started and the data read back into
    /// the page cache through it (`rewarm`); `evicted`: left out of it
    /// (no pg_prewarm); `as loaded`: `data: fresh` cells.
    pub cache: String,
    pub rewarm_bytes: u64,
    pub rewarm_seconds: f64,
    /// `reuse_cluster`: the cell whose cluster this cell reused (`how`:
    /// `reused`), the cells that used it so far, and the reset's seconds.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reused_from: String,
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub reused_by_cells: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub reset_seconds: f64,
    /// Why a cell that asked to reuse a cluster did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_reused: Option<String>,
    /// Restored from a copy that came with the volume's CSI snapshot: how
    /// its lazily fetched blocks were read before the cell used them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hydration: Option<Hydration>,
}

impl Provenance {
    /// Seconds the cell `cell_id` spent moving its data, the measured
    /// counterpart of a plan's `Phases::data`: loading and publishing it
    /// (built, loaded; `load_seconds` of a restored one is its builder's)
    /// and reading a published copy back,
    /// or downloading, hydrating (where this cell read it), restoring and
    /// reading it back, or resetting a kept cluster. Waiting for a builder
    /// is not in it (`wait_seconds`), nor in an estimate.
    pub fn data_seconds(&self, cell_id: &str) -> f64 {
        match self.how.as_str() {
            "built" | "loaded" => {
                self.load_seconds + self.publish_seconds + self.upload_seconds + self.rewarm_seconds
            }
            "reused" => self.reset_seconds,
            _ => {
                let hydrated = self
                    .hydration
                    .as_ref()
                    .filter(|h| h.by_cell == cell_id)
                    .map_or(0.0, |h| h.seconds);
                self.download_seconds + hydrated + self.restore_seconds + self.rewarm_seconds
            }
        }
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

/// A dataset's hydration, in the provenance of every cell that restored it
/// from the snapshot's copy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Hydration {
    /// The VolumeSnapshot the agent's volume was created from.
    pub snapshot: String,
    /// `read-all` or `none`.
    pub mode: String,
    /// Whether every block was read before the cell restored it; false
    /// with `none`: the cell's figures include lazy restore.
    pub hydrated: bool,
    /// The cell that read it (this one, or an earlier one on this agent).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub by_cell: String,
    /// Milliseconds until the first read returned data, seconds of the
    /// whole read, bytes read and their rate.
    pub ttfb_ms: f64,
    pub seconds: f64,
    pub bytes: u64,
    pub mb_per_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pgbench(scale: u64) -> Dataset {
        Dataset {
            loader: "pgbench".into(),
            loader_version: 1,
            label: format!("pgbench-s{scale}"),
            keys: BTreeMap::from([("scale".to_string(), serde_json::json!(scale))]),
            bytes: 0,
            load_seconds: 0.0,
        }
    }

    #[test]
    fn fingerprint_follows_keys_and_format() {
        let f15 = Format::of(15, "'--prefix=/usr' '--with-lz4'", false);
        assert_eq!(f15.block_size_kb, 8);
        let a = fingerprint(&f15, &pgbench(10));
        assert!(a.starts_with("pgbench-s10-"), "{a}");
        assert_eq!(a, fingerprint(&f15, &pgbench(10)));
        assert_ne!(a, fingerprint(&f15, &pgbench(11)));
        assert_ne!(a, fingerprint(&Format::of(18, "", false), &pgbench(10)));
        let big = Format::of(15, "'--with-blocksize=32'", false);
        assert_eq!(big.block_size_kb, 32);
        assert_ne!(a, fingerprint(&big, &pgbench(10)));
        assert_ne!(a, fingerprint(&Format::of(15, "", true), &pgbench(10)));
        let mut v2 = pgbench(10);
        v2.loader_version = 2;
        assert_ne!(a, fingerprint(&f15, &v2));
        // The estimate's size is no part of the bytes' identity.
        let mut sized = pgbench(10);
        sized.bytes = 123;
        assert_eq!(a, fingerprint(&f15, &sized));
        assert!(crate::is_safe_id(&a));
    }

    /// A default directory in a shared place is used only if nobody else
    /// could have prepared it: a planted link, another user's directory or
    /// a world-writable one is refused; a missing one, or this user's, is
    /// fine. (The validation of a pgbench script writes no file at all.)
    #[test]
    fn a_prepared_default_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("pgfleet-private-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        assert!(check_private(&base.join("missing")).is_ok());
        let mine = base.join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_private(&mine).is_ok());
        let link = base.join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        let e = check_private(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_private(&mine).unwrap_err().to_string();
        assert!(e.contains("writable by others"), "{e}");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::chown(&mine, Some(65534), Some(65534)).unwrap();
            let e = check_private(&mine).unwrap_err().to_string();
            assert!(e.contains("belongs to uid 65534"), "{e}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn locks_exclude_and_share() {
        let dir = std::env::temp_dir().join(format!("pgfleet-ds-lock-{}", std::process::id()));
        let store = LocalStore::new(&dir);
        store.create().unwrap();
        let ex = store.try_lock("x", true).unwrap();
        assert!(ex.is_some());
        assert!(store.try_lock("x", false).unwrap().is_none());
        assert!(store.try_lock("x", true).unwrap().is_none());
        drop(ex);
        let sh1 = store.try_lock("x", false).unwrap();
        let sh2 = store.try_lock("x", false).unwrap();
        assert!(sh1.is_some() && sh2.is_some());
        assert!(store.try_lock("x", true).unwrap().is_none());
        drop((sh1, sh2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
