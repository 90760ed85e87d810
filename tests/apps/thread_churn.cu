// Threads come and go, THREADS at a time, each copying pageable memory to the
// device and back (so each needs a staging buffer). Before each round the
// program waits for the file <dir>/go-<round> (the test checkpoints it between
// rounds, or counts the proxy's staging buffers), and it prints each round's sum.
// The main thread copies pageable memory too, so it holds a staging buffer all along.
#include "check.h"
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

__global__ void add(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += k;
}

static const int THREADS = 3, N = 1 << 18;  // 1 MiB a thread: a staged copy
static int *dev[THREADS];
static long long sums[THREADS];

static void *worker(void *arg) {
    int id = (int)(long)arg;
    std::vector<int> h(N);
    for (int i = 0; i < N; i++) h[i] = i % 1000 + id;
    CHECK(cudaMemcpy(dev[id], h.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    add<<<N / 256, 256>>>(dev[id], N, id + 1);
    CHECK(cudaMemcpy(h.data(), dev[id], N * sizeof(int), cudaMemcpyDeviceToHost));
    long long s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    sums[id] = s;
    return nullptr;
}

static void wait_for(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    while (stat(path, &st) != 0) usleep(2000);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    const char *dir = argc > 2 ? argv[2] : nullptr;  // none: no waiting
    std::vector<int> zero(N, 0);
    for (int i = 0; i < THREADS; i++) {
        CHECK(cudaMalloc(&dev[i], N * sizeof(int)));
        CHECK(cudaMemcpy(dev[i], zero.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    }
    for (int r = 0; r < rounds; r++) {
        char name[32];
        snprintf(name, sizeof name, "go-%d", r);
        if (dir) wait_for(dir, name);
        pthread_t t[THREADS];
        for (long i = 0; i < THREADS; i++) pthread_create(&t[i], nullptr, worker, (void *)i);
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], nullptr);
        long long total = 0;
        for (int i = 0; i < THREADS; i++) total += sums[i];
        printf("round %d: %lld\n", r, total);
        fflush(stdout);
    }
    if (dir) wait_for(dir, "go-end");
    int first;
    CHECK(cudaMemcpy(&first, dev[THREADS - 1], sizeof first, cudaMemcpyDeviceToHost));
    printf("last thread's first element: %d\n", first);
    for (int i = 0; i < THREADS; i++) CHECK(cudaFree(dev[i]));
    printf("Test PASSED\n");
    return 0;
}
