/*
 * Differential fuzzer for the async-signal-safe formatter: the input bytes
 * are turned into a format string made only of specifications whose
 * behaviour C (or glibc, for %p/%m/NULL %s) defines, plus literal text, and
 * the output of rs_format is compared with glibc's snprintf. Then the same
 * format is rendered into small buffers to check truncation: the same
 * return value, a NUL-terminated prefix of the full output, and the "..."
 * marker at the end.
 *
 * All arguments are passed as 64-bit slots. On x86-64 every integer and
 * pointer vararg occupies one 8-byte slot and va_arg(int) reads its low
 * half, so both implementations see identical values; the harness is
 * therefore meant for x86-64, where it is built.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/format.h"

enum { MAX_ARGS = 12, MAX_STRINGS = 4, FORMAT_MAX = 600, OUTPUT_MAX = 16384 };

struct input {
    const uint8_t *data;
    size_t size;
};

static uint8_t take_byte(struct input *in)
{
    if (in->size == 0)
        return 0;
    in->size--;
    return *in->data++;
}

static uint64_t take_u64(struct input *in)
{
    uint64_t value = 0;
    for (int i = 0; i < 8; i++)
        value = (value << 8) | take_byte(in);
    return value;
}

struct builder {
    char format[FORMAT_MAX + 64];
    size_t length;
    uint64_t args[MAX_ARGS];
    int nargs;
    char strings[MAX_STRINGS][48];
    int nstrings;
};

static void append_char(struct builder *b, char c)
{
    b->format[b->length++] = c;
}

static void append_number(struct builder *b, unsigned value)
{
    char digits[12];
    int n = 0;
    do {
        digits[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    while (n > 0)
        append_char(b, digits[--n]);
}

/* Small signed values, mostly positive, for '*' widths and precisions. */
static int take_star_value(struct input *in)
{
    uint8_t byte = take_byte(in);
    return (byte & 0x80) ? -(int)(byte & 0x1f) : (int)(byte & 0x7f) * 2;
}

static void add_spec(struct builder *b, struct input *in)
{
    static const char conversions[] = "diuxXscpm%";
    char conversion = conversions[take_byte(in) % (sizeof(conversions) - 1)];
    bool integer = strchr("diuxX", conversion) != NULL;
    bool is_signed = conversion == 'd' || conversion == 'i';

    uint8_t flag_bits = take_byte(in);
    append_char(b, '%');
    if (conversion == '%') {
        append_char(b, '%'); /* flags and width on %% are undefined */
        return;
    }
    if (flag_bits & 0x01)
        append_char(b, '-');
    if ((flag_bits & 0x02) && (integer || conversion == 'p'))
        append_char(b, '0');
    if ((flag_bits & 0x04) && (is_signed || conversion == 'p'))
        append_char(b, '+');
    if ((flag_bits & 0x08) && (is_signed || conversion == 'p'))
        append_char(b, ' ');
    if ((flag_bits & 0x10) && (conversion == 'x' || conversion == 'X'))
        append_char(b, '#');

    uint8_t shape = take_byte(in);
    switch (shape & 0x3) {
    case 1:
        append_number(b, take_byte(in) % 200);
        break;
    case 2:
        append_char(b, '*');
        b->args[b->nargs++] = (uint64_t)(int64_t)take_star_value(in);
        break;
    default:
        break;
    }
    /* C leaves precision undefined for %c; glibc ignores it for (nil). */
    bool precision_ok = conversion != 'c' && conversion != 'p';
    switch (precision_ok ? (shape >> 2) & 0x3 : 0) {
    case 1:
        append_char(b, '.');
        append_number(b, take_byte(in) % 200);
        break;
    case 2:
        append_char(b, '.');
        append_char(b, '*');
        b->args[b->nargs++] = (uint64_t)(int64_t)take_star_value(in);
        break;
    case 3:
        append_char(b, '.');
        break;
    default:
        break;
    }

    if (integer) {
        static const char *const lengths[] = { "", "hh", "h", "l", "ll", "z", "t", "j" };
        const char *length = lengths[(shape >> 4) & 0x7];
        while (*length)
            append_char(b, *length++);
    }
    append_char(b, conversion);

    switch (conversion) {
    case 's': {
        uint8_t len = take_byte(in);
        if (len == 0xff || b->nstrings == MAX_STRINGS) {
            b->args[b->nargs++] = 0; /* NULL */
            break;
        }
        char *text = b->strings[b->nstrings++];
        size_t n = len % (sizeof(b->strings[0]) - 1);
        for (size_t i = 0; i < n; i++)
            text[i] = (char)(take_byte(in) | 1); /* never NUL, any other byte */
        text[n] = '\0';
        b->args[b->nargs++] = (uint64_t)(uintptr_t)text;
        break;
    }
    case 'm':
        break; /* consumes no argument */
    case 'c':
        b->args[b->nargs++] = take_byte(in);
        break;
    default:
        b->args[b->nargs++] = take_u64(in);
        break;
    }
}

static void add_literal(struct builder *b, struct input *in, uint8_t op)
{
    size_t n = (size_t)(op % 8) + 1;
    for (size_t i = 0; i < n && b->length < FORMAT_MAX; i++) {
        char c = (char)(32 + take_byte(in) % 95);
        append_char(b, c == '%' ? '@' : c);
    }
}

#define ARGS(a) a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]

#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#pragma GCC diagnostic ignored "-Wformat-security"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char expected[OUTPUT_MAX], actual[OUTPUT_MAX], small[64];
    struct input in = { data, size };
    struct builder b;
    memset(&b, 0, sizeof(b));

    uint8_t errno_high = take_byte(&in);
    int saved_errno = (int)(int16_t)(errno_high << 8 | take_byte(&in));
    while (in.size > 0 && b.length < FORMAT_MAX && b.nargs <= MAX_ARGS - 3) {
        uint8_t op = take_byte(&in);
        if (op < 96)
            add_literal(&b, &in, op);
        else
            add_spec(&b, &in);
    }
    b.format[b.length] = '\0';

    errno = saved_errno;
    int expected_len = snprintf(expected, sizeof(expected), b.format, ARGS(b.args));
    errno = saved_errno;
    int actual_len = rs_format(actual, sizeof(actual), b.format, ARGS(b.args));
    if (expected_len < 0 || (size_t)expected_len >= sizeof(expected))
        return 0; /* beyond what this harness compares */
    if (actual_len != expected_len || memcmp(actual, expected, (size_t)expected_len + 1) != 0) {
        fprintf(stderr, "format mismatch for \"%s\" (errno %d)\n snprintf: %d [%s]\n rs_format: %d [%s]\n",
                b.format, saved_errno, expected_len, expected, actual_len, actual);
        abort();
    }

    /* Truncated renderings: sizes around the interesting boundaries. */
    size_t sizes[] = { 0, 1, 2, 3, 4, 5, 17, (size_t)expected_len, (size_t)expected_len + 1 };
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t cap = sizes[k];
        if (cap >= sizeof(small))
            continue;
        memset(small, 'Z', sizeof(small));
        errno = saved_errno;
        int len = rs_format(small, cap, b.format, ARGS(b.args));
        if (len != expected_len)
            abort();
        if (cap == 0) {
            if (small[0] != 'Z')
                abort();
            continue;
        }
        if ((size_t)expected_len < cap) {
            if (memcmp(small, expected, (size_t)expected_len + 1) != 0)
                abort();
            continue;
        }
        size_t kept = cap - 1;
        size_t marker = kept < 3 ? kept : 3;
        if (small[kept] != '\0' || memcmp(small, expected, kept - marker) != 0 ||
            memcmp(small + kept - marker, "...", marker) != 0 || small[cap] != 'Z')
            abort();
    }
    return 0;
}
