// cuSPARSE's generic API as solver codes use it: a CSR matrix (a perturbed 2D Laplacian) and dense vectors and
// matrices described once, on a created stream; SpMV (also preprocessed), SpMM, Jacobi iterations whose solution
// carries over from step to step (SpMV and a kernel of the program's own), dense-to-sparse conversion with the
// nonzero count read back in between, sparse-to-dense, and the host-side queries.  Every product uses the
// non-transposed matrix (a transposed one may use atomics), SpMV the algorithm documented as deterministic.
// Steps and output: lib_common.h.  Build: nvcc -cudart shared -lcusparse.
#include "lib_common.h"
#include <cusparse.h>
#include <algorithm>
#include <utility>
#include <vector>

static const int OPS = 7;
static const int G = 64, N = G * G, COLS = 16, DN = 256;
static const float DIAG = 4.5f;

__global__ void jacobi(float *u, const float *au, const float *f, int n, float diag) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) u[i] += (f[i] - au[i]) / diag;
}

struct Csr {
    int rows, cols;
    std::vector<int> ptr, col;
    std::vector<float> val;
};

// the 5-point Laplacian of a G x G grid, diagonal DIAG, off-diagonal entries -1 perturbed by up to 0.05
static Csr laplacian() {
    Csr a{N, N, {0}, {}, {}};
    std::vector<float> noise(5 * N);
    fill_f(noise.data(), noise.size(), 7);
    for (int i = 0; i < N; i++) {
        int r = i / G, c = i % G;
        const int nb[5] = {r > 0 ? i - G : -1, c > 0 ? i - 1 : -1, i, c < G - 1 ? i + 1 : -1, r < G - 1 ? i + G : -1};
        for (int t = 0; t < 5; t++)
            if (nb[t] >= 0) {
                a.col.push_back(nb[t]);
                a.val.push_back(nb[t] == i ? DIAG : -1.0f + 0.05f * noise[5 * i + t]);
            }
        a.ptr.push_back((int)a.col.size());
    }
    return a;
}

static void spmv_cpu(const Csr &a, const float *x, double *y) {
    for (int i = 0; i < a.rows; i++) {
        y[i] = 0;
        for (int p = a.ptr[i]; p < a.ptr[i + 1]; p++) y[i] += (double)a.val[p] * x[a.col[p]];
    }
}

// a column-major DN x DN matrix with about one entry in ten nonzero (where they are depends on seed)
static void sparse_dense(float *d, unsigned seed) {
    fill_f(d, DN * DN, seed);
    for (int i = 0; i < DN * DN; i++)
        if (fabsf(d[i]) < 0.9f) d[i] = 0.0f;
}

static Csr compress(const float *d) {  // (CSR of the column-major dense matrix)
    Csr a{DN, DN, {0}, {}, {}};
    for (int i = 0; i < DN; i++) {
        for (int j = 0; j < DN; j++)
            if (d[i + j * DN] != 0.0f) {
                a.col.push_back(j);
                a.val.push_back(d[i + j * DN]);
            }
        a.ptr.push_back((int)a.col.size());
    }
    return a;
}

// Orders each row's entries by column, as compress() makes them.
static void sort_rows(const int *ptr, int *col, float *val) {
    for (int r = 0; r < DN; r++) {
        std::vector<std::pair<int, float>> e;
        for (int k = ptr[r]; k < ptr[r + 1]; k++) e.emplace_back(col[k], val[k]);
        std::sort(e.begin(), e.end(), [](const auto &x, const auto &y) { return x.first < y.first; });
        for (size_t k = 0; k < e.size(); k++) {
            col[ptr[r] + k] = e[k].first;
            val[ptr[r] + k] = e[k].second;
        }
    }
}

template <typename T> static void expect_equal(const char *what, const T *got, const T *want, size_t n) {
    if (memcmp(got, want, n * sizeof(T))) {
        printf("MISMATCH %s: not as the CPU's\n", what);
        exit(1);
    }
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    cusparseHandle_t h;
    cudaStream_t st;
    LCHECK(cusparseCreate(&h));
    CHECK(cudaStreamCreate(&st));
    LCHECK(cusparseSetStream(h, st));

    Csr a = laplacian();
    int nnz = (int)a.col.size();
    int *dptr = device_copy(a.ptr.data(), N + 1), *dcol = device_copy(a.col.data(), nnz);
    float *dval = device_copy(a.val.data(), nnz);
    float *x = device_alloc<float>(N), *y = device_alloc<float>(N), *y2 = device_alloc<float>(N);
    float *u = device_alloc<float>(N), *au = device_alloc<float>(N), *f = device_alloc<float>(N);
    float *B = device_alloc<float>((size_t)N * COLS), *C = device_alloc<float>((size_t)N * COLS);
    CHECK(cudaMemset(y2, 0, sizeof(float) * N));
    CHECK(cudaMemset(u, 0, sizeof(float) * N));
    std::vector<float> hf(N);
    fill_f(hf.data(), N, 8);
    CHECK(cudaMemcpy(f, hf.data(), sizeof(float) * N, cudaMemcpyHostToDevice));
    cusparseSpMatDescr_t A, Ap;  // (Ap: the same matrix, with the preprocessing of one product)
    cusparseDnVecDescr_t vx, vy, vy2, vu, vau;
    cusparseDnMatDescr_t mB, mC;
    LCHECK(cusparseCreateCsr(&A, N, N, nnz, dptr, dcol, dval, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    LCHECK(cusparseCreateCsr(&Ap, N, N, nnz, dptr, dcol, dval, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    LCHECK(cusparseCreateDnVec(&vx, N, x, CUDA_R_32F));
    LCHECK(cusparseCreateDnVec(&vy, N, y, CUDA_R_32F));
    LCHECK(cusparseCreateDnVec(&vy2, N, y2, CUDA_R_32F));
    LCHECK(cusparseCreateDnVec(&vu, N, u, CUDA_R_32F));
    LCHECK(cusparseCreateDnVec(&vau, N, au, CUDA_R_32F));
    LCHECK(cusparseCreateDnMat(&mB, N, COLS, N, B, CUDA_R_32F, CUSPARSE_ORDER_COL));
    LCHECK(cusparseCreateDnMat(&mC, N, COLS, N, C, CUDA_R_32F, CUSPARSE_ORDER_COL));
    const float one = 1.0f, zero = 0.0f, half = 0.5f;
    const cusparseOperation_t op = CUSPARSE_OPERATION_NON_TRANSPOSE;
    size_t b1 = 0, b2 = 0, bm = 0;
    LCHECK(cusparseSpMV_bufferSize(h, op, &one, A, vx, &zero, vy, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, &b1));
    LCHECK(cusparseSpMV_bufferSize(h, op, &half, Ap, vx, &half, vy2, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, &b2));
    LCHECK(cusparseSpMM_bufferSize(h, op, op, &one, A, mB, &zero, mC, CUDA_R_32F, CUSPARSE_SPMM_CSR_ALG1, &bm));
    void *buf1 = device_alloc<char>(b1 + 1), *buf2 = device_alloc<char>(b2 + 1), *bufm = device_alloc<char>(bm + 1);
    LCHECK(cusparseSpMV_preprocess(h, op, &half, Ap, vx, &half, vy2, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, buf2));

    // the small matrix of the conversions, and the dense one converted to sparse
    std::vector<float> hs(DN * DN);
    sparse_dense(hs.data(), 9);
    Csr s = compress(hs.data());
    int *sptr = device_copy(s.ptr.data(), DN + 1), *scol = device_copy(s.col.data(), s.col.size());
    float *sval = device_copy(s.val.data(), s.val.size()), *sdense = device_alloc<float>(DN * DN);
    float *dense = device_alloc<float>(DN * DN);
    int *cptr = device_alloc<int>(DN + 1), *ccol = device_alloc<int>(DN * DN);
    float *cval = device_alloc<float>(DN * DN);
    cusparseSpMatDescr_t S, Cs;
    cusparseDnMatDescr_t mS, mD;
    LCHECK(cusparseCreateCsr(&S, DN, DN, s.col.size(), sptr, scol, sval, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    LCHECK(cusparseCreateDnMat(&mS, DN, DN, DN, sdense, CUDA_R_32F, CUSPARSE_ORDER_COL));
    LCHECK(cusparseCreateDnMat(&mD, DN, DN, DN, dense, CUDA_R_32F, CUSPARSE_ORDER_COL));
    LCHECK(cusparseCreateCsr(&Cs, DN, DN, 0, cptr, nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    size_t bs = 0, bd = 0;
    LCHECK(cusparseSparseToDense_bufferSize(h, S, mS, CUSPARSE_SPARSETODENSE_ALG_DEFAULT, &bs));
    LCHECK(cusparseDenseToSparse_bufferSize(h, mD, Cs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, &bd));
    void *bufs = device_alloc<char>(bs + 1), *bufd = device_alloc<char>(bd + 1);

    std::vector<float> hx(N), hy(N), hb((size_t)N * COLS);
    std::vector<double> want(N);
    for (int k = 0; k < steps.count; k++) {
        int round = k / OPS;
        switch (k % OPS) {
        case 0: {  // y = A x
            fill_f(hx.data(), N, 10 + round);
            CHECK(cudaMemcpyAsync(x, hx.data(), sizeof(float) * N, cudaMemcpyHostToDevice, st));
            LCHECK(cusparseSpMV(h, op, &one, A, vx, &zero, vy, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, buf1));
            float *got = host_copy(y, N);
            spmv_cpu(a, hx.data(), want.data());
            for (int i = 0; i < N; i++) expect_close("spmv", i, got[i], want[i], 1e-5);
            step_done(steps, k, "spmv csr alg2 %016llx", checksum(got, sizeof(float) * N));
            free(got);
            break;
        }
        case 1: {  // y2 = A x / 2 + y2 / 2 (preprocessed), y2 carries over
            fill_f(hx.data(), N, 20 + round);
            float *prev = host_copy(y2, N);
            CHECK(cudaMemcpyAsync(x, hx.data(), sizeof(float) * N, cudaMemcpyHostToDevice, st));
            LCHECK(cusparseSpMV(h, op, &half, Ap, vx, &half, vy2, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, buf2));
            float *got = host_copy(y2, N);
            spmv_cpu(a, hx.data(), want.data());
            for (int i = 0; i < N; i++)
                expect_close("spmv alpha beta", i, got[i], 0.5 * want[i] + 0.5 * prev[i], 1e-5);
            step_done(steps, k, "spmv csr alg2 preprocessed, alpha 0.5 beta 0.5 %016llx",
                      checksum(got, sizeof(float) * N));
            free(prev);
            free(got);
            break;
        }
        case 2: {  // C = A B
            fill_f(hb.data(), hb.size(), 30 + round);
            CHECK(cudaMemcpyAsync(B, hb.data(), sizeof(float) * hb.size(), cudaMemcpyHostToDevice, st));
            LCHECK(cusparseSpMM(h, op, op, &one, A, mB, &zero, mC, CUDA_R_32F, CUSPARSE_SPMM_CSR_ALG1, bufm));
            float *got = host_copy(C, (size_t)N * COLS);
            for (int j = 0; j < COLS; j += 5) {
                spmv_cpu(a, hb.data() + (size_t)j * N, want.data());
                for (int i = 0; i < N; i++) expect_close("spmm", i, got[(size_t)j * N + i], want[i], 1e-5);
            }
            step_done(steps, k, "spmm csr alg1 %dx%d by %dx%d %016llx", N, N, N, COLS,
                      checksum(got, sizeof(float) * N * COLS));
            free(got);
            break;
        }
        case 3: {  // Jacobi iterations for A u = f, u carried over
            for (int it = 0; it < 4; it++) {
                LCHECK(cusparseSpMV(h, op, &one, A, vu, &zero, vau, CUDA_R_32F, CUSPARSE_SPMV_CSR_ALG2, buf1));
                jacobi<<<(N + 255) / 256, 256, 0, st>>>(u, au, f, N, DIAG);
                CHECK(cudaGetLastError());
            }
            float *got = host_copy(u, N);
            spmv_cpu(a, got, want.data());
            double r = 0;
            for (int i = 0; i < N; i++) r += (hf[i] - want[i]) * (hf[i] - want[i]);
            step_done(steps, k, "jacobi |f - Au| %.4e %016llx", sqrt(r), checksum(got, sizeof(float) * N));
            free(got);
            break;
        }
        case 4: {  // dense to sparse: nonzeros counted, arrays set, then filled
            std::vector<float> hd(DN * DN);
            sparse_dense(hd.data(), 40 + round);
            Csr want_c = compress(hd.data());
            CHECK(cudaMemcpyAsync(dense, hd.data(), sizeof(float) * DN * DN, cudaMemcpyHostToDevice, st));
            LCHECK(cusparseDenseToSparse_analysis(h, mD, Cs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, bufd));
            int64_t rows = 0, cols = 0, count = 0;
            LCHECK(cusparseSpMatGetSize(Cs, &rows, &cols, &count));
            if (count != (int64_t)want_c.col.size()) {
                printf("MISMATCH dense to sparse: %lld nonzeros, the CPU counts %zu\n", (long long)count,
                       want_c.col.size());
                exit(1);
            }
            LCHECK(cusparseCsrSetPointers(Cs, cptr, ccol, cval));
            LCHECK(cusparseDenseToSparse_convert(h, mD, Cs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, bufd));
            int *gp = host_copy(cptr, DN + 1), *gc = host_copy(ccol, count);
            float *gv = host_copy(cval, count);
            expect_equal("dense to sparse offsets", gp, want_c.ptr.data(), DN + 1);
            sort_rows(gp, gc, gv);  // (the library need not order the columns within a row)
            expect_equal("dense to sparse columns", gc, want_c.col.data(), count);
            expect_equal("dense to sparse values", gv, want_c.val.data(), count);
            step_done(steps, k, "dense to sparse %lldx%lld: %lld nonzeros %016llx %016llx", (long long)rows,
                      (long long)cols, (long long)count, checksum(gc, sizeof(int) * count),
                      checksum(gv, sizeof(float) * count));
            free(gp);
            free(gc);
            free(gv);
            break;
        }
        case 5: {  // sparse to dense
            CHECK(cudaMemsetAsync(sdense, 0xff, sizeof(float) * DN * DN, st));  // (every element must be written)
            LCHECK(cusparseSparseToDense(h, S, mS, CUSPARSE_SPARSETODENSE_ALG_DEFAULT, bufs));
            float *got = host_copy(sdense, DN * DN);
            expect_equal("sparse to dense", got, hs.data(), DN * DN);
            step_done(steps, k, "sparse to dense %dx%d %016llx", DN, DN, checksum(got, sizeof(float) * DN * DN));
            free(got);
            break;
        }
        case 6: {  // host-side queries
            int version = 0, major = 0;
            LCHECK(cusparseGetVersion(h, &version));
            LCHECK(cusparseGetProperty(MAJOR_VERSION, &major));
            int64_t rows = 0, cols = 0, count = 0;
            LCHECK(cusparseSpMatGetSize(A, &rows, &cols, &count));
            cusparsePointerMode_t pm;
            LCHECK(cusparseGetPointerMode(h, &pm));
            step_done(steps, k, "version %d major %d (%s) A %lldx%lld %lld nonzeros, pointer mode %s; %s: %s", version,
                      major, major == CUSPARSE_VER_MAJOR ? "as the header" : "NOT as the header", (long long)rows,
                      (long long)cols, (long long)count, pm == CUSPARSE_POINTER_MODE_HOST ? "host" : "device",
                      cusparseGetErrorName(CUSPARSE_STATUS_NOT_SUPPORTED),
                      cusparseGetErrorString(CUSPARSE_STATUS_NOT_SUPPORTED));
            break;
        }
        }
    }

    CHECK(cudaStreamSynchronize(st));
    cusparseSpMatDescr_t sp[] = {A, Ap, S, Cs};
    for (auto d : sp) LCHECK(cusparseDestroySpMat(d));
    cusparseDnVecDescr_t dv[] = {vx, vy, vy2, vu, vau};
    for (auto d : dv) LCHECK(cusparseDestroyDnVec(d));
    cusparseDnMatDescr_t dm[] = {mB, mC, mS, mD};
    for (auto d : dm) LCHECK(cusparseDestroyDnMat(d));
    LCHECK(cusparseDestroy(h));
    void *all[] = {dptr, dcol, dval, x, y, y2, u, au, f, B, C, buf1, buf2, bufm, sptr, scol, sval, sdense, dense,
                   cptr, ccol, cval, bufs, bufd};
    for (void *p : all) CHECK(cudaFree(p));
    CHECK(cudaStreamDestroy(st));
    printf("Test PASSED\n");
    return 0;
}
