/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's reconnects. A call in flight when its worker dies returns
 * -ECONNRESET (not a timeout); the next call reconnects to the respawned
 * worker (re-reading Status) and gets io.regen.StaleGeneration for the old
 * buffer; a re-import works. When regend itself restarts, the same
 * regen_client reconnects to the main socket on its next call, and the new
 * regend goes on past the generations the old one served (kept beside the
 * socket): the old buffer is StaleGeneration, not a generation the client
 * has seen again from 1. A malformed file of generations is not trusted:
 * the regend after it starts at 1. First, a forked child that uses its
 * parent's client connects as itself and leaves the parent's lane alone. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/lib/client.h"

static struct tl_daemon daemon_;

/* D (at 512) = A (at 0) x B (at 256), 8x8 f32, in b. */
static void small_gemm(regen_buffer *b, struct regen_gemm_args *g)
{
	struct regen_tensor *ts[] = { &g->a, &g->b, &g->d };

	memset(g, 0, sizeof(*g));
	for (int i = 0; i < 3; i++) {
		ts[i]->buffer = b;
		ts[i]->offset = (uint64_t)i * 256;
		ts[i]->dtype = REGEN_F32;
		ts[i]->rank = 2;
		ts[i]->shape[0] = ts[i]->shape[1] = 8;
	}
}

struct fork_case {
	regen_client *c;
	struct tl_buffer *parents;
	uint64_t ticket;          /* a call the parent queued and has not waited for */
	regen_watcher *watcher;   /* the parent's, its first events unread */
};

/* The child uses its parent's client: none of it may reach the parent's
 * connections or ring. */
static int forked_child_main(void *arg)
{
	struct fork_case *fc = arg;
	struct regen_gemm_args g;
	const struct regen_watch_event *ev;
	struct tl_buffer mine;
	int r;

	r = regen_watcher_next(fc->watcher, 5, &ev);
	ASSERT_EQ(r, -ECONNRESET, "the parent's watcher, read in the child: %d", r);
	regen_watcher_close(fc->watcher);
	r = regen_wait(fc->c, 0, fc->ticket);
	ASSERT_EQ(r, -ECONNRESET, "the parent's queued call, waited for in the child: %d (%s)", r,
		  regen_client_error_message(fc->c) ? regen_client_error_message(fc->c) : "");
	ASSERT(strstr(regen_client_error_message(fc->c), "forked") != NULL, "says why: %s",
	       regen_client_error_message(fc->c));
	small_gemm(fc->parents->buf, &g);
	r = regen_gemm(fc->c, &g);
	ASSERT_EQ(r, -EINVAL, "a GEMM on the parent's buffer in the child: %d (%s)", r,
		  regen_client_error_message(fc->c) ? regen_client_error_message(fc->c) : "");
	tl_buffer_create(fc->c, 0, 1 << 16, &mine);
	for (int i = 0; i < 20; i++)
		ASSERT_GEMM_OK(fc->c, &mine, "the child's own GEMM");
	tl_buffer_free(&mine);
	regen_client_destroy(fc->c);
	return 0;
}

/* 0. A forked child with its parent's client: it connects afresh as
 * itself; the parent's connection, ring, queued call and buffer stay the
 * parent's, untouched. */
static void a_forked_child_connects_as_itself(regen_client *c, struct tl_buffer *m)
{
	const struct regen_watch_event *ev;
	struct regen_gemm_args g;
	struct fork_case fc = { .c = c, .parents = m };
	enum regen_transport before;
	pid_t child;

	ASSERT_GEMM_OK(c, m, "the parent's GEMM before the fork");
	before = regen_client_transport(c, 0);
	small_gemm(m->buf, &g);
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &fc.ticket), "queued before the fork");
	ASSERT_REGEN_OK(c, regen_watcher_open(c, &fc.watcher));
	child = tl_fork(forked_child_main, &fc, 60);
	ASSERT_EQ(tl_wait(child, 60), 0, "the forked child");
	ASSERT_REGEN_OK(c, regen_watcher_next(fc.watcher, 10, &ev), "the parent's watcher after the child");
	ASSERT(ev->generation > 0, "a device's state: generation %llu", (unsigned long long)ev->generation);
	regen_watcher_close(fc.watcher);
	ASSERT_REGEN_OK(c, regen_wait(c, 0, fc.ticket), "the parent's queued call, answered to the parent");
	for (int i = 0; i < 20; i++)
		ASSERT_GEMM_OK(c, m, "the parent's GEMM after the child");
	ASSERT_EQ(regen_client_transport(c, 0), before, "the parent's lane kept its transport");
	tl_log("a forked child: its own connection; the parent's lane untouched");
}

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
	a_forked_child_connects_as_itself(c, &m);
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
