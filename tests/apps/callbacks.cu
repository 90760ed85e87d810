// Host callbacks run in the application, in stream order: each sees the data
// the copy before it produced, and the work after it waits for it.
#include "check.h"
#include <atomic>

__global__ void inc(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

struct Ctx { int *host; int step; int seen[8]; int count; };

static void CUDART_CB on_stream(cudaStream_t s, cudaError_t status, void *arg) {
    Ctx *c = (Ctx *)arg;
    c->seen[c->count++] = c->host[0];
    (void)s;
    if (status != cudaSuccess) printf("callback status %s\n", cudaGetErrorName(status));
}

static void CUDART_CB host_fn(void *arg) {
    Ctx *c = (Ctx *)arg;
    c->seen[c->count++] = c->host[0] * 100;
    c->host[1] = 4242;  // the next copy to the device must see this
}

int main() {
    const int n = 4096;
    int *d, *h;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMallocHost(&h, n * sizeof(int)));
    CHECK(cudaMemset(d, 0, n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    Ctx c = {h, 0, {0}, 0};
    for (int step = 0; step < 3; step++) {
        inc<<<n / 256, 256, 0, s>>>(d, n);
        CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamAddCallback(s, on_stream, &c, 0));
    }
    CHECK(cudaLaunchHostFunc(s, host_fn, &c));
    CHECK(cudaMemcpyAsync(d, h, 2 * sizeof(int), cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(h + 2, d + 1, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("callbacks ran: %d, saw:", c.count);
    for (int i = 0; i < c.count; i++) printf(" %d", c.seen[i]);
    printf("\nhost function's write reached the device: %d\n", h[2]);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(h));
    printf("Test PASSED\n");
    return 0;
}
