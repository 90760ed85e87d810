/* The shim's side of test_hooks.h: where the test-only companion library installs its hooks.  A file of its own:
 * the only way in for the tests' hooks, and no more than that. */
#include "shim.h"

struct nvp_test_hooks nvp_test;

NVP_EXPORT int nvproxy_test_hooks(int version, const struct nvp_test_hooks *hooks, struct nvp_shim_services *services)
{
    if (version != NVP_TEST_HOOKS_VERSION)
        return -1;
    *services = (struct nvp_shim_services){nvp_ckpt_held, nvp_real_pid, nvp_python, nvp_env_without_shim};
    nvp_test = *hooks;
    return 0;
}
