// Shared by the test programs: fail loudly, naming the call and the error.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("FAILED %s:%d %s -> %s (%s)\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_),   \
                   cudaGetErrorString(e_));                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// Order-independent checksum of a buffer, printed by the tests.
static inline unsigned long long checksum(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}

// Pseudo-random bytes from a seed, for copies whose contents the tests compare.
static inline void pattern(unsigned char *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) { x = x * 1664525u + 1013904223u; p[i] = (unsigned char)(x >> 24); }
}
