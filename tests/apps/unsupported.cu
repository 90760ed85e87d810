// nvproxy-only: a call nvproxy does not implement yet fails loudly (an error
// code and one stderr line naming it), never silently.
#include "check.h"

int main() {
    void *p;
    CHECK(cudaMalloc(&p, 64));
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    printf("cudaIpcGetMemHandle: %s\n", cudaGetErrorName(e));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    static char pageable[64];  // a graph copy runs later, in the proxy: it cannot reach pageable memory
    cudaGraphNode_t n;
    printf("pageable memcpy node: %s\n",
           cudaGetErrorName(cudaGraphAddMemcpyNode1D(&n, g, NULL, 0, p, pageable, 64, cudaMemcpyHostToDevice)));
    return 0;
}
