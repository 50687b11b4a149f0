/* libregen's reconnects. A call in flight when its worker dies returns
 * -ECONNRESET (not a timeout); the next call reconnects to the respawned
 * worker (re-reading Status) and gets io.regen.StaleGeneration for the old
 * buffer; a re-import works. When regend itself restarts, the same
 * regen_client reconnects to the main socket on its next call, and the new
 * regend goes on past the generations the old one served (kept beside the
 * socket): the old buffer is StaleGeneration, not a generation the client
 * has seen again from 1. A malformed file of generations is not trusted:
 * the regend after it starts at 1. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/lib/client.h"

static struct tl_daemon daemon_;

static int killer_main(void *arg)
{
	pid_t pid = (pid_t)(long)arg;

	usleep(400000);
	tl_log("killing worker %d with SIGKILL while a call is in flight", (int)pid);
	return kill(pid, SIGKILL) == 0 ? 0 : 1;
}

int main(void)
{
	regen_status *st = NULL;
	struct tl_gemm_case gc;
	struct tl_buffer m;
	regen_client *c;
	pid_t killer;
	char why[512];
	double t0;
	uint64_t gen;
	int r;

	tl_init(170);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);
	regen_client_set_timeout(c, 20);
	tl_buffer_create(c, 0, 1 << 18, &m);
	ASSERT_GEMM_OK(c, &m, "first gemm");
	st = tl_status(c);
	gen = tl_status_device(st, 0)->generation;

	/* 1. The worker dies under a call in flight. */
	ASSERT_REGEN_OK(c, regen_inject_fault(c, 0, "hang"));
	killer = tl_fork(killer_main, (void *)(long)tl_status_device(st, 0)->worker_pid, 20);
	regen_status_free(st);
	tl_gemm_random_case(&gc, 8);
	t0 = tl_now();
	r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	tl_log("call in flight: %d (%s) after %.2f s", r, strerror(r < 0 ? -r : 0), tl_now() - t0);
	ASSERT_EQ(r, -ECONNRESET, "the call in flight when its worker died returned %d, want -ECONNRESET", r);
	ASSERT_EQ(tl_wait_children(&killer, 1, 10), 0, "killer");
	/* The next call reconnects (waiting for the respawned worker) and is
	 * told its buffer is stale. */
	r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	ASSERT(r == -EREMOTE && strcmp(regen_client_error_name(c), REGEN_ERROR_STALE_GENERATION) == 0,
	       "next call: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &m));
	ASSERT_UINT_GT(regen_buffer_generation(m.buf), gen, "re-imported in generation %llu",
	               (unsigned long long)regen_buffer_generation(m.buf));
	ASSERT_GEMM_OK(c, &m, "gemm after the worker's respawn");

	/* 2. regend itself restarts: the client's connections all break. */
	uint64_t served = regen_buffer_generation(m.buf);
	tl_daemon_restart(&daemon_);
	r = regen_status_get(c, &st);
	if (r == -ECONNRESET) {
		tl_log("first Status after regend's restart: -ECONNRESET; retrying");
		r = regen_status_get(c, &st);
	}
	ASSERT_REGEN_OK(c, r);
	uint64_t after_restart = tl_status_device(st, 0)->generation;
	regen_status_free(st);
	tl_log("generation %llu before regend's restart, %llu after", (unsigned long long)served,
	       (unsigned long long)after_restart);
	ASSERT_UINT_GT(after_restart, served, "the new regend counts from the old one's generations");
	r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	tl_log("old buffer on the new regend: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	ASSERT(r == -ECONNRESET ||
	       (r == -EREMOTE && strcmp(regen_client_error_name(c), REGEN_ERROR_STALE_GENERATION) == 0),
	       "a buffer of the previous regend: %d %s", r, regen_client_error_name(c) ? regen_client_error_name(c) : "");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &m));
	ASSERT_UINT_GT(regen_buffer_generation(m.buf), served, "re-imported past the old regend's generations");
	ASSERT_GEMM_OK(c, &m, "gemm on the new regend");

	/* 3. A file of generations that does not parse is not trusted. */
	char path[256];
	snprintf(path, sizeof(path), "%s.generations", daemon_.sock);
	FILE *f = fopen(path, "w");
	ASSERT_NOT_NULL(f, "open %s", path);
	fputs("regen-generations 1\nepoch 12\ndevice 0 zzz\n", f);
	fclose(f);
	tl_daemon_restart(&daemon_);
	r = regen_status_get(c, &st);
	if (r == -ECONNRESET)
		r = regen_status_get(c, &st);
	ASSERT_REGEN_OK(c, r);
	ASSERT_EQ(tl_status_device(st, 0)->generation, 1, "after a malformed file, generations start at 1");
	regen_status_free(st);

	tl_buffer_free(&m);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
