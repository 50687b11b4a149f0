/* libregen's reconnects. A call in flight when its worker dies returns
 * -ECONNRESET (not a timeout); the next call reconnects to the respawned
 * worker (re-reading Status) and gets io.regen.StaleGeneration for the old
 * buffer; a re-import works. When regend itself restarts, the same
 * regen_client reconnects to the main socket on its next call. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "itest.h"

static struct it_daemon daemon_;

static void gemm_ok(regen_client *c, struct it_mem *m, const char *what)
{
	struct it_gemm_case gc;
	char why[512] = "";
	int r;

	it_gemm_random_case(&gc, 24);
	r = it_gemm_run(c, m, 0, &gc, why, sizeof(why));
	if (r < 0) {
		it_fail_call(__FILE__, __LINE__, what, c, r);
	}
	CHECK(r == 0, "%s: wrong result: %s", what, why);
}

static int killer_main(void *arg)
{
	pid_t pid = (pid_t)(long)arg;

	usleep(400000);
	it_log("killing worker %d with SIGKILL while a call is in flight", (int)pid);
	return kill(pid, SIGKILL) == 0 ? 0 : 1;
}

int main(void)
{
	regen_status *st = NULL;
	struct it_gemm_case gc;
	struct it_mem m;
	regen_client *c;
	pid_t killer;
	char why[512];
	double t0;
	uint64_t gen;
	int r;

	it_rand_seed(it_rand_seed_default());
	it_daemon_start(&daemon_, NULL, 170);
	c = it_connect(&daemon_);
	regen_client_set_timeout(c, 20);
	it_mem_create(c, 0, 1 << 18, &m);
	gemm_ok(c, &m, "first gemm");
	st = it_status(c);
	gen = it_device(st, 0)->generation;

	/* 1. The worker dies under a call in flight. */
	CHECK_OK(c, regen_inject_fault(c, 0, "hang"));
	killer = it_fork(killer_main, (void *)(long)it_device(st, 0)->worker_pid, 20);
	regen_status_free(st);
	it_gemm_random_case(&gc, 8);
	t0 = it_now();
	r = it_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	it_log("call in flight: %d (%s) after %.2f s", r, strerror(r < 0 ? -r : 0), it_now() - t0);
	CHECK(r == -ECONNRESET, "the call in flight when its worker died returned %d, want -ECONNRESET", r);
	CHECK(it_wait_children(&killer, 1, 10) == 0, "killer");
	/* The next call reconnects (waiting for the respawned worker) and is
	 * told its buffer is stale. */
	r = it_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	CHECK(r == -EREMOTE && strcmp(regen_client_error_name(c), REGEN_ERROR_STALE_GENERATION) == 0,
	      "next call: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	CHECK_OK(c, it_mem_import(c, 0, &m));
	CHECK(regen_buffer_generation(m.buf) > gen, "re-imported in generation %llu",
	      (unsigned long long)regen_buffer_generation(m.buf));
	gemm_ok(c, &m, "gemm after the worker's respawn");

	/* 2. regend itself restarts: the client's connections all break. */
	it_daemon_restart(&daemon_, NULL);
	r = regen_status_get(c, &st);
	if (r == -ECONNRESET) {
		it_log("first Status after regend's restart: -ECONNRESET; retrying");
		r = regen_status_get(c, &st);
	}
	CHECK_OK(c, r);
	regen_status_free(st);
	r = it_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	it_log("old buffer on the new regend: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	CHECK(r == -ECONNRESET ||
	      (r == -EREMOTE && (strcmp(regen_client_error_name(c), REGEN_ERROR_STALE_GENERATION) == 0 ||
				 strcmp(regen_client_error_name(c), REGEN_ERROR_NO_SUCH_OBJECT) == 0)),
	      "a buffer of the previous regend: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	CHECK_OK(c, it_mem_import(c, 0, &m));
	gemm_ok(c, &m, "gemm on the new regend");

	it_mem_free(&m);
	regen_client_destroy(c);
	CHECK(it_daemon_alive(&daemon_), "regend died");
	it_log("PASS");
	return 0;
}
