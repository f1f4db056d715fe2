//! The stream's SHA-256, computed on a helper thread fed with copies of the bytes that pass,
//! so that hashing (the costliest per-byte work, ~1.5 GB/s with SHA-NI) overlaps reading and
//! writing instead of stalling the pipe between an export and an import. Memory stays bounded:
//! a few batches in flight, and the sender waits while the helper is behind.

use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};
use std::thread::{self, JoinHandle};

use sha2::{Digest, Sha256};

/// Bytes handed to the helper at a time.
const BATCH: usize = 512 << 10;
/// Batches queued for the helper before `update` waits.
const QUEUED: usize = 4;

pub(super) struct StreamHash {
    /// Bytes not yet handed over.
    pending: Vec<u8>,
    /// None where no thread could be started: then `inline` hashes on the caller's thread.
    helper: Option<Helper>,
    inline: Sha256,
}

struct Helper {
    batches: SyncSender<Vec<u8>>,
    /// Batches hashed, for reuse.
    returned: Receiver<Vec<u8>>,
    done: JoinHandle<Sha256>,
}

impl StreamHash {
    pub(super) fn new() -> Self {
        let (batches, to_hash) = sync_channel::<Vec<u8>>(QUEUED);
        let (give_back, returned) = channel();
        let spawned = thread::Builder::new()
            .name("stream-sha256".into())
            .spawn(move || {
                let mut sha = Sha256::new();
                for batch in to_hash {
                    sha.update(&batch);
                    // The receiver is gone once the stream ends.
                    let _ = give_back.send(batch);
                }
                sha
            });
        StreamHash {
            pending: Vec::new(),
            helper: spawned.ok().map(|done| Helper {
                batches,
                returned,
                done,
            }),
            inline: Sha256::new(),
        }
    }

    pub(super) fn update(&mut self, bytes: &[u8]) {
        let Some(helper) = &self.helper else {
            self.inline.update(bytes);
            return;
        };
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= BATCH {
            let empty = match helper.returned.try_recv() {
                Ok(mut batch) => {
                    batch.clear();
                    batch
                }
                Err(_) => Vec::with_capacity(BATCH),
            };
            let full = std::mem::replace(&mut self.pending, empty);
            helper
                .batches
                .send(full)
                .expect("the hashing thread runs until the hash is finished");
        }
    }

    /// The digest of everything given so far. Call once: the hash is finished.
    pub(super) fn finish(&mut self) -> [u8; 32] {
        let Some(helper) = self.helper.take() else {
            return std::mem::take(&mut self.inline).finalize().into();
        };
        let last = std::mem::take(&mut self.pending);
        helper
            .batches
            .send(last)
            .expect("the hashing thread runs until the hash is finished");
        drop(helper.batches);
        let sha = helper
            .done
            .join()
            .expect("the hashing thread does not panic");
        sha.finalize().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_sha256_of_all_updates() {
        let bytes: Vec<u8> = (0..3 * BATCH + 12345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut hash = StreamHash::new();
        assert!(hash.helper.is_some());
        for piece in bytes.chunks(100_003).chain([&b""[..], b"x"]) {
            hash.update(piece);
        }
        let mut expected = Sha256::new();
        expected.update(&bytes);
        expected.update(b"x");
        assert_eq!(hash.finish(), <[u8; 32]>::from(expected.finalize()));
        assert_eq!(
            StreamHash::new().finish(),
            <[u8; 32]>::from(Sha256::digest(b""))
        );
    }
}
