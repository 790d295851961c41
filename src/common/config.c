/* The config module's small pieces: enum names, RDMASOCK_TRANSPORT parsing, freeing, error formatting,
 * canonical dumping and semantic comparison. The grammar is in config_parse.c, matching in config_match.c. */
#include "common/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *rs_mode_name(enum rs_mode mode)
{
    switch (mode) {
    case RS_MODE_KERNEL: return "kernel";
    case RS_MODE_RDMA: return "rdma";
    case RS_MODE_BOTH: return "both";
    }
    return "?";
}

const char *rs_proto_name(enum rs_proto proto)
{
    switch (proto) {
    case RS_PROTO_TCP: return "tcp";
    case RS_PROTO_UDP: return "udp";
    }
    return "?";
}

const char *rs_role_name(enum rs_role role)
{
    switch (role) {
    case RS_ROLE_SERVER: return "server";
    case RS_ROLE_CLIENT: return "client";
    case RS_ROLE_ANY: return "any";
    }
    return "?";
}

const char *rs_transport_name(enum rs_transport transport)
{
    switch (transport) {
    case RS_TRANSPORT_AUTO: return "auto";
    case RS_TRANSPORT_VERBS: return "verbs";
    case RS_TRANSPORT_SOFT: return "soft";
    case RS_TRANSPORT_OFF: return "off";
    }
    return "?";
}

const char *rs_stream_mode_name(enum rs_stream_mode stream)
{
    switch (stream) {
    case RS_STREAM_AUTO: return "auto";
    case RS_STREAM_BCOPY: return "bcopy";
    case RS_STREAM_ZCOPY: return "zcopy";
    }
    return "?";
}

const char *rs_dgram_mode_name(enum rs_dgram_mode dgram)
{
    switch (dgram) {
    case RS_DGRAM_SENDRECV: return "sendrecv";
    case RS_DGRAM_WRECORD: return "wrecord";
    }
    return "?";
}

int rs_parse_transport(const char *s, enum rs_transport *out)
{
    static const enum rs_transport all[] = { RS_TRANSPORT_AUTO, RS_TRANSPORT_VERBS, RS_TRANSPORT_SOFT,
                                             RS_TRANSPORT_OFF };

    for (size_t i = 0; s && i < sizeof(all) / sizeof(all[0]); i++) {
        if (strcmp(s, rs_transport_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    errno = EINVAL;
    return -1;
}

void rs_config_free(struct rs_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->n_rules; i++)
        free(cfg->rules[i].program_glob);
    free(cfg->rules);
    free(cfg->qos);
    free(cfg->source);
    free(cfg);
}

int rs_config_format_error(const struct rs_config_error *err, char *buf, size_t len)
{
    return snprintf(buf, len, "%s:%u:%u: %s", err->file, err->line, err->column, err->message);
}

/* ---- dump ------------------------------------------------------------------------------------------------- */

static void format_ports(const struct rs_rule *rule, char *buf, size_t size)
{
    if (rule->port_lo == rule->port_hi)
        snprintf(buf, size, "%u", rule->port_lo);
    else
        snprintf(buf, size, "%u-%u", rule->port_lo, rule->port_hi);
}

static void format_address(const struct rs_rule *rule, char *buf, size_t size)
{
    bool any_port = rule->port_lo == 0 && rule->port_hi == 65535;
    char ports[16] = "";
    char host[INET6_ADDRSTRLEN] = "?";
    char prefix[8] = "";

    if (!any_port)
        format_ports(rule, ports, sizeof(ports));
    if (rule->family == AF_UNSPEC) {
        snprintf(buf, size, any_port ? "*" : "*:%s", ports);
        return;
    }
    inet_ntop(rule->family, rule->addr, host, sizeof(host));
    if (rule->prefix_len != (rule->family == AF_INET ? 32 : 128))
        snprintf(prefix, sizeof(prefix), "/%u", rule->prefix_len);
    if (any_port)
        snprintf(buf, size, "%s%s", host, prefix);
    else if (rule->family == AF_INET)
        snprintf(buf, size, "%s%s:%s", host, prefix, ports);
    else
        snprintf(buf, size, "[%s%s]:%s", host, prefix, ports);
}

static void dump_size(FILE *out, const char *key, uint32_t bytes)
{
    if (bytes % (1024u * 1024u * 1024u) == 0)
        fprintf(out, " %s=%ug", key, bytes / (1024u * 1024u * 1024u));
    else if (bytes % (1024u * 1024u) == 0)
        fprintf(out, " %s=%um", key, bytes / (1024u * 1024u));
    else if (bytes % 1024u == 0)
        fprintf(out, " %s=%uk", key, bytes / 1024u);
    else
        fprintf(out, " %s=%u", key, bytes);
}

static void dump_qos(const struct rs_qos_class *qos, FILE *out)
{
    fprintf(out, "qos %s", qos->name);
    if (qos->sl != 0)
        fprintf(out, " sl=%u", qos->sl);
    if (qos->tclass != 0)
        fprintf(out, " tclass=%u", qos->tclass);
    if (qos->dscp >= 0)
        fprintf(out, " dscp=%d", qos->dscp);
    if (qos->priority >= 0)
        fprintf(out, " priority=%d", qos->priority);
    if (qos->strict)
        fputs(" strict", out);
    else if (qos->weight != 1)
        fprintf(out, " weight=%u", qos->weight);
    fputc('\n', out);
}

static void dump_rule(const struct rs_config *cfg, const struct rs_rule *rule, FILE *out)
{
    char address[INET6_ADDRSTRLEN + 32];    /* "[" host "/128]:" "65535-65535" */

    fprintf(out, "use %s %s %s", rs_mode_name(rule->mode), rs_proto_name(rule->proto), rs_role_name(rule->role));
    if (rule->program_glob)
        fprintf(out, " program %s", rule->program_glob);
    format_address(rule, address, sizeof(address));
    fprintf(out, " %s", address);
    if (rule->transport != RS_TRANSPORT_AUTO)
        fprintf(out, " transport=%s", rs_transport_name(rule->transport));
    if (rule->stream != RS_STREAM_AUTO)
        fprintf(out, " stream=%s", rs_stream_mode_name(rule->stream));
    if (rule->zcopy_threshold_given)
        dump_size(out, "zcopy_threshold", rule->zcopy_threshold);
    if (rule->lend_ring != RS_LEND_RING_AUTO)
        fprintf(out, " lend_ring=%s", rule->lend_ring == RS_LEND_RING_ON ? "on" : "off");
    if (rule->dgram != RS_DGRAM_SENDRECV)
        fprintf(out, " dgram=%s", rs_dgram_mode_name(rule->dgram));
    if (rule->qos_index >= 0 && (size_t)rule->qos_index < cfg->n_qos)
        fprintf(out, " qos=%s", cfg->qos[rule->qos_index].name);
    fputc('\n', out);
}

int rs_config_dump(const struct rs_config *cfg, FILE *out)
{
    if (!out) {
        errno = EINVAL;
        return -1;
    }
    /* Classes first: a rule may only name a class defined before it, and every class precedes every rule. */
    for (size_t i = 0; cfg && i < cfg->n_qos; i++)
        dump_qos(&cfg->qos[i], out);
    for (size_t i = 0; cfg && i < cfg->n_rules; i++)
        dump_rule(cfg, &cfg->rules[i], out);
    return ferror(out) ? -1 : 0;
}

/* ---- comparison ------------------------------------------------------------------------------------------ */

static bool qos_equal(const struct rs_qos_class *a, const struct rs_qos_class *b)
{
    return strcmp(a->name, b->name) == 0 && a->sl == b->sl && a->tclass == b->tclass && a->dscp == b->dscp &&
           a->priority == b->priority && a->weight == b->weight && a->strict == b->strict;
}

static bool rule_equal(const struct rs_rule *a, const struct rs_rule *b)
{
    bool same_glob = (!a->program_glob && !b->program_glob) ||
                     (a->program_glob && b->program_glob && strcmp(a->program_glob, b->program_glob) == 0);

    return same_glob && a->mode == b->mode && a->proto == b->proto && a->role == b->role &&
           a->family == b->family && memcmp(a->addr, b->addr, sizeof(a->addr)) == 0 &&
           a->prefix_len == b->prefix_len && a->port_lo == b->port_lo && a->port_hi == b->port_hi &&
           a->transport == b->transport && a->stream == b->stream && a->zcopy_threshold == b->zcopy_threshold &&
           a->zcopy_threshold_given == b->zcopy_threshold_given &&
           a->lend_ring == b->lend_ring && a->dgram == b->dgram && a->qos_index == b->qos_index &&
           a->is_default == b->is_default;
}

bool rs_config_equal(const struct rs_config *a, const struct rs_config *b)
{
    if (!a || !b)
        return a == b;
    if (a->n_rules != b->n_rules || a->n_qos != b->n_qos)
        return false;
    for (size_t i = 0; i < a->n_qos; i++) {
        if (!qos_equal(&a->qos[i], &b->qos[i]))
            return false;
    }
    for (size_t i = 0; i < a->n_rules; i++) {
        if (!rule_equal(&a->rules[i], &b->rules[i]))
            return false;
    }
    return true;
}
