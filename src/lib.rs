//! stickyvol: a CSI driver for sticky, node-local, emptyDir-style persistent volumes.
//!
//! # Start here
//!
//! Arrows point down: the faces, the admin API and the cluster loops use the volume domain,
//! which uses the host mechanics. How a request travels through these rooms, the background
//! loops and the rules each room keeps: `docs/design.md`.
//!
//! - [`faces`]: the CSI services (Identity, Controller, Node). Thin: check the request
//!   (`faces::request`), call the domain, map its errors to gRPC codes.
//! - [`admin`]: our admin API, served on its own root-only socket, and its
//!   `stickyvol volumes` / `stickyvol volume …` commands.
//! - [`cluster`]: everything that talks to the Kubernetes API. `controller`: the loops of
//!   `--mode=controller` (restore placement, class check, node-loss reconciler, the evictions
//!   the nodes ask for, moves of claims to another node); `node`: the
//!   loops a node plugin runs (overflow check, pool-full Events, project-id audit, node loss'
//!   node side, node-to-node transfers); `kit`:
//!   what both share; `loops`: the one list of background loops; `command`, `orphans` and
//!   `moving`: the `stickyvol cluster orphans` and `stickyvol cluster move` commands.
//! - [`volume`]: the domain: [`volume::Volumes`] and its operations (create, stage, publish,
//!   expand, stats, the read-only fence, recovery), over `state` (ids, records, the
//!   journal), `space` (pools, limits, accounting) and `copies` (snapshots, clones, export and
//!   import).
//! - [`host`]: the mechanics, knowing nothing of CSI: mounts (also in other mount namespaces),
//!   loop devices, image filesystems, quotas, btrfs, tree walks, safe deletion, copies, the
//!   export stream.
//!
//! Beside them: [`class`] (the StorageClass parameters, parsed once), [`config`] (flags into a
//! checked configuration), [`server`] (sockets and the gRPC server), [`metrics`], [`cli`],
//! [`doctor`], [`error`] (the one mapping of errors to gRPC codes) and [`unix_channel`].
//! `src/main.rs` is the `stickyvol` binary; `src/bench/` is `stickyvol-bench`.

pub mod admin;
pub mod class;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod doctor;
pub mod error;
pub mod faces;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod metrics;
pub mod server;
pub mod unix_channel;
pub mod volume;

/// The CSI v1 types and service stubs generated from `proto/csi.proto`.
pub mod csi {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

/// Our admin API's types and stubs, generated from `proto/admin.proto`.
pub mod admin_api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("stickyvol.admin.v1");
}

/// The release (Cargo.toml's version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit built (build.rs): git's commit id, or "unknown" when built without git's history.
pub const REVISION: &str = env!("STICKYVOL_REVISION");

/// What `stickyvol --version` says after the name: the release and the commit.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("STICKYVOL_REVISION"),
    ")"
);

/// Encoded descriptors of both schemas (CSI and admin), served through gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("descriptors");
