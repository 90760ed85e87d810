/* Does the kind of page-locked memory change a pinned copy's speed?  nvproxy's pinned memory is POSIX shared
 * memory the proxy registers (4 KiB tmpfs pages unless shmem huge pages are on); cudaMallocHost's is the
 * driver's own.  Native, one GPU.  Prints the median time per cudaMemcpy for each kind, size and direction,
 * the kinds alternating within every round, and what kind of pages each buffer got.
 *   nvcc -O2 -o pinned_pages pinned_pages.cu && ./pinned_pages [rounds] */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe_rt.h"

#define MAXSZ (64u << 20)
#define HUGE (2u << 20)

enum { MALLOCHOST, SHM, SHM_ADVISED, ANON_HUGE, KINDS };
static const char *names[KINDS] = {"cudaMallocHost", "shm 4K", "shm +MADV_HUGEPAGE", "anon +MADV_HUGEPAGE"};

static void cat(const char *path)
{
    char b[256] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(b, sizeof b, f))
            b[0] = 0;
        fclose(f);
    }
    printf("%s: %s%s", path, b, strchr(b, '\n') ? "" : "\n");
}

/* kB of huge pages (anonymous, shmem) mapped in the range holding p, from /proc/self/smaps */
static void huge_kb(void *p, long *anon, long *shm)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0;
    *anon = *shm = -1;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && !strncmp(line, "AnonHugePages:", 14))
            sscanf(line + 14, "%ld", anon);
        else if (in && !strncmp(line, "ShmemPmdMapped:", 15))
            sscanf(line + 15, "%ld", shm);
    }
    if (f)
        fclose(f);
}

static void *shm_buffer(int advise)
{
    char name[64];
    snprintf(name, sizeof name, "/pinned_pages.%d.%d", getpid(), advise);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, MAXSZ + HUGE)) {
        perror("shm");
        exit(1);
    }
    shm_unlink(name);
    /* 2 MiB aligned, so that huge pages can map it */
    char *m = (char *)mmap(NULL, MAXSZ + 2 * HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    void *p = mmap(a, MAXSZ, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    if (advise && madvise(p, MAXSZ, MADV_HUGEPAGE))
        perror("madvise(shm)");
    close(fd);
    return p;
}

static void *anon_huge(void)
{
    char *m = (char *)mmap(NULL, MAXSZ + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (madvise(a, MAXSZ, MADV_HUGEPAGE))
        perror("madvise(anon)");
    return a;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    cat("/sys/kernel/mm/transparent_hugepage/enabled");
    cat("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    cat("/proc/sys/vm/nr_hugepages");
    CK(cudaFree(0));
    void *host[KINDS], *dev;
    CK(cudaMallocHost(&host[MALLOCHOST], MAXSZ));
    host[SHM] = shm_buffer(0);
    host[SHM_ADVISED] = shm_buffer(1);
    host[ANON_HUGE] = anon_huge();
    for (int k = 0; k < KINDS; k++) {
        memset(host[k], k + 1, MAXSZ);
        if (k != MALLOCHOST)
            CK(cudaHostRegister(host[k], MAXSZ, cudaHostRegisterPortable | cudaHostRegisterMapped));
        long anon, shm;
        huge_kb(host[k], &anon, &shm);
        printf("%-22s AnonHugePages %ld kB, ShmemPmdMapped %ld kB\n", names[k], anon, shm);
    }
    CK(cudaMalloc(&dev, MAXSZ));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    static const unsigned sizes[] = {1u << 20, 4u << 20, 16u << 20, 64u << 20};
    double *t = (double *)malloc(sizeof(double) * rounds);
    printf("%-5s %-4s %-22s %10s %8s  %s\n", "MiB", "dir", "memory", "us", "GB/s", "+ async copy, query spin, sync: us");
    for (unsigned z = 0; z < sizeof sizes / sizeof *sizes; z++)
        for (int d2h = 0; d2h < 2; d2h++) {
            double med[KINDS][2];
            for (int how = 0; how < 2; how++) { /* cudaMemcpy; then as the proxy does it */
                double *all = (double *)malloc(sizeof(double) * rounds * KINDS);
                for (int r = -3; r < rounds; r++)
                    for (int k = 0; k < KINDS; k++) {
                        void *dst = d2h ? host[k] : dev, *src = d2h ? dev : host[k];
                        double t0 = now_us();
                        if (how == 0)
                            CK(cudaMemcpy(dst, src, sizes[z], cudaMemcpyDefault));
                        else {
                            CK(cudaMemcpyAsync(dst, src, sizes[z], cudaMemcpyDefault, s));
                            while (cudaStreamQuery(s) == cudaErrorNotReady)
                                ;
                            CK(cudaStreamSynchronize(s));
                        }
                        if (r >= 0)
                            all[k * rounds + r] = now_us() - t0;
                    }
                for (int k = 0; k < KINDS; k++) {
                    memcpy(t, all + k * rounds, sizeof(double) * rounds);
                    qsort(t, rounds, sizeof *t, cmpd);
                    med[k][how] = t[rounds / 2];
                }
                free(all);
            }
            for (int k = 0; k < KINDS; k++)
                printf("%-5u %-4s %-22s %10.1f %8.2f  %.1f\n", sizes[z] >> 20, d2h ? "d2h" : "h2d", names[k],
                       med[k][0], sizes[z] / med[k][0] / 1e3, med[k][1]);
        }
    return 0;
}
