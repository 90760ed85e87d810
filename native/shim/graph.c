/* CUDA graphs: made by stream capture (begin/end capture, capture status) or
 * node by node (create; kernel, memcpy, memset, host and empty nodes; clone),
 * then instantiated, launched, uploaded, updated (kernel nodes of an executable
 * graph) and destroyed.  Graphs, executable graphs and nodes are nvproxy
 * handles; the proxy keeps the calls that made each graph, so a restore makes
 * it again (docs/usage.md). */
#include "shim.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* A new graph handle for the proxy's op, whose argument at names it; freed again if the op fails. */
cudaError_t nvp_graph_new(cudaGraph_t *out, int device, uint16_t op, uint64_t a[NVP_MAX_ARGS], int at)
{
    struct nvp_graph_rec rec = {device, 0};
    uint64_t h = nvp_handle_new(NVP_H_GRAPH, &rec, sizeof rec);
    if (!h)
        return cudaErrorMemoryAllocation;
    a[at] = nvp_handle_id(h);
    struct nvp_reply r = {0};
    cudaError_t e = nvp_call(op, a, NULL, 0, &r, -1);
    if (e) {
        nvp_handle_free(NVP_H_GRAPH, h);
        return e;
    }
    *out = (cudaGraph_t)(uintptr_t)h;
    return cudaSuccess;
}

static int has_memory_nodes(uint32_t graph);

/* Executable graphs of graphs with memory nodes, by graph: natively a second one may not be made while the
 * first lives.  Few at a time: a flat array. */
static struct {
    uint32_t graph, exec;
} *mem_execs;
static size_t nmem_execs, capmem_execs;
static pthread_mutex_t mem_execs_lock = PTHREAD_MUTEX_INITIALIZER;

static int mem_exec_of(uint32_t graph) /* (lock held) */
{
    for (size_t i = 0; i < nmem_execs; i++)
        if (mem_execs[i].graph == graph)
            return 1;
    return 0;
}

static void mem_execs_drop(uint32_t id, int is_exec)
{
    pthread_mutex_lock(&mem_execs_lock);
    for (size_t i = 0; i < nmem_execs;)
        if ((is_exec ? mem_execs[i].exec : mem_execs[i].graph) == id)
            mem_execs[i] = mem_execs[--nmem_execs];
        else
            i++;
    pthread_mutex_unlock(&mem_execs_lock);
}

static cudaError_t instantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    struct nvp_graph_rec rec;
    if (!exec || nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &rec, sizeof rec) != 0)
        return cudaErrorInvalidValue;
    uint32_t gid = nvp_handle_id((uint64_t)(uintptr_t)graph);
    int memory = has_memory_nodes(gid);
    pthread_mutex_lock(&mem_execs_lock);
    int taken = memory && mem_exec_of(gid);
    pthread_mutex_unlock(&mem_execs_lock);
    if (taken) /* (what the driver says) */
        return cudaErrorNotSupported;
    uint64_t h = nvp_handle_new(NVP_H_GRAPH_EXEC, &rec, sizeof rec);
    if (!h)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(h), gid, flags};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_GRAPH_INSTANTIATE, a, NULL, 0, &r, -1))) {
        nvp_handle_free(NVP_H_GRAPH_EXEC, h);
        return e;
    }
    nvp_graph_mem_pass(NVP_OWN_GRAPH, a[1], NVP_OWN_EXEC, a[0], 0); /* (what it frees lives as long as it does) */
    nvp_graph_mem_pass(NVP_OWN_ALLOC_NODE, a[1], NVP_OWN_ALLOC_EXEC, a[0], 0);
    if (memory) {
        pthread_mutex_lock(&mem_execs_lock);
        if (nmem_execs == capmem_execs) {
            size_t cap = capmem_execs ? 2 * capmem_execs : 16;
            void *v = realloc(mem_execs, cap * sizeof *mem_execs);
            if (v) {
                mem_execs = v;
                capmem_execs = cap;
            }
        }
        if (nmem_execs < capmem_execs) {
            mem_execs[nmem_execs].graph = gid;
            mem_execs[nmem_execs++].exec = nvp_handle_id(h);
        }
        pthread_mutex_unlock(&mem_execs_lock);
    }
    *exec = (cudaGraphExec_t)(uintptr_t)h;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    return nvp_ret(instantiate(exec, graph, flags));
}

NVP_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                                     unsigned long long flags)
{
    return nvp_ret(instantiate(exec, graph, flags));
}

static cudaError_t launch(cudaGraphExec_t exec, cudaStream_t s, int upload, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if (nvp_handle_get(NVP_H_GRAPH_EXEC, (uint64_t)(uintptr_t)exec, NULL, 0) != 0)
        return cudaErrorInvalidValue;
    /* The callback channel must go to the proxy that gets the launch: no checkpoint (and restart into a new
     * proxy) between the two (a DMTCP restart test lost host-node callbacks that way, now and then). */
    if (!upload)
        nvp_callback_gate_enter();
    nvp_ckpt_disable();
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id((uint64_t)(uintptr_t)exec), (uint64_t)w, (uint64_t)upload};
    if (!(e = nvp_callbacks_resume()))
        e = nvp_call(NVP_OP_GRAPH_LAUNCH, a, NULL, 0, NULL, -1); /* asynchronous, like a kernel launch */
    if (!e && !upload)
        nvp_graph_mem_launched(a[0]);
    nvp_ckpt_enable();
    if (!upload)
        nvp_callback_gate_leave();
    return e;
}

NVP_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) { return nvp_ret(launch(exec, s, 0, 0)); }
NVP_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t exec, cudaStream_t s)
{
    return nvp_ret(launch(exec, s, 0, 1));
}
NVP_EXPORT cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s) { return nvp_ret(launch(exec, s, 1, 0)); }
NVP_EXPORT cudaError_t cudaGraphUpload_ptsz(cudaGraphExec_t exec, cudaStream_t s)
{
    return nvp_ret(launch(exec, s, 1, 1));
}

static cudaError_t destroy(int type, uint64_t h)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (nvp_handle_get(type, h, NULL, 0) != 0)
        return cudaErrorInvalidValue;
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(h), (uint64_t)(type == NVP_H_GRAPH_EXEC)};
    e = nvp_call(NVP_OP_GRAPH_DESTROY, a, NULL, 0, NULL, -1);
    nvp_handle_free(type, h);
    if (!e) {
        nvp_graph_mem_release(type == NVP_H_GRAPH_EXEC ? NVP_OWN_EXEC : NVP_OWN_GRAPH, a[0]);
        nvp_graph_mem_release(type == NVP_H_GRAPH_EXEC ? NVP_OWN_ALLOC_EXEC : NVP_OWN_ALLOC_NODE, a[0]);
        mem_execs_drop((uint32_t)a[0], type == NVP_H_GRAPH_EXEC);
    }
    return e;
}

NVP_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return nvp_ret(destroy(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph)); }

NVP_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    return nvp_ret(destroy(NVP_H_GRAPH_EXEC, (uint64_t)(uintptr_t)exec));
}

/* ---- graphs built node by node ---- */

static int has_memory_nodes(uint32_t graph)
{
    return nvp_graph_mem_holds(NVP_OWN_GRAPH, graph) || nvp_graph_mem_holds(NVP_OWN_ALLOC_NODE, graph);
}

NVP_EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!graph || flags)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {0, flags};
    return nvp_ret(nvp_graph_new(graph, nvp_current_device(), NVP_OP_GRAPH_CREATE, a, 0));
}

NVP_EXPORT cudaError_t cudaGraphClone(cudaGraph_t *clone, cudaGraph_t graph)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_graph_rec rec;
    if (!clone || nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &rec, sizeof rec) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    if (has_memory_nodes(nvp_handle_id((uint64_t)(uintptr_t)graph)))
        return nvp_ret(cudaErrorNotSupported); /* (native: graphs with memory nodes cannot be cloned) */
    uint64_t a[NVP_MAX_ARGS] = {0, nvp_handle_id((uint64_t)(uintptr_t)graph)};
    if (!(e = nvp_graph_new(clone, rec.device, NVP_OP_GRAPH_CLONE, a, 0)))
        nvp_graph_mem_pass(NVP_OWN_GRAPH, a[1], NVP_OWN_GRAPH, a[0], 0); /* (staging its copy nodes use) */
    return nvp_ret(e);
}

/* The wire ids of nodes of graph graph_id (out: n of them); nonzero if one is not a node of that graph. */
int nvp_node_ids(uint32_t graph_id, const cudaGraphNode_t *nodes, size_t n, uint32_t *out)
{
    for (size_t i = 0; i < n; i++) {
        struct nvp_node_rec d;
        uint64_t dh = (uint64_t)(uintptr_t)nodes[i];
        if (nvp_handle_get(NVP_H_GRAPH_NODE, dh, &d, sizeof d) != 0 || d.graph != graph_id)
            return -1; /* (native: a node of another graph is invalid too) */
        out[i] = nvp_handle_id(dh);
    }
    return 0;
}

/* body: the kind's bytes; the dependencies go first, as node ids.  as: what the shim records of the node where
 * it is not the wire kind (memory nodes), else NULL. */
cudaError_t nvp_graph_add_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                               int kind, const void *body, size_t blen, const struct nvp_node_rec *as)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    uint64_t g = (uint64_t)(uintptr_t)graph;
    if (!node || nvp_handle_get(NVP_H_GRAPH, g, NULL, 0) != 0 || (ndeps && !deps) || ndeps > 4096)
        return cudaErrorInvalidValue;
    size_t dlen = (ndeps * 4 + 7) / 8 * 8;
    unsigned char *payload = calloc(1, dlen + blen + 1);
    if (!payload)
        return cudaErrorMemoryAllocation;
    if (nvp_node_ids(nvp_handle_id(g), deps, ndeps, (uint32_t *)payload)) {
        free(payload);
        return cudaErrorInvalidValue;
    }
    if (blen)
        memcpy(payload + dlen, body, blen);
    struct nvp_node_rec rec = as ? *as : (struct nvp_node_rec){0, kind & ~NVP_NODE_HIDDEN, 0, 0};
    rec.graph = nvp_handle_id(g);
    uint64_t h = nvp_handle_new(NVP_H_GRAPH_NODE, &rec, sizeof rec);
    if (!h) {
        free(payload);
        return cudaErrorMemoryAllocation;
    }
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(g), nvp_handle_id(h), (uint64_t)kind, ndeps};
    struct nvp_reply r = {0}; /* (waited for: the driver's verdict on the node is this call's result) */
    e = nvp_call(NVP_OP_GRAPH_ADD_NODE, a, payload, dlen + blen, &r, -1);
    free(payload);
    if (e) {
        nvp_handle_free(NVP_H_GRAPH_NODE, h);
        return e;
    }
    *node = (cudaGraphNode_t)(uintptr_t)h;
    return cudaSuccess;
}

static cudaError_t add_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                            int kind, const void *body, size_t blen)
{
    return nvp_graph_add_node(node, graph, deps, ndeps, kind, body, blen, NULL);
}

/* NVP_NODE_KERNEL body from cudaKernelNodeParams (into buf, which holds MAX_PARAM_BYTES + 36) */
static cudaError_t kernel_body(const struct cudaKernelNodeParams *p, unsigned char *buf, size_t *len)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    if (!p)
        return cudaErrorInvalidValue;
    if (p->extra)
        return nvp_unsupported("cudaKernelNodeParams.extra");
    uint32_t kid;
    size_t n;
    e = nvp_pack_kernel(p->func, p->gridDim, p->blockDim, p->sharedMemBytes, p->kernelParams, &kid, buf + 36,
                        MAX_PARAM_BYTES, &n);
    if (e)
        return e;
    uint32_t h[9] = {kid, p->gridDim.x, p->gridDim.y, p->gridDim.z, p->blockDim.x, p->blockDim.y, p->blockDim.z,
                     p->sharedMemBytes, (uint32_t)n};
    memcpy(buf, h, sizeof h);
    *len = 36 + n;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                              const cudaGraphNode_t *deps, size_t ndeps,
                                              const struct cudaKernelNodeParams *params)
{
    unsigned char *buf = malloc(MAX_PARAM_BYTES + 64);
    if (!buf)
        return nvp_ret(cudaErrorMemoryAllocation);
    size_t len;
    cudaError_t e = kernel_body(params, buf, &len);
    if (!e)
        e = add_node(node, graph, deps, ndeps, NVP_NODE_KERNEL, buf, len);
    free(buf);
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                        const struct cudaKernelNodeParams *params)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_node_rec n;
    if (nvp_handle_get(NVP_H_GRAPH_EXEC, (uint64_t)(uintptr_t)exec, NULL, 0) != 0 ||
        nvp_handle_get(NVP_H_GRAPH_NODE, (uint64_t)(uintptr_t)node, &n, sizeof n) != 0 || n.kind != NVP_NODE_KERNEL)
        return nvp_ret(cudaErrorInvalidValue);
    unsigned char *buf = malloc(MAX_PARAM_BYTES + 64);
    if (!buf)
        return nvp_ret(cudaErrorMemoryAllocation);
    size_t len;
    if (!(e = kernel_body(params, buf, &len))) {
        uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id((uint64_t)(uintptr_t)exec), nvp_handle_id((uint64_t)(uintptr_t)node)};
        struct nvp_reply r = {0};
        e = nvp_call(NVP_OP_GRAPH_EXEC_KERNEL, a, buf, len, &r, -1);
    }
    free(buf);
    return nvp_ret(e);
}

static int pageable(uint64_t p, uint64_t n) { return !nvp_is_device_ptr(p) && !nvp_host_shared(p, n ? n : 1, NULL); }

static uint32_t owner_of(cudaGraph_t graph)
{
    struct nvp_graph_rec g = {0, 0};
    nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &g, sizeof g);
    return g.root ? g.root : nvp_handle_id((uint64_t)(uintptr_t)graph);
}

/* A copy node with pageable host memory on one side: the proxy cannot reach that memory when the graph
 * runs, so the copy goes through pinned staging memory the graph holds (graph_mem.c), and a host node, run
 * in the application, moves the rows between it and the pageable memory: before the copy to the device,
 * after the copy from it.  The node handed back is the one that finishes the copy; the host node is hidden from
 * the graph's node list (cudaGraphGetNodes lists one copy node, as natively). */
static cudaError_t staged_copy_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                    size_t ndeps, uint64_t body[9], int to_device, uint64_t span)
{
    uint64_t *host = &body[to_device ? 1 : 0], pitch = body[to_device ? 6 : 5], rows = body[to_device ? 8 : 7];
    uint64_t data;
    void *st = nvp_stage_new(*host, body[2], body[3], body[4], pitch, rows, to_device, span, &data);
    if (!st)
        return cudaErrorMemoryAllocation;
    *host = data;
    uint64_t cb = nvp_host_node_callback((void *)nvp_stage_rows, st);
    cudaGraphNode_t first;
    cudaError_t e;
    if (!cb)
        e = cudaErrorMemoryAllocation;
    else if (to_device && !(e = add_node(&first, graph, deps, ndeps, NVP_NODE_HOST | NVP_NODE_HIDDEN, &cb, sizeof cb)))
        e = add_node(node, graph, &first, 1, NVP_NODE_MEMCPY, body, 9 * sizeof *body);
    else if (!to_device && !(e = add_node(&first, graph, deps, ndeps, NVP_NODE_MEMCPY, body, 9 * sizeof *body)))
        e = nvp_graph_add_node(node, graph, &first, 1, NVP_NODE_HOST | NVP_NODE_HIDDEN, &cb, sizeof cb,
                               &(struct nvp_node_rec){0, NVP_NODE_MEMCPY, 0, 0}); /* (it finishes the copy) */
    if (e) {
        cudaFreeHost(st);
        return e;
    }
    nvp_graph_mem_hold((uint64_t)(uintptr_t)st, NVP_OWN_GRAPH, owner_of(graph), 1);
    return cudaSuccess;
}

static cudaError_t memcpy_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                               const char *call, uint64_t dst, uint64_t src, uint64_t width, uint64_t height,
                               uint64_t depth, uint64_t dpitch, uint64_t spitch, uint64_t drows, uint64_t srows)
{
    uint64_t span_d = depth ? ((depth - 1) * drows + (height - 1)) * dpitch + width : 0;
    uint64_t span_s = depth ? ((depth - 1) * srows + (height - 1)) * spitch + width : 0;
    uint64_t body[9] = {dst, src, width, height, depth, dpitch, spitch, drows, srows};
    int pd = width && height && depth && pageable(dst, span_d), ps = width && height && depth && pageable(src, span_s);
    if (pd && ps) {
        nvp_log("nvproxy: %s: a graph copy between two pageable host buffers is not supported by nvproxy; "
                "returning cudaErrorNotSupported", call);
        return cudaErrorNotSupported;
    }
    if (pd || ps)
        return staged_copy_node(node, graph, deps, ndeps, body, ps, ps ? span_s : span_d);
    return add_node(node, graph, deps, ndeps, NVP_NODE_MEMCPY, body, sizeof body);
}

NVP_EXPORT cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *node, cudaGraph_t graph,
                                                const cudaGraphNode_t *deps, size_t ndeps, void *dst,
                                                const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if ((unsigned)kind > cudaMemcpyDefault)
        return nvp_ret(cudaErrorInvalidMemcpyDirection);
    return nvp_ret(memcpy_node(node, graph, deps, ndeps, "cudaGraphAddMemcpyNode1D", (uint64_t)(uintptr_t)dst,
                               (uint64_t)(uintptr_t)src, count, 1, 1, count, count, 1, 1));
}

NVP_EXPORT cudaError_t cudaGraphAddMemcpyNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                              const cudaGraphNode_t *deps, size_t ndeps,
                                              const struct cudaMemcpy3DParms *p)
{
    if (!p)
        return nvp_ret(cudaErrorInvalidValue);
    if (p->srcArray || p->dstArray)
        return nvp_unsupported("cudaGraphAddMemcpyNode with CUDA arrays");
    if ((unsigned)p->kind > cudaMemcpyDefault)
        return nvp_ret(cudaErrorInvalidMemcpyDirection);
    const struct cudaPitchedPtr *s = &p->srcPtr, *d = &p->dstPtr;
    if (!p->extent.width || !p->extent.height || !p->extent.depth)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t srows = s->ysize ? s->ysize : p->extent.height, drows = d->ysize ? d->ysize : p->extent.height;
    uint64_t src = (uint64_t)(uintptr_t)s->ptr + p->srcPos.x + (p->srcPos.y + p->srcPos.z * srows) * s->pitch;
    uint64_t dst = (uint64_t)(uintptr_t)d->ptr + p->dstPos.x + (p->dstPos.y + p->dstPos.z * drows) * d->pitch;
    if (p->extent.width > s->pitch || p->extent.width > d->pitch)
        return nvp_ret(cudaErrorInvalidPitchValue);
    return nvp_ret(memcpy_node(node, graph, deps, ndeps, "cudaGraphAddMemcpyNode", dst, src, p->extent.width,
                               p->extent.height, p->extent.depth, d->pitch, s->pitch, drows, srows));
}

NVP_EXPORT cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                              const cudaGraphNode_t *deps, size_t ndeps,
                                              const struct cudaMemsetParams *p)
{
    if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) || !p->width || !p->height ||
        (p->height > 1 && p->pitch < p->width * p->elementSize))
        return nvp_ret(cudaErrorInvalidValue);
    if (!nvp_is_device_ptr((uint64_t)(uintptr_t)p->dst))
        return nvp_ret(cudaErrorInvalidValue); /* (native: memset nodes write device memory only) */
    struct {
        uint64_t dst, pitch;
        uint32_t value, elsize;
        uint64_t width, height;
    } body = {(uint64_t)(uintptr_t)p->dst, p->height > 1 ? p->pitch : 0, p->value, p->elementSize, p->width,
              p->height};
    return nvp_ret(add_node(node, graph, deps, ndeps, NVP_NODE_MEMSET, &body, sizeof body));
}

NVP_EXPORT cudaError_t cudaGraphAddHostNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                            size_t ndeps, const struct cudaHostNodeParams *p)
{
    if (!p || !p->fn)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t id = nvp_host_node_callback((void *)p->fn, p->userData);
    if (!id)
        return nvp_ret(cudaErrorMemoryAllocation);
    return nvp_ret(add_node(node, graph, deps, ndeps, NVP_NODE_HOST, &id, sizeof id));
}

NVP_EXPORT cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                             size_t ndeps)
{
    return nvp_ret(add_node(node, graph, deps, ndeps, NVP_NODE_EMPTY, NULL, 0));
}

/* The result says why an update failed; the nodes it names are the driver's, inside
 * the proxy: the application is told none (errorNode and errorFromNode are NULL). */
NVP_EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo *info)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (nvp_handle_get(NVP_H_GRAPH_EXEC, (uint64_t)(uintptr_t)exec, NULL, 0) != 0 ||
        nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, NULL, 0) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id((uint64_t)(uintptr_t)exec), nvp_handle_id((uint64_t)(uintptr_t)graph)};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_GRAPH_EXEC_UPDATE, a, NULL, 0, &r, -1)))
        return nvp_ret(e);
    if (!r.h.r[0]) /* (its copy nodes may now use the graph's staging) */
        nvp_graph_mem_pass(NVP_OWN_GRAPH, a[1], NVP_OWN_EXEC, a[0], 0);
    if (info) {
        info->result = (enum cudaGraphExecUpdateResult)r.h.r[0];
        info->errorNode = NULL;
        info->errorFromNode = NULL;
    }
    return nvp_ret(r.h.r[0] ? cudaErrorGraphExecUpdateFailure : cudaSuccess);
}

/* Conditional nodes: their body graphs are made by the driver with the node; they get nvproxy
 * handles (in an array that lives as long as the process, as the driver's lives as long as the node). */
static cudaError_t conditional_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                    size_t ndeps, struct cudaConditionalNodeParams *c)
{
    struct nvp_graph_rec rec;
    if (nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &rec, sizeof rec) != 0 || c->size == 0 ||
        c->size > 256)
        return cudaErrorInvalidValue;
    struct {
        uint64_t handle;
        uint32_t type, size, ids[256];
    } body = {c->handle, (uint32_t)c->type, c->size, {0}};
    cudaGraph_t *bodies = calloc(c->size, sizeof *bodies);
    if (!bodies)
        return cudaErrorMemoryAllocation;
    cudaError_t e = cudaSuccess;
    if (!rec.root)
        rec.root = nvp_handle_id((uint64_t)(uintptr_t)graph);
    for (unsigned i = 0; i < c->size && !e; i++) {
        uint64_t h = nvp_handle_new(NVP_H_GRAPH, &rec, sizeof rec);
        bodies[i] = (cudaGraph_t)(uintptr_t)h;
        body.ids[i] = nvp_handle_id(h);
        if (!h)
            e = cudaErrorMemoryAllocation;
    }
    if (!e)
        e = add_node(node, graph, deps, ndeps, NVP_NODE_COND, &body, 16 + 4 * (size_t)c->size);
    if (e) {
        for (unsigned i = 0; i < c->size; i++)
            if (bodies[i])
                nvp_handle_free(NVP_H_GRAPH, (uint64_t)(uintptr_t)bodies[i]);
        free(bodies);
        return e;
    }
    c->phGraph_out = bodies;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *pHandle_out, cudaGraph_t graph,
                                                        unsigned int defaultLaunchValue, unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t g = (uint64_t)(uintptr_t)graph;
    if (!pHandle_out || nvp_handle_get(NVP_H_GRAPH, g, NULL, 0) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(g), defaultLaunchValue, flags};
    struct nvp_reply r = {0};
    if (!(e = nvp_call(NVP_OP_GRAPH_COND_HANDLE, a, NULL, 0, &r, -1)))
        *pHandle_out = r.h.r[0];
    return nvp_ret(e);
}

static cudaError_t event_node(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                              int kind, cudaEvent_t event)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    int64_t w = nvp_event_wire(event);
    if (w < 0)
        return cudaErrorInvalidValue;
    uint64_t body = (uint64_t)w;
    return add_node(node, graph, deps, ndeps, kind, &body, sizeof body);
}

NVP_EXPORT cudaError_t cudaGraphAddEventRecordNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                                   const cudaGraphNode_t *deps, size_t ndeps, cudaEvent_t event)
{
    return nvp_ret(event_node(node, graph, deps, ndeps, NVP_NODE_EVENT_RECORD, event));
}

NVP_EXPORT cudaError_t cudaGraphAddEventWaitNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                                 const cudaGraphNode_t *deps, size_t ndeps, cudaEvent_t event)
{
    return nvp_ret(event_node(node, graph, deps, ndeps, NVP_NODE_EVENT_WAIT, event));
}

/* The driver clones the child into the node; the proxy keeps how the child was made with the node. */
NVP_EXPORT cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                                  const cudaGraphNode_t *deps, size_t ndeps, cudaGraph_t child)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t c = (uint64_t)(uintptr_t)child;
    if (nvp_handle_get(NVP_H_GRAPH, c, NULL, 0) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    if (has_memory_nodes(nvp_handle_id(c))) /* (native: only with its ownership moved to the parent) */
        return nvp_ret(nvp_unsupported("cudaGraphAddChildGraphNode of a graph with memory nodes"));
    uint64_t body = nvp_handle_id(c);
    if (!(e = add_node(node, graph, deps, ndeps, NVP_NODE_CHILD, &body, sizeof body)))
        nvp_graph_mem_pass(NVP_OWN_GRAPH, body, NVP_OWN_GRAPH, owner_of(graph), 0);
    return nvp_ret(e);
}

/* The generic form of the node additions above (CUDA 12.2+); external-semaphore and other nodes fail loudly. */
NVP_EXPORT cudaError_t cudaGraphAddNode(cudaGraphNode_t *node, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                        const cudaGraphEdgeData *edges, size_t ndeps, struct cudaGraphNodeParams *p)
{
    if (!p)
        return nvp_ret(cudaErrorInvalidValue);
    static const cudaGraphEdgeData plain;
    for (size_t i = 0; edges && i < ndeps; i++)
        if (memcmp(&edges[i], &plain, sizeof plain))
            return nvp_ret(nvp_unsupported("cudaGraphAddNode with edge data (ports, programmatic edges)"));
    switch (p->type) {
    case cudaGraphNodeTypeKernel: {
        struct cudaKernelNodeParams k = {p->kernel.func,           p->kernel.gridDim,      p->kernel.blockDim,
                                         p->kernel.sharedMemBytes, p->kernel.kernelParams, p->kernel.extra};
        return cudaGraphAddKernelNode(node, graph, deps, ndeps, &k);
    }
    case cudaGraphNodeTypeMemcpy:
        return cudaGraphAddMemcpyNode(node, graph, deps, ndeps, &p->memcpy.copyParams);
    case cudaGraphNodeTypeMemset: {
        struct cudaMemsetParams m = {p->memset.dst,         p->memset.pitch, p->memset.value,
                                     p->memset.elementSize, p->memset.width, p->memset.height};
        return cudaGraphAddMemsetNode(node, graph, deps, ndeps, &m);
    }
    case cudaGraphNodeTypeHost: {
        struct cudaHostNodeParams h = {p->host.fn, p->host.userData};
        return cudaGraphAddHostNode(node, graph, deps, ndeps, &h);
    }
    case cudaGraphNodeTypeEmpty:
        return cudaGraphAddEmptyNode(node, graph, deps, ndeps);
    case cudaGraphNodeTypeConditional:
        return nvp_ret(conditional_node(node, graph, deps, ndeps, &p->conditional));
    case cudaGraphNodeTypeEventRecord:
        return cudaGraphAddEventRecordNode(node, graph, deps, ndeps, p->eventRecord.event);
    case cudaGraphNodeTypeWaitEvent:
        return cudaGraphAddEventWaitNode(node, graph, deps, ndeps, p->eventWait.event);
    case cudaGraphNodeTypeGraph:
        if (p->graph.ownership != cudaGraphChildGraphOwnershipClone)
            return nvp_ret(nvp_unsupported("cudaGraphAddNode of a child graph whose ownership moves"));
        return cudaGraphAddChildGraphNode(node, graph, deps, ndeps, p->graph.graph);
    case cudaGraphNodeTypeMemAlloc: {
        struct cudaMemAllocNodeParams m = {p->alloc.poolProps, p->alloc.accessDescs, p->alloc.accessDescCount,
                                           p->alloc.bytesize, NULL};
        cudaError_t e = cudaGraphAddMemAllocNode(node, graph, deps, ndeps, &m);
        if (!e)
            p->alloc.dptr = m.dptr;
        return e;
    }
    case cudaGraphNodeTypeMemFree:
        return cudaGraphAddMemFreeNode(node, graph, deps, ndeps, p->free.dptr);
    default:
        return nvp_ret(nvp_unsupported("cudaGraphAddNode of this node type (external semaphores, batch memory "
                                       "operations)"));
    }
}

/* Nodes the program did not add itself (a captured or cloned graph's) get nvproxy
 * handles here; the proxy names the driver's nodes with them, again after a restore. */
NVP_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t g = (uint64_t)(uintptr_t)graph;
    if (!numNodes || nvp_handle_get(NVP_H_GRAPH, g, NULL, 0) != 0)
        return nvp_ret(cudaErrorInvalidValue);
    size_t want = nodes ? *numNodes : 0;
    if (want > 65536)
        want = 65536;
    uint32_t *ids = calloc(want ? want : 1, 2 * sizeof *ids);
    uint64_t *fresh = calloc(want ? want : 1, sizeof *fresh);
    if (!ids || !fresh) {
        free(ids);
        free(fresh);
        return nvp_ret(cudaErrorMemoryAllocation);
    }
    struct nvp_node_rec rec = {nvp_handle_id(g), 0, 0, 0};
    for (size_t i = 0; i < want && !e; i++) {
        if (!(fresh[i] = nvp_handle_new(NVP_H_GRAPH_NODE, &rec, sizeof rec)))
            e = cudaErrorMemoryAllocation;
        ids[i] = nvp_handle_id(fresh[i]);
    }
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(g), want};
    struct nvp_reply r = {.out = ids, .out_cap = want * 2 * sizeof *ids};
    if (!e)
        e = nvp_call(NVP_OP_GRAPH_GET_NODES, a, ids, want * sizeof *ids, &r, -1);
    size_t got = e ? 0 : r.out_len / (2 * sizeof *ids);
    for (size_t i = 0; i < got; i++) {
        uint64_t h = nvp_handle_of(NVP_H_GRAPH_NODE, ids[2 * i]);
        struct nvp_node_rec n = {nvp_handle_id(g), (int)ids[2 * i + 1], 0, 0}, had;
        /* (memory nodes are empty nodes to the driver: the shim's record says what they are) */
        int memory = nvp_handle_get(NVP_H_GRAPH_NODE, h, &had, sizeof had) == 0 &&
                     (had.kind == NVP_NODE_MEM_ALLOC || had.kind == NVP_NODE_MEM_FREE);
        if (!memory)
            nvp_handle_set(NVP_H_GRAPH_NODE, h, &n, sizeof n);
        nodes[i] = (cudaGraphNode_t)(uintptr_t)h;
    }
    for (size_t i = 0; i < want; i++) { /* fresh handles the proxy did not use */
        int used = 0;
        for (size_t j = 0; j < got && !used; j++)
            used = ids[2 * j] == nvp_handle_id(fresh[i]);
        if (fresh[i] && !used)
            nvp_handle_free(NVP_H_GRAPH_NODE, fresh[i]);
        if (i >= got)
            nodes[i] = NULL;
    }
    if (!e)
        *numNodes = nodes ? got : r.h.r[0];
    free(ids);
    free(fresh);
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *type)
{
    static const int types[] = {
        [NVP_NODE_KERNEL] = cudaGraphNodeTypeKernel,       [NVP_NODE_MEMCPY] = cudaGraphNodeTypeMemcpy,
        [NVP_NODE_MEMSET] = cudaGraphNodeTypeMemset,       [NVP_NODE_HOST] = cudaGraphNodeTypeHost,
        [NVP_NODE_EMPTY] = cudaGraphNodeTypeEmpty,         [NVP_NODE_COND] = cudaGraphNodeTypeConditional,
        [NVP_NODE_EVENT_RECORD] = cudaGraphNodeTypeEventRecord, [NVP_NODE_EVENT_WAIT] = cudaGraphNodeTypeWaitEvent,
        [NVP_NODE_CHILD] = cudaGraphNodeTypeGraph,         [NVP_NODE_MEM_ALLOC] = cudaGraphNodeTypeMemAlloc,
        [NVP_NODE_MEM_FREE] = cudaGraphNodeTypeMemFree,
    };
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct nvp_node_rec n;
    if (!type || nvp_handle_get(NVP_H_GRAPH_NODE, (uint64_t)(uintptr_t)node, &n, sizeof n) != 0 || n.kind <= 0 ||
        n.kind >= (int)(sizeof types / sizeof *types))
        return nvp_ret(cudaErrorInvalidValue);
    /* (kind 0: a node of a kind nvproxy does not make, which GetNodes listed; kernels are type 0) */
    *type = (enum cudaGraphNodeType)types[n.kind];
    return cudaSuccess;
}
