//! Facts about the host the agent runs on: cores, memory, hostname, free disk.

pub fn cores() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Total memory from `/proc/meminfo`, in bytes (0 if unreadable).
pub fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// Bytes available to unprivileged users on the filesystem holding `path`
/// (or its nearest existing ancestor, for a directory not created yet).
pub fn free_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    let mut p = path;
    while !p.exists() {
        p = p.parent().unwrap_or(std::path::Path::new("/"));
    }
    let s = nix::sys::statvfs::statvfs(p).map_err(std::io::Error::from)?;
    Ok(s.blocks_available() as u64 * s.fragment_size() as u64)
}
