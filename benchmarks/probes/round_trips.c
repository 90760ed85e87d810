/* Where a synchronous pinned copy's time goes: the driver's ways of waiting for a copy, memfd
 * against cuMemHostAlloc memory, VMM against cuMemAlloc memory, and a round trip between two processes over a Unix
 * socket and through shared memory.  On the GPU machine: nvcc -O2 -o round_trips round_trips.c -lcuda */
#define _GNU_SOURCE
#include "probe.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static CUstream st;
static volatile uint32_t *flag;
static uint32_t flagv;

static void run(int variant, CUdeviceptr d, CUdeviceptr h, size_t n, int h2d)
{
    CUdeviceptr dst = h2d ? d : h, src = h2d ? h : d;
    switch (variant) {
    case 0: /* native cudaMemcpy */
        CK(cuMemcpy(dst, src, n));
        break;
    case 1: /* nvproxy: async on a stream, spin on query, then sync */
        CK(cuMemcpyAsync(dst, src, n, st));
        while (cuStreamQuery(st) == CUDA_ERROR_NOT_READY)
            ;
        CK(cuStreamSynchronize(st));
        break;
    case 2: /* async + GPU-written flag */
        CK(cuMemcpyAsync(dst, src, n, st));
        ++flagv;
        CK(cuStreamWriteValue32(st, (CUdeviceptr)(uintptr_t)flag, flagv, 0));
        while (*flag != flagv)
            ;
        break;
    case 3: /* async + plain stream sync */
        CK(cuMemcpyAsync(dst, src, n, st));
        CK(cuStreamSynchronize(st));
        break;
    case 4: /* async on the legacy stream + query spin */
        CK(cuMemcpyAsync(dst, src, n, 0));
        while (cuStreamQuery(0) == CUDA_ERROR_NOT_READY)
            ;
        CK(cuStreamSynchronize(0));
        break;
    }
}

static void *memfd_buf(size_t n)
{
    int fd = memfd_create("probe", 0);
    if (ftruncate(fd, (off_t)n))
        exit(1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    memset(p, 1, n);
    CK(cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    return p;
}

static CUdeviceptr vmm_buf(size_t n)
{
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 2 << 20;
    n = (n + g - 1) / g * g;
    CUdeviceptr p;
    CK(cuMemAddressReserve(&p, n, 0, 0x200000000000ull, 0));
    CUmemGenericAllocationHandle hd;
    CK(cuMemCreate(&hd, n, &prop, 0));
    CK(cuMemMap(p, n, 0, hd, 0));
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(p, n, &a, 1));
    return p;
}

static void sockprobe(void)
{
    /* a request/reply hop pair between two processes over a Unix socket, both spinning on MSG_DONTWAIT */
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    volatile uint64_t *shm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pid = fork();
    char b[32] = {0};
    int N = 20000;
    if (pid == 0) {
        for (int i = 0; i < N; i++) {
            while (recv(sv[1], b, 32, MSG_DONTWAIT) != 32)
                ;
            send(sv[1], b, 32, 0);
        }
        for (uint64_t i = 1; i <= (uint64_t)N; i++) {
            while (shm[0] != i)
                ;
            shm[8] = i;
        }
        _exit(0);
    }
    double t = now_us();
    for (int i = 0; i < N; i++) {
        send(sv[0], b, 32, 0);
        while (recv(sv[0], b, 32, MSG_DONTWAIT) != 32)
            ;
    }
    double sock = (now_us() - t) / N;
    t = now_us();
    for (uint64_t i = 1; i <= (uint64_t)N; i++) {
        shm[0] = i;
        while (shm[8] != i)
            ;
    }
    double mem = (now_us() - t) / N;
    waitpid(pid, NULL, 0);
    printf("round trip between processes: socket (spinning recv) %.2f us, shared memory %.2f us\n", sock, mem);
}

int main(void)
{
    sockprobe();
    st = probe_start();
    size_t maxn = 64 << 20;
    void *hal;
    CK(cuMemHostAlloc(&hal, maxn, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    memset(hal, 1, maxn);
    void *mfd = memfd_buf(maxn);
    flag = memfd_buf(4096);
    CUdeviceptr dm, dv = vmm_buf(maxn);
    CK(cuMemAlloc(&dm, maxn));
    const char *vn[] = {"cuMemcpy", "async+query", "async+flag", "async+sync", "legacy async+query"};
    struct {
        const char *name;
        CUdeviceptr h, d;
    } combos[] = {{"hostalloc/cuMemAlloc", (CUdeviceptr)(uintptr_t)hal, dm},
                  {"memfd/VMM", (CUdeviceptr)(uintptr_t)mfd, dv},
                  {"memfd/cuMemAlloc", (CUdeviceptr)(uintptr_t)mfd, dm},
                  {"hostalloc/VMM", (CUdeviceptr)(uintptr_t)hal, dv}};
    size_t sizes[] = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
    for (int si = 0; si < 4; si++) {
        size_t n = sizes[si];
        int reps = n >= (16 << 20) ? 10 : 40;
        for (int h2d = 1; h2d >= 0; h2d--) {
            double med[4][5];
            double samples[4][5][9];
            for (int round = 0; round < 9; round++)
                for (int c = 0; c < 4; c++)
                    for (int v = 0; v < 5; v++) {
                        if (v > 0 && c > 1)
                            continue;
                        for (int w = 0; w < 3; w++)
                            run(v, combos[c].d, combos[c].h, n, h2d);
                        double t = now_us();
                        for (int r = 0; r < reps; r++)
                            run(v, combos[c].d, combos[c].h, n, h2d);
                        samples[c][v][round] = (now_us() - t) / reps;
                    }
            for (int c = 0; c < 4; c++)
                for (int v = 0; v < 5; v++) {
                    if (v > 0 && c > 1)
                        continue;
                    qsort(samples[c][v], 9, sizeof(double), cmpd);
                    med[c][v] = samples[c][v][4];
                    printf("%2zu MiB %s %-22s %-20s %8.2f us %6.2f GB/s\n", n >> 20, h2d ? "H2D" : "D2H",
                           combos[c].name, vn[v], med[c][v], n / med[c][v] / 1e3);
                }
        }
    }
    return 0;
}
