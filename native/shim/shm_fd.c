/* Shared-memory descriptors for what the proxy maps too (pinned and registered host memory, staging buffers,
 * mailboxes): memfds and POSIX shared memory, each with a name no other has.  A file of its own: the names are
 * what DMTCP brings mappings back by, and their rules hold for every kind of shared memory. */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int named_memfd(const char *what, unsigned flags);

int nvp_memfd(const char *what) { return named_memfd(what, MFD_CLOEXEC); }

int nvp_memfd_sealable(const char *what) { return named_memfd(what, MFD_CLOEXEC | MFD_ALLOW_SEALING); }

static unsigned long long memfd_tag; /* random: see named_memfd */

void nvp_memfd_retag(void)
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
        nvp_memfd_retag();
    snprintf(name, n, "%s%s-%d-%016llx-%llu", prefix, what, (int)getpid(), __atomic_load_n(&memfd_tag, __ATOMIC_RELAXED),
             __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
}

static int host_fd(const char *what, uint64_t len, int take);

int nvp_host_fd(const char *what, uint64_t len) { return host_fd(what, len, 1); }

int nvp_host_fd_untaken(const char *what, uint64_t len) { return host_fd(what, len, 0); }

/* Room for len more bytes in the file system of fd (a check only: others may take it first) */
static int room_for(int fd, uint64_t len)
{
    struct statvfs v;
    if (fstatvfs(fd, &v) != 0 || (uint64_t)v.f_bavail * v.f_frsize >= len)
        return 1;
    errno = ENOSPC;
    return 0;
}

static int host_fd(const char *what, uint64_t len, int take)
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
        if (take ? fallocate(fd, 0, 0, (off_t)len) == 0 : room_for(fd, len) && ftruncate(fd, (off_t)len) == 0)
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
     * graph_capture's restarts, several at a time, now and then crashed in a host callback, reading the other
     * program's pointer from pinned memory.  Hence a random tag, new at every restart. */
    char name[96];
    unique_name(name, sizeof name, "", what);
    return memfd_create(name, flags);
}
