//! The agent's side of datasets (`pgfleet_proto::dataset`): waiting for
//! the right to build or restore one, restoring a published PGDATA into a
//! cell's cluster (a parallel copy that checks every file's SHA-256, or,
//! where the agent opted in and the filesystem can, a reflink: instant, but
//! then the cluster's first writes copy shared blocks and it measures
//! slower than a built one), and publishing a cell's freshly
//! loaded PGDATA after a clean shutdown.
//!
//! Both ways leave the cell alike: the server freshly started (shared
//! buffers empty) and the dataset's files dropped from the OS page cache (a
//! restore writes them through the agent, outside the instance's memory
//! cgroup, so leaving them cached would hand the restored cell a warmer
//! start than a built one), then read back through the server (`rewarm`),
//! as a load leaves them. The report says so (`cache: rewarmed`).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, RunAs};
use crate::pgbin::PgBin;
use crate::{Error, Result};
pub use pgfleet_proto::dataset::Provenance;
use pgfleet_proto::dataset::{Dataset, FileEntry, Format, LocalStore, Lock, Manifest, hex};

/// Files a restore never takes from a build (the stopped server's).
const SKIPPED: &[&str] = &["postmaster.pid", "postmaster.opts"];

/// The build's on-disk format, from the binaries (`pg_config --configure`;
/// PostgreSQL's defaults when it is absent) and pgfleet's initdb (no data
/// checksums).
pub fn format(pg: &PgBin) -> Format {
    Format::of(pg.major, &pg.configure(), false)
}

/// A cell's dataset, identified once per cell (`format` runs pg_config):
/// what the kind declared, the build's format, and their fingerprint.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub dataset: Dataset,
    pub format: Format,
    pub fingerprint: String,
}

impl Wanted {
    pub fn of(pg: &PgBin, dataset: Dataset) -> Wanted {
        let format = format(pg);
        let fingerprint = pgfleet_proto::dataset::fingerprint(&format, &dataset);
        Wanted {
            dataset,
            format,
            fingerprint,
        }
    }
}

/// The right to use a dataset: restore it (published; shared lock), or
/// build it (not published; exclusive lock).
pub enum Ticket {
    Restore(Box<Manifest>, Lock),
    Build(Lock),
}

/// Waits until this cell may restore `fingerprint` or must build it. A cell
/// building it holds the exclusive lock: the others wait here, then restore
/// what it published.
pub async fn acquire(
    store: &LocalStore,
    fingerprint: &str,
    cancel: &CancellationToken,
    mut waiting: impl FnMut(f64),
) -> Result<Ticket> {
    let io = |e| Error::io(format!("dataset store {}", store.dir.display()), e);
    store.create().map_err(io)?;
    let started = Instant::now();
    loop {
        if store.find(fingerprint).map_err(io)?.is_some() {
            if let Some(lock) = store.try_lock(fingerprint, false).map_err(io)? {
                // Published and not being replaced: re-read under the lock.
                if let Some(m) = store.find(fingerprint).map_err(io)? {
                    return Ok(Ticket::Restore(Box::new(m), lock));
                }
            }
        } else if let Some(lock) = store.try_lock(fingerprint, true).map_err(io)? {
            match store.find(fingerprint).map_err(io)? {
                // Published between the look and the lock: restore it.
                Some(_) => drop(lock),
                None => return Ok(Ticket::Build(lock)),
            }
            continue;
        }
        waiting(started.elapsed().as_secs_f64());
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = cancel.cancelled() => return Err(Error::Cancelled(format!(
                "cancelled while waiting for dataset {fingerprint}, which another cell is building"
            ))),
        }
    }
}

/// Takes the exclusive lock (waiting for restores in progress) and removes
/// a published dataset found corrupt, unless it was replaced meanwhile.
pub async fn discard(
    store: &LocalStore,
    corrupt: &Manifest,
    cancel: &CancellationToken,
) -> Result<()> {
    let fp = &corrupt.fingerprint;
    let io = |e| Error::io(format!("dataset store {}", store.dir.display()), e);
    loop {
        if let Some(_lock) = store.try_lock(fp, true).map_err(io)? {
            if store
                .find(fp)
                .map_err(io)?
                .is_some_and(|m| m.created_at == corrupt.created_at)
            {
                store.discard(fp).map_err(io)?;
            }
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = cancel.cancelled() => return Err(Error::Cancelled("cancelled while discarding a corrupt dataset".into())),
        }
    }
}

/// A copy's figures.
#[derive(Debug, Clone, Copy)]
pub struct Copied {
    pub bytes: u64,
    pub seconds: f64,
    pub reflink: bool,
}

/// Restores a published dataset into `data` (created), owned by `owner`,
/// each file checked against the manifest; the files end up on the device
/// and out of the page cache. A mismatch is `Error::DatasetCorrupt`.
pub async fn restore(
    store: &LocalStore,
    m: &Manifest,
    data: &Path,
    owner: Option<&RunAs>,
    reflink: bool,
    progress: impl FnMut(u64, u64),
    cancel: &CancellationToken,
) -> Result<Copied> {
    let job = Job {
        src: store.path(&m.fingerprint).join("data"),
        dst: data.to_path_buf(),
        dirs: m.dirs.clone(),
        files: m.files.clone(),
        verify: true,
        reflink,
        owner: owner.map(|u| (u.uid, u.gid)),
    };
    let total = m.bytes;
    let (copied, _) = run_job(job, total, progress, cancel)
        .await
        .map_err(|e| match e {
            JobError::Mismatch(detail) => Error::DatasetCorrupt {
                fingerprint: m.fingerprint.clone(),
                detail,
            },
            JobError::Cancelled => Error::Cancelled("cancelled while restoring a dataset".into()),
            JobError::Io(what, e) => {
                Error::io(format!("restoring dataset {} ({what})", m.fingerprint), e)
            }
        })?;
    Ok(copied)
}

/// Takes a published dataset's PGDATA as the cell's own, without a copy:
/// the dataset sits on a volume the cell has to itself (a volume made from
/// a dataset snapshot for this cell, `hydrate::Snapshot::take_volume`), so
/// `data` (on the same filesystem) becomes its files by one rename. Each
/// file's size is checked against the manifest (its SHA-256 would take a
/// second read of every byte: the snapshot is a block copy of a store
/// whose restore checked them, as a reflink's shared extents are); a
/// mismatch is `Error::DatasetCorrupt` and nothing is moved.
pub async fn adopt(m: &Manifest, src: &Path, data: &Path, owner: Option<&RunAs>) -> Result<()> {
    let (m, src, data) = (m.clone(), src.to_path_buf(), data.to_path_buf());
    let owner = owner.map(|u| (u.uid, u.gid));
    let fp = m.fingerprint.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        for f in &m.files {
            let found = std::fs::metadata(src.join(&f.path)).map(|md| md.len());
            if found.as_ref().ok() != Some(&f.bytes) {
                return Err(Error::DatasetCorrupt {
                    fingerprint: m.fingerprint.clone(),
                    detail: format!(
                        "{}: {} where the manifest says {} bytes",
                        f.path,
                        found.map_or_else(|e| e.to_string(), |n| format!("{n} bytes")),
                        f.bytes
                    ),
                });
            }
        }
        let io = |what: String, e| Error::io(what, e);
        std::fs::rename(&src, &data)
            .map_err(|e| io(format!("moving {} to {}", src.display(), data.display()), e))?;
        for name in SKIPPED {
            let _ = std::fs::remove_file(data.join(name));
        }
        if let Some((uid, gid)) = owner {
            let chown = |p: &Path| {
                std::os::unix::fs::lchown(p, Some(uid), Some(gid))
                    .map_err(|e| io(format!("chown {}", p.display()), e))
            };
            chown(&data)?;
            let (dirs, files) =
                list_tree(&data).map_err(|e| io(format!("listing {}", data.display()), e))?;
            for rel in dirs.iter().chain(files.iter().map(|f| &f.path)) {
                chown(&data.join(rel))?;
            }
        }
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io(format!("chmod {}", data.display()), e))
    })
    .await
    .map_err(|e| Error::io(format!("adopting dataset {fp}"), std::io::Error::other(e)))?
}

/// What a build publishes besides the files.
pub struct Build<'a> {
    pub wanted: &'a Wanted,
    pub cell_id: &'a str,
    pub load_seconds: f64,
    pub load: serde_json::Value,
}

/// Publishes the cluster's freshly loaded data: CHECKPOINT, a clean
/// shutdown, a copy into the store (SHA-256 of each file, manifest last,
/// one rename), the cluster's files evicted from the page cache, the
/// server started again: Ok(Ok(seconds and bytes published)), or
/// Ok(Err(reason)) when it could not be published (not enough free space
/// in the store, a failed copy): the cell goes on with its data either
/// way. The lock is released at the end.
pub async fn publish(
    store: &LocalStore,
    lock: Lock,
    cluster: &Cluster,
    b: Build<'_>,
    progress: impl FnMut(u64, u64),
    cancel: &CancellationToken,
) -> Result<std::result::Result<Copied, String>> {
    let started = Instant::now();
    let client = cluster.connect().await?;
    client.batch_execute("CHECKPOINT").await?;
    drop(client);
    cluster.pause().await?;
    let copied = copy_out(store, cluster, &b, progress, cancel).await;
    drop(lock);
    cluster.resume().await?;
    Ok(copied.map(|c| Copied {
        seconds: started.elapsed().as_secs_f64(),
        ..c
    }))
}

async fn copy_out(
    store: &LocalStore,
    cluster: &Cluster,
    b: &Build<'_>,
    progress: impl FnMut(u64, u64),
    cancel: &CancellationToken,
) -> std::result::Result<Copied, String> {
    let fingerprint = &b.wanted.fingerprint;
    let data = cluster.data_dir().to_path_buf();
    let listed = tokio::task::spawn_blocking({
        let data = data.clone();
        move || list_tree(&data)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("listing {}: {e}", data.display()))?;
    let (dirs, files) = listed;
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    let free = crate::host::free_bytes(&store.dir).map_err(|e| e.to_string())?;
    // Leave room for the cells that restore it, and a margin.
    if free < bytes + bytes / 10 + (256 << 20) {
        evict_tree(&data, &files);
        return Err(format!(
            "the store {} has {} free and the dataset takes {}: free space there or point --dataset-dir elsewhere",
            store.dir.display(),
            pgfleet_proto::workload::approx_bytes(free),
            pgfleet_proto::workload::approx_bytes(bytes)
        ));
    }
    let building = store
        .building_dir(fingerprint)
        .map_err(|e| format!("creating a build directory in {}: {e}", store.dir.display()))?;
    let result = async {
        let job = Job {
            src: data.clone(),
            dst: building.join("data"),
            dirs: dirs.clone(),
            files,
            verify: false,
            reflink: false,
            owner: None,
        };
        let (copied, entries) = run_job(job, bytes, progress, cancel)
            .await
            .map_err(|e| e.to_string())?;
        let manifest = Manifest {
            store_format: pgfleet_proto::dataset::STORE_FORMAT,
            fingerprint: fingerprint.clone(),
            dataset: b.wanted.dataset.clone(),
            format: b.wanted.format.clone(),
            postgres_version: cluster.pg.version.clone(),
            created_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            built_by: b.cell_id.to_string(),
            host: crate::host::hostname(),
            build_seconds: b.load_seconds,
            publish_seconds: copied.seconds,
            load: b.load.clone(),
            superuser_password: cluster.superuser_password().to_string(),
            dirs,
            files: entries,
            bytes: copied.bytes,
        };
        write_private(
            &building.join("manifest.json"),
            serde_json::to_string_pretty(&manifest)
                .map_err(|e| e.to_string())?
                .as_bytes(),
        )
        .map_err(|e| format!("writing the manifest: {e}"))?;
        store
            .publish(&building, fingerprint)
            .map_err(|e| format!("publishing into {}: {e}", store.dir.display()))?;
        Ok(copied)
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&building);
    }
    result
}

/// Writes a file only its owner may read, and syncs it.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Every directory and regular file under `root` (relative paths), the
/// stopped server's own files left out. Anything else (a symlink: a
/// tablespace or a moved pg_wal) is refused: pgfleet's clusters have none.
fn list_tree(root: &Path) -> std::io::Result<(Vec<String>, Vec<FileEntry>)> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel))? {
            let e = e?;
            let path = rel.join(e.file_name());
            let name = path.to_string_lossy().to_string();
            let t = e.file_type()?;
            if t.is_dir() {
                dirs.push(name);
                stack.push(path);
            } else if t.is_file() {
                if !SKIPPED.contains(&name.as_str()) {
                    files.push(FileEntry {
                        path: name,
                        bytes: e.metadata()?.len(),
                        sha256: String::new(),
                    });
                }
            } else {
                return Err(std::io::Error::other(format!(
                    "{} is neither a file nor a directory: datasets hold plain PGDATA only",
                    root.join(&path).display()
                )));
            }
        }
    }
    dirs.sort();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((dirs, files))
}

/// Drops the files' pages from the page cache (after a sync).
fn evict_tree(root: &Path, files: &[FileEntry]) {
    for f in files {
        if let Ok(file) = std::fs::File::open(root.join(&f.path)) {
            let _ = file.sync_all();
            advise_dontneed(&file);
        }
    }
}

fn advise_dontneed(f: &std::fs::File) {
    // SAFETY: a valid open descriptor; advice only.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

struct Job {
    src: PathBuf,
    dst: PathBuf,
    dirs: Vec<String>,
    files: Vec<FileEntry>,
    /// Check each file against its entry (restore); else compute the
    /// entries (publish).
    verify: bool,
    /// Try FICLONE first (a restore the agent opted in to reflinks for).
    reflink: bool,
    owner: Option<(u32, u32)>,
}

enum JobError {
    Mismatch(String),
    Cancelled,
    Io(String, std::io::Error),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Mismatch(d) => write!(f, "{d}"),
            JobError::Cancelled => write!(f, "cancelled"),
            JobError::Io(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

/// Runs a copy on blocking threads, reporting bytes done every half second
/// and stopping when the cell is cancelled.
async fn run_job(
    job: Job,
    total: u64,
    progress: impl FnMut(u64, u64),
    cancel: &CancellationToken,
) -> std::result::Result<(Copied, Vec<FileEntry>), JobError> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let work = {
        let (done, stop) = (done.clone(), stop.clone());
        move || copy_job(&job, &done, &stop)
    };
    let out = crate::blocking::with_progress(work, &done, &stop, total, progress, cancel).await;
    let (entries, reflink) =
        out.map_err(|e| JobError::Io("copy task".into(), std::io::Error::other(e)))??;
    Ok((
        Copied {
            bytes: done.load(Ordering::Relaxed),
            seconds: started.elapsed().as_secs_f64(),
            reflink,
        },
        entries,
    ))
}

/// The copy itself: directories first (0700), then files in parallel,
/// largest first, each hashed as it is read, synced and evicted on both
/// sides. Returns the entries with their SHA-256 and whether reflinks were
/// used.
fn copy_job(
    job: &Job,
    done: &AtomicU64,
    stop: &AtomicBool,
) -> std::result::Result<(Vec<FileEntry>, bool), JobError> {
    let io = |what: &Path| {
        let what = what.display().to_string();
        move |e| JobError::Io(what, e)
    };
    let chown = |p: &Path| -> std::result::Result<(), JobError> {
        if let Some((uid, gid)) = job.owner {
            nix::unistd::chown(p, Some(uid.into()), Some(gid.into()))
                .map_err(|e| JobError::Io(p.display().to_string(), e.into()))?;
        }
        Ok(())
    };
    for d in std::iter::once("").chain(job.dirs.iter().map(String::as_str)) {
        let p = job.dst.join(d);
        std::fs::create_dir_all(&p).map_err(io(&p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).map_err(io(&p))?;
        chown(&p)?;
    }
    let mut order: Vec<usize> = (0..job.files.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(job.files[i].bytes));
    let next = AtomicU64::new(0);
    // Reflinks only where the restore asked for them.
    let reflink_ok = AtomicBool::new(job.reflink && job.verify);
    let mut entries = job.files.clone();
    let threads = crate::host::cores().clamp(2, 8) as usize;
    let results: Vec<std::result::Result<Vec<(usize, FileEntry)>, JobError>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            if stop.load(Ordering::Relaxed) {
                                return Err(JobError::Cancelled);
                            }
                            let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed) as usize)
                            else {
                                return Ok(mine);
                            };
                            let f = &job.files[i];
                            let entry = copy_file(job, f, &reflink_ok, done, stop)?;
                            chown(&job.dst.join(&f.path))?;
                            mine.push((i, entry));
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(JobError::Io(
                            "copy".into(),
                            std::io::Error::other("a copy thread panicked"),
                        ))
                    })
                })
                .collect()
        });
    for r in results {
        for (i, e) in r? {
            entries[i] = e;
        }
    }
    Ok((entries, reflink_ok.load(Ordering::Relaxed)))
}

/// `FICLONE`: the destination shares the source's extents (btrfs, XFS).
const FICLONE: libc::c_ulong = 0x4004_9409;

fn copy_file(
    job: &Job,
    f: &FileEntry,
    reflink_ok: &AtomicBool,
    done: &AtomicU64,
    stop: &AtomicBool,
) -> std::result::Result<FileEntry, JobError> {
    use std::os::unix::fs::OpenOptionsExt;
    let (src_path, dst_path) = (job.src.join(&f.path), job.dst.join(&f.path));
    let mut src = match std::fs::File::open(&src_path) {
        Ok(s) => s,
        Err(e) if job.verify && e.kind() == std::io::ErrorKind::NotFound => {
            return Err(JobError::Mismatch(format!("{} is missing", f.path)));
        }
        Err(e) => return Err(JobError::Io(src_path.display().to_string(), e)),
    };
    let mut dst = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&dst_path)
        .map_err(|e| JobError::Io(dst_path.display().to_string(), e))?;
    let dst_err = |e| JobError::Io(dst_path.display().to_string(), e);
    // A reflink restore shares the fixture's blocks: nothing is read, so
    // only the size is checked. Publishing always copies (the build's
    // cluster is removed after the cell).
    if reflink_ok.load(Ordering::Relaxed) {
        // SAFETY: two valid open descriptors.
        let rc = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
        if rc == 0 {
            let len = dst.metadata().map_err(dst_err)?.len();
            if len != f.bytes {
                return Err(JobError::Mismatch(format!(
                    "{} has {len} bytes, the manifest says {}",
                    f.path, f.bytes
                )));
            }
            done.fetch_add(len, Ordering::Relaxed);
            return Ok(f.clone());
        }
        reflink_ok.store(false, Ordering::Relaxed);
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n_total = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(JobError::Cancelled);
        }
        let n = src
            .read(&mut buf)
            .map_err(|e| JobError::Io(src_path.display().to_string(), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(dst_err)?;
        n_total += n as u64;
        done.fetch_add(n as u64, Ordering::Relaxed);
    }
    dst.sync_data().map_err(dst_err)?;
    advise_dontneed(&dst);
    // The source's pages go too: the build's data (synced by its clean
    // shutdown, but initdb's files were written without a sync) or the
    // fixture's.
    let _ = src.sync_all();
    advise_dontneed(&src);
    let sha = hex(&hasher.finalize());
    if job.verify {
        if n_total != f.bytes {
            return Err(JobError::Mismatch(format!(
                "{} has {n_total} bytes, the manifest says {}",
                f.path, f.bytes
            )));
        }
        if sha != f.sha256 {
            return Err(JobError::Mismatch(format!(
                "{}: SHA-256 {} differs from the manifest's {}",
                f.path,
                &sha[..12],
                &f.sha256[..f.sha256.len().min(12)]
            )));
        }
    }
    Ok(FileEntry {
        path: f.path.clone(),
        bytes: n_total,
        sha256: sha,
    })
}

/// Reads the relations of the `public` schema back into the page cache
/// through the server (`pg_prewarm(..., 'read')`, tables before indexes, as
/// a load writes them), so a built or restored cell starts as a cell that
/// loaded its own data does: its backends read, so the pages are charged
/// to the instance's memory cgroup. In an instance of bounded memory only
/// the last of them in that order that fit it are read: what a load leaves
/// cached, without reading the rest through a capped device only to drop
/// it. Runs before any scenario SQL. Returns the bytes read, or None where
/// pg_prewarm is not installed (the cell then starts with its data
/// evicted, and says so).
pub async fn rewarm(cluster: &Cluster) -> Result<Option<u64>> {
    let client = cluster.connect().await?;
    let created = client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS pgfleet_agent; \
             REVOKE ALL ON SCHEMA pgfleet_agent FROM PUBLIC; \
             CREATE EXTENSION IF NOT EXISTS pg_prewarm WITH SCHEMA pgfleet_agent",
        )
        .await;
    if created.is_err() {
        return Ok(None);
    }
    let relations: Vec<(u32, i64)> = client
        .query(
            "SELECT c.oid, pg_catalog.pg_relation_size(c.oid) / 8192
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname IN ('public', 'pg_toast') AND c.relkind IN ('r', 'm', 't', 'i')
               AND c.relpersistence = 'p'
               AND (n.nspname = 'public' OR c.oid IN (
                 SELECT reltoastrelid FROM pg_catalog.pg_class t
                 JOIN pg_catalog.pg_namespace tn ON tn.oid = t.relnamespace
                 WHERE tn.nspname = 'public'))
             ORDER BY c.relkind = 'i', c.oid",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut blocks = 0i64;
    for (oid, first) in tail_blocks(&relations, cluster.memory_bytes() / 8192) {
        blocks += client
            .query_one(
                "SELECT pgfleet_agent.pg_prewarm($1::oid::regclass, 'read', 'main', $2, NULL)",
                &[&oid, &first],
            )
            .await?
            .get::<_, i64>(0);
    }
    Ok(Some(blocks as u64 * 8192))
}

/// Of `relations` (oid, blocks) in load order, what to read so that the
/// last `budget` blocks are read (0: all): each relation and the block it
/// starts from (None: its first).
fn tail_blocks(relations: &[(u32, i64)], budget: u64) -> Vec<(u32, Option<i64>)> {
    if budget == 0 {
        return relations.iter().map(|(oid, _)| (*oid, None)).collect();
    }
    let mut left = budget as i64;
    let mut read = Vec::new();
    for &(oid, blocks) in relations.iter().rev() {
        if left <= 0 {
            break;
        }
        if blocks <= left {
            read.push((oid, None));
        } else {
            read.push((oid, Some(blocks - left)));
        }
        left -= blocks;
    }
    read.reverse();
    read
}

/// Removes builds that no builder holds any more (an agent killed while
/// publishing): their fingerprint's lock is free. Called at start-up.
pub fn remove_abandoned(store: &LocalStore) -> usize {
    let Ok(entries) = std::fs::read_dir(&store.dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix(".building-") else {
            continue;
        };
        let Some((fp, _pid)) = rest.rsplit_once('-') else {
            continue;
        };
        if let Ok(Some(_lock)) = store.try_lock(fp, true)
            && std::fs::remove_dir_all(e.path()).is_ok()
        {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::tail_blocks;

    #[test]
    fn rewarm_reads_the_tail_that_fits_the_instance() {
        // A table of 100 blocks, then its two indexes of 30 and 20.
        let rels = [(1, 100), (2, 30), (3, 20)];
        assert_eq!(tail_blocks(&rels, 0), [(1, None), (2, None), (3, None)]);
        assert_eq!(tail_blocks(&rels, 1_000), [(1, None), (2, None), (3, None)]);
        assert_eq!(tail_blocks(&rels, 50), [(2, None), (3, None)]);
        assert_eq!(
            tail_blocks(&rels, 60),
            [(1, Some(90)), (2, None), (3, None)]
        );
        assert_eq!(tail_blocks(&rels, 10), [(3, Some(10))]);
    }
}
