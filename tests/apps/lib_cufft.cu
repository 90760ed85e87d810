// cuFFT as HPC codes use it: plans made once and executed every step on a created stream (1D C2C forward and
// inverse, 2D R2C/C2R, a 3D 64^3 C2C convolution with a k-space filter of the program's own kernel, as particle-mesh
// Ewald does, a batched plan of an advanced (strided) layout, a double-precision Z2Z transform, and a plan whose work
// area the program gives it), with cufftGetSize and the version queries.  The 3D grid and the 1D signal carry their
// values from step to step.  Steps and output: lib_common.h.  Build: nvcc -cudart shared -lcufft.
#include "lib_common.h"
#include <cufft.h>

static const int OPS = 7;
static const int N1 = 4096, N2 = 256, N3 = 64, NB = 1024, BATCH = 64, NZ = 2048, NW = 8192, WBATCH = 4;

__global__ void scale(float2 *p, int n, float s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = make_float2(p[i].x * s, p[i].y * s);
}

// a Gaussian in k-space, and the 1/n^3 of the round trip
__global__ void filter3d(float2 *p, int n, float width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * n * n) return;
    int a = i / (n * n), b = i / n % n, c = i % n;
    a = a > n / 2 ? a - n : a;
    b = b > n / 2 ? b - n : b;
    c = c > n / 2 ? c - n : c;
    float g = expf(-(float)(a * a + b * b + c * c) / width) / (float)(n * n * n);
    p[i] = make_float2(p[i].x * g, p[i].y * g);
}

// sum_j x[j * stride] e^(sign 2 pi i j k / n), the direct DFT of one bin
template <typename C> static void dft_bin(const C *x, int n, int stride, int k, int sign, double *re, double *im) {
    double r = 0, m = 0;
    for (int j = 0; j < n; j++) {
        double t = sign * 2.0 * M_PI * (double)((long long)j * k % n) / n;
        r += x[(size_t)j * stride].x * cos(t) - x[(size_t)j * stride].y * sin(t);
        m += x[(size_t)j * stride].x * sin(t) + x[(size_t)j * stride].y * cos(t);
    }
    *re = r;
    *im = m;
}

// a complex value within tol of (re, im), relative to max(|part|, scale)
template <typename C>
static void expect_close_c(const char *what, size_t where, C got, double re, double im, double tol, double scale) {
    expect_close(what, where, got.x, re, tol, scale);
    expect_close(what, where, got.y, im, tol, scale);
}

template <typename C> static void check_bin(const char *what, const C *x, const C *X, int n, int stride, int k,
                                            int sign, double tol) {
    double re, im;
    dft_bin(x, n, stride, k, sign, &re, &im);
    expect_close_c(what, k, X[(size_t)k * stride], re, im, tol, sqrt((double)n));
}

static void fill_c(float2 *p, size_t n, unsigned seed) { fill_f((float *)p, 2 * n, seed); }

static void launch_scale(float2 *p, int n, float s, cudaStream_t st) {
    scale<<<(n + 255) / 256, 256, 0, st>>>(p, n, s);
    CHECK(cudaGetLastError());
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    cufftHandle p1, p2r, p2c, p3, pm, pz, pw;
    LCHECK(cufftPlan1d(&p1, N1, CUFFT_C2C, 1));
    LCHECK(cufftPlan2d(&p2r, N2, N2, CUFFT_R2C));
    LCHECK(cufftPlan2d(&p2c, N2, N2, CUFFT_C2R));
    LCHECK(cufftPlan3d(&p3, N3, N3, N3, CUFFT_C2C));
    int nb[1] = {NB};
    // batches interleaved in the input (element j of batch b at j * BATCH + b), contiguous in the output
    LCHECK(cufftPlanMany(&pm, 1, nb, nb, BATCH, 1, nb, 1, NB, CUFFT_C2C, BATCH));
    LCHECK(cufftPlan1d(&pz, NZ, CUFFT_Z2Z, 1));
    size_t pw_bytes = 0;
    LCHECK(cufftCreate(&pw));
    LCHECK(cufftSetAutoAllocation(pw, 0));
    LCHECK(cufftMakePlan1d(pw, NW, CUFFT_C2C, WBATCH, &pw_bytes));
    void *work = device_alloc<char>(pw_bytes > 0 ? pw_bytes : 1);
    LCHECK(cufftSetWorkArea(pw, work));
    cufftHandle plans[] = {p1, p2r, p2c, p3, pm, pz, pw};
    for (cufftHandle p : plans) LCHECK(cufftSetStream(p, st));

    float2 *h1 = (float2 *)malloc(sizeof(float2) * N1);
    fill_c(h1, N1, 1);
    float2 *sig1 = device_copy(h1, N1), *spec1 = device_alloc<float2>(N1);
    float *r2 = device_alloc<float>(N2 * N2);
    float2 *spec2 = device_alloc<float2>(N2 * (N2 / 2 + 1));
    const int n3 = N3 * N3 * N3;
    float2 *h3 = (float2 *)malloc(sizeof(float2) * n3);
    fill_c(h3, n3, 3);
    float2 *grid = device_copy(h3, n3);
    float2 *bin_in = device_alloc<float2>(NB * BATCH), *bin_out = device_alloc<float2>(NB * BATCH);
    double2 *z = device_alloc<double2>(NZ), *zspec = device_alloc<double2>(NZ);
    float2 *win = device_alloc<float2>(NW * WBATCH), *wout = device_alloc<float2>(NW * WBATCH);

    for (int k = 0; k < steps.count; k++) {
        int round = k / OPS;
        switch (k % OPS) {
        case 0: {  // 1D: forward out of place, inverse in place, scaled back by a kernel on the same stream
            float2 *x = host_copy(sig1, N1);
            LCHECK(cufftExecC2C(p1, sig1, spec1, CUFFT_FORWARD));
            float2 *X = host_copy(spec1, N1);
            for (int b = 0; b < N1; b += 509) check_bin("1D C2C", x, X, N1, 1, b, -1, 1e-4);
            LCHECK(cufftExecC2C(p1, spec1, sig1, CUFFT_INVERSE));
            launch_scale(sig1, N1, 1.0f / N1, st);
            float2 *back = host_copy(sig1, N1);
            for (int i = 0; i < N1; i++) {
                expect_close_c("1D round trip", i, back[i], x[i].x, x[i].y, 1e-5, 1.0);
            }
            step_done(steps, k, "1D C2C %d forward %016llx inverse %016llx", N1, checksum(X, sizeof(float2) * N1),
                      checksum(back, sizeof(float2) * N1));
            free(x);
            free(X);
            free(back);
            break;
        }
        case 1: {  // 2D real to complex and back (C2R overwrites its input)
            float *r = (float *)malloc(sizeof(float) * N2 * N2);
            fill_f(r, N2 * N2, 10 + round);
            CHECK(cudaMemcpyAsync(r2, r, sizeof(float) * N2 * N2, cudaMemcpyHostToDevice, st));
            LCHECK(cufftExecR2C(p2r, r2, spec2));
            const int nc = N2 * (N2 / 2 + 1);
            float2 *X = host_copy(spec2, nc);
            for (int kx = 0; kx < N2; kx += 85)  // bins (kx, ky) against the direct 2D DFT
                for (int ky = 0; ky <= N2 / 2; ky += 43) {
                    double re = 0, im = 0;
                    for (int i = 0; i < N2; i++)
                        for (int j = 0; j < N2; j++) {
                            double t = -2.0 * M_PI * (double)((i * kx + j * ky) % N2) / N2;
                            re += r[i * N2 + j] * cos(t);
                            im += r[i * N2 + j] * sin(t);
                        }
                    expect_close_c("2D R2C", kx * (N2 / 2 + 1) + ky, X[kx * (N2 / 2 + 1) + ky], re, im, 1e-4, N2);
                }
            LCHECK(cufftExecC2R(p2c, spec2, r2));
            float *back = host_copy(r2, N2 * N2);
            for (int i = 0; i < N2 * N2; i++)
                expect_close("2D round trip", i, back[i], (double)N2 * N2 * r[i], 1e-4, N2 * N2);
            step_done(steps, k, "2D R2C/C2R %dx%d %016llx %016llx", N2, N2, checksum(X, sizeof(float2) * nc),
                      checksum(back, sizeof(float) * N2 * N2));
            free(r);
            free(X);
            free(back);
            break;
        }
        case 2: {  // 3D convolution: forward, a k-space filter, inverse; the grid carries over
            float2 *x = host_copy(grid, n3);
            LCHECK(cufftExecC2C(p3, grid, grid, CUFFT_FORWARD));
            float2 *X = host_copy(grid, n3);
            const int bins[3][3] = {{0, 0, 0}, {1, 2, 3}, {33, 7, 60}};
            for (auto &b : bins) {
                double re = 0, im = 0;
                for (int i = 0; i < n3; i++) {
                    int e = (b[0] * (i / (N3 * N3)) + b[1] * (i / N3 % N3) + b[2] * (i % N3)) % N3;
                    double t = -2.0 * M_PI * e / N3;
                    re += x[i].x * cos(t) - x[i].y * sin(t);
                    im += x[i].x * sin(t) + x[i].y * cos(t);
                }
                int at = (b[0] * N3 + b[1]) * N3 + b[2];
                expect_close_c("3D C2C", at, X[at], re, im, 1e-4, sqrt((double)n3));
            }
            filter3d<<<(n3 + 255) / 256, 256, 0, st>>>(grid, N3, 200.0f);
            CHECK(cudaGetLastError());
            LCHECK(cufftExecC2C(p3, grid, grid, CUFFT_INVERSE));
            float2 *after = host_copy(grid, n3);
            step_done(steps, k, "3D C2C %d^3 filtered %016llx %016llx", N3, checksum(X, sizeof(float2) * n3),
                      checksum(after, sizeof(float2) * n3));
            free(x);
            free(X);
            free(after);
            break;
        }
        case 3: {  // batched, strided input
            float2 *x = (float2 *)malloc(sizeof(float2) * NB * BATCH);
            fill_c(x, NB * BATCH, 30 + round);
            CHECK(cudaMemcpyAsync(bin_in, x, sizeof(float2) * NB * BATCH, cudaMemcpyHostToDevice, st));
            LCHECK(cufftExecC2C(pm, bin_in, bin_out, CUFFT_FORWARD));
            float2 *X = host_copy(bin_out, NB * BATCH);
            for (int b = 0; b < BATCH; b += 21)
                for (int f = 0; f < NB; f += 255) {
                    double re, im;
                    dft_bin(x + b, NB, BATCH, f, -1, &re, &im);
                    expect_close_c("plan many", b * NB + f, X[b * NB + f], re, im, 1e-4, sqrt((double)NB));
                }
            step_done(steps, k, "plan many %d x %d strided %016llx", BATCH, NB,
                      checksum(X, sizeof(float2) * NB * BATCH));
            free(x);
            free(X);
            break;
        }
        case 4: {  // double precision, forward and inverse
            double2 *x = (double2 *)malloc(sizeof(double2) * NZ);
            fill_d((double *)x, 2 * NZ, 40 + round);
            CHECK(cudaMemcpyAsync(z, x, sizeof(double2) * NZ, cudaMemcpyHostToDevice, st));
            LCHECK(cufftExecZ2Z(pz, z, zspec, CUFFT_FORWARD));
            double2 *X = host_copy(zspec, NZ);
            for (int b = 0; b < NZ; b += 127) check_bin("Z2Z", x, X, NZ, 1, b, -1, 1e-12);
            LCHECK(cufftExecZ2Z(pz, zspec, z, CUFFT_INVERSE));
            double2 *back = host_copy(z, NZ);
            for (int i = 0; i < NZ; i++) {
                expect_close_c("Z2Z round trip", i, back[i], NZ * x[i].x, NZ * x[i].y, 1e-12, NZ);
            }
            step_done(steps, k, "Z2Z %d %016llx %016llx", NZ, checksum(X, sizeof(double2) * NZ),
                      checksum(back, sizeof(double2) * NZ));
            free(x);
            free(X);
            free(back);
            break;
        }
        case 5: {  // the plan whose work area is the program's
            float2 *x = (float2 *)malloc(sizeof(float2) * NW * WBATCH);
            fill_c(x, NW * WBATCH, 50 + round);
            CHECK(cudaMemcpyAsync(win, x, sizeof(float2) * NW * WBATCH, cudaMemcpyHostToDevice, st));
            LCHECK(cufftExecC2C(pw, win, wout, CUFFT_INVERSE));
            float2 *X = host_copy(wout, NW * WBATCH);
            for (int b = 0; b < WBATCH; b++)
                for (int f = 1; f < NW; f += 2047)
                    check_bin("own work area", x + b * NW, X + b * NW, NW, 1, f, 1, 1e-4);
            step_done(steps, k, "C2C %d x %d in a work area of %zu bytes %016llx", WBATCH, NW, pw_bytes,
                      checksum(X, sizeof(float2) * NW * WBATCH));
            free(x);
            free(X);
            break;
        }
        case 6: {  // host-side queries
            int version = 0, major = 0;
            LCHECK(cufftGetVersion(&version));
            LCHECK(cufftGetProperty(MAJOR_VERSION, &major));
            size_t sizes[7];
            for (int i = 0; i < 7; i++) LCHECK(cufftGetSize(plans[i], &sizes[i]));
            step_done(steps, k, "version %d major %d (%s) work areas %zu %zu %zu %zu %zu %zu %zu", version, major,
                      major == CUFFT_VER_MAJOR ? "as the header" : "NOT as the header", sizes[0], sizes[1], sizes[2],
                      sizes[3], sizes[4], sizes[5], sizes[6]);
            break;
        }
        }
    }

    CHECK(cudaStreamSynchronize(st));
    for (cufftHandle p : plans) LCHECK(cufftDestroy(p));
    void *bufs[] = {work, sig1, spec1, r2, spec2, grid, bin_in, bin_out, z, zspec, win, wout};
    for (void *b : bufs) CHECK(cudaFree(b));
    CHECK(cudaStreamDestroy(st));
    free(h1);
    free(h3);
    printf("Test PASSED\n");
    return 0;
}
