// nvproxy microbenchmarks: the same binary runs natively and under nvproxy.
// Prints one JSON object per line: {"bench", "param", "value", "unit"}.
// Usage: microbench [--quick] [--only pinned]   (--quick: tiny sizes for the sim backend / CI;
//        --only pinned: the pinned host memory rows alone)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); exit(1); } } while (0)

__global__ void empty() {}
__global__ void sum(const unsigned *p, size_t n, unsigned long long *out) {
    unsigned long long acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += p[i];
    atomicAdd(out, acc);
}
__global__ void eight(float *a, float *b, float *c, float *d, float *e, float *f, float *g, float *h) {
    if (threadIdx.x == 1024) a[0] = b[0] + c[0] + d[0] + e[0] + f[0] + g[0] + h[0];
}

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static void emit(const char *bench, long long param, double value, const char *unit) {
    printf("{\"bench\": \"%s\", \"param\": %lld, \"value\": %.6g, \"unit\": \"%s\"}\n", bench, param, value, unit);
    fflush(stdout);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Pinned host memory: each API's allocation and free timed apart (median us per call), at sizes from a page to
// 1 GiB.  cudaHostRegister's buffer is the program's own, its pages present, as an application's would be.
static void pinned_rows(bool quick) {
    struct api { const char *name; int how; unsigned flags; };  // how: 0 cudaMallocHost, 1 cudaHostAlloc, 2 register
    const api apis[] = {{"mallochost", 0, 0},
                        {"hostalloc_default", 1, cudaHostAllocDefault},
                        {"hostalloc_portable", 1, cudaHostAllocPortable},
                        {"hostalloc_mapped", 1, cudaHostAllocMapped},
                        {"hostalloc_wc", 1, cudaHostAllocWriteCombined},
                        {"hostregister", 2, cudaHostRegisterDefault}};
    for (size_t sz : {4096ul, 65536ul, 1ul << 20, 16ul << 20, 256ul << 20, 1ul << 30}) {
        if (quick && sz > (1 << 20)) break;
        int reps = quick ? 5 : sz <= (1 << 20) ? 100 : sz <= (16 << 20) ? 20 : sz <= (256 << 20) ? 5 : 3;
        for (const api &a : apis) {
            void *own = nullptr;
            if (a.how == 2) {
                own = aligned_alloc(4096, sz);
                memset(own, 1, sz);
            }
            std::vector<double> ta, tf;
            for (int i = 0; i <= reps; i++) {  // (the first, a warm-up, is not counted)
                void *p = own;
                double t0 = now();
                if (a.how == 0) CHECK(cudaMallocHost(&p, sz));
                else if (a.how == 1) CHECK(cudaHostAlloc(&p, sz, a.flags));
                else CHECK(cudaHostRegister(p, sz, a.flags));
                double t1 = now();
                if (a.how == 2) CHECK(cudaHostUnregister(p));
                else CHECK(cudaFreeHost(p));
                double t2 = now();
                if (i) {
                    ta.push_back((t1 - t0) * 1e6);
                    tf.push_back((t2 - t1) * 1e6);
                }
            }
            std::string name = a.name;
            emit(("pinned_alloc_" + name).c_str(), (long long)sz, median(ta), "us");
            emit(("pinned_free_" + name).c_str(), (long long)sz, median(tf), "us");
            free(own);
        }
    }
}

int main(int argc, char **argv) {
    bool quick = false, only_pinned = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "pinned")) { only_pinned = true; i++; }
        else { fprintf(stderr, "usage: microbench [--quick] [--only pinned]\n"); return 2; }
    }
    if (only_pinned) {
        CHECK(cudaFree(0));
        pinned_rows(quick);
        return 0;
    }
    int N = quick ? 50 : 20000;
    CHECK(cudaFree(0));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    float *p;
    CHECK(cudaMalloc(&p, 1 << 20));

    empty<<<1, 1, 0, s>>>();
    eight<<<1, 32, 0, s>>>(p, p, p, p, p, p, p, p);
    CHECK(cudaStreamSynchronize(s));
    double t = now();
    for (int i = 0; i < N; i++) empty<<<1, 1, 0, s>>>();
    CHECK(cudaStreamSynchronize(s));
    emit("launch_empty", 0, (now() - t) / N * 1e6, "us");
    t = now();
    for (int i = 0; i < N; i++) eight<<<1, 32, 0, s>>>(p, p, p, p, p, p, p, p);
    CHECK(cudaStreamSynchronize(s));
    emit("launch_8ptr", 0, (now() - t) / N * 1e6, "us");
    int M = N / 4;
    t = now();
    for (int i = 0; i < M; i++) { empty<<<1, 1, 0, s>>>(); CHECK(cudaStreamSynchronize(s)); }
    emit("launch_sync", 0, (now() - t) / M * 1e6, "us");
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    t = now();
    for (int i = 0; i < M; i++) { CHECK(cudaEventRecord(ev, s)); CHECK(cudaEventSynchronize(ev)); }
    emit("event_record_sync", 0, (now() - t) / M * 1e6, "us");

    for (size_t sz : {4096ul, 65536ul, 1ul << 20, 16ul << 20, 256ul << 20}) {
        if (quick && sz > (1 << 20)) break;
        int reps = sz >= (16 << 20) ? 20 : 200;
        if (quick) reps = 5;
        void *q;
        CHECK(cudaMalloc(&q, sz)); CHECK(cudaFree(q));
        t = now();
        for (int i = 0; i < reps; i++) { CHECK(cudaMalloc(&q, sz)); CHECK(cudaFree(q)); }
        emit("malloc_free", (long long)sz, (now() - t) / reps * 1e6, "us");
    }

    size_t maxsz = quick ? (1 << 20) : (1ul << 30);
    char *dev, *pin, *pag;
    CHECK(cudaMalloc(&dev, maxsz));
    CHECK(cudaMallocHost(&pin, maxsz));
    pag = (char *)malloc(maxsz);
    memset(pag, 1, maxsz);
    memset(pin, 1, maxsz);
    for (size_t sz = 4096; sz <= maxsz; sz *= 4) {
        // (small copies take 5-40 us: 200 of them were a window of a few ms, which one stall of a millisecond,
        // natively or through nvproxy, could halve; 2000 average such stalls in rather than hit or miss them)
        int reps = sz <= (256 << 10) ? 2000 : sz <= (1 << 20) ? 200 : (sz <= (64 << 20) ? 20 : 4);
        if (quick) reps = 3;
        struct { const char *name; void *dst; const void *src; } cases[] = {
            {"h2d_pinned", dev, pin}, {"d2h_pinned", pin, dev}, {"h2d_pageable", dev, pag}, {"d2h_pageable", pag, dev}};
        for (auto &c : cases) {
            CHECK(cudaMemcpy(c.dst, c.src, sz, cudaMemcpyDefault));
            t = now();
            for (int i = 0; i < reps; i++) CHECK(cudaMemcpy(c.dst, c.src, sz, cudaMemcpyDefault));
            emit(c.name, (long long)sz, (double)sz * reps / (now() - t) / 1e9, "GB/s");
        }
    }

    // async copies on 4 streams, each a quarter, both directions at once
    {
        cudaStream_t st[4];
        for (auto &x : st) CHECK(cudaStreamCreate(&x));
        size_t q = maxsz / 8;
        int reps = quick ? 2 : 5;
        CHECK(cudaDeviceSynchronize());
        t = now();
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < 4; i++) {
                CHECK(cudaMemcpyAsync(dev + i * q, pin + i * q, q, cudaMemcpyHostToDevice, st[i]));
                CHECK(cudaMemcpyAsync(pin + (4 + i) * q, dev + (4 + i) * q, q, cudaMemcpyDeviceToHost, st[i]));
            }
        CHECK(cudaDeviceSynchronize());
        emit("async_4streams", (long long)(8 * q), (double)8 * q * reps / (now() - t) / 1e9, "GB/s");
        for (auto &x : st) CHECK(cudaStreamDestroy(x));
    }

    // launch storm: T threads, each its own stream, 20000 launches each (as benchmarks/probes/launch_storm.cu; with
    // fewer, the threads' start weighs more)
    for (int T : {1, 4, 8, 16}) {
        int per = quick ? 10 : 20000;
        std::vector<std::thread> th;
        t = now();
        for (int i = 0; i < T; i++)
            th.emplace_back([per] {
                cudaStream_t ls;
                CHECK(cudaStreamCreateWithFlags(&ls, cudaStreamNonBlocking));
                for (int k = 0; k < per; k++) empty<<<1, 1, 0, ls>>>();
                CHECK(cudaStreamSynchronize(ls));
                CHECK(cudaStreamDestroy(ls));
            });
        for (auto &x : th) x.join();
        emit("launch_storm", T, (now() - t) / (per * T) * 1e6, "us/launch");
    }
    // managed memory: the CPU writes a buffer, a kernel reads it twice (bandwidth of the whole cycle);
    // natively the pages move to the device, under nvproxy the kernel reads host memory over the bus
    for (size_t sz : {1ul << 20, 64ul << 20}) {
        if (quick && sz > (1 << 20)) break;
        unsigned *m;
        unsigned long long *acc;
        CHECK(cudaMallocManaged(&m, sz));
        CHECK(cudaMalloc(&acc, sizeof *acc));
        int reps = quick ? 2 : 10;
        cudaMemLocation dev0 = {cudaMemLocationTypeDevice, 0};
        t = now();
        for (int r = 0; r < reps; r++) {
            memset(m, r, sz);
            CHECK(cudaMemPrefetchAsync(m, sz, dev0, 0, s));
            sum<<<264, 256, 0, s>>>(m, sz / 4, acc);
            sum<<<264, 256, 0, s>>>(m, sz / 4, acc);
            CHECK(cudaStreamSynchronize(s));
        }
        emit("managed_cpu_write_gpu_read2", (long long)sz, (double)sz * reps / (now() - t) / 1e9, "GB/s");
        CHECK(cudaFree(m));
        CHECK(cudaFree(acc));
    }
    // managed memory once it is on the device: the CPU writes it, then it reaches the device by a prefetch or by
    // a first kernel (both untimed), and kernels read it again and again (timed): device memory speed natively
    for (int prefetch : {1, 0}) {
        size_t sz = quick ? 1ul << 20 : 256ul << 20;
        unsigned *m;
        unsigned long long *acc;
        CHECK(cudaMallocManaged(&m, sz));
        CHECK(cudaMalloc(&acc, sizeof *acc));
        memset(m, 1, sz);
        if (prefetch) CHECK(cudaMemPrefetchAsync(m, sz, cudaMemLocation{cudaMemLocationTypeDevice, 0}, 0, s));
        sum<<<264, 256, 0, s>>>(m, sz / 4, acc);
        CHECK(cudaStreamSynchronize(s));
        int reps = quick ? 2 : 20;
        t = now();
        for (int r = 0; r < reps; r++) sum<<<264, 256, 0, s>>>(m, sz / 4, acc);
        CHECK(cudaStreamSynchronize(s));
        emit(prefetch ? "managed_kernel_prefetched" : "managed_kernel_first_touch", (long long)sz,
             (double)sz * reps / (now() - t) / 1e9, "GB/s");
        CHECK(cudaFree(m));
        CHECK(cudaFree(acc));
    }
    CHECK(cudaFreeHost(pin));
    CHECK(cudaFree(dev));
    free(pag);
    pinned_rows(quick);
    return 0;
}
