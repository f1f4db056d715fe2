//! Per-volume operation guard: at most one operation per volume (or per name) at a time.
//!
//! A second operation on the same key gets ABORTED ("operation pending"), as the CSI spec asks;
//! operations on different keys never wait for each other. A key may also be held *shared*,
//! by any number of readers at once (copies of one volume or snapshot), which keeps exclusive
//! holders (its deletion) out. The lock is held only to edit the map, never around host work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// Who holds a key: one exclusive holder, or this many shared ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holders {
    Exclusive,
    Shared(usize),
}

#[derive(Debug, Default, Clone)]
pub struct OperationGuards {
    in_flight: Arc<Mutex<HashMap<String, Holders>>>,
}

/// Held for the duration of one operation; releases its key when dropped, even on panic.
#[derive(Debug)]
pub struct OperationGuard {
    in_flight: Arc<Mutex<HashMap<String, Holders>>>,
    key: String,
}

impl OperationGuards {
    /// Claims `key` alone or fails with `Error::Pending` naming `what`.
    pub fn acquire(&self, key: String, what: &str) -> Result<OperationGuard> {
        self.claim(key, what, Holders::Exclusive)
    }

    /// Claims `key` beside other shared holders, or fails with `Error::Pending` while it is
    /// held alone.
    pub fn acquire_shared(&self, key: String, what: &str) -> Result<OperationGuard> {
        self.claim(key, what, Holders::Shared(1))
    }

    fn claim(&self, key: String, what: &str, wanted: Holders) -> Result<OperationGuard> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let now = match (in_flight.get(&key), wanted) {
            (None, wanted) => wanted,
            (Some(Holders::Shared(n)), Holders::Shared(_)) => Holders::Shared(n + 1),
            _ => return Err(Error::Pending(what.to_string())),
        };
        in_flight.insert(key.clone(), now);
        Ok(OperationGuard {
            in_flight: self.in_flight.clone(),
            key,
        })
    }
}

impl Drop for OperationGuard {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        match in_flight.get(&self.key).copied() {
            Some(Holders::Shared(n)) if n > 1 => {
                in_flight.insert(self.key.clone(), Holders::Shared(n - 1));
            }
            _ => {
                in_flight.remove(&self.key);
            }
        }
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

    #[test]
    fn shared_holders_keep_an_exclusive_one_out_until_the_last_leaves() {
        let guards = OperationGuards::default();
        let key = || "reading:a".to_string();
        let first = guards.acquire_shared(key(), "a").unwrap();
        let second = guards.acquire_shared(key(), "a").unwrap();
        assert!(guards.acquire(key(), "a").is_err());
        drop(first);
        assert!(guards.acquire(key(), "a").is_err());
        drop(second);
        let alone = guards.acquire(key(), "a").unwrap();
        assert!(guards.acquire_shared(key(), "a").is_err());
        drop(alone);
        guards.acquire_shared(key(), "a").unwrap();
    }
}
