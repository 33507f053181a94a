//! A cluster's own block device, where its device bytes must be exact: a
//! loop device over a sparse file on the class's storage, with its own
//! ext4, mounted at `<cluster dir>/volume`; PGDATA lives in it. The loop
//! device's `/sys/block/loopN/stat` counts every byte its filesystem sent
//! to it — buffered writeback, checkpoints, WAL, the journal — which a
//! cgroup v1 block-I/O cgroup does not: there, writeback is done by the
//! kernel's flusher threads and charged to no cluster. The loop device
//! reads and writes its file with direct I/O, so the host's page cache does
//! not hold a second copy.
//!
//! Needs root, `losetup` (util-linux) and `mkfs.ext4` (e2fsprogs); where
//! they are missing the cluster runs in its directory as before and the
//! kind says its device bytes came from the cgroup. The loop device is
//! recorded in the cluster's directory (`volume`), so `reap_stale` can
//! unmount and detach what a killed agent left.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::device::DeviceStat;
use super::ebs;
use crate::{Error, Result};
use pgfleet_proto::environment::Caps;

/// A mounted per-cluster volume; `remove` (or Drop) unmounts, detaches
/// and deletes it.
pub struct Volume {
    /// `<cluster dir>/volume.img`
    image: PathBuf,
    /// `<cluster dir>/volume`
    mount: PathBuf,
    /// `/dev/loopN`
    device: String,
    /// The image served by the agent (an emulated network volume, with its
    /// profile's latency and budget): the loop device is over `<cluster
    /// dir>/ebs/disk` instead of the image.
    served: Option<ebs::Served>,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume")
            .field("mount", &self.mount)
            .field("device", &self.device)
            .field("served", &self.served.is_some())
            .finish()
    }
}

/// Where the loop device is recorded in the cluster's directory.
const RECORD: &str = "volume.dev";

/// Where an emulated volume's image is served (`ebs::Served`).
const SERVED: &str = "ebs";

fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Provision(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Provision(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether this host can give clusters their own volumes.
pub fn available() -> bool {
    nix::unistd::geteuid().is_root()
        && ["losetup", "mkfs.ext4", "mount", "umount"]
            .iter()
            .all(|t| which(t).is_some())
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn tool(name: &str) -> Command {
    Command::new(which(name).unwrap_or_else(|| PathBuf::from(name)))
}

impl Volume {
    /// Creates `dir/volume.img` (sparse, `size` bytes), attaches it, makes
    /// an ext4 on it and mounts it at `dir/volume`, owned by `owner`.
    /// `served`: the image is served by the agent with these caps and
    /// latency (`ebs`), and the loop device is over that. Undoes what it
    /// did on any error.
    pub fn create(
        dir: &Path,
        size: u64,
        owner: Option<(u32, u32)>,
        served: Option<Caps>,
    ) -> Result<Volume> {
        let image = dir.join("volume.img");
        let mount = dir.join("volume");
        let f = std::fs::File::create(&image)
            .map_err(|e| Error::io(format!("creating {}", image.display()), e))?;
        f.set_len(size)
            .map_err(|e| Error::io(format!("sizing {}", image.display()), e))?;
        drop(f);
        let served = match served
            .map(|caps| ebs::Served::start(&image, &dir.join(SERVED), caps))
            .transpose()
        {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&image);
                return Err(e);
            }
        };
        let backing = served.as_ref().map_or(image.clone(), |s| s.disk());
        // 4 KiB sectors: ext4's blocks, and every I/O the served image
        // sees is whole pages.
        let device = match run(
            tool("losetup")
                .args([
                    "--find",
                    "--show",
                    "--direct-io=on",
                    "--sector-size",
                    "4096",
                ])
                .arg(&backing),
            "losetup",
        ) {
            Ok(d) => d,
            Err(e) => {
                drop(served);
                let _ = std::fs::remove_file(&image);
                return Err(e);
            }
        };
        let mut v = Volume {
            image,
            mount,
            device,
            served,
        };
        let made = (|| -> Result<()> {
            if let Some(s) = &v.served {
                s.calibrate(Path::new(&v.device))?;
            }
            std::fs::write(dir.join(RECORD), &v.device)
                .map_err(|e| Error::io("recording the loop device", e))?;
            crate::failpoint::hit("volume")?;
            run(
                tool("mkfs.ext4")
                    // Everything initialized now (a small inode table, one
                    // inode per MiB), nothing in the background later: the
                    // kernel's lazy init would write to the device while
                    // a kind measures its bytes.
                    .args(["-q", "-F", "-m", "0", "-i", "1048576", "-J", "size=32"])
                    .args(["-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"])
                    .arg(&v.device),
                "mkfs.ext4",
            )?;
            std::fs::create_dir_all(&v.mount)
                .map_err(|e| Error::io(format!("creating {}", v.mount.display()), e))?;
            run(
                tool("mount")
                    .args(["-t", "ext4", "-o", "noatime,noinit_itable"])
                    .arg(&v.device)
                    .arg(&v.mount),
                "mount",
            )?;
            crate::failpoint::hit("mount")?;
            if let Some((uid, gid)) = owner {
                nix::unistd::chown(&v.mount, Some(uid.into()), Some(gid.into()))
                    .map_err(|e| Error::Provision(format!("chown {}: {e}", v.mount.display())))?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            let _ = v.remove();
            return Err(e);
        }
        Ok(v)
    }

    /// The mounted filesystem (where PGDATA and a kind's files go).
    pub fn dir(&self) -> &Path {
        &self.mount
    }

    /// `loop3` for `/dev/loop3`.
    fn name(&self) -> &str {
        self.device.trim_start_matches("/dev/")
    }

    /// The device's `major:minor` (what throttling rules name).
    pub fn dev_number(&self) -> Result<String> {
        let path = format!("/sys/block/{}/dev", self.name());
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|e| Error::io(format!("reading {path}"), e))
    }

    /// The device's stat file (what `DeviceStat::read` takes).
    pub fn stat_file(&self) -> PathBuf {
        format!("/sys/block/{}/stat", self.name()).into()
    }

    /// What the device completed since it was attached.
    pub fn stat(&self) -> Option<DeviceStat> {
        DeviceStat::read(&self.stat_file())
    }

    /// The agent's side of an emulated network volume, when it is one.
    pub fn served(&self) -> Option<&ebs::Served> {
        self.served.as_ref()
    }

    /// Unmounts, detaches and deletes the volume (idempotent).
    pub fn remove(&mut self) -> Result<()> {
        if self.device.is_empty() {
            return Ok(());
        }
        let dir = self
            .image
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        release(&dir, &self.device)?;
        self.device.clear();
        // Served until the loop device let go of it.
        drop(self.served.take());
        Ok(())
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// Unmounts `dir/volume` if mounted, detaches `device` if it is still
/// `dir/volume.img`'s, and deletes the image and the record.
fn release(dir: &Path, device: &str) -> Result<()> {
    // Absolute, as /proc/self/mounts lists mounts (a relative data dir
    // once hid a mount from `is_mounted` and left it behind).
    let dir = &std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mount = dir.join("volume");
    let image = dir.join("volume.img");
    let name = device.trim_start_matches("/dev/");
    let backing =
        std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap_or_default();
    let backing = Path::new(backing.trim());
    let ours =
        !name.is_empty() && (backing == image || backing == dir.join(SERVED).join(ebs::DISK));
    // Its caps go first, whatever happens next: the next user of this
    // loop device starts uncapped even if this one cannot be detached.
    if ours && let Ok(dev) = std::fs::read_to_string(format!("/sys/block/{name}/dev")) {
        super::throttle::uncap_device(dev.trim());
    }
    if is_mounted(&mount) {
        // A process that just exited may hold it for a moment.
        let mut last = Ok(String::new());
        for _ in 0..20 {
            last = run(tool("umount").arg(&mount), "umount");
            if last.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        last?;
    }
    if ours {
        run(tool("losetup").arg("-d").arg(device), "losetup -d")?;
    }
    // A served image whose agent was killed: its FUSE mount answers
    // nothing any more; lazily unmounted (a live one unmounts itself).
    let served = dir.join(SERVED);
    if is_mounted(&served) && std::fs::metadata(&served).is_err() {
        run(tool("umount").arg("-l").arg(&served), "umount -l")?;
    }
    for f in [image, dir.join(RECORD)] {
        match std::fs::remove_file(&f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", f.display()), e)),
        }
    }
    Ok(())
}

fn is_mounted(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(p.as_ref()))
}

/// What a killed agent left in a cluster directory: unmounts and detaches
/// its volume (`reap_stale`).
pub fn reap(dir: &Path) -> Result<()> {
    match std::fs::read_to_string(dir.join(RECORD)) {
        Ok(device) => release(dir, device.trim()),
        Err(_) if is_mounted(&dir.join("volume")) || is_mounted(&dir.join(SERVED)) => {
            release(dir, "")
        }
        Err(_) => Ok(()),
    }
}
