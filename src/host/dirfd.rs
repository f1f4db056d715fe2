//! Acting on what was checked: directories held open (O_PATH) and changed relative to their
//! descriptors, never by a path resolved again, which whoever can write an ancestor could swap
//! for a symlink between the check and the change.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Opens the directory `path` (symlinks followed) as a handle to act relative to.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(nix::fcntl::open(path, dir_flags(), Mode::empty())?)
}

/// Where the kernel says the opened `dir` is now: what to check before acting on it.
pub fn name_of(dir: BorrowedFd<'_>) -> io::Result<PathBuf> {
    let link = fd_path(dir);
    std::fs::read_link(&link)
        .map_err(|err| io::Error::other(format!("reading {}: {err}", link.display())))
}

/// `name` in `dir`, itself (a symlink is opened as the link, never followed); None if missing.
pub fn open_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<OwnedFd>> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir, c_name(name)?.as_c_str(), flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::Error::ENOENT) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// Creates the directory `name` in `dir` unless it exists, and opens it; a symlink there is
/// refused (ENOTDIR), never followed.
pub fn make_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let name = c_name(name)?;
    match mkdirat(dir, name.as_c_str(), Mode::from_bits_truncate(0o777)) {
        Ok(()) | Err(nix::Error::EEXIST) => {}
        Err(err) => return Err(err.into()),
    }
    Ok(openat(
        dir,
        name.as_c_str(),
        dir_flags() | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )?)
}

/// Removes the empty directory `name` from `dir`.
pub fn remove_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    Ok(unlinkat(
        dir,
        c_name(name)?.as_c_str(),
        UnlinkatFlags::RemoveDir,
    )?)
}

/// Removes the non-directory `name` (a file, a symlink) from `dir`.
pub fn remove_file_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    Ok(unlinkat(
        dir,
        c_name(name)?.as_c_str(),
        UnlinkatFlags::NoRemoveDir,
    )?)
}

/// Where the symlink `name` in `dir` points.
pub fn read_link_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<PathBuf> {
    Ok(nix::fcntl::readlinkat(dir, c_name(name)?.as_c_str())?.into())
}

/// Creates `name` in `dir` as a symlink to `points_to`.
pub fn symlink_at(points_to: &Path, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    Ok(nix::unistd::symlinkat(
        points_to,
        dir,
        c_name(name)?.as_c_str(),
    )?)
}

/// A path naming the open `fd` itself: the kernel resolves it to that very file (and mount),
/// whatever has happened to its name since, for calls that take only paths.
pub fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn dir_flags() -> OFlag {
    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

/// One path component, as the *at calls take it: no '/', no NUL, not "." or "..".
fn c_name(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not one path component"),
        ));
    }
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}
