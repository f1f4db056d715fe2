//! NodePublishVolume and NodeUnpublishVolume.
//!
//! The host is the truth, the record a memo: a publish retried after a crash finds its mount (or
//! symlink) already in place and adopts it; an unpublish finds it gone and just tidies up. Every
//! step is idempotent because kubelet retries "uncertain" calls with the same arguments.
//!
//! The target's parent is opened and checked once, and everything after acts relative to that
//! descriptor (`target::Target`).
//!
//! Filesystem volumes: the volume directory is bind-mounted at the target, with the requested
//! flags from the start (`mount::bind_onto`). Block volumes: the target is a symlink to a loop
//! device over the volume's file; kubelet follows it. One device per volume and read-only flag
//! is shared by all targets and detached when the last one goes.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use sys_mount::MountFlags;
use tracing::{info, warn};

use super::Volumes;
use super::capability::Capability;
use super::devices;
use super::state::id::VolumeId;
use super::state::record::{PodRef, Publication, VolumeKind, VolumeRecord};
use super::target::{MountPoint, Target, target_name};
use crate::error::{Error, IoContext, Result};
use crate::host::fsstat::{self, Stat};
use crate::host::{dirfd, loopdev, mount};

/// A validated NodePublishVolume request.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    pub target: PathBuf,
    pub capability: Capability,
    pub readonly: bool,
    /// The pod it is for, when kubelet says (`request::pod_info`).
    pub pod: Option<PodRef>,
}

impl Volumes {
    pub fn publish(&self, id: &VolumeId, req: PublishRequest) -> Result<()> {
        let _guard = self.claim(id)?;
        let record = self.get(id)?;
        usable(&record)?;
        let cap = &req.capability;
        check_capability(&record, cap, "published")?;
        let readonly = req.readonly || cap.access_mode.is_read_only();
        let wanted = Publication {
            target: req.target.clone(),
            readonly,
            access_mode: cap.access_mode,
            mount_flags: cap.mount_flags.clone(),
            loop_device: None,
            loop_backing_file: None,
            staging: false,
            pod: req.pod.clone(),
        };
        let mut known = None;
        for other in record.pod_publications() {
            let live = self.is_live(&record, other)?;
            if other.target == wanted.target {
                if live && !other.same_request(&wanted) {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is already published at {} with a different capability or read-only flag",
                        wanted.target.display()
                    )));
                }
                known = Some(other.clone());
            } else if live
                && !readonly
                && !other.readonly
                && (cap.access_mode.is_single_writer() || other.access_mode.is_single_writer())
            {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} allows a single writer and is already published read-write at {}",
                    other.target.display()
                )));
            }
        }
        let target = wanted.target.clone();
        let parent = self.open_target_parent(&target)?;
        let at = Target {
            parent: Some(parent.as_fd()),
            name: target_name(&target)?,
            path: &target,
        };

        let published = self.mount_publication(&record, &at, wanted, known.as_ref(), cap)?;
        if record.publication(&published.target) != Some(&published) {
            let mut updated = (*record).clone();
            updated
                .publications
                .retain(|p| p.target != published.target);
            updated.publications.push(published.clone());
            self.store
                .put(updated)
                .context(|| format!("recording the publication of volume {id}"))?;
        }
        // After the record: a publish that fails here is retried, and adopts the mount.
        self.limit_pod_io(&record, &published)?;
        info!(volume = %id, target = %published.target.display(), readonly, "published volume");
        Ok(())
    }

    /// Mounts (or links) the volume at the target `wanted` names; the publication to record.
    fn mount_publication(
        &self,
        record: &VolumeRecord,
        at: &Target<'_>,
        wanted: Publication,
        known: Option<&Publication>,
        cap: &Capability,
    ) -> Result<Publication> {
        let data = self.data_path(record)?;
        let id = &record.id;
        Ok(match record.kind {
            VolumeKind::Filesystem => {
                // A fenced volume is mounted read-only whatever was asked (see `fence`); the
                // record keeps the request, so lifting the fence knows which mounts write.
                let mount_as = Publication {
                    readonly: wanted.readonly || record.fenced.is_some(),
                    ..wanted.clone()
                };
                self.publish_directory(id, &data, at, &mount_as, cap)?;
                wanted
            }
            VolumeKind::Block => self.publish_device(id, record, &data, at, wanted, known)?,
            // A bind of the node's one mount of the image's filesystem.
            VolumeKind::Image(_) => {
                let root = self.staged_root(record)?;
                self.publish_directory(id, &root, at, &wanted, cap)?;
                wanted
            }
        })
    }

    /// Removes the publication at `target`; succeeds when there is nothing (left) to undo.
    pub fn unpublish(&self, id: Option<&VolumeId>, target: &Path) -> Result<()> {
        let parent = self.open_existing_target_parent(target)?;
        let at = Target {
            parent: parent.as_ref().map(|fd| fd.as_fd()),
            name: target_name(target)?,
            path: target,
        };
        let Some(id) = id else {
            return unpublish_unknown(&at);
        };
        let _guard = self.claim(id)?;
        // Looked up under the guard: a DeleteVolume that just finished makes this volume unknown.
        let Some(record) = self.store.get(id) else {
            return unpublish_unknown(&at);
        };
        // A volume whose pool is not configured now: kubelet must still be able to finish a
        // pod's teardown when nothing is mounted any more.
        let Ok(data) = self.data_path(&record) else {
            return unpublish_unknown(&at);
        };
        match record.kind {
            VolumeKind::Filesystem => unpublish_directory(id, source_of(&data)?, &at)?,
            VolumeKind::Block => self.unpublish_device(id, &record, &data, &at)?,
            VolumeKind::Image(_) => {
                // The pod's bind shows the staging mount's root; with no staging mount left
                // (unstaged out of order) there is nothing to compare with.
                let root = self.staged_root(&record).ok();
                let source = root.as_deref().map(source_of).transpose()?.flatten();
                unpublish_directory(id, source, &at)?
            }
        }
        if record.publication(target).is_some() {
            let mut updated = (*record).clone();
            updated.publications.retain(|p| p.target != target);
            // The host is clean, which is what kubelet waits for; a stale entry in the record
            // is harmless (liveness is always checked on the host) and dropped at next start.
            // Failing here, e.g. on a full disk, would leave the pod Terminating forever.
            if let Err(err) = self.store.put(updated) {
                warn!(volume = %id, target = %target.display(), error = %err, "unpublished, but could not update the record");
            }
        }
        info!(volume = %id, target = %target.display(), "unpublished volume");
        Ok(())
    }

    /// Targets where the host still shows the volume published.
    pub(super) fn live_targets(&self, record: &VolumeRecord) -> Result<Vec<PathBuf>> {
        let mut live = Vec::new();
        for publication in &record.publications {
            if self.is_live(record, publication)? {
                live.push(publication.target.clone());
            }
        }
        Ok(live)
    }

    /// Whether `publication` is still in place on the host.
    pub(super) fn is_live(&self, record: &VolumeRecord, publication: &Publication) -> Result<bool> {
        let data = self.data_path(record)?;
        let context = || {
            format!(
                "inspecting {} of volume {}",
                publication.target.display(),
                record.id
            )
        };
        let Some(target) = fsstat::lstat_if_exists(&publication.target).context(context)? else {
            return Ok(false);
        };
        match record.kind {
            VolumeKind::Filesystem => Ok(is_bind_of(&target, &data).context(context)?),
            VolumeKind::Image(_) => Ok(self.image_is_live(record, &target, &data)),
            VolumeKind::Block if record.encryption.is_some() => {
                Ok(self.encrypted_block_is_live(record, publication, &target, &data))
            }
            VolumeKind::Block => {
                let Some(device) = publication
                    .loop_device
                    .as_deref()
                    .and_then(loopdev::LoopDevice::from_name)
                else {
                    return Ok(false);
                };
                Ok(target.is_symlink()
                    && fs::read_link(&publication.target).ok() == Some(device.path())
                    && devices::serves_publication(&device, Some(publication), &data))
            }
        }
    }

    fn publish_directory(
        &self,
        id: &VolumeId,
        data: &Path,
        at: &Target<'_>,
        wanted: &Publication,
        cap: &Capability,
    ) -> Result<()> {
        let target = at.path;
        let source = fsstat::lstat(data).map_err(|err| missing_data(id, data, err))?;
        let flags = bind_flags(cap, wanted.readonly, data)?;
        if !source.is_dir() {
            return Err(Error::FailedPrecondition(format!(
                "data of volume {id} at {} is not a directory",
                data.display()
            )));
        }
        let (directory, created) = match at.mount_point("target")? {
            MountPoint::Made(fd) => (fd, true),
            MountPoint::Empty(fd) => (fd, false),
            MountPoint::Mounted(fd, stat) => {
                if !stat.same_file(&source) {
                    return Err(Error::AlreadyExists(format!(
                        "target {} already has something else mounted",
                        target.display()
                    )));
                }
                // Our mount from an earlier, interrupted attempt: make its flags right and adopt it.
                let flags_ok = mount::has_flags(&dirfd::fd_path(fd.as_fd()), flags)
                    .context(|| format!("statvfs {}", target.display()))?;
                if !flags_ok {
                    mount::set_flags_on(fd.as_fd(), flags)
                        .context(|| format!("remounting {} for volume {id}", target.display()))?;
                }
                return Ok(());
            }
        };
        let mounted = mount::bind_onto(data, directory.as_fd(), flags)
            .context(|| format!("bind-mounting volume {id} at {}", target.display()));
        if mounted.is_err() && created {
            // A failed publish leaves nothing behind for kubelet to trip over.
            let _ = dirfd::remove_dir_at(at.parent()?, at.name);
        }
        mounted
    }

    fn publish_device(
        &self,
        id: &VolumeId,
        record: &VolumeRecord,
        data: &Path,
        at: &Target<'_>,
        mut wanted: Publication,
        known: Option<&Publication>,
    ) -> Result<Publication> {
        if record.encryption.is_some() {
            let (wanted, mapping) = self.publish_encrypted_block(record, wanted)?;
            link_device(at, &mapping)?;
            return Ok(wanted);
        }
        let target = wanted.target.clone();
        let source = fsstat::lstat(data).map_err(|err| missing_data(id, data, err))?;
        if !source.is_regular_file() {
            return Err(Error::FailedPrecondition(format!(
                "data of volume {id} at {} is not a regular file",
                data.display()
            )));
        }
        // Reuse the device that already serves this volume with the same read-only flag.
        let shared = record
            .publications
            .iter()
            .chain(known)
            .filter(|p| p.readonly == wanted.readonly)
            .filter_map(|p| {
                p.loop_device
                    .as_deref()
                    .and_then(loopdev::LoopDevice::from_name)
            })
            .find(|device| devices::serves(device, data))
            .or_else(|| linked_device(at, data, wanted.readonly));
        let device = match shared {
            Some(device) => device,
            None => self.attach_device(id, data, wanted.readonly)?,
        };
        wanted.loop_device = Some(device.name().to_string());
        wanted.loop_backing_file = Some(source.id());
        // Any failure from here on must not leave the device we may just have attached behind.
        if let Err(err) = link_device(at, &device.path()) {
            self.release_device_if_unused(record, &device, &target);
            return Err(err);
        }
        Ok(wanted)
    }

    fn attach_device(
        &self,
        id: &VolumeId,
        data: &Path,
        readonly: bool,
    ) -> Result<loopdev::LoopDevice> {
        // No scan of every loop device for one already serving the volume (~35 µs per device
        // on each publish): one left by a crash is detached at the next start, and one left by a
        // publish that failed after linking is found at its target (`linked_device`).
        let device = loopdev::attach(data, readonly)
            .context(|| format!("attaching a loop device to volume {id}"))?;
        info!(volume = %id, device = %device.path().display(), readonly, direct_io = loopdev::uses_direct_io(&device).unwrap_or(false), "attached loop device");
        Ok(device)
    }

    fn unpublish_device(
        &self,
        id: &VolumeId,
        record: &VolumeRecord,
        data: &Path,
        at: &Target<'_>,
    ) -> Result<()> {
        let target = at.path;
        let device = match at.stat()? {
            None => None,
            Some(stat) if stat.is_symlink() => {
                let device = at
                    .read_link()
                    .and_then(|link| loopdev::LoopDevice::from_path(&link));
                at.remove_file()?;
                device
            }
            Some(stat) if stat.is_dir() && !stat.is_mount_root => {
                at.remove_empty_dir()?;
                None
            }
            // The placeholders publish accepts (and replaces) are tidied the same way.
            Some(stat) if stat.is_regular_file() && stat.size == 0 => {
                at.remove_file()?;
                None
            }
            Some(_) => {
                return Err(Error::FailedPrecondition(format!(
                    "target {} of volume {id} is not a symlink we made; leaving it alone",
                    target.display()
                )));
            }
        };
        let publication = record.publication(target);
        let recorded = publication
            .and_then(|p| p.loop_device.as_deref())
            .and_then(loopdev::LoopDevice::from_name);
        for device in device.into_iter().chain(recorded) {
            if devices::serves_publication(&device, publication, data) {
                self.release_device_if_unused(record, &device, target);
            }
        }
        Ok(())
    }

    /// Detaches `device` unless another publication than `target` still uses it.
    fn release_device_if_unused(
        &self,
        record: &VolumeRecord,
        device: &loopdev::LoopDevice,
        target: &Path,
    ) {
        let in_use = record
            .publications
            .iter()
            .any(|p| p.target != target && p.loop_device.as_deref() == Some(device.name()));
        if in_use {
            return;
        }
        match loopdev::detach(device) {
            Ok(()) => {
                info!(volume = %record.id, device = %device.path().display(), "detached loop device")
            }
            Err(err) => {
                warn!(volume = %record.id, device = %device.path().display(), error = %err, "could not detach loop device; it is retried at next unpublish or start")
            }
        }
    }
}

/// What a bind of `data` shows at its root, if `data` exists.
fn source_of(data: &Path) -> Result<Option<Stat>> {
    fsstat::lstat_if_exists(data).context(|| format!("inspecting {}", data.display()))
}

/// Unmounts the bind mounts at `at` that show `source` (any, when the source is gone).
fn unpublish_directory(id: &VolumeId, source: Option<Stat>, at: &Target<'_>) -> Result<()> {
    let target = at.path;
    // Stacked mounts (a retried publish that raced) are all ours to remove.
    while let Some(stat) = at.stat()? {
        if !stat.is_mount_root {
            if stat.is_dir() {
                at.remove_empty_dir()?;
            } else if stat.is_symlink() {
                at.remove_file()?;
            }
            return Ok(());
        }
        if source.as_ref().is_some_and(|s| !s.same_file(&stat)) {
            return Err(Error::FailedPrecondition(format!(
                "target {} has a mount that is not volume {id}; leaving it alone",
                target.display()
            )));
        }
        // Looked up from the checked parent: never a mount a swapped path leads to.
        mount::unmount_at(at.parent()?, at.name)
            .context(|| format!("unmounting volume {id} from {}", target.display()))?;
    }
    Ok(())
}

/// The device `at` already links to, if it serves the volume's `data` with the read-only
/// flag wanted: what a publish that linked but failed to record leaves for its retry.
fn linked_device(at: &Target<'_>, data: &Path, readonly: bool) -> Option<loopdev::LoopDevice> {
    let device = loopdev::LoopDevice::from_path(&at.read_link()?)?;
    (devices::serves(&device, data) && loopdev::is_read_only(&device).ok() == Some(readonly))
        .then_some(device)
}

/// Makes `at` a symlink to `device`, replacing an empty placeholder or another link; Ok if
/// it already is one.
fn link_device(at: &Target<'_>, device: &Path) -> Result<()> {
    let target = at.path;
    match at.stat()? {
        Some(stat) if stat.is_symlink() => {
            if at.read_link().as_deref() == Some(device) {
                return Ok(());
            }
            // Kubelet's block target belongs to one PV and one pod, so a link there to another
            // device is stale: e.g. a reboot renumbered the devices, and the old number may now
            // serve another volume.
            at.remove_file()?;
        }
        // A placeholder a CO may have created (an empty directory or file): replace it.
        Some(stat) if stat.is_dir() && !stat.is_mount_root => {
            dirfd::remove_dir_at(at.parent()?, at.name)
                .context(|| format!("replacing the directory {}", target.display()))?;
        }
        Some(stat) if stat.is_regular_file() && stat.size == 0 => at.remove_file()?,
        Some(_) => {
            return Err(Error::FailedPrecondition(format!(
                "target {} exists and is neither a symlink nor an empty placeholder",
                target.display()
            )));
        }
        None => {}
    }
    dirfd::symlink_at(device, at.parent()?, at.name)
        .context(|| format!("linking {} to {}", target.display(), device.display()))
}

/// The flags for a bind of `data`: the ones asked for, plus those the data's own mount has (a
/// remount replaces the whole set), except atime flags when an atime option was asked for.
fn bind_flags(cap: &Capability, readonly: bool, data: &Path) -> Result<MountFlags> {
    let requested = cap.bind_flags(readonly);
    let mut inherited =
        mount::inherited_flags(data).context(|| format!("statvfs {}", data.display()))?;
    if requested.intersects(MountFlags::NOATIME | MountFlags::RELATIME | MountFlags::STRICTATIME) {
        inherited.remove(MountFlags::NOATIME | MountFlags::RELATIME);
    }
    Ok(requested | inherited)
}

/// Why volume `record` cannot be staged or published now, if it cannot.
pub(super) fn usable(record: &VolumeRecord) -> Result<()> {
    let id = &record.id;
    if let Some(orphaned) = &record.orphaned {
        return Err(Error::FailedPrecondition(format!(
            "volume {id} is orphaned (PV {} was gone); its data is in {}",
            orphaned.pv_name,
            orphaned.lost_path.display()
        )));
    }
    if record.importing {
        // Partial content: emptied in the background after a restart (`transfer`).
        return Err(Error::Pending(format!(
            "volume {id} (an interrupted import's partial content is being removed; if this lasts, see the driver's log)"
        )));
    }
    Ok(())
}

/// Why `record` cannot be `used` (staged, published) as `cap` asks, if it cannot.
pub(super) fn check_capability(record: &VolumeRecord, cap: &Capability, used: &str) -> Result<()> {
    if !record.kind.serves(cap.kind) {
        return Err(Error::InvalidArgument(format!(
            "volume {} is a {} volume and cannot be {used} with {} access",
            record.id,
            record.kind.as_str(),
            cap.kind.as_str()
        )));
    }
    match cap.unsupported_reason(record.is_shared()) {
        Some(reason) => Err(Error::InvalidArgument(reason)),
        None => Ok(()),
    }
}

/// Unpublishing a volume we do not know: succeed unless that would hide a live mount.
fn unpublish_unknown(at: &Target<'_>) -> Result<()> {
    match at.stat()? {
        None => Ok(()),
        Some(stat) if stat.is_mount_root => Err(Error::FailedPrecondition(format!(
            "{} is mounted but its volume is unknown to stickyvol; refusing to unmount what we did not mount",
            at.path.display()
        ))),
        Some(stat) if stat.is_dir() => at.remove_empty_dir(),
        Some(stat) if stat.is_symlink() => at.remove_file(),
        Some(_) => Ok(()),
    }
}

/// A directory bind mount shows its source's device and inode at the mount root.
fn is_bind_of(target: &Stat, data: &Path) -> io::Result<bool> {
    if !target.is_dir() || !target.is_mount_root {
        return Ok(false);
    }
    Ok(fsstat::lstat_if_exists(data)?.is_some_and(|source| source.same_file(target)))
}

pub(super) fn missing_data(id: &VolumeId, data: &Path, err: io::Error) -> Error {
    if err.kind() == io::ErrorKind::NotFound {
        Error::FailedPrecondition(format!(
            "data of volume {id} is missing at {}",
            data.display()
        ))
    } else {
        Error::host(format!("inspecting {}", data.display()), err)
    }
}

impl Volumes {
    /// Whether the host shows the volume published at any target.
    pub fn has_live_publication(&self, record: &VolumeRecord) -> bool {
        record
            .publications
            .iter()
            .any(|p| self.is_live(record, p).unwrap_or(false))
    }
}
