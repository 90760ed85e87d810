/* Typed elements of library calls (cuDNN's backend attributes), one table shared by the shim and the proxy's
 * executor, both generated from the same description (native/tools/gen_libs.py): per library and type value, an
 * element's size and what it is (NVPL_ELEM_PLAIN, NVPL_ELEM_DEVICE, or the kind of the handles it holds); the
 * table ends with lib -1. */
#ifndef NVPL_ELEM_H
#define NVPL_ELEM_H

#include <stdint.h>

#define NVPL_ELEM_PLAIN (-1)
#define NVPL_ELEM_DEVICE (-2)
struct nvpl_elem_type {
    int lib;
    int64_t type;
    int size;
    int kind;
};
extern const struct nvpl_elem_type nvpl_elem_types[];
extern const int nvpl_nelem_types;

#endif
