// Does a fresh cuRAND generator given an offset continue where a generator that made those values left off?
// For each generator type and generation function: values made after k earlier values (calls of n1) against a
// fresh generator with the same seed and curandSetGeneratorOffset(f * k) for f in 1, 2, 4; prints the factor
// that gave the same values, or "none"; then runs of different functions against the summed offset.
// Build: nvcc -cudart shared -lcurand.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>
#include <curand.h>

enum Fn { U32, UNI, NORM, UNID, NORMD, LOGN, POIS, NFN };
static const char *fn_name[] = {"generate", "uniform", "normal", "uniform_double", "normal_double", "lognormal",
                                "poisson"};

static curandStatus_t gen(curandGenerator_t g, Fn f, void *p, size_t n) {
    switch (f) {
    case U32: return curandGenerate(g, (unsigned *)p, n);
    case UNI: return curandGenerateUniform(g, (float *)p, n);
    case NORM: return curandGenerateNormal(g, (float *)p, n, 0.0f, 1.0f);
    case UNID: return curandGenerateUniformDouble(g, (double *)p, n);
    case NORMD: return curandGenerateNormalDouble(g, (double *)p, n, 0.0, 1.0);
    case LOGN: return curandGenerateLogNormal(g, (float *)p, n, 0.0f, 1.0f);
    default: return curandGeneratePoisson(g, (unsigned *)p, n, 4.0);
    }
}

static size_t bytes_of(Fn f) { return (f == UNID || f == NORMD) ? 8 : 4; }

int main() {
    struct { const char *name; curandRngType_t t; } types[] = {
        {"xorwow", CURAND_RNG_PSEUDO_XORWOW}, {"philox", CURAND_RNG_PSEUDO_PHILOX4_32_10},
        {"mrg32k3a", CURAND_RNG_PSEUDO_MRG32K3A}, {"mtgp32", CURAND_RNG_PSEUDO_MTGP32},
        {"mt19937", CURAND_RNG_PSEUDO_MT19937}};
    const size_t N2 = 4096;
    void *d;
    cudaMalloc(&d, N2 * 8);
    unsigned char a[N2 * 8], b[N2 * 8];
    size_t firsts[][2] = {{1000, 1}, {4096, 3}, {100000, 2}};  // (values per call, calls) before
    for (auto &ty : types) {
        for (int fi = 0; fi < NFN; fi++) {
            Fn f = (Fn)fi;
            printf("%s %s:", ty.name, fn_name[fi]);
            for (auto &fc : firsts) {
                size_t n1 = fc[0], calls = fc[1];
                curandGenerator_t g;
                curandCreateGenerator(&g, ty.t);
                curandSetPseudoRandomGeneratorSeed(g, 4242ull);
                void *big;
                cudaMalloc(&big, n1 * 8);
                curandStatus_t s = CURAND_STATUS_SUCCESS;
                for (size_t c = 0; c < calls && !s; c++) s = gen(g, f, big, n1);
                if (!s) s = gen(g, f, d, N2);
                cudaMemcpy(a, d, N2 * bytes_of(f), cudaMemcpyDeviceToHost);
                curandDestroyGenerator(g);
                if (s) {
                    printf(" [%zux%zu: status %d]", n1, calls, (int)s);
                    cudaFree(big);
                    continue;
                }
                int found = 0;
                for (int factor = 1; factor <= 4 && !found; factor *= 2) {
                    curandCreateGenerator(&g, ty.t);
                    curandSetPseudoRandomGeneratorSeed(g, 4242ull);
                    curandSetGeneratorOffset(g, (unsigned long long)factor * n1 * calls);
                    s = gen(g, f, d, N2);
                    cudaMemcpy(b, d, N2 * bytes_of(f), cudaMemcpyDeviceToHost);
                    curandDestroyGenerator(g);
                    if (!s && !memcmp(a, b, N2 * bytes_of(f))) found = factor;
                }
                printf(" [%zux%zu: %s%d]", n1, calls, found ? "offset x" : "none", found);
                cudaFree(big);
            }
            printf("\n");
        }
    }
    // mixed calls: values after a run of different functions against a fresh generator at the summed offset
    Fn mix[] = {UNI, U32, POIS, UNI, NORM, UNID};
    size_t mixn[] = {1000, 4096, 3000, 500, 2000, 1024};
    for (auto &ty : types) {
        for (int upto = 3; upto <= 6; upto += 3) {
            curandGenerator_t g;
            curandCreateGenerator(&g, ty.t);
            curandSetPseudoRandomGeneratorSeed(g, 99ull);
            void *big;
            cudaMalloc(&big, 8 * 4096);
            size_t total = 0;
            curandStatus_t s = CURAND_STATUS_SUCCESS;
            for (int i = 0; i < upto && !s; i++) {
                s = gen(g, mix[i], big, mixn[i]);
                total += mixn[i];
            }
            if (!s) s = gen(g, UNI, d, N2);
            cudaMemcpy(a, d, N2 * 4, cudaMemcpyDeviceToHost);
            curandDestroyGenerator(g);
            curandCreateGenerator(&g, ty.t);
            curandSetPseudoRandomGeneratorSeed(g, 99ull);
            curandSetGeneratorOffset(g, total);
            curandStatus_t s2 = gen(g, UNI, d, N2);
            cudaMemcpy(b, d, N2 * 4, cudaMemcpyDeviceToHost);
            curandDestroyGenerator(g);
            printf("%s mixed %d calls: %s\n", ty.name, upto,
                   s || s2 ? "status" : !memcmp(a, b, N2 * 4) ? "offset sum" : "none");
            cudaFree(big);
        }
    }
    return 0;
}
