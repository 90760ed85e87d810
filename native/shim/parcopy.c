/* Copies between the application's pageable memory and the staging buffer,
 * on several threads.  One core copies 8-12 GB/s on the GPU machine while the
 * device link takes 55 GB/s, so a staged copy done by the calling thread alone
 * is no faster than the runtime's own pageable copy; split over a few helper
 * threads (and overlapped with the device copy of the previous slot) it is.
 *
 * The helpers start on the first large copy, block every signal (the
 * application's handlers stay on its own threads), and are gone in a forked
 * child, which starts its own.  NVPROXY_COPY_THREADS sets how many threads
 * copy (the caller included; 1 turns this off). */
#include "shim.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PART_MIN (512u << 10) /* below this a thread's wake-up costs more than it copies */
#define MAX_THREADS 8
#define SPIN_NS 200000 /* helpers poll this long for the next job before sleeping: copies come in runs */

static struct {
    pthread_mutex_t use; /* one parallel copy at a time; others copy alone */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int threads; /* helpers running */
    int wanted;  /* copying threads, the caller included (0: not decided yet) */
    uint64_t gen;
    char *dst;
    const char *src;
    size_t n, part;
    atomic_size_t next; /* next part to take */
    atomic_int busy;    /* helpers still copying the current job */
    atomic_ullong posted; /* gen, readable without the mutex (for polling) */
} P = {.use = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

static void take_parts(char *dst, const char *src, size_t n, size_t part)
{
    for (;;) {
        size_t i = atomic_fetch_add(&P.next, 1), off = i * part;
        if (off >= n)
            return;
        memcpy(dst + off, src + off, n - off < part ? n - off : part);
    }
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
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
        char *dst = P.dst;
        const char *src = P.src;
        size_t n = P.n, part = P.part;
        pthread_mutex_unlock(&P.mu);
        take_parts(dst, src, n, part);
        if (atomic_fetch_sub(&P.busy, 1) == 1) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.done);
            pthread_mutex_unlock(&P.mu);
        }
    }
    return NULL;
}

static void start_helpers(void)
{
    const char *env = getenv("NVPROXY_COPY_THREADS");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = env && *env ? atoi(env) : (int)(cpus / 2 < 4 ? cpus / 2 : 4);
    P.wanted = want < 1 ? 1 : want > MAX_THREADS ? MAX_THREADS : want;
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

void nvp_par_memcpy(void *dst, const void *src, size_t n)
{
    if (n < 2 * PART_MIN || pthread_mutex_trylock(&P.use) != 0) {
        memcpy(dst, src, n);
        return;
    }
    if (!P.wanted)
        start_helpers();
    if (!P.threads) {
        pthread_mutex_unlock(&P.use);
        memcpy(dst, src, n);
        return;
    }
    size_t parts = (size_t)P.threads + 1, part = (n + parts - 1) / parts;
    if (part < PART_MIN)
        part = PART_MIN;
    part = (part + 4095) & ~(size_t)4095;
    pthread_mutex_lock(&P.mu);
    P.dst = dst;
    P.src = src;
    P.n = n;
    P.part = part;
    atomic_store(&P.next, 0);
    atomic_store(&P.busy, P.threads);
    P.gen++;
    atomic_store(&P.posted, P.gen);
    pthread_cond_broadcast(&P.go);
    pthread_mutex_unlock(&P.mu);
    take_parts(dst, src, n, part);
    for (uint64_t until = now_ns() + SPIN_NS; atomic_load(&P.busy) && now_ns() < until;)
        ;
    pthread_mutex_lock(&P.mu);
    while (atomic_load(&P.busy))
        pthread_cond_wait(&P.done, &P.mu);
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.use);
}

void nvp_parcopy_after_fork(void)
{
    pthread_mutex_init(&P.use, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.go, NULL);
    pthread_cond_init(&P.done, NULL);
    P.threads = P.wanted = 0;
    atomic_store(&P.busy, 0);
}
