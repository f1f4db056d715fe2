//! A volume of a dead node's disk, taken in: the disk attached to this node and mounted (by an
//! operator) under the adopt directory, its pool's data for volume `source` is read as an
//! export stream and imported into a volume of this node. Nothing of that pool is trusted or
//! changed: its journal and records are never opened (they belong to the node that wrote
//! them, and its project ids may clash with ours), only the data file or tree, read the way an
//! export reads a tenant's tree (no link followed, no mount crossed). The import then checks
//! what it receives as it checks any stream: the kind and filesystem (given by the target,
//! which was made from the same class), the size, the checksum; an image is checked by its
//! filesystem's checker before the kernel first mounts it.
//!
//! Only root reaches the attached disk (no pod of this node has any of it mounted), so the
//! check of its path below cannot be raced by a tenant; the tree inside is read descriptor by
//! descriptor as every export reads one.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;

use nix::sys::stat::{SFlag, fstat};
use std::path::{Component, Path, PathBuf};

use super::transfer::image_of;
use crate::error::{Error, IoContext, Result};
use crate::host::archive::{self, ArchiveError, Summary};
use crate::host::dirfd;
use crate::volume::Volumes;
use crate::volume::space::pool::data_name;
use crate::volume::state::id::VolumeId;
use crate::volume::state::record::VolumeKind;

/// The directory of a pool's volume data, as every pool lays it out.
const VOLUMES_DIR: &str = "volumes";

/// `name` as one plain path component: what an operator names an attached disk's mount by.
pub fn disk_name_is_valid(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!(components.next(), Some(Component::Normal(_)))
        && components.next().is_none()
        && !name.contains('/')
        && name.len() <= 255
}

/// Where volume `source`'s data sits in the foreign pool at `pool_root`, checked component by
/// component: a symlink at `volumes` or at the data's name is refused, never followed, and the
/// data must be what a volume of `kind` keeps (a directory, or an image file).
fn foreign_data(pool_root: &Path, source: &VolumeId, kind: VolumeKind) -> Result<PathBuf> {
    let name = data_name(source, kind);
    let is = |fd: &std::os::fd::OwnedFd, wanted: SFlag| -> io::Result<bool> {
        let stat = fstat(fd.as_fd())?;
        Ok(SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == wanted)
    };
    let found = || -> io::Result<Option<bool>> {
        let root = dirfd::open_dir(pool_root)?;
        let Some(volumes) = dirfd::open_at(root.as_fd(), OsStr::new(VOLUMES_DIR))? else {
            return Ok(None);
        };
        if !is(&volumes, SFlag::S_IFDIR)? {
            return Ok(Some(false));
        }
        let Some(data) = dirfd::open_at(volumes.as_fd(), OsStr::new(&name))? else {
            return Ok(None);
        };
        let wanted = match kind {
            VolumeKind::Filesystem => SFlag::S_IFDIR,
            VolumeKind::Block | VolumeKind::Image(_) => SFlag::S_IFREG,
        };
        Ok(Some(is(&data, wanted)?))
    };
    let described = || format!("{}/{VOLUMES_DIR}/{name}", pool_root.display());
    match found() {
        Ok(Some(true)) => Ok(pool_root.join(VOLUMES_DIR).join(name)),
        Ok(Some(false)) => Err(Error::FailedPrecondition(format!(
            "{} is not what a {kind:?} volume keeps (a link, or another kind of file): not read",
            described()
        ))),
        Ok(None) => Err(Error::NotFound(format!(
            "the pool at {} holds no data of volume {source} ({VOLUMES_DIR}/{name})",
            pool_root.display()
        ))),
        Err(err) => Err(Error::FailedPrecondition(format!(
            "cannot read {}: {err}",
            described()
        ))),
    }
}

impl Volumes {
    /// Fills volume `target` of this node with volume `source`'s data from the foreign pool
    /// mounted at `pool_root` (see the module comment), replacing what it holds.
    pub fn adopt(&self, target: &VolumeId, source: &VolumeId, pool_root: &Path) -> Result<Summary> {
        let kind = self.get(target)?.kind;
        let data = foreign_data(pool_root, source, kind)?;
        let header = match image_of(kind) {
            None => archive::tree_header(&data, source.as_str()),
            Some(image) => archive::image_header(&data, source.as_str(), image),
        }
        .map_err(|err| Error::FailedPrecondition(format!("reading {}: {err}", data.display())))?;
        let (reader, mut writer) =
            io::pipe().context(|| "making a pipe for the adoption".to_string())?;
        let exported = std::thread::scope(|scope| {
            let export = scope.spawn(move || archive::export(&data, &header, &mut writer));
            let imported = self.import(target, true, reader);
            (export.join(), imported)
        });
        match exported {
            (Ok(Ok(_)), imported) => imported,
            // The import stopped reading (its target published, too small, ...): its error is
            // the cause, the broken pipe only its echo.
            (Ok(Err(ArchiveError::Output(_))), Err(refused)) => Err(refused),
            (Ok(Err(err)), _) => Err(Error::FailedPrecondition(format!(
                "reading volume {source} from the pool at {}: {err}",
                pool_root.display()
            ))),
            (Err(_), _) => Err(Error::host(
                format!(
                    "reading volume {source} from the pool at {}",
                    pool_root.display()
                ),
                io::Error::other("the reading thread panicked"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_is_named_by_one_plain_component() {
        for good in ["disk-2", "node2.pool", "a"] {
            assert!(disk_name_is_valid(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "/abs", "../x", &"x".repeat(256)] {
            assert!(!disk_name_is_valid(bad), "{bad:?}");
        }
    }
}
