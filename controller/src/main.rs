//! `pgfleet`: the controller's command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "server")]
use pgfleet_controller::agents::kubernetes;
#[cfg(feature = "server")]
use pgfleet_controller::agents::local::{LocalOptions, default_agent_bin};
#[cfg(feature = "server")]
use pgfleet_controller::cli::{AgentsFrom, DatasetsAction, KubeArgs, RunArgs, SessionArgs};
use pgfleet_controller::cli::{Cli, Command, CompareArgs, CompareFormat, HistoryArgs, Remote};
use pgfleet_controller::client::{Client, ClientError, read_token};
use pgfleet_controller::labels::Labels;
#[cfg(feature = "server")]
use pgfleet_controller::run::{RunOptions, run_scenario};
#[cfg(feature = "server")]
use pgfleet_controller::runner::RunnerConfig;
#[cfg(feature = "server")]
use pgfleet_controller::serve::ServeOptions;
use pgfleet_controller::store::Store;
use pgfleet_controller::{Error, exit, report, scenario};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Commands that only print end quietly when their reader goes away
    // (`pgfleet validate s.yaml | head`) instead of panicking on the
    // closed pipe. Not `run`, `serve` or `datasets build`: they own
    // clusters and must reach their cleanup.
    if matches!(
        cli.command,
        Command::Validate { .. }
            | Command::List { .. }
            | Command::Compare(_)
            | Command::History(_)
            | Command::Crd
            | Command::Status { .. }
    ) {
        // SAFETY: restoring a signal's default disposition before any
        // thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // Logs, and traces when OTEL_EXPORTER_OTLP_ENDPOINT is set (the
    // exporter lives on the runtime; dropped, it flushes).
    let _telemetry = {
        let _in = rt.enter();
        pgfleet_proto::telemetry::init("pgfleet", "warn")
    };
    match rt.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", pgfleet_proto::escape::terminal(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

/// A command's failure: a local error or a remote one.
enum Failure {
    Local(Error),
    Remote(ClientError),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Local(e) => e.exit_code(),
            Failure::Remote(e) => e.exit_code(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Local(e) => e.fmt(f),
            Failure::Remote(e) => e.fmt(f),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Local(e)
    }
}

impl From<scenario::ScenarioError> for Failure {
    fn from(e: scenario::ScenarioError) -> Self {
        Failure::Local(e.into())
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Remote(e)
    }
}

#[cfg(feature = "server")]
fn service_config(
    store: std::path::PathBuf,
    bind: std::net::SocketAddr,
    s: SessionArgs,
    pool: bool,
) -> RunnerConfig {
    RunnerConfig {
        store,
        bind,
        advertise_url: s.advertise_url,
        lease: Duration::from_secs_f64(s.lease_s.max(0.5)),
        registration_timeout: Duration::from_secs_f64(s.registration_timeout_s.max(1.0)),
        tls_cert: s.tls_cert,
        tls_key: s.tls_key,
        tls_ca: s.tls_ca,
        join_token_file: s.join_token_file,
        pool,
        interactive: !pool,
    }
}

fn client(r: &Remote) -> Result<Client, Failure> {
    let token = read_token(&r.token_file, "API token file")?;
    let mut c = Client::new(&r.server, token, r.ca.as_deref())?;
    c.retry_for = Duration::from_secs_f64(r.retry_for_s.max(0.0));
    Ok(c)
}

/// Cancels on the first Ctrl-C (and SIGTERM); exits on the second Ctrl-C.
fn cancel_on_signals(what: &'static str) -> CancellationToken {
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("\ninterrupted: {what} (Ctrl-C again to force)");
        c.cancel();
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(exit::CANCELLED as i32);
        }
    });
    cancel
}

/// The checks' verdicts on the terminal, and as JUnit XML when asked.
fn verdicts(doc: &report::Report, junit: Option<&std::path::Path>) -> Result<(), Failure> {
    let checks = &doc.checks;
    for e in checks {
        let label = report::checks::point_label(e);
        eprintln!(
            "check {}{}: {}",
            e.name,
            if label.is_empty() {
                String::new()
            } else {
                format!(" [{label}]")
            },
            report::checks::describe(e)
        );
    }
    for w in &doc.warnings {
        eprintln!("{w}");
    }
    if let Some(err) = &doc.check_error {
        eprintln!("warning: checks not judged: {err}");
    }
    if let Some(path) = junit {
        let suite = format!("pgfleet {}", doc.scenario);
        std::fs::write(path, report::checks::junit(&suite, checks))
            .map_err(|e| Error::Usage(format!("writing the JUnit file {}: {e}", path.display())))?;
    }
    Ok(())
}

#[cfg(feature = "server")]
fn kube_options(k: &KubeArgs, controller_url: Option<String>) -> kubernetes::KubeOptions {
    let d = kubernetes::KubeOptions::default();
    kubernetes::KubeOptions {
        namespace: k.namespace.clone(),
        image: k.agent_image.clone(),
        image_pull_policy: k.agent_image_pull_policy.clone(),
        controller_url: controller_url.unwrap_or(d.controller_url),
        token_secret: k.agent_token_secret.clone(),
        ca_secret: k.agent_ca_secret.clone(),
        pending_timeout: Duration::from_secs_f64(k.pending_timeout_s.max(1.0)),
        exit_grace: d.exit_grace,
        dataset_remote: k.dataset_remote.clone(),
        dataset_remote_secret: k.dataset_remote_secret.clone(),
        dataset_snapshots: k.dataset_snapshots.iter().cloned().collect(),
        snapshot_cut_timeout: d.snapshot_cut_timeout,
    }
}

/// A report to compare: a report.json file, else a run id in the store.
fn load_report(what: &str, store: &std::path::Path) -> Result<report::Report, Failure> {
    let path = std::path::Path::new(what);
    if path.is_file() || what.ends_with(".json") {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Usage(format!("reading {what}: {e}")))?;
        return Ok(report::Report::read(what, &text).map_err(|e| Error::Usage(e.to_string()))?);
    }
    let store = Store::open(store)?;
    Ok(report::build(&store, what)?)
}

fn compare(args: CompareArgs, store: &std::path::Path) -> Result<u8, Failure> {
    use pgfleet_controller::compare;
    if !(0.5..=0.999).contains(&args.confidence) {
        return Err(Error::Usage(format!(
            "--confidence {} is out of range: allowed 0.5..=0.999",
            args.confidence
        ))
        .into());
    }
    let gates = args
        .fail_if
        .iter()
        .map(|g| compare::parse_gate(g))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::Usage)?;
    let base = load_report(&args.baseline, store)?;
    let cand = load_report(&args.candidate, store)?;
    let rows = compare::compare(&base, &cand, args.confidence);
    if rows.is_empty() {
        return Err(Error::Usage(format!(
            "{} and {} have no point in common (same workload, parameters and instance class) with results on both sides",
            args.baseline, args.candidate
        ))
        .into());
    }
    for g in &gates {
        if !rows.iter().any(|r| r.metric == g.metric) {
            let mut known: Vec<&str> = rows.iter().map(|r| r.metric.as_str()).collect();
            known.sort();
            known.dedup();
            return Err(Error::Usage(format!(
                "--fail-if '{}': no compared point measures `{}`; they measure {}",
                g.text,
                g.metric,
                known.join(", ")
            ))
            .into());
        }
    }
    let judged = compare::judge_gates(&rows, &gates, args.inconclusive_passes);
    match args.format {
        CompareFormat::Markdown => {
            print!(
                "{}",
                compare::markdown(&args.baseline, &args.candidate, &rows, &judged)
            );
            let costs = compare::costs(&base, &cand);
            if !costs.is_empty() {
                println!(
                    "\n## Cost per million transactions\n\n| class | baseline | candidate | cost ratio | TPS ratio |\n|---|---|---|---|---|"
                );
                for c in &costs {
                    let r = |v: Option<f64>| {
                        v.map(|x| format!("{x:.2}x")).unwrap_or_else(|| "–".into())
                    };
                    println!(
                        "| {} | {:.4} {cur} | {:.4} {cur} | {} | {} |",
                        c.class,
                        c.baseline_per_million_transactions,
                        c.candidate_per_million_transactions,
                        r(c.ratio),
                        r(c.tps_ratio),
                        cur = c.currency
                    );
                }
            }
        }
        CompareFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "baseline": args.baseline, "candidate": args.candidate,
                "confidence": args.confidence, "metrics": rows, "gates": judged,
                "costs": compare::costs(&base, &cand),
                "ok": judged.iter().all(|g| g.passes),
            }))
            .unwrap_or_default()
        ),
    }
    if let Some(path) = &args.junit {
        std::fs::write(path, report::checks::junit("pgfleet compare", &judged))
            .map_err(|e| Error::Usage(format!("writing {}: {e}", path.display())))?;
    }
    Ok(if judged.iter().all(|g| g.passes) {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// What the store at `path` teaches the estimates, when there is one and
/// it opens (`pgfleet validate` needs no store: nothing learned then).
fn learned_from(path: &std::path::Path) -> pgfleet_controller::learned::Learned {
    if !path.exists() {
        return Default::default();
    }
    match Store::open(path).and_then(|s| pgfleet_controller::learned::Learned::read(&s)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "note: estimates not learned from {}: {e} (the model's estimates follow)",
                path.display()
            );
            Default::default()
        }
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Compare(args) => compare(args, &cli.store),
        Command::History(args) => history(args, &cli.store),
        Command::Validate {
            scenario,
            kubernetes,
            kube,
            datasets,
        } => validate(&scenario, kubernetes, &kube, &datasets, &cli.store),
        Command::List { labels } => list(&labels, &cli.store),
        Command::Report {
            run_id,
            out,
            format,
            remote,
        } => report(&run_id, &out, format, remote, &cli.store).await,
        Command::Submit(args) => submit(args).await,
        Command::Status { run_id, remote } => status(&run_id, &remote).await,
        Command::Cancel { run_id, remote } => cancel(&run_id, &remote).await,
        #[cfg(feature = "server")]
        other => server_command(other, cli.store).await,
        #[cfg(not(feature = "server"))]
        other => Err(not_in_client(other.name())),
    }
}

/// `pgfleet validate`: the plan, or with `--kubernetes` the objects a run
/// would create there.
fn validate(
    path: &std::path::Path,
    kubernetes: bool,
    kube: &pgfleet_controller::cli::KubeArgs,
    datasets: &pgfleet_controller::cli::DatasetDir,
    store: &std::path::Path,
) -> Result<u8, Failure> {
    let sc = scenario::load(path)?;
    let published = scenario::plan::published_in(&datasets.resolve());
    let mut cells = scenario::plan::plan_with(&sc, &published);
    let learned = learned_from(store);
    let applied = learned.apply(&mut cells);
    if kubernetes {
        #[cfg(feature = "server")]
        {
            let opts = kube_options(kube, None);
            let objects = kubernetes::plan(&sc, "dry-run", &opts)
                .map_err(|e| scenario::ScenarioError::located(path, "", e))?;
            print!("{}", objects.to_yaml());
            eprint!("{}", kubernetes::describe(&objects));
            // What it takes there: the pods' datasets are on their
            // own volumes (or behind the object store).
            let mut cells = scenario::plan::plan_for(&sc, &kubernetes::holdings(&sc, &opts, &[]));
            let applied = learned.apply(&mut cells);
            eprint!("{}", scenario::plan::describe(&sc, &cells, path));
            if let Some(line) = applied.describe(cells.len()) {
                eprintln!("{line}");
            }
            // A later run, whose volumes start from the snapshots
            // this one leaves.
            let assumed = kubernetes::assumed_snapshots(&sc, &opts);
            if !assumed.is_empty() {
                let mut later =
                    scenario::plan::plan_for(&sc, &kubernetes::holdings(&sc, &opts, &assumed));
                learned.apply(&mut later);
                let t = scenario::plan::estimate(&sc, &later);
                let classes: Vec<&str> = assumed.iter().map(|s| s.storage_class.as_str()).collect();
                eprintln!(
                    "a later run, its {} volumes made from the dataset snapshots this one leaves (each restoring cell on a volume of its own): {} of cells, about {} on this fleet",
                    classes.join(", "),
                    pgfleet_proto::workload::approx_seconds(t.cell_seconds),
                    pgfleet_proto::workload::approx_seconds(t.wall_seconds)
                );
            }
        }
        #[cfg(not(feature = "server"))]
        {
            let _ = (kube, &learned, &applied);
            return Err(not_in_client("validate --kubernetes"));
        }
    } else {
        print!("{}", scenario::plan::describe(&sc, &cells, path));
        if let Some(line) = applied.describe(cells.len()) {
            println!("{line}");
        }
        // Which PostgreSQL each class would run here (local agents).
        for f in &sc.fleet.value {
            let major = f.postgres_version();
            let named = f.postgres.as_ref().is_some_and(|p| p.version.is_some());
            let how = if named { "" } else { " (the default)" };
            match pgfleet_proto::installs::find(major) {
                Some(dir) => println!(
                    "class {}: PostgreSQL {major}{how} from {}",
                    pgfleet_proto::escape::terminal_line(&f.name.value),
                    dir.display()
                ),
                None => println!(
                    "class {}: {}",
                    pgfleet_proto::escape::terminal_line(&f.name.value),
                    pgfleet_proto::installs::missing(major)
                ),
            }
        }
        for c in sc.checks() {
            let figure = match &c.baseline {
                Some(b) => format!(
                    "{} of {} / {b}{}",
                    c.metric,
                    c.class,
                    c.baseline_entry
                        .map(|e| format!(" (workload entry {e})"))
                        .unwrap_or_default()
                ),
                None => format!("{} of {}", c.metric, c.class),
            };
            let figure = if c.at.is_empty() {
                figure
            } else {
                let at: Vec<String> = c.at.iter().map(|(k, v)| format!("{k} {v}")).collect();
                format!("{figure} at {}", at.join(", "))
            };
            let bound = match (c.min, c.max, &c.history) {
                (_, _, Some(h)) => format!(
                    "at most {} % worse than the median of the last {} earlier comparable runs since their last change{}",
                    h.max_drop * 100.0,
                    h.window,
                    if h.same_labels.is_empty() {
                        String::new()
                    } else {
                        format!(" (with the same {})", h.same_labels.join(", "))
                    }
                ),
                (Some(lo), Some(hi), _) => format!("within {lo}..={hi}"),
                (Some(lo), None, _) => format!("at least {lo}"),
                (None, Some(hi), _) => format!("at most {hi}"),
                _ => String::new(),
            };
            println!(
                "check `{}`: {figure} {bound}, at {:.0} % confidence",
                c.name,
                c.confidence * 100.0
            );
        }
    }
    Ok(exit::OK)
}

/// `pgfleet list`: the stored runs carrying every label given.
fn list(labels: &[String], store: &std::path::Path) -> Result<u8, Failure> {
    let filter = Labels::parse(labels).map_err(Error::Usage)?;
    let store = Store::open(store)?;
    println!(
        "{:<24} {:<20} {:<11} {:<26} {:<26} labels",
        "run", "scenario", "status", "started", "finished"
    );
    for r in store
        .runs()?
        .into_iter()
        .filter(|r| r.labels.matches(&filter))
    {
        println!(
            "{:<24} {:<20} {:<11} {:<26} {:<26} {}",
            r.id,
            r.scenario_name,
            r.status,
            r.started_at,
            r.finished_at.unwrap_or_default(),
            r.labels
        );
    }
    Ok(exit::OK)
}

/// `pgfleet report`: a stored run's report, from the store or a server.
async fn report(
    run_id: &str,
    out: &std::path::Path,
    format: Option<pgfleet_controller::cli::ReportFormat>,
    remote: pgfleet_controller::cli::OptionalRemote,
    store: &std::path::Path,
) -> Result<u8, Failure> {
    match (remote.server, remote.token_file) {
        (Some(server), Some(token_file)) => {
            let c = client(&Remote {
                server,
                token_file,
                retry_for_s: 60.0,
                ca: remote.ca,
            })?;
            c.download_report(run_id, out).await?;
        }
        (Some(_), None) => {
            return Err(
                Error::Usage("--server needs --token-file (or PGFLEET_TOKEN_FILE)".into()).into(),
            );
        }
        _ => {
            let store = Store::open(store)?;
            report::write(&store, run_id, out)?;
        }
    }
    println!("{}", out.join("report.md").display());
    if format == Some(pgfleet_controller::cli::ReportFormat::Postgresbench) {
        // From report.json as written, whichever way it came.
        let path = out.join("report.json");
        let doc: report::Report = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
            .map_err(|e| Error::Report(format!("reading {}: {e}", path.display())))?;
        let written = report::postgresbench::write(&doc, out)
            .map_err(|e| Error::Report(format!("writing into {}: {e}", out.display())))?;
        if written.is_empty() {
            return Err(Error::Usage(format!(
                "run {run_id} has no pgbench results: --format postgresbench writes pgbench's figures"
            ))
            .into());
        }
        for p in written {
            println!("{}", p.display());
        }
    }
    Ok(exit::OK)
}

/// `pgfleet submit`: a scenario to a server, and with `--wait` its run
/// followed to its end and judged.
async fn submit(args: Box<pgfleet_controller::cli::SubmitArgs>) -> Result<u8, Failure> {
    // Check it here first: a typo fails the CI job without a round trip.
    let yaml = scenario::read(&args.scenario)?;
    scenario::parse(&args.scenario, &yaml)?;
    let c = client(&args.remote)?;
    let key = args
        .idempotency_key
        .clone()
        .unwrap_or_else(|| pgfleet_controller::client::random_hex(16));
    let name = args
        .scenario
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "scenario.yaml".into());
    let labels = Labels::parse(&args.labels).map_err(Error::Usage)?;
    let (id, created) = c.submit(&name, yaml, &key, &labels).await?;
    if created {
        eprintln!("submitted run {id} to {}", args.remote.server);
    } else {
        eprintln!("run {id} was already submitted with this idempotency key");
    }
    println!("{id}");
    if !args.wait {
        return Ok(exit::OK);
    }
    let interrupted = cancel_on_signals("cancelling the run on the server");
    let timeout = args.timeout_s.map(|t| Duration::from_secs_f64(t.max(0.0)));
    let status = tokio::select! {
        s = c.follow(&id, timeout) => s?,
        _ = interrupted.cancelled() => {
            c.cancel(&id).await?;
            // Follow it to its end: the cells stop and are stored.
            c.follow(&id, Some(Duration::from_secs(120))).await?
        }
    };
    let Some(status) = status else {
        eprintln!("error: run {id} did not finish within --timeout-s; cancelling it on the server");
        let _ = c.cancel(&id).await;
        return Ok(exit::INFRA);
    };
    if let Some(out) = &args.out {
        c.download_report(&id, out).await?;
        eprintln!("report: {}", out.join("report.md").display());
    }
    println!("run {id} {status}");
    let doc = c.get_json(&format!("/v1/runs/{id}/report.json")).await?;
    let doc = report::Report::read("the server's report.json", &doc.to_string())
        .map_err(|e| Error::Usage(e.to_string()))?;
    verdicts(&doc, args.junit.as_deref())?;
    Ok(exit::of_report(&doc.status, doc.checks_pass()))
}

/// `pgfleet status`: a run on a server and its cells.
async fn status(run_id: &str, remote: &Remote) -> Result<u8, Failure> {
    let c = client(remote)?;
    let r = c.get_json(&format!("/v1/runs/{run_id}")).await?;
    // What the server answers quotes submitted names and servers' errors:
    // shown escaped, one line each.
    let s = |v: &serde_json::Value| {
        pgfleet_proto::escape::terminal_line(v.as_str().unwrap_or("-")).into_owned()
    };
    println!(
        "run {} ({}): {}, {}/{} cells done",
        s(&r["id"]),
        s(&r["scenario"]),
        s(&r["status"]),
        r["progress"]["done"],
        r["progress"]["total"]
    );
    for cell in r["cells"].as_array().into_iter().flatten() {
        let mut line = format!("  {:<40} {:<10}", s(&cell["cell_id"]), s(&cell["state"]));
        if let Some(a) = cell["agents"].as_str() {
            line.push_str(&format!(" @ {a}"));
        }
        if let Some(e) = cell["error"].as_str() {
            line.push_str(&format!(": {}", pgfleet_proto::escape::terminal_line(e)));
        }
        println!("{line}");
    }
    Ok(exit::OK)
}

/// `pgfleet cancel`: a run on a server.
async fn cancel(run_id: &str, remote: &Remote) -> Result<u8, Failure> {
    let c = client(remote)?;
    let r = c.cancel(run_id).await?;
    println!(
        "run {run_id}: {}",
        r["status"].as_str().unwrap_or("cancelling")
    );
    Ok(exit::OK)
}

/// The commands of the controller itself (the `server` feature).
#[cfg(feature = "server")]
async fn server_command(command: Command, store: std::path::PathBuf) -> Result<u8, Failure> {
    match command {
        Command::Run(args) => {
            let junit = args.junit.clone();
            let summary = run_scenario(
                run_options(*args, store, false),
                cancel_on_signals("cancelling the run"),
            )
            .await?;
            let report = summary.report_dir.join("report.md");
            println!(
                "run {} {}: report {}",
                summary.run_id,
                summary.status.as_str(),
                report.display()
            );
            verdicts(&summary.report, junit.as_deref())?;
            Ok(exit::of_report(
                &summary.report.status,
                summary.report.checks_pass(),
            ))
        }
        Command::Datasets { action } => match action {
            DatasetsAction::List { dir, scenarios } => {
                print!(
                    "{}",
                    pgfleet_controller::datasets::list(&dir.resolve(), &scenarios)?
                );
                Ok(exit::OK)
            }
            DatasetsAction::Rm { dir, fingerprints } => {
                print!(
                    "{}",
                    pgfleet_controller::datasets::remove(&dir.resolve(), &fingerprints)?
                );
                Ok(exit::OK)
            }
            DatasetsAction::Build(args) => {
                let summary = run_scenario(
                    run_options(*args, store, true),
                    cancel_on_signals("cancelling the build"),
                )
                .await?;
                for c in &summary.report.cells {
                    let d = c.dataset();
                    println!(
                        "{} {}: {} {}",
                        c.cell_id,
                        c.state,
                        d.as_ref().map_or("", |d| d.fingerprint.as_str()),
                        d.as_ref()
                            .map_or(c.error.as_deref().unwrap_or(""), |d| d.how.as_str()),
                    );
                }
                println!(
                    "datasets build {} {}: report {}",
                    summary.run_id,
                    summary.status.as_str(),
                    summary.report_dir.join("report.md").display()
                );
                Ok(match summary.status {
                    pgfleet_controller::store::RunStatus::Succeeded => exit::OK,
                    pgfleet_controller::store::RunStatus::Cancelled => exit::CANCELLED,
                    _ => exit::FAILED,
                })
            }
        },
        Command::Serve(args) => {
            let shutdown = cancel_on_signals("stopping the server");
            let reports = args.reports.clone().unwrap_or_else(|| {
                store
                    .parent()
                    .unwrap_or(std::path::Path::new("."))
                    .join("reports")
            });
            let advertise_url = args.session.advertise_url.clone();
            let opts = ServeOptions {
                service: service_config(store, args.bind, args.session, true),
                http_bind: args.http,
                api_token_file: args.api_token_file,
                reports,
                max_scenario_bytes: args.max_scenario_bytes,
                max_queued_runs: args.max_queued_runs,
                max_cells: args.max_cells,
                http_tls: args.http_tls_cert.clone().zip(args.http_tls_key.clone()),
                allow_shell_scenarios: args.allow_shell_scenarios,
                metrics_retention: Duration::from_secs_f64(args.metrics_retention_s.max(0.0)),
                kubernetes: match args.agents {
                    AgentsFrom::Pool => None,
                    AgentsFrom::Kubernetes => {
                        let Some(url) = advertise_url else {
                            return Err(Error::Usage(
                                "--agents kubernetes needs --advertise-url: the address pods dial, e.g. http://pgfleet-controller.pgfleet.svc:7070".into(),
                            )
                            .into());
                        };
                        Some(kube_options(&args.kube, Some(url)))
                    }
                },
                resources: (args.agents == AgentsFrom::Kubernetes && args.watch_resources).then(
                    || {
                        args.api_url.clone().unwrap_or_else(|| {
                            format!("http://pgfleet-controller.{}.svc:8080", args.kube.namespace)
                        })
                    },
                ),
            };
            pgfleet_controller::serve::serve(opts, shutdown).await?;
            Ok(exit::OK)
        }
        Command::Crd => {
            print!("{}", pgfleet_controller::resource::crd_yaml());
            Ok(exit::OK)
        }
        _ => unreachable!("dispatch answers the client's commands"),
    }
}

/// A command the client-only build (no `server` feature) does not have.
#[cfg(not(feature = "server"))]
fn not_in_client(what: &str) -> Failure {
    Error::Usage(format!(
        "`pgfleet {what}` is not in this client-only pgfleet (built without the `server` feature): use the full build (the controller image's, or cargo install without --no-default-features)"
    ))
    .into()
}

#[cfg(feature = "server")]
/// `pgfleet run`'s options (and `pgfleet datasets build`'s, `datasets_only`).
fn run_options(args: RunArgs, store: std::path::PathBuf, datasets_only: bool) -> RunOptions {
    let out = args.out.clone().unwrap_or_else(|| {
        std::path::Path::new("runs").join(chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string())
    });
    let data_dir = args
        .data_dir
        .unwrap_or_else(|| std::env::temp_dir().join("pgfleet"));
    RunOptions {
        labels: args.labels,
        scenario: args.scenario,
        out,
        service: service_config(store, args.bind, args.session, false),
        local: LocalOptions {
            agent_bin: args.agent_bin.unwrap_or_else(default_agent_bin),
            pg_bin: args.pg_bin,
            pg_user: args.pg_user,
            dataset_dir: args
                .dataset_dir
                .unwrap_or_else(|| data_dir.join("datasets")),
            dataset_remote: args.dataset_remote,
            data_dir,
            netns: args.agent_netns,
            // With --metrics-addr, the agents serve theirs too.
            agent_metrics: args.metrics_addr.is_some(),
        },
        metrics_addr: args.metrics_addr,
        datasets_only,
    }
}

fn history(args: HistoryArgs, store: &std::path::Path) -> Result<u8, Failure> {
    use pgfleet_controller::history;
    if !(0.5..=0.999).contains(&args.confidence) {
        return Err(Error::Usage(format!(
            "--confidence {} is out of range: allowed 0.5..=0.999",
            args.confidence
        ))
        .into());
    }
    let q = history::Query {
        scenario: history::scenario_name(&args.scenario)?,
        metrics: args.metrics,
        class: args.class,
        point: args.point,
        labels: Labels::parse(&args.labels).map_err(Error::Usage)?,
        last: args.last,
        vary: args.vary,
        level: args.confidence,
        options: Default::default(),
    };
    let store = Store::open(store)?;
    let h = history::history(&store, &q)?;
    if h.series.is_empty() {
        eprintln!(
            "no series matches --metric/--class/--point in {} comparable runs",
            h.runs.len()
        );
    }
    let (text, plots, file) = match args.format {
        CompareFormat::Json => (
            serde_json::to_string_pretty(&h).unwrap_or_default() + "\n",
            Vec::new(),
            "history.json",
        ),
        CompareFormat::Markdown => {
            let (md, plots) = history::markdown(&h);
            (md, plots, "history.md")
        }
    };
    match args.out {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::Usage(format!("creating {}: {e}", dir.display())))?;
            let write = |name: &str, text: &str| {
                std::fs::write(dir.join(name), text)
                    .map_err(|e| Error::Usage(format!("writing {}: {e}", dir.join(name).display())))
            };
            for (name, svg) in &plots {
                write(name, svg)?;
            }
            write(file, &text)?;
            println!("{}", dir.join(file).display());
        }
        None => print!("{text}"),
    }
    Ok(exit::OK)
}
