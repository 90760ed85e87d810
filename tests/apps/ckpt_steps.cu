// A long-running program for checkpoint/restart tests: every step updates
// device state (small and large allocations, a __device__ variable), on two
// streams, through pinned memory and host callbacks, and prints a checksum.
// A run checkpointed/migrated at any point must print exactly what an
// uninterrupted run prints.  argv[1]: steps (default 40); argv[2]: ms between steps, or -1: after each step,
// wait for a line on standard input (a test's go-ahead; at its end of file, wait no more).
#include "check.h"
#include <cmath>
#include <unistd.h>

__device__ unsigned long long dev_counter;

__global__ void step_small(unsigned *p, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 1664525u + 1013904223u + k;
    if (i == 0) dev_counter += k;
}

__global__ void step_large(unsigned *p, int n, const unsigned *small, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] ^= small[i % m] + (unsigned)i;
}

// first launched after the last pause: a proxy lost during that pause is
// replaced from inside the first launch of a kernel (NVPROXY_RECOVER)
__global__ void finish(unsigned *p) { p[0] += 1; }

struct Acc { unsigned long long sum; int calls; const unsigned *host; int n; };

static void CUDART_CB fold(void *arg) {
    Acc *a = (Acc *)arg;
    for (int i = 0; i < a->n; i++) a->sum = a->sum * 31 + a->host[i];
    a->calls++;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 40, pause_ms = argc > 2 ? atoi(argv[2]) : 50;
    const int m = 1000, n = 3 << 20;  // 4 KB and 12 MB
    unsigned *small, *large, *pin;
    CHECK(cudaMalloc(&small, m * sizeof(unsigned)));
    CHECK(cudaMalloc(&large, n * sizeof(unsigned)));
    CHECK(cudaMallocHost(&pin, 2 * m * sizeof(unsigned)));
    CHECK(cudaMemset(small, 0, m * sizeof(unsigned)));
    CHECK(cudaMemset(large, 0x5a, n * sizeof(unsigned)));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    // timing events recorded before a checkpoint keep their distances after it
    cudaEvent_t t_start, t_first, t_end;
    CHECK(cudaEventCreate(&t_start));
    CHECK(cudaEventCreate(&t_first));
    CHECK(cudaEventCreate(&t_end));
    CHECK(cudaEventRecord(t_start, 0));
    float first_ms = -1;
    Acc acc = {0, 0, pin, 2 * m};
    char line[64];
    bool gated = pause_ms < 0;
    for (int step = 0; step < steps; step++) {
        step_small<<<(m + 255) / 256, 256, 0, s1>>>(small, m, step);
        CHECK(cudaEventRecord(done, s1));
        CHECK(cudaStreamWaitEvent(s2, done, 0));
        step_large<<<(n + 255) / 256, 256, 0, s2>>>(large, n, small, m);
        CHECK(cudaMemcpyAsync(pin, small, m * sizeof(unsigned), cudaMemcpyDeviceToHost, s2));
        CHECK(cudaMemcpyAsync(pin + m, large + n - m, m * sizeof(unsigned), cudaMemcpyDeviceToHost, s2));
        CHECK(cudaLaunchHostFunc(s2, fold, &acc));
        CHECK(cudaStreamSynchronize(s2));
        if (step == 0) {
            CHECK(cudaEventRecord(t_first, s2));
            CHECK(cudaEventSynchronize(t_first));
            CHECK(cudaEventElapsedTime(&first_ms, t_start, t_first));
        }
        unsigned long long c;
        CHECK(cudaMemcpyFromSymbol(&c, dev_counter, sizeof c));
        printf("step %d: fold %016llx counter %llu calls %d\n", step, acc.sum, c, acc.calls);
        fflush(stdout);
        if (pause_ms >= 0)
            usleep(pause_ms * 1000);
        else if (gated && !fgets(line, sizeof line, stdin))
            gated = false;
    }
    finish<<<1, 1>>>(large);
    CHECK(cudaEventRecord(t_end, 0));
    CHECK(cudaEventSynchronize(t_end));
    float again_ms, total_ms, rest_ms;
    CHECK(cudaEventElapsedTime(&again_ms, t_start, t_first));
    CHECK(cudaEventElapsedTime(&total_ms, t_start, t_end));
    CHECK(cudaEventElapsedTime(&rest_ms, t_end, t_first));
    bool timed = first_ms >= 0 && fabsf(again_ms - first_ms) < 0.05f && total_ms >= first_ms &&
                 fabsf(rest_ms + total_ms - first_ms) < 0.05f;
    printf("event times %s\n", timed ? "consistent" : "INCONSISTENT");
    if (!timed) printf("  first %f again %f total %f rest %f\n", first_ms, again_ms, total_ms, rest_ms);
    unsigned *all = (unsigned *)malloc(n * sizeof(unsigned));
    CHECK(cudaMemcpy(all, large, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    printf("final large checksum %016llx\n", checksum(all, n * sizeof(unsigned)));
    printf("Test PASSED\n");
    return 0;
}
