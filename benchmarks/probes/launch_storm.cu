// Launches of an empty kernel from T threads at once, each on a non-blocking stream of its own, per launch (the
// whole run, thread start to the last stream's end, over T * N launches): the microbenchmark's launch_storm rows,
// with the thread count and the launches per thread as arguments, for a run natively and under `nvproxy run`.
// On the GPU machine: nvcc -cudart shared -o launch_storm launch_storm.cu && ./launch_storm 16 20000
#include "probe_rt.h"
#include <thread>
#include <vector>

__global__ void empty() {}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4, per = argc > 2 ? atoi(argv[2]) : 20000;
    CK(cudaFree(0));
    std::vector<std::thread> pool;
    double t0 = now_us();
    for (int i = 0; i < threads; i++)
        pool.emplace_back([per] {
            cudaStream_t s;
            CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            for (int k = 0; k < per; k++)
                empty<<<1, 1, 0, s>>>();
            CK(cudaStreamSynchronize(s));
            CK(cudaStreamDestroy(s));
        });
    for (auto &t : pool)
        t.join();
    printf("T=%d %.2f us/launch\n", threads, (now_us() - t0) / ((double)per * threads));
    return 0;
}
