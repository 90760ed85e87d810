/* The shim's one interface to its test-only companion library (tests/hooks/, built by the tests and preloaded beside
 * the shim): hooks that let a test checkpoint or migrate a program at a chosen CUDA call, or hold a call at a chosen
 * point.  The shim exports nvproxy_test_hooks(), which the companion calls from its constructor to install its
 * hooks and learn the few services of the shim it uses.  Without the companion each hook costs a load and a branch,
 * and nothing else of the tests' is in the shim. */
#ifndef NVP_TEST_HOOKS_H
#define NVP_TEST_HOOKS_H

#include <stdint.h>
#include <sys/types.h>

#define NVP_TEST_HOOKS_VERSION 3

struct nvp_test_hooks { /* each may be NULL */
    void (*call_entered)(void);  /* a CUDA call enters the shim, before it waits for a restore or connects */
    void (*hold_released)(void); /* this thread's outermost checkpoint hold ended (under DMTCP only) */
    void (*host_shared)(void);   /* cudaHostAlloc: the proxy has mapped the new memory, the shim not listed it yet */
    void (*request_numbered)(uint64_t seq); /* a request has its number in the call order, and is not sent yet */
    void (*socket_look)(void); /* a thread waiting for a reply that may come through its mailbox reads its socket */
};

struct nvp_shim_services {
    int (*ckpt_held)(void);                          /* this thread holds checkpoints off (under DMTCP only) */
    pid_t (*real_pid)(void);                         /* this process's pid outside DMTCP's virtual ones */
    const char *(*python)(void);                     /* the Python that runs nvproxy */
    char **(*env_without_shim)(const char *visible); /* environ less LD_PRELOAD and the like (calloc'ed) */
};

/* Installs hooks (copied) and fills *services: 0, or -1 (nothing done) if version is not NVP_TEST_HOOKS_VERSION. */
int nvproxy_test_hooks(int version, const struct nvp_test_hooks *hooks, struct nvp_shim_services *services);

#endif
