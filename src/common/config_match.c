/* Rule matching: first match wins, then the built-in defaults.
 *
 * The defaults are chosen so that a program preloaded without any configuration never breaks a peer that does
 * not run rdmasock: TCP servers keep listening on the kernel as well (plain clients are still served), TCP
 * clients only try RDMA where the stream layer can fall back invisibly, and UDP stays on the kernel because a
 * datagram sent over RDMA to a plain peer would simply vanish. */
#include "common/config.h"

#include <fnmatch.h>
#include <netinet/in.h>
#include <string.h>

#define DEFAULT_RULE(mode_, proto_, role_) {                                                             \
        .mode = (mode_), .proto = (proto_), .role = (role_), .program_glob = NULL, .family = AF_UNSPEC,     \
        .prefix_len = 0, .port_lo = 0, .port_hi = 65535, .transport = RS_TRANSPORT_AUTO,                    \
        .stream = RS_STREAM_AUTO, .zcopy_threshold = RS_CONFIG_DEFAULT_ZCOPY_THRESHOLD,                     \
        .dgram = RS_DGRAM_SENDRECV, .qos_index = -1, .line = 0, .is_default = true,                        \
    }

static const struct rs_rule default_tcp_server = DEFAULT_RULE(RS_MODE_BOTH, RS_PROTO_TCP, RS_ROLE_SERVER);
static const struct rs_rule default_tcp_client = DEFAULT_RULE(RS_MODE_BOTH, RS_PROTO_TCP, RS_ROLE_CLIENT);
static const struct rs_rule default_tcp_any = DEFAULT_RULE(RS_MODE_BOTH, RS_PROTO_TCP, RS_ROLE_ANY);
static const struct rs_rule default_udp = DEFAULT_RULE(RS_MODE_KERNEL, RS_PROTO_UDP, RS_ROLE_ANY);
static const struct rs_rule kernel_tcp = DEFAULT_RULE(RS_MODE_KERNEL, RS_PROTO_TCP, RS_ROLE_ANY);
static const struct rs_rule kernel_udp = DEFAULT_RULE(RS_MODE_KERNEL, RS_PROTO_UDP, RS_ROLE_ANY);

static const struct rs_rule *default_rule(enum rs_proto proto, enum rs_role role)
{
    if (proto == RS_PROTO_UDP)
        return &default_udp;
    switch (role) {
    case RS_ROLE_SERVER: return &default_tcp_server;
    case RS_ROLE_CLIENT: return &default_tcp_client;
    case RS_ROLE_ANY: break;
    }
    return &default_tcp_any;
}

const struct rs_rule *rs_config_kernel_rule(enum rs_proto proto)
{
    return proto == RS_PROTO_UDP ? &kernel_udp : &kernel_tcp;
}

/* The address of a query, reduced to what rules compare against. */
struct query_addr {
    bool known;
    int family;
    uint8_t bytes[16];
    bool v4_mapped;         /* AF_INET6 ::ffff:a.b.c.d; v4 holds a.b.c.d */
    uint8_t v4[4];
    uint16_t port;
};

static void describe_query_addr(const struct sockaddr *addr, struct query_addr *q)
{
    static const uint8_t mapped_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

    memset(q, 0, sizeof(*q));
    if (!addr)
        return;
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)addr;
        q->known = true;
        q->family = AF_INET;
        memcpy(q->bytes, &sin->sin_addr, 4);
        q->port = ntohs(sin->sin_port);
    } else if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)addr;
        q->known = true;
        q->family = AF_INET6;
        memcpy(q->bytes, &sin6->sin6_addr, 16);
        q->port = ntohs(sin6->sin6_port);
        if (memcmp(q->bytes, mapped_prefix, sizeof(mapped_prefix)) == 0) {
            q->v4_mapped = true;
            memcpy(q->v4, q->bytes + 12, 4);
        }
    }
}

static bool prefix_equal(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    unsigned whole = bits / 8, rest = bits % 8;

    if (memcmp(a, b, whole) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xFFu << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

static bool address_matches(const struct rs_rule *rule, const struct query_addr *q)
{
    bool any_port = rule->port_lo == 0 && rule->port_hi == 65535;

    if (!q->known)
        return rule->family == AF_UNSPEC && any_port;
    if (q->port < rule->port_lo || q->port > rule->port_hi)
        return false;
    switch (rule->family) {
    case AF_UNSPEC:
        return true;
    case AF_INET:
        /* An IPv4 rule also covers IPv4 peers reached through a dual-stack IPv6 socket. */
        if (q->family == AF_INET)
            return prefix_equal(rule->addr, q->bytes, rule->prefix_len);
        return q->v4_mapped && prefix_equal(rule->addr, q->v4, rule->prefix_len);
    case AF_INET6:
        return q->family == AF_INET6 && prefix_equal(rule->addr, q->bytes, rule->prefix_len);
    default:
        return false;
    }
}

static bool program_matches(const struct rs_rule *rule, const char *program)
{
    if (!rule->program_glob)
        return true;
    if (!program)
        return false;
    return fnmatch(rule->program_glob, program, 0) == 0;
}

const struct rs_rule *rs_config_match(const struct rs_config *cfg, enum rs_proto proto, enum rs_role role,
                                      const char *program, const struct sockaddr *addr)
{
    struct query_addr q;

    if (program) {
        const char *slash = strrchr(program, '/');
        if (slash)
            program = slash + 1;
    }
    describe_query_addr(addr, &q);
    for (size_t i = 0; cfg && i < cfg->n_rules; i++) {
        const struct rs_rule *rule = &cfg->rules[i];
        if (rule->proto != proto)
            continue;
        if (rule->role != RS_ROLE_ANY && rule->role != role)
            continue;
        if (!address_matches(rule, &q) || !program_matches(rule, program))
            continue;
        return rule;
    }
    return default_rule(proto, role);
}
