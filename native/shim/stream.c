/* Streams, events and host callbacks.  Handles are nvproxy's own IDs (they
 * must survive a restart into a fresh proxy); callbacks run here, in the
 * application, on a callback thread the proxy drives in stream order. */
#include "shim.h"
#include "transport.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WIRE_ID_BASE 16 /* wire ids 0 and 2 are the legacy and per-thread streams */

int nvp_open_channel(int kind, struct nvp_rep *rep, struct nvp_mailbox **mb);

cudaError_t nvp_enter_stream(cudaStream_t s, int per_thread_default, int64_t *wire)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    *wire = nvp_stream_wire(s, per_thread_default);
    return *wire < 0 ? cudaErrorInvalidResourceHandle : cudaSuccess;
}

int64_t nvp_stream_wire(cudaStream_t s, int per_thread_default)
{
    uint64_t h = (uint64_t)(uintptr_t)s;
    if (h == 0)
        return per_thread_default ? NVP_STREAM_PER_THREAD : NVP_STREAM_LEGACY;
    if (s == cudaStreamLegacy)
        return NVP_STREAM_LEGACY;
    if (s == cudaStreamPerThread)
        return NVP_STREAM_PER_THREAD;
    if (nvp_handle_get(NVP_H_STREAM, h, NULL, 0) != 0)
        return -1;
    return (int64_t)nvp_handle_id(h) + WIRE_ID_BASE;
}

int64_t nvp_event_wire(cudaEvent_t e)
{
    uint64_t h = (uint64_t)(uintptr_t)e;
    if (nvp_handle_get(NVP_H_EVENT, h, NULL, 0) != 0)
        return -1;
    return (int64_t)nvp_handle_id(h) + WIRE_ID_BASE;
}

/* nvp_event_wire and the event's record, in one lookup */
static int64_t event_wire_rec(cudaEvent_t e, struct nvp_event_rec *rec)
{
    uint64_t h = (uint64_t)(uintptr_t)e;
    if (nvp_handle_get(NVP_H_EVENT, h, rec, sizeof *rec) != 0)
        return -1;
    return (int64_t)nvp_handle_id(h) + WIRE_ID_BASE;
}

/* ---- streams ---- */

static cudaError_t stream_create(cudaStream_t *ps, unsigned flags, int priority)
{
    if (!ps || (flags & ~(unsigned)cudaStreamNonBlocking))
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    int least = 0, greatest = 0;
    if (priority != 0) { /* clamped to the device's range, as the runtime does */
        if ((e = cudaDeviceGetStreamPriorityRange(&least, &greatest)))
            return e;
        if (priority > least)
            priority = least;
        if (priority < greatest)
            priority = greatest;
    }
    struct nvp_stream_rec rec = {nvp_current_device(), flags, priority};
    uint64_t h = nvp_handle_new(NVP_H_STREAM, &rec, sizeof rec);
    if (!h)
        return nvp_ret(cudaErrorMemoryAllocation);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)nvp_handle_id(h) + WIRE_ID_BASE, flags, (uint64_t)(int64_t)priority};
    if ((e = nvp_call(NVP_OP_STREAM_CREATE, a, NULL, 0, NULL, -1))) {
        nvp_handle_free(NVP_H_STREAM, h);
        return nvp_ret(e);
    }
    *ps = (cudaStream_t)(uintptr_t)h;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *ps) { return stream_create(ps, 0, 0); }

NVP_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
    return stream_create(ps, flags, 0);
}

NVP_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned int flags, int priority)
{
    return stream_create(ps, flags, priority);
}

NVP_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    int64_t w = nvp_stream_wire(s, 0);
    if (w < WIRE_ID_BASE)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    e = nvp_call(NVP_OP_STREAM_DESTROY, a, NULL, 0, NULL, -1);
    nvp_handle_free(NVP_H_STREAM, (uint64_t)(uintptr_t)s);
    return nvp_ret(e);
}

static cudaError_t stream_wait_op(uint16_t op, cudaStream_t s, int per_thread)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    int64_t w = nvp_stream_wire(s, per_thread);
    if (w < 0)
        return cudaErrorInvalidResourceHandle;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    struct nvp_reply r = {0};
    return nvp_call(op, a, NULL, 0, &r, -1);
}

NVP_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) { return nvp_ret(stream_wait_op(NVP_OP_STREAM_SYNC, s, 0)); }
NVP_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s)
{
    return nvp_ret(stream_wait_op(NVP_OP_STREAM_SYNC, s, 1));
}

NVP_EXPORT cudaError_t cudaStreamQuery(cudaStream_t s)
{
    cudaError_t e = stream_wait_op(NVP_OP_STREAM_QUERY, s, 0);
    return e == cudaErrorNotReady ? e : nvp_ret(e); /* not-ready is no error */
}

NVP_EXPORT cudaError_t cudaStreamQuery_ptsz(cudaStream_t s)
{
    cudaError_t e = stream_wait_op(NVP_OP_STREAM_QUERY, s, 1);
    return e == cudaErrorNotReady ? e : nvp_ret(e);
}

/* Another process orders its work after an interprocess event's record or wait by when the call returned
 * (NVIDIA's simpleIPC: record, then a CPU barrier, then the other process waits).  Each process has its own
 * proxy, so such a call returns only once its proxy has issued it (a reply): posted, the other proxy could go
 * first. */
static struct nvp_reply *reply_if_interprocess(const struct nvp_event_rec *rec, struct nvp_reply *r)
{
    return (rec->flags & cudaEventInterprocess) ? r : NULL;
}

static cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t ev, unsigned flags, int per_thread)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_event_rec rec;
    int64_t w = nvp_stream_wire(s, per_thread), we = event_wire_rec(ev, &rec);
    if (w < 0 || we < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, (uint64_t)we, flags};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_STREAM_WAIT_EVENT, a, NULL, 0, reply_if_interprocess(&rec, &r), -1));
}

NVP_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    return stream_wait_event(s, ev, flags, 0);
}

NVP_EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    return stream_wait_event(s, ev, flags, 1);
}

static cudaError_t stream_rec(cudaStream_t s, struct nvp_stream_rec *rec)
{
    if (s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        rec->device = nvp_current_device();
        rec->flags = 0;
        rec->priority = 0;
        return cudaSuccess;
    }
    return nvp_handle_get(NVP_H_STREAM, (uint64_t)(uintptr_t)s, rec, sizeof *rec) ? cudaErrorInvalidResourceHandle
                                                                                   : cudaSuccess;
}

NVP_EXPORT cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags)
{
    struct nvp_stream_rec rec;
    if (!flags)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = stream_rec(s, &rec);
    if (!e)
        *flags = rec.flags;
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority)
{
    struct nvp_stream_rec rec;
    if (!priority)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = stream_rec(s, &rec);
    if (!e)
        *priority = rec.priority;
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaStreamGetDevice(cudaStream_t s, int *device)
{
    struct nvp_stream_rec rec;
    if (!device)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = stream_rec(s, &rec);
    if (!e)
        *device = rec.device;
    return nvp_ret(e);
}

/* ---- host callbacks ---- */

struct callback {
    int used;
    int with_status; /* cudaStreamAddCallback (stream, status, data) vs cudaLaunchHostFunc (data) */
    void *fn;
    void *data;
    cudaStream_t stream;
};
static struct {
    pthread_mutex_t lock;
    struct callback *v;
    size_t n, cap;
    int fd;
    int started;
    int gen; /* the proxy generation the callback channel goes to */
    /* descriptors of callback threads a checkpoint cut off (+1; 0: none), until the thread closes it */
    _Atomic int stale[8];
} CB = {.lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1};

static int null_over(int fd)
{
    int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul < 0)
        return -1;
    int r = dup2(nul, fd);
    close(nul);
    return r;
}

static uint64_t callback_add(int with_status, void *fn, void *data, cudaStream_t s)
{
    pthread_mutex_lock(&CB.lock);
    size_t i;
    for (i = 0; i < CB.n && CB.v[i].used; i++)
        ;
    if (i == CB.n) {
        if (CB.n == CB.cap) {
            size_t cap = CB.cap ? CB.cap * 2 : 64;
            struct callback *v = realloc(CB.v, cap * sizeof *v);
            if (!v) {
                pthread_mutex_unlock(&CB.lock);
                return 0;
            }
            CB.v = v;
            CB.cap = cap;
        }
        CB.n++;
    }
    CB.v[i] = (struct callback){1, with_status, fn, data, s};
    pthread_mutex_unlock(&CB.lock);
    return i + 1;
}

static __thread int on_callback_thread;

int nvp_on_callback_thread(void) { return on_callback_thread; }

static void *callback_thread(void *arg)
{
    int fd = (int)(intptr_t)arg;
    on_callback_thread = 1;
    struct nvp_cb m;
    while (nvp_read_full(fd, &m, sizeof m) == 0) {
        pthread_mutex_lock(&CB.lock);
        struct callback c = {0};
        if (m.id >= 1 && m.id <= CB.n && CB.v[m.id - 1].used) {
            c = CB.v[m.id - 1];
            if (!(m.flags & NVP_CB_KEEP)) /* a graph's host node stays for its next launches */
                CB.v[m.id - 1].used = 0;
        }
        pthread_mutex_unlock(&CB.lock);
        if (!c.fn)
            nvp_log("nvproxy: the proxy called back an unknown host function (%llu); not run", (unsigned long long)m.id);
        else if (nvp_trace_enabled())
            nvp_log("nvproxy: <- host function %llu on fd %d", (unsigned long long)m.id, fd);
        if (c.fn && c.with_status)
            ((cudaStreamCallback_t)c.fn)(c.stream, (cudaError_t)m.status, c.data);
        else if (c.fn)
            ((cudaHostFn_t)c.fn)(c.data);
        if (write(fd, &m, sizeof m) != (ssize_t)sizeof m)
            break;
    }
    for (size_t i = 0; i < sizeof CB.stale / sizeof CB.stale[0]; i++) {
        int want = fd + 1;
        atomic_compare_exchange_strong(&CB.stale[i], &want, 0);
    }
    close(fd);
    return NULL;
}

void nvp_callbacks_close(void)
{
    /* Before a checkpoint: the thread, frozen in read(), finds the socket gone when
     * it resumes and ends; the next host function starts a new one.  Its descriptor
     * number stays taken (by /dev/null) until that thread closes it, so that nothing
     * opened meanwhile (after a restart: new memfds, new channels) can get that number
     * and be read, written or closed by the old thread. */
    if (CB.fd >= 0) {
        shutdown(CB.fd, SHUT_RDWR);
        null_over(CB.fd);
        for (size_t i = 0; i < sizeof CB.stale / sizeof CB.stale[0]; i++) {
            int none = 0;
            if (atomic_compare_exchange_strong(&CB.stale[i], &none, CB.fd + 1))
                break;
        }
    }
    CB.fd = -1;
    __atomic_store_n(&CB.started, 0, __ATOMIC_RELEASE);
}

void nvp_callbacks_restarted(void)
{
    /* At DMTCP's RESTART event, threads still frozen: DMTCP 4.2 brings back a socket, not the /dev/null that held
     * a cut-off callback thread's descriptor number (nvp_callbacks_close; seen in tests/apps/callback_threads),
     * and the thread, resuming in read() there, would wait on that socket, and may close the number later, when
     * it could belong to a new channel.  /dev/null holds the number again: the thread reads its end at once
     * and closes its own. */
    for (size_t i = 0; i < sizeof CB.stale / sizeof CB.stale[0]; i++) {
        int fd = atomic_load(&CB.stale[i]);
        if (fd)
            null_over(fd - 1);
    }
}

cudaError_t nvp_callbacks_start(void)
{
    pthread_mutex_lock(&CB.lock);
    if (CB.started && CB.gen == nvp_generation()) {
        pthread_mutex_unlock(&CB.lock);
        return cudaSuccess;
    }
    /* first use, or a new proxy replaced the one the old thread served */
    CB.fd = nvp_open_channel(NVP_CHAN_CALLBACK, NULL, NULL);
    if (CB.fd < 0) {
        pthread_mutex_unlock(&CB.lock);
        /* the proxy is gone: said once, as for any call (and, under NVPROXY_RECOVER, the caller's exchange
         * starts a new one) */
        return nvp_lost("its callback channel could not be opened");
    }
    pthread_t t;
    if (pthread_create(&t, NULL, callback_thread, (void *)(intptr_t)CB.fd) != 0) {
        nvp_socket_close(CB.fd, 0);
        CB.fd = -1;
        pthread_mutex_unlock(&CB.lock);
        return cudaErrorMemoryAllocation;
    }
    pthread_detach(t);
    if (nvp_trace_enabled())
        nvp_log("nvproxy: callback channel on fd %d", CB.fd);
    __atomic_store_n(&CB.gen, nvp_generation(), __ATOMIC_RELEASE);
    __atomic_store_n(&CB.started, 1, __ATOMIC_RELEASE); /* (read without the lock: nvp_callbacks_resume) */
    pthread_mutex_unlock(&CB.lock);
    return cudaSuccess;
}

cudaError_t nvp_callbacks_resume(void)
{
    /* After a new proxy came from an image (NVPROXY_RECOVER, a DMTCP restart), the
     * host nodes of the graphs it made again call back here at their next launch:
     * the launch opens the callback channel first if there are any.  (Not in
     * DMTCP's restart hook: opened there, the restarted program ended after its
     * next graph launch, with dmtcp_restart's status 99.)  Every graph launch comes
     * here: the channel of this proxy is the common case, checked without the lock. */
    if (__atomic_load_n(&CB.started, __ATOMIC_ACQUIRE) &&
        __atomic_load_n(&CB.gen, __ATOMIC_ACQUIRE) == nvp_generation())
        return cudaSuccess;
    pthread_mutex_lock(&CB.lock);
    int current = CB.started && CB.gen == nvp_generation(), any = 0;
    for (size_t i = 0; i < CB.n && !current && !any; i++)
        any = CB.v[i].used;
    pthread_mutex_unlock(&CB.lock);
    return any ? nvp_callbacks_start() : cudaSuccess;
}

uint64_t nvp_host_node_callback(void *fn, void *data)
{
    return nvp_callbacks_start() ? 0 : callback_add(0, fn, data, NULL);
}

struct host_func_call {
    int64_t w;
    int with_status, hidden;
    void *fn, *data;
    cudaStream_t s;
    uint64_t id; /* its entry in CB.v, once made (a recovered call runs again with the same) */
};

static cudaError_t host_func_once(void *arg)
{
    struct host_func_call *c = arg;
    cudaError_t e = nvp_callbacks_start();
    if (e)
        return e;
    if (!c->id && !(c->id = callback_add(c->with_status, c->fn, c->data, c->s)))
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)c->w, c->id, (uint64_t)c->hidden};
    return nvp_call(NVP_OP_HOST_FUNC, a, NULL, 0, NULL, -1);
}

static cudaError_t host_func_on(int64_t w, int with_status, void *fn, void *data, cudaStream_t s, int hidden)
{
    if (!hidden) /* (nvproxy's own host functions come inside a call that holds checkpoints off) */
        nvp_callback_gate_enter();
    nvp_ckpt_disable(); /* (the channel and the call go to the same proxy: see graph.c's launch) */
    struct host_func_call c = {w, with_status, hidden, fn, data, s, 0};
    cudaError_t e = nvp_exchange(host_func_once, &c);
    nvp_ckpt_enable();
    if (!hidden)
        nvp_callback_gate_leave();
    return e;
}

static cudaError_t host_func(cudaStream_t s, int with_status, void *fn, void *data, int per_thread)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, per_thread, &w);
    if (e)
        return e;
    if (!fn)
        return cudaErrorInvalidValue;
    return host_func_on(w, with_status, fn, data, s, 0);
}

/* nvproxy's own host function (staging a captured pageable copy): not listed as a node of the graph */
cudaError_t nvp_host_func_wire(int64_t w, void *fn, void *data) { return host_func_on(w, 0, fn, data, NULL, 1); }

NVP_EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *userData,
                                             unsigned int flags)
{
    if (flags != 0)
        return nvp_ret(cudaErrorInvalidValue);
    return nvp_ret(host_func(s, 1, (void *)cb, userData, 0));
}

NVP_EXPORT cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t s, cudaStreamCallback_t cb, void *userData,
                                                  unsigned int flags)
{
    if (flags != 0)
        return nvp_ret(cudaErrorInvalidValue);
    return nvp_ret(host_func(s, 1, (void *)cb, userData, 1));
}

NVP_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData)
{
    return nvp_ret(host_func(s, 0, (void *)fn, userData, 0));
}

NVP_EXPORT cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void *userData)
{
    return nvp_ret(host_func(s, 0, (void *)fn, userData, 1));
}

/* ---- events ---- */

static cudaError_t event_create(cudaEvent_t *pe, unsigned flags)
{
    if (!pe || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return nvp_ret(cudaErrorInvalidValue);
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_event_rec rec = {nvp_current_device(), flags, 0};
    uint64_t h = nvp_handle_new(NVP_H_EVENT, &rec, sizeof rec);
    if (!h)
        return nvp_ret(cudaErrorMemoryAllocation);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)nvp_handle_id(h) + WIRE_ID_BASE, flags};
    if ((e = nvp_call(NVP_OP_EVENT_CREATE, a, NULL, 0, NULL, -1))) {
        nvp_handle_free(NVP_H_EVENT, h);
        return nvp_ret(e);
    }
    *pe = (cudaEvent_t)(uintptr_t)h;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *pe) { return event_create(pe, 0); }
NVP_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags) { return event_create(pe, flags); }

/* Interprocess events: the driver's handle, exported and opened through the proxies (ipc.c has memory). */
NVP_EXPORT cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    int64_t w = nvp_event_wire(event);
    if (w < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    if (!handle)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    struct nvp_reply r = {.out = handle, .out_cap = sizeof *handle};
    if (!(e = nvp_call(NVP_OP_IPC_EVENT_EXPORT, a, NULL, 0, &r, -1)) && r.out_len != sizeof *handle)
        e = cudaErrorInvalidValue;
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!event)
        return nvp_ret(cudaErrorInvalidValue);
    struct nvp_event_rec rec = {nvp_current_device(), cudaEventDisableTiming | cudaEventInterprocess, 0};
    uint64_t h = nvp_handle_new(NVP_H_EVENT, &rec, sizeof rec);
    if (!h)
        return nvp_ret(cudaErrorMemoryAllocation);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)nvp_handle_id(h) + WIRE_ID_BASE};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_IPC_EVENT_OPEN, a, &handle, sizeof handle, &r, -1))) {
        nvp_handle_free(NVP_H_EVENT, h);
        return nvp_ret(e);
    }
    *event = (cudaEvent_t)(uintptr_t)h;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    int64_t w = nvp_event_wire(ev);
    if (w < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    e = nvp_call(NVP_OP_EVENT_DESTROY, a, NULL, 0, NULL, -1);
    nvp_handle_free(NVP_H_EVENT, (uint64_t)(uintptr_t)ev);
    return nvp_ret(e);
}

static cudaError_t event_record(cudaEvent_t ev, cudaStream_t s, unsigned flags, int per_thread)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_event_rec rec;
    int64_t w = nvp_stream_wire(s, per_thread), we = event_wire_rec(ev, &rec);
    if (w < 0 || we < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    rec.recorded = 1;
    nvp_handle_set(NVP_H_EVENT, (uint64_t)(uintptr_t)ev, &rec, sizeof rec);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)we, (uint64_t)w, flags};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_EVENT_RECORD, a, NULL, 0, reply_if_interprocess(&rec, &r), -1));
}

NVP_EXPORT cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) { return event_record(ev, s, 0, 0); }
NVP_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t ev, cudaStream_t s) { return event_record(ev, s, 0, 1); }
NVP_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t ev, cudaStream_t s, unsigned int flags)
{
    return event_record(ev, s, flags, 0);
}
NVP_EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t ev, cudaStream_t s, unsigned int flags)
{
    return event_record(ev, s, flags, 1);
}

static cudaError_t event_op(uint16_t op, cudaEvent_t ev)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    int64_t w = nvp_event_wire(ev);
    if (w < 0)
        return cudaErrorInvalidResourceHandle;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    struct nvp_reply r = {0};
    return nvp_call(op, a, NULL, 0, &r, -1);
}

NVP_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t ev) { return nvp_ret(event_op(NVP_OP_EVENT_SYNC, ev)); }

NVP_EXPORT cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    cudaError_t e = event_op(NVP_OP_EVENT_QUERY, ev);
    return e == cudaErrorNotReady ? e : nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    int64_t a0 = nvp_event_wire(start), a1 = nvp_event_wire(end);
    if (a0 < 0 || a1 < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)a0, (uint64_t)a1};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_EVENT_ELAPSED, a, NULL, 0, &r, -1);
    if (!e) {
        uint32_t bits = (uint32_t)r.h.r[0];
        memcpy(ms, &bits, sizeof *ms);
    }
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    return cudaEventElapsedTime(ms, start, end);
}

/* ---- stream attributes (access policy window, synchronisation policy, ...) ----
 * The value is a 64-byte union, the same bytes as the driver's; the proxy keeps
 * what was set and sets it again after a restore. */

_Static_assert(sizeof(cudaStreamAttrValue) == NVP_STREAM_ATTR_BYTES, "cudaStreamAttrValue is 64 bytes");

static cudaError_t stream_attr(cudaStream_t s, cudaStreamAttrID attr, void *value, int get, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if (!value)
        return cudaErrorInvalidValue;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, (uint64_t)attr, (uint64_t)get};
    struct nvp_reply r = {.out = value, .out_cap = get ? NVP_STREAM_ATTR_BYTES : 0};
    e = nvp_call(NVP_OP_STREAM_ATTR, a, get ? NULL : value, get ? 0 : NVP_STREAM_ATTR_BYTES, &r, -1);
    if (!e && get && r.out_len != NVP_STREAM_ATTR_BYTES)
        return cudaErrorUnknown;
    return e;
}

NVP_EXPORT cudaError_t cudaStreamSetAttribute(cudaStream_t s, cudaStreamAttrID attr, const cudaStreamAttrValue *value)
{
    return nvp_ret(stream_attr(s, attr, (void *)value, 0, 0));
}

NVP_EXPORT cudaError_t cudaStreamGetAttribute(cudaStream_t s, cudaStreamAttrID attr, cudaStreamAttrValue *value_out)
{
    return nvp_ret(stream_attr(s, attr, value_out, 1, 0));
}

NVP_EXPORT cudaError_t cudaStreamSetAttribute_ptsz(cudaStream_t s, cudaStreamAttrID attr,
                                                   const cudaStreamAttrValue *value)
{
    return nvp_ret(stream_attr(s, attr, (void *)value, 0, 1));
}

NVP_EXPORT cudaError_t cudaStreamGetAttribute_ptsz(cudaStream_t s, cudaStreamAttrID attr,
                                                   cudaStreamAttrValue *value_out)
{
    return nvp_ret(stream_attr(s, attr, value_out, 1, 1));
}
