// nvproxy-only: a call nvproxy does not implement yet fails loudly (an error
// code and one stderr line naming it), never silently.
#include "check.h"

int main() {
    void *p = nullptr;
    cudaError_t e = cudaMallocManaged(&p, 1024);
    printf("cudaMallocManaged: %s\n", cudaGetErrorName(e));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaGraph_t g;
    printf("cudaGraphCreate: %s\n", cudaGetErrorName(cudaGraphCreate(&g, 0)));
    return 0;
}
