/* Each thread's staging buffer: shared memory the proxy has registered, where pageable copies are staged
 * (memory.c), and the buffers of ended threads, kept for the next ones.  A file of its own: the buffers outlive
 * the threads and channels that use them. */
#include "transport.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Staging buffers of threads that ended, still mapped here and registered in the proxy, for the next thread: the
 * proxy unregistering one waited for the device while it held the driver, so a kernel spinning until another
 * thread's call hung for ever (multithread.cu, two GPUs).  As many as threads ever ran at once. */
struct spare_staging {
    struct nvp_staging stg;
    uint64_t addr, ino;
    int gen;
    struct spare_staging *next;
};
static struct spare_staging *spares; /* under nvp_proxy.lock */

void nvp_staging_drop_spares(void) /* (nvp_proxy.lock held, or a forked child's only thread) */
{
    while (spares) {
        struct spare_staging *sp = spares;
        spares = sp->next;
        munmap(sp->stg.base, NVP_STAGING_BYTES);
        free(sp);
    }
}

/* A staging buffer taken by this thread: what its last owner posted is the proxy's business (it waits for
 * those copies before it hands the buffer over); this channel's posted copies are numbered from 1. */
static void posted_reset(struct nvp_staging *s)
{
    s->posted = s->posted_known = 0;
    s->pfirst = s->pcount = 0;
}

void nvp_staging_unmap(struct nvp_staging *s)
{
    if (s->base)
        munmap(s->base, NVP_STAGING_BYTES);
    s->base = NULL;
    posted_reset(s);
}

void nvp_staging_drop(void) { nvp_staging_unmap(&nvp_self.stg); }

void nvp_staging_thread_end(void)
{
    struct spare_staging *sp = nvp_self.stg.base ? malloc(sizeof *sp) : NULL; /* (not under the lock) */
    pthread_mutex_lock(&nvp_proxy.lock);
    if (sp && nvp_self.gen == atomic_load(&nvp_proxy.generation)) {
        *sp = (struct spare_staging){nvp_self.stg, nvp_self.stg_addr, nvp_self.stg_ino, nvp_self.gen, spares};
        spares = sp;
        sp = NULL;
        nvp_self.stg.base = NULL;
    }
    pthread_mutex_unlock(&nvp_proxy.lock);
    free(sp);
}

/* a spare staging buffer the proxy still knows, handed to this thread; 0: none (or a transport error in *err) */
static int reuse_spare(cudaError_t *err)
{
    for (;;) {
        pthread_mutex_lock(&nvp_proxy.lock);
        struct spare_staging *sp = spares;
        if (sp)
            spares = sp->next;
        pthread_mutex_unlock(&nvp_proxy.lock);
        if (!sp)
            return 0;
        int ok = 0;
        if (sp->gen == atomic_load(&nvp_proxy.generation)) {
            uint64_t a[NVP_MAX_ARGS] = {NVP_STAGING_BYTES, sp->addr, sp->ino};
            struct nvp_reply r = {0};
            *err = nvp_call(NVP_OP_STAGING, a, NULL, 0, &r, -1);
            ok = !*err && r.h.r[0] == sp->addr; /* (0: another proxy's, met after a migration) */
        }
        if (ok) {
            nvp_self.stg = sp->stg;
            posted_reset(&nvp_self.stg);
            nvp_self.stg_addr = sp->addr;
            nvp_self.stg_ino = sp->ino;
        } else {
            munmap(sp->stg.base, NVP_STAGING_BYTES);
        }
        free(sp);
        if (ok || *err)
            return ok;
    }
}

cudaError_t nvp_staging(struct nvp_staging **out)
{
    if (nvp_self.stg.base) {
        *out = &nvp_self.stg;
        return cudaSuccess;
    }
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    if (reuse_spare(&e)) {
        *out = &nvp_self.stg;
        return cudaSuccess;
    }
    if (e)
        return e;
    size_t size = NVP_STAGING_BYTES;
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
    nvp_self.stg.base = p;
    nvp_self.stg.slot_size = NVP_STAGE_SLOT;
    nvp_self.stg.nslots = NVP_STAGE_SLOTS;
    posted_reset(&nvp_self.stg);
    nvp_self.stg_addr = r.h.r[0];
    nvp_self.stg_ino = (uint64_t)st.st_ino;
    *out = &nvp_self.stg;
    return cudaSuccess;
}
