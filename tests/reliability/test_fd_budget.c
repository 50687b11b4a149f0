/* SPDX-License-Identifier: Apache-2.0 */
/* The fds a uid's connections hold in messages read and not yet handled
 * are bounded per uid (daemon/conn.c, USER_FDS_MAX: 256), not per
 * connection.
 *
 * As uid nobody, CONNS connections to the main socket each open a Watch
 * (a call that never ends: every reply behind it is held) and then send,
 * in one sendmsg, HELD Generation calls and one more that carries
 * RP_FDS_MAX (16) fds. regend reads the lot in one read (the fds belong to
 * the last message that starts in it), answers the first 256 Generations,
 * holds their replies behind the Watch, and stops handling the
 * connection: the rest, the last message and its fds with it, wait in its
 * receive buffer for as long as the client does not read. Nobody reads.
 *
 * - The supervisor's fd count (read from /proc by root) grows by less than
 *   FD_GROWTH_MAX: past 256 fds none of nobody's connections is read, so
 *   the rest of its fds stay in the kernel, counted against nobody.
 *   Counted per connection only, it would hold CONNS x 16 = 768 more.
 * - Root connects and is served on the main socket meanwhile.
 * - Once nobody closes its connections the supervisor is back near where
 *   it was. */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define CONNS 48
#define HELD 300
/* 256 fds, a message's 16 past it, the sockets of CONNS connections and
 * slack for the log and the workers' channels. */
#define FD_GROWTH_MAX (256 + 16 + CONNS + 32)
#define FD_SLACK_AFTER 16

static const char generation[] = "{\"method\":\"io.regen.Device.Generation\",\"parameters\":{}}";

static struct tl_daemon daemon_;
static int ready_pipe[2], done_pipe[2];

static int holding_client(void *arg)
{
	static char batch[(HELD + 1) * sizeof(generation)];
	const char *path = arg;
	struct tl_conn c[CONNS];
	int fds[RP_FDS_MAX];
	size_t len = 0;
	char byte;

	tl_become_nobody(0, false);
	for (int i = 0; i < RP_FDS_MAX; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	/* HELD + 1 calls, each with its NUL: the fds go with the one write. */
	for (int i = 0; i <= HELD; i++) {
		memcpy(batch + len, generation, sizeof(generation));
		len += sizeof(generation);
	}
	/* Every Watch first: once the uid holds 256 fds none of its
	 * connections is read, a new one's Watch included. */
	for (int k = 0; k < CONNS; k++) {
		char *text;

		ASSERT_OK(tl_conn_open(&c[k], path), "connect %d", k);
		/* tl_send cannot set "more": the Watch goes by hand. */
		ASSERT_EQ(tl_send_text(&c[k], "{\"method\":\"io.regen.Device.Watch\",\"more\":true}", NULL, 0), 0,
			  "send the Watch");
		text = tl_recv_text(&c[k], 10);
		ASSERT(text != NULL, "no first Watch reply on connection %d", k);
		free(text);
	}
	for (int k = 0; k < CONNS; k++)
		ASSERT_EQ(tl_send_bytes(&c[k], batch, len, fds, RP_FDS_MAX), 0, "send %d calls, the last with fds", HELD + 1);
	ASSERT_EQ(write(ready_pipe[1], "x", 1), 1, "tell the parent");
	/* Holds everything, reading nothing, until the parent has looked. */
	ASSERT_EQ(read(done_pipe[0], &byte, 1), 1, "wait for the parent");
	for (int k = 0; k < CONNS; k++)
		tl_conn_close(&c[k]);
	return 0;
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", NULL };
	struct tl_proc before, during, after;
	char byte;

	tl_init(120);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	usleep(300000);   /* the readiness probe's connection is gone by now */
	tl_proc_read(daemon_.pid, &before);
	ASSERT_EQ(pipe2(ready_pipe, O_CLOEXEC), 0, "pipe");
	ASSERT_EQ(pipe2(done_pipe, O_CLOEXEC), 0, "pipe");
	pid_t client = tl_fork(holding_client, daemon_.sock, 0);
	struct pollfd ready = { .fd = ready_pipe[0], .events = POLLIN };
	ASSERT_EQ(poll(&ready, 1, 30000), 1, "the client did not send its calls within 30 s");
	ASSERT_EQ(read(ready_pipe[0], &byte, 1), 1, "the client did not send its calls");
	/* The most the supervisor holds over the next 500 ms. */
	long most = before.fds;
	for (double end = tl_now() + 0.5; tl_now() < end; usleep(10000)) {
		tl_proc_read(daemon_.pid, &during);
		most = during.fds > most ? during.fds : most;
	}
	struct tl_conn other;
	struct tl_reply r;
	double t0 = tl_now();
	ASSERT_OK(tl_conn_open(&other, daemon_.sock), "connect as root");
	tl_call(&other, &r, 10, NULL, 0, "io.regen.Device.Generation", NULL);
	ASSERT_REPLY_OK(&r, "root's Generation while nobody's fds wait");
	tl_reply_finish(&r);
	double served = tl_now() - t0;
	tl_conn_close(&other);
	ASSERT_EQ(write(done_pipe[1], "x", 1), 1, "release the client");
	ASSERT_EQ(tl_wait(client, 30), 0, "the client failed");
	double deadline = tl_now() + 5;
	do {
		usleep(50000);
		tl_proc_read(daemon_.pid, &after);
	} while (after.fds - before.fds > FD_SLACK_AFTER && tl_now() < deadline);
	tl_log("%d connections of nobody, each a Watch and %d calls behind it, the last with %d fds: the supervisor's fds "
	       "%ld -> at most %ld -> %ld once they closed; root served in %.1f ms", CONNS, HELD + 1, RP_FDS_MAX,
	       before.fds, most, after.fds, served * 1e3);
	ASSERT_LT(most - before.fds, FD_GROWTH_MAX,
		  "the supervisor held %ld more fds for one uid's connections: the fds are not bounded per uid",
		  most - before.fds);
	ASSERT_LT(after.fds - before.fds, FD_SLACK_AFTER, "the supervisor kept %ld fds once nobody's connections closed",
		  after.fds - before.fds);
	tl_log("PASS");
	return 0;
}
