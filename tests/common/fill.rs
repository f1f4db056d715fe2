//! A pod's part in a full filesystem: writing until not even 4 KiB more fits.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use super::{MIB, pattern};

/// Writes into `path` (the pod's side of a volume) until the filesystem refuses even 4 KiB:
/// big chunks first, then small ones, each synced so that delayed allocation cannot hide room.
pub fn fill_to_the_last_block(path: &Path) -> u64 {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut written = 0u64;
    for chunk in [MIB as usize, 64 << 10, 4 << 10] {
        let data = pattern(chunk, 3);
        // Twice: btrfs may give back reserved metadata space after a sync.
        for _ in 0..2 {
            loop {
                match file.write_all(&data).and_then(|()| file.sync_data()) {
                    Ok(()) => written += chunk as u64,
                    Err(err) => {
                        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
                        break;
                    }
                }
            }
        }
    }
    written
}
