//! Batch-1 calls on the caller's thread: one row's two-way split between the thread that called
//! the op and one worker of the device's pool.
//!
//! An op normally runs inside [`rayon::ThreadPool::install`]: the caller queues the whole call
//! for a worker and sleeps on a lock until it is done, and waking it again costs a futex round
//! trip (on a virtual machine, an idle vCPU's halt and wake-up as well). For a single row that is
//! cut into at most two parts that is most of the fixed cost of a call, so such calls run on the
//! caller's thread instead ([`on_caller`]): a row on one thread needs no other thread at all, and
//! a row split in two hands its second side to one pool worker ([`join`]) while the caller works
//! on the first and then spins — never sleeps — until the worker is done.
//!
//! The second side is **claimed**: whichever of the caller (once done with its own side) and the
//! worker gets to it first runs it. The caller waits only for a side a worker has started (and so
//! finishes without waiting on anything), so a busy or one-thread pool makes the call slower,
//! never stuck. The results do not depend on which thread runs which side.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::Result as Outcome;
use std::time::{Duration, Instant};

thread_local! {
    /// The pool the [`join`]s of this thread hand their second side to, while [`on_caller`]
    /// runs (null otherwise).
    static HELPERS: Cell<*const rayon::ThreadPool> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` on this thread, its [`join`]s helped by one worker of `pool` each. `f` must make no
/// other parallel section (a rayon call from here would run on the global pool); the caller
/// must not be one of `pool`'s workers (it would spin on work queued behind itself).
pub(crate) fn on_caller<R>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R) -> R {
    debug_assert!(pool.current_thread_index().is_none());
    /// Restores the previous pool, also when `f` unwinds.
    struct Restore(*const rayon::ThreadPool);
    impl Drop for Restore {
        fn drop(&mut self) {
            HELPERS.with(|helpers| helpers.set(self.0));
        }
    }
    let _restore = Restore(HELPERS.with(|helpers| helpers.replace(pool)));
    f()
}

/// `rayon::join(a, b)`; inside [`on_caller`], `a` runs on this thread and `b` on one worker of
/// its pool (or here, if no worker has started it by the time `a` is done).
pub(crate) fn join<A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    let pool = HELPERS.with(Cell::get);
    if pool.is_null() {
        return rayon::join(a, b);
    }
    // SAFETY: `on_caller` set the pointer from a reference that outlives its closure, which is
    // running on this thread now, and clears it when the closure ends.
    let pool = unsafe { &*pool };
    helped(pool, a, b)
}

/// The second side's state: not started, run by the worker, run by the caller, or done.
const FREE: u8 = 0;
const WORKER: u8 = 1;
const CALLER: u8 = 2;
const DONE: u8 = 3;

/// The second side and its result, on the caller's stack.
struct Side<B, RB> {
    run: Option<B>,
    out: Option<Outcome<RB>>,
}

/// Runs the side at `side` (a `*mut Side<B, RB>`) and keeps its outcome there.
///
/// # Safety
/// `side` points to a live `Side<B, RB>` that no other thread touches until this returns.
unsafe fn run_side<B: FnOnce() -> RB, RB>(side: usize) {
    // SAFETY: as the caller promises.
    let side = unsafe { &mut *(side as *mut Side<B, RB>) };
    if let Some(run) = side.run.take() {
        side.out = Some(catch_unwind(AssertUnwindSafe(run)));
    }
}

fn helped<A, B, RA, RB>(pool: &rayon::ThreadPool, a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    let mut side = Side {
        run: Some(b),
        out: None,
    };
    let state = Arc::new(AtomicU8::new(FREE));
    let address = &raw mut side as usize;
    // A plain function pointer: the job is `'static` whatever `B` borrows.
    let run: unsafe fn(usize) = run_side::<B, RB>;
    let job_state = Arc::clone(&state);
    #[cfg(test)]
    let spawned = std::time::Instant::now();
    pool.spawn(move || {
        #[cfg(test)]
        probe::started(spawned);
        if job_state
            .compare_exchange(FREE, WORKER, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: the claim gives this job the side; the caller does not touch it, nor leave
            // `helped`, until the job stores DONE below (it may drop its `state` before the job
            // drops this one: the count is shared).
            unsafe { run(address) };
            job_state.store(DONE, Ordering::Release);
        }
    });
    let first = catch_unwind(AssertUnwindSafe(a));
    if state
        .compare_exchange(FREE, CALLER, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
    {
        // SAFETY: claimed here: the job will find the side taken and leave it alone.
        unsafe { run_side::<B, RB>(address) };
        #[cfg(test)]
        probe::SECOND_ON_CALLER.fetch_add(1, Ordering::Relaxed);
    } else {
        wait_done(&state);
    }
    let second = side.out.take();
    match (first, second) {
        (Ok(ra), Some(Ok(rb))) => (ra, rb),
        (Err(panic), _) | (_, Some(Err(panic))) => resume_unwind(panic),
        // Unreachable: whoever claimed the side ran it and kept its outcome.
        (Ok(_), None) => unreachable!("the second side of a join was not run"),
    }
}

/// Waits until the worker that claimed a side has run it (at most about the side's work, spun).
fn wait_done(state: &AtomicU8) {
    spin_until(SIDE_SPIN, || state.load(Ordering::Acquire) == DONE);
}

/// How long a caller spins for a side a worker has started before yielding its core: about a
/// side's work on a batch-1 row (half of the estimates of 151936 logits). Longer, the worker is
/// most likely waiting for this very core.
const SIDE_SPIN: Duration = Duration::from_micros(30);

/// Spins until `done`, for at most `spin` (the clock read every 32 spins), then yields the core
/// between checks: a thread it waits for that was preempted, or shares this core, gets to run.
pub(crate) fn spin_until(spin: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    let mut spins = 0u32;
    while !done() {
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(32) || start.elapsed() < spin {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Counters of the batch-1 probe (tests only).
#[cfg(test)]
pub(crate) mod probe {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    /// Joins whose second side the caller ran itself.
    pub(crate) static SECOND_ON_CALLER: AtomicUsize = AtomicUsize::new(0);
    /// Helper jobs started, and their summed start latency in ns.
    pub(crate) static STARTED: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static LATENCY_NS: AtomicU64 = AtomicU64::new(0);
    pub(crate) fn started(spawned: std::time::Instant) {
        STARTED.fetch_add(1, Ordering::Relaxed);
        LATENCY_NS.fetch_add(spawned.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    /// Both sides run once, with what they borrow, on a two-thread pool and on a one-thread pool
    /// (whose worker may be busy: the caller then runs the second side itself).
    #[test]
    fn both_sides_run_once_with_their_borrows() {
        for threads in [1, 2] {
            let pool = pool(threads);
            let data: Vec<u64> = (0..10_000).collect();
            let (lo, hi) = data.split_at(5_000);
            for _ in 0..200 {
                let (a, b) = on_caller(&pool, || {
                    join(|| lo.iter().sum::<u64>(), || hi.iter().sum::<u64>())
                });
                assert_eq!((a, b), (12_497_500, 37_497_500), "threads {threads}");
            }
        }
    }

    /// A second side that the caller's side waits for runs on a worker, and its result comes
    /// back.
    #[test]
    fn a_started_second_side_runs_on_a_worker() {
        let pool = pool(2);
        let caller = std::thread::current().id();
        let started = std::sync::atomic::AtomicBool::new(false);
        let (_, ran_on) = on_caller(&pool, || {
            join(
                || {
                    while !started.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                },
                || {
                    started.store(true, Ordering::Release);
                    std::thread::current().id()
                },
            )
        });
        assert_ne!(ran_on, caller);
    }

    /// A pool whose only worker is stuck behind a long job: the caller runs the second side.
    #[test]
    fn a_busy_pool_leaves_the_second_side_to_the_caller() {
        let pool = pool(1);
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            let _ = blocked.recv();
        });
        let caller = std::thread::current().id();
        let (_, ran_on) = on_caller(&pool, || join(|| (), || std::thread::current().id()));
        assert_eq!(ran_on, caller);
        release.send(()).expect("release the worker");
    }

    /// Outside `on_caller`, `join` is rayon's; after it (also after a panic in it) too.
    #[test]
    fn join_is_rayons_outside_on_caller() {
        let pool = pool(2);
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            on_caller(&pool, || join(|| (), || panic!("second side")))
        }));
        assert!(panicked.is_err());
        assert!(HELPERS.with(Cell::get).is_null());
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            on_caller(&pool, || join(|| panic!("first side"), || 2))
        }));
        assert!(panicked.is_err());
        assert!(HELPERS.with(Cell::get).is_null());
        assert_eq!(join(|| 1, || 2), (1, 2));
    }
}
