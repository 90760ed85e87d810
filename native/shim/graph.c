/* CUDA graphs made by stream capture: begin/end capture, capture status,
 * instantiate, launch, upload, destroy.  Graphs and executable graphs are
 * nvproxy handles; the proxy captures with the driver and keeps the captured
 * calls, so a restore captures them again (docs/usage.md).  Graphs built node
 * by node (cudaGraphCreate, cudaGraphAdd*Node) are not supported yet. */
#include "shim.h"

#include <stdint.h>

struct graph_rec {
    int device;
};

static cudaError_t capture_begin(cudaStream_t s, enum cudaStreamCaptureMode mode, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return cudaErrorInvalidValue;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, (uint64_t)mode};
    struct nvp_reply r = {0};
    return nvp_call(NVP_OP_CAPTURE_BEGIN, a, NULL, 0, &r, -1);
}

NVP_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    return nvp_ret(capture_begin(s, mode, 0));
}

NVP_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    return nvp_ret(capture_begin(s, mode, 1));
}

static cudaError_t capture_end(cudaStream_t s, cudaGraph_t *graph, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if (!graph)
        return cudaErrorInvalidValue;
    struct graph_rec rec = {nvp_current_device()};
    uint64_t h = nvp_handle_new(NVP_H_GRAPH, &rec, sizeof rec);
    if (!h)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, nvp_handle_id(h)};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_CAPTURE_END, a, NULL, 0, &r, -1);
    if (e) {
        nvp_handle_free(NVP_H_GRAPH, h);
        *graph = NULL;
        return e;
    }
    *graph = (cudaGraph_t)(uintptr_t)h;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    return nvp_ret(capture_end(s, graph, 0));
}

NVP_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *graph)
{
    return nvp_ret(capture_end(s, graph, 1));
}

static cudaError_t capture_status(cudaStream_t s, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                  int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(s, ptds, &w);
    if (e)
        return e;
    if (!status)
        return cudaErrorInvalidValue;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_CAPTURE_STATUS, a, NULL, 0, &r, -1)))
        return e;
    *status = (enum cudaStreamCaptureStatus)r.h.r[0];
    if (id)
        *id = r.h.r[1];
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    return nvp_ret(capture_status(s, status, NULL, 0));
}

NVP_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    return nvp_ret(capture_status(s, status, NULL, 1));
}

/* The graph being captured and its open dependencies are the driver's inside the
 * proxy: a caller asking for them is told there are none. */
static cudaError_t capture_info(cudaStream_t s, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                cudaGraph_t *graph, const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
                                size_t *ndeps, int ptds)
{
    cudaError_t e = capture_status(s, status, id, ptds);
    if (e)
        return e;
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
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

static cudaError_t instantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    struct graph_rec rec;
    if (!exec || nvp_handle_get(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph, &rec, sizeof rec) != 0)
        return cudaErrorInvalidValue;
    uint64_t h = nvp_handle_new(NVP_H_GRAPH_EXEC, &rec, sizeof rec);
    if (!h)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id(h), nvp_handle_id((uint64_t)(uintptr_t)graph), flags};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_GRAPH_INSTANTIATE, a, NULL, 0, &r, -1))) {
        nvp_handle_free(NVP_H_GRAPH_EXEC, h);
        return e;
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
    uint64_t a[NVP_MAX_ARGS] = {nvp_handle_id((uint64_t)(uintptr_t)exec), (uint64_t)w, (uint64_t)upload};
    return nvp_call(NVP_OP_GRAPH_LAUNCH, a, NULL, 0, NULL, -1); /* asynchronous, like a kernel launch */
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
    return e;
}

NVP_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) { return nvp_ret(destroy(NVP_H_GRAPH, (uint64_t)(uintptr_t)graph)); }

NVP_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    return nvp_ret(destroy(NVP_H_GRAPH_EXEC, (uint64_t)(uintptr_t)exec));
}
