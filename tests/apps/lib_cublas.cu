// cuBLAS as HPC codes use it: one handle on a created stream with a workspace of the program's, GEMMs of several
// sizes, precisions and transposes (also TF32 tensor-op math), level-1 results in host and in device pointer mode,
// strided and pointer-array batched GEMMs, GEMV, GEAM, a power iteration whose vector lives on across steps, and the
// host-only queries.  Steps and output: lib_common.h.  Build: nvcc -cudart shared -lcublas.
#include "lib_common.h"
#include <cublas_v2.h>

static const int N = 1024, V = 1 << 20, SB = 32, SBATCH = 64, PB = 64, PBATCH = 32;
static const int DM = 1024, DN = 512, DK = 768, D64 = 64;
static const int OPS = 12;

static const char *math_name(cublasMath_t m) {
    switch (m) {
    case CUBLAS_DEFAULT_MATH: return "default";
    case CUBLAS_TF32_TENSOR_OP_MATH: return "tf32";
    case CUBLAS_PEDANTIC_MATH: return "pedantic";
    default: return "other";
    }
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    cublasHandle_t h;
    cudaStream_t st;
    LCHECK(cublasCreate(&h));
    CHECK(cudaStreamCreate(&st));
    LCHECK(cublasSetStream(h, st));
    // (after the stream: setting a stream puts the handle back on the default workspace)
    const size_t ws_bytes = 32 << 20;
    void *ws = device_alloc<char>(ws_bytes);
    LCHECK(cublasSetWorkspace(h, ws, ws_bytes));

    // the large matrices, their host copies, and the matrices and vectors that carry state from step to step
    float *hA = (float *)malloc(sizeof(float) * N * N), *hB = (float *)malloc(sizeof(float) * N * N);
    fill_f(hA, (size_t)N * N, 1);
    fill_f(hB, (size_t)N * N, 2);
    float *A = device_copy(hA, (size_t)N * N), *B = device_copy(hB, (size_t)N * N);
    float *C = device_alloc<float>((size_t)N * N), *Ctf = device_alloc<float>((size_t)N * N);
    CHECK(cudaMemset(C, 0, sizeof(float) * N * N));
    float *S = device_alloc<float>((size_t)N * N);  // A + A^T (GEAM), for the power iteration
    const float one = 1.0f, zero = 0.0f;
    LCHECK(cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_T, N, N, &one, A, N, &one, A, N, S, N));
    float *hS = host_copy(S, (size_t)N * N);
    for (int s = 0; s < 64; s++) {
        int i = (s * 37) % N, j = (s * 101) % N;
        expect_close("geam", i + (size_t)j * N, hS[i + (size_t)j * N], hA[i + (size_t)j * N] + hA[j + (size_t)i * N],
                     1e-6);
    }
    double *hDA = (double *)malloc(sizeof(double) * DM * DK), *hDB = (double *)malloc(sizeof(double) * DN * DK);
    fill_d(hDA, (size_t)DM * DK, 3);
    fill_d(hDB, (size_t)DN * DK, 4);
    double *DA = device_copy(hDA, (size_t)DM * DK), *DB = device_copy(hDB, (size_t)DN * DK);
    double *DC = device_alloc<double>((size_t)DM * DN);
    double *D64A = device_alloc<double>(D64 * D64), *D64B = device_alloc<double>(D64 * D64);
    double *D64C = device_alloc<double>(D64 * D64);
    CHECK(cudaMemset(D64C, 0, sizeof(double) * D64 * D64));
    float *hx = (float *)malloc(sizeof(float) * V);
    fill_f(hx, V, 5);
    float *x = device_copy(hx, V), *y = device_alloc<float>(V);
    CHECK(cudaMemset(y, 0, sizeof(float) * V));
    float *dscal = device_alloc<float>(4);  // device pointer mode: alpha, then the results
    float *v = device_alloc<float>(N), *w = device_alloc<float>(N), *gy = device_alloc<float>(2 * N);
    float *hv = (float *)malloc(sizeof(float) * N);
    fill_f(hv, N, 6);
    CHECK(cudaMemcpy(v, hv, sizeof(float) * N, cudaMemcpyHostToDevice));
    // batched: strided, and by arrays of device pointers that live in device memory
    float *SA = device_alloc<float>((size_t)SB * SB * SBATCH), *SBm = device_alloc<float>((size_t)SB * SB * SBATCH);
    float *SC = device_alloc<float>((size_t)SB * SB * SBATCH);
    float *PA = device_alloc<float>((size_t)PB * PB * PBATCH), *PBm = device_alloc<float>((size_t)PB * PB * PBATCH);
    float *PC = device_alloc<float>((size_t)PB * PB * PBATCH);
    float *ptrs[3 * PBATCH];
    for (int i = 0; i < PBATCH; i++) {
        ptrs[i] = PA + (size_t)i * PB * PB;
        ptrs[PBATCH + i] = PBm + (size_t)i * PB * PB;
        ptrs[2 * PBATCH + i] = PC + (size_t)i * PB * PB;
    }
    float **dptrs = device_copy(ptrs, 3 * PBATCH);

    for (int k = 0; k < steps.count; k++) {
        int round = k / OPS;
        switch (k % OPS) {
        case 0: {  // small SGEMM, through cublasSetMatrix / cublasGetMatrix
            float a[64 * 64], b[64 * 64], c[64 * 64];
            fill_f(a, 64 * 64, 10 + round);
            fill_f(b, 64 * 64, 20 + round);
            LCHECK(cublasSetMatrix(64, 64, sizeof(float), a, 64, SA, 64));
            LCHECK(cublasSetMatrix(64, 64, sizeof(float), b, 64, SBm, 64));
            LCHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &one, SA, 64, SBm, 64, &zero, SC, 64));
            LCHECK(cublasGetMatrix(64, 64, sizeof(float), SC, 64, c, 64));
            check_gemm("sgemm 64", false, false, 64, 64, 64, 1.0, a, 64, b, 64, 0.0, c, c, 64, 0, 1e-5,
                       1.0);
            step_done(steps, k, "sgemm 64x64x64 NN %016llx", checksum(c, sizeof c));
            break;
        }
        case 1: {  // SGEMM 1024, A^T B, accumulating into C
            float alpha = 1.0f / 32, beta = 0.5f;
            float *prev = host_copy(C, (size_t)N * N);
            LCHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &alpha, A, N, B, N, &beta, C, N));
            float *c = host_copy(C, (size_t)N * N);
            check_gemm("sgemm 1024", true, false, N, N, N, alpha, hA, N, hB, N, beta, prev, c, N, 64, 1e-4,
                       1.0);
            step_done(steps, k, "sgemm 1024x1024x1024 TN beta 0.5 %016llx", checksum(c, sizeof(float) * N * N));
            free(prev);
            free(c);
            break;
        }
        case 2: {  // DGEMM, not square, A B^T
            double alpha = 1.0 + 0.5 * round, beta = 0.0;
            LCHECK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, DM, DN, DK, &alpha, DA, DM, DB, DN, &beta, DC, DM));
            double *c = host_copy(DC, (size_t)DM * DN);
            check_gemm("dgemm", false, true, DM, DN, DK, alpha, hDA, DM, hDB, DN, 0.0, c, c, DM, 64, 1e-12,
                       1.0);
            step_done(steps, k, "dgemm 1024x512x768 NT %016llx", checksum(c, sizeof(double) * DM * DN));
            free(c);
            break;
        }
        case 3: {  // DGEMM 64, A^T B^T, accumulating
            double a[D64 * D64], b[D64 * D64], alpha = 0.25, beta = 1.0;
            fill_d(a, D64 * D64, 30 + round);
            fill_d(b, D64 * D64, 40 + round);
            CHECK(cudaMemcpy(D64A, a, sizeof a, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(D64B, b, sizeof b, cudaMemcpyHostToDevice));
            double *prev = host_copy(D64C, D64 * D64);
            LCHECK(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_T, D64, D64, D64, &alpha, D64A, D64, D64B, D64, &beta, D64C,
                               D64));
            double *c = host_copy(D64C, D64 * D64);
            check_gemm("dgemm 64", true, true, D64, D64, D64, alpha, a, D64, b, D64, beta, prev, c, D64, 0,
                       1e-12, 1.0);
            step_done(steps, k, "dgemm 64x64x64 TT beta 1 %016llx", checksum(c, sizeof a));
            free(prev);
            free(c);
            break;
        }
        case 4: {  // TF32 tensor-op math for one SGEMM
            cublasMath_t before, during;
            LCHECK(cublasGetMathMode(h, &before));
            LCHECK(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
            LCHECK(cublasGetMathMode(h, &during));
            float alpha = 1.0f + round;
            LCHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &alpha, A, N, B, N, &zero, Ctf, N));
            LCHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
            float *c = host_copy(Ctf, (size_t)N * N);
            check_gemm("sgemm tf32", false, false, N, N, N, alpha, hA, N, hB, N, 0.0, c, c, N, 64, 2e-2,
                       10.0 * alpha);
            step_done(steps, k, "sgemm 1024 math %s -> %s %016llx", math_name(before), math_name(during),
                      checksum(c, sizeof(float) * N * N));
            free(c);
            break;
        }
        case 5:    // level 1, results in host variables
        case 6: {  // the same in device pointer mode: alpha and the results in device memory
            bool device = k % OPS == 6;
            float alpha = device ? -0.25f : 0.5f + round, dot = 0, nrm = 0;
            float *prev = host_copy(y, V);
            if (device) {
                LCHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
                CHECK(cudaMemcpyAsync(dscal, &alpha, sizeof alpha, cudaMemcpyHostToDevice, st));
                LCHECK(cublasSaxpy(h, V, dscal, x, 1, y, 1));
                LCHECK(cublasSdot(h, V, x, 1, y, 1, dscal + 1));
                LCHECK(cublasSnrm2(h, V, y, 1, dscal + 2));
                LCHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
                float r[3];
                CHECK(cudaMemcpyAsync(r, dscal, sizeof r, cudaMemcpyDeviceToHost, st));
                CHECK(cudaStreamSynchronize(st));
                dot = r[1];
                nrm = r[2];
            } else {
                LCHECK(cublasSaxpy(h, V, &alpha, x, 1, y, 1));
                LCHECK(cublasSdot(h, V, x, 1, y, 1, &dot));
                LCHECK(cublasSnrm2(h, V, y, 1, &nrm));
            }
            float *now = host_copy(y, V);
            double want_dot = 0, want_nrm = 0;
            for (int i = 0; i < V; i++) {
                expect_close("saxpy", i, now[i], (double)alpha * hx[i] + prev[i], 1e-5);
                want_dot += (double)hx[i] * now[i];
                want_nrm += (double)now[i] * now[i];
            }
            expect_close("sdot", 0, dot, want_dot, 1e-3, 100.0);
            expect_close("snrm2", 0, nrm, sqrt(want_nrm), 1e-3);
            step_done(steps, k, "saxpy sdot snrm2, %s pointer mode: dot %.9g nrm %.9g %016llx",
                      device ? "device" : "host", dot, nrm, checksum(now, sizeof(float) * V));
            free(prev);
            free(now);
            break;
        }
        case 7: {  // strided batched SGEMM
            const size_t n = (size_t)SB * SB * SBATCH;
            float *a = (float *)malloc(sizeof(float) * n), *b = (float *)malloc(sizeof(float) * n);
            fill_f(a, n, 50 + round);
            fill_f(b, n, 60 + round);
            CHECK(cudaMemcpy(SA, a, sizeof(float) * n, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(SBm, b, sizeof(float) * n, cudaMemcpyHostToDevice));
            long long stride = SB * SB;
            LCHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, SB, SB, SB, &one, SA, SB, stride, SBm, SB,
                                             stride, &zero, SC, SB, stride, SBATCH));
            float *c = host_copy(SC, n);
            for (int i = 0; i < SBATCH; i += 21)
                check_gemm("strided batched", false, true, SB, SB, SB, 1.0, a + i * stride, SB,
                           b + i * stride, SB, 0.0, c, c + i * stride, SB, 0, 1e-5, 1.0);
            step_done(steps, k, "sgemm strided batched 64 x 32x32 NT %016llx", checksum(c, sizeof(float) * n));
            free(a);
            free(b);
            free(c);
            break;
        }
        case 8: {  // batched SGEMM by arrays of pointers in device memory
            size_t n = (size_t)PB * PB * PBATCH;
            float *a = (float *)malloc(sizeof(float) * n), *b = (float *)malloc(sizeof(float) * n);
            fill_f(a, n, 70 + round);
            fill_f(b, n, 80 + round);
            CHECK(cudaMemcpy(PA, a, sizeof(float) * n, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(PBm, b, sizeof(float) * n, cudaMemcpyHostToDevice));
            float alpha = 2.0f;
            LCHECK(cublasSgemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, PB, PB, PB, &alpha, (const float **)dptrs, PB,
                                      (const float **)(dptrs + PBATCH), PB, &zero, dptrs + 2 * PBATCH, PB, PBATCH));
            float *c = host_copy(PC, n);
            for (int i = 0; i < PBATCH; i += 10)
                check_gemm("batched", true, false, PB, PB, PB, alpha, a + (size_t)i * PB * PB, PB,
                           b + (size_t)i * PB * PB, PB, 0.0, c, c + (size_t)i * PB * PB, PB, 64, 1e-5, 1.0);
            step_done(steps, k, "sgemm batched (device pointer arrays) 32 x 64x64 TN %016llx",
                      checksum(c, sizeof(float) * n));
            free(a);
            free(b);
            free(c);
            break;
        }
        case 9: {  // GEMV, A x and A^T x
            float alpha = 1.0f / (1 + round);
            float *xv = (float *)malloc(sizeof(float) * N);
            fill_f(xv, N, 90 + round);
            CHECK(cudaMemcpy(w, xv, sizeof(float) * N, cudaMemcpyHostToDevice));
            LCHECK(cublasSgemv(h, CUBLAS_OP_N, N, N, &alpha, A, N, w, 1, &zero, gy, 1));
            LCHECK(cublasSgemv(h, CUBLAS_OP_T, N, N, &alpha, A, N, w, 1, &zero, gy + N, 1));
            float *r = host_copy(gy, 2 * N);
            for (int i = 0; i < N; i += 31) {
                double a = 0, t = 0;
                for (int l = 0; l < N; l++) {
                    a += (double)hA[i + (size_t)l * N] * xv[l];
                    t += (double)hA[l + (size_t)i * N] * xv[l];
                }
                expect_close("sgemv N", i, r[i], alpha * a, 1e-4);
                expect_close("sgemv T", i, r[N + i], alpha * t, 1e-4);
            }
            step_done(steps, k, "sgemv N and T %016llx", checksum(r, sizeof(float) * 2 * N));
            free(xv);
            free(r);
            break;
        }
        case 10: {  // a power iteration step on A + A^T: its vector carries over from step to step
            float *before = host_copy(v, N);
            LCHECK(cublasSgemv(h, CUBLAS_OP_N, N, N, &one, S, N, v, 1, &zero, w, 1));
            float nrm = 0;
            LCHECK(cublasSnrm2(h, N, w, 1, &nrm));
            float inv = 1.0f / nrm;
            LCHECK(cublasScopy(h, N, w, 1, v, 1));
            LCHECK(cublasSscal(h, N, &inv, v, 1));
            float *after = host_copy(v, N);
            for (int i = 0; i < N; i += 97) {
                double want = 0;
                for (int l = 0; l < N; l++) want += (double)hS[i + (size_t)l * N] * before[l];
                expect_close("power iteration", i, after[i], want / nrm, 1e-3, 0.1);
            }
            step_done(steps, k, "power iteration |Sv| %.6g %016llx", nrm, checksum(after, sizeof(float) * N));
            free(before);
            free(after);
            break;
        }
        case 11: {  // host-side queries
            int version = 0, major = 0;
            LCHECK(cublasGetVersion(h, &version));
            LCHECK(cublasGetProperty(MAJOR_VERSION, &major));
            cublasPointerMode_t pm;
            cublasAtomicsMode_t am;
            cublasMath_t mm;
            cudaStream_t got;
            LCHECK(cublasGetPointerMode(h, &pm));
            LCHECK(cublasGetAtomicsMode(h, &am));
            LCHECK(cublasGetMathMode(h, &mm));
            LCHECK(cublasGetStream(h, &got));
            step_done(steps, k, "version %d major %d (%s) pointer mode %s atomics %s math %s stream %s; %s: %s",
                      version, major, major == CUBLAS_VER_MAJOR ? "as the header" : "NOT as the header",
                      pm == CUBLAS_POINTER_MODE_HOST ? "host" : "device",
                      am == CUBLAS_ATOMICS_NOT_ALLOWED ? "not allowed" : "allowed", math_name(mm),
                      got == st ? "ours" : "NOT ours", cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED),
                      cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED));
            break;
        }
        }
    }

    CHECK(cudaStreamSynchronize(st));
    LCHECK(cublasDestroy(h));
    CHECK(cudaStreamDestroy(st));
    void *all[] = {ws, A, B, C, Ctf, S, DA, DB, DC, D64A, D64B, D64C, x, y, dscal, v, w, gy, SA, SBm, SC, PA, PBm, PC,
                   dptrs};
    for (void *p : all) CHECK(cudaFree(p));
    free(hA);
    free(hB);
    free(hS);
    free(hDA);
    free(hDB);
    free(hx);
    free(hv);
    printf("Test PASSED\n");
    return 0;
}
