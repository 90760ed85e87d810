// A program linked with -lcuda: it calls the driver API by its link (not through dlopen), and opens with
// RTLD_DEEPBIND a library that is linked with -lcuda too (argv[1], if given) and calls it, then opens that library
// into a new link-map namespace (dlmopen).  It prints what the
// driver gave and every mapped file whose name begins with libcuda.: under nvproxy, none (the shim stands for
// libcuda.so.1; its file is libnvproxy.so).
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>

#define CU(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            printf("FAILED %s -> %d\n", #x, (int)r_);                                              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    CU(cuInit(0));
    int version = 0;
    CU(cuDriverGetVersion(&version));
    printf("driver version given: %s\n", version > 0 ? "yes" : "no");
    CUdevice dev;
    CUcontext ctx;
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CUdeviceptr p;
    static unsigned h[1024];
    CU(cuMemAlloc(&p, sizeof h));
    CU(cuMemsetD32(p, 0x01020304u, 1024));
    CU(cuMemcpyDtoH(h, p, sizeof h));
    CU(cuMemFree(p));
    printf("memset: %x %x\n", h[0], h[1023]);
    if (argc > 1) {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_DEEPBIND);
        int (*ask)(void) = lib ? (int (*)(void))dlsym(lib, "library_asks_driver") : NULL;
        if (!ask) {
            printf("FAILED dlopen %s: %s\n", argv[1], dlerror());
            return 1;
        }
        printf("library opened with RTLD_DEEPBIND: driver %s\n", ask() > 0 ? "answered" : "failed");
        // the same library into a namespace of its own, where its libcuda would not be the shim
        void *other = dlmopen(LM_ID_NEWLM, argv[1], RTLD_NOW);
        printf("dlmopen into a new namespace: %s\n", other ? "opened" : "refused");
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps)) {
        const char *path = strchr(line, '/');
        const char *base = path ? strrchr(path, '/') + 1 : NULL;
        if (base && !strncmp(base, "libcuda.", 8)) printf("mapped: %s", path);
    }
    printf("Test PASSED\n");
    return 0;
}
