//! NodeExpandVolume: a filesystem volume's recorded size grows; a block volume's file grows and
//! every loop device over it learns the new size while published, data intact. Shrinking,
//! unknown volumes, malformed requests and growth beyond the free space are refused.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use csi::volume_usage::Unit;

const DATA_LEN: usize = MIB as usize;

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

fn snw_block() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

fn file_size(path: &Path) -> u64 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .len()
}

/// The capacity ListVolumes reports for `id`.
async fn listed_capacity(driver: &TestDriver, id: &str) -> i64 {
    driver
        .list_all()
        .await
        .into_iter()
        .filter_map(|e| e.volume)
        .find(|v| v.volume_id == id)
        .unwrap_or_else(|| panic!("{id} not listed"))
        .capacity_bytes
}

/// Every way the driver reports a volume's size agrees on `capacity`.
async fn assert_capacity(driver: &TestDriver, id: &str, published_at: &Path, capacity: i64) {
    assert_eq!(
        driver.capacity_of(id).await,
        capacity,
        "ControllerGetVolume"
    );
    assert_eq!(listed_capacity(driver, id).await, capacity, "ListVolumes");
    let stats = driver
        .stats(id, &path_str(published_at))
        .await
        .expect("NodeGetVolumeStats");
    let bytes = usage_of(&stats, Unit::Bytes).expect("bytes usage");
    assert_eq!(bytes.total, capacity, "NodeGetVolumeStats total");
    assert_eq!(bytes.used + bytes.available, bytes.total, "{bytes:?}");
}

/// A published block volume: its file, target and loop device.
struct PublishedBlock {
    volume: csi::Volume,
    file: std::path::PathBuf,
    target: std::path::PathBuf,
}

async fn published_block(driver: &TestDriver) -> PublishedBlock {
    let (volume, target) = driver.published_block_volume().await;
    PublishedBlock {
        file: host_path(&volume),
        volume,
        target,
    }
}

#[tokio::test]
async fn growing_a_filesystem_volume_records_the_new_size() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    fs::write(target.join("kept"), b"data").unwrap();
    assert_capacity(&driver, &volume.volume_id, &target, SIZE).await;

    // Not a multiple of 4 KiB: rounded up like CreateVolume does.
    let grown = driver
        .expand(expand_request(&volume.volume_id, &target, 2 * SIZE + 1, 0))
        .await
        .expect("NodeExpandVolume");
    assert_eq!(grown, 2 * SIZE + 4096);
    assert_capacity(&driver, &volume.volume_id, &target, grown).await;
    assert_eq!(fs::read(target.join("kept")).unwrap(), b"data");
    assert!(host_path(&volume).is_dir());

    // Within a limit that leaves room: the required size, aligned.
    let grown_again = driver
        .expand(expand_request(
            &volume.volume_id,
            &target,
            3 * SIZE,
            4 * SIZE,
        ))
        .await
        .unwrap();
    assert_eq!(grown_again, 3 * SIZE);
    assert_capacity(&driver, &volume.volume_id, &target, grown_again).await;
}

#[tokio::test]
async fn growing_a_published_block_volume_resizes_file_and_device_online() {
    let driver = TestDriver::start().await;
    let block = published_block(&driver).await;
    let device = linked_device(&block.target);
    assert_eq!(sysfs_size_bytes(&device), SIZE as u64);
    let before = pattern(DATA_LEN, 11);
    write_direct(&block.target, &before);
    let tail_of_old = pattern(DATA_LEN, 12);
    write_direct_at(
        &block.target,
        (SIZE as usize - DATA_LEN) as u64,
        &tail_of_old,
    );

    let new_size = 3 * SIZE;
    let grown = driver
        .expand(expand_request(
            &block.volume.volume_id,
            &block.target,
            new_size,
            0,
        ))
        .await
        .expect("NodeExpandVolume");
    assert_eq!(grown, new_size);
    assert_eq!(file_size(&block.file), new_size as u64);
    // Same device, still the only one, now bigger.
    assert_eq!(linked_device(&block.target), device);
    assert_eq!(loop_devices_of(&block.file), vec![device.clone()]);
    assert_eq!(sysfs_size_bytes(&device), new_size as u64);
    assert_capacity(&driver, &block.volume.volume_id, &block.target, new_size).await;

    // What was written before is intact; the new space reads as zeros and takes writes.
    assert_eq!(read_direct(&block.target, DATA_LEN), before);
    let old_end = (SIZE as usize - DATA_LEN) as u64;
    assert_eq!(
        read_direct_at(&block.target, old_end, DATA_LEN),
        tail_of_old
    );
    assert!(
        read_direct_at(&block.target, SIZE as u64, DATA_LEN)
            .iter()
            .all(|&b| b == 0)
    );
    let beyond = pattern(DATA_LEN, 13);
    let beyond_offset = (2 * SIZE + MIB) as u64;
    write_direct_at(&block.target, beyond_offset, &beyond);
    let last = pattern(DATA_LEN, 14);
    let last_offset = (new_size as usize - DATA_LEN) as u64;
    write_direct_at(&block.target, last_offset, &last);
    assert_eq!(
        read_direct_at(&block.target, beyond_offset, DATA_LEN),
        beyond
    );
    // The writes reached the volume's file.
    assert_eq!(read_prefix(&block.file, DATA_LEN), before);
    assert_eq!(read_at(&block.file, beyond_offset, DATA_LEN), beyond);
    assert_eq!(read_at(&block.file, last_offset, DATA_LEN), last);

    driver.unpublish_ok(&block.volume, &block.target).await;
    assert_eq!(loop_devices_of(&block.file), vec![]);
    assert_eq!(file_size(&block.file), new_size as u64);
}

/// kubelet sends a block volume's device node as `volume_path` (its DevicePath), not the publish
/// path in its directory: seen in a real cluster, where this was refused as INVALID_ARGUMENT.
#[tokio::test]
async fn a_block_volume_grows_when_kubelet_names_its_device() {
    let driver = TestDriver::start().await;
    let block = published_block(&driver).await;
    let device = linked_device(&block.target);
    let new_size = 2 * SIZE;
    let grown = driver
        .expand(expand_request(
            &block.volume.volume_id,
            &device.path(),
            new_size,
            0,
        ))
        .await
        .expect("NodeExpandVolume with the device as volume_path");
    assert_eq!(grown, new_size);
    assert_eq!(sysfs_size_bytes(&device), new_size as u64);
    assert_eq!(file_size(&block.file), new_size as u64);
    // Anything else outside the kubelet dir is still refused.
    for path in ["/dev/../etc/passwd", "/dev/mapper/x", "/etc/passwd"] {
        expect_code(
            driver
                .expand(expand_request(
                    &block.volume.volume_id,
                    Path::new(path),
                    3 * SIZE,
                    0,
                ))
                .await,
            Code::InvalidArgument,
        );
    }
    driver.unpublish_ok(&block.volume, &block.target).await;
}

#[tokio::test]
async fn every_device_over_the_file_grows() {
    // A read-write and a read-only target: two loop devices over one file.
    let driver = TestDriver::start().await;
    let block = published_block(&driver).await;
    let reader = driver.block_target();
    driver
        .publish(&block.volume, &reader, snw_block(), true)
        .await
        .unwrap();
    let (writer_device, reader_device) = (linked_device(&block.target), linked_device(&reader));
    assert_ne!(writer_device, reader_device);
    let grown = driver
        .expand(expand_request(
            &block.volume.volume_id,
            &reader,
            2 * SIZE,
            0,
        ))
        .await
        .unwrap();
    assert_eq!(grown, 2 * SIZE);
    for device in [&writer_device, &reader_device] {
        assert_eq!(sysfs_size_bytes(device), grown as u64, "{}", device.name());
    }
    let data = pattern(DATA_LEN, 21);
    write_direct_at(&block.target, SIZE as u64, &data);
    assert_eq!(read_direct_at(&reader, SIZE as u64, DATA_LEN), data);
    driver.unpublish_ok(&block.volume, &reader).await;
    driver.unpublish_ok(&block.volume, &block.target).await;
    assert_eq!(loop_devices_of(&block.file), vec![]);
}

#[tokio::test]
async fn an_unpublished_block_volume_grows_offline_and_publishes_at_the_new_size() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let file = host_path(&volume);
    // kubelet always names a path; the volume need not be published there.
    let path = driver.block_target();
    let grown = driver
        .expand(expand_request(&volume.volume_id, &path, 2 * SIZE, 0))
        .await
        .unwrap();
    assert_eq!(grown, 2 * SIZE);
    assert_eq!(file_size(&file), grown as u64);
    assert_eq!(driver.capacity_of(&volume.volume_id).await, grown);
    driver.publish_ok(&volume, &path, snw_block()).await;
    assert_eq!(sysfs_size_bytes(&linked_device(&path)), grown as u64);
    driver.unpublish_ok(&volume, &path).await;
}

#[tokio::test]
async fn expansion_is_idempotent_and_never_shrinks() {
    let driver = TestDriver::start().await;
    let block = published_block(&driver).await;
    let device = linked_device(&block.target);
    let id = block.volume.volume_id.as_str();
    let request = expand_request(id, &block.target, 2 * SIZE, 0);
    for _ in 0..2 {
        assert_eq!(driver.expand(request.clone()).await.unwrap(), 2 * SIZE);
        assert_eq!(file_size(&block.file), 2 * SIZE as u64);
        assert_eq!(sysfs_size_bytes(&device), 2 * SIZE as u64);
    }

    // Asking for no more than it has answers what it has, unchanged.
    for (required, limit) in [(SIZE, 0), (2 * SIZE, 0), (1, 0), (0, 0), (SIZE, 2 * SIZE)] {
        let answer = driver
            .expand(expand_request(id, &block.target, required, limit))
            .await
            .unwrap_or_else(|s| panic!("required {required}, limit {limit}: {s:?}"));
        assert_eq!(answer, 2 * SIZE, "required {required}, limit {limit}");
    }
    // capacity_range is optional (CSI spec): none asks for nothing beyond the current size.
    let no_range = csi::NodeExpandVolumeRequest {
        capacity_range: None,
        ..request.clone()
    };
    assert_eq!(driver.expand(no_range).await.unwrap(), 2 * SIZE);
    // A limit below the current size would mean shrinking.
    for (required, limit) in [(SIZE, SIZE), (0, SIZE), (2 * SIZE, 2 * SIZE - 4096)] {
        let status = expect_code(
            driver
                .expand(expand_request(id, &block.target, required, limit))
                .await,
            Code::OutOfRange,
        );
        assert!(
            status.message().contains("cannot shrink"),
            "{}",
            status.message()
        );
    }
    // A range that cannot be satisfied at all.
    expect_code(
        driver
            .expand(expand_request(id, &block.target, 3 * SIZE, 3 * SIZE - 1))
            .await,
        Code::OutOfRange,
    );
    assert_eq!(file_size(&block.file), 2 * SIZE as u64);
    assert_eq!(sysfs_size_bytes(&device), 2 * SIZE as u64);
    assert_eq!(driver.capacity_of(id).await, 2 * SIZE);
    driver.unpublish_ok(&block.volume, &block.target).await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let id = volume.volume_id.as_str();
    let path = driver.block_target();
    let valid = expand_request(id, &path, 2 * SIZE, 0);
    let outside = driver.root.join("elsewhere");
    let kubelet = path_str(&driver.kubelet);
    let cases: Vec<(&str, csi::NodeExpandVolumeRequest)> = vec![
        (
            "no volume_id",
            csi::NodeExpandVolumeRequest {
                volume_id: String::new(),
                ..valid.clone()
            },
        ),
        (
            "no volume_path",
            csi::NodeExpandVolumeRequest {
                volume_path: String::new(),
                ..valid.clone()
            },
        ),
        (
            "path outside the kubelet dir",
            expand_request(id, &outside, 2 * SIZE, 0),
        ),
        (
            "the kubelet dir itself",
            csi::NodeExpandVolumeRequest {
                volume_path: kubelet.clone(),
                ..valid.clone()
            },
        ),
        (
            "relative path",
            csi::NodeExpandVolumeRequest {
                volume_path: "pods/x/volumes/y".into(),
                ..valid.clone()
            },
        ),
        (
            "path escaping with ..",
            csi::NodeExpandVolumeRequest {
                volume_path: format!("{kubelet}/../elsewhere"),
                ..valid.clone()
            },
        ),
        (
            "path not normalized",
            csi::NodeExpandVolumeRequest {
                volume_path: format!("{kubelet}//pods/x"),
                ..valid.clone()
            },
        ),
        (
            "capability without access mode",
            csi::NodeExpandVolumeRequest {
                volume_capability: Some(csi::VolumeCapability {
                    access_mode: None,
                    ..snw_block()
                }),
                ..valid.clone()
            },
        ),
    ];
    for (what, request) in cases {
        let result = driver.expand(request).await;
        match result {
            Err(status) if status.code() == Code::InvalidArgument => {}
            other => panic!("{what}: expected INVALID_ARGUMENT, got {other:?}"),
        }
    }
    // Nothing changed; the valid request then works.
    assert_eq!(file_size(&host_path(&volume)), SIZE as u64);
    assert_eq!(driver.capacity_of(id).await, SIZE);
    assert_eq!(driver.expand(valid).await.unwrap(), 2 * SIZE);
}

#[tokio::test]
async fn negative_sizes_are_invalid_arguments() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let path = driver.mount_target();
    for (required, limit) in [(-1, 0), (0, -1), (2 * SIZE, -1), (-1, 2 * SIZE)] {
        let result = driver
            .expand(expand_request(&volume.volume_id, &path, required, limit))
            .await;
        match result {
            Err(status) if status.code() == Code::InvalidArgument => {}
            other => panic!(
                "required {required}, limit {limit}: expected INVALID_ARGUMENT, got {other:?}"
            ),
        }
    }
    assert_eq!(driver.capacity_of(&volume.volume_id).await, SIZE);
    // Arguments are checked before the volume is looked up.
    expect_code(
        driver
            .expand(expand_request(&unknown_volume_id(), &path, -1, 0))
            .await,
        Code::InvalidArgument,
    );
}

#[tokio::test]
async fn a_capability_of_the_other_access_type_is_invalid() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let mut request = expand_request(&volume.volume_id, &driver.mount_target(), 2 * SIZE, 0);
    request.volume_capability = Some(snw_block());
    expect_code(driver.expand(request.clone()).await, Code::InvalidArgument);
    assert_eq!(driver.capacity_of(&volume.volume_id).await, SIZE);
    request.volume_capability = Some(snw_mount());
    assert_eq!(driver.expand(request).await.unwrap(), 2 * SIZE);
}

#[tokio::test]
async fn an_unknown_volume_is_not_found() {
    let driver = TestDriver::start().await;
    let path = driver.block_target();
    for id in [unknown_volume_id(), "not-ours".to_string()] {
        expect_code(
            driver.expand(expand_request(&id, &path, 2 * SIZE, 0)).await,
            Code::NotFound,
        );
    }
    // Before its path is judged: csi-sanity sends an unknown id with a path that is no target.
    let outside = driver.root.join("elsewhere");
    expect_code(
        driver
            .expand(expand_request(&unknown_volume_id(), &outside, 2 * SIZE, 0))
            .await,
        Code::NotFound,
    );
    let volume = driver.create_fs_volume().await;
    driver.delete(&volume.volume_id).await.unwrap();
    expect_code(
        driver
            .expand(expand_request(&volume.volume_id, &path, 2 * SIZE, 0))
            .await,
        Code::NotFound,
    );
}

#[tokio::test]
async fn growth_beyond_the_free_space_is_resource_exhausted() {
    let driver = TestDriver::start().await;
    let block = published_block(&driver).await;
    let fs_volume = driver.create_fs_volume().await;
    // Growth by more than the whole filesystem: refused whatever else runs meanwhile.
    let too_big = (SIZE + filesystem_bytes(&driver.data) as i64 + 4096) / 4096 * 4096;
    for (volume, path) in [
        (&block.volume, block.target.clone()),
        (&fs_volume, driver.mount_target()),
    ] {
        let status = expect_code(
            driver
                .expand(expand_request(&volume.volume_id, &path, too_big, 0))
                .await,
            Code::ResourceExhausted,
        );
        assert!(!status.message().is_empty());
        assert_eq!(driver.capacity_of(&volume.volume_id).await, SIZE);
    }
    assert_eq!(file_size(&block.file), SIZE as u64);
    assert_eq!(sysfs_size_bytes(&linked_device(&block.target)), SIZE as u64);
    driver.unpublish_ok(&block.volume, &block.target).await;
}

#[tokio::test]
async fn the_new_size_survives_a_restart() {
    let mut driver = TestDriver::start().await;
    let (fs_volume, fs_target) = driver.published_fs_volume().await;
    let block = published_block(&driver).await;
    let data = pattern(DATA_LEN, 31);
    for (volume, path) in [(&fs_volume, &fs_target), (&block.volume, &block.target)] {
        let grown = driver
            .expand(expand_request(&volume.volume_id, path, 3 * SIZE, 0))
            .await
            .unwrap();
        assert_eq!(grown, 3 * SIZE);
    }
    write_direct_at(&block.target, (2 * SIZE) as u64, &data);

    driver.restart().await;
    assert_capacity(&driver, &fs_volume.volume_id, &fs_target, 3 * SIZE).await;
    assert_capacity(&driver, &block.volume.volume_id, &block.target, 3 * SIZE).await;
    assert_eq!(
        sysfs_size_bytes(&linked_device(&block.target)),
        3 * SIZE as u64
    );

    // Also after a crash, and when published anew.
    driver.kill9_and_restart().await;
    assert_eq!(driver.capacity_of(&block.volume.volume_id).await, 3 * SIZE);
    driver.unpublish_ok(&block.volume, &block.target).await;
    let target = driver
        .publish_at_new_target(&block.volume, snw_block())
        .await;
    assert_eq!(sysfs_size_bytes(&linked_device(&target)), 3 * SIZE as u64);
    assert_eq!(read_direct_at(&target, (2 * SIZE) as u64, DATA_LEN), data);
    // Growing on from the persisted size.
    assert_eq!(
        driver
            .expand(expand_request(
                &block.volume.volume_id,
                &target,
                4 * SIZE,
                0
            ))
            .await
            .unwrap(),
        4 * SIZE
    );
    driver.unpublish_ok(&block.volume, &target).await;
    driver.unpublish_ok(&fs_volume, &fs_target).await;
}
