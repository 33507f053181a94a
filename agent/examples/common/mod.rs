//! What the benchmark examples share: a scratch cluster and CPU time.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use pgfleet_agent::cluster::{Cluster, ClusterSpec, RunAs};
use pgfleet_agent::pgbin::PgBin;

/// User + system CPU seconds of `who` (RUSAGE_SELF or RUSAGE_CHILDREN).
pub fn cpu_seconds(who: i32) -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(who, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// A cluster under a fresh temp dir; returns it with that dir (remove it
/// after `teardown`).
pub async fn cluster(settings: &[(&str, &str)]) -> anyhow::Result<(Cluster, PathBuf)> {
    let root = std::env::temp_dir().join(format!("pgfleet-bench-{}", std::process::id()));
    std::fs::create_dir_all(root.join("clusters"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
    let spec = ClusterSpec {
        pg: PgBin::find(
            std::env::var_os("PGFLEET_PG_BIN")
                .map(PathBuf::from)
                .as_deref(),
        )?,
        clusters_dir: root.join("clusters"),
        name: "bench".into(),
        run_as: RunAs::resolve("postgres")?,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        caps: Default::default(),
        account_io: false,
        allow_shell: false,
        listen: Vec::new(),
        peers: Vec::new(),
        memory_bytes: 0,
        cpus: 0,
    };
    Ok((Cluster::provision(&spec).await?, root))
}
