/* First-call probe of `nvproxy bench --apps` (src/nvproxy/bench/apps.py): preloaded into a program, natively and
 * under nvproxy alike, it writes when the program's first CUDA runtime call returned, as
 * "SECONDS FUNCTION\n" (CLOCK_MONOTONIC) appended to the file $NVP_FIRST_CALL_FILE; without that variable it does
 * nothing.
 *
 * It works the same whichever library answers the call (libcudart natively, nvproxy's shim, preloaded ahead of
 * this one): at load time it points the executable's GOT entries of cuda* functions at trampolines, resolved as the
 * executable would resolve them, and once the first call has returned it puts every entry back, so the rest of the
 * run pays nothing.  The trampolines need no signatures: the first call's return address is set aside and the call
 * made from the trampoline itself, so stack arguments stay where the callee expects them.  x86-64 only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_SLOTS 1024 /* (libcudart.so.13 exports 422 functions) */

struct slot {
    void **got;
    const char *name;
};

static struct slot slots[MAX_SLOTS];
static int nslots;
static char out_path[4096];
static uintptr_t relro_lo, relro_hi;

/* read and written by the trampolines below */
__attribute__((visibility("hidden"))) void *nvpfc_real[MAX_SLOTS];
__attribute__((visibility("hidden"))) int nvpfc_claimed; /* 1 once a call took the first-call path */
__attribute__((visibility("hidden"))) int nvpfc_first;   /* that call's slot */
__attribute__((visibility("hidden"))) void *nvpfc_ret;   /* its caller's return address */
__attribute__((visibility("hidden"))) void nvpfc_returned(void);

/* Stub i: %r11 = i (a scratch register no call passes anything in), then the common part.  The common part jumps
 * straight to the real function, except for the one call that claims nvpfc_claimed first: that one is called
 * with its return address set aside, and nvpfc_returned runs after it with the return registers kept. */
__asm__(
    ".text\n"
    ".p2align 4\n"
    "nvpfc_stubs:\n"
    "  .set i, 0\n"
    "  .rept 1024\n"
    "  .p2align 4\n"
    "  movl $i, %r11d\n"
    "  jmp nvpfc_common\n"
    "  .set i, i + 1\n"
    "  .endr\n"
    ".p2align 4\n"
    "nvpfc_common:\n"
    "  leaq nvpfc_real(%rip), %r10\n"
    "  movq (%r10,%r11,8), %r10\n"
    "  cmpl $0, nvpfc_claimed(%rip)\n"
    "  jne 1f\n"
    "  pushq %rax\n" /* (%al: a variadic call's count of vector registers) */
    "  pushq %r11\n"
    "  xorl %eax, %eax\n"
    "  movl $1, %r11d\n"
    "  lock cmpxchgl %r11d, nvpfc_claimed(%rip)\n"
    "  popq %r11\n"
    "  popq %rax\n"
    "  jne 1f\n"
    "  movl %r11d, nvpfc_first(%rip)\n"
    "  popq %r11\n"
    "  movq %r11, nvpfc_ret(%rip)\n"
    "  call *%r10\n"
    "  subq $48, %rsp\n"
    "  movq %rax, 0(%rsp)\n"
    "  movq %rdx, 8(%rsp)\n"
    "  movdqu %xmm0, 16(%rsp)\n"
    "  movdqu %xmm1, 32(%rsp)\n"
    "  call nvpfc_returned\n"
    "  movq 0(%rsp), %rax\n"
    "  movq 8(%rsp), %rdx\n"
    "  movdqu 16(%rsp), %xmm0\n"
    "  movdqu 32(%rsp), %xmm1\n"
    "  addq $48, %rsp\n"
    "  pushq nvpfc_ret(%rip)\n"
    "  ret\n"
    "1:\n"
    "  jmp *%r10\n");

extern char nvpfc_stubs[];

static void set_got(void **got, void *value)
{
    uintptr_t a = (uintptr_t)got;
    if (a >= relro_lo && a < relro_hi) {
        long page = sysconf(_SC_PAGESIZE);
        void *p = (void *)(a & ~(uintptr_t)(page - 1));
        if (mprotect(p, (size_t)page, PROT_READ | PROT_WRITE) != 0)
            return;
        *got = value;
        mprotect(p, (size_t)page, PROT_READ);
        return;
    }
    *got = value;
}

void nvpfc_returned(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    for (int i = 0; i < nslots; i++)
        set_got(slots[i].got, nvpfc_real[i]);
    char line[256];
    int n = snprintf(line, sizeof line, "%lld.%09ld %s\n", (long long)t.tv_sec, t.tv_nsec, slots[nvpfc_first].name);
    int fd = open(out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) != n)
            fprintf(stderr, "nvproxy first-call probe: could not write %s\n", out_path);
        close(fd);
    }
}

static uintptr_t dyn_addr(const struct dl_phdr_info *info, ElfW(Addr) value)
{
    /* (ld.so has made some of the dynamic section's addresses absolute already) */
    return value < info->dlpi_addr ? info->dlpi_addr + value : value;
}

static void hook(const struct dl_phdr_info *info, const ElfW(Rela) *rel, size_t bytes, const ElfW(Sym) *symtab,
                 const char *strtab, uintptr_t lo, uintptr_t hi)
{
    for (size_t k = 0; k < bytes / sizeof *rel && nslots < MAX_SLOTS; k++) {
        unsigned type = (unsigned)ELF64_R_TYPE(rel[k].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
            continue;
        const char *name = strtab + symtab[ELF64_R_SYM(rel[k].r_info)].st_name;
        if (strncmp(name, "cuda", 4) != 0)
            continue;
        void **got = (void **)(info->dlpi_addr + rel[k].r_offset);
        uintptr_t bound = (uintptr_t)*got;
        /* (lazily bound: the entry still points into the executable's PLT) */
        void *real = bound >= lo && bound < hi ? dlsym(RTLD_DEFAULT, name) : (void *)bound;
        if (!real)
            continue;
        nvpfc_real[nslots] = real;
        slots[nslots].got = got;
        slots[nslots].name = name;
        set_got(got, nvpfc_stubs + 16 * nslots);
        nslots++;
    }
}

static int the_executable(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
        else if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = info->dlpi_addr + ph->p_vaddr;
            relro_hi = relro_lo + ph->p_memsz;
        } else if (ph->p_type == PT_LOAD) {
            uintptr_t a = info->dlpi_addr + ph->p_vaddr;
            lo = a < lo ? a : lo;
            hi = a + ph->p_memsz > hi ? a + ph->p_memsz : hi;
        }
    }
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmpsz = 0, relasz = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_addr(info, dyn->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_addr(info, dyn->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_addr(info, dyn->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmpsz = dyn->d_un.d_val; break;
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_addr(info, dyn->d_un.d_ptr); break;
        case DT_RELASZ: relasz = dyn->d_un.d_val; break;
        default: break;
        }
    }
    if (symtab && strtab) {
        if (jmprel)
            hook(info, jmprel, jmpsz, symtab, strtab, lo, hi);
        if (rela)
            hook(info, rela, relasz, symtab, strtab, lo, hi);
    }
    return 1; /* (the executable comes first: nothing else is looked at) */
}

__attribute__((constructor)) static void nvpfc_init(void)
{
    const char *path = getenv("NVP_FIRST_CALL_FILE");
    if (!path || !*path || strlen(path) >= sizeof out_path)
        return;
    strcpy(out_path, path);
    dl_iterate_phdr(the_executable, NULL);
}
