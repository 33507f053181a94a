//! `compression-analysis`: seeds/004's `csm_compress_analysis` on stock
//! PostgreSQL (what, and the slot model: `pgfleet_proto::workload::
//! compression_analysis`). Here, how:
//!
//! 1. the dataset: pgbench's tables (the parallel loader), order documents
//!    (`orders`, toast-probe's generator, default storage) or the scenario's
//!    `setup_sql`; then `VACUUM ANALYZE`, `VACUUM` and a `CHECKPOINT`;
//! 2. the relations: tables, indexes and materialized views in `public`
//!    (TOAST relations live in `pg_toast` and are not listed), or those the
//!    scenario names, which must exist;
//! 3. per relation and sample fraction, the sampled blocks are read in
//!    batches with pageinspect's `get_raw_page` (through shared buffers: the
//!    page as PostgreSQL would write it) and each batch compressed on a
//!    blocking thread, per algorithm, timing the thread's CPU clock
//!    (`CLOCK_THREAD_CPUTIME_ID`) around that algorithm's pages.

use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_postgres::Client;

use super::context::{CellContext, Output};
use super::pgbench_init;
use crate::{Error, Result};

pub use pgfleet_proto::workload::compression_analysis::{
    Metrics, PAGE_BYTES, Params, Point, PointParams, SLOTS, sample_blocks, slot_bytes,
};

/// Pages read per round trip.
const BATCH: usize = 256;

pub fn run<'a>(ctx: &'a mut CellContext<'_>, p: &'a Params) -> BoxFuture<'a, Result<Output>> {
    async move {
        let mut client = ctx.cluster.connect().await?;
        // pageinspect lives in a schema of the agent's (the workload role
        // owns `public` and could replace what is there).
        client
            .batch_execute(
                "CREATE SCHEMA IF NOT EXISTS pgfleet_agent; \
                 REVOKE ALL ON SCHEMA pgfleet_agent FROM PUBLIC; \
                 CREATE EXTENSION IF NOT EXISTS pageinspect WITH SCHEMA pgfleet_agent",
            )
            .await
            .map_err(|e| werr(format!("pageinspect is needed to read pages: {e}")))?;
        ctx.progress("load", 0, 1, format!("dataset {}", p.dataset));
        match p.dataset.as_str() {
            "pgbench" => {
                let init = p.init.as_ref().ok_or_else(|| werr("dataset pgbench without its scale".into()))?;
                pgbench_init::load(ctx, init).await?;
                // A direct load restarts the server: a new session.
                client = ctx.cluster.connect().await?;
            }
            "json" => {
                // The documents' source table is the agent's own; `orders`,
                // the relation analysed, is the dataset's (public).
                let own = ctx.cluster.connect_own().await?;
                own.batch_execute("DROP TABLE IF EXISTS public.orders; CREATE TABLE public.orders (id int PRIMARY KEY, body jsonb)")
                    .await?;
                super::documents::load_documents(&own, "public.orders", p.json_documents, (25, 100), 0.42).await?;
            }
            // Scenario text: as the workload role, never the superuser.
            _ => ctx
                .cluster
                .workload_server()
                .connect()
                .await?
                .batch_execute(&p.setup_sql)
                .await
                .map_err(|e| werr(format!("setup_sql failed (it runs as {}, not a superuser): {}", crate::cluster::WORKLOAD_ROLE, e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string()))))?,
        }
        ctx.check_cancel()?;
        // Twice: from 16 a bulk load extends a relation many pages at a
        // time, and the empty pages it leaves at the end go only with the
        // second VACUUM (measured on 18.6: 704, 704, then 667 pages), so
        // sizes and samples are the same on every rerun.
        client.batch_execute("VACUUM ANALYZE").await?;
        client.batch_execute("VACUUM").await?;
        client.batch_execute("CHECKPOINT").await?;

        // Empty relations (no pages) have nothing to sample.
        let rels: Vec<Relation> = relations(&client, &p.relations).await?.into_iter().filter(|r| r.pages > 0).collect();
        let total: u64 = rels
            .iter()
            .map(|r| p.sample_fractions.iter().map(|f| sample_blocks(r.pages, *f).len() as u64).sum::<u64>())
            .sum();
        let mut done = 0;
        let mut points = Vec::new();
        for rel in &rels {
            for fraction in &p.sample_fractions {
                ctx.check_cancel()?;
                let blocks = sample_blocks(rel.pages, *fraction);
                let mut acc: Vec<Acc> = p.algorithms.iter().map(|_| Acc::default()).collect();
                let mut read_ms = 0.0;
                for batch in blocks.chunks(BATCH) {
                    ctx.check_cancel()?;
                    let t = Instant::now();
                    let pages = read_pages(&client, &rel.qualified, batch).await?;
                    read_ms += t.elapsed().as_secs_f64() * 1e3;
                    let algorithms = p.algorithms.clone();
                    let level = p.zstd_level;
                    let sizes = tokio::task::spawn_blocking(move || compress_all(&pages, &algorithms, level))
                        .await
                        .map_err(|e| werr(format!("compression thread: {e}")))??;
                    for (a, (sizes, cpu)) in acc.iter_mut().zip(sizes) {
                        a.sizes.extend(sizes);
                        a.cpu_ns += cpu;
                    }
                    done += batch.len() as u64;
                    ctx.progress("analyse", done, total, format!("{} at {}", rel.name, fraction));
                }
                for (alg, a) in p.algorithms.iter().zip(acc) {
                    let m = a.metrics(rel, p.slot_header_bytes as u64, read_ms);
                    let pt = Point {
                        params: PointParams {
                            relation: rel.name.clone(),
                            relkind: rel.kind.clone(),
                            sample_fraction: *fraction,
                            algorithm: alg.clone(),
                            zstd_level: p.zstd_level,
                            slot_header_bytes: p.slot_header_bytes,
                        },
                        metrics: m,
                    };
                    ctx.sample("analysis", &pt).await?;
                    points.push(pt);
                }
            }
        }
        Ok(Output::of(&points))
    }
    .boxed()
}

fn werr(message: String) -> Error {
    Error::Workload {
        workload: "compression-analysis".into(),
        message,
    }
}

#[derive(Clone)]
pub struct Relation {
    /// Its name in `public` (as reports and `relations:` name it).
    pub name: String,
    /// Schema-qualified and quoted, as `get_raw_page` reads it (the
    /// superuser's search_path holds only pg_catalog by then).
    pub qualified: String,
    pub kind: String,
    pub pages: u64,
}

/// The relations to analyse, by name.
pub async fn relations(client: &Client, only: &[String]) -> Result<Vec<Relation>> {
    let rows = client
        .query(
            "SELECT c.relname::text, c.relkind::text, pg_relation_size(c.oid) / current_setting('block_size')::bigint, \
                    quote_ident(n.nspname) || '.' || quote_ident(c.relname) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 'm') ORDER BY c.relkind DESC, 1",
            &[],
        )
        .await?;
    let all: Vec<Relation> = rows
        .iter()
        .map(|r| Relation {
            name: r.get(0),
            qualified: r.get(3),
            kind: r.get(1),
            pages: r.get::<_, i64>(2) as u64,
        })
        .collect();
    if only.is_empty() {
        return Ok(all);
    }
    let mut out = Vec::new();
    for name in only {
        match all.iter().position(|r| &r.name == name) {
            Some(i) => out.push(all[i].clone()),
            None => {
                let known: Vec<&str> = all.iter().map(|r| r.name.as_str()).collect();
                return Err(werr(format!(
                    "relation `{name}` is not a table, index or materialized view of the dataset: known {}",
                    known.join(", ")
                )));
            }
        }
    }
    Ok(out)
}

/// The raw 8 KiB images of `blocks` of `rel`, in order.
pub async fn read_pages(client: &Client, rel: &str, blocks: &[u64]) -> Result<Vec<Vec<u8>>> {
    let ids: Vec<i64> = blocks.iter().map(|b| *b as i64).collect();
    let rows = client
        .query(
            "SELECT pgfleet_agent.get_raw_page($1, 'main', b) FROM unnest($2::int8[]) WITH ORDINALITY AS s(b, i) ORDER BY i",
            &[&rel, &ids],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get::<_, Vec<u8>>(0)).collect())
}

/// Per algorithm: each page's compressed size, and the thread CPU
/// nanoseconds spent compressing them.
pub fn compress_all(
    pages: &[Vec<u8>],
    algorithms: &[String],
    zstd_level: i32,
) -> Result<Vec<(Vec<u64>, u64)>> {
    let mut c = PageCompressor::new(zstd_level)?;
    let mut out = Vec::new();
    for alg in algorithms {
        let start = thread_cpu_ns();
        let mut sizes = Vec::with_capacity(pages.len());
        for page in pages {
            sizes.push(c.size(alg, page)?);
        }
        out.push((sizes, thread_cpu_ns().saturating_sub(start)));
    }
    Ok(out)
}

/// One page's compressed size with `alg` (see `PageCompressor::size`).
pub fn compressed_size(alg: &str, page: &[u8], zstd_level: i32) -> Result<u64> {
    PageCompressor::new(zstd_level)?.size(alg, page)
}

/// The compressors, with zstd's context kept across pages (creating one
/// per page costs more than compressing a page at low levels; the output
/// is the same as a one-shot `ZSTD_compress`).
pub struct PageCompressor {
    zstd: zstd::bulk::Compressor<'static>,
}

impl PageCompressor {
    pub fn new(zstd_level: i32) -> Result<PageCompressor> {
        Ok(PageCompressor {
            zstd: zstd::bulk::Compressor::new(zstd_level)
                .map_err(|e| werr(format!("zstd: {e}")))?,
        })
    }

    /// One page's compressed size with `alg`; a pglz give-up is the raw
    /// size (PostgreSQL stores the data uncompressed then).
    pub fn size(&mut self, alg: &str, page: &[u8]) -> Result<u64> {
        Ok(match alg {
            "zstd" => self
                .zstd
                .compress(page)
                .map_err(|e| werr(format!("zstd: {e}")))?
                .len() as u64,
            "lz4" => lz4::block::compress(page, Some(lz4::block::CompressionMode::DEFAULT), false)
                .map_err(|e| werr(format!("lz4: {e}")))?
                .len() as u64,
            "pglz" => crate::pglz::compress(page).map_or(page.len(), |c| c.len()) as u64,
            other => return Err(werr(format!("unknown algorithm `{other}`"))),
        })
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Default)]
struct Acc {
    sizes: Vec<u64>,
    cpu_ns: u64,
}

impl Acc {
    fn metrics(&self, rel: &Relation, header: u64, read_ms: f64) -> Metrics {
        let n = self.sizes.len() as u64;
        let sum: u64 = self.sizes.iter().sum();
        let mut over = [0u64; 3];
        let mut sample = [0u64; 3];
        for s in &self.sizes {
            for (k, slot) in SLOTS.iter().enumerate() {
                let (fits, bytes) = slot_bytes(*s, header, *slot);
                over[k] += u64::from(!fits);
                sample[k] += bytes;
            }
        }
        let pct = |k: usize| {
            if n == 0 {
                0.0
            } else {
                100.0 * over[k] as f64 / n as f64
            }
        };
        let scale = |k: usize| {
            if n == 0 {
                0
            } else {
                (sample[k] as f64 * rel.pages as f64 / n as f64).round() as u64
            }
        };
        let cpu_ms = self.cpu_ns as f64 / 1e6;
        Metrics {
            relation_pages: rel.pages,
            relation_bytes: rel.pages * PAGE_BYTES,
            pages_analysed: n,
            avg_compressed_bytes: if n == 0 { 0.0 } else { sum as f64 / n as f64 },
            ratio: if sum == 0 {
                0.0
            } else {
                (n * PAGE_BYTES) as f64 / sum as f64
            },
            pages_incompressible: self.sizes.iter().filter(|s| **s >= PAGE_BYTES).count() as u64,
            over_1k_pct: pct(0),
            over_2k_pct: pct(1),
            over_4k_pct: pct(2),
            projected_1k_bytes: scale(0),
            projected_2k_bytes: scale(1),
            projected_4k_bytes: scale(2),
            sample_1k_bytes: sample[0],
            sample_2k_bytes: sample[1],
            sample_4k_bytes: sample[2],
            cpu_ms,
            cpu_us_per_page: if n == 0 { 0.0 } else { cpu_ms * 1e3 / n as f64 },
            read_ms,
        }
    }
}
