//! NodePublishVolume and NodeUnpublishVolume act on the directories they checked (issue 19):
//! the target's parent is opened and checked once, then the target is made, mounted, linked,
//! unmounted or removed relative to that descriptor, so swapping a path component for a
//! symlink after the check (anyone who can write kubelet's directories could) changes nothing.
//! The swap cannot be timed against the driver from outside, so the race is shown on the host
//! mechanics (un)publish uses, with the swap made between the open and the acts; the driver is
//! tested for what it refuses.

mod common;

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::symlink;

use common::*;
use stickyvol::host::{dirfd, mount};
use sys_mount::MountFlags;

fn snw() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

#[test]
fn mounts_land_and_go_in_the_directory_opened_however_its_path_is_swapped() {
    // Not started: only its directories, which its drop unmounts and removes, also on failure.
    let scratch = TestDriver::prepare(Options::default());
    let source = scratch.root.join("source");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("marker"), b"volume").unwrap();
    let outside = scratch.root.join("outside");
    fs::create_dir(&outside).unwrap();
    let pod = scratch.kubelet.join("pods/p");
    fs::create_dir_all(&pod).unwrap();

    let parent = dirfd::open_dir(&pod).unwrap();
    assert_eq!(
        dirfd::name_of(parent.as_fd()).unwrap(),
        pod,
        "what a check sees"
    );
    // The swap: the checked directory moves away and a symlink out of the kubelet dir takes
    // its name. Calls by path now land outside.
    let moved = scratch.kubelet.join("pods/p-moved");
    fs::rename(&pod, &moved).unwrap();
    symlink(&outside, &pod).unwrap();
    fs::create_dir(pod.join("by-path")).unwrap();
    assert!(outside.join("by-path").is_dir(), "the swap redirects paths");

    let target = dirfd::make_dir_at(parent.as_fd(), "mount".as_ref()).unwrap();
    mount::bind_onto(&source, target.as_fd(), MountFlags::RDONLY).unwrap();
    let landed = moved.join("mount");
    assert_eq!(fs::read(landed.join("marker")).unwrap(), b"volume");
    let mounts = mounts_at(&landed);
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert!(
        mounts[0].mount_options.split(',').any(|o| o == "ro"),
        "{mounts:?}"
    );
    assert!(!outside.join("mount").exists());
    assert!(mountinfo_under(&outside).is_empty());
    // And a name made in the opened directory never follows a symlink put there.
    symlink(&outside, moved.join("link")).unwrap();
    let err = dirfd::make_dir_at(parent.as_fd(), "link".as_ref()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
    assert!(!outside.join("link").exists());

    // Unpublish's unmount goes through the opened parent too: a mount the swapped path now
    // leads to is left alone.
    fs::create_dir(outside.join("mount")).unwrap();
    let decoy = dirfd::open_dir(&outside.join("mount")).unwrap();
    mount::bind_onto(&source, decoy.as_fd(), MountFlags::empty()).unwrap();
    drop(decoy);
    assert_eq!(mounts_at(&outside.join("mount")).len(), 1);
    mount::unmount_at(parent.as_fd(), "mount".as_ref()).unwrap();
    assert!(mounts_at(&landed).is_empty());
    assert_eq!(
        mounts_at(&outside.join("mount")).len(),
        1,
        "the decoy stays"
    );
}

fn mountinfo_under(dir: &std::path::Path) -> Vec<String> {
    stickyvol::host::mountinfo::read_self()
        .unwrap()
        .into_iter()
        .filter(|e| e.mount_point.starts_with(dir))
        .map(|e| e.mount_point.display().to_string())
        .collect()
}

/// A directory outside the kubelet dir, and a pod's directory inside it where the tests plant
/// their symlinks.
fn pod_dir_and_outside(driver: &TestDriver) -> (std::path::PathBuf, std::path::PathBuf) {
    let outside = driver.root.join("outside");
    fs::create_dir(&outside).unwrap();
    let pod = driver.kubelet.join("pods/evil");
    fs::create_dir_all(&pod).unwrap();
    (outside, pod)
}

/// A dangling symlink where a missing parent would be made: following it would create the
/// directory (and mount) outside the kubelet dir.
#[tokio::test]
async fn publish_never_makes_a_parent_through_a_dangling_symlink() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let (outside, pod) = pod_dir_and_outside(&driver);
    symlink(outside.join("made"), pod.join("volumes")).unwrap();
    for target in [pod.join("volumes/mount"), pod.join("volumes/pv/mount")] {
        let status = driver.publish(&volume, &target, snw(), false).await;
        assert!(status.is_err(), "{target:?}: {status:?}");
        assert!(!outside.join("made").exists(), "{target:?}");
        assert!(mountinfo_under(&outside).is_empty(), "{target:?}");
    }
}

/// The target itself a symlink out of the kubelet dir: never mounted through.
#[tokio::test]
async fn publish_refuses_a_target_that_is_a_symlink() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let (outside, pod) = pod_dir_and_outside(&driver);
    symlink(&outside, pod.join("mount")).unwrap();
    expect_code(
        driver
            .publish(&volume, &pod.join("mount"), snw(), false)
            .await,
        Code::FailedPrecondition,
    );
    assert!(mountinfo_under(&outside).is_empty());
}
