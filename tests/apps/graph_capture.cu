// Graph features around stream capture and graph memory:
//  A  a global-mode capture that allocates (cudaMallocAsync), copies from and to pageable memory, computes and
//     frees (cudaFreeAsync);
//  B  memory-allocation and memory-free nodes built by hand, with event record/wait nodes and a child graph;
//  C  NVIDIA's pattern for a conditional node inside a capture: cudaStreamGetCaptureInfo's graph and
//     dependencies, a node added to it, cudaStreamUpdateCaptureDependencies, and the while body filled by
//     cudaStreamBeginCaptureToGraph;
//  D  copy nodes with pageable host memory (staged through pinned memory by host nodes);
//  E  an allocation node whose memory the program frees after each launch (the next launch makes it again).
// argv[1] = extra launches of all three graphs (each followed by a pause: checkpoint tests).
#include "check.h"
#include <unistd.h>

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}
__global__ void accumulate(int *dst, const int *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}
__global__ void step_down(int *counter, int *steps, cudaGraphConditionalHandle h) {
    if (*counter > 0) {
        *counter -= 1;
        *steps += 1;
    }
    cudaGraphSetConditional(h, *counter > 0);
}

static const int N = 1000;

static cudaMemAllocNodeParams alloc_params() {  // N ints on device 0
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = N * sizeof(int);
    return ap;
}

// prints how many nodes the graph lists, instantiates it and lets it go
static cudaGraphExec_t finish(cudaGraph_t g, const char *what, bool keep = false) {
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &count));
    printf("%s: %zu nodes\n", what, count);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    if (!keep) CHECK(cudaGraphDestroy(g));
    return x;
}

static long long sum(const int *d, int n) {
    int h[N];
    CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    long long s = 0;
    for (int i = 0; i < n; i++) s += h[i];
    return s;
}

// A: out += (scratch = bias, from pageable memory when the graph runs); shadow = out (pageable, too);
// scratch allocated and freed inside the graph
static int bias[N], shadow[N];
static cudaGraphExec_t captured_alloc(cudaStream_t s, int *out) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int *scratch;
    CHECK(cudaMallocAsync((void **)&scratch, N * sizeof(int), s));
    CHECK(cudaMemcpyAsync(scratch, bias, sizeof bias, cudaMemcpyHostToDevice, s));
    accumulate<<<(N + 255) / 256, 256, 0, s>>>(out, scratch, N);
    CHECK(cudaMemcpyAsync(shadow, out, sizeof shadow, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(scratch, s));
    CHECK(cudaStreamEndCapture(s, &g));
    // as natively: the allocation and the free are nodes of the graph (first and last), the allocation's
    // parameters give its address
    cudaGraphNode_t nodes[16];
    size_t count = 16;
    CHECK(cudaGraphGetNodes(g, nodes, &count));
    int allocs = 0, frees = 0, same = 0;
    for (size_t i = 0; i < count; i++) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(nodes[i], &t));
        if (t == cudaGraphNodeTypeMemAlloc) {
            cudaMemAllocNodeParams p;
            CHECK(cudaGraphMemAllocNodeGetParams(nodes[i], &p));
            allocs++;
            same += p.dptr == scratch && p.bytesize == N * sizeof(int);
        }
        frees += t == cudaGraphNodeTypeMemFree;
    }
    printf("captured graph: %zu nodes, %d allocation (its address %d), %d free\n", count, allocs, same, frees);
    cudaGraphExec_t x, second;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    printf("second executable graph while the first lives: %s\n",
           cudaGetErrorName(cudaGraphInstantiate(&second, g, 0)));
    cudaGetLastError();
    CHECK(cudaGraphDestroy(g));
    return x;
}

// B: alloc node -> fill -> child graph (out += tmp) -> record ev -> wait ev -> free node
static cudaGraphExec_t built_alloc(int *out, cudaEvent_t ev) {
    cudaGraph_t g, child;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = alloc_params();
    cudaGraphNode_t alloc, k, c, rec, wait, freed;
    CHECK(cudaGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap));
    int *tmp = (int *)ap.dptr;
    cudaMemAllocNodeParams back;
    CHECK(cudaGraphMemAllocNodeGetParams(alloc, &back));
    printf("alloc node: same address %d, %zu bytes\n", back.dptr == ap.dptr, back.bytesize);
    int n = N, v = 1000;
    void *fargs[] = {&tmp, &n, &v};
    cudaKernelNodeParams kp = {(void *)fill, dim3((N + 255) / 256), dim3(256), 0, fargs, NULL};
    CHECK(cudaGraphAddKernelNode(&k, g, &alloc, 1, &kp));

    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t ck;
    void *aargs[] = {&out, &tmp, &n};
    cudaKernelNodeParams ap2 = {(void *)accumulate, dim3((N + 255) / 256), dim3(256), 0, aargs, NULL};
    CHECK(cudaGraphAddKernelNode(&ck, child, NULL, 0, &ap2));
    CHECK(cudaGraphAddChildGraphNode(&c, g, &k, 1, child));
    CHECK(cudaGraphDestroy(child));  // (the node holds a copy)

    CHECK(cudaGraphAddEventRecordNode(&rec, g, &c, 1, ev));
    CHECK(cudaGraphAddEventWaitNode(&wait, g, &rec, 1, ev));
    CHECK(cudaGraphAddMemFreeNode(&freed, g, &wait, 1, tmp));
    void *fp = NULL;
    CHECK(cudaGraphMemFreeNodeGetParams(freed, &fp));
    printf("free node frees it: %d\n", fp == tmp);
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(c, &t));
    printf("child node type %d\n", (int)t);
    cudaGraph_t clone;
    printf("clone with memory nodes: %s\n", cudaGetErrorName(cudaGraphClone(&clone, g)));
    return finish(g, "built graph with memory nodes");
}

// C: A -> while [step_down] -> fill, the conditional node added to the capture's own graph; the graph is
// kept (as NVIDIA's graphConditionalNodes keeps it) until the end, so a restore makes it and its executable
// graph, each with a body graph of its own
static cudaGraphExec_t captured_while(cudaStream_t s, int *counter, int *steps, int *marks, cudaGraph_t *kept) {
    cudaGraph_t g;
    cudaStreamCaptureStatus st;
    const cudaGraphNode_t *deps;
    size_t ndeps;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // (as PyTorch sets it around its captures)
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaStreamCaptureMode was = mode;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("thread capture mode: was %d, then %d\n", (int)was, (int)mode);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamGetCaptureInfo(s, &st, NULL, &g, &deps, NULL, &ndeps));
    printf("capturing %d, open dependencies %zu\n", st == cudaStreamCaptureStatusActive, ndeps);
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    step_down<<<1, 1, 0, s>>>(counter, steps, h);
    CHECK(cudaStreamGetCaptureInfo(s, &st, NULL, &g, &deps, NULL, &ndeps));
    printf("after a kernel: open dependencies %zu\n", ndeps);
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = cudaGraphCondTypeWhile;
    cp.conditional.size = 1;
    cudaGraphNode_t cond;
    CHECK(cudaGraphAddNode(&cond, g, deps, NULL, ndeps, &cp));
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    CHECK(cudaStreamUpdateCaptureDependencies(s, &cond, NULL, 1, cudaStreamSetCaptureDependencies));
    fill<<<1, 32, 0, s>>>(marks, 32, 5);
    cudaGraph_t ended;
    CHECK(cudaStreamEndCapture(s, &ended));
    printf("EndCapture gives the same graph: %d\n", ended == g);

    cudaStream_t bs;
    CHECK(cudaStreamCreate(&bs));
    CHECK(cudaStreamBeginCaptureToGraph(bs, body, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    step_down<<<1, 1, 0, bs>>>(counter, steps, h);
    CHECK(cudaStreamEndCapture(bs, NULL));
    CHECK(cudaStreamDestroy(bs));
    *kept = g;
    return finish(g, "captured while graph", true);
}

// D: pageable in -> double it -> pageable out
static cudaGraphExec_t pageable_copies(int *in, int *dev, int *out) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t up, k, down;
    CHECK(cudaGraphAddMemcpyNode1D(&up, g, NULL, 0, dev, in, N * sizeof(int), cudaMemcpyHostToDevice));
    int n = N;
    void *args[] = {&dev, &dev, &n};
    cudaKernelNodeParams kp = {(void *)accumulate, dim3((N + 255) / 256), dim3(256), 0, args, NULL};
    CHECK(cudaGraphAddKernelNode(&k, g, &up, 1, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&down, g, &k, 1, out, dev, N * sizeof(int), cudaMemcpyDeviceToHost));
    return finish(g, "pageable copies graph");
}

// E: alloc node -> fill; the memory outlives the launch, the program frees it
static cudaGraphExec_t alloc_kept(int **ptr) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = alloc_params();
    cudaGraphNode_t alloc, k;
    CHECK(cudaGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap));
    *ptr = (int *)ap.dptr;
    int n = N, v = 3;
    void *args[] = {ptr, &n, &v};
    cudaKernelNodeParams kp = {(void *)fill, dim3((N + 255) / 256), dim3(256), 0, args, NULL};
    CHECK(cudaGraphAddKernelNode(&k, g, &alloc, 1, &kp));
    return finish(g, "graph with a kept allocation");
}

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    int *d;  // out A [N], out B [N], counter, steps, marks [32]
    CHECK(cudaMalloc(&d, (2 * N + 2 + 32) * sizeof(int)));
    CHECK(cudaMemset(d, 0, (2 * N + 2 + 32) * sizeof(int)));
    int *outa = d, *outb = d + N, *counter = d + 2 * N, *steps = counter + 1, *marks = counter + 2;

    cudaGraph_t gc;
    cudaGraphExec_t xa = captured_alloc(s, outa), xb = built_alloc(outb, ev), xc = captured_while(s, counter, steps, marks, &gc);
    static int in[N], out[N];
    int *dd;
    CHECK(cudaMalloc(&dd, N * sizeof(int)));
    cudaGraphExec_t xd = pageable_copies(in, dd, out);
    int *kept;
    cudaGraphExec_t xe = alloc_kept(&kept);
    for (int r = 0; r < 3 + long_run; r++) {
        int c = r + 1;
        for (int i = 0; i < N; i++) bias[i] = r + 2 * i;
        CHECK(cudaMemcpyAsync(counter, &c, sizeof c, cudaMemcpyHostToDevice, s));
        CHECK(cudaGraphLaunch(xa, s));
        CHECK(cudaGraphLaunch(xb, s));
        CHECK(cudaGraphLaunch(xc, s));
        for (int i = 0; i < N; i++) in[i] = r * i;
        CHECK(cudaGraphLaunch(xd, s));
        CHECK(cudaGraphLaunch(xe, s));
        CHECK(cudaStreamSynchronize(s));
        long long e = sum(kept, N);
        CHECK(cudaFreeAsync(kept, s));
        int h[2];
        CHECK(cudaMemcpy(h, counter, sizeof h, cudaMemcpyDeviceToHost));
        long long d = 0;
        for (int i = 0; i < N; i++) d += out[i];
        long long sh = 0;
        for (int i = 0; i < N; i++) sh += shadow[i];
        printf("run %d: A %lld (host copy %lld), B %lld, counter %d, steps %d, marks %lld, D %lld, E %lld\n", r,
               sum(outa, N), sh, sum(outb, N), h[0], h[1], sum(marks, 32), d, e);
        fflush(stdout);
        if (long_run) usleep(150000);
    }
    size_t high = 0;  // (natively reserved when a graph first runs)
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &high));
    printf("graph memory reserved at most: %s\n", high >= N * sizeof(int) ? "enough" : "too little");
    CHECK(cudaGraphExecDestroy(xa));
    CHECK(cudaGraphExecDestroy(xb));
    CHECK(cudaGraphExecDestroy(xc));
    CHECK(cudaGraphDestroy(gc));
    CHECK(cudaGraphExecDestroy(xd));
    CHECK(cudaGraphExecDestroy(xe));
    CHECK(cudaFree(dd));
    size_t used = 1;
    CHECK(cudaDeviceGraphMemTrim(0));
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
    printf("graph memory in use after the graphs went: %zu\n", used);
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    printf("Test PASSED\n");
    return 0;
}
