/* A stand-in for libcublas.so.13 where there is no GPU (the sim backend): the few functions
 * tests/libfakes/libs_app.cu uses, computed on the host.  On sim, device memory is host memory at the same
 * addresses in the proxy, so this library, loaded by the proxy (NVPROXY_LIB_DIR), reads and writes it directly.
 * Linked into the test program too, where the shim's entry points replace every function of it. */
#include "fake_lt.h"

#include <stdio.h>
#include <stdlib.h>

struct ctx {
    struct fake_lt lt; /* (the cuBLASLt handle it holds, first: the handle cast is one) */
    int mode;
    void *stream;
};

int cublasCreate_v2(void **h)
{
    struct ctx *c = calloc(1, sizeof *c);
    c->lt.mark = FAKE_LT_MARK;
    *h = c;
    return 0;
}
int cublasDestroy_v2(struct ctx *h)
{
    h->lt.mark = 0;
    free(h);
    return 0;
}
int cublasSetStream_v2(struct ctx *h, void *s)
{
    h->stream = s;
    return 0;
}
int cublasSetPointerMode_v2(struct ctx *h, int mode)
{
    if (mode != 0 && mode != 1)
        return 7;
    h->mode = mode;
    return 0;
}
int cublasGetPointerMode_v2(struct ctx *h, int *mode)
{
    *mode = h->mode;
    return 0;
}
int cublasGetVersion_v2(struct ctx *h, int *v)
{
    (void)h;
    *v = 130001;
    return 0;
}
int cublasSaxpy_v2(struct ctx *h, int n, const float *alpha, const float *x, int incx, float *y, int incy)
{
    (void)h;
    if (n < 0)
        return 7;
    for (int i = 0; i < n; i++)
        y[i * incy] += *alpha * x[i * incx];
    return 0;
}
int cublasSdot_v2(struct ctx *h, int n, const float *x, int incx, const float *y, int incy, float *result)
{
    (void)h;
    float s = 0;
    for (int i = 0; i < n; i++)
        s += x[i * incx] * y[i * incy];
    *result = s;
    return 0;
}
int cublasSgemm_v2(struct ctx *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc)
{
    (void)h;
    if (ta || tb)
        return 15;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0;
            for (int p = 0; p < k; p++)
                s += A[i + p * lda] * B[p + j * ldb];
            C[i + j * ldc] = *alpha * s + *beta * C[i + j * ldc];
        }
    return 0;
}
int cublasZdotc_v2(struct ctx *h, int n, const double *x, int incx, const double *y, int incy, double *result)
{
    (void)h;
    double re = 0, im = 0; /* (conj(x) . y, complex doubles) */
    for (int i = 0; i < n; i++) {
        const double *a = x + 2 * i * incx, *b = y + 2 * i * incy;
        re += a[0] * b[0] + a[1] * b[1];
        im += a[0] * b[1] - a[1] * b[0];
    }
    result[0] = re;
    result[1] = im;
    return 0;
}
const char *cublasGetStatusName(int s)
{
    if (getenv("FAKE_SAY_VERSION"))
        fprintf(stderr, "fake cublasGetStatusName called\n");
    return s == 0 ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_OTHER";
}

/* For the test program's link only: the shim answers these itself, or refuses them */
#define LINK_ONLY(name) \
    int name(void) { return 15; }
LINK_ONLY(cublasGetStream_v2)
LINK_ONLY(cublasSetVector)
LINK_ONLY(cublasGetVector)
LINK_ONLY(cublasSetMatrix)
LINK_ONLY(cublasGetMatrix)
LINK_ONLY(cublasXtCreate)
