// Many small device allocations (nvproxy carves them in the shim): mixed
// sizes, frees while kernels are in flight, reuse, and cudaDeviceReset.
// Every live block must keep its own contents and none may overlap another.
#include <algorithm>
#include <vector>
#include "check.h"

__global__ void stamp(unsigned *p, int n, unsigned tag) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = tag * 2654435761u + (unsigned)i;
}

struct Block { unsigned *p; int n; unsigned tag; };

static int words(int k) { return 128 << (k % 13); }  // 512 B .. 2 MiB

static void check_all(const std::vector<Block> &live, const char *when) {
    std::vector<std::pair<unsigned long, unsigned long>> spans;
    long bad = 0;
    for (const Block &b : live) {
        spans.push_back({(unsigned long)b.p, (unsigned long)(b.p + b.n)});
        if ((unsigned long)b.p % 256) bad++;
        unsigned first = 0, last = 0;
        CHECK(cudaMemcpy(&first, b.p, sizeof first, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&last, b.p + b.n - 1, sizeof last, cudaMemcpyDeviceToHost));
        if (first != b.tag * 2654435761u || last != b.tag * 2654435761u + (unsigned)(b.n - 1)) bad++;
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); i++)
        if (spans[i].first < spans[i - 1].second) bad++;
    printf("%s: %zu blocks, %ld bad\n", when, live.size(), bad);
}

int main() {
    std::vector<Block> live;
    unsigned tag = 1;
    for (int k = 0; k < 300; k++) {
        Block b{nullptr, words(k), tag++};
        CHECK(cudaMalloc(&b.p, b.n * sizeof(unsigned)));
        stamp<<<(b.n + 255) / 256, 256>>>(b.p, b.n, b.tag);
        live.push_back(b);
    }
    // free every third block with the kernels possibly still running, then allocate again
    std::vector<Block> kept;
    for (size_t i = 0; i < live.size(); i++) {
        if (i % 3 == 0) CHECK(cudaFree(live[i].p));
        else kept.push_back(live[i]);
    }
    for (int k = 0; k < 200; k++) {
        Block b{nullptr, words(k * 7), tag++};
        CHECK(cudaMalloc(&b.p, b.n * sizeof(unsigned)));
        stamp<<<(b.n + 255) / 256, 256>>>(b.p, b.n, b.tag);
        kept.push_back(b);
    }
    CHECK(cudaDeviceSynchronize());
    check_all(kept, "after reuse");
    // a loop of malloc/free, as allocation-heavy code does
    for (int k = 0; k < 5000; k++) {
        void *p;
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaFree(p));
    }
    check_all(kept, "after 5000 malloc/free");
    CHECK(cudaDeviceReset());
    std::vector<Block> fresh;
    for (int k = 0; k < 50; k++) {
        Block b{nullptr, words(k), tag++};
        CHECK(cudaMalloc(&b.p, b.n * sizeof(unsigned)));
        stamp<<<(b.n + 255) / 256, 256>>>(b.p, b.n, b.tag);
        fresh.push_back(b);
    }
    CHECK(cudaDeviceSynchronize());
    check_all(fresh, "after reset");
    for (const Block &b : fresh) CHECK(cudaFree(b.p));
    printf("Test PASSED\n");
    return 0;
}
