/* memcpy with SSE2 streaming (non-temporal) stores, which leave nothing in the CPU's caches: for memory a DMA
 * reads next (parcopy.c says why).  A header of its own so that benchmarks/probes measure this very loop. */
#ifndef NVP_STREAM_COPY_H
#define NVP_STREAM_COPY_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static inline void nvp_stream_copy(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    head = head < n ? head : n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence(); /* (streaming stores are weakly ordered: all of them land before the DMA is asked for) */
    memcpy(d + body, s + body, n - body);
#else
    memcpy(dst, src, n);
#endif
}
#endif
