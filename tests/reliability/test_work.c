/* SPDX-License-Identifier: Apache-2.0 */
/* A call that cannot finish within regend's call deadline is refused
 * before it runs, rather than run until the device counts as hung and
 * every user's worker state is lost.
 *
 * regend --call-deadline-ms 4000 (the host backend). As uid nobody:
 * - Attention over K and V of stride 0 in a 4 KiB buffer, Sq = 2^14,
 *   Skv = 2^22 (2^36 scores: minutes of reference math, 32 MiB of scratch,
 *   under every memory cap): io.regen.LimitExceeded {resource: "work",
 *   limit: 4000} within a second; the worker keeps its pid and generation.
 * - The same over Skv = 2^10 runs and succeeds.
 * - A GEMM of 4096^3 over sparse memfds: refused the same way; one of
 *   64^3 runs.
 * Before issue 30 the attention ran until the deadline: the caller got
 * io.regen.Timeout, the device was declared hung and its worker replaced
 * (a new generation for every user), repeatable at will. */
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

#define DEADLINE_MS 4000

static struct tl_daemon daemon_;

static void device(struct tl_device *d)
{
	struct tl_conn c;

	ASSERT_OK(tl_conn_open(&c, daemon_.sock), "connect");
	tl_device_status(&c, 0, d);
	tl_conn_close(&c);
}

static void attention(struct tl_conn *c, struct tl_reply *r, const char *kv, const char *q, const char *o, long sq,
		      long skv)
{
	tl_call(c, r, 60, NULL, 0, "io.regen.Compute.Attention",
		"{\"q\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,%ld,1],\"strides\":[0,0,0,1]},"
		"\"k\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,%ld,1],\"strides\":[0,0,0,1]},"
		"\"v\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,%ld,1],\"strides\":[0,0,0,1]},"
		"\"o\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[1,1,%ld,1]}}",
		q, sq, kv, skv, kv, skv, o, sq);
}

static void expect_work_refused(struct tl_reply *r, const char *what)
{
	ASSERT_REPLY_ERROR(r, "io.regen.LimitExceeded", "%s: got %s, expected LimitExceeded {work}", what,
			   tl_reply_describe(r));
	ASSERT(tl_reply_str(r, "resource") && strcmp(tl_reply_str(r, "resource"), "work") == 0 &&
		       tl_reply_int(r, "limit") == DEADLINE_MS,
	       "%s: %s", what, tl_reply_describe(r));
}

static int nobody_calls(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	char kv[64], q[64], o[64], g[64];
	const long sq = 1L << 14;
	const int big = 4096;

	tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(4096), 4096, kv, &r), 0, "import: %s", r.error);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(4096), 4096, q, &r), 0, "import: %s", r.error);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open((size_t)sq * 4), (size_t)sq * 4, o, &r), 0, "import: %s", r.error);
	tl_reply_finish(&r);

	double t0 = tl_now();
	attention(&c, &r, kv, q, o, sq, 1L << 22);
	double took = tl_now() - t0;
	tl_log("stride-0 attention, Sq 2^14, Skv 2^22: %s after %.0f ms", tl_reply_describe(&r), took * 1e3);
	expect_work_refused(&r, "attention over 2^36 scores");
	tl_reply_finish(&r);
	ASSERT_DOUBLE_LT(took, tl_timeout(1), "the refusal took %.1f s", took);

	attention(&c, &r, kv, q, o, sq, 1L << 10);
	ASSERT_REPLY_OK(&r, "attention over 2^24 scores");
	tl_reply_finish(&r);

	/* A GEMM of 4096^3 (6.9e10 multiply-adds, tens of seconds of
	 * reference math) over sparse memfds it never touches: refused;
	 * 64^3 over their first bytes: served. */
	size_t bytes = (size_t)big * big * 4;
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(2 * bytes), 2 * bytes, g, &r), 0, "import: %s", r.error);
	tl_reply_finish(&r);
	tl_call(&c, &r, 60, NULL, 0, "io.regen.Compute.Gemm",
		"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
		g, big, big, g, big, big, g, bytes, big, big);
	tl_log("GEMM 4096^3: %s", tl_reply_describe(&r));
	expect_work_refused(&r, "GEMM of 4096^3");
	tl_reply_finish(&r);
	tl_call(&c, &r, 60, NULL, 0, "io.regen.Compute.Gemm",
		"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[64,64]},"
		"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[64,64]},"
		"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[64,64]}}",
		g, g, g, bytes);
	ASSERT_REPLY_OK(&r, "GEMM of 64^3");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", "--call-deadline-ms", "4000", NULL };
	struct tl_device before, after;

	tl_init(120);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	device(&before);
	ASSERT_EQ(tl_wait(tl_fork(nobody_calls, NULL, 0), 90), 0, "uid nobody's calls");
	device(&after);
	ASSERT_EQ(after.worker_pid, before.worker_pid, "the worker was replaced (state %s)", after.state);
	ASSERT_EQ(after.generation, before.generation, "device 0's generation changed");
	tl_log("PASS");
	return 0;
}
