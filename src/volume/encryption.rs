//! Encrypted volumes (StorageClass `encryption: luks2`): a LUKS2 device (dm-crypt) between the
//! volume's loop device and an image's filesystem, or a block volume's pod
//! (`encrypted_block`), so the file in the pool holds only ciphertext.
//!
//! The key is NodeStageVolume's, from the class's node-stage Secret (`SECRET_KEY`); CreateVolume
//! has none, so it makes the file only, and the first stage formats the header and makes the
//! filesystem inside (`format_encrypted`, recorded as `Luks::formatted`). Every stage opens the
//! device as a mapping named after the volume (`mapping_name`): a restarted driver finds it
//! without the key, and an unstage closes it. Deleting the volume zeroes its header and key
//! slots before the file goes (`erase`), so what lingers of the file's blocks is unreadable.
//! Snapshots, restores and clones copy the ciphertext, header and all: a copy opens with the same
//! key. Exports (and so moves between nodes) are refused: see `refuse_stream`.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::Volumes;
use super::state::id::VolumeId;
use super::state::record::{FsType, Luks, VolumeRecord};
use crate::error::{Error, IoContext, Result};
use crate::host::crypt::{self, Key};
use crate::host::fsimage;
use crate::host::loopdev::{self, LoopDevice};

/// The entry of the node-stage Secret that holds an encrypted volume's key.
pub const SECRET_KEY: &str = "key";

/// The device-mapper name of volume `id`'s open LUKS device.
pub fn mapping_name(id: &VolumeId) -> String {
    format!("stickyvol-{id}")
}

/// The block device an image volume's filesystem is on, over `loop_device`: the loop device
/// itself, or the volume's open mapping over it; with its device number. None when an
/// encrypted volume's mapping is not open over that loop device.
pub(super) fn filesystem_device(
    record: &VolumeRecord,
    loop_device: &LoopDevice,
) -> Option<(PathBuf, (u32, u32))> {
    if record.encryption.is_none() {
        let dev = loopdev::device_number(loop_device).ok()?;
        return Some((loop_device.path(), dev));
    }
    let name = mapping_name(&record.id);
    let mapping = crypt::mapping(&name)?;
    mapping
        .below
        .iter()
        .any(|below| below == loop_device.name())
        .then(|| (crypt::mapper_path(&name), mapping.dev))
}

/// The kernel's name of the device a volume's users do their IO on, over `loop_device` (e.g.
/// "loop3", or "dm-0" for an encrypted volume's mapping): where an image's filesystem keeps its
/// counters (`/sys/fs/ext4/<name>`) and where a pod's IO limits go.
pub(super) fn top_device_name(record: &VolumeRecord, loop_device: &str) -> Option<String> {
    match record.encryption {
        None => Some(loop_device.to_string()),
        Some(_) => crypt::mapping(&mapping_name(&record.id)).map(|m| m.kernel_name),
    }
}

/// Zeroes the LUKS header of the file at `path`, if it is a file that has one; anything else
/// (a directory, nothing, a symlink) is left as it is. Never follows a symlink.
pub(super) fn erase(path: &Path) -> io::Result<()> {
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::ENOENT | libc::EISDIR | libc::ELOOP)
            ) =>
        {
            return Ok(());
        }
        Err(err) => return Err(err),
    };
    if !file.metadata()?.is_file() {
        return Ok(());
    }
    if crypt::erase_header(&file)? {
        info!(path = %path.display(), "erased the encryption header and key slots");
    }
    Ok(())
}

impl Volumes {
    /// The first stage of an encrypted volume: formats its LUKS header with `key`, makes an
    /// image's filesystem `fs` inside, and records that it did. Only for a volume not formatted
    /// yet, so it never meets data (a crash midway leaves it unformatted: the next stage starts
    /// over).
    pub(super) fn format_encrypted(
        &self,
        record: &VolumeRecord,
        fs: Option<FsType>,
        data: &Path,
        key: Option<&Key>,
    ) -> Result<Arc<VolumeRecord>> {
        let id = &record.id;
        let key = key.ok_or_else(|| missing_key(id))?;
        let device =
            loopdev::attach(data, false).context(|| format!("attaching volume {id} to format"))?;
        let name = mapping_name(id);
        let made = crypt::format(&device.path(), key)
            .and_then(|()| crypt::open(&device.path(), &name, key, false))
            .and_then(|mapped| fs.map_or(Ok(()), |fs| fsimage::format(&mapped, fs)));
        let closed = crypt::close(&name);
        if let Err(err) = loopdev::detach(&device) {
            warn!(volume = %id, device = %device.path().display(), error = %err, "could not detach the loop device used to format; it is detached at next start");
        }
        let what = fs.map_or("device", FsType::name);
        made.and(closed)
            .context(|| format!("making the encrypted {what} of volume {id}"))?;
        let formatted = self
            .store
            .put(VolumeRecord {
                encryption: Some(Luks { formatted: true }),
                ..record.clone()
            })
            .context(|| format!("recording the encryption of volume {id}"))?;
        info!(volume = %id, fs = what, "formatted an encrypted volume (LUKS2)");
        Ok(formatted)
    }

    /// Opens encrypted volume `record` over `loop_device` with `key`; the mapping's path. An open
    /// mapping over that device is used as it is (a restage while pods hold the filesystem);
    /// one over another device, left by a crash, is closed first.
    pub(super) fn open_encrypted(
        &self,
        record: &VolumeRecord,
        loop_device: &LoopDevice,
        key: Option<&Key>,
        readonly: bool,
    ) -> Result<PathBuf> {
        let id = &record.id;
        if let Some((path, _)) = filesystem_device(record, loop_device) {
            return Ok(path);
        }
        let name = mapping_name(id);
        crypt::close(&name).context(|| format!("closing a stale mapping {name}"))?;
        let key = key.ok_or_else(|| missing_key(id))?;
        crypt::open(&loop_device.path(), &name, key, readonly).map_err(|err| {
            Error::FailedPrecondition(format!(
                "cannot open the encryption of volume {id} with the key of its node-stage Secret (a restore or clone opens only with its source's key): {err}"
            ))
        })
    }

    /// Closes encrypted volume `id`'s mapping, if open (at unstage, before its loop device goes).
    pub(super) fn close_encrypted(&self, id: &VolumeId) -> Result<()> {
        crypt::close(&mapping_name(id)).context(|| format!("closing the encryption of volume {id}"))
    }

    /// Grows encrypted volume `record`'s mapping, if open, to its loop device's new size.
    pub(super) fn resize_encrypted(&self, record: &VolumeRecord) -> Result<()> {
        let name = mapping_name(&record.id);
        if record.encryption.is_none() || crypt::mapping(&name).is_none() {
            return Ok(());
        }
        crypt::resize(&name).context(|| format!("growing the encryption of volume {}", record.id))
    }
}

/// Export streams of an encrypted volume are refused: plaintext would leave the node's
/// encryption behind, and ciphertext could not be checked before its first mount.
pub(crate) fn refuse_stream(record: &VolumeRecord, what: &str) -> Result<()> {
    if record.encryption.is_none() {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "volume {} is encrypted: its data cannot be {what} as a stream (nor moved to another node this way); back it up through its mount (e.g. Velero's file-system backup) or with a snapshot on this node",
        record.id
    )))
}

fn missing_key(id: &VolumeId) -> Error {
    Error::InvalidArgument(format!(
        "volume {id} is encrypted: NodeStageVolume needs its key in the secrets, under {SECRET_KEY:?} (set csi.storage.k8s.io/node-stage-secret-name and -namespace in its StorageClass)"
    ))
}
