/* cudaHostRegister's move of the application's pages into shared memory, in place: same address, same contents.
 *
 * Shared memory's pages are made one at a time, each by the kernel's page allocator, and freed so; a write() into
 * the file makes and fills them on one thread only (writes to one file take its lock).  Large ranges are therefore
 * copied through a mapping of the file, on several threads, each writing its own pieces (process_vm_writev to this
 * process: the kernel makes the destination's pages and reads the source as write() would, so a range the
 * application cannot read is an error, not a crash); the filled mapping then replaces the application's
 * (mremap), its pages already mapped.  The threads are made for the call and joined before it returns: none
 * outlives it, a fork or a checkpoint never meets one (checkpoints are held off around the call).
 *
 * Where /dev/shm makes huge pages on write (mounted with huge=within_size or huge=always, or shmem_enabled
 * "force"), write() gets them at any address and is as fast: it is used alone.  Where it makes them only for
 * mappings advised so (huge=advise), the threads' mapping is advised (a range on a 2 MiB boundary gets them). */
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
#define PIECE (4ull << 20) /* a thread's piece of the copy: taken one after another, so that threads finish together */
#define MIN_PIECES 2       /* below two pieces a thread: write() alone */
#define MAX_THREADS 8

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

static int threads_for(uint64_t len)
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
    return n > MAX_THREADS ? MAX_THREADS : (int)n;
}

struct fill {
    uint64_t src, dst, len;
    atomic_uint_fast64_t next; /* the next piece to take */
    atomic_int err;            /* the first failure's errno */
};

/* Copy pieces until none is left or one failed */
static void *fill_pieces(void *arg)
{
    struct fill *f = arg;
    pid_t self = getpid();
    for (;;) {
        uint64_t off = atomic_fetch_add(&f->next, PIECE);
        if (off >= f->len || atomic_load(&f->err))
            return NULL;
        uint64_t n = f->len - off < PIECE ? f->len - off : PIECE;
        struct iovec from = {(void *)(uintptr_t)(f->src + off), n}, to = {(void *)(uintptr_t)(f->dst + off), n};
        while (from.iov_len) {
            ssize_t done = process_vm_writev(self, &from, 1, &to, 1, 0);
            if (done <= 0) {
                int none = 0;
                atomic_compare_exchange_strong(&f->err, &none, done < 0 ? errno : EFAULT);
                return NULL;
            }
            from.iov_base = (char *)from.iov_base + done, from.iov_len -= (size_t)done;
            to.iov_base = (char *)to.iov_base + done, to.iov_len -= (size_t)done;
        }
    }
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
    madvise(tmp, len, MADV_HUGEPAGE); /* (where /dev/shm makes huge pages for mappings advised so) */
    struct fill f = {base, (uint64_t)(uintptr_t)tmp, len, 0, 0};
    pthread_t helper[MAX_THREADS];
    int started = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* (the application's handlers stay on its own threads) */
    while (started < threads - 1 && pthread_create(&helper[started], NULL, fill_pieces, &f) == 0)
        started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    fill_pieces(&f);
    for (int i = 0; i < started; i++)
        pthread_join(helper[i], NULL);
    int err = atomic_load(&f.err);
    if (!err && mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)base) != MAP_FAILED)
        return 0;
    munmap(tmp, len);
    errno = err;
    return err ? -1 : 1;
}

int nvp_host_move(uint64_t base, uint64_t len, cudaError_t *err)
{
    int fd = nvp_host_fd_untaken("nvproxy-registered", len); /* (every page is written below) */
    if (fd < 0) {
        *err = cudaErrorMemoryAllocation;
        return -1;
    }
    int threads = threads_for(len), filled = -1;
    if (threads > 1 && huge_on_write())
        threads = 1;
    if (threads > 1 && (filled = fill_parallel(fd, base, len, threads)) == 0)
        return fd;
    *err = cudaErrorMemoryAllocation;
    if (filled < 0 && threads > 1 && errno != EPERM && errno != ENOSYS) {
        close(fd);
        return -1;
    }
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
