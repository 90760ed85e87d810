// Time per call of math-library work, to run natively and through nvproxy on the same machine: SGEMM 64 (a
// loop of posted calls) and 4096, batched small GEMMs, a host-mode dot product (a waited call), a 128^3 C2C FFT,
// 64M normal numbers, one SpMV.  Prints one line per case: the median of 5 repetitions.
// Build: nvcc -cudart shared -lcublas -lcufft -lcurand -lcusparse.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cublas_v2.h>
#include <cufft.h>
#include <curand.h>
#include <cusparse.h>
#include <cuda_runtime.h>
#include <vector>

#define OK(x)                                                                                                    \
    do {                                                                                                         \
        if ((x) != 0) {                                                                                          \
            printf("FAILED %s\n", #x);                                                                            \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)

template <class F> static double median_us(int reps, int calls, F f) {
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        cudaDeviceSynchronize();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; i++) f();
        cudaDeviceSynchronize();
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    cublasHandle_t h;
    OK(cublasCreate(&h));
    float *A, *B, *C;
    const size_t N = 4096;
    OK(cudaMalloc(&A, N * N * 4));
    OK(cudaMalloc(&B, N * N * 4));
    OK(cudaMalloc(&C, N * N * 4));
    OK(cudaMemset(A, 0, N * N * 4));
    OK(cudaMemset(B, 0, N * N * 4));
    const float one = 1, zero = 0;
    printf("sgemm 64: %.2f us/call\n", median_us(5, 2000, [&] {
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &one, A, 64, B, 64, &zero, C, 64);
    }));
    double big = median_us(5, 3, [&] {
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, A, N, B, N, &zero, C, N);
    });
    printf("sgemm 4096: %.1f us/call (%.1f TFLOP/s)\n", big, 2.0 * N * N * N / big / 1e6);
    printf("sgemm 32x32 batched 1000: %.2f us/call\n", median_us(5, 200, [&] {
        cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 32, 32, 32, &one, A, 32, 1024, B, 32, 1024, &zero, C,
                                  32, 1024, 1000);
    }));
    float dot;
    printf("sdot 1024 to the host: %.2f us/call\n", median_us(5, 500, [&] { cublasSdot(h, 1024, A, 1, B, 1, &dot); }));
    cufftHandle plan;
    OK(cufftPlan3d(&plan, 128, 128, 128, CUFFT_C2C));
    printf("fft c2c 128^3: %.1f us/call\n", median_us(5, 20, [&] {
        cufftExecC2C(plan, (cufftComplex *)A, (cufftComplex *)B, CUFFT_FORWARD);
    }));
    curandGenerator_t g;
    OK(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_DEFAULT));
    float *R;
    OK(cudaMalloc(&R, sizeof(float) << 26));
    printf("curand 64M normals: %.1f us/call\n", median_us(5, 5, [&] {
        curandGenerateNormal(g, R, (size_t)1 << 26, 0.0f, 1.0f);
    }));
    cusparseHandle_t sp;
    OK(cusparseCreate(&sp));
    const int n = 1 << 20;  // a tridiagonal matrix
    int *rows, *cols;
    OK(cudaMalloc(&rows, (n + 1) * 4));
    OK(cudaMalloc(&cols, 3 * n * 4));
    std::vector<int> hr(n + 1), hc(3 * n);
    for (int i = 0; i <= n; i++) hr[i] = 3 * i;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) hc[3 * i + k] = std::min(std::max(i + k - 1, 0), n - 1);
    OK(cudaMemcpy(rows, hr.data(), (n + 1) * 4, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(cols, hc.data(), 3 * n * 4, cudaMemcpyHostToDevice));
    cusparseSpMatDescr_t m;
    cusparseDnVecDescr_t x, y;
    OK(cusparseCreateCsr(&m, n, n, 3 * n, rows, cols, C, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    OK(cusparseCreateDnVec(&x, n, A, CUDA_R_32F));
    OK(cusparseCreateDnVec(&y, n, B, CUDA_R_32F));
    size_t ws = 0;
    OK(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, m, x, &zero, y, CUDA_R_32F,
                               CUSPARSE_SPMV_ALG_DEFAULT, &ws));
    void *buf;
    OK(cudaMalloc(&buf, ws + 1));
    printf("spmv 1M rows: %.1f us/call\n", median_us(5, 100, [&] {
        cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, m, x, &zero, y, CUDA_R_32F,
                     CUSPARSE_SPMV_ALG_DEFAULT, buf);
    }));
    return 0;
}
