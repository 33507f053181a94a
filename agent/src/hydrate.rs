//! Hydration. A volume created from a CSI snapshot (an EBS volume, say)
//! fetches each block from the snapshot the first time it is read, an order
//! of magnitude slower than the device's own reads: a benchmark on it would
//! measure the restore, not the storage. Where the agent's data root came
//! from a snapshot (`--volume-snapshot`, set by the Kubernetes source), the
//! datasets its store held at start are read in full — parallel reads of
//! every file, each block once — before the first cell restores one
//! (`hydrate: read-all`, the default); the cell's provenance gives the time
//! to the first byte, the seconds and the rate. With `hydrate: none` the
//! data is left lazy and every cell on it says so (the report warns).
//! Datasets built or fetched after the agent started were written here:
//! nothing of them is lazy.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::{Error, Result};
pub use pgfleet_proto::dataset::Hydration;
use pgfleet_proto::dataset::{FileEntry, LocalStore, Manifest};

/// What the agent does with a snapshot's data before a cell uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    ReadAll,
    None,
}

impl Mode {
    pub const NAMES: &[&str] = pgfleet_proto::dataset::HYDRATE_MODES;

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "read-all" => Some(Mode::ReadAll),
            "none" => Some(Mode::None),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadAll => "read-all",
            Mode::None => "none",
        }
    }
}

/// The snapshot the agent's volume came from, and which of the datasets
/// found on it at start were read since.
#[derive(Debug)]
pub struct Snapshot {
    pub name: String,
    pub mode: Mode,
    /// fingerprint -> (the copy's `created_at`, its hydration once read).
    found: tokio::sync::Mutex<BTreeMap<String, (u64, Option<Hydration>)>>,
    /// Volumes made from the same snapshot for one cell each
    /// (`--cell-volume`), not taken yet: the datasets each holds.
    volumes: std::sync::Mutex<Vec<(PathBuf, Vec<String>)>>,
}

/// A volume of the snapshot a cell took for itself: its dataset is used
/// in place (`dataset::adopt`), no copy.
#[derive(Debug, Clone)]
pub struct CellVolume {
    /// Its mount point: its store is `datasets/` below it, and the cell's
    /// cluster goes in `clusters/`.
    pub root: PathBuf,
    /// The dataset's manifest, as that volume's store has it.
    pub manifest: Manifest,
}

impl CellVolume {
    pub fn store(&self) -> LocalStore {
        LocalStore::new(self.root.join("datasets"))
    }
}

impl Snapshot {
    /// The datasets `store` holds now came with the snapshot `name`, and
    /// so did those of `volumes`, each for one cell.
    pub fn at_start(name: &str, mode: Mode, store: &LocalStore, volumes: &[PathBuf]) -> Snapshot {
        let fingerprints = |s: &LocalStore| s.list().unwrap_or_default().into_iter();
        let found = fingerprints(store)
            .map(|m| (m.fingerprint, (m.created_at, None)))
            .collect();
        let volumes = volumes
            .iter()
            .map(|root| {
                let held = fingerprints(&LocalStore::new(root.join("datasets")));
                (root.clone(), held.map(|m| m.fingerprint).collect())
            })
            .collect();
        Snapshot {
            name: name.to_string(),
            mode,
            found: tokio::sync::Mutex::new(found),
            volumes: std::sync::Mutex::new(volumes),
        }
    }

    /// Whether a volume for one cell holding dataset `fp` is left.
    pub fn has_volume(&self, fp: &str) -> bool {
        let volumes = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        volumes.iter().any(|(_, held)| held.iter().any(|h| h == fp))
    }

    /// Takes a volume for one cell holding dataset `fp`, if one is left:
    /// no other cell gets it.
    pub fn take_volume(&self, fp: &str) -> Option<CellVolume> {
        let mut volumes = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let i = volumes
                .iter()
                .position(|(_, held)| held.iter().any(|h| h == fp))?;
            let (root, _) = volumes.remove(i);
            // Unreadable since the start: that volume is of no use.
            if let Ok(Some(manifest)) = LocalStore::new(root.join("datasets")).find(fp) {
                return Some(CellVolume { root, manifest });
            }
        }
    }

    /// The hydration of a cell volume's dataset, before the cell adopts
    /// it: read in full (`read-all`), or left lazy (`none`).
    pub async fn hydrate_volume(
        &self,
        v: &CellVolume,
        cell_id: &str,
        progress: impl FnMut(u64, u64),
        cancel: &CancellationToken,
    ) -> Result<Hydration> {
        let mut h = Hydration {
            snapshot: self.name.clone(),
            mode: self.mode.as_str().into(),
            ..Default::default()
        };
        if self.mode == Mode::None {
            return Ok(h);
        }
        let dir = v.store().path(&v.manifest.fingerprint).join("data");
        record(
            &mut h,
            read_all(&dir, &v.manifest.files, progress, cancel).await?,
            cell_id,
        );
        Ok(h)
    }

    /// Before cell `cell_id` restores `m` from the store: reads it in full
    /// when it came with the snapshot and no cell read it yet (`read-all`).
    /// None: not the snapshot's copy (nothing lazy). Cells restoring the
    /// same dataset at once wait for the one reading it.
    pub async fn before_restore(
        &self,
        store: &LocalStore,
        m: &Manifest,
        cell_id: &str,
        progress: impl FnMut(u64, u64),
        cancel: &CancellationToken,
    ) -> Result<Option<Hydration>> {
        let mut found = self.found.lock().await;
        let Some((created_at, done)) = found.get_mut(&m.fingerprint) else {
            return Ok(None);
        };
        if *created_at != m.created_at {
            // Rebuilt here since (the snapshot's copy was discarded).
            return Ok(None);
        }
        if let Some(h) = done {
            return Ok(Some(h.clone()));
        }
        let mut h = Hydration {
            snapshot: self.name.clone(),
            mode: self.mode.as_str().into(),
            ..Default::default()
        };
        if self.mode == Mode::None {
            return Ok(Some(h));
        }
        let read = read_all(
            &store.path(&m.fingerprint).join("data"),
            &m.files,
            progress,
            cancel,
        )
        .await?;
        record(&mut h, read, cell_id);
        *done = Some(h.clone());
        Ok(Some(h))
    }
}

/// Cell `cell_id` read every block (`read`).
fn record(h: &mut Hydration, read: Read, cell_id: &str) {
    h.hydrated = true;
    h.by_cell = cell_id.to_string();
    h.ttfb_ms = read.ttfb_s * 1e3;
    h.seconds = read.seconds;
    h.bytes = read.bytes;
    h.mb_per_s = read.bytes as f64 / 1e6 / read.seconds.max(1e-9);
}

/// Bytes each read asks for, and the unit of work the threads share: a
/// 1 GiB segment is read by many threads at once, as lazy loading wants
/// many reads in flight.
const READ: usize = 1 << 20;
const CHUNK: u64 = 16 << 20;
/// Reads in flight. EBS fetches a lazy block per request; AWS's advice for
/// initializing a restored volume is fio at a deep queue.
const THREADS: usize = 16;

/// What `read_all` read.
#[derive(Debug, Clone, Copy)]
pub struct Read {
    pub ttfb_s: f64,
    pub seconds: f64,
    pub bytes: u64,
}

/// Reads every byte of `files` under `dir` once, `THREADS` reads in flight,
/// dropping the pages read from the page cache as it goes (what is wanted
/// is the device's blocks fetched, not the agent's cache filled). A file
/// that is missing is skipped: the restore's check names it.
pub async fn read_all(
    dir: &Path,
    files: &[FileEntry],
    mut progress: impl FnMut(u64, u64),
    cancel: &CancellationToken,
) -> Result<Read> {
    let mut chunks = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let mut off = 0;
        while off < f.bytes {
            chunks.push((i, off, CHUNK.min(f.bytes - off)));
            off += CHUNK;
        }
    }
    let total: u64 = files.iter().map(|f| f.bytes).sum();
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared {
        dir: dir.to_path_buf(),
        files: files.to_vec(),
        chunks,
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        first_byte_ns: AtomicU64::new(0),
        stop: stop.clone(),
        started: Instant::now(),
    });
    let work = {
        let shared = shared.clone();
        move || {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS).map(|_| s.spawn(|| shared.work())).collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(std::io::Error::other("a read thread panicked"))
                        })
                    })
                    .collect::<std::io::Result<Vec<()>>>()
            })
        }
    };
    let out =
        crate::blocking::with_progress(work, &shared.done, &stop, total, &mut progress, cancel)
            .await;
    let io = |e| Error::io(format!("hydrating {}", dir.display()), e);
    out.map_err(|e| io(std::io::Error::other(e)))?.map_err(io)?;
    if cancel.is_cancelled() {
        return Err(Error::Cancelled(
            "cancelled while hydrating a dataset".into(),
        ));
    }
    let bytes = shared.done.load(Ordering::Relaxed);
    progress(bytes, total);
    Ok(Read {
        ttfb_s: shared.first_byte_ns.load(Ordering::Relaxed) as f64 / 1e9,
        seconds: shared.started.elapsed().as_secs_f64(),
        bytes,
    })
}

struct Shared {
    dir: PathBuf,
    files: Vec<FileEntry>,
    /// (file, offset, length)
    chunks: Vec<(usize, u64, u64)>,
    next: AtomicU64,
    done: AtomicU64,
    /// Nanoseconds from the start to the first read that returned data.
    first_byte_ns: AtomicU64,
    stop: Arc<AtomicBool>,
    started: Instant,
}

impl Shared {
    fn work(&self) -> std::io::Result<()> {
        let mut buf = vec![0u8; READ];
        let mut open: Option<(usize, std::fs::File)> = None;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(&(i, off, len)) = self
                .chunks
                .get(self.next.fetch_add(1, Ordering::Relaxed) as usize)
            else {
                return Ok(());
            };
            if open.as_ref().is_none_or(|(j, _)| *j != i) {
                match std::fs::File::open(self.dir.join(&self.files[i].path)) {
                    Ok(f) => open = Some((i, f)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
            }
            let Some((_, f)) = open.as_ref() else {
                continue;
            };
            let mut at = off;
            while at < off + len {
                let want = READ.min((off + len - at) as usize);
                let n = f.read_at(&mut buf[..want], at)?;
                if n == 0 {
                    break;
                }
                if self.first_byte_ns.load(Ordering::Relaxed) == 0 {
                    let ns = (self.started.elapsed().as_nanos() as u64).max(1);
                    let _ = self.first_byte_ns.compare_exchange(
                        0,
                        ns,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                at += n as u64;
                self.done.fetch_add(n as u64, Ordering::Relaxed);
            }
            // SAFETY: a valid open descriptor; advice only.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    off as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_all_reads_every_byte_once_and_skips_a_missing_file() {
        let dir = std::env::temp_dir().join(format!("pgfleet-hydrate-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("base")).unwrap();
        let sizes = [(CHUNK * 2 + 12345) as usize, 8192, 0];
        let mut files = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            let path = format!("base/{i}");
            std::fs::write(dir.join(&path), vec![7u8; *n]).unwrap();
            files.push(FileEntry {
                path,
                bytes: *n as u64,
                sha256: String::new(),
            });
        }
        files.push(FileEntry {
            path: "base/missing".into(),
            bytes: 4096,
            sha256: String::new(),
        });
        let mut last = (0, 0);
        let r = read_all(
            &dir,
            &files,
            |d, t| last = (d, t),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        let present: u64 = sizes.iter().map(|n| *n as u64).sum();
        assert_eq!(r.bytes, present, "each byte once, the missing file skipped");
        assert_eq!(last, (present, present + 4096));
        assert!(r.ttfb_s > 0.0 && r.ttfb_s <= r.seconds, "{r:?}");
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(matches!(
            read_all(&dir, &files, |_, _| {}, &cancel).await,
            Err(Error::Cancelled(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
