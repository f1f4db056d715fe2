//! Which loop devices serve which block volume.
//!
//! A device serves a volume when it is attached to the volume's data file itself: same device
//! and inode numbers (see `loopdev::backing_file_id`). Never by path alone: loop devices are
//! kernel-wide, and two nodes of a test cluster on one kernel (every multi-node kind cluster)
//! each keep their data dir at the same path in their own mount namespace, so another node's
//! device shows a backing path inside our pool — with a volume id we may even know.
//!
//! The backing path's file name, `<volume-id>.img`, still says cheaply which devices are worth
//! asking (the directories may differ: the kernel prints the path as it reads in the namespace
//! holding the file, e.g. a driver container's view before a restart).
//!
//! A publication records the identity of the file its device was attached to, so the device is
//! still recognised after that file was deleted: the device holds the inode, whose number no
//! other file can take meanwhile.

use std::io;
use std::path::Path;

use super::state::id::VolumeId;
use super::state::record::Publication;
use crate::host::fsstat;
use crate::host::loopdev::{self, LoopDevice};

/// The volume whose data file `backing_file` may be, by its name: a candidate for
/// [`serves`], never proof.
pub fn volume_named_by_backing_file(backing_file: &Path) -> Option<VolumeId> {
    let name = backing_file.file_name()?.to_str()?;
    VolumeId::parse(name.strip_suffix(".img")?)
}

/// Whether `device` is attached to the block volume data file `data` (this node's file).
pub fn serves(device: &LoopDevice, data: &Path) -> bool {
    loopdev::is_attached_to(device, data).unwrap_or(false)
}

/// Whether `device` is the one behind `publication` of the volume whose data file is `data`:
/// attached to the file the publication recorded, or to `data` itself.
pub fn serves_publication(
    device: &LoopDevice,
    publication: Option<&Publication>,
    data: &Path,
) -> bool {
    let Ok(Some(backing)) = loopdev::backing_file_id(device) else {
        return false;
    };
    publication.and_then(|p| p.loop_backing_file) == Some(backing)
        || fsstat::file_id(data).is_ok_and(|ours| ours == backing)
}

/// Every loop device attached to the block volume data file `data` (this node's file).
pub fn serving(data: &Path) -> io::Result<Vec<LoopDevice>> {
    loopdev::find_by_backing_file(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_file_names_point_at_a_volume_whatever_the_directories() {
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        for path in [
            format!("/var/lib/kubelet/volumes/stickyvol.csi.io/volumes/{id}.img"),
            format!("/volumes/stickyvol.csi.io/volumes/{id}.img"),
        ] {
            assert_eq!(
                volume_named_by_backing_file(Path::new(&path)),
                Some(id.clone()),
                "{path}"
            );
        }
        for path in [
            format!("/x/{id}"),
            format!("/x/{id}.img.bak"),
            // Deleted while attached: no file of ours to compare it with any more.
            format!("/x/{id}.img (deleted)"),
            "/x/disk.img".to_string(),
            format!("/x/{id}.IMG"),
        ] {
            assert_eq!(
                volume_named_by_backing_file(Path::new(&path)),
                None,
                "{path}"
            );
        }
    }
}
