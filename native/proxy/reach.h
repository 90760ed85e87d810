/* Write tracking for incremental checkpoints: which device memory the requests executed since the last look may
 * have written (checkpoint/reach.py reads it and draws the conclusions).  One classification of every request,
 * used by the C fast path for the requests it executes and by Python for the others, so both paths mark alike.
 *
 * Addresses are kept as granule numbers (address >> shift), deduplicated in small open-addressing sets; a set that
 * fills up says so (overflow), and its reader then assumes everything was written.
 *
 * Python reads the block between the CDEF markers with cffi. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define NVPR_SLOTS 2048
#define NVPR_SCAN_MAX 4096
#define NVPR_SEED 0  /* a kernel or library call may use this memory, and reach through pointers stored in it */
#define NVPR_HOST 1  /* written with bytes from the host (which may be device pointers) */
#define NVPR_EXACT 2 /* written by a memset (no pointer can come of it) */
#define NVPR_OTHER 3 /* written outside the arenas (host memory, or a module variable) */
#define NVPR_KINDS 4
#define NVPR_KERNEL 1 /* a kernel ran: its module's variables are reachable too */
#define NVPR_LIB 2    /* a library call ran: memory its handles were configured with (workspaces) is reachable */
#define NVPR_ALL 4    /* something wrote device memory that cannot be attributed (a graph, a reset, an unknown op) */
#define NVPR_VARS 8   /* module variables may have been written with bytes from the host */
#define NVPR_REMAP 16 /* an address range got other memory (cuMemMap): what any mapping holds may now reach
                               anywhere */

struct nvpr_set {
    uint32_t n;
    uint32_t overflow;
    uint64_t keys[NVPR_SLOTS]; /* granule + 1; 0: empty */
};

struct nvpr_log {
    uint32_t flags;
    struct nvpr_set set[NVPR_KINDS];
};

/* the arenas' address range and the granule size (1 << shift) */
void nvpr_config(uint64_t lo, uint64_t hi, unsigned shift);
/* a request about to be executed (a: its 8 argument words) */
void nvpr_note(uint32_t op, const uint64_t *a, const uint8_t *payload, size_t plen);
/* 1 if the table says op writes no device memory (a request of it may still free some: NVP_OP_FREE) */
int nvpr_writes_nothing(uint32_t op);
/* the log since the last take (valid until the next take), a fresh one begun */
struct nvpr_log *nvpr_take(void);
/* the granules of the arenas that the aligned 64-bit words of [p, p+n) point into, at most max of them, into out;
 * returns how many, or -1 if there were more (the caller assumes they may point anywhere) */
int nvpr_scan(const void *p, size_t n, uint64_t *out, int max);
/* CDEF-END */
