/* Executing the NVIDIA libraries' calls in the proxy (see libexec.h). */
#define _GNU_SOURCE
#include "libexec.h"

#include "fastpath.h"
#include "nvproxy_wire.h"

#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define NLIBS 8
static void *libs[NLIBS];
static void **syms; /* per function: its address, once looked up */
static char err[512];

EXPORT int nvpl_table_count(void) { return nvpl_table_size; }
EXPORT const char *nvpl_error(void) { return err; }

int nvpl_any_open(void)
{
    for (int i = 0; i < NLIBS; i++)
        if (libs[i])
            return 1;
    return 0;
}

EXPORT int nvpl_open(int lib, const char *path)
{
    if (lib < 0 || lib >= NLIBS)
        return -1;
    if (libs[lib])
        return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        strncpy(err, e ? e : "dlopen failed", sizeof err - 1);
        return -1;
    }
    libs[lib] = h;
    return 0;
}

/* ---- handles: nvproxy's id -> the library's own, per kind (an open-addressed table) ---- */
/* a generator's latest generation record, as Python taught it (nvpl_teach_generation) */
struct gen_rec {
    uint32_t fid;
    int out; /* the output parameter, whose slot is not compared */
    uint64_t hostmask, counted;
    size_t len;
    uint8_t payload[];
};

struct hent {
    uint64_t id; /* 0: empty; ~0: removed */
    int kind;
    int slow; /* its calls are Python's (a handle on the per-thread stream: Python gives it the caller's) */
    uint64_t real;
    struct gen_rec *gen;
};
static struct hent *ht;
static size_t hcap, hused;
#define REMOVED UINT64_MAX

static size_t hslot(int kind, uint64_t id)
{
    return (size_t)(((id ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull) >> 17) & (hcap - 1);
}

static struct hent *hfind(int kind, uint64_t id)
{
    if (!hcap || !id || id == REMOVED)
        return NULL;
    for (size_t i = hslot(kind, id);; i = (i + 1) & (hcap - 1)) {
        if (ht[i].id == id && ht[i].kind == kind)
            return &ht[i];
        if (!ht[i].id)
            return NULL;
    }
}

/* a used handle's entry: of its parameter's kind, or of one that kind takes too (nvpl_kinds.h); the real handle of
 * either is what the library is given, as a native cast of the one to the other gives it */
static struct hent *hfind_used(int kind, uint64_t id)
{
    struct hent *e = hfind(kind, id);
    for (int i = 0; !e && i < nvpl_nkind_accepts; i++)
        if (nvpl_kind_accepts[i].kind == kind)
            e = hfind(nvpl_kind_accepts[i].other, id);
    return e;
}

EXPORT void nvpl_learn(int kind, uint64_t id, uint64_t real)
{
    struct hent *e = hfind(kind, id);
    if (e) {
        e->real = real;
        return;
    }
    if ((hused + 1) * 2 > hcap) {
        size_t old = hcap;
        struct hent *ot = ht;
        hcap = hcap ? hcap * 2 : 256;
        ht = calloc(hcap, sizeof *ht);
        hused = 0;
        for (size_t i = 0; i < old; i++)
            if (ot[i].id && ot[i].id != REMOVED) {
                nvpl_learn(ot[i].kind, ot[i].id, ot[i].real);
                struct hent *e = hfind(ot[i].kind, ot[i].id);
                e->slow = ot[i].slow;
                e->gen = ot[i].gen;
            }
        free(ot);
    }
    size_t i = hslot(kind, id);
    while (ht[i].id && ht[i].id != REMOVED)
        i = (i + 1) & (hcap - 1);
    if (!ht[i].id)
        hused++;
    ht[i] = (struct hent){id, kind, 0, real, NULL};
}

EXPORT void nvpl_forget(int kind, uint64_t id)
{
    struct hent *e = hfind(kind, id);
    if (e) {
        e->id = REMOVED;
        free(e->gen);
        e->gen = NULL;
    }
}

EXPORT void nvpl_forget_all(void)
{
    for (size_t i = 0; i < hcap; i++)
        free(ht[i].gen);
    free(ht);
    ht = NULL;
    hcap = hused = 0;
}

/* the id behind a real handle of a kind (0: none), for handles a library hands back among typed elements */
static uint64_t hid_of(int kind, uint64_t real)
{
    for (size_t i = 0; real && i < hcap; i++)
        if (ht[i].id && ht[i].id != REMOVED && ht[i].kind == kind && ht[i].real == real)
            return ht[i].id;
    return 0;
}

/* ---- one call ---- */
static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static const struct nvpl_elem_type *elem_type(int lib, int64_t type)
{
    for (int i = 0; i < nvpl_nelem_types; i++)
        if (nvpl_elem_types[i].lib == lib && nvpl_elem_types[i].type == type)
            return &nvpl_elem_types[i];
    return NULL;
}

/* Typed elements as the library takes them: handle ids in place of the real handles (0 if one is unknown). */
static int elems_to_real(const struct nvpl_elem_type *t, uint8_t *buf, uint64_t len)
{
    if (t->kind < 0)
        return 1;
    for (uint64_t o = 0; o + 8 <= len; o += 8) {
        uint64_t id;
        memcpy(&id, buf + o, 8);
        if (!id)
            continue;
        struct hent *e = hfind(t->kind, id);
        if (!e)
            return 0;
        memcpy(buf + o, &e->real, 8);
    }
    return 1;
}

/* ...and back: the handles the library answered with, as the application's ids */
static void elems_to_ids(const struct nvpl_elem_type *t, uint8_t *buf, uint64_t len)
{
    for (uint64_t o = 0; t->kind >= 0 && o + 8 <= len; o += 8) {
        uint64_t real;
        memcpy(&real, buf + o, 8);
        uint64_t id = hid_of(t->kind, real);
        memcpy(buf + o, &id, 8);
    }
}

static int fail(struct nvpl_result *res, int error, int param)
{
    res->error = error;
    res->param = param;
    return error;
}

/* The function of fid, its library open and its address known; or NULL with res->error set. */
static const struct nvpl_fn *function(uint32_t fid, struct nvpl_result *res)
{
    if (fid >= (uint32_t)nvpl_table_size || !nvpl_table[fid].call)
        return fail(res, NVPL_E_BAD, -1), NULL;
    const struct nvpl_fn *f = &nvpl_table[fid];
    if (!libs[f->lib])
        return fail(res, NVPL_E_NOLIB, -1), NULL;
    if (!syms && !(syms = calloc((size_t)nvpl_table_size, sizeof *syms)))
        return fail(res, NVPL_E_BAD, -1), NULL;
    if (!syms[fid] && !(syms[fid] = dlsym(libs[f->lib], f->name)))
        return fail(res, NVPL_E_NOSYM, -1), NULL;
    return f;
}

/* nvpl_call with the slots given apart (payload: the request's, slots and host inputs) */
static int call_slots(uint32_t fid, const struct nvpl_fn *f, uint64_t hostmask, const uint64_t *slot,
                      const uint8_t *payload, size_t len, uint8_t *out, size_t out_cap, struct nvpl_result *res);

EXPORT int nvpl_call(uint32_t fid, uint64_t hostmask, const uint8_t *payload, size_t len, uint8_t *out, size_t out_cap,
              struct nvpl_result *res)
{
    memset(res, 0, sizeof *res);
    const struct nvpl_fn *f = function(fid, res);
    if (!f)
        return res->error;
    if (len < (size_t)f->nparams * 8)
        return fail(res, NVPL_E_BAD, -1);
    uint64_t slot[NVPL_MAX_PARAMS];
    memcpy(slot, payload, (size_t)f->nparams * 8);
    return call_slots(fid, f, hostmask, slot, payload, len, out, out_cap, res);
}

static int call_slots(uint32_t fid, const struct nvpl_fn *f, uint64_t hostmask, const uint64_t *slot,
                      const uint8_t *payload, size_t len, uint8_t *out, size_t out_cap, struct nvpl_result *res)
{
    int n = f->nparams, rc = NVPL_OK;
    uint64_t v[NVPL_MAX_PARAMS] = {0};
    uint8_t *copies[NVPL_MAX_PARAMS]; /* typed input elements, translated in a copy of the request's */
    int ncopies = 0;
    const struct nvpl_elem_type *back[NVPL_MAX_PARAMS] = {0}; /* typed outputs whose handles go back as ids */
    uint64_t back_len[NVPL_MAX_PARAMS];
    size_t in = (size_t)n * 8, o = 0;
    uint64_t made[NVPL_MAX_CREATED] = {0};
    int nmade = 0;
    for (int i = 0; i < n; i++) {
        char r = f->roles[i];
        int kind = f->kinds[2 * i] == '-' ? -1 : (f->kinds[2 * i] - '0') * 10 + (f->kinds[2 * i + 1] - '0');
        int host = r == 'i' || r == 'o' || r == 'b' || r == 't' || r == 'x' || r == 'e' || r == 'E' ||
                   ((r == 'S' || r == 'R' || r == 'B') && (hostmask >> i & 1));
        if ((r == 'h' || r == 'd') && !slot[i]) {
            v[i] = 0; /* (NULL: the library answers it) */
        } else if (r == 'h' || r == 'd') {
            struct hent *e = r == 'h' ? hfind_used(kind, slot[i]) : hfind(kind, slot[i]);
            if (!e)
                return fail(res, NVPL_E_HANDLE, i);
            v[i] = e->real;
        } else if (r == 'c') {
            if (nmade == NVPL_MAX_CREATED)
                return fail(res, NVPL_E_BAD, i);
            v[i] = (uint64_t)(uintptr_t)&made[nmade++];
        } else if (host) {
            int dir_in = r == 'i' || r == 'b' || r == 't' || r == 'x' || r == 'S' || r == 'B' || r == 'e' || r == 'E';
            int dir_out = r == 'o' || r == 'b' || r == 'R' || r == 'B' || r == 'E';
            if (slot[i] == NVPL_NULL_SLOT) {
                v[i] = 0;
                continue;
            }
            uint64_t k = slot[i];
            if (dir_in && (k > len - in || pad8(k) > len - in))
                return fail(res, NVPL_E_BAD, i);
            if (dir_out) {
                if (k > out_cap - o || pad8(k) > out_cap - o)
                    return fail(res, NVPL_E_OUT, i);
                memset(out + o + k, 0, pad8(k) - k); /* (the padding goes out too) */
                if (dir_in)
                    memcpy(out + o, payload + in, k);
                else
                    memset(out + o, 0, k);
                v[i] = (uint64_t)(uintptr_t)(out + o);
                o += pad8(k);
            } else {
                if (r == 't' && (!k || payload[in + k - 1]))
                    return fail(res, NVPL_E_BAD, i); /* (a string ends in its NUL) */
                v[i] = (uint64_t)(uintptr_t)(payload + in);
            }
            if (dir_in)
                in += pad8(k);
            if (r == 'e' || r == 'E') { /* (the type's parameter comes first: its digits are in kinds) */
                const struct nvpl_elem_type *t = elem_type(f->lib, (int64_t)slot[kind]);
                if (!t || k % (uint64_t)t->size)
                    rc = fail(res, NVPL_E_BAD, i);
                else if (r == 'e' && t->kind >= 0 && !(copies[ncopies] = malloc(k ? k : 1)))
                    rc = fail(res, NVPL_E_BAD, i);
                else if (r == 'e' && t->kind >= 0) {
                    memcpy(copies[ncopies], (const void *)(uintptr_t)v[i], k);
                    v[i] = (uint64_t)(uintptr_t)copies[ncopies++];
                }
                if (!rc && !elems_to_real(t, (uint8_t *)(uintptr_t)v[i], k))
                    rc = fail(res, NVPL_E_HANDLE, i);
                if (rc)
                    break;
                if (r == 'E') {
                    back[i] = t;
                    back_len[i] = k;
                }
            }
        } else {
            v[i] = slot[i];
        }
    }
    if (rc) {
        while (ncopies)
            free(copies[--ncopies]);
        return rc;
    }
    int64_t ret = f->call(syms[fid], v);
    while (ncopies)
        free(copies[--ncopies]);
    for (int i = 0; i < n; i++)
        if (back[i])
            elems_to_ids(back[i], (uint8_t *)(uintptr_t)v[i], back_len[i]);
    res->out_len = o;
    if ((f->flags & NVPL_RET_MASK) == NVPL_RET_STRING) {
        const char *s = (const char *)(uintptr_t)ret;
        size_t k = s ? strlen(s) + 1 : 0;
        if (k > out_cap)
            k = out_cap;
        if (k) {
            memcpy(out, s, k);
            out[k - 1] = 0;
        }
        res->out_len = k;
        ret = (int64_t)k;
    }
    res->ret = ret;
    for (int k = 0; k < nmade; k++)
        res->created[k] = (f->flags & NVPL_INT_CREATE) ? (uint64_t)(uint32_t)made[k] : made[k];
    return NVPL_OK;
}

/* ---- calls in the fast path (fastpath.c): the functions and handles Python let C call ---- */
static uint8_t *fast_fns; /* per function: NVPL_FAST_* Python allows */
static int host_only;
static _Alignas(16) uint8_t fast_out[65536]; /* a waited call's host outputs (larger ones: Python's) */

EXPORT void nvpl_allow_fast(uint32_t fid, int how)
{
    if (fid >= (uint32_t)nvpl_table_size)
        return;
    if (!fast_fns && !(fast_fns = calloc((size_t)nvpl_table_size, 1)))
        return;
    fast_fns[fid] |= (uint8_t)how;
}

EXPORT void nvpl_handle_slow(int kind, uint64_t id, int slow)
{
    struct hent *e = hfind(kind, id);
    if (e)
        e->slow = slow;
}

EXPORT void nvpl_fast_host_only(int on) { host_only = on; }

EXPORT void nvpl_teach_generation(int kind, uint64_t id, uint32_t fid, int out, uint64_t hostmask,
                                  const uint8_t *payload, size_t len)
{
    struct hent *e = hfind(kind, id);
    if (!e)
        return;
    free(e->gen);
    e->gen = NULL;
    if (!payload || fid >= (uint32_t)nvpl_table_size || out < 0 || out >= nvpl_table[fid].nparams ||
        len < (size_t)nvpl_table[fid].nparams * 8 || !(e->gen = malloc(sizeof *e->gen + len)))
        return;
    *e->gen = (struct gen_rec){fid, out, hostmask, 0, len};
    memcpy(e->gen->payload, payload, len);
}

EXPORT uint64_t nvpl_take_generated(int kind, uint64_t id)
{
    struct hent *e = hfind(kind, id);
    if (!e || !e->gen)
        return 0;
    uint64_t n = e->gen->counted;
    e->gen->counted = 0;
    return n;
}

/* The generator record a generation call adds to (the same call but for its output), or NULL: Python's. */
static struct gen_rec *same_generation(const struct nvpl_fn *f, uint32_t fid, uint64_t hostmask,
                                       const uint8_t *payload, size_t len)
{
    int owner = -1;
    for (int i = 0; i < f->nparams && owner < 0; i++)
        owner = f->roles[i] == 'h' ? i : -1;
    uint64_t id;
    if (owner < 0)
        return NULL;
    memcpy(&id, payload + 8 * owner, sizeof id);
    struct hent *e = hfind_used((f->kinds[2 * owner] - '0') * 10 + (f->kinds[2 * owner + 1] - '0'), id);
    struct gen_rec *g = e ? e->gen : NULL;
    if (!g || g->fid != fid || g->hostmask != hostmask || g->len != len)
        return NULL;
    size_t o = 8 * (size_t)g->out;
    if (memcmp(g->payload, payload, o) || memcmp(g->payload + o + 8, payload + o + 8, len - o - 8))
        return NULL;
    return g;
}

/* The slots of a call C may make, streams translated; 0 if it is Python's. */
static int fast_slots(void *ch, const struct nvpl_fn *f, uint64_t hostmask, const uint8_t *payload, uint64_t *slot,
                      int (*stream_of)(void *ch, uint64_t wire, void **s))
{
    memcpy(slot, payload, (size_t)f->nparams * 8);
    for (int i = 0; i < f->nparams; i++) {
        char r = f->roles[i];
        if (r == 's') {
            void *s;
            if (!stream_of(ch, slot[i], &s))
                return 0;
            slot[i] = (uint64_t)(uintptr_t)s;
        } else if ((r == 'h' || r == 'd') && slot[i]) {
            int kind = (f->kinds[2 * i] - '0') * 10 + (f->kinds[2 * i + 1] - '0');
            struct hent *e = r == 'h' ? hfind_used(kind, slot[i]) : hfind(kind, slot[i]);
            if (!e || e->slow)
                return 0; /* (Python answers an unknown handle, and binds a per-thread stream) */
        } else if (host_only && slot[i] && (r == 'p' || r == 'e' || r == 'E' ||
                                            ((r == 'S' || r == 'R' || r == 'B') && !(hostmask >> i & 1)))) {
            return 0; /* (device memory Python translates, perhaps among typed elements) */
        }
    }
    return 1;
}

int nvpl_fast(void *chan, const uint64_t *a, const uint8_t *payload, size_t len,
              int (*stream_of)(void *ch, uint64_t wire, void **s), uint64_t r[4], const uint8_t **out,
              size_t *out_len)
{
    struct nvpf_chan *ch = chan;
    uint32_t fid = (uint32_t)a[0];
    int posted = a[3] != 0;
    uint64_t out_cap = a[2];
    if (!fast_fns || fid >= (uint32_t)nvpl_table_size ||
        !(fast_fns[fid] & (posted ? NVPL_FAST_POSTED | NVPL_FAST_GENERATE : NVPL_FAST_WAITED)) || (posted && out_cap) ||
        out_cap > sizeof fast_out)
        return 0; /* (not allowed yet, or outputs C does not take) */
    struct nvpl_result res;
    memset(&res, 0, sizeof res);
    const struct nvpl_fn *f = function(fid, &res);
    uint64_t slot[NVPL_MAX_PARAMS];
    if (!f || len < (size_t)f->nparams * 8 || (unsigned)f->lib >= NVPF_LIBS ||
        !fast_slots(ch, f, a[1], payload, slot, stream_of))
        return 0;
    struct gen_rec *gen = NULL;
    if ((fast_fns[fid] & NVPL_FAST_GENERATE) && !(gen = same_generation(f, fid, a[1], payload, len)))
        return 0;
    if (call_slots(fid, f, a[1], slot, payload, len, fast_out, (size_t)out_cap, &res))
        return 0; /* (Python tells what was wrong with it) */
    int status_fn = (f->flags & NVPL_RET_MASK) == NVPL_RET_STATUS;
    if (gen && !res.ret)
        gen->counted++;
    if (posted) {
        if (status_fn && res.ret) {
            fprintf(stderr, "nvproxy: %s returned status %d after it had returned (it was posted); the thread's "
                    "next call of its library that waits reports it\n", f->name, (int)res.ret);
            if (!ch->lib_failed[f->lib]) { /* (the first is reported) */
                ch->lib_failed[f->lib] = (int)res.ret;
                ch->lib_failed_fid[f->lib] = fid;
            }
        }
        return 1;
    }
    r[0] = (uint64_t)res.ret;
    r[1] = r[2] = r[3] = 0;
    if (status_fn) { /* (its library's earlier posted failure, in place of its own status) */
        r[1] = (uint32_t)ch->lib_failed[f->lib];
        r[2] = ch->lib_failed_fid[f->lib];
        ch->lib_failed[f->lib] = 0;
        ch->lib_failed_fid[f->lib] = 0;
    }
    *out = fast_out;
    *out_len = res.out_len;
    if (res.out_len <= 8) { /* (no payload: the reply can come through the mailbox) */
        memcpy(&r[3], fast_out, res.out_len);
        r[2] |= NVP_LIB_OUT_IN_R3;
        *out_len = 0;
    }
    return 1;
}
