//! Real PostgreSQL, cells that go wrong: a cell that does not fit the disk
//! is refused before anything is written; a server process that dies
//! mid-cell is explained by the server's log.

mod common;

use pgfleet_agent::cell;
use pgfleet_agent::cluster::Cluster;
use pgfleet_proto::v1::{Assign, CellStatus};
use tokio_util::sync::CancellationToken;

use common::run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_process_is_explained_by_the_server_log() {
    let root = common::scratch("killed");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", Default::default()))
        .await
        .unwrap();
    let p = common::copy_params(
        "{kind: pgbench, scale: 1, script: select-only, clients: 2, duration_s: 30}",
    );
    let killer = async {
        let c = cl.connect().await.unwrap();
        // Wait for the driver's backends, then kill one as the OOM killer would.
        for _ in 0..200 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let rows = c
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() \
                     AND query LIKE '%pgbench_accounts%' AND query NOT LIKE '%pg_stat_activity%'",
                    &[],
                )
                .await
                .unwrap();
            if let Some(r) = rows.first() {
                let pid: i32 = r.get(0);
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                return;
            }
        }
        panic!("the driver never started");
    };
    let (out, ()) = tokio::join!(
        async {
            let r = run(&cl, &p).await;
            match r {
                Err(e) => Err(cl.explain_failure(e).await),
                ok => ok,
            }
        },
        killer
    );
    let e = out.unwrap_err().to_string();
    assert!(e.contains("terminated by signal 9"), "{e}");
    assert!(e.contains("postgres.log"), "{e}");
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// A cell whose data would not fit is refused at provision, naming the space
/// needed and free, before initdb. The data root is a 64 MiB tmpfs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_larger_than_the_free_disk_is_refused_before_loading() {
    if !nix::unistd::Uid::effective().is_root() {
        common::skip("mounting a small tmpfs needs root");
        return;
    }
    let root = common::scratch("full");
    let status = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=64m,mode=755",
            "pgfleet-test",
            root.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let env = common::agent_env(&root, &root.join("datasets"));
    let p = common::params("{kind: pgbench-init, scale: 40}");
    let assign = Assign {
        cell_id: "big".into(),
        run_id: "r".into(),
        workload: p.kind().name().into(),
        params_json: p.to_json(),
        settings: Default::default(),
        role: String::new(),
        peers: Vec::new(),
        traceparent: String::new(),
        dataset: String::new(),
        reuse_cluster: false,
    };
    let (tx, _rx) = tokio::sync::mpsc::channel(4096);
    let control = cell::Control {
        cancel: CancellationToken::new(),
        release: CancellationToken::new(),
        peers: tokio::sync::watch::channel(Default::default()).1,
    };
    let params = pgfleet_agent::assign::check(&assign).expect("a valid assignment");
    let r = cell::run(&env, assign, params, tx, control).await;
    let _ = std::process::Command::new("umount").arg(&root).status();
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(r.status, CellStatus::Failed as i32);
    assert!(
        r.error.contains("needs about") && r.error.contains("free"),
        "{}",
        r.error
    );
    assert!(!root.join("clusters").join("big").exists());
}
