// Kernels that driver_api loads itself (cuModuleLoadData and friends), built by the tests as a fatbinary, a
// cubin and PTX.  extern "C": the program asks for them by their plain names.
struct Big {
    float v[8];
    int n;
};

__device__ int counter;
__device__ float bias = 0.5f;

extern "C" __global__ void scale_add(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + bias;
}

extern "C" __global__ void bump(int k) {
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&counter, k);
}

extern "C" __global__ void sum_struct(float *out, Big b) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < 8; i++) s += b.v[i];
        out[0] = s * b.n;
    }
}
