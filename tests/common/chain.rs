//! A chain of directories deeper than the driver's walks enter, made as a pod can make one.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode as FileMode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

pub fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// A chain of directories `d` below a volume's mount, made level by level as a pod can (the
/// whole path is far beyond PATH_MAX). Removed the same way when dropped, even by a failed
/// test: the driver's cleanup could not remove it through paths.
pub struct Chain {
    top: PathBuf,
    depth: usize,
}

impl Chain {
    pub fn make(top: &Path, depth: usize) -> Chain {
        let mut dir = open(top, dir_flags(), FileMode::empty()).unwrap();
        let mut chain = Chain {
            top: top.to_path_buf(),
            depth: 0,
        };
        for _ in 0..depth {
            mkdirat(dir.as_fd(), "d", FileMode::S_IRWXU).unwrap();
            chain.depth += 1;
            dir = openat(dir.as_fd(), "d", dir_flags(), FileMode::empty()).unwrap();
        }
        chain
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        let Ok(mut dir) = open(&self.top, dir_flags(), FileMode::empty()) else {
            return;
        };
        // Down to the deepest level, then up, removing each level from its parent. No panic
        // here: this may run while a failed test unwinds.
        let mut depth = 0;
        while depth < self.depth {
            match openat(dir.as_fd(), "d", dir_flags(), FileMode::empty()) {
                Ok(child) => dir = child,
                Err(_) => break,
            }
            depth += 1;
        }
        for _ in 0..depth {
            let Ok(parent) = openat(dir.as_fd(), "..", dir_flags(), FileMode::empty()) else {
                return;
            };
            dir = parent;
            if let Err(err) = unlinkat(dir.as_fd(), "d", UnlinkatFlags::RemoveDir) {
                eprintln!("removing the chain of directories: {err}");
                return;
            }
        }
    }
}
