// The test programs' check of a call's status (CUDA's or a library's, 0 on success): any other ends the program,
// naming the call and the status.
#include <cstdio>

#define CHECK(x)                                                                                                 \
    do {                                                                                                         \
        int s_ = (int)(x);                                                                                       \
        if (s_) {                                                                                                \
            printf("%s failed: %d\n", #x, s_);                                                                   \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)
