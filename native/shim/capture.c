/* Stream capture: begin (into a new graph or an existing one), end, status, and
 * the capture's graph and open dependencies, which the program may add nodes to
 * and set again (cudaStreamGetCaptureInfo, cudaStreamUpdateCaptureDependencies).
 * The proxy names the graph and the nodes with nvproxy handles, and keeps those
 * calls in the capture's log, so a restore makes the same graph again. */
#include "shim.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INFO_NODES 64 /* dependencies cudaStreamGetCaptureInfo can name at once */

int nvp_captures_on;

static void captures_add(int n)
{
    int v = __atomic_add_fetch(&nvp_captures_on, n, __ATOMIC_SEQ_CST);
    if (v < 0) /* (a hint only: never below 0, so that no capture is missed) */
        __atomic_store_n(&nvp_captures_on, 0, __ATOMIC_SEQ_CST);
}

static cudaError_t valid_mode(enum cudaStreamCaptureMode mode)
{
    return mode == cudaStreamCaptureModeGlobal || mode == cudaStreamCaptureModeThreadLocal ||
                   mode == cudaStreamCaptureModeRelaxed
               ? cudaSuccess
               : cudaErrorInvalidValue;
}

/* The calling thread's capture interaction mode (PyTorch sets it to relaxed around its captures).  It is kept
 * here, per thread; the proxy serves every call whatever the mode, so a call that native CUDA would refuse while
 * another thread captures in global mode is served. */
static __thread enum cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

NVP_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (!mode || valid_mode(*mode))
        return nvp_ret(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode was = thread_mode;
    thread_mode = *mode;
    *mode = was;
    return cudaSuccess;
}

static int plain_edges(const cudaGraphEdgeData *edges, size_t n)
{
    static const cudaGraphEdgeData plain;
    for (size_t i = 0; edges && i < n; i++)
        if (memcmp(&edges[i], &plain, sizeof plain))
            return 0;
    return 1;
}

static cudaError_t capture_begin(cudaStream_t s, enum cudaStreamCaptureMode mode, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e || (e = valid_mode(mode)))
        return e;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, (uint64_t)mode};
    struct nvp_reply r = {0};
    if (!(e = nvp_call(NVP_OP_CAPTURE_BEGIN, a, NULL, 0, &r, -1)))
        captures_add(1);
    return e;
}

NVP_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    return nvp_ret(capture_begin(s, mode, 0));
}

NVP_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    return nvp_ret(capture_begin(s, mode, 1));
}

static cudaError_t capture_to_graph(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                    const cudaGraphEdgeData *edges, size_t ndeps, enum cudaStreamCaptureMode mode,
                                    int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e || (e = valid_mode(mode)))
        return e;
    uint64_t g = (uint64_t)(uintptr_t)graph;
    if (nvp_handle_get(NVP_H_GRAPH, g, NULL, 0) != 0 || (ndeps && !deps) || ndeps > 4096)
        return cudaErrorInvalidValue;
    if (!plain_edges(edges, ndeps))
        return nvp_unsupported("cudaStreamBeginCaptureToGraph with edge data (ports, programmatic edges)");
    uint32_t *ids = calloc(ndeps + 1, sizeof *ids);
    if (!ids)
        return cudaErrorMemoryAllocation;
    if (nvp_node_ids(nvp_handle_id(g), deps, ndeps, ids) == 0) {
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, (uint64_t)mode, nvp_handle_id(g), ndeps};
        struct nvp_reply r = {0};
        if (!(e = nvp_call(NVP_OP_CAPTURE_TO_GRAPH, a, ids, ndeps * sizeof *ids, &r, -1)))
            captures_add(1);
    } else {
        e = cudaErrorInvalidValue;
    }
    free(ids);
    return e;
}

NVP_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                                     const cudaGraphEdgeData *edges, size_t ndeps,
                                                     enum cudaStreamCaptureMode mode)
{
    return nvp_ret(capture_to_graph(s, graph, deps, edges, ndeps, mode, 0));
}

NVP_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t graph,
                                                          const cudaGraphNode_t *deps, const cudaGraphEdgeData *edges,
                                                          size_t ndeps, enum cudaStreamCaptureMode mode)
{
    return nvp_ret(capture_to_graph(s, graph, deps, edges, ndeps, mode, 1));
}

/* wire stream w's capture status (id: its capture, while active) */
cudaError_t nvp_capture_status(int64_t w, enum cudaStreamCaptureStatus *status, unsigned long long *id)
{
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    struct nvp_reply r = {0};
    cudaError_t e = nvp_call(NVP_OP_CAPTURE_STATUS, a, NULL, 0, &r, -1);
    if (e)
        return e;
    *status = (enum cudaStreamCaptureStatus)r.h.r[0];
    if (id)
        *id = r.h.r[1];
    return cudaSuccess;
}

/* The graph is new, or (captured into an existing graph, or named by cudaStreamGetCaptureInfo) the one the
 * proxy says; the frees the capture took go with it. */
static cudaError_t capture_end(cudaStream_t s, cudaGraph_t *graph, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long cid = 0;
    if (nvp_graph_mem_holds(NVP_OWN_CAPTURE, 0) && (e = nvp_capture_status(w, &st, &cid)))
        return e;
    struct nvp_graph_rec rec = {nvp_current_device(), 0};
    uint64_t h = nvp_handle_new(NVP_H_GRAPH, &rec, sizeof rec);
    if (!h)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, nvp_handle_id(h), graph == NULL};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_CAPTURE_END, a, NULL, 0, &r, -1);
    if (!e || e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureUnjoined)
        captures_add(-1); /* (ended either way) */
    uint64_t gh = e ? 0 : r.h.r[0] == nvp_handle_id(h) ? h : nvp_handle_of(NVP_H_GRAPH, (uint32_t)r.h.r[0]);
    if (gh != h)
        nvp_handle_free(NVP_H_GRAPH, h);
    if (cid) { /* (the graph at the top owns what a body graph's capture frees) */
        struct nvp_graph_rec g = {0, 0};
        if (gh)
            nvp_handle_get(NVP_H_GRAPH, gh, &g, sizeof g);
        nvp_graph_mem_pass(NVP_OWN_CAPTURE, cid, gh ? NVP_OWN_GRAPH : 0, g.root ? g.root : nvp_handle_id(gh), 1);
    }
    if (graph)
        *graph = (cudaGraph_t)(uintptr_t)gh;
    return e;
}

NVP_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    return nvp_ret(capture_end(s, graph, 0));
}

NVP_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *graph)
{
    return nvp_ret(capture_end(s, graph, 1));
}

static cudaError_t is_capturing(cudaStream_t s, enum cudaStreamCaptureStatus *status, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    return status ? nvp_capture_status(w, status, NULL) : cudaErrorInvalidValue;
}

NVP_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    return nvp_ret(is_capturing(s, status, 0));
}

NVP_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    return nvp_ret(is_capturing(s, status, 1));
}

/* The arrays cudaStreamGetCaptureInfo hands out stay valid until this thread asks again. */
static __thread cudaGraphNode_t info_deps[INFO_NODES];
static __thread cudaGraphEdgeData info_edges[INFO_NODES];

static cudaError_t capture_info(cudaStream_t s, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                cudaGraph_t *graph, const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                size_t *ndeps, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if (!status)
        return cudaErrorInvalidValue;
    if (!graph && !deps && !edges && !ndeps)
        return nvp_capture_status(w, status, id);
    /* fresh handles the proxy may name the graph and new dependencies with; the unused ones go again */
    struct nvp_graph_rec grec = {nvp_current_device(), 0};
    struct nvp_node_rec nrec = {0, 0, 0, 0};
    uint64_t gh = nvp_handle_new(NVP_H_GRAPH, &grec, sizeof grec), fresh[INFO_NODES] = {0};
    uint32_t ids[INFO_NODES];
    for (int i = 0; i < INFO_NODES; i++) {
        fresh[i] = nvp_handle_new(NVP_H_GRAPH_NODE, &nrec, sizeof nrec);
        ids[i] = nvp_handle_id(fresh[i]);
        if (!fresh[i])
            e = cudaErrorMemoryAllocation;
    }
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, nvp_handle_id(gh), INFO_NODES};
    struct nvp_reply r = {.out = ids, .out_cap = sizeof ids};
    if (!gh)
        e = cudaErrorMemoryAllocation;
    if (!e)
        e = nvp_call(NVP_OP_CAPTURE_INFO, a, ids, sizeof ids, &r, -1);
    size_t n = e ? 0 : r.out_len / sizeof *ids;
    uint32_t gid = e ? 0 : (uint32_t)r.h.r[2];
    for (size_t i = 0; i < n; i++) {
        uint64_t h = nvp_handle_of(NVP_H_GRAPH_NODE, ids[i]);
        struct nvp_node_rec d;
        if (nvp_handle_get(NVP_H_GRAPH_NODE, h, &d, sizeof d) == 0 && d.graph == 0) {
            d.graph = gid; /* (one of the fresh ones: now a node of the capture's graph) */
            nvp_handle_set(NVP_H_GRAPH_NODE, h, &d, sizeof d);
        }
        info_deps[i] = (cudaGraphNode_t)(uintptr_t)h;
        memset(&info_edges[i], 0, sizeof info_edges[i]);
    }
    for (int i = 0; i < INFO_NODES; i++) {
        struct nvp_node_rec d;
        if (fresh[i] && nvp_handle_get(NVP_H_GRAPH_NODE, fresh[i], &d, sizeof d) == 0 && d.graph == 0)
            nvp_handle_free(NVP_H_GRAPH_NODE, fresh[i]);
    }
    if (gh && gid != nvp_handle_id(gh))
        nvp_handle_free(NVP_H_GRAPH, gh);
    if (e)
        return e;
    *status = (enum cudaStreamCaptureStatus)r.h.r[0];
    if (id)
        *id = r.h.r[1];
    int active = *status == cudaStreamCaptureStatusActive;
    if (graph)
        *graph = active ? (cudaGraph_t)(uintptr_t)nvp_handle_of(NVP_H_GRAPH, gid) : NULL;
    if (deps)
        *deps = active && n ? info_deps : NULL;
    if (edges)
        *edges = active && n ? info_edges : NULL;
    if (ndeps)
        *ndeps = active ? n : 0;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *status,
                                                unsigned long long *id, cudaGraph_t *graph,
                                                const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                                size_t *ndeps)
{
    return nvp_ret(capture_info(s, status, id, graph, deps, edges, ndeps, 0));
}

NVP_EXPORT cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *status,
                                                     unsigned long long *id, cudaGraph_t *graph,
                                                     const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                                     size_t *ndeps)
{
    return nvp_ret(capture_info(s, status, id, graph, deps, edges, ndeps, 1));
}

static cudaError_t update_deps(cudaStream_t s, cudaGraphNode_t *nodes, const cudaGraphEdgeData *edges, size_t n,
                               unsigned flags, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if ((n && !nodes) || n > 4096 || flags > cudaStreamSetCaptureDependencies)
        return cudaErrorInvalidValue;
    if (!plain_edges(edges, n))
        return nvp_unsupported("cudaStreamUpdateCaptureDependencies with edge data (ports, programmatic edges)");
    uint32_t *ids = calloc(n + 1, sizeof *ids);
    if (!ids)
        return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n && !e; i++) { /* (the proxy checks they are nodes of the capture's graph) */
        if (nvp_handle_get(NVP_H_GRAPH_NODE, (uint64_t)(uintptr_t)nodes[i], NULL, 0) != 0)
            e = cudaErrorInvalidValue;
        ids[i] = nvp_handle_id((uint64_t)(uintptr_t)nodes[i]);
    }
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, flags, n};
    struct nvp_reply r = {0};
    if (!e)
        e = nvp_call(NVP_OP_CAPTURE_DEPS, a, ids, n * sizeof *ids, &r, -1);
    free(ids);
    return e;
}

NVP_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t s, cudaGraphNode_t *nodes,
                                                           const cudaGraphEdgeData *edges, size_t n, unsigned flags)
{
    return nvp_ret(update_deps(s, nodes, edges, n, flags, 0));
}

NVP_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t s, cudaGraphNode_t *nodes,
                                                                const cudaGraphEdgeData *edges, size_t n,
                                                                unsigned flags)
{
    return nvp_ret(update_deps(s, nodes, edges, n, flags, 1));
}
