/*
 * test_intercept_fdtable: the fd table of src/intercept/fdtable.c, in particular rs_fd_maybe, the lock-free test
 * every interposed data call makes before it looks an fd up. It must never say "certainly not" for an fd that has
 * an entry of the type asked for (the call would go to the kernel behind the converted socket's back), and it must
 * say so for rdmasock's own fds (a verbs device's command fd takes a write(2) per doorbell) and for empty slots.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>

#include <cmocka.h>

#include "intercept/fdtable.h"

static int destroyed;

static void count_destroy(struct rs_fd_obj *obj)
{
    (void)obj;
    destroyed++;
}

/* Fds far above what the test binary has open, in two different pages of the table. */
enum { FD_SOCK = 5000, FD_INTERNAL = 5001, FD_EMPTY = 5002, FD_OTHER_PAGE = 3 * RS_FDTABLE_PAGE + 7 };

static void test_maybe_tells_entries_apart(void **state)
{
    (void)state;
    struct rs_fd_obj sock;
    rs_fd_obj_init(&sock, RS_FD_SOCK, count_destroy);
    assert_false(rs_fd_maybe(FD_SOCK, RS_FD_SOCK));

    assert_null(rs_fd_set(FD_SOCK, &sock, NULL));
    rs_fd_mark_internal(FD_INTERNAL);

    /* The socket entry: maybe, and the typed lookup finds it; another type does not. */
    assert_true(rs_fd_maybe(FD_SOCK, RS_FD_SOCK));
    struct rs_fd_obj *got = rs_fd_get_type(FD_SOCK, RS_FD_SOCK);
    assert_ptr_equal(got, &sock);
    rs_fd_obj_put(got);
    assert_null(rs_fd_get_type(FD_SOCK, RS_FD_INTERNAL));

    /* rdmasock's own fd: certainly not a socket, certainly internal. */
    assert_false(rs_fd_maybe(FD_INTERNAL, RS_FD_SOCK));
    assert_null(rs_fd_get_type(FD_INTERNAL, RS_FD_SOCK));
    assert_true(rs_fd_maybe(FD_INTERNAL, RS_FD_INTERNAL));
    assert_true(rs_fd_is_internal(FD_INTERNAL));

    /* Empty slots, a page never allocated, and fds out of range. */
    assert_false(rs_fd_maybe(FD_EMPTY, RS_FD_SOCK));
    assert_false(rs_fd_maybe(FD_OTHER_PAGE, RS_FD_SOCK));
    assert_false(rs_fd_maybe(-1, RS_FD_SOCK));
    assert_false(rs_fd_maybe(RS_FDTABLE_TOP * RS_FDTABLE_PAGE, RS_FD_SOCK));

    /* Cleared entries are gone at once; the table's reference goes back to the caller. */
    struct rs_fd_obj *old = rs_fd_clear(FD_SOCK);
    assert_ptr_equal(old, &sock);
    assert_false(rs_fd_maybe(FD_SOCK, RS_FD_SOCK));
    rs_fd_obj_put(old);
    assert_int_equal(destroyed, 0);     /* our own reference is still there */
    rs_fd_obj_put(&sock);
    assert_int_equal(destroyed, 1);

    rs_fd_unmark_internal(FD_INTERNAL);
    assert_false(rs_fd_maybe(FD_INTERNAL, RS_FD_INTERNAL));
    assert_false(rs_fd_is_internal(FD_INTERNAL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maybe_tells_entries_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
