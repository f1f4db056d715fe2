//! Capacity for the scheduler and pools, on filesystems that cannot limit directory sizes:
//! GetCapacity subtracts what volumes were promised but have not written, CreateVolume refuses
//! what would break a promise, thick block files are allocated, a class can require
//! enforcement, and volumes live in (and remember) the pool they ask for. Tests that compare
//! free-space figures run on a data dir of their own (a tmpfs of known size), where nothing
//! but the driver under test moves them. Enforced sizes on a real btrfs filesystem are in
//! tests/btrfs.rs.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use tonic::Code;

const GIB: i64 = 1 << 30;

/// The data dir's own filesystem in the tests that compare free space (see
/// [`start_on_own_filesystem`]): big enough for the 128 MiB a thick volume grows to.
const OWN_FILESYSTEM: &str = "512m";

/// Slack for free-space comparisons on a data dir of its own: what the driver itself writes
/// there besides volume data. Its journal preallocates each generation (4 MiB, the journal's
/// default `max_bytes`), and a rotation holds two generations until the old one is dropped;
/// records and lock files take a few KiB more, rounded up to 1 MiB. Every effect asserted
/// with it is 64 MiB or more (measured deviations here: 0 bytes).
const NOISE: i64 = 2 * 4 * MIB + MIB;

/// A driver whose data dir (the default pool) is a tmpfs of its own, [`OWN_FILESYSTEM`]
/// large, started with `args` and, when `metrics`, a metrics address. The tmpfs goes with
/// the driver's cleanup (also after a failure).
async fn start_on_own_filesystem(metrics: bool, args: &[&str]) -> TestDriver {
    for _ in 0..5 {
        let mut options = Options::default();
        if metrics {
            options.metrics_address = Some(free_local_address());
        }
        let mut driver = TestDriver::prepare(options);
        driver.add_args(args.iter().map(|a| a.to_string()));
        fs::create_dir_all(&driver.data).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &driver.data,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={OWN_FILESYSTEM},mode=0700").as_str()),
        )
        .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", driver.data.display()));
        match driver.try_start_again().await {
            Ok(()) => return driver,
            // The port found free was taken before the driver bound it: another one.
            Err(_) if metrics && driver.log_text().contains("Address already in use") => {}
            Err(status) => panic!(
                "stickyvol exited with {status} before serving; log:\n{}",
                driver.log_text()
            ),
        }
    }
    panic!("no free metrics port in 5 attempts");
}

fn snw_block() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

/// A class asking for sparse block files (thick is the default on the test pools).
const THIN: &[(&str, &str)] = &[("blockAllocation", "thin")];

fn request_in(
    parameters: &[(&str, &str)],
    capability: csi::VolumeCapability,
    bytes: i64,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(parameters),
        ..create_request(&new_name(), capability, bytes)
    }
}

fn allocated_bytes(path: &Path) -> i64 {
    let meta = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    meta.blocks() as i64 * 512
}

/// What the default pool's volumes may still write, from the driver's metrics.
fn unwritten_promises(driver: &TestDriver) -> i64 {
    driver.scrape().value(
        "stickyvol_pool_unwritten_promised_bytes",
        &[("pool", "default")],
    ) as i64
}

/// What the default pool can still promise, per the metric GetCapacity's figure also feeds.
fn available_metric(driver: &TestDriver) -> i64 {
    driver
        .scrape()
        .value("stickyvol_pool_available_bytes", &[("pool", "default")]) as i64
}

fn assert_near(actual: i64, expected: i64, what: &str) {
    assert!(
        (actual - expected).abs() < NOISE,
        "{what}: {actual} is not within {NOISE} of {expected}"
    );
}

#[tokio::test]
async fn unwritten_promises_lower_capacity_until_the_volume_is_deleted() {
    let driver = start_on_own_filesystem(false, &[]).await;
    let before = driver.available_capacity(&[], snw_block()).await;
    let size = (before / 4).min(8 * GIB) / 4096 * 4096;
    let volume = driver.create(request_in(THIN, snw_block(), size)).await;
    // A thin file takes no space yet, but its pod may fill it at any moment.
    let file = host_path(&volume);
    assert!(allocated_bytes(&file) < MIB, "thin file is allocated");
    let during = driver.available_capacity(&[], snw_block()).await;
    assert_near(during, before - size, "capacity with one thin volume");
    let response = driver
        .get_capacity(csi::GetCapacityRequest::default())
        .await;
    assert_eq!(
        response.maximum_volume_size,
        Some(response.available_capacity),
        "one volume can take everything that is available"
    );

    driver.delete(&volume.volume_id).await.unwrap();
    let after = driver.available_capacity(&[], snw_block()).await;
    assert_near(after, before, "capacity after the delete");
}

#[tokio::test]
async fn creates_beyond_the_promised_space_are_refused_until_space_is_freed() {
    let driver = TestDriver::start().await;
    let available = driver.available_capacity(&[], snw_block()).await;
    let size = available * 6 / 10 / 4096 * 4096;
    let first = driver.create(request_in(&[], snw_block(), size)).await;
    // Free space alone would allow it: the files are sparse.
    let second = request_in(&[], snw_block(), size);
    let status = expect_code(
        driver.controller().create_volume(second.clone()).await,
        Code::ResourceExhausted,
    );
    assert!(
        status.message().contains("can promise only"),
        "{}",
        status.message()
    );
    assert_eq!(driver.data_entries().len(), 1, "a refused create left data");

    // Growing past the promise is refused the same way, while published.
    let target = driver.publish_at_new_target(&first, snw_block()).await;
    expect_code(
        driver
            .expand(expand_request(&first.volume_id, &target, size * 2, 0))
            .await,
        Code::ResourceExhausted,
    );
    assert_eq!(driver.capacity_of(&first.volume_id).await, size);
    driver.unpublish_ok(&first, &target).await;

    driver.delete(&first.volume_id).await.unwrap();
    driver.create(second).await;
}

/// Mounts a tmpfs of [`OWN_FILESYSTEM`] at `dir` (gone with the driver's cleanup).
fn own_tmpfs(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(format!("size={OWN_FILESYSTEM},mode=0700").as_str()),
    )
    .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", dir.display()));
}

/// kubelet evicts every pod of its node once its filesystem has less than its hard eviction
/// threshold free (10% by default): a pool on that filesystem never promises those bytes, and
/// a pool on a filesystem of its own keeps nothing back.
#[tokio::test]
async fn a_pool_on_kubelets_filesystem_keeps_back_kubelets_eviction_threshold() {
    for (reserve, kept_percent) in [(None, 10), (Some("25"), 25), (Some("0"), 0)] {
        let mut driver = TestDriver::prepare(Options {
            kubelet_reserve_as_deployed: reserve.is_none(),
            ..Options::default()
        });
        own_tmpfs(&driver.kubelet);
        own_tmpfs(&driver.data);
        let shared = driver.kubelet.join("pool");
        driver.add_args([
            "--pool".to_string(),
            format!("onkubelet={}", shared.display()),
        ]);
        if let Some(percent) = reserve {
            driver.add_args(["--kubelet-eviction-reserve", percent]);
        }
        driver.start_again().await;
        let size = 512 * MIB;
        let kept = size / 100 * kept_percent;

        let on_kubelet = driver
            .available_capacity(&[("pool", "onkubelet")], snw_block())
            .await;
        let free = available_bytes(&shared) as i64;
        assert_near(
            on_kubelet,
            free - kept,
            &format!("reserve {reserve:?}: the pool on kubelet's filesystem"),
        );
        let own = driver.available_capacity(&[], snw_block()).await;
        assert_near(
            own,
            available_bytes(&driver.data) as i64,
            "the pool on a filesystem of its own",
        );

        // What GetCapacity leaves out, CreateVolume refuses.
        if kept > 0 {
            let too_big = (on_kubelet + 4 * MIB) / 4096 * 4096;
            let status = expect_code(
                driver
                    .controller()
                    .create_volume(request_in(&[("pool", "onkubelet")], snw_block(), too_big))
                    .await,
                Code::ResourceExhausted,
            );
            assert!(
                status.message().contains("can promise only"),
                "{}",
                status.message()
            );
        }
        let fits = (on_kubelet - 4 * MIB) / 4096 * 4096;
        let volume = driver
            .create(request_in(&[("pool", "onkubelet")], snw_block(), fits))
            .await;
        driver.delete(&volume.volume_id).await.unwrap();
    }
}

#[tokio::test]
async fn overcommit_lets_a_pool_promise_more_than_it_holds() {
    let driver = start_on_own_filesystem(false, &["--overcommit", "default=2"]).await;
    let available = driver.available_capacity(&[], snw_block()).await;
    let size = available * 6 / 10 / 4096 * 4096;
    driver.create(request_in(&[], snw_block(), size)).await;
    // Half of the first promise is backed: 0.3 of the space is taken, 0.7 remains.
    driver.create(request_in(&[], snw_block(), size)).await;
    let left = driver.available_capacity(&[], snw_block()).await;
    assert_near(
        left,
        available - size,
        "capacity with two volumes at ratio 2",
    );
}

#[tokio::test]
async fn thick_block_volumes_are_allocated_when_created_and_grown() {
    let driver = start_on_own_filesystem(true, &[]).await;
    let before = driver.available_capacity(&[], snw_block()).await;
    let size = 64 * MIB;
    let thick = [("blockAllocation", "thick")];
    let volume = driver.create(request_in(&thick, snw_block(), size)).await;
    let file = host_path(&volume);
    assert!(
        allocated_bytes(&file) >= size,
        "thick file is not allocated"
    );
    assert_near(
        driver.available_capacity(&[], snw_block()).await,
        before - size,
        "capacity with a thick volume",
    );
    // Exact, unlike free space: a thick file owes nothing more, a thin one its whole size.
    assert_eq!(unwritten_promises(&driver), 0);
    let thin = driver.create(request_in(THIN, snw_block(), size)).await;
    assert_eq!(unwritten_promises(&driver), size);
    driver.delete(&thin.volume_id).await.unwrap();
    assert_eq!(unwritten_promises(&driver), 0);

    let target = driver.publish_at_new_target(&volume, snw_block()).await;
    let grown = driver
        .expand(expand_request(&volume.volume_id, &target, 2 * size, 0))
        .await
        .unwrap();
    assert_eq!(grown, 2 * size);
    assert_eq!(
        unwritten_promises(&driver),
        0,
        "the growth is allocated too"
    );
    assert!(
        allocated_bytes(&file) >= 2 * size,
        "grown thick file is not allocated"
    );
    assert_near(
        driver.available_capacity(&[], snw_block()).await,
        before - 2 * size,
        "capacity with the grown thick volume",
    );
    assert_eq!(fs::metadata(&file).unwrap().len(), 2 * size as u64);
    driver.unpublish_ok(&volume, &target).await;

    expect_code(
        driver
            .controller()
            .create_volume(request_in(
                &[("blockAllocation", "sparse")],
                snw_block(),
                size,
            ))
            .await,
        Code::InvalidArgument,
    );
}

#[tokio::test]
async fn a_class_requiring_enforcement_is_refused_by_a_pool_without_it() {
    let mut driver = TestDriver::prepare(Options::default());
    driver.add_args(["--enforcement", "default=none"]);
    driver.start_again().await;
    let required = [("requireEnforcement", "true")];
    let status = expect_code(
        driver
            .controller()
            .create_volume(request_in(&required, snw_mount(), SIZE))
            .await,
        Code::ResourceExhausted,
    );
    assert!(
        status.message().contains("cannot enforce"),
        "{}",
        status.message()
    );
    assert!(driver.data_entries().is_empty());
    // Nodes that would refuse report no capacity, so the scheduler looks elsewhere...
    assert_eq!(driver.available_capacity(&required, snw_mount()).await, 0);
    assert!(driver.available_capacity(&[], snw_mount()).await > 0);
    // ...but a block volume is always limited by its file.
    assert!(driver.available_capacity(&required, snw_block()).await > 0);
    driver
        .create(request_in(&required, snw_block(), SIZE))
        .await;
}

#[tokio::test]
async fn usage_measured_by_stats_releases_promised_space() {
    let driver = start_on_own_filesystem(true, &[]).await;
    let unwritten = unwritten_promises;
    let (volume, target) = driver.published_fs_volume().await;
    assert_eq!(unwritten(&driver), SIZE);
    assert_near(
        available_metric(&driver),
        driver.available_capacity(&[], snw_mount()).await,
        "the available-bytes metric against GetCapacity",
    );
    write_synced(&target.join("data"), &pattern(4 * MIB as usize, 1));
    let stats = driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    let used = usage_of(&stats, csi::volume_usage::Unit::Bytes)
        .unwrap()
        .used;
    assert!(used >= 4 * MIB, "stats report {used} bytes used");
    assert_eq!(unwritten(&driver), SIZE - used);
}

/// A class naming `pool` gets no capacity here, and a create RESOURCE_EXHAUSTED naming it
/// (which sends the claim back to the scheduler).
async fn assert_node_lacks_pool(driver: &TestDriver, pool: &str) {
    let in_pool = [("pool", pool)];
    assert_eq!(driver.available_capacity(&in_pool, snw_mount()).await, 0);
    let status = expect_code(
        driver
            .controller()
            .create_volume(request_in(&in_pool, snw_mount(), SIZE))
            .await,
        Code::ResourceExhausted,
    );
    assert!(
        status.message().contains(&format!("no pool {pool:?}")),
        "{}",
        status.message()
    );
}

/// A volume whose pool this node lacks now: reported abnormal naming the pool, and not deleted
/// (FAILED_PRECONDITION) until the pool is back.
async fn assert_kept_without_its_pool(driver: &TestDriver, volume: &csi::Volume, pool: &str) {
    let condition = driver.condition_of(&volume.volume_id).await;
    assert!(
        condition.abnormal && condition.message.contains(pool),
        "{condition:?}"
    );
    expect_code(
        driver.delete(&volume.volume_id).await,
        Code::FailedPrecondition,
    );
}

#[tokio::test]
async fn volumes_live_in_the_pool_their_class_names() {
    let mut driver = TestDriver::prepare(Options::default());
    let fast = driver.root.join("fast");
    driver.add_args(["--pool".to_string(), format!("fast={}", fast.display())]);
    driver.start_again().await;
    let in_fast = [("pool", "fast")];
    let volume = driver.create(request_in(&in_fast, snw_mount(), SIZE)).await;
    let data = host_path(&volume);
    assert_eq!(data, fast.join("volumes").join(&volume.volume_id));
    assert!(
        driver.data_entries().is_empty(),
        "data landed in the data dir"
    );
    let target = driver.publish_at_new_target(&volume, snw_mount()).await;
    fs::write(target.join("hello"), b"fast").unwrap();
    assert_eq!(fs::read(data.join("hello")).unwrap(), b"fast");
    driver.unpublish_ok(&volume, &target).await;
    assert!(driver.available_capacity(&in_fast, snw_mount()).await > 0);

    // A pool this node lacks: no capacity, and a create goes elsewhere.
    assert_node_lacks_pool(&driver, "nvme").await;
    // A publication left in place while the pool goes away.
    let kept = driver.publish_at_new_target(&volume, snw_mount()).await;

    // The volume remembers its pool across restarts; without the pool it is unusable but
    // untouched, and comes back with it.
    driver.stop().await;
    let args = std::mem::take(&mut driver.options_mut().extra_args);
    driver.start_again().await;
    assert_kept_without_its_pool(&driver, &volume, "fast").await;
    assert!(data.join("hello").exists());
    // Kubelet can still tear the pod down: a live mount is refused, a gone one is fine.
    expect_code(
        driver.unpublish(&volume.volume_id, &kept).await,
        Code::FailedPrecondition,
    );
    nix::mount::umount(&kept).unwrap();
    driver.unpublish(&volume.volume_id, &kept).await.unwrap();
    assert!(!kept.exists());
    driver.stop().await;
    driver.add_args(args);
    driver.start_again().await;
    driver.delete(&volume.volume_id).await.unwrap();
    assert!(!data.exists());
}

#[tokio::test]
async fn an_optional_pool_exists_only_where_its_directory_does() {
    let mut driver = TestDriver::prepare(Options::default());
    // The pool's directory on a disk not mounted here: the driver must not make it.
    let disk = driver.root.join("disk");
    let fast = disk.join("stickyvol");
    driver.add_args([
        "--optional-pool".to_string(),
        format!("fast={}", fast.display()),
    ]);
    driver.start_again().await;
    let in_fast = [("pool", "fast")];
    assert_node_lacks_pool(&driver, "fast").await;
    assert!(!disk.exists(), "the absent pool's directory was created");
    assert!(
        driver.log_text().contains("optional pool absent"),
        "the log does not say the pool is absent"
    );

    // The disk mounted and the directory made on it: the pool is there after a restart.
    fs::create_dir_all(&fast).unwrap();
    driver.restart().await;
    assert!(driver.available_capacity(&in_fast, snw_mount()).await > 0);
    let volume = driver.create(request_in(&in_fast, snw_mount(), SIZE)).await;
    assert_eq!(
        host_path(&volume),
        fast.join("volumes").join(&volume.volume_id)
    );

    // The disk gone at a later start: its volume is kept, unusable, until it is back.
    driver.stop().await;
    let unmounted = driver.root.join("disk-unmounted");
    fs::rename(&disk, &unmounted).unwrap();
    driver.start_again().await;
    assert_kept_without_its_pool(&driver, &volume, "fast").await;
    assert!(!disk.exists());
    driver.stop().await;
    fs::rename(&unmounted, &disk).unwrap();
    driver.start_again().await;
    driver.delete(&volume.volume_id).await.unwrap();
    assert!(!fast.join("volumes").join(&volume.volume_id).exists());
}

#[tokio::test]
async fn bad_pool_flags_stop_the_driver_with_a_reason() {
    let mut driver = TestDriver::prepare(Options::default());
    let inside = driver.data.join("sub");
    driver.add_args(["--pool".to_string(), format!("sub={}", inside.display())]);
    let status = driver.try_start_again().await.unwrap_err();
    assert!(!status.success());
    assert!(
        driver.log_text().contains("overlaps"),
        "{}",
        driver.log_text()
    );
}

#[tokio::test]
async fn an_expansion_the_host_already_made_is_recorded_without_a_second_space_check() {
    let driver = TestDriver::start().await;
    let available = driver.available_capacity(&[], snw_block()).await;
    let size = available * 6 / 10 / 4096 * 4096;
    let volume = driver.create(request_in(THIN, snw_block(), size)).await;
    let target = driver.publish_at_new_target(&volume, snw_block()).await;
    // The state a crash leaves between growing the file and writing the record: the pool
    // could not promise the growth again, but the host has already made it.
    let grown = 2 * size;
    let file = fs::OpenOptions::new()
        .write(true)
        .open(host_path(&volume))
        .unwrap();
    file.set_len(grown as u64).unwrap();
    let capacity = driver
        .expand(expand_request(&volume.volume_id, &target, grown, 0))
        .await
        .unwrap();
    assert_eq!(capacity, grown);
    assert_eq!(driver.capacity_of(&volume.volume_id).await, grown);
    assert_eq!(sysfs_size_bytes(&linked_device(&target)), grown as u64);
    driver.unpublish_ok(&volume, &target).await;
}

/// A create the books would refuse measures usage once more before refusing: a pod's writes
/// into a thin block volume turn its promise into used bytes, which the books learn only when
/// they measure. On a scratch filesystem of its own, so that no other test moves free space.
#[tokio::test]
async fn a_create_refused_by_stale_figures_measures_usage_again_first() {
    use std::os::unix::fs::FileExt;
    let fs = common::scratchfs::ScratchFs::new("xfs", 512 << 20, &["-q"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.path("data");
    driver.start_again().await;
    let available = driver.available_capacity(&[], snw_block()).await;
    // Everything but 64 MiB promised to one thin volume.
    let size = (available - 64 * MIB) / 4096 * 4096;
    let big = driver.create(request_in(&[], snw_block(), size)).await;

    // The pod writes 128 MiB: free space falls by that much while the books still count the
    // whole promise as unwritten, so they see 64 − 128 MiB left.
    let image = fs::OpenOptions::new()
        .write(true)
        .open(host_path(&big))
        .unwrap();
    let chunk = pattern(MIB as usize, 9);
    for at in 0..128 {
        image.write_all_at(&chunk, at * MIB as u64).unwrap();
    }
    image.sync_all().unwrap();
    drop(image);

    // Measured, 64 MiB are left: 32 fit, 96 do not.
    let small = driver.create(request_in(&[], snw_block(), 32 * MIB)).await;
    let status = expect_code(
        driver
            .controller()
            .create_volume(request_in(&[], snw_block(), 96 * MIB))
            .await,
        Code::ResourceExhausted,
    );
    assert!(
        status.message().contains("can promise only"),
        "{}",
        status.message()
    );
    driver.delete(&small.volume_id).await.unwrap();
    driver.delete(&big.volume_id).await.unwrap();
}

/// On a pool that cannot limit directory volumes (tmpfs here) a block or image volume is
/// fallocated unless its class says otherwise, so a directory volume filling the pool cannot take
/// the blocks it was promised; a pool that overcommits keeps them sparse (sharing is its point).
#[tokio::test]
async fn block_and_image_volumes_are_thick_by_default_where_directories_are_not_limited() {
    let driver = start_on_own_filesystem(false, &[]).await;
    let mut image_cap = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(mount)) = &mut image_cap.access_type {
        mount.fs_type = "ext4".into();
    }
    let size = 64 * MIB;
    for (what, cap) in [("block", snw_block()), ("image", image_cap)] {
        let started = std::time::Instant::now();
        let thick = driver.create(request_in(&[], cap.clone(), size)).await;
        let took = started.elapsed();
        // mkfs may give back a few blocks of its own (64 KiB seen): not a sparse file.
        let allocated = allocated_bytes(&host_path(&thick));
        assert!(
            allocated >= size - MIB,
            "{what}: the default is not allocated ({allocated} of {size})"
        );
        let started = std::time::Instant::now();
        let thin = driver.create(request_in(THIN, cap.clone(), size)).await;
        eprintln!(
            "{what} CreateVolume of 64 MiB: thick {took:?}, thin {:?}",
            started.elapsed()
        );
        assert!(
            allocated_bytes(&host_path(&thin)) < size / 2,
            "{what}: a class that says thin gets a sparse file"
        );
        for volume in [thick, thin] {
            driver.delete(&volume.volume_id).await.unwrap();
        }
    }
    drop(driver);

    let sharing = start_on_own_filesystem(false, &["--overcommit", "default=2"]).await;
    let volume = sharing.create(request_in(&[], snw_block(), size)).await;
    assert!(
        allocated_bytes(&host_path(&volume)) < size / 2,
        "an overcommitting pool keeps block volumes sparse"
    );
    sharing.delete(&volume.volume_id).await.unwrap();
}
