/* Communicators on the CUDA backend: NCCL, one rank per communicator, made
 * in non-blocking mode (ncclCommInitRankConfig with blocking = 0) so that
 * nothing regend does waits on a peer without also watching for an abort.
 *
 * Who calls NCCL on a communicator, each under its lock (NCCL wants one
 * caller at a time), never holding it across a wait:
 * - the lane's launching thread: Init (then polls ncclCommGetAsyncError
 *   until the init is done), the collectives (enqueued on the lane's stream
 *   like a GEMM; their completion is the lane's event), Destroy's finalize;
 * - the abort: ncclCommAbort on a thread of its own, so the loop never
 *   waits for it, nor for a peer (NCCL stops the communicator's kernels);
 * - the watch: a thread per device that polls every live communicator's
 *   ncclCommGetAsyncError every COMM_WATCH_MS and aborts one that reports
 *   an error, so a peer's loss ends the calls in flight with CommFailed and
 *   NCCL's reason instead of a hang.
 * A registry release finalizes a healthy communicator (at most
 * COMM_FINALIZE_MS for its peers to finalize too, else it aborts) and
 * destroys it; an invalidate (a reset) aborts it, which NCCL documents as
 * safe when the context or the peers are gone. */
#include "regen-config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <nccl.h>
#include "daemon/backend/cuda/common.h"
#include "proto/comm.h"
#include "proto/errors.h"

#define COMM_WATCH_MS 10
#define COMM_POLL_US 200
#define COMM_FINALIZE_MS 2000

_Static_assert(sizeof(ncclUniqueId) == RP_COMM_ID_SIZE, "a unique id is 128 bytes on the wire");

struct cuda_comm {
	struct rd_comm base;
	struct cuda_dev *cd;
	pthread_mutex_t lock;          /* every NCCL call on nc */
	ncclComm_t nc;                 /* NULL: not made yet, or aborted or destroyed */
	atomic_bool aborted;
	atomic_bool failed;            /* NCCL reported an error: reason says it */
	char reason[256];              /* under lock */
	bool abort_thread;             /* started; joined at close */
	pthread_t aborter;
	struct cuda_comm *next;        /* the device's list, under comms->lock */
};

/* The device's communicators and their watch. */
struct cuda_comms {
	pthread_mutex_t lock;
	struct cuda_comm *head;
	pthread_t thread;
	bool running, stop;
};

static struct cuda_comm *cc_of(struct rd_comm *c)
{
	return (struct cuda_comm *)c;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, NULL);
}

static void set_failed(struct cuda_comm *c, struct rp_error *err, const char *reason)
{
	char id[RP_ID_MAX];

	rp_error_clear(err);
	rp_err_comm_failed(err, rp_id_format(&c->base.obj.id, id), reason, "communicator %s (rank %u of %u) failed: %s",
			   id, c->base.rank, c->base.nranks, reason);
}

/* NCCL's words for a failure: the result and the last error it logged. */
static void nccl_reason(struct cuda_comm *c, ncclResult_t r, const char *what)
{
	const char *last = ncclGetLastError(c->nc);

	snprintf(c->reason, sizeof(c->reason), "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
		 last ? last : "");
}

/* With c->lock held: ends nc now. */
static void abort_locked(struct cuda_comm *c)
{
	if (c->nc) {
		ncclCommAbort(c->nc);
		c->nc = NULL;
	}
}

/* Why the communicator cannot be used, or NULL; with c->lock held. */
static const char *broken(struct cuda_comm *c)
{
	if (atomic_load(&c->failed))
		return c->reason;
	if (atomic_load(&c->aborted))
		return "aborted";
	return NULL;
}

/* Polls a non-blocking operation to its end, the lock released between
 * looks so that an abort can get in. 0, or -EIO with c->reason set. */
static int wait_done(struct cuda_comm *c, const char *what, uint64_t deadline_ns)
{
	for (;;) {
		ncclResult_t st = ncclInProgress;
		ncclResult_t r;

		pthread_mutex_lock(&c->lock);
		if (broken(c) || !c->nc) {
			pthread_mutex_unlock(&c->lock);
			return -EIO;
		}
		r = ncclCommGetAsyncError(c->nc, &st);
		if (r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
			nccl_reason(c, r != ncclSuccess ? r : st, what);
			atomic_store(&c->failed, true);
			abort_locked(c);
			pthread_mutex_unlock(&c->lock);
			return -EIO;
		}
		pthread_mutex_unlock(&c->lock);
		if (st == ncclSuccess)
			return 0;
		if (deadline_ns && cuda_now_ns() > deadline_ns) {
			pthread_mutex_lock(&c->lock);
			snprintf(c->reason, sizeof(c->reason), "%s did not finish within %d ms", what, COMM_FINALIZE_MS);
			atomic_store(&c->failed, true);
			abort_locked(c);
			pthread_mutex_unlock(&c->lock);
			return -EIO;
		}
		sleep_us(COMM_POLL_US);
	}
}

/* ---- The watch ---- */

static void *watch_main(void *arg)
{
	struct cuda_dev *cd = arg;
	struct cuda_comms *cs = cd->comms;

	for (;;) {
		pthread_mutex_lock(&cs->lock);
		if (cs->stop) {
			pthread_mutex_unlock(&cs->lock);
			return NULL;
		}
		for (struct cuda_comm *c = cs->head; c; c = c->next) {
			ncclResult_t st = ncclSuccess;

			/* Busy (an init, a finalize, an abort): look next time. */
			if (pthread_mutex_trylock(&c->lock) != 0)
				continue;
			if (c->nc && !broken(c) && ncclCommGetAsyncError(c->nc, &st) == ncclSuccess && st != ncclSuccess &&
			    st != ncclInProgress) {
				nccl_reason(c, st, "asynchronous error");
				atomic_store(&c->failed, true);
				abort_locked(c);
			}
			pthread_mutex_unlock(&c->lock);
		}
		pthread_mutex_unlock(&cs->lock);
		sleep_us(COMM_WATCH_MS * 1000);
	}
}

static int comms_get(struct cuda_dev *cd, struct rp_error *err)
{
	struct cuda_comms *cs = cd->comms;

	if (cs)
		return 0;
	cs = calloc(1, sizeof(*cs));
	if (!cs) {
		rp_err_out_of_memory(err, cd->dev->index, "no memory for the communicators");
		return -ENOMEM;
	}
	pthread_mutex_init(&cs->lock, NULL);
	cd->comms = cs;
	if (pthread_create(&cs->thread, NULL, watch_main, cd) == 0)
		cs->running = true;
	return 0;
}

void cuda_comm_finish(struct cuda_dev *cd)
{
	struct cuda_comms *cs = cd->comms;

	if (!cs)
		return;
	pthread_mutex_lock(&cs->lock);
	cs->stop = true;
	pthread_mutex_unlock(&cs->lock);
	if (cs->running)
		pthread_join(cs->thread, NULL);
	pthread_mutex_destroy(&cs->lock);
	free(cs);
	cd->comms = NULL;
}

/* ---- The resource ---- */

static int comm_res_init(struct rd_resource *res)
{
	return 0;
}

/* CUDA usable, nothing in flight: finalize (peers too, bounded), destroy. */
static void comm_res_release(struct rd_resource *res)
{
	struct cuda_comm *c = (struct cuda_comm *)res;
	ncclResult_t r;

	pthread_mutex_lock(&c->lock);
	if (!c->nc || broken(c)) {
		abort_locked(c);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	cudaSetDevice(c->cd->dev->index);
	r = ncclCommFinalize(c->nc);
	pthread_mutex_unlock(&c->lock);
	if ((r != ncclSuccess && r != ncclInProgress) ||
	    wait_done(c, "ncclCommFinalize", cuda_now_ns() + (uint64_t)COMM_FINALIZE_MS * 1000000u) < 0) {
		pthread_mutex_lock(&c->lock);
		abort_locked(c);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	pthread_mutex_lock(&c->lock);
	if (c->nc)
		ncclCommDestroy(c->nc);
	c->nc = NULL;
	pthread_mutex_unlock(&c->lock);
}

/* The context is lost: ncclCommAbort is documented safe then. */
static void comm_res_invalidate(struct rd_resource *res)
{
	struct cuda_comm *c = (struct cuda_comm *)res;

	atomic_store(&c->aborted, true);
	pthread_mutex_lock(&c->lock);
	abort_locked(c);
	pthread_mutex_unlock(&c->lock);
}

static const struct rd_resource_ops comm_ops = {
	.kind = "nccl_comm", .init = comm_res_init, .release = comm_res_release, .invalidate = comm_res_invalidate,
};

/* ---- The ops table's part ---- */

int cuda_comm_unique_id(struct rd_device *dev, unsigned char id[RP_COMM_ID_SIZE], struct rp_error *err)
{
	ncclUniqueId u;
	ncclResult_t r = ncclGetUniqueId(&u);

	if (r != ncclSuccess) {
		rp_err_backend_error(err, dev->index, "ncclGetUniqueId: %s: %s", ncclGetErrorString(r),
				     ncclGetLastError(NULL));
		return -EIO;
	}
	memcpy(id, u.internal, RP_COMM_ID_SIZE);
	return 0;
}

int cuda_comm_create(struct rd_device *dev, const unsigned char id[RP_COMM_ID_SIZE], uint32_t rank, uint32_t nranks,
		     struct rd_comm **out, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	struct cuda_comm *c;

	if (cuda_refuse_if_lost(cd, err) < 0 || comms_get(cd, err) < 0)
		return -EIO;
	c = calloc(1, sizeof(*c));
	if (!c) {
		rp_err_out_of_memory(err, dev->index, "no memory for a communicator");
		return -ENOMEM;
	}
	c->cd = cd;
	c->base.device = dev;
	c->base.rank = rank;
	c->base.nranks = nranks;
	pthread_mutex_init(&c->lock, NULL);
	rd_resource_register(&dev->registry, &c->base.res, &comm_ops);
	rd_resource_ensure_valid(&c->base.res);
	pthread_mutex_lock(&cd->comms->lock);
	c->next = cd->comms->head;
	cd->comms->head = c;
	pthread_mutex_unlock(&cd->comms->lock);
	*out = &c->base;
	return 0;
}

static void *aborter_main(void *arg)
{
	struct cuda_comm *c = arg;

	cudaSetDevice(c->cd->dev->index);
	pthread_mutex_lock(&c->lock);
	abort_locked(c);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

void cuda_comm_abort(struct rd_comm *comm, const char *why)
{
	struct cuda_comm *c = cc_of(comm);

	if (atomic_exchange(&c->aborted, true) || c->abort_thread)
		return;
	/* Its own thread: ncclCommAbort joins NCCL's threads and may take a
	 * while; a lane polling an init or a finalize sees `aborted` first. */
	if (pthread_create(&c->aborter, NULL, aborter_main, c) == 0) {
		c->abort_thread = true;
	} else {
		pthread_mutex_lock(&c->lock);
		abort_locked(c);
		pthread_mutex_unlock(&c->lock);
	}
}

int cuda_comm_status(struct rd_comm *comm, struct rp_error *err)
{
	struct cuda_comm *c = cc_of(comm);
	char reason[sizeof(c->reason)] = "";

	pthread_mutex_lock(&c->lock);
	if (broken(c))
		snprintf(reason, sizeof(reason), "%s", broken(c));
	pthread_mutex_unlock(&c->lock);
	if (!reason[0])
		return 0;
	set_failed(c, err, reason);
	return -EIO;
}

void cuda_comm_close(struct rd_comm *comm)
{
	struct cuda_comm *c = cc_of(comm);
	struct cuda_comms *cs;

	if (!comm)
		return;
	cs = c->cd->comms;
	pthread_mutex_lock(&cs->lock);
	for (struct cuda_comm **p = &cs->head; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&cs->lock);
	if (c->abort_thread)
		pthread_join(c->aborter, NULL);
	rd_resource_unregister(&c->base.res);
	pthread_mutex_lock(&c->lock);
	abort_locked(c);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* ---- Work on a lane ---- */

static int init(struct cuda_comm *c, struct rd_op *op)
{
	const struct rp_comm_call *call = &op->compute.comm;
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId u;
	ncclResult_t r;

	config.blocking = 0;
	memcpy(u.internal, call->unique_id, RP_COMM_ID_SIZE);
	pthread_mutex_lock(&c->lock);
	if (broken(c)) {
		pthread_mutex_unlock(&c->lock);
		set_failed(c, &op->err, "aborted");
		return -EIO;
	}
	r = ncclCommInitRankConfig(&c->nc, (int)call->nranks, u, (int)call->rank, &config);
	if (r != ncclSuccess && r != ncclInProgress) {
		nccl_reason(c, r, "ncclCommInitRankConfig");
		atomic_store(&c->failed, true);
		abort_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
	if (r != ncclSuccess && r != ncclInProgress) {
		set_failed(c, &op->err, c->reason);
		return -EIO;
	}
	if (wait_done(c, "ncclCommInitRankConfig", 0) < 0) {
		pthread_mutex_lock(&c->lock);
		set_failed(c, &op->err, broken(c) ? broken(c) : "aborted");
		pthread_mutex_unlock(&c->lock);
		return -EIO;
	}
	return 0;
}

static ncclDataType_t nccl_dtype(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F16 ? ncclFloat16 : dt == RP_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
}

static ncclRedOp_t nccl_op(enum rp_reduce_op op)
{
	return op == RP_REDUCE_MAX ? ncclMax : op == RP_REDUCE_AVG ? ncclAvg : ncclSum;
}

static void *operand_ptr(const struct rd_op *op, int slot)
{
	return (char *)op->buffers[slot]->ptr + op->compute.operands[slot].offset;
}

static int collective(struct cuda_comm *c, struct cuda_lane *l, struct rd_op *op)
{
	const struct rp_compute *cp = &op->compute;
	ncclDataType_t dt = nccl_dtype(cp->operands[RP_COMM_SEND].dtype);
	size_t n = (size_t)rp_comm_count(cp);
	void *send = operand_ptr(op, RP_COMM_SEND), *recv = operand_ptr(op, RP_COMM_RECV);
	const char *what = cp->spec->method;
	ncclResult_t r;

	pthread_mutex_lock(&c->lock);
	if (broken(c) || !c->nc) {
		char reason[sizeof(c->reason)];

		snprintf(reason, sizeof(reason), "%s", broken(c) ? broken(c) : "aborted");
		pthread_mutex_unlock(&c->lock);
		set_failed(c, &op->err, reason);
		return -EIO;
	}
	switch (cp->comm.kind) {
	case RP_COMM_ALL_REDUCE:
		r = ncclAllReduce(send, recv, n, dt, nccl_op(cp->comm.op), c->nc, l->stream);
		break;
	case RP_COMM_ALL_GATHER:
		r = ncclAllGather(send, recv, n, dt, c->nc, l->stream);
		break;
	case RP_COMM_REDUCE_SCATTER:
		r = ncclReduceScatter(send, recv, n, dt, nccl_op(cp->comm.op), c->nc, l->stream);
		break;
	default:
		r = ncclBroadcast(send, recv, n, dt, (int)cp->comm.root, c->nc, l->stream);
		break;
	}
	if (r != ncclSuccess && r != ncclInProgress) {
		nccl_reason(c, r, what);
		atomic_store(&c->failed, true);
		abort_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
	/* Enqueued once the communicator's state leaves ncclInProgress; the
	 * work itself completes on the stream, as a GEMM's. */
	if ((r != ncclSuccess && r != ncclInProgress) || (r == ncclInProgress && wait_done(c, what, 0) < 0)) {
		pthread_mutex_lock(&c->lock);
		set_failed(c, &op->err, broken(c) ? broken(c) : "aborted");
		pthread_mutex_unlock(&c->lock);
		return -EIO;
	}
	return 0;
}

static int destroy(struct cuda_comm *c, struct rd_op *op)
{
	ncclResult_t r;

	pthread_mutex_lock(&c->lock);
	if (broken(c) || !c->nc) {
		abort_locked(c);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	r = ncclCommFinalize(c->nc);
	pthread_mutex_unlock(&c->lock);
	/* The core's deadline for Destroy aborts a finalize whose peers never
	 * come, which ends this wait. */
	if ((r != ncclSuccess && r != ncclInProgress) || wait_done(c, "ncclCommFinalize", 0) < 0) {
		pthread_mutex_lock(&c->lock);
		abort_locked(c);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	pthread_mutex_lock(&c->lock);
	if (c->nc)
		ncclCommDestroy(c->nc);
	c->nc = NULL;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int cuda_comm_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	struct cuda_comm *c = cc_of(op->comm);

	switch (op->compute.comm.kind) {
	case RP_COMM_INIT:
		return init(c, op);
	case RP_COMM_DESTROY:
		return destroy(c, op);
	default:
		return collective(c, lane, op);
	}
}

void cuda_comm_completed(struct rd_op *op)
{
	struct cuda_comm *c = cc_of(op->comm);
	char reason[sizeof(c->reason)] = "";

	if (op->err.name || op->compute.comm.kind == RP_COMM_DESTROY)
		return;
	/* The stream finished, but an abort or a peer's loss cut the
	 * collective short: its output is not to be trusted. */
	pthread_mutex_lock(&c->lock);
	if (broken(c))
		snprintf(reason, sizeof(reason), "%s", broken(c));
	pthread_mutex_unlock(&c->lock);
	if (reason[0])
		set_failed(c, &op->err, reason);
}
