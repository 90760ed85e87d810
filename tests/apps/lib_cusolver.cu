// cuSOLVER's dense solvers as HPC codes use them, in double precision on a created stream, deterministic mode: LU
// (getrf/getrs, also the 64-bit API with its host workspace), Cholesky (potrf/potrs), the symmetric eigensolver
// (syevd) and the SVD (gesvd), each after its bufferSize query, with devInfo read back: 0, and the index the
// library reports for a singular matrix and for one that is not positive definite.  Steps and output: lib_common.h.
// Build: nvcc -cudart shared -lcusolver.
#include "lib_common.h"
#include <cusolverDn.h>
#include <vector>

static const int OPS = 8;
// (dA holds the largest matrix, NL x NL)
static const int NL = 512, NRHS = 4, NS = 64, NC = 256, NE = 256, SM = 300, SN = 200, NX = 256;

static void random_matrix(std::vector<double> &a, int rows, int cols, unsigned seed) {
    a.resize((size_t)rows * cols);
    fill_d(a.data(), a.size(), seed);
}

// M M^T / n + I: symmetric positive definite
static std::vector<double> spd(int n, unsigned seed) {
    std::vector<double> m, a((size_t)n * n);
    random_matrix(m, n, n, seed);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int l = 0; l < n; l++) s += m[i + (size_t)l * n] * m[j + (size_t)l * n];
            a[i + (size_t)j * n] = s / n + (i == j);
        }
    return a;
}

static int read_info(const int *dinfo) {
    int info;
    CHECK(cudaMemcpy(&info, dinfo, sizeof info, cudaMemcpyDeviceToHost));
    return info;
}

static void expect_info(const char *what, const int *dinfo, int want) {
    int info = read_info(dinfo);
    if (info != want) {
        printf("MISMATCH %s: devInfo %d, want %d\n", what, info, want);
        exit(1);
    }
}

// |A X - B| small against |A| |X|, for nrhs columns
static void check_solution(const char *what, const std::vector<double> &a, int n, const double *x,
                           const std::vector<double> &b, int nrhs) {
    double an = 0, xn = 0, rn = 0;
    for (double v : a) an = fmax(an, fabs(v));
    for (int c = 0; c < nrhs; c++)
        for (int i = 0; i < n; i++) {
            double r = -b[i + (size_t)c * n];
            for (int l = 0; l < n; l++) r += a[i + (size_t)l * n] * x[l + (size_t)c * n];
            rn = fmax(rn, fabs(r));
            xn = fmax(xn, fabs(x[i + (size_t)c * n]));
        }
    if (!(rn <= 1e-10 * an * xn * n)) {
        printf("MISMATCH %s: residual %g, |A| %g |X| %g\n", what, rn, an, xn);
        exit(1);
    }
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    cusolverDnHandle_t h;
    cudaStream_t st;
    cusolverDnParams_t params;
    LCHECK(cusolverDnCreate(&h));
    CHECK(cudaStreamCreate(&st));
    LCHECK(cusolverDnSetStream(h, st));
    LCHECK(cusolverDnSetDeterministicMode(h, CUSOLVER_DETERMINISTIC_RESULTS));
    LCHECK(cusolverDnCreateParams(&params));
    int *dinfo = device_alloc<int>(1);
    double *dA = device_alloc<double>((size_t)NL * NL), *dB = device_alloc<double>((size_t)NL * NRHS);
    double *dW = device_alloc<double>(SM), *dU = device_alloc<double>((size_t)SM * SN);
    double *dVT = device_alloc<double>((size_t)SN * SN);
    int *dipiv = device_alloc<int>(NL);
    int64_t *dipiv64 = device_alloc<int64_t>(NX);
    std::vector<int> lworks(6);

    for (int k = 0; k < steps.count; k++) {
        int round = k / OPS;
        switch (k % OPS) {
        case 0: {  // LU with partial pivoting, then four right-hand sides
            std::vector<double> a, b;
            random_matrix(a, NL, NL, 10 + round);
            random_matrix(b, NL, NRHS, 20 + round);
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            CHECK(cudaMemcpyAsync(dB, b.data(), sizeof(double) * b.size(), cudaMemcpyHostToDevice, st));
            LCHECK(cusolverDnDgetrf_bufferSize(h, NL, NL, dA, NL, &lworks[0]));
            double *work = device_alloc<double>(lworks[0]);
            LCHECK(cusolverDnDgetrf(h, NL, NL, dA, NL, work, dipiv, dinfo));
            expect_info("getrf", dinfo, 0);
            LCHECK(cusolverDnDgetrs(h, CUBLAS_OP_N, NL, NRHS, dA, NL, dipiv, dB, NL, dinfo));
            expect_info("getrs", dinfo, 0);
            double *x = host_copy(dB, (size_t)NL * NRHS);
            int *ipiv = host_copy(dipiv, NL);
            check_solution("getrs", a, NL, x, b, NRHS);
            step_done(steps, k, "getrf/getrs %d, %d right-hand sides: x %016llx pivots %016llx", NL, NRHS,
                      checksum(x, sizeof(double) * NL * NRHS), checksum(ipiv, sizeof(int) * NL));
            CHECK(cudaFree(work));
            free(x);
            free(ipiv);
            break;
        }
        case 1: {  // a singular matrix: a zero column, reported (1-based) in devInfo
            std::vector<double> a;
            random_matrix(a, NS, NS, 30 + round);
            int zero_col = 10 + round % 20;
            for (int i = 0; i < NS; i++) a[i + (size_t)zero_col * NS] = 0;
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            int lwork;
            LCHECK(cusolverDnDgetrf_bufferSize(h, NS, NS, dA, NS, &lwork));
            double *work = device_alloc<double>(lwork);
            LCHECK(cusolverDnDgetrf(h, NS, NS, dA, NS, work, dipiv, dinfo));
            expect_info("getrf of a singular matrix", dinfo, zero_col + 1);
            step_done(steps, k, "getrf singular: devInfo %d, LU %016llx", zero_col + 1,
                      device_checksum(dA, sizeof(double) * NS * NS));
            CHECK(cudaFree(work));
            break;
        }
        case 2: {  // Cholesky
            std::vector<double> a = spd(NC, 40 + round), b;
            random_matrix(b, NC, NRHS, 50 + round);
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            CHECK(cudaMemcpyAsync(dB, b.data(), sizeof(double) * b.size(), cudaMemcpyHostToDevice, st));
            LCHECK(cusolverDnDpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, NC, dA, NC, &lworks[1]));
            double *work = device_alloc<double>(lworks[1]);
            LCHECK(cusolverDnDpotrf(h, CUBLAS_FILL_MODE_LOWER, NC, dA, NC, work, lworks[1], dinfo));
            expect_info("potrf", dinfo, 0);
            LCHECK(cusolverDnDpotrs(h, CUBLAS_FILL_MODE_LOWER, NC, NRHS, dA, NC, dB, NC, dinfo));
            expect_info("potrs", dinfo, 0);
            double *x = host_copy(dB, (size_t)NC * NRHS);
            check_solution("potrs", a, NC, x, b, NRHS);
            step_done(steps, k, "potrf/potrs %d: x %016llx", NC, checksum(x, sizeof(double) * NC * NRHS));
            CHECK(cudaFree(work));
            free(x);
            break;
        }
        case 3: {  // not positive definite: the order of the first minor that is not, in devInfo
            int bad = 5 + round % 40;
            std::vector<double> a((size_t)NC * NC, 0.0), noise;
            random_matrix(noise, NC, NC, 60 + round);
            for (int i = 0; i < NC; i++)
                for (int j = 0; j < NC; j++)
                    a[i + (size_t)j * NC] =
                        i == j ? (i == bad ? -1.0 : 1.0) : 0.001 * (noise[i + j * NC] + noise[j + i * NC]);
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            int lwork;
            LCHECK(cusolverDnDpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, NC, dA, NC, &lwork));
            double *work = device_alloc<double>(lwork);
            LCHECK(cusolverDnDpotrf(h, CUBLAS_FILL_MODE_LOWER, NC, dA, NC, work, lwork, dinfo));
            expect_info("potrf of an indefinite matrix", dinfo, bad + 1);
            step_done(steps, k, "potrf indefinite: devInfo %d", bad + 1);
            CHECK(cudaFree(work));
            break;
        }
        case 4: {  // symmetric eigenvalues and vectors
            std::vector<double> a;
            random_matrix(a, NE, NE, 70 + round);
            for (int i = 0; i < NE; i++)
                for (int j = 0; j < i; j++) a[j + (size_t)i * NE] = a[i + (size_t)j * NE];
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            LCHECK(cusolverDnDsyevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, NE, dA, NE, dW,
                                               &lworks[2]));
            double *work = device_alloc<double>(lworks[2]);
            LCHECK(cusolverDnDsyevd(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, NE, dA, NE, dW, work,
                                    lworks[2], dinfo));
            expect_info("syevd", dinfo, 0);
            double *w = host_copy(dW, NE), *v = host_copy(dA, (size_t)NE * NE);
            double trace = 0, sum = 0;
            for (int i = 0; i < NE; i++) {
                trace += a[i + (size_t)i * NE];
                sum += w[i];
                if (i && w[i] < w[i - 1]) {
                    printf("MISMATCH syevd: eigenvalues not ascending at %d\n", i);
                    exit(1);
                }
            }
            expect_close("syevd trace", 0, sum, trace, 1e-10, 10.0);
            for (int e = 0; e < NE; e += 85)  // A v = lambda v
                for (int i = 0; i < NE; i++) {
                    double av = 0;
                    for (int l = 0; l < NE; l++) av += a[i + (size_t)l * NE] * v[l + (size_t)e * NE];
                    expect_close("syevd vector", e, av, w[e] * v[i + (size_t)e * NE], 1e-9);
                }
            step_done(steps, k, "syevd %d: lowest %.6f highest %.6f %016llx %016llx", NE, w[0], w[NE - 1],
                      checksum(w, sizeof(double) * NE), checksum(v, sizeof(double) * NE * NE));
            CHECK(cudaFree(work));
            free(w);
            free(v);
            break;
        }
        case 5: {  // singular value decomposition of a tall matrix
            std::vector<double> a;
            random_matrix(a, SM, SN, 80 + round);
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            LCHECK(cusolverDnDgesvd_bufferSize(h, SM, SN, &lworks[3]));
            double *work = device_alloc<double>(lworks[3]), *rwork = device_alloc<double>(SN);
            LCHECK(cusolverDnDgesvd(h, 'S', 'S', SM, SN, dA, SM, dW, dU, SM, dVT, SN, work, lworks[3], rwork, dinfo));
            expect_info("gesvd", dinfo, 0);
            double *s = host_copy(dW, SN), *u = host_copy(dU, (size_t)SM * SN), *vt = host_copy(dVT, (size_t)SN * SN);
            double fro = 0, s2 = 0;
            for (double x : a) fro += x * x;
            for (int i = 0; i < SN; i++) s2 += s[i] * s[i];
            expect_close("gesvd frobenius", 0, s2, fro, 1e-10);
            for (int t = 0; t < 64; t++) {  // A = U S V^T
                int i = (t * 7919) % SM, j = (t * 104729) % SN;
                double r = 0;
                for (int l = 0; l < SN; l++) r += u[i + (size_t)l * SM] * s[l] * vt[l + (size_t)j * SN];
                expect_close("gesvd reconstruction", i + (size_t)j * SM, r, a[i + (size_t)j * SM], 1e-10);
            }
            step_done(steps, k, "gesvd %dx%d: largest %.6f smallest %.6f %016llx", SM, SN, s[0], s[SN - 1],
                      checksum(s, sizeof(double) * SN));
            CHECK(cudaFree(work));
            CHECK(cudaFree(rwork));
            free(s);
            free(u);
            free(vt);
            break;
        }
        case 6: {  // the 64-bit API: its workspaces on the device and on the host
            std::vector<double> a, b;
            random_matrix(a, NX, NX, 90 + round);
            random_matrix(b, NX, 1, 95 + round);
            CHECK(cudaMemcpyAsync(dA, a.data(), sizeof(double) * a.size(), cudaMemcpyHostToDevice, st));
            CHECK(cudaMemcpyAsync(dB, b.data(), sizeof(double) * b.size(), cudaMemcpyHostToDevice, st));
            size_t dev_bytes = 0, host_bytes = 0;
            LCHECK(cusolverDnXgetrf_bufferSize(h, params, NX, NX, CUDA_R_64F, dA, NX, CUDA_R_64F, &dev_bytes,
                                               &host_bytes));
            lworks[4] = (int)dev_bytes;
            lworks[5] = (int)host_bytes;
            void *dwork = device_alloc<char>(dev_bytes + 1), *hwork = malloc(host_bytes + 1);
            LCHECK(cusolverDnXgetrf(h, params, NX, NX, CUDA_R_64F, dA, NX, dipiv64, CUDA_R_64F, dwork, dev_bytes, hwork,
                                    host_bytes, dinfo));
            expect_info("Xgetrf", dinfo, 0);
            LCHECK(cusolverDnXgetrs(h, params, CUBLAS_OP_N, NX, 1, CUDA_R_64F, dA, NX, dipiv64, CUDA_R_64F, dB, NX,
                                    dinfo));
            expect_info("Xgetrs", dinfo, 0);
            double *x = host_copy(dB, NX);
            check_solution("Xgetrs", a, NX, x, b, 1);
            step_done(steps, k, "Xgetrf/Xgetrs %d: x %016llx", NX, checksum(x, sizeof(double) * NX));
            CHECK(cudaFree(dwork));
            free(hwork);
            free(x);
            break;
        }
        case 7: {  // host-side queries, and the workspace sizes the library asked for
            int version = 0, major = 0;
            LCHECK(cusolverGetVersion(&version));
            LCHECK(cusolverGetProperty(MAJOR_VERSION, &major));
            cusolverDeterministicMode_t mode;
            LCHECK(cusolverDnGetDeterministicMode(h, &mode));
            step_done(steps, k,
                      "version %d major %d (%s) %s; workspaces getrf %d potrf %d syevd %d gesvd %d Xgetrf %d + %d on "
                      "the host", version, major, major == CUSOLVER_VER_MAJOR ? "as the header" : "NOT as the header",
                      mode == CUSOLVER_DETERMINISTIC_RESULTS ? "deterministic" : "NOT deterministic", lworks[0],
                      lworks[1], lworks[2], lworks[3], lworks[4], lworks[5]);
            break;
        }
        }
    }

    CHECK(cudaStreamSynchronize(st));
    LCHECK(cusolverDnDestroyParams(params));
    LCHECK(cusolverDnDestroy(h));
    void *all[] = {dinfo, dA, dB, dW, dU, dVT, dipiv, dipiv64};
    for (void *p : all) CHECK(cudaFree(p));
    CHECK(cudaStreamDestroy(st));
    printf("Test PASSED\n");
    return 0;
}
