// A program that leaves work queued when it stops: several threads, each on a stream of its own, issue rounds of
// small pageable copies to the device (answered before they run, some in runs sent without waiting for an
// answer) and kernels that fold them into an accumulator, then a tail of kernel launches, and never synchronise.
// Once the threads have issued everything it prints "issued" and waits for a line on standard input (at its end of
// file it goes on); only then does it synchronise and print each accumulator's checksum.  A checkpoint taken while
// it waits holds every call it made: a run recovered from it prints what an uninterrupted run prints.
// argv: threads (3), rounds (10), tail launches per thread (300), work per kernel (1; more on a GPU, to fill its
// queues), threads that may be held inside a call of their tails (0; "issued" comes once the others are done: the
// test hooks hold one with NVPROXY_TEST_HOLD_REQUEST).
#include "check.h"
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

const int N = 1 << 18;   // accumulator elements per thread
const int M = 3 * 1024;  // elements of the copied source, in three copies of 4 KiB

__global__ void fold(unsigned *acc, int n, const unsigned *src, int m, int work) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned a = acc[i];
        for (int w = 0; w < work; w++) a = a * 31u + src[i % m];
        acc[i] = a;
    }
}

__global__ void bump(unsigned *acc, int n, unsigned k, int work) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned a = acc[i];
        for (int w = 0; w < work; w++) a = a * 3u + k;
        acc[i] = a;
    }
}

static std::mutex lock;
static std::condition_variable changed;
static int copied, finished;

// every thread's rounds come before any thread's tail (the test hooks hold a request of a tail, and a copy waiting
// for its answer behind it would keep the program from saying "issued")
static void count_and_wait(int *count, int all) {
    std::unique_lock<std::mutex> g(lock);
    ++*count;
    changed.notify_all();
    changed.wait(g, [&] { return *count >= all; });
}

static void issue(int t, int threads, int rounds, int tail, int work, unsigned *acc, unsigned *src,
                  cudaStream_t st) {
    std::vector<unsigned> host(M);
    for (int r = 0; r < rounds; r++) {
        for (int j = 0; j < M; j++) host[j] = (unsigned)(t * 7919 + r * 104729 + j);
        for (int c = 0; c < 3; c++)  // (back to back: a run of copies sent without waiting for answers)
            CHECK(cudaMemcpyAsync(src + c * (M / 3), host.data() + c * (M / 3), M / 3 * sizeof(unsigned),
                                  cudaMemcpyHostToDevice, st));
        for (int j = 0; j < M; j++) host[j] = 0xdeadbeefu;  // (staged already: this must not reach the device)
        fold<<<64, 256, 0, st>>>(acc, N, src, M, work);
    }
    count_and_wait(&copied, threads);
    for (int k = 0; k < tail; k++)
        bump<<<64, 256, 0, st>>>(acc, N, (unsigned)(t * 1000 + k), work);
    CHECK(cudaGetLastError());
    std::lock_guard<std::mutex> g(lock);
    finished++;
    changed.notify_all();
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 3, rounds = argc > 2 ? atoi(argv[2]) : 10;
    int tail = argc > 3 ? atoi(argv[3]) : 300, work = argc > 4 ? atoi(argv[4]) : 1;
    int held = argc > 5 ? atoi(argv[5]) : 0;
    std::vector<unsigned *> acc(threads), src(threads);
    std::vector<cudaStream_t> st(threads);
    for (int t = 0; t < threads; t++) {
        CHECK(cudaStreamCreateWithFlags(&st[t], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&acc[t], N * sizeof(unsigned)));
        CHECK(cudaMalloc(&src[t], M * sizeof(unsigned)));
        CHECK(cudaMemset(acc[t], t + 1, N * sizeof(unsigned)));
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; t++)
        workers.emplace_back(issue, t, threads, rounds, tail, work, acc[t], src[t], st[t]);
    {
        std::unique_lock<std::mutex> g(lock);
        changed.wait(g, [&] { return finished >= threads - held; });
    }
    printf("issued\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) {}  // (at its end of file: goes on)
    for (auto &w : workers) w.join();
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned> back(N);
    for (int t = 0; t < threads; t++) {
        CHECK(cudaMemcpy(back.data(), acc[t], N * sizeof(unsigned), cudaMemcpyDeviceToHost));
        printf("thread %d: %016llx\n", t, checksum(back.data(), N * sizeof(unsigned)));
    }
    printf("Test PASSED\n");
    return 0;
}
