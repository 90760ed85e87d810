/* Requests and replies on a thread's channel: writing a request (with a descriptor, or through the mailbox's
 * slot), reading its reply (spinning, then sleeping, or from the mailbox), pipelines of requests whose replies
 * come later, and the calls made of them.  A file of its own: the wire's framing, apart from how channels are
 * opened (channel.c) and what a lost proxy becomes (recovery.c). */
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#define NVP_LIVENESS_MS 250
#define MAX_EXPECTED_NS 200000000ull /* the longest spin a caller's estimate may ask for */
#define MAILBOX_RECV_EVERY_NS 50000 /* how often a thread spinning on its mailbox tries its socket unasked */

int nvp_write_all(int fd, struct iovec *iov, int iovcnt, int pass_fd)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    int first = 1;
    while (iovcnt > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        if (first && pass_fd >= 0) {
            memset(cbuf, 0, sizeof cbuf);
            m.msg_control = cbuf;
            m.msg_controllen = sizeof cbuf;
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
        }
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        first = 0;
        size_t left = (size_t)w;
        while (iovcnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* Read exactly n bytes.  The proxy's death shows as EOF (only the proxy holds
 * its end; a migration hands the very same connection to the new proxy, so
 * the proxy's pid is no sign of life). */
uint64_t nvp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int read_all_waiting(int fd, void *buf, size_t n, uint64_t spin, struct nvp_mailbox *mb);

/* Threads waiting for replies at once: with more than two, spinning threads would
 * take the cores the proxy needs to answer them (launch storms of many threads slow
 * down), so the third and later spin no longer than 50 us, much as the CUDA
 * runtime yields instead of spinning when contexts outnumber cores. */
static int waiting_threads;
static __thread uint64_t expected_ns; /* the next reply's expected wait (nvp_expect_wait), once */

void nvp_expect_wait(uint64_t ns) { expected_ns = ns < MAX_EXPECTED_NS ? ns : MAX_EXPECTED_NS; }

/* Read exactly n bytes; a reply header (mb given) may instead come through the mailbox. */
static int read_from(int fd, void *buf, size_t n, struct nvp_mailbox *mb)
{
    uint64_t spin_ns = nvp_settings()->spin_ns; /* (NVPROXY_SPIN_US) */
    int others = __atomic_fetch_add(&waiting_threads, 1, __ATOMIC_RELAXED);
    uint64_t spin = others >= 2 && spin_ns > 50000 ? 50000 : spin_ns;
    if (others < 2 && spin_ns && expected_ns > spin) /* (a long copy: native waits spinning through it too) */
        spin = expected_ns;
    expected_ns = 0;
    int r = read_all_waiting(fd, buf, n, spin, mb);
    __atomic_fetch_sub(&waiting_threads, 1, __ATOMIC_RELAXED);
    return r;
}

int nvp_read_all(int fd, void *buf, size_t n) { return read_from(fd, buf, n, NULL); }

static int read_all_waiting(int fd, void *buf, size_t n, uint64_t spin, struct nvp_mailbox *mb)
{
    char *p = buf;
    int sleeping = 0;
    if (n != sizeof mb->rep)
        mb = NULL;
    /* Most replies come within tens of microseconds: poll the socket (and the
     * mailbox) for a short while before sleeping in poll(2), which costs a wake-up. */
    uint64_t t = nvp_now_ns(), spin_until = t + spin, next_recv = t;
    uint32_t replied = mb ? __atomic_load_n(&mb->replied, __ATOMIC_ACQUIRE) : 0; /* (then a first recv below) */
    while (n > 0 && (t = nvp_now_ns()) < spin_until) {
        if (mb && p == (char *)buf) {
            if (nvp_mailbox_take(mb, buf))
                return 0;
            /* the socket only when the proxy says it wrote there (a recv(2) per turn would delay seeing the
             * mailbox), and now and then besides */
            if (!nvp_socket_due(&mb->replied, &replied, t, &next_recv, MAILBOX_RECV_EVERY_NS)) {
                nvp_cpu_relax();
                continue;
            }
            if (nvp_test.socket_look) /* (tests only: the proxy may answer meanwhile) */
                nvp_test.socket_look();
            /* What the socket holds may be a later reply: the proxy answers this request through the mailbox, then
             * the next ones (sent at once, copies from the device in pieces) through the socket.  It writes them in
             * that order, so once something is there the mailbox says whether this reply is in it. */
            char c;
            ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
            if (k > 0 && nvp_mailbox_take(mb, buf))
                return 0;
            if (k <= 0) {
                if (k == 0) {
                    errno = EPIPE;
                    return -1;
                }
                if (errno != EAGAIN && errno != EINTR)
                    return -1;
                continue;
            }
        }
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            errno = EPIPE;
            return -1;
        } else if (errno != EAGAIN && errno != EINTR) {
            return -1;
        }
    }
    if (n > 0 && mb && p == (char *)buf) { /* from now on the proxy must write to the socket, which wakes us */
        uint32_t empty = NVP_MB_EMPTY;
        if (!__atomic_compare_exchange_n(&mb->state, &empty, NVP_MB_SLEEPING, 0, __ATOMIC_SEQ_CST,
                                         __ATOMIC_SEQ_CST))
            return nvp_mailbox_take(mb, buf) ? 0 : -1; /* (it came meanwhile) */
        sleeping = 1;
    }
    int rc = 0;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, NVP_LIVENESS_MS);
        if (pr == 0)
            continue; /* a proxy that dies closes the socket: EOF below, within the poll period */
        if (pr < 0) {
            if (errno == EINTR)
                continue;
            rc = -1;
            break;
        }
        ssize_t r = recv(fd, p, n, 0);
        if (r == 0) {
            errno = EPIPE; /* EOF: the proxy closed */
            rc = -1;
            break;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            rc = -1;
            break;
        }
        p += r;
        n -= (size_t)r;
    }
    if (sleeping)
        __atomic_store_n(&mb->state, NVP_MB_EMPTY, __ATOMIC_RELEASE);
    return rc;
}

static cudaError_t send_seq(struct nvp_req *h, struct iovec *iov, int n, struct nvp_mailbox *mb, int fd, int counted);

/* slot: the request may go through the mailbox's slot.  Not for requests sent several in a row before their
 * replies are read (nvp_send_pending, unless alone): the proxy takes the next from the slot only once it has answered the last,
 * and it waits for each staged copy to finish before it answers, so the thread would wait at each post instead of
 * copying the next part out while the device sends it. */
cudaError_t nvp_send_req(uint16_t op, uint16_t flags, const uint64_t a[NVP_MAX_ARGS], const void *p1,
                            size_t l1, const void *p2, size_t l2, int fd, int slot)
{
    if (l1 + l2 > NVP_MAX_PAYLOAD)
        return cudaErrorInvalidValue;
    nvp_managed_before_request();
    struct nvp_req h = {.len = (uint32_t)(sizeof h + l1 + l2), .op = op, .flags = flags};
    if (a)
        memcpy(h.a, a, sizeof h.a);
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)p1, l1}, {(void *)p2, l2}};
    int n = 1 + (l1 > 0) + (l2 > 0);
    if (l1 == 0 && l2 > 0) {
        iov[1] = iov[2];
    }
    struct nvp_mailbox *mb = slot && fd < 0 && h.len <= NVP_MB_REQ_MAX ? nvp_self.mb : NULL;
    if (mb && nvp_mailbox_slot_free(mb) != 0)
        return nvp_lost("the proxy hung up");
    /* the order the application made its calls in, across all threads */
    h.seq = atomic_fetch_add(&nvp_proxy.seq, 1) + 1;
    return send_seq(&h, iov, n, mb, fd, 1);
}

/* Does a request of op, sent without a reply, leave work on a device that may run after it returns?  Every op but
 * those that only change the proxy's own state (cudaHostUnregister's, posted where no device can still be using
 * the memory: memory.c). */
static int leaves_device_work(uint16_t op) { return op != NVP_OP_HOST_UNREGISTER; }

/* The request h (its seq taken) out through the mailbox's slot mb, or the socket; counted: see nvp_note_async_sent */
static cudaError_t send_seq(struct nvp_req *h, struct iovec *iov, int n, struct nvp_mailbox *mb, int fd, int counted)
{
    uint16_t op = h->op, flags = h->flags;
    nvp_self.last_seq = h->seq;
    if (nvp_test.request_numbered) /* (tests only: a thread held here leaves a gap in the call order) */
        nvp_test.request_numbered(h->seq);
    if (!(mb && nvp_mailbox_post(mb, iov, n, h->len))) {
        if (nvp_write_all(nvp_self.fd, iov, n, fd) != 0)
            return nvp_lost(strerror(errno));
        if (nvp_self.mb) /* (tells a proxy polling the slot that the socket has something: no recvmsg(2) per turn) */
            __atomic_fetch_add(&nvp_self.mb->sent, 1, __ATOMIC_RELEASE);
    }
    if (!(flags & NVP_F_REPLY) && counted && leaves_device_work(op)) /* (device work that may still run) */
        nvp_note_async_sent();
    if (nvp_proxy.trace)
        nvp_log("nvproxy: -> op %u seq %llu%s", op, (unsigned long long)h->seq, flags & NVP_F_REPLY ? "" : " (no reply)");
    return cudaSuccess;
}

/* mailbox: the request was marked NVP_F_MAILBOX */
static cudaError_t recv_reply_from(struct nvp_reply *r, int mailbox)
{
    if (read_from(nvp_self.fd, &r->h, sizeof r->h, mailbox ? nvp_self.mb : NULL) != 0)
        return nvp_lost(strerror(errno));
    if (r->h.len < sizeof r->h || r->h.text_len > r->h.len - sizeof r->h)
        return nvp_lost("malformed reply");
    if (r->h.text_len) {
        char buf[4096];
        size_t left = r->h.text_len;
        while (left) {
            size_t k = left < sizeof buf ? left : sizeof buf;
            if (nvp_read_all(nvp_self.fd, buf, k) != 0)
                return nvp_lost("connection closed");
            fwrite(buf, 1, k, stdout);
            left -= k;
        }
        fflush(stdout);
    }
    size_t pay = r->h.len - sizeof r->h - r->h.text_len;
    size_t take = pay < r->out_cap ? pay : r->out_cap;
    if (take && nvp_read_all(nvp_self.fd, r->out, take) != 0)
        return nvp_lost("connection closed");
    for (size_t left = pay - take; left;) {
        char junk[4096];
        size_t k = left < sizeof junk ? left : sizeof junk;
        if (nvp_read_all(nvp_self.fd, junk, k) != 0)
            return nvp_lost("connection closed");
        left -= k;
    }
    r->out_len = take;
    if (r->h.async_err)
        nvp_note_async_error((cudaError_t)r->h.async_err);
    if (nvp_is_sticky((cudaError_t)r->h.err))
        nvp_set_sticky((cudaError_t)r->h.err);
    return (cudaError_t)r->h.err;
}

cudaError_t nvp_recv_reply(struct nvp_reply *r) { return recv_reply_from(r, 0); }

struct one_call {
    uint16_t op;
    const uint64_t *a;
    const void *p1, *p2;
    size_t l1, l2;
    struct nvp_reply *reply;
    int fd;
};

static cudaError_t call_once(void *arg)
{
    const struct one_call *c = arg;
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    int mailbox = c->reply && nvp_self.mb && !nvp_self.unread; /* (no earlier reply can be on its way) */
    uint16_t flags = c->reply ? NVP_F_REPLY | (mailbox ? NVP_F_MAILBOX : 0) : 0;
    e = nvp_send_req(c->op, flags, c->a, c->p1, c->l1, c->p2, c->l2, c->fd, 1);
    return !e && c->reply ? recv_reply_from(c->reply, mailbox) : e;
}

cudaError_t nvp_callv(uint16_t op, const uint64_t a[NVP_MAX_ARGS], const void *p1, size_t l1, const void *p2,
                      size_t l2, struct nvp_reply *reply, int fd)
{
    struct one_call c = {op, a, p1, p2, l1, l2, reply, fd};
    return nvp_exchange(call_once, &c);
}

cudaError_t nvp_call(uint16_t op, const uint64_t a[NVP_MAX_ARGS], const void *payload, size_t plen,
                     struct nvp_reply *reply, int fd)
{
    return nvp_callv(op, a, payload, plen, NULL, 0, reply, fd);
}

cudaError_t nvp_send_pending(uint16_t op, const uint64_t a[NVP_MAX_ARGS], int alone)
{
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    int mailbox = nvp_self.mb && !nvp_self.unread; /* (the earliest reply still to read: none can come before it) */
    uint16_t flags = NVP_F_REPLY | (mailbox ? NVP_F_MAILBOX : 0);
    if (!(e = nvp_send_req(op, flags, a, NULL, 0, NULL, 0, -1, alone && mailbox))) {
        nvp_self.first_by_mailbox = nvp_self.unread ? nvp_self.first_by_mailbox : mailbox;
        nvp_self.unread++;
    }
    return e;
}

uint64_t nvp_last_request(void)
{
    return nvp_self.fd >= 0 && nvp_self.gen == atomic_load(&nvp_proxy.generation) ? nvp_self.last_seq : 0;
}

cudaError_t nvp_send_after(uint16_t op, const uint64_t a[NVP_MAX_ARGS], uint64_t after, int *sent)
{
    *sent = 0;
    nvp_managed_before_request();
    if (!after || after != nvp_last_request() || nvp_self.unread || !nvp_self.mb)
        return cudaSuccess;
    struct nvp_req h = {.len = sizeof h, .op = op};
    memcpy(h.a, a, sizeof h.a);
    struct iovec iov = {&h, sizeof h};
    if (nvp_mailbox_slot_free(nvp_self.mb) != 0)
        return nvp_lost("the proxy hung up");
    uint_fast64_t expect = after; /* (taken only if no request of any thread took a number since) */
    if (!atomic_compare_exchange_strong(&nvp_proxy.seq, &expect, after + 1))
        return cudaSuccess;
    h.seq = after + 1;
    *sent = 1;
    return send_seq(&h, &iov, 1, nvp_self.mb, -1, 0);
}

/* k requests with no payload in one write, under consecutive seqs: the proxy finds them together in its
 * buffer (a copy from the device in pieces: it issues them all at once, fastpath.c issue_ahead). */
cudaError_t nvp_send_pending_many(uint16_t op, const uint64_t (*a)[NVP_MAX_ARGS], size_t k)
{
    cudaError_t e = nvp_connect();
    if (e || k == 0)
        return e;
    if (k > NVP_SEND_MANY_MAX)
        return cudaErrorInvalidValue;
    nvp_managed_before_request();
    struct nvp_req h[NVP_SEND_MANY_MAX];
    struct iovec iov[NVP_SEND_MANY_MAX];
    int mailbox = nvp_self.mb && !nvp_self.unread;
    uint64_t seq = atomic_fetch_add(&nvp_proxy.seq, k) + 1;
    for (size_t i = 0; i < k; i++) {
        h[i] = (struct nvp_req){.len = sizeof h[i], .op = op, .flags = NVP_F_REPLY, .seq = seq + i};
        h[i].flags |= i == 0 && mailbox ? NVP_F_MAILBOX : 0;
        memcpy(h[i].a, a[i], sizeof h[i].a);
        iov[i] = (struct iovec){&h[i], sizeof h[i]};
    }
    if (nvp_write_all(nvp_self.fd, iov, (int)k, -1) != 0)
        return nvp_lost(strerror(errno));
    if (nvp_self.mb)
        __atomic_fetch_add(&nvp_self.mb->sent, 1, __ATOMIC_RELEASE);
    nvp_self.first_by_mailbox = nvp_self.unread ? nvp_self.first_by_mailbox : mailbox;
    nvp_self.unread += (int)k;
    nvp_self.last_seq = seq + k - 1;
    if (nvp_proxy.trace)
        nvp_log("nvproxy: -> op %u seq %llu..%llu", op, (unsigned long long)seq, (unsigned long long)(seq + k - 1));
    return cudaSuccess;
}

cudaError_t nvp_wait_pending(struct nvp_reply *reply)
{
    int mailbox = nvp_self.unread > 0 && nvp_self.first_by_mailbox;
    nvp_self.first_by_mailbox = 0;
    if (nvp_self.unread > 0)
        nvp_self.unread--;
    return recv_reply_from(reply, mailbox);
}
