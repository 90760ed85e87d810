// __managed__ variables: the program reads and writes them directly (also before any
// other CUDA call), kernels change them, and each sees the other's writes at the points
// CUDA defines (a launch; a synchronisation).  argv[1] = extra runs, each followed by a
// pause (checkpoint tests).
#include "check.h"
#include <unistd.h>

__managed__ int counter = 5;
__managed__ float table[4] = {1.0f, 2.0f, 3.0f, 4.0f};

__global__ void bump(int k) {
    counter += k;
    for (int i = 0; i < 4; i++) table[i] = table[i] * 2 + k;
}

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0;
    printf("initial: counter %d, table %g %g %g %g\n", counter, table[0], table[1], table[2], table[3]);
    counter = 10;
    for (int r = 0; r < 4 + long_run; r++) {
        bump<<<1, 1>>>(r + 1);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        printf("run %d: counter %d, table %g %g %g %g\n", r, counter, table[0], table[1], table[2], table[3]);
        fflush(stdout);
        table[0] = (float)r;  // (seen by the next launch)
        if (long_run) usleep(150000);
    }
    int *p;
    CHECK(cudaGetSymbolAddress((void **)&p, counter));
    printf("symbol address is the managed copy: %d\n", p == &counter);
    int v = 100, back = 0;
    CHECK(cudaMemcpyToSymbol(counter, &v, sizeof v));
    bump<<<1, 1>>>(1);
    CHECK(cudaMemcpyFromSymbol(&back, counter, sizeof back));
    printf("after cudaMemcpyToSymbol and a launch: %d (read directly: %d)\n", back, counter);
    printf("Test PASSED\n");
    return 0;
}
