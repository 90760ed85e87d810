/* Memory: device allocations (in the proxy's arena), pinned host memory
 * (shared memory mapped at the same address in both processes: nvp_host_fd), copies and memsets.
 * Pageable host memory never reaches the proxy directly: it is staged through
 * the thread's shared staging slots, several chunks in flight. */
#include "shim.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PITCH_ALIGN 512
/* pinned host memory is placed here in both processes, far from the heap,
 * the libraries and the device arenas (0x2000_0000_0000 + 1 TiB per device) */
#define HOST_ARENA_BASE 0x300000000000ull
#define HOST_ARENA_END 0x3f0000000000ull
#define HUGE_PAGE (2ull << 20)

static uint64_t page_size(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }

static cudaError_t check_device_range(const void *p, size_t n)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    if (nvp_in_arena(a) && !nvp_alloc_contains(a, n))
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* ---- device memory ---- */

static cudaError_t device_alloc(void **p, size_t size)
{
    if (!p)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    uint64_t addr;
    int tag = NVP_ALLOC_PROXY;
    e = nvp_suballoc(size, &addr, &tag);
    if (e == cudaErrorNotSupported) {
        uint64_t a[NVP_MAX_ARGS] = {size};
        struct nvp_reply r = {0};
        e = nvp_call(NVP_OP_MALLOC, a, NULL, 0, &r, -1);
        addr = r.h.r[0];
    }
    if (e)
        return nvp_ret(e);
    nvp_alloc_add(addr, size, tag);
    *p = (void *)(uintptr_t)addr;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) { return device_alloc(devPtr, size); }

NVP_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!pitch)
        return nvp_ret(cudaErrorInvalidValue);
    size_t pt = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    cudaError_t e = device_alloc(devPtr, pt * height);
    if (!e)
        *pitch = pt;
    return e;
}

NVP_EXPORT cudaError_t cudaFree(void *devPtr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!devPtr)
        return cudaSuccess;
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    struct nvp_host_region h;
    if (nvp_host_shared(p, 0, &h) && h.kind == NVP_HOST_MANAGED && h.user == p)
        return nvp_ret(nvp_host_free(&h));
    if (nvp_graph_mem_user_free(p)) /* (a graph's allocation node makes it again at its next launch) */
        return cudaSuccess;
    if (nvp_pool_import_free(p)) /* (another process's pool allocation: the mapping goes) */
        return cudaSuccess;
    int tag;
    int owner = nvp_alloc_tag(p); /* (IPC: cudaIpcCloseMemHandle's; VMM: cuMemAddressFree's) */
    if (owner == NVP_ALLOC_IPC || owner == NVP_ALLOC_VMM || nvp_alloc_remove(p, &tag) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    nvp_pool_forget(p);
    nvp_graph_mem_forget(p);
    if (tag != NVP_ALLOC_PROXY) {
        nvp_subfree(p, tag);
        return cudaSuccess;
    }
    uint64_t a[NVP_MAX_ARGS] = {p};
    return nvp_ret(nvp_call(NVP_OP_FREE, a, NULL, 0, NULL, -1));
}

NVP_EXPORT cudaError_t cudaMemGetInfo(size_t *free_, size_t *total)
{
    if (!free_ || !total)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {0};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_MEM_INFO, a, NULL, 0, &r, -1);
    if (!e) {
        *free_ = r.h.r[0];
        *total = r.h.r[1];
    }
    return nvp_ret(e);
}

/* ---- pinned host memory ---- */

static _Atomic uint64_t host_cursor = HOST_ARENA_BASE;

/* host_sharing_held: the shim's list of shared host memory and the proxy's change together, with checkpoints
 * held off.  A restart shares again what the list holds; memory the proxy had (so the image too) but the list
 * not yet, checkpointed between the two, was not shared with the new proxy, and its cudaFreeHost failed with
 * cudaErrorHostMemoryNotRegistered (callback_threads under DMTCP at its call 27, on the GPU). */
static cudaError_t share_with_proxy(int fd, uint64_t base, uint64_t size, unsigned flags)
{
    uint64_t a[NVP_MAX_ARGS] = {base, size, flags};
    struct nvp_reply r = {0};
    return nvp_call(NVP_OP_HOST_REGISTER, a, NULL, 0, &r, fd);
}

static cudaError_t host_alloc(void **pHost, size_t size, unsigned flags, int kind);

cudaError_t nvp_host_alloc(void **pHost, size_t size, unsigned flags, int kind)
{
    if (!pHost)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (size == 0) {
        *pHost = NULL;
        return cudaSuccess;
    }
    if (kind == NVP_HOST_ALLOC && (e = nvp_pinned_alloc(size, flags, pHost)) != cudaErrorNotSupported)
        return nvp_ret(e); /* a block of a chunk already shared: no round trip */
    nvp_ckpt_disable(); /* from the shared memory to the list (see host_sharing_held) */
    e = host_alloc(pHost, size, flags, kind);
    nvp_ckpt_enable();
    return e;
}

static cudaError_t host_alloc(void **pHost, size_t size, unsigned flags, int kind)
{
    cudaError_t e;
    uint64_t len = (size + page_size() - 1) / page_size() * page_size();
    /* Its space taken now: by fallocate, or where several threads make the pages faster (hostreg.c), by them in
     * the mapping below (which then has them mapped) */
    int threads = nvp_host_threads(len), made = threads == 1;
    int fd = made ? nvp_host_fd("nvproxy-pinned", len) : nvp_host_fd_untaken("nvproxy-pinned", len);
    if (fd < 0)
        return nvp_ret(cudaErrorMemoryAllocation);
    /* the same address must be free in both processes: try places in the host
     * arena until both sides can map there; each on a 2 MiB boundary (huge pages, where /dev/shm has them) */
    e = cudaErrorMemoryAllocation;
    uint64_t step = ((len + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)) + HUGE_PAGE;
    for (int tries = 0; tries < 64; tries++) {
        uint64_t at = atomic_fetch_add(&host_cursor, step);
        if (at + len > HOST_ARENA_END)
            break;
        void *p = mmap((void *)(uintptr_t)at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
        if (p == MAP_FAILED)
            continue;
        if ((uint64_t)(uintptr_t)p != at) { /* kernels without NOREPLACE treat it as a hint */
            munmap(p, len);
            continue;
        }
        if (!made && nvp_host_make(p, len, threads) != 0) { /* (no room for it) */
            munmap(p, len);
            break;
        }
        made = 1;
        e = share_with_proxy(fd, at, len, flags);
        if (e == cudaSuccess) {
            if (nvp_test.host_shared) /* (tests only: a checkpoint must not come in between) */
                nvp_test.host_shared();
            struct nvp_host_region h = {at, len, at, size, kind, flags, fd, 0};
            nvp_host_add(&h);
            *pHost = p;
            return cudaSuccess;
        }
        munmap(p, len);
        if (e != cudaErrorAlreadyMapped)
            break;
    }
    close(fd);
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return nvp_host_alloc(ptr, size, cudaHostAllocDefault, NVP_HOST_ALLOC);
}

NVP_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return nvp_ret(cudaErrorInvalidValue);
    return nvp_host_alloc(pHost, size, flags, NVP_HOST_ALLOC);
}

static cudaError_t unregister_in_proxy(uint64_t base)
{
    uint64_t a[NVP_MAX_ARGS] = {base};
    struct nvp_reply r = {0};
    return nvp_call(NVP_OP_HOST_UNREGISTER, a, NULL, 0, &r, -1);
}

/* cudaHostUnregister's request.  It returns once no device can be using the memory: the proxy waits for every
 * device.  Where none can be (each has finished all the work sent to any, as a synchronisation found), there is
 * nothing to wait for, and the request is posted: the proxy unregisters the memory in call order while the program
 * goes on.  A failure there (none is expected: the range is known registered) comes with a later reply, and the
 * proxy names it in one line. */
static cudaError_t unregister_registered(uint64_t base)
{
    uint64_t a[NVP_MAX_ARGS] = {base};
    if (nvp_devices_known_idle())
        return nvp_call(NVP_OP_HOST_UNREGISTER, a, NULL, 0, NULL, -1);
    uint64_t sent = nvp_async_sent();
    cudaError_t e = unregister_in_proxy(base);
    if (!e)
        nvp_note_devices_idle(sent);
    return e;
}

NVP_EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!ptr)
        return cudaSuccess;
    struct nvp_host_region h;
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    if (!nvp_host_shared(p, 0, &h))
        return nvp_ret(cudaErrorInvalidValue);
    if (h.kind == NVP_HOST_POOL)
        return nvp_ret(nvp_pinned_free(p));
    if (h.kind != NVP_HOST_ALLOC || h.user != p)
        return nvp_ret(cudaErrorInvalidValue);
    return nvp_ret(nvp_host_free(&h));
}

cudaError_t nvp_host_free(const struct nvp_host_region *h)
{
    /* The table's entry, not the caller's copy, whose memfd a restart in between may have replaced (the old
     * number can name another thread's channel by then: see remake_memfd); closed inside the hold for the
     * same reason. */
    nvp_ckpt_disable(); /* (see host_sharing_held) */
    struct nvp_host_region now;
    if (nvp_host_remove(h->user, &now) != 0) { /* (another thread freed it meanwhile) */
        nvp_ckpt_enable();
        return cudaErrorInvalidValue;
    }
    if (now.migrates)
        nvp_managed_pages_free(now.base);
    cudaError_t e = unregister_in_proxy(now.base); /* (the proxy waits for the devices first) */
    if (now.fd >= 0)
        close(now.fd);
    nvp_ckpt_enable();
    munmap((void *)(uintptr_t)now.base, now.size);
    return e;
}

static cudaError_t host_register(uint64_t user, size_t size, unsigned int flags);

NVP_EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!ptr || size == 0)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t user = (uint64_t)(uintptr_t)ptr;
    if (user + size < user)
        return nvp_ret(cudaErrorInvalidValue);
    if (nvp_host_overlaps(user, size)) /* (one look: a page at a time took ~10 ms a GiB) */
        return nvp_ret(cudaErrorHostMemoryAlreadyRegistered);
    nvp_ckpt_disable(); /* from the shared memory to the list (see host_sharing_held) */
    e = host_register(user, size, flags);
    nvp_ckpt_enable();
    return nvp_ret(e);
}

static cudaError_t host_register(uint64_t user, size_t size, unsigned int flags)
{
    uint64_t base = user & ~(page_size() - 1);
    uint64_t len = (user + size - base + page_size() - 1) / page_size() * page_size();
    cudaError_t e;
    int fd = nvp_host_move(base, len, &e); /* (now shareable with the proxy) */
    if (fd < 0)
        return e;
    e = share_with_proxy(fd, base, len, flags);
    if (e) {
        close(fd);
        if (e != cudaErrorAlreadyMapped)
            return e;
        /* (the proxy must map it at the same address, and its own mappings, the driver's among them, hold some of
         * it: rare, and not what the error says, so say it) */
        nvp_log("nvproxy: cudaHostRegister: [%#llx, +%#llx) is taken in the proxy's address space; returning "
                "cudaErrorHostMemoryAlreadyRegistered",
                (unsigned long long)base, (unsigned long long)len);
        return cudaErrorHostMemoryAlreadyRegistered;
    }
    struct nvp_host_region h = {base, len, user, size, NVP_HOST_REGISTERED, flags, fd, 0};
    nvp_host_add(&h);
    return cudaSuccess;
}

static int host_live(uint64_t p, uint64_t n, struct nvp_host_region *h);

NVP_EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_host_region h;
    nvp_ckpt_disable(); /* (see host_sharing_held) */
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    if (p && host_live(p, 1, &h) && (h.kind == NVP_HOST_ALLOC || h.kind == NVP_HOST_POOL)) {
        e = cudaErrorInvalidValue; /* (the runtime's answer for pinned memory it allocated) */
    } else if (!p || !nvp_host_shared(p, 1, &h) || h.kind != NVP_HOST_REGISTERED || h.user != p ||
               nvp_host_remove(p, &h) != 0) { /* (a chunk of the pool starts where a freed block did) */
        e = cudaErrorHostMemoryNotRegistered;
    } else { /* the pages stay where they are (shared memory now, same contents) */
        if (h.fd >= 0)
            close(h.fd);
        e = unregister_registered(h.base);
    }
    nvp_ckpt_enable();
    return nvp_ret(e);
}

/* Is [p, p+n) pinned memory the application holds: shared, and in a pool chunk a live block (whose flags then
 * stand in h's)? */
static int host_live(uint64_t p, uint64_t n, struct nvp_host_region *h)
{
    struct nvp_host_region r;
    if (!nvp_host_shared(p, n, &r))
        return 0;
    if (r.kind == NVP_HOST_POOL && !nvp_pinned_block(p, n, &r.flags, NULL, NULL))
        return 0;
    if (h)
        *h = r;
    return 1;
}

NVP_EXPORT cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    if (!pDevice || flags != 0)
        return nvp_ret(cudaErrorInvalidValue);
    if (!host_live((uint64_t)(uintptr_t)pHost, 1, NULL))
        return nvp_ret(cudaErrorInvalidValue);
    *pDevice = pHost; /* unified addressing: mapped at the same address in the proxy */
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    struct nvp_host_region h;
    if (!pFlags || !host_live((uint64_t)(uintptr_t)pHost, 1, &h))
        return nvp_ret(cudaErrorInvalidValue);
    *pFlags = h.flags | cudaHostAllocMapped;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    if (!attr)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    struct nvp_host_region h;
    memset(attr, 0, sizeof *attr);
    attr->device = nvp_current_device();
    int managed = host_live(p, 1, &h) && h.kind == NVP_HOST_MANAGED; /* (device memory too, where it migrates) */
    if (nvp_is_device_ptr(p) && !managed) {
        attr->type = cudaMemoryTypeDevice;
        attr->devicePointer = (void *)ptr;
        for (int d = 0; d < nvp_device_count(); d++) {
            const struct nvp_device_info *di = nvp_device_info(d);
            if (di && p >= di->arena_base && p - di->arena_base < di->arena_size)
                attr->device = d;
        }
    } else if (host_live(p, 1, &h)) {
        attr->type = h.kind == NVP_HOST_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeHost;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

/* ---- copies ---- */

static int pageable(uint64_t p, size_t n) { return !nvp_is_device_ptr(p) && !nvp_host_shared(p, n, NULL); }

/* The piece of a staged copy that one slot carries (copies larger than the staging buffer, and small ones) */
static size_t piece_of(const struct nvp_staging *s, size_t n) { return n < s->slot_size ? n : s->slot_size; }

/* Which way a staged copy goes (posted, whole, slot by slot) is copy_plan.c's choice. */

static cudaError_t send_staged(uint64_t dev, size_t off, size_t len, int64_t stream, int to_host)
{
    uint64_t a[NVP_MAX_ARGS] = {dev, off, len, (uint64_t)stream, (uint64_t)to_host};
    return nvp_send_pending(NVP_OP_STAGED_COPY, a, 0);
}

/* the replies to `sent` requests (all are read: the stream of replies stays framed); the first error */
static cudaError_t collect(size_t sent, cudaError_t first)
{
    for (size_t i = 0; i < sent; i++) {
        struct nvp_reply r = {0};
        cudaError_t e = nvp_wait_pending(&r);
        if (e == cudaErrorDevicesUnavailable)
            return e;
        if (e && !first)
            first = e;
    }
    return first;
}

/* ---- posted copies: a small pageable copy to the device, answered before its DMA ends ----
 * The runtime's pageable cudaMemcpy to the device returns once the bytes are staged, after the streams it waits
 * for are idle, and cudaMemcpyAsync's at once (CUDA's "API synchronization behavior": it returns before its DMA
 * has ended).  Answered only once done, a small copy would wait for the DMA the runtime does not wait for.  So the
 * proxy answers a posted copy as the runtime returns (NVP_OP_STAGED_COPY), and its bytes stay in the staging
 * buffer until the proxy says in the mailbox that the copy is done. */

/* Runs of posted copies go unanswered (below) unless NVPROXY_DEBUG=answered-copies: the thread stages the next
 * while the proxy issues the last, instead of waiting a round trip for each */

/* Forget the posted copies known to be done: up to known, and what the mailbox says */
static void posted_settle(struct nvp_staging *s, uint64_t known)
{
    uint64_t said = nvp_posted_done();
    known = known > said ? known : said;
    if (known > s->posted_known)
        s->posted_known = known;
    while (s->pcount && s->pq[s->pfirst % NVP_POSTED_MAX].num <= s->posted_known) {
        s->pfirst++;
        s->pcount--;
    }
}

/* A run of posted copies that need no answer (NVP_STAGED_UNANSWERED): the thread's last request, a posted copy
 * the proxy's C path answered at once (NVP_STAGED_RUN), which says for a synchronous copy that the streams it
 * waits for were idle (idle), for a cudaMemcpyAsync that its stream is good (!idle); and
 * from then on only posted copies on that stream and fences, of this thread, with nothing of any thread between
 * (nvp_send_after).  Then the proxy can have nothing to say to the next: the idle streams got no work but posted
 * copies, which no host can tell a synchronous copy waited for (fastpath.c: issued), the stream is still there,
 * and the shim checked the destination.  Back to back, the thread then only stages each copy while the proxy
 * issues the last (issuing one in a run costs the proxy less than alone: benchmarks/probes/batch_issue.cu),
 * instead of waiting for each answer. */
static __thread struct {
    uint64_t seq; /* 0: no run */
    int64_t stream;
    int dev, idle, gen; /* gen: the proxy's (nvp_generation): a new proxy knows no run */
} run;

static cudaError_t posted_fence(struct nvp_staging *s, uint64_t upto)
{
    uint64_t a[NVP_MAX_ARGS] = {upto}, before = nvp_last_request();
    struct nvp_reply r = {0};
    cudaError_t e = nvp_call(NVP_OP_STAGED_FENCE, a, NULL, 0, &r, -1);
    if (!e)
        posted_settle(s, upto);
    if (run.seq) /* (a fence issues nothing: the run goes on if nothing came between) */
        run.seq = !e && run.seq == before && nvp_last_request() == before + 1 ? before + 1 : 0;
    return e;
}

cudaError_t nvp_posted_quiet(struct nvp_staging *s)
{
    posted_settle(s, 0);
    return s->pcount ? posted_fence(s, s->posted) : cudaSuccess;
}

/* Where a posted copy of n bytes goes: the lowest place clear of the copies still in flight (so that the same few
 * pages come round again: staged round the whole buffer, small copies were slower, most likely the DMA's address
 * translation missing on fresh pages); once the oldest is done when none is clear, or when as many are in flight
 * as the proxy keeps. */
static cudaError_t posted_place(struct nvp_staging *s, size_t n, size_t *off)
{
    size_t total = s->slot_size * (size_t)s->nslots, len = (n + 255) & ~(size_t)255;
    for (;;) {
        posted_settle(s, 0);
        size_t at = 0;
        if (s->pcount < NVP_POSTED_MAX) {
            for (unsigned tried = 0; tried <= s->pcount; tried++) { /* candidates: 0, and after each in flight */
                at = tried ? s->pq[(s->pfirst + tried - 1) % NVP_POSTED_MAX].off +
                                 s->pq[(s->pfirst + tried - 1) % NVP_POSTED_MAX].len
                           : 0;
                int clear = at + len <= total;
                for (unsigned i = 0; i < s->pcount && clear; i++) {
                    const struct nvp_posted *q = &s->pq[(s->pfirst + i) % NVP_POSTED_MAX];
                    clear = !(q->off < at + len && at < q->off + q->len);
                }
                if (clear) {
                    s->pq[(s->pfirst + s->pcount) % NVP_POSTED_MAX] = (struct nvp_posted){++s->posted, at, len};
                    s->pcount++;
                    *off = at;
                    return cudaSuccess;
                }
            }
        }
        cudaError_t e = posted_fence(s, s->pq[s->pfirst % NVP_POSTED_MAX].num);
        if (e)
            return e;
    }
}

static cudaError_t posted_h2d(struct nvp_staging *s, uint64_t dst, const char *src, size_t n, int64_t stream,
                              int is_async)
{
    size_t off;
    cudaError_t e = posted_place(s, n, &off);
    if (e)
        return e;
    nvp_copy_small_for_dma(s->base + off, src, n);
    uint64_t a[NVP_MAX_ARGS] = {dst, off, n, (uint64_t)stream, 0, s->posted, is_async ? NVP_STAGED_ASYNC : 0};
    int dev = nvp_current_device(), sent = 0;
    if (!nvp_debug(NVP_DEBUG_ANSWERED_COPIES) && run.seq && run.gen == nvp_generation() && run.dev == dev && run.stream == stream &&
        (is_async || run.idle)) {
        a[6] |= NVP_STAGED_UNANSWERED;
        if ((e = nvp_send_after(NVP_OP_STAGED_COPY, a, run.seq, &sent)))
            return e;
        a[6] &= ~(uint64_t)NVP_STAGED_UNANSWERED;
    }
    if (sent) {
        run.seq++;
        return cudaSuccess;
    }
    if ((e = nvp_send_pending(NVP_OP_STAGED_COPY, a, 1)))
        return e;
    uint64_t seq = nvp_last_request();
    struct nvp_reply r = {0};
    e = nvp_wait_pending(&r);
    run.seq = !e && r.h.r[0] == NVP_STAGED_RUN ? seq : 0;
    run.stream = stream, run.dev = dev, run.idle = !is_async; /* (a cudaMemcpyAsync's answer says nothing of them) */
    run.gen = nvp_generation();
    return e;
}

/* ---- captured copies: a small synchronous copy from pinned memory to the device ----
 * The runtime returns once its DMA has ended, a few microseconds for a few bytes; the program can tell only that
 * the bytes were taken.  So the proxy takes them into the staging buffer once the streams the copy waits for are
 * idle (a kernel writing that memory has ended), answers, and issues the DMA from there, a posted copy
 * (NVP_STAGED_CAPTURE).  Not write-combined or I/O memory, which the CPU reads slowly, nor managed memory; nor
 * while a stream capture is on (the copy then goes as it would). */
/* (from about 64 KiB, the proxy's copy of the bytes takes as long as the DMA it spares) */
#define CAPTURE_MAX (128u << 10)

static int capturable(uint64_t dst, uint64_t src, size_t n)
{
    struct nvp_host_region h;
    return n <= CAPTURE_MAX && !nvp_captures_on && nvp_posting() && nvp_in_arena(dst) && nvp_alloc_contains(dst, n) &&
           nvp_host_shared(src, n, &h) && h.kind != NVP_HOST_MANAGED && !h.migrates &&
           !(h.flags & cudaHostAllocWriteCombined) && !(h.flags & cudaHostRegisterIoMemory);
}

static cudaError_t captured_h2d(uint64_t dst, uint64_t src, size_t n, int64_t stream)
{
    struct nvp_staging *s;
    size_t off;
    cudaError_t e = nvp_staging(&s);
    if (e || (e = posted_place(s, n, &off)))
        return e;
    uint64_t a[NVP_MAX_ARGS] = {dst, off, n, (uint64_t)stream, 0, s->posted, NVP_STAGED_CAPTURE, src};
    struct nvp_reply r = {0};
    run.seq = 0; /* (a run of posted copies goes on only from one of them) */
    return nvp_call(NVP_OP_STAGED_COPY, a, NULL, 0, &r, -1);
}

static cudaError_t whole_h2d(const struct nvp_staging *s, uint64_t dst, const char *src, size_t n, int64_t stream)
{
    size_t part = nvp_par_part(n), nparts = nvp_par_begin(s->base, src, n, part, (size_t)-1, 1);
    if (!nparts) { /* (the helpers are busy with another thread's copy) */
        nvp_copy_for_dma(s->base, src, n);
        cudaError_t e = send_staged(dst, 0, n, stream, 0);
        return e ? e : collect(1, cudaSuccess);
    }
    size_t batch = (n / 4 > (1u << 20) ? n / 4 : (1u << 20)) / part, sent = 0, done = 0, requests = 0;
    cudaError_t e = cudaSuccess;
    while (sent < nparts && !e) {
        while (done < nparts && nvp_par_done(done))
            done++;
        if (done == nparts || done - sent >= batch) {
            size_t off = sent * part, end = done * part < n ? done * part : n;
            if (!(e = send_staged(dst + off, off, end - off, stream, 0)))
                requests++;
            sent = done;
        } else if (!nvp_par_help()) {
            nvp_cpu_relax();
        }
    }
    nvp_par_end(e != cudaSuccess);
    return e == cudaErrorDevicesUnavailable ? e : collect(requests, e);
}

/* Where a copy from the device that rounds (copy_plan.c) lands: the next place round the staging buffer. */
static size_t d2h_round(struct nvp_staging *s, size_t n)
{
    size_t total = s->slot_size * (size_t)s->nslots, len = (n + 65535) & ~(size_t)65535;
    if (len > total)
        return 0;
    size_t at = s->d2h_next + len <= total ? s->d2h_next : 0;
    s->d2h_next = at + len;
    return at;
}

/* A copy from the device that goes whole comes in pieces of an eighth (1 MiB at least), whose requests go in
 * one write: the proxy issues them all at once (fastpath.c, issue_ahead) and answers each as its DMA ends, while
 * the helpers copy the pieces before it out.  (Pieces of a quarter were slower at 256 KiB and 1 MiB.) */
static size_t d2h_piece(size_t n, size_t part)
{
    size_t piece = n / 8 > (1u << 20) ? n / 8 : (1u << 20);
    return (piece + part - 1) / part * part;
}

static cudaError_t whole_d2h(struct nvp_staging *s, char *dst, uint64_t src, size_t n, int64_t stream, int round)
{
    size_t at = round ? d2h_round(s, n) : 0, part = nvp_par_part(n);
    size_t piece = d2h_piece(n, part);
    size_t pieces = (n + piece - 1) / piece, requests = pieces;
    cudaError_t first = cudaSuccess;
    uint64_t a[NVP_SEND_MANY_MAX][NVP_MAX_ARGS];
    for (size_t k = 0; k < pieces; k++) {
        size_t off = k * piece;
        uint64_t one[NVP_MAX_ARGS] = {src + off, at + off, n - off < piece ? n - off : piece, (uint64_t)stream, 1};
        memcpy(a[k], one, sizeof one);
    }
    cudaError_t e = nvp_send_pending_many(NVP_OP_STAGED_COPY, a, pieces);
    if (e)
        return e;
    size_t nparts = nvp_par_begin(dst, s->base + at, n, part, 0, 0);
    for (size_t k = 0; k < requests; k++) {
        struct nvp_reply r = {0};
        e = nvp_wait_pending(&r);
        if (e == cudaErrorDevicesUnavailable) {
            if (nparts)
                nvp_par_end(1);
            return e;
        }
        if (e && !first)
            first = e;
        if (!first && nparts)
            nvp_par_ready((k + 1) * (piece / part));
    }
    if (nparts)
        nvp_par_end(first != cudaSuccess);
    else if (!first)
        memcpy(dst, s->base + at, n);
    return first;
}

static cudaError_t staged_h2d(uint64_t dst, const char *src, size_t n, int64_t stream, int is_async)
{
    struct nvp_staging *s;
    cudaError_t e = nvp_staging(&s), first = cudaSuccess;
    if (e)
        return e;
    struct nvp_copy_plan plan = nvp_copy_plan(1, n);
    /* (posted only to device memory the shim knows: other host memory the program may read at once) */
    if (plan.way == NVP_WAY_POSTED && nvp_posting() && nvp_in_arena(dst) && nvp_alloc_contains(dst, n))
        return posted_h2d(s, dst, src, n, stream, is_async);
    if ((e = nvp_posted_quiet(s)))
        return e;
    if (plan.way == NVP_WAY_WHOLE)
        return whole_h2d(s, dst, src, n, stream);
    size_t piece = piece_of(s, n), chunks = (n + piece - 1) / piece, waited = 0;
    for (size_t k = 0; k < chunks; k++) {
        size_t slot = k % (size_t)s->nslots, off = k * piece;
        size_t len = n - off < piece ? n - off : piece;
        if (k >= (size_t)s->nslots) { /* that slot's previous chunk must be on the device */
            struct nvp_reply r = {0};
            e = nvp_wait_pending(&r);
            waited++;
            if (e && !first)
                first = e;
            if (e == cudaErrorDevicesUnavailable)
                return e;
        }
        /* (in many chunks, the host copy is what bounds them, and plain stores, which may stay in the cache,
         * copy faster than streaming stores, whose fence waits for memory; in one, it is small) */
        if (chunks == 1)
            nvp_copy_small_for_dma(s->base + slot * s->slot_size, src + off, len);
        else
            nvp_par_memcpy(s->base + slot * s->slot_size, src + off, len, 0);
        uint64_t a[NVP_MAX_ARGS] = {dst + off, slot * s->slot_size, len, (uint64_t)stream, 0};
        e = nvp_send_pending(NVP_OP_STAGED_COPY, a, chunks == 1);
        if (e)
            return e;
    }
    for (; waited < chunks; waited++) {
        struct nvp_reply r = {0};
        e = nvp_wait_pending(&r);
        if (e && !first)
            first = e;
        if (e == cudaErrorDevicesUnavailable)
            return e;
    }
    return first;
}

static cudaError_t staged_d2h_(struct nvp_staging *s, char *dst, uint64_t src, size_t n, int64_t stream);

/* (the proxy puts a copy from the device after the posted copies still in flight, and answers once it is done:
 * so they are done too) */
static cudaError_t staged_d2h(char *dst, uint64_t src, size_t n, int64_t stream)
{
    struct nvp_staging *s;
    cudaError_t e = nvp_staging(&s);
    if (e)
        return e;
    uint64_t posted = s->posted;
    if (!(e = staged_d2h_(s, dst, src, n, stream)))
        posted_settle(s, posted);
    return e;
}

static cudaError_t staged_d2h_(struct nvp_staging *s, char *dst, uint64_t src, size_t n, int64_t stream)
{
    cudaError_t e, first = cudaSuccess;
    struct nvp_copy_plan plan = nvp_copy_plan(0, n);
    if (plan.way == NVP_WAY_WHOLE)
        return whole_d2h(s, dst, src, n, stream, plan.round);
    size_t piece = piece_of(s, n), chunks = (n + piece - 1) / piece, sent = 0;
    for (; sent < chunks && sent < (size_t)s->nslots; sent++) {
        size_t off = sent * piece, len = n - off < piece ? n - off : piece;
        uint64_t a[NVP_MAX_ARGS] = {src + off, (sent % (size_t)s->nslots) * s->slot_size, len, (uint64_t)stream, 1};
        if ((e = nvp_send_pending(NVP_OP_STAGED_COPY, a, chunks == 1)))
            return e;
    }
    for (size_t k = 0; k < chunks; k++) {
        struct nvp_reply r = {0};
        e = nvp_wait_pending(&r);
        if (e == cudaErrorDevicesUnavailable)
            return e;
        size_t slot = k % (size_t)s->nslots, off = k * piece;
        size_t len = n - off < piece ? n - off : piece;
        if (e && !first)
            first = e;
        if (!first)
            nvp_par_memcpy(dst + off, s->base + slot * s->slot_size, len, 0);
        if (sent < chunks) { /* refill the slot just emptied */
            size_t o2 = sent * piece, l2 = n - o2 < piece ? n - o2 : piece;
            uint64_t a[NVP_MAX_ARGS] = {src + o2, slot * s->slot_size, l2, (uint64_t)stream, 1};
            if ((e = nvp_send_pending(NVP_OP_STAGED_COPY, a, 0)))
                return e;
            sent++;
        }
    }
    return first;
}

static cudaError_t memcpy_impl(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, int64_t stream,
                               int is_async);

struct copy_call {
    void *dst;
    const void *src;
    size_t n;
    enum cudaMemcpyKind kind;
    int64_t stream;
    int is_async;
};

static cudaError_t copy_once(void *arg)
{
    const struct copy_call *c = arg;
    return memcpy_impl(c->dst, c->src, c->n, c->kind, c->stream, c->is_async);
}

/* One exchange (nvp_exchange): a staged copy has several requests in flight and holds the staging buffer. */
cudaError_t nvp_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, int64_t stream,
                       int is_async)
{
    struct copy_call c = {dst, src, n, kind, stream, is_async};
    return nvp_exchange(copy_once, &c);
}

cudaError_t nvp_copy_entry(enum cudaMemcpyKind kind, int64_t stream)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if ((unsigned)kind > cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    return stream < 0 ? cudaErrorInvalidResourceHandle : cudaSuccess;
}

static cudaError_t memcpy_impl(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, int64_t stream,
                               int is_async)
{
    cudaError_t e = nvp_copy_entry(kind, stream);
    if (e)
        return e;
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    uint64_t d = (uint64_t)(uintptr_t)dst, s = (uint64_t)(uintptr_t)src;
    if ((e = check_device_range(dst, n)) || (e = check_device_range(src, n)))
        return e;
    int dpage = pageable(d, n), spage = pageable(s, n);
    if (dpage && spage) { /* host to host: ordered after earlier work, like the runtime */
        if (!is_async) {
            uint64_t a[NVP_MAX_ARGS] = {(uint64_t)stream};
            struct nvp_reply r = {0};
            if ((e = nvp_call(NVP_OP_STREAM_SYNC, a, NULL, 0, &r, -1)))
                return e;
        }
        memmove(dst, src, n);
        return cudaSuccess;
    }
    int taken = 0;
    if ((spage || dpage) && ((e = nvp_graph_mem_capture_copy(d, s, n, stream, spage, &taken)) || taken))
        return e;
    if (spage)
        return staged_h2d(d, src, n, stream, is_async);
    if (dpage)
        return staged_d2h(dst, s, n, stream);
    if (!is_async && capturable(d, s, n))
        return captured_h2d(d, s, n, stream);
    uint64_t a[NVP_MAX_ARGS] = {d, s, n, (uint64_t)stream};
    struct nvp_reply r = {0};
    if (!is_async)
        nvp_expect_wait(n / 40); /* (ns at 40 GB/s: a little longer than the link takes) */
    return nvp_call(NVP_OP_MEMCPY, a, NULL, 0, is_async ? NULL : &r, -1);
}

NVP_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(nvp_memcpy(dst, src, count, kind, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(nvp_memcpy(dst, src, count, kind, NVP_STREAM_PER_THREAD, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                       cudaStream_t stream)
{
    return nvp_ret(nvp_memcpy(dst, src, count, kind, nvp_stream_wire(stream, 0), 1));
}

NVP_EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                            cudaStream_t stream)
{
    return nvp_ret(nvp_memcpy(dst, src, count, kind, nvp_stream_wire(stream, 1), 1));
}

NVP_EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
    (void)dstDevice;
    (void)srcDevice;
    return nvp_ret(nvp_memcpy(dst, src, count, cudaMemcpyDeviceToDevice, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                           cudaStream_t stream)
{
    (void)dstDevice;
    (void)srcDevice;
    return nvp_ret(nvp_memcpy(dst, src, count, cudaMemcpyDeviceToDevice, nvp_stream_wire(stream, 0), 1));
}

static cudaError_t memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, enum cudaMemcpyKind kind, int64_t stream, int is_async)
{
    if (width > dpitch || width > spitch)
        return cudaErrorInvalidPitchValue;
    if (width == 0 || height == 0)
        return cudaSuccess;
    if (dpitch == width && spitch == width)
        return nvp_memcpy(dst, src, width * height, kind, stream, is_async);
    uint64_t d = (uint64_t)(uintptr_t)dst, s = (uint64_t)(uintptr_t)src;
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    if (!pageable(d, dspan) && !pageable(s, sspan)) {
        cudaError_t e = nvp_enter();
        if (e)
            return e;
        if ((e = check_device_range(dst, dspan)) || (e = check_device_range(src, sspan)))
            return e;
        uint64_t a[NVP_MAX_ARGS] = {d, dpitch, s, spitch, width, height, (uint64_t)stream};
        struct nvp_reply r = {0};
        return nvp_call(NVP_OP_MEMCPY_2D, a, NULL, 0, is_async ? NULL : &r, -1);
    }
    /* pageable host rows: one staged copy per row */
    for (size_t row = 0; row < height; row++) {
        cudaError_t e = nvp_memcpy((char *)dst + row * dpitch, (const char *)src + row * spitch, width, kind,
                                   stream, is_async);
        if (e)
            return e;
    }
    return cudaSuccess;
}

static cudaError_t memcpy3d(const struct cudaMemcpy3DParms *p, int64_t stream, int is_async);

/* a 2D copy as the one slice of a 3D one: its pageable rows go in one exchange (memcpy3d) */
static cudaError_t memcpy2d_call(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                 size_t height, enum cudaMemcpyKind kind, int64_t stream, int is_async)
{
    struct cudaMemcpy3DParms p = {0};
    p.srcPtr = (struct cudaPitchedPtr){(void *)src, spitch, width, height};
    p.dstPtr = (struct cudaPitchedPtr){dst, dpitch, width, height};
    p.extent = (struct cudaExtent){width, height, 1};
    p.kind = kind;
    return memcpy3d(&p, stream, is_async);
}

NVP_EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                    size_t height, enum cudaMemcpyKind kind)
{
    return nvp_ret(memcpy2d_call(dst, dpitch, src, spitch, width, height, kind, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                         size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(memcpy2d_call(dst, dpitch, src, spitch, width, height, kind, nvp_stream_wire(stream, 0), 1));
}

/* ---- memset ---- */

static cudaError_t memset_(void *p, int value, size_t n, int64_t stream)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (stream < 0)
        return cudaErrorInvalidResourceHandle;
    if (n == 0)
        return cudaSuccess;
    if (!p || (e = check_device_range(p, n)))
        return cudaErrorInvalidValue;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)(uintptr_t)p, (uint64_t)(value & 0xff), n, (uint64_t)stream};
    return nvp_call(NVP_OP_MEMSET, a, NULL, 0, NULL, -1);
}

NVP_EXPORT cudaError_t cudaMemset(void *p, int value, size_t count)
{
    return nvp_ret(memset_(p, value, count, NVP_STREAM_LEGACY));
}

NVP_EXPORT cudaError_t cudaMemset_ptds(void *p, int value, size_t count)
{
    return nvp_ret(memset_(p, value, count, NVP_STREAM_PER_THREAD));
}

NVP_EXPORT cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
    return nvp_ret(memset_(p, value, count, nvp_stream_wire(stream, 0)));
}

NVP_EXPORT cudaError_t cudaMemsetAsync_ptsz(void *p, int value, size_t count, cudaStream_t stream)
{
    return nvp_ret(memset_(p, value, count, nvp_stream_wire(stream, 1)));
}

static cudaError_t memset2d(void *p, size_t pitch, int value, size_t width, size_t height, int64_t stream)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (stream < 0)
        return cudaErrorInvalidResourceHandle;
    if (width == 0 || height == 0)
        return cudaSuccess;
    if (width > pitch)
        return cudaErrorInvalidValue;
    if (!p || check_device_range(p, pitch * (height - 1) + width))
        return cudaErrorInvalidValue;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)(uintptr_t)p, pitch, (uint64_t)(value & 0xff), width, height,
                                (uint64_t)stream};
    return nvp_call(NVP_OP_MEMSET_2D, a, NULL, 0, NULL, -1);
}

NVP_EXPORT cudaError_t cudaMemset2D(void *p, size_t pitch, int value, size_t width, size_t height)
{
    return nvp_ret(memset2d(p, pitch, value, width, height, NVP_STREAM_LEGACY));
}

NVP_EXPORT cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height,
                                         cudaStream_t stream)
{
    return nvp_ret(memset2d(p, pitch, value, width, height, nvp_stream_wire(stream, 0)));
}

/* ---- symbols ---- */

static cudaError_t symbol_copy(const void *symbol, size_t count, size_t offset, void **devp)
{
    uint64_t addr;
    size_t size;
    cudaError_t e = nvp_var_resolve(symbol, &addr, &size);
    if (e)
        return e;
    if (offset > size || count > size - offset)
        return cudaErrorInvalidValue;
    *devp = (void *)(uintptr_t)(addr + offset);
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                                          enum cudaMemcpyKind kind)
{
    void *d;
    cudaError_t e = symbol_copy(symbol, count, offset, &d);
    if (!e && kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        e = cudaErrorInvalidMemcpyDirection;
    return nvp_ret(e ? e : nvp_memcpy(d, src, count, kind, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                            enum cudaMemcpyKind kind)
{
    void *d;
    cudaError_t e = symbol_copy(symbol, count, offset, &d);
    if (!e && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        e = cudaErrorInvalidMemcpyDirection;
    return nvp_ret(e ? e : nvp_memcpy(dst, d, count, kind, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count, size_t offset,
                                               enum cudaMemcpyKind kind, cudaStream_t stream)
{
    void *d;
    cudaError_t e = symbol_copy(symbol, count, offset, &d);
    return nvp_ret(e ? e : nvp_memcpy(d, src, count, kind, nvp_stream_wire(stream, 0), 1));
}

NVP_EXPORT cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count, size_t offset,
                                                 enum cudaMemcpyKind kind, cudaStream_t stream)
{
    void *d;
    cudaError_t e = symbol_copy(symbol, count, offset, &d);
    return nvp_ret(e ? e : nvp_memcpy(dst, d, count, kind, nvp_stream_wire(stream, 0), 1));
}

NVP_EXPORT cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    if (!devPtr)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t addr;
    size_t size;
    cudaError_t e = nvp_var_resolve(symbol, &addr, &size);
    if (!e)
        *devPtr = (void *)(uintptr_t)addr;
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol)
{
    if (!size)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t addr;
    return nvp_ret(nvp_var_resolve(symbol, &addr, size));
}

NVP_EXPORT struct cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w, enum cudaChannelFormatKind f)
{
    struct cudaChannelFormatDesc d = {x, y, z, w, f};
    return d;
}

/* ---- 3D on pitched linear memory (slices of 2D copies); CUDA arrays: array.c ---- */

NVP_EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
    if (!pitchedDevPtr)
        return nvp_ret(cudaErrorInvalidValue);
    void *p = NULL;
    size_t pitch = 0;
    cudaError_t e = cudaMallocPitch(&p, &pitch, extent.width, extent.height * extent.depth);
    if (!e) {
        struct cudaPitchedPtr r = {p, pitch, extent.width, extent.height};
        *pitchedDevPtr = r;
    }
    return e;
}

static char *slice(const struct cudaPitchedPtr *p, const struct cudaPos *pos, size_t z)
{
    return (char *)p->ptr + (pos->z + z) * p->pitch * p->ysize + pos->y * p->pitch + pos->x;
}

struct pitched_call {
    const struct cudaMemcpy3DParms *p;
    int64_t stream;
    int is_async;
};

static cudaError_t pitched_once(void *arg)
{
    const struct pitched_call *c = arg;
    const struct cudaMemcpy3DParms *p = c->p;
    int64_t stream = c->stream;
    int is_async = c->is_async;
    for (size_t z = 0; z < p->extent.depth; z++) {
        cudaError_t e = memcpy2d(slice(&p->dstPtr, &p->dstPos, z), p->dstPtr.pitch, slice(&p->srcPtr, &p->srcPos, z),
                                 p->srcPtr.pitch, p->extent.width, p->extent.height, p->kind, stream, is_async);
        if (e)
            return e;
    }
    return cudaSuccess;
}

/* slices of rows, one staged copy per pageable row: one exchange (nvp_exchange), so that after a recovery every
 * row goes to the new proxy */
static cudaError_t memcpy3d(const struct cudaMemcpy3DParms *p, int64_t stream, int is_async)
{
    if (!p)
        return cudaErrorInvalidValue;
    if (p->srcArray || p->dstArray)
        return nvp_copy3d_arrays(p, stream, is_async);
    struct pitched_call c = {p, stream, is_async};
    return nvp_exchange(pitched_once, &c);
}

NVP_EXPORT cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p)
{
    return nvp_ret(memcpy3d(p, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
    return nvp_ret(memcpy3d(p, nvp_stream_wire(stream, 0), 1));
}

NVP_EXPORT cudaError_t cudaMemset3D(struct cudaPitchedPtr p, int value, struct cudaExtent extent)
{
    struct cudaPos origin = {0, 0, 0};
    for (size_t z = 0; z < extent.depth; z++) {
        cudaError_t e = memset2d(slice(&p, &origin, z), p.pitch, value, extent.width, extent.height, NVP_STREAM_LEGACY);
        if (e)
            return nvp_ret(e);
    }
    return cudaSuccess;
}
