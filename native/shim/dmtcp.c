/* The DMTCP plugin: the same libnvproxy.so, loaded with
 * `dmtcp_launch --with-plugin`.  Without DMTCP nothing here runs.
 *
 *   PRESUSPEND     the proxy lets the device's work finish while the application's
 *                  threads still run: host callbacks (stream callbacks, host nodes)
 *                  run on them, and one that makes a DMTCP-wrapped call (pthread_create
 *                  in NVIDIA's simpleCallback) would wait for DMTCP's lock, which
 *                  the checkpoint holds from here on: a drain only at PRECHECKPOINT
 *                  waited for it for ever
 *   PRECHECKPOINT  the proxy lets the device's work finish (what was submitted
 *                  since PRESUSPEND: little); once every process
 *                  of the computation has (a global barrier: they may share
 *                  device memory), it writes an image of the GPU state into
 *                  DMTCP's checkpoint directory; the shim closes its sockets
 *                  (sockets to a process outside DMTCP do not survive a restart)
 *   RESUME         threads reconnect to the same proxy on their next call
 *   RESTART        remember to bring the GPU state back, and read the restart's
 *                  own environment for NVPROXY_DEVICES (the GPUs to restart on,
 *                  as CUDA_VISIBLE_DEVICES; the application's environment is the
 *                  one restored from the checkpoint) ...
 *   RUNNING        ... here, where starting a process is safe: a new proxy
 *                  (outside DMTCP, through dmtcp_nocheckpoint) restores the image
 *
 * The image goes into DMTCP's checkpoint directory unless NVPROXY_IMAGE_DIR
 * names another (a tmpfs, say, when the node keeps it until the restart).
 *
 * DMTCP's plugin interface (API version 3, DMTCP 4.2) is declared here rather
 * than included, so the shim builds where DMTCP is not installed. */
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { EV_PRESUSPEND = 15, EV_PRECHECKPOINT = 16, EV_RESUME = 17, EV_RESTART = 18, EV_RUNNING = 19 };

struct dmtcp_descriptor {
    const char *api_version, *dmtcp_version, *name, *author, *email, *description;
    void (*hook)(int event, void *data);
};

extern void dmtcp_register_plugin(struct dmtcp_descriptor) __attribute__((weak));
extern const char *dmtcp_get_ckpt_dir(void) __attribute__((weak));
extern int dmtcp_plugin_disable_ckpt(void) __attribute__((weak));
extern void dmtcp_plugin_enable_ckpt(void) __attribute__((weak));
extern void *dmtcp_dlsym(void *handle, const char *symbol) __attribute__((weak));
extern int dmtcp_get_restart_env(const char *name, char *value, size_t maxlen) __attribute__((weak));
extern void dmtcp_global_barrier(const char *barrier) __attribute__((weak));

/* in application memory, so that DMTCP saves it: where the image went, and its id (a restart refuses any other
 * image at that path: one written after DMTCP's own image may be missing, or an earlier checkpoint's) */
static char image_path[4096];
static char image_id[40];
#define UNWRITTEN "unwritten" /* the id of a checkpoint whose GPU image was not written: a restart refuses it */
static int restarted, restoring;
static char restart_devices[256];
/* a checkpoint whose image is still being written when DMTCP writes its own: the proxy's answer comes here
 * (NVPROXY_DMTCP_OVERLAP=write: RESUME waits for it; -1: none to wait for) */
static int image_answer_fd = -1;

const char *nvp_restart_devices(void) { return restart_devices[0] ? restart_devices : NULL; }

const char *nvp_restart_image_id(void) { return restoring && image_id[0] ? image_id : NULL; }

/* From RESTART until the new proxy is up, application threads wait here, before
 * they take DMTCP's checkpoint lock: the restoring thread forks the proxy, and
 * DMTCP's fork waits for every holder of that lock (a thread holding it while
 * waiting for the restore deadlocked the restart). */
static pthread_mutex_t restore_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t restore_cv = PTHREAD_COND_INITIALIZER;
static int restore_pending;
static pthread_t restorer;

static int must_wait(void)
{
    return __atomic_load_n(&restore_pending, __ATOMIC_ACQUIRE) && !pthread_equal(restorer, pthread_self());
}

static void wait_for_restore(void)
{
    if (must_wait()) { /* (a load and a branch, but while a restore is on) */
        pthread_mutex_lock(&restore_mu);
        while (must_wait())
            pthread_cond_wait(&restore_cv, &restore_mu);
        pthread_mutex_unlock(&restore_mu);
    }
}

static void set_restore_pending(int on)
{
    pthread_mutex_lock(&restore_mu);
    restorer = pthread_self();
    __atomic_store_n(&restore_pending, on, __ATOMIC_RELEASE);
    if (!on)
        pthread_cond_broadcast(&restore_cv);
    pthread_mutex_unlock(&restore_mu);
}

/* From PRESUSPEND until RESUME or RUNNING, work that calls back into the program (host functions, graph
 * launches) waits before it is submitted.  The PRESUSPEND drain runs the callbacks of what was submitted before
 * (the program's threads still run); one submitted after it would fall due in PRECHECKPOINT's drain, when the
 * program's threads (its callback thread too) are frozen: on a GPU the driver would wait for that callback, and
 * the drain for the driver, for ever (on sim the proxy's thread that sends it).  The callback thread itself is
 * not held (the drain may be waiting for it). */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_closed, gate_inflight;

void nvp_callback_gate_enter(void)
{
    if (!dmtcp_register_plugin || nvp_ckpt_held()) /* (inside a call that holds checkpoints off: none comes) */
        return;
    pthread_mutex_lock(&gate_mu);
    while (gate_closed && !nvp_on_callback_thread())
        pthread_cond_wait(&gate_cv, &gate_mu);
    gate_inflight++;
    pthread_mutex_unlock(&gate_mu);
}

void nvp_callback_gate_leave(void)
{
    if (!dmtcp_register_plugin || nvp_ckpt_held())
        return;
    pthread_mutex_lock(&gate_mu);
    if (--gate_inflight == 0)
        pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static void set_gate(int closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    while (closed && gate_inflight) /* (submissions under way are sent before the drain) */
        pthread_cond_wait(&gate_cv, &gate_mu);
    if (!closed)
        pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* how deep this thread is in nvp_ckpt_disable: a test's checkpoint at a chosen call waits only at 0 (the
 * checkpoint waits for the lock this thread holds: it deadlocked inside a staged cudaMemcpy) */
static __thread int held;

int nvp_ckpt_held(void) { return held; }

void nvp_wait_for_restore(void)
{
    if (!held) /* (a thread holding DMTCP's lock would keep the restoring thread's fork waiting) */
        wait_for_restore();
}

void nvp_ckpt_disable(void)
{
    if (!dmtcp_plugin_disable_ckpt)
        return;
    held++;
    for (;;) {
        wait_for_restore();
        dmtcp_plugin_disable_ckpt();
        if (!must_wait()) /* (a restart can come between the check and the lock) */
            return;
        dmtcp_plugin_enable_ckpt();
    }
}

void nvp_ckpt_enable(void)
{
    if (!dmtcp_plugin_enable_ckpt)
        return;
    dmtcp_plugin_enable_ckpt();
    if (--held == 0 && nvp_test.hold_released)
        nvp_test.hold_released();
}

int nvp_under_dmtcp(void) { return dmtcp_register_plugin != NULL; }

/* One request on the proxy's control socket (the format of proxy/control.py: u32 JSON length, u64 blob length,
 * u32 fd batches, then the JSON): the connection, -1 where it could not be sent. */
static int control_send(const char *ctl, const char *json)
{
    int fd = nvp_unix_connect(ctl);
    if (fd < 0)
        return -1;
    uint32_t jl = (uint32_t)strlen(json), batches = 1;
    uint64_t bl = 0;
    unsigned char head[16];
    memcpy(head, &jl, 4);
    memcpy(head + 4, &bl, 8);
    memcpy(head + 12, &batches, 4);
    if (nvp_send_full(fd, head, sizeof head) != 0 || nvp_send_full(fd, json, jl) != 0) {
        nvp_close_private(fd);
        return -1;
    }
    return fd;
}

/* The proxy's next message on fd, its JSON (cut to cap - 1 bytes) in out; 0, or -1 at the connection's end */
static int control_read(int fd, char *out, size_t cap)
{
    unsigned char head[16];
    if (nvp_read_full(fd, head, sizeof head) != 0)
        return -1;
    uint32_t jl;
    uint64_t bl;
    memcpy(&jl, head, 4);
    memcpy(&bl, head + 4, 8);
    size_t got = 0;
    for (uint64_t left = jl + bl; left;) { /* (the JSON, as far as it fits; the rest, and any blob, read past) */
        char sink[512], *to = got < cap - 1 ? out + got : sink;
        size_t room = got < cap - 1 ? cap - 1 - got : sizeof sink;
        size_t n = left < room ? (size_t)left : room;
        if (nvp_read_full(fd, to, n) != 0)
            return -1;
        if (to != sink)
            got += n;
        left -= n;
    }
    out[got < jl ? got : jl] = 0;
    return 0;
}

/* One request and its answer: 0 where the answer says "ok": true */
static int control_request(const char *ctl, const char *json)
{
    char rep[4096];
    int fd = control_send(ctl, json);
    if (fd < 0)
        return -1;
    int r = control_read(fd, rep, sizeof rep);
    nvp_close_private(fd);
    return r == 0 && strstr(rep, "\"ok\": true") ? 0 : -1;
}

/* the value of "image_id" in a proxy's answer into image_id (UNWRITTEN where it has none that fits) */
static void take_image_id(const char *json)
{
    const char *p = strstr(json, "\"image_id\": \"");
    size_t n = p ? strcspn(p += 13, "\"") : 0;
    if (!n || n >= sizeof image_id) {
        strcpy(image_id, UNWRITTEN);
        return;
    }
    memcpy(image_id, p, n);
    image_id[n] = 0;
}

/* the proxy lets the device's work finish (ctl: its control socket; NULL before the first call: nothing to do) */
static void drain(const char *ctl)
{
    if (ctl && control_request(ctl, "{\"cmd\": \"drain\"}") != 0)
        nvp_log("nvproxy: the proxy could not finish the device's work before the checkpoint");
}

static void precheckpoint(void)
{
    const char *ctl = nvp_control_path();
    /* Processes may share device memory (CUDA IPC): each lets its device work finish, and none saves its
     * memory before every one has (another's kernels may still be writing it).  Every process of the
     * computation loads this plugin, so every one passes the barrier, with CUDA or without. */
    drain(ctl);
    if (dmtcp_global_barrier)
        dmtcp_global_barrier("nvproxy:drained");
    if (!ctl) /* no CUDA call yet: nothing on the GPU */
        return;
    const char *dir = getenv("NVPROXY_IMAGE_DIR");
    if (!dir || !*dir)
        dir = dmtcp_get_ckpt_dir ? dmtcp_get_ckpt_dir() : ".";
    snprintf(image_path, sizeof image_path, "%s/nvproxy-%d.img", dir && *dir ? dir : ".", (int)nvp_real_pid());
    char json[4400], rep[4096];
    /* (disconnect: the proxy lets go of the channels' staging buffers, which nvp_disconnect_all drops here) */
    snprintf(json, sizeof json, "{\"cmd\": \"checkpoint\", \"image\": \"%s\", \"disconnect\": true}", image_path);
    strcpy(image_id, UNWRITTEN); /* (until the proxy says otherwise) */
    int fd = control_send(ctl, json);
    if (fd < 0 || control_read(fd, rep, sizeof rep) != 0) {
        nvp_log("nvproxy: the proxy could not write %s; a restart from this checkpoint will fail", image_path);
    } else if (strstr(rep, "\"notice\": \"captured\"")) {
        /* the device memory is in the proxy's buffer, and the file is written while DMTCP writes (and, unless
         * held, after the program resumes; the proxy says it if it fails) */
        take_image_id(rep);
        if (strstr(rep, "\"hold\": true")) {
            image_answer_fd = fd;
            fd = -1;
        }
    } else if (strstr(rep, "\"ok\": true")) {
        take_image_id(rep);
    } else {
        nvp_log("nvproxy: the proxy could not write %s; a restart from this checkpoint will fail", image_path);
    }
    if (fd >= 0)
        nvp_close_private(fd);
    nvp_disconnect_all();
}

/* NVPROXY_DMTCP_OVERLAP=write: the program resumes once its GPU image is written too */
static void wait_for_image(void)
{
    if (image_answer_fd < 0)
        return;
    char rep[4096];
    if (control_read(image_answer_fd, rep, sizeof rep) != 0) /* (a write that failed: the proxy said it) */
        nvp_log("nvproxy: lost the proxy while it wrote %s; a restart from this checkpoint will fail", image_path);
    nvp_close_private(image_answer_fd);
    image_answer_fd = -1;
}

/* glibc's cached program break (exported by glibc for its own libraries) */
extern void *__curbrk __attribute__((weak));

/* After a restart the kernel's program break is the restart program's, while glibc's cached one came back with the
 * application's memory.  Where the kernel's lies above glibc's, glibc's next sbrk() "succeeds" with no memory behind
 * it (brk() below the kernel's heap changes nothing, and glibc takes any answer at or above what it asked for), and
 * malloc writes into the PROT_NONE area DMTCP keeps after the heap: the program dies in malloc at its first
 * allocation after the restart that grows the heap (python3, not position-independent, has its heap low enough
 * for this: a PyTorch training run died so).  glibc made to see the kernel's break takes its
 * next sbrk() from there, apart from the old heap, as after any other caller's sbrk().  (A kernel's break below
 * glibc's is harmless, glibc's sbrk() then fails and malloc maps memory instead; and glibc aborts on a break that
 * moved down under its heap.) */
static void sync_program_break(void)
{
    void *kernel = (void *)syscall(SYS_brk, 0);
    if (&__curbrk && (uintptr_t)kernel > (uintptr_t)__curbrk)
        __curbrk = kernel;
}

static void hook(int event, void *data)
{
    (void)data;
    switch (event) {
    case EV_PRESUSPEND:
        set_gate(1);
        drain(nvp_control_path());
        break;
    case EV_PRECHECKPOINT:
        precheckpoint();
        break;
    case EV_RESUME:
        wait_for_image();
        nvp_reconnect_same_proxy();
        set_gate(0);
        break;
    case EV_RESTART:
        sync_program_break();
        restarted = 1;
        image_answer_fd = -1; /* (the number DMTCP saved names nothing of the restarted process's) */
        set_restore_pending(1);
        nvp_remake_pinned(); /* (threads are frozen until RUNNING) */
        nvp_callbacks_restarted();
        restart_devices[0] = 0;
        if (dmtcp_get_restart_env && dmtcp_get_restart_env("NVPROXY_DEVICES", restart_devices,
                                                           sizeof restart_devices) != 0)
            restart_devices[0] = 0;
        break;
    case EV_RUNNING:
        if (restarted) {
            restarted = 0;
            restoring = 1;
            if (image_path[0]) /* (a failure is said by the restore itself) */
                nvp_restore_from(image_path);
            restoring = 0;
            set_restore_pending(0);
            set_gate(0);
        }
        break;
    default: /* every other event is DMTCP's business */
        break;
    }
}

static struct dmtcp_descriptor descriptor = {
    "3", "4.2.0", "nvproxy", "nvproxy", "", "CUDA through a proxy process: GPU state in and out of checkpoints",
    hook,
};

NVP_EXPORT void dmtcp_initialize_plugin(void)
{
    if (dmtcp_register_plugin)
        dmtcp_register_plugin(descriptor);
    /* the next plugin in the chain; DMTCP's own lookup knows where "next" is */
    void *sym = dmtcp_dlsym ? dmtcp_dlsym(RTLD_NEXT, "dmtcp_initialize_plugin") : dlsym(RTLD_NEXT, "dmtcp_initialize_plugin");
    void (*next)(void) = (void (*)(void))sym;
    if (next)
        next();
}
