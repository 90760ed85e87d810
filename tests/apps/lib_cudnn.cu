// cuDNN's legacy API as a training framework uses it: a handle on a created stream; tensor, filter, convolution and
// activation descriptors made once; per step one of a convolution forward plus a bias, a ReLU, the convolution's
// backward data and backward filter (and the bias's gradient), and a double-precision AddTensor (its alpha and beta
// doubles).  FMA math and deterministic algorithms, so results are bit-identical run to run; the algorithm queries
// (cudnnGet*Algorithm_v7, cudnnFind*) and workspace sizes run once.  Steps and output: lib_common.h.
// Build: nvcc -cudart shared -I<cudnn>/include -L<cudnn>/lib -lcudnn.
#include "lib_common.h"
#include <cudnn.h>

static const int OPS = 5;
static const int N = 4, C = 8, H = 16, W = 16, K = 16, R = 3, S = 3, PAD = 1;
static const int SAMPLES = 64;

static size_t at(int n, int c, int h, int w, int cs, int hs, int ws) {
    return (((size_t)n * cs + c) * hs + h) * ws + w;
}

// sampled CPU references (cross-correlation, stride 1, padding PAD): y = conv(x, w) + bias; dx; dw
static void check_forward(const float *x, const float *w, const float *bias, const float *y) {
    for (int s = 0; s < SAMPLES; s++) {
        int n = s % N, k = (s * 7) % K, h = (s * 13) % H, q = (s * 5) % W;
        double want = bias[k];
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < S; t++) {
                    int hh = h + r - PAD, ww = q + t - PAD;
                    if (hh >= 0 && hh < H && ww >= 0 && ww < W)
                        want += (double)x[at(n, c, hh, ww, C, H, W)] * w[at(k, c, r, t, C, R, S)];
                }
        expect_close("convolution forward", at(n, k, h, q, K, H, W), y[at(n, k, h, q, K, H, W)], want, 1e-4);
    }
}

static void check_backward_data(const float *dy, const float *w, const float *dx) {
    for (int s = 0; s < SAMPLES; s++) {
        int n = s % N, c = (s * 3) % C, h = (s * 11) % H, q = (s * 7) % W;
        double want = 0;
        for (int k = 0; k < K; k++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < S; t++) {
                    int hh = h - r + PAD, ww = q - t + PAD;
                    if (hh >= 0 && hh < H && ww >= 0 && ww < W)
                        want += (double)dy[at(n, k, hh, ww, K, H, W)] * w[at(k, c, r, t, C, R, S)];
                }
        expect_close("convolution backward data", at(n, c, h, q, C, H, W), dx[at(n, c, h, q, C, H, W)], want, 1e-4);
    }
}

static void check_backward_filter(const float *x, const float *dy, const float *dw) {
    for (int s = 0; s < SAMPLES; s++) {
        int k = s % K, c = (s * 5) % C, r = s % R, t = (s / R) % S;
        double want = 0;
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++)
                for (int q = 0; q < W; q++) {
                    int hh = h + r - PAD, ww = q + t - PAD;
                    if (hh >= 0 && hh < H && ww >= 0 && ww < W)
                        want += (double)x[at(n, c, hh, ww, C, H, W)] * dy[at(n, k, h, q, K, H, W)];
                }
        expect_close("convolution backward filter", at(k, c, r, t, C, R, S), dw[at(k, c, r, t, C, R, S)], want, 1e-4,
                     10.0);
    }
}

int main(int argc, char **argv) {
    Steps steps = parse_steps(argc, argv, OPS);
    const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * K * H * W, nw = (size_t)K * C * R * S;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    cudnnHandle_t h;
    LCHECK(cudnnCreate(&h));
    LCHECK(cudnnSetStream(h, stream));
    printf("cuDNN %zu (%s)\n", cudnnGetVersion() / 10000, cudnnGetErrorString(CUDNN_STATUS_SUCCESS));

    cudnnTensorDescriptor_t xd, yd, bd, dd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t ad;
    LCHECK(cudnnCreateTensorDescriptor(&xd));
    LCHECK(cudnnCreateTensorDescriptor(&yd));
    LCHECK(cudnnCreateTensorDescriptor(&bd));
    LCHECK(cudnnCreateTensorDescriptor(&dd));
    LCHECK(cudnnCreateFilterDescriptor(&wd));
    LCHECK(cudnnCreateConvolutionDescriptor(&cd));
    LCHECK(cudnnCreateActivationDescriptor(&ad));
    LCHECK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W));
    LCHECK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, K, H, W));
    LCHECK(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, K, 1, 1));
    int dims[4] = {N, K, H, W}, strides[4] = {K * H * W, H * W, W, 1};
    LCHECK(cudnnSetTensorNdDescriptor(dd, CUDNN_DATA_DOUBLE, 4, dims, strides));
    LCHECK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, R, S));
    LCHECK(cudnnSetConvolution2dDescriptor(cd, PAD, PAD, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    LCHECK(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
    LCHECK(cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    int on, oc, oh, ow, nbdims = 0, got_dims[4], got_strides[4];
    cudnnDataType_t got_type;
    LCHECK(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow));
    LCHECK(cudnnGetTensorNdDescriptor(dd, 4, &got_type, &nbdims, got_dims, got_strides));
    printf("output %dx%dx%dx%d, double tensor of %d dimensions, strides %d %d %d %d\n", on, oc, oh, ow, nbdims,
           got_strides[0], got_strides[1], got_strides[2], got_strides[3]);

    // the algorithm queries (their choices are not printed: Find times the candidates)
    int returned = 0;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    LCHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8, &returned, perf));
    int heuristics = returned;
    LCHECK(cudnnFindConvolutionForwardAlgorithm(h, xd, wd, cd, yd, 8, &returned, perf));
    printf("algorithm queries answered: %d\n", heuristics > 0 && returned > 0 && perf[0].status == 0);
    const cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    const cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    const cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    size_t ws_fwd = 0, ws_data = 0, ws_filter = 0;
    LCHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, fwd, &ws_fwd));
    LCHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, bwd_data, &ws_data));
    LCHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, bwd_filter, &ws_filter));
    size_t ws_size = ws_fwd > ws_data ? ws_fwd : ws_data;
    ws_size = ws_size > ws_filter ? ws_size : ws_filter;
    void *ws = nullptr;
    if (ws_size)
        CHECK(cudaMalloc(&ws, ws_size));

    float *hx = (float *)malloc(nx * 4), *hw = (float *)malloc(nw * 4), *hb = (float *)malloc(K * 4);
    fill_f(hw, nw, 7);
    fill_f(hb, K, 8);
    float *x = device_alloc<float>(nx), *w = device_copy(hw, nw), *bias = device_copy(hb, K);
    float *y = device_alloc<float>(ny), *dx = device_alloc<float>(nx), *dw = device_alloc<float>(nw);
    float *db = device_alloc<float>(K);
    double *da = device_alloc<double>(ny), *dc = device_alloc<double>(ny);
    double *hd = (double *)malloc(ny * 8);
    fill_d(hd, ny, 9);
    CHECK(cudaMemcpy(dc, hd, ny * 8, cudaMemcpyHostToDevice));
    const float one = 1, zero = 0;

    for (int k = 0; k < steps.count; k++) {
        int op = k % OPS, round = k / OPS;
        if (op == 0) {  // y = conv(x, w) + bias, x new each round
            fill_f(hx, nx, 100 + round);
            CHECK(cudaMemcpyAsync(x, hx, nx * 4, cudaMemcpyHostToDevice, stream));
            LCHECK(cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, fwd, ws, ws_fwd, &zero, yd, y));
            LCHECK(cudnnAddTensor(h, &one, bd, bias, &one, yd, y));
            float *hy = host_copy(y, ny);
            check_forward(hx, hw, hb, hy);
            step_done(steps, k, "convolution forward + bias %016llx", checksum(hy, ny * 4));
            free(hy);
        } else if (op == 1) {  // y = relu(y), in place
            LCHECK(cudnnActivationForward(h, ad, &one, yd, y, &zero, yd, y));
            float *hy = host_copy(y, ny);
            for (size_t i = 0; i < ny; i++)
                if (hy[i] < 0) {
                    printf("MISMATCH relu at %zu: %g\n", i, hy[i]);
                    return 1;
                }
            step_done(steps, k, "relu %016llx", checksum(hy, ny * 4));
            free(hy);
        } else if (op == 2) {  // dx from dy = y
            LCHECK(cudnnConvolutionBackwardData(h, &one, wd, w, yd, y, cd, bwd_data, ws, ws_data, &zero, xd, dx));
            float *hy = host_copy(y, ny), *hdx = host_copy(dx, nx);
            check_backward_data(hy, hw, hdx);
            step_done(steps, k, "convolution backward data %016llx", checksum(hdx, nx * 4));
            free(hy);
            free(hdx);
        } else if (op == 3) {  // dw and db from x and dy = y
            LCHECK(cudnnConvolutionBackwardFilter(h, &one, xd, x, yd, y, cd, bwd_filter, ws, ws_filter, &zero, wd,
                                                  dw));
            LCHECK(cudnnConvolutionBackwardBias(h, &one, yd, y, &zero, bd, db));
            float *hy = host_copy(y, ny), *hdw = host_copy(dw, nw), *hdb = host_copy(db, K);
            check_backward_filter(hx, hy, hdw);
            step_done(steps, k, "convolution backward filter %016llx, bias %016llx", checksum(hdw, nw * 4),
                      checksum(hdb, K * 4));
            free(hy);
            free(hdw);
            free(hdb);
        } else {  // c = 0.5 a + 2 c in doubles, a = fill(round)
            double alpha = 0.5, beta = 2.0;
            double *ha = (double *)malloc(ny * 8), *prev = host_copy(dc, ny);
            fill_d(ha, ny, 200 + round);
            CHECK(cudaMemcpyAsync(da, ha, ny * 8, cudaMemcpyHostToDevice, stream));
            LCHECK(cudnnAddTensor(h, &alpha, dd, da, &beta, dd, dc));
            double *got = host_copy(dc, ny);
            for (size_t i = 0; i < ny; i += 97)
                expect_close("double add tensor", i, got[i], alpha * ha[i] + beta * prev[i], 1e-12);
            step_done(steps, k, "double add tensor %016llx", checksum(got, ny * 8));
            free(ha);
            free(prev);
            free(got);
        }
    }
    LCHECK(cudnnDestroyActivationDescriptor(ad));
    LCHECK(cudnnDestroyConvolutionDescriptor(cd));
    LCHECK(cudnnDestroyFilterDescriptor(wd));
    for (cudnnTensorDescriptor_t t : {xd, yd, bd, dd})
        LCHECK(cudnnDestroyTensorDescriptor(t));
    LCHECK(cudnnDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    printf("Test PASSED\n");
    return 0;
}
