/*
 * The proxy's native fast path: the calls an application makes most often
 * (launches, event records, copies, stream and event waits), executed in C
 * straight from a channel's receive buffer, without the Python dispatcher.
 *
 * Python (proxy/fastpath.py) owns everything else: it learns each handle
 * before C may use it (C stops at the first message naming one it does not
 * know), does every other operation, and every reply C cannot send at once.
 * The driver entry points come in a table, so tests can run this code
 * against doubles where there is no GPU.
 *
 * Python reads the block between the CDEF markers with cffi.
 */
#ifndef NVPROXY_FASTPATH_H
#define NVPROXY_FASTPATH_H
#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define NVPF_MAX_DEV 64
#define NVPF_COPY_EVENTS 8
#define NVPF_POSTED 32       /* a channel's posted copies in flight, at most (the shim keeps fewer) */
#define NVPF_SYNC_STREAMS 64 /* streams a synchronous copy waits for, at most, that C asks itself */
#define NVPF_SERVE_MAX 64    /* calling threads C serves at once, at most (more: Python serves them) */
#define NVPF_LIBS 8          /* math libraries (libexec.c) */

/* why nvpf_run returned */
#define NVPF_MORE 0   /* every complete message is done */
#define NVPF_PYTHON 1 /* the next message is Python's to execute */
#define NVPF_REPLY 2  /* the last message done wants a reply that Python sends: wait_kind says after what */
/* and why nvpf_serve returned, besides those */
#define NVPF_IDLE 3   /* nothing came for idle_us, or Python's loop wants a turn: it tends its other sockets */
#define NVPF_CLOSED 4 /* end of file or an error on the socket: Python's own read finds out which */
#define NVPF_FDS 5    /* descriptors came (SCM_RIGHTS), in fds[]: Python takes them with the bytes */
#define NVPF_MAX_FDS 16

/* what Python's hook answers for a call C meets while serving that only Python executes (nvpf_set_python) */
#define NVPF_INLINE_DONE 0 /* executed there: C goes on with the next call */
#define NVPF_INLINE_LEFT 1 /* not executed: C stops for it (NVPF_PYTHON), as without the hook */
#define NVPF_INLINE_STOP 2 /* executed, and what it changed needs Python's loop: C stops (NVPF_IDLE) */

#define NVPF_WAIT_NONE 0   /* at once, with reply_err */
#define NVPF_WAIT_STREAM 1 /* once wait_handle (a stream) is idle */
#define NVPF_WAIT_EVENT 2  /* once wait_handle (an event) has completed */

struct nvpf_driver {
    int (*launch)(void *func, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shmem, void *stream, void **params, void **extra);
    int (*launch_cooperative)(void *func, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shmem, void *stream, void **params);
    int (*memcpy_async)(uint64_t dst, uint64_t src, size_t n, void *stream);
    int (*memset_async)(uint64_t dst, unsigned char value, size_t n, void *stream);
    int (*event_record)(void *event, void *stream, unsigned flags);
    int (*event_query)(void *event);
    int (*event_sync)(void *event);
    int (*stream_query)(void *stream);
    int (*stream_sync)(void *stream);
    int (*stream_wait_event)(void *stream, void *event, unsigned flags);
    int (*graph_launch)(void *exec, void *stream);
    /* optional (NULL: launches are issued on the dispatcher thread only) */
    int (*ctx_get_current)(void **ctx);
    int (*ctx_set_current)(void *ctx);
};

/* One channel (one application thread), shared with Python's Channel. */
struct nvpf_chan {
    int fd;             /* its socket (non-blocking) */
    int dev;            /* the thread's current device */
    int pending;        /* replies Python still owes: C must not reply before them */
    int exclusive;      /* the process's only calling thread: nobody else waits while C spins */
    int async_err;      /* first failure of an asynchronous call, for the next reply */
    int ended;          /* the thread closed its socket: C runs what the buffer holds and reads no more */
    uint32_t home;      /* C's: 1 + the launch worker that issues the thread's launches (0: none yet) */
    uint64_t staging_base, staging_size;
    void *mailbox; /* the thread's struct nvp_mailbox (nvproxy_wire.h), mapped here, or NULL */
    void *per_thread[NVPF_MAX_DEV]; /* the thread's per-thread default stream per device */
    void *copy_events[NVPF_COPY_EVENTS];
    uint32_t copy_next;
    /* copies to the host issued ahead of their turn (fastpath.c, issue_ahead): requests ahead_seq onwards,
     * ahead_n of them, done once copy_events[(ahead_ev + k) % NVPF_COPY_EVENTS] are */
    uint64_t ahead_seq;
    uint32_t ahead_n, ahead_ev;
    /* posted host-to-device copies in flight (NVP_OP_STAGED_COPY), oldest first: entry k has number
     * posted_num[k % NVPF_POSTED] and is done once posted_events[k % NVPF_POSTED] is (a ring Python makes on
     * posted_dev; none: NULL) */
    void *posted_events[NVPF_POSTED];
    uint64_t posted_num[NVPF_POSTED];
    uint32_t posted_first, posted_count;
    int posted_dev;
    /* out, with NVPF_REPLY */
    int wait_kind;
    int reply_err;
    void *wait_handle;
    /* out, with NVPF_FDS */
    int nfds;
    int fds[NVPF_MAX_FDS];
    /* out, from nvpf_serve: requests (two at most, one after the other) the thread had posted in its mailbox's
     * slot that C did not execute (Python executes them, in seq order) */
    uint32_t side_len;
    uint8_t side[7936]; /* 2 * NVP_MB_REQ_MAX */
    /* per math library (libexec.c): the first posted call of the thread that failed since its last call of that
     * library that waited, which reports it: its status (0: none) and function id */
    int lib_failed[NVPF_LIBS];
    uint32_t lib_failed_fid[NVPF_LIBS];
};

int nvpf_init(const struct nvpf_driver *drv, unsigned spin_us, unsigned exclusive_spin_us);
void nvpf_set_text_fd(int fd); /* where kernel printf text arrives (-1: nowhere) */
void nvpf_set_launch_threads(int n); /* threads that issue launches while C serves several channels (0: none) */
/* Python's hook for the calls only Python executes, met while C serves (NULL: none; C then returns NVPF_PYTHON
 * and hands its buffers over).  Called on the serving thread, in call order, with every earlier call issued; msg
 * is the whole request.  Returns NVPF_INLINE_*. */
void nvpf_set_python(int (*run)(struct nvpf_chan *ch, const uint8_t *msg, size_t len));
void nvpf_learn_kernel(int dev, uint64_t id, void *func, uint32_t nparams, const uint32_t *offsets);
void nvpf_learn_stream(uint64_t id, void *handle);
void nvpf_learn_event(uint64_t id, void *handle);
void nvpf_learn_graph_exec(uint64_t id, void *handle);
void nvpf_forget_all(void);
void nvpf_set_translating(int on);
void nvpf_set_capturing(int on); /* a stream capture is on: every call goes to Python, which logs it */
void nvpf_set_text_pending(int on);
void nvpf_set_may_print(int on); /* a module that may print was loaded: every wait is a real wait */
/* What C's serving did since the proxy started (NVPROXY_SERVE_STATS prints it at the proxy's end). */
#define NVPF_STAT_OPS 128
struct nvpf_stats {
    uint64_t serves, serve_ns; /* calls of nvpf_serve and nvpf_serve_many, and the time they took */
    uint64_t ended[8];         /* serves by why they ended (NVPF_*) */
    uint64_t loop_turns;       /* of those ended NVPF_IDLE, for the turn of Python's event loop */
    uint64_t executed;         /* requests C executed (a launch it gave a launch thread counts) */
    uint64_t to_python[NVPF_STAT_OPS]; /* requests C left to Python, by operation */
    uint64_t order_ns, quiet_ns, room_ns; /* serving several channels, time in turns that ran nothing: holding only
                                             later calls than the next (still on its way), none, and the next (its
                                             launch waits for room at a launch worker) */
    uint64_t inline_runs; /* calls C left to Python that Python's hook executed while C served on */
    uint64_t python_why[3]; /* serves that ended NVPF_PYTHON, by what C met: a call it left to Python; a message
                               out of turn or malformed; a buffer full of calls whose turn had not come */
    uint64_t side_taken;    /* requests found posted in a mailbox's slot as a serve ended (side) */
};
const struct nvpf_stats *nvpf_stats(void);
/* The streams a synchronous pageable copy on dev waits for (the legacy stream, blocking streams, per-thread
 * streams): n < 0 unknown (C leaves such copies to Python, which tells it), n > NVPF_SYNC_STREAMS too many to ask
 * (C waits for the copy instead). */
void nvpf_set_sync_streams(int dev, void **streams, int n);
/* Python issued work (it executed a call): the next synchronous posted copy asks the streams again. */
void nvpf_note_issue(void);
/* Posted copies: mark those done (oldest first) and publish it; wait for them all; order a stream after them;
 * their events up to number upto (out: NVPF_POSTED at most), for a wait elsewhere; publish that up to n are done;
 * put number num, just issued on stream, in flight (its event recorded there; the ring must be on the channel's
 * device). */
void nvpf_posted_advance(struct nvpf_chan *ch);
int nvpf_posted_push(struct nvpf_chan *ch, void *stream, uint64_t num);
int nvpf_posted_drain(struct nvpf_chan *ch);
int nvpf_posted_order(struct nvpf_chan *ch, void *stream);
int nvpf_posted_events(struct nvpf_chan *ch, uint64_t upto, void **out);
void nvpf_posted_publish(struct nvpf_chan *ch, uint64_t n);
int nvpf_run(struct nvpf_chan *ch, const uint8_t *buf, size_t len, uint64_t *next_seq, size_t *consumed);
/* The channel of a process's only calling thread, served from C: receive,
 * execute and reply in a loop, with no trip through Python's event loop per
 * call.  buf (cap bytes) holds *len bytes already received; what is left in it
 * on return (a message for Python, a partial one) is Python's. */
int nvpf_serve(struct nvpf_chan *ch, uint8_t *buf, size_t cap, size_t *len, uint64_t *next_seq, unsigned idle_us,
               unsigned budget_us);
/* The same for n calling threads' channels at once (each with its buffer of cap bytes, lens[i] held), executed
 * in call order (seq) across them: *which is the channel whose message or reply needs Python (-1: none, with
 * NVPF_IDLE); any channel's buffer and side may hold bytes for Python on return. */
int nvpf_serve_many(struct nvpf_chan **chs, uint8_t **bufs, size_t *lens, int n, size_t cap, uint64_t *next_seq,
                    unsigned idle_us, unsigned budget_us, int *which);
/* Python's event loop descriptor (epoll), which nvpf_serve looks at every budget_us: it returns NVPF_IDLE once
 * one of its descriptors but the served channels' is ready (or -1: every budget_us). */
void nvpf_set_loop_fd(int fd);
/* Did the last nvpf_serve(_many) end because Python's loop was due a turn (a new thread, a command)?  Its answer
 * may still be NVPF_PYTHON, for requests posted meanwhile: Python executes those, then lets the loop turn. */
int nvpf_loop_turn(void);
/* CDEF-END */

#endif
