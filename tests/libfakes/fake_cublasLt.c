/* A stand-in for libcublasLt.so.13 where there is no GPU (the sim backend): the functions tests/libfakes/libs_lt.cu
 * uses, computed on the host (fp32, no transposes, no epilogue).  Every handle and descriptor carries a mark this
 * library checks, so that one it is given in place of another (or an id the proxy did not translate) is answered
 * CUBLAS_STATUS_NOT_INITIALIZED, not dereferenced.  Linked into the test program too, where the shim's entry points
 * replace every function of it. */
#include "fake_lt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NOT_INITIALIZED 1
#define INVALID_VALUE 7
#define NOT_SUPPORTED 15
#define DESC_MARK 0x64657363u
#define LAYOUT_MARK 0x6c61796fu
#define PREF_MARK 0x70726566u
#define ALGO_ID 42

struct desc {
    unsigned mark;
    int compute, scale;
};
struct layout {
    unsigned mark;
    int type;
    uint64_t rows, cols;
    int64_t ld;
};
struct pref {
    unsigned mark;
};
struct algo {
    uint64_t data[8];
};
struct heuristic {
    struct algo algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
};

static int marked(const void *p, unsigned mark) { return p && *(const unsigned *)p == mark; }

static void *made(size_t n, unsigned mark)
{
    unsigned *p = calloc(1, n);
    if (p)
        *p = mark;
    return p;
}

static int gone(void *p, unsigned mark)
{
    if (!marked(p, mark))
        return NOT_INITIALIZED;
    memset(p, 0, sizeof(unsigned));
    free(p);
    return 0;
}

int cublasLtCreate(void **h)
{
    *h = made(sizeof(struct fake_lt), FAKE_LT_MARK);
    return 0;
}
int cublasLtDestroy(void *h) { return gone(h, FAKE_LT_MARK); }

int cublasLtMatmulDescCreate(struct desc **d, int compute, int scale)
{
    *d = made(sizeof **d, DESC_MARK);
    (*d)->compute = compute;
    (*d)->scale = scale;
    return 0;
}
int cublasLtMatmulDescDestroy(void *d) { return gone(d, DESC_MARK); }

int cublasLtMatrixLayoutCreate(struct layout **l, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
    if (ld < (int64_t)rows)
        return INVALID_VALUE;
    *l = made(sizeof **l, LAYOUT_MARK);
    (*l)->type = type;
    (*l)->rows = rows;
    (*l)->cols = cols;
    (*l)->ld = ld;
    return 0;
}
int cublasLtMatrixLayoutDestroy(void *l) { return gone(l, LAYOUT_MARK); }

int cublasLtMatmulPreferenceCreate(void **p)
{
    *p = made(sizeof(struct pref), PREF_MARK);
    return 0;
}
int cublasLtMatmulPreferenceDestroy(void *p) { return gone(p, PREF_MARK); }

/* D = alpha A B + beta C: the shapes the layouts give must fit */
static int check(const void *h, const struct desc *d, const struct layout *a, const struct layout *b,
                 const struct layout *c, const struct layout *dd)
{
    if (!marked(h, FAKE_LT_MARK) || !marked(d, DESC_MARK) || !marked(a, LAYOUT_MARK) || !marked(b, LAYOUT_MARK) ||
        !marked(c, LAYOUT_MARK) || !marked(dd, LAYOUT_MARK))
        return NOT_INITIALIZED;
    if (a->cols != b->rows || c->rows != a->rows || c->cols != b->cols || dd->rows != c->rows ||
        dd->cols != c->cols)
        return INVALID_VALUE;
    return a->type || b->type || c->type || dd->type || d->scale ? NOT_SUPPORTED : 0; /* (CUDA_R_32F alone) */
}

int cublasLtMatmulAlgoGetHeuristic(void *h, struct desc *d, struct layout *a, struct layout *b, struct layout *c,
                                   struct layout *dd, struct pref *p, int requested, struct heuristic *results,
                                   int *found)
{
    int s = check(h, d, a, b, c, dd);
    if (s)
        return s;
    if (!marked(p, PREF_MARK))
        return NOT_INITIALIZED;
    if (requested < 1)
        return INVALID_VALUE;
    memset(results, 0, sizeof *results);
    results->algo.data[0] = ALGO_ID;
    results->wavesCount = 1.0f;
    *found = 1;
    return 0;
}

int cublasLtMatmul(void *h, struct desc *d, const float *alpha, const float *A, struct layout *la, const float *B,
                   struct layout *lb, const float *beta, const float *C, struct layout *lc, float *D,
                   struct layout *ld, const struct algo *algo, void *ws, size_t ws_size, void *stream)
{
    (void)ws;
    (void)ws_size;
    (void)stream;
    int s = check(h, d, la, lb, lc, ld);
    if (s)
        return s;
    if (algo && algo->data[0] != ALGO_ID)
        return INVALID_VALUE;
    for (uint64_t j = 0; j < lc->cols; j++)
        for (uint64_t i = 0; i < lc->rows; i++) {
            float sum = 0;
            for (uint64_t p = 0; p < la->cols; p++)
                sum += A[i + p * la->ld] * B[p + j * lb->ld];
            D[i + j * ld->ld] = *alpha * sum + *beta * C[i + j * lc->ld];
        }
    return 0;
}
