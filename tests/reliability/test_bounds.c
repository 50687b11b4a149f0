/* Bounded memory: no client can make regend hold without bound.
 *
 * - Calls pipelined behind one that never ends: a client opens a Watch (a
 *   "more" call that lasts as long as the connection) and then writes
 *   300,000 Generation calls without reading. Their replies must wait
 *   behind the Watch's, so regend stops reading the connection once a few
 *   hundred wait (the client's writes block), and the supervisor's memory
 *   grows by less than 16 MiB. Other clients are served meanwhile, and the
 *   connection's close gives the memory back.
 * - The same on a worker socket behind a long GEMM: 200,000 small Gemm
 *   calls pipelined; the worker's memory grows by less than 32 MiB beyond
 *   the two buffers the GEMM touches.
 * - Out of fds: regend's supervisor and a worker get RLIMIT_NOFILE 64 and a
 *   client opens connections until they go unanswered. For 2 s after, the
 *   two processes use under a fifth of a core and log a handful of lines
 *   (the accept loop pauses instead of spinning and logging each try); once
 *   the client closes half of them, a fresh client is served at once.
 * - A half-sent message: a client sends the start of a call and stops.
 *   With REGEN_MESSAGE_TIMEOUT_MS=600, regend closes the connection within
 *   a few seconds of the first byte, although the client keeps sending a
 *   byte every 200 ms. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rtest.h"

static struct rt_daemon daemon_;

/* Writes `count` copies of msg (NUL included) without reading, until the
 * socket has taken none for `stall_s`. Returns how many were taken whole. */
static long write_until_stalled(int fd, const char *msg, size_t len, long count, double stall_s)
{
	long sent = 0;
	size_t off = 0;
	double last = rt_now();
	int flags = fcntl(fd, F_GETFL);

	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	while (sent < count) {
		ssize_t n = send(fd, msg + off, len - off, MSG_NOSIGNAL);
		if (n > 0) {
			off += (size_t)n;
			if (off == len) {
				off = 0;
				sent++;
			}
			last = rt_now();
			continue;
		}
		RT_CHECK(n < 0 && errno == EAGAIN, "send: %s", strerror(errno));
		if (rt_now() - last > stall_s)
			break;
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		poll(&p, 1, 50);
	}
	fcntl(fd, F_SETFL, flags);
	return sent;
}

static long rss_kb(pid_t pid)
{
	struct rt_proc p;

	rt_proc_read(pid, &p);
	return p.rss_kb;
}

static pid_t worker_pid(int device)
{
	struct rt_conn c;
	struct rt_device d;

	RT_CHECK(rt_connect(&c, daemon_.sock) == 0, "connect");
	rt_status(&c, device, &d);
	rt_close(&c);
	return (pid_t)d.worker_pid;
}

static void behind_a_watch(void)
{
	static const char call[] = "{\"method\":\"io.regen.Device.Generation\",\"parameters\":{}}";
	struct rt_conn w, other;
	struct rt_reply r;
	long before, after, sent;

	/* rt_send cannot set "more": the Watch goes by hand. */
	RT_CHECK(rt_connect(&w, daemon_.sock) == 0, "connect");
	static const char watch[] = "{\"method\":\"io.regen.Device.Watch\",\"more\":true}";
	RT_CHECK(send(w.fd, watch, sizeof(watch), MSG_NOSIGNAL) == (ssize_t)sizeof(watch), "send watch");
	usleep(200000);
	before = rss_kb(daemon_.pid);
	double t0 = rt_now();
	sent = write_until_stalled(w.fd, call, sizeof(call), 300000, 2.0);
	after = rss_kb(daemon_.pid);
	rt_log("behind a Watch: %ld of 300000 calls taken before regend stopped reading (%.1f s); supervisor RSS %ld -> %ld kB",
	       sent, rt_now() - t0, before, after);
	RT_CHECK(sent < 300000, "regend read all 300000 calls queued behind a Watch: nothing bounds them");
	RT_CHECK(after - before < 16 * 1024, "supervisor grew by %ld kB holding replies behind a Watch", after - before);
	/* Others are served meanwhile. */
	RT_CHECK(rt_connect(&other, daemon_.sock) == 0, "connect");
	rt_call_ok(&other, &r, "io.regen.Device.Status", NULL);
	rt_reply_finish(&r);
	rt_close(&other);
	rt_close(&w);
}

static void behind_a_long_gemm(void)
{
	const int big = 1536, small = 4;
	char call[512], a[64], d[64], sa[64], sd[64];
	struct rt_conn c, other;
	struct rt_reply r;
	pid_t wp = worker_pid(0);
	long before, after, sent;
	int fa = rt_memfd((size_t)big * big * 4), fd = rt_memfd((size_t)big * big * 4);
	int fsa = rt_memfd(small * small * 4), fsd = rt_memfd(small * small * 4);

	RT_CHECK(rt_connect(&c, rt_worker_socket(&daemon_, 0)) == 0, "connect");
	RT_CHECK(rt_import(&c, 0, fa, (size_t)big * big * 4, a, &r) == 0, "import");
	rt_reply_finish(&r);
	RT_CHECK(rt_import(&c, 0, fd, (size_t)big * big * 4, d, &r) == 0, "import");
	rt_reply_finish(&r);
	RT_CHECK(rt_import(&c, 0, fsa, small * small * 4, sa, &r) == 0, "import");
	rt_reply_finish(&r);
	RT_CHECK(rt_import(&c, 0, fsd, small * small * 4, sd, &r) == 0, "import");
	rt_reply_finish(&r);
	before = rss_kb(wp);
	/* Seconds of work on the host backend's lane. */
	RT_CHECK(rt_send(&c, "io.regen.Compute.Gemm", NULL, 0,
			 "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			 "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			 "\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
			 a, big, big, a, big, big, d, big, big) == 0, "send the long GEMM");
	snprintf(call, sizeof(call),
		 "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		 "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		 "\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}}",
		 sa, small, small, sa, small, small, sd, small, small);
	sent = write_until_stalled(c.fd, call, strlen(call) + 1, 200000, 1.0);
	after = rss_kb(wp);
	rt_log("behind a long GEMM: %ld of 200000 calls taken before the worker stopped reading; worker RSS %ld -> %ld kB",
	       sent, before, after);
	RT_CHECK(sent < 200000, "the worker read all 200000 calls queued behind a long GEMM");
	/* The GEMM itself maps and touches its two big buffers. */
	long buffers_kb = 2L * big * big * 4 / 1024;
	RT_CHECK(after - before - buffers_kb < 32 * 1024, "worker grew by %ld kB (beyond its %ld kB of buffers) holding calls "
		 "behind a long GEMM", after - before - buffers_kb, buffers_kb);
	RT_CHECK(rt_connect(&other, rt_worker_socket(&daemon_, 0)) == 0, "connect");
	rt_call_ok(&other, &r, "io.regen.Device.Generation", NULL);
	rt_reply_finish(&r);
	rt_close(&other);
	rt_close(&c);
}

/* utime + stime of a process, in clock ticks. */
static long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	RT_CHECK(f != NULL, "open %s", path);
	RT_CHECK(fgets(buf, sizeof(buf), f) != NULL, "read %s", path);
	fclose(f);
	char *p = strrchr(buf, ')');
	RT_CHECK(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2, "parse stat");
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
	struct rt_conn conns[200], fresh;
	struct rt_reply r;
	int n = 0;

	RT_CHECK(prlimit(pid, RLIMIT_NOFILE, &lim, NULL) == 0, "prlimit: %s", strerror(errno));
	/* Connect until connections stop being answered: the process has no
	 * fd left to accept them with. */
	for (; n < 200; n++) {
		RT_CHECK(rt_connect(&conns[n], path) == 0, "connect %d", n);
		RT_CHECK(rt_send(&conns[n], "io.regen.Device.Generation", NULL, 0, NULL) == 0, "send");
		if (rt_recv(&conns[n], &r, 0.5) != 0) {
			n++;
			break;
		}
		rt_reply_finish(&r);
	}
	RT_CHECK(n < 200, "%s accepted 200 connections with 64 fds", who);
	long ticks0 = cpu_ticks(pid), log0 = log_size();
	usleep(2000000);
	long ticks = cpu_ticks(pid) - ticks0, logged = log_size() - log0;
	double share = (double)ticks / sysconf(_SC_CLK_TCK) / 2.0;
	rt_log("%s out of fds after %d connections: %.0f%% of a core and %ld bytes of log in the next 2 s", who, n,
	       share * 100, logged);
	RT_CHECK(share < 0.2, "%s used %.0f%% of a core while out of fds", who, share * 100);
	RT_CHECK(logged < 4096, "%s wrote %ld bytes of log in 2 s while out of fds", who, logged);
	for (int i = 0; i < n; i += 2)
		rt_close(&conns[i]);
	double t0 = rt_now();
	RT_CHECK(rt_connect(&fresh, path) == 0, "connect fresh");
	rt_call_ok(&fresh, &r, "io.regen.Device.Generation", NULL);
	rt_reply_finish(&r);
	rt_log("%s: a fresh client served %.0f ms after fds were free again", who, (rt_now() - t0) * 1e3);
	RT_CHECK(rt_now() - t0 < 1.5, "the fresh client waited %.1f s", rt_now() - t0);
	rt_close(&fresh);
	for (int i = 1; i < n; i += 2)
		rt_close(&conns[i]);
	lim.rlim_cur = lim.rlim_max = 4096;
	prlimit(pid, RLIMIT_NOFILE, &lim, NULL);
}

static void half_sent(void)
{
	static const char start[] = "{\"method\":\"io.regen.Device.Sta";
	struct rt_conn c;
	double t0 = rt_now();
	bool closed = false;

	RT_CHECK(rt_connect(&c, daemon_.sock) == 0, "connect");
	RT_CHECK(send(c.fd, start, sizeof(start) - 1, MSG_NOSIGNAL) > 0, "send");
	/* A byte now and then must not keep the message alive. */
	while (rt_now() - t0 < 10 && !closed) {
		char buf[256];
		struct pollfd p = { .fd = c.fd, .events = POLLIN };
		if (poll(&p, 1, 200) > 0 && recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
			closed = true;
		else if (!closed)
			closed = send(c.fd, " ", 1, MSG_NOSIGNAL) < 0;
	}
	RT_CHECK(closed, "a half-sent message kept its connection open for 10 s");
	rt_log("half-sent message: connection closed %.1f s after its first byte", rt_now() - t0);
	RT_CHECK(rt_now() - t0 < 5, "closed only after %.1f s", rt_now() - t0);
	rt_close(&c);
}

int main(void)
{
	setenv("REGEN_MESSAGE_TIMEOUT_MS", "600", 1);
	rt_daemon_start(&daemon_, NULL, 240);
	behind_a_watch();
	behind_a_long_gemm();
	half_sent();
	out_of_fds(daemon_.sock, daemon_.pid, "the supervisor");
	out_of_fds(rt_worker_socket(&daemon_, 1), worker_pid(1), "a worker");
	return 0;
}
