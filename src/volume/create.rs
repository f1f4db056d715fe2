//! CreateVolume and DeleteVolume.
//!
//! Crash safety: the data (directory or sparse file) is made under a staging name
//! (`volumes/.creating-<id>`), then the record is written: the commit point. Only then does the
//! data move to its final name. A crash before the commit leaves staging data without a record,
//! which `recover` removes; a crash after it leaves a record with staging data, which a retried
//! CreateVolume or the next start moves into place. So a volume is either absent or complete,
//! and data under a final name without a record never comes from us (see `recover`). Deletion
//! runs the other way: data first, record last, so a retried DeleteVolume finishes the job.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use super::capacity;
use super::devices;
use super::id::VolumeId;
use super::record::{AccessMode, VolumeKind, VolumeRecord};
use super::store::sync_dir;
use super::{Volumes, set_mode, walk_failure};
use crate::error::{Error, IoContext, Result};
use crate::host::{fsstat, loopdev, mountinfo, safe_delete};

/// A validated CreateVolume request.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub name: String,
    pub required_bytes: i64,
    pub limit_bytes: i64,
    pub kind: VolumeKind,
    /// Sorted and deduplicated.
    pub access_modes: Vec<AccessMode>,
    /// Sorted and deduplicated.
    pub mount_flags: Vec<String>,
    pub parameters: BTreeMap<String, String>,
}

impl Volumes {
    /// Creates the volume named `req.name`, or returns the existing one if it is compatible.
    pub fn create(&self, req: CreateRequest) -> Result<Arc<VolumeRecord>> {
        let _guard = self.guards.acquire(
            format!("name:{}", req.name),
            &format!("volume name {:?}", req.name),
        )?;
        let capacity = capacity::choose(req.required_bytes, req.limit_bytes)?;
        if let Some(existing) = self.store.find_by_name(&req.name) {
            check_compatible(&existing, &req)?;
            // Not while a DeleteVolume of it runs: answering with a volume being torn down
            // would hand the CO an id that is about to vanish.
            let _busy = self.claim(&existing.id)?;
            if self.store.get(&existing.id).is_some() {
                self.finish_create(&existing)?;
                return Ok(existing);
            }
        }
        let available = self.space()?.available_bytes;
        if capacity as u64 > available {
            return Err(Error::ResourceExhausted(format!(
                "volume {:?} needs {capacity} bytes but the data directory has {available} bytes free",
                req.name
            )));
        }

        let id = VolumeId::generate();
        let staging = self.layout.staging_path(&id, req.kind);
        let path = self.layout.data_path(&id, req.kind);
        let made = make_data(&staging, req.kind, capacity).and_then(|()| {
            sync_dir(&self.layout.volumes)
                .context(|| format!("syncing {}", self.layout.volumes.display()))
        });
        let committed = made.and_then(|()| {
            let record = VolumeRecord {
                id: id.clone(),
                name: req.name.clone(),
                kind: req.kind,
                capacity_bytes: capacity,
                access_modes: req.access_modes,
                mount_flags: req.mount_flags,
                parameters: req.parameters,
                created_unix_ms: now_ms(),
                publications: Vec::new(),
            };
            self.store.put(record).map_err(|err| {
                // The rename may have happened before the failure (e.g. the directory fsync):
                // take the record back so no record points at data about to be removed.
                let _ = self.store.remove(&id);
                Error::host(format!("writing the record of volume {id}"), err)
            })
        });
        let record = match committed {
            Ok(record) => record,
            Err(err) => {
                if let Err(cleanup) = safe_delete::remove_all(&staging) {
                    warn!(volume = %id, error = %cleanup, "could not remove the data of a failed create; it is removed at next start");
                }
                return Err(err);
            }
        };
        // Committed: from here on the volume exists; moving the data in place is finished by a
        // retry or at the next start if this fails.
        self.finish_create(&record)?;
        info!(volume = %id, name = %record.name, kind = record.kind.as_str(), capacity, path = %path.display(), "created volume");
        Ok(record)
    }

    /// Moves a committed volume's data from its staging name to its final name, if not done yet.
    pub(super) fn finish_create(&self, record: &VolumeRecord) -> Result<()> {
        let staging = self.layout.staging_path(&record.id, record.kind);
        let path = self.layout.data_path(&record.id, record.kind);
        if fsstat::lstat_if_exists(&staging)
            .context(|| format!("inspecting {}", staging.display()))?
            .is_none()
        {
            return Ok(());
        }
        fs::rename(&staging, &path)
            .and_then(|()| sync_dir(&self.layout.volumes))
            .context(|| format!("moving {} into place", staging.display()))
    }

    /// Deletes a volume and its data. Unknown ids succeed (deletion is idempotent).
    pub fn delete(&self, id: &VolumeId) -> Result<()> {
        let _guard = self.claim(id)?;
        let Some(record) = self.store.get(id) else {
            if self.store.has_record_file(id) {
                return Err(Error::FailedPrecondition(format!(
                    "the record of volume {id} is unreadable; refusing to delete its data (see the log at startup)"
                )));
            }
            // Data without a record (a lost state directory, or an interrupted create): the CO
            // deletes the volume, so remove whatever carries its id.
            for kind in [VolumeKind::Filesystem, VolumeKind::Block] {
                self.remove_data(id, kind)?;
            }
            return Ok(());
        };
        let live = self.live_targets(&record)?;
        if !live.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is still published at {}; unpublish it first",
                live.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        self.remove_data(id, record.kind)?;
        self.store
            .remove(id)
            .context(|| format!("removing the record of volume {id}"))?;
        info!(volume = %id, name = %record.name, "deleted volume");
        Ok(())
    }

    fn remove_data(&self, id: &VolumeId, kind: VolumeKind) -> Result<()> {
        if kind == VolumeKind::Block {
            // A device left attached by a crash would keep the file's blocks alive.
            for device in devices::serving(id).unwrap_or_default() {
                loopdev::detach(&device).context(|| {
                    format!("detaching {} from volume {id}", device.path().display())
                })?;
            }
        }
        // Data may sit under its final or (an interrupted create) its staging name.
        let paths = [
            self.layout.data_path(id, kind),
            self.layout.staging_path(id, kind),
        ];
        // Refuse before removing anything: a mount found midway would leave a half-deleted volume.
        let mounts =
            mountinfo::read_self().context(|| "reading /proc/self/mountinfo".to_string())?;
        for path in &paths {
            if let Some(mount) = mountinfo::mounts_at_or_under(&mounts, path).next() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} has a mount at {}; refusing to delete across it",
                    mount.mount_point.display()
                )));
            }
        }
        // The walk re-checks every directory: a mount made after the look above stops it there.
        for path in &paths {
            safe_delete::remove_all(path).map_err(|err| walk_failure(id, "deleting", err))?;
        }
        Ok(())
    }
}

/// Same name asked again: only an equivalent request gets the existing volume back.
fn check_compatible(existing: &VolumeRecord, req: &CreateRequest) -> Result<()> {
    let conflict = |what: String| {
        Err(Error::AlreadyExists(format!(
            "volume {:?} already exists as {} with {what}",
            req.name, existing.id
        )))
    };
    if existing.kind != req.kind {
        return conflict(format!("access type {}", existing.kind.as_str()));
    }
    if !capacity::satisfies(existing.capacity_bytes, req.required_bytes, req.limit_bytes) {
        return conflict(format!(
            "capacity {} outside the requested range",
            existing.capacity_bytes
        ));
    }
    if existing.access_modes != req.access_modes {
        return conflict(format!("access modes {:?}", existing.access_modes));
    }
    if existing.mount_flags != req.mount_flags {
        return conflict(format!("mount flags {:?}", existing.mount_flags));
    }
    if existing.parameters != req.parameters {
        return conflict("different parameters".into());
    }
    Ok(())
}

fn make_data(path: &std::path::Path, kind: VolumeKind, capacity: i64) -> Result<()> {
    match kind {
        VolumeKind::Filesystem => {
            fs::DirBuilder::new()
                .mode(0o777)
                .create(path)
                .context(|| format!("creating {}", path.display()))?;
            // mkdir honours the umask; emptyDir semantics want every user of the pod to write.
            set_mode(path, 0o777)
        }
        VolumeKind::Block => {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .context(|| format!("creating {}", path.display()))?;
            // Sparse: blocks are allocated as the workload writes.
            file.set_len(capacity as u64)
                .and_then(|()| file.sync_all())
                .context(|| format!("sizing {} to {capacity} bytes", path.display()))
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
