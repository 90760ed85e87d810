// Managed memory used as programs use it, where nvproxy migrates it between the host and the device: the CPU
// and kernels taking turns on the same data, system calls reading and writing it right after kernels did, a host
// function reading what its stream's kernel wrote, threads each working on their own allocation while the others
// launch, odd sizes, and copies and memsets on it.
// argv[1] = steps (a long run for checkpoint tests), argv[2] = "gate": wait for a line on stdin after each step;
// argv[1] = "oversubscribe": one allocation of 96 MiB alone (more than a small modelled device has).
#include "check.h"
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

__global__ void bump(unsigned *p, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 3u + k + (unsigned)i;
}

__global__ void total(const unsigned *p, int n, unsigned long long *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out, (unsigned long long)p[i]);
}

static unsigned long long fold(const unsigned *p, int n) {
    unsigned long long s = 0;
    for (int i = 0; i < n; i++) s = s * 1000003ull + p[i];
    return s;
}

static int blocks(int n) { return (n + 255) / 256; }

static void CUDART_CB seen(void *arg) {  // a host function: its stream's kernel finished before it runs
    const unsigned *p = (const unsigned *)arg;
    printf("host function sees %u %u\n", p[0], p[1000]);
}

struct worker {
    int id, rounds;
    unsigned long long result;
};

static void *work(void *arg) {  // its own allocation and stream, while the other threads launch and touch theirs
    worker *w = (worker *)arg;
    const int n = (3 << 20) / 4 + 1000 * w->id;  // (a chunk and a half, more or less: odd sizes)
    unsigned *m;
    cudaStream_t s;
    CHECK(cudaMallocManaged(&m, n * sizeof(unsigned)));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < n; i++) m[i] = (unsigned)(i ^ w->id);
    for (int r = 0; r < w->rounds; r++) {
        bump<<<blocks(n), 256, 0, s>>>(m, n, (unsigned)r);
        CHECK(cudaStreamSynchronize(s));
        m[(r * 7919) % n] += 1u;  // the host changes one element between launches
    }
    w->result = fold(m, n);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(m));
    return nullptr;
}

static int oversubscribe() {  // native managed memory may exceed the device's: it stays in host memory then
    const int n = 24 << 20;
    unsigned *m;
    CHECK(cudaMallocManaged(&m, n * sizeof(unsigned)));
    for (int i = 0; i < n; i++) m[i] = (unsigned)i;
    bump<<<blocks(n), 256>>>(m, n, 9);
    CHECK(cudaDeviceSynchronize());
    printf("96 MiB: %016llx\n", fold(m, n));
    CHECK(cudaFree(m));
    printf("Test PASSED\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "oversubscribe")) return oversubscribe();
    int steps = argc > 1 ? atoi(argv[1]) : 0;
    bool gated = argc > 2 && !strcmp(argv[2], "gate");
    const int n = 2 << 20;  // 8 MiB: several chunks
    unsigned *m;
    CHECK(cudaMallocManaged(&m, n * sizeof(unsigned)));
    for (int i = 0; i < n; i++) m[i] = (unsigned)i * 2654435761u;
    bump<<<blocks(n), 256>>>(m, n, 1);
    CHECK(cudaDeviceSynchronize());
    printf("kernel then CPU: %016llx\n", fold(m, n));

    // system calls on it right after a kernel wrote it: write(2) reads it, read(2) writes it
    bump<<<blocks(n), 256>>>(m, n, 2);
    CHECK(cudaDeviceSynchronize());
    char path[] = "/tmp/nvp-managed-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 1; }
    unlink(path);
    const size_t span = 3u << 20;  // (across a chunk's end)
    ssize_t wrote = write(fd, m + (1 << 18), span);
    printf("write(2) from managed memory: %zd\n", wrote);
    unsigned *copy = (unsigned *)malloc(span);
    if (pread(fd, copy, span, 0) != (ssize_t)span) { perror("pread"); return 1; }
    printf("written bytes match: %d\n", memcmp(copy, m + (1 << 18), span) == 0);
    bump<<<blocks(n), 256>>>(m, n, 3);  // the kernel has the chunks; read(2) brings them back and writes them
    CHECK(cudaDeviceSynchronize());
    ssize_t got = pread(fd, m + (1 << 19), span, 0);
    printf("read(2) into managed memory: %zd\n", got);
    unsigned long long *sum;
    CHECK(cudaMallocManaged(&sum, sizeof *sum));
    *sum = 0;
    total<<<blocks(n), 256>>>(m, n, sum);
    CHECK(cudaDeviceSynchronize());
    printf("kernel sum after read(2): %llu, CPU fold %016llx\n", *sum, fold(m, n));
    close(fd);
    free(copy);

    // a host function reads what the kernel before it in its stream wrote
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    bump<<<blocks(n), 256, 0, s>>>(m, n, 4);
    CHECK(cudaLaunchHostFunc(s, seen, m));
    CHECK(cudaStreamSynchronize(s));

    // copies and memsets reach it on the device side; the CPU sees their results
    unsigned *d, *pageable = (unsigned *)malloc(n * sizeof(unsigned));
    CHECK(cudaMalloc(&d, n * sizeof(unsigned)));
    CHECK(cudaMemcpy(d, m, n * sizeof(unsigned), cudaMemcpyDefault));
    CHECK(cudaMemset(m + 100, 0xff, 4096));
    CHECK(cudaDeviceSynchronize());
    printf("memset seen by the CPU: %08x %08x\n", m[100], m[100 + 1024]);
    CHECK(cudaMemcpy(pageable, m, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    printf("copied out equals the CPU's view: %d\n", memcmp(pageable, m, n * sizeof(unsigned)) == 0);
    for (int i = 0; i < n; i++) pageable[i] = (unsigned)i;
    CHECK(cudaMemcpy(m, pageable, n * sizeof(unsigned), cudaMemcpyHostToDevice));
    printf("copied in, read by the CPU: %u %u\n", m[7], m[n - 1]);
    CHECK(cudaMemcpy(m, d, n * sizeof(unsigned), cudaMemcpyDeviceToDevice));
    CHECK(cudaMemPrefetchAsync(m, n * sizeof(unsigned), cudaMemLocation{cudaMemLocationTypeDevice, 0}, 0, s));
    bump<<<blocks(n), 256, 0, s>>>(m, n, 5);
    CHECK(cudaStreamSynchronize(s));
    printf("after prefetch and kernel: %016llx\n", fold(m, n));

    // small and odd allocations
    char *tiny;
    CHECK(cudaMallocManaged(&tiny, 100));
    memset(tiny, 'a', 100);
    CHECK(cudaMemset(tiny + 50, 'b', 10));
    CHECK(cudaDeviceSynchronize());
    printf("tiny: %.100s\n", tiny);
    CHECK(cudaFree(tiny));

    // threads, each with its own allocation, at once
    worker w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = {i, 6, 0};
        pthread_create(&t[i], nullptr, work, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], nullptr);
        printf("thread %d: %016llx\n", i, w[i].result);
    }
    fflush(stdout);

    char line[64];
    for (int step = 0; step < steps; step++) {  // a long run: the state must survive checkpoints
        bump<<<blocks(n), 256, 0, s>>>(m, n, (unsigned)step);
        CHECK(cudaStreamSynchronize(s));
        m[step * 4099 % n] ^= 0x5a5a5a5au;
        printf("step %d: %016llx\n", step, fold(m, n));
        fflush(stdout);
        if (gated && !fgets(line, sizeof line, stdin)) gated = false;
        else if (!gated) usleep(100000);
    }
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(sum));
    CHECK(cudaFree(d));
    CHECK(cudaFree(m));
    free(pageable);
    printf("Test PASSED\n");
    return 0;
}
