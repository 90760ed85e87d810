// Conditional graph nodes built node by node: an if node with an else body, a while
// loop whose body counts down, a switch with three bodies.  The handles are kernel
// parameters, so a checkpoint must bring them back with the same values.
// argv[1] = launches in a long run (each followed by a pause: checkpoint tests).
#include "check.h"
#include <unistd.h>

__global__ void decide(const int *flag, cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, *flag != 0); }
__global__ void add(int *p, int k) { *p += k; }
__global__ void countdown(int *counter, int *iterations, cudaGraphConditionalHandle h) {
    *iterations += 1;
    *counter -= 1;
    cudaGraphSetConditional(h, *counter > 0);
}
__global__ void choose(const int *which, cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, *which); }

static cudaGraphNode_t kernel(cudaGraph_t g, const cudaGraphNode_t *dep, void *func, void **args) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = func;
    p.kernel.gridDim = dim3(1);
    p.kernel.blockDim = dim3(1);
    p.kernel.kernelParams = args;
    cudaGraphNode_t n;
    CHECK(cudaGraphAddNode(&n, g, dep, NULL, dep ? 1 : 0, &p));
    return n;
}

static cudaGraph_t *conditional(cudaGraph_t g, const cudaGraphNode_t *dep, cudaGraphConditionalHandle h,
                                cudaGraphConditionalNodeType type, unsigned size, cudaGraphNode_t *node) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    CHECK(cudaGraphAddNode(node, g, dep, NULL, 1, &p));
    return p.conditional.phGraph_out;
}

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0;
    int *d;  // flag, if result, counter, iterations, which, switch result
    CHECK(cudaMalloc(&d, 8 * sizeof(int)));
    CHECK(cudaMemset(d, 0, 8 * sizeof(int)));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle hif, hwhile, hswitch;
    CHECK(cudaGraphConditionalHandleCreate(&hif, g, 0, 0));
    CHECK(cudaGraphConditionalHandleCreate(&hwhile, g, 1, cudaGraphCondAssignDefault));
    CHECK(cudaGraphConditionalHandleCreate(&hswitch, g, 0, 0));
    printf("handles distinct: %d\n", hif != hwhile && hwhile != hswitch && hif != hswitch);

    int *flag = d, *result = d + 1, *counter = d + 2, *iterations = d + 3, *which = d + 4, *sw = d + 5;
    int ten = 10, one = 1;
    void *dargs[] = {&flag, &hif};
    cudaGraphNode_t n = kernel(g, NULL, (void *)decide, dargs), ifnode, whilenode, switchnode;
    cudaGraph_t *ifb = conditional(g, &n, hif, cudaGraphCondTypeIf, 2, &ifnode);
    void *then_args[] = {&result, &ten}, *else_args[] = {&result, &one};
    kernel(ifb[0], NULL, (void *)add, then_args);
    kernel(ifb[1], NULL, (void *)add, else_args);
    cudaGraph_t *wb = conditional(g, &ifnode, hwhile, cudaGraphCondTypeWhile, 1, &whilenode);
    void *cargs[] = {&counter, &iterations, &hwhile};
    kernel(wb[0], NULL, (void *)countdown, cargs);
    void *sargs[] = {&which, &hswitch};
    n = kernel(g, &whilenode, (void *)choose, sargs);
    cudaGraph_t *sb = conditional(g, &n, hswitch, cudaGraphCondTypeSwitch, 3, &switchnode);
    int amounts[3] = {100, 200, 300};
    void *swargs[3][2];
    for (int k = 0; k < 3; k++) {
        swargs[k][0] = &sw;
        swargs[k][1] = &amounts[k];
        kernel(sb[k], NULL, (void *)add, swargs[k]);
    }
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &count));
    printf("top-level nodes: %zu\n", count);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));

    for (int r = 0; r < 4 + long_run; r++) {
        int f = r % 2, c = r + 2, w = r % 4;  // (which 3: no switch body runs)
        CHECK(cudaMemcpy(flag, &f, sizeof f, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(counter, &c, sizeof c, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(which, &w, sizeof w, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(x, 0));
        CHECK(cudaDeviceSynchronize());
        int h[6];
        CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
        printf("run %d: if %d, counter %d after %d iterations, switch %d\n", r, h[1], h[2], h[3], h[5]);
        fflush(stdout);
        if (long_run) usleep(150000);
    }
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(d));
    printf("Test PASSED\n");
    return 0;
}
