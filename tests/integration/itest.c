/* Integration test helpers: see itest.h. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <libgen.h>
#include <math.h>
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
#include "itest.h"

static struct it_daemon *g_daemon;
static pid_t g_owner;
#define MAX_CHILDREN 64
static pid_t g_children[MAX_CHILDREN];
static int g_nchildren;

double it_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void it_log(const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	int n;

	n = snprintf(line, sizeof(line), "[%d %.3f] ", (int)getpid(), fmod(it_now(), 1000.0));
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line);
}

void it_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	it_log("FAIL %s:%d: %s: %s", file, line, cond, msg);
	exit(1);
}

void it_fail_call(const char *file, int line, const char *expr, regen_client *c, int r)
{
	const char *name = c != NULL ? regen_client_error_name(c) : NULL;
	const char *msg = c != NULL ? regen_client_error_message(c) : NULL;

	it_log("FAIL %s:%d: %s = %d (%s) %s %s", file, line, expr, r, strerror(-r),
	       name ? name : "", msg ? msg : "");
	exit(1);
}

/* Paths of the build tree: $REGEN_TEST_BUILD_ROOT, else two levels above
 * this program (<build>/tests/integration/test_x). */
static void build_root(char *out, size_t size)
{
	const char *env = getenv("REGEN_TEST_BUILD_ROOT");
	char exe[512];
	ssize_t n;

	if (env != NULL && env[0] != '\0') {
		snprintf(out, size, "%s", env);
		return;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		snprintf(out, size, ".");
		return;
	}
	exe[n] = '\0';
	snprintf(out, size, "%s/../..", dirname(exe));
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

static void kill_children(void)
{
	int i;

	for (i = 0; i < g_nchildren; i++) {
		if (g_children[i] > 0) {
			kill(g_children[i], SIGKILL);
		}
	}
}

static void on_alarm(int sig)
{
	static const char msg[] = "integration test: overall time limit reached, killing regend\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	kill_children();
	if (g_daemon != NULL && g_daemon->pid > 0) {
		kill(-g_daemon->pid, SIGKILL);
		kill(g_daemon->pid, SIGKILL);
	}
	_exit(1);
}

static void at_exit_stop(void)
{
	if (getpid() == g_owner && g_daemon != NULL) {
		kill_children();
		it_daemon_stop(g_daemon);
	}
}

bool it_daemon_alive(struct it_daemon *d)
{
	int status;

	if (d->pid <= 0) {
		return false;
	}
	if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
		it_log("regend (pid %d) exited: %s %d", (int)d->pid,
		       WIFEXITED(status) ? "status" : "signal",
		       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		kill(-d->pid, SIGKILL);
		d->pid = -1;
		return false;
	}
	return true;
}

void it_daemon_dump_log(const struct it_daemon *d)
{
	char cmd[600];

	fprintf(stderr, "----- regend log (last 60 lines of %s) -----\n", d->log);
	snprintf(cmd, sizeof(cmd), "tail -n 60 '%s' >&2", d->log);
	(void)!system(cmd);
	fprintf(stderr, "----- end of regend log -----\n");
}

regen_client *it_connect(const struct it_daemon *d)
{
	regen_client *c = NULL;
	int r;

	r = regen_client_connect(d->sock, &c);
	CHECK(r == 0, "connect to %s: %s", d->sock, strerror(-r));
	regen_client_set_timeout(c, 30);
	return c;
}

regen_status *it_status(regen_client *c)
{
	regen_status *st = NULL;

	CHECK_OK(c, regen_status_get(c, &st));
	return st;
}

const struct regen_device_info *it_device(const regen_status *st, int index)
{
	const struct regen_device_info *d = regen_status_find_device(st, index);

	CHECK(d != NULL, "Status lists no device %d", index);
	CHECK(d->size >= sizeof(*d), "device info of %zu bytes, want %zu", d->size, sizeof(*d));
	return d;
}

/* Starts regend on d's paths and waits until every device is ready. */
static void spawn(struct it_daemon *d, const struct it_daemon_opts *opts, int trunc)
{
	const char *argv[32];
	regen_status *st = NULL;
	regen_client *c = NULL;
	double deadline;
	int argc = 0, fd, i, n, ready;

	argv[argc++] = d->regend;
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	argv[argc++] = "--backend";
	argv[argc++] = "host";
	argv[argc++] = "--devices";
	argv[argc++] = "2";
	if (opts == NULL || !opts->no_fault_injection) {
		argv[argc++] = "--enable-fault-injection";
	}
	if (opts != NULL && opts->admin_group != NULL) {
		argv[argc++] = "--admin-group";
		argv[argc++] = opts->admin_group;
	}
	for (i = 0; opts != NULL && opts->extra_args != NULL && opts->extra_args[i] != NULL && argc < 31; i++) {
		argv[argc++] = opts->extra_args[i];
	}
	argv[argc] = NULL;


	d->pid = fork();
	CHECK(d->pid >= 0, "fork: %s", strerror(errno));
	if (d->pid == 0) {
		setpgid(0, 0);
		fd = open(d->log, O_WRONLY | O_CREAT | O_CLOEXEC | trunc, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 0);
		}
		setenv("REGEN_DEBUG", getenv("REGEN_DEBUG") ? getenv("REGEN_DEBUG") : "I", 1);
		execv(d->regend, (char *const *)argv);
		_exit(127);
	}
	setpgid(d->pid, d->pid);
	it_log("started regend pid %d on %s (log %s)", (int)d->pid, d->sock, d->log);

	deadline = it_now() + 30;
	for (;;) {
		if (!it_daemon_alive(d)) {
			it_daemon_dump_log(d);
			CHECK(false, "regend died while starting");
		}
		if (c == NULL && regen_client_connect(d->sock, &c) < 0) {
			c = NULL;
		}
		if (c != NULL) {
			regen_client_set_timeout(c, 5);
			if (regen_status_get(c, &st) == 0) {
				n = regen_status_device_count(st);
				ready = 0;
				for (i = 0; i < n; i++) {
					ready += strcmp(regen_status_device(st, i)->state, "ready") == 0;
				}
				if (n > 0 && ready == n) {
					break;
				}
				regen_status_free(st);
				st = NULL;
			}
		}
		if (it_now() > deadline) {
			it_daemon_dump_log(d);
			CHECK(false, "regend not ready after 30 s");
		}
		usleep(50000);
	}
	d->ndevices = n;
	it_log("regend ready: %d devices, epoch %llu", n, (unsigned long long)regen_status_epoch(st));
	regen_client_destroy(c);
	regen_status_free(st);
}

void it_daemon_start(struct it_daemon *d, const struct it_daemon_opts *opts, unsigned limit_s)
{
	char root[400];

	memset(d, 0, sizeof(*d));
	build_root(root, sizeof(root));
	snprintf(d->regend, sizeof(d->regend), "%s/daemon/regend", root);
	snprintf(d->regenctl, sizeof(d->regenctl), "%s/client/regenctl", root);
	if (access(d->regend, X_OK) != 0) {
		it_log("SKIP: %s has not been built", d->regend);
		exit(77);
	}
	snprintf(d->dir, sizeof(d->dir), "/tmp/regen-it-XXXXXX");
	CHECK(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno));
	/* Lets a test that drops to `nobody` reach the socket. */
	chmod(d->dir, 0755);
	snprintf(d->sock, sizeof(d->sock), "%s/regend.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/regend.log", d->dir);

	g_owner = getpid();
	g_daemon = d;
	signal(SIGALRM, on_alarm);
	signal(SIGPIPE, SIG_IGN);
	alarm(limit_s);
	atexit(at_exit_stop);
	spawn(d, opts, O_TRUNC);
}

void it_daemon_restart(struct it_daemon *d, const struct it_daemon_opts *opts)
{
	double deadline = it_now() + 10;
	int status;

	kill(d->pid, SIGTERM);
	while (waitpid(d->pid, &status, WNOHANG) == 0) {
		CHECK(it_now() < deadline, "regend did not stop on SIGTERM within 10 s");
		usleep(10000);
	}
	kill(-d->pid, SIGKILL);
	it_log("regend stopped; starting it again on %s", d->sock);
	spawn(d, opts, O_APPEND);
}

void it_daemon_stop(struct it_daemon *d)
{
	char keep[1400], root[400];
	double deadline;
	int status;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		deadline = it_now() + 5;
		while (waitpid(d->pid, &status, WNOHANG) == 0) {
			if (it_now() > deadline) {
				it_log("regend ignored SIGTERM for 5 s: SIGKILL");
				kill(d->pid, SIGKILL);
				waitpid(d->pid, &status, 0);
				break;
			}
			usleep(20000);
		}
		/* Workers left behind by a crashed supervisor. */
		kill(-d->pid, SIGKILL);
		d->pid = -1;
	}
	if (d->dir[0] != '\0') {
		/* Keep the daemon's log beside the test logs. */
		build_root(root, sizeof(root));
		snprintf(keep, sizeof(keep), "cp '%s' '%s/meson-logs/%s-regend.log' 2>/dev/null", d->log, root,
			 program_invocation_short_name);
		(void)!system(keep);
		nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
		d->dir[0] = '\0';
	}
}

uint64_t it_wait_generation(regen_client *c, int device, uint64_t after, double timeout_s)
{
	double deadline = it_now() + timeout_s;
	const struct regen_device_info *d;
	regen_status *st = NULL;
	uint64_t generation;
	int r;

	for (;;) {
		r = regen_status_get(c, &st);
		if (r == 0) {
			d = regen_status_find_device(st, device);
			if (d != NULL && d->generation > after && strcmp(d->state, "ready") == 0) {
				generation = d->generation;
				regen_status_free(st);
				return generation;
			}
			regen_status_free(st);
		} else if (r != -ECONNRESET) {
			CHECK_OK(c, r);
		}
		CHECK(it_now() < deadline, "device %d not ready in a generation > %llu after %.0f s", device,
		      (unsigned long long)after, timeout_s);
		usleep(20000);
	}
}

pid_t it_fork(int (*fn)(void *), void *arg, unsigned limit_s)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		g_nchildren = 0;
		signal(SIGALRM, SIG_DFL);
		alarm(limit_s);
		it_rand_seed(it_rand_seed_default());
		exit(fn(arg));
	}
	if (g_nchildren < MAX_CHILDREN) {
		g_children[g_nchildren++] = pid;
	}
	return pid;
}

static void forget_child(pid_t pid)
{
	int i;

	for (i = 0; i < g_nchildren; i++) {
		if (g_children[i] == pid) {
			g_children[i] = -1;
		}
	}
}

int it_wait_children(const pid_t *pids, int n, double timeout_s)
{
	double deadline = it_now() + timeout_s;
	bool *done = calloc((size_t)n, sizeof(bool));
	int left = n, failed = 0, status, i;
	pid_t p;

	CHECK(done != NULL, "calloc");
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
				it_log("child %d failed: %s %d", (int)pids[i],
				       p < 0 ? "waitpid" : WIFEXITED(status) ? "exit" : "signal",
				       p < 0 ? errno : WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			}
		}
		if (left > 0 && it_now() > deadline) {
			for (i = 0; i < n; i++) {
				if (!done[i]) {
					it_log("child %d still running after %.0f s: killed", (int)pids[i], timeout_s);
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

static void drain_pipe(int fd, char **buf, size_t *len, size_t *cap, bool *open_)
{
	char tmp[4096];
	ssize_t n = read(fd, tmp, sizeof(tmp));

	if (n <= 0) {
		if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
			*open_ = false;
		}
		return;
	}
	if (*len + (size_t)n + 1 > *cap) {
		*cap = (*len + (size_t)n + 1) * 2;
		*buf = realloc(*buf, *cap);
		CHECK(*buf != NULL, "realloc");
	}
	memcpy(*buf + *len, tmp, (size_t)n);
	*len += (size_t)n;
	(*buf)[*len] = '\0';
}

int it_run(char *const argv[], char **out, char **err, double timeout_s, int as_uid, int as_gid)
{
	int po[2], pe[2], status, fd;
	char *bufs[2] = { NULL, NULL };
	size_t lens[2] = { 0, 0 }, caps[2] = { 0, 0 };
	bool open_[2] = { true, true };
	double deadline = it_now() + timeout_s;
	struct pollfd pfd[2];
	pid_t pid;
	int i, rc = -1;
	bool exited = false;

	CHECK(pipe2(po, O_CLOEXEC) == 0 && pipe2(pe, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
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
	if (g_nchildren < MAX_CHILDREN) {
		g_children[g_nchildren++] = pid;
	}
	close(po[1]);
	close(pe[1]);
	while (open_[0] || open_[1]) {
		int nfds = 0, left_ms = (int)((deadline - it_now()) * 1000);

		if (left_ms <= 0) {
			break;
		}
		for (i = 0; i < 2; i++) {
			pfd[i].fd = open_[i] ? (i == 0 ? po[0] : pe[0]) : -1;
			pfd[i].events = POLLIN;
			nfds += open_[i];
		}
		if (poll(pfd, 2, left_ms) < 0 && errno != EINTR) {
			break;
		}
		for (i = 0; i < 2; i++) {
			if (open_[i] && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
				drain_pipe(pfd[i].fd, &bufs[i], &lens[i], &caps[i], &open_[i]);
			}
		}
	}
	while (it_now() < deadline) {
		if (waitpid(pid, &status, WNOHANG) == pid) {
			exited = true;
			break;
		}
		usleep(5000);
	}
	if (!exited) {
		it_log("%s ran past %.0f s: killed", argv[0], timeout_s);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	} else if (WIFEXITED(status)) {
		rc = WEXITSTATUS(status);
	}
	forget_child(pid);
	close(po[0]);
	close(pe[0]);
	for (i = 0; i < 2; i++) {
		if (bufs[i] == NULL) {
			bufs[i] = strdup("");
		}
	}
	if (out != NULL) {
		*out = bufs[0];
	} else {
		free(bufs[0]);
	}
	if (err != NULL) {
		*err = bufs[1];
	} else {
		free(bufs[1]);
	}
	return rc;
}

/* Memory. */

void it_mem_alloc(size_t size, struct it_mem *m)
{
	memset(m, 0, sizeof(*m));
	m->fd = memfd_create("regen-it", MFD_CLOEXEC);
	CHECK(m->fd >= 0, "memfd_create: %s", strerror(errno));
	CHECK(ftruncate(m->fd, (off_t)size) == 0, "ftruncate: %s", strerror(errno));
	m->ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	CHECK(m->ptr != MAP_FAILED, "mmap: %s", strerror(errno));
	m->size = size;
}

int it_mem_import(regen_client *c, int device, struct it_mem *m)
{
	if (m->buf != NULL) {
		regen_buffer_close(m->buf);
		m->buf = NULL;
	}
	return regen_buffer_import_fd(c, device, m->fd, m->size, &m->buf);
}

void it_mem_create(regen_client *c, int device, size_t size, struct it_mem *m)
{
	it_mem_alloc(size, m);
	CHECK_OK(c, it_mem_import(c, device, m));
}

void it_mem_free(struct it_mem *m)
{
	if (m->buf != NULL) {
		regen_buffer_close(m->buf);
	}
	if (m->ptr != NULL && m->ptr != MAP_FAILED) {
		munmap(m->ptr, m->size);
	}
	if (m->fd >= 0) {
		close(m->fd);
	}
	memset(m, 0, sizeof(*m));
	m->fd = -1;
}

/* Random numbers: xorshift64*. */
static uint64_t g_rand = 0x9e3779b97f4a7c15ull;

void it_rand_seed(uint64_t seed)
{
	g_rand = seed != 0 ? seed : 0x9e3779b97f4a7c15ull;
}

uint64_t it_rand_seed_default(void)
{
	struct timespec ts;
	const char *env = getenv("REGEN_TEST_SEED");
	uint64_t seed;

	clock_gettime(CLOCK_REALTIME, &ts);
	seed = env != NULL ? strtoull(env, NULL, 0) + (uint64_t)getpid()
			   : ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
	return seed;
}

static uint64_t rand_next(void)
{
	g_rand ^= g_rand >> 12;
	g_rand ^= g_rand << 25;
	g_rand ^= g_rand >> 27;
	return g_rand * 0x2545f4914f6cdd1dull;
}

double it_rand_uniform(double lo, double hi)
{
	return lo + (hi - lo) * ((double)(rand_next() >> 11) * (1.0 / 9007199254740992.0));
}

int it_rand_int(int lo, int hi)
{
	return lo + (int)(rand_next() % (uint64_t)(hi - lo + 1));
}

/* Element types. */

size_t it_dtype_size(enum regen_dtype dt)
{
	return dt == REGEN_F32 ? 4 : 2;
}

const char *it_dtype_name(enum regen_dtype dt)
{
	return dt == REGEN_F32 ? "f32" : dt == REGEN_F16 ? "f16" : "bf16";
}

double it_dtype_eps(enum regen_dtype dt)
{
	return dt == REGEN_F32 ? ldexp(1, -23) : dt == REGEN_F16 ? ldexp(1, -10) : ldexp(1, -7);
}

/* The spacing of the smallest (subnormal) values: the rounding error a
 * result near zero may carry whatever its magnitude. */
static double dtype_quantum(enum regen_dtype dt)
{
	return dt == REGEN_F32 ? ldexp(1, -149) : dt == REGEN_F16 ? ldexp(1, -24) : ldexp(1, -133);
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u) {
		return 0x7fc0;
	}
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static double bf16_to_double(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;

	memcpy(&f, &x, 4);
	return f;
}

static uint16_t f32_to_f16(float f)
{
	uint32_t x, sign, exp, man, r, rem, half;
	int e, shift;

	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000u;
	exp = (x >> 23) & 0xffu;
	man = x & 0x7fffffu;
	if (exp == 0xff) {
		return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
	}
	e = (int)exp - 127 + 15;
	if (e >= 31) {
		return (uint16_t)(sign | 0x7c00u);
	}
	if (e <= 0) {
		if (e < -10) {
			return (uint16_t)sign;
		}
		man |= 0x800000u;
		shift = 14 - e;
		half = 1u << (shift - 1);
		rem = man & ((1u << shift) - 1);
		r = man >> shift;
		if (rem > half || (rem == half && (r & 1u))) {
			r++;
		}
		return (uint16_t)(sign | r);
	}
	r = man >> 13;
	rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
		r++;
	}
	return (uint16_t)(sign | (((uint32_t)e << 10) + r));
}

static double f16_to_double(uint16_t h)
{
	int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	double v;

	if (exp == 0) {
		v = ldexp(man, -24);
	} else if (exp == 31) {
		v = man ? NAN : INFINITY;
	} else {
		v = ldexp(man | 0x400, exp - 25);
	}
	return (h & 0x8000) ? -v : v;
}

double it_load(enum regen_dtype dt, const void *base, size_t i)
{
	float f;
	uint16_t h;

	if (dt == REGEN_F32) {
		memcpy(&f, (const char *)base + 4 * i, 4);
		return f;
	}
	memcpy(&h, (const char *)base + 2 * i, 2);
	return dt == REGEN_F16 ? f16_to_double(h) : bf16_to_double(h);
}

double it_store(enum regen_dtype dt, void *base, size_t i, double v)
{
	float f = (float)v;
	uint16_t h;

	if (dt == REGEN_F32) {
		memcpy((char *)base + 4 * i, &f, 4);
	} else {
		h = dt == REGEN_F16 ? f32_to_f16(f) : f32_to_bf16(f);
		memcpy((char *)base + 2 * i, &h, 2);
	}
	return it_load(dt, base, i);
}

void it_poison(enum regen_dtype dt, void *base, size_t count)
{
	static const uint32_t nan32 = 0x7fc00000u;
	uint16_t nan16 = dt == REGEN_F16 ? 0x7e00 : 0x7fc0;
	size_t i;

	for (i = 0; i < count; i++) {
		if (dt == REGEN_F32) {
			memcpy((char *)base + 4 * i, &nan32, 4);
		} else {
			memcpy((char *)base + 2 * i, &nan16, 2);
		}
	}
}

/* GEMM. */

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

struct gemm_layout {
	int a_rows, a_cols, b_rows, b_cols;
	int lda, ldb, ldc;
	size_t off_a, off_b, off_c, off_d, off_bias, total;
};

static void gemm_layout(const struct it_gemm_case *gc, struct gemm_layout *l)
{
	size_t ein = it_dtype_size(gc->in), eout = it_dtype_size(gc->out);

	l->a_rows = gc->trans_a ? gc->k : gc->m;
	l->a_cols = gc->trans_a ? gc->m : gc->k;
	l->b_rows = gc->trans_b ? gc->n : gc->k;
	l->b_cols = gc->trans_b ? gc->k : gc->n;
	l->lda = l->a_cols + gc->pad;
	l->ldb = l->b_cols + gc->pad;
	l->ldc = gc->n + gc->pad;
	l->off_a = 0;
	l->off_b = align64(l->off_a + (size_t)l->a_rows * (size_t)l->lda * ein);
	l->off_c = align64(l->off_b + (size_t)l->b_rows * (size_t)l->ldb * ein);
	l->off_d = align64(l->off_c + (size_t)gc->m * (size_t)l->ldc * eout);
	l->off_bias = align64(l->off_d + (size_t)gc->m * (size_t)l->ldc * eout);
	l->total = align64(l->off_bias + (size_t)gc->n * eout);
}

size_t it_gemm_bytes(const struct it_gemm_case *gc)
{
	struct gemm_layout l;

	gemm_layout(gc, &l);
	return l.total;
}

void it_gemm_random_case(struct it_gemm_case *gc, int max_dim)
{
	static const enum regen_dtype dts[] = { REGEN_F32, REGEN_F16, REGEN_BF16 };

	memset(gc, 0, sizeof(*gc));
	gc->in = dts[it_rand_int(0, 2)];
	gc->out = it_rand_int(0, 3) == 0 ? REGEN_F32 : gc->in;
	gc->m = it_rand_int(1, max_dim);
	gc->n = it_rand_int(1, max_dim);
	gc->k = it_rand_int(1, max_dim);
	gc->trans_a = it_rand_int(0, 1);
	gc->trans_b = it_rand_int(0, 1);
	gc->alpha = it_rand_int(0, 1) ? 1.0 : it_rand_uniform(-2, 2);
	gc->with_c = it_rand_int(0, 1);
	gc->beta = gc->with_c ? it_rand_uniform(-1.5, 1.5) : 0;
	gc->pad = it_rand_int(0, 2) == 0 ? it_rand_int(1, 5) : 0;
}

void it_gemm_describe(const struct it_gemm_case *gc, char *buf, size_t size)
{
	static const char *const ep[] = { "none", "bias", "gelu", "gelu_bias" };

	snprintf(buf, size, "gemm %s->%s m=%d n=%d k=%d ta=%d tb=%d alpha=%g beta=%g c=%d bias=%d epilogue=%s pad=%d",
		 it_dtype_name(gc->in), it_dtype_name(gc->out), gc->m, gc->n, gc->k, gc->trans_a, gc->trans_b,
		 gc->alpha, gc->beta, gc->with_c, gc->with_bias, ep[gc->epilogue], gc->pad);
}

static void tensor2(struct regen_tensor *t, regen_buffer *b, uint64_t offset, enum regen_dtype dt,
		    int rows, int cols, int ld)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->offset = offset;
	t->dtype = dt;
	t->rank = 2;
	t->shape[0] = rows;
	t->shape[1] = cols;
	if (ld != cols) {
		t->strides[0] = ld;
		t->strides[1] = 1;
	}
}

static double gelu(double x)
{
	return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

int it_gemm_run(regen_client *c, struct it_mem *m, uint64_t base, const struct it_gemm_case *gc, char *why, size_t why_size)
{
	struct gemm_layout l;
	struct regen_gemm_args args;
	struct regen_tensor tc, tbias;
	unsigned char *p = m->ptr + base;
	double *a, *b, *cv, *bias;
	double worst = 0;
	int i, j, k, r, bad = 0, bad_i = -1, bad_j = -1;
	double bad_got = 0, bad_ref = 0, bad_bound = 0;
	bool use_bias = gc->with_bias || gc->epilogue == REGEN_EPILOGUE_BIAS || gc->epilogue == REGEN_EPILOGUE_GELU_BIAS;

	gemm_layout(gc, &l);
	CHECK(base + l.total <= m->size, "gemm case needs %zu bytes at %llu, buffer has %zu", l.total,
	      (unsigned long long)base, m->size);
	a = malloc(sizeof(double) * (size_t)gc->m * (size_t)gc->k);
	b = malloc(sizeof(double) * (size_t)gc->k * (size_t)gc->n);
	cv = calloc((size_t)gc->m * (size_t)gc->n, sizeof(double));
	bias = calloc((size_t)gc->n, sizeof(double));
	CHECK(a && b && cv && bias, "malloc");

	/* Fresh random inputs; the reference uses them as stored. The
	 * whole padded area is written so nothing stale is read. */
	for (i = 0; i < l.a_rows; i++) {
		for (j = 0; j < l.lda; j++) {
			double v = it_store(gc->in, p + l.off_a, (size_t)i * (size_t)l.lda + (size_t)j,
					    j < l.a_cols ? it_rand_uniform(-1, 1) : 1e3);
			if (j < l.a_cols) {
				if (gc->trans_a) {
					a[(size_t)j * (size_t)gc->k + (size_t)i] = v;   /* A stored [K, M] */
				} else {
					a[(size_t)i * (size_t)gc->k + (size_t)j] = v;
				}
			}
		}
	}
	for (i = 0; i < l.b_rows; i++) {
		for (j = 0; j < l.ldb; j++) {
			double v = it_store(gc->in, p + l.off_b, (size_t)i * (size_t)l.ldb + (size_t)j,
					    j < l.b_cols ? it_rand_uniform(-1, 1) : 1e3);
			if (j < l.b_cols) {
				if (gc->trans_b) {
					b[(size_t)j * (size_t)gc->n + (size_t)i] = v;   /* B stored [N, K] */
				} else {
					b[(size_t)i * (size_t)gc->n + (size_t)j] = v;
				}
			}
		}
	}
	for (i = 0; i < gc->m; i++) {
		for (j = 0; j < l.ldc; j++) {
			double v = it_store(gc->out, p + l.off_c, (size_t)i * (size_t)l.ldc + (size_t)j,
					    it_rand_uniform(-1, 1));
			if (j < gc->n) {
				cv[(size_t)i * (size_t)gc->n + (size_t)j] = v;
			}
		}
	}
	for (j = 0; j < gc->n; j++) {
		bias[j] = it_store(gc->out, p + l.off_bias, (size_t)j, it_rand_uniform(-1, 1));
	}
	it_poison(gc->out, p + l.off_d, (size_t)gc->m * (size_t)l.ldc);

	memset(&args, 0, sizeof(args));
	tensor2(&args.a, m->buf, base + l.off_a, gc->in, l.a_rows, l.a_cols, l.lda);
	tensor2(&args.b, m->buf, base + l.off_b, gc->in, l.b_rows, l.b_cols, l.ldb);
	tensor2(&args.d, m->buf, base + l.off_d, gc->out, gc->m, gc->n, l.ldc);
	if (gc->with_c) {
		tensor2(&tc, m->buf, base + l.off_c, gc->out, gc->m, gc->n, l.ldc);
		args.c = &tc;
	}
	if (use_bias) {
		memset(&tbias, 0, sizeof(tbias));
		tbias.buffer = m->buf;
		tbias.offset = base + l.off_bias;
		tbias.dtype = gc->out;
		tbias.rank = 1;
		tbias.shape[0] = gc->n;
		args.bias = &tbias;
	}
	args.trans_a = gc->trans_a;
	args.trans_b = gc->trans_b;
	args.alpha = gc->alpha;
	args.alpha_set = true;
	args.beta = gc->with_c ? gc->beta : 0;
	args.epilogue = gc->epilogue;

	r = regen_gemm(c, &args);
	if (r < 0) {
		goto out;
	}
	for (i = 0; i < gc->m; i++) {
		for (j = 0; j < gc->n; j++) {
			double acc = 0, abssum = 0, ref, got, bound;

			for (k = 0; k < gc->k; k++) {
				double x = a[(size_t)i * (size_t)gc->k + (size_t)k] * b[(size_t)k * (size_t)gc->n + (size_t)j];
				acc += x;
				abssum += fabs(x);
			}
			ref = gc->alpha * acc;
			abssum *= fabs(gc->alpha);
			if (gc->with_c) {
				ref += gc->beta * cv[(size_t)i * (size_t)gc->n + (size_t)j];
				abssum += fabs(gc->beta * cv[(size_t)i * (size_t)gc->n + (size_t)j]);
			}
			if (use_bias) {
				ref += bias[j];
				abssum += fabs(bias[j]);
			}
			if (gc->epilogue == REGEN_EPILOGUE_GELU || gc->epilogue == REGEN_EPILOGUE_GELU_BIAS) {
				ref = gelu(ref);
				abssum *= 1.2;
			}
			got = it_load(gc->out, p + l.off_d, (size_t)i * (size_t)l.ldc + (size_t)j);
			bound = 3e-5 * abssum + it_dtype_eps(gc->out) * fabs(ref) + dtype_quantum(gc->out);
			if (!(fabs(got - ref) <= bound)) {
				if (bad == 0) {
					bad_i = i;
					bad_j = j;
					bad_got = got;
					bad_ref = ref;
					bad_bound = bound;
				}
				bad++;
			}
			if (fabs(got - ref) / (bound) > worst) {
				worst = fabs(got - ref) / bound;
			}
		}
	}
	/* Padding between rows of D is not D's: it must be left alone. */
	for (i = 0; i < gc->m && bad == 0; i++) {
		for (j = gc->n; j < l.ldc; j++) {
			if (!isnan(it_load(gc->out, p + l.off_d, (size_t)i * (size_t)l.ldc + (size_t)j))) {
				snprintf(why, why_size, "wrote D's row padding at [%d,%d]", i, j);
				r = 1;
				goto out;
			}
		}
	}
	if (bad > 0) {
		snprintf(why, why_size, "%d of %d elements wrong; first D[%d,%d] = %.9g, reference %.9g (bound %.3g)",
			 bad, gc->m * gc->n, bad_i, bad_j, bad_got, bad_ref, bad_bound);
		r = 1;
	}
out:
	free(a);
	free(b);
	free(cv);
	free(bias);
	return r;
}

/* Attention. */

void it_attn_describe(const struct it_attn_case *ac, char *buf, size_t size)
{
	snprintf(buf, size, "attention %s B=%d H=%d Sq=%d Skv=%d D=%d Dv=%d causal=%d scale=%g",
		 it_dtype_name(ac->dt), ac->b, ac->h, ac->sq, ac->skv, ac->d, ac->dv, ac->causal, ac->scale);
}

static void tensor4(struct regen_tensor *t, regen_buffer *b, uint64_t offset, enum regen_dtype dt,
		    int n0, int n1, int n2, int n3)
{
	memset(t, 0, sizeof(*t));
	t->buffer = b;
	t->offset = offset;
	t->dtype = dt;
	t->rank = n3 > 0 ? 4 : 3;
	t->shape[0] = n0;
	t->shape[1] = n1;
	t->shape[2] = n2;
	t->shape[3] = n3;
}

/* Compares `n` values at `base` with ref[] within tol * bound[i] + eps*|ref|. */
static int compare(const char *what, enum regen_dtype dt, const void *base, const double *ref, const double *bound,
		   size_t n, double tol, char *why, size_t why_size)
{
	size_t i, bad = 0, first = 0;
	double got;

	for (i = 0; i < n; i++) {
		got = it_load(dt, base, i);
		if (!(fabs(got - ref[i]) <= tol * bound[i] + it_dtype_eps(dt) * fabs(ref[i]) + dtype_quantum(dt))) {
			if (bad++ == 0) {
				first = i;
			}
		}
	}
	if (bad > 0) {
		snprintf(why, why_size, "%s: %zu of %zu wrong; first [%zu] = %.9g, reference %.9g (bound %.3g)", what, bad,
			 n, first, it_load(dt, base, first), ref[first], tol * bound[first] + it_dtype_eps(dt) * fabs(ref[first]));
		return 1;
	}
	return 0;
}

int it_attention_run(regen_client *c, int device, const struct it_attn_case *ac, char *why, size_t why_size)
{
	const enum regen_dtype dt = ac->dt;
	const size_t es = it_dtype_size(dt);
	const int B = ac->b, H = ac->h, SQ = ac->sq, SK = ac->skv, D = ac->d, DV = ac->dv;
	const size_t nq = (size_t)B * H * SQ * D, nk = (size_t)B * H * SK * D, nv = (size_t)B * H * SK * DV;
	const size_t no = (size_t)B * H * SQ * DV, ns = (size_t)B * H * SQ;
	const double scale = ac->scale != 0 ? ac->scale : 1.0 / sqrt((double)D);
	const double tol = dt == REGEN_F32 ? 2e-5 : dt == REGEN_F16 ? 2e-3 : 1.6e-2;
	struct it_mem in, out, grad;
	size_t off_q, off_k, off_v, off_do, off_o, off_st, off_dq, off_dk, off_dv;
	double *q, *k, *v, *dO, *o_ref, *o_bound, *st_ref, *st_bound, *o_got;
	double *dq_ref, *dq_bound, *dk_ref, *dk_bound, *dv_ref, *dv_bound, *P, *dS;
	struct regen_attention_args fa;
	struct regen_attention_backward_args ba;
	struct regen_tensor tstats;
	size_t i;
	int bh, r = 0, x, y, e;

	off_q = 0;
	off_k = align64(off_q + nq * es);
	off_v = align64(off_k + nk * es);
	off_do = align64(off_v + nv * es);
	it_mem_alloc(align64(off_do + no * es), &in);
	off_o = 0;
	off_st = align64(no * es);
	it_mem_alloc(align64(off_st + ns * 4), &out);
	off_dq = 0;
	off_dk = align64(nq * es);
	off_dv = align64(off_dk + nk * es);
	it_mem_alloc(align64(off_dv + nv * es), &grad);

	q = malloc(nq * sizeof(double));
	k = malloc(nk * sizeof(double));
	v = malloc(nv * sizeof(double));
	dO = malloc(no * sizeof(double));
	o_ref = calloc(no, sizeof(double));
	o_bound = calloc(no, sizeof(double));
	o_got = calloc(no, sizeof(double));
	st_ref = calloc(ns, sizeof(double));
	st_bound = calloc(ns, sizeof(double));
	dq_ref = calloc(nq, sizeof(double));
	dq_bound = calloc(nq, sizeof(double));
	dk_ref = calloc(nk, sizeof(double));
	dk_bound = calloc(nk, sizeof(double));
	dv_ref = calloc(nv, sizeof(double));
	dv_bound = calloc(nv, sizeof(double));
	P = calloc((size_t)SQ * SK, sizeof(double));
	dS = calloc((size_t)SQ * SK, sizeof(double));
	CHECK(q && k && v && dO && o_ref && o_bound && o_got && st_ref && st_bound && dq_ref && dq_bound && dk_ref &&
	      dk_bound && dv_ref && dv_bound && P && dS, "malloc");

	for (i = 0; i < nq; i++) {
		q[i] = it_store(dt, in.ptr + off_q, i, it_rand_uniform(-1, 1));
	}
	for (i = 0; i < nk; i++) {
		k[i] = it_store(dt, in.ptr + off_k, i, it_rand_uniform(-1, 1));
	}
	for (i = 0; i < nv; i++) {
		v[i] = it_store(dt, in.ptr + off_v, i, it_rand_uniform(-1, 1));
	}
	for (i = 0; i < no; i++) {
		dO[i] = it_store(dt, in.ptr + off_do, i, it_rand_uniform(-1, 1));
	}
	it_poison(dt, out.ptr + off_o, no);
	it_poison(REGEN_F32, out.ptr + off_st, ns);
	it_poison(dt, grad.ptr + off_dq, nq);
	it_poison(dt, grad.ptr + off_dk, nk);
	it_poison(dt, grad.ptr + off_dv, nv);

	r = it_mem_import(c, device, &in);
	if (r == 0) {
		r = it_mem_import(c, device, &out);
	}
	if (r == 0) {
		r = it_mem_import(c, device, &grad);
	}
	if (r < 0) {
		goto done;
	}

	memset(&fa, 0, sizeof(fa));
	tensor4(&fa.q, in.buf, off_q, dt, B, H, SQ, D);
	tensor4(&fa.k, in.buf, off_k, dt, B, H, SK, D);
	tensor4(&fa.v, in.buf, off_v, dt, B, H, SK, DV);
	tensor4(&fa.o, out.buf, off_o, dt, B, H, SQ, DV);
	tensor4(&tstats, out.buf, off_st, REGEN_F32, B, H, SQ, 0);
	fa.stats = &tstats;
	fa.scale = ac->scale;
	fa.causal = ac->causal;
	r = regen_attention(c, &fa);
	if (r < 0) {
		goto done;
	}
	for (i = 0; i < no; i++) {
		o_got[i] = it_load(dt, out.ptr + off_o, i);
	}

	memset(&ba, 0, sizeof(ba));
	ba.q = fa.q;
	ba.k = fa.k;
	ba.v = fa.v;
	ba.o = fa.o;
	tensor4(&ba.d_o, in.buf, off_do, dt, B, H, SQ, DV);
	ba.stats = tstats;
	tensor4(&ba.d_q, grad.buf, off_dq, dt, B, H, SQ, D);
	tensor4(&ba.d_k, grad.buf, off_dk, dt, B, H, SK, D);
	tensor4(&ba.d_v, grad.buf, off_dv, dt, B, H, SK, DV);
	ba.scale = ac->scale;
	ba.causal = ac->causal;
	r = regen_attention_backward(c, &ba);
	if (r < 0) {
		goto done;
	}

	for (bh = 0; bh < B * H; bh++) {
		const double *qb = q + (size_t)bh * SQ * D, *kb = k + (size_t)bh * SK * D;
		const double *vb = v + (size_t)bh * SK * DV, *dob = dO + (size_t)bh * SQ * DV;
		const double *ob = o_got + (size_t)bh * SQ * DV;

		for (x = 0; x < SQ; x++) {
			double mx = -INFINITY, l = 0, Di = 0, Dabs = 0;

			for (y = 0; y < SK; y++) {
				double s = 0;

				for (e = 0; e < D; e++) {
					s += qb[(size_t)x * D + e] * kb[(size_t)y * D + e];
				}
				s *= scale;
				P[(size_t)x * SK + y] = (ac->causal && y > x) ? -INFINITY : s;
				if (P[(size_t)x * SK + y] > mx) {
					mx = P[(size_t)x * SK + y];
				}
			}
			for (y = 0; y < SK; y++) {
				P[(size_t)x * SK + y] = exp(P[(size_t)x * SK + y] - mx);
				l += P[(size_t)x * SK + y];
			}
			for (y = 0; y < SK; y++) {
				P[(size_t)x * SK + y] /= l;
			}
			st_ref[(size_t)bh * SQ + x] = mx + log(l);
			st_bound[(size_t)bh * SQ + x] = 1.0 + fabs(mx + log(l));
			for (e = 0; e < DV; e++) {
				double acc = 0, abs_ = 0;

				for (y = 0; y < SK; y++) {
					acc += P[(size_t)x * SK + y] * vb[(size_t)y * DV + e];
					abs_ += P[(size_t)x * SK + y] * fabs(vb[(size_t)y * DV + e]);
				}
				o_ref[((size_t)bh * SQ + x) * DV + e] = acc;
				o_bound[((size_t)bh * SQ + x) * DV + e] = abs_ + 1e-3;
				Di += dob[(size_t)x * DV + e] * ob[(size_t)x * DV + e];
				Dabs += fabs(dob[(size_t)x * DV + e] * ob[(size_t)x * DV + e]);
			}
			for (y = 0; y < SK; y++) {
				double dp = 0, dpabs = 0;

				for (e = 0; e < DV; e++) {
					dp += dob[(size_t)x * DV + e] * vb[(size_t)y * DV + e];
					dpabs += fabs(dob[(size_t)x * DV + e] * vb[(size_t)y * DV + e]);
				}
				dS[(size_t)x * SK + y] = P[(size_t)x * SK + y] * (dp - Di);
				/* dS's magnitude before cancellation, for the bounds. */
				dpabs = P[(size_t)x * SK + y] * (dpabs + Dabs);
				for (e = 0; e < D; e++) {
					dq_bound[((size_t)bh * SQ + x) * D + e] += scale * dpabs * fabs(kb[(size_t)y * D + e]);
					dk_bound[((size_t)bh * SK + y) * D + e] += scale * dpabs * fabs(qb[(size_t)x * D + e]);
				}
			}
		}
		for (x = 0; x < SQ; x++) {
			for (y = 0; y < SK; y++) {
				for (e = 0; e < D; e++) {
					dq_ref[((size_t)bh * SQ + x) * D + e] += scale * dS[(size_t)x * SK + y] * kb[(size_t)y * D + e];
					dk_ref[((size_t)bh * SK + y) * D + e] += scale * dS[(size_t)x * SK + y] * qb[(size_t)x * D + e];
				}
				for (e = 0; e < DV; e++) {
					dv_ref[((size_t)bh * SK + y) * DV + e] += P[(size_t)x * SK + y] * dob[(size_t)x * DV + e];
					dv_bound[((size_t)bh * SK + y) * DV + e] += P[(size_t)x * SK + y] * fabs(dob[(size_t)x * DV + e]);
				}
			}
		}
	}
	for (i = 0; i < nq; i++) {
		dq_bound[i] += 1e-3;
	}
	for (i = 0; i < nk; i++) {
		dk_bound[i] += 1e-3;
	}
	for (i = 0; i < nv; i++) {
		dv_bound[i] += 1e-3;
	}
	r = compare("o", dt, out.ptr + off_o, o_ref, o_bound, no, tol, why, why_size) ||
	    compare("stats", REGEN_F32, out.ptr + off_st, st_ref, st_bound, ns, dt == REGEN_F32 ? 2e-6 : 1e-4, why, why_size) ||
	    compare("d_q", dt, grad.ptr + off_dq, dq_ref, dq_bound, nq, tol, why, why_size) ||
	    compare("d_k", dt, grad.ptr + off_dk, dk_ref, dk_bound, nk, tol, why, why_size) ||
	    compare("d_v", dt, grad.ptr + off_dv, dv_ref, dv_bound, nv, tol, why, why_size);
done:
	it_mem_free(&in);
	it_mem_free(&out);
	it_mem_free(&grad);
	free(q);
	free(k);
	free(v);
	free(dO);
	free(o_ref);
	free(o_bound);
	free(o_got);
	free(st_ref);
	free(st_bound);
	free(dq_ref);
	free(dq_bound);
	free(dk_ref);
	free(dk_bound);
	free(dv_ref);
	free(dv_bound);
	free(P);
	free(dS);
	return r;
}

/* Raw sockets. */

int it_raw_connect(struct it_raw *r, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(r, 0, sizeof(*r));
	r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->fd < 0) {
		return -errno;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		close(r->fd);
		r->fd = -1;
		return -e;
	}
	return 0;
}

void it_raw_close(struct it_raw *r)
{
	if (r->fd >= 0) {
		close(r->fd);
	}
	free(r->buf);
	memset(r, 0, sizeof(*r));
	r->fd = -1;
}

int it_raw_send(struct it_raw *r, const void *data, size_t len, const int *fds, size_t nfds)
{
	const char *p = data;
	size_t sent = 0;
	ssize_t n;

	while (sent < len) {
		struct iovec iov = { .iov_base = (void *)(p + sent), .iov_len = len - sent };
		union {
			char buf[CMSG_SPACE(sizeof(int) * 16)];
			struct cmsghdr align;
		} u;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

		if (sent == 0 && nfds > 0) {
			struct cmsghdr *cm;

			memset(&u, 0, sizeof(u));
			mh.msg_control = u.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		n = sendmsg(r->fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			return -errno;
		}
		sent += (size_t)n;
	}
	return 0;
}

int it_raw_send_str(struct it_raw *r, const char *text, const int *fds, size_t nfds)
{
	return it_raw_send(r, text, strlen(text) + 1, fds, nfds);
}

char *it_raw_recv(struct it_raw *r, double timeout_s)
{
	double deadline = it_now() + timeout_s;
	char *nul, *msg;
	ssize_t n;
	size_t mlen;

	for (;;) {
		nul = r->buf != NULL ? memchr(r->buf, '\0', r->len) : NULL;
		if (nul != NULL) {
			mlen = (size_t)(nul - r->buf);
			msg = malloc(mlen + 1);
			CHECK(msg != NULL, "malloc");
			memcpy(msg, r->buf, mlen + 1);
			memmove(r->buf, nul + 1, r->len - mlen - 1);
			r->len -= mlen + 1;
			return msg;
		}
		{
			struct pollfd pfd = { .fd = r->fd, .events = POLLIN };
			int left = (int)((deadline - it_now()) * 1000);

			if (left <= 0 || poll(&pfd, 1, left) <= 0) {
				return NULL;
			}
		}
		if (r->len + 65536 > r->cap) {
			r->cap = r->len + 65536 * 2;
			r->buf = realloc(r->buf, r->cap);
			CHECK(r->buf != NULL, "realloc");
		}
		n = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
		if (n <= 0) {
			if (n < 0 && errno == EINTR) {
				continue;
			}
			return NULL;
		}
		r->len += (size_t)n;
	}
}

const char *it_group_without_nobody(void)
{
	static char name[64];
	static const char *const candidates[] = { "root", "wheel", "adm", "sys", "daemon", "disk", NULL };
	struct passwd *pw = getpwnam("nobody");
	struct group *gr;
	int i, j;
	bool member;

	if (pw == NULL) {
		return NULL;
	}
	for (i = 0; candidates[i] != NULL; i++) {
		gr = getgrnam(candidates[i]);
		if (gr == NULL || gr->gr_gid == pw->pw_gid) {
			continue;
		}
		member = false;
		for (j = 0; gr->gr_mem[j] != NULL; j++) {
			if (strcmp(gr->gr_mem[j], "nobody") == 0) {
				member = true;
			}
		}
		if (!member) {
			snprintf(name, sizeof(name), "%s", candidates[i]);
			return name;
		}
	}
	return NULL;
}
