/* The grammar of rdmasock.conf: `use` rules and `qos` classes, one statement per line (rdmasock.conf(5)).
 *
 * The parser works line by line with a cursor lexer and no recursion; every statement is parsed into a local
 * value and only appended to the configuration once it is complete, so the first error can simply free what
 * was built so far. Memory is bounded by the limits in config.h whatever the input. */
#include "common/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config_lexer.h"

/* Enough for any quoted token produced by rs_cfg_describe plus its quotes and ellipsis. */
#define DESCRIBE_BUF 64

struct parser {
    struct rs_config *cfg;
    struct rs_config_error *err;
    struct rs_cfg_lexer lexer;
    unsigned line;
    size_t rules_capacity;
    size_t qos_capacity;
    unsigned qos_line[RS_CONFIG_MAX_QOS];   /* where each class was defined, for "already defined" errors */
};

/* A piece of a token (the host of "10.0.0.0/8:80", its prefix, its port), with its own column. */
struct span {
    const char *text;
    size_t len;
    unsigned column;
};

static int fail(struct parser *p, unsigned column, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct parser *p, unsigned column, const char *fmt, ...)
{
    va_list ap;

    p->err->line = p->line;
    p->err->column = column;
    va_start(ap, fmt);
    vsnprintf(p->err->message, sizeof(p->err->message), fmt, ap);
    va_end(ap);
    errno = EINVAL;
    return -1;
}

static struct span span_of(const struct rs_cfg_token *tok)
{
    struct span s = { tok->text, tok->len, tok->column };
    return s;
}

static struct span subspan(struct span s, size_t from, size_t len)
{
    struct span sub = { s.text + from, len, s.column + (unsigned)from };
    return sub;
}

static const char *quote(struct span s, char *buf)
{
    return rs_cfg_describe_text(s.text, s.len, buf, DESCRIBE_BUF);
}

static bool span_is(struct span s, const char *word)
{
    size_t word_len = strlen(word);
    return s.len == word_len && memcmp(s.text, word, word_len) == 0;
}

static int lookup_word(struct span s, const char *const *words, size_t n_words)
{
    for (size_t i = 0; i < n_words; i++) {
        if (span_is(s, words[i]))
            return (int)i;
    }
    return -1;
}

/* A word that only differs in case gets a hint: "USE" or "TCP" is the likeliest mistake there is. */
static bool matches_ignoring_case(struct span s, const char *const *words, size_t n_words)
{
    for (size_t i = 0; i < n_words; i++) {
        if (strlen(words[i]) == s.len && strncasecmp(s.text, words[i], s.len) == 0)
            return true;
    }
    return false;
}

/* Reads the next token and requires it to be one of words; expected is the human list for the message. */
static int expect_keyword(struct parser *p, const char *const *words, size_t n_words, const char *expected,
                          struct rs_cfg_token *tok)
{
    char found[DESCRIBE_BUF];

    if (!rs_cfg_next_token(&p->lexer, tok))
        return fail(p, tok->column, "expected %s, found end of line", expected);
    int index = lookup_word(span_of(tok), words, n_words);
    if (index >= 0)
        return index;
    return fail(p, tok->column, "expected %s, found %s%s", expected, rs_cfg_describe(tok, found, sizeof(found)),
                matches_ignoring_case(span_of(tok), words, n_words) ? " (keywords are lower-case)" : "");
}

/* Returns array with room for one more element (possibly moved), or NULL with array left untouched. */
static void *grow(void *array, size_t *capacity, size_t used, size_t element_size, size_t max)
{
    if (used < *capacity)
        return array;
    size_t new_capacity = *capacity ? *capacity * 2 : 8;
    if (new_capacity > max)
        new_capacity = max;
    void *bigger = realloc(array, new_capacity * element_size);
    if (bigger)
        *capacity = new_capacity;
    return bigger;
}

/* ---- numbers ---------------------------------------------------------------------------------------------- */

/* A number in lo..hi for `what`, e.g. "sl" or "port"; errors name the setting and its range. */
static int parse_ranged(struct parser *p, struct span value, const char *what, unsigned lo, unsigned hi,
                        unsigned *out)
{
    char found[DESCRIBE_BUF];
    uint64_t number = 0;

    switch (rs_cfg_parse_uint(value.text, value.len, hi, &number)) {
    case RS_CFG_NUM_INVALID:
        return fail(p, value.column, "expected a number %u-%u for %s, found %s", lo, hi, what, quote(value, found));
    case RS_CFG_NUM_RANGE:
        return fail(p, value.column, "%s %.*s out of range (%u-%u)", what, (int)value.len, value.text, lo, hi);
    case RS_CFG_NUM_OK:
        break;
    }
    if (number < lo)
        return fail(p, value.column, "%s %.*s out of range (%u-%u)", what, (int)value.len, value.text, lo, hi);
    *out = (unsigned)number;
    return 0;
}

/* SIZE: bytes with an optional k/K (1024), m/M (1024^2) or g/G (1024^3) suffix. */
static int parse_size(struct parser *p, struct span value, const char *what, uint32_t lo, uint32_t hi,
                      uint32_t *out)
{
    char found[DESCRIBE_BUF];
    uint64_t multiplier = 1;
    struct span digits = value;

    if (digits.len > 0) {
        switch (digits.text[digits.len - 1]) {
        case 'k': case 'K': multiplier = 1024; digits.len--; break;
        case 'm': case 'M': multiplier = 1024 * 1024; digits.len--; break;
        case 'g': case 'G': multiplier = 1024 * 1024 * 1024; digits.len--; break;
        default: break;
        }
    }
    uint64_t number = 0;
    /* 2^33 is above every valid value (at most 2^30 bytes) and 2^33 * 2^30 still fits in 64 bits. */
    switch (rs_cfg_parse_uint(digits.text, digits.len, (uint64_t)1 << 33, &number)) {
    case RS_CFG_NUM_INVALID:
        return fail(p, value.column, "expected a size in bytes (optional suffix k, m or g) for %s, found %s", what,
                    quote(value, found));
    case RS_CFG_NUM_RANGE:
        number = UINT64_MAX / multiplier;
        break;
    case RS_CFG_NUM_OK:
        break;
    }
    uint64_t bytes = number * multiplier;
    if (bytes < lo || bytes > hi)
        return fail(p, value.column, "%s %.*s out of range (%uk-%ug)", what, (int)value.len, value.text,
                    lo / 1024u, hi / (1024u * 1024u * 1024u));
    *out = (uint32_t)bytes;
    return 0;
}

/* ---- addresses ---------------------------------------------------------------------------------------------- */

/* Dotted quad only, each part 0-255 without leading zeros: "010" means 8 to inet_aton and 10 to a human. */
static bool parse_ipv4(struct span s, uint8_t out[4])
{
    size_t pos = 0;

    for (int part = 0; part < 4; part++) {
        if (part > 0) {
            if (pos >= s.len || s.text[pos] != '.')
                return false;
            pos++;
        }
        size_t start = pos;
        unsigned value = 0;
        while (pos < s.len && pos - start < 3 && s.text[pos] >= '0' && s.text[pos] <= '9')
            value = value * 10 + (unsigned)(s.text[pos++] - '0');
        size_t digits = pos - start;
        if (digits == 0 || value > 255 || (digits > 1 && s.text[start] == '0'))
            return false;
        out[part] = (uint8_t)value;
    }
    return pos == s.len;
}

static bool parse_ipv6(struct span s, uint8_t out[16])
{
    char text[INET6_ADDRSTRLEN + 1];

    if (s.len == 0 || s.len >= sizeof(text))
        return false;
    memcpy(text, s.text, s.len);
    text[s.len] = '\0';
    return inet_pton(AF_INET6, text, out) == 1;
}

static bool only_digits_and_dots(struct span s)
{
    for (size_t i = 0; i < s.len; i++) {
        if (s.text[i] != '.' && (s.text[i] < '0' || s.text[i] > '9'))
            return false;
    }
    return s.len > 0;
}

static bool host_bits_clear(const uint8_t *addr, unsigned addr_bytes, unsigned prefix_len)
{
    for (unsigned bit = prefix_len; bit < addr_bytes * 8; bit++) {
        if (addr[bit / 8] & (0x80u >> (bit % 8)))
            return false;
    }
    return true;
}

/* ADDR[/PREFIX] of the given family. */
static int parse_host(struct parser *p, struct span s, int family, struct rs_rule *rule)
{
    char found[DESCRIBE_BUF];
    const char *slash = memchr(s.text, '/', s.len);
    struct span host = subspan(s, 0, slash ? (size_t)(slash - s.text) : s.len);
    unsigned max_prefix = family == AF_INET ? 32 : 128;

    memset(rule->addr, 0, sizeof(rule->addr));
    if (family == AF_INET) {
        if (!parse_ipv4(host, rule->addr)) {
            if (only_digits_and_dots(host))
                return fail(p, host.column, "invalid IPv4 address %s (expected 4 numbers 0-255 without leading "
                            "zeros)", quote(host, found));
            return fail(p, host.column, "expected an address (IPv4, IPv6 or *), found %s", quote(host, found));
        }
    } else if (!parse_ipv6(host, rule->addr)) {
        return fail(p, host.column, "invalid IPv6 address %s", quote(host, found));
    }
    rule->family = family;
    rule->prefix_len = (uint8_t)max_prefix;

    if (slash) {
        struct span prefix = subspan(s, host.len + 1, s.len - host.len - 1);
        uint64_t value = 0;
        enum rs_cfg_num status = rs_cfg_parse_uint(prefix.text, prefix.len, 999, &value);
        if (status == RS_CFG_NUM_INVALID) {
            bool looks_like_port = family == AF_INET6 && memchr(prefix.text, ':', prefix.len) != NULL;
            return fail(p, prefix.column, "expected a prefix length 0-%u after '/', found %s%s", max_prefix,
                        quote(prefix, found),
                        looks_like_port ? " (an IPv6 address with a port must be bracketed: [ADDR/PREFIX]:PORT)"
                                        : "");
        }
        if (status == RS_CFG_NUM_RANGE || value > max_prefix)
            return fail(p, prefix.column, "prefix length %.*s out of range (0-%u)", (int)prefix.len, prefix.text,
                        max_prefix);
        rule->prefix_len = (uint8_t)value;
    }
    if (!host_bits_clear(rule->addr, max_prefix / 8, rule->prefix_len))
        return fail(p, host.column, "address has bits set beyond /%u", rule->prefix_len);
    return 0;
}

/* PORT, LO-HI or *. */
static int parse_ports(struct parser *p, struct span s, struct rs_rule *rule)
{
    char found[DESCRIBE_BUF];

    if (span_is(s, "*")) {
        rule->port_lo = 0;
        rule->port_hi = 65535;
        return 0;
    }
    const char *dash = memchr(s.text, '-', s.len);
    struct span lo_text = subspan(s, 0, dash ? (size_t)(dash - s.text) : s.len);
    struct span hi_text = dash ? subspan(s, lo_text.len + 1, s.len - lo_text.len - 1) : lo_text;
    struct span parts[2] = { lo_text, hi_text };
    uint64_t values[2] = { 0, 0 };

    for (int i = 0; i < 2; i++) {
        switch (rs_cfg_parse_uint(parts[i].text, parts[i].len, 65535, &values[i])) {
        case RS_CFG_NUM_INVALID:
            return fail(p, s.column, "expected a port, a port range LO-HI or * after ':', found %s",
                        quote(s, found));
        case RS_CFG_NUM_RANGE:
            return fail(p, parts[i].column, "port %.*s out of range (0-65535)", (int)parts[i].len, parts[i].text);
        case RS_CFG_NUM_OK:
            break;
        }
    }
    if (values[0] > values[1])
        return fail(p, s.column, "port range reversed: %.*s (LO must not exceed HI)", (int)s.len, s.text);
    rule->port_lo = (uint16_t)values[0];
    rule->port_hi = (uint16_t)values[1];
    return 0;
}

static size_t count_char(struct span s, char c)
{
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++)
        n += s.text[i] == c;
    return n;
}

/* ADDR[/PREFIX][:PORTS] | [IPV6[/PREFIX]][:PORTS] | IPV6[/PREFIX] | *[:PORTS] */
static int parse_address(struct parser *p, const struct rs_cfg_token *tok, struct rs_rule *rule)
{
    char found[DESCRIBE_BUF];
    struct span s = span_of(tok);

    rule->family = AF_UNSPEC;
    rule->prefix_len = 0;
    rule->port_lo = 0;
    rule->port_hi = 65535;

    if (s.text[0] == '*') {
        if (s.len == 1)
            return 0;
        if (s.text[1] == ':')
            return parse_ports(p, subspan(s, 2, s.len - 2), rule);
        return fail(p, s.column, "expected '*' or '*:PORT' for any address, found %s", quote(s, found));
    }
    if (s.text[0] == '[') {
        const char *close = memchr(s.text, ']', s.len);
        if (!close)
            return fail(p, s.column, "missing ']' after the bracketed IPv6 address in %s", quote(s, found));
        struct span inner = subspan(s, 1, (size_t)(close - s.text) - 1);
        if (!memchr(inner.text, ':', inner.len))
            return fail(p, inner.column, "brackets are only for IPv6 addresses, found %s", quote(inner, found));
        if (parse_host(p, inner, AF_INET6, rule) != 0)
            return -1;
        struct span rest = subspan(s, inner.len + 2, s.len - inner.len - 2);
        if (rest.len == 0)
            return 0;
        if (rest.text[0] != ':')
            return fail(p, rest.column, "expected ':PORT' after ']', found %s", quote(rest, found));
        return parse_ports(p, subspan(rest, 1, rest.len - 1), rule);
    }
    /* Every IPv6 text form has at least two colons and IPv4:PORT has one, so an unbracketed IPv6 address is
     * never mistaken for a host and a port. */
    if (count_char(s, ':') >= 2)
        return parse_host(p, s, AF_INET6, rule);

    const char *colon = memchr(s.text, ':', s.len);
    struct span host = subspan(s, 0, colon ? (size_t)(colon - s.text) : s.len);
    if (parse_host(p, host, AF_INET, rule) != 0)
        return -1;
    if (colon)
        return parse_ports(p, subspan(s, host.len + 1, s.len - host.len - 1), rule);
    return 0;
}

/* ---- use ------------------------------------------------------------------------------------------------ */

enum rule_option { OPT_TRANSPORT, OPT_STREAM, OPT_ZCOPY_THRESHOLD, OPT_LEND_RING, OPT_DGRAM, OPT_QOS, OPT_COUNT };
static const char *const option_names[OPT_COUNT] = { "transport", "stream", "zcopy_threshold", "lend_ring", "dgram",
                                                     "qos" };

static int find_qos(const struct rs_config *cfg, struct span name)
{
    for (size_t i = 0; i < cfg->n_qos; i++) {
        if (strlen(cfg->qos[i].name) == name.len && memcmp(cfg->qos[i].name, name.text, name.len) == 0)
            return (int)i;
    }
    return -1;
}

static int parse_rule_option(struct parser *p, const struct rs_cfg_token *tok, unsigned seen_at[OPT_COUNT],
                             struct rs_rule *rule)
{
    char found[DESCRIBE_BUF];
    struct span s = span_of(tok);
    const char *equals = memchr(s.text, '=', s.len);

    if (!equals) {
        if (span_is(s, "program"))
            return fail(p, s.column, "'program GLOB' must come before the address");
        return fail(p, s.column, "expected OPTION=VALUE (transport, stream, zcopy_threshold, lend_ring, dgram or qos), "
                    "found %s", quote(s, found));
    }
    struct span key = subspan(s, 0, (size_t)(equals - s.text));
    struct span value = subspan(s, key.len + 1, s.len - key.len - 1);
    int option = lookup_word(key, option_names, OPT_COUNT);
    if (option < 0) {
        if (span_is(key, "fallback"))
            return fail(p, s.column, "unknown option 'fallback': the mode says it (rdma = no fallback, "
                        "both = fall back to the kernel, kernel = never RDMA)");
        return fail(p, s.column,
                    "unknown option %s (expected transport, stream, zcopy_threshold, lend_ring, dgram or qos)",
                    quote(key, found));
    }
    if (seen_at[option])
        return fail(p, s.column, "duplicate option '%s' (first given at column %u)", option_names[option],
                    seen_at[option]);
    seen_at[option] = s.column;
    if (value.len == 0)
        return fail(p, value.column, "missing value after '%s='", option_names[option]);

    switch ((enum rule_option)option) {
    case OPT_TRANSPORT: {
        static const char *const names[] = { "auto", "verbs", "soft" };
        static const enum rs_transport values[] = { RS_TRANSPORT_AUTO, RS_TRANSPORT_VERBS, RS_TRANSPORT_SOFT };
        int index = lookup_word(value, names, 3);
        if (index < 0)
            return fail(p, value.column, "expected 'auto', 'verbs' or 'soft' for transport, found %s%s",
                        quote(value, found),
                        span_is(value, "off") ? " (to keep sockets off RDMA write 'use kernel ...')" : "");
        rule->transport = values[index];
        return 0;
    }
    case OPT_STREAM: {
        static const char *const names[] = { "auto", "bcopy", "zcopy" };
        static const enum rs_stream_mode values[] = { RS_STREAM_AUTO, RS_STREAM_BCOPY, RS_STREAM_ZCOPY };
        if (rule->proto != RS_PROTO_TCP)
            return fail(p, s.column, "stream= is only valid on tcp rules");
        int index = lookup_word(value, names, 3);
        if (index < 0)
            return fail(p, value.column, "expected 'bcopy', 'zcopy' or 'auto' for stream, found %s",
                        quote(value, found));
        rule->stream = values[index];
        return 0;
    }
    case OPT_ZCOPY_THRESHOLD:
        if (rule->proto != RS_PROTO_TCP)
            return fail(p, s.column, "zcopy_threshold= is only valid on tcp rules");
        rule->zcopy_threshold_given = true;
        return parse_size(p, value, "zcopy_threshold", RS_CONFIG_MIN_ZCOPY_THRESHOLD, RS_CONFIG_MAX_ZCOPY_THRESHOLD,
                          &rule->zcopy_threshold);
    case OPT_LEND_RING: {
        static const char *const names[] = { "auto", "on", "off" };
        static const enum rs_lend_ring values[] = { RS_LEND_RING_AUTO, RS_LEND_RING_ON, RS_LEND_RING_OFF };
        if (rule->proto != RS_PROTO_TCP)
            return fail(p, s.column, "lend_ring= is only valid on tcp rules");
        int index = lookup_word(value, names, 3);
        if (index < 0)
            return fail(p, value.column, "expected 'on', 'off' or 'auto' for lend_ring, found %s",
                        quote(value, found));
        rule->lend_ring = values[index];
        return 0;
    }
    case OPT_DGRAM: {
        static const char *const names[] = { "sendrecv", "wrecord" };
        static const enum rs_dgram_mode values[] = { RS_DGRAM_SENDRECV, RS_DGRAM_WRECORD };
        if (rule->proto != RS_PROTO_UDP)
            return fail(p, s.column, "dgram= is only valid on udp rules");
        int index = lookup_word(value, names, 2);
        if (index < 0)
            return fail(p, value.column, "expected 'sendrecv' or 'wrecord' for dgram, found %s",
                        quote(value, found));
        rule->dgram = values[index];
        return 0;
    }
    case OPT_QOS: {
        int index = find_qos(p->cfg, value);
        if (index < 0)
            return fail(p, value.column, "unknown qos class %s (a qos class must be defined before the rules "
                        "that use it)", quote(value, found));
        rule->qos_index = index;
        return 0;
    }
    case OPT_COUNT:
        break;
    }
    return fail(p, s.column, "internal error: unhandled option");
}

static int parse_program(struct parser *p, struct span *glob)
{
    char found[DESCRIBE_BUF];
    struct rs_cfg_token tok;

    if (!rs_cfg_next_token(&p->lexer, &tok))
        return fail(p, tok.column, "expected a program name pattern after 'program', found end of line");
    *glob = span_of(&tok);
    if (glob->len > RS_CONFIG_MAX_GLOB_BYTES)
        return fail(p, tok.column, "program pattern too long (max %u bytes)", RS_CONFIG_MAX_GLOB_BYTES);
    if (memchr(glob->text, '/', glob->len))
        return fail(p, tok.column, "program pattern %s contains '/': it is matched against the program's short "
                    "name (the basename)", quote(*glob, found));
    return 0;
}

static int parse_use(struct parser *p, const struct rs_cfg_token *use_tok)
{
    static const char *const modes[] = { "rdma", "kernel", "both" };
    static const enum rs_mode mode_values[] = { RS_MODE_RDMA, RS_MODE_KERNEL, RS_MODE_BOTH };
    static const char *const protos[] = { "tcp", "udp" };
    static const enum rs_proto proto_values[] = { RS_PROTO_TCP, RS_PROTO_UDP };
    static const char *const roles[] = { "server", "client", "any" };
    static const enum rs_role role_values[] = { RS_ROLE_SERVER, RS_ROLE_CLIENT, RS_ROLE_ANY };
    struct rs_rule rule = {
        .family = AF_UNSPEC, .port_lo = 0, .port_hi = 65535, .transport = RS_TRANSPORT_AUTO,
        .stream = RS_STREAM_AUTO, .zcopy_threshold = RS_CONFIG_DEFAULT_ZCOPY_THRESHOLD,
        .dgram = RS_DGRAM_SENDRECV, .qos_index = -1, .line = p->line,
    };
    struct rs_cfg_token tok;
    struct span glob = { NULL, 0, 0 };
    int index;

    if (p->cfg->n_rules >= RS_CONFIG_MAX_RULES)
        return fail(p, use_tok->column, "too many rules (max %u)", RS_CONFIG_MAX_RULES);

    if ((index = expect_keyword(p, modes, 3, "'rdma', 'kernel' or 'both'", &tok)) < 0)
        return -1;
    rule.mode = mode_values[index];
    if ((index = expect_keyword(p, protos, 2, "'tcp' or 'udp'", &tok)) < 0)
        return -1;
    rule.proto = proto_values[index];
    if ((index = expect_keyword(p, roles, 3, "'server', 'client' or 'any'", &tok)) < 0)
        return -1;
    rule.role = role_values[index];

    if (!rs_cfg_next_token(&p->lexer, &tok))
        return fail(p, tok.column, "expected 'program GLOB' or an address (ADDR[/PREFIX][:PORT] or *), found end "
                    "of line");
    if (rs_cfg_token_is(&tok, "program")) {
        if (parse_program(p, &glob) != 0)
            return -1;
        if (!rs_cfg_next_token(&p->lexer, &tok))
            return fail(p, tok.column, "expected an address (ADDR[/PREFIX][:PORT] or *), found end of line");
    }
    if (parse_address(p, &tok, &rule) != 0)
        return -1;
    /* A peer without rdmasock answers RDMA datagrams with silence, not with an error, so a UDP rule that may
     * use RDMA must say which peers are known to run rdmasock. */
    if (rule.proto == RS_PROTO_UDP && rule.mode != RS_MODE_KERNEL &&
        (rule.family == AF_UNSPEC || rule.prefix_len == 0))
        return fail(p, tok.column, "a UDP rule must name its peers: give an address or prefix, not *");

    unsigned seen_at[OPT_COUNT] = { 0 };
    while (rs_cfg_next_token(&p->lexer, &tok)) {
        if (parse_rule_option(p, &tok, seen_at, &rule) != 0)
            return -1;
    }

    struct rs_rule *rules = grow(p->cfg->rules, &p->rules_capacity, p->cfg->n_rules, sizeof(*rules),
                                 RS_CONFIG_MAX_RULES);
    if (!rules)
        goto out_of_memory;
    p->cfg->rules = rules;
    if (glob.text) {
        rule.program_glob = strndup(glob.text, glob.len);
        if (!rule.program_glob)
            goto out_of_memory;
    }
    p->cfg->rules[p->cfg->n_rules++] = rule;
    return 0;

out_of_memory:
    fail(p, use_tok->column, "out of memory");
    errno = ENOMEM;
    return -1;
}

/* ---- qos ------------------------------------------------------------------------------------------------ */

static bool valid_qos_name(struct span s)
{
    if (s.len == 0 || s.len > RS_CONFIG_QOS_NAME_MAX)
        return false;
    for (size_t i = 0; i < s.len; i++) {
        char c = s.text[i];
        bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        bool digit_or_dash = (c >= '0' && c <= '9') || c == '-';
        if (!letter && (i == 0 || !digit_or_dash))
            return false;
    }
    return true;
}

enum qos_setting { QOS_SL, QOS_TCLASS, QOS_DSCP, QOS_PRIORITY, QOS_WEIGHT, QOS_STRICT, QOS_COUNT };
static const char *const qos_setting_names[QOS_COUNT] = { "sl", "tclass", "dscp", "priority", "weight", "strict" };

static int parse_qos(struct parser *p, const struct rs_cfg_token *qos_tok)
{
    static const unsigned lo[QOS_COUNT] = { 0, 0, 0, 0, 1, 0 };
    static const unsigned hi[QOS_COUNT] = { 15, 255, 63, 7, 255, 0 };
    char found[DESCRIBE_BUF];
    struct rs_cfg_token tok;
    struct rs_qos_class qos = { .sl = 0, .tclass = 0, .dscp = -1, .priority = -1, .weight = 1, .strict = false };
    unsigned seen_at[QOS_COUNT] = { 0 };

    if (p->cfg->n_qos >= RS_CONFIG_MAX_QOS)
        return fail(p, qos_tok->column, "too many qos classes (max %u)", RS_CONFIG_MAX_QOS);
    if (!rs_cfg_next_token(&p->lexer, &tok))
        return fail(p, tok.column, "expected a qos class name after 'qos', found end of line");
    struct span name = span_of(&tok);
    if (!valid_qos_name(name))
        return fail(p, tok.column, "expected a qos class name (a letter or '_', then up to %u letters, digits, "
                    "'_' or '-'), found %s", RS_CONFIG_QOS_NAME_MAX, quote(name, found));
    int existing = find_qos(p->cfg, name);
    if (existing >= 0)
        return fail(p, tok.column, "qos class '%s' already defined on line %u", p->cfg->qos[existing].name,
                    p->qos_line[existing]);
    memcpy(qos.name, name.text, name.len);
    qos.name[name.len] = '\0';

    while (rs_cfg_next_token(&p->lexer, &tok)) {
        struct span s = span_of(&tok);
        const char *equals = memchr(s.text, '=', s.len);
        struct span key = subspan(s, 0, equals ? (size_t)(equals - s.text) : s.len);
        int setting = lookup_word(key, qos_setting_names, QOS_COUNT);

        if (setting < 0 || (setting == QOS_STRICT) != (equals == NULL)) {
            if (setting == QOS_STRICT)
                return fail(p, s.column, "'strict' takes no value");
            if (setting >= 0)
                return fail(p, s.column, "expected %s=VALUE, found %s", qos_setting_names[setting], quote(s, found));
            return fail(p, s.column, "unknown qos setting %s (expected sl, tclass, dscp, priority, weight or "
                        "strict)", quote(key, found));
        }
        if (seen_at[setting])
            return fail(p, s.column, "duplicate qos setting '%s' (first given at column %u)",
                        qos_setting_names[setting], seen_at[setting]);
        seen_at[setting] = s.column;
        if ((setting == QOS_STRICT && seen_at[QOS_WEIGHT]) || (setting == QOS_WEIGHT && seen_at[QOS_STRICT]))
            return fail(p, s.column, "'weight=' and 'strict' exclude each other: a class is either weighted or "
                        "strict priority");
        if (setting == QOS_STRICT) {
            qos.strict = true;
            continue;
        }
        struct span value = subspan(s, key.len + 1, s.len - key.len - 1);
        unsigned number = 0;
        if (value.len == 0)
            return fail(p, value.column, "missing value after '%s='", qos_setting_names[setting]);
        if (parse_ranged(p, value, qos_setting_names[setting], lo[setting], hi[setting], &number) != 0)
            return -1;
        switch ((enum qos_setting)setting) {
        case QOS_SL: qos.sl = (uint8_t)number; break;
        case QOS_TCLASS: qos.tclass = (uint8_t)number; break;
        case QOS_DSCP: qos.dscp = (int16_t)number; break;
        case QOS_PRIORITY: qos.priority = (int16_t)number; break;
        case QOS_WEIGHT: qos.weight = (uint8_t)number; break;
        case QOS_STRICT: case QOS_COUNT: break;
        }
    }
    /* On RoCEv2 the DSCP is carried in the upper six bits of the GRH traffic class; two values that disagree
     * would mark the same traffic differently on the two paths. */
    if (seen_at[QOS_DSCP] && seen_at[QOS_TCLASS] && (qos.tclass >> 2) != qos.dscp) {
        unsigned later = seen_at[QOS_DSCP] > seen_at[QOS_TCLASS] ? seen_at[QOS_DSCP] : seen_at[QOS_TCLASS];
        return fail(p, later, "tclass=%u and dscp=%d disagree: the DSCP is the upper 6 bits of the traffic class "
                    "(tclass>>2 = %u)", qos.tclass, qos.dscp, qos.tclass >> 2);
    }

    struct rs_qos_class *classes = grow(p->cfg->qos, &p->qos_capacity, p->cfg->n_qos, sizeof(*classes),
                                        RS_CONFIG_MAX_QOS);
    if (!classes) {
        fail(p, qos_tok->column, "out of memory");
        errno = ENOMEM;
        return -1;
    }
    p->cfg->qos = classes;
    p->qos_line[p->cfg->n_qos] = p->line;
    p->cfg->qos[p->cfg->n_qos++] = qos;
    return 0;
}

/* ---- entry points --------------------------------------------------------------------------------------- */

/* Keeps the end of an overlong name: the file name matters more than the leading directories. */
static void set_error_file(struct rs_config_error *err, const char *name)
{
    size_t len = strlen(name);
    size_t room = sizeof(err->file) - 1;

    if (len <= room) {
        memcpy(err->file, name, len + 1);
    } else {
        memcpy(err->file, "...", 3);
        memcpy(err->file + 3, name + len - (room - 3), room - 3 + 1);
    }
}

static int parse_statements(struct parser *p, const char *buf, size_t len)
{
    struct rs_cfg_reader reader;
    struct rs_cfg_line line;
    int status;

    rs_cfg_reader_init(&reader, buf, len);
    while ((status = rs_cfg_reader_next(&reader, &line, p->err)) > 0) {
        struct rs_cfg_token tok;
        p->line = line.number;
        rs_cfg_lexer_init(&p->lexer, &line);
        if (!rs_cfg_next_token(&p->lexer, &tok))
            continue;
        if (rs_cfg_token_is(&tok, "use"))
            status = parse_use(p, &tok);
        else if (rs_cfg_token_is(&tok, "qos"))
            status = parse_qos(p, &tok);
        else {
            static const char *const statements[] = { "use", "qos" };
            char found[DESCRIBE_BUF];
            status = fail(p, tok.column, "expected 'use' or 'qos', found %s%s", rs_cfg_describe(&tok, found,
                          sizeof(found)), matches_ignoring_case(span_of(&tok), statements, 2)
                          ? " (keywords are lower-case)" : "");
        }
        if (status != 0)
            return -1;
    }
    if (status < 0)
        errno = EINVAL;
    return status;
}

int rs_config_parse_buffer(const char *name, const char *buf, size_t len, struct rs_config **out,
                           struct rs_config_error *err)
{
    struct rs_config_error scratch;
    struct parser p = { 0 };

    if (!err)
        err = &scratch;
    memset(err, 0, sizeof(*err));
    if (!name)
        name = "<buffer>";
    set_error_file(err, name);
    if (out)
        *out = NULL;
    if (!out || (!buf && len > 0)) {
        snprintf(err->message, sizeof(err->message), "invalid arguments");
        errno = EINVAL;
        return -1;
    }
    if (len > RS_CONFIG_MAX_FILE_BYTES) {
        snprintf(err->message, sizeof(err->message), "file too large (%zu bytes, max %u)", len,
                 RS_CONFIG_MAX_FILE_BYTES);
        errno = EFBIG;
        return -1;
    }

    p.err = err;
    p.cfg = calloc(1, sizeof(*p.cfg));
    if (!p.cfg || !(p.cfg->source = strdup(name))) {
        rs_config_free(p.cfg);
        snprintf(err->message, sizeof(err->message), "out of memory");
        errno = ENOMEM;
        return -1;
    }
    if (len > 0 && parse_statements(&p, buf, len) != 0) {
        int saved_errno = errno;
        rs_config_free(p.cfg);
        errno = saved_errno;
        return -1;
    }
    *out = p.cfg;
    return 0;
}

static void set_errno_error(struct rs_config_error *err, const char *what, int error_number)
{
    char text[128];

    /* GNU strerror_r: thread-safe, and the library may be loaded into any multi-threaded program. */
    snprintf(err->message, sizeof(err->message), "%s: %s", what, strerror_r(error_number, text, sizeof(text)));
    err->line = 0;
    err->column = 0;
    errno = error_number;
}

int rs_config_load_file(const char *path, struct rs_config **out, struct rs_config_error *err)
{
    struct rs_config_error scratch;
    struct stat st;

    if (!err)
        err = &scratch;
    memset(err, 0, sizeof(*err));
    set_error_file(err, path ? path : "<null>");
    if (out)
        *out = NULL;
    if (!path || !out) {
        snprintf(err->message, sizeof(err->message), "invalid arguments");
        errno = EINVAL;
        return -1;
    }

    /* O_NONBLOCK: a FIFO named as the configuration must not hang the host program's start-up; only regular
     * files are read anyway. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        set_errno_error(err, "cannot open", errno);
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        close(fd);
        set_errno_error(err, "cannot stat", saved);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (S_ISDIR(st.st_mode)) {
            set_errno_error(err, "cannot read", EISDIR);
        } else {
            snprintf(err->message, sizeof(err->message), "cannot read: not a regular file");
            errno = EINVAL;
        }
        return -1;
    }
    if (st.st_size > (off_t)RS_CONFIG_MAX_FILE_BYTES) {
        close(fd);
        snprintf(err->message, sizeof(err->message), "file too large (%lld bytes, max %u)", (long long)st.st_size,
                 RS_CONFIG_MAX_FILE_BYTES);
        errno = EFBIG;
        return -1;
    }
    /* Read through stdio: glibc's stdio calls its internal read/close, not the read()/close() symbols this
     * library interposes, so loading the configuration never re-enters the socket layer. */
    FILE *file = fdopen(fd, "r");
    if (!file) {
        int saved = errno;
        close(fd);
        set_errno_error(err, "cannot read", saved);
        return -1;
    }
    /* The file may grow between fstat and read; one byte beyond the limit is enough to notice. */
    size_t capacity = (size_t)st.st_size + 1;
    size_t used = 0;
    char *buf = malloc(capacity);
    while (buf) {
        used += fread(buf + used, 1, capacity - used, file);
        if (used < capacity || capacity > RS_CONFIG_MAX_FILE_BYTES)
            break;
        size_t bigger = capacity * 2 > RS_CONFIG_MAX_FILE_BYTES + 1 ? RS_CONFIG_MAX_FILE_BYTES + 1 : capacity * 2;
        char *grown = realloc(buf, bigger);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        capacity = bigger;
    }
    if (!buf || ferror(file)) {
        int saved = buf ? errno : ENOMEM;
        free(buf);
        fclose(file);
        set_errno_error(err, "cannot read", saved ? saved : EIO);
        return -1;
    }
    fclose(file);
    if (used > RS_CONFIG_MAX_FILE_BYTES) {
        free(buf);
        snprintf(err->message, sizeof(err->message), "file too large (more than %u bytes)",
                 RS_CONFIG_MAX_FILE_BYTES);
        errno = EFBIG;
        return -1;
    }
    int status = rs_config_parse_buffer(path, buf, used, out, err);
    int saved = errno;
    free(buf);
    errno = saved;
    return status;
}
