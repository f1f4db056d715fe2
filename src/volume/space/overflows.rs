//! The book of overflows: directory volumes NodeGetVolumeStats measured above their size,
//! kept until the overflow check (`volume::overflow`) next takes them. In memory only: after a
//! restart the check's own round measures again.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::volume::state::id::VolumeId;

/// Volumes NodeGetVolumeStats found above their size since the check last looked.
#[derive(Debug, Default)]
pub struct Noticed {
    ids: Mutex<HashSet<VolumeId>>,
}

impl Noticed {
    pub fn add(&self, id: &VolumeId) {
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
    }

    pub fn take(&self) -> HashSet<VolumeId> {
        std::mem::take(&mut *self.ids.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
