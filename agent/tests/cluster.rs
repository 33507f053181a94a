//! Real PostgreSQL: provisioning, teardown on every path, and the toast-slice
//! workload's deterministic facts. Needs PostgreSQL server binaries (and, when
//! run as root, a `postgres` OS user).

mod common;

use std::path::{Path, PathBuf};

use pgfleet_agent::cluster::{Cluster, ClusterSpec, reap_stale};
use pgfleet_agent::workload::{self, CellContext};
use tokio_util::sync::CancellationToken;

fn scratch(name: &str) -> PathBuf {
    common::scratch(name)
}

fn spec(root: &Path, name: &str) -> ClusterSpec {
    common::spec(root, name, "32MB", Default::default())
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_applies_settings_and_teardown_removes_everything() {
    let root = scratch("teardown");
    let cluster = Cluster::provision(&spec(&root, "c1")).await.unwrap();
    let client = cluster.connect().await.unwrap();
    let sb: String = client
        .query_one("SHOW shared_buffers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sb, "32MB");
    let listen: String = client
        .query_one("SHOW listen_addresses", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(listen, "127.0.0.1");
    let pid = cluster.pid().unwrap();
    let port = cluster.port();
    let dir = cluster.dir().to_path_buf();
    drop(client);
    cluster.teardown().await.unwrap();
    assert!(!pid_alive(pid), "postmaster {pid} survived teardown");
    assert!(!dir.exists(), "{} survived teardown", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still open"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_cluster_stops_it_and_reap_removes_leftovers() {
    let root = scratch("drop");
    let cluster = Cluster::provision(&spec(&root, "c1")).await.unwrap();
    let pid = cluster.pid().unwrap();
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    assert!(!pid_alive(pid));
    assert!(!dir.exists());
    // A leftover directory (as an agent killed mid-provisioning would leave).
    std::fs::create_dir_all(root.join("clusters/stale/data")).unwrap();
    assert_eq!(reap_stale(&root.join("clusters")).unwrap(), 1);
    assert!(!root.join("clusters/stale").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

/// A cluster with its own volume (a loop device and a mount under its
/// directory) whose agent was killed: `reap_stale` stops the server,
/// unmounts, detaches the loop device and removes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reap_removes_a_killed_agents_volume() {
    if !pgfleet_agent::cluster::volume::available() {
        common::skip("own volumes need root, losetup and mkfs.ext4");
        return;
    }
    let root = scratch("reap-volume");
    let mut s = spec(&root, "c1");
    s.account_io = true;
    let cluster = Cluster::provision(&s).await.unwrap();
    let volume = cluster.storage_dir().to_path_buf();
    assert!(volume.ends_with("volume"), "{}", volume.display());
    let pid = cluster.pid().unwrap();
    // What an agent killed with SIGKILL leaves: no Drop runs.
    std::mem::forget(cluster);
    let mounted = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .contains(volume.to_str().unwrap())
    };
    assert!(mounted() && pid_alive(pid));
    assert_eq!(reap_stale(&root.join("clusters")).unwrap(), 1);
    assert!(!pid_alive(pid));
    assert!(!mounted(), "{} still mounted", volume.display());
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout);
    assert!(!loops.contains(root.to_str().unwrap()), "{loops}");
    assert!(!root.join("clusters/c1").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_settings_are_refused() {
    let root = scratch("reserved");
    let mut s = spec(&root, "c1");
    s.settings.insert("port".into(), "5432".into());
    let err = Cluster::provision(&s).await.err().unwrap().to_string();
    assert!(
        err.contains("`port` cannot be set: managed by pgfleet"),
        "{err}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toast_slice_reproduces_the_articles_storage_and_buffer_facts() {
    let root = scratch("toast");
    let cluster = Cluster::provision(&spec(&root, "c1")).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let mut ctx = CellContext::new("c1", &cluster, tx, CancellationToken::new());
    use pgfleet_agent::workload::toast_slice::{Dataset, Metrics, Offset, Params, StorageMode};
    use pgfleet_proto::workload::Cache;
    use pgfleet_proto::workload::Params as Kind;
    let params = |dataset, cache: Cache| {
        Kind::ToastSlice(Params {
            storage_modes: vec![StorageMode::External, StorageMode::Pglz, StorageMode::Lz4],
            dataset,
            value_bytes: 10485760,
            offsets: vec![
                Offset {
                    label: "0%".into(),
                    byte: 1,
                },
                Offset {
                    label: "90%".into(),
                    byte: 9437185,
                },
            ],
            slice_bytes: 100,
            duration_s: 0.2,
            repeats: 1,
            warmup_s: 0.1,
            cache,
        })
    };
    let out = workload::run(&mut ctx, &params(Dataset::Mixed, Cache::Warm))
        .await
        .unwrap();
    // Typed from the agent's point to the wire and back.
    let get = |mode: &str, off: u64| -> Metrics {
        let p = out
            .points
            .iter()
            .find(|p| p.params()["storage_mode"] == mode && p.params()["offset"] == off)
            .unwrap();
        serde_json::from_str(&p.metrics_json).unwrap()
    };
    let hit = |mode, off| get(mode, off).buffers_shared_hit;
    assert!(hit("external", 1) < 20 && hit("external", 9437185) < 20);
    assert!(hit("pglz", 1) < 20, "pglz start: {}", hit("pglz", 1));
    assert!(
        hit("pglz", 9437185) > 300,
        "pglz 90%: {}",
        hit("pglz", 9437185)
    );
    assert!(hit("lz4", 1) > 300, "lz4 start: {}", hit("lz4", 1));
    assert_eq!(get("external", 1).compression, None);
    assert_eq!(get("pglz", 1).compression.as_deref(), Some("pglz"));
    assert_eq!(get("lz4", 1).compression.as_deref(), Some("lz4"));
    for m in ["external", "pglz", "lz4"] {
        assert!(get(m, 1).external, "{m}");
        assert!(get(m, 1).calls > 0);
        // Floats stay floats on the wire.
        let raw = &out.points[0].metrics_json;
        assert!(
            raw.contains("\"latency_ms_p50\":") && !raw.contains("\"calls\":1.0"),
            "{raw}"
        );
    }
    // mixed compresses to roughly 5.8 MiB with both methods (article).
    for m in ["pglz", "lz4"] {
        let stored = get(m, 1).stored_bytes;
        assert!((5_000_000..7_000_000).contains(&stored), "{m}: {stored}");
    }
    let out = workload::run(&mut ctx, &params(Dataset::Incompressible, Cache::Warm))
        .await
        .unwrap();
    for p in &out.points {
        let m: Metrics = serde_json::from_str(&p.metrics_json).unwrap();
        assert_eq!(m.compression, None, "{}", p.params_json);
        assert!(m.stored_bytes >= 10485760);
    }
    // Cold: each repeat is one read right after a restart, and the same
    // facts hold.
    let pid = cluster.pid().unwrap();
    let out = workload::run(&mut ctx, &params(Dataset::Mixed, Cache::Cold))
        .await
        .unwrap();
    assert_ne!(cluster.pid().unwrap(), pid, "the cluster restarted");
    assert!(cluster.server_alive());
    for p in &out.points {
        let m: Metrics = serde_json::from_str(&p.metrics_json).unwrap();
        assert_eq!((m.calls, m.repeats), (1, 1), "{}", p.params_json);
        assert_eq!(p.params()["cache"], "cold");
    }
    drop(ctx);
    cluster.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// An emulated instance: a memory cgroup bounds the cluster's memory, page
/// cache included (reading a table larger than it leaves at most the limit
/// cached), and a CPU quota its CPU time; both go with the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emulated_instance_bounds_the_page_cache_and_the_cpus() {
    if !nix::unistd::Uid::effective().is_root() {
        common::skip("cgroups need root");
        return;
    }
    let root = scratch("instance");
    let limit: u64 = 96 << 20;
    let mut s = common::spec(&root, "c1", "16MB", Default::default());
    s.memory_bytes = limit;
    s.cpus = 1;
    let cluster = Cluster::provision(&s).await.unwrap();
    let cgroups: Vec<PathBuf> = cluster.cgroups().iter().map(|p| p.to_path_buf()).collect();
    assert_eq!(cgroups.len(), 2, "{cgroups:?}");
    let pid = cluster.pid().unwrap();
    for cg in &cgroups {
        let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l.trim() == pid.to_string()),
            "postmaster not in {}",
            cg.display()
        );
    }
    let quota = cgroups
        .iter()
        .find_map(|cg| std::fs::read_to_string(cg.join("cpu.cfs_quota_us")).ok())
        .expect("a CPU cgroup");
    assert_eq!(quota.trim(), "100000", "one CPU's time per 100 ms period");
    let c = cluster.connect_own().await.unwrap();
    // ~250 MiB of heap, well over the limit.
    c.batch_execute(
        "CREATE TABLE t (id int, pad text); \
         INSERT INTO t SELECT i, repeat(md5(i::text), 28) FROM generate_series(1, 250000) i; CHECKPOINT",
    )
    .await
    .unwrap();
    let (file, size): (String, i64) = {
        let r = c
            .query_one(
                "SELECT current_setting('data_directory') || '/' || pg_relation_filepath('t'), pg_relation_size('t')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(size as u64 > 2 * limit, "table {size} bytes");
    let n: i64 = c
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 250_000);
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES", &file])
        .output()
        .unwrap();
    let resident: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        resident <= limit,
        "{resident} bytes of the table cached, over the instance's {limit}"
    );
    drop(c);
    cluster.teardown().await.unwrap();
    for cg in &cgroups {
        assert!(!cg.exists(), "{} left behind", cg.display());
    }
    std::fs::remove_dir_all(&root).unwrap();
}
