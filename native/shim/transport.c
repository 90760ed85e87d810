/* Channels to the proxy: finding or starting it, one socket per application
 * thread, request/reply framing, and turning a lost proxy into a clear error. */
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef NVP_DEFAULT_PYTHON
#define NVP_DEFAULT_PYTHON "python3"
#endif

#define NVP_STAGE_SLOT (8u << 20)
#define NVP_STAGE_SLOTS 4
#define NVP_LIVENESS_MS 250
#define MAX_EXPECTED_NS 200000000ull /* the longest spin a caller's estimate may ask for */
#define MAILBOX_RECV_EVERY_NS 50000 /* how often a thread spinning on its mailbox tries its socket unasked */

enum { ST_INIT = 0, ST_READY = 1, ST_DEAD = 2, ST_PAUSED = 3 /* checkpoint under way */ };

static struct {
    pthread_mutex_t lock;
    int state;
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int ndev, driver_version, backend;
    pid_t proxy_pid;
    atomic_uint_fast64_t seq;
    pthread_key_t key;
    int trace;
    _Atomic int generation; /* bumped when a new proxy replaces a dead one */
} G = {.lock = PTHREAD_MUTEX_INITIALIZER};

struct nvp_thread {
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
static __thread struct nvp_thread T = {.fd = -1, .dev = 0};
static struct nvp_thread *threads; /* under G.lock */

/* Staging buffers of threads that ended, still mapped here and registered in the proxy, for the next thread: the
 * proxy unregistering one waited for the device while it held the driver, so a kernel spinning until another
 * thread's call hung for ever (multithread.cu, two GPUs).  As many as threads ever ran at once. */
struct spare_staging {
    struct nvp_staging stg;
    uint64_t addr, ino;
    int gen;
    struct spare_staging *next;
};
static struct spare_staging *spares; /* under G.lock */
#define STAGING_BYTES ((size_t)NVP_STAGE_SLOT * NVP_STAGE_SLOTS)

static void drop_spares(void) /* (G.lock held, or a forked child's only thread) */
{
    while (spares) {
        struct spare_staging *sp = spares;
        spares = sp->next;
        munmap(sp->stg.base, STAGING_BYTES);
        free(sp);
    }
}

extern pid_t dmtcp_virtual_to_real_pid(pid_t virtual_pid) __attribute__((weak));

/* DMTCP gives the application virtual pids (and wraps even syscall(SYS_getpid));
 * the proxy, outside DMTCP, knows the real one. */
pid_t nvp_real_pid(void)
{
    pid_t p = getpid();
    return dmtcp_virtual_to_real_pid ? dmtcp_virtual_to_real_pid(p) : p;
}

static int spawn_proxy(const char *restore_image);
static int open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out);
static void drop_staging(void);
static void drop_mailbox(void);
static int recover(int seen_gen);
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

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

int nvp_trace_enabled(void) { return G.trace; }

static void thread_exit(void *arg)
{
    (void)arg;
    struct spare_staging *sp = T.stg.base ? malloc(sizeof *sp) : NULL; /* (not under the lock) */
    /* Checkpoints held off while G.lock is held: DMTCP freezes threads anywhere outside such a hold, and the
     * plugin's nvp_disconnect_all would then wait for G.lock for ever (as in open_channel). */
    nvp_ckpt_disable();
    pthread_mutex_lock(&G.lock);
    for (struct nvp_thread **p = &threads; *p; p = &(*p)->next)
        if (*p == &T) {
            *p = T.next;
            break;
        }
    /* (listed before the channel closes: the proxy hands it over either way) */
    if (sp && T.gen == atomic_load(&G.generation)) {
        *sp = (struct spare_staging){T.stg, T.stg_addr, T.stg_ino, T.gen, spares};
        spares = sp;
        sp = NULL;
        T.stg.base = NULL;
    }
    pthread_mutex_unlock(&G.lock);
    /* closed inside the hold too: once unlisted, a channel that a checkpoint came upon stays open through it, and
     * after a restart its number may name another thread's new channel, which this close would cut (found by
     * reading, while chasing "lost the proxy (Bad file descriptor)" after restarts on GPUs: see remake_memfd) */
    if (T.fd >= 0)
        nvp_close_private(T.fd);
    T.fd = -1;
    nvp_ckpt_enable();
    free(sp);
    drop_staging();
    drop_mailbox();
}

static void after_fork_child(void)
{
    /* A forked child must never talk over its parent's channels: it gets a
     * proxy of its own on its first CUDA call. */
    pthread_mutex_init(&G.lock, NULL);
    nvp_parcopy_after_fork();
    G.state = ST_INIT;
    threads = NULL;
    atomic_store(&G.seq, 0); /* the new proxy expects the sequence from 1 */
    if (T.fd >= 0)
        nvp_close_private(T.fd);
    T.fd = -1;
    T.stg.base = NULL;
    drop_mailbox(); /* (shared with the parent's channel: never written here) */
    drop_spares();  /* the parent's proxy's buffers */
}

static void make_key(void)
{
    pthread_key_create(&G.key, thread_exit);
    pthread_atfork(NULL, NULL, after_fork_child);
    G.trace = getenv("NVPROXY_TRACE") != NULL;
}

static cudaError_t mark_dead(const char *why)
{
    T.broken = 1;
    if (getenv("NVPROXY_RECOVER") && *getenv("NVPROXY_RECOVER")) {
        /* the call's outermost nvp_exchange starts a new proxy from the image and runs the call again */
        if (T.fd >= 0)
            nvp_close_private(T.fd);
        T.fd = -1;
        return cudaErrorDevicesUnavailable;
    }
    pthread_mutex_lock(&G.lock);
    int was = G.state;
    G.state = ST_DEAD;
    pthread_mutex_unlock(&G.lock);
    if (was != ST_DEAD)
        nvp_log("nvproxy: lost the proxy (%s); every CUDA call now fails with "
                "cudaErrorDevicesUnavailable",
                why);
    if (T.fd >= 0)
        nvp_close_private(T.fd);
    T.fd = -1;
    return cudaErrorDevicesUnavailable;
}

/* A private directory for this user's sockets: 0700, owned by us, no symlink. */
int nvp_private_dir(char *out, size_t cap)
{
    const char *rt = getenv("XDG_RUNTIME_DIR");
    if (rt && *rt)
        snprintf(out, cap, "%s/nvproxy", rt);
    else
        snprintf(out, cap, "/tmp/nvproxy-%u", (unsigned)getuid());
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 077) != 0) {
        nvp_log("nvproxy: %s is not a private directory of this user; refusing to use it", out);
        return -1;
    }
    return 0;
}

/* libc's socket, connect and close, past DMTCP's wrappers (which also catch syscall()).  DMTCP lists the
 * descriptors that the program makes, and the plugin closes its channels in PRECHECKPOINT, where DMTCP's close
 * wrapper keeps no books: DMTCP then gave the stale entry's number to a shared-memory file of the program's own
 * that it opened for its checkpoint, closed that file as the old socket, and at RESUME remapped the program's
 * segment through whatever was there: mmap failed (ENODEV) and the program died (NVIDIA's simpleIPC, whose
 * segment came after its first CUDA call).  The proxy's channels are nvproxy's business: DMTCP never sees them.
 * (The callback channel stays DMTCP's: a checkpoint puts /dev/null over it, never closes it, and DMTCP keeps
 * its number taken across a restart until the old callback thread has let go of it.) */
static struct {
    int (*socket)(int, int, int);
    int (*connect)(int, const struct sockaddr *, socklen_t);
    int (*close)(int);
    long (*syscall)(long, ...);
    int (*execve)(const char *, char *const[], char *const[]);
} LC;
static pthread_once_t lc_once = PTHREAD_ONCE_INIT;

static void lc_init(void)
{
    void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    LC.socket = h ? (int (*)(int, int, int))dlsym(h, "socket") : NULL;
    LC.connect = h ? (int (*)(int, const struct sockaddr *, socklen_t))dlsym(h, "connect") : NULL;
    LC.close = h ? (int (*)(int))dlsym(h, "close") : NULL;
    LC.syscall = h ? (long (*)(long, ...))dlsym(h, "syscall") : NULL;
    LC.execve = h ? (int (*)(const char *, char *const[], char *const[]))dlsym(h, "execve") : NULL;
    if (!LC.socket || !LC.connect || !LC.close || !LC.syscall || !LC.execve) { /* (not glibc: no DMTCP either) */
        LC.socket = socket;
        LC.connect = connect;
        LC.close = close;
        LC.syscall = syscall;
        LC.execve = execve;
    }
}

int nvp_close_private(int fd)
{
    pthread_once(&lc_once, lc_init);
    return LC.close(fd);
}

/* a descriptor unix_connect made: private (past DMTCP) or DMTCP's */
static void close_connected(int fd, int private)
{
    if (private)
        nvp_close_private(fd);
    else
        close(fd);
}

static int unix_connect(const char *path, int private)
{
    pthread_once(&lc_once, lc_init);
    int (*sock)(int, int, int) = private ? LC.socket : socket;
    int (*conn)(int, const struct sockaddr *, socklen_t) = private ? LC.connect : connect;
    int fd = sock(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (conn(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close_connected(fd, private);
        errno = e;
        return -1;
    }
    return fd;
}

int nvp_unix_connect(const char *path) { return unix_connect(path, 1); }

char **nvp_env_without_shim(const char *visible)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 2, sizeof *envp);
    if (!envp)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0 && strncmp(environ[i], "NVPROXY_SOCKET=", 15) != 0 &&
            !(visible && strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) == 0))
            envp[k++] = environ[i];
    if (visible)
        envp[k++] = (char *)visible;
    return envp;
}

const char *nvp_python(void)
{
    const char *py = getenv("NVPROXY_PYTHON");
    return py && *py ? py : NVP_DEFAULT_PYTHON;
}

/* name, or the first executable file of that name in PATH (execve does not search) */
static const char *program_path(const char *name, char *buf, size_t cap)
{
    const char *path = getenv("PATH");
    if (strchr(name, '/') || !path)
        return name;
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n && snprintf(buf, cap, "%.*s/%s", (int)n, p, name) < (int)cap && access(buf, X_OK) == 0)
            return buf;
        p += n + (p[n] == ':');
    }
    return name;
}

/* A fork that neither DMTCP nor the program's fork handlers see: the child only makes system calls and execs.
 * Under DMTCP the proxy is started from its RUNNING event after a restart, and DMTCP's fork wrapper made the
 * child a DMTCP process that stopped, before its exec, on DMTCP's wrapper lock copied held: the restarted program
 * ran on without a proxy and the child kept its output open (a third of the restarts of printf_assert checkpointed
 * at its fifth call hung so, on sim). */
static pid_t raw_fork(void) { return (pid_t)LC.syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L); }

/* Start a proxy for this process: double fork so it is nobody's child here,
 * without our LD_PRELOAD, told our pid so that it exits with us. */
static int spawn_proxy(const char *restore_image)
{
    char dir[sizeof G.sock - 32];
    if (nvp_private_dir(dir, sizeof dir) != 0)
        return -1;
    snprintf(G.sock, sizeof G.sock, "%s/p%d-%lx.sock", dir, (int)nvp_real_pid(),
             (unsigned long)time(NULL));
    unlink(G.sock);

    const char *py = nvp_python();
    char owner[32];
    snprintf(owner, sizeof owner, "%d", (int)nvp_real_pid());
    /* `nvproxy run` says how its proxies start (python -S -c BOOT ROOT proxy ...: the driver starts before
     * Python's site processing, src/nvproxy/boot.py); a program run with the shim alone starts `-m nvproxy` */
    const char *boot = getenv("NVPROXY_BOOT"), *root = getenv("NVPROXY_ROOT");
    int booted = boot && *boot && root && *root;
    /* (under DMTCP the proxy must stay outside the checkpointed computation: dmtcp_nocheckpoint also closes the
     * descriptors DMTCP keeps, its coordinator's socket, before it runs the proxy) */
    const char *nockpt = getenv("NVPROXY_DMTCP_NOCHECKPOINT");
    const char *with_dmtcp[16], **args = with_dmtcp + 1;
    size_t n = 0;
    with_dmtcp[0] = nockpt && *nockpt ? nockpt : "dmtcp_nocheckpoint";
    args[n++] = py;
    if (booted) {
        args[n++] = "-S";
        args[n++] = "-c";
        args[n++] = boot;
        args[n++] = root;
    } else {
        args[n++] = "-m";
        args[n++] = "nvproxy";
    }
    const char *rest[] = {"proxy", "--socket", G.sock, "--owner-pid", owner, "--restore", restore_image};
    for (size_t i = 0; i < sizeof rest / sizeof *rest - (restore_image ? 0 : 2); i++)
        args[n++] = rest[i];
    args[n] = NULL;
    const char **argv = nvp_under_dmtcp() ? with_dmtcp : args;
    static char exe_buf[4096];
    const char *exe = program_path(argv[0], exe_buf, sizeof exe_buf);

    /* a restart onto other GPUs (nvproxy restart --device) */
    const char *devices = restore_image ? nvp_restart_devices() : NULL;
    static char visible[300];
    if (devices)
        snprintf(visible, sizeof visible, "CUDA_VISIBLE_DEVICES=%s", devices);
    char **envp = nvp_env_without_shim(devices ? visible : NULL); /* (before fork: no malloc in the child) */
    if (!envp)
        return -1;

    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        free(envp);
        return -1;
    }
    pthread_once(&lc_once, lc_init);
    pid_t c = raw_fork();
    if (c < 0) {
        free(envp);
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (c == 0) { /* (system calls only, up to the exec) */
        if (raw_fork() != 0)
            LC.syscall(SYS_exit_group, 0L);
        LC.syscall(SYS_setsid);
        /* the proxy maps the program's pinned memory at the program's addresses, which it mmap()ed top-down
         * below its stack: the proxy's own mappings (the driver's among them) go bottom-up, far from there */
        long pers = LC.syscall(SYS_personality, 0xffffffffL);
        if (pers != -1)
            LC.syscall(SYS_personality, pers | ADDR_COMPAT_LAYOUT);
        pid_t me = (pid_t)LC.syscall(SYS_getpid);
        LC.syscall(SYS_write, (long)pfd[1], &me, (long)sizeof me);
        LC.execve(exe, (char *const *)argv, envp);
        LC.syscall(SYS_exit_group, 127L);
    }
    free(envp);
    close(pfd[1]);
    int st;
    LC.syscall(SYS_wait4, (long)c, &st, 0L, 0L); /* (DMTCP's waitpid knows no such child) */
    pid_t pp = 0;
    ssize_t r = read(pfd[0], &pp, sizeof pp);
    close(pfd[0]);
    if (r != sizeof pp)
        return -1;
    G.proxy_pid = pp;
    return 0;
}

static int write_all(int fd, struct iovec *iov, int iovcnt, int pass_fd)
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
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int read_all_waiting(int fd, void *buf, size_t n, uint64_t spin, struct nvp_mailbox *mb);

/* Threads waiting for replies at once: with more than two, spinning threads would
 * take the cores the proxy needs (launch storms of 16 threads ran 1.5x slower with
 * long spins), so the third and later spin no longer than 50 us, much as the CUDA
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

static int read_all(int fd, void *buf, size_t n) { return read_from(fd, buf, n, NULL); }

/* The reply the proxy left in the mailbox, if there is one. */
static int from_mailbox(struct nvp_mailbox *mb, void *buf)
{
    if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != NVP_MB_FULL)
        return 0;
    memcpy(buf, &mb->rep, sizeof mb->rep);
    __atomic_store_n(&mb->state, NVP_MB_EMPTY, __ATOMIC_RELEASE);
    return 1;
}

static int read_all_waiting(int fd, void *buf, size_t n, uint64_t spin, struct nvp_mailbox *mb)
{
    char *p = buf;
    int sleeping = 0;
    if (n != sizeof mb->rep)
        mb = NULL;
    /* Most replies come within tens of microseconds: poll the socket (and the
     * mailbox) for a short while before sleeping in poll(2), which costs a wake-up. */
    uint64_t t = now_ns(), spin_until = t + spin, next_recv = t;
    uint32_t replied = mb ? __atomic_load_n(&mb->replied, __ATOMIC_ACQUIRE) : 0; /* (then a first recv below) */
    while (n > 0 && (t = now_ns()) < spin_until) {
        if (mb && p == (char *)buf) {
            if (from_mailbox(mb, buf))
                return 0;
            /* the socket only when the proxy says it wrote there (a recv(2) per turn would delay seeing the
             * mailbox), and now and then besides */
            if (!nvp_socket_due(&mb->replied, &replied, t, &next_recv, MAILBOX_RECV_EVERY_NS)) {
                nvp_cpu_relax();
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
            return from_mailbox(mb, buf) ? 0 : -1; /* (it came meanwhile) */
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

/* A mailbox for a new call channel (nvproxy_wire.h), and its memfd for the HELLO; NULL where none can be made
 * (the channel's replies then all come over its socket).  Sealed against shrinking: a proxy that touched a page
 * beyond the end of a shrunken file would die of SIGBUS. */
static struct nvp_mailbox *new_mailbox(int *fd_out)
{
    *fd_out = -1;
    const char *off = getenv("NVPROXY_MAILBOX"); /* 0: every reply over the socket (to compare) */
    if (off && !strcmp(off, "0"))
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

static void drop_mailbox(void)
{
    if (T.mb)
        munmap(T.mb, NVP_MAILBOX_BYTES);
    T.mb = NULL;
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
    if (write_all(fd, &iov, 1, mbfd) != 0)
        return -1;
    if (read_all(fd, rep, sizeof *rep) != 0)
        return -1;
    if (rep->len != sizeof *rep || rep->err != 0)
        return -1;
    return 0;
}

/* The HELLO of a new channel, with a new mailbox for it where mb_out is given (*mb_out: NULL if none could be
 * made, or the HELLO failed).  0, or -1. */
static int greet(int fd, int kind, struct nvp_rep *rep, struct nvp_mailbox **mb_out)
{
    int mbfd = -1;
    struct nvp_mailbox *mb = mb_out ? new_mailbox(&mbfd) : NULL;
    int r = hello(fd, kind, rep, mbfd);
    if (mbfd >= 0)
        close(mbfd); /* (the proxy has its own descriptor now; the mapping stays) */
    if (r != 0 && mb) {
        munmap(mb, NVP_MAILBOX_BYTES);
        mb = NULL;
    }
    if (mb_out)
        *mb_out = mb;
    return r;
}

static int open_channel_locked_init(void)
{
    /* the first channel of the process: find or start the proxy */
    const char *env = getenv("NVPROXY_SOCKET");
    const char *owner = getenv("NVPROXY_OWNER_PID");
    int fd = -1;
    if (env && *env && owner && atoi(owner) == (int)nvp_real_pid()) {
        snprintf(G.sock, sizeof G.sock, "%s", env);
        const char *pp = getenv("NVPROXY_PROXY_PID");
        G.proxy_pid = pp ? atoi(pp) : 0;
        /* (a proxy that `nvproxy run` started listens before its path appears; still, a refusal is tried again
         * for up to 5 s: a migration at the program's first connecting call saw one on a busy machine) */
        for (int i = 0; (fd = nvp_unix_connect(G.sock)) < 0 && i < 500; i++) {
            if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN)
                break;
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (fd < 0) {
            nvp_log("nvproxy: cannot connect to the proxy at %s: %s", G.sock, strerror(errno));
            return -1;
        }
    } else {
        if (spawn_proxy(NULL) != 0) {
            nvp_log("nvproxy: could not start a proxy (%s)", strerror(errno));
            return -1;
        }
        for (int i = 0; i < 6000 && fd < 0; i++) { /* up to 60 s for Python and the driver to start */
            fd = nvp_unix_connect(G.sock);
            if (fd >= 0)
                break;
            if (kill(G.proxy_pid, 0) != 0 && errno == ESRCH) {
                nvp_log("nvproxy: the proxy exited during start-up (see its messages above)");
                return -1;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (fd < 0) {
            nvp_log("nvproxy: the proxy did not start listening at %s", G.sock);
            return -1;
        }
    }
    return fd;
}

int nvp_open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out)
{
    /* DMTCP's lock before G.lock: the callback channel's socket() is a DMTCP wrapper that takes it (the call
     * channels' sockets bypass DMTCP: unix_connect); had this thread waited for it there while holding G.lock, a
     * checkpoint would freeze it so, and the plugin's nvp_disconnect_all would wait for G.lock for ever (seen with
     * tests/apps/callback_threads).  Also while the proxy is still to be started (its start is a raw fork that
     * DMTCP's lock does not see): a checkpoint that froze a thread halfway through its HELLO would let it go on
     * after the restart over a descriptor number that no longer names its socket (found by reading, after
     * callback_threads checkpointed at its first call on a GPU said "lost the proxy (no connection)"; not
     * seen again since). */
    nvp_ckpt_disable();
    int fd = open_channel(kind, rep_out, mb_out);
    nvp_ckpt_enable();
    return fd;
}

static int open_channel(int kind, struct nvp_rep *rep_out, struct nvp_mailbox **mb_out)
{
    pthread_once(&key_once, make_key);
    pthread_mutex_lock(&G.lock);
    for (int i = 0; G.state == ST_PAUSED && i < 120000; i++) { /* a checkpoint or restart is under way */
        pthread_mutex_unlock(&G.lock);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&G.lock);
    }
    if (G.state == ST_DEAD) {
        pthread_mutex_unlock(&G.lock);
        return -1;
    }
    int fd;
    if (G.state == ST_INIT) {
        fd = open_channel_locked_init();
        if (fd < 0) {
            G.state = ST_DEAD;
            pthread_mutex_unlock(&G.lock);
            return -1;
        }
    } else {
        fd = unix_connect(G.sock, kind != NVP_CHAN_CALLBACK);
    }
    pthread_mutex_unlock(&G.lock);
    struct nvp_rep rep;
    if (mb_out)
        *mb_out = NULL;
    if (fd < 0 || greet(fd, kind, &rep, mb_out) != 0) {
        if (fd >= 0)
            close_connected(fd, kind != NVP_CHAN_CALLBACK);
        return -1;
    }
    pthread_mutex_lock(&G.lock);
    if (G.state == ST_INIT) {
        G.ndev = (int)rep.r[0];
        G.backend = (int)rep.r[1];
        G.proxy_pid = (pid_t)rep.r[2];
        G.driver_version = (int)rep.r[3];
        G.state = ST_READY;
    }
    pthread_mutex_unlock(&G.lock);
    if (rep_out)
        *rep_out = rep;
    return fd;
}

/* A staging buffer taken by this thread: what its last owner posted is the proxy's business (it waits for
 * those copies before it hands the buffer over); this channel's posted copies are numbered from 1. */
static void posted_reset(struct nvp_staging *s)
{
    s->posted = s->posted_known = 0;
    s->pfirst = s->pcount = 0;
}

static void drop_staging(void)
{
    if (T.stg.base)
        munmap(T.stg.base, STAGING_BYTES);
    T.stg.base = NULL;
    posted_reset(&T.stg);
}

int nvp_posting(void)
{
    static int on = -1; /* NVPROXY_POSTED_COPIES=0: every staged copy is answered once done (to compare) */
    if (on < 0) {
        const char *v = getenv("NVPROXY_POSTED_COPIES");
        on = !(v && !strcmp(v, "0"));
    }
    return on && T.mb;
}

uint64_t nvp_posted_done(void) { return T.mb ? __atomic_load_n(&T.mb->posted_done, __ATOMIC_ACQUIRE) : 0; }

static cudaError_t connect_held(void)
{
    if (T.fd >= 0) { /* a new proxy replaced the one this channel went to (NVPROXY_RECOVER) */
        nvp_close_private(T.fd);
        T.fd = -1;
    }
    /* the old channel's buffers: a checkpoint closed it, the proxy was lost (mark_dead leaves them mapped, as
     * helper threads may still be copying into the staging buffer), or a new proxy replaced its proxy */
    drop_staging();
    drop_mailbox();
    if (G.state == ST_DEAD)
        return cudaErrorDevicesUnavailable;
    struct nvp_mailbox *mb;
    int fd = nvp_open_channel(NVP_CHAN_CALL, NULL, &mb);
    if (fd < 0)
        return mark_dead("no connection");
    T.fd = fd;
    T.mb = mb;
    T.unread = 0;
    T.last_seq = 0;
    T.gen = atomic_load(&G.generation);
    pthread_setspecific(G.key, &T);
    pthread_mutex_lock(&G.lock);
    int known = 0;
    for (struct nvp_thread *t = threads; t; t = t->next)
        known |= t == &T;
    if (!known) {
        T.next = threads;
        threads = &T;
    }
    pthread_mutex_unlock(&G.lock);
    if (T.dev != 0) {
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)T.dev, ~0ull};
        return nvp_call(NVP_OP_SET_DEVICE, a, NULL, 0, NULL, -1);
    }
    return cudaSuccess;
}

static __thread int exchange_depth; /* nvp_exchange calls under way on this thread */

static cudaError_t connect_once(void *arg)
{
    (void)arg;
    if (T.fd >= 0 && T.gen == atomic_load(&G.generation))
        return cudaSuccess;
    if (T.broken) /* (lost during this call: nothing more goes out before the outermost exchange recovers) */
        return cudaErrorDevicesUnavailable;
    cudaError_t e = nvp_settings_error(); /* (a bad setting: no proxy, no channel) */
    if (e)
        return e;
    /* Opened and listed under one hold (and G.lock, see thread_exit; nvp_exchange holds checkpoints off): a
     * checkpoint in between would leave a channel that nvp_disconnect_all cannot see, and after the restart its
     * stale number may name another thread's new channel, which this thread would close as its own (found by
     * reading). */
    return connect_held();
}

cudaError_t nvp_connect(void)
{
    if (T.fd >= 0 && T.gen == atomic_load(&G.generation))
        return cudaSuccess;
    return nvp_exchange(connect_once, NULL);
}

cudaError_t nvp_exchange(cudaError_t (*run)(void *arg), void *arg)
{
    if (exchange_depth) /* (inside another: that one recovers, and runs the whole call again) */
        return run(arg);
    nvp_ckpt_disable();
    cudaError_t e;
    for (int attempt = 0;; attempt++) {
        int gen = T.fd >= 0 ? T.gen : atomic_load(&G.generation);
        T.broken = 0;
        exchange_depth++;
        e = run(arg);
        exchange_depth--;
        if (!(T.broken && attempt == 0 && recover(gen)))
            break; /* (else once more, against the new proxy) */
    }
    nvp_ckpt_enable();
    return e;
}

_Static_assert(sizeof(struct nvp_mailbox) == NVP_MAILBOX_BYTES, "the mailbox is one page");
_Static_assert(sizeof(((struct nvp_mailbox *)0)->req) == NVP_MB_REQ_MAX, "NVP_MB_REQ_MAX");

/* Wait until the mailbox's slot no longer holds an earlier request (the proxy takes it within its work on the
 * message before; one that died is noticed by its socket's hang-up).  0, or -1 if the proxy is gone. */
static int slot_free(struct nvp_mailbox *mb)
{
    uint64_t start = 0;
    for (unsigned i = 0; __atomic_load_n(&mb->slot, __ATOMIC_ACQUIRE) == NVP_SLOT_POSTED; i++) {
        nvp_cpu_relax();
        if (i % 1024 != 1023)
            continue;
        uint64_t t = now_ns();
        if (!start)
            start = t;
        else if (t - start > 1000000) { /* (a millisecond: look at the socket, and stop burning the core) */
            struct pollfd pf = {.fd = T.fd, .events = POLLRDHUP};
            if (poll(&pf, 1, 0) > 0 && pf.revents & (POLLRDHUP | POLLHUP | POLLERR))
                return -1;
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

/* Post a request through the mailbox's slot (nvproxy_wire.h): 1, or 0 if the proxy is not polling the slot and
 * it must go over the socket. */
static int post(struct nvp_mailbox *mb, const struct iovec *iov, int n, size_t total)
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

static cudaError_t send_seq(struct nvp_req *h, struct iovec *iov, int n, struct nvp_mailbox *mb, int fd, int counted);

/* slot: the request may go through the mailbox's slot.  Not for requests sent several in a row before their
 * replies are read (nvp_send_pending, unless alone): the proxy takes the next from the slot only once it has answered the last,
 * and it waits for each staged copy to finish before it answers, so the thread would wait at each post instead of
 * copying (pageable copies from the device of 16-64 MiB ran at 27-35 GB/s so, against 34-38 GB/s). */
static cudaError_t send_req(uint16_t op, uint16_t flags, const uint64_t a[NVP_MAX_ARGS], const void *p1,
                            size_t l1, const void *p2, size_t l2, int fd, int slot)
{
    if (l1 + l2 > NVP_MAX_PAYLOAD)
        return cudaErrorInvalidValue;
    struct nvp_req h = {.len = (uint32_t)(sizeof h + l1 + l2), .op = op, .flags = flags};
    if (a)
        memcpy(h.a, a, sizeof h.a);
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)p1, l1}, {(void *)p2, l2}};
    int n = 1 + (l1 > 0) + (l2 > 0);
    if (l1 == 0 && l2 > 0) {
        iov[1] = iov[2];
    }
    struct nvp_mailbox *mb = slot && fd < 0 && h.len <= NVP_MB_REQ_MAX ? T.mb : NULL;
    if (mb && slot_free(mb) != 0)
        return mark_dead("the proxy hung up");
    /* the order the application made its calls in, across all threads */
    h.seq = atomic_fetch_add(&G.seq, 1) + 1;
    return send_seq(&h, iov, n, mb, fd, 1);
}

/* The request h (its seq taken) out through the mailbox's slot mb, or the socket; counted: see nvp_note_async_sent */
static cudaError_t send_seq(struct nvp_req *h, struct iovec *iov, int n, struct nvp_mailbox *mb, int fd, int counted)
{
    uint16_t op = h->op, flags = h->flags;
    T.last_seq = h->seq;
    if (!(mb && post(mb, iov, n, h->len))) {
        if (write_all(T.fd, iov, n, fd) != 0)
            return mark_dead(strerror(errno));
        if (T.mb) /* (tells a proxy polling the slot that the socket has something: no recvmsg(2) per turn) */
            __atomic_fetch_add(&T.mb->sent, 1, __ATOMIC_RELEASE);
    }
    if (!(flags & NVP_F_REPLY) && counted) /* device work that may still run after this returns */
        nvp_note_async_sent();
    if (G.trace)
        nvp_log("nvproxy: -> op %u seq %llu%s", op, (unsigned long long)h->seq, flags & NVP_F_REPLY ? "" : " (no reply)");
    return cudaSuccess;
}

/* mailbox: the request was marked NVP_F_MAILBOX */
static cudaError_t recv_reply_from(struct nvp_reply *r, int mailbox)
{
    if (read_from(T.fd, &r->h, sizeof r->h, mailbox ? T.mb : NULL) != 0)
        return mark_dead(strerror(errno));
    if (r->h.len < sizeof r->h || r->h.text_len > r->h.len - sizeof r->h)
        return mark_dead("malformed reply");
    if (r->h.text_len) {
        char buf[4096];
        size_t left = r->h.text_len;
        while (left) {
            size_t k = left < sizeof buf ? left : sizeof buf;
            if (read_all(T.fd, buf, k) != 0)
                return mark_dead("connection closed");
            fwrite(buf, 1, k, stdout);
            left -= k;
        }
        fflush(stdout);
    }
    size_t pay = r->h.len - sizeof r->h - r->h.text_len;
    size_t take = pay < r->out_cap ? pay : r->out_cap;
    if (take && read_all(T.fd, r->out, take) != 0)
        return mark_dead("connection closed");
    for (size_t left = pay - take; left;) {
        char junk[4096];
        size_t k = left < sizeof junk ? left : sizeof junk;
        if (read_all(T.fd, junk, k) != 0)
            return mark_dead("connection closed");
        left -= k;
    }
    r->out_len = take;
    if (r->h.async_err)
        nvp_note_async_error((cudaError_t)r->h.async_err);
    if (nvp_is_sticky((cudaError_t)r->h.err))
        nvp_set_sticky((cudaError_t)r->h.err);
    return (cudaError_t)r->h.err;
}

static cudaError_t recv_reply(struct nvp_reply *r) { return recv_reply_from(r, 0); }

/* ---- recovery (NVPROXY_RECOVER=image): a new proxy from the last image ---- */

static void reshare(struct nvp_host_region *h, void *arg)
{
    int *failed = arg;
    uint64_t a[NVP_MAX_ARGS] = {h->base, h->size, h->flags};
    struct nvp_req q = {.len = sizeof q, .op = NVP_OP_HOST_REGISTER, .flags = NVP_F_REPLY};
    memcpy(q.a, a, sizeof q.a);
    q.seq = atomic_fetch_add(&G.seq, 1) + 1;
    struct iovec iov = {&q, sizeof q};
    struct nvp_reply rep = {0};
    if (write_all(T.fd, &iov, 1, h->fd) != 0) {
        nvp_log("nvproxy: sharing pinned memory at %#llx with the new proxy failed: %s",
                (unsigned long long)h->base, strerror(errno));
        *failed = 1;
    } else if (recv_reply(&rep) != cudaSuccess || rep.h.err) { /* (it may carry printf text the image held) */
        nvp_log("nvproxy: the new proxy could not map pinned memory at %#llx (error %d)", (unsigned long long)h->base,
                rep.h.err);
        *failed = 1;
    }
}

/* The file of the mapping at addr, from /proc/self/maps (into path; "" when it has none) */
static void mapped_file(uint64_t addr, char *path, size_t n)
{
    *path = 0;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return;
    char line[600];
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi;
        int at = 0;
        if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %n", &lo, &hi, &at) < 2 || addr < lo || addr >= hi || !at)
            continue;
        snprintf(path, n, "%s", line + at);
        path[strcspn(path, "\n")] = 0;
        break;
    }
    fclose(f);
}

/* After a restart the descriptors behind pinned memory are gone (DMTCP 4.2 brings back the mappings, not the
 * descriptors: the old numbers name nothing, or whatever was opened since): put the restored contents into fresh
 * ones, at the same addresses.  The old numbers are forgotten, never closed: closing one closed the fresh memfd
 * of another region that had taken that number, and a thread's channel that took it next was closed by that
 * region's cudaFreeHost (callback_threads checkpointed with eight pinned buffers on a GPU: "lost the proxy (Bad
 * file descriptor)"). */
static void remake_memfd(struct nvp_host_region *h, void *arg)
{
    (void)arg;
    int old = h->fd;
    h->fd = -1;
    /* DMTCP made a file to bring the mapping back (nvp_host_fd), readable by others (0775 less the umask), and
     * removes it later in the restart: only the owner may read it meanwhile, and after a restart that fails */
    char dmtcp_file[512];
    mapped_file(h->base, dmtcp_file, sizeof dmtcp_file);
    if (!strncmp(dmtcp_file, "/dev/shm/nvproxy-", 17) && !strstr(dmtcp_file, " (deleted)"))
        chmod(dmtcp_file, 0600);
    int fd = nvp_host_fd("nvproxy-pinned", h->size);
    if (fd < 0)
        goto fail;
    void *tmp = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (tmp == MAP_FAILED)
        goto fail;
    memcpy(tmp, (void *)(uintptr_t)h->base, h->size);
    void *p = mmap((void *)(uintptr_t)h->base, h->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    munmap(tmp, h->size);
    if (p == MAP_FAILED)
        goto fail;
    h->fd = fd;
    if (nvp_trace_enabled())
        nvp_log("nvproxy: pinned memory at %#llx now in memfd %d (was %d)", (unsigned long long)h->base, fd, old);
    return;
fail:
    if (fd >= 0)
        close(fd);
    nvp_log("nvproxy: pinned memory at %#llx could not be made shareable again", (unsigned long long)h->base);
}

static int named_memfd(const char *what, unsigned flags);

int nvp_memfd(const char *what) { return named_memfd(what, MFD_CLOEXEC); }

int nvp_memfd_sealable(const char *what) { return named_memfd(what, MFD_CLOEXEC | MFD_ALLOW_SEALING); }

static unsigned long long memfd_tag; /* random: see named_memfd */

static void memfd_retag(void)
{
    unsigned long long t = 0;
    while (!t && getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t)
        ;
    __atomic_store_n(&memfd_tag, t, __ATOMIC_RELAXED);
}

/* A name for what that no other shared memory of this program or of any other has (see named_memfd) */
static void unique_name(char *name, size_t n, const char *prefix, const char *what)
{
    static unsigned long long serial;
    if (!__atomic_load_n(&memfd_tag, __ATOMIC_RELAXED))
        memfd_retag();
    snprintf(name, n, "%s%s-%d-%016llx-%llu", prefix, what, (int)getpid(), __atomic_load_n(&memfd_tag, __ATOMIC_RELAXED),
             __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
}

int nvp_host_fd(const char *what, uint64_t len)
{
    /* POSIX shared memory, its name removed at once: like a memfd, but a DMTCP restart can bring it back as any
     * user.  DMTCP 4.2 makes a file at the name of each such mapping for the restart (named_memfd), and a memfd's
     * is "/memfd:NAME", in "/": only root may make it there, and other users' restarts ended at once
     * ("JASSERT(fd != -1 || errno == EEXIST) failed; (area.name = /memfd:nvproxy-pinned-...)").  The space is
     * taken now (fallocate): /dev/shm has a size (64 MiB in a container, by default), and a page that finds it
     * full later is a SIGBUS.  Where it has no room, or is missing: a memfd, as before. */
    char name[96];
    unique_name(name, sizeof name, "/", what);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600), why;
    if (fd >= 0) {
        shm_unlink(name);
        if (fallocate(fd, 0, 0, (off_t)len) == 0)
            return fd;
        why = errno;
        close(fd);
    } else {
        why = errno;
    }
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        nvp_log("nvproxy: /dev/shm has no room for %llu bytes of %s memory (%s): in a memfd instead, which a "
                "DMTCP restart can bring back only as root", (unsigned long long)len,
                strncmp(what, "nvproxy-", 8) ? what : what + 8, strerror(why));
    fd = nvp_memfd(what);
    if (fd >= 0 && ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static int named_memfd(const char *what, unsigned flags)
{
    /* A name no other memfd has, in this program or any other: DMTCP tells shared mappings apart by their file's
     * name, and brings each back through a file of that name it makes in "/" for the restart, or maps such a file
     * as it is where one exists (DMTCP 4.2, src/plugin/ipc/file/fileconnlist.cpp).  One name for all
     * restored every "/memfd:nvproxy-pinned (deleted)" mapping of a program from one file, so two pinned
     * allocations came back with the same contents (tests/apps/graph_nodes); the (virtual) pid and a serial
     * number, the same in every program DMTCP runs, made two programs restarting at the same time share one file:
     * 2-3% of graph_capture's restarts crashed in a host callback, eight at a time on an H200, reading the other
     * program's pointer from pinned memory.  Hence a random tag, new at every restart. */
    char name[96];
    unique_name(name, sizeof name, "", what);
    return memfd_create(name, flags);
}

/* Start a new proxy from image and make this thread's channel go to it.
 * Called with G.lock held. */
static int replace_proxy(const char *image)
{
    uint64_t t0 = now_ns();
    int ok = spawn_proxy(image) == 0;
    int fd = -1;
    for (int i = 0; ok && i < 120000 && fd < 0; i++) { /* restoring the image can take a while (2 min at most) */
        fd = nvp_unix_connect(G.sock);
        if (fd >= 0)
            break;
        if (kill(G.proxy_pid, 0) != 0 && errno == ESRCH)
            ok = 0;
        struct timespec ts = {0, 1000 * 1000}; /* (the socket appears once the restore is done) */
        nanosleep(&ts, NULL);
    }
    struct nvp_rep rep;
    drop_mailbox();
    T.unread = 0;
    if (!ok || fd < 0 || greet(fd, NVP_CHAN_CALL, &rep, &T.mb) != 0) {
        if (fd >= 0)
            nvp_close_private(fd);
        G.state = ST_DEAD;
        nvp_log("nvproxy: no new proxy from %s; every CUDA call now fails with cudaErrorDevicesUnavailable", image);
        return 0;
    }
    G.proxy_pid = (pid_t)rep.r[2];
    G.state = ST_READY;
    atomic_store(&G.seq, 0);
    atomic_fetch_add(&G.generation, 1);
    drop_staging();
    if (T.fd >= 0)
        nvp_close_private(T.fd);
    T.fd = fd;
    T.gen = atomic_load(&G.generation);
    int failed = 0;
    nvp_host_foreach(reshare, &failed); /* pinned memory, at its addresses */
    nvp_registry_reset();               /* modules loaded after the image are sent again */
    if (T.dev != 0) {
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)T.dev, ~0ull};
        send_req(NVP_OP_SET_DEVICE, 0, a, NULL, 0, NULL, 0, -1, 1);
    }
    if (failed)
        nvp_log("nvproxy: some pinned host memory could not be shared with the new proxy");
    /* now the proxy makes what needs that memory (graphs whose nodes copy to or from it) */
    struct nvp_req q = {.len = sizeof q, .op = NVP_OP_RESTORE_DONE, .flags = NVP_F_REPLY};
    q.seq = atomic_fetch_add(&G.seq, 1) + 1;
    struct iovec iov = {&q, sizeof q};
    struct nvp_reply done = {0};
    /* (recv_reply: the reply carries the kernel printf text the image held, for the program's stdout) */
    if (write_all(T.fd, &iov, 1, -1) != 0 || recv_reply(&done) != cudaSuccess) {
        G.state = ST_DEAD;
        nvp_log("nvproxy: the new proxy could not finish the restore from %s (error %d); every CUDA call now fails "
                "with cudaErrorDevicesUnavailable",
                image, done.h.err);
        return 0;
    }
    nvp_log("nvproxy: a new proxy started and restored %s in %.3f s", image, (double)(now_ns() - t0) / 1e9);
    return 1;
}

static int recover(int seen_gen)
{
    const char *image = getenv("NVPROXY_RECOVER");
    if (!image || !*image)
        return 0;
    pthread_mutex_lock(&G.lock);
    if (atomic_load(&G.generation) != seen_gen) { /* another thread recovered already */
        pthread_mutex_unlock(&G.lock);
        return 1;
    }
    nvp_log("nvproxy: the proxy is gone; starting a new one from %s. GPU work and CUDA objects created after "
            "that image are lost unless the application redoes them",
            image);
    int ok = replace_proxy(image);
    pthread_mutex_unlock(&G.lock);
    if (ok) /* (an application thread: it may open the callback channel for graphs' host nodes now) */
        nvp_callbacks_resume();
    return ok;
}

/* ---- DMTCP (dmtcp.c decides when) ---- */

const char *nvp_control_path(void)
{
    static char path[sizeof G.sock + 32];
    if (G.state != ST_READY || G.proxy_pid <= 0)
        return NULL;
    snprintf(path, sizeof path, "%s.%d.ctl", G.sock, (int)G.proxy_pid);
    return path;
}

void nvp_disconnect_all(void)
{
    /* application threads are frozen, none inside a call (nvp_callv holds the
     * checkpoint off); their channels are closed under them */
    pthread_mutex_lock(&G.lock);
    for (struct nvp_thread *t = threads; t; t = t->next) {
        if (t->fd >= 0)
            nvp_close_private(t->fd);
        t->fd = -1;
        if (t->stg.base)
            munmap(t->stg.base, STAGING_BYTES);
        t->stg.base = NULL;
        posted_reset(&t->stg);
        /* (a new channel brings a new one; DMTCP would bring it back through a file at its memfd's name in "/",
         * which only root may make: see nvp_host_fd) */
        if (t->mb)
            munmap(t->mb, NVP_MAILBOX_BYTES);
        t->mb = NULL;
    }
    threads = NULL;
    drop_spares(); /* (the proxy let go of them in the checkpoint) */
    nvp_callbacks_close();
    if (G.state == ST_READY)
        G.state = ST_PAUSED;
    atomic_fetch_add(&G.generation, 1); /* the callback thread starts again on next use */
    pthread_mutex_unlock(&G.lock);
}

void nvp_reconnect_same_proxy(void)
{
    pthread_mutex_lock(&G.lock);
    if (G.state == ST_PAUSED)
        G.state = ST_READY;
    pthread_mutex_unlock(&G.lock);
}

int nvp_restore_from(const char *image)
{
    pthread_mutex_lock(&G.lock);
    nvp_log("nvproxy: restarted; restoring the GPU state from %s", image);
    int ok = replace_proxy(image);
    pthread_mutex_unlock(&G.lock);
    return ok ? 0 : -1;
}

void nvp_remake_pinned(void)
{
    /* At DMTCP's RESTART event, while the application's threads are still frozen:
     * done later (RUNNING), it raced with threads writing pinned memory, whose
     * writes made during the copy were lost (seen with tests/apps/graph_nodes). */
    memfd_retag(); /* (for the memfds made from now on: two programs restarted from one image must not share) */
    nvp_host_foreach(remake_memfd, NULL);
}

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
    int mailbox = c->reply && T.mb && !T.unread; /* (no earlier reply can be on its way) */
    e = send_req(c->op, c->reply ? NVP_F_REPLY | (mailbox ? NVP_F_MAILBOX : 0) : 0, c->a, c->p1, c->l1, c->p2, c->l2,
                 c->fd, 1);
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
    int mailbox = T.mb && !T.unread; /* (the earliest reply still to read: none can come before it) */
    if (!(e = send_req(op, NVP_F_REPLY | (mailbox ? NVP_F_MAILBOX : 0), a, NULL, 0, NULL, 0, -1, alone && mailbox))) {
        T.first_by_mailbox = T.unread ? T.first_by_mailbox : mailbox;
        T.unread++;
    }
    return e;
}

uint64_t nvp_last_request(void)
{
    return T.fd >= 0 && T.gen == atomic_load(&G.generation) ? T.last_seq : 0;
}

cudaError_t nvp_send_after(uint16_t op, const uint64_t a[NVP_MAX_ARGS], uint64_t after, int *sent)
{
    *sent = 0;
    if (!after || after != nvp_last_request() || T.unread || !T.mb)
        return cudaSuccess;
    struct nvp_req h = {.len = sizeof h, .op = op};
    memcpy(h.a, a, sizeof h.a);
    struct iovec iov = {&h, sizeof h};
    if (slot_free(T.mb) != 0)
        return mark_dead("the proxy hung up");
    uint_fast64_t expect = after; /* (taken only if no request of any thread took a number since) */
    if (!atomic_compare_exchange_strong(&G.seq, &expect, after + 1))
        return cudaSuccess;
    h.seq = after + 1;
    *sent = 1;
    return send_seq(&h, &iov, 1, T.mb, -1, 0);
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
    struct nvp_req h[NVP_SEND_MANY_MAX];
    struct iovec iov[NVP_SEND_MANY_MAX];
    int mailbox = T.mb && !T.unread;
    uint64_t seq = atomic_fetch_add(&G.seq, k) + 1;
    for (size_t i = 0; i < k; i++) {
        h[i] = (struct nvp_req){.len = sizeof h[i], .op = op, .flags = NVP_F_REPLY, .seq = seq + i};
        h[i].flags |= i == 0 && mailbox ? NVP_F_MAILBOX : 0;
        memcpy(h[i].a, a[i], sizeof h[i].a);
        iov[i] = (struct iovec){&h[i], sizeof h[i]};
    }
    if (write_all(T.fd, iov, (int)k, -1) != 0)
        return mark_dead(strerror(errno));
    if (T.mb)
        __atomic_fetch_add(&T.mb->sent, 1, __ATOMIC_RELEASE);
    T.first_by_mailbox = T.unread ? T.first_by_mailbox : mailbox;
    T.unread += (int)k;
    T.last_seq = seq + k - 1;
    if (G.trace)
        nvp_log("nvproxy: -> op %u seq %llu..%llu", op, (unsigned long long)seq, (unsigned long long)(seq + k - 1));
    return cudaSuccess;
}

cudaError_t nvp_wait_pending(struct nvp_reply *reply)
{
    int mailbox = T.unread > 0 && T.first_by_mailbox;
    T.first_by_mailbox = 0;
    if (T.unread > 0)
        T.unread--;
    return recv_reply_from(reply, mailbox);
}

cudaError_t nvp_enter(void)
{
    if (nvp_hooks_armed) /* (tests only: a load and a branch otherwise) */
        nvp_call_hooks();
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

int nvp_device_count(void) { return nvp_connect() ? 0 : G.ndev; }
int nvp_generation(void) { return atomic_load(&G.generation); }
int nvp_driver_version(void) { return nvp_connect() ? 0 : G.driver_version; }
int nvp_backend_is_sim(void) { return G.backend == 1; }
int nvp_current_device(void) { return T.dev; }
void nvp_set_current_device(int dev) { T.dev = dev; }

/* a spare staging buffer the proxy still knows, handed to this thread; 0: none (or a transport error in *err) */
static int reuse_spare(cudaError_t *err)
{
    for (;;) {
        pthread_mutex_lock(&G.lock);
        struct spare_staging *sp = spares;
        if (sp)
            spares = sp->next;
        pthread_mutex_unlock(&G.lock);
        if (!sp)
            return 0;
        int ok = 0;
        if (sp->gen == atomic_load(&G.generation)) {
            uint64_t a[NVP_MAX_ARGS] = {STAGING_BYTES, sp->addr, sp->ino};
            struct nvp_reply r = {0};
            *err = nvp_call(NVP_OP_STAGING, a, NULL, 0, &r, -1);
            ok = !*err && r.h.r[0] == sp->addr; /* (0: another proxy's, met after a migration) */
        }
        if (ok) {
            T.stg = sp->stg;
            posted_reset(&T.stg);
            T.stg_addr = sp->addr;
            T.stg_ino = sp->ino;
        } else {
            munmap(sp->stg.base, STAGING_BYTES);
        }
        free(sp);
        if (ok || *err)
            return ok;
    }
}

cudaError_t nvp_staging(struct nvp_staging **out)
{
    if (T.stg.base) {
        *out = &T.stg;
        return cudaSuccess;
    }
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    if (reuse_spare(&e)) {
        *out = &T.stg;
        return cudaSuccess;
    }
    if (e)
        return e;
    size_t size = STAGING_BYTES;
    int fd = nvp_memfd("nvproxy-staging");
    if (fd < 0)
        return cudaErrorMemoryAllocation;
    struct stat st;
    if (ftruncate(fd, (off_t)size) != 0 || fstat(fd, &st) != 0) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    uint64_t a[NVP_MAX_ARGS] = {size};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_STAGING, a, NULL, 0, &r, fd);
    close(fd);
    if (e) {
        munmap(p, size);
        return e;
    }
    T.stg.base = p;
    T.stg.slot_size = NVP_STAGE_SLOT;
    T.stg.nslots = NVP_STAGE_SLOTS;
    posted_reset(&T.stg);
    T.stg_addr = r.h.r[0];
    T.stg_ino = (uint64_t)st.st_ino;
    *out = &T.stg;
    return cudaSuccess;
}

cudaError_t nvp_unsupported(const char *call)
{
    nvp_log("nvproxy: %s is not supported by nvproxy; returning cudaErrorNotSupported", call);
    return nvp_ret(cudaErrorNotSupported);
}
