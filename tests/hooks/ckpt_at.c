/* Test-only hooks (the shim's test_hooks.h), in a library the tests build and preload beside the shim; never part of
 * nvproxy itself.  They make a mid-run checkpoint of a short program deterministic (the tests of public samples):
 *   NVPROXY_CHECKPOINT_AT=N  under DMTCP, as its Nth CUDA call begins (or right after it, where the call holds
 *                            checkpoints off) the thread creates nvproxy-call-reached-<pid> in the checkpoint
 *                            directory and waits: the test checkpoints (dmtcp_command -c) and kills the program,
 *                            restarts it from the images, and there the thread goes on (in a computation of
 *                            several processes, the first to reach its Nth call);
 *                            NVPROXY_CHECKPOINT_IN=child: only in the processes the program starts;
 *                            NVPROXY_CHECKPOINT_WAITERS=k: the first k processes to reach their Nth calls wait;
 *   NVPROXY_MIGRATE_AT=N     `nvproxy migrate` moves it to a new proxy then, and it goes on;
 *   NVPROXY_CALLS_OUT=path   the number of calls made is added there at exit, a line per process (to choose N).
 *   NVPROXY_TEST_PAUSE_MS=n  cudaHostAlloc sleeps n ms once the proxy has the memory, before the shim lists it
 *                            (a checkpoint must not come in between: tests/apps/pinned_at_checkpoint.cu).
 *   NVPROXY_TEST_HOLD_REQUEST=N with NVPROXY_TEST_HOLD_FIFO=path: the thread whose request gets number N (once)
 *                            holds it, unsent, until a writer has opened and closed the FIFO at path: the proxy
 *                            has a gap in the call order, and later requests of other threads wait behind it.
 *   NVPROXY_TEST_SOCKET_LOOK_US=n  a thread waiting for a reply that may come through its mailbox sleeps n us before
 *                            each look at its socket: the proxy answers meanwhile, that reply through the mailbox
 *                            and the next ones through the socket.
 * Calls are counted where they enter the shim (its call_entered hook).  A bad value is said in one line, and the
 * program exits (status 2) before its first call: a test must not run without the hook it asked for.
 * crash.c, the other part of this library, prints a crashing program's frames. */
#define _GNU_SOURCE
#include "test_hooks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern const char *dmtcp_get_ckpt_dir(void) __attribute__((weak));
extern int dmtcp_get_local_status(int *checkpoints, int *restarts) __attribute__((weak));
#pragma weak nvproxy_test_hooks /* (absent where this library is loaded without the shim) */

/* Is this a program under nvproxy (the shim is loaded)?  Not the launcher, nor DMTCP's tools, which inherit
 * LD_PRELOAD too. */
int nvp_hooks_attached(void) { return nvproxy_test_hooks != NULL; }

static struct nvp_shim_services shim;
static long checkpoint_at, migrate_at, pause_ms, waiters = 1, hold_request, look_us;
static const char *hold_fifo;
static atomic_int held_once;
static int only_children;
static const char *calls_out;
static atomic_long calls;

/* one line on stderr (dprintf: no stdio lock of the program's is taken) */
#define say(fmt, ...) dprintf(2, fmt "\n", ##__VA_ARGS__)

/* name's whole number (0 if unset), at least lo; a bad value ends the program */
static long number(const char *name, long lo)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*end || errno || n < lo) {
        say("nvproxy test hooks: %s=%s: expected a whole number from %ld", name, v, lo);
        _exit(2);
    }
    return n;
}

static void migrate_self(void)
{
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    const char *argv[] = {shim.python(), "-m", "nvproxy", "migrate", pid, NULL};
    char **envp = shim.env_without_shim(NULL);
    if (!envp)
        return;
    pid_t c = fork();
    if (c == 0) {
        dup2(2, 1); /* (its report is not the program's output) */
        execvpe(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    free(envp);
    int st = 0;
    if (c < 0 || waitpid(c, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        say("nvproxy: NVPROXY_MIGRATE_AT: the migration failed; going on with the same proxy");
}

static void checkpoint_here(void)
{
    /* Not dmtcp_checkpoint(): it takes DMTCP's lock exclusively, so while it waits for other threads' calls to
     * end, a host callback's wrapped call (pthread_create) waits behind it, and a call waiting for that callback
     * never ends (a deadlock with NVIDIA's simpleCallback).  The thread says where it is and waits, holding
     * nothing; the checkpoint is requested from outside (dmtcp_command -c), as a user would. */
    int checkpoints = 0, restarts = 0;
    const char *dir = dmtcp_get_ckpt_dir ? dmtcp_get_ckpt_dir() : NULL;
    if (!dmtcp_get_local_status || !dir || dmtcp_get_local_status(&checkpoints, &restarts) != 4 /* DMTCP_IS_PRESENT */) {
        say("nvproxy: NVPROXY_CHECKPOINT_AT needs DMTCP (nvproxy run --dmtcp)");
        return;
    }
    char path[4200];
    /* NVPROXY_CHECKPOINT_WAITERS processes of the computation wait (1 unless set): the first to reach their
     * calls.  The others (a program's children, which inherit the setting, and those it starts after the
     * checkpoint or the restart) go on, or they would wait for a checkpoint that never comes (NVIDIA's simpleIPC).
     * Several: all of a program's children, lest one still be receiving a descriptor another process sends
     * (DMTCP's drain of a socket's buffer reads its data and drops the descriptors passed with it: NVIDIA's
     * streamOrderedAllocationIPC, a pool's shareable handle) */
    int fd = -1;
    for (long i = 0; i < waiters && fd < 0; i++) {
        snprintf(path, sizeof path, "%s/nvproxy-call-claimed-%ld", dir, i);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return;
    close(fd);
    snprintf(path, sizeof path, "%s/nvproxy-call-reached-%d", dir, (int)shim.real_pid());
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        say("nvproxy: NVPROXY_CHECKPOINT_AT: cannot create %s: %s", path, strerror(errno));
        return;
    }
    close(fd);
    for (int c = checkpoints, r = restarts; r == restarts; dmtcp_get_local_status(&c, &r)) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL); /* (after a checkpoint: until killed; after a restart: on) */
    }
}

/* the chosen call came while its thread held checkpoints off (a staged copy, a launch: a checkpoint would wait
 * for that hold to end): the thread waits for it as the hold ends, i.e. right after that call */
static __thread int deferred;

static void hold_released(void)
{
    if (deferred) {
        deferred = 0;
        checkpoint_here();
    }
}

/* the process nvproxy run started (the others are its descendants, with proxies of their own) */
static int launched_process(void)
{
    const char *owner = getenv("NVPROXY_OWNER_PID");
    return owner && atoi(owner) == (int)shim.real_pid();
}

static void call_entered(void)
{
    long n = atomic_fetch_add(&calls, 1) + 1;
    if (n == checkpoint_at && !(only_children && launched_process())) {
        if (shim.ckpt_held())
            deferred = 1;
        else
            checkpoint_here();
    }
    if (n == migrate_at)
        migrate_self();
}

static void host_shared(void)
{
    struct timespec t = {pause_ms / 1000, pause_ms % 1000 * 1000000};
    nanosleep(&t, NULL);
}

static void socket_look(void)
{
    struct timespec t = {look_us / 1000000, look_us % 1000000 * 1000};
    nanosleep(&t, NULL);
}

static void request_numbered(uint64_t seq)
{
    if (seq != (uint64_t)hold_request || atomic_exchange(&held_once, 1))
        return;
    say("nvproxy test hooks: request %llu held", (unsigned long long)seq);
    int fd = open(hold_fifo, O_RDONLY | O_CLOEXEC); /* (returns once the test opens it to write) */
    if (fd < 0) {
        say("nvproxy test hooks: cannot open %s: %s", hold_fifo, strerror(errno));
        _exit(2);
    }
    char b;
    ssize_t r;
    do
        r = read(fd, &b, 1);
    while (r > 0 || (r < 0 && errno == EINTR));
    close(fd);
}

__attribute__((constructor)) static void attach(void)
{
    if (!nvp_hooks_attached())
        return;
    checkpoint_at = number("NVPROXY_CHECKPOINT_AT", 1);
    migrate_at = number("NVPROXY_MIGRATE_AT", 1);
    pause_ms = number("NVPROXY_TEST_PAUSE_MS", 0);
    waiters = number("NVPROXY_CHECKPOINT_WAITERS", 1);
    waiters = waiters ? waiters : 1;
    /* NVPROXY_CHECKPOINT_IN=child: only in the processes the program starts (they have proxies of their own), so
     * that the checkpoint comes while all of them run (NVIDIA's simpleIPC: its children's middle, after the parent
     * started them; a count of the parent's calls comes before that, or after a child ended) */
    const char *in = getenv("NVPROXY_CHECKPOINT_IN");
    only_children = in && !strcmp(in, "child");
    calls_out = getenv("NVPROXY_CALLS_OUT");
    hold_request = number("NVPROXY_TEST_HOLD_REQUEST", 1);
    hold_fifo = getenv("NVPROXY_TEST_HOLD_FIFO");
    look_us = number("NVPROXY_TEST_SOCKET_LOOK_US", 0);
    if (hold_request && !(hold_fifo && *hold_fifo)) {
        say("nvproxy test hooks: NVPROXY_TEST_HOLD_REQUEST needs NVPROXY_TEST_HOLD_FIFO");
        _exit(2);
    }
    struct nvp_test_hooks hooks = {call_entered, checkpoint_at > 0 ? hold_released : NULL,
                                   pause_ms > 0 ? host_shared : NULL, hold_request ? request_numbered : NULL,
                                   look_us > 0 ? socket_look : NULL};
    if (nvproxy_test_hooks(NVP_TEST_HOOKS_VERSION, &hooks, &shim) != 0) {
        say("nvproxy test hooks: the shim speaks another version of test_hooks.h");
        _exit(2);
    }
}

__attribute__((destructor)) static void write_count(void)
{
    if (!calls_out || !*calls_out)
        return;
    FILE *f = fopen(calls_out, "a"); /* (a line per process: a program's children inherit the setting) */
    if (f) {
        fprintf(f, "%ld\n", atomic_load(&calls));
        fclose(f);
    }
}
