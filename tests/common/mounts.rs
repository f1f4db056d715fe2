//! Scratch tmpfs mounts for tests that need a filesystem with particular properties: read-only,
//! full, shared or private. Each is unmounted when dropped, also when the test panicked; the test
//! directory's own cleanup (which unmounts everything beneath it) catches anything left.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};

#[derive(Debug)]
pub struct TmpfsMount {
    path: PathBuf,
}

impl TmpfsMount {
    /// Mounts a fresh tmpfs of `size` (e.g. "1m") at `path`, created if missing, with `flags`
    /// (e.g. `MS_RDONLY`) besides nosuid and nodev.
    pub fn new(path: &Path, size: &str, flags: MsFlags) -> TmpfsMount {
        fs::create_dir_all(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            flags | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0755").as_str()),
        )
        .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", path.display()));
        TmpfsMount {
            path: path.to_path_buf(),
        }
    }

    /// Makes the mount shared (`MS_SHARED`), private (`MS_PRIVATE`), …, like
    /// `mount --make-shared`.
    pub fn set_propagation(&self, propagation: MsFlags) {
        mount(
            None::<&str>,
            &self.path,
            None::<&str>,
            propagation,
            None::<&str>,
        )
        .unwrap_or_else(|e| {
            panic!(
                "setting propagation {propagation:?} of {}: {e}",
                self.path.display()
            )
        });
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a file into the mount until its filesystem has no space left.
    pub fn fill(&self) {
        let path = self.path.join("filler");
        let mut file =
            fs::File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        let chunk = [0xa5u8; 4096];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", self.path.display()),
            }
        }
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        if let Err(err) = super::unmount(&self.path) {
            eprintln!("unmounting {}: {err}", self.path.display());
        }
    }
}
