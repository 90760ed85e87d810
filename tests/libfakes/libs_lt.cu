// cuBLASLt given a cuBLAS handle cast to a cublasLtHandle_t (as cuBLAS's documentation allows, and PyTorch does):
// the heuristic and the matmul run with it, in rounds (the first in the proxy's Python, later ones where its C fast
// path may take them), as with a cuBLASLt handle of its own; a descriptor or a dead handle cast to a handle is
// refused, cuBLAS does not take a cuBLASLt handle, and cuBLASLt does not destroy a cuBLAS handle, which goes on
// working.  Declares what it uses itself (the CI machine has no math-library headers).
#include <cstdio>
#include <cuda_runtime.h>

#include "libs_check.h"

extern "C" {
typedef void *cublasHandle_t;
typedef void *cublasLtHandle_t;
typedef void *cublasLtMatmulDesc_t;
typedef void *cublasLtMatrixLayout_t;
typedef void *cublasLtMatmulPreference_t;
struct Algo {
    unsigned long long data[8];
};
struct Heuristic {
    Algo algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
};
int cublasCreate_v2(cublasHandle_t *);
int cublasDestroy_v2(cublasHandle_t);
int cublasSetStream_v2(cublasHandle_t, cudaStream_t);
int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float *, const float *, int, const float *, int,
                   const float *, float *, int);
int cublasLtCreate(cublasLtHandle_t *);
int cublasLtDestroy(cublasLtHandle_t);
int cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *, int, int);
int cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t);
int cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *, int, unsigned long long, unsigned long long, long long);
int cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t);
int cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *);
int cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t);
int cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                   cublasLtMatmulPreference_t, int, Heuristic *, int *);
int cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                   const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *,
                   cublasLtMatrixLayout_t, const Algo *, void *, size_t, cudaStream_t);
}

#define COMPUTE_32F 68
#define R_32F 0

struct Gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    float *A, *B, *C;
};

// C = alpha A B + beta C (2x3 times 3x2) through cuBLASLt with handle lt; its status, C printed
static int lt_gemm(const char *what, cublasLtHandle_t lt, const Gemm &g, float alpha, cudaStream_t s)
{
    Heuristic r;
    int found = 0;
    int st = cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.la, g.lb, g.lc, g.lc, g.pref, 1, &r, &found);
    if (st)
        return st;
    float beta = 0.5f;
    st = cublasLtMatmul(lt, g.desc, &alpha, g.A, g.la, g.B, g.lb, &beta, g.C, g.lc, g.C, g.lc, &r.algo, nullptr, 0, s);
    if (st)
        return st;
    float C[4];
    if (cudaMemcpyAsync(C, g.C, sizeof C, cudaMemcpyDeviceToHost, s) || cudaStreamSynchronize(s))
        return -1;
    printf("%s: %d found (algo %llu), C %g %g %g %g\n", what, found, r.algo.data[0], C[0], C[1], C[2], C[3]);
    return 0;
}

int main()
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cublasHandle_t blas;
    CHECK(cublasCreate_v2(&blas));
    CHECK(cublasSetStream_v2(blas, s));
    cublasLtHandle_t own;
    CHECK(cublasLtCreate(&own));

    Gemm g;
    CHECK(cublasLtMatmulDescCreate(&g.desc, COMPUTE_32F, R_32F));
    CHECK(cublasLtMatrixLayoutCreate(&g.la, R_32F, 2, 3, 2));
    CHECK(cublasLtMatrixLayoutCreate(&g.lb, R_32F, 3, 2, 3));
    CHECK(cublasLtMatrixLayoutCreate(&g.lc, R_32F, 2, 2, 2));
    CHECK(cublasLtMatmulPreferenceCreate(&g.pref));
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 1, 0, 1, 1}, C[4] = {1, 1, 1, 1};
    CHECK(cudaMalloc(&g.A, sizeof A));
    CHECK(cudaMalloc(&g.B, sizeof B));
    CHECK(cudaMalloc(&g.C, sizeof C));
    CHECK(cudaMemcpy(g.A, A, sizeof A, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(g.B, B, sizeof B, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(g.C, C, sizeof C, cudaMemcpyHostToDevice));

    for (int round = 0; round < 3; round++) {
        char what[64];
        snprintf(what, sizeof what, "round %d, the cuBLAS handle", round);
        CHECK(lt_gemm(what, (cublasLtHandle_t)blas, g, 1.0f + round, s));
        snprintf(what, sizeof what, "round %d, a cuBLASLt handle", round);
        CHECK(lt_gemm(what, own, g, 1.0f + round, s));
    }

    Heuristic r;
    int found = 0;
    printf("a descriptor as the handle: heuristic %d, matmul %d\n",
           cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)g.desc, g.desc, g.la, g.lb, g.lc, g.lc, g.pref, 1, &r,
                                          &found),
           lt_gemm("a descriptor as the handle", (cublasLtHandle_t)g.pref, g, 1.0f, s));
    float one = 1, zero = 0;
    printf("a cuBLASLt handle to cuBLAS: %d\n",
           cublasSgemm_v2((cublasHandle_t)own, 0, 0, 2, 2, 3, &one, g.A, 2, g.B, 3, &zero, g.C, 2));
    printf("cuBLASLt destroying the cuBLAS handle: %d\n", cublasLtDestroy((cublasLtHandle_t)blas));
    CHECK(cublasSgemm_v2(blas, 0, 0, 2, 2, 3, &one, g.A, 2, g.B, 3, &zero, g.C, 2));
    CHECK(cudaMemcpy(C, g.C, sizeof C, cudaMemcpyDeviceToHost));
    printf("cuBLAS after: %g %g %g %g\n", C[0], C[1], C[2], C[3]);
    CHECK(lt_gemm("cuBLASLt after", (cublasLtHandle_t)blas, g, 1.0f, s));

    CHECK(cublasDestroy_v2(blas));
    printf("a destroyed cuBLAS handle: %d\n", lt_gemm("a destroyed cuBLAS handle", (cublasLtHandle_t)blas, g, 1.0f, s));
    CHECK(cublasLtMatmulPreferenceDestroy(g.pref));
    CHECK(cublasLtMatrixLayoutDestroy(g.la));
    CHECK(cublasLtMatrixLayoutDestroy(g.lb));
    CHECK(cublasLtMatrixLayoutDestroy(g.lc));
    CHECK(cublasLtMatmulDescDestroy(g.desc));
    CHECK(cublasLtDestroy(own));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
