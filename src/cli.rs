//! The `stickyvol` command line as clap parses it. `main` runs what it names; it lives in the
//! library so tests can parse argument lists exactly as the binary does (the manifest test feeds
//! it every stickyvol container in deploy/).

use clap::{Parser, Subcommand, ValueEnum};

use crate::admin::cli::AdminCommand;
use crate::cluster::command::ClusterCommand;
use crate::config::{DoctorArgs, ServeArgs};

/// stickyvol: a CSI driver for sticky, node-local, emptyDir-style persistent volumes.
///
/// A claim gets a directory (or a raw block device) on the node where its first pod runs; the
/// volume stays on that node, survives pod and node restarts, and is removed with its PV.
#[derive(Debug, Parser)]
#[command(name = "stickyvol", version = crate::LONG_VERSION, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
// Made once per process, at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve the CSI Identity, Controller and Node services on a unix socket (and the admin API
    /// on a socket of its own).
    ///
    /// Log verbosity follows RUST_LOG (e.g. RUST_LOG=debug logs every RPC; default: info).
    Serve(ServeArgs),
    /// Check that this node can run stickyvol; exits non-zero when it cannot.
    Doctor(DoctorArgs),
    /// Ask the Kubernetes API (KUBECONFIG or in-cluster credentials), from anywhere.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// `volumes` and `volume …`: ask the driver serving on this node about its volumes.
    #[command(flatten)]
    Admin(AdminCommand),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::cluster::command::ClusterCommand;
    use crate::cluster::moving::MoveArgs;
    use crate::cluster::orphans::OrphansArgs;

    #[test]
    fn the_command_line_is_consistent_and_parses_the_cluster_commands() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["stickyvol", "cluster", "orphans", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Cluster(ClusterCommand::Orphans(OrphansArgs { json: true, .. }))
        ));
        assert!(Cli::try_parse_from(["stickyvol", "cluster"]).is_err());
        let cli = Cli::try_parse_from(["stickyvol", "cluster", "move", "shop/data-0", "--to", "b"])
            .unwrap();
        let Command::Cluster(ClusterCommand::Move(MoveArgs { claim, to, .. })) = cli.command else {
            panic!("cluster move parses")
        };
        assert_eq!((claim.as_str(), to.as_str()), ("shop/data-0", "b"));
    }
}
