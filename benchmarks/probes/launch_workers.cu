// Can launches handed from one thread to worker threads reach the native rate of many launching threads?  The
// proxy's dispatcher takes launches in call order and hands each stream's to one worker (fastpath.c, offload).
// Natively: one thread hands N launches round robin to W workers (single-producer queues of 256, one stream a
// worker, each worker spinning for work), beside S other threads that only spin, as a program's threads waiting
// for their mailbox slots do; W = 0: the one thread launches them itself.  Per launch.
// On the GPU machine: nvcc -cudart shared -o launch_workers launch_workers.cu -lcuda &&
//   for w in 0 1 2 4 8; do for s in 0 4 12; do ./launch_workers $w $s 100000; done; done
#include <cuda.h>
#include "probe_rt.h"
#include <atomic>
#include <thread>
#include <vector>

__global__ void empty() {}

struct alignas(64) Queue {
    std::atomic<unsigned long> head{0};
    alignas(64) std::atomic<unsigned long> tail{0};
};

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: launch_workers WORKERS SPINNERS LAUNCHES\n");
        return 2;
    }
    int workers = atoi(argv[1]), spinners = atoi(argv[2]), n = atoi(argv[3]);
    CK(cudaFree(0));
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    cudaFunction_t fn;
    CK(cudaGetFuncBySymbol(&fn, (const void *)empty));
    CUfunction f = (CUfunction)fn;
    int lanes = workers > 0 ? workers : 1;
    std::vector<Queue> queues(lanes);
    std::vector<CUstream> streams(lanes);
    for (auto &s : streams)
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    std::atomic<bool> stop{false};
    std::vector<std::thread> others;
    for (int i = 0; i < spinners; i++)
        others.emplace_back([&] {
            while (!stop.load(std::memory_order_relaxed)) {
            }
        });
    for (int i = 0; i < workers; i++)
        others.emplace_back([&, i] {
            cuCtxSetCurrent(ctx);
            for (unsigned long t = 0;; t++) {
                while (queues[i].head.load(std::memory_order_acquire) == t)
                    if (stop.load(std::memory_order_relaxed))
                        return;
                cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, streams[i], NULL, NULL);
                queues[i].tail.store(t + 1, std::memory_order_release);
            }
        });
    double t0 = now_us();
    for (int k = 0; k < n; k++) {
        if (!workers) {
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, streams[0], NULL, NULL);
            continue;
        }
        Queue &q = queues[k % workers];
        unsigned long h = q.head.load(std::memory_order_relaxed);
        while (h - q.tail.load(std::memory_order_acquire) >= 256) {
        }
        q.head.store(h + 1, std::memory_order_release);
    }
    for (auto &q : queues)
        while (q.tail.load() != q.head.load()) {
        }
    double t = now_us() - t0;
    stop = true;
    for (auto &x : others)
        x.join();
    CK(cudaDeviceSynchronize());
    printf("workers=%d spinning=%d %.2f us/launch\n", workers, spinners, t / n);
    return 0;
}
