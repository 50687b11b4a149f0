/* SPDX-License-Identifier: Apache-2.0 */
/* A program's definition outlives its worker (issue 29: "the rank does not
 * define it again after a bump"), for its own process only.
 *
 * regend (host backend) with --max-uid-programs N, N the programs this
 * test's uid holds. Process A (the test) defines `triple` (y = 3x) and
 * runs it; process B (uid nobody when the test runs as root, else A's uid)
 * defines its own; process C (A's uid) defines one and waits. Device 0's
 * worker is killed (SIGKILL) and respawned. Then:
 * - A connects again, imports its memory again (a new generation) and
 *   runs `triple` by its old id, with no Define in between: y = 3x of the
 *   new values. Program.Status lists it as A's.
 * - B runs A's id: io.regen.NoSuchObject; its Status lists only its own;
 *   Drop of A's id is NoSuchObject; B's own program runs.
 * - The programs that came back count: A's next Define is LimitExceeded
 *   {resource: "programs per uid"} while C (no connection since the kill)
 *   lives; once C exits, the worker lets C's program go and A's Define is
 *   taken.
 * - A drops `triple`; the worker is killed again: `triple` stays gone
 *   (NoSuchObject), while the program A defined after the first respawn
 *   comes back and runs. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define MEM_BYTES 4096

static struct tl_daemon daemon_;
static bool as_nobody;
/* Steps of B and C in turn: each waits for its byte and answers on `from`. */
static int to_b[2], to_c[2], from[2];

static const char triple[] =
	"{\"name\":\"triple\",\"tensors\":[{\"name\":\"x\",\"kind\":\"input\",\"dtype\":\"f32\",\"shape\":[4]},"
	"{\"name\":\"y\",\"kind\":\"output\",\"dtype\":\"f32\",\"shape\":[4]}],"
	"\"nodes\":[{\"op\":\"mul\",\"inputs\":[\"x\"],\"outputs\":[\"y\"],\"attrs\":{\"scalar\":3}}]}";
static const char negate[] =
	"{\"name\":\"negate\",\"tensors\":[{\"name\":\"x\",\"kind\":\"input\",\"dtype\":\"f32\",\"shape\":[4]},"
	"{\"name\":\"y\",\"kind\":\"output\",\"dtype\":\"f32\",\"shape\":[4]}],"
	"\"nodes\":[{\"op\":\"neg\",\"inputs\":[\"x\"],\"outputs\":[\"y\"]}]}";

static void step_wait(int fd)
{
	char c;

	ASSERT_EQ(read(fd, &c, 1), 1, "the test went away");
}

static void step_done(void)
{
	ASSERT_EQ(write(from[1], "x", 1), 1, "tell the test");
}

static void step(int fd, const char *what)
{
	char c;

	tl_log("step: %s", what);
	ASSERT_EQ(write(fd, "x", 1), 1, "next step");
	ASSERT_EQ(read(from[0], &c, 1), 1, "a child process failed its step: %s", what);
}

/* A process's memory on device 0: x at offset 0, y at 16. */
struct mem {
	int fd;
	float *map;
	char id[64];
};

static void mem_open(struct mem *m)
{
	m->fd = tl_memfd_open(MEM_BYTES);
	m->map = mmap(NULL, MEM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	ASSERT(m->map != MAP_FAILED, "mmap");
}

static void mem_import(struct tl_conn *c, struct mem *m)
{
	struct tl_reply r;

	ASSERT_EQ(tl_import_memfd(c, 0, m->fd, MEM_BYTES, m->id, &r), 0, "import: %s", tl_reply_describe(&r));
	tl_reply_finish(&r);
}

static void define(struct tl_conn *c, const char *def, struct tl_reply *r)
{
	tl_call(c, r, 30, NULL, 0, "io.regen.Program.Define", "%s", def);
}

static void define_ok(struct tl_conn *c, const char *def, char *id, const char *what)
{
	struct tl_reply r;

	define(c, def, &r);
	ASSERT_REPLY_OK(&r, "%s", what);
	snprintf(id, 64, "%s", tl_reply_str(&r, "program"));
	tl_reply_finish(&r);
}

static void run(struct tl_conn *c, const char *program, const struct mem *m, struct tl_reply *r)
{
	tl_call(c, r, 30, NULL, 0, "io.regen.Program.Run",
		"{\"program\":\"%s\",\"bind\":{\"x\":{\"buffer\":\"%s\",\"offset\":0},"
		"\"y\":{\"buffer\":\"%s\",\"offset\":16}}}",
		program, m->id, m->id);
}

/* Runs program on fresh x and checks y = factor * x. */
static void run_ok(struct tl_conn *c, const char *program, struct mem *m, float factor, const char *what)
{
	struct tl_reply r;

	for (int i = 0; i < 4; i++) {
		m->map[i] = (float)(rand() % 1000) / 8.0f - 60.0f;
		m->map[4 + i] = 12345.0f;
	}
	run(c, program, m, &r);
	ASSERT_REPLY_OK(&r, "%s", what);
	tl_reply_finish(&r);
	for (int i = 0; i < 4; i++)
		ASSERT(m->map[4 + i] == factor * m->map[i], "%s: y[%d] = %g, want %g", what, i, (double)m->map[4 + i],
		       (double)(factor * m->map[i]));
}

static void expect_no_such(struct tl_reply *r, const char *what)
{
	ASSERT_REPLY_ERROR(r, "io.regen.NoSuchObject", "%s", what);
	tl_reply_finish(r);
}

/* The programs Program.Status lists for this connection's process, as
 * "id,id,". */
static void status_ids(struct tl_conn *c, char *out, size_t size)
{
	struct tl_reply r;
	const cJSON *p;
	size_t n = 0;

	tl_call_ok(c, &r, "io.regen.Program.Status", NULL);
	out[0] = '\0';
	cJSON_ArrayForEach(p, cJSON_GetObjectItem(r.params, "programs"))
		n += (size_t)snprintf(out + n, size - n, "%s,", cJSON_GetStringValue(cJSON_GetObjectItem(p, "program")));
	tl_reply_finish(&r);
}

/* The id A's `triple` has, for B's attempts; written by A before B's step. */
static char a_triple[64];

static int process_b(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	struct mem m;
	char own[64], listed[256], want[80];

	mem_open(&m);
	if (as_nobody)
		tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "B connects");
	mem_import(&c, &m);
	step_wait(to_b[0]);
	define_ok(&c, negate, own, "B's program");
	run_ok(&c, own, &m, -1.0f, "B's program");
	run(&c, a_triple, &m, &r);
	expect_no_such(&r, "B runs A's program");
	step_done();

	/* After the respawn. */
	step_wait(to_b[0]);
	tl_conn_close(&c);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "B connects again");
	mem_import(&c, &m);
	run(&c, a_triple, &m, &r);
	expect_no_such(&r, "B runs A's program after the respawn");
	tl_call(&c, &r, 30, NULL, 0, "io.regen.Program.Drop", "{\"program\":\"%s\"}", a_triple);
	expect_no_such(&r, "B drops A's program after the respawn");
	tl_call(&c, &r, 30, NULL, 0, "io.regen.Program.Status", "{\"program\":\"%s\"}", a_triple);
	expect_no_such(&r, "B asks for A's program's Status");
	status_ids(&c, listed, sizeof(listed));
	snprintf(want, sizeof(want), "%s,", own);
	ASSERT_STR_EQ(listed, want, "B's programs after the respawn");
	run_ok(&c, own, &m, -1.0f, "B's own program after the respawn, not defined again");
	step_done();
	step_wait(to_b[0]);
	tl_conn_close(&c);
	return 0;
}

static int process_c(void *arg)
{
	struct tl_conn c;
	char own[64];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "C connects");
	step_wait(to_c[0]);
	define_ok(&c, negate, own, "C's program");
	step_done();
	/* The worker dies under it; C never connects again, and exits when
	 * told. */
	step_wait(to_c[0]);
	tl_conn_close(&c);
	return 0;
}

/* Kills device 0's worker and waits until a new one serves. */
static void kill_worker(struct tl_conn *main_conn)
{
	struct tl_device before, now;
	double deadline = tl_now() + tl_timeout(30);

	tl_device_status(main_conn, 0, &before);
	tl_log("killing worker %lld (generation %lld)", (long long)before.worker_pid, (long long)before.generation);
	ASSERT(before.worker_pid > 0 && kill((pid_t)before.worker_pid, SIGKILL) == 0, "kill %lld",
	       (long long)before.worker_pid);
	for (;;) {
		tl_device_status(main_conn, 0, &now);
		if (now.generation > before.generation && strcmp(now.state, "ready") == 0 &&
		    now.worker_pid != before.worker_pid)
			break;
		ASSERT(tl_now() < deadline, "device 0 not back after 30 s: generation %lld, state %s",
		       (long long)now.generation, now.state);
		usleep(20000);
	}
	tl_log("worker %lld serves generation %lld", (long long)now.worker_pid, (long long)now.generation);
}

int main(void)
{
	char max_uid[16], listed[256], want[160], second[64];
	const char *extra[] = { "--socket-mode", "0666", "--max-uid-programs", max_uid, NULL };
	struct tl_conn main_conn, a;
	struct tl_reply r;
	struct mem m;

	tl_init(120);
	srand((unsigned)getpid());
	as_nobody = geteuid() == 0;
	/* A's and C's programs, and B's where B is of their uid. */
	snprintf(max_uid, sizeof(max_uid), "%d", as_nobody ? 2 : 3);
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	ASSERT(pipe(to_b) == 0 && pipe(to_c) == 0 && pipe(from) == 0, "pipes");
	ASSERT_OK(tl_conn_open(&main_conn, daemon_.sock), "main socket");
	ASSERT_OK(tl_conn_open(&a, tl_daemon_worker_socket(&daemon_, 0)), "A connects");
	mem_open(&m);
	mem_import(&a, &m);
	define_ok(&a, triple, a_triple, "A's triple");
	run_ok(&a, a_triple, &m, 3.0f, "A's triple");

	pid_t b = tl_fork(process_b, NULL, 0), c = tl_fork(process_c, NULL, 0);
	step(to_b[1], "B defines its program and cannot run A's");
	step(to_c[1], "C defines its program");

	kill_worker(&main_conn);
	tl_conn_close(&a);
	ASSERT_OK(tl_conn_open(&a, tl_daemon_worker_socket(&daemon_, 0)), "A connects again");
	mem_import(&a, &m);
	run_ok(&a, a_triple, &m, 3.0f, "A's triple after the respawn, by its old id, not defined again");
	status_ids(&a, listed, sizeof(listed));
	snprintf(want, sizeof(want), "%s,", a_triple);
	ASSERT_STR_EQ(listed, want, "A's programs after the respawn");
	step(to_b[1], "B cannot see or run A's program; runs its own");

	/* C's program came back for C, which has not connected: it counts. */
	define(&a, negate, &r);
	ASSERT_REPLY_ERROR(&r, "io.regen.LimitExceeded", "A's second program beside C's kept one");
	ASSERT_STR_EQ(tl_reply_str(&r, "resource"), "programs per uid", "%s", tl_reply_describe(&r));
	tl_reply_finish(&r);
	tl_log("C exits without connecting again");
	ASSERT_EQ(write(to_c[1], "x", 1), 1, "C's last step");
	ASSERT_EQ(tl_wait(c, 30), 0, "process C");
	/* The worker sees C's exit on its loop: a few tries. */
	for (double deadline = tl_now() + tl_timeout(10);;) {
		define(&a, negate, &r);
		if (!r.error)
			break;
		ASSERT_STR_EQ(r.error, "io.regen.LimitExceeded", "%s", tl_reply_describe(&r));
		ASSERT(tl_now() < deadline, "C's program still held 10 s after C exited");
		tl_reply_finish(&r);
		usleep(50000);
	}
	snprintf(second, sizeof(second), "%s", tl_reply_str(&r, "program"));
	tl_reply_finish(&r);
	run_ok(&a, second, &m, -1.0f, "A's second program");

	/* A dropped program stays dropped across the next respawn; one
	 * defined on a respawned worker comes back. */
	tl_call_ok(&a, &r, "io.regen.Program.Drop", "{\"program\":\"%s\"}", a_triple);
	tl_reply_finish(&r);
	kill_worker(&main_conn);
	tl_conn_close(&a);
	ASSERT_OK(tl_conn_open(&a, tl_daemon_worker_socket(&daemon_, 0)), "A connects a third time");
	mem_import(&a, &m);
	run(&a, a_triple, &m, &r);
	expect_no_such(&r, "A's dropped triple after a respawn");
	run_ok(&a, second, &m, -1.0f, "A's second program after the second respawn");

	ASSERT_EQ(write(to_b[1], "x", 1), 1, "B's last step");
	ASSERT_EQ(tl_wait(b, 30), 0, "process B");
	tl_conn_close(&a);
	tl_conn_close(&main_conn);
	tl_log("PASS");
	return 0;
}
