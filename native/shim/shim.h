/* Internal interfaces of the nvproxy shim (libnvproxy.so). */
#ifndef NVP_SHIM_H
#define NVP_SHIM_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda_runtime_api.h>

#include "nvproxy_wire.h"
#include "test_hooks.h"

#define NVP_MAX_DEVICES 64
#define NVP_EXPORT __attribute__((visibility("default")))

/* Wire encodings of the two implicit streams. */
#define NVP_STREAM_LEGACY 0
#define NVP_STREAM_PER_THREAD 2

/* ---- the transport (channel.c, framing.c, mailbox.c, staging.c, recovery.c; transport.h) ---- */
struct nvp_reply {
    struct nvp_rep h;
    void *out;      /* caller's buffer for the payload (after the printf text) */
    size_t out_cap;
    size_t out_len; /* payload bytes received */
};

/* Make sure this thread has a channel to the proxy; cudaSuccess or the error
 * every call must return (dead proxy, no proxy could be started). */
cudaError_t nvp_connect(void);
/* Send a request; payload may be NULL.  With reply != NULL the call waits for
 * the reply (NVP_F_REPLY is set).  fd >= 0 is passed along with SCM_RIGHTS.
 * Returns the call's cudaError_t (transport failure, or the reply's err). */
cudaError_t nvp_call(uint16_t op, const uint64_t a[NVP_MAX_ARGS], const void *payload, size_t plen,
                     struct nvp_reply *reply, int fd);
/* Two-part payload variant (header + big payload without copying). */
cudaError_t nvp_callv(uint16_t op, const uint64_t a[NVP_MAX_ARGS], const void *p1, size_t l1,
                      const void *p2, size_t l2, struct nvp_reply *reply, int fd);
/* One runtime call's talk with the proxy, however many requests it makes: run(arg) with checkpoints held off.  If
 * the proxy was lost meanwhile (a request or reply failed) and NVPROXY_RECOVER names an image, a new proxy starts
 * from it and run(arg) runs once more, from the start, against that one.  Only the outermost exchange of a thread
 * recovers: inside it, a lost proxy makes every later request of the call fail at once, so that nothing the call
 * holds (the staging buffer, replies still to read) meets the new proxy half done.  nvp_callv and nvp_connect
 * are exchanges; a call that holds such state across requests (a staged copy) makes one around all of them. */
cudaError_t nvp_exchange(cudaError_t (*run)(void *arg), void *arg);
/* Pipelined requests: send with a reply pending, collect replies later, in order.  alone: no other request
 * follows before this one's reply is read, so it may go through the mailbox's slot (a small staged copy). */
cudaError_t nvp_send_pending(uint16_t op, const uint64_t a[NVP_MAX_ARGS], int alone);
#define NVP_SEND_MANY_MAX 8 /* (the proxy issues at most its ring of copy events at once: NVPF_COPY_EVENTS) */
cudaError_t nvp_send_pending_many(uint16_t op, const uint64_t (*a)[NVP_MAX_ARGS], size_t k);
cudaError_t nvp_wait_pending(struct nvp_reply *reply);
/* Requests answered by what came before them (memory.c: posted copies).  nvp_last_request: the seq of this
 * thread's last request on its channel (0: none, or the channel is gone).  nvp_send_after: send one without a
 * reply, numbered after + 1, only if after is this thread's last request and no thread has sent one since, so
 * that nothing can have come between them (*sent 0 otherwise: send it as usual).  Not counted as device work
 * still running (nvp_note_async_sent). */
uint64_t nvp_last_request(void);
cudaError_t nvp_send_after(uint16_t op, const uint64_t a[NVP_MAX_ARGS], uint64_t after, int *sent);
/* the calling thread's next reply will take about ns (a synchronous copy of a known size): spin that long for it
 * rather than sleep, whose wake-up even a large copy would pay on top of the runtime's own time */
void nvp_expect_wait(uint64_t ns);

int nvp_device_count(void);
/* Bumped each time a new proxy replaces a dead one (NVPROXY_RECOVER). */
int nvp_generation(void);
int nvp_driver_version(void);
int nvp_backend_is_sim(void);
/* The thread's current device (cudaSetDevice is per thread). */
int nvp_current_device(void);
void nvp_set_current_device(int dev);
/* Per-thread staging buffer for pageable copies (created on first use): slots of 8 MiB. */
#define NVP_STAGE_SLOT (8u << 20)
#define NVP_STAGE_SLOTS 4
#define NVP_STAGING_BYTES ((size_t)NVP_STAGE_SLOT * NVP_STAGE_SLOTS)
#define NVP_POSTED_MAX 16 /* posted copies in flight per thread, at most (the proxy keeps room for more) */
struct nvp_posted {
    uint64_t num;
    size_t off, len;
};
struct nvp_staging {
    char *base;
    size_t slot_size;
    int nslots;
    /* Posted host-to-device copies (NVP_OP_STAGED_COPY): answered before their DMA ended, so their bytes stay
     * in the buffer until the proxy says they are done.  Numbered per channel from 1; those in flight, oldest
     * first. */
    uint64_t posted, posted_known; /* numbers handed out; every one up to posted_known is done */
    unsigned pfirst, pcount;
    struct nvp_posted pq[NVP_POSTED_MAX];
    size_t d2h_next; /* where the next large copy from the device lands (copy_plan.c: round) */
};
cudaError_t nvp_staging(struct nvp_staging **out);
/* May this thread's copies be posted (it has a mailbox, where the proxy says which are done)?  What it says. */
int nvp_posting(void);
uint64_t nvp_posted_done(void);
/* Before the staging buffer is written where a posted copy may still be read: wait for them (memory.c) */
cudaError_t nvp_posted_quiet(struct nvp_staging *s);
/* The common entry check of a runtime call: a proxy to talk to, no sticky error. */
cudaError_t nvp_enter(void);
/* ---- settings.c: what the shim reads from its environment, checked once ---- */
/* How long a thread waiting for a reply polls before it sleeps: as the CUDA runtime spins while it waits (its default
 * scheduling, with fewer contexts than cores), long enough to cover a synchronous 16 MiB pinned copy at the
 * device link's rate, whose reply would otherwise pay a wake-up. */
#define NVP_SPIN_US_DEFAULT 400
#define NVP_SPIN_US_MAX 200000
#define NVP_COPY_THREADS_MAX 8
#define NVP_DEBUG_NO_MAILBOX 1u      /* NVPROXY_DEBUG=no-mailbox: every reply over the socket */
#define NVP_DEBUG_ANSWERED_COPIES 2u /* NVPROXY_DEBUG=answered-copies: every posted copy answered */
#define NVP_DEBUG_NO_INLINE 4u       /* NVPROXY_DEBUG=no-inline: the proxy's (the shim knows the word) */
struct nvp_settings {
    uint64_t spin_ns; /* NVPROXY_SPIN_US */
    int copy_threads; /* NVPROXY_COPY_THREADS (0: unset) */
    unsigned debug;   /* NVPROXY_DEBUG: NVP_DEBUG_* */
    int managed;      /* NVPROXY_MANAGED: NVP_MANAGED_* */
};
enum { NVP_MANAGED_AUTO, NVP_MANAGED_MIGRATE, NVP_MANAGED_ZERO_COPY };
const struct nvp_settings *nvp_settings(void);
int nvp_debug(unsigned flag); /* is NVPROXY_DEBUG's flag (NVP_DEBUG_*) on? */
/* cudaSuccess, or cudaErrorInitializationError where a setting is refused (said once on stderr) */
cudaError_t nvp_settings_error(void);
/* ---- copy_plan.c: the ways a pageable copy goes through the staging buffer, by direction and size ---- */
enum nvp_copy_way {
    NVP_WAY_POSTED, /* to device memory the shim knows: one request, answered before its DMA ends (else a slot) */
    NVP_WAY_WHOLE,  /* all of it in the buffer at once, in parts the copy threads copy, overlapped with the DMA */
    NVP_WAY_SLOTS,  /* a slot at a time, the buffer's slots in flight at once */
};
struct nvp_copy_plan {
    enum nvp_copy_way way;
    int round; /* (from the device) it lands at the next place round the buffer, not at its start */
};
struct nvp_copy_plan nvp_copy_plan(int to_device, size_t n);
struct nvp_host_stores {
    int streaming; /* non-temporal stores (nvp_copy_for_dma), else plain ones */
    int parallel;  /* shared with the copy threads */
};
struct nvp_host_stores nvp_small_stores(size_t n); /* a copy into the buffer that goes in one request */
/* ---- parcopy.c ---- */
/* memcpy on several threads when large; for_dma: into staging memory a DMA reads next (nvp_copy_for_dma) */
void nvp_par_memcpy(void *dst, const void *src, size_t n, int for_dma);
void nvp_copy_for_dma(void *dst, const void *src, size_t n); /* memcpy with streaming stores (parcopy.c) */
void nvp_copy_small_for_dma(void *dst, const void *src, size_t n); /* stores by nvp_small_stores (copy_plan.c) */
#define NVP_PAR_MAX_PARTS 128
size_t nvp_par_part(size_t n); /* a good part size for a job of n bytes */
/* a job of n bytes in parts of `part`, the first `ready` of them copyable now: how many parts (0: no job, the
 * caller copies alone; only one job at a time) */
size_t nvp_par_begin(void *dst, const void *src, size_t n, size_t part, size_t ready, int for_dma);
void nvp_par_ready(size_t parts); /* parts below this are copyable now */
int nvp_par_done(size_t i);       /* part i has been copied */
int nvp_par_help(void);           /* the caller copies a ready part: 1, or 0 if none is ready */
void nvp_par_end(int abandon);    /* copy the rest (none, if abandon) and wait for the helpers */
void nvp_parcopy_after_fork(void);
/* Print one line to stderr naming a call nvproxy does not support. */
cudaError_t nvp_unsupported(const char *call);
#define MAX_PARAM_BYTES 32764 /* the largest kernel parameter block (CUDA 12.1+) */
cudaError_t nvp_pack_kernel(const void *func, dim3 grid, dim3 block, size_t shmem, void **args, uint32_t *kid,
                            unsigned char *buf, size_t cap, size_t *size);
uint64_t nvp_host_node_callback(void *fn, void *data); /* 0 on failure */
cudaError_t nvp_callbacks_resume(void); /* before a graph launch: host nodes may call back */
void nvp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int nvp_trace_enabled(void);

/* ---- errors.c ---- */
cudaError_t nvp_ret(cudaError_t err);       /* records err as this thread's last error */
void nvp_note_async_error(cudaError_t err); /* an earlier async call failed */
cudaError_t nvp_sticky_error(void);
int nvp_is_sticky(cudaError_t err);
void nvp_set_sticky(cudaError_t err);

/* ---- tables.c ---- */
/* Small device allocations carved out locally (suballoc.c); tag says where
 * the block belongs (kept beside the allocation in the table below). */
cudaError_t nvp_suballoc(size_t size, uint64_t *out, int *tag); /* cudaErrorNotSupported: ask the proxy */
void nvp_subfree(uint64_t addr, int tag);
void nvp_suballoc_reset(int dev);
void nvp_note_async_sent(void); /* a fire-and-forget request went out */
uint64_t nvp_async_sent(void);
int nvp_devices_known_idle(void);                /* every device finished all work sent so far (suballoc.c) */
void nvp_note_devices_idle(uint64_t sent_before); /* every device finished the work sent before sent_before */
void nvp_note_device_idle(int dev, uint64_t sent_before); /* the device finished those */
int nvp_device_known_idle(int dev); /* nothing sent since the device was last seen idle */

/* Device allocations (cudaMalloc family) known to the shim. */
#define NVP_ALLOC_PROXY 0 /* tag of an allocation the proxy made itself */
#define NVP_ALLOC_IPC (-1) /* another process's memory, opened with cudaIpcOpenMemHandle */
#define NVP_ALLOC_VMM (-2) /* an address range reserved with cuMemAddressReserve (driver_vmm.c) */
void nvp_alloc_add(uint64_t base, uint64_t size, int tag);
int nvp_alloc_remove(uint64_t base, int *tag); /* 0 if base was a live allocation */
int nvp_alloc_tag(uint64_t base);              /* the tag of the allocation at base (NVP_ALLOC_PROXY: none) */
void nvp_alloc_forget(uint64_t lo, uint64_t hi); /* every allocation based in [lo, hi) */
/* Does [p, p+n) lie in the device arena; and if so, inside a live allocation? */
int nvp_in_arena(uint64_t p);
int nvp_alloc_contains(uint64_t p, uint64_t n);
/* Module variables live outside the arena; the shim learns their ranges. */
void nvp_symbol_add(uint64_t base, uint64_t size);
/* Arena or module-variable address: memory of a device, not of the host. */
int nvp_is_device_ptr(uint64_t p);

/* NVP_HOST_POOL: a chunk that pinned_pool.c carves cudaMallocHost blocks out of */
enum nvp_host_kind { NVP_HOST_ALLOC = 1, NVP_HOST_REGISTERED = 2, NVP_HOST_MANAGED = 3, NVP_HOST_POOL = 4 };
struct nvp_host_region {
    uint64_t base, size;    /* the whole mapping (page aligned) */
    uint64_t user, user_size; /* what the application asked for */
    int kind;
    unsigned flags;
    int fd; /* the memfd, kept: a proxy started after a failure maps it again */
    int migrates; /* managed memory whose address is device memory in the proxy (managed_pages.c) */
};
void nvp_host_add(const struct nvp_host_region *r);
/* Call fn for every shared host region (under the table's lock; fn may change fd). */
void nvp_host_foreach(void (*fn)(struct nvp_host_region *r, void *arg), void *arg);
int nvp_host_remove(uint64_t user, struct nvp_host_region *out);
/* Is [p, p+n) inside memory the proxy can address (pinned/registered)? */
int nvp_host_shared(uint64_t p, uint64_t n, struct nvp_host_region *out);
int nvp_host_overlaps(uint64_t p, uint64_t n);
/* memory.c: shared host memory at the same address in both processes (kind: nvp_host_kind) */
cudaError_t nvp_host_alloc(void **p, size_t size, unsigned flags, int kind);
cudaError_t nvp_host_free(const struct nvp_host_region *h);
/* managed_pages.c: managed memory that migrates between the host and the device.  Before every request
 * (nvp_managed_before_request) the chunks the program touched go back to the device. */
extern _Atomic int nvp_mm_pending;
void nvp_managed_sync_point(void);
static inline void nvp_managed_before_request(void)
{
    if (__atomic_load_n((int *)&nvp_mm_pending, __ATOMIC_RELAXED))
        nvp_managed_sync_point();
}
cudaError_t nvp_managed_pages_alloc(void **out, size_t size, unsigned flags); /* cudaErrorNotSupported: zero-copy */
void nvp_managed_pages_free(uint64_t base); /* before the memory goes */
void nvp_managed_prefetch(void);            /* cudaMemPrefetchAsync to the device */
void nvp_managed_reshared(void);            /* a new proxy (recovery) mapped the host side again */
/* hostreg.c: the application's pages [base, +len) moved into new shared memory in place: its descriptor, or -1 and
 * *err */
int nvp_host_move(uint64_t base, uint64_t len, cudaError_t *err);
int nvp_host_threads(uint64_t len); /* threads that make len bytes of shared memory (1: fallocate does as well) */
int nvp_host_make(void *p, uint64_t len, int threads); /* every page of a shared mapping made: 0, or -1 (no room) */
/* pinned_pool.c: small pinned allocations as blocks of shared chunks (cudaErrorNotSupported: not pooled) */
cudaError_t nvp_pinned_alloc(size_t size, unsigned flags, void **out);
cudaError_t nvp_pinned_free(uint64_t p);
/* is [p, p+n) in a live block: its flags, start and size */
int nvp_pinned_block(uint64_t p, uint64_t n, unsigned *flags, uint64_t *base, uint64_t *size);

/* Handle tables: streams and events are small IDs owned by nvproxy. */
enum nvp_handle_type {
    NVP_H_STREAM = 1,
    NVP_H_EVENT = 2,
    NVP_H_GRAPH = 3,
    NVP_H_GRAPH_EXEC = 4,
    NVP_H_GRAPH_NODE = 5,
    NVP_H_ARRAY = 6,
    NVP_H_VMM = 7, /* the driver's physical allocations (cuMemCreate): the wire id is the whole handle */
    NVP_H_TYPES
};
struct nvp_stream_rec {
    int device;
    unsigned flags;
    int priority;
};
struct nvp_event_rec {
    int device;
    unsigned flags;
    int recorded;
};
uint64_t nvp_handle_new(int type, const void *rec, size_t rec_size);
int nvp_handle_get(int type, uint64_t handle, void *rec, size_t rec_size); /* 0 ok */
int nvp_handle_set(int type, uint64_t handle, const void *rec, size_t rec_size);
int nvp_handle_free(int type, uint64_t handle);
uint32_t nvp_handle_id(uint64_t handle);
uint64_t nvp_handle_of(int type, uint32_t id); /* the live handle of a wire id, or 0 */

/* ---- stream.c ---- */
/* Translate an application stream to its wire value; -1 if invalid. */
int64_t nvp_stream_wire(cudaStream_t s, int per_thread_default);
/* nvp_enter() for a call on a stream, which must be valid; *wire: its wire value. */
cudaError_t nvp_enter_stream(cudaStream_t s, int per_thread_default, int64_t *wire);
/* The callback thread, started on first use. */
cudaError_t nvp_callbacks_start(void);
void nvp_callbacks_close(void);
void nvp_callbacks_restarted(void); /* DMTCP's RESTART: cut-off callback threads' descriptors held again */

/* ---- device.c ---- */
const struct nvp_device_info *nvp_device_info(int dev);
cudaError_t nvp_valid_device(int device); /* channel up and a device that exists */

/* ---- launch.c ---- */
cudaError_t nvp_var_resolve(const void *symbol, uint64_t *addr, size_t *size);
cudaError_t nvp_launch(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                       cudaStream_t stream, int per_thread, unsigned flags);

/* ---- dmtcp.c, channel.c, recovery.c, shm_fd.c, dmtcp_memfd.c: checkpointing under DMTCP ---- */
void nvp_ckpt_disable(void); /* no checkpoint while a call is half done */
void nvp_ckpt_enable(void);
int nvp_ckpt_held(void); /* this thread is between nvp_ckpt_disable and _enable */
int nvp_under_dmtcp(void);
void nvp_wait_for_restore(void);       /* dmtcp.c: after a restart, until the new proxy is up (holding nothing) */
void nvp_callback_gate_enter(void);     /* dmtcp.c: before submitting work that calls back (a host function,
                                           a graph launch): waits while a checkpoint drains the device */
void nvp_callback_gate_leave(void);
int nvp_on_callback_thread(void);       /* stream.c: this thread runs host callbacks */
const char *nvp_restart_devices(void); /* NVPROXY_DEVICES of dmtcp_restart's environment */
const char *nvp_restart_image_id(void); /* while a restart restores: the id its GPU image must have, or NULL */
pid_t nvp_real_pid(void);
char **nvp_env_without_shim(const char *visible); /* environ less LD_PRELOAD etc. (calloc'ed; visible: CUDA_VISIBLE_DEVICES=) */
const char *nvp_python(void);                     /* the Python that runs nvproxy */
extern struct nvp_test_hooks nvp_test;            /* test_hooks.c: the tests' hooks, if their library is loaded */
int nvp_private_dir(char *out, size_t cap); /* the user's 0700 directory of sockets and handles: 0, or -1 */
int nvp_unix_connect(const char *path); /* a connected SOCK_STREAM socket DMTCP does not see, or -1 */
int nvp_close_private(int fd);          /* closes what nvp_unix_connect made */
int nvp_read_full(int fd, void *buf, size_t n);       /* all n bytes from a blocking fd: 0, or -1 (error, end) */
int nvp_send_full(int fd, const void *buf, size_t n); /* all n bytes to a socket, without SIGPIPE: 0, or -1 */
const char *nvp_control_path(void); /* the proxy's control socket, NULL before the first call */
void nvp_disconnect_all(void);      /* close every channel (before a checkpoint) */
void nvp_reconnect_same_proxy(void);
int nvp_restore_from(const char *image); /* a new proxy from an image (after a restart) */
int nvp_memfd(const char *what);       /* a memfd with a name of its own (DMTCP: see shm_fd.c) */
/* len bytes of shared memory for pinned or registered host memory, which a DMTCP restart brings back (shm_fd.c);
 * what: "nvproxy-..." */
int nvp_host_fd(const char *what, uint64_t len);
/* the same, its space not taken: its user makes every page before the memory is used (nvp_host_make, write: a full
 * /dev/shm is then an error, not a later SIGBUS); a memfd where /dev/shm has no room now */
int nvp_host_fd_untaken(const char *what, uint64_t len);
int nvp_memfd_sealable(const char *what); /* the same, open to F_ADD_SEALS */
void nvp_remake_pinned(void);            /* after a restart: pinned memory into fresh shared memory */

/* ---- launch.c: after a recovery the new proxy must be told modules again ---- */
void nvp_registry_reset(void);

/* ---- mempool.c ---- */
void nvp_pool_forget(uint64_t ptr);
int nvp_pool_import_free(uint64_t ptr);

/* ---- graph.c ---- */
struct nvp_graph_rec {
    int device;
    uint32_t root; /* a conditional node's body graph: the wire id of the graph at the top, else 0 */
};
struct nvp_node_rec {
    uint32_t graph; /* the graph's wire id */
    int kind;       /* NVP_NODE_* */
    uint64_t ptr, size; /* memory nodes: the allocation */
};
cudaError_t nvp_graph_new(cudaGraph_t *out, int device, uint16_t op, uint64_t a[NVP_MAX_ARGS], int at);
int nvp_node_ids(uint32_t graph_id, const cudaGraphNode_t *nodes, size_t n, uint32_t *out);
cudaError_t nvp_graph_add_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                               int kind, const void *body, size_t blen, const struct nvp_node_rec *as);
int64_t nvp_event_wire(cudaEvent_t e);

/* ---- graph_mem.c: who frees memory that graphs free (memory nodes, captured cudaFreeAsync) ---- */
enum nvp_owner {
    NVP_OWN_CAPTURE = 1, /* frees it: a capture, a graph, an executable graph */
    NVP_OWN_GRAPH,
    NVP_OWN_EXEC,
    NVP_OWN_ALLOC_NODE, /* made it: an allocation node's graph, and their executable graphs */
    NVP_OWN_ALLOC_EXEC,
    NVP_OWN_FREED, /* the program freed it (an allocation node's, still held) */
    NVP_OWN_SIZE,  /* an allocation node's size (the statistics) */
};
extern int nvp_captures_on; /* captures begun and not ended: only then may a cudaFreeAsync be captured */
/* cudaMallocAsync / cudaFreeAsync on a capturing stream: memory nodes of the capture (1, *err), else 0 */
int nvp_graph_mem_capture_alloc(void **ptr, size_t size, int dev, cudaStream_t s, int ptds, cudaError_t *err);
int nvp_graph_mem_capture_free(uint64_t ptr, cudaStream_t s, int ptds, cudaError_t *err);
/* per-thread-stream variants the CUDA headers declare only under CUDA_API_PER_THREAD_DEFAULT_STREAM (capture.c) */
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                          cudaGraph_t *graph, const cudaGraphNode_t **deps,
                                          const cudaGraphEdgeData **edges, size_t *ndeps);
cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t s, cudaGraphNode_t *nodes,
                                                     const cudaGraphEdgeData *edges, size_t n, unsigned flags);
void nvp_graph_mem_hold(uint64_t ptr, int kind, uint64_t id, int host);
void nvp_graph_mem_pass(int from, uint64_t from_id, int to, uint64_t to_id, int move);
int nvp_graph_mem_holds(int kind, uint64_t id);
void nvp_graph_mem_release(int kind, uint64_t id);
void nvp_graph_mem_forget(uint64_t ptr);
int nvp_graph_mem_user_free(uint64_t ptr);
void nvp_graph_mem_launched(uint64_t exec);
void CUDART_CB nvp_stage_rows(void *stage);
void *nvp_stage_new(uint64_t pageable, uint64_t width, uint64_t height, uint64_t depth, uint64_t pitch, uint64_t rows,
                    int to_device, uint64_t span, uint64_t *data);
cudaError_t nvp_graph_mem_capture_copy(uint64_t dst, uint64_t src, size_t n, int64_t w, int to_device, int *taken);
cudaError_t nvp_host_func_wire(int64_t w, void *fn, void *data); /* stream.c */
cudaError_t nvp_capture_status(int64_t w, enum cudaStreamCaptureStatus *status, unsigned long long *id); /* capture.c */

/* ---- array.c ---- */
int nvp_array_id(cudaArray_const_t a, uint32_t *id); /* the array's wire id; -1 if not an array */
cudaError_t nvp_copy3d_arrays(const struct cudaMemcpy3DParms *p, int64_t stream, int is_async);

/* ---- memory.c ---- */
cudaError_t nvp_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                       int64_t wire_stream, int is_async);
/* The entry check of a copy: a proxy, a valid direction and stream. */
cudaError_t nvp_copy_entry(enum cudaMemcpyKind kind, int64_t wire_stream);

#endif
