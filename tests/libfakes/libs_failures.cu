// A posted library call that fails is reported by the thread's next call of the same library that waits, whatever
// other libraries' calls come between: rounds of a cublasSaxpy that fails (the stand-in refuses n < 0 after the call
// returned), then waited calls of cuRAND and cuFFT, then of cuBLAS (one that only queries, one that configures).
// The first round's calls run in the proxy's Python; later rounds' may run in its C fast path.
#include <cstdio>
#include <cuda_runtime.h>

extern "C" {
typedef void *cublasHandle_t;
int cublasCreate_v2(cublasHandle_t *);
int cublasDestroy_v2(cublasHandle_t);
int cublasSetPointerMode_v2(cublasHandle_t, int);
int cublasGetVersion_v2(cublasHandle_t, int *);
int cublasSaxpy_v2(cublasHandle_t, int, const float *, const float *, int, float *, int);
int curandGetVersion(int *);
int cufftGetVersion(int *);
}

int main()
{
    cublasHandle_t h;
    if (cublasCreate_v2(&h))
        return 1;
    float one = 1;
    int v = 0;
    for (int round = 0; round < 3; round++) {
        int posted = cublasSaxpy_v2(h, -1, &one, nullptr, 1, nullptr, 1);
        int rnd = curandGetVersion(&v), fft = cufftGetVersion(&v);
        int blas = cublasGetVersion_v2(h, &v), again = cublasGetVersion_v2(h, &v);
        printf("round %d query: saxpy %d, curand %d, cufft %d, cublas %d, then %d (version %d)\n", round, posted, rnd,
               fft, blas, again, v);
        posted = cublasSaxpy_v2(h, -1, &one, nullptr, 1, nullptr, 1);
        rnd = curandGetVersion(&v);
        blas = cublasSetPointerMode_v2(h, 0);
        again = cublasGetVersion_v2(h, &v);
        printf("round %d config: saxpy %d, curand %d, cublas %d, then %d\n", round, posted, rnd, blas, again);
    }
    printf("destroy: %d\n", cublasDestroy_v2(h));
    return 0;
}
