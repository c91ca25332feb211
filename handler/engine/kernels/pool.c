/* The kernels' own threads: a parallel loop that holds up on a shared CPU (issue 58).
 *
 * An OpenMP region ends at a barrier that every thread of the team must reach, so a thread the
 * scheduler has taken off its core holds every region of a step until it runs again. Here a loop
 * is cut into chunks that threads claim one at a time, and the calling thread claims them too: a
 * thread that has not come takes no share, and the caller waits only for chunks already started.
 * Between loops a worker spins for a bounded time (SPIN_NS: the gaps between a step's products
 * on an idle machine are shorter, so it is there when the next loop comes), then sleeps on a futex.
 *
 * When a started chunk keeps the caller waiting (its thread lost its core to another process for
 * a time slice), the loops run on the caller alone for SOLO_NS, then try the workers again: beside
 * a process that takes a core, one thread that runs beats two that wait for each other. A shorter
 * wait is not taken for one (STRAGGLE_NS): at every token the frontend's threads and the worker's
 * own wake for ~0.5 ms each, and at 0.2 ms those wakeups sent a 1B body's 1-client steps alone
 * most of the time (docs/benchmarks.md, "Engine choices").
 *
 * One loop at a time: a caller that finds the pool busy (another thread's loop) runs its loop
 * alone. Workers start on first use; a forked child starts its own. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef void (*PoolTask)(const void *args, int64_t begin, int64_t end); /* items [begin, end) */

#define POOL_MAX 256                 /* threads, the caller included */
#define CHUNKS_PER_THREAD 8          /* chunks a loop is cut into, per thread: room to even out */
#define SPIN_NS 300000               /* a worker's spin before it sleeps */
#define STRAGGLE_NS 2000000          /* a started chunk that keeps the caller waiting this long (and 4 of
                                        its own chunks' time)... */
#define SOLO_NS 20000000             /* ...makes the loops run on the caller alone for this long */
#define YIELD_AFTER_NS 20000         /* the caller's spin for started chunks before it yields its core */

/* `next` (written by every claim) and `finished` (by every thread at a loop's end) each have a cache
 * line of their own, apart from the loop's description that the threads read: no claim evicts what
 * the others read. (On an idle 2-core Zen 3 it measured the same as one shared line.) */
#define POOL_LINE 64
static struct {
    pthread_mutex_t busy;           /* held by the caller of the loop in flight */
    int workers;                    /* started */
    uint32_t generation;            /* the latest loop's number: what workers wait on (futex word) */
    uint32_t sleepers;              /* workers asleep on `generation` */
    /* the loop in flight: written before its generation is published in `next`, read by a worker
     * once it has seen that generation there; a claim succeeds only while the loop is open, so
     * whatever a worker runs it runs with this loop's description */
    PoolTask task;
    const void *args;
    int64_t items, grain, chunks;
    int width;                      /* threads asked for, the caller included */
    int64_t solo_until;             /* CLOCK_MONOTONIC ns */
    uint64_t solos;                 /* times alone since start (ts_llm_pool_solos) */
    uint64_t next __attribute__((aligned(POOL_LINE)));    /* generation << 32 | the next chunk to claim */
    int64_t finished __attribute__((aligned(POOL_LINE)));  /* chunks of the loop in flight done, added by each thread at its end */
} pool = {PTHREAD_MUTEX_INITIALIZER};

static inline void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t pool_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void pool_sleep(uint32_t seen) {
#if defined(__linux__)
    syscall(SYS_futex, &pool.generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)seen;
    sched_yield();
#endif
}

static void pool_wake(void) {
#if defined(__linux__)
    syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, POOL_MAX, NULL, NULL, 0);
#endif
}

/* Claim and run chunks of loop `generation` until none is left, then count them done; returns how
 * many this thread ran. */
static int64_t pool_work(uint32_t generation) {
    int64_t ran = 0;
    uint64_t seen = __atomic_load_n(&pool.next, __ATOMIC_ACQUIRE);
    if ((uint32_t)(seen >> 32) != generation) return 0;
    /* next carries this loop's generation: its description was written before, and is fixed */
    const PoolTask task = pool.task;
    const void *args = pool.args;
    const int64_t items = pool.items, grain = pool.grain, chunks = pool.chunks;
    while ((uint32_t)(seen >> 32) == generation && (int64_t)(uint32_t)seen < chunks) {
        if (!__atomic_compare_exchange_n(&pool.next, &seen, seen + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;  /* seen is reloaded */
        const int64_t begin = (int64_t)(uint32_t)seen * grain;
        task(args, begin, begin + grain < items ? begin + grain : items);
        ran++;
        seen = __atomic_load_n(&pool.next, __ATOMIC_ACQUIRE);
    }
    if (ran) __atomic_add_fetch(&pool.finished, ran, __ATOMIC_RELEASE);
    return ran;
}

/* A worker: wait for a loop it is asked into (index < width - 1), spinning up to SPIN_NS, then asleep. */
static void *pool_worker(void *arg) {
    const int index = (int)(intptr_t)arg;
    uint32_t seen = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t spin_start = pool_now();
        uint32_t now;
        int spins = 0;
        while ((now = __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST)) == seen) {
            pool_relax();
            if (++spins % 64 || pool_now() - spin_start < SPIN_NS) continue;
            __atomic_add_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST) == seen) pool_sleep(seen);
            __atomic_sub_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
            spin_start = pool_now();
        }
        seen = now;
        if (index < __atomic_load_n(&pool.width, __ATOMIC_ACQUIRE) - 1) pool_work(seen);
    }
    return NULL;
}

static void pool_forked(void) {
    /* the child has none of the parent's threads; the mutex may be held by a thread that is not there */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pool.busy = fresh;
    pool.workers = 0;
    pool.sleepers = 0;
}

/* Start workers up to `wanted` (the caller holds pool.busy); returns how many there are. */
static int pool_start(int wanted) {
    static int fork_handler;
    if (!fork_handler) fork_handler = pthread_atfork(NULL, NULL, pool_forked) == 0;
    while (pool.workers < wanted) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&thread, &attr, pool_worker, (void *)(intptr_t)pool.workers);
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool.workers++;
    }
    return pool.workers;
}

/* The kernels' threads (ts_llm_set_threads): n > 0 the pool's n; 0 OpenMP's team of the threads the
 * op was given (torch's); -1 (not set) the pool with the threads the op was given. */
static int kernel_threads = -1;

#ifdef __cplusplus
extern "C"
#endif
void ts_llm_set_threads(int n) { kernel_threads = n; }

/* How often the loops went on alone (SOLO_NS each) since the process started: a neighbour's count. */
#ifdef __cplusplus
extern "C"
#endif
uint64_t ts_llm_pool_solos(void) { return __atomic_load_n(&pool.solos, __ATOMIC_RELAXED); }

/* task(args, begin, end) over [0, items) on up to `threads` threads (as ts_llm_set_threads says), the
 * caller one of them; returns when every item is done. */
static void pool_for(int threads, int64_t items, PoolTask task, const void *args) {
    if (threads > POOL_MAX) threads = POOL_MAX;
    if (kernel_threads == 0) {  /* OpenMP's team of torch's threads, as before the pool */
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int t = 0; t < threads; t++) {
            const int64_t per = (items + threads - 1) / threads, begin = t * per, end = begin + per < items ? begin + per : items;
            if (begin < end) task(args, begin, end);
        }
        return;
    }
    if (kernel_threads > 0) threads = kernel_threads;
    if (threads <= 1 || items <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        task(args, 0, items);
        return;
    }
    const int64_t start = pool_now();
    if (start < pool.solo_until || pool_start(threads - 1) == 0) {
        pthread_mutex_unlock(&pool.busy);
        task(args, 0, items);
        return;
    }
    int64_t chunks = (int64_t)threads * CHUNKS_PER_THREAD;
    if (chunks > items) chunks = items;
    pool.task = task, pool.args = args, pool.items = items;
    pool.grain = (items + chunks - 1) / chunks;
    pool.chunks = (items + pool.grain - 1) / pool.grain;
    __atomic_store_n(&pool.finished, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.width, threads, __ATOMIC_RELAXED);
    const uint32_t generation = pool.generation + 1;
    __atomic_store_n(&pool.next, (uint64_t)generation << 32, __ATOMIC_RELEASE);
    __atomic_store_n(&pool.generation, generation, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST)) pool_wake();

    const int64_t ran = pool_work(generation);
    const int64_t mine = pool_now(), chunk_ns = ran ? (mine - start) / ran : 0;
    int spins = 0;
    while (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) < pool.chunks) {
        pool_relax();
        if (++spins % 64 == 0 && pool_now() - mine > YIELD_AFTER_NS) sched_yield();  /* a worker may share our core */
    }
    /* Closed before the next loop's description is written: a thread that read `next` while chunks
     * were left, and the description after that, finds its claim refused. Without it, a claim of the
     * index one past this loop's last could succeed against the next loop's larger count. */
    __atomic_store_n(&pool.next, (uint64_t)generation << 32 | UINT32_MAX, __ATOMIC_RELEASE);
    /* longer than a few chunks of our own: a started chunk's thread lost its core */
    const int64_t waited = pool_now() - mine;
    if (waited > STRAGGLE_NS && waited > 4 * chunk_ns) {
        pool.solo_until = mine + waited + SOLO_NS;
        __atomic_add_fetch(&pool.solos, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&pool.busy);
}
