//! The remote dataset store against a real S3-compatible server, with real
//! clusters and the real cell path: a dataset built on one host is uploaded,
//! a cell on another host (another local store) downloads and restores it
//! and measures alike; a corrupted part is caught by its SHA-256, the remote
//! copy discarded and the dataset built and uploaded again; an unreachable
//! store leaves the cell to build it.
//!
//! The server is s3s-fs (the s3s project's S3 API over a directory, made for
//! integration tests; rustfs is a whole distributed server, far heavier to
//! build for this), served by hyper on loopback inside this test process,
//! with SigV4 authentication on: object_store talks S3 to it as to AWS.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pgfleet_agent::cell::AgentEnv;
use pgfleet_agent::remote::Remote;
use serde_json::Value as Json;

use common::{run_cell, scratch, succeeded};

const ACCESS_KEY: &str = "pgfleet-test";
const SECRET_KEY: &str = "pgfleet-test-secret";
const BUCKET: &str = "datasets";

/// s3s-fs on a free loopback port, its objects under `root`; the address.
async fn s3_server(root: &Path) -> String {
    std::fs::create_dir_all(root.join(BUCKET)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let root = root.to_path_buf();
    tokio::spawn(async move { common::s3::serve(&root, listener, ACCESS_KEY, SECRET_KEY).await });
    format!("http://{addr}")
}

/// A remote store at `endpoint` (credentials as the environment gives them).
fn remote(endpoint: &str) -> Arc<Remote> {
    // SAFETY: set before any other thread of this test process reads the
    // environment (nextest runs each test in its own process).
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT_URL", endpoint);
    }
    Arc::new(Remote::open(&format!("s3://{BUCKET}/pgfleet")).unwrap())
}

fn env(root: &Path, store: &Path, remote: Option<Arc<Remote>>) -> AgentEnv {
    AgentEnv {
        remote,
        ..common::agent_env(root, store)
    }
}

const VACUUM: &str = "{kind: vacuum-bloat, scale: 2, bloat_bytes: 8MiB}";

/// The vacuum cell's figures that depend only on its starting data.
fn data_figures(m: &Json) -> Vec<Json> {
    ["rows_loaded", "rows_updated", "table_bytes"]
        .iter()
        .map(|k| m[*k].clone())
        .collect()
}

/// Every stored part of the remote dataset, largest first.
fn parts(s3_root: &Path, fingerprint: &str) -> Vec<PathBuf> {
    let dir = s3_root
        .join(BUCKET)
        .join("pgfleet")
        .join(fingerprint)
        .join("parts");
    // parts/<upload>/NNNNN.zst
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flat_map(|upload| std::fs::read_dir(upload.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "zst"))
        .collect();
    parts.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).unwrap().len()));
    parts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_crosses_hosts_through_the_object_store_and_a_bad_part_is_caught() {
    let dir = scratch("remote");
    let s3_root = dir.join("s3");
    let endpoint = s3_server(&s3_root).await;
    let r = remote(&endpoint);

    // Host A builds it and uploads it.
    let a = env(&dir.join("a"), &dir.join("a-store"), Some(r.clone()));
    let (built, built_metrics) = succeeded(&run_cell(&a, "w0-a", VACUUM, "reuse").await);
    assert_eq!(built["how"], "built", "{built}");
    assert!(built["upload_seconds"].as_f64().unwrap() > 0.0, "{built}");
    let uploaded = built["uploaded_bytes"].as_u64().unwrap();
    let raw = built["bytes"].as_u64().unwrap();
    assert!(
        uploaded > 0 && uploaded < raw,
        "compressed {uploaded} of {raw}"
    );
    assert!(built.get("remote_error").is_none(), "{built}");
    let fp = built["fingerprint"].as_str().unwrap().to_string();
    let manifest = s3_root
        .join(BUCKET)
        .join("pgfleet")
        .join(&fp)
        .join("manifest.json");
    assert!(manifest.is_file(), "{}", manifest.display());

    // Host B (its own, empty store) downloads and restores it: same data.
    let b = env(&dir.join("b"), &dir.join("b-store"), Some(r.clone()));
    let (restored, restored_metrics) = succeeded(&run_cell(&b, "w0-b", VACUUM, "reuse").await);
    assert_eq!(restored["how"], "restored", "{restored}");
    assert!(
        restored["download_seconds"].as_f64().unwrap() > 0.0,
        "{restored}"
    );
    assert_eq!(restored["fingerprint"], fp.as_str());
    assert_eq!(
        data_figures(&restored_metrics),
        data_figures(&built_metrics)
    );
    eprintln!("built: {built}\nrestored: {restored}");
    assert!(
        dir.join("b-store")
            .join(&fp)
            .join("manifest.json")
            .is_file()
    );

    // A part changed in the bucket: caught by its SHA-256 on host C, the
    // remote copy discarded, the dataset built there and uploaded again.
    let part = parts(&s3_root, &fp).remove(0);
    let mut bytes = std::fs::read(&part).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&part, &bytes).unwrap();
    let c = env(&dir.join("c"), &dir.join("c-store"), Some(r.clone()));
    let (rebuilt, _) = succeeded(&run_cell(&c, "w0-c", VACUUM, "reuse").await);
    assert_eq!(rebuilt["how"], "built", "{rebuilt}");
    let why = rebuilt["discarded"].as_str().unwrap_or_default();
    assert!(
        why.contains("the copy in s3://datasets/pgfleet") && why.contains("SHA-256"),
        "{rebuilt}"
    );
    assert!(
        rebuilt["upload_seconds"].as_f64().unwrap() > 0.0,
        "uploaded again: {rebuilt}"
    );
    let again = r.find(&fp).await.unwrap().expect("a new remote manifest");
    assert_eq!(again.manifest.built_by, "w0-c");
    assert!(!part.exists(), "the corrupt copy's parts are removed");
    assert_eq!(parts(&s3_root, &fp).len(), again.parts.len());
    // Nothing half-written is left in C's store.
    let leftovers: Vec<String> = std::fs::read_dir(dir.join("c-store"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".building"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // An unreachable store: noted, and the cell builds the dataset itself.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        remote(&format!("http://{a}"))
    };
    let d = env(&dir.join("d"), &dir.join("d-store"), Some(dead));
    let (local, _) = succeeded(&run_cell(&d, "w0-d", VACUUM, "reuse").await);
    assert_eq!(local["how"], "built", "{local}");
    assert!(
        local["remote_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{local}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
