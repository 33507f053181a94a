//! The client side of `serve`'s HTTP API: `pgfleet submit | status |
//! cancel | report --server URL`, as CI pipelines call them.
//!
//! Every request is retried with backoff while the server is unreachable
//! or answers 503 (a controller restarting), up to `retry_for`; a submit is
//! retried with one idempotency key, so it creates one run however often it
//! is sent. Following a run reads its event stream and reconnects when the
//! stream breaks: the stream starts with every cell's state, so nothing is
//! missed.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value as Json;

use pgfleet_store::exit;

/// Why a remote command did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached or kept failing (exit 3).
    #[error("{0}")]
    Unavailable(String),
    /// The server refused the request (bad token, unknown run, conflict).
    #[error("{message}")]
    Refused { status: u16, message: String },
    /// The scenario was rejected (exit 2).
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Unavailable(_) => exit::INFRA,
            ClientError::Invalid(_) => exit::INVALID,
            ClientError::Refused { status: 401, .. } => exit::INVALID,
            ClientError::Refused { .. } => exit::INVALID,
        }
    }
}

pub struct Client {
    base: String,
    token: String,
    http: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// How long to keep retrying an unreachable server.
    pub retry_for: Duration,
}

pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    fn json(&self) -> Json {
        serde_json::from_slice(&self.body).unwrap_or(Json::Null)
    }
    fn message(&self) -> String {
        let j = self.json();
        j.get("error")
            .and_then(Json::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&self.body).trim().to_string())
    }
}

impl Client {
    /// A client of the API at `server` (http:// or https://); `ca`: a PEM
    /// CA to trust for https instead of the system's roots.
    pub fn new(server: &str, token: String, ca: Option<&Path>) -> Result<Client, ClientError> {
        let base = server.trim_end_matches('/').to_string();
        let usage = |m: String| ClientError::Refused {
            status: 0,
            message: m,
        };
        if !base.starts_with("http://") && !base.starts_with("https://") {
            return Err(usage(format!(
                "--server {server}: give the http:// or https:// URL of `pgfleet serve`'s API"
            )));
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match ca {
            Some(ca) => {
                let bad = |e: String| usage(format!("--ca {}: {e}", ca.display()));
                let mut roots = rustls::RootCertStore::empty();
                for c in pem_certificates(ca).map_err(bad)? {
                    roots.add(c).map_err(|e| bad(e.to_string()))?;
                }
                let cfg = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| usage(e.to_string()))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                builder.with_tls_config(cfg)
            }
            None => builder
                .with_provider_and_native_roots(provider)
                .map_err(|e| usage(format!("the system's CA certificates: {e} (give --ca)")))?,
        };
        let connector = builder.https_or_http().enable_http1().build();
        Ok(Client {
            base,
            token,
            http: HyperClient::builder(TokioExecutor::new()).build(connector),
            retry_for: Duration::from_secs(60),
        })
    }

    async fn once(
        &self,
        method: &Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &Bytes,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(Duration::from_secs(30), self.http.request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                // The connector's reason (refused, TLS, certificate) is
                // in the error's sources.
                let mut text = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    text = format!("{text}: {s}");
                    src = s.source();
                }
                Err(text)
            }
            Err(_) => Err("no answer within 30s".into()),
        }
    }

    /// Sends a request, retrying while the server is unreachable or
    /// unavailable (503), with backoff, or its queue is full (429, after
    /// its Retry-After), for up to `retry_for`.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, ClientError> {
        let r = self.send(&method, path, headers, &body).await?;
        let status = r.status();
        let body = r
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Unavailable(format!("reading the answer: {e}")))?
            .to_bytes();
        Ok(Answer { status, body })
    }

    async fn send(
        &self,
        method: &Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &Bytes,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(200);
        loop {
            let mut wait = backoff;
            let why = match self.once(method, path, headers, body).await {
                // A full queue (429) says when to come back.
                Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS => {
                    let after = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .unwrap_or(5);
                    wait = Duration::from_secs(after.clamp(1, 60));
                    "answered 429: the server's run queue is full".to_string()
                }
                Ok(r)
                    if r.status() != StatusCode::SERVICE_UNAVAILABLE
                        && r.status() != StatusCode::BAD_GATEWAY =>
                {
                    return Ok(r);
                }
                Ok(r) => format!("answered {}", r.status()),
                // Retrying does not make a certificate trusted.
                Err(e) if e.contains("certificate") => {
                    return Err(ClientError::Unavailable(format!(
                        "{}: the server's TLS certificate is not trusted ({e}): pass --ca with the CA that signed it (serve's --http-tls-cert)",
                        self.base
                    )));
                }
                Err(e) => e,
            };
            if start.elapsed() + wait > self.retry_for {
                return Err(ClientError::Unavailable(format!(
                    "the pgfleet server {} is unavailable ({why}) after retrying for {:?}: is `pgfleet serve` running there?",
                    self.base, self.retry_for
                )));
            }
            tracing::debug!("{method} {path}: {why}; retrying in {wait:?}");
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    fn refused(a: &Answer) -> ClientError {
        match a.status {
            StatusCode::UNPROCESSABLE_ENTITY => ClientError::Invalid(a.message()),
            s => ClientError::Refused {
                status: s.as_u16(),
                message: format!("the server answered {s}: {}", a.message()),
            },
        }
    }

    /// Submits a scenario; returns the run id.
    pub async fn submit(
        &self,
        name: &str,
        yaml: String,
        idempotency_key: &str,
        labels: &pgfleet_scenario::labels::Labels,
    ) -> Result<(String, bool), ClientError> {
        let mut path = format!("/v1/runs?name={}", urlencode(name));
        for (k, v) in &labels.0 {
            path.push_str(&format!("&label={}", urlencode(&format!("{k}={v}"))));
        }
        let a = self
            .request(
                Method::POST,
                &path,
                &[
                    ("content-type", "application/yaml"),
                    ("idempotency-key", idempotency_key),
                ],
                Bytes::from(yaml),
            )
            .await?;
        if a.status != StatusCode::ACCEPTED {
            return Err(Self::refused(&a));
        }
        let j = a.json();
        let id = j["id"].as_str().unwrap_or_default().to_string();
        Ok((id, j["created"].as_bool().unwrap_or(true)))
    }

    pub async fn get_json(&self, path: &str) -> Result<Json, ClientError> {
        let a = self.request(Method::GET, path, &[], Bytes::new()).await?;
        if a.status != StatusCode::OK {
            return Err(Self::refused(&a));
        }
        Ok(a.json())
    }

    pub async fn cancel(&self, run: &str) -> Result<Json, ClientError> {
        let a = self
            .request(
                Method::DELETE,
                &format!("/v1/runs/{run}"),
                &[],
                Bytes::new(),
            )
            .await?;
        if a.status != StatusCode::ACCEPTED {
            return Err(Self::refused(&a));
        }
        Ok(a.json())
    }

    /// Downloads report.json, report.md and the plots into `out`.
    pub async fn download_report(&self, run: &str, out: &Path) -> Result<(), ClientError> {
        std::fs::create_dir_all(out).map_err(|e| ClientError::Refused {
            status: 0,
            message: format!("creating {}: {e}", out.display()),
        })?;
        let plots = self.get_json(&format!("/v1/runs/{run}/plots")).await?;
        let mut files = vec![
            "report.json".to_string(),
            "report.md".to_string(),
            "report.html".to_string(),
        ];
        let names = plots.as_array().cloned().unwrap_or_default();
        files.extend(
            names
                .iter()
                .filter_map(|n| n.as_str())
                .map(|n| format!("plots/{n}")),
        );
        for f in files {
            let a = self
                .request(
                    Method::GET,
                    &format!("/v1/runs/{run}/{f}"),
                    &[],
                    Bytes::new(),
                )
                .await?;
            if a.status != StatusCode::OK {
                return Err(Self::refused(&a));
            }
            let name = f.trim_start_matches("plots/");
            std::fs::write(out.join(name), &a.body).map_err(|e| ClientError::Refused {
                status: 0,
                message: format!("writing {}: {e}", out.join(name).display()),
            })?;
        }
        Ok(())
    }

    /// Follows a run's events until it ends (or `timeout` passes: None).
    /// Returns the final status.
    pub async fn follow(
        &self,
        run: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<String>, ClientError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let ui = Follow::new();
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(None);
            }
            let stream = self.stream_events(run, &ui);
            let r = match left {
                Some(l) => match tokio::time::timeout(l, stream).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
                None => stream.await,
            };
            match r {
                Ok(Some(status)) => {
                    ui.finish(&status);
                    return Ok(Some(status));
                }
                // The stream broke (a restarting server): follow again.
                Ok(None) => {
                    ui.line("the event stream ended early; reconnecting".into());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One event stream: Some(status) when the run ended, None when the
    /// stream broke first.
    async fn stream_events(&self, run: &str, ui: &Follow) -> Result<Option<String>, ClientError> {
        let r = self
            .send(
                &Method::GET,
                &format!("/v1/runs/{run}/events"),
                &[("accept", "text/event-stream")],
                &Bytes::new(),
            )
            .await?;
        if r.status() != StatusCode::OK {
            let status = r.status();
            let body = r
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(Self::refused(&Answer { status, body }));
        }
        let mut body = r.into_body();
        let mut buf = String::new();
        loop {
            let frame = match tokio::time::timeout(Duration::from_secs(60), body.frame()).await {
                Ok(Some(Ok(f))) => f,
                // Ended, broke, or silent past two keep-alives.
                _ => return Ok(None),
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            buf.push_str(&String::from_utf8_lossy(data));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let data: String = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                let Ok(ev) = serde_json::from_str::<Json>(&data) else {
                    continue;
                };
                if let Some(status) = ui.event(&ev) {
                    return Ok(Some(status));
                }
            }
        }
    }
}

/// What a follower shows: a bar of cells done on a terminal, a line per
/// cell change otherwise.
struct Follow {
    bar: Option<ProgressBar>,
    seen: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Follow {
    fn new() -> Follow {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(1);
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix:.bold} [{elapsed_precise}] {bar:25.green/white} {pos}/{len} cells {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.set_prefix("run");
            b.enable_steady_tick(Duration::from_millis(500));
            b
        });
        Follow {
            bar,
            seen: Default::default(),
        }
    }

    fn line(&self, text: String) {
        let text = pgfleet_proto::escape::terminal(&text).into_owned();
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Shows an event; Some(status) for the run's final one.
    fn event(&self, ev: &Json) -> Option<String> {
        let s = |k: &str| ev[k].as_str().unwrap_or_default().to_string();
        match ev["type"].as_str() {
            Some("cell") => {
                let (id, state) = (s("cell_id"), s("state"));
                if let Some(b) = &self.bar {
                    b.set_length(ev["total"].as_u64().unwrap_or(1));
                    b.set_position(ev["done"].as_u64().unwrap_or(0));
                }
                let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                if seen.get(&id) != Some(&state) {
                    seen.insert(id.clone(), state.clone());
                    drop(seen);
                    let mut text = format!("cell {id} {state}");
                    if !s("agents").is_empty() && state == "running" {
                        text.push_str(&format!(" @ {}", s("agents")));
                    }
                    if let Some(e) = ev["error"].as_str() {
                        text.push_str(&format!(": {e}"));
                    }
                    self.line(text);
                }
                None
            }
            Some("progress") => {
                if let Some(b) = &self.bar {
                    b.set_message(
                        pgfleet_proto::escape::terminal_line(&format!(
                            "{}: {} {}",
                            s("cell_id"),
                            s("phase"),
                            s("message")
                        ))
                        .into_owned(),
                    );
                }
                None
            }
            Some("agent") => {
                self.line(format!(
                    "agent {} {}: {}",
                    s("agent_id"),
                    s("state"),
                    s("detail")
                ));
                None
            }
            Some("run") => {
                let status = s("status");
                pgfleet_store::RunStatus::parse(&status)
                    .is_none_or(|st| st.is_terminal())
                    .then_some(status)
            }
            _ => None,
        }
    }

    fn finish(&self, status: &str) {
        if let Some(b) = &self.bar {
            b.finish_with_message(status.to_string());
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The certificates of a PEM file (at least one), for the server's chain
/// and the client's `--ca`; the error says what is wrong with the file.
pub fn pem_certificates(
    path: &std::path::Path,
) -> std::result::Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate in it".into());
    }
    Ok(certs)
}

/// A secret token from a file: trimmed, at least 16 characters.
pub fn read_token(f: &Path, what: &str) -> pgfleet_store::Result<String> {
    let t = std::fs::read_to_string(f)
        .map_err(|e| {
            pgfleet_store::Error::Usage(format!("reading the {what} {}: {e}", f.display()))
        })?
        .trim()
        .to_string();
    if t.len() < 16 {
        return Err(pgfleet_store::Error::Usage(format!(
            "the token in {} is too short: use at least 16 characters (e.g. `openssl rand -hex 32 > {}`)",
            f.display(),
            f.display()
        )));
    }
    Ok(t)
}

/// `n` random bytes as hex.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
