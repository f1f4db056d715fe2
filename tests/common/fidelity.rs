//! What a faithful copy of a volume's data keeps, and how tests check it: a tree holding every
//! kind of entry and property (owners, setgid modes, nanosecond times, xattrs, symlinks, hard
//! links, holes, a FIFO), a manifest of a tree, and a comparison of two trees. Used by the
//! snapshot/restore/clone tests and the export/import tests.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{MIB, pattern, read_at};

/// The owner [`build_tree`] gives its entries (not root, so a copy must carry it over).
pub const UID: u32 = 1234;
pub const GID: u32 = 5678;

pub fn sha256_of(path: &Path) -> [u8; 32] {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Sha256::digest(&bytes).into()
}

pub fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let (path_c, name_c) = (c_path(path), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let rc = unsafe {
        libc::lsetxattr(
            path_c.as_ptr(),
            name_c.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "lsetxattr {name} on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// The `user.*` xattrs of `path` itself (never followed).
pub fn user_xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    xattrs_where(path, |name| name.starts_with(b"user."))
}

/// The xattrs a faithful copy keeps, of `path` itself (never followed): `user.*` and
/// `trusted.*`, POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`) and file
/// capabilities (`security.capability`). Not other `security.*` names: an LSM label belongs
/// to the host it is on.
pub fn kept_xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    xattrs_where(path, |name| {
        name.starts_with(b"user.")
            || name.starts_with(b"trusted.")
            || name == b"system.posix_acl_access"
            || name == b"system.posix_acl_default"
            || name == b"security.capability"
    })
}

/// The xattrs of `path` itself (never followed) whose names `wanted` picks.
fn xattrs_where(path: &Path, wanted: impl Fn(&[u8]) -> bool) -> BTreeMap<String, Vec<u8>> {
    let path_c = c_path(path);
    let mut names = vec![0u8; 64 << 10];
    // SAFETY: valid path and a buffer of the given length.
    let len = unsafe { libc::llistxattr(path_c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        len >= 0,
        "llistxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    names.truncate(len as usize);
    let mut out = BTreeMap::new();
    for name in names
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty() && wanted(n))
    {
        let name_c = CString::new(name).unwrap();
        let mut value = vec![0u8; 64 << 10];
        // SAFETY: as above.
        let len = unsafe {
            libc::lgetxattr(
                path_c.as_ptr(),
                name_c.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(len >= 0, "lgetxattr {name_c:?} on {}", path.display());
        value.truncate(len as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    out
}

/// Sets atime and mtime of `path` itself (a symlink is not followed), to the nanosecond.
pub fn set_times(path: &Path, seconds: i64, nanos: i64) {
    let times = [
        libc::timespec {
            tv_sec: seconds - 1000,
            tv_nsec: nanos,
        },
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: nanos,
        },
    ];
    let path_c = c_path(path);
    // SAFETY: valid path and two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path_c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

pub fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

pub fn give_away(path: &Path) {
    std::os::unix::fs::lchown(path, Some(UID), Some(GID))
        .unwrap_or_else(|e| panic!("lchown {}: {e}", path.display()));
}

/// Allocated bytes of `path` (st_blocks × 512).
pub fn allocated(path: &Path) -> u64 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .blocks()
        * 512
}

/// Every entry beneath `root` (not `root` itself), parents before children, sorted.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    fn visit(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            out.push(path.clone());
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                visit(&path, out);
            }
        }
    }
    let mut out = Vec::new();
    visit(root, &mut out);
    out
}

pub const SPARSE_LEN: u64 = 8 << 20;
pub const SPARSE_DATA_AT: [u64; 2] = [0, 6 << 20];

/// A POSIX ACL in its xattr form (linux/posix_acl_xattr.h: version 2, then (tag, perm, id)
/// entries, little-endian): the owner rw-, user [`UID`] r--, the group r--, mask r--, others
/// nothing.
pub fn acl_granting_uid() -> Vec<u8> {
    const USER_OBJ: u16 = 0x01;
    const USER: u16 = 0x02;
    const GROUP_OBJ: u16 = 0x04;
    const MASK: u16 = 0x10;
    const OTHER: u16 = 0x20;
    const UNDEFINED_ID: u32 = u32::MAX;
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (USER_OBJ, 6u16, UNDEFINED_ID),
        (USER, 4, UID),
        (GROUP_OBJ, 4, UNDEFINED_ID),
        (MASK, 4, UNDEFINED_ID),
        (OTHER, 0, UNDEFINED_ID),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    acl
}

/// A file capability in its xattr form (linux/capability.h, VFS_CAP_REVISION_2): the
/// effective flag and CAP_NET_BIND_SERVICE (10) permitted.
pub fn capability_net_bind_service() -> Vec<u8> {
    const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
    const VFS_CAP_FLAGS_EFFECTIVE: u32 = 0x1;
    let mut cap = (VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE)
        .to_le_bytes()
        .to_vec();
    // (permitted, inheritable) for capabilities 0-31, then for 32-63.
    for word in [1u32 << 10, 0, 0, 0] {
        cap.extend(word.to_le_bytes());
    }
    cap
}

/// Device numbers of the device nodes [`build_tree`] makes (a char device like /dev/null, a
/// block device like a loop device no one has).
pub const CHAR_DEVICE: (u64, u64) = (1, 3);
pub const BLOCK_DEVICE: (u64, u64) = (7, 250);

/// Builds beneath `root` a tree with everything a copy must keep: nested directories, owners,
/// modes with setgid, nanosecond mtimes, a user xattr, symlinks (one dangling), a hard-link
/// pair, a sparse file, a FIFO, an empty directory, char and block device nodes, an access
/// ACL on a file and a default ACL on a directory, a file capability; and the root's own
/// owner, mode and xattr.
pub fn build_tree(root: &Path) {
    let at = |rel: &str| root.join(rel);
    fs::create_dir_all(at("dir/nested/deeper")).unwrap();
    fs::write(at("dir/nested/deeper/file.txt"), b"nested content").unwrap();
    fs::write(at("data.bin"), pattern(3 * MIB as usize, 11)).unwrap();
    fs::write(at("setgid-tool"), b"#!/bin/sh\necho hi\n").unwrap();
    // Owners before modes: chown clears setuid and setgid.
    for rel in [
        "dir",
        "dir/nested",
        "dir/nested/deeper/file.txt",
        "data.bin",
        "setgid-tool",
    ] {
        give_away(&at(rel));
    }
    set_mode(&at("dir"), 0o2775);
    set_mode(&at("dir/nested/deeper/file.txt"), 0o640);
    set_mode(&at("setgid-tool"), 0o2755);
    fs::write(at("xattr-file"), b"labelled").unwrap();
    set_xattr(&at("xattr-file"), "user.color", b"blue");
    symlink("dir/nested/deeper/file.txt", at("link")).unwrap();
    give_away(&at("link"));
    symlink("/nonexistent/stickyvol-test/target", at("dangling")).unwrap();
    fs::write(at("hard-a"), b"linked twice").unwrap();
    fs::hard_link(at("hard-a"), at("hard-b")).unwrap();
    let sparse = File::create(at("sparse.img")).unwrap();
    sparse.set_len(SPARSE_LEN).unwrap();
    for (i, offset) in SPARSE_DATA_AT.iter().enumerate() {
        sparse
            .write_all_at(&pattern(4096, i as u8 + 1), *offset)
            .unwrap();
    }
    sparse.sync_all().unwrap();
    fs::create_dir(at("empty")).unwrap();
    set_mode(&at("empty"), 0o700);
    nix::unistd::mkfifo(&at("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o620)).unwrap();
    fs::create_dir(at("devices")).unwrap();
    for (name, kind, (major, minor)) in [
        ("char", nix::sys::stat::SFlag::S_IFCHR, CHAR_DEVICE),
        ("block", nix::sys::stat::SFlag::S_IFBLK, BLOCK_DEVICE),
    ] {
        nix::sys::stat::mknod(
            &at(&format!("devices/{name}")),
            kind,
            nix::sys::stat::Mode::from_bits_truncate(0o640),
            nix::sys::stat::makedev(major, minor),
        )
        .unwrap();
        set_mode(&at(&format!("devices/{name}")), 0o640);
        give_away(&at(&format!("devices/{name}")));
    }
    // Setting an access ACL sets the group bits of the mode to its mask: no chmod after.
    fs::write(at("acl-file"), b"readable by uid 1234").unwrap();
    set_xattr(
        &at("acl-file"),
        "system.posix_acl_access",
        &acl_granting_uid(),
    );
    fs::create_dir(at("acl-dir")).unwrap();
    set_xattr(
        &at("acl-dir"),
        "system.posix_acl_default",
        &acl_granting_uid(),
    );
    // A chown or a write drops a capability: set it on the finished file, owner included.
    fs::write(at("cap-tool"), b"#!/bin/sh\nexec true\n").unwrap();
    give_away(&at("cap-tool"));
    set_mode(&at("cap-tool"), 0o755);
    set_xattr(
        &at("cap-tool"),
        "security.capability",
        &capability_net_bind_service(),
    );
    // The root itself: what kubelet's fsGroup or a pod's chmod made of it.
    give_away(root);
    set_mode(root, 0o2770);
    set_xattr(root, "user.root", b"top");
    // Times last, children before their directories (an entry made in a directory changes
    // the directory's mtime); each entry its own second and nanosecond.
    for (i, path) in walk(root).iter().rev().enumerate() {
        set_times(path, 1_500_000_000 + i as i64 * 7, 123_456_789 - i as i64);
    }
    set_times(root, 1_400_000_000, 12_345);
}

/// What a faithful copy keeps of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// st_mode: type and permission bits (setuid, setgid, sticky included).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Length of anything but a directory (whose size is the filesystem's business).
    pub len: Option<u64>,
    pub mtime: (i64, i64),
    pub content: Option<[u8; 32]>,
    pub link_target: Option<PathBuf>,
    /// Of a char or block device node: its device number.
    pub rdev: Option<u64>,
    /// See [`kept_xattrs`]: user, trusted, ACLs, capabilities.
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// For a file with several links: the first of its names (in walk order) in this tree.
    pub first_link: Option<PathBuf>,
}

/// `root` itself (as ".") and every entry beneath it, by relative path.
pub fn manifest(root: &Path) -> BTreeMap<PathBuf, Entry> {
    use std::os::unix::fs::FileTypeExt;
    let mut first_names: BTreeMap<u64, PathBuf> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for path in std::iter::once(root.to_path_buf()).chain(walk(root)) {
        let rel = match path.strip_prefix(root).unwrap() {
            rel if rel.as_os_str().is_empty() => PathBuf::from("."),
            rel => rel.to_path_buf(),
        };
        let meta = fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        let first_link = (!kind.is_dir() && meta.nlink() > 1)
            .then(|| first_names.entry(meta.ino()).or_insert(rel.clone()).clone());
        out.insert(
            rel,
            Entry {
                mode: meta.mode(),
                uid: meta.uid(),
                gid: meta.gid(),
                len: (!kind.is_dir()).then_some(meta.len()),
                mtime: (meta.mtime(), meta.mtime_nsec()),
                content: kind.is_file().then(|| sha256_of(&path)),
                link_target: kind.is_symlink().then(|| fs::read_link(&path).unwrap()),
                rdev: (kind.is_char_device() || kind.is_block_device()).then(|| meta.rdev()),
                xattrs: kept_xattrs(&path),
                first_link,
            },
        );
    }
    out
}

/// `copy` holds exactly the tree `original` describes, and the properties that matter are
/// checked one by one too (so a manifest mistake cannot hide them).
#[track_caller]
pub fn assert_same_tree(original: &BTreeMap<PathBuf, Entry>, copy: &Path) {
    let copied = manifest(copy);
    let names = |m: &BTreeMap<PathBuf, Entry>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&copied),
        names(original),
        "entries of {}",
        copy.display()
    );
    for (rel, entry) in original {
        assert_eq!(
            &copied[rel],
            entry,
            "{} in {}",
            rel.display(),
            copy.display()
        );
    }
    let at = |rel: &str| copy.join(rel);
    let mode = |rel: &str| fs::symlink_metadata(at(rel)).unwrap().mode() & 0o7777;
    assert_eq!(mode("dir"), 0o2775, "setgid directory");
    assert_eq!(mode("setgid-tool"), 0o2755, "setgid file");
    let owner = fs::symlink_metadata(at("dir/nested/deeper/file.txt")).unwrap();
    assert_eq!((owner.uid(), owner.gid()), (UID, GID));
    assert_eq!(
        fs::read(at("dir/nested/deeper/file.txt")).unwrap(),
        b"nested content"
    );
    assert_eq!(
        user_xattrs(&at("xattr-file"))
            .get("user.color")
            .map(Vec::as_slice),
        Some(&b"blue"[..])
    );
    assert_eq!(
        fs::read_link(at("link")).unwrap(),
        Path::new("dir/nested/deeper/file.txt")
    );
    let (a, b) = (
        fs::metadata(at("hard-a")).unwrap(),
        fs::metadata(at("hard-b")).unwrap(),
    );
    assert_eq!(
        a.ino(),
        b.ino(),
        "the hard-link pair is one inode in the copy"
    );
    assert_eq!(a.nlink(), 2);
    let sparse = at("sparse.img");
    assert_eq!(fs::metadata(&sparse).unwrap().len(), SPARSE_LEN);
    assert!(
        allocated(&sparse) <= 256 << 10,
        "the sparse file lost its holes: {} bytes allocated",
        allocated(&sparse)
    );
    for (i, offset) in SPARSE_DATA_AT.iter().enumerate() {
        assert_eq!(read_at(&sparse, *offset, 4096), pattern(4096, i as u8 + 1));
    }
    assert_eq!(read_at(&sparse, 3 << 20, 4096), vec![0u8; 4096]);
    let root = fs::symlink_metadata(copy).unwrap();
    assert_eq!(
        (root.mode(), root.uid(), root.gid()),
        (original[Path::new(".")].mode, UID, GID),
        "the root's mode and owner"
    );
    assert_eq!(
        user_xattrs(copy).get("user.root").map(Vec::as_slice),
        Some(&b"top"[..]),
        "the root's xattr"
    );
    for (name, (major, minor)) in [("char", CHAR_DEVICE), ("block", BLOCK_DEVICE)] {
        let device = fs::symlink_metadata(at(&format!("devices/{name}"))).unwrap();
        assert_eq!(
            device.rdev(),
            nix::sys::stat::makedev(major, minor),
            "{name} device number"
        );
        assert_eq!((device.uid(), device.mode() & 0o7777), (UID, 0o640));
    }
    assert_eq!(
        kept_xattrs(&at("acl-file")).get("system.posix_acl_access"),
        Some(&acl_granting_uid()),
        "access ACL"
    );
    assert_eq!(
        kept_xattrs(&at("acl-dir")).get("system.posix_acl_default"),
        Some(&acl_granting_uid()),
        "default ACL"
    );
    assert_eq!(
        kept_xattrs(&at("cap-tool")).get("security.capability"),
        Some(&capability_net_bind_service()),
        "file capability"
    );
}
