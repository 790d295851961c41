/* Unit tests of the rule language (src/common/config*.c): every statement form, matching, the built-in
 * defaults, canonical dumping, and malformed inputs with their exact file:line:col messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/config.h"

/* ---- helpers ----------------------------------------------------------------------------------------------- */

static struct rs_config *parse_ok_n(const char *text, size_t len)
{
    struct rs_config *cfg = NULL;
    struct rs_config_error err;
    char message[600];

    if (rs_config_parse_buffer("t.conf", text, len, &cfg, &err) != 0) {
        rs_config_format_error(&err, message, sizeof(message));
        fail_msg("unexpected parse error: %s", message);
    }
    assert_non_null(cfg);
    assert_string_equal(cfg->source, "t.conf");
    return cfg;
}

static struct rs_config *parse_ok(const char *text)
{
    return parse_ok_n(text, strlen(text));
}

/* Parses text, requires failure with exactly `expected` ("t.conf:L:C: message") and no configuration. */
static void expect_error_n(const char *text, size_t len, const char *expected)
{
    struct rs_config *cfg = (struct rs_config *)0x1;
    struct rs_config_error err;
    char message[600];

    errno = 0;
    assert_int_equal(rs_config_parse_buffer("t.conf", text, len, &cfg, &err), -1);
    assert_null(cfg);
    assert_true(errno != 0);
    rs_config_format_error(&err, message, sizeof(message));
    assert_string_equal(message, expected);
}

static void expect_error(const char *text, const char *expected)
{
    expect_error_n(text, strlen(text), expected);
}

static struct sockaddr_storage sa4(const char *ip, uint16_t port)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

    memset(&ss, 0, sizeof(ss));
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    assert_int_equal(inet_pton(AF_INET, ip, &sin->sin_addr), 1);
    return ss;
}

static struct sockaddr_storage sa6(const char *ip, uint16_t port)
{
    struct sockaddr_storage ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

    memset(&ss, 0, sizeof(ss));
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    assert_int_equal(inet_pton(AF_INET6, ip, &sin6->sin6_addr), 1);
    return ss;
}

/* Line of the rule that a TCP client query for ip:port (IPv4 or IPv6 text) matches; 0 = built-in default. */
static unsigned client_match_line(const struct rs_config *cfg, const char *ip, uint16_t port)
{
    struct sockaddr_storage ss = strchr(ip, ':') ? sa6(ip, port) : sa4(ip, port);
    const struct rs_rule *rule = rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "prog",
                                                 (const struct sockaddr *)&ss);
    assert_non_null(rule);
    assert_true(rule->is_default == (rule->line == 0));
    return rule->line;
}

/* Dumps cfg into a malloc'd string. */
static char *dump_to_string(const struct rs_config *cfg)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);

    assert_non_null(out);
    assert_int_equal(rs_config_dump(cfg, out), 0);
    assert_int_equal(fclose(out), 0);
    assert_non_null(text);
    return text;
}

/* parse(dump(cfg)) must equal cfg, and dumping again must give the same text. */
static void assert_round_trip(const struct rs_config *cfg)
{
    char *first = dump_to_string(cfg);
    struct rs_config *again = parse_ok(first);
    char *second = dump_to_string(again);

    assert_true(rs_config_equal(cfg, again));
    assert_string_equal(first, second);
    rs_config_free(again);
    free(first);
    free(second);
}

static char scratch_dir[64];

static int make_scratch_dir(void **state)
{
    (void)state;
    snprintf(scratch_dir, sizeof(scratch_dir), "/tmp/rs_test_config.XXXXXX");
    return mkdtemp(scratch_dir) ? 0 : -1;
}

static int remove_scratch_dir(void **state)
{
    char command[128];

    (void)state;
    snprintf(command, sizeof(command), "rm -rf '%s'", scratch_dir);
    return system(command) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* ---- statements -------------------------------------------------------------------------------------------- */

static void test_empty_and_comment_only_inputs_have_no_rules(void **state)
{
    static const char *const texts[] = {
        "", "\n", "   \t  \n\n", "# just a comment\n", "  # indented comment\r\n\r\n", "#",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        struct rs_config *cfg = parse_ok(texts[i]);
        assert_int_equal(cfg->n_rules, 0);
        assert_int_equal(cfg->n_qos, 0);
        rs_config_free(cfg);
    }
    struct rs_config *cfg = NULL;
    assert_int_equal(rs_config_parse_buffer(NULL, NULL, 0, &cfg, NULL), 0);
    assert_string_equal(cfg->source, "<buffer>");
    assert_int_equal(cfg->n_rules, 0);
    rs_config_free(cfg);
}

static void test_use_modes_protocols_roles(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use rdma tcp server 10.0.0.1\n"
                                     "use kernel udp client 10.0.0.2\n"
                                     "use both tcp any *\n"
                                     "use both udp server 10.0.0.0/24\n");
    assert_int_equal(cfg->n_rules, 4);
    assert_int_equal(cfg->rules[0].mode, RS_MODE_RDMA);
    assert_int_equal(cfg->rules[0].proto, RS_PROTO_TCP);
    assert_int_equal(cfg->rules[0].role, RS_ROLE_SERVER);
    assert_int_equal(cfg->rules[1].mode, RS_MODE_KERNEL);
    assert_int_equal(cfg->rules[1].proto, RS_PROTO_UDP);
    assert_int_equal(cfg->rules[1].role, RS_ROLE_CLIENT);
    assert_int_equal(cfg->rules[2].mode, RS_MODE_BOTH);
    assert_int_equal(cfg->rules[2].role, RS_ROLE_ANY);
    assert_int_equal(cfg->rules[3].proto, RS_PROTO_UDP);
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const struct rs_rule *r = &cfg->rules[i];
        assert_int_equal(r->line, i + 1);
        assert_false(r->is_default);
        assert_null(r->program_glob);
        assert_int_equal(r->transport, RS_TRANSPORT_AUTO);
        assert_int_equal(r->stream, RS_STREAM_AUTO);
        assert_int_equal(r->zcopy_threshold, 65536);
        assert_int_equal(r->dgram, RS_DGRAM_SENDRECV);
        assert_int_equal(r->qos_index, -1);
    }
    rs_config_free(cfg);
}

static void test_ipv4_address_forms(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use both tcp any 10.0.0.0/8:5000\n"
                                     "use both tcp any 192.168.1.7\n"
                                     "use both tcp any *:80\n"
                                     "use both tcp any *\n"
                                     "use both tcp any *:1000-2000\n"
                                     "use both tcp any 1.2.3.4:*\n"
                                     "use both tcp any 0.0.0.0/0\n"
                                     "use both tcp any *:*\n");
    const struct rs_rule *r = cfg->rules;
    const uint8_t ten[16] = { 10 }, host[16] = { 192, 168, 1, 7 }, zero[16] = { 0 };

    assert_int_equal(r[0].family, AF_INET);
    assert_memory_equal(r[0].addr, ten, 16);
    assert_int_equal(r[0].prefix_len, 8);
    assert_int_equal(r[0].port_lo, 5000);
    assert_int_equal(r[0].port_hi, 5000);

    assert_int_equal(r[1].family, AF_INET);
    assert_memory_equal(r[1].addr, host, 16);
    assert_int_equal(r[1].prefix_len, 32);
    assert_int_equal(r[1].port_lo, 0);
    assert_int_equal(r[1].port_hi, 65535);

    assert_int_equal(r[2].family, AF_UNSPEC);
    assert_int_equal(r[2].prefix_len, 0);
    assert_memory_equal(r[2].addr, zero, 16);
    assert_int_equal(r[2].port_lo, 80);
    assert_int_equal(r[2].port_hi, 80);

    assert_int_equal(r[3].family, AF_UNSPEC);
    assert_int_equal(r[3].port_lo, 0);
    assert_int_equal(r[3].port_hi, 65535);

    assert_int_equal(r[4].port_lo, 1000);
    assert_int_equal(r[4].port_hi, 2000);

    assert_int_equal(r[5].family, AF_INET);
    assert_int_equal(r[5].port_lo, 0);
    assert_int_equal(r[5].port_hi, 65535);

    assert_int_equal(r[6].family, AF_INET);
    assert_int_equal(r[6].prefix_len, 0);

    assert_int_equal(r[7].family, AF_UNSPEC);
    assert_int_equal(r[7].port_hi, 65535);
    rs_config_free(cfg);
}

static void test_ipv6_address_forms(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use both tcp any [fe80::/10]:7000-7100\n"
                                     "use both tcp any [::1]:*\n"
                                     "use both tcp any ::1\n"
                                     "use both tcp any fe80::/10\n"
                                     "use both tcp any [2001:db8::5]:443\n"
                                     "use both tcp any [::1]\n"
                                     "use both tcp any ::ffff:10.0.0.0/104\n"
                                     "use both tcp any ::/0\n");
    const struct rs_rule *r = cfg->rules;
    uint8_t expected[16];

    assert_int_equal(inet_pton(AF_INET6, "fe80::", expected), 1);
    assert_int_equal(r[0].family, AF_INET6);
    assert_memory_equal(r[0].addr, expected, 16);
    assert_int_equal(r[0].prefix_len, 10);
    assert_int_equal(r[0].port_lo, 7000);
    assert_int_equal(r[0].port_hi, 7100);

    assert_int_equal(inet_pton(AF_INET6, "::1", expected), 1);
    for (int i = 1; i <= 2; i++) {
        assert_int_equal(r[i].family, AF_INET6);
        assert_memory_equal(r[i].addr, expected, 16);
        assert_int_equal(r[i].prefix_len, 128);
        assert_int_equal(r[i].port_lo, 0);
        assert_int_equal(r[i].port_hi, 65535);
    }
    /* An unbracketed IPv6 address means any port, even with a prefix. */
    assert_int_equal(r[3].prefix_len, 10);
    assert_int_equal(r[3].port_hi, 65535);

    assert_int_equal(inet_pton(AF_INET6, "2001:db8::5", expected), 1);
    assert_memory_equal(r[4].addr, expected, 16);
    assert_int_equal(r[4].port_lo, 443);
    assert_int_equal(r[4].port_hi, 443);

    assert_int_equal(r[5].prefix_len, 128);
    assert_int_equal(r[5].port_hi, 65535);

    assert_int_equal(inet_pton(AF_INET6, "::ffff:10.0.0.0", expected), 1);
    assert_int_equal(r[6].family, AF_INET6);
    assert_memory_equal(r[6].addr, expected, 16);
    assert_int_equal(r[6].prefix_len, 104);

    assert_int_equal(r[7].family, AF_INET6);
    assert_int_equal(r[7].prefix_len, 0);
    rs_config_free(cfg);
}

static void test_program_glob(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use rdma tcp client program nginx* 10.0.0.0/8\n"
                                     "use rdma tcp client program [rp]ython? *\n"
                                     "use rdma tcp client program caf\xc3\xa9 *\n");
    assert_string_equal(cfg->rules[0].program_glob, "nginx*");
    assert_string_equal(cfg->rules[1].program_glob, "[rp]ython?");
    assert_string_equal(cfg->rules[2].program_glob, "caf\xc3\xa9");
    assert_int_equal(cfg->rules[0].prefix_len, 8);
    rs_config_free(cfg);
}

static void test_every_rule_option(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok(
        "qos fast sl=1\n"
        "use both tcp any * transport=verbs stream=zcopy zcopy_threshold=128k lend_ring=off qos=fast\n"
        "use both tcp any * transport=soft stream=bcopy zcopy_threshold=2M lend_ring=on\n"
        "use both tcp any * transport=auto stream=auto zcopy_threshold=1024\n"
        "use both tcp any * zcopy_threshold=1g\n"
        "use both tcp any * zcopy_threshold=1048576\n"
        "use both tcp any * zcopy_threshold=3K\n"
        "use rdma udp any 10.0.0.0/8 dgram=wrecord qos=fast\n"
        "use rdma udp any 10.0.0.0/8 dgram=sendrecv transport=soft\n"
        "use kernel udp any * dgram=wrecord\n"
        "use both tcp any * zcopy_threshold=64k\n"
        "use both tcp any *\n");
    const struct rs_rule *r = cfg->rules;

    assert_int_equal(r[0].transport, RS_TRANSPORT_VERBS);
    assert_int_equal(r[0].stream, RS_STREAM_ZCOPY);
    assert_int_equal(r[0].zcopy_threshold, 128 * 1024);
    assert_int_equal(r[0].qos_index, 0);
    assert_int_equal(r[0].lend_ring, RS_LEND_RING_OFF);
    assert_int_equal(r[1].lend_ring, RS_LEND_RING_ON);
    assert_int_equal(r[2].lend_ring, RS_LEND_RING_AUTO);
    assert_int_equal(r[1].transport, RS_TRANSPORT_SOFT);
    assert_int_equal(r[1].stream, RS_STREAM_BCOPY);
    assert_int_equal(r[1].zcopy_threshold, 2 * 1024 * 1024);
    assert_int_equal(r[2].transport, RS_TRANSPORT_AUTO);
    assert_int_equal(r[2].stream, RS_STREAM_AUTO);
    assert_int_equal(r[2].zcopy_threshold, 1024);
    assert_int_equal(r[3].zcopy_threshold, 1024u * 1024u * 1024u);
    assert_int_equal(r[4].zcopy_threshold, 1048576);
    assert_int_equal(r[5].zcopy_threshold, 3072);
    assert_int_equal(r[6].dgram, RS_DGRAM_WRECORD);
    assert_int_equal(r[6].qos_index, 0);
    assert_int_equal(r[7].dgram, RS_DGRAM_SENDRECV);
    assert_int_equal(r[7].transport, RS_TRANSPORT_SOFT);
    /* `use kernel udp ... *` is allowed: the kernel never breaks a peer. */
    assert_int_equal(r[8].mode, RS_MODE_KERNEL);
    assert_int_equal(r[8].family, AF_UNSPEC);
    /* The default size written out still asks for zero copy (the software RNIC leaves it off otherwise), and
     * survives the round trip; a rule without it does not ask. */
    assert_int_equal(r[9].zcopy_threshold, 65536);
    assert_true(r[9].zcopy_threshold_given);
    assert_int_equal(r[10].zcopy_threshold, 65536);
    assert_false(r[10].zcopy_threshold_given);
    assert_true(r[0].zcopy_threshold_given);
    assert_round_trip(cfg);
    rs_config_free(cfg);
}

static void test_qos_classes(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("qos voip sl=7 tclass=184 dscp=46 priority=6 strict\n"
                                     "qos bulk weight=10 sl=1\n"
                                     "qos plain\n"
                                     "qos _x-1 dscp=10 priority=0 weight=255\n"
                                     "qos abcdefghijklmnopqrstuvwxyz01234 tclass=255\n");
    const struct rs_qos_class *q = cfg->qos;

    assert_int_equal(cfg->n_qos, 5);
    assert_int_equal(cfg->n_rules, 0);
    assert_string_equal(q[0].name, "voip");
    assert_int_equal(q[0].sl, 7);
    assert_int_equal(q[0].tclass, 184);
    assert_int_equal(q[0].dscp, 46);
    assert_int_equal(q[0].priority, 6);
    assert_true(q[0].strict);
    assert_int_equal(q[1].weight, 10);
    assert_int_equal(q[1].sl, 1);
    assert_false(q[1].strict);
    /* Defaults: sl=0 tclass=0 dscp unset priority unset weight=1 not strict. */
    assert_string_equal(q[2].name, "plain");
    assert_int_equal(q[2].sl, 0);
    assert_int_equal(q[2].tclass, 0);
    assert_int_equal(q[2].dscp, -1);
    assert_int_equal(q[2].priority, -1);
    assert_int_equal(q[2].weight, 1);
    assert_false(q[2].strict);
    assert_int_equal(q[3].dscp, 10);
    assert_int_equal(q[3].priority, 0);
    assert_int_equal(q[3].weight, 255);
    assert_string_equal(q[4].name, "abcdefghijklmnopqrstuvwxyz01234");
    assert_int_equal(q[4].tclass, 255);
    rs_config_free(cfg);
}

static void test_qos_reference_resolves_to_index(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("qos a\nqos b\nuse both tcp any * qos=b\nuse both tcp any * qos=a\n");
    assert_int_equal(cfg->rules[0].qos_index, 1);
    assert_int_equal(cfg->rules[1].qos_index, 0);
    rs_config_free(cfg);
}

static void test_comments_whitespace_and_crlf(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("# header\r\n"
                                     "\tuse   both\ttcp any *:80# comment glued to the token\r\n"
                                     "\r\n"
                                     "use kernel tcp any * # caf\xc3\xa9 \xe2\x98\x95 \xf0\x9f\x98\x80\r\n"
                                     "use rdma tcp any 10.0.0.1");
    assert_int_equal(cfg->n_rules, 3);
    assert_int_equal(cfg->rules[0].line, 2);
    assert_int_equal(cfg->rules[0].port_lo, 80);
    assert_int_equal(cfg->rules[1].line, 4);
    assert_int_equal(cfg->rules[2].line, 5);
    assert_int_equal(cfg->rules[2].mode, RS_MODE_RDMA);
    rs_config_free(cfg);

    /* A UTF-8 byte order mark at the start of the file is ignored; columns count from after it. */
    cfg = parse_ok("\xEF\xBB\xBFuse both tcp any *\n");
    assert_int_equal(cfg->n_rules, 1);
    rs_config_free(cfg);
    expect_error("\xEF\xBB\xBFuse both tcq any *\n", "t.conf:1:10: expected 'tcp' or 'udp', found 'tcq'");
}

static void test_limits_that_are_still_valid(void **state)
{
    (void)state;
    /* A line of exactly 4095 bytes (CRLF not counted). */
    char *line = malloc(4095 + 3);
    assert_non_null(line);
    memset(line, 'x', 4095);
    line[0] = '#';
    memcpy(line + 4095, "\r\n", 3);
    struct rs_config *cfg = parse_ok(line);
    assert_int_equal(cfg->n_rules, 0);
    rs_config_free(cfg);
    free(line);

    /* 4096 rules and 64 qos classes. */
    size_t size = 4096 * 32 + 64 * 16;
    char *text = malloc(size);
    size_t used = 0;
    assert_non_null(text);
    for (int i = 0; i < 64; i++)
        used += (size_t)snprintf(text + used, size - used, "qos q%d\n", i);
    for (int i = 0; i < 4096; i++)
        used += (size_t)snprintf(text + used, size - used, "use kernel tcp any *:%d\n", i);
    cfg = parse_ok_n(text, used);
    assert_int_equal(cfg->n_rules, 4096);
    assert_int_equal(cfg->n_qos, 64);
    assert_int_equal(cfg->rules[4095].port_lo, 4095);
    assert_int_equal(cfg->rules[4095].line, 64 + 4096);
    rs_config_free(cfg);
    free(text);

    /* Exactly 1 MiB of blank lines. */
    text = malloc(RS_CONFIG_MAX_FILE_BYTES);
    assert_non_null(text);
    memset(text, '\n', RS_CONFIG_MAX_FILE_BYTES);
    cfg = parse_ok_n(text, RS_CONFIG_MAX_FILE_BYTES);
    assert_int_equal(cfg->n_rules, 0);
    rs_config_free(cfg);
    free(text);
}

/* ---- errors ------------------------------------------------------------------------------------------------ */

static void test_error_bad_prefix(void **state)
{
    (void)state;
    expect_error("use both tcp any 10.0.0.0/33", "t.conf:1:27: prefix length 33 out of range (0-32)");
    expect_error("use both tcp any 10.0.0.0/abc", "t.conf:1:27: expected a prefix length 0-32 after '/', found 'abc'");
    expect_error("use both tcp any 10.0.0.0/", "t.conf:1:27: expected a prefix length 0-32 after '/', found nothing");
    expect_error("use both tcp any 10.0.0.1/24", "t.conf:1:18: address has bits set beyond /24");
    expect_error("use both tcp any 11.0.0.0/7:80", "t.conf:1:18: address has bits set beyond /7");
    expect_error("use both tcp any 128.0.0.0/0", "t.conf:1:18: address has bits set beyond /0");
    expect_error("use both tcp any ::1/129", "t.conf:1:22: prefix length 129 out of range (0-128)");
    expect_error("use both tcp any [fe80::1/10]:80", "t.conf:1:19: address has bits set beyond /10");
    expect_error("use both tcp any ::1/99999999999999999999",
                 "t.conf:1:22: prefix length 99999999999999999999 out of range (0-128)");
    expect_error("use both tcp any fe80::/10:7000",
                 "t.conf:1:25: expected a prefix length 0-128 after '/', found '10:7000' "
                 "(an IPv6 address with a port must be bracketed: [ADDR/PREFIX]:PORT)");
}

static void test_error_bad_ports(void **state)
{
    (void)state;
    expect_error("use both tcp any *:7100-7000", "t.conf:1:20: port range reversed: 7100-7000 (LO must not exceed HI)");
    expect_error("use both tcp any *:65536", "t.conf:1:20: port 65536 out of range (0-65535)");
    expect_error("use both tcp any 1.2.3.4:1-70000", "t.conf:1:28: port 70000 out of range (0-65535)");
    expect_error("use both tcp any [::1]:99999999999999999999999",
                 "t.conf:1:24: port 99999999999999999999999 out of range (0-65535)");
    expect_error("use both tcp any 1.2.3.4:http",
                 "t.conf:1:26: expected a port, a port range LO-HI or * after ':', found 'http'");
    expect_error("use both tcp any 1.2.3.4:",
                 "t.conf:1:26: expected a port, a port range LO-HI or * after ':', found nothing");
    expect_error("use both tcp any *:80-", "t.conf:1:20: expected a port, a port range LO-HI or * after ':', found '80-'");
    expect_error("use both tcp any *:-80", "t.conf:1:20: expected a port, a port range LO-HI or * after ':', found '-80'");
    expect_error("use both tcp any *:1-2-3",
                 "t.conf:1:20: expected a port, a port range LO-HI or * after ':', found '1-2-3'");
}

static void test_error_bad_addresses(void **state)
{
    (void)state;
    expect_error("use both tcp any localhost", "t.conf:1:18: expected an address (IPv4, IPv6 or *), found 'localhost'");
    expect_error("use both tcp any 256.0.0.1",
                 "t.conf:1:18: invalid IPv4 address '256.0.0.1' (expected 4 numbers 0-255 without leading zeros)");
    expect_error("use both tcp any 010.0.0.1",
                 "t.conf:1:18: invalid IPv4 address '010.0.0.1' (expected 4 numbers 0-255 without leading zeros)");
    expect_error("use both tcp any 10.0.0",
                 "t.conf:1:18: invalid IPv4 address '10.0.0' (expected 4 numbers 0-255 without leading zeros)");
    expect_error("use both tcp any 1.2.3.4.5",
                 "t.conf:1:18: invalid IPv4 address '1.2.3.4.5' (expected 4 numbers 0-255 without leading zeros)");
    expect_error("use both tcp any :80", "t.conf:1:18: expected an address (IPv4, IPv6 or *), found nothing");
    expect_error("use both tcp any fe80:::1", "t.conf:1:18: invalid IPv6 address 'fe80:::1'");
    expect_error("use both tcp any [fe80::1", "t.conf:1:18: missing ']' after the bracketed IPv6 address in '[fe80::1'");
    expect_error("use both tcp any [10.0.0.1]:80", "t.conf:1:19: brackets are only for IPv6 addresses, found '10.0.0.1'");
    expect_error("use both tcp any [::1]80", "t.conf:1:23: expected ':PORT' after ']', found '80'");
    expect_error("use both tcp any */8", "t.conf:1:18: expected '*' or '*:PORT' for any address, found '*/8'");
}

static void test_error_keywords(void **state)
{
    (void)state;
    expect_error("bogus both tcp any *", "t.conf:1:1: expected 'use' or 'qos', found 'bogus'");
    expect_error("  USE both tcp any *", "t.conf:1:3: expected 'use' or 'qos', found 'USE' (keywords are lower-case)");
    expect_error("use rdmaa tcp any *", "t.conf:1:5: expected 'rdma', 'kernel' or 'both', found 'rdmaa'");
    expect_error("use both tpc any *", "t.conf:1:10: expected 'tcp' or 'udp', found 'tpc'");
    expect_error("use both TCP any *", "t.conf:1:10: expected 'tcp' or 'udp', found 'TCP' (keywords are lower-case)");
    expect_error("use both tcp anyone *", "t.conf:1:14: expected 'server', 'client' or 'any', found 'anyone'");
    expect_error("use", "t.conf:1:4: expected 'rdma', 'kernel' or 'both', found end of line");
    expect_error("use both tcp any # no address",
                 "t.conf:1:18: expected 'program GLOB' or an address (ADDR[/PREFIX][:PORT] or *), found end of line");
    expect_error("use both tcp any program nginx",
                 "t.conf:1:31: expected an address (ADDR[/PREFIX][:PORT] or *), found end of line");
    expect_error("use both tcp any program",
                 "t.conf:1:25: expected a program name pattern after 'program', found end of line");
    expect_error("use both tcp any program /usr/sbin/nginx *",
                 "t.conf:1:26: program pattern '/usr/sbin/nginx' contains '/': it is matched against the program's "
                 "short name (the basename)");
    expect_error("use both tcp any * program x", "t.conf:1:20: 'program GLOB' must come before the address");
}

static void test_error_program_pattern_too_long(void **state)
{
    (void)state;
    char text[400];
    int n = snprintf(text, sizeof(text), "use both tcp any program ");
    memset(text + n, 'a', 256);
    snprintf(text + n + 256, sizeof(text) - (size_t)n - 256, " *");
    expect_error(text, "t.conf:1:26: program pattern too long (max 255 bytes)");
    text[n + 255] = ' ';    /* 255 bytes is fine */
    struct rs_config *cfg = parse_ok(text);
    assert_int_equal(strlen(cfg->rules[0].program_glob), 255);
    rs_config_free(cfg);
}

static void test_error_options(void **state)
{
    (void)state;
    expect_error("use both tcp any * color=blue",
                 "t.conf:1:20: unknown option 'color' (expected transport, stream, zcopy_threshold, lend_ring, dgram or qos)");
    expect_error("use both tcp any * fallback=no",
                 "t.conf:1:20: unknown option 'fallback': the mode says it (rdma = no fallback, both = fall back to the "
                 "kernel, kernel = never RDMA)");
    expect_error("use both tcp any * stream=bcopy stream=zcopy",
                 "t.conf:1:33: duplicate option 'stream' (first given at column 20)");
    expect_error("use both tcp any * transport=verbs transport=verbs",
                 "t.conf:1:36: duplicate option 'transport' (first given at column 20)");
    expect_error("use both tcp any * verbs",
                 "t.conf:1:20: expected OPTION=VALUE (transport, stream, zcopy_threshold, lend_ring, dgram or qos), found 'verbs'");
    expect_error("use both tcp any * transport=", "t.conf:1:30: missing value after 'transport='");
    expect_error("use both tcp any * transport=rdma",
                 "t.conf:1:30: expected 'auto', 'verbs' or 'soft' for transport, found 'rdma'");
    expect_error("use both tcp any * transport=off",
                 "t.conf:1:30: expected 'auto', 'verbs' or 'soft' for transport, found 'off' (to keep sockets off RDMA "
                 "write 'use kernel ...')");
    expect_error("use both tcp any * stream=fast", "t.conf:1:27: expected 'bcopy', 'zcopy' or 'auto' for stream, found 'fast'");
    expect_error("use both udp any 10.0.0.0/8 stream=bcopy", "t.conf:1:29: stream= is only valid on tcp rules");
    expect_error("use both udp any 10.0.0.0/8 zcopy_threshold=64k",
                 "t.conf:1:29: zcopy_threshold= is only valid on tcp rules");
    expect_error("use both tcp any * dgram=wrecord", "t.conf:1:20: dgram= is only valid on udp rules");
    expect_error("use both udp any 10.0.0.0/8 lend_ring=on", "t.conf:1:29: lend_ring= is only valid on tcp rules");
    expect_error("use both tcp any * lend_ring=yes",
                 "t.conf:1:30: expected 'on', 'off' or 'auto' for lend_ring, found 'yes'");
    expect_error("use both udp any 10.0.0.0/8 dgram=rc",
                 "t.conf:1:35: expected 'sendrecv' or 'wrecord' for dgram, found 'rc'");
    expect_error("use both tcp any * zcopy_threshold=1023",
                 "t.conf:1:36: zcopy_threshold 1023 out of range (1k-1g)");
    expect_error("use both tcp any * zcopy_threshold=1073741825",
                 "t.conf:1:36: zcopy_threshold 1073741825 out of range (1k-1g)");
    expect_error("use both tcp any * zcopy_threshold=2g", "t.conf:1:36: zcopy_threshold 2g out of range (1k-1g)");
    expect_error("use both tcp any * zcopy_threshold=99999999999999999999k",
                 "t.conf:1:36: zcopy_threshold 99999999999999999999k out of range (1k-1g)");
    expect_error("use both tcp any * zcopy_threshold=64kb",
                 "t.conf:1:36: expected a size in bytes (optional suffix k, m or g) for zcopy_threshold, found '64kb'");
    expect_error("use both tcp any * zcopy_threshold=k",
                 "t.conf:1:36: expected a size in bytes (optional suffix k, m or g) for zcopy_threshold, found 'k'");
    expect_error("use both tcp any * zcopy_threshold=-1k",
                 "t.conf:1:36: expected a size in bytes (optional suffix k, m or g) for zcopy_threshold, found '-1k'");
}

static void test_error_qos_reference(void **state)
{
    (void)state;
    /* Defined later is an error: classes must precede the rules that use them. */
    expect_error("use both tcp any * qos=voip\nqos voip strict\n",
                 "t.conf:1:24: unknown qos class 'voip' (a qos class must be defined before the rules that use it)");
    expect_error("qos voip\nuse both tcp any * qos=VOIP\n",
                 "t.conf:2:24: unknown qos class 'VOIP' (a qos class must be defined before the rules that use it)");
    expect_error("qos a\nuse both tcp any * qos=a qos=a\n", "t.conf:2:26: duplicate option 'qos' (first given at column 20)");
}

static void test_error_qos_statement(void **state)
{
    (void)state;
    expect_error("qos", "t.conf:1:4: expected a qos class name after 'qos', found end of line");
    expect_error("qos 9lives", "t.conf:1:5: expected a qos class name (a letter or '_', then up to 31 letters, digits, "
                 "'_' or '-'), found '9lives'");
    expect_error("qos sl=3", "t.conf:1:5: expected a qos class name (a letter or '_', then up to 31 letters, digits, "
                 "'_' or '-'), found 'sl=3'");
    expect_error("qos abcdefghijklmnopqrstuvwxyz012345", "t.conf:1:5: expected a qos class name (a letter or '_', "
                 "then up to 31 letters, digits, '_' or '-'), found 'abcdefghijklmnopqrstuvwxyz012345'");
    expect_error("qos a\n# x\nqos a", "t.conf:3:5: qos class 'a' already defined on line 1");
    expect_error("qos a sl=16", "t.conf:1:10: sl 16 out of range (0-15)");
    expect_error("qos a tclass=256", "t.conf:1:14: tclass 256 out of range (0-255)");
    expect_error("qos a dscp=64", "t.conf:1:12: dscp 64 out of range (0-63)");
    expect_error("qos a priority=8", "t.conf:1:16: priority 8 out of range (0-7)");
    expect_error("qos a weight=0", "t.conf:1:14: weight 0 out of range (1-255)");
    expect_error("qos a weight=256", "t.conf:1:14: weight 256 out of range (1-255)");
    expect_error("qos a sl=x", "t.conf:1:10: expected a number 0-15 for sl, found 'x'");
    expect_error("qos a sl=", "t.conf:1:10: missing value after 'sl='");
    expect_error("qos a sl", "t.conf:1:7: expected sl=VALUE, found 'sl'");
    expect_error("qos a strict=yes", "t.conf:1:7: 'strict' takes no value");
    expect_error("qos a colour=red", "t.conf:1:7: unknown qos setting 'colour' (expected sl, tclass, dscp, priority, "
                 "weight or strict)");
    expect_error("qos a sl=1 sl=2", "t.conf:1:12: duplicate qos setting 'sl' (first given at column 7)");
    expect_error("qos a strict strict", "t.conf:1:14: duplicate qos setting 'strict' (first given at column 7)");
    expect_error("qos a weight=5 strict", "t.conf:1:16: 'weight=' and 'strict' exclude each other: a class is either "
                 "weighted or strict priority");
    expect_error("qos a strict weight=5", "t.conf:1:14: 'weight=' and 'strict' exclude each other: a class is either "
                 "weighted or strict priority");
    expect_error("qos a tclass=184 dscp=45", "t.conf:1:18: tclass=184 and dscp=45 disagree: the DSCP is the upper 6 "
                 "bits of the traffic class (tclass>>2 = 46)");
    expect_error("qos a dscp=45 tclass=184", "t.conf:1:15: tclass=184 and dscp=45 disagree: the DSCP is the upper 6 "
                 "bits of the traffic class (tclass>>2 = 46)");
    /* Agreeing values, including the ECN bits of tclass, are fine. */
    struct rs_config *cfg = parse_ok("qos a tclass=187 dscp=46\n");
    assert_int_equal(cfg->qos[0].tclass, 187);
    rs_config_free(cfg);
}

static void test_error_udp_rule_must_name_peers(void **state)
{
    (void)state;
    static const char *const message = "a UDP rule must name its peers: give an address or prefix, not *";
    char expected[200];

    snprintf(expected, sizeof(expected), "t.conf:1:18: %s", message);
    expect_error("use rdma udp any *", expected);
    expect_error("use both udp any *:5000", expected);
    expect_error("use both udp client 0.0.0.0/0:5000", "t.conf:1:21: a UDP rule must name its peers: give an address "
                 "or prefix, not *");
    expect_error("use rdma udp server ::/0", "t.conf:1:21: a UDP rule must name its peers: give an address or prefix, "
                 "not *");
    expect_error("use rdma udp any [::/0]:53", expected);
    expect_error("use rdma udp any program x *", "t.conf:1:28: a UDP rule must name its peers: give an address or "
                 "prefix, not *");
    /* /1 names half the internet, which is still naming peers; kernel UDP rules may use '*'. */
    struct rs_config *cfg = parse_ok("use rdma udp any 0.0.0.0/1\nuse kernel udp any *\nuse both tcp any *\n");
    assert_int_equal(cfg->n_rules, 3);
    rs_config_free(cfg);
}

static void test_error_overlong_line(void **state)
{
    (void)state;
    char *text = malloc(5000);
    assert_non_null(text);
    memset(text, ' ', 5000);
    memcpy(text, "use both tcp any *\n", 19);
    memset(text + 19, '#', 4096);   /* line 2: 4096 bytes */
    text[19 + 4096] = '\n';
    expect_error_n(text, 19 + 4097, "t.conf:2:4096: line too long (max 4095 bytes)");
    /* Also without a final newline, and with a CR: 4096 bytes before CRLF is still too long. */
    expect_error_n(text, 19 + 4096, "t.conf:2:4096: line too long (max 4095 bytes)");
    text[19 + 4096] = '\r';
    text[19 + 4097] = '\n';
    expect_error_n(text, 19 + 4098, "t.conf:2:4096: line too long (max 4095 bytes)");
    free(text);
}

static void test_error_binary_garbage(void **state)
{
    (void)state;
    expect_error_n("use both tcp any *\0", 19, "t.conf:1:19: binary data: unexpected byte 0x00");
    expect_error_n("\0\0\0\0", 4, "t.conf:1:1: binary data: unexpected byte 0x00");
    expect_error("use \xff\xff", "t.conf:1:5: binary data: unexpected byte 0xff");
    expect_error("# ok\n\xfe\xff garbage", "t.conf:2:1: binary data: unexpected byte 0xfe");
    expect_error("use both\x01 tcp", "t.conf:1:9: binary data: unexpected byte 0x01");
    expect_error("use both tcp any * # \x1b[31m", "t.conf:1:22: binary data: unexpected byte 0x1b");
    expect_error("# delete \x7f", "t.conf:1:10: binary data: unexpected byte 0x7f");
    /* A CR is only accepted right before the LF. */
    expect_error("use\rboth tcp any *\n", "t.conf:1:4: binary data: unexpected byte 0x0d");
    expect_error("use both tcp any *\r\r\n", "t.conf:1:19: binary data: unexpected byte 0x0d");
    /* Malformed UTF-8: bad continuation, overlong, surrogate, beyond U+10FFFF, truncated, C1 control. */
    expect_error("# \xc3\x28", "t.conf:1:3: binary data: unexpected byte 0xc3");
    expect_error("# \xc0\xaf", "t.conf:1:3: binary data: unexpected byte 0xc0");
    expect_error("# \xed\xa0\x80", "t.conf:1:3: binary data: unexpected byte 0xed");
    expect_error("# \xf4\x90\x80\x80", "t.conf:1:3: binary data: unexpected byte 0xf4");
    expect_error("# \xe2\x98", "t.conf:1:3: binary data: unexpected byte 0xe2");
    expect_error("# \xc2\x85", "t.conf:1:3: binary data: unexpected byte 0xc2");
    expect_error("# \xe0\x80\x80", "t.conf:1:3: binary data: unexpected byte 0xe0");
    expect_error("# \xe2\x98\x28", "t.conf:1:3: binary data: unexpected byte 0xe2");
    expect_error("# \xf1\x80\x80", "t.conf:1:3: binary data: unexpected byte 0xf1");
    expect_error("# ok \xc2\xa0 \x80", "t.conf:1:9: binary data: unexpected byte 0x80");
    /* The smallest and largest sequences of each length are text. */
    struct rs_config *cfg = parse_ok("# \xc2\xa0 \xdf\xbf \xe0\xa0\x80 \xef\xbf\xbf \xf0\x90\x80\x80 \xf1\x80\x80\x80 "
                                     "\xf4\x8f\xbf\xbf\n");
    rs_config_free(cfg);
}

static void test_error_too_many_statements(void **state)
{
    (void)state;
    size_t size = 4097 * 24;
    char *text = malloc(size);
    size_t used = 0;
    assert_non_null(text);
    for (int i = 0; i < 4097; i++)
        used += (size_t)snprintf(text + used, size - used, "use kernel tcp any *\n");
    expect_error_n(text, used, "t.conf:4097:1: too many rules (max 4096)");

    used = 0;
    for (int i = 0; i < 65; i++)
        used += (size_t)snprintf(text + used, size - used, "  qos q%d\n", i);
    expect_error_n(text, used, "t.conf:65:3: too many qos classes (max 64)");
    free(text);
}

static void test_error_buffer_too_large(void **state)
{
    (void)state;
    char *text = malloc(RS_CONFIG_MAX_FILE_BYTES + 1);
    assert_non_null(text);
    memset(text, '\n', RS_CONFIG_MAX_FILE_BYTES + 1);
    expect_error_n(text, RS_CONFIG_MAX_FILE_BYTES + 1, "t.conf:0:0: file too large (1048577 bytes, max 1048576)");
    assert_int_equal(errno, EFBIG);
    free(text);
}

static void test_error_stops_at_first_error_and_returns_nothing(void **state)
{
    (void)state;
    struct rs_config *cfg = (struct rs_config *)0x1;
    struct rs_config_error err;
    const char *text = "qos a\nuse both tcp any *\nuse both tcp any *:99999\nuse both tcp any bogus\n";

    errno = 0;
    assert_int_equal(rs_config_parse_buffer("x/y.conf", text, strlen(text), &cfg, &err), -1);
    assert_null(cfg);
    assert_int_equal(errno, EINVAL);
    assert_string_equal(err.file, "x/y.conf");
    assert_int_equal(err.line, 3);
    assert_int_equal(err.column, 20);
    assert_string_equal(err.message, "port 99999 out of range (0-65535)");
    /* err may be NULL: the caller only learns that it failed. */
    cfg = (struct rs_config *)0x1;
    assert_int_equal(rs_config_parse_buffer("x", text, strlen(text), &cfg, NULL), -1);
    assert_null(cfg);
    assert_int_equal(rs_config_parse_buffer("x", "use", 3, NULL, &err), -1);
    assert_string_equal(err.message, "invalid arguments");
    assert_int_equal(rs_config_parse_buffer("x", NULL, 3, &cfg, &err), -1);
    assert_null(cfg);
    assert_int_equal(rs_config_load_file(NULL, &cfg, NULL), -1);
    assert_int_equal(rs_config_load_file("/nonexistent/x.conf", &cfg, NULL), -1);
    assert_null(cfg);
}

static void test_error_long_token_is_shortened(void **state)
{
    (void)state;
    char text[300];
    memset(text, 0, sizeof(text));
    memcpy(text, "use both ", 9);
    memset(text + 9, 'z', 100);
    expect_error(text, "t.conf:1:10: expected 'tcp' or 'udp', found "
                 "'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...'");
    /* Shortening never splits a UTF-8 sequence: 47 ASCII bytes then a 2-byte character. */
    memset(text + 9, 'z', 47);
    memcpy(text + 9 + 47, "\xc3\xa9\xc3\xa9", 5);
    expect_error(text, "t.conf:1:10: expected 'tcp' or 'udp', found "
                 "'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...'");
}

/* ---- files ------------------------------------------------------------------------------------------------- */

static void test_load_missing_file(void **state)
{
    (void)state;
    char path[128], expected[300], message[600];
    struct rs_config *cfg = (struct rs_config *)0x1;
    struct rs_config_error err;

    snprintf(path, sizeof(path), "%s/does-not-exist.conf", scratch_dir);
    errno = 0;
    assert_int_equal(rs_config_load_file(path, &cfg, &err), -1);
    assert_int_equal(errno, ENOENT);
    assert_null(cfg);
    rs_config_format_error(&err, message, sizeof(message));
    snprintf(expected, sizeof(expected), "%s:0:0: cannot open: No such file or directory", path);
    assert_string_equal(message, expected);
}

static void test_load_directory(void **state)
{
    (void)state;
    char expected[300], message[600];
    struct rs_config *cfg = (struct rs_config *)0x1;
    struct rs_config_error err;

    errno = 0;
    assert_int_equal(rs_config_load_file(scratch_dir, &cfg, &err), -1);
    assert_int_equal(errno, EISDIR);
    assert_null(cfg);
    rs_config_format_error(&err, message, sizeof(message));
    snprintf(expected, sizeof(expected), "%s:0:0: cannot read: Is a directory", scratch_dir);
    assert_string_equal(message, expected);
}

static void test_load_fifo_is_rejected_without_blocking(void **state)
{
    (void)state;
    char path[128], expected[300], message[600];
    struct rs_config *cfg = NULL;
    struct rs_config_error err;

    snprintf(path, sizeof(path), "%s/fifo.conf", scratch_dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(rs_config_load_file(path, &cfg, &err), -1);
    assert_null(cfg);
    rs_config_format_error(&err, message, sizeof(message));
    snprintf(expected, sizeof(expected), "%s:0:0: cannot read: not a regular file", path);
    assert_string_equal(message, expected);
    unlink(path);
}

static void test_load_empty_and_valid_files(void **state)
{
    (void)state;
    char path[128];
    struct rs_config *cfg = NULL;
    struct rs_config_error err;

    snprintf(path, sizeof(path), "%s/empty.conf", scratch_dir);
    write_file(path, "", 0);
    assert_int_equal(rs_config_load_file(path, &cfg, &err), 0);
    assert_non_null(cfg);
    assert_int_equal(cfg->n_rules, 0);
    assert_string_equal(cfg->source, path);
    rs_config_free(cfg);

    const char *text = "qos q weight=3\r\nuse rdma tcp client 10.0.0.0/8 qos=q\r\n";
    snprintf(path, sizeof(path), "%s/crlf.conf", scratch_dir);
    write_file(path, text, strlen(text));
    assert_int_equal(rs_config_load_file(path, &cfg, &err), 0);
    assert_int_equal(cfg->n_rules, 1);
    assert_int_equal(cfg->rules[0].line, 2);
    assert_int_equal(cfg->rules[0].qos_index, 0);
    rs_config_free(cfg);
}

static void test_load_file_errors_name_the_file(void **state)
{
    (void)state;
    char path[128], expected[300], message[600];
    struct rs_config *cfg = (struct rs_config *)0x1;
    struct rs_config_error err;

    snprintf(path, sizeof(path), "%s/bad.conf", scratch_dir);
    write_file(path, "# ok\nuse both tcp any *\n\nuse both udp any *\n", 44);
    assert_int_equal(rs_config_load_file(path, &cfg, &err), -1);
    assert_null(cfg);
    rs_config_format_error(&err, message, sizeof(message));
    snprintf(expected, sizeof(expected),
             "%s:4:18: a UDP rule must name its peers: give an address or prefix, not *", path);
    assert_string_equal(message, expected);

    snprintf(path, sizeof(path), "%s/binary.conf", scratch_dir);
    write_file(path, "\x7f" "ELF\x02\x01\x01\0\0\0", 10);
    assert_int_equal(rs_config_load_file(path, &cfg, &err), -1);
    rs_config_format_error(&err, message, sizeof(message));
    snprintf(expected, sizeof(expected), "%s:1:1: binary data: unexpected byte 0x7f", path);
    assert_string_equal(message, expected);
}

static void test_load_file_too_large(void **state)
{
    (void)state;
    char path[128], expected[300], message[600];
    struct rs_config *cfg = NULL;
    struct rs_config_error err;
    char *text = malloc(RS_CONFIG_MAX_FILE_BYTES + 1);

    assert_non_null(text);
    memset(text, '\n', RS_CONFIG_MAX_FILE_BYTES + 1);
    snprintf(path, sizeof(path), "%s/big.conf", scratch_dir);
    write_file(path, text, RS_CONFIG_MAX_FILE_BYTES + 1);
    errno = 0;
    assert_int_equal(rs_config_load_file(path, &cfg, &err), -1);
    assert_int_equal(errno, EFBIG);
    rs_config_format_error(&err, message, sizeof(message));
    snprintf(expected, sizeof(expected), "%s:0:0: file too large (1048577 bytes, max 1048576)", path);
    assert_string_equal(message, expected);

    write_file(path, text, RS_CONFIG_MAX_FILE_BYTES);
    assert_int_equal(rs_config_load_file(path, &cfg, &err), 0);
    assert_int_equal(cfg->n_rules, 0);
    rs_config_free(cfg);
    free(text);
}

static void test_load_file_keeps_the_end_of_a_long_name(void **state)
{
    (void)state;
    char path[400];
    struct rs_config *cfg = NULL;
    struct rs_config_error err;

    memset(path, 'd', sizeof(path));
    memcpy(path, "/nonexistent/", 13);
    snprintf(path + 380, 20, "/tail.conf");
    assert_int_equal(rs_config_load_file(path, &cfg, &err), -1);
    assert_int_equal(strlen(err.file), 255);
    assert_memory_equal(err.file, "...", 3);
    assert_string_equal(err.file + 255 - 10, "/tail.conf");
}

/* The shipped example must stay valid: find it through RS_TOP, or relative to this source file or the cwd. */
static void test_shipped_example_config_is_valid(void **state)
{
    (void)state;
    char candidates[3][512];
    const char *top = getenv("RS_TOP");
    char source[512];

    snprintf(candidates[0], sizeof(candidates[0]), "%s/conf/rdmasock.conf", top ? top : "/nonexistent");
    snprintf(source, sizeof(source), "%s", __FILE__);
    snprintf(candidates[1], sizeof(candidates[1]), "%s/../../conf/rdmasock.conf", dirname(source));
    snprintf(candidates[2], sizeof(candidates[2]), "conf/rdmasock.conf");

    const char *path = NULL;
    for (int i = 0; i < 3 && !path; i++) {
        if (access(candidates[i], R_OK) == 0)
            path = candidates[i];
    }
    if (!path)
        fail_msg("conf/rdmasock.conf not found (set RS_TOP or run from the repository root)");

    struct rs_config *cfg = NULL;
    struct rs_config_error err;
    char message[600];
    if (rs_config_load_file(path, &cfg, &err) != 0) {
        rs_config_format_error(&err, message, sizeof(message));
        fail_msg("%s", message);
    }
    /* The example demonstrates qos classes (voip strict, bulk weighted) and both address families. */
    assert_true(cfg->n_rules >= 8);
    assert_true(cfg->n_qos >= 2);
    bool has_voip = false, has_bulk = false, has_v6 = false, has_glob = false;
    for (size_t i = 0; i < cfg->n_qos; i++) {
        has_voip |= strcmp(cfg->qos[i].name, "voip") == 0 && cfg->qos[i].strict;
        has_bulk |= strcmp(cfg->qos[i].name, "bulk") == 0 && !cfg->qos[i].strict && cfg->qos[i].weight > 1;
    }
    for (size_t i = 0; i < cfg->n_rules; i++) {
        has_v6 |= cfg->rules[i].family == AF_INET6;
        has_glob |= cfg->rules[i].program_glob != NULL;
    }
    assert_true(has_voip);
    assert_true(has_bulk);
    assert_true(has_v6);
    assert_true(has_glob);
    assert_round_trip(cfg);
    rs_config_free(cfg);
}

/* ---- matching ---------------------------------------------------------------------------------------------- */

static void test_match_ipv4_prefixes(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use kernel tcp client 10.0.0.1\n"        /* /32 */
                                     "use kernel tcp client 128.0.0.0/1\n"
                                     "use kernel tcp client 10.1.0.0/16:5000\n"
                                     "use kernel tcp client 0.0.0.0/0:22\n");
    assert_int_equal(client_match_line(cfg, "10.0.0.1", 9), 1);
    assert_int_equal(client_match_line(cfg, "10.0.0.2", 9), 0);
    assert_int_equal(client_match_line(cfg, "128.0.0.0", 9), 2);
    assert_int_equal(client_match_line(cfg, "255.255.255.255", 9), 2);
    assert_int_equal(client_match_line(cfg, "127.255.255.255", 9), 0);
    assert_int_equal(client_match_line(cfg, "10.1.255.7", 5000), 3);
    assert_int_equal(client_match_line(cfg, "10.1.255.7", 5001), 0);
    assert_int_equal(client_match_line(cfg, "10.2.0.1", 5000), 0);
    assert_int_equal(client_match_line(cfg, "1.2.3.4", 22), 4);
    assert_int_equal(client_match_line(cfg, "10.0.0.2", 22), 4);
    /* An IPv4 rule never matches a native IPv6 address, even through /0. */
    assert_int_equal(client_match_line(cfg, "2001:db8::1", 22), 0);
    rs_config_free(cfg);
}

static void test_match_ipv6_prefixes(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use kernel tcp client ::1\n"             /* /128 */
                                     "use kernel tcp client [fe80::/10]:7000-7100\n"
                                     "use kernel tcp client 8000::/1\n"
                                     "use kernel tcp client [::/0]:22\n");
    assert_int_equal(client_match_line(cfg, "::1", 1), 1);
    assert_int_equal(client_match_line(cfg, "::2", 1), 0);
    assert_int_equal(client_match_line(cfg, "fe80::1", 7000), 2);
    assert_int_equal(client_match_line(cfg, "febf:ffff::1", 7100), 2);
    assert_int_equal(client_match_line(cfg, "fe80::1", 7101), 3);      /* falls to 8000::/1 */
    assert_int_equal(client_match_line(cfg, "fec0::1", 7000), 3);
    assert_int_equal(client_match_line(cfg, "ffff::1", 1), 3);
    assert_int_equal(client_match_line(cfg, "7fff::1", 1), 0);
    assert_int_equal(client_match_line(cfg, "7fff::1", 22), 4);
    assert_int_equal(client_match_line(cfg, "::ffff:10.0.0.1", 22), 4); /* a mapped address is IPv6 too */
    /* An IPv6 rule never matches an AF_INET address. */
    assert_int_equal(client_match_line(cfg, "10.0.0.1", 22), 0);
    rs_config_free(cfg);
}

static void test_match_ipv4_rule_covers_mapped_ipv6(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use rdma tcp client 10.0.0.0/8:5000\n"
                                     "use kernel tcp client 0.0.0.0/0\n");
    assert_int_equal(client_match_line(cfg, "::ffff:10.9.8.7", 5000), 1);
    assert_int_equal(client_match_line(cfg, "::ffff:10.9.8.7", 5001), 2);
    assert_int_equal(client_match_line(cfg, "::ffff:11.0.0.1", 5000), 2);
    /* Not mapped: ::10.9.8.7 (deprecated IPv4-compatible) and ::ffff:0:a09:807 differ from ::ffff:a.b.c.d. */
    assert_int_equal(client_match_line(cfg, "::10.9.8.7", 5000), 0);
    assert_int_equal(client_match_line(cfg, "0:0:0:0:1:ffff:a09:807", 5000), 0);
    rs_config_free(cfg);
}

static void test_match_first_rule_wins(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use kernel tcp any 10.0.0.0/8\nuse rdma tcp any 10.0.0.0/24\n");
    struct sockaddr_storage ss = sa4("10.0.0.5", 80);
    const struct rs_rule *rule = rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "x", (struct sockaddr *)&ss);
    assert_int_equal(rule->line, 1);
    assert_int_equal(rule->mode, RS_MODE_KERNEL);
    rs_config_free(cfg);

    cfg = parse_ok("use rdma tcp any 10.0.0.0/24\nuse kernel tcp any 10.0.0.0/8\n");
    rule = rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "x", (struct sockaddr *)&ss);
    assert_int_equal(rule->line, 1);
    assert_int_equal(rule->mode, RS_MODE_RDMA);
    ss = sa4("10.0.1.5", 80);
    rule = rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "x", (struct sockaddr *)&ss);
    assert_int_equal(rule->line, 2);
    rs_config_free(cfg);
}

static void test_match_program_globs(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use rdma tcp any program nginx* *\n"
                                     "use rdma tcp any program [rp]ython? *\n"
                                     "use kernel tcp any program * *:22\n");
    struct sockaddr_storage ss = sa4("192.0.2.1", 80);
    const struct sockaddr *addr = (const struct sockaddr *)&ss;

    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "nginx", addr)->line, 1);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "nginx-worker", addr)->line, 1);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "/usr/sbin/nginx", addr)->line, 1);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "python3", addr)->line, 2);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "rython3", addr)->line, 2);
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "xnginx", addr)->is_default);
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "python", addr)->is_default);
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "python33", addr)->is_default);
    /* An unknown program cannot satisfy a pattern, not even '*'. */
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, NULL, addr)->is_default);
    ss = sa4("192.0.2.1", 22);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "sshd", addr)->line, 3);
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, NULL, addr)->is_default);
    rs_config_free(cfg);
}

static void test_match_roles_and_protocols(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use rdma tcp server *:80\n"
                                     "use kernel tcp client *:80\n"
                                     "use both tcp any *:81\n"
                                     "use rdma udp any 10.0.0.0/8:80\n");
    struct sockaddr_storage ss = sa4("10.0.0.1", 80);
    const struct sockaddr *addr = (const struct sockaddr *)&ss;

    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "p", addr)->line, 1);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "p", addr)->line, 2);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_UDP, RS_ROLE_CLIENT, "p", addr)->line, 4);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_UDP, RS_ROLE_SERVER, "p", addr)->line, 4);
    /* A query whose role is unknown only matches `any` rules. */
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_ANY, "p", addr)->is_default);
    ss = sa4("10.0.0.1", 81);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "p", addr)->line, 3);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "p", addr)->line, 3);
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_ANY, "p", addr)->line, 3);
    assert_true(rs_config_match(cfg, RS_PROTO_UDP, RS_ROLE_ANY, "p", addr)->is_default);
    rs_config_free(cfg);
}

static void test_match_unknown_address(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok("use rdma tcp any 10.0.0.0/8\nuse rdma tcp any *:80\nuse kernel tcp any *\n");
    struct sockaddr_un sun;

    /* Without an address only rules that do not constrain address or port can match. */
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "p", NULL)->line, 3);
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    assert_int_equal(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "p", (struct sockaddr *)&sun)->line, 3);
    rs_config_free(cfg);

    cfg = parse_ok("use rdma tcp any 10.0.0.0/8\n");
    assert_true(rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_CLIENT, "p", NULL)->is_default);
    rs_config_free(cfg);
}

static void test_match_defaults(void **state)
{
    (void)state;
    struct sockaddr_storage ss = sa4("192.0.2.1", 80);
    const struct sockaddr *addr = (const struct sockaddr *)&ss;
    const struct rs_rule *r;

    r = rs_config_match(NULL, RS_PROTO_TCP, RS_ROLE_SERVER, "p", addr);
    assert_true(r->is_default);
    assert_int_equal(r->mode, RS_MODE_BOTH);
    assert_int_equal(r->proto, RS_PROTO_TCP);
    assert_int_equal(r->role, RS_ROLE_SERVER);
    assert_int_equal(r->line, 0);
    assert_null(r->program_glob);
    assert_int_equal(r->qos_index, -1);
    assert_int_equal(r->transport, RS_TRANSPORT_AUTO);
    assert_int_equal(r->zcopy_threshold, 65536);

    r = rs_config_match(NULL, RS_PROTO_TCP, RS_ROLE_CLIENT, NULL, NULL);
    assert_true(r->is_default);
    assert_int_equal(r->mode, RS_MODE_BOTH);
    assert_int_equal(r->role, RS_ROLE_CLIENT);

    r = rs_config_match(NULL, RS_PROTO_TCP, RS_ROLE_ANY, NULL, NULL);
    assert_int_equal(r->mode, RS_MODE_BOTH);

    for (int role = RS_ROLE_SERVER; role <= RS_ROLE_ANY; role++) {
        r = rs_config_match(NULL, RS_PROTO_UDP, (enum rs_role)role, "p", addr);
        assert_true(r->is_default);
        assert_int_equal(r->mode, RS_MODE_KERNEL);
        assert_int_equal(r->proto, RS_PROTO_UDP);
    }

    /* A configuration whose rules do not match falls back to the same defaults. */
    struct rs_config *cfg = parse_ok("use rdma tcp any 10.0.0.0/8\n");
    r = rs_config_match(cfg, RS_PROTO_TCP, RS_ROLE_SERVER, "p", addr);
    assert_true(r->is_default);
    assert_int_equal(r->mode, RS_MODE_BOTH);
    rs_config_free(cfg);

    /* And an empty configuration behaves like none. */
    cfg = parse_ok("");
    assert_ptr_equal(rs_config_match(cfg, RS_PROTO_UDP, RS_ROLE_CLIENT, "p", addr),
                     rs_config_match(NULL, RS_PROTO_UDP, RS_ROLE_CLIENT, "p", addr));
    rs_config_free(cfg);

    /* The rule for a broken configuration file keeps everything on the kernel. */
    r = rs_config_kernel_rule(RS_PROTO_TCP);
    assert_int_equal(r->mode, RS_MODE_KERNEL);
    assert_int_equal(r->proto, RS_PROTO_TCP);
    assert_true(r->is_default);
    r = rs_config_kernel_rule(RS_PROTO_UDP);
    assert_int_equal(r->mode, RS_MODE_KERNEL);
    assert_int_equal(r->proto, RS_PROTO_UDP);
}

/* ---- dump, names, helpers ---------------------------------------------------------------------------------- */

static void test_dump_is_canonical(void **state)
{
    (void)state;
    struct rs_config *cfg = parse_ok(
        "# comment\n"
        "qos voip sl=7 tclass=184 dscp=46 priority=6 strict\n"
        "qos bulk weight=10\n"
        "qos plain sl=0 weight=1\n"
        "use both tcp any 10.0.0.0/8:0-65535   # explicit full range = any port\n"
        "use rdma tcp server [::1]:*\n"
        "use rdma tcp server [fe80::/10]:7000-7100 stream=zcopy zcopy_threshold=1048576\n"
        "use both tcp client program redis-* *:6379-6379 zcopy_threshold=1500 qos=bulk\n"
        "use both tcp client 192.168.1.7/32:80 zcopy_threshold=65536 transport=soft\n"
        "use rdma udp any ::ffff:10.0.0.0/104 dgram=wrecord qos=voip\n"
        "use both tcp any * zcopy_threshold=1024m\n"
        "use kernel udp any *:53\n");
    char *text = dump_to_string(cfg);
    assert_string_equal(text,
        "qos voip sl=7 tclass=184 dscp=46 priority=6 strict\n"
        "qos bulk weight=10\n"
        "qos plain\n"
        "use both tcp any 10.0.0.0/8\n"
        "use rdma tcp server ::1\n"
        "use rdma tcp server [fe80::/10]:7000-7100 stream=zcopy zcopy_threshold=1m\n"
        "use both tcp client program redis-* *:6379 zcopy_threshold=1500 qos=bulk\n"
        "use both tcp client 192.168.1.7:80 transport=soft zcopy_threshold=64k\n"
        "use rdma udp any ::ffff:10.0.0.0/104 dgram=wrecord qos=voip\n"
        "use both tcp any * zcopy_threshold=1g\n"
        "use kernel udp any *:53\n");
    free(text);
    assert_round_trip(cfg);
    rs_config_free(cfg);

    /* Nothing to dump is not an error; a NULL stream is. */
    text = dump_to_string(NULL);
    assert_string_equal(text, "");
    free(text);
    assert_int_equal(rs_config_dump(NULL, NULL), -1);
}

static void test_equal_notices_every_difference(void **state)
{
    (void)state;
    static const char *const base = "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q\n";
    static const char *const variants[] = {
        "qos q sl=2\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q\n",
        "qos r sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=r\n",
        "qos q sl=1\nuse both tcp client program p* 10.0.0.0/8:80 qos=q\n",
        "qos q sl=1\nuse rdma tcp server program p* 10.0.0.0/8:80 qos=q\n",
        "qos q sl=1\nuse rdma tcp client program q* 10.0.0.0/8:80 qos=q\n",
        "qos q sl=1\nuse rdma tcp client 10.0.0.0/8:80 qos=q\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/9:80 qos=q\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:81 qos=q\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q transport=soft\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q zcopy_threshold=2k\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q zcopy_threshold=64k\n",
        "qos q sl=1\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q lend_ring=on\n",
        "qos q sl=1\nuse rdma tcp client program p* [::a00:0/104]:80 qos=q\n",
        "qos q sl=1\nqos z\nuse rdma tcp client program p* 10.0.0.0/8:80 qos=q\n",
    };
    struct rs_config *a = parse_ok(base);
    struct rs_config *same = parse_ok("# different lines, same meaning\n\nqos q sl=1\n"
                                      "use rdma tcp client program p* 10.0.0.0/8:80-80 qos=q\n");
    assert_true(rs_config_equal(a, same));
    assert_true(rs_config_equal(NULL, NULL));
    assert_false(rs_config_equal(a, NULL));
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        struct rs_config *b = parse_ok(variants[i]);
        if (rs_config_equal(a, b))
            fail_msg("variant %zu compares equal", i);
        rs_config_free(b);
    }
    rs_config_free(a);
    rs_config_free(same);
}

static void test_format_error(void **state)
{
    (void)state;
    struct rs_config_error err = { .file = "rdmasock.conf", .line = 12, .column = 5,
                                   .message = "expected 'tcp' or 'udp', found 'tpc'" };
    char buf[100];

    assert_int_equal(rs_config_format_error(&err, buf, sizeof(buf)), 56);
    assert_string_equal(buf, "rdmasock.conf:12:5: expected 'tcp' or 'udp', found 'tpc'");
    assert_int_equal(rs_config_format_error(&err, buf, 10), 56);
    assert_string_equal(buf, "rdmasock.");
}

static void test_enum_names_and_transport_parsing(void **state)
{
    (void)state;
    enum rs_transport t = RS_TRANSPORT_AUTO;

    assert_string_equal(rs_mode_name(RS_MODE_KERNEL), "kernel");
    assert_string_equal(rs_mode_name(RS_MODE_RDMA), "rdma");
    assert_string_equal(rs_mode_name(RS_MODE_BOTH), "both");
    assert_string_equal(rs_mode_name((enum rs_mode)42), "?");
    assert_string_equal(rs_proto_name(RS_PROTO_TCP), "tcp");
    assert_string_equal(rs_proto_name(RS_PROTO_UDP), "udp");
    assert_string_equal(rs_role_name(RS_ROLE_SERVER), "server");
    assert_string_equal(rs_role_name(RS_ROLE_CLIENT), "client");
    assert_string_equal(rs_role_name(RS_ROLE_ANY), "any");
    assert_string_equal(rs_transport_name(RS_TRANSPORT_AUTO), "auto");
    assert_string_equal(rs_transport_name(RS_TRANSPORT_VERBS), "verbs");
    assert_string_equal(rs_transport_name(RS_TRANSPORT_SOFT), "soft");
    assert_string_equal(rs_transport_name(RS_TRANSPORT_OFF), "off");
    assert_string_equal(rs_stream_mode_name(RS_STREAM_AUTO), "auto");
    assert_string_equal(rs_stream_mode_name(RS_STREAM_BCOPY), "bcopy");
    assert_string_equal(rs_stream_mode_name(RS_STREAM_ZCOPY), "zcopy");
    assert_string_equal(rs_dgram_mode_name(RS_DGRAM_SENDRECV), "sendrecv");
    assert_string_equal(rs_dgram_mode_name(RS_DGRAM_WRECORD), "wrecord");

    assert_int_equal(rs_parse_transport("verbs", &t), 0);
    assert_int_equal(t, RS_TRANSPORT_VERBS);
    assert_int_equal(rs_parse_transport("soft", &t), 0);
    assert_int_equal(t, RS_TRANSPORT_SOFT);
    assert_int_equal(rs_parse_transport("off", &t), 0);
    assert_int_equal(t, RS_TRANSPORT_OFF);
    assert_int_equal(rs_parse_transport("auto", &t), 0);
    assert_int_equal(t, RS_TRANSPORT_AUTO);
    t = RS_TRANSPORT_SOFT;
    errno = 0;
    assert_int_equal(rs_parse_transport("AUTO", &t), -1);
    assert_int_equal(errno, EINVAL);
    assert_int_equal(rs_parse_transport("", &t), -1);
    assert_int_equal(rs_parse_transport("verbs ", &t), -1);
    assert_int_equal(rs_parse_transport(NULL, &t), -1);
    assert_int_equal(t, RS_TRANSPORT_SOFT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_and_comment_only_inputs_have_no_rules),
        cmocka_unit_test(test_use_modes_protocols_roles),
        cmocka_unit_test(test_ipv4_address_forms),
        cmocka_unit_test(test_ipv6_address_forms),
        cmocka_unit_test(test_program_glob),
        cmocka_unit_test(test_every_rule_option),
        cmocka_unit_test(test_qos_classes),
        cmocka_unit_test(test_qos_reference_resolves_to_index),
        cmocka_unit_test(test_comments_whitespace_and_crlf),
        cmocka_unit_test(test_limits_that_are_still_valid),
        cmocka_unit_test(test_error_bad_prefix),
        cmocka_unit_test(test_error_bad_ports),
        cmocka_unit_test(test_error_bad_addresses),
        cmocka_unit_test(test_error_keywords),
        cmocka_unit_test(test_error_program_pattern_too_long),
        cmocka_unit_test(test_error_options),
        cmocka_unit_test(test_error_qos_reference),
        cmocka_unit_test(test_error_qos_statement),
        cmocka_unit_test(test_error_udp_rule_must_name_peers),
        cmocka_unit_test(test_error_overlong_line),
        cmocka_unit_test(test_error_binary_garbage),
        cmocka_unit_test(test_error_too_many_statements),
        cmocka_unit_test(test_error_buffer_too_large),
        cmocka_unit_test(test_error_stops_at_first_error_and_returns_nothing),
        cmocka_unit_test(test_error_long_token_is_shortened),
        cmocka_unit_test(test_load_missing_file),
        cmocka_unit_test(test_load_directory),
        cmocka_unit_test(test_load_fifo_is_rejected_without_blocking),
        cmocka_unit_test(test_load_empty_and_valid_files),
        cmocka_unit_test(test_load_file_errors_name_the_file),
        cmocka_unit_test(test_load_file_too_large),
        cmocka_unit_test(test_load_file_keeps_the_end_of_a_long_name),
        cmocka_unit_test(test_shipped_example_config_is_valid),
        cmocka_unit_test(test_match_ipv4_prefixes),
        cmocka_unit_test(test_match_ipv6_prefixes),
        cmocka_unit_test(test_match_ipv4_rule_covers_mapped_ipv6),
        cmocka_unit_test(test_match_first_rule_wins),
        cmocka_unit_test(test_match_program_globs),
        cmocka_unit_test(test_match_roles_and_protocols),
        cmocka_unit_test(test_match_unknown_address),
        cmocka_unit_test(test_match_defaults),
        cmocka_unit_test(test_dump_is_canonical),
        cmocka_unit_test(test_equal_notices_every_difference),
        cmocka_unit_test(test_format_error),
        cmocka_unit_test(test_enum_names_and_transport_parsing),
    };
    return cmocka_run_group_tests_name("config", tests, make_scratch_dir, remove_scratch_dir);
}
