// nvproxy-only: a call nvproxy does not implement yet fails loudly (an error
// code and one stderr line naming it), never silently.
#include "check.h"

int main() {
    void *p;
    CHECK(cudaMalloc(&p, 64));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaExternalMemory_t em;
    cudaExternalMemoryHandleDesc desc = {};
    desc.type = cudaExternalMemoryHandleTypeOpaqueFd;
    desc.handle.fd = 0;
    desc.size = 1 << 20;
    cudaError_t e = cudaImportExternalMemory(&em, &desc);
    printf("cudaImportExternalMemory: %s\n", cudaGetErrorName(e));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    // a graph copy runs later: pageable memory on one side is staged by a host node, on both sides it is refused
    static char pageable[64], other[64];
    cudaGraphNode_t n;
    printf("pageable memcpy node: %s\n",
           cudaGetErrorName(cudaGraphAddMemcpyNode1D(&n, g, NULL, 0, p, pageable, 64, cudaMemcpyHostToDevice)));
    printf("pageable to pageable memcpy node: %s\n",
           cudaGetErrorName(cudaGraphAddMemcpyNode1D(&n, g, NULL, 0, other, pageable, 64, cudaMemcpyHostToHost)));
    return 0;
}
