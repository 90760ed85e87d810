// cuDNN calls through nvproxy on the sim backend, against tests/libfakes/fake_cudnn.c: the legacy API (ReLU on
// floats and on doubles, whose alpha and beta are doubles; AddTensor; a workspace size; dropout whose states
// advance with each use; a status string; a function that is not forwarded) and the backend API (descriptors,
// attributes of several types, arrays of descriptors, operations destroyed once their graph is finalized, engine
// configurations a heuristic fills through GetAttribute, a handle answered back, a plan executed on a stream).
// Declares what it uses itself (the CI machine has no cuDNN headers); the backend's numbers are the stand-in's.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "libs_check.h"

extern "C" {
typedef void *cudnnHandle_t;
typedef void *desc_t;
int cudnnCreate(cudnnHandle_t *);
int cudnnDestroy(cudnnHandle_t);
int cudnnSetStream(cudnnHandle_t, cudaStream_t);
int cudnnGetStream(cudnnHandle_t, cudaStream_t *);
size_t cudnnGetVersion(void);
const char *cudnnGetErrorString(int);
int cudnnCreateTensorDescriptor(desc_t *);
int cudnnDestroyTensorDescriptor(desc_t);
int cudnnSetTensor4dDescriptor(desc_t, int, int, int, int, int, int);
int cudnnCreateActivationDescriptor(desc_t *);
int cudnnDestroyActivationDescriptor(desc_t);
int cudnnSetActivationDescriptor(desc_t, int, int, double);
int cudnnActivationForward(cudnnHandle_t, desc_t, const void *, desc_t, const void *, const void *, desc_t, void *);
int cudnnAddTensor(cudnnHandle_t, const void *, desc_t, const void *, const void *, desc_t, void *);
int cudnnGetReductionWorkspaceSize(cudnnHandle_t, desc_t, desc_t, desc_t, size_t *);
int cudnnCreateDropoutDescriptor(desc_t *);
int cudnnDestroyDropoutDescriptor(desc_t);
int cudnnDropoutGetStatesSize(cudnnHandle_t, size_t *);
int cudnnSetDropoutDescriptor(desc_t, cudnnHandle_t, float, void *, size_t, unsigned long long);
int cudnnDropoutForward(cudnnHandle_t, desc_t, desc_t, const void *, desc_t, void *, void *, size_t);
int cudnnSetCallback(unsigned, void *, void *);
int cudnnBackendCreateDescriptor(int, desc_t *);
int cudnnBackendDestroyDescriptor(desc_t);
int cudnnBackendSetAttribute(desc_t, int, int, int64_t, const void *);
int cudnnBackendGetAttribute(desc_t, int, int, int64_t, int64_t *, void *);
int cudnnBackendFinalize(desc_t);
int cudnnBackendExecute(cudnnHandle_t, desc_t, desc_t);
}

enum { T_HANDLE = 0, T_INT64 = 3, T_FLOAT = 4, T_VOID_PTR = 6, T_DESC = 15 };
enum { D_POINTWISE = 1, D_OPERATION = 2, D_GRAPH = 3, D_HEUR = 4, D_ENGINECFG = 5, D_PLAN = 6, D_VARPACK = 7 };
enum { A_MODE = 1, A_SCALE = 2, A_POINTWISE = 3, A_OPS = 4, A_HANDLE = 5, A_GRAPH = 6, A_RESULTS = 7, A_CONFIG = 8,
       A_POINTERS = 9, A_COUNT = 10 };

static int relu(cudnnHandle_t h, desc_t act, int dtype)
{
    const int n = 6;
    double xd[n] = {-2, -1, 0, 1, 2, 3}, yd[n] = {1, 1, 1, 1, 1, 1};
    float xf[n], yf[n];
    for (int i = 0; i < n; i++) {
        xf[i] = (float)xd[i];
        yf[i] = (float)yd[i];
    }
    size_t elem = dtype ? sizeof(double) : sizeof(float);
    void *x, *y;
    desc_t t;
    CHECK(cudnnCreateTensorDescriptor(&t));
    CHECK(cudnnSetTensor4dDescriptor(t, 0, dtype, 1, 1, 2, 3));
    CHECK(cudaMalloc(&x, n * elem));
    CHECK(cudaMalloc(&y, n * elem));
    CHECK(cudaMemcpy(x, dtype ? (void *)xd : (void *)xf, n * elem, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, dtype ? (void *)yd : (void *)yf, n * elem, cudaMemcpyHostToDevice));
    double ad = 2, bd = 0.5;
    float af = 2, bf = 0.5f;
    CHECK(cudnnActivationForward(h, act, dtype ? (void *)&ad : (void *)&af, t, x, dtype ? (void *)&bd : (void *)&bf,
                                 t, y));
    CHECK(cudaMemcpy(dtype ? (void *)yd : (void *)yf, y, n * elem, cudaMemcpyDeviceToHost));
    printf("relu (%s):", dtype ? "double" : "float");
    for (int i = 0; i < n; i++)
        printf(" %g", dtype ? yd[i] : (double)yf[i]);
    printf("\n");
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudnnDestroyTensorDescriptor(t));
    return 0;
}

int main()
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudnnHandle_t h;
    CHECK(cudnnCreate(&h));
    CHECK(cudnnSetStream(h, s));
    cudaStream_t got = 0;
    CHECK(cudnnGetStream(h, &got));
    printf("stream kept: %d, version %zu, %s\n", got == s, cudnnGetVersion(), cudnnGetErrorString(2000));

    desc_t act;
    CHECK(cudnnCreateActivationDescriptor(&act));
    CHECK(cudnnSetActivationDescriptor(act, 1, 0, 0.0));
    if (relu(h, act, 0) || relu(h, act, 1))
        return 1;

    const int n = 4;
    float a[n] = {1, 2, 3, 4}, c[n] = {10, 20, 30, 40};
    float *da, *dc;
    desc_t ta, tc;
    CHECK(cudnnCreateTensorDescriptor(&ta));
    CHECK(cudnnCreateTensorDescriptor(&tc));
    CHECK(cudnnSetTensor4dDescriptor(ta, 0, 0, 1, n, 1, 1));
    CHECK(cudnnSetTensor4dDescriptor(tc, 0, 0, 1, n, 1, 1));
    CHECK(cudaMalloc(&da, sizeof a));
    CHECK(cudaMalloc(&dc, sizeof c));
    CHECK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice));
    float alpha = 3, beta = 1;
    CHECK(cudnnAddTensor(h, &alpha, ta, da, &beta, tc, dc)); // posted; alpha travels with it
    alpha = 100;
    CHECK(cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost));
    printf("add tensor: %g %g %g %g\n", c[0], c[1], c[2], c[3]);
    size_t ws = 0;
    CHECK(cudnnGetReductionWorkspaceSize(h, NULL, ta, tc, &ws));
    printf("workspace size: %zu\n", ws);

    // dropout: its states (device memory) go on between calls, and across a restore
    desc_t drop;
    size_t states_size = 0;
    CHECK(cudnnDropoutGetStatesSize(h, &states_size));
    void *states;
    CHECK(cudaMalloc(&states, states_size));
    CHECK(cudnnCreateDropoutDescriptor(&drop));
    CHECK(cudnnSetDropoutDescriptor(drop, h, 0.5f, states, states_size, 1234ULL));
    for (int round = 0; round < 3; round++) {
        CHECK(cudnnDropoutForward(h, drop, ta, da, tc, dc, NULL, 0));
        CHECK(cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost));
        printf("dropout %d: %g %g %g %g\n", round, c[0], c[1], c[2], c[3]);
    }
    void *cb = 0;
    printf("cudnnSetCallback: %d\n", cudnnSetCallback(0, cb, cb));

    // the backend API: y = (x + 1) * 3 (+ the engine's number / 100) through a graph of two pointwise operations
    desc_t pw[2], op[2], graph, heur, cfg[2], plan, pack;
    const int64_t modes[2] = {0, 1};
    const float scales[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        CHECK(cudnnBackendCreateDescriptor(D_POINTWISE, &pw[k]));
        CHECK(cudnnBackendSetAttribute(pw[k], A_MODE, T_INT64, 1, &modes[k]));
        CHECK(cudnnBackendSetAttribute(pw[k], A_SCALE, T_FLOAT, 1, &scales[k]));
        CHECK(cudnnBackendFinalize(pw[k]));
        CHECK(cudnnBackendCreateDescriptor(D_OPERATION, &op[k]));
        CHECK(cudnnBackendSetAttribute(op[k], A_POINTWISE, T_DESC, 1, &pw[k]));
        CHECK(cudnnBackendFinalize(op[k]));
    }
    CHECK(cudnnBackendCreateDescriptor(D_GRAPH, &graph));
    CHECK(cudnnBackendSetAttribute(graph, A_OPS, T_DESC, 2, op));
    CHECK(cudnnBackendSetAttribute(graph, A_HANDLE, T_HANDLE, 1, &h));
    CHECK(cudnnBackendFinalize(graph));
    for (int k = 0; k < 2; k++) { // (the graph keeps what it needs of them)
        CHECK(cudnnBackendDestroyDescriptor(op[k]));
        CHECK(cudnnBackendDestroyDescriptor(pw[k]));
    }
    CHECK(cudnnBackendCreateDescriptor(D_HEUR, &heur));
    CHECK(cudnnBackendSetAttribute(heur, A_GRAPH, T_DESC, 1, &graph));
    CHECK(cudnnBackendFinalize(heur));
    for (int k = 0; k < 2; k++)
        CHECK(cudnnBackendCreateDescriptor(D_ENGINECFG, &cfg[k]));
    int64_t found = 0;
    desc_t given[2] = {cfg[0], cfg[1]};
    CHECK(cudnnBackendGetAttribute(heur, A_RESULTS, T_DESC, 2, &found, cfg));
    printf("engine configurations: %lld, the same descriptors back: %d\n", (long long)found,
           cfg[0] == given[0] && cfg[1] == given[1]);
    CHECK(cudnnBackendCreateDescriptor(D_PLAN, &plan));
    CHECK(cudnnBackendSetAttribute(plan, A_HANDLE, T_HANDLE, 1, &h));
    CHECK(cudnnBackendSetAttribute(plan, A_GRAPH, T_DESC, 1, &graph));
    CHECK(cudnnBackendSetAttribute(plan, A_CONFIG, T_DESC, 1, &cfg[1]));
    CHECK(cudnnBackendFinalize(plan));
    CHECK(cudnnBackendDestroyDescriptor(cfg[0]));
    cudnnHandle_t back = 0;
    desc_t graph_back = 0;
    float scale_back = 0;
    int64_t m = 0;
    CHECK(cudnnBackendGetAttribute(plan, A_HANDLE, T_HANDLE, 1, &m, &back));
    CHECK(cudnnBackendGetAttribute(plan, A_GRAPH, T_DESC, 1, &m, &graph_back));
    printf("plan's handle is ours: %d, its graph: %d, wrong type: %d\n", back == h, graph_back == graph,
           cudnnBackendGetAttribute(plan, A_GRAPH, T_FLOAT, 1, &m, &scale_back));

    float *dx, *dy, x[n] = {1, 2, 3, 4}, y[n];
    CHECK(cudaMalloc(&dx, sizeof x));
    CHECK(cudaMalloc(&dy, sizeof y));
    CHECK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    void *ptrs[2] = {dx, dy};
    const int64_t count = n;
    CHECK(cudnnBackendCreateDescriptor(D_VARPACK, &pack));
    CHECK(cudnnBackendSetAttribute(pack, A_POINTERS, T_VOID_PTR, 2, ptrs));
    CHECK(cudnnBackendSetAttribute(pack, A_COUNT, T_INT64, 1, &count));
    CHECK(cudnnBackendFinalize(pack));
    for (int round = 0; round < 2; round++) {
        CHECK(cudnnBackendExecute(h, plan, pack)); // posted
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
        printf("execute %d: %g %g %g %g\n", round, y[0], y[1], y[2], y[3]);
        CHECK(cudaMemcpy(dx, dy, sizeof y, cudaMemcpyDeviceToDevice));
    }
    desc_t stale = (desc_t)0x1234;
    printf("stale descriptor: %d, unknown attribute type: %d\n", cudnnBackendFinalize(stale),
           cudnnBackendSetAttribute(pack, A_COUNT, 99, 1, &count));

    CHECK(cudnnBackendDestroyDescriptor(pack));
    CHECK(cudnnBackendDestroyDescriptor(plan));
    CHECK(cudnnBackendDestroyDescriptor(cfg[1]));
    CHECK(cudnnBackendDestroyDescriptor(heur));
    CHECK(cudnnBackendDestroyDescriptor(graph));
    CHECK(cudnnDestroyDropoutDescriptor(drop));
    CHECK(cudnnDestroyTensorDescriptor(ta));
    CHECK(cudnnDestroyTensorDescriptor(tc));
    CHECK(cudnnDestroyActivationDescriptor(act));
    CHECK(cudnnDestroy(h));
    printf("destroyed handle: %d\n", cudnnAddTensor(h, &alpha, ta, da, &beta, tc, dc));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
