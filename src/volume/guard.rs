//! Per-volume operation guard: at most one operation per volume (or per name) at a time.
//!
//! A second operation on the same key gets ABORTED ("operation pending"), as the CSI spec asks;
//! operations on different keys never wait for each other. The lock is held only to edit the
//! set, never around host work.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

#[derive(Debug, Default, Clone)]
pub struct OperationGuards {
    in_flight: Arc<Mutex<HashSet<String>>>,
}

/// Held for the duration of one operation; releases its key when dropped, even on panic.
#[derive(Debug)]
pub struct OperationGuard {
    in_flight: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl OperationGuards {
    /// Claims `key` or fails with `Error::Pending` naming `what`.
    pub fn acquire(&self, key: String, what: &str) -> Result<OperationGuard> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if !in_flight.insert(key.clone()) {
            return Err(Error::Pending(what.to_string()));
        }
        Ok(OperationGuard {
            in_flight: self.in_flight.clone(),
            key,
        })
    }
}

impl Drop for OperationGuard {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        in_flight.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_claim_is_pending_until_the_first_is_dropped() {
        let guards = OperationGuards::default();
        let first = guards.acquire("volume:a".into(), "volume a").unwrap();
        let err = guards.acquire("volume:a".into(), "volume a").unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        let _other = guards.acquire("volume:b".into(), "volume b").unwrap();
        drop(first);
        guards.acquire("volume:a".into(), "volume a").unwrap();
    }
}
