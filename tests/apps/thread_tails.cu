// Threads that end with calls still to run. Each launches on a stream of its own, a different number of times,
// destroys the stream with its work still queued and ends without waiting, while the other threads go on
// launching; the main thread waits for the device between rounds. Under nvproxy a thread's last calls are posted
// and may still wait for other threads' earlier calls when its channel closes: the proxy must run them after the
// thread has gone, in the thread's order. Each launch folds its number into the thread's value, so the values show
// whether every launch ran, once, in order.
#include "check.h"
#include <pthread.h>

__global__ void fold(unsigned *v, int id, unsigned k) { v[id] = v[id] * 31u + k; }

static const int THREADS = 8, ROUNDS = 2;
static unsigned *values;

static int launches(int id) { return 500 + 400 * id; }

static void *worker(void *arg) {
    int id = (int)(long)arg;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int k = 0; k < launches(id); k++)
        fold<<<1, 1, 0, s>>>(values, id, (unsigned)k);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamDestroy(s));
    return NULL;
}

int main() {
    CHECK(cudaMalloc(&values, THREADS * sizeof(unsigned)));
    CHECK(cudaMemset(values, 0, THREADS * sizeof(unsigned)));
    for (int r = 0; r < ROUNDS; r++) {
        pthread_t t[THREADS];
        for (long i = 0; i < THREADS; i++)
            pthread_create(&t[i], NULL, worker, (void *)i);
        for (int i = 0; i < THREADS; i++)
            pthread_join(t[i], NULL);
        CHECK(cudaDeviceSynchronize()); /* (the next round's launches on new streams would race the last ones) */
    }
    CHECK(cudaDeviceSynchronize());
    unsigned got[THREADS];
    CHECK(cudaMemcpy(got, values, sizeof got, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        unsigned want = 0;
        for (int r = 0; r < ROUNDS; r++)
            for (int k = 0; k < launches(i); k++)
                want = want * 31u + (unsigned)k;
        printf("thread %d: %d launches, value %u (%s)\n", i, ROUNDS * launches(i), got[i],
               got[i] == want ? "right" : "WRONG");
        bad += got[i] != want;
    }
    printf("%s\n", bad ? "FAILED" : "PASSED: every launch ran, in order");
    CHECK(cudaFree(values));
    return bad;
}
