//! NodeExpandVolume: growing a volume while it may be published.
//!
//! The pool must be able to promise the growth (RESOURCE_EXHAUSTED otherwise). A filesystem
//! volume's quota or qgroup is raised; a block volume's file grows (sparsely, or fallocated when
//! thick) and every loop device over it is told its new size; an image volume's file grows the
//! same way, then its filesystem, in place if it is staged (else when it is next staged). The host changes before the
//! record does, and each step is idempotent, so a crash in between is finished by kubelet's
//! retry. Shrinking is refused.

use tracing::info;

use std::path::Path;

use super::Volumes;
use super::devices;
use super::space::capacity;
use super::space::limits;
use super::space::limits::size_file;
use super::state::id::VolumeId;
use super::state::record::{Allocation, VolumeKind, VolumeRecord};
use crate::error::{Error, IoContext, Result};
use crate::host::loopdev;

impl Volumes {
    /// Grows volume `id` to the size `required`/`limit` asks for; returns its capacity.
    /// `kind` is the access type the caller believes the volume has, if it said.
    pub fn expand(
        &self,
        id: &VolumeId,
        kind: Option<VolumeKind>,
        required: i64,
        limit: i64,
    ) -> Result<i64> {
        let _guard = self.claim(id)?;
        let record = self.get(id)?;
        if kind.is_some_and(|kind| !record.kind.serves(kind)) {
            return Err(Error::InvalidArgument(format!(
                "volume {id} is a {} volume; the capability given is not",
                record.kind.as_str()
            )));
        }
        let current = record.capacity_bytes;
        if limit != 0 && limit < current {
            return Err(Error::OutOfRange(format!(
                "volume {id} has {current} bytes, more than limit_bytes {limit}: volumes cannot shrink"
            )));
        }
        if required <= current {
            return Ok(current); // already that big: a retry, or nothing to do
        }
        let wanted = capacity::choose(required, limit)?;
        let pool = self.pool_of(&record)?;
        let path = pool.data_path(id, record.kind);
        if already_grown(&record, &path, wanted as u64) {
            // A retry after a crash between growing and recording: the space is already
            // taken on the host, so the promise follows without a second check.
            pool.restore(id, wanted as u64);
        } else {
            self.reserve(
                pool,
                id.into(),
                wanted as u64,
                &format!("growing volume {id}"),
            )?;
        }
        let grown = match record.kind {
            VolumeKind::Filesystem => limits::resize(record.size_limit, &path, wanted as u64)
                .context(|| format!("raising the size limit of volume {id} to {wanted} bytes")),
            VolumeKind::Block => grow_file(id, &path, record.allocation, wanted as u64)
                .and_then(|()| self.resize_encrypted(&record)),
            // The file first, then the filesystem in it, while pods may use it.
            VolumeKind::Image(fs) => grow_file(id, &path, record.allocation, wanted as u64)
                .and_then(|()| self.grow_staged(&record, fs)),
        };
        if let Err(err) = grown {
            // Back to the promise the record still states.
            pool.restore(id, current as u64);
            return Err(err);
        }
        if record.fully_allocated() {
            pool.set_used(id, wanted as u64);
        }
        let mut updated = (*record).clone();
        updated.capacity_bytes = wanted;
        // As large as asked now.
        updated.asked_bytes = None;
        self.store
            .put(updated)
            .context(|| format!("recording the new size of volume {id}"))?;
        info!(volume = %id, from = current, to = wanted, "expanded volume");
        Ok(wanted)
    }
}

/// Whether the host already gives the volume `bytes` (its file's size, or its limit).
fn already_grown(record: &VolumeRecord, path: &Path, bytes: u64) -> bool {
    match record.kind {
        VolumeKind::Block | VolumeKind::Image(_) => {
            std::fs::metadata(path).is_ok_and(|m| m.len() >= bytes)
        }
        VolumeKind::Filesystem => limits::usage(record.size_limit, path)
            .ok()
            .flatten()
            .and_then(|usage| usage.limit_bytes)
            .is_some_and(|limit| limit >= bytes),
    }
}

/// Grows a block volume's file to `bytes` and tells every loop device over it.
fn grow_file(id: &VolumeId, path: &Path, allocation: Allocation, bytes: u64) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .context(|| format!("opening {}", path.display()))?;
    let size = file
        .metadata()
        .context(|| format!("inspecting {}", path.display()))?
        .len();
    // Thick files are fallocated again even at the right size: a crash may have left the
    // size set but not every block allocated (fallocate of allocated blocks is cheap).
    if size < bytes || allocation == Allocation::Thick {
        size_file(&file, path, allocation, bytes)?;
        file.sync_all()
            .context(|| format!("syncing {}", path.display()))?;
    }
    let devices =
        devices::serving(path).context(|| format!("looking for loop devices of volume {id}"))?;
    for device in devices {
        loopdev::refresh_capacity(&device).context(|| {
            format!(
                "telling {} about the new size of volume {id}",
                device.path().display()
            )
        })?;
    }
    Ok(())
}
