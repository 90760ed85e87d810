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
    printf("cudaGraphCreate: %s\n", cudaGetErrorName(cudaGraphCreate(&g, 0)));
    return 0;
}
