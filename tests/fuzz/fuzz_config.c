/* Fuzz target for the rule language: any byte string must either parse or fail cleanly, never crash, leak or
 * read out of bounds. A configuration that parses must survive a dump/parse round trip unchanged, and
 * rs_config_match must agree with a deliberately naive reference matcher on queries derived from the input. */
#include <arpa/inet.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dump_to_string(const struct rs_config *cfg, size_t *len)
{
    char *text = NULL;
    FILE *out = open_memstream(&text, len);

    if (!out)
        abort();
    if (rs_config_dump(cfg, out) != 0)
        abort();
    if (fclose(out) != 0 || !text)
        abort();
    return text;
}

static void check_error(const struct rs_config_error *err, const uint8_t *data, size_t size)
{
    char formatted[600];
    size_t lines = 1;

    for (size_t i = 0; i < size; i++)
        lines += data[i] == '\n';
    if (err->message[0] == '\0' || memchr(err->message, '\0', sizeof(err->message)) == NULL)
        abort();
    /* Only file-level errors (size) have no position; everything in a buffer has a line and a column. */
    if (size <= RS_CONFIG_MAX_FILE_BYTES && (err->line == 0 || err->column == 0))
        abort();
    if (err->line > lines || err->column > RS_CONFIG_MAX_LINE_BYTES + 1)
        abort();
    if (rs_config_format_error(err, formatted, sizeof(formatted)) <= 0)
        abort();
}

/* Reference semantics, written for obviousness rather than speed: bit by bit, no shortcuts. */
static int bit_at(const uint8_t *bytes, unsigned bit)
{
    return (bytes[bit / 8] >> (7 - bit % 8)) & 1;
}

static bool reference_address_match(const struct rs_rule *rule, const struct sockaddr *addr)
{
    bool any_port = rule->port_lo == 0 && rule->port_hi == 65535;
    uint8_t bytes[16];
    unsigned port;
    int family;

    if (!addr)
        return rule->family == AF_UNSPEC && any_port;
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)addr;
        memcpy(bytes, &sin->sin_addr, 4);
        port = ntohs(sin->sin_port);
        family = AF_INET;
    } else {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)addr;
        memcpy(bytes, &sin6->sin6_addr, 16);
        port = ntohs(sin6->sin6_port);
        family = AF_INET6;
        if (rule->family == AF_INET && IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) {
            memmove(bytes, bytes + 12, 4);
            family = AF_INET;
        }
    }
    if (port < rule->port_lo || port > rule->port_hi)
        return false;
    if (rule->family == AF_UNSPEC)
        return true;
    if (rule->family != family)
        return false;
    for (unsigned bit = 0; bit < rule->prefix_len; bit++) {
        if (bit_at(bytes, bit) != bit_at(rule->addr, bit))
            return false;
    }
    return true;
}

static const struct rs_rule *reference_match(const struct rs_config *cfg, enum rs_proto proto, enum rs_role role,
                                             const char *program, const struct sockaddr *addr)
{
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const struct rs_rule *rule = &cfg->rules[i];
        if (rule->proto == proto && (rule->role == RS_ROLE_ANY || rule->role == role) &&
            (!rule->program_glob || (program && fnmatch(rule->program_glob, program, 0) == 0)) &&
            reference_address_match(rule, addr))
            return rule;
    }
    return NULL;
}

/* Queries aimed at the configuration itself (each rule's own address and port, slightly perturbed) so that
 * matches actually happen, plus a few fixed ones. */
static void check_matching(const struct rs_config *cfg, const uint8_t *data, size_t size)
{
    static const char *const programs[] = { "nginx", "redis-server", "a", "" };
    uint8_t salt = size ? data[size - 1] : 0;

    for (size_t i = 0; i <= cfg->n_rules && i < 64; i++) {
        struct sockaddr_in sin = { .sin_family = AF_INET };
        struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6 };
        struct sockaddr_in6 mapped = { .sin6_family = AF_INET6 };
        const struct rs_rule *source = i < cfg->n_rules ? &cfg->rules[i] : NULL;
        uint16_t port = source ? (uint16_t)(source->port_lo + (salt & 1)) : salt;

        if (source && source->family == AF_INET6)
            memcpy(&sin6.sin6_addr, source->addr, 16);
        if (source && source->family == AF_INET)
            memcpy(&sin.sin_addr, source->addr, 4);
        sin6.sin6_addr.s6_addr[salt % 16] ^= (uint8_t)(salt >> 4);
        ((uint8_t *)&sin.sin_addr)[salt % 4] ^= (uint8_t)(salt >> 4);
        mapped.sin6_addr.s6_addr[10] = 0xff;
        mapped.sin6_addr.s6_addr[11] = 0xff;
        memcpy(&mapped.sin6_addr.s6_addr[12], &sin.sin_addr, 4);
        sin.sin_port = sin6.sin6_port = mapped.sin6_port = htons(port);

        const struct sockaddr *addrs[] = { (struct sockaddr *)&sin, (struct sockaddr *)&sin6,
                                           (struct sockaddr *)&mapped, NULL };
        const char *program = source && source->program_glob ? source->program_glob : programs[salt % 4];
        for (int proto = RS_PROTO_TCP; proto <= RS_PROTO_UDP; proto++) {
            for (int role = RS_ROLE_SERVER; role <= RS_ROLE_ANY; role++) {
                for (size_t a = 0; a < sizeof(addrs) / sizeof(addrs[0]); a++) {
                    const struct rs_rule *got = rs_config_match(cfg, (enum rs_proto)proto, (enum rs_role)role,
                                                                program, addrs[a]);
                    const struct rs_rule *want = reference_match(cfg, (enum rs_proto)proto, (enum rs_role)role,
                                                                 program, addrs[a]);
                    if (!got || (want && got != want) || (!want && !got->is_default))
                        abort();
                    if (got->is_default && (got->proto != (enum rs_proto)proto || got->line != 0))
                        abort();
                    if ((enum rs_proto)proto == RS_PROTO_UDP && got->is_default && got->mode != RS_MODE_KERNEL)
                        abort();
                }
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct rs_config *cfg = (struct rs_config *)0x1;
    struct rs_config_error err;

    if (rs_config_parse_buffer("fuzz.conf", (const char *)data, size, &cfg, &err) != 0) {
        if (cfg != NULL)
            abort();
        check_error(&err, data, size);
        return 0;
    }
    if (!cfg || cfg->n_rules > RS_CONFIG_MAX_RULES || cfg->n_qos > RS_CONFIG_MAX_QOS)
        abort();

    size_t first_len = 0, second_len = 0;
    char *first = dump_to_string(cfg, &first_len);
    struct rs_config *again = NULL;
    if (rs_config_parse_buffer("dump", first, first_len, &again, &err) != 0) {
        char formatted[600];
        rs_config_format_error(&err, formatted, sizeof(formatted));
        fprintf(stderr, "dump does not parse: %s\n--- dump ---\n%s", formatted, first);
        abort();
    }
    if (!rs_config_equal(cfg, again)) {
        fprintf(stderr, "dump parses to a different configuration\n--- dump ---\n%s", first);
        abort();
    }
    char *second = dump_to_string(again, &second_len);
    if (first_len != second_len || memcmp(first, second, first_len) != 0)
        abort();

    check_matching(cfg, data, size);

    free(first);
    free(second);
    rs_config_free(again);
    rs_config_free(cfg);
    return 0;
}
