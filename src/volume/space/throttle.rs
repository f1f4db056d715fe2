//! Keeping expensive host work from starving the rest: a pool runs at most a few tree walks
//! (usage measurements for stats and the admin commands) at a time, and callers asking for a
//! volume's usage while it is being walked share that walk.
//!
//! Without a bound, 64 concurrent NodeGetVolumeStats of a 100,000-file volume were 64 walking
//! threads on two cores, and Probe waited 1.7 s for a CPU (livenessprobe gives it 1 s). Waiting
//! callers sleep on a condition variable; they use no CPU.
//!
//! Above the pools, the whole node runs a bounded number of tree walks, copies, exports and
//! removals at once (`node_walks`), sized from the driver's memory limit: each holds kernel
//! memory charged to the driver's cgroup for the trees it walks and makes.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::host::usage::Usage;
use crate::host::{caller, cgroup};
use crate::volume::state::id::VolumeId;

/// Tree walks a pool runs at once.
pub const WALKS_PER_POOL: usize = 2;

/// What one walk, copy or export may cost in memory, ours and the kernel's (dentries and inodes of
/// the trees walked and made), at its peak. Seen: 20 concurrent clones of a volume holding a
/// 4,000-level chain of directories got the node plugin OOM-killed inside the DaemonSet's
/// 256 MiB (the driver's own RSS ~58 MiB, the rest kernel memory); 10 survived.
pub const MEMORY_PER_WALK: u64 = 32 << 20;
/// What the driver holds besides its walks.
pub const MEMORY_AT_REST: u64 = 64 << 20;
/// Walks the node runs at once when memory does not bound them (no limit, or a large one).
pub const MAX_NODE_WALKS: usize = 8;

/// How many walks, copies and exports run at once within `memory_limit`.
pub fn node_walk_count(memory_limit: Option<u64>) -> usize {
    match memory_limit {
        None => MAX_NODE_WALKS,
        Some(limit) => {
            let room = limit.saturating_sub(MEMORY_AT_REST) / MEMORY_PER_WALK;
            (room as usize).clamp(1, MAX_NODE_WALKS)
        }
    }
}

/// The node-wide walk slots, sized from the memory limit the first time they are needed (after
/// start, so a process moved into its cgroup late is sized by it). Taken after a pool's slot,
/// never before, so the two kinds cannot wait for each other in a circle.
pub fn node_walks() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let limit = cgroup::memory_limit();
        soften_memory_limit();
        let count = node_walk_count(limit);
        info!(memory_limit = ?limit, walks = count, "tree walks, copies and exports the node runs at once");
        Slots::new(count)
    })
}

/// Sets the cgroup's `memory.high` below its limit (see `cgroup::soften_memory_limit`) before
/// the first walk charges it, and says what came of it.
fn soften_memory_limit() {
    match cgroup::soften_memory_limit() {
        Ok(Some(high)) => info!(
            memory_high = high,
            "set this cgroup's memory.high below its limit: tree work past it is slowed while the kernel reclaims, not OOM-killed"
        ),
        Ok(None) => {}
        Err(err) => warn!(
            error = %err,
            "could not set this cgroup's memory.high below its limit: tree work that charges the limit with inodes may get the driver OOM-killed"
        ),
    }
}

thread_local! {
    /// Whether this thread holds a node-wide walk slot through `node_walk`.
    static HOLDS_NODE_WALK: Cell<bool> = const { Cell::new(false) };
}

/// A node-wide walk slot this thread holds (see `node_walk`), given back when dropped.
#[derive(Debug)]
pub struct NodeWalk {
    /// None when the thread already held one: the outer holder gives it back.
    slot: Option<Slot<'static>>,
}

/// Takes a node-wide walk slot for this thread, or shares the one it holds already: work that
/// must have its slot before it starts (a freeze, which blocks the volume's writers, is taken
/// only once the copy inside it can run at once) holds it, and the copy inside runs in it
/// rather than waiting for a second. None if the caller goes away while this waits.
pub fn node_walk() -> Option<NodeWalk> {
    if HOLDS_NODE_WALK.get() {
        return Some(NodeWalk { slot: None });
    }
    let slot = node_walks().take()?;
    HOLDS_NODE_WALK.set(true);
    Some(NodeWalk { slot: Some(slot) })
}

impl Drop for NodeWalk {
    fn drop(&mut self) {
        if self.slot.take().is_some() {
            HOLDS_NODE_WALK.set(false);
        }
    }
}

/// The error of work whose caller went away while it waited for a slot (nobody reads it).
pub fn caller_gone() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ECANCELED)
}

/// A counting semaphore for blocking threads.
#[derive(Debug)]
pub struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

/// One slot, given back when dropped.
#[derive(Debug)]
pub struct Slot<'a> {
    slots: &'a Slots,
}

impl Slots {
    pub fn new(count: usize) -> Slots {
        Slots {
            free: Mutex::new(count.max(1)),
            freed: Condvar::new(),
        }
    }

    /// Waits for a free slot; None if the caller of this thread's work goes away meanwhile
    /// (`host::caller`): nobody would read the answer.
    pub fn take(&self) -> Option<Slot<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            if caller::gone() {
                return None;
            }
            free = self
                .freed
                .wait_timeout(free, caller::LOOK_EVERY)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *free -= 1;
        Some(Slot { slots: self })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.slots.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.slots.freed.notify_one();
    }
}

/// Walks in progress, per volume: callers that ask while one runs wait for it and share its
/// result, so a burst of calls for one volume costs one walk, and nobody gets a figure older
/// than their call's start by more than one walk.
#[derive(Debug, Default)]
pub struct UsageCache {
    flights: Mutex<HashMap<VolumeId, Arc<Flight>>>,
}

#[derive(Debug, Default)]
struct Flight {
    state: Mutex<FlightState>,
    landed: Condvar,
}

#[derive(Debug, Default)]
struct FlightState {
    walking: bool,
    /// Walks finished so far, to tell a waiter that the one it waited for is done.
    finished: u64,
    /// What the last finished walk found (None if it failed).
    last: Option<Usage>,
    /// Why the last finished walk failed, when the tree's owner made it fail (`note_unmeasurable`).
    unmeasurable: Option<String>,
    /// When that walk finished.
    landed_at: Option<Instant>,
}

impl UsageCache {
    /// The usage of `id`: walked by `walk`, or shared from a walk already running; `gone()`'s
    /// error if the caller of this thread's work goes away while it waits for that walk.
    pub fn get_or_walk<E>(
        &self,
        id: &VolumeId,
        walk: impl FnOnce() -> Result<Usage, E>,
        gone: impl FnOnce() -> E,
    ) -> Result<Usage, E> {
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            flights.entry(id.clone()).or_default().clone()
        };
        let mut state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.walking {
            let awaited = state.finished;
            while state.walking && state.finished == awaited {
                if caller::gone() {
                    return Err(gone());
                }
                state = flight
                    .landed
                    .wait_timeout(state, caller::LOOK_EVERY)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            if let (true, Some(usage)) = (state.finished != awaited, state.last) {
                return Ok(usage);
            }
            // That walk failed: this caller walks and reports its own error.
        }
        state.walking = true;
        drop(state);
        let result = walk();
        let mut state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
        state.walking = false;
        state.finished += 1;
        state.last = result.as_ref().ok().copied();
        state.unmeasurable = None;
        state.landed_at = Some(Instant::now());
        flight.landed.notify_all();
        result
    }

    /// What a walk of `id` that finished within `max_age` found, without walking (None: no
    /// such walk, or it failed).
    pub fn measured_within(&self, id: &VolumeId, max_age: Duration) -> Option<Usage> {
        let flight = self.flight(id)?;
        let state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = state.landed_at?.elapsed() <= max_age;
        state.last.filter(|_| fresh)
    }

    /// Notes why the walk of `id` that just failed cannot succeed while the tree stays as its
    /// owner made it, so that others reuse the failure within a while rather than walk again
    /// (a walk that spent its budget took minutes).
    pub fn note_unmeasurable(&self, id: &VolumeId, why: String) {
        let Some(flight) = self.flight(id) else {
            return;
        };
        let mut state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
        // Unless a walk landed since with a figure.
        if state.last.is_none() {
            state.unmeasurable = Some(why);
        }
    }

    /// Why the last walk of `id`, if it finished within `max_age`, could not measure it, when
    /// the tree's owner made it fail (None: no such walk, or it measured, or it failed otherwise).
    pub fn unmeasurable_within(&self, id: &VolumeId, max_age: Duration) -> Option<String> {
        let flight = self.flight(id)?;
        let state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = state.landed_at?.elapsed() <= max_age;
        state.unmeasurable.clone().filter(|_| fresh)
    }

    fn flight(&self, id: &VolumeId) -> Option<Arc<Flight>> {
        self.flights
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Forgets a deleted volume.
    pub fn forget(&self, id: &VolumeId) {
        self.flights
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn no_more_than_the_slots_run_at_once() {
        let slots = Arc::new(Slots::new(2));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (slots, running, most) = (slots.clone(), running.clone(), most.clone());
                std::thread::spawn(move || {
                    let _slot = slots.take();
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_measurement_is_reused_only_while_it_is_fresh() {
        let cache = UsageCache::default();
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        let day = Duration::from_secs(86_400);
        assert_eq!(cache.measured_within(&id, day), None, "never walked");
        let usage = Usage {
            bytes: 7,
            inodes: 1,
        };
        cache
            .get_or_walk(&id, || Ok::<_, ()>(usage), || ())
            .unwrap();
        assert_eq!(cache.measured_within(&id, day), Some(usage));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(cache.measured_within(&id, Duration::from_millis(1)), None);
        let _ = cache.get_or_walk(&id, || Err::<Usage, _>(()), || ());
        assert_eq!(
            cache.measured_within(&id, day),
            None,
            "the last walk failed"
        );
    }

    /// A gate the walks wait at until the test opens it (for all of them at once).
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Gate {
        fn pass(&self) {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }

        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    #[test]
    fn a_burst_for_one_volume_walks_once() {
        const CALLERS: usize = 16;
        let cache = Arc::new(UsageCache::default());
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        let walks = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Gate::default());
        let (tids, tid) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (cache, id, walks, gate, tids) = (
                    cache.clone(),
                    id.clone(),
                    walks.clone(),
                    gate.clone(),
                    tids.clone(),
                );
                std::thread::spawn(move || {
                    tids.send(unsafe { libc::gettid() }).unwrap();
                    cache
                        .get_or_walk(
                            &id,
                            || {
                                walks.fetch_add(1, Ordering::SeqCst);
                                gate.pass();
                                Ok::<_, ()>(Usage {
                                    bytes: 7,
                                    inodes: 1,
                                })
                            },
                            || (),
                        )
                        .unwrap()
                })
            })
            .collect();
        // Every caller has joined the volume's flight (the map holds one reference, each
        // caller another) and is asleep: the first at the gate, inside its walk, the others
        // waiting for that walk to land (no lock is held long enough to sleep on otherwise).
        // However loaded the machine, no caller can still be on its way to the flight.
        let tids: Vec<_> = tid.iter().take(CALLERS).collect();
        let joined = || Arc::strong_count(&cache.flights.lock().unwrap()[&id]);
        let asleep = |tid: &libc::pid_t| {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
            // "PID (COMM) STATE …": the state follows the last ')'.
            stat.rsplit(')')
                .next()
                .unwrap()
                .trim_start()
                .starts_with('S')
        };
        while joined() < CALLERS + 1 || !tids.iter().all(asleep) {
            std::thread::sleep(Duration::from_millis(1));
        }
        gate.open();
        for thread in threads {
            assert_eq!(thread.join().unwrap().bytes, 7);
        }
        // One walk served the whole burst.
        assert_eq!(walks.load(Ordering::SeqCst), 1, "walks for one burst");
        // A later call walks again: no figure outlives its walk.
        let again = cache.get_or_walk(
            &id,
            || {
                walks.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>(Usage::default())
            },
            || (),
        );
        assert_eq!(again.unwrap(), Usage::default());
        assert_eq!(walks.load(Ordering::SeqCst), 2);
        cache.forget(&id);
        assert!(cache.flights.lock().unwrap().is_empty(), "forgotten");
    }

    /// Runs `wait` as the work of a caller that goes away after 50 ms; how long it waited.
    fn abandoned_after_50_ms<T>(wait: impl FnOnce() -> T + Send + 'static) -> (T, Duration)
    where
        T: Send + 'static,
    {
        let presence = caller::Presence::default();
        let flag = presence.flag();
        let waiter = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let result = caller::Presence::serve(flag, wait);
            (result, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(presence);
        waiter.join().unwrap()
    }

    #[test]
    fn the_node_runs_as_many_walks_as_its_memory_holds() {
        assert_eq!(node_walk_count(Some(256 << 20)), 6, "the DaemonSet's limit");
        assert_eq!(node_walk_count(Some(64 << 20)), 1);
        assert_eq!(node_walk_count(Some(16 << 20)), 1, "never none");
        assert_eq!(node_walk_count(Some(64 << 30)), MAX_NODE_WALKS);
        assert_eq!(node_walk_count(None), MAX_NODE_WALKS);
    }

    #[test]
    fn a_caller_gone_stops_waiting_for_a_slot() {
        let slots = Arc::new(Slots::new(1));
        let held = slots.take().expect("a free slot");
        let waiting = slots.clone();
        let (got, waited) = abandoned_after_50_ms(move || waiting.take().is_some());
        assert!(!got, "a slot while it was held");
        assert!(
            waited < Duration::from_secs(1),
            "waited {waited:?} for a slot nobody freed"
        );
        drop(held);
        assert!(
            slots.take().is_some(),
            "the slot is free again, and was not lost"
        );
    }

    #[test]
    fn a_caller_gone_stops_waiting_for_another_callers_walk() {
        let cache = Arc::new(UsageCache::default());
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        let gate = Arc::new(Gate::default());
        let (walking, started) = std::sync::mpsc::channel();
        let walker = {
            let (cache, id, gate) = (cache.clone(), id.clone(), gate.clone());
            std::thread::spawn(move || {
                cache.get_or_walk(
                    &id,
                    || {
                        walking.send(()).unwrap();
                        gate.pass();
                        Ok::<_, &str>(Usage::default())
                    },
                    || "gone",
                )
            })
        };
        started.recv().unwrap();
        let (waiting, id2) = (cache.clone(), id.clone());
        let (result, waited) = abandoned_after_50_ms(move || {
            waiting.get_or_walk(&id2, || Err("walked itself"), || "gone")
        });
        assert_eq!(result, Err("gone"));
        assert!(
            waited < Duration::from_secs(1),
            "waited {waited:?} for a walk it no longer needed"
        );
        gate.open();
        assert_eq!(walker.join().unwrap(), Ok(Usage::default()));
    }

    #[test]
    fn a_failure_of_the_trees_making_is_remembered_until_a_walk_measures() {
        let cache = UsageCache::default();
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        let day = Duration::from_secs(86_400);
        let _ = cache.get_or_walk(&id, || Err::<Usage, _>(()), || ());
        assert_eq!(cache.unmeasurable_within(&id, day), None, "not noted");
        cache.note_unmeasurable(&id, "too deep".into());
        assert_eq!(
            cache.unmeasurable_within(&id, day).as_deref(),
            Some("too deep")
        );
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            cache.unmeasurable_within(&id, Duration::from_millis(1)),
            None
        );
        let _ = cache.get_or_walk(&id, || Ok::<_, ()>(Usage::default()), || ());
        assert_eq!(cache.unmeasurable_within(&id, day), None, "measured since");
        cache.note_unmeasurable(&id, "late".into());
        assert_eq!(cache.unmeasurable_within(&id, day), None, "a figure wins");
    }

    #[test]
    fn a_failed_walk_is_not_cached() {
        let cache = UsageCache::default();
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        assert!(
            cache
                .get_or_walk(&id, || Err::<Usage, _>("boom"), || "gone")
                .is_err()
        );
        let usage = cache.get_or_walk(&id, || Ok::<_, ()>(Usage::default()), || ());
        assert_eq!(usage, Ok(Usage::default()));
    }
}
