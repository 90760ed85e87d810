/* After a DMTCP restart: pinned memory put back into fresh shared memory at the same addresses (DMTCP brings
 * back the mappings, not their descriptors), so that a new proxy can map it again.  A file of its own: it runs
 * only at DMTCP's RESTART event, while the program's threads are frozen. */
#include "transport.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

void nvp_remake_pinned(void)
{
    /* At DMTCP's RESTART event, while the application's threads are still frozen:
     * done later (RUNNING), it raced with threads writing pinned memory, whose
     * writes made during the copy were lost (seen with tests/apps/graph_nodes). */
    nvp_memfd_retag(); /* (for the memfds made from now on: two programs restarted from one image must not share) */
    nvp_host_foreach(remake_memfd, NULL);
}
