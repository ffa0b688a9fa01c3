//! A small persistent thread pool for data-parallel kernels: [`ThreadPool`].
//!
//! `pool.run(n_tasks, |task, thread| ..)` is a blocking parallel-for. The calling thread takes
//! part (it is thread index 0; workers are 1..n_threads). Each thread owns a contiguous range of
//! the task indices and takes them in order from its front; a thread whose range is empty
//! steals single tasks from the back of another's ([`TaskRange`]). So a thread runs long runs
//! of consecutive tasks (a matmul task is a run of weight rows, and the kernels' prefetching
//! flows from one task into the next) on a counter its core keeps in cache, while threads that
//! arrive late or run slow still share the work evenly. Nothing is allocated per call: the closure is passed to the workers as a
//! type-erased pointer plus a monomorphized trampoline, published under a generation number.
//!
//! Protocol (one job at a time, serialized by `call_lock`):
//! - `state` packs `generation << GEN_SHIFT | CLOSED | joined`. The caller writes the job
//!   fields, then stores a new generation with `joined = 0` and `CLOSED` clear (Release).
//! - A worker that sees a new, open generation *joins* by a CAS that increments `joined`; only
//!   a worker that joined may read the job fields. It then takes tasks (its own range, then
//!   stolen ones) until none are left anywhere and increments `done`.
//! - When the caller runs out of tasks it sets `CLOSED` (`fetch_or`), which tells it how many
//!   workers joined, and waits until `done` reaches that number. Workers that wake late see a
//!   closed job and go back to waiting, so a parked worker never delays a call.
//! - Idle workers wait for [`SPIN_BEFORE_PARK`], then park on a condvar; the caller notifies
//!   only when some worker is parked (`sleepers > 0`), so an idle process uses no CPU.
//! - Every wait (a worker for a job, the caller for the workers) spins only for
//!   [`SPIN_BEFORE_YIELD`] and then yields the core between checks ([`Backoff`]): when the
//!   machine has more runnable threads than cores, a thread that spun through its time slice
//!   would take the core from the very thread it waits for.
//!
//! A panic in a task is caught on whichever thread ran it, the remaining tasks are skipped, and
//! the first payload is re-raised on the caller with `resume_unwind` after every worker has
//! left the job (the closure lives on the caller's stack, so the caller must never return or
//! unwind while a worker could still call it). A `run` from inside a task (of any pool) runs
//! serially on the current thread, so nesting cannot deadlock.

use std::any::Any;
use std::cell::Cell;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins (checking for a new job) before it parks.
/// Decode calls arrive every few tens of microseconds, so this keeps workers hot during
/// generation while an idle process settles to zero CPU within a fraction of a millisecond.
pub const SPIN_BEFORE_PARK: Duration = Duration::from_micros(300);

/// How long a waiting thread spins before it yields the core between checks. Long enough to
/// catch the next job of a decode step without a system call when both threads have a core,
/// short next to a scheduler time slice.
pub const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(4);

/// The environment variable that sets the size of [`ThreadPool::global`].
pub const THREADS_ENV: &str = "PAGEKV_THREADS";

/// Largest accepted thread count (the join counter has 23 bits; this is far below it).
pub const MAX_THREADS: usize = 1024;

const GEN_SHIFT: u32 = 24;
const CLOSED: u64 = 1 << 23;
const JOINED_MASK: u64 = CLOSED - 1;

/// Errors from building a pool out of configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadPoolError {
    /// `PAGEKV_THREADS` is set but is not an integer in `1..=MAX_THREADS`.
    #[error("{THREADS_ENV}={value:?} is not a thread count: expected an integer from 1 to {MAX_THREADS}")]
    InvalidThreadCount { value: String },
    /// An OS thread could not be spawned.
    #[error("could not spawn thread pool worker: {0}")]
    Spawn(String),
    /// The process-wide pool was already sized (or built) with another thread count.
    #[error("the process-wide thread pool already has {chosen} threads; {asked} were asked for")]
    GlobalAlreadySized { chosen: usize, asked: usize },
}

thread_local! {
    /// Set while this thread runs a task of some pool: a nested `run` goes serial.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// The thread index within the pool whose task this thread is running (0 otherwise).
    static THREAD_INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The published job: a type-erased `&F` and the trampoline that knows `F`.
#[derive(Clone, Copy)]
struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize, usize),
    n_tasks: usize,
}

/// The base pointer of a slice whose disjoint chunks [`ThreadPool::for_each_chunk_mut`] hands to
/// different tasks.
struct ChunkBase<T>(*mut T);
// SAFETY: each task derives a slice of its own chunk only (see `for_each_chunk_mut`), and `T: Send`
// lets those slices be used on other threads.
unsafe impl<T: Send> Sync for ChunkBase<T> {}

impl<T> ChunkBase<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    fn get(&self) -> *mut T {
        self.0
    }
}

/// Trampoline: calls `(*data as &F)(task, thread)`.
///
/// # Safety
/// `data` must point to a live `F` (guaranteed by `run`, which outlives every worker's use).
unsafe fn trampoline<F: Fn(usize, usize) + Sync>(data: *const (), task: usize, thread: usize) {
    let f = unsafe { &*(data as *const F) };
    f(task, thread)
}

unsafe fn no_job(_: *const (), _: usize, _: usize) {}

/// A value alone on its cache lines (128 bytes: adjacent-line prefetch pairs them), so that
/// threads spinning on one counter do not slow the updates of another.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    /// `generation << GEN_SHIFT | CLOSED | joined`.
    state: Padded<AtomicU64>,
    /// Per thread index, the tasks it has not taken yet (see [`TaskRange`]).
    ranges: Box<[Padded<TaskRange>]>,
    /// Workers that joined the current job and have left it.
    done: Padded<AtomicUsize>,
    /// Written only by the caller holding `call_lock` while no worker is joined; read only by
    /// workers that joined the open generation (see the module protocol).
    job: UnsafeCell<Job>,
    /// First panic payload of the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Parking: workers wait on `wake` under `park` when idle.
    park: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
}

// SAFETY: `job` is the only non-Sync field; its accesses are ordered by the `state` protocol
// described in the module docs (writes happen-before the Release store that opens a
// generation; reads happen only after an Acquire CAS that joins that open generation, and the
// caller does not write again until every joined worker has signalled `done`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A persistent pool of `n_threads - 1` workers plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Serializes `run` calls from different threads (one job at a time).
    call_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("n_threads", &self.n_threads).finish()
    }
}

impl ThreadPool {
    /// A pool with `n_threads` threads in all (the caller counts as one; `0` is taken as `1`,
    /// counts above [`MAX_THREADS`] are clamped). Spawning failures are returned by
    /// [`ThreadPool::try_new`]; this constructor panics on them, as `std::thread::spawn` does.
    pub fn new(n_threads: usize) -> ThreadPool {
        match Self::try_new(n_threads) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`ThreadPool::new`], returning an error when an OS thread cannot be spawned.
    pub fn try_new(n_threads: usize) -> Result<ThreadPool, ThreadPoolError> {
        let n_threads = n_threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            state: Padded(AtomicU64::new(CLOSED)),
            ranges: (0..n_threads).map(|_| Padded(TaskRange::default())).collect(),
            done: Padded(AtomicUsize::new(0)),
            job: UnsafeCell::new(Job { data: std::ptr::null(), call: no_job, n_tasks: 0 }),
            panic: Mutex::new(None),
            park: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let mut pool = ThreadPool { shared, workers: Vec::new(), n_threads, call_lock: Mutex::new(()) };
        for thread in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("pagekv-worker-{thread}"))
                .spawn(move || worker_loop(&shared, thread))
                .map_err(|e| ThreadPoolError::Spawn(e.to_string()))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Sets the size of the process-wide pool ([`ThreadPool::global`]) before its first use.
    /// Once the pool exists its size is fixed: asking for another size is an error.
    pub fn set_global_threads(n_threads: usize) -> Result<(), ThreadPoolError> {
        let n_threads = n_threads.clamp(1, MAX_THREADS);
        let chosen = *GLOBAL_THREADS.get_or_init(|| n_threads);
        if chosen != n_threads {
            return Err(ThreadPoolError::GlobalAlreadySized { chosen, asked: n_threads });
        }
        Ok(())
    }

    /// The process-wide pool, built on first use with the size given to
    /// [`ThreadPool::set_global_threads`], else one thread per available core.
    pub fn global() -> Result<&'static ThreadPool, ThreadPoolError> {
        static GLOBAL: OnceLock<Result<ThreadPool, ThreadPoolError>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| ThreadPool::try_new(*GLOBAL_THREADS.get_or_init(available_threads)))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Splits `data` into consecutive chunks of `chunk_len` elements (the last may be shorter)
    /// and runs `f(chunk_index, chunk)` for each, in parallel as [`ThreadPool::run`] does. The
    /// chunks are disjoint, so each task gets its own `&mut` slice.
    pub fn for_each_chunk_mut<T, F>(&self, data: &mut [T], chunk_len: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T]) + Sync,
    {
        assert!(chunk_len > 0, "for_each_chunk_mut: chunk_len must be positive");
        let len = data.len();
        let base = ChunkBase(data.as_mut_ptr());
        self.run(len.div_ceil(chunk_len), |i, _| {
            let start = i * chunk_len;
            let end = (start + chunk_len).min(len);
            // SAFETY: task `i` alone touches `start..end`, which lies inside `data`; `data` is
            // borrowed mutably for the whole call, which returns only after every task ended.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            f(i, chunk)
        });
    }

    /// Threads taking part in `run`, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(task_index, thread_index)` once for every `task_index` in `0..n_tasks` and
    /// returns when all have finished. `thread_index < n_threads()`; the caller is thread 0.
    /// Tasks are handed out dynamically, so the task→thread mapping varies between calls.
    ///
    /// Called from inside a task (of any pool), it runs the tasks serially on the current
    /// thread, passing that thread's index. A panic in a task skips the tasks not yet started
    /// and is re-raised here once no thread is running the job any more.
    pub fn run<F>(&self, n_tasks: usize, f: F)
    where
        F: Fn(usize, usize) + Sync,
    {
        if n_tasks == 0 {
            return;
        }
        if self.n_threads == 1 || n_tasks == 1 || n_tasks > TaskRange::MAX_TASKS || IN_TASK.with(Cell::get) {
            let thread = THREAD_INDEX.with(Cell::get);
            let _guard = TaskScope::enter(thread);
            for task in 0..n_tasks {
                f(task, thread);
            }
            return;
        }
        // A poisoned lock only means an earlier caller panicked after the job was finished.
        let _call = self.call_lock.lock().unwrap_or_else(|p| p.into_inner());
        let shared = &*self.shared;

        // Publish. SAFETY: no worker is joined (the previous call waited for all joined workers
        // and closed its generation), so nobody reads `job` while we write it.
        unsafe {
            *shared.job.get() = Job { data: &f as *const F as *const (), call: trampoline::<F>, n_tasks };
        }
        for (t, range) in shared.ranges.iter().enumerate() {
            range.reset(t * n_tasks / self.n_threads, (t + 1) * n_tasks / self.n_threads);
        }
        shared.done.store(0, Ordering::Relaxed);
        let generation = (shared.state.load(Ordering::Relaxed) >> GEN_SHIFT).wrapping_add(1);
        shared.state.store(generation << GEN_SHIFT, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _park = shared.park.lock().unwrap_or_else(|p| p.into_inner());
            shared.wake.notify_all();
        }

        // Take part, then close the job and wait for the workers that joined it.
        let job = Job { data: &f as *const F as *const (), call: trampoline::<F>, n_tasks };
        // SAFETY: `f` is alive for the whole block.
        unsafe { work_on(shared, job, 0) };
        let joined = (shared.state.fetch_or(CLOSED, Ordering::AcqRel) & JOINED_MASK) as usize;
        let mut backoff = Backoff::new();
        while shared.done.load(Ordering::Acquire) != joined {
            backoff.snooze();
        }
        let payload = shared.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(payload) = payload {
            drop(_call);
            resume_unwind(payload);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _park = self.shared.park.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Marks the current thread as running a task (restored on drop, also when unwinding).
struct TaskScope {
    prev_in_task: bool,
    prev_index: usize,
}

impl TaskScope {
    fn enter(thread: usize) -> TaskScope {
        let prev_in_task = IN_TASK.with(|c| c.replace(true));
        let prev_index = THREAD_INDEX.with(|c| c.replace(thread));
        TaskScope { prev_in_task, prev_index }
    }
}

impl Drop for TaskScope {
    fn drop(&mut self) {
        IN_TASK.with(|c| c.set(self.prev_in_task));
        THREAD_INDEX.with(|c| c.set(self.prev_index));
    }
}

/// The task indices a thread has not taken yet, `front..back`, packed in one word
/// (`front << 32 | back`) so that the owner (taking from the front) and thieves (taking from
/// the back) agree through compare-and-swap on who gets each index.
#[derive(Default)]
struct TaskRange(AtomicU64);

impl TaskRange {
    /// Most tasks a job may have (indices must fit in 32 bits); larger counts run serially.
    const MAX_TASKS: usize = u32::MAX as usize;

    fn pack(front: usize, back: usize) -> u64 {
        (front as u64) << 32 | back as u64
    }

    /// Sets the range to `front..back` (the caller, before publishing a job).
    fn reset(&self, front: usize, back: usize) {
        debug_assert!(front <= back && back <= Self::MAX_TASKS);
        self.0.store(Self::pack(front, back), Ordering::Relaxed);
    }

    /// Takes the first index (the owner) or the last (a thief), if any is left.
    fn take(&self, from_front: bool) -> Option<usize> {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = ((v >> 32) as usize, (v & 0xFFFF_FFFF) as usize);
            if front >= back {
                return None;
            }
            let (next, task) =
                if from_front { (Self::pack(front + 1, back), front) } else { (Self::pack(front, back - 1), back - 1) };
            match self.0.compare_exchange_weak(v, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(task),
                Err(now) => v = now,
            }
        }
    }
}

/// The next task for `thread`: the front of its own range, else the back of another thread's
/// (the nearest after it in index order).
fn next_task(shared: &Shared, thread: usize) -> Option<usize> {
    let n = shared.ranges.len();
    shared.ranges[thread].take(true).or_else(|| (1..n).find_map(|i| shared.ranges[(thread + i) % n].take(false)))
}

/// Takes tasks (own range, then stolen) until none are left; records the first panic and makes
/// the other threads stop taking tasks.
///
/// # Safety
/// `job.data` must stay valid for the duration of the call.
unsafe fn work_on(shared: &Shared, job: Job, thread: usize) {
    let _scope = TaskScope::enter(thread);
    let result = catch_unwind(AssertUnwindSafe(|| {
        while let Some(task) = next_task(shared, thread) {
            debug_assert!(task < job.n_tasks);
            // SAFETY: forwarded from the caller's contract.
            unsafe { (job.call)(job.data, task, thread) };
        }
    }));
    if let Err(payload) = result {
        for range in shared.ranges.iter() {
            range.reset(0, 0);
        }
        let mut slot = shared.panic.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(payload);
        }
    }
}

fn worker_loop(shared: &Shared, thread: usize) {
    let mut seen = shared.state.load(Ordering::Acquire) >> GEN_SHIFT;
    loop {
        // Wait for a generation newer than `seen`: spin, then park.
        let mut state = shared.state.load(Ordering::Acquire);
        if state >> GEN_SHIFT == seen {
            let mut backoff = Backoff::new();
            loop {
                backoff.snooze();
                state = shared.state.load(Ordering::Acquire);
                if state >> GEN_SHIFT != seen || shared.shutdown.load(Ordering::Relaxed) {
                    break;
                }
                if backoff.waited() > SPIN_BEFORE_PARK {
                    let mut park = shared.park.lock().unwrap_or_else(|p| p.into_inner());
                    shared.sleepers.fetch_add(1, Ordering::SeqCst);
                    loop {
                        state = shared.state.load(Ordering::SeqCst);
                        if state >> GEN_SHIFT != seen || shared.shutdown.load(Ordering::SeqCst) {
                            break;
                        }
                        park = shared.wake.wait(park).unwrap_or_else(|p| p.into_inner());
                    }
                    shared.sleepers.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
            }
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = state >> GEN_SHIFT;
        // Join the generation if it is still open.
        loop {
            if state & CLOSED != 0 || state >> GEN_SHIFT != seen {
                break;
            }
            match shared.state.compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // SAFETY: we joined the open generation, so the job fields were written
                    // before its publication and stay valid until we signal `done`.
                    let job = unsafe { *shared.job.get() };
                    unsafe { work_on(shared, job, thread) };
                    shared.done.fetch_add(1, Ordering::Release);
                    break;
                }
                Err(now) => state = now,
            }
        }
    }
}

/// One wait: spin for [`SPIN_BEFORE_YIELD`], then yield the core on every call.
struct Backoff {
    start: Instant,
    spins: u32,
    yielding: bool,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff { start: Instant::now(), spins: 0, yielding: false }
    }

    /// Waits a little before the next check.
    #[inline]
    fn snooze(&mut self) {
        if self.yielding {
            std::thread::yield_now();
            return;
        }
        std::hint::spin_loop();
        self.spins = self.spins.wrapping_add(1);
        if self.spins.is_multiple_of(16) && self.start.elapsed() > SPIN_BEFORE_YIELD {
            self.yielding = true;
        }
    }

    /// Time since the wait began (checked only every few spins while spinning).
    fn waited(&self) -> Duration {
        if self.yielding || self.spins.is_multiple_of(16) {
            self.start.elapsed()
        } else {
            Duration::ZERO
        }
    }
}

/// Size of the process-wide pool, fixed at its first use.
static GLOBAL_THREADS: OnceLock<usize> = OnceLock::new();

/// One thread per available core (at most [`MAX_THREADS`]).
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(MAX_THREADS)
}

/// Thread count from `PAGEKV_THREADS` as `lookup` gives it, or the number of available cores
/// when it is unset.
pub fn threads_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<usize, ThreadPoolError> {
    match lookup(THREADS_ENV) {
        Some(value) => parse_thread_count(&value),
        None => Ok(available_threads()),
    }
}

/// Parses a thread count in `1..=MAX_THREADS`.
pub fn parse_thread_count(value: &str) -> Result<usize, ThreadPoolError> {
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(ThreadPoolError::InvalidThreadCount { value: value.to_string() }),
    }
}
