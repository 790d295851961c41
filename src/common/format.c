/*
 * Async-signal-safe printf subset; see format.h for the supported syntax and
 * why the logger cannot use vsnprintf.
 */
#include "common/format.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

/* Output sink: counts every character the full output would contain while
 * storing only what fits, so the return value matches snprintf. */
struct rs_sink {
    char *buf;
    size_t cap;     /* characters that fit, excluding the NUL */
    size_t length;  /* characters produced so far, stored or not */
};

static void sink_put(struct rs_sink *sink, char c)
{
    if (sink->length < sink->cap)
        sink->buf[sink->length] = c;
    sink->length++;
}

static void sink_put_n(struct rs_sink *sink, const char *text, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sink_put(sink, text[i]);
}

/* Padding can be as wide as INT_MAX: only the part that fits is stored so a
 * silly width costs a counter update, not billions of iterations. */
static void sink_pad(struct rs_sink *sink, char c, size_t n)
{
    size_t room = sink->length < sink->cap ? sink->cap - sink->length : 0;
    size_t stored = n < room ? n : room;
    if (stored > 0)
        memset(sink->buf + sink->length, c, stored);
    sink->length += n;
}

static void sink_finish(struct rs_sink *sink, size_t size)
{
    if (size == 0)
        return;
    if (sink->length <= sink->cap) {
        sink->buf[sink->length] = '\0';
        return;
    }
    sink->buf[sink->cap] = '\0';
    /* Overwrite the tail with the marker; a buffer too small for the whole
     * marker gets as many dots as it has room for. */
    size_t mark_len = sizeof(RS_FORMAT_TRUNC_MARK) - 1;
    if (mark_len > sink->cap)
        mark_len = sink->cap;
    memcpy(sink->buf + sink->cap - mark_len, RS_FORMAT_TRUNC_MARK, mark_len);
}

const char *rs_errno_text(int err, char *scratch, size_t scratch_len)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    /* strerrordesc_np indexes glibc's static message table: no locale
     * lookup, no allocation, unlike strerror/strerror_r for odd values. */
    const char *desc = strerrordesc_np(err);
    if (desc != NULL)
        return desc;
#endif
    struct rs_sink sink = { .buf = scratch, .cap = scratch_len ? scratch_len - 1 : 0 };
    static const char prefix[] = "Unknown error ";
    sink_put_n(&sink, prefix, sizeof(prefix) - 1);
    char digits[16];
    size_t ndigits = 0;
    unsigned int magnitude = err < 0 ? 0u - (unsigned int)err : (unsigned int)err;
    do {
        digits[ndigits++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude != 0);
    if (err < 0)
        sink_put(&sink, '-');
    while (ndigits > 0)
        sink_put(&sink, digits[--ndigits]);
    sink_finish(&sink, scratch_len);
    return scratch;
}

/* One parsed conversion specification. */
struct rs_spec {
    bool left;          /* '-' */
    bool zero;          /* '0' */
    bool plus;          /* '+' */
    bool space;         /* ' ' */
    bool alt;           /* '#' */
    size_t width;
    int precision;      /* -1 when absent */
};

enum rs_length { LEN_NONE, LEN_HH, LEN_H, LEN_L, LEN_LL, LEN_Z, LEN_T, LEN_J };

static void emit_padded_text(struct rs_sink *sink, const struct rs_spec *spec,
                             const char *text, size_t len)
{
    size_t pad = spec->width > len ? spec->width - len : 0;
    if (!spec->left)
        sink_pad(sink, ' ', pad);
    sink_put_n(sink, text, len);
    if (spec->left)
        sink_pad(sink, ' ', pad);
}

static void emit_string(struct rs_sink *sink, const struct rs_spec *spec, const char *text)
{
    if (text == NULL) {
        /* glibc prints "(null)" only when it would not be cut short. */
        text = (spec->precision < 0 || spec->precision >= 6) ? "(null)" : "";
    }
    size_t len = spec->precision < 0 ? strlen(text)
                                     : strnlen(text, (size_t)spec->precision);
    emit_padded_text(sink, spec, text, len);
}

/*
 * Numbers share one layout: [sign or 0x][zeros][digits] padded to the width, where zeros come from the precision
 * or from the '0' flag. digits are least significant first.
 */
static void emit_number_layout(struct rs_sink *sink, const struct rs_spec *spec, const char *prefix,
                               size_t prefix_len, const char *digits, size_t ndigits)
{
    size_t zeros = 0;
    if (spec->precision >= 0 && (size_t)spec->precision > ndigits)
        zeros = (size_t)spec->precision - ndigits;

    size_t body = prefix_len + zeros + ndigits;
    size_t pad = spec->width > body ? spec->width - body : 0;
    if (spec->zero && !spec->left && spec->precision < 0) {
        zeros += pad;
        pad = 0;
    }

    if (!spec->left)
        sink_pad(sink, ' ', pad);
    sink_put_n(sink, prefix, prefix_len);
    sink_pad(sink, '0', zeros);
    while (ndigits > 0)
        sink_put(sink, digits[--ndigits]);
    if (spec->left)
        sink_pad(sink, ' ', pad);
}

/* Integer conversions: digits in the requested base, then the shared layout. */
static void emit_integer(struct rs_sink *sink, const struct rs_spec *spec,
                         uintmax_t magnitude, bool negative, bool signed_conv,
                         unsigned base, bool upper)
{
    const char *digit_chars = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    char digits[sizeof(uintmax_t) * 3 + 1];
    size_t ndigits = 0;

    /* C: a zero value with precision 0 produces no digits. */
    if (!(magnitude == 0 && spec->precision == 0)) {
        do {
            digits[ndigits++] = digit_chars[magnitude % base];
            magnitude /= base;
        } while (magnitude != 0);
    }

    char prefix[2];
    size_t prefix_len = 0;
    if (negative)
        prefix[prefix_len++] = '-';
    else if (signed_conv && spec->plus)
        prefix[prefix_len++] = '+';
    else if (signed_conv && spec->space)
        prefix[prefix_len++] = ' ';
    else if (base == 16 && spec->alt && ndigits > 0 &&
             !(ndigits == 1 && digits[0] == '0')) {
        prefix[prefix_len++] = '0';
        prefix[prefix_len++] = upper ? 'X' : 'x';
    }

    emit_number_layout(sink, spec, prefix, prefix_len, digits, ndigits);
}

/* %p of a non-NULL pointer: glibc treats it as %#lx but still honours the
 * sign flags, so it needs its own prefix handling. */
static void emit_pointer(struct rs_sink *sink, const struct rs_spec *spec, const void *ptr)
{
    if (ptr == NULL) {
        struct rs_spec text_spec = *spec;
        text_spec.precision = -1;
        emit_padded_text(sink, &text_spec, "(nil)", 5);
        return;
    }
    uintptr_t value = (uintptr_t)ptr;
    char digits[sizeof(uintptr_t) * 2];
    size_t ndigits = 0;
    do {
        digits[ndigits++] = "0123456789abcdef"[value & 0xf];
        value >>= 4;
    } while (value != 0);

    char prefix[3];
    size_t prefix_len = 0;
    if (spec->plus)
        prefix[prefix_len++] = '+';
    else if (spec->space)
        prefix[prefix_len++] = ' ';
    prefix[prefix_len++] = '0';
    prefix[prefix_len++] = 'x';

    emit_number_layout(sink, spec, prefix, prefix_len, digits, ndigits);
}

/* Width/precision digits; saturate instead of overflowing on absurd input. */
static size_t parse_decimal(const char **cursor)
{
    size_t value = 0;
    const char *p = *cursor;
    while (*p >= '0' && *p <= '9') {
        if (value < (size_t)INT_MAX)
            value = value * 10 + (size_t)(*p - '0');
        p++;
    }
    *cursor = p;
    return value > (size_t)INT_MAX ? (size_t)INT_MAX : value;
}

static intmax_t fetch_signed(va_list *ap, enum rs_length length)
{
    switch (length) {
    case LEN_HH: return (signed char)va_arg(*ap, int);
    case LEN_H:  return (short)va_arg(*ap, int);
    case LEN_L:  return va_arg(*ap, long);
    case LEN_LL: return va_arg(*ap, long long);
    case LEN_Z:  return va_arg(*ap, ssize_t);
    case LEN_T:  return va_arg(*ap, ptrdiff_t);
    case LEN_J:  return va_arg(*ap, intmax_t);
    case LEN_NONE: break;
    }
    return va_arg(*ap, int);
}

static uintmax_t fetch_unsigned(va_list *ap, enum rs_length length)
{
    switch (length) {
    case LEN_HH: return (unsigned char)va_arg(*ap, unsigned int);
    case LEN_H:  return (unsigned short)va_arg(*ap, unsigned int);
    case LEN_L:  return va_arg(*ap, unsigned long);
    case LEN_LL: return va_arg(*ap, unsigned long long);
    case LEN_Z:  return va_arg(*ap, size_t);
    /* The unsigned type corresponding to ptrdiff_t has the width of size_t
     * on every ABI we build for. */
    case LEN_T:  return va_arg(*ap, size_t);
    case LEN_J:  return va_arg(*ap, uintmax_t);
    case LEN_NONE: break;
    }
    return va_arg(*ap, unsigned int);
}

static enum rs_length parse_length(const char **cursor)
{
    const char *p = *cursor;
    enum rs_length length = LEN_NONE;
    switch (*p) {
    case 'h':
        if (p[1] == 'h') { length = LEN_HH; p += 2; }
        else { length = LEN_H; p++; }
        break;
    case 'l':
        if (p[1] == 'l') { length = LEN_LL; p += 2; }
        else { length = LEN_L; p++; }
        break;
    case 'z': length = LEN_Z; p++; break;
    case 't': length = LEN_T; p++; break;
    case 'j': length = LEN_J; p++; break;
    default: break;
    }
    *cursor = p;
    return length;
}

int rs_vformat_errno(char *buf, size_t size, int saved_errno, const char *fmt, va_list ap_in)
{
    struct rs_sink sink = { .buf = buf, .cap = size ? size - 1 : 0, .length = 0 };
    va_list ap;
    va_copy(ap, ap_in);

    const char *p = fmt ? fmt : "(null format)";
    while (*p != '\0') {
        if (*p != '%') {
            sink_put(&sink, *p++);
            continue;
        }
        const char *spec_start = p++;
        struct rs_spec spec = { .precision = -1 };

        for (;; p++) {
            if (*p == '-') spec.left = true;
            else if (*p == '0') spec.zero = true;
            else if (*p == '+') spec.plus = true;
            else if (*p == ' ') spec.space = true;
            else if (*p == '#') spec.alt = true;
            else break;
        }
        if (*p == '*') {
            int width = va_arg(ap, int);
            p++;
            if (width < 0) {
                /* C: a negative '*' width means '-' with its magnitude. */
                spec.left = true;
                spec.width = width == INT_MIN ? (size_t)INT_MAX + 1 : (size_t)-width;
            } else {
                spec.width = (size_t)width;
            }
        } else {
            spec.width = parse_decimal(&p);
        }
        if (*p == '.') {
            p++;
            if (*p == '*') {
                int precision = va_arg(ap, int);
                p++;
                spec.precision = precision < 0 ? -1 : precision;
            } else {
                spec.precision = (int)parse_decimal(&p);
            }
        }
        enum rs_length length = parse_length(&p);

        switch (*p) {
        case 'd':
        case 'i': {
            intmax_t value = fetch_signed(&ap, length);
            uintmax_t magnitude = value < 0 ? (uintmax_t)0 - (uintmax_t)value : (uintmax_t)value;
            emit_integer(&sink, &spec, magnitude, value < 0, true, 10, false);
            break;
        }
        case 'u':
            emit_integer(&sink, &spec, fetch_unsigned(&ap, length), false, false, 10, false);
            break;
        case 'x':
        case 'X':
            emit_integer(&sink, &spec, fetch_unsigned(&ap, length), false, false, 16, *p == 'X');
            break;
        case 'p':
            emit_pointer(&sink, &spec, va_arg(ap, void *));
            break;
        case 's':
            emit_string(&sink, &spec, va_arg(ap, const char *));
            break;
        case 'c': {
            char c = (char)va_arg(ap, int);
            emit_padded_text(&sink, &spec, &c, 1);
            break;
        }
        case 'm': {
            char scratch[32];
            emit_string(&sink, &spec, rs_errno_text(saved_errno, scratch, sizeof(scratch)));
            break;
        }
        case '%':
            sink_put(&sink, '%');
            break;
        case '\0':
            /* A format that ends inside a specification: show what was there
             * rather than silently dropping it. */
            sink_put_n(&sink, spec_start, (size_t)(p - spec_start));
            continue;
        default:
            /* Unsupported conversion: copy it so the problem is visible in
             * the log instead of consuming an argument of unknown type. */
            sink_put_n(&sink, spec_start, (size_t)(p - spec_start) + 1);
            break;
        }
        p++;
    }
    va_end(ap);
    sink_finish(&sink, size);
    return sink.length > (size_t)INT_MAX ? INT_MAX : (int)sink.length;
}

int rs_vformat(char *buf, size_t size, const char *fmt, va_list ap)
{
    return rs_vformat_errno(buf, size, errno, fmt, ap);
}

int rs_format(char *buf, size_t size, const char *fmt, ...)
{
    int saved_errno = errno;
    va_list ap;
    va_start(ap, fmt);
    int length = rs_vformat_errno(buf, size, saved_errno, fmt, ap);
    va_end(ap);
    return length;
}
