//! Image volumes (a StorageClass with `csi.storage.k8s.io/fstype`): a file in the pool holding
//! an ext4 or XFS filesystem, mounted once per node at kubelet's staging path through a loop
//! device and bind-mounted into each pod. Driven as kubelet drives them: NodeStageVolume,
//! NodePublishVolume per pod, NodeExpandVolume, NodeUnpublishVolume, NodeUnstageVolume.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use stickyvol::host::loopdev;
use tonic::Code;

fn ext4() -> csi::VolumeCapability {
    image_cap("ext4", Mode::SingleNodeWriter)
}

fn loop_devices_of(file: &Path) -> Vec<loopdev::LoopDevice> {
    loopdev::find_by_backing_file(file).unwrap_or_default()
}

fn is_mount_root(path: &Path) -> bool {
    stickyvol::host::fsstat::lstat(path).is_ok_and(|stat| stat.is_mount_root)
}

/// Writes `bytes` of non-zero data to `path` in 1 MiB writes; the error that stopped it.
fn fill(path: &Path, bytes: u64) -> io::Result<()> {
    let mut file = File::create(path)?;
    let chunk = vec![0x5a_u8; MIB as usize];
    let mut written = 0;
    while written < bytes {
        file.write_all(&chunk)?;
        written += chunk.len() as u64;
    }
    file.sync_all()
}

fn fsck_clean(fs: &str, image: &Path) -> (bool, String) {
    let output = match fs {
        "ext4" => Command::new("e2fsck")
            .args(["-f", "-n"])
            .arg(image)
            .output(),
        _ => Command::new("xfs_repair")
            .arg("-n")
            .arg("-f")
            .arg(image)
            .output(),
    }
    .expect("running fsck");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test]
async fn an_image_volume_is_made_sparse_formatted_staged_once_and_bound_into_each_pod() {
    let driver = TestDriver::start().await;
    let (volume, staging, first) = published_image(&driver, ext4(), 64 * MIB).await;
    let image = host_path(&volume);
    let meta = fs::metadata(&image).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.len(), 64 * MIB as u64);
    assert!(
        meta.blocks() * 512 < 8 * MIB as u64,
        "the image must stay sparse after mkfs: {} bytes allocated",
        meta.blocks() * 512
    );
    let devices = loop_devices_of(&image);
    assert_eq!(devices.len(), 1, "one device per staged volume");
    assert!(loopdev::uses_direct_io(&devices[0]).unwrap());
    assert!(is_mount_root(&staging) && is_mount_root(&first));
    // What a pod wrote into the image never runs setuid nor reaches a device: on the staged
    // mount and on each pod's bind of it.
    for mount in [&staging, &first] {
        let entries = mounts_at(mount);
        assert!(
            entries
                .iter()
                .all(|e| has_option(e, "nosuid") && has_option(e, "nodev")),
            "{}: {entries:?}",
            mount.display()
        );
    }

    // Idempotent: kubelet retries stage and publish after an uncertain answer.
    driver.stage(&volume, &staging, ext4()).await.unwrap();
    assert_eq!(loop_devices_of(&image).len(), 1);

    let second = publish(&driver, &volume, &staging, ext4()).await.unwrap();
    fs::write(first.join("hello"), b"from the first pod").unwrap();
    assert_eq!(
        fs::read(second.join("hello")).unwrap(),
        b"from the first pod"
    );

    let stats = driver
        .stats(&volume.volume_id, &path_str(&first))
        .await
        .unwrap();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert!(
        bytes.total > 48 * MIB && bytes.total <= 64 * MIB,
        "the filesystem's size: {bytes:?}"
    );
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
    );
    assert!(!stats.volume_condition.unwrap().abnormal);

    // Unstaging while a pod still uses the volume is refused, and changes nothing.
    let err = driver
        .unstage(&volume.volume_id, &staging)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(is_mount_root(&staging));

    driver.unpublish_ok(&volume, &first).await;
    driver.unpublish_ok(&volume, &second).await;
    let err = driver.delete(&volume.volume_id).await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "deleting a staged volume: {err:?}"
    );
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    assert!(!is_mount_root(&staging));
    assert!(
        staging.is_dir(),
        "the staging directory is kubelet's to remove"
    );
    assert_eq!(
        loop_devices_of(&image),
        vec![],
        "the device is detached at unstage"
    );
    driver.delete(&volume.volume_id).await.unwrap();
    assert!(!image.exists());
    assert!(
        driver.mounts_left().is_empty(),
        "{:?}",
        driver.mounts_left()
    );
}

#[tokio::test]
async fn a_write_past_the_size_fails_with_enospc_and_the_neighbour_is_unaffected() {
    let driver = TestDriver::start().await;
    let (small, small_staging, small_target) = published_image(&driver, ext4(), 32 * MIB).await;
    let (neighbour, neighbour_staging, neighbour_target) =
        published_image(&driver, ext4(), 32 * MIB).await;
    let err = fill(&small_target.join("big"), 64 * MIB as u64).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let image = fs::metadata(host_path(&small)).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        image.blocks() * 512 <= 33 * MIB as u64,
        "the image holds its size: {}",
        image.blocks() * 512
    );
    fill(&neighbour_target.join("ok"), 16 * MIB as u64).expect("the neighbour writes freely");
    tear_down(&driver, &small, &small_staging, &[&small_target]).await;
    tear_down(
        &driver,
        &neighbour,
        &neighbour_staging,
        &[&neighbour_target],
    )
    .await;
}

#[tokio::test]
async fn online_expansion_grows_the_mounted_filesystem_a_writer_sees() {
    for fs in ["xfs", "ext4"] {
        // ext4 grows online through an ioctl that wants CAP_SYS_RESOURCE, which a privileged
        // pod has and this host's root may lack: then the quota VM runs this test.
        if fs == "ext4" && !caps::has_sys_resource() {
            skip::skip(
                "sys-resource",
                "growing a mounted ext4 needs CAP_SYS_RESOURCE",
            );
            return;
        }
        let driver = TestDriver::start().await;
        let cap = image_cap(fs, Mode::SingleNodeWriter);
        let (volume, staging, target) = published_image(&driver, cap.clone(), 64 * MIB).await;
        let before = stickyvol::host::fsstat::space(&target).unwrap().total_bytes;
        let grown = driver
            .expand(csi::NodeExpandVolumeRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: path_str(&target),
                staging_target_path: path_str(&staging),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: before as i64 + 512 * MIB,
                    limit_bytes: 0,
                }),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .expect("NodeExpandVolume");
        let after = stickyvol::host::fsstat::space(&target).unwrap().total_bytes;
        assert!(
            after > before + 400 * MIB as u64,
            "{fs}: {before} -> {after} (asked {grown})"
        );
        fill(&target.join("after-growth"), before + 64 * MIB as u64)
            .unwrap_or_else(|err| panic!("{fs}: writing past the old size: {err}"));
        fs::remove_file(target.join("after-growth")).unwrap();
        tear_down(&driver, &volume, &staging, &[&target]).await;
    }
}

#[tokio::test]
async fn xfs_images_are_raised_to_the_smallest_xfs_and_refused_below_it_when_limited() {
    let driver = TestDriver::start().await;
    let cap = image_cap("xfs", Mode::SingleNodeWriter);
    let volume = driver
        .create(create_request(&new_name(), cap.clone(), 16 * MIB))
        .await;
    assert_eq!(volume.capacity_bytes, 300 * MIB);
    let mut request = create_request(&new_name(), cap, 16 * MIB);
    request.capacity_range.as_mut().unwrap().limit_bytes = 100 * MIB;
    let err = driver
        .controller()
        .create_volume(request)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    driver.delete(&volume.volume_id).await.unwrap();
}

/// A claim smaller than its image's filesystem, as Kubernetes restores it: the snapshot states
/// the size the claim asked (csi-provisioner refuses a restore asking less than a snapshot's
/// size), a restore asking as little gets the whole image back, less is OUT_OF_RANGE, and once
/// the volume is grown its snapshots state the grown size.
#[tokio::test]
async fn an_image_raised_to_its_filesystems_minimum_restores_into_a_claim_as_small_as_its_own() {
    let (_fs, driver) = on_reflink_xfs().await;
    let cap = image_cap("xfs", Mode::SingleNodeWriter);
    let asked = 16 * MIB;
    let (volume, staging, target) = published_image(&driver, cap.clone(), asked).await;
    assert_eq!(
        volume.capacity_bytes,
        300 * MIB,
        "raised to the smallest XFS"
    );
    fs::write(target.join("file"), b"kept").unwrap();
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    assert_eq!(
        snapshot.size_bytes, asked,
        "what the claim asked, not the image's size"
    );

    let too_small = thin(csi::CreateVolumeRequest {
        volume_content_source: Some(from_snapshot(&snapshot.snapshot_id)),
        ..create_request(&new_name(), cap.clone(), asked / 2)
    });
    let err = driver
        .controller()
        .create_volume(too_small)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    let restore = thin(csi::CreateVolumeRequest {
        volume_content_source: Some(from_snapshot(&snapshot.snapshot_id)),
        ..create_request(&new_name(), cap.clone(), asked)
    });
    let (restored, restored_staging, restored_target) =
        staged_and_published(&driver, restore, cap.clone()).await;
    assert_eq!(restored.capacity_bytes, 300 * MIB, "the whole image");
    assert_eq!(fs::read(restored_target.join("file")).unwrap(), b"kept");
    let again = driver.snapshot_of(&restored.volume_id).await;
    assert_eq!(again.size_bytes, asked, "the restore asked as little");
    tear_down(&driver, &restored, &restored_staging, &[&restored_target]).await;

    driver
        .expand(csi::NodeExpandVolumeRequest {
            staging_target_path: path_str(&staging),
            volume_capability: Some(cap.clone()),
            ..expand_request(&volume.volume_id, &target, 400 * MIB, 0)
        })
        .await
        .expect("NodeExpandVolume");
    let grown = driver.snapshot_of(&volume.volume_id).await;
    assert_eq!(
        grown.size_bytes,
        400 * MIB,
        "as large as asked since it grew"
    );
    tear_down(&driver, &volume, &staging, &[&target]).await;
    for id in [&snapshot, &again, &grown].map(|s| s.snapshot_id.clone()) {
        driver.delete_snapshot(&id).await.unwrap();
    }
}

#[tokio::test]
async fn a_volume_is_formatted_once_never_again_on_retry_restage_or_restart() {
    let mut driver = TestDriver::start().await;
    let request = create_request(&new_name(), ext4(), 32 * MIB);
    let volume = driver.create(request.clone()).await;
    let staging = driver.staging_path();
    driver.stage(&volume, &staging, ext4()).await.unwrap();
    let target = publish(&driver, &volume, &staging, ext4()).await.unwrap();
    fs::write(target.join("kept"), b"data").unwrap();
    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();

    // A retried CreateVolume, a kill -9 and a new stage: the data is still there.
    assert_eq!(driver.create(request).await.volume_id, volume.volume_id);
    driver.kill9_and_restart().await;
    driver.stage(&volume, &staging, ext4()).await.unwrap();
    let target = publish(&driver, &volume, &staging, ext4()).await.unwrap();
    assert_eq!(fs::read(target.join("kept")).unwrap(), b"data");
    tear_down(&driver, &volume, &staging, &[&target]).await;
}

#[tokio::test]
async fn a_restart_keeps_what_kubelet_still_uses_and_unstage_then_cleans_up() {
    let mut driver = TestDriver::start().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 32 * MIB).await;
    let image = host_path(&volume);
    let device = loop_devices_of(&image);
    driver.kill9_and_restart().await;
    assert_eq!(
        loop_devices_of(&image),
        device,
        "the staged device survives the driver"
    );
    fs::write(target.join("after-restart"), b"ok").unwrap();
    let stats = driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    assert!(!stats.volume_condition.unwrap().abnormal);
    tear_down(&driver, &volume, &staging, &[&target]).await;
    assert_eq!(loop_devices_of(&image), vec![]);
}

#[tokio::test]
async fn a_snapshot_taken_while_a_writer_runs_is_a_clean_filesystem_and_restores() {
    let (_fs, driver) = on_reflink_xfs().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 64 * MIB).await;
    fs::write(target.join("before"), b"before the snapshot").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (stop.clone(), target.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = fs::write(dir.join(format!("f{}", n % 64)), vec![n as u8; 64 << 10]);
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let snapshot = driver
        .create_snapshot_ready(&snapshot_request(&new_name(), &volume.volume_id))
        .await;
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 0);

    let restored = driver
        .create(csi::CreateVolumeRequest {
            volume_content_source: Some(from_snapshot(&snapshot.snapshot_id)),
            ..create_request(&new_name(), ext4(), 128 * MIB)
        })
        .await;
    let (clean, said) = fsck_clean("ext4", &host_path(&restored));
    assert!(
        clean,
        "the restored image must be a clean filesystem (journal replayed at mount is fine):\n{said}"
    );
    let restored_staging = driver.staging_path();
    driver
        .stage(&restored, &restored_staging, ext4())
        .await
        .unwrap();
    let restored_target = publish(&driver, &restored, &restored_staging, ext4())
        .await
        .unwrap();
    assert_eq!(
        fs::read(restored_target.join("before")).unwrap(),
        b"before the snapshot"
    );
    // Growing a mounted ext4 wants CAP_SYS_RESOURCE (see the expansion test).
    if caps::has_sys_resource() {
        let total = stickyvol::host::fsstat::space(&restored_target)
            .unwrap()
            .total_bytes;
        assert!(
            total > 100 * MIB as u64,
            "a restore into a bigger volume grows its filesystem at stage: {total}"
        );
    }
    tear_down(&driver, &restored, &restored_staging, &[&restored_target]).await;
    tear_down(&driver, &volume, &staging, &[&target]).await;
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
}

#[tokio::test]
async fn a_corrupt_image_is_an_error_never_a_crash_nor_a_mount() {
    let mut driver = TestDriver::start().await;
    let volume = driver
        .create(create_request(&new_name(), ext4(), 32 * MIB))
        .await;
    let image = host_path(&volume);
    // Garbage over the superblock and the group descriptors, as a pod with the raw bytes could.
    let mut file = OpenOptions::new().write(true).open(&image).unwrap();
    file.seek(SeekFrom::Start(1024)).unwrap();
    file.write_all(&vec![0xa5; 8192]).unwrap();
    drop(file);
    let staging = driver.staging_path();
    let err = driver.stage(&volume, &staging, ext4()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("fsck"), "{}", err.message());
    assert!(driver.is_running());
    assert!(!is_mount_root(&staging));
    assert_eq!(loop_devices_of(&image), vec![], "no device left behind");
    let err = publish(&driver, &volume, &staging, ext4())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn directory_and_block_volumes_stage_nothing_and_unstage_cleanly_when_never_staged() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    // Published before the driver staged anything (an upgrade): unstage has nothing to undo.
    let staging = driver.staging_path();
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    assert!(is_mount_root(&target), "the pod's mount is untouched");
    driver
        .stage(&volume, &staging, mount_cap(Mode::SingleNodeWriter))
        .await
        .unwrap();
    assert!(
        !is_mount_root(&staging),
        "a directory volume mounts nothing at stage"
    );
    let err = driver.stage(&volume, &staging, ext4()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    driver.unpublish_ok(&volume, &target).await;

    let block = driver.create_block_volume().await;
    let block_staging = driver.staging_path();
    driver
        .stage(&block, &block_staging, block_cap(Mode::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(
        loop_devices_of(&host_path(&block)),
        vec![],
        "block volumes attach at publish"
    );
    driver
        .unstage(&block.volume_id, &block_staging)
        .await
        .unwrap();
    // Unknown ids: nothing to unstage, never an error kubelet would hang on.
    driver.unstage("not-ours", &block_staging).await.unwrap();
}

#[tokio::test]
async fn a_node_without_the_tools_refuses_image_volumes_and_offers_no_capacity_for_them() {
    let empty = tempfile::tempdir().unwrap();
    let driver = TestDriver::start_with(Options {
        path: Some(empty.path().display().to_string()),
        ..Default::default()
    })
    .await;
    let err = driver
        .controller()
        .create_volume(create_request(&new_name(), ext4(), 32 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("mkfs.ext4"), "{}", err.message());
    let capacity = driver
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![ext4()],
            ..Default::default()
        })
        .await;
    assert_eq!(capacity.available_capacity, 0);
    let capacity = driver
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await;
    assert!(capacity.available_capacity > 0, "directories need no tools");
    let _ = driver.create_fs_volume().await;
    drop(empty);
}

#[tokio::test]
async fn a_start_mounts_the_staging_path_again_while_pods_use_the_volume_through_the_same_device() {
    let mut driver = TestDriver::start().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 32 * MIB).await;
    let image = host_path(&volume);
    let devices = loop_devices_of(&image);
    driver.stop().await;
    nix::mount::umount2(&staging, nix::mount::MntFlags::empty())
        .expect("unmounting the staging path");
    assert!(!is_mount_root(&staging) && is_mount_root(&target));
    driver.start_again().await;
    assert!(is_mount_root(&staging), "mounted again at start");
    assert_eq!(
        loop_devices_of(&image),
        devices,
        "through the device the pod's mount holds, never a second one over the same file"
    );
    fs::write(staging.join("seen-by-the-pod"), b"1").unwrap();
    assert!(target.join("seen-by-the-pod").exists());
    tear_down(&driver, &volume, &staging, &[&target]).await;
    assert_eq!(loop_devices_of(&image), vec![]);
}

#[tokio::test]
async fn the_fstype_parameter_alone_makes_an_image_volume_used_with_mount_capabilities_naming_none()
{
    // What csi-sanity sends with --csi.testvolumeparameters: the class's key among the
    // parameters, capabilities without fs_type.
    let driver = TestDriver::start().await;
    let mut request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), 32 * MIB);
    request
        .parameters
        .insert("csi.storage.k8s.io/fstype".into(), "ext4".into());
    let volume = driver.create(request).await;
    assert!(host_path(&volume).to_string_lossy().ends_with(".img"));
    let plain = mount_cap(Mode::SingleNodeWriter);
    let staging = driver.staging_path();
    driver
        .stage(&volume, &staging, plain.clone())
        .await
        .unwrap();
    let target = publish(&driver, &volume, &staging, plain.clone())
        .await
        .unwrap();
    assert!(is_mount_root(&target));
    let err = publish(
        &driver,
        &volume,
        &staging,
        image_cap("xfs", Mode::SingleNodeWriter),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "another filesystem: {err:?}"
    );
    let err = publish(
        &driver,
        &volume,
        &staging,
        block_cap(Mode::SingleNodeWriter),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "block access: {err:?}");
    tear_down(&driver, &volume, &staging, &[&target]).await;
}

#[tokio::test]
async fn on_a_reflink_pool_a_snapshot_of_a_staged_image_restores_into_a_bigger_volume() {
    let fs = scratchfs::ScratchFs::new("xfs", 768 << 20, &["-q", "-m", "reflink=1"], "");
    let pool = fs.mount_point.join("pool");
    let mut driver = TestDriver::prepare(Options::default());
    driver.add_args(["--pool".to_string(), format!("fast={}", pool.display())]);
    driver.start_again().await;
    let in_fast = |bytes: i64| {
        let mut request = create_request(&new_name(), ext4(), bytes);
        request.parameters.insert("pool".into(), "fast".into());
        request
    };
    let volume = driver.create(in_fast(64 * MIB)).await;
    let staging = driver.staging_path();
    driver.stage(&volume, &staging, ext4()).await.unwrap();
    let target = publish(&driver, &volume, &staging, ext4()).await.unwrap();
    fs::write(target.join("file"), b"kept").unwrap();
    let snapshot = driver
        .create_snapshot_ready(&snapshot_request(&new_name(), &volume.volume_id))
        .await;
    let restored = driver
        .create(csi::CreateVolumeRequest {
            volume_content_source: Some(from_snapshot(&snapshot.snapshot_id)),
            ..in_fast(128 * MIB)
        })
        .await;
    let (clean, said) = fsck_clean("ext4", &host_path(&restored));
    assert!(clean, "{said}");
    let restored_staging = driver.staging_path();
    driver
        .stage(&restored, &restored_staging, ext4())
        .await
        .expect("staging the restore");
    let restored_target = publish(&driver, &restored, &restored_staging, ext4())
        .await
        .unwrap();
    assert_eq!(fs::read(restored_target.join("file")).unwrap(), b"kept");
    tear_down(&driver, &restored, &restored_staging, &[&restored_target]).await;
    tear_down(&driver, &volume, &staging, &[&target]).await;
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
}

/// A thread writing into `target`'s frozen filesystem, checked to be held there.
fn blocked_writer(target: &Path) -> std::thread::JoinHandle<io::Result<()>> {
    let file = target.join("waits-for-the-thaw");
    let writer = std::thread::spawn(move || fs::write(file, b"written"));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !writer.is_finished(),
        "a frozen filesystem holds its writers"
    );
    writer
}

/// The freeze a snapshot or clone holds ends on every way out of the copy: a copy that panics
/// thaws the filesystem as it unwinds, and its writers go on.
#[tokio::test]
async fn a_freeze_ends_when_the_frozen_work_panics() {
    let driver = TestDriver::start().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 32 * MIB).await;
    let frozen = stickyvol::host::fsimage::Frozen::freeze(File::open(&staging).unwrap()).unwrap();
    let writer = blocked_writer(&target);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _frozen = frozen;
        panic!("the copy failed midway");
    }));
    assert!(unwound.is_err());
    eventually("the writer goes on once the unwinding thaws", || {
        writer.is_finished()
    })
    .await;
    writer.join().unwrap().unwrap();
    tear_down(&driver, &volume, &staging, &[&target]).await;
}

#[tokio::test]
async fn a_driver_killed_while_a_snapshot_froze_the_filesystem_thaws_it_at_start() {
    let mut driver = TestDriver::start().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 32 * MIB).await;
    // What a kill -9 between FIFREEZE and FITHAW leaves.
    let root = File::open(&staging).unwrap();
    stickyvol::host::fsimage::freeze(std::os::fd::AsFd::as_fd(&root)).unwrap();
    drop(root);
    driver.kill9();
    let writer = blocked_writer(&target);
    driver.start_again().await;
    eventually(
        "the writer goes on once the start thaws the filesystem",
        || writer.is_finished(),
    )
    .await;
    writer.join().unwrap().unwrap();
    tear_down(&driver, &volume, &staging, &[&target]).await;
}

#[tokio::test]
async fn a_stage_interrupted_after_its_mount_is_adopted_on_retry_never_mounted_twice() {
    let driver = TestDriver::start().await;
    let volume = driver
        .create(create_request(&new_name(), ext4(), 32 * MIB))
        .await;
    let image = host_path(&volume);
    let staging = driver.staging_path();
    // A stage killed between its mount and its record: a device over the image, mounted.
    let device = loopdev::attach(&image, false).unwrap();
    nix::mount::mount(
        Some(&device.path()),
        &staging,
        Some("ext4"),
        nix::mount::MsFlags::MS_NODEV,
        None::<&str>,
    )
    .unwrap();
    driver.stage(&volume, &staging, ext4()).await.unwrap();
    assert_eq!(
        loop_devices_of(&image),
        vec![device],
        "adopted, not attached again"
    );
    let target = publish(&driver, &volume, &staging, ext4()).await.unwrap();
    tear_down(&driver, &volume, &staging, &[&target]).await;
    assert_eq!(loop_devices_of(&image), vec![]);
}

#[tokio::test]
async fn an_expansion_interrupted_after_the_file_grew_is_finished_by_the_retry() {
    let driver = TestDriver::start().await;
    let cap = image_cap("xfs", Mode::SingleNodeWriter);
    let (volume, staging, target) = published_image(&driver, cap.clone(), 300 * MIB).await;
    let before = stickyvol::host::fsstat::space(&target).unwrap().total_bytes;
    // The file grew and the record did not (a kill -9 in between): kubelet asks again.
    let grown = 600 * MIB;
    OpenOptions::new()
        .write(true)
        .open(host_path(&volume))
        .unwrap()
        .set_len(grown as u64)
        .unwrap();
    let capacity = driver
        .expand(csi::NodeExpandVolumeRequest {
            volume_id: volume.volume_id.clone(),
            volume_path: path_str(&target),
            staging_target_path: path_str(&staging),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: grown,
                limit_bytes: 0,
            }),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(capacity, grown);
    let after = stickyvol::host::fsstat::space(&target).unwrap().total_bytes;
    assert!(after > before + 250 * MIB as u64, "{before} -> {after}");
    tear_down(&driver, &volume, &staging, &[&target]).await;
}

#[tokio::test]
async fn a_power_loss_that_took_a_new_image_remakes_it_and_one_holding_data_is_never_reformatted() {
    let mut driver = TestDriver::start().await;
    let lost = driver
        .create(create_request(&new_name(), ext4(), 32 * MIB))
        .await;
    let used = driver
        .create(create_request(&new_name(), ext4(), 32 * MIB))
        .await;
    let staging = driver.staging_path();
    driver.stage(&used, &staging, ext4()).await.unwrap();
    let target = publish(&driver, &used, &staging, ext4()).await.unwrap();
    fs::write(target.join("kept"), b"data").unwrap();
    driver.unpublish_ok(&used, &target).await;
    driver.unstage(&used.volume_id, &staging).await.unwrap();
    driver.kill9();
    // The new image's formatting and size never reached the disk.
    fs::write(host_path(&lost), b"").unwrap();
    driver.start_again().await;
    for volume in [&lost, &used] {
        let (clean, said) = fsck_clean("ext4", &host_path(volume));
        assert!(clean, "{said}");
    }
    driver.stage(&used, &staging, ext4()).await.unwrap();
    let target = publish(&driver, &used, &staging, ext4()).await.unwrap();
    assert_eq!(fs::read(target.join("kept")).unwrap(), b"data");
    tear_down(&driver, &used, &staging, &[&target]).await;
    driver.delete(&lost.volume_id).await.unwrap();
}

#[tokio::test]
async fn a_volume_and_its_clone_are_staged_side_by_side_though_their_filesystems_share_a_uuid() {
    for fs in ["xfs", "ext4"] {
        let (_pool, driver) = on_reflink_xfs().await;
        let cap = image_cap(fs, Mode::SingleNodeWriter);
        let (volume, staging, target) = published_image(&driver, cap.clone(), 300 * MIB).await;
        fs::write(target.join("original"), b"1").unwrap();
        let clone = driver
            .create(csi::CreateVolumeRequest {
                volume_content_source: Some(from_volume(&volume.volume_id)),
                ..create_request(&new_name(), cap.clone(), 300 * MIB)
            })
            .await;
        let clone_staging = driver.staging_path();
        driver
            .stage(&clone, &clone_staging, cap.clone())
            .await
            .unwrap_or_else(|err| panic!("{fs}: staging the clone beside its source: {err:?}"));
        let clone_target = publish(&driver, &clone, &clone_staging, cap).await.unwrap();
        assert_eq!(fs::read(clone_target.join("original")).unwrap(), b"1");
        fs::write(clone_target.join("only-in-the-clone"), b"2").unwrap();
        assert!(
            !target.join("only-in-the-clone").exists(),
            "{fs}: two filesystems"
        );
        tear_down(&driver, &clone, &clone_staging, &[&clone_target]).await;
        tear_down(&driver, &volume, &staging, &[&target]).await;
    }
}

/// On a pool that copies data in full (no reflinks), a consistent copy of an image in use would
/// keep its filesystem frozen, its writers blocked, for the whole copy: a snapshot and a clone
/// are refused, saying why and what to do, until no pod uses it.
#[tokio::test]
async fn a_staged_image_on_a_pool_without_reflinks_is_not_copied_while_in_use() {
    let driver = TestDriver::start().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 64 * MIB).await;
    let refused = driver
        .controller()
        .create_snapshot(snapshot_request(&new_name(), &volume.volume_id))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("no reflinks")
            && refused.message().contains("while no pod uses the volume"),
        "{refused:?}"
    );
    let clone = driver
        .controller()
        .create_volume(csi::CreateVolumeRequest {
            volume_content_source: Some(from_volume(&volume.volume_id)),
            ..create_request(&new_name(), ext4(), 64 * MIB)
        })
        .await
        .unwrap_err();
    assert_eq!(clone.code(), Code::FailedPrecondition, "{clone:?}");
    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    let snapshot = driver
        .create_snapshot_ready(&snapshot_request(&new_name(), &volume.volume_id))
        .await;
    assert!(snapshot.ready_to_use, "unused, it is copied");
    driver.delete(&volume.volume_id).await.unwrap();
}

/// Writes 4 KiB into `target` every 2 ms until `stop`, each write timed: how long each took.
fn timed_writer(
    target: &Path,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<std::time::Duration>> {
    let path = target.join("ticks");
    std::thread::spawn(move || {
        let mut file = File::create(path).unwrap();
        let mut took = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let started = std::time::Instant::now();
            file.write_all(&[7u8; 4096]).unwrap();
            took.push(started.elapsed());
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        took
    })
}

/// A clone of a staged image volume takes its node-wide walk slot before it freezes the
/// filesystem: with every slot held (exports nobody reads), the volume's writers go on while the
/// clone waits, and the freeze itself (a reflink copy) is short. Writes p99 under 100 ms, and
/// none held for the wait.
#[tokio::test]
async fn a_clone_waiting_for_a_walk_slot_does_not_hold_its_source_frozen() {
    let fs = scratchfs::ScratchFs::new("xfs", 768 << 20, &["-q", "-m", "reflink=1"], "");
    let mut driver = TestDriver::prepare(Options {
        metrics_address: Some(free_local_address()),
        ..Options::default()
    });
    driver.data = fs.mount_point.join("data");
    driver.start_again().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 32 * MIB).await;
    let exports_running = || {
        driver
            .scrape()
            .value("stickyvol_copies_in_flight", &[("kind", "export")])
    };
    // Every node-wide slot held: exports of 48 MiB of data each, more than a pipe, the socket and
    // the admin API's stream windows hold (8 MiB did not stall), their output unread.
    let mut exports = Vec::new();
    let mut blocks = Vec::new();
    for _ in 0..stickyvol::volume::space::throttle::MAX_NODE_WALKS {
        let block = driver
            .create(create_request(
                &new_name(),
                block_cap(Mode::SingleNodeWriter),
                64 * MIB,
            ))
            .await;
        let data = OpenOptions::new()
            .write(true)
            .open(host_path(&block))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&data, &pattern(48 * MIB as usize, 5), 0).unwrap();
        let export = Command::new(env!("CARGO_BIN_EXE_stickyvol"))
            .args(["volume", "export", &block.volume_id])
            .env("ADMIN_SOCKET", &driver.admin_socket)
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        exports.push(export);
        blocks.push(block);
    }
    eventually("every export holding its slot", || {
        exports_running() == exports.len() as f64
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = timed_writer(&target, stop.clone());
    let mut controller = driver.controller();
    let request = csi::CreateVolumeRequest {
        volume_content_source: Some(from_volume(&volume.volume_id)),
        ..create_request(&new_name(), ext4(), 32 * MIB)
    };
    let clone = tokio::spawn(async move { controller.create_volume(request).await });
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(!clone.is_finished(), "the clone did not wait for a slot");
    for mut export in exports {
        export.kill().unwrap();
        export.wait().unwrap();
    }
    let cloned = clone
        .await
        .unwrap()
        .expect("the clone")
        .into_inner()
        .volume
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut took = writer.join().unwrap();
    took.sort();
    let p99 = took[took.len() * 99 / 100];
    let longest = *took.last().unwrap();
    eprintln!("{} writes: p99 {p99:?}, longest {longest:?}", took.len());
    assert!(took.len() > 100, "only {} writes", took.len());
    assert!(p99 < std::time::Duration::from_millis(100), "p99 {p99:?}");
    // Frozen while the clone waited, one write would have waited 2 s.
    assert!(
        longest < std::time::Duration::from_secs(1),
        "a write held {longest:?}"
    );

    driver.delete(&cloned.volume_id).await.unwrap();
    for block in blocks {
        driver.delete(&block.volume_id).await.unwrap();
    }
    tear_down(&driver, &volume, &staging, &[&target]).await;
}

/// A snapshot of a published image volume freezes its filesystem for the copy alone: the pool's
/// flush comes once it is thawed. With a neighbour's gigabyte on the pool not yet written back
/// (seconds of flushing on these disks), the volume's writes go on: none held 400 ms.
#[tokio::test]
async fn a_snapshot_does_not_hold_its_source_frozen_while_the_pool_flushes() {
    let fs = scratchfs::ScratchFs::new("xfs", 1536 << 20, &["-q", "-m", "reflink=1"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.mount_point.join("data");
    driver.start_again().await;
    let (volume, staging, target) = published_image(&driver, ext4(), 32 * MIB).await;
    let neighbour = driver
        .create(create_request(
            &new_name(),
            block_cap(Mode::SingleNodeWriter),
            1024 * MIB,
        ))
        .await;
    // Written, not flushed: the kernel writes it back after 30 s, or when the pool is flushed.
    let mut data = OpenOptions::new()
        .write(true)
        .open(host_path(&neighbour))
        .unwrap();
    let chunk = pattern(16 * MIB as usize, 9);
    for _ in 0..64 {
        data.write_all(&chunk).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = timed_writer(&target, stop.clone());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let snapshot = driver
        .create_snapshot_ready(&snapshot_request(&new_name(), &volume.volume_id))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut took = writer.join().unwrap();
    took.sort();
    let longest = *took.last().unwrap();
    eprintln!("{} writes, longest {longest:?}", took.len());
    assert!(took.len() > 100, "only {} writes", took.len());
    assert!(
        longest < std::time::Duration::from_millis(400),
        "a write held {longest:?}"
    );

    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    driver.delete(&neighbour.volume_id).await.unwrap();
    tear_down(&driver, &volume, &staging, &[&target]).await;
}
