//! Group snapshots, driven as csi-snapshotter drives the GroupController service: several
//! volumes of the node cut at one instant (image volumes in use frozen together), each member an
//! ordinary snapshot restored like any other, the group deleted whole; refusals where no one
//! instant can be promised; and kill -9 at any point leaving the whole group or none of it.

mod common;

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;

/// Volumes in the cut of the consistency test, and its rounds.
const MEMBERS: usize = 4;
const ROUNDS: usize = 10;

/// The smallest XFS mkfs.xfs makes, and an ext4 image small enough for many.
const XFS_IMAGE: i64 = 300 * MIB;
const EXT4_IMAGE: i64 = 16 * MIB;

fn xfs() -> csi::VolumeCapability {
    image_cap("xfs", Mode::SingleNodeWriter)
}

fn ext4() -> csi::VolumeCapability {
    image_cap("ext4", Mode::SingleNodeWriter)
}

fn group_request(name: &str, volumes: &[&csi::Volume]) -> csi::CreateVolumeGroupSnapshotRequest {
    csi::CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: volumes.iter().map(|v| v.volume_id.clone()).collect(),
        ..Default::default()
    }
}

async fn create_group(
    driver: &TestDriver,
    request: csi::CreateVolumeGroupSnapshotRequest,
) -> Result<csi::VolumeGroupSnapshot, Status> {
    driver
        .group_controller()
        .create_volume_group_snapshot(request)
        .await
        .map(|r| r.into_inner().group_snapshot.expect("no group_snapshot"))
}

async fn get_group(
    driver: &TestDriver,
    id: &str,
    snapshot_ids: Vec<String>,
) -> Result<csi::VolumeGroupSnapshot, Status> {
    driver
        .group_controller()
        .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: id.into(),
            snapshot_ids,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().group_snapshot.expect("no group_snapshot"))
}

async fn delete_group(
    driver: &TestDriver,
    id: &str,
    snapshot_ids: Vec<String>,
) -> Result<(), Status> {
    driver
        .group_controller()
        .delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: id.into(),
            snapshot_ids,
            ..Default::default()
        })
        .await
        .map(drop)
}

fn member_ids(group: &csi::VolumeGroupSnapshot) -> Vec<String> {
    group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect()
}

/// One thread appending numbered records to a log in each target in turn (record n to the
/// first, then the second, ...), so that a cut at one instant holds a prefix of that sequence.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(targets: &[PathBuf]) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let mut logs: Vec<_> = targets
            .iter()
            .map(|t| {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(t.join("log"))
                    .unwrap()
            })
            .collect();
        let thread = {
            let (stop, written) = (stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for log in &mut logs {
                        // A failed write ends the records: the volume went away under us.
                        if log.write_all(format!("{n}\n").as_bytes()).is_err() {
                            return;
                        }
                    }
                    written.store(n + 1, Ordering::Relaxed);
                    n += 1;
                }
            })
        };
        Writer {
            stop,
            written,
            thread: Some(thread),
        }
    }

    /// Waits until `more` records beyond the current count are written.
    fn wait_for(&self, more: u64) {
        let goal = self.written.load(Ordering::Relaxed) + more;
        while self.written.load(Ordering::Relaxed) < goal {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The last record of a volume's log (-1 for none); a torn last line is not a record.
fn last_record(dir: &Path) -> i64 {
    let text = fs::read_to_string(dir.join("log")).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|line| line.ends_with('\n'))
        .filter_map(|line| line.trim_end().parse::<i64>().ok())
        .next_back()
        .unwrap_or(-1)
}

/// Whether the last records, volume by volume, are a prefix of the writer's sequence: each
/// volume at most the one before it, and the last at most one behind the first.
fn is_prefix(lasts: &[i64]) -> bool {
    lasts.windows(2).all(|w| w[0] >= w[1]) && lasts[0] - lasts[lasts.len() - 1] <= 1
}

/// Restores `snapshot` into a new staged and published volume.
async fn restored(
    driver: &TestDriver,
    snapshot: &csi::Snapshot,
    cap: csi::VolumeCapability,
) -> (csi::Volume, PathBuf, PathBuf) {
    let request = thin(csi::CreateVolumeRequest {
        volume_content_source: Some(from_snapshot(&snapshot.snapshot_id)),
        ..create_request(&new_name(), cap.clone(), snapshot.size_bytes)
    });
    staged_and_published(driver, request, cap).await
}

#[test]
fn a_prefix_is_told_from_a_cut_that_is_not() {
    assert!(is_prefix(&[7, 7, 7, 7]));
    assert!(is_prefix(&[8, 8, 7, 7]));
    assert!(is_prefix(&[8, 7, 7, 7]));
    assert!(is_prefix(&[-1, -1]));
    assert!(
        !is_prefix(&[7, 8, 8, 8]),
        "a later volume ahead of an earlier one"
    );
    assert!(!is_prefix(&[9, 8, 8, 7]), "two records apart");
}

/// Four XFS image volumes in use, one writer appending to all of them, cut ten times: every
/// restored group holds a prefix of what was written, and the writer waited for the cut only.
#[tokio::test]
async fn four_image_volumes_under_a_writer_are_cut_at_one_instant_every_time() {
    // Room for the volumes, a reservation for each member's snapshot, and a restore.
    let (_fs, driver) = on_reflink_xfs_of(4 << 30).await;
    let mut volumes = Vec::new();
    for _ in 0..MEMBERS {
        volumes.push(published_image(&driver, xfs(), XFS_IMAGE).await);
    }
    let targets: Vec<PathBuf> = volumes.iter().map(|(_, _, t)| t.clone()).collect();
    let writer = Writer::start(&targets);
    let sources: Vec<&csi::Volume> = volumes.iter().map(|(v, _, _)| v).collect();
    for round in 0..ROUNDS {
        writer.wait_for(200);
        let group = create_group(&driver, group_request(&new_name(), &sources))
            .await
            .expect("CreateVolumeGroupSnapshot");
        assert!(group.ready_to_use, "a group is answered once whole");
        assert_eq!(group.snapshots.len(), MEMBERS);
        let mut lasts = Vec::new();
        for (source, snapshot) in sources.iter().zip(&group.snapshots) {
            assert_eq!(
                snapshot.source_volume_id, source.volume_id,
                "members in the order asked"
            );
            assert_eq!(snapshot.group_snapshot_id, group.group_snapshot_id);
            assert!(snapshot.ready_to_use);
            let (volume, staging, target) = restored(&driver, snapshot, xfs()).await;
            lasts.push(last_record(&target));
            tear_down(&driver, &volume, &staging, &[&target]).await;
        }
        assert!(
            is_prefix(&lasts) && lasts[0] >= 0,
            "round {round}: the restored volumes' last records {lasts:?} are not one instant of the writer's sequence"
        );
        delete_group(&driver, &group.group_snapshot_id, member_ids(&group))
            .await
            .expect("DeleteVolumeGroupSnapshot");
    }
    drop(writer);
    let log = driver.log_text();
    let cuts = log.matches("group snapshot cut").count();
    assert_eq!(cuts, ROUNDS, "one cut per round");
    for (volume, staging, target) in &volumes {
        tear_down(&driver, volume, staging, &[target]).await;
    }
    assert!(driver.list_all_snapshots().await.is_empty());
}

/// What a group is to the CO: idempotent by name, fetched by id, its members listed with it,
/// restored like any snapshot, deleted only together.
#[tokio::test]
async fn a_group_is_named_once_fetched_listed_restored_and_deleted_whole() {
    let (_fs, driver) = on_reflink_xfs().await;
    let (a, a_staging, a_target) = published_image(&driver, ext4(), EXT4_IMAGE).await;
    fs::write(a_target.join("data"), b"in a").unwrap();
    let b = driver
        .create(thin(create_request(&new_name(), ext4(), EXT4_IMAGE)))
        .await;
    let c = driver.create_fs_volume().await;
    let name = new_name();
    let group = create_group(&driver, group_request(&name, &[&a, &b]))
        .await
        .unwrap();
    let again = create_group(&driver, group_request(&name, &[&b, &a]))
        .await
        .unwrap();
    assert_eq!(
        again.group_snapshot_id, group.group_snapshot_id,
        "same name, same volumes: same group"
    );
    assert_eq!(member_ids(&again), member_ids(&group));
    let other = create_group(&driver, group_request(&name, &[&a, &c]))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");

    let fetched = get_group(&driver, &group.group_snapshot_id, vec![])
        .await
        .unwrap();
    assert_eq!(member_ids(&fetched), member_ids(&group));
    assert!(fetched.ready_to_use);
    let mut listed = member_ids(&group);
    listed.reverse();
    get_group(&driver, &group.group_snapshot_id, listed.clone())
        .await
        .unwrap();
    let wrong = get_group(&driver, &group.group_snapshot_id, listed[..1].to_vec())
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument, "{wrong:?}");
    let unknown = get_group(
        &driver,
        "sg-00000000000000000000000000000000-00000000",
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let foreign = get_group(&driver, "../../etc", vec![]).await.unwrap_err();
    assert_eq!(foreign.code(), Code::NotFound);

    let all = driver.list_all_snapshots().await;
    for member in &group.snapshots {
        let seen = all
            .iter()
            .find(|s| s.snapshot_id == member.snapshot_id)
            .expect("member listed");
        assert_eq!(seen.group_snapshot_id, group.group_snapshot_id);
        let alone = driver
            .delete_snapshot(&member.snapshot_id)
            .await
            .unwrap_err();
        assert_eq!(
            alone.code(),
            Code::InvalidArgument,
            "a member is deleted only with its group: {alone:?}"
        );
    }
    let (restored_a, staging, target) = restored(&driver, &group.snapshots[0], ext4()).await;
    assert_eq!(fs::read(target.join("data")).unwrap(), b"in a");
    tear_down(&driver, &restored_a, &staging, &[&target]).await;

    let mismatch = delete_group(&driver, &group.group_snapshot_id, listed[..1].to_vec())
        .await
        .unwrap_err();
    assert_eq!(mismatch.code(), Code::InvalidArgument);
    delete_group(&driver, &group.group_snapshot_id, listed)
        .await
        .unwrap();
    delete_group(&driver, &group.group_snapshot_id, vec![])
        .await
        .expect("deleting again succeeds");
    delete_group(&driver, "not-ours", vec![])
        .await
        .expect("an id not ours names nothing");
    assert!(driver.list_all_snapshots().await.is_empty());
    let gone = get_group(&driver, &group.group_snapshot_id, vec![])
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    assert!(
        dir_names(&driver.data.join("snapshots")).is_empty(),
        "the members' data is gone"
    );
    tear_down(&driver, &a, &a_staging, &[&a_target]).await;
    for volume in [&b, &c] {
        driver.delete(&volume.volume_id).await.unwrap();
    }
}

/// Where no one instant can be promised, the group is refused with a sentence saying why;
/// malformed requests are invalid arguments.
#[tokio::test]
async fn groups_no_instant_can_cut_are_refused_saying_why() {
    let (_fs, driver) = on_reflink_xfs().await;
    let image = driver
        .create(thin(create_request(&new_name(), ext4(), EXT4_IMAGE)))
        .await;
    let (dir, dir_target) = driver.published_fs_volume().await;
    let (block, block_target) = driver.published_block_volume().await;
    for in_use in [&dir, &block] {
        let refused = create_group(&driver, group_request(&new_name(), &[&image, in_use]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert!(
            refused.message().contains("in use by a pod"),
            "{}",
            refused.message()
        );
        // Alone, it is cut as CreateSnapshot cuts it.
        let alone = create_group(&driver, group_request(&new_name(), &[in_use]))
            .await
            .unwrap();
        delete_group(&driver, &alone.group_snapshot_id, vec![])
            .await
            .unwrap();
    }
    let other_node = format!("sv-{}-{}", "0".repeat(32), "ffffffff");
    let spanning = csi::CreateVolumeGroupSnapshotRequest {
        source_volume_ids: vec![image.volume_id.clone(), other_node],
        ..group_request(&new_name(), &[])
    };
    let refused = create_group(&driver, spanning).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("same node"),
        "{}",
        refused.message()
    );
    let cases: [(Vec<String>, Code); 4] = [
        (vec![], Code::InvalidArgument),
        (
            vec![image.volume_id.clone(), image.volume_id.clone()],
            Code::InvalidArgument,
        ),
        (vec!["../../etc".into()], Code::NotFound),
        (
            vec![format!("sv-{}-{}", "0".repeat(32), own_tag(&driver))],
            Code::NotFound,
        ),
    ];
    for (ids, code) in cases {
        let request = csi::CreateVolumeGroupSnapshotRequest {
            source_volume_ids: ids.clone(),
            ..group_request(&new_name(), &[])
        };
        let refused = create_group(&driver, request).await.unwrap_err();
        assert_eq!(refused.code(), code, "{ids:?}: {refused:?}");
    }
    let typo = csi::CreateVolumeGroupSnapshotRequest {
        parameters: params(&[("freeze", "no")]),
        ..group_request(&new_name(), &[&image])
    };
    assert_eq!(
        create_group(&driver, typo).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert!(
        driver.list_all_snapshots().await.is_empty(),
        "a refused group leaves nothing"
    );
    driver.unpublish_ok(&dir, &dir_target).await;
    driver.unpublish_ok(&block, &block_target).await;
    for volume in [&image, &dir, &block] {
        driver.delete(&volume.volume_id).await.unwrap();
    }
}

/// A pool that copies data in full (no reflinks) cannot cut in an instant.
#[tokio::test]
async fn a_pool_without_reflinks_refuses_groups() {
    let fs = scratchfs::ScratchFs::new("ext4", 256 << 20, &["-q"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.mount_point.join("data");
    driver.start_again().await;
    let a = driver.create_fs_volume().await;
    let refused = create_group(&driver, group_request(&new_name(), &[&a]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("reflink"),
        "{}",
        refused.message()
    );
    driver.delete(&a.volume_id).await.unwrap();
}

/// The capability is offered where volumes are (and the service named in the plugin's).
#[tokio::test]
async fn the_group_controller_offers_group_snapshots() {
    let driver = TestDriver::start().await;
    let caps = driver
        .group_controller()
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    use csi::group_controller_service_capability::{Type, rpc};
    assert!(caps.iter().any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32)));
    let plugin = driver
        .identity()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<i32> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert!(
        services.contains(&(csi::plugin_capability::service::Type::GroupControllerService as i32))
    );
}

/// kill -9 at any moment of cuts under a writer: after the restart every group listed is
/// whole (every member there, ready), no member or data outlives a group that never became
/// whole, nothing was moved aside, and every filesystem takes writes again.
#[tokio::test]
async fn kill9_during_cuts_leaves_whole_groups_or_none() {
    let (_fs, mut driver) = on_reflink_xfs().await;
    let mut volumes = Vec::new();
    for _ in 0..3 {
        volumes.push(published_image(&driver, ext4(), EXT4_IMAGE).await);
    }
    let targets: Vec<PathBuf> = volumes.iter().map(|(_, _, t)| t.clone()).collect();
    let writer = Writer::start(&targets);
    let ids: Vec<String> = volumes
        .iter()
        .map(|(v, _, _)| v.volume_id.clone())
        .collect();
    let mut undone = 0;
    for round in 0..40 {
        if round >= 12 && undone > 0 {
            break;
        }
        let channel = driver.channel();
        let ids = ids.clone();
        let storm = tokio::spawn(async move {
            let mut client = csi::group_controller_client::GroupControllerClient::new(channel);
            loop {
                let request = csi::CreateVolumeGroupSnapshotRequest {
                    name: new_name(),
                    source_volume_ids: ids.clone(),
                    ..Default::default()
                };
                if let Err(status) = client.create_volume_group_snapshot(request).await {
                    return status;
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(5 + (round as u64 * 7) % 40)).await;
        driver.kill9();
        let _ = storm.await;
        let before = driver
            .log_text()
            .matches("restart interrupted before it was whole")
            .count();
        driver.start_again().await;
        for group in check_whole_groups(&driver).await {
            delete_group(&driver, &group, vec![])
                .await
                .expect("DeleteVolumeGroupSnapshot");
        }
        undone += driver
            .log_text()
            .matches("restart interrupted before it was whole")
            .count()
            - before;
    }
    assert!(
        undone > 0,
        "no kill landed inside a cut: only kills between cuts were tested"
    );
    writer.wait_for(100);
    drop(writer);
    for target in &targets {
        fs::write(target.join("after"), b"writable").expect("every filesystem thawed");
    }
    for snapshot in driver.list_all_snapshots().await {
        let _ = delete_group(&driver, &snapshot.group_snapshot_id, vec![]).await;
    }
    for (volume, staging, target) in &volumes {
        tear_down(&driver, volume, staging, &[target]).await;
    }
}

/// Every listed snapshot is a member of a whole group, every such group has each member, and
/// the snapshots directory holds the listed snapshots' data and nothing else.
async fn check_whole_groups(driver: &TestDriver) -> BTreeSet<String> {
    let listed = driver.list_all_snapshots().await;
    let groups: BTreeSet<String> = listed.iter().map(|s| s.group_snapshot_id.clone()).collect();
    for id in &groups {
        let group = get_group(driver, id, vec![])
            .await
            .expect("a listed member's group exists");
        assert!(group.ready_to_use, "group {id} is whole");
        assert_eq!(group.snapshots.len(), 3);
    }
    let on_disk: BTreeSet<String> = dir_names(&driver.data.join("snapshots"))
        .into_iter()
        .map(|name| name.split('.').next().unwrap_or_default().to_string())
        .collect();
    let expected: BTreeSet<String> = listed.iter().map(|s| s.snapshot_id.clone()).collect();
    assert_eq!(
        on_disk, expected,
        "the snapshots directory holds exactly the listed snapshots"
    );
    let lost = driver.data.join("lost+found");
    assert!(
        dir_names(&lost).is_empty(),
        "nothing moved aside: {:?}",
        dir_names(&lost)
    );
    groups
}

/// The node tag this driver puts in its ids.
fn own_tag(driver: &TestDriver) -> String {
    stickyvol::volume::state::id::NodeTag::of(driver.node_id())
        .as_str()
        .to_string()
}

/// `stickyvol-bench group-snapshot`, short, against a driver it starts on a reflink pool: a
/// whole report (every cut made and deleted, the writers held during each cut), and nothing
/// left behind. The run of record (4 XFS members, 50 cuts) is in docs/performance.md.
#[tokio::test]
async fn the_group_snapshot_bench_reports_each_cut_and_leaves_nothing() {
    let (_fs, mut driver) = on_reflink_xfs().await;
    driver.stop().await;
    let args: Vec<String> = [
        "group-snapshot",
        "--endpoint",
        &format!("unix://{}", driver.socket.display()),
        "--kubelet-dir",
        &path_str(&driver.kubelet),
        "--members",
        "2",
        "--cuts",
        "3",
        "--fs-type",
        "ext4",
        "--size",
        &EXT4_IMAGE.to_string(),
        "--json",
        "--driver-cmd",
        &driver.shell_command(),
    ]
    .map(String::from)
    .to_vec();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_stickyvol-bench"))
            .args(&args)
            .output()
            .expect("running stickyvol-bench")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["workload"], "group-snapshot");
    assert_eq!(report["errors_total"], 0, "{report:#}");
    assert_eq!(report["rpcs"]["CreateVolumeGroupSnapshot"]["count"], 3);
    assert_eq!(report["rpcs"]["DeleteVolumeGroupSnapshot"]["count"], 3);
    let held = report["writers_held_us"]["max"].as_u64().unwrap();
    assert!(held > 0, "each cut holds the writers a while: {report:#}");
    let log = driver.log_text();
    assert_eq!(log.matches("group snapshot cut").count(), 3, "{log}");
    assert_eq!(driver.data_entries(), Vec::<String>::new(), "volume data");
    assert_eq!(
        dir_names(&driver.data.join("snapshots")),
        Vec::<String>::new()
    );
    assert_eq!(driver.mounts_left(), Vec::<PathBuf>::new());
    assert!(driver.loop_devices_left().is_empty(), "loop devices left");
    assert_eq!(dir_names(&driver.kubelet), Vec::<String>::new(), "kubelet");
}
