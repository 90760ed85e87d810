// Texture and surface object lifetimes the way real codes use them (GROMACS' PME lookup tables): an object
// value of 0 destroyed (a table that was never bound), an object destroyed after the memory under it was
// freed, and an object destroyed twice.  Prints each call's result so that nvproxy must match native.
#include "check.h"

__global__ void fetch(cudaTextureObject_t t, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(t, i) * 2.0f;
}

static cudaTextureObject_t make_linear(float *d, int n) {
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = d;
    res.res.linear.desc = cudaCreateChannelDesc<float>();
    res.res.linear.sizeInBytes = n * sizeof(float);
    cudaTextureDesc td = {};
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t t = 0;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

int main() {
    const int n = 1024;
    printf("destroy texture 0: %s\n", cudaGetErrorName(cudaDestroyTextureObject(0)));
    printf("destroy surface 0: %s\n", cudaGetErrorName(cudaDestroySurfaceObject(0)));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));

    float *d_in, *d_out, h[n];
    for (int i = 0; i < n; i++) h[i] = (float)i;
    CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CHECK(cudaMemcpy(d_in, h, sizeof h, cudaMemcpyHostToDevice));

    for (int round = 0; round < 3; round++) {  // rebuilt each round, as a table is when the grid changes
        cudaTextureObject_t t = make_linear(d_in, n);
        fetch<<<(n + 127) / 128, 128>>>(t, d_out, n);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(h, d_out, sizeof h, cudaMemcpyDeviceToHost));
        printf("round %d: out[5]=%g out[1000]=%g\n", round, h[5], h[1000]);
        CHECK(cudaDestroyTextureObject(t));
    }

    float *d_tmp;
    CHECK(cudaMalloc(&d_tmp, n * sizeof(float)));
    cudaTextureObject_t t = make_linear(d_tmp, n);
    CHECK(cudaFree(d_tmp));
    printf("destroy after the memory was freed: %s\n", cudaGetErrorName(cudaDestroyTextureObject(t)));
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));

    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    printf("Test PASSED\n");
    return 0;
}
