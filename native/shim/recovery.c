/* A lost proxy: turning it into a clear error, or, with NVPROXY_RECOVER, into a new proxy restored from the last
 * image, against which the call runs again (nvp_exchange); and the restore after a DMTCP restart, which starts a
 * proxy the same way.  A file of its own: every path that talks to the proxy meets a lost one here. */
#include "transport.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int recover(int seen_gen);

/* Is pid gone (no such process, or a zombie: a SIGKILLed proxy stays one until the program, its parent, ends)? */
static int proxy_gone(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

/* A proxy that died without a word (SIGKILL) leaves its sockets; nothing else would remove them unless another
 * proxy starts later (its sweep), so the program it served does. */
static void remove_sockets_of(pid_t pid, const char *sock)
{
    if (pid <= 0 || !sock[0])
        return;
    for (int i = 0; !proxy_gone(pid); i++) { /* (its socket closes before the driver has let go of it) */
        if (i == 1000)
            return;
        usleep(1000);
    }
    char ctl[sizeof nvp_proxy.sock + 32];
    snprintf(ctl, sizeof ctl, "%s.%d.ctl", sock, (int)pid);
    unlink(ctl);
    unlink(sock);
}

cudaError_t nvp_lost(const char *why)
{
    nvp_self.broken = 1;
    if (getenv("NVPROXY_RECOVER") && *getenv("NVPROXY_RECOVER")) {
        /* the call's outermost nvp_exchange starts a new proxy from the image and runs the call again */
        if (nvp_self.fd >= 0)
            nvp_close_private(nvp_self.fd);
        nvp_self.fd = -1;
        return cudaErrorDevicesUnavailable;
    }
    pthread_mutex_lock(&nvp_proxy.lock);
    int was = nvp_proxy.state;
    nvp_proxy.state = ST_DEAD;
    pthread_mutex_unlock(&nvp_proxy.lock);
    if (was != ST_DEAD) {
        nvp_log("nvproxy: lost the proxy (%s); every CUDA call now fails with "
                "cudaErrorDevicesUnavailable",
                why);
        remove_sockets_of(nvp_proxy.proxy_pid, nvp_proxy.sock);
    }
    if (nvp_self.fd >= 0)
        nvp_close_private(nvp_self.fd);
    nvp_self.fd = -1;
    return cudaErrorDevicesUnavailable;
}

static __thread int exchange_depth; /* nvp_exchange calls under way on this thread */

cudaError_t nvp_exchange(cudaError_t (*run)(void *arg), void *arg)
{
    if (exchange_depth) /* (inside another: that one recovers, and runs the whole call again) */
        return run(arg);
    nvp_ckpt_disable();
    cudaError_t e;
    for (int attempt = 0;; attempt++) {
        int gen = nvp_self.fd >= 0 ? nvp_self.gen : atomic_load(&nvp_proxy.generation);
        nvp_self.broken = 0;
        exchange_depth++;
        e = run(arg);
        exchange_depth--;
        if (!(nvp_self.broken && attempt == 0 && recover(gen)))
            break; /* (else once more, against the new proxy) */
    }
    nvp_ckpt_enable();
    return e;
}

/* ---- recovery (NVPROXY_RECOVER=image): a new proxy from the last image ---- */

static void reshare(struct nvp_host_region *h, void *arg)
{
    int *failed = arg;
    uint64_t a[NVP_MAX_ARGS] = {h->base, h->size, h->flags};
    struct nvp_req q = {.len = sizeof q, .op = NVP_OP_HOST_REGISTER, .flags = NVP_F_REPLY};
    if (h->migrates) { /* (managed memory whose device side the image held: the host side is mapped again) */
        q.op = NVP_OP_MANAGED_ALLOC;
        a[0] = h->size, a[1] = 0, a[2] = h->base; /* (it migrates only where the proxy has one device) */
    }
    memcpy(q.a, a, sizeof q.a);
    q.seq = atomic_fetch_add(&nvp_proxy.seq, 1) + 1;
    struct iovec iov = {&q, sizeof q};
    struct nvp_reply rep = {0};
    if (nvp_write_all(nvp_self.fd, &iov, 1, h->fd) != 0) {
        nvp_log("nvproxy: sharing pinned memory at %#llx with the new proxy failed: %s",
                (unsigned long long)h->base, strerror(errno));
        *failed = 1;
    } else if (nvp_recv_reply(&rep) != cudaSuccess || rep.h.err) { /* (it may carry printf text the image held) */
        nvp_log("nvproxy: the new proxy could not map pinned memory at %#llx (error %d)", (unsigned long long)h->base,
                rep.h.err);
        *failed = 1;
    }
}

/* Start a new proxy from image and make this thread's channel go to it.
 * Called with nvp_proxy.lock held. */
static int replace_proxy(const char *image)
{
    uint64_t t0 = nvp_now_ns();
    int ok = nvp_spawn_proxy(image) == 0;
    int fd = -1;
    for (int i = 0; ok && i < 120000 && fd < 0; i++) { /* restoring the image can take a while (2 min at most) */
        fd = nvp_unix_connect(nvp_proxy.sock);
        if (fd >= 0)
            break;
        if (kill(nvp_proxy.proxy_pid, 0) != 0 && errno == ESRCH)
            ok = 0;
        struct timespec ts = {0, 1000 * 1000}; /* (the socket appears once the restore is done) */
        nanosleep(&ts, NULL);
    }
    struct nvp_rep rep;
    nvp_mailbox_drop(&nvp_self.mb);
    nvp_self.unread = 0;
    if (!ok || fd < 0 || nvp_greet(fd, NVP_CHAN_CALL, &rep, &nvp_self.mb) != 0) {
        if (fd >= 0)
            nvp_close_private(fd);
        nvp_proxy.state = ST_DEAD;
        nvp_log("nvproxy: no new proxy from %s; every CUDA call now fails with cudaErrorDevicesUnavailable", image);
        return 0;
    }
    nvp_proxy.proxy_pid = (pid_t)rep.r[2];
    nvp_proxy.state = ST_READY;
    atomic_store(&nvp_proxy.seq, 0);
    atomic_fetch_add(&nvp_proxy.generation, 1);
    nvp_staging_drop();
    if (nvp_self.fd >= 0)
        nvp_close_private(nvp_self.fd);
    nvp_self.fd = fd;
    nvp_self.last_seq = 0;
    nvp_self.gen = atomic_load(&nvp_proxy.generation);
    int failed = 0;
    nvp_host_foreach(reshare, &failed); /* pinned memory, at its addresses */
    nvp_managed_reshared();
    nvp_registry_reset();               /* modules loaded after the image are sent again */
    if (nvp_self.dev != 0) {
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)nvp_self.dev, ~0ull};
        nvp_send_req(NVP_OP_SET_DEVICE, 0, a, NULL, 0, NULL, 0, -1, 1);
    }
    if (failed)
        nvp_log("nvproxy: some pinned host memory could not be shared with the new proxy");
    /* now the proxy makes what needs that memory (graphs whose nodes copy to or from it) */
    struct nvp_req q = {.len = sizeof q, .op = NVP_OP_RESTORE_DONE, .flags = NVP_F_REPLY};
    q.seq = atomic_fetch_add(&nvp_proxy.seq, 1) + 1;
    struct iovec iov = {&q, sizeof q};
    struct nvp_reply done = {0};
    /* (nvp_recv_reply: the reply carries the kernel printf text the image held, for the program's stdout) */
    if (nvp_write_all(nvp_self.fd, &iov, 1, -1) != 0 || nvp_recv_reply(&done) != cudaSuccess) {
        nvp_proxy.state = ST_DEAD;
        nvp_log("nvproxy: the new proxy could not finish the restore from %s (error %d); every CUDA call now fails "
                "with cudaErrorDevicesUnavailable",
                image, done.h.err);
        return 0;
    }
    nvp_log("nvproxy: a new proxy started and restored %s in %.3f s", image, (double)(nvp_now_ns() - t0) / 1e9);
    return 1;
}

static int recover(int seen_gen)
{
    const char *image = getenv("NVPROXY_RECOVER");
    if (!image || !*image)
        return 0;
    pthread_mutex_lock(&nvp_proxy.lock);
    if (atomic_load(&nvp_proxy.generation) != seen_gen) { /* another thread recovered already */
        pthread_mutex_unlock(&nvp_proxy.lock);
        return 1;
    }
    nvp_log("nvproxy: the proxy is gone; starting a new one from %s. GPU work and CUDA objects created after "
            "that image are lost unless the application redoes them",
            image);
    int ok = replace_proxy(image);
    pthread_mutex_unlock(&nvp_proxy.lock);
    if (ok) /* (an application thread: it may open the callback channel for graphs' host nodes now) */
        nvp_callbacks_resume();
    return ok;
}

int nvp_restore_from(const char *image)
{
    pthread_mutex_lock(&nvp_proxy.lock);
    nvp_log("nvproxy: restarted; restoring the GPU state from %s", image);
    int ok = replace_proxy(image);
    pthread_mutex_unlock(&nvp_proxy.lock);
    return ok ? 0 : -1;
}
