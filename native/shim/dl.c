/* dlopen interposition: a program (or a library, or an interpreter such as Python) that opens the CUDA driver,
 * the CUDA runtime, one of NVIDIA's math libraries or cuDNN by name gets the shim itself, which exports their
 * functions, so that dlsym(handle, "cuInit") yields the shim's and nothing reaches the GPU from the application's
 * process.  cuDNN's sub-libraries that hold its public functions (libcudnn_graph, _ops, _cnn, _adv) open as the shim
 * too; those that hold only its engines and heuristics (libcudnn_engines_*, _heuristic, _ext: GPU code that only the
 * real libcudnn, in the proxy, calls) are refused with one line, as there is nothing in the shim to give.
 * A statically linked runtime opens libcuda.so.1 the same way: it lands on the shim, whose cuGetExportTable
 * refuses it loudly.  Every other name goes to the real dlopen, by a tail call, so that it still sees its
 * caller's return address (the caller's RUNPATH and $ORIGIN, and its namespace, follow from it).
 *
 * RTLD_DEEPBIND is dropped: a library opened so would bind to its own dependencies first, a real libcuda among them,
 * rather than to the shim.  A library opened into another link-map namespace (dlmopen) has no shim there: one whose
 * dependencies bring a CUDA library into that namespace is closed again and refused, with one line.
 *
 * A program linked with -lcuda maps no real libcuda either: an empty library named libcuda.so.1, preloaded after the
 * shim, answers its DT_NEEDED (native/soname/libcuda_name.c).
 *
 * Under DMTCP the shim is a plugin after DMTCP's own libraries, whose dlopen wrapper calls this one as its next;
 * the next dlopen after the shim is found through dmtcp_dlsym there (plain dlsym(RTLD_NEXT) is DMTCP's wrapper). */
#include "shim.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

extern void *dmtcp_dlsym(void *handle, const char *symbol) __attribute__((weak));

typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

static dlopen_fn next_dlopen;
static dlmopen_fn next_dlmopen;

static void *next_symbol(const char *name)
{
    return dmtcp_dlsym ? dmtcp_dlsym(RTLD_NEXT, name) : dlsym(RTLD_NEXT, name);
}

/* the libraries whose functions the shim exports (libNAME.so, libNAME.so.N...) */
static const char *const INTERPOSED[] = {
    "libcuda", "libcudart", "libcublas", "libcublasLt", "libcufft", "libcurand", "libcusparse", "libcusolver",
    "libcudnn", "libcudnn_graph", "libcudnn_ops", "libcudnn_cnn", "libcudnn_adv",
};
/* libraries of GPU code the shim has no functions for (a name beginning so, then .so or _...) */
static const char *const REFUSED[] = {"libcudnn_engines", "libcudnn_heuristic", "libcudnn_ext"};

static const char *base_name(const char *path)
{
    const char *base = strrchr(path, '/');
    return base ? base + 1 : path;
}

static int interposed(const char *path)
{
    if (!path)
        return 0;
    const char *base = base_name(path);
    for (size_t i = 0; i < sizeof INTERPOSED / sizeof *INTERPOSED; i++) {
        size_t n = strlen(INTERPOSED[i]);
        const char *rest = base + n;
        if (!strncmp(base, INTERPOSED[i], n) && !strncmp(rest, ".so", 3) && (rest[3] == 0 || rest[3] == '.'))
            return 1;
    }
    return 0;
}

static int refused(const char *path)
{
    if (!path)
        return 0;
    const char *base = base_name(path);
    for (size_t i = 0; i < sizeof REFUSED / sizeof *REFUSED; i++) {
        size_t n = strlen(REFUSED[i]);
        if (!strncmp(base, REFUSED[i], n) && (base[n] == '_' || !strncmp(base + n, ".so", 3)) && strstr(base, ".so"))
            return 1;
    }
    return 0;
}

static void *refuse(const char *call, const char *file)
{
    nvp_log("nvproxy: %s(\"%s\") refused: cuDNN's engines run in the proxy, behind libcudnn's functions (which the "
            "shim exports); loaded here they would reach the GPU unprotected", call, file);
    return NULL;
}

/* a handle of the shim: dlsym on it finds the shim's functions first */
static void *self(int mode)
{
    static const char *path;
    if (!path) {
        Dl_info info;
        if (!dladdr((void *)interposed, &info) || !info.dli_fname)
            return NULL;
        path = info.dli_fname;
    }
    if (!next_dlopen)
        next_dlopen = (dlopen_fn)next_symbol("dlopen");
    int flags = RTLD_NOLOAD | (mode & (RTLD_GLOBAL | RTLD_NODELETE)) | (mode & RTLD_NOW ? RTLD_NOW : RTLD_LAZY);
    return next_dlopen ? next_dlopen(path, flags) : NULL;
}

static void trace(const char *call, const char *file)
{
    if (nvp_trace_enabled())
        nvp_log("nvproxy: %s(\"%s\"): the shim, which exports its functions", call, file);
}

NVP_EXPORT void *dlopen(const char *file, int mode)
{
    if (interposed(file)) {
        trace("dlopen", file);
        return self(mode);
    }
    if (refused(file))
        return refuse("dlopen", file);
    if (!next_dlopen)
        next_dlopen = (dlopen_fn)next_symbol("dlopen");
    if ((mode & RTLD_DEEPBIND) && nvp_trace_enabled())
        nvp_log("nvproxy: dlopen(\"%s\"): without RTLD_DEEPBIND, so that its CUDA calls reach the shim", file);
    return next_dlopen(file, mode & ~RTLD_DEEPBIND); /* (a tail call: the caller's return address stays the real
                                                      * dlopen's) */
}

/* the first CUDA library (one the shim stands for) in the link-map namespace of handle, or NULL */
static const char *cuda_in_namespace(void *handle)
{
    struct link_map *l = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &l) != 0 || !l)
        return NULL;
    while (l->l_prev)
        l = l->l_prev;
    for (; l; l = l->l_next)
        if (interposed(l->l_name) || refused(l->l_name))
            return l->l_name;
    return NULL;
}

NVP_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode)
{
    if (interposed(file)) { /* (in the program's own namespace: another one would have no shim) */
        trace("dlmopen", file);
        return self(mode);
    }
    if (refused(file))
        return refuse("dlmopen", file);
    if (!next_dlmopen)
        next_dlmopen = (dlmopen_fn)next_symbol("dlmopen");
    void *h = next_dlmopen(lmid, file, mode & ~RTLD_DEEPBIND);
    const char *cuda = h && lmid != LM_ID_BASE ? cuda_in_namespace(h) : NULL;
    if (cuda) {
        nvp_log("nvproxy: dlmopen(\"%s\") refused: it brings %s into another link-map namespace, where CUDA calls "
                "would not go through nvproxy", file, cuda);
        dlclose(h);
        return NULL;
    }
    return h;
}
