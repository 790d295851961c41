/* Loading the process-wide policy; see policy.h for the rules it follows. */
#include "intercept/policy.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/stats.h"

static struct rs_policy policy;
static pthread_mutex_t policy_lock = PTHREAD_MUTEX_INITIALIZER;
static bool policy_loaded;

static void go_kernel_only(enum rs_reason reason)
{
    policy.kernel_only = true;
    policy.kernel_only_reason = reason;
}

static void load_transport(void)
{
    const char *value = getenv("RDMASOCK_TRANSPORT");
    policy.transport = RS_TRANSPORT_AUTO;
    if (!value || !*value)
        return;
    if (rs_parse_transport(value, &policy.transport) != 0) {
        RS_LOG_ONCE(RS_LOG_ERROR, "RDMASOCK_TRANSPORT='%s' is not auto, verbs, soft or off; "
                    "every socket stays on the kernel", value);
        go_kernel_only(RS_REASON_CONFIG_ERROR);
        return;
    }
    if (policy.transport == RS_TRANSPORT_OFF)
        go_kernel_only(RS_REASON_TRANSPORT_OFF);
}

static void load_rules(void)
{
    const char *named = getenv("RDMASOCK_CONF");
    const char *path = named && *named ? named : RS_DEFAULT_CONF_PATH;
    struct rs_config_error err;
    if (rs_config_load_file(path, &policy.config, &err) == 0) {
        rs_stats_set_config(path, RS_STATS_CONFIG_OK, NULL);
        RS_DEBUG("loaded %zu rule(s) from %s", policy.config->n_rules, path);
        return;
    }
    policy.config = NULL;
    /* No file at the default place is the normal case of a machine without rules, not an error. */
    if (!(named && *named) && access(path, F_OK) != 0 && errno == ENOENT) {
        rs_stats_set_config(NULL, RS_STATS_CONFIG_NONE, NULL);
        return;
    }
    char text[600];
    rs_config_format_error(&err, text, sizeof(text));
    RS_LOG_ONCE(RS_LOG_ERROR, "%s; every socket stays on the kernel", text);
    /* The statistics area shows the path beside the text already, so keep only line:column: message there. */
    char brief[300];
    snprintf(brief, sizeof(brief), "%u:%u: %s", err.line, err.column, err.message);
    rs_stats_set_config(path, RS_STATS_CONFIG_ERROR, brief);
    go_kernel_only(RS_REASON_CONFIG_ERROR);
}

const struct rs_policy *rs_policy_get(void)
{
    if (__atomic_load_n(&policy_loaded, __ATOMIC_ACQUIRE))
        return &policy;
    pthread_mutex_lock(&policy_lock);
    if (!policy_loaded) {
        snprintf(policy.program, sizeof(policy.program), "%s", program_invocation_short_name);
        load_transport();
        load_rules();
        rs_stats_set_transport(policy.kernel_only ? "off" : rs_transport_name(policy.transport));
        __atomic_store_n(&policy_loaded, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&policy_lock);
    return &policy;
}

struct rs_decision rs_policy_decide(enum rs_proto proto, enum rs_role role, const struct sockaddr *addr)
{
    const struct rs_policy *p = rs_policy_get();
    struct rs_decision d;
    if (p->kernel_only) {
        d.rule = rs_config_kernel_rule(proto);
        d.mode = RS_MODE_KERNEL;
        d.reason = p->kernel_only_reason;
        return d;
    }
    d.rule = rs_config_match(p->config, proto, role, p->program, addr);
    d.mode = d.rule->mode;
    if (d.rule->is_default)
        d.reason = d.mode == RS_MODE_KERNEL ? RS_REASON_RULE_KERNEL : RS_REASON_DEFAULT_BOTH;
    else
        d.reason = d.mode == RS_MODE_KERNEL ? RS_REASON_RULE_KERNEL : RS_REASON_RULE_RDMA;
    return d;
}

void rs_policy_reset_for_tests(void)
{
    pthread_mutex_lock(&policy_lock);
    rs_config_free(policy.config);
    memset(&policy, 0, sizeof(policy));
    __atomic_store_n(&policy_loaded, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&policy_lock);
}
