/* Exhaustion: each limit refuses by name what is over it and nothing else.
 *
 * regend --max-connections 8 --max-buffers 16:
 * - connections: 8 on the main socket work; the 9th from the same uid gets
 *   io.regen.LimitExceeded {resource: "connections", limit: 8} and is
 *   closed; the 8 keep working; closing one frees a slot; another uid is
 *   not counted against this one (when run as root). The same on a worker
 *   socket, where the count is per client process.
 * - buffers: 16 imports on a device work, the 17th is LimitExceeded
 *   {resource: "buffers"}; the 16 still compute, another process and the
 *   other device are not affected, and closing one frees a slot.
 * - calls in flight: 1100 Gemm calls pipelined on one connection without
 *   reading: the first is a large GEMM that keeps the lane busy while the
 *   rest arrive, so exactly calls 1025..1100 find 1024 in flight and are
 *   refused with LimitExceeded {resource: "calls in flight", limit: 1024};
 *   every call gets exactly one reply, in order, and another connection to
 *   the same device is served meanwhile. (A `hang` fault would keep those
 *   refusals unread for ever: replies go out in request order, behind the
 *   hung calls.) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rtest.h"

#define MAX_CONN 8
#define MAX_BUF 16
#define MAX_IN_FLIGHT 1024
#define PIPELINE 1100

static struct rt_daemon daemon_;

static void expect_limit(struct rt_reply *r, const char *resource, int64_t limit, const char *what)
{
	RT_CHECK(r->error && strcmp(r->error, "io.regen.LimitExceeded") == 0, "%s: got %s, expected LimitExceeded", what,
		 r->error ? r->error : "success");
	RT_CHECK(rt_reply_str(r, "resource") && strcmp(rt_reply_str(r, "resource"), resource) == 0,
		 "%s: LimitExceeded names resource %s, expected %s", what,
		 rt_reply_str(r, "resource") ? rt_reply_str(r, "resource") : "(none)", resource);
	RT_CHECK(rt_reply_int(r, "limit") == limit, "%s: limit %lld, expected %lld", what, (long long)rt_reply_int(r, "limit"),
		 (long long)limit);
}

/* Connects and proves the connection is served. */
static void connect_served(struct rt_conn *c, const char *path, bool worker)
{
	struct rt_reply r;

	RT_CHECK(rt_connect(c, path) == 0, "connect %s", path);
	rt_call_ok(c, &r, worker ? "io.regen.Device.Generation" : "io.regen.Device.Status", NULL);
	rt_reply_finish(&r);
}

/* The connection over the limit: refused by name, then closed. */
static void connect_refused(const char *path)
{
	struct rt_conn c;
	struct rt_reply r;

	RT_CHECK(rt_connect(&c, path) == 0, "connect %s", path);
	RT_CHECK(rt_recv(&c, &r, 10) == 0, "no LimitExceeded on the connection over the limit to %s", path);
	expect_limit(&r, "connections", MAX_CONN, path);
	rt_reply_finish(&r);
	RT_CHECK(rt_recv(&c, &r, 10) == -ECONNRESET, "the refused connection to %s stayed open", path);
	rt_close(&c);
}

static int other_uid_connects(void *arg)
{
	struct rt_conn c;

	rt_become_nobody(0, false);
	connect_served(&c, daemon_.sock, false);
	rt_close(&c);
	return 0;
}

static void connections(const char *path, bool worker)
{
	struct rt_conn c[MAX_CONN];

	for (int i = 0; i < MAX_CONN; i++)
		connect_served(&c[i], path, worker);
	connect_refused(path);
	connect_refused(path);
	for (int i = 0; i < MAX_CONN; i++) {
		struct rt_reply r;
		rt_call_ok(&c[i], &r, worker ? "io.regen.Device.Generation" : "io.regen.Device.Status", NULL);
		rt_reply_finish(&r);
	}
	if (!worker && geteuid() == 0)
		RT_CHECK(rt_wait(rt_fork(other_uid_connects, NULL), 30) == 0, "another uid was refused");
	/* A slot comes back once regend has seen the close. */
	rt_close(&c[0]);
	double deadline = rt_now() + 5;
	for (;;) {
		struct rt_conn n;
		struct rt_reply r;

		RT_CHECK(rt_connect(&n, path) == 0, "connect");
		rt_send(&n, worker ? "io.regen.Device.Generation" : "io.regen.Device.Status", NULL, 0, NULL);
		RT_CHECK(rt_recv(&n, &r, 10) == 0, "no answer");
		if (!r.error) {
			rt_reply_finish(&r);
			c[0] = n;
			break;
		}
		expect_limit(&r, "connections", MAX_CONN, "reconnect");
		rt_reply_finish(&r);
		rt_close(&n);
		RT_CHECK(rt_now() < deadline, "closing a connection did not free a slot on %s within 5 s", path);
		usleep(50000);
	}
	for (int i = 0; i < MAX_CONN; i++)
		rt_close(&c[i]);
	rt_log("%s: %d connections served, the next refused with LimitExceeded and closed, the %d unaffected, "
	       "a closed one's slot reused", path, MAX_CONN, MAX_CONN);
}

static int other_process_imports(void *arg)
{
	struct rt_conn c;
	struct rt_reply r;
	char id[64];

	RT_CHECK(rt_connect(&c, rt_worker_socket(&daemon_, 0)) == 0, "connect");
	RT_CHECK(rt_import(&c, 0, rt_memfd(4096), 4096, id, &r) == 0, "another process's import: %s", r.error);
	rt_reply_finish(&r);
	rt_close(&c);
	return 0;
}

static void gemm_ok_on(struct rt_conn *c, const char *a, const char *b, const char *d)
{
	struct rt_reply r;

	rt_call_ok(c, &r, "io.regen.Compute.Gemm",
		   "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]}}", a, b, d);
	rt_reply_finish(&r);
}

static void buffers(void)
{
	struct rt_conn c, c1;
	struct rt_reply r;
	char ids[MAX_BUF + 1][64];
	int fds[MAX_BUF + 1];

	RT_CHECK(rt_connect(&c, rt_worker_socket(&daemon_, 0)) == 0, "connect");
	for (int i = 0; i <= MAX_BUF; i++) {
		fds[i] = rt_memfd(4096);
		int e = rt_import(&c, 0, fds[i], 4096, ids[i], &r);
		if (i < MAX_BUF) {
			RT_CHECK(e == 0, "import %d of %d failed: %s", i + 1, MAX_BUF, r.error);
		} else {
			RT_CHECK(e < 0, "import %d accepted with --max-buffers %d", i + 1, MAX_BUF);
			expect_limit(&r, "buffers", MAX_BUF, "import over the limit");
		}
		rt_reply_finish(&r);
	}
	/* The 16 still work; others are not counted against us. */
	gemm_ok_on(&c, ids[0], ids[1], ids[2]);
	gemm_ok_on(&c, ids[13], ids[14], ids[15]);
	RT_CHECK(rt_wait(rt_fork(other_process_imports, NULL), 30) == 0, "another process was refused a buffer");
	RT_CHECK(rt_connect(&c1, rt_worker_socket(&daemon_, 1)) == 0, "connect");
	RT_CHECK(rt_import(&c1, 1, fds[0], 4096, ids[MAX_BUF], &r) == 0, "device 1 refused: %s", r.error);
	rt_reply_finish(&r);
	rt_close(&c1);
	/* A second connection of the same process shares the count. */
	RT_CHECK(rt_connect(&c1, rt_worker_socket(&daemon_, 0)) == 0, "connect");
	RT_CHECK(rt_import(&c1, 0, fds[MAX_BUF], 4096, ids[MAX_BUF], &r) < 0, "a second connection escaped the limit");
	expect_limit(&r, "buffers", MAX_BUF, "import over the limit on a second connection");
	rt_reply_finish(&r);
	rt_close(&c1);
	/* Closing one frees its slot. */
	rt_call_ok(&c, &r, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", ids[7]);
	rt_reply_finish(&r);
	RT_CHECK(rt_import(&c, 0, fds[MAX_BUF], 4096, ids[7], &r) == 0, "import after a close refused: %s", r.error);
	rt_reply_finish(&r);
	RT_CHECK(rt_import(&c, 0, fds[MAX_BUF], 4096, ids[MAX_BUF], &r) < 0, "limit gone after one close + import");
	expect_limit(&r, "buffers", MAX_BUF, "import over the limit again");
	rt_reply_finish(&r);
	gemm_ok_on(&c, ids[7], ids[8], ids[9]);
	rt_close(&c);
	for (int i = 0; i <= MAX_BUF; i++)
		close(fds[i]);
	rt_log("buffers: %d imports, the next LimitExceeded; others (another process, device 1) unaffected; "
	       "a close frees a slot", MAX_BUF);
}

static void calls_in_flight(void)
{
	/* Big enough to keep the lane busy while 1100 calls arrive (host
	 * reference GEMM: about 0.1-1 s), small enough for a test. */
	const int big = 512;
	size_t big_bytes = (size_t)big * big * 4, size = 3 * big_bytes + 3 * 64;
	struct rt_conn c, other;
	struct rt_reply r;
	char id[64];
	int fd = rt_memfd(size);
	int ok = 0, refused = 0, first_refused = -1;
	double t0;

	RT_CHECK(rt_connect(&c, rt_worker_socket(&daemon_, 1)) == 0, "connect");
	RT_CHECK(rt_import(&c, 1, fd, size, id, &r) == 0, "import: %s", r.error);
	rt_reply_finish(&r);
	t0 = rt_now();
	rt_send(&c, "io.regen.Compute.Gemm", NULL, 0,
		"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
		id, big, big, id, big_bytes, big, big, id, 2 * big_bytes, big, big);
	for (int i = 1; i < PIPELINE; i++)
		rt_send(&c, "io.regen.Compute.Gemm", NULL, 0,
			"{\"a\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]},"
			"\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]},"
			"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]}}",
			id, 3 * big_bytes, id, 3 * big_bytes + 64, id, 3 * big_bytes + 128);
	double sent = rt_now() - t0;

	/* Another lane on the same device is served while this one is full. */
	connect_served(&other, rt_worker_socket(&daemon_, 1), true);
	rt_close(&other);

	for (int i = 0; i < PIPELINE; i++) {
		int e = rt_recv(&c, &r, 60);

		RT_CHECK(e == 0, "reply %d of %d: %s (%d ok, %d refused so far)", i + 1, PIPELINE, strerror(-e), ok, refused);
		if (!r.error) {
			RT_CHECK(refused == 0, "call %d succeeded after a refusal: replies out of order?", i + 1);
			ok++;
		} else {
			expect_limit(&r, "calls in flight", MAX_IN_FLIGHT, "pipelined call");
			if (first_refused < 0)
				first_refused = i;
			refused++;
		}
		rt_reply_finish(&r);
	}
	RT_CHECK(rt_recv(&c, &r, 0.5) == -ETIMEDOUT, "a reply more than the calls: %s", r.error ? r.error : "success");
	rt_log("calls in flight: %d pipelined in %.3f s: %d answered, %d LimitExceeded from call %d on (%.2f s in all)",
	       PIPELINE, sent, ok, refused, first_refused + 1, rt_now() - t0);
	RT_CHECK(ok == MAX_IN_FLIGHT && refused == PIPELINE - MAX_IN_FLIGHT,
		 "expected %d answered and %d refused (the big GEMM finished before the pipeline arrived?)", MAX_IN_FLIGHT,
		 PIPELINE - MAX_IN_FLIGHT);
	/* The connection is usable again once its calls are answered. */
	rt_call_ok(&c, &r, "io.regen.Compute.Gemm",
		   "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]}}", id, id, id, big_bytes);
	rt_reply_finish(&r);
	rt_close(&c);
	close(fd);
}

int main(void)
{
	const char *args[] = { "--max-connections", "8", "--max-buffers", "16", "--socket-mode", "0666", NULL };

	rt_daemon_start(&daemon_, args, 180);
	usleep(300000);   /* the readiness probe's connection is gone by now */
	connections(daemon_.sock, false);
	connections(rt_worker_socket(&daemon_, 0), true);
	buffers();
	calls_in_flight();
	rt_log("PASS");
	return 0;
}
