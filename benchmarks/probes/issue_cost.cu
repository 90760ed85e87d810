/* How long does the driver take to issue a small asynchronous copy to the device (the call alone)?  Through
 * nvproxy a posted 16 KiB copy spent 6-8 us in cuMemcpyAsync + cuEventRecord, where a probe from
 * cudaMallocHost memory had measured 1.4-1.6 us.  Compared: the source (cudaMallocHost, or POSIX shared memory
 * registered as nvproxy's staging buffer is), the destination (cudaMalloc, or VMM memory as nvproxy's arena),
 * the stream (legacy, or a non-blocking one), sizes 4-64 KiB.  Each copy is issued on an idle stream.
 *   nvcc -O2 -o issue_cost issue_cost.cu -lcuda && ./issue_cost */
#include <cuda.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe_rt.h"

#define BYTES (1u << 20)

static void *shm_registered(void)
{
    char name[64];
    snprintf(name, sizeof name, "/issue_cost.%d", getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, BYTES)) {
        perror("shm");
        exit(1);
    }
    shm_unlink(name);
    void *p = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memset(p, 1, BYTES);
    CK(cudaHostRegister(p, BYTES, cudaHostRegisterPortable | cudaHostRegisterMapped));
    return p;
}

static void *vmm(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t g = 2u << 20;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location = p.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cuMemAddressReserve(&va, g, g, 0, 0) || cuMemCreate(&h, g, &p, 0) || cuMemMap(va, g, 0, h, 0) ||
        cuMemSetAccess(va, g, &a, 1)) {
        fprintf(stderr, "VMM failed\n");
        exit(1);
    }
    return (void *)va;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    CK(cudaFree(0));
    void *src[2], *dst[2];
    CK(cudaMallocHost(&src[0], BYTES));
    memset(src[0], 1, BYTES);
    src[1] = shm_registered();
    CK(cudaMalloc(&dst[0], BYTES));
    dst[1] = vmm();
    cudaStream_t st[2] = {0, NULL};
    CK(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking));
    const char *sn[2] = {"cudaMallocHost", "registered shm"}, *dn[2] = {"cudaMalloc", "VMM"},
               *tn[2] = {"legacy", "non-blocking"};
    double *t = (double *)malloc(sizeof(double) * reps);
    printf("%-15s %-10s %-12s %6s %8s %8s  (us to issue, median / p90)\n", "source", "dest", "stream", "KiB", "med",
           "p90");
    static const size_t sizes[] = {4096, 16384, 65536};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < 2; d++)
            for (int k = 0; k < 2; k++)
                for (unsigned z = 0; z < 3; z++) {
                    for (int r = -5; r < reps; r++) {
                        CK(cudaStreamSynchronize(st[k]));
                        double t0 = now_us();
                        CK(cudaMemcpyAsync(dst[d], src[s], sizes[z], cudaMemcpyHostToDevice, st[k]));
                        double t1 = now_us();
                        if (r >= 0)
                            t[r] = t1 - t0;
                    }
                    CK(cudaStreamSynchronize(st[k]));
                    qsort(t, reps, sizeof *t, cmpd);
                    printf("%-15s %-10s %-12s %6zu %8.2f %8.2f\n", sn[s], dn[d], tn[k], sizes[z] >> 10, t[reps / 2],
                           t[reps * 9 / 10]);
                }
    /* the same copies by other entry points, from the registered shm (its device address: UVA, the same) */
    printf("\nregistered shm -> VMM, non-blocking stream, other entry points (us to issue, median / p90; then the "
           "time until done)\n");
    for (int how = 0; how < 3; how++)
        for (unsigned z = 0; z < 3; z++) {
            double *u = (double *)malloc(sizeof(double) * reps);
            for (int r = -5; r < reps; r++) {
                CK(cudaStreamSynchronize(st[1]));
                double t0 = now_us();
                CUresult c = CUDA_SUCCESS;
                if (how == 0)
                    c = cuMemcpyHtoDAsync((CUdeviceptr)dst[1], src[1], sizes[z], (CUstream)st[1]);
                else if (how == 1)
                    c = cuMemcpyDtoDAsync((CUdeviceptr)dst[1], (CUdeviceptr)src[1], sizes[z], (CUstream)st[1]);
                else {
                    CUDA_MEMCPY2D m;
                    memset(&m, 0, sizeof m);
                    m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
                    m.srcDevice = (CUdeviceptr)src[1];
                    m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
                    m.dstDevice = (CUdeviceptr)dst[1];
                    m.WidthInBytes = sizes[z];
                    m.Height = 1;
                    c = cuMemcpy2DAsync(&m, (CUstream)st[1]);
                }
                double t1 = now_us();
                CK(cudaStreamSynchronize(st[1]));
                double t2 = now_us();
                if (c) {
                    printf("entry %d failed: %d\n", how, (int)c);
                    break;
                }
                if (r >= 0) {
                    t[r] = t1 - t0;
                    u[r] = t2 - t0;
                }
            }
            qsort(t, reps, sizeof *t, cmpd);
            qsort(u, reps, sizeof *u, cmpd);
            static const char *hn[3] = {"cuMemcpyHtoDAsync", "cuMemcpyDtoDAsync", "cuMemcpy2DAsync (device)"};
            printf("%-26s %6zu %8.2f %8.2f  done %8.2f\n", hn[how], sizes[z] >> 10, t[reps / 2], t[reps * 9 / 10],
                   u[reps / 2]);
            free(u);
        }
    return 0;
}
