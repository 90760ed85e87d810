/* A stand-in for libcudnn.so.9 on the sim backend (see fake_cublas.c): the legacy functions
 * tests/libfakes/libs_cudnn.cu uses (tensors of floats or doubles, ReLU, AddTensor, a workspace size, dropout whose
 * states advance with each use), and a small backend API: descriptors holding typed attributes, an operation graph
 * that copies its operations when finalized (so they may be destroyed after), engine configurations a heuristic
 * fills through GetAttribute, and an execution plan that applies the graph's scale-and-add operations to a variant
 * pack's device pointers.  Type and attribute numbers are cuDNN's where the shim reads them (attribute types). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ST_OK = 0, ST_BAD_PARAM = 2000, ST_NOT_FINALIZED = 2004, ST_NOT_SUPPORTED = 3000 };
enum { T_HANDLE = 0, T_INT64 = 3, T_FLOAT = 4, T_VOID_PTR = 6, T_DESC = 15 };
enum { D_POINTWISE = 1, D_OPERATION = 2, D_GRAPH = 3, D_HEUR = 4, D_ENGINECFG = 5, D_PLAN = 6, D_VARPACK = 7 };
enum { A_MODE = 1, A_SCALE = 2, A_POINTWISE = 3, A_OPS = 4, A_HANDLE = 5, A_GRAPH = 6, A_RESULTS = 7, A_CONFIG = 8,
       A_POINTERS = 9, A_COUNT = 10 };

struct handle {
    void *stream;
};
struct tensor {
    int dtype, n, c, h, w;
};
struct activation {
    int mode;
};
struct dropout {
    float p;
    uint32_t *states;
};

#define MAX_ATTRS 12
#define MAX_OPS 4
struct attr {
    int name, type;
    int64_t count;
    unsigned char data[64];
};
struct desc {
    int type, finalized, nattrs;
    struct attr attrs[MAX_ATTRS];
    int nops; /* a finalized graph: its operations' (mode, scale), copied */
    int op_mode[MAX_OPS];
    float op_scale[MAX_OPS];
    int engine; /* an engine configuration: set by a heuristic's results */
};

static const int ELEM[] = {[T_HANDLE] = 8, [T_INT64] = 8, [T_FLOAT] = 4, [T_VOID_PTR] = 8, [T_DESC] = 8};

int cudnnCreate(struct handle **h)
{
    *h = calloc(1, sizeof **h);
    return ST_OK;
}
int cudnnDestroy(struct handle *h)
{
    free(h);
    return ST_OK;
}
int cudnnSetStream(struct handle *h, void *s)
{
    h->stream = s;
    return ST_OK;
}
size_t cudnnGetVersion(void) { return 92801; }
const char *cudnnGetErrorString(int s)
{
    return s == ST_OK ? "CUDNN_STATUS_SUCCESS" : s == ST_BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM" : "CUDNN_STATUS_OTHER";
}
int cudnnCreateTensorDescriptor(struct tensor **t)
{
    *t = calloc(1, sizeof **t);
    return ST_OK;
}
int cudnnDestroyTensorDescriptor(struct tensor *t)
{
    free(t);
    return ST_OK;
}
int cudnnSetTensor4dDescriptor(struct tensor *t, int format, int dtype, int n, int c, int h, int w)
{
    if (format != 0 || (dtype != 0 && dtype != 1) || n <= 0 || c <= 0 || h <= 0 || w <= 0)
        return ST_BAD_PARAM;
    *t = (struct tensor){dtype, n, c, h, w};
    return ST_OK;
}
int cudnnCreateActivationDescriptor(struct activation **a)
{
    *a = calloc(1, sizeof **a);
    return ST_OK;
}
int cudnnDestroyActivationDescriptor(struct activation *a)
{
    free(a);
    return ST_OK;
}
int cudnnSetActivationDescriptor(struct activation *a, int mode, int nan, double coef)
{
    (void)nan;
    (void)coef;
    a->mode = mode;
    return ST_OK;
}

static long count(const struct tensor *t) { return (long)t->n * t->c * t->h * t->w; }

/* y = alpha * f(x) + beta * y, in the tensors' type (alpha and beta: doubles for doubles, else floats) */
static int scaled(const struct tensor *xd, const void *x, const struct tensor *yd, void *y, const void *alpha,
                  const void *beta, int relu)
{
    if (xd->dtype != yd->dtype || count(xd) != count(yd))
        return ST_BAD_PARAM;
    for (long i = 0; i < count(yd); i++) {
        if (yd->dtype == 1) {
            double v = ((const double *)x)[i];
            ((double *)y)[i] = *(const double *)alpha * (relu && v < 0 ? 0 : v) + *(const double *)beta * ((double *)y)[i];
        } else {
            float v = ((const float *)x)[i];
            ((float *)y)[i] = *(const float *)alpha * (relu && v < 0 ? 0 : v) + *(const float *)beta * ((float *)y)[i];
        }
    }
    return ST_OK;
}

int cudnnActivationForward(struct handle *h, struct activation *a, const void *alpha, const struct tensor *xd,
                           const void *x, const void *beta, const struct tensor *yd, void *y)
{
    (void)h;
    if (a->mode != 1)
        return ST_NOT_SUPPORTED;
    return scaled(xd, x, yd, y, alpha, beta, 1);
}
int cudnnAddTensor(struct handle *h, const void *alpha, const struct tensor *ad, const void *A, const void *beta,
                   const struct tensor *cd, void *C)
{
    (void)h;
    return scaled(ad, A, cd, C, alpha, beta, 0);
}
int cudnnGetReductionWorkspaceSize(struct handle *h, void *reduce, const struct tensor *a, const struct tensor *c,
                                   size_t *size)
{
    (void)h;
    (void)reduce;
    *size = (size_t)(count(a) + count(c)) * (a->dtype == 1 ? 8 : 4);
    return ST_OK;
}

int cudnnCreateDropoutDescriptor(struct dropout **d)
{
    *d = calloc(1, sizeof **d);
    return ST_OK;
}
int cudnnDestroyDropoutDescriptor(struct dropout *d)
{
    free(d);
    return ST_OK;
}
int cudnnDropoutGetStatesSize(struct handle *h, size_t *size)
{
    (void)h;
    *size = 64;
    return ST_OK;
}
/* the states are initialised from the seed; cudnnRestoreDropoutDescriptor takes them as they are */
int cudnnSetDropoutDescriptor(struct dropout *d, struct handle *h, float p, void *states, size_t size,
                              unsigned long long seed)
{
    (void)h;
    if (size < 64)
        return ST_BAD_PARAM;
    d->p = p;
    d->states = states;
    for (int i = 0; i < 16; i++)
        d->states[i] = (uint32_t)(seed * 2654435761u + (uint64_t)i * 40503u);
    return ST_OK;
}
int cudnnRestoreDropoutDescriptor(struct dropout *d, struct handle *h, float p, void *states, size_t size,
                                  unsigned long long seed)
{
    (void)h;
    (void)seed;
    if (size < 64)
        return ST_BAD_PARAM;
    d->p = p;
    d->states = states;
    return ST_OK;
}
/* keeps or drops each value by the next states; the states advance (as cuDNN's random states do) */
int cudnnDropoutForward(struct handle *h, struct dropout *d, const struct tensor *xd, const void *x,
                        const struct tensor *yd, void *y, void *reserve, size_t reserve_size)
{
    (void)h;
    (void)reserve;
    (void)reserve_size;
    if (xd->dtype != 0 || yd->dtype != 0 || count(xd) != count(yd) || !d->states)
        return ST_BAD_PARAM;
    for (long i = 0; i < count(yd); i++) {
        uint32_t *s = &d->states[i % 16];
        *s = *s * 1664525u + 1013904223u;
        ((float *)y)[i] = (float)(*s >> 8) / 16777216.0f < d->p ? 0.0f : ((const float *)x)[i] / (1 - d->p);
    }
    return ST_OK;
}

/* ---- the backend API ---- */
int cudnnBackendCreateDescriptor(int type, struct desc **d)
{
    if (type < D_POINTWISE || type > D_VARPACK)
        return ST_NOT_SUPPORTED;
    *d = calloc(1, sizeof **d);
    (*d)->type = type;
    return ST_OK;
}
int cudnnBackendDestroyDescriptor(struct desc *d)
{
    free(d);
    return ST_OK;
}
static struct attr *find(struct desc *d, int name)
{
    for (int i = 0; i < d->nattrs; i++)
        if (d->attrs[i].name == name)
            return &d->attrs[i];
    return NULL;
}
int cudnnBackendSetAttribute(struct desc *d, int name, int type, int64_t n, const void *elems)
{
    if (!d || d->finalized)
        return ST_BAD_PARAM;
    if (type < 0 || type > T_DESC || !ELEM[type] || n < 0 || n * ELEM[type] > 64 || (n && !elems))
        return ST_BAD_PARAM;
    struct attr *a = find(d, name);
    if (!a) {
        if (d->nattrs == MAX_ATTRS)
            return ST_NOT_SUPPORTED;
        a = &d->attrs[d->nattrs++];
    }
    a->name = name;
    a->type = type;
    a->count = n;
    memcpy(a->data, elems, (size_t)(n * ELEM[type]));
    return ST_OK;
}
static void *desc_at(struct desc *d, int name, int k)
{
    struct attr *a = find(d, name);
    void *p = NULL;
    if (a && a->type == T_DESC && k < a->count)
        memcpy(&p, a->data + 8 * k, 8);
    return p;
}
int cudnnBackendFinalize(struct desc *d)
{
    if (!d || d->finalized)
        return ST_BAD_PARAM;
    if (d->type == D_GRAPH) { /* (its operations' parameters copied: they may be destroyed after) */
        struct attr *ops = find(d, A_OPS);
        if (!ops || !find(d, A_HANDLE) || ops->count > MAX_OPS)
            return ST_BAD_PARAM;
        d->nops = (int)ops->count;
        for (int k = 0; k < d->nops; k++) {
            struct desc *op = desc_at(d, A_OPS, k), *pw = op ? desc_at(op, A_POINTWISE, 0) : NULL;
            struct attr *mode = pw ? find(pw, A_MODE) : NULL, *scale = pw ? find(pw, A_SCALE) : NULL;
            if (!op || !op->finalized || !mode || !scale)
                return ST_NOT_FINALIZED;
            int64_t m;
            memcpy(&m, mode->data, sizeof m);
            d->op_mode[k] = (int)m;
            memcpy(&d->op_scale[k], scale->data, sizeof(float));
        }
    } else if (d->type == D_PLAN) {
        struct desc *cfg = desc_at(d, A_CONFIG, 0);
        if (!cfg || !cfg->engine || !find(d, A_HANDLE))
            return ST_NOT_FINALIZED;
    }
    d->finalized = 1;
    return ST_OK;
}
int cudnnBackendGetAttribute(struct desc *d, int name, int type, int64_t requested, int64_t *n, void *elems)
{
    if (!d)
        return ST_BAD_PARAM;
    if (d->type == D_HEUR && name == A_RESULTS) { /* (fills the engine configurations it is given) */
        if (!d->finalized || type != T_DESC)
            return ST_BAD_PARAM;
        for (int64_t k = 0; k < requested && k < 2; k++) {
            struct desc *cfg;
            memcpy(&cfg, (char *)elems + 8 * k, 8);
            if (!cfg || cfg->type != D_ENGINECFG)
                return ST_BAD_PARAM;
            cfg->engine = 7 + (int)k;
            cfg->finalized = 1;
        }
        *n = requested < 2 ? requested : 2;
        return ST_OK;
    }
    struct attr *a = find(d, name);
    if (!a || a->type != type)
        return ST_BAD_PARAM;
    *n = a->count;
    memcpy(elems, a->data, (size_t)((requested < a->count ? requested : a->count) * ELEM[type]));
    return ST_OK;
}
int cudnnBackendExecute(struct handle *h, struct desc *plan, struct desc *pack)
{
    struct handle *ph = NULL;
    struct attr *ha = plan ? find(plan, A_HANDLE) : NULL;
    if (ha)
        memcpy(&ph, ha->data, 8);
    if (!plan || !plan->finalized || !pack || ph != h)
        return ST_BAD_PARAM;
    struct desc *graph = desc_at(plan, A_GRAPH, 0), *cfg = desc_at(plan, A_CONFIG, 0);
    struct attr *ptrs = find(pack, A_POINTERS), *cnt = find(pack, A_COUNT);
    if (!graph || !graph->finalized || !ptrs || ptrs->count != 2 || !cnt)
        return ST_BAD_PARAM;
    float *x, *y;
    int64_t n;
    memcpy(&x, ptrs->data, 8);
    memcpy(&y, ptrs->data + 8, 8);
    memcpy(&n, cnt->data, 8);
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        for (int k = 0; k < graph->nops; k++)
            v = graph->op_mode[k] ? v * graph->op_scale[k] : v + graph->op_scale[k];
        y[i] = v + (float)cfg->engine / 100;
    }
    return ST_OK;
}

/* For the test program's link only: the shim answers these itself, or refuses them */
int cudnnGetStream(void) { return ST_NOT_SUPPORTED; }
int cudnnSetCallback(void) { return ST_NOT_SUPPORTED; }
