/* SPDX-License-Identifier: Apache-2.0 */
/* Dispatch: the bytes as a client's stream of Varlink messages into a real
 * connection (daemon/conn.c) of each of regend's endpoints in turn, set up
 * in this process (fuzz_inproc.c): a worker socket, with the worker's own
 * method table (session.c, memory.c, compute.c over the stub backend), and
 * the main socket, with the supervisor's (methods.c, watch.c, device.c with
 * healthy workers played by the harness). Each message ends at a NUL and
 * goes in a sendmsg of its own, with as many fds (dups of a memfd) as it
 * holds the letters "fd", up to 24; bytes after the last NUL go last, a
 * message begun and never ended. On the worker socket a Release, Reset or
 * Restart (refused there: they belong on the main socket) also moves the
 * worker to its next generation through its control channel, as the
 * supervisor does for such a call from any client, before the rest of the
 * stream goes. A message that is the three letters HUP is not sent: once
 * nothing moves, the client stops reading (shutdown SHUT_RD: the daemon's
 * next write fails, while a Watch announces or a compute call completes)
 * and sends the rest, if the daemon still takes it. The loop runs until
 * nothing moves.
 *
 * Invariants: every message gets exactly one reply, in order, except a
 * oneway call (none) and a Watch (replies that continue until the
 * connection closes, holding every reply after it); a message that does
 * not parse gets the parser's own error, one whose fds were dropped
 * LimitExceeded; every reply is valid UTF-8, parses as a Varlink reply
 * and, when an error, is one the IDL declares with exactly the IDL's
 * parameters; "continues" only for a call that asked for more; nothing is
 * left when the client has gone (objects, lanes, calls, handles, fds,
 * memory). After a HUP only the last holds (and no memory error). */
#include <errno.h>
#include <sys/socket.h>
#include "fuzz_daemon.h"
#include "daemon/log.h"
#include "proto/errors.h"
#include "proto/frame.h"

#define MESSAGES_MAX 65536

struct message {
	const char *text;
	size_t len;                     /* without the NUL */
	unsigned nfds;
	bool reply;                     /* one is due */
	const char *parse_error;        /* the parser's refusal, if any */
	bool more;
	int lifecycle;                  /* 0, or 1 + whether a Reset: a Release, Reset or Restart */
	bool hup;                       /* the client stops reading here */
	char method[64];
};

static struct message messages[MESSAGES_MAX];
/* FUZZ_VERBOSE=1: every reply on stderr. */
static bool verbose;

struct run {
	enum fz_endpoint endpoint;
	struct message *msgs;
	size_t nmsgs;
	size_t next_reply;              /* the message whose reply is due */
	bool streaming;                 /* that message's replies continue */
	unsigned replies;
};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	rd_log_init("fuzz", getenv("REGEN_DEBUG") ? getenv("REGEN_DEBUG") : "E");
	fz_idl_errors_load();
	fz_inproc_init();
	verbose = getenv("FUZZ_VERBOSE") != NULL;
	return 0;
}

static unsigned count_fds(const char *text, size_t len)
{
	unsigned n = 0;

	for (size_t i = 0; i + 1 < len; i++)
		n += text[i] == 'f' && text[i + 1] == 'd';
	return n < FZ_SEND_FDS_MAX ? n : FZ_SEND_FDS_MAX;
}

/* What the connection will answer, worked out from the message alone. */
static void expect(struct message *m)
{
	struct rp_error err = { 0 };
	struct rp_call call;

	if (m->len == 3 && memcmp(m->text, "HUP", 3) == 0) {
		m->hup = true;
		return;
	}
	m->reply = true;
	if (m->nfds > RP_FDS_MAX) {
		m->parse_error = RP_ERR_LIMIT_EXCEEDED;
		return;
	}
	if (rp_call_parse(m->text, m->len, &call, &err) < 0) {
		m->parse_error = err.name;
		rp_error_clear(&err);
		return;
	}
	if (call.method) {
		snprintf(m->method, sizeof(m->method), "%s", call.method);
		if (strcmp(call.method, "io.regen.Device.Release") == 0 || strcmp(call.method, "io.regen.Device.Restart") == 0)
			m->lifecycle = 1;
		else if (strcmp(call.method, "io.regen.Device.Reset") == 0)
			m->lifecycle = 2;
		m->reply = !call.oneway;
		m->more = call.more;
	} else {
		/* A reply where a call was due: refused by name. */
		m->parse_error = RP_ERR_INVALID_MESSAGE;
	}
	rp_call_finish(&call);
}

static void next_due(struct run *run)
{
	while (run->next_reply < run->nmsgs && !run->msgs[run->next_reply].reply)
		run->next_reply++;
}

static void on_reply(const char *text, size_t len, void *data)
{
	struct run *run = data;
	struct message *m;
	struct rp_call reply;
	char where[128];

	next_due(run);
	snprintf(where, sizeof(where), "%s socket, reply %u", run->endpoint == FZ_WORKER ? "worker" : "main",
		 run->replies);
	if (verbose)
		fprintf(stderr, "%s: %.*s\n", where, (int)len, text);
	fz_check_reply(text, len, &reply, where);
	FZ_CHECK(run->next_reply < run->nmsgs, "%s: a reply with no call left to answer: %.*s", where,
		 (int)(len > 200 ? 200 : len), text);
	m = &run->msgs[run->next_reply];
	if (m->parse_error) {
		FZ_CHECK(reply.error && strcmp(reply.error, m->parse_error) == 0,
			 "%s: message %zu (%.*s) wants %s, got %.*s", where, run->next_reply, (int)(m->len > 100 ? 100 : m->len),
			 m->text, m->parse_error, (int)(len > 200 ? 200 : len), text);
	}
	if (reply.continues) {
		FZ_CHECK(m->more && !reply.error, "%s: %s continues without being asked for more", where, m->method);
		run->streaming = true;
	} else {
		run->streaming = false;
		run->next_reply++;
	}
	run->replies++;
	rp_call_finish(&reply);
}

static void run_endpoint(enum fz_endpoint endpoint, struct message *msgs, size_t nmsgs, const char *tail,
			 size_t tail_len)
{
	struct run run = { .endpoint = endpoint, .msgs = msgs, .nmsgs = nmsgs };
	struct fz_client client = { .fd = -1 };
	size_t next = 0, offset = 0;
	bool tail_sent = tail_len == 0, hung = false;
	unsigned idle = 0;

	fz_inproc_start(endpoint);
	client.fd = fz_inproc_connect();
	for (;;) {
		bool progress = false;

		/* The messages, each from its first byte in a sendmsg of its own
		 * with its fds; a run of messages without fds in one. On the
		 * worker socket a Release, Reset or Restart (which belongs on the
		 * main socket) ends a run, and the worker moves to its next
		 * generation through its control channel, as the supervisor
		 * would move it for another client, before the stream goes on. */
		while (next < nmsgs && !msgs[next].hup && (endpoint != FZ_WORKER || fz_inproc_worker_idle())) {
			struct message *m = &msgs[next];
			size_t len = m->len + 1 - offset, sent;
			unsigned nfds = offset == 0 ? m->nfds : 0;
			if (nfds == 0) {
				size_t last = next;
				while (last + 1 < nmsgs && msgs[last + 1].nfds == 0 && !msgs[last + 1].hup &&
				       !msgs[last].lifecycle)
					last++;
				len = (size_t)(msgs[last].text + msgs[last].len + 1 - (m->text + offset));
			}
			sent = fz_client_send(client.fd, m->text + offset, len, nfds, hung);
			if (sent == 0)
				break;
			progress = true;
			offset += sent;
			while (next < nmsgs && offset >= msgs[next].len + 1) {
				offset -= msgs[next].len + 1;
				if (endpoint == FZ_WORKER && msgs[next].lifecycle)
					fz_inproc_worker_lifecycle(msgs[next].lifecycle == 2);
				next++;
			}
		}
		if (next == nmsgs && !tail_sent &&
		    fz_client_send(client.fd, tail, tail_len, count_fds(tail, tail_len), hung)) {
			/* Part of it may stay unsent: it never ends either way. */
			tail_sent = true;
			progress = true;
		}
		progress |= fz_inproc_pump();
		if (!hung)
			progress |= fz_client_read(&client, on_reply, &run) > 0;
		idle = progress ? 0 : idle + 1;
		if (idle < 4)
			continue;
		/* A HUP is due once nothing moves: every reply before it read. */
		if (next == nmsgs || !msgs[next].hup)
			break;
		if (!hung)
			FZ_CHECK(shutdown(client.fd, SHUT_RD) == 0, "shutdown: %s", strerror(errno));
		hung = true;
		next++;
		idle = 0;
	}
	if (hung) {
		/* The daemon may have closed the connection at its next write:
		 * what it did not take is never answered. */
		fz_client_finish(&client);
		fz_inproc_stop();
		return;
	}
	next_due(&run);
	if (!run.streaming) {
		FZ_CHECK(next == nmsgs, "the daemon stopped reading at message %zu of %zu with nothing in flight", next, nmsgs);
		FZ_CHECK(run.next_reply == nmsgs, "%s socket: message %zu (%.*s) got no reply",
			 endpoint == FZ_WORKER ? "worker" : "main", run.next_reply,
			 (int)(msgs[run.next_reply].len > 100 ? 100 : msgs[run.next_reply].len), msgs[run.next_reply].text);
	}
	FZ_CHECK(!client.eof, "the daemon closed the connection");
	fz_client_finish(&client);
	fz_inproc_stop();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data, *end = text + size, *nul;
	size_t n = 0;
	unsigned fds_before;

	while (n < MESSAGES_MAX && text < end && (nul = memchr(text, '\0', (size_t)(end - text)))) {
		struct message *m = &messages[n++];
		memset(m, 0, sizeof(*m));
		m->text = text;
		m->len = (size_t)(nul - text);
		m->nfds = count_fds(m->text, m->len);
		expect(m);
		text = nul + 1;
	}
	if (n == MESSAGES_MAX)
		return 0;
	fds_before = fz_count_fds();
	run_endpoint(FZ_WORKER, messages, n, text, (size_t)(end - text));
	run_endpoint(FZ_MAIN, messages, n, text, (size_t)(end - text));
	FZ_CHECK(fz_count_fds() == fds_before, "%u fds before, %u after", fds_before, fz_count_fds());
	return 0;
}
