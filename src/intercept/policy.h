/*
 * The process-wide policy: which sockets convert, decided once from the environment and the rule file.
 *
 *   RDMASOCK_TRANSPORT  auto | verbs | soft | off     (default auto; off keeps every socket on the kernel)
 *   RDMASOCK_CONF       rule file; default /etc/rdmasock.conf. A missing default file means "no rules" (the
 *                       built-in defaults apply); a missing or broken file that was named explicitly, or a broken
 *                       default file, is an error.
 *   RDMASOCK_LOG        see common/log.h
 *
 * Any error (bad file, bad environment value) is logged once and turns the whole process into "kernel only": a
 * broken configuration never crashes or hangs the host program and never sends rdmasock traffic to a peer.
 */
#ifndef RS_INTERCEPT_POLICY_H
#define RS_INTERCEPT_POLICY_H

#include <stdbool.h>
#include <sys/socket.h>

#include "common/config.h"
#include "rdmasock/stats.h"

#define RS_DEFAULT_CONF_PATH "/etc/rdmasock.conf"

struct rs_policy {
    struct rs_config *config;       /* NULL when there is no rule file or it was rejected */
    enum rs_transport transport;
    bool kernel_only;               /* every socket stays on the kernel */
    enum rs_reason kernel_only_reason;
    char program[64];               /* short name that `program GLOB` rules match */
};

/* Loads the policy once (thread-safe, idempotent); later calls return the same object. */
const struct rs_policy *rs_policy_get(void);

struct rs_decision {
    enum rs_mode mode;
    const struct rs_rule *rule;     /* never NULL: a file rule, a default, or the kernel rule */
    enum rs_reason reason;          /* why, as recorded in the statistics area */
};

/* Decides for one socket. addr: local address for servers, the peer for clients and UDP. */
struct rs_decision rs_policy_decide(enum rs_proto proto, enum rs_role role, const struct sockaddr *addr);

/* Drops the loaded policy so the next rs_policy_get() reloads it; for tests only. */
void rs_policy_reset_for_tests(void);

#endif /* RS_INTERCEPT_POLICY_H */
