/* dgram_policy.c: the rule file as a datagram socket's peer policy (rdmasock.conf(5): for UDP the address is
 * always the peer's; dgram=, transport= and qos= come from the matching rule). */
#include <string.h>

#include "dgram_wr/dgram.h"

void rs_dgram_config_policy(void *arg, enum rs_role role, const struct sockaddr *peer,
                            struct rs_dgram_peer_policy *out)
{
    const struct rs_dgram_config_policy *cp = arg;
    memset(out, 0, sizeof(*out));
    const struct rs_config *cfg = cp ? cp->cfg : NULL;
    const struct rs_rule *r = rs_config_match(cfg, RS_PROTO_UDP, role, cp ? cp->program : NULL, peer);
    out->mode = r->mode;
    out->dgram = r->dgram;
    out->transport = r->transport;
    if (cfg && r->qos_index >= 0 && (size_t)r->qos_index < cfg->n_qos) {
        const struct rs_qos_class *q = &cfg->qos[r->qos_index];
        out->has_qos = true;
        out->sl = q->sl;
        /* DSCP, when given, is the top six bits of the traffic class. */
        out->tclass = q->dscp >= 0 ? (uint8_t)(q->dscp << 2) : q->tclass;
    }
}
