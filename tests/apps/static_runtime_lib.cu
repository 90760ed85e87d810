// A library with device code, built as nvcc builds by default: the CUDA runtime linked into it statically.
// uses_static_lib links it; nvproxy must refuse to run that program as if it were protected.
__global__ void add_one(int *p) { *p += 1; }

extern "C" int static_lib_add_one(int v) {
    int *d = nullptr;
    if (cudaMalloc(&d, sizeof v) != cudaSuccess) return -1;
    cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice);
    add_one<<<1, 1>>>(d);
    cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return v;
}
