/* A library linked with -lcuda, which tests/apps/linked_libcuda.cu opens with RTLD_DEEPBIND. */
#include <cuda.h>

int library_asks_driver(void)
{
    int v = 0;
    return cuDriverGetVersion(&v) == CUDA_SUCCESS ? v : -1;
}
