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
 * With --strace (strace must be installed) it then counts the system calls
 * each side makes per call: strace -c -f attached to the worker process and
 * to the echo server while 2000 more calls run.
 *
 * Exit codes: 0 done, 1 failure, 2 usage. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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

static struct bench_stats time_calls(int fd, long iters, double *us)
{
	char buf[4096];

	for (int i = 0; i < WARMUP; i++)
		round_trip(fd, buf, sizeof(buf));
	for (long i = 0; i < iters; i++) {
		double t0 = bench_now_s();
		round_trip(fd, buf, sizeof(buf));
		us[i] = (bench_now_s() - t0) * 1e6;
	}
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

int main(int argc, char **argv)
{
	const char *regend = NULL;
	long iters = 20000;
	bool do_strace = false;
	struct bench_stats sv, se;
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

	/* Interleaved halves, so that a noisy neighbour hits both alike. */
	se = time_calls(efd, iters / 2, us);
	sv = time_calls(vfd, iters / 2, us);
	struct bench_stats se2 = time_calls(efd, iters / 2, us), sv2 = time_calls(vfd, iters / 2, us);
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
	if (do_strace) {
		char s1[512], s2[512];
		pid_t wp = worker_pid();

		if (wp <= 0)
			bench_die("cannot find the worker process");
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
