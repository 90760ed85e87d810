// cuRAND as simulation codes use it: device generators made and seeded once (XORWOW, the default; PHILOX with an
// offset; a SOBOL32 quasi-random one of two dimensions) on a created stream, and a host generator; their sequences
// go on over many consecutive generate calls of every distribution (uniform, normal, log-normal, Poisson, the double
// ones), so a run restarted anywhere must go on with the same numbers; a kernel of the program's own estimates pi
// from pairs of them.  Steps and output: lib_common.h.  Build: nvcc -cudart shared -lcurand.
#include "lib_common.h"
#include <curand.h>
#include <functional>
#include <vector>

static const int OPS = 10;
static const size_t N = 1 << 20;
static const int BLOCKS = 120, THREADS = 256;

// pairs (u[2i], u[2i+1]) inside the unit circle, counted per block (integers: the sum is the same in any order)
__global__ void inside(const float *u, int pairs, unsigned *partial) {
    __shared__ unsigned s[THREADS];
    unsigned c = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += gridDim.x * blockDim.x)
        c += u[2 * i] * u[2 * i] + u[2 * i + 1] * u[2 * i + 1] <= 1.0f;
    s[threadIdx.x] = c;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

enum Kind { U32, F32, F64 };
enum Range { ANY, UNIT, POSITIVE_LOGS };  // POSITIVE_LOGS: all above 0, the moments those of their logarithms

// one kind of draw: a generate call (its name, for a failure), where its numbers go, and their distribution
struct Draw {
    const char *what, *call;
    Kind kind;
    bool on_host;
    double mean, var, tol;
    Range range;
    std::function<curandStatus_t(void *)> generate;
};

static double value(const void *v, Kind kind, size_t i) {
    return kind == U32 ? ((const unsigned *)v)[i] : kind == F32 ? ((const float *)v)[i] : ((const double *)v)[i];
}

// the N numbers of a draw (in host memory) checked against their distribution: in range, mean and variance
static void check_draw(const Draw &d, const void *v) {
    std::vector<double> x(N);
    double sum = 0, sum2 = 0;
    for (size_t i = 0; i < N; i++) {
        x[i] = value(v, d.kind, i);
        if ((d.range == UNIT && !(x[i] > 0 && x[i] <= 1)) || (d.range == POSITIVE_LOGS && !(x[i] > 0))) {
            printf("MISMATCH %s at %zu: %g out of range\n", d.what, i, x[i]);
            exit(1);
        }
        if (d.range == POSITIVE_LOGS) x[i] = log(x[i]);
        sum += x[i];
    }
    double mean = sum / N;
    for (double e : x) sum2 += (e - mean) * (e - mean);
    expect_close(d.what, 0, mean, d.mean, d.tol);
    expect_close(d.what, 1, sum2 / N, d.var, 10 * d.tol);
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    curandGenerator_t xorwow, philox, sobol, host;
    LCHECK(curandCreateGenerator(&xorwow, CURAND_RNG_PSEUDO_DEFAULT));
    LCHECK(curandSetPseudoRandomGeneratorSeed(xorwow, 1234ull));
    LCHECK(curandCreateGenerator(&philox, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    LCHECK(curandSetPseudoRandomGeneratorSeed(philox, 42ull));
    LCHECK(curandSetGeneratorOffset(philox, 1000ull));
    LCHECK(curandCreateGenerator(&sobol, CURAND_RNG_QUASI_SOBOL32));
    LCHECK(curandSetQuasiRandomGeneratorDimensions(sobol, 2));
    curandGenerator_t device_gens[] = {xorwow, philox, sobol};
    for (curandGenerator_t g : device_gens) LCHECK(curandSetStream(g, st));
    LCHECK(curandGenerateSeeds(philox));  // (its state made now, not at the first generate call)
    LCHECK(curandCreateGeneratorHost(&host, CURAND_RNG_PSEUDO_XORWOW));
    LCHECK(curandSetPseudoRandomGeneratorSeed(host, 1234ull));

    void *out = device_alloc<double>(N);
    unsigned *partial = device_alloc<unsigned>(BLOCKS);

    const Draw draws[] = {
        {"xorwow 32-bit", "curandGenerate", U32, false, 0x1p31, 0x1p64 / 12, 0.01, ANY,
         [&](void *p) { return curandGenerate(xorwow, (unsigned *)p, N); }},
        {"xorwow uniform", "curandGenerateUniform", F32, false, 0.5, 1.0 / 12, 0.005, UNIT,
         [&](void *p) { return curandGenerateUniform(xorwow, (float *)p, N); }},
        {"xorwow normal", "curandGenerateNormal", F32, false, 0.0, 1.0, 0.01, ANY,
         [&](void *p) { return curandGenerateNormal(xorwow, (float *)p, N, 0.0f, 1.0f); }},
        {"philox log-normal", "curandGenerateLogNormal", F32, false, 0.0, 0.25, 0.01, POSITIVE_LOGS,
         [&](void *p) { return curandGenerateLogNormal(philox, (float *)p, N, 0.0f, 0.5f); }},
        {"philox poisson 4.5", "curandGeneratePoisson", U32, false, 4.5, 4.5, 0.01, ANY,
         [&](void *p) { return curandGeneratePoisson(philox, (unsigned *)p, N, 4.5); }},
        {"philox uniform double", "curandGenerateUniformDouble", F64, false, 0.5, 1.0 / 12, 0.005, UNIT,
         [&](void *p) { return curandGenerateUniformDouble(philox, (double *)p, N); }},
        {"xorwow normal double", "curandGenerateNormalDouble", F64, false, 2.0, 9.0, 0.01, ANY,
         [&](void *p) { return curandGenerateNormalDouble(xorwow, (double *)p, N, 2.0, 3.0); }},
        // the host generator: numbers made in the program's memory
        {"host xorwow uniform", "curandGenerateUniform", F32, true, 0.5, 1.0 / 12, 0.005, UNIT,
         [&](void *p) { return curandGenerateUniform(host, (float *)p, N); }},
        // quasi-random points fill the square evenly
        {"sobol32 2 dimensions", "curandGenerateUniform", F32, false, 0.5, 1.0 / 12, 0.001, UNIT,
         [&](void *p) { return curandGenerateUniform(sobol, (float *)p, N); }},
    };
    static_assert(sizeof draws / sizeof *draws == OPS - 1, "a draw for each step but the last");
    void *drawn = malloc(sizeof(double) * N);

    for (int k = 0; k < steps.count; k++) {
        if (k % OPS < OPS - 1) {
            const Draw &d = draws[k % OPS];
            LCHECK_AS(d.call, d.generate(d.on_host ? drawn : out));
            if (!d.on_host) CHECK(cudaMemcpy(drawn, out, (d.kind == F64 ? 8 : 4) * N, cudaMemcpyDeviceToHost));
            check_draw(d, drawn);
            step_done(steps, k, "%s %016llx", d.what, checksum(drawn, (d.kind == F64 ? 8 : 4) * N));
            continue;
        }
        // pi from pairs of uniform numbers, counted by the program's kernel on the generator's stream
        LCHECK(curandGenerateUniform(xorwow, (float *)out, N));
        inside<<<BLOCKS, THREADS, 0, st>>>((const float *)out, (int)(N / 2), partial);
        CHECK(cudaGetLastError());
        unsigned counts[BLOCKS];
        CHECK(cudaMemcpyAsync(counts, partial, sizeof counts, cudaMemcpyDeviceToHost, st));
        CHECK(cudaStreamSynchronize(st));
        unsigned long long in = 0;
        for (unsigned c : counts) in += c;
        double pi = 4.0 * in / (N / 2);
        expect_close("pi", 0, pi, M_PI, 0.005);
        step_done(steps, k, "pi %.6f from %llu of %zu pairs", pi, in, N / 2);
    }

    CHECK(cudaStreamSynchronize(st));
    for (curandGenerator_t g : device_gens) LCHECK(curandDestroyGenerator(g));
    LCHECK(curandDestroyGenerator(host));
    int version = 0;
    LCHECK(curandGetVersion(&version));
    printf("version %d (%s)\n", version, version == CURAND_VERSION ? "as the header" : "NOT as the header");
    CHECK(cudaFree(out));
    CHECK(cudaFree(partial));
    CHECK(cudaStreamDestroy(st));
    free(drawn);
    printf("Test PASSED\n");
    return 0;
}
