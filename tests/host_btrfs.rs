//! host::btrfs against a real, loop-backed btrfs: subvolumes, qgroup limits that make writes
//! fail with EDQUOT, usage, deletion. Prints what it measures (errnos, when usage updates,
//! what a sync costs) for the record; asserts only on behaviour, never on time.

mod common;

use common::{fallocate, on_this_machine};

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use common::scratchfs::ScratchFs;
use stickyvol::host::btrfs;
use stickyvol::host::safe_delete;

const MIB: u64 = 1 << 20;

/// A fresh btrfs with quota enabled.
fn btrfs_with_quota() -> ScratchFs {
    btrfs_with_quota_mounted("")
}

fn btrfs_with_quota_mounted(options: &str) -> ScratchFs {
    let fs = ScratchFs::new("btrfs", 256 * MIB, &["-q"], options);
    assert!(!btrfs::quota_enabled(&fs.mount_point).unwrap());
    btrfs::enable_quota(&fs.mount_point).expect("enabling quota");
    assert!(btrfs::quota_enabled(&fs.mount_point).unwrap());
    // Enabling twice is harmless.
    btrfs::enable_quota(&fs.mount_point).expect("enabling quota again");
    fs
}

/// Appends 1 MiB chunks to `file` until `total` bytes or an error; returns bytes written and
/// the error, if any.
fn write_until_error(file: &mut File, total: u64) -> (u64, Option<io::Error>) {
    let chunk = vec![0x5a_u8; MIB as usize];
    let mut written = 0;
    while written < total {
        // write(2) may write part of a chunk before failing, so count what each call took.
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(err) => return (written, Some(err)),
        }
    }
    (written, None)
}

fn create_file(path: &Path) -> File {
    OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()))
}

#[test]
fn a_qgroup_limit_stops_writes_with_edquot_and_can_be_raised_and_lowered() {
    let fs = btrfs_with_quota();
    let pool = &fs.mount_point;
    btrfs::create_subvolume(pool, "vol").unwrap();
    let vol = fs.path("vol");
    assert!(btrfs::is_subvolume(&vol).unwrap());
    assert!(
        btrfs::is_subvolume(pool).unwrap(),
        "the top level is a subvolume too"
    );
    let id = btrfs::subvolume_id(&vol).unwrap();
    assert!(id >= 256, "subvolume ids start at 256, got {id}");
    assert_eq!(btrfs::subvolume_id(pool).unwrap(), 5);
    let fsid = btrfs::filesystem_id(pool).unwrap();
    assert!(
        Path::new("/sys/fs/btrfs").join(&fsid).is_dir(),
        "no sysfs directory for {fsid}"
    );
    assert_eq!(btrfs::filesystem_id(&vol).unwrap(), fsid);

    let fresh = btrfs::usage(pool, id).unwrap();
    assert_eq!(fresh.max_referenced, None, "no limit yet: {fresh:?}");

    btrfs::set_limit(&vol, 10 * MIB).unwrap();
    assert_eq!(
        btrfs::usage(pool, id).unwrap().max_referenced,
        Some(10 * MIB)
    );

    // When does usage show a write? Measured under the limit: at EDQUOT the kernel commits by
    // itself to reclaim reservations, which would hide the lag.
    let mut file = create_file(&vol.join("data"));
    let (first, err) = write_until_error(&mut file, 4 * MIB);
    assert!(err.is_none(), "4 MiB under a 10 MiB limit: {err:?}");
    let before_sync = btrfs::usage(pool, id).unwrap();
    let started = Instant::now();
    btrfs::sync(&vol).unwrap();
    let sync_took = started.elapsed();
    let after_sync = btrfs::usage(pool, id).unwrap();
    eprintln!(
        "measured: after writing {first} bytes referenced is {} before sync, {} after a sync \
         taking {sync_took:?}",
        before_sync.referenced, after_sync.referenced
    );
    assert!(
        (first..=first + MIB).contains(&after_sync.referenced),
        "{after_sync:?}"
    );
    let started = Instant::now();
    btrfs::sync(&vol).unwrap();
    eprintln!(
        "measured: a sync with nothing dirty takes {:?}",
        started.elapsed()
    );

    // write(2) past the limit.
    let (more, err) = write_until_error(&mut file, 16 * MIB);
    let written = first + more;
    let err = err.expect("20 MiB fit under a 10 MiB limit");
    eprintln!("measured: write(2) past a 10 MiB qgroup limit failed after {written} bytes: {err}");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!(
        (8 * MIB..=10 * MIB).contains(&written),
        "stopped at {written} bytes"
    );

    btrfs::sync(&vol).unwrap();
    let after_sync = btrfs::usage(pool, id).unwrap();
    assert!(
        after_sync.referenced >= written && after_sync.referenced <= written + MIB,
        "referenced {} for {written} bytes written",
        after_sync.referenced
    );
    assert!(after_sync.exclusive >= written, "{after_sync:?}");
    assert_eq!(after_sync.max_referenced, Some(10 * MIB));

    // fallocate past the limit.
    let err = fallocate(&file, written, 4 * MIB).expect_err("fallocate past the limit");
    eprintln!("measured: fallocate past the limit: {err}");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");

    // Raising the limit lets more in (expansion).
    btrfs::set_limit(&vol, 30 * MIB).unwrap();
    assert_eq!(
        btrfs::usage(pool, id).unwrap().max_referenced,
        Some(30 * MIB)
    );
    let (more, err) = write_until_error(&mut file, 10 * MIB);
    assert!(err.is_none(), "after raising the limit: {err:?}");
    assert_eq!(more, 10 * MIB);
    fallocate(&file, written + more, MIB).expect("fallocate under the raised limit");

    // Lowering it below usage stops further writes but keeps the data.
    btrfs::set_limit(&vol, 5 * MIB).unwrap();
    let (_, err) = write_until_error(&mut file, MIB);
    let err = err.expect("a write over a lowered limit");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");

    // Over its limit, the limit can still be changed (through the parent, see set_limit).
    btrfs::set_limit(&vol, 6 * MIB).unwrap();
    assert_eq!(
        btrfs::usage(pool, id).unwrap().max_referenced,
        Some(6 * MIB)
    );
    btrfs::set_limit(&vol, 60 * MIB).unwrap();
    let (_, err) = write_until_error(&mut file, MIB);
    assert!(err.is_none(), "after raising an exceeded limit: {err:?}");
    btrfs::set_limit(&vol, 5 * MIB).unwrap();

    // Without a limit anything fits again.
    btrfs::clear_limit(&vol).unwrap();
    let (_, err) = write_until_error(&mut file, MIB);
    assert!(err.is_none(), "without a limit: {err:?}");
    btrfs::sync(pool).unwrap();
    let cleared = btrfs::usage(pool, id).unwrap();
    assert_eq!(cleared.max_referenced, None, "{cleared:?}");
    drop(file);

    // A subvolume over its limit can still be deleted.
    btrfs::set_limit(&vol, MIB).unwrap();
    btrfs::delete_subvolume(pool, "vol").unwrap();
    assert!(!vol.exists());
}

#[test]
fn non_subvolumes_are_never_deleted() {
    let fs = btrfs_with_quota();
    let pool = &fs.mount_point;
    btrfs::create_subvolume(pool, "vol").unwrap();
    fs::create_dir(fs.path("plain")).unwrap();
    fs::write(fs.path("plain/file"), b"keep").unwrap();
    fs::write(fs.path("file"), b"keep").unwrap();
    symlink("vol", fs.path("link")).unwrap();

    assert!(!btrfs::is_subvolume(&fs.path("plain")).unwrap());
    assert!(!btrfs::is_subvolume(&fs.path("file")).unwrap());
    assert!(!btrfs::is_subvolume(&fs.path("link")).unwrap());
    assert!(btrfs::is_subvolume(&fs.path("link/.")).unwrap());

    for name in ["plain", "file", "link"] {
        let err = btrfs::delete_subvolume(pool, name).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name}: {err}");
    }
    let err = btrfs::delete_subvolume(pool, "missing").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    for bad in ["vol/", "../vol", ".", ""] {
        let err = btrfs::delete_subvolume(pool, bad).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}: {err}");
    }
    // The parent is not followed either: a symlink to the pool is no parent.
    symlink(pool, fs.path("plain/pool-link")).unwrap();
    let err = btrfs::delete_subvolume(&fs.path("plain/pool-link"), "vol").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");

    assert_eq!(fs::read(fs.path("plain/file")).unwrap(), b"keep");
    assert_eq!(fs::read(fs.path("file")).unwrap(), b"keep");
    assert!(btrfs::is_subvolume(&fs.path("vol")).unwrap());

    // Subvolume-only operations refuse plain directories rather than act on the parent.
    let err = btrfs::subvolume_id(&fs.path("plain")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    let err = btrfs::set_limit(&fs.path("plain"), MIB).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    // O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR.
    let err = btrfs::set_limit(&fs.path("link"), MIB).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");

    let err = btrfs::create_subvolume(pool, "vol").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
}

#[test]
fn a_full_subvolume_is_deleted_in_one_call_but_not_one_holding_another() {
    let fs = btrfs_with_quota();
    let pool = &fs.mount_point;

    btrfs::create_subvolume(pool, "full").unwrap();
    fs::create_dir_all(fs.path("full/a/b")).unwrap();
    fs::write(fs.path("full/a/b/data"), vec![1u8; 3 * MIB as usize]).unwrap();
    symlink("/etc", fs.path("full/a/etc")).unwrap();
    btrfs::delete_subvolume(pool, "full").unwrap();
    assert!(!fs.path("full").exists());

    btrfs::create_subvolume(pool, "outer").unwrap();
    btrfs::create_subvolume(&fs.path("outer"), "inner").unwrap();
    fs::write(fs.path("outer/inner/data"), b"x").unwrap();
    let err = btrfs::delete_subvolume(pool, "outer").unwrap_err();
    eprintln!("measured: deleting a subvolume that holds another: {err}");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY), "{err}");
    assert!(btrfs::is_subvolume(&fs.path("outer/inner")).unwrap());

    // Our no-follow removal empties the nested subvolume and rmdir(2) removes its root.
    safe_delete::remove_all(&fs.path("outer/inner")).unwrap();
    assert!(!fs.path("outer/inner").exists());
    btrfs::delete_subvolume(pool, "outer").unwrap();
    assert!(!fs.path("outer").exists());
}

#[test]
fn the_qgroup_of_a_deleted_subvolume_goes_away_once_the_cleaner_is_done() {
    // The cleaner drops deleted subvolumes on the periodic commit (30 s by default, measured);
    // commit=1 makes that quick enough for a test.
    let fs = btrfs_with_quota_mounted("commit=1");
    let pool = &fs.mount_point;
    btrfs::create_subvolume(pool, "vol").unwrap();
    let id = btrfs::subvolume_id(&fs.path("vol")).unwrap();
    btrfs::set_limit(&fs.path("vol"), 50 * MIB).unwrap();
    fs::write(fs.path("vol/data"), vec![7u8; 8 * MIB as usize]).unwrap();
    btrfs::sync(pool).unwrap();

    // While the subvolume exists its qgroup cannot go.
    let err = btrfs::remove_qgroup(pool, id).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");

    btrfs::delete_subvolume(pool, "vol").unwrap();
    let right_after = btrfs::remove_qgroup(pool, id);
    eprintln!("measured: remove_qgroup right after deleting the subvolume: {right_after:?}");
    if let Err(err) = &right_after {
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    }

    // Once the cleaner has dropped the subvolume, its qgroup goes: this kernel removes it by
    // itself, and where a kernel leaves it behind remove_qgroup succeeds instead of EBUSY.
    // Either way it must be gone within the wait. With commit=1 the cleaner runs every second
    // and drops an 8 MiB subvolume in one pass (measured: gone after 1.0 s here); 60 s is a
    // margin for a loaded machine (the point is "goes away", not how fast).
    let started = Instant::now();
    let mut removed_by_us = false;
    loop {
        match btrfs::usage(pool, id) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => break,
            Ok(_) => {}
            Err(err) => panic!("reading the qgroup: {err}"),
        }
        match btrfs::remove_qgroup(pool, id) {
            Ok(()) => removed_by_us = true,
            Err(err) => assert_eq!(
                err.raw_os_error(),
                Some(libc::EBUSY),
                "removing the qgroup of a subvolume being dropped: {err}"
            ),
        }
        assert!(
            started.elapsed() < on_this_machine(Duration::from_secs(60)),
            "qgroup 0/{id} of the deleted subvolume still there after {:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "measured: qgroup 0/{id} of the deleted subvolume gone after {:?} ({})",
        started.elapsed(),
        if removed_by_us {
            "removed by remove_qgroup"
        } else {
            "removed by the kernel"
        }
    );
    // Gone is gone: removing it again succeeds (callers need not know who removed it), and
    // the filesystem has no trace of it.
    btrfs::remove_qgroup(pool, id).expect("removing a qgroup that is already gone");
    let err = btrfs::usage(pool, id).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
}

#[test]
fn without_quota_limits_fail_and_usage_is_not_found() {
    let fs = ScratchFs::new("btrfs", 256 * MIB, &["-q"], "");
    let pool = &fs.mount_point;
    assert!(!btrfs::quota_enabled(pool).unwrap());
    btrfs::create_subvolume(pool, "vol").unwrap();
    let id = btrfs::subvolume_id(&fs.path("vol")).unwrap();
    let err = btrfs::set_limit(&fs.path("vol"), MIB).unwrap_err();
    eprintln!("measured: set_limit with quota off: {err}");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    let err = btrfs::usage(pool, id).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
}

#[test]
fn btrfs_calls_on_other_filesystems_fail_cleanly() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    assert!(!btrfs::is_subvolume(dir.path()).unwrap());
    let err = btrfs::filesystem_id(dir.path()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTTY), "{err}");
    let err = btrfs::create_subvolume(dir.path(), "vol").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTTY), "{err}");
}
