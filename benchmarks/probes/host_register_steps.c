/* The steps of cudaHostRegister and of large cudaMallocHost through nvproxy (shim hostreg.c and memory.c, proxy
 * handlers/memory.py HOST_REGISTER and proxy/host_pages.py), timed one by one on the host alone, the way they were
 * done before (old) and are done now (new).  The proxy's mapping of the shared file is a second mapping here; the
 * driver's pinning is stood for by write faults over it (pin-px: what pinning a range costs beyond native's, where
 * its pages are not mapped yet; the driver's own work per page comes on top and equals native's).
 *   cc -O2 -pthread -o host_register_steps host_register_steps.c
 *   ./host_register_steps [threads] [dir] [MiB...]     (default: 4 threads, /dev/shm, 16 256 1024)
 * threads: for the steps done on several threads; dir: make the shared file in this directory (a tmpfs mounted with
 * huge=advise or huge=within_size, to see huge pages) instead of POSIX shared memory ("-": /dev/shm).  $ONLY: run
 * only the variant of this name.  $MISALIGN: the buffer's offset from a 2 MiB boundary (default 4096, as malloc's).
 * Prints, per size and variant, the median ms of each step over 5 runs (9 up to 16 MiB); "call" sums the steps
 * inside cudaHostRegister (or cudaMallocHost), "unreg" those inside cudaHostUnregister (or cudaFreeHost); a
 * negative unmap-px is done after the proxy's answer, outside the call. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "probe_clock.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

enum { TAKE, COPY, MAP_APP, MAP_PX, FAULT_PX, PIN_PX, UNMAP_PX, FREE_APP, TOUCH_APP, STEPS };
static const char *const STEP_NAMES[STEPS] = {"take",  "copy",     "map-app",  "map-px",   "fault-px",
                                              "pin-px", "unmap-px", "free-app", "touch-app"};
static const int IN_CALL[STEPS] = {1, 1, 1, 1, 1, 1, 0, 0, 0}, IN_UNREG[STEPS] = {0, 0, 0, 0, 0, 0, 1, 1, 0};

struct variant {
    const char *name;
    int alloc;  /* cudaMallocHost (no buffer of the application's); else cudaHostRegister */
    int old;    /* as before: fallocate, one write(), MAP_FIXED; the pinning faults the proxy's mapping alone;
                 * the proxy unmaps before answering */
    int threads; /* new: the copy (or the pages' making) and the proxy's read faults on this many threads */
    int advise; /* new: MADV_HUGEPAGE on the threads' mapping (for /dev/shm mounted huge=advise) */
    int again;  /* the buffer was registered before: a shared mapping whose file only it keeps, not mapped since */
};

static const char *dir, *only;
static int nthreads = 4;
static size_t misalign = 4096;

static int shared_file(void)
{
    char name[128];
    static unsigned serial;
    snprintf(name, sizeof name, "%s/hrs-%d-%u", dir ? dir : "", (int)getpid(), serial++);
    int fd = dir ? open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        perror(name);
        exit(1);
    }
    if (dir)
        unlink(name);
    else
        shm_unlink(name);
    return fd;
}

enum op { READ_FAULTS, WRITE_FAULTS, COPY_IN };

struct piece {
    enum op op;
    char *src, *dst;
    size_t len;
};

static void *do_piece(void *arg)
{
    struct piece *p = arg;
    if (p->op != COPY_IN) {
        if (madvise(p->dst, p->len, p->op == READ_FAULTS ? MADV_POPULATE_READ : MADV_POPULATE_WRITE))
            perror("madvise(MADV_POPULATE_*)");
        return NULL;
    }
    struct iovec from = {p->src, p->len}, to = {p->dst, p->len}; /* (as hostreg.c copies) */
    while (from.iov_len) {
        ssize_t n = process_vm_writev(getpid(), &from, 1, &to, 1, 0);
        if (n <= 0) {
            perror("process_vm_writev");
            exit(1);
        }
        from.iov_base = (char *)from.iov_base + n, from.iov_len -= (size_t)n;
        to.iov_base = (char *)to.iov_base + n, to.iov_len -= (size_t)n;
    }
    return NULL;
}

/* op over [0, len) on t threads, in 2 MiB-aligned shares */
static void split(int t, enum op op, char *src, char *dst, size_t len)
{
    pthread_t th[64];
    struct piece pc[64];
    size_t share = ((len + (size_t)t - 1) / (size_t)t + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    int n = 0;
    for (size_t off = 0; off < len && n < 64; off += share, n++)
        pc[n] = (struct piece){op, src ? src + off : NULL, dst + off, len - off < share ? len - off : share};
    for (int i = 1; i < n; i++)
        pthread_create(&th[i], NULL, do_piece, &pc[i]);
    do_piece(&pc[0]);
    for (int i = 1; i < n; i++)
        pthread_join(th[i], NULL);
}

/* fd mapped at an address that lies as `like` does within a 2 MiB page (the proxy maps at the same address) */
static char *map_like(int fd, size_t len, const char *like)
{
    size_t huge = 2u << 20;
    char *r = mmap(NULL, len + 2 * huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uintptr_t at = (((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1)) + ((uintptr_t)like & (huge - 1));
    char *p = mmap((void *)at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    munmap(r, at - (uintptr_t)r);
    munmap((char *)at + len, (uintptr_t)r + len + 2 * huge - at - len);
    return p;
}

static void one_run(const struct variant *v, size_t len, double *t)
{
    char *res = mmap(NULL, len + (4u << 20), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char *buf = (char *)(((uintptr_t)res + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1)) + misalign;
    if (v->again) { /* an earlier registration's file, mapped there and never touched since */
        int fd0 = shared_file();
        if (fallocate(fd0, 0, 0, (off_t)len) != 0 ||
            mmap(buf, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd0, 0) == MAP_FAILED) {
            perror("setup");
            exit(1);
        }
        memset(buf, 1, len);
        madvise(buf, len, MADV_DONTNEED); /* (its page table entries gone, its pages kept in the file) */
        close(fd0);
    } else if (!v->alloc) {
        mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        memset(buf, 1, len);
    }
    double at[UNMAP_PX + 1];
    at[TAKE] = now_us();
    int fd = shared_file();
    if ((v->old ? fallocate(fd, 0, 0, (off_t)len) : ftruncate(fd, (off_t)len)) != 0) {
        perror("shared file");
        exit(1);
    }
    at[COPY] = now_us();
    if (v->alloc) { /* the application's mapping; new: its pages made there on threads */
        char *app = map_like(fd, len, buf);
        if (!v->old) {
            if (v->advise)
                madvise(app, len, MADV_HUGEPAGE);
            split(v->threads, WRITE_FAULTS, NULL, app, len);
        }
        buf = app;
        at[MAP_APP] = at[MAP_PX] = now_us();
    } else if (v->old) {
        for (size_t done = 0; done < len;) {
            ssize_t n = pwrite(fd, buf + done, len - done, (off_t)done);
            if (n <= 0) {
                perror("pwrite");
                exit(1);
            }
            done += (size_t)n;
        }
        at[MAP_APP] = now_us();
        if (mmap(buf, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            perror("mmap");
            exit(1);
        }
        at[MAP_PX] = now_us();
    } else { /* copied through a mapping of the file, which then replaces the buffer's */
        char *tmp = map_like(fd, len, buf);
        if (v->advise)
            madvise(tmp, len, MADV_HUGEPAGE);
        split(v->threads, COPY_IN, buf, tmp, len);
        at[MAP_APP] = now_us();
        if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, buf) == MAP_FAILED) {
            perror("mremap");
            exit(1);
        }
        at[MAP_PX] = now_us();
    }
    char *px = map_like(fd, len, buf);
    at[FAULT_PX] = now_us();
    if (!v->old)
        split(v->threads, READ_FAULTS, NULL, px, len);
    at[PIN_PX] = now_us();
    split(1, WRITE_FAULTS, NULL, px, len);
    at[UNMAP_PX] = now_us();
    /* cudaHostUnregister or cudaFreeHost: old, the proxy unmaps, then the application (cudaFreeHost: the pages
     * freed there); new, the application unmaps (its page table entries dropped), the proxy after answering (the
     * pages freed there) */
    double unmap_px = 0, free_app = 0;
    for (int side = 0; side < 2; side++) {
        double t0 = now_us();
        if ((side == 0) == (v->old != 0)) {
            munmap(px, len);
            close(fd);
            unmap_px = now_us() - t0;
        } else {
            if (v->alloc)
                munmap(buf, len);
            free_app = now_us() - t0;
        }
    }
    double t0 = now_us();
    if (!v->alloc) { /* the application's first touch of each page afterwards (native: none) */
        volatile char *q = buf;
        for (size_t off = 0; off < len; off += 4096)
            if (q[off] != 1) {
                fprintf(stderr, "%s: contents lost\n", v->name);
                exit(1);
            }
    }
    for (int i = 0; i < UNMAP_PX; i++)
        t[i] = at[i + 1] - at[i];
    t[UNMAP_PX] = v->old ? unmap_px : -unmap_px; /* (new: after the proxy's answer) */
    t[FREE_APP] = free_app;
    t[TOUCH_APP] = v->alloc ? 0 : now_us() - t0;
    munmap(res, len + (4u << 20));
}

int main(int argc, char **argv)
{
    only = getenv("ONLY");
    if (getenv("MISALIGN"))
        misalign = (size_t)atol(getenv("MISALIGN"));
    if (argc > 1)
        nthreads = atoi(argv[1]);
    if (argc > 2 && strcmp(argv[2], "-"))
        dir = argv[2];
    size_t sizes[16] = {16, 256, 1024};
    int nsizes = 3;
    if (argc > 3)
        for (nsizes = 0; nsizes + 3 < argc && nsizes < 16; nsizes++)
            sizes[nsizes] = (size_t)atol(argv[nsizes + 3]);
    const struct variant vs[] = {
        /* name                alloc old threads advise again */
        {"register old", 0, 1, 1, 0, 0},
        {"register new", 0, 0, nthreads, 0, 0},
        {"register new 1", 0, 0, 1, 0, 0},
        {"register new adv", 0, 0, nthreads, 1, 0},
        {"again old", 0, 1, 1, 0, 1},
        {"again new", 0, 0, nthreads, 0, 1},
        {"mallochost old", 1, 1, 1, 0, 0},
        {"mallochost new", 1, 0, nthreads, 0, 0},
        {"mallochost new adv", 1, 0, nthreads, 1, 0},
    };
    printf("%-18s %5s", "variant", "MiB");
    for (int i = 0; i < STEPS; i++)
        printf(" %9s", STEP_NAMES[i]);
    printf(" %9s %9s  (ms, median; %d threads; %s; buffer %zu B past 2 MiB)\n", "call", "unreg", nthreads,
           dir ? dir : "/dev/shm", misalign);
    for (int z = 0; z < nsizes; z++) {
        size_t len = sizes[z] << 20;
        int reps = sizes[z] <= 16 ? 9 : 5;
        for (size_t k = 0; k < sizeof vs / sizeof *vs; k++) {
            if (only && strcmp(only, vs[k].name))
                continue;
            double t[9][STEPS], col[9], med[STEPS], call = 0, unreg = 0;
            for (int r = 0; r < reps; r++)
                one_run(&vs[k], len, t[r]);
            for (int i = 0; i < STEPS; i++) {
                for (int r = 0; r < reps; r++)
                    col[r] = t[r][i];
                qsort(col, (size_t)reps, sizeof *col, cmpd);
                med[i] = col[reps / 2] / 1e3;
                call += IN_CALL[i] ? med[i] : 0;
                unreg += IN_UNREG[i] && med[i] > 0 ? med[i] : 0;
            }
            printf("%-18s %5zu", vs[k].name, sizes[z]);
            for (int i = 0; i < STEPS; i++)
                printf(" %9.2f", med[i]);
            printf(" %9.2f %9.2f\n", call, unreg);
        }
    }
    return 0;
}
