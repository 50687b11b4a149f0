/* SPDX-License-Identifier: Apache-2.0 */
/* Exhaustion: each limit refuses by name what is over it and nothing else.
 *
 * regend --max-connections 8 --max-buffers 16 --max-comms 3:
 * - connections: 8 on the main socket work; the 9th from the same uid gets
 *   io.regen.LimitExceeded {resource: "connections", limit: 8} and is
 *   closed; the 8 keep working; closing one frees a slot; another process
 *   of the same uid is refused too, another uid is not counted against
 *   this one (when run as root). The same on a worker socket, where the
 *   count is per uid as well: a uid's processes together.
 * - buffers: 16 imports on a device work, the 17th is LimitExceeded
 *   {resource: "buffers"}; the 16 still compute, another process and the
 *   other device are not affected, and closing one frees a slot.
 * - communicators: with 16 buffers imported (the buffer limit), 3
 *   communicators Init, the 4th is LimitExceeded {resource:
 *   "communicators", limit: 3} naming max_comms and makes none; the 3 still
 *   reduce, another process is not counted against this one, a Destroy
 *   frees a slot, and a buffer closed and imported again is not refused on
 *   the communicators' account.
 * - detached communicators: a process makes 3 keyed communicators and
 *   exits (they stay for Attach); a second does the same, and only as many
 *   of its own stay detached as fit beside the first's under max_comms
 *   (per uid), the others are aborted; Attach counts against the
 *   attaching process's max_comms as Init does.
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

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define MAX_CONN 8
#define MAX_BUF 16
#define MAX_COMMS 3
#define MAX_IN_FLIGHT 1024
#define PIPELINE 1100

static struct tl_daemon daemon_;

static void expect_limit(struct tl_reply *r, const char *resource, int64_t limit, const char *what)
{
	ASSERT_REPLY_ERROR(r, "io.regen.LimitExceeded", "%s: got %s, expected LimitExceeded", what,
	                   r->error ? r->error : "success");
	ASSERT(tl_reply_str(r, "resource") && strcmp(tl_reply_str(r, "resource"), resource) == 0,
	       "%s: LimitExceeded names resource %s, expected %s", what,
	       tl_reply_str(r, "resource") ? tl_reply_str(r, "resource") : "(none)", resource);
	ASSERT_EQ(tl_reply_int(r, "limit"), limit, "%s: LimitExceeded's limit", what);
}

/* Connects and proves the connection is served. */
static void connect_served(struct tl_conn *c, const char *path, bool worker)
{
	struct tl_reply r;

	ASSERT_OK(tl_conn_open(c, path), "connect %s", path);
	tl_call_ok(c, &r, worker ? "io.regen.Device.Generation" : "io.regen.Device.Status", NULL);
	tl_reply_finish(&r);
}

/* The connection over the limit: refused by name, then closed. */
static void connect_refused(const char *path)
{
	struct tl_conn c;
	struct tl_reply r;

	ASSERT_OK(tl_conn_open(&c, path), "connect %s", path);
	ASSERT_EQ(tl_recv(&c, &r, 10), 0, "no LimitExceeded on the connection over the limit to %s", path);
	expect_limit(&r, "connections", MAX_CONN, path);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_recv(&c, &r, 10), -ECONNRESET, "the refused connection to %s stayed open", path);
	tl_conn_close(&c);
}

static int other_uid_connects(void *arg)
{
	const char *path = arg;
	struct tl_conn c;

	tl_become_nobody(0, false);
	connect_served(&c, path, strcmp(path, daemon_.sock) != 0);
	tl_conn_close(&c);
	return 0;
}

/* Another process of the same uid: its connection counts against the
 * uid's, on either socket. */
static int same_uid_refused(void *arg)
{
	connect_refused(arg);
	return 0;
}

static void connections(const char *path, bool worker)
{
	struct tl_conn c[MAX_CONN];

	for (int i = 0; i < MAX_CONN; i++)
		connect_served(&c[i], path, worker);
	connect_refused(path);
	connect_refused(path);
	for (int i = 0; i < MAX_CONN; i++) {
		struct tl_reply r;
		tl_call_ok(&c[i], &r, worker ? "io.regen.Device.Generation" : "io.regen.Device.Status", NULL);
		tl_reply_finish(&r);
	}
	ASSERT_EQ(tl_wait(tl_fork(same_uid_refused, (void *)path, 0), 30), 0,
		  "another process of the same uid was not refused on %s: the count is per uid", path);
	if (geteuid() == 0)
		ASSERT_EQ(tl_wait(tl_fork(other_uid_connects, (void *)path, 0), 30), 0, "another uid was refused on %s",
			  path);
	/* A slot comes back once regend has seen the close. */
	tl_conn_close(&c[0]);
	double deadline = tl_now() + 5;
	for (;;) {
		struct tl_conn n;
		struct tl_reply r;

		ASSERT_OK(tl_conn_open(&n, path), "connect");
		tl_send(&n, worker ? "io.regen.Device.Generation" : "io.regen.Device.Status", NULL, 0, NULL);
		ASSERT_EQ(tl_recv(&n, &r, 10), 0, "no answer");
		if (!r.error) {
			tl_reply_finish(&r);
			c[0] = n;
			break;
		}
		expect_limit(&r, "connections", MAX_CONN, "reconnect");
		tl_reply_finish(&r);
		tl_conn_close(&n);
		ASSERT_DOUBLE_LT(tl_now(), deadline, "closing a connection did not free a slot on %s within 5 s", path);
		usleep(50000);
	}
	for (int i = 0; i < MAX_CONN; i++)
		tl_conn_close(&c[i]);
	tl_log("%s: %d connections served, the next refused with LimitExceeded and closed (from this process and "
	       "another of its uid), the %d unaffected, another uid served, a closed one's slot reused", path, MAX_CONN,
	       MAX_CONN);
}

static int other_process_imports(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	char id[64];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(4096), 4096, id, &r), 0, "another process's import: %s", r.error);
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

static void gemm_ok_on(struct tl_conn *c, const char *a, const char *b, const char *d)
{
	struct tl_reply r;

	tl_call_ok(c, &r, "io.regen.Compute.Gemm",
		   "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]}}", a, b, d);
	tl_reply_finish(&r);
}

static void buffers(void)
{
	struct tl_conn c, c1;
	struct tl_reply r;
	char ids[MAX_BUF + 1][64];
	int fds[MAX_BUF + 1];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	for (int i = 0; i <= MAX_BUF; i++) {
		fds[i] = tl_memfd_open(4096);
		int e = tl_import_memfd(&c, 0, fds[i], 4096, ids[i], &r);
		if (i < MAX_BUF) {
			ASSERT_EQ(e, 0, "import %d of %d failed: %s", i + 1, MAX_BUF, r.error);
		} else {
			ASSERT_LT(e, 0, "import %d accepted with --max-buffers %d", i + 1, MAX_BUF);
			expect_limit(&r, "buffers", MAX_BUF, "import over the limit");
		}
		tl_reply_finish(&r);
	}
	/* The 16 still work; others are not counted against us. */
	gemm_ok_on(&c, ids[0], ids[1], ids[2]);
	gemm_ok_on(&c, ids[13], ids[14], ids[15]);
	ASSERT_EQ(tl_wait(tl_fork(other_process_imports, NULL, 0), 30), 0, "another process was refused a buffer");
	ASSERT_OK(tl_conn_open(&c1, tl_daemon_worker_socket(&daemon_, 1)), "connect");
	ASSERT_EQ(tl_import_memfd(&c1, 1, fds[0], 4096, ids[MAX_BUF], &r), 0, "device 1 refused: %s", r.error);
	tl_reply_finish(&r);
	tl_conn_close(&c1);
	/* A second connection of the same process shares the count. */
	ASSERT_OK(tl_conn_open(&c1, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_LT(tl_import_memfd(&c1, 0, fds[MAX_BUF], 4096, ids[MAX_BUF], &r), 0, "a second connection escaped the limit");
	expect_limit(&r, "buffers", MAX_BUF, "import over the limit on a second connection");
	tl_reply_finish(&r);
	tl_conn_close(&c1);
	/* Closing one frees its slot. */
	tl_call_ok(&c, &r, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", ids[7]);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, fds[MAX_BUF], 4096, ids[7], &r), 0, "import after a close refused: %s", r.error);
	tl_reply_finish(&r);
	ASSERT_LT(tl_import_memfd(&c, 0, fds[MAX_BUF], 4096, ids[MAX_BUF], &r), 0, "limit gone after one close + import");
	expect_limit(&r, "buffers", MAX_BUF, "import over the limit again");
	tl_reply_finish(&r);
	gemm_ok_on(&c, ids[7], ids[8], ids[9]);
	tl_conn_close(&c);
	for (int i = 0; i <= MAX_BUF; i++)
		close(fds[i]);
	tl_log("buffers: %d imports, the next LimitExceeded; others (another process, device 1) unaffected; "
	       "a close frees a slot", MAX_BUF);
}

/* Rank 0 of 1 of a new communicator, keyed when key is not NULL: 0, or -1
 * with the reply's error kept. */
static int comm_init_keyed(struct tl_conn *c, const char *key, char *id, size_t size, struct tl_reply *r)
{
	char uid[300], keyed[160] = "";

	tl_call_ok(c, r, "io.regen.Comm.GetUniqueId", NULL);
	snprintf(uid, sizeof(uid), "%s", tl_reply_str(r, "unique_id"));
	tl_reply_finish(r);
	if (key)
		snprintf(keyed, sizeof(keyed), ",\"key\":\"%s\"", key);
	tl_call(c, r, 10, NULL, 0, "io.regen.Comm.Init", "{\"unique_id\":\"%s\",\"rank\":0,\"nranks\":1%s}", uid,
		keyed);
	if (r->error)
		return -1;
	snprintf(id, size, "%s", tl_reply_str(r, "comm"));
	tl_reply_finish(r);
	return 0;
}

static int comm_init(struct tl_conn *c, char *id, size_t size, struct tl_reply *r)
{
	return comm_init_keyed(c, NULL, id, size, r);
}

static void all_reduce_ok(struct tl_conn *c, const char *comm, const char *buf)
{
	struct tl_reply r;

	tl_call_ok(c, &r, "io.regen.Comm.AllReduce",
		   "{\"comm\":\"%s\",\"send\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[16]},"
		   "\"recv\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[16]}}", comm, buf, buf);
	tl_reply_finish(&r);
}

static int other_process_makes_a_comm(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	char id[64];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_EQ(comm_init(&c, id, sizeof(id), &r), 0, "another process's Init: %s", r.error);
	tl_conn_close(&c);
	return 0;
}

static void communicators(void)
{
	struct tl_conn c;
	struct tl_reply r;
	char bufs[MAX_BUF][64], comms[MAX_COMMS][64], extra[64];
	int fds[MAX_BUF];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	for (int i = 0; i < MAX_BUF; i++) {
		fds[i] = tl_memfd_open(4096);
		ASSERT_EQ(tl_import_memfd(&c, 0, fds[i], 4096, bufs[i], &r), 0, "import %d: %s", i + 1, r.error);
		tl_reply_finish(&r);
	}
	/* Buffers at their limit do not hold communicators back. */
	for (int i = 0; i < MAX_COMMS; i++)
		ASSERT_EQ(comm_init(&c, comms[i], sizeof(comms[i]), &r), 0, "Init %d of %d: %s", i + 1, MAX_COMMS,
			  tl_reply_describe(&r));
	ASSERT_LT(comm_init(&c, extra, sizeof(extra), &r), 0, "Init %d accepted with --max-comms %d", MAX_COMMS + 1,
		  MAX_COMMS);
	expect_limit(&r, "communicators", MAX_COMMS, "Init over the limit");
	ASSERT(strstr(tl_reply_text(&r), "max_comms"), "LimitExceeded does not name max_comms: %s", tl_reply_text(&r));
	tl_reply_finish(&r);
	for (int i = 0; i < MAX_COMMS; i++)
		all_reduce_ok(&c, comms[i], bufs[i]);
	ASSERT_EQ(tl_wait(tl_fork(other_process_makes_a_comm, NULL, 0), 30), 0, "another process was refused");
	/* Communicators at their limit do not hold buffers back. */
	tl_call_ok(&c, &r, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", bufs[5]);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, fds[5], 4096, bufs[5], &r), 0, "import beside 3 communicators: %s", r.error);
	tl_reply_finish(&r);
	/* A Destroy frees a slot. */
	tl_call_ok(&c, &r, "io.regen.Comm.Destroy", "{\"comm\":\"%s\"}", comms[1]);
	tl_reply_finish(&r);
	ASSERT_EQ(comm_init(&c, comms[1], sizeof(comms[1]), &r), 0, "Init after a Destroy: %s", tl_reply_describe(&r));
	all_reduce_ok(&c, comms[1], bufs[5]);
	ASSERT_LT(comm_init(&c, extra, sizeof(extra), &r), 0, "the limit gone after one Destroy and Init");
	expect_limit(&r, "communicators", MAX_COMMS, "Init over the limit again");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	for (int i = 0; i < MAX_BUF; i++)
		close(fds[i]);
	tl_log("communicators: %d Init beside %d buffers, the next LimitExceeded naming max_comms; another process "
	       "unaffected; a Destroy frees a slot", MAX_COMMS, MAX_BUF);
}

/* A process that makes MAX_COMMS keyed communicators ("<prefix>0"...) and
 * exits without a Destroy: they are left detached, or aborted. */
static int keyed_and_gone(void *prefix)
{
	struct tl_conn c;
	struct tl_reply r;
	char key[64], id[64];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	for (int i = 0; i < MAX_COMMS; i++) {
		snprintf(key, sizeof(key), "%s%d", (const char *)prefix, i);
		ASSERT_EQ(comm_init_keyed(&c, key, id, sizeof(id), &r), 0, "keyed Init %s: %s", key,
			  tl_reply_describe(&r));
	}
	_exit(0);
}

/* 0 attached, or -1 with NoSuchObject (anything else fails the test). */
static int attach(struct tl_conn *c, const char *key)
{
	struct tl_reply r;

	tl_call(c, &r, 10, NULL, 0, "io.regen.Comm.Attach", "{\"key\":\"%s\"}", key);
	if (!r.error) {
		tl_reply_finish(&r);
		return 0;
	}
	ASSERT_REPLY_ERROR(&r, "io.regen.NoSuchObject", "Attach %s", key);
	tl_reply_finish(&r);
	return -1;
}

/* max_comms bounds the detached communicators of a uid too: one process
 * after another could pile them up otherwise. */
static void detached(void)
{
	struct tl_conn c;
	struct tl_reply r;
	char key[64];
	int kept = 0;
	double deadline;

	ASSERT_EQ(tl_wait(tl_fork(keyed_and_gone, "a", 30), 30), 0, "the first process of keyed communicators");
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	/* Once a2 attaches, a0 and a1 are detached: MAX_COMMS - 1 of this uid. */
	deadline = tl_now() + 5;
	while (attach(&c, "a2") < 0) {
		ASSERT_DOUBLE_LT(tl_now(), deadline, "a2 never detached");
		usleep(20000);
	}
	ASSERT_EQ(tl_wait(tl_fork(keyed_and_gone, "b", 30), 30), 0, "the second process of keyed communicators");
	/* One of b0..b2 fits beside a0 and a1; once it attaches, the close of
	 * their process was handled whole, and the other two were aborted. */
	deadline = tl_now() + 5;
	for (;;) {
		for (int i = 0; i < MAX_COMMS && !kept; i++) {
			snprintf(key, sizeof(key), "b%d", i);
			kept = attach(&c, key) == 0 ? i + 1 : 0;
		}
		if (kept)
			break;
		ASSERT_DOUBLE_LT(tl_now(), deadline, "none of b0..b2 was left detached");
		usleep(20000);
	}
	for (int i = 0; i < MAX_COMMS; i++) {
		snprintf(key, sizeof(key), "b%d", i);
		if (i + 1 != kept)
			ASSERT_EQ(attach(&c, key), -1, "%s was left detached beside %d others of this uid", key, MAX_COMMS);
	}
	/* Attach counts against the process's limit as Init does. */
	ASSERT_EQ(attach(&c, "a0"), 0, "a0 (this process holds %d communicators)", MAX_COMMS - 1);
	tl_call(&c, &r, 10, NULL, 0, "io.regen.Comm.Attach", "{\"key\":\"a1\"}");
	expect_limit(&r, "communicators", MAX_COMMS, "Attach over the limit");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	tl_log("detached: %d keyed communicators of gone processes kept for Attach per uid, the next aborted", MAX_COMMS);
}

static void calls_in_flight(void)
{
	/* Big enough to keep the lane busy while 1100 calls arrive (host
	 * reference GEMM: about 0.1-1 s), small enough for a test. */
	const int big = 512;
	size_t big_bytes = (size_t)big * big * 4, size = 3 * big_bytes + 3 * 64;
	struct tl_conn c, other;
	struct tl_reply r;
	char id[64];
	int fd = tl_memfd_open(size);
	int ok = 0, refused = 0, first_refused = -1;
	double t0;

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 1)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 1, fd, size, id, &r), 0, "import: %s", r.error);
	tl_reply_finish(&r);
	t0 = tl_now();
	tl_send(&c, "io.regen.Compute.Gemm", NULL, 0,
		"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
		id, big, big, id, big_bytes, big, big, id, 2 * big_bytes, big, big);
	for (int i = 1; i < PIPELINE; i++)
		tl_send(&c, "io.regen.Compute.Gemm", NULL, 0,
			"{\"a\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]},"
			"\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]},"
			"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]}}",
			id, 3 * big_bytes, id, 3 * big_bytes + 64, id, 3 * big_bytes + 128);
	double sent = tl_now() - t0;

	/* Another lane on the same device is served while this one is full. */
	connect_served(&other, tl_daemon_worker_socket(&daemon_, 1), true);
	tl_conn_close(&other);

	for (int i = 0; i < PIPELINE; i++) {
		int e = tl_recv(&c, &r, 60);

		ASSERT_EQ(e, 0, "reply %d of %d: %s (%d ok, %d refused so far)", i + 1, PIPELINE, strerror(-e), ok, refused);
		if (!r.error) {
			ASSERT_EQ(refused, 0, "call %d succeeded after a refusal: replies out of order?", i + 1);
			ok++;
		} else {
			expect_limit(&r, "calls in flight", MAX_IN_FLIGHT, "pipelined call");
			if (first_refused < 0)
				first_refused = i;
			refused++;
		}
		tl_reply_finish(&r);
	}
	ASSERT_EQ(tl_recv(&c, &r, 0.5), -ETIMEDOUT, "a reply more than the calls: %s", r.error ? r.error : "success");
	tl_log("calls in flight: %d pipelined in %.3f s: %d answered, %d LimitExceeded from call %d on (%.2f s in all)",
	       PIPELINE, sent, ok, refused, first_refused + 1, tl_now() - t0);
	ASSERT(ok == MAX_IN_FLIGHT && refused == PIPELINE - MAX_IN_FLIGHT,
	       "expected %d answered and %d refused (the big GEMM finished before the pipeline arrived?)", MAX_IN_FLIGHT,
	       PIPELINE - MAX_IN_FLIGHT);
	/* The connection is usable again once its calls are answered. */
	tl_call_ok(&c, &r, "io.regen.Compute.Gemm",
		   "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		   "\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[4,4]}}", id, id, id, big_bytes);
	tl_reply_finish(&r);
	tl_conn_close(&c);
	close(fd);
}

int main(void)
{
	const char *args[] = { "--max-connections", "8", "--max-buffers", "16", "--max-comms", "3", "--socket-mode", "0666",
			       NULL };

	tl_init(180);
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = args });
	usleep(300000);   /* the readiness probe's connection is gone by now */
	connections(daemon_.sock, false);
	connections(tl_daemon_worker_socket(&daemon_, 0), true);
	buffers();
	communicators();
	detached();
	calls_in_flight();
	tl_log("PASS");
	return 0;
}
