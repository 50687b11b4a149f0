/* SPDX-License-Identifier: Apache-2.0 */
/* regend for a test; see daemon.h. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/varlink.h"

#define LOG_TAIL_LINES 80

/* The daemon the hooks look after (one at a time per test). */
static struct tl_daemon *g_daemon;
static volatile pid_t g_daemon_pid;

static void on_failure(void)
{
	if (g_daemon != NULL && g_daemon->dir[0] != '\0') {
		tl_daemon_dump_log(g_daemon, LOG_TAIL_LINES);
	}
}

static void on_alarm(void)
{
	pid_t pid = g_daemon_pid;

	if (pid > 0) {
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
	}
}

static void at_exit(void)
{
	if (g_daemon != NULL && tl_is_main_process()) {
		tl_daemon_stop(g_daemon);
	}
}

const char *tl_daemon_worker_socket(const struct tl_daemon *d, int device)
{
	static char buf[4][160];
	static int next;
	char *b = buf[next++ % 4];

	snprintf(b, sizeof(buf[0]), "%s.dev%d", d->sock, device);
	return b;
}

void tl_daemon_dump_log(const struct tl_daemon *d, int lines)
{
	char **ring = calloc((size_t)lines, sizeof(char *));
	char line[1024];
	long n = 0;
	FILE *f;

	if (ring == NULL) {
		return;
	}
	f = fopen(d->log, "r");
	if (f == NULL) {
		free(ring);
		return;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		free(ring[n % lines]);
		ring[n % lines] = strdup(line);
		n++;
	}
	fclose(f);
	fprintf(stderr, "----- regend log (last %d of %ld lines of %s) -----\n", n < lines ? (int)n : lines, n, d->log);
	for (long i = n < lines ? 0 : n - lines; i < n; i++) {
		fputs(ring[i % lines] ? ring[i % lines] : "", stderr);
	}
	fprintf(stderr, "----- end of regend log -----\n");
	for (int i = 0; i < lines; i++) {
		free(ring[i]);
	}
	free(ring);
}

bool tl_daemon_alive(struct tl_daemon *d)
{
	int status;

	if (d->pid <= 0) {
		return false;
	}
	if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
		tl_log("regend (pid %d) exited: %s %d", (int)d->pid, WIFEXITED(status) ? "status" : "signal",
		       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		d->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		kill(-d->pid, SIGKILL);
		d->pid = -1;
		g_daemon_pid = -1;
		return false;
	}
	return true;
}

static bool every_device_ready(struct tl_daemon *d)
{
	struct tl_reply r;
	struct tl_conn c;
	struct stat st;
	cJSON *dev;
	int ready = 0, listed = 0;

	if (tl_conn_open(&c, d->sock) < 0) {
		tl_conn_close(&c);
		return false;
	}
	if (tl_send(&c, "io.regen.Device.Status", NULL, 0, NULL) == 0 && tl_recv(&c, &r, 5) == 0) {
		cJSON_ArrayForEach(dev, cJSON_GetObjectItem(r.params, "devices")) {
			const char *state = cJSON_GetStringValue(cJSON_GetObjectItem(dev, "state"));

			listed++;
			ready += state != NULL && strcmp(state, "ready") == 0;
		}
		tl_reply_finish(&r);
	}
	tl_conn_close(&c);
	if (listed != d->ndevices || ready != d->ndevices) {
		return false;
	}
	for (int i = 0; i < d->ndevices; i++) {
		if (stat(tl_daemon_worker_socket(d, i), &st) != 0) {
			return false;
		}
	}
	return true;
}

void tl_daemon_wait_ready(struct tl_daemon *d, double timeout_s)
{
	double deadline = tl_now() + tl_timeout(timeout_s);

	while (!every_device_ready(d)) {
		if (!tl_daemon_alive(d) && d->exit_status == TL_SKIP) {
			tl_daemon_dump_log(d, LOG_TAIL_LINES);
			tl_skip("regend cannot run here as asked (its log above says why)");
		}
		ASSERT(tl_daemon_alive(d), "regend died before every device was ready");
		ASSERT(tl_now() < deadline, "regend's %d devices not all ready after %.0f s", d->ndevices,
		       tl_timeout(timeout_s));
		usleep(20000);
	}
}

static pid_t ns_regend = -1;

static void forward_sigterm(int sig)
{
	if (ns_regend > 0) {
		kill(ns_regend, SIGTERM);
	}
}

/* Runs regend as pid 1 of a new pid namespace. This process stays as its
 * parent and passes SIGTERM on; with regend the namespace's other
 * processes go. */
__attribute__((noreturn)) static void exec_in_pid_namespace(const char *regend, const char **argv)
{
	int status = 0;

	if (unshare(CLONE_NEWPID) < 0) {
		fprintf(stderr, "unshare(CLONE_NEWPID): %s\n", strerror(errno));
		_exit(TL_SKIP);
	}
	ns_regend = fork();
	if (ns_regend == 0) {
		execv(regend, (char *const *)argv);
		_exit(127);
	}
	signal(SIGTERM, forward_sigterm);
	while (waitpid(ns_regend, &status, 0) < 0 && errno == EINTR) {
	}
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

static void spawn(struct tl_daemon *d, int log_flags)
{
	const struct tl_daemon_opts *o = &d->opts;
	const char *argv[64];
	char devices[16];
	int argc = 0, fd;

	snprintf(devices, sizeof(devices), "%d", d->ndevices);
	argv[argc++] = d->regend;
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	argv[argc++] = "--config";
	argv[argc++] = d->config;
	argv[argc++] = "--backend";
	argv[argc++] = o->backend != NULL ? o->backend : "host";
	argv[argc++] = "--devices";
	argv[argc++] = devices;
	if (!o->no_fault_injection) {
		argv[argc++] = "--enable-fault-injection";
	}
	if (o->admin_group != NULL) {
		argv[argc++] = "--admin-group";
		argv[argc++] = o->admin_group;
	}
	for (int i = 0; o->extra != NULL && o->extra[i] != NULL; i++) {
		ASSERT_LT(argc, 62, "too many regend arguments");
		argv[argc++] = o->extra[i];
	}
	argv[argc] = NULL;

	fflush(NULL);
	d->pid = fork();
	ASSERT(d->pid >= 0, "fork: %s", strerror(errno));
	if (d->pid == 0) {
		setpgid(0, 0);
		fd = open(d->log, O_WRONLY | O_CREAT | O_CLOEXEC | log_flags, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 0);
		}
		/* A test run from a unit or a socket-activated shell must not hand
		 * regend its manager's sockets. */
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("WATCHDOG_USEC");
		unsetenv("WATCHDOG_PID");
		if (o->notify_socket != NULL) {
			char pid[24], usec[24];

			snprintf(pid, sizeof(pid), "%d", (int)getpid());
			snprintf(usec, sizeof(usec), "%lu", o->watchdog_usec);
			setenv("NOTIFY_SOCKET", o->notify_socket, 1);
			if (o->watchdog_usec > 0) {
				setenv("WATCHDOG_USEC", usec, 1);
				setenv("WATCHDOG_PID", pid, 1);
			}
		}
		if (getenv("REGEN_DEBUG") == NULL) {
			setenv("REGEN_DEBUG", o->debug != NULL ? o->debug : "I", 1);
		}
		if (o->pid_namespace) {
			exec_in_pid_namespace(d->regend, argv);
		}
		execv(d->regend, (char *const *)argv);
		_exit(127);
	}
	/* Both sides set the group, so that it exists whichever runs first. */
	setpgid(d->pid, d->pid);
	g_daemon_pid = d->pid;
	tl_log("started regend pid %d on %s (log %s)", (int)d->pid, d->sock, d->log);
	tl_daemon_wait_ready(d, 30);
	tl_log("regend ready: %d devices", d->ndevices);
}

void tl_daemon_start(struct tl_daemon *d, const struct tl_daemon_opts *opts)
{
	static bool hooked;
	FILE *f;

	ASSERT(tl_is_main_process(), "tl_init first; a forked helper never starts regend");
	memset(d, 0, sizeof(*d));
	if (opts != NULL) {
		d->opts = *opts;
	}
	d->ndevices = d->opts.devices > 0 ? d->opts.devices : 2;
	snprintf(d->regend, sizeof(d->regend), "%s/daemon/regend", tl_build_root());
	snprintf(d->regenctl, sizeof(d->regenctl), "%s/client/regenctl", tl_build_root());
	if (access(d->regend, X_OK) != 0) {
		tl_skip("%s has not been built", d->regend);
	}
	snprintf(d->dir, sizeof(d->dir), "/tmp/regen-test-XXXXXX");
	ASSERT_NOT_NULL(mkdtemp(d->dir), "mkdtemp: %s", strerror(errno));
	/* A test that drops to `nobody` must reach the sockets. */
	chmod(d->dir, 0755);
	snprintf(d->sock, sizeof(d->sock), "%s/regend.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/regend.log", d->dir);
	snprintf(d->config, sizeof(d->config), "%s/regend.conf", d->dir);
	f = fopen(d->config, "w");
	ASSERT_NOT_NULL(f, "%s: %s", d->config, strerror(errno));
	fputs(d->opts.config != NULL ? d->opts.config : "", f);
	fclose(f);
	chmod(d->config, 0644);

	g_daemon = d;
	if (!hooked) {
		hooked = true;
		tl_on_failure(on_failure);
		tl_on_alarm(on_alarm);
		atexit(at_exit);
	}
	spawn(d, O_TRUNC);
}

static bool wait_exit(struct tl_daemon *d, double timeout_s)
{
	double deadline = tl_now() + tl_timeout(timeout_s);
	int status;

	while (waitpid(d->pid, &status, WNOHANG) == 0) {
		if (tl_now() > deadline) {
			return false;
		}
		usleep(10000);
	}
	return true;
}

void tl_daemon_restart(struct tl_daemon *d)
{
	ASSERT_GT(d->pid, 0, "regend is not running");
	kill(d->pid, SIGTERM);
	ASSERT(wait_exit(d, 10), "regend did not stop on SIGTERM within %.0f s", tl_timeout(10));
	/* Workers a stopping supervisor left behind. */
	kill(-d->pid, SIGKILL);
	tl_log("regend stopped; starting it again on %s", d->sock);
	spawn(d, O_APPEND);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

/* The log beside meson's own, for a look after the run. */
static void keep_log(const struct tl_daemon *d)
{
	char path[1024], buf[65536];
	size_t n;
	FILE *in, *out;

	snprintf(path, sizeof(path), "%s/meson-logs/%s-regend.log", tl_build_root(), program_invocation_short_name);
	in = fopen(d->log, "r");
	out = in != NULL ? fopen(path, "w") : NULL;
	while (out != NULL && (n = fread(buf, 1, sizeof(buf), in)) > 0) {
		fwrite(buf, 1, n, out);
	}
	if (out != NULL) {
		fclose(out);
	}
	if (in != NULL) {
		fclose(in);
	}
}

void tl_daemon_stop(struct tl_daemon *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		if (!wait_exit(d, 10)) {
			tl_log("regend ignored SIGTERM for %.0f s: SIGKILL", tl_timeout(10));
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
		}
		/* Workers a crashed supervisor left behind. */
		kill(-d->pid, SIGKILL);
		d->pid = -1;
		g_daemon_pid = -1;
	}
	if (d->dir[0] != '\0') {
		keep_log(d);
		nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
		d->dir[0] = '\0';
	}
	if (g_daemon == d) {
		g_daemon = NULL;
	}
}
