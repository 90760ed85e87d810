// The math libraries reached as Python frameworks reach them (CuPy, JAX): dlopen by soname and dlsym of each entry
// point, with no library header and no link against them.  Each call prints its status; a library whose handle
// cannot be made is left there (its status printed), one that works computes something small that is checked.
// argv: the libraries to try (cublas cublasLt cufft curand cusparse cusolver; default all).  Exit status 2: a library
// or an entry point was not found; 1: a wrong result.
#include "check.h"
#include <cstring>
#include <dlfcn.h>

static void *lib(const char *soname) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("dlopen %s failed: %s\n", soname, dlerror());
        exit(2);
    }
    return h;
}

template <typename F> static F sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        printf("dlsym %s failed: %s\n", name, dlerror());
        exit(2);
    }
    return (F)p;
}

// one line per call; true where it succeeded
static bool said(const char *lib, const char *call, int status, const char *detail = "") {
    printf("%s %s: status %d%s\n", lib, call, status, detail);
    fflush(stdout);
    return status == 0;
}

// the same, with the value the call gave where it succeeded
static bool said(const char *lib, const char *call, int status, const char *what, long long value) {
    char detail[64];
    snprintf(detail, sizeof detail, ": %s %lld", what, value);
    return said(lib, call, status, status ? "" : detail);
}

static void expect(bool ok, const char *what) {
    if (!ok) {
        printf("MISMATCH %s\n", what);
        exit(1);
    }
}

static void try_cublas() {
    void *l = lib("libcublas.so.13");
    auto create = sym<int (*)(void **)>(l, "cublasCreate_v2");
    auto version = sym<int (*)(void *, int *)>(l, "cublasGetVersion_v2");
    auto sgemm = sym<int (*)(void *, int, int, int, int, int, const float *, const float *, int, const float *, int,
                             const float *, float *, int)>(l, "cublasSgemm_v2");
    auto destroy = sym<int (*)(void *)>(l, "cublasDestroy_v2");
    void *h = nullptr;
    if (!said("cublas", "cublasCreate_v2", create(&h))) return;
    int v = 0;
    int s = version(h, &v);
    said("cublas", "cublasGetVersion_v2", s, "version", v);
    float a[16], b[16], c[16], one = 1, zero = 0, *d;
    for (int i = 0; i < 16; i++) {
        a[i] = (float)(i % 5) - 2;
        b[i] = (float)(i % 3) + 0.5f;
    }
    CHECK(cudaMalloc(&d, 3 * sizeof a));
    CHECK(cudaMemcpy(d, a, sizeof a, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d + 16, b, sizeof b, cudaMemcpyHostToDevice));
    if (said("cublas", "cublasSgemm_v2", sgemm(h, 0, 0, 4, 4, 4, &one, d, 4, d + 16, 4, &zero, d + 32, 4))) {
        CHECK(cudaMemcpy(c, d + 32, sizeof c, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                float want = 0;
                for (int l = 0; l < 4; l++) want += a[i + 4 * l] * b[l + 4 * j];
                expect(c[i + 4 * j] == want, "cublasSgemm_v2 4x4");  // (small integers and halves: exact)
            }
        printf("cublas sgemm 4x4 ok %016llx\n", checksum(c, sizeof c));
    }
    CHECK(cudaFree(d));
    said("cublas", "cublasDestroy_v2", destroy(h));
}

static void try_cublaslt() {
    void *l = lib("libcublasLt.so.13");
    auto create = sym<int (*)(void **)>(l, "cublasLtCreate");
    auto version = sym<size_t (*)()>(l, "cublasLtGetVersion");
    auto destroy = sym<int (*)(void *)>(l, "cublasLtDestroy");
    printf("cublasLt version %s\n", version() / 10000 == 13 ? "13" : "NOT 13");
    void *h = nullptr;
    if (!said("cublasLt", "cublasLtCreate", create(&h))) return;
    said("cublasLt", "cublasLtDestroy", destroy(h));
}

static void try_cufft() {
    void *l = lib("libcufft.so.12");
    auto plan1d = sym<int (*)(int *, int, int, int)>(l, "cufftPlan1d");
    auto exec = sym<int (*)(int, float2 *, float2 *, int)>(l, "cufftExecC2C");
    auto destroy = sym<int (*)(int)>(l, "cufftDestroy");
    auto version = sym<int (*)(int *)>(l, "cufftGetVersion");
    int v = 0;
    int s = version(&v);
    said("cufft", "cufftGetVersion", s, "version", v);
    int plan = 0;
    if (!said("cufft", "cufftPlan1d", plan1d(&plan, 8, 0x29 /* CUFFT_C2C */, 1))) return;
    float2 x[8] = {}, *d;
    x[0].x = 1;  // an impulse: its spectrum is all ones
    CHECK(cudaMalloc(&d, sizeof x));
    CHECK(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice));
    if (said("cufft", "cufftExecC2C", exec(plan, d, d, -1 /* CUFFT_FORWARD */))) {
        CHECK(cudaMemcpy(x, d, sizeof x, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 8; i++) expect(x[i].x == 1 && x[i].y == 0, "cufftExecC2C of an impulse");
        printf("cufft impulse ok\n");
    }
    CHECK(cudaFree(d));
    said("cufft", "cufftDestroy", destroy(plan));
}

static void try_curand() {
    void *l = lib("libcurand.so.10");
    auto create = sym<int (*)(void **, int)>(l, "curandCreateGenerator");
    auto seed = sym<int (*)(void *, unsigned long long)>(l, "curandSetPseudoRandomGeneratorSeed");
    auto uniform = sym<int (*)(void *, float *, size_t)>(l, "curandGenerateUniform");
    auto destroy = sym<int (*)(void *)>(l, "curandDestroyGenerator");
    void *g = nullptr;
    if (!said("curand", "curandCreateGenerator", create(&g, 100 /* CURAND_RNG_PSEUDO_DEFAULT */))) return;
    if (said("curand", "curandSetPseudoRandomGeneratorSeed", seed(g, 1234ull))) {
        float *d, h[1024];
        CHECK(cudaMalloc(&d, sizeof h));
        if (said("curand", "curandGenerateUniform", uniform(g, d, 1024))) {
            CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
            double m = 0;
            for (float v : h) {
                expect(v > 0 && v <= 1, "curandGenerateUniform in (0, 1]");
                m += v;
            }
            expect(m / 1024 > 0.45 && m / 1024 < 0.55, "curandGenerateUniform's mean");
            printf("curand uniform ok %016llx\n", checksum(h, sizeof h));
        }
        CHECK(cudaFree(d));
    }
    said("curand", "curandDestroyGenerator", destroy(g));
}

static void try_cusparse() {
    void *l = lib("libcusparse.so.12");
    auto create = sym<int (*)(void **)>(l, "cusparseCreate");
    auto version = sym<int (*)(void *, int *)>(l, "cusparseGetVersion");
    auto destroy = sym<int (*)(void *)>(l, "cusparseDestroy");
    void *h = nullptr;
    if (!said("cusparse", "cusparseCreate", create(&h))) return;
    int v = 0;
    int s = version(h, &v);
    said("cusparse", "cusparseGetVersion", s, "version", v);
    said("cusparse", "cusparseDestroy", destroy(h));
}

static void try_cusolver() {
    void *l = lib("libcusolver.so.12");
    auto create = sym<int (*)(void **)>(l, "cusolverDnCreate");
    auto destroy = sym<int (*)(void *)>(l, "cusolverDnDestroy");
    void *h = nullptr;
    if (!said("cusolver", "cusolverDnCreate", create(&h))) return;
    said("cusolver", "cusolverDnDestroy", destroy(h));
}

int main(int argc, char **argv) {
    const struct {
        const char *name;
        void (*run)();
    } libs[] = {{"cublas", try_cublas},     {"cublasLt", try_cublaslt}, {"cufft", try_cufft},
                {"curand", try_curand},     {"cusparse", try_cusparse}, {"cusolver", try_cusolver}};
    void *warm;
    CHECK(cudaMalloc(&warm, 16));  // (the program's own runtime is in use before any library)
    for (auto &l : libs) {
        bool chosen = argc < 2;
        for (int i = 1; i < argc; i++) chosen |= !strcmp(argv[i], l.name);
        if (chosen) l.run();
    }
    CHECK(cudaFree(warm));
    printf("done\n");
    return 0;
}
