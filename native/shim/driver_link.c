/* Host work only a driver can do, done by the proxy's: linking device code at run time (cuLink*) and encoding
 * tensor-map descriptors (cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col).
 *
 * A link gathers its inputs here, in the program's memory, and cuLinkComplete sends them all to the proxy, whose
 * driver links them in one go and sends the image back.  So no link is ever half done in the proxy (a checkpoint
 * between cuLinkAddData and cuLinkComplete has nothing of it to save), and the image is a module like any other
 * once the program loads it (cuModuleLoadData records it).  A consequence: an input the driver cannot compile
 * fails at cuLinkComplete rather than at its cuLinkAddData. */
#include "driver.h"

#include <stdlib.h>

#define LINK_MAGIC 0x6e76706cu

struct input {
    uint32_t type;
    char *name;
    void *data;
    size_t size;
};

struct link {
    uint32_t magic;
    struct input *in;
    size_t n, cap;
    void *image; /* cuLinkComplete's, the link's until cuLinkDestroy */
    struct link *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct link *links; /* live ones (a handle is looked up, never read, until known) */

static struct link *known(CUlinkState state)
{
    pthread_mutex_lock(&lock);
    struct link *l = links;
    while (l && l != (struct link *)state)
        l = l->next;
    pthread_mutex_unlock(&lock);
    return l;
}

static CUresult create(unsigned n, CUjit_option *options, void **values, CUlinkState *out)
{
    NVP_DRV_ENTER(1);
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = nvp_drv_jit_options(n, options, values);
    if (r)
        return r;
    struct link *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = LINK_MAGIC;
    pthread_mutex_lock(&lock);
    l->next = links;
    links = l;
    pthread_mutex_unlock(&lock);
    *out = (CUlinkState)l;
    return CUDA_SUCCESS;
}

#undef cuLinkCreate
NVP_EXPORT CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues,
                                            CUlinkState *stateOut)
{
    return create(numOptions, options, optionValues, stateOut);
}

NVP_EXPORT CUresult CUDAAPI cuLinkCreate(unsigned int numOptions, CUjit_option *options, void **optionValues,
                                         CUlinkState *stateOut)
{
    return create(numOptions, options, optionValues, stateOut);
}

/* keep a copy of an input (the program may free its own once the call returns) */
static CUresult add(CUlinkState state, CUjitInputType type, const void *data, size_t size, const char *name,
                    unsigned n, CUjit_option *options, void **values)
{
    NVP_DRV_ENTER(1);
    struct link *l = known(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!data || !size || (unsigned)type >= CU_JIT_NUM_INPUT_TYPES)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = nvp_drv_jit_options(n, options, values);
    if (r)
        return r;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        struct input *v = realloc(l->in, cap * sizeof *v);
        if (!v)
            return CUDA_ERROR_OUT_OF_MEMORY;
        l->in = v;
        l->cap = cap;
    }
    struct input *in = &l->in[l->n];
    in->type = (uint32_t)type;
    in->name = strdup(name ? name : "");
    in->data = malloc(size);
    if (!in->name || !in->data) {
        free(in->name);
        free(in->data);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(in->data, data, size);
    in->size = size;
    l->n++;
    return CUDA_SUCCESS;
}

#undef cuLinkAddData
NVP_EXPORT CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                             const char *name, unsigned int numOptions, CUjit_option *options,
                                             void **optionValues)
{
    return add(state, type, data, size, name, numOptions, options, optionValues);
}

NVP_EXPORT CUresult CUDAAPI cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                          const char *name, unsigned int numOptions, CUjit_option *options,
                                          void **optionValues)
{
    return add(state, type, data, size, name, numOptions, options, optionValues);
}

static CUresult add_file(CUlinkState state, CUjitInputType type, const char *path, unsigned n,
                         CUjit_option *options, void **values)
{
    NVP_DRV_ENTER(1);
    if (!known(state))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!path)
        return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t size;
    CUresult r = nvp_drv_read_file(path, &buf, &size);
    if (r)
        return r;
    /* (PTX text goes with its terminating NUL, as a program's cuLinkAddData of it does) */
    r = add(state, type, buf, type == CU_JIT_INPUT_PTX ? size + 1 : size, path, n, options, values);
    free(buf);
    return r;
}

#undef cuLinkAddFile
NVP_EXPORT CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path,
                                             unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    return add_file(state, type, path, numOptions, options, optionValues);
}

NVP_EXPORT CUresult CUDAAPI cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path,
                                          unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    return add_file(state, type, path, numOptions, options, optionValues);
}

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* DRV_LINK's payload: each input's header, name and data */
static char *pack(const struct link *l, size_t *len)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        n += 16 + pad8(strlen(l->in[i].name)) + pad8(l->in[i].size);
    char *p = calloc(1, n ? n : 1), *at = p;
    for (size_t i = 0; p && i < l->n; i++) {
        const struct input *in = &l->in[i];
        uint32_t head[2] = {in->type, (uint32_t)strlen(in->name)};
        uint64_t size = in->size;
        memcpy(at, head, 8);
        memcpy(at + 8, &size, 8);
        memcpy(at + 16, in->name, head[1]);
        at += 16 + pad8(head[1]);
        memcpy(at, in->data, in->size);
        at += pad8(in->size);
    }
    *len = n;
    return p;
}

#undef cuLinkComplete
NVP_EXPORT CUresult CUDAAPI cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    NVP_DRV_ENTER(1);
    struct link *l = known(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cubinOut || !sizeOut || !l->n)
        return CUDA_ERROR_INVALID_VALUE;
    size_t len;
    char *payload = pack(l, &len);
    if (!payload)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t a[NVP_MAX_ARGS] = {l->n};
    size_t cap = 2 * len + (1u << 20);
    cudaError_t e = cudaSuccess;
    struct nvp_reply rep = {0};
    for (int tries = 0; tries < 2; tries++) { /* (again, with room enough, if the image was larger than guessed) */
        void *out = malloc(cap);
        if (!out) {
            e = cudaErrorMemoryAllocation;
            break;
        }
        rep = (struct nvp_reply){.out = out, .out_cap = cap};
        e = nvp_call(NVP_OP_DRV_LINK, a, payload, len, &rep, -1);
        if (e || rep.h.r[0] <= rep.out_len) {
            if (!e) {
                free(l->image);
                l->image = out;
            } else {
                free(out);
            }
            break;
        }
        free(out);
        cap = rep.h.r[0];
    }
    free(payload);
    if (e)
        return nvp_drv_done(nvp_drv_code(e));
    *cubinOut = l->image;
    *sizeOut = rep.out_len;
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuLinkDestroy
NVP_EXPORT CUresult CUDAAPI cuLinkDestroy(CUlinkState state)
{
    NVP_DRV_ENTER(0);
    pthread_mutex_lock(&lock);
    struct link **pl = &links;
    while (*pl && *pl != (struct link *)state)
        pl = &(*pl)->next;
    struct link *l = *pl;
    if (l)
        *pl = l->next;
    pthread_mutex_unlock(&lock);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < l->n; i++) {
        free(l->in[i].name);
        free(l->in[i].data);
    }
    free(l->in);
    free(l->image);
    free(l);
    return CUDA_SUCCESS;
}

/* ---- tensor maps ---- */

static CUresult tensor_map(CUtensorMap *map, int im2col, struct nvp_tensor_map *t, const cuuint64_t *dims,
                           const cuuint64_t *strides, const cuuint32_t *elem_strides)
{
    NVP_DRV_ENTER(0);
    if (!map || (uintptr_t)map % 64 || t->rank < 1 || t->rank > 5 || !dims || !elem_strides ||
        (t->rank > 1 && !strides))
        return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i < t->rank; i++) {
        t->dims[i] = dims[i];
        t->elem_strides[i] = elem_strides[i];
        if (i + 1 < t->rank)
            t->strides[i] = strides[i];
    }
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)im2col};
    struct nvp_reply rep = {.out = map, .out_cap = sizeof *map};
    cudaError_t e = nvp_call(NVP_OP_DRV_TENSOR_MAP, a, t, sizeof *t, &rep, -1);
    if (!e && rep.out_len != sizeof *map)
        e = cudaErrorUnknown;
    return nvp_drv_done(nvp_drv_code(e));
}

#undef cuTensorMapEncodeTiled
NVP_EXPORT CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                                   cuuint32_t tensorRank, void *globalAddress,
                                                   const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                                   const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
                                                   CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                                   CUtensorMapL2promotion l2Promotion,
                                                   CUtensorMapFloatOOBfill oobFill)
{
    struct nvp_tensor_map t = {.data_type = tensorDataType, .rank = tensorRank,
                               .address = (uint64_t)(uintptr_t)globalAddress, .interleave = interleave,
                               .swizzle = swizzle, .l2_promotion = l2Promotion, .oob_fill = oobFill};
    if (!boxDim || tensorRank < 1 || tensorRank > 5)
        return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i < tensorRank; i++)
        t.box[i] = boxDim[i];
    return tensor_map(tensorMap, 0, &t, globalDim, globalStrides, elementStrides);
}

#undef cuTensorMapEncodeIm2col
NVP_EXPORT CUresult CUDAAPI cuTensorMapEncodeIm2col(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                                    cuuint32_t tensorRank, void *globalAddress,
                                                    const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                                    const int *pixelBoxLowerCorner, const int *pixelBoxUpperCorner,
                                                    cuuint32_t channelsPerPixel, cuuint32_t pixelsPerColumn,
                                                    const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
                                                    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                                    CUtensorMapFloatOOBfill oobFill)
{
    struct nvp_tensor_map t = {.data_type = tensorDataType, .rank = tensorRank,
                               .address = (uint64_t)(uintptr_t)globalAddress, .channels = channelsPerPixel,
                               .pixels = pixelsPerColumn, .interleave = interleave, .swizzle = swizzle,
                               .l2_promotion = l2Promotion, .oob_fill = oobFill};
    /* (the corners have one coordinate per spatial dimension: the rank less channels and batch) */
    if (!pixelBoxLowerCorner || !pixelBoxUpperCorner || tensorRank < 3 || tensorRank > 5)
        return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i + 2 < tensorRank; i++) {
        t.lower[i] = pixelBoxLowerCorner[i];
        t.upper[i] = pixelBoxUpperCorner[i];
    }
    return tensor_map(tensorMap, 1, &t, globalDim, globalStrides, elementStrides);
}
