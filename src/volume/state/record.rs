//! What we remember about each volume: one small JSON record per volume.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::id::{SnapshotId, VolumeId};
use crate::class::{IoLimits, OnOverflow};
pub use crate::host::fsimage::FsType;
use crate::host::fsstat::FileId;

/// Directory volumes are bind-mounted; block volumes are files exposed through a loop device;
/// image volumes are files holding a filesystem of their own, mounted through a loop device
/// once per node (NodeStageVolume) and bind-mounted into each pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeKind {
    Filesystem,
    Block,
    Image(FsType),
}

impl VolumeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeKind::Filesystem => "filesystem",
            VolumeKind::Block => "block",
            VolumeKind::Image(FsType::Ext4) => "image-ext4",
            VolumeKind::Image(FsType::Xfs) => "image-xfs",
        }
    }

    /// Whether the data is one file (block and image volumes) rather than a directory tree.
    pub fn is_file(self) -> bool {
        self != VolumeKind::Filesystem
    }

    /// Whether a volume of this kind can be used as `asked` says: the same kind, or a mount
    /// capability that names no filesystem for an image volume (it has its own).
    pub fn serves(self, asked: VolumeKind) -> bool {
        self == asked || (asked == VolumeKind::Filesystem && self.image_fs().is_some())
    }

    /// The filesystem an image volume holds.
    pub fn image_fs(self) -> Option<FsType> {
        match self {
            VolumeKind::Image(fs) => Some(fs),
            _ => None,
        }
    }
}

/// How a block volume's file holds its space: the class's `blockAllocation`, kept.
pub use crate::class::Allocation;

/// What keeps a volume within its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum SizeLimit {
    /// Nothing: a plain directory, usage measured but not limited.
    #[default]
    None,
    /// A block volume: the file's size is the device's size.
    File,
    /// The volume is a btrfs subvolume whose qgroup is limited to the volume's size.
    BtrfsQgroup,
    /// The directory carries an XFS/ext4 project id whose quota is the volume's size.
    ProjectQuota { project_id: u32 },
}

impl SizeLimit {
    pub fn is_enforced(self) -> bool {
        self != SizeLimit::None
    }
}

/// CSI access modes, as stored in records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
}

impl AccessMode {
    /// Modes that never allow writing: their publications are always read-only.
    pub fn is_read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }

    /// Modes Kubernetes uses for ReadWriteMany / ReadOnlyMany claims. Served only by volumes of
    /// a class with `sharedAccess: "true"`: every pod sharing one runs on its node.
    pub fn is_multi_node(self) -> bool {
        matches!(
            self,
            AccessMode::MultiNodeReaderOnly
                | AccessMode::MultiNodeSingleWriter
                | AccessMode::MultiNodeMultiWriter
        )
    }

    /// Modes that allow a single writer workload only (Kubernetes ReadWriteOncePod).
    pub fn is_single_writer(self) -> bool {
        self == AccessMode::SingleNodeSingleWriter
    }
}

/// One place a volume is published on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub target: PathBuf,
    pub readonly: bool,
    pub access_mode: AccessMode,
    /// Sorted and deduplicated bind-mount flags (filesystem volumes only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
    /// The loop device behind the target symlink (block volumes only), e.g. "loop7".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_device: Option<String>,
    /// The identity of the file that device was attached to: it still tells our device from
    /// another node's after the file was deleted (see `devices`). None in records of earlier
    /// versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_backing_file: Option<FileId>,
    /// The node's one mount of an image volume (NodeStageVolume), which the pods' targets
    /// are bind mounts of; its loop device is `loop_device`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub staging: bool,
    /// The pod it was published for, where kubelet said (CSIDriver `podInfoOnMount`): whom an
    /// overflowing volume's eviction concerns. None in records of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A pod as NodePublishVolume's volume_context names it (validated by `request::pod_info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Publication {
    /// Same target asked again with the same capability: an idempotent retry.
    pub fn same_request(&self, other: &Publication) -> bool {
        self.target == other.target
            && self.readonly == other.readonly
            && self.access_mode == other.access_mode
            && self.mount_flags == other.mount_flags
            && self.staging == other.staging
    }
}

/// What a volume was made from, when it did not start empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "id")]
pub enum ContentSource {
    /// Restored from a snapshot.
    Snapshot(SnapshotId),
    /// Cloned from another volume.
    Volume(VolumeId),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: VolumeId,
    /// The CO's idempotency key (the PV name under Kubernetes).
    pub name: String,
    pub kind: VolumeKind,
    pub capacity_bytes: i64,
    /// The capacity the CO asked, when a floor made the volume larger (an image's filesystem
    /// minimum, or the size of the snapshot it was restored from): its copies may ask as
    /// little again. None when the volume is as large as asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_bytes: Option<i64>,
    /// The pool holding the data (records from before pools existed are in the default pool).
    #[serde(default = "default_pool")]
    pub pool: String,
    #[serde(default)]
    pub size_limit: SizeLimit,
    /// Block and image volumes only.
    #[serde(default, skip_serializing_if = "is_thin")]
    pub allocation: Allocation,
    /// Access modes asked for at creation, sorted and deduplicated.
    pub access_modes: Vec<AccessMode>,
    /// Mount flags asked for at creation (filesystem volumes), sorted and deduplicated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_flags: Vec<String>,
    /// StorageClass parameters as given at creation.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    pub created_unix_ms: u64,
    /// The snapshot or volume whose data the volume started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_source: Option<ContentSource>,
    /// An admin import is writing the data: if the driver stops before it finishes, the next
    /// start empties the volume instead of leaving it half-written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub importing: bool,
    /// An image volume filled by an import: its filesystem is checked by its own checker
    /// before its first stage (the kernel never mounts bytes from a stream unchecked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unchecked: bool,
    /// Its PV was found gone: the data was moved to lost+found (see `volume::orphan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphaned: Option<Orphaned>,
    /// Its mounts were made read-only for a reason of its tenant's making (see `volume::fence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<Fenced>,
    /// IO limits on its device for every pod that uses it (block and image volumes; see
    /// `volume::iolimits`), from its VolumeAttributesClass.
    #[serde(default, skip_serializing_if = "IoLimits::is_unlimited")]
    pub io_limits: IoLimits,
    /// `onOverflow` from its VolumeAttributesClass, in place of its StorageClass's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_overflow: Option<OnOverflow>,
    /// Encrypted at rest (image and block volumes; see `volume::encryption`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Luks>,
    /// Kept in a file of its own by the store (records of older versions carry them inline).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publications: Vec<Publication>,
}

/// An encrypted volume's LUKS2 layer between its file and its filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Luks {
    /// Its header and the filesystem inside are made. CreateVolume has no key (it comes with
    /// NodeStageVolume, from the node-stage Secret), so the first stage makes them.
    pub formatted: bool,
}

/// A volume fenced read-only: since when, what made it so, and the sentence that said why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    pub since_unix_ms: u64,
    pub cause: FenceCause,
    pub why: String,
}

/// What fenced a volume, and so what lifts the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceCause {
    /// Above its size (or unmeasurable) past the overflow check's grace, its pods not evicted:
    /// lifted when measured within its size.
    Overflow,
    /// Its project-id audit could not finish: lifted when one does.
    Audit,
}

/// A volume whose PV was found gone: where its data went, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphaned {
    pub since_unix_ms: u64,
    /// The PV the record named, found absent (or naming another volume).
    pub pv_name: String,
    /// Where the data is now, in its pool's lost+found.
    pub lost_path: PathBuf,
}

fn default_pool() -> String {
    crate::config::DEFAULT_POOL.to_string()
}

fn is_thin(allocation: &Allocation) -> bool {
    *allocation == Allocation::Thin
}

impl VolumeRecord {
    /// The record as stored durably: everything but the publications.
    pub fn without_publications(&self) -> VolumeRecord {
        VolumeRecord {
            publications: Vec::new(),
            ..self.clone()
        }
    }

    /// A thick block file: every byte of its size is allocated.
    pub fn fully_allocated(&self) -> bool {
        self.kind.is_file() && self.allocation == Allocation::Thick
    }

    /// Created for a multi-node access mode (a class with `sharedAccess: "true"`), so pods may
    /// publish it with one.
    pub fn is_shared(&self) -> bool {
        self.access_modes.iter().any(|m| m.is_multi_node())
    }

    pub fn publication(&self, target: &std::path::Path) -> Option<&Publication> {
        self.publications.iter().find(|p| p.target == target)
    }

    /// Where an image volume is staged on this node, as recorded (the host may disagree).
    pub fn staging(&self) -> Option<&Publication> {
        self.publications.iter().find(|p| p.staging)
    }

    /// The pods' publications, without the staging mount.
    pub fn pod_publications(&self) -> impl Iterator<Item = &Publication> {
        self.publications.iter().filter(|p| !p.staging)
    }
}

/// Milliseconds since the epoch, for records.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publications_of_earlier_versions_read_without_a_pod_and_new_ones_keep_theirs() {
        let earlier = r#"[{"target":"/k/pods/u/volumes/x/mount","readonly":false,"access_mode":"SINGLE_NODE_WRITER"}]"#;
        let read: Vec<Publication> = serde_json::from_str(earlier).unwrap();
        assert_eq!(read[0].pod, None);
        assert_eq!(
            serde_json::to_string(&read).unwrap(),
            earlier,
            "written back as before: no pod key"
        );
        let mut with_pod = read[0].clone();
        with_pod.pod = Some(PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "0f6c1a52-1b7e-4c54-9d7e-2c1f3e0b9a11".into(),
        });
        let text = serde_json::to_string(&with_pod).unwrap();
        assert_eq!(
            serde_json::from_str::<Publication>(&text).unwrap(),
            with_pod
        );
    }
}
