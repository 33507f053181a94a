//! `serve`'s HTTP API (axum), version 1, described by the OpenAPI document
//! it serves at `/openapi.json` (utoipa, from the handlers' annotations).
//!
//! Everything but `/healthz`, `/readyz`, `/metrics` and `/sd/agents` needs
//! `Authorization: Bearer <token>` (one of `--api-token-file`'s, compared in
//! constant time, `tokens.rs`); a read-only token may only GET. Errors are JSON
//! `{"error": ...}`; an invalid scenario is a 422 whose error is the CLI's
//! message, located (`file:line:column: field ...`), with the location also
//! as fields.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::BroadcastStream;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::hub::AgentView;
use crate::queue::{Rejected, RunQueue};
use crate::scheduler::RunEvent;
use pgfleet_store::Error;
use pgfleet_store::Result;
use pgfleet_store::RunStatus;

type Shared = Arc<RunQueue>;

/// An error, for people and programs.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApiError {
    /// What went wrong and what to do.
    pub error: String,
    /// Where in the scenario (422 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
}

/// A place in a submitted scenario.
#[derive(Debug, Serialize, ToSchema)]
pub struct Location {
    pub file: String,
    pub line: u64,
    pub column: u64,
    /// The field path, e.g. `workloads[0].offsets[2]`.
    pub field: String,
    pub message: String,
}

/// Links to a run's resources.
#[derive(Debug, Serialize, ToSchema)]
pub struct Links {
    #[serde(rename = "self")]
    pub self_: String,
    pub events: String,
    pub report_json: String,
    pub report_md: String,
}

impl Links {
    fn of(id: &str) -> Links {
        Links {
            self_: format!("/v1/runs/{id}"),
            events: format!("/v1/runs/{id}/events"),
            report_json: format!("/v1/runs/{id}/report.json"),
            report_md: format!("/v1/runs/{id}/report.md"),
        }
    }
}

/// A submission's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Submitted {
    pub id: String,
    pub status: String,
    /// False when the idempotency key named an earlier submission.
    pub created: bool,
    pub links: Links,
}

/// A run in a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunSummary {
    pub id: String,
    pub scenario: String,
    /// queued, running, succeeded, failed, cancelled or interrupted.
    pub status: String,
    pub submitted_at: String,
    pub finished_at: Option<String>,
    /// The run's labels (`--label`, `?label=`).
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    pub labels: pgfleet_scenario::labels::Labels,
}

/// How far a run is.
#[derive(Debug, Serialize, ToSchema)]
pub struct Progress {
    pub total: usize,
    pub done: usize,
    pub running: usize,
    pub pending: usize,
    pub failed: usize,
}

/// One cell of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct CellView {
    pub cell_id: String,
    pub workload: String,
    pub instance_class: String,
    /// pending, running, succeeded, failed or cancelled.
    pub state: String,
    /// Its agent, or `role:agent, ...` for a multi-role cell.
    pub agents: Option<String>,
    pub error: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

/// Seconds by phase: `data` (loading, restoring, hydrating, publishing
/// the data), `prepare` (the kind's own preparation), `measure` and
/// `other` add up to the whole; `hydrate` and `publish` are of `data`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct PhasesView {
    pub data: f64,
    pub hydrate: f64,
    pub publish: f64,
    pub prepare: f64,
    pub measure: f64,
    pub other: f64,
}

impl From<pgfleet_proto::workload::Phases> for PhasesView {
    fn from(p: pgfleet_proto::workload::Phases) -> PhasesView {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        PhasesView {
            data: r(p.data),
            hydrate: r(p.hydrate),
            publish: r(p.publish),
            prepare: r(p.prepare),
            measure: r(p.measure),
            other: r(p.other),
        }
    }
}

/// A cell of a plan, with its estimate.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlannedCellView {
    pub cell_id: String,
    pub workload: String,
    pub instance_class: String,
    /// How it comes by its data: built, restored, reused, loaded, or none.
    pub data_step: String,
    pub seconds: f64,
    pub phases: PhasesView,
    /// The corrections learned from earlier cells ("data 0.81x, the rest
    /// 1.30x"), and the runs they come from; none: the model's estimate.
    pub learned: Option<String>,
    pub learned_from: Vec<String>,
}

/// What a submission would run and how long it would take.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlanView {
    pub scenario: String,
    pub cells: Vec<PlannedCellView>,
    /// The cells' seconds summed, and by phase, and each phase's share.
    pub cell_seconds: f64,
    pub phases: PhasesView,
    pub shares: String,
    /// Wall clock on the server's fleet, and the most disk one agent needs.
    pub wall_seconds: f64,
    pub disk_bytes_per_agent: u64,
    /// `pgfleet validate`'s text of the same plan.
    pub text: String,
    /// Each class's PostgreSQL major version (the one it names, else 18):
    /// what its agents must run.
    pub postgres_versions: std::collections::BTreeMap<String, u32>,
}

/// A run in full.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunSummary,
    pub progress: Progress,
    pub cells: Vec<CellView>,
    pub links: Links,
}

/// One server-sent event of a run's stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEvent {
    /// cell, progress, agent or run.
    pub event: String,
    /// The event as a JSON object with a `type` (the same as `event`):
    /// cell (`cell_id`, `state`, `agents`, `error`, `done`, `total`),
    /// progress (`cell_id`, `phase`, `message`, `done`, `total`), agent
    /// (`agent_id`, `state`, `detail`) or run (`status`).
    pub data: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct SubmitQuery {
    /// The scenario's file name, used in error locations (default
    /// `scenario.yaml`).
    pub name: Option<String>,
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    json(
        status,
        &ApiError {
            error: msg.into(),
            location: None,
        },
    )
}

fn store_error(e: Error) -> Response {
    tracing::error!("API: {e}");
    error(StatusCode::SERVICE_UNAVAILABLE, format!("{e}; retry later"))
}

fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no run `{id}`: GET /v1/runs lists them"),
    )
}

/// Submit a run: the body is the scenario (YAML), checked as `pgfleet
/// validate` checks it. The run is queued and starts when its instance
/// classes are free.
#[utoipa::path(post, path = "/v1/runs",
    request_body(content = String, content_type = "application/yaml", description = "The scenario file"),
    params(
        SubmitQuery,
        ("label" = Option<Vec<String>>, Query, description = "KEY=VALUE: a label of the run (repeatable; keys of 1-63 letters, digits, `_-./`, values up to 256 characters)"),
        ("Idempotency-Key" = Option<String>, Header, description = "A retried submission with the same key returns the same run (at most 200 characters)"),
    ),
    responses(
        (status = 202, description = "Queued (or, by idempotency key, found)", body = Submitted),
        (status = 400, description = "Not UTF-8, a bad header or a malformed label", body = ApiError),
        (status = 401, description = "Missing or wrong token", body = ApiError),
        (status = 403, description = "Valid, but refused by this server (allow_shell without --allow-shell-scenarios; a read-only token), located", body = ApiError),
        (status = 409, description = "The Idempotency-Key was used by this token for another scenario", body = ApiError),
        (status = 413, description = "Scenario too large", body = ApiError),
        (status = 422, description = "Invalid scenario, located", body = ApiError),
        (status = 429, description = "Too many runs queued; retry after Retry-After seconds", body = ApiError),
        (status = 503, description = "Store unavailable", body = ApiError),
    ),
    security(("bearer" = [])), tag = "runs")]
async fn submit(
    State(s): State<Shared>,
    Query(q): Query<SubmitQuery>,
    Query(pairs): QueryPairs,
    client: Option<axum::Extension<Client>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let labels = match query_labels(&pairs) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) if !k.is_empty() && k.len() <= 200 => {
            Some(scoped_key(client.as_ref().map(|c| &c.0), k))
        }
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "Idempotency-Key must be 1 to 200 visible ASCII characters",
            );
        }
    };
    let (name, yaml) = match scenario_body(&s, q, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match s.submit(&name, &yaml, key.as_deref(), labels) {
        Ok((id, created)) => {
            let status = s
                .service
                .store
                .run(&id)
                .ok()
                .flatten()
                .map(|r| r.status)
                .unwrap_or_else(|| "queued".into());
            let mut r = json(
                StatusCode::ACCEPTED,
                &Submitted {
                    links: Links::of(&id),
                    id: id.clone(),
                    status,
                    created,
                },
            );
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/runs/{id}")) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Err(Rejected::Invalid(e)) => located(StatusCode::UNPROCESSABLE_ENTITY, &e),
        Err(Rejected::Forbidden(e)) => located(StatusCode::FORBIDDEN, &e),
        Err(Rejected::Conflict(m)) => error(StatusCode::CONFLICT, m),
        Err(Rejected::Busy(n)) => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{n} runs are queued already (serve --max-queued-runs): retry when one has started"
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
            r
        }
        Err(Rejected::Store(e)) => store_error(e),
    }
}

/// Plan a run without submitting it: the body is the scenario (YAML),
/// checked as a submission is. The answer has each cell with its estimate
/// by phase (and what earlier cells on the server's store corrected), the
/// totals, and where the hours go. Read-only tokens may plan.
#[utoipa::path(post, path = "/v1/plan",
    request_body(content = String, content_type = "application/yaml", description = "The scenario file"),
    params(SubmitQuery),
    responses(
        (status = 200, description = "The plan", body = PlanView),
        (status = 400, description = "Not UTF-8", body = ApiError),
        (status = 401, description = "Missing or wrong token", body = ApiError),
        (status = 403, description = "Valid, but refused by this server, located", body = ApiError),
        (status = 413, description = "Scenario too large", body = ApiError),
        (status = 422, description = "Invalid scenario, located", body = ApiError),
        (status = 503, description = "Store unavailable", body = ApiError),
    ),
    security(("bearer" = [])), tag = "runs")]
async fn plan(State(s): State<Shared>, Query(q): Query<SubmitQuery>, body: Body) -> Response {
    let (name, yaml) = match scenario_body(&s, q, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (sc, cells) = match s.plan(&name, &yaml) {
        Ok(p) => p,
        Err(Rejected::Invalid(e)) => return located(StatusCode::UNPROCESSABLE_ENTITY, &e),
        Err(Rejected::Forbidden(e)) => return located(StatusCode::FORBIDDEN, &e),
        Err(Rejected::Store(e)) => return store_error(e),
        Err(Rejected::Conflict(m)) => return error(StatusCode::CONFLICT, m),
        Err(Rejected::Busy(n)) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, format!("{n} runs queued"));
        }
    };
    let t = pgfleet_scenario::plan::estimate(&sc, &cells);
    let view = PlanView {
        scenario: sc.name.value.clone(),
        cells: cells
            .iter()
            .map(|c| PlannedCellView {
                cell_id: c.cell_id.clone(),
                workload: c.workload().name().to_string(),
                instance_class: c.instance_class.clone(),
                data_step: c.how().to_string(),
                seconds: (c.estimate().seconds * 10.0).round() / 10.0,
                phases: c.estimate().phases().into(),
                learned: (!c.learned.is_empty()).then(|| c.learned.describe()),
                learned_from: c.learned.runs().into_iter().map(String::from).collect(),
            })
            .collect(),
        cell_seconds: (t.cell_seconds * 10.0).round() / 10.0,
        phases: t.phases.into(),
        shares: t.phases.shares(),
        wall_seconds: (t.wall_seconds * 10.0).round() / 10.0,
        disk_bytes_per_agent: t.disk_bytes_per_agent,
        text: pgfleet_scenario::plan::describe(&sc, &cells, std::path::Path::new(&name)),
        postgres_versions: sc
            .fleet
            .value
            .iter()
            .map(|f| (f.name.value.clone(), f.postgres_version()))
            .collect(),
    };
    json(StatusCode::OK, &view)
}

/// A request's scenario: its file name (`?name=`, for error locations)
/// and its text, within `--max-scenario-bytes` and UTF-8.
async fn scenario_body(
    s: &Shared,
    q: SubmitQuery,
    body: Body,
) -> Result<(String, String), Response> {
    let limit = s.max_scenario_bytes;
    let bytes: Bytes = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the scenario is larger than {limit} bytes (serve --max-scenario-bytes)"),
            ));
        }
    };
    let Ok(yaml) = String::from_utf8(bytes.to_vec()) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the scenario is not UTF-8 text",
        ));
    };
    let name = q
        .name
        .filter(|n| !n.is_empty() && n.len() <= 200)
        .unwrap_or_else(|| "scenario.yaml".into());
    Ok((name, yaml))
}

/// A scenario error with its location as fields.
fn located(status: StatusCode, e: &pgfleet_scenario::ScenarioError) -> Response {
    json(
        status,
        &ApiError {
            error: e.to_string(),
            location: Some(Location {
                file: e.file.display().to_string(),
                line: e.line,
                column: e.column,
                field: e.field.clone(),
                message: e.message.clone(),
            }),
        },
    )
}

fn summary(r: pgfleet_store::RunRow) -> RunSummary {
    RunSummary {
        id: r.id,
        scenario: r.scenario_name,
        status: r.status,
        submitted_at: r.started_at,
        finished_at: r.finished_at,
        labels: r.labels,
    }
}

/// The `label=KEY=VALUE` parameters of a query (repeatable).
type QueryPairs = Query<Vec<(String, String)>>;

/// The labels among a query's parameters; a bad one is an error saying
/// why (a 400).
fn query_labels(
    pairs: &[(String, String)],
) -> std::result::Result<pgfleet_scenario::labels::Labels, String> {
    let given: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "label")
        .map(|(_, v)| v.as_str())
        .collect();
    pgfleet_scenario::labels::Labels::parse(&given)
}

/// List runs, newest first; with `label=KEY=VALUE` (repeatable), only the
/// runs carrying every one of those labels.
#[utoipa::path(get, path = "/v1/runs",
    params(
        ("label" = Option<Vec<String>>, Query, description = "KEY=VALUE: only runs with this label (repeatable: all of them)"),
    ),
    responses(
        (status = 200, body = Vec<RunSummary>),
        (status = 400, description = "A malformed label", body = ApiError),
        (status = 401, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "runs")]
async fn list_runs(State(s): State<Shared>, Query(pairs): QueryPairs) -> Response {
    let filter = match query_labels(&pairs) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match s.service.store.runs() {
        Ok(runs) => {
            let v: Vec<RunSummary> = runs
                .into_iter()
                .rev()
                .filter(|r| r.labels.matches(&filter))
                .map(summary)
                .collect();
            json(StatusCode::OK, &v)
        }
        Err(e) => store_error(e),
    }
}

fn detail(s: &RunQueue, id: &str) -> Result<Option<RunDetail>> {
    let Some(run) = s.service.store.run(id)? else {
        return Ok(None);
    };
    let cells = s.service.store.cells(id)?;
    let count = |st: &str| cells.iter().filter(|c| c.state == st).count();
    let progress = Progress {
        total: cells.len(),
        done: cells
            .iter()
            .filter(|c| matches!(c.state.as_str(), "succeeded" | "failed" | "cancelled"))
            .count(),
        running: count("running"),
        pending: count("pending"),
        failed: count("failed"),
    };
    Ok(Some(RunDetail {
        links: Links::of(id),
        run: summary(run),
        progress,
        cells: cells
            .into_iter()
            .map(|c| CellView {
                cell_id: c.cell_id,
                workload: c.workload,
                instance_class: c.instance_class,
                state: c.state,
                agents: c.agent_id,
                error: c.error,
                started_at: c.started_at,
                finished_at: c.finished_at,
            })
            .collect(),
    }))
}

/// A run: status, progress, and every cell with its state and error.
#[utoipa::path(get, path = "/v1/runs/{id}",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = RunDetail),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "runs")]
async fn get_run(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    match detail(&s, &id) {
        Ok(Some(d)) => json(StatusCode::OK, &d),
        Ok(None) => not_found(&id),
        Err(e) => store_error(e),
    }
}

/// Cancel a run: a queued run ends at once, a running one stops its cells.
#[utoipa::path(delete, path = "/v1/runs/{id}",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 202, description = "Cancelling", body = RunSummary),
        (status = 401, body = ApiError),
        (status = 403, description = "A read-only token", body = ApiError),
        (status = 404, body = ApiError),
        (status = 409, description = "The run has finished", body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "runs")]
async fn cancel_run(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let run = match s.service.store.run(&id) {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(&id),
        Err(e) => return store_error(e),
    };
    if s.cancel(&id) {
        let mut v = summary(run);
        if v.status == "running" {
            v.status = "cancelling".into();
        } else if let Ok(Some(r)) = s.service.store.run(&id) {
            v = summary(r);
        }
        return json(StatusCode::ACCEPTED, &v);
    }
    error(
        StatusCode::CONFLICT,
        format!("run `{id}` has already finished ({})", run.status),
    )
}

/// The stream of a run's events (server-sent events): first a `cell` event
/// per cell with its current state, then `cell`, `progress` and `agent`
/// events as they happen; it ends with a `run` event carrying the final
/// status.
#[utoipa::path(get, path = "/v1/runs/{id}/events",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "Server-sent events; each `data` is a JSON object with a `type`", content_type = "text/event-stream", body = StreamEvent),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "runs")]
async fn events(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    // Subscribe before the snapshot so nothing falls in between.
    let live = s.subscribe(&id);
    let d = match detail(&s, &id) {
        Ok(Some(d)) => d,
        Ok(None) => return not_found(&id),
        Err(e) => return store_error(e),
    };
    let total = d.cells.len();
    let done = d.progress.done;
    let mut snapshot: Vec<RunEvent> = d
        .cells
        .into_iter()
        .map(|c| RunEvent::Cell {
            cell_id: c.cell_id,
            state: c.state,
            agents: c.agents.unwrap_or_default(),
            error: c.error,
            done,
            total,
        })
        .collect();
    let finished = RunStatus::parse(&d.run.status).is_none_or(RunStatus::is_terminal);
    let live = match (live, finished) {
        (Some(rx), false) => Some(rx),
        _ => {
            snapshot.push(RunEvent::Run {
                status: d.run.status.clone(),
            });
            None
        }
    };
    let live = futures::stream::iter(live)
        .flat_map(|rx| BroadcastStream::new(rx).filter_map(|r| futures::future::ready(r.ok())));
    let stream = futures::stream::iter(snapshot)
        .chain(live)
        .scan(false, |ended, ev| {
            if *ended {
                return futures::future::ready(None);
            }
            if let RunEvent::Run { status } = &ev
                && RunStatus::parse(status).is_none_or(RunStatus::is_terminal)
            {
                *ended = true;
            }
            futures::future::ready(Some(ev))
        })
        .map(|ev| {
            let kind = match &ev {
                RunEvent::Cell { .. } => "cell",
                RunEvent::Progress { .. } => "progress",
                RunEvent::Agent { .. } => "agent",
                RunEvent::Run { .. } => "run",
            };
            SseEvent::default()
                .event(kind)
                .json_data(&ev)
                .map_err(|e| std::io::Error::other(e.to_string()))
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

/// Renders (when needed) and reads a report file off the runtime's
/// threads: a large run's report never holds up the API or agents.
async fn report_file(s: Shared, id: String, file: String, content_type: &'static str) -> Response {
    tokio::task::spawn_blocking(move || report_file_now(&s, &id, &file, content_type))
        .await
        .unwrap_or_else(|e| {
            store_error(pgfleet_store::Error::Store(format!(
                "rendering the report: {e}"
            )))
        })
}

fn report_file_now(s: &RunQueue, id: &str, file: &str, content_type: &'static str) -> Response {
    match s.service.store.run(id) {
        Ok(Some(_)) => {}
        Ok(None) => return not_found(id),
        Err(e) => return store_error(e),
    }
    let dir = match s.report_dir(id) {
        Ok(d) => d,
        Err(e) => return store_error(e),
    };
    match std::fs::read(dir.join(file)) {
        // The page runs nothing and loads nothing: say so to the browser.
        Ok(b) if file.ends_with(".html") => (
            [
                (header::CONTENT_TYPE, content_type),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; style-src 'unsafe-inline'",
                ),
            ],
            b,
        )
            .into_response(),
        Ok(b) => ([(header::CONTENT_TYPE, content_type)], b).into_response(),
        Err(_) => error(
            StatusCode::NOT_FOUND,
            format!("run `{id}` has no `{file}`: GET /v1/runs/{id}/plots lists its plots"),
        ),
    }
}

/// A scenario's figures over its comparable runs, with the change points
/// of each series and the latest run's standing: `pgfleet history
/// --format json`'s document.
#[utoipa::path(get, path = "/v1/history",
    params(
        ("scenario" = String, Query, description = "The scenario's name"),
        ("metric" = Option<Vec<String>>, Query, description = "Only this metric (repeatable)"),
        ("class" = Option<String>, Query, description = "Only this instance class"),
        ("point" = Option<String>, Query, description = "Only points whose workload, label or parameters contain this"),
        ("label" = Option<Vec<String>>, Query, description = "KEY=VALUE: only runs with this label (repeatable)"),
        ("last" = Option<usize>, Query, description = "The last N comparable runs (default 30; 0: all)"),
    ),
    responses(
        (status = 200, description = "The history", body = Object),
        (status = 400, description = "A missing scenario, a malformed label or number", body = ApiError),
        (status = 401, body = ApiError),
        (status = 404, description = "No (successful) run of the scenario", body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "reports")]
async fn history(State(s): State<Shared>, Query(pairs): QueryPairs) -> Response {
    let one = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let Some(scenario) = one("scenario").filter(|n| !n.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "say which scenario: ?scenario=NAME (its `name`)",
        );
    };
    let labels = match query_labels(&pairs) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let last = match one("last").map(|v| v.parse::<usize>()) {
        None => 30,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "last must be a whole number of runs",
            );
        }
    };
    let q = pgfleet_report::history::Query {
        scenario,
        metrics: pairs
            .iter()
            .filter(|(k, _)| k == "metric")
            .map(|(_, v)| v.clone())
            .collect(),
        class: one("class"),
        point: one("point"),
        labels,
        last,
        vary: pairs
            .iter()
            .filter(|(k, _)| k == "vary")
            .map(|(_, v)| v.clone())
            .collect(),
        level: 0.95,
        options: Default::default(),
    };
    // It reads every run it compares: off the runtime's threads.
    let done =
        tokio::task::spawn_blocking(move || pgfleet_report::history::history(&s.service.store, &q))
            .await;
    match done {
        Ok(Ok(h)) => json(StatusCode::OK, &h),
        Ok(Err(pgfleet_store::Error::Usage(e))) => error(StatusCode::NOT_FOUND, e),
        Ok(Err(e)) => store_error(e),
        Err(e) => store_error(pgfleet_store::Error::Store(format!(
            "reading the history: {e}"
        ))),
    }
}

/// The run's report as JSON (rendered from the store; while the run goes
/// on, it shows what has finished).
#[utoipa::path(get, path = "/v1/runs/{id}/report.json",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "report.json", body = Object),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "reports")]
async fn report_json(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    report_file(s, id, "report.json".into(), "application/json").await
}

/// The run's report as Markdown; its plots are under `plots/`.
#[utoipa::path(get, path = "/v1/runs/{id}/report.md",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "report.md", content_type = "text/markdown", body = String),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "reports")]
async fn report_md(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    report_file(s, id, "report.md".into(), "text/markdown; charset=utf-8").await
}

/// The run's report as one self-contained HTML page (plots inline).
#[utoipa::path(get, path = "/v1/runs/{id}/report.html",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "report.html", content_type = "text/html", body = String),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "reports")]
async fn report_html(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    report_file(s, id, "report.html".into(), "text/html; charset=utf-8").await
}

/// The names of the run's plots (SVG).
#[utoipa::path(get, path = "/v1/runs/{id}/plots",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = Vec<String>),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "reports")]
async fn plots(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    tokio::task::spawn_blocking(move || plots_now(&s, &id))
        .await
        .unwrap_or_else(|e| {
            store_error(pgfleet_store::Error::Store(format!(
                "rendering the report: {e}"
            )))
        })
}

fn plots_now(s: &RunQueue, id: &str) -> Response {
    let id = id.to_string();
    match s.service.store.run(&id) {
        Ok(Some(_)) => {}
        Ok(None) => return not_found(&id),
        Err(e) => return store_error(e),
    }
    let dir = match s.report_dir(&id) {
        Ok(d) => d,
        Err(e) => return store_error(e),
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    names.sort();
    json(StatusCode::OK, &names)
}

/// One plot of the run's report.
#[utoipa::path(get, path = "/v1/runs/{id}/plots/{name}",
    params(("id" = String, Path, description = "Run id"), ("name" = String, Path, description = "Plot file name, e.g. `tps.svg`")),
    responses(
        (status = 200, description = "The plot", content_type = "image/svg+xml", body = String),
        (status = 401, body = ApiError),
        (status = 404, body = ApiError),
        (status = 503, body = ApiError),
    ),
    security(("bearer" = [])), tag = "reports")]
async fn plot(State(s): State<Shared>, Path((id, name)): Path<(String, String)>) -> Response {
    let safe = name.ends_with(".svg")
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !safe {
        return error(
            StatusCode::NOT_FOUND,
            format!("no plot `{name}`: GET /v1/runs/{id}/plots lists them"),
        );
    }
    report_file(s, id, name, "image/svg+xml").await
}

/// The agents that joined: idle in the pool or held by a run.
#[utoipa::path(get, path = "/v1/agents",
    responses(
        (status = 200, body = Vec<AgentView>),
        (status = 401, body = ApiError),
    ),
    security(("bearer" = [])), tag = "agents")]
async fn agents(State(s): State<Shared>) -> Response {
    json(StatusCode::OK, &s.service.hub.agents())
}

/// The datasets the stored runs' cells built and restored, by
/// fingerprint: who built each and when, how often it was restored, and by
/// which runs (the agents' stores hold the data; see `pgfleet datasets`);
/// on Kubernetes with `--dataset-snapshots`, the VolumeSnapshots holding
/// each.
#[utoipa::path(get, path = "/v1/datasets",
    responses(
        (status = 200, body = Vec<crate::datasets::DatasetView>),
        (status = 401, body = ApiError),
        (status = 500, body = ApiError),
    ),
    security(("bearer" = [])), tag = "datasets")]
async fn datasets(State(s): State<Shared>) -> Response {
    let mut views = match crate::datasets::seen(&s.service.store) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if let crate::queue::Source::Kubernetes(k) = &s.source
        && !k.opts.dataset_snapshots.is_empty()
    {
        match crate::agents::kubernetes::dataset_snapshots(&k.client, &k.opts.namespace).await {
            Ok(snaps) => crate::datasets::with_snapshots(&mut views, &snaps),
            Err(e) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    format!("listing the dataset snapshots: {e}"),
                );
            }
        }
    }
    json(StatusCode::OK, &views)
}

/// Prometheus HTTP service discovery: the connected agents that serve
/// their own /metrics, each with its id, class and storage profile as
/// target labels. No token, like /metrics.
#[utoipa::path(get, path = "/sd/agents",
    responses((status = 200, description = "Targets, in the http_sd_configs format", body = Vec<SdTargets>)),
    tag = "health")]
async fn sd_agents(State(s): State<Shared>) -> Response {
    json(StatusCode::OK, &sd_targets(&s.service.hub))
}

/// One group of Prometheus targets (`http_sd_configs`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SdTargets {
    pub targets: Vec<String>,
    pub labels: std::collections::BTreeMap<String, String>,
}

pub fn sd_targets(hub: &crate::hub::Hub) -> Vec<SdTargets> {
    hub.agents()
        .into_iter()
        .filter(|a| a.connected && !a.metrics_address.is_empty())
        .map(|a| SdTargets {
            targets: vec![a.metrics_address],
            labels: [
                ("agent_id", a.agent_id),
                ("instance_class", a.instance_class),
                ("storage_profile", a.storage_profile),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        })
        .collect()
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz",
    responses((status = 200, description = "Alive", content_type = "text/plain", body = String)),
    tag = "health")]
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the store answers and agents can connect.
#[utoipa::path(get, path = "/readyz",
    responses(
        (status = 200, description = "Ready", content_type = "text/plain", body = String),
        (status = 503, description = "Not ready", content_type = "text/plain", body = String),
    ),
    tag = "health")]
async fn readyz(State(s): State<Shared>) -> Response {
    if s.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Prometheus metrics (text exposition format); no token, like health.
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain", body = String)),
    tag = "health")]
async fn metrics(State(s): State<Shared>) -> Response {
    let service = &s.service;
    scrape(
        service.metrics.clone(),
        service.hub.clone(),
        service.store.clone(),
    )
    .await
}

/// A scrape of `/metrics`, for the API and `pgfleet run --metrics-addr`
/// alike: the fleet gauges refreshed from the hub and the store, off the
/// runtime's threads.
async fn scrape(
    metrics: Arc<crate::metrics::Metrics>,
    hub: crate::hub::Hub,
    store: pgfleet_store::Store,
) -> Response {
    tokio::task::spawn_blocking(move || {
        metrics.refresh(&hub, &store);
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            metrics.render(),
        )
            .into_response()
    })
    .await
    .unwrap_or_else(|e| {
        store_error(pgfleet_store::Error::Store(format!(
            "rendering metrics: {e}"
        )))
    })
}

/// The OpenAPI document of this API.
#[utoipa::path(get, path = "/openapi.json",
    responses(
        (status = 200, description = "OpenAPI 3.1", body = Object),
        (status = 401, body = ApiError),
    ),
    security(("bearer" = [])), tag = "meta")]
async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        ApiDoc::openapi().to_pretty_json().unwrap_or_default(),
    )
        .into_response()
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "pgfleet", description = "Submit PostgreSQL storage experiments to a pgfleet controller, follow them, and fetch their reports."),
    paths(submit, plan, list_runs, get_run, cancel_run, events, history, report_json, report_md, report_html, plots, plot, agents, datasets, healthz, readyz, metrics, sd_agents, openapi_json),
    components(schemas(ApiError, StreamEvent, Location, Links, Submitted, PhasesView, PlannedCellView, PlanView, RunSummary, Progress, CellView, RunDetail, AgentView, SdTargets, crate::datasets::DatasetView, crate::datasets::DatasetUse, crate::datasets::SnapshotView)),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

/// Who sent a request: a digest of its bearer token (never the token),
/// so what one client names (idempotency keys) is its own.
#[derive(Clone, Debug)]
pub struct Client(String);

impl Client {
    fn of(token: &str) -> Client {
        use sha2::Digest;
        let d = sha2::Sha256::digest(format!("pgfleet-client\0{token}").as_bytes());
        Client(d[..12].iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// An idempotency key as stored: the client's digest, then its key. Two
/// tokens using one key name two runs.
fn scoped_key(client: Option<&Client>, key: &str) -> String {
    match client {
        Some(c) => format!("{}:{key}", c.0),
        None => format!("-:{key}"),
    }
}

async fn auth(State(s): State<Shared>, mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // No tokens, no access (the API is mounted only with them).
    match s.api_tokens.as_ref().and_then(|t| t.check(given)) {
        Some(crate::tokens::Access::Full) => {
            let client = Client::of(given);
            req.extensions_mut().insert(client);
            return next.run(req).await;
        }
        // Planning changes nothing: read-only tokens may.
        Some(crate::tokens::Access::ReadOnly)
            if matches!(
                *req.method(),
                axum::http::Method::GET | axum::http::Method::HEAD
            ) || (req.method() == axum::http::Method::POST
                && req.uri().path() == "/v1/plan") =>
        {
            return next.run(req).await;
        }
        Some(crate::tokens::Access::ReadOnly) => {
            return error(
                StatusCode::FORBIDDEN,
                "this token is read-only: submitting and cancelling need a full token (a line without `read-only` in serve's --api-token-file)",
            );
        }
        None => {}
    }
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        if given.is_empty() {
            "missing bearer token: send `Authorization: Bearer <token>` (pgfleet submit: --token-file or PGFLEET_TOKEN_FILE)"
        } else {
            "wrong bearer token"
        },
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

pub fn router(s: Shared) -> Router {
    let api = Router::new()
        .route("/v1/runs", get(list_runs).post(submit))
        .route("/v1/plan", post(plan))
        .route("/v1/runs/{id}", get(get_run).delete(cancel_run))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/runs/{id}/report.json", get(report_json))
        .route("/v1/runs/{id}/report.md", get(report_md))
        .route("/v1/runs/{id}/report.html", get(report_html))
        .route("/v1/runs/{id}/plots", get(plots))
        .route("/v1/runs/{id}/plots/{name}", get(plot))
        .route("/v1/agents", get(agents))
        .route("/v1/datasets", get(datasets))
        .route("/v1/history", get(history))
        .route("/openapi.json", get(openapi_json))
        .route_layer(middleware::from_fn_with_state(s.clone(), auth));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/sd/agents", get(sd_agents))
        .merge(api)
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such endpoint: GET /openapi.json describes the API",
            )
        })
        .with_state(s)
}

/// A running HTTP server.
pub struct HttpServer {
    pub addr: SocketAddr,
    /// RunQueue over TLS (https://).
    pub tls: bool,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        // Event streams of live runs end with the process.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

/// What `/metrics` needs: the metrics, and the hub and store its
/// scrape-time gauges are read from.
#[derive(Clone)]
pub struct MetricsSource {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub hub: crate::hub::Hub,
    pub store: pgfleet_store::Store,
    /// Scrapes served so far.
    pub scrapes: Arc<std::sync::atomic::AtomicU64>,
}

/// Serves only `/metrics` and `/sd/agents` (`pgfleet run --metrics-addr`).
pub async fn listen_metrics(bind: SocketAddr, src: MetricsSource) -> Result<HttpServer> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<MetricsSource>| async move {
                let response = scrape(m.metrics, m.hub, m.store).await;
                m.scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                response
            }),
        )
        .route(
            "/sd/agents",
            get(|State(m): State<MetricsSource>| async move {
                json(StatusCode::OK, &sd_targets(&m.hub))
            }),
        )
        .with_state(src);
    listen_app(bind, app, None).await
}

/// Serves the API on `bind`, over TLS when `tls` is given.
pub async fn listen(
    bind: SocketAddr,
    s: Shared,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<HttpServer> {
    listen_app(bind, router(s), tls).await
}

/// A TLS server configuration from PEM files (`serve --http-tls-cert
/// --http-tls-key`); errors name the file.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;
    let bad =
        |f: &std::path::Path, e: String| Error::Usage(format!("--http-tls: {}: {e}", f.display()));
    let certs = pgfleet_client::pem_certificates(cert).map_err(|e| bad(cert, e))?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Usage(format!("--http-tls: {e}")))?
    .with_no_client_auth()
    .with_single_cert(certs, key_der)
    .map_err(|e| bad(key, format!("does not go with the certificate: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

async fn listen_app(
    bind: SocketAddr,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<HttpServer> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| Error::Server(format!("binding the HTTP API to {bind}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Server(e.to_string()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let tls_used = tls.is_some();
    let task = match tls {
        None => tokio::spawn(async move {
            let r = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!("HTTP API ended: {e}");
            }
        }),
        Some(tls) => tokio::spawn(serve_tls(listener, app, tls, stopped)),
    };
    Ok(HttpServer {
        addr,
        stop,
        task,
        tls: tls_used,
    })
}

/// The accept loop over TLS: each connection's handshake (bounded in time)
/// and HTTP/1.1 on its own task; stops accepting when `stopped` fires.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Arc<rustls::ServerConfig>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let tcp = tokio::select! {
            _ = &mut stopped => return,
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: pause, go on.
                    tracing::warn!("HTTP API accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let stream =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!("HTTP API TLS handshake: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let svc = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .with_upgrades()
                .await;
        });
    }
}
