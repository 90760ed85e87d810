/* CUDA arrays (cudaMallocArray, cudaMalloc3DArray) and every copy that has an
 * array on one side or both.  An array is an nvproxy handle (the application
 * only hands it back to the runtime); the proxy keeps the driver's array, its
 * contents go into checkpoint images, and a restore makes it again under the
 * same handle.  Pageable host memory goes through the thread's staging buffer
 * a block of rows at a time; device and pinned memory are copied directly. */
#include "shim.h"

#include <string.h>

struct array_rec {
    struct cudaChannelFormatDesc fmt;
    unsigned flags;
    uint64_t width;
    uint32_t height, depth;
    int device;
    uint32_t elem; /* bytes per element */
};

/* Bytes per element of a channel format the driver can make arrays of. */
static cudaError_t format_size(const struct cudaChannelFormatDesc *f, uint32_t *elem)
{
    int bits[4] = {f->x, f->y, f->z, f->w}, n = 0;
    for (int i = 0; i < 4; i++) {
        if (!bits[i])
            continue;
        if (i != n || bits[i] != bits[0])
            return cudaErrorInvalidChannelDescriptor;
        n++;
    }
    if (n == 0 || n == 3)
        return cudaErrorInvalidChannelDescriptor;
    switch (f->f) {
    case cudaChannelFormatKindSigned:
    case cudaChannelFormatKindUnsigned:
        if (bits[0] != 8 && bits[0] != 16 && bits[0] != 32)
            return cudaErrorInvalidChannelDescriptor;
        break;
    case cudaChannelFormatKindFloat:
        if (bits[0] != 16 && bits[0] != 32)
            return cudaErrorInvalidChannelDescriptor;
        break;
    case cudaChannelFormatKindNone:
        return cudaErrorInvalidChannelDescriptor;
    default: /* NV12, the block-compressed and normalized-integer kinds */
        return nvp_unsupported("CUDA arrays of this cudaChannelFormatKind");
    }
    *elem = (uint32_t)(n * bits[0] / 8);
    return cudaSuccess;
}

int nvp_array_id(cudaArray_const_t a, uint32_t *id)
{
    if (nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)a, NULL, 0))
        return -1;
    *id = nvp_handle_id((uint64_t)(uintptr_t)a);
    return 0;
}

static cudaError_t array_create(cudaArray_t *out, const struct cudaChannelFormatDesc *desc, size_t width,
                                size_t height, size_t depth, unsigned flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (!out || !desc || width == 0 || height > UINT32_MAX || depth > UINT32_MAX)
        return cudaErrorInvalidValue;
    struct array_rec rec = {*desc, flags, width, (uint32_t)height, (uint32_t)depth, nvp_current_device(), 0};
    if ((e = format_size(desc, &rec.elem)))
        return e;
    uint64_t h = nvp_handle_new(NVP_H_ARRAY, &rec, sizeof rec);
    if (!h)
        return cudaErrorMemoryAllocation;
    struct nvp_array_desc d = {width, height, depth, {desc->x, desc->y, desc->z, desc->w, desc->f}, flags};
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(h)};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_ARRAY_CREATE, a, &d, sizeof d, &r, -1))) {
        nvp_handle_free(NVP_H_ARRAY, h);
        return e;
    }
    *out = (cudaArray_t)(uintptr_t)h;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc, size_t width,
                                       size_t height, unsigned int flags)
{
    return nvp_ret(array_create(array, desc, width, height, 0, flags));
}

NVP_EXPORT cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                         struct cudaExtent extent, unsigned int flags)
{
    return nvp_ret(array_create(array, desc, extent.width, extent.height, extent.depth, flags));
}

NVP_EXPORT cudaError_t cudaFreeArray(cudaArray_t array)
{
    cudaError_t e = nvp_enter();
    if (e || !array)
        return nvp_ret(e);
    uint32_t id;
    if (nvp_array_id(array, &id))
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {id};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_ARRAY_DESTROY, a, NULL, 0, &r, -1);
    if (!e)
        nvp_handle_free(NVP_H_ARRAY, (uint64_t)(uintptr_t)array);
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaArrayGetInfo(struct cudaChannelFormatDesc *desc, struct cudaExtent *extent,
                                        unsigned int *flags, cudaArray_t array)
{
    struct array_rec rec;
    if (nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)array, &rec, sizeof rec))
        return nvp_ret(cudaErrorInvalidValue);
    if (desc)
        *desc = rec.fmt;
    if (extent) {
        struct cudaExtent x = {rec.width, rec.height, rec.depth};
        *extent = x;
    }
    if (flags)
        *flags = rec.flags;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGetChannelDesc(struct cudaChannelFormatDesc *desc, cudaArray_const_t array)
{
    struct array_rec rec;
    if (!desc || nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)array, &rec, sizeof rec))
        return nvp_ret(cudaErrorInvalidValue);
    *desc = rec.fmt;
    return cudaSuccess;
}

/* ---- copies ---- */

struct side {
    int is_array;
    struct array_rec arr;
    uint64_t addr;               /* linear: the application's pointer; array: its wire id */
    size_t pitch, rows, x, y, z; /* x in bytes; pitch and rows: linear memory only */
};

static cudaError_t array_side(struct side *s, cudaArray_const_t a, size_t x_bytes, size_t y, size_t z)
{
    memset(s, 0, sizeof *s);
    if (nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)a, &s->arr, sizeof s->arr))
        return cudaErrorInvalidValue;
    s->is_array = 1;
    s->addr = nvp_handle_id((uint64_t)(uintptr_t)a);
    s->x = x_bytes;
    s->y = y;
    s->z = z;
    return cudaSuccess;
}

static struct side linear_side(const void *p, size_t pitch, size_t rows, size_t x, size_t y, size_t z)
{
    struct side s = {0};
    s.addr = (uint64_t)(uintptr_t)p;
    s.pitch = pitch;
    s.rows = rows;
    s.x = x;
    s.y = y;
    s.z = z;
    return s;
}

static struct nvp_copy_side wire_side(const struct side *s, size_t dy, size_t dz)
{
    struct nvp_copy_side w = {s->is_array ? NVP_SIDE_ARRAY : NVP_SIDE_LINEAR, s->addr, s->pitch, s->rows,
                              s->x, s->y + dy, s->z + dz};
    return w;
}

static size_t max1(size_t v) { return v ? v : 1; }

/* Is the region inside its array, or inside memory the application may copy (linear)? */
static cudaError_t check_side(const struct side *s, size_t w, size_t h, size_t d, int *pageable)
{
    *pageable = 0;
    if (s->is_array) {
        uint64_t row = s->arr.width * s->arr.elem;
        if (s->x > row || w > row - s->x || s->y + h > max1(s->arr.height) || s->z + d > max1(s->arr.depth))
            return cudaErrorInvalidValue;
        return cudaSuccess;
    }
    if (!s->addr || (d > 1 && h + s->y > s->rows))
        return cudaErrorInvalidValue;
    if (w > s->pitch)
        return cudaErrorInvalidPitchValue;
    uint64_t first = s->addr + (s->z * s->rows + s->y) * s->pitch + s->x;
    uint64_t span = ((d - 1) * s->rows + (h - 1)) * s->pitch + w;
    if (nvp_in_arena(first) && !nvp_alloc_contains(first, span))
        return cudaErrorInvalidValue;
    *pageable = !nvp_is_device_ptr(first) && !nvp_host_shared(first, span, NULL);
    return cudaSuccess;
}

/* Rows of pageable memory through the staging buffer, one block of rows per request. */
static cudaError_t staged(const struct side *lin, const struct side *arr, int to_array, size_t w, size_t h,
                          size_t d, int64_t stream)
{
    struct nvp_staging *st;
    cudaError_t e = nvp_staging(&st);
    if (e || (e = nvp_posted_quiet(st)))
        return e;
    if (w > st->slot_size)
        return nvp_unsupported("a pageable copy of CUDA array rows longer than a staging slot");
    size_t per = st->slot_size / w;
    for (size_t z = 0; z < d; z++) {
        for (size_t y = 0; y < h; y += per) {
            size_t rows = h - y < per ? h - y : per;
            char *host = (char *)(uintptr_t)lin->addr + ((lin->z + z) * lin->rows + lin->y + y) * lin->pitch + lin->x;
            struct nvp_copy_side stage = {NVP_SIDE_STAGING, 0, w, rows, 0, 0, 0};
            struct nvp_copy3d c = {stage, wire_side(arr, y, z), w, rows, 1};
            if (to_array) {
                for (size_t k = 0; k < rows; k++)
                    memcpy(st->base + k * w, host + k * lin->pitch, w);
            } else {
                c.dst = stage;
                c.src = wire_side(arr, y, z);
            }
            uint64_t a[NVP_MAX_ARGS] = {(uint64_t)stream};
            struct nvp_reply r = {0};
            if ((e = nvp_call(NVP_OP_COPY_3D, a, &c, sizeof c, &r, -1)))
                return e;
            if (!to_array)
                for (size_t k = 0; k < rows; k++)
                    memcpy(host + k * lin->pitch, st->base + k * w, w);
        }
    }
    return cudaSuccess;
}

struct staged_call {
    const struct side *lin, *arr;
    int to_array;
    size_t w, h, d;
    int64_t stream;
};

static cudaError_t staged_once(void *arg)
{
    const struct staged_call *c = arg;
    return staged(c->lin, c->arr, c->to_array, c->w, c->h, c->d, c->stream);
}

static cudaError_t copy3d(const struct side *src, const struct side *dst, size_t w, size_t h, size_t d,
                          enum cudaMemcpyKind kind, int64_t stream, int is_async)
{
    cudaError_t e = nvp_copy_entry(kind, stream);
    if (e)
        return e;
    if (!w || !h || !d)
        return cudaSuccess;
    int spage, dpage;
    if ((e = check_side(src, w, h, d, &spage)) || (e = check_side(dst, w, h, d, &dpage)))
        return e;
    if (spage || dpage) { /* one exchange: the staging buffer holds rows between two requests */
        struct staged_call c = {spage ? src : dst, spage ? dst : src, spage, w, h, d, stream};
        return nvp_exchange(staged_once, &c);
    }
    struct nvp_copy3d c = {wire_side(src, 0, 0), wire_side(dst, 0, 0), w, h, d};
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)stream};
    struct nvp_reply r = {0};
    return nvp_call(NVP_OP_COPY_3D, a, &c, sizeof c, is_async ? NULL : &r, -1);
}

/* cudaMemcpy3D(Async) with an array on either side (memory.c does linear memory). */
cudaError_t nvp_copy3d_arrays(const struct cudaMemcpy3DParms *p, int64_t stream, int is_async)
{
    struct side src, dst;
    cudaError_t e;
    size_t elem = 1;
    if (p->srcArray) {
        if ((e = array_side(&src, p->srcArray, 0, p->srcPos.y, p->srcPos.z)))
            return e;
        elem = src.arr.elem;
        src.x = p->srcPos.x * elem;
    }
    if (p->dstArray) {
        if ((e = array_side(&dst, p->dstArray, 0, p->dstPos.y, p->dstPos.z)))
            return e;
        if (!p->srcArray)
            elem = dst.arr.elem;
        dst.x = p->dstPos.x * dst.arr.elem;
    }
    /* positions in elements of an array, in bytes of linear memory; the width in elements */
    if (!p->srcArray)
        src = linear_side(p->srcPtr.ptr, p->srcPtr.pitch, p->srcPtr.ysize, p->srcPos.x, p->srcPos.y, p->srcPos.z);
    if (!p->dstArray)
        dst = linear_side(p->dstPtr.ptr, p->dstPtr.pitch, p->dstPtr.ysize, p->dstPos.x, p->dstPos.y, p->dstPos.z);
    return copy3d(&src, &dst, p->extent.width * elem, p->extent.height, p->extent.depth, p->kind, stream, is_async);
}

static cudaError_t to_array_2d(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src, size_t spitch,
                               size_t width, size_t height, enum cudaMemcpyKind kind, int64_t stream, int is_async)
{
    struct side a, l = linear_side(src, spitch, height, 0, 0, 0);
    cudaError_t e = array_side(&a, dst, wOffset, hOffset, 0);
    return e ? e : copy3d(&l, &a, width, height, 1, kind, stream, is_async);
}

static cudaError_t from_array_2d(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                                 size_t width, size_t height, enum cudaMemcpyKind kind, int64_t stream, int is_async)
{
    struct side a, l = linear_side(dst, dpitch, height, 0, 0, 0);
    cudaError_t e = array_side(&a, src, wOffset, hOffset, 0);
    return e ? e : copy3d(&a, &l, width, height, 1, kind, stream, is_async);
}

/* cudaMemcpy{To,From}Array: count bytes in row-major order from (wOffset, hOffset): a
 * partial first row, whole rows, a partial last row. */
static cudaError_t linear_array(cudaArray_const_t arr, size_t wOffset, size_t hOffset, void *p, size_t count,
                                enum cudaMemcpyKind kind, int64_t stream, int is_async, int to_array)
{
    struct array_rec rec;
    if (nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)arr, &rec, sizeof rec))
        return cudaErrorInvalidValue;
    size_t row = rec.width * rec.elem;
    if (wOffset > row || hOffset >= max1(rec.height) || count > (max1(rec.height) - hOffset) * row - wOffset)
        return cudaErrorInvalidValue;
    char *q = p;
    while (count) {
        size_t w = wOffset ? row - wOffset : row, h = 1;
        if (count < w)
            w = count;
        else if (!wOffset && count >= row)
            h = count / row;
        cudaError_t e = to_array ? to_array_2d((cudaArray_t)arr, wOffset, hOffset, q, w, w, h, kind, stream, is_async)
                                 : from_array_2d(q, w, arr, wOffset, hOffset, w, h, kind, stream, is_async);
        if (e)
            return e;
        q += w * h;
        count -= w * h;
        hOffset += h;
        wOffset = 0;
    }
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMemcpy2DToArray(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                           size_t spitch, size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return nvp_ret(to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy2DToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                                size_t spitch, size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return nvp_ret(to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, NVP_STREAM_PER_THREAD, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy2DToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                                size_t spitch, size_t width, size_t height, enum cudaMemcpyKind kind,
                                                cudaStream_t stream)
{
    return nvp_ret(to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, nvp_stream_wire(stream, 0), 1));
}

NVP_EXPORT cudaError_t cudaMemcpy2DToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                                     const void *src, size_t spitch, size_t width, size_t height,
                                                     enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, nvp_stream_wire(stream, 1), 1));
}

NVP_EXPORT cudaError_t cudaMemcpy2DFromArray(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                                             size_t hOffset, size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return nvp_ret(from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, NVP_STREAM_LEGACY, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy2DFromArray_ptds(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                                                  size_t hOffset, size_t width, size_t height,
                                                  enum cudaMemcpyKind kind)
{
    return nvp_ret(from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, NVP_STREAM_PER_THREAD, 0));
}

NVP_EXPORT cudaError_t cudaMemcpy2DFromArrayAsync(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                                                  size_t hOffset, size_t width, size_t height,
                                                  enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(
        from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, nvp_stream_wire(stream, 0), 1));
}

NVP_EXPORT cudaError_t cudaMemcpy2DFromArrayAsync_ptsz(void *dst, size_t dpitch, cudaArray_const_t src,
                                                       size_t wOffset, size_t hOffset, size_t width, size_t height,
                                                       enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(
        from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, nvp_stream_wire(stream, 1), 1));
}

NVP_EXPORT cudaError_t cudaMemcpyToArray(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                         size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(linear_array(dst, wOffset, hOffset, (void *)src, count, kind, NVP_STREAM_LEGACY, 0, 1));
}

NVP_EXPORT cudaError_t cudaMemcpyToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                              size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(linear_array(dst, wOffset, hOffset, (void *)src, count, kind, NVP_STREAM_PER_THREAD, 0, 1));
}

NVP_EXPORT cudaError_t cudaMemcpyToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                              size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(linear_array(dst, wOffset, hOffset, (void *)src, count, kind, nvp_stream_wire(stream, 0), 1, 1));
}

NVP_EXPORT cudaError_t cudaMemcpyToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                                   size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(linear_array(dst, wOffset, hOffset, (void *)src, count, kind, nvp_stream_wire(stream, 1), 1, 1));
}

NVP_EXPORT cudaError_t cudaMemcpyFromArray(void *dst, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                                           size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(linear_array(src, wOffset, hOffset, dst, count, kind, NVP_STREAM_LEGACY, 0, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyFromArray_ptds(void *dst, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                                                size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(linear_array(src, wOffset, hOffset, dst, count, kind, NVP_STREAM_PER_THREAD, 0, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyFromArrayAsync(void *dst, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                                                size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return nvp_ret(linear_array(src, wOffset, hOffset, dst, count, kind, nvp_stream_wire(stream, 0), 1, 0));
}

NVP_EXPORT cudaError_t cudaMemcpyFromArrayAsync_ptsz(void *dst, cudaArray_const_t src, size_t wOffset,
                                                     size_t hOffset, size_t count, enum cudaMemcpyKind kind,
                                                     cudaStream_t stream)
{
    return nvp_ret(linear_array(src, wOffset, hOffset, dst, count, kind, nvp_stream_wire(stream, 1), 1, 0));
}

static cudaError_t array_to_array_2d(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst, cudaArray_const_t src,
                                     size_t wOffsetSrc, size_t hOffsetSrc, size_t width, size_t height,
                                     enum cudaMemcpyKind kind, int64_t stream)
{
    struct side s, d;
    cudaError_t e;
    if ((e = array_side(&s, src, wOffsetSrc, hOffsetSrc, 0)) || (e = array_side(&d, dst, wOffsetDst, hOffsetDst, 0)))
        return e;
    return copy3d(&s, &d, width, height, 1, kind, stream, 0);
}

NVP_EXPORT cudaError_t cudaMemcpy2DArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                                cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc,
                                                size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return nvp_ret(array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width, height, kind,
                                     NVP_STREAM_LEGACY));
}

NVP_EXPORT cudaError_t cudaMemcpy2DArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                                     cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc,
                                                     size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return nvp_ret(array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width, height, kind,
                                     NVP_STREAM_PER_THREAD));
}

/* count bytes in row-major order: as one block of rows where both offsets start a row
 * and the count is whole rows of both, or within one row of each */
static cudaError_t array_to_array(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst, cudaArray_const_t src,
                                  size_t wOffsetSrc, size_t hOffsetSrc, size_t count, enum cudaMemcpyKind kind,
                                  int64_t stream)
{
    struct array_rec s, d;
    if (nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)src, &s, sizeof s) ||
        nvp_handle_get(NVP_H_ARRAY, (uint64_t)(uintptr_t)dst, &d, sizeof d))
        return cudaErrorInvalidValue;
    size_t srow = s.width * s.elem, drow = d.width * d.elem;
    if (!wOffsetSrc && !wOffsetDst && srow == drow && count % srow == 0)
        return array_to_array_2d(dst, 0, hOffsetDst, src, 0, hOffsetSrc, srow, count / srow, kind, stream);
    if (wOffsetSrc + count <= srow && wOffsetDst + count <= drow)
        return array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count, 1, kind, stream);
    return nvp_unsupported("cudaMemcpyArrayToArray across rows of arrays of different widths");
}

NVP_EXPORT cudaError_t cudaMemcpyArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                              cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc,
                                              size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(
        array_to_array(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count, kind, NVP_STREAM_LEGACY));
}

NVP_EXPORT cudaError_t cudaMemcpyArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                                   cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc,
                                                   size_t count, enum cudaMemcpyKind kind)
{
    return nvp_ret(
        array_to_array(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count, kind, NVP_STREAM_PER_THREAD));
}
