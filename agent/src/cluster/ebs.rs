//! An emulated network volume. A rate cap (cgroup block-I/O throttling)
//! holds a volume's IOPS and MiB/s but adds no time below them: a QD1 read
//! answers as fast as the host's disk. A network volume answers each I/O
//! after a round trip, and counts its I/Os its own way. Here the agent
//! serves the bytes of a cluster's volume image itself, over FUSE, as one
//! file (`<cluster dir>/ebs/disk`) that the cluster's loop device reads
//! and writes with direct I/O; every I/O the cluster's filesystem sends to
//! its device (the server's reads and writes, the kernel's writeback,
//! checkpoints, the journal) arrives here, whoever issued it. This kernel
//! has no device-mapper (dm-delay), NBD or ublk: FUSE is the userspace
//! block path it has.
//!
//! Each I/O is paced by `Pacer`, a pure function of the profile and the
//! I/Os seen so far:
//! - **Counting** as EBS documents it ("Amazon EBS I/O characteristics"):
//!   an SSD volume counts an I/O of up to 256 KiB as one operation, splits
//!   larger ones, and merges physically sequential I/Os it sees together
//!   into one operation up to 256 KiB. "Together" is taken as: issued while
//!   the previous I/O of its sequential run has not been answered.
//! - **Budget**: the operations and bytes draw from the profile's IOPS and
//!   MiB/s (one budget for reads and writes where `Caps::combined`, as gp3
//!   counts them), as a GCRA with `BURST_S` of tolerance: an I/O starts
//!   when the budget allows it.
//! - **Latency**: it answers at its start plus the profile's latency for
//!   its direction, drawn as 70 % of the mean fixed plus an exponential
//!   tail with the other 30 % (a mean of exactly the profile's, a p99 about
//!   twice it). A flush (fsync) answers after the profile's flush latency
//!   and draws no budget.
//!
//! The image is read and written with the host's page cache (buffered
//! I/O): the time an I/O takes is the profile's, not the host disk's,
//! unless the host is slower than the profile (the storage probe reports
//! what was delivered). The emulated instance's memory cgroup does not see
//! that cache (it is the agent's, the volume's side of the network).
//!
//! Writes reach the image when they arrive and are answered later; a
//! crash fault kills the cluster's processes, not the volume, so nothing
//! acknowledged is lost either way.

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use pgfleet_proto::environment::Caps;

use crate::{Error, Result};

/// The largest I/O an EBS SSD volume counts as one operation.
pub const MAX_IO: u64 = 256 << 10;

/// How far ahead of its budget a burst may run (the GCRA's tolerance):
/// 30 I/Os at gp3's 3,000 IOPS. EBS's SSD volumes other than gp2 have no
/// burst credits; a tolerance this short only absorbs the arrival jitter.
pub const BURST_S: f64 = 0.010;

/// The file the volume's image is served as, under the mount.
pub const DISK: &str = "disk";

/// Whether this host can serve emulated volumes: root (to mount FUSE and
/// attach a loop device) and `/dev/fuse` (in a pod: the device mounted in).
pub fn available() -> bool {
    nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists()
}

/// Whether a profile's volume must be served here: it has per-I/O latency.
pub fn emulates_latency(caps: &Caps) -> bool {
    !caps.latency.is_zero()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Read = 0,
    Write = 1,
}

/// A GCRA over one budget: `tat`, the theoretical arrival time, in seconds
/// from the pacer's epoch.
#[derive(Debug, Default, Clone, Copy)]
struct Gcra {
    tat: f64,
}

impl Gcra {
    /// When an I/O asked at `now`, costing `cost` seconds of this budget,
    /// may start.
    fn start(&mut self, now: f64, cost: f64) -> f64 {
        if cost <= 0.0 {
            return now;
        }
        let start = now.max(self.tat - BURST_S);
        self.tat = self.tat.max(now) + cost;
        start
    }
}

/// One direction's current sequential run.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    /// Where it ends (the next sequential I/O's offset).
    end: u64,
    /// Its bytes so far.
    bytes: u64,
    /// When its last I/O answers (seconds from the epoch).
    until: f64,
}

impl Run {
    /// The operations an I/O of `len` bytes at `offset`, asked at `now`,
    /// adds: a run of B bytes counts ceil(B / 256 KiB) in all.
    fn ops(&mut self, now: f64, offset: u64, len: u64) -> u64 {
        if self.bytes > 0 && offset == self.end && now < self.until {
            let before = self.bytes.div_ceil(MAX_IO);
            self.bytes += len;
            self.end += len;
            self.bytes.div_ceil(MAX_IO) - before
        } else {
            *self = Run {
                end: offset + len,
                bytes: len,
                until: now,
            };
            len.div_ceil(MAX_IO).max(1)
        }
    }
}

/// Paces a volume's I/Os: counts each as EBS does, starts it when the
/// budget allows and answers it a latency later. Times are seconds from
/// the volume's epoch; pure, so tests drive it with their own clock.
#[derive(Debug)]
pub struct Pacer {
    caps: Caps,
    /// What the path to here and back costs an I/O already (the loop
    /// device, FUSE, the answer's wake-up): taken off each latency drawn,
    /// so an I/O answers the profile's latency after its issue.
    overhead: f64,
    ops: [Gcra; 2],
    bytes: [Gcra; 2],
    runs: [Run; 2],
    rng: u64,
}

impl Pacer {
    pub fn new(caps: Caps) -> Pacer {
        Pacer {
            caps,
            overhead: 0.0,
            ops: Default::default(),
            bytes: Default::default(),
            runs: Default::default(),
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Other caps from now on (a fault's window); what was spent stays spent.
    pub fn set_caps(&mut self, caps: Caps) {
        self.caps = caps;
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// The path's own cost per I/O, in seconds (`Served::calibrate`).
    pub fn set_overhead(&mut self, seconds: f64) {
        self.overhead = seconds.max(0.0);
    }

    /// An I/O of `len` bytes at `offset` asked at `now`: the operations it
    /// counts and when it answers.
    pub fn io(&mut self, now: f64, dir: Dir, offset: u64, len: u64) -> (u64, f64) {
        let d = dir as usize;
        let ops = self.runs[d].ops(now, offset, len);
        let c = self.caps;
        let (iops, mbps, mean_us) = match dir {
            Dir::Read => (c.read_iops, c.read_mbps, c.latency.read_us),
            Dir::Write => (c.write_iops, c.write_mbps, c.latency.write_us),
        };
        let budget = if c.combined { 0 } else { d };
        let per = |amount: f64, rate: f64| if rate > 0.0 { amount / rate } else { 0.0 };
        let start = self.ops[budget]
            .start(now, per(ops as f64, iops as f64))
            .max(self.bytes[budget].start(now, per(len as f64, (mbps << 20) as f64)));
        let at = start + (self.latency(mean_us) - self.overhead).max(0.0);
        self.runs[d].until = self.runs[d].until.max(at);
        (ops, at)
    }

    /// A flush asked at `now`: when it answers.
    pub fn flush(&mut self, now: f64) -> f64 {
        now + (self.latency(self.caps.latency.flush_us) - self.overhead).max(0.0)
    }

    /// One draw of a latency of mean `mean_us` (see the module's comment).
    fn latency(&mut self, mean_us: u32) -> f64 {
        if mean_us == 0 {
            return 0.0;
        }
        let mean = mean_us as f64 * 1e-6;
        // xorshift64*: the draws need no more than evenness.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let bits = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        let u = (bits as f64 + 1.0) / (1u64 << 53) as f64;
        0.7 * mean - 0.3 * mean * u.ln()
    }
}

/// What a served volume counted since it started.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Counted {
    /// I/Os as they arrived, per direction (read, write).
    pub ios: [u64; 2],
    /// Operations as EBS counts them.
    pub ops: [u64; 2],
    pub bytes: [u64; 2],
    pub flushes: u64,
    /// Seconds from arrival to answer, summed per direction.
    pub answer_s: [f64; 2],
}

#[derive(Default)]
struct Counters {
    ios: [AtomicU64; 2],
    ops: [AtomicU64; 2],
    bytes: [AtomicU64; 2],
    flushes: AtomicU64,
    answer_ns: [AtomicU64; 2],
}

/// An answer held until its time.
enum Answer {
    Data(ReplyData, Vec<u8>),
    Written(ReplyWrite, u32),
    Done(ReplyEmpty),
}

impl Answer {
    fn send(self) {
        match self {
            Answer::Data(r, buf) => r.data(&buf),
            Answer::Written(r, n) => r.written(n),
            Answer::Done(r) => r.ok(),
        }
    }
}

struct Due {
    at: Instant,
    seq: u64,
    answer: Answer,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// What the FUSE handlers and the answering thread share.
struct Shared {
    image: File,
    size: u64,
    epoch: Instant,
    pacer: Mutex<Pacer>,
    due: Mutex<(u64, BinaryHeap<Reverse<Due>>)>,
    wake: Condvar,
    stopping: AtomicBool,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Holds `answer` until `at` (seconds from the epoch).
    fn answer_at(&self, at: f64, answer: Answer) {
        let at = self.epoch + Duration::from_secs_f64(at.max(0.0));
        let mut q = lock(&self.due);
        // Being dropped: the answering thread may be gone, answer now.
        if self.stopping.load(Ordering::Acquire) {
            drop(q);
            return answer.send();
        }
        q.0 += 1;
        let seq = q.0;
        q.1.push(Reverse(Due { at, seq, answer }));
        drop(q);
        self.wake.notify_one();
    }

    /// Counts an I/O that arrived at `arrived` and answers at `at`.
    fn count(&self, dir: Dir, ops: u64, len: u64, arrived: f64, at: f64) {
        let d = dir as usize;
        let c = &self.counters;
        c.ios[d].fetch_add(1, Ordering::Relaxed);
        c.ops[d].fetch_add(ops, Ordering::Relaxed);
        c.bytes[d].fetch_add(len, Ordering::Relaxed);
        let ns = ((at - arrived).max(0.0) * 1e9) as u64;
        c.answer_ns[d].fetch_add(ns, Ordering::Relaxed);
    }

    /// The answering thread: sends each answer at its time; once stopping,
    /// everything left at once.
    fn answer_loop(&self) {
        // Woken at each answer's time, not up to the default 50 µs after.
        // SAFETY: PR_SET_TIMERSLACK takes a number and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut q = lock(&self.due);
        loop {
            let now = Instant::now();
            let stopping = self.stopping.load(Ordering::Acquire);
            let mut ready = Vec::new();
            while let Some(Reverse(d)) = q.1.peek() {
                if d.at > now && !stopping {
                    break;
                }
                if let Some(Reverse(d)) = q.1.pop() {
                    ready.push(d.answer);
                }
            }
            if !ready.is_empty() {
                drop(q);
                ready.into_iter().for_each(Answer::send);
                q = lock(&self.due);
                continue;
            }
            match q.1.peek() {
                Some(Reverse(d)) => {
                    let wait = d.at.saturating_duration_since(now);
                    q = self
                        .wake
                        .wait_timeout(q, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                None if stopping => return,
                None => q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(3600);

/// The FUSE side: a directory holding one file, the image.
struct Disk(Arc<Shared>);

impl Disk {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, size, perm, nlink) = if ino == ROOT {
            (FileType::Directory, 0, 0o700, 2)
        } else {
            (FileType::RegularFile, self.0.size, 0o600, 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }
}

impl Filesystem for Disk {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Direct I/O answered out of order (the loop device keeps many
        // in flight), in requests of up to 1 MiB, many at once.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_background(512);
        let _ = config.set_congestion_threshold(384);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == DISK {
            reply.entry(&TTL, &self.attr(FILE), fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == ROOT || ino == FILE {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == FILE {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = &self.0;
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let len = (size as u64).min(s.size.saturating_sub(offset));
        let mut buf = vec![0u8; len as usize];
        if let Err(e) = read_full(&s.image, &mut buf, offset) {
            tracing::error!("emulated volume: reading {len} bytes at {offset}: {e}");
            return reply.error(Errno::EIO);
        }
        let now = s.now();
        let (ops, at) = lock(&s.pacer).io(now, Dir::Read, offset, len);
        s.count(Dir::Read, ops, len, now, at);
        s.answer_at(at, Answer::Data(reply, buf));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let s = &self.0;
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if offset.saturating_add(data.len() as u64) > s.size {
            return reply.error(Errno::ENOSPC);
        }
        if let Err(e) = s.image.write_all_at(data, offset) {
            tracing::error!(
                "emulated volume: writing {} bytes at {offset}: {e}",
                data.len()
            );
            return reply.error(Errno::EIO);
        }
        let now = s.now();
        let len = data.len() as u64;
        let (ops, at) = lock(&s.pacer).io(now, Dir::Write, offset, len);
        s.count(Dir::Write, ops, len, now, at);
        s.answer_at(at, Answer::Written(reply, data.len() as u32));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2), not a cache flush.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let at = lock(&s.pacer).flush(s.now());
        s.counters.flushes.fetch_add(1, Ordering::Relaxed);
        s.answer_at(at, Answer::Done(reply));
    }
}

/// Reads `buf.len()` bytes at `offset`; past the image's end reads zeros.
fn read_full(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// How long dropping a served volume waits for its FUSE session to end.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

/// Direct reads of 4 KiB `Served::calibrate` times.
const CALIBRATION_READS: usize = 200;

/// Seconds each of `n` 4 KiB direct reads of `device` took, one at a time,
/// at offsets spread over its first `size` bytes.
fn time_reads(device: &Path, n: usize, size: u64) -> Result<Vec<f64>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .map_err(|e| Error::io(format!("opening {}", device.display()), e))?;
    // O_DIRECT wants the buffer aligned as the device's blocks.
    #[repr(C, align(4096))]
    struct Block([u8; 4096]);
    let mut block = Box::new(Block([0; 4096]));
    let blocks = (size / 4096).max(1);
    let mut took = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let offset = (i * 7_919 % blocks) * 4096;
        let t = Instant::now();
        f.read_at(&mut block.0, offset)
            .map_err(|e| Error::io(format!("reading {}", device.display()), e))?;
        took.push(t.elapsed().as_secs_f64());
    }
    Ok(took)
}

/// A volume image served at `<mount>/disk` until dropped (which answers
/// what is pending at once, unmounts and stops its threads).
pub struct Served {
    mount: PathBuf,
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
    answering: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Serves `image` (its size now is the volume's) at `mount`, an empty
    /// directory, paced by `caps`.
    pub fn start(image: &Path, mount: &Path, caps: Caps) -> Result<Served> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(image)
            .map_err(|e| Error::io(format!("opening {}", image.display()), e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io(format!("reading {}", image.display()), e))?
            .len();
        std::fs::create_dir_all(mount)
            .map_err(|e| Error::io(format!("creating {}", mount.display()), e))?;
        let shared = Arc::new(Shared {
            image: file,
            size,
            epoch: Instant::now(),
            pacer: Mutex::new(Pacer::new(caps)),
            due: Mutex::new((0, BinaryHeap::new())),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let answering = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("volume-answers".into())
                .spawn(move || shared.answer_loop())
                .map_err(|e| Error::io("starting the emulated volume's thread", e))?
        };
        let mut served = Served {
            mount: mount.to_path_buf(),
            shared: shared.clone(),
            session: None,
            answering: Some(answering),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("pgfleet-volume".into()),
            MountOption::Subtype("pgfleet".into()),
        ];
        // Requests are handled in a few microseconds (the answer waits on
        // the answering thread, not here); two readers of /dev/fuse keep
        // one busy core from delaying the other's arrivals.
        config.n_threads = Some(2);
        config.clone_fd = true;
        let session = fuser::spawn_mount(Disk(shared), mount, &config).map_err(|e| {
            Error::Provision(format!(
                "serving the emulated volume over FUSE at {}: {e}",
                mount.display()
            ))
        })?;
        served.session = Some(session);
        Ok(served)
    }

    /// The file a loop device attaches to.
    pub fn disk(&self) -> PathBuf {
        self.mount.join(DISK)
    }

    /// Other caps (and latency) from now on: a fault's window, and back.
    pub fn set_caps(&self, caps: Caps) {
        lock(&self.shared.pacer).set_caps(caps);
    }

    pub fn caps(&self) -> Caps {
        lock(&self.shared.pacer).caps()
    }

    /// Measures what the path from `device` (the loop device over this
    /// volume) to here and back costs one I/O, with nothing added: the
    /// median of `CALIBRATION_READS` 4 KiB direct reads one at a time,
    /// uncapped; each I/O's latency is drawn less that from then on. The
    /// seconds it found.
    pub fn calibrate(&self, device: &Path) -> Result<f64> {
        let caps = self.caps();
        self.set_caps(Caps::default());
        let took = time_reads(device, CALIBRATION_READS, self.shared.size);
        self.set_caps(caps);
        let mut took = took?;
        took.sort_by(f64::total_cmp);
        let median = took[took.len() / 2];
        lock(&self.shared.pacer).set_overhead(median);
        tracing::debug!(
            "emulated volume at {}: the path costs {:.0} µs an I/O",
            self.mount.display(),
            median * 1e6
        );
        Ok(median)
    }

    /// What it counted since it started.
    pub fn counted(&self) -> Counted {
        let c = &self.shared.counters;
        let each = |a: &[AtomicU64; 2]| [0, 1].map(|i| a[i].load(Ordering::Relaxed));
        let ns = each(&c.answer_ns);
        Counted {
            ios: each(&c.ios),
            ops: each(&c.ops),
            bytes: each(&c.bytes),
            flushes: c.flushes.load(Ordering::Relaxed),
            answer_s: [ns[0] as f64 * 1e-9, ns[1] as f64 * 1e-9],
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // Nothing waits for its time any more: what is pending is answered
        // now, and what comes later at once. Set under the queue's lock,
        // so no answer is queued after the answering thread's last look.
        {
            let _q = lock(&self.shared.due);
            self.shared.stopping.store(true, Ordering::Release);
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.answering.take() {
            let _ = t.join();
        }
        // The session ends when the kernel closes the connection, which a
        // loop device still attached (a failed detach) holds open: the
        // unmount is waited for a bounded time, then left to the kernel.
        if let Some(session) = self.session.take() {
            let (done, wait) = std::sync::mpsc::channel();
            let _ = std::thread::Builder::new()
                .name("volume-unmount".into())
                .spawn(move || {
                    let _ = done.send(session.umount_and_join());
                });
            match wait.recv_timeout(UNMOUNT_WAIT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(
                    "unmounting the emulated volume at {}: {e}",
                    self.mount.display()
                ),
                Err(_) => tracing::warn!(
                    "the emulated volume at {} is still in use after {UNMOUNT_WAIT:?} (its loop device still attached?): unmounted lazily, its session left to end with it",
                    self.mount.display()
                ),
            }
        }
        let _ = std::fs::remove_dir(&self.mount);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfleet_proto::environment::Latency;

    fn gp3() -> Caps {
        Caps {
            read_iops: 3000,
            write_iops: 3000,
            read_mbps: 125,
            write_mbps: 125,
            combined: true,
            latency: Latency {
                read_us: 1000,
                write_us: 1000,
                flush_us: 0,
            },
        }
    }

    /// Drives `n` I/Os through a pacer at queue depth `qd` (each slot asks
    /// again when its last I/O answers): (I/Os per second, mean latency).
    fn closed_loop(p: &mut Pacer, qd: usize, n: usize, len: u64, seq: bool) -> (f64, f64) {
        let mut slots = vec![0.0f64; qd];
        let (mut lat, mut last) = (0.0, 0.0f64);
        for i in 0..n {
            let k = (0..qd)
                .min_by(|a, b| slots[*a].total_cmp(&slots[*b]))
                .unwrap_or(0);
            let now = slots[k];
            let offset = if seq {
                i as u64 * len
            } else {
                (i as u64 * 7919 % 100_000) * len * 3
            };
            let (_, at) = p.io(now, Dir::Read, offset, len);
            lat += at - now;
            slots[k] = at;
            last = last.max(at);
        }
        (n as f64 / last, lat / n as f64)
    }

    #[test]
    fn ebs_counts_sequential_runs_in_256_kib_operations() {
        // Asked at 0, each still in flight at 1 s (what `Pacer::io` keeps).
        let in_flight = |r: &mut Run, offset: u64, len: u64| {
            let n = r.ops(0.0, offset, len);
            r.until = 1.0;
            n
        };
        let mut r = Run::default();
        // A 1 MiB I/O is four operations; eight sequential 32 KiB I/Os
        // seen together are one (AWS's two examples).
        assert_eq!(in_flight(&mut r, 0, 1 << 20), 4);
        let mut r = Run::default();
        let ops: u64 = (0..8).map(|i| in_flight(&mut r, i * 32768, 32768)).sum();
        assert_eq!(ops, 1);
        // The ninth starts the next operation; a random one is one.
        assert_eq!(in_flight(&mut r, 8 * 32768, 32768), 1);
        assert_eq!(in_flight(&mut r, 10 << 30, 8192), 1);
        // Sequential, but after the run's last I/O answered: not merged.
        let mut r = Run::default();
        r.ops(0.0, 0, 8192);
        r.until = 0.001;
        assert_eq!(r.ops(0.002, 8192, 8192), 1);
    }

    #[test]
    fn a_qd1_reader_gets_the_latency_and_a_deep_queue_the_budget() {
        let mut p = Pacer::new(gp3());
        let (iops, lat) = closed_loop(&mut p, 1, 5000, 8192, false);
        // One at a time: the profile's latency, its inverse in IOPS.
        assert!((lat - 0.001).abs() < 0.00005, "{lat}");
        assert!((iops - 1000.0).abs() < 50.0, "{iops}");
        // Sixteen deep: the budget's 3,000 IOPS, the rest queued.
        let mut p = Pacer::new(gp3());
        let (iops, lat) = closed_loop(&mut p, 16, 30_000, 8192, false);
        assert!((iops - 3000.0).abs() < 60.0, "{iops}");
        assert!(lat > 0.004, "{lat}");
        // Large sequential reads: the 125 MiB/s, not the IOPS.
        let mut p = Pacer::new(gp3());
        let (iops, _) = closed_loop(&mut p, 16, 4000, 1 << 20, true);
        let mibs = iops;
        assert!((mibs - 125.0).abs() < 3.0, "{mibs}");
    }

    #[test]
    fn reads_and_writes_share_a_combined_budget() {
        let mut p = Pacer::new(Caps {
            latency: Latency::default(),
            ..gp3()
        });
        let mut last = 0.0f64;
        for i in 0..6000u64 {
            let dir = if i % 2 == 0 { Dir::Read } else { Dir::Write };
            let (_, at) = p.io(0.0, dir, i * 1_000_000, 4096);
            last = last.max(at);
        }
        // 6,000 operations at 3,000 IOPS between them: two seconds.
        assert!((last - 2.0).abs() < 0.02, "{last}");
        // Apart, each direction has its own.
        let mut p = Pacer::new(Caps {
            combined: false,
            latency: Latency::default(),
            ..gp3()
        });
        let mut last = 0.0f64;
        for i in 0..6000u64 {
            let dir = if i % 2 == 0 { Dir::Read } else { Dir::Write };
            last = last.max(p.io(0.0, dir, i * 1_000_000, 4096).1);
        }
        assert!((last - 1.0).abs() < 0.02, "{last}");
    }

    #[test]
    fn latency_draws_have_the_profiles_mean_and_a_tail() {
        let mut p = Pacer::new(gp3());
        let mut d: Vec<f64> = (0..20_000).map(|_| p.latency(1000)).collect();
        d.sort_by(f64::total_cmp);
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        assert!((mean - 0.001).abs() < 0.00002, "{mean}");
        assert!(d[0] >= 0.0007 - 1e-9, "{}", d[0]);
        let p99 = d[d.len() * 99 / 100];
        assert!((0.0018..0.0024).contains(&p99), "{p99}");
        assert_eq!(p.latency(0), 0.0);
    }
}
