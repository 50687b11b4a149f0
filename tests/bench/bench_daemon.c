/* SPDX-License-Identifier: Apache-2.0 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench_daemon.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *bench_name = "bench";
static char tmp_dir[64], sock_path[128], log_path[128];
static pid_t regend_pid = -1;

double bench_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void bench_stop_child(pid_t *pid)
{
	double deadline = bench_now_s() + 10.0;
	int status;

	if (*pid <= 0)
		return;
	kill(*pid, SIGTERM);
	for (;;) {
		pid_t r = waitpid(*pid, &status, WNOHANG);
		if (r == *pid || (r < 0 && errno != EINTR))
			break;
		if (bench_now_s() > deadline) {
			fprintf(stderr, "%s: pid %d still running 10 s after SIGTERM; SIGKILL\n", bench_name, (int)*pid);
			kill(*pid, SIGKILL);
			waitpid(*pid, &status, 0);
			break;
		}
		usleep(10000);
	}
	*pid = -1;
}

static void remove_tmp_dir(void)
{
	struct dirent *e;
	char path[512];
	DIR *d;

	if (tmp_dir[0] == '\0' || (d = opendir(tmp_dir)) == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", tmp_dir, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(tmp_dir);
	tmp_dir[0] = '\0';
}

static void cleanup(void)
{
	bench_stop_child(&regend_pid);
	remove_tmp_dir();
}

void bench_die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", bench_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1); /* atexit: cleanup */
}

void bench_init(const char *name)
{
	bench_name = name;
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/regen-bench-XXXXXX");
	if (mkdtemp(tmp_dir) == NULL) {
		tmp_dir[0] = '\0';
		bench_die("mkdtemp: %s", strerror(errno));
	}
	snprintf(sock_path, sizeof(sock_path), "%s/regend.sock", tmp_dir);
	snprintf(log_path, sizeof(log_path), "%s/regend.log", tmp_dir);
	atexit(cleanup);
}

void bench_dump_log(void)
{
	char line[512];
	FILE *f;

	if (log_path[0] == '\0' || (f = fopen(log_path, "r")) == NULL)
		return;
	fprintf(stderr, "---- regend log (%s) ----\n", log_path);
	while (fgets(line, sizeof(line), f) != NULL)
		fputs(line, stderr);
	fprintf(stderr, "---- end of regend log ----\n");
	fclose(f);
}

void bench_die_regen(regen_client *c, const char *what, int r)
{
	const char *name = c ? regen_client_error_name(c) : NULL;
	const char *msg = c ? regen_client_error_message(c) : NULL;

	bench_dump_log();
	bench_die("%s: %s%s%s%s%s", what, strerror(-r), name ? " " : "", name ? name : "", msg ? ": " : "",
		  msg ? msg : "");
}

void bench_start_regend(const char *regend, const char *backend)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		bench_die("fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		int nul = open("/dev/null", O_RDWR | O_CLOEXEC);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (fd < 0 || nul < 0)
			_exit(127);
		dup2(nul, STDIN_FILENO);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		execl(regend, regend, "--socket", sock_path, "--backend", backend, "--devices", "1", (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", regend, strerror(errno));
		_exit(127);
	}
	regend_pid = pid;
}

regen_client *bench_wait_ready(double seconds)
{
	double deadline = bench_now_s() + seconds;
	char last[160] = "not connected";
	regen_client *c = NULL;
	int r, status;

	for (;;) {
		if (waitpid(regend_pid, &status, WNOHANG) == regend_pid) {
			regend_pid = -1;
			bench_dump_log();
			bench_die("regend exited before it was ready (%s %d)", WIFEXITED(status) ? "exit" : "signal",
				  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		}
		if (c == NULL && (r = regen_client_connect(sock_path, &c)) < 0) {
			c = NULL;
			snprintf(last, sizeof(last), "connect: %s", strerror(-r));
		}
		if (c != NULL) {
			regen_status *st;

			r = regen_status_get(c, &st);
			if (r < 0) {
				snprintf(last, sizeof(last), "status: %s", strerror(-r));
				regen_client_destroy(c);
				c = NULL;
			} else {
				const struct regen_device_info *dev0 = regen_status_find_device(st, 0);
				bool ready = dev0 != NULL && strcmp(dev0->state, "ready") == 0;

				snprintf(last, sizeof(last), "%d devices, device 0 %s", regen_status_device_count(st),
					 dev0 != NULL ? dev0->state : "absent");
				regen_status_free(st);
				if (ready)
					return c;
			}
		}
		if (bench_now_s() > deadline) {
			bench_dump_log();
			bench_die("regend not ready after %.0f s (%s)", seconds, last);
		}
		usleep(10000);
	}
}

const char *bench_tmp_dir(void)
{
	return tmp_dir;
}

const char *bench_socket(void)
{
	return sock_path;
}

const char *bench_log(void)
{
	return log_path;
}

pid_t bench_regend_pid(void)
{
	return regend_pid;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct bench_stats bench_summarize(double *us, size_t n)
{
	struct bench_stats s = { 0 };
	size_t i99 = (size_t)ceil(0.99 * (double)n);

	qsort(us, n, sizeof(double), cmp_double);
	for (size_t i = 0; i < n; i++)
		s.mean += us[i];
	s.mean /= (double)n;
	s.min = us[0];
	s.p50 = us[(n - 1) / 2];
	s.p99 = us[i99 > 0 ? i99 - 1 : 0];
	return s;
}
