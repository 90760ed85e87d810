// Library answers that never change in a process (versions, status names): asked many times, from two threads,
// each comes from the library once (asked first on one thread); a name returned twice is the same string.
#include <cstdio>
#include <cstring>
#include <thread>

extern "C" {
int curandGetVersion(int *);
const char *cublasGetStatusName(int);
}

int main()
{
    int v[2] = {0, 0}, first = 0;
    int bad = curandGetVersion(&first) != 0;
    auto ask = [&](int t) {
        for (int i = 0; i < 200; i++) {
            int got = 0;
            bad += curandGetVersion(&got) != 0;
            v[t] = got;
        }
    };
    std::thread a(ask, 0), b(ask, 1);
    a.join();
    b.join();
    const char *ok1 = cublasGetStatusName(0), *ok2 = cublasGetStatusName(0), *other = cublasGetStatusName(1);
    printf("versions %d %d %d, failures %d\n", first, v[0], v[1], bad);
    printf("%s (same string: %d), %s\n", ok1, ok1 == ok2, other);
    return 0;
}
