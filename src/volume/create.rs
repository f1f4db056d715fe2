//! CreateVolume and DeleteVolume.
//!
//! Crash safety: the data (directory or sparse file) is made under a staging name
//! (`volumes/.creating-<id>`), then the record is committed: one journal entry, the one disk
//! flush of a create (see `records`). Only then does the data move to its final name. A crash
//! before the commit leaves staging data without a record, which `recover` removes; a crash
//! after it leaves a record with staging data, which a retried CreateVolume or the next start
//! moves into place. So a volume is either absent or complete, and data under a final name
//! without a record never comes from us (see `recover`).
//!
//! The new (empty) data itself is not flushed: a power loss right after the commit may take
//! the directory, its quota or the image's size with it. The next start remakes it from the
//! record, for a volume whose create is still in the journal and that was never published
//! (`recover::remake_recent_data`): such a volume cannot have held data anyone relied on.
//! Compaction flushes every pool before dropping a journal generation, so an older volume's
//! data is durable, and missing data there is reported, never silently remade. Restores and
//! clones copy data: the pool's filesystem is flushed (data and directory entries, once a
//! frozen source is thawed) before the commit, since a copy cannot be remade from the record.
//!
//! Deletion checks first (not published, no mount inside, loop devices detached), then commits
//! the removal and removes the data while the journal entry is written, and waits for its
//! flush (the one flush) last. A crash once the entry is written leaves a journal that names
//! the volume as removed, with some of its data left, or brought back by a power loss (the
//! data removal is not flushed): `recover` deletes it instead of moving it to lost+found, and
//! the journal generation is not compacted before the removal ends (see `journal::Appended`).
//! A crash before the entry is written leaves the record, and a retried DeleteVolume finishes
//! the job. A removal that fails midway commits the record again: the volume stays, and the
//! CO retries.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::Volumes;
use super::copies::content::SourceData;
use super::copies::cow;
use super::copies::in_flight::copies_in_flight;
use super::devices;
use super::encryption;
use super::space::accounting::Holder;
use super::space::capacity;
use super::space::limits;
use super::space::limits::{NewDirectory, size_file};
use super::space::pool::Pool;
use super::state::id::VolumeId;
use super::state::record::now_ms;
use super::state::record::{
    AccessMode, Allocation, ContentSource, Luks, SizeLimit, VolumeKind, VolumeRecord,
};
use crate::class::Mutable;
use crate::error::{Error, IoContext, Result};
use crate::host::{crypt, fsimage, fsstat, loopdev, mountinfo};

/// How old the usage figures behind a reservation may be (measuring is O(volumes)).
const USAGE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// StorageClass parameters as given (kept for idempotency checks).
    pub parameters: BTreeMap<String, String>,
    pub pool: String,
    /// None: the pool's default (`Pool::default_allocation`).
    pub allocation: Option<Allocation>,
    /// Refuse a filesystem volume on a pool that cannot limit its size.
    pub require_enforcement: bool,
    /// The snapshot or volume whose data the volume starts with.
    pub content_source: Option<ContentSource>,
    /// From the claim's VolumeAttributesClass (IO limits: block and image volumes only).
    pub mutable: Mutable,
    /// LUKS2 between the file and the filesystem or the pod (see `encryption`).
    pub encrypted: bool,
}

impl CreateRequest {
    /// How a block or image volume's file holds its space in `pool`: as the class says, or
    /// the pool's default.
    fn allocation_in(&self, pool: &Pool) -> Allocation {
        self.allocation.unwrap_or_else(|| pool.default_allocation())
    }
}

impl Volumes {
    /// Creates the volume named `req.name`, or returns the existing one if it is compatible.
    pub fn create(&self, req: CreateRequest) -> Result<Arc<VolumeRecord>> {
        let _guard = self.guards.acquire(
            format!("name:{}", req.name),
            &format!("volume name {:?}", req.name),
        )?;
        let capacity = new_capacity(&req)?;
        if let Some(existing) = self.existing_volume(&req)? {
            return Ok(existing);
        }
        let pool = self.pool(&req.pool)?;
        check_node_can_make(pool, &req)?;

        // Held until the data is copied, so the source cannot be deleted meanwhile.
        let source = req
            .content_source
            .as_ref()
            .map(|source| self.claim_source(source))
            .transpose()?;
        let capacity = match (&source, &req.content_source) {
            (Some(data), Some(from)) => {
                data.check_kind(req.kind, req.encrypted, from)?;
                data.capacity(req.required_bytes, req.limit_bytes)?
            }
            _ => capacity,
        };

        let id = VolumeId::generate(&self.node);
        self.reserve(pool, Holder::from(&id), capacity as u64, &req.name)?;
        let staging = pool.staging_path(&id, req.kind);
        let made = match &source {
            None => make_data(pool, &staging, &req, req.allocation_in(pool), capacity),
            Some(data) => self.fill_from(pool, data, &req, &staging, capacity as u64),
        };
        // A copy of an encrypted source is formatted (or not) as its source was.
        let encryption = req.encrypted.then(|| {
            let source = source.as_ref().and_then(|data| data.encryption);
            source.unwrap_or(Luks { formatted: false })
        });
        drop(source);
        // No flush of the staging entry: the commit below is the only one (see the module
        // comment for what a power loss does and how the next start repairs it).
        // What limits the staged data, so a failure below also undoes it (e.g. a project quota).
        let mut staged_limit = SizeLimit::None;
        let committed = made.and_then(|made| {
            staged_limit = made.as_ref().map_or(SizeLimit::File, |d| d.limit);
            let mut record = new_record(&id, req, pool, capacity, staged_limit);
            record.encryption = encryption;
            self.commit_created(&id, record, made)
        });
        let record = match committed {
            Ok(record) => record,
            Err(err) => {
                pool.release(&id);
                if let Err(cleanup) = limits::remove_directory(staged_limit, &staging) {
                    warn!(volume = %id, error = %cleanup, "could not remove the data of a failed create; it is removed at next start");
                }
                return Err(err);
            }
        };
        if record.fully_allocated() {
            pool.set_used(&id, capacity as u64);
        }
        // Committed: from here on the volume exists; moving the data in place is finished by a
        // retry or at the next start if this fails.
        self.finish_create(&record)?;
        info!(volume = %id, name = %record.name, kind = record.kind.as_str(), capacity, pool = %pool.name, limit = ?record.size_limit, "created volume");
        Ok(record)
    }

    /// The volume a CreateVolume names if it exists already (a retry), its create finished;
    /// None when it is to be made.
    fn existing_volume(&self, req: &CreateRequest) -> Result<Option<Arc<VolumeRecord>>> {
        let Some(existing) = self.store.find_by_name(&req.name) else {
            return Ok(None);
        };
        check_compatible(&existing, req)?;
        // Not while a DeleteVolume of it runs: answering with a volume being torn down
        // would hand the CO an id that is about to vanish.
        let _busy = self.claim(&existing.id)?;
        if self.store.get(&existing.id).is_none() {
            return Ok(None);
        }
        self.finish_create(&existing)?;
        Ok(Some(existing))
    }

    /// Commits the record of new volume `id`, whose data is staged; then the project id of a
    /// new directory (`made`) belongs to that record. On failure the caller removes the data.
    fn commit_created(
        &self,
        id: &VolumeId,
        record: VolumeRecord,
        made: Option<NewDirectory>,
    ) -> Result<Arc<VolumeRecord>> {
        let record = self.store.put(record).map_err(|err| {
            // The rename may have happened before the failure (e.g. the directory fsync):
            // take the record back so no record points at data about to be removed.
            let _ = self.store.remove(id);
            Error::host(format!("writing the record of volume {id}"), err)
        })?;
        if let Some(made) = made {
            made.commit();
        }
        Ok(record)
    }

    /// A new volume's data at `staging`, copied from `data` (a staged image source frozen
    /// meanwhile, so the copy is crash-consistent), then flushed.
    fn fill_from(
        &self,
        pool: &Pool,
        data: &SourceData,
        req: &CreateRequest,
        staging: &Path,
        capacity: u64,
    ) -> Result<Option<NewDirectory>> {
        let _running = copies_in_flight().start(data.copy_kind());
        let fill = || {
            cow::fill_volume_unflushed(
                pool,
                req.kind,
                req.allocation_in(pool),
                &data.path,
                staging,
                capacity,
            )
        };
        let made = match &data.volume {
            Some(volume) => self.with_frozen(volume, fill)?,
            None => fill()?,
        };
        // After the thaw: the source's writers never wait for a flush of the whole pool.
        cow::sync_copy(staging)?;
        Ok(made)
    }

    /// Moves a committed volume's data from its staging name to its final name, if not done yet.
    pub(super) fn finish_create(&self, record: &VolumeRecord) -> Result<()> {
        let pool = self.pool_of(record)?;
        let staging = pool.staging_path(&record.id, record.kind);
        let path = pool.data_path(&record.id, record.kind);
        if fsstat::lstat_if_exists(&staging)
            .context(|| format!("inspecting {}", staging.display()))?
            .is_none()
        {
            return Ok(());
        }
        // No directory sync: if a power loss undoes the rename, the record and the staging
        // entry survive (or the staging entry is lost too, and the data is remade: see the
        // module comment), and the next start redoes the move.
        fs::rename(&staging, &path).context(|| format!("moving {} into place", staging.display()))
    }

    /// Deletes a volume and its data. Unknown ids succeed (deletion is idempotent).
    pub fn delete(&self, id: &VolumeId) -> Result<()> {
        let _guard = self.claim(id)?;
        // Not while a snapshot or clone copies its data.
        let _unread = self.claim_unread(id)?;
        let Some(record) = self.store.get(id) else {
            if self.store.has_record_file(id) {
                return Err(Error::FailedPrecondition(format!(
                    "the record of volume {id} is unreadable; refusing to delete its data (see the log at startup)"
                )));
            }
            // Data without a record (a lost state directory, or an interrupted create): the CO
            // deletes the volume, so remove whatever carries its id, in every pool.
            for pool in self.pools() {
                for kind in [VolumeKind::Filesystem, VolumeKind::Block] {
                    self.remove_data(pool, id, kind, SizeLimit::None)?;
                }
            }
            return Ok(());
        };
        let pool = self.pool_of(&record)?;
        if let Some(orphaned) = &record.orphaned {
            // Its data is in lost+found, for a person to judge: only the record goes.
            self.store
                .remove(id)
                .context(|| format!("removing the record of volume {id}"))?;
            pool.release(id);
            info!(volume = %id, lost_path = %orphaned.lost_path.display(), "deleted the record of an orphaned volume; its data stays in lost+found");
            return Ok(());
        }
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
        let paths = self.ready_to_remove(pool, id, record.kind)?;
        // The removal is committed first and its journal write overlaps the data's removal
        // (one flush's latency less). A crash before the data is gone leaves a journal that
        // says removed: the next start deletes the rest (see `recover`).
        let removal = self
            .store
            .start_remove(id)
            .context(|| format!("removing the record of volume {id}"))?;
        let removed = remove_trees(&paths, id, record.size_limit);
        self.store
            .finish_remove(id, removal)
            .context(|| format!("removing the record of volume {id}"))?;
        if let Err(err) = removed {
            // Back as it was (the record, no half-promise): the CO retries the deletion.
            self.store
                .put((*record).clone())
                .context(|| format!("restoring the record of volume {id}"))?;
            return Err(err);
        }
        pool.release(id);
        pool.enforcement.forget(record.size_limit);
        self.usage_cache.forget(id);
        info!(volume = %id, name = %record.name, pool = %pool.name, "deleted volume");
        Ok(())
    }

    /// Promises `bytes` of `pool` to volume `id`, or RESOURCE_EXHAUSTED. When the cheap check
    /// fails, usage is measured afresh once (volumes may have written since we last looked,
    /// which frees promises) before refusing.
    pub(super) fn reserve(&self, pool: &Pool, id: Holder, bytes: u64, what: &str) -> Result<()> {
        // Usage that shrank since the last measurement would make the books too generous.
        if pool.usage_is_older_than(USAGE_MAX_AGE) {
            self.refresh_usage(pool);
        }
        if pool.reserve(id.clone(), bytes)?.is_ok() {
            return Ok(());
        }
        self.refresh_usage(pool);
        pool.reserve(id, bytes)?.map_err(|available| {
            Error::ResourceExhausted(format!(
                "{what} needs {bytes} bytes but pool {:?} can promise only {available} more (free space minus what existing volumes may still write)",
                pool.name
            ))
        })
    }

    fn remove_data(
        &self,
        pool: &Pool,
        id: &VolumeId,
        kind: VolumeKind,
        limit: SizeLimit,
    ) -> Result<()> {
        let paths = self.ready_to_remove(pool, id, kind)?;
        remove_trees(&paths, id, limit)
    }

    /// Where volume `id`'s data may be, once nothing holds it: its loop devices detached, and
    /// refused if a mount sits at or under it.
    fn ready_to_remove(
        &self,
        pool: &Pool,
        id: &VolumeId,
        kind: VolumeKind,
    ) -> Result<[PathBuf; 2]> {
        if kind.is_file() {
            // An encrypted volume's mapping left open by a crash holds its loop device (and
            // its key in the kernel).
            let mapping = encryption::mapping_name(id);
            crypt::close(&mapping).context(|| format!("closing {mapping}"))?;
            // A device left attached by a crash would keep the file's blocks alive.
            for device in devices::serving(&pool.data_path(id, kind)).unwrap_or_default() {
                loopdev::detach(&device).context(|| {
                    format!("detaching {} from volume {id}", device.path().display())
                })?;
            }
        }
        // Data may sit under its final or (an interrupted create) its staging name.
        let paths = [pool.data_path(id, kind), pool.staging_path(id, kind)];
        // Refuse before removing anything: a mount found midway would leave a half-deleted volume.
        let mut mounts = None;
        for path in &paths {
            let plain = mountinfo::nothing_mounted_within(path)
                .context(|| format!("inspecting {}", path.display()))?;
            if plain {
                continue;
            }
            let mounts = match &mut mounts {
                Some(mounts) => mounts,
                None => mounts.insert(
                    mountinfo::read_self()
                        .context(|| "reading /proc/self/mountinfo".to_string())?,
                ),
            };
            if let Some(mount) = mountinfo::mounts_at_or_under(mounts, path).next() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} has a mount at {}; refusing to delete across it",
                    mount.mount_point.display()
                )));
            }
        }
        Ok(paths)
    }
}

/// Removes the data at `paths`. The walk re-checks every directory: a mount made after
/// `ready_to_remove` looked stops it there.
fn remove_trees(paths: &[PathBuf], id: &VolumeId, limit: SizeLimit) -> Result<()> {
    for path in paths {
        encryption::erase(path).context(|| {
            format!(
                "erasing the encryption header of volume {id} at {}",
                path.display()
            )
        })?;
        limits::remove_directory(limit, path)
            .map_err(|err| Error::volume_walk(id, "deleting", err))?;
    }
    Ok(())
}

/// The record of new volume `id` as `req` asks for it, its data in `pool` limited by `size_limit`.
fn new_record(
    id: &VolumeId,
    req: CreateRequest,
    pool: &Pool,
    capacity: i64,
    size_limit: SizeLimit,
) -> VolumeRecord {
    let allocation = req.allocation_in(pool);
    // What the range asked, when a floor (a filesystem's minimum, a snapshot's data) made the
    // volume larger: a snapshot of it restores into a claim asking as little.
    let asked_bytes = capacity::choose(req.required_bytes, req.limit_bytes)
        .ok()
        .filter(|asked| *asked < capacity);
    VolumeRecord {
        id: id.clone(),
        name: req.name,
        kind: req.kind,
        capacity_bytes: capacity,
        asked_bytes,
        pool: pool.name.clone(),
        size_limit,
        allocation: match req.kind {
            VolumeKind::Block | VolumeKind::Image(_) => allocation,
            VolumeKind::Filesystem => Allocation::Thin,
        },
        access_modes: req.access_modes,
        mount_flags: req.mount_flags,
        parameters: req.parameters,
        created_unix_ms: now_ms(),
        content_source: req.content_source,
        importing: false,
        unchecked: false,
        orphaned: None,
        fenced: None,
        io_limits: req.mutable.io,
        on_overflow: req.mutable.on_overflow,
        encryption: None,
        publications: Vec::new(),
    }
}

/// The capacity a request gets: as CSI's range says, raised to what an image's filesystem
/// needs at least.
fn new_capacity(req: &CreateRequest) -> Result<i64> {
    let capacity = capacity::choose(req.required_bytes, req.limit_bytes)?;
    let Some(fs) = req.kind.image_fs() else {
        // An encrypted block volume holds its LUKS header, and at least as much data.
        return match req.encrypted {
            true => {
                let least = 2 * crypt::HEADER_BYTES as i64;
                capacity::at_least(capacity, least, req.limit_bytes, "LUKS2")
            }
            false => Ok(capacity),
        };
    };
    // An encrypted image holds its LUKS header too.
    let header = if req.encrypted {
        crypt::HEADER_BYTES
    } else {
        0
    };
    let least = (fs.min_bytes() + header) as i64;
    capacity::at_least(capacity, least, req.limit_bytes, fs.name())
}

/// RESOURCE_EXHAUSTED (the provisioner then tries another node) when this node cannot make the
/// volume as asked: no tools for an image's filesystem, or no size enforcement where the class
/// requires one.
fn check_node_can_make(pool: &Pool, req: &CreateRequest) -> Result<()> {
    if let Some(tool) = req.kind.image_fs().and_then(|fs| fs.missing_tool()) {
        return Err(Error::ResourceExhausted(format!(
            "volume {:?} is an image volume of {}, but this node has no {tool} (see `stickyvol doctor`)",
            req.name,
            req.kind.as_str()
        )));
    }
    if let Some(why) = req.encrypted.then(crypt::unavailable).flatten() {
        return Err(Error::ResourceExhausted(format!(
            "volume {:?} is to be encrypted (StorageClass parameter encryption: luks2), but {why} (see `stickyvol doctor`)",
            req.name
        )));
    }
    if req.kind == VolumeKind::Filesystem && req.require_enforcement && !pool.enforcement.enforces()
    {
        return Err(Error::ResourceExhausted(format!(
            "volume {:?} requires an enforced size, but pool {:?} on this node cannot enforce one (its filesystem offers none; see `stickyvol doctor`)",
            req.name, pool.name
        )));
    }
    Ok(())
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
    if existing.content_source != req.content_source {
        return conflict(format!("content source {:?}", existing.content_source));
    }
    Ok(())
}

/// Makes a volume's data at `path`: a (limited) directory, or a sparse or fallocated file.
fn make_data(
    pool: &Pool,
    path: &Path,
    req: &CreateRequest,
    allocation: Allocation,
    capacity: i64,
) -> Result<Option<NewDirectory>> {
    let kind = req.kind;
    match kind {
        VolumeKind::Filesystem => pool
            .enforcement
            .make_directory(path, capacity as u64)
            .map(Some),
        VolumeKind::Block | VolumeKind::Image(_) => {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .context(|| format!("creating {}", path.display()))?;
            size_file(&file, path, allocation, capacity as u64)?;
            drop(file);
            // An encrypted image's filesystem is made inside its LUKS device, at the first
            // stage: only NodeStageVolume has the key.
            if let Some(fs) = kind.image_fs().filter(|_| !req.encrypted) {
                // Only ever a file made just now (create_new above): formatting never meets data.
                fsimage::format(path, fs)
                    .context(|| format!("making {} in {}", fs.name(), path.display()))?;
            }
            // Not flushed: see the module comment (remade at start if a power loss loses it).
            Ok(None)
        }
    }
}
