//! Real PostgreSQL: `toast-probe` reproduces the deterministic facts of
//! seeds/003 ("what gets TOASTed") exactly, and its reads and JSON loads
//! show the article's orderings.

mod common;

use std::collections::BTreeMap;

use pgfleet_agent::cluster::Cluster;
use pgfleet_proto::workload::toast_probe::{Metrics, PointParams};

use common::{params, run};

type Points = BTreeMap<(String, String, String), Metrics>;

async fn probe(cl: &Cluster, entry: &str) -> Points {
    let out = run(cl, &params(entry)).await.unwrap();
    out.points
        .iter()
        .map(|p| {
            let k: PointParams = serde_json::from_str(&p.params_json).unwrap();
            let m: Metrics = serde_json::from_str(&p.metrics_json).unwrap();
            let mode = serde_json::to_value(k.storage_mode).unwrap();
            (
                (
                    serde_json::to_value(k.probe)
                        .unwrap()
                        .as_str()
                        .unwrap()
                        .to_string(),
                    mode.as_str().unwrap().to_string(),
                    k.case,
                ),
                m,
            )
        })
        .collect()
}

fn get<'a>(pts: &'a Points, probe: &str, mode: &str, case: &str) -> &'a Metrics {
    pts.get(&(probe.into(), mode.into(), case.into()))
        .unwrap_or_else(|| panic!("no point {probe}/{mode}/{case} in {:?}", pts.keys()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_articles_sizes_hold_exactly() {
    let root = common::scratch("toast-probe");
    let cl = Cluster::provision(&common::spec(&root, "c", "128MB", Default::default()))
        .await
        .unwrap();
    let pts = probe(
        &cl,
        "{kind: toast-probe, probes: [threshold, placement, window]}",
    )
    .await;

    // Threshold: 2,000 characters stay raw, 2,001 compress to 26 bytes (lz4).
    let t = |case: &str| get(&pts, "threshold", "lz4", case);
    assert_eq!(
        (t("1500").stored_bytes, t("1500").compression.as_deref()),
        (Some(1504), None)
    );
    assert_eq!(
        (t("2000").stored_bytes, t("2000").compression.as_deref()),
        (Some(2004), None)
    );
    assert_eq!(
        (t("2001").stored_bytes, t("2001").compression.as_deref()),
        (Some(26), Some("lz4"))
    );
    assert_eq!(t("2001").placement.as_deref(), Some("compressed inline"));
    // EXTERNAL never compresses: 2,001 characters move out of the row.
    let e = get(&pts, "threshold", "external", "2001");
    assert_eq!(
        (e.compression.as_deref(), e.placement.as_deref()),
        (None, Some("external"))
    );
    assert_eq!((e.toast_chunks, e.toast_bytes), (Some(2), Some(2001)));

    // Placement: inline / compressed inline / external / compressed external.
    let p = |case: &str| get(&pts, "placement", "lz4", case);
    let facts = [
        ("short", 204, "inline", 0, 232),
        ("repetitive-10KB", 60, "compressed inline", 0, 88),
        ("random-200KB", 200_000, "external", 101, 46),
        ("repetitive-1.1MB", 4471, "compressed external", 3, 46),
    ];
    for (case, size, place, chunks, tuple) in facts {
        let m = p(case);
        assert_eq!(m.stored_bytes, Some(size), "{case}: {m:?}");
        assert_eq!(m.placement.as_deref(), Some(place), "{case}: {m:?}");
        assert_eq!(m.toast_chunks, Some(chunks), "{case}: {m:?}");
        assert_eq!(m.heap_tuple_bytes, Some(tuple), "{case}: {m:?}");
    }
    // The chunks hold exactly the stored bytes.
    assert_eq!(p("random-200KB").toast_bytes, Some(200_000));
    assert_eq!(p("repetitive-1.1MB").toast_bytes, Some(4471));

    // The compression window: pglz's 4 KiB against lz4's 64 KiB.
    let w = |mode: &str, case: &str| get(&pts, "window", mode, case);
    assert_eq!(w("pglz", "V=500").stored_bytes, Some(105_457));
    assert_eq!(w("lz4", "V=500").stored_bytes, Some(96_022));
    assert_eq!(w("pglz", "V=5000").stored_bytes, Some(209_999));
    assert_eq!(w("pglz", "V=5000").gave_up, Some(true));
    assert_eq!(w("pglz", "V=5000").raw_bytes, Some(209_999));
    assert_eq!(w("lz4", "V=5000").stored_bytes, Some(177_590));
    assert_eq!(w("lz4", "V=5000").gave_up, Some(false));
    assert_eq!(w("pglz", "V=500").gave_up, Some(false));

    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_reads_fetch_one_chunk_unless_lz4_and_json_compresses() {
    let root = common::scratch("toast-probe-reads");
    let cl = Cluster::provision(&common::spec(&root, "c", "128MB", Default::default()))
        .await
        .unwrap();
    let values = 8;
    let pts = probe(
        &cl,
        &format!(
            "{{kind: toast-probe, probes: [json, reads], json_documents: 300, read_values: {values}, \
              duration_s: 0.2, repeats: 2, warmup_s: 0.1}}"
        ),
    )
    .await;
    let r = |mode: &str, case: &str| get(&pts, "reads", mode, case);
    // A 1 MiB value is ~526 chunks raw, about half that compressed, four
    // chunks to a page (buffers count pages).
    let (ext, pglz, lz4) = (
        r("external", "prefix"),
        r("pglz", "prefix"),
        r("lz4", "prefix"),
    );
    let hits = |m: &Metrics| m.buffers_shared_hit.unwrap() + m.buffers_shared_read.unwrap();
    // pglz bounds the compressed bytes a prefix needs: one chunk per value,
    // as EXTERNAL; lz4 has no bound and fetches every chunk.
    assert!(
        hits(pglz) <= hits(ext) + values,
        "pglz {pglz:?} vs external {ext:?}"
    );
    assert!(hits(lz4) > 10 * hits(pglz), "lz4 {lz4:?} vs pglz {pglz:?}");
    for m in [ext, pglz, lz4] {
        assert!(
            m.calls.unwrap() >= 2 && m.latency_ms_p50.unwrap() > 0.0,
            "{m:?}"
        );
    }
    // The mid read of an uncompressed bytea fetches its one chunk; both
    // compressed modes fetch the whole value.
    let (ext, pglz, lz4) = (r("external", "mid"), r("pglz", "mid"), r("lz4", "mid"));
    assert!(hits(ext) < 5 * values, "{ext:?}");
    assert!(
        hits(pglz) > 30 * values && hits(lz4) > 30 * values,
        "{pglz:?} {lz4:?}"
    );
    let ratio = |m: &Metrics| m.stored_bytes.unwrap() as f64 / m.raw_bytes.unwrap() as f64;
    assert!(
        (0.3..0.7).contains(&ratio(r("lz4", "prefix"))),
        "{:?}",
        r("lz4", "prefix")
    );

    // JSON documents: both compressors shrink the table; every load timed.
    let j = |mode: &str| get(&pts, "json", mode, "documents");
    let ext = j("external");
    for mode in ["pglz", "lz4"] {
        let m = j(mode);
        assert!(
            m.total_bytes.unwrap() * 2 < ext.total_bytes.unwrap(),
            "{mode}: {m:?} vs {ext:?}"
        );
        assert_eq!(m.loads_seconds.len(), 2);
        assert!(m.load_seconds.unwrap() > 0.0);
    }
    assert!(ext.raw_bytes.unwrap() > 300 * 25 * 80, "{ext:?}");
    cl.teardown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
