//! Encrypted block volumes (StorageClass `encryption: luks2`, a Block claim): the pod's device
//! is the volume's LUKS2 mapping (`/dev/mapper/stickyvol-<id>`), never its loop device, so the
//! pod reads and writes plaintext while the file holds ciphertext.
//!
//! A plain block volume stages nothing; an encrypted one must, since only NodeStageVolume has
//! the key: the stage attaches the file (one read-write loop device), formats the header the
//! first time, opens the mapping and records both as the staging publication; each publish
//! links the pod's target to the mapping; the unstage closes the mapping (the key leaves the
//! kernel) and detaches the file. Pods get the device read-write only: a read-only publication
//! would need a second, read-only mapping, which is not offered.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::Volumes;
use super::devices;
use super::encryption::{filesystem_device, mapping_name};
use super::image::StageRequest;
use super::publish::missing_data;
use super::state::record::{Luks, Publication, VolumeRecord};
use crate::error::{Error, IoContext, Result};
use crate::host::crypt;
use crate::host::fsstat::{self, Stat};
use crate::host::loopdev::{self, LoopDevice};

impl Volumes {
    /// NodeStageVolume of an encrypted block volume (its operation slot held by the caller).
    pub(super) fn stage_encrypted_block(
        &self,
        record: &VolumeRecord,
        req: &StageRequest,
    ) -> Result<()> {
        let id = &record.id;
        refuse_read_only(record, req.capability.access_mode.is_read_only())?;
        if let Some(staged) = record.staging()
            && self.is_live(record, staged)?
        {
            if staged.target == req.staging {
                return Ok(());
            }
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is already staged at {}",
                staged.target.display()
            )));
        }
        let data = self.data_path(record)?;
        let source = fsstat::lstat(&data).map_err(|err| missing_data(id, &data, err))?;
        if !source.is_regular_file() {
            return Err(Error::FailedPrecondition(format!(
                "data of volume {id} at {} is not a regular file",
                data.display()
            )));
        }
        let key = req.key.as_deref();
        let record = match record.encryption {
            Some(Luks { formatted: false }) => self.format_encrypted(record, None, &data, key)?,
            _ => Arc::new(record.clone()),
        };
        let device = loopdev::attach(&data, false)
            .context(|| format!("attaching a loop device to volume {id}"))?;
        let staged = self
            .open_encrypted(&record, &device, key, false)
            .and_then(|_| self.record_block_staging(&record, req, &device, &source));
        if let Err(err) = staged {
            let _ = self.close_encrypted(id);
            let _ = loopdev::detach(&device);
            return Err(err);
        }
        info!(volume = %id, staging = %req.staging.display(), device = %device.path().display(), "staged encrypted block volume");
        Ok(())
    }

    fn record_block_staging(
        &self,
        record: &VolumeRecord,
        req: &StageRequest,
        device: &LoopDevice,
        source: &Stat,
    ) -> Result<()> {
        let staged = Publication {
            target: req.staging.clone(),
            readonly: false,
            access_mode: req.capability.access_mode,
            mount_flags: Vec::new(),
            loop_device: Some(device.name().to_string()),
            loop_backing_file: Some(source.id()),
            staging: true,
            pod: None,
        };
        let mut updated = record.clone();
        updated
            .publications
            .retain(|p| !p.staging && p.target != staged.target);
        updated.publications.push(staged);
        self.store
            .put(updated)
            .context(|| format!("recording the staging of volume {}", record.id))
            .map(drop)
    }

    /// NodeUnstageVolume of an encrypted block volume: its mapping closed, its loop device
    /// detached; refused while a pod's target still links to it.
    pub(super) fn unstage_encrypted_block(
        &self,
        record: &VolumeRecord,
        staging: &Path,
    ) -> Result<()> {
        let id = &record.id;
        let pods = record
            .pod_publications()
            .filter(|p| self.is_live(record, p).unwrap_or(true))
            .map(|p| p.target.display().to_string())
            .collect::<Vec<_>>();
        if !pods.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is still published at {}; unpublish it first",
                pods.join(", ")
            )));
        }
        let Some(staged) = record.publication(staging).filter(|p| p.staging) else {
            return Ok(());
        };
        self.close_encrypted(id)?;
        let data = self.data_path(record)?;
        let device = staged
            .loop_device
            .as_deref()
            .and_then(LoopDevice::from_name)
            .filter(|device| devices::serves_publication(device, Some(staged), &data));
        if let Some(device) = device
            && let Err(err) = loopdev::detach(&device)
        {
            warn!(volume = %id, device = %device.path().display(), error = %err, "could not detach loop device; it is retried at next start");
        }
        let mut updated = record.clone();
        updated.publications.retain(|p| p.target != staging);
        if let Err(err) = self.store.put(updated) {
            warn!(volume = %id, error = %err, "unstaged, but could not update the record");
        }
        info!(volume = %id, staging = %staging.display(), "unstaged encrypted block volume");
        Ok(())
    }

    /// A pod's publication of an encrypted block volume: its target linked to the staged
    /// mapping, recorded with the staging's loop device (which then stays while it is used).
    pub(super) fn publish_encrypted_block(
        &self,
        record: &VolumeRecord,
        mut wanted: Publication,
    ) -> Result<(Publication, PathBuf)> {
        let id = &record.id;
        refuse_read_only(record, wanted.readonly)?;
        let staged = record
            .staging()
            .filter(|staged| self.is_live(record, staged).unwrap_or(false))
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "volume {id} is encrypted and not staged on this node (NodeStageVolume, with its key, first)"
                ))
            })?;
        wanted.loop_device = staged.loop_device.clone();
        wanted.loop_backing_file = staged.loop_backing_file;
        Ok((wanted, crypt::mapper_path(&mapping_name(id))))
    }

    /// Whether `publication` of encrypted block volume `record` is in place: the mapping open
    /// over its loop device, which serves the volume's file, and (a pod's) its target a link to
    /// the mapping.
    pub(super) fn encrypted_block_is_live(
        &self,
        record: &VolumeRecord,
        publication: &Publication,
        target: &Stat,
        data: &Path,
    ) -> bool {
        let Some(device) = publication
            .loop_device
            .as_deref()
            .and_then(LoopDevice::from_name)
        else {
            return false;
        };
        let open = devices::serves_publication(&device, Some(publication), data)
            && filesystem_device(record, &device).is_some();
        if publication.staging {
            return open;
        }
        let mapper = crypt::mapper_path(&mapping_name(&record.id));
        open && target.is_symlink() && std::fs::read_link(&publication.target).ok() == Some(mapper)
    }
}

fn refuse_read_only(record: &VolumeRecord, readonly: bool) -> Result<()> {
    if !readonly {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "volume {} is an encrypted block volume, which pods use read-write only (a read-only one would need a second mapping of its own)",
        record.id
    )))
}
