/* A stand-in for libcurand.so.10 on the sim backend (see fake_cublas.c): a generator whose sequence is a
 * 64-bit LCG from its seed, skipping `offset` values, so that a restored generator's continuation can be
 * compared with an uninterrupted run's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct gen {
    int type;
    uint64_t seed, offset, state;
    int fresh;
};

static uint32_t next(struct gen *g)
{
    if (g->fresh) {
        g->state = g->seed * 6364136223846793005ull + 1442695040888963407ull;
        for (uint64_t i = 0; i < g->offset; i++)
            g->state = g->state * 6364136223846793005ull + 1442695040888963407ull;
        g->fresh = 0;
    }
    g->state = g->state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g->state >> 32);
}

int curandCreateGenerator(struct gen **g, int type)
{
    *g = calloc(1, sizeof **g);
    (*g)->type = type;
    (*g)->fresh = 1;
    return 0;
}
int curandCreateGeneratorHost(struct gen **g, int type) { return curandCreateGenerator(g, type); }
int curandDestroyGenerator(struct gen *g)
{
    free(g);
    return 0;
}
int curandSetPseudoRandomGeneratorSeed(struct gen *g, unsigned long long seed)
{
    g->seed = seed;
    g->fresh = 1;
    return 0;
}
int curandSetGeneratorOffset(struct gen *g, unsigned long long offset)
{
    g->offset = offset;
    g->fresh = 1;
    return 0;
}
int curandSetStream(struct gen *g, void *s)
{
    (void)g;
    (void)s;
    return 0;
}
int curandGenerate(struct gen *g, unsigned *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = next(g);
    return 0;
}
int curandGenerateUniform(struct gen *g, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (next(g) >> 8) * (1.0f / 16777216.0f);
    return 0;
}
int curandGetVersion(int *v)
{
    if (getenv("FAKE_SAY_VERSION")) /* (the proxy's stderr is the program's) */
        fprintf(stderr, "fake curandGetVersion called\n");
    *v = 10400;
    return 0;
}
