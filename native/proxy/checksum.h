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

/* XXH64 (seed 0) of data that arrives by pread in parts (fileload.c): every part but the last a multiple of
 * 32 bytes long. */
struct nvp_xxh64_state {
    uint64_t v[4];
    uint64_t len;
};
void nvp_xxh64_start(struct nvp_xxh64_state *s);
/* n bytes of fd at off into dst, through EINTR and short reads; the bytes read (fewer: the end of the file with
 * *err 0, or an error in *err) */
size_t nvp_pread_all(int fd, void *dst, size_t n, int64_t off, int *err);
/* pread len bytes of fd at off into dst, piece bytes at a time, each piece summed while it is still in the
 * cache; returns the bytes read (fewer: the end of the file, *err 0, or an error, *err its errno) */
size_t nvp_pread_xxh64_part(struct nvp_xxh64_state *s, int fd, void *dst, size_t len, int64_t off, size_t piece,
                            int *err);
/* the sum, the last part being the n bytes at last (still where they were read to) */
uint64_t nvp_xxh64_end(const struct nvp_xxh64_state *s, const void *last, size_t n);
