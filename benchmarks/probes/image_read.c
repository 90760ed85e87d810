/* How fast can threads read an image file in tmpfs into bounce slots and sum it?  The restore's readers
 * (native/proxy/fileload.c) pread a 64 MiB chunk a 4 MiB slot at a time, summing each 256 KiB piece while it is
 * in the cache.  Compared: pread alone, pread + sum (the loader), and the file mapped and copied out with memcpy
 * or with streaming stores, summed from the source.  No GPU: what the host side of a restore can reach.
 *   cc -O2 -pthread -I../../native/proxy -I../../native/shim -o image_read image_read.c ../../native/proxy/checksum.c
 *   ./image_read [MiB] [dir] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "checksum.h"
#include "probe_clock.h"
#include "stream_copy.h"

#define CHUNK (64u << 20)
#define SLOT (4u << 20)
#define PIECE (256u << 10)

enum { PREAD, PREAD_SUM, MAP_COPY_SUM, MAP_STREAM_SUM, MODES };
static const char *names[MODES] = {"pread", "pread + sum (the loader)", "map, memcpy, sum", "map, streaming, sum"};

static int fd, mode;
static size_t total;
static _Atomic size_t next_chunk;
static volatile uint64_t sink;

static void *reader(void *arg)
{
    (void)arg;
    char *slots = aligned_alloc(4096, 2 * SLOT);
    memset(slots, 0, 2 * SLOT);
    uint64_t acc = 0;
    int k = 0;
    for (;;) {
        size_t c = next_chunk++;
        if ((size_t)c * CHUNK >= total)
            break;
        off_t off = (off_t)c * CHUNK;
        const char *map = NULL;
        if (mode >= MAP_COPY_SUM) {
            map = mmap(NULL, CHUNK, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, off);
            if (map == MAP_FAILED) {
                perror("mmap");
                exit(1);
            }
        }
        for (size_t at = 0; at < CHUNK; at += SLOT, k ^= 1) {
            char *slot = slots + (size_t)k * SLOT;
            if (mode == PREAD) {
                if (pread(fd, slot, SLOT, off + (off_t)at) != SLOT)
                    exit(2);
            } else if (mode == PREAD_SUM) {
                struct nvp_xxh64_state s;
                int err;
                nvp_xxh64_start(&s);
                if (nvp_pread_xxh64_part(&s, fd, slot, SLOT, off + (int64_t)at, PIECE, &err) != SLOT)
                    exit(2);
                acc += s.v[0];
            } else {
                for (size_t p = 0; p < SLOT; p += PIECE) {
                    if (mode == MAP_COPY_SUM)
                        memcpy(slot + p, map + at + p, PIECE);
                    else
                        nvp_stream_copy(slot + p, map + at + p, PIECE);
                    acc += nvp_xxh64(map + at + p, PIECE, 0);
                }
            }
        }
        if (map)
            munmap((void *)map, CHUNK);
    }
    sink += acc;
    free(slots);
    return NULL;
}

int main(int argc, char **argv)
{
    total = (size_t)(argc > 1 ? atoi(argv[1]) : 4096) << 20;
    const char *dir = argc > 2 ? argv[2] : "/dev/shm";
    char path[256];
    snprintf(path, sizeof path, "%s/image_read.%d", dir, getpid());
    fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    unlink(path);
    char *buf = malloc(CHUNK);
    memset(buf, 7, CHUNK);
    for (size_t at = 0; at < total; at += CHUNK)
        if (pwrite(fd, buf, CHUNK, (off_t)at) != CHUNK)
            return 2;
    free(buf);
    printf("%zu MiB in %s; GB/s, best of 3\nthreads", total >> 20, dir);
    for (int m = 0; m < MODES; m++)
        printf(" | %s", names[m]);
    printf("\n");
    static const int counts[] = {1, 4, 8, 12, 16};
    for (unsigned t = 0; t < sizeof counts / sizeof *counts; t++) {
        printf("%7d", counts[t]);
        for (mode = 0; mode < MODES; mode++) {
            double best = 0;
            for (int rep = 0; rep < 3; rep++) {
                pthread_t th[64];
                next_chunk = 0;
                double t0 = now_us();
                for (int i = 0; i < counts[t]; i++)
                    pthread_create(&th[i], NULL, reader, NULL);
                for (int i = 0; i < counts[t]; i++)
                    pthread_join(th[i], NULL);
                double g = (double)total / (now_us() - t0) / 1e3;
                best = g > best ? g : best;
            }
            printf(" | %6.1f", best);
        }
        printf("\n");
    }
    return 0;
}
