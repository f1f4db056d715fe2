//! The `stickyvol` binary: parses the command line (`stickyvol::cli`), sets up logging and runs
//! the command.

use std::future::Future;
use std::process::ExitCode;

use clap::Parser;
use stickyvol::cli::{Cli, Command, LogFormat};
use stickyvol::config::{Config, DoctorArgs, DoctorConfig, ServeArgs};
use tracing::error;
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, never in `kubectl logs` or a log file.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Installs the SIGTERM and SIGINT handlers now (inside the runtime `handle`), so a signal that
/// arrives as soon as the socket answers still shuts down gracefully; the future completes on
/// the first of them.
fn shutdown_signal(handle: &tokio::runtime::Handle) -> impl Future<Output = ()> + use<> {
    use tokio::signal::unix::{SignalKind, signal};
    let _runtime = handle.enter();
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
        }
    }
}

/// Lifts the soft open-files limit to the hard one: each concurrent RPC may hold a few
/// descriptors, and the default soft limit (often 1024) is far below what a busy node needs.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(err) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %err, soft, hard, "could not raise the open-files limit");
            }
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "could not read the open-files limit"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Admin(command) => stickyvol::admin::cli::run(command),
        Command::Cluster(command) => stickyvol::cluster::command::run(command),
        Command::Doctor(args) => doctor(args),
        Command::Serve(args) => serve(args),
    }
}

fn doctor(args: DoctorArgs) -> ExitCode {
    let config = match DoctorConfig::from_args(args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("stickyvol doctor: {err}");
            return ExitCode::from(2);
        }
    };
    let (text, fit) = stickyvol::doctor::report(&stickyvol::doctor::run(&config));
    print!("{text}");
    if fit {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let config = match Config::from_args(args) {
        Ok(config) => config,
        Err(err) => {
            error!("{err}");
            return ExitCode::from(2);
        }
    };
    raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    let shutdown = shutdown_signal(runtime.handle());
    match runtime.block_on(stickyvol::server::serve(config, shutdown)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{err}");
            ExitCode::FAILURE
        }
    }
}
