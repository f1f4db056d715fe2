//! How a pool copies volume data cheaply, chosen once from its filesystem (the copying itself
//! is `copies::cow`'s).

use serde::{Deserialize, Serialize};

use crate::host::copy::DataMode;
use crate::host::fsstat::FsKind;

/// What a pool uses for filesystem volumes (block volumes use reflink or copy alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    BtrfsSnapshot,
    Reflink,
    Copy,
}

impl Mechanism {
    /// `subvolumes`: the pool makes filesystem volumes as btrfs subvolumes; `reflink`: its
    /// filesystem answered FICLONE.
    pub fn choose(kind: FsKind, subvolumes: bool, reflink: bool) -> Mechanism {
        match (kind, subvolumes, reflink) {
            (FsKind::Btrfs, true, _) => Mechanism::BtrfsSnapshot,
            (_, _, true) => Mechanism::Reflink,
            _ => Mechanism::Copy,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Mechanism::BtrfsSnapshot => "btrfs snapshots (O(1), crash-consistent)",
            Mechanism::Reflink => "reflink copies (shared extents, file by file)",
            Mechanism::Copy => "full copies (file by file)",
        }
    }

    /// How file data is carried when a tree or file is copied.
    pub fn data_mode(self) -> DataMode {
        match self {
            Mechanism::Copy => DataMode::Copy,
            Mechanism::BtrfsSnapshot | Mechanism::Reflink => DataMode::Reflink,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btrfs_snapshots_need_subvolume_volumes() {
        assert_eq!(
            Mechanism::choose(FsKind::Btrfs, true, true),
            Mechanism::BtrfsSnapshot
        );
        assert_eq!(
            Mechanism::choose(FsKind::Btrfs, false, true),
            Mechanism::Reflink
        );
        assert_eq!(
            Mechanism::choose(FsKind::Xfs, false, true),
            Mechanism::Reflink
        );
        assert_eq!(
            Mechanism::choose(FsKind::Ext4, false, false),
            Mechanism::Copy
        );
    }
}
