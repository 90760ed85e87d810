/*
 * nvproxy wire format: the one definition of every message between the shim
 * (in the application) and the proxy daemon.  Python reads the block between
 * the CDEF markers with cffi, so it must stay plain C declarations and
 * integer #defines.
 *
 * A channel is a SOCK_STREAM Unix socket.  Each application thread owns one
 * call channel; the shim's callback thread owns one callback channel.
 *
 *   request:  struct nvp_req, then (len - sizeof req) payload bytes
 *   reply:    struct nvp_rep, then text_len bytes of captured device printf
 *             output, then the rest of the payload
 *
 * Requests with NVP_F_REPLY set are answered with exactly one reply; all other
 * requests are fire-and-forget (CUDA's asynchronous calls).  seq is a
 * process-wide counter taken by the shim just before writing, so the proxy
 * can execute submissions from all channels in the order the application
 * made them.  seq 0 means "unordered" (HELLO only).
 */
#ifndef NVPROXY_WIRE_H
#define NVPROXY_WIRE_H
#include <stdint.h>

/* CDEF-BEGIN */
#define NVP_PROTO_VERSION 1
#define NVP_MAX_ARGS 8
#define NVP_MAX_PAYLOAD 268435456

/* request flags */
#define NVP_F_REPLY 1
#define NVP_F_MAILBOX 2 /* the reply may come through the channel's mailbox: the thread awaits no other reply */

/* channel kinds (HELLO a[3]) */
#define NVP_CHAN_CALL 0
#define NVP_CHAN_CALLBACK 1
#define NVP_CHAN_PAGES 2 /* the shim's managed-memory fault thread: MANAGED_FETCH only, served beside the call order */

/* operations: a[i] meanings are given beside each */
#define NVP_OP_HELLO 1            /* a0 pid, a1 tid, a2 proto, a3 kind, a4 NVP_HELLO_* -> r0 device count, r1 backend
                                     (0 gpu, 1 sim); with NVP_HELLO_MAILBOX, the mailbox's memfd (SCM_RIGHTS) */
#define NVP_OP_DEVICE_INFO 2      /* a0 dev -> payload struct nvp_device_info */
#define NVP_OP_SET_DEVICE 3       /* a0 dev, a1 flags (cudaSetDeviceFlags value or ~0) */
#define NVP_OP_DEVICE_SYNC 4      /* wait for all work of the current device */
#define NVP_OP_DEVICE_RESET 5
#define NVP_OP_MALLOC 6           /* a0 size -> r0 device pointer */
#define NVP_OP_FREE 7             /* a0 device pointer (synchronises the device first) */
#define NVP_OP_MEM_INFO 8         /* -> r0 free, r1 total */
#define NVP_OP_HOST_REGISTER 9    /* a0 addr, a1 size, a2 flags; memfd passed with SCM_RIGHTS */
#define NVP_OP_HOST_UNREGISTER 10 /* a0 addr */
#define NVP_OP_MEMCPY 11          /* a0 dst, a1 src, a2 bytes, a3 stream; both addresses valid in the proxy */
#define NVP_OP_MEMCPY_2D 12       /* a0 dst, a1 dpitch, a2 src, a3 spitch, a4 width, a5 height, a6 stream */
#define NVP_OP_MEMSET 13          /* a0 ptr, a1 value, a2 bytes, a3 stream */
#define NVP_OP_MEMSET_2D 14       /* a0 ptr, a1 pitch, a2 value, a3 width, a4 height, a5 stream */
#define NVP_OP_STREAM_CREATE 15   /* a0 id, a1 flags, a2 priority */
#define NVP_OP_STREAM_DESTROY 16  /* a0 id */
#define NVP_OP_STREAM_SYNC 17     /* a0 id */
#define NVP_OP_STREAM_QUERY 18    /* a0 id */
#define NVP_OP_STREAM_WAIT_EVENT 19 /* a0 stream, a1 event, a2 flags */
#define NVP_OP_HOST_FUNC 20       /* a0 stream, a1 callback id: run callback id in the application, in stream order;
                                     a2 1: nvproxy's own (staging a captured copy: its node is not listed) */
#define NVP_OP_EVENT_CREATE 21    /* a0 id, a1 flags */
#define NVP_OP_EVENT_DESTROY 22   /* a0 id */
#define NVP_OP_EVENT_RECORD 23    /* a0 event, a1 stream, a2 flags */
#define NVP_OP_EVENT_SYNC 24      /* a0 event */
#define NVP_OP_EVENT_QUERY 25     /* a0 event */
#define NVP_OP_EVENT_ELAPSED 26   /* a0 start, a1 end -> r0 float bits of milliseconds */
#define NVP_OP_MODULE_LOAD 27     /* a0 module id; payload: fatbinary */
#define NVP_OP_KERNEL_INFO 28     /* a0 module id, a1 kernel id; payload: NUL-terminated device name -> struct nvp_kernel_info + nparams x struct nvp_param */
#define NVP_OP_VAR_INFO 29        /* a0 module id; payload: NUL-terminated name -> r0 device address, r1 size */
#define NVP_OP_LAUNCH 30          /* a0 kernel, a1 grid x|y<<32, a2 grid z|block x<<32, a3 block y|z<<32, a4 shmem, a5 stream, a6 flags; payload: parameter block */
#define NVP_OP_FUNC_SET_ATTR 31   /* a0 kernel, a1 cudaFuncAttribute, a2 value */
#define NVP_OP_OCCUPANCY 32       /* a0 kernel, a1 block size, a2 dynamic smem, a3 flags -> r0 blocks per SM */
#define NVP_OP_SET_LIMIT 33       /* a0 cudaLimit, a1 value */
#define NVP_OP_GET_LIMIT 34       /* a0 cudaLimit -> r0 */
#define NVP_OP_PROFILER 35        /* a0 1 start, 0 stop */
#define NVP_OP_STREAM_PRIORITY_RANGE 36 /* -> r0 least, r1 greatest (as int32) */
#define NVP_OP_CACHE_CONFIG 37    /* a0 0 device set, 1 device get, 2 func set; a1 value, a2 kernel -> r0 */
#define NVP_OP_PEER 38            /* a0 0 can-access, 1 enable, 2 disable; a1 peer, a2 flags, a3 device -> r0 */
#define NVP_OP_STAGED_COPY 39     /* a0 device/registered address, a1 staging offset, a2 bytes, a3 stream, a4 dir (0 H2D, 1 D2H),
                                     a5 posted number (0: none), a6 NVP_STAGED_*, a7 see NVP_STAGED_CAPTURE.  A posted (host-to-device) copy
                                     may be answered once it is issued, before its DMA ends: at once for
                                     cudaMemcpyAsync, for cudaMemcpy once every stream it waits for was idle (as the
                                     runtime's pageable copy returns once the bytes are staged).  The mailbox's
                                     posted_done says which posted copies are done; their staging may be reused. */
#define NVP_STAGED_ASYNC 1        /* a6: cudaMemcpyAsync (no stream need be idle) */
#define NVP_STAGED_UNANSWERED 2   /* a6: a posted copy sent without NVP_F_REPLY: the shim knows its answer (shim
                                     memory.c, "a run"); a failure to issue it is the next reply's async_err */
#define NVP_STAGED_CAPTURE 4      /* a6: a synchronous copy from pinned memory at a7: the proxy takes its bytes into the
                                     staging buffer once the streams it waits for are idle, and answers then, as if
                                     the DMA had ended (else it copies from a7 and answers once done) */
#define NVP_STAGED_RUN 1          /* r0 of a posted copy's answer: the proxy's C path took it, and would take such
                                     copies after it (a run may begin) */
#define NVP_OP_STAGING 40         /* a0 size; memfd passed with SCM_RIGHTS -> r0 proxy-side address; or a1 a spare
                                   * buffer's proxy-side address, a2 its memfd's inode (no fd) -> r0 a1, or 0 */
#define NVP_OP_FLUSH 41           /* no-op with a reply: collects pending async errors and printf text */
#define NVP_OP_STREAM_ATTR 42     /* a0 stream, a1 cudaStreamAttrID, a2 0 set (payload: the 64-byte value) / 1 get (-> payload) */
#define NVP_OP_RESET_PERSISTING_L2 43 /* cudaCtxResetPersistingL2Cache on the current device */
#define NVP_OP_CAPTURE_BEGIN 44   /* a0 stream, a1 cudaStreamCaptureMode */
#define NVP_OP_CAPTURE_END 45     /* a0 stream, a1 graph id (new) */
#define NVP_OP_CAPTURE_STATUS 46  /* a0 stream -> r0 cudaStreamCaptureStatus, r1 capture id */
#define NVP_OP_GRAPH_INSTANTIATE 47 /* a0 exec id (new), a1 graph id, a2 flags */
#define NVP_OP_GRAPH_LAUNCH 48    /* a0 exec id, a1 stream, a2 0 launch / 1 upload */
#define NVP_OP_GRAPH_DESTROY 49   /* a0 id, a1 0 graph / 1 exec */
#define NVP_OP_GRAPH_CREATE 50    /* a0 graph id (new), a1 flags */
#define NVP_OP_GRAPH_ADD_NODE 51  /* a0 graph id, a1 node id (new), a2 NVP_NODE_*, a3 dependencies;
                                     payload: u32 node ids (dependencies, padded to 8 bytes), then the kind's body */
#define NVP_OP_GRAPH_EXEC_KERNEL 52 /* a0 exec id, a1 kernel node id; payload: an NVP_NODE_KERNEL body */
#define NVP_OP_GRAPH_CLONE 53     /* a0 graph id (new), a1 graph id */
#define NVP_OP_GRAPH_EXEC_UPDATE 54 /* a0 exec id, a1 graph id; reply r0 cudaGraphExecUpdateResult */
#define NVP_OP_RESTORE_DONE 55    /* after a restore from an image: the shim has shared its pinned memory again */
#define NVP_OP_ARRAY_CREATE 56   /* a0 array id (new); payload struct nvp_array_desc */
#define NVP_OP_ARRAY_DESTROY 57  /* a0 array id */
#define NVP_OP_COPY_3D 58        /* a0 stream; payload struct nvp_copy3d (CUDA arrays on one side or both) */
#define NVP_OP_TEX_CREATE 59     /* a0 0 texture / 1 surface; payload struct nvp_tex_create -> r0 object */
#define NVP_OP_TEX_DESTROY 60    /* a0 0 texture / 1 surface, a1 object */
#define NVP_OP_GRAPH_GET_NODES 61 /* a0 graph id, a1 nodes wanted (0: count only); payload: that many u32 node ids
                                      (new, for nodes nvproxy has not named yet) -> r0 nodes in the graph; payload:
                                      u32 node id, u32 NVP_NODE_* (0: another kind) per node returned */
#define NVP_OP_IPC_MEM_EXPORT 62  /* a0 device pointer -> payload: the 64-byte cudaIpcMemHandle_t (struct nvp_ipc_mem) */
#define NVP_OP_IPC_MEM_OPEN 63    /* a0 flags; payload: a cudaIpcMemHandle_t -> r0 device pointer, r1 mapping base, r2 its size */
#define NVP_OP_IPC_MEM_CLOSE 64   /* a0 device pointer it opened -> r0 1 if that closed the mapping, r1 its base */
#define NVP_OP_IPC_EVENT_EXPORT 65 /* a0 event -> payload: the driver's 64-byte cudaIpcEventHandle_t */
#define NVP_OP_IPC_EVENT_OPEN 66  /* a0 event id (new); payload: a cudaIpcEventHandle_t */
#define NVP_OP_GRAPH_COND_HANDLE 67 /* a0 graph id, a1 default value, a2 flags -> r0 the driver's conditional handle */
#define NVP_OP_CAPTURE_INFO 68   /* a0 stream, a1 graph id (new, if the capture has none yet), a2 node ids offered;
                                     payload: that many u32 node ids (new) -> r0 status, r1 capture id, r2 graph id,
                                     r3 dependencies; payload: their u32 node ids */
#define NVP_OP_CAPTURE_TO_GRAPH 69 /* a0 stream, a1 cudaStreamCaptureMode, a2 graph id, a3 dependencies;
                                      payload: their u32 node ids */
#define NVP_OP_CAPTURE_DEPS 70   /* a0 stream, a1 flags, a2 dependencies; payload: their u32 node ids */
#define NVP_OP_MANAGED_VAR 71    /* a0 module id, a1 the application's copy, a2 size; payload: the variable's name */
#define NVP_OP_STAGED_FENCE 72    /* a0 posted number: reply once every posted copy up to it is done */
/* 73-79: NVIDIA math libraries (libcall.c, handlers/libs.py); 80-89: the driver API (driver.c, handlers/driver.py) */
#define NVP_OP_LIB_CALL 73        /* a math library's function (shim libcall.c, proxy libexec.c, handlers/libs.py): a0 function
                                     id (src/nvproxy/libs/spec.py), a1 which parameters are host memory this time (bit i:
                                     parameter i; a mode-dependent scalar or result), a2 bytes of host outputs,
                                     a3 1: posted (sent without NVP_F_REPLY);
                                     payload: one u64 slot per parameter, then the host inputs, each padded to 8 bytes
                                     -> r0 the function's status (or value), r1/r2 status and function id of an earlier
                                     posted call of this thread that failed (0: none); payload: the host outputs, padded
                                     likewise, or a returned string (or, r2 | NVP_LIB_OUT_IN_R3: the host outputs, 8
                                     bytes at most, are r3's, and there is no payload).  Without NVP_F_REPLY (a
                                     stream-ordered call that writes only device memory) a failure is printed and
                                     reported by r1/r2 with the thread's next call of its library that waits. */
#define NVP_OP_DRV_MODULE_UNLOAD 80 /* a0 module id: the proxy forgets it and its kernels (cuModuleUnload) */
#define NVP_OP_DRV_MEMSET 81      /* a0 ptr, a1 pitch, a2 value, a3 element size (1, 2, 4), a4 width (elements),
                                     a5 height, a6 stream (cuMemsetD16/D32, 2D or not) */
#define NVP_OP_DRV_STREAM_MEMOP 82 /* a0 stream, a1 NVP_MEMOP_*, a2 address, a3 value, a4 the driver's flags
                                      (cuStreamWriteValue32/64, cuStreamWaitValue32/64; posted) */
#define NVP_OP_DRV_LINK 83        /* a0 inputs; payload: per input u32 CUjitInputType, u32 name bytes, u64 data
                                     bytes, then name and data, each padded to 8 bytes -> r0 the linked image's
                                     bytes; payload: the image (cuLinkComplete) */
#define NVP_OP_DRV_TENSOR_MAP 84  /* a0 0 tiled / 1 im2col; payload struct nvp_tensor_map -> payload: the
                                     128-byte CUtensorMap (cuTensorMapEncodeTiled/Im2col) */
#define NVP_OP_DRV_VMM 85         /* the driver's virtual memory management: a0 NVP_VMM_*, then per kind:
                                     RESERVE a1 size, a2 alignment, a3 address wanted (0: any) -> r0 address;
                                     FREE a1 address, a2 size; CREATE a1 id (new), a2 size, a3 device; payload the
                                     CUmemAllocationProp; RELEASE a1 id; MAP a1 address, a2 size, a3 offset, a4 id;
                                     UNMAP a1 address, a2 size; ACCESS a1 address, a2 size; payload: per device a
                                     u32 location type, u32 device, u32 CUmemAccess_flags, u32 0;
                                     GET_ACCESS a1 address, a2 device -> r0 flags; GRANULARITY a1 device -> r0;
                                     RETAIN a1 an address it maps -> r0 id */
#define NVP_OP_MANAGED_ALLOC 86  /* a0 size, a1 device, a2 0: new (r0 the address, device memory there, zeroed) or
                                     the address the image restored (a recovery); memfd passed with SCM_RIGHTS: the
                                     host side, which the proxy maps where it likes (managed_pages.c) */
#define NVP_OP_MANAGED_PUSH 87   /* payload: u64 (address, bytes) pairs: host copies to device memory, done before
                                     the next request (posted) */
#define NVP_OP_MANAGED_FETCH 88  /* a0 address, a1 bytes, a2 the last push of it (0: none): device memory to the host
                                     copy, once the requests up to a2 have run; on an NVP_CHAN_PAGES channel */
#define NVP_OP_COUNT 90

/* node bodies (little-endian, packed as listed) */
#define NVP_NODE_KERNEL 1 /* u32 kernel id, u32 grid[3], u32 block[3], u32 shmem, u32 param bytes; params */
#define NVP_NODE_MEMCPY 2 /* u64 dst, src, width bytes, height, depth, dst pitch, src pitch, dst rows, src rows */
#define NVP_NODE_MEMSET 3 /* u64 dst, pitch, u32 value, u32 element size, u64 width (elements), height */
#define NVP_NODE_HOST 4   /* u64 callback id (run in the application, kept) */
#define NVP_NODE_EMPTY 5
#define NVP_NODE_EVENT_RECORD 7 /* u32 event */
#define NVP_NODE_EVENT_WAIT 8   /* u32 event */
#define NVP_NODE_CHILD 9        /* u32 child graph id (its calls go into the node's record: the child may go) */
#define NVP_NODE_MEM_ALLOC 10   /* (the shim's kind: memory from the arena; the proxy adds an empty node) */
#define NVP_NODE_MEM_FREE 11    /* (likewise) */
#define NVP_NODE_HIDDEN 0x100   /* flag on a2 of GRAPH_ADD_NODE: nvproxy's own node (staging), not listed */
#define NVP_NODE_COND 6   /* u64 conditional handle, u32 cudaGraphConditionalNodeType, u32 size; u32 body graph ids (new) */
#define NVP_STREAM_ATTR_BYTES 64

/* DRV_VMM kinds */
#define NVP_VMM_RESERVE 0
#define NVP_VMM_FREE 1
#define NVP_VMM_CREATE 2
#define NVP_VMM_RELEASE 3
#define NVP_VMM_MAP 4
#define NVP_VMM_UNMAP 5
#define NVP_VMM_ACCESS 6
#define NVP_VMM_GET_ACCESS 7
#define NVP_VMM_GRANULARITY 8
#define NVP_VMM_RETAIN 9

/* DRV_STREAM_MEMOP kinds */
#define NVP_MEMOP_WRITE32 0
#define NVP_MEMOP_WRITE64 1
#define NVP_MEMOP_WAIT32 2
#define NVP_MEMOP_WAIT64 3

/* DRV_TENSOR_MAP: the arguments of cuTensorMapEncodeTiled (box) or cuTensorMapEncodeIm2col (corners, channels,
   pixels), the driver's enum values */
struct nvp_tensor_map {
    uint32_t data_type, rank;
    uint64_t address;
    uint64_t dims[5], strides[4];
    uint32_t box[5], elem_strides[5];
    int32_t lower[3], upper[3];
    uint32_t channels, pixels;
    uint32_t interleave, swizzle, l2_promotion, oob_fill;
};

/* launch flags */
#define NVP_LAUNCH_COOPERATIVE 1

/* memcpy a4 (MEMCPY) flags: none yet */

/* CUDA arrays and texture/surface objects (runtime enum values throughout) */
struct nvp_chan_fmt {
    int32_t x, y, z, w; /* bits per channel */
    int32_t f;          /* cudaChannelFormatKind */
};
struct nvp_array_desc {
    uint64_t width, height, depth; /* elements; 0 height/depth: 1D/2D as cudaMalloc3DArray takes them */
    struct nvp_chan_fmt fmt;
    uint32_t flags;                /* cudaArray* flags (the driver's CUDA_ARRAY3D_* values) */
};
#define NVP_SIDE_LINEAR 0  /* addr: device or pinned host address valid in the proxy */
#define NVP_SIDE_ARRAY 1   /* addr: array id */
#define NVP_SIDE_STAGING 2 /* addr: offset in the calling channel's staging buffer */
struct nvp_copy_side {
    uint64_t kind, addr;
    uint64_t pitch, rows; /* linear: bytes per row, rows per slice */
    uint64_t x, y, z;     /* x in bytes */
};
struct nvp_copy3d {
    struct nvp_copy_side src, dst;
    uint64_t width, height, depth; /* width in bytes */
};
struct nvp_tex_create {
    int32_t res_type; /* cudaResourceType: array, linear, pitch2D */
    int32_t pad;
    uint64_t res;     /* array id or device address */
    struct nvp_chan_fmt fmt;
    int32_t pad2;
    uint64_t size, width, height, pitch; /* linear: size; pitch2D: width, height (elements), pitch */
    int32_t address[3], filter, read_mode, srgb;
    float border[4];
    int32_t normalized;
    uint32_t max_aniso;
    int32_t mip_filter;
    float mip_bias, mip_min, mip_max;
    int32_t no_trilinear, seamless;
};

/* cudaIpcMemHandle_t as nvproxy fills it: the exporting application (a name that its
 * proxies keep across migrations and restarts, and its pid then), the allocation and a
 * secret the exporter checks before it hands the memory to another proxy */
#define NVP_IPC_MAGIC 0x4950564e /* "NVPI" */
struct nvp_ipc_mem {
    uint32_t magic;
    uint32_t pid;   /* the exporting application, when it exported (messages) */
    uint32_t dev;
    uint32_t pad;
    uint64_t token;
    uint64_t base, size; /* the proxy's allocation holding the pointer */
    uint64_t offset;     /* of the pointer in it */
    uint64_t pool_secret; /* cudaMemPoolExportPointer's: the pool it may be imported through */
    uint64_t exporter;    /* the exporter's name (its proxy registers under it) */
};

/* cudaIpcEventHandle_t as nvproxy fills it: the importing proxy asks the exporter's proxy
 * for the driver's handle of the event it has now (a restart makes the event again) */
#define NVP_IPC_EVENT_MAGIC 0x4556504e /* "NVPE" */
struct nvp_ipc_event {
    uint32_t magic;
    uint32_t pid;
    uint64_t exporter;
    uint64_t event; /* the exporter's wire id */
    uint64_t token;
    uint8_t reserved[32];
};

/* callback channel message, both directions */
struct nvp_cb {
    uint32_t len;
    int32_t status;
    uint64_t id;
    uint64_t flags; /* NVP_CB_KEEP: a graph's host node, called again at each launch */
};
#define NVP_CB_KEEP 1

struct nvp_req {
    uint32_t len;
    uint16_t op;
    uint16_t flags;
    uint64_t seq;
    uint64_t a[8];
};

struct nvp_rep {
    uint32_t len;
    int32_t err;        /* result of this call (a cudaError_t) */
    int32_t async_err;  /* first failure of this channel's earlier async calls, or 0 */
    uint32_t text_len;  /* captured kernel printf bytes at the start of the payload */
    uint64_t r[4];
};

/* A call channel's reply mailbox: a page of shared memory (a memfd sealed against shrinking, sent with the
 * HELLO) where the proxy's native fast path leaves a bare reply (no text, no payload) instead of writing it to
 * the socket, while the thread waiting for it spins.  A round trip between two processes took 3.7 us over a Unix
 * socket on the GPU machine and 0.3 us through shared memory.  Only a request marked NVP_F_MAILBOX may be answered
 * there: its thread has read every earlier reply and waits for this one alone, so one slot is enough and no reply
 * on the socket can come before it.  state moves EMPTY -> FULL (the proxy, by compare-and-swap,
 * after writing rep) -> EMPTY (the thread, after reading it); a thread about to sleep in poll(2) moves EMPTY ->
 * SLEEPING, and a proxy that finds SLEEPING writes the reply to the socket instead. */
#define NVP_HELLO_MAILBOX 1
#define NVP_MAILBOX_BYTES 4096
#define NVP_MB_EMPTY 0
#define NVP_MB_SLEEPING 1
#define NVP_MB_FULL 2
/* The mailbox's request slot goes the other way, for one request of up to NVP_MB_REQ_MAX bytes (no descriptors):
 * the proxy opens it (CLOSED -> OPEN) while its C loop polls it, that is while it serves the process's calling
 * threads (nvpf_serve, nvpf_serve_many); the thread writes a request there and moves OPEN -> POSTED by compare-and-swap
 * (finding it CLOSED, it writes to the socket); the proxy takes the request and moves POSTED -> OPEN, and closes
 * the slot when it stops polling (a request still POSTED then goes to Python with it).  Requests keep their seq,
 * so one that comes through the slot before an earlier one through the socket is still executed after it.  The
 * thread counts what it writes to the socket in sent, so the polling proxy reads the socket only when there is
 * something (and every 50 us besides); the proxy counts its replies on the socket in replied, for the same. */
#define NVP_SLOT_CLOSED 0
#define NVP_SLOT_OPEN 1
#define NVP_SLOT_POSTED 2
#define NVP_MB_REQ_MAX 3968
struct nvp_mailbox {
    uint32_t state;
    uint32_t pad;
    struct nvp_rep rep;
    uint8_t pad2[8];
    uint32_t slot;     /* NVP_SLOT_* */
    uint32_t slot_len; /* the posted request's bytes */
    uint32_t sent;     /* requests the thread wrote to the socket (a proxy polling the slot reads it only then) */
    uint32_t replied;  /* replies the proxy wrote to the socket (a thread spinning on the mailbox reads it then) */
    uint64_t posted_done; /* every posted staged copy numbered up to this is done (the proxy writes it) */
    uint8_t pad3[40];
    uint8_t req[3968]; /* NVP_MB_REQ_MAX */
};

/* Device properties as the runtime builds them: the shim fills
 * cudaDeviceProp from these, and answers cudaDeviceGetAttribute locally. */
#define NVP_MAX_ATTR 160
struct nvp_device_info {
    char name[256];
    uint8_t uuid[16];
    uint64_t total_mem;
    uint64_t arena_base;    /* device virtual arena: cudaMalloc results lie inside */
    uint64_t arena_size;
    int32_t attr[160];      /* indexed by cudaDeviceAttr */
};

struct nvp_kernel_info {
    uint32_t nparams;
    uint32_t param_size;     /* bytes of the packed parameter block */
    int32_t max_threads;     /* cudaFuncAttributes, queried once */
    int32_t num_regs;
    int32_t shared_static;
    int32_t const_size;
    int32_t local_size;
    int32_t max_dyn_shared;
    int32_t ptx_version;
    int32_t binary_version;
    int32_t cache_mode_ca;
    int32_t preferred_carveout;
};

struct nvp_param {
    uint32_t offset;
    uint32_t size;
};
/* CDEF-END */

/* NVP_OP_LIB_CALL's reply: its host outputs are r3 (a reply with no payload can come through the mailbox) */
#define NVP_LIB_OUT_IN_R3 ((uint64_t)1 << 32)

/* NVP_OP_LIB_CALL's slot of a float or double parameter: its bits (in the low half for a float) */
static inline uint64_t nvp_slot_of_f4(float f)
{
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    return u;
}
static inline uint64_t nvp_slot_of_f8(double d)
{
    uint64_t u;
    __builtin_memcpy(&u, &d, 8);
    return u;
}
static inline float nvp_f4_of_slot(uint64_t v)
{
    uint32_t u = (uint32_t)v;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
static inline double nvp_f8_of_slot(uint64_t v)
{
    double d;
    __builtin_memcpy(&d, &v, 8);
    return d;
}

static inline void nvp_cpu_relax(void) /* (in a spin loop: lets a sibling hyperthread run) */
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* For a side spinning on a mailbox (the thread for its reply, the proxy for the slot): whether to read its socket
 * now, that is whether the other side's count of socket writes (*count: replied or sent) moved since *seen, or
 * `every` ns went by since the last read. */
static inline int nvp_socket_due(const uint32_t *count, uint32_t *seen, uint64_t now, uint64_t *next, uint64_t every)
{
    uint32_t c = __atomic_load_n(count, __ATOMIC_ACQUIRE);
    if (c == *seen && now < *next)
        return 0;
    *seen = c;
    *next = now + every;
    return 1;
}

#endif
