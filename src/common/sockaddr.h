/*
 * Socket-address helpers shared by the layers (the soft RNIC's datagram paths, its fork handling, SDP's prefork
 * family table): one definition of "the same IPv4/IPv6 address and port".
 */
#ifndef RS_COMMON_SOCKADDR_H
#define RS_COMMON_SOCKADDR_H

#include <stdbool.h>
#include <sys/socket.h>

/* Same family, address and port (AF_INET and AF_INET6 only; anything else is never equal). */
bool rs_sockaddr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b);

#endif
