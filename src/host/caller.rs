//! Whether the caller of the host work running on this thread still waits for its answer.
//!
//! gRPC work runs on blocking threads (`driver::blocking`). When its caller goes away (its
//! deadline passed, it hung up), tonic drops the call's future, but the thread goes on: work that
//! only *waits* (for a walk slot, for another caller's walk) should then stop waiting, or a pile
//! of abandoned calls fills the blocking pool until publish, unpublish and Probe stall.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

thread_local! {
    static CALLER: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// How often a waiter looks whether its caller is still there.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Marks its call gone when dropped: held by the call's future, which tonic drops when the
/// caller goes away.
#[derive(Debug, Default)]
pub struct Presence {
    gone: Arc<AtomicBool>,
}

impl Presence {
    /// Runs `work` on this thread as the work of this presence's caller. The thread's previous
    /// caller comes back afterwards, even if `work` panics: a pool reuses its threads, and work
    /// without a caller must never see another's.
    pub fn serve<T>(gone: Arc<AtomicBool>, work: impl FnOnce() -> T) -> T {
        struct Restore(Option<Arc<AtomicBool>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let previous = self.0.take();
                CALLER.with(|caller| *caller.borrow_mut() = previous);
            }
        }
        let _restore = Restore(CALLER.with(|caller| caller.replace(Some(gone))));
        work()
    }

    /// The flag `serve` takes, shared with the thread doing the work.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.gone.clone()
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.gone.store(true, Ordering::Relaxed);
    }
}

/// Whether the caller of this thread's work went away (never, for work no caller waits for).
pub fn gone() -> bool {
    CALLER.with(|caller| {
        caller
            .borrow()
            .as_ref()
            .is_some_and(|gone| gone.load(Ordering::Relaxed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_is_gone_once_its_presence_is_dropped_and_only_for_its_work() {
        assert!(!gone(), "work without a caller");
        let presence = Presence::default();
        let flag = presence.flag();
        let thread = std::thread::spawn(move || {
            Presence::serve(flag, || {
                let before = gone();
                while !gone() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                before
            })
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(presence);
        assert!(!thread.join().unwrap(), "present while the presence lives");
        assert!(!gone(), "another thread's caller");
    }

    #[test]
    fn a_panicking_call_leaves_no_caller_behind_on_its_thread() {
        let presence = Presence::default();
        let flag = presence.flag();
        drop(presence);
        let panicked = std::panic::catch_unwind(|| Presence::serve(flag, || panic!("boom")));
        assert!(panicked.is_err());
        assert!(!gone(), "the thread's next work without a caller sees none");
    }
}
