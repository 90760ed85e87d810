// Small pageable copies to the device, which return once the bytes are staged (as the runtime's do): the host
// buffer changes right after each call, copies queue behind busy streams, the staging buffer goes round many
// times, copies back from the device come in between, another thread's kernel comes amid a run of copies, and a
// thread ends with copies in flight.
#include "check.h"
#include <cstring>
#include <thread>
#include <vector>

// Spins for `cycles`, then sets *flag (mapped pinned memory) to `value`.
__global__ void spin(volatile int *flag, long long cycles, int value) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    *flag = value;
    __threadfence_system();
}

static const long long SPIN = 40000000LL;  // ~20 ms on an H100/H200

int main() {
    const size_t dev_bytes = 64 << 20;
    unsigned char *d;
    CHECK(cudaMalloc(&d, dev_bytes));
    CHECK(cudaMemset(d, 0, dev_bytes));
    std::vector<unsigned char> host(512 << 10), expect(dev_bytes), back(dev_bytes);
    int *flag;
    CHECK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
    int *dflag;
    CHECK(cudaHostGetDevicePointer((void **)&dflag, flag, 0));

    // 1. back to back, sizes 1 B - 300 KiB, the host buffer rewritten after each call (staging places come
    //    round again as the copies end)
    size_t at = 0, total = 0;
    int copies = 0;
    for (unsigned k = 0; total < (300u << 20); k++) {
        size_t n = 1 + (size_t)(k * 7919u) % (300u << 10);
        if (at + n > dev_bytes) at = (k * 4099u) % 4096;
        pattern(host.data(), n, k);
        CHECK(cudaMemcpy(d + at, host.data(), n, cudaMemcpyHostToDevice));
        memcpy(expect.data() + at, host.data(), n);
        memset(host.data(), 0xee, n);  // (staged already: this must not reach the device)
        at += n;
        total += n;
        copies++;
    }
    CHECK(cudaMemcpy(back.data(), d, dev_bytes, cudaMemcpyDeviceToHost));
    printf("back to back: %d copies, equal: %s\n", copies, memcmp(back.data(), expect.data(), dev_bytes) ? "no" : "yes");

    // 2. a synchronous copy waits for a kernel on a blocking stream first (then the flag is set)
    cudaStream_t blocking, nonblocking;
    CHECK(cudaStreamCreate(&blocking));
    CHECK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
    *flag = 0;
    spin<<<1, 1, 0, blocking>>>(dflag, SPIN, 42);
    pattern(host.data(), 4096, 1);
    CHECK(cudaMemcpy(d, host.data(), 4096, cudaMemcpyHostToDevice));
    printf("after a kernel on a blocking stream: flag %d\n", *(volatile int *)flag);
    memcpy(expect.data(), host.data(), 4096);

    // 2b. the same with the kernel launched by another thread amid a run of copies, this thread calling nothing
    //     else between them (nvproxy sends such copies without waiting for answers while nothing comes between)
    for (unsigned k = 0; k < 8; k++) {
        pattern(host.data(), 4096, 200 + k);
        CHECK(cudaMemcpy(d + k * 4096, host.data(), 4096, cudaMemcpyHostToDevice));
        memcpy(expect.data() + k * 4096, host.data(), 4096);
    }
    *flag = 0;
    std::thread([&] {
        spin<<<1, 1, 0, blocking>>>(dflag, SPIN, 43);
        CHECK(cudaGetLastError());
    }).join();
    pattern(host.data(), 4096, 300);
    CHECK(cudaMemcpy(d + 8 * 4096, host.data(), 4096, cudaMemcpyHostToDevice));
    printf("after a kernel another thread launched amid copies: flag %d\n", *(volatile int *)flag);
    memcpy(expect.data() + 8 * 4096, host.data(), 4096);

    // 3. cudaMemcpyAsync behind a busy stream: more copies in flight than nvproxy keeps, each from the same
    //    host buffer, rewritten at once
    for (cudaStream_t s : {blocking, nonblocking}) {
        spin<<<1, 1, 0, s>>>(dflag, SPIN, 7);
        for (unsigned k = 0; k < 40; k++) {
            size_t n = 4096 + k * 300, off = (8 << 20) + k * (64 << 10) + (s == blocking ? 0 : (16 << 20));
            pattern(host.data(), n, 100 + k);
            CHECK(cudaMemcpyAsync(d + off, host.data(), n, cudaMemcpyHostToDevice, s));
            memcpy(expect.data() + off, host.data(), n);
            memset(host.data(), 0x5a, n);
        }
        // a copy back in between, on the legacy stream, of memory the copies above do not touch
        std::vector<unsigned char> some(200 << 10);
        CHECK(cudaMemcpy(some.data(), d + (40 << 20), some.size(), cudaMemcpyDeviceToHost));
        printf("copy back while async copies wait: equal: %s\n",
               memcmp(some.data(), expect.data() + (40 << 20), some.size()) ? "no" : "yes");
        CHECK(cudaStreamSynchronize(s));
    }

    // 4. 2D copies of pageable rows, each row a small copy
    const int w = 1000, h = 37;
    size_t pitch;
    int *img;
    CHECK(cudaMallocPitch((void **)&img, &pitch, w * sizeof(int), h));
    static int rows[37][1000], out[37][1000];
    for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) rows[y][x] = y * 10000 + x;
    CHECK(cudaMemcpy2D(img, pitch, rows, w * sizeof(int), 500 * sizeof(int), h, cudaMemcpyHostToDevice));
    memset(rows, 0, sizeof rows);
    CHECK(cudaMemcpy2D(out, w * sizeof(int), img, pitch, 500 * sizeof(int), h, cudaMemcpyDeviceToHost));
    printf("2D rows: [3][7]=%d [36][499]=%d\n", out[3][7], out[36][499]);

    // 5. a thread that ends with copies in flight, then another that takes its staging buffer
    for (int t = 0; t < 2; t++) {
        std::thread th([&, t] {
            std::vector<unsigned char> mine(64 << 10);
            for (unsigned k = 0; k < 50; k++) {
                size_t off = (48 << 20) + (t * 50 + k) * (64 << 10);
                pattern(mine.data(), mine.size(), 1000 + t * 50 + k);
                CHECK(cudaMemcpyAsync(d + off, mine.data(), mine.size(), cudaMemcpyHostToDevice, 0));
                memcpy(expect.data() + off, mine.data(), mine.size());
                memset(mine.data(), 0x11, mine.size());
            }
        });
        th.join();
    }

    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(back.data(), d, dev_bytes, cudaMemcpyDeviceToHost));
    printf("all: equal: %s checksum=%llx\n", memcmp(back.data(), expect.data(), dev_bytes) ? "no" : "yes",
           checksum(back.data(), dev_bytes));
    CHECK(cudaFree(d));
    CHECK(cudaFree(img));
    CHECK(cudaFreeHost(flag));
    CHECK(cudaStreamDestroy(blocking));
    CHECK(cudaStreamDestroy(nonblocking));
    printf("Test PASSED\n");
    return 0;
}
