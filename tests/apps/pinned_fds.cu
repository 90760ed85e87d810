// Pinned buffers whose memfd numbers do not rise with their addresses (three freed
// and allocated again), checkpointed at call 16 (the DMTCP test): after the restart
// every buffer is put into a fresh memfd, and those numbers must not be confused with
// the old ones (closing an old number closed another buffer's new memfd, and the
// channel of a thread that took that number was closed by a later cudaFreeHost).
// Threads hold channels while main frees every buffer, then call again.
#include "check.h"
#include <pthread.h>
#include <vector>

static const int N = 1 << 14, B = 8, T = 4;
static pthread_barrier_t bar;
static int *dev[T];
static bool same[T];

static void *worker(void *arg) {
    long t = (long)arg;
    std::vector<int> h(N, (int)t + 7);
    CHECK(cudaMalloc(&dev[t], N * sizeof(int)));
    CHECK(cudaMemcpy(dev[t], h.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    pthread_barrier_wait(&bar);  // main frees the pinned buffers
    pthread_barrier_wait(&bar);
    std::vector<int> back(N);
    CHECK(cudaMemcpy(back.data(), dev[t], N * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(dev[t]));
    same[t] = back == h;
    return nullptr;
}

int main() {
    CHECK(cudaFree(0));  // call 1
    int *p[B + 3];
    for (int i = 0; i < B; i++) CHECK(cudaHostAlloc(&p[i], N * sizeof(int), cudaHostAllocDefault));  // 2-9
    for (int i = 1; i < 7; i += 2) CHECK(cudaFreeHost(p[i]));  // 10-12
    for (int i = 1; i < 7; i += 2) CHECK(cudaHostAlloc(&p[i], N * sizeof(int), cudaHostAllocDefault));  // 13-15
    for (int i = 0; i < B; i++)
        for (int j = 0; j < N; j++) p[i][j] = i * 1000003 + j;
    CHECK(cudaDeviceSynchronize());  // call 16
    int *d;
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    for (int i = 0; i < B; i++) {  // through each buffer (the new proxy maps them again)
        std::vector<int> back(N);
        CHECK(cudaMemcpy(d, p[i], N * sizeof(int), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(back.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
        printf("buffer %d: %016llx\n", i, checksum(back.data(), N * sizeof(int)));
    }
    pthread_barrier_init(&bar, nullptr, T + 1);
    pthread_t th[T];
    for (long t = 0; t < T; t++) pthread_create(&th[t], nullptr, worker, (void *)t);
    pthread_barrier_wait(&bar);
    for (int i = 0; i < B; i++) CHECK(cudaFreeHost(p[i]));
    pthread_barrier_wait(&bar);
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], nullptr);
        printf("thread %d: %s\n", t, same[t] ? "ok" : "WRONG");
    }
    CHECK(cudaFree(d));
    printf("Test PASSED\n");
    return 0;
}
