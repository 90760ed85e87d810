/* NVPROXY_CRASH_TRACE=1: a program that dies of SIGSEGV or SIGBUS first prints where, one frame a line as
 * library+offset (for addr2line), then dies of the signal as it would have.  For crashes seen once in a while,
 * such as a restarted program's in its first host callback (docs/checkpoint.md): the DMTCP tests set it, so the
 * next such failure carries its frames.  Only when asked: the program's own handlers are its business. */
#include "shim.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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

static void on_crash(int sig, siginfo_t *si, void *uc)
{
    char b[160];
    say(b, snprintf(b, sizeof b, "nvproxy: crash: signal %d at address %p in thread %ld; frames:\n", sig,
                    si->si_addr, (long)syscall(SYS_gettid)));
    frame((void *)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP]); /* (where it faulted) */
    void *pcs[48];
    int n = backtrace(pcs, 48);
    for (int i = 0; i < n; i++)
        frame(pcs[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void crash_trace_install(void)
{
    const char *v = getenv("NVPROXY_CRASH_TRACE");
    if (!v || !*v || *v == '0')
        return;
    void *warm[1];
    backtrace(warm, 1); /* (loads the unwinder now: not for the first time inside a handler) */
    struct sigaction sa = {0};
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}
