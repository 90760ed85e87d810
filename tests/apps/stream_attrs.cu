// Stream attributes: an access policy window (persisting L2 for a buffer),
// the synchronisation policy and the priority, read back; the persisting L2
// lines reset; kernels run under them.  argv[1] = ms to wait between setting
// the attributes and reading them again (a checkpoint test migrates there).
#include "check.h"
#include <unistd.h>

__global__ void touch(float *p, int n, int round) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 0.5f + (float)round;
}

static void show(const char *when, cudaStream_t s, bool policy = true) {
    cudaStreamAttrValue v;
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
    printf("%s: window %s bytes %zu hit %.2f props %d/%d\n", when, v.accessPolicyWindow.base_ptr ? "set" : "none",
           v.accessPolicyWindow.num_bytes, v.accessPolicyWindow.hitRatio, (int)v.accessPolicyWindow.hitProp,
           (int)v.accessPolicyWindow.missProp);
    if (policy) {
        CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
        printf("%s: sync policy %d\n", when, (int)v.syncPolicy);
    }
    fflush(stdout);  // a test reads these lines while the program runs
}

int main(int argc, char **argv) {
    int pause_ms = argc > 1 ? atoi(argv[1]) : 0;
    const int n = 1 << 20;
    float *p;
    CHECK(cudaMalloc(&p, n * sizeof(float)));
    CHECK(cudaMemset(p, 0, n * sizeof(float)));
    int least, greatest;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    show("fresh", s, false);
    cudaStreamAttrValue v = {};
    v.accessPolicyWindow.base_ptr = p;
    v.accessPolicyWindow.num_bytes = 1 << 20;  // within every recent GPU's window limit
    v.accessPolicyWindow.hitRatio = 0.5f;
    v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
    cudaStreamAttrValue sp = {};
    sp.syncPolicy = cudaSyncPolicyYield;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &sp));
    cudaStreamAttrValue pr;
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributePriority, &pr));
    printf("priority is the greatest: %d\n", pr.priority == greatest);
    show("set", s);
    for (int r = 0; r < 10; r++) touch<<<(n + 255) / 256, 256, 0, s>>>(p, n, r);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaCtxResetPersistingL2Cache());
    usleep(pause_ms * 1000);
    show("later", s);
    for (int r = 0; r < 10; r++) touch<<<(n + 255) / 256, 256, 0, s>>>(p, n, r);
    CHECK(cudaStreamSynchronize(s));  // (s does not synchronise with the legacy stream of the copy)
    float h[4];
    CHECK(cudaMemcpy(h, p + n - 4, sizeof h, cudaMemcpyDeviceToHost));
    printf("values %.4f %.4f\n", h[0], h[3]);
    cudaStreamAttrValue bad = {};
    printf("unknown attribute: %s\n", cudaGetErrorName(cudaStreamSetAttribute(s, (cudaStreamAttrID)999, &bad)));
    cudaGetLastError();
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(p));
    printf("Test PASSED\n");
    return 0;
}
