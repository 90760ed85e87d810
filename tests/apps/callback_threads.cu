// The shape of NVIDIA's simpleCallback: worker threads each queue a copy, a kernel,
// a copy back and a stream callback; each callback starts a thread that checks the
// results and frees the workload's memory and stream; main waits for all of them.
// Under DMTCP a callback's pthread_create takes DMTCP's lock: a checkpoint must not
// wait for a call that waits for that callback (it deadlocked).
#include "check.h"
#include <pthread.h>

__global__ void inc(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

static const int W = 8, N = 1 << 16;
struct Work { int id; cudaStream_t s; int *d, *h; bool ok; };
static Work work[W];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int finished;

static void *postprocess(void *arg) {
    Work *w = (Work *)arg;
    CHECK(cudaSetDevice(0));
    w->ok = true;
    for (int i = 0; i < N; i++) w->ok &= w->h[i] == w->id + i + 1;
    CHECK(cudaFree(w->d));
    CHECK(cudaFreeHost(w->h));
    CHECK(cudaStreamDestroy(w->s));
    pthread_mutex_lock(&mu);
    finished++;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    return nullptr;
}

static void CUDART_CB done(cudaStream_t, cudaError_t status, void *arg) {
    CHECK(status);
    pthread_t t;
    pthread_create(&t, nullptr, postprocess, arg);
    pthread_detach(t);
}

static void *launch(void *arg) {
    Work *w = (Work *)arg;
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreate(&w->s));
    CHECK(cudaMalloc(&w->d, N * sizeof(int)));
    CHECK(cudaHostAlloc(&w->h, N * sizeof(int), cudaHostAllocPortable));
    for (int i = 0; i < N; i++) w->h[i] = w->id + i;
    CHECK(cudaMemcpyAsync(w->d, w->h, N * sizeof(int), cudaMemcpyHostToDevice, w->s));
    inc<<<(N + 255) / 256, 256, 0, w->s>>>(w->d, N);
    CHECK(cudaMemcpyAsync(w->h, w->d, N * sizeof(int), cudaMemcpyDeviceToHost, w->s));
    CHECK(cudaStreamAddCallback(w->s, done, w, 0));
    return nullptr;
}

int main() {
    pthread_t t[W];
    for (int i = 0; i < W; i++) {
        work[i].id = i;
        pthread_create(&t[i], nullptr, launch, &work[i]);
    }
    for (int i = 0; i < W; i++) pthread_join(t[i], nullptr);
    pthread_mutex_lock(&mu);
    while (finished < W) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    bool ok = true;
    for (int i = 0; i < W; i++) ok &= work[i].ok;
    printf("%d workloads finished: %s\n", W, ok ? "all correct" : "WRONG");
    printf(ok ? "Test PASSED\n" : "Test FAILED\n");
    return ok ? 0 : 1;
}
