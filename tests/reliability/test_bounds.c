/* SPDX-License-Identifier: Apache-2.0 */
/* Bounded memory: no client can make regend hold without bound.
 *
 * - Calls pipelined behind one that never ends: a client opens a Watch (a
 *   "more" call that lasts as long as the connection) and then writes
 *   300,000 Generation calls without reading. Their replies must wait
 *   behind the Watch's, so regend stops reading the connection once a few
 *   hundred wait (the client's writes block), and the supervisor's memory
 *   grows by less than 16 MiB. Other clients are served meanwhile, and the
 *   connection's close gives the memory back. The calls go in pieces that
 *   end inside a message, so regend stops reading with a message begun:
 *   that message's deadline (600 ms here) waits while regend does, and the
 *   connection stays open through the 2 s the client is held back.
 * - The same on a worker socket behind a long GEMM: 200,000 small Gemm
 *   calls pipelined; the worker's memory grows by less than 32 MiB beyond
 *   the two buffers the GEMM touches.
 * - Out of fds: regend's supervisor and a worker get RLIMIT_NOFILE 64 and a
 *   client opens connections until they go unanswered. For 2 s after, the
 *   two processes use under a fifth of a core and log a handful of lines
 *   (the accept loop pauses instead of spinning and logging each try); once
 *   the client closes half of them, a fresh client is served at once.
 * - Watch calls piled up: 32 connections each pipeline 1,024 Watch calls,
 *   then 10 Restarts of both devices. One Watch per connection is served;
 *   the rest are refused (LimitExceeded {resource: "watches"}, a reply
 *   held behind the first Watch's), so the supervisor grows by less than
 *   16 MiB and the Restarts take less than 2 s in all.
 * - Per-call scratch: with --max-scratch-mib 256, Attention over K/V of
 *   stride 0 in a 4 KiB buffer with Skv = 2^28 (2 GiB of host staging) is
 *   refused with LimitExceeded {resource: "scratch"} and the worker does
 *   not grow; one with Skv = 2^23 (64 MiB) runs, and its scratch is not
 *   kept by the lane afterwards.
 * - A half-sent message: a client sends the start of a call and stops.
 *   With REGEN_MESSAGE_TIMEOUT_MS=600, regend closes the connection within
 *   a few seconds of the first byte, although the client keeps sending a
 *   byte every 200 ms. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

static struct tl_daemon daemon_;

/* Writes `count` copies of msg (NUL included) without reading, until the
 * socket has taken none for `stall_s`. Returns how many were taken whole.
 * The copies go as one stream in pieces of PIECE bytes, which end inside a
 * message more often than not: regend, when it stops reading, holds the
 * start of a message, as it does from any client whose send() the full
 * socket cut short. */
#define PIECE 1000
static long write_until_stalled(int fd, const char *msg, size_t len, long count, double stall_s)
{
	uint64_t total = (uint64_t)len * (uint64_t)count, off = 0;
	double last = tl_now();
	int flags = fcntl(fd, F_GETFL);
	char piece[PIECE];

	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	while (off < total) {
		size_t n_piece = total - off < PIECE ? (size_t)(total - off) : PIECE;
		for (size_t i = 0; i < n_piece; i++)
			piece[i] = msg[(off + i) % len];
		ssize_t n = send(fd, piece, n_piece, MSG_NOSIGNAL);
		if (n > 0) {
			off += (uint64_t)n;
			last = tl_now();
			continue;
		}
		ASSERT(n < 0 && errno == EAGAIN, "send: %s", strerror(errno));
		if (tl_now() - last > stall_s)
			break;
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		poll(&p, 1, 50);
	}
	fcntl(fd, F_SETFL, flags);
	return (long)(off / len);
}

static long rss_kb(pid_t pid)
{
	struct tl_proc p;

	tl_proc_read(pid, &p);
	return p.rss_kb;
}

/* Under AddressSanitizer freed memory waits in its quarantine: growth says
 * nothing there, and the bounds below are checked only without it. */
static bool sanitized(pid_t pid)
{
	struct tl_proc p;

	tl_proc_read(pid, &p);
	return p.asan;
}

#define ASSERT_GROWTH_LT(pid, growth, limit, ...) \
	do { \
		if (!sanitized(pid)) \
			ASSERT_LT(growth, limit, __VA_ARGS__); \
	} while (0)

static pid_t worker_pid(int device)
{
	struct tl_conn c;
	struct tl_device d;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, device, &d);
	tl_conn_close(&c);
	return (pid_t)d.worker_pid;
}

static void behind_a_watch(void)
{
	static const char call[] = "{\"method\":\"io.regen.Device.Generation\",\"parameters\":{}}";
	struct tl_conn w, other;
	struct tl_reply r;
	long before, after, sent;

	/* tl_send cannot set "more": the Watch goes by hand. */
	ASSERT_OK(tl_conn_open(&w, daemon_.sock), "connect");
	static const char watch[] = "{\"method\":\"io.regen.Device.Watch\",\"more\":true}";
	ASSERT(send(w.fd, watch, sizeof(watch), MSG_NOSIGNAL) == (ssize_t)sizeof(watch), "send watch");
	usleep(200000);
	before = rss_kb(daemon_.pid);
	double t0 = tl_now();
	sent = write_until_stalled(w.fd, call, sizeof(call), 300000, 2.0);
	after = rss_kb(daemon_.pid);
	tl_log("behind a Watch: %ld of 300000 calls taken before regend stopped reading (%.1f s); supervisor RSS %ld -> %ld kB",
	       sent, tl_now() - t0, before, after);
	ASSERT_LT(sent, 300000, "regend read all 300000 calls queued behind a Watch: nothing bounds them");
	ASSERT_GROWTH_LT(daemon_.pid, after - before, 16 * 1024, "supervisor grew by %ld kB holding replies behind a Watch",
			 after - before);
	/* Others are served meanwhile. */
	ASSERT_OK(tl_conn_open(&other, daemon_.sock), "connect");
	tl_call_ok(&other, &r, "io.regen.Device.Status", NULL);
	tl_reply_finish(&r);
	tl_conn_close(&other);
	tl_conn_close(&w);
}

static void behind_a_long_gemm(void)
{
	const int big = 1536, small = 4;
	char call[512], a[64], d[64], sa[64], sd[64];
	struct tl_conn c, other;
	struct tl_reply r;
	pid_t wp = worker_pid(0);
	long before, after, sent;
	int fa = tl_memfd_open((size_t)big * big * 4), fd = tl_memfd_open((size_t)big * big * 4);
	int fsa = tl_memfd_open(small * small * 4), fsd = tl_memfd_open(small * small * 4);

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, fa, (size_t)big * big * 4, a, &r), 0, "import");
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, fd, (size_t)big * big * 4, d, &r), 0, "import");
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, fsa, small * small * 4, sa, &r), 0, "import");
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, fsd, small * small * 4, sd, &r), 0, "import");
	tl_reply_finish(&r);
	before = rss_kb(wp);
	/* Seconds of work on the host backend's lane. */
	ASSERT_EQ(tl_send(&c, "io.regen.Compute.Gemm", NULL, 0,
			 "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			 "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			 "\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
			 a, big, big, a, big, big, d, big, big), 0, "send the long GEMM");
	snprintf(call, sizeof(call),
		 "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		 "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		 "\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}}",
		 sa, small, small, sa, small, small, sd, small, small);
	sent = write_until_stalled(c.fd, call, strlen(call) + 1, 200000, 1.0);
	after = rss_kb(wp);
	tl_log("behind a long GEMM: %ld of 200000 calls taken before the worker stopped reading; worker RSS %ld -> %ld kB",
	       sent, before, after);
	ASSERT_LT(sent, 200000, "the worker read all 200000 calls queued behind a long GEMM");
	/* The GEMM itself maps and touches its two big buffers. */
	long buffers_kb = 2L * big * big * 4 / 1024;
	ASSERT_GROWTH_LT(wp, after - before - buffers_kb, 32 * 1024, "worker grew by %ld kB (beyond its %ld kB of buffers) holding calls "
	          "behind a long GEMM", after - before - buffers_kb, buffers_kb);
	ASSERT_OK(tl_conn_open(&other, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	tl_call_ok(&other, &r, "io.regen.Device.Generation", NULL);
	tl_reply_finish(&r);
	tl_conn_close(&other);
	tl_conn_close(&c);
}

/* utime + stime of a process, in clock ticks. */
static long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	ASSERT_NOT_NULL(f, "open %s", path);
	ASSERT_NOT_NULL(fgets(buf, sizeof(buf), f), "read %s", path);
	fclose(f);
	char *p = strrchr(buf, ')');
	ASSERT(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2, "parse stat");
	return (long)(ut + st);
}

static long log_size(void)
{
	struct stat st;

	return stat(daemon_.log, &st) == 0 ? (long)st.st_size : 0;
}

static void out_of_fds(const char *path, pid_t pid, const char *who)
{
	struct rlimit lim = { 64, 64 };
	struct tl_conn conns[200], fresh;
	struct tl_reply r;
	int n = 0;

	ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &lim, NULL), 0, "prlimit: %s", strerror(errno));
	/* Connect until connections stop being answered: the process has no
	 * fd left to accept them with. */
	for (; n < 200; n++) {
		ASSERT_OK(tl_conn_open(&conns[n], path), "connect %d", n);
		ASSERT_EQ(tl_send(&conns[n], "io.regen.Device.Generation", NULL, 0, NULL), 0, "send");
		if (tl_recv(&conns[n], &r, 0.5) != 0) {
			n++;
			break;
		}
		tl_reply_finish(&r);
	}
	ASSERT_LT(n, 200, "%s accepted 200 connections with 64 fds", who);
	long ticks0 = cpu_ticks(pid), log0 = log_size();
	usleep(2000000);
	long ticks = cpu_ticks(pid) - ticks0, logged = log_size() - log0;
	double share = (double)ticks / sysconf(_SC_CLK_TCK) / 2.0;
	tl_log("%s out of fds after %d connections: %.0f%% of a core and %ld bytes of log in the next 2 s", who, n,
	       share * 100, logged);
	ASSERT_DOUBLE_LT(share, 0.2, "%s used %.0f%% of a core while out of fds", who, share * 100);
	ASSERT_LT(logged, 4096, "%s wrote %ld bytes of log in 2 s while out of fds", who, logged);
	for (int i = 0; i < n; i += 2)
		tl_conn_close(&conns[i]);
	double t0 = tl_now();
	ASSERT_OK(tl_conn_open(&fresh, path), "connect fresh");
	tl_call_ok(&fresh, &r, "io.regen.Device.Generation", NULL);
	tl_reply_finish(&r);
	tl_log("%s: a fresh client served %.0f ms after fds were free again", who, (tl_now() - t0) * 1e3);
	ASSERT_DOUBLE_LT(tl_now() - t0, 1.5, "the fresh client waited %.1f s", tl_now() - t0);
	tl_conn_close(&fresh);
	for (int i = 1; i < n; i += 2)
		tl_conn_close(&conns[i]);
	lim.rlim_cur = lim.rlim_max = 4096;
	prlimit(pid, RLIMIT_NOFILE, &lim, NULL);
}

/* Seconds for 10 Restarts of every device, one after another, on admin. */
static double ten_restarts(struct tl_conn *admin)
{
	struct tl_reply r;
	double t0 = tl_now();

	for (int i = 0; i < 10; i++) {
		tl_call(admin, &r, 30, NULL, 0, "io.regen.Device.Restart", "{\"reason\":\"piled-up watches\"}");
		ASSERT(!r.error, "restart: %s", r.error);
		tl_reply_finish(&r);
	}
	return tl_now() - t0;
}

static void piled_up_watches(void)
{
	static const char watch[] = "{\"method\":\"io.regen.Device.Watch\",\"more\":true}";
	struct tl_conn conns[32], admin;
	long before, after;

	/* What 10 restarts take here, now, with no watch piled up: the
	 * machine's pace (a loaded CI runner's is not an idle one's). */
	ASSERT_OK(tl_conn_open(&admin, daemon_.sock), "connect");
	double alone = ten_restarts(&admin);
	tl_conn_close(&admin);
	before = rss_kb(daemon_.pid);
	for (int i = 0; i < 32; i++) {
		ASSERT_OK(tl_conn_open(&conns[i], daemon_.sock), "connect");
		write_until_stalled(conns[i].fd, watch, sizeof(watch), 1024, 0.5);
	}
	ASSERT_OK(tl_conn_open(&admin, daemon_.sock), "connect");
	double took = ten_restarts(&admin);
	after = rss_kb(daemon_.pid);
	tl_log("32 connections x 1024 Watch calls, then 10 restarts in %.2f s (%.2f s without the watches); supervisor "
	       "RSS %ld -> %ld kB", took, alone, before, after);
	ASSERT_GROWTH_LT(daemon_.pid, after - before, 16 * 1024, "the supervisor grew by %ld kB", after - before);
	/* The piled-up watches must not slow the restarts: at most twice as
	 * long as without them, and a second. */
	if (!sanitized(daemon_.pid))
		ASSERT(took < 2.0 * alone + 1.0, "10 restarts took %.1f s behind the watches, %.1f s without", took,
		       alone);
	for (int i = 0; i < 32; i++)
		tl_conn_close(&conns[i]);
	tl_conn_close(&admin);
}

static void attention_with_skv(struct tl_conn *c, struct tl_reply *r, const char *kv, const char *q, const char *o,
			       long skv)
{
	tl_call(c, r, 60, NULL, 0, "io.regen.Compute.Attention",
		"{\"q\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,1,1]},"
		"\"k\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,%ld,1],\"strides\":[0,0,0,1]},"
		"\"v\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,%ld,1],\"strides\":[0,0,0,1]},"
		"\"o\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,1,1]}}",
		q, kv, skv, kv, skv, o);
}

static void scratch_cap(void)
{
	struct tl_conn c;
	struct tl_reply r;
	char kv[64], q[64], o[64];
	pid_t wp = worker_pid(1);
	long before, after;

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 1)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 1, tl_memfd_open(4096), 4096, kv, &r), 0, "import");
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 1, tl_memfd_open(4096), 4096, q, &r), 0, "import");
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 1, tl_memfd_open(4096), 4096, o, &r), 0, "import");
	tl_reply_finish(&r);
	before = rss_kb(wp);
	attention_with_skv(&c, &r, kv, q, o, 1L << 28);
	ASSERT_REPLY_ERROR(&r, "io.regen.LimitExceeded", "Skv 2^28: got %s, expected LimitExceeded",
	                   r.error ? r.error : "success");
	ASSERT(strcmp(tl_reply_str(&r, "resource"), "scratch") == 0 && tl_reply_int(&r, "limit") == 256L << 20,
	       "LimitExceeded names %s, limit %lld", tl_reply_str(&r, "resource"), (long long)tl_reply_int(&r, "limit"));
	tl_reply_finish(&r);
	after = rss_kb(wp);
	ASSERT_GROWTH_LT(wp, after - before, 16 * 1024, "the refused call grew the worker by %ld kB", after - before);
	attention_with_skv(&c, &r, kv, q, o, 1L << 23);
	ASSERT(!r.error, "Skv 2^23 within the cap: %s", r.error);
	tl_reply_finish(&r);
	after = rss_kb(wp);
	tl_log("scratch cap: Skv 2^28 refused by name; Skv 2^23 (64 MiB of staging) ran; worker RSS %ld -> %ld kB after",
	       before, after);
	ASSERT_GROWTH_LT(wp, after - before, 32 * 1024, "the lane kept %ld kB after a large call", after - before);
	tl_conn_close(&c);
}

static void half_sent(void)
{
	static const char start[] = "{\"method\":\"io.regen.Device.Sta";
	struct tl_conn c;
	double t0 = tl_now();
	bool closed = false;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	ASSERT(send(c.fd, start, sizeof(start) - 1, MSG_NOSIGNAL) > 0, "send");
	/* A byte now and then must not keep the message alive. */
	while (tl_now() - t0 < 10 && !closed) {
		char buf[256];
		struct pollfd p = { .fd = c.fd, .events = POLLIN };
		if (poll(&p, 1, 200) > 0 && recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
			closed = true;
		else if (!closed)
			closed = send(c.fd, " ", 1, MSG_NOSIGNAL) < 0;
	}
	ASSERT(closed, "a half-sent message kept its connection open for 10 s");
	tl_log("half-sent message: connection closed %.1f s after its first byte", tl_now() - t0);
	ASSERT_DOUBLE_LT(tl_now() - t0, 5, "closed only after %.1f s", tl_now() - t0);
	tl_conn_close(&c);
}

int main(void)
{
	static const char *const extra[] = { "--max-scratch-mib", "256", NULL };

	tl_init(240);
	setenv("REGEN_MESSAGE_TIMEOUT_MS", "600", 1);
	/* The daemon's own log level: what it writes out of fds is measured. */
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra, .debug = "W" });
	behind_a_watch();
	behind_a_long_gemm();
	half_sent();
	piled_up_watches();
	scratch_cap();
	out_of_fds(daemon_.sock, daemon_.pid, "the supervisor");
	out_of_fds(tl_daemon_worker_socket(&daemon_, 1), worker_pid(1), "a worker");
	return 0;
}
