// A program with no CUDA of its own that calls a library carrying its own static CUDA runtime (static_runtime_lib).
#include <cstdio>

extern "C" int static_lib_add_one(int v);

int main() {
    printf("static_lib_add_one(41) = %d\n", static_lib_add_one(41));
    return 0;
}
