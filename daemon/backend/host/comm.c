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
 * round once. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "daemon/backend/host/common.h"
#include "daemon/backend/host/guard.h"
#include "daemon/backend/host/math.h"
#include "proto/comm.h"
#include "proto/errors.h"

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

struct host_comm {
	struct rd_comm base;
	struct host_group *group;     /* under groups_lock; set once joined */
	atomic_bool aborted;
	bool left;
	uint64_t rounds;              /* this rank's collectives begun */
	char why[96];                 /* the abort's */
};

/* Every group of this worker; lock order: groups_lock, then a group's. */
static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_group *groups;

static struct host_comm *hc_of(struct rd_comm *c)
{
	return (struct host_comm *)c;
}

static void fail_group(struct host_group *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_group(struct host_group *g, const char *fmt, ...)
{
	va_list ap;

	if (!g->failed) {
		va_start(ap, fmt);
		vsnprintf(g->reason, sizeof(g->reason), fmt, ap);
		va_end(ap);
		g->failed = true;
	}
	pthread_cond_broadcast(&g->cond);
}

static void set_failed(struct host_comm *hc, struct rp_error *err, const char *reason)
{
	char id[RP_ID_MAX];

	rp_err_comm_failed(err, rp_id_format(&hc->base.obj.id, id), reason, "communicator %s (rank %u of %u) failed: %s",
			   id, hc->base.rank, hc->base.nranks, reason);
}

/* With the group's lock held (or none joined): why this rank cannot go on,
 * or NULL. */
static const char *broken(struct host_comm *hc, struct host_group *g)
{
	if (atomic_load(&hc->aborted))
		return "aborted";
	if (g && g->failed)
		return g->reason;
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

/* Leaves the group (a finalize, an abort's end, a close): peers still in
 * it fail their later collectives instead of waiting for this rank. */
static void leave(struct host_comm *hc, const char *why)
{
	struct host_group *g;

	pthread_mutex_lock(&groups_lock);
	g = hc->group;
	if (!g || hc->left) {
		hc->left = true;
		pthread_mutex_unlock(&groups_lock);
		return;
	}
	hc->left = true;
	pthread_mutex_lock(&g->lock);
	g->members[hc->base.rank] = NULL;
	if (--g->refs) {
		fail_group(g, "rank %u %s", hc->base.rank, why);
		pthread_mutex_unlock(&g->lock);
		pthread_mutex_unlock(&groups_lock);
		return;
	}
	pthread_mutex_unlock(&g->lock);
	for (struct host_group **p = &groups; *p; p = &(*p)->next) {
		if (*p == g) {
			*p = g->next;
			break;
		}
	}
	pthread_mutex_unlock(&groups_lock);
	group_free(g);
}

/* ---- The resource ---- */

static int comm_res_init(struct rd_resource *res)
{
	return 0;
}

/* CUDA usable (a release, a close): a host "finalize" is local. */
static void comm_res_release(struct rd_resource *res)
{
	leave((struct host_comm *)res, "destroyed its communicator");
}

/* The context is lost (a reset): abort. */
static void comm_res_invalidate(struct rd_resource *res)
{
	struct host_comm *hc = (struct host_comm *)res;

	atomic_store(&hc->aborted, true);
	leave(hc, "was aborted by a reset of its device");
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
	rd_resource_register(&dev->registry, &hc->base.res, &comm_ops);
	rd_resource_ensure_valid(&hc->base.res);
	*out = &hc->base;
	return 0;
}

void host_comm_abort(struct rd_comm *comm, const char *why)
{
	struct host_comm *hc = hc_of(comm);
	struct host_group *g;

	pthread_mutex_lock(&groups_lock);
	if (!atomic_load(&hc->aborted))
		snprintf(hc->why, sizeof(hc->why), "%s", why);
	atomic_store(&hc->aborted, true);
	g = hc->left ? NULL : hc->group;
	if (g) {
		pthread_mutex_lock(&g->lock);
		fail_group(g, "rank %u was aborted (%s)", comm->rank, why);
		pthread_mutex_unlock(&g->lock);
	}
	pthread_mutex_unlock(&groups_lock);
}

int host_comm_status(struct rd_comm *comm, struct rp_error *err)
{
	struct host_comm *hc = hc_of(comm);
	struct host_group *g;
	char reason[sizeof(g->reason)] = "";

	pthread_mutex_lock(&groups_lock);
	g = hc->left ? NULL : hc->group;
	if (atomic_load(&hc->aborted)) {
		snprintf(reason, sizeof(reason), "aborted");
	} else if (g) {
		pthread_mutex_lock(&g->lock);
		if (g->failed)
			snprintf(reason, sizeof(reason), "%s", g->reason);
		pthread_mutex_unlock(&g->lock);
	} else if (hc->left) {
		snprintf(reason, sizeof(reason), "destroyed");
	}
	pthread_mutex_unlock(&groups_lock);
	if (!reason[0])
		return 0;
	set_failed(hc, err, reason);
	return -EIO;
}

void host_comm_close(struct rd_comm *comm)
{
	if (!comm)
		return;
	/* Releases (leaves the group) when still valid. */
	rd_resource_unregister(&comm->res);
	leave(hc_of(comm), "closed its communicator");
	free(hc_of(comm));
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
	if (atomic_load(&hc->aborted)) {
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
	g->refs++;
	g->joined++;
	hc->group = g;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&groups_lock);
	while (g->joined < g->nranks && !broken(hc, g))
		pthread_cond_wait(&g->cond, &g->lock);
	why = g->joined < g->nranks || atomic_load(&hc->aborted) ? broken(hc, g) : NULL;
	if (why)
		snprintf(reason, sizeof(reason), "%s", why);
	pthread_mutex_unlock(&g->lock);
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

	pthread_mutex_lock(&groups_lock);
	g = hc->left ? NULL : hc->group;
	pthread_mutex_unlock(&groups_lock);
	if (!g) {
		set_failed(hc, &op->err, atomic_load(&hc->aborted) ? "aborted" : "destroyed");
		return;
	}
	pthread_mutex_lock(&g->lock);
	if ((why = broken(hc, g))) {
		snprintf(reason, sizeof(reason), "%s", why);
		pthread_mutex_unlock(&g->lock);
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
	while (g->rounds == round && !broken(hc, g))
		pthread_cond_wait(&g->cond, &g->lock);
	why = g->rounds > round ? NULL : broken(hc, g);
	if (why)
		snprintf(reason, sizeof(reason), "%s", why);
	pthread_mutex_unlock(&g->lock);
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
		leave(hc, "destroyed its communicator");
		break;
	default:
		collective(hc, op);
		break;
	}
}
