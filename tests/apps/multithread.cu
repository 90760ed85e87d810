// Several host threads use the runtime at once, each on its own stream; one
// thread blocks in cudaStreamSynchronize on a kernel that only finishes when
// another thread, still making CUDA calls, releases it through mapped memory.
// If a blocked thread stalled the others, this program would never end.
// (No cudaMalloc/cudaFree while the kernel spins: cudaFree waits for the device.)
// The releasing worker goes on only once the other workers' threads have ended,
// so that under nvproxy their channels close while the kernel spins: the proxy
// once unregistered their staging memory then, cuMemHostUnregister waits for
// running kernels, and in 1 of 4 runs on two GPUs the releasing worker's
// cudaStreamDestroy never returned (the arrangement did not force that hang).
#include "check.h"
#include <pthread.h>
#include <unistd.h>

__global__ void work(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 2 + k;
}

__global__ void wait_flag(volatile int *flag, int *out) {
    while (*flag == 0) { }
    *out = 77;
}

static volatile int *flag;  // mapped pinned memory the kernel spins on
static int *waited;
// 1 + T streams stay within CUDA_DEVICE_MAX_CONNECTIONS (8): more would share hardware
// queues, and a queue behind the spinning kernel would never drain, natively too.
static const int T = 4, N = 1 << 14, ITERS = 50;
static int results[T];
static int *bufs[T];
static int ended;  // workers done (all but the releasing one)
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *blocked(void *) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    wait_flag<<<1, 1, 0, s>>>(flag, waited);
    CHECK(cudaStreamSynchronize(s));  // returns only after a worker sets the flag
    CHECK(cudaStreamDestroy(s));
    return nullptr;
}

static void *worker(void *arg) {
    int id = (int)(long)arg;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d = bufs[id], h[4];
    CHECK(cudaMemsetAsync(d, 0, N * sizeof(int), s));
    for (int i = 0; i < ITERS; i++) work<<<N / 256, 256, 0, s>>>(d, N, id);
    CHECK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    results[id] = h[0];
    if (id != T - 1) {
        CHECK(cudaStreamDestroy(s));
        pthread_mutex_lock(&lock);
        ended++;
        pthread_mutex_unlock(&lock);
        return nullptr;
    }
    for (int done = 0; done < T - 1; usleep(1000)) {
        pthread_mutex_lock(&lock);
        done = ended;
        pthread_mutex_unlock(&lock);
    }
    usleep(300000);  // (their threads' ends have reached the proxy by now)
    CHECK(cudaStreamDestroy(s));
    *flag = 1;  // release the blocked thread's kernel
    return nullptr;
}

int main() {
    int *f;
    CHECK(cudaHostAlloc(&f, sizeof(int), cudaHostAllocMapped));
    *f = 0;
    flag = f;
    CHECK(cudaMalloc(&waited, sizeof(int)));
    for (int i = 0; i < T; i++) CHECK(cudaMalloc(&bufs[i], N * sizeof(int)));
    // load the kernels first: with lazy loading, loading one while another
    // kernel spins can deadlock (CUDA programming guide, lazy loading)
    work<<<1, 1>>>(bufs[0], 0, 0);
    CHECK(cudaDeviceSynchronize());
    pthread_t b, w[T];
    pthread_create(&b, nullptr, blocked, nullptr);
    usleep(100000);
    for (long i = 0; i < T; i++) pthread_create(&w[i], nullptr, worker, (void *)i);
    for (int i = 0; i < T; i++) pthread_join(w[i], nullptr);
    pthread_join(b, nullptr);
    int got;
    CHECK(cudaMemcpy(&got, waited, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < T; i++) printf("thread %d: %d\n", i, results[i]);
    printf("blocked kernel finished: %d\n", got);
    for (int i = 0; i < T; i++) CHECK(cudaFree(bufs[i]));
    CHECK(cudaFreeHost(f));
    printf("Test PASSED\n");
    return 0;
}
