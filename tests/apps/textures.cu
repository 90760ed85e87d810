// CUDA arrays, texture and surface objects: two 2D float arrays that kernels read
// through textures and write through surfaces in turn (a stencil), a uchar4 array
// written through a surface, textures with border and wrap addressing and
// normalized coordinates, textures over linear and pitched memory, a 3D array,
// and copies between arrays and pageable, pinned and device memory.
// argv[1] = steps of a long run (each followed by a pause: checkpoint tests
// restore the arrays' contents and the objects' values mid-run).
#include "check.h"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // (cudaMemcpy{To,From}Array: in the census)
#include <cstring>
#include <unistd.h>

const int W = 64, H = 32;

__global__ void stencil(cudaTextureObject_t in, cudaSurfaceObject_t out, int k) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= W || y >= H) return;
    float c = tex2D<float>(in, x + 0.5f, y + 0.5f);
    float l = tex2D<float>(in, x - 0.5f, y + 0.5f);  // (clamped at the edges)
    float r = tex2D<float>(in, x + 1.5f, y + 0.5f);
    float u = tex2D<float>(in, x + 0.5f, y - 0.5f);
    float d = tex2D<float>(in, x + 0.5f, y + 1.5f);
    float v = c * 0.5f + (((l + r) + u) + d) * 0.125f + (float)((x * 7 + y * 3 + k) % 11);
    surf2Dwrite(fmodf(v, 1000.0f), out, x * (int)sizeof(float), y);
}

__global__ void paint(cudaSurfaceObject_t out, int k) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= W || y >= H) return;
    surf2Dwrite(make_uchar4(x + k, y * 2, (x ^ y) & 0xff, 255 - k), out, x * 4, y);
}

// samples[i] = texture at (xs[i], ys[i]), element or normalized coordinates
__global__ void sample2d(cudaTextureObject_t t, const float *xs, const float *ys, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex2D<float>(t, xs[i], ys[i]);
}

__global__ void fetch1d(cudaTextureObject_t t, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int>(t, i * 3 - 5);  // some outside: 0
}

__global__ void sum3d(cudaTextureObject_t t, int *out, int w, int h, int d) {
    int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
    if (x < w && y < h && z < d) atomicAdd(out, tex3D<int>(t, x + 0.5f, y + 0.5f, z + 0.5f) * (x + 2 * y + 3 * z + 1));
}

static cudaTextureObject_t texture(cudaResourceDesc *res, cudaTextureAddressMode mode, int normalized,
                                   float border) {
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = mode;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = normalized;
    td.borderColor[0] = border;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, res, &td, NULL));
    return t;
}

static cudaResourceDesc array_res(cudaArray_t a) {
    cudaResourceDesc r;
    memset(&r, 0, sizeof r);
    r.resType = cudaResourceTypeArray;
    r.res.array.array = a;
    return r;
}

static unsigned long long fold_array(cudaArray_t a, size_t row) {
    static unsigned char host[W * H * 16];  // pageable
    CHECK(cudaMemcpy2DFromArray(host, row, a, 0, 0, row, H, cudaMemcpyDeviceToHost));
    return checksum(host, row * H);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 3;
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    cudaArray_t a, b, c;
    CHECK(cudaMallocArray(&a, &f, W, H, cudaArraySurfaceLoadStore));
    CHECK(cudaMallocArray(&b, &f, W, H, cudaArraySurfaceLoadStore));
    CHECK(cudaMallocArray(&c, &f, W, H));
    cudaChannelFormatDesc got;
    cudaExtent ext;
    unsigned flags;
    CHECK(cudaArrayGetInfo(&got, &ext, &flags, a));
    printf("array: %d bits, kind %d, %zux%zux%zu, flags %u\n", got.x, (int)got.f, ext.width, ext.height, ext.depth,
           flags);

    // contents: a from pageable memory, b in row-major pieces from pinned memory
    static float init[W * H];
    for (int i = 0; i < W * H; i++) init[i] = (float)((i * 37) % 101) * 0.25f;
    CHECK(cudaMemcpy2DToArray(a, 0, 0, init, W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));
    float *pin;
    CHECK(cudaMallocHost(&pin, W * H * sizeof(float)));
    for (int i = 0; i < W * H; i++) pin[i] = (float)(i % 13);
    CHECK(cudaMemcpyToArray(b, 0, 0, pin, W * H * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToArray(b, 12, 1, init, (3 * W + 5) * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyFromArray(pin, b, 0, 0, W * H * sizeof(float), cudaMemcpyDeviceToHost));
    printf("b: %016llx\n", checksum(pin, W * H * sizeof(float)));
    CHECK(cudaMemcpy2DArrayToArray(c, 8, 2, a, 4, 0, 16 * sizeof(float), 5, cudaMemcpyDeviceToDevice));
    printf("c: %016llx\n", fold_array(c, W * sizeof(float)));

    // objects: a texture made and destroyed between them leaves a gap in the values
    cudaResourceDesc ra = array_res(a), rb = array_res(b), rc = array_res(c);
    cudaTextureObject_t ta = texture(&ra, cudaAddressModeClamp, 0, 0);
    cudaTextureObject_t gap = texture(&rc, cudaAddressModeClamp, 0, 0);
    cudaTextureObject_t tb = texture(&rb, cudaAddressModeClamp, 0, 0);
    cudaTextureObject_t border = texture(&ra, cudaAddressModeBorder, 0, 0.25f);
    cudaTextureObject_t wrap = texture(&ra, cudaAddressModeWrap, 1, 0);
    CHECK(cudaDestroyTextureObject(gap));
    cudaSurfaceObject_t sa, sb;
    CHECK(cudaCreateSurfaceObject(&sa, &ra));
    CHECK(cudaCreateSurfaceObject(&sb, &rb));
    cudaResourceDesc back;
    CHECK(cudaGetTextureObjectResourceDesc(&back, tb));
    printf("texture of b: %d\n", back.res.array.array == b);

    // sampling: border and wrap addressing, normalized coordinates
    const int n = 8;
    float xs[n] = {-1.5f, 0.5f, 63.5f, 64.5f, 10.5f, 3.5f, 100.0f, 20.25f};
    float ys[n] = {0.5f, -0.5f, 31.5f, 2.5f, 40.5f, 7.5f, 3.0f, 5.75f};
    float nx[n], ny[n];
    for (int i = 0; i < n; i++) {
        nx[i] = xs[i] / W + 1.0f;
        ny[i] = ys[i] / H - 2.0f;
    }
    float *dx, *dy, *dout, out[n];
    CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CHECK(cudaMalloc(&dout, n * sizeof(float)));
    // samples of texture t at (x[i], y[i]), printed
    auto sample = [&](const char *what, cudaTextureObject_t t, const float *x, const float *y) {
        CHECK(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dy, y, n * sizeof(float), cudaMemcpyHostToDevice));
        sample2d<<<1, 32>>>(t, dx, dy, dout, n);
        CHECK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
        printf("%s:", what);
        for (int i = 0; i < n; i++) printf(" %g", out[i]);
        printf("\n");
    };
    sample("border", border, xs, ys);
    sample("wrap", wrap, nx, ny);

    // textures over linear and pitched memory
    int *lin, *iout, hi[40];
    CHECK(cudaMalloc(&lin, 100 * sizeof(int)));
    CHECK(cudaMalloc(&iout, 40 * sizeof(int)));
    for (int i = 0; i < 40; i++) hi[i] = i * i - 7;
    CHECK(cudaMemcpy(lin, hi, sizeof hi, cudaMemcpyHostToDevice));
    cudaResourceDesc rl;
    memset(&rl, 0, sizeof rl);
    rl.resType = cudaResourceTypeLinear;
    rl.res.linear.devPtr = lin;
    rl.res.linear.desc = cudaCreateChannelDesc<int>();
    rl.res.linear.sizeInBytes = 40 * sizeof(int);
    cudaTextureObject_t tl = texture(&rl, cudaAddressModeClamp, 0, 0);
    fetch1d<<<1, 64>>>(tl, iout, 16);
    CHECK(cudaMemcpy(hi, iout, 16 * sizeof(int), cudaMemcpyDeviceToHost));
    printf("linear:");
    for (int i = 0; i < 16; i++) printf(" %d", hi[i]);
    printf("\n");
    float *pitched;
    size_t pitch;
    CHECK(cudaMallocPitch(&pitched, &pitch, W * sizeof(float), H));
    CHECK(cudaMemcpy2D(pitched, pitch, init, W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));
    cudaResourceDesc rp;
    memset(&rp, 0, sizeof rp);
    rp.resType = cudaResourceTypePitch2D;
    rp.res.pitch2D.devPtr = pitched;
    rp.res.pitch2D.desc = f;
    rp.res.pitch2D.width = W;
    rp.res.pitch2D.height = H;
    rp.res.pitch2D.pitchInBytes = pitch;
    cudaTextureObject_t tp = texture(&rp, cudaAddressModeClamp, 0, 0);
    sample("pitched", tp, xs, ys);

    // a 3D array of ints, from pageable memory through cudaMemcpy3D, and back to device memory
    const int X = 8, Y = 4, Z = 3;
    static int vol[Z][Y][X], vol2[Z][Y][X];
    for (int z = 0; z < Z; z++)
        for (int y = 0; y < Y; y++)
            for (int x = 0; x < X; x++) vol[z][y][x] = x * 100 + y * 10 + z;
    cudaChannelFormatDesc fi = cudaCreateChannelDesc<int>();
    cudaArray_t v3;
    CHECK(cudaMalloc3DArray(&v3, &fi, make_cudaExtent(X, Y, Z), 0));
    cudaMemcpy3DParms p3;
    memset(&p3, 0, sizeof p3);
    p3.srcPtr = make_cudaPitchedPtr(vol, X * sizeof(int), X, Y);
    p3.dstArray = v3;
    p3.extent = make_cudaExtent(X, Y, Z);
    p3.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p3));
    cudaResourceDesc rv = array_res(v3);
    cudaTextureObject_t tv = texture(&rv, cudaAddressModeClamp, 0, 0);
    CHECK(cudaMemset(iout, 0, sizeof(int)));
    sum3d<<<Z, dim3(X, Y)>>>(tv, iout, X, Y, Z);
    int sum;
    CHECK(cudaMemcpy(&sum, iout, sizeof sum, cudaMemcpyDeviceToHost));
    int *dvol;
    CHECK(cudaMalloc(&dvol, sizeof vol));
    memset(&p3, 0, sizeof p3);
    p3.srcArray = v3;
    p3.srcPos = make_cudaPos(1, 1, 1);
    p3.dstPtr = make_cudaPitchedPtr(dvol, X * sizeof(int), X, Y);
    p3.extent = make_cudaExtent(X - 1, Y - 1, Z - 1);
    p3.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&p3));
    CHECK(cudaMemcpy(vol2, dvol, sizeof vol2, cudaMemcpyDeviceToHost));
    printf("3d: sum %d, moved %d %d %d\n", sum, vol2[0][0][0], vol2[1][2][6], vol2[0][1][3]);

    // what is refused
    cudaArray_t bad;
    cudaChannelFormatDesc odd = cudaCreateChannelDesc(8, 16, 0, 0, cudaChannelFormatKindUnsigned);
    printf("odd channels: %s\n", cudaGetErrorName(cudaMallocArray(&bad, &odd, 4, 4, 0)));
    printf("copy past the end: %s\n", cudaGetErrorName(cudaMemcpy2DToArray(a, 8, 0, init, W * sizeof(float),
                                                                           W * sizeof(float), 1,
                                                                           cudaMemcpyHostToDevice)));
    cudaGetLastError();

    // the long run: a and b in turn, through their textures and surfaces
    cudaArray_t rgba;
    cudaChannelFormatDesc f4 = cudaCreateChannelDesc<uchar4>();
    CHECK(cudaMallocArray(&rgba, &f4, W, H, cudaArraySurfaceLoadStore));
    cudaResourceDesc rr = array_res(rgba);
    cudaSurfaceObject_t srgba;
    CHECK(cudaCreateSurfaceObject(&srgba, &rr));
    dim3 block(16, 8), grid(W / 16, H / 8);
    for (int k = 0; k < steps; k++) {
        stencil<<<grid, block>>>(k % 2 ? tb : ta, k % 2 ? sa : sb, k);
        paint<<<grid, block>>>(srgba, k);
        CHECK(cudaDeviceSynchronize());
        printf("step %d: %016llx %016llx\n", k, fold_array(k % 2 ? a : b, W * sizeof(float)),
               fold_array(rgba, W * 4));
        fflush(stdout);
        if (argc > 1) usleep(150000);
    }
    CHECK(cudaDestroyTextureObject(ta));
    CHECK(cudaDestroyTextureObject(tb));
    CHECK(cudaDestroyTextureObject(border));
    CHECK(cudaDestroyTextureObject(wrap));
    CHECK(cudaDestroyTextureObject(tl));
    CHECK(cudaDestroyTextureObject(tp));
    CHECK(cudaDestroyTextureObject(tv));
    CHECK(cudaDestroySurfaceObject(sa));
    CHECK(cudaDestroySurfaceObject(sb));
    CHECK(cudaDestroySurfaceObject(srgba));
    CHECK(cudaFreeArray(a));
    CHECK(cudaFreeArray(b));
    CHECK(cudaFreeArray(c));
    CHECK(cudaFreeArray(v3));
    CHECK(cudaFreeArray(rgba));
    CHECK(cudaFreeHost(pin));
    printf("Test PASSED\n");
    return 0;
}
