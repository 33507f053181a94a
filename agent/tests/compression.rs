//! Real PostgreSQL: the compression analysis compresses pages as
//! PostgreSQL and the libraries do, and its figures are repeatable.

mod common;

use pgfleet_agent::cluster::Cluster;
use pgfleet_agent::workload::compression_analysis::{compressed_size, read_pages};
use pgfleet_proto::workload::compression_analysis::{Metrics, PointParams};

use common::{params, run};

/// Pseudo-random bytes (xorshift): incompressible.
fn noise(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The bytes PostgreSQL's compressor produced for a stored value: inline,
/// the datum is a 4-byte header + 4-byte method/size + data; out of line,
/// the TOAST pointer's size counts the 4-byte method/size + data.
async fn postgres_compressed(c: &tokio_postgres::Client, table: &str, id: i32) -> Option<u64> {
    let r = c
        .query_one(
            &format!(
                "SELECT pg_column_size(v)::bigint, pg_column_compression(v), \
                 pg_column_size(v) < octet_length(v) AND pg_column_size(v) < 2032 FROM {table} WHERE id = $1"
            ),
            &[&id],
        )
        .await
        .unwrap();
    let (size, method, inline): (i64, Option<String>, bool) = (r.get(0), r.get(1), r.get(2));
    method.map(|_| (size - if inline { 8 } else { 4 }) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_compress_as_postgres_and_the_libraries_do() {
    let root = common::scratch("compression");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", Default::default()))
        .await
        .unwrap();
    // The test's tables are the agent's own (its schema, first in the path).
    let c = cl.connect_own().await.unwrap();
    c.batch_execute(
        "CREATE EXTENSION pageinspect WITH SCHEMA pgfleet_agent; \
         CREATE TABLE data AS SELECT i AS id, md5(i::text) AS h, repeat(chr(65 + i % 26), i % 50) AS pad, i * 7 AS n \
           FROM generate_series(1, 20000) i; \
         CREATE INDEX ON data (h); \
         CREATE TABLE pg_pglz (id int, v bytea COMPRESSION pglz); \
         CREATE TABLE pg_lz4 (id int, v bytea COMPRESSION lz4);",
    )
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE data").await.unwrap();
    // Pages of a table and an index, a page of zeros, a page of noise.
    let mut inputs = read_pages(&c, "data", &[0, 3, 50]).await.unwrap();
    inputs.extend(read_pages(&c, "data_h_idx", &[1, 20]).await.unwrap());
    inputs.push(vec![0u8; 8192]);
    inputs.push(noise(8192, 42));
    for (i, page) in inputs.iter().enumerate() {
        for t in ["pg_pglz", "pg_lz4"] {
            c.execute(
                &format!("INSERT INTO {t} VALUES ($1, $2)"),
                &[&(i as i32), page],
            )
            .await
            .unwrap();
        }
    }
    let mut compared = 0;
    for (i, page) in inputs.iter().enumerate() {
        let ours = compressed_size("pglz", page, 22).unwrap();
        match postgres_compressed(&c, "pg_pglz", i as i32).await {
            Some(theirs) => {
                assert_eq!(ours, theirs, "pglz, input {i}");
                compared += 1;
            }
            // PostgreSQL gave up: we report the page raw.
            None => assert_eq!(ours, 8192, "pglz gave up on input {i}"),
        }
        let ours = compressed_size("lz4", page, 22).unwrap();
        match postgres_compressed(&c, "pg_lz4", i as i32).await {
            Some(theirs) => assert_eq!(ours, theirs, "lz4, input {i}"),
            None => assert!(ours + 2 >= 8192, "lz4 kept input {i} raw, ours {ours}"),
        }
        let zstd = zstd::bulk::compress(page, 22).unwrap().len() as u64;
        assert_eq!(compressed_size("zstd", page, 22).unwrap(), zstd);
    }
    // Every page but the noise was compressed by the server, and matched.
    assert_eq!(compared, inputs.len() - 1);
    // The zero page and the noise page, as the libraries give them.
    let zeros = &inputs[5];
    assert!(compressed_size("pglz", zeros, 22).unwrap() < 120);
    assert_eq!(
        compressed_size("lz4", zeros, 22).unwrap(),
        lz4::block::compress(zeros, None, false).unwrap().len() as u64
    );
    assert_eq!(compressed_size("pglz", &inputs[6], 22).unwrap(), 8192);
    assert!(compressed_size("lz4", &inputs[6], 22).unwrap() > 8192);
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

fn points(out: &pgfleet_agent::workload::Output) -> Vec<(PointParams, Metrics)> {
    common::typed_points(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_analysis_is_repeatable_and_its_shares_ordered() {
    let root = common::scratch("analysis");
    let cl = Cluster::provision(&common::spec(&root, "c", "64MB", Default::default()))
        .await
        .unwrap();
    let entry = "{kind: compression-analysis, dataset: sql, zstd_level: 19, sample_fractions: [0.05, 0.5, 1], \
                 setup_sql: \"CREATE TABLE IF NOT EXISTS items AS SELECT i AS id, md5(i::text) AS h, (i % 100) * 3 AS qty, \
                 repeat('abc', i % 40) AS note FROM generate_series(1, 40000) i; \
                 CREATE INDEX IF NOT EXISTS items_id ON items (id)\"}";
    let first = points(&run(&cl, &params(entry)).await.unwrap());
    let again = points(&run(&cl, &params(entry)).await.unwrap());
    assert_eq!(
        first.len(),
        2 * 3 * 3,
        "2 relations x 3 fractions x 3 algorithms"
    );
    for ((p, m), (p2, m2)) in first.iter().zip(&again) {
        assert_eq!(p, p2);
        // Everything but the clocks is the same on a rerun.
        let strip = |m: &Metrics| Metrics {
            cpu_ms: 0.0,
            cpu_us_per_page: 0.0,
            read_ms: 0.0,
            ..m.clone()
        };
        assert_eq!(strip(m), strip(m2), "{p:?}");
        assert!(
            m.over_1k_pct >= m.over_2k_pct && m.over_2k_pct >= m.over_4k_pct,
            "{p:?} {m:?}"
        );
        assert!(m.projected_1k_bytes > 0 && m.cpu_ms > 0.0, "{p:?} {m:?}");
        let want =
            ((m.relation_pages as f64 * p.sample_fraction).ceil() as u64).min(m.relation_pages);
        assert_eq!(m.pages_analysed, want, "{p:?}");
        assert!(
            m.avg_compressed_bytes > 100.0 && m.avg_compressed_bytes < 8192.0,
            "{p:?} {m:?}"
        );
    }
    // At 100 % the projection is the sample itself.
    for (p, m) in first.iter().filter(|(p, _)| p.sample_fraction == 1.0) {
        assert_eq!(m.projected_2k_bytes, m.sample_2k_bytes, "{p:?}");
    }
    // zstd compresses these pages better than lz4.
    let avg = |alg: &str| {
        first
            .iter()
            .find(|(p, _)| p.relation == "items" && p.sample_fraction == 1.0 && p.algorithm == alg)
            .unwrap()
            .1
            .avg_compressed_bytes
    };
    assert!(
        avg("zstd") < avg("lz4"),
        "zstd {} lz4 {}",
        avg("zstd"),
        avg("lz4")
    );
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
