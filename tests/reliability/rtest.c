/* Reliability test helpers; see rtest.h. */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/message.h"
#include "rtest.h"

static struct rt_daemon *g_daemon;
static pid_t g_owner;

double rt_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void rt_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "[%d] ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void dump_log(void)
{
	char line[512];
	FILE *f;

	if (!g_daemon || !g_daemon->log[0] || getpid() != g_owner)
		return;
	f = fopen(g_daemon->log, "r");
	if (!f)
		return;
	fprintf(stderr, "---- regend log (%s) ----\n", g_daemon->log);
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fclose(f);
	fprintf(stderr, "---- end of regend log ----\n");
}

void rt_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%d] FAIL %s:%d: %s: ", (int)getpid(), file, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	dump_log();
	exit(1);
}

void rt_skip(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "SKIP: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(77);
}

/* ---- The daemon ---- */

static void build_root(char *buf, size_t size)
{
	const char *env = getenv("REGEN_TEST_BUILD_ROOT");

	if (env && env[0]) {
		snprintf(buf, size, "%s", env);
		return;
	}
	/* <build>/tests/reliability/<exe> */
	char self[400];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	RT_CHECK(n > 0, "readlink /proc/self/exe");
	self[n] = '\0';
	for (int i = 0; i < 3; i++) {
		char *slash = strrchr(self, '/');
		if (slash)
			*slash = '\0';
	}
	snprintf(buf, size, "%s", self);
}

static void rm_dir(const char *dir)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
}

void rt_daemon_stop(struct rt_daemon *d)
{
	int status;

	if (d->pid > 0) {
		double deadline = rt_now() + 10;

		kill(d->pid, SIGTERM);
		while (waitpid(d->pid, &status, WNOHANG) == 0) {
			if (rt_now() > deadline) {
				rt_log("regend ignored SIGTERM for 10 s: SIGKILL");
				kill(d->pid, SIGKILL);
				waitpid(d->pid, &status, 0);
				break;
			}
			usleep(20000);
		}
		/* Workers a dead supervisor left behind. */
		kill(-d->pid, SIGKILL);
		d->pid = -1;
	}
	if (d->dir[0]) {
		char keep[1200], root[400];

		build_root(root, sizeof(root));
		snprintf(keep, sizeof(keep), "cp '%s' '%s/meson-logs/%s-regend.log' 2>/dev/null", d->log, root,
			 program_invocation_short_name);
		(void)!system(keep);
		rm_dir(d->dir);
		d->dir[0] = '\0';
	}
}

static void at_exit_stop(void)
{
	if (g_daemon && getpid() == g_owner)
		rt_daemon_stop(g_daemon);
}

static void on_alarm(int sig)
{
	static const char msg[] = "FAIL: test ran past its time limit\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	if (g_daemon && g_daemon->pid > 0) {
		kill(g_daemon->pid, SIGKILL);
		kill(-g_daemon->pid, SIGKILL);
	}
	_exit(1);
}

const char *rt_worker_socket(const struct rt_daemon *d, int device)
{
	static char buf[4][160];
	static int next;
	char *b = buf[next++ % 4];

	snprintf(b, sizeof(buf[0]), "%s.dev%d", d->sock, device);
	return b;
}

static pid_t ns_regend = -1;

static void forward_sigterm(int sig)
{
	if (ns_regend > 0)
		kill(ns_regend, SIGTERM);
}

/* "--pid-namespace": regend runs as pid 1 of a pid namespace of its own, so
 * that every client outside it is pid 0 to it (what a daemon in a container
 * sees of the host's processes). This process stays as its parent and
 * passes SIGTERM on; with regend the namespace's other processes go. */
static void exec_in_pid_namespace(const char *regend, const char **argv)
{
	int status;

	if (unshare(CLONE_NEWPID) < 0) {
		fprintf(stderr, "unshare(CLONE_NEWPID): %s\n", strerror(errno));
		_exit(77);
	}
	ns_regend = fork();
	if (ns_regend == 0) {
		execv(regend, (char *const *)argv);
		_exit(127);
	}
	signal(SIGTERM, forward_sigterm);
	while (waitpid(ns_regend, &status, 0) < 0 && errno == EINTR)
		;
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

void rt_daemon_start(struct rt_daemon *d, const char *const *extra, unsigned limit_s)
{
	char root[400], regend[512];
	const char *argv[48];
	int n = 0;

	if (g_daemon == NULL) {
		signal(SIGPIPE, SIG_IGN);
		signal(SIGALRM, on_alarm);
		alarm(limit_s);
		atexit(at_exit_stop);
	}
	memset(d, 0, sizeof(*d));
	build_root(root, sizeof(root));
	snprintf(regend, sizeof(regend), "%s/daemon/regend", root);
	if (access(regend, X_OK) != 0)
		rt_skip("%s has not been built", regend);
	snprintf(d->dir, sizeof(d->dir), "/tmp/regen-rt-XXXXXX");
	RT_CHECK(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno));
	chmod(d->dir, 0755);   /* a test that drops to nobody must reach the sockets */
	snprintf(d->sock, sizeof(d->sock), "%s/s", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/regend.log", d->dir);
	d->ndevices = 2;
	g_owner = getpid();
	g_daemon = d;

	argv[n++] = regend;
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--backend";
	argv[n++] = "host";
	argv[n++] = "--devices";
	argv[n++] = "2";
	argv[n++] = "--enable-fault-injection";
	bool pid_namespace = false;
	for (int i = 0; extra && extra[i] && n < 46; i++) {
		if (strcmp(extra[i], "--pid-namespace") == 0)
			pid_namespace = true;
		else
			argv[n++] = extra[i];
	}
	argv[n] = NULL;

	d->pid = fork();
	RT_CHECK(d->pid >= 0, "fork: %s", strerror(errno));
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		setpgid(0, 0);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (pid_namespace)
			exec_in_pid_namespace(regend, argv);
		execv(regend, (char *const *)argv);
		_exit(127);
	}
	setpgid(d->pid, d->pid);

	/* Ready: the main socket answers Status with every device ready. */
	double deadline = rt_now() + 30;
	for (;;) {
		struct rt_conn c;
		int ready = 0;

		RT_CHECK(rt_now() < deadline, "regend did not get ready within 30 s");
		RT_CHECK(waitpid(d->pid, NULL, WNOHANG) == 0, "regend exited during start");
		if (rt_connect(&c, d->sock) == 0) {
			if (rt_send(&c, "io.regen.Device.Status", NULL, 0, NULL) == 0) {
				struct rt_reply r;
				if (rt_recv(&c, &r, 5) == 0 && !r.error) {
					cJSON *dev, *devs = cJSON_GetObjectItem(r.params, "devices");
					cJSON_ArrayForEach(dev, devs) {
						cJSON *st = cJSON_GetObjectItem(dev, "state");
						ready += cJSON_IsString(st) && strcmp(st->valuestring, "ready") == 0;
					}
				}
				rt_reply_finish(&r);
			}
			rt_close(&c);
			if (ready == d->ndevices)
				break;
		}
		usleep(20000);
	}
	for (int i = 0; i < d->ndevices; i++) {
		struct stat st;
		double dl = rt_now() + 10;
		while (stat(rt_worker_socket(d, i), &st) != 0) {
			RT_CHECK(rt_now() < dl, "worker socket %s never appeared", rt_worker_socket(d, i));
			usleep(10000);
		}
	}
	rt_log("regend %d ready on %s", (int)d->pid, d->sock);
}

/* ---- Connections ---- */

int rt_connect(struct rt_conn *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(c, 0, sizeof(*c));
	rp_rx_init(&c->rx);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	RT_CHECK(c->fd >= 0, "socket: %s", strerror(errno));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(c->fd);
		c->fd = -1;
		return -e;
	}
	return 0;
}

void rt_close(struct rt_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	rp_rx_finish(&c->rx);
}

static int send_text(struct rt_conn *c, const char *text, const int *fds, size_t nfds)
{
	struct rp_tx tx;
	int r;

	rp_tx_init(&tx);
	r = rp_tx_push(&tx, text, strlen(text), fds, nfds);
	RT_CHECK(r == 0, "rp_tx_push: %s", strerror(-r));
	do {
		r = rp_tx_flush(&tx, c->fd);
		if (r == -EAGAIN) {
			struct pollfd p = { .fd = c->fd, .events = POLLOUT };
			poll(&p, 1, 1000);
		}
	} while (r == -EAGAIN);
	rp_tx_finish(&tx);
	return r;
}

int rt_send(struct rt_conn *c, const char *method, const int *fds, size_t nfds, const char *params_fmt, ...)
{
	char *params = NULL, *text = NULL;
	va_list ap;
	int r;

	if (params_fmt) {
		va_start(ap, params_fmt);
		RT_CHECK(vasprintf(&params, params_fmt, ap) >= 0, "vasprintf");
		va_end(ap);
	}
	RT_CHECK(asprintf(&text, "{\"method\":\"%s\",\"parameters\":%s}", method, params ? params : "{}") >= 0, "asprintf");
	r = send_text(c, text, fds, nfds);
	free(params);
	free(text);
	return r;
}

int rt_recv(struct rt_conn *c, struct rt_reply *out, double timeout_s)
{
	double deadline = rt_now() + timeout_s;

	memset(out, 0, sizeof(*out));
	for (;;) {
		struct rp_msg msg;
		int r = rp_rx_next(&c->rx, &msg);

		RT_CHECK(r >= 0 && r != RP_RX_TOO_LARGE, "rp_rx_next: %d", r);
		if (r == RP_RX_MESSAGE) {
			struct rp_error err = { 0 };
			struct rp_call call;

			RT_CHECK(rp_call_parse(msg.text, msg.len, &call, &err) == 0, "reply does not parse: %s", msg.text);
			RT_CHECK(call.method == NULL, "got a call, not a reply: %s", msg.text);
			out->error = call.error ? strdup(call.error) : NULL;
			out->params = cJSON_Duplicate(call.params, true);
			out->continues = call.continues;
			rp_call_finish(&call);
			rp_msg_finish(&msg);
			return 0;
		}
		double left = deadline - rt_now();
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int n = poll(&p, 1, (int)(left * 1000) + 1);
		if (n == 0)
			return -ETIMEDOUT;
		ssize_t got = rp_rx_read(&c->rx, c->fd);
		if (got == -EAGAIN || got == -EINTR)
			continue;
		if (got <= 0)
			return -ECONNRESET;
	}
}

void rt_reply_finish(struct rt_reply *r)
{
	free(r->error);
	cJSON_Delete(r->params);
	memset(r, 0, sizeof(*r));
}

const char *rt_reply_str(const struct rt_reply *r, const char *key)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->params, key);

	return cJSON_IsString(item) ? item->valuestring : NULL;
}

int64_t rt_reply_int(const struct rt_reply *r, const char *key)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->params, key);

	return cJSON_IsNumber(item) ? (int64_t)item->valuedouble : -1;
}

static void vcall(struct rt_conn *c, struct rt_reply *r, double timeout_s, const int *fds, size_t nfds,
		  const char *method, const char *params)
{
	int e = rt_send(c, method, fds, nfds, "%s", params ? params : "{}");

	RT_CHECK(e == 0, "sending %s: %s", method, strerror(-e));
	e = rt_recv(c, r, timeout_s);
	RT_CHECK(e == 0, "no reply to %s within %.0f s: %s", method, timeout_s, strerror(-e));
}

void rt_call(struct rt_conn *c, struct rt_reply *r, double timeout_s, const int *fds, size_t nfds, const char *method,
	     const char *params_fmt, ...)
{
	char *params = NULL;
	va_list ap;

	if (params_fmt) {
		va_start(ap, params_fmt);
		RT_CHECK(vasprintf(&params, params_fmt, ap) >= 0, "vasprintf");
		va_end(ap);
	}
	vcall(c, r, timeout_s, fds, nfds, method, params);
	free(params);
}

void rt_call_ok(struct rt_conn *c, struct rt_reply *r, const char *method, const char *params_fmt, ...)
{
	char *params = NULL;
	va_list ap;

	if (params_fmt) {
		va_start(ap, params_fmt);
		RT_CHECK(vasprintf(&params, params_fmt, ap) >= 0, "vasprintf");
		va_end(ap);
	}
	vcall(c, r, 60, NULL, 0, method, params);
	if (r->error) {
		char *p = cJSON_PrintUnformatted(r->params);
		rt_fail(__FILE__, __LINE__, method, "failed with %s %s (parameters %s)", r->error, p ? p : "", params ? params : "{}");
	}
	free(params);
}

/* ---- Buffers ---- */

int rt_memfd(size_t size)
{
	int fd = memfd_create("regen-rt", MFD_CLOEXEC);

	RT_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
	RT_CHECK(ftruncate(fd, (off_t)size) == 0, "ftruncate: %s", strerror(errno));
	return fd;
}

int rt_import(struct rt_conn *c, int device, int fd, size_t size, char *id_out, struct rt_reply *r)
{
	rt_call(c, r, 30, &fd, 1, "io.regen.Memory.ImportBuffer", "{\"device\":%d,\"kind\":\"host_fd\",\"size\":%zu,\"fd\":0}",
		device, size);
	if (r->error)
		return -1;
	RT_CHECK(rt_reply_str(r, "buffer") != NULL, "ImportBuffer reply without a buffer id");
	snprintf(id_out, 64, "%s", rt_reply_str(r, "buffer"));
	return 0;
}

void rt_status(struct rt_conn *main_conn, int device, struct rt_device *out)
{
	struct rt_reply r;
	cJSON *dev;

	rt_call_ok(main_conn, &r, "io.regen.Device.Status", NULL);
	memset(out, 0, sizeof(*out));
	cJSON_ArrayForEach(dev, cJSON_GetObjectItem(r.params, "devices")) {
		if ((int)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "index")) != device)
			continue;
		out->generation = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "generation"));
		out->worker_pid = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "worker_pid"));
		out->memory_used = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "memory_used"));
		out->memory_baseline = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "memory_baseline"));
		out->respawns = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(dev, "respawns"));
		snprintf(out->state, sizeof(out->state), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(dev, "state")));
	}
	rt_reply_finish(&r);
}

/* ---- /proc ---- */

void rt_proc_read(pid_t pid, struct rt_proc *p)
{
	char path[64], line[512];
	FILE *f;

	memset(p, 0, sizeof(*p));
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "ls %s | wc -l", path);
	f = popen(cmd, "r");
	RT_CHECK(f && fscanf(f, "%ld", &p->fds) == 1, "counting %s", path);
	pclose(f);
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	RT_CHECK(f != NULL, "open %s", path);
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "VmRSS: %ld", &p->rss_kb);
		sscanf(line, "Threads: %ld", &p->threads);
	}
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	RT_CHECK(f != NULL, "open %s", path);
	while (fgets(line, sizeof(line), f)) {
		p->maps += strchr(line, '\n') != NULL;
		p->asan = p->asan || strstr(line, "libasan") != NULL;
	}
	fclose(f);
}

/* ---- Identities ---- */

void rt_become_nobody(gid_t gid, bool keep_gid)
{
	struct passwd *pw = getpwnam("nobody");

	RT_CHECK(pw != NULL, "no user nobody");
	RT_CHECK(setgroups(0, NULL) == 0, "setgroups: %s", strerror(errno));
	RT_CHECK(setgid(keep_gid ? gid : pw->pw_gid) == 0, "setgid: %s", strerror(errno));
	RT_CHECK(setuid(pw->pw_uid) == 0, "setuid: %s", strerror(errno));
	RT_CHECK(getuid() == pw->pw_uid && geteuid() == pw->pw_uid, "still not nobody");
}

const char *rt_group_without_nobody(gid_t except, gid_t *gid)
{
	static const char *const candidates[] = { "regen", "adm", "daemon", "sys", "staff", "users", "mail", "disk", NULL };
	struct passwd *pw = getpwnam("nobody");

	if (!pw)
		return NULL;
	for (int i = 0; candidates[i]; i++) {
		struct group *g = getgrnam(candidates[i]);
		bool member = false;

		if (!g || g->gr_gid == pw->pw_gid || g->gr_gid == 0 || g->gr_gid == except)
			continue;
		for (char **m = g->gr_mem; *m; m++)
			member = member || strcmp(*m, "nobody") == 0;
		if (member)
			continue;
		*gid = g->gr_gid;
		return candidates[i];
	}
	return NULL;
}

/* ---- Children ---- */

pid_t rt_fork(int (*fn)(void *), void *arg)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	RT_CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0)
		_exit(fn(arg));
	return pid;
}

int rt_wait(pid_t pid, double timeout_s)
{
	double deadline = rt_now() + timeout_s;
	int status;

	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		RT_CHECK(r >= 0, "waitpid: %s", strerror(errno));
		if (r == pid)
			break;
		if (rt_now() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			rt_fail(__FILE__, __LINE__, "child", "child %d ran past %.0f s", (int)pid, timeout_s);
		}
		usleep(5000);
	}
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}
