/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/conn.h"
#include "daemon/log.h"
#include "daemon/options.h"
#include "proto/errors.h"

/* More than this many bytes waiting to go out and we stop reading: a client
 * that does not read its replies cannot make us buffer without bound. */
#define TX_HIGH_WATER (8u << 20)
#define DEFAULT_MAX_IN_FLIGHT 1024
/* Calls answered (refusals too) but held behind an unanswered one, since
 * replies go out in order: past this many, the connection is not read until
 * the head finishes. Without it a client that opens a Watch and then
 * pipelines calls makes us hold every reply for ever. */
#define HELD_MAX 256
/* Reads of RP_RX_READ_CHUNK a connection gets per turn, and only while no
 * message it sent waits to be handled: a message of RP_MESSAGE_MAX fits. */
#define READS_PER_TURN 16

/* The budgets of a turn of the loop. A turn serves a connection at most
 * CONN_SLICE messages, the connections of one uid together at most
 * UID_SLICE, and all clients at most TURN_BUDGET; a connection with
 * messages left waits on the loop's run queue, served round robin in the
 * turns that follow. Between two turns the loop runs its timers (the
 * heartbeats, the systemd watchdog, deadlines) and polls every socket, and
 * control channels are served whenever they have something: no client
 * delays them by more than a turn. (A Generation costs a few microseconds:
 * a turn, a millisecond or two.) */
#define CONN_SLICE 16
#define UID_SLICE 64
#define TURN_BUDGET 256
/* What the connections of one uid hold together: messages received and not
 * yet handled, calls not yet answered (a call counts CALL_BYTES besides its
 * text, for its parse and bookkeeping), replies not yet sent, and the fds
 * in all of them. Past USER_BYTES_MAX or USER_FDS_MAX none of the uid's
 * connections is read; past USER_BYTES_MAX in calls and replies alone none
 * of the messages already read is handled either (a reply may be many
 * times its call: a Generation of 60 bytes is answered in 1.7 KiB). Each
 * resumes once the uid is back under three quarters: its clients read
 * their replies, or its calls finish. Messages read and not handled never
 * hold the handling back, so a uid whose clients sent large messages is
 * not stuck. A uid holds at most about twice USER_BYTES_MAX. */
#define USER_BYTES_MAX (16u << 20)
#define USER_FDS_MAX 256
#define CALL_BYTES 1024

/* A uid's share of one loop. */
struct rd_conn_user {
	uid_t uid;
	unsigned conns;
	size_t bytes;               /* all it holds */
	size_t rx_bytes;            /* of which messages read and not handled */
	unsigned fds;
	bool over;                  /* past a bound: its connections are not read */
	bool full;                  /* past it in calls and replies: nor are their messages handled */
	uint64_t turn;              /* the turn turn_used counts in */
	unsigned turn_used;
	struct rd_conn *list;       /* its connections, by user_next */
	struct rd_conn_user *next;
};

/* The connections of one loop: the run queue, the turn's budget, the
 * uids. Made with the first connection on a loop, gone with the last. */
struct rd_conn_loop {
	uv_loop_t *loop;
	unsigned conns;
	uv_idle_t idle;             /* active while the run queue holds a connection: the loop polls without waiting */
	uv_check_t check;           /* ends a turn (after the poll) */
	unsigned handles;           /* of the two, not yet closed */
	uint64_t turn;
	unsigned turn_left;
	struct rd_conn *run_head, *run_tail;
	struct rd_conn_user *users;
	struct rd_conn_loop *next;
};

static struct rd_conn_loop *loops;

/* Whether the connection may hand more messages to its handler: what one
 * connection may hold answered behind an unanswered call, or unsent. */
static bool may_handle(const struct rd_conn *conn)
{
	return conn->tx.queued_bytes < TX_HIGH_WATER && conn->in_flight - conn->unfinished < HELD_MAX &&
	       conn->in_flight < conn->max_in_flight + HELD_MAX && !(conn->user && conn->user->full);
}

/* Whether more bytes may be read from the socket: the connection's bounds
 * and its uid's. */
static bool may_read(const struct rd_conn *conn)
{
	return may_handle(conn) && !(conn->user && conn->user->over);
}

/* A message begun and not ended within this long closes the connection: a
 * peer cannot hold a buffer by sending a byte now and then
 * (message_timeout_ms). */
static unsigned partial_timeout = RD_MESSAGE_TIMEOUT_MS_DEFAULT;

void rd_conn_set_message_timeout(unsigned ms)
{
	partial_timeout = ms ? ms : RD_MESSAGE_TIMEOUT_MS_DEFAULT;
}

struct rd_reply_item {
	char *text;
	size_t bytes;               /* counted in its connection's calls_bytes */
	int fds[RP_FDS_MAX];        /* sent with it (rd_call_reply_fds): ours, closed once queued */
	size_t nfds;
	struct rd_reply_item *next;
};

struct rd_pending_out {
	rd_reply_cb cb;
	void *userdata;
	struct rd_pending_out *next;
};

static void conn_update_events(struct rd_conn *conn);
static void conn_process(struct rd_conn *conn);
static void conn_write(struct rd_conn *conn);
static void conn_serve(struct rd_conn *conn);
static void conn_unref(struct rd_conn *conn);
static bool take_turn(struct rd_conn *conn, bool take);

/* ---- The loop's turns ---- */

static void on_loop_handle_closed(uv_handle_t *h)
{
	struct rd_conn_loop *l = h->data;

	if (--l->handles == 0)
		free(l);
}

/* A turn ends after the poll: the next begins with a full budget. */
static void on_turn_end(uv_check_t *check)
{
	struct rd_conn_loop *l = check->data;

	l->turn++;
	l->turn_left = TURN_BUDGET;
}

/* Takes conn off the run queue, where prev (NULL: none) is before it. */
static void unqueue(struct rd_conn_loop *l, struct rd_conn *prev, struct rd_conn *conn)
{
	if (prev)
		prev->run_next = conn->run_next;
	else
		l->run_head = conn->run_next;
	if (l->run_tail == conn)
		l->run_tail = prev;
	conn->run_next = NULL;
	conn->queued = false;
}

/* The start of a turn: the connections on the run queue are served in
 * order, each once, as far as the turn's budget goes. One served with
 * messages left goes to the back; one whose uid's share of the turn is
 * spent keeps its place, ahead of those served, so that the connections
 * of one uid take turns too. The queue's reference to a connection is
 * dropped once it is off the queue. */
static void on_turn(uv_idle_t *idle)
{
	struct rd_conn_loop *l = idle->data;
	struct rd_conn *last = l->run_tail, *prev = NULL, *conn = l->run_head;

	while (conn && l->turn_left > 0) {
		bool was_last = conn == last;

		if (conn->closed || take_turn(conn, false)) {
			unqueue(l, prev, conn);
			if (!conn->closed)
				conn_serve(conn);
			conn_unref(conn);
		} else {
			prev = conn;
		}
		if (was_last)
			break;
		conn = prev ? prev->run_next : l->run_head;
	}
	if (!l->run_head)
		uv_idle_stop(idle);
}

static struct rd_conn_loop *loop_get(uv_loop_t *loop)
{
	struct rd_conn_loop *l;

	for (l = loops; l; l = l->next) {
		if (l->loop == loop) {
			l->conns++;
			return l;
		}
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->loop = loop;
	l->conns = 1;
	l->turn_left = TURN_BUDGET;
	uv_idle_init(loop, &l->idle);
	l->idle.data = l;
	uv_check_init(loop, &l->check);
	l->check.data = l;
	l->handles = 2;
	uv_check_start(&l->check, on_turn_end);
	/* Connections keep the loop running, not the count of its turns. */
	uv_unref((uv_handle_t *)&l->check);
	l->next = loops;
	loops = l;
	return l;
}

static void loop_put(struct rd_conn_loop *l)
{
	if (--l->conns)
		return;
	for (struct rd_conn_loop **p = &loops; *p; p = &(*p)->next) {
		if (*p == l) {
			*p = l->next;
			break;
		}
	}
	/* A process on its way out may have closed every handle (uv_walk):
	 * then the memory goes with it. */
	if (uv_is_closing((uv_handle_t *)&l->idle))
		return;
	uv_close((uv_handle_t *)&l->idle, on_loop_handle_closed);
	uv_close((uv_handle_t *)&l->check, on_loop_handle_closed);
}

/* At the back of the run queue, where its messages wait for a turn with
 * budget left. The queue holds a reference. */
static void conn_enqueue(struct rd_conn *conn)
{
	struct rd_conn_loop *l = conn->sched;

	if (conn->queued || conn->closed || uv_is_closing((uv_handle_t *)&l->idle))
		return;
	conn->queued = true;
	conn->refs++;
	conn->run_next = NULL;
	if (l->run_tail)
		l->run_tail->run_next = conn;
	else
		l->run_head = conn;
	l->run_tail = conn;
	uv_idle_start(&l->idle, on_turn);
}

/* Whether the connection may have one more message handled in this turn;
 * take: and counts it. */
static bool take_turn(struct rd_conn *conn, bool take)
{
	struct rd_conn_loop *l = conn->sched;
	struct rd_conn_user *u = conn->user;

	if (conn->control)
		return true;
	if (conn->turn != l->turn) {
		conn->turn = l->turn;
		conn->turn_used = 0;
	}
	if (u->turn != l->turn) {
		u->turn = l->turn;
		u->turn_used = 0;
	}
	if (l->turn_left == 0 || conn->turn_used >= CONN_SLICE || u->turn_used >= UID_SLICE)
		return false;
	if (take) {
		l->turn_left--;
		conn->turn_used++;
		u->turn_used++;
	}
	return true;
}

/* ---- The uids' budgets ---- */

static struct rd_conn_user *user_get(struct rd_conn_loop *l, uid_t uid)
{
	struct rd_conn_user *u;

	for (u = l->users; u; u = u->next) {
		if (u->uid == uid)
			return u;
	}
	u = calloc(1, sizeof(*u));
	if (!u)
		return NULL;
	u->uid = uid;
	u->next = l->users;
	l->users = u;
	return u;
}

/* The uid is back under its bounds: its connections are read again, and
 * those with messages read and waiting get their turns. */
static void user_wake(struct rd_conn_user *u)
{
	for (struct rd_conn *c = u->list; c; c = c->user_next) {
		if (c->closed)
			continue;
		if (c->rx.head)
			conn_enqueue(c);
		conn_update_events(c);
	}
}

static void user_update(struct rd_conn_user *u)
{
	bool was_over = u->over, was_full = u->full;
	size_t made = u->bytes - u->rx_bytes;

	if (u->bytes >= USER_BYTES_MAX || u->fds >= USER_FDS_MAX)
		u->over = true;
	else if (u->bytes < USER_BYTES_MAX / 4 * 3 && u->fds < USER_FDS_MAX / 4 * 3)
		u->over = false;
	if (made >= USER_BYTES_MAX)
		u->full = true;
	else if (made < USER_BYTES_MAX / 4 * 3)
		u->full = false;
	if (u->over && !was_over)
		rd_debug("conn", -1, 0, 0, "uid %u holds %zu bytes and %u fds: its connections are not read until it "
			 "takes its replies or its calls finish", (unsigned)u->uid, u->bytes, u->fds);
	if ((was_over && !u->over) || (was_full && !u->full))
		user_wake(u);
}

/* Brings the uid's count of what this connection holds up to date. */
static void conn_account(struct rd_conn *conn)
{
	struct rd_conn_user *u = conn->user;
	size_t rx = conn->rx.held_bytes + conn->rx.cap;
	size_t bytes = rx + conn->tx.held_bytes + conn->calls_bytes;
	unsigned fds = (unsigned)conn->rx.held_fds + conn->calls_fds;

	if (!u)
		return;
	u->bytes = u->bytes - conn->counted_bytes + bytes;
	u->rx_bytes = u->rx_bytes - conn->counted_rx + rx;
	u->fds = u->fds - conn->counted_fds + fds;
	conn->counted_bytes = bytes;
	conn->counted_rx = rx;
	conn->counted_fds = fds;
	user_update(u);
}

static void conn_join_user(struct rd_conn *conn, struct rd_conn_user *u)
{
	conn->user = u;
	u->conns++;
	conn->user_next = u->list;
	u->list = conn;
}

static void conn_leave_user(struct rd_conn *conn)
{
	struct rd_conn_user *u = conn->user;

	if (!u)
		return;
	for (struct rd_conn **p = &u->list; *p; p = &(*p)->user_next) {
		if (*p == conn) {
			*p = conn->user_next;
			break;
		}
	}
	u->bytes -= conn->counted_bytes;
	u->rx_bytes -= conn->counted_rx;
	u->fds -= conn->counted_fds;
	conn->counted_bytes = conn->counted_rx = 0;
	conn->counted_fds = 0;
	conn->user = NULL;
	if (--u->conns == 0) {
		for (struct rd_conn_user **p = &conn->sched->users; *p; p = &(*p)->next) {
			if (*p == u) {
				*p = u->next;
				break;
			}
		}
		free(u);
		return;
	}
	user_update(u);
}

/* A call holds these against its uid until it is answered (its text and
 * fds) and freed (its bookkeeping). */
static void call_hold(struct rd_call *call, size_t bytes, unsigned fds)
{
	call->held_bytes += bytes;
	call->held_fds += fds;
	call->conn->calls_bytes += bytes;
	call->conn->calls_fds += fds;
}

static void call_release(struct rd_call *call, size_t bytes, unsigned fds)
{
	call->held_bytes -= bytes;
	call->held_fds -= fds;
	call->conn->calls_bytes -= bytes;
	call->conn->calls_fds -= fds;
}

/* ---- Connections ---- */

/* Whether the peer closed its socket, not only its writing side: a
 * half-closed peer (shutdown(SHUT_WR)) still reads the replies it is owed,
 * and only a hangup is seen without a write. */
static bool peer_hung_up(const struct rd_conn *conn)
{
	struct pollfd p = { .fd = conn->fd, .events = 0 };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

static void conn_free(struct rd_conn *conn)
{
	rp_rx_finish(&conn->rx);
	rp_tx_finish(&conn->tx);
	conn_leave_user(conn);
	loop_put(conn->sched);
	free(conn);
}

static void conn_unref(struct rd_conn *conn)
{
	if (--conn->refs == 0)
		conn_free(conn);
}

static void on_poll_closed(uv_handle_t *handle)
{
	struct rd_conn *conn = handle->data;

	close(conn->fd);
	conn->fd = -1;
	conn_unref(conn);
}

static void on_timer_closed(uv_handle_t *handle)
{
	conn_unref(handle->data);
}

/* Right before the loop blocks for I/O: what was answered since the last
 * write goes out, every reply of this wake-up in one write. */
static void on_prepare(uv_prepare_t *p)
{
	struct rd_conn *conn = p->data;

	uv_prepare_stop(p);
	conn->refs++;
	conn_write(conn);
	conn_unref(conn);
}

/* Replies are written once per loop iteration, not once each. */
static void schedule_write(struct rd_conn *conn)
{
	if (!conn->closed && !rp_tx_empty(&conn->tx))
		uv_prepare_start(&conn->flush, on_prepare);
}

static void free_reply(struct rd_conn *conn, struct rd_reply_item *r)
{
	conn->calls_bytes -= r->bytes;
	for (size_t i = 0; i < r->nfds; i++)
		close(r->fds[i]);
	free(r->text);
	free(r);
}

static void free_call(struct rd_call *call)
{
	struct rd_reply_item *r = call->replies;

	while (r) {
		struct rd_reply_item *next = r->next;
		free_reply(call->conn, r);
		r = next;
	}
	call_release(call, call->held_bytes, call->held_fds);
	rp_call_finish(&call->msg);
	rp_msg_finish(&call->raw);
	free(call);
}

/* Moves the call's replies, in order, to the socket's queue (dropped on a
 * closed connection). */
static void move_call_replies(struct rd_conn *conn, struct rd_call *call)
{
	struct rd_reply_item *r;

	while ((r = call->replies)) {
		call->replies = r->next;
		if (!conn->closed && rp_tx_push(&conn->tx, r->text, strlen(r->text), r->fds, r->nfds) < 0)
			rd_warn("conn", -1, 0, conn->peer.pid, "dropping reply: out of memory");
		free_reply(conn, r);
	}
	call->replies_tail = NULL;
}

/* Moves the replies of the calls at the head of the queue, in order, to the
 * socket's queue; frees calls that are finished and fully moved. */
static void conn_move_replies(struct rd_conn *conn)
{
	struct rd_call *call;

	while ((call = conn->calls)) {
		move_call_replies(conn, call);
		if (!call->finished)
			break;
		conn->calls = call->next;
		if (!conn->calls)
			conn->calls_tail = NULL;
		free_call(call);
		conn->in_flight--;
		conn_unref(conn);
	}
}

/* Writes what the socket takes now. */
static void conn_write(struct rd_conn *conn)
{
	if (conn->closed)
		return;
	int r = rp_tx_flush(&conn->tx, conn->fd);
	if (r < 0 && r != -EAGAIN) {
		rd_debug("conn", -1, 0, conn->peer.pid, "write failed: %s", strerror(-r));
		rd_conn_close(conn);
		return;
	}
	/* Only a write the socket refused makes us wait for it to drain. */
	conn->write_blocked = r == -EAGAIN;
	conn_account(conn);
	conn_update_events(conn);
	/* After the peer's end of stream the last write may be what the close
	 * waited for; conn_process knows whether calls are left to read. */
	if (conn->eof && rp_tx_empty(&conn->tx))
		conn_process(conn);
}

static void conn_flush_calls(struct rd_conn *conn)
{
	conn_move_replies(conn);
	conn_write(conn);
}

/* Takes text (may be NULL: nothing to send) and the fds (dups of the
 * caller's, closed here when the reply cannot be queued). */
static void call_append_reply(struct rd_call *call, char *text, const int *fds, size_t nfds)
{
	struct rd_reply_item *r;

	if (!text) {
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		free(text);
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}
	for (size_t i = 0; i < nfds; i++)
		r->fds[i] = fds[i];
	r->nfds = nfds;
	r->text = text;
	r->bytes = sizeof(*r) + strlen(text) + 1;
	call->conn->calls_bytes += r->bytes;
	if (call->replies_tail)
		call->replies_tail->next = r;
	else
		call->replies = r;
	call->replies_tail = r;
}

/* The call is answered: only its reply is needed now. A call held behind a
 * slow one keeps a few bytes, not its message and fds. */
static void call_finish(struct rd_call *call)
{
	call->finished = true;
	call->conn->unfinished--;
	rp_call_finish(&call->msg);
	rp_msg_finish(&call->raw);
	call_release(call, call->held_bytes - CALL_BYTES, call->held_fds);
}

static void call_queue_text(struct rd_call *call, char *text, bool last, const int *fds, size_t nfds)
{
	struct rd_conn *conn = call->conn;

	if (call->finished) {
		free(text);
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}
	call_append_reply(call, text, fds, nfds);
	if (last)
		call_finish(call);
	/* Moving the replies may free the call and, on a closed connection,
	 * drop the last reference to it. The write waits for the end of this
	 * loop iteration, so that the replies of every call answered in it go
	 * out in one write. */
	conn->refs++;
	conn_move_replies(conn);
	schedule_write(conn);
	conn_account(conn);
	/* A finished call may have freed a slot that backpressure waited for. */
	if (!conn->closed)
		conn_process(conn);
	conn_unref(conn);
}

void rd_call_reply(struct rd_call *call, cJSON *params, bool continues)
{
	char *text = NULL;

	if (!call->msg.oneway) {
		if (!call->msg.more)
			continues = false;
		text = rp_build_reply(params, continues);
	}
	cJSON_Delete(params);
	call_queue_text(call, text, !continues, NULL, 0);
}

int rd_call_reply_fds(struct rd_call *call, cJSON *params, const int *fds, size_t nfds)
{
	int mine[RP_FDS_MAX];
	size_t n;

	if (nfds > RP_FDS_MAX) {
		cJSON_Delete(params);
		return -EINVAL;
	}
	for (n = 0; n < nfds; n++) {
		mine[n] = fcntl(fds[n], F_DUPFD_CLOEXEC, 0);
		if (mine[n] < 0) {
			int e = errno;
			while (n > 0)
				close(mine[--n]);
			cJSON_Delete(params);
			return -e;
		}
	}
	char *text = call->msg.oneway ? NULL : rp_build_reply(params, false);
	cJSON_Delete(params);
	call_queue_text(call, text, true, mine, nfds);
	return 0;
}

void rd_call_fail(struct rd_call *call, struct rp_error *err)
{
	char *text = NULL;

	if (call->conn->ops->complete_error)
		call->conn->ops->complete_error(call->conn, err);
	if (!call->msg.oneway)
		text = rp_build_error(err);
	if (call->conn->peer.pid)
		rd_debug("conn", -1, 0, call->conn->peer.pid, "%s -> %s",
			 call->msg.method ? call->msg.method : "(unparsed)", err->name);
	rp_error_clear(err);
	call_queue_text(call, text, true, NULL, 0);
}

void rd_call_failf(struct rd_call *call, const char *name, const char *fmt, ...)
{
	struct rp_error err = { 0 };
	char message[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	rp_error_set(&err, name, "%s", message);
	rd_call_fail(call, &err);
}

void rd_call_close_fds(struct rd_call *call)
{
	for (size_t i = 0; i < call->raw.nfds && i < RP_FDS_MAX; i++) {
		if (call->raw.fds[i] >= 0)
			close(call->raw.fds[i]);
		call->raw.fds[i] = -1;
	}
	call->raw.nfds = 0;
	call_release(call, 0, call->held_fds);
	conn_account(call->conn);
}

static struct rd_call *call_new(struct rd_conn *conn)
{
	struct rd_call *call = calloc(1, sizeof(*call));

	if (!call)
		return NULL;
	call->conn = conn;
	for (size_t i = 0; i < RP_FDS_MAX; i++)
		call->raw.fds[i] = -1;
	call_hold(call, CALL_BYTES, 0);
	conn->refs++;
	conn->in_flight++;
	conn->unfinished++;
	if (conn->calls_tail)
		conn->calls_tail->next = call;
	else
		conn->calls = call;
	conn->calls_tail = call;
	return call;
}

static void handle_reply(struct rd_conn *conn, struct rp_call *msg)
{
	struct rd_pending_out *p = conn->out;

	if (!p) {
		rd_warn("conn", -1, 0, conn->peer.pid, "reply with no call outstanding; closing");
		rd_conn_close(conn);
		return;
	}
	/* "continues" replies keep the call outstanding. */
	if (!msg->continues) {
		conn->out = p->next;
		if (!conn->out)
			conn->out_tail = NULL;
	}
	p->cb(conn, msg, p->userdata);
	if (!msg->continues)
		free(p);
}

static void handle_message(struct rd_conn *conn, struct rp_msg *raw)
{
	struct rp_error err = { 0 };
	struct rp_call msg = { 0 };

	if (raw->fds_dropped) {
		/* Acting on a call whose fds went missing could import the wrong
		 * file: refuse it whole. */
		struct rd_call *call = call_new(conn);
		unsigned dropped = (unsigned)raw->fds_dropped;
		rp_msg_finish(raw);
		if (!call) {
			rd_conn_close(conn);
			return;
		}
		rp_error_set(&err, RP_ERR_LIMIT_EXCEEDED,
			     "%u file descriptor(s) of this message were dropped (at most %d per message)", dropped,
			     RP_FDS_MAX);
		rp_error_add_str(&err, "resource", "fds");
		rp_error_add_int(&err, "limit", RP_FDS_MAX);
		rd_call_fail(call, &err);
		return;
	}
	if (rp_call_parse(raw->text, raw->len, &msg, &err) < 0) {
		struct rd_call *call = call_new(conn);
		rp_msg_finish(raw);
		if (!call) {
			rp_error_clear(&err);
			rd_conn_close(conn);
			return;
		}
		rd_call_fail(call, &err);
		return;
	}
	if (!msg.method && conn->out) {
		rp_msg_finish(raw);
		handle_reply(conn, &msg);
		rp_call_finish(&msg);
		return;
	}
	if (!msg.method) {
		/* We made no call this could answer: it is a call without a method. */
		struct rd_call *call = call_new(conn);
		rp_call_finish(&msg);
		rp_msg_finish(raw);
		if (!call) {
			rd_conn_close(conn);
			return;
		}
		rp_error_set(&err, RP_ERR_INVALID_MESSAGE, "a call needs a 'method' string");
		rp_error_add_str(&err, "reason", "a call needs a 'method' string");
		rd_call_fail(call, &err);
		return;
	}
	bool over_limit = conn->unfinished >= conn->max_in_flight;
	struct rd_call *call = call_new(conn);
	if (!call) {
		rp_call_finish(&msg);
		rp_msg_finish(raw);
		rd_conn_close(conn);
		return;
	}
	call->msg = msg;
	call->raw = *raw;
	memset(raw, 0, sizeof(*raw));
	call_hold(call, call->raw.len + 1, (unsigned)call->raw.nfds);
	if (over_limit) {
		rp_error_set(&err, RP_ERR_LIMIT_EXCEEDED,
			     "%u calls are already unanswered on this connection; wait for their replies",
			     conn->max_in_flight);
		rp_error_add_str(&err, "resource", "calls in flight");
		rp_error_add_int(&err, "limit", conn->max_in_flight);
		rd_call_fail(call, &err);
		return;
	}
	conn->refs++;   /* the handler may close the connection under us */
	conn->ops->on_call(conn, call);
	conn_unref(conn);
}

/* Hands the messages read to the handler, as far as backpressure and the
 * turn's budgets allow; with messages left and no budget the connection
 * waits on the run queue. */
static void conn_process(struct rd_conn *conn)
{
	/* Replies finishing synchronously inside on_call re-enter here; the
	 * outer loop picks up whatever they unblocked. */
	if (conn->processing)
		return;
	conn->processing = true;
	conn->refs++;
	bool drained = false;
	while (!conn->closed && may_handle(conn)) {
		if (!conn->rx.head) {
			drained = true;
			break;
		}
		if (!take_turn(conn, true)) {
			conn_enqueue(conn);
			break;
		}
		struct rp_msg raw = { 0 };
		int r = rp_rx_next(&conn->rx, &raw);
		if (r < 0) {
			rd_conn_close(conn);
			break;
		}
		if (r == RP_RX_TOO_LARGE) {
			struct rd_call *call = call_new(conn);
			struct rp_error err = { 0 };
			if (!call)
				break;
			rp_error_set(&err, RP_ERR_MESSAGE_TOO_LARGE, "message exceeds %u bytes and was discarded",
				     RP_MESSAGE_MAX);
			rp_error_add_int(&err, "limit", RP_MESSAGE_MAX);
			rd_call_fail(call, &err);
			continue;
		}
		handle_message(conn, &raw);
	}
	conn->processing = false;
	if (!conn->closed) {
		conn_account(conn);
		conn_update_events(conn);
	}
	/* The peer sent its last call and every call it sent is answered and
	 * written: nothing is owed any more. A message it left unended never
	 * will be. A peer that is gone is owed nothing once what it sent is
	 * handled (its calls still finish). */
	if (conn->eof && drained && !conn->closed &&
	    (conn->peer_gone || (!conn->calls && rp_tx_empty(&conn->tx))))
		rd_conn_close(conn);
	/* Gone while backpressure holds what it sent (replies held behind a
	 * Watch): nothing it is owed can reach it, and nothing else would
	 * close it. */
	if (conn->peer_gone && !conn->closed && !may_handle(conn))
		rd_conn_close(conn);
	conn_unref(conn);
}

/* One read. False when nothing more is to be read now: the socket is
 * empty, or its stream ended. */
static bool conn_read(struct rd_conn *conn)
{
	ssize_t n = rp_rx_read(&conn->rx, conn->fd);

	if (n == -EAGAIN || n == -EINTR)
		return false;
	if (n == 0 && !peer_hung_up(conn)) {
		/* A half-close: the peer sent its last call and waits for
		 * the replies. Every call that came is answered, and the
		 * connection closes once they are written (conn_process). */
		conn->eof = conn->peer_shut = true;
		return false;
	}
	if (n <= 0) {
		/* Gone (or a receiver out of step: -ENOMEM): what arrived
		 * before is still handled, a oneway call followed by a close
		 * is still a call, and then the connection closes. */
		conn->eof = conn->peer_shut = conn->peer_gone = true;
		return false;
	}
	/* A short read emptied the socket (or stopped at a message with fds):
	 * the poll is level-triggered and wakes us for anything left, so a
	 * read that would only say EAGAIN is a system call saved. */
	return (size_t)n == RP_RX_READ_CHUNK;
}

/* A connection's part of a turn: the messages it has read, as far as the
 * budgets go, and reads while none is left. */
static void conn_serve(struct rd_conn *conn)
{
	conn->refs++;
	for (int reads = 0;; reads++) {
		conn_process(conn);
		if (conn->closed || conn->queued || conn->rx.head || conn->eof || !may_read(conn) ||
		    reads == READS_PER_TURN || !take_turn(conn, false))
			break;
		if (!conn_read(conn)) {
			/* What this read brought, and the end of the stream
			 * (which closes there). */
			conn_process(conn);
			break;
		}
	}
	if (!conn->closed)
		conn_update_events(conn);
	conn_unref(conn);
}

static void on_poll(uv_poll_t *handle, int status, int events)
{
	struct rd_conn *conn = handle->data;

	if (conn->closed)
		return;
	if (status < 0) {
		rd_conn_close(conn);
		return;
	}
	conn->refs++;
	if (events & UV_WRITABLE) {
		conn_flush_calls(conn);
		/* Replies drained below the high-water mark: messages already
		 * buffered may go on without waiting for more bytes to arrive. */
		conn_process(conn);
	}
	if (!conn->closed && (events & UV_READABLE)) {
		/* Served now, unless others wait for their turns or its budgets
		 * of this turn are spent: then at the back of the queue. */
		if (conn->control || (!conn->queued && !conn->sched->run_head && take_turn(conn, false))) {
			conn_serve(conn);
		} else {
			conn_enqueue(conn);
			conn_update_events(conn);
		}
	}
	/* The peer hung up while we do not read (backpressure, or replies
	 * held behind a Watch): nothing of it needs reading any more, and the
	 * hangup, level-triggered, would wake the loop for ever. Closed as
	 * at the end of the stream. A peer that only shut its writing side
	 * is read on once we read again (its calls are in the socket, its
	 * end of stream after them); its hangup is not listened for. A
	 * connection waiting for its turn is not listening: it reads the end
	 * of the stream when it is served. */
	if (!conn->closed && (events & UV_DISCONNECT) && !conn->reading && !conn->queued) {
		if (peer_hung_up(conn)) {
			rd_conn_close(conn);
		} else {
			conn->peer_shut = true;
			conn_update_events(conn);
		}
	}
	conn_unref(conn);
}

static void on_partial_timeout(uv_timer_t *t)
{
	struct rd_conn *conn = t->data;

	rd_warn("conn", -1, 0, conn->peer.pid, "closing: a message begun %u ms ago has not ended",
		partial_timeout);
	rd_conn_close(conn);
}

/* The deadline runs from the first byte of a message, not from the last
 * byte that came, and only while regend reads: a message cut short because
 * regend stopped reading (backpressure, replies held behind a Watch, the
 * connection waiting for its turn) is regend's wait, not the peer's, and
 * its deadline starts afresh once regend reads again. The buffer it holds
 * meanwhile is bounded as the replies are. */
static void update_partial_timer(struct rd_conn *conn)
{
	if (!conn->reading || !rp_rx_partial(&conn->rx)) {
		uv_timer_stop(&conn->partial_timer);
		return;
	}
	if (uv_is_active((uv_handle_t *)&conn->partial_timer) && conn->partial_offset == conn->rx.buf_offset)
		return;
	conn->partial_offset = conn->rx.buf_offset;
	uv_timer_start(&conn->partial_timer, on_partial_timeout, partial_timeout, 0);
}

static void conn_update_events(struct rd_conn *conn)
{
	int events = 0;

	if (conn->closed)
		return;
	/* Messages read and allowed to go on wait for a turn, never for a
	 * wake-up of the socket. */
	if (!conn->queued && !conn->processing && conn->rx.head && may_handle(conn))
		conn_enqueue(conn);
	/* A peer that does not read its replies stops being read: backpressure
	 * keeps our buffers bounded. Too many calls in flight is refused by name
	 * instead, so a pipelining client learns its limit. Nor is a connection
	 * read while messages it sent wait for their turn. */
	conn->reading = !conn->eof && !conn->queued && !conn->rx.head && may_read(conn);
	update_partial_timer(conn);
	/* Replies waiting for the end of the loop iteration are written
	 * then; the poll waits for writability only once the socket refused
	 * some. */
	conn->writing = conn->write_blocked && !rp_tx_empty(&conn->tx);
	if (conn->reading)
		events |= UV_READABLE;
	if (conn->writing)
		events |= UV_WRITABLE;
	/* A peer's half-close stays signalled: listening for it after it
	 * came would wake the loop for ever. A hangup after it shows as a
	 * failed write. */
	if (!conn->peer_shut && !conn->queued)
		events |= UV_DISCONNECT;
	/* Restarting a poll with the same events would cost two epoll_ctl()
	 * calls per message for nothing. */
	if (events == conn->events)
		return;
	conn->events = events;
	uv_poll_start(&conn->poll, events, on_poll);
}

int rd_conn_new(uv_loop_t *loop, int fd, const struct rd_conn_ops *ops, void *data, struct rd_conn **out)
{
	struct rd_conn *conn = calloc(1, sizeof(*conn));
	struct rd_conn_user *user;
	int r;

	if (!conn) {
		close(fd);
		return -ENOMEM;
	}
	conn->fd = fd;
	conn->loop = loop;
	conn->ops = ops;
	conn->data = data;
	conn->refs = 1;
	conn->max_in_flight = DEFAULT_MAX_IN_FLIGHT;
	rp_rx_init(&conn->rx);
	rp_tx_init(&conn->tx);
	rd_peer_read(fd, &conn->peer);
	conn->sched = loop_get(loop);
	if (!conn->sched) {
		close(fd);
		free(conn);
		return -ENOMEM;
	}
	user = user_get(conn->sched, conn->peer.uid);
	if (!user) {
		close(fd);
		loop_put(conn->sched);
		free(conn);
		return -ENOMEM;
	}
	conn_join_user(conn, user);
	r = uv_poll_init(loop, &conn->poll, fd);
	if (r < 0) {
		close(fd);
		conn_free(conn);
		return r;
	}
	conn->poll.data = conn;
	uv_timer_init(loop, &conn->partial_timer);
	conn->partial_timer.data = conn;
	conn->refs++;   /* the timer's, dropped when it is closed */
	uv_prepare_init(loop, &conn->flush);
	conn->flush.data = conn;
	conn->refs++;   /* the prepare handle's, likewise */
	conn_update_events(conn);
	*out = conn;
	return 0;
}

void rd_conn_make_control(struct rd_conn *conn)
{
	conn_leave_user(conn);
	conn->control = true;
}

void rd_conn_close(struct rd_conn *conn)
{
	struct rd_pending_out *p;

	if (conn->closed)
		return;
	/* Best effort: what is already answered goes out before the close. */
	if (!rp_tx_empty(&conn->tx))
		rp_tx_flush(&conn->tx, conn->fd);
	conn->closed = true;
	uv_poll_stop(&conn->poll);
	conn->refs++;
	while ((p = conn->out)) {
		conn->out = p->next;
		p->cb(conn, NULL, p->userdata);
		free(p);
	}
	conn->out_tail = NULL;
	if (conn->ops->on_close)
		conn->ops->on_close(conn);
	/* Finished calls can go now; the rest go as they finish. What was
	 * read and not handled, and what was not sent, never will be: their
	 * memory and fds go now, not when the last call finishes. */
	conn_flush_calls(conn);
	rp_rx_finish(&conn->rx);
	rp_tx_finish(&conn->tx);
	conn_account(conn);
	uv_timer_stop(&conn->partial_timer);
	uv_close((uv_handle_t *)&conn->partial_timer, on_timer_closed);
	uv_prepare_stop(&conn->flush);
	uv_close((uv_handle_t *)&conn->flush, on_timer_closed);
	uv_close((uv_handle_t *)&conn->poll, on_poll_closed);
	/* The open reference is dropped in on_poll_closed. */
	conn_unref(conn);
}

void rd_conn_read_rest(struct rd_conn *conn)
{
	conn->refs++;
	while (!conn->closed && !conn->eof && may_read(conn)) {
		ssize_t n = rp_rx_read(&conn->rx, conn->fd);

		if (n == -EINTR)
			continue;
		if (n <= 0) {
			conn->eof = conn->peer_shut = conn->peer_gone = true;
			break;
		}
		conn_process(conn);
	}
	conn_process(conn);
	conn_unref(conn);
}

void rd_conn_hold(struct rd_conn *conn)
{
	conn->refs++;
}

void rd_conn_release(struct rd_conn *conn)
{
	conn_unref(conn);
}

void rd_conn_flush(struct rd_conn *conn)
{
	if (conn->closed)
		return;
	uv_prepare_stop(&conn->flush);
	conn->refs++;
	conn_write(conn);
	conn_unref(conn);
}

int rd_conn_call(struct rd_conn *conn, const char *method, cJSON *params, bool oneway, rd_reply_cb cb, void *userdata)
{
	return rd_conn_call_fds(conn, method, params, NULL, 0, oneway, cb, userdata);
}

int rd_conn_call_fds(struct rd_conn *conn, const char *method, cJSON *params, const int *fds, size_t nfds, bool oneway,
		     rd_reply_cb cb, void *userdata)
{
	char *text;
	int r;

	if (conn->closed) {
		cJSON_Delete(params);
		return -ENOTCONN;
	}
	text = rp_build_call(method, params, false, oneway);
	cJSON_Delete(params);
	if (!text)
		return -ENOMEM;
	struct rd_pending_out *p = NULL;
	if (!oneway) {
		p = calloc(1, sizeof(*p));
		if (!p) {
			free(text);
			return -ENOMEM;
		}
		p->cb = cb;
		p->userdata = userdata;
	}
	r = rp_tx_push(&conn->tx, text, strlen(text), fds, nfds);
	free(text);
	if (r < 0) {
		/* Not sent: no reply will come for it, and a callback waiting
		 * would take the next call's reply (and its caller, told of the
		 * failure, may free what the callback gets). */
		free(p);
		return r;
	}
	if (p) {
		if (conn->out_tail)
			conn->out_tail->next = p;
		else
			conn->out = p;
		conn->out_tail = p;
	}
	conn_account(conn);
	schedule_write(conn);
	return 0;
}

unsigned rd_conns_of_uid(const struct rd_conn *list, uid_t uid)
{
	unsigned n = 0;

	for (const struct rd_conn *c = list; c; c = c->next)
		n += c->peer.uid == uid;
	return n;
}

void rd_conn_refuse(struct rd_conn *conn, const char *resource, unsigned limit)
{
	struct rp_error err = { 0 };
	char *text;

	rp_error_set(&err, RP_ERR_LIMIT_EXCEEDED, "too many %s for this client (limit %u)", resource, limit);
	rp_error_add_str(&err, "resource", resource);
	rp_error_add_int(&err, "limit", limit);
	text = rp_build_error(&err);
	rp_error_clear(&err);
	if (text) {
		/* Best effort: a fresh socket's buffer takes one small message. */
		rp_tx_push(&conn->tx, text, strlen(text), NULL, 0);
		rp_tx_flush(&conn->tx, conn->fd);
		free(text);
	}
	rd_conn_close(conn);
}

void rd_conn_fail_unfinished(struct rd_conn *conn, const struct rp_error *err, int timeout_ms)
{
	if (conn->closed)
		return;
	for (struct rd_call *call = conn->calls; call; call = call->next) {
		if (call->finished)
			continue;
		struct rp_error copy = { .name = err->name, .params = cJSON_Duplicate(err->params, true) };
		if (!call->msg.oneway)
			call_append_reply(call, rp_build_error(&copy), NULL, 0);
		rp_error_clear(&copy);
		call->finished = true;
	}
	/* Move the replies to the socket queue in order, then push them out. */
	for (struct rd_call *call = conn->calls; call; call = call->next)
		move_call_replies(conn, call);
	uint64_t deadline = uv_hrtime() + (uint64_t)timeout_ms * 1000000u;
	while (rp_tx_flush(&conn->tx, conn->fd) == -EAGAIN && uv_hrtime() < deadline) {
		struct pollfd p = { .fd = conn->fd, .events = POLLOUT };
		poll(&p, 1, 10);
	}
}
