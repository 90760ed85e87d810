// A child forked after its parent allocated pinned memory allocates, writes and frees pinned blocks of its own
// while the parent does the same: neither may see the other's writes (under nvproxy the child has a proxy and pinned
// blocks of its own; the runtime itself supports no CUDA in such a child, so this runs under nvproxy only).
#include "check.h"
#include <sys/wait.h>
#include <unistd.h>

static int fill_and_check(int *p, int n, int value, int rounds) {
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n; i++) p[i] = value + r;
        usleep(2000);  // (the other process writes its own meanwhile)
        for (int i = 0; i < n; i++) bad += p[i] != value + r;
    }
    return bad;
}

int main() {
    const int n = 1024;
    int *before;
    CHECK(cudaMallocHost(&before, n * sizeof(int)));
    for (int i = 0; i < n; i++) before[i] = 7;
    fflush(stdout);
    pid_t pid = fork();
    int *mine, *second;
    CHECK(cudaMallocHost(&mine, n * sizeof(int)));
    CHECK(cudaMallocHost(&second, n * sizeof(int)));
    int bad = fill_and_check(mine, n, pid ? 1000 : 2000, 20) + fill_and_check(second, n, pid ? 3000 : 4000, 20);
    int *dev;
    CHECK(cudaMalloc(&dev, n * sizeof(int)));
    CHECK(cudaMemcpy(dev, mine, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(second, dev, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) bad += second[i] != mine[i];
    CHECK(cudaFreeHost(mine));
    CHECK(cudaFreeHost(second));
    CHECK(cudaFree(dev));
    if (pid == 0) {
        printf("child: its own blocks kept their contents: %d\n", bad == 0);
        fflush(stdout);
        _exit(bad != 0);
    }
    int status;
    waitpid(pid, &status, 0);
    for (int i = 0; i < n; i++) bad += before[i] != 7;
    printf("parent: its blocks kept their contents: %d, child exit status %d\n", bad == 0,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(cudaFreeHost(before));
    printf("Test PASSED\n");
    return 0;
}
