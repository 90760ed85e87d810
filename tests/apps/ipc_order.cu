// Order between two applications through an interprocess event, the pattern of
// NVIDIA's simpleIPC: one process queues many kernels on a counter in shared
// device memory and records the event, then tells the other through a pipe; the
// other makes its stream wait for the event and reads the counter.  CUDA orders
// the wait after the record because the record call returned first, so the
// reader sees every increment; then the roles swap.  Each process has its own
// proxy under nvproxy: a record that returned before its proxy issued it would
// let the other proxy's wait run first and read a partial count.
// argv[1] = kernels queued per round (2000).
#include "check.h"
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

__global__ void add_one(int *p) { *p += 1; }
__global__ void copy_one(const int *from, int *to) { *to = *from; }

struct handles {
    cudaIpcMemHandle_t counter;
    cudaIpcEventHandle_t event;
};

static void signal_peer(int fd) {
    char c = 1;
    if (write(fd, &c, 1) != 1) exit(2);
}

static void wait_peer(int fd) {
    char c;
    if (read(fd, &c, 1) != 1) exit(2);
}

// queue k increments, then record the event behind them
static void produce(int *counter, cudaEvent_t ev, cudaStream_t s, int k) {
    for (int i = 0; i < k; i++) add_one<<<1, 1, 0, s>>>(counter);
    CHECK(cudaEventRecord(ev, s));
}

// wait for the event on the stream, then read the counter there
static int consume(int *counter, cudaEvent_t ev, cudaStream_t s) {
    int *seen, host = -1;
    CHECK(cudaMalloc(&seen, sizeof(int)));
    CHECK(cudaStreamWaitEvent(s, ev, 0));
    copy_one<<<1, 1, 0, s>>>(counter, seen);
    CHECK(cudaMemcpyAsync(&host, seen, sizeof host, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(seen));
    return host;
}

static int child(int in, int out, int k) {
    handles h;
    if (read(in, &h, sizeof h) != (ssize_t)sizeof h) return 2;
    int *counter;
    cudaEvent_t ev;
    cudaStream_t s;
    CHECK(cudaIpcOpenMemHandle((void **)&counter, h.counter, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenEventHandle(&ev, h.event));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    signal_peer(out);  // ready
    wait_peer(in);     // the parent recorded
    printf("child saw %d of %d\n", consume(counter, ev, s), k);
    produce(counter, ev, s, k);
    signal_peer(out);
    wait_peer(in);  // (the parent read it: the event and memory may go)
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaIpcCloseMemHandle(counter));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 4 && !strcmp(argv[1], "child")) return child(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    const char *ks = argc > 1 ? argv[1] : "2000";
    int k = atoi(ks);
    int *counter;
    cudaEvent_t ev;
    cudaStream_t s;
    handles h;
    CHECK(cudaMalloc(&counter, sizeof(int)));
    CHECK(cudaMemset(counter, 0, sizeof(int)));
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaIpcGetMemHandle(&h.counter, counter));
    CHECK(cudaIpcGetEventHandle(&h.event, ev));
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        char in[16], out[16];
        snprintf(in, sizeof in, "%d", to_child[0]);
        snprintf(out, sizeof out, "%d", to_parent[1]);
        execl("/proc/self/exe", argv[0], "child", in, out, ks, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(to_parent[1]);
    if (write(to_child[1], &h, sizeof h) != (ssize_t)sizeof h) return 2;
    wait_peer(to_parent[0]);  // the child opened both
    produce(counter, ev, s, k);
    signal_peer(to_child[1]);
    wait_peer(to_parent[0]);  // the child recorded behind its increments
    printf("parent saw %d of %d\n", consume(counter, ev, s), 2 * k);
    signal_peer(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child exited with %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaFree(counter));
    printf("Test PASSED\n");
    return 0;
}
