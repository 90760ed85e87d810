// Checkpoints inside stream captures (tests/test_capture_checkpoint.py).
//  argv[1] = global: one global-mode capture on a blocking stream, forking to a second stream and joining back,
//            after slow work submitted to the stream before the capture began (a checkpoint must wait for it);
//            threads: a thread-local capture on the main thread and, at the same time, a relaxed one that a second
//            thread begins, each on its own stream.
//  argv[2] = where to stop early (to count calls, test_hooks' NVPROXY_CALLS_OUT): begin: once every capture has
//            begun; end: just before the first capture ends; run: not at all.
//  argv[3] = ms to pause inside the captures, once every capture has begun, after printing "capturing" (0: none).
// The graphs are then launched and the results printed: any lost or repeated captured work changes them.
#include "check.h"
#include <cstring>
#include <pthread.h>
#include <unistd.h>

static const int N = 4096, STEPS = 6;

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}
// adds v after spinning (work still running when the capture begins)
__global__ void slow_add(int *p, int n, int v, long long spins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    long long start = clock64();
    while (clock64() - start < spins) {
    }
    if (i < n) p[i] += v;
}
__global__ void mix(int *dst, const int *src, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (dst[i] * 3 + src[i] + k) % 1000003;
}

static const char *stop = "run";
static int pause_ms = 0;

static void launch_mix(int *dst, const int *src, int k, cudaStream_t s) {
    mix<<<(N + 255) / 256, 256, 0, s>>>(dst, src, N, k);
    CHECK(cudaGetLastError());
}

// every capture is on: the point the tests checkpoint at (or stop, counting calls)
static void all_begun() {
    if (!strcmp(stop, "begin")) exit(0);
    if (pause_ms) {
        printf("capturing\n");
        fflush(stdout);
        usleep(pause_ms * 1000);
    }
}

static void before_end() {
    if (!strcmp(stop, "end")) exit(0);
}

static void report(const char *what, const int *d) {
    static int h[N];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    printf("%s: %d %d %d checksum %llx\n", what, h[0], h[1], h[N - 1], checksum(h, sizeof h));
}

static cudaGraphExec_t instantiate(cudaGraph_t g) {
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    printf("graph: %zu nodes\n", nodes);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaGraphDestroy(g));
    return x;
}

static void run_global() {
    int *a, *b;
    cudaStream_t s1, s2;
    cudaEvent_t forked, joined;
    CHECK(cudaMalloc(&a, N * sizeof(int)));
    CHECK(cudaMalloc(&b, N * sizeof(int)));
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
    fill<<<(N + 255) / 256, 256>>>(a, N, 1);
    fill<<<(N + 255) / 256, 256>>>(b, N, 7);
    CHECK(cudaDeviceSynchronize());
    slow_add<<<(N + 255) / 256, 256, 0, s1>>>(a, N, 5, 200000000LL);  // (about 0.1 s on a GPU)
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    launch_mix(a, b, 1, s1);
    all_begun();
    for (int k = 2; k < STEPS; k++) launch_mix(a, b, k, s1);
    CHECK(cudaEventRecord(forked, s1));
    CHECK(cudaStreamWaitEvent(s2, forked, 0));
    launch_mix(b, a, 11, s2);
    launch_mix(a, a, 12, s1);
    CHECK(cudaEventRecord(joined, s2));
    CHECK(cudaStreamWaitEvent(s1, joined, 0));
    launch_mix(a, b, 13, s1);
    before_end();
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s1, &g));
    cudaGraphExec_t x = instantiate(g);
    report("before launches", a);
    for (int i = 0; i < 3; i++) {
        CHECK(cudaGraphLaunch(x, s1));
        CHECK(cudaStreamSynchronize(s1));
        report("a", a);
        report("b", b);
    }
    CHECK(cudaGraphExecDestroy(x));
}

// the second thread's relaxed capture, begun while the main thread's thread-local one is on
struct Side {
    int *c, *d;
    cudaStream_t s;
    cudaGraph_t g;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stage;  // 1: its capture has begun; 2: the main thread lets it end
};

static void set_stage(Side *side, int stage) {
    pthread_mutex_lock(&side->lock);
    side->stage = stage;
    pthread_cond_broadcast(&side->cond);
    pthread_mutex_unlock(&side->lock);
}

static void wait_stage(Side *side, int stage) {
    pthread_mutex_lock(&side->lock);
    while (side->stage < stage) pthread_cond_wait(&side->cond, &side->lock);
    pthread_mutex_unlock(&side->lock);
}

static void *side_thread(void *arg) {
    Side *side = (Side *)arg;
    CHECK(cudaStreamBeginCapture(side->s, cudaStreamCaptureModeRelaxed));
    launch_mix(side->c, side->d, 21, side->s);
    set_stage(side, 1);
    wait_stage(side, 2);
    launch_mix(side->d, side->c, 22, side->s);
    CHECK(cudaStreamEndCapture(side->s, &side->g));
    return NULL;
}

static void run_threads() {
    int *a, *b;
    cudaStream_t s1;
    Side side = {};
    CHECK(cudaMalloc(&a, N * sizeof(int)));
    CHECK(cudaMalloc(&b, N * sizeof(int)));
    CHECK(cudaMalloc(&side.c, N * sizeof(int)));
    CHECK(cudaMalloc(&side.d, N * sizeof(int)));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&side.s, cudaStreamNonBlocking));
    fill<<<(N + 255) / 256, 256>>>(a, N, 1);
    fill<<<(N + 255) / 256, 256>>>(b, N, 7);
    fill<<<(N + 255) / 256, 256>>>(side.c, N, 3);
    fill<<<(N + 255) / 256, 256>>>(side.d, N, 9);
    CHECK(cudaDeviceSynchronize());
    pthread_mutex_init(&side.lock, NULL);
    pthread_cond_init(&side.cond, NULL);
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    launch_mix(a, b, 1, s1);
    pthread_t t;
    pthread_create(&t, NULL, side_thread, &side);
    wait_stage(&side, 1);
    all_begun();
    for (int k = 2; k < STEPS; k++) launch_mix(a, b, k, s1);
    before_end();
    set_stage(&side, 2);
    pthread_join(t, NULL);
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s1, &g));
    cudaGraphExec_t x = instantiate(g), y = instantiate(side.g);
    for (int i = 0; i < 2; i++) {
        CHECK(cudaGraphLaunch(x, s1));
        CHECK(cudaGraphLaunch(y, side.s));
        CHECK(cudaDeviceSynchronize());
        report("a", a);
        report("c", side.c);
        report("d", side.d);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "global";
    stop = argc > 2 ? argv[2] : "run";
    pause_ms = argc > 3 ? atoi(argv[3]) : 0;
    if (!strcmp(mode, "global"))
        run_global();
    else
        run_threads();
    printf("Test PASSED\n");
    return 0;
}
