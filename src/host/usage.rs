//! Measured usage of a directory volume: allocated bytes and inodes of everything inside it,
//! without following symlinks or counting other mounts. Used until size enforcement gives O(1) figures.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use super::fsstat::{self, Stat};
use super::links::LinkBook;
use super::tree::{self, AtMountPoint, Budget, Visitor, WalkError};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Sums usage, counting a hard-linked inode once however many names it has.
struct Counter {
    usage: Usage,
    /// Hard-linked inodes already counted, until their last name is met.
    linked: LinkBook<((u32, u32), u64), ()>,
}

impl Visitor for Counter {
    fn entry(&mut self, _parent: BorrowedFd<'_>, _name: &CStr, stat: &Stat) -> io::Result<()> {
        if stat.links > 1 && !stat.is_dir() {
            let inode = (stat.dev, stat.ino);
            if self.linked.again(&inode).is_some() {
                return Ok(());
            }
            self.linked.first(inode, (), u64::from(stat.links - 1))?;
        }
        self.usage.bytes = self.usage.bytes.saturating_add(stat.allocated);
        self.usage.inodes += 1;
        Ok(())
    }
}

/// Usage of the tree rooted at `dir`, the root directory itself included.
pub fn measure(dir: &Path) -> Result<Usage, WalkError> {
    let root = fsstat::lstat(dir).map_err(|source| WalkError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut counter = Counter {
        usage: Usage {
            bytes: root.allocated,
            inodes: 1,
        },
        linked: LinkBook::new(),
    };
    tree::walk_within(dir, AtMountPoint::Skip, Budget::MEASURE, &mut counter)?;
    Ok(counter.usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn counts_allocated_bytes_and_inodes() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let empty = measure(dir.path()).unwrap();
        assert_eq!(empty.inodes, 1);
        fs::create_dir(dir.path().join("sub")).unwrap();
        let data = vec![7u8; 1 << 20];
        fs::write(dir.path().join("sub/file"), &data).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        let usage = measure(dir.path()).unwrap();
        assert_eq!(usage.inodes, 4);
        // A second name for the same inode adds neither an inode nor bytes.
        fs::hard_link(dir.path().join("sub/file"), dir.path().join("alias")).unwrap();
        assert_eq!(measure(dir.path()).unwrap(), usage);
        assert!(usage.bytes >= empty.bytes + (1 << 20), "{usage:?}");
        // The symlink's target (/usr) is not counted: far less than its size.
        assert!(usage.bytes < empty.bytes + (8 << 20), "{usage:?}");
    }
}
