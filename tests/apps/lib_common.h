// Shared by the math-library test programs (lib_*.cu).
//
// Each program does its work in numbered steps: step k runs operation k % ops with inputs that depend on the round
// k / ops, on handles, plans and device data made once before step 0, and prints one line ending in a checksum of
// the bytes the step produced.  The libraries give bit-identical results run to run on one GPU for the same
// algorithm and inputs (no atomics modes are used), so a run through nvproxy, checkpointed or migrated anywhere,
// must print exactly what a native run prints.  Each step also checks its results against a CPU reference with a
// tolerance and ends the program (status 1) where they are wrong.
//   argv[1]: steps (default: two rounds of every operation); argv[2]: ms to pause after each step (default 0).
#pragma once
#include "check.h"
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <string>
#include <unistd.h>

// A library call that returns a status (every library's success is 0): any other value ends the program, naming
// the call and the status ("FAILED file:line call(...) -> status N"; LCHECK_AS: a call made through a pointer,
// named).
static inline void lib_failed(const char *file, int line, const char *call, long long status) {
    printf("FAILED %s:%d %s -> status %lld\n", file, line, call, status);
    exit(1);
}
#define LCHECK(x)                                                                                  \
    do {                                                                                           \
        long long s_ = (long long)(x);                                                             \
        if (s_ != 0) lib_failed(__FILE__, __LINE__, #x, s_);                                       \
    } while (0)
#define LCHECK_AS(name, x)                                                                         \
    do {                                                                                           \
        long long s_ = (long long)(x);                                                             \
        if (s_ != 0) lib_failed(__FILE__, __LINE__, (std::string(name) + "(...)").c_str(), s_);    \
    } while (0)

struct Steps {
    int count, pause_ms;
};

static inline Steps parse_steps(int argc, char **argv, int ops) {
    Steps s = {argc > 1 ? atoi(argv[1]) : 2 * ops, argc > 2 ? atoi(argv[2]) : 0};
    if (s.count < 0 || s.pause_ms < 0) {
        printf("usage: %s [steps] [pause_ms]\n", argv[0]);
        exit(2);
    }
    return s;
}

// the step's line: "step K: <what>"; then the pause
static inline void step_done(const Steps &s, int k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("step %d: ", k);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (s.pause_ms) usleep(s.pause_ms * 1000);
}

// deterministic inputs in [-1, 1): a small LCG per seed
static inline void fill_f(float *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (float)((x >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

static inline void fill_d(double *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 54321u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (double)(x >> 4) / 134217728.0 - 1.0;
    }
}

// |got - want| within tol relative to max(|want|, scale); otherwise the program ends, saying where
static inline void expect_close(const char *what, size_t where, double got, double want, double tol,
                                double scale = 1.0) {
    double ref = fabs(want) > scale ? fabs(want) : scale;
    if (!(fabs(got - want) <= tol * ref)) {
        printf("MISMATCH %s at %zu: got %.9g want %.9g (tolerance %g)\n", what, where, got, want, tol);
        exit(1);
    }
}

// column-major element (i, j) of X or (transposed) X^T, X stored with leading dimension ld
template <typename T> static inline T element(const T *x, int ld, bool transposed, int i, int j) {
    return transposed ? x[j + (size_t)i * ld] : x[i + (size_t)j * ld];
}

// C = alpha op(A) op(B) + beta Cprev (+ bias[i], then max(0, .) where relu), checked at `samples` entries (at all
// where samples is 0)
template <typename T>
static void check_gemm(const char *what, bool ta, bool tb, int m, int n, int k, double alpha, const T *A, int lda,
                       const T *B, int ldb, double beta, const T *Cprev, const T *C, int ldc, int samples, double tol,
                       double scale, const T *bias = nullptr, bool relu = false) {
    int count = samples ? samples : m * n;
    for (int s = 0; s < count; s++) {
        int i = samples ? (int)((s * 7919u + 13u) % (unsigned)m) : s % m;
        int j = samples ? (int)((s * 104729u + 7u) % (unsigned)n) : s / m;
        double want = 0;
        for (int l = 0; l < k; l++) want += (double)element(A, lda, ta, i, l) * (double)element(B, ldb, tb, l, j);
        want = alpha * want + (beta != 0 ? beta * (double)Cprev[i + (size_t)j * ldc] : 0.0);
        if (bias) want += bias[i];
        if (relu && want < 0) want = 0;
        expect_close(what, i + (size_t)j * ldc, C[i + (size_t)j * ldc], want, tol, scale);
    }
}

// a device buffer's bytes, copied back (synchronising with everything before it) and summed
static inline unsigned long long device_checksum(const void *d, size_t bytes) {
    void *h = malloc(bytes);
    CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    unsigned long long c = checksum(h, bytes);
    free(h);
    return c;
}

template <typename T> static inline T *device_alloc(size_t n) {
    T *p;
    CHECK(cudaMalloc(&p, n * sizeof(T)));
    return p;
}

template <typename T> static inline T *device_copy(const T *h, size_t n) {
    T *p = device_alloc<T>(n);
    CHECK(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

template <typename T> static inline T *host_copy(const T *d, size_t n) {
    T *h = (T *)malloc(n * sizeof(T));
    CHECK(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
