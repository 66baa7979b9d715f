//! The engines' worker threads: one rayon pool, entered once per forward step.
//!
//! A step runs inside [`install`], so every parallel loop in it (GEMV rows, attention heads)
//! splits work among threads that are already in the pool: no hand-off from an outside thread
//! and no wait on a lock per loop, only work stealing between workers that spin briefly before
//! they park (rayon's idle loop). The thread count is fixed once, before the first step:
//! `kvlab -t N` calls [`set_num_threads`]; the default is the machine's physical cores
//! (`RAYON_NUM_THREADS` overrides it, as for any rayon program).

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// Why the thread count could not be set.
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    #[error("the thread count must be at least 1")]
    Zero,
    #[error(
        "the worker pool already runs {running} threads; set the thread count before the first step"
    )]
    AlreadyStarted { running: usize },
    #[error("could not start {threads} worker threads: {reason}")]
    Spawn { threads: usize, reason: String },
}

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

fn build(threads: usize) -> Result<rayon::ThreadPool, ThreadsError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("kvlab-worker-{i}"))
        // A program may run its whole main loop on a worker (see `install`): give workers the
        // main thread's usual stack.
        .stack_size(8 << 20)
        .build()
        .map_err(|e| ThreadsError::Spawn {
            threads,
            reason: e.to_string(),
        })
}

/// Fixes the number of worker threads.
///
/// # Errors
/// [`ThreadsError::Zero`] for 0; [`ThreadsError::AlreadyStarted`] when the pool already runs a
/// different count; [`ThreadsError::Spawn`] when the OS refuses the threads.
pub fn set_num_threads(threads: usize) -> Result<(), ThreadsError> {
    if threads == 0 {
        return Err(ThreadsError::Zero);
    }
    if let Some(p) = POOL.get() {
        return if p.current_num_threads() == threads {
            Ok(())
        } else {
            Err(ThreadsError::AlreadyStarted {
                running: p.current_num_threads(),
            })
        };
    }
    let pool = build(threads)?;
    // A racing caller may have set it first; then its count decides.
    let _ = POOL.set(pool);
    let running = POOL.get().map_or(0, rayon::ThreadPool::current_num_threads);
    if running == threads {
        Ok(())
    } else {
        Err(ThreadsError::AlreadyStarted { running })
    }
}

/// Worker threads of the pool (starting it with the default count if needed).
pub fn num_threads() -> usize {
    pool().map_or(1, rayon::ThreadPool::current_num_threads)
}

fn pool() -> Option<&'static rayon::ThreadPool> {
    if POOL.get().is_none()
        && let Ok(p) = build(default_threads())
    {
        let _ = POOL.set(p);
    }
    POOL.get()
}

/// Runs `f` on a worker of the pool, so its parallel loops stay inside the pool; on a worker
/// already, `f` just runs. Without a pool (the OS refused threads) `f` runs on the calling thread
/// and rayon's global pool serves it.
///
/// Each engine step calls this. A program that drives many steps (the CLI, xtask) runs its whole
/// loop inside one `install`: then a step hands nothing from thread to thread, the other workers
/// stay in rayon's spin-then-park loop between parallel loops, and an idle worker does not park
/// and wake once per token (measured on the stories15M shape, 2 threads: about 55 context
/// switches per token when each step was entered from the main thread, under 2 when the loop
/// ran inside).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) => p.install(f),
        None => f(),
    }
}
