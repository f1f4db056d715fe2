//! A CreateVolume whose record the state journal could not read back (its frame over the
//! reader's limit) must be refused before anything is written: once acknowledged, the reader
//! would take it, and every later entry, for a torn tail at the next start.

mod common;

use common::*;
use tonic::Code;

#[tokio::test]
async fn a_parameter_map_too_big_for_the_journal_is_refused_and_nothing_is_lost() {
    let mut driver = TestDriver::start().await;
    let before = driver.create_fs_volume().await;
    // 3.5 MiB fits a gRPC message; JSON escapes each control character to 6 bytes, so the
    // record would be ~21 MiB.
    let huge = "\u{1}".repeat(3 << 20 | 512 << 10);
    let request = csi::CreateVolumeRequest {
        parameters: params(&[("csi.storage.k8s.io/pv/name", &huge)]),
        ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), MIB)
    };
    let refused = driver.controller().create_volume(request).await;
    expect_code(refused, Code::InvalidArgument);
    assert_eq!(
        driver.data_entries().len(),
        1,
        "{:?}",
        driver.data_entries()
    );
    let after = driver.create_fs_volume().await;

    let mut expected = vec![before.volume_id, after.volume_id];
    expected.sort();
    driver.kill9_and_restart().await;
    assert_eq!(driver.listed_ids().await, expected);
}
