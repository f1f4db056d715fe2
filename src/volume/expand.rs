//! NodeExpandVolume: growing a volume while it may be published.
//!
//! Sizes of filesystem volumes are not enforced yet, so growing one records the new size (which
//! stats and capacity accounting then use). A block volume's file grows (sparsely) and every
//! loop device over it is told its new size. The file grows before the record changes, so a
//! crash in between is finished by kubelet's retry. Shrinking is refused.

use tracing::info;

use super::Volumes;
use super::capacity;
use super::devices;
use super::id::VolumeId;
use super::record::VolumeKind;
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
        if kind.is_some_and(|kind| kind != record.kind) {
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
        let growth = (wanted - current) as u64;
        let available = self.space()?.available_bytes;
        if growth > available {
            return Err(Error::ResourceExhausted(format!(
                "growing volume {id} by {growth} bytes needs more than the {available} bytes free"
            )));
        }
        if record.kind == VolumeKind::Block {
            let path = self.layout.data_path(id, record.kind);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .context(|| format!("opening {}", path.display()))?;
            if file.metadata().map(|m| m.len()).unwrap_or(0) < wanted as u64 {
                file.set_len(wanted as u64)
                    .and_then(|()| file.sync_all())
                    .context(|| format!("growing {} to {wanted} bytes", path.display()))?;
            }
            let devices = devices::serving(id)
                .context(|| format!("looking for loop devices of volume {id}"))?;
            for device in devices {
                loopdev::refresh_capacity(&device).context(|| {
                    format!(
                        "telling {} about the new size of volume {id}",
                        device.path().display()
                    )
                })?;
            }
        }
        let mut updated = (*record).clone();
        updated.capacity_bytes = wanted;
        self.store
            .put(updated)
            .context(|| format!("recording the new size of volume {id}"))?;
        info!(volume = %id, from = current, to = wanted, "expanded volume");
        Ok(wanted)
    }
}
