/* Graph memory: memory-allocation and memory-free nodes, and cudaFreeAsync
 * taken by a stream capture.  The memory comes from the proxy's arena when the
 * node is added (so it keeps its address across a restore, as a pool allocation
 * does); the nodes themselves are empty nodes to the driver.  Native CUDA maps
 * the memory at each launch of the graph and unmaps it where it is freed (a free
 * node, or the program's cudaFree after the launch); here it stays mapped while
 * anything may still use it:
 *  - memory a graph frees (a free node, a captured cudaFreeAsync) is held by that
 *    graph and the executable graphs instantiated from it, and freed when the
 *    last of them is destroyed;
 *  - memory of an allocation node is held by its graph and their executable
 *    graphs: the program's cudaFree of it only marks it free (the next launch
 *    makes it again, at the same address, as natively), and it goes once it is
 *    marked free and they are destroyed.
 * Rows of (pointer, owner) record this. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

struct hold {
    uint64_t ptr;
    int kind; /* enum nvp_owner */
    uint64_t id; /* capture id, graph or executable graph wire id */
    uint64_t size; /* NVP_OWN_ALLOC_NODE: the allocation's (for the statistics) */
    int host;      /* pinned host memory staging a pageable copy node (freed with cudaFreeHost) */
};

static struct hold *holds;
static size_t nholds, capholds;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t used, used_high; /* bytes allocated by memory-allocation nodes (cudaGraphMemAttr*) */

/* drops the rows marked gone (kind 0) */
static void compact_locked(void)
{
    size_t k = 0;
    for (size_t i = 0; i < nholds; i++)
        if (holds[i].kind)
            holds[k++] = holds[i];
    __atomic_store_n(&nholds, k, __ATOMIC_RELAXED);
}

static int holder(int kind) /* (NVP_OWN_FREED and NVP_OWN_SIZE rows hold nothing) */
{
    return kind == NVP_OWN_CAPTURE || kind == NVP_OWN_GRAPH || kind == NVP_OWN_EXEC || kind == NVP_OWN_ALLOC_NODE ||
           kind == NVP_OWN_ALLOC_EXEC;
}

static int has_row(uint64_t ptr, int kind)
{
    for (size_t i = 0; i < nholds; i++)
        if (holds[i].ptr == ptr && holds[i].kind == kind)
            return 1;
    return 0;
}

static void add_locked(uint64_t ptr, int kind, uint64_t id, uint64_t size, int host)
{
    if (nholds == capholds) {
        size_t cap = capholds ? 2 * capholds : 32;
        struct hold *v = realloc(holds, cap * sizeof *v);
        if (!v)
            return; /* (the memory then stays allocated: a leak, never a double free) */
        holds = v;
        capholds = cap;
    }
    holds[nholds] = (struct hold){ptr, kind, id, size, host};
    __atomic_store_n(&nholds, nholds + 1, __ATOMIC_RELAXED); /* (read without the lock: fast paths) */
}

void nvp_graph_mem_hold(uint64_t ptr, int kind, uint64_t id, int host)
{
    pthread_mutex_lock(&lock);
    add_locked(ptr, kind, id, 0, host);
    pthread_mutex_unlock(&lock);
}

/* What owner from holds goes to owner to as well (instantiation), or instead (move: a capture's graph);
 * to == 0 with move drops the holds (an invalidated capture frees nothing, as natively). */
void nvp_graph_mem_pass(int from, uint64_t from_id, int to, uint64_t to_id, int move)
{
    uint64_t staging[64];
    size_t nstaging = 0;
    pthread_mutex_lock(&lock);
    size_t n = nholds;
    for (size_t i = 0; i < n; i++) {
        if (holds[i].kind != from || holds[i].id != from_id)
            continue;
        if (move && to) {
            holds[i] = (struct hold){holds[i].ptr, to, to_id, 0, holds[i].host};
        } else if (move) {
            if (holds[i].host && nstaging < sizeof staging / sizeof *staging) /* (no graph will use it) */
                staging[nstaging++] = holds[i].ptr;
            holds[i].kind = 0;
        } else {
            add_locked(holds[i].ptr, to, to_id, 0, holds[i].host);
        }
    }
    compact_locked();
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < nstaging; i++)
        cudaFreeHost((void *)(uintptr_t)staging[i]);
}

/* Does owner (kind, id) hold device memory (id 0 with NVP_OWN_CAPTURE: does any capture hold anything,
 * staging too)? */
int nvp_graph_mem_holds(int kind, uint64_t id)
{
    int found = 0, capture = kind == NVP_OWN_CAPTURE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nholds && !found; i++)
        found = (capture || !holds[i].host) && holds[i].kind == kind && (holds[i].id == id || (capture && id == 0));
    pthread_mutex_unlock(&lock);
    return found;
}

/* Owner (kind, id) is gone: memory nothing else holds is freed. */
void nvp_graph_mem_release(int kind, uint64_t id)
{
    struct hold *gone = NULL;
    size_t ngone = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nholds; i++) {
        if (holds[i].kind != kind || holds[i].id != id)
            continue;
        uint64_t p = holds[i].ptr;
        int frees_it = kind != NVP_OWN_ALLOC_NODE && kind != NVP_OWN_ALLOC_EXEC;
        holds[i].kind = 0;
        int still = 0;
        for (size_t j = 0; j < nholds && !still; j++)
            still = holds[j].ptr == p && holder(holds[j].kind);
        if (still && frees_it && !has_row(p, NVP_OWN_FREED)) /* (the graphs that make it free it when they go) */
            add_locked(p, NVP_OWN_FREED, 0, 0, 0);
        if (!still && (frees_it || has_row(p, NVP_OWN_FREED))) {
            struct hold *v = realloc(gone, (ngone + 1) * sizeof *v);
            if (v) {
                gone = v;
                gone[ngone++] = holds[i];
            }
        }
    }
    compact_locked();
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < ngone; i++) { /* (cudaFree takes the allocation node's hold and statistics too) */
        void *p = (void *)(uintptr_t)gone[i].ptr;
        if (gone[i].host)
            cudaFreeHost(p);
        else
            cudaFree(p);
    }
    free(gone);
}

/* The program frees ptr: 1 if it is an allocation node's that a graph still holds (only marked free). */
int nvp_graph_mem_user_free(uint64_t ptr)
{
    if (!__atomic_load_n(&nholds, __ATOMIC_RELAXED)) /* (every cudaFree asks: most programs hold nothing) */
        return 0;
    pthread_mutex_lock(&lock);
    int held = has_row(ptr, NVP_OWN_ALLOC_NODE) || has_row(ptr, NVP_OWN_ALLOC_EXEC);
    if (held && !has_row(ptr, NVP_OWN_FREED))
        add_locked(ptr, NVP_OWN_FREED, 0, 0, 0);
    pthread_mutex_unlock(&lock);
    return held;
}

/* Executable graph exec launches: its allocation nodes make their memory again. */
void nvp_graph_mem_launched(uint64_t exec)
{
    if (!__atomic_load_n(&nholds, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nholds; i++)
        if (holds[i].kind == NVP_OWN_FREED && has_row(holds[i].ptr, NVP_OWN_ALLOC_EXEC))
            for (size_t j = 0; j < nholds; j++)
                if (holds[j].ptr == holds[i].ptr && holds[j].kind == NVP_OWN_ALLOC_EXEC && holds[j].id == exec)
                    holds[i].kind = 0;
    compact_locked();
    pthread_mutex_unlock(&lock);
}

/* The program freed ptr itself: no graph frees it again. */
void nvp_graph_mem_forget(uint64_t ptr)
{
    if (!__atomic_load_n(&nholds, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&lock);
    size_t k = 0;
    for (size_t i = 0; i < nholds; i++) {
        if (holds[i].ptr != ptr)
            holds[k++] = holds[i];
        else if (holds[i].kind == NVP_OWN_SIZE)
            used -= holds[i].size;
    }
    __atomic_store_n(&nholds, k, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
}

/* Is wire stream w being captured (*cid: the capture)?  Asked of the proxy only while captures are on. */
static int capturing(int64_t w, unsigned long long *cid)
{
    enum cudaStreamCaptureStatus st;
    return w >= 0 && __atomic_load_n(&nvp_captures_on, __ATOMIC_SEQ_CST) &&
           nvp_capture_status(w, &st, cid) == cudaSuccess && st == cudaStreamCaptureStatusActive;
}

/* A memory node added to the graph stream s is capturing, after what s captured so far, s going on from it:
 * what a captured cudaMallocAsync (alloc) or cudaFreeAsync adds natively.  The node is an allocation node like
 * cudaGraphAddMemAllocNode's (its memory is taken now, its address fixed). */
static cudaError_t capture_mem_node(cudaStream_t s, int ptds, int dev, size_t size, void **ptr, int alloc)
{
    enum cudaStreamCaptureStatus st;
    cudaGraph_t g;
    const cudaGraphNode_t *got;
    size_t n = 0;
    cudaError_t e = ptds ? cudaStreamGetCaptureInfo_ptsz(s, &st, NULL, &g, &got, NULL, &n)
                         : cudaStreamGetCaptureInfo(s, &st, NULL, &g, &got, NULL, &n);
    if (e)
        return e;
    if (st != cudaStreamCaptureStatusActive)
        return cudaErrorStreamCaptureInvalidated;
    cudaGraphNode_t *deps = n ? malloc(n * sizeof *deps) : NULL, node;
    if (n && !deps)
        return cudaErrorMemoryAllocation;
    if (n)
        memcpy(deps, got, n * sizeof *deps);
    if (alloc) {
        struct cudaMemAllocNodeParams p;
        memset(&p, 0, sizeof p);
        p.poolProps.allocType = cudaMemAllocationTypePinned;
        p.poolProps.location.type = cudaMemLocationTypeDevice;
        p.poolProps.location.id = dev;
        p.bytesize = size;
        e = cudaGraphAddMemAllocNode(&node, g, deps, n, &p);
        if (!e)
            *ptr = p.dptr;
    } else {
        e = cudaGraphAddMemFreeNode(&node, g, deps, n, *ptr);
    }
    free(deps);
    if (!e)
        e = ptds ? cudaStreamUpdateCaptureDependencies_ptsz(s, &node, NULL, 1, cudaStreamSetCaptureDependencies)
                 : cudaStreamUpdateCaptureDependencies(s, &node, NULL, 1, cudaStreamSetCaptureDependencies);
    return e;
}

/* cudaMallocAsync on a stream that is being captured: an allocation node (1, *err its result), or not
 * captured (0). */
int nvp_graph_mem_capture_alloc(void **ptr, size_t size, int dev, cudaStream_t s, int ptds, cudaError_t *err)
{
    unsigned long long cid;
    if (!capturing(nvp_stream_wire(s, ptds), &cid))
        return 0;
    *err = capture_mem_node(s, ptds, dev, size, ptr, 1);
    return 1;
}

/* cudaFreeAsync on a stream that is being captured: the graph frees it (1, *err the result: a free node for
 * memory of an allocation node, as natively; other memory is held by the capture), or not captured (0). */
int nvp_graph_mem_capture_free(uint64_t ptr, cudaStream_t s, int ptds, cudaError_t *err)
{
    unsigned long long cid;
    if (!capturing(nvp_stream_wire(s, ptds), &cid))
        return 0;
    pthread_mutex_lock(&lock);
    int from_node = has_row(ptr, NVP_OWN_SIZE);
    pthread_mutex_unlock(&lock);
    void *p = (void *)(uintptr_t)ptr;
    *err = cudaSuccess;
    if (from_node)
        *err = capture_mem_node(s, ptds, 0, 0, &p, 0);
    else
        nvp_graph_mem_hold(ptr, NVP_OWN_CAPTURE, cid, 0);
    return 1;
}

/* ---- pageable host memory in graphs: staged through pinned memory by host functions ---- */

struct stage {
    uint64_t pageable, width, height, depth, pitch, rows;
    int to_device;
};
#define STAGE_DATA 64 /* the rows follow the header */

void CUDART_CB nvp_stage_rows(void *arg)
{
    const struct stage *st = arg;
    char *data = (char *)arg + STAGE_DATA, *host = (char *)(uintptr_t)st->pageable;
    for (uint64_t z = 0; z < st->depth; z++)
        for (uint64_t y = 0; y < st->height; y++) {
            uint64_t off = (z * st->rows + y) * st->pitch;
            if (st->to_device)
                memcpy(data + off, host + off, st->width);
            else
                memcpy(host + off, data + off, st->width);
        }
}

/* Pinned staging for a copy of rows at pageable (span bytes from it); *data: where the rows go. */
void *nvp_stage_new(uint64_t pageable, uint64_t width, uint64_t height, uint64_t depth, uint64_t pitch, uint64_t rows,
                    int to_device, uint64_t span, uint64_t *data)
{
    void *buf;
    if (cudaMallocHost(&buf, STAGE_DATA + span) != cudaSuccess)
        return NULL;
    *(struct stage *)buf = (struct stage){pageable, width, height, depth, pitch, rows, to_device};
    *data = (uint64_t)(uintptr_t)buf + STAGE_DATA;
    return buf;
}

/* A pageable copy on a capturing stream (natively captured as a copy node that reads or writes the pageable
 * memory when the graph runs): a captured host function and a captured copy through staging the graph holds.
 * *taken: 0 when the stream is not being captured (nothing done). */
cudaError_t nvp_graph_mem_capture_copy(uint64_t dst, uint64_t src, size_t n, int64_t w, int to_device, int *taken)
{
    unsigned long long cid;
    *taken = capturing(w, &cid);
    if (!*taken)
        return cudaSuccess;
    uint64_t data;
    void *st = nvp_stage_new(to_device ? src : dst, n, 1, 1, n, 1, to_device, n, &data);
    if (!st)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {to_device ? dst : data, to_device ? data : src, n, (uint64_t)w};
    cudaError_t e = to_device ? nvp_host_func_wire(w, (void *)nvp_stage_rows, st) : cudaSuccess;
    if (!e)
        e = nvp_call(NVP_OP_MEMCPY, a, NULL, 0, NULL, -1);
    if (!e && !to_device)
        e = nvp_host_func_wire(w, (void *)nvp_stage_rows, st);
    nvp_graph_mem_hold((uint64_t)(uintptr_t)st, NVP_OWN_CAPTURE, cid, 1); /* (an invalidated capture drops it) */
    return e;
}

/* ---- the nodes ---- */

/* An allocation node that depends on a free node of memory its graph allocated may get that memory (and its
 * address, as natively, where the driver reuses the address): the memory, or NULL; *freed_by: the free node. */
static void *reusable(uint32_t owner, const cudaGraphNode_t *deps, size_t ndeps, uint64_t size, uint64_t *freed_by)
{
    for (size_t i = 0; deps && i < ndeps; i++) {
        struct nvp_node_rec f;
        uint64_t h = (uint64_t)(uintptr_t)deps[i];
        if (nvp_handle_get(NVP_H_GRAPH_NODE, h, &f, sizeof f) != 0 || f.kind != NVP_NODE_MEM_FREE || f.size)
            continue;
        int fits = 0;
        pthread_mutex_lock(&lock);
        for (size_t j = 0; j < nholds; j++)
            if (holds[j].ptr == f.ptr && holds[j].kind == NVP_OWN_SIZE)
                fits = holds[j].size >= size && has_row(f.ptr, NVP_OWN_ALLOC_NODE);
        for (size_t j = 0; j < nholds && fits; j++)
            if (holds[j].ptr == f.ptr && holds[j].kind == NVP_OWN_ALLOC_NODE && holds[j].id != owner)
                fits = 0;
        pthread_mutex_unlock(&lock);
        if (fits) {
            *freed_by = h;
            return (void *)(uintptr_t)f.ptr;
        }
    }
    return NULL;
}

NVP_EXPORT cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                                const cudaGraphNode_t *deps, size_t ndeps,
                                                struct cudaMemAllocNodeParams *p)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_graph_rec g;
    if (!p || !node || !p->bytesize || nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &g, sizeof g) != 0 ||
        p->poolProps.allocType != cudaMemAllocationTypePinned ||
        p->poolProps.location.type != cudaMemLocationTypeDevice || p->poolProps.handleTypes != cudaMemHandleTypeNone)
        return nvp_ret(cudaErrorInvalidValue);
    int dev = p->poolProps.location.id, cur = nvp_current_device();
    if ((e = nvp_valid_device(dev)))
        return nvp_ret(e);
    uint32_t owner = g.root ? g.root : nvp_handle_id((uint64_t)(uintptr_t)graph);
    uint64_t freed_by = 0;
    void *ptr = reusable(owner, deps, ndeps, p->bytesize, &freed_by);
    if (!ptr) {
        if (dev != cur && (e = cudaSetDevice(dev)))
            return nvp_ret(e);
        e = cudaMalloc(&ptr, p->bytesize);
        if (dev != cur)
            cudaSetDevice(cur);
        if (e)
            return nvp_ret(e);
    }
    struct nvp_node_rec as = {0, NVP_NODE_MEM_ALLOC, (uint64_t)(uintptr_t)ptr, p->bytesize};
    if ((e = nvp_graph_add_node(node, graph, deps, ndeps, NVP_NODE_EMPTY, NULL, 0, &as))) {
        if (!freed_by)
            cudaFree(ptr);
        return nvp_ret(e);
    }
    if (freed_by) { /* (that free node's memory is taken now) */
        struct nvp_node_rec f;
        nvp_handle_get(NVP_H_GRAPH_NODE, freed_by, &f, sizeof f);
        f.size = 1;
        nvp_handle_set(NVP_H_GRAPH_NODE, freed_by, &f, sizeof f);
    }
    pthread_mutex_lock(&lock);
    add_locked(as.ptr, NVP_OWN_ALLOC_NODE, owner, 0, 0);
    if (!freed_by) {
        add_locked(as.ptr, NVP_OWN_SIZE, 0, p->bytesize, 0);
        used += p->bytesize;
        if (used > used_high)
            used_high = used;
    }
    pthread_mutex_unlock(&lock);
    p->dptr = ptr;
    return cudaSuccess;
}

/* dptr: memory of an allocation node (of this graph, or of another whose launch made it) */
NVP_EXPORT cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                               size_t ndeps, void *dptr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_graph_rec g;
    uint64_t ptr = (uint64_t)(uintptr_t)dptr;
    if (!node || nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &g, sizeof g) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    uint32_t owner = g.root ? g.root : nvp_handle_id((uint64_t)(uintptr_t)graph);
    int from_node = 0, made = 0, frees = 0; /* (memory reused in the graph is made and freed more than once) */
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nholds; i++) {
        from_node |= holds[i].ptr == ptr && holds[i].kind == NVP_OWN_SIZE;
        made += holds[i].ptr == ptr && holds[i].kind == NVP_OWN_ALLOC_NODE && holds[i].id == owner;
        frees += holds[i].ptr == ptr && holds[i].kind == NVP_OWN_GRAPH;
    }
    pthread_mutex_unlock(&lock);
    if (!from_node || frees >= (made > 1 ? made : 1)) /* (native: only an allocation node's memory, once) */
        return nvp_ret(cudaErrorInvalidValue);
    struct nvp_node_rec as = {0, NVP_NODE_MEM_FREE, ptr, 0};
    if ((e = nvp_graph_add_node(node, graph, deps, ndeps, NVP_NODE_EMPTY, NULL, 0, &as)))
        return nvp_ret(e);
    nvp_graph_mem_hold(ptr, NVP_OWN_GRAPH, owner, 0);
    return cudaSuccess;
}

static cudaError_t mem_node(cudaGraphNode_t node, int kind, struct nvp_node_rec *n)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (nvp_handle_get(NVP_H_GRAPH_NODE, (uint64_t)(uintptr_t)node, n, sizeof *n) != 0 || n->kind != kind)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGraphMemAllocNodeGetParams(cudaGraphNode_t node, struct cudaMemAllocNodeParams *out)
{
    struct nvp_node_rec n;
    cudaError_t e = mem_node(node, NVP_NODE_MEM_ALLOC, &n);
    if (e || !out)
        return nvp_ret(e ? e : cudaErrorInvalidValue);
    memset(out, 0, sizeof *out);
    out->poolProps.allocType = cudaMemAllocationTypePinned;
    out->poolProps.location.type = cudaMemLocationTypeDevice;
    struct cudaPointerAttributes at;
    out->poolProps.location.id = cudaPointerGetAttributes(&at, (void *)(uintptr_t)n.ptr) ? 0 : at.device;
    out->bytesize = n.size;
    out->dptr = (void *)(uintptr_t)n.ptr;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGraphMemFreeNodeGetParams(cudaGraphNode_t node, void *dptr_out)
{
    struct nvp_node_rec n;
    cudaError_t e = mem_node(node, NVP_NODE_MEM_FREE, &n);
    if (e || !dptr_out)
        return nvp_ret(e ? e : cudaErrorInvalidValue);
    *(void **)dptr_out = (void *)(uintptr_t)n.ptr;
    return cudaSuccess;
}

/* ---- the device's graph memory: what allocation nodes hold (the arena reserves it) ---- */

static cudaError_t graph_mem_attr(int device, enum cudaGraphMemAttributeType attr, void *value, int set)
{
    cudaError_t e = nvp_enter();
    if (e || (e = nvp_valid_device(device)))
        return e;
    if (!value)
        return cudaErrorInvalidValue;
    uint64_t *v = value;
    pthread_mutex_lock(&lock);
    switch (attr) {
    case cudaGraphMemAttrUsedMemCurrent:
    case cudaGraphMemAttrReservedMemCurrent:
        if (set)
            e = cudaErrorInvalidValue;
        else
            *v = used;
        break;
    case cudaGraphMemAttrUsedMemHigh:
    case cudaGraphMemAttrReservedMemHigh: /* setting: only a reset to 0 */
        if (!set)
            *v = used_high;
        else if (*v)
            e = cudaErrorInvalidValue;
        else
            used_high = used;
        break;
    default:
        e = cudaErrorInvalidValue;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

NVP_EXPORT cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void *value)
{
    return nvp_ret(graph_mem_attr(device, attr, value, 0));
}

NVP_EXPORT cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void *value)
{
    return nvp_ret(graph_mem_attr(device, attr, value, 1));
}

NVP_EXPORT cudaError_t cudaDeviceGraphMemTrim(int device)
{
    cudaError_t e = nvp_enter();
    return nvp_ret(e ? e : nvp_valid_device(device)); /* (the arena gives cached memory back itself) */
}
