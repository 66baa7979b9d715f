//! The engines' worker threads: a fixed team, OpenMP-style. The thread that runs a step is one of
//! the team; `n − 1` helper threads wait for work by spinning in user space for a short while
//! (no system call), then park. A parallel loop hands each thread its share by index — a static
//! partition, as run.c's `#pragma omp parallel for` — and the caller does share 0 itself, then
//! waits (spinning) for the helpers. No task queue, no stealing, no `sched_yield` between loops.
//!
//! One exception to the partition: a helper claims its share before running it, and a share
//! still unclaimed when the caller has finished its own is claimed and run by the caller. A
//! helper whose core was taken (by another process, or by `kvlab serve`'s HTTP threads, which
//! the scheduler runs in the middle of a step) would otherwise hold the whole loop up until it
//! got its core back. The shares are the same whoever runs them, so the results are too.
//!
//! The thread count is fixed once, before the first parallel loop: `kvlab -t N` calls
//! [`set_num_threads`]; the default is the machine's physical cores (`RAYON_NUM_THREADS` is read
//! too, for programs that set it for every pool).

use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Why the thread count could not be set.
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// 0 threads were asked for; ask for at least 1.
    #[error("the thread count must be at least 1")]
    Zero,
    /// The team was already started with another count (by an earlier call or the first
    /// parallel loop); set the count once, before the first step.
    #[error(
        "the worker team already runs {running} threads; set the thread count before the first step"
    )]
    AlreadyStarted {
        /// Threads the running team has, the caller's included.
        running: usize,
    },
    /// The OS refused to spawn a helper thread; ask for fewer threads.
    #[error("could not start {threads} worker threads: {reason}")]
    Spawn {
        /// Threads asked for, the caller's included.
        threads: usize,
        /// The OS's error, as text.
        reason: String,
    },
}

/// How long a waiting thread spins before it parks (helpers) or yields (the caller): longer than
/// the serial work between two parallel loops of a decode step, short enough that an idle
/// engine gives its cores back at once.
const SPIN_FOR: std::time::Duration = std::time::Duration::from_micros(200);

/// Spins until `done()` or until [`SPIN_FOR`] has passed; returns whether `done()` held.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > SPIN_FOR {
            return done();
        }
    }
}

/// One parallel loop: `f(task)` for every task in `0..n_tasks`.
#[derive(Clone, Copy)]
struct Job {
    /// The loop body, its lifetime erased; valid until every helper has reported this epoch
    /// done (see `Team::run`).
    f: *const (dyn Fn(usize) + Sync + 'static),
    n_tasks: usize,
}

/// A value alone on its cache line(s): the lines the caller writes (epoch, job) and each
/// helper writes (its `done`) are never the same, so a parallel loop moves two cache lines
/// between cores, one each way, and no lock.
#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    /// Incremented once per job; a helper runs each epoch's job once.
    epoch: Padded<AtomicU64>,
    /// The current epoch's job. Written by the caller of `Team::run` only while no helper is
    /// between claiming its share of an epoch and reporting it done; read by helpers only in
    /// that window.
    job: Padded<UnsafeCell<Option<Job>>>,
    /// claimed[k − 1]: the last epoch whose share k was claimed, by helper k or by the caller
    /// (`fetch_max`: whoever raises it runs the share).
    claimed: Box<[Padded<AtomicU64>]>,
    /// done[k − 1]: the last epoch helper k finished.
    done: Box<[Padded<AtomicU64>]>,
    /// Helpers parked on `wake`.
    sleeping: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    /// A task panicked on a helper: the caller re-raises it.
    panicked: AtomicBool,
    n_threads: usize,
}

// SAFETY: `Job::f` points to a `dyn Fn + Sync`, which may be called from any thread; the pointer
// is only dereferenced while the caller of `Team::run` keeps the closure alive (it waits for
// every helper's `done` to reach the epoch before returning).
unsafe impl Send for Job {}
// SAFETY: every field but `job` is Sync; `job` is written only by the one caller of `Team::run`
// (it holds `Team::entry`) before it publishes a new epoch, when every share of the previous
// epoch was run by the caller or reported done by the helper that claimed it, and read by a
// helper only after it claimed its share of the new epoch (SeqCst: the write happens-before the
// read) and before it reports it done.
unsafe impl Sync for Shared {}

struct Team {
    shared: Arc<Shared>,
    /// One job at a time: callers on different threads (tests) take turns.
    entry: Mutex<()>,
}

thread_local! {
    /// Set while this thread runs a team task: a parallel loop inside one runs serially.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

static TEAM: OnceLock<Team> = OnceLock::new();

/// Physical cores of this machine (hyper-threads share a core's vector units, so they rarely help
/// memory-bound decode).
pub fn physical_cores() -> usize {
    num_cpus::get_physical().max(1)
}

fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(physical_cores)
}

impl Team {
    fn start(n_threads: usize) -> Result<Team, ThreadsError> {
        let shared = Arc::new(Shared {
            epoch: Padded(AtomicU64::new(0)),
            job: Padded(UnsafeCell::new(None)),
            claimed: (1..n_threads).map(|_| Padded(AtomicU64::new(0))).collect(),
            done: (1..n_threads).map(|_| Padded(AtomicU64::new(0))).collect(),
            sleeping: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            panicked: AtomicBool::new(false),
            n_threads,
        });
        for i in 1..n_threads {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("kvlab-worker-{i}"))
                .spawn(move || helper(&s, i))
                .map_err(|e| ThreadsError::Spawn {
                    threads: n_threads,
                    reason: e.to_string(),
                })?;
        }
        Ok(Team {
            shared,
            entry: Mutex::new(()),
        })
    }

    /// Runs `f(t)` for every `t` in `0..n_tasks`: thread k of the team takes tasks k, k + n,
    /// k + 2n, … (the caller is thread 0). Returns when every task has run; re-raises a panic.
    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &self.shared;
        let _turn = self.entry.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the lifetime is erased only for the helpers, which call `f` for this epoch
        // only; this function does not return (nor unwind: the caller's share runs under
        // catch_unwind) before every helper has reported this epoch done.
        let f_static: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute(f as *const (dyn Fn(usize) + Sync)) };
        // SAFETY: we hold `entry`, and every share of the previous epoch was run here or
        // reported done by the helper that claimed it before the previous `run` returned, so
        // no helper reads `job` now (see `Shared`).
        unsafe {
            *s.job.0.get() = Some(Job {
                f: f_static,
                n_tasks,
            })
        };
        let epoch = s.epoch.0.fetch_add(1, SeqCst) + 1;
        if s.sleeping.load(SeqCst) > 0 {
            let _g = s.park.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        let mut mine = catch_unwind(AssertUnwindSafe(|| {
            run_share(f, 0, s.n_threads, n_tasks);
        }));
        // A helper that has not claimed its share yet (descheduled: another process, or the
        // server's HTTP threads, took its core) will not start it now: the caller runs it,
        // rather than wait for that core to come back with nothing to do.
        for k in 1..s.n_threads {
            if s.claimed[k - 1].0.fetch_max(epoch, SeqCst) < epoch {
                let r = catch_unwind(AssertUnwindSafe(|| run_share(f, k, s.n_threads, n_tasks)));
                if mine.is_ok() {
                    mine = r;
                }
                // Helper k lost the claim, so it reports nothing for this epoch: the caller
                // does.
                s.done[k - 1].0.store(epoch, SeqCst);
            }
        }
        let all_done = || s.done.iter().all(|d| d.0.load(SeqCst) == epoch);
        while !spin_until(all_done) {
            // A helper was descheduled in its share: let it run.
            std::thread::yield_now();
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a task of a parallel loop panicked on a worker thread");
        }
    }
}

/// Thread `k` of `n`'s tasks of a job.
fn run_share(f: &(dyn Fn(usize) + Sync), k: usize, n: usize, n_tasks: usize) {
    /// Clears IN_TASK when the share ends, even by a panic.
    struct InTask;
    impl Drop for InTask {
        fn drop(&mut self) {
            IN_TASK.with(|c| c.set(false));
        }
    }
    IN_TASK.with(|c| c.set(true));
    let _in_task = InTask;
    for t in (k..n_tasks).step_by(n) {
        f(t);
    }
}

/// A helper thread's life: wait for the next epoch (spin, then park), run its share, report.
fn helper(s: &Shared, k: usize) {
    let mut seen = 0u64;
    loop {
        if !spin_until(|| s.epoch.0.load(SeqCst) != seen) {
            let mut g = s.park.lock().unwrap_or_else(|p| p.into_inner());
            s.sleeping.fetch_add(1, SeqCst);
            while s.epoch.0.load(SeqCst) == seen {
                g = s.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            s.sleeping.fetch_sub(1, SeqCst);
        }
        seen = s.epoch.0.load(SeqCst);
        if s.claimed[k - 1].0.fetch_max(seen, SeqCst) >= seen {
            continue; // the caller ran this share itself
        }
        // SAFETY: a new epoch is published only after its job was written, and the next job is
        // written only after this helper, which claimed its share, reports `seen` done below
        // (see `Shared`).
        let job = unsafe { *s.job.0.get() };
        if let Some(job) = job {
            // SAFETY: see `Job::f`: the caller of `run` waits for this helper's report below
            // before the closure can go away.
            let f = unsafe { &*job.f };
            if catch_unwind(AssertUnwindSafe(|| {
                run_share(f, k, s.n_threads, job.n_tasks)
            }))
            .is_err()
            {
                s.panicked.store(true, SeqCst);
            }
        }
        s.done[k - 1].0.store(seen, SeqCst);
    }
}

fn team() -> Option<&'static Team> {
    if TEAM.get().is_none()
        && let Ok(t) = Team::start(default_threads())
    {
        let _ = TEAM.set(t);
    }
    TEAM.get()
}

/// Fixes the number of threads (the caller's included).
///
/// # Errors
/// [`ThreadsError::Zero`] for 0; [`ThreadsError::AlreadyStarted`] when the team already runs a
/// different count; [`ThreadsError::Spawn`] when the OS refuses the threads.
pub fn set_num_threads(threads: usize) -> Result<(), ThreadsError> {
    if threads == 0 {
        return Err(ThreadsError::Zero);
    }
    if TEAM.get().is_none() {
        let t = Team::start(threads)?;
        // A racing caller may have set it first; then its count decides.
        let _ = TEAM.set(t);
    }
    match num_threads() {
        n if n == threads => Ok(()),
        running => Err(ThreadsError::AlreadyStarted { running }),
    }
}

/// Threads of the team (starting it with the default count if needed).
pub fn num_threads() -> usize {
    team().map_or(1, |t| t.shared.n_threads)
}

/// Runs `f(t)` for every `t` in `0..n_tasks` on the team, share k being tasks k, k + n, … (run
/// by thread k, or by the caller when thread k has not started it in time); on
/// the calling thread alone when there is one thread or one task, or inside another team task.
pub fn for_each_task(n_tasks: usize, f: impl Fn(usize) + Sync) {
    let nested = IN_TASK.with(Cell::get);
    match team() {
        Some(t) if t.shared.n_threads > 1 && n_tasks > 1 && !nested => t.run(n_tasks, &f),
        _ => (0..n_tasks).for_each(f),
    }
}

/// Splits `out` into chunks of `chunk` elements (the last may be shorter) and runs
/// `f(index, chunk)` for each on the team.
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let (len, n) = (out.len(), out.len().div_ceil(chunk));
    let base = SendPtr(out.as_mut_ptr());
    for_each_task(n, |i| {
        let start = i * chunk;
        let m = chunk.min(len - start);
        // SAFETY: chunk i covers `start..start + m` inside `out`; the chunks are disjoint and
        // each index runs exactly once, while `out` stays mutably borrowed by this function.
        let c = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), m) };
        f(i, c);
    });
}

/// Splits `out` at `bounds` (ascending offsets, the first 0 and the last `out.len()`) into
/// `bounds.len() − 1` parts and runs `f(index, part)` for each on the team: parts of unequal
/// sizes, where [`for_each_chunk_mut`]'s are equal.
///
/// # Panics
/// If `bounds` does not start at 0, end at `out.len()` and ascend.
pub fn for_each_part_mut<T: Send>(
    out: &mut [T],
    bounds: &[usize],
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(
        bounds.first() == Some(&0)
            && bounds.last() == Some(&out.len())
            && bounds.windows(2).all(|w| w[0] <= w[1]),
        "for_each_part_mut: bounds must ascend from 0 to out.len()"
    );
    let base = SendPtr(out.as_mut_ptr());
    for_each_task(bounds.len() - 1, |i| {
        let (start, end) = (bounds[i], bounds[i + 1]);
        // SAFETY: part i covers `start..end` inside `out` (bounds ascend from 0 to out.len(),
        // asserted above); the parts are disjoint and each index runs exactly once, while `out`
        // stays mutably borrowed by this function.
        let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        f(i, part);
    });
}

/// A base pointer shared by the tasks of one parallel loop that touch disjoint parts of its
/// buffer (contiguous chunks here, column blocks in `linear::sgemm_columns`).
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: every user's tasks touch disjoint parts of the buffer, which the loop's caller keeps
// mutably borrowed until all tasks have run.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// A method, so closures capture the wrapper (Send + Sync), not the raw field.
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_exactly_once() {
        for n in [0, 1, 2, 3, 7, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for_each_task(n, |t| {
                hits[t].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "n={n}");
        }
    }

    #[test]
    fn a_share_whose_helper_is_away_is_run_once_by_the_caller() {
        if num_threads() < 2 {
            eprintln!("skipping: the team has one thread");
            return;
        }
        let caller = std::thread::current().id();
        let mut by_caller = 0;
        for _ in 0..50 {
            // With no work for 3 × SPIN_FOR the helpers have parked; waking one takes longer
            // than the caller's share of empty tasks, so the caller should claim the others.
            std::thread::sleep(SPIN_FOR * 3);
            let n = num_threads();
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let here: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
            for_each_task(n, |t| {
                hits[t].fetch_add(1, SeqCst);
                here[t].store(std::thread::current().id() == caller, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
            by_caller += usize::from(here[1].load(SeqCst));
        }
        assert!(
            by_caller > 0,
            "the caller never ran a parked helper's share in 50 loops"
        );
        // The team still works in parallel afterwards.
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for_each_task(1000, |t| {
            hits[t].fetch_add(1, SeqCst);
        });
        assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
    }

    #[test]
    fn chunks_cover_the_buffer_once_and_nested_loops_run_serially() {
        let mut v = vec![0u32; 1003];
        for_each_chunk_mut(&mut v, 100, |i, c| {
            for_each_task(3, |_| {}); // nested: must not deadlock
            c.iter_mut().for_each(|x| *x += i as u32 + 1);
        });
        for (j, x) in v.iter().enumerate() {
            assert_eq!(*x, (j / 100) as u32 + 1);
        }
    }

    #[test]
    fn a_panicking_task_is_re_raised_and_the_team_keeps_working() {
        let r = catch_unwind(|| for_each_task(8, |t| assert!(t != 5, "task 5")));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        for_each_task(8, |_| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 8);
    }
}
