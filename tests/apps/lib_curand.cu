// cuRAND as simulation codes use it: device generators made and seeded once (XORWOW, the default; PHILOX with an
// offset; a SOBOL32 quasi-random one of two dimensions) on a created stream, and a host generator; their sequences
// go on over many consecutive generate calls of every distribution (uniform, normal, log-normal, Poisson, the double
// ones), so a run restarted anywhere must go on with the same numbers; a kernel of the program's own estimates pi
// from pairs of them.  Steps and output: lib_common.h.  Build: nvcc -cudart shared -lcurand.
#include "lib_common.h"
#include <curand.h>

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

// mean and variance of n values, checked against what the distribution gives
template <typename T>
static void check_moments(const char *what, const T *v, size_t n, double mean, double var, double tol) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += (double)v[i];
    double m = s / n;
    for (size_t i = 0; i < n; i++) s2 += ((double)v[i] - m) * ((double)v[i] - m);
    expect_close(what, 0, m, mean, tol);
    expect_close(what, 1, s2 / n, var, 10 * tol);
}

template <typename T> static void check_range(const char *what, const T *v, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++)
        if (!((double)v[i] > lo && (double)v[i] <= hi)) {
            printf("MISMATCH %s at %zu: %g outside (%g, %g]\n", what, i, (double)v[i], lo, hi);
            exit(1);
        }
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
    float *hostbuf = (float *)malloc(sizeof(float) * N);

    for (int k = 0; k < steps.count; k++) {
        int round = k / OPS;
        unsigned long long sum;
        switch (k % OPS) {
        case 0: {
            LCHECK(curandGenerate(xorwow, (unsigned *)out, N));
            unsigned *v = host_copy((unsigned *)out, N);
            double m = 0;
            for (size_t i = 0; i < N; i++) m += (v[i] >> 8) / 16777216.0;
            expect_close("xorwow bits", 0, m / N, 0.5, 0.01);
            sum = checksum(v, sizeof(unsigned) * N);
            free(v);
            step_done(steps, k, "xorwow 32-bit %016llx", sum);
            break;
        }
        case 1: {
            LCHECK(curandGenerateUniform(xorwow, (float *)out, N));
            float *v = host_copy((float *)out, N);
            check_range("xorwow uniform", v, N, 0.0, 1.0);
            check_moments("xorwow uniform", v, N, 0.5, 1.0 / 12, 0.005);
            sum = checksum(v, sizeof(float) * N);
            free(v);
            step_done(steps, k, "xorwow uniform %016llx", sum);
            break;
        }
        case 2: {
            LCHECK(curandGenerateNormal(xorwow, (float *)out, N, 0.0f, 1.0f));
            float *v = host_copy((float *)out, N);
            check_moments("xorwow normal", v, N, 0.0, 1.0, 0.01);
            sum = checksum(v, sizeof(float) * N);
            free(v);
            step_done(steps, k, "xorwow normal %016llx", sum);
            break;
        }
        case 3: {
            LCHECK(curandGenerateLogNormal(philox, (float *)out, N, 0.0f, 0.5f));
            float *v = host_copy((float *)out, N);
            check_range("philox log-normal", v, N, 0.0, INFINITY);
            for (size_t i = 0; i < N; i++) v[i] = logf(v[i]);  // (the sum is taken of what the library gave)
            check_moments("philox log-normal", v, N, 0.0, 0.25, 0.01);
            free(v);
            sum = device_checksum(out, sizeof(float) * N);
            step_done(steps, k, "philox log-normal %016llx", sum);
            break;
        }
        case 4: {
            double lambda = 4.5 + round;
            LCHECK(curandGeneratePoisson(philox, (unsigned *)out, N, lambda));
            unsigned *v = host_copy((unsigned *)out, N);
            check_moments("philox poisson", v, N, lambda, lambda, 0.01);
            sum = checksum(v, sizeof(unsigned) * N);
            free(v);
            step_done(steps, k, "philox poisson %.1f %016llx", lambda, sum);
            break;
        }
        case 5: {
            LCHECK(curandGenerateUniformDouble(philox, (double *)out, N));
            double *v = host_copy((double *)out, N);
            check_range("philox uniform double", v, N, 0.0, 1.0);
            check_moments("philox uniform double", v, N, 0.5, 1.0 / 12, 0.005);
            sum = checksum(v, sizeof(double) * N);
            free(v);
            step_done(steps, k, "philox uniform double %016llx", sum);
            break;
        }
        case 6: {
            LCHECK(curandGenerateNormalDouble(xorwow, (double *)out, N, 2.0, 3.0));
            double *v = host_copy((double *)out, N);
            check_moments("xorwow normal double", v, N, 2.0, 9.0, 0.01);
            sum = checksum(v, sizeof(double) * N);
            free(v);
            step_done(steps, k, "xorwow normal double %016llx", sum);
            break;
        }
        case 7: {  // the host generator: numbers made in the program's memory
            LCHECK(curandGenerateUniform(host, hostbuf, N));
            check_range("host uniform", hostbuf, N, 0.0, 1.0);
            check_moments("host uniform", hostbuf, N, 0.5, 1.0 / 12, 0.005);
            step_done(steps, k, "host xorwow uniform %016llx", checksum(hostbuf, sizeof(float) * N));
            break;
        }
        case 8: {  // quasi-random points fill the square evenly
            LCHECK(curandGenerateUniform(sobol, (float *)out, N));
            float *v = host_copy((float *)out, N);
            check_range("sobol", v, N, 0.0, 1.0);
            check_moments("sobol", v, N, 0.5, 1.0 / 12, 0.001);
            sum = checksum(v, sizeof(float) * N);
            free(v);
            step_done(steps, k, "sobol32 2 dimensions %016llx", sum);
            break;
        }
        case 9: {  // pi from pairs of uniform numbers, counted by the program's kernel on the generator's stream
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
            break;
        }
        }
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
    free(hostbuf);
    printf("Test PASSED\n");
    return 0;
}
