/* Hooks that make a mid-run checkpoint of a short program deterministic (the tests of public samples):
 *   NVPROXY_CHECKPOINT_AT=N  under DMTCP, as its Nth CUDA call begins (or right after it, where the call holds
 *                            checkpoints off) the thread creates nvproxy-call-reached-<pid> in the checkpoint
 *                            directory and waits: the test checkpoints (dmtcp_command -c) and kills the program,
 *                            restarts it from the images, and there the thread goes on (in a computation of
 *                            several processes, the first to reach its Nth call: dmtcp.c);
 *                            NVPROXY_CHECKPOINT_IN=child: only in the processes the program starts;
 *                            NVPROXY_CHECKPOINT_WAITERS=k: the first k processes to reach their Nth calls wait;
 *   NVPROXY_MIGRATE_AT=N     `nvproxy migrate` moves it to a new proxy then, and it goes on;
 *   NVPROXY_CALLS_OUT=path   the number of calls made is added there at exit, a line per process (to choose N).
 *   NVPROXY_TEST_PAUSE_MS=n  cudaHostAlloc sleeps n ms once the proxy has the memory, before the shim lists it
 *                            (a checkpoint must not come in between: tests/apps/pinned_at_checkpoint.cu).
 * Calls are counted where they enter the shim (nvp_enter); off, this costs one load and branch per call. */
#include "shim.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long checkpoint_at, migrate_at;
static int only_children;
static const char *calls_out;
static atomic_long calls;
int nvp_hooks_armed;

__attribute__((constructor)) static void read_settings(void)
{
    const char *c = getenv("NVPROXY_CHECKPOINT_AT"), *m = getenv("NVPROXY_MIGRATE_AT");
    checkpoint_at = c && *c ? atol(c) : 0;
    /* NVPROXY_CHECKPOINT_IN=child: only in the processes the program starts (they have proxies of their own), so
     * that the checkpoint comes while all of them run (NVIDIA's simpleIPC: its children's middle, after the parent
     * started them; a count of the parent's calls comes before that, or after a child ended) */
    const char *in = getenv("NVPROXY_CHECKPOINT_IN");
    only_children = in && !strcmp(in, "child");
    migrate_at = m && *m ? atol(m) : 0;
    calls_out = getenv("NVPROXY_CALLS_OUT");
    nvp_hooks_armed = checkpoint_at > 0 || migrate_at > 0 || (calls_out && *calls_out);
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

static void migrate_self(void)
{
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    const char *argv[] = {nvp_python(), "-m", "nvproxy", "migrate", pid, NULL};
    char **envp = nvp_env_without_shim(NULL);
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
        nvp_log("nvproxy: NVPROXY_MIGRATE_AT: the migration failed; going on with the same proxy");
}

/* the chosen call came while its thread held checkpoints off (a staged copy, a launch: a checkpoint would wait
 * for that hold to end): the thread waits for it as the hold ends, i.e. right after that call */
static __thread int deferred;

void nvp_call_hooks_released(void)
{
    if (deferred) {
        deferred = 0;
        nvp_dmtcp_checkpoint_here();
    }
}

/* the process nvproxy run started (the others are its descendants, with proxies of their own) */
static int launched_process(void)
{
    const char *owner = getenv("NVPROXY_OWNER_PID");
    return owner && atoi(owner) == (int)nvp_real_pid();
}

void nvp_call_hooks(void)
{
    long n = atomic_fetch_add(&calls, 1) + 1;
    if (n == checkpoint_at && !(only_children && launched_process())) {
        if (nvp_ckpt_held())
            deferred = 1;
        else
            nvp_dmtcp_checkpoint_here();
    }
    if (n == migrate_at)
        migrate_self();
}

void nvp_test_pause(void)
{
    static long ms = -1;
    if (ms < 0) {
        const char *v = getenv("NVPROXY_TEST_PAUSE_MS");
        ms = v && *v ? atol(v) : 0;
    }
    if (ms > 0) {
        struct timespec t = {ms / 1000, ms % 1000 * 1000000};
        nanosleep(&t, NULL);
    }
}
