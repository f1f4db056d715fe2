//! Host mechanics with no knowledge of gRPC or CSI: each module does one thing to the kernel.

pub mod archive;
pub mod blkio;
pub mod btrfs;
pub mod caller;
pub mod cgroup;
pub mod copy;
pub mod crypt;
pub mod dirfd;
pub mod fsimage;
pub mod fsstat;
pub mod links;
pub mod loopdev;
mod meta;
pub mod mount;
pub mod mountinfo;
pub mod nsmounts;
pub mod projquota;
pub mod projtree;
pub mod safe_delete;
pub mod tree;
pub mod usage;
