/* A call channel's mailbox (nvproxy_wire.h): a page of shared memory where the proxy leaves replies for a thread
 * spinning on it, and a slot where the thread posts a small request to a proxy polling it.  A file of its own: the
 * mailbox is an optional shortcut beside the socket, and every rule of its handshakes is here. */
#include "transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct nvp_mailbox) == NVP_MAILBOX_BYTES, "the mailbox is one page");
_Static_assert(sizeof(((struct nvp_mailbox *)0)->req) == NVP_MB_REQ_MAX, "NVP_MB_REQ_MAX");

/* A mailbox for a new call channel (nvproxy_wire.h), and its memfd for the HELLO; NULL where none can be made
 * (the channel's replies then all come over its socket).  Sealed against shrinking: a proxy that touched a page
 * beyond the end of a shrunken file would die of SIGBUS. */
struct nvp_mailbox *nvp_mailbox_new(int *fd_out)
{
    *fd_out = -1;
    if (nvp_debug(NVP_DEBUG_NO_MAILBOX))
        return NULL;
    int fd = nvp_memfd_sealable("nvproxy-mailbox");
    if (fd < 0)
        return NULL;
    void *p = MAP_FAILED;
    if (ftruncate(fd, NVP_MAILBOX_BYTES) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        p = mmap(NULL, NVP_MAILBOX_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return p;
}

void nvp_mailbox_drop(struct nvp_mailbox **mb)
{
    if (*mb)
        munmap(*mb, NVP_MAILBOX_BYTES);
    *mb = NULL;
}

/* The reply the proxy left in the mailbox, if there is one. */
int nvp_mailbox_take(struct nvp_mailbox *mb, void *buf)
{
    if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != NVP_MB_FULL)
        return 0;
    memcpy(buf, &mb->rep, sizeof mb->rep);
    __atomic_store_n(&mb->state, NVP_MB_EMPTY, __ATOMIC_RELEASE);
    return 1;
}

/* Wait until the mailbox's slot no longer holds an earlier request (the proxy takes it within its work on the
 * message before; one that died is noticed by its socket's hang-up).  0, or -1 if the proxy is gone. */
static int slot_waiters; /* threads in nvp_mailbox_slot_free */

int nvp_mailbox_slot_free(struct nvp_mailbox *mb)
{
    if (__atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) != NVP_SLOT_POSTED)
        return 0;
    uint64_t start = 0;
    /* Several threads waiting at once (a launch storm) yield their cores between looks: spinning, they take the
     * cores the proxy's launch workers need to free their slots (benchmarks/probes/launch_workers.cu: 4 workers
     * beside 12 spinning threads issued launches 2.6 times slower than beside 4). */
    int crowd = __atomic_fetch_add(&slot_waiters, 1, __ATOMIC_RELAXED) >= 2;
    int rc = 0;
    for (unsigned i = 0; __atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) == NVP_SLOT_POSTED; i++) {
        nvp_cpu_relax();
        if (crowd && i % 64 == 63)
            sched_yield();
        if (i % 1024 != 1023)
            continue;
        uint64_t t = nvp_now_ns();
        if (!start)
            start = t;
        else if (t - start > 1000000) { /* (a millisecond: look at the socket, and stop burning the core) */
            struct pollfd pf = {.fd = nvp_self.fd, .events = POLLRDHUP};
            if (poll(&pf, 1, 0) > 0 && pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                rc = -1;
                break;
            }
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    __atomic_fetch_sub(&slot_waiters, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Post a request through the mailbox's slot (nvproxy_wire.h): 1, or 0 if the proxy is not polling the slot and
 * it must go over the socket. */
int nvp_mailbox_post(struct nvp_mailbox *mb, const struct iovec *iov, int n, size_t total)
{
    if (__atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) != NVP_SLOT_OPEN)
        return 0;
    uint8_t *p = mb->req;
    for (int i = 0; i < n; i++) {
        memcpy(p, iov[i].iov_base, iov[i].iov_len);
        p += iov[i].iov_len;
    }
    mb->slot_len = (uint32_t)total;
    uint32_t open = NVP_SLOT_OPEN; /* (closed meanwhile: what was written there is ignored) */
    return __atomic_compare_exchange_n(&mb->slot, &open, NVP_SLOT_POSTED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int nvp_posting(void) { return nvp_self.mb != NULL; }

uint64_t nvp_posted_done(void)
{
    return nvp_self.mb ? __atomic_load_n(&nvp_self.mb->posted_done, __ATOMIC_ACQUIRE) : 0;
}
