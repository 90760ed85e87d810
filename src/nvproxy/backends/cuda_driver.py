"""Thin cffi binding of the libcuda calls the GPU backend makes itself.

Initialisation, devices and primary contexts, virtual memory management,
cuFuncGetParamInfo, cuLaunchHostFunc, registering raw host ranges, and the
per-call hot path (launch, copies, streams, events).
cffi releases the GIL around every call, so a thread blocked in a
synchronisation never stalls the others.
"""

from __future__ import annotations

from ..errors import CudaError
from ..ffi_prebuilt import load

# (parsed when the package is built: ffi_prebuilt.py)
CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void (*CUhostFn)(void *userData);
typedef struct CUlinkState_st *CUlinkState;
typedef int CUjit_option;

typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType; unsigned char gpuDirectRDMACapable; unsigned short usage;
             unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct {
    size_t srcXInBytes, srcY; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice; void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice;
    void *srcArray; void *reserved0; size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice;
    void *dstArray; void *reserved1; size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct CUarray_st *CUarray;
typedef unsigned long long CUtexObject;
typedef unsigned long long CUsurfObject;
typedef struct { size_t Width, Height, Depth; int Format; unsigned int NumChannels; unsigned int Flags; }
    CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
    int resType;
    union {
        struct { CUarray hArray; } array;
        struct { void *hMipmappedArray; } mipmap;
        struct { CUdeviceptr devPtr; int format; unsigned int numChannels; size_t sizeInBytes; } linear;
        struct { CUdeviceptr devPtr; int format; unsigned int numChannels; size_t width; size_t height;
                 size_t pitchInBytes; } pitch2D;
        struct { int reserved[32]; } reserved;
    } res;
    unsigned int flags;
} CUDA_RESOURCE_DESC;
typedef struct {
    int addressMode[3]; int filterMode; unsigned int flags; unsigned int maxAnisotropy; int mipmapFilterMode;
    float mipmapLevelBias, minMipmapLevelClamp, maxMipmapLevelClamp; float borderColor[4]; int reserved[12];
} CUDA_TEXTURE_DESC;
typedef struct {
    CUfunction func; unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams; void **extra; void *kern; CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;
typedef struct { CUdeviceptr dst; size_t pitch; unsigned int value, elementSize; size_t width, height; }
    CUDA_MEMSET_NODE_PARAMS;
typedef struct { CUhostFn fn; void *userData; } CUDA_HOST_NODE_PARAMS;
typedef struct { int result; CUgraphNode errorNode; CUgraphNode errorFromNode; } CUgraphExecUpdateResultInfo;
typedef struct {
    unsigned long long handle; int type; unsigned int size; CUgraph *phGraph_out; CUcontext ctx;
} CUDA_CONDITIONAL_NODE_PARAMS;
typedef struct {
    int type; int reserved0[3];
    union { long long reserved1[29]; CUDA_CONDITIONAL_NODE_PARAMS conditional; };
    long long reserved2;
} CUgraphNodeParams;

CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuCtxSynchronize(void);
CUresult cuCtxSetLimit(int limit, size_t value);
CUresult cuCtxGetLimit(size_t *pvalue, int limit);
CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
CUresult cuCtxSetCacheConfig(int config);
CUresult cuCtxGetCacheConfig(int *pconfig);
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);
CUresult cuCtxDisablePeerAccess(CUcontext peerContext);
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice dev);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option);

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut);
CUresult cuLinkAddData_v2(CUlinkState state, int type, void *data, size_t size, const char *name,
                          unsigned int numOptions, CUjit_option *options, void **optionValues);
CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut);
CUresult cuLinkDestroy(CUlinkState state);
CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags);
CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, uint64_t value, unsigned int flags);
CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned int flags);
CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, uint64_t value, unsigned int flags);
CUresult cuTensorMapEncodeTiled(void *tensorMap, int tensorDataType, uint32_t tensorRank, void *globalAddress,
                                const uint64_t *globalDim, const uint64_t *globalStrides, const uint32_t *boxDim,
                                const uint32_t *elementStrides, int interleave, int swizzle, int l2Promotion,
                                int oobFill);
CUresult cuTensorMapEncodeIm2col(void *tensorMap, int tensorDataType, uint32_t tensorRank, void *globalAddress,
                                 const uint64_t *globalDim, const uint64_t *globalStrides,
                                 const int *pixelBoxLowerCorner, const int *pixelBoxUpperCorner,
                                 uint32_t channelsPerPixel, uint32_t pixelsPerColumn, const uint32_t *elementStrides,
                                 int interleave, int swizzle, int l2Promotion, int oobFill);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
                           CUstream hStream);
CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height,
                            CUstream hStream);
CUresult cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,
                            CUstream hStream);

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy);
CUresult cuTexObjectCreate(CUtexObject *pTexObject, const CUDA_RESOURCE_DESC *pResDesc,
                           const CUDA_TEXTURE_DESC *pTexDesc, const void *pResViewDesc);
CUresult cuTexObjectDestroy(CUtexObject texObject);
CUresult cuSurfObjectCreate(CUsurfObject *pSurfObject, const CUDA_RESOURCE_DESC *pResDesc);
CUresult cuSurfObjectDestroy(CUsurfObject surfObject);

typedef struct { char reserved[64]; } CUipcEventHandle;
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, int shHandleType);
CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event);
CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle);

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuStreamSetAttribute(CUstream hStream, int attr, const void *value);
CUresult cuStreamGetAttribute(CUstream hStream, int attr, void *value_out);
CUresult cuCtxResetPersistingL2Cache(void);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, int *captureStatus_out, unsigned long long *id_out,
                                   CUgraph *graph_out, void *dependencies_out, void *edgeData_out,
                                   size_t *numDependencies_out);
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                     const void *dependencyData, size_t numDependencies, int mode);
CUresult cuStreamUpdateCaptureDependencies_v2(CUstream hStream, CUgraphNode *dependencies,
                                              const void *dependencyData, size_t numDependencies, unsigned int flags);
CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuGraphAddEventRecordNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e);
CUresult cuGraphAddEventWaitNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e);
CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                 const CUDA_KERNEL_NODE_PARAMS *p);
CUresult cuGraphAddMemcpyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                              const CUDA_MEMCPY3D *p, CUcontext ctx);
CUresult cuGraphAddMemsetNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                              const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx);
CUresult cuGraphAddHostNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                            const CUDA_HOST_NODE_PARAMS *p);
CUresult cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, const void *edgeData, size_t ndeps,
                           CUgraphNodeParams *p);
CUresult cuGraphConditionalHandleCreate(unsigned long long *pHandle_out, CUgraph hGraph, CUcontext ctx,
                                        unsigned int defaultLaunchValue, unsigned int flags);
CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes);
CUresult cuGraphNodeGetType(CUgraphNode hNode, int *type);
CUresult cuGraphNodeFindInClone(CUgraphNode *phNode, CUgraphNode hOriginalNode, CUgraph hClonedGraph);
CUresult cuGraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps);
CUresult cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g, CUgraphExecUpdateResultInfo *info);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec x, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData);

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);

CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name);
CUresult cuFuncGetAttribute(int *pi, int attrib, CUfunction hfunc);
CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value);
CUresult cuFuncSetCacheConfig(CUfunction hfunc, int config);
CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags);
CUresult cuProfilerStart(void);
CUresult cuProfilerStop(void);
"""
ffi = load("cuda_driver", CDEF)

CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910
CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
CU_JIT_INPUT_FATBINARY = 2
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_STREAM_CAPTURE_MODE_RELAXED = 2
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEMHOSTREGISTER_PORTABLE = 1
CU_MEMHOSTREGISTER_DEVICEMAP = 2
CU_MEMHOSTREGISTER_READ_ONLY = 8
CU_MEMORYTYPE_HOST = 1
CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
CU_MEMORYTYPE_ARRAY = 3
CU_MEMORYTYPE_UNIFIED = 4
CU_TRSF_READ_AS_INTEGER, CU_TRSF_NORMALIZED_COORDINATES, CU_TRSF_SRGB = 0x01, 0x02, 0x10
CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION, CU_TRSF_SEAMLESS_CUBEMAP = 0x20, 0x40
CU_RESOURCE_TYPE_ARRAY, CU_RESOURCE_TYPE_LINEAR, CU_RESOURCE_TYPE_PITCH2D = 0, 2, 3
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2
CU_LAUNCH_PARAM_END = 0
CU_FUNC_ATTRIBUTES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)  # max threads .. preferred carveout
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = ffi.dlopen("libcuda.so.1")
    return _lib


def check(rc: int, what: str = "") -> None:
    # the driver's CUresult values for the errors the runtime API can report
    # coincide with cudaError_t, so no translation table is needed
    if rc:
        raise CudaError(rc, what)
