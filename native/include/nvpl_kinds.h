/* Handle kinds a used handle may have besides its parameter's (a cuBLAS handle given where cuBLASLt takes its own
 * handle, as cuBLAS's documentation allows), one table shared by the shim and the proxy's executor, both generated
 * from the same description (native/tools/gen_libs.py: the annotations' ACCEPTED_HANDLES).  Handles created or
 * destroyed are of their parameter's kind alone. */
#ifndef NVPL_KINDS_H
#define NVPL_KINDS_H

struct nvpl_kind_accept {
    int kind;  /* a parameter's kind */
    int other; /* a kind it takes too */
};
extern const struct nvpl_kind_accept nvpl_kind_accepts[];
extern const int nvpl_nkind_accepts;

/* does a used handle parameter of kind `kind` take a handle of kind `given`? */
static inline int nvpl_kind_takes(int kind, int given)
{
    if (given == kind)
        return 1;
    for (int i = 0; i < nvpl_nkind_accepts; i++)
        if (nvpl_kind_accepts[i].kind == kind && nvpl_kind_accepts[i].other == given)
            return 1;
    return 0;
}

#endif
