/* The settings the shim reads from its environment, read and checked once, here: NVPROXY_SPIN_US,
 * NVPROXY_COPY_THREADS, NVPROXY_MANAGED and NVPROXY_DEBUG's flags (a comma-separated list, FLAGS below).
 *
 * A value out of range is said in one line naming the setting and what it allows, and from then on every CUDA call
 * fails with cudaErrorInitializationError, as the runtime's calls do when it cannot start.  The shim never ends the
 * program itself: LD_PRELOAD reaches every process the program starts (shells, compilers), most of which make no
 * CUDA call, so nothing is said or refused before a process's first call.  `nvproxy run` checks the same settings
 * against the same ranges before it starts anything (src/nvproxy/settings.py). */
#include "shim.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct nvp_settings S;
static char bad[300]; /* the first refused setting's line, "" if none */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* name's whole number in [lo, hi] into *out (unset or empty: left as it is); 0, or -1 with the line in bad */
static int whole_number(const char *name, uint64_t lo, uint64_t hi, const char *unit, uint64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    const char *p = v;
    while (isspace((unsigned char)*p)) /* (blanks around the number are taken, as `nvproxy run` takes them) */
        p++;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(p, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if (*p >= '0' && *p <= '9' && !*end && !errno && n >= lo && n <= hi) {
        *out = n;
        return 0;
    }
    if (!*bad)
        snprintf(bad, sizeof bad, "%s=%s is not allowed: expected a whole number from %llu to %llu%s", name, v,
                 (unsigned long long)lo, (unsigned long long)hi, unit);
    return -1;
}

/* NVPROXY_DEBUG's flags: each turns a mechanism off, to compare with it or to tell whether a fault is its. */
static const struct {
    const char *name;
    unsigned bit;
} FLAGS[] = {
    {"no-mailbox", NVP_DEBUG_NO_MAILBOX},           /* every reply over the socket (mailbox.c) */
    {"answered-copies", NVP_DEBUG_ANSWERED_COPIES}, /* every posted copy answered, no unanswered runs (memory.c) */
    {"no-inline", NVP_DEBUG_NO_INLINE},             /* the proxy's: C stops for every call Python executes */
};

/* NVPROXY_DEBUG's words, blanks around them taken, into *out; 0, or -1 with the line in bad */
static int debug_flags(unsigned *out)
{
    const char *v = getenv("NVPROXY_DEBUG");
    for (const char *p = v && *v ? v : ""; *p;) {
        size_t n = strcspn(p, ","), lead = 0;
        while (lead < n && isspace((unsigned char)p[lead]))
            lead++;
        size_t len = n - lead;
        while (len && isspace((unsigned char)p[lead + len - 1]))
            len--;
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof FLAGS / sizeof *FLAGS && !bit; i++)
            if (strlen(FLAGS[i].name) == len && !strncmp(FLAGS[i].name, p + lead, len))
                bit = FLAGS[i].bit;
        if (!bit) {
            char known[200] = "";
            for (size_t i = 0; i < sizeof FLAGS / sizeof *FLAGS; i++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", FLAGS[i].name);
            if (!*bad)
                snprintf(bad, sizeof bad, "NVPROXY_DEBUG=%s is not allowed: unknown flag '%.*s' (known: %s)", v,
                         (int)len, p + lead, known);
            return -1;
        }
        *out |= bit;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* name's value, one of words (its index into *out; unset or empty: left as it is); 0, or -1 with the line in bad */
static int one_of(const char *name, const char *const *words, int n, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char known[200] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(v, words[i])) {
            *out = i;
            return 0;
        }
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", words[i]);
    }
    if (!*bad)
        snprintf(bad, sizeof bad, "%s=%s is not allowed: expected one of %s", name, v, known);
    return -1;
}

static void read_settings(void)
{
    uint64_t spin_us = NVP_SPIN_US_DEFAULT, threads = 0;
    whole_number("NVPROXY_SPIN_US", 0, NVP_SPIN_US_MAX, " (microseconds)", &spin_us);
    whole_number("NVPROXY_COPY_THREADS", 1, NVP_COPY_THREADS_MAX, "", &threads);
    S.spin_ns = spin_us * 1000;
    S.copy_threads = (int)threads;
    debug_flags(&S.debug);
    static const char *const managed[] = {"auto", "migrate", "zero-copy"}; /* (NVP_MANAGED_*'s order) */
    one_of("NVPROXY_MANAGED", managed, 3, &S.managed);
}

int nvp_debug(unsigned flag) { return (nvp_settings()->debug & flag) != 0; }

const struct nvp_settings *nvp_settings(void)
{
    pthread_once(&once, read_settings);
    return &S;
}

cudaError_t nvp_settings_error(void)
{
    nvp_settings();
    if (!*bad)
        return cudaSuccess;
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        nvp_log("nvproxy: %s; every CUDA call fails with cudaErrorInitializationError", bad);
    return cudaErrorInitializationError;
}
