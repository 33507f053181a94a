//! The leak audit: a cell on emulated storage and an emulated instance
//! (its own loop device and file system, block-I/O caps, memory and CPU
//! cgroups, a stall fault, the sampler) is failed at each of its steps in
//! turn (`failpoint::STEPS`), through the agent's real cell path; after
//! each, nothing it made is left: mounts, loop devices, throttle rules,
//! cgroups, processes, threads, files.

mod common;

use std::path::Path;

use pgfleet_agent::cell::Instance;
use pgfleet_agent::cluster::throttle::Caps;
use pgfleet_agent::failpoint;
use pgfleet_proto::v1::CellStatus;

/// What is left on the host of cells whose ids start with `prefix` and
/// whose files are under `root`.
fn leftovers(root: &Path, prefix: &str) -> Vec<String> {
    let mut left = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for m in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
        if Path::new(m).starts_with(root) {
            left.push(format!("mount {m}"));
        }
    }
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file"))
            && Path::new(b.trim()).starts_with(root)
        {
            left.push(format!("loop device {:?} on {}", e.file_name(), b.trim()));
        }
    }
    for f in [
        "blkio.throttle.read_iops_device",
        "blkio.throttle.write_iops_device",
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
    ] {
        let rules =
            std::fs::read_to_string(Path::new("/sys/fs/cgroup/blkio").join(f)).unwrap_or_default();
        for dev in rules.lines().filter_map(|l| l.split_whitespace().next()) {
            let attached = Path::new(&format!("/sys/dev/block/{dev}/loop/backing_file")).exists();
            if dev.starts_with("7:") && !attached {
                left.push(format!("{f} rule on detached loop device {dev}"));
            }
        }
    }
    // Cgroups: pgfleet's parents in every hierarchy, v1 and v2.
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let mut parents = vec![hierarchy.path()];
        parents.extend(
            std::fs::read_dir(hierarchy.path())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir()),
        );
        for parent in parents {
            for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(prefix) {
                    left.push(format!("cgroup {}", e.path().display()));
                }
            }
        }
    }
    let needle = root.to_string_lossy().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .unwrap_or_default()
            .contains(") Z ");
        if cmd.contains(&needle) && !zombie {
            left.push(format!("process {:?}: {cmd}", e.file_name()));
        }
    }
    for sub in ["clusters", "sandboxes"] {
        for e in std::fs::read_dir(root.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            left.push(format!("file {}", e.path().display()));
        }
    }
    left
}

/// This process's driver threads (`pgfleet-driver-N`): each ends with its
/// cell, whatever ended it.
fn driver_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("pgfleet-driver"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_failed_at_each_step_leaves_nothing() {
    if !nix::unistd::geteuid().is_root()
        || !Path::new("/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device").exists()
    {
        common::skip("emulated storage needs root and cgroup v1 blkio");
        return;
    }
    let root = common::scratch("leaks");
    let store = root.join("store");
    let mut env = common::agent_env(&root, &store);
    env.storage_profile = "gp3".into();
    env.caps = Caps {
        read_iops: 3000,
        write_iops: 3000,
        read_mbps: 125,
        write_mbps: 125,
        combined: true,
        latency: Default::default(),
    };
    env.emulated = true;
    env.instance = Instance {
        instance_type: "leak.small".into(),
        memory_bytes: 1 << 30,
        cpus: 1,
        emulated: true,
    };
    let entry = "{kind: pgbench, scale: 1, load_method: copy, script: tpcb-like, clients: 2, \
                 duration_s: 6, warmup_s: 0, faults: [{kind: stall, at_s: 2, duration_s: 2}]}";
    // A clean run first: it succeeds and leaves nothing (the baseline for
    // the failures below, and the threads the runtime keeps).
    failpoint::set(None);
    let ok = common::run_cell(&env, "leak-none", entry, "fresh").await;
    assert_eq!(ok.status, CellStatus::Succeeded as i32, "{}", ok.error);
    let left = leftovers(&root, "leak-");
    assert!(left.is_empty(), "a succeeded cell left {left:?}");
    assert_eq!(driver_threads(), 0);
    // Rate caps on a loop device, then a volume the agent serves (gp3's
    // latency): the same steps fail, and leave nothing either way.
    let steps = failpoint::STEPS.iter().map(|s| (s, false));
    let served = failpoint::STEPS.iter().map(|s| (s, true));
    for (step, served) in steps.chain(served) {
        if served {
            env.caps.latency = pgfleet_proto::environment::Latency {
                read_us: 1000,
                write_us: 1000,
                flush_us: 0,
            };
        }
        failpoint::set(Some(step));
        let cell = format!("leak-{step}-{served}");
        let r = common::run_cell(&env, &cell, entry, "fresh").await;
        failpoint::set(None);
        match *step {
            // Inside the volume's creation: the cell goes on without a
            // volume of its own (its caps on a cgroup instead), unless the
            // agent serves it (its latency needs it).
            "volume" | "mount" if !served => {}
            _ => {
                assert_eq!(r.status, CellStatus::Failed as i32, "{step}: {r:?}");
                assert!(
                    r.error.contains(&format!("failpoint `{step}`")),
                    "{step}: {}",
                    r.error
                );
            }
        }
        let left = leftovers(&root, "leak-");
        assert!(
            left.is_empty(),
            "failed at `{step}`, the cell left {left:?}"
        );
        // Driver threads end with their cell (a moment to join).
        let mut n = driver_threads();
        for _ in 0..50 {
            if n == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            n = driver_threads();
        }
        assert_eq!(n, 0, "failed at `{step}`: driver threads left");
    }
    std::fs::remove_dir_all(&root).unwrap();
}
