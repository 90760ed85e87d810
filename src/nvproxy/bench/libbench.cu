// nvproxy's math-library benchmarks: the same binary runs natively and under nvproxy.
// Prints one JSON object per line: {"bench", "param", "value", "unit", "check"}; "check" is an exact,
// order-independent sum of the result's bits, which must be the same natively and through nvproxy.
// Every result is also checked here (exit status 1 and one line naming the benchmark if it is wrong), so that
// failing calls cannot be measured as fast ones.
// Usage: libbench [--quick]   (--quick: small sizes and short measurements)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cufft.h>
#include <curand.h>
#include <cusparse.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "libbench: %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); exit(1); } } while (0)
// (every library's success status is 0)
#define LIB(x) do { int s_ = (int)(x); if (s_ != 0) { \
    fprintf(stderr, "libbench: %s:%d %s: status %d\n", __FILE__, __LINE__, #x, s_); exit(1); } } while (0)

static cudaStream_t stream;
static unsigned long long *acc;  // the checksum kernel's sum

__global__ void bitsum(const unsigned *p, size_t n, unsigned long long *out) {
    unsigned long long a = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a += p[i];
    atomicAdd(out, a);
}

static unsigned long long checksum(const void *p, size_t bytes) {
    unsigned long long h;
    CHECK(cudaMemsetAsync(acc, 0, sizeof *acc, stream));
    bitsum<<<264, 256, 0, stream>>>((const unsigned *)p, bytes / 4, acc);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(&h, acc, sizeof h, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    return h;
}

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static void emit(const char *bench, long long param, double value, const char *unit, unsigned long long check) {
    printf("{\"bench\": \"%s\", \"param\": %lld, \"value\": %.6g, \"unit\": \"%s\", \"check\": \"%016llx\"}\n",
           bench, param, value, unit, check);
    fflush(stdout);
}

[[noreturn]] static void wrong(const char *bench, const char *what, double got, double want) {
    fprintf(stderr, "libbench: %s: wrong result: %s is %g, expected %g\n", bench, what, got, want);
    exit(1);
}

// Seconds per call: a warm-up call, then batches of calls on the stream, each followed by one synchronisation,
// growing until one batch lasts at least `target` seconds; that batch's average.
template <class F> static double per_call(F call, double target) {
    call();
    CHECK(cudaStreamSynchronize(stream));
    for (long n = 1;;) {
        double t = now();
        for (long i = 0; i < n; i++) call();
        CHECK(cudaStreamSynchronize(stream));
        double dt = now() - t;
        if (dt >= target) return dt / n;
        n = std::max(2 * n, std::min(1000 * n, (long)(n * target * 1.2 / std::max(dt, 1e-7)) + 1));
    }
}

// Small integers: products and sums of them are exact in float, so results are checked exactly.
static float a_val(long i, long k, long b) { return (float)((i * 7 + k * 13 + b) % 5 - 2); }
static float b_val(long k, long j, long b) { return (float)((k * 11 + j * 3 + 2 * b) % 5 - 2); }

static float *device_copy(const std::vector<float> &h) {
    float *d;
    CHECK(cudaMalloc(&d, h.size() * sizeof(float)));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> host_copy(const float *d, size_t n) {
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// batch b of count column-major n x n matrices: A_b, B_b filled with a_val, b_val
static void fill_gemm(long n, long count, std::vector<float> &A, std::vector<float> &B) {
    A.resize(n * n * count);
    B.resize(n * n * count);
    for (long b = 0; b < count; b++)
        for (long j = 0; j < n; j++)
            for (long i = 0; i < n; i++) {
                A[b * n * n + i + j * n] = a_val(i, j, b);
                B[b * n * n + i + j * n] = b_val(i, j, b);
            }
}

// C_b = A_b B_b at the entries (i, j) of every step-th row and column
static void check_gemm(const char *bench, const std::vector<float> &C, long n, long b, long step) {
    for (long j = 0; j < n; j += step)
        for (long i = 0; i < n; i += step) {
            long want = 0;
            for (long k = 0; k < n; k++) want += (long)a_val(i, k, b) * (long)b_val(k, j, b);
            if (C[b * n * n + i + j * n] != (float)want) wrong(bench, "an entry of C", C[b * n * n + i + j * n], want);
        }
}

static void sgemm(cublasHandle_t h, long n, double target) {
    std::vector<float> A, B;
    fill_gemm(n, 1, A, B);
    float *dA = device_copy(A), *dB = device_copy(B), *dC;
    CHECK(cudaMalloc(&dC, n * n * sizeof(float)));
    CHECK(cudaMemset(dC, 0xff, n * n * sizeof(float)));  // NaN: calls that did nothing fail the check
    const float one = 1, zero = 0;
    auto call = [&] { LIB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dA, n, dB, n, &zero, dC, n)); };
    double t = per_call(call, target);
    bool small = n <= 256;
    check_gemm("sgemm", host_copy(dC, n * n), n, 0, small ? 1 : n / 61);
    unsigned long long sum = checksum(dC, n * n * sizeof(float));
    if (small) {
        emit("sgemm_small", n, t * 1e6, "us", sum);
        double ts = per_call([&] { call(); CHECK(cudaStreamSynchronize(stream)); }, target);
        emit("sgemm_small_sync", n, ts * 1e6, "us", sum);
    } else {
        emit("sgemm_large", n, 2.0 * n * n * n / t / 1e12, "TFLOP/s", sum);
    }
    CHECK(cudaFree(dA)); CHECK(cudaFree(dB)); CHECK(cudaFree(dC));
}

static void sgemm_batched(cublasHandle_t h, long n, long count, double target) {
    std::vector<float> A, B;
    fill_gemm(n, count, A, B);
    float *dA = device_copy(A), *dB = device_copy(B), *dC;
    CHECK(cudaMalloc(&dC, n * n * count * sizeof(float)));
    CHECK(cudaMemset(dC, 0xff, n * n * count * sizeof(float)));
    const float one = 1, zero = 0;
    double t = per_call([&] {
        LIB(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dA, n, n * n, dB, n, n * n, &zero,
                                      dC, n, n * n, count));
    }, target);
    std::vector<float> C = host_copy(dC, n * n * count);
    for (long b : {0L, count / 2, count - 1}) check_gemm("sgemm_batched", C, n, b, 1);
    unsigned long long sum = checksum(dC, n * n * count * sizeof(float));
    emit("sgemm_batched", count, t * 1e6, "us", sum);
    emit("sgemm_batched", count, 2.0 * n * n * n * count / t / 1e9, "GFLOP/s", sum);
    CHECK(cudaFree(dA)); CHECK(cudaFree(dB)); CHECK(cudaFree(dC));
}

// A plane wave of frequency k: its forward transform is n^3 at bin k and zero elsewhere.
static void fft3d(long n, double target) {
    const long k[3] = {3, 5 % n, 7 % n}, total = n * n * n;
    std::vector<cufftComplex> x(total);
    for (long a = 0; a < n; a++)
        for (long b = 0; b < n; b++)
            for (long c = 0; c < n; c++) {
                double ph = 2 * M_PI * ((double)(k[0] * a % n) / n + (double)(k[1] * b % n) / n + (double)(k[2] * c % n) / n);
                x[(a * n + b) * n + c] = {(float)cos(ph), (float)sin(ph)};
            }
    cufftComplex *in, *out;
    CHECK(cudaMalloc(&in, total * sizeof *in));
    CHECK(cudaMalloc(&out, total * sizeof *out));
    CHECK(cudaMemcpy(in, x.data(), total * sizeof *in, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(out, 0xff, total * sizeof *out));
    cufftHandle plan;
    LIB(cufftPlan3d(&plan, n, n, n, CUFFT_C2C));
    LIB(cufftSetStream(plan, stream));
    double t = per_call([&] { LIB(cufftExecC2C(plan, in, out, CUFFT_FORWARD)); }, target);
    CHECK(cudaMemcpy(x.data(), out, total * sizeof *out, cudaMemcpyDeviceToHost));
    const long peak = (k[0] * n + k[1]) * n + k[2];
    const double tol = 1e-4 * total;
    for (long i = 0; i < total; i++) {
        double want = i == peak ? (double)total : 0.0;
        double err = std::hypot(x[i].x - want, x[i].y);
        if (!(err <= tol)) wrong("fft_c2c_3d", i == peak ? "the peak" : "a bin off the peak", std::hypot(x[i].x, x[i].y), want);
    }
    emit("fft_c2c_3d", n, t * 1e6, "us", checksum(out, total * sizeof *out));
    LIB(cufftDestroy(plan));
    CHECK(cudaFree(in)); CHECK(cudaFree(out));
}

static void curand_normal(size_t count, double target) {
    float *d;
    CHECK(cudaMalloc(&d, count * sizeof(float)));
    CHECK(cudaMemset(d, 0xff, count * sizeof(float)));
    curandGenerator_t g;
    LIB(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_DEFAULT));
    LIB(curandSetPseudoRandomGeneratorSeed(g, 1234));
    LIB(curandSetStream(g, stream));
    // the first numbers of the seed: the same natively and through nvproxy (later ones depend on how many were drawn)
    LIB(curandGenerateNormal(g, d, count, 0.0f, 1.0f));
    unsigned long long sum = checksum(d, count * sizeof(float));
    CHECK(cudaMemset(d, 0xff, count * sizeof(float)));
    double t = per_call([&] { LIB(curandGenerateNormal(g, d, count, 0.0f, 1.0f)); }, target);
    std::vector<float> v = host_copy(d, count);
    double s = 0, s2 = 0;
    for (float f : v) { s += f; s2 += (double)f * f; }
    double mean = s / count, var = s2 / count - mean * mean;
    if (!(std::fabs(mean) < 0.01)) wrong("curand_normal", "the mean", mean, 0);
    if (!(std::fabs(var - 1) < 0.01)) wrong("curand_normal", "the variance", var, 1);
    emit("curand_normal", (long long)(count * sizeof(float)), count * sizeof(float) / t / 1e9, "GB/s", sum);
    LIB(curandDestroyGenerator(g));
    CHECK(cudaFree(d));
}

// y = L x for the 5-point Laplacian L of a grid x grid mesh (CSR, rows = grid^2)
static void spmv(long grid, double target) {
    const long rows = grid * grid;
    std::vector<int> off{0}, col;
    std::vector<float> val, x(rows);
    for (long r = 0; r < rows; r++) {
        long gx = r % grid, gy = r / grid;
        for (long c : {r - grid, r - 1, r, r + 1, r + grid}) {
            bool inside = c >= 0 && c < rows && (c == r || c == r - grid || c == r + grid || c / grid == gy);
            if (!inside) continue;
            col.push_back((int)c);
            val.push_back(c == r ? 4.0f : -1.0f);
        }
        off.push_back((int)col.size());
        x[r] = (float)((gx * 3 + gy) % 7 - 3);
    }
    int *dOff, *dCol;
    CHECK(cudaMalloc(&dOff, off.size() * sizeof(int)));
    CHECK(cudaMalloc(&dCol, col.size() * sizeof(int)));
    CHECK(cudaMemcpy(dOff, off.data(), off.size() * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dCol, col.data(), col.size() * sizeof(int), cudaMemcpyHostToDevice));
    float *dVal = device_copy(val), *dX = device_copy(x), *dY;
    CHECK(cudaMalloc(&dY, rows * sizeof(float)));
    CHECK(cudaMemset(dY, 0xff, rows * sizeof(float)));
    cusparseHandle_t h;
    LIB(cusparseCreate(&h));
    LIB(cusparseSetStream(h, stream));
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vy;
    LIB(cusparseCreateCsr(&A, rows, rows, (int64_t)col.size(), dOff, dCol, dVal, CUSPARSE_INDEX_32I,
                          CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    LIB(cusparseCreateDnVec(&vx, rows, dX, CUDA_R_32F));
    LIB(cusparseCreateDnVec(&vy, rows, dY, CUDA_R_32F));
    const float one = 1, zero = 0;
    size_t bytes = 0;
    LIB(cusparseSpMV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &zero, vy, CUDA_R_32F,
                                CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
    void *buf;
    CHECK(cudaMalloc(&buf, std::max<size_t>(bytes, 1)));
    double t = per_call([&] {
        LIB(cusparseSpMV(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &zero, vy, CUDA_R_32F,
                         CUSPARSE_SPMV_ALG_DEFAULT, buf));
    }, target);
    std::vector<float> y = host_copy(dY, rows);
    for (long r = 0; r < rows; r++) {
        double want = 0;
        for (int i = off[r]; i < off[r + 1]; i++) want += val[i] * x[col[i]];
        if (y[r] != (float)want) wrong("spmv_csr", "an entry of y", y[r], want);
    }
    emit("spmv_csr", rows, t * 1e6, "us", checksum(dY, rows * sizeof(float)));
    LIB(cusparseDestroySpMat(A)); LIB(cusparseDestroyDnVec(vx)); LIB(cusparseDestroyDnVec(vy));
    LIB(cusparseDestroy(h));
    CHECK(cudaFree(buf)); CHECK(cudaFree(dOff)); CHECK(cudaFree(dCol)); CHECK(cudaFree(dVal));
    CHECK(cudaFree(dX)); CHECK(cudaFree(dY));
}

// a call that waits: the dot product returned in host memory (host pointer mode)
static void sdot(cublasHandle_t h, long n, double target) {
    std::vector<float> x(n), y(n);
    long want = 0;
    for (long i = 0; i < n; i++) {
        x[i] = a_val(i, 1, 0);
        y[i] = b_val(i, 2, 0);
        want += (long)x[i] * (long)y[i];
    }
    float *dx = device_copy(x), *dy = device_copy(y);
    LIB(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    long bad = 0;
    float r = NAN;
    double t = per_call([&] {
        r = NAN;
        LIB(cublasSdot(h, n, dx, 1, dy, 1, &r));
        bad += r != (float)want;
    }, target);
    if (bad) wrong("sdot_host", "the dot product", r, want);
    unsigned bits;
    memcpy(&bits, &r, sizeof bits);
    emit("sdot_host", n, t * 1e6, "us", bits);
    CHECK(cudaFree(dx)); CHECK(cudaFree(dy));
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    const double target = quick ? 0.005 : 0.05;  // seconds of calls per measurement
    CHECK(cudaFree(0));
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMalloc(&acc, sizeof *acc));
    cublasHandle_t h;
    LIB(cublasCreate(&h));
    LIB(cublasSetStream(h, stream));
    sgemm(h, 64, target);
    sgemm(h, quick ? 512 : 4096, target);
    sgemm_batched(h, 32, quick ? 100 : 1000, target);
    fft3d(quick ? 32 : 128, target);
    curand_normal(quick ? (1 << 20) : (64 << 20), target);
    spmv(quick ? 64 : 1024, target);
    sdot(h, 1024, target);
    LIB(cublasDestroy(h));
    CHECK(cudaFree(acc));
    CHECK(cudaStreamDestroy(stream));
    return 0;
}
