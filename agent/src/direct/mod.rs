//! `load_method: direct`: pgbench_accounts written as PostgreSQL's own
//! files, at the device's speed, instead of parsed from a COPY stream by one
//! backend.
//!
//! pgbench's rows are fully determined by the scale, and the page formats
//! are documented and stable, so the agent writes what `COPY FREEZE` and
//! `CREATE INDEX` would leave: the heap's pages (frozen rows, all-visible),
//! the visibility map (all-visible and all-frozen) and the primary key,
//! with data checksums where the cluster has them. The flow
//! (`pgbench_init`): the same DDL as a copy load, the keys added to the
//! empty tables, a CHECKPOINT and a clean stop; then this module replaces
//! the relations' files (heap segments in parallel, one per core, the
//! indexes and maps beside them); the server starts again, and pgbench's
//! VACUUM ANALYZE records the free space map and the statistics as it would
//! after `pgbench -i` (every page is all-frozen: it reads almost nothing).
//!
//! Trust: before the first direct load on a PostgreSQL build, `check`
//! loads a small reference the server's way and compares its pages with
//! these; a build whose pages differ (another block size, a future page
//! format) is refused with the reason and the load runs as `copy`.

pub mod btree;
pub mod check;
pub mod files;
pub mod pages;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pages::{Accounts, BLCKSZ, Page};

use crate::cluster::RunAs;
use crate::{Error, Result};

/// One accounts table (the flat table or a partition) and where its files are.
#[derive(Debug, Clone)]
pub struct Target {
    pub heap_path: String,
    pub index_path: String,
    pub accounts: Accounts,
}

/// What the server's build says of its files.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub checksums: bool,
    /// Blocks per segment file (131,072: 1 GiB).
    pub seg_blocks: u64,
}

fn derr(message: String) -> Error {
    Error::Workload {
        workload: "direct load".into(),
        message,
    }
}

/// The server's layout, refused unless its blocks are 8 KiB.
pub async fn layout(c: &tokio_postgres::Client) -> Result<Layout> {
    let row = c
        .query_one(
            "SELECT current_setting('block_size')::int, \
                    (SELECT setting::bigint FROM pg_settings WHERE name = 'segment_size'), \
                    current_setting('data_checksums') = 'on'",
            &[],
        )
        .await?;
    let block: i32 = row.get(0);
    if block as usize != BLCKSZ {
        return Err(derr(format!(
            "the server's blocks are {block} bytes; a direct load writes 8,192-byte pages"
        )));
    }
    Ok(Layout {
        seg_blocks: row.get::<_, i64>(1).max(1) as u64,
        checksums: row.get(2),
    })
}

/// Where the server keeps `table`'s heap and its primary key.
pub async fn target(c: &tokio_postgres::Client, table: &str, accounts: Accounts) -> Result<Target> {
    let row = c
        .query_one(
            "SELECT pg_relation_filepath(c.oid), pg_relation_filepath(i.indexrelid) \
             FROM pg_class c JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary \
             WHERE c.oid = $1::text::regclass",
            &[&table],
        )
        .await?;
    let target = Target {
        heap_path: row.get(0),
        index_path: row.get(1),
        accounts,
    };
    files::parse_relpath(&target.heap_path)?;
    files::parse_relpath(&target.index_path)?;
    Ok(target)
}

/// One piece of the work: a heap segment's blocks, or a whole index or map.
enum Piece<'t> {
    Heap(&'t Target, u64, u64),
    Index(&'t Target),
    Map(&'t Target),
}

/// How far a load has come: pages written of the total.
#[derive(Debug, Default)]
pub struct Progress {
    pub pages: AtomicU64,
    pub total: AtomicU64,
}

/// Pages of every fork the targets need.
pub fn total_pages(targets: &[Target]) -> u64 {
    targets
        .iter()
        .map(|t| {
            let heap = t.accounts.pages();
            heap + pages::vm_pages(heap) + index_pages_estimate(&t.accounts)
        })
        .sum()
}

/// The index's pages, near enough for progress: 366 keys per leaf.
fn index_pages_estimate(a: &Accounts) -> u64 {
    a.rows().div_ceil(366) * 1003 / 1000 + 1
}

/// Writes the targets' files into the (stopped) server's data directory on
/// `threads` threads; returns the bytes written. Blocking: run it off the
/// async workers. `stop` ends it early with an error.
pub fn write(
    data: &Path,
    owner: Option<&RunAs>,
    layout: Layout,
    targets: &[Target],
    threads: usize,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<u64> {
    progress
        .total
        .store(total_pages(targets), Ordering::Relaxed);
    let mut pieces = Vec::new();
    for t in targets {
        let heap = t.accounts.pages();
        for fork in [
            files::Fork::open(data, &t.heap_path, "", layout.seg_blocks, owner)?,
            files::Fork::open(data, &t.heap_path, "_vm", layout.seg_blocks, owner)?,
        ]
        .iter()
        .zip([heap, pages::vm_pages(heap)])
        {
            fork.0.prepare(fork.1)?;
        }
        // The index's fork is prepared by its writer, which alone knows
        // its length; its first segment exists (an empty key's metapage).
        pieces.push(Piece::Index(t));
        pieces.push(Piece::Map(t));
        let mut lo = 0;
        while lo < heap {
            let hi = ((lo / layout.seg_blocks + 1) * layout.seg_blocks).min(heap);
            pieces.push(Piece::Heap(t, lo, hi));
            lo = hi;
        }
    }
    let next = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let run = |piece: &Piece| -> Result<()> {
        let n = match piece {
            Piece::Heap(t, lo, hi) => write_heap(data, owner, layout, t, *lo, *hi, progress, stop)?,
            Piece::Map(t) => write_map(data, owner, layout, t)?,
            Piece::Index(t) => write_index(data, owner, layout, t, progress, stop)?,
        };
        progress.pages.fetch_add(
            if matches!(piece, Piece::Map(_)) { n } else { 0 },
            Ordering::Relaxed,
        );
        bytes.fetch_add(n * BLCKSZ as u64, Ordering::Relaxed);
        Ok(())
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    while let Some(p) = pieces.get(next.fetch_add(1, Ordering::Relaxed) as usize) {
                        if let Err(e) = run(p) {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut first = Ok(());
        for w in workers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(derr("a writer thread panicked".into())));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })?;
    Ok(bytes.load(Ordering::Relaxed))
}

fn stopped(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::Relaxed) {
        Err(Error::Cancelled("the direct load was stopped".into()))
    } else {
        Ok(())
    }
}

fn io(e: std::io::Error) -> Error {
    Error::io("writing a relation file", e)
}

#[allow(clippy::too_many_arguments)]
fn write_heap(
    data: &Path,
    owner: Option<&RunAs>,
    layout: Layout,
    t: &Target,
    lo: u64,
    hi: u64,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<u64> {
    let fork = files::Fork::open(data, &t.heap_path, "", layout.seg_blocks, owner)?;
    let mut w = files::Writer::new(&fork);
    let mut page: Box<Page> = Box::new([0u8; BLCKSZ]);
    for blk in lo..hi {
        t.accounts.heap_page(blk, layout.checksums, &mut page);
        w.put(blk, &page).map_err(io)?;
        if blk % 128 == 127 {
            progress.pages.fetch_add(128, Ordering::Relaxed);
            stopped(stop)?;
        }
    }
    progress.pages.fetch_add((hi - lo) % 128, Ordering::Relaxed);
    w.finish().map_err(io)
}

fn write_map(data: &Path, owner: Option<&RunAs>, layout: Layout, t: &Target) -> Result<u64> {
    let fork = files::Fork::open(data, &t.heap_path, "_vm", layout.seg_blocks, owner)?;
    let heap = t.accounts.pages();
    let mut w = files::Writer::new(&fork);
    let mut page: Box<Page> = Box::new([0u8; BLCKSZ]);
    for blk in 0..pages::vm_pages(heap) {
        pages::vm_page(heap, blk, layout.checksums, &mut page);
        w.put(blk, &page).map_err(io)?;
    }
    let n = w.finish().map_err(io)?;
    fork.sync_dir()?;
    Ok(n)
}

fn write_index(
    data: &Path,
    owner: Option<&RunAs>,
    layout: Layout,
    t: &Target,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<u64> {
    let fork = files::Fork::open(data, &t.index_path, "", layout.seg_blocks, owner)?;
    // Emptied (the key of the empty table had a metapage); the writer
    // makes the segments the index needs.
    fork.prepare(1)?;
    let mut w = files::Writer::new(&fork);
    let checksums = layout.checksums;
    let mut b = btree::Builder::new(|blk, p: &mut Page| {
        pages::seal(p, blk, checksums);
        w.put(blk as u64, p)?;
        if blk % 128 == 0 {
            progress.pages.fetch_add(128, Ordering::Relaxed);
            if stop.load(Ordering::Relaxed) {
                return Err(std::io::Error::other("stopped"));
            }
        }
        Ok(())
    });
    let a = &t.accounts;
    for aid in a.lo..=a.hi {
        if let Err(e) = b.push(aid, a.bigint, a.tid(aid)) {
            stopped(stop)?;
            return Err(io(e));
        }
    }
    let blocks = b.finish().map_err(io)? as u64;
    w.finish().map_err(io)?;
    fork.truncate_to(blocks)?;
    fork.sync_dir()?;
    Ok(blocks)
}

/// Writes the pages of one target into memory (the self-check): heap,
/// visibility map, index.
pub fn generate(t: &Accounts, checksums: bool) -> [Vec<Box<Page>>; 3] {
    let heap = (0..t.pages())
        .map(|b| {
            let mut p = Box::new([0u8; BLCKSZ]);
            t.heap_page(b, checksums, &mut p);
            p
        })
        .collect();
    let vm = (0..pages::vm_pages(t.pages()))
        .map(|b| {
            let mut p = Box::new([0u8; BLCKSZ]);
            pages::vm_page(t.pages(), b, checksums, &mut p);
            p
        })
        .collect();
    let mut index: Vec<Box<Page>> = Vec::new();
    {
        let mut b = btree::Builder::new(|blk, p: &mut Page| {
            pages::seal(p, blk, checksums);
            let blk = blk as usize;
            if index.len() <= blk {
                index.resize_with(blk + 1, || Box::new([0u8; BLCKSZ]));
            }
            *index[blk] = *p;
            Ok(())
        });
        for aid in t.lo..=t.hi {
            b.push(aid, t.bigint, t.tid(aid))
                .expect("building in memory cannot fail");
        }
        b.finish().expect("building in memory cannot fail");
    }
    [heap, vm, index]
}
