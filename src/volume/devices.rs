//! Which loop devices serve which block volume.
//!
//! A device is matched by its backing file's *name*, `<volume-id>.img` (ids are unique), not by
//! its full path: the kernel prints that path as seen from the mount namespace that attached
//! the device, so after the driver's container restarts, the same device may report
//! `/volumes/…/sv-….img` instead of `/var/lib/kubelet/volumes/…/sv-….img`. A file deleted while
//! attached is reported with a " (deleted)" suffix and still matches.

use std::io;
use std::path::Path;

use super::id::VolumeId;
use crate::host::loopdev::{self, LoopDevice};

/// The volume whose data file is `backing_file`, if its name is one of ours.
pub fn volume_of_backing_file(backing_file: &Path) -> Option<VolumeId> {
    let name = backing_file.file_name()?.to_str()?;
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    VolumeId::parse(name.strip_suffix(".img")?)
}

/// Whether `device` is attached to the data file of volume `id`.
pub fn serves(device: &LoopDevice, id: &VolumeId) -> bool {
    matches!(loopdev::backing_file(device), Ok(Some(file)) if volume_of_backing_file(&file).as_ref() == Some(id))
}

/// Every loop device attached to the data file of volume `id`.
pub fn serving(id: &VolumeId) -> io::Result<Vec<LoopDevice>> {
    Ok(loopdev::list_attached()?
        .into_iter()
        .filter(|(_, file)| volume_of_backing_file(file).as_ref() == Some(id))
        .map(|(device, _)| device)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_files_are_matched_by_name_in_any_namespace() {
        let id = VolumeId::generate(&crate::volume::id::NodeTag::of("test"));
        for path in [
            format!("/var/lib/kubelet/volumes/stickyvol.csi.io/volumes/{id}.img"),
            format!("/volumes/stickyvol.csi.io/volumes/{id}.img"),
            format!("/x/{id}.img (deleted)"),
        ] {
            assert_eq!(
                volume_of_backing_file(Path::new(&path)),
                Some(id.clone()),
                "{path}"
            );
        }
        for path in [
            format!("/x/{id}"),
            format!("/x/{id}.img.bak"),
            "/x/disk.img".to_string(),
            format!("/x/{id}.IMG"),
        ] {
            assert_eq!(volume_of_backing_file(Path::new(&path)), None, "{path}");
        }
    }
}
