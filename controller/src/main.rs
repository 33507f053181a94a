//! `pgfleet`: the controller's command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use pgfleet_controller::agents::local::{LocalOptions, default_agent_bin};
use pgfleet_controller::cli::{Cli, Command};
use pgfleet_controller::run::{RunOptions, execute};
use pgfleet_controller::store::{RunStatus, Store};
use pgfleet_controller::{Error, report, scenario};

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFLEET_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
    match rt.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Error> {
    match cli.command {
        Command::Validate { scenario: path } => {
            let sc = scenario::load(&path)?;
            let cells = scenario::plan(&sc);
            print!("{}", scenario::plan::describe(&sc, &cells, &path));
            Ok(0)
        }
        Command::List => {
            let store = Store::open(&cli.store)?;
            println!(
                "{:<24} {:<20} {:<10} {:<26} finished",
                "run", "scenario", "status", "started"
            );
            for r in store.runs()? {
                println!(
                    "{:<24} {:<20} {:<10} {:<26} {}",
                    r.id,
                    r.scenario_name,
                    r.status,
                    r.started_at,
                    r.finished_at.unwrap_or_default()
                );
            }
            Ok(0)
        }
        Command::Report { run_id, out } => {
            let store = Store::open(&cli.store)?;
            report::write(&store, &run_id, &out)?;
            println!("{}", out.join("report.md").display());
            Ok(0)
        }
        Command::Run(args) => {
            let cancel = CancellationToken::new();
            let c = cancel.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!("\ninterrupted: cancelling the run (Ctrl-C again to force)");
                    c.cancel();
                    if tokio::signal::ctrl_c().await.is_ok() {
                        std::process::exit(130);
                    }
                }
            });
            let out = args.out.clone().unwrap_or_else(|| {
                std::path::Path::new("runs")
                    .join(chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string())
            });
            let opts = RunOptions {
                scenario: args.scenario,
                out,
                store: cli.store,
                lease: Duration::from_secs_f64(args.lease_s.max(0.5)),
                registration_timeout: Duration::from_secs_f64(args.registration_timeout_s.max(1.0)),
                bind: args.bind,
                advertise_url: args.advertise_url,
                tls_cert: args.tls_cert,
                tls_key: args.tls_key,
                tls_ca: args.tls_ca,
                join_token_file: args.join_token_file,
                local: LocalOptions {
                    agent_bin: args.agent_bin.unwrap_or_else(default_agent_bin),
                    pg_bin: args.pg_bin,
                    pg_user: args.pg_user,
                    data_dir: args
                        .data_dir
                        .unwrap_or_else(|| std::env::temp_dir().join("pgfleet")),
                    netns: args.agent_netns,
                },
            };
            let summary = execute(opts, cancel).await?;
            let report = summary.report_dir.join("report.md");
            println!(
                "run {} {}: report {}",
                summary.run_id,
                summary.status.as_str(),
                report.display()
            );
            Ok(match summary.status {
                RunStatus::Succeeded => 0,
                RunStatus::Cancelled => 130,
                _ => 1,
            })
        }
    }
}
