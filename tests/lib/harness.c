/* SPDX-License-Identifier: Apache-2.0 */
/* The test process; see harness.h. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "tests/lib/asserts.h"
#include "tests/lib/harness.h"
#include "tests/lib/rand.h"

#define MAX_CHILDREN 128
#define MAX_HOOKS 4

static pid_t g_main_pid;
static pid_t g_children[MAX_CHILDREN];
static int g_nchildren;
static uint64_t g_forks;
static void (*g_failure_hooks[MAX_HOOKS])(void);
static void (*g_alarm_hooks[MAX_HOOKS])(void);
static int g_nfailure_hooks, g_nalarm_hooks;

double tl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double tl_timeout_multiplier(void)
{
	static double multiplier;
	const char *env;
	char *end;

	if (multiplier == 0) {
		multiplier = 1;
		env = getenv("REGEN_TEST_TIMEOUT_MULTIPLIER");
		if (env != NULL && env[0] != '\0') {
			double v = strtod(env, &end);

			if (*end == '\0' && v >= 1 && v <= 1000) {
				multiplier = v;
			} else {
				fprintf(stderr, "REGEN_TEST_TIMEOUT_MULTIPLIER=%s is not a number in [1, 1000]: using 1\n",
					env);
			}
		}
	}
	return multiplier;
}

double tl_timeout(double seconds)
{
	return seconds * tl_timeout_multiplier();
}

void tl_log(const char *fmt, ...)
{
	char line[4096];
	va_list ap;
	int n;

	n = snprintf(line, sizeof(line), "[%d %.3f] ", (int)getpid(), fmod(tl_now(), 1000.0));
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line);
}

void tl_skip(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "SKIP: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(TL_SKIP);
}

bool tl_is_main_process(void)
{
	return g_main_pid != 0 && getpid() == g_main_pid;
}

/* Only what is still our child: a pid the test reaped itself may belong to
 * another process by now. Async-signal-safe. */
static void kill_children(void)
{
	for (int i = 0; i < g_nchildren; i++) {
		if (g_children[i] > 0 && waitpid(g_children[i], NULL, WNOHANG) == 0) {
			kill(g_children[i], SIGKILL);
		}
	}
}

void tl_failv(const char *file, int line, const char *what, const char *fmt, va_list ap)
{
	char msg[4096];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	tl_log("FAIL %s:%d: %s%s%s", file, line, what, msg[0] != '\0' ? ": " : "", msg);
	if (tl_is_main_process()) {
		/* A hook that fails again must not recurse. */
		int n = g_nfailure_hooks;

		g_nfailure_hooks = 0;
		for (int i = 0; i < n; i++) {
			g_failure_hooks[i]();
		}
	}
	exit(1);
}

void tl_fail(const char *file, int line, const char *what, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tl_failv(file, line, what, fmt, ap);
}

void tl_on_failure(void (*fn)(void))
{
	if (g_nfailure_hooks < MAX_HOOKS) {
		g_failure_hooks[g_nfailure_hooks++] = fn;
	}
}

void tl_on_alarm(void (*fn)(void))
{
	if (g_nalarm_hooks < MAX_HOOKS) {
		g_alarm_hooks[g_nalarm_hooks++] = fn;
	}
}

static void on_alarm(int sig)
{
	static const char msg[] = "FAIL: the test ran past its time limit; killing what it started\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	kill_children();
	for (int i = 0; i < g_nalarm_hooks; i++) {
		g_alarm_hooks[i]();
	}
	_exit(1);
}

static void at_exit_kill_children(void)
{
	if (tl_is_main_process()) {
		kill_children();
	}
}

void tl_init(unsigned limit_s)
{
	g_main_pid = getpid();
	signal(SIGPIPE, SIG_IGN);
	signal(SIGALRM, on_alarm);
	alarm((unsigned)ceil(tl_timeout(limit_s)));
	atexit(at_exit_kill_children);
	tl_rand_init();
}

const char *tl_build_root(void)
{
	static char root[512];
	const char *env;
	char exe[400];
	ssize_t n;

	if (root[0] != '\0') {
		return root;
	}
	env = getenv("REGEN_TEST_BUILD_ROOT");
	if (env != NULL && env[0] != '\0') {
		snprintf(root, sizeof(root), "%s", env);
		return root;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	ASSERT(n > 0, "readlink /proc/self/exe: %s", strerror(errno));
	exe[n] = '\0';
	snprintf(root, sizeof(root), "%s/../..", dirname(exe));
	return root;
}

/* Children. */

static void remember_child(pid_t pid)
{
	for (int i = 0; i < g_nchildren; i++) {
		if (g_children[i] <= 0) {
			g_children[i] = pid;
			return;
		}
	}
	if (g_nchildren < MAX_CHILDREN) {
		g_children[g_nchildren++] = pid;
	}
}

static void forget_child(pid_t pid)
{
	for (int i = 0; i < g_nchildren; i++) {
		if (g_children[i] == pid) {
			g_children[i] = -1;
		}
	}
}

pid_t tl_fork(int (*fn)(void *), void *arg, unsigned limit_s)
{
	pid_t pid;

	fflush(NULL);
	g_forks++;
	pid = fork();
	ASSERT(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		g_nchildren = 0;
		signal(SIGALRM, SIG_DFL);
		alarm((unsigned)ceil(tl_timeout(limit_s)));
		tl_rand_reseed_child(g_forks);
		exit(fn(arg));
	}
	remember_child(pid);
	return pid;
}

int tl_wait(pid_t pid, double timeout_s)
{
	double deadline = tl_now() + tl_timeout(timeout_s);
	int status;
	pid_t r;

	for (;;) {
		r = waitpid(pid, &status, WNOHANG);
		ASSERT(r >= 0, "waitpid %d: %s", (int)pid, strerror(errno));
		if (r == pid) {
			break;
		}
		if (tl_now() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			forget_child(pid);
			ASSERT(false, "child %d ran past %.0f s", (int)pid, tl_timeout(timeout_s));
		}
		usleep(5000);
	}
	forget_child(pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int tl_wait_children(const pid_t *pids, int n, double timeout_s)
{
	double deadline = tl_now() + tl_timeout(timeout_s);
	bool *done = calloc((size_t)n, sizeof(bool));
	int left = n, failed = 0, status, i;
	pid_t p;

	ASSERT_NOT_NULL(done);
	while (left > 0) {
		for (i = 0; i < n; i++) {
			if (done[i]) {
				continue;
			}
			p = waitpid(pids[i], &status, WNOHANG);
			if (p == 0) {
				continue;
			}
			done[i] = true;
			left--;
			forget_child(pids[i]);
			if (p < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
				failed++;
				tl_log("child %d failed: %s %d", (int)pids[i],
				       p < 0 ? "waitpid" : WIFEXITED(status) ? "exit" : "signal",
				       p < 0 ? errno : WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			}
		}
		if (left > 0 && tl_now() > deadline) {
			for (i = 0; i < n; i++) {
				if (!done[i]) {
					tl_log("child %d still running after %.0f s: killed", (int)pids[i],
					       tl_timeout(timeout_s));
					kill(pids[i], SIGKILL);
					waitpid(pids[i], &status, 0);
					forget_child(pids[i]);
					failed++;
				}
			}
			break;
		}
		usleep(10000);
	}
	free(done);
	return failed;
}

/* Programs. */

struct capture {
	int fd;
	char *buf;
	size_t len, cap;
	bool open;
};

static void capture_read(struct capture *c)
{
	char tmp[4096];
	ssize_t n = read(c->fd, tmp, sizeof(tmp));

	if (n <= 0) {
		if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
			c->open = false;
		}
		return;
	}
	if (c->len + (size_t)n + 1 > c->cap) {
		c->cap = (c->len + (size_t)n + 1) * 2;
		c->buf = realloc(c->buf, c->cap);
		ASSERT_NOT_NULL(c->buf);
	}
	memcpy(c->buf + c->len, tmp, (size_t)n);
	c->len += (size_t)n;
	c->buf[c->len] = '\0';
}

static void capture_finish(struct capture *c, char **out)
{
	close(c->fd);
	if (c->buf == NULL) {
		c->buf = strdup("");
	}
	if (out != NULL) {
		*out = c->buf;
	} else {
		free(c->buf);
	}
}

int tl_run(char *const argv[], char **out, char **err, double timeout_s, int as_uid, int as_gid)
{
	double deadline = tl_now() + tl_timeout(timeout_s);
	struct capture cap[2] = { { .open = true }, { .open = true } };
	int po[2], pe[2], status, fd, i, rc = -1;
	bool exited = false;
	pid_t pid;

	ASSERT(pipe2(po, O_CLOEXEC) == 0 && pipe2(pe, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	ASSERT(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 0);
		}
		if (as_uid >= 0) {
			if (setgroups(0, NULL) != 0 || setgid((gid_t)as_gid) != 0 || setuid((uid_t)as_uid) != 0) {
				fprintf(stderr, "cannot drop to uid %d: %s\n", as_uid, strerror(errno));
				_exit(126);
			}
		}
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	remember_child(pid);
	close(po[1]);
	close(pe[1]);
	cap[0].fd = po[0];
	cap[1].fd = pe[0];
	while (cap[0].open || cap[1].open) {
		struct pollfd pfd[2];
		int left_ms = (int)((deadline - tl_now()) * 1000);

		if (left_ms <= 0) {
			break;
		}
		for (i = 0; i < 2; i++) {
			pfd[i].fd = cap[i].open ? cap[i].fd : -1;
			pfd[i].events = POLLIN;
			pfd[i].revents = 0;
		}
		if (poll(pfd, 2, left_ms) < 0 && errno != EINTR) {
			break;
		}
		for (i = 0; i < 2; i++) {
			if (cap[i].open && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
				capture_read(&cap[i]);
			}
		}
	}
	while (tl_now() < deadline) {
		if (waitpid(pid, &status, WNOHANG) == pid) {
			exited = true;
			break;
		}
		usleep(5000);
	}
	if (!exited) {
		tl_log("%s ran past %.0f s: killed", argv[0], tl_timeout(timeout_s));
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	} else if (WIFEXITED(status)) {
		rc = WEXITSTATUS(status);
	}
	forget_child(pid);
	capture_finish(&cap[0], out);
	capture_finish(&cap[1], err);
	return rc;
}
