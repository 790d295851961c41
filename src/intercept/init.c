/* Library start-up when preloaded: logging first (so every later problem can be reported), then the policy.
 * Runs as an ELF constructor, before main(); nothing here may fail the host program. */
#include "common/log.h"
#include "common/stats.h"
#include "common/thread.h"
#include "intercept/policy.h"

__attribute__((constructor)) static void rs_library_init(void)
{
    rs_log_configure_from_env();
    (void)rs_self_pid();        /* its fork handlers first, so every later child handler asks a fresh cache */
    rs_stats_expect_config();
    rs_stats_init(NULL);
    const struct rs_policy *policy = rs_policy_get();
    RS_DEBUG("rdmasock %s loaded in %s: transport %s%s", RS_VERSION, policy->program,
             rs_transport_name(policy->transport), policy->kernel_only ? " (kernel only)" : "");
}
