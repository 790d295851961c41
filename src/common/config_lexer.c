/* Line splitting, byte validation and tokenisation for rdmasock.conf.
 *
 * Validation happens per line before any token is looked at, so the grammar code can assume printable text.
 * Bytes >= 0x80 must form well-formed UTF-8 (comments in any language are fine) while stray high bytes, NULs
 * and control characters are reported as binary data: a binary file given as the configuration must fail
 * loudly at its first odd byte instead of producing a confusing grammar error later. */
#include "common/config_lexer.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void rs_cfg_set_error(struct rs_config_error *err, unsigned line, unsigned column, const char *fmt, ...)
{
    va_list ap;

    err->line = line;
    err->column = column;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

void rs_cfg_reader_init(struct rs_cfg_reader *reader, const char *buf, size_t len)
{
    reader->buf = buf;
    reader->len = len;
    reader->pos = 0;
    reader->line_no = 0;
    /* Some editors put a UTF-8 byte order mark in front of text files; it carries no meaning here. */
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
        reader->pos = 3;
}

/* Length of the well-formed UTF-8 sequence at s (lead byte >= 0x80), or 0 if it is malformed, truncated,
 * overlong, a surrogate, beyond U+10FFFF, or a C1 control character (U+0080..U+009F). */
static size_t utf8_sequence_length(const unsigned char *s, size_t avail)
{
    unsigned char lead = s[0];
    unsigned char second_lo = 0x80, second_hi = 0xBF;
    size_t continuation;

    if (lead >= 0xC2 && lead <= 0xDF) {
        continuation = 1;
        if (lead == 0xC2)
            second_lo = 0xA0;
    } else if (lead == 0xE0) {
        continuation = 2;
        second_lo = 0xA0;
    } else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) {
        continuation = 2;
    } else if (lead == 0xED) {
        continuation = 2;
        second_hi = 0x9F;
    } else if (lead == 0xF0) {
        continuation = 3;
        second_lo = 0x90;
    } else if (lead >= 0xF1 && lead <= 0xF3) {
        continuation = 3;
    } else if (lead == 0xF4) {
        continuation = 3;
        second_hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < continuation + 1)
        return 0;
    if (s[1] < second_lo || s[1] > second_hi)
        return 0;
    for (size_t i = 2; i <= continuation; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    }
    return continuation + 1;
}

int rs_cfg_reader_next(struct rs_cfg_reader *reader, struct rs_cfg_line *line, struct rs_config_error *err)
{
    if (reader->pos >= reader->len)
        return 0;

    const char *start = reader->buf + reader->pos;
    size_t remaining = reader->len - reader->pos;
    const char *newline = memchr(start, '\n', remaining);
    size_t raw_len = newline ? (size_t)(newline - start) : remaining;

    reader->pos += raw_len + (newline ? 1 : 0);
    reader->line_no++;

    size_t len = raw_len;
    if (len > 0 && start[len - 1] == '\r')
        len--;
    line->text = start;
    line->len = len;
    line->number = reader->line_no;

    const unsigned char *bytes = (const unsigned char *)start;
    size_t limit = len < RS_CONFIG_MAX_LINE_BYTES ? len : RS_CONFIG_MAX_LINE_BYTES;
    size_t i = 0;
    while (i < limit) {
        unsigned char c = bytes[i];
        if (c == '\t' || (c >= 0x20 && c < 0x7F)) {
            i++;
            continue;
        }
        size_t seq = c >= 0x80 ? utf8_sequence_length(bytes + i, len - i) : 0;
        if (seq == 0) {
            rs_cfg_set_error(err, line->number, (unsigned)i + 1, "binary data: unexpected byte 0x%02x", c);
            return -1;
        }
        i += seq;
    }
    if (len > RS_CONFIG_MAX_LINE_BYTES) {
        rs_cfg_set_error(err, line->number, RS_CONFIG_MAX_LINE_BYTES + 1, "line too long (max %u bytes)",
                         RS_CONFIG_MAX_LINE_BYTES);
        return -1;
    }
    return 1;
}

void rs_cfg_lexer_init(struct rs_cfg_lexer *lexer, const struct rs_cfg_line *line)
{
    lexer->text = line->text;
    lexer->len = line->len;
    lexer->pos = 0;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

bool rs_cfg_next_token(struct rs_cfg_lexer *lexer, struct rs_cfg_token *tok)
{
    while (lexer->pos < lexer->len && is_blank(lexer->text[lexer->pos]))
        lexer->pos++;

    tok->text = lexer->text + lexer->pos;
    tok->len = 0;
    tok->column = (unsigned)lexer->pos + 1;
    if (lexer->pos >= lexer->len || lexer->text[lexer->pos] == '#')
        return false;

    size_t start = lexer->pos;
    while (lexer->pos < lexer->len && !is_blank(lexer->text[lexer->pos]) && lexer->text[lexer->pos] != '#')
        lexer->pos++;
    tok->len = lexer->pos - start;
    return true;
}

bool rs_cfg_token_is(const struct rs_cfg_token *tok, const char *word)
{
    size_t word_len = strlen(word);
    return tok->len == word_len && memcmp(tok->text, word, word_len) == 0;
}

const char *rs_cfg_describe_text(const char *text, size_t len, char *buf, size_t size)
{
    /* Long enough for any address or option, short enough that the message keeps its explanation. */
    const size_t max_shown = 48;
    size_t shown = len;
    bool cut = false;

    if (len == 0) {
        snprintf(buf, size, "nothing");
        return buf;
    }
    if (shown > max_shown) {
        shown = max_shown;
        /* Never cut a UTF-8 sequence in half: the message must stay valid text. */
        while (shown > 0 && ((unsigned char)text[shown] & 0xC0) == 0x80)
            shown--;
        cut = true;
    }
    snprintf(buf, size, "'%.*s%s'", (int)shown, text, cut ? "..." : "");
    return buf;
}

const char *rs_cfg_describe(const struct rs_cfg_token *tok, char *buf, size_t size)
{
    if (tok->len == 0) {
        snprintf(buf, size, "end of line");
        return buf;
    }
    return rs_cfg_describe_text(tok->text, tok->len, buf, size);
}

enum rs_cfg_num rs_cfg_parse_uint(const char *text, size_t len, uint64_t max, uint64_t *out)
{
    uint64_t value = 0;
    bool too_big = false;

    if (len == 0)
        return RS_CFG_NUM_INVALID;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return RS_CFG_NUM_INVALID;
        /* Stop accumulating once past max (max is far below UINT64_MAX / 10), but keep checking digits so
         * "99999999999x" is reported as not-a-number rather than out of range. */
        if (!too_big) {
            value = value * 10 + (uint64_t)(text[i] - '0');
            if (value > max)
                too_big = true;
        }
    }
    if (too_big)
        return RS_CFG_NUM_RANGE;
    *out = value;
    return RS_CFG_NUM_OK;
}
