/* Texture and surface objects.  Kernels take their values as plain parameters,
 * so the values are the driver's own: a restore makes every object again with
 * the value it had (checkpoint/restore.py), and the descriptors the program gave
 * are kept here to answer cudaGet*ObjectResourceDesc/TextureDesc. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

struct object {
    unsigned long long value;
    int surface;
    struct cudaResourceDesc res;
    struct cudaTextureDesc tex;
};

static struct {
    pthread_mutex_t lock;
    struct object *v;
    size_t n, cap;
} O = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static void remember(const struct object *o)
{
    pthread_mutex_lock(&O.lock);
    if (O.n == O.cap) {
        size_t cap = O.cap ? O.cap * 2 : 32;
        struct object *v = realloc(O.v, cap * sizeof *v);
        if (!v) { /* (only the descriptor queries lose it) */
            pthread_mutex_unlock(&O.lock);
            return;
        }
        O.v = v;
        O.cap = cap;
    }
    O.v[O.n++] = *o;
    pthread_mutex_unlock(&O.lock);
}

/* The record of a live object; drop: forget it.  0 if found. */
static int recall(unsigned long long value, int surface, struct object *out, int drop)
{
    int found = -1;
    pthread_mutex_lock(&O.lock);
    for (size_t i = 0; i < O.n && found; i++) {
        if (O.v[i].value != value || O.v[i].surface != surface)
            continue;
        found = 0;
        if (out)
            *out = O.v[i];
        if (drop)
            O.v[i] = O.v[--O.n];
    }
    pthread_mutex_unlock(&O.lock);
    return found;
}

static void wire_format(struct nvp_chan_fmt *w, const struct cudaChannelFormatDesc *f)
{
    struct nvp_chan_fmt x = {f->x, f->y, f->z, f->w, f->f};
    *w = x;
}

static cudaError_t create(int surface, unsigned long long *out, const struct cudaResourceDesc *res,
                          const struct cudaTextureDesc *tex, const struct cudaResourceViewDesc *view)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (!out || !res || (!surface && !tex))
        return cudaErrorInvalidValue;
    if (view)
        return nvp_unsupported("cudaCreateTextureObject with a resource view");
    struct nvp_tex_create c = {0};
    c.res_type = res->resType;
    uint32_t id;
    switch (res->resType) {
    case cudaResourceTypeArray:
        if (nvp_array_id(res->res.array.array, &id))
            return cudaErrorInvalidValue;
        c.res = id;
        break;
    case cudaResourceTypeLinear:
        if (surface)
            return cudaErrorInvalidValue;
        c.res = (uint64_t)(uintptr_t)res->res.linear.devPtr;
        wire_format(&c.fmt, &res->res.linear.desc);
        c.size = res->res.linear.sizeInBytes;
        break;
    case cudaResourceTypePitch2D:
        if (surface)
            return cudaErrorInvalidValue;
        c.res = (uint64_t)(uintptr_t)res->res.pitch2D.devPtr;
        wire_format(&c.fmt, &res->res.pitch2D.desc);
        c.width = res->res.pitch2D.width;
        c.height = res->res.pitch2D.height;
        c.pitch = res->res.pitch2D.pitchInBytes;
        break;
    case cudaResourceTypeMipmappedArray:
        return nvp_unsupported("texture and surface objects of mipmapped arrays");
    default:
        return cudaErrorInvalidValue;
    }
    if (tex) {
        memcpy(c.address, tex->addressMode, sizeof c.address);
        c.filter = tex->filterMode;
        c.read_mode = tex->readMode;
        c.srgb = tex->sRGB;
        memcpy(c.border, tex->borderColor, sizeof c.border);
        c.normalized = tex->normalizedCoords;
        c.max_aniso = tex->maxAnisotropy;
        c.mip_filter = tex->mipmapFilterMode;
        c.mip_bias = tex->mipmapLevelBias;
        c.mip_min = tex->minMipmapLevelClamp;
        c.mip_max = tex->maxMipmapLevelClamp;
        c.no_trilinear = tex->disableTrilinearOptimization;
        c.seamless = tex->seamlessCubemap;
    }
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)surface};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_TEX_CREATE, a, &c, sizeof c, &r, -1)))
        return e;
    struct object o;
    memset(&o, 0, sizeof o);
    o.value = r.h.r[0];
    o.surface = surface;
    o.res = *res;
    if (tex)
        o.tex = *tex;
    remember(&o);
    *out = o.value;
    return cudaSuccess;
}

static cudaError_t destroy(int surface, unsigned long long value)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (!value) /* no object: native CUDA succeeds, and codes destroy tables they never bound (GROMACS' PME) */
        return cudaSuccess;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)surface, value};
    struct nvp_reply r = {0};
    if (!(e = nvp_call(NVP_OP_TEX_DESTROY, a, NULL, 0, &r, -1)))
        recall(value, surface, NULL, 1);
    return e;
}

NVP_EXPORT cudaError_t cudaCreateTextureObject(cudaTextureObject_t *pTexObject, const struct cudaResourceDesc *pResDesc,
                                               const struct cudaTextureDesc *pTexDesc,
                                               const struct cudaResourceViewDesc *pResViewDesc)
{
    return nvp_ret(create(0, pTexObject, pResDesc, pTexDesc, pResViewDesc));
}

NVP_EXPORT cudaError_t cudaDestroyTextureObject(cudaTextureObject_t texObject) { return nvp_ret(destroy(0, texObject)); }

NVP_EXPORT cudaError_t cudaCreateSurfaceObject(cudaSurfaceObject_t *pSurfObject, const struct cudaResourceDesc *pResDesc)
{
    return nvp_ret(create(1, pSurfObject, pResDesc, NULL, NULL));
}

NVP_EXPORT cudaError_t cudaDestroySurfaceObject(cudaSurfaceObject_t surfObject) { return nvp_ret(destroy(1, surfObject)); }

static cudaError_t resource_desc(struct cudaResourceDesc *out, unsigned long long value, int surface)
{
    struct object o;
    if (!out || recall(value, surface, &o, 0))
        return nvp_ret(cudaErrorInvalidValue);
    *out = o.res;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGetTextureObjectResourceDesc(struct cudaResourceDesc *pResDesc,
                                                        cudaTextureObject_t texObject)
{
    return resource_desc(pResDesc, texObject, 0);
}

NVP_EXPORT cudaError_t cudaGetSurfaceObjectResourceDesc(struct cudaResourceDesc *pResDesc,
                                                        cudaSurfaceObject_t surfObject)
{
    return resource_desc(pResDesc, surfObject, 1);
}

NVP_EXPORT cudaError_t cudaGetTextureObjectTextureDesc(struct cudaTextureDesc *pTexDesc, cudaTextureObject_t texObject)
{
    struct object o;
    if (!pTexDesc || recall(texObject, 0, &o, 0))
        return nvp_ret(cudaErrorInvalidValue);
    *pTexDesc = o.tex;
    return cudaSuccess;
}
