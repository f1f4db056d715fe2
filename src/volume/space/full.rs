//! Whether a pool's filesystem is full, and saying so. A full filesystem stops what needs new
//! blocks (new volumes, a new journal generation), not what frees them (see `journal`).

use super::pool::Pool;
use crate::volume::state::id::VolumeId;

/// Below this much free space a pool counts as full: less than one journal generation, so the
/// journal cannot rotate on the data dir's filesystem.
pub const FULL_BELOW_BYTES: u64 = 4 << 20;

impl Pool {
    pub fn is_full(&self) -> crate::error::Result<bool> {
        Ok(self.space()?.available_bytes < FULL_BELOW_BYTES)
    }

    /// Why the writes of volume `id`, whose file (image or block) has `allocated` of its
    /// `length` bytes, fail, if its pool is full: a thin file gets its blocks as it is written,
    /// and a full pool has none to give (ENOSPC in the pod, a filesystem's unwritten extents
    /// lost). None while the pool has room, or the file holds all its blocks already.
    pub fn starves(&self, id: &VolumeId, allocated: u64, length: u64) -> Option<String> {
        if allocated >= length || !self.is_full().unwrap_or(false) {
            return None;
        }
        self.starved_while_full(id, allocated, length)
    }

    /// `starves` on a pool already known to be full.
    pub fn starved_while_full(&self, id: &VolumeId, allocated: u64, length: u64) -> Option<String> {
        if allocated >= length {
            return None;
        }
        Some(format!(
            "the filesystem of pool {} is full and volume {id} holds {allocated} of its {length} bytes: writes to the rest fail with ENOSPC until space is freed in the pool (see the pool's free space in `stickyvol volumes` and the StickyvolPoolFilesystemFull alert)",
            self.name
        ))
    }
}
