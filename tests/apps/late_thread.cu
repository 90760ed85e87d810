// A thread whose first CUDA call comes while another thread keeps calling: natively it returns at once; through
// a proxy, the new thread's connection must be taken while the other thread's calls are being served, not once
// they pause.  The first thread records events on its stream until the second thread's first call has returned
// (or a cap, far beyond what a native call takes), and the program says which came first.
#include "check.h"
#include <atomic>
#include <thread>

static const long CAP = 200000;

int main() {
    cudaStream_t s;
    cudaEvent_t ev;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    std::atomic<bool> calling{false}, answered{false};
    cudaError_t late = cudaErrorUnknown;
    cudaStream_t ls = nullptr;
    std::thread second([&] {
        while (!calling.load()) std::this_thread::yield();
        late = cudaStreamCreateWithFlags(&ls, cudaStreamNonBlocking);  // (its first call: a new channel)
        answered.store(true);
    });
    long n = 0;
    for (; n < CAP && !answered.load(); n++) {
        CHECK(cudaEventRecord(ev, s));
        if (n == 100) calling.store(true);
    }
    second.join();
    CHECK(late);
    CHECK(cudaEventSynchronize(ev));
    CHECK(cudaStreamDestroy(ls));
    printf("the second thread's first call returned while the first thread was still calling: %s\n",
           n < CAP ? "yes" : "no");
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    printf("%s\n", n < CAP ? "PASSED" : "FAILED");
    return 0;
}
