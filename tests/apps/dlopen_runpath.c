/* dlopen by a bare name that only the caller's RUNPATH ($ORIGIN/lib) finds: the shim's dlopen must leave the
 * caller's search path alone.  Built twice: with -DDEPENDENCY as that library, without as the program. */
#include <dlfcn.h>
#include <stdio.h>

#ifdef DEPENDENCY
int nvp_runpath_dep(void) { return 42; }
#else
int main(void) {
    void *h = dlopen("libnvp_runpath_dep.so", RTLD_NOW);
    if (!h) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    int (*dep)(void) = (int (*)(void))dlsym(h, "nvp_runpath_dep");
    printf("dependency says %d\n", dep ? dep() : -1);
    return 0;
}
#endif
