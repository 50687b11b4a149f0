/* SPDX-License-Identifier: Apache-2.0 */
/* Varlink framing: NUL-terminated messages, split and glued in any way the
 * stream likes, fds on the first byte of their message, size limits that
 * keep memory bounded and the connection alive. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/frame.h"

/* Open fds of this process; each test runs in its own fork. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] != '.')
			n++;
	}
	closedir(d);
	return n - 1;   /* the directory's own fd */
}

static int memfd_with(const char *content)
{
	int fd = memfd_create("test_frame", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
	return fd;
}

/* Asserts the fd refers to a file holding exactly `content`. */
static void assert_fd_holds(int fd, const char *content)
{
	char buf[256] = { 0 };
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	ck_assert_int_eq(n, (ssize_t)strlen(content));
	ck_assert_str_eq(buf, content);
}

static bool fd_is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* Pops the next message and asserts it is `text`. */
static void expect_message(struct rp_rx *rx, const char *text)
{
	struct rp_msg msg;

	ck_assert_int_eq(rp_rx_next(rx, &msg), RP_RX_MESSAGE);
	ck_assert_uint_eq(msg.len, strlen(text));
	ck_assert_str_eq(msg.text, text);
	ck_assert_uint_eq(msg.nfds, 0);
	rp_msg_finish(&msg);
}

static void expect_none(struct rp_rx *rx)
{
	struct rp_msg msg;

	ck_assert_int_eq(rp_rx_next(rx, &msg), RP_RX_NONE);
	ck_assert_ptr_null(msg.text);
	rp_msg_finish(&msg);
}

/* Three messages, one of them empty, as one stream. */
static const char stream[] = "{\"method\":\"a.B\"}\0\0{\"parameters\":{\"s\":\"x\\u0000y\"}}";
#define STREAM_LEN sizeof(stream)   /* includes the final NUL */

START_TEST(split_at_every_byte)
{
	for (size_t cut = 0; cut <= STREAM_LEN; cut++) {
		struct rp_rx rx;

		rp_rx_init(&rx);
		ck_assert_int_eq(rp_rx_feed(&rx, stream, cut, NULL, 0), 0);
		ck_assert_int_eq(rp_rx_feed(&rx, stream + cut, STREAM_LEN - cut, NULL, 0), 0);
		expect_message(&rx, "{\"method\":\"a.B\"}");
		expect_message(&rx, "");
		expect_message(&rx, "{\"parameters\":{\"s\":\"x\\u0000y\"}}");
		expect_none(&rx);
		rp_rx_finish(&rx);
	}
}
END_TEST

START_TEST(one_byte_at_a_time)
{
	struct rp_rx rx;
	struct rp_msg msg;

	rp_rx_init(&rx);
	for (size_t i = 0; i < STREAM_LEN; i++) {
		ck_assert_int_eq(rp_rx_feed(&rx, stream + i, 1, NULL, 0), 0);
		/* A message is complete exactly when its NUL arrives. */
		if (i < 16)
			ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_NONE);
	}
	expect_message(&rx, "{\"method\":\"a.B\"}");
	expect_message(&rx, "");
	expect_message(&rx, "{\"parameters\":{\"s\":\"x\\u0000y\"}}");
	expect_none(&rx);
	rp_rx_finish(&rx);
}
END_TEST

START_TEST(many_messages_in_one_feed)
{
	enum { N = 1000 };
	char *buf = malloc(N * 32), *p = buf;
	struct rp_rx rx;

	for (int i = 0; i < N; i++)
		p += sprintf(p, "{\"n\":%d}", i) + 1;   /* keep the NUL */
	rp_rx_init(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, buf, (size_t)(p - buf), NULL, 0), 0);
	for (int i = 0; i < N; i++) {
		char want[32];

		sprintf(want, "{\"n\":%d}", i);
		expect_message(&rx, want);
	}
	expect_none(&rx);
	rp_rx_finish(&rx);
	free(buf);
}
END_TEST

START_TEST(incomplete_message_stays_buffered)
{
	struct rp_rx rx;

	rp_rx_init(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "{\"a\":", 5, NULL, 0), 0);
	expect_none(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "1}", 2, NULL, 0), 0);
	expect_none(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "", 1, NULL, 0), 0);
	expect_message(&rx, "{\"a\":1}");
	rp_rx_finish(&rx);
}
END_TEST

/* Feeds a message of `len` 'x' bytes in 64 KiB pieces, then its NUL,
 * checking the receiver never holds more than the limit. */
static void feed_big(struct rp_rx *rx, size_t len)
{
	static char chunk[65536];
	size_t left = len;

	memset(chunk, 'x', sizeof(chunk));
	while (left > 0) {
		size_t n = left < sizeof(chunk) ? left : sizeof(chunk);

		ck_assert_int_eq(rp_rx_feed(rx, chunk, n, NULL, 0), 0);
		ck_assert_uint_le(rx->cap, RP_MESSAGE_MAX);
		left -= n;
	}
	ck_assert_int_eq(rp_rx_feed(rx, "", 1, NULL, 0), 0);
}

START_TEST(message_of_exactly_the_limit_is_accepted)
{
	struct rp_rx rx;
	struct rp_msg msg;

	rp_rx_init(&rx);
	feed_big(&rx, RP_MESSAGE_MAX);
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_MESSAGE);
	ck_assert_uint_eq(msg.len, RP_MESSAGE_MAX);
	ck_assert_int_eq(msg.text[RP_MESSAGE_MAX - 1], 'x');
	ck_assert_int_eq(msg.text[RP_MESSAGE_MAX], '\0');
	rp_msg_finish(&msg);
	rp_rx_finish(&rx);
}
END_TEST

START_TEST(one_byte_over_the_limit_is_refused_and_the_next_message_parses)
{
	struct rp_rx rx;
	struct rp_msg msg;

	rp_rx_init(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "{}", 3, NULL, 0), 0);
	feed_big(&rx, RP_MESSAGE_MAX + 1);
	ck_assert_int_eq(rp_rx_feed(&rx, "{\"after\":1}", 12, NULL, 0), 0);

	/* In stream order: the message before, the report, the one after. */
	expect_message(&rx, "{}");
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_TOO_LARGE);
	ck_assert_ptr_null(msg.text);
	ck_assert_uint_eq(msg.len, RP_MESSAGE_MAX + 1);
	rp_msg_finish(&msg);
	expect_message(&rx, "{\"after\":1}");
	expect_none(&rx);
	rp_rx_finish(&rx);
}
END_TEST

START_TEST(huge_message_streams_through_in_bounded_memory)
{
	struct rp_rx rx;
	struct rp_msg msg;

	rp_rx_init(&rx);
	/* 8 MiB without a NUL: dropped as it comes, reported once at its end. */
	feed_big(&rx, 8 * RP_MESSAGE_MAX);
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_TOO_LARGE);
	ck_assert_uint_eq(msg.len, 8 * RP_MESSAGE_MAX);
	rp_msg_finish(&msg);
	expect_none(&rx);

	/* The oversized message ends mid-feed, the next one is whole. */
	{
		size_t n = RP_MESSAGE_MAX + 100;
		char *big = malloc(n + 8);

		memset(big, 'y', n);
		memcpy(big + n, "\0{}\0{", 5);
		ck_assert_int_eq(rp_rx_feed(&rx, big, n + 5, NULL, 0), 0);
		ck_assert_uint_le(rx.cap, RP_MESSAGE_MAX);
		free(big);
	}
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_TOO_LARGE);
	rp_msg_finish(&msg);
	expect_message(&rx, "{}");
	expect_none(&rx);
	rp_rx_finish(&rx);
}
END_TEST

START_TEST(fds_go_to_the_message_starting_in_their_read)
{
	int before = count_fds();
	int a = memfd_with("A"), b = memfd_with("B");
	struct rp_rx rx;
	struct rp_msg msg;

	rp_rx_init(&rx);
	/* The tail of one message, then a whole one carrying fd a. */
	ck_assert_int_eq(rp_rx_feed(&rx, "{\"x\":", 5, NULL, 0), 0);
	ck_assert_int_eq(rp_rx_feed(&rx, "1}\0{\"y\":2}", 11, (int[]){ a }, 1), 0);
	/* A read that starts exactly at a message's first byte. */
	ck_assert_int_eq(rp_rx_feed(&rx, "{\"z\":3}", 8, (int[]){ b }, 1), 0);

	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_MESSAGE);
	ck_assert_str_eq(msg.text, "{\"x\":1}");
	ck_assert_uint_eq(msg.nfds, 0);
	rp_msg_finish(&msg);

	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_MESSAGE);
	ck_assert_str_eq(msg.text, "{\"y\":2}");
	ck_assert_uint_eq(msg.nfds, 1);
	assert_fd_holds(msg.fds[0], "A");
	rp_msg_finish(&msg);

	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_MESSAGE);
	ck_assert_str_eq(msg.text, "{\"z\":3}");
	ck_assert_uint_eq(msg.nfds, 1);
	assert_fd_holds(msg.fds[0], "B");
	rp_msg_finish(&msg);

	rp_rx_finish(&rx);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

START_TEST(fds_with_no_message_start_are_closed)
{
	int before = count_fds();
	int a = memfd_with("A");
	struct rp_rx rx;

	rp_rx_init(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "{\"x\":", 5, NULL, 0), 0);
	/* Middle of a message, then its NUL as the last byte: nothing starts
	 * here, so nothing can own the fd. */
	ck_assert_int_eq(rp_rx_feed(&rx, "1}", 3, (int[]){ a }, 1), 0);
	ck_assert(!fd_is_open(a));
	expect_message(&rx, "{\"x\":1}");
	rp_rx_finish(&rx);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

START_TEST(more_than_fds_max_are_closed_and_counted)
{
	int before = count_fds();
	int fds[RP_FDS_MAX + 4];
	struct rp_rx rx;
	struct rp_msg msg;

	for (int i = 0; i < RP_FDS_MAX + 4; i++) {
		char c[8];

		sprintf(c, "%d", i);
		fds[i] = memfd_with(c);
	}
	rp_rx_init(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "{}", 3, fds, RP_FDS_MAX + 4), 0);
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_MESSAGE);
	ck_assert_uint_eq(msg.nfds, RP_FDS_MAX);
	ck_assert_uint_eq(msg.fds_dropped, 4);
	for (int i = 0; i < RP_FDS_MAX; i++) {
		char c[8];

		sprintf(c, "%d", i);
		assert_fd_holds(msg.fds[i], c);
	}
	rp_msg_finish(&msg);
	rp_rx_finish(&rx);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

START_TEST(fds_of_an_oversized_message_are_closed)
{
	int before = count_fds();
	int a = memfd_with("A"), b = memfd_with("B");
	struct rp_rx rx;
	struct rp_msg msg;

	rp_rx_init(&rx);
	ck_assert_int_eq(rp_rx_feed(&rx, "xx", 2, (int[]){ a }, 1), 0);
	ck_assert(fd_is_open(a));
	feed_big(&rx, RP_MESSAGE_MAX);
	/* Closed as soon as the message went over, not at its end. */
	ck_assert(!fd_is_open(a));
	ck_assert_int_eq(rp_rx_feed(&rx, "{}", 3, (int[]){ b }, 1), 0);
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_TOO_LARGE);
	ck_assert_uint_eq(msg.nfds, 0);
	rp_msg_finish(&msg);
	ck_assert_int_eq(rp_rx_next(&rx, &msg), RP_RX_MESSAGE);
	ck_assert_uint_eq(msg.nfds, 1);
	assert_fd_holds(msg.fds[0], "B");
	rp_msg_finish(&msg);
	rp_rx_finish(&rx);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

START_TEST(finish_closes_fds_never_handed_out)
{
	int before = count_fds();
	struct rp_rx rx;
	struct rp_tx tx;
	int a = memfd_with("A");

	rp_rx_init(&rx);
	/* One complete message with fds in the queue, one partial with fds. */
	ck_assert_int_eq(rp_rx_feed(&rx, "{}", 3, (int[]){ memfd_with("1") }, 1), 0);
	ck_assert_int_eq(rp_rx_feed(&rx, "{", 1, (int[]){ memfd_with("2") }, 1), 0);
	rp_rx_finish(&rx);

	rp_tx_init(&tx);
	ck_assert_int_eq(rp_tx_push(&tx, "{}", 2, &a, 1), 0);
	close(a);   /* the queue holds its own dup */
	rp_tx_finish(&tx);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

START_TEST(msg_finish_closes_only_the_first_nfds)
{
	int mine = memfd_with("mine"), other = memfd_with("other");
	struct rp_msg msg = { 0 };

	/* Callers zero-initialise rp_msg: fds[] beyond nfds is not ours. */
	msg.fds[0] = other;
	rp_msg_finish(&msg);
	ck_assert(fd_is_open(other));
	ck_assert_int_eq(msg.fds[0], -1);

	/* A claimed fd (set to -1) is skipped, the rest closed. */
	msg.fds[0] = -1;
	msg.fds[1] = mine;
	msg.nfds = 2;
	rp_msg_finish(&msg);
	ck_assert(!fd_is_open(mine));
	ck_assert(fd_is_open(other));
	ck_assert_uint_eq(msg.nfds, 0);
	close(other);
}
END_TEST

START_TEST(push_refuses_bad_input)
{
	int fds[RP_FDS_MAX + 1];
	struct rp_tx tx;

	for (int i = 0; i <= RP_FDS_MAX; i++)
		fds[i] = 0;
	rp_tx_init(&tx);
	ck_assert_int_eq(rp_tx_push(&tx, "{}", 2, fds, RP_FDS_MAX + 1), -EINVAL);
	ck_assert_int_eq(rp_tx_push(&tx, "{}\0{}", 5, NULL, 0), -EINVAL);
	ck_assert_int_eq(rp_tx_push(&tx, "{}", 2, (int[]){ 9999 }, 1), -EBADF);
	ck_assert(rp_tx_empty(&tx));
	ck_assert_uint_eq(tx.queued_bytes, 0);
	rp_tx_finish(&tx);
}
END_TEST

static void make_pair(int sv[2], bool nonblock)
{
	int type = SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0);

	ck_assert_int_eq(socketpair(AF_UNIX, type, 0, sv), 0);
}

/* Reads until n messages arrived, into msgs. */
static void read_messages(struct rp_rx *rx, int sock, struct rp_msg *msgs, int n)
{
	int got = 0;

	while (got < n) {
		int r = rp_rx_next(rx, &msgs[got]);

		if (r == RP_RX_MESSAGE) {
			got++;
			continue;
		}
		ck_assert_int_eq(r, RP_RX_NONE);
		ck_assert_int_gt(rp_rx_read(rx, sock), 0);
	}
}

START_TEST(fds_over_a_socket_each_message_gets_its_own)
{
	int before = count_fds();
	int sv[2], a1 = memfd_with("a1"), a2 = memfd_with("a2"), b1 = memfd_with("b1");
	struct rp_tx tx;
	struct rp_rx rx;
	struct rp_msg m[3];

	make_pair(sv, false);
	rp_tx_init(&tx);
	rp_rx_init(&rx);
	ck_assert_int_eq(rp_tx_push(&tx, "{\"first\":1}", 11, (int[]){ a1, a2 }, 2), 0);
	ck_assert_int_eq(rp_tx_push(&tx, "{\"second\":2}", 12, (int[]){ b1 }, 1), 0);
	ck_assert_int_eq(rp_tx_push(&tx, "{\"third\":3}", 11, NULL, 0), 0);
	ck_assert_int_eq(rp_tx_flush(&tx, sv[0]), 0);
	ck_assert(rp_tx_empty(&tx));
	close(a1);
	close(a2);
	close(b1);

	read_messages(&rx, sv[1], m, 3);
	ck_assert_str_eq(m[0].text, "{\"first\":1}");
	ck_assert_uint_eq(m[0].nfds, 2);
	assert_fd_holds(m[0].fds[0], "a1");
	assert_fd_holds(m[0].fds[1], "a2");
	ck_assert_str_eq(m[1].text, "{\"second\":2}");
	ck_assert_uint_eq(m[1].nfds, 1);
	assert_fd_holds(m[1].fds[0], "b1");
	ck_assert_str_eq(m[2].text, "{\"third\":3}");
	ck_assert_uint_eq(m[2].nfds, 0);
	/* Received fds are close-on-exec. */
	ck_assert_int_eq(fcntl(m[0].fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	for (int i = 0; i < 3; i++)
		rp_msg_finish(&m[i]);

	rp_tx_finish(&tx);
	rp_rx_finish(&rx);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

/* Linux glues fd-less bytes in front of an fd-carrying segment into one
 * read: a whole message without fds, then the start of one with fds. The
 * fds belong to the second, the last message starting in the read. */
START_TEST(fds_after_a_glued_fdless_message_go_to_their_own)
{
	int before = count_fds();
	int sv[2], f = memfd_with("mine");
	struct rp_tx tx;
	struct rp_rx rx;
	struct rp_msg m[2];

	make_pair(sv, false);
	rp_tx_init(&tx);
	rp_rx_init(&rx);
	ck_assert_int_eq(rp_tx_push(&tx, "{\"plain\":1}", 11, NULL, 0), 0);
	ck_assert_int_eq(rp_tx_push(&tx, "{\"withfd\":1}", 12, &f, 1), 0);
	ck_assert_int_eq(rp_tx_flush(&tx, sv[0]), 0);
	close(f);

	/* One read takes both. */
	ck_assert_int_eq(rp_rx_read(&rx, sv[1]), 12 + 13);
	ck_assert_int_eq(rp_rx_next(&rx, &m[0]), RP_RX_MESSAGE);
	ck_assert_int_eq(rp_rx_next(&rx, &m[1]), RP_RX_MESSAGE);
	ck_assert_str_eq(m[0].text, "{\"plain\":1}");
	ck_assert_uint_eq(m[0].nfds, 0);
	ck_assert_str_eq(m[1].text, "{\"withfd\":1}");
	ck_assert_uint_eq(m[1].nfds, 1);
	assert_fd_holds(m[1].fds[0], "mine");
	rp_msg_finish(&m[0]);
	rp_msg_finish(&m[1]);

	rp_tx_finish(&tx);
	rp_rx_finish(&rx);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), before);
}
END_TEST

/* Queues n messages (message i: len[i] bytes of one letter, and where
 * with_fd[i] a memfd holding "fd<i>") on a socket with a 4 KiB send buffer,
 * alternating writes of what it takes with reads of what arrived, and
 * checks that every message arrives whole, in order, with its fd, and that
 * no fd is left behind. Returns how many write-and-read rounds it took. */
static int pump_through_small_buffer(int n, const size_t *len, const bool *with_fd)
{
	int before = count_fds();
	int sv[2], sndbuf = 4096;
	char **texts = calloc((size_t)n, sizeof(*texts));
	struct rp_msg *m = calloc((size_t)n, sizeof(*m));
	struct rp_tx tx;
	struct rp_rx rx;
	int got = 0, spins = 0;

	ck_assert(texts && m);
	make_pair(sv, true);
	ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
	rp_tx_init(&tx);
	rp_rx_init(&rx);
	for (int i = 0; i < n; i++) {
		char content[16];
		int fd = -1;

		texts[i] = malloc(len[i] + 1);
		ck_assert(texts[i]);
		memset(texts[i], 'a' + i % 26, len[i]);
		texts[i][len[i]] = '\0';
		if (with_fd[i]) {
			sprintf(content, "fd%d", i);
			fd = memfd_with(content);
		}
		ck_assert_int_eq(rp_tx_push(&tx, texts[i], len[i], &fd, fd >= 0 ? 1 : 0), 0);
		if (fd >= 0)
			close(fd);
	}
	while (got < n) {
		int r = rp_tx_flush(&tx, sv[0]);
		ssize_t k;

		ck_assert(r == 0 || r == -EAGAIN);
		while ((k = rp_rx_read(&rx, sv[1])) > 0)
			;
		ck_assert_int_eq(k, -EAGAIN);
		while (got < n && rp_rx_next(&rx, &m[got]) == RP_RX_MESSAGE)
			got++;
		ck_assert_int_lt(++spins, 100000);
	}
	ck_assert(rp_tx_empty(&tx));
	ck_assert_uint_eq(tx.queued_bytes, 0);
	for (int i = 0; i < n; i++) {
		ck_assert_uint_eq(m[i].len, len[i]);
		ck_assert_str_eq(m[i].text, texts[i]);
		if (with_fd[i]) {
			char content[16];

			sprintf(content, "fd%d", i);
			ck_assert_uint_eq(m[i].nfds, 1);
			assert_fd_holds(m[i].fds[0], content);
		} else {
			ck_assert_uint_eq(m[i].nfds, 0);
		}
		rp_msg_finish(&m[i]);
		free(texts[i]);
	}
	free(texts);
	free(m);
	rp_tx_finish(&tx);
	rp_rx_finish(&rx);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), before);
	return spins;
}

/* Large messages, each with an fd, through a small send buffer. */
START_TEST(partial_writes_with_a_small_send_buffer)
{
	enum { N = 6, BIG = 300 * 1024 };
	size_t len[N];
	bool with_fd[N];

	for (int i = 0; i < N; i++) {
		len[i] = (i % 2) ? BIG : 20;
		with_fd[i] = true;
	}
	/* It really was written in pieces. */
	ck_assert_int_gt(pump_through_small_buffer(N, len, with_fd), 2);
}
END_TEST

/* Messages without fds go out many to a write; one with fds goes on its
 * own. Through a small send buffer (writes that stop inside a batch, inside
 * a message) every message still arrives whole, in order, with its fds. */
START_TEST(batched_writes_keep_order_and_fds)
{
	enum { N = 40 };
	size_t len[N];
	bool with_fd[N];

	for (int i = 0; i < N; i++) {
		len[i] = 10 + (size_t)(i * 997) % 3000;
		with_fd[i] = i % 7 == 3;
	}
	ck_assert_int_gt(pump_through_small_buffer(N, len, with_fd), 1);
}
END_TEST

/* Twenty small replies queued together take one write. */
START_TEST(queued_messages_without_fds_go_in_one_write)
{
	int sv[2];
	struct rp_tx tx;
	char buf[4096];

	/* A packet socket keeps each sendmsg() a record of its own. */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	rp_tx_init(&tx);
	for (int i = 0; i < 20; i++)
		ck_assert_int_eq(rp_tx_push(&tx, "{\"parameters\":{}}", 17, NULL, 0), 0);
	ck_assert_int_eq(rp_tx_flush(&tx, sv[0]), 0);
	ck_assert_int_eq(recv(sv[1], buf, sizeof(buf), 0), 20 * 18);
	ck_assert_int_eq(recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT), -1);
	rp_tx_finish(&tx);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

START_TEST(end_of_stream_and_errors)
{
	int sv[2];
	struct rp_rx rx;
	struct rp_tx tx;

	make_pair(sv, true);
	rp_rx_init(&rx);
	rp_tx_init(&tx);
	ck_assert_int_eq(rp_rx_read(&rx, sv[1]), -EAGAIN);
	close(sv[0]);
	ck_assert_int_eq(rp_rx_read(&rx, sv[1]), 0);
	/* Writing to a closed peer is an error, not a SIGPIPE. */
	ck_assert_int_eq(rp_tx_push(&tx, "{}", 2, NULL, 0), 0);
	ck_assert_int_eq(rp_tx_flush(&tx, sv[1]), -EPIPE);
	ck_assert(!rp_tx_empty(&tx));
	rp_tx_finish(&tx);
	rp_rx_finish(&rx);
	close(sv[1]);
	ck_assert_int_eq(rp_rx_read(&rx, sv[1]), -EBADF);
}
END_TEST

static Suite *frame_suite(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("rx");

	tcase_add_test(tc, split_at_every_byte);
	tcase_add_test(tc, one_byte_at_a_time);
	tcase_add_test(tc, many_messages_in_one_feed);
	tcase_add_test(tc, incomplete_message_stays_buffered);
	tcase_add_test(tc, message_of_exactly_the_limit_is_accepted);
	tcase_add_test(tc, one_byte_over_the_limit_is_refused_and_the_next_message_parses);
	tcase_add_test(tc, huge_message_streams_through_in_bounded_memory);
	tcase_add_test(tc, fds_go_to_the_message_starting_in_their_read);
	tcase_add_test(tc, fds_with_no_message_start_are_closed);
	tcase_add_test(tc, more_than_fds_max_are_closed_and_counted);
	tcase_add_test(tc, fds_of_an_oversized_message_are_closed);
	tcase_add_test(tc, finish_closes_fds_never_handed_out);
	tcase_add_test(tc, msg_finish_closes_only_the_first_nfds);
	suite_add_tcase(s, tc);

	tc = tcase_create("socket");
	tcase_add_test(tc, push_refuses_bad_input);
	tcase_add_test(tc, fds_over_a_socket_each_message_gets_its_own);
	tcase_add_test(tc, fds_after_a_glued_fdless_message_go_to_their_own);
	tcase_add_test(tc, partial_writes_with_a_small_send_buffer);
	tcase_add_test(tc, batched_writes_keep_order_and_fds);
	tcase_add_test(tc, queued_messages_without_fds_go_in_one_write);
	tcase_add_test(tc, end_of_stream_and_errors);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(frame_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
