//! host::projquota against real, loop-backed XFS and ext4 filesystems.
//!
//! With project quota (XFS `-o prjquota`, ext4 `-O quota,project` + `-o prjquota`) the tests
//! assign a project, set a limit, write past it and check usage. A kernel without quota support
//! refuses those mounts; the tests then say "SKIPPED" and why. What works without quota (the
//! project id in the inode, the "quota is off" answers) is tested on every filesystem we can
//! mount here: XFS and ext4 without quota, btrfs, tmpfs.

mod common;

use common::fallocate;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::Path;

use common::mounts::TmpfsMount;
use common::scratchfs::ScratchFs;
use nix::mount::MsFlags;
use stickyvol::host::projquota::{self, ProjectIds};

const MIB: u64 = 1 << 20;
const PROJECT: u32 = 1_000_000_007;

fn skip_without_quota(reason: &str) {
    eprintln!("SKIPPED: this kernel has no XFS/ext4 project-quota support ({reason})");
}

/// Appends 1 MiB chunks, each made durable, until `total` or an error: (bytes written, error).
/// fsync makes delayed allocation (ext4, XFS) charge the blocks now rather than at writeback.
fn write_until_error(file: &mut File, total: u64) -> (u64, Option<io::Error>) {
    let chunk = vec![0xa5_u8; MIB as usize];
    let mut written = 0;
    while written < total {
        let result = file
            .write(&chunk)
            .and_then(|n| file.sync_data().map(|()| n));
        match result {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(err) => return (written, Some(err)),
        }
    }
    (written, None)
}

/// The whole cycle on a filesystem mounted with project quota.
fn limits_are_enforced_and_usage_is_exact(fs: &ScratchFs) {
    let root = &fs.mount_point;
    assert!(projquota::project_quota_enabled(root).unwrap());

    // Allocation probes the filesystem: an id someone else uses is skipped.
    fs::create_dir(fs.path("other")).unwrap();
    projquota::assign_project(&fs.path("other"), PROJECT).unwrap();
    fs::write(fs.path("other/file"), b"someone else's").unwrap();
    assert!(projquota::project_in_use(root, PROJECT).unwrap());
    let ids = ProjectIds::new(PROJECT..PROJECT + 10, []);
    let lease = ids
        .allocate(|id| projquota::project_in_use(root, id))
        .unwrap();
    assert_eq!(lease.id(), PROJECT + 1);
    let id = lease.commit();

    let vol = fs.path("vol");
    fs::create_dir(&vol).unwrap();
    projquota::assign_project(&vol, id).unwrap();
    assert_eq!(projquota::project_of(&vol).unwrap(), (id, true));
    projquota::set_project_limit(root, id, 10 * MIB).unwrap();
    let usage = projquota::project_usage(root, id).unwrap();
    assert_eq!(usage.hard_limit_bytes, Some(10 * MIB), "{usage:?}");

    // Everything created below inherits the project.
    fs::create_dir(vol.join("sub")).unwrap();
    assert_eq!(projquota::project_of(&vol.join("sub")).unwrap(), (id, true));

    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(vol.join("sub/data"))
        .unwrap();
    let (written, err) = write_until_error(&mut file, 20 * MIB);
    let err = err.expect("20 MiB fit under a 10 MiB project limit");
    eprintln!(
        "measured ({}): write(2) past a 10 MiB project limit failed after {written} bytes: {err}",
        fs.fs_type
    );
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!((8 * MIB..=10 * MIB).contains(&written), "{written}");
    let err = fallocate(&file, written, 4 * MIB).expect_err("fallocate past the limit");
    eprintln!("measured ({}): fallocate past the limit: {err}", fs.fs_type);
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");

    let usage = projquota::project_usage(root, id).unwrap();
    assert!(
        (written..=written + MIB).contains(&usage.used_bytes),
        "{usage:?} after {written} bytes"
    );
    assert!(usage.inodes >= 3, "vol, sub, data: {usage:?}");

    // Raising the limit (expansion) lets more in; clearing it removes it.
    projquota::set_project_limit(root, id, 30 * MIB).unwrap();
    let (more, err) = write_until_error(&mut file, 10 * MIB);
    assert!(err.is_none() && more == 10 * MIB, "{more} {err:?}");
    projquota::clear_project_limit(root, id).unwrap();
    assert_eq!(
        projquota::project_usage(root, id).unwrap().hard_limit_bytes,
        None
    );

    // Limits are rounded up to whole KiB, never down.
    projquota::set_project_limit(root, id, 10 * MIB + 1).unwrap();
    assert_eq!(
        projquota::project_usage(root, id).unwrap().hard_limit_bytes,
        Some(10 * MIB + 1024)
    );
}

#[test]
fn xfs_project_quota_limits_writes() {
    match ScratchFs::new("xfs", 512 * MIB, &["-q", "-f"], "prjquota") {
        Ok(fs) => limits_are_enforced_and_usage_is_exact(&fs),
        Err(reason) => skip_without_quota(&reason),
    }
}

#[test]
fn ext4_project_quota_limits_writes() {
    let mkfs = ["-q", "-F", "-O", "quota,project"];
    match ScratchFs::new("ext4", 128 * MIB, &mkfs, "prjquota") {
        Ok(fs) => limits_are_enforced_and_usage_is_exact(&fs),
        Err(reason) => skip_without_quota(&reason),
    }
}

/// Project ids in the inode, with quota off: `settable` says whether a non-zero id sticks.
fn project_ids_without_quota(root: &Path, what: &str, settable: bool) {
    let quota = projquota::project_quota_enabled(root);
    eprintln!("measured ({what}): project_quota_enabled = {quota:?}");
    assert!(!quota.unwrap(), "{what}");
    // Without quota there is no usage to read, and the allocation probe fails rather than
    // guess.
    let err = projquota::project_in_use(root, PROJECT).unwrap_err();
    assert!(
        [libc::ESRCH, libc::ENOSYS].contains(&err.raw_os_error().unwrap_or(0)),
        "{what}: {err}"
    );

    let dir = root.join("vol");
    fs::create_dir(&dir).unwrap();
    let before = projquota::project_of(&dir).unwrap();
    eprintln!("measured ({what}): a fresh directory has (projid, inherit) = {before:?}");
    assert_eq!(before, (0, false), "{what}");

    let assigned = projquota::assign_project(&dir, PROJECT);
    eprintln!("measured ({what}): assign_project = {assigned:?}");
    if settable {
        assigned.unwrap();
        assert_eq!(projquota::project_of(&dir).unwrap(), (PROJECT, true));
        fs::create_dir(dir.join("child")).unwrap();
        assert_eq!(
            projquota::project_of(&dir.join("child")).unwrap(),
            (PROJECT, true)
        );
        // Back to project 0, the one every file starts in; the inherit flag stays.
        projquota::assign_project(&dir, 0).unwrap();
        assert_eq!(projquota::project_of(&dir).unwrap(), (0, true));
    } else {
        let err = assigned.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{what}: {err}");
        // ext4 sets the inherit flag before it refuses the id; btrfs and tmpfs refuse both.
        let ext4 = stickyvol::host::fsstat::filesystem_kind(root).unwrap()
            == stickyvol::host::fsstat::FsKind::Ext4;
        let after = projquota::project_of(&dir).unwrap();
        eprintln!("measured ({what}): after the refused assignment (projid, inherit) = {after:?}");
        assert_eq!(after, (0, ext4), "{what}");
        // Project 0 plus the inherit flag: ext4 takes it, btrfs and tmpfs refuse the flag.
        let zero = projquota::assign_project(&dir, 0);
        eprintln!("measured ({what}): assign_project(0) = {zero:?}");
        if ext4 {
            zero.unwrap();
            assert_eq!(projquota::project_of(&dir).unwrap(), (0, true), "{what}");
        } else {
            let err = zero.unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{what}: {err}");
            assert_eq!(projquota::project_of(&dir).unwrap(), (0, false), "{what}");
        }
    }

    // Symlinks are not followed.
    symlink("vol", root.join("link")).unwrap();
    let err = projquota::assign_project(&root.join("link"), PROJECT).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{what}: {err}");
    let err = projquota::project_of(&root.join("link")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{what}: {err}");
}

#[test]
fn xfs_without_quota_keeps_project_ids() {
    match ScratchFs::new("xfs", 512 * MIB, &["-q", "-f"], "") {
        Ok(fs) => project_ids_without_quota(&fs.mount_point, "xfs, no quota", true),
        Err(reason) => eprintln!("SKIPPED: no scratch XFS here ({reason})"),
    }
}

#[test]
fn ext4_with_the_project_feature_keeps_project_ids_without_quota() {
    match ScratchFs::new("ext4", 64 * MIB, &["-q", "-F", "-O", "project"], "") {
        Ok(fs) => project_ids_without_quota(&fs.mount_point, "ext4 -O project, no quota", true),
        // This kernel refuses to mount the project feature without quota support as well.
        Err(reason) => skip_without_quota(&reason),
    }
}

#[test]
fn ext4_without_the_project_feature_refuses_project_ids() {
    match ScratchFs::new("ext4", 64 * MIB, &["-q", "-F"], "") {
        Ok(fs) => project_ids_without_quota(&fs.mount_point, "ext4", false),
        Err(reason) => eprintln!("SKIPPED: no scratch ext4 here ({reason})"),
    }
}

#[test]
fn btrfs_reads_but_refuses_project_ids() {
    match ScratchFs::new("btrfs", 256 * MIB, &["-q"], "") {
        Ok(fs) => project_ids_without_quota(&fs.mount_point, "btrfs", false),
        Err(reason) => eprintln!("SKIPPED: no scratch btrfs here ({reason})"),
    }
}

#[test]
fn tmpfs_project_ids() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let mount = TmpfsMount::new(dir.path(), "4m", MsFlags::empty());
    project_ids_without_quota(dir.path(), "tmpfs", false);
    drop(mount);
}
