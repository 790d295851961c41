/* The rule language of rdmasock (rdmasock.conf(5)): parsing, matching, canonical dumping.
 *
 * A configuration is a list of `use` rules (which sockets go to RDMA, to the kernel, or try RDMA and fall back)
 * and `qos` classes the rules may reference. The parser is all-or-nothing: on the first error it returns -1, a
 * filled rs_config_error and no configuration, so a broken file can never half-apply. The module never prints
 * or logs; callers decide how to report errors. */
#ifndef RS_COMMON_CONFIG_H
#define RS_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

/* Hard limits. They bound the memory the parser may allocate for any input and are part of the documented
 * file format (rdmasock.conf(5)). */
#define RS_CONFIG_MAX_FILE_BYTES   (1024u * 1024u)
#define RS_CONFIG_MAX_LINE_BYTES   4095u
#define RS_CONFIG_MAX_RULES        4096u
#define RS_CONFIG_MAX_QOS          64u
#define RS_CONFIG_MAX_GLOB_BYTES   255u
#define RS_CONFIG_QOS_NAME_MAX     31u

#define RS_CONFIG_DEFAULT_ZCOPY_THRESHOLD  65536u
#define RS_CONFIG_MIN_ZCOPY_THRESHOLD      1024u
#define RS_CONFIG_MAX_ZCOPY_THRESHOLD      (1024u * 1024u * 1024u)

/* Where a socket's traffic goes: rdma = RDMA or fail, both = try RDMA then fall back to the kernel,
 * kernel = never RDMA. */
enum rs_mode { RS_MODE_KERNEL, RS_MODE_RDMA, RS_MODE_BOTH };
enum rs_proto { RS_PROTO_TCP, RS_PROTO_UDP };
enum rs_role { RS_ROLE_SERVER, RS_ROLE_CLIENT, RS_ROLE_ANY };
/* RS_TRANSPORT_OFF only comes from RDMASOCK_TRANSPORT (rs_parse_transport); rules say `use kernel` instead. */
enum rs_transport { RS_TRANSPORT_AUTO, RS_TRANSPORT_VERBS, RS_TRANSPORT_SOFT, RS_TRANSPORT_OFF };
enum rs_stream_mode { RS_STREAM_AUTO, RS_STREAM_BCOPY, RS_STREAM_ZCOPY };
/* lend_ring=: whether SDP offers its send ring's bytes to the reader by SrcAvail (docs/sdp.md "Lending the send
 * ring"); auto leaves it to the RNIC (on for verbs, off for soft). */
enum rs_lend_ring { RS_LEND_RING_AUTO, RS_LEND_RING_ON, RS_LEND_RING_OFF };
enum rs_dgram_mode { RS_DGRAM_SENDRECV, RS_DGRAM_WRECORD };

struct rs_qos_class {
    char name[RS_CONFIG_QOS_NAME_MAX + 1];
    uint8_t sl;         /* InfiniBand service level 0-15, default 0 */
    uint8_t tclass;     /* GRH traffic class 0-255, default 0 */
    int16_t dscp;       /* 0-63, -1 = unset */
    int16_t priority;   /* SO_PRIORITY 0-7, -1 = unset */
    uint8_t weight;     /* 1-255, default 1; meaningless when strict */
    bool strict;        /* strict priority instead of a weighted share */
};

struct rs_rule {
    enum rs_mode mode;
    enum rs_proto proto;
    enum rs_role role;
    char *program_glob;         /* fnmatch(3) pattern on the program's short name; NULL = any program */
    int family;                 /* AF_UNSPEC for '*', AF_INET, AF_INET6 */
    uint8_t addr[16];           /* network byte order; AF_INET uses addr[0..3]; unused bytes are zero */
    uint8_t prefix_len;         /* 0-32 / 0-128; 0 for AF_UNSPEC */
    uint16_t port_lo, port_hi;  /* inclusive; 0-65535 = any port */
    enum rs_transport transport;
    enum rs_stream_mode stream;
    uint32_t zcopy_threshold;   /* bytes; default RS_CONFIG_DEFAULT_ZCOPY_THRESHOLD */
    bool zcopy_threshold_given; /* written on the rule, even at the default value: asks for zero copy wherever
                                 * the stream layer would otherwise leave it off (the software RNIC) */
    enum rs_lend_ring lend_ring;
    enum rs_dgram_mode dgram;
    int qos_index;              /* index into rs_config.qos, -1 = none */
    unsigned line;              /* line in the source file; 0 for built-in defaults */
    bool is_default;            /* true only for the built-in default rules returned by rs_config_match */
};

struct rs_config {
    struct rs_rule *rules;
    size_t n_rules;
    struct rs_qos_class *qos;
    size_t n_qos;
    char *source;               /* the file name given to the parser */
};

struct rs_config_error {
    char file[256];
    unsigned line, column;      /* 1-based; 0:0 for errors about the file as a whole (open, read, size) */
    char message[256];
};

/* Parses len bytes of buf (need not be NUL-terminated). name is used in error messages and stored as
 * cfg->source (NULL -> "<buffer>"). Returns 0 and a new configuration in *out, or -1 with *out = NULL, errno
 * set (EINVAL syntax, EFBIG too large, ENOMEM) and *err filled when err is not NULL. */
int rs_config_parse_buffer(const char *name, const char *buf, size_t len, struct rs_config **out,
                           struct rs_config_error *err);

/* Reads and parses a regular file. Errors opening or reading it carry the errno text at line 0, column 0. */
int rs_config_load_file(const char *path, struct rs_config **out, struct rs_config_error *err);

void rs_config_free(struct rs_config *cfg);

/* First matching rule of cfg, or the built-in default (is_default = true) when none matches; never NULL.
 * cfg may be NULL (defaults only). program is the short name (a path is reduced to its basename); NULL means
 * unknown and only matches rules without `program`. addr is the local bound address for servers, the peer for
 * clients and UDP senders; NULL (or a family other than AF_INET/AF_INET6) means unknown and only matches rules
 * whose address and port are both wildcards. A query role of RS_ROLE_ANY only matches `any` rules. */
const struct rs_rule *rs_config_match(const struct rs_config *cfg, enum rs_proto proto, enum rs_role role,
                                      const char *program, const struct sockaddr *addr);

/* The rule that applies when the configuration file is broken: every socket stays on the kernel. */
const struct rs_rule *rs_config_kernel_rule(enum rs_proto proto);

/* Writes "file:line:col: message" to buf (always NUL-terminated when len > 0); returns what snprintf returns. */
int rs_config_format_error(const struct rs_config_error *err, char *buf, size_t len);

/* Prints the qos classes, then the rules, in canonical grammar form, one statement per line; the output parses
 * back to an equal configuration (rs_config_equal). Returns 0, or -1 if writing failed. */
int rs_config_dump(const struct rs_config *cfg, FILE *out);

/* Semantic equality: same rules and qos classes in the same order; line numbers and source are ignored. */
bool rs_config_equal(const struct rs_config *a, const struct rs_config *b);

const char *rs_mode_name(enum rs_mode mode);
const char *rs_proto_name(enum rs_proto proto);
const char *rs_role_name(enum rs_role role);
const char *rs_transport_name(enum rs_transport transport);
const char *rs_stream_mode_name(enum rs_stream_mode stream);
const char *rs_dgram_mode_name(enum rs_dgram_mode dgram);

/* For RDMASOCK_TRANSPORT: exactly auto|verbs|soft|off (lower case). Returns 0, or -1 (errno = EINVAL). */
int rs_parse_transport(const char *s, enum rs_transport *out);

#endif /* RS_COMMON_CONFIG_H */
