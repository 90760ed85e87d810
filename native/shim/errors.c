/* Per-thread last error, sticky errors and the error name/string tables,
 * answered in the application as the runtime does (no proxy round trip). */
#include "shim.h"

#include <stdatomic.h>

struct nvp_error_text {
    int code;
    const char *name, *text;
};
extern const struct nvp_error_text nvp_error_table[];
extern const int nvp_error_count;

static __thread cudaError_t last_error;
static _Atomic int sticky;

int nvp_is_sticky(cudaError_t e)
{
    switch ((int)e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
        return 1;
    default:
        return 0;
    }
}

void nvp_set_sticky(cudaError_t e)
{
    int zero = 0;
    atomic_compare_exchange_strong(&sticky, &zero, (int)e);
}

cudaError_t nvp_sticky_error(void) { return (cudaError_t)atomic_load(&sticky); }

cudaError_t nvp_ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

void nvp_note_async_error(cudaError_t e)
{
    if (nvp_is_sticky(e))
        nvp_set_sticky(e);
    last_error = e;
}

/* As the runtime: even a sticky error is reported once by cudaGetLastError;
 * it stays sticky because every later call fails with it again. */
NVP_EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

NVP_EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }

static const struct nvp_error_text *lookup(cudaError_t e)
{
    int lo = 0, hi = nvp_error_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (nvp_error_table[mid].code == (int)e)
            return &nvp_error_table[mid];
        if (nvp_error_table[mid].code < (int)e)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

NVP_EXPORT const char *cudaGetErrorName(cudaError_t e)
{
    const struct nvp_error_text *t = lookup(e);
    return t ? t->name : "unrecognized error code";
}

NVP_EXPORT const char *cudaGetErrorString(cudaError_t e)
{
    const struct nvp_error_text *t = lookup(e);
    return t ? t->text : "unrecognized error code";
}
