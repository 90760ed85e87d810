/* Large shared host memory made on several threads: cudaHostRegister's move of the application's pages into shared
 * memory in place (same address, same contents), and the pages of large cudaMallocHost memory.
 *
 * Shared memory's pages are made one at a time, each by the kernel's page allocator; fallocate() and write() make
 * them on one thread only (both take the file's lock).  Page faults in a mapping of the file take no such lock, so
 * threads faulting disjoint pieces make pages at once.  cudaHostRegister copies through such a mapping (process_vm_-
 * writev to this process: the kernel makes the destination's pages and reads the source as write() would, so a range
 * the application cannot read is an error, not a crash), which then replaces the application's (mremap), its pages
 * already mapped; large cudaMallocHost memory has its pages made in its own mapping.  Either way the pages are this
 * program's (its memory limits count them), and a full /dev/shm fails the call, never a later access.
 *
 * The threads are made for the call and joined before it returns: none outlives it, a fork or a checkpoint never
 * meets one (checkpoints are held off around the call).  Where /dev/shm makes huge pages on write (mounted with
 * huge=within_size or huge=always, or shmem_enabled "force"), fallocate() and write() get them at any address, and
 * one thread does as well: nvp_host_threads says 1.  Where it makes them only for mappings advised so (huge=advise),
 * the threads' mapping is advised (memory on a 2 MiB boundary gets them). */
#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#define HUGE (2ull << 20)
#define PIECE (4ull << 20) /* a thread's piece: taken one after another, so that threads finish together */
#define MIN_PIECES 2       /* below two pieces a thread: one thread */
#define MAX_THREADS 8

/* Does shared memory get huge pages from write()?  (/dev/shm's mount options; the shmem_enabled switch overrides
 * them with "force" or "deny") */
static int huge_on_write(void)
{
    static int known = -1;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k >= 0)
        return k;
    k = 0;
    char line[1024];
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
    int forced = 0, denied = 0;
    if (f) {
        if (fgets(line, sizeof line, f)) {
            forced = strstr(line, "[force]") != NULL;
            denied = strstr(line, "[deny]") != NULL;
        }
        fclose(f);
    }
    if (forced) {
        k = 1;
    } else if (!denied && (f = fopen("/proc/self/mountinfo", "re"))) {
        /* "ID PARENT DEV ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE SUPEROPTIONS" */
        while (fgets(line, sizeof line, f)) {
            char point[256];
            const char *super = strstr(line, " - ");
            if (sscanf(line, "%*s %*s %*s %*s %255s", point) == 1 && !strcmp(point, "/dev/shm") && super)
                k = strstr(super, "huge=within_size") || strstr(super, "huge=always");
        }
        fclose(f);
    }
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    return k;
}

int nvp_host_threads(uint64_t len)
{
    uint64_t n = len / (MIN_PIECES * PIECE);
    if (n < 2)
        return 1;
    static int cpus; /* the cores this program may run on (asked once) */
    int c = __atomic_load_n(&cpus, __ATOMIC_RELAXED);
    if (!c) {
        cpu_set_t set;
        c = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        __atomic_store_n(&cpus, c, __ATOMIC_RELAXED);
    }
    if ((uint64_t)c < n)
        n = (uint64_t)c;
    if (n > 1 && huge_on_write())
        return 1;
    return n > MAX_THREADS ? MAX_THREADS : (int)n;
}

struct job {
    uint64_t src, dst, len; /* src 0: the pages of [dst, +len) made, else [src, +len) copied there */
    atomic_uint_fast64_t next; /* the next piece to take */
    atomic_int err;            /* the first failure's errno */
};

static int piece(const struct job *j, uint64_t off, uint64_t n)
{
    if (!j->src)
        return madvise((void *)(uintptr_t)(j->dst + off), n, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
    struct iovec from = {(void *)(uintptr_t)(j->src + off), n}, to = {(void *)(uintptr_t)(j->dst + off), n};
    while (from.iov_len) {
        ssize_t done = process_vm_writev(getpid(), &from, 1, &to, 1, 0);
        if (done <= 0)
            return done < 0 ? errno : EFAULT;
        from.iov_base = (char *)from.iov_base + done, from.iov_len -= (size_t)done;
        to.iov_base = (char *)to.iov_base + done, to.iov_len -= (size_t)done;
    }
    return 0;
}

/* Take pieces until none is left or one failed */
static void *work(void *arg)
{
    struct job *j = arg;
    for (;;) {
        uint64_t off = atomic_fetch_add(&j->next, PIECE);
        if (off >= j->len || atomic_load(&j->err))
            return NULL;
        int e = piece(j, off, j->len - off < PIECE ? j->len - off : PIECE), none = 0;
        if (e) {
            atomic_compare_exchange_strong(&j->err, &none, e);
            return NULL;
        }
    }
}

/* The job on `threads` threads, the caller's among them: 0, or the first failure's errno */
static int run(struct job *j, int threads)
{
    madvise((void *)(uintptr_t)j->dst, j->len, MADV_HUGEPAGE); /* (where /dev/shm makes huge pages if advised) */
    pthread_t helper[MAX_THREADS];
    int started = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* (the application's handlers stay on its own threads) */
    while (started < threads - 1 && pthread_create(&helper[started], NULL, work, j) == 0)
        started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    work(j);
    for (int i = 0; i < started; i++)
        pthread_join(helper[i], NULL);
    return atomic_load(&j->err);
}

int nvp_host_make(void *p, uint64_t len, int threads)
{
    struct job j = {0, (uint64_t)(uintptr_t)p, len, 0, 0};
    return run(&j, threads) ? -1 : 0;
}

/* fd mapped at an address that lies as `like` does within a 2 MiB page: huge pages fit both the same way, and
 * moving the mapping to `like` moves whole page tables */
static void *map_like(int fd, uint64_t len, uint64_t like)
{
    uint64_t span = len + HUGE;
    char *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        return MAP_FAILED;
    uint64_t lo = (uint64_t)(uintptr_t)r, at = ((lo + HUGE - 1) & ~(HUGE - 1)) + (like & (HUGE - 1));
    if (at - lo >= HUGE)
        at -= HUGE;
    void *p = mmap((void *)(uintptr_t)at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        munmap(r, span);
        return MAP_FAILED;
    }
    if (at > lo)
        munmap(r, at - lo);
    if (lo + span > at + len)
        munmap((void *)(uintptr_t)(at + len), lo + span - at - len);
    return p;
}

/* Copy [base, +len) into fd through a mapping filled by threads, then move that mapping over the range: 0; 1 when
 * the copy is done but the mapping could not be moved (the caller maps fd there); -1 with errno (EPERM, ENOSYS:
 * process_vm_writev refused here, the caller copies with write() instead) */
static int fill_parallel(int fd, uint64_t base, uint64_t len, int threads)
{
    void *tmp = map_like(fd, len, base);
    if (tmp == MAP_FAILED)
        return -1;
    struct job j = {base, (uint64_t)(uintptr_t)tmp, len, 0, 0};
    int err = run(&j, threads);
    if (!err && mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)base) != MAP_FAILED)
        return 0;
    munmap(tmp, len);
    errno = err;
    return err ? -1 : 1;
}

/* [base, +len) into fd with write(): fd's pages made and filled on this thread */
static int copy_serial(int fd, uint64_t base, uint64_t len)
{
    for (uint64_t done = 0; done < len;) {
        ssize_t n = pwrite(fd, (const char *)(uintptr_t)(base + done), len - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (uint64_t)n;
    }
    return 0;
}

static int refused; /* process_vm_writev is not allowed here (a seccomp filter): write() from then on */

int nvp_host_move(uint64_t base, uint64_t len, cudaError_t *err)
{
    int fd = nvp_host_fd_untaken("nvproxy-registered", len); /* (every page is written below) */
    if (fd < 0) {
        *err = cudaErrorMemoryAllocation;
        return -1;
    }
    int threads = __atomic_load_n(&refused, __ATOMIC_RELAXED) ? 1 : nvp_host_threads(len), filled = -1;
    if (threads > 1 && (filled = fill_parallel(fd, base, len, threads)) == 0)
        return fd;
    *err = cudaErrorMemoryAllocation;
    if (filled < 0 && threads > 1 && errno != EPERM && errno != ENOSYS) {
        close(fd);
        return -1;
    }
    if (filled < 0 && threads > 1)
        __atomic_store_n(&refused, 1, __ATOMIC_RELAXED);
    if (filled < 0 && copy_serial(fd, base, len) != 0) {
        close(fd);
        return -1;
    }
    if (mmap((void *)(uintptr_t)base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        close(fd);
        *err = cudaErrorInvalidValue;
        return -1;
    }
    return fd;
}
