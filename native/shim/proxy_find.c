/* Finding or starting the proxy: the one `nvproxy run` started (NVPROXY_SOCKET), else one this process starts
 * (a double fork past DMTCP and the program's fork handlers, without LD_PRELOAD); and the sockets that reach it,
 * made past DMTCP's wrappers.  A file of its own: how a proxy is found and started is apart from what is said to
 * it (channel.c, framing.c). */
#include "transport.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef NVP_DEFAULT_PYTHON
#define NVP_DEFAULT_PYTHON "python3"
#endif

extern pid_t dmtcp_virtual_to_real_pid(pid_t virtual_pid) __attribute__((weak));

/* DMTCP gives the application virtual pids (and wraps even syscall(SYS_getpid));
 * the proxy, outside DMTCP, knows the real one. */
pid_t nvp_real_pid(void)
{
    pid_t p = getpid();
    return dmtcp_virtual_to_real_pid ? dmtcp_virtual_to_real_pid(p) : p;
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

/* a descriptor nvp_socket_connect made: private (past DMTCP) or DMTCP's */
void nvp_socket_close(int fd, int private)
{
    if (private)
        nvp_close_private(fd);
    else
        close(fd);
}

int nvp_socket_connect(const char *path, int private)
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
        nvp_socket_close(fd, private);
        errno = e;
        return -1;
    }
    return fd;
}

int nvp_unix_connect(const char *path) { return nvp_socket_connect(path, 1); }

int nvp_read_full(int fd, void *buf, size_t n)
{
    for (char *p = buf; n;) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int nvp_send_full(int fd, const void *buf, size_t n)
{
    for (const char *p = buf; n;) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL); /* (a proxy gone: an error, not SIGPIPE in the program) */
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

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
int nvp_spawn_proxy(const char *restore_image)
{
    char dir[sizeof nvp_proxy.sock - 32];
    if (nvp_private_dir(dir, sizeof dir) != 0)
        return -1;
    snprintf(nvp_proxy.sock, sizeof nvp_proxy.sock, "%s/p%d-%lx.sock", dir, (int)nvp_real_pid(),
             (unsigned long)time(NULL));
    unlink(nvp_proxy.sock);

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
    const char *with_dmtcp[18], **args = with_dmtcp + 1;
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
    const char *image_id = restore_image ? nvp_restart_image_id() : NULL;
    const char *rest[] = {"proxy", "--socket", nvp_proxy.sock, "--owner-pid", owner, "--restore", restore_image,
                          "--image-id", image_id};
    size_t nrest = sizeof rest / sizeof *rest - (image_id ? 0 : 2) - (restore_image ? 0 : 2);
    for (size_t i = 0; i < nrest; i++)
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
    nvp_proxy.proxy_pid = pp;
    return 0;
}

/* Is pid running: neither gone nor a zombie (a proxy is nobody's child here: whoever adopted it may reap it late) */
static int proxy_alive(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1; /* (no /proc: kill's answer stands) */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *state = strrchr(buf, ')');
    return !(state && state[1] == ' ' && state[2] == 'Z');
}

/* Connect to the proxy at nvp_proxy.sock, waiting while it starts: up to 60 s for Python and the driver while the
 * proxy (nvp_proxy.proxy_pid) runs.  -2: the proxy ended before it listened (said). */
static int connect_when_listening(void)
{
    for (int i = 0; i < 6000; i++) {
        int fd = nvp_unix_connect(nvp_proxy.sock);
        if (fd >= 0)
            return fd;
        int e = errno;
        if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN)
            return -1;
        /* (a proxy that ended without ever listening: at once; one that ended after it listened (a migration's
         * old proxy, whose socket the new one holds: a migration at the program's first connecting call saw a
         * refusal on a busy machine) or one of unknown pid: up to 5 s of refusals) */
        int gone = nvp_proxy.proxy_pid <= 0 || !proxy_alive(nvp_proxy.proxy_pid);
        if (gone && e == ENOENT && nvp_proxy.proxy_pid > 0) {
            nvp_log("nvproxy: the proxy exited during start-up (see its messages above)");
            return -2;
        }
        if (gone && i >= 500)
            break;
        struct timespec ts = {0, (i < 100 ? 2 : 10) * 1000 * 1000}; /* (fine-grained while a warm proxy starts) */
        nanosleep(&ts, NULL);
        errno = e;
    }
    return -1;
}

int nvp_proxy_first_channel(void)
{
    /* the first channel of the process: find or start the proxy */
    const char *env = getenv("NVPROXY_SOCKET");
    const char *owner = getenv("NVPROXY_OWNER_PID");
    int fd;
    if (env && *env && owner && atoi(owner) == (int)nvp_real_pid()) {
        snprintf(nvp_proxy.sock, sizeof nvp_proxy.sock, "%s", env);
        const char *pp = getenv("NVPROXY_PROXY_PID");
        nvp_proxy.proxy_pid = pp ? atoi(pp) : 0;
        /* (`nvproxy run` execs the program while its proxy starts: the two starts overlap) */
        fd = connect_when_listening();
        if (fd == -1)
            nvp_log("nvproxy: cannot connect to the proxy at %s: %s", nvp_proxy.sock, strerror(errno));
    } else {
        if (nvp_spawn_proxy(NULL) != 0) {
            nvp_log("nvproxy: could not start a proxy (%s)", strerror(errno));
            return -1;
        }
        fd = connect_when_listening();
        if (fd == -1)
            nvp_log("nvproxy: the proxy did not start listening at %s", nvp_proxy.sock);
    }
    return fd < 0 ? -1 : fd;
}
