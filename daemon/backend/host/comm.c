/* SPDX-License-Identifier: Apache-2.0 */
/* Communicators on the host backend: the ranks of one communicator are
 * connections to the workers of one regend (one rank per device, as NCCL's,
 * or several on one device), and the collectives run over the clients'
 * host memory, staged through the group's memory that the workers share
 * (comm_group.h). It exists so that the whole control plane of
 * io.regen.Comm (Init's rendezvous, deadlines, aborts in flight, a peer's
 * device reset or worker gone, generations, hostile input) and the clients
 * above it (regen.torch's process group) are tested without a GPU; it
 * proves nothing about NCCL or the GPU path.
 *
 * A rank's k-th collective meets the others' k-th (NCCL matches them by
 * order too), in steps: each rank copies its part of the step from its
 * send into its staging slot and posts what it is doing; the last to post
 * checks that they agree (kind, length, dtype, reduction, root; where NCCL
 * would hang or corrupt, the host fails the collective on every rank with
 * "mismatch"); then each rank computes its own output from every rank's
 * slot, and the step ends once all have read. Sums accumulate in double in
 * rank order and round once (integers: in their own width, wrapping), so
 * every rank's result is the same. A Send moves through the sender's p2p
 * slot to the one rank it names, chunk by chunk; its last chunk waits there
 * for the receiver while the sender goes on (NCCL's small sends return
 * early too). An abort, a rank that leaves, a peer's worker gone or a
 * failure wakes every waiter with the group's reason: a peer's loss is a
 * named error, not a hang.
 *
 * A rank's life is the CUDA backend's state machine (cuda/comm.c), so that
 * its rules are tested here: EMPTY until its Init joins, LIVE in its group,
 * ENDING while one thread takes it out of the group holding no lock others
 * take (the host's "ncclCommAbort" or "ncclCommDestroy"), ENDED. An abort
 * marks it at once (every later call, its calls in flight and its peers
 * fail with the reason, read without a lock) and hands the end to an
 * aborter thread; the loop and the lanes never wait for it; a reset ends it
 * inline; the backend's release and reset wait for the aborters still
 * running. REGEN_HOST_COMM_ABORT_MS (a test knob) makes each abort's end
 * take that long, as an ncclCommAbort whose peer is gone may, so that tests
 * can show that nothing else waits behind it. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include "daemon/backend/aborters.h"
#include "daemon/backend/host/comm_group.h"
#include "daemon/backend/host/common.h"
#include "daemon/backend/host/guard.h"
#include "daemon/backend/host/math.h"
#include "daemon/env.h"
#include "proto/comm.h"
#include "proto/errors.h"

/* The longest REGEN_HOST_COMM_ABORT_MS taken. */
#define ABORT_MS_MAX 60000

/* As cuda/comm.c's. */
enum comm_state { COMM_EMPTY, COMM_LIVE, COMM_ENDING, COMM_ENDED };

struct host_comm {
	struct rd_comm base;
	struct host_group *group;     /* set once, by its Init, under state_lock; held until freed */
	_Atomic int state;            /* enum comm_state; changed under state_lock */
	atomic_uint refs;             /* the core's (create to close), a running aborter's */
	atomic_bool aborted;
	atomic_bool abort_started;
	char why[96];                 /* the abort's, under state_lock */
	/* One call of this rank at a time moves data (two lanes of one
	 * process may call on it): its slots are the rank's. */
	pthread_mutex_t busy;
	uint64_t collectives;         /* begun, under busy: what a mismatch names */
};

/* States and groups of this worker's ranks; lock order: state_lock, then
 * a group's. */
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
/* The worker's aborters, joined once done by the next start or a quiesce. */
static struct rd_aborters aborters = RD_ABORTERS_INIT;

static struct host_comm *hc_of(struct rd_comm *c)
{
	return (struct host_comm *)c;
}

static unsigned abort_ms(void)
{
	/* Aborters read it at once: atomic, each would store the same. */
	static _Atomic int ms = -1;

	if (atomic_load(&ms) < 0)
		atomic_store(&ms, (int)rd_env_number(RD_ENV_HOST_COMM_ABORT_MS, 0, ABORT_MS_MAX, 0));
	return (unsigned)atomic_load(&ms);
}

static void set_failed(struct host_comm *hc, struct rp_error *err, const char *reason)
{
	char id[RP_ID_MAX];

	rp_error_clear(err);
	rp_err_comm_failed(err, rp_id_format(&hc->base.obj.id, id), reason, "communicator %s (rank %u of %u) failed: %s",
			   id, hc->base.rank, hc->base.nranks, reason);
}

/* Why this rank cannot go on, or NULL. No lock: neither reason changes
 * once set. */
static const char *broken(struct host_comm *hc)
{
	struct host_group *g = atomic_load(&hc->state) == COMM_EMPTY ? NULL : hc->group;

	if (atomic_load(&hc->aborted))
		return "aborted";
	return g ? host_group_failed(g) : NULL;
}

static void put(struct host_comm *hc)
{
	if (atomic_fetch_sub(&hc->refs, 1) == 1) {
		if (hc->group)
			host_group_put(hc->group);
		pthread_mutex_destroy(&hc->busy);
		free(hc);
	}
}

/* LIVE -> ENDING: this thread ends it (true). EMPTY -> ENDED: nothing to
 * end. Another thread's, or ended: false. */
static bool take(struct host_comm *hc)
{
	bool took = false;

	pthread_mutex_lock(&state_lock);
	switch (atomic_load(&hc->state)) {
	case COMM_EMPTY:
		atomic_store(&hc->state, COMM_ENDED);
		break;
	case COMM_LIVE:
		atomic_store(&hc->state, COMM_ENDING);
		took = true;
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&state_lock);
	return took;
}

/* Ends the rank on this thread, holding no lock while it takes long (an
 * abort's REGEN_HOST_COMM_ABORT_MS), then publishes it. Peers still in
 * the group fail their later collectives instead of waiting for it. */
static void end_now(struct host_comm *hc, bool abort)
{
	char why[sizeof(hc->why) + 32];

	if (!take(hc))
		return;
	if (abort && abort_ms()) {
		struct timespec ts = { abort_ms() / 1000, (long)(abort_ms() % 1000) * 1000000 };

		nanosleep(&ts, NULL);
	}
	pthread_mutex_lock(&state_lock);
	if (abort)
		snprintf(why, sizeof(why), "was aborted (%s)", hc->why[0] ? hc->why : "aborted");
	else
		snprintf(why, sizeof(why), "destroyed its communicator");
	pthread_mutex_unlock(&state_lock);
	host_group_lock(hc->group);
	host_group_leave_locked(hc->group, hc->base.rank, why);
	host_group_unlock(hc->group);
	pthread_mutex_lock(&state_lock);
	atomic_store(&hc->state, COMM_ENDED);
	pthread_mutex_unlock(&state_lock);
}

/* An aborter's work, holding the reference start_abort took. */
static void end_and_put(void *arg)
{
	struct host_comm *hc = arg;

	end_now(hc, true);
	put(hc);
}

/* With state_lock: marks the rank aborted and fails its group (its calls in
 * flight and its peers' wake with the reason now). */
static void mark_aborted_locked(struct host_comm *hc, const char *why, const char *group_reason)
{
	if (!atomic_load(&hc->aborted))
		snprintf(hc->why, sizeof(hc->why), "%s", why);
	atomic_store(&hc->aborted, true);
	if (atomic_load(&hc->state) == COMM_LIVE) {
		host_group_lock(hc->group);
		host_group_fail_locked(hc->group, "rank %u %s", hc->base.rank, group_reason);
		host_group_unlock(hc->group);
	}
}

/* Marks the rank aborted, then hands its end to an aborter thread, once.
 * Any thread, no lock held; never waits for the end. */
static void start_abort(struct host_comm *hc, const char *why)
{
	char reason[sizeof(hc->why) + 32];

	pthread_mutex_lock(&state_lock);
	snprintf(reason, sizeof(reason), "was aborted (%s)", atomic_load(&hc->aborted) ? hc->why : why);
	mark_aborted_locked(hc, why, reason);
	pthread_mutex_unlock(&state_lock);
	if (atomic_load(&hc->state) == COMM_ENDED || atomic_exchange(&hc->abort_started, true))
		return;
	rd_aborters_reap(&aborters, false);
	atomic_fetch_add(&hc->refs, 1);
	/* With no thread to be had this one ends it, holding no lock. */
	rd_aborters_run(&aborters, end_and_put, hc);
}

void host_comm_quiesce(void)
{
	rd_aborters_reap(&aborters, true);
}

/* ---- The resource ---- */

static int comm_res_init(struct rd_resource *res)
{
	return 0;
}

/* CUDA usable (a release, a close): a host "finalize" is local. One that
 * was aborted is its aborter's to end. */
static void comm_res_release(struct rd_resource *res)
{
	struct host_comm *hc = (struct host_comm *)res;

	if (atomic_load(&hc->aborted))
		start_abort(hc, "released");
	else
		end_now(hc, false);
}

/* The context is lost (a reset): abort, here (the reset waits for it). */
static void comm_res_invalidate(struct rd_resource *res)
{
	struct host_comm *hc = (struct host_comm *)res;

	pthread_mutex_lock(&state_lock);
	mark_aborted_locked(hc, "a reset of its device", "was aborted by a reset of its device");
	pthread_mutex_unlock(&state_lock);
	end_now(hc, true);
}

static const struct rd_resource_ops comm_ops = {
	.kind = "host_comm", .init = comm_res_init, .release = comm_res_release, .invalidate = comm_res_invalidate,
};

/* ---- The ops table's part ---- */

int host_comm_unique_id(struct rd_device *dev, unsigned char id[RP_COMM_ID_SIZE], struct rp_error *err)
{
	if (getrandom(id, RP_COMM_ID_SIZE, 0) != RP_COMM_ID_SIZE) {
		rp_err_backend_error(err, dev->index, "getrandom: %s", strerror(errno));
		return -EIO;
	}
	return 0;
}

int host_comm_create(struct rd_device *dev, const unsigned char id[RP_COMM_ID_SIZE], uint32_t rank, uint32_t nranks,
		     struct rd_comm **out, struct rp_error *err)
{
	struct host_comm *hc = calloc(1, sizeof(*hc));

	if (!hc) {
		rp_err_out_of_memory(err, dev->index, "no memory for a communicator");
		return -ENOMEM;
	}
	hc->base.device = dev;
	hc->base.rank = rank;
	hc->base.nranks = nranks;
	atomic_init(&hc->state, COMM_EMPTY);
	atomic_init(&hc->refs, 1);
	pthread_mutex_init(&hc->busy, NULL);
	rd_resource_register(&dev->registry, &hc->base.res, &comm_ops);
	rd_resource_ensure_valid(&hc->base.res);
	*out = &hc->base;
	return 0;
}

void host_comm_abort(struct rd_comm *comm, const char *why)
{
	start_abort(hc_of(comm), why);
}

int host_comm_status(struct rd_comm *comm, struct rp_error *err)
{
	struct host_comm *hc = hc_of(comm);
	const char *why = broken(hc);
	int state = atomic_load(&hc->state);

	if (!why && (state == COMM_ENDING || state == COMM_ENDED))
		why = "destroyed";
	if (!why)
		return 0;
	set_failed(hc, err, why);
	return -EIO;
}

void host_comm_close(struct rd_comm *comm)
{
	if (!comm)
		return;
	/* Released (left) when still valid; anything left of it goes to an
	 * aborter, and the last holder frees it. */
	rd_resource_unregister(&comm->res);
	if (atomic_load(&hc_of(comm)->state) != COMM_ENDED)
		start_abort(hc_of(comm), "closed its communicator");
	put(hc_of(comm));
}

/* ---- Init ---- */

static bool all_joined(struct host_group *g, void *arg)
{
	return g->shm->joined == g->shm->nranks;
}

/* Init: joins the group, then waits for every rank (or an abort). */
static void join(struct host_comm *hc, struct rd_op *op)
{
	const struct rp_comm_call *cc = &op->compute.comm;
	struct host_group *g;
	char reason[HOST_GROUP_REASON_MAX];
	int r;

	if (atomic_load(&hc->aborted) || atomic_load(&hc->state) != COMM_EMPTY) {
		set_failed(hc, &op->err, "aborted");
		return;
	}
	if (host_group_get(cc->unique_id, cc->nranks, &g, reason, sizeof(reason)) < 0) {
		set_failed(hc, &op->err, reason);
		return;
	}
	pthread_mutex_lock(&state_lock);
	if (atomic_load(&hc->aborted) || atomic_load(&hc->state) != COMM_EMPTY) {
		pthread_mutex_unlock(&state_lock);
		host_group_put(g);
		set_failed(hc, &op->err, "aborted");
		return;
	}
	host_group_lock(g);
	if (host_group_join_locked(g, cc->rank, cc->nranks, reason, sizeof(reason)) < 0) {
		host_group_unlock(g);
		pthread_mutex_unlock(&state_lock);
		host_group_put(g);
		set_failed(hc, &op->err, reason);
		return;
	}
	/* The rank's reference from here to its free. */
	hc->group = g;
	atomic_store(&hc->state, COMM_LIVE);
	pthread_mutex_unlock(&state_lock);
	r = host_group_wait_locked(g, all_joined, NULL);
	if (r < 0 || atomic_load(&hc->aborted))
		snprintf(reason, sizeof(reason), "%s", broken(hc) ? broken(hc) : "aborted");
	host_group_unlock(g);
	if (r < 0 || atomic_load(&hc->aborted))
		set_failed(hc, &op->err, reason);
}

/* ---- Values ---- */

static double load_float(enum rp_dtype dt, const char *p, size_t i)
{
	switch (dt) {
	case RP_DTYPE_F16:
		return rd_f16_to_f32(((const uint16_t *)p)[i]);
	case RP_DTYPE_BF16:
		return rd_bf16_to_f32(((const uint16_t *)p)[i]);
	case RP_DTYPE_F64:
		return ((const double *)p)[i];
	default:
		return ((const float *)p)[i];
	}
}

static void store_float(enum rp_dtype dt, char *p, size_t i, double v)
{
	switch (dt) {
	case RP_DTYPE_F16:
		((uint16_t *)p)[i] = rd_f32_to_f16((float)v);
		break;
	case RP_DTYPE_BF16:
		((uint16_t *)p)[i] = rd_f32_to_bf16((float)v);
		break;
	case RP_DTYPE_F64:
		((double *)p)[i] = v;
		break;
	default:
		((float *)p)[i] = (float)v;
		break;
	}
}

static int64_t load_int(enum rp_dtype dt, const char *p, size_t i)
{
	switch (dt) {
	case RP_DTYPE_I32:
		return ((const int32_t *)p)[i];
	case RP_DTYPE_U8:
		return ((const uint8_t *)p)[i];
	default:
		return ((const int64_t *)p)[i];
	}
}

static void store_int(enum rp_dtype dt, char *p, size_t i, int64_t v)
{
	switch (dt) {
	case RP_DTYPE_I32:
		((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v;
		break;
	case RP_DTYPE_U8:
		((uint8_t *)p)[i] = (uint8_t)(uint64_t)v;
		break;
	default:
		((int64_t *)p)[i] = v;
		break;
	}
}

static double combine_float(enum rp_reduce_op op, double v, double x)
{
	switch (op) {
	case RP_REDUCE_MAX:
		return x > v || v != v ? x : v;
	case RP_REDUCE_MIN:
		return x < v || v != v ? x : v;
	case RP_REDUCE_PROD:
		return v * x;
	default:
		return v + x;
	}
}

/* Wrapping, as the integer's own width would (the store truncates). */
static int64_t combine_int(enum rp_reduce_op op, int64_t v, int64_t x)
{
	switch (op) {
	case RP_REDUCE_MAX:
		return x > v ? x : v;
	case RP_REDUCE_MIN:
		return x < v ? x : v;
	case RP_REDUCE_PROD:
		return (int64_t)((uint64_t)v * (uint64_t)x);
	default:
		return (int64_t)((uint64_t)v + (uint64_t)x);
	}
}

/* ---- Collectives, step by step ---- */

/* How a collective moves through the slots. A step stages `width`
 * elements of `blocks` of the send's blocks (ReduceScatter, AllToAll:
 * nranks blocks of `n`; the others: one block, the whole send). */
struct plan {
	enum rp_comm_kind kind;
	enum rp_dtype dtype;
	enum rp_reduce_op op;
	size_t es;
	uint64_t n;                  /* elements per block */
	uint32_t nranks, rank, root;
	bool blocked;
	uint64_t block_step, width;  /* blocks and elements per step */
	uint64_t jsteps, steps;
	/* The step in progress. */
	uint64_t b0, b1, j0, w;
	char *send, *recv;
	struct host_group *g;
};

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
	return (a + b - 1) / b;
}

static void plan_make(struct plan *p, struct host_comm *hc, const struct rd_op *op, struct host_group *g)
{
	const struct rp_compute *c = &op->compute;
	uint64_t slot_elems;

	memset(p, 0, sizeof(*p));
	p->kind = c->comm.kind;
	p->dtype = c->operands[RP_COMM_SEND].dtype;
	p->op = c->comm.op;
	p->es = rp_dtype_size(p->dtype);
	p->nranks = hc->base.nranks;
	p->rank = hc->base.rank;
	p->root = c->comm.root;
	p->g = g;
	p->send = (char *)op->buffers[RP_COMM_SEND]->ptr + c->operands[RP_COMM_SEND].offset;
	p->recv = (char *)op->buffers[RP_COMM_RECV]->ptr + c->operands[RP_COMM_RECV].offset;
	slot_elems = g->shm->slot_bytes / p->es;
	p->blocked = p->kind == RP_COMM_REDUCE_SCATTER || p->kind == RP_COMM_ALL_TO_ALL;
	p->n = (uint64_t)rp_comm_count(c);
	if (p->kind == RP_COMM_ALL_TO_ALL)
		p->n /= p->nranks;
	if (p->blocked) {
		p->block_step = p->nranks < slot_elems ? p->nranks : slot_elems;
		p->width = slot_elems / p->nranks ? slot_elems / p->nranks : 1;
	} else {
		p->block_step = 1;
		p->width = slot_elems;
	}
	/* At least one step: a collective of nothing still meets its peers'. */
	p->jsteps = p->n ? ceil_div(p->n, p->width) : 1;
	p->steps = p->jsteps * (p->blocked ? ceil_div(p->nranks, p->block_step) : 1);
}

static void plan_step(struct plan *p, uint64_t s)
{
	uint64_t bs = s / p->jsteps, js = s % p->jsteps;

	p->b0 = p->blocked ? bs * p->block_step : 0;
	p->b1 = p->blocked ? p->b0 + p->block_step : 1;
	if (p->b1 > (p->blocked ? p->nranks : 1))
		p->b1 = p->blocked ? p->nranks : 1;
	p->j0 = js * p->width;
	p->w = p->n > p->j0 ? p->n - p->j0 : 0;
	if (p->w > p->width)
		p->w = p->width;
}

/* This rank's part of the step, from its send into its slot. Guarded. */
static int stage(void *arg)
{
	struct plan *p = arg;
	char *slot = host_group_slot(p->g, p->rank);
	size_t es = p->es;

	switch (p->kind) {
	case RP_COMM_BROADCAST:
		if (p->rank == p->root)
			memcpy(slot, p->send + p->j0 * es, p->w * es);
		break;
	case RP_COMM_REDUCE_SCATTER:
	case RP_COMM_ALL_TO_ALL:
		for (uint64_t b = p->b0; b < p->b1; b++)
			memcpy(slot + (b - p->b0) * p->w * es, p->send + (b * p->n + p->j0) * es, p->w * es);
		break;
	default:
		memcpy(slot, p->send + p->j0 * es, p->w * es);
		break;
	}
	return 0;
}

/* recv[j0 + i] = element `at + i` reduced over every rank's slot. */
static void reduce_to(struct plan *p, uint64_t at)
{
	for (uint64_t i = 0; i < p->w; i++) {
		if (rp_dtype_is_float(p->dtype)) {
			double v = load_float(p->dtype, host_group_slot(p->g, 0), at + i);

			for (uint32_t k = 1; k < p->nranks; k++)
				v = combine_float(p->op, v, load_float(p->dtype, host_group_slot(p->g, k), at + i));
			if (p->op == RP_REDUCE_AVG)
				v /= p->nranks;
			store_float(p->dtype, p->recv, p->j0 + i, v);
		} else {
			int64_t v = load_int(p->dtype, host_group_slot(p->g, 0), at + i);

			for (uint32_t k = 1; k < p->nranks; k++)
				v = combine_int(p->op, v, load_int(p->dtype, host_group_slot(p->g, k), at + i));
			store_int(p->dtype, p->recv, p->j0 + i, v);
		}
	}
}

/* This rank's output of the step, from every rank's slot. Guarded. */
static int gather(void *arg)
{
	struct plan *p = arg;
	size_t es = p->es;
	bool mine = p->rank >= p->b0 && p->rank < p->b1;

	switch (p->kind) {
	case RP_COMM_ALL_REDUCE:
		reduce_to(p, 0);
		break;
	case RP_COMM_BROADCAST:
		memmove(p->recv + p->j0 * es, host_group_slot(p->g, p->root), p->w * es);
		break;
	case RP_COMM_ALL_GATHER:
		for (uint32_t k = 0; k < p->nranks; k++)
			memcpy(p->recv + (k * p->n + p->j0) * es, host_group_slot(p->g, k), p->w * es);
		break;
	case RP_COMM_REDUCE_SCATTER:
		if (mine)
			reduce_to(p, (p->rank - p->b0) * p->w);
		break;
	case RP_COMM_ALL_TO_ALL:
		for (uint32_t k = 0; mine && k < p->nranks; k++)
			memcpy(p->recv + (k * p->n + p->j0) * es,
			       host_group_slot(p->g, k) + (p->rank - p->b0) * p->w * es, p->w * es);
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

static const char *kind_name(uint32_t kind)
{
	const struct rp_op_spec *spec = rp_comm_op_get((enum rp_comm_kind)kind);

	return spec ? spec->name : "?";
}

/* With the lock, the last rank in: whether every rank posted the same
 * step of the same call; the group fails when they do not. */
static bool agree_locked(struct host_group *g)
{
	const struct host_group_post *p0 = &g->shm->ranks[0].post;

	for (uint32_t k = 1; k < g->shm->nranks; k++) {
		const struct host_group_post *p = &g->shm->ranks[k].post;

		if (p->kind != p0->kind || p->count != p0->count || p->dtype != p0->dtype || p->op != p0->op ||
		    p->root != p0->root || p->part != p0->part) {
			host_group_fail_locked(g,
					       "mismatch: collective %llu is %s of %llu %s (%s, root %u) on rank 0 but "
					       "%s of %llu %s (%s, root %u) on rank %u",
					       (unsigned long long)p0->call, kind_name(p0->kind),
					       (unsigned long long)p0->count, rp_dtype_name((enum rp_dtype)p0->dtype),
					       rp_reduce_op_name((enum rp_reduce_op)p0->op), p0->root, kind_name(p->kind),
					       (unsigned long long)p->count, rp_dtype_name((enum rp_dtype)p->dtype),
					       rp_reduce_op_name((enum rp_reduce_op)p->op), p->root, k);
			return false;
		}
	}
	return true;
}

/* With the lock: the group fails when a rank the call needs has left
 * (destroyed its communicator): nothing will come from it. */
static bool fail_if_left_locked(struct host_group *g, int rank)
{
	if (rank < 0 || g->shm->ranks[rank].present)
		return false;
	host_group_fail_locked(g, "rank %d destroyed its communicator", rank);
	return true;
}

static bool arrivals_past(struct host_group *g, void *arg)
{
	return g->shm->arrivals_done > *(uint64_t *)arg || fail_if_left_locked(g, host_group_absent_locked(g));
}

static bool steps_past(struct host_group *g, void *arg)
{
	return g->shm->steps > *(uint64_t *)arg || fail_if_left_locked(g, host_group_absent_locked(g));
}

/* Posts this rank's step and waits until every rank has; *step is the
 * group's step number. 0 or -EIO (failed). */
static int arrive(struct host_group *g, uint32_t rank, const struct host_group_post *post, uint64_t *step)
{
	struct host_group_shm *shm = g->shm;
	int r = -EIO;

	host_group_lock(g);
	if (!fail_if_left_locked(g, host_group_absent_locked(g)) && !host_group_failed(g)) {
		*step = shm->steps;
		shm->ranks[rank].post = *post;
		if (++shm->arrived == shm->nranks && agree_locked(g)) {
			shm->arrivals_done = *step + 1;
			host_group_wake_locked(g);
		}
		r = host_group_wait_locked(g, arrivals_past, step);
		if (r == 0 && host_group_failed(g))
			r = -EIO;
	}
	host_group_unlock(g);
	return r;
}

/* This rank has read every slot it needs: once all have, the slots are
 * free for the next step. */
static int depart(struct host_group *g, uint64_t step)
{
	struct host_group_shm *shm = g->shm;
	int r;

	host_group_lock(g);
	if (++shm->departed == shm->nranks) {
		shm->arrived = 0;
		shm->departed = 0;
		shm->steps = step + 1;
		host_group_wake_locked(g);
	}
	r = host_group_wait_locked(g, steps_past, &step);
	if (r == 0 && host_group_failed(g))
		r = -EIO;
	host_group_unlock(g);
	return r;
}

/* Runs fn under the SIGBUS guard; a fault fails the group (it names
 * whose memory went away). */
static int guarded(struct host_group *g, int (*fn)(void *arg), void *arg)
{
	uintptr_t fault = 0;
	int r = rd_host_guarded(fn, arg, &fault);

	if (r == -EFAULT) {
		bool ours = fault >= (uintptr_t)g->shm && fault < (uintptr_t)g->shm + g->map_bytes;

		host_group_lock(g);
		host_group_fail_locked(g, "%s",
				       ours ? "no room for the communicator's shared memory (the filesystem of regend's "
					      "socket directory is full)"
					    : "a rank's buffer is no longer backed by its file (truncated)");
		host_group_unlock(g);
	}
	return r;
}

static int run_collective(struct host_comm *hc, struct host_group *g, struct rd_op *op)
{
	struct plan p;
	struct host_group_post post;

	plan_make(&p, hc, op, g);
	post = (struct host_group_post){
		.kind = p.kind, .dtype = p.dtype, .op = p.op, .root = p.root,
		.count = (uint64_t)rp_comm_count(&op->compute), .call = hc->collectives++,
	};
	for (uint64_t s = 0; s < p.steps; s++) {
		uint64_t step;

		plan_step(&p, s);
		post.part = s;
		if (guarded(g, stage, &p) < 0 || arrive(g, p.rank, &post, &step) < 0 || guarded(g, gather, &p) < 0 ||
		    depart(g, step) < 0)
			return -EIO;
	}
	return 0;
}

/* ---- Send and Recv ---- */

struct p2p {
	struct host_group *g;
	uint32_t rank, peer;
	enum rp_dtype dtype;
	uint64_t count, total, off, bytes;
	char *data;
};

/* This rank's channel is free: its last chunk taken (or its receiver
 * left, which fails the group: nobody will take it). */
static bool channel_idle(struct host_group *g, void *arg)
{
	const struct host_group_p2p *ch = &g->shm->ranks[*(uint32_t *)arg].p2p;

	return ch->state == HOST_P2P_IDLE || fail_if_left_locked(g, (int)ch->dst);
}

static bool chunk_for_me(struct host_group *g, void *arg)
{
	const struct p2p *m = arg;
	const struct host_group_p2p *ch = &g->shm->ranks[m->peer].p2p;

	return (ch->state == HOST_P2P_POSTED && ch->dst == m->rank) || fail_if_left_locked(g, (int)m->peer);
}

static int copy_out(void *arg)
{
	struct p2p *m = arg;

	memcpy(host_group_p2p_slot(m->g, m->rank), m->data + m->off, m->bytes);
	return 0;
}

static int copy_in(void *arg)
{
	struct p2p *m = arg;

	memcpy(m->data + m->off, host_group_p2p_slot(m->g, m->peer), m->bytes);
	return 0;
}

/* Chunk by chunk through this rank's p2p slot; the last chunk is left for
 * the receiver to take (the next Send waits for it). */
static int run_send(struct host_comm *hc, struct host_group *g, struct rd_op *op)
{
	const struct rp_compute *c = &op->compute;
	struct p2p m = {
		.g = g, .rank = hc->base.rank, .peer = c->comm.peer, .dtype = c->operands[RP_COMM_PEER_BUF].dtype,
		.count = (uint64_t)rp_comm_count(c),
		.data = (char *)op->buffers[RP_COMM_PEER_BUF]->ptr + c->operands[RP_COMM_PEER_BUF].offset,
	};
	uint64_t cap = g->shm->slot_bytes;
	int r;

	m.total = m.count * rp_dtype_size(m.dtype);
	do {
		m.bytes = m.total - m.off < cap ? m.total - m.off : cap;
		host_group_lock(g);
		r = host_group_wait_locked(g, channel_idle, &m.rank);
		if (r == 0 && (host_group_failed(g) || fail_if_left_locked(g, (int)m.peer)))
			r = -EIO;
		host_group_unlock(g);
		if (r < 0 || guarded(g, copy_out, &m) < 0)
			return -EIO;
		host_group_lock(g);
		g->shm->ranks[m.rank].p2p = (struct host_group_p2p){
			.state = HOST_P2P_POSTED, .dst = m.peer, .dtype = m.dtype, .count = m.count, .offset = m.off,
			.bytes = m.bytes,
		};
		host_group_wake_locked(g);
		host_group_unlock(g);
		m.off += m.bytes;
	} while (m.off < m.total);
	return 0;
}

static int run_recv(struct host_comm *hc, struct host_group *g, struct rd_op *op)
{
	const struct rp_compute *c = &op->compute;
	struct p2p m = {
		.g = g, .rank = hc->base.rank, .peer = c->comm.peer, .dtype = c->operands[RP_COMM_PEER_BUF].dtype,
		.count = (uint64_t)rp_comm_count(c),
		.data = (char *)op->buffers[RP_COMM_PEER_BUF]->ptr + c->operands[RP_COMM_PEER_BUF].offset,
	};
	const struct host_group_p2p *ch = &g->shm->ranks[m.peer].p2p;
	int r;

	m.total = m.count * rp_dtype_size(m.dtype);
	do {
		host_group_lock(g);
		r = host_group_wait_locked(g, chunk_for_me, &m);
		if (r == 0 && !(ch->state == HOST_P2P_POSTED && ch->dst == m.rank))
			r = -EIO;
		if (r == 0 && (ch->dtype != m.dtype || ch->count != m.count || ch->offset != m.off)) {
			host_group_fail_locked(g, "mismatch: rank %u sends %llu %s to rank %u, which receives %llu %s",
					       m.peer, (unsigned long long)ch->count, rp_dtype_name((enum rp_dtype)ch->dtype),
					       m.rank, (unsigned long long)m.count, rp_dtype_name(m.dtype));
			r = -EIO;
		}
		m.bytes = ch->bytes;
		host_group_unlock(g);
		if (r < 0 || guarded(g, copy_in, &m) < 0)
			return -EIO;
		host_group_lock(g);
		g->shm->ranks[m.peer].p2p.state = HOST_P2P_IDLE;
		host_group_wake_locked(g);
		host_group_unlock(g);
		m.off += m.bytes;
	} while (m.off < m.total);
	return 0;
}

/* ---- Work on a lane ---- */

/* Waits until the receiver took this rank's last Send, or the group
 * failed (Destroy's deadline aborts it: the wait is bounded). */
static void flush(struct host_comm *hc)
{
	struct host_group *g;
	uint32_t rank = hc->base.rank;

	pthread_mutex_lock(&hc->busy);
	pthread_mutex_lock(&state_lock);
	g = atomic_load(&hc->state) == COMM_LIVE ? hc->group : NULL;
	pthread_mutex_unlock(&state_lock);
	if (g) {
		host_group_lock(g);
		host_group_wait_locked(g, channel_idle, &rank);
		host_group_unlock(g);
	}
	pthread_mutex_unlock(&hc->busy);
}

static void run_call(struct host_comm *hc, struct rd_op *op)
{
	struct host_group *g;
	char reason[HOST_GROUP_REASON_MAX];
	int r;

	pthread_mutex_lock(&hc->busy);
	pthread_mutex_lock(&state_lock);
	g = atomic_load(&hc->state) == COMM_LIVE ? hc->group : NULL;
	pthread_mutex_unlock(&state_lock);
	if (!g || broken(hc)) {
		set_failed(hc, &op->err, broken(hc) ? broken(hc) : "destroyed");
		pthread_mutex_unlock(&hc->busy);
		return;
	}
	switch (op->compute.comm.kind) {
	case RP_COMM_P2P_SEND:
		r = run_send(hc, g, op);
		break;
	case RP_COMM_P2P_RECV:
		r = run_recv(hc, g, op);
		break;
	default:
		r = run_collective(hc, g, op);
		break;
	}
	pthread_mutex_unlock(&hc->busy);
	if (r < 0) {
		snprintf(reason, sizeof(reason), "%s", broken(hc) ? broken(hc) : "the collective failed");
		set_failed(hc, &op->err, reason);
	}
}

void host_comm_run(struct rd_op *op)
{
	struct host_comm *hc = hc_of(op->comm);

	switch (op->compute.comm.kind) {
	case RP_COMM_INIT:
		join(hc, op);
		break;
	case RP_COMM_DESTROY:
		/* Healthy: "finalize" here, on the caller's lane (its last
		 * Send delivered first, as ncclCommFinalize flushes); else
		 * its aborter ends it. */
		if (!broken(hc))
			flush(hc);
		if (broken(hc))
			start_abort(hc, "destroyed");
		else
			end_now(hc, false);
		break;
	default:
		run_call(hc, op);
		break;
	}
}
