// Copies in a loop, for faults that strike in the middle of one: every round copies a pattern to the device,
// from there to a second buffer and back, and checks it; it also prints a checksum of what the second buffer kept
// from the round before, read back first (device memory that a restore must bring back): the same as that round's.
// argv[1]: "pageable" or "pinned" host memory; argv[2]: MiB per copy; argv[3]: rounds; argv[4] "gated": each round
// waits for a line on stdin (a quiet moment for the test, with nothing of the program's in flight), and the end of
// stdin ends the rounds.
#include "../../apps/check.h"
#include <cstring>

int main(int argc, char **argv) {
    bool pinned = argc > 1 && !strcmp(argv[1], "pinned");
    size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 16) << 20;
    int rounds = argc > 3 ? atoi(argv[3]) : 8;
    bool gated = argc > 4 && !strcmp(argv[4], "gated");
    unsigned *host, *back;
    if (pinned) {
        CHECK(cudaMallocHost(&host, bytes));
        CHECK(cudaMallocHost(&back, bytes));
    } else {
        host = (unsigned *)malloc(bytes);
        back = (unsigned *)malloc(bytes);
    }
    unsigned *d, *d2;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMalloc(&d2, bytes));
    size_t n = bytes / sizeof(unsigned);
    char line[16];
    for (int r = 0; r < rounds; r++) {
        if (gated && !fgets(line, sizeof line, stdin)) break;
        unsigned long long kept = 0;
        if (r > 0) {
            CHECK(cudaMemcpy(back, d2, bytes, cudaMemcpyDeviceToHost));
            kept = checksum(back + n - 1024, 4096);
        }
        for (size_t i = 0; i < n; i++) host[i] = (unsigned)(i * 2654435761u) ^ (unsigned)r;
        CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d2, d, bytes, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpy(back, d2, bytes, cudaMemcpyDeviceToHost));
        printf("round %d: kept %016llx, %s %016llx\n", r, kept, memcmp(host, back, bytes) ? "MISMATCH" : "ok",
               checksum(back + n - 1024, 4096));
        fflush(stdout);
    }
    printf("Test PASSED\n");
    return 0;
}
