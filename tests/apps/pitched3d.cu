// 3D on pitched linear memory: cudaMalloc3D, cudaMemset3D, cudaMemcpy3D with
// offsets, host <-> device and device <-> device.
#include "check.h"

int main() {
    const size_t W = 100, H = 7, D = 5;  // width in bytes
    cudaExtent ext = make_cudaExtent(W, H, D);
    cudaPitchedPtr a, b;
    CHECK(cudaMalloc3D(&a, ext));
    CHECK(cudaMalloc3D(&b, ext));
    printf("pitch >= width: %s\n", a.pitch >= W ? "yes" : "no");
    CHECK(cudaMemset3D(a, 0x11, ext));
    static unsigned char host[D][H][W], back[D][H][W];
    for (size_t z = 0; z < D; z++)
        for (size_t y = 0; y < H; y++)
            for (size_t x = 0; x < W; x++) host[z][y][x] = (unsigned char)(x + 3 * y + 7 * z);
    cudaMemcpy3DParms up = {};
    up.srcPtr = make_cudaPitchedPtr(host, W, W, H);
    up.dstPtr = a;
    up.extent = make_cudaExtent(60, 4, 3);  // a sub-box at an offset
    up.dstPos = make_cudaPos(10, 2, 1);
    up.srcPos = make_cudaPos(5, 1, 1);
    up.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&up));
    cudaMemcpy3DParms dd = {};
    dd.srcPtr = a;
    dd.dstPtr = b;
    dd.extent = ext;
    dd.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&dd));
    cudaMemcpy3DParms down = {};
    down.srcPtr = b;
    down.dstPtr = make_cudaPitchedPtr(back, W, W, H);
    down.extent = ext;
    down.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&down));
    int bad = 0;
    for (size_t z = 0; z < D; z++)
        for (size_t y = 0; y < H; y++)
            for (size_t x = 0; x < W; x++) {
                bool in = x >= 10 && x < 70 && y >= 2 && y < 6 && z >= 1 && z < 4;
                unsigned char want = in ? host[z][y - 1][x - 5] : 0x11;
                bad += back[z][y][x] != want;
            }
    printf("3D copies: mismatches=%d checksum=%llx\n", bad, checksum(back, sizeof back));
    CHECK(cudaFree(a.ptr));
    CHECK(cudaFree(b.ptr));
    printf("Test PASSED\n");
    return 0;
}
