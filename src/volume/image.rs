//! Image volumes on the node: a file in the pool holding a filesystem of its own (ext4 or XFS),
//! so its size holds on any pool, prepared or not.
//!
//! NodeStageVolume attaches the file to a loop device (direct I/O, as for block volumes) and
//! mounts its filesystem at kubelet's per-volume staging path, once per node; each pod's target
//! is then a bind mount of that mount (`publish`). The staging mount is recorded like a
//! publication (`Publication::staging`), so its device is known to be in use at the next start
//! and DeleteVolume refuses while it stands. Directory and block volumes have nothing to stage:
//! their NodeStageVolume only checks the request and answers at once.
//!
//! The filesystem is made once, by CreateVolume, in a file it has just created (`create`);
//! staging never formats. It grows to the file's size when staged (a restore into a bigger
//! volume, an expansion while unstaged) and when NodeExpandVolume grows a staged volume.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sys_mount::MountFlags;
use tracing::{info, warn};

use super::capability::Capability;
use super::devices;
use super::encryption;
use super::publish::{check_capability, missing_data, usable};
use super::space::mechanism::Mechanism;
use super::space::throttle::{caller_gone, node_walk};
use super::state::id::VolumeId;
use super::state::record::{FsType, Luks, Publication, VolumeRecord};
use super::stats::{Amounts, VolumeStats};
use super::target::{MountPoint, Target, target_name};
use super::{Condition, Volumes};
use crate::error::{Error, IoContext, Result};
use crate::host::crypt::Key;
use crate::host::fsstat::{self, Stat};
use crate::host::loopdev::{self, LoopDevice};
use crate::host::{dirfd, fsimage, mount};

/// A validated NodeStageVolume request.
#[derive(Debug, Clone)]
pub struct StageRequest {
    pub staging: PathBuf,
    pub capability: Capability,
    /// From the node-stage Secret: what opens an encrypted volume (see `encryption`).
    pub key: Option<Arc<Key>>,
}

impl Volumes {
    /// Whether staging volume `id` with `cap` has nothing to do (a directory or block volume),
    /// from the records alone: kubelet stages every volume of a driver that stages, and these
    /// must cost no more than the call. Errors as NodeStageVolume answers them.
    pub fn stages_nothing(&self, id: &VolumeId, cap: &Capability) -> Result<bool> {
        let record = self.get(id)?;
        usable(&record)?;
        check_capability(&record, cap, "staged")?;
        Ok(stages_nothing(&record))
    }

    /// Whether unstaging volume `id` has nothing to do: a known volume that stages nothing.
    pub fn unstages_nothing(&self, id: &VolumeId) -> bool {
        self.store
            .get(id)
            .is_some_and(|record| stages_nothing(&record))
    }

    /// NodeStageVolume: mounts an image volume's filesystem at `req.staging`, opens an encrypted
    /// block volume (`encrypted_block`); for other volumes, checks the request and does nothing.
    pub fn stage(&self, id: &VolumeId, req: StageRequest) -> Result<()> {
        let _guard = self.claim(id)?;
        if self.stages_nothing(id, &req.capability)? {
            return Ok(());
        }
        let record = self.get(id)?;
        let cap = &req.capability;
        let Some(fs) = record.kind.image_fs() else {
            return self.stage_encrypted_block(&record, &req);
        };
        if let Some(staged) = record.staging()
            && staged.target != req.staging
            && self.is_live(&record, staged)?
        {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is already staged at {}",
                staged.target.display()
            )));
        }
        let data = self.data_path(&record)?;
        let source = fsstat::lstat(&data).map_err(|err| missing_data(id, &data, err))?;
        if !source.is_regular_file() {
            return Err(Error::FailedPrecondition(format!(
                "data of volume {id} at {} is not a regular file",
                data.display()
            )));
        }
        let parent = self.open_target_parent(&req.staging)?;
        let at = Target {
            parent: Some(parent.as_fd()),
            name: target_name(&req.staging)?,
            path: &req.staging,
        };
        let record = if record.unchecked {
            self.check_imported(&record, fs, &data)?
        } else {
            record
        };
        let key = req.key.as_deref();
        let record = match record.encryption {
            Some(Luks { formatted: false }) => {
                self.format_encrypted(&record, Some(fs), &data, key)?
            }
            _ => record,
        };
        let readonly = cap.access_mode.is_read_only();
        let (device, fs_device) = self.mount_image(&record, fs, &data, &at, readonly, key)?;
        let staged = Publication {
            target: req.staging.clone(),
            readonly,
            access_mode: cap.access_mode,
            mount_flags: Vec::new(),
            loop_device: Some(device.name().to_string()),
            loop_backing_file: Some(source.id()),
            staging: true,
            pod: None,
        };
        if record.staging() != Some(&staged) {
            let mut updated = (*record).clone();
            updated
                .publications
                .retain(|p| !p.staging && p.target != staged.target);
            updated.publications.push(staged);
            self.store
                .put(updated)
                .context(|| format!("recording the staging of volume {id}"))?;
        }
        // The file may be bigger than its filesystem: a restore into a bigger volume, or an
        // expansion while nothing was staged. Its superblock says; a grow tool runs only then.
        let smaller = fsimage::smaller_than_device(fs, &fs_device).unwrap_or(true);
        if !readonly
            && smaller
            && let Err(err) = fsimage::grow(fs, &fs_device, &req.staging)
        {
            warn!(volume = %id, error = %err, "could not grow the filesystem to its image's size; NodeExpandVolume retries");
        }
        info!(volume = %id, staging = %req.staging.display(), device = %device.path().display(), fs = fs.name(), "staged image volume");
        Ok(())
    }

    /// The first stage after an import: the image's filesystem, bytes from a stream, is checked
    /// by its own checker before the kernel parses it; once sound, the record says so.
    fn check_imported(
        &self,
        record: &VolumeRecord,
        fs: FsType,
        data: &Path,
    ) -> Result<Arc<VolumeRecord>> {
        let id = &record.id;
        fsimage::check(fs, data).map_err(|err| {
            Error::FailedPrecondition(format!(
                "the imported {} filesystem of volume {id} fails its check, so it is not mounted: {err}; import a sound export again (`stickyvol volume import --replace`), or repair the image {} from the node",
                fs.name(),
                data.display()
            ))
        })?;
        let checked = self
            .store
            .put(VolumeRecord {
                unchecked: false,
                ..record.clone()
            })
            .context(|| format!("recording the check of volume {id}"))?;
        info!(volume = %id, fs = fs.name(), "the imported filesystem passed its check");
        Ok(checked)
    }

    /// Mounts the image `data` at `at`, or adopts the mount an interrupted attempt made there;
    /// returns the loop device behind it and the device the filesystem is on (the same, or an
    /// encrypted volume's mapping over it, opened with `key`).
    fn mount_image(
        &self,
        record: &VolumeRecord,
        fs: FsType,
        data: &Path,
        at: &Target<'_>,
        readonly: bool,
        key: Option<&Key>,
    ) -> Result<(LoopDevice, PathBuf)> {
        let id = &record.id;
        let target = at.path;
        let (directory, created) = match at.mount_point("staging path")? {
            MountPoint::Made(fd) => (fd, true),
            MountPoint::Empty(fd) => (fd, false),
            MountPoint::Mounted(_, stat) => {
                return image_device(record, data, &stat)
                    .and_then(|device| {
                        let (fs_device, _) = encryption::filesystem_device(record, &device)?;
                        Some((device, fs_device))
                    })
                    .ok_or_else(|| {
                        Error::AlreadyExists(format!(
                            "staging path {} already has something else mounted",
                            target.display()
                        ))
                    });
            }
        };
        // The device of an earlier staging that pods' bind mounts still hold: mounting the
        // filesystem through a second device over the same file would corrupt it.
        let recorded = record
            .staging()
            .and_then(|p| p.loop_device.as_deref())
            .and_then(LoopDevice::from_name)
            .filter(|device| devices::serves_publication(device, record.staging(), data));
        let attached = recorded.is_none();
        let device = match recorded {
            Some(device) => device,
            None => loopdev::attach(data, readonly)
                .context(|| format!("attaching a loop device to volume {id}"))?,
        };
        // A pod may have written anything into its filesystem: nodev keeps device nodes in it
        // from reaching the host's devices, nosuid keeps a setuid binary planted in it (in the
        // image's bytes, or through an import) from running as its owner, root included. Each
        // pod's bind of the staged mount inherits both.
        let mut flags = MountFlags::NODEV | MountFlags::NOSUID;
        if readonly {
            flags |= MountFlags::RDONLY;
        }
        let fs_device = match record.encryption {
            None => Ok(device.path()),
            Some(_) => self.open_encrypted(record, &device, key, readonly),
        };
        let mounted = fs_device.and_then(|fs_device| {
            fsimage::mount(&fs_device, fs, directory.as_fd(), flags)
                .map(|()| fs_device)
                .map_err(|err| {
                    Error::FailedPrecondition(format!(
                        "the {} filesystem of volume {id} cannot be mounted ({err}); it may be damaged: check it with fsck from the node, the image is {}",
                        fs.name(),
                        data.display()
                    ))
                })
        });
        if mounted.is_err() {
            // Nothing left behind: the mapping and the device go, and the directory if we made
            // it.
            if attached {
                if record.encryption.is_some() {
                    let _ = self.close_encrypted(id);
                }
                let _ = loopdev::detach(&device);
            }
            if created {
                let _ = dirfd::remove_dir_at(at.parent()?, at.name);
            }
        }
        Ok((device, mounted?))
    }

    /// At start: an image volume whose staging mount is gone while pods' bind mounts of it
    /// stand (someone unmounted it) is mounted there again, through the device those mounts
    /// hold, so kubelet finds what it staged. After a reboot nothing stands, and kubelet
    /// stages again itself.
    pub(super) fn restage_for_running_pods(&self) {
        for record in self.store.all() {
            let (Some(fs), Some(staged)) = (record.kind.image_fs(), record.staging()) else {
                continue;
            };
            if self.is_live(&record, staged).unwrap_or(true) {
                continue;
            }
            let pods_running = record
                .pod_publications()
                .any(|p| self.is_live(&record, p).unwrap_or(false));
            if !pods_running || !staged.target.is_dir() {
                continue;
            }
            let restaged = self.data_path(&record).and_then(|data| {
                let parent = self.open_target_parent(&staged.target)?;
                let at = Target {
                    parent: Some(parent.as_fd()),
                    name: target_name(&staged.target)?,
                    path: &staged.target,
                };
                self.mount_image(&record, fs, &data, &at, staged.readonly, None)
            });
            match restaged {
                Ok(_) => {
                    info!(volume = %record.id, staging = %staged.target.display(), "mounted an image volume at its staging path again: pods still use it")
                }
                Err(err) => {
                    warn!(volume = %record.id, staging = %staged.target.display(), error = %err, "could not mount an image volume at its staging path again")
                }
            }
        }
    }

    /// At start: a driver killed while it copied a staged image left its filesystem frozen,
    /// and every writer of the volume waiting; thaw each staged filesystem (one not frozen
    /// answers EINVAL, which is fine).
    pub(super) fn thaw_staged(&self) {
        for record in self.store.all() {
            let Some(staged) = record
                .staging()
                .filter(|_| record.kind.image_fs().is_some())
            else {
                continue;
            };
            if staged.readonly || !self.is_live(&record, staged).unwrap_or(false) {
                continue;
            }
            let thawed =
                std::fs::File::open(&staged.target).and_then(|root| fsimage::thaw(root.as_fd()));
            match thawed {
                Ok(()) => {
                    warn!(volume = %record.id, staging = %staged.target.display(), "thawed the filesystem of an image volume a stopped copy had left frozen")
                }
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {}
                Err(err) => {
                    warn!(volume = %record.id, staging = %staged.target.display(), error = %err, "could not thaw the filesystem of an image volume")
                }
            }
        }
    }

    /// NodeUnstageVolume: unmounts an image volume's staging mount and detaches its device;
    /// succeeds when there is nothing (left) to undo, and for volumes that stage nothing.
    pub fn unstage(&self, id: Option<&VolumeId>, staging: &Path) -> Result<()> {
        let parent = self.open_existing_target_parent(staging)?;
        let at = Target {
            parent: parent.as_ref().map(|fd| fd.as_fd()),
            name: target_name(staging)?,
            path: staging,
        };
        let Some(record) = id.and_then(|id| self.store.get(id)) else {
            // Not ours to unmount; the directory is kubelet's.
            return refuse_unknown_mount(&at);
        };
        let id = &record.id;
        let _guard = self.claim(id)?;
        // Looked up again under the guard: a DeleteVolume may just have finished.
        let Some(record) = self.store.get(id) else {
            return refuse_unknown_mount(&at);
        };
        if record.kind.image_fs().is_none() {
            return match record.encryption {
                Some(_) => self.unstage_encrypted_block(&record, staging),
                None => Ok(()),
            };
        }
        let pods = record
            .pod_publications()
            .filter(|p| self.is_live(&record, p).unwrap_or(true))
            .map(|p| p.target.display().to_string())
            .collect::<Vec<_>>();
        if !pods.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is still published at {}; unpublish it first",
                pods.join(", ")
            )));
        }
        let data = self.data_path(&record)?;
        let mut devices = Vec::new();
        // Stacked mounts (a retried stage that raced) are all ours to remove.
        while let Some(stat) = at.stat()? {
            if !stat.is_dir() || !stat.is_mount_root {
                break;
            }
            let Some(device) = image_device(&record, &data, &stat) else {
                return Err(Error::FailedPrecondition(format!(
                    "staging path {} has a mount that is not volume {id}; leaving it alone",
                    staging.display()
                )));
            };
            mount::unmount_at(at.parent()?, at.name)
                .context(|| format!("unmounting volume {id} from {}", staging.display()))?;
            devices.push(device);
        }
        let recorded = record.publication(staging).filter(|p| p.staging);
        devices.extend(
            recorded
                .and_then(|p| p.loop_device.as_deref())
                .and_then(LoopDevice::from_name)
                .filter(|device| devices::serves_publication(device, recorded, &data)),
        );
        if record.encryption.is_some() {
            // The key leaves the kernel with the mapping; the loop device is free after it.
            self.close_encrypted(id)?;
        }
        for device in devices {
            if let Err(err) = loopdev::detach(&device) {
                warn!(volume = %id, device = %device.path().display(), error = %err, "could not detach loop device; it is retried at next start");
            }
        }
        if recorded.is_some() {
            let mut updated = (*record).clone();
            updated.publications.retain(|p| p.target != staging);
            // As for unpublish: the host is clean, which is what kubelet waits for.
            if let Err(err) = self.store.put(updated) {
                warn!(volume = %id, error = %err, "unstaged, but could not update the record");
            }
        }
        info!(volume = %id, staging = %staging.display(), "unstaged image volume");
        Ok(())
    }

    /// Where an image volume's filesystem is mounted on this node, for a pod's bind mount.
    pub(super) fn staged_root(&self, record: &VolumeRecord) -> Result<PathBuf> {
        match record.staging() {
            Some(staged) if self.is_live(record, staged)? => Ok(staged.target.clone()),
            _ => Err(Error::FailedPrecondition(format!(
                "volume {} is not staged on this node (NodeStageVolume first)",
                record.id
            ))),
        }
    }

    /// Whether `publication` (staging or a pod's) of an image volume is in place: a mount of
    /// the filesystem on the staging loop device, which must still be over the volume's file.
    pub(super) fn image_is_live(&self, record: &VolumeRecord, target: &Stat, data: &Path) -> bool {
        let Some(staged) = record.staging() else {
            return false;
        };
        let Some(device) = staged
            .loop_device
            .as_deref()
            .and_then(LoopDevice::from_name)
        else {
            return false;
        };
        let served = devices::serves_publication(&device, Some(staged), data);
        let on_device = encryption::filesystem_device(record, &device)
            .is_some_and(|(_, dev)| dev == target.dev);
        served && on_device && target.is_dir() && target.is_mount_root
    }

    /// Grows a staged image volume's filesystem to its file's new size (NodeExpandVolume); an
    /// unstaged one grows when next staged.
    pub(super) fn grow_staged(&self, record: &VolumeRecord, fs: FsType) -> Result<()> {
        let Some(staged) = record.staging() else {
            return Ok(());
        };
        if !self.is_live(record, staged)? {
            return Ok(());
        }
        let device = staged
            .loop_device
            .as_deref()
            .and_then(LoopDevice::from_name)
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "volume {} is staged without a recorded loop device",
                    record.id
                ))
            })?;
        self.resize_encrypted(record)?;
        let (fs_device, _) = encryption::filesystem_device(record, &device).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "volume {} is staged, but its encryption is not open over {}",
                record.id,
                device.path().display()
            ))
        })?;
        fsimage::grow(fs, &fs_device, &staged.target).map_err(|err| {
            let what = format!(
                "growing the {} filesystem of volume {} at {}",
                fs.name(),
                record.id,
                staged.target.display()
            );
            match err.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    Error::FailedPrecondition(format!("{what}: {err}"))
                }
                _ => Error::host(what, err),
            }
        })
    }

    /// The image volume's staging, if its filesystem is mounted read-write now. Never another
    /// kind's: an encrypted block volume's staging path is a plain directory of kubelet's, and
    /// freezing "its filesystem" would freeze the node's.
    fn staged_writable<'a>(&self, record: &'a VolumeRecord) -> Option<&'a Publication> {
        record.kind.image_fs()?;
        record
            .staging()
            .filter(|staged| !staged.readonly && self.is_live(record, staged).unwrap_or(false))
    }

    /// A consistent copy of an image in use freezes its filesystem for as long as the copy
    /// takes: an instant with a reflink, seconds per GiB on a pool that copies data in full,
    /// every writer blocked meanwhile. The latter is refused (FAILED_PRECONDITION), saying what
    /// to do instead; `what` is the operation ("snapshot", "copy").
    pub(crate) fn refuse_frozen_full_copy(&self, record: &VolumeRecord, what: &str) -> Result<()> {
        if self.staged_writable(record).is_none() {
            return Ok(());
        }
        let pool = self.pool_of(record)?;
        if pool.cow != Mechanism::Copy {
            return Ok(());
        }
        Err(Error::FailedPrecondition(format!(
            "volume {} is in use (its filesystem is mounted read-write) in pool {}, which cannot copy a file by reference (no reflinks): a consistent {what} would hold its filesystem frozen, and every writer blocked, for the whole copy of its data; take it while no pod uses the volume, or use a pool with reflinks (XFS with reflink=1, btrfs)",
            record.id, pool.name
        )))
    }

    /// The root of the image volume's staged filesystem, opened to be frozen (a real
    /// descriptor, not O_PATH: FIFREEZE is an ioctl on it), if it has writers to hold: None
    /// for other volumes, unstaged images and those staged read-only.
    pub(super) fn root_to_freeze(&self, record: &VolumeRecord) -> Result<Option<std::fs::File>> {
        let Some(staged) = self.staged_writable(record) else {
            return Ok(None);
        };
        std::fs::File::open(&staged.target)
            .map(Some)
            .context(|| format!("opening {}", staged.target.display()))
    }

    /// Runs `copy` with the image volume's staged filesystem frozen, so a copy of its file is
    /// what a crash at that instant would have left (journal replayed at its next mount).
    /// Other volumes, and unstaged images, are copied as they are. `copy` copies and no more:
    /// the caller flushes the pool once this returns, thawed.
    pub(crate) fn with_frozen<T>(
        &self,
        record: &VolumeRecord,
        copy: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let Some(staged) = self.staged_writable(record) else {
            return copy();
        };
        self.refuse_frozen_full_copy(record, "copy")?;
        // The copy's walk slot before the freeze, never after: with every slot busy, waiting
        // for one frozen would block the volume's writers for the whole wait.
        let Some(_slot) = node_walk() else {
            return Err(Error::host(
                format!("waiting to copy volume {}", record.id),
                caller_gone(),
            ));
        };
        // A real descriptor (not O_PATH): FIFREEZE is an ioctl on the mount's root.
        let root = std::fs::File::open(&staged.target)
            .context(|| format!("opening {}", staged.target.display()))?;
        // Thawed when dropped: a panic in the copy thaws it too.
        let frozen = fsimage::Frozen::freeze(root).context(|| {
            format!(
                "freezing the filesystem of volume {} at {}",
                record.id,
                staged.target.display()
            )
        })?;
        let copied = copy();
        if let Err(err) = frozen.thaw() {
            // Left frozen, every writer of the volume would hang: say so loudly.
            tracing::error!(volume = %record.id, staging = %staged.target.display(), error = %err, "could not thaw the filesystem after copying it; its writers are blocked until `fsfreeze -u` is run on the node");
            return Err(Error::host(
                format!("thawing the filesystem of volume {}", record.id),
                err,
            ));
        }
        copied
    }
}

impl Volumes {
    /// NodeGetVolumeStats of an image volume: its own filesystem's figures (statfs, O(1)),
    /// abnormal when the filesystem cannot answer or recorded errors.
    pub(super) fn image_stats(
        &self,
        record: &VolumeRecord,
        fs: FsType,
        publication: &Publication,
        data: &Path,
    ) -> Result<VolumeStats> {
        let id = &record.id;
        let file = fsstat::lstat(data).context(|| format!("inspecting {}", data.display()))?;
        self.pool_of(record)?.set_used(id, file.allocated);
        let space = match fsstat::space(&publication.target) {
            Ok(space) => space,
            // XFS shuts down on corruption and answers EIO from then on.
            Err(err) => {
                return Ok(VolumeStats {
                    bytes: Amounts {
                        total: record.capacity_bytes as u64,
                        used: 0,
                        available: 0,
                    },
                    inodes: None,
                    condition: Condition::from_problem(Some(format!(
                        "the {} filesystem of volume {id} does not answer ({err}); it may be damaged",
                        fs.name()
                    ))),
                });
            }
        };
        let errors = record
            .staging()
            .and_then(|staged| staged.loop_device.as_deref())
            .and_then(|device| encryption::top_device_name(record, device))
            .and_then(|device| fsimage::error_count(fs, &device))
            .filter(|count| *count > 0);
        let problem = errors.map(|count| {
            format!(
                "the {} filesystem of volume {id} recorded {count} errors; unstage it and run fsck",
                fs.name()
            )
        });
        let starved = self.pool_of(record)?.starves(id, file.allocated, file.size);
        let problem = super::joined(problem, starved);
        Ok(VolumeStats {
            bytes: Amounts {
                total: space.total_bytes,
                used: space.total_bytes.saturating_sub(space.available_bytes),
                available: space.available_bytes,
            },
            inodes: Some(Amounts {
                total: space.total_inodes,
                used: space.total_inodes.saturating_sub(space.available_inodes),
                available: space.available_inodes,
            }),
            condition: Condition::from_problem(problem),
        })
    }
}

/// The loop device behind the mount whose root is `mounted`, if it is volume `record`'s image:
/// the recorded staging device, or (a stage interrupted before recording) any device over
/// the image, whose number the mount shows.
fn image_device(record: &VolumeRecord, data: &Path, mounted: &Stat) -> Option<LoopDevice> {
    let recorded = record
        .staging()
        .and_then(|p| p.loop_device.as_deref())
        .and_then(LoopDevice::from_name);
    recorded
        .into_iter()
        .chain(devices::serving(data).unwrap_or_default())
        .filter(|device| devices::serves_publication(device, record.staging(), data))
        .find(|device| {
            encryption::filesystem_device(record, device).is_some_and(|(_, dev)| dev == mounted.dev)
        })
}

/// Whether volume `record` has nothing to stage: a directory, or a block volume that is not
/// encrypted (an encrypted one needs its key, which only the stage has).
fn stages_nothing(record: &VolumeRecord) -> bool {
    record.kind.image_fs().is_none() && record.encryption.is_none()
}

/// An unstage for a volume we do not know: succeed unless a mount stands there.
fn refuse_unknown_mount(at: &Target<'_>) -> Result<()> {
    match at.stat()? {
        Some(stat) if stat.is_mount_root => Err(Error::FailedPrecondition(format!(
            "{} is mounted but its volume is unknown to stickyvol; refusing to unmount what we did not mount",
            at.path.display()
        ))),
        _ => Ok(()),
    }
}
