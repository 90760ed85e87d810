/* The transport's own interfaces: what its files (channel.c, framing.c, mailbox.c, staging.c, proxy_find.c,
 * recovery.c, shm_fd.c, dmtcp_memfd.c) share and the rest of the shim does not see (it uses shim.h). */
#ifndef NVP_TRANSPORT_H
#define NVP_TRANSPORT_H

#include "shim.h"

#include <stdatomic.h>
#include <sys/uio.h>
#include <sys/un.h>

#define NVP_HIDDEN __attribute__((visibility("hidden")))

/* ---- channel.c owns the state ---- */
enum { ST_INIT = 0, ST_READY = 1, ST_DEAD = 2, ST_PAUSED = 3 /* checkpoint under way */ };

struct nvp_proxy_link { /* the process's link to its proxy */
    pthread_mutex_t lock;
    int state;
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int ndev, driver_version, backend;
    pid_t proxy_pid;
    atomic_uint_fast64_t seq;
    pthread_key_t key;
    int trace;
    _Atomic int generation; /* bumped when a new proxy replaces a dead one */
};
extern struct nvp_proxy_link nvp_proxy NVP_HIDDEN;

struct nvp_thread { /* an application thread's channel */
    int fd;
    int dev;
    int gen;
    int broken; /* the last call failed in transport, not in CUDA */
    struct nvp_staging stg;
    uint64_t stg_addr, stg_ino; /* the proxy's address of the staging buffer; its memfd's inode */
    struct nvp_mailbox *mb;     /* where the proxy may leave this channel's replies (nvproxy_wire.h), or NULL */
    int unread;                 /* replies asked for (nvp_send_pending) and not read yet */
    int first_by_mailbox;       /* the first of those may come through the mailbox */
    uint64_t last_seq;          /* this thread's last request on this channel (nvp_last_request) */
    struct nvp_thread *next;    /* all threads with a channel, for a checkpoint to close */
};
extern __thread struct nvp_thread nvp_self NVP_HIDDEN;

/* The HELLO of a new channel, with a new mailbox for it where mb_out is given: 0, or -1 */
int nvp_greet(int fd, int kind, struct nvp_rep *rep, struct nvp_mailbox **mb_out);
/* a new channel of kind (NVP_CHAN_*) to the proxy, greeted: its descriptor, or -1 */
int nvp_open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out);

/* ---- framing.c ---- */
uint64_t nvp_now_ns(void);
int nvp_write_all(int fd, struct iovec *iov, int iovcnt, int pass_fd);
int nvp_read_all(int fd, void *buf, size_t n);
cudaError_t nvp_send_req(uint16_t op, uint16_t flags, const uint64_t a[NVP_MAX_ARGS], const void *p1, size_t l1,
                         const void *p2, size_t l2, int fd, int slot);
cudaError_t nvp_recv_reply(struct nvp_reply *r);

/* ---- mailbox.c ---- */
struct nvp_mailbox *nvp_mailbox_new(int *fd_out); /* NULL where none can be made; *fd_out: its memfd */
void nvp_mailbox_drop(struct nvp_mailbox **mb);
int nvp_mailbox_take(struct nvp_mailbox *mb, void *buf); /* the reply the proxy left there: 1, else 0 */
int nvp_mailbox_slot_free(struct nvp_mailbox *mb);       /* 0, or -1 if the proxy is gone */
int nvp_mailbox_post(struct nvp_mailbox *mb, const struct iovec *iov, int n, size_t total); /* 1 posted, 0 not */

/* ---- staging.c ---- */
void nvp_staging_unmap(struct nvp_staging *s);
void nvp_staging_drop(void);       /* this thread's */
void nvp_staging_thread_end(void); /* this thread's, kept for the next one while its proxy lives */
void nvp_staging_drop_spares(void); /* (nvp_proxy.lock held, or a forked child's only thread) */

/* ---- proxy_find.c ---- */
int nvp_spawn_proxy(const char *restore_image); /* 0, or -1; sets nvp_proxy.sock and .proxy_pid */
int nvp_proxy_first_channel(void);              /* the process's first socket to its proxy, found or started */
int nvp_socket_connect(const char *path, int private); /* private: past DMTCP (nvp_unix_connect) */
void nvp_socket_close(int fd, int private);

/* ---- recovery.c ---- */
/* The proxy is lost (why: for the message): the thread's channel closes, and the call fails with
 * cudaErrorDevicesUnavailable; its outermost nvp_exchange recovers where NVPROXY_RECOVER says how. */
cudaError_t nvp_lost(const char *why);

/* ---- shm_fd.c ---- */
void nvp_memfd_retag(void); /* names made from now on differ from those made before (after a restart) */

#endif
