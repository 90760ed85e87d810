// cuBLASLt as HPC and ML codes use it (fp32): matmul descriptors with transposes, bias and ReLU-bias epilogues (the
// bias a device pointer held in the descriptor), strided batches set on the layouts, alpha and beta in device
// memory; each problem's algorithm is chosen once by the heuristic and used for every later step, on a created
// stream with a workspace of the program's; the heuristic asked again must choose the same.  A cuBLAS handle cast
// to a cublasLtHandle_t (as cuBLAS's documentation allows, and PyTorch does) chooses and runs a problem's matmul
// too.  Steps and output: lib_common.h.  Build: nvcc -cudart shared -lcublasLt -lcublas.
#include "lib_common.h"
#include <cublasLt.h>
#include <cublas_v2.h>

static const int OPS = 7;
static const size_t WS_BYTES = 32 << 20;

struct Problem {
    const char *name;
    int m, n, k, batch;
    bool ta;
    cublasLtEpilogue_t epilogue;
    bool device_scalars;
    // made by setup
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    float *A = nullptr, *B = nullptr, *C = nullptr, *bias = nullptr, *scalars = nullptr, *hbias = nullptr;
    cublasLtMatmulAlgo_t algo = {};
};

static void layout(cublasLtMatrixLayout_t *l, int rows, int cols, int batch) {
    LCHECK(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, rows, cols, rows));
    if (batch > 1) {
        int32_t count = batch;
        int64_t stride = (int64_t)rows * cols;
        LCHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        LCHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof stride));
    }
}

static int heuristic(cublasLtHandle_t lt, cublasLtMatmulPreference_t pref, Problem &p,
                     cublasLtMatmulHeuristicResult_t *results, int want) {
    int found = 0;
    LCHECK(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, want, results, &found));
    if (found < 1) {
        printf("FAILED no algorithm for %s\n", p.name);
        exit(1);
    }
    return found;
}

static void setup(cublasLtHandle_t lt, cublasLtMatmulPreference_t pref, Problem &p) {
    LCHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (p.ta) {
        int32_t t = CUBLAS_OP_T;
        LCHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    }
    size_t a = (size_t)p.m * p.k * p.batch, b = (size_t)p.k * p.n * p.batch, c = (size_t)p.m * p.n * p.batch;
    p.A = device_alloc<float>(a);
    p.B = device_alloc<float>(b);
    p.C = device_alloc<float>(c);
    CHECK(cudaMemset(p.C, 0, c * sizeof(float)));
    p.bias = nullptr;
    p.hbias = nullptr;
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        p.hbias = (float *)malloc(sizeof(float) * p.m);
        fill_f(p.hbias, p.m, 99);
        p.bias = device_copy(p.hbias, p.m);
        uint32_t e = p.epilogue;
        LCHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
        LCHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias));
    }
    p.scalars = device_alloc<float>(2);
    if (p.device_scalars) {
        int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        LCHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode));
    }
    layout(&p.la, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.batch);
    layout(&p.lb, p.k, p.n, p.batch);
    layout(&p.lc, p.m, p.n, p.batch);
    cublasLtMatmulHeuristicResult_t r;
    heuristic(lt, pref, p, &r, 1);
    p.algo = r.algo;
}

// D = C = alpha op(A) B + beta C (+ bias, ReLU), in place, with the algorithm chosen at setup
static unsigned long long run(cublasLtHandle_t lt, cudaStream_t st, void *ws, Problem &p, int round) {
    size_t a = (size_t)p.m * p.k, b = (size_t)p.k * p.n, c = (size_t)p.m * p.n;
    float *ha = (float *)malloc(sizeof(float) * a * p.batch), *hb = (float *)malloc(sizeof(float) * b * p.batch);
    fill_f(ha, a * p.batch, 100 + round);
    fill_f(hb, b * p.batch, 200 + round);
    CHECK(cudaMemcpyAsync(p.A, ha, sizeof(float) * a * p.batch, cudaMemcpyHostToDevice, st));
    CHECK(cudaMemcpyAsync(p.B, hb, sizeof(float) * b * p.batch, cudaMemcpyHostToDevice, st));
    float *prev = host_copy(p.C, c * p.batch);
    float scal[2] = {1.0f + 0.25f * round, 0.5f};
    const void *alpha = &scal[0], *beta = &scal[1];
    if (p.device_scalars) {
        CHECK(cudaMemcpyAsync(p.scalars, scal, sizeof scal, cudaMemcpyHostToDevice, st));
        alpha = p.scalars;
        beta = p.scalars + 1;
    }
    LCHECK(cublasLtMatmul(lt, p.desc, alpha, p.A, p.la, p.B, p.lb, beta, p.C, p.lc, p.C, p.lc, &p.algo, ws, WS_BYTES,
                          st));
    float *d = (float *)malloc(sizeof(float) * c * p.batch);
    CHECK(cudaMemcpyAsync(d, p.C, sizeof(float) * c * p.batch, cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < p.batch; i += p.batch > 1 ? p.batch - 1 : 1)  // (the first and the last of a batch)
        check_gemm(p.name, p.ta, false, p.m, p.n, p.k, scal[0], ha + i * a, p.ta ? p.k : p.m, hb + i * b, p.k, scal[1],
                   prev + i * c, d + i * c, p.m, 64, 1e-4, 1.0, p.hbias, p.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS);
    unsigned long long sum = checksum(d, sizeof(float) * c * p.batch);
    free(ha);
    free(hb);
    free(prev);
    free(d);
    return sum;
}

// Two algorithms are the same when their configuration is: the struct also holds bytes the library leaves
// undefined, which differ between heuristic queries natively too.
static bool same_config(const cublasLtMatmulAlgo_t &x, const cublasLtMatmulAlgo_t &y) {
    const cublasLtMatmulAlgoConfigAttributes_t attrs[] = {
        CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
        CUBLASLT_ALGO_CONFIG_SPLITK_NUM, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
        CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION};
    for (auto a : attrs) {
        uint32_t vx = 0, vy = 0;  // (each of these attributes is 32 bits wide, and the size must match)
        size_t got = 0;
        LCHECK(cublasLtMatmulAlgoConfigGetAttribute(&x, a, &vx, sizeof vx, &got));
        LCHECK(cublasLtMatmulAlgoConfigGetAttribute(&y, a, &vy, sizeof vy, &got));
        if (vx != vy) return false;
    }
    return true;
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    cublasLtHandle_t lt;
    LCHECK(cublasLtCreate(&lt));
    cublasHandle_t blas;
    LCHECK(cublasCreate(&blas));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    void *ws = device_alloc<char>(WS_BYTES);
    cublasLtMatmulPreference_t pref;
    LCHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t max_ws = WS_BYTES;
    LCHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                sizeof max_ws));
    Problem probs[] = {
        {"matmul 256x256x256 NN", 256, 256, 256, 1, false, CUBLASLT_EPILOGUE_DEFAULT, false},
        {"matmul 1024x512x768 TN bias", 1024, 512, 768, 1, true, CUBLASLT_EPILOGUE_BIAS, false},
        {"matmul 1024x512x768 TN relu+bias", 1024, 512, 768, 1, true, CUBLASLT_EPILOGUE_RELU_BIAS, false},
        {"matmul batched 16 x 64x64x64 NN", 64, 64, 64, 16, false, CUBLASLT_EPILOGUE_DEFAULT, false},
        {"matmul 512x512x512 NN alpha and beta in device memory", 512, 512, 512, 1, false, CUBLASLT_EPILOGUE_DEFAULT,
         true},
    };
    for (Problem &p : probs) setup(lt, pref, p);

    for (int k = 0; k < steps.count; k++) {
        int op = k % OPS, round = k / OPS;
        if (op < 5) {
            unsigned long long sum = run(lt, st, ws, probs[op], round);
            step_done(steps, k, "%s %016llx", probs[op].name, sum);
            continue;
        }
        if (op == 6) {  // the first problem's heuristic and matmul through the cuBLAS handle
            Problem q = probs[0];
            cublasLtMatmulHeuristicResult_t r;
            heuristic((cublasLtHandle_t)blas, pref, q, &r, 1);
            q.algo = r.algo;
            unsigned long long sum = run((cublasLtHandle_t)blas, st, ws, q, round);
            step_done(steps, k, "%s through a cuBLAS handle (algorithm %s) %016llx", q.name,
                      same_config(r.algo, probs[0].algo) ? "as the cuBLASLt handle's" : "another", sum);
            continue;
        }
        // the heuristic asked again for a problem whose descriptor holds a bias pointer; the descriptor read back
        cublasLtMatmulHeuristicResult_t r[8];
        int found = heuristic(lt, pref, probs[1], r, 8);
        int32_t ta = 0;
        uint32_t epi = 0;
        void *bias = nullptr;
        size_t got = 0;
        LCHECK(cublasLtMatmulDescGetAttribute(probs[1].desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta, &got));
        LCHECK(cublasLtMatmulDescGetAttribute(probs[1].desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, &got));
        LCHECK(cublasLtMatmulDescGetAttribute(probs[1].desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias,
                                              &got));
        bool same = same_config(r[0].algo, probs[1].algo);
        step_done(steps, k, "heuristic: %d found, first %s, workspace %zu; transa %d epilogue %u bias %s; "
                  "version %zu (%s) cudart %zu", found, same ? "as before" : "NOT as before", r[0].workspaceSize, ta,
                  epi, bias == probs[1].bias ? "ours" : "NOT ours", cublasLtGetVersion(),
                  cublasLtGetVersion() / 10000 == CUBLAS_VER_MAJOR ? "as the header" : "NOT as the header",
                  cublasLtGetCudartVersion());
    }

    CHECK(cudaStreamSynchronize(st));
    for (Problem &p : probs) {
        LCHECK(cublasLtMatrixLayoutDestroy(p.la));
        LCHECK(cublasLtMatrixLayoutDestroy(p.lb));
        LCHECK(cublasLtMatrixLayoutDestroy(p.lc));
        LCHECK(cublasLtMatmulDescDestroy(p.desc));
        void *bufs[] = {p.A, p.B, p.C, p.bias, p.scalars};
        for (void *b : bufs) CHECK(cudaFree(b));
        free(p.hbias);
    }
    LCHECK(cublasLtMatmulPreferenceDestroy(pref));
    LCHECK(cublasLtDestroy(lt));
    LCHECK(cublasDestroy(blas));
    CHECK(cudaFree(ws));
    CHECK(cudaStreamDestroy(st));
    printf("Test PASSED\n");
    return 0;
}
