//! Where data lives and how much: pools (a directory on some filesystem each, the data dir
//! being "default"), the books of what each pool promised its volumes (`accounting`), how a
//! volume's size is enforced and measured (`limits`), the capacity rules a request must meet,
//! the throttle that keeps tree walks from piling up, whether a pool is full, how it copies
//! cheaply (`mechanism`), the book of project-id audits (`audit`), and the book of volumes
//! measured above their size (`overflows`). Uses `state`.

pub mod accounting;
pub mod audit;
pub mod capacity;
pub mod full;
pub mod limits;
pub mod mechanism;
pub mod overflows;
pub mod pool;
pub mod throttle;

use std::fs;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Sets the mode of a pool directory or of a volume directory being made.
fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .context(|| format!("setting mode {mode:o} on {}", path.display()))
}
