//! The `stickyvol` command line.

use std::future::Future;
use std::process::ExitCode;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use stickyvol::config::{Config, ServeArgs, default_data_dir};
use tracing::error;
use tracing_subscriber::EnvFilter;

/// stickyvol: a CSI driver for sticky, node-local, emptyDir-style persistent volumes.
///
/// A claim gets a directory (or a raw block device) on the node where its first pod runs; the
/// volume stays on that node, survives pod and node restarts, and is removed with its PV.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the CSI Identity, Controller and Node services on a unix socket.
    ///
    /// Log verbosity follows RUST_LOG (e.g. RUST_LOG=debug logs every RPC; default: info).
    Serve(ServeArgs),
    /// Check that this node can run stickyvol; exits non-zero when it cannot.
    Doctor(DoctorArgs),
    /// `volumes` and `volume …`: ask the driver serving on this node about its volumes.
    #[command(flatten)]
    Admin(stickyvol::admin::cli::AdminCommand),
}

#[derive(Debug, Args)]
struct DoctorArgs {
    /// Kubelet's root directory (its mount must propagate to kubelet).
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// The data directory to check [default: <kubelet-dir>/volumes/<driver-name>]
    #[arg(long, env = "DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// CSI driver name (only used to derive the default data directory).
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    driver_name: String,
    /// An extra pool to check, as `serve` takes it (repeatable).
    #[arg(
        long = "pool",
        env = "POOLS",
        value_name = "NAME=PATH",
        value_delimiter = ','
    )]
    pools: Vec<String>,
}

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
        Command::Doctor(args) => {
            let data_dir = args
                .data_dir
                .unwrap_or_else(|| default_data_dir(&args.kubelet_dir, &args.driver_name));
            let pools = match args
                .pools
                .iter()
                .map(|flag| stickyvol::config::pool_flag(flag).map(|(n, p)| (n.to_string(), p)))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(pools) => pools,
                Err(err) => {
                    eprintln!("stickyvol doctor: {err}");
                    return ExitCode::from(2);
                }
            };
            let (text, fit) = stickyvol::doctor::report(&stickyvol::doctor::run(
                &args.kubelet_dir,
                &data_dir,
                &pools,
            ));
            print!("{text}");
            if fit {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Serve(args) => {
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
    }
}
