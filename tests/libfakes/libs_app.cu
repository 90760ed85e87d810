// Library calls through nvproxy on the sim backend, against the stand-in libraries of this folder: handles,
// pointer modes, host copies, a generator whose sequence must go on across restores, int plan handles, and a
// function that is not forwarded.  Declares what it uses itself (the CI machine has no math-library headers).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "libs_check.h"

extern "C" {
typedef void *cublasHandle_t;
typedef void *curandGenerator_t;
int cublasCreate_v2(cublasHandle_t *);
int cublasDestroy_v2(cublasHandle_t);
int cublasSetStream_v2(cublasHandle_t, cudaStream_t);
int cublasGetStream_v2(cublasHandle_t, cudaStream_t *);
int cublasSetPointerMode_v2(cublasHandle_t, int);
int cublasGetPointerMode_v2(cublasHandle_t, int *);
int cublasGetVersion_v2(cublasHandle_t, int *);
int cublasSaxpy_v2(cublasHandle_t, int, const float *, const float *, int, float *, int);
int cublasSdot_v2(cublasHandle_t, int, const float *, int, const float *, int, float *);
int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float *, const float *, int, const float *, int,
                   const float *, float *, int);
int cublasSetVector(int, int, const void *, int, void *, int);
int cublasGetVector(int, int, const void *, int, void *, int);
int cublasSetMatrix(int, int, int, const void *, int, void *, int);
int cublasGetMatrix(int, int, int, const void *, int, void *, int);
const char *cublasGetStatusName(int);
int cublasXtCreate(void **);
int curandCreateGenerator(curandGenerator_t *, int);
int curandCreateGeneratorHost(curandGenerator_t *, int);
int curandDestroyGenerator(curandGenerator_t);
int curandSetPseudoRandomGeneratorSeed(curandGenerator_t, unsigned long long);
int curandSetStream(curandGenerator_t, cudaStream_t);
int curandGenerate(curandGenerator_t, unsigned *, size_t);
int cufftPlan1d(int *, int, int, int);
int cufftExecC2C(int, void *, void *, int);
int cufftSetStream(int, cudaStream_t);
int cufftDestroy(int);
}

int main()
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cublasHandle_t h;
    CHECK(cublasCreate_v2(&h));
    CHECK(cublasSetStream_v2(h, s));
    cudaStream_t got = 0;
    CHECK(cublasGetStream_v2(h, &got));
    printf("stream kept: %d\n", got == s);
    int version = 0;
    CHECK(cublasGetVersion_v2(h, &version));
    printf("version %d, status name %s\n", version, cublasGetStatusName(0));

    const int n = 8;
    float x[n], y[n], r[n];
    for (int i = 0; i < n; i++) {
        x[i] = (float)(i + 1);
        y[i] = (float)(2 * i);
    }
    float *dx, *dy, *dr;
    CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CHECK(cudaMalloc(&dr, sizeof(float)));
    CHECK(cublasSetVector(n, sizeof(float), x, 1, dx, 1));
    CHECK(cublasSetVector(n, sizeof(float), y, 1, dy, 1));
    float alpha = 0.5f;
    CHECK(cublasSaxpy_v2(h, n, &alpha, dx, 1, dy, 1)); // posted; alpha travels with it
    alpha = 100.0f;                                    // (the call took the value it had)
    CHECK(cublasGetVector(n, sizeof(float), dy, 1, r, 1));
    printf("saxpy:");
    for (int i = 0; i < n; i++)
        printf(" %g", r[i]);
    printf("\n");
    float dot = 0;
    CHECK(cublasSdot_v2(h, n, dx, 1, dy, 1, &dot));
    printf("dot (host result): %g\n", dot);
    CHECK(cublasSetPointerMode_v2(h, 1));
    int mode = -1;
    CHECK(cublasGetPointerMode_v2(h, &mode));
    CHECK(cublasSdot_v2(h, n, dx, 2, dy, 2, dr));
    CHECK(cudaMemcpy(&dot, dr, sizeof dot, cudaMemcpyDeviceToHost));
    printf("mode %d, dot (device result): %g\n", mode, dot);
    CHECK(cublasSetPointerMode_v2(h, 0));
    printf("bad pointer mode: %d\n", cublasSetPointerMode_v2(h, 5));

    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 1, 0, 1, 1}, C[4] = {0};
    float *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, sizeof A));
    CHECK(cudaMalloc(&dB, sizeof B));
    CHECK(cudaMalloc(&dC, sizeof C));
    CHECK(cublasSetMatrix(2, 3, sizeof(float), A, 2, dA, 2));
    CHECK(cublasSetMatrix(3, 2, sizeof(float), B, 3, dB, 3));
    float one = 1, zero = 0;
    CHECK(cublasSgemm_v2(h, 0, 0, 2, 2, 3, &one, dA, 2, dB, 3, &zero, dC, 2));
    CHECK(cublasGetMatrix(2, 2, sizeof(float), dC, 2, C, 2));
    printf("sgemm: %g %g %g %g\n", C[0], C[1], C[2], C[3]);
    printf("stale handle: %d\n", cublasSaxpy_v2((cublasHandle_t)0x1234, n, &one, dx, 1, dy, 1));
    void *xt = 0;
    printf("cublasXtCreate: %d\n", cublasXtCreate(&xt));

    // two generators: one a restore sets to an offset (Philox), one whose numbers it makes again (MT19937)
    curandGenerator_t g, g3;
    CHECK(curandCreateGenerator(&g, 161));
    CHECK(curandSetPseudoRandomGeneratorSeed(g, 1234ULL));
    CHECK(curandSetStream(g, s));
    CHECK(curandCreateGenerator(&g3, 142));
    CHECK(curandSetPseudoRandomGeneratorSeed(g3, 777ULL));
    unsigned *dv, v[4];
    CHECK(cudaMalloc(&dv, sizeof v));
    for (int round = 0; round < 8; round++) {
        CHECK(curandGenerate(round % 2 ? g3 : g, dv, round % 4 < 2 ? 4 : 3));
        CHECK(cudaMemcpy(v, dv, sizeof v, cudaMemcpyDeviceToHost));
        printf("random %d: %u %u %u\n", round, v[0], v[1], v[2]);
    }

    // a host generator: its numbers come back in the reply (4 MiB, more than a socket holds at once)
    curandGenerator_t hg;
    CHECK(curandCreateGeneratorHost(&hg, 100));
    CHECK(curandSetPseudoRandomGeneratorSeed(hg, 1234ULL));
    const size_t big = 1 << 20;
    unsigned *hv = (unsigned *)malloc(big * sizeof(unsigned)), *dbig, *dv2 = (unsigned *)malloc(big * sizeof(unsigned));
    CHECK(curandGenerate(hg, hv, big));
    curandGenerator_t g2;
    CHECK(curandCreateGenerator(&g2, 100));
    CHECK(curandSetPseudoRandomGeneratorSeed(g2, 1234ULL));
    CHECK(cudaMalloc(&dbig, big * sizeof(unsigned)));
    CHECK(curandGenerate(g2, dbig, big));
    CHECK(cudaMemcpy(dv2, dbig, big * sizeof(unsigned), cudaMemcpyDeviceToHost));
    printf("host generator as the device's: %d (last %u)\n", memcmp(hv, dv2, big * sizeof(unsigned)) == 0, hv[big - 1]);
    CHECK(curandDestroyGenerator(g2));
    CHECK(curandDestroyGenerator(hg));

    int plan;
    CHECK(cufftPlan1d(&plan, 4, 0x29, 1));
    CHECK(cufftSetStream(plan, s));
    float sig[8] = {1, 0, 2, 0, 3, 0, 4, 0}, spec[8];
    float *dsig;
    CHECK(cudaMalloc(&dsig, sizeof sig));
    CHECK(cudaMemcpy(dsig, sig, sizeof sig, cudaMemcpyHostToDevice));
    CHECK(cufftExecC2C(plan, dsig, dsig, -1));
    CHECK(cudaMemcpy(spec, dsig, sizeof spec, cudaMemcpyDeviceToHost));
    printf("fft:");
    for (int i = 0; i < 8; i++)
        printf(" %g", spec[i] + 0.0f);
    printf("\n");
    CHECK(cufftDestroy(plan));
    printf("destroyed plan: %d\n", cufftExecC2C(plan, dsig, dsig, -1));
    CHECK(curandDestroyGenerator(g));
    CHECK(curandDestroyGenerator(g3));
    CHECK(cublasDestroy_v2(h));
    printf("destroyed handle: %d\n", cublasSdot_v2(h, n, dx, 1, dy, 1, &dot));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
