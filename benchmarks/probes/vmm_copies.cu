/* Does device memory made through the VMM API (nvproxy's arena: cuMemCreate + cuMemMap, shareable as a POSIX
 * file descriptor, at a fixed address) copy as fast as cudaMalloc's?  Native, one GPU, pinned host memory.
 * Prints the median time per cudaMemcpy for each kind of device memory, size and direction, the kinds
 * alternating within every round.
 *   nvcc -O2 -o vmm_copies vmm_copies.cu -lcuda && ./vmm_copies [rounds] */
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#include "probe_rt.h"

#define MAXSZ (64ull << 20)

#define CU(x) PROBE_CHECK(CUresult, x, probe_unnamed) /* (driver calls; CK: runtime calls) */

enum { MALLOC, VMM_PLAIN, VMM_FD, VMM_FD_FIXED, VMM_FD_BIG_ALIGN, KINDS };
static const char *names[KINDS] = {"cudaMalloc", "VMM", "VMM fd", "VMM fd @0x2000_0000_0000", "VMM fd 1 GiB aligned"};

static void *vmm(int fd_handle, CUdeviceptr hint, size_t align)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    p.requestedHandleTypes = fd_handle ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    size_t g;
    CU(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va;
    CU(cuMemAddressReserve(&va, MAXSZ, align ? align : g, hint, 0));
    if (hint && va != hint)
        printf("(the hint %#llx was not honoured: %#llx)\n", (unsigned long long)hint, (unsigned long long)va);
    CUmemGenericAllocationHandle h;
    CU(cuMemCreate(&h, MAXSZ, &p, 0));
    CU(cuMemMap(va, MAXSZ, 0, h, 0));
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location = p.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(va, MAXSZ, &a, 1));
    return (void *)va;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    CK(cudaFree(0));
    void *dev[KINDS], *host;
    CK(cudaMalloc(&dev[MALLOC], MAXSZ));
    dev[VMM_PLAIN] = vmm(0, 0, 0);
    dev[VMM_FD] = vmm(1, 0, 0);
    dev[VMM_FD_FIXED] = vmm(1, 0x200000000000ull, 0);
    dev[VMM_FD_BIG_ALIGN] = vmm(1, 0, 1ull << 30);
    for (int k = 0; k < KINDS; k++)
        printf("%-26s at %p\n", names[k], dev[k]);
    CK(cudaMallocHost(&host, MAXSZ));
    memset(host, 1, MAXSZ);

    static const size_t sizes[] = {1u << 20, 4u << 20, 16u << 20, 64u << 20};
    double *t = (double *)malloc(sizeof(double) * rounds), *all = (double *)malloc(sizeof(double) * rounds * KINDS);
    printf("%-5s %-4s %-26s %10s %8s\n", "MiB", "dir", "device memory", "us", "GB/s");
    for (unsigned z = 0; z < sizeof sizes / sizeof *sizes; z++)
        for (int d2h = 0; d2h < 3; d2h++) { /* h2d, d2h, d2d (from cudaMalloc's memory) */
            for (int r = -3; r < rounds; r++)
                for (int k = 0; k < KINDS; k++) {
                    void *dst = d2h == 1 ? host : dev[k], *src = d2h == 0 ? host : d2h == 1 ? dev[k] : dev[MALLOC];
                    if (d2h == 2 && k == MALLOC)
                        src = dev[VMM_PLAIN];
                    double t0 = now_us();
                    CK(cudaMemcpy(dst, src, sizes[z], cudaMemcpyDefault));
                    if (r >= 0)
                        all[k * rounds + r] = now_us() - t0;
                }
            for (int k = 0; k < KINDS; k++) {
                memcpy(t, all + k * rounds, sizeof(double) * rounds);
                qsort(t, rounds, sizeof *t, cmpd);
                double m = t[rounds / 2];
                printf("%-5zu %-4s %-26s %10.1f %8.2f\n", sizes[z] >> 20, d2h == 0 ? "h2d" : d2h == 1 ? "d2h" : "d2d",
                       names[k], m, sizes[z] / m / 1e3);
            }
        }
    return 0;
}
