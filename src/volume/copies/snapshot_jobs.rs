//! Copying a snapshot's data, in the background when it takes a while.
//!
//! A btrfs snapshot or a reflink of one image takes milliseconds; a copy of a big volume can
//! take minutes, longer than a CSI call should be held. So every copy runs on a thread of its
//! own: CreateSnapshot waits for it a short moment and otherwise answers "not ready", and
//! csi-snapshotter calls again until it is. A copy that failed reports its error to the next
//! CreateSnapshot call, and the call after that starts it over with the same id: the id the CO
//! holds never changes. DeleteSnapshot cancels a running copy.
//!
//! Attempts are limited: each is counted in the snapshot's record (one journal commit, flushed)
//! before it starts, so one that takes the driver down with it (out of memory on a tree a pod
//! shaped) counts too. After [`MAX_COPY_ATTEMPTS`] the snapshot stays not ready and every
//! CreateSnapshot answers FAILED_PRECONDITION saying why, instead of another run; deleting it
//! still works. Copies a restart interrupted are resumed after the socket serves
//! (`resume_snapshot_copies`), never on the way to it.
//!
//! Each copy holds its snapshot's operation slot and the source volume's "being read" slot, so
//! neither can be deleted under it.

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::cow;
use super::snapshot::{SnapshotRecord, remove_snapshot_data};
use crate::error::{Error, IoContext, Result};
use crate::host::copy::Progress;
use crate::volume::Volumes;
use crate::volume::guard::OperationGuard;
use crate::volume::space::pool::EXPORT_PREFIX;
use crate::volume::space::pool::STAGING_PREFIX;
use crate::volume::space::pool::id_of_snapshot_entry;
use crate::volume::state::id::{SnapshotId, VolumeId};
use crate::volume::state::store::sync_dir;

/// How long CreateSnapshot waits for a copy before answering "not ready".
const READY_WAIT: Duration = Duration::from_secs(1);
/// Copies of one snapshot started before it stops with an error (see the module comment).
pub const MAX_COPY_ATTEMPTS: u32 = 3;
/// How long DeleteSnapshot waits for a cancelled copy to stop (it checks between files and
/// every few MiB).
const CANCEL_WAIT: Duration = Duration::from_secs(20);

/// Copies running (or failed and not yet reported), by snapshot.
#[derive(Debug, Default)]
pub(in crate::volume) struct Jobs {
    by_snapshot: Mutex<HashMap<SnapshotId, Arc<Job>>>,
}

#[derive(Debug, Default)]
struct Job {
    cancel: AtomicBool,
    outcome: Mutex<Option<Result<()>>>,
    finished: Condvar,
}

impl Job {
    /// Waits up to `timeout` for the copy to end; `None` while it still runs. The outcome
    /// stays for other waiters: errors are duplicated.
    fn wait(&self, timeout: Duration) -> Option<Result<()>> {
        let deadline = Instant::now() + timeout;
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(done) = outcome.as_ref() {
                return Some(done.as_ref().map(|_| ()).map_err(Error::duplicate));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            outcome = self
                .finished
                .wait_timeout(outcome, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn finish(&self, result: Result<()>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        self.finished.notify_all();
    }
}

/// Stops a copy when its job is cancelled.
struct Cancellation<'a>(&'a AtomicBool);

impl Progress for Cancellation<'_> {
    fn keep_going(&mut self, _: &crate::host::copy::CopyReport) -> bool {
        !self.0.load(Ordering::Relaxed)
    }
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, HashMap<SnapshotId, Arc<Job>>> {
        self.by_snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Volumes {
    /// The snapshot as it stands after waiting a moment for its copy (started if none runs).
    pub(in crate::volume) fn finish_snapshot(
        self: &Arc<Self>,
        record: &Arc<SnapshotRecord>,
    ) -> Result<Arc<SnapshotRecord>> {
        if record.ready {
            return Ok(record.clone());
        }
        let job = self.start_copy(record)?;
        match job.wait(READY_WAIT) {
            None => Ok(record.clone()),
            Some(Ok(())) => Ok(self.snapshots.get(&record.id).unwrap_or(record.clone())),
            Some(Err(err)) => {
                // Reported once; the next call starts the copy over.
                self.jobs.lock().remove(&record.id);
                Err(err)
            }
        }
    }

    /// The running (or failed, unreported) copy of `record`, or a new one.
    fn start_copy(self: &Arc<Self>, record: &Arc<SnapshotRecord>) -> Result<Arc<Job>> {
        let mut jobs = self.jobs.lock();
        if let Some(job) = jobs.get(&record.id) {
            return Ok(job.clone());
        }
        let slot = self.claim_snapshot(&record.id)?;
        // The index's record, not the caller's: an attempt may have ended since it was read.
        let record = &self
            .snapshots
            .get(&record.id)
            .ok_or_else(|| Error::NotFound(format!("snapshot {} was deleted", record.id)))?;
        if let Some(why) = record.copy_stopped() {
            return Err(Error::FailedPrecondition(why));
        }
        let reading = self.claim_reading(&record.source_volume)?;
        let job = Arc::new(Job::default());
        jobs.insert(record.id.clone(), job.clone());
        drop(jobs);
        let volumes = self.clone();
        let record = record.clone();
        let worker = job.clone();
        let spawned = std::thread::Builder::new()
            .name("snapshot-copy".into())
            .spawn(move || volumes.run_copy(&record, &worker, (slot, reading)));
        if let Err(err) = spawned {
            let err = Error::host("starting a snapshot copy thread", err);
            job.finish(Err(err.duplicate()));
            return Err(err);
        }
        Ok(job)
    }

    fn run_copy(
        &self,
        record: &SnapshotRecord,
        job: &Job,
        slots: (OperationGuard, OperationGuard),
    ) {
        let started = Instant::now();
        let result = self.count_attempt(record).and_then(|counted| {
            self.copy_snapshot(&counted, &job.cancel)
                .map_err(|err| self.note_failed_attempt(&counted, err, &job.cancel))
        });
        drop(slots);
        match &result {
            Ok(()) => {
                info!(snapshot = %record.id, elapsed_ms = started.elapsed().as_millis() as u64, "snapshot ready");
                self.jobs.lock().remove(&record.id);
            }
            Err(err) => {
                error!(snapshot = %record.id, error = %err, "copying the snapshot's data failed; the next CreateSnapshot call reports it and the one after starts over, unless its attempts ran out")
            }
        }
        job.finish(result);
    }

    /// Durably counts one more attempt at copying `record` before it starts.
    fn count_attempt(&self, record: &SnapshotRecord) -> Result<SnapshotRecord> {
        let counted = SnapshotRecord {
            copy_attempts: record.copy_attempts.saturating_add(1),
            // An earlier attempt's reason, unless this one fails too.
            copy_error: None,
            ..record.clone()
        };
        self.snapshots
            .put(Arc::new(counted.clone()))
            .context(|| format!("writing the record of snapshot {}", record.id))?;
        Ok(counted)
    }

    /// Records why an attempt failed (for `stickyvol volume show` and later calls) and turns
    /// the last allowed attempt's error into the one the snapshot stops with.
    fn note_failed_attempt(
        &self,
        counted: &SnapshotRecord,
        err: Error,
        cancel: &AtomicBool,
    ) -> Error {
        if cancel.load(Ordering::Relaxed) {
            // DeleteSnapshot is removing it: nothing to remember.
            return err;
        }
        let failed = SnapshotRecord {
            copy_error: Some(err.to_string()),
            ..counted.clone()
        };
        if let Err(write) = self.snapshots.put(Arc::new(failed.clone())) {
            warn!(snapshot = %counted.id, error = %write, "could not record why the snapshot copy failed");
        }
        match failed.copy_stopped() {
            Some(why) => Error::FailedPrecondition(why),
            None => err,
        }
    }

    /// Copies the source's data to the snapshot's staging path, flushes it, moves it into
    /// place and marks the record ready.
    fn copy_snapshot(&self, record: &SnapshotRecord, cancel: &AtomicBool) -> Result<()> {
        let id = &record.id;
        let pool = self.pool(&record.pool)?;
        let staging = pool.snapshot_staging_path(id, record.kind);
        let path = pool.snapshot_path(id, record.kind);
        // Leftovers of an earlier attempt (a crash, a failure).
        for leftover in [&staging, &path] {
            remove_snapshot_data(leftover)
                .map_err(|err| Error::walk_at(leftover, "removing", err))?;
        }
        let source = self.store.get(&record.source_volume).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "volume {} was deleted before its snapshot {id} was copied; delete the snapshot",
                record.source_volume
            ))
        })?;
        let source_path = self.data_path(&source)?;
        // A staged image's filesystem is frozen while its file is copied (a reflink where the
        // pool has them: an instant), so the copy mounts as after a crash, never torn; the pool
        // is flushed once it is thawed, so that its writers never wait for that.
        let copied = self
            .with_frozen(&source, || {
                cow::snapshot_unflushed(
                    pool,
                    record.kind,
                    &source_path,
                    &staging,
                    &mut Cancellation(cancel),
                )
            })
            .and_then(|copied| cow::sync_copy(&staging).map(|()| copied))
            .inspect_err(|_| {
            if let Err(err) = remove_snapshot_data(&staging) {
                warn!(snapshot = %id, error = %err, "could not remove a failed copy; it is removed at next start");
            }
        })?;
        fs::rename(&staging, &path)
            .context(|| format!("moving {} into place", staging.display()))?;
        // A ready record must never point at data still under its staging name.
        sync_dir(&pool.snapshots).context(|| format!("syncing {}", pool.snapshots.display()))?;
        let data_bytes = copied.data_bytes;
        let ready = SnapshotRecord {
            mechanism: copied.mechanism,
            data_bytes,
            exclusive_bytes: copied.copied_bytes,
            ready: true,
            // Only a pending copy's attempts matter.
            copy_attempts: 0,
            copy_error: None,
            ..record.clone()
        };
        let ready = Arc::new(ready);
        self.snapshots
            .put(ready.clone())
            .context(|| format!("writing the record of snapshot {id}"))?;
        pool.restore(id, data_bytes);
        pool.set_used(id, copied.copied_bytes);
        Ok(())
    }

    /// Cancels the copy of snapshot `id` if one runs and waits for it to stop.
    pub(in crate::volume) fn cancel_snapshot_copy(&self, id: &SnapshotId) -> Result<()> {
        let Some(job) = self.jobs.lock().get(id).cloned() else {
            return Ok(());
        };
        job.cancel.store(true, Ordering::Relaxed);
        if job.wait(CANCEL_WAIT).is_none() {
            return Err(Error::Pending(format!(
                "snapshot {id} (its copy is being cancelled)"
            )));
        }
        self.jobs.lock().remove(id);
        Ok(())
    }

    /// Claims "volume `id` is being read" (a copy from it runs), beside other copies of it;
    /// `claim_unread` (DeleteVolume) waits for them all.
    pub(in crate::volume) fn claim_reading(&self, id: &VolumeId) -> Result<OperationGuard> {
        self.guards
            .acquire_shared(reading_key(id), &format!("volume {id} (being deleted)"))
    }

    /// Claims "nothing reads volume `id`", for as long as it is being deleted.
    pub(in crate::volume) fn claim_unread(&self, id: &VolumeId) -> Result<OperationGuard> {
        self.guards.acquire(
            reading_key(id),
            &format!("volume {id} (a copy of its data is being made)"),
        )
    }

    /// At start: removes staging copies without a record (those of unfinished snapshots are
    /// their next attempt's to remove), moves snapshot data without a record aside, and puts
    /// every snapshot's promise in its pool's books. Copies to redo are started by
    /// `resume_snapshot_copies` once the socket serves.
    pub(in crate::volume) fn recover_snapshots(
        &self,
        unreadable: &[(SnapshotId, String)],
        removed_recently: &std::collections::HashSet<SnapshotId>,
    ) -> Result<()> {
        for (id, why) in unreadable {
            error!(snapshot = %id, reason = %why, "snapshot record is unreadable; the snapshot is left untouched until an admin repairs or removes the record");
        }
        for pool in self.pools() {
            let dir = &pool.snapshots;
            for entry in fs::read_dir(dir).context(|| format!("listing {}", dir.display()))? {
                let entry = entry.context(|| format!("listing {}", dir.display()))?;
                let path = entry.path();
                let name = entry.file_name();
                let name = name.to_str().unwrap_or_default();
                if name.starts_with(EXPORT_PREFIX) {
                    match remove_snapshot_data(&path) {
                        Ok(()) => {
                            info!(path = %path.display(), "removed the temporary snapshot of an interrupted export")
                        }
                        Err(err) => {
                            warn!(path = %path.display(), error = %err, "could not remove the temporary snapshot of an interrupted export")
                        }
                    }
                    continue;
                }
                let staged = name.strip_prefix(STAGING_PREFIX);
                let Some(id) = id_of_snapshot_entry(staged.unwrap_or(name)) else {
                    warn!(path = %path.display(), "unknown entry in the snapshots directory; leaving it alone");
                    continue;
                };
                let unfinished = self.snapshots.get(&id).is_some_and(|r| !r.ready);
                if unfinished {
                    // Its next attempt (or its deletion) removes what an earlier one left, off
                    // the way to serving: a walk of a pod's tree can be long, or fail.
                    continue;
                }
                if staged.is_some() {
                    match remove_snapshot_data(&path) {
                        Ok(()) => {
                            info!(snapshot = %id, path = %path.display(), "removed a half-made snapshot copy")
                        }
                        Err(err) => {
                            warn!(snapshot = %id, error = %err, "could not remove a half-made snapshot copy")
                        }
                    }
                } else if removed_recently.contains(&id) {
                    // DeleteSnapshot removed the data, then committed the removal; a power
                    // loss undid the (unflushed) data removal: finish the job.
                    if let Err(err) = remove_snapshot_data(&path) {
                        warn!(snapshot = %id, error = %err, "could not remove the data of a deleted snapshot");
                    }
                } else if !self.snapshots.has_record_file(&id) {
                    self.quarantine(pool, &id, &path)?;
                }
            }
        }
        for record in self.snapshots.all() {
            if let Ok(pool) = self.pool(&record.pool) {
                pool.insert(&record.id, record.data_bytes, record.exclusive_bytes);
            }
        }
        Ok(())
    }

    /// Starts over the copies a crash interrupted, unless they ran out of attempts. Called
    /// once the socket serves: a copy that kills the driver must not keep it from serving.
    pub fn resume_snapshot_copies(self: &Arc<Self>) {
        for record in self.snapshots.all() {
            if record.ready || self.pool(&record.pool).is_err() {
                continue;
            }
            if let Some(why) = record.copy_stopped() {
                error!(snapshot = %record.id, reason = %why, "not restarting the snapshot copy");
                continue;
            }
            info!(snapshot = %record.id, "restarting a snapshot copy interrupted by a restart");
            if let Err(err) = self.start_copy(&record) {
                warn!(snapshot = %record.id, error = %err, "cannot restart the snapshot copy; the next CreateSnapshot call retries");
            }
        }
    }
}

impl SnapshotRecord {
    /// Why no more copies of this snapshot are made, once its attempts ran out.
    pub fn copy_stopped(&self) -> Option<String> {
        if self.ready || self.copy_attempts < MAX_COPY_ATTEMPTS {
            return None;
        }
        let last = match &self.copy_error {
            Some(err) => format!("the last one failed: {err}"),
            None => "the driver stopped during the last one (killed out of memory?)".to_string(),
        };
        Some(format!(
            "copying the data of snapshot {} was tried {} times and stopped; {last}. Delete the snapshot",
            self.id, self.copy_attempts
        ))
    }
}

fn reading_key(id: &VolumeId) -> String {
    format!("reading:{id}")
}
