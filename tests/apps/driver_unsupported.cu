// Driver functions nvproxy does not forward fail loudly: CUDA_ERROR_NOT_SUPPORTED and one stderr line naming the
// call, whether reached by dlsym or by cuGetProcAddress; cuGetExportTable (a private runtime's way in) too.
// Run only through nvproxy (natively these calls do other things).
#include <cuda.h>
#include <dlfcn.h>
#include <cstdio>

typedef CUresult (*any_fn)(void);

int main() {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("dlopen(libcuda.so.1) failed: %s\n", dlerror());
        return 1;
    }
    auto init = (decltype(&cuInit))dlsym(h, "cuInit");
    auto proc = (decltype(&cuGetProcAddress))dlsym(h, "cuGetProcAddress_v2");
    auto err_name = (decltype(&cuGetErrorName))dlsym(h, "cuGetErrorName");
    auto name = [&](CUresult r) {
        const char *s = "?";
        err_name(r, &s);
        return s;
    };
    printf("cuInit: %s\n", name(init(0)));
    // by dlsym, with their exported names (no arguments: they must not look at any)
    const char *exported[] = {"cuMemcpy3D_v2", "cuArrayCreate_v2", "cuGraphAddKernelNode_v2",
                              "cuMemExportToShareableHandle"};
    for (const char *e : exported) {
        any_fn fn = (any_fn)dlsym(h, e);
        printf("%s: %s\n", e, fn ? name(fn()) : "not exported");
    }
    // by cuGetProcAddress, with their base names
    const char *bases[] = {"cuMemcpy3DAsync", "cuTexObjectCreate"};
    for (const char *b : bases) {
        void *fn = nullptr;
        CUdriverProcAddressQueryResult status;
        CUresult r = proc(b, &fn, CUDA_VERSION, 0, &status);
        printf("%s: %s, status %d, %s\n", b, name(r), (int)status, fn ? name(((any_fn)fn)()) : "no function");
    }
    auto table = (decltype(&cuGetExportTable))dlsym(h, "cuGetExportTable");
    const void *t = (const void *)1;
    CUuuid id = {};
    CUresult r = table(&t, &id);
    printf("cuGetExportTable: %s, table %s\n", name(r), t ? "given" : "NULL");
    return 0;
}
