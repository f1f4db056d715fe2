//! Controller service as external-provisioner (and csi-sanity) use it: CreateVolume,
//! DeleteVolume, ValidateVolumeCapabilities, ListVolumes, ControllerGetVolume, GetCapacity.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use common::*;

/// "sv-", 32 hex digits, "-", and this node's tag (8 hex digits).
fn is_volume_id(id: &str) -> bool {
    let hex =
        |s: &str, len| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    id.len() <= 128
        && id
            .strip_prefix("sv-")
            .and_then(|rest| rest.split_once('-'))
            .is_some_and(|(uuid, tag)| hex(uuid, 32) && hex(tag, 8))
}

/// What every fresh volume of [`SIZE`] answers: an id of ours, the size, this node's topology.
#[track_caller]
fn assert_fresh_volume_of_size(volume: &csi::Volume) {
    assert!(is_volume_id(&volume.volume_id), "{}", volume.volume_id);
    assert_eq!(volume.capacity_bytes, SIZE);
    assert_eq!(volume.accessible_topology, vec![topology(NODE_ID)]);
}

// ---- CreateVolume ----

#[tokio::test]
async fn create_filesystem_volume() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    assert_fresh_volume_of_size(&volume);
    let path = host_path(&volume);
    assert!(path.starts_with(&driver.data), "{}", path.display());
    let meta = fs::symlink_metadata(&path).expect("the volume's directory");
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o777);
    assert_eq!(
        fs::read_dir(&path).unwrap().count(),
        0,
        "a new volume is empty"
    );
}

#[tokio::test]
async fn create_block_volume() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    assert_fresh_volume_of_size(&volume);
    let meta = fs::symlink_metadata(host_path(&volume)).expect("the volume's file");
    assert!(meta.is_file());
    assert_eq!(meta.len(), SIZE as u64);
    assert!(
        meta.blocks() * 512 < SIZE as u64 / 2,
        "the backing file should be sparse, has {} blocks",
        meta.blocks()
    );
}

#[tokio::test]
async fn create_with_a_128_byte_name() {
    let driver = TestDriver::start().await;
    // Like csi-sanity: a prefix with uppercase hex, padded with "a" to exactly 128 bytes.
    let mut name = "sanity-controller-create-maxlen-8595CE74-095C1B49".to_string();
    name.extend(std::iter::repeat_n('a', 128 - name.len()));
    let volume = driver
        .create(create_request(
            &name,
            mount_cap(Mode::SingleNodeWriter),
            SIZE,
        ))
        .await;
    assert!(is_volume_id(&volume.volume_id));
    let again = driver
        .create(create_request(
            &name,
            mount_cap(Mode::SingleNodeWriter),
            SIZE,
        ))
        .await;
    assert_eq!(again.volume_id, volume.volume_id);
}

#[tokio::test]
async fn names_longer_than_1024_bytes_are_refused() {
    let driver = TestDriver::start().await;
    let longest = "n".repeat(1024);
    driver
        .create(create_request(
            &longest,
            mount_cap(Mode::SingleNodeWriter),
            SIZE,
        ))
        .await;
    let too_long = driver
        .controller()
        .create_volume(create_request(
            &"n".repeat(1025),
            mount_cap(Mode::SingleNodeWriter),
            SIZE,
        ))
        .await;
    expect_code(too_long, Code::InvalidArgument);
    assert_eq!(driver.list_all().await.len(), 1);
}

#[tokio::test]
async fn create_is_idempotent_by_name() {
    let driver = TestDriver::start().await;
    let name = new_name();
    let request = csi::CreateVolumeRequest {
        parameters: params(&[("csi.storage.k8s.io/pvc/name", "data")]),
        ..create_request(&name, mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    let first = driver.create(request.clone()).await;
    let second = driver.create(request).await;
    assert_eq!(first, second);
    assert_eq!(driver.list_all().await.len(), 1);
    assert_eq!(driver.data_entries().len(), 1);
}

#[tokio::test]
async fn create_same_name_incompatible_is_already_exists() {
    let driver = TestDriver::start().await;
    let name = new_name();
    let base = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: SIZE,
            limit_bytes: SIZE,
        }),
        ..create_request(&name, mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    let volume = driver.create(base.clone()).await;
    assert_eq!(volume.capacity_bytes, SIZE, "required == limit is exact");

    let bigger = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 * SIZE,
            limit_bytes: 2 * SIZE,
        }),
        ..base.clone()
    };
    let block = csi::CreateVolumeRequest {
        volume_capabilities: vec![block_cap(Mode::SingleNodeWriter)],
        ..base.clone()
    };
    let other_mode = csi::CreateVolumeRequest {
        volume_capabilities: vec![mount_cap(Mode::SingleNodeSingleWriter)],
        ..base.clone()
    };
    let other_params = csi::CreateVolumeRequest {
        parameters: params(&[("csi.storage.k8s.io/pvc/name", "other")]),
        ..base.clone()
    };
    // Huge: the name conflict must be found before any space check.
    let huge = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 50,
            limit_bytes: 0,
        }),
        ..base.clone()
    };
    for (what, request) in [
        ("capacity", bigger),
        ("access type", block),
        ("access mode", other_mode),
        ("parameters", other_params),
        ("huge capacity", huge),
    ] {
        let result = driver.controller().create_volume(request).await;
        let status = expect_code(result, Code::AlreadyExists);
        assert!(!status.message().is_empty(), "{what}");
    }
    assert_eq!(driver.list_all().await.len(), 1);
    assert_eq!(driver.data_entries().len(), 1);
}

#[tokio::test]
async fn create_rejects_invalid_arguments() {
    let driver = TestDriver::start().await;
    let good = || create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE);
    let mut no_access_mode = mount_cap(Mode::SingleNodeWriter);
    no_access_mode.access_mode = None;
    let mut no_access_type = mount_cap(Mode::SingleNodeWriter);
    no_access_type.access_type = None;
    // A filesystem stickyvol does not make (ext4 and xfs make image volumes).
    let mut fs_type = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut fs_type.access_type {
        m.fs_type = "btrfs".into();
    }
    let cases = [
        (
            "missing name",
            csi::CreateVolumeRequest {
                name: String::new(),
                ..good()
            },
        ),
        (
            "missing capabilities",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![],
                ..good()
            },
        ),
        (
            "missing access mode",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![no_access_mode],
                ..good()
            },
        ),
        (
            "unknown access mode",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![mount_cap(Mode::Unknown)],
                ..good()
            },
        ),
        (
            "missing access type",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![no_access_type],
                ..good()
            },
        ),
        (
            "fs_type",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![fs_type],
                ..good()
            },
        ),
        (
            "size mount flag",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![mount_cap_with_flags(
                    Mode::SingleNodeWriter,
                    &["size=1G"],
                )],
                ..good()
            },
        ),
        (
            "multi-node multi-writer",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![mount_cap(Mode::MultiNodeMultiWriter)],
                ..good()
            },
        ),
        (
            "multi-node reader-only",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![block_cap(Mode::MultiNodeReaderOnly)],
                ..good()
            },
        ),
        (
            "block and mount mixed",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![
                    mount_cap(Mode::SingleNodeWriter),
                    block_cap(Mode::SingleNodeWriter),
                ],
                ..good()
            },
        ),
        (
            "negative capacity",
            csi::CreateVolumeRequest {
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: -1,
                    limit_bytes: 0,
                }),
                ..good()
            },
        ),
        (
            "content source naming nothing",
            csi::CreateVolumeRequest {
                volume_content_source: Some(csi::VolumeContentSource { r#type: None }),
                ..good()
            },
        ),
    ];
    for (what, request) in cases {
        let result = driver.controller().create_volume(request).await;
        let status = match result {
            Ok(response) => panic!("{what}: accepted: {response:?}"),
            Err(status) => status,
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    }
    let status = expect_code(
        driver
            .controller()
            .create_volume(create_request(
                &new_name(),
                mount_cap_with_flags(Mode::SingleNodeWriter, &["size=1G"]),
                SIZE,
            ))
            .await,
        Code::InvalidArgument,
    );
    assert!(status.message().contains("size=1G"), "{status:?}");
    assert_eq!(driver.list_all().await.len(), 0);
    assert_eq!(driver.data_entries(), Vec::<String>::new());
}

#[tokio::test]
async fn create_parameters_unknown_refused_provisioner_keys_accepted() {
    let driver = TestDriver::start().await;
    let status = expect_code(
        driver
            .controller()
            .create_volume(csi::CreateVolumeRequest {
                parameters: params(&[("sizeLimt", "1Gi")]),
                ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(status.message().contains("sizeLimt"), "{status:?}");

    // What external-provisioner --extra-create-metadata adds, and secret references.
    let volume = driver
        .create(csi::CreateVolumeRequest {
            parameters: params(&[
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "default"),
                ("csi.storage.k8s.io/pv/name", "pvc-1234"),
                ("csi.storage.k8s.io/provisioner-secret-name", "x"),
            ]),
            ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
        })
        .await;
    assert!(is_volume_id(&volume.volume_id));
}

#[tokio::test]
async fn create_on_node_loss_is_keep_or_release() {
    let driver = TestDriver::start().await;
    for bad in ["delete", "Release", ""] {
        let status = expect_code(
            driver
                .controller()
                .create_volume(csi::CreateVolumeRequest {
                    parameters: params(&[("onNodeLoss", bad)]),
                    ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
                })
                .await,
            Code::InvalidArgument,
        );
        assert!(status.message().contains("onNodeLoss"), "{status:?}");
    }
    assert_eq!(driver.list_all().await.len(), 0);
    for good in ["keep", "release"] {
        let volume = driver
            .create(csi::CreateVolumeRequest {
                parameters: params(&[("onNodeLoss", good)]),
                ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
            })
            .await;
        assert!(is_volume_id(&volume.volume_id), "{good}");
    }
}

#[tokio::test]
async fn create_capacity_rules() {
    let driver = TestDriver::start().await;
    let range = |required_bytes, limit_bytes| csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), 0)
    };
    expect_code(
        driver
            .controller()
            .create_volume(range(2 * SIZE, SIZE))
            .await,
        Code::OutOfRange,
    );
    // More than the filesystem holds: the scheduler should try another node.
    expect_code(
        driver.controller().create_volume(range(1 << 50, 0)).await,
        Code::ResourceExhausted,
    );
    let exact = driver.create(range(64 * MIB, 64 * MIB)).await;
    assert_eq!(exact.capacity_bytes, 64 * MIB);
    let at_least = driver.create(range(SIZE + 1, 0)).await;
    assert!(at_least.capacity_bytes > SIZE);
    let within = driver.create(range(SIZE, 4 * SIZE)).await;
    assert!((SIZE..=4 * SIZE).contains(&within.capacity_bytes));
    // No range at all (csi-sanity v5.3.1 does this): some default size.
    let default_size = driver
        .create(csi::CreateVolumeRequest {
            capacity_range: None,
            ..create_request(&new_name(), block_cap(Mode::SingleNodeWriter), 0)
        })
        .await;
    assert!(default_size.capacity_bytes > 0);
    assert_eq!(
        fs::metadata(host_path(&default_size)).unwrap().len(),
        default_size.capacity_bytes as u64
    );
}

#[tokio::test]
async fn create_honours_topology() {
    let driver = TestDriver::start().await;
    let with_topology = |requisite: Vec<csi::Topology>| csi::CreateVolumeRequest {
        accessibility_requirements: Some(csi::TopologyRequirement {
            preferred: requisite.clone(),
            requisite,
        }),
        ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    expect_code(
        driver
            .controller()
            .create_volume(with_topology(vec![topology("other-node")]))
            .await,
        Code::ResourceExhausted,
    );
    let here = driver
        .create(with_topology(vec![
            topology("other-node"),
            topology(NODE_ID),
        ]))
        .await;
    assert_eq!(here.accessible_topology, vec![topology(NODE_ID)]);
    // What csi-sanity does: requisite = exactly what NodeGetInfo reports.
    let info = driver
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let from_node_info = driver
        .create(with_topology(vec![info.accessible_topology.unwrap()]))
        .await;
    assert_eq!(from_node_info.accessible_topology, vec![topology(NODE_ID)]);
    assert_eq!(driver.data_entries().len(), 2);
}

#[tokio::test]
async fn create_accepts_single_node_modes() {
    let driver = TestDriver::start().await;
    for mode in [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ] {
        driver.create_with_capability(mount_cap(mode)).await;
        driver.create_with_capability(block_cap(mode)).await;
    }
    assert_eq!(driver.list_all().await.len(), 8);
}

// ---- DeleteVolume ----

#[tokio::test]
async fn delete_removes_data_and_record() {
    let mut driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;
    fs::write(host_path(&fs_volume).join("file"), b"data").unwrap();
    for volume in [&fs_volume, &block_volume] {
        driver
            .delete(&volume.volume_id)
            .await
            .expect("DeleteVolume");
        assert!(!exists_no_follow(&host_path(volume)));
        // Twice: the CO retries deletes.
        driver
            .delete(&volume.volume_id)
            .await
            .expect("second DeleteVolume");
        // csi-sanity's cleanup unpublishes every volume it made, deleted or not.
        let never_made = driver.mount_target();
        driver
            .unpublish(&volume.volume_id, &never_made)
            .await
            .expect("NodeUnpublishVolume of a deleted volume");
    }
    assert_eq!(driver.list_all().await.len(), 0);
    assert_eq!(driver.data_entries(), Vec::<String>::new());
    assert_eq!(driver.state_entries().await, Vec::<String>::new());
}

#[tokio::test]
async fn delete_unknown_or_foreign_ids_is_ok() {
    let driver = TestDriver::start().await;
    for id in [
        unknown_volume_id(),
        "fake-vol-id".to_string(),
        "../../etc".to_string(),
    ] {
        driver
            .delete(&id)
            .await
            .unwrap_or_else(|s| panic!("{id}: {s:?}"));
    }
    expect_code(driver.delete("").await, Code::InvalidArgument);
}

#[tokio::test]
async fn delete_of_a_recordless_id_removes_its_data_under_either_name() {
    let driver = TestDriver::start().await;
    let volumes = driver.data.join("volumes");
    let id = unknown_volume_id();
    // Data carrying the id but no record: a lost state directory, an interrupted create.
    let final_dir = volumes.join(&id);
    let staged_file = volumes.join(format!(".creating-{id}.img"));
    fs::create_dir_all(final_dir.join("sub")).unwrap();
    fs::write(final_dir.join("sub/file"), b"x").unwrap();
    fs::write(&staged_file, b"y").unwrap();
    let neighbour = driver.create_fs_volume().await;

    driver.delete(&id).await.expect("DeleteVolume");
    assert!(!exists_no_follow(&final_dir));
    assert!(!exists_no_follow(&staged_file));
    assert!(
        exists_no_follow(&host_path(&neighbour)),
        "other volumes untouched"
    );
}

#[tokio::test]
async fn delete_while_published_is_refused() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    expect_code(
        driver.delete(&volume.volume_id).await,
        Code::FailedPrecondition,
    );
    assert!(host_path(&volume).is_dir());
    driver.unpublish_ok(&volume, &target).await;
    driver.delete(&volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn delete_never_follows_planted_symlinks() {
    let driver = TestDriver::start().await;
    let outside = driver.root.join("outside");
    fs::create_dir_all(outside.join("dir")).unwrap();
    fs::write(outside.join("dir/precious"), b"keep").unwrap();
    fs::write(outside.join("file"), b"keep too").unwrap();

    let (volume, target) = driver.published_fs_volume().await;
    // What a pod can do inside its volume.
    fs::create_dir(target.join("sub")).unwrap();
    symlink(outside.join("dir"), target.join("sub/link-to-dir")).unwrap();
    symlink(outside.join("file"), target.join("link-to-file")).unwrap();
    driver.unpublish_ok(&volume, &target).await;

    driver
        .delete(&volume.volume_id)
        .await
        .expect("DeleteVolume");
    assert!(!exists_no_follow(&host_path(&volume)));
    assert_eq!(fs::read(outside.join("dir/precious")).unwrap(), b"keep");
    assert_eq!(fs::read(outside.join("file")).unwrap(), b"keep too");
}

#[tokio::test]
async fn delete_refuses_to_cross_a_planted_mount() {
    let driver = TestDriver::start().await;
    let outside = driver.root.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("precious"), b"keep").unwrap();
    let volume = driver.create_fs_volume().await;
    let planted = host_path(&volume).join("a/mnt");
    fs::create_dir_all(&planted).unwrap();
    let sibling = host_path(&volume).join("a/sibling");
    fs::write(&sibling, b"volume data").unwrap();
    nix::mount::mount(
        Some(&outside),
        &planted,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("planting a bind mount");

    let refused = driver.delete(&volume.volume_id).await;
    let unmounted = nix::mount::umount(&planted);
    expect_code(refused, Code::FailedPrecondition);
    unmounted.expect("removing the planted mount");
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"keep");
    assert_eq!(driver.list_all().await.len(), 1, "the volume still exists");
    assert_eq!(
        fs::read(&sibling).unwrap(),
        b"volume data",
        "a refused delete removes nothing, not half the volume"
    );
    // With the mount gone, the delete can finish.
    driver
        .delete(&volume.volume_id)
        .await
        .expect("DeleteVolume");
    assert!(!exists_no_follow(&host_path(&volume)));
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"keep");
}

/// An empty volume skips the mount table; a mount on the volume's directory itself (here of
/// an empty directory, so the volume still looks empty) must still stop the delete.
#[tokio::test]
async fn delete_refuses_a_mount_on_an_empty_looking_volume() {
    let driver = TestDriver::start().await;
    let empty = driver.root.join("empty");
    fs::create_dir(&empty).unwrap();
    let volume = driver.create_fs_volume().await;
    nix::mount::mount(
        Some(&empty),
        &host_path(&volume),
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("planting a bind mount");

    let refused = driver.delete(&volume.volume_id).await;
    let unmounted = nix::mount::umount(&host_path(&volume));
    let status = expect_code(refused, Code::FailedPrecondition);
    unmounted.expect("removing the planted mount");
    assert!(
        status.message().contains("refusing to delete across it"),
        "refused by the check before the delete starts: {status:?}"
    );
    assert!(empty.is_dir(), "the mounted directory is not removed");
    assert_eq!(driver.list_all().await.len(), 1, "the volume still exists");
    driver
        .delete(&volume.volume_id)
        .await
        .expect("DeleteVolume");
    assert!(!exists_no_follow(&host_path(&volume)));
}

/// A removal that fails midway (here an immutable file the walk cannot unlink) keeps the
/// volume: its record was committed as removed first, so it is committed again, and survives
/// a restart; the CO's retry finishes once the cause is gone.
#[tokio::test]
async fn a_delete_that_fails_midway_keeps_the_volume_for_a_retry() {
    let mut driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let stuck = host_path(&volume).join("stuck");
    fs::write(&stuck, b"cannot be unlinked").unwrap();
    let chattr = |flag: &str| {
        let status = std::process::Command::new("chattr")
            .arg(flag)
            .arg(&stuck)
            .status()
            .expect("running chattr (e2fsprogs)");
        assert!(status.success(), "chattr {flag}");
    };
    chattr("+i");

    let failed = driver.delete(&volume.volume_id).await;
    let still_there = stuck.exists();
    chattr("-i");
    assert!(failed.is_err(), "{failed:?}");
    assert!(still_there);
    assert_eq!(driver.list_all().await.len(), 1, "the volume still exists");
    driver.kill9_and_restart().await;
    assert_eq!(
        driver.list_all().await.len(),
        1,
        "and is still known after a crash"
    );

    driver
        .delete(&volume.volume_id)
        .await
        .expect("DeleteVolume");
    assert!(!exists_no_follow(&host_path(&volume)));
    assert!(driver.list_all().await.is_empty());
}

// ---- ValidateVolumeCapabilities ----

async fn validate(
    driver: &TestDriver,
    volume_id: &str,
    caps: Vec<csi::VolumeCapability>,
) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
    driver
        .controller()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: volume_id.into(),
            volume_capabilities: caps,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn validate_volume_capabilities() {
    let driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;

    for (volume, cap) in [
        (&fs_volume, mount_cap(Mode::SingleNodeWriter)),
        (&fs_volume, mount_cap(Mode::SingleNodeMultiWriter)),
        (&block_volume, block_cap(Mode::SingleNodeWriter)),
    ] {
        let response = validate(&driver, &volume.volume_id, vec![cap.clone()])
            .await
            .unwrap();
        let confirmed = response.confirmed.expect("confirmed");
        assert_eq!(confirmed.volume_capabilities, vec![cap]);
    }
    for (volume, cap) in [
        (&fs_volume, block_cap(Mode::SingleNodeWriter)),
        (&block_volume, mount_cap(Mode::SingleNodeWriter)),
        (&fs_volume, mount_cap(Mode::MultiNodeMultiWriter)),
        (&block_volume, block_cap(Mode::MultiNodeReaderOnly)),
    ] {
        let response = validate(&driver, &volume.volume_id, vec![cap])
            .await
            .unwrap();
        assert!(response.confirmed.is_none());
        assert!(!response.message.is_empty());
    }
    for id in ["fake-vol-id-d099c560-c".to_string(), unknown_volume_id()] {
        expect_code(
            validate(&driver, &id, vec![mount_cap(Mode::SingleNodeWriter)]).await,
            Code::NotFound,
        );
    }
    expect_code(
        validate(&driver, &fs_volume.volume_id, vec![]).await,
        Code::InvalidArgument,
    );
    expect_code(
        validate(&driver, "", vec![mount_cap(Mode::SingleNodeWriter)]).await,
        Code::InvalidArgument,
    );
}

// ---- ListVolumes ----

#[tokio::test]
async fn list_volumes_tracks_creates_and_deletes() {
    let driver = TestDriver::start().await;
    assert_eq!(driver.list_all().await.len(), 0);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(driver.create_fs_volume().await.volume_id);
    }
    let volume = driver.create_block_volume().await;
    ids.push(volume.volume_id.clone());
    let entries = driver.list_all().await;
    let mut listed: Vec<_> = entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids);
    let block_entry = entries
        .iter()
        .find(|e| e.volume.as_ref().unwrap().volume_id == volume.volume_id)
        .unwrap();
    assert_eq!(block_entry.volume.as_ref().unwrap(), &volume);
    for entry in &entries {
        let status = entry.status.as_ref().expect("status");
        let condition = status.volume_condition.as_ref().expect("volume_condition");
        assert!(!condition.abnormal);
    }
    driver.delete(&volume.volume_id).await.unwrap();
    assert_eq!(driver.list_all().await.len(), 3);
}

#[tokio::test]
async fn list_volumes_pages() {
    let driver = TestDriver::start().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(driver.create_fs_volume().await.volume_id);
    }
    let page = |token: String| {
        let mut client = driver.controller();
        async move {
            client
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 2,
                    starting_token: token,
                })
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let response = page(token).await.expect("ListVolumes page");
        pages += 1;
        assert!(response.entries.len() <= 2);
        seen.extend(
            response
                .entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if response.next_token.is_empty() {
            break;
        }
        token = response.next_token;
    }
    assert_eq!(pages, 3);
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);

    // The token names the last volume of the page; deleting it between pages must not break paging.
    let first = page(String::new()).await.unwrap();
    let token = first.next_token.clone();
    assert!(!token.is_empty());
    driver.delete(&token).await.unwrap();
    let mut rest = Vec::new();
    let mut next = token;
    while !next.is_empty() {
        let response = page(next).await.expect("page after a deleted token");
        rest.extend(
            response
                .entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        next = response.next_token;
    }
    assert_eq!(rest.len(), 3, "{rest:?}");
    assert!(!rest.contains(&first.entries[0].volume.as_ref().unwrap().volume_id));
}

#[tokio::test]
async fn list_volumes_rejects_bad_tokens_and_sizes() {
    let driver = TestDriver::start().await;
    driver.create_fs_volume().await;
    for token in ["invalid-token", "sv-XYZ", "../../x"] {
        expect_code(
            driver
                .controller()
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token: token.into(),
                })
                .await,
            Code::Aborted,
        );
    }
    expect_code(
        driver
            .controller()
            .list_volumes(csi::ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new(),
            })
            .await,
        Code::InvalidArgument,
    );
}

#[tokio::test]
async fn list_volumes_reports_the_publishing_node() {
    let driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;
    let both = [&fs_volume, &block_volume];
    driver.assert_published_on(&both, &[]).await;

    let fs_target = driver
        .publish_at_new_target(&fs_volume, mount_cap(Mode::SingleNodeWriter))
        .await;
    let block_target = driver
        .publish_at_new_target(&block_volume, block_cap(Mode::SingleNodeWriter))
        .await;
    driver.assert_published_on(&both, &[NODE_ID]).await;

    driver.unpublish_ok(&fs_volume, &fs_target).await;
    driver.unpublish_ok(&block_volume, &block_target).await;
    driver.assert_published_on(&both, &[]).await;
}

// ---- ControllerGetVolume ----

#[tokio::test]
async fn controller_get_volume_reports_condition() {
    let driver = TestDriver::start().await;
    for id in [unknown_volume_id(), "fake-vol-id".into()] {
        expect_code(driver.get_volume(&id).await, Code::NotFound);
    }
    expect_code(driver.get_volume("").await, Code::InvalidArgument);

    let volume = driver.create_fs_volume().await;
    let response = driver.get_volume(&volume.volume_id).await.unwrap();
    assert_eq!(response.volume.as_ref(), Some(&volume));
    let status = response.status.expect("status");
    assert!(status.published_node_ids.is_empty());
    let condition = status.volume_condition.expect("condition");
    assert!(!condition.abnormal, "{condition:?}");

    // Someone removes the data behind the driver's back.
    fs::remove_dir(host_path(&volume)).unwrap();
    let condition = driver.condition_of(&volume.volume_id).await;
    assert!(condition.abnormal);
    assert!(!condition.message.is_empty());
    // Deleting such a volume still works.
    driver.delete(&volume.volume_id).await.unwrap();
    expect_code(driver.get_volume(&volume.volume_id).await, Code::NotFound);
}

// ---- GetCapacity ----

#[tokio::test]
async fn get_capacity() {
    let driver = TestDriver::start().await;
    // csi-sanity sends a completely empty request.
    let empty = driver
        .get_capacity(csi::GetCapacityRequest::default())
        .await;
    assert!(empty.available_capacity > 0);
    assert!(empty.maximum_volume_size.is_some_and(|m| m > 0));

    // external-provisioner --enable-capacity: raw StorageClass parameters, this node's topology.
    let provisioner = driver
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![],
            parameters: params(&[
                ("csi.storage.k8s.io/fstype", ""),
                ("csi.storage.k8s.io/provisioner-secret-name", "x"),
            ]),
            accessible_topology: Some(topology(NODE_ID)),
        })
        .await;
    assert!(provisioner.available_capacity > 0);
    let with_caps = driver
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![block_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await;
    assert!(with_caps.available_capacity > 0);

    let elsewhere = driver
        .get_capacity(csi::GetCapacityRequest {
            accessible_topology: Some(topology("other-node")),
            ..Default::default()
        })
        .await;
    assert_eq!(elsewhere.available_capacity, 0);
}

/// A class with a misspelt key still gets capacity (so the scheduler picks a node and
/// CreateVolume's error, which names the key and what is allowed, reaches the claim); one with a
/// mistake that also names a pool this node lacks still gets none here.
#[tokio::test]
async fn a_class_with_a_mistake_gets_capacity_and_its_create_names_the_mistake() {
    let driver = TestDriver::start().await;
    let capacity = |pairs: &'static [(&'static str, &'static str)]| {
        driver.get_capacity(csi::GetCapacityRequest {
            parameters: params(pairs),
            ..Default::default()
        })
    };
    assert!(
        capacity(&[("bogusParameter", "x")])
            .await
            .available_capacity
            > 0
    );
    assert!(
        capacity(&[("onNodeLoss", "maybe")])
            .await
            .available_capacity
            > 0
    );
    let missing_pool = capacity(&[("bogusParameter", "x"), ("pool", "nvme")]).await;
    assert_eq!(missing_pool.available_capacity, 0);

    let request = csi::CreateVolumeRequest {
        parameters: params(&[("bogusParameter", "x")]),
        ..create_request("misspelt", mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    let status = expect_code(
        driver.controller().create_volume(request).await,
        Code::InvalidArgument,
    );
    assert!(
        status.message().contains("\"bogusParameter\"") && status.message().contains("onNodeLoss"),
        "{}",
        status.message()
    );
}
