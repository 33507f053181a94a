//! The sandbox that every program scenario text can steer runs in: the real
//! `pgbench` (always: it reads the scenario's script) and `\shell` /
//! `\setshell` of pgfleet's own driver (only with `allow_shell`).
//!
//! What holds by construction (SECURITY.md, "The sandbox"):
//! - **A user of its own.** As root, each sandbox's programs run as a uid
//!   no other live sandbox has (`RESERVED_UIDS`, held by a lock for the
//!   sandbox's life; or the one user `PGFLEET_SANDBOX_USER` names, shared):
//!   never root, never the agent's user, never the user PostgreSQL runs as
//!   (so it cannot read any cluster's files), and never another run's or
//!   cell's (so it cannot signal, ptrace or read `/proc` of theirs). No
//!   supplementary groups; `PR_SET_NO_NEW_PRIVS`, so no setuid program gives
//!   privileges back.
//! - **An allowlisted filesystem.** As root, it runs in a mount namespace of
//!   its own, chrooted into a root that holds only the system's programs and
//!   libraries (`/usr`, `/bin`, `/lib*`, the PostgreSQL install it needs, a
//!   few files of `/etc`: users, groups, hosts, the loader's cache), all
//!   read-only, `/dev/null`, `zero`, `full`, `random` and `urandom` (no other
//!   device), and `/tmp`: its private temp dir, the only
//!   place it can write. The agent's tokens, TLS keys, stores, datasets and
//!   every cluster are not in its world at all. The mounts live only in the
//!   namespace, which dies with its last process.
//! - **No inherited secrets.** Its environment is cleared (`PATH`, `HOME`
//!   and `TMPDIR` pointing at its temp dir, `LANG=C`, and what the caller
//!   adds, e.g. `PGPASSWORD` for pgbench).
//! - **Nothing left.** Every process it starts (a backgrounded `\shell`
//!   command too) joins a pids cgroup of its own, and `Drop` kills them all,
//!   then removes the cgroup and the sandbox's directory.
//!
//! An agent that is not root can switch neither user nor filesystem: its
//! sandbox is `Isolation::SameUser` (a private temp dir, a cleared
//! environment, `PR_SET_NO_NEW_PRIVS`), and `describe()` says so in the
//! cell's report. Run such an agent only for your own scenarios.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cluster::RunAs;
use crate::{Error, Result};

/// The name a sandbox's reserved uid has inside its root (`/etc/passwd`
/// there lists it, root and nothing of the host's users).
pub const RESERVED_NAME: &str = "pgfleet-sandbox";

/// The uids sandboxes take, one per live sandbox, when
/// `PGFLEET_SANDBOX_USER` names no user: above every system's and
/// subordinate range in use, and below `(uid_t)-1`.
pub const RESERVED_UIDS: std::ops::Range<u32> = 2_140_000_000..2_140_065_536;

/// Where the locks that hold the reserved uids live (root's only).
const UID_LOCKS: &str = "/run/pgfleet-sandbox-uids";

/// The uid a `RunAs` of `RESERVED_NAME` carries until its sandbox takes
/// one of the range (`setuid` of it fails: never run as it).
const UNALLOCATED: u32 = u32::MAX;

/// Files of `/etc` a program may read: how names resolve, the dynamic
/// loader's cache (who users are: a `passwd` and `group` of the sandbox's
/// own, written into its root).
const ETC_FILES: &[&str] = &[
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/localtime",
];

/// The devices a program may open (no disks, no kernel log, no shared
/// memory of others).
const DEV_FILES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// The system's programs and libraries (symlinks such as merged-usr's
/// `/bin -> usr/bin` are recreated as symlinks).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// How far a sandbox separates its programs from the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Another user, an allowlisted read-only filesystem, a private /tmp.
    Full,
    /// Another user with no new privileges, in its private temp dir (whose
    /// parent it cannot traverse), seeing the host's files as that user
    /// does: where no mount namespace can be made (a container).
    User,
    /// The agent's own user (it is not root): a private temp dir, a cleared
    /// environment and no new privileges only.
    SameUser,
}

/// One sandbox: a private temp dir, a root to chroot into, a cgroup.
/// Dropping it kills what still runs in it and removes it.
#[derive(Debug)]
pub struct Sandbox {
    dir: PathBuf,
    user: Option<RunAs>,
    /// Host directories bound read-only besides the system's.
    extra: Vec<PathBuf>,
    cgroup: Option<PathBuf>,
    /// The mount namespace and chroot work here (a container without
    /// CAP_SYS_ADMIN cannot make them: then only the user is switched).
    mounts: bool,
    /// The lock that holds this sandbox's reserved uid while it lives.
    _uid: Option<std::fs::File>,
}

/// The sandbox user, resolved when the agent is root: the user
/// `PGFLEET_SANDBOX_USER` names (shared by every sandbox: the operator's
/// choice), or by default a uid of its own per sandbox (`RESERVED_NAME`,
/// given its uid by `Sandbox::new`). It must not be root nor the user
/// PostgreSQL runs as.
pub fn user(pg_user: Option<&RunAs>) -> Result<Option<RunAs>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let Ok(name) = std::env::var("PGFLEET_SANDBOX_USER") else {
        return Ok(Some(RunAs {
            uid: UNALLOCATED,
            gid: UNALLOCATED,
            name: RESERVED_NAME.into(),
        }));
    };
    let u = nix::unistd::User::from_name(&name)
        .map_err(|e| Error::Provision(format!("looking up the sandbox user `{name}`: {e}")))?
        .ok_or_else(|| {
            Error::Provision(format!(
                "the sandbox user `{name}` does not exist: create it (useradd --system {name}) \
                 or set PGFLEET_SANDBOX_USER to an unprivileged user"
            ))
        })?;
    if u.uid.is_root() || pg_user.is_some_and(|p| p.uid == u.uid.as_raw()) {
        return Err(Error::Provision(format!(
            "the sandbox user `{name}` is root or the user PostgreSQL runs as: \
             set PGFLEET_SANDBOX_USER to a user of its own"
        )));
    }
    Ok(Some(RunAs {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        name,
    }))
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

impl Sandbox {
    /// A new sandbox under `parent` (a directory only the agent can reach:
    /// `<data root>/sandboxes`), for programs run as `user` (None: the
    /// agent's own, when it is not root), seeing `extra` read-only besides
    /// the system's directories (e.g. the PostgreSQL install).
    pub fn new(parent: &Path, user: Option<RunAs>, extra: &[&Path]) -> Result<Sandbox> {
        let io = |what: &str, e| Error::io(format!("sandbox: {what}"), e);
        let dir = loop {
            // The parent goes with its last sandbox (`Drop`): made again if
            // another sandbox's end removed it meanwhile.
            std::fs::create_dir_all(parent).map_err(|e| io("creating its parent", e))?;
            set_mode(parent, 0o700)?;
            let n = SERIAL.fetch_add(1, Ordering::Relaxed);
            let dir = parent.join(format!("{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotFound
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(io("creating its directory", e)),
            }
        };
        let mut user = user;
        let mut held = None;
        if let Some(u) = user.as_mut()
            && u.name == RESERVED_NAME
            && u.uid == UNALLOCATED
        {
            let (uid, lock) = allocate_uid(&dir)?;
            (u.uid, u.gid, held) = (uid, uid, Some(lock));
        }
        let mut sb = Sandbox {
            dir,
            user,
            extra: extra.iter().map(|p| p.to_path_buf()).collect(),
            cgroup: None,
            mounts: false,
            _uid: held,
        };
        let tmp = sb.tmp();
        std::fs::create_dir(&tmp).map_err(|e| io("creating its temp dir", e))?;
        set_mode(&tmp, 0o700)?;
        if let Some(u) = &sb.user {
            nix::unistd::chown(&tmp, Some(u.uid.into()), Some(u.gid.into()))
                .map_err(|e| Error::Provision(format!("sandbox: chown its temp dir: {e}")))?;
            sb.make_root()?;
            sb.cgroup = make_cgroup(&sb.dir);
            // Whether this host lets it make its own mount namespace: a
            // `true` run the full way tells (a container without
            // CAP_SYS_ADMIN does not), else the user alone is switched.
            sb.mounts = true;
            let mut probe = std::process::Command::new("/bin/true");
            sb.prepare(&mut probe)?;
            if !probe.status().is_ok_and(|s| s.success()) {
                sb.mounts = false;
                tracing::warn!(
                    "sandbox: no mount namespace here (a container without CAP_SYS_ADMIN?): \
                     scenario-steered programs run as another user only"
                );
            }
        }
        Ok(sb)
    }

    /// A sandbox for the programs of a cell on `cluster`: under the agent's
    /// data root, seeing the cluster's PostgreSQL install read-only.
    pub fn for_cluster(cluster: &crate::cluster::Cluster) -> Result<Sandbox> {
        let clusters = cluster.dir().parent().unwrap_or(Path::new("/"));
        let parent = clusters.parent().unwrap_or(clusters).join("sandboxes");
        let install = cluster.pg.visible_root();
        Sandbox::new(&parent, user(cluster.run_as())?, &[&install])
    }

    pub fn isolation(&self) -> Isolation {
        match (&self.user, self.mounts) {
            (Some(_), true) => Isolation::Full,
            (Some(_), false) => Isolation::User,
            (None, _) => Isolation::SameUser,
        }
    }

    /// One line for reports and logs: who runs what, how separated.
    pub fn describe(&self) -> String {
        match (&self.user, self.isolation()) {
            (Some(u), Isolation::Full) => format!(
                "as `{}` (uid {}), no new privileges, in a mount namespace that sees only the system's programs read-only and a private /tmp",
                u.name, u.uid
            ),
            (Some(u), _) => format!(
                "as `{}` (uid {}), no new privileges, in a private temp dir (no mount namespace could be made here)",
                u.name, u.uid
            ),
            (None, _) => "as the agent's own user (it is not root): a private temp dir and a cleared environment only".into(),
        }
    }

    /// The private temp dir, as the agent sees it.
    pub fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// Where a file of the temp dir is, as the sandboxed program sees it:
    /// under /tmp in its own root, else relative to its working directory
    /// (the temp dir, whose parent it may not be able to traverse).
    pub fn inside(&self, name: &str) -> PathBuf {
        match self.isolation() {
            Isolation::Full => Path::new("/tmp").join(name),
            Isolation::User | Isolation::SameUser => PathBuf::from(name),
        }
    }

    /// Writes `text` into the temp dir as `name`, readable by the sandbox
    /// user; returns its path inside.
    pub fn put(&self, name: &str, text: &str) -> Result<PathBuf> {
        let host = self.tmp().join(name);
        std::fs::write(&host, text)
            .map_err(|e| Error::io(format!("sandbox: writing {name}"), e))?;
        if let Some(u) = &self.user {
            nix::unistd::chown(&host, Some(u.uid.into()), Some(u.gid.into()))
                .map_err(|e| Error::Provision(format!("sandbox: chown {name}: {e}")))?;
        }
        Ok(self.inside(name))
    }

    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// The read-only binds: (host path, mount point under the root).
    fn binds(&self) -> Vec<(PathBuf, PathBuf)> {
        let root = self.root();
        let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
        let mut v: Vec<(PathBuf, PathBuf)> = SYSTEM_DIRS
            .iter()
            .map(Path::new)
            .filter(|p| p.is_dir() && !p.is_symlink())
            .chain(ETC_FILES.iter().map(Path::new).filter(|p| p.is_file()))
            .chain(DEV_FILES.iter().map(Path::new).filter(|p| p.exists()))
            .chain(
                self.extra
                    .iter()
                    .map(PathBuf::as_path)
                    .filter(|p| !SYSTEM_DIRS.iter().any(|d| p.starts_with(d))),
            )
            .map(|p| (p.to_path_buf(), under(p)))
            .collect();
        v.dedup();
        v
    }

    /// The chroot's skeleton: a mount point per bind, the system's
    /// symlinks, `/tmp`. Only the agent (root) can reach it.
    fn make_root(&self) -> Result<()> {
        let root = self.root();
        let io = |what: String, e| Error::io(format!("sandbox: {what}"), e);
        std::fs::create_dir(&root).map_err(|e| io("creating its root".into(), e))?;
        set_mode(&root, 0o755)?;
        for d in SYSTEM_DIRS.iter().map(Path::new).filter(|p| p.is_symlink()) {
            let target =
                std::fs::read_link(d).map_err(|e| io(format!("reading {}", d.display()), e))?;
            let at = root.join(d.strip_prefix("/").unwrap_or(d));
            std::os::unix::fs::symlink(target, &at)
                .map_err(|e| io(format!("linking {}", at.display()), e))?;
        }
        for (src, at) in self.binds() {
            if let Some(p) = at.parent() {
                std::fs::create_dir_all(p)
                    .map_err(|e| io(format!("creating {}", p.display()), e))?;
            }
            if src.is_dir() {
                std::fs::create_dir_all(&at)
            } else {
                std::fs::write(&at, b"")
            }
            .map_err(|e| io(format!("creating {}", at.display()), e))?;
        }
        std::fs::create_dir(root.join("tmp")).map_err(|e| io("creating /tmp".into(), e))?;
        // Who users are, inside: root and this sandbox's user, nothing of
        // the host's (libpq and `id` look the uid up).
        let etc = root.join("etc");
        std::fs::create_dir_all(&etc).map_err(|e| io("creating /etc".into(), e))?;
        let (uid, gid, name) = match &self.user {
            Some(u) => (u.uid, u.gid, u.name.as_str()),
            None => return Ok(()),
        };
        for (file, text) in [
            (
                "passwd",
                format!(
                    "root:x:0:0:root:/root:/usr/sbin/nologin\n{name}:x:{uid}:{gid}:pgfleet sandbox:/tmp:/usr/sbin/nologin\n"
                ),
            ),
            ("group", format!("root:x:0:\n{name}:x:{gid}:\n")),
        ] {
            let at = etc.join(file);
            std::fs::write(&at, text).map_err(|e| io(format!("writing {}", at.display()), e))?;
            set_mode(&at, 0o644)?;
        }
        Ok(())
    }

    /// A command for `program` (a path as the sandboxed program sees it:
    /// absolute, under a bound directory) that runs inside this sandbox.
    pub fn command(&self, program: &Path) -> Result<tokio::process::Command> {
        let mut cmd = tokio::process::Command::new(program);
        self.prepare(cmd.as_std_mut())?;
        cmd.kill_on_drop(true);
        Ok(cmd)
    }

    /// Sets `cmd` up to run inside: environment, working directory, and
    /// what the child does between fork and exec.
    fn prepare(&self, cmd: &mut std::process::Command) -> Result<()> {
        use std::os::unix::process::CommandExt;
        let home = match self.isolation() {
            Isolation::Full => PathBuf::from("/tmp"),
            _ => self.tmp(),
        };
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("TMPDIR", &home)
            .env("LANG", "C")
            .current_dir(self.tmp())
            .stdin(std::process::Stdio::null());
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|e| Error::Provision(format!("sandbox: path {}: {e}", p.display())))
        };
        let procs = match &self.cgroup {
            Some(cg) => Some(c(&cg.join("cgroup.procs"))?),
            None => None,
        };
        let isolate = match &self.user {
            Some(u) => {
                let mut binds = Vec::new();
                for (src, at) in self.binds() {
                    binds.push((c(&src)?, c(&at)?));
                }
                Some(Isolate {
                    mounts: self.mounts,
                    binds,
                    tmp: (c(&self.tmp())?, c(&self.root().join("tmp"))?),
                    root: c(&self.root())?,
                    slash: c(Path::new("/"))?,
                    slash_tmp: c(Path::new("/tmp"))?,
                    uid: u.uid,
                    gid: u.gid,
                })
            }
            None => None,
        };
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec; it makes only
        // async-signal-safe system calls on memory prepared before the fork
        // (no allocation, no locks).
        unsafe {
            cmd.pre_exec(move || {
                let fail = || Err(std::io::Error::last_os_error());
                if libc::setsid() < 0 {
                    return fail();
                }
                if let Some(procs) = &procs {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return fail();
                    }
                    libc::close(fd);
                }
                if let Some(i) = &isolate
                    && i.enter() != 0
                {
                    return fail();
                }
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return fail();
                }
                // After the uid switch, which clears it.
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return fail();
                }
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        Ok(())
    }
}

/// What the child does, as root, before it becomes the sandbox user.
struct Isolate {
    /// Make the mount namespace and chroot (else only switch the user).
    mounts: bool,
    binds: Vec<(CString, CString)>,
    tmp: (CString, CString),
    root: CString,
    slash: CString,
    slash_tmp: CString,
    uid: u32,
    gid: u32,
}

impl Isolate {
    /// Between fork and exec: a mount namespace whose mounts never reach
    /// the host's (private, recursively, before anything is mounted), the
    /// binds, the chroot, then the user. Returns -1 on the first failure
    /// (errno says why).
    unsafe fn enter(&self) -> i32 {
        unsafe {
            if self.mounts && self.enter_root() != 0 {
                return -1;
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(self.gid) != 0
                || libc::setuid(self.uid) != 0
            {
                return -1;
            }
        }
        0
    }

    /// The mount namespace, its binds and the chroot.
    unsafe fn enter_root(&self) -> i32 {
        use libc::{MS_BIND, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT};
        let null: *const libc::c_char = std::ptr::null();
        let no_data: *const libc::c_void = std::ptr::null();
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return -1;
            }
            if libc::mount(
                null,
                self.slash.as_ptr(),
                null,
                MS_REC | MS_PRIVATE,
                no_data,
            ) != 0
            {
                return -1;
            }
            for (src, at) in &self.binds {
                if libc::mount(src.as_ptr(), at.as_ptr(), null, MS_BIND | MS_REC, no_data) != 0 {
                    return -1;
                }
                let ro = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID;
                if libc::mount(null, at.as_ptr(), null, ro, no_data) != 0 {
                    return -1;
                }
            }
            let (src, at) = &self.tmp;
            if libc::mount(src.as_ptr(), at.as_ptr(), null, MS_BIND, no_data) != 0 {
                return -1;
            }
            let rw = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV;
            if libc::mount(null, at.as_ptr(), null, rw, no_data) != 0 {
                return -1;
            }
            if libc::chroot(self.root.as_ptr()) != 0 || libc::chdir(self.slash_tmp.as_ptr()) != 0 {
                return -1;
            }
        }
        0
    }
}

/// Takes a uid of `RESERVED_UIDS` that no live sandbox holds: a lock file
/// per uid under `UID_LOCKS`, held (flock) for the sandbox's life, so two
/// agents on one host never hand out the same one and a dead agent's uids
/// come free with its locks. The search starts at a place `dir` picks.
fn allocate_uid(dir: &Path) -> Result<(u32, std::fs::File)> {
    use std::hash::{Hash, Hasher};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let locks = Path::new(UID_LOCKS);
    let io = |what: String, e| Error::io(format!("sandbox: {what}"), e);
    if !locks.is_dir() {
        std::fs::create_dir_all(locks)
            .map_err(|e| io(format!("creating {}", locks.display()), e))?;
        set_mode(locks, 0o700)?;
    }
    let count = RESERVED_UIDS.end - RESERVED_UIDS.start;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    let start = (h.finish() % u64::from(count)) as u32;
    for i in 0..count {
        let uid = RESERVED_UIDS.start + (start + i) % count;
        let path = locks.join(uid.to_string());
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io(format!("opening {}", path.display()), e))?;
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((uid, f));
        }
    }
    Err(Error::Provision(format!(
        "sandbox: all {count} reserved uids are in use (more live sandboxes than that?)"
    )))
}

/// A pids cgroup every sandboxed process joins (v1 `pids/pgfleet/…`, or
/// v2 `pgfleet-sandbox/…`), so `Drop` finds and kills them all. None where
/// no cgroup can be made: the process group is killed instead.
fn make_cgroup(dir: &Path) -> Option<PathBuf> {
    let name = dir.file_name()?.to_string_lossy().to_string();
    let [v1, v2] = cgroups_of(&name);
    let path = if Path::new("/sys/fs/cgroup/pids").is_dir() {
        v1
    } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        v2
    } else {
        return None;
    };
    let _ = std::fs::create_dir(path.parent()?);
    std::fs::create_dir(&path).ok()?;
    Some(path)
}

/// The candidate cgroups of a sandbox directory named `name` (v1, v2).
fn cgroups_of(name: &str) -> [PathBuf; 2] {
    let base = Path::new("/sys/fs/cgroup");
    let leaf = format!("sandbox-{name}");
    [
        base.join("pids/pgfleet").join(&leaf),
        base.join("pgfleet-sandbox").join(&leaf),
    ]
}

/// Kills every process in `cg` (until none is left, bounded), then
/// removes it and, when empty, its parent.
fn kill_cgroup(cg: &Path) {
    let procs = cg.join("cgroup.procs");
    for _ in 0..100 {
        let pids = std::fs::read_to_string(&procs).unwrap_or_default();
        let pids: Vec<i32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            // SAFETY: a plain kill(2) of a process in our cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if cg.exists()
        && let Err(e) = std::fs::remove_dir(cg)
    {
        tracing::warn!(cgroup = %cg.display(), error = %e, "sandbox: its cgroup could not be removed");
    }
    if let Some(parent) = cg.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Whether any mount of this process's namespace lies under `dir`.
fn mounts_under(dir: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(m).starts_with(dir))
}

/// Removes the sandboxes an agent left under `parent` (killed before their
/// steps ended): their processes killed, their cgroups and files removed.
/// A sandbox with a mount visible here is never walked (logged instead).
/// Returns how many were removed.
pub fn reap_stale(parent: &Path) -> usize {
    // Sandboxes of agents that died and whose data root went with them:
    // their cgroups carry the dead agent's pid (`sandbox-<pid>-<n>`).
    for base in cgroups_of("").iter().filter_map(|p| p.parent()) {
        for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let pid = name
                .strip_prefix("sandbox-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                kill_cgroup(&e.path());
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let dir = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        for cg in cgroups_of(&name) {
            if cg.exists() {
                kill_cgroup(&cg);
            }
        }
        if mounts_under(&dir) {
            tracing::warn!(dir = %dir.display(), "sandbox: a mount lies under it: left in place");
            continue;
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            n += 1;
        }
    }
    let _ = std::fs::remove_dir(parent);
    n
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("sandbox: chmod {}", p.display()), e))
}

/// Removes the sandbox's directory without ever descending into a mount:
/// the temp dir (never a mount point on the host) recursively, the root's
/// known entries one by one, each with `rmdir`/`unlink` (had a mount reached
/// the host, `rmdir` of its non-empty point fails and it is left, logged).
fn remove_tree(dir: &Path, points: &[PathBuf]) {
    let _ = std::fs::remove_dir_all(dir.join("tmp"));
    let root = dir.join("root");
    let mut dirs: Vec<PathBuf> = vec![root.join("tmp")];
    for p in points {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => dirs.push(p.clone()),
            Ok(m) if m.len() == 0 || m.file_type().is_symlink() => {
                let _ = std::fs::remove_file(p);
            }
            _ => {}
        }
        // Parents made for the point (root/etc, root/opt/...).
        let mut up = p.parent();
        while let Some(d) = up.filter(|d| d.starts_with(&root)) {
            dirs.push(d.to_path_buf());
            up = d.parent();
        }
    }
    // Deepest first, so each is empty by its turn.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs.dedup();
    for d in dirs {
        if let Err(e) = std::fs::remove_dir(&d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %d.display(), error = %e, "sandbox: a directory could not be removed");
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(cg) = &self.cgroup {
            kill_cgroup(cg);
        }
        let root = self.root();
        for f in ["passwd", "group"] {
            let _ = std::fs::remove_file(root.join("etc").join(f));
        }
        let mut points: Vec<PathBuf> = SYSTEM_DIRS
            .iter()
            .map(|d| root.join(d.trim_start_matches('/')))
            .collect();
        points.extend(self.binds().into_iter().map(|(_, at)| at));
        remove_tree(&self.dir, &points);
        // The parent too, once no other sandbox is in it.
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `PGFLEET_REQUIRE_PRIVILEGES` is set (CI) a test that cannot
    /// run here fails instead of passing untested.
    fn skip(why: &str) {
        assert!(
            std::env::var_os("PGFLEET_REQUIRE_PRIVILEGES").is_none(),
            "this test would skip ({why}), but PGFLEET_REQUIRE_PRIVILEGES is set"
        );
        eprintln!("skipped: {why}");
    }

    /// A scratch directory of the test's own (removed by the test).
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pgfleet-sandbox-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A sandboxed shell as root: another user, no new privileges, a world
    /// of system files only, its /tmp the one place it writes; and nothing
    /// of it left afterwards, a process it left running included.
    #[tokio::test]
    async fn a_sandboxed_program_sees_only_the_system_and_its_tmp() {
        let scratch = scratch("view");
        let secret = scratch.join("secret.txt");
        std::fs::write(&secret, "agent secret").unwrap();
        let sb = Sandbox::new(&scratch.join("sandboxes"), user(None).unwrap(), &[]).unwrap();
        let script = format!(
            "id -u; cat {} 2>&1; ls /root 2>&1; cat /proc/self/status 2>&1 | grep NoNewPrivs; \
             echo written > /tmp/mine && cat /tmp/mine; touch /usr/x 2>&1; ls /work 2>&1; \
             (sleep 600 >/dev/null 2>&1 &) ; echo done",
            secret.display()
        );
        let out = sb
            .command(Path::new("/bin/sh"))
            .unwrap()
            .arg("-c")
            .arg(&script)
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("done"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains("agent secret"), "{text}");
        assert!(text.contains("written"), "{text}");
        let dir = sb.dir.clone();
        match sb.isolation() {
            Isolation::Full => {
                let uid = text.lines().next().unwrap();
                assert_ne!(uid, "0", "{text}");
                // /usr is read-only inside.
                assert!(text.contains("Read-only file system"), "{text}");
                // The host beyond the system is not there at all.
                assert!(text.contains("cannot access '/work'"), "{text}");
                assert!(!Path::new("/usr/x").exists(), "{text}");
                let cg = sb.cgroup.clone();
                let sandbox_uid = sb.user.as_ref().unwrap().uid.to_string();
                assert_eq!(uid, sandbox_uid);
                drop(sb);
                // The `sleep` it left is gone with its cgroup.
                if let Some(cg) = cg {
                    assert!(!cg.exists(), "{}", cg.display());
                }
                let sleeping = std::process::Command::new("pgrep")
                    .args(["-u", &sandbox_uid, "-f", "sleep 600"])
                    .output()
                    .unwrap();
                assert!(
                    sleeping.stdout.is_empty(),
                    "{}",
                    String::from_utf8_lossy(&sleeping.stdout)
                );
            }
            Isolation::User | Isolation::SameUser => drop(sb),
        }
        assert!(!dir.exists(), "{}", dir.display());
        std::fs::remove_dir_all(&scratch).unwrap();
    }

    /// Where no mount namespace can be made (a container without
    /// CAP_SYS_ADMIN), the program still runs as the sandbox user with no
    /// new privileges, in its temp dir, and cannot reach its siblings.
    #[tokio::test]
    async fn without_a_mount_namespace_the_user_is_still_switched() {
        let scratch = scratch("user");
        let Some(u) = user(None).unwrap() else {
            skip("not root: nothing to switch");
            return;
        };
        let mut sb = Sandbox::new(&scratch.join("sandboxes"), Some(u.clone()), &[]).unwrap();
        sb.mounts = false;
        assert_eq!(sb.isolation(), Isolation::User);
        let sibling = Sandbox::new(&scratch.join("sandboxes"), Some(u), &[]).unwrap();
        std::fs::write(sibling.tmp().join("theirs"), "sibling secret").unwrap();
        let script = sb
            .put(
                "s.sh",
                &format!(
                    "id -u; cat {} 2>&1; ls .. 2>&1; grep NoNewPrivs /proc/self/status",
                    sibling.tmp().join("theirs").display()
                ),
            )
            .unwrap();
        let out = sb
            .command(Path::new("/bin/sh"))
            .unwrap()
            .arg(&script)
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_ne!(text.lines().next(), Some("0"), "{text}");
        assert!(!text.contains("sibling secret"), "{text}");
        assert!(text.contains("NoNewPrivs:\t1"), "{text}");
        drop((sb, sibling));
        std::fs::remove_dir_all(&scratch).unwrap();
    }

    /// Two sandboxes (two runs' or cells') run as two uids: one cannot
    /// signal, trace or read the environment of the other's processes, and
    /// the uid comes free when its sandbox ends.
    #[tokio::test]
    async fn sandboxes_cannot_reach_each_other() {
        if !nix::unistd::geteuid().is_root() {
            skip("not root: nothing to switch (the CI runs as root)");
            return;
        }
        let scratch = scratch("apart");
        let a = Sandbox::new(&scratch.join("sandboxes"), user(None).unwrap(), &[]).unwrap();
        let b = Sandbox::new(&scratch.join("sandboxes"), user(None).unwrap(), &[]).unwrap();
        let (ua, ub) = (a.user.clone().unwrap().uid, b.user.clone().unwrap().uid);
        assert_ne!(ua, ub);
        assert!(RESERVED_UIDS.contains(&ua) && RESERVED_UIDS.contains(&ub));
        // b's process holds a secret in its environment.
        let mut victim = b
            .command(Path::new("/bin/sh"))
            .unwrap()
            .env("PGPASSWORD", "b-secret")
            .arg("-c")
            .arg("sleep 30")
            .spawn()
            .unwrap();
        let pid = victim.id().unwrap();
        let script =
            format!("id -un; cat /proc/{pid}/environ 2>&1; kill -9 {pid} 2>&1; echo kill=$?");
        let out = a
            .command(Path::new("/bin/sh"))
            .unwrap()
            .arg("-c")
            .arg(&script)
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!text.contains("b-secret"), "{text}");
        assert!(text.contains("kill=1"), "{text}");
        if a.isolation() == Isolation::Full {
            assert!(text.starts_with(RESERVED_NAME), "{text}");
        }
        assert!(victim.try_wait().unwrap().is_none(), "b's process survived");
        drop(b);
        // Its uid is free again: a new sandbox may take it.
        let path = Path::new(UID_LOCKS).join(ub.to_string());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: flock(2) on a descriptor the test owns.
        let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(locked, 0, "the uid's lock was released");
        drop((a, victim));
        std::fs::remove_dir_all(&scratch).unwrap();
    }

    /// The cgroup of a sandbox whose agent died (its pid gone) is killed
    /// and removed by the next agent's start, whatever its data root.
    #[test]
    fn a_dead_agents_sandbox_cgroup_is_reaped() {
        if !nix::unistd::geteuid().is_root() || !Path::new("/sys/fs/cgroup/pids").is_dir() {
            skip("no cgroups to make here");
            return;
        }
        // A pid above pid_max cannot be alive.
        let [cg, _] = cgroups_of("4194305-0");
        std::fs::create_dir_all(&cg).unwrap();
        reap_stale(Path::new("/nonexistent/sandboxes"));
        assert!(!cg.exists(), "{}", cg.display());
    }
}
