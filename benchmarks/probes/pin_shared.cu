/* What pinning costs the driver for each kind of memory nvproxy's proxy registers, natively, one GPU: the
 * program's own anonymous memory, its pages present (what a native cudaHostRegister pins); a mapping of a POSIX
 * shared-memory file whose pages exist but are not mapped here yet (the proxy's mapping of registered memory, as it
 * was pinned before); the same mapping after read faults on several threads (as the proxy maps it now, that time
 * counted); and a fresh file whose pages do not exist (cudaMallocHost's, before).  With the flags the proxy uses
 * (portable, mapped) and with none.  Prints the median time of cudaHostRegister (with the faults before it, where
 * counted), cudaHostUnregister and munmap per kind and size, in microseconds.
 *   nvcc -O2 -o pin_shared pin_shared.cu && ./pin_shared [threads] */
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe_rt.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

enum { ANON, SHM_UNMAPPED, SHM_FAULTED, SHM_FRESH, KINDS };
static const char *names[KINDS] = {"anonymous, present", "shm, not mapped", "shm + read faults", "shm, no pages"};
static int threads = 8;

struct part { char *p; size_t n; };

static void *fault(void *arg)
{
    struct part *pt = (struct part *)arg;
    if (madvise(pt->p, pt->n, MADV_POPULATE_READ) != 0)
        perror("madvise");
    return NULL;
}

static void read_faults(char *p, size_t n)
{
    pthread_t th[64];
    struct part pt[64];
    int t = n >= ((size_t)threads << 24) ? threads : (int)(n >> 24) > 1 ? (int)(n >> 24) : 1;
    size_t share = (n / t + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    int k = 0;
    for (size_t off = 0; off < n; off += share, k++)
        pt[k] = {p + off, n - off < share ? n - off : share};
    for (int i = 1; i < k; i++)
        pthread_create(&th[i], NULL, fault, &pt[i]);
    fault(&pt[0]);
    for (int i = 1; i < k; i++)
        pthread_join(th[i], NULL);
}

static int shm_file(size_t n, int with_pages)
{
    char name[64];
    snprintf(name, sizeof name, "/pin-shared-%d", (int)getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    shm_unlink(name);
    if (fd < 0 || ftruncate(fd, (off_t)n) != 0) {
        perror("shm");
        exit(1);
    }
    if (with_pages) { /* written through a mapping that then goes: pages exist, none mapped */
        char *w = (char *)mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        memset(w, 1, n);
        munmap(w, n);
    }
    return fd;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        threads = atoi(argv[1]);
    CK(cudaFree(0));
    const size_t sizes[] = {4096, 65536, 1 << 20, 16 << 20, 256 << 20, 1u << 30};
    const unsigned flagsets[] = {cudaHostRegisterDefault, cudaHostRegisterPortable | cudaHostRegisterMapped};
    printf("%-20s %-9s %11s %11s %11s %11s  (us, median)\n", "kind", "flags", "bytes", "register", "unregister",
           "munmap");
    for (size_t n : sizes)
        for (unsigned flags : flagsets)
            for (int kind = 0; kind < KINDS; kind++) {
                int reps = n <= (1 << 20) ? 51 : n <= (16 << 20) ? 11 : 3;
                double tr[64], tu[64], tm[64];
                for (int r = 0; r < reps; r++) {
                    char *p;
                    int fd = -1;
                    if (kind == ANON) {
                        p = (char *)mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                        memset(p, 1, n);
                    } else {
                        fd = shm_file(n, kind != SHM_FRESH);
                        p = (char *)mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                    }
                    double t0 = now_us();
                    if (kind == SHM_FAULTED)
                        read_faults(p, n);
                    CK(cudaHostRegister(p, n, flags));
                    double t1 = now_us();
                    CK(cudaHostUnregister(p));
                    double t2 = now_us();
                    munmap(p, n);
                    if (fd >= 0)
                        close(fd);
                    double t3 = now_us();
                    tr[r] = t1 - t0, tu[r] = t2 - t1, tm[r] = t3 - t2;
                }
                qsort(tr, reps, sizeof *tr, cmpd);
                qsort(tu, reps, sizeof *tu, cmpd);
                qsort(tm, reps, sizeof *tm, cmpd);
                printf("%-20s %-9s %11zu %11.1f %11.1f %11.1f\n", names[kind], flags ? "port+map" : "default", n,
                       tr[reps / 2], tu[reps / 2], tm[reps / 2]);
                fflush(stdout);
            }
    return 0;
}
