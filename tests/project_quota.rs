//! Pools on XFS and ext4: project quotas where the kernel has them, and clear refusals where it
//! does not. This test machine's kernel has no XFS/ext4 quota support, so the enforcement test
//! says SKIPPED here and runs where the mount with prjquota works.

mod common;

use std::fs::File;
use std::io::Write;

use common::scratchfs::ScratchFs;
use common::*;
use csi::volume_usage::Unit;
use tonic::Code;

const FS_SIZE: u64 = 512 << 20;

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

fn in_pool(parameters: &[(&str, &str)], bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(parameters),
        ..create_request(&new_name(), snw_mount(), bytes)
    }
}

/// A stopped driver whose pool "disk" lives on `fs`.
fn driver_on(fs: &ScratchFs, enforcement: Option<&str>) -> TestDriver {
    let mut driver = TestDriver::prepare(Options::default());
    let pool = fs.mount_point.join("pool");
    driver.add_args(["--pool".to_string(), format!("disk={}", pool.display())]);
    if let Some(choice) = enforcement {
        driver.add_args(["--enforcement".to_string(), format!("disk={choice}")]);
    }
    driver
}

fn ext4() -> ScratchFs {
    ScratchFs::new("ext4", FS_SIZE, &["-q"], "")
        .unwrap_or_else(|why| panic!("cannot make an ext4 filesystem: {why}"))
}

#[tokio::test]
async fn a_class_requiring_enforcement_refuses_an_ext4_pool_without_project_quota() {
    let fs = ext4();
    let mut driver = driver_on(&fs, None);
    driver.start_again().await;
    assert!(
        driver.log_text().contains("no project quota"),
        "{}",
        driver.log_text()
    );
    let required = [("pool", "disk"), ("requireEnforcement", "true")];
    let status = expect_code(
        driver
            .controller()
            .create_volume(in_pool(&required, 16 * MIB))
            .await,
        Code::ResourceExhausted,
    );
    assert!(
        status.message().contains("\"disk\""),
        "{}",
        status.message()
    );
    assert_eq!(driver.available_capacity(&required, snw_mount()).await, 0);
    // Without the requirement the pool serves, sizes measured but not enforced.
    driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
}

#[tokio::test]
async fn project_enforcement_on_a_filesystem_without_quota_stops_the_driver() {
    let fs = ext4();
    let mut driver = driver_on(&fs, Some("project"));
    let status = driver.try_start_again().await.unwrap_err();
    assert!(!status.success());
    assert!(
        driver.log_text().contains("prjquota"),
        "{}",
        driver.log_text()
    );
}

#[tokio::test]
async fn project_quotas_enforce_sizes_where_the_kernel_supports_them() {
    let fs = match ScratchFs::new("xfs", FS_SIZE, &["-q"], "prjquota") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("SKIPPED: this kernel has no XFS project-quota support ({why})");
            return;
        }
    };
    let mut driver = driver_on(&fs, Some("project"));
    driver.start_again().await;
    let full = driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
    let neighbour = driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
    let target = driver.publish_at_new_target(&full, snw_mount()).await;
    let other = driver.publish_at_new_target(&neighbour, snw_mount()).await;

    let mut file = File::create(target.join("big")).unwrap();
    let chunk = pattern(MIB as usize, 3);
    let mut written = 0;
    let err = loop {
        match file.write_all(&chunk).and_then(|()| file.sync_data()) {
            Ok(()) => written += MIB,
            Err(err) => break err,
        }
        assert!(written <= 32 * MIB, "32 MiB fit in a 16 MiB volume");
    };
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!((12 * MIB..=16 * MIB).contains(&written), "{written}");
    std::fs::write(other.join("small"), pattern(MIB as usize, 4)).unwrap();

    let stats = driver
        .stats(&full.volume_id, &path_str(&target))
        .await
        .unwrap();
    let bytes = usage_of(&stats, Unit::Bytes).unwrap();
    assert_eq!(bytes.total, 16 * MIB);
    assert!(bytes.used >= written, "{bytes:?}");
    assert!(usage_of(&stats, Unit::Inodes).is_some());

    let grown = driver
        .expand(expand_request(&full.volume_id, &target, 32 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(grown, 32 * MIB);
    file.write_all(&chunk)
        .and_then(|()| file.sync_data())
        .unwrap();
    driver.unpublish_ok(&full, &target).await;
    driver.unpublish_ok(&neighbour, &other).await;
    driver.delete(&full.volume_id).await.unwrap();
    driver.delete(&neighbour.volume_id).await.unwrap();
}
