// nvproxy-only: a call nvproxy does not implement yet fails loudly (an error
// code and one stderr line naming it), never silently.
#include "check.h"

int main() {
    void *p;
    CHECK(cudaMalloc(&p, 64));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.bytesize = 1 << 20;
    cudaGraphNode_t alloc;
    cudaError_t e = cudaGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap);
    printf("cudaGraphAddMemAllocNode: %s\n", cudaGetErrorName(e));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    static char pageable[64];  // a graph copy runs later, in the proxy: it cannot reach pageable memory
    cudaGraphNode_t n;
    printf("pageable memcpy node: %s\n",
           cudaGetErrorName(cudaGraphAddMemcpyNode1D(&n, g, NULL, 0, p, pageable, 64, cudaMemcpyHostToDevice)));
    return 0;
}
