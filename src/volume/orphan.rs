//! Volumes whose PV is gone (a node that comes back after the cluster released its claims):
//! which volumes may be checked, and moving one's data to its pool's lost+found. Whether a PV
//! is gone is decided above (`nodeloss::returned`); nothing here deletes data.
//!
//! The record is marked first, then the data renamed: a crash between the two leaves a marked
//! record whose data is still in place, which `finish_orphans` (at start) and a repeated call
//! move. The record stays, so `stickyvol volumes` shows the volume and its new place, its
//! space stays promised (the data still fills the pool), and it is never published again; a
//! DeleteVolume of it drops the record and leaves lost+found alone.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{error, warn};

use super::Volumes;
use super::devices;
use super::inventory::PARAM_PV_NAME;
use super::state::id::VolumeId;
use super::state::record::{Orphaned, VolumeRecord, now_ms};
use crate::error::{Error, IoContext, Result};
use crate::host::{fsstat, mountinfo};

/// A volume whose PV may be looked up: unpublished, not orphaned, named by a PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: VolumeId,
    /// `csi.storage.k8s.io/pv/name` as the provisioner gave it (unchecked: hostile until
    /// validated by the caller).
    pub pv_name: String,
}

impl Volumes {
    /// The volumes whose PV may be checked: those created with a PV name (the provisioner's
    /// `--extra-create-metadata`), in a pool this node has, not published, not being imported,
    /// not already orphaned. A published volume is in use here: never a candidate.
    pub fn orphan_candidates(&self) -> Vec<Candidate> {
        self.store
            .all()
            .into_iter()
            .filter(|r| {
                r.orphaned.is_none()
                    && r.publications.is_empty()
                    && !r.importing
                    && self.pool_of(r).is_ok()
            })
            .filter_map(|r| {
                Some(Candidate {
                    id: r.id.clone(),
                    pv_name: r.parameters.get(PARAM_PV_NAME)?.clone(),
                })
            })
            .collect()
    }

    /// The orphaned volumes and where their data went, in id order (for the node's report).
    pub fn orphaned(&self) -> Vec<(VolumeId, Orphaned)> {
        let mut orphaned: Vec<_> = self
            .store
            .all()
            .into_iter()
            .filter_map(|r| Some((r.id.clone(), r.orphaned.clone()?)))
            .collect();
        orphaned.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        orphaned
    }

    /// How many volumes are orphaned (for metrics).
    pub fn orphaned_count(&self) -> usize {
        self.store
            .all()
            .iter()
            .filter(|r| r.orphaned.is_some())
            .count()
    }

    /// Marks volume `id` orphaned (its PV `pv_name` is gone) and moves its data into its pool's
    /// lost+found; returns where it went. Refused (FAILED_PRECONDITION) if the volume is
    /// published, has a mount or loop device on its data, or no longer names that PV.
    /// Idempotent: an orphaned volume whose data is still in place is moved.
    pub fn orphan(&self, id: &VolumeId, pv_name: &str) -> Result<PathBuf> {
        let _guard = self.claim(id)?;
        // Not while a snapshot or clone copies its data.
        let _unread = self.claim_unread(id)?;
        let record = self.get(id)?;
        let marked = match &record.orphaned {
            Some(_) => record.clone(),
            None => {
                if record.parameters.get(PARAM_PV_NAME).map(String::as_str) != Some(pv_name) {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is not the volume of PV {pv_name:?}"
                    )));
                }
                if !record.publications.is_empty() || record.importing {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is published or being imported; it is not orphaned"
                    )));
                }
                let pool = self.pool_of(&record)?;
                self.check_movable(&record, &pool.data_path(id, record.kind))?;
                let data = pool.data_path(id, record.kind);
                let lost_path = free_name(&pool.lost_and_found(), &data)?;
                let updated = VolumeRecord {
                    orphaned: Some(Orphaned {
                        since_unix_ms: now_ms(),
                        pv_name: pv_name.to_string(),
                        lost_path,
                    }),
                    ..(*record).clone()
                };
                self.store
                    .put(updated)
                    .context(|| format!("marking volume {id} orphaned"))?
            }
        };
        let moved = self.move_orphaned_data(&marked)?;
        // Its PV is gone and it is never published again: nothing will write the rest of its
        // size, so the pool stops holding it back (what its data takes in lost+found, the
        // filesystem's free space still shows).
        self.pool_of(&marked)?.release(id);
        Ok(moved)
    }

    /// At start: finishes the moves a crash interrupted (a marked record, data still in place).
    pub(super) fn finish_orphans(&self) {
        for record in self.store.all() {
            if record.orphaned.is_none() || self.pool_of(&record).is_err() {
                continue;
            }
            if let Err(err) = self.move_orphaned_data(&record) {
                warn!(volume = %record.id, error = %err, "could not finish moving an orphaned volume's data to lost+found");
            }
        }
    }

    /// Nothing may hold the data being moved: no live publication, no mount at or under it,
    /// no loop device over it.
    fn check_movable(&self, record: &VolumeRecord, data: &Path) -> Result<()> {
        if !self.live_targets(record)?.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is published",
                record.id
            )));
        }
        // "Not plain" means: look in the mount table.
        let plain = mountinfo::nothing_mounted_within(data)
            .context(|| format!("inspecting {}", data.display()))?;
        let mounted = !plain && {
            let mounts =
                mountinfo::read_self().context(|| "reading /proc/self/mountinfo".to_string())?;
            mountinfo::mounts_at_or_under(&mounts, data)
                .next()
                .is_some()
        };
        let device =
            record.kind.is_file() && !devices::serving(data).unwrap_or_default().is_empty();
        if mounted || device {
            return Err(Error::FailedPrecondition(format!(
                "volume {} has a mount or loop device on its data; not moving it",
                record.id
            )));
        }
        Ok(())
    }

    /// Renames the data of a marked record to its lost+found path, if it is still in place.
    fn move_orphaned_data(&self, record: &Arc<VolumeRecord>) -> Result<PathBuf> {
        let orphaned = record.orphaned.as_ref().ok_or_else(|| {
            Error::FailedPrecondition(format!("volume {} is not orphaned", record.id))
        })?;
        let pool = self.pool_of(record)?;
        let data = pool.data_path(&record.id, record.kind);
        let in_place = fsstat::lstat_if_exists(&data)
            .context(|| format!("inspecting {}", data.display()))?
            .is_some();
        if in_place {
            self.check_movable(record, &data)?;
            let lost = pool.lost_and_found();
            fs::create_dir_all(&lost).context(|| format!("creating {}", lost.display()))?;
            if fsstat::lstat_if_exists(&orphaned.lost_path)
                .context(|| format!("inspecting {}", orphaned.lost_path.display()))?
                .is_some()
            {
                return Err(Error::FailedPrecondition(format!(
                    "{} exists; not moving volume {}'s data over it",
                    orphaned.lost_path.display(),
                    record.id
                )));
            }
            // A rename within the pool: never a copy, never a delete (EXDEV fails it).
            fs::rename(&data, &orphaned.lost_path).context(|| {
                format!(
                    "moving {} to {}",
                    data.display(),
                    orphaned.lost_path.display()
                )
            })?;
            error!(volume = %record.id, pv = %orphaned.pv_name, to = %orphaned.lost_path.display(), "the volume's PV is gone: its data was moved to lost+found; inspect it and remove it by hand");
        }
        Ok(orphaned.lost_path.clone())
    }
}

/// `<lost+found>/<data's name>`, or with a unique suffix if that name is taken.
fn free_name(lost: &Path, data: &Path) -> Result<PathBuf> {
    let name = data
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let plain = lost.join(&name);
    let taken = fsstat::lstat_if_exists(&plain)
        .context(|| format!("inspecting {}", plain.display()))?
        .is_some();
    Ok(if taken {
        lost.join(format!("{name}.{}", uuid::Uuid::now_v7().simple()))
    } else {
        plain
    })
}
