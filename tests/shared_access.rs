//! Shared claims pinned to one node: a StorageClass with `sharedAccess: "true"` lets claims ask
//! ReadWriteMany / ReadOnlyMany (CSI's multi-node modes). The volume lives on its node like any
//! other; every pod using it publishes the same data there. Without the parameter, multi-node
//! modes are INVALID_ARGUMENT with a message naming it.

mod common;

use std::fs;

use common::*;

const SHARED: [(&str, &str); 1] = [("sharedAccess", "true")];

fn shared_request(capability: csi::VolumeCapability) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(&SHARED),
        ..create_request(&new_name(), capability, SIZE)
    }
}

#[tokio::test]
async fn a_read_write_many_claim_is_shared_by_two_targets() {
    let driver = TestDriver::start().await;
    let rwx = mount_cap(Mode::MultiNodeMultiWriter);
    let volume = driver.create(shared_request(rwx.clone())).await;
    assert_eq!(volume.accessible_topology, vec![topology(NODE_ID)]);
    let first = driver.publish_at_new_target(&volume, rwx.clone()).await;
    let second = driver.publish_at_new_target(&volume, rwx.clone()).await;
    // Both read-write, one directory.
    fs::write(first.join("from-first"), b"1").unwrap();
    fs::write(second.join("from-second"), b"2").unwrap();
    assert_eq!(fs::read(second.join("from-first")).unwrap(), b"1");
    assert_eq!(fs::read(first.join("from-second")).unwrap(), b"2");
    let confirmed = driver
        .controller()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: volume.volume_id.clone(),
            volume_capabilities: vec![rwx.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(confirmed.confirmed.is_some(), "{}", confirmed.message);
    driver.unpublish_ok(&volume, &first).await;
    driver.unpublish_ok(&volume, &second).await;
    driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn a_read_only_many_block_claim_shares_one_read_only_device() {
    let driver = TestDriver::start().await;
    let rox = block_cap(Mode::MultiNodeReaderOnly);
    let volume = driver.create(shared_request(rox.clone())).await;
    let first = driver.publish_at_new_target(&volume, rox.clone()).await;
    let second = driver.publish_at_new_target(&volume, rox.clone()).await;
    assert_eq!(
        fs::read_link(&first).unwrap(),
        fs::read_link(&second).unwrap()
    );
    // Read-only although neither publish asked `readonly`: the mode says so. The kernel
    // says so too (BLKROGET), and a write through the device is refused.
    for target in [&first, &second] {
        assert_device_is_read_only(target);
    }
    driver.unpublish_ok(&volume, &first).await;
    driver.unpublish_ok(&volume, &second).await;
    driver.delete(&volume.volume_id).await.unwrap();
    assert!(driver.loop_devices_left().is_empty());
}

/// The block device `target` links to is read-only: BLKROGET answers 1, and a write through
/// it fails with EPERM (the block layer refuses writes to a read-only device; opening it for
/// writing is allowed, the write is not).
#[track_caller]
fn assert_device_is_read_only(target: &std::path::Path) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    // BLKROGET = _IO(0x12, 94) from linux/fs.h.
    const BLKROGET: libc::c_ulong = 0x125e;
    let device = fs::File::open(target).unwrap();
    let mut read_only: libc::c_int = -1;
    // SAFETY: BLKROGET writes one int through the pointer, which outlives the call.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), BLKROGET, &mut read_only) };
    assert_eq!(rc, 0, "BLKROGET: {}", std::io::Error::last_os_error());
    assert_eq!(
        read_only,
        1,
        "{} is not a read-only device",
        target.display()
    );
    let mut writer = fs::OpenOptions::new()
        .write(true)
        .open(target)
        .unwrap_or_else(|err| panic!("opening {} for writing: {err}", target.display()));
    let err = writer
        .write_all(&[0x5a; 4096])
        .and_then(|()| writer.sync_all())
        .expect_err("a write through a read-only device succeeded");
    assert!(
        matches!(err.raw_os_error(), Some(libc::EPERM | libc::EROFS)),
        "{err}"
    );
}

#[tokio::test]
async fn multi_node_modes_without_shared_access_are_refused_naming_the_parameter() {
    let driver = TestDriver::start().await;
    for capability in [
        mount_cap(Mode::MultiNodeMultiWriter),
        block_cap(Mode::MultiNodeReaderOnly),
    ] {
        let status = expect_code(
            driver
                .controller()
                .create_volume(create_request(&new_name(), capability, SIZE))
                .await,
            Code::InvalidArgument,
        );
        assert!(status.message().contains("sharedAccess"), "{status:?}");
    }
    // A volume of a plain class cannot be published as shared, nor confirmed as such.
    let rwo = driver.create_fs_volume().await;
    let target = driver.mount_target();
    let status = expect_code(
        driver
            .publish(&rwo, &target, mount_cap(Mode::MultiNodeMultiWriter), false)
            .await,
        Code::InvalidArgument,
    );
    assert!(status.message().contains("sharedAccess"), "{status:?}");
    let answer = driver
        .controller()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: rwo.volume_id.clone(),
            volume_capabilities: vec![mount_cap(Mode::MultiNodeMultiWriter)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.confirmed.is_none());
    assert!(
        answer.message.contains("sharedAccess"),
        "{}",
        answer.message
    );
    let status = expect_code(
        driver
            .controller()
            .create_volume(csi::CreateVolumeRequest {
                parameters: params(&[("sharedAccess", "yes")]),
                ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(status.message().contains("sharedAccess"), "{status:?}");
}

#[tokio::test]
async fn capacity_for_a_shared_class_is_reported() {
    let driver = TestDriver::start().await;
    let ask = |parameters| csi::GetCapacityRequest {
        volume_capabilities: vec![mount_cap(Mode::MultiNodeMultiWriter)],
        parameters,
        ..Default::default()
    };
    let shared = driver.get_capacity(ask(params(&SHARED))).await;
    assert!(shared.available_capacity > 0);
    let plain = driver.get_capacity(ask(params(&[]))).await;
    assert_eq!(plain.available_capacity, 0);
}
