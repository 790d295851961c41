/*
 * handover.h: an SDP connection that crosses into another process (fork) continues there as kernel TCP
 * (docs/interception.md, "Processes").
 *
 * An RDMA connection belongs to the process whose RNIC state carries it (its *owner*). After fork, every process
 * that inherited the fd (a *holder*) has a copy of the application's fd but no RDMA state. Nothing happens until a
 * holder needs the connection: its first call that uses it *claims* it from the owner, which hands the connection
 * back to kernel TCP (rs_sdp_handback: the stream continues on a kernel socket, no byte lost) and passes that socket
 * over an AF_UNIX socket (SCM_RIGHTS). From then on both share one kernel TCP socket, as they would have without
 * rdmasock. A holder that never uses it (redis's BGSAVE child) costs nothing: the connection stays on RDMA.
 *
 * Records. Just before a fork, every connected SDP connection the process owns gets a record in an arena shared by
 * the whole process family (MAP_SHARED anonymous, made once, inherited by every descendant): owner pid, a random
 * token, a state, and the pids of the holders that have not claimed yet. The forking process enters its child as a
 * holder before fork() returns (rs_ho_fork_returned), and the child enters itself too (for forks no interposer
 * sees); a holder leaves at its last close of the connection, at a claim, or when it dies (the owner checks about
 * once a second with kill(pid, 0)). Everything in the arena is atomics: a process may die anywhere.
 *
 * The owner's server. An abstract AF_UNIX SOCK_SEQPACKET socket "\0rdmasock-handover-<owner pid>" (created at the
 * first fork that makes a record), served by one thread of the owner (started after the fork in the parent), which
 * runs the hand-backs themselves on up to 8 worker threads (one can take a while; others need not wait for it).
 * It answers claims, and does what the owner must do when its application closes a connection that holders still
 * have: the close must not end the connection (the kernel keeps a socket while any process holds it), so the
 * connection is handed back there and the kernel socket *parked* (an rdmasock fd) until no holder is left.
 *
 * Claims carry {slot, token}; the server also checks that the claiming pid is a recorded holder (SO_PEERCRED), so
 * only processes that inherited the connection can take it. Every wait is bounded (RS_HO_*_MS).
 */
#ifndef RS_INTERCEPT_HANDOVER_H
#define RS_INTERCEPT_HANDOVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct rs_isock;

#define RS_HO_HANDBACK_MS 10000         /* one hand-back (the peer must answer within this) */
#define RS_HO_CLAIM_MS 30000            /* a claim: the owner may first finish another claim's hand-back */
#define RS_HO_CONNECT_MS 2000           /* reaching the owner's server */
#define RS_HO_TICK_MS 1000              /* the owner's server looks for dead holders this often */
#define RS_HO_GRACE_MS 3000             /* a fork no interposer saw: its child has this long to enter itself */

/* ---- fork (proc.c -> isock.c), with the isock's lock held where noted ---- */

/* Prepare, first: a new fork starts (the forking thread's list of records for its child). */
void rs_ho_fork_prepare_begin(void);
/* Prepare, owner, s->lock held: s (a connected SDP connection of this process) gets a record if it has none, and
 * the new child will be entered as its holder. false when there is no room (the child then cannot use it). */
bool rs_ho_prepare_owned(struct rs_isock *s);
/* Prepare, holder, s->lock held: the new child will be entered as a holder of s's record too. */
void rs_ho_prepare_held(struct rs_isock *s);
/* Parent, in fork() after the real fork returned the child's pid: enters it in the records of this fork. */
void rs_ho_fork_returned(pid_t child);
/* Parent handler: starts the server thread when this process owns records. */
void rs_ho_fork_parent(void);
/* Child handler, before the isock visit: forgets the parent's server and parked fds (they are the parent's). */
void rs_ho_fork_child(void);
/* Child handler, per inherited connection with a record: enters this process as a holder. */
void rs_ho_holder_enter(const struct rs_isock *s);

/* ---- the owner ---- */

/* s->lock held: the application closed its last name of s. true when holders remain and the close is left to the
 * server (hand-back, then park); false: close as usual. */
bool rs_ho_owner_closing(struct rs_isock *s);
/* s->lock held: s was handed back (kfd, still the caller's): keep a copy for holders when s has a live record. */
void rs_ho_park(struct rs_isock *s, int kfd);

/* ---- a holder ---- */

/* Claims s's connection from its owner (blocking, bounded). Returns the kernel TCP socket (the caller's), or
 * -ECONNRESET (owner gone, record gone, hand-back failed). */
int rs_ho_claim(const struct rs_isock *s);
/* This process no longer holds s's connection (its last close, an exec that closes it): leaves the record and
 * tells the owner, so it can close a parked socket at once. */
void rs_ho_holder_leave(const struct rs_isock *s);
/* After an exec that failed: enters this process again in the records rs_ho_holder_leave left for the exec. */
void rs_ho_exec_failed(void);
/* rs_ho_holder_leave for an exec: remembered so rs_ho_exec_failed can undo it. */
void rs_ho_holder_leave_for_exec(const struct rs_isock *s);

#endif /* RS_INTERCEPT_HANDOVER_H */
