//! Reconciling the host with the records at startup, so a kill -9 at any moment converges:
//! - staged data of an interrupted create is moved into place (committed) or removed (not);
//! - data under a final name without any record is moved to `lost+found`, never deleted —
//!   unless the journal says its volume was removed (a power loss undid the data's removal);
//! - the empty data of a volume created just before a power loss is remade from its record
//!   (`remake_recent_data`);
//! - publications the host no longer shows (a reboot, an interrupted unpublish) are forgotten;
//! - loop devices over our files that no live publication uses are detached — before any data
//!   moves, since a device is ours only if it is attached to the very file at our path (another
//!   node on this kernel may have a device over a file at the same path: see `devices`).
//!
//! Records that cannot be read are reported loudly and their data is left alone. Removals
//! (an uncommitted create's data, a deleted volume's that came back) are only queued here and
//! run once the socket serves (`remove_leftovers`): a big tree must not keep the node's
//! storage down at start.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing::{debug, error, info, warn};

use super::space::limits;
use super::space::limits::size_file;
use super::space::pool::STAGING_PREFIX;
use super::space::pool::{Pool, id_of_data_entry};
use super::state::id::VolumeId;
use super::state::record::{SizeLimit, VolumeKind, VolumeRecord};
use super::state::store::LoadReport;
use super::{Volumes, devices};
use crate::error::{IoContext, Result};
use crate::host::projquota::ProjectIdLease;
use crate::host::{fsimage, loopdev};

/// Data a crash left to remove (see `Volumes::leave_for_removal`).
#[derive(Debug)]
pub(super) struct Leftover {
    pool: String,
    id: VolumeId,
    path: PathBuf,
    limit: SizeLimit,
    what: &'static str,
    /// Keeps its project id from a new volume until the data is gone.
    _lease: Option<ProjectIdLease>,
}

fn lock(leftovers: &Mutex<Vec<Leftover>>) -> MutexGuard<'_, Vec<Leftover>> {
    leftovers.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Volumes {
    pub(super) fn recover(&self, report: LoadReport) -> Result<()> {
        for (id, why) in &report.unreadable {
            error!(volume = %id, reason = %why, "volume record is unreadable; the volume is left untouched until an admin repairs or removes the record");
        }
        for (id, why) in &report.unreadable_publications {
            warn!(volume = %id, reason = %why, "publications file is unreadable (a power loss while it was written?); treating the volume as unpublished");
        }
        for torn in &report.torn {
            warn!(what = %torn, "ignored the torn tail of the state journal");
        }
        // Before anything judges publications: a staging mount pods still rely on comes back.
        self.restage_for_running_pods();
        self.thaw_staged();
        // Devices first, while our files are where they were attached: a device over data moved
        // to lost+found or removed could no longer be proven ours, and would stay attached.
        self.detach_unused_devices()?;
        self.remove_orphaned_data(&report.removed_recently)?;
        // Still sees the publications a crash left, which tell a used volume from a new one.
        self.remake_recent_data(&report.created_recently)?;
        self.forget_stale_publications()?;
        self.finish_orphans();
        info!(volumes = self.store.len(), data_dir = %self.default_pool().root.display(), "volume state loaded");
        Ok(())
    }

    fn remove_orphaned_data(&self, removed: &HashSet<VolumeId>) -> Result<()> {
        for pool in self.pools() {
            self.remove_orphaned_data_of(pool, removed)?;
        }
        Ok(())
    }

    fn remove_orphaned_data_of(&self, pool: &Pool, removed: &HashSet<VolumeId>) -> Result<()> {
        let dir = &pool.volumes;
        for entry in fs::read_dir(dir).context(|| format!("listing {}", dir.display()))? {
            let entry = entry.context(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name();
            let name = name.to_str().unwrap_or_default();
            if let Some(staged) = name.strip_prefix(STAGING_PREFIX) {
                self.settle_staged(pool, &entry.path(), staged)?;
                continue;
            }
            let Some(id) = id_of_data_entry(name) else {
                warn!(path = %entry.path().display(), "unknown entry in the volumes directory; leaving it alone");
                continue;
            };
            if self.store.has_record_file(&id) {
                continue;
            }
            if removed.contains(&id) {
                // DeleteVolume committed the removal, then a crash stopped the data's removal
                // or a power loss undid it (unflushed). The CO deleted it: finish the job.
                self.leave_for_removal(
                    pool,
                    id,
                    entry.path(),
                    "a deleted volume that a crash brought back",
                );
                continue;
            }
            self.quarantine(pool, &id, &entry.path())?;
        }
        Ok(())
    }

    /// A volume created by a journal entry not compacted yet (so: recently) whose empty data
    /// a power loss took away, partly or wholly (nothing of a create but its record is
    /// flushed): remade from its record, with its size limit. Only for a volume that never
    /// held data: made empty (no content source, no import) and never published — a published
    /// volume's publications file survives a driver crash, and a power loss takes unflushed
    /// data anyway. Any other volume with missing data is left to show as abnormal ("data is
    /// missing"): silently remaking it would hide a data loss.
    fn remake_recent_data(&self, created: &HashSet<VolumeId>) -> Result<()> {
        for id in created {
            let Some(record) = self.store.get(id) else {
                continue;
            };
            let Ok(pool) = self.pool_of(&record) else {
                continue;
            };
            if record.content_source.is_some()
                || record.importing
                || !record.publications.is_empty()
            {
                continue;
            }
            if let Err(err) = remake_data(pool, &record) {
                warn!(volume = %id, error = %err, "could not remake the data of a volume created just before a crash; it shows as abnormal");
            }
        }
        Ok(())
    }

    /// Staged data: committed (a record exists) → moved into place; never committed → removed.
    fn settle_staged(&self, pool: &Pool, path: &Path, staged_name: &str) -> Result<()> {
        let Some(id) = id_of_data_entry(staged_name) else {
            warn!(path = %path.display(), "unknown entry in the volumes directory; leaving it alone");
            return Ok(());
        };
        if let Some(record) = self.store.get(&id) {
            if record.pool != pool.name {
                // E.g. two pool paths swapped between names: not ours to move across pools.
                warn!(volume = %id, path = %path.display(), record_pool = %record.pool, found_in = %pool.name, "staged data of a volume found in another pool than its record names; leaving it alone");
                return Ok(());
            }
            self.finish_create(&record)?;
            info!(volume = %id, "finished a create interrupted after its commit");
        } else if !self.store.has_record_file(&id) {
            self.leave_for_removal(
                pool,
                id,
                path.to_path_buf(),
                "a create interrupted before its commit",
            );
        }
        Ok(())
    }

    /// Queues data a crash left for removal once the socket serves (`remove_leftovers`): a big
    /// tree must not keep the node's storage down at start. It goes with the limit it may
    /// carry (a project id and its quota, a qgroup), so nothing of it outlives the data; the
    /// project id is reserved meanwhile, so no new volume gets it first.
    fn leave_for_removal(&self, pool: &Pool, id: VolumeId, path: PathBuf, what: &'static str) {
        let limit = pool.enforcement.limit_left_on(&path);
        let lease = pool.enforcement.reserve_left(limit);
        lock(&self.leftovers).push(Leftover {
            pool: pool.name.clone(),
            id,
            path,
            limit,
            what,
            _lease: lease,
        });
    }

    /// Removes, on a thread of its own, the data `recover` left for later.
    pub fn remove_leftovers(self: &Arc<Self>) {
        let leftovers = std::mem::take(&mut *lock(&self.leftovers));
        if leftovers.is_empty() {
            return;
        }
        let volumes = self.clone();
        let spawned = std::thread::Builder::new()
            .name("leftover-removal".into())
            .spawn(move || {
                for leftover in leftovers {
                    volumes.remove_leftover(leftover);
                }
            });
        if let Err(err) = spawned {
            error!(error = %err, "cannot start removing the data crashes left; it stays until the next start");
        }
    }

    fn remove_leftover(&self, leftover: Leftover) {
        let Leftover {
            pool,
            id,
            path,
            limit,
            what,
            ..
        } = &leftover;
        // Each pool's walks share its slots with stats and copies.
        let Ok(pool) = self.pool(pool) else { return };
        // At start no caller waits: the slot always comes.
        let _slot = pool.walks.take();
        if let Err(err) = super::encryption::erase(path) {
            warn!(volume = %id, path = %path.display(), error = %err, "could not erase the encryption header of {what}; the next start tries again");
            return;
        }
        match limits::remove_directory(*limit, path) {
            Ok(()) => {
                info!(volume = %id, path = %path.display(), limit = ?limit, "removed the data of {what}")
            }
            Err(err) => {
                warn!(volume = %id, path = %path.display(), error = %err, "could not remove the data of {what}; the next start tries again")
            }
        }
    }

    /// Data under a final name without any record never comes from an interrupted operation of
    /// ours (see `create`): a lost state directory, a restore, a hand-made entry. It is moved
    /// aside, never deleted, and the admin is told.
    pub(super) fn quarantine(
        &self,
        pool: &Pool,
        id: &dyn std::fmt::Display,
        path: &Path,
    ) -> Result<()> {
        let lost = pool.lost_and_found();
        fs::create_dir_all(&lost).context(|| format!("creating {}", lost.display()))?;
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut destination = lost.join(&name);
        if destination.exists() {
            destination = lost.join(format!("{name}.{}", uuid::Uuid::now_v7().simple()));
        }
        fs::rename(path, &destination)
            .context(|| format!("moving {} to {}", path.display(), destination.display()))?;
        error!(id = %id, from = %path.display(), to = %destination.display(), "data without a record moved to lost+found; inspect it and remove it by hand");
        Ok(())
    }

    /// Drops publications the host no longer shows.
    fn forget_stale_publications(&self) -> Result<()> {
        for record in self.store.all() {
            // A volume of a pool not configured now is left exactly as it is.
            if record.publications.is_empty() || self.pool_of(&record).is_err() {
                continue;
            }
            let mut live = Vec::new();
            for publication in &record.publications {
                if self.is_live(&record, publication)? {
                    live.push(publication.clone());
                } else {
                    info!(volume = %record.id, target = %publication.target.display(), "publication no longer present on the host; forgetting it");
                }
            }
            if live.len() != record.publications.len() {
                let mut updated = (*record).clone();
                updated.publications = live;
                self.store
                    .put(updated)
                    .context(|| format!("updating the record of volume {}", record.id))?;
            }
        }
        Ok(())
    }

    /// The loop devices behind publications the host still shows.
    fn devices_in_use(&self) -> Result<HashSet<String>> {
        let mut in_use = HashSet::new();
        for record in self.store.all() {
            if self.pool_of(&record).is_err() {
                continue;
            }
            for publication in &record.publications {
                if self.is_live(&record, publication)? {
                    in_use.extend(publication.loop_device.clone());
                }
            }
        }
        Ok(in_use)
    }

    fn detach_unused_devices(&self) -> Result<()> {
        let in_use = self.devices_in_use()?;
        let attached = match loopdev::list_attached() {
            Ok(attached) => attached,
            Err(err) => {
                warn!(error = %err, "cannot list loop devices; skipping their cleanup");
                return Ok(());
            }
        };
        for (device, file) in attached {
            let Some(id) = devices::volume_named_by_backing_file(&file) else {
                continue;
            };
            if in_use.contains(device.name()) {
                continue;
            }
            // The name only makes it a candidate: another node on this kernel (kind) may have
            // attached a file at the very same path, even of a volume id we know.
            let ours = self
                .pools()
                .iter()
                .any(|pool| devices::serves(&device, &pool.data_path(&id, VolumeKind::Block)));
            // (Block and image volumes' files have one name: `pool::data_name`.)
            if !ours {
                debug!(device = %device.path().display(), file = %file.display(), "loop device over a file that is not ours (another node's on this kernel, or deleted); leaving it alone");
                continue;
            }
            // Ours to release: a volume we know with no live publication on this device, or
            // data of ours that has no record at all. An unreadable record means hands off.
            let known = self
                .store
                .get(&id)
                .is_some_and(|record| self.pool_of(&record).is_ok());
            let recordless = !self.store.has_record_file(&id);
            if !(known || recordless) {
                continue;
            }
            // An encrypted volume's mapping left open over it by a crash holds it (and the key).
            let mapping = super::encryption::mapping_name(&id);
            if crate::host::crypt::mapping(&mapping)
                .is_some_and(|m| m.below.iter().any(|below| below == device.name()))
                && let Err(err) = crate::host::crypt::close(&mapping)
            {
                warn!(device = %device.path().display(), error = %err, "could not close the encryption mapping over an unused loop device");
            }
            match loopdev::detach(&device) {
                Ok(()) => {
                    info!(device = %device.path().display(), file = %file.display(), "detached a loop device no publication uses")
                }
                Err(err) => {
                    warn!(device = %device.path().display(), error = %err, "could not detach an unused loop device")
                }
            }
        }
        Ok(())
    }
}

/// Whether `file` has any data extent (SEEK_DATA finds one before its end).
fn holds_any_data(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsFd;
    match nix::unistd::lseek(file.as_fd(), 0, nix::unistd::Whence::SeekData) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::ENXIO) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Makes sure a recently created, never used volume has its (empty) data with its size limit.
fn remake_data(pool: &Pool, record: &VolumeRecord) -> Result<()> {
    let path = pool.data_path(&record.id, record.kind);
    let capacity = record.capacity_bytes as u64;
    let existing = crate::host::fsstat::lstat_if_exists(&path)
        .context(|| format!("inspecting {}", path.display()))?;
    match record.kind {
        VolumeKind::Block | VolumeKind::Image(_) => {
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
                .context(|| format!("opening {}", path.display()))?;
            let len = file
                .metadata()
                .context(|| format!("inspecting {}", path.display()))?
                .len();
            // Thick: fallocate again (a no-op where the blocks are already allocated).
            if existing.is_none() || len != capacity || record.fully_allocated() {
                size_file(&file, &path, record.allocation, capacity)?;
            }
            // An image whose filesystem a power loss took: only a file of nothing but holes
            // (it cannot hold anyone's data) is formatted again; mkfs refuses any filesystem.
            // An encrypted image's filesystem is made inside its LUKS device, at its first stage.
            if let Some(fs) = record
                .kind
                .image_fs()
                .filter(|_| record.encryption.is_none())
                && !holds_any_data(&file).context(|| format!("inspecting {}", path.display()))?
            {
                drop(file);
                fsimage::format(&path, fs)
                    .context(|| format!("making {} in {}", fs.name(), path.display()))?;
            }
        }
        VolumeKind::Filesystem => {
            pool.enforcement
                .remake_directory(record.size_limit, &path, capacity)?;
        }
    }
    if existing.is_none() {
        warn!(volume = %record.id, path = %path.display(), "remade the empty data of a volume created just before a crash (a power loss took it)");
    }
    Ok(())
}
