/* Managed memory that migrates between the host and the device (cudaMallocManaged; the proxy's side:
 * src/nvproxy/proxy/handlers/managed.py).
 *
 * In the proxy the allocation's address is device memory, so kernels, copies and library calls reach it at device
 * speed.  Here it is a shared memfd (the host copy), which the proxy maps elsewhere to copy chunks between the two.
 * Each chunk of an allocation is on the device or on the host:
 *  - on the device: the application's page table has no entry for it, so its first access (from the program or
 *    from a system call: a userfaultfd without UFFD_USER_MODE_ONLY) stops in the kernel until this file's fault
 *    thread has fetched the chunk (MANAGED_FETCH) and mapped it (UFFDIO_CONTINUE of the memfd's pages);
 *  - on the host: the program reads and writes the memfd at memory speed.  Before the next request of any thread
 *    (a launch, a copy, a library call: anything may use it), the chunks on the host are unmapped and pushed to
 *    the device in one posted request (MANAGED_PUSH), which the proxy runs before that request.
 * A fetch does not wait for the device: the program synchronised before it read what kernels wrote, as it must
 * natively.  A fresh allocation is zeros on both sides, so its chunks are mapped without a fetch until the first
 * request after it.
 *
 * Migration is used where a userfaultfd can see the kernel's own accesses (root, CAP_SYS_PTRACE or
 * vm.unprivileged_userfaultfd=1), the proxy has one device, and the program does not run under DMTCP (which cannot
 * save a userfaultfd); elsewhere, and with NVPROXY_MANAGED=zero-copy, managed memory is shared host memory that
 * kernels read over the bus (managed.c). */
#include "shim.h"
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHUNK (2ull << 20) /* the unit of migration: a fault brings this much, at most, back to the host */
#define PUSH_PAIRS 4096    /* (address, bytes) pairs per push request */

enum { ON_DEVICE = 0, ON_HOST = 1 };

struct region {
    uint64_t base, len;
    int fd;
    int fresh;      /* zeros on both sides: no request has come since the allocation */
    uint8_t *where; /* per chunk: ON_DEVICE or ON_HOST */
    uint64_t *pushed; /* per chunk: the request that last pushed it (of proxy generation gen), or 0 */
    int gen;
    struct region *next;
};

_Atomic int nvp_mm_pending; /* chunks on the host, or fresh regions: the next request sees to them */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions;
static int uffd = -1;
static int on_host; /* chunks on the host, all regions */
static __thread int inside; /* this thread's requests come from here: no sync point for them */
static int pages_fd = -1;   /* the fault thread's channel (NVP_CHAN_PAGES) */

/* ---- whether to migrate (decided once) ---- */

static int usable = -1;

static void *fault_loop(void *arg);

static int open_uffd(const char **why)
{
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
    if (fd < 0) {
        *why = errno == EPERM ? "this user may not watch the kernel's accesses (vm.unprivileged_userfaultfd=0)"
                              : strerror(errno);
        return -1;
    }
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MINOR_SHMEM};
    if (ioctl(fd, UFFDIO_API, &api) != 0 || !(api.features & UFFD_FEATURE_MINOR_SHMEM)) {
        *why = "the kernel has no minor faults of shared memory (Linux 5.14 or later has them)";
        close(fd);
        return -1;
    }
    return fd;
}

static void decide(void)
{
    const char *why = NULL;
    int asked = nvp_settings()->managed == NVP_MANAGED_MIGRATE;
    usable = 0;
    if (nvp_settings()->managed == NVP_MANAGED_ZERO_COPY)
        return;
    if (nvp_under_dmtcp())
        why = "DMTCP cannot save a userfaultfd";
    else if (nvp_device_count() != 1)
        why = "the proxy has more than one device";
    else if ((uffd = open_uffd(&why)) >= 0) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* (the program's signals go to its own threads) */
        int rc = pthread_create(&t, &at, fault_loop, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&at);
        if (rc == 0) {
            usable = 1;
            return;
        }
        close(uffd);
        uffd = -1;
        why = strerror(rc);
    }
    if (asked) /* (auto: zero-copy managed memory is correct, only slower; nothing to say) */
        nvp_log("nvproxy: NVPROXY_MANAGED=migrate: managed memory stays in host memory (%s)", why);
}

static void after_fork_child(void)
{
    /* the child has neither the fault thread nor the registrations (the userfaultfd is the parent's): its new
     * allocations are zero-copy, and what it inherited is the host copy as it was */
    usable = 0;
    uffd = -1;
    regions = NULL;
    on_host = 0;
    atomic_store(&nvp_mm_pending, 0);
    pthread_mutex_init(&lock, NULL);
}

static int migrating(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    static pthread_mutex_t decide_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&decide_lock);
    if (usable < 0) {
        pthread_once(&once, decide);
        pthread_atfork(NULL, NULL, after_fork_child);
    }
    pthread_mutex_unlock(&decide_lock);
    return usable > 0;
}

/* ---- regions ---- */

static struct region *find(uint64_t p)
{
    for (struct region *r = regions; r; r = r->next)
        if (p >= r->base && p - r->base < r->len)
            return r;
    return NULL;
}

static uint64_t chunk_len(const struct region *r, size_t c)
{
    uint64_t off = c * CHUNK;
    return r->len - off < CHUNK ? r->len - off : CHUNK;
}

static size_t chunks(const struct region *r) { return (size_t)((r->len + CHUNK - 1) / CHUNK); }

/* map [at, +n) of r from the memfd's pages (made first where the file has a hole) and wake whoever waits there */
static void map_in(const struct region *r, uint64_t at, uint64_t n)
{
    (void)fallocate(r->fd, FALLOC_FL_KEEP_SIZE, (off_t)(at - r->base), (off_t)n);
    struct uffdio_continue c = {.range = {at, n}, .mode = 0};
    if (ioctl(uffd, UFFDIO_CONTINUE, &c) == 0)
        return;
    /* (EEXIST: part of it is mapped already, a page the kernel brought back after reclaim: page by page) */
    long page = sysconf(_SC_PAGESIZE);
    for (uint64_t p = at; p < at + n; p += (uint64_t)page) {
        struct uffdio_continue one = {.range = {p, (uint64_t)page}, .mode = 0};
        (void)ioctl(uffd, UFFDIO_CONTINUE, &one);
    }
    struct uffdio_range w = {at, n};
    (void)ioctl(uffd, UFFDIO_WAKE, &w);
}

/* The chunk [at, +n) from the device into the host copy, once the proxy has run the request that pushed it last
 * (after); on a channel of the fault thread's own, which the proxy serves beside the call order: the faulting
 * thread may be a host function that holds up a stream, or hold up a checkpoint's drain. */
static cudaError_t fetch(uint64_t at, uint64_t n, uint64_t after)
{
    for (int attempt = 0; attempt < 2; attempt++) { /* (once more on a new channel: a new proxy took over) */
        if (pages_fd < 0)
            pages_fd = nvp_open_channel(NVP_CHAN_PAGES, NULL, NULL);
        if (pages_fd < 0)
            return cudaErrorDevicesUnavailable;
        struct nvp_req q = {.len = sizeof q, .op = NVP_OP_MANAGED_FETCH, .flags = NVP_F_REPLY, .seq = 1};
        q.a[0] = at, q.a[1] = n, q.a[2] = after;
        struct iovec iov = {&q, sizeof q};
        struct nvp_rep r;
        if (nvp_write_all(pages_fd, &iov, 1, -1) == 0 && nvp_read_all(pages_fd, &r, sizeof r) == 0)
            return (cudaError_t)r.err;
        nvp_socket_close(pages_fd, 1);
        pages_fd = -1;
        after = 0;
    }
    return cudaErrorDevicesUnavailable;
}

static void serve_fault(uint64_t addr)
{
    pthread_mutex_lock(&lock);
    struct region *r = find(addr);
    if (!r) { /* (freed meanwhile: the access now faults as any access to unmapped memory does) */
        pthread_mutex_unlock(&lock);
        return;
    }
    size_t c = (size_t)((addr - r->base) / CHUNK);
    uint64_t at = r->base + c * CHUNK, n = chunk_len(r, c);
    if (r->where[c] == ON_HOST) { /* mapped by an earlier fault, and this page since reclaimed */
        long page = sysconf(_SC_PAGESIZE);
        map_in(r, addr & ~(uint64_t)(page - 1), (uint64_t)page);
        pthread_mutex_unlock(&lock);
        return;
    }
    if (!r->fresh) {
        cudaError_t e = fetch(at, n, r->gen == nvp_generation() ? r->pushed[c] : 0);
        if (e) { /* (mapped all the same: a program stopped forever in a fault would be worse) */
            static int said;
            if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
                nvp_log("nvproxy: managed memory at %#llx could not be brought back from the device (%s)",
                        (unsigned long long)at, cudaGetErrorName(e));
        }
    }
    /* (on the host before the faulting thread wakes: what it writes from then on, a request that follows it in
     * the program's order pushes) */
    r->where[c] = ON_HOST;
    on_host++;
    atomic_store(&nvp_mm_pending, 1);
    map_in(r, at, n);
    pthread_mutex_unlock(&lock);
}

static void *fault_loop(void *arg)
{
    (void)arg;
    inside = 1;
    for (;;) {
        struct uffd_msg m;
        ssize_t k = read(uffd, &m, sizeof m);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k != (ssize_t)sizeof m)
            return NULL; /* (closed: a fork's child, or the process ends) */
        if (m.event == UFFD_EVENT_PAGEFAULT)
            serve_fault(m.arg.pagefault.address);
    }
}

/* ---- the sync point: before every request ---- */

static cudaError_t push(const uint64_t *pairs, size_t k)
{
    uint64_t a[NVP_MAX_ARGS] = {0};
    return nvp_send_req(NVP_OP_MANAGED_PUSH, 0, a, pairs, k * 2 * sizeof *pairs, NULL, 0, -1, 0);
}

void nvp_managed_sync_point(void)
{
    if (inside)
        return;
    inside = 1;
    pthread_mutex_lock(&lock);
    static uint64_t pairs[2 * PUSH_PAIRS];
    size_t k = 0;
    int pushed_any = 0;
    cudaError_t e = cudaSuccess;
    for (struct region *r = regions; r; r = r->next) {
        r->fresh = 0;
        for (size_t c = 0; c < chunks(r) && on_host; c++) {
            if (r->where[c] != ON_HOST)
                continue;
            uint64_t at = r->base + c * CHUNK, n = chunk_len(r, c);
            /* unmapped first: an access from now on waits for the fault thread, which fetches only after this
             * push (its request comes later) */
            madvise((void *)(uintptr_t)at, n, MADV_DONTNEED);
            r->where[c] = ON_DEVICE;
            r->pushed[c] = UINT64_MAX; /* (numbered below) */
            pushed_any = 1;
            on_host--;
            if (k && pairs[2 * k - 2] + pairs[2 * k - 1] == at) {
                pairs[2 * k - 1] += n;
                continue;
            }
            if (k == PUSH_PAIRS) {
                e = e ? e : push(pairs, k);
                k = 0;
            }
            pairs[2 * k] = at;
            pairs[2 * k + 1] = n;
            k++;
        }
    }
    if (k)
        e = e ? e : push(pairs, k);
    if (pushed_any) { /* (the last push's number stands for every chunk pushed here: a fetch waits for it) */
        uint64_t seq = nvp_last_request();
        int gen = nvp_generation();
        for (struct region *r = regions; r; r = r->next)
            for (size_t c = 0; c < chunks(r); c++)
                if (r->pushed[c] == UINT64_MAX)
                    r->pushed[c] = seq, r->gen = gen;
    }
    atomic_store(&nvp_mm_pending, 0);
    pthread_mutex_unlock(&lock);
    inside = 0;
    if (e)
        nvp_note_async_error(e);
}

/* ---- allocation ---- */

/* undo a half-made allocation: the proxy's side too (addr != 0) */
static cudaError_t give_up(uint64_t addr, uint64_t len, int fd, int mapped)
{
    if (mapped)
        munmap((void *)(uintptr_t)addr, len);
    if (addr) {
        uint64_t a[NVP_MAX_ARGS] = {addr};
        struct nvp_reply rep = {0};
        (void)nvp_call(NVP_OP_HOST_UNREGISTER, a, NULL, 0, &rep, -1);
    }
    close(fd);
    return cudaErrorNotSupported;
}

cudaError_t nvp_managed_pages_alloc(void **out, size_t size, unsigned flags)
{
    if (!migrating())
        return cudaErrorNotSupported;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t len = (size + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
    int fd = nvp_host_fd("nvproxy-managed", len);
    if (fd < 0)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {len, (uint64_t)nvp_current_device(), 0};
    struct nvp_reply rep = {0};
    cudaError_t e = nvp_call(NVP_OP_MANAGED_ALLOC, a, NULL, 0, &rep, fd);
    if (e) { /* (more than the device has free, say: zero-copy then, as native managed memory oversubscribes) */
        close(fd);
        return cudaErrorNotSupported;
    }
    uint64_t at = rep.h.r[0];
    void *p = mmap((void *)(uintptr_t)at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (p == MAP_FAILED || (uint64_t)(uintptr_t)p != at) /* (the address is taken here: zero-copy instead) */
        return give_up(at, len, fd, p != MAP_FAILED);
    struct uffdio_register reg = {.range = {at, len}, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR};
    size_t nc = (size_t)((len + CHUNK - 1) / CHUNK);
    struct region *r = calloc(1, sizeof *r);
    uint8_t *where = calloc(nc, 1);
    uint64_t *pushed = calloc(nc, sizeof *pushed);
    if (!r || !where || !pushed || ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
        free(r);
        free(where);
        free(pushed);
        return give_up(at, len, fd, 1);
    }
    *r = (struct region){.base = at, .len = len, .fd = fd, .fresh = 1, .where = where, .pushed = pushed};
    pthread_mutex_lock(&lock);
    r->next = regions;
    regions = r;
    atomic_store(&nvp_mm_pending, 1);
    pthread_mutex_unlock(&lock);
    struct nvp_host_region h = {at, len, at, size, NVP_HOST_MANAGED, flags, fd, 1};
    nvp_host_add(&h);
    nvp_alloc_add(at, len, NVP_ALLOC_PROXY); /* (device memory to every call that checks a range) */
    *out = p;
    return cudaSuccess;
}

void nvp_managed_pages_free(uint64_t base)
{
    pthread_mutex_lock(&lock);
    for (struct region **pp = &regions; *pp; pp = &(*pp)->next) {
        struct region *r = *pp;
        if (r->base != base)
            continue;
        for (size_t c = 0; c < chunks(r); c++)
            on_host -= r->where[c] == ON_HOST;
        *pp = r->next;
        struct uffdio_range u = {r->base, r->len};
        (void)ioctl(uffd, UFFDIO_UNREGISTER, &u);
        free(r->where);
        free(r->pushed);
        free(r);
        break;
    }
    pthread_mutex_unlock(&lock);
    int tag;
    (void)nvp_alloc_remove(base, &tag);
}

/* cudaMemPrefetchAsync to the device: what is on the host goes now (the next request would push it anyway) */
void nvp_managed_prefetch(void)
{
    if (atomic_load_explicit(&nvp_mm_pending, memory_order_relaxed))
        nvp_managed_sync_point();
}

/* A new proxy (NVPROXY_RECOVER) has the device side as its image held it: whatever the old proxy was pushed since
 * is lost with it, and the host copy holds the newest of it.  Every chunk is taken as the host's, to be pushed
 * before the next request (a page the program reaches meanwhile is mapped as it is). */
void nvp_managed_reshared(void)
{
    pthread_mutex_lock(&lock);
    for (struct region *r = regions; r; r = r->next)
        for (size_t c = 0; c < chunks(r); c++) {
            on_host += r->where[c] == ON_DEVICE;
            r->where[c] = ON_HOST;
            r->pushed[c] = 0;
        }
    if (on_host)
        atomic_store(&nvp_mm_pending, 1);
    pthread_mutex_unlock(&lock);
}
