/* The shim's driver API tables, generated into gen_driver_exports.c (native/tools/gen_driver.py) from what the
 * real libcuda.so.1 says of itself: no CUDA header, so that the generated stubs may take no arguments. */
#ifndef NVP_DRIVER_TABLES_H
#define NVP_DRIVER_TABLES_H

/* which stream flag of cuGetProcAddress a row answers */
enum { NVP_PROC_ANY = 0, NVP_PROC_LEGACY = 1, NVP_PROC_PER_THREAD = 2 };

/* cuGetProcAddress(base, version, flags): the function of the base's row of that kind with the highest first
 * version not above the version asked for (none: the version is too old); sorted by base (strcmp), kind, version */
struct nvp_drv_proc {
    const char *base;
    int kind;
    int version;
    void (*fn)(void);
};
extern const struct nvp_drv_proc nvp_drv_procs[];
extern const int nvp_drv_nprocs;

struct nvp_drv_error {
    int code;
    const char *name, *text;
};
extern const struct nvp_drv_error nvp_drv_errors[]; /* sorted by code */
extern const int nvp_drv_nerrors;

#endif
