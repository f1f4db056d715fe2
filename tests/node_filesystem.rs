//! Node service with filesystem volumes, as kubelet drives it: NodePublishVolume (a bind mount
//! of the volume's directory), NodeUnpublishVolume, NodeGetVolumeStats.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;
use csi::volume_usage::Unit;

fn snw() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

#[tokio::test]
async fn publish_bind_mounts_the_volume_at_a_new_target() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;

    let mounts = mounts_at(&target);
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert!(has_option(&mounts[0], "rw"), "{mounts:?}");
    fs::write(target.join("hello"), b"from the pod").unwrap();
    assert_eq!(
        fs::read(host_path(&volume).join("hello")).unwrap(),
        b"from the pod"
    );

    driver.unpublish_ok(&volume, &target).await;
    assert!(mounts_at(&target).is_empty());
    assert!(!exists_no_follow(&target), "the target dir must be removed");
    assert!(target.parent().unwrap().is_dir(), "kubelet's dir stays");
    // The data stays with the volume.
    assert_eq!(
        fs::read(host_path(&volume).join("hello")).unwrap(),
        b"from the pod"
    );
    // Again (kubelet retries), and for an id we do not know with the target gone.
    driver.unpublish_ok(&volume, &target).await;
    driver
        .unpublish(&unknown_volume_id(), &target)
        .await
        .unwrap();
    driver.unpublish("fake-vol-id", &target).await.unwrap();
}

#[tokio::test]
async fn publish_is_idempotent_without_stacking_mounts() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let target = driver.mount_target();
    for _ in 0..10 {
        driver.publish_ok(&volume, &target, snw()).await;
    }
    assert_eq!(mounts_at(&target).len(), 1);
    driver.unpublish_ok(&volume, &target).await;
    assert!(mounts_at(&target).is_empty());
    assert!(!exists_no_follow(&target));
}

#[tokio::test]
async fn publish_read_only() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    fs::write(host_path(&volume).join("existing"), b"data").unwrap();
    let target = driver.mount_target();
    driver.publish(&volume, &target, snw(), true).await.unwrap();
    let mounts = mounts_at(&target);
    assert_eq!(mounts.len(), 1);
    assert!(has_option(&mounts[0], "ro"), "{mounts:?}");
    assert_eq!(fs::read(target.join("existing")).unwrap(), b"data");
    let err = fs::write(target.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // The same target asked read-write now: a conflict, not a silent change.
    expect_code(
        driver.publish(&volume, &target, snw(), false).await,
        Code::AlreadyExists,
    );
    assert!(has_option(&mounts_at(&target)[0], "ro"));
    driver.unpublish_ok(&volume, &target).await;
    assert!(!exists_no_follow(&target));
}

#[tokio::test]
async fn reader_only_access_mode_publishes_read_only() {
    let driver = TestDriver::start().await;
    let cap = mount_cap(Mode::SingleNodeReaderOnly);
    let volume = driver.create_with_capability(cap.clone()).await;
    // Not asked read-only: the access mode alone makes it so.
    let target = driver.publish_at_new_target(&volume, cap).await;
    assert!(has_option(&mounts_at(&target)[0], "ro"));
    let err = fs::write(target.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    driver.unpublish_ok(&volume, &target).await;
}

#[tokio::test]
async fn publish_honours_mount_flags() {
    let driver = TestDriver::start().await;
    let cap = mount_cap_with_flags(Mode::SingleNodeWriter, &["noexec", "nosuid,nodev"]);
    let volume = driver.create_with_capability(cap.clone()).await;
    let target = driver.publish_at_new_target(&volume, cap).await;
    let mounts = mounts_at(&target);
    assert_eq!(mounts.len(), 1);
    for option in ["noexec", "nosuid", "nodev", "rw"] {
        assert!(has_option(&mounts[0], option), "{option}: {mounts:?}");
    }
    let program = target.join("true");
    fs::copy("/bin/true", &program).unwrap();
    fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
    let err = Command::new(&program).status().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    driver.unpublish_ok(&volume, &target).await;

    // Flags a bind mount cannot honour are refused before anything happens.
    let target = driver.mount_target();
    let bad = mount_cap_with_flags(Mode::SingleNodeWriter, &["size=1G"]);
    expect_code(
        driver.publish(&volume, &target, bad, false).await,
        Code::InvalidArgument,
    );
    assert!(!exists_no_follow(&target));
}

#[tokio::test]
async fn single_writer_volume_refuses_a_second_writer() {
    let driver = TestDriver::start().await;
    let cap = mount_cap(Mode::SingleNodeSingleWriter);
    let volume = driver.create_with_capability(cap.clone()).await;
    let first = driver.publish_at_new_target(&volume, cap.clone()).await;
    let second = driver.mount_target();
    expect_code(
        driver.publish(&volume, &second, cap.clone(), false).await,
        Code::FailedPrecondition,
    );
    assert!(
        !exists_no_follow(&second),
        "nothing may be left at the refused target"
    );
    assert!(mounts_at(&second).is_empty());
    // Once the first writer is gone, the second may publish.
    driver.unpublish_ok(&volume, &first).await;
    driver.publish_ok(&volume, &second, cap).await;
    driver.unpublish_ok(&volume, &second).await;
}

#[tokio::test]
async fn multi_writer_volume_publishes_at_two_targets() {
    let driver = TestDriver::start().await;
    let cap = mount_cap(Mode::SingleNodeMultiWriter);
    let volume = driver.create_with_capability(cap.clone()).await;
    let first = driver.publish_at_new_target(&volume, cap.clone()).await;
    let second = driver.publish_at_new_target(&volume, cap).await;
    assert_eq!(mounts_at(&first).len(), 1);
    assert_eq!(mounts_at(&second).len(), 1);
    fs::write(first.join("shared"), b"one").unwrap();
    assert_eq!(fs::read(second.join("shared")).unwrap(), b"one");
    driver.unpublish_ok(&volume, &first).await;
    assert_eq!(fs::read(second.join("shared")).unwrap(), b"one");
    driver.unpublish_ok(&volume, &second).await;
    assert!(!exists_no_follow(&first) && !exists_no_follow(&second));
}

#[tokio::test]
async fn publish_validates_arguments_before_looking_up_the_volume() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let target = driver.mount_target();
    let valid = publish_request(&volume, &target, snw(), false);
    let unknown = csi::NodePublishVolumeRequest {
        volume_id: "fake-vol-id-d099c560-c".into(),
        ..valid.clone()
    };
    let outside = driver.root.join("outside/mount");
    let cases = [
        (
            "no volume id",
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..valid.clone()
            },
        ),
        (
            "no target",
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..unknown.clone()
            },
        ),
        (
            "no capability",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..unknown.clone()
            },
        ),
        (
            "no capability, known volume",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..valid.clone()
            },
        ),
        (
            "no access mode",
            csi::NodePublishVolumeRequest {
                volume_capability: Some(csi::VolumeCapability {
                    access_mode: None,
                    ..snw()
                }),
                ..valid.clone()
            },
        ),
        (
            "target outside the kubelet dir",
            csi::NodePublishVolumeRequest {
                target_path: path_str(&outside),
                ..valid.clone()
            },
        ),
        (
            "relative target",
            csi::NodePublishVolumeRequest {
                target_path: "pods/x/volumes/mount".into(),
                ..valid.clone()
            },
        ),
        (
            "target with ..",
            csi::NodePublishVolumeRequest {
                target_path: format!("{}/pods/../../outside/mount", driver.kubelet.display()),
                ..valid.clone()
            },
        ),
        (
            "the kubelet dir itself",
            csi::NodePublishVolumeRequest {
                target_path: path_str(&driver.kubelet),
                ..valid.clone()
            },
        ),
        (
            "block capability on a mount volume",
            csi::NodePublishVolumeRequest {
                volume_capability: Some(block_cap(Mode::SingleNodeWriter)),
                ..valid.clone()
            },
        ),
        (
            "multi-node mode",
            csi::NodePublishVolumeRequest {
                volume_capability: Some(mount_cap(Mode::MultiNodeMultiWriter)),
                ..valid.clone()
            },
        ),
    ];
    for (what, request) in cases {
        let result = driver.node().node_publish_volume(request).await;
        match result {
            Ok(_) => panic!("{what}: accepted"),
            Err(status) => assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}"),
        }
    }
    assert!(!exists_no_follow(&target));
    assert!(!exists_no_follow(&outside));
    assert!(!exists_no_follow(outside.parent().unwrap()));

    for id in ["fake-vol-id-d099c560-c".to_string(), unknown_volume_id()] {
        let request = csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            ..valid.clone()
        };
        let status = expect_code(
            driver.node().node_publish_volume(request).await,
            Code::NotFound,
        );
        assert!(!status.message().is_empty(), "{id}");
    }
    assert!(!exists_no_follow(&target));
}

/// Kubelet normally makes the target's parent; when it has not, the driver does. A parent
/// reached through a symlink that stays inside the kubelet dir is accepted.
#[tokio::test]
async fn publish_makes_a_missing_parent_and_follows_symlinks_inside_the_kubelet_dir() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let missing = driver
        .kubelet
        .join("pods/new-pod/volumes/kubernetes.io~csi/pv/mount");
    driver.publish_ok(&volume, &missing, snw()).await;
    assert_eq!(mounts_at(&missing).len(), 1);
    driver.unpublish_ok(&volume, &missing).await;
    assert!(
        missing.parent().unwrap().is_dir(),
        "the parent made for kubelet stays"
    );

    let real = driver.kubelet.join("pods/real-pod");
    fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, driver.kubelet.join("pods/linked-pod")).unwrap();
    let linked = driver.kubelet.join("pods/linked-pod/mount");
    driver.publish_ok(&volume, &linked, snw()).await;
    assert_eq!(
        mounts_at(&real.join("mount")).len(),
        1,
        "mounted where the link leads"
    );
    driver.unpublish_ok(&volume, &linked).await;
    assert!(!exists_no_follow(&real.join("mount")));
}

#[tokio::test]
async fn publish_refuses_a_parent_that_escapes_through_a_symlink() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let outside = driver.root.join("outside");
    fs::create_dir(&outside).unwrap();
    let pod = driver.kubelet.join("pods/evil");
    fs::create_dir_all(&pod).unwrap();
    std::os::unix::fs::symlink(&outside, pod.join("volumes")).unwrap();
    let target = pod.join("volumes/mount");
    expect_code(
        driver.publish(&volume, &target, snw(), false).await,
        Code::InvalidArgument,
    );
    assert!(!exists_no_follow(&outside.join("mount")));
    assert!(mounts_at(&outside.join("mount")).is_empty());
}

#[tokio::test]
async fn unpublish_validates_arguments() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let target = driver.mount_target();
    expect_code(driver.unpublish("", &target).await, Code::InvalidArgument);
    expect_code(
        driver
            .node()
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: "fake-vol-id-d099c560-c".into(),
                target_path: String::new(),
            })
            .await,
        Code::InvalidArgument,
    );
    let outside = driver.root.join("outside");
    fs::create_dir(&outside).unwrap();
    expect_code(
        driver.unpublish(&volume.volume_id, &outside).await,
        Code::InvalidArgument,
    );
    assert!(
        outside.is_dir(),
        "nothing outside the kubelet dir is touched"
    );
    expect_code(
        driver
            .unpublish(&volume.volume_id, std::path::Path::new("pods/x/mount"))
            .await,
        Code::InvalidArgument,
    );
    // A never-published volume with no target: nothing to do.
    driver.unpublish_ok(&volume, &target).await;
}

#[tokio::test]
async fn unpublish_of_an_unknown_volume_leaves_foreign_mounts_alone() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    // Kubelet mixing up ids must not make us unmount (or report gone) someone's live mount.
    expect_code(
        driver.unpublish(&unknown_volume_id(), &target).await,
        Code::FailedPrecondition,
    );
    assert_eq!(mounts_at(&target).len(), 1);
    driver.unpublish_ok(&volume, &target).await;
    assert!(!exists_no_follow(&target));
}

#[tokio::test]
async fn stats_report_the_volume_itself() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    let path = path_str(&target);

    let before = driver.stats(&volume.volume_id, &path).await.unwrap();
    let bytes = usage_of(&before, Unit::Bytes).expect("bytes usage");
    let inodes = usage_of(&before, Unit::Inodes).expect("inodes usage");
    assert_eq!(bytes.total, volume.capacity_bytes);
    assert!(bytes.used >= 0 && bytes.used < MIB, "{bytes:?}");
    assert_eq!(bytes.available + bytes.used, bytes.total, "{bytes:?}");
    assert!(
        inodes.used >= 1 && inodes.total >= inodes.used,
        "{inodes:?}"
    );
    let condition = before.volume_condition.expect("condition");
    assert!(!condition.abnormal, "{condition:?}");

    let written = 3 * MIB;
    fs::create_dir(target.join("dir")).unwrap();
    write_synced(&target.join("dir/data"), &pattern(written as usize, 1));
    let after = driver.stats(&volume.volume_id, &path).await.unwrap();
    let bytes_after = usage_of(&after, Unit::Bytes).unwrap();
    let inodes_after = usage_of(&after, Unit::Inodes).unwrap();
    assert_eq!(bytes_after.total, volume.capacity_bytes);
    assert!(
        bytes_after.used >= bytes.used + written,
        "{bytes:?} → {bytes_after:?}"
    );
    assert!(
        bytes_after.used < bytes.used + written + MIB,
        "{bytes_after:?}"
    );
    assert!(
        bytes_after.available <= bytes.available - written,
        "{bytes_after:?}"
    );
    assert_eq!(
        inodes_after.used,
        inodes.used + 2,
        "{inodes:?} → {inodes_after:?}"
    );
    driver.unpublish_ok(&volume, &target).await;
}

#[tokio::test]
async fn stats_argument_and_lookup_errors() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let target = driver.mount_target();
    let path = path_str(&target);
    // Not published yet.
    expect_code(driver.stats(&volume.volume_id, &path).await, Code::NotFound);
    driver.publish_ok(&volume, &target, snw()).await;

    expect_code(driver.stats("", "some/path").await, Code::InvalidArgument);
    expect_code(
        driver.stats("fake-vol-id-d099c560-c", "").await,
        Code::InvalidArgument,
    );
    expect_code(
        driver.stats(&volume.volume_id, "").await,
        Code::InvalidArgument,
    );
    for id in ["fake-vol-id-d099c560-c".to_string(), unknown_volume_id()] {
        expect_code(driver.stats(&id, "some/path").await, Code::NotFound);
        expect_code(driver.stats(&id, &path).await, Code::NotFound);
    }
    let elsewhere = driver.mount_target();
    for other in [
        "some/path".to_string(),
        path_str(&elsewhere),
        path_str(&host_path(&volume)),
    ] {
        expect_code(
            driver.stats(&volume.volume_id, &other).await,
            Code::NotFound,
        );
    }
    driver
        .stats(&volume.volume_id, &path)
        .await
        .expect("stats where published");
    driver.unpublish_ok(&volume, &target).await;
    expect_code(driver.stats(&volume.volume_id, &path).await, Code::NotFound);
}

#[tokio::test]
async fn stats_report_an_abnormal_condition_when_the_data_disappears() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    fs::write(target.join("file"), b"x").unwrap();
    // An admin (or a disk cleanup) removes the data directory behind the driver's back.
    fs::remove_dir_all(host_path(&volume)).unwrap();

    let stats = driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .expect("stats of a published volume whose data vanished");
    let condition = stats.volume_condition.expect("condition");
    assert!(condition.abnormal, "{condition:?}");
    assert!(!condition.message.is_empty());
    // Kubelet can still tear the pod down.
    driver.unpublish_ok(&volume, &target).await;
    assert!(mounts_at(&target).is_empty());
    assert!(!exists_no_follow(&target));
}
