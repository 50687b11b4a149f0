/* SPDX-License-Identifier: Apache-2.0 */
/* A client that dies mid-call leaves nothing behind in the worker.
 *
 * - One client imports buffers, pipelines GEMMs and is SIGKILLed while
 *   they run: once they finish, io.regen.Device.Status's memory_used is
 *   back to its value before the client came, and the worker's thread
 *   count (its lane) too.
 * - 1000 such deaths (each: import a memfd buffer, start a GEMM, SIGKILL)
 *   leave the worker flat: open fds, VmRSS, mappings and threads within a
 *   small tolerance of their values after a warm-up, memory_used back to
 *   where it was, and the device neither respawned nor bumped. The numbers
 *   are printed. REGEN_RT_DEATHS overrides the count. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define DEVICE 0
#define BATCH 8
/* Dead clients whose calls are not done yet, at most, before more die. */
#define BACKLOG 64
/* Tolerances for "flat". */
#define FD_SLACK 2
/* glibc gives threads their own malloc arenas, up to 8 per CPU, each a
 * heap mapping and a guard: lane threads of concurrent clients may add
 * those until the cap; a leak of one mapping per client would add 1000. */
#define MAPS_SLACK (16 * sysconf(_SC_NPROCESSORS_ONLN) + 8)
#define RSS_SLACK_KB (16 * 1024)

static struct tl_daemon daemon_;

struct victim {
	int n;        /* matrix size */
	int gemms;    /* GEMMs to pipeline */
	int buffers;  /* extra buffers to import */
	int ready;    /* pipe: one byte once the calls are sent */
};

static int victim_main(void *arg)
{
	struct victim *v = arg;
	struct tl_conn c;
	struct tl_reply r;
	size_t mat = (size_t)v->n * v->n * 4;
	char id[64], extra[64];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, DEVICE)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, DEVICE, tl_memfd_open(3 * mat), 3 * mat, id, &r), 0, "import: %s", r.error);
	tl_reply_finish(&r);
	for (int i = 0; i < v->buffers; i++) {
		ASSERT_EQ(tl_import_memfd(&c, DEVICE, tl_memfd_open(mat), mat, extra, &r), 0, "import: %s", r.error);
		tl_reply_finish(&r);
	}
	for (int i = 0; i < v->gemms; i++)
		tl_send(&c, "io.regen.Compute.Gemm", NULL, 0,
			"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			"\"b\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]},"
			"\"d\":{\"buffer\":\"%s\",\"offset\":%zu,\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
			id, v->n, v->n, id, mat, v->n, v->n, id, 2 * mat, v->n, v->n);
	ASSERT(write(v->ready, "x", 1) == 1, "pipe");
	for (;;)
		pause();
}

/* Polls Status until memory_used is `want` (dies after timeout_s). */
static void wait_memory(struct tl_conn *main_conn, int64_t want, double timeout_s, const char *what)
{
	double deadline = tl_now() + timeout_s;
	struct tl_device d;

	for (;;) {
		tl_device_status(main_conn, DEVICE, &d);
		if (d.memory_used == want)
			return;
		ASSERT_DOUBLE_LT(tl_now(), deadline, "%s: memory_used %lld, not back to %lld after %.0f s", what,
		                 (long long)d.memory_used, (long long)want, timeout_s);
		usleep(20000);
	}
}

/* A dead client's connection stays until its calls are done, and a uid
 * has at most max_connections (256): the deaths come no faster than the
 * device runs their GEMMs, a uid alone running as many at once as it has
 * CPUs. Each dead client holds `each` bytes of memory_used until then. */
static void wait_backlog(struct tl_conn *main_conn, int64_t base, int64_t each)
{
	double deadline = tl_now() + 30;
	struct tl_device d;

	for (;;) {
		tl_device_status(main_conn, DEVICE, &d);
		if (d.memory_used <= base + BACKLOG * each)
			return;
		ASSERT_DOUBLE_LT(tl_now(), deadline, "dead clients' calls: memory_used %lld still past %d clients' after 30 s",
		                 (long long)d.memory_used, BACKLOG);
		usleep(1000);
	}
}

static void kill_batch(struct victim *v, int n)
{
	pid_t pids[BATCH];
	int p[2];
	char buf[BATCH];
	size_t got = 0;

	ASSERT(pipe(p) == 0, "pipe");
	v->ready = p[1];
	for (int i = 0; i < n; i++)
		pids[i] = tl_fork(victim_main, v, 0);
	close(p[1]);
	double deadline = tl_now() + 30;
	while (got < (size_t)n) {
		ssize_t k = read(p[0], buf, (size_t)n - got);
		ASSERT_GT(k, 0, "a victim died before sending its calls");
		got += (size_t)k;
		ASSERT_DOUBLE_LT(tl_now(), deadline, "victims too slow");
	}
	close(p[0]);
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
	for (int i = 0; i < n; i++) {
		int st;
		ASSERT(waitpid(pids[i], &st, 0) == pids[i] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
		       "victim %d did not die by SIGKILL", (int)pids[i]);
	}
}

static void print_proc(const char *when, const struct tl_proc *p, int64_t mem)
{
	tl_log("%-22s fds %4ld  VmRSS %7ld kB  maps %5ld  threads %3ld  memory_used %lld", when, p->fds, p->rss_kb, p->maps,
	       p->threads, (long long)mem);
}

/* Waits for the worker to settle (fds and threads back), then reads it. */
static void settle(pid_t pid, const struct tl_proc *want, struct tl_proc *out, double timeout_s)
{
	double deadline = tl_now() + timeout_s;

	for (;;) {
		tl_proc_read(pid, out);
		if (out->fds <= want->fds + FD_SLACK && out->threads <= want->threads)
			return;
		if (tl_now() > deadline)
			return;
		usleep(50000);
	}
}

int main(void)
{
	struct tl_conn main_conn;
	struct tl_device before, during, after;
	struct tl_proc p0, p1, p_after;
	const char *env = getenv("REGEN_RT_DEATHS");
	int deaths = env ? atoi(env) : 1000;

	tl_init(300);
	tl_daemon_start(&daemon_, NULL);
	ASSERT_OK(tl_conn_open(&main_conn, daemon_.sock), "connect");
	tl_device_status(&main_conn, DEVICE, &before);
	pid_t worker = (pid_t)before.worker_pid;
	ASSERT_GT(worker, 0, "no worker pid in Status");

	/* ---- One death with a lot in flight ---- */
	{
		struct victim v = { .n = 256, .gemms = 8, .buffers = 4 };
		pid_t pid;
		int p[2];
		char b;

		tl_proc_read(worker, &p0);
		ASSERT(pipe(p) == 0, "pipe");
		v.ready = p[1];
		pid = tl_fork(victim_main, &v, 0);
		close(p[1]);
		ASSERT(read(p[0], &b, 1) == 1, "victim died early");
		close(p[0]);
		tl_device_status(&main_conn, DEVICE, &during);
		tl_proc_read(worker, &p1);
		kill(pid, SIGKILL);
		ASSERT_EQ(tl_wait(pid, 10), 128 + SIGKILL, "victim survived SIGKILL");
		size_t mat = 256 * 256 * 4;
		ASSERT_GE(during.memory_used, before.memory_used + (int64_t)(7 * mat),
		          "the victim's buffers were not counted: memory_used %lld -> %lld", (long long)before.memory_used,
		          (long long)during.memory_used);
		wait_memory(&main_conn, before.memory_used, 30, "after one SIGKILL mid-GEMM");
		settle(worker, &p0, &p_after, 10);
		print_proc("before the client", &p0, before.memory_used);
		print_proc("client mid-GEMM", &p1, during.memory_used);
		print_proc("after its SIGKILL", &p_after, before.memory_used);
		ASSERT_EQ(p_after.threads, p0.threads, "the dead client's lane thread is still there (%ld -> %ld)", p0.threads,
		          p_after.threads);
		ASSERT_LE(p_after.fds, p0.fds, "the dead client's fds are still open in the worker (%ld -> %ld)", p0.fds,
		          p_after.fds);
	}

	/* ---- Many deaths ---- */
	{
		struct victim v = { .n = 128, .gemms = 1, .buffers = 0 };
		double t0;

		/* Warm-up: malloc arenas and libuv's tables reach their size. */
		for (int i = 0; i < 200; i += BATCH)
			kill_batch(&v, BATCH);
		wait_memory(&main_conn, before.memory_used, 30, "after the warm-up");
		settle(worker, &p0, &p0, 10);
		tl_proc_read(worker, &p0);
		print_proc("after warm-up", &p0, before.memory_used);

		t0 = tl_now();
		for (int i = 0; i < deaths; i += BATCH) {
			kill_batch(&v, deaths - i < BATCH ? deaths - i : BATCH);
			wait_backlog(&main_conn, before.memory_used, (int64_t)v.n * v.n * 4 * 3);
		}
		double took = tl_now() - t0;
		wait_memory(&main_conn, before.memory_used, 60, "after the deaths");
		settle(worker, &p0, &p1, 30);
		print_proc("after deaths", &p1, before.memory_used);
		tl_log("%d clients SIGKILLed mid-GEMM in %.1f s (%.1f ms each)", deaths, took, took * 1000 / deaths);
		tl_log("deltas: fds %+ld  VmRSS %+ld kB  maps %+ld  threads %+ld", p1.fds - p0.fds, p1.rss_kb - p0.rss_kb,
		       p1.maps - p0.maps, p1.threads - p0.threads);
		ASSERT_LE(p1.fds, p0.fds + FD_SLACK, "fds leak: %ld -> %ld after %d deaths", p0.fds, p1.fds, deaths);
		ASSERT_LE(p1.threads, p0.threads, "threads leak: %ld -> %ld", p0.threads, p1.threads);
		ASSERT_LE(p1.maps, p0.maps + MAPS_SLACK, "mappings leak: %ld -> %ld (slack %ld)", p0.maps, p1.maps,
		          (long)MAPS_SLACK);
		/* ASan keeps freed memory in quarantine (256 MB by default): RSS
		 * says nothing about leaks there, LeakSanitizer does. */
		if (p1.asan)
			tl_log("the worker runs under AddressSanitizer: RSS not checked");
		else
			ASSERT_LE(p1.rss_kb, p0.rss_kb + RSS_SLACK_KB, "RSS grows: %ld -> %ld kB", p0.rss_kb, p1.rss_kb);
	}
	tl_device_status(&main_conn, DEVICE, &after);
	ASSERT(after.worker_pid == before.worker_pid && after.respawns == before.respawns &&
	       after.generation == before.generation && strcmp(after.state, "ready") == 0,
	       "the device changed: worker %lld -> %lld, generation %lld -> %lld, state %s", (long long)before.worker_pid,
	       (long long)after.worker_pid, (long long)before.generation, (long long)after.generation, after.state);
	tl_conn_close(&main_conn);
	tl_log("PASS");
	return 0;
}
