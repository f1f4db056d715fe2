//! Host mechanics with no knowledge of gRPC or CSI: each module does one thing to the kernel.

pub mod btrfs;
pub mod copy;
pub mod fsstat;
pub mod loopdev;
pub mod mount;
pub mod mountinfo;
pub mod projquota;
pub mod safe_delete;
pub mod tree;
pub mod usage;
