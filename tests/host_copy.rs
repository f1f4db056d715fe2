//! host::copy on real filesystems: a tree holding every kind of entry and attribute, copied on
//! ext4 (/var/tmp), on loop-backed XFS and btrfs (reflinks) and into another ext4 (neither
//! clone nor copy_file_range works across filesystems). Each copy must keep every
//! property the source has. Needs root (chown, mknod, trusted.* xattrs). Prints what it
//! measures (space a copy took, timings); asserts only on behaviour, never on time.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::hash::{DefaultHasher, Hasher};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{AT_FDCWD, AtFlags};
use nix::mount::MsFlags;
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, makedev, mknod, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, chown, fchownat, mkfifo};

use common::mounts::TmpfsMount;
use common::scratchfs::ScratchFs;
use stickyvol::host::copy::{self, Always, CopyError, CopyReport, DataMode};
use stickyvol::host::tree::WalkError;
use stickyvol::host::{fsstat, projquota};

const MIB: u64 = 1 << 20;
const UID: u32 = 1234;
const GID: u32 = 5678;

/// The tests run as root (README); as anyone else they fail rather than skip.
fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (chown, mknod, trusted.* xattrs)"
    );
}

/// A scratch filesystem (XFS with reflink).
fn scratch(fs_type: &str, size: u64) -> ScratchFs {
    require_root();
    let args: &[&str] = match fs_type {
        "xfs" => &["-q", "-m", "reflink=1"],
        _ => &["-q"],
    };
    ScratchFs::new(fs_type, size, args, "")
}

// ---------------------------------------------------------------------------------------------
// The fixture

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let c_name = CString::new(name).unwrap();
    // SAFETY: both strings are valid C strings and value is readable for its length.
    let rc = unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    succeeded(rc as isize, path);
}

/// The length an xattr call returned, after checking it did not fail.
fn succeeded(rc: isize, path: &Path) -> usize {
    let err = std::io::Error::last_os_error();
    assert!(rc >= 0, "{}: {err}", path.display());
    rc as usize
}

/// All xattrs of `path` itself (not followed), by name.
fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 1 << 16];
    // SAFETY: c_path is a valid C string; names is writable for its length.
    let len = unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    names.truncate(succeeded(len, path));
    let mut all = BTreeMap::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let c_name = CString::new(name).unwrap();
        let mut value = vec![0u8; 1 << 16];
        // SAFETY: both strings are valid C strings; value is writable for its length.
        let len = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        value.truncate(succeeded(len, path));
        all.insert(name.to_vec(), value);
    }
    all
}

/// A POSIX ACL in the kernel's xattr form (version 2, then (tag, perm, id) entries sorted by
/// tag) granting the owner, user UID, the owning group and others the given permissions.
fn acl_with_user(owner: u16, user: u16, group: u16, other: u16) -> Vec<u8> {
    const NO_ID: u32 = u32::MAX;
    // ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER.
    let entries = [
        (0x01u16, owner, NO_ID),
        (0x02, user, UID),
        (0x04, group, NO_ID),
        (0x10, user | group, NO_ID),
        (0x20, other, NO_ID),
    ];
    let mut bytes = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        bytes.extend(tag.to_le_bytes());
        bytes.extend(perm.to_le_bytes());
        bytes.extend(id.to_le_bytes());
    }
    bytes
}

/// Gives `path` itself (not followed) to UID:GID, then `mode` (after: chown clears setuid).
fn give_to_uid_and_gid(path: &Path, mode: Option<u32>) {
    let (uid, gid) = (Some(Uid::from_raw(UID)), Some(Gid::from_raw(GID)));
    fchownat(AT_FDCWD, path, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW).unwrap();
    if let Some(mode) = mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Builds, below `root` (an existing directory), one of everything a volume can hold, with
/// distinct owners, modes, xattrs and nanosecond times. `outside` is a directory outside the
/// tree for a symlink to point to.
fn build_fixture(root: &Path, outside: &Path) {
    let path = |relative: &str| root.join(relative);
    fs::create_dir_all(path("a/b/c")).unwrap();
    fs::write(path("a/b/c/deep.txt"), b"deep").unwrap();
    fs::create_dir(path("empty-dir")).unwrap();
    File::create(path("empty-file")).unwrap();

    fs::write(path("owned"), b"secret").unwrap();
    give_to_uid_and_gid(&path("owned"), Some(0o600));
    // cap_net_bind_service=ep (VFS_CAP_REVISION_2): lost if a chown comes after it.
    let mut capability = 0x0200_0001u32.to_le_bytes().to_vec();
    for word in [1u32 << 10, 0, 0, 0] {
        capability.extend(word.to_le_bytes());
    }
    set_xattr(&path("owned"), "security.capability", &capability);

    fs::write(path("setuid"), b"#!/bin/sh\n").unwrap();
    give_to_uid_and_gid(&path("setuid"), Some(0o6755));

    fs::create_dir(path("setgid-dir")).unwrap();
    chown(&path("setgid-dir"), None, Some(Gid::from_raw(GID))).unwrap();
    fs::set_permissions(path("setgid-dir"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(path("setgid-dir/inherited"), b"group").unwrap();
    fs::create_dir(path("setgid-dir/sub")).unwrap();
    fs::create_dir(path("sticky")).unwrap();
    fs::set_permissions(path("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();

    symlink("../nowhere/at/all", path("dangling")).unwrap();
    symlink("a/b/c/deep.txt", path("relative")).unwrap();
    symlink(outside, path("outside")).unwrap();
    set_xattr(&path("relative"), "trusted.link", b"on a symlink");
    give_to_uid_and_gid(&path("relative"), None);

    fs::write(path("hard1"), b"linked").unwrap();
    fs::hard_link(path("hard1"), path("a/hard2")).unwrap();
    fs::hard_link(path("hard1"), path("a/b/hard3")).unwrap();

    mkfifo(&path("fifo"), Mode::from_bits_truncate(0o640)).unwrap();
    let rw = Mode::from_bits_truncate(0o660);
    mknod(&path("socket"), SFlag::S_IFSOCK, rw, 0).unwrap();
    mknod(&path("chardev"), SFlag::S_IFCHR, rw, makedev(1, 3)).unwrap();
    mknod(&path("blockdev"), SFlag::S_IFBLK, rw, makedev(7, 250)).unwrap();

    let sparse = File::create(path("sparse")).unwrap();
    sparse.write_all_at(&[0x5a; 4096], 0).unwrap();
    sparse.write_all_at(&[0xa5; 4096], 64 * MIB).unwrap();
    drop(sparse);
    let mut medium = File::create(path("a/medium")).unwrap();
    for i in 0..3u8 {
        medium.write_all(&vec![i + 1; MIB as usize]).unwrap();
    }

    fs::write(path("xattr-file"), b"labelled").unwrap();
    set_xattr(&path("xattr-file"), "user.color", b"blue");
    set_xattr(&path("xattr-file"), "user.empty", b"");
    set_xattr(&path("xattr-file"), "trusted.secret", b"\0binary\xff");
    set_xattr(&path("xattr-file"), "security.stickyvol", b"label");
    let access = acl_with_user(6, 4, 4, 0);
    set_xattr(&path("xattr-file"), "system.posix_acl_access", &access);
    fs::create_dir(path("xattr-dir")).unwrap();
    set_xattr(&path("xattr-dir"), "user.kind", b"directory");
    let default = acl_with_user(7, 5, 5, 1);
    set_xattr(&path("xattr-dir"), "system.posix_acl_default", &default);
    // Inherits an access ACL from the default one.
    fs::write(path("xattr-dir/child"), b"inherits").unwrap();

    give_to_uid_and_gid(root, Some(0o751));
    set_xattr(root, "user.root", b"top");
    let mut counter = 0;
    set_times(root, &mut counter);
}

/// Gives every entry below and at `path` distinct times, children before their directory.
/// Atimes lie a day ahead: relatime never moves an atime later than ctime and mtime, so our
/// own reads of the tree cannot change them.
fn set_times(path: &Path, counter: &mut i64) {
    let meta = fs::symlink_metadata(path).unwrap();
    if meta.is_dir() {
        let mut names: Vec<_> = fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for child in names {
            set_times(&child, counter);
        }
    }
    *counter += 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let atime = TimeSpec::new(now + 86_400 + *counter, 100_000_001 * (*counter % 9));
    let mtime = TimeSpec::new(1_600_000_000 + *counter, 999_999_999 - *counter);
    utimensat(
        AT_FDCWD,
        path,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Comparing trees

/// Everything a copy must keep about one entry.
#[derive(Debug, PartialEq)]
struct Entry {
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    /// Files and symlinks only (directory sizes differ between filesystems).
    size: Option<u64>,
    atime: (i64, i64),
    mtime: (i64, i64),
    target: Option<PathBuf>,
    /// A hash of the content (SipHash: std's, optimized even in test builds).
    content: Option<u64>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// For the second and later names of an inode: its first name.
    same_as: Option<PathBuf>,
}

/// Every entry at and below `root`, by path relative to it, symlinks not followed.
fn manifest(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let path = root.join(&relative);
        let meta = fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        if kind.is_dir() {
            for child in fs::read_dir(&path).unwrap() {
                pending.push(relative.join(child.unwrap().file_name()));
            }
        }
        let entry = Entry {
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev(),
            size: (kind.is_file() || kind.is_symlink()).then_some(meta.len()),
            atime: (meta.atime(), meta.atime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            target: kind.is_symlink().then(|| fs::read_link(&path).unwrap()),
            content: kind.is_file().then(|| content_hash(&path)),
            xattrs: xattrs(&path),
            same_as: None,
        };
        entries.insert(relative, entry);
    }
    // Hard links: in sorted order, so both trees name the same path first.
    let mut sorted_first: BTreeMap<u64, PathBuf> = BTreeMap::new();
    for relative in entries.keys().cloned().collect::<Vec<_>>() {
        let meta = fs::symlink_metadata(root.join(&relative)).unwrap();
        if meta.nlink() > 1 && !meta.is_dir() {
            let first = sorted_first.entry(meta.ino()).or_insert(relative.clone());
            entries.get_mut(&relative).unwrap().same_as =
                (*first != relative).then(|| first.clone());
        }
    }
    entries
}

fn content_hash(path: &Path) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(&fs::read(path).unwrap());
    hasher.finish()
}

/// Asserts `copy` holds exactly what `original` (taken before the copy) describes.
fn assert_same(original: &BTreeMap<PathBuf, Entry>, copy: &Path) {
    let copied = manifest(copy);
    let names = |m: &BTreeMap<PathBuf, Entry>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&copied), names(original), "different entries");
    for (path, entry) in original {
        assert_eq!(&copied[path], entry, "{} differs", path.display());
    }
}

/// Checks specific to the fixture, beyond the comparison.
fn assert_fixture_details(copy: &Path, outside: &Path) {
    let sparse = fs::metadata(copy.join("sparse")).unwrap();
    assert_eq!(sparse.len(), 64 * MIB + 4096);
    assert!(
        sparse.blocks() * 512 < MIB,
        "sparse file filled in: {} blocks",
        sparse.blocks()
    );
    assert_eq!(fs::read_link(copy.join("outside")).unwrap(), outside);
    let owned = fs::symlink_metadata(copy.join("owned")).unwrap();
    assert_eq!(
        (owned.uid(), owned.gid(), owned.mode() & 0o7777),
        (UID, GID, 0o600)
    );
    assert_eq!(
        fs::symlink_metadata(copy.join("setuid")).unwrap().mode() & 0o7777,
        0o6755
    );
    let hard = fs::metadata(copy.join("hard1")).unwrap();
    assert_eq!(hard.nlink(), 3);
    assert_eq!(
        hard.ino(),
        fs::metadata(copy.join("a/b/hard3")).unwrap().ino()
    );
}

/// The fixture below `base/source`, an empty `base/dest`, and what the source looks like.
struct Prepared {
    source: PathBuf,
    dest: PathBuf,
    outside: PathBuf,
    original: BTreeMap<PathBuf, Entry>,
}

fn prepare(base: &Path) -> Prepared {
    let (source, dest, outside) = (base.join("source"), base.join("dest"), base.join("outside"));
    fs::create_dir(&source).unwrap();
    fs::create_dir(&dest).unwrap();
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("precious"), b"not to be copied").unwrap();
    build_fixture(&source, &outside);
    let original = manifest(&source);
    Prepared {
        source,
        dest,
        outside,
        original,
    }
}

/// Copies the fixture and checks the copy; returns the report.
fn copy_and_check(prepared: &Prepared, mode: DataMode) -> CopyReport {
    let report = copy::copy_tree(&prepared.source, &prepared.dest, mode, &mut Always).unwrap();
    copy::sync_filesystem(&prepared.dest).unwrap();
    assert_same(&prepared.original, &prepared.dest);
    assert_fixture_details(&prepared.dest, &prepared.outside);
    // The source is untouched.
    assert_same(&prepared.original, &prepared.source);
    assert_eq!(
        report.files,
        prepared.original.len() as u64 - 1,
        "{report:?}"
    );
    report
}

/// Bytes of data in the fixture's files: 3 MiB, two 4 KiB blocks and a few short files.
fn fixture_data_range(report: &CopyReport) {
    assert!(report.data_bytes >= 3 * MIB + 8192, "{report:?}");
    assert!(report.data_bytes < 4 * MIB, "{report:?}");
}

/// Copies the fixture where no extent can be shared and checks the copy.
fn copy_unshared_and_check(prepared: &Prepared, mode: DataMode) {
    let report = copy_and_check(prepared, mode);
    fixture_data_range(&report);
    assert_eq!(report.copied_bytes, report.data_bytes);
}

fn io_error(err: CopyError) -> (PathBuf, std::io::Error) {
    match err {
        CopyError::Walk(WalkError::Io { path, source }) => (path, source),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn copy_mode_on_ext4_keeps_everything() {
    require_root();
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    copy_unshared_and_check(&prepare(base.path()), DataMode::Copy);
}

#[test]
fn reflink_on_xfs_shares_extents_and_keeps_the_project_id() {
    let xfs = scratch("xfs", 512 * MIB);
    // The probe the pools use to choose reflinks says yes here (fsstat's FICLONE is right).
    assert_eq!(
        fsstat::filesystem_kind(&xfs.mount_point).unwrap(),
        fsstat::FsKind::Xfs
    );
    assert!(fsstat::supports_reflink(&xfs.mount_point).unwrap());
    let prepared = prepare(&xfs.mount_point);
    // A volume the size of its data: a clone must take next to no space.
    let mut big = File::create(prepared.source.join("big")).unwrap();
    for i in 0..32u8 {
        big.write_all(&vec![i; MIB as usize]).unwrap();
    }
    drop(big);
    set_times(&prepared.source.join("big"), &mut 1000);
    let original = manifest(&prepared.source);
    let prepared = Prepared {
        original,
        ..prepared
    };
    projquota::assign_project(&prepared.dest, 4242).unwrap();

    copy::sync_filesystem(&xfs.mount_point).unwrap();
    let before = fsstat::space(&xfs.mount_point).unwrap().available_bytes;
    let report = copy_and_check(&prepared, DataMode::Reflink);
    let taken = before - fsstat::space(&xfs.mount_point).unwrap().available_bytes;
    eprintln!(
        "XFS reflink copy of 35 MiB of data took {} KiB: {report:?}",
        taken >> 10
    );
    assert_eq!(report.copied_bytes, 0, "{report:?}");
    assert!(report.data_bytes >= 35 * MIB, "{report:?}");
    assert!(taken < 4 * MIB, "the clone took {taken} bytes");
    assert_eq!(projquota::project_of(&prepared.dest).unwrap(), (4242, true));

    // Copy mode: the kernel answers copy_file_range within one XFS with a clone too.
    let second = xfs.path("dest-copy");
    fs::create_dir(&second).unwrap();
    let before = fsstat::space(&xfs.mount_point).unwrap().available_bytes;
    let report = copy::copy_tree(&prepared.source, &second, DataMode::Copy, &mut Always).unwrap();
    copy::sync_filesystem(&second).unwrap();
    let taken = before as i64 - fsstat::space(&xfs.mount_point).unwrap().available_bytes as i64;
    eprintln!("XFS Copy-mode copy took {} KiB: {report:?}", taken >> 10);
    assert_same(&prepared.original, &second);
    // Cloned, not copied: 35 MiB of data took a few KiB of metadata (32 KiB measured). A
    // real copy would take all 35 MiB; 4 MiB is far from both.
    assert!(
        taken < 4 * MIB as i64,
        "the Copy-mode copy took {taken} bytes"
    );
}

#[test]
fn copy_file_on_xfs_clones_or_copies_images() {
    let xfs = scratch("xfs", 512 * MIB);
    let image = xfs.path("image");
    let file = File::create(&image).unwrap();
    file.set_len(64 * MIB).unwrap();
    file.write_all_at(&[1; 4096], 0).unwrap();
    file.write_all_at(&[2; 4096], 40 * MIB).unwrap();
    let full = xfs.path("full");
    fs::write(&full, vec![7u8; 32 * MIB as usize]).unwrap();
    drop(file);
    copy::sync_filesystem(&xfs.mount_point).unwrap();

    let before = fsstat::space(&xfs.mount_point).unwrap().available_bytes;
    for (source, name) in [(&image, "image-clone"), (&full, "full-clone")] {
        let report =
            copy::copy_file(source, &xfs.path(name), DataMode::Reflink, &mut Always).unwrap();
        assert_eq!(report.copied_bytes, 0, "{report:?}");
        assert_eq!(report.files, 1);
    }
    copy::sync_filesystem(&xfs.mount_point).unwrap();
    let taken = before - fsstat::space(&xfs.mount_point).unwrap().available_bytes;
    assert!(taken < MIB, "clones took {taken} bytes");

    let report =
        copy::copy_file(&image, &xfs.path("image-copy"), DataMode::Copy, &mut Always).unwrap();
    assert_eq!(report.data_bytes, 8192, "{report:?}");
    for name in ["image-clone", "image-copy"] {
        let copied = fs::metadata(xfs.path(name)).unwrap();
        assert_eq!(copied.len(), 64 * MIB);
        assert_eq!(copied.mode() & 0o7777, 0o600);
        assert!(
            copied.blocks() * 512 < MIB,
            "{name}: {} blocks",
            copied.blocks()
        );
        assert!(fs::read(&image).unwrap() == fs::read(xfs.path(name)).unwrap());
    }
    assert!(fs::read(&full).unwrap() == fs::read(xfs.path("full-clone")).unwrap());
    let err =
        copy::copy_file(&full, &xfs.path("image"), DataMode::Reflink, &mut Always).unwrap_err();
    let (path, err) = io_error(err);
    assert_eq!(path, xfs.path("image"));
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
}

#[test]
fn reflink_on_btrfs_into_a_subvolume() {
    let btrfs = scratch("btrfs", 256 * MIB);
    assert_eq!(
        fsstat::filesystem_kind(&btrfs.mount_point).unwrap(),
        fsstat::FsKind::Btrfs
    );
    assert!(fsstat::supports_reflink(&btrfs.mount_point).unwrap());
    let base = btrfs.path("base");
    fs::create_dir(&base).unwrap();
    let prepared = prepare(&base);
    // The caller's destination may be a subvolume: it must stay one.
    fs::remove_dir(&prepared.dest).unwrap();
    let out = Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&prepared.dest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = copy_and_check(&prepared, DataMode::Reflink);
    fixture_data_range(&report);
    assert_eq!(report.copied_bytes, 0, "{report:?}");
    assert_eq!(
        fs::metadata(&prepared.dest).unwrap().ino(),
        256,
        "no longer a subvolume"
    );
}

#[test]
fn into_another_filesystem_falls_back_to_reading_and_writing() {
    require_root();
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let prepared = prepare(base.path());
    // Another ext4, not a tmpfs: a tmpfs keeps `user.` attributes only from Linux 6.6 on.
    let other = scratch("ext4", 128 * MIB);
    let dest = other.mount_point.join("dest");
    fs::create_dir(&dest).unwrap();
    let prepared = Prepared { dest, ..prepared };
    // FICLONE refuses (EXDEV), and so does copy_file_range from 5.19 on: pread/pwrite it is.
    copy_unshared_and_check(&prepared, DataMode::Reflink);
}

#[test]
fn a_full_destination_names_the_file_and_keeps_enospc() {
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let source = base.path().join("source");
    fs::create_dir_all(source.join("sub")).unwrap();
    fs::write(source.join("sub/big"), vec![1u8; 4 * MIB as usize]).unwrap();
    let tmpfs = TmpfsMount::new(&base.path().join("tmpfs"), "1m", MsFlags::empty());
    let err = copy::copy_tree(&source, tmpfs.path(), DataMode::Copy, &mut Always).unwrap_err();
    let (path, err) = io_error(err);
    assert_eq!(path, source.join("sub/big"));
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");

    let err = copy::copy_file(
        &source.join("sub/big"),
        &tmpfs.path().join("image"),
        DataMode::Copy,
        &mut Always,
    )
    .unwrap_err();
    let (path, err) = io_error(err);
    assert_eq!(path, tmpfs.path().join("image"));
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(!path.exists(), "the partial image is left behind");
}

#[test]
fn stops_at_a_mount_point_inside_the_source() {
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let (source, dest) = (base.path().join("source"), base.path().join("dest"));
    fs::create_dir_all(source.join("sub")).unwrap();
    fs::create_dir(&dest).unwrap();
    let mount = TmpfsMount::new(&source.join("sub/mnt"), "1m", MsFlags::empty());
    fs::write(mount.path().join("host-file"), b"not ours").unwrap();
    let err = copy::copy_tree(&source, &dest, DataMode::Copy, &mut Always).unwrap_err();
    match err {
        CopyError::Walk(WalkError::MountPoint(path)) => assert_eq!(path, source.join("sub/mnt")),
        other => panic!("expected MountPoint, got {other:?}"),
    }
    assert!(!dest.join("sub/mnt/host-file").exists());
}

/// Run by hand: `cargo test --test host_copy -- --ignored --nocapture`.
#[test]
#[ignore = "a timing, for the record"]
fn timing_of_2000_files_of_100_kib() {
    let fill = |root: &Path| {
        for d in 0..20 {
            let dir = root.join(format!("d{d}"));
            fs::create_dir_all(&dir).unwrap();
            for f in 0..100 {
                let data = vec![(d * 100 + f) as u8 | 1; 100 << 10];
                fs::write(dir.join(format!("f{f}")), data).unwrap();
            }
        }
    };
    // Copies root/source to root/<dest>, a fresh directory.
    let time = |label: &str, root: &Path, dest: &str, mode: DataMode| {
        let (source, dest) = (root.join("source"), root.join(dest));
        fs::create_dir(&dest).unwrap();
        copy::sync_filesystem(&source).unwrap();
        let start = Instant::now();
        let report = copy::copy_tree(&source, &dest, mode, &mut Always).unwrap();
        let copied = start.elapsed();
        copy::sync_filesystem(&dest).unwrap();
        let synced = start.elapsed() - copied;
        eprintln!("{label}: copy_tree {copied:?}, then syncfs {synced:?}: {report:?}");
    };
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    fill(&base.path().join("source"));
    time("ext4 /var/tmp Copy", base.path(), "dest", DataMode::Copy);
    {
        let xfs = scratch("xfs", 1024 * MIB);
        fill(&xfs.path("source"));
        time(
            "XFS Reflink",
            &xfs.mount_point,
            "reflink",
            DataMode::Reflink,
        );
        time("XFS Copy", &xfs.mount_point, "copy", DataMode::Copy);
    }
    {
        let btrfs = scratch("btrfs", 1024 * MIB);
        fill(&btrfs.path("source"));
        time(
            "btrfs Reflink",
            &btrfs.mount_point,
            "reflink",
            DataMode::Reflink,
        );
    }
}
