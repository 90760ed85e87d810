// CUDA IPC between two applications: the parent exports a large allocation, a
// small one and an interprocess event, forks and execs itself as a child that
// opens them (each has its own proxy under nvproxy), waits for the event, changes
// the memory and exits; the parent then sees the child's writes.  Also: a
// process may not open its own handle, a plain event has no IPC handle, memory
// opened twice is the same mapping, and cudaFree does not free opened memory.
// Pool IPC too: a pool made with POSIX file descriptor handles is exported (its
// descriptor inherited by the child) with one of its allocations; the child
// imports both, refuses empty export data, changes the memory and frees it.
// argv[1] = "wait": pause after exporting (checkpoint tests: the exporter is migrated before the child opens);
// "child-wait": the child pauses after opening (checkpoint tests: the importer or the exporter is migrated, or
// both are checkpointed and restarted, while it is open); argv[2]: seconds of the pause (3);
// "other-device": the child runs on device 1 and reaches device 0's memory through the peer access that
// cudaIpcMemLazyEnablePeerAccess and cudaMemPoolSetAccess give it (as NVIDIA's simpleIPC on two GPUs).
#include "check.h"
#include <cstring>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

__global__ void fill(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * k;
}
__global__ void bump(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 2 + k;
}

const int N = 1 << 16, SMALL = 64;

struct handles {
    cudaIpcMemHandle_t big, small;
    cudaIpcEventHandle_t event;
    cudaMemPoolPtrExportData pooled;
    int pool_fd;
};

static unsigned long long fold(const int *p, int n) {
    unsigned long long s = 0;
    for (int i = 0; i < n; i++) s = s * 31 + (unsigned)p[i];
    return s;
}

static int child(int fd, int wait) {
    handles h;
    if (read(fd, &h, sizeof h) != (ssize_t)sizeof h) return 2;
    int dev = getenv("IPC_CHILD_DEVICE") ? atoi(getenv("IPC_CHILD_DEVICE")) : 0;
    CHECK(cudaSetDevice(dev));
    int *big, *small, *again;
    CHECK(cudaIpcOpenMemHandle((void **)&big, h.big, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void **)&small, h.small, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void **)&again, h.big, cudaIpcMemLazyEnablePeerAccess));
    printf("child: opened twice, same pointer: %d\n", again == big);
    cudaEvent_t ev;
    CHECK(cudaIpcOpenEventHandle(&ev, h.event));
    if (wait) {
        printf("child: waiting %d\n", (int)getpid());
        fflush(stdout);
        sleep(wait);
    }
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamWaitEvent(s, ev, 0));
    bump<<<N / 256, 256, 0, s>>>(big, N, 5);
    bump<<<1, SMALL, 0, s>>>(small, SMALL, 1);
    CHECK(cudaStreamSynchronize(s));
    static int host[N];
    CHECK(cudaMemcpy(host, big, sizeof host, cudaMemcpyDeviceToHost));
    printf("child: big %016llx\n", fold(host, N));
    CHECK(cudaMemcpy(host, small, SMALL * sizeof(int), cudaMemcpyDeviceToHost));
    printf("child: small %016llx\n", fold(host, SMALL));
    printf("child: cudaFree of opened memory: %s\n", cudaGetErrorName(cudaFree(big)));
    cudaGetLastError();

    cudaMemPool_t pool;
    CHECK(cudaMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)h.pool_fd,
                                               cudaMemHandleTypePosixFileDescriptor, 0));
    cudaMemAccessDesc rw = {{cudaMemLocationTypeDevice, dev}, cudaMemAccessFlagsProtReadWrite};
    CHECK(cudaMemPoolSetAccess(pool, &rw, 1));
    cudaMemPoolPtrExportData empty;
    memset(&empty, 0, sizeof empty);
    int *pooled;
    printf("child: import of empty export data: %s\n",
           cudaGetErrorName(cudaMemPoolImportPointer((void **)&pooled, pool, &empty)));
    cudaGetLastError();
    CHECK(cudaMemPoolImportPointer((void **)&pooled, pool, &h.pooled));
    bump<<<1, SMALL, 0, s>>>(pooled, SMALL, 9);
    CHECK(cudaMemcpyAsync(host, pooled, SMALL * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("child: pooled %016llx\n", fold(host, SMALL));
    CHECK(cudaFreeAsync(pooled, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolDestroy(pool));
    close(h.pool_fd);
    CHECK(cudaIpcCloseMemHandle(again));
    CHECK(cudaIpcCloseMemHandle(big));
    CHECK(cudaIpcCloseMemHandle(small));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "child")) return child(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 0);
    const char *pause_s = argc > 2 ? argv[2] : "3";
    int *big, *small;
    CHECK(cudaMalloc(&big, N * sizeof(int)));
    CHECK(cudaMalloc(&small, SMALL * sizeof(int)));  // (shares its chunk with other small allocations)
    fill<<<N / 256, 256>>>(big, N, 3);
    fill<<<1, SMALL>>>(small, SMALL, 7);
    handles h;
    CHECK(cudaIpcGetMemHandle(&h.big, big));
    CHECK(cudaIpcGetMemHandle(&h.small, small));
    cudaEvent_t ev, plain;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CHECK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    CHECK(cudaEventRecord(ev, 0));
    CHECK(cudaIpcGetEventHandle(&h.event, ev));
    void *own;
    printf("open own handle: %s\n", cudaGetErrorName(cudaIpcOpenMemHandle(&own, h.big, cudaIpcMemLazyEnablePeerAccess)));
    cudaIpcEventHandle_t bad;
    printf("handle of a plain event: %s\n", cudaGetErrorName(cudaIpcGetEventHandle(&bad, plain)));
    cudaGetLastError();
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    CHECK(cudaMemPoolCreate(&pool, &props));
    int *pooled;
    CHECK(cudaMallocFromPoolAsync((void **)&pooled, SMALL * sizeof(int), pool, 0));
    fill<<<1, SMALL>>>(pooled, SMALL, 11);
    CHECK(cudaMemPoolExportToShareableHandle(&h.pool_fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
    CHECK(cudaMemPoolExportPointer(&h.pooled, pooled));
    CHECK(cudaDeviceSynchronize());
    if (argc > 1 && !strcmp(argv[1], "wait")) {
        printf("exported\n");
        fflush(stdout);
        sleep(atoi(pause_s));
    }
    if (argc > 1 && !strcmp(argv[1], "other-device")) setenv("IPC_CHILD_DEVICE", "1", 1);
    int fds[2];
    if (pipe(fds)) return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[1]);
        fcntl(h.pool_fd, F_SETFD, 0);  // (the child inherits the pool's descriptor)
        char fd[16];
        snprintf(fd, sizeof fd, "%d", fds[0]);
        bool child_wait = argc > 1 && !strcmp(argv[1], "child-wait");
        execl("/proc/self/exe", argv[0], "child", fd, child_wait ? pause_s : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    if (write(fds[1], &h, sizeof h) != (ssize_t)sizeof h) return 2;
    close(fds[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child exited with %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    static int host[N];
    CHECK(cudaMemcpy(host, big, sizeof host, cudaMemcpyDeviceToHost));
    printf("parent: big %016llx\n", fold(host, N));
    CHECK(cudaMemcpy(host, small, SMALL * sizeof(int), cudaMemcpyDeviceToHost));
    printf("parent: small %016llx\n", fold(host, SMALL));
    CHECK(cudaMemcpy(host, pooled, SMALL * sizeof(int), cudaMemcpyDeviceToHost));
    printf("parent: pooled %016llx\n", fold(host, SMALL));
    close(h.pool_fd);
    CHECK(cudaFreeAsync(pooled, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemPoolDestroy(pool));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaEventDestroy(plain));
    CHECK(cudaFree(big));
    CHECK(cudaFree(small));
    printf("Test PASSED\n");
    return 0;
}
