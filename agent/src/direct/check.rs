//! The self-check that keeps direct loads honest on any server build: a
//! small reference loaded the server's way (`COPY ... FREEZE`, then `ADD
//! PRIMARY KEY`), the same rows generated here, and the pages compared
//! byte for byte except where they must differ: the page LSN and checksum
//! (the server's pages went through its WAL), and each heap row's xmin and
//! command id (the loading transaction's; a direct row is frozen since
//! bootstrap). Where the cluster has checksums, this module's checksum of
//! every reference page must also equal the server's.
//!
//! The verdict is kept per build (binaries and version) for the agent's
//! life: the first direct load on a build pays ~1 s for it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::pages::{self, Accounts, Page};
use super::{Layout, files};
use crate::Result;
use crate::cluster::Cluster;

/// A reference table: its rows and shape.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    pub rows: u64,
    pub bigint: bool,
    pub fillfactor: u32,
    /// The fillfactor the table is created with: the same as `fillfactor`
    /// unless a test corrupts the reference's layout.
    pub created_fillfactor: u32,
}

/// The references every build is checked with: a three-level key over
/// fillfactor-90 pages with an int aid, and a bigint aid at fillfactor 100.
pub const REFERENCES: [Reference; 2] = [
    Reference {
        rows: 150_000,
        bigint: false,
        fillfactor: 90,
        created_fillfactor: 90,
    },
    Reference {
        rows: 40_000,
        bigint: true,
        fillfactor: 100,
        created_fillfactor: 100,
    },
];

fn verdicts() -> &'static Mutex<HashMap<String, Result<(), String>>> {
    static V: OnceLock<Mutex<HashMap<String, Result<(), String>>>> = OnceLock::new();
    V.get_or_init(Default::default)
}

/// The build a cluster runs: its binaries' directory and version.
pub fn build_of(cluster: &Cluster) -> String {
    let pg = &cluster.pg;
    format!("{} ({})", pg.dir.display(), pg.version)
}

/// Records a verdict for a build (the check's, or a test's).
pub fn remember(build: &str, verdict: Result<(), String>) {
    verdicts()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(build.to_string(), verdict);
}

/// Whether direct loads may run on the cluster's build: Ok, or the reason
/// they may not. Checked once per build, in the cluster (its reference
/// tables dropped after).
pub async fn verdict(cluster: &Cluster, c: &tokio_postgres::Client) -> Result<Result<(), String>> {
    let build = build_of(cluster);
    if let Some(v) = verdicts()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&build)
    {
        return Ok(v.clone());
    }
    let mut v = Ok(());
    for r in REFERENCES {
        if let Err(why) = compare(cluster, c, r).await? {
            v = Err(why);
            break;
        }
    }
    remember(&build, v.clone());
    Ok(v)
}

/// In the agent's own schema, which the workload role cannot write: the
/// superuser's session never meets an object a scenario planted.
const TABLE: &str = "pgfleet_agent.pgfleet_direct_check";

/// Loads reference `r` the server's way and compares its pages with the
/// generated ones: Ok(Err(the first difference)) when they differ.
pub async fn compare(
    cluster: &Cluster,
    c: &tokio_postgres::Client,
    r: Reference,
) -> Result<Result<(), String>> {
    use futures::SinkExt;
    let layout = super::layout(c).await.map_err(|e| e.to_string());
    let layout = match layout {
        Ok(l) => l,
        Err(why) => return Ok(Err(why)),
    };
    let aid = if r.bigint { "bigint" } else { "int" };
    c.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS pgfleet_agent; \
         REVOKE ALL ON SCHEMA pgfleet_agent FROM PUBLIC; \
         DROP TABLE IF EXISTS {TABLE}; BEGIN; \
         CREATE TABLE {TABLE} (aid {aid} NOT NULL, bid int, abalance int, filler char(84)) \
         WITH (fillfactor = {})",
        r.created_fillfactor
    ))
    .await?;
    let sink = c
        .copy_in::<_, bytes::Bytes>(&format!(
            "COPY {TABLE} (aid, bid, abalance, filler) FROM STDIN (FREEZE)"
        ))
        .await?;
    futures::pin_mut!(sink);
    let mut text = String::with_capacity(r.rows as usize * 20);
    for a in 1..=r.rows {
        use std::fmt::Write as _;
        let _ = writeln!(text, "{a}\t{}\t0\t", (a - 1) / 100_000 + 1);
    }
    sink.send(bytes::Bytes::from(text)).await?;
    sink.as_mut().finish().await?;
    c.batch_execute(&format!(
        "COMMIT; ALTER TABLE {TABLE} ADD PRIMARY KEY (aid); CHECKPOINT"
    ))
    .await?;
    let accounts = Accounts {
        lo: 1,
        hi: r.rows,
        bigint: r.bigint,
        fillfactor: r.fillfactor,
    };
    let target = super::target(c, TABLE, accounts).await?;
    let outcome = differences(cluster, layout, &target);
    c.batch_execute(&format!("DROP TABLE {TABLE}")).await?;
    Ok(outcome?.map_or(Ok(()), Err))
}

/// The first difference between the server's files and the generated
/// pages, if any.
fn differences(cluster: &Cluster, layout: Layout, t: &super::Target) -> Result<Option<String>> {
    let data = cluster.data_dir();
    let ours = super::generate(&t.accounts, layout.checksums);
    let forks = [
        (
            "heap",
            files::Fork::open(data, &t.heap_path, "", layout.seg_blocks, None)?,
        ),
        (
            "visibility map",
            files::Fork::open(data, &t.heap_path, "_vm", layout.seg_blocks, None)?,
        ),
        (
            "primary key",
            files::Fork::open(data, &t.index_path, "", layout.seg_blocks, None)?,
        ),
    ];
    for ((what, fork), ours) in forks.iter().zip(ours.iter()) {
        let theirs = fork.read_all()?;
        // COPY may extend the heap by a few pages it does not fill: they
        // stay new (zero) until used.
        let extra = theirs.iter().skip(ours.len());
        if theirs.len() < ours.len() || extra.clone().any(|p| p.iter().any(|b| *b != 0)) {
            return Ok(Some(format!(
                "the server's {what} has {} pages, the direct load's {}",
                theirs.len(),
                ours.len()
            )));
        }
        for (blk, (a, b)) in theirs.iter().zip(ours.iter()).enumerate() {
            if layout.checksums && pages::checksum(a, blk as u32) != pages::stored_checksum(a) {
                return Ok(Some(format!(
                    "the server's checksum of {what} page {blk} is {}, this agent computes {}",
                    pages::stored_checksum(a),
                    pages::checksum(a, blk as u32)
                )));
            }
            if let Some(at) = first_difference(a, b, *what == "heap") {
                return Ok(Some(format!(
                    "{what} page {blk} differs at byte {at}: the server wrote {:#04x}, \
                     the direct load {:#04x}",
                    a[at], b[at]
                )));
            }
        }
    }
    Ok(None)
}

/// The first byte where pages differ, outside the LSN and checksum and,
/// on heap pages, each row's xmin and command id.
pub fn first_difference(theirs: &Page, ours: &Page, heap: bool) -> Option<usize> {
    let mut masked = vec![false; pages::BLCKSZ];
    masked[..10].fill(true);
    if heap && pages::lower(theirs) <= pages::upper(theirs) {
        for off in 1..=pages::max_offset(theirs) {
            let (at, len) = pages::item(theirs, off);
            if len >= 24 && at + 12 <= pages::BLCKSZ {
                masked[at..at + 4].fill(true);
                masked[at + 8..at + 12].fill(true);
            }
        }
    }
    (0..pages::BLCKSZ).find(|&i| !masked[i] && theirs[i] != ours[i])
}
