/* SPDX-License-Identifier: Apache-2.0 */
/* bench_varlink: what a trivial Varlink call on a worker socket costs
 * against a bare AF_UNIX echo of the same bytes, in the same run.
 *
 *   bench_varlink REGEND_PATH [--iters N] [--strace]
 *
 * Starts its own regend (host backend, one device) in a fresh temporary
 * directory, and beside it an echo server: a process that reads a socket
 * and writes back what it read, with nothing in between (blocking read and
 * write, no event loop, no parsing). Then times, one call at a time on one
 * connection each, io.regen.Device.Generation on the worker socket and the
 * echo of the same message, and prints a markdown table with the ratio.
 *
 * Then where each call's time went: what the kernel counted for each
 * thread (/proc/PID/task/TID/schedstat, status and sched) over the timed
 * calls, per call: the server's and the client's time on a CPU, the rest of
 * the wall time (neither side running: a wake-up on its way, an idle CPU
 * waking, other work on the CPU), the server's wait on a run queue, the
 * context switches and migrations of each, and the wake-ups of the
 * worker's threads beside its loop. And whether it drifts with the run's
 * length: the p50 of each block of BLOCK calls in turn, first, last and
 * worst.
 *
 * With --strace (strace must be installed) it then counts the system calls
 * each side makes per call: strace -c -f attached to the worker process and
 * to the echo server while 2000 more calls run.
 *
 * Exit codes: 0 done, 1 failure, 2 usage. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_daemon.h"

#define WARMUP 1000
#define STRACE_CALLS 2000
/* Calls per block of the drift table: the short run that issue 30 saw at
 * 2.2x of the echo (12-15x after 20,000). */
#define BLOCK 2000
#define THREADS_MAX 16
#define MSG "{\"method\":\"io.regen.Device.Generation\"}"

static char echo_path[96];
static pid_t echo_pid = -1;

static void stop_echo(void)
{
	bench_stop_child(&echo_pid);
}

static int connect_to(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* The echo server: one connection, read and write back until it ends. */
static void echo_main(int listener)
{
	char buf[65536];
	int fd = accept(listener, NULL, NULL);

	if (fd < 0)
		_exit(1);
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf)), off = 0;

		if (n <= 0)
			_exit(0);
		while (off < n) {
			ssize_t w = write(fd, buf + off, (size_t)(n - off));
			if (w <= 0)
				_exit(0);
			off += w;
		}
	}
}

static void start_echo(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(echo_path, sizeof(echo_path), "%s/echo.sock", bench_tmp_dir());
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", echo_path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)
		bench_die("echo socket: %s", strerror(errno));
	fflush(NULL);
	echo_pid = fork();
	if (echo_pid < 0)
		bench_die("fork: %s", strerror(errno));
	if (echo_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		echo_main(fd);
	}
	close(fd);
}

/* One message out, its answer (up to its NUL) in. */
static void round_trip(int fd, char *buf, size_t cap)
{
	static const char msg[] = MSG;
	size_t got = 0;

	if (write(fd, msg, sizeof(msg)) != (ssize_t)sizeof(msg))
		bench_die("write: %s", strerror(errno));
	for (;;) {
		ssize_t n = read(fd, buf + got, cap - got);
		if (n <= 0)
			bench_die("read: %s", n < 0 ? strerror(errno) : "end of stream");
		got += (size_t)n;
		if (memchr(buf + got - (size_t)n, '\0', (size_t)n))
			return;
		if (got == cap)
			bench_die("answer over %zu bytes", cap);
	}
}

/* ---- What the kernel counted for each thread ---- */

/* One thread's counters; -1 where the kernel does not keep one. */
struct thread_counts {
	pid_t tid;
	double run_ns, wait_ns;        /* on a CPU; runnable, waiting for one */
	long switches;                 /* voluntary and not */
	long migrations;
};

/* A process's threads, the first its main thread (the worker's loop). */
struct proc_counts {
	int n;
	struct thread_counts t[THREADS_MAX];
};

static long field_after(const char *path, const char *key)
{
	char line[256];
	size_t k = strlen(key);
	long v = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, key, k) == 0) {
			const char *p = line + k;
			while (*p == ' ' || *p == ':' || *p == '\t')
				p++;
			v = strtol(p, NULL, 10);
			break;
		}
	}
	fclose(f);
	return v;
}

static void read_thread(pid_t pid, pid_t tid, struct thread_counts *c)
{
	char path[96];
	unsigned long long run = 0, wait = 0;
	long vol, invol;
	FILE *f;

	c->tid = tid;
	c->run_ns = c->wait_ns = -1;
	snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, (int)tid);
	if ((f = fopen(path, "r"))) {
		if (fscanf(f, "%llu %llu", &run, &wait) == 2) {
			c->run_ns = (double)run;
			c->wait_ns = (double)wait;
		}
		fclose(f);
	}
	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)tid);
	vol = field_after(path, "voluntary_ctxt_switches");
	invol = field_after(path, "nonvoluntary_ctxt_switches");
	c->switches = vol < 0 || invol < 0 ? -1 : vol + invol;
	snprintf(path, sizeof(path), "/proc/%d/task/%d/sched", (int)pid, (int)tid);
	c->migrations = field_after(path, "se.nr_migrations");
}

static void read_proc(pid_t pid, struct proc_counts *pc)
{
	char path[64];
	DIR *d;
	struct dirent *e;

	pc->n = 0;
	read_thread(pid, pid, &pc->t[pc->n++]);
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return;
	while ((e = readdir(d)) && pc->n < THREADS_MAX) {
		pid_t tid = (pid_t)atoi(e->d_name);
		if (tid > 0 && tid != pid)
			read_thread(pid, tid, &pc->t[pc->n++]);
	}
	closedir(d);
}

/* What one path cost per call over its timed calls, both rounds. */
struct where {
	long calls;
	double wall_s;
	double server_cpu_ns, server_wait_ns, client_cpu_ns;
	long server_switches, client_switches, server_migrations, client_migrations;
	int beside;                    /* threads beside the server's loop */
	double beside_cpu_ns;
	long beside_switches;
	bool unknown;                  /* some counter missing */
};

static const struct thread_counts *find_thread(const struct proc_counts *pc, pid_t tid)
{
	for (int i = 0; i < pc->n; i++)
		if (pc->t[i].tid == tid)
			return &pc->t[i];
	return NULL;
}

static double delta(double after, double before, bool *unknown)
{
	if (after < 0 || before < 0) {
		*unknown = true;
		return 0;
	}
	return after - before;
}

/* Adds what happened between two readings of the server and the client. */
static void where_add(struct where *w, const struct proc_counts *s0, const struct proc_counts *s1,
		      const struct proc_counts *c0, const struct proc_counts *c1)
{
	const struct thread_counts *sa = &s0->t[0], *sb = &s1->t[0], *ca = &c0->t[0], *cb = &c1->t[0];

	w->server_cpu_ns += delta(sb->run_ns, sa->run_ns, &w->unknown);
	w->server_wait_ns += delta(sb->wait_ns, sa->wait_ns, &w->unknown);
	w->server_switches += (long)delta((double)sb->switches, (double)sa->switches, &w->unknown);
	w->server_migrations += (long)delta((double)sb->migrations, (double)sa->migrations, &w->unknown);
	w->client_cpu_ns += delta(cb->run_ns, ca->run_ns, &w->unknown);
	w->client_switches += (long)delta((double)cb->switches, (double)ca->switches, &w->unknown);
	w->client_migrations += (long)delta((double)cb->migrations, (double)ca->migrations, &w->unknown);
	w->beside = s1->n - 1;
	for (int i = 1; i < s1->n; i++) {
		const struct thread_counts *before = find_thread(s0, s1->t[i].tid);
		if (!before)
			continue;
		w->beside_cpu_ns += delta(s1->t[i].run_ns, before->run_ns, &w->unknown);
		w->beside_switches += (long)delta((double)s1->t[i].switches, (double)before->switches, &w->unknown);
	}
}

/* ---- Timing ---- */

/* The p50s of the blocks of BLOCK calls in turn (a short last block is
 * left out unless it is the only one). */
struct drift {
	double first, last, worst;
};

static struct drift drift_of(const double *us, long n)
{
	struct drift d = { 0 };
	long blocks = n / BLOCK > 0 ? n / BLOCK : 1, len = n / BLOCK > 0 ? BLOCK : n;
	double *tmp = malloc(sizeof(double) * (size_t)len);

	if (!tmp)
		bench_die("malloc");
	for (long b = 0; b < blocks; b++) {
		memcpy(tmp, us + b * len, sizeof(double) * (size_t)len);
		double p50 = bench_summarize(tmp, (size_t)len).p50;
		if (b == 0)
			d.first = p50;
		d.last = p50;
		d.worst = fmax(d.worst, p50);
	}
	free(tmp);
	return d;
}

/* One round on fd after its warm-up: its figures, its drift, and what the
 * server (pid) and this thread were counted for meanwhile. */
static struct bench_stats time_calls(int fd, long iters, double *us, pid_t server, struct where *w,
				     struct drift *drift)
{
	struct proc_counts s0, s1, c0, c1;
	char buf[4096];
	double t0;

	for (int i = 0; i < WARMUP; i++)
		round_trip(fd, buf, sizeof(buf));
	read_proc(server, &s0);
	read_proc(getpid(), &c0);
	t0 = bench_now_s();
	for (long i = 0; i < iters; i++) {
		double t = bench_now_s();
		round_trip(fd, buf, sizeof(buf));
		us[i] = (bench_now_s() - t) * 1e6;
	}
	w->wall_s += bench_now_s() - t0;
	read_proc(server, &s1);
	read_proc(getpid(), &c1);
	w->calls += iters;
	where_add(w, &s0, &s1, &c0, &c1);
	*drift = drift_of(us, iters);
	return bench_summarize(us, (size_t)iters);
}

/* The worker's pid: the process listening on <sock>.dev0 is the one whose
 * command line names it; fuser would do, but this needs nothing. */
static pid_t worker_pid(void)
{
	char cmd[256], line[64];
	pid_t pid = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "pgrep -P %d", (int)bench_regend_pid());
	f = popen(cmd, "r");
	if (f && fgets(line, sizeof(line), f))
		pid = (pid_t)atoi(line);
	if (f)
		pclose(f);
	return pid;
}

/* strace -c -f on pid while `calls` round trips run on fd: system calls
 * per round trip, and the three most frequent. */
static void count_syscalls(const char *what, pid_t pid, int fd, char *summary, size_t size)
{
	char out[192], line[256], buf[4096];
	pid_t st;
	long total = 0;
	FILE *f;
	size_t used = 0;

	snprintf(out, sizeof(out), "%s/strace-%d.txt", bench_tmp_dir(), (int)pid);
	fflush(NULL);
	st = fork();
	if (st == 0) {
		char p[16];
		snprintf(p, sizeof(p), "%d", (int)pid);
		int nul = open("/dev/null", O_WRONLY);
		dup2(nul, STDERR_FILENO);
		execlp("strace", "strace", "-c", "-f", "-p", p, "-o", out, (char *)NULL);
		_exit(127);
	}
	usleep(500000);   /* attached */
	for (int i = 0; i < STRACE_CALLS; i++)
		round_trip(fd, buf, sizeof(buf));
	usleep(100000);
	kill(st, SIGINT);
	waitpid(st, NULL, 0);
	f = fopen(out, "r");
	if (!f) {
		snprintf(summary, size, "%s: strace gave nothing (is it installed and allowed?)", what);
		return;
	}
	used = (size_t)snprintf(summary, size, "%s:", what);
	while (fgets(line, sizeof(line), f)) {
		char *tok[8], *save = NULL;
		int n = 0;
		long calls, errors = 0;

		for (char *t = strtok_r(line, " \t\n", &save); t && n < 8; t = strtok_r(NULL, " \t\n", &save))
			tok[n++] = t;
		/* % time, seconds, usecs/call, calls, [errors,] syscall */
		if (n < 5 || !strchr("0123456789", tok[0][0]))
			continue;
		calls = atol(tok[3]);
		if (n >= 6)
			errors = atol(tok[4]);
		if (strcmp(tok[n - 1], "total") == 0) {
			total = calls;
			continue;
		}
		if (used < size && calls >= STRACE_CALLS / 20)
			used += (size_t)snprintf(summary + used, size - used, " %s %.2f%s", tok[n - 1],
						 (double)calls / STRACE_CALLS, errors ? " (some failed)" : "");
	}
	fclose(f);
	if (used < size)
		snprintf(summary + used, size - used, "; total %.2f per call", (double)total / STRACE_CALLS);
}

/* Whether the round trip drifts with the run's length, as issue 30 saw. */
static void print_drift(long per_round, const struct drift *de, const struct drift *dv)
{
	printf("\nrun length: p50 µs of each block of %d calls in turn (%ld calls a round)\n\n",
	       per_round >= BLOCK ? BLOCK : (int)per_round, per_round);
	printf("| path | round | first block | last block | worst block |\n|---|---:|---:|---:|---:|\n");
	for (int r = 0; r < 2; r++)
		printf("| echo | %d | %.1f | %.1f | %.1f |\n", r + 1, de[r].first, de[r].last, de[r].worst);
	for (int r = 0; r < 2; r++)
		printf("| Generation | %d | %.1f | %.1f | %.1f |\n", r + 1, dv[r].first, dv[r].last, dv[r].worst);
	printf("\nworst Generation block / worst echo block: %.2fx\n",
	       fmax(dv[0].worst, dv[1].worst) / fmax(de[0].worst, de[1].worst));
}

/* Issue 30's target: within 2x of the echo at any run length, the run's
 * p50 and the worst block's. */
static void print_target(double run_ratio, const struct drift *de, const struct drift *dv)
{
	double block_ratio = fmax(dv[0].worst, dv[1].worst) / fmax(de[0].worst, de[1].worst);

	printf("\nissue 30's target (Generation within 2x of the echo at any run length: the run's p50 %.2fx, "
	       "the worst block %.2fx): %s\n",
	       run_ratio, block_ratio, run_ratio <= 2 && block_ratio <= 2 ? "met" : "missed");
}

static void print_where_row(const char *path, const struct where *w)
{
	double n = (double)w->calls, wall = w->wall_s * 1e6 / n, server = w->server_cpu_ns / 1e3 / n,
	       client = w->client_cpu_ns / 1e3 / n;

	printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f / %.1f |\n", path, wall, server, client,
	       wall - server - client, w->server_wait_ns / 1e3 / n, (double)w->server_switches / n,
	       (double)w->client_switches / n, (double)w->server_migrations * 1000 / n,
	       (double)w->client_migrations * 1000 / n);
}

/* Where a call's time went, from what the kernel counted. */
static void print_where(const struct where *we, const struct where *wv)
{
	printf("\nwhere a call's time went, means per call over both rounds' timed calls (the kernel's counts "
	       "for each thread: /proc/PID/task/TID/schedstat, status, sched)\n\n");
	printf("| path | wall µs | server on a CPU µs | client on a CPU µs | neither µs | server run-queue wait µs "
	       "| server switches | client switches | migrations per 1,000 (server / client) |\n"
	       "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	print_where_row("echo", we);
	print_where_row("Generation (the worker's loop thread)", wv);
	printf("\n\"neither\": the wall time less both sides' time on a CPU: wake-ups on their way, idle CPUs "
	       "waking, other work (a client's spurious wake-up overlaps the server's time and hides some). "
	       "The worker's %d thread(s) beside its loop: %.0f wake-ups/s, %.2f µs on a CPU per call.\n",
	       wv->beside, (double)wv->beside_switches / wv->wall_s, wv->beside_cpu_ns / 1e3 / (double)wv->calls);
	if (we->unknown || wv->unknown)
		printf("(some counters are missing on this kernel: their columns read 0)\n");
}

int main(int argc, char **argv)
{
	const char *regend = NULL;
	long iters = 20000;
	bool do_strace = false;
	struct bench_stats sv, se;
	struct where we = { 0 }, wv = { 0 };
	struct drift de[2], dv[2];
	pid_t wp;
	double *us;
	char buf[4096];
	int vfd, efd;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
			iters = strtol(argv[++i], NULL, 10);
		} else if (strcmp(argv[i], "--strace") == 0) {
			do_strace = true;
		} else if (argv[i][0] != '-' && !regend) {
			regend = argv[i];
		} else {
			regend = NULL;
			break;
		}
	}
	if (!regend || iters < 100) {
		fprintf(stderr, "usage: bench_varlink REGEND_PATH [--iters N (>= 100)] [--strace]\n");
		return 2;
	}
	bench_init("bench_varlink");
	atexit(stop_echo);
	signal(SIGPIPE, SIG_IGN);
	start_echo();
	bench_start_regend(regend, "host");
	regen_client_destroy(bench_wait_ready(30));
	snprintf(buf, sizeof(buf), "%s.dev0", bench_socket());
	vfd = connect_to(buf);
	efd = connect_to(echo_path);
	if (vfd < 0 || efd < 0)
		bench_die("connect: %s", strerror(errno));
	us = malloc(sizeof(double) * (size_t)iters);
	if (!us)
		bench_die("malloc");

	wp = worker_pid();
	if (wp <= 0)
		bench_die("cannot find the worker process");

	/* Interleaved halves, so that a noisy neighbour hits both alike. */
	se = time_calls(efd, iters / 2, us, echo_pid, &we, &de[0]);
	sv = time_calls(vfd, iters / 2, us, wp, &wv, &dv[0]);
	struct bench_stats se2 = time_calls(efd, iters / 2, us, echo_pid, &we, &de[1]),
			   sv2 = time_calls(vfd, iters / 2, us, wp, &wv, &dv[1]);
	se.p50 = fmin(se.p50, se2.p50);
	se.p99 = fmin(se.p99, se2.p99);
	se.mean = fmin(se.mean, se2.mean);
	se.min = fmin(se.min, se2.min);
	sv.p50 = fmin(sv.p50, sv2.p50);
	sv.p99 = fmin(sv.p99, sv2.p99);
	sv.mean = fmin(sv.mean, sv2.mean);
	sv.min = fmin(sv.min, sv2.min);

	printf("one call at a time on one connection, %ld calls in two rounds after %d warm-up each "
	       "(the better round's figures)\n\n", iters, WARMUP);
	printf("| path | p50 µs | p99 µs | mean µs | min µs |\n|---|---:|---:|---:|---:|\n");
	printf("| bare AF_UNIX echo of the same %zu bytes | %.1f | %.1f | %.1f | %.1f |\n", sizeof(MSG), se.p50,
	       se.p99, se.mean, se.min);
	printf("| io.regen.Device.Generation, worker socket | %.1f | %.1f | %.1f | %.1f |\n", sv.p50, sv.p99, sv.mean,
	       sv.min);
	printf("\nGeneration / echo: p50 %.2fx, mean %.2fx\n", sv.p50 / se.p50, sv.mean / se.mean);
	print_drift(iters / 2, de, dv);
	print_where(&we, &wv);
	print_target(sv.p50 / se.p50, de, dv);
	if (do_strace) {
		char s1[512], s2[512];

		count_syscalls("worker (regend)", wp, vfd, s1, sizeof(s1));
		count_syscalls("echo server", echo_pid, efd, s2, sizeof(s2));
		printf("\nsystem calls per call (strace -c -f, %d calls):\n- %s\n- %s\n", STRACE_CALLS, s1, s2);
	}
	fflush(stdout);
	close(vfd);
	close(efd);
	free(us);
	return 0;
}
