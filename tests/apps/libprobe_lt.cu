// cuBLASLt's heuristic asked for one algorithm, then for eight, for one problem (a transposed A, a bias epilogue):
// prints the bytes of each answer's first algorithm and its workspace, to compare runs.
// Build: nvcc -cudart shared -lcublasLt.
#include <cstdio>
#include <cstring>
#include <cublasLt.h>
#include <cuda_runtime.h>

static void show(const char *what, const cublasLtMatmulHeuristicResult_t &r) {
    const unsigned char *b = (const unsigned char *)&r;
    printf("%s:", what);
    for (size_t i = 0; i < sizeof r; i++) printf("%s%02x", i % 8 ? "" : " ", b[i]);
    printf("\n");
}

int main() {
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t t = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    float *bias;
    cudaMalloc(&bias, 1024 * sizeof(float));
    uint32_t e = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 768, 1024, 768);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 768, 512, 768);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 1024, 512, 1024);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = 32 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (int round = 0; round < 2; round++) {
        cublasLtMatmulHeuristicResult_t one, eight[8];
        memset(&one, 0xab, sizeof one);
        memset(eight, 0xcd, sizeof eight);
        int n1 = 0, n8 = 0;
        int s1 = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &one, &n1);
        int s8 = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, eight, &n8);
        printf("round %d: status %d %d, found %d %d\n", round, s1, s8, n1, n8);
        show("one", one);
        show("eight[0]", eight[0]);
    }
    return 0;
}
