/* An image file to device memory through pinned bounce slots: see fileload.h.
 * In C because in Python the same design read far more slowly inside a restoring proxy than in a process of its
 * own: the reads must not wait for anything but a slot. */
#include "fileload.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "checksum.h"

#define EXPORT __attribute__((visibility("default")))
#define CUDA_ERROR_NOT_READY 600
#define POLL_NS 200000 /* the calling thread looks at copies and new slots at least this often */

struct job {
    uint32_t chunk, slot;
    uint64_t at, n; /* the piece of the chunk in the slot */
};

struct run {
    struct nvpl_load *l;
    pthread_mutex_t mu;
    pthread_cond_t for_slot;   /* readers: a slot came free, or stop */
    pthread_cond_t for_filled; /* the calling thread: a piece was read, or a reader finished */
    uint32_t *free_slots, nfree;
    struct job *filled; /* pieces read whose copies are not issued yet (a stack: order does not matter) */
    uint32_t nfilled;
    uint32_t next_chunk;
    uint32_t readers, readers_done;
    int stop;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* the first failure wins; everyone stops taking chunks (locked) */
static void fail(struct run *r, int why, int err, int64_t chunk)
{
    if (r->l->why == NVPL_OK) {
        r->l->why = why;
        r->l->err = err;
        r->l->bad_chunk = (int32_t)chunk;
    }
    r->stop = 1;
    pthread_cond_broadcast(&r->for_slot);
}

static void give_slot(struct run *r, uint32_t slot) /* (locked) */
{
    r->free_slots[r->nfree++] = slot;
    pthread_cond_signal(&r->for_slot);
}

/* a free slot, or -1 once the load stops (locked) */
static int64_t take_slot(struct run *r, double *wait_s)
{
    double t = now_s();
    while (!r->stop && r->nfree == 0)
        pthread_cond_wait(&r->for_slot, &r->mu);
    *wait_s += now_s() - t;
    return r->stop ? -1 : (int64_t)r->free_slots[--r->nfree];
}

/* One chunk, a slot-sized piece at a time; its sum is known only after its last piece was read (locked).
 * A chunk the early check found right is only read. */
static void read_chunk(struct run *r, uint32_t c, double *read_s, double *wait_s)
{
    struct nvpl_load *l = r->l;
    const struct nvpl_chunk *ch = &l->chunks[c];
    int checked = l->check && l->check_of[c] >= 0 && __atomic_load_n(&l->check->good[l->check_of[c]], __ATOMIC_ACQUIRE);
    struct nvp_xxh64_state sum;
    nvp_xxh64_start(&sum);
    for (uint64_t at = 0; at < ch->size;) {
        int64_t slot = take_slot(r, wait_s);
        if (slot < 0)
            return;
        pthread_mutex_unlock(&r->mu);
        uint64_t n = ch->size - at < l->slot_size ? ch->size - at : l->slot_size;
        void *dst = (void *)(uintptr_t)(l->slots + (uint64_t)slot * l->slot_size);
        double t = now_s();
        int err;
        int64_t off = ch->file_off + (int64_t)at;
        size_t got = checked ? nvp_pread_all(l->fd, dst, n, off, &err)
                             : nvp_pread_xxh64_part(&sum, l->fd, dst, n, off, l->piece, &err);
        int last = at + n == ch->size && !checked;
        uint64_t crc = got == n && last ? nvp_xxh64_end(&sum, dst, n) : 0;
        *read_s += now_s() - t;
        pthread_mutex_lock(&r->mu);
        if (got != n || (last && crc != ch->crc)) {
            fail(r, got != n ? NVPL_SHORT : NVPL_MISMATCH, err, c);
            give_slot(r, (uint32_t)slot);
            return;
        }
        r->filled[r->nfilled++] = (struct job){c, (uint32_t)slot, at, n};
        pthread_cond_signal(&r->for_filled);
        at += n;
    }
    l->bytes_verified += ch->size;
}

static void *reader(void *arg)
{
    struct run *r = arg;
    struct nvpl_load *l = r->l;
    double read_s = 0, wait_s = 0;
    pthread_mutex_lock(&r->mu);
    while (!r->stop && r->next_chunk < l->nchunks)
        read_chunk(r, r->next_chunk++, &read_s, &wait_s);
    r->readers_done++;
    l->read_s += read_s;
    l->slot_wait_s += wait_s;
    pthread_cond_signal(&r->for_filled);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* slots made since the last look join the free ones (locked); adopted[] remembers which */
static void adopt_slots(struct run *r, uint8_t *adopted)
{
    struct nvpl_load *l = r->l;
    uint32_t failed = 0;
    for (uint32_t i = 0; i < l->nslots; i++) {
        int32_t s = __atomic_load_n(&l->slot_state[i], __ATOMIC_ACQUIRE);
        if (s == NVPL_SLOT_READY && !adopted[i]) {
            adopted[i] = 1;
            give_slot(r, i);
        }
        failed += s == NVPL_SLOT_FAILED;
    }
    if (failed == l->nslots)
        fail(r, NVPL_NO_SLOTS, 0, -1);
}

static void wait_filled(struct run *r) /* (locked) at most POLL_NS */
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_nsec += POLL_NS;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->for_filled, &r->mu, &t);
}

/* The calling thread: issues the copies of verified chunks and frees slots whose copies are done. */
static void copy_loop(struct run *r, uint8_t *adopted, uint32_t *flight, double *issued_at)
{
    struct nvpl_load *l = r->l;
    uint32_t head = 0, nflight = 0, issued = 0;
    int check_halted = 0;
    struct job *grab = r->filled + l->nslots; /* (the second half of the same allocation) */
    pthread_mutex_lock(&r->mu);
    for (;;) {
        adopt_slots(r, adopted);
        int32_t gate = l->gate ? __atomic_load_n(l->gate, __ATOMIC_ACQUIRE) : 1;
        if (gate < 0)
            fail(r, NVPL_CANCELLED, 0, -1);
        if (gate != 0 && l->check && !check_halted) {
            nvpl_check_halt(l->check);
            check_halted = 1;
        }
        uint32_t ngrab = r->stop || gate == 0 ? 0 : r->nfilled;
        for (uint32_t i = 0; i < ngrab; i++)
            grab[i] = r->filled[i];
        r->nfilled -= ngrab;
        int reading = r->readers_done < r->readers;
        int starving = r->nfree == 0 && reading && !r->stop;
        pthread_mutex_unlock(&r->mu);

        int rc = 0;
        for (uint32_t i = 0; i < ngrab && !rc; i++) {
            const struct job *j = &grab[i];
            void *s = l->streams[issued++ % l->nstreams];
            rc = l->memcpy_async(l->chunks[j->chunk].va + j->at, l->slots + j->slot * l->slot_size, j->n, s);
            if (!rc)
                rc = l->event_record(l->events[j->slot], s, 0);
            flight[(head + nflight++) % l->nslots] = j->slot; /* (after a failure too: it is waited for) */
            issued_at[j->slot] = now_s();
        }
        uint32_t retired = 0;
        while (!rc && nflight) {
            uint32_t slot = flight[head];
            int q = (ngrab == 0 && starving && retired == 0) ? l->event_sync(l->events[slot])
                                                             : l->event_query(l->events[slot]);
            if (q == CUDA_ERROR_NOT_READY)
                break;
            rc = q;
            if (!q) {
                head = (head + 1) % l->nslots;
                nflight--;
                retired++;
                l->flight_s += now_s() - issued_at[slot];
                pthread_mutex_lock(&r->mu);
                give_slot(r, slot);
                pthread_mutex_unlock(&r->mu);
            }
        }

        pthread_mutex_lock(&r->mu);
        if (rc)
            fail(r, NVPL_CUDA, rc, -1);
        if (r->readers_done == r->readers && (r->nfilled == 0 || r->stop))
            break;
        if (ngrab == 0 && retired == 0 && (r->nfilled == 0 || gate == 0))
            wait_filled(r);
    }
    pthread_mutex_unlock(&r->mu);
    for (; nflight; nflight--, head = (head + 1) % l->nslots) { /* the slots must be idle when this returns */
        int rc = l->event_sync(l->events[flight[head]]);
        if (rc) {
            pthread_mutex_lock(&r->mu);
            fail(r, NVPL_CUDA, rc, -1);
            pthread_mutex_unlock(&r->mu);
        }
    }
}

EXPORT int nvpl_run(struct nvpl_load *l)
{
    l->why = NVPL_OK;
    l->err = 0;
    l->bad_chunk = -1;
    l->bytes_verified = 0;
    l->read_s = l->slot_wait_s = l->flight_s = 0;
    if (l->nchunks == 0)
        return NVPL_OK;
    if (l->nslots == 0 || l->nstreams == 0 || l->slot_size < 32 || l->slot_size % 32) {
        l->why = NVPL_NO_SLOTS;
        l->err = EINVAL;
        return l->why;
    }
    struct run r = {.l = l};
    uint32_t want = l->readers ? l->readers : 1;
    r.free_slots = calloc(l->nslots, sizeof *r.free_slots);
    r.filled = calloc(2 * (size_t)l->nslots, sizeof *r.filled);
    uint32_t *flight = calloc(l->nslots, sizeof *flight);
    uint8_t *adopted = calloc(l->nslots, 1);
    double *issued_at = calloc(l->nslots, sizeof *issued_at);
    pthread_t *threads = calloc(want, sizeof *threads);
    if (!r.free_slots || !r.filled || !flight || !adopted || !issued_at || !threads) {
        l->why = NVPL_THREADS;
        l->err = ENOMEM;
        goto out;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.for_filled, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&r.for_slot, NULL);
    pthread_mutex_init(&r.mu, NULL);

    pthread_mutex_lock(&r.mu); /* (readers start counting only once all are started) */
    for (; r.readers < want; r.readers++) {
        int e = pthread_create(&threads[r.readers], NULL, reader, &r);
        if (e) {
            if (r.readers == 0) {
                l->why = NVPL_THREADS;
                l->err = e;
            }
            break; /* fewer readers */
        }
    }
    pthread_mutex_unlock(&r.mu);
    if (r.readers)
        copy_loop(&r, adopted, flight, issued_at);
    for (uint32_t i = 0; i < r.readers; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.for_slot);
    pthread_cond_destroy(&r.for_filled);
out:
    free(r.free_slots);
    free(r.filled);
    free(flight);
    free(adopted);
    free(issued_at);
    free(threads);
    return l->why;
}

/* ---- the early check ---- */

struct check_run {
    struct nvpl_check *c;
    pthread_t *threads;
    uint32_t started;
    uint32_t next_chunk; /* (atomic) */
    int32_t stop;        /* (atomic) */
    pthread_mutex_t mu;  /* guards read_s */
};

static int check_one(struct check_run *r, uint32_t k, unsigned char *buf)
{
    const struct nvpl_check *c = r->c;
    const struct nvpl_chunk *ch = &c->chunks[k];
    struct nvp_xxh64_state sum;
    nvp_xxh64_start(&sum);
    size_t n = 0;
    for (uint64_t at = 0; at < ch->size; at += n) {
        if (__atomic_load_n(&r->stop, __ATOMIC_RELAXED))
            return 0;
        n = ch->size - at < c->piece ? ch->size - at : c->piece;
        int err;
        if (nvp_pread_xxh64_part(&sum, c->fd, buf, n, ch->file_off + (int64_t)at, c->piece, &err) != n)
            return 0; /* (the load reads it again and says what went wrong) */
    }
    return nvp_xxh64_end(&sum, buf, n) == ch->crc;
}

static void *checker(void *arg)
{
    struct check_run *r = arg;
    struct nvpl_check *c = r->c;
    if (c->nice)
        setpriority(PRIO_PROCESS, 0, getpriority(PRIO_PROCESS, 0) + c->nice); /* (Linux: this thread only) */
    unsigned char *buf = aligned_alloc(64, c->piece);
    double t = now_s();
    while (buf && !__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) {
        uint32_t k = __atomic_fetch_add(&r->next_chunk, 1, __ATOMIC_RELAXED);
        if (k >= c->nchunks) {
            __atomic_fetch_add(&c->finished, 1, __ATOMIC_RELEASE);
            break;
        }
        if (check_one(r, k, buf)) {
            __atomic_store_n(&c->good[k], 1, __ATOMIC_RELEASE);
            __atomic_fetch_add(&c->bytes_checked, c->chunks[k].size, __ATOMIC_RELAXED);
        }
    }
    t = now_s() - t;
    free(buf);
    pthread_mutex_lock(&r->mu);
    c->read_s += t;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

EXPORT int nvpl_check_start(struct nvpl_check *c)
{
    c->run = NULL;
    c->bytes_checked = 0;
    c->started = c->finished = 0;
    c->read_s = 0;
    if (c->piece < 32 || c->piece % 32)
        return EINVAL;
    struct check_run *r = calloc(1, sizeof *r);
    uint32_t want = c->threads ? c->threads : 1;
    if (!r || !(r->threads = calloc(want, sizeof *r->threads))) {
        free(r);
        return ENOMEM;
    }
    r->c = c;
    pthread_mutex_init(&r->mu, NULL);
    for (; r->started < want; r->started++) {
        int e = pthread_create(&r->threads[r->started], NULL, checker, r);
        if (e) {
            if (r->started == 0) {
                pthread_mutex_destroy(&r->mu);
                free(r->threads);
                free(r);
                return e;
            }
            break; /* fewer threads */
        }
    }
    c->started = r->started;
    c->run = r;
    return 0;
}

EXPORT void nvpl_check_halt(struct nvpl_check *c)
{
    struct check_run *r = c->run;
    if (r)
        __atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
}

EXPORT void nvpl_check_stop(struct nvpl_check *c)
{
    struct check_run *r = c->run;
    if (!r)
        return;
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < r->started; i++)
        pthread_join(r->threads[i], NULL);
    pthread_mutex_destroy(&r->mu);
    free(r->threads);
    free(r);
    c->run = NULL;
}
