//! One requested way of using a volume (CSI's VolumeCapability, validated): block or
//! filesystem, an access mode, bind-mount flags; and which of them a volume can serve.

use sys_mount::MountFlags;

use crate::class::PARAM_SHARED_ACCESS;
use crate::host::mount;
use crate::volume::state::record::{AccessMode, VolumeKind};

/// One requested way of using a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub kind: VolumeKind,
    pub access_mode: AccessMode,
    /// Sorted, deduplicated mount options (filesystem only), each one a bind mount can honour.
    pub mount_flags: Vec<String>,
}

impl Capability {
    /// The per-mount flags to apply for this capability.
    pub fn bind_flags(&self, readonly: bool) -> MountFlags {
        let mut flags = self
            .mount_flags
            .iter()
            .filter_map(|option| mount::bind_flag(option))
            .fold(MountFlags::empty(), |acc, flag| acc | flag);
        if readonly {
            flags |= MountFlags::RDONLY;
        }
        flags
    }

    /// Why this capability cannot be served, or None when it can. Multi-node modes
    /// (ReadWriteMany, ReadOnlyMany) need `shared`: a class with `sharedAccess: "true"`, or a
    /// volume made by one.
    pub fn unsupported_reason(&self, shared: bool) -> Option<String> {
        (self.access_mode.is_multi_node() && !shared).then(|| {
            format!(
                "access mode {:?} needs a StorageClass with {PARAM_SHARED_ACCESS}: \"true\" (the volume stays on one node, and every pod using it runs there)",
                self.access_mode
            )
        })
    }
}
