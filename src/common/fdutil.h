/*
 * fdutil.h: keeping rdmasock's own file descriptors out of the application's way.
 *
 * Every converted socket brings fds of rdmasock's (a notification eventfd, a completion queue's eventfd, the
 * software RNIC's TCP socket...). Left where the kernel puts them, the lowest free numbers, they push the
 * application's own fds up, and programs that size tables by their expected fd numbers break (wrk refuses a
 * socket above 10 + 3 x connections; select() users stop at FD_SETSIZE). rs_fd_move_high moves such an fd above
 * the range programs use: to the lowest free number at or above half the soft RLIMIT_NOFILE (at most 1024), keeping
 * close-on-exec. When that fails (the limit is tiny or reached) the fd stays where it was.
 */
#ifndef RS_COMMON_FDUTIL_H
#define RS_COMMON_FDUTIL_H

/* Returns the fd to use from now on (fd itself when it could not move; a negative fd is returned unchanged). */
int rs_fd_move_high(int fd);

#endif /* RS_COMMON_FDUTIL_H */
