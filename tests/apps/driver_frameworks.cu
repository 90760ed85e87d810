// The driver calls frameworks make of libcuda.so.1, which they dlopen: Triton's (primary context made current,
// cuFuncGetAttribute and cuFuncSetAttribute, pointer attributes, tensor maps), CuPy's (cuLinkCreate, AddFile,
// AddData, Complete, the linked image loaded, its global looked up) and PyTorch's (cuStreamWriteValue32,
// cuMemsetD32Async, cuGetErrorString).  Then `steps` rounds (pausing `pause_ms` between them) that use the linked
// module and stream memory operations, whose output a checkpoint or migration must not change.
//
//   driver_frameworks KERNELS.cubin [steps] [pause_ms]
//
// KERNELS.cubin: driver_kernels.cu for sm_90; it is linked with a small PTX kernel of this file's own.
// Stdout is the same natively and through nvproxy.
#include <cuda.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#define FN(name, exported) static decltype(&name) p_##name = (decltype(&name))dlsym(lib(), exported)

static void *lib() {
    static void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    return h;
}

FN(cuInit, "cuInit");
FN(cuGetErrorName, "cuGetErrorName");
FN(cuGetErrorString, "cuGetErrorString");
FN(cuDeviceGet, "cuDeviceGet");
FN(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
FN(cuCtxGetCurrent, "cuCtxGetCurrent");
FN(cuCtxSetCurrent, "cuCtxSetCurrent");
FN(cuCtxGetDevice, "cuCtxGetDevice");
FN(cuLinkCreate, "cuLinkCreate_v2");
FN(cuLinkAddData, "cuLinkAddData_v2");
FN(cuLinkAddFile, "cuLinkAddFile_v2");
FN(cuLinkComplete, "cuLinkComplete");
FN(cuLinkDestroy, "cuLinkDestroy");
FN(cuModuleLoadData, "cuModuleLoadData");
FN(cuModuleGetFunction, "cuModuleGetFunction");
FN(cuModuleGetGlobal, "cuModuleGetGlobal_v2");
FN(cuFuncGetAttribute, "cuFuncGetAttribute");
FN(cuFuncSetAttribute, "cuFuncSetAttribute");
FN(cuPointerGetAttribute, "cuPointerGetAttribute");
FN(cuMemAlloc, "cuMemAlloc_v2");
FN(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
FN(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
FN(cuMemsetD32Async, "cuMemsetD32Async");
FN(cuStreamCreate, "cuStreamCreate");
FN(cuStreamSynchronize, "cuStreamSynchronize");
FN(cuStreamWriteValue32, "cuStreamWriteValue32_v2");
FN(cuStreamWriteValue64, "cuStreamWriteValue64_v2");
FN(cuStreamWaitValue32, "cuStreamWaitValue32_v2");
FN(cuStreamWaitValue64, "cuStreamWaitValue64_v2");
FN(cuLaunchKernel, "cuLaunchKernel");
FN(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
FN(cuTensorMapEncodeIm2col, "cuTensorMapEncodeIm2col");

#include "driver_check.h"

// add_one(int *p): *p += 1, in PTX as a program might have it from NVRTC
static const char add_one_ptx[] = R"(.version 8.0
.target sm_90
.address_size 64

.visible .entry add_one(
	.param .u64 add_one_param_0
)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [add_one_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	ld.global.u32 	%r1, [%rd2];
	add.s32 	%r2, %r1, 1;
	st.global.u32 	[%rd2], %r2;
	ret;
}
)";

static CUmodule link_module(const char *cubin) {
    char log[1024];
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, (void *)(size_t)sizeof log};
    CUlinkState st;
    CK(p_cuLinkCreate(2, opts, vals, &st));
    printf("link: add nothing: %s; ", cu_error_name(p_cuLinkAddData(st, CU_JIT_INPUT_PTX, NULL, 10, "none", 0, NULL, NULL)));
    printf("a missing file: %s\n", cu_error_name(p_cuLinkAddFile(st, CU_JIT_INPUT_CUBIN, "/nonexistent.cubin", 0, NULL,
                                                           NULL)));
    CK(p_cuLinkAddFile(st, CU_JIT_INPUT_CUBIN, cubin, 0, NULL, NULL));
    char *copy = strdup(add_one_ptx); // (the link keeps its own copy: the program's may go at once)
    CK(p_cuLinkAddData(st, CU_JIT_INPUT_PTX, copy, strlen(copy) + 1, "add_one.ptx", 0, NULL, NULL));
    memset(copy, 0, strlen(copy));
    free(copy);
    void *image = NULL;
    size_t size = 0;
    printf("link: complete without an out pointer: %s\n", cu_error_name(p_cuLinkComplete(st, NULL, &size)));
    CK(p_cuLinkComplete(st, &image, &size));
    CUmodule m;
    CK(p_cuModuleLoadData(&m, image));
    printf("link: image %s, loaded\n", size > 0 && image ? "non-empty" : "EMPTY");
    CK(p_cuLinkDestroy(st));
    return m;
}

static void tensor_maps(CUdeviceptr base) {
    alignas(64) CUtensorMap a, b;
    cuuint64_t dims[2] = {64, 64}, strides[1] = {256};
    cuuint32_t wide[2] = {64, 8}, es[2] = {1, 1};
    auto tiled = [&](CUtensorMap *m, CUdeviceptr at, cuuint64_t *st, cuuint32_t *bx) {
        return p_cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)at, dims, st, bx, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    };
    cuuint32_t small[2] = {32, 8};
    CK(tiled(&a, base, strides, small));
    CK(tiled(&b, base, strides, small));
    printf("tensor map tiled: CUDA_SUCCESS, the same twice: %s\n", memcmp(&a, &b, sizeof a) ? "no" : "yes");
    cuuint64_t odd[1] = {100};
    cuuint32_t big[2] = {512, 8};
    printf("tensor map misaligned: %s; stride 100: %s; box 512: %s; box wider than the swizzle: %s\n",
           cu_error_name(tiled(&a, base + 4, strides, small)), cu_error_name(tiled(&a, base, odd, small)),
           cu_error_name(tiled(&a, base, strides, big)), cu_error_name(tiled(&a, base, strides, wide)));
    cuuint64_t nhwc[4] = {16, 8, 8, 1}, nhwc_strides[3] = {64, 512, 4096};
    int lower[2] = {-1, -1}, upper[2] = {-1, -1};
    cuuint32_t es4[4] = {1, 1, 1, 1};
    CUresult r = p_cuTensorMapEncodeIm2col(&a, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, (void *)base, nhwc, nhwc_strides,
                                           lower, upper, 16, 32, es4, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CUresult r2 = p_cuTensorMapEncodeIm2col(&a, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)base, nhwc, nhwc_strides,
                                            lower, upper, 16, 32, es4, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    printf("tensor map im2col: %s; of rank 2: %s\n", cu_error_name(r), cu_error_name(r2));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KERNELS.cubin [steps] [pause_ms]\n", argv[0]);
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 0, pause_ms = argc > 3 ? atoi(argv[3]) : 0;
    CK(p_cuInit(0));
    const char *text = NULL, *none = "untouched";
    CK(p_cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &text));
    CUresult bad = p_cuGetErrorString((CUresult)12345, &none);
    printf("cuGetErrorString: %s; of code 12345: %s\n", text, cu_error_name(bad));

    // Triton's start: the primary context made current where none is
    CUcontext ctx = NULL;
    CK(p_cuCtxGetCurrent(&ctx));
    printf("context at first: %s\n", ctx ? "one" : "none");
    CUdevice dev;
    CK(p_cuDeviceGet(&dev, 0));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(p_cuCtxSetCurrent(ctx));
    CUdevice cur = -1;
    CK(p_cuCtxGetDevice(&cur));
    printf("context device: %d\n", (int)cur);

    CUmodule mod = link_module(argv[1]);
    CUfunction add_one, scale_add, bump;
    CK(p_cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(p_cuModuleGetFunction(&bump, mod, "bump"));
    CK(p_cuModuleGetFunction(&scale_add, mod, "scale_add"));
    CUdeviceptr counter;
    size_t bytes = 0;
    CK(p_cuModuleGetGlobal(&counter, &bytes, mod, "counter"));
    int threads = 0;
    CK(p_cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale_add));
    CK(p_cuFuncSetAttribute(scale_add, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536));
    int dyn = 0;
    CK(p_cuFuncGetAttribute(&dyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, scale_add));
    printf("linked: counter %zu bytes; scale_add max threads >= 256: %s; dynamic shared memory set: %d\n", bytes,
           threads >= 256 ? "yes" : "no", dyn);

    const int n = 4096;
    CUdeviceptr x, y, flags;
    CK(p_cuMemAlloc(&x, n * sizeof(float)));
    CK(p_cuMemAlloc(&y, n * sizeof(float)));
    CK(p_cuMemAlloc(&flags, 64));
    CUdeviceptr seen = 0;
    CK(p_cuPointerGetAttribute(&seen, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, y));
    printf("device pointer attribute: %s\n", seen == y ? "itself" : "another");
    tensor_maps(x);

    CUstream s1, s2;
    CK(p_cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(p_cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    printf("write value misaligned: %s; 64-bit at 4 bytes: %s\n",
           cu_error_name(p_cuStreamWriteValue32(s1, flags + 2, 1, 0)), cu_error_name(p_cuStreamWriteValue64(s1, flags + 4, 1, 0)));
    CK(p_cuMemsetD32Async(flags, 0, 16, s1));
    float *h = (float *)malloc(n * sizeof(float));
    for (int i = 0; i < n; i++)
        h[i] = (float)(i % 7);
    CK(p_cuMemcpyHtoD(x, h, n * sizeof(float)));
    for (int step = 0; step <= steps; step++) {
        // s1 says the step has come; s2 waits for it, then works and says it is done
        CK(p_cuStreamWriteValue32(s1, flags, (cuuint32_t)step + 1, CU_STREAM_WRITE_VALUE_DEFAULT));
        CK(p_cuStreamSynchronize(s1));
        CK(p_cuStreamWaitValue32(s2, flags, (cuuint32_t)step + 1, CU_STREAM_WAIT_VALUE_GEQ));
        CK(p_cuMemsetD32Async(y, 0x3f800000u, n, s2)); // 1.0f
        float a = 0.5f * (float)(step + 1);
        int nn = n;
        int k = 2;
        CUdeviceptr tally = flags + 16; // (a module variable's address may change in a restore: kept off kernel
                                        // parameters, where nvproxy cannot translate it)
        void *sa[] = {&y, &x, &a, &nn}, *ao[] = {&tally}, *bp[] = {&k};
        CK(p_cuLaunchKernel(scale_add, n / 256, 1, 1, 256, 1, 1, 0, s2, sa, NULL));
        CK(p_cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, s2, ao, NULL));
        CK(p_cuLaunchKernel(bump, 1, 1, 1, 32, 1, 1, 0, s2, bp, NULL));
        CK(p_cuStreamWriteValue64(s2, flags + 8, 0x100000000ull * (step + 1) + 7, CU_STREAM_WRITE_VALUE_DEFAULT));
        CK(p_cuStreamWaitValue64(s2, flags + 8, 0x100000000ull * (step + 1), CU_STREAM_WAIT_VALUE_GEQ));
        CK(p_cuStreamSynchronize(s2));
        unsigned long long done = 0;
        int count = 0, added = 0;
        CK(p_cuMemcpyDtoH(h, y, n * sizeof(float)));
        CK(p_cuMemcpyDtoH(&done, flags + 8, sizeof done));
        CK(p_cuMemcpyDtoH(&count, counter, sizeof count));
        CK(p_cuMemcpyDtoH(&added, tally, sizeof added));
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += h[i];
        printf("step %d: sum %.1f, counter %d, add_one %d, done %#llx\n", step, sum, count, added, done);
        fflush(stdout);
        if (pause_ms && step < steps)
            usleep(pause_ms * 1000);
    }
    printf("Test PASSED\n");
    return 0;
}
