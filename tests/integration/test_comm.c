/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's communicators (regen_comm_*) against a real regend on the host
 * backend: two ranks (two clients on two threads, rank r on device r's
 * worker) join, reduce, gather, broadcast, exchange blocks (AllToAll),
 * send and receive, and take the integer minimum, with results checked; Init without its peer times out by name;
 * an abort ends a call in flight; a restart makes the ids stale and Init
 * works again; a keyed communicator is re-attached by a later process. The
 * host backend's communicators test the control plane, not the GPU path. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/lib/client.h"

#define N 64

static struct tl_daemon daemon_;
static unsigned char uid[REGEN_COMM_UNIQUE_ID_BYTES];

static struct regen_tensor vec(struct tl_buffer *b, uint64_t offset, int64_t n)
{
	return (struct regen_tensor){ .buffer = b->buf, .offset = offset, .dtype = REGEN_F32, .rank = 1, .shape = { n } };
}

static struct regen_tensor vec_i64(struct tl_buffer *b, uint64_t offset, int64_t n)
{
	return (struct regen_tensor){ .buffer = b->buf, .offset = offset, .dtype = REGEN_I64, .rank = 1, .shape = { n } };
}

struct rank {
	int r;
	int result;                 /* 0: all checks passed */
	char why[256];
};

static void *rank_main(void *arg)
{
	struct rank *rk = arg;
	regen_client *c = tl_client_connect(&daemon_);
	struct regen_comm_init_args ia = { .device = rk->r, .unique_id = uid, .rank = (uint32_t)rk->r, .nranks = 2,
					   .deadline_ms = 20000 };
	regen_comm *comm = NULL;
	struct tl_buffer b;
	float *f;

	rk->result = -1;
	tl_buffer_create(c, rk->r, 4 * N * 4, &b);
	f = (float *)b.mem.ptr;
	if (regen_comm_init(c, &ia, &comm) < 0) {
		snprintf(rk->why, sizeof(rk->why), "init: %s", regen_client_error_message(c));
		goto out;
	}
	for (int i = 0; i < N; i++)
		f[i] = (float)(i + 100 * rk->r);
	struct regen_collective_args a = { .comm = comm, .send = vec(&b, 0, N), .recv = vec(&b, N * 4, N) };
	if (regen_comm_all_reduce(c, &a) < 0) {
		snprintf(rk->why, sizeof(rk->why), "all_reduce: %s", regen_client_error_message(c));
		goto out;
	}
	for (int i = 0; i < N; i++) {
		if (f[N + i] != (float)(2 * i + 100)) {
			snprintf(rk->why, sizeof(rk->why), "all_reduce[%d] = %g, want %d", i, f[N + i], 2 * i + 100);
			goto out;
		}
	}
	/* Gather the first half of each rank's send into [2N/2 .. ]. */
	struct regen_collective_args g = { .comm = comm, .send = vec(&b, 0, N / 2), .recv = vec(&b, 2 * N * 4, N) };
	if (regen_comm_all_gather(c, &g) < 0) {
		snprintf(rk->why, sizeof(rk->why), "all_gather: %s", regen_client_error_message(c));
		goto out;
	}
	for (int i = 0; i < N; i++) {
		float want = (float)(i % (N / 2) + 100 * (i / (N / 2)));
		if (f[2 * N + i] != want) {
			snprintf(rk->why, sizeof(rk->why), "all_gather[%d] = %g, want %g", i, f[2 * N + i], want);
			goto out;
		}
	}
	struct regen_collective_args bc = { .comm = comm, .send = vec(&b, 0, N), .recv = vec(&b, 0, N), .root = 1 };
	if (regen_comm_broadcast(c, &bc) < 0) {
		snprintf(rk->why, sizeof(rk->why), "broadcast: %s", regen_client_error_message(c));
		goto out;
	}
	if (f[5] != 105.0f) {
		snprintf(rk->why, sizeof(rk->why), "broadcast[5] = %g, want 105", f[5]);
		goto out;
	}
	/* AllToAll: block k of recv is rank k's block r of its send. */
	for (int i = 0; i < N; i++)
		f[i] = (float)(i + 1000 * rk->r);
	struct regen_collective_args t = { .comm = comm, .send = vec(&b, 0, N), .recv = vec(&b, N * 4, N) };
	if (regen_comm_all_to_all(c, &t) < 0) {
		snprintf(rk->why, sizeof(rk->why), "all_to_all: %s", regen_client_error_message(c));
		goto out;
	}
	for (int i = 0; i < N; i++) {
		float want = (float)(rk->r * (N / 2) + i % (N / 2) + 1000 * (i / (N / 2)));
		if (f[N + i] != want) {
			snprintf(rk->why, sizeof(rk->why), "all_to_all[%d] = %g, want %g", i, f[N + i], want);
			goto out;
		}
	}
	/* Rank 0 sends its first 8 elements to rank 1. */
	struct regen_collective_args p = { .comm = comm, .send = vec(&b, 0, 8), .recv = vec(&b, 3 * N * 4, 8),
					   .peer = (uint32_t)(1 - rk->r) };
	if ((rk->r == 0 ? regen_comm_send(c, &p) : regen_comm_recv(c, &p)) < 0) {
		snprintf(rk->why, sizeof(rk->why), "send/recv: %s", regen_client_error_message(c));
		goto out;
	}
	if (rk->r == 1 && f[3 * N + 7] != 7.0f) {
		snprintf(rk->why, sizeof(rk->why), "recv[7] = %g, want 7", f[3 * N + 7]);
		goto out;
	}
	/* The integers' minimum, exact. */
	int64_t *q = (int64_t *)b.mem.ptr;
	for (int i = 0; i < 4; i++)
		q[i] = rk->r ? -(int64_t)i * 3000000000LL : (int64_t)i;
	struct regen_collective_args m = { .comm = comm, .send = vec_i64(&b, 0, 4), .recv = vec_i64(&b, 64, 4),
					   .op = REGEN_REDUCE_MIN };
	if (regen_comm_all_reduce(c, &m) < 0) {
		snprintf(rk->why, sizeof(rk->why), "all_reduce min i64: %s", regen_client_error_message(c));
		goto out;
	}
	if (q[8 + 3] != -9000000000LL) {
		snprintf(rk->why, sizeof(rk->why), "min[3] = %lld, want -9000000000", (long long)q[8 + 3]);
		goto out;
	}
	rk->result = 0;
out:
	regen_comm_destroy(comm, rk->result < 0, 0);
	tl_buffer_free(&b);
	regen_client_destroy(c);
	return NULL;
}

static int attach_child(void *arg)
{
	regen_client *c = tl_client_connect(&daemon_);
	unsigned char id[REGEN_COMM_UNIQUE_ID_BYTES];
	struct regen_comm_init_args ia = { .device = 0, .unique_id = id, .rank = 0, .nranks = 1, .key = arg };
	regen_comm *comm;
	struct tl_buffer b;

	ASSERT_REGEN_OK(c, regen_comm_unique_id(c, 0, id));
	ASSERT_REGEN_OK(c, regen_comm_init(c, &ia, &comm));
	tl_buffer_create(c, 0, 4 * N, &b);
	struct regen_collective_args a = { .comm = comm, .send = vec(&b, 0, N), .recv = vec(&b, 0, N) };
	ASSERT_REGEN_OK(c, regen_comm_all_reduce(c, &a));
	ASSERT_REGEN_OK(c, regen_comm_all_reduce(c, &a));
	/* Gone without a Destroy: the keyed communicator stays, detached. */
	_exit(0);
}

static regen_client *abort_client;
static regen_comm *abort_comm;
static struct tl_buffer abort_buf;
static int abort_result;

static void *abort_caller(void *arg)
{
	struct regen_collective_args a = { .comm = abort_comm, .send = vec(&abort_buf, 0, N), .recv = vec(&abort_buf, 0, N) };

	abort_result = regen_comm_all_reduce(abort_client, &a);
	return NULL;
}

static void *lonely_peer(void *arg)
{
	regen_client *c = tl_client_connect(&daemon_);
	struct regen_comm_init_args ia = { .device = 0, .unique_id = uid, .rank = 1, .nranks = 2 };
	regen_comm *comm = NULL;

	ASSERT_REGEN_OK(c, regen_comm_init(c, &ia, &comm));
	/* Joins, then never calls: kept open until the test ends. */
	*(regen_client **)arg = c;
	return comm;
}

int main(void)
{
	struct rank ranks[2] = { { .r = 0 }, { .r = 1 } };
	pthread_t t[2];
	regen_client *c;
	regen_comm *comm;
	char key[64];
	double t0;

	tl_init(110);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);

	/* Two ranks, results checked. */
	ASSERT_REGEN_OK(c, regen_comm_unique_id(c, 0, uid));
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, rank_main, &ranks[i]);
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		ASSERT_EQ(ranks[i].result, 0, "rank %d: %s", i, ranks[i].why);
	}
	tl_log("two ranks: all_reduce, all_gather, broadcast right");

	/* Init without its peer: CommTimeout after the deadline, device fine. */
	struct regen_comm_init_args ia = { .device = 0, .unique_id = uid, .rank = 0, .nranks = 2, .deadline_ms = 300 };
	ASSERT_REGEN_OK(c, regen_comm_unique_id(c, 0, uid));
	t0 = tl_now();
	ASSERT_REGEN_ERROR(c, regen_comm_init(c, &ia, &comm), REGEN_ERROR_COMM_TIMEOUT, "Init with no peer");
	ASSERT_DOUBLE_GE(tl_now() - t0, 0.29, "CommTimeout before the deadline");

	/* An abort ends a call in flight that waits for a peer. */
	regen_client *peer = NULL;
	pthread_t pt;
	void *peer_comm;
	ASSERT_REGEN_OK(c, regen_comm_unique_id(c, 0, uid));
	pthread_create(&pt, NULL, lonely_peer, &peer);
	abort_client = tl_client_connect(&daemon_);
	ia.deadline_ms = 20000;
	ASSERT_REGEN_OK(abort_client, regen_comm_init(abort_client, &ia, &abort_comm));
	pthread_join(pt, &peer_comm);
	tl_buffer_create(abort_client, 0, 4 * N, &abort_buf);
	pthread_create(&pt, NULL, abort_caller, NULL);
	usleep(300000);
	/* The comm is this process's: another of its connections may abort it. */
	regen_client *other = tl_client_connect(&daemon_);
	char params[128];
	snprintf(params, sizeof(params), "{\"comm\":\"%s\"}", regen_comm_id(abort_comm));
	ASSERT_REGEN_ERROR(other, regen_call(other, 0, "io.regen.Comm.Destroy", params, NULL, 0, NULL),
			   REGEN_ERROR_COMM_IN_FLIGHT, "Destroy with a call in flight");
	ASSERT_REGEN_OK(other, regen_call(other, 0, "io.regen.Comm.Abort", params, NULL, 0, NULL));
	pthread_join(pt, NULL);
	ASSERT_EQ(abort_result, -EREMOTE, "the call in flight after the abort");
	ASSERT_STR_EQ(regen_client_error_name(abort_client), REGEN_ERROR_COMM_FAILED, "%s",
		      regen_client_error_message(abort_client));
	ASSERT_REGEN_OK(abort_client, regen_comm_destroy(abort_comm, false, 0));
	regen_comm_destroy(peer_comm, true, 0);
	regen_client_destroy(peer);
	regen_client_destroy(other);

	/* Re-attach by key after the process that made it is gone. */
	snprintf(key, sizeof(key), "test-comm-%d/rank0", (int)getpid());
	ASSERT_EQ(tl_wait(tl_fork(attach_child, key, 30), 30), 0, "the child that made the communicator");
	comm = NULL;
	for (int i = 0; i < 100 && !comm; i++) {
		if (regen_comm_attach(c, 0, key, &comm) < 0) {
			ASSERT_STR_EQ(regen_client_error_name(c), REGEN_ERROR_NO_SUCH_OBJECT, "%s", regen_client_error_message(c));
			comm = NULL;
			usleep(50000);
		}
	}
	ASSERT_NOT_NULL(comm, "no detached communicator for %s", key);
	ASSERT_UINT_EQ(regen_comm_collectives(comm), 2, "collectives the first process ran");
	ASSERT_UINT_EQ(regen_comm_nranks(comm), 1, "nranks");
	struct tl_buffer b;
	tl_buffer_create(c, 0, 4 * N, &b);
	((float *)b.mem.ptr)[3] = 7.0f;
	struct regen_collective_args a = { .comm = comm, .send = vec(&b, 0, N), .recv = vec(&b, 0, N), .op = REGEN_REDUCE_MAX };
	ASSERT_REGEN_OK(c, regen_comm_all_reduce(c, &a));
	ASSERT_EQ((int)((float *)b.mem.ptr)[3], 7, "max over one rank");

	/* A restart ends it: the id is stale, Init works again. */
	uint64_t gen = regen_comm_generation(comm);
	regen_status *st;
	ASSERT_REGEN_OK(c, regen_restart(c, 0, "test_comm", 10000, &st));
	regen_status_free(st);
	tl_wait_generation(c, 0, gen, 20);
	ASSERT_REGEN_ERROR(c, regen_comm_all_reduce(c, &a), REGEN_ERROR_STALE_GENERATION, "a communicator of generation %llu",
			   (unsigned long long)gen);
	ASSERT_REGEN_ERROR(c, regen_comm_attach(c, 0, key, &comm), REGEN_ERROR_NO_SUCH_OBJECT, "attach after a restart");
	ASSERT_REGEN_OK(c, regen_comm_destroy(a.comm, false, 0));   /* stale: just freed */
	ASSERT_REGEN_OK(c, regen_comm_unique_id(c, 0, uid));
	ia = (struct regen_comm_init_args){ .device = 0, .unique_id = uid, .rank = 0, .nranks = 1 };
	ASSERT_REGEN_OK(c, regen_comm_init(c, &ia, &comm));
	ASSERT_UINT_GT(regen_comm_generation(comm), gen, "the new communicator's generation");
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &b));
	a.comm = comm;
	a.send = vec(&b, 0, N);
	a.recv = vec(&b, 0, N);
	ASSERT_REGEN_OK(c, regen_comm_all_reduce(c, &a));
	ASSERT_REGEN_OK(c, regen_comm_destroy(comm, false, 0));
	tl_buffer_free(&b);
	regen_client_destroy(c);
	tl_daemon_stop(&daemon_);
	tl_log("ok");
	return 0;
}
