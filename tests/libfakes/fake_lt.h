/* The stand-ins' cuBLASLt context: fake_cublasLt.c's handle, and the start of fake_cublas.c's, as a cuBLAS handle
 * holds a cuBLASLt handle (a cublasHandle_t cast to a cublasLtHandle_t is one).  The stand-in cuBLASLt answers
 * CUBLAS_STATUS_NOT_INITIALIZED for a handle without the mark: one the proxy did not translate to a real one. */
#ifndef FAKE_LT_H
#define FAKE_LT_H

#define FAKE_LT_MARK 0x4c74636fu

struct fake_lt {
    unsigned mark;
};

#endif
