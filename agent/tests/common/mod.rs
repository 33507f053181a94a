//! What the agent's PostgreSQL tests share: a scratch dir the server's user
//! can reach, and a cluster spec in it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pgfleet_agent::cluster::ClusterSpec;
use pgfleet_agent::cluster::RunAs;
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::pgbin::PgBin;

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgfleet-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

pub fn spec(root: &Path, name: &str, shared_buffers: &str, caps: Caps) -> ClusterSpec {
    ClusterSpec {
        pg: PgBin::find(
            std::env::var_os("PGFLEET_PG_BIN")
                .map(PathBuf::from)
                .as_deref(),
        )
        .unwrap(),
        clusters_dir: root.join("clusters"),
        name: name.into(),
        run_as: RunAs::resolve("postgres").unwrap(),
        settings: BTreeMap::from([("shared_buffers".into(), shared_buffers.into())]),
        listen: Vec::new(),
        peers: Vec::new(),
        caps,
    }
}
