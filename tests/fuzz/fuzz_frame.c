/* SPDX-License-Identifier: Apache-2.0 */
/* Framing: arbitrary bytes, split into arbitrary chunks, some with fds, go
 * through rp_rx_feed; every message popped goes through rp_call_parse.
 *
 * Input: a list of operations, each led by one byte (op = b & 3):
 *   0  feed a chunk: 2 length bytes, then that many bytes (or what is left)
 *   1  the same, with (b >> 2) % 20 fds (more than RP_FDS_MAX at times)
 *   2  feed the next byte repeated ((b >> 2) + 1) * 32 KiB times (reaches
 *      the 1 MiB limit and the discard path), without its NUL; only the
 *      first such run of an input is that long, later ones are at most
 *      ((b >> 2) + 1) * 64 bytes, so that inputs stay fast
 *   3  pop and parse every complete message now
 * Checks: no fd leaks (the receiver closes what it does not hand over),
 * messages never exceed RP_MESSAGE_MAX and hold no NUL, each fd count is
 * at most RP_FDS_MAX, every refusal is a named error, a parsed call
 * rebuilt with rp_build_call parses back to the same method, and the same
 * messages survive a real socketpair round trip through rp_tx/rp_rx_read. */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "proto/frame.h"

static int devnull = -1;
static int lowest_free_fd;

static int probe_lowest_fd(void)
{
	int fd = dup(devnull);

	FZ_CHECK(fd >= 0, "dup: %s", strerror(errno));
	close(fd);
	return fd;
}

struct seen {
	char *text[64];
	size_t len[64];
	size_t n;
	size_t bytes;
};

static void check_call(const struct rp_msg *msg)
{
	struct rp_error err = { 0 };
	struct rp_call call;
	int r = rp_call_parse(msg->text, msg->len, &call, &err);

	if (r < 0) {
		fz_check_error(r, &err, "rp_call_parse");
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(err.name == NULL, "success with an error set");
	FZ_CHECK(cJSON_IsObject(call.params), "parsed call without a parameters object");
	if (call.method != NULL) {
		struct rp_call again;
		char *text = rp_build_call(call.method, call.params, call.more, call.oneway);

		FZ_CHECK(text != NULL, "cannot rebuild a parsed call");
		r = rp_call_parse(text, strlen(text), &again, &err);
		FZ_CHECK(r == 0, "rebuilt call does not parse: %s", text);
		FZ_CHECK(strcmp(again.method, call.method) == 0 && again.more == call.more &&
			 again.oneway == call.oneway, "rebuilt call differs: %s", text);
		rp_call_finish(&again);
		free(text);
	}
	rp_call_finish(&call);
}

static void pop_all(struct rp_rx *rx, struct seen *seen)
{
	for (;;) {
		struct rp_msg msg;
		int r = rp_rx_next(rx, &msg);

		FZ_CHECK(r >= 0, "rp_rx_next: %d", r);
		if (r == RP_RX_NONE)
			break;
		FZ_CHECK(msg.nfds <= RP_FDS_MAX, "%zu fds on one message", msg.nfds);
		if (r == RP_RX_TOO_LARGE) {
			FZ_CHECK(msg.text == NULL && msg.len > RP_MESSAGE_MAX && msg.nfds == 0,
				 "too-large report with text or a small size %zu", msg.len);
		} else {
			FZ_CHECK(r == RP_RX_MESSAGE, "unknown result %d", r);
			FZ_CHECK(msg.text != NULL && msg.len <= RP_MESSAGE_MAX, "message of %zu bytes", msg.len);
			FZ_CHECK(msg.text[msg.len] == '\0' && strlen(msg.text) == msg.len, "NUL inside a message");
			for (size_t i = 0; i < msg.nfds; i++)
				FZ_CHECK(fcntl(msg.fds[i], F_GETFD) >= 0, "handed-over fd %d is not open", msg.fds[i]);
			check_call(&msg);
			if (seen != NULL && seen->n < 64 && seen->bytes + msg.len <= (512u << 10)) {
				seen->bytes += msg.len;
				seen->text[seen->n] = strdup(msg.text);
				seen->len[seen->n] = msg.len;
				seen->n++;
			}
		}
		rp_msg_finish(&msg);
	}
}

/* The messages again, through rp_tx_push/rp_tx_flush and rp_rx_read on a
 * socketpair, with an fd on every third one: same texts, same order. */
static void socket_round_trip(const struct seen *seen)
{
	struct rp_tx tx;
	struct rp_rx rx;
	size_t got = 0;
	int sv[2];

	if (seen->n == 0)
		return;
	FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
	rp_tx_init(&tx);
	rp_rx_init(&rx);
	for (size_t i = 0; i < seen->n; i++) {
		int r = rp_tx_push(&tx, seen->text[i], seen->len[i], &devnull, i % 3 == 0 ? 1 : 0);

		FZ_CHECK(r == 0, "rp_tx_push: %d", r);
	}
	while (got < seen->n) {
		int r = rp_tx_flush(&tx, sv[0]);
		ssize_t n;

		FZ_CHECK(r == 0 || r == -EAGAIN, "rp_tx_flush: %d", r);
		n = rp_rx_read(&rx, sv[1]);
		FZ_CHECK(n > 0 || n == -EAGAIN, "rp_rx_read: %zd", n);
		for (;;) {
			struct rp_msg msg;

			r = rp_rx_next(&rx, &msg);
			if (r == RP_RX_NONE)
				break;
			FZ_CHECK(r == RP_RX_MESSAGE && got < seen->n, "unexpected result %d", r);
			FZ_CHECK(msg.len == seen->len[got] && memcmp(msg.text, seen->text[got], msg.len) == 0,
				 "message %zu changed on the way", got);
			FZ_CHECK(msg.nfds == (got % 3 == 0 ? 1u : 0u) && msg.fds_dropped == 0,
				 "message %zu arrived with %zu fds", got, msg.nfds);
			rp_msg_finish(&msg);
			got++;
		}
	}
	FZ_CHECK(rp_tx_empty(&tx), "tx queue not empty after every message arrived");
	rp_tx_finish(&tx);
	rp_rx_finish(&rx);
	close(sv[0]);
	close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char *big;
	struct seen seen = { .n = 0 };
	struct rp_rx rx;
	size_t pos = 0;
	bool round_trip, long_run_done = false;

	if (devnull < 0) {
		devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
		FZ_CHECK(devnull >= 0, "open /dev/null");
		lowest_free_fd = probe_lowest_fd();
		big = malloc((size_t)64 * 32768);
		FZ_CHECK(big != NULL, "malloc");
	}
	if (size == 0)
		return 0;
	round_trip = data[pos++] & 1;
	rp_rx_init(&rx);
	while (pos < size) {
		uint8_t b = data[pos++];
		size_t len;
		int r = 0;

		switch (b & 3) {
		case 0:
		case 1: {
			int fds[20];
			size_t nfds = (b & 3) == 1 ? (size_t)(b >> 2) % 20 : 0;

			len = pos < size ? data[pos++] : 0;
			len |= pos < size ? (size_t)data[pos++] << 8 : 0;
			if (len > size - pos)
				len = size - pos;
			for (size_t i = 0; i < nfds; i++) {
				fds[i] = dup(devnull);
				FZ_CHECK(fds[i] >= 0, "dup");
			}
			r = rp_rx_feed(&rx, data + pos, len, fds, nfds);
			pos += len;
			break;
		}
		case 2: {
			char c = pos < size ? (char)data[pos++] : 'x';

			if (c == '\0')
				c = ' ';
			len = ((size_t)(b >> 2) + 1) * (long_run_done ? 64 : 32768);
			long_run_done = true;
			memset(big, c, len);
			r = rp_rx_feed(&rx, big, len, NULL, 0);
			break;
		}
		case 3:
			pop_all(&rx, round_trip ? &seen : NULL);
			break;
		}
		FZ_CHECK(r == 0, "rp_rx_feed: %d", r);
		FZ_CHECK(rx.len <= RP_MESSAGE_MAX && rx.cap <= RP_MESSAGE_MAX, "receiver holds %zu bytes", rx.cap);
	}
	/* Leave the rest queued half the time: rp_rx_finish must free it. */
	if (data[0] & 2)
		pop_all(&rx, round_trip ? &seen : NULL);
	rp_rx_finish(&rx);
	FZ_CHECK(probe_lowest_fd() == lowest_free_fd, "an fd leaked");

	if (round_trip)
		socket_round_trip(&seen);
	for (size_t i = 0; i < seen.n; i++)
		free(seen.text[i]);
	FZ_CHECK(probe_lowest_fd() == lowest_free_fd, "an fd leaked in the round trip");
	return 0;
}
