// Parameter blocks up to the 32,764-byte limit, mixed with small parameters
// of every size and alignment.
#include "check.h"

struct Big { unsigned char bytes[32000]; };
struct Small { char c; short s; int i; double d; };

__global__ void big_kernel(Big b, int *out, char c, Small sm, double x) {
    unsigned long long h = 0;
    for (int i = 0; i < 32000; i++) h = h * 31 + b.bytes[i];
    out[0] = (int)(h & 0x7fffffff);
    out[1] = c;
    out[2] = sm.c + sm.s + sm.i + (int)sm.d;
    out[3] = (int)(x * 1000);
}

struct Max { unsigned char bytes[32764 - 8]; };
__global__ void max_kernel(int *out, Max m) {  // 8 + 32756 = 32764 bytes exactly
    int s = 0;
    for (int i = 0; i < (int)sizeof(m.bytes); i++) s += m.bytes[i];
    *out = s;
}

int main() {
    static Big b;
    for (int i = 0; i < 32000; i++) b.bytes[i] = (unsigned char)(i * 7 + 3);
    int *d, h[4];
    CHECK(cudaMalloc(&d, sizeof h));
    Small sm = {'a', 1000, 100000, 2.5};
    big_kernel<<<1, 1>>>(b, d, 'z', sm, 3.25);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    unsigned long long ref = 0;
    for (int i = 0; i < 32000; i++) ref = ref * 31 + b.bytes[i];
    printf("big: hash %s, c=%d small=%d x=%d\n", h[0] == (int)(ref & 0x7fffffff) ? "ok" : "WRONG", h[1], h[2], h[3]);
    static Max m;
    int sum = 0;
    for (int i = 0; i < (int)sizeof(m.bytes); i++) { m.bytes[i] = (unsigned char)(i % 13); sum += i % 13; }
    max_kernel<<<1, 1>>>(d, m);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h, d, sizeof(int), cudaMemcpyDeviceToHost));
    printf("max: sum %s (%d)\n", h[0] == sum ? "ok" : "WRONG", h[0]);
    printf("Test PASSED\n");
    return 0;
}
