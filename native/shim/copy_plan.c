/* The ways a pageable copy goes through the staging buffer, chosen in one place: by direction and size (WAYS),
 * and how the host side of a small one is copied into the buffer (STORES).  memory.c carries the ways out,
 * parcopy.c the stores.  A file of its own: every threshold here came from a measurement,
 * and they are weighed against each other, so they are read side by side. */
#include "shim.h"

/* NVP_WAY_WHOLE from here: a copy that fits in the staging buffer goes there whole, in parts that helper threads
 * copy (parcopy.c).  To the device, each run of parts the helpers have finished is sent while they copy the next;
 * from the device, the parts of each piece are copied out as the piece arrives, while the device sends the next.
 * (Slot by slot, one piece after the other, copies this large were slower.) */
#define WHOLE_MIN (512u << 10)

/* Round from here: where a copy from the device lands in the staging buffer.  The device writes more slowly into
 * memory the host has just read (its lines are in the CPU's caches) than into memory it has not touched for a
 * while.  So a copy of DMA_ROUND_MIN or more lands at the next place round the whole buffer, smaller ones at its
 * start: for small copies the pages' address translation, which fresh places miss, seems to cost more than the
 * caches. */
#define DMA_ROUND_MIN (1u << 20)

/* Each rule holds from its size up to the next rule's of the same direction. */
static const struct way_rule {
    int to_device;
    size_t from;
    struct nvp_copy_plan plan;
} WAYS[] = {
    /* to the device: small ones posted (posted_h2d: the runtime returns once the bytes are staged, so the proxy
     * answers then), else a slot; whole; and beyond the buffer, a slot at a time */
    {1, 0, {NVP_WAY_POSTED, 0}},
    {1, WHOLE_MIN, {NVP_WAY_WHOLE, 0}},
    {1, NVP_STAGING_BYTES + 1, {NVP_WAY_SLOTS, 0}},
    /* from the device: one slot; whole, landing at the buffer's start, then round it; beyond it, slot by slot */
    {0, 0, {NVP_WAY_SLOTS, 0}},
    {0, WHOLE_MIN, {NVP_WAY_WHOLE, 0}},
    {0, DMA_ROUND_MIN, {NVP_WAY_WHOLE, 1}},
    {0, NVP_STAGING_BYTES + 1, {NVP_WAY_SLOTS, 0}},
};

struct nvp_copy_plan nvp_copy_plan(int to_device, size_t n)
{
    struct nvp_copy_plan plan = {NVP_WAY_SLOTS, 0};
    for (size_t i = 0; i < sizeof WAYS / sizeof *WAYS; i++)
        if (WAYS[i].to_device == !!to_device && n >= WAYS[i].from)
            plan = WAYS[i].plan;
    return plan;
}

/* The host side of a copy into the staging buffer that goes whole in one request (a posted copy, one slot):
 * plain stores below 64 KiB, streaming stores from there: the streaming stores' fence, which waits for the bytes
 * to reach memory, costs small copies more than they gain from leaving the cache alone.  From 128 KiB (two of
 * nvp_par_memcpy's smallest parts) the copy threads share it: helpers asleep cost nothing, the caller copies what
 * they leave.  (The larger ways' host copies: whole, streaming stores in parts; slot by slot, plain stores, which
 * may stay in the cache, on the copy threads.) */
static const struct {
    size_t from;
    struct nvp_host_stores how;
} STORES[] = {
    {0, {0, 0}},
    {64u << 10, {1, 0}},
    {128u << 10, {1, 1}},
};

struct nvp_host_stores nvp_small_stores(size_t n)
{
    struct nvp_host_stores how = STORES[0].how;
    for (size_t i = 0; i < sizeof STORES / sizeof *STORES; i++)
        if (n >= STORES[i].from)
            how = STORES[i].how;
    return how;
}
