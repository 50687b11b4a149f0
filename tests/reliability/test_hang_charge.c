/* SPDX-License-Identifier: Apache-2.0 */
/* A hang is charged to the uid that caused it, so that it cannot be
 * repeated at will.
 *
 * regend --call-deadline-ms 1000 --hang-cooldown-ms 4000, the host backend
 * with REGEN_HOST_NS_PER_MAC=0.00001 (the work estimate believes every call
 * cheap: what a wrong estimate lets through). As uid nobody:
 * - A GEMM of 4096^3 on device 0 runs past the deadline: io.regen.Timeout,
 *   device 0 is hung and its worker replaced (one new generation).
 * - Twice more, on the new worker, the same GEMM, and a GEMM of 64^3 on
 *   device 0 and on device 1 (whose worker was not replaced):
 *   io.regen.LimitExceeded {resource: "hang cool-down", limit: 4000} within
 *   a second each, before they run: device 0's generation went up once in
 *   all, device 1's not at all.
 * - Root's GEMMs on both devices are served meanwhile (root is not
 *   charged).
 * - Once the cool-down ended, nobody's 64^3 GEMM is served; a second hang
 *   soon after (on device 1) is strike 2: a cool-down of 8000 ms.
 * Before issue 30 every one of nobody's long GEMMs hung its device and
 * cost every user of it its ids and calls: at will, as often as the
 * worker came back. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define DEADLINE_MS 1000
#define COOLDOWN_MS 4000
#define BIG 4096
#define SMALL 64

static struct tl_daemon daemon_;

static void device(int index, struct tl_device *d)
{
	struct tl_conn c;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, index, d);
	tl_conn_close(&c);
}

/* Polls until device `index` is ready in a generation after `after`. */
static void wait_ready_after(int index, int64_t after)
{
	struct tl_device d;
	double until = tl_now() + tl_timeout(30);

	for (;;) {
		device(index, &d);
		if (d.generation > after && strcmp(d.state, "ready") == 0)
			return;
		ASSERT_DOUBLE_LT(tl_now(), until, "device %d not ready after generation %lld (%s)", index,
				 (long long)after, d.state);
		usleep(50000);
	}
}

/* A connection to device `index`'s worker with one sparse buffer big
 * enough for a GEMM of BIG^3 (A, B and D side by side). */
struct gemm_conn {
	struct tl_conn conn;
	char buf[64];
};

static void gemm_conn_open(struct gemm_conn *g, int index)
{
	struct tl_reply r;
	size_t bytes = 3ul * BIG * BIG * 4;

	ASSERT_OK(tl_conn_open(&g->conn, tl_daemon_worker_socket(&daemon_, index)), "connect to device %d", index);
	ASSERT_EQ(tl_import_memfd(&g->conn, index, tl_memfd_open(bytes), bytes, g->buf, &r), 0, "import: %s",
		  tl_reply_describe(&r));
	tl_reply_finish(&r);
}

static void gemm(struct gemm_conn *g, int n, struct tl_reply *r)
{
	size_t matrix = (size_t)BIG * BIG * 4;

	tl_call(&g->conn, r, 60, NULL, 0, "io.regen.Compute.Gemm",
		"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
		g->buf, n, n, g->buf, matrix, n, n, g->buf, 2 * matrix, n, n);
}

static void expect_cooling(struct tl_reply *r, long limit, double took, const char *what)
{
	tl_log("%s: %s after %.0f ms", what, tl_reply_describe(r), took * 1e3);
	ASSERT_REPLY_ERROR(r, "io.regen.LimitExceeded", "%s", what);
	ASSERT(tl_reply_str(r, "resource") && strcmp(tl_reply_str(r, "resource"), "hang cool-down") == 0 &&
		       tl_reply_int(r, "limit") == limit,
	       "%s: %s", what, tl_reply_describe(r));
	ASSERT_DOUBLE_LT(took, tl_timeout(1), "%s: the refusal took %.1f s", what, took);
}

/* Nobody's call that hangs device `index`: Timeout (or the connection
 * reset, when the worker went before the reply). */
static void hang(int index)
{
	struct gemm_conn g;
	struct tl_reply r;
	double t0;
	int rc;

	gemm_conn_open(&g, index);
	t0 = tl_now();
	ASSERT_EQ(tl_send(&g.conn, "io.regen.Compute.Gemm", NULL, 0,
			  "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			  "\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			  "\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
			  g.buf, BIG, BIG, g.buf, (size_t)BIG * BIG * 4, BIG, BIG, g.buf, 2ul * BIG * BIG * 4, BIG, BIG),
		  0, "send the long GEMM");
	rc = tl_recv(&g.conn, &r, tl_timeout(30));
	tl_log("nobody's GEMM of %d^3 on device %d: %s after %.0f ms", BIG, index,
	       rc == 0 ? tl_reply_describe(&r) : strerror(-rc), (tl_now() - t0) * 1e3);
	ASSERT(rc == -ECONNRESET || (rc == 0 && tl_str_eq(r.error, "io.regen.Timeout")),
	       "the long GEMM was not stopped by the deadline");
	if (rc == 0)
		tl_reply_finish(&r);
	tl_conn_close(&g.conn);
}

/* Nobody's GEMM on device `index`: refused while cooling down with
 * `limit`, else (limit 0) served. */
static void nobody_gemm(int index, int n, long limit)
{
	struct gemm_conn g;
	struct tl_reply r;
	double t0;
	char what[96];

	gemm_conn_open(&g, index);
	snprintf(what, sizeof(what), "nobody's GEMM of %d^3 on device %d", n, index);
	t0 = tl_now();
	gemm(&g, n, &r);
	if (limit)
		expect_cooling(&r, limit, tl_now() - t0, what);
	else
		ASSERT_REPLY_OK(&r, "%s", what);
	tl_reply_finish(&r);
	tl_conn_close(&g.conn);
}

static int root_gemms(void *arg)
{
	struct tl_reply r;

	for (int i = 0; i < 2; i++) {
		struct gemm_conn g;

		gemm_conn_open(&g, i);
		gemm(&g, SMALL, &r);
		ASSERT_REPLY_OK(&r, "root's GEMM on device %d while nobody cools down", i);
		tl_reply_finish(&r);
		tl_conn_close(&g.conn);
	}
	return 0;
}

/* When nobody's first hang was answered (tl_now(), the same clock in every
 * process), written by the child that hung. */
static int hang_time[2];

static int nobody(void *arg)
{
	struct tl_device d0;
	double when;

	tl_become_nobody(0, false);
	device(0, &d0);
	hang(0);
	when = tl_now();
	ASSERT_EQ(write(hang_time[1], &when, sizeof(when)), (ssize_t)sizeof(when), "tell the hang's time");
	wait_ready_after(0, d0.generation);
	for (int i = 0; i < 2; i++)
		nobody_gemm(0, BIG, COOLDOWN_MS);
	nobody_gemm(0, SMALL, COOLDOWN_MS);
	nobody_gemm(1, SMALL, COOLDOWN_MS);
	return 0;
}

static int nobody_after_cooldown(void *arg)
{
	struct tl_device d1;

	tl_become_nobody(0, false);
	nobody_gemm(1, SMALL, 0);
	/* Soon after the first cool-down: strike 2, twice as long. */
	device(1, &d1);
	hang(1);
	wait_ready_after(1, d1.generation);
	nobody_gemm(1, SMALL, 2 * COOLDOWN_MS);
	nobody_gemm(0, SMALL, 2 * COOLDOWN_MS);
	return 0;
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", "--call-deadline-ms", "1000", "--hang-cooldown-ms",
					     "4000", NULL };
	struct tl_device before[2], after[2];
	double first_hang, left;

	tl_init(180);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	setenv("REGEN_HOST_NS_PER_MAC", "0.00001", 1);
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	for (int i = 0; i < 2; i++)
		device(i, &before[i]);

	ASSERT_EQ(pipe(hang_time), 0, "pipe");
	ASSERT_EQ(tl_wait(tl_fork(nobody, NULL, 0), 90), 0, "uid nobody's hang and its cool-down");
	ASSERT_EQ(read(hang_time[0], &first_hang, sizeof(first_hang)), (ssize_t)sizeof(first_hang), "the hang's time");
	ASSERT_EQ(tl_wait(tl_fork(root_gemms, NULL, 0), 60), 0, "root's GEMMs");
	for (int i = 0; i < 2; i++)
		device(i, &after[i]);
	ASSERT_EQ(after[0].generation, before[0].generation + 1, "device 0's generation: one hang, not three");
	ASSERT_EQ(after[1].generation, before[1].generation, "device 1's generation");
	ASSERT_EQ(after[1].worker_pid, before[1].worker_pid, "device 1's worker");
	tl_log("nobody's three long GEMMs: one hang (device 0 generation %lld -> %lld), two refused; device 1 "
	       "unchanged; root served", (long long)before[0].generation, (long long)after[0].generation);

	/* The cool-down began with the hang: wait out what is left of it (the
	 * next hang must come before as long again has passed, to be strike
	 * 2). */
	left = first_hang + (double)COOLDOWN_MS / 1e3 + 0.2 - tl_now();
	if (left > 0)
		usleep((useconds_t)(left * 1e6));
	ASSERT_EQ(tl_wait(tl_fork(nobody_after_cooldown, NULL, 0), 90), 0, "uid nobody after the cool-down");
	tl_log("PASS");
	return 0;
}
