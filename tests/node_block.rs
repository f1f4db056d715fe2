//! Node service with raw block volumes: the target is a symlink to a loop device over the
//! volume's file, shared by all targets and detached after the last unpublish.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;

use common::*;
use csi::volume_usage::Unit;
use stickyvol::host::loopdev;

fn snw() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

const DATA_LEN: usize = MIB as usize;

#[tokio::test]
async fn publish_links_a_direct_io_loop_device_and_data_survives_republish() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_block_volume().await;
    let file = host_path(&volume);

    let device = linked_device(&target);
    assert_eq!(loop_devices_of(&file), vec![device.clone()]);
    assert!(
        loopdev::uses_direct_io(&device).unwrap(),
        "{} should use direct I/O",
        device.name()
    );
    assert!(!loopdev::is_read_only(&device).unwrap());
    assert_eq!(
        loopdev::size_bytes(&device).unwrap(),
        volume.capacity_bytes as u64
    );

    let data = pattern(DATA_LEN, 7);
    write_direct(&target, &data);
    driver.unpublish_ok(&volume, &target).await;
    assert!(!exists_no_follow(&target), "the symlink must be removed");
    assert!(
        fs::read_dir(target.parent().unwrap())
            .unwrap()
            .next()
            .is_none(),
        "kubelet expects the parent to be left empty"
    );
    assert_eq!(
        loop_devices_of(&file),
        vec![],
        "the device must be detached"
    );
    assert_eq!(
        read_prefix(&file, DATA_LEN),
        data,
        "data reached the volume's file"
    );
    driver.unpublish_ok(&volume, &target).await;

    let target = driver.publish_at_new_target(&volume, snw()).await;
    assert_eq!(read_direct(&target, DATA_LEN), data);
    driver.unpublish_ok(&volume, &target).await;
    assert_eq!(loop_devices_of(&file), vec![]);
}

#[tokio::test]
async fn publish_is_idempotent() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let target = driver.block_target();
    for _ in 0..10 {
        driver.publish_ok(&volume, &target, snw()).await;
    }
    let device = linked_device(&target);
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![device]);
    driver.unpublish_ok(&volume, &target).await;
    assert!(!exists_no_follow(&target));
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![]);
}

#[tokio::test]
async fn two_targets_share_one_device_until_the_last_unpublish() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let file = host_path(&volume);
    let first = driver.publish_at_new_target(&volume, snw()).await;
    let second = driver.publish_at_new_target(&volume, snw()).await;
    let device = linked_device(&first);
    assert_eq!(linked_device(&second), device);
    assert_eq!(loop_devices_of(&file), vec![device.clone()]);

    let data = pattern(DATA_LEN, 3);
    write_direct(&first, &data);
    assert_eq!(read_direct(&second, DATA_LEN), data);

    driver.unpublish_ok(&volume, &first).await;
    assert!(!exists_no_follow(&first));
    assert_eq!(
        loop_devices_of(&file),
        vec![device],
        "still used by the second target"
    );
    assert_eq!(read_direct(&second, DATA_LEN), data);
    driver.unpublish_ok(&volume, &second).await;
    assert!(!exists_no_follow(&second));
    assert_eq!(loop_devices_of(&file), vec![]);
}

#[tokio::test]
async fn read_only_publish_gives_a_read_only_device() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let file = host_path(&volume);
    let writable = driver.publish_at_new_target(&volume, snw()).await;
    let data = pattern(DATA_LEN, 9);
    write_direct(&writable, &data);
    driver.unpublish_ok(&volume, &writable).await;

    let target = driver.block_target();
    driver.publish(&volume, &target, snw(), true).await.unwrap();
    let device = linked_device(&target);
    assert!(loopdev::is_read_only(&device).unwrap());
    assert_eq!(read_direct(&target, DATA_LEN), data);
    let write = OpenOptions::new()
        .write(true)
        .open(&target)
        .and_then(|mut dev| dev.write_all(&[0u8; 4096]).and_then(|()| dev.sync_all()));
    assert!(write.is_err(), "writing to a read-only device succeeded");
    // Same target, now read-write: a conflict.
    expect_code(
        driver.publish(&volume, &target, snw(), false).await,
        Code::AlreadyExists,
    );
    driver.unpublish_ok(&volume, &target).await;
    assert_eq!(loop_devices_of(&file), vec![]);
    assert_eq!(read_prefix(&file, DATA_LEN), data);
}

#[tokio::test]
async fn single_writer_block_volume_refuses_a_second_writer() {
    let driver = TestDriver::start().await;
    let cap = block_cap(Mode::SingleNodeSingleWriter);
    let volume = driver.create_with_capability(cap.clone()).await;
    let first = driver.publish_at_new_target(&volume, cap.clone()).await;
    let second = driver.block_target();
    expect_code(
        driver.publish(&volume, &second, cap.clone(), false).await,
        Code::FailedPrecondition,
    );
    assert!(!exists_no_follow(&second));
    assert_eq!(loop_devices_of(&host_path(&volume)).len(), 1);
    driver.unpublish_ok(&volume, &first).await;
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![]);
}

#[tokio::test]
async fn publish_replaces_a_placeholder_left_at_the_target() {
    // Some COs (csi-sanity among them) create the target themselves.
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let as_file = driver.block_target();
    fs::write(&as_file, b"").unwrap();
    driver.publish_ok(&volume, &as_file, snw()).await;
    linked_device(&as_file);
    driver.unpublish_ok(&volume, &as_file).await;
    assert!(!exists_no_follow(&as_file));

    let as_dir = driver.block_target();
    fs::create_dir(&as_dir).unwrap();
    driver.publish_ok(&volume, &as_dir, snw()).await;
    linked_device(&as_dir);
    driver.unpublish_ok(&volume, &as_dir).await;
    assert!(!exists_no_follow(&as_dir));

    let with_content = driver.block_target();
    fs::write(&with_content, b"not ours").unwrap();
    expect_code(
        driver.publish(&volume, &with_content, snw(), false).await,
        Code::FailedPrecondition,
    );
    assert_eq!(fs::read(&with_content).unwrap(), b"not ours");
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![]);
}

#[tokio::test]
async fn block_and_mount_capabilities_do_not_mix() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let target = driver.mount_target();
    expect_code(
        driver
            .publish(&volume, &target, mount_cap(Mode::SingleNodeWriter), false)
            .await,
        Code::InvalidArgument,
    );
    assert!(!exists_no_follow(&target));
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![]);
}

#[tokio::test]
async fn stats_of_a_block_volume() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let target = driver.block_target();
    let path = path_str(&target);
    expect_code(driver.stats(&volume.volume_id, &path).await, Code::NotFound);
    driver.publish_ok(&volume, &target, snw()).await;
    let stats = driver.stats(&volume.volume_id, &path).await.unwrap();
    let bytes = usage_of(&stats, Unit::Bytes).expect("bytes usage");
    assert_eq!(bytes.total, volume.capacity_bytes);
    assert!(!stats.volume_condition.expect("condition").abnormal);

    write_direct(&target, &pattern(2 * DATA_LEN, 1));
    let after = driver.stats(&volume.volume_id, &path).await.unwrap();
    let bytes_after = usage_of(&after, Unit::Bytes).unwrap();
    assert_eq!(bytes_after.total, volume.capacity_bytes);
    assert!(
        bytes_after.used >= bytes.used + 2 * MIB,
        "{bytes:?} → {bytes_after:?}"
    );
    assert_eq!(bytes_after.used + bytes_after.available, bytes_after.total);

    expect_code(
        driver.stats(&volume.volume_id, "some/path").await,
        Code::NotFound,
    );
    driver.unpublish_ok(&volume, &target).await;
    expect_code(driver.stats(&volume.volume_id, &path).await, Code::NotFound);
}

#[tokio::test]
async fn stats_report_an_abnormal_condition_when_the_file_disappears() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_block_volume().await;
    let device = linked_device(&target);
    let file = host_path(&volume);
    fs::remove_file(&file).unwrap();
    let stats = driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .expect("stats of a published volume whose file vanished");
    assert!(stats.volume_condition.expect("condition").abnormal);
    driver.unpublish_ok(&volume, &target).await;
    assert!(!exists_no_follow(&target));
    // The kernel names the backing file "<path> (deleted)" now; another test may already
    // have been given the freed device number, so only check it no longer serves our file.
    let backing = loopdev::backing_file(&device).unwrap();
    assert!(
        !backing.is_some_and(|b| b.to_string_lossy().starts_with(&*file.to_string_lossy())),
        "the device over the deleted file must be detached"
    );
}

/// The kernel names a loop device's backing file by the path it was attached through. A driver
/// restarted in another mount namespace (a new container) sees its data dir at another path;
/// simulated here by a bind mount of the data dir.
#[tokio::test]
async fn devices_are_still_recognised_when_the_data_dir_path_changes() {
    let mut driver = TestDriver::start().await;
    let (volume, target) = driver.published_block_volume().await;
    let device = linked_device(&target);
    driver.stop().await;

    let moved = driver.root.join("data-seen-elsewhere");
    fs::create_dir(&moved).unwrap();
    nix::mount::mount(
        Some(&driver.data),
        &moved,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("bind-mounting the data dir elsewhere");
    let original_data = std::mem::replace(&mut driver.data, moved);
    driver.start_again().await;

    // Still published, same device: not forgotten, not duplicated.
    driver.assert_published_on(&[&volume], &[NODE_ID]).await;
    driver
        .publish(&volume, &target, block_cap(Mode::SingleNodeWriter), false)
        .await
        .expect("republishing the same target");
    assert_eq!(linked_device(&target), device);
    let original_file = original_data
        .join("volumes")
        .join(format!("{}.img", volume.volume_id));
    assert_eq!(loop_devices_of(&original_file), vec![device]);

    driver.unpublish_ok(&volume, &target).await;
    assert_eq!(loop_devices_of(&original_file), vec![], "device released");
}
