// What the driver-API test programs share: a CUresult's name, and CK, which ends the program on a failed call with
// one line naming it.  The includer has declared p_cuGetErrorName (the driver's, found through dlsym) before.
#pragma once
#include <cstdio>
#include <cstdlib>

static const char *cu_error_name(CUresult r) {
    const char *s = "?";
    if (p_cuGetErrorName) p_cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define CK(x)                                                                                                       \
    do {                                                                                                            \
        CUresult r_ = (x);                                                                                          \
        if (r_ != CUDA_SUCCESS) {                                                                                   \
            printf("FAILED %s:%d %s -> %s\n", __FILE__, __LINE__, #x, cu_error_name(r_));                           \
            exit(1);                                                                                                \
        }                                                                                                           \
    } while (0)
