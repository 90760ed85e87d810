// One thread allocates pinned memory while another thread's call is checkpointed
// (the DMTCP test sets NVPROXY_TEST_PAUSE_MS, which holds cudaHostAlloc after the
// proxy has the memory and before the shim lists it, and NVPROXY_CHECKPOINT_AT=3:
// the main thread's cudaDeviceSynchronize). After a restart the memory must still
// be shared with the new proxy: copies through it and cudaFreeHost work.
#include "check.h"
#include <pthread.h>
#include <unistd.h>
#include <vector>

static const int N = 1 << 16;
static int *pinned;

static void *allocate(void *) {
    CHECK(cudaHostAlloc(&pinned, N * sizeof(int), cudaHostAllocDefault));  // call 2
    for (int i = 0; i < N; i++) pinned[i] = 3 * i + 1;
    return nullptr;
}

int main() {
    CHECK(cudaFree(0));  // call 1
    pthread_t t;
    pthread_create(&t, nullptr, allocate, nullptr);
    usleep(200000);  // (the other thread is inside its cudaHostAlloc when paused there)
    CHECK(cudaDeviceSynchronize());  // call 3
    pthread_join(t, nullptr);
    int *d;
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    CHECK(cudaMemcpy(d, pinned, N * sizeof(int), cudaMemcpyHostToDevice));
    std::vector<int> back(N);
    CHECK(cudaMemcpy(back.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int i = 0; i < N; i++) sum += back[i];
    printf("copied through pinned memory: sum %lld\n", sum);
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(pinned));
    printf("Test PASSED\n");
    return 0;
}
