//! stickyvol: a CSI driver for sticky, node-local, emptyDir-style persistent volumes.
//!
//! The crate is split by concern: `identity`, `controller` and `node` are the thin gRPC faces
//! (validate → call the domain → map errors); `volume` holds the domain (ids, records, the
//! crash-safe store, per-volume operation guards, create/publish/delete); `host` holds the
//! mechanics that know nothing about gRPC (mounts, loop devices, safe deletion, usage).

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
