//! Where a restored or cloned volume's data comes from: a snapshot of this node, or another
//! volume of this node, held against deletion while it is copied.

use std::path::PathBuf;
use std::sync::Arc;

use super::in_flight::CopyKind;
use crate::error::{Error, Result};
use crate::volume::Volumes;
use crate::volume::guard::OperationGuard;
use crate::volume::space::capacity;
use crate::volume::state::record::{ContentSource, Luks, VolumeKind, VolumeRecord};

/// A source found and claimed for the length of one create.
#[derive(Debug)]
pub(in crate::volume) struct SourceData {
    pub path: PathBuf,
    pub kind: VolumeKind,
    /// The source's size: the smallest volume its data fits in.
    pub size_bytes: i64,
    /// The least a copy may ask (what the source's CO asked; see `VolumeRecord::asked_bytes`).
    pub least_asked_bytes: i64,
    /// A clone's source volume (a staged image is frozen while it is copied).
    pub volume: Option<Arc<VolumeRecord>>,
    /// The source's encryption: its copy is ciphertext under the same header.
    pub encryption: Option<Luks>,
    _claimed: OperationGuard,
}

impl Volumes {
    /// Finds `source` and claims it for reading (other restores and clones of it may run at
    /// the same time), so it cannot be deleted while it is copied.
    pub(in crate::volume) fn claim_source(&self, source: &ContentSource) -> Result<SourceData> {
        match source {
            ContentSource::Snapshot(id) => {
                let record = self.snapshot_source(id)?;
                if !record.ready {
                    return Err(Error::Pending(format!(
                        "snapshot {id} (its data is still being copied)"
                    )));
                }
                let claimed = self.claim_snapshot_reading(id)?;
                let pool = self.pool(&record.pool)?;
                Ok(SourceData {
                    path: pool.snapshot_path(id, record.kind),
                    kind: record.kind,
                    size_bytes: record.size_bytes,
                    least_asked_bytes: record.restorable_from_bytes(),
                    volume: None,
                    encryption: record.encryption,
                    _claimed: claimed,
                })
            }
            ContentSource::Volume(id) => {
                let record = self
                    .store
                    .get(id)
                    .ok_or_else(|| self.missing_source(&format!("volume {id}"), id.issuer()))?;
                let claimed = self.claim_reading(id)?;
                Ok(SourceData {
                    path: self.data_path(&record)?,
                    kind: record.kind,
                    size_bytes: record.capacity_bytes,
                    least_asked_bytes: record.asked_bytes.unwrap_or(record.capacity_bytes),
                    encryption: record.encryption,
                    volume: Some(record.clone()),
                    _claimed: claimed,
                })
            }
        }
    }
}

impl SourceData {
    /// What filling a volume from this source is called in the metrics.
    pub fn copy_kind(&self) -> CopyKind {
        match self.volume {
            Some(_) => CopyKind::Clone,
            None => CopyKind::Restore,
        }
    }

    /// The new volume's capacity: as asked, at least the source's size, the source's size
    /// when nothing is asked. OUT_OF_RANGE when the range allows only less than the source's
    /// data, or asks less than its source's CO asked (a source the filesystem's minimum made
    /// larger than asked is copied whole into a volume asked as small).
    pub fn capacity(&self, required: i64, limit: i64) -> Result<i64> {
        let size = self.size_bytes;
        if (required > 0 && required < self.least_asked_bytes) || (limit > 0 && limit < size) {
            return Err(Error::OutOfRange(format!(
                "the requested capacity (required_bytes {required}, limit_bytes {limit}) is smaller than the source's {size} bytes"
            )));
        }
        capacity::choose(required.max(size), limit)
    }

    /// A volume of `kind`, encrypted or not, can only start from data of the same kind and
    /// the same encryption: ciphertext is no filesystem, and plaintext no LUKS device.
    pub fn check_kind(
        &self,
        kind: VolumeKind,
        encrypted: bool,
        source: &ContentSource,
    ) -> Result<()> {
        let what = match source {
            ContentSource::Snapshot(id) => format!("snapshot {id}"),
            ContentSource::Volume(id) => format!("volume {id}"),
        };
        if self.encryption.is_some() != encrypted {
            let (is, class) = match encrypted {
                true => ("is not", "an encrypted"),
                false => ("is", "an unencrypted"),
            };
            return Err(Error::InvalidArgument(format!(
                "{what} {is} encrypted, so it cannot become {class} volume: restore or clone it with a StorageClass whose encryption parameter matches its source's"
            )));
        }
        if self.kind == kind {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{what} holds a {} volume; it cannot become a {} volume",
            self.kind.as_str(),
            kind.as_str()
        )))
    }
}
