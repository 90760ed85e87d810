/* A stand-in for libcufft.so.12 on the sim backend (see fake_cublas.c): 1D complex plans, a direct DFT. */
#include <math.h>
#include <stdlib.h>

#define MAXP 64
static struct plan {
    int used, nx, batch;
} plans[MAXP];

int cufftPlan1d(int *plan, int nx, int type, int batch)
{
    if (type != 0x29 || nx <= 0) /* CUFFT_C2C */
        return 3;
    for (int i = 1; i < MAXP; i++)
        if (!plans[i].used) {
            plans[i] = (struct plan){1, nx, batch};
            *plan = i + 100; /* (not the ids nvproxy hands out) */
            return 0;
        }
    return 2;
}
int cufftDestroy(int plan)
{
    if (plan < 101 || plan >= 100 + MAXP || !plans[plan - 100].used)
        return 1;
    plans[plan - 100].used = 0;
    return 0;
}
int cufftSetStream(int plan, void *s)
{
    (void)s;
    return plan > 100 ? 0 : 1;
}
int cufftExecC2C(int plan, float *in, float *out, int dir)
{
    if (plan < 101 || plan >= 100 + MAXP || !plans[plan - 100].used)
        return 1;
    struct plan *p = &plans[plan - 100];
    int n = p->nx;
    float *tmp = malloc(sizeof(float) * 2 * n);
    for (int b = 0; b < p->batch; b++) {
        float *x = in + 2 * n * b, *y = out + 2 * n * b;
        for (int k = 0; k < n; k++) {
            double re = 0, im = 0;
            for (int j = 0; j < n; j++) {
                double a = dir * 2 * M_PI * j * k / n;
                re += x[2 * j] * cos(a) - x[2 * j + 1] * sin(a);
                im += x[2 * j] * sin(a) + x[2 * j + 1] * cos(a);
            }
            tmp[2 * k] = (float)re;
            tmp[2 * k + 1] = (float)im;
        }
        for (int k = 0; k < 2 * n; k++)
            y[k] = tmp[k];
    }
    free(tmp);
    return 0;
}
int cufftGetVersion(int *v)
{
    *v = 12000;
    return 0;
}
