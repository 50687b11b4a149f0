/* SPDX-License-Identifier: Apache-2.0 */
/* Communicators on the host backend: the ranks of one communicator are
 * connections to this worker (one regend, one device index), and the
 * collectives run over the clients' host memory. It exists so that the
 * whole control plane of io.regen.Comm (Init's rendezvous, deadlines,
 * aborts in flight, generations, hostile input) is tested without a GPU;
 * it proves nothing about NCCL or the GPU path.
 *
 * A group is what the ranks of one unique id share. A rank's k-th
 * collective meets the others' k-th (NCCL matches them by order too): each
 * posts its op in its slot, and the last to arrive checks that they agree
 * (kind, length, dtype, reduction, root; where NCCL would hang or corrupt,
 * the host fails the collective on every rank with "mismatch"), computes
 * the whole collective into scratch (so no rank's output can clobber
 * another's input) and writes every rank's output, under the group's lock;
 * the others wait for the round to complete. An abort, a rank that leaves
 * or a failure wakes every waiter with the group's reason: a peer's loss
 * is a named error, not a hang. Sums accumulate in double in rank order and
 * round once.
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
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include "daemon/backend/aborters.h"
#include "daemon/backend/host/common.h"
#include "daemon/backend/host/guard.h"
#include "daemon/backend/host/math.h"
#include "daemon/env.h"
#include "proto/comm.h"
#include "proto/errors.h"

/* The longest REGEN_HOST_COMM_ABORT_MS taken. */
#define ABORT_MS_MAX 60000

struct host_comm;

/* What one rank posted for the round in progress. */
struct host_slot {
	const struct rd_op *op;
	char *send, *recv;
};

struct host_group {
	unsigned char id[RP_COMM_ID_SIZE];
	uint32_t nranks;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct host_comm **members;   /* by rank; NULL: not joined, or left */
	uint32_t joined;              /* ranks that ever joined */
	unsigned refs;                /* members holding it */
	bool failed;
	char reason[200];
	uint64_t rounds;              /* collectives completed */
	uint32_t arrived;             /* ranks posted in the round in progress */
	struct host_slot *slots;
	struct host_group *next;
};

/* As cuda/comm.c's. */
enum comm_state { COMM_EMPTY, COMM_LIVE, COMM_ENDING, COMM_ENDED };

struct host_comm {
	struct rd_comm base;
	struct host_group *group;     /* under groups_lock; set once joined */
	_Atomic int state;            /* enum comm_state; changed under groups_lock */
	atomic_uint refs;             /* the core's (create to close), a running aborter's */
	atomic_bool aborted;
	atomic_bool abort_started;
	atomic_bool failed;           /* its group failed: reason says why */
	char reason[200];             /* written once, under the group's lock, before failed is set */
	uint64_t rounds;              /* this rank's collectives begun */
	char why[96];                 /* the abort's, under groups_lock */
};

/* Every group of this worker; lock order: groups_lock, then a group's. */
static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_group *groups;
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

/* With the group's lock held: the group fails, and so does every member
 * still in it (its reason is read without a lock from then on). */
static void fail_group(struct host_group *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_group(struct host_group *g, const char *fmt, ...)
{
	va_list ap;

	if (!g->failed) {
		va_start(ap, fmt);
		vsnprintf(g->reason, sizeof(g->reason), fmt, ap);
		va_end(ap);
		g->failed = true;
		for (uint32_t k = 0; k < g->nranks; k++) {
			struct host_comm *m = g->members[k];

			if (m && !atomic_load(&m->failed)) {
				snprintf(m->reason, sizeof(m->reason), "%s", g->reason);
				atomic_store_explicit(&m->failed, true, memory_order_release);
			}
		}
	}
	pthread_cond_broadcast(&g->cond);
}

static void set_failed(struct host_comm *hc, struct rp_error *err, const char *reason)
{
	char id[RP_ID_MAX];

	rp_err_comm_failed(err, rp_id_format(&hc->base.obj.id, id), reason, "communicator %s (rank %u of %u) failed: %s",
			   id, hc->base.rank, hc->base.nranks, reason);
}

/* Why this rank cannot go on, or NULL. No lock: the reason never changes
 * once `failed` is set. */
static const char *broken(struct host_comm *hc)
{
	if (atomic_load(&hc->aborted))
		return "aborted";
	if (atomic_load_explicit(&hc->failed, memory_order_acquire))
		return hc->reason;
	return NULL;
}

static void group_free(struct host_group *g)
{
	pthread_mutex_destroy(&g->lock);
	pthread_cond_destroy(&g->cond);
	free(g->members);
	free(g->slots);
	free(g);
}

/* Drops one of the group's references (a member's, or a call's waiting
 * in it); the last frees it. No lock held. */
static void group_put(struct host_group *g)
{
	bool last;

	pthread_mutex_lock(&groups_lock);
	pthread_mutex_lock(&g->lock);
	last = --g->refs == 0;
	pthread_mutex_unlock(&g->lock);
	if (last) {
		for (struct host_group **p = &groups; *p; p = &(*p)->next) {
			if (*p == g) {
				*p = g->next;
				break;
			}
		}
	}
	pthread_mutex_unlock(&groups_lock);
	if (last)
		group_free(g);
}

/* Takes the rank out of its group (the host's finalize, abort or close):
 * peers still in it fail their later collectives instead of waiting for
 * it. Only the thread that took it (ENDING) calls this; a call of this
 * rank still waiting in the group holds a reference of its own. */
static void leave(struct host_comm *hc, const char *why)
{
	struct host_group *g;

	pthread_mutex_lock(&groups_lock);
	g = hc->group;
	if (g) {
		pthread_mutex_lock(&g->lock);
		g->members[hc->base.rank] = NULL;
		if (g->refs > 1)
			fail_group(g, "rank %u %s", hc->base.rank, why);
		pthread_mutex_unlock(&g->lock);
	}
	pthread_mutex_unlock(&groups_lock);
	if (g)
		group_put(g);
}

static void put(struct host_comm *hc)
{
	if (atomic_fetch_sub(&hc->refs, 1) == 1)
		free(hc);
}

/* LIVE -> ENDING: this thread ends it (true). EMPTY -> ENDED: nothing to
 * end. Another thread's, or ended: false. */
static bool take(struct host_comm *hc)
{
	bool took = false;

	pthread_mutex_lock(&groups_lock);
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
	pthread_mutex_unlock(&groups_lock);
	return took;
}

/* Ends the rank on this thread, holding no lock while it takes long (an
 * abort's REGEN_HOST_COMM_ABORT_MS), then publishes it. */
static void end_now(struct host_comm *hc, bool abort)
{
	char why[sizeof(hc->why) + 32];

	if (!take(hc))
		return;
	if (abort && abort_ms()) {
		struct timespec ts = { abort_ms() / 1000, (long)(abort_ms() % 1000) * 1000000 };

		nanosleep(&ts, NULL);
	}
	pthread_mutex_lock(&groups_lock);
	if (abort)
		snprintf(why, sizeof(why), "was aborted (%s)", hc->why[0] ? hc->why : "aborted");
	else
		snprintf(why, sizeof(why), "destroyed its communicator");
	pthread_mutex_unlock(&groups_lock);
	leave(hc, why);
	pthread_mutex_lock(&groups_lock);
	atomic_store(&hc->state, COMM_ENDED);
	pthread_mutex_unlock(&groups_lock);
}

/* An aborter's work, holding the reference start_abort took. */
static void end_and_put(void *arg)
{
	struct host_comm *hc = arg;

	end_now(hc, true);
	put(hc);
}

/* Marks the rank aborted and fails its group (its calls in flight and its
 * peers' wake with the reason now), then hands its end to an aborter
 * thread, once. Any thread, no lock held; never waits for the end. */
static void start_abort(struct host_comm *hc, const char *why)
{
	struct host_group *g;

	pthread_mutex_lock(&groups_lock);
	if (!atomic_load(&hc->aborted))
		snprintf(hc->why, sizeof(hc->why), "%s", why);
	atomic_store(&hc->aborted, true);
	g = atomic_load(&hc->state) == COMM_LIVE ? hc->group : NULL;
	if (g) {
		pthread_mutex_lock(&g->lock);
		fail_group(g, "rank %u was aborted (%s)", hc->base.rank, hc->why);
		pthread_mutex_unlock(&g->lock);
	}
	pthread_mutex_unlock(&groups_lock);
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
	struct host_group *g;

	pthread_mutex_lock(&groups_lock);
	if (!atomic_load(&hc->aborted))
		snprintf(hc->why, sizeof(hc->why), "a reset of its device");
	atomic_store(&hc->aborted, true);
	g = atomic_load(&hc->state) == COMM_LIVE ? hc->group : NULL;
	if (g) {
		pthread_mutex_lock(&g->lock);
		fail_group(g, "rank %u was aborted by a reset of its device", hc->base.rank);
		pthread_mutex_unlock(&g->lock);
	}
	pthread_mutex_unlock(&groups_lock);
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

/* ---- Work on a lane ---- */

static struct host_group *group_new(const unsigned char id[RP_COMM_ID_SIZE], uint32_t nranks)
{
	struct host_group *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	g->members = calloc(nranks, sizeof(*g->members));
	g->slots = calloc(nranks, sizeof(*g->slots));
	if (!g->members || !g->slots) {
		free(g->members);
		free(g->slots);
		free(g);
		return NULL;
	}
	memcpy(g->id, id, RP_COMM_ID_SIZE);
	g->nranks = nranks;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->next = groups;
	groups = g;
	return g;
}

/* Init: joins the group, then waits for every rank (or an abort). */
static void join(struct host_comm *hc, struct rd_op *op)
{
	const struct rp_comm_call *cc = &op->compute.comm;
	struct host_group *g;
	const char *why;
	char reason[200];

	pthread_mutex_lock(&groups_lock);
	if (atomic_load(&hc->aborted) || atomic_load(&hc->state) != COMM_EMPTY) {
		pthread_mutex_unlock(&groups_lock);
		set_failed(hc, &op->err, "aborted");
		return;
	}
	for (g = groups; g; g = g->next)
		if (memcmp(g->id, cc->unique_id, RP_COMM_ID_SIZE) == 0)
			break;
	if (!g && !(g = group_new(cc->unique_id, cc->nranks))) {
		pthread_mutex_unlock(&groups_lock);
		rp_err_out_of_memory(&op->err, hc->base.device->index, "no memory for a communicator");
		return;
	}
	pthread_mutex_lock(&g->lock);
	reason[0] = '\0';
	if (g->nranks != cc->nranks)
		snprintf(reason, sizeof(reason), "mismatch: rank %u says nranks %u, but the communicator has %u ranks",
			 cc->rank, cc->nranks, g->nranks);
	else if (g->members[cc->rank] || g->joined == g->nranks)
		snprintf(reason, sizeof(reason), "rank %u already joined this unique id; ask rank 0 for a new one",
			 cc->rank);
	else if (g->failed)
		snprintf(reason, sizeof(reason), "%s", g->reason);
	if (reason[0]) {
		pthread_mutex_unlock(&g->lock);
		pthread_mutex_unlock(&groups_lock);
		set_failed(hc, &op->err, reason);
		return;
	}
	g->members[cc->rank] = hc;
	g->refs += 2;                 /* the member's, and this wait's */
	g->joined++;
	hc->group = g;
	atomic_store(&hc->state, COMM_LIVE);
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&groups_lock);
	while (g->joined < g->nranks && !broken(hc))
		pthread_cond_wait(&g->cond, &g->lock);
	why = g->joined < g->nranks || atomic_load(&hc->aborted) ? broken(hc) : NULL;
	if (why)
		snprintf(reason, sizeof(reason), "%s", why);
	pthread_mutex_unlock(&g->lock);
	group_put(g);
	if (why)
		set_failed(hc, &op->err, reason);
}

static float load(enum rp_dtype dt, const char *p, size_t i)
{
	switch (dt) {
	case RP_DTYPE_F16:
		return rd_f16_to_f32(((const uint16_t *)p)[i]);
	case RP_DTYPE_BF16:
		return rd_bf16_to_f32(((const uint16_t *)p)[i]);
	default:
		return ((const float *)p)[i];
	}
}

static void store(enum rp_dtype dt, char *p, size_t i, double v)
{
	switch (dt) {
	case RP_DTYPE_F16:
		((uint16_t *)p)[i] = rd_f32_to_f16((float)v);
		break;
	case RP_DTYPE_BF16:
		((uint16_t *)p)[i] = rd_f32_to_bf16((float)v);
		break;
	default:
		((float *)p)[i] = (float)v;
		break;
	}
}

struct round {
	struct host_group *g;
	const struct rp_compute *c;     /* rank 0's: they agree */
	size_t n;                       /* elements each rank sends (ReduceScatter: receives) */
	double *acc;
	char *bytes;
};

/* Reduces element i of every rank's send into acc[j]. */
static void reduce_into(struct round *r, size_t i, size_t j)
{
	const struct rp_comm_call *cc = &r->c->comm;
	enum rp_dtype dt = r->c->operands[RP_COMM_SEND].dtype;
	double v = load(dt, r->g->slots[0].send, i);

	for (uint32_t k = 1; k < r->g->nranks; k++) {
		double x = load(dt, r->g->slots[k].send, i);
		v = cc->op == RP_REDUCE_MAX ? (x > v || v != v ? x : v) : v + x;
	}
	if (cc->op == RP_REDUCE_AVG)
		v /= r->g->nranks;
	r->acc[j] = v;
}

/* The collective over every rank's memory; guarded (client memory). */
static int compute(void *arg)
{
	struct round *r = arg;
	struct host_group *g = r->g;
	enum rp_dtype dt = r->c->operands[RP_COMM_SEND].dtype;
	size_t es = rp_dtype_size(dt), n = r->n;

	switch (r->c->comm.kind) {
	case RP_COMM_ALL_REDUCE:
		for (size_t i = 0; i < n; i++)
			reduce_into(r, i, i);
		for (uint32_t k = 0; k < g->nranks; k++)
			for (size_t i = 0; i < n; i++)
				store(dt, g->slots[k].recv, i, r->acc[i]);
		break;
	case RP_COMM_REDUCE_SCATTER:
		for (size_t i = 0; i < n * g->nranks; i++)
			reduce_into(r, i, i);
		for (uint32_t k = 0; k < g->nranks; k++)
			for (size_t i = 0; i < n; i++)
				store(dt, g->slots[k].recv, i, r->acc[k * n + i]);
		break;
	case RP_COMM_ALL_GATHER:
		for (uint32_t k = 0; k < g->nranks; k++)
			memcpy(r->bytes + k * n * es, g->slots[k].send, n * es);
		for (uint32_t k = 0; k < g->nranks; k++)
			memcpy(g->slots[k].recv, r->bytes, g->nranks * n * es);
		break;
	case RP_COMM_BROADCAST:
		memcpy(r->bytes, g->slots[r->c->comm.root].send, n * es);
		for (uint32_t k = 0; k < g->nranks; k++)
			memcpy(g->slots[k].recv, r->bytes, n * es);
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

static const char *kind_name(const struct rp_compute *c)
{
	return c->spec->name;
}

/* The last rank in: whether the ranks agree, then the collective. With the
 * group's lock held. */
static void complete_round(struct host_comm *hc, struct host_group *g, struct rd_op *op)
{
	const struct rp_compute *c0 = &g->slots[0].op->compute;
	struct round r = { .g = g, .c = c0, .n = (size_t)rp_comm_count(c0) };
	size_t es = rp_dtype_size(c0->operands[RP_COMM_SEND].dtype);
	uintptr_t fault = 0;
	int rc;

	for (uint32_t k = 1; k < g->nranks; k++) {
		const struct rp_compute *c = &g->slots[k].op->compute;

		if (c->comm.kind != c0->comm.kind || rp_comm_count(c) != rp_comm_count(c0) ||
		    c->operands[RP_COMM_SEND].dtype != c0->operands[RP_COMM_SEND].dtype ||
		    c->comm.op != c0->comm.op || c->comm.root != c0->comm.root) {
			fail_group(g, "mismatch: collective %llu is %s of %lld %s (%s, root %u) on rank 0 but %s of %lld %s "
				   "(%s, root %u) on rank %u",
				   (unsigned long long)g->rounds, kind_name(c0), (long long)rp_comm_count(c0),
				   rp_dtype_name(c0->operands[RP_COMM_SEND].dtype), rp_reduce_op_name(c0->comm.op),
				   c0->comm.root, kind_name(c), (long long)rp_comm_count(c),
				   rp_dtype_name(c->operands[RP_COMM_SEND].dtype), rp_reduce_op_name(c->comm.op), c->comm.root,
				   k);
			return;
		}
	}
	if (c0->comm.kind == RP_COMM_ALL_REDUCE || c0->comm.kind == RP_COMM_REDUCE_SCATTER)
		r.acc = malloc(r.n * g->nranks * sizeof(double));
	else
		r.bytes = malloc(r.n * g->nranks * es);
	if (!r.acc && !r.bytes) {
		fail_group(g, "no host memory for a collective of %zu elements", r.n);
		return;
	}
	rc = rd_host_guarded(compute, &r, &fault);
	free(r.acc);
	free(r.bytes);
	if (rc < 0) {
		fail_group(g, "%s", rc == -EFAULT ? "a rank's buffer is no longer backed by its file (truncated)"
						  : "the collective failed");
		return;
	}
	g->arrived = 0;
	g->rounds++;
	pthread_cond_broadcast(&g->cond);
}

static void collective(struct host_comm *hc, struct rd_op *op)
{
	const struct rp_compute *c = &op->compute;
	struct host_group *g;
	const char *why;
	char reason[200];
	uint64_t round;

	/* The call holds the group while it waits in it: an aborter may take
	 * this rank out of it meanwhile. */
	pthread_mutex_lock(&groups_lock);
	g = atomic_load(&hc->state) == COMM_LIVE ? hc->group : NULL;
	if (g) {
		pthread_mutex_lock(&g->lock);
		g->refs++;
		pthread_mutex_unlock(&g->lock);
	}
	pthread_mutex_unlock(&groups_lock);
	if (!g) {
		set_failed(hc, &op->err, broken(hc) ? broken(hc) : "destroyed");
		return;
	}
	pthread_mutex_lock(&g->lock);
	if ((why = broken(hc))) {
		snprintf(reason, sizeof(reason), "%s", why);
		pthread_mutex_unlock(&g->lock);
		group_put(g);
		set_failed(hc, &op->err, reason);
		return;
	}
	round = hc->rounds++;
	g->slots[hc->base.rank] = (struct host_slot){
		.op = op,
		.send = (char *)op->buffers[RP_COMM_SEND]->ptr + c->operands[RP_COMM_SEND].offset,
		.recv = (char *)op->buffers[RP_COMM_RECV]->ptr + c->operands[RP_COMM_RECV].offset,
	};
	if (++g->arrived == g->nranks)
		complete_round(hc, g, op);
	while (g->rounds == round && !broken(hc))
		pthread_cond_wait(&g->cond, &g->lock);
	why = g->rounds > round ? NULL : broken(hc);
	if (why)
		snprintf(reason, sizeof(reason), "%s", why);
	pthread_mutex_unlock(&g->lock);
	group_put(g);
	if (why)
		set_failed(hc, &op->err, reason);
}

void host_comm_run(struct rd_op *op)
{
	struct host_comm *hc = hc_of(op->comm);

	switch (op->compute.comm.kind) {
	case RP_COMM_INIT:
		join(hc, op);
		break;
	case RP_COMM_DESTROY:
		/* Healthy: "finalize" here, on the caller's lane; else its
		 * aborter ends it. */
		if (broken(hc))
			start_abort(hc, "destroyed");
		else
			end_now(hc, false);
		break;
	default:
		collective(hc, op);
		break;
	}
}
