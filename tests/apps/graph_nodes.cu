// CUDA graphs built node by node: memcpy (1D and 3D/pitched), memset, kernel,
// host and empty nodes with dependencies; instantiate, launch repeatedly, update
// a kernel node of the executable graph, clone the graph, update the executable
// graph from another graph of the same shape (and fail to from one of another);
// what may not be added.
// argv[1] = launches in a long run (each followed by a pause: checkpoint tests
// restore the graphs mid-run).
#include "graph_kernels.h"
#include <cstring>
#include <unistd.h>

static cudaKernelNodeParams scale_params(void **args, int n) {
    cudaKernelNodeParams k = {};
    k.func = (void *)scale;
    k.gridDim = dim3((n + 255) / 256);
    k.blockDim = dim3(256);
    k.kernelParams = args;
    return k;
}

struct Bufs {
    int *a, *b, *pin, *pin2d, *d2d;
    size_t pitch;
    int n, rows, cols;
};

// memcpy in -> scale (factor k) -> add (b, filled with `fill` by a memset node) -> memcpy out -> host node,
// beside a pitched 2D round trip, joined by an empty node; *k1 is the scale node
static cudaGraph_t build(Bufs &B, int fill, int k, cudaGraphNode_t *k1out) {
    int *a = B.a, *b = B.b, *pin = B.pin, *pin2d = B.pin2d, *d2d = B.d2d, n = B.n, rows = B.rows, cols = B.cols;
    size_t pitch = B.pitch;
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t up, zero, k1, k2, down, host, join, up2d, down2d;
    CHECK(cudaGraphAddMemcpyNode1D(&up, g, NULL, 0, a, pin, n * sizeof(int), cudaMemcpyHostToDevice));
    cudaMemsetParams ms = {};
    ms.dst = b; ms.value = fill; ms.elementSize = 4; ms.width = n; ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&zero, g, NULL, 0, &ms));
    int nn = n;
    void *sargs[] = {&a, &nn, &k};
    cudaKernelNodeParams kp = scale_params(sargs, n);
    CHECK(cudaGraphAddKernelNode(&k1, g, &up, 1, &kp));
    cudaKernelNodeParams ap = {};
    void *aargs[] = {&a, &b, &nn};
    ap.func = (void *)add; ap.gridDim = dim3((n + 255) / 256); ap.blockDim = dim3(256); ap.kernelParams = aargs;
    cudaGraphNode_t both[] = {k1, zero};
    CHECK(cudaGraphAddKernelNode(&k2, g, both, 2, &ap));
    CHECK(cudaGraphAddMemcpyNode1D(&down, g, &k2, 1, pin, a, n * sizeof(int), cudaMemcpyDeviceToHost));
    cudaHostNodeParams hp = {count_call, &host_calls};
    CHECK(cudaGraphAddHostNode(&host, g, &down, 1, &hp));
    // a pitched 2D round trip through device memory (3D copy parameters, depth 1)
    cudaMemcpy3DParms p3 = {};
    p3.srcPtr = make_cudaPitchedPtr(pin2d, cols * sizeof(int), cols, rows);
    p3.dstPtr = make_cudaPitchedPtr(d2d, pitch, cols, rows);
    p3.extent = make_cudaExtent(cols * sizeof(int), rows, 1);
    p3.kind = cudaMemcpyHostToDevice;
    CHECK(cudaGraphAddMemcpyNode(&up2d, g, NULL, 0, &p3));
    cudaMemcpy3DParms q3 = {};
    q3.srcPtr = make_cudaPitchedPtr(d2d, pitch, cols, rows);
    q3.srcPos = make_cudaPos(4 * sizeof(int), 1, 0);  // a window: 1 row and 4 columns in
    q3.dstPtr = make_cudaPitchedPtr(pin2d, cols * sizeof(int), cols, rows);
    q3.extent = make_cudaExtent(8 * sizeof(int), 4, 1);
    q3.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaGraphAddMemcpyNode(&down2d, g, &up2d, 1, &q3));
    cudaGraphNode_t ends[] = {host, down2d};
    CHECK(cudaGraphAddEmptyNode(&join, g, ends, 2));
    *k1out = k1;
    return g;
}

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0;
    const int n = 1 << 14, rows = 16, cols = 64;  // cols ints per row of a pitched 2D buffer
    int *a, *b, *pin, *pin2d, *d2d;
    size_t pitch;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMallocPitch((void **)&d2d, &pitch, cols * sizeof(int), rows));
    CHECK(cudaMallocHost(&pin, n * sizeof(int)));
    CHECK(cudaMallocHost(&pin2d, rows * cols * sizeof(int)));
    for (int i = 0; i < n; i++) pin[i] = i % 1000;
    for (int i = 0; i < rows * cols; i++) pin2d[i] = 7 * i;

    Bufs B = {a, b, pin, pin2d, d2d, pitch, n, rows, cols};
    cudaGraphNode_t k1, up;
    cudaGraph_t g = build(B, 3, 3, &k1);
    CHECK(cudaGraphAddEmptyNode(&up, g, NULL, 0));  // (a node added after the others)
    int nn = n, k = 3;
    void *sargs[] = {&a, &nn, &k};
    cudaKernelNodeParams kp = scale_params(sargs, n);

    // what may not be added: a dependency from another graph
    cudaGraph_t other;
    CHECK(cudaGraphCreate(&other, 0));
    cudaGraphNode_t stray;
    printf("dependency from another graph: %s\n", cudaGetErrorName(cudaGraphAddEmptyNode(&stray, other, &up, 1)));
    printf("kernel node without a function: %s\n", cudaGetErrorName([&] {
               cudaKernelNodeParams bad = kp; bad.func = NULL;
               return cudaGraphAddKernelNode(&stray, other, NULL, 0, &bad); }()));
    cudaGetLastError();
    CHECK(cudaGraphDestroy(other));

    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 3; i++) {
        CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        printf("launch %d: %016llx 2d %016llx host calls %d\n", i, fold(pin, n), fold(pin2d, rows * cols), host_calls);
        for (int j = 0; j < n; j++) pin[j] = (pin[j] + j) % 1000;  // the next launch uploads new inputs
    }
    // the executable graph's kernel node gets a new factor; the graph itself keeps 3
    int k5 = 5;
    void *s5[] = {&a, &nn, &k5};
    cudaKernelNodeParams kp5 = scale_params(s5, n);
    CHECK(cudaGraphExecKernelNodeSetParams(x, k1, &kp5));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    printf("updated: %016llx host calls %d\n", fold(pin, n), host_calls);
    cudaGraph_t c;
    CHECK(cudaGraphClone(&c, g));
    cudaGraphExec_t xc;
    CHECK(cudaGraphInstantiate(&xc, c, 0));
    CHECK(cudaGraphLaunch(xc, s));
    CHECK(cudaStreamSynchronize(s));
    printf("clone: %016llx host calls %d\n", fold(pin, n), host_calls);
    // the executable graph takes the parameters of a graph of the same shape (memset 9, factor 2)
    cudaGraphNode_t k1b;
    cudaGraph_t g2 = build(B, 9, 2, &k1b);
    CHECK(cudaGraphAddEmptyNode(&up, g2, NULL, 0));  // (g has this extra node too)
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(x, g2, &info));
    printf("update: result %d\n", (int)info.result);
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    printf("after update: %016llx host calls %d\n", fold(pin, n), host_calls);
    cudaGraph_t g3;
    CHECK(cudaGraphCreate(&g3, 0));
    CHECK(cudaGraphAddEmptyNode(&up, g3, NULL, 0));
    cudaError_t bad_update = cudaGraphExecUpdate(x, g3, &info);
    printf("update from another shape: %s, result %d\n", cudaGetErrorName(bad_update), (int)info.result);
    cudaGetLastError();
    CHECK(cudaGraphDestroy(g3));

    for (int i = 0; i < long_run; i++) {
        CHECK(cudaGraphLaunch(i % 2 ? xc : x, s));
        CHECK(cudaStreamSynchronize(s));
        printf("run %d: %016llx host calls %d\n", i, fold(pin, n), host_calls);
        fflush(stdout);
        for (int j = 0; j < n; j++) pin[j] = (pin[j] * 7 + j) % 1000;
        usleep(150000);
    }
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphExecDestroy(xc));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(c));
    CHECK(cudaStreamDestroy(s));
    printf("Test PASSED\n");
    return 0;
}
