/* Compiler helpers shared by every rdmasock module. */
#ifndef RS_COMMON_COMPILER_H
#define RS_COMMON_COMPILER_H

/* The library is built with -fvisibility=hidden so that only the intercepted
 * libc entry points and the documented API leak into the host program's
 * symbol namespace; everything meant to be callable from outside says so. */
#define RS_EXPORT __attribute__((visibility("default")))

/* Branch hints for hot paths (e.g. the log-level check that must cost one
 * predictable branch when logging is off). */
#define RS_LIKELY(x)   __builtin_expect(!!(x), 1)
#define RS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Lets the compiler check our own printf-like functions' arguments. Our
 * formatter implements a subset of printf, so this is a checking aid: the
 * conversions outside the subset are documented in common/format.h. */
#define RS_PRINTF(fmt_index, first_arg) \
    __attribute__((format(printf, fmt_index, first_arg)))

/* Element count of a real array; fails to compile when given a pointer. */
#define RS_ARRAY_SIZE(arr) \
    (sizeof(arr) / sizeof((arr)[0]) + \
     0 * sizeof(struct { int rs_not_an_array_ : \
         !__builtin_types_compatible_p(__typeof__(arr), __typeof__(&(arr)[0])); }))

#define RS_UNUSED __attribute__((unused))

/* Keeps a rarely run part out of line, so that the hot function around it stays small enough to be inlined where
 * it is called (under an emulated CPU every call and return on a hot path costs; docs/results/sdp-verbs.md). */
#define RS_NOINLINE __attribute__((noinline))

/* Inlined whatever the compiler's size heuristics say: a hot path's small step. Under TCG a call and its return
 * cost about 30 ns (the return is an indirect jump, looked up at run time), as much as 30 instructions. */
#define RS_ALWAYS_INLINE inline __attribute__((always_inline))

#endif /* RS_COMMON_COMPILER_H */
