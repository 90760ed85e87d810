// CUDA graphs by stream capture: a fork/join capture over two streams with
// kernels, events (destroyed with the forked stream during the capture), a pinned copy, a memset and a host function; instantiate,
// launch repeatedly, relaunch after the inputs changed; capture status; what
// may not happen during a capture.  argv[1] = launches in a long run (each
// followed by a pause: checkpoint tests restore the graph mid-run).
#include "graph_kernels.h"
#include <cstring>
#include <unistd.h>

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0;
    const int n = 1 << 16;
    int *a, *b, *pin;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMallocHost(&pin, n * sizeof(int)));
    CHECK(cudaMemset(a, 0, n * sizeof(int)));
    CHECK(cudaMemset(b, 0, n * sizeof(int)));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("before: %d\n", (int)st);
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamIsCapturing(s1, &st));
    unsigned long long id = 0;
    CHECK(cudaStreamGetCaptureInfo(s1, &st, &id));
    printf("capturing: %d, id set: %d\n", (int)st, id != 0);
    scale<<<n / 256, 256, 0, s1>>>(a, n, 3);
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));  // s2 joins the capture
    CHECK(cudaStreamIsCapturing(s2, &st));
    printf("s2 joined: %d\n", (int)st);
    scale<<<n / 256, 256, 0, s2>>>(b, n, 2);
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    // (as NVIDIA's graphMemoryNodes does: the forked stream and the events go before the capture ends; a
    // restore replays the capture with stand-ins for them)
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s2));
    add<<<n / 256, 256, 0, s1>>>(a, b, n);
    CHECK(cudaMemcpyAsync(pin, a, n * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaLaunchHostFunc(s1, count_call, &host_calls));
    CHECK(cudaMemsetAsync(b, 0, 64 * sizeof(int), s1));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s1, &g));
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("after: %d, host calls so far %d\n", (int)st, host_calls);
    // the captured graph's nodes, named through cudaGraphGetNodes, and two more added after all of them
    size_t count = 0, got = 32;
    cudaGraphNode_t listed[32];
    CHECK(cudaGraphGetNodes(g, NULL, &count));
    CHECK(cudaGraphGetNodes(g, listed, &got));
    printf("captured nodes: %zu, listed %zu\n", count, got);
    cudaGraphNodeParams mp = {};
    mp.type = cudaGraphNodeTypeMemset;
    mp.memset.dst = b + 64;
    mp.memset.value = 5;
    mp.memset.elementSize = 4;
    mp.memset.width = 64;
    mp.memset.height = 1;
    cudaGraphNode_t late, tail;
    CHECK(cudaGraphAddNode(&late, g, listed, NULL, got, &mp));
    cudaGraphNodeParams hp = {};
    hp.type = cudaGraphNodeTypeHost;
    hp.host.fn = count_call;
    hp.host.userData = &host_calls;
    CHECK(cudaGraphAddNode(&tail, g, &late, NULL, 1, &hp));
    got = 32;
    CHECK(cudaGraphGetNodes(g, listed, &got));
    printf("nodes now: %zu, the last two ours: %d\n", got, listed[got - 2] == late && listed[got - 1] == tail);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaGraphUpload(x, s1));
    for (int i = 0; i < 3; i++) {
        CHECK(cudaGraphLaunch(x, s1));
        CHECK(cudaStreamSynchronize(s1));
        printf("launch %d: %016llx host calls %d\n", i, fold(pin, n), host_calls);
    }
    CHECK(cudaGraphDestroy(g));  // the executable graph lives on
    CHECK(cudaGraphLaunch(x, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("after destroying the graph: %016llx host calls %d\n", fold(pin, n), host_calls);

    // what a capture does not allow: a synchronisation invalidates it
    cudaStream_t s3;
    CHECK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(s3, cudaStreamCaptureModeGlobal));
    scale<<<1, 32, 0, s3>>>(a, 32, 1);
    printf("sync while capturing: %s\n", cudaGetErrorName(cudaStreamSynchronize(s3)));
    cudaGraph_t bad;
    printf("end of invalidated capture: %s\n", cudaGetErrorName(cudaStreamEndCapture(s3, &bad)));
    printf("capture on the legacy stream: %s\n",
           cudaGetErrorName(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal)));
    cudaGetLastError();

    for (int i = 0; i < long_run; i++) {
        CHECK(cudaGraphLaunch(x, s1));
        CHECK(cudaStreamSynchronize(s1));
        CHECK(cudaStreamIsCapturing(s3, &st));  // (the invalidated capture stays ended)
        printf("run %d: %016llx host calls %d, s3 capturing %d\n", i, fold(pin, n), host_calls, (int)st);
        fflush(stdout);
        usleep(150000);
    }
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s3));
    printf("Test PASSED\n");
    return 0;
}
