/* The process's link to its proxy and each application thread's channel (a socket, its mailbox, its staging
 * buffer): opening one with its HELLO, the thread's end, a forked child, and closing them all for a DMTCP
 * checkpoint.  A file of its own: it owns the transport's state (transport.h), which the other files use. */
#include "transport.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct nvp_proxy_link nvp_proxy = {.lock = PTHREAD_MUTEX_INITIALIZER};
__thread struct nvp_thread nvp_self = {.fd = -1, .dev = 0};
static struct nvp_thread *threads; /* those with a channel, for a checkpoint to close (under nvp_proxy.lock) */
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out);

void nvp_log(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    /* write(2), not stdio: safe while other threads hold stdio locks */
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

int nvp_trace_enabled(void) { return nvp_proxy.trace; }

static void thread_exit(void *arg)
{
    (void)arg;
    /* Checkpoints held off while the link's lock is held: DMTCP freezes threads anywhere outside such a hold, and
     * the plugin's nvp_disconnect_all would then wait for that lock for ever (as in open_channel). */
    nvp_ckpt_disable();
    pthread_mutex_lock(&nvp_proxy.lock);
    for (struct nvp_thread **p = &threads; *p; p = &(*p)->next)
        if (*p == &nvp_self) {
            *p = nvp_self.next;
            break;
        }
    pthread_mutex_unlock(&nvp_proxy.lock);
    nvp_staging_thread_end(); /* (kept before the channel closes: the proxy hands it over either way) */
    /* closed inside the hold too: once unlisted, a channel that a checkpoint came upon stays open through it, and
     * after a restart its number may name another thread's new channel, which this close would cut (found by
     * reading, while chasing "lost the proxy (Bad file descriptor)" after restarts on GPUs: see remake_memfd) */
    if (nvp_self.fd >= 0)
        nvp_close_private(nvp_self.fd);
    nvp_self.fd = -1;
    nvp_ckpt_enable();
    nvp_staging_drop();
    nvp_mailbox_drop(&nvp_self.mb);
}

static void after_fork_child(void)
{
    /* A forked child must never talk over its parent's channels: it gets a
     * proxy of its own on its first CUDA call. */
    pthread_mutex_init(&nvp_proxy.lock, NULL);
    nvp_parcopy_after_fork();
    nvp_proxy.state = ST_INIT;
    threads = NULL;
    atomic_store(&nvp_proxy.seq, 0); /* the new proxy expects the sequence from 1 */
    if (nvp_self.fd >= 0)
        nvp_close_private(nvp_self.fd);
    nvp_self.fd = -1;
    nvp_self.stg.base = NULL;
    nvp_mailbox_drop(&nvp_self.mb); /* (shared with the parent's channel: never written here) */
    nvp_staging_drop_spares(); /* the parent's proxy's buffers */
}

static void make_key(void)
{
    pthread_key_create(&nvp_proxy.key, thread_exit);
    pthread_atfork(NULL, NULL, after_fork_child);
    nvp_proxy.trace = getenv("NVPROXY_TRACE") != NULL;
}

/* mbfd: a mailbox's memfd for the proxy, or -1 */
static int hello(int fd, int kind, struct nvp_rep *rep, int mbfd)
{
    struct nvp_req h = {.len = sizeof h, .op = NVP_OP_HELLO, .flags = NVP_F_REPLY, .seq = 0};
    h.a[0] = (uint64_t)nvp_real_pid();
    h.a[1] = (uint64_t)syscall(SYS_gettid);
    h.a[2] = NVP_PROTO_VERSION;
    h.a[3] = (uint64_t)kind;
    h.a[4] = mbfd >= 0 ? NVP_HELLO_MAILBOX : 0;
    struct iovec iov = {&h, sizeof h};
    if (nvp_write_all(fd, &iov, 1, mbfd) != 0)
        return -1;
    if (nvp_read_all(fd, rep, sizeof *rep) != 0)
        return -1;
    if (rep->len != sizeof *rep || rep->err != 0)
        return -1;
    return 0;
}

/* The HELLO of a new channel, with a new mailbox for it where mb_out is given (*mb_out: NULL if none could be
 * made, or the HELLO failed).  0, or -1. */
int nvp_greet(int fd, int kind, struct nvp_rep *rep, struct nvp_mailbox **mb_out)
{
    int mbfd = -1;
    struct nvp_mailbox *mb = mb_out ? nvp_mailbox_new(&mbfd) : NULL;
    int r = hello(fd, kind, rep, mbfd);
    if (mbfd >= 0)
        close(mbfd); /* (the proxy has its own descriptor now; the mapping stays) */
    if (r != 0)
        nvp_mailbox_drop(&mb);
    if (mb_out)
        *mb_out = mb;
    return r;
}

int nvp_open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out)
{
    /* DMTCP's lock before the link's: the callback channel's socket() is a DMTCP wrapper that takes it (the call
     * channels' sockets bypass DMTCP: nvp_socket_connect); had this thread waited for it there while holding the
     * link's lock, a checkpoint would freeze it so, and the plugin's nvp_disconnect_all would wait for that lock for
     * ever (seen with tests/apps/callback_threads).  Also while the proxy is still to be started (its start is a
     * raw fork that DMTCP's lock does not see): a checkpoint that froze a thread halfway through its HELLO would let
     * it go on after the restart over a descriptor number that no longer names its socket. */
    nvp_ckpt_disable();
    int fd = open_channel(kind, rep_out, mb_out);
    nvp_ckpt_enable();
    return fd;
}

static int open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out)
{
    pthread_once(&key_once, make_key);
    pthread_mutex_lock(&nvp_proxy.lock);
    for (int i = 0; nvp_proxy.state == ST_PAUSED && i < 120000; i++) { /* a checkpoint or restart is under way */
        pthread_mutex_unlock(&nvp_proxy.lock);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&nvp_proxy.lock);
    }
    if (nvp_proxy.state == ST_DEAD) {
        pthread_mutex_unlock(&nvp_proxy.lock);
        return -1;
    }
    int fd;
    if (nvp_proxy.state == ST_INIT) {
        fd = nvp_proxy_first_channel();
        if (fd < 0) {
            nvp_proxy.state = ST_DEAD;
            pthread_mutex_unlock(&nvp_proxy.lock);
            return -1;
        }
    } else {
        fd = nvp_socket_connect(nvp_proxy.sock, kind != NVP_CHAN_CALLBACK);
    }
    pthread_mutex_unlock(&nvp_proxy.lock);
    struct nvp_rep rep;
    if (mb_out)
        *mb_out = NULL;
    if (fd < 0 || nvp_greet(fd, kind, &rep, mb_out) != 0) {
        if (fd >= 0)
            nvp_socket_close(fd, kind != NVP_CHAN_CALLBACK);
        return -1;
    }
    pthread_mutex_lock(&nvp_proxy.lock);
    if (nvp_proxy.state == ST_INIT) {
        nvp_proxy.ndev = (int)rep.r[0];
        nvp_proxy.backend = (int)rep.r[1];
        nvp_proxy.proxy_pid = (pid_t)rep.r[2];
        nvp_proxy.driver_version = (int)rep.r[3];
        nvp_proxy.state = ST_READY;
    }
    pthread_mutex_unlock(&nvp_proxy.lock);
    if (rep_out)
        *rep_out = rep;
    return fd;
}

static cudaError_t connect_held(void)
{
    if (nvp_self.fd >= 0) { /* a new proxy replaced the one this channel went to (NVPROXY_RECOVER) */
        nvp_close_private(nvp_self.fd);
        nvp_self.fd = -1;
    }
    /* the old channel's buffers: a checkpoint closed it, the proxy was lost (nvp_lost leaves them mapped, as
     * helper threads may still be copying into the staging buffer), or a new proxy replaced its proxy */
    nvp_staging_drop();
    nvp_mailbox_drop(&nvp_self.mb);
    if (nvp_proxy.state == ST_DEAD)
        return cudaErrorDevicesUnavailable;
    struct nvp_mailbox *mb;
    int fd = nvp_open_channel(NVP_CHAN_CALL, NULL, &mb);
    if (fd < 0)
        return nvp_lost("no connection");
    nvp_self.fd = fd;
    nvp_self.mb = mb;
    nvp_self.unread = 0;
    nvp_self.last_seq = 0;
    nvp_self.gen = atomic_load(&nvp_proxy.generation);
    pthread_setspecific(nvp_proxy.key, &nvp_self);
    pthread_mutex_lock(&nvp_proxy.lock);
    int known = 0;
    for (struct nvp_thread *t = threads; t; t = t->next)
        known |= t == &nvp_self;
    if (!known) {
        nvp_self.next = threads;
        threads = &nvp_self;
    }
    pthread_mutex_unlock(&nvp_proxy.lock);
    if (nvp_self.dev != 0) {
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)nvp_self.dev, ~0ull};
        return nvp_call(NVP_OP_SET_DEVICE, a, NULL, 0, NULL, -1);
    }
    return cudaSuccess;
}

static cudaError_t connect_once(void *arg)
{
    (void)arg;
    if (nvp_self.fd >= 0 && nvp_self.gen == atomic_load(&nvp_proxy.generation))
        return cudaSuccess;
    if (nvp_self.broken) /* (lost during this call: nothing more goes out before the outermost exchange recovers) */
        return cudaErrorDevicesUnavailable;
    cudaError_t e = nvp_settings_error(); /* (a bad setting: no proxy, no channel) */
    if (e)
        return e;
    /* Opened and listed under one hold (and the link's lock, see thread_exit; nvp_exchange holds checkpoints off):
     * a checkpoint in between would leave a channel that nvp_disconnect_all cannot see, and after the restart its
     * stale number may name another thread's new channel, which this thread would close as its own (found by
     * reading). */
    return connect_held();
}

cudaError_t nvp_connect(void)
{
    if (nvp_self.fd >= 0 && nvp_self.gen == atomic_load(&nvp_proxy.generation))
        return cudaSuccess;
    return nvp_exchange(connect_once, NULL);
}

/* ---- DMTCP (dmtcp.c decides when) ---- */

const char *nvp_control_path(void)
{
    static char path[sizeof nvp_proxy.sock + 32];
    if (nvp_proxy.state != ST_READY || nvp_proxy.proxy_pid <= 0)
        return NULL;
    snprintf(path, sizeof path, "%s.%d.ctl", nvp_proxy.sock, (int)nvp_proxy.proxy_pid);
    return path;
}

void nvp_disconnect_all(void)
{
    /* application threads are frozen, none inside a call (nvp_callv holds the
     * checkpoint off); their channels are closed under them */
    pthread_mutex_lock(&nvp_proxy.lock);
    for (struct nvp_thread *t = threads; t; t = t->next) {
        if (t->fd >= 0)
            nvp_close_private(t->fd);
        t->fd = -1;
        nvp_staging_unmap(&t->stg);
        /* (a new channel brings a new one; DMTCP would bring it back through a file at its memfd's name in "/",
         * which only root may make: see nvp_host_fd) */
        nvp_mailbox_drop(&t->mb);
    }
    threads = NULL;
    nvp_staging_drop_spares(); /* (the proxy let go of them in the checkpoint) */
    nvp_callbacks_close();
    if (nvp_proxy.state == ST_READY)
        nvp_proxy.state = ST_PAUSED;
    atomic_fetch_add(&nvp_proxy.generation, 1); /* the callback thread starts again on next use */
    pthread_mutex_unlock(&nvp_proxy.lock);
}

void nvp_reconnect_same_proxy(void)
{
    pthread_mutex_lock(&nvp_proxy.lock);
    if (nvp_proxy.state == ST_PAUSED)
        nvp_proxy.state = ST_READY;
    pthread_mutex_unlock(&nvp_proxy.lock);
}

cudaError_t nvp_enter(void)
{
    if (nvp_test.call_entered) /* (tests only: a load and a branch otherwise) */
        nvp_test.call_entered();
    /* After a DMTCP restart, until the new proxy is up: also a thread whose calls fail at once (a broken
     * context), lest it run on to the program's exit while the restoring thread starts the proxy (that exit
     * and DMTCP's fork deadlocked when the start went through DMTCP's fork: printf_assert's device assert,
     * checkpointed at its fifth call). */
    nvp_wait_for_restore();
    /* a sticky error first, as natively: every call returns it, whatever became of the proxy (after a restart of
     * a broken context, of which no image could be taken, there is none) */
    cudaError_t e = nvp_sticky_error();
    return e ? e : nvp_connect();
}

int nvp_device_count(void) { return nvp_connect() ? 0 : nvp_proxy.ndev; }
int nvp_generation(void) { return atomic_load(&nvp_proxy.generation); }
int nvp_driver_version(void) { return nvp_connect() ? 0 : nvp_proxy.driver_version; }
int nvp_backend_is_sim(void) { return nvp_proxy.backend == 1; }
int nvp_current_device(void) { return nvp_self.dev; }
void nvp_set_current_device(int dev) { nvp_self.dev = dev; }

cudaError_t nvp_unsupported(const char *call)
{
    nvp_log("nvproxy: %s is not supported by nvproxy; returning cudaErrorNotSupported", call);
    return nvp_ret(cudaErrorNotSupported);
}
