// The driver's virtual memory management as PyTorch's expandable segments use it (libcuda.so.1, dlopen'ed): one
// large address range reserved, physical chunks created and mapped one after another to grow a segment, written
// and read by kernels and copies that cross the chunks' boundaries, the last chunk unmapped and released to shrink
// it, and mapped again; later steps only compute on it.  Each step's checksum depends on every earlier step's contents, so a checkpoint, migration
// or restore that loses or misplaces a chunk changes the output.
//
//   driver_vmm [steps] [pause_ms]      (pause_ms -1: waits for a line on stdin after each step)
//
// Stdout is the same natively and through nvproxy.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#define FN(name) static decltype(&name) p_##name = (decltype(&name))dlsym(lib(), #name)

static void *lib() {
    static void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    return h;
}

FN(cuInit);
FN(cuGetErrorName);
FN(cuMemAddressReserve);
FN(cuMemAddressFree);
FN(cuMemCreate);
FN(cuMemRelease);
FN(cuMemMap);
FN(cuMemUnmap);
FN(cuMemSetAccess);
FN(cuMemGetAccess);
FN(cuMemGetAllocationGranularity);
FN(cuMemGetAllocationPropertiesFromHandle);
FN(cuMemRetainAllocationHandle);

#include "driver_check.h"

#define RT(call)                                                                                                    \
    do {                                                                                                            \
        cudaError_t e_ = (call);                                                                                    \
        if (e_ != cudaSuccess) {                                                                                    \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_));                             \
            exit(1);                                                                                                \
        }                                                                                                           \
    } while (0)

__global__ void vmm_mix(unsigned *a, unsigned long long n, unsigned k) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        a[i] = a[i] * 2654435761u + (unsigned)i + k;
}

enum { GROWING = 5, MAX_CHUNKS = GROWING }; // steps that grow the segment (then it stays as it is)

static unsigned long long checksum(const unsigned *v, size_t n) {
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 6;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    CK(p_cuInit(0));
    RT(cudaSetDevice(0));
    RT(cudaFree(0));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0, rec = 0;
    CK(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CK(p_cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    // (said after the steps: a gated run's first line is its first step's)
    char said[1024];
    int at = snprintf(said, sizeof said, "granularity: a power of two: %s; recommended a multiple of it: %s\n",
                      (g & (g - 1)) == 0 ? "yes" : "no", rec && rec % g == 0 ? "yes" : "no");
    at += snprintf(said + at, sizeof said - at, "granularity without an out pointer: %s\n",
                   cu_error_name(p_cuMemGetAllocationGranularity(NULL, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
    CUmemGenericAllocationHandle bad;
    at += snprintf(said + at, sizeof said - at, "create of a size not a multiple of it: %s\n",
                   cu_error_name(p_cuMemCreate(&bad, g + 1, &prop, 0)));

    const size_t chunk = g;
    const size_t total = MAX_CHUNKS * chunk;
    CUdeviceptr base = 0;
    CK(p_cuMemAddressReserve(&base, total, 0, 0, 0));
    snprintf(said + at, sizeof said - at, "reserved: aligned to the granularity: %s\n", base % g == 0 ? "yes" : "no");

    CUmemGenericAllocationHandle h[MAX_CHUNKS];
    int mapped = 0;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    unsigned *host = (unsigned *)malloc(total);
    char line[64];
    bool gated = pause_ms < 0;

    for (int step = 0; step < steps; step++) {
        if (step == 2) { // shrink: the last chunk goes back
            mapped--;
            RT(cudaDeviceSynchronize());
            CK(p_cuMemUnmap(base + mapped * chunk, chunk));
            CK(p_cuMemRelease(h[mapped]));
        }
        if (step < GROWING) { // grow by one chunk, mapped right after the others
            CK(p_cuMemCreate(&h[mapped], chunk, &prop, 0));
            CK(p_cuMemMap(base + mapped * chunk, chunk, 0, h[mapped], 0));
            CK(p_cuMemSetAccess(base + mapped * chunk, chunk, &access, 1));
            RT(cudaMemset((void *)(base + mapped * chunk), step + 1, chunk));
            mapped++;
        }
        unsigned *a = (unsigned *)base;
        unsigned long long n = mapped * chunk / sizeof(unsigned);
        vmm_mix<<<64, 256>>>(a, n, step);
        RT(cudaGetLastError());
        if (mapped > 1) // a copy across the first chunks' boundary
            RT(cudaMemcpy((char *)base + chunk - 4096, (char *)base + 8192, 8192, cudaMemcpyDeviceToDevice));
        RT(cudaMemcpy(host, a, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        printf("step %d: %d chunks, checksum %016llx\n", step, mapped, checksum(host, n));
        fflush(stdout);
        if (pause_ms > 0)
            usleep(pause_ms * 1000);
        else if (gated && !fgets(line, sizeof line, stdin))
            gated = false;
    }

    printf("%s", said);
    unsigned long long flags = 0;
    CK(p_cuMemGetAccess(&flags, &access.location, base + chunk / 2));
    printf("access: %s\n", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "read-write" : "other");
    CUmemGenericAllocationHandle again = 0;
    CK(p_cuMemRetainAllocationHandle(&again, (void *)(base + chunk + 100)));
    printf("retained: the handle mapped there: %s\n", mapped > 1 && again == h[1] ? "yes" : "no");
    CK(p_cuMemRelease(again));
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    CK(p_cuMemGetAllocationPropertiesFromHandle(&got, h[0]));
    printf("properties: pinned %s, device %d\n", got.type == CU_MEM_ALLOCATION_TYPE_PINNED ? "yes" : "no",
           got.location.id);

    // released while mapped: the memory stays until unmapped
    CK(p_cuMemRelease(h[0]));
    vmm_mix<<<64, 256>>>((unsigned *)base, chunk / sizeof(unsigned), 7);
    RT(cudaMemcpy(host, (void *)base, chunk, cudaMemcpyDeviceToHost));
    printf("released, still mapped: checksum %016llx\n", checksum(host, chunk / sizeof(unsigned)));
    CK(p_cuMemUnmap(base, chunk));
    for (int i = 1; i < mapped; i++) {
        CK(p_cuMemUnmap(base + i * chunk, chunk));
        CK(p_cuMemRelease(h[i]));
    }
    CK(p_cuMemAddressFree(base, total));
    printf("Test PASSED\n");
    return 0;
}
