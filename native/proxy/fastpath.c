/* The proxy's native fast path (see fastpath.h).  Runs on the dispatcher
 * thread only; Python calls in with the GIL released. */
#define _GNU_SOURCE /* (process_vm_readv) */
#include "fastpath.h"
#include "reach.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "libexec.h"
#include "nvproxy_wire.h"

#define EXPORT __attribute__((visibility("default")))

/* cuLaunchKernel's `extra` keys */
#define LAUNCH_PARAM_END ((void *)0x00)
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define ERR_NOT_READY 600 /* CUDA_ERROR_NOT_READY, cudaErrorNotReady */
#define MAX_PARAM_BYTES 32768 /* CUDA 12.1+ kernels take up to 32 KiB of parameters */

/* ---- a small open-addressing map, uint64 -> entry ---- */
struct entry {
    uint64_t key;
    int used;
    void *handle;
    uint64_t ticket; /* (lanes only) */
    uint32_t nparams;
    uint32_t *offsets;
};

struct map {
    struct entry *slots;
    size_t cap, count;
};

static size_t hash(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17); }

static struct entry *map_find(const struct map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slots[i].used)
            return NULL;
        if (m->slots[i].key == key)
            return &m->slots[i];
    }
}

static struct entry *map_put(struct map *m, uint64_t key)
{
    struct entry *e = map_find(m, key);
    if (e)
        return e;
    if (2 * (m->count + 1) > m->cap) { /* grow: rehash everything */
        size_t ncap = m->cap ? 2 * m->cap : 64;
        struct entry *ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return NULL;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slots[i].used)
                continue;
            size_t j = hash(m->slots[i].key) & (ncap - 1);
            while (ns[j].used)
                j = (j + 1) & (ncap - 1);
            ns[j] = m->slots[i];
        }
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    size_t i = hash(key) & (m->cap - 1);
    while (m->slots[i].used)
        i = (i + 1) & (m->cap - 1);
    m->slots[i].used = 1;
    m->slots[i].key = key;
    m->count++;
    return &m->slots[i];
}

static void map_clear(struct map *m)
{
    for (size_t i = 0; i < m->cap; i++)
        free(m->slots[i].offsets);
    free(m->slots);
    m->slots = NULL;
    m->cap = m->count = 0;
}

/* ---- state ---- */
static struct nvpf_driver D;
static int ready, text_fd = -1, translating, capturing;
static int by_mailbox; /* the request being executed may be answered through its channel's mailbox */
static volatile int text_pending;
static int may_print; /* a module loaded that may print (kernel printf): the driver writes its text at each wait */
static long spin_ns = 50000;
/* A thread alone in its process holds up no other thread while the dispatcher
 * polls for it, so it may poll much longer: a hand-off to a Python waiter
 * thread costs tens of microseconds (a 4 MiB copy takes 80). */
static long exclusive_spin_ns = 5000000;
static struct map kernels, streams, events, execs, lanes; /* lanes: see offload */
static _Alignas(64) unsigned char params[MAX_PARAM_BYTES];

EXPORT int nvpf_init(const struct nvpf_driver *drv, unsigned spin_us, unsigned exclusive_spin_us)
{
    D = *drv;
    spin_ns = (long)spin_us * 1000;
    exclusive_spin_ns = (long)exclusive_spin_us * 1000;
    ready = 1;
    return 0;
}

static uint64_t kernel_key(int dev, uint64_t id) { return id << 8 | (uint64_t)(dev & 0xff); }

EXPORT void nvpf_learn_kernel(int dev, uint64_t id, void *func, uint32_t nparams, const uint32_t *offsets)
{
    struct entry *e = map_put(&kernels, kernel_key(dev, id));
    if (!e)
        return;
    free(e->offsets);
    e->offsets = NULL;
    e->handle = func;
    e->nparams = nparams;
    if (nparams && (e->offsets = malloc(nparams * sizeof *offsets)))
        memcpy(e->offsets, offsets, nparams * sizeof *offsets);
    else if (nparams) /* without its layout C cannot launch it cooperatively: forget it */
        e->nparams = UINT32_MAX;
}

EXPORT void nvpf_learn_stream(uint64_t id, void *handle)
{
    struct entry *e = map_put(&streams, id);
    if (e)
        e->handle = handle;
}

EXPORT void nvpf_learn_event(uint64_t id, void *handle)
{
    struct entry *e = map_put(&events, id);
    if (e)
        e->handle = handle;
}

EXPORT void nvpf_learn_graph_exec(uint64_t id, void *handle)
{
    struct entry *e = map_put(&execs, id);
    if (e)
        e->handle = handle;
}

static void *sync_streams[NVPF_MAX_DEV][NVPF_SYNC_STREAMS];
static int nsync[NVPF_MAX_DEV]; /* 1 + how many streams; 0: not known (so that zero-initialised means unknown) */

/* Calls that issued work other than posted copies, so far (C's and Python's).  A posted copy writes only device
 * memory the program reaches through later work on the device, so no host can tell whether a synchronous copy
 * waited for one: back to back, the runtime's small pageable copies each wait for the last one's DMA; ours need
 * not. */
static uint64_t issued;
static uint64_t idle_mark[NVPF_MAX_DEV]; /* 1 + issued when dev's sync streams were last seen idle; 0: not since */

EXPORT void nvpf_note_issue(void) { __atomic_add_fetch(&issued, 1, __ATOMIC_RELAXED); }

EXPORT void nvpf_forget_all(void)
{
    map_clear(&kernels);
    map_clear(&streams);
    map_clear(&events);
    map_clear(&execs);
    memset(nsync, 0, sizeof nsync);
    memset(idle_mark, 0, sizeof idle_mark);
}

EXPORT void nvpf_set_sync_streams(int dev, void **handles, int n)
{
    if (dev < 0 || dev >= NVPF_MAX_DEV)
        return;
    if (n > 0 && n <= NVPF_SYNC_STREAMS)
        memcpy(sync_streams[dev], handles, (size_t)n * sizeof *handles);
    nsync[dev] = n < 0 ? 0 : n + 1;
    idle_mark[dev] = 0;
}

EXPORT void nvpf_set_text_fd(int fd) { text_fd = fd; }
EXPORT void nvpf_set_translating(int on) { translating = on; }
EXPORT void nvpf_set_text_pending(int on) { text_pending = on; }
EXPORT void nvpf_set_may_print(int on) { may_print = on; }

static struct nvpf_stats stats; /* (the dispatcher's alone: counted per serve, and per request where C runs it) */
EXPORT const struct nvpf_stats *nvpf_stats(void) { return &stats; }

/* ---- execution ---- */
enum { DONE, TO_PYTHON, REPLY_BY_PYTHON };

static void async_failed(struct nvpf_chan *ch, int rc)
{
    if (rc && !ch->async_err)
        ch->async_err = rc;
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* ---- launches of several threads at once, issued on worker threads ----
 * While C serves several channels, a launch on a stream other than the legacy one goes to a worker thread (see
 * lanes) and the dispatcher goes on to the next call: the driver issues launches on different streams in
 * parallel, as it does for the application's own threads natively.  Launches on one stream stay in order on one
 * worker.  Every other call, and every return to Python, first waits until the workers have issued what they hold
 * (drain), so nothing else can overtake a launch. */
#define LAUNCH_THREADS_MAX 8
/* A worker's queue: at most ~0.3 ms of launches (4-6 us each), under the millisecond a thread spins for its
 * mailbox slot before it naps (mailbox.c).  A launch that finds it full is passed over (see "passed over in call
 * order"). */
#define WORK_RING 64
#define WORK_PARAMS 4096 /* (larger parameter blocks are launched by the dispatcher) */
#define WORKER_SPIN_NS 200000

struct work {
    void *func, *stream, *ctx;
    struct nvpf_chan *ch;
    unsigned g[3], b[3], shmem;
    uint32_t plen;
    _Alignas(16) unsigned char params[WORK_PARAMS];
};

struct worker {
    pthread_t thread;
    _Alignas(64) uint64_t head; /* works enqueued (the dispatcher's) */
    _Alignas(64) uint64_t tail; /* works issued (the worker's) */
    int sleeping;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    void *ctx; /* the worker's current context */
    struct work ring[WORK_RING];
};

static int launch_threads = 4, nworkers, offloading;
static struct worker *workers;
/* lanes: a stream handle -> 1 + the worker that issues its launches (nparams), and that worker's head after the
 * stream's last launch (ticket).  A stream whose launches have all been issued goes to the worker of the channel
 * launching on it, so that each application thread's launches are issued by a worker of their own, as the thread
 * issues them natively; while some are still to be issued it stays, which keeps a stream's launches in order.
 * A channel's worker (its home) is given in turn at its first launch: a hash of the stream handles can put two
 * threads' streams on one worker, and the channel's place among those served changes from one serve to the next
 * while a stream that never runs dry keeps the worker it first had.  Lanes are kept when handles are forgotten:
 * they are only places. */
static uint32_t homes_given;
static uint64_t enqueued; /* works given to workers and perhaps not yet issued (drain: 0) */

EXPORT void nvpf_set_launch_threads(int n) { launch_threads = n < 0 ? 0 : n > LAUNCH_THREADS_MAX ? LAUNCH_THREADS_MAX : n; }

static void issue(struct worker *w, const struct work *x)
{
    if (w->ctx != x->ctx && D.ctx_set_current(x->ctx) == 0)
        w->ctx = x->ctx;
    size_t size = x->plen;
    void *extra[] = {LAUNCH_PARAM_BUFFER_POINTER, (void *)x->params, LAUNCH_PARAM_BUFFER_SIZE, &size,
                     LAUNCH_PARAM_END};
    int rc = D.launch(x->func, x->g[0], x->g[1], x->g[2], x->b[0], x->b[1], x->b[2], x->shmem, x->stream, NULL,
                      x->plen ? extra : NULL);
    int none = 0; /* (two workers may fail for one channel at once: the first error stays) */
    if (rc)
        __atomic_compare_exchange_n(&x->ch->async_err, &none, rc, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static void *work_loop(void *arg)
{
    struct worker *w = arg;
    for (;;) {
        uint64_t t = w->tail;
        long until = now_ns() + WORKER_SPIN_NS;
        while (__atomic_load_n(&w->head, __ATOMIC_ACQUIRE) == t) {
            if (now_ns() < until) {
                nvp_cpu_relax();
                continue;
            }
            pthread_mutex_lock(&w->lock); /* (sleeping, then head: the dispatcher stores head, then reads sleeping) */
            __atomic_store_n(&w->sleeping, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&w->head, __ATOMIC_SEQ_CST) == t)
                pthread_cond_wait(&w->wake, &w->lock);
            __atomic_store_n(&w->sleeping, 0, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&w->lock);
        }
        issue(w, &w->ring[t % WORK_RING]);
        __atomic_store_n(&w->tail, t + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* the workers, made the first time several channels are served (0 where they cannot be) */
static int start_workers(void)
{
    if (!launch_threads || !D.ctx_get_current || !D.ctx_set_current)
        return 0;
    if (nworkers)
        return nworkers;
    workers = calloc((size_t)launch_threads, sizeof *workers);
    if (!workers)
        return 0;
    for (int i = 0; i < launch_threads; i++) {
        struct worker *w = &workers[i];
        pthread_mutex_init(&w->lock, NULL);
        pthread_cond_init(&w->wake, NULL);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* (signals are the Python thread's) */
        int rc = pthread_create(&w->thread, NULL, work_loop, w);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc)
            break;
        nworkers = i + 1;
    }
    return nworkers;
}

/* Every launch given to a worker has been issued. */
static void drain(void)
{
    if (!enqueued)
        return;
    for (int i = 0; i < nworkers; i++) {
        struct worker *w = &workers[i];
        uint64_t h = __atomic_load_n(&w->head, __ATOMIC_RELAXED);
        while (__atomic_load_n(&w->tail, __ATOMIC_ACQUIRE) != h)
            nvp_cpu_relax();
    }
    enqueued = 0;
}

static void *current_ctx;

/* The worker that issues channel ch's launch on stream s (-1: none can be had), and the stream's lane. */
static int lane_worker(struct nvpf_chan *ch, void *s, struct entry **lane_out)
{
    int n = nworkers < launch_threads ? nworkers : launch_threads; /* (made once: fewer may be asked for since) */
    struct entry *lane = map_find(&lanes, (uint64_t)(uintptr_t)s);
    if (!lane && !(lane = map_put(&lanes, (uint64_t)(uintptr_t)s)))
        return -1;
    uint32_t wi = lane->nparams - 1;
    if (!lane->nparams || wi >= (uint32_t)n || __atomic_load_n(&workers[wi].tail, __ATOMIC_ACQUIRE) >= lane->ticket) {
        if (!ch->home)
            ch->home = 1 + homes_given++;
        wi = (ch->home - 1) % (uint32_t)n;
    }
    *lane_out = lane;
    return (int)wi;
}

static int queue_full(const struct worker *w)
{
    return w->head - __atomic_load_n(&w->tail, __ATOMIC_ACQUIRE) >= WORK_RING;
}

/* A plain launch on stream s to its worker (waiting for room in its queue): 1, or 0 where the dispatcher launches
 * it itself. */
static int offload(struct nvpf_chan *ch, void *func, const unsigned g[3], const unsigned b[3], unsigned shmem, void *s,
                   const uint8_t *payload, size_t plen)
{
    struct entry *lane;
    int wi;
    if (!offloading || !s || plen > WORK_PARAMS || (wi = lane_worker(ch, s, &lane)) < 0)
        return 0;
    struct worker *w = &workers[wi];
    while (queue_full(w))
        nvp_cpu_relax();
    uint64_t h = w->head;
    struct work *x = &w->ring[h % WORK_RING];
    x->func = func; /* (field by field: a compound literal would clear the whole parameter block too) */
    x->stream = s;
    x->ctx = current_ctx;
    x->ch = ch;
    x->shmem = shmem;
    x->plen = (uint32_t)plen;
    memcpy(x->g, g, sizeof x->g);
    memcpy(x->b, b, sizeof x->b);
    memcpy(x->params, payload, plen);
    __atomic_store_n(&w->head, h + 1, __ATOMIC_SEQ_CST);
    lane->nparams = (uint32_t)wi + 1;
    lane->ticket = h + 1;
    if (__atomic_load_n(&w->sleeping, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&w->lock);
        pthread_cond_signal(&w->wake);
        pthread_mutex_unlock(&w->lock);
    }
    enqueued++;
    return 1;
}

/* stream wire ids: 0 the legacy default stream, 2 the thread's per-thread stream */
static int stream_of(const struct nvpf_chan *ch, uint64_t wire, void **out)
{
    if (wire == 0) {
        *out = NULL;
        return 1;
    }
    if (wire == 2) {
        if (ch->dev < 0 || ch->dev >= NVPF_MAX_DEV || !ch->per_thread[ch->dev])
            return 0;
        *out = ch->per_thread[ch->dev];
        return 1;
    }
    struct entry *e = map_find(&streams, wire);
    if (!e)
        return 0;
    *out = e->handle;
    return 1;
}

static int lib_stream_of(void *ch, uint64_t wire, void **out) { return stream_of(ch, wire, out); }

static int event_of(uint64_t wire, void **out)
{
    struct entry *e = map_find(&events, wire);
    if (!e)
        return 0;
    *out = e->handle;
    return 1;
}

/* Poll for a short while: most waits find short work already done.  The query's answer (ERR_NOT_READY: not done
 * within limit_ns). */
static int done_soon(int (*query)(void *), void *h, long limit_ns)
{
    long end = now_ns() + limit_ns;
    for (;;) {
        int rc = query(h);
        if (rc != ERR_NOT_READY || now_ns() > end)
            return rc;
    }
}

/* ---- posted copies ---- */

EXPORT void nvpf_posted_publish(struct nvpf_chan *ch, uint64_t n)
{
    struct nvp_mailbox *mb = ch->mailbox;
    if (!mb)
        return;
    uint64_t cur = __atomic_load_n(&mb->posted_done, __ATOMIC_ACQUIRE);
    while (cur < n && !__atomic_compare_exchange_n(&mb->posted_done, &cur, n, 0, __ATOMIC_RELEASE,
                                                   __ATOMIC_ACQUIRE))
        ; /* (C and a Python waiter thread may both publish: the larger stays) */
}

static void *posted_event(const struct nvpf_chan *ch, uint32_t k) { return ch->posted_events[k % NVPF_POSTED]; }

/* (Python makes the ring of events, on the channel's current device) */
static int ring_ready(const struct nvpf_chan *ch) { return ch->posted_events[0] && ch->posted_dev == ch->dev; }

static void posted_pop(struct nvpf_chan *ch)
{
    uint64_t n = ch->posted_num[ch->posted_first % NVPF_POSTED];
    ch->posted_first++;
    ch->posted_count--;
    nvpf_posted_publish(ch, n);
}

EXPORT void nvpf_posted_advance(struct nvpf_chan *ch)
{
    /* (a failed query counts as done: the failure is the context's, and every later call reports it) */
    while (ch->posted_count && D.event_query(posted_event(ch, ch->posted_first)) != ERR_NOT_READY)
        posted_pop(ch);
}

EXPORT int nvpf_posted_drain(struct nvpf_chan *ch)
{
    int first = 0;
    while (ch->posted_count) {
        int rc = D.event_sync(posted_event(ch, ch->posted_first));
        first = first ? first : rc;
        posted_pop(ch);
    }
    return first;
}

EXPORT int nvpf_posted_order(struct nvpf_chan *ch, void *stream)
{
    for (uint32_t i = 0; i < ch->posted_count; i++) {
        int rc = D.stream_wait_event(stream, posted_event(ch, ch->posted_first + i), 0);
        if (rc)
            return rc;
    }
    return 0;
}

EXPORT int nvpf_posted_events(struct nvpf_chan *ch, uint64_t upto, void **out)
{
    int n = 0;
    for (uint32_t i = 0; i < ch->posted_count && ch->posted_num[(ch->posted_first + i) % NVPF_POSTED] <= upto; i++)
        out[n++] = posted_event(ch, ch->posted_first + i);
    return n;
}

EXPORT int nvpf_posted_push(struct nvpf_chan *ch, void *stream, uint64_t num)
{
    int rc = 0;
    if (ch->posted_count == NVPF_POSTED) { /* (the shim keeps fewer in flight: not reached) */
        rc = D.event_sync(posted_event(ch, ch->posted_first));
        posted_pop(ch);
    }
    uint32_t k = ch->posted_first + ch->posted_count;
    if (!rc && !(rc = D.event_record(posted_event(ch, k), stream, 0))) {
        ch->posted_num[k % NVPF_POSTED] = num;
        ch->posted_count++;
    }
    return rc;
}

/* Are the posted copies up to number upto done?  Spins up to limit_ns for them. */
static int posted_done_soon(struct nvpf_chan *ch, uint64_t upto, long limit_ns)
{
    long end = now_ns() + limit_ns;
    for (;;) {
        nvpf_posted_advance(ch);
        if (!ch->posted_count || ch->posted_num[ch->posted_first % NVPF_POSTED] > upto)
            return 1;
        if (now_ns() > end)
            return 0;
        nvp_cpu_relax();
    }
}

/* Has every stream a synchronous copy on dev waits for finished its work?  Spins up to limit_ns for them: the
 * runtime's pageable copy waits so, then returns before its DMA ends.  -1: C does not know those streams. */
static int sync_idle_soon(int dev, long limit_ns)
{
    if (dev < 0 || dev >= NVPF_MAX_DEV || !nsync[dev])
        return -1;
    int n = nsync[dev] - 1;
    if (n > NVPF_SYNC_STREAMS)
        return 0;
    long end = now_ns() + limit_ns;
    for (int i = 0; i < n;) {
        if (D.stream_query(sync_streams[dev][i]) != ERR_NOT_READY)
            i++; /* (a failed query: the copy itself reports the failure) */
        else if (now_ns() > end)
            return 0;
        else
            nvp_cpu_relax();
    }
    return 1;
}

static int text_waiting(void)
{
    if (text_pending)
        return 1;
    /* (only the driver's kernel printf text and a math library's log write to the proxy's stdout) */
    if (text_fd < 0 || (!may_print && !nvpl_any_open()))
        return 0;
    struct pollfd p = {.fd = text_fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* Reply from here when nothing may come before it (Python's queued replies,
 * kernel printf text); else leave it to Python. */
static int reply_with(struct nvpf_chan *ch, int err, const uint64_t r4[4], const uint8_t *out, size_t n,
                      int may_defer);
static int reply_r0(struct nvpf_chan *ch, int err, uint64_t r0);

static int reply(struct nvpf_chan *ch, int err) { return reply_r0(ch, err, 0); }

/* (r0: a result, lost where Python sends the reply: none that a caller cannot do without) */
static int reply_r0(struct nvpf_chan *ch, int err, uint64_t r0)
{
    uint64_t r4[4] = {r0, 0, 0, 0};
    return reply_with(ch, err, r4, NULL, 0, 1);
}

/* The reply with r0..r3 and n bytes of payload at out; may_defer: Python sends it (err alone) where something must
 * come before it, else the caller checked that nothing must. */
static int reply_with(struct nvpf_chan *ch, int err, const uint64_t r4[4], const uint8_t *out, size_t n,
                      int may_defer)
{
    ch->reply_err = err;
    ch->wait_kind = NVPF_WAIT_NONE;
    if (may_defer && (ch->pending || text_waiting()))
        return REPLY_BY_PYTHON;
    struct nvp_rep r;
    memset(&r, 0, sizeof r);
    r.len = (uint32_t)(sizeof r + n);
    r.err = err;
    r.async_err = ch->async_err;
    memcpy(r.r, r4, sizeof r.r);
    struct nvp_mailbox *mb = ch->mailbox;
    if (!n && mb && by_mailbox && __atomic_load_n(&mb->state, __ATOMIC_RELAXED) == NVP_MB_EMPTY) {
        /* the thread is spinning for it: no system call on either side (nvproxy_wire.h) */
        memcpy(&mb->rep, &r, sizeof r);
        uint32_t empty = NVP_MB_EMPTY;
        if (__atomic_compare_exchange_n(&mb->state, &empty, NVP_MB_FULL, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            ch->async_err = 0;
            return DONE;
        }
    }
    struct iovec iov[2] = {{&r, sizeof r}, {(void *)out, n}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = n ? 2 : 1};
    ssize_t k = sendmsg(ch->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k <= 0 && may_defer)
        return REPLY_BY_PYTHON; /* full (or closed): Python's blocking send deals with it */
    /* a partial write: finish it here, the stream must stay framed */
    size_t off = k > 0 ? (size_t)k : 0, total = sizeof r + n;
    while (off < total) {
        const uint8_t *from = off < sizeof r ? (const uint8_t *)&r + off : out + (off - sizeof r);
        size_t left = off < sizeof r ? sizeof r - off : total - off;
        k = send(ch->fd, from, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0)
            off += (size_t)k;
        else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd p = {.fd = ch->fd, .events = POLLOUT};
            poll(&p, 1, 1000);
        } else
            break;
    }
    ch->async_err = 0;
    if (mb)
        __atomic_fetch_add(&mb->replied, 1, __ATOMIC_RELEASE);
    return DONE;
}

static int wait_then_reply(struct nvpf_chan *ch, int kind, void *h)
{
    int (*query)(void *) = kind == NVPF_WAIT_STREAM ? D.stream_query : D.event_query;
    int (*wait)(void *) = kind == NVPF_WAIT_STREAM ? D.stream_sync : D.event_sync;
    int rc = ch->pending ? ERR_NOT_READY : done_soon(query, h, ch->exclusive ? exclusive_spin_ns : spin_ns);
    if (rc == ERR_NOT_READY) {
        ch->wait_kind = kind;
        ch->wait_handle = h;
        ch->reply_err = 0;
        return REPLY_BY_PYTHON;
    }
    /* done: where no kernel can print, the query's success is the wait's; else the real wait makes the driver flush
     * kernel printf text (it costs little now) and reports errors as a native wait would */
    return reply(ch, rc == 0 && !may_print ? 0 : wait(h));
}

static int launch(struct nvpf_chan *ch, const struct nvp_req *q, const uint8_t *payload, size_t plen)
{
    void *s;
    struct entry *k = map_find(&kernels, kernel_key(ch->dev, q->a[0]));
    if (!k || !stream_of(ch, q->a[5], &s) || plen > sizeof params)
        return TO_PYTHON;
    unsigned gx = (unsigned)q->a[1], gy = (unsigned)(q->a[1] >> 32), gz = (unsigned)q->a[2];
    unsigned bx = (unsigned)(q->a[2] >> 32), by = (unsigned)q->a[3], bz = (unsigned)(q->a[3] >> 32);
    unsigned shmem = (unsigned)q->a[4];
    if (!(q->a[6] & NVP_LAUNCH_COOPERATIVE)) {
        const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
        if (offload(ch, k->handle, g, b, shmem, s, payload, plen))
            return DONE;
    }
    drain(); /* (after what the workers hold: this one may be on the legacy stream, or too large for them) */
    memcpy(params, payload, plen); /* aligned, whatever the message's place in the buffer */
    int rc;
    if (q->a[6] & NVP_LAUNCH_COOPERATIVE) {
        if (k->nparams == UINT32_MAX || k->nparams > 1024)
            return TO_PYTHON;
        void *ptrs[1024];
        for (uint32_t i = 0; i < k->nparams; i++) {
            if (k->offsets[i] >= plen && plen)
                return TO_PYTHON;
            ptrs[i] = params + k->offsets[i];
        }
        rc = D.launch_cooperative(k->handle, gx, gy, gz, bx, by, bz, shmem, s, ptrs);
    } else if (plen) {
        size_t size = plen;
        void *extra[] = {LAUNCH_PARAM_BUFFER_POINTER, params, LAUNCH_PARAM_BUFFER_SIZE, &size, LAUNCH_PARAM_END};
        rc = D.launch(k->handle, gx, gy, gz, bx, by, bz, shmem, s, NULL, extra);
    } else {
        rc = D.launch(k->handle, gx, gy, gz, bx, by, bz, shmem, s, NULL, NULL);
    }
    async_failed(ch, rc);
    return DONE;
}

/* Has dev issued nothing but posted copies since its sync streams were last seen idle? */
static int idle_since(int dev)
{
    return dev >= 0 && dev < NVPF_MAX_DEV && idle_mark[dev] == 1 + __atomic_load_n(&issued, __ATOMIC_RELAXED);
}

/* A captured copy's bytes, from the program's pinned memory into the staging buffer: 0 where [src, src + n) is not
 * this process's readable memory (a bad address fails here, not with a fault). */
static int take_bytes(uint64_t to, uint64_t src, uint64_t n)
{
    struct iovec local = {(void *)(uintptr_t)to, (size_t)n}, remote = {(void *)(uintptr_t)src, (size_t)n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

/* A posted host-to-device copy: answered as soon as it is issued (cudaMemcpyAsync), or once the streams a
 * synchronous copy waits for are idle but for posted copies; else once it is done, as other staged copies are.
 * A captured one (capture: its pinned source) has its bytes taken into the staging buffer when it is answered
 * early; else it copies from the source itself. */
static int posted_copy(struct nvpf_chan *ch, uint64_t dst, uint64_t host, uint64_t n, void *s, uint64_t num,
                       int is_async, uint64_t capture)
{
    if (!ring_ready(ch))
        return TO_PYTHON;
    int early = 1;
    if (!is_async && !idle_since(ch->dev)) {
        uint64_t mark = 1 + __atomic_load_n(&issued, __ATOMIC_RELAXED);
        if ((early = sync_idle_soon(ch->dev, ch->exclusive ? exclusive_spin_ns : spin_ns)) < 0)
            return TO_PYTHON; /* (Python tells C the streams) */
        if (early) {
            idle_mark[ch->dev] = mark;
            if (ch->posted_count)
                nvpf_posted_advance(ch); /* (those the streams were busy with are done: their place is free) */
        }
    }
    /* Answered first, then issued: the driver copies a small copy's bytes into its command stream as it issues it,
     * which takes a while (benchmarks/probes/issue_cost.cu), and the thread can stage its next copy meanwhile.
     * The shim posts only into device memory it knows, so the issue hardly fails; where it does, the next reply
     * carries the error. */
    if (capture && early && !take_bytes(host, capture, n))
        early = 0; /* (the driver then reports the address) */
    if (capture && !early)
        host = capture;
    int answered = early ? reply_r0(ch, 0, capture ? 0 : NVP_STAGED_RUN) : -1;
    int rc = D.memcpy_async(dst, host, (size_t)n, s);
    uint32_t k = ch->posted_first + ch->posted_count;
    if (!rc)
        rc = nvpf_posted_push(ch, s, num);
    if (rc) {
        if (answered < 0)
            return reply(ch, rc);
        async_failed(ch, rc);
        return answered;
    }
    if (answered >= 0)
        return answered;
    return wait_then_reply(ch, NVPF_WAIT_EVENT, posted_event(ch, k));
}

/* A posted copy the shim sent without a reply (NVP_STAGED_UNANSWERED): it knows the answer (shim memory.c, "a
 * run"), so only its issue is left; a failure goes to the next reply, as an asynchronous error. */
static int posted_unanswered(struct nvpf_chan *ch, uint64_t dst, uint64_t host, uint64_t n, void *s, uint64_t num)
{
    if (!ring_ready(ch))
        return TO_PYTHON;
    int rc = D.memcpy_async(dst, host, (size_t)n, s);
    async_failed(ch, rc ? rc : nvpf_posted_push(ch, s, num));
    return DONE;
}

/* ---- copies to the host in pieces ----
 * The shim asks for a copy from the device in pieces, all requests at once, and copies each piece out of the
 * staging buffer as its reply comes (memory.c, whole_d2h).  Executed one by one, each piece's DMA began only once
 * the last one's was seen done; so the requests that follow in the buffer are issued at once, each with its own
 * event of the ring, and their turns only wait.  Only a run of such requests, next in seq order, on the same
 * stream: nothing else can come between them. */
static const uint8_t *rest; /* what follows the request being executed in nvpf_run's buffer */
static size_t rest_len;

static int staging_range_ok(const struct nvpf_chan *ch, uint64_t off, uint64_t n)
{
    return ch->staging_base && off <= ch->staging_size && n <= ch->staging_size - off;
}

static void issue_ahead(struct nvpf_chan *ch, const struct nvp_req *q, void *s)
{
    size_t at = 0;
    ch->ahead_seq = q->seq + 1;
    ch->ahead_ev = ch->copy_next;
    ch->ahead_n = 0;
    while (ch->ahead_n < NVPF_COPY_EVENTS - 1 && rest_len - at >= sizeof(struct nvp_req)) {
        struct nvp_req m;
        memcpy(&m, rest + at, sizeof m);
        if (m.len != sizeof m || at + m.len > rest_len || m.seq != ch->ahead_seq + ch->ahead_n ||
            m.op != NVP_OP_STAGED_COPY || !(m.flags & NVP_F_REPLY) || !m.a[4] || m.a[3] != q->a[3] ||
            !staging_range_ok(ch, m.a[1], m.a[2]))
            break;
        void *ev = ch->copy_events[ch->copy_next % NVPF_COPY_EVENTS];
        if (D.memcpy_async(ch->staging_base + m.a[1], m.a[0], (size_t)m.a[2], s) || D.event_record(ev, s, 0))
            break; /* (its turn issues it again and reports the failure) */
        ch->copy_next++;
        ch->ahead_n++;
        at += m.len;
    }
}

/* Does q issue work that a synchronous copy waits for (see issued)?  Waits, queries and posted copies do not. */
static int issues_work(const struct nvp_req *q)
{
    switch (q->op) {
    case NVP_OP_STAGED_COPY:
        return q->a[4] || !q->a[5]; /* (from the device, or not posted) */
    case NVP_OP_STAGED_FENCE:
    case NVP_OP_STREAM_SYNC:
    case NVP_OP_EVENT_SYNC:
    case NVP_OP_STREAM_QUERY:
    case NVP_OP_EVENT_QUERY:
    case NVP_OP_FLUSH:
        return 0;
    default:
        return 1;
    }
}

static int execute(struct nvpf_chan *ch, const struct nvp_req *q, const uint8_t *payload, size_t plen)
{
    int wants_reply = q->flags & NVP_F_REPLY;
    by_mailbox = q->flags & NVP_F_MAILBOX;
    void *s, *e;
    int rc;
    if (ch->ahead_n && q->seq != ch->ahead_seq)
        ch->ahead_n = 0; /* (Python executed those: their events are simply not waited for here) */
    if (q->op != NVP_OP_LAUNCH || wants_reply)
        drain(); /* (nothing overtakes a launch the workers hold) */
    if (issues_work(q))
        nvpf_note_issue();
    nvpr_note(q->op, q->a, payload, plen); /* (what it may write: before it runs, whoever runs it) */
    switch (q->op) {
    case NVP_OP_LAUNCH:
        return wants_reply ? TO_PYTHON : launch(ch, q, payload, plen);
    case NVP_OP_EVENT_RECORD:
        if (wants_reply || !event_of(q->a[0], &e) || !stream_of(ch, q->a[1], &s))
            return TO_PYTHON;
        async_failed(ch, D.event_record(e, s, (unsigned)q->a[2]));
        return DONE;
    case NVP_OP_GRAPH_LAUNCH: {
        struct entry *x = map_find(&execs, q->a[0]);
        if (wants_reply || q->a[2] || !x || !stream_of(ch, q->a[1], &s)) /* (uploads: Python) */
            return TO_PYTHON;
        async_failed(ch, D.graph_launch(x->handle, s));
        return DONE;
    }
    case NVP_OP_STREAM_WAIT_EVENT:
        if (wants_reply || !stream_of(ch, q->a[0], &s) || !event_of(q->a[1], &e))
            return TO_PYTHON;
        async_failed(ch, D.stream_wait_event(s, e, (unsigned)q->a[2]));
        return DONE;
    case NVP_OP_MEMSET:
        if (translating || !stream_of(ch, q->a[3], &s))
            return TO_PYTHON;
        rc = D.memset_async(q->a[0], (unsigned char)q->a[1], (size_t)q->a[2], s);
        if (!wants_reply) {
            async_failed(ch, rc);
            return DONE;
        }
        return reply(ch, rc);
    case NVP_OP_MEMCPY:
        if (translating || !stream_of(ch, q->a[3], &s))
            return TO_PYTHON;
        rc = D.memcpy_async(q->a[0], q->a[1], (size_t)q->a[2], s);
        if (!wants_reply) {
            async_failed(ch, rc);
            return DONE;
        }
        return rc ? reply(ch, rc) : wait_then_reply(ch, NVPF_WAIT_STREAM, s);
    case NVP_OP_STAGED_COPY: {
        uint64_t off = q->a[1], n = q->a[2], posted = q->a[4] ? 0 : q->a[5];
        void *ev = ch->copy_events[ch->copy_next % NVPF_COPY_EVENTS];
        if (ch->ahead_n && wants_reply) { /* issued with an earlier piece: only its wait is left */
            ev = ch->copy_events[ch->ahead_ev++ % NVPF_COPY_EVENTS];
            ch->ahead_seq++;
            ch->ahead_n--;
            return wait_then_reply(ch, NVPF_WAIT_EVENT, ev);
        }
        int unanswered = posted && !wants_reply && q->a[6] & NVP_STAGED_UNANSWERED;
        if (translating || !(wants_reply || unanswered) || !ev || !staging_range_ok(ch, off, n) ||
            !stream_of(ch, q->a[3], &s))
            return TO_PYTHON; /* Python also reports the errors */
        uint64_t host = ch->staging_base + off;
        if (ch->posted_count)
            nvpf_posted_advance(ch);
        if (unanswered)
            return posted_unanswered(ch, q->a[0], host, n, s, posted);
        if (posted)
            return posted_copy(ch, q->a[0], host, n, s, posted, q->a[6] & NVP_STAGED_ASYNC,
                               q->a[6] & NVP_STAGED_CAPTURE ? q->a[7] : 0);
        /* (after the posted copies still in flight: this one may land where they read) */
        if (ch->posted_count && (rc = nvpf_posted_order(ch, s)))
            return reply(ch, rc);
        rc = q->a[4] ? D.memcpy_async(host, q->a[0], (size_t)n, s) : D.memcpy_async(q->a[0], host, (size_t)n, s);
        if (rc)
            return reply(ch, rc);
        ch->copy_next++;
        if ((rc = D.event_record(ev, s, 0)))
            return reply(ch, rc);
        if (q->a[4])
            issue_ahead(ch, q, s);
        return wait_then_reply(ch, NVPF_WAIT_EVENT, ev);
    }
    case NVP_OP_STAGED_FENCE:
        if (!wants_reply || !posted_done_soon(ch, q->a[0], ch->exclusive ? exclusive_spin_ns : spin_ns))
            return TO_PYTHON; /* (Python's waiter thread waits for the rest) */
        nvpf_posted_publish(ch, q->a[0]);
        return reply(ch, 0);
    case NVP_OP_STREAM_SYNC:
        if (!wants_reply || !stream_of(ch, q->a[0], &s))
            return TO_PYTHON;
        return wait_then_reply(ch, NVPF_WAIT_STREAM, s);
    case NVP_OP_EVENT_SYNC:
        if (!wants_reply || !event_of(q->a[0], &e))
            return TO_PYTHON;
        return wait_then_reply(ch, NVPF_WAIT_EVENT, e);
    case NVP_OP_STREAM_QUERY:
        if (!wants_reply || !stream_of(ch, q->a[0], &s))
            return TO_PYTHON;
        return reply(ch, D.stream_query(s));
    case NVP_OP_EVENT_QUERY:
        if (!wants_reply || !event_of(q->a[0], &e))
            return TO_PYTHON;
        return reply(ch, D.event_query(e));
    case NVP_OP_FLUSH:
        return wants_reply ? reply(ch, 0) : DONE;
    case NVP_OP_LIB_CALL: { /* a math-library call Python let C make (libexec.c) */
        uint64_t r[4];
        const uint8_t *out = NULL;
        size_t n = 0;
        /* (a waited one only where C can send its reply: its outputs cannot be left to Python) */
        if (translating || (wants_reply && (ch->pending || text_waiting())) ||
            !nvpl_fast(ch, q->a, payload, plen, lib_stream_of, r, &out, &n))
            return TO_PYTHON;
        return wants_reply ? reply_with(ch, 0, r, out, n, 0) : DONE;
    }
    default:
        return TO_PYTHON;
    }
}

EXPORT void nvpf_set_capturing(int on) { capturing = on; }

/* ---- launches passed over in call order ----
 * Serving several channels, C executes calls in seq order: a thread's call may depend on any call that another
 * thread made before it.  A launch whose worker's queue is full would stop every thread behind it, while the other
 * workers' queues run dry; and the threads whose calls wait meanwhile nap (mailbox.c) and fall further behind.  So
 * such a launch is passed over: it stays at the head of its channel's buffer (with the channel's later launches
 * behind it), to be issued once its worker has room, and the calls after it in seq order go on.  Only launches on
 * streams may pass one another, and only on different streams: their order is not observable (each stream is its
 * own queue on the device; the legacy stream's launches wait for the others', so they never pass).  Anything else,
 * and a launch on a stream that another channel's passed launches use, first waits until every passed launch is
 * issued (flush), as does every return to Python. */
#define PASS_STREAMS 4 /* a channel's passed launches use at most this many streams */
#define PASS_MAX 64    /* launches a channel holds passed, at most (then the next in seq order waits for room) */
#define RUN_DEFER 100  /* (run: the request at the stop is a launch to pass over) */
#define RUN_BLOCKED 101 /* (run: the request at the stop must wait for the passed launches: flush) */

struct served {
    struct nvpf_chan *ch;
    uint8_t *buf;
    size_t *len;
    uint32_t seen;      /* the mailbox's `sent` when its socket was last read */
    uint64_t next_recv; /* when to read the socket though `sent` did not move */
    size_t passed;      /* bytes at the head of buf: launches passed over, not yet issued */
    int npassed, nstreams;
    void *streams[PASS_STREAMS]; /* (the streams they use) */
};

static struct served *pass_v; /* the served channels (serve) */
static int pass_n, holding;   /* how many; how many of them hold passed launches */

/* May q pass, or be passed over?  A plain launch a worker would issue: then its stream in *s. */
static int passable(struct nvpf_chan *ch, const struct nvp_req *q, size_t plen, void **s)
{
    return offloading && q->op == NVP_OP_LAUNCH && !(q->flags & NVP_F_REPLY) && !(q->a[6] & NVP_LAUNCH_COOPERATIVE) &&
           plen <= WORK_PARAMS && map_find(&kernels, kernel_key(ch->dev, q->a[0])) && stream_of(ch, q->a[5], s) &&
           *s;
}

/* Do launches that another channel than self passed over use stream s? */
static int held_elsewhere(const struct served *self, void *s)
{
    for (int i = 0; i < pass_n && holding; i++) {
        const struct served *v = &pass_v[i];
        for (int k = 0; v != self && k < v->nstreams; k++)
            if (v->streams[k] == s)
                return 1;
    }
    return 0;
}

static int worker_full_for(struct nvpf_chan *ch, void *s)
{
    struct entry *lane;
    int wi = lane_worker(ch, s, &lane);
    return wi >= 0 && queue_full(&workers[wi]);
}

/* The request at the head of v's buffer after the passed ones, seq *next_seq on stream s, joins them. */
static int pass_over(struct served *v, void *s, uint64_t *next_seq)
{
    int k = 0;
    while (k < v->nstreams && v->streams[k] != s)
        k++;
    if (k == v->nstreams) {
        if (k == PASS_STREAMS)
            return 0;
        v->streams[v->nstreams++] = s;
    }
    struct nvp_req q;
    memcpy(&q, v->buf + v->passed, sizeof q);
    holding += !v->passed;
    v->passed += q.len;
    v->npassed++;
    (*next_seq)++;
    return 1;
}

/* Issue v's passed launches, in its order, while their workers have room (wait: until all are issued). */
static int issue_passed(struct served *v, int wait)
{
    int issued = 0;
    while (v->passed) {
        struct nvp_req q;
        void *s;
        memcpy(&q, v->buf, sizeof q);
        if (!wait && stream_of(v->ch, q.a[5], &s) && worker_full_for(v->ch, s))
            break;
        execute(v->ch, &q, v->buf + sizeof q, q.len - sizeof q); /* (a worker's, as when it was passed over) */
        stats.executed++;
        memmove(v->buf, v->buf + q.len, *v->len - q.len);
        *v->len -= q.len;
        v->passed -= q.len;
        v->npassed--;
        issued = 1;
    }
    if (!v->passed && v->nstreams) {
        v->nstreams = v->npassed = 0;
        holding--;
    }
    return issued;
}

/* Every passed launch issued. */
static void flush_passed(void)
{
    for (int i = 0; i < pass_n && holding; i++)
        issue_passed(&pass_v[i], 1);
}

/* ---- calls only Python executes, met while C serves ----
 * Returning to Python for one of them costs far more than the call: C closes the mailboxes' slots, hands every
 * channel's buffer over, and Python takes what they hold through its heap before C serves again (with many threads
 * launching, milliseconds for each such call).  Python's hook executes the call in place instead, and C serves on.
 * Every earlier call is issued first, as at a return to Python: the hook's call may use the same streams. */
static int (*python_run)(struct nvpf_chan *, const uint8_t *, size_t);
static int serving; /* inside nvpf_serve(_many): the hook may be called (never from nvpf_run: Python is its caller) */
static int python_why; /* (stats: what made the serve end NVPF_PYTHON, as nvpf_stats.python_why counts it) */

EXPORT void nvpf_set_python(int (*fn)(struct nvpf_chan *, const uint8_t *, size_t)) { python_run = fn; }

static int run_in_python(struct nvpf_chan *ch, const uint8_t *msg, size_t n)
{
    if (!python_run || !serving)
        return NVPF_INLINE_LEFT;
    flush_passed();
    drain();
    return python_run(ch, msg, n);
}

static int run(struct nvpf_chan *ch, const uint8_t *buf, size_t len, uint64_t *next_seq, size_t *consumed,
               struct served *v)
{
    size_t off = 0;
    int why = capturing && len >= sizeof(struct nvp_req) ? NVPF_PYTHON : NVPF_MORE;
    python_why = 0; /* (a capture's: every call is Python's) */
    while (ready && !capturing && len - off >= sizeof(struct nvp_req)) {
        struct nvp_req q;
        memcpy(&q, buf + off, sizeof q);
        if (q.len < sizeof q || q.len - sizeof q > NVP_MAX_PAYLOAD || q.seq != *next_seq) {
            why = NVPF_PYTHON; /* malformed (Python says so), or not this call's turn */
            python_why = 1;
            break;
        }
        if (len - off < q.len)
            break;
        if (v) { /* (serving several channels) */
            void *s = NULL;
            int ok = passable(ch, &q, q.len - sizeof q, &s);
            if (holding && (!ok || held_elsewhere(v, s))) {
                why = RUN_BLOCKED;
                break;
            }
            if (ok && worker_full_for(ch, s)) {
                why = RUN_DEFER;
                break;
            }
        }
        rest = buf + off + q.len;
        rest_len = len - off - q.len;
        int r = execute(ch, &q, buf + off + sizeof q, q.len - sizeof q);
        if (r == TO_PYTHON) {
            stats.to_python[q.op % NVPF_STAT_OPS]++;
            int py = run_in_python(ch, buf + off, q.len);
            if (py == NVPF_INLINE_LEFT) {
                why = NVPF_PYTHON;
                python_why = 0;
                break;
            }
            stats.inline_runs++;
            off += q.len;
            (*next_seq)++;
            if (py == NVPF_INLINE_STOP) {
                why = NVPF_IDLE; /* (Python's loop looks at the channels again before C serves them) */
                break;
            }
            continue;
        }
        stats.executed++;
        off += q.len;
        (*next_seq)++;
        if (r == REPLY_BY_PYTHON) {
            why = NVPF_REPLY;
            break;
        }
    }
    *consumed = off;
    return why;
}

EXPORT int nvpf_run(struct nvpf_chan *ch, const uint8_t *buf, size_t len, uint64_t *next_seq, size_t *consumed)
{
    return run(ch, buf, len, next_seq, consumed, NULL);
}

#define SOCKET_POLL_NS 50000 /* with a mailbox: how often the loop reads the socket though `sent` did not move */

/* The request in the mailbox's slot, copied out (its length), the slot then `after` (open again, or closed); 0 if
 * none is posted.  Only the proxy moves the slot on from POSTED, so a plain store does it. */
static uint32_t take_posted(struct nvp_mailbox *mb, uint8_t *out, uint32_t after)
{
    if (__atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) != NVP_SLOT_POSTED)
        return 0;
    uint32_t n = mb->slot_len; /* (the application's memory: a bad length gives Python a malformed message) */
    n = n > NVP_MB_REQ_MAX ? NVP_MB_REQ_MAX : n < sizeof(struct nvp_req) ? sizeof(struct nvp_req) : n;
    memcpy(out, mb->req, n);
    __atomic_store_n(&mb->slot, after, __ATOMIC_RELEASE);
    return n;
}

/* Stop polling the slot; a request still posted goes to Python, after any already in side (one C left for Python,
 * which reopened the slot for the next before it knew: so side holds two at most).  Taken straight from POSTED to
 * CLOSED, never reopened on the way: a thread that posted in that instant (the proxy preempted between two
 * stores) would lose its request and wait for ever for its reply, the program in poll(2), the proxy idle.
 * Python takes side's requests into call order whyever the serve ended, and hands them back to C with the rest:
 * with many threads posting, one is nearly always in a slot, and a serve that ended for it would make Python take
 * every buffer's calls through its heap (milliseconds). */
static void close_slot(struct nvpf_chan *ch)
{
    struct nvp_mailbox *mb = ch->mailbox;
    uint32_t open = NVP_SLOT_OPEN;
    if (mb && !__atomic_compare_exchange_n(&mb->slot, &open, NVP_SLOT_CLOSED, 0, __ATOMIC_SEQ_CST,
                                           __ATOMIC_SEQ_CST)) {
        ch->side_len += take_posted(mb, ch->side + ch->side_len, NVP_SLOT_CLOSED);
        stats.side_taken++;
    }
}

/* Python's event loop: its epoll descriptor, readable while one of its sockets is (a new thread, a control command,
 * the program's end).  Serving looks at it every budget_us and hands over only then: a turn of Python's loop
 * costs far more than a call served here, and a call arriving meanwhile waits for it.  -1: not known, hand over
 * every budget_us. */
static int loop_fd = -1;
static int loop_turn; /* the last serve ended for the loop's turn */
#define LONGEST_SERVE_NS 100000000L /* a turn for Python at least this often, whatever its loop says */

EXPORT void nvpf_set_loop_fd(int fd) { loop_fd = fd; }
EXPORT int nvpf_loop_turn(void) { return loop_turn; }

/* Whether one of the loop's sockets other than the served ones is ready.  Python's epoll (select.epoll) keys its
 * events by descriptor, so the ready ones can be told apart; what C reads itself is no reason for a turn. */
static int loop_wants_turn(struct nvpf_chan *const *chs, int n)
{
    if (loop_fd < 0)
        return 1;
    struct epoll_event ev[8];
    int k = epoll_wait(loop_fd, ev, 8, 0);
    if (k < 0) { /* (not an epoll descriptor: only whether anything is ready) */
        struct pollfd p = {.fd = loop_fd, .events = POLLIN};
        return poll(&p, 1, 0) != 0;
    }
    for (int i = 0; i < k; i++) {
        int served = 0;
        for (int j = 0; j < n && !served; j++)
            served = ev[i].data.fd == chs[j]->fd;
        if (!served)
            return 1;
    }
    return 0;
}

static uint64_t head_seq(const uint8_t *buf) /* (the buffer holds a whole header) */
{
    uint64_t seq;
    memcpy(&seq, buf + offsetof(struct nvp_req, seq), sizeof seq);
    return seq;
}

/* v's request that follows its passed launches, when its turn has come: passed over too where it may be, else
 * RUN_BLOCKED (flush first).  Its mailbox slot's request joins the buffer behind them. */
static int serve_behind(struct served *v, size_t cap, uint64_t *next_seq, int *ran)
{
    struct nvp_mailbox *mb = v->ch->mailbox;
    size_t at = v->passed;
    if (*v->len == at) {
        if (!mb || __atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) != NVP_SLOT_POSTED || head_seq(mb->req) != *next_seq ||
            cap - at < NVP_MB_REQ_MAX)
            return NVPF_MORE;
        *v->len += take_posted(mb, v->buf + at, NVP_SLOT_OPEN);
        *ran = 1;
    }
    struct nvp_req q;
    if (*v->len - at < sizeof q)
        return NVPF_MORE;
    memcpy(&q, v->buf + at, sizeof q);
    if (q.seq != *next_seq)
        return q.seq > *next_seq ? NVPF_MORE : RUN_BLOCKED; /* (not its turn; or Python's to judge) */
    if (q.len < sizeof q || q.len - sizeof q > NVP_MAX_PAYLOAD)
        return RUN_BLOCKED; /* (malformed: Python says so) */
    if (*v->len - at < q.len)
        return NVPF_MORE;
    void *s;
    if (!passable(v->ch, &q, q.len - sizeof q, &s) || held_elsewhere(v, s))
        return RUN_BLOCKED;
    if (v->npassed >= PASS_MAX)
        return NVPF_MORE; /* (the worker makes room) */
    if (!pass_over(v, s, next_seq))
        return RUN_BLOCKED;
    *ran = 1;
    return NVPF_MORE;
}

/* After run stopped at v's head for the passed launches: pass it over too (RUN_DEFER), or RUN_BLOCKED. */
static int passing(struct served *v, int why, uint64_t *next_seq, int *ran)
{
    if (why == RUN_BLOCKED)
        return why;
    struct nvp_req q;
    void *s;
    memcpy(&q, v->buf, sizeof q);
    stream_of(v->ch, q.a[5], &s); /* (run found it passable) */
    *ran |= pass_over(v, s, next_seq);
    return NVPF_MORE;
}

/* Execute what is next from one served channel: its passed launches whose workers have room, then its received
 * bytes, or else its mailbox's slot, when they hold the call whose turn it is (with one channel, received bytes
 * whatever their seq: Python judges them).  NVPF_MORE with *ran set when something ran; RUN_BLOCKED where the
 * passed launches must be issued first; else why C stops. */
static int serve_one(struct served *v, int alone, size_t cap, uint64_t *next_seq, int *ran)
{
    static _Alignas(16) uint8_t posted[NVP_MB_REQ_MAX];
    struct nvpf_chan *ch = v->ch;
    if (v->passed) {
        *ran |= issue_passed(v, 0);
        if (v->passed)
            return serve_behind(v, cap, next_seq, ran);
    }
    size_t len = *v->len;
    struct served *pass = alone ? NULL : v;
    if (len) {
        if (!alone && (len < sizeof(struct nvp_req) || head_seq(v->buf) > *next_seq))
            return NVPF_MORE; /* (not its turn: another channel has the next call, or it is still on its way) */
        size_t used = 0;
        int why = run(ch, v->buf, len, next_seq, &used, pass);
        if (used) {
            memmove(v->buf, v->buf + used, len - used);
            *v->len = len - used;
            *ran = 1;
        }
        if (why == RUN_DEFER || why == RUN_BLOCKED)
            return passing(v, why, next_seq, ran);
        if (why == NVPF_PYTHON && !alone && *v->len >= sizeof(struct nvp_req) && head_seq(v->buf) > *next_seq)
            return NVPF_MORE; /* (what follows is not its turn yet) */
        if (why != NVPF_MORE)
            return why;
        if (*v->len < cap)
            return NVPF_MORE;
        python_why = 2; /* (a message larger than the buffer: Python's grows) */
        return NVPF_PYTHON;
    }
    /* the slot's request, when it is the next to run (an earlier one may still be in the socket) */
    struct nvp_mailbox *mb = ch->mailbox;
    if (!mb || __atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) != NVP_SLOT_POSTED || head_seq(mb->req) != *next_seq)
        return NVPF_MORE;
    uint32_t n = take_posted(mb, posted, NVP_SLOT_OPEN);
    size_t used = 0;
    int why = run(ch, posted, n, next_seq, &used, pass);
    *ran = 1;
    if (why == RUN_DEFER || why == RUN_BLOCKED) { /* (the rest waits in the buffer, which was empty) */
        memcpy(v->buf, posted + used, n - used);
        *v->len = n - used;
        return passing(v, why, next_seq, ran);
    }
    if (used < n) { /* Python's to execute (what was executed stays out of it) */
        memcpy(ch->side, posted + used, n - used);
        ch->side_len = (uint32_t)(n - used);
        return why == NVPF_REPLY ? why : NVPF_PYTHON;
    }
    return why;
}

/* Read a served channel's socket: NVPF_MORE, or NVPF_CLOSED / NVPF_FDS. */
static int receive(struct served *v, size_t cap)
{
    struct nvpf_chan *ch = v->ch;
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * NVPF_MAX_FDS)];
    } ctl;
    struct iovec iov = {v->buf + *v->len, cap - *v->len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof ctl};
    ssize_t r = recvmsg(ch->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r == 0)
        return NVPF_CLOSED;
    if (r < 0)
        return errno == EAGAIN || errno == EINTR ? NVPF_MORE : NVPF_CLOSED;
    *v->len += (size_t)r;
    v->next_recv = 0; /* (the rest of a long message may follow) */
    v->seen--;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && ch->nfds < NVPF_MAX_FDS; i++)
            memcpy(&ch->fds[ch->nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    return ch->nfds ? NVPF_FDS : NVPF_MORE;
}

/* What the served channels hold, for a turn that ran nothing: 2 the next call (it waits for room at a launch
 * worker), 1 only later calls (the next is still on its way), 0 none. */
static int holding_what(const struct served *v, int n, uint64_t next_seq)
{
    int later = 0;
    for (int i = 0; i < n; i++) {
        const struct nvp_mailbox *mb = v[i].ch->mailbox;
        size_t at = v[i].passed;
        if (*v[i].len >= at + sizeof(struct nvp_req)) {
            if (head_seq(v[i].buf + at) == next_seq)
                return 2;
            later = 1;
        }
        if (mb && __atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) == NVP_SLOT_POSTED) {
            if (head_seq(mb->req) == next_seq)
                return 2;
            later = 1;
        }
    }
    return later;
}

/* Serve n channels in call order: execute whichever holds the next call, read the sockets and poll the mailboxes'
 * slots, until Python is needed (*which: the channel that needs it). */
static int serve(struct served *v, int n, size_t cap, uint64_t *next_seq, unsigned idle_us, unsigned budget_us,
                 int *which)
{
    long entered = now_ns(), start = entered, last = start;
    struct nvpf_chan *chs[NVPF_SERVE_MAX];
    for (int i = 0; i < n; i++) {
        struct nvp_mailbox *mb = v[i].ch->mailbox;
        v[i].seen = mb ? __atomic_load_n(&mb->sent, __ATOMIC_ACQUIRE) - 1 : 0; /* (read the socket at once) */
        v[i].next_recv = 0;
        chs[i] = v[i].ch;
    }
    long still = 0; /* (stats: when the turns began to run nothing; and the most they held: holding_what) */
    int held = 0;
    for (;;) {
        int ran = 0;
        for (int i = 0; i < n; i++) {
            int why = serve_one(&v[i], n == 1, cap, next_seq, &ran);
            if (why == RUN_BLOCKED) {
                flush_passed();
                ran = 1;
                continue;
            }
            if (why != NVPF_MORE) {
                *which = i;
                return why;
            }
        }
        long t = now_ns();
        /* (busy or not: a thread starting up or another channel waits for Python's turn, and a storm of launches
         * from the threads already served would keep it from every other thread for as long as it lasts) */
        if (t - start > (long)budget_us * 1000) {
            if (t - entered > LONGEST_SERVE_NS || loop_wants_turn(chs, n)) {
                *which = -1;
                loop_turn = 1;
                return NVPF_IDLE;
            }
            start = t;
        }
        if (n > 1) {
            if (ran && still) {
                uint64_t *into[] = {&stats.quiet_ns, &stats.order_ns, &stats.room_ns};
                *into[held] += (uint64_t)(t - still);
                still = held = 0;
            } else if (!ran) {
                still = still ? still : t;
                int h = holding_what(v, n, *next_seq);
                held = h > held ? h : held;
            }
        }
        if (ran) {
            last = t;
            continue;
        }
        if (t - last > (long)idle_us * 1000) {
            *which = -1;
            return NVPF_IDLE;
        }
        int read = 0;
        for (int i = 0; i < n; i++) {
            struct nvp_mailbox *mb = v[i].ch->mailbox;
            if (v[i].ch->ended)
                continue;
            /* (small requests come through the slot: a recvmsg(2) per turn would delay them) */
            if (mb && !nvp_socket_due(&mb->sent, &v[i].seen, (uint64_t)t, &v[i].next_recv, SOCKET_POLL_NS))
                continue;
            if (*v[i].len == cap) /* (full of calls whose turn has not come: the next is in another channel) */
                continue;
            size_t had = *v[i].len;
            int why = receive(&v[i], cap);
            if (why != NVPF_MORE) {
                *which = i;
                return why;
            }
            read |= *v[i].len != had;
        }
        if (read)
            last = now_ns();
        else
            nvp_cpu_relax();
    }
}

static int serve_channels(struct nvpf_chan **chs, uint8_t **bufs, size_t *lens, int n, size_t cap,
                          uint64_t *next_seq, unsigned idle_us, unsigned budget_us, int *which)
{
    struct served v[NVPF_SERVE_MAX];
    loop_turn = 0;
    for (int i = 0; i < n; i++) {
        struct nvpf_chan *ch = chs[i];
        ch->nfds = 0;
        ch->side_len = 0;
        ch->exclusive = n == 1;
        v[i] = (struct served){.ch = ch, .buf = bufs[i], .len = &lens[i]};
        if (ch->mailbox)
            __atomic_store_n(&((struct nvp_mailbox *)ch->mailbox)->slot, NVP_SLOT_OPEN, __ATOMIC_RELEASE);
    }
    offloading = n > 1 && start_workers() && D.ctx_get_current(&current_ctx) == 0 && current_ctx;
    pass_v = v;
    pass_n = n;
    holding = 0;
    long entered = now_ns();
    serving = 1;
    int why = serve(v, n, cap, next_seq, idle_us, budget_us, which);
    serving = 0;
    flush_passed(); /* (Python executes what comes next, and finds every earlier call done) */
    drain();
    pass_n = 0;
    offloading = 0;
    for (int i = 0; i < n; i++) /* (a request posted meanwhile goes to Python, from any channel) */
        close_slot(chs[i]);
    stats.serves++;
    stats.serve_ns += (uint64_t)(now_ns() - entered);
    stats.ended[why & 7]++;
    stats.python_why[python_why % 3] += why == NVPF_PYTHON;
    stats.loop_turns += loop_turn;
    return why;
}

EXPORT int nvpf_serve(struct nvpf_chan *ch, uint8_t *buf, size_t cap, size_t *len, uint64_t *next_seq,
                      unsigned idle_us, unsigned budget_us)
{
    int which;
    return serve_channels(&ch, &buf, len, 1, cap, next_seq, idle_us, budget_us, &which);
}

EXPORT int nvpf_serve_many(struct nvpf_chan **chs, uint8_t **bufs, size_t *lens, int n, size_t cap,
                           uint64_t *next_seq, unsigned idle_us, unsigned budget_us, int *which)
{
    *which = -1;
    if (n < 1 || n > NVPF_SERVE_MAX)
        return NVPF_PYTHON;
    return serve_channels(chs, bufs, lens, n, cap, next_seq, idle_us, budget_us, which);
}
