//! An append-only journal of record changes: the commit point of every durable record change
//! (see `records`), at one disk flush per change, shared between concurrent callers.
//!
//! Files: `<state>/journal/<name>.<generation>`, one generation written to at a time, each
//! filled with zeros before its first commit so that a commit's flush writes data alone (the
//! format, and how a torn tail is told from damage: `journal_file`).
//!
//! **Group commit.** An entry is appended under the journal's lock, then its caller waits until
//! a flush (`fdatasync`) that started after its append has finished. One caller at a time
//! flushes (the leader, lock released while it flushes); entries appended meanwhile share the
//! next flush, so N concurrent commits cost far fewer than N flushes. `append` (without
//! waiting) also wakes a flusher thread, so that the flush runs while its caller goes on with
//! its own work (a delete removing the volume's data) instead of after it.
//!
//! **Compaction.** A commit writes nothing but its entry: the record files beside the journal
//! are written back later, by compaction, so a create or delete costs one append and one
//! flush and allocates no inode in the state directory. When the current generation passes
//! `max_bytes`, or holds an entry older than `max_age`, a background thread rotates to a new
//! generation and then, for the old one:
//! 1. creates the new generation's file and fsyncs the journal directory *before* any commit
//!    goes there — else a power loss could drop the new file's directory entry, and with it
//!    commits already acknowledged;
//! 2. writes back the newest entry of every record the old generation changed (`WriteBack`:
//!    a record file written or removed, without flush), then flushes the state's filesystem
//!    (syncfs), which makes those files and every rename or unlink in the state directory
//!    durable, and runs the barrier (syncfs of every pool, so the data of volumes created or
//!    deleted in the old generation is durable too) — else dropping the journal could leave a
//!    record file missing, stale or resurrected after a power loss, with no journal left to
//!    correct it;
//! 3. only then deletes the old generation and fsyncs the journal directory — else a power loss
//!    could bring back an old generation with no newer one to override it (a stale replay).
//!
//! A crash between any two steps leaves old generations on disk: they are replayed again (in
//! generation order, over the record files), which is harmless because replay is idempotent
//! and the last entry of a record always wins.
//!
//! **Load.** Every generation is read in order. A torn tail (the remains of commits whose
//! flush never completed, so never acknowledged) is ignored with a warning. Damage to an entry
//! that was acknowledged refuses to open the journal: skipping it could resurrect a deleted
//! volume or lose a created one, and later entries may depend on it. An admin must look (see
//! the error).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::files::{remove_file_if_present, sync_dir};
use super::journal_file::{self as file, Order, generation_path, generations};
pub use file::{Entry, Op, Replay};

/// An entry appended, not yet known durable (see `Journal::append`).
#[derive(Debug)]
#[must_use = "an appended entry is not durable until waited for"]
pub struct Appended {
    sequence: u64,
    /// Until waited for. Dropped unwaited (its caller returned early with an error), it still
    /// releases its hold on the generation: else rotation would wait for it forever.
    journal: Option<Arc<Shared>>,
}

impl Drop for Appended {
    fn drop(&mut self) {
        if let Some(shared) = self.journal.take() {
            shared.lock().unwaited -= 1;
            shared.wake_compactor.notify_one();
        }
    }
}

/// Something to make durable before an old generation is dropped (see the module comment).
pub type Barrier = Arc<dyn Fn() -> io::Result<()> + Send + Sync>;
/// Applies an entry to the record files (step 2 of a compaction), without flushing.
pub type WriteBack = Arc<dyn Fn(&Entry) -> io::Result<()> + Send + Sync>;
/// Called once per flush, while it runs (tests count and slow flushes with it).
pub type FlushHook = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
pub struct Options {
    /// Rotate (and compact the old generation) past this many bytes...
    pub max_bytes: u64,
    /// ...or when the oldest entry of the current generation is this old. This also bounds
    /// how long a create counts as "recent" (see `Replay::created`).
    pub max_age: Duration,
    /// Run compactions in a background thread (tests drive them by hand).
    pub background: bool,
    pub on_flush: Option<FlushHook>,
    /// Runs before an old generation is dropped, after the state's own flush.
    pub barrier: Option<Barrier>,
    /// Where compaction writes the records back (none: the caller keeps its files itself).
    pub write_back: Option<WriteBack>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_bytes: 4 << 20,
            max_age: Duration::from_secs(10),
            background: true,
            on_flush: None,
            barrier: None,
            write_back: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("max_bytes", &self.max_bytes)
            .field("max_age", &self.max_age)
            .field("background", &self.background)
            .finish()
    }
}

#[derive(Debug)]
pub struct Journal {
    shared: Arc<Shared>,
    /// The compactor and the flusher, joined at drop.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct Shared {
    dir: PathBuf,
    name: String,
    /// The directory holding the record files (its filesystem is flushed by compaction).
    records_dir: PathBuf,
    options: Options,
    state: Mutex<State>,
    /// Signals the end of a flush or compaction (to commits and `compact_now`).
    changed: Condvar,
    /// Wakes the background compactor: separate from `changed`, so that a commit's flush
    /// does not wake (and switch to) a compactor with nothing to do.
    wake_compactor: Condvar,
    /// Wakes the background flusher (by `append`, and at drop).
    wake_flusher: Condvar,
    /// What `Journal::health` reads, kept apart from `state`, whose lock a rotation holds
    /// across a directory fsync: Probe must not wait behind that.
    health: Mutex<Health>,
    /// Running totals for `Journal::stats`, also kept apart from `state`.
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    flushes: AtomicU64,
    flush_nanos: AtomicU64,
    compactions: AtomicU64,
    failed_compactions: AtomicU64,
    compaction_nanos: AtomicU64,
    /// Generation files on disk: the current one and those not compacted yet.
    generations: AtomicU64,
}

/// What a journal has done since it was opened, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub name: String,
    /// Entries appended (record changes committed).
    pub commits: u64,
    /// `fdatasync` calls; concurrent commits share one.
    pub flushes: u64,
    pub flush_seconds: f64,
    pub compactions: u64,
    pub failed_compactions: u64,
    /// Time spent compacting, mostly flushing the state's and the pools' filesystems.
    pub compaction_seconds: f64,
    /// Generation files on disk: 1 plus those waiting for compaction; more than 2 for long
    /// means compaction is failing or behind.
    pub generations: u64,
    /// Whether it takes commits (see `Journal::health`).
    pub healthy: bool,
}

struct Health {
    /// A copy of `State::failed`.
    failed: Option<String>,
    /// The current generation's file.
    file: Arc<File>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .field("name", &self.name)
            .finish()
    }
}

/// The newest entry per record id.
type Changes = HashMap<String, Entry>;

/// A generation rotated out and not yet compacted.
struct Old {
    generation: u64,
    unwritten: Changes,
}

struct State {
    file: Arc<File>,
    generation: u64,
    /// Where the next entry goes in the current generation's file.
    size: u64,
    /// The current file's length: entries below it overwrite blocks that exist.
    allocated: u64,
    /// When the current generation got its first entry.
    first_entry_at: Option<Instant>,
    /// Sequence numbers of the last entry appended, and of the last one known durable.
    written: u64,
    durable: u64,
    /// Entries appended whose caller has not waited yet (it is still working: no rotation,
    /// so their generation is compacted only after that work, e.g. a volume's data removal).
    unwaited: usize,
    flushing: bool,
    /// Set by a failed write or flush: what is on disk is unknown, so no commit is accepted
    /// until a restart replays the journal.
    failed: Option<String>,
    /// The last append or new generation failed for want of space (logged once per episode).
    out_of_space: bool,
    /// The newest entry of each record changed in the current generation, to write back.
    unwritten: Changes,
    /// Old generations waiting for compaction, oldest first.
    pending: Vec<Old>,
    compacting: bool,
    closed: bool,
}

impl Journal {
    /// Opens the journal `name` in `dir` (created if missing) for the records in `records_dir`:
    /// reads every generation (cutting off a torn tail), then starts a new generation; the
    /// old ones are compacted in the background.
    pub fn open(
        dir: &Path,
        name: &str,
        records_dir: &Path,
        options: Options,
    ) -> io::Result<(Journal, Replay)> {
        fs::create_dir_all(dir)?;
        let mut generations = generations(dir, name)?;
        let OnDisk {
            replay,
            mut pending,
            newest,
        } = read_generations(dir, name, &generations)?;
        // The newest generation is continued in place: no new file, so a start needs no free
        // block (a full filesystem must not keep the driver down). One with no room left is
        // rotated by the compactor as soon as it can.
        let current = match newest {
            Some((end, unwritten)) => {
                pending.pop();
                let generation = *generations.last().expect("a newest generation");
                Current::continued(dir, name, generation, &end, unwritten)?
            }
            None => {
                let generation = generations.last().map_or(1, |g| g + 1);
                generations.push(generation);
                Current::new_generation(dir, name, generation, options.max_bytes)?
            }
        };
        let first_entry_at = (!current.unwritten.is_empty()).then(Instant::now);
        let unwritten = match options.write_back {
            Some(_) => current.unwritten,
            None => Changes::new(),
        };
        let file = Arc::new(current.file);
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            records_dir: records_dir.to_path_buf(),
            options,
            state: Mutex::new(State {
                file: file.clone(),
                generation: current.generation,
                size: current.size,
                allocated: current.allocated,
                first_entry_at,
                written: current.sequence,
                durable: current.sequence,
                unwaited: 0,
                flushing: false,
                failed: None,
                out_of_space: false,
                unwritten,
                pending,
                compacting: false,
                closed: false,
            }),
            changed: Condvar::new(),
            wake_compactor: Condvar::new(),
            wake_flusher: Condvar::new(),
            health: Mutex::new(Health { failed: None, file }),
            counters: Counters {
                generations: AtomicU64::new(generations.len() as u64),
                ..Counters::default()
            },
        });
        let threads = if shared.options.background {
            start_background(&shared)
        } else {
            Vec::new()
        };
        let journal = Journal {
            shared,
            threads: Mutex::new(threads),
        };
        Ok((journal, replay))
    }

    /// Appends `entry` and returns once it is durable (group commit: see the module comment).
    pub fn commit(&self, entry: Entry) -> io::Result<()> {
        let appended = self.append_entry(entry)?;
        self.wait(appended)
    }

    /// Appends `entry` and has it flushed in the background, so the caller can overlap its own
    /// work with the flush before it `wait`s. From here on the entry is committed: the next
    /// flush, the flusher's or anyone's, makes it durable.
    pub fn append(&self, entry: Entry) -> io::Result<Appended> {
        let appended = self.append_entry(entry)?;
        self.shared.wake_flusher.notify_one();
        Ok(appended)
    }

    /// Writes `entry`'s frame.
    fn append_entry(&self, entry: Entry) -> io::Result<Appended> {
        file::check_size(&entry)?;
        let shared = &*self.shared;
        let mut state = shared.lock();
        if let Some(why) = &state.failed {
            return Err(failed(why));
        }
        let order = Order {
            sequence: state.written + 1,
            durable: state.durable,
        };
        let frame = file::frame(&entry, order);
        if let Err(err) = file::write_frame(&state.file, state.size, &frame) {
            if is_out_of_space(&err) && shared.undo_partial_frame(&state, frame.len()).is_ok() {
                // Nothing was appended: the journal goes on, this change is refused.
                shared.note_out_of_space(&mut state, "appending to");
                return Err(shared.out_of_space(&err));
            }
            // A partial frame is a torn tail at the next start: nothing may follow it.
            shared.fail(&mut state, format!("appending to the journal: {err}"));
            shared.changed.notify_all();
            return Err(err);
        }
        state.size += frame.len() as u64;
        state.allocated = state.allocated.max(state.size);
        if std::mem::take(&mut state.out_of_space) {
            info!(journal = %shared.name, "the journal has space again");
        }
        state.first_entry_at.get_or_insert_with(Instant::now);
        if shared.options.write_back.is_some() {
            state.unwritten.insert(entry.id.clone(), entry);
        }
        state.written += 1;
        state.unwaited += 1;
        shared.counters.commits.fetch_add(1, Ordering::Relaxed);
        Ok(Appended {
            sequence: state.written,
            journal: Some(self.shared.clone()),
        })
    }

    /// Returns once the entry `appended` is durable.
    pub fn wait(&self, mut appended: Appended) -> io::Result<()> {
        // Counted out here, not by its drop.
        appended.journal = None;
        let shared = &*self.shared;
        let mut state = shared.lock();
        state.unwaited -= 1;
        let mine = appended.sequence;
        loop {
            if state.durable >= mine {
                break;
            }
            if let Some(why) = &state.failed {
                return Err(failed(why));
            }
            state = match state.flushing {
                true => shared.wait(state),
                false => shared.flush(state),
            };
        }
        if state.size >= shared.options.max_bytes {
            shared.wake_compactor.notify_one();
        }
        Ok(())
    }

    /// Why the journal cannot take commits, if it cannot: an earlier write or flush failed
    /// (only a restart, replaying the journal, clears that), or its file can no longer be read
    /// (ext4 and XFS refuse every read once shut down after I/O errors). The one-byte read
    /// hits the page cache: no disk I/O.
    pub fn health(&self) -> Result<(), String> {
        let health = self.shared.lock_health();
        if let Some(why) = &health.failed {
            return Err(why.clone());
        }
        let file = health.file.clone();
        drop(health);
        file.read_at(&mut [0u8; 1], 0)
            .map(drop)
            .map_err(|err| format!("reading the journal: {err}"))
    }

    /// How many flushes commits have made so far.
    pub fn flushes(&self) -> u64 {
        self.shared.counters.flushes.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> Stats {
        let counters = &self.shared.counters;
        let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            name: self.shared.name.clone(),
            commits: count(&counters.commits),
            flushes: count(&counters.flushes),
            flush_seconds: count(&counters.flush_nanos) as f64 / 1e9,
            compactions: count(&counters.compactions),
            failed_compactions: count(&counters.failed_compactions),
            compaction_seconds: count(&counters.compaction_nanos) as f64 / 1e9,
            generations: count(&counters.generations),
            healthy: self.health().is_ok(),
        }
    }

    /// Rotates to a new generation now (if the current one has entries) and compacts every
    /// old generation, in this thread.
    #[cfg(test)]
    pub fn compact_now(&self) -> io::Result<()> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        while state.flushing || state.compacting || state.unwaited > 0 {
            // Timed: the end of an unwaited entry's work is not signalled.
            state = shared
                .changed
                .wait_timeout(state, Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if state.first_entry_at.is_some() {
            shared.rotate(&mut state, None)?;
        }
        state.compacting = true;
        let pending = std::mem::take(&mut state.pending);
        drop(state);
        let result = shared.compact(&pending, None);
        let mut state = shared.lock();
        state.compacting = false;
        if result.is_err() {
            let mut back = pending;
            back.append(&mut state.pending);
            state.pending = back;
        }
        shared.changed.notify_all();
        result
    }

    #[cfg(test)]
    pub(in crate::volume) fn rotate_only(&self) -> io::Result<u64> {
        let mut state = self.shared.lock();
        self.shared.rotate(&mut state, None)?;
        Ok(state.generation - 1)
    }
}

impl Drop for Journal {
    /// A clean stop compacts everything, so the next start has nothing to replay.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake_compactor.notify_all();
        self.shared.wake_flusher.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in threads {
            let _ = handle.join();
        }
        let mut state = self.shared.lock();
        if state.failed.is_some() || state.flushing || state.compacting {
            return;
        }
        let mut all = std::mem::take(&mut state.pending);
        all.push(Old {
            generation: state.generation,
            unwritten: std::mem::take(&mut state.unwritten),
        });
        let (current, file, size) = (state.generation, state.file.clone(), state.size);
        drop(state);
        // The current generation is kept, emptied: the next start continues in it and so
        // needs no new file (it may find the filesystem full).
        let result = self
            .shared
            .compact(&all, Some(current))
            .and_then(|()| file::clear(&file, size));
        if let Err(err) = result {
            warn!(journal = %self.shared.name, error = %err, "could not compact the journal at stop; it is replayed at the next start");
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses every later commit (see `State::failed`), and tells `health`.
    fn fail(&self, state: &mut State, why: String) {
        self.lock_health().failed = Some(why.clone());
        state.failed = Some(why);
    }

    /// After an append failed for want of space: zeroes what of its frame landed in the
    /// file's blocks and cuts off what it added past them, so no part of it is read back.
    fn undo_partial_frame(&self, state: &State, len: usize) -> io::Result<()> {
        let end = state.size + len as u64;
        state.file.set_len(state.allocated.max(state.size))?;
        file::zero(&state.file, state.size, end.min(state.allocated))
    }

    /// Says once per episode, loudly, what is wrong and what to do.
    fn note_out_of_space(&self, state: &mut State, doing: &str) {
        if !std::mem::replace(&mut state.out_of_space, true) {
            error!(journal = %self.name, filesystem = %self.dir.display(), "{doing} the state journal failed: the filesystem holding {} is full. Changes that need new journal space are refused with RESOURCE_EXHAUSTED; deletions and unpublishes still work in the space the journal reserved. Free space on that filesystem (delete volumes, or a tenant's files in a pool without size enforcement); the journal compacts by itself once it can", self.dir.display());
        }
    }

    /// The error a change refused for want of journal space answers with.
    fn out_of_space(&self, err: &io::Error) -> io::Error {
        io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "the filesystem holding the state journal {} is full ({err}); the change was not made: free space there",
                self.dir.display()
            ),
        )
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// Step 1: starts generation n+1 (durably: see the module comment) in `prepared` (else
    /// prepares it now); generation n joins the pending ones. Only with every appended entry
    /// durable, so no entry of generation n waits for a flush of n+1's file.
    fn rotate(&self, state: &mut State, prepared: Option<File>) -> io::Result<()> {
        debug_assert!(!state.flushing && state.written == state.durable);
        let next = state.generation + 1;
        let file = match prepared {
            Some(file) => file,
            None => file::prepare(&self.dir, &self.name, self.options.max_bytes)?,
        };
        let allocated = file.metadata()?.len();
        file::install(&self.dir, &self.name, next)?;
        self.counters.generations.fetch_add(1, Ordering::Relaxed);
        state.pending.push(Old {
            generation: state.generation,
            unwritten: std::mem::take(&mut state.unwritten),
        });
        state.file = Arc::new(file);
        self.lock_health().file = state.file.clone();
        state.generation = next;
        state.size = file::MAGIC.len() as u64;
        state.allocated = allocated;
        state.first_entry_at = None;
        Ok(())
    }

    /// Steps 2 and 3 for the generations `old` (oldest first), counted; the file of `keep`
    /// stays.
    fn compact(&self, old: &[Old], keep: Option<u64>) -> io::Result<()> {
        if old.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let result = self.write_back_and_drop(old, keep);
        let counters = &self.counters;
        let took = started.elapsed().as_nanos() as u64;
        counters.compaction_nanos.fetch_add(took, Ordering::Relaxed);
        match &result {
            Ok(()) => {
                counters.compactions.fetch_add(1, Ordering::Relaxed);
                let dropped = old.iter().filter(|o| Some(o.generation) != keep).count() as u64;
                counters.generations.fetch_sub(dropped, Ordering::Relaxed);
            }
            Err(_) => {
                counters.failed_compactions.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn write_back_and_drop(&self, old: &[Old], keep: Option<u64>) -> io::Result<()> {
        // Step 2: write the records back (the newest entry of each wins), flush them and the
        // state directory's entries, then the pools' data.
        if let Some(write_back) = &self.options.write_back {
            let mut newest: HashMap<&str, &Entry> = HashMap::new();
            for entry in old.iter().flat_map(|o| o.unwritten.values()) {
                newest.insert(&entry.id, entry);
            }
            newest.values().try_for_each(|entry| write_back(entry))?;
        }
        crate::host::copy::sync_filesystem(&self.records_dir)?;
        if let Some(barrier) = &self.options.barrier {
            barrier()?;
        }
        // Step 3.
        for generation in old.iter().map(|o| o.generation) {
            if Some(generation) == keep {
                continue;
            }
            remove_file_if_present(&generation_path(&self.dir, &self.name, generation))?;
        }
        sync_dir(&self.dir)
    }

    /// Leads a flush covering every entry appended so far (`flushing` keeps it the only one).
    fn flush<'a>(&'a self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        state.flushing = true;
        let covered = state.written;
        let file = state.file.clone();
        drop(state);
        if let Some(hook) = &self.options.on_flush {
            hook();
        }
        let started = Instant::now();
        let flushed = file.sync_data();
        let took = started.elapsed().as_nanos() as u64;
        state = self.lock();
        state.flushing = false;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.counters.flush_nanos.fetch_add(took, Ordering::Relaxed);
        match flushed {
            Ok(()) => state.durable = state.durable.max(covered),
            // After a failed fdatasync the file's state is unknown (the kernel may have
            // dropped the dirty pages): refuse everything until a restart replays it.
            Err(err) => self.fail(&mut state, format!("flushing the journal: {err}")),
        }
        self.changed.notify_all();
        state
    }

    /// Flushes what `append` left unflushed, while its caller works on.
    fn flush_in_background(&self) {
        let mut state = self.lock();
        while !state.closed {
            state = if state.written > state.durable && !state.flushing && state.failed.is_none() {
                self.flush(state)
            } else {
                self.wake_flusher
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner())
            };
        }
    }

    fn compact_in_background(&self) {
        // The next generation's file, prepared without the lock (commits go on meanwhile).
        let mut prepared: Option<File> = None;
        let mut state = self.lock();
        loop {
            if state.closed {
                return;
            }
            let age = state.first_entry_at.map(|t| t.elapsed());
            let due = state.size >= self.options.max_bytes
                || age.is_some_and(|age| age >= self.options.max_age);
            if due && prepared.is_none() {
                drop(state);
                let result = file::prepare(&self.dir, &self.name, self.options.max_bytes);
                state = self.lock();
                match result {
                    Ok(file) => {
                        prepared = Some(file);
                        if std::mem::take(&mut state.out_of_space) {
                            info!(journal = %self.name, "the journal has space again");
                        }
                    }
                    Err(err) if is_out_of_space(&err) => {
                        self.note_out_of_space(&mut state, "preparing a new generation of");
                        state = self.sleep(state, Duration::from_secs(5));
                    }
                    Err(err) => {
                        error!(journal = %self.name, error = %err, "cannot prepare a new journal generation; retrying later");
                        state = self.sleep(state, Duration::from_secs(5));
                    }
                }
                continue;
            }
            if due
                && !state.flushing
                && state.unwaited == 0
                && state.written == state.durable
                && state.failed.is_none()
                && let Err(err) = self.rotate(&mut state, prepared.take())
            {
                error!(journal = %self.name, error = %err, "cannot start a new journal generation; retrying later");
                state = self.sleep(state, Duration::from_secs(5));
                continue;
            }
            if !state.pending.is_empty() {
                state.compacting = true;
                let pending = std::mem::take(&mut state.pending);
                drop(state);
                let result = self.compact(&pending, None);
                state = self.lock();
                state.compacting = false;
                self.changed.notify_all();
                match result {
                    Ok(()) => {
                        let generations: Vec<u64> = pending.iter().map(|o| o.generation).collect();
                        info!(journal = %self.name, ?generations, records = pending.iter().map(|o| o.unwritten.len()).sum::<usize>(), "journal compacted into the record files")
                    }
                    Err(err) => {
                        error!(journal = %self.name, error = %err, "compacting the journal failed; its generations stay and are retried (and replayed at start)");
                        let mut back = pending;
                        back.append(&mut state.pending);
                        state.pending = back;
                        state = self.sleep(state, Duration::from_secs(5));
                    }
                }
                continue;
            }
            let timeout = match age {
                Some(age) => self
                    .options
                    .max_age
                    .saturating_sub(age)
                    .max(Duration::from_millis(10)),
                None => self.options.max_age,
            };
            state = self.sleep(state, timeout);
        }
    }

    fn sleep<'a>(&self, state: MutexGuard<'a, State>, timeout: Duration) -> MutexGuard<'a, State> {
        self.wake_compactor
            .wait_timeout(state, timeout)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

fn failed(why: &str) -> io::Error {
    io::Error::other(format!(
        "the state journal failed earlier ({why}); restart the driver"
    ))
}

fn is_out_of_space(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// A start that needs a new generation (none to continue) on a full filesystem: say so.
fn out_of_space_at_start(dir: &Path, err: io::Error) -> io::Error {
    if !is_out_of_space(&err) {
        return err;
    }
    io::Error::new(
        err.kind(),
        format!(
            "cannot make a journal generation in {}: its filesystem is full ({err}); free space on it",
            dir.display()
        ),
    )
}

/// Every good entry of the journal `name` in `dir`, oldest first, read without changing
/// anything (a torn tail stays for `Journal::open` to handle): what the format check reads.
/// No journal (a first start) is no entry.
pub fn peek(dir: &Path, name: &str) -> io::Result<Replay> {
    let mut replay = Replay::default();
    let generations = match generations(dir, name) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(replay),
        found => found?,
    };
    for generation in generations {
        file::peek_generation(&generation_path(dir, name, generation), &mut replay)?;
    }
    Ok(replay)
}

/// What a start reads from the journal's generations.
struct OnDisk {
    /// Every entry, oldest first, torn tails cut off.
    replay: Replay,
    /// Each generation's newest entry per record, written back by its compaction (like a
    /// running generation's changes).
    pending: Vec<Old>,
    /// Where the newest generation's good entries end, with its newest entry per record.
    newest: Option<(file::End, Changes)>,
}

fn read_generations(dir: &Path, name: &str, generations: &[u64]) -> io::Result<OnDisk> {
    let mut replay = Replay::default();
    let mut pending = Vec::with_capacity(generations.len());
    let mut newest = None;
    for &generation in generations {
        let path = generation_path(dir, name, generation);
        let before = replay.entries.len();
        let end = file::read_generation(&path, &mut replay)?;
        let unwritten = newest_per_id(&replay.entries[before..]);
        newest = end.map(|end| (end, unwritten.clone()));
        pending.push(Old {
            generation,
            unwritten,
        });
    }
    Ok(OnDisk {
        replay,
        pending,
        newest,
    })
}

/// The generation a start appends to.
struct Current {
    file: File,
    generation: u64,
    /// Where the next entry goes.
    size: u64,
    allocated: u64,
    /// The last entry's sequence (0: none).
    sequence: u64,
    unwritten: Changes,
}

impl Current {
    /// The newest generation, reopened to append after its last good entry at `end`.
    fn continued(
        dir: &Path,
        name: &str,
        generation: u64,
        end: &file::End,
        unwritten: Changes,
    ) -> io::Result<Current> {
        let path = generation_path(dir, name, generation);
        Ok(Current {
            file: file::reopen(&path, end)?,
            generation,
            size: end.offset,
            allocated: end.len,
            sequence: end.last_sequence,
            unwritten,
        })
    }

    /// A new, empty generation (none had a good end to continue).
    fn new_generation(
        dir: &Path,
        name: &str,
        generation: u64,
        max_bytes: u64,
    ) -> io::Result<Current> {
        let file =
            file::prepare(dir, name, max_bytes).map_err(|err| out_of_space_at_start(dir, err))?;
        file::install(dir, name, generation)?;
        Ok(Current {
            allocated: file.metadata()?.len(),
            file,
            generation,
            size: file::MAGIC.len() as u64,
            sequence: 0,
            unwritten: Changes::new(),
        })
    }
}

/// The compactor's and the flusher's threads.
fn start_background(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let spawn = |role: &str, work: fn(&Shared)| {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("{role}-{}", shared.name))
            .spawn(move || work(&shared))
            .unwrap_or_else(|err| panic!("spawning the journal's {role} thread: {err}"))
    };
    vec![
        spawn("journal", Shared::compact_in_background),
        spawn("flush", Shared::flush_in_background),
    ]
}

fn newest_per_id(entries: &[Entry]) -> Changes {
    entries
        .iter()
        .map(|entry| (entry.id.clone(), entry.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn manual() -> Options {
        Options {
            background: false,
            ..Options::default()
        }
    }

    fn put(id: &str, json: &str) -> Entry {
        Entry {
            op: Op::Update,
            id: id.into(),
            json: json.as_bytes().to_vec(),
        }
    }

    /// A kill -9: nothing of `Drop` runs.
    fn crash(journal: Journal) {
        std::mem::forget(journal);
    }

    fn last_generation(dir: &Path) -> PathBuf {
        let generation = *generations(dir, "j").unwrap().last().unwrap();
        generation_path(dir, "j", generation)
    }

    #[test]
    fn concurrent_commits_share_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let flushes = Arc::new(AtomicU64::new(0));
        let counted = flushes.clone();
        let options = Options {
            // A slow disk: commits arriving during a flush must wait for the next one.
            on_flush: Some(Arc::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            })),
            ..manual()
        };
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), options).unwrap();
        const N: usize = 16;
        let start = std::sync::Barrier::new(N);
        std::thread::scope(|s| {
            for i in 0..N {
                let (journal, start) = (&journal, &start);
                s.spawn(move || {
                    start.wait();
                    journal.commit(put(&format!("v{i}"), "{}")).unwrap();
                });
            }
        });
        let flushed = flushes.load(Ordering::SeqCst);
        assert_eq!(journal.flushes(), flushed);
        assert!(flushed < N as u64 / 2, "{flushed} flushes for {N} commits");
        assert!(flushed >= 1);
        crash(journal);
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(
            replay.entries.len(),
            N,
            "every acknowledged commit is replayed"
        );
    }

    #[test]
    fn an_appended_entry_is_durable_after_its_wait_and_holds_its_generation_till_then() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        let appended = journal.append(put("a", "1")).unwrap();
        // Without the flusher thread (manual), nothing flushed it yet: the wait must.
        assert_eq!(journal.flushes(), 0);
        let before = generations(dir.path(), "j").unwrap();
        std::thread::scope(|s| {
            let compaction = s.spawn(|| journal.compact_now());
            std::thread::sleep(Duration::from_millis(50));
            // The caller is still at work (say, removing a volume's data): no rotation yet.
            assert_eq!(generations(dir.path(), "j").unwrap(), before);
            journal.wait(appended).unwrap();
            assert_eq!(journal.flushes(), 1, "the wait returned before a flush");
            compaction.join().unwrap().unwrap();
        });
        assert_eq!(journal.flushes(), 1);
        assert_ne!(generations(dir.path(), "j").unwrap(), before);
    }

    #[test]
    fn an_appended_entry_is_flushed_in_the_background_before_its_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), Options::default()).unwrap();
        let appended = journal.append(put("a", "1")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while journal.flushes() == 0 {
            assert!(Instant::now() < deadline, "the flusher never flushed");
            std::thread::sleep(Duration::from_millis(1));
        }
        journal.wait(appended).unwrap();
        assert_eq!(
            journal.flushes(),
            1,
            "the wait found its entry durable already"
        );
    }

    #[test]
    fn one_commit_alone_is_one_flush() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        journal.commit(put("a", "1")).unwrap();
        journal.commit(put("a", "2")).unwrap();
        assert_eq!(journal.flushes(), 2);
    }

    #[test]
    fn commits_overwrite_the_zeros_of_a_preallocated_file() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            max_bytes: 64 << 10,
            ..manual()
        };
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), options).unwrap();
        let path = last_generation(dir.path());
        assert_eq!(fs::metadata(&path).unwrap().len(), 64 << 10);
        journal.commit(put("a", "1")).unwrap();
        journal.commit(put("b", "2")).unwrap();
        // The size never changes, so a flush need not write the file's metadata.
        assert_eq!(fs::metadata(&path).unwrap().len(), 64 << 10);
        crash(journal);
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1"), put("b", "2")]);
        assert!(replay.torn.is_empty());
    }

    #[test]
    fn a_commit_cut_by_a_crash_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        journal.commit(put("a", "1")).unwrap();
        journal.commit(put("b", "2")).unwrap();
        crash(journal);
        file::tear_last_entry(&last_generation(dir.path()));
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(replay.torn.len(), 1, "{:?}", replay.torn);
    }

    #[test]
    fn generations_replay_in_order_whatever_step_a_compaction_stopped_at() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        journal.commit(put("a", "1")).unwrap();
        // Step 1 done, steps 2 and 3 not: both generations are replayed, oldest first.
        let old = journal.rotate_only().unwrap();
        journal.commit(put("a", "2")).unwrap();
        crash(journal);
        assert!(generation_path(dir.path(), "j", old).exists());
        let (journal, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1"), put("a", "2")]);
        // A full compaction drops every generation but the current one.
        journal.commit(put("a", "3")).unwrap();
        journal.compact_now().unwrap();
        assert_eq!(generations(dir.path(), "j").unwrap().len(), 1);
        crash(journal);
        let (journal, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert!(replay.entries.is_empty());
        // A clean stop compacts everything, keeping the current generation emptied.
        journal.commit(put("a", "4")).unwrap();
        drop(journal);
        assert_eq!(generations(dir.path(), "j").unwrap().len(), 1);
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert!(replay.entries.is_empty());
    }

    #[test]
    fn compaction_runs_the_barrier_before_dropping_a_generation() {
        let dir = tempfile::tempdir().unwrap();
        // A failing barrier (e.g. a pool's flush failed): the generation must stay.
        let failing = Options {
            barrier: Some(Arc::new(|| Err(io::Error::other("flush failed")))),
            ..manual()
        };
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), failing).unwrap();
        journal.commit(put("a", "1")).unwrap();
        assert!(journal.compact_now().is_err());
        crash(journal);
        let passing = Options {
            barrier: Some(Arc::new(|| Ok(()))),
            ..manual()
        };
        let (journal, replay) = Journal::open(dir.path(), "j", dir.path(), passing).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        journal.compact_now().unwrap();
        crash(journal);
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert!(replay.entries.is_empty());
    }

    #[test]
    fn stats_count_commits_flushes_compactions_and_generations() {
        let dir = tempfile::tempdir().unwrap();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let failing = fail.clone();
        let options = Options {
            barrier: Some(Arc::new(move || match failing.load(Ordering::SeqCst) {
                true => Err(io::Error::other("flush failed")),
                false => Ok(()),
            })),
            ..manual()
        };
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), options).unwrap();
        journal.commit(put("a", "1")).unwrap();
        journal.commit(put("b", "1")).unwrap();
        let stats = journal.stats();
        assert_eq!(
            (stats.name.as_str(), stats.commits, stats.flushes),
            ("j", 2, 2)
        );
        assert!(stats.flush_seconds > 0.0);
        assert_eq!(stats.generations, 1);
        assert!(stats.healthy);

        // A failed compaction keeps its generation on disk.
        assert!(journal.compact_now().is_err());
        let stats = journal.stats();
        assert_eq!((stats.compactions, stats.failed_compactions), (0, 1));
        assert_eq!(stats.generations, 2);
        assert_eq!(generations(dir.path(), "j").unwrap().len(), 2);

        fail.store(false, Ordering::SeqCst);
        journal.compact_now().unwrap();
        let stats = journal.stats();
        assert_eq!((stats.compactions, stats.failed_compactions), (1, 1));
        assert!(stats.compaction_seconds > 0.0);
        assert_eq!(stats.generations, 1);
        assert_eq!(generations(dir.path(), "j").unwrap().len(), 1);
    }

    #[test]
    fn background_compaction_rotates_past_the_size_limit() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            max_bytes: 256,
            // Only the size can be what rotates it.
            max_age: Duration::from_secs(3600),
            ..Options::default()
        };
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), options).unwrap();
        let first = generations(dir.path(), "j").unwrap();
        assert_eq!(first.len(), 1);
        for i in 0..20 {
            journal.commit(put(&format!("v{i}"), "{\"x\":1}")).unwrap();
        }
        // 20 entries of ~40 bytes are over 256: the file grew past its preallocated size.
        // The compaction is counted after it dropped the old file: wait for both.
        let deadline = Instant::now() + Duration::from_secs(10);
        while generations(dir.path(), "j").unwrap() == first
            || fs::metadata(last_generation(dir.path())).unwrap().len() > 512
            || generations(dir.path(), "j").unwrap().len() > 1
            || journal.stats().compactions == 0
        {
            assert!(Instant::now() < deadline, "no compaction happened");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A newer generation replaced the one past its limit.
        assert!(generations(dir.path(), "j").unwrap()[0] > first[0]);
    }

    #[test]
    fn an_appended_entry_dropped_unwaited_does_not_stop_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            max_age: Duration::from_millis(50),
            ..Options::default()
        };
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), options).unwrap();
        let before = generations(dir.path(), "j").unwrap();
        // Its caller failed before waiting (say, removing a side file) and returned.
        drop(journal.append(put("a", "1")).unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        while generations(dir.path(), "j").unwrap() == before {
            assert!(
                Instant::now() < deadline,
                "no rotation: the journal waits forever for an entry nobody will wait for"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        journal.commit(put("b", "2")).unwrap();
    }

    #[test]
    fn the_largest_entry_the_reader_takes_is_written_and_a_larger_one_refused_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        journal.commit(put("a", "1")).unwrap();
        // Payload = sequence, durable, op, id length, id, json.
        let fits = file::MAX_PAYLOAD - (16 + 3 + 1);
        let big = Entry {
            op: Op::Update,
            id: "b".into(),
            json: vec![b'x'; fits],
        };
        journal.commit(big.clone()).unwrap();
        let too_big = Entry {
            json: vec![b'x'; fits + 1],
            ..big.clone()
        };
        let err = journal.commit(too_big).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        // The journal goes on, and every acknowledged entry reads back.
        journal.commit(put("c", "3")).unwrap();
        crash(journal);
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1"), big, put("c", "3")]);
        assert!(replay.torn.is_empty(), "{:?}", replay.torn);
    }

    #[test]
    fn a_start_continues_the_newest_generation_in_place_over_its_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        journal.commit(put("a", "1")).unwrap();
        journal
            .commit(put("b", "a longer record than the next"))
            .unwrap();
        crash(journal);
        let before = generations(dir.path(), "j").unwrap();
        file::tear_last_entry(&last_generation(dir.path()));
        let (journal, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(generations(dir.path(), "j").unwrap(), before, "no new file");
        // Shorter than the torn entry: its remains must not be read after it.
        journal.commit(put("c", "3")).unwrap();
        journal.commit(put("d", "4")).unwrap();
        crash(journal);
        let (journal, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert_eq!(
            replay.entries,
            vec![put("a", "1"), put("c", "3"), put("d", "4")]
        );
        assert!(replay.torn.is_empty(), "{:?}", replay.torn);
        // A clean stop leaves that generation empty, not gone: the next start needs no space.
        drop(journal);
        assert_eq!(generations(dir.path(), "j").unwrap(), before);
        let (_, replay) = Journal::open(dir.path(), "j", dir.path(), manual()).unwrap();
        assert!(replay.entries.is_empty());
    }

    /// A small tmpfs, unmounted at drop (also when the test panicked).
    struct SmallFs(PathBuf);

    impl SmallFs {
        fn new(path: PathBuf, size: &str) -> SmallFs {
            use nix::mount::{MsFlags, mount};
            fs::create_dir_all(&path).unwrap();
            let options = format!("size={size}");
            mount(
                Some("tmpfs"),
                &path,
                Some("tmpfs"),
                MsFlags::empty(),
                Some(options.as_str()),
            )
            .expect("mounting a tmpfs (tests run as root)");
            SmallFs(path)
        }
    }

    impl Drop for SmallFs {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// Fills the filesystem of `dir` with a file, to the last byte.
    fn fill(dir: &Path) -> PathBuf {
        use std::io::Write;
        let path = dir.join("filler");
        let mut file = File::create(&path).unwrap();
        let chunk = vec![7u8; 4096];
        while file.write_all(&chunk).is_ok() {}
        path
    }

    #[test]
    fn on_a_full_filesystem_commits_fill_the_preallocated_room_then_are_refused_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let small = SmallFs::new(dir.path().join("fs"), "1m");
        let options = Options {
            max_bytes: 64 << 10,
            ..manual()
        };
        let (journal, _) = Journal::open(&small.0, "j", &small.0, options.clone()).unwrap();
        let filler = fill(&small.0);
        let json = "x".repeat(1000);
        let mut acknowledged = Vec::new();
        let refused = loop {
            let entry = put(&format!("v{}", acknowledged.len()), &json);
            match journal.commit(entry.clone()) {
                Ok(()) => acknowledged.push(entry),
                Err(err) => break err,
            }
            assert!(acknowledged.len() < 1000, "the filesystem never filled");
        };
        assert_eq!(refused.kind(), io::ErrorKind::StorageFull, "{refused}");
        assert!(
            acknowledged.len() >= 60,
            "{} commits fit",
            acknowledged.len()
        );
        assert_eq!(journal.health(), Ok(()), "a refusal is not a failure");
        // Space returns: commits go on, past the preallocated end.
        fs::remove_file(filler).unwrap();
        for i in 0..3 {
            let entry = put(&format!("after{i}"), &json);
            journal.commit(entry.clone()).unwrap();
            acknowledged.push(entry);
        }
        crash(journal);
        let (_, replay) = Journal::open(&small.0, "j", &small.0, options).unwrap();
        assert_eq!(replay.entries, acknowledged);
        assert!(replay.torn.is_empty(), "{:?}", replay.torn);
    }
}
