// Every kind of copy: pinned (MallocHost, HostAlloc), registered, pageable
// (large enough for many staged chunks), async on streams, D2D, Default,
// memset, 2D copies with pitch, and a kernel reading mapped host memory.
#include "check.h"
#include <cstring>

__global__ void scale(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * k + 1;
}

static void fill(int *p, int n, int seed) { for (int i = 0; i < n; i++) p[i] = (i * 2654435761u + seed) & 0xffff; }

int main() {
    const int n = 11 * 1000 * 1000 + 17;  // ~44 MB: several staging chunks, odd tail
    size_t bytes = n * sizeof(int);
    int *pageable = (int *)malloc(bytes), *back = (int *)malloc(bytes);
    fill(pageable, n, 7);
    int *d, *d2;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMalloc(&d2, bytes));
    CHECK(cudaMemcpy(d, pageable, bytes, cudaMemcpyHostToDevice));
    scale<<<(n + 255) / 256, 256>>>(d, n, 3);
    CHECK(cudaMemcpy(back, d, bytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++) if (back[i] != pageable[i] * 3 + 1) bad++;
    printf("pageable round trip: mismatches=%d checksum=%llx\n", bad, checksum(back, bytes));

    // pinned, async on a stream, D2D and cudaMemcpyDefault
    int *pin, *pin2;
    CHECK(cudaMallocHost(&pin, bytes));
    CHECK(cudaHostAlloc(&pin2, bytes, cudaHostAllocMapped));
    fill(pin, n, 11);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyAsync(d, pin, bytes, cudaMemcpyHostToDevice, s));
    scale<<<(n + 255) / 256, 256, 0, s>>>(d, n, 5);
    CHECK(cudaMemcpyAsync(d2, d, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaMemcpyAsync(pin2, d2, bytes, cudaMemcpyDefault, s));
    CHECK(cudaStreamSynchronize(s));
    bad = 0;
    for (int i = 0; i < n; i++) if (pin2[i] != pin[i] * 5 + 1) bad++;
    printf("pinned async: mismatches=%d checksum=%llx\n", bad, checksum(pin2, bytes));

    // a kernel working directly on mapped pinned memory
    int *mapped;
    CHECK(cudaHostGetDevicePointer((void **)&mapped, pin2, 0));
    scale<<<(n + 255) / 256, 256>>>(mapped, 1000, 2);
    CHECK(cudaDeviceSynchronize());
    printf("mapped: pin2[0..2] = %d %d %d\n", pin2[0], pin2[1], pin2[2]);

    // cudaHostRegister keeps the pointer and its contents
    int *reg = (int *)malloc(1 << 20);
    fill(reg, (1 << 20) / 4, 3);
    unsigned long long before = checksum(reg, 1 << 20);
    CHECK(cudaHostRegister(reg, 1 << 20, cudaHostRegisterDefault));
    printf("register keeps contents: %s\n", checksum(reg, 1 << 20) == before ? "yes" : "no");
    CHECK(cudaMemcpy(d, reg, 1 << 20, cudaMemcpyHostToDevice));
    scale<<<1024, 256>>>(d, (1 << 20) / 4, 7);
    CHECK(cudaMemcpy(reg, d, 1 << 20, cudaMemcpyDeviceToHost));
    printf("registered: reg[5]=%d checksum=%llx\n", reg[5], checksum(reg, 1 << 20));
    CHECK(cudaHostUnregister(reg));
    printf("after unregister: reg[5]=%d\n", reg[5]);
    printf("unregister twice: %s\n", cudaGetErrorName(cudaHostUnregister(reg)));
    cudaGetLastError();

    // memset and 2D copies with pitch
    size_t pitch;
    int *img;
    const int w = 1000, h = 37;
    CHECK(cudaMallocPitch((void **)&img, &pitch, w * sizeof(int), h));
    CHECK(cudaMemset2D(img, pitch, 0x01, w * sizeof(int), h));
    CHECK(cudaMemset(d, 0xab, 4096));
    int host2d[37][1000];
    for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) host2d[y][x] = y * 10000 + x;
    CHECK(cudaMemcpy2D((char *)img + pitch * 0, pitch, host2d, w * sizeof(int), 500 * sizeof(int), h,
                       cudaMemcpyHostToDevice));
    int out2d[37][1000];
    CHECK(cudaMemcpy2D(out2d, w * sizeof(int), img, pitch, w * sizeof(int), h, cudaMemcpyDeviceToHost));
    int probe[4];
    CHECK(cudaMemcpy(probe, d, sizeof probe, cudaMemcpyDeviceToHost));
    printf("pitch>=width: %s, 2D: [3][7]=%d [36][499]=%d [36][500]=%08x memset=%08x\n",
           pitch >= w * sizeof(int) ? "yes" : "no", out2d[3][7], out2d[36][499], out2d[36][500], probe[0]);

    // pageable copies of the sizes that take each path of nvproxy's staging (one piece, by the calling thread or
    // split over helper threads; the whole in parts copied by helper threads while the device copies others;
    // slots in turn), at odd sizes and offsets
    const size_t sizes[] = {4096 + 12, (40 << 10) + 12, (64 << 10) - 4, (100 << 10) + 8, (300 << 10) + 4, 512 << 10,
                            (1 << 20) + 20, (4 << 20) - 4, 7654324, 16 << 20, 32 << 20, (32 << 20) + 4, 40000004};
    char *src = (char *)pageable, *dst = (char *)back;
    bad = 0;
    for (size_t sz : sizes) {
        memset(dst, 0, sz + 8);
        CHECK(cudaMemcpy((char *)d2 + 4, src + 8, sz, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dst + 4, (char *)d2 + 4, sz, cudaMemcpyDeviceToHost));
        if (memcmp(dst + 4, src + 8, sz) || dst[3] || dst[sz + 4]) bad++;
    }
    printf("pageable sizes: %zu sizes, mismatches=%d\n", sizeof sizes / sizeof sizes[0], bad);

    // copies from the device of 1 MiB and more land at the next place round nvproxy's staging buffer: many, of
    // sizes that wrap it at odd places, each from another offset, with small copies to the device between them
    const size_t round_sizes[] = {128 << 10, (300 << 10) + 4, (1 << 20) + 20, (3 << 20) + 8, 5000000};
    CHECK(cudaMemcpy(d2, src, 40 << 20, cudaMemcpyHostToDevice));
    bad = 0;
    int copies = 0;
    for (int k = 0; k < 120; k++) {
        size_t sz = round_sizes[k % 5], off = ((size_t)k * 7919 * 64) % (34 << 20);
        CHECK(cudaMemcpy((char *)d2 + (40 << 20) + 64 * (k % 16), src + k, 4096, cudaMemcpyHostToDevice));
        memset(dst, 0, sz + 8);
        CHECK(cudaMemcpy(dst + 4, (char *)d2 + off, sz, cudaMemcpyDeviceToHost));
        if (memcmp(dst + 4, src + off, sz) || dst[3] || dst[sz + 4]) bad++;
        copies++;
    }
    printf("copies round the staging buffer: %d copies, mismatches=%d\n", copies, bad);

    CHECK(cudaFreeHost(pin)); CHECK(cudaFreeHost(pin2)); CHECK(cudaFree(d)); CHECK(cudaFree(d2)); CHECK(cudaFree(img));
    CHECK(cudaStreamDestroy(s));
    free(pageable); free(back); free(reg);
    printf("Test PASSED\n");
    return 0;
}
