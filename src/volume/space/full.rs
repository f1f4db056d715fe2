//! Whether a pool's filesystem is full, and saying so. A full filesystem stops what needs new
//! blocks (new volumes, a new journal generation), not what frees them (see `journal`).

use super::pool::Pool;

/// Below this much free space a pool counts as full: less than one journal generation, so the
/// journal cannot rotate on the data dir's filesystem.
pub const FULL_BELOW_BYTES: u64 = 4 << 20;

impl Pool {
    pub fn is_full(&self) -> crate::error::Result<bool> {
        Ok(self.space()?.available_bytes < FULL_BELOW_BYTES)
    }
}
