//! IO limits from a VolumeAttributesClass (`mutable_parameters`), as csi-provisioner and
//! csi-resizer pass them: set on the volume's loop device in the cgroup of the pod kubelet's
//! target names, changed on a running pod, lifted, set again after a driver restart; refused
//! for directory volumes and for keys or values we do not know. The cgroups are real (v1's blkio
//! here, v2's io.max in the project's VM), laid out as kubelet lays out a pod's, and a process
//! in the pod's cgroup shows the limit holding.

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use stickyvol::host::blkio::{self, Hierarchy, IoMax};
use tonic::Code;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A pod's cgroup as kubelet's cgroupfs driver makes it, below a `cgroupRoot` of the test's own
/// (`<hierarchy>/<test>/kubepods/burstable/pod<uid>`), with a container's cgroup below it
/// (`ctr`, made after the publish, as kubelet makes containers after the volumes), where the
/// writes run; removed when dropped.
struct PodCgroup {
    hierarchy: Hierarchy,
    top: PathBuf,
    dir: PathBuf,
}

impl PodCgroup {
    /// None (the test skipped) when this kernel has no IO controller.
    fn make(uid: &str) -> Option<PodCgroup> {
        let Some((hierarchy, base)) = blkio::io_hierarchy(Path::new(CGROUP_ROOT)) else {
            skip::skip("cgroup-io", "no cgroup hierarchy with the IO controller");
            return None;
        };
        let top = base.join(format!("stickyvol-test-{}", new_name()));
        let dir = top.join("kubepods/burstable").join(format!("pod{uid}"));
        let mut parent = base.clone();
        for part in dir.strip_prefix(&base).unwrap().components() {
            if hierarchy == Hierarchy::V2 {
                // v2 gives a child the io controller only if its parent hands it down.
                fs::write(parent.join("cgroup.subtree_control"), "+io").unwrap();
            }
            parent = parent.join(part);
            fs::create_dir(&parent).unwrap();
        }
        Some(PodCgroup {
            hierarchy,
            top,
            dir,
        })
    }

    /// The container's cgroup, made now (after the publish), once the driver has given it the
    /// limits: under cgroup v1 they must be on it (the driver's look every 2 s); under v2 the
    /// pod's hold for it.
    async fn start_container(&self, device: &str, write_iops: u64) {
        let container = self.dir.join("ctr");
        fs::create_dir_all(&container).unwrap();
        if self.hierarchy == Hierarchy::V1 {
            let file = container.join("blkio.throttle.write_iops_device");
            let number = stickyvol::volume::iolimits::device_number(device).unwrap();
            let line = format!("{}:{} {write_iops}", number.major, number.minor);
            eventually("the container's cgroup gets the pod's limit", || {
                fs::read_to_string(&file).is_ok_and(|text| text.lines().any(|l| l == line))
            })
            .await;
        }
    }

    /// Seconds a process in the container's cgroup takes for `count` 4 KiB O_DIRECT writes.
    fn time_writes(&self, to: &Path, count: u32) -> Duration {
        let procs = self.dir.join("ctr/cgroup.procs");
        let script = format!(
            "echo $$ > '{}' && exec dd if=/dev/zero of='{}' bs=4096 count={count} oflag=direct conv=notrunc status=none",
            procs.display(),
            to.display()
        );
        let started = Instant::now();
        let status = Command::new("sh").arg("-c").arg(script).status().unwrap();
        assert!(status.success(), "the writes in the pod's cgroup failed");
        started.elapsed()
    }

    fn limits_on(&self, device: &str) -> IoMax {
        let uid = (self.dir.file_name().unwrap().to_str().unwrap())
            .trim_start_matches("pod")
            .to_string();
        let found = blkio::find_pod(Path::new(CGROUP_ROOT), &uid)
            .unwrap()
            .expect("the pod's cgroup is found by its uid");
        assert_eq!(found.path, self.dir);
        let number = stickyvol::volume::iolimits::device_number(device).unwrap();
        blkio::limits_of(&found, number).unwrap()
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(self.dir.join("ctr"));
        let mut dir = self.dir.clone();
        while dir.starts_with(&self.top) {
            let _ = fs::remove_dir(&dir);
            dir.pop();
        }
    }
}

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    (pairs.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The pod uid a kubelet target names (`…/publish/<pv>/<uid>`, `pods/<uid>/…`).
fn uid_of(target: &Path, kubelet: &Path) -> String {
    stickyvol::volume::inventory::pod_uid_of(target, kubelet).expect("a kubelet target")
}

async fn modify(
    driver: &TestDriver,
    volume_id: &str,
    pairs: &[(&str, &str)],
) -> Result<(), tonic::Status> {
    driver
        .controller()
        .controller_modify_volume(csi::ControllerModifyVolumeRequest {
            volume_id: volume_id.into(),
            mutable_parameters: params(pairs),
            ..Default::default()
        })
        .await
        .map(drop)
}

/// The call failed with `code`, saying `needle`.
fn assert_refused(status: tonic::Status, code: Code, needle: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(needle), "{}", status.message());
}

fn limited_block_request(write_iops: &str) -> csi::CreateVolumeRequest {
    let mut request = thin(create_request(
        &new_name(),
        block_cap(Mode::SingleNodeWriter),
        16 * MIB,
    ));
    request.mutable_parameters = params(&[("writeIOPS", write_iops)]);
    request
}

#[tokio::test]
async fn a_block_volume_is_limited_for_its_pod_changed_lifted_and_set_again_after_a_restart() {
    let mut driver = TestDriver::start().await;
    let volume = driver.create(limited_block_request("20")).await;
    let target = driver.block_target();
    let Some(pod) = PodCgroup::make(&uid_of(&target, &driver.kubelet)) else {
        return;
    };
    driver
        .publish_ok(&volume, &target, block_cap(Mode::SingleNodeWriter))
        .await;
    let device = linked_device(&target).name().to_string();
    assert_eq!(pod.limits_on(&device).write_iops, Some(20));
    pod.start_container(&device, 20).await;
    // 60 writes at 20 a second: about 3 s.
    let limited = pod.time_writes(&target, 60);
    assert!(
        limited >= Duration::from_secs(2),
        "60 writes at 20 IOPS took {limited:?}"
    );

    modify(&driver, &volume.volume_id, &[])
        .await
        .expect("the limit lifted");
    assert_eq!(pod.limits_on(&device), IoMax::default());
    let free = pod.time_writes(&target, 60);
    assert!(
        free < limited / 2,
        "unlimited: {free:?}, limited: {limited:?}"
    );

    modify(
        &driver,
        &volume.volume_id,
        &[("writeIOPS", "100"), ("readBytesPerSecond", "1Mi")],
    )
    .await
    .expect("a new limit on the running pod");
    let changed = pod.limits_on(&device);
    assert_eq!(
        (changed.write_iops, changed.read_bytes_per_second),
        (Some(100), Some(1 << 20))
    );

    // Lost behind the driver's back (as if set before a crash and never written): set again
    // when the driver starts.
    driver.stop().await;
    let found = blkio::find_pod(Path::new(CGROUP_ROOT), &uid_of(&target, &driver.kubelet))
        .unwrap()
        .unwrap();
    let number = stickyvol::volume::iolimits::device_number(&device).unwrap();
    blkio::set_limits(&found, number, &IoMax::default()).unwrap();
    driver.start_again().await;
    eventually("the limits set again after the restart", || {
        pod.limits_on(&device) == changed
    })
    .await;
    driver.unpublish_ok(&volume, &target).await;
    driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn an_image_volume_is_limited_through_its_filesystem() {
    let driver = TestDriver::start().await;
    let mut cap = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(mount)) = &mut cap.access_type {
        mount.fs_type = "ext4".into();
    }
    let mut request = thin(create_request(&new_name(), cap.clone(), 64 * MIB));
    request.mutable_parameters = params(&[("writeIOPS", "20")]);
    let volume = driver.create(request).await;
    let staging = driver.staging_path();
    driver
        .stage(&volume, &staging, cap.clone())
        .await
        .expect("NodeStageVolume");
    let target = driver.mount_target();
    let Some(pod) = PodCgroup::make(&uid_of(&target, &driver.kubelet)) else {
        return;
    };
    let mut publish = publish_request(&volume, &target, cap, false);
    publish.staging_target_path = path_str(&staging);
    driver
        .node()
        .node_publish_volume(publish)
        .await
        .expect("NodePublishVolume");
    let devices = loop_devices_of(&host_path(&volume));
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(pod.limits_on(devices[0].name()).write_iops, Some(20));
    pod.start_container(devices[0].name(), 20).await;
    let limited = pod.time_writes(&target.join("data"), 60);
    assert!(
        limited >= Duration::from_secs(2),
        "60 writes at 20 IOPS took {limited:?}"
    );
    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn a_pod_without_a_cgroup_is_not_published_unlimited() {
    let driver = TestDriver::start().await;
    let volume = driver.create(limited_block_request("20")).await;
    let target = driver.block_target();
    let refused =
        (driver.publish(&volume, &target, block_cap(Mode::SingleNodeWriter), false)).await;
    assert_refused(
        refused.unwrap_err(),
        Code::FailedPrecondition,
        "cannot be set in pod",
    );
    driver.unpublish(&volume.volume_id, &target).await.unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn directory_volumes_and_unknown_keys_or_values_are_refused_naming_them() {
    let driver = TestDriver::start().await;
    let mut request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), MIB);
    request.mutable_parameters = params(&[("writeIOPS", "20")]);
    let refused = driver.controller().create_volume(request).await;
    assert_refused(
        refused.unwrap_err(),
        Code::InvalidArgument,
        "directory volume",
    );

    let directory = driver.create_fs_volume().await;
    let refused = modify(&driver, &directory.volume_id, &[("readIOPS", "5")]).await;
    assert_refused(
        refused.unwrap_err(),
        Code::InvalidArgument,
        "directory volume",
    );
    modify(&driver, &directory.volume_id, &[])
        .await
        .expect("no limits: nothing to refuse");

    let block = driver.create(limited_block_request("20")).await;
    for (pairs, named) in [
        (&[("writeIops", "20")][..], "\"writeIops\""),
        (&[("writeIOPS", "fast")][..], "writeIOPS"),
        (&[("readBytesPerSecond", "0")][..], "readBytesPerSecond"),
    ] {
        let refused = modify(&driver, &block.volume_id, pairs).await;
        assert_refused(refused.unwrap_err(), Code::InvalidArgument, named);
    }
    let refused = modify(&driver, "not-ours", &[]).await;
    assert_refused(refused.unwrap_err(), Code::NotFound, "");
    for volume in [&directory, &block] {
        driver.delete(&volume.volume_id).await.unwrap();
    }
}

/// An encrypted block volume's pod writes to its LUKS mapping, not to the loop device below:
/// the limit goes on the mapping (the VM runs this; hosts without dm-crypt record a skip).
#[tokio::test]
async fn an_encrypted_block_volume_is_limited_on_its_mapping_the_device_its_pod_writes_to() {
    let control = Path::new("/dev/mapper/control").exists();
    let tool = Command::new("cryptsetup").arg("--version").output();
    if !control || !tool.is_ok_and(|out| out.status.success()) {
        skip::skip("dm-crypt", "no device mapper or no cryptsetup");
        return;
    }
    let driver = TestDriver::start().await;
    let mut request = limited_block_request("20");
    request.capacity_range.as_mut().unwrap().required_bytes = 32 * MIB;
    request
        .parameters
        .insert("encryption".into(), "luks2".into());
    let volume = driver.create(request).await;
    let staging = driver.staging_path();
    let cap = block_cap(Mode::SingleNodeWriter);
    driver
        .node()
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: path_str(&staging),
            volume_capability: Some(cap.clone()),
            secrets: params(&[("key", "an-io-limits-test-key-of-32-bytes-at-least")]),
            ..Default::default()
        })
        .await
        .expect("NodeStageVolume with the key");
    let target = driver.block_target();
    let Some(pod) = PodCgroup::make(&uid_of(&target, &driver.kubelet)) else {
        return;
    };
    let mut publish = publish_request(&volume, &target, cap, false);
    publish.staging_target_path = path_str(&staging);
    driver.node().node_publish_volume(publish).await.unwrap();
    let mapping = stickyvol::host::crypt::mapping(&format!("stickyvol-{}", volume.volume_id))
        .expect("the volume's mapping is open");
    assert_eq!(
        fs::read_link(&target).unwrap(),
        Path::new("/dev/mapper").join(format!("stickyvol-{}", volume.volume_id))
    );
    assert_eq!(pod.limits_on(&mapping.kernel_name).write_iops, Some(20));
    pod.start_container(&mapping.kernel_name, 20).await;
    let limited = pod.time_writes(&target, 60);
    assert!(
        limited >= Duration::from_secs(2),
        "60 writes at 20 IOPS through the mapping took {limited:?}"
    );
    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
}
