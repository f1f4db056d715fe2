//! Whether a pool's filesystem is full, and saying so. A full filesystem stops what needs new
//! blocks (new volumes, a new journal generation), not what frees them (see `journal`).

use tracing::error;

use super::pool::Pool;
use crate::volume::Volumes;

/// Below this much free space a pool counts as full: less than one journal generation, so the
/// journal cannot rotate on the data dir's filesystem.
pub const FULL_BELOW_BYTES: u64 = 4 << 20;

impl Pool {
    pub fn is_full(&self) -> crate::error::Result<bool> {
        Ok(self.space()?.available_bytes < FULL_BELOW_BYTES)
    }
}

impl Volumes {
    /// Logs an error for every pool found full at start, with what to do about it.
    pub(in crate::volume) fn report_full_pools(&self) {
        for pool in self.pools().iter().filter(|p| p.is_full().unwrap_or(false)) {
            error!(pool = %pool.name, filesystem = %pool.root.display(), "the filesystem of pool {} ({}) is full: new volumes are refused with RESOURCE_EXHAUSTED{}. Free space there: delete volumes (DeleteVolume, `stickyvol volume delete`) or files a tenant wrote in a volume without size enforcement; the driver recovers by itself", pool.name, pool.root.display(), if pool.name == self.default_pool().name { ", and record changes only fit in the space the state journal reserved" } else { "" });
        }
    }
}
