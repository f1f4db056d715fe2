//! `stickyvol cluster …`: the commands that ask the Kubernetes API rather than the driver on
//! this node, from anywhere with a kubeconfig (or in-cluster credentials).

use std::process::ExitCode;

use clap::Subcommand;

use super::draining::{self, DrainArgs};
use super::moving::{self, MoveArgs};
use super::orphans::{self, OrphansArgs};

#[derive(Debug, Subcommand)]
// Made once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum ClusterCommand {
    /// Our PVs whose node is deleted or tainted node.kubernetes.io/out-of-service, with the
    /// node-loss reconciler's decision for each, and the volumes that no PV names, as their
    /// nodes report them.
    Orphans(OrphansArgs),
    /// Move a claim to another node with its data: the controller (--moves=on) copies its
    /// volume node to node and binds the claim to the new one; this follows the move.
    Move(MoveArgs),
    /// After `kubectl cordon` and `kubectl drain`: move each claim of ours on the node that a
    /// pod waits for to a node where that pod may run (`--dry-run`: say where).
    Drain(DrainArgs),
}

pub fn run(command: ClusterCommand) -> ExitCode {
    match command {
        ClusterCommand::Orphans(args) => orphans::run(args),
        ClusterCommand::Move(args) => moving::run(args),
        ClusterCommand::Drain(args) => draining::run(args),
    }
}
