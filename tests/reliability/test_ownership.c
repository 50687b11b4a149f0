/* SPDX-License-Identifier: Apache-2.0 */
/* Ids are bound to credentials that cannot be forged or recycled
 * (docs/protocol.md, "Who may name an id").
 *
 * - A recycled pid: a victim imports a buffer holding a secret, forks a
 *   child that keeps the connection open, and exits. An attacker that gets
 *   the victim's pid (ns_last_pid steers the next fork onto it) — once as
 *   another uid (nobody, the socket opened to it with --socket-mode 0666),
 *   once as the same uid — names the victim's id as a Gemm input, as a Gemm
 *   output and in CloseBuffer: every call gets io.regen.NoSuchObject, and
 *   the victim's child still reads its buffer intact and computes with it.
 * - Peers whose pid regend cannot see: regend runs in a pid namespace of
 *   its own, so every client outside it has pid 0 in SO_PEERCRED. One
 *   client's id is another client's NoSuchObject, and still its owner's.
 *
 * Needs root (to drop to nobody and to write ns_last_pid); skipped (77)
 * where that is not possible. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define N 16   /* 16x16 f32 matrices */
#define BYTES (N * N * 4)

static struct tl_daemon daemon_;
static char victim_id[64];
static int pipe_to_child[2], pipe_from_child[2];

static int fill_memfd(float value)
{
	int fd = tl_memfd_open(BYTES);
	float *m = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	ASSERT(m != MAP_FAILED, "mmap: %s", strerror(errno));
	for (int i = 0; i < N * N; i++)
		m[i] = value;
	munmap(m, BYTES);
	return fd;
}

/* D = A B with A and B the same buffer, D the caller's. */
static void gemm(struct tl_conn *c, struct tl_reply *r, const char *a, const char *d)
{
	tl_call(c, r, 10, NULL, 0, "io.regen.Compute.Gemm",
		"{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]},"
		"\"d\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d,%d]}}",
		a, N, N, a, N, N, d, N, N);
}

static void expect_no_such_object(struct tl_reply *r, const char *what)
{
	ASSERT_REPLY_ERROR(r, "io.regen.NoSuchObject", "%s: got %s, expected NoSuchObject", what,
	                   r->error ? r->error : "success");
	tl_reply_finish(r);
}

/* The victim's child: keeps the victim's connection, and on request proves
 * the buffer is still the victim's and intact (D = S S with S all 2.0 is
 * all 64.0). */
static void child_keeps_connection(struct tl_conn *c)
{
	char cmd;
	int out_fd = fill_memfd(0.0f);
	char out_id[64];
	struct tl_reply r;

	/* Only the test holds the other ends: EOF ends this process. */
	close(pipe_to_child[1]);
	close(pipe_from_child[0]);
	ASSERT_EQ(tl_import_memfd(c, 0, out_fd, BYTES, out_id, &r), 0, "child's import: %s", r.error);
	tl_reply_finish(&r);
	(void)!write(pipe_from_child[1], "r", 1);
	while (read(pipe_to_child[0], &cmd, 1) == 1 && cmd == 'g') {
		gemm(c, &r, victim_id, out_id);
		char ok = 'n';
		if (!r.error) {
			float *d = mmap(NULL, BYTES, PROT_READ, MAP_SHARED, out_fd, 0);
			ok = 'y';
			for (int i = 0; i < N * N; i++)
				ok = d[i] == 2.0f * 2.0f * N ? ok : 'n';
			munmap(d, BYTES);
		}
		tl_reply_finish(&r);
		(void)!write(pipe_from_child[1], &ok, 1);
	}
	_exit(0);
}

/* Imports the secret, forks the keeper, exits: its pid is free. */
static int victim(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	int fd = fill_memfd(2.0f);

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "victim connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, fd, BYTES, victim_id, &r), 0, "victim import: %s", r.error);
	tl_reply_finish(&r);
	(void)!write(pipe_from_child[1], victim_id, sizeof(victim_id));
	if (fork() == 0)
		child_keeps_connection(&c);
	/* The child holds the connection now; this copy goes with the victim. */
	tl_conn_close(&c);
	return 0;
}

struct attacker_args {
	bool nobody;
};

static int attacker(void *arg)
{
	const struct attacker_args *a = arg;
	struct tl_conn c;
	struct tl_reply r;
	char own[64];
	int fd;

	if (a->nobody)
		tl_become_nobody(-1, false);
	fd = fill_memfd(1.0f);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "attacker connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, fd, BYTES, own, &r), 0, "attacker's own import: %s", r.error);
	tl_reply_finish(&r);
	gemm(&c, &r, victim_id, own);
	expect_no_such_object(&r, "reading the victim's buffer");
	gemm(&c, &r, own, victim_id);
	expect_no_such_object(&r, "writing the victim's buffer");
	tl_call(&c, &r, 10, NULL, 0, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", victim_id);
	expect_no_such_object(&r, "closing the victim's buffer");
	tl_conn_close(&c);
	return 0;
}

/* The next fork gets `pid`, if nothing else forks in between. */
static bool steer_next_pid(pid_t pid)
{
	int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
	char text[32];
	bool ok;

	if (fd < 0)
		return false;
	snprintf(text, sizeof(text), "%d", (int)pid - 1);
	ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
	close(fd);
	return ok;
}

static void recycled_pid(bool nobody)
{
	struct attacker_args args = { nobody };
	pid_t v, x = -1;
	char ack;

	ASSERT(pipe(pipe_to_child) == 0 && pipe(pipe_from_child) == 0, "pipe");
	v = tl_fork(victim, NULL, 0);
	ASSERT(read(pipe_from_child[0], victim_id, sizeof(victim_id)) == (ssize_t)sizeof(victim_id), "victim id");
	ASSERT_EQ(tl_wait(v, 10), 0, "victim failed");
	ASSERT(read(pipe_from_child[0], &ack, 1) == 1 && ack == 'r', "keeper not ready");
	for (int tries = 0; tries < 20 && x != v; tries++) {
		if (!steer_next_pid(v))
			tl_skip("cannot write /proc/sys/kernel/ns_last_pid");
		x = tl_fork(attacker, &args, 0);
		if (x != v)
			ASSERT_EQ(tl_wait(x, 30), 0, "attacker (pid %d, not the victim's %d) failed", (int)x, (int)v);
	}
	ASSERT_EQ(x, v, "could not get the victim's pid %d again", (int)v);
	ASSERT_EQ(tl_wait(x, 30), 0, "attacker with the victim's pid %d%s failed", (int)v, nobody ? " as nobody" : "");
	/* The victim's child still owns the buffer, unchanged. */
	ASSERT(write(pipe_to_child[1], "g", 1) == 1, "poke keeper");
	ASSERT(read(pipe_from_child[0], &ack, 1) == 1 && ack == 'y', "the victim's buffer is gone or changed");
	close(pipe_to_child[1]);
	close(pipe_from_child[0]);
	close(pipe_to_child[0]);
	close(pipe_from_child[1]);
	tl_log("recycled pid %d (%s): NoSuchObject for reading, writing and closing the victim's buffer, which "
	       "stays its owner's", (int)v, nobody ? "another uid" : "the same uid");
}

/* Runs regend in a pid namespace of its own: clients outside are pid 0 to
 * it. */
static int two_clients_unseen(void *arg)
{
	struct tl_conn a, b;
	struct tl_reply r;
	char ida[64], idb[64], outa[64];
	int fa = fill_memfd(2.0f), fb = fill_memfd(1.0f), fo = fill_memfd(0.0f);
	pid_t other;

	ASSERT_OK(tl_conn_open(&a, tl_daemon_worker_socket(&daemon_, 0)), "connect a");
	ASSERT_EQ(tl_import_memfd(&a, 0, fa, BYTES, ida, &r), 0, "import a: %s", r.error);
	tl_reply_finish(&r);
	ASSERT_EQ(tl_import_memfd(&a, 0, fo, BYTES, outa, &r), 0, "import a's output: %s", r.error);
	tl_reply_finish(&r);
	memcpy(victim_id, ida, sizeof(ida));
	other = fork();
	if (other == 0) {
		ASSERT_OK(tl_conn_open(&b, tl_daemon_worker_socket(&daemon_, 0)), "connect b");
		ASSERT_EQ(tl_import_memfd(&b, 0, fb, BYTES, idb, &r), 0, "import b: %s", r.error);
		tl_reply_finish(&r);
		gemm(&b, &r, victim_id, idb);
		expect_no_such_object(&r, "pid-0 client naming another pid-0 client's buffer");
		tl_conn_close(&b);
		_exit(0);
	}
	ASSERT_EQ(tl_wait(other, 30), 0, "the other pid-0 client failed");
	/* Its owner still uses it. */
	gemm(&a, &r, ida, outa);
	ASSERT(!r.error, "the owner's own Gemm failed: %s", r.error);
	tl_reply_finish(&r);
	tl_conn_close(&a);
	return 0;
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", NULL };

	tl_init(120);
	if (geteuid() != 0)
		tl_skip("needs root: to drop to nobody and to steer pids");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	recycled_pid(true);
	recycled_pid(false);
	tl_daemon_stop(&daemon_);

	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra, .pid_namespace = true });
	ASSERT_EQ(tl_wait(tl_fork(two_clients_unseen, NULL, 0), 30), 0, "pid-0 clients");
	tl_log("pid 0 (regend in its own pid namespace): one client's id is another's NoSuchObject");
	tl_daemon_stop(&daemon_);
	return 0;
}
