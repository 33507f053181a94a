//! OpenTelemetry traces end to end: a real `pgfleet run` with local agents
//! exports to an OTLP receiver in this test (a tonic server implementing
//! the collector's trace service), and the spans form one tree: the run →
//! its cells → each agent's side of its cell → the phases, the agents'
//! spans parented by the controller's through the `traceparent` in
//! `Assign`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

use common::{Scratch, show};

/// A received span: the service that sent it, and the span.
type Received = Arc<Mutex<Vec<(String, opentelemetry_proto::tonic::trace::v1::Span)>>>;

struct Receiver(Received);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    got.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attr(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            Some(Value::IntValue(i)) => Some(i.to_string()),
            _ => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_spans_form_one_tree_across_controller_and_agents() {
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(received.clone())))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let s = Scratch::new("traces");
    let sc = s.write(
        "traces.yaml",
        "name: traces
fleet:
  - name: local
    count: 2
workloads:
  - kind: pgbench
    scale: 1
    clients: 2
    warmup_s: 1
    duration_s: 2
    replicas: 2
",
    );
    let mut cmd = s.run_cmd(&sc, &[]);
    cmd.env(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    )
    .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));

    // Each process flushes its spans as it exits; wait for the tree.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let got = received.lock().unwrap().clone();
        let phases = got.iter().filter(|(_, s)| s.name == "teardown").count();
        let sessions = got
            .iter()
            .filter(|(_, s)| s.name == "agent session")
            .count();
        if got.iter().any(|(_, s)| s.name == "run") && phases >= 2 && sessions >= 2 {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "spans did not arrive: {:?}",
            got.iter()
                .map(|(svc, s)| format!("{svc}/{}", s.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    server.abort();
    // Sessions are traces of their own: each agent's connection, and the
    // controller's side of it as its child through the gRPC metadata.
    let (sessions, spans): (Vec<_>, Vec<_>) = spans
        .into_iter()
        .partition(|(_, s)| s.name == "session" || s.name == "agent session");

    let named = |name: &str| -> Vec<&(String, opentelemetry_proto::tonic::trace::v1::Span)> {
        spans.iter().filter(|(_, s)| s.name == name).collect()
    };
    let runs = named("run");
    assert_eq!(runs.len(), 1, "one run span");
    let (svc, run) = runs[0];
    assert_eq!(svc, "pgfleet");
    assert_eq!(attr(run, "scenario").as_deref(), Some("traces"));
    let trace = &run.trace_id;
    let agent_sessions: Vec<_> = sessions
        .iter()
        .filter(|(svc, s)| svc == "pgfleet-agent" && s.name == "session")
        .collect();
    assert_eq!(
        agent_sessions.len(),
        2,
        "one session per agent (no reconnect)"
    );
    for (_, a) in &agent_sessions {
        let served: Vec<_> = sessions
            .iter()
            .filter(|(svc, s)| {
                svc == "pgfleet" && s.name == "agent session" && s.parent_span_id == a.span_id
            })
            .collect();
        assert_eq!(
            served.len(),
            1,
            "the controller's session span is the agent's child"
        );
        assert_eq!(served[0].1.trace_id, a.trace_id);
        assert_eq!(attr(&served[0].1, "agent_id"), attr(a, "agent_id"));
        assert_ne!(
            &a.trace_id, trace,
            "a session is not part of the run's trace"
        );
    }
    // Every other span of the run is in its trace.
    assert!(spans.iter().all(|(_, s)| &s.trace_id == trace), "one trace");

    let cells = named("cell");
    assert_eq!(cells.len(), 2, "one span per cell");
    for (svc, cell) in &cells {
        assert_eq!(svc, "pgfleet");
        assert_eq!(
            cell.parent_span_id, run.span_id,
            "cells are the run's children"
        );
        assert_eq!(attr(cell, "workload").as_deref(), Some("pgbench"));
        assert_eq!(attr(cell, "instance_class").as_deref(), Some("local"));
        assert_eq!(attr(cell, "storage_profile").as_deref(), Some("nvme"));
        // The agent's side of this cell, parented across processes.
        let agent_cells: Vec<_> = named("agent cell")
            .into_iter()
            .filter(|(_, a)| a.parent_span_id == cell.span_id)
            .collect();
        assert_eq!(
            agent_cells.len(),
            1,
            "the agent's span is the controller cell's child"
        );
        let (asvc, acell) = agent_cells[0];
        assert_eq!(asvc, "pgfleet-agent");
        assert!(attr(acell, "postgres_version").is_some_and(|v| v.starts_with(char::is_numeric)));
        let children = |parent: &[u8]| -> Vec<String> {
            spans
                .iter()
                .filter(|(_, s)| s.parent_span_id == parent)
                .map(|(_, s)| s.name.clone())
                .collect()
        };
        let mut phases = children(&acell.span_id);
        phases.sort();
        assert_eq!(
            phases,
            ["collect", "dataset", "provision", "teardown", "workload"],
            "agent cell phases"
        );
        let workload = spans
            .iter()
            .find(|(_, s)| s.name == "workload" && s.parent_span_id == acell.span_id)
            .unwrap();
        let mut inner = children(&workload.1.span_id);
        inner.sort();
        assert_eq!(inner, ["measure", "warm-up"], "the workload's phases");
        // The load is the dataset step's (before the workload): the two
        // cells share one dataset, so one loads it and the other restores.
        let dataset = spans
            .iter()
            .find(|(_, s)| s.name == "dataset" && s.parent_span_id == acell.span_id)
            .unwrap();
        assert!(dataset.1.end_time_unix_nano <= workload.1.start_time_unix_nano);
        let loads: Vec<Vec<String>> = spans
            .iter()
            .filter(|(_, s)| s.name == "dataset")
            .map(|(_, s)| children(&s.span_id))
            .collect();
        assert_eq!(loads.len(), 2, "{loads:?}");
        assert_eq!(
            loads.iter().filter(|l| l.as_slice() == ["load"]).count(),
            1,
            "one cell loads, the other restores: {loads:?}"
        );
        // Phases in order: provision ends before the workload starts.
        let p = spans
            .iter()
            .find(|(_, s)| s.name == "provision" && s.parent_span_id == acell.span_id)
            .unwrap();
        assert!(p.1.end_time_unix_nano <= workload.1.start_time_unix_nano);
    }
}
