/* SPDX-License-Identifier: Apache-2.0 */
/* Faults: a worker that crashes (InjectFault crash: SIGABRT), a worker
 * killed with SIGKILL (pid from Status), a lost context (device_lost), a
 * hung call ended by a Restart with a short deadline, and a fault found
 * while a Release drains (the Release resets). Each time the device
 * comes back in a newer generation, the client's main-socket connection
 * survives (the same regen_client keeps answering Status), the other device
 * is untouched, and data calls work again after a re-import. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/lib/client.h"
#include "tests/lib/varlink.h"

static struct tl_daemon daemon_;

struct dev_snapshot {
	uint64_t generation, respawns;
	int64_t pid;
};

static void take(const struct regen_device_info *d, struct dev_snapshot *s)
{
	s->generation = d->generation;
	s->respawns = d->respawns;
	s->pid = d->worker_pid;
}

static void snapshot(regen_client *c, int device, struct dev_snapshot *s)
{
	regen_status *st;

	/* Never -ECONNRESET: the main connection must survive a worker. */
	st = tl_status(c);
	take(tl_status_device(st, device), s);
	regen_status_free(st);
}

/* Polls Status on the same client (every call must succeed) until the
 * device is ready in a newer generation. */
static void wait_back(regen_client *c, int device, const struct dev_snapshot *before, struct dev_snapshot *now,
		      const char *what)
{
	double deadline = tl_now() + 30;
	const struct regen_device_info *d;
	regen_status *st;

	for (;;) {
		st = tl_status(c);
		d = tl_status_device(st, device);
		if (d->generation > before->generation && strcmp(d->state, "ready") == 0) {
			break;
		}
		ASSERT_DOUBLE_LT(tl_now(), deadline, "%s: device %d not back after 30 s: generation %llu state %s", what, device,
		                 (unsigned long long)d->generation, d->state);
		regen_status_free(st);
		usleep(20000);
	}
	take(d, now);
	tl_log("%s: device %d back in generation %llu, worker pid %lld, respawns %llu, reason '%s'", what, device,
	       (unsigned long long)now->generation, (long long)now->pid, (unsigned long long)now->respawns, d->reason);
	regen_status_free(st);
}

static bool is_name(regen_client *c, const char *name)
{
	return regen_client_error_name(c) != NULL && strcmp(regen_client_error_name(c), name) == 0;
}

/* The first data call with an old buffer after its worker went away: a
 * named error (StaleGeneration; DeviceLost acceptable) or -ECONNRESET
 * once, then StaleGeneration. */
static void old_buffer_refused(regen_client *c, struct tl_buffer *m, const char *what)
{
	struct tl_gemm_case gc;
	char why[512];
	int r, tries;

	for (tries = 0; tries < 3; tries++) {
		tl_gemm_random_case(&gc, 8);
		r = tl_gemm_run(c, m, 0, &gc, why, sizeof(why));
		ASSERT(r != 0 && r != 1, "%s: a buffer of the old generation was accepted", what);
		if (r == -ECONNRESET) {
			tl_log("%s: call in flight saw -ECONNRESET", what);
			continue;
		}
		ASSERT_EQ(r, -EREMOTE, "%s: %d (%s) %s", what, r, strerror(-r),
		          regen_client_error_message(c) ? regen_client_error_message(c) : "");
		if (is_name(c, REGEN_ERROR_STALE_GENERATION)) {
			return;
		}
		ASSERT(is_name(c, REGEN_ERROR_DEVICE_LOST), "%s: got %s: %s", what, regen_client_error_name(c),
		       regen_client_error_message(c) ? regen_client_error_message(c) : "");
	}
	ASSERT(false, "%s: no StaleGeneration after 3 calls", what);
}

struct hung_arg {
	int device;
};

static int hung_call_main(void *arg)
{
	struct hung_arg *h = arg;
	regen_client *c;
	struct tl_buffer m;
	struct tl_gemm_case gc;
	char why[512];
	double t0;
	int r;

	c = tl_client_connect(&daemon_);
	regen_client_set_timeout(c, 40);
	tl_buffer_create(c, h->device, 1 << 16, &m);
	tl_gemm_random_case(&gc, 8);
	t0 = tl_now();
	r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	tl_log("hung call returned %d (%s) after %.2f s", r,
	       regen_client_error_name(c) ? regen_client_error_name(c) : strerror(r < 0 ? -r : 0), tl_now() - t0);
	ASSERT_NE(r, -ETIMEDOUT, "the hung call was never ended (40 s)");
	ASSERT_NE(r, 1, "the hung call returned a wrong result: %s", why);
	ASSERT(r == 0 || r == -ECONNRESET ||
	       (r == -EREMOTE && (is_name(c, REGEN_ERROR_DEVICE_LOST) || is_name(c, REGEN_ERROR_TIMEOUT) ||
				 is_name(c, REGEN_ERROR_DRAINING) || is_name(c, REGEN_ERROR_STALE_GENERATION))),
	       "the hung call ended with %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	tl_buffer_free(&m);
	regen_client_destroy(c);
	return 0;
}

int main(void)
{
	struct dev_snapshot s0, s1, n0, n1, other;
	struct tl_buffer m0, m1;
	struct tl_conn raw;
	struct hung_arg harg = { .device = 1 };
	regen_client *c;
	char *reply;
	pid_t hung;
	int r;

	tl_init(230);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);
	/* A raw main-socket connection held open through every fault. */
	ASSERT_OK(tl_conn_open(&raw, daemon_.sock), "raw connect");

	tl_buffer_create(c, 0, 1 << 18, &m0);
	tl_buffer_create(c, 1, 1 << 18, &m1);
	ASSERT_GEMM_OK(c, &m0, "device 0 before faults");
	ASSERT_GEMM_OK(c, &m1, "device 1 before faults");
	snapshot(c, 0, &s0);
	snapshot(c, 1, &s1);

	/* 1. InjectFault crash: the worker aborts. */
	r = regen_inject_fault(c, 0, "crash");
	ASSERT(r == 0 || r == -ECONNRESET, "InjectFault crash: %d %s", r,
	       regen_client_error_name(c) ? regen_client_error_name(c) : strerror(-r));
	wait_back(c, 0, &s0, &n0, "crash");
	ASSERT_NE(n0.pid, s0.pid, "crash: worker pid still %lld", (long long)n0.pid);
	ASSERT_UINT_EQ(n0.respawns, s0.respawns + 1, "crash: respawns %llu -> %llu", (unsigned long long)s0.respawns,
	               (unsigned long long)n0.respawns);
	old_buffer_refused(c, &m0, "after crash");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &m0));
	ASSERT_GEMM_OK(c, &m0, "device 0 after crash and re-import");
	snapshot(c, 1, &other);
	ASSERT(other.generation == s1.generation && other.pid == s1.pid, "device 1 disturbed by device 0's crash");
	ASSERT_GEMM_OK(c, &m1, "device 1 after device 0's crash");

	/* 2. SIGKILL the worker. */
	s0 = n0;
	tl_log("killing worker pid %lld with SIGKILL", (long long)s0.pid);
	ASSERT(s0.pid > 0 && kill((pid_t)s0.pid, SIGKILL) == 0, "kill %lld: %s", (long long)s0.pid, strerror(errno));
	wait_back(c, 0, &s0, &n0, "SIGKILL");
	ASSERT_NE(n0.pid, s0.pid, "SIGKILL: worker pid still %lld", (long long)n0.pid);
	ASSERT_UINT_EQ(n0.respawns, s0.respawns + 1, "SIGKILL: respawns %llu -> %llu", (unsigned long long)s0.respawns,
	               (unsigned long long)n0.respawns);
	old_buffer_refused(c, &m0, "after SIGKILL");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &m0));
	ASSERT_GEMM_OK(c, &m0, "device 0 after SIGKILL and re-import");

	/* 3. device_lost on device 1: the context is gone, the next call
	 * fails (or the worker resets first); the generation moves. */
	snapshot(c, 1, &s1);
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "device_lost"));
	{
		struct tl_gemm_case gc;
		char why[512];

		tl_gemm_random_case(&gc, 8);
		r = tl_gemm_run(c, &m1, 0, &gc, why, sizeof(why));
		tl_log("first call after device_lost: %d %s", r,
		       regen_client_error_name(c) ? regen_client_error_name(c) : "");
		ASSERT_NE(r, 1, "a call on a lost context returned wrong data as success: %s", why);
		ASSERT(r == -ECONNRESET ||
		       (r == -EREMOTE && (is_name(c, REGEN_ERROR_DEVICE_LOST) || is_name(c, REGEN_ERROR_STALE_GENERATION))),
		       "after device_lost: %d %s %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "",
		       regen_client_error_message(c) ? regen_client_error_message(c) : "");
	}
	wait_back(c, 1, &s1, &n1, "device_lost");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 1, &m1));
	ASSERT_GEMM_OK(c, &m1, "device 1 after device_lost and re-import");

	/* 4. A hung call, ended by a Restart with a short drain deadline. */
	snapshot(c, 1, &s1);
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "hang"));
	hung = tl_fork(hung_call_main, &harg, 60);
	usleep(500000);
	regen_client_set_timeout(c, 30);
	r = regen_restart(c, 1, "test_faults: end the hang", 300, NULL);
	tl_log("Restart after hang: %d %s %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "",
	       regen_client_error_message(c) ? regen_client_error_message(c) : "");
	ASSERT(r == 0 || (r == -EREMOTE && is_name(c, REGEN_ERROR_TIMEOUT)), "Restart of a hung device: %d", r);
	ASSERT_EQ(tl_wait_children(&hung, 1, 50), 0, "the hung client failed");
	wait_back(c, 1, &s1, &n1, "hang + restart");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 1, &m1));
	ASSERT_GEMM_OK(c, &m1, "device 1 after the hang");

	/* 5. A fault found while a Release drains (device_lost, then a call
	 * queued behind a long one finds it): the Release resets instead, so
	 * the next generation serves. It had released the faulted context and
	 * served "ready" on it, every call DeviceLost for good. */
	{
		enum { BIG = 512 };
		struct tl_buffer big;
		struct regen_gemm_args g;
		uint64_t t1, t2;
		const char *name;
		struct tl_gemm_case gc;
		char why[512];

		snapshot(c, 1, &s1);
		tl_buffer_create(c, 1, (size_t)3 * BIG * BIG * 4, &big);
		memset(&g, 0, sizeof(g));
		for (int i = 0; i < 3; i++) {
			struct regen_tensor *t = i == 0 ? &g.a : i == 1 ? &g.b : &g.d;
			t->buffer = big.buf;
			t->offset = (uint64_t)i * BIG * BIG * 4;
			t->dtype = REGEN_F32;
			t->rank = 2;
			t->shape[0] = t->shape[1] = BIG;
		}
		ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &t1), "the long call");
		g.a.shape[0] = g.a.shape[1] = g.b.shape[0] = g.b.shape[1] = g.d.shape[0] = g.d.shape[1] = 4;
		ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &t2), "a small call behind it");
		ASSERT_REGEN_OK(c, regen_inject_fault(c, 1, "device_lost"));
		r = regen_release(c, 1, "test_faults: release with a fault found in its drain", NULL);
		name = regen_client_error_name(c);
		tl_log("Release while a fault is found in its drain: %d %s", r, name ? name : "");
		r = regen_wait(c, 1, t2);
		tl_log("the calls in flight: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
		wait_back(c, 1, &s1, &n1, "fault during a Release's drain");
		ASSERT_REGEN_OK(c, tl_buffer_import(c, 1, &m1));
		tl_gemm_random_case(&gc, 8);
		r = tl_gemm_run(c, &m1, 0, &gc, why, sizeof(why));
		ASSERT(r == 0, "after a Release that met a fault, device 1 serves: %d %s %s", r,
		       regen_client_error_name(c) ? regen_client_error_name(c) : why,
		       regen_client_error_message(c) ? regen_client_error_message(c) : "");
		tl_buffer_free(&big);
	}

	/* The raw connection opened at the start still answers. */
	ASSERT_EQ(tl_send_text(&raw, "{\"method\":\"io.regen.Device.Generation\"}", NULL, 0), 0, "raw send");
	reply = tl_recv_text(&raw, 10);
	ASSERT(reply != NULL && strstr(reply, "\"devices\"") != NULL, "main connection did not survive: %s",
	       reply ? reply : "(closed)");
	free(reply);
	tl_conn_close(&raw);

	tl_buffer_free(&m0);
	tl_buffer_free(&m1);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
