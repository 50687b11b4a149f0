/* SPDX-License-Identifier: Apache-2.0 */
/* A communicator's ranks are all of one uid: another user who learns a
 * unique id (it travels between ranks in the clear: a store, a file, the
 * environment) cannot join with it.
 *
 * regend --socket-mode 0666, the host backend, device 0. Twice, once with a
 * unique id from root's GetUniqueId on device 0's worker and once with one
 * made elsewhere (random bytes, as another device's or node's would be):
 * root's rank 0 of 2 starts its Init; uid nobody's Init of rank 1 with the
 * same id is io.regen.NotPermitted within a second; root's own rank 1 (a
 * second process) then joins, and an AllReduce over both ranks gives 1 + 2
 * everywhere: nobody's data took no part in it. Then the other way round:
 * uid nobody's rank 0 with an id of its own, and root's rank 1 is
 * refused as well (the rule binds ids to a uid, not to privilege).
 *
 * Then across devices (the daemon has two): root's id from device 0's
 * worker, nobody's Init with it on device 1 is NotPermitted and root's is
 * let in (its lone rank's deadline passes: CommTimeout); an id made
 * elsewhere that root's rank 0 joined with on device 0, likewise refused
 * to nobody on device 1; and nobody's id from device 1's worker is
 * refused to root on device 0.
 *
 * Before issue 30, nobody's Init joined root's communicator as rank 1
 * (success), its AllReduce read and wrote root's ranks' data, and root's
 * own rank 1 was refused ("rank 1 already joined this unique id"). Until
 * the supervisor kept the ids (branch varlink-loop), each worker knew only
 * its own: on device 1 nobody's Init with root's id was let in and waited
 * for the rendezvous. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/asserts.h"
#include "tests/lib/daemon.h"
#include "tests/lib/memfd.h"
#include "tests/lib/proc.h"
#include "tests/lib/varlink.h"

#define COUNT 16

static struct tl_daemon daemon_;

static void init(struct tl_conn *c, const char *unique_id, int rank, int deadline_ms)
{
	ASSERT_EQ(tl_send(c, "io.regen.Comm.Init", NULL, 0,
			  "{\"unique_id\":\"%s\",\"rank\":%d,\"nranks\":2,\"deadline_ms\":%d}", unique_id, rank,
			  deadline_ms),
		  0, "send Init");
}

/* Init's reply: the communicator's id into comm. */
static void joined(struct tl_conn *c, char *comm, size_t size, const char *who)
{
	struct tl_reply r;

	ASSERT_EQ(tl_recv(c, &r, tl_timeout(30)), 0, "%s: no reply to Init", who);
	ASSERT_REPLY_OK(&r, "%s's Init", who);
	snprintf(comm, size, "%s", tl_reply_str(&r, "comm"));
	tl_reply_finish(&r);
}

/* Init as rank `rank` on `device`, expected to be refused at once. */
static void refused_on(int device, const char *unique_id, int rank, const char *who)
{
	struct tl_conn c;
	struct tl_reply r;
	double t0;

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, device)), "connect");
	t0 = tl_now();
	init(&c, unique_id, rank, 20000);
	ASSERT_EQ(tl_recv(&c, &r, tl_timeout(30)), 0, "%s: no reply to Init", who);
	tl_log("%s's Init of rank %d on device %d: %s after %.0f ms", who, rank, device, tl_reply_describe(&r),
	       (tl_now() - t0) * 1e3);
	ASSERT_REPLY_ERROR(&r, "io.regen.NotPermitted", "%s joined another uid's communicator", who);
	ASSERT(tl_reply_str(&r, "method") && strcmp(tl_reply_str(&r, "method"), "io.regen.Comm.Init") == 0, "%s",
	       tl_reply_describe(&r));
	ASSERT_DOUBLE_LT(tl_now() - t0, tl_timeout(1), "the refusal waited for the rendezvous");
	tl_reply_finish(&r);
	tl_conn_close(&c);
}

static void refused(const char *unique_id, int rank, const char *who)
{
	refused_on(0, unique_id, rank, who);
}

/* Init as rank `rank` on `device`, let in: its lone rank waits for the
 * others (on the host backend a communicator's ranks share one device)
 * until its deadline, CommTimeout, never NotPermitted. */
static void let_in_on(int device, const char *unique_id, int rank, const char *who)
{
	struct tl_conn c;
	struct tl_reply r;

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, device)), "connect");
	init(&c, unique_id, rank, 300);
	ASSERT_EQ(tl_recv(&c, &r, tl_timeout(30)), 0, "%s: no reply to Init", who);
	tl_log("%s's Init of rank %d on device %d: %s", who, rank, device, tl_reply_describe(&r));
	ASSERT_REPLY_ERROR(&r, "io.regen.CommTimeout", "%s's lone rank", who);
	tl_reply_finish(&r);
	tl_conn_close(&c);
}

/* One rank's buffer of COUNT floats, all `value`, imported. */
static void rank_buffer(struct tl_conn *c, struct tl_memfd *m, float value, char *id)
{
	struct tl_reply r;

	tl_memfd_create(m, COUNT * sizeof(float));
	for (int i = 0; i < COUNT; i++)
		((float *)m->ptr)[i] = value;
	ASSERT_EQ(tl_import_memfd(c, 0, m->fd, m->size, id, &r), 0, "import: %s", tl_reply_describe(&r));
	tl_reply_finish(&r);
}

static void all_reduce_send(struct tl_conn *c, const char *comm, const char *buf)
{
	ASSERT_EQ(tl_send(c, "io.regen.Comm.AllReduce", NULL, 0,
			  "{\"comm\":\"%s\",\"send\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d]},"
			  "\"recv\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[%d]}}",
			  comm, buf, COUNT, buf, COUNT),
		  0, "send AllReduce");
}

static void all_reduced(struct tl_conn *c, const struct tl_memfd *m, const char *who)
{
	struct tl_reply r;

	ASSERT_EQ(tl_recv(c, &r, tl_timeout(30)), 0, "%s: no reply to AllReduce", who);
	ASSERT_REPLY_OK(&r, "%s's AllReduce", who);
	tl_reply_finish(&r);
	/* 1 + 2, exactly in f32: the sum of root's two ranks and nothing else. */
	for (int i = 0; i < COUNT; i++)
		ASSERT(((const float *)m->ptr)[i] == 3.0f, "%s: element %d is %g, not 1 + 2", who, i,
		       (double)((const float *)m->ptr)[i]);
}

/* Rank 1 of root's communicator, in a second process. */
static int root_rank_1(void *arg)
{
	struct tl_conn c;
	struct tl_memfd m;
	char buf[64], comm[64];

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	rank_buffer(&c, &m, 2.0f, buf);
	init(&c, arg, 1, 20000);
	joined(&c, comm, sizeof(comm), "root's rank 1");
	all_reduce_send(&c, comm, buf);
	all_reduced(&c, &m, "root's rank 1");
	tl_conn_close(&c);
	tl_memfd_destroy(&m);
	return 0;
}

static int nobody_joins(void *arg)
{
	tl_become_nobody(0, false);
	refused(arg, 1, "uid nobody");
	return 0;
}

/* Root's rank 0 waits in Init; nobody is refused rank 1; root's rank 1
 * joins; both ranks' AllReduce sums 1 + 2. */
static void root_communicator(const char *unique_id, const char *what)
{
	struct tl_conn c;
	struct tl_reply r;
	struct tl_memfd m;
	char buf[64], comm[64];
	pid_t second;

	tl_log("%s", what);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	rank_buffer(&c, &m, 1.0f, buf);
	init(&c, unique_id, 0, 20000);
	/* Rank 0's Init is in the worker (a lane waits for rank 1) once a
	 * call on another connection is answered after it: give it a moment. */
	usleep(200000);
	ASSERT_EQ(tl_wait(tl_fork(nobody_joins, (void *)unique_id, 0), 30), 0, "uid nobody's Init");
	second = tl_fork(root_rank_1, (void *)unique_id, 0);
	joined(&c, comm, sizeof(comm), "root's rank 0");
	all_reduce_send(&c, comm, buf);
	all_reduced(&c, &m, "root's rank 0");
	ASSERT_EQ(tl_wait(second, 30), 0, "root's rank 1");
	tl_call_ok(&c, &r, "io.regen.Comm.Destroy", "{\"comm\":\"%s\"}", comm);
	tl_reply_finish(&r);
	tl_conn_close(&c);
	tl_memfd_destroy(&m);
}

/* uid nobody's own communicator: root may not join it either. */
static int nobody_rank_0(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	char unique_id[300];
	int *to_root = arg;

	tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	tl_call_ok(&c, &r, "io.regen.Comm.GetUniqueId", NULL);
	snprintf(unique_id, sizeof(unique_id), "%s", tl_reply_str(&r, "unique_id"));
	tl_reply_finish(&r);
	init(&c, unique_id, 0, 3000);
	ASSERT_EQ(write(to_root[1], unique_id, strlen(unique_id) + 1), (ssize_t)strlen(unique_id) + 1, "hand the id");
	/* Root's refusal comes first; then the deadline ends this Init. */
	ASSERT_EQ(tl_recv(&c, &r, tl_timeout(60)), 0, "no reply to nobody's Init");
	ASSERT_REPLY_ERROR(&r, "io.regen.CommTimeout", "nobody's lone rank 0");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

static int nobody_unique_id_on_device_1(void *arg)
{
	struct tl_conn c;
	struct tl_reply r;
	const char *id;
	int *to_root = arg;

	tl_become_nobody(0, false);
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 1)), "connect");
	tl_call_ok(&c, &r, "io.regen.Comm.GetUniqueId", NULL);
	id = tl_reply_str(&r, "unique_id");
	ASSERT_EQ(write(to_root[1], id, strlen(id) + 1), (ssize_t)strlen(id) + 1, "hand the id");
	tl_reply_finish(&r);
	tl_conn_close(&c);
	return 0;
}

static int nobody_joins_on_device_1(void *arg)
{
	tl_become_nobody(0, false);
	refused_on(1, arg, 1, "uid nobody");
	return 0;
}

/* A unique id is one uid's on every device: the worker that made it or
 * saw the first join is not the only one that knows. */
static void across_devices(void)
{
	struct tl_conn c;
	struct tl_reply r;
	char unique_id[300];
	int pipefd[2];
	pid_t nobody;

	tl_log("root's id from device 0's worker, joined with on device 1");
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	tl_call_ok(&c, &r, "io.regen.Comm.GetUniqueId", NULL);
	snprintf(unique_id, sizeof(unique_id), "%s", tl_reply_str(&r, "unique_id"));
	tl_reply_finish(&r);
	tl_conn_close(&c);
	ASSERT_EQ(tl_wait(tl_fork(nobody_joins_on_device_1, unique_id, 0), 30), 0, "uid nobody's Init on device 1");
	let_in_on(1, unique_id, 1, "root");

	tl_log("an id made elsewhere, root first to join with it on device 0, then on device 1");
	for (int i = 0; i < 256; i++)
		unique_id[i] = "0123456789abcdef"[rand() % 16];
	unique_id[256] = '\0';
	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	init(&c, unique_id, 0, 3000);
	usleep(200000);
	ASSERT_EQ(tl_wait(tl_fork(nobody_joins_on_device_1, unique_id, 0), 30), 0, "uid nobody's Init on device 1");
	ASSERT_EQ(tl_recv(&c, &r, tl_timeout(60)), 0, "no reply to root's Init");
	ASSERT_REPLY_ERROR(&r, "io.regen.CommTimeout", "root's lone rank 0");
	tl_reply_finish(&r);
	tl_conn_close(&c);

	tl_log("nobody's id from device 1's worker, joined with by root on device 0");
	ASSERT_EQ(pipe(pipefd), 0, "pipe");
	nobody = tl_fork(nobody_unique_id_on_device_1, pipefd, 0);
	ASSERT(read(pipefd[0], unique_id, sizeof(unique_id)) > 256, "nobody's id");
	ASSERT_EQ(tl_wait(nobody, 30), 0, "uid nobody's GetUniqueId");
	refused_on(0, unique_id, 1, "root");
	close(pipefd[0]);
	close(pipefd[1]);
}

int main(void)
{
	static const char *const extra[] = { "--socket-mode", "0666", NULL };
	struct tl_conn c;
	struct tl_reply r;
	char unique_id[300];
	int pipefd[2];
	pid_t nobody;

	tl_init(180);
	if (geteuid() != 0)
		tl_skip("needs root, to call as a second uid");
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .extra = extra });

	ASSERT_OK(tl_conn_open(&c, tl_daemon_worker_socket(&daemon_, 0)), "connect");
	tl_call_ok(&c, &r, "io.regen.Comm.GetUniqueId", NULL);
	snprintf(unique_id, sizeof(unique_id), "%s", tl_reply_str(&r, "unique_id"));
	tl_reply_finish(&r);
	tl_conn_close(&c);
	root_communicator(unique_id, "a unique id device 0's worker made for root");

	for (int i = 0; i < 256; i++)
		unique_id[i] = "0123456789abcdef"[rand() % 16];
	unique_id[256] = '\0';
	root_communicator(unique_id, "a unique id made elsewhere, root's rank 0 first to join with it");

	ASSERT_EQ(pipe(pipefd), 0, "pipe");
	nobody = tl_fork(nobody_rank_0, pipefd, 0);
	ASSERT(read(pipefd[0], unique_id, sizeof(unique_id)) > 256, "nobody's id");
	usleep(200000);
	refused(unique_id, 1, "root");
	ASSERT_EQ(tl_wait(nobody, 60), 0, "uid nobody's rank 0");
	across_devices();
	tl_log("PASS");
	return 0;
}
