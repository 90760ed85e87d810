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
/* pread len bytes of fd at off into dst, piece bytes at a time, and return their XXH64
 * (seed 0); *got: the bytes read (fewer: end of file or an error, and the result is 0). */
uint64_t nvp_pread_xxh64(int fd, void *dst, size_t len, int64_t off, size_t piece, size_t *got);
/* CDEF-END */
