/* Checksums of checkpoint image chunks: XXH64 (the public xxHash 64-bit
 * algorithm), in C so that chunks are summed at memory speed on many threads
 * (cffi releases the GIL) without a third-party package.
 *
 * Python reads the block between the CDEF markers with cffi. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
uint64_t nvp_xxh64(const void *data, size_t len, uint64_t seed);
/* CDEF-END */
