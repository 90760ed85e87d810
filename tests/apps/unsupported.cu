// nvproxy-only: a call nvproxy does not implement yet fails loudly (an error
// code and one stderr line naming it), never silently.
#include "check.h"

int main() {
    cudaError_t e = cudaCtxResetPersistingL2Cache();
    printf("cudaCtxResetPersistingL2Cache: %s\n", cudaGetErrorName(e));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaGraph_t g;
    printf("cudaGraphCreate: %s\n", cudaGetErrorName(cudaGraphCreate(&g, 0)));
    return 0;
}
