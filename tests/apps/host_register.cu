// cudaHostRegister of the program's own memory at sizes that take each way into memory shared with the proxy (a
// page; a little over a MiB from an offset inside a page; 20 MiB and 64 MiB, copied on several threads where there
// are cores; 64 MiB on a 2 MiB boundary): each buffer keeps its contents and its neighbours', a kernel reads and
// writes it through its device pointer, copies go both ways, and after cudaHostUnregister it is still the program's
// memory, unchanged.  Then one buffer registered again and again, a thread reading a buffer while it is registered,
// ranges that cannot be registered (with a hole, without access, overlapping a registered one) failing and left as
// they were, and cudaMallocHost beyond the sizes its pool serves.
// argv[1]: steps of a long run with a registered buffer alive (checkpoint tests; default 0), argv[2]: ms between
// steps, or -1: after each step wait for a line on standard input (at its end of file, wait no more); argv[3]
// "forbid-process-vm-writev": first a seccomp filter makes process_vm_writev fail with EPERM, as some sandboxes do;
// "unregister-unsynced": only a buffer unregistered while the kernel that writes it may still run (the call then
// waits for the devices), then read.
#include "check.h"
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

__global__ void add_one(unsigned *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] += 1;
}

static const size_t MIB = 1 << 20, HUGE = 2 * MIB;

static unsigned word(unsigned tag, size_t i) { return tag * 2654435761u + (unsigned)i; }

static void fill(unsigned *p, size_t n, unsigned tag) {
    for (size_t i = 0; i < n; i++) p[i] = word(tag, i);
}

static bool holds(const unsigned *p, size_t n, unsigned tag, unsigned plus = 0) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != word(tag, i) + plus) return false;
    return true;
}

static bool all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return false;
    return true;
}

// anonymous memory with room for `bytes` at `offset` past a 2 MiB boundary, and a page either side
struct Region { unsigned char *map; size_t len; unsigned *p; };

static Region region(size_t bytes, size_t offset) {
    Region r;
    r.len = bytes + offset + 2 * HUGE;
    r.map = (unsigned char *)mmap(nullptr, r.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r.map == MAP_FAILED) { printf("FAILED mmap\n"); exit(1); }
    memset(r.map, 0xab, r.len);
    r.p = (unsigned *)(((uintptr_t)r.map + 4096 + HUGE - 1) / HUGE * HUGE + offset);
    return r;
}

// the bytes of the region outside [p, p+bytes): untouched
static bool neighbours_kept(const Region &r, size_t bytes) {
    size_t before = (unsigned char *)r.p - r.map, after = r.len - before - bytes;
    return all(r.map, before, 0xab) && all((unsigned char *)r.p + bytes, after, 0xab);
}

static void one_size(const char *what, size_t bytes, size_t offset, unsigned *dev, unsigned *back, unsigned tag) {
    Region r = region(bytes, offset);
    size_t n = bytes / 4;
    fill(r.p, n, tag);
    CHECK(cudaHostRegister(r.p, bytes, cudaHostRegisterDefault));
    bool kept = holds(r.p, n, tag) && neighbours_kept(r, bytes);
    unsigned *dp;
    CHECK(cudaHostGetDevicePointer((void **)&dp, r.p, 0));
    add_one<<<128, 256>>>(dp, n);
    CHECK(cudaDeviceSynchronize());
    bool kernel = holds(r.p, n, tag, 1) && neighbours_kept(r, bytes);
    fill(r.p, n, tag + 1);
    CHECK(cudaMemcpy(dev, r.p, bytes, cudaMemcpyHostToDevice));
    memset(back, 0, bytes);
    CHECK(cudaMemcpy(back, dev, bytes, cudaMemcpyDeviceToHost));
    bool there = holds(back, n, tag + 1);
    CHECK(cudaMemcpy(r.p, dev, bytes / 2, cudaMemcpyDeviceToHost));  // (into registered memory)
    bool into = holds(r.p, n, tag + 1);
    CHECK(cudaHostUnregister(r.p));
    bool after = holds(r.p, n, tag + 1) && neighbours_kept(r, bytes);
    fill(r.p, n, tag + 2);
    after = after && holds(r.p, n, tag + 2);
    printf("%s: contents and neighbours kept %d, the kernel's writes seen %d, copied to the device %d and back %d, "
           "the program's memory after cudaHostUnregister %d\n", what, kept, kernel, there, into, after);
    munmap(r.map, r.len);
}

static void again_and_again(size_t bytes, unsigned tag) {
    Region r = region(bytes, 4096);
    size_t n = bytes / 4;
    int good = 0;
    for (int i = 0; i < 6; i++, tag++) {
        fill(r.p, n, tag);
        CHECK(cudaHostRegister(r.p, bytes, cudaHostRegisterDefault));
        unsigned *dp;
        CHECK(cudaHostGetDevicePointer((void **)&dp, r.p, 0));
        add_one<<<128, 256>>>(dp, n);
        CHECK(cudaDeviceSynchronize());
        good += holds(r.p, n, tag, 1);
        CHECK(cudaHostUnregister(r.p));
        good += holds(r.p, n, tag, 1);
    }
    printf("%zu MiB registered and unregistered 6 times: %d of 12 checks good, neighbours kept %d\n", bytes / MIB,
           good, neighbours_kept(r, bytes));
    munmap(r.map, r.len);
}

struct Reader { const unsigned *p; size_t n; unsigned tag; std::atomic<bool> stop; std::atomic<long> passes; long wrong; };

static void *read_on(void *arg) {
    Reader *r = (Reader *)arg;
    while (!r->stop.load()) {
        for (size_t i = 0; i < r->n; i += 1024)
            if (r->p[i] != word(r->tag, i)) r->wrong++;
        r->passes++;
    }
    return nullptr;
}

static void read_while_registering(size_t bytes, unsigned tag) {
    Region r = region(bytes, 4096);
    size_t n = bytes / 4;
    fill(r.p, n, tag);
    Reader rd{r.p, n, tag, {false}, {0}, 0};
    pthread_t t;
    pthread_create(&t, nullptr, read_on, &rd);
    while (rd.passes.load() < 1) usleep(100);  // (reading before the call)
    CHECK(cudaHostRegister(r.p, bytes, cudaHostRegisterDefault));
    rd.stop = true;
    pthread_join(t, nullptr);
    printf("a thread reading %zu MiB while it was registered: %ld wrong values\n", bytes / MIB, rd.wrong);
    CHECK(cudaHostUnregister(r.p));
    munmap(r.map, r.len);
}

static void cannot(const char *what, unsigned char *p, size_t bytes, unsigned char *kept_from, size_t kept) {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    cudaGetLastError();
    struct cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, p));
    printf("%s: cudaHostRegister %s, still unregistered %d, the readable part kept %d\n", what,
           e == cudaSuccess ? "succeeded" : "failed", a.type == cudaMemoryTypeUnregistered,
           kept_from ? all(kept_from, kept, 0xab) : 1);
}

static void bad_ranges() {
    for (size_t bytes : {3 * 4096ul, 24 * MIB}) {
        Region r = region(bytes, 0);
        unsigned char *p = (unsigned char *)r.p;
        munmap(p + bytes - 4096, 4096);  // (its last page)
        char what[64];
        snprintf(what, sizeof what, "%zu KiB with a hole", bytes >> 10);
        cannot(what, p, bytes, p, bytes - 4096);
        munmap(r.map, r.len);
    }
    void *none = mmap(nullptr, 20 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cannot("20 MiB without access", (unsigned char *)none, 20 * MIB, nullptr, 0);
    munmap(none, 20 * MIB);
}

// ranges that overlap a registered one fail (the same, one that begins before it, one that holds it); one beside it
// is registered
static void overlapping() {
    Region r = region(4 * MIB, 4096);
    unsigned char *p = (unsigned char *)r.p;
    CHECK(cudaHostRegister(p + MIB, MIB, cudaHostRegisterDefault));
    const struct { const char *what; size_t from, bytes; } tries[] = {
        {"the same range", MIB, MIB},      {"a range ending inside it", 0, MIB + MIB / 2},
        {"a range holding it", 0, 4 * MIB}, {"its last page", 2 * MIB - 4096, 4096},
        {"the range before it", 0, MIB}};
    for (const auto &t : tries) {
        cudaError_t e = cudaHostRegister(p + t.from, t.bytes, cudaHostRegisterDefault);
        cudaGetLastError();
        printf("registering %s: %s\n", t.what, cudaGetErrorName(e));
        if (e == cudaSuccess) CHECK(cudaHostUnregister(p + t.from));
    }
    CHECK(cudaHostUnregister(p + MIB));
    printf("after: neighbours kept %d\n", neighbours_kept(r, 4 * MIB));
    munmap(r.map, r.len);
}

static void large_pinned(unsigned tag) {
    int good = 0;
    for (size_t bytes : {48 * MIB, 40 * MIB + 4096, 48 * MIB}) {
        unsigned *p;
        CHECK(cudaMallocHost(&p, bytes));
        size_t n = bytes / 4;
        fill(p, n, tag);
        add_one<<<128, 256>>>(p, n);
        CHECK(cudaDeviceSynchronize());
        good += holds(p, n, tag, 1);
        CHECK(cudaFreeHost(p));
    }
    printf("cudaMallocHost beyond the pool: %d of 3 written by the host and the kernel\n", good);
}

static void forbid_process_vm_writev() {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof *f), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        printf("FAILED seccomp: %s\n", strerror(errno));
        exit(1);
    }
}

static void unregister_unsynced(unsigned tag) {
    Region r = region(MIB, 4096);
    size_t n = MIB / 4;
    fill(r.p, n, tag);
    CHECK(cudaHostRegister(r.p, MIB, cudaHostRegisterDefault));
    unsigned *dp;
    CHECK(cudaHostGetDevicePointer((void **)&dp, r.p, 0));
    add_one<<<128, 256>>>(dp, n);
    CHECK(cudaHostUnregister(r.p));
    printf("unregistered while its kernel may run: the kernel's writes seen %d\n", holds(r.p, n, tag, 1));
    munmap(r.map, r.len);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 0, pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    if (argc > 3 && !strcmp(argv[3], "forbid-process-vm-writev")) forbid_process_vm_writev();
    if (argc > 3 && !strcmp(argv[3], "unregister-unsynced")) {
        unregister_unsynced(100);
        return 0;
    }
    const size_t MAXB = 64 * MIB;
    unsigned *dev, *back = (unsigned *)malloc(MAXB);
    CHECK(cudaMalloc(&dev, MAXB));
    one_size("a page", 4096, 0, dev, back, 10);
    one_size("1 MiB + 12 KiB from an offset of 100 bytes", MIB + 12288, 100, dev, back, 20);
    one_size("20 MiB", 20 * MIB, 4096, dev, back, 30);
    one_size("64 MiB", 64 * MIB, 4096, dev, back, 40);
    one_size("64 MiB on a 2 MiB boundary", 64 * MIB, 0, dev, back, 50);
    again_and_again(20 * MIB, 60);
    read_while_registering(64 * MIB, 70);
    bad_ranges();
    overlapping();
    large_pinned(80);

    // a long run: a registered buffer alive, changed and read by a kernel at every step
    if (steps > 0) {
        Region r = region(24 * MIB, 4096);
        size_t n = 24 * MIB / 4;
        fill(r.p, n, 90);
        CHECK(cudaHostRegister(r.p, 24 * MIB, cudaHostRegisterDefault));
        unsigned *dp;
        CHECK(cudaHostGetDevicePointer((void **)&dp, r.p, 0));
        bool gated = pause_ms < 0;
        char line[64];
        for (int step = 0; step < steps; step++) {
            add_one<<<128, 256>>>(dp, n);
            CHECK(cudaDeviceSynchronize());
            bool ok = holds(r.p, n, 90, step + 1);
            CHECK(cudaMemcpy(dev, r.p, 24 * MIB, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(back, dev, 24 * MIB, cudaMemcpyDeviceToHost));
            printf("step %d: the registered buffer holds what the kernels wrote %d, copied %d\n", step, ok,
                   holds(back, n, 90, step + 1));
            fflush(stdout);
            if (pause_ms >= 0) usleep(pause_ms * 1000);
            else if (gated && !fgets(line, sizeof line, stdin)) gated = false;
        }
        CHECK(cudaHostUnregister(r.p));
        printf("after the steps, unregistered: kept %d, neighbours kept %d\n", holds(r.p, n, 90, steps),
               neighbours_kept(r, 24 * MIB));
        munmap(r.map, r.len);
    }
    CHECK(cudaFree(dev));
    free(back);
    printf("Test PASSED\n");
    return 0;
}
