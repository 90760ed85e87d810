/* The steps of cudaHostRegister through nvproxy (shim memory.c host_register, proxy HOST_REGISTER), timed one by
 * one on the host alone: what costs what, and what a variant saves.  The application's buffer is moved into shared
 * memory in place; the proxy maps the same file and the driver pins it (here: MADV_POPULATE_WRITE on the second
 * mapping, the page faults that pinning a mapping without page table entries takes; the driver's own work per page
 * comes on top, and equals native's).
 *   cc -O2 -pthread -o host_register_steps host_register_steps.c
 *   ./host_register_steps [threads] [dir] [MiB...]
 * threads: copying threads for the parallel variants (default 4); dir: make the shared file in this directory (a
 * tmpfs mounted with huge=advise or huge=always, to see huge pages) instead of POSIX shared memory ("-": /dev/shm).
 * Prints, per size and variant, the median ms of each step over a few runs. */
#define _GNU_SOURCE
#include <errno.h>
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

enum { FALLOC, COPY, MAP_APP, MAP_PROXY, PIN, UNMAP_PROXY, CLOSE, TOUCH_APP, STEPS };
static const char *const STEP_NAMES[STEPS] = {"falloc", "copy", "map-app", "map-px", "fault-px", "unmap-px",
                                              "close", "touch-app"};

static const char *dir;
static int nthreads = 4;
static const char *only; /* $ONLY: the one variant to run */

struct variant {
    const char *name;
    int no_falloc;      /* the file's pages made by the copy's writes, not taken first */
    int parallel_copy;  /* pwrite from several threads */
    int huge_advise;    /* MADV_HUGEPAGE on both mappings */
    int px_read;        /* the proxy populates with read faults (fault-around: 16 pages a fault), not write faults */
    int parallel_fault; /* the proxy's populate from several threads */
    int app_read;       /* the application's new mapping populated (read faults) within the call */
    int repeat;         /* the buffer was registered before: its pages are a shared mapping, not yet faulted */
    int map_fill;       /* copied through a mapping of the file (write faults make its pages), moved over the buffer
                         * (2: with process_vm_writev) */
};

static int shared_file(void)
{
    char name[128];
    static unsigned serial;
    if (dir) {
        snprintf(name, sizeof name, "%s/hrs-%d-%u", dir, (int)getpid(), serial++);
        int fd = open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0)
            unlink(name);
        return fd;
    }
    snprintf(name, sizeof name, "/hrs-%d-%u", (int)getpid(), serial++);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0)
        shm_unlink(name);
    return fd;
}

enum op { PWRITE, POPULATE_READ_, POPULATE_WRITE_, FILL, FILL_PVW };

struct piece {
    enum op op;
    int fd;
    char *src, *dst;
    size_t off, len;
};

static void *do_piece(void *arg)
{
    struct piece *p = arg;
    switch (p->op) {
    case PWRITE:
        for (size_t done = 0; done < p->len;) {
            ssize_t n = pwrite(p->fd, p->src + p->off + done, p->len - done, (off_t)(p->off + done));
            if (n <= 0) {
                perror("pwrite");
                exit(1);
            }
            done += (size_t)n;
        }
        break;
    case POPULATE_READ_:
    case POPULATE_WRITE_:
        if (madvise(p->dst + p->off, p->len, p->op == POPULATE_READ_ ? MADV_POPULATE_READ : MADV_POPULATE_WRITE))
            perror("madvise(MADV_POPULATE_*)");
        break;
    case FILL: /* the pages made (and cleared) by write faults, then the bytes copied */
        if (madvise(p->dst + p->off, p->len, MADV_POPULATE_WRITE))
            perror("madvise(MADV_POPULATE_WRITE)");
        memcpy(p->dst + p->off, p->src + p->off, p->len);
        break;
    case FILL_PVW: { /* the same through process_vm_writev to this process: the destination's pages made by the
                      * kernel's pinning of them, the source read by copy_from_user (a bad source fails, no crash) */
        struct iovec from = {p->src + p->off, p->len}, to = {p->dst + p->off, p->len};
        for (size_t done = 0; done < p->len;) {
            ssize_t n = process_vm_writev(getpid(), &from, 1, &to, 1, 0);
            if (n <= 0) {
                perror("process_vm_writev");
                exit(1);
            }
            done += (size_t)n;
            from.iov_base = (char *)from.iov_base + n, from.iov_len -= (size_t)n;
            to.iov_base = (char *)to.iov_base + n, to.iov_len -= (size_t)n;
        }
        break;
    }
    }
    return NULL;
}

/* op over [0, len) on t threads, in 2 MiB-aligned pieces */
static void split(int t, enum op op, int fd, char *src, char *dst, size_t len)
{
    pthread_t th[64];
    struct piece pc[64];
    size_t share = ((len + (size_t)t - 1) / (size_t)t + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    int n = 0;
    for (size_t off = 0; off < len && n < 64; off += share, n++)
        pc[n] = (struct piece){op, fd, src, dst, off, len - off < share ? len - off : share};
    for (int i = 1; i < n; i++)
        pthread_create(&th[i], NULL, do_piece, &pc[i]);
    do_piece(&pc[0]);
    for (int i = 1; i < n; i++)
        pthread_join(th[i], NULL);
}

/* fd mapped at an address that lies like `like` within a 2 MiB page (the proxy maps at the application's address) */
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

static size_t misalign; /* $MISALIGN: the buffer's offset from a 2 MiB boundary (bytes, a multiple of 4096) */

static void one_run(const struct variant *v, size_t len, double *t)
{
    char *res = mmap(NULL, len + (4u << 20), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char *buf = (char *)(((uintptr_t)res + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1)) + misalign;
    if (v->repeat) { /* an earlier registration's file, mapped there and never touched since */
        int fd0 = shared_file();
        if (fd0 < 0 || fallocate(fd0, 0, 0, (off_t)len) != 0 ||
            mmap(buf, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd0, 0) == MAP_FAILED) {
            perror("repeat setup");
            exit(1);
        }
        memset(buf, 1, len);
        madvise(buf, len, MADV_DONTNEED); /* (its page table entries gone, its pages kept in the file) */
        close(fd0);
    } else {
        mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        memset(buf, 1, len);
    }
    int copiers = v->parallel_copy ? nthreads : 1;
    double t0 = now_us();
    int fd = shared_file();
    if (fd < 0 || (v->no_falloc ? ftruncate(fd, (off_t)len) : fallocate(fd, 0, 0, (off_t)len)) != 0) {
        perror("shared file");
        exit(1);
    }
    double t1 = now_us(), t2;
    if (v->map_fill) { /* copied through a mapping of the file, which then replaces the buffer's */
        char *tmp = map_like(fd, len, buf);
        if (v->huge_advise)
            madvise(tmp, len, MADV_HUGEPAGE);
        split(copiers, v->map_fill == 2 ? FILL_PVW : FILL, fd, buf, tmp, len);
        t2 = now_us();
        if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, buf) == MAP_FAILED) {
            perror("mremap");
            exit(1);
        }
    } else {
        split(copiers, PWRITE, fd, buf, NULL, len);
        t2 = now_us();
        if (mmap(buf, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            perror("mmap app");
            exit(1);
        }
        if (v->huge_advise)
            madvise(buf, len, MADV_HUGEPAGE);
        if (v->app_read)
            madvise(buf, len, MADV_POPULATE_READ);
    }
    double t3 = now_us();
    char *px = map_like(fd, len, buf);
    if (v->huge_advise)
        madvise(px, len, MADV_HUGEPAGE);
    double t4 = now_us();
    split(v->parallel_fault ? nthreads : 1, v->px_read ? POPULATE_READ_ : POPULATE_WRITE_, -1, NULL, px, len);
    double t5 = now_us();
    munmap(px, len);
    double t6 = now_us();
    close(fd);
    double t7 = now_us();
    volatile char *q = buf; /* the application's first touch of each page afterwards (native: none) */
    for (size_t off = 0; off < len; off += 4096)
        q[off] = q[off];
    double t8 = now_us();
    double d[STEPS] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7};
    for (int i = 0; i < STEPS; i++)
        t[i] = d[i];
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
    size_t sizes[16] = {1, 16, 256, 1024};
    int nsizes = 4;
    if (argc > 3)
        for (nsizes = 0; nsizes + 3 < argc && nsizes < 16; nsizes++)
            sizes[nsizes] = (size_t)atol(argv[nsizes + 3]);
    static const struct variant vs[] = {
        /* name              nofal par  huge pxrd pxpar apprd repeat mapfill */
        {"now",                 0,  0,   0,   0,   0,    0,    0,     0},
        {"now, repeat",         0,  0,   0,   0,   0,    0,    1,     0},
        {"no-falloc",           1,  0,   0,   0,   0,    0,    0,     0},
        {"px-read",             0,  0,   0,   1,   0,    0,    0,     0},
        {"px-read-par",         0,  0,   0,   1,   1,    0,    0,     0},
        {"px-read+app-read",    0,  0,   0,   1,   0,    1,    0,     0},
        {"fill",                1,  0,   0,   1,   1,    0,    0,     1},
        {"fill-par",            1,  1,   0,   1,   1,    0,    0,     1},
        {"falloc+fill-par",     0,  1,   0,   1,   1,    0,    0,     1},
        {"fill-par, repeat",    1,  1,   0,   1,   1,    0,    1,     1},
        {"pvw",                 1,  0,   0,   1,   1,    0,    0,     2},
        {"pvw-par",             1,  1,   0,   1,   1,    0,    0,     2},
        {"huge-fill-par",       1,  1,   1,   1,   1,    0,    0,     1},
    };
    printf("%-16s %6s", "variant", "MiB");
    for (int i = 0; i < STEPS; i++)
        printf(" %9s", STEP_NAMES[i]);
    printf(" %9s  (ms, median; %d threads; %s)\n", "call", nthreads, dir ? dir : "/dev/shm");
    for (int z = 0; z < nsizes; z++) {
        size_t len = sizes[z] << 20;
        int reps = sizes[z] <= 16 ? 9 : 5;
        for (size_t k = 0; k < sizeof vs / sizeof *vs; k++) {
            if (only && strcmp(only, vs[k].name))
                continue;
            double t[9][STEPS], col[9], med[STEPS], call = 0;
            for (int r = 0; r < reps; r++)
                one_run(&vs[k], len, t[r]);
            for (int i = 0; i < STEPS; i++) {
                for (int r = 0; r < reps; r++)
                    col[r] = t[r][i];
                qsort(col, (size_t)reps, sizeof *col, cmpd);
                med[i] = col[reps / 2] / 1e3;
                if (i <= PIN)
                    call += med[i];
            }
            printf("%-16s %6zu", vs[k].name, sizes[z]);
            for (int i = 0; i < STEPS; i++)
                printf(" %9.2f", med[i]);
            printf(" %9.2f\n", call);
        }
    }
    return 0;
}
