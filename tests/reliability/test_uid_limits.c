/* SPDX-License-Identifier: Apache-2.0 */
/* What one uid may hold in a worker is bounded per uid, not only per
 * process or connection.
 *
 * regend --max-import-gib 1 --max-ring-entries 2048:
 * - Imports: process A of uid nobody imports a sparse memfd of 768 MiB;
 *   process B of the same uid is refused one of 512 MiB with
 *   io.regen.LimitExceeded {resource: "import bytes", limit: 2^30}; root
 *   (another uid) imports 768 MiB; once A closes its buffer, B's import is
 *   taken. (Before issue 30 nothing bounded a uid's imports together:
 *   sparse memfds of 128 TiB imported 74 times took the host worker's
 *   whole address space, and every other user's imports and lanes failed.)
 * - Rings: process A of uid nobody opens two rings of 1024 entries on two
 *   connections; process B of the same uid is refused a third with
 *   LimitExceeded {resource: "ring entries", limit: 2048}; root opens one;
 *   once one of A's connections closes, B's ring opens. (Before: 256 rings
 *   of 1024 entries, about 1 GiB of the worker, for one uid.)
 * - Programs, with --max-uid-programs 3 --max-uid-program-nodes 40 (the
 *   per-process limits at their defaults, 64 and 65536): A defines two
 *   programs of 10 nodes; B defines one, and a fourth of the uid is
 *   LimitExceeded {resource: "programs per uid", limit: 3}; root defines
 *   one beside them; once A dropped one, B's program of 25 nodes (45 with
 *   the uid's 20) is LimitExceeded {resource: "program nodes per uid",
 *   limit: 40} and one of 20 is taken. (Before: programs and their nodes
 *   were bounded per process alone; a uid with N processes held N times
 *   as much.) */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/ring.h"
#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define MIB (1ul << 20)

static struct tl_daemon daemon_;
/* The steps of the two processes of uid nobody, in turn: each waits for
 * its byte on its pipe and answers on the parent's. */
static int to_a[2], to_b[2], from[2];

static void step_wait(int fd)
{
	char c;

	ASSERT_EQ(read(fd, &c, 1), 1, "the test went away");
}

static void step_done(void)
{
	ASSERT_EQ(write(from[1], "x", 1), 1, "tell the test");
}

static void step(int fd)
{
	char c;

	ASSERT_EQ(write(fd, "x", 1), 1, "next step");
	ASSERT_EQ(read(from[0], &c, 1), 1, "a process of nobody failed its step");
}

static void expect_limit(struct tl_reply *r, const char *resource, long long limit, const char *what)
{
	ASSERT_REPLY_ERROR(r, "io.regen.LimitExceeded", "%s: %s", what, tl_reply_describe(r));
	ASSERT(tl_reply_str(r, "resource") && strcmp(tl_reply_str(r, "resource"), resource) == 0 &&
		       tl_reply_int(r, "limit") == limit,
	       "%s: %s", what, tl_reply_describe(r));
	tl_log("%s: %s", what, tl_reply_describe(r));
}

struct ring {
	struct tl_conn conn;
	int memfd, bell[2];
};

/* Lane.Open of `entries` on a fresh connection: the reply in *r. */
static void open_ring(struct ring *g, uint32_t entries, struct tl_reply *r)
{
	void *base;

	ASSERT_OK(tl_conn_open(&g->conn, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	g->memfd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ASSERT(g->memfd >= 0 && ftruncate(g->memfd, (off_t)rp_ring_size(entries)) == 0 &&
		       fcntl(g->memfd, F_ADD_SEALS, F_SEAL_SHRINK) == 0,
	       "ring memfd");
	base = mmap(NULL, rp_ring_size(entries), PROT_READ | PROT_WRITE, MAP_SHARED, g->memfd, 0);
	ASSERT(base != MAP_FAILED, "mmap");
	rp_ring_header(base)->magic = RP_RING_MAGIC;
	rp_ring_header(base)->version = RP_RING_VERSION;
	rp_ring_header(base)->entries = entries;
	munmap(base, rp_ring_size(entries));
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, g->bell), 0, "socketpair");
	int fds[2] = { g->memfd, g->bell[1] };
	tl_call(&g->conn, r, 10, fds, 2, "io.regen.Lane.Open", "{\"entries\":%u,\"ring\":0,\"doorbell\":1}", entries);
}

/* Program.Define of a chain of `nodes` negations x -> t1 -> ... -> y. */
static void define_chain(struct tl_conn *c, int nodes, struct tl_reply *r)
{
	char tensors[16384], chain[16384];
	size_t t = 0, n = 0;

	t += (size_t)snprintf(tensors + t, sizeof(tensors) - t,
			      "{\"name\":\"x\",\"kind\":\"input\",\"dtype\":\"f32\",\"shape\":[4]},"
			      "{\"name\":\"y\",\"kind\":\"output\",\"dtype\":\"f32\",\"shape\":[4]}");
	for (int i = 1; i < nodes; i++)
		t += (size_t)snprintf(tensors + t, sizeof(tensors) - t,
				      ",{\"name\":\"t%d\",\"kind\":\"intermediate\",\"dtype\":\"f32\",\"shape\":[4]}", i);
	for (int i = 0; i < nodes; i++) {
		char in[16], out[16];

		snprintf(in, sizeof(in), i == 0 ? "x" : "t%d", i);
		snprintf(out, sizeof(out), i == nodes - 1 ? "y" : "t%d", i + 1);
		n += (size_t)snprintf(chain + n, sizeof(chain) - n, "%s{\"op\":\"neg\",\"inputs\":[\"%s\"],\"outputs\":[\"%s\"]}",
				      i ? "," : "", in, out);
	}
	ASSERT(t < sizeof(tensors) && n < sizeof(chain), "a chain of %d nodes does not fit", nodes);
	tl_call(c, r, 30, NULL, 0, "io.regen.Program.Define", "{\"tensors\":[%s],\"nodes\":[%s]}", tensors, chain);
}

static void close_ring(struct ring *g)
{
	tl_conn_close(&g->conn);
	close(g->memfd);
	close(g->bell[0]);
	close(g->bell[1]);
}

static int process_a(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	struct ring g[2];
	char id[64];

	tl_become_nobody(0, false);
	step_wait(to_a[0]);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(768 * MIB), 768 * MIB, id, &r), 0, "A's 768 MiB: %s",
		  tl_reply_describe(&r));
	tl_reply_finish(&r);
	step_done();
	step_wait(to_a[0]);
	tl_call_ok(&c, &r, "io.regen.Memory.CloseBuffer", "{\"buffer\":\"%s\"}", id);
	tl_reply_finish(&r);
	step_done();
	step_wait(to_a[0]);
	for (int i = 0; i < 2; i++) {
		open_ring(&g[i], 1024, &r);
		ASSERT_REPLY_OK(&r, "A's ring %d of 1024 entries", i);
		tl_reply_finish(&r);
	}
	step_done();
	step_wait(to_a[0]);
	close_ring(&g[0]);
	/* The worker has seen the close once a call on another connection
	 * of it is answered after it. */
	usleep(200000);
	step_done();
	step_wait(to_a[0]);
	close_ring(&g[1]);
	for (int i = 0; i < 2; i++) {
		define_chain(&c, 10, &r);
		ASSERT_REPLY_OK(&r, "A's program %d of 10 nodes", i);
		if (i == 0)
			snprintf(id, sizeof(id), "%s", tl_reply_str(&r, "program"));
		tl_reply_finish(&r);
	}
	step_done();
	step_wait(to_a[0]);
	tl_call_ok(&c, &r, "io.regen.Program.Drop", "{\"program\":\"%s\"}", id);
	tl_reply_finish(&r);
	step_done();
	step_wait(to_a[0]);
	tl_conn_close(&c);
	return 0;
}

static int process_b(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	struct ring g;
	char id[64];
	int fd = tl_memfd_open(512 * MIB);

	tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	step_wait(to_b[0]);
	ASSERT_EQ(tl_import_memfd(&c, 0, fd, 512 * MIB, id, &r), -1, "B's 512 MiB beside A's 768 was taken");
	expect_limit(&r, "import bytes", 1L << 30, "B's 512 MiB beside A's 768 MiB (same uid, another process)");
	tl_reply_finish(&r);
	step_done();
	step_wait(to_b[0]);
	ASSERT_EQ(tl_import_memfd(&c, 0, fd, 512 * MIB, id, &r), 0, "B's 512 MiB once A closed its own: %s",
		  tl_reply_describe(&r));
	tl_reply_finish(&r);
	step_done();
	step_wait(to_b[0]);
	open_ring(&g, 1024, &r);
	expect_limit(&r, "ring entries", 2048, "B's ring of 1024 beside A's two (same uid)");
	tl_reply_finish(&r);
	close_ring(&g);
	step_done();
	step_wait(to_b[0]);
	open_ring(&g, 1024, &r);
	ASSERT_REPLY_OK(&r, "B's ring once one of A's closed");
	tl_reply_finish(&r);
	close_ring(&g);
	step_done();
	step_wait(to_b[0]);
	define_chain(&c, 10, &r);
	ASSERT_REPLY_OK(&r, "B's program beside A's two (the uid's third)");
	tl_reply_finish(&r);
	define_chain(&c, 1, &r);
	expect_limit(&r, "programs per uid", 3, "B's second program, the uid's fourth");
	tl_reply_finish(&r);
	step_done();
	step_wait(to_b[0]);
	define_chain(&c, 25, &r);
	expect_limit(&r, "program nodes per uid", 40, "B's program of 25 nodes beside the uid's 20");
	tl_reply_finish(&r);
	define_chain(&c, 20, &r);
	ASSERT_REPLY_OK(&r, "B's program of 20 nodes beside the uid's 20");
	tl_reply_finish(&r);
	step_done();
	tl_conn_close(&c);
	return 0;
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", "--max-import-gib", "1", "--max-ring-entries", "2048",
					     "--max-uid-programs", "3", "--max-uid-program-nodes", "40", NULL };
	struct tl_conn c;
	struct tl_reply r;
	struct ring g;
	char id[64];

	tl_init(120);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });
	ASSERT(pipe(to_a) == 0 && pipe(to_b) == 0 && pipe(from) == 0, "pipes");
	pid_t a = tl_fork(process_a, NULL, 0), b = tl_fork(process_b, NULL, 0);

	step(to_a[1]);                 /* A imports 768 MiB */
	step(to_b[1]);                 /* B is refused 512 MiB */
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	ASSERT_EQ(tl_import_memfd(&c, 0, tl_memfd_open(768 * MIB), 768 * MIB, id, &r), 0,
		  "root's 768 MiB beside nobody's: %s", tl_reply_describe(&r));
	tl_reply_finish(&r);
	step(to_a[1]);                 /* A closes its buffer */
	step(to_b[1]);                 /* B's import is taken */
	step(to_a[1]);                 /* A opens two rings of 1024 */
	step(to_b[1]);                 /* B is refused a third */
	open_ring(&g, 1024, &r);
	ASSERT_REPLY_OK(&r, "root's ring beside nobody's 2048 entries");
	tl_reply_finish(&r);
	close_ring(&g);
	step(to_a[1]);                 /* A closes one */
	step(to_b[1]);                 /* B's ring opens */
	step(to_a[1]);                 /* A defines two programs of 10 nodes */
	step(to_b[1]);                 /* B defines one; a fourth is refused */
	define_chain(&c, 10, &r);
	ASSERT_REPLY_OK(&r, "root's program beside nobody's three");
	tl_reply_finish(&r);
	step(to_a[1]);                 /* A drops one */
	step(to_b[1]);                 /* B: 25 nodes refused, 20 taken */
	ASSERT_EQ(write(to_a[1], "x", 1), 1, "A's last step");
	tl_conn_close(&c);
	ASSERT_EQ(tl_wait(a, 30), 0, "process A");
	ASSERT_EQ(tl_wait(b, 30), 0, "process B");
	tl_log("PASS");
	return 0;
}
