/* Write tracking: see reach.h.  The table below is the one place that says what each request may write. */
#include "reach.h"

#include <string.h>

#include "nvproxy_wire.h"

#define EXPORT __attribute__((visibility("default")))

static uint64_t lo, hi;
static unsigned shift = 21;
static struct nvpr_log logs[2];
static int cur;

EXPORT void nvpr_config(uint64_t l, uint64_t h, unsigned s)
{
    lo = l;
    hi = h;
    shift = s;
}

static int in_arena(uint64_t v) { return v >= lo && v < hi; }

static size_t slot_of(uint64_t key) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 40) % NVPR_SLOTS; }

static void add(int kind, uint64_t addr)
{
    struct nvpr_set *s = &logs[cur].set[kind];
    uint64_t key = (addr >> shift) + 1;
    for (size_t i = slot_of(key), k = 0; k < NVPR_SLOTS; i = (i + 1) % NVPR_SLOTS, k++) {
        if (s->keys[i] == key)
            return;
        if (!s->keys[i]) {
            if (s->n >= NVPR_SLOTS * 3 / 4) { /* (kept sparse: probes stay short) */
                s->overflow = 1;
                return;
            }
            s->keys[i] = key;
            s->n++;
            return;
        }
    }
    s->overflow = 1;
}

/* every aligned 64-bit word of buf that lies in an arena: a pointer a kernel or library may use */
static void words(int kind, const uint8_t *buf, size_t n)
{
    for (size_t off = 0; off + 8 <= n; off += 8) {
        uint64_t v;
        memcpy(&v, buf + off, 8);
        if (in_arena(v))
            add(kind, v);
    }
}

/* a copy's destination (src: 0 where the bytes come from the staging buffer) */
static void copy(uint64_t dst, uint64_t src, int from_host)
{
    if (!in_arena(dst)) {
        add(NVPR_OTHER, dst);
        return;
    }
    if (!from_host && in_arena(src)) { /* device to device: the copy carries whatever pointers src holds */
        add(NVPR_SEED, dst);
        add(NVPR_SEED, src);
        return;
    }
    add(NVPR_HOST, dst);
}

enum { NONE = 1 }; /* an op listed here writes no device memory; one not listed may write any */

static const uint8_t WRITES_NOTHING[NVP_OP_COUNT] = {
    [NVP_OP_HELLO] = NONE, [NVP_OP_DEVICE_INFO] = NONE, [NVP_OP_SET_DEVICE] = NONE, [NVP_OP_DEVICE_SYNC] = NONE,
    [NVP_OP_FREE] = NONE, [NVP_OP_MEM_INFO] = NONE, [NVP_OP_HOST_REGISTER] = NONE,
    [NVP_OP_HOST_UNREGISTER] = NONE, [NVP_OP_STREAM_CREATE] = NONE, [NVP_OP_STREAM_DESTROY] = NONE,
    [NVP_OP_STREAM_SYNC] = NONE, [NVP_OP_STREAM_QUERY] = NONE, [NVP_OP_STREAM_WAIT_EVENT] = NONE,
    [NVP_OP_HOST_FUNC] = NONE, [NVP_OP_EVENT_CREATE] = NONE, [NVP_OP_EVENT_DESTROY] = NONE,
    [NVP_OP_EVENT_RECORD] = NONE, [NVP_OP_EVENT_SYNC] = NONE, [NVP_OP_EVENT_QUERY] = NONE,
    [NVP_OP_EVENT_ELAPSED] = NONE, [NVP_OP_MODULE_LOAD] = NONE, [NVP_OP_KERNEL_INFO] = NONE,
    [NVP_OP_VAR_INFO] = NONE, [NVP_OP_FUNC_SET_ATTR] = NONE, [NVP_OP_OCCUPANCY] = NONE,
    [NVP_OP_SET_LIMIT] = NONE, [NVP_OP_GET_LIMIT] = NONE, [NVP_OP_PROFILER] = NONE,
    [NVP_OP_STREAM_PRIORITY_RANGE] = NONE, [NVP_OP_CACHE_CONFIG] = NONE, [NVP_OP_PEER] = NONE,
    [NVP_OP_STAGING] = NONE, [NVP_OP_FLUSH] = NONE, [NVP_OP_STREAM_ATTR] = NONE,
    [NVP_OP_RESET_PERSISTING_L2] = NONE, [NVP_OP_CAPTURE_BEGIN] = NONE, [NVP_OP_CAPTURE_END] = NONE,
    [NVP_OP_CAPTURE_STATUS] = NONE, [NVP_OP_GRAPH_INSTANTIATE] = NONE, [NVP_OP_GRAPH_DESTROY] = NONE,
    [NVP_OP_GRAPH_CREATE] = NONE, [NVP_OP_GRAPH_ADD_NODE] = NONE, [NVP_OP_GRAPH_EXEC_KERNEL] = NONE,
    [NVP_OP_GRAPH_CLONE] = NONE, [NVP_OP_GRAPH_EXEC_UPDATE] = NONE, [NVP_OP_RESTORE_DONE] = NONE,
    [NVP_OP_ARRAY_CREATE] = NONE, [NVP_OP_ARRAY_DESTROY] = NONE, [NVP_OP_TEX_CREATE] = NONE,
    [NVP_OP_TEX_DESTROY] = NONE, [NVP_OP_GRAPH_GET_NODES] = NONE, [NVP_OP_IPC_MEM_EXPORT] = NONE,
    [NVP_OP_IPC_MEM_OPEN] = NONE, [NVP_OP_IPC_MEM_CLOSE] = NONE, [NVP_OP_IPC_EVENT_EXPORT] = NONE,
    [NVP_OP_IPC_EVENT_OPEN] = NONE, [NVP_OP_GRAPH_COND_HANDLE] = NONE, [NVP_OP_CAPTURE_INFO] = NONE,
    [NVP_OP_CAPTURE_TO_GRAPH] = NONE, [NVP_OP_CAPTURE_DEPS] = NONE, [NVP_OP_MANAGED_VAR] = NONE,
    [NVP_OP_STAGED_FENCE] = NONE, [NVP_OP_DRV_MODULE_UNLOAD] = NONE, [NVP_OP_DRV_VMM] = NONE,
};

EXPORT int nvpr_writes_nothing(uint32_t op) { return op < NVP_OP_COUNT && WRITES_NOTHING[op] == NONE; }

EXPORT void nvpr_note(uint32_t op, const uint64_t *a, const uint8_t *payload, size_t plen)
{
    struct nvpr_log *l = &logs[cur];
    switch (op) {
    case NVP_OP_MALLOC: /* (the reply's address is not known here: reach.py marks new mappings itself) */
        return;
    case NVP_OP_MEMCPY:
        copy(a[0], a[1], 0);
        return;
    case NVP_OP_MEMCPY_2D:
        copy(a[0], a[2], 0);
        return;
    case NVP_OP_STAGED_COPY:
        if (!a[4]) /* (to the host: nothing on the device changes) */
            copy(a[0], 0, 1);
        return;
    case NVP_OP_MEMSET:
    case NVP_OP_MEMSET_2D:
    case NVP_OP_DRV_MEMSET:
        add(in_arena(a[0]) ? NVPR_EXACT : NVPR_OTHER, a[0]);
        return;
    case NVP_OP_LAUNCH:
        l->flags |= NVPR_KERNEL;
        words(NVPR_SEED, payload, plen);
        return;
    case NVP_OP_LIB_CALL:
        l->flags |= NVPR_LIB;
        words(NVPR_SEED, (const uint8_t *)a, 8 * sizeof *a);
        words(NVPR_SEED, payload, plen);
        return;
    case NVP_OP_DRV_VMM: /* (no contents change; an address the program holds may now reach other memory) */
        if (a[0] == NVP_VMM_MAP)
            l->flags |= NVPR_REMAP;
        return;
    case NVP_OP_COPY_3D: /* (either side may be device memory, an array or a variable: every address it names) */
        l->flags |= NVPR_VARS;
        words(NVPR_HOST, payload, plen);
        return;
    default:
        if (op >= NVP_OP_COUNT || WRITES_NOTHING[op] != NONE)
            l->flags |= NVPR_ALL; /* (graph launches, device resets, and whatever is not classified yet) */
        return;
    }
}

EXPORT struct nvpr_log *nvpr_take(void)
{
    struct nvpr_log *l = &logs[cur];
    cur ^= 1;
    memset(&logs[cur], 0, sizeof logs[cur]);
    return l;
}

EXPORT int nvpr_scan(const void *p, size_t n, uint64_t *out, int max)
{
    enum { TABLE = 2 * NVPR_SCAN_MAX };
    uint64_t seen[TABLE] = {0}, last = 0; /* granule + 1 */
    int k = 0;
    const uint8_t *b = p;
    if (max > NVPR_SCAN_MAX)
        max = NVPR_SCAN_MAX;
    for (size_t off = 0; off + 8 <= n; off += 8) {
        uint64_t v;
        memcpy(&v, b + off, 8);
        if (!in_arena(v) || (v >> shift) + 1 == last)
            continue;
        uint64_t key = last = (v >> shift) + 1;
        size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 40) % TABLE;
        while (seen[i] && seen[i] != key)
            i = (i + 1) % TABLE;
        if (seen[i])
            continue;
        if (k == max)
            return -1;
        seen[i] = key;
        out[k++] = key - 1;
    }
    return k;
}
