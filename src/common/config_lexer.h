/* Private to the config module: splits a configuration buffer into validated lines and lines into tokens.
 * Nothing here allocates; tokens point into the caller's buffer. */
#ifndef RS_COMMON_CONFIG_LEXER_H
#define RS_COMMON_CONFIG_LEXER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

struct rs_cfg_reader {
    const char *buf;
    size_t len;
    size_t pos;
    unsigned line_no;
};

/* One physical line without its LF (and without the CR of a CRLF); comments are still included. */
struct rs_cfg_line {
    const char *text;
    size_t len;
    unsigned number;
};

struct rs_cfg_lexer {
    const char *text;
    size_t len;
    size_t pos;
};

struct rs_cfg_token {
    const char *text;
    size_t len;
    unsigned column;    /* 1-based byte column of the first byte */
};

enum rs_cfg_num { RS_CFG_NUM_OK, RS_CFG_NUM_INVALID, RS_CFG_NUM_RANGE };

/* Records an error position and message (the file name is filled in by the caller at the top level). */
void rs_cfg_set_error(struct rs_config_error *err, unsigned line, unsigned column, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void rs_cfg_reader_init(struct rs_cfg_reader *reader, const char *buf, size_t len);

/* Returns 1 with the next line, 0 at the end of input, or -1 with err filled when the line is too long or
 * holds bytes that cannot be configuration text (control characters, invalid UTF-8). */
int rs_cfg_reader_next(struct rs_cfg_reader *reader, struct rs_cfg_line *line, struct rs_config_error *err);

void rs_cfg_lexer_init(struct rs_cfg_lexer *lexer, const struct rs_cfg_line *line);

/* Returns false at the end of the line or at a comment; *tok then holds an empty token whose column is where
 * the missing token was expected, so "found end of line" errors point somewhere sensible. */
bool rs_cfg_next_token(struct rs_cfg_lexer *lexer, struct rs_cfg_token *tok);

bool rs_cfg_token_is(const struct rs_cfg_token *tok, const char *word);

/* Write text quoted for an error message ('text', shortened with "..." when long). An empty token reads
 * "end of line", an empty piece of a token (the port after "10.0.0.1:") reads "nothing". */
const char *rs_cfg_describe(const struct rs_cfg_token *tok, char *buf, size_t size);
const char *rs_cfg_describe_text(const char *text, size_t len, char *buf, size_t size);

/* Strict unsigned decimal: digits only, no sign or spaces; values above max give RS_CFG_NUM_RANGE. */
enum rs_cfg_num rs_cfg_parse_uint(const char *text, size_t len, uint64_t max, uint64_t *out);

#endif /* RS_COMMON_CONFIG_LEXER_H */
