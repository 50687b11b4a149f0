/* SPDX-License-Identifier: Apache-2.0 */
/* A Varlink connection on the libuv loop: framing and fds (proto/frame.h)
 * over a uv_poll_t, since libuv's pipes cannot pass arbitrary fds. Calls are
 * answered in the order they arrived, whenever each finishes; a connection
 * that closes while calls are in flight stays allocated until they finish
 * and their replies are dropped. A peer that shuts only its writing side
 * (shutdown(SHUT_WR)) still gets the replies of every call it sent: the
 * connection closes (on_close) once they are written, or when a write
 * fails because the peer went away meanwhile.
 *
 * No client can take the loop: each turn of it serves a connection, a uid
 * and all clients together a bounded number of messages, round robin, and
 * what a uid's connections hold (messages received and not handled, calls
 * not answered, replies not sent, the fds in them) is one budget per uid
 * (conn.c says how much). A control channel (rd_conn_make_control) is
 * served ahead of clients and outside every budget. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>
#include "daemon/peer.h"
#include "proto/frame.h"
#include "proto/job.h"
#include "proto/message.h"

struct rd_conn;
struct rd_reply_item;
struct rd_conn_loop;
struct rd_conn_user;

struct rd_call {
	struct rd_conn *conn;
	struct rp_call msg;         /* method, params, flags */
	struct rp_msg raw;          /* text and the fds that came with it */
	size_t held_bytes;          /* what it counts against its uid's budget while unanswered */
	unsigned held_fds;
	bool finished;              /* the last reply is queued */
	struct rd_reply_item *replies, *replies_tail;
	struct rd_call *next;
};

struct rd_conn_ops {
	/* A call arrived; finish it with rd_call_reply() or rd_call_fail(), now
	 * or later, oneway or not. */
	void (*on_call)(struct rd_conn *conn, struct rd_call *call);
	/* The peer went away, the connection broke, or a peer that shut its
	 * writing side has every reply. Calls in flight still finish later. */
	void (*on_close)(struct rd_conn *conn);
	/* Optional: completes every error this connection's calls fail with,
	 * before it is sent (what the endpoint knows and the raiser did not). */
	void (*complete_error)(struct rd_conn *conn, struct rp_error *err);
};

/* Called with the reply to a call this side made, or reply == NULL when the
 * connection closed first. */
typedef void (*rd_reply_cb)(struct rd_conn *conn, const struct rp_call *reply, void *userdata);

struct rd_pending_out;

struct rd_conn {
	uv_poll_t poll;
	int fd;
	uv_loop_t *loop;
	struct rp_rx rx;
	struct rp_tx tx;
	struct rd_peer peer;           /* as the kernel said at connect time */
	char job[RP_JOB_MAX + 1];      /* the client's own word (io.regen.SetJob, daemon/job.h); "" none */
	bool admin;
	bool closed;
	bool reading, writing;
	bool peer_shut;             /* the peer shut its writing side (seen, maybe not yet read to the end) */
	bool eof;                   /* its end of stream read: no call comes any more */
	bool write_blocked;         /* the last write left bytes the socket would not take */
	bool peer_gone;             /* the peer closed its socket: what it sent is handled, nothing more is sent */
	bool processing;            /* inside conn_process: no re-entry */
	bool control;               /* regend's own channel (rd_conn_make_control): no budget, never waits */
	bool queued;                /* on the loop's run queue: messages wait for a turn */
	unsigned refs;
	unsigned in_flight;         /* calls received and not yet freed: running, or answered behind one running */
	unsigned unfinished;        /* calls received and not answered */
	unsigned max_in_flight;     /* more unanswered calls than this: io.regen.LimitExceeded */
	int events;                 /* what the poll waits for now */
	uv_prepare_t flush;         /* writes the replies of a loop iteration at its end */
	uv_timer_t partial_timer;   /* a message begun and not ended: its deadline */
	uint64_t partial_offset;    /* where in the stream that message began */
	struct rd_call *calls, *calls_tail;
	struct rd_pending_out *out, *out_tail;
	/* The budgets (conn.c): the loop's turns, the uid's share. */
	struct rd_conn_loop *sched;
	struct rd_conn_user *user;     /* NULL for a control channel */
	struct rd_conn *run_next, *user_next;
	uint64_t turn;                 /* the turn turn_used counts in */
	unsigned turn_used;
	size_t calls_bytes;            /* held by calls not answered and replies held behind one */
	unsigned calls_fds;
	size_t counted_bytes, counted_rx; /* what the uid's budget has of this connection */
	unsigned counted_fds;
	const struct rd_conn_ops *ops;
	void *data;
	struct rd_conn *next;       /* owner's list */
};

/* Takes ownership of fd (a connected stream socket). */
int rd_conn_new(uv_loop_t *loop, int fd, const struct rd_conn_ops *ops, void *data, struct rd_conn **out);
/* The peer is regend itself (the supervisor's and a worker's ends of a
 * control channel): served whenever it has something, ahead of clients,
 * and counted in no uid's budget, so that no client can delay a heartbeat.
 * Right after rd_conn_new. */
void rd_conn_make_control(struct rd_conn *conn);
/* Stops reading and writing and closes the socket; on_close follows. */
void rd_conn_close(struct rd_conn *conn);
/* Reads and handles now whatever the peer wrote and this side has not
 * read yet, up to its end: for a peer known gone (a worker whose exit the
 * supervisor saw before its last words), so that those are heard. */
void rd_conn_read_rest(struct rd_conn *conn);
/* A reference that keeps the connection's memory (closed or not) until
 * released: for what outlives its close (a worker's session with ring
 * records still in flight, which hold no call of it). */
void rd_conn_hold(struct rd_conn *conn);
void rd_conn_release(struct rd_conn *conn);

/* Queues a reply (params consumed; NULL = {}). continues = more replies
 * follow (only for calls with "more"). For oneway calls nothing is sent. */
void rd_call_reply(struct rd_call *call, cJSON *params, bool continues);
/* Queues the last reply (params consumed) with fds that go with it
 * (SCM_RIGHTS): each is duplicated now, so the caller keeps its own.
 * 0, or -errno (EINVAL: more than RP_FDS_MAX; EMFILE...) with nothing
 * queued and the call unanswered. */
int rd_call_reply_fds(struct rd_call *call, cJSON *params, const int *fds, size_t nfds);
/* Queues an error reply and finishes the call; err is cleared. */
void rd_call_fail(struct rd_call *call, struct rp_error *err);
/* Convenience: rp_error_set + rd_call_fail. */
void rd_call_failf(struct rd_call *call, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Closes the fds that came with the call (a method that takes none):
 * they no longer count against its uid. */
void rd_call_close_fds(struct rd_call *call);

/* Writes what is answered now rather than at the end of the loop
 * iteration (replies are batched there): for a loop about to stop. */
void rd_conn_flush(struct rd_conn *conn);

/* Makes a call on this connection (we are the client side, e.g. the
 * supervisor on a worker's control channel). params consumed. */
int rd_conn_call(struct rd_conn *conn, const char *method, cJSON *params, bool oneway, rd_reply_cb cb, void *userdata);
/* The same with fds, which go with the call's first byte (each is dup'ed:
 * the caller keeps its own). */
int rd_conn_call_fds(struct rd_conn *conn, const char *method, cJSON *params, const int *fds, size_t nfds, bool oneway,
		     rd_reply_cb cb, void *userdata);

/* Answers the peer with io.regen.LimitExceeded {resource, limit} and closes:
 * for connections refused at accept. */
void rd_conn_refuse(struct rd_conn *conn, const char *resource, unsigned limit);
/* How many connections of a list (linked by next) are of uid's peers:
 * regend counts them per uid on every socket (max_connections). */
unsigned rd_conns_of_uid(const struct rd_conn *list, uid_t uid);

/* How long a message may take from its first byte to its end, counted
 * while the connection is read (message_timeout_ms); past it the
 * connection is closed. For the whole process, set once at its start. */
void rd_conn_set_message_timeout(unsigned ms);

/* Last words before the process exits with calls still running: every
 * unfinished call gets a copy of err, and the replies are written out
 * (waiting at most timeout_ms for the peer to take them). The calls' owners
 * must not touch them afterwards. */
void rd_conn_fail_unfinished(struct rd_conn *conn, const struct rp_error *err, int timeout_ms);
