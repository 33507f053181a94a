//! A relation's files in the data directory, opened so that nothing the
//! server (or a scenario through it) controls can redirect a write: the
//! path the server reports must be `base/<db oid>/<relfilenode>` (digits
//! only), every directory on the way is opened relative to the agent's own
//! data directory with `O_NOFOLLOW`, and the files are created as the
//! server's user with mode 0600.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::pages::{BLCKSZ, Page};
use crate::cluster::RunAs;
use crate::{Error, Result};

fn ioerr(what: String, e: impl Into<std::io::Error>) -> Error {
    Error::io(&what, e.into())
}

/// A fork of a relation: its first segment's name relative to `base/<db>/`
/// (`16384`, `16384_vm`), its segments of `seg_blocks` blocks.
pub struct Fork {
    dir: OwnedFd,
    name: String,
    seg_blocks: u64,
    owner: Option<RunAs>,
    label: String,
}

/// Checks a path `pg_relation_filepath` returned: `base/<digits>/<digits>`.
pub fn parse_relpath(path: &str) -> Result<(String, String)> {
    let parts: Vec<&str> = path.split('/').collect();
    let digits = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    match parts.as_slice() {
        ["base", db, rel] if digits(db) && digits(rel) => Ok((db.to_string(), rel.to_string())),
        _ => Err(Error::Workload {
            workload: "direct load".into(),
            message: format!(
                "the server put a relation at `{path}`, not under base/<database>/: \
                 a direct load writes only the default tablespace; use load_method: copy"
            ),
        }),
    }
}

impl Fork {
    /// The fork `suffix` ("" for main, "_vm") of the relation at `relpath`
    /// in the cluster's data directory `data`.
    pub fn open(
        data: &Path,
        relpath: &str,
        suffix: &str,
        seg_blocks: u64,
        owner: Option<&RunAs>,
    ) -> Result<Fork> {
        let (db, rel) = parse_relpath(relpath)?;
        let dirflags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let root = std::fs::File::open(data)
            .map_err(|e| ioerr(format!("opening {}", data.display()), e))?;
        let base = openat(root.as_fd(), "base", dirflags, Mode::empty())
            .map_err(|e| ioerr(format!("opening {}/base", data.display()), e))?;
        let dir = openat(base.as_fd(), db.as_str(), dirflags, Mode::empty())
            .map_err(|e| ioerr(format!("opening {}/base/{db}", data.display()), e))?;
        Ok(Fork {
            dir,
            name: format!("{rel}{suffix}"),
            seg_blocks: seg_blocks.max(1),
            owner: owner.cloned(),
            label: format!("{}/{relpath}{suffix}", data.display()),
        })
    }

    /// Refuses a file with other names (a hard link the server's user made
    /// to a file elsewhere): only the relation's own file is written.
    fn single(&self, fd: OwnedFd, seg: u64) -> Result<OwnedFd> {
        let st = nix::sys::stat::fstat(fd.as_fd())
            .map_err(|e| ioerr(format!("stat {}.{seg}", self.label), e))?;
        if st.st_nlink > 1 || (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
            return Err(Error::Workload {
                workload: "direct load".into(),
                message: format!(
                    "{}.{seg} is not a plain file of its own ({} links): refusing to write it",
                    self.label, st.st_nlink
                ),
            });
        }
        Ok(fd)
    }

    fn segment_name(&self, seg: u64) -> String {
        if seg == 0 {
            self.name.clone()
        } else {
            format!("{}.{seg}", self.name)
        }
    }

    /// Makes the fork `blocks` long in whole segments: each segment it
    /// needs created empty (or truncated) as the server's user, never
    /// through a symbolic link; segments past them (an earlier, larger
    /// fork's) removed. Writers then fill the segments in place.
    pub fn prepare(&self, blocks: u64) -> Result<()> {
        let segs = blocks.div_ceil(self.seg_blocks).max(1);
        for seg in 0..segs {
            let name = self.segment_name(seg);
            // Checked before it is emptied: never truncate another's file.
            let fd = openat(
                self.dir.as_fd(),
                name.as_str(),
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(|e| ioerr(format!("creating {}.{seg}", self.label), e))?;
            let fd = self.single(fd, seg)?;
            nix::unistd::ftruncate(&fd, 0)
                .map_err(|e| ioerr(format!("truncating {}.{seg}", self.label), e))?;
            if let Some(u) = &self.owner {
                nix::unistd::fchown(fd.as_fd(), Some(u.uid.into()), Some(u.gid.into()))
                    .map_err(|e| ioerr(format!("chown {}.{seg}", self.label), e))?;
            }
        }
        self.remove_from(segs)
    }

    /// Opens segment `seg` for writing (made by `prepare`, or created here
    /// past what it made: an index whose length is known only at its end).
    fn open_segment(&self, seg: u64) -> Result<std::fs::File> {
        let name = self.segment_name(seg);
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o600);
        let dir = self.dir.as_fd();
        let fd = match direct_io() {
            // A file system without O_DIRECT (tmpfs) refuses it: buffered.
            true => match openat(dir, name.as_str(), flags | OFlag::O_DIRECT, mode) {
                Err(nix::errno::Errno::EINVAL) => openat(dir, name.as_str(), flags, mode),
                r => r,
            },
            false => openat(dir, name.as_str(), flags, mode),
        }
        .map_err(|e| ioerr(format!("opening {}.{seg}", self.label), e))?;
        let fd = self.single(fd, seg)?;
        if let Some(u) = &self.owner {
            nix::unistd::fchown(fd.as_fd(), Some(u.uid.into()), Some(u.gid.into()))
                .map_err(|e| ioerr(format!("chown {}.{seg}", self.label), e))?;
        }
        Ok(std::fs::File::from(fd))
    }

    /// Cuts the fork to `blocks`: its last segment's length, and no
    /// segment after it.
    pub fn truncate_to(&self, blocks: u64) -> Result<()> {
        let last = blocks.saturating_sub(1) / self.seg_blocks;
        let f = self.open_segment(last)?;
        f.set_len((blocks - last * self.seg_blocks) * BLCKSZ as u64)
            .map_err(|e| ioerr(format!("truncating {}.{last}", self.label), e))?;
        f.sync_all()
            .map_err(|e| ioerr(format!("fsync {}.{last}", self.label), e))?;
        self.remove_from(last + 1)
    }

    /// Opens segment `seg` for reading (the self-check), or None past the
    /// fork's end.
    pub fn read_segment(&self, seg: u64) -> Result<Option<std::fs::File>> {
        let name = self.segment_name(seg);
        match openat(
            self.dir.as_fd(),
            name.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(std::fs::File::from(fd))),
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(e) => Err(ioerr(format!("opening {}.{seg}", self.label), e)),
        }
    }

    pub fn seg_blocks(&self) -> u64 {
        self.seg_blocks
    }

    /// Removes segments from `from` on (what an earlier, larger fork left).
    fn remove_from(&self, from: u64) -> Result<()> {
        let mut seg = from.max(1);
        loop {
            let name = self.segment_name(seg);
            match nix::unistd::unlinkat(
                self.dir.as_fd(),
                name.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) => seg += 1,
                Err(nix::errno::Errno::ENOENT) => return Ok(()),
                Err(e) => return Err(ioerr(format!("removing {}.{seg}", self.label), e)),
            }
        }
    }

    /// Every block of the fork, in order (the self-check; small forks).
    pub fn read_all(&self) -> Result<Vec<Box<Page>>> {
        let mut out = Vec::new();
        let mut seg = 0;
        while let Some(f) = self.read_segment(seg)? {
            let len = f
                .metadata()
                .map_err(|e| ioerr(format!("reading {}", self.label), e))?
                .len();
            for b in 0..len / BLCKSZ as u64 {
                let mut p = Box::new([0u8; BLCKSZ]);
                f.read_exact_at(&mut p[..], b * BLCKSZ as u64)
                    .map_err(|e| ioerr(format!("reading {}", self.label), e))?;
                out.push(p);
            }
            seg += 1;
        }
        Ok(out)
    }

    pub fn sync_dir(&self) -> Result<()> {
        nix::unistd::fsync(self.dir.as_fd()).map_err(|e| ioerr(format!("fsync {}", self.label), e))
    }
}

/// Whether writers bypass the page cache (O_DIRECT; `PGFLEET_DIRECT_IO=0`
/// turns it off, e.g. on a file system without it): the pages go to the
/// device at its speed instead of through the kernel's write-back, and the
/// load does not evict the instance's page cache.
fn direct_io() -> bool {
    std::env::var("PGFLEET_DIRECT_IO").map_or(true, |v| v != "0")
}

/// A page-aligned 8 KiB block: O_DIRECT needs aligned buffers.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; BLCKSZ]);

/// Writes pages at their block numbers across a fork's segments (blocks in
/// any order; each segment opened once, runs of consecutive blocks written
/// together from an aligned buffer), then fsyncs what it wrote.
pub struct Writer<'f> {
    fork: &'f Fork,
    open: std::collections::BTreeMap<u64, std::fs::File>,
    buf: Vec<Block>,
    /// The block `buf` starts at.
    start: u64,
    pub written: u64,
}

const RUN: usize = 128;

impl<'f> Writer<'f> {
    pub fn new(fork: &'f Fork) -> Self {
        Writer {
            fork,
            open: Default::default(),
            buf: Vec::with_capacity(RUN),
            start: 0,
            written: 0,
        }
    }

    pub fn put(&mut self, blk: u64, page: &Page) -> std::io::Result<()> {
        let next = self.start + self.buf.len() as u64;
        let seg_end = (self.start / self.fork.seg_blocks + 1) * self.fork.seg_blocks;
        if !self.buf.is_empty() && (blk != next || blk >= seg_end || self.buf.len() >= RUN) {
            self.flush()?;
        }
        if self.buf.is_empty() {
            self.start = blk;
        }
        self.buf.push(Block(*page));
        self.written += 1;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let seg = self.start / self.fork.seg_blocks;
        if !self.open.contains_key(&seg) {
            let f = self
                .fork
                .open_segment(seg)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            self.open.insert(seg, f);
        }
        let off = (self.start % self.fork.seg_blocks) * BLCKSZ as u64;
        // SAFETY: `Block` is `repr(C)` around a byte array whose size is a
        // multiple of its alignment, so the vector's blocks are contiguous
        // bytes with no padding; the slice borrows `self.buf` only here.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.buf.len() * BLCKSZ)
        };
        self.open[&seg].write_all_at(bytes, off)?;
        self.buf.clear();
        Ok(())
    }

    /// Flushes, fsyncs every segment written; returns the pages written.
    pub fn finish(mut self) -> std::io::Result<u64> {
        self.flush()?;
        for f in self.open.values() {
            f.sync_all()?;
        }
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("pgfleet-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("base/5")).unwrap();
        d
    }

    /// Only `base/<digits>/<digits>` is written: another tablespace, a
    /// climb out or a deeper path is refused with what to do.
    #[test]
    fn only_the_default_tablespace_paths_are_taken() {
        assert!(parse_relpath("base/5/16384").is_ok());
        for bad in [
            "pg_tblspc/16385/PG_15_202209061/5/16384",
            "base/5/../../etc",
            "base/5/16384/x",
            "base/5/",
            "base/x5/16384",
            "/base/5/16384",
        ] {
            let e = parse_relpath(bad).unwrap_err().to_string();
            assert!(e.contains("load_method: copy"), "{bad}: {e}");
        }
    }

    /// A symbolic link on the way (the database's directory, or the file)
    /// and a hard link to a file elsewhere are refused, and the file they
    /// point at is left as it was.
    #[test]
    fn links_cannot_aim_the_writes_elsewhere() {
        let d = data_dir("links");
        let outside = d.join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        // The file itself a symlink.
        std::os::unix::fs::symlink(&outside, d.join("base/5/100")).unwrap();
        let f = Fork::open(&d, "base/5/100", "", 131072, None).unwrap();
        assert!(f.prepare(1).is_err());
        // A hard link to the file outside.
        std::fs::hard_link(&outside, d.join("base/5/200")).unwrap();
        let f = Fork::open(&d, "base/5/200", "", 131072, None).unwrap();
        let e = f.prepare(1).unwrap_err().to_string();
        assert!(e.contains("refusing"), "{e}");
        // The database's directory a symlink.
        std::fs::create_dir_all(d.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), d.join("base/6")).unwrap();
        assert!(Fork::open(&d, "base/6/100", "", 131072, None).is_err());
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        // A plain relation file is written, in whole segments.
        let f = Fork::open(&d, "base/5/300", "", 4, None).unwrap();
        f.prepare(6).unwrap();
        let mut w = Writer::new(&f);
        let page = [7u8; BLCKSZ];
        for b in 0..6 {
            w.put(b, &page).unwrap();
        }
        assert_eq!(w.finish().unwrap(), 6);
        assert_eq!(
            std::fs::metadata(d.join("base/5/300")).unwrap().len(),
            4 * 8192
        );
        assert_eq!(
            std::fs::metadata(d.join("base/5/300.1")).unwrap().len(),
            2 * 8192
        );
        f.truncate_to(3).unwrap();
        assert!(!d.join("base/5/300.1").exists());
        assert_eq!(f.read_all().unwrap().len(), 3);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
