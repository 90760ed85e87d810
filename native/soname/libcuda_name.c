/* The name libcuda.so.1, and nothing else.  Preloaded after the shim (nvproxy run does both), this library's
 * SONAME answers a program's or a library's DT_NEEDED libcuda.so.1 before the loader searches any path, DT_RPATH
 * included, so that the real libcuda is never mapped into the application; every libcuda function it calls
 * resolves to the shim's, which is earlier in the global scope.  It defines no functions of its own. */
