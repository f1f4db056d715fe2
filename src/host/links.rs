//! Hard links met during a walk or an import: the inodes whose other names are still to come,
//! in bounded memory. No path is kept: a copy that must give an inode its later names keeps a
//! spare name of its own for it in a stash directory (`LinkStash`), and links from there.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::hash::Hash;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};

/// How many inodes may wait for their other names at once. An entry costs a few dozen bytes,
/// so this bounds the book near 10 MiB; a tree needs more only if that many hard-linked files
/// have names still ahead in the walk.
pub const MAX_WAITING_LINKS: usize = 1 << 18;

/// Inodes with several names, from their first name until all the others were met: the only
/// bookkeeping of a copy, an export or an import that grows with the tree's width.
pub(super) struct LinkBook<K, T> {
    waiting: HashMap<K, (T, u64)>,
}

impl<K: Hash + Eq, T: Clone> LinkBook<K, T> {
    pub(super) fn new() -> Self {
        LinkBook {
            waiting: HashMap::new(),
        }
    }

    /// Records the first name of an inode with `later` names to come; refuses past
    /// `MAX_WAITING_LINKS`.
    pub(super) fn first(&mut self, key: K, value: T, later: u64) -> io::Result<()> {
        if later == 0 {
            return Ok(());
        }
        if self.waiting.len() >= MAX_WAITING_LINKS {
            return Err(too_many_links());
        }
        self.waiting.insert(key, (value, later));
        Ok(())
    }

    /// What was recorded at the inode's first name, if this is one of its later names, and
    /// whether it was the last one expected.
    pub(super) fn again(&mut self, key: &K) -> Option<(T, bool)> {
        let (value, left) = self.waiting.get_mut(key)?;
        let value = value.clone();
        *left -= 1;
        let last = *left == 0;
        if last {
            self.waiting.remove(key);
        }
        Some((value, last))
    }

    pub(super) fn knows(&self, key: &K) -> bool {
        self.waiting.contains_key(key)
    }
}

pub(super) fn too_many_links() -> io::Error {
    super::tree::beyond_limit(format!(
        "more than {MAX_WAITING_LINKS} hard-linked files await their other names at once, more than stickyvol tracks"
    ))
}

/// A directory inside a copy's destination that holds one spare name per inode awaiting
/// later names, so they are linked from there instead of from a remembered path. Made on
/// first use; `remove` takes it away before the copy is finished.
pub(super) struct LinkStash {
    stash: Option<(OwnedFd, CString)>,
}

impl LinkStash {
    pub(super) fn new() -> LinkStash {
        LinkStash { stash: None }
    }

    /// Keeps a spare name `number` for the file `name` in `dir`, made inside `root`.
    pub(super) fn keep(
        &mut self,
        root: BorrowedFd<'_>,
        number: u64,
        (dir, name): (BorrowedFd<'_>, &CStr),
    ) -> io::Result<()> {
        let stash = self.open(root)?;
        linkat(dir, name, stash, spare(number).as_c_str(), AtFlags::empty())?;
        Ok(())
    }

    /// Gives the file kept as `number` the name `name` in `dir`; drops the spare when `last`.
    pub(super) fn link(
        &self,
        number: u64,
        (dir, name): (BorrowedFd<'_>, &CStr),
        last: bool,
    ) -> io::Result<()> {
        let Some((stash, _)) = &self.stash else {
            return Err(io::Error::other("a link to a file the stash never kept"));
        };
        let spare = spare(number);
        linkat(stash.as_fd(), spare.as_c_str(), dir, name, AtFlags::empty())?;
        if last {
            unlinkat(stash.as_fd(), spare.as_c_str(), UnlinkatFlags::NoRemoveDir)?;
        }
        Ok(())
    }

    /// Removes the stash and the spares left in it (files whose other names were never met,
    /// e.g. names outside the copied tree) from `root`.
    pub(super) fn remove(&mut self, root: BorrowedFd<'_>) -> io::Result<()> {
        let Some((stash, name)) = self.stash.take() else {
            return Ok(());
        };
        let mut listing = nix::dir::Dir::from_fd(stash.try_clone()?)?;
        let spares: Vec<CString> = listing
            .iter()
            .filter_map(|entry| entry.ok().map(|e| e.file_name().to_owned()))
            .filter(|name| !matches!(name.to_bytes(), b"." | b".."))
            .collect();
        for spare in spares {
            unlinkat(stash.as_fd(), spare.as_c_str(), UnlinkatFlags::NoRemoveDir)?;
        }
        unlinkat(root, name.as_c_str(), UnlinkatFlags::RemoveDir)?;
        Ok(())
    }

    fn open(&mut self, root: BorrowedFd<'_>) -> io::Result<BorrowedFd<'_>> {
        if self.stash.is_none() {
            // A name no tree holds in practice; were it taken, the copy of that entry would
            // fail with EEXIST rather than mix with the stash.
            let name = CString::new(format!(
                ".stickyvol-links-{}",
                uuid::Uuid::now_v7().simple()
            ))
            .expect("no NUL");
            mkdirat(root, name.as_c_str(), Mode::S_IRWXU)?;
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let fd = openat(root, name.as_c_str(), flags, Mode::empty())?;
            self.stash = Some((fd, name));
        }
        Ok(self.stash.as_ref().expect("just made").0.as_fd())
    }
}

fn spare(number: u64) -> CString {
    CString::new(number.to_string()).expect("digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_book_forgets_an_inode_at_its_last_name_and_refuses_past_its_bound() {
        let mut book = LinkBook::new();
        book.first(1u64, "a", 2).unwrap();
        book.first(2u64, "b", 0).unwrap(); // no later names: nothing to keep
        assert!(book.knows(&1) && !book.knows(&2));
        assert_eq!(book.again(&1), Some(("a", false)));
        assert_eq!(book.again(&1), Some(("a", true)));
        assert_eq!(book.again(&1), None);
        for key in 0..MAX_WAITING_LINKS as u64 {
            book.first(key, "x", 1).unwrap();
        }
        let err = book.first(u64::MAX, "x", 1).unwrap_err();
        assert!(err.to_string().contains("hard-linked"), "{err}");
    }

    #[test]
    fn the_stash_links_kept_files_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let root = nix::fcntl::open(dir.path(), flags, Mode::empty()).unwrap();
        std::fs::write(dir.path().join("first"), b"data").unwrap();
        std::fs::write(dir.path().join("lonely"), b"x").unwrap();
        let mut stash = LinkStash::new();
        stash
            .keep(root.as_fd(), 7, (root.as_fd(), c"first"))
            .unwrap();
        stash
            .keep(root.as_fd(), 8, (root.as_fd(), c"lonely"))
            .unwrap();
        stash.link(7, (root.as_fd(), c"second"), false).unwrap();
        stash.link(7, (root.as_fd(), c"third"), true).unwrap();
        assert!(stash.link(7, (root.as_fd(), c"fourth"), false).is_err());
        stash.remove(root.as_fd()).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["first", "lonely", "second", "third"]);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(dir.path().join("first")).unwrap().nlink(),
            3
        );
        assert_eq!(
            std::fs::metadata(dir.path().join("lonely"))
                .unwrap()
                .nlink(),
            1
        );
    }
}
