/*
 * A small printf-style formatter that is safe to call from a signal handler
 * and from inside malloc: it never allocates, never takes a lock and never
 * consults the locale.  The logger uses it because vsnprintf may allocate
 * (e.g. for %m on an unknown errno, or when glibc's printf machinery needs a
 * work buffer), which would deadlock if the logger runs inside malloc.
 *
 * Supported, with the same output as glibc's snprintf for every combination
 * that C defines:
 *   conversions  %s %c %d %i %u %x %X %p %% and %m (text of the saved errno)
 *   length       hh h l ll z t j
 *   flags        '-' '0' '+' ' ' '#'   ('#' only changes %x/%X: 0x prefix)
 *   width and precision, either as digits or '*' taken from the arguments
 * glibc quirks that are mirrored: %p of NULL prints "(nil)", %s of NULL
 * prints "(null)" (or nothing when the precision is below 6), %p of a
 * non-NULL pointer behaves like %#lx (and honours '+', ' ', '0', precision).
 *
 * Not supported (copied verbatim to the output instead, without consuming an
 * argument beyond any '*'): floating point, %o, %n, wide %lc/%ls, positional
 * arguments (%1$d). The RS_PRINTF attribute on callers cannot flag these, so
 * keep log formats within the list above.
 *
 * %m prints the untranslated glibc description of the errno (C-locale text,
 * "Unknown error N" for numbers glibc does not know) from a static table.
 *
 * Truncation: output that does not fit is cut and its last three characters
 * are replaced by "..." so a reader sees that something is missing; the
 * buffer is always NUL-terminated when size > 0.
 */
#ifndef RS_COMMON_FORMAT_H
#define RS_COMMON_FORMAT_H

#include <stdarg.h>
#include <stddef.h>

#include "common/compiler.h"

/* Marker written over the tail of a truncated output. */
#define RS_FORMAT_TRUNC_MARK "..."

/*
 * Returns the length the complete output would have had (not counting the
 * NUL), like snprintf; a return value >= size means the output was
 * truncated.  Lengths beyond INT_MAX are reported as INT_MAX.
 * %m uses the errno value current when the call starts.
 */
int rs_format(char *buf, size_t size, const char *fmt, ...) RS_PRINTF(3, 4);
int rs_vformat(char *buf, size_t size, const char *fmt, va_list ap);

/* Same, but %m prints saved_errno: for callers (the logger) that had to
 * capture errno before doing work that may change it. */
int rs_vformat_errno(char *buf, size_t size, int saved_errno,
                     const char *fmt, va_list ap);

/*
 * Description of an errno value without allocating: a pointer into a static
 * table for known values, otherwise "Unknown error N" rendered into scratch
 * (which must hold at least 32 bytes).  Never returns NULL.
 */
const char *rs_errno_text(int err, char *scratch, size_t scratch_len);

#endif /* RS_COMMON_FORMAT_H */
