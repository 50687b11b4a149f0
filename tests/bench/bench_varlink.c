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
#include <stdarg.h>
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

#define WARMUP 1000
#define STRACE_CALLS 2000
#define MSG "{\"method\":\"io.regen.Device.Generation\"}"

static char tmp_dir[64];
static char sock_path[96], echo_path[96], log_path[96];
static pid_t regend_pid = -1, echo_pid = -1;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void stop_child(pid_t *pid)
{
	int status;

	if (*pid <= 0)
		return;
	kill(*pid, SIGTERM);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(*pid, &status, WNOHANG) == *pid) {
			*pid = -1;
			return;
		}
		usleep(10000);
	}
	kill(*pid, SIGKILL);
	waitpid(*pid, &status, 0);
	*pid = -1;
}

static void cleanup(void)
{
	char cmd[256];

	stop_child(&regend_pid);
	stop_child(&echo_pid);
	if (tmp_dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
		if (system(cmd) != 0)
			fprintf(stderr, "bench_varlink: could not remove %s\n", tmp_dir);
	}
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "bench_varlink: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
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

	snprintf(echo_path, sizeof(echo_path), "%s/echo.sock", tmp_dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", echo_path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)
		die("echo socket: %s", strerror(errno));
	fflush(NULL);
	echo_pid = fork();
	if (echo_pid < 0)
		die("fork: %s", strerror(errno));
	if (echo_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		echo_main(fd);
	}
	close(fd);
}

static void start_regend(const char *regend)
{
	char worker[108];

	snprintf(sock_path, sizeof(sock_path), "%s/regend.sock", tmp_dir);
	snprintf(log_path, sizeof(log_path), "%s/regend.log", tmp_dir);
	fflush(NULL);
	regend_pid = fork();
	if (regend_pid < 0)
		die("fork: %s", strerror(errno));
	if (regend_pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		execl(regend, regend, "--socket", sock_path, "--backend", "host", "--devices", "1", (char *)NULL);
		_exit(127);
	}
	snprintf(worker, sizeof(worker), "%s.dev0", sock_path);
	for (int i = 0; i < 3000; i++) {
		int fd = connect_to(worker);
		if (fd >= 0) {
			close(fd);
			return;
		}
		usleep(10000);
	}
	die("regend's worker socket %s did not appear in 30 s (log: %s)", worker, log_path);
}

/* One message out, its answer (up to its NUL) in. */
static void round_trip(int fd, char *buf, size_t cap)
{
	static const char msg[] = MSG;
	size_t got = 0;

	if (write(fd, msg, sizeof(msg)) != (ssize_t)sizeof(msg))
		die("write: %s", strerror(errno));
	for (;;) {
		ssize_t n = read(fd, buf + got, cap - got);
		if (n <= 0)
			die("read: %s", n < 0 ? strerror(errno) : "end of stream");
		got += (size_t)n;
		if (memchr(buf + got - (size_t)n, '\0', (size_t)n))
			return;
		if (got == cap)
			die("answer over %zu bytes", cap);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct stats {
	double p50, p99, mean, min;
};

static struct stats time_calls(int fd, long iters, double *us)
{
	char buf[4096];
	struct stats s = { 0 };

	for (int i = 0; i < WARMUP; i++)
		round_trip(fd, buf, sizeof(buf));
	for (long i = 0; i < iters; i++) {
		double t0 = now_s();
		round_trip(fd, buf, sizeof(buf));
		us[i] = (now_s() - t0) * 1e6;
		s.mean += us[i];
	}
	s.mean /= (double)iters;
	qsort(us, (size_t)iters, sizeof(double), cmp_double);
	s.min = us[0];
	s.p50 = us[(iters - 1) / 2];
	s.p99 = us[(long)ceil(0.99 * (double)iters) - 1];
	return s;
}

/* The worker's pid: the process listening on <sock>.dev0 is the one whose
 * command line names it; fuser would do, but this needs nothing. */
static pid_t worker_pid(void)
{
	char cmd[256], line[64];
	pid_t pid = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "pgrep -P %d", (int)regend_pid);
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

	snprintf(out, sizeof(out), "%s/strace-%d.txt", tmp_dir, (int)pid);
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
	struct stats sv, se;
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
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/regen-vl-XXXXXX");
	if (!mkdtemp(tmp_dir)) {
		tmp_dir[0] = '\0';
		die("mkdtemp: %s", strerror(errno));
	}
	atexit(cleanup);
	signal(SIGPIPE, SIG_IGN);
	start_echo();
	start_regend(regend);
	snprintf(buf, sizeof(buf), "%s.dev0", sock_path);
	vfd = connect_to(buf);
	efd = connect_to(echo_path);
	if (vfd < 0 || efd < 0)
		die("connect: %s", strerror(errno));
	us = malloc(sizeof(double) * (size_t)iters);
	if (!us)
		die("malloc");

	/* Interleaved halves, so that a noisy neighbour hits both alike. */
	se = time_calls(efd, iters / 2, us);
	sv = time_calls(vfd, iters / 2, us);
	struct stats se2 = time_calls(efd, iters / 2, us), sv2 = time_calls(vfd, iters / 2, us);
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
			die("cannot find the worker process");
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
