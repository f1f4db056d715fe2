//! Thin file volumes (block and image) on a pool whose filesystem is full: the blocks they have
//! not written yet cannot be had, so their pods' next writes there fail (ENOSPC, or an image
//! filesystem's unwritten extents lost). NodeGetVolumeStats and ControllerGetVolume already say
//! so per volume (`Pool::starves`); this lists them all at once, for the loop that puts an Event
//! on each one's claim (`cluster::node::pool_full`) and for the metrics.
//!
//! Cheap: one statvfs per pool, and an lstat per file volume only on a pool that is full (the
//! metrics, which read each pool's space anyway, ask `starved_in` of the full ones only).

use super::Volumes;
use super::overflow::{ClaimRef, claim_of};
use super::space::pool::Pool;
use super::state::id::VolumeId;
use crate::host::fsstat;

/// A volume whose writes fail because its pool is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Starved {
    pub id: VolumeId,
    pub pool: String,
    /// None when the record's parameters do not name a valid one.
    pub claim: Option<ClaimRef>,
    /// What the volume's condition says.
    pub message: String,
}

impl Volumes {
    /// Every volume of this node whose pool's filesystem is full and whose file still lacks
    /// blocks, in id order.
    pub fn starved(&self) -> Vec<Starved> {
        let mut starved: Vec<Starved> = self
            .pools()
            .iter()
            .filter(|pool| pool.is_full().unwrap_or(false))
            .flat_map(|pool| self.starved_in(pool))
            .collect();
        starved.sort_by(|a, b| a.id.cmp(&b.id));
        starved
    }

    /// The volumes of `pool`, which the caller found full, whose files still lack blocks.
    pub fn starved_in(&self, pool: &Pool) -> Vec<Starved> {
        self.store
            .all()
            .iter()
            .filter(|record| record.kind.is_file() && record.pool == pool.name)
            .filter_map(|record| {
                let path = pool.data_path(&record.id, record.kind);
                let file = fsstat::lstat(&path).ok()?;
                let message = pool.starved_while_full(&record.id, file.allocated, file.size)?;
                Some(Starved {
                    id: record.id.clone(),
                    pool: record.pool.clone(),
                    claim: claim_of(record),
                    message,
                })
            })
            .collect()
    }
}
