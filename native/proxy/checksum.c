/* XXH64, written from the algorithm's public specification
 * (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md). */
#include "checksum.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                      P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only (x86-64) */
    return v;
}

static inline uint32_t read32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t round64(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static inline uint64_t merge(uint64_t acc, uint64_t v)
{
    acc ^= round64(0, v);
    return acc * P1 + P4;
}

/* the four lanes over whole 32-byte stripes of [p, p + n): they run at several bytes per cycle */
static const unsigned char *stripes(uint64_t v[4], const unsigned char *p, size_t n)
{
    for (const unsigned char *end = p + n / 32 * 32; p < end; p += 32) {
        v[0] = round64(v[0], read64(p));
        v[1] = round64(v[1], read64(p + 8));
        v[2] = round64(v[2], read64(p + 16));
        v[3] = round64(v[3], read64(p + 24));
    }
    return p;
}

/* the hash of len bytes whose stripes went into v, p..end being the rest (< 32 bytes) */
static uint64_t finish(const uint64_t v[4], uint64_t seed, size_t len, const unsigned char *p,
                       const unsigned char *end)
{
    uint64_t h;
    if (len >= 32) {
        h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        h = merge(h, v[0]);
        h = merge(h, v[1]);
        h = merge(h, v[2]);
        h = merge(h, v[3]);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)len;
    for (; p + 8 <= end; p += 8) {
        h ^= round64(0, read64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

EXPORT uint64_t nvp_xxh64(const void *data, size_t len, uint64_t seed)
{
    uint64_t v[4] = {seed + P1 + P2, seed + P2, seed, seed - P1};
    const unsigned char *p = stripes(v, data, len);
    return finish(v, seed, len, p, (const unsigned char *)data + len);
}

void nvp_xxh64_start(struct nvp_xxh64_state *s)
{
    *s = (struct nvp_xxh64_state){{P1 + P2, P2, 0, -P1}, 0};
}

size_t nvp_pread_all(int fd, void *dst, size_t n, int64_t off, int *err)
{
    size_t have = 0;
    *err = 0;
    while (have < n) {
        ssize_t got = pread(fd, (char *)dst + have, n - have, (off_t)(off + (int64_t)have));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            *err = got < 0 ? errno : 0;
            break;
        }
        have += (size_t)got;
    }
    return have;
}

size_t nvp_pread_xxh64_part(struct nvp_xxh64_state *s, int fd, void *dst, size_t len, int64_t off, size_t piece,
                            int *err)
{
    *err = 0;
    /* Each piece is summed right after it was read, while it is still in the cache: a
     * separate pass over the whole part would read it from memory once more. */
    unsigned char *p = dst;
    piece = piece < 32 ? 32 : piece / 32 * 32;
    size_t done = 0;
    while (done < len) {
        size_t want = len - done < piece ? len - done : piece;
        size_t have = nvp_pread_all(fd, p + done, want, off + (int64_t)done, err);
        if (have < want)
            return done + have;
        stripes(s->v, p + done, want); /* (only the last piece of the last part may leave a tail: finished later) */
        done += want;
    }
    s->len += len;
    return len;
}

uint64_t nvp_xxh64_end(const struct nvp_xxh64_state *s, const void *last, size_t n)
{
    const unsigned char *end = (const unsigned char *)last + n;
    return finish(s->v, 0, s->len, end - n % 32, end);
}
