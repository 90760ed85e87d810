/* Copies between the application's pageable memory and the staging buffer,
 * on several threads.  One core copies far fewer bytes a second than the
 * device link carries, so a staged copy done by the calling thread alone
 * is no faster than the runtime's own pageable copy; split over a few helper
 * threads (and overlapped with the device copies of other parts) it is.
 *
 * A job is a region cut into parts.  Parts become copyable as the caller says
 * (nvp_par_ready: to the host as each device-to-host piece arrives), and the
 * caller learns which are done (nvp_par_done: to the device as soon as they
 * are), so both directions overlap the host copy with the device copy.
 *
 * The helpers start on the first large copy, block every signal (the
 * application's handlers stay on its own threads), and are gone in a forked
 * child, which starts its own.  NVPROXY_COPY_THREADS sets how many threads
 * copy (the caller included; 1 turns this off). */
#include "shim.h"
#include "stream_copy.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PART_MIN (256u << 10) /* below this a thread's wake-up costs more than it copies */
#define SMALL_PART_MIN (64u << 10) /* nvp_par_memcpy's smallest part (copy_plan.c: STORES) */
#define SPIN_NS 200000 /* helpers poll this long for the next job before sleeping: copies come in runs */

static struct {
    pthread_mutex_t use; /* one parallel copy at a time; others copy alone */
    pthread_mutex_t mu;
    pthread_cond_t go, finished;
    int threads; /* helpers running */
    int wanted;  /* copying threads, the caller included (0: not decided yet) */
    uint64_t gen;
    int open; /* helpers may still join the current job (a helper that wakes later leaves it to the caller) */
    char *dst;
    const char *src;
    size_t n, part, nparts;
    int for_dma;          /* the destination is staging memory a DMA reads next (nvp_copy_for_dma) */
    atomic_size_t next;   /* next part to take */
    atomic_size_t ready;  /* parts below this may be taken */
    atomic_int busy;      /* helpers still on the current job */
    atomic_ullong posted; /* gen, readable without the mutex (for polling) */
    atomic_uchar done[NVP_PAR_MAX_PARTS];
} P = {.use = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
       .finished = PTHREAD_COND_INITIALIZER};

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Take the next part if it is ready: its index, or nparts when none is left, or -1 when the next is not ready */
static long take(void)
{
    size_t i = atomic_load(&P.next);
    for (;;) {
        if (i >= P.nparts)
            return (long)P.nparts;
        if (i >= atomic_load(&P.ready))
            return -1;
        if (atomic_compare_exchange_weak(&P.next, &i, i + 1))
            return (long)i;
    }
}

/* Copy into memory that a DMA reads next, with non-temporal (streaming) stores: a DMA reading memory the CPU has
 * just written with memcpy (its lines dirty in the CPU's caches) is slower than one reading memory written long
 * before; SSE2 streaming stores leave nothing in the caches, and copy as fast as memcpy, where 256-bit streaming
 * stores or flushing each line after memcpy copy more slowly (benchmarks/probes). */
void nvp_copy_for_dma(void *dst, const void *src, size_t n) { nvp_stream_copy(dst, src, n); }

void nvp_copy_small_for_dma(void *dst, const void *src, size_t n)
{
    struct nvp_host_stores how = nvp_small_stores(n);
    if (how.parallel)
        nvp_par_memcpy(dst, src, n, how.streaming);
    else if (how.streaming)
        nvp_stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

static void copy_part(size_t i)
{
    size_t off = i * P.part, len = P.n - off < P.part ? P.n - off : P.part;
    if (P.for_dma)
        nvp_copy_for_dma(P.dst + off, P.src + off, len);
    else
        memcpy(P.dst + off, P.src + off, len);
    atomic_store_explicit(&P.done[i], 1, memory_order_release);
}

static void *helper(void *arg)
{
    (void)arg;
    uint64_t seen = 0;
    for (;;) {
        /* a wake-up from the condition variable costs tens of microseconds here: poll first */
        for (uint64_t until = now_ns() + SPIN_NS; atomic_load(&P.posted) == seen && now_ns() < until;)
            ;
        pthread_mutex_lock(&P.mu);
        while (P.gen == seen)
            pthread_cond_wait(&P.go, &P.mu);
        seen = P.gen;
        int join = P.open;
        if (join)
            atomic_fetch_add(&P.busy, 1);
        pthread_mutex_unlock(&P.mu);
        if (!join)
            continue;
        for (long i; (i = take()) != (long)P.nparts;) {
            if (i >= 0)
                copy_part((size_t)i);
            else /* (the caller makes the next part ready within a device copy's time, or ends the job) */
                nvp_cpu_relax();
        }
        if (atomic_fetch_sub(&P.busy, 1) == 1) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.finished);
            pthread_mutex_unlock(&P.mu);
        }
    }
    return NULL;
}

static void start_helpers(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = nvp_settings()->copy_threads ? nvp_settings()->copy_threads : (int)(cpus / 2 < 4 ? cpus / 2 : 4);
    P.wanted = want < 1 ? 1 : want > NVP_COPY_THREADS_MAX ? NVP_COPY_THREADS_MAX : want;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < P.wanted - 1; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, helper, NULL) != 0)
            break;
        pthread_detach(t);
        P.threads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

size_t nvp_par_part(size_t n)
{
    size_t part = (n + NVP_PAR_MAX_PARTS - 1) / NVP_PAR_MAX_PARTS;
    part = part < PART_MIN ? PART_MIN : part;
    return (part + 4095) & ~(size_t)4095;
}

size_t nvp_par_begin(void *dst, const void *src, size_t n, size_t part, size_t ready, int for_dma)
{
    if (!part || n < 2 * part || (n + part - 1) / part > NVP_PAR_MAX_PARTS || pthread_mutex_trylock(&P.use) != 0)
        return 0;
    if (!P.wanted)
        start_helpers();
    if (!P.threads) {
        pthread_mutex_unlock(&P.use);
        return 0;
    }
    size_t nparts = (n + part - 1) / part;
    pthread_mutex_lock(&P.mu);
    P.dst = dst;
    P.src = src;
    P.n = n;
    P.part = part;
    P.nparts = nparts;
    P.for_dma = for_dma;
    for (size_t i = 0; i < nparts; i++)
        atomic_store_explicit(&P.done[i], 0, memory_order_relaxed);
    atomic_store(&P.next, 0);
    atomic_store(&P.ready, ready < nparts ? ready : nparts);
    atomic_store(&P.busy, 0);
    P.open = 1;
    P.gen++;
    atomic_store(&P.posted, P.gen);
    pthread_cond_broadcast(&P.go);
    pthread_mutex_unlock(&P.mu);
    return nparts;
}

void nvp_par_ready(size_t parts) { atomic_store(&P.ready, parts < P.nparts ? parts : P.nparts); }

int nvp_par_done(size_t i) { return atomic_load_explicit(&P.done[i], memory_order_acquire); }

int nvp_par_help(void)
{
    long i = take();
    if (i < 0 || i >= (long)P.nparts)
        return 0;
    copy_part((size_t)i);
    return 1;
}

void nvp_par_end(int abandon)
{
    if (abandon) /* (a device copy failed: what is not taken yet is not copied) */
        atomic_store(&P.next, P.nparts);
    else
        nvp_par_ready(P.nparts);
    while (nvp_par_help())
        ;
    pthread_mutex_lock(&P.mu); /* (only helpers that joined are waited for: a sleeping one no longer matters) */
    P.open = 0;
    pthread_mutex_unlock(&P.mu);
    for (uint64_t until = now_ns() + SPIN_NS; atomic_load(&P.busy) && now_ns() < until;)
        ;
    pthread_mutex_lock(&P.mu);
    while (atomic_load(&P.busy))
        pthread_cond_wait(&P.finished, &P.mu);
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.use);
}

void nvp_par_memcpy(void *dst, const void *src, size_t n, int for_dma)
{
    size_t parts = P.threads ? (size_t)P.threads + 1 : 4; /* (a part per thread: fewer hand-overs) */
    size_t part = ((n + parts - 1) / parts + 4095) & ~(size_t)4095;
    part = part < SMALL_PART_MIN ? SMALL_PART_MIN : part;
    if (!nvp_par_begin(dst, src, n, part, (size_t)-1, for_dma)) {
        if (for_dma)
            nvp_copy_for_dma(dst, src, n);
        else
            memcpy(dst, src, n);
        return;
    }
    nvp_par_end(0);
}

void nvp_parcopy_after_fork(void)
{
    pthread_mutex_init(&P.use, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.go, NULL);
    pthread_cond_init(&P.finished, NULL);
    P.threads = P.wanted = 0;
    atomic_store(&P.busy, 0);
}
