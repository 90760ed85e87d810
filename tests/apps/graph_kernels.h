// Shared by the graph test programs (graphs.cu, graph_nodes.cu): their kernels
// (graphs_sim.py has them for the sim backend), a host function that counts its
// calls, and an order-dependent fold of a buffer.
#pragma once
#include "check.h"

__global__ void scale(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * k + 1;
}
__global__ void add(int *dst, const int *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

static int host_calls = 0;
static void CUDART_CB count_call(void *arg) { (*(int *)arg)++; }

static unsigned long long fold(const int *p, int n) {
    unsigned long long s = 0;
    for (int i = 0; i < n; i++) s = s * 31 + (unsigned)p[i];
    return s;
}
