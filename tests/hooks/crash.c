/* Part of the test-only hooks library (ckpt_at.c): a program under nvproxy that dies of SIGSEGV or SIGBUS first
 * prints where, one frame a line as library+offset (for addr2line), then dies of the signal as it would have.  For
 * crashes seen once in a while, such as a restarted program's in its first host callback (docs/checkpoint.md): the
 * DMTCP tests load this library, so the next such failure carries its frames.  Never in nvproxy itself: the
 * program's own handlers are its business. */
#define _GNU_SOURCE
#include "test_hooks.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static void say(const char *s, int n)
{
    if (n > 0 && write(2, s, (size_t)n) < 0)
        return;
}

static void frame(void *pc)
{
    char b[512];
    Dl_info d;
    if (dladdr(pc, &d) && d.dli_fname)
        say(b, snprintf(b, sizeof b, "nvproxy: crash:   %s+%#lx %s\n", d.dli_fname,
                        (unsigned long)((char *)pc - (char *)d.dli_fbase), d.dli_sname ? d.dli_sname : ""));
    else
        say(b, snprintf(b, sizeof b, "nvproxy: crash:   %p\n", pc));
}

static unsigned long hex(const char **p)
{
    unsigned long v = 0;
    for (;; (*p)++) {
        char c = **p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return v;
        v = v * 16 + (unsigned long)d;
    }
}

/* the lines of /proc/self/maps that hold one of the n addresses, or "not mapped" for those none holds, with
 * the mappings around such an address (within NEAR bytes); only read(2) and write(2): it runs in the handler */
#define NEAR (64ul << 20)
static void mappings(const unsigned long *addr, const char *const *name, int n)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), found = 0;
    if (fd < 0)
        return;
    char exe[256];
    ssize_t nexe = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[nexe > 0 ? nexe : 0] = 0;
    char buf[4096], line[512];
    size_t len = 0;
    for (ssize_t r; (r = read(fd, buf, sizeof buf)) > 0;)
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] != '\n') {
                if (len < sizeof line - 1)
                    line[len++] = buf[i];
                continue;
            }
            line[len] = 0;
            if (*exe && strstr(line, exe)) { /* (the program's own mappings: where it is) */
                char b[600];
                say(b, snprintf(b, sizeof b, "nvproxy: crash:   (program: %s)\n", line));
            }
            const char *q = line;
            unsigned long lo = hex(&q);
            q++;
            unsigned long hi = hex(&q);
            for (int k = 0; k < n; k++) {
                char b[600];
                if (addr[k] >= lo && addr[k] < hi) {
                    say(b, snprintf(b, sizeof b, "nvproxy: crash:   %s %#lx in %s\n", name[k], addr[k], line));
                    found |= 1 << k;
                } else if (addr[k] + NEAR > lo && addr[k] < hi + NEAR) {
                    say(b, snprintf(b, sizeof b, "nvproxy: crash:   (near %s: %s)\n", name[k], line));
                }
            }
            len = 0;
        }
    close(fd);
    for (int k = 0; k < n; k++)
        if (!(found & 1 << k)) {
            char b[120];
            say(b, snprintf(b, sizeof b, "nvproxy: crash:   %s %#lx not mapped\n", name[k], addr[k]));
        }
}

static void on_crash(int sig, siginfo_t *si, void *uc)
{
    char b[200];
    const greg_t *r = ((ucontext_t *)uc)->uc_mcontext.gregs;
    say(b, snprintf(b, sizeof b, "nvproxy: crash: signal %d (code %d) at address %p in thread %ld; frames:\n", sig,
                    si->si_code, si->si_addr, (long)syscall(SYS_gettid)));
    frame((void *)r[REG_RIP]); /* (where it faulted) */
    void *pcs[48];
    int n = backtrace(pcs, 48);
    for (int i = 0; i < n; i++)
        frame(pcs[i]);
    /* what was there: the address, and (a fault in memcpy and its kind) the first two arguments' registers */
    unsigned long addr[3] = {(unsigned long)si->si_addr, (unsigned long)r[REG_RDI], (unsigned long)r[REG_RSI]};
    const char *const name[3] = {"fault", "rdi", "rsi"};
    mappings(addr, name, 3);
    signal(sig, SIG_DFL);
    raise(sig);
}

int nvp_hooks_attached(void); /* ckpt_at.c */

__attribute__((constructor)) static void crash_trace_install(void)
{
    if (!nvp_hooks_attached())
        return;
    void *warm[1];
    backtrace(warm, 1); /* (loads the unwinder now: not for the first time inside a handler) */
    struct sigaction sa = {0};
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}
