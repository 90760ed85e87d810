/* The math libraries' calls (cuBLAS, cuBLASLt, cuFFT, cuRAND, cuSPARSE, cuSOLVER), forwarded to the proxy.
 *
 * The generated entry points (gen_libs.c) fill a struct nvpl_call parameter by parameter and end it here:
 * the request carries one u64 slot per parameter (values, device pointers, handle ids, wire streams, lengths of
 * host buffers) followed by the host inputs; the reply carries the status and the host outputs.  A stream-ordered
 * call that writes no host memory is posted: it returns at once, as the library's own call does; the proxy
 * prints a failure of one and reports its status with this thread's next call of the same library that waits for
 * a reply.
 *
 * Handles (cublasHandle_t, cufftHandle, descriptors...) are nvproxy's own values, so that the proxy can rebuild
 * the library's objects behind them after a restore; the shim checks every handle it is given and keeps what the
 * annotations ask for: a handle's pointer mode, stream and data type. */
#include "libcall.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- handles ---- */
struct hrec {
    uint64_t value; /* 0: a free entry */
    int kind;
    int mode;  /* pointer mode (0: host) */
    int dtype; /* data or scale type */
    int lt_mode;
    uint64_t stream;
    uint64_t size; /* the last buffer size the library answered for it (cusolverSp's host workspace) */
};

static pthread_mutex_t hlock = PTHREAD_MUTEX_INITIALIZER;
static struct hrec *htab;
static size_t hcap, hcount;
static uint64_t hserial;

static size_t hslot(uint64_t v) { return (size_t)((v * 0x9E3779B97F4A7C15ull) >> 17) & (hcap - 1); }

/* the entry of v (under hlock), or NULL */
static struct hrec *hfind(uint64_t v)
{
    if (!hcap || !v)
        return NULL;
    for (size_t i = hslot(v);; i = (i + 1) & (hcap - 1)) {
        if (htab[i].value == v)
            return &htab[i];
        if (!htab[i].value && !htab[i].kind)
            return NULL;
    }
}

static void hinsert(const struct hrec *r)
{
    if ((hcount + 1) * 2 > hcap) {
        size_t old = hcap;
        struct hrec *ot = htab;
        hcap = hcap ? hcap * 2 : 256;
        htab = calloc(hcap, sizeof *htab);
        hcount = 0;
        for (size_t i = 0; i < old; i++)
            if (ot[i].value)
                hinsert(&ot[i]);
        free(ot);
    }
    size_t i = hslot(r->value);
    while (htab[i].value)
        i = (i + 1) & (hcap - 1);
    htab[i] = *r;
    hcount++;
}

/* removal keeps the probe chains whole: the entry stays as a tombstone (value 0, kind -1) */
static void hremove(uint64_t v)
{
    struct hrec *r = hfind(v);
    if (r) {
        memset(r, 0, sizeof *r);
        r->kind = -1;
    }
}

/* a new handle value of kind: pointer kinds carry the kind above a serial number, so that a handle of one kind
 * given for another is refused; int kinds (cufftHandle) are the serial number */
static uint64_t hnew_value(int kind, int is_int)
{
    pthread_mutex_lock(&hlock);
    uint64_t s = ++hserial;
    pthread_mutex_unlock(&hlock);
    return is_int ? (s & 0x7fffffff) : ((uint64_t)(kind + 1) << 40 | s);
}

static int hkind(uint64_t v)
{
    pthread_mutex_lock(&hlock);
    struct hrec *r = hfind(v);
    int k = r ? r->kind : -1;
    pthread_mutex_unlock(&hlock);
    return k;
}

#define WITH_REC(h, stmt)                                                                                       \
    do {                                                                                                        \
        pthread_mutex_lock(&hlock);                                                                             \
        struct hrec *r = hfind(h);                                                                              \
        if (r) {                                                                                                \
            stmt;                                                                                               \
        }                                                                                                       \
        pthread_mutex_unlock(&hlock);                                                                           \
    } while (0)

int nvpl_host_mode(uint64_t h)
{
    int mode = 0;
    WITH_REC(h, mode = r->mode);
    return mode == 0;
}
void nvpl_note_mode(uint64_t h, int mode) { WITH_REC(h, r->mode = mode); }
void nvpl_note_stream(uint64_t h, uint64_t stream) { WITH_REC(h, r->stream = stream); }
void nvpl_note_dtype(uint64_t h, int dtype) { WITH_REC(h, r->dtype = dtype); }

void nvpl_note_size(uint64_t h, const void *size)
{
    uint64_t n;
    memcpy(&n, size, sizeof n);
    WITH_REC(h, r->size = n);
}

uint64_t nvpl_noted_size(uint64_t h)
{
    uint64_t n = 0;
    WITH_REC(h, n = r->size);
    return n;
}

int nvpl_handle_dtype(uint64_t h)
{
    int d = 0;
    WITH_REC(h, d = r->dtype);
    return d;
}

int nvpl_get_stream(uint64_t h, void *out)
{
    int found = 0;
    uint64_t s = 0;
    int kind = 0;
    WITH_REC(h, (found = 1, s = r->stream, kind = r->kind));
    const struct nvpl_lib_info *lib = &nvpl_libs[nvpl_kind_lib[found ? kind : 0]];
    if (!found)
        return lib->invalid_handle;
    if (!out)
        return lib->invalid_value;
    memcpy(out, &s, sizeof s);
    return 0;
}

int nvpl_dtype_size(int t)
{
    switch (t) {
    case 3: case 8: case 16: case 17: case 18: case 19: case 28: case 29: case 30: case 31: case 32: case 33:
        return 1; /* 8-bit and narrower */
    case 2: case 14: case 7: case 9: case 20: case 22:
        return 2;
    case 0: case 10: case 12: case 6: case 15: case 21: case 23:
        return 4;
    case 1: case 4: case 11: case 13: case 24: case 26:
        return 8;
    case 5: case 25: case 27:
        return 16;
    default:
        return 8;
    }
}

static int dtype_complex(int t)
{
    return t == 4 || t == 5 || t == 6 || t == 7 || t == 9 || t == 11 || t == 13 || t == 15 || t == 17 ||
           t == 19 || t == 21 || t == 23 || t == 25 || t == 27;
}

int nvpl_compute_size(int compute, int ctype)
{
    int base;
    if (compute < 64) /* (a cudaDataType, as the calls took before cublasComputeType_t) */
        return nvpl_dtype_size(compute);
    if (compute == 64 || compute == 65)
        base = 2;
    else if (compute == 70 || compute == 71 || compute == 79)
        base = 8;
    else
        base = 4;
    return dtype_complex(ctype) ? 2 * base : base;
}

int nvpl_scale_size(uint64_t desc) { return nvpl_dtype_size(nvpl_handle_dtype(desc)); }

int nvpl_lt_host(uint64_t desc, int beta)
{
    int mode = 0;
    WITH_REC(desc, mode = r->lt_mode);
    /* cublasLtPointerMode_t: 0 host, 1 device, 2 device vectors, 3 alpha a device vector and beta zero, 4 alpha a
     * device vector and beta host */
    return mode == 0 || (mode == 4 && beta);
}

void nvpl_note_lt_attr(uint64_t desc, int attr, const void *buf, size_t n, int scale_attr, int mode_attr)
{
    int32_t v;
    if (!buf || n < sizeof v)
        return;
    memcpy(&v, buf, sizeof v);
    if (attr == scale_attr)
        WITH_REC(desc, r->dtype = v);
    else if (attr == mode_attr)
        WITH_REC(desc, r->lt_mode = v);
}

int64_t nvpl_elem_size(int lib, int64_t type)
{
    for (int i = 0; i < nvpl_nelem_types; i++)
        if (nvpl_elem_types[i].lib == lib && nvpl_elem_types[i].type == type)
            return nvpl_elem_types[i].size;
    return -1; /* (no bytes go: the library refuses the type, as natively) */
}

int nvpl_dnn_dtype_size(int t)
{
    switch (t) {
    case 3: case 6: case 11: case 12: case 13: case 15: case 16: case 17: case 18: case 22: case 23:
        return 1; /* 8-bit and narrower */
    case 2: case 9:
        return 2;
    case 0: case 4: case 5: case 7: case 14: case 19:
        return 4;
    case 1: case 10: case 20:
        return 8;
    case 21:
        return 16;
    case 8: /* (INT8x32) */
        return 32;
    default:
        return 8;
    }
}

int nvpl_dnn_scale(uint64_t desc) { return nvpl_handle_dtype(desc) == 1 /* CUDNN_DATA_DOUBLE */ ? 8 : 4; }

/* ---- packing ---- */
static const struct nvpl_lib_info *lib_of(const struct nvpl_call *c) { return &nvpl_libs[nvpl_fns[c->fid].lib]; }

static void refuse(struct nvpl_call *c, int status)
{
    if (!c->status)
        c->status = status;
}

void nvpl_begin(struct nvpl_call *c, uint32_t fid, int nparams)
{
    c->fid = fid;
    c->nparams = nparams;
    c->status = 0;
    c->hostmask = 0;
    c->nbufs = 0;
    c->in_bytes = c->out_bytes = 0;
    c->create_at = NULL;
    c->created = 0;
    c->destroy_kind = -1;
    c->destroyed = 0;
}

void nvpl_handle(struct nvpl_call *c, int i, uint64_t h, int kind, int destroy)
{
    c->slot[i] = h;
    int given = h ? hkind(h) : kind; /* (NULL goes to the library, which answers it as natively) */
    if (destroy ? given != kind : !nvpl_kind_takes(kind, given)) {
        refuse(c, lib_of(c)->invalid_handle);
        return;
    }
    if (destroy) {
        c->destroy_kind = kind;
        c->destroyed = h;
    }
}

void nvpl_create(struct nvpl_call *c, int i, void *at, int kind, int is_int)
{
    if (!at) {
        refuse(c, lib_of(c)->invalid_value);
        return;
    }
    c->create_at = at;
    c->create_kind = kind;
    c->create_int = is_int;
    c->created = hnew_value(kind, is_int);
    c->slot[i] = c->created;
}

void nvpl_stream(struct nvpl_call *c, int i, void *stream)
{
    int64_t w = nvp_stream_wire((cudaStream_t)stream, 0);
    if (w < 0)
        refuse(c, lib_of(c)->invalid_value);
    c->slot[i] = (uint64_t)w;
}

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static void add_buf(struct nvpl_call *c, int i, void *p, int dir, uint64_t len)
{
    if (len > NVP_MAX_PAYLOAD - (size_t)NVPL_MAX_PARAMS * 8 - c->in_bytes - c->out_bytes) {
        refuse(c, lib_of(c)->invalid_value);
        return;
    }
    c->slot[i] = len;
    c->bufs[c->nbufs++] = (struct nvpl_buf){p, len, dir};
    if (dir & NVPL_IN)
        c->in_bytes += pad8(len);
    if (dir & NVPL_OUT)
        c->out_bytes += pad8(len);
}

void nvpl_buf(struct nvpl_call *c, int i, void *p, int dir, int64_t len)
{
    if (len == NVPL_DEVICE) {
        c->slot[i] = (uint64_t)(uintptr_t)p;
        return;
    }
    c->hostmask |= 1ull << i;
    if (!p) {
        c->slot[i] = NVPL_NULL;
        return;
    }
    add_buf(c, i, p, dir, len < 0 ? 0 : (uint64_t)len);
}

void nvpl_sval(struct nvpl_call *c, int i, const void *p, size_t len) { add_buf(c, i, (void *)p, NVPL_IN, len); }

void nvpl_str(struct nvpl_call *c, int i, const char *s)
{
    if (!s) {
        c->slot[i] = NVPL_NULL;
        return;
    }
    add_buf(c, i, (void *)s, NVPL_IN, strlen(s) + 1);
}

/* per-thread buffers for the request's payload and the reply's (grown as needed, kept) */
static __thread unsigned char *req_buf, *rep_buf;
static __thread size_t req_cap, rep_cap;

static unsigned char *grow(unsigned char **buf, size_t *cap, size_t need)
{
    if (need > *cap) {
        size_t n = *cap ? *cap : 4096;
        while (n < need)
            n *= 2;
        unsigned char *b = realloc(*buf, n);
        if (!b)
            return NULL;
        *buf = b;
        *cap = n;
    }
    return *buf;
}

static int sync_all(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("NVPROXY_LIB_SYNC");
        v = e && *e && strcmp(e, "0") != 0;
    }
    return v;
}

/* Send the call; with rep, wait for its reply (payload into rep_buf).  The library's status, or its
 * internal-error status where the request could not be made (no proxy, a context broken by a sticky error). */
static int64_t send_call(struct nvpl_call *c, struct nvp_reply *rep, size_t out_cap)
{
    const struct nvpl_lib_info *lib = lib_of(c);
    if (nvp_enter() != cudaSuccess)
        return lib->internal;
    size_t n = (size_t)c->nparams * 8 + c->in_bytes;
    unsigned char *p = grow(&req_buf, &req_cap, n ? n : 8);
    if (!p)
        return lib->internal;
    memcpy(p, c->slot, (size_t)c->nparams * 8);
    size_t off = (size_t)c->nparams * 8;
    for (int k = 0; k < c->nbufs; k++) {
        const struct nvpl_buf *b = &c->bufs[k];
        if (!(b->dir & NVPL_IN))
            continue;
        memcpy(p + off, b->user, b->len);
        memset(p + off + b->len, 0, pad8(b->len) - b->len);
        off += pad8(b->len);
    }
    uint64_t a[NVP_MAX_ARGS] = {c->fid, c->hostmask, c->out_bytes, rep == NULL};
    if (rep) {
        if (!grow(&rep_buf, &rep_cap, out_cap ? out_cap : 8))
            return lib->internal;
        rep->out = rep_buf;
        rep->out_cap = out_cap;
        rep->out_len = 0;
    }
    cudaError_t e = nvp_call(NVP_OP_LIB_CALL, a, p, n, rep, -1);
    return e == cudaSuccess ? 0 : lib->internal;
}

/* the status of an earlier posted call of this library that failed, in place of this call's success */
static int64_t with_posted_failure(const struct nvpl_call *c, const struct nvp_reply *rep, int64_t status)
{
    uint64_t failed = rep->h.r[1], fid = rep->h.r[2] & ~NVP_LIB_OUT_IN_R3;
    if (status == 0 && failed && fid < (uint64_t)nvpl_nfns && nvpl_fns[fid].lib == nvpl_fns[c->fid].lib)
        return (int32_t)failed;
    return status;
}

/* The answers of NVPL_CONST functions (versions, properties, status names), kept for the process's life: a
 * program that asks for the version before each call pays the proxy's round trip once.  Keyed by the function
 * and its argument slots (an output buffer's slot is its length, or NVPL_NULL). */
struct memo {
    struct memo *next;
    uint32_t fid;
    int nparams;
    uint64_t slot[4];
    int64_t status;
    const char *str;
    uint64_t out_len;
    unsigned char out[32];
};
static struct memo *_Atomic memos;

static int memo_fits(const struct nvpl_call *c)
{
    return (nvpl_fns[c->fid].flags & NVPL_CONST) && c->nparams <= 4 && c->out_bytes <= sizeof memos->out &&
           !c->in_bytes;
}

static const struct memo *memo_find(const struct nvpl_call *c)
{
    if (!memo_fits(c))
        return NULL;
    for (const struct memo *m = atomic_load_explicit(&memos, memory_order_acquire); m; m = m->next)
        if (m->fid == c->fid && !memcmp(m->slot, c->slot, (size_t)c->nparams * sizeof c->slot[0]))
            return m;
    return NULL;
}

static void memo_keep(const struct nvpl_call *c, int64_t status, const char *str, const void *out, uint64_t len)
{
    struct memo *m;
    if (!memo_fits(c) || len > sizeof m->out || !(m = calloc(1, sizeof *m)))
        return;
    m->fid = c->fid;
    m->nparams = c->nparams;
    memcpy(m->slot, c->slot, (size_t)c->nparams * sizeof c->slot[0]);
    m->status = status;
    m->str = str;
    m->out_len = len;
    memcpy(m->out, out, len);
    m->next = atomic_load_explicit(&memos, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&memos, &m->next, m, memory_order_release, memory_order_relaxed))
        ;
}

/* a kept answer's outputs, into the caller's buffers as a reply's would go */
static int64_t memo_answer(const struct nvpl_call *c, const struct memo *m)
{
    uint64_t off = 0;
    for (int k = 0; k < c->nbufs; k++) {
        const struct nvpl_buf *b = &c->bufs[k];
        if (b->dir & NVPL_OUT) {
            memcpy(b->user, m->out + off, b->len);
            off += pad8(b->len);
        }
    }
    return m->status;
}

int64_t nvpl_end(struct nvpl_call *c)
{
    if (c->status)
        return c->status;
    const struct nvpl_fn_info *fn = &nvpl_fns[c->fid];
    const struct memo *kept = memo_find(c);
    if (kept)
        return memo_answer(c, kept);
    if ((fn->flags & NVPL_ORDERED) && !c->out_bytes && !c->create_at && !sync_all())
        return send_call(c, NULL, 0);
    struct nvp_reply rep;
    int64_t e = send_call(c, &rep, c->out_bytes);
    if (e)
        return e;
    int64_t status = (fn->flags & NVPL_VALUE) ? (int64_t)rep.h.r[0] : (int64_t)(int32_t)rep.h.r[0];
    if (fn->flags & NVPL_VALUE) {
        memo_keep(c, status, NULL, NULL, 0);
        return status;
    }
    if (status == 0) {
        const unsigned char *outs = rep_buf;
        size_t outs_len = rep.out_len, off = 0;
        if (rep.h.r[2] & NVP_LIB_OUT_IN_R3) { /* (a reply without payload, which may come through the mailbox) */
            outs = (const unsigned char *)&rep.h.r[3];
            outs_len = sizeof rep.h.r[3];
        }
        for (int k = 0; k < c->nbufs; k++) {
            const struct nvpl_buf *b = &c->bufs[k];
            if (!(b->dir & NVPL_OUT))
                continue;
            if (off + b->len > outs_len)
                return lib_of(c)->internal;
            memcpy(b->user, outs + off, b->len);
            off += pad8(b->len);
        }
        memo_keep(c, status, NULL, outs, off);
        if (c->create_at) {
            struct hrec r = {.value = c->created, .kind = c->create_kind};
            pthread_mutex_lock(&hlock);
            hinsert(&r);
            pthread_mutex_unlock(&hlock);
            if (c->create_int) {
                int32_t v = (int32_t)c->created;
                memcpy(c->create_at, &v, sizeof v);
            } else {
                void *v = (void *)(uintptr_t)c->created;
                memcpy(c->create_at, &v, sizeof v);
            }
        }
        if (c->destroy_kind >= 0) {
            pthread_mutex_lock(&hlock);
            hremove(c->destroyed);
            pthread_mutex_unlock(&hlock);
        }
    }
    return with_posted_failure(c, &rep, status);
}

/* returned strings, each kept once */
struct kept {
    struct kept *next;
    char s[];
};
static struct kept *kept_strings;

const char *nvpl_end_string(struct nvpl_call *c)
{
    if (c->status)
        return NULL;
    const struct memo *m = memo_find(c);
    if (m)
        return m->str;
    struct nvp_reply rep;
    if (send_call(c, &rep, 1024) || !rep.out_len)
        return NULL;
    rep_buf[rep.out_len - 1] = 0;
    const char *s = (const char *)rep_buf;
    pthread_mutex_lock(&hlock);
    struct kept *k = kept_strings;
    while (k && strcmp(k->s, s) != 0)
        k = k->next;
    if (!k && (k = malloc(sizeof *k + strlen(s) + 1))) {
        strcpy(k->s, s);
        k->next = kept_strings;
        kept_strings = k;
    }
    pthread_mutex_unlock(&hlock);
    if (k)
        memo_keep(c, 0, k->s, NULL, 0);
    return k ? k->s : NULL;
}

int nvpl_fail(uint32_t fid)
{
    const struct nvpl_fn_info *fn = &nvpl_fns[fid];
    nvp_log("nvproxy: %s is not forwarded (%s); returning %s's \"not supported\" status", fn->name,
            fn->why ? fn->why : "not described", nvpl_libs[fn->lib].name);
    return nvpl_libs[fn->lib].not_supported;
}

/* ---- cuBLAS's host-device copies: the runtime's copies, done by the shim ---- */
#define BLAS_MAPPING_ERROR 11
#define BLAS_INVALID_VALUE 7

static int blas_copy(int64_t rows, int64_t cols, int64_t elem, const void *src, int64_t lds, void *dst, int64_t ldd,
                     enum cudaMemcpyKind kind, cudaStream_t stream, int async)
{
    if (rows < 0 || cols < 0 || elem <= 0 || lds < (rows > 1 ? rows : 1) || ldd < (rows > 1 ? rows : 1))
        return BLAS_INVALID_VALUE;
    if (!rows || !cols)
        return 0;
    size_t width = (size_t)rows * (size_t)elem, spitch = (size_t)lds * (size_t)elem;
    size_t dpitch = (size_t)ldd * (size_t)elem;
    cudaError_t e;
    if (spitch == width && dpitch == width) /* contiguous: one plain copy */
        e = async ? cudaMemcpyAsync(dst, src, width * (size_t)cols, kind, stream)
                  : cudaMemcpy(dst, src, width * (size_t)cols, kind);
    else
        e = async ? cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, (size_t)cols, kind, stream)
                  : cudaMemcpy2D(dst, dpitch, src, spitch, width, (size_t)cols, kind);
    return e == cudaSuccess ? 0 : BLAS_MAPPING_ERROR;
}

/* a strided vector is a matrix of one-element rows: n columns, ld = the increment */
static int blas_vector(int64_t n, int64_t elem, const void *src, int64_t incs, void *dst, int64_t incd,
                       enum cudaMemcpyKind kind, cudaStream_t stream, int async)
{
    if (incs <= 0 || incd <= 0 || elem <= 0)
        return BLAS_INVALID_VALUE;
    if (n <= 0)
        return 0;
    if (incs == 1 && incd == 1)
        return blas_copy(n, 1, elem, src, n, dst, n, kind, stream, async);
    return blas_copy(1, n, elem, src, incs, dst, incd, kind, stream, async);
}

#define H2D cudaMemcpyHostToDevice
#define D2H cudaMemcpyDeviceToHost
#define VEC(name, I, dir)                                                                                       \
    int32_t nvpl_local_##name(I n, I elemSize, void *x, I incx, void *y, I incy)                                \
    {                                                                                                           \
        return blas_vector(n, elemSize, x, incx, y, incy, dir, 0, 0);                                           \
    }                                                                                                           \
    int32_t nvpl_local_##name##Async(I n, I elemSize, void *x, I incx, void *y, I incy, void *stream)           \
    {                                                                                                           \
        return blas_vector(n, elemSize, x, incx, y, incy, dir, (cudaStream_t)stream, 1);                        \
    }
#define MAT(name, I, dir)                                                                                       \
    int32_t nvpl_local_##name(I rows, I cols, I elemSize, void *A, I lda, void *B, I ldb)                       \
    {                                                                                                           \
        return blas_copy(rows, cols, elemSize, A, lda, B, ldb, dir, 0, 0);                                      \
    }                                                                                                           \
    int32_t nvpl_local_##name##Async(I rows, I cols, I elemSize, void *A, I lda, void *B, I ldb, void *stream)  \
    {                                                                                                           \
        return blas_copy(rows, cols, elemSize, A, lda, B, ldb, dir, (cudaStream_t)stream, 1);                   \
    }

VEC(cublasSetVector, int32_t, H2D)
VEC(cublasGetVector, int32_t, D2H)
MAT(cublasSetMatrix, int32_t, H2D)
MAT(cublasGetMatrix, int32_t, D2H)

/* the _64 variants: Async comes before _64 in their names */
int32_t nvpl_local_cublasSetVector_64(int64_t n, int64_t e, void *x, int64_t ix, void *y, int64_t iy)
{
    return blas_vector(n, e, x, ix, y, iy, H2D, 0, 0);
}
int32_t nvpl_local_cublasGetVector_64(int64_t n, int64_t e, void *x, int64_t ix, void *y, int64_t iy)
{
    return blas_vector(n, e, x, ix, y, iy, D2H, 0, 0);
}
int32_t nvpl_local_cublasSetVectorAsync_64(int64_t n, int64_t e, void *x, int64_t ix, void *y, int64_t iy, void *s)
{
    return blas_vector(n, e, x, ix, y, iy, H2D, (cudaStream_t)s, 1);
}
int32_t nvpl_local_cublasGetVectorAsync_64(int64_t n, int64_t e, void *x, int64_t ix, void *y, int64_t iy, void *s)
{
    return blas_vector(n, e, x, ix, y, iy, D2H, (cudaStream_t)s, 1);
}
int32_t nvpl_local_cublasSetMatrix_64(int64_t r, int64_t c, int64_t e, void *A, int64_t lda, void *B, int64_t ldb)
{
    return blas_copy(r, c, e, A, lda, B, ldb, H2D, 0, 0);
}
int32_t nvpl_local_cublasGetMatrix_64(int64_t r, int64_t c, int64_t e, void *A, int64_t lda, void *B, int64_t ldb)
{
    return blas_copy(r, c, e, A, lda, B, ldb, D2H, 0, 0);
}
int32_t nvpl_local_cublasSetMatrixAsync_64(int64_t r, int64_t c, int64_t e, void *A, int64_t lda, void *B,
                                           int64_t ldb, void *s)
{
    return blas_copy(r, c, e, A, lda, B, ldb, H2D, (cudaStream_t)s, 1);
}
int32_t nvpl_local_cublasGetMatrixAsync_64(int64_t r, int64_t c, int64_t e, void *A, int64_t lda, void *B,
                                           int64_t ldb, void *s)
{
    return blas_copy(r, c, e, A, lda, B, ldb, D2H, (cudaStream_t)s, 1);
}
