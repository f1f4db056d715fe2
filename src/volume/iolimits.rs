//! IO limits of block and image volumes (a VolumeAttributesClass's `readIOPS`, `writeIOPS`,
//! `readBytesPerSecond`, `writeBytesPerSecond`), and changes of what such a class sets
//! (`modify`, `onOverflow` too): set on the volume's loop device in the cgroup of
//! every pod it is published to, when it is published, when its limits change, and again when
//! the driver starts (a restarted driver finds the pods it published to still running; after a
//! node reboot the pods are published again).
//!
//! The pod is the one kubelet's target path names (`inventory::pod_uid_of`), found by that uid
//! among kubelet's cgroups (`host::blkio`), never by a name. A limit that cannot be set fails
//! the publish: a pod must not run unlimited on a volume its class limits.

use std::path::PathBuf;

use std::sync::Arc;

use tracing::{debug, info, warn};

use super::Volumes;
use super::encryption;
use super::inventory::pod_uid_of;
use super::state::id::VolumeId;
use super::state::record::{Publication, VolumeKind, VolumeRecord};
use crate::class::{IoLimits, Mutable};
use crate::error::{Error, IoContext, Result};
use crate::host::blkio::{self, DeviceNumber, Hierarchy, IoMax};

/// Where the host's cgroup filesystem is when no one says (`--cgroup-root`).
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

impl Volumes {
    /// Where the host's cgroup filesystem is mounted in this process's view.
    pub fn set_cgroup_root(&mut self, root: PathBuf) {
        self.cgroup_root = root;
    }

    /// Gives volume `id` what its VolumeAttributesClass now says (ControllerModifyVolume, on
    /// the node): kept in its record first, then the IO limits set for every pod it is published
    /// to. A pod whose limits could not be set is an error, and the call is retried; the record
    /// already holds the new values.
    pub fn modify(&self, id: &VolumeId, wanted: Mutable) -> Result<()> {
        let _guard = self.claim(id)?;
        let record = self.get(id)?;
        if record.kind == VolumeKind::Filesystem && !wanted.io.is_unlimited() {
            return Err(Error::InvalidArgument(format!(
                "volume {id} is a directory volume: IO limits ({}) apply to block and image volumes, whose device is their own",
                wanted.io.describe()
            )));
        }
        let limits_before = record.io_limits;
        if (record.io_limits, record.on_overflow) != (wanted.io, wanted.on_overflow) {
            let mut updated = (*record).clone();
            updated.io_limits = wanted.io;
            updated.on_overflow = wanted.on_overflow;
            self.store
                .put(updated)
                .context(|| format!("recording the mutable parameters of volume {id}"))?;
            info!(volume = %id, parameters = %wanted.describe(), "mutable parameters changed");
        }
        if wanted.io.is_unlimited() && limits_before.is_unlimited() {
            return Ok(());
        }
        let record = self.get(id)?;
        for publication in record.pod_publications() {
            if self.is_live(&record, publication)? {
                // Set even when there are none now: that lifts the ones set before.
                self.set_pod_io(&record, publication)?;
            }
        }
        Ok(())
    }

    /// At publish: `record`'s limits, if it has any, for the pod `publication` is for.
    pub(super) fn limit_pod_io(
        &self,
        record: &VolumeRecord,
        publication: &Publication,
    ) -> Result<()> {
        match record.io_limits.is_unlimited() {
            true => Ok(()),
            false => self.set_pod_io(record, publication),
        }
    }

    /// Sets `record`'s limits (none lifts them) for the pod `publication` is for.
    fn set_pod_io(&self, record: &VolumeRecord, publication: &Publication) -> Result<()> {
        let Some(device) = device_of(record, publication) else {
            return Ok(());
        };
        let target = &publication.target;
        let uid = pod_uid_of(target, &self.kubelet_dir).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "the IO limits of volume {} need the pod, and the target {} names none in kubelet's layout",
                record.id,
                target.display()
            ))
        })?;
        if let Some(pod) = publication.pod.as_ref().filter(|pod| pod.uid != uid) {
            return Err(Error::InvalidArgument(format!(
                "the target {} is pod {uid}'s, and the pod info says {}",
                target.display(),
                pod.uid
            )));
        }
        let cgroup = blkio::find_pod(&self.cgroup_root, &uid)
            .map_err(|err| self.cgroup_error(&record.id, &uid, err.to_string()))?
            .ok_or_else(|| self.cgroup_error(&record.id, &uid, "it has none (yet)".into()))?;
        let number = blkio::device_number(&device)
            .context(|| format!("reading the device number of {device}"))?;
        blkio::set_limits(&cgroup, number, &io_max(&record.io_limits))
            .map_err(|err| self.cgroup_error(&record.id, &uid, err.to_string()))?;
        debug!(volume = %record.id, pod = %uid, device = %device, limits = %record.io_limits.describe(), "IO limits set");
        Ok(())
    }

    /// At start: every live publication of a volume with limits gets them again (a restart
    /// may have come between a change of limits and setting them).
    pub fn reapply_io_limits(&self) {
        for (record, publication, err) in self.set_all_again() {
            warn!(volume = %record.id, target = %publication.target.display(), error = %err, "IO limits not set again at start");
        }
    }

    /// Every few seconds under cgroup v1: the limits set again on every pod using a limited
    /// volume, so that its containers' cgroups, which kubelet makes after the publish and which
    /// v1's throttling does not reach from the pod's, get them (`blkio::set_limits`). Nothing
    /// under v2, where the pod's limit holds for its containers.
    pub fn keep_io_limits(&self) {
        if !matches!(
            blkio::io_hierarchy(&self.cgroup_root),
            Some((Hierarchy::V1, _))
        ) {
            return;
        }
        for (record, publication, err) in self.set_all_again() {
            // A pod going away while it is looked at: said once it is worth saying.
            debug!(volume = %record.id, target = %publication.target.display(), error = %err, "IO limits not kept");
        }
    }

    /// Sets the limits again for every live publication of a limited volume; what failed.
    fn set_all_again(&self) -> Vec<(Arc<VolumeRecord>, Publication, Error)> {
        let mut failed = Vec::new();
        for record in self.store.all() {
            if record.io_limits.is_unlimited() {
                continue;
            }
            for publication in record.pod_publications() {
                if !self.is_live(&record, publication).unwrap_or(false) {
                    continue;
                }
                if let Err(err) = self.set_pod_io(&record, publication) {
                    failed.push((record.clone(), publication.clone(), err));
                }
            }
        }
        failed
    }

    /// Not there yet (kubelet makes a pod's cgroup before its volumes, but a retry is cheap) or
    /// not writable: the publish or the change is retried.
    fn cgroup_error(&self, id: &VolumeId, uid: &str, why: String) -> Error {
        Error::FailedPrecondition(format!(
            "the IO limits of volume {id} cannot be set in pod {uid}'s cgroup under {}: {why}",
            self.cgroup_root.display()
        ))
    }
}

/// The device whose IO `publication`'s pod does: its loop device (block), the staged one
/// (image), or the encrypted volume's mapping over it; none for a directory volume.
fn device_of(record: &VolumeRecord, publication: &Publication) -> Option<String> {
    let loop_device = match record.kind {
        VolumeKind::Filesystem => None,
        VolumeKind::Block => publication.loop_device.as_deref(),
        VolumeKind::Image(_) => record.staging().and_then(|s| s.loop_device.as_deref()),
    }?;
    encryption::top_device_name(record, loop_device)
}

/// The host's form of a volume's limits.
pub fn io_max(limits: &IoLimits) -> IoMax {
    IoMax {
        read_iops: limits.read_iops,
        write_iops: limits.write_iops,
        read_bytes_per_second: limits.read_bytes_per_second,
        write_bytes_per_second: limits.write_bytes_per_second,
    }
}

/// The number of device `name`, for tests that read the limits back.
pub fn device_number(name: &str) -> std::io::Result<DeviceNumber> {
    blkio::device_number(name)
}
