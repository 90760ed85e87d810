// Many threads make CUDA calls without end (small pageable copies, each on a thread's own stream, and
// synchronisations), so that requests are in flight on every channel when the program is killed.  Prints
// "running" once every thread has made a call.  argv[1]: threads (default 32).
#include "check.h"
#include <atomic>
#include <pthread.h>
#include <unistd.h>
#include <vector>

static std::atomic<int> started{0};

static void *worker(void *) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, 4096));
    std::vector<int> h(1024, 1);
    for (unsigned k = 0;; k++) {
        CHECK(cudaMemcpyAsync(d, h.data(), 4096, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemsetAsync(d, (int)k, 64, s));
        CHECK(cudaMemcpyAsync(h.data(), d, 4096, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        if (k == 0) started++;
    }
    return nullptr;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 32;
    CHECK(cudaFree(0));
    std::vector<pthread_t> t(n);
    for (int i = 0; i < n; i++) pthread_create(&t[i], nullptr, worker, nullptr);
    while (started < n) usleep(1000);
    printf("running\n");
    fflush(stdout);
    for (int i = 0; i < n; i++) pthread_join(t[i], nullptr);
    return 0;
}
