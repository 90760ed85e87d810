// Pinned host memory of every kind and size: cudaMallocHost, cudaHostAlloc (each flag), cudaHostRegister, from
// 100 bytes to 40 MiB.  Each buffer is written by the host, read by a kernel through its device pointer, copied to
// the device and back with cudaMemcpyAsync; its flags and attributes are asked for.  Buffers are freed in odd
// orders while others live on (and are checked unharmed), and the errors of bad frees are shown.
// argv[1]: steps of a long run with live buffers (checkpoint tests; default 0), argv[2]: ms between steps, or -1:
// after each step wait for a line on standard input (at its end of file, wait no more).
#include "check.h"
#include <cstdint>
#include <cstring>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

// a weighted sum (wrapping): each element counts with its place, in any order of adding
__global__ void fold(const unsigned *p, int n, unsigned long long *out) {
    unsigned long long s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        s += (unsigned long long)p[i] * (unsigned long long)(i + 1);
    atomicAdd(out, s);
}

static unsigned long long fold_host(const unsigned *p, int n) {
    unsigned long long s = 0;
    for (int i = 0; i < n; i++) s += (unsigned long long)p[i] * (unsigned long long)(i + 1);
    return s;
}

static void fold_on(const unsigned *p, int n, unsigned long long *dsum, cudaStream_t s) {
    CHECK(cudaMemsetAsync(dsum, 0, sizeof *dsum, s));
    fold<<<64, 256, 0, s>>>(p, n, dsum);
}

struct Kind { const char *name; int how; unsigned flags; };  // how: 0 cudaMallocHost, 1 cudaHostAlloc, 2 register
static const Kind KINDS[] = {{"mallochost", 0, 0},
                             {"hostalloc-default", 1, cudaHostAllocDefault},
                             {"hostalloc-portable", 1, cudaHostAllocPortable},
                             {"hostalloc-mapped", 1, cudaHostAllocMapped},
                             {"hostalloc-wc", 1, cudaHostAllocWriteCombined},
                             {"hostalloc-all", 1, cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined},
                             {"register", 2, cudaHostRegisterDefault}};

struct Buf { unsigned *p; size_t bytes; const Kind *k; void *own; unsigned tag; };

static void fill(Buf &b, unsigned tag) {
    b.tag = tag;
    for (size_t i = 0; i < b.bytes / 4; i++) b.p[i] = tag * 2654435761u + (unsigned)i;
}

static Buf make(const Kind &k, size_t bytes, unsigned tag) {
    Buf b = {nullptr, bytes, &k, nullptr, tag};
    if (k.how == 0) CHECK(cudaMallocHost(&b.p, bytes));
    else if (k.how == 1) CHECK(cudaHostAlloc(&b.p, bytes, k.flags));
    else {
        // (pages of their own: a page of the heap may be taken in the proxy, which cudaHostRegister reports)
        b.own = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b.own == MAP_FAILED) { printf("FAILED mmap\n"); exit(1); }
        b.p = (unsigned *)b.own;
        CHECK(cudaHostRegister(b.p, bytes, k.flags));
    }
    fill(b, tag);
    return b;
}

static bool intact(const Buf &b) {
    for (size_t i = 0; i < b.bytes / 4; i++)
        if (b.p[i] != b.tag * 2654435761u + (unsigned)i) return false;
    return true;
}

static void release(Buf &b) {
    if (b.k->how == 2) {
        CHECK(cudaHostUnregister(b.p));
        munmap(b.own, b.bytes);
    } else {
        CHECK(cudaFreeHost(b.p));
    }
    b.p = nullptr;
}

// a kernel's fold through the device pointer, and a copy there and back, against the host's fold
static void use(const Buf &b, cudaStream_t s, unsigned long long *dsum, unsigned *dev, unsigned *back) {
    int n = (int)(b.bytes / 4);
    unsigned *dp;
    CHECK(cudaHostGetDevicePointer((void **)&dp, b.p, 0));
    fold_on(dp, n, dsum, s);
    unsigned long long ksum;
    CHECK(cudaMemcpyAsync(&ksum, dsum, sizeof ksum, cudaMemcpyDeviceToHost, s));
    CHECK(cudaMemcpyAsync(dev, b.p, b.bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(back, dev, b.bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    unsigned long long hsum = fold_host(b.p, n);
    printf("  %s %zu: device pointer %s, kernel fold %s, copied back %s\n", b.k->name, b.bytes,
           dp == b.p ? "same" : "other", ksum == hsum ? "matches" : "DIFFERS",
           memcmp(back, b.p, b.bytes) ? "DIFFERS" : "equal");
}

static void attributes(const Buf &b) {
    unsigned flags = 0;
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, (char *)b.p + b.bytes / 2));
    printf("  %s %zu: type %d, host pointer %s, device pointer %s", b.k->name, b.bytes, (int)a.type,
           a.hostPointer == (char *)b.p + b.bytes / 2 ? "same" : "other",
           a.devicePointer == (char *)b.p + b.bytes / 2 ? "same" : "other");
    if (b.k->how != 2 && b.bytes >= 4096) {  // (the runtime's sub-page blocks report other flags)
        // (the runtime reports cudaHostAllocPortable for some sizes only: all pinned memory is portable under
        // unified addressing)
        unsigned asked = b.k->flags & ~cudaHostAllocPortable;
        CHECK(cudaHostGetFlags(&flags, b.p));
        printf(", flags include those asked for: %d", (flags & asked) == asked);
    }
    printf("\n");
}

// threads allocating and freeing at once, each keeping a few blocks: a block handed to two of them, or freed under
// one, shows as damage
static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg, tag = 1000000u * (seed + 1);
    const size_t sizes[] = {100, 4096, 5000, 65536, 300000};
    Buf held[8] = {};
    long damaged = 0;
    for (int i = 0; i < 300; i++) {
        seed = seed * 1664525u + 1013904223u;
        Buf &b = held[(seed >> 8) % 8];
        if (b.p) {
            damaged += !intact(b);
            CHECK(cudaFreeHost(b.p));
        }
        b = make(KINDS[(seed >> 12) % 6], sizes[(seed >> 16) % 5], tag++);
    }
    for (Buf &b : held) {
        damaged += !intact(b);
        CHECK(cudaFreeHost(b.p));
    }
    return (void *)damaged;
}

static const char *err_of(cudaError_t e) {
    cudaGetLastError();
    return cudaGetErrorName(e);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 0, pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    const size_t SIZES[] = {100, 4096, 65536, 1 << 20, 40 << 20};
    const size_t MAXB = 40 << 20;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    unsigned long long *dsum;
    unsigned *dev, *back;
    CHECK(cudaMalloc(&dsum, sizeof *dsum));
    CHECK(cudaMalloc(&dev, MAXB));
    back = (unsigned *)malloc(MAXB);

    // every kind at every size, all alive at once
    std::vector<Buf> live;
    unsigned tag = 1;
    for (size_t sz : SIZES)
        for (const Kind &k : KINDS) live.push_back(make(k, sz, tag++));
    printf("allocated %zu buffers\n", live.size());
    for (const Buf &b : live) use(b, s, dsum, dev, back);
    for (const Buf &b : live) attributes(b);

    // odd orders: every other one, then the rest from the end, allocating between; the others stay unharmed
    for (size_t i = 0; i < live.size(); i += 2) release(live[i]);
    std::vector<Buf> more;
    for (size_t i = 0; i < live.size(); i += 3) more.push_back(make(*live[i].k, live[i].bytes / 2 + 8, tag++));
    int bad = 0;
    for (const Buf &b : live) bad += b.p && !intact(b);
    for (const Buf &b : more) bad += !intact(b);
    printf("after freeing half and allocating %zu more: %d damaged\n", more.size(), bad);
    for (size_t i = live.size(); i-- > 0;)
        if (live[i].p) release(live[i]);
    for (const Buf &b : more) bad += !intact(b);
    for (const Buf &b : more) use(b, s, dsum, dev, back);
    printf("after freeing the rest backwards: %d damaged\n", bad);
    pthread_t th[4];
    for (long i = 0; i < 4; i++) pthread_create(&th[i], nullptr, churn, (void *)i);
    long churned = 0;
    for (pthread_t &t : th) {
        void *d;
        pthread_join(t, &d);
        churned += (long)d;
    }
    printf("4 threads allocating and freeing at once: %ld damaged\n", churned);

    // bad frees and questions about freed memory
    void *p;
    CHECK(cudaMallocHost(&p, 4096));
    void *q;
    CHECK(cudaMallocHost(&q, 4096));  // (its neighbour stays: the freed one is inside live shared memory)
    CHECK(cudaFreeHost(p));
    printf("double free: %s\n", err_of(cudaFreeHost(p)));
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, p));
    printf("attributes of freed memory: type %d\n", (int)a.type);
    void *dp;
    printf("device pointer of freed memory: %s\n", err_of(cudaHostGetDevicePointer(&dp, p, 0)));
    unsigned fl;
    printf("flags of freed memory: %s\n", err_of(cudaHostGetFlags(&fl, p)));
    int local;
    printf("free of a stack variable: %s\n", err_of(cudaFreeHost(&local)));
    void *heap = malloc(64);
    printf("free of malloc'd memory: %s\n", err_of(cudaFreeHost(heap)));
    free(heap);
    printf("free of an interior pointer: %s\n", err_of(cudaFreeHost((char *)q + 256)));
    printf("cudaFree of pinned memory: %s\n", err_of(cudaFree(q)));
    printf("cudaHostUnregister of allocated pinned memory: %s\n", err_of(cudaHostUnregister(q)));
    printf("cudaHostUnregister of freed pinned memory: %s\n", err_of(cudaHostUnregister(p)));
    printf("free of NULL: %s\n", err_of(cudaFreeHost(nullptr)));
    CHECK(cudaFreeHost(q));

    // a long run: live buffers of several kinds used, and some replaced, at every step
    if (steps > 0) {
        std::vector<Buf> held;
        for (int i = 0; i < 6; i++) held.push_back(make(KINDS[i % 7], SIZES[i % 4] + 4 * i, tag++));
        char line[64];
        bool gated = pause_ms < 0;
        for (int step = 0; step < steps; step++) {
            Buf &b = held[step % held.size()];
            fill(b, tag++);
            fold_on(b.p, (int)(b.bytes / 4), dsum, s);
            unsigned long long ksum;
            CHECK(cudaMemcpyAsync(&ksum, dsum, sizeof ksum, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            Buf &r = held[(step + 3) % held.size()];
            bool ok = intact(r);
            release(r);
            r = make(KINDS[(step + 1) % 7], SIZES[step % 4] + 8, tag++);
            printf("step %d: fold %016llx, the replaced one intact %d\n", step, ksum, ok);
            fflush(stdout);
            if (pause_ms >= 0) usleep(pause_ms * 1000);
            else if (gated && !fgets(line, sizeof line, stdin)) gated = false;
        }
        for (Buf &b : held) release(b);
    }
    for (Buf &b : more) release(b);
    CHECK(cudaFree(dev));
    CHECK(cudaFree(dsum));
    free(back);
    printf("Test PASSED\n");
    return 0;
}
