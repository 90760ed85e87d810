/*
 * Loading an image file into device memory through pinned bounce slots, in C:
 * reader threads pread and sum chunks a slot-sized piece at a time into free slots
 * (no GIL, no driver calls), and the calling thread, which holds the device's
 * context, issues each piece's copy and takes slots back when their copies are done.
 * Slots are small (a few MiB) so that few need to be made: new pinned memory is what
 * a fresh proxy is slowest to get.  A chunk's sum is known once its last piece is
 * read, when earlier pieces may be on the device already: a mismatch fails the load,
 * and with it the restore, which then never lets the application go on.
 *
 * Python (checkpoint/transfer.py) makes the slots (on threads of its own, while this
 * runs: a slot is used once its ready flag is set) and owns the streams and events.
 * The driver entry points come as in the fast path, so the sim backend runs this code too.
 *
 * Python reads the block between the CDEF markers with cffi.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define NVPL_OK 0
#define NVPL_SHORT 1    /* the file ends inside a chunk (err 0), or reading it failed (err: the errno) */
#define NVPL_MISMATCH 2 /* a chunk's checksum differs from the image's */
#define NVPL_CUDA 3     /* a copy or an event failed: err is the CUDA error */
#define NVPL_NO_SLOTS 4 /* no slot could be made */
#define NVPL_THREADS 5  /* no reader thread could be started: err is the errno */
#define NVPL_CANCELLED 6 /* the gate said so */

#define NVPL_SLOT_MAKING 0
#define NVPL_SLOT_READY 1
#define NVPL_SLOT_FAILED 2

struct nvpl_chunk {
    int64_t file_off;
    uint64_t va;
    uint64_t size;
    uint64_t crc;
};

struct nvpl_load {
    /* in */
    int fd;
    const struct nvpl_chunk *chunks;
    uint32_t nchunks;
    uint64_t slots;      /* address of the first slot; slot i is at slots + i * slot_size */
    uint64_t slot_size; /* a multiple of 32 */
    uint32_t nslots;
    volatile int32_t *slot_state; /* NVPL_SLOT_*, set by whoever makes the slots */
    void *const *events;          /* one per slot: recorded after the slot's copy */
    void *const *streams;
    uint32_t nstreams;
    uint32_t readers;
    uint64_t piece; /* read and summed this many bytes at a time (while they are in the cache) */
    int (*memcpy_async)(uint64_t dst, uint64_t src, size_t n, void *stream);
    int (*event_record)(void *event, void *stream, unsigned flags);
    int (*event_query)(void *event);
    int (*event_sync)(void *event);
    /* NULL, or: no copy is issued while *gate is 0 (the device memory is not mapped yet: the readers fill the
     * slots meanwhile), and the load stops once it is below 0 */
    volatile int32_t *gate;
    /* NULL, or an early check of the same file (nvpl_check_*, started, not yet stopped by nvpl_check_stop):
     * check_of[i] is chunk i's index among its chunks (-1: not among them).  A chunk it has found right by the time
     * a reader takes it is read but not summed again.  Its threads go on until the gate opens (the readers only
     * wait for slots before), and are then told to stop: they would take memory bandwidth from the load. */
    struct nvpl_check *check;
    const int32_t *check_of;
    /* out */
    volatile uint64_t bytes_verified; /* progress: chunks read and checked so far */
    int32_t why;                      /* NVPL_* */
    int32_t err;
    int32_t bad_chunk; /* the chunk why names, or -1 */
    double read_s;     /* summed over the readers */
    double slot_wait_s; /* readers' time without a slot */
    double flight_s;    /* summed over chunks: from a copy's issue until its slot was free again */
};

/* Loads every chunk; returns why (also in l->why).  Every copy it issued is complete when it returns. */
int nvpl_run(struct nvpl_load *l);

/* An early check: threads sum chunks of the image file (no slots, no driver) while a restoring proxy waits for
 * its CUDA context, so that the load, once it can copy, reads those chunks without summing them.  It never
 * fails: a chunk it could not read, or whose sum was wrong, is left unmarked for the load to find again. */
struct nvpl_check {
    /* in */
    int fd;
    const struct nvpl_chunk *chunks; /* (va unused) */
    uint32_t nchunks;
    uint32_t threads;
    uint64_t piece; /* read and summed this many bytes at a time, into a buffer of each thread's own */
    int nice;       /* the threads' niceness, added: they must not slow the context being made */
    uint8_t *good;  /* per chunk, set to 1 once its sum matched (the caller's, nchunks long, zeroed) */
    /* out, as it goes */
    volatile uint64_t bytes_checked;
    uint32_t started;           /* threads started */
    volatile uint32_t finished; /* threads that found no chunk left (none stopped them) */
    double read_s; /* summed over the threads, once stopped */
    /* private */
    void *run;
};

/* Starts the threads; 0, or the errno of the first thread that could not start (then none runs). */
int nvpl_check_start(struct nvpl_check *c);
/* Tells the threads to stop at their next piece, without waiting for them. */
void nvpl_check_halt(struct nvpl_check *c);
/* Stops the threads at their next piece and joins them; after it, good[] is final.  Safe to call twice. */
void nvpl_check_stop(struct nvpl_check *c);
/* CDEF-END */
