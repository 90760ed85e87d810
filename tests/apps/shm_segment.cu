// A program with a POSIX shared-memory segment of its own, made after its first
// CUDA call (as NVIDIA's simpleIPC makes the one its processes share): a DMTCP
// checkpoint must leave the segment mapped with its contents, on resume and
// after a restart.  (The shim's socket to the proxy once lent DMTCP its stale
// descriptor number, and DMTCP's resume failed to map the segment again.)
#include "check.h"
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    char name[64];  // (under DMTCP every run's first pid is 40000)
    snprintf(name, sizeof name, "/nvproxy-test-segment-%d-%ld", (int)getpid(), (long)clock());
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) return 2;
    char *seg = (char *)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (seg == MAP_FAILED) return 2;
    int *d, host[1024];
    CHECK(cudaMalloc(&d, sizeof host));
    for (int step = 0; step < 8; step++) {
        snprintf(seg, 64, "step %d", step);
        CHECK(cudaMemset(d, step, sizeof host));
        CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
        printf("%s: device %08x\n", seg, host[step * 100]);
    }
    CHECK(cudaFree(d));
    munmap(seg, 4096);
    close(fd);
    shm_unlink(name);
    printf("Test PASSED\n");
    return 0;
}
