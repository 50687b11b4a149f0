/* SPDX-License-Identifier: Apache-2.0 */
/* Communicators on the CUDA backend: NCCL, one rank per communicator, made
 * in non-blocking mode (ncclCommInitRankConfig with blocking = 0) so that
 * nothing regend does waits on a peer without also watching for an abort.
 *
 * NCCL wants one caller at a time on a communicator. Every call on nc is
 * made under c->lock, and only calls that return at once in non-blocking
 * mode are made there: the init, a collective's enqueue, ncclCommFinalize,
 * ncclCommGetAsyncError, ncclGetLastError. The two that may take long,
 * ncclCommAbort (it joins NCCL's threads; a peer or the device may be gone)
 * and ncclCommDestroy, never run under a lock anyone else takes: a thread
 * takes nc under the lock (c->nc = NULL, state ENDING), ends it outside,
 * then publishes ENDED. Once nc is taken nobody else can reach it, and a
 * thread that finds the communicator ENDING leaves it to the one ending it.
 * Whether it is usable (`aborted`, `failed` and its reason) is read without
 * any lock, by the loop (Status of a call, Attach, a completion) as by the
 * lanes, so none of them waits behind another's NCCL call either.
 *
 * Who ends a communicator:
 * - an abort (Abort, a deadline, a drain, a process gone, a failure a lane
 *   or the watch found) marks it aborted (or failed, with NCCL's words)
 *   and hands nc to an aborter thread of its own: the loop, a lane or the
 *   watch never waits for ncclCommAbort;
 * - Destroy's op on the caller's lane: finalize (polled, the lock taken
 *   only to look), then ncclCommDestroy on the lane, outside the lock;
 * - a registry release (a lifecycle change, CUDA usable): finalize bounded
 *   by COMM_FINALIZE_MS, then destroy; a failed or aborted one is left to
 *   its aborter;
 * - a registry invalidate (a reset): ncclCommAbort at once, which NCCL
 *   documents safe when the context or the peers are gone.
 * The backend's release and reset then wait for every aborter still running
 * (cuda_comm_quiesce): the context must not be reset under an
 * ncclCommAbort, and a release gives back the memory the aborts free. That
 * is the one wait for an abort, and only a lifecycle change makes it.
 *
 * The watch, a thread per device, polls every live communicator's
 * ncclCommGetAsyncError every COMM_WATCH_MS (skipping one whose lock is
 * busy) and aborts one that reports an error, so a peer's loss ends the
 * calls in flight with CommFailed and NCCL's reason instead of a hang. It
 * also joins the aborter threads that finished.
 *
 * A communicator is freed by the last of its holders: the core (from create
 * to close) and its aborter while that runs; a close never waits for an
 * abort either. */
#include "regen-config.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <nccl.h>
#include "daemon/backend/aborters.h"
#include "daemon/backend/cuda/common.h"
#include "proto/comm.h"
#include "proto/errors.h"

#define COMM_WATCH_MS 10
#define COMM_POLL_US 200
#define COMM_FINALIZE_MS 2000
/* Communicators the watch aborts in one pass; more wait for the next. */
#define COMM_WATCH_BATCH 32

_Static_assert(sizeof(ncclUniqueId) == RP_COMM_ID_SIZE, "a unique id is 128 bytes on the wire");

/* Where nc is in its life. Changed under c->lock; read without it. */
enum comm_state {
	COMM_EMPTY,    /* no nc yet: its Init has not made it */
	COMM_LIVE,     /* nc usable, under c->lock */
	COMM_ENDING,   /* a thread took nc and aborts or destroys it, outside the lock */
	COMM_ENDED,    /* nc aborted or destroyed (or never made) */
};

struct cuda_comm {
	struct rd_comm base;
	struct cuda_dev *cd;
	pthread_mutex_t lock;          /* nc, state changes, reason; NCCL calls that return at once */
	ncclComm_t nc;                 /* COMM_LIVE only */
	_Atomic int state;             /* enum comm_state */
	atomic_uint refs;              /* the core's (create to close), a running aborter's */
	atomic_bool aborted;           /* asked to stop */
	atomic_bool abort_started;     /* an aborter was handed the communicator */
	atomic_bool failed;            /* NCCL reported an error: reason says it */
	char reason[256];              /* written once, under lock, before failed is set */
	struct cuda_comm *next;        /* the device's list, under comms->lock */
};

/* The device's communicators, their aborters and their watch. The watch
 * or a quiesce joins the aborters once done. */
struct cuda_comms {
	pthread_mutex_t lock;
	struct cuda_comm *head;
	struct rd_aborters aborters;
	pthread_t thread;
	bool stop;
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

/* Why the communicator cannot be used, or NULL. No lock: the reason never
 * changes once `failed` is set. */
static const char *broken(struct cuda_comm *c)
{
	if (atomic_load_explicit(&c->failed, memory_order_acquire))
		return c->reason;
	if (atomic_load(&c->aborted))
		return "aborted";
	return NULL;
}

/* With c->lock held: the first failure's words stay the reason. */
static void fail_locked(struct cuda_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_locked(struct cuda_comm *c, const char *fmt, ...)
{
	va_list ap;

	if (atomic_load(&c->failed))
		return;
	va_start(ap, fmt);
	vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
	va_end(ap);
	atomic_store_explicit(&c->failed, true, memory_order_release);
}

/* With c->lock held: NCCL's words for a failure, the result and the last
 * error it logged. */
static void fail_nccl_locked(struct cuda_comm *c, ncclResult_t r, const char *what)
{
	const char *last = ncclGetLastError(c->nc);

	fail_locked(c, "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

static void put(struct cuda_comm *c)
{
	if (atomic_fetch_sub(&c->refs, 1) == 1) {
		pthread_mutex_destroy(&c->lock);
		free(c);
	}
}

/* Takes nc to end it outside the lock; false when there is none to take
 * (never made: then it is ended now; or another thread has it). */
static bool take(struct cuda_comm *c, ncclComm_t *nc)
{
	bool took = false;

	pthread_mutex_lock(&c->lock);
	switch (atomic_load(&c->state)) {
	case COMM_EMPTY:
		atomic_store(&c->state, COMM_ENDED);
		break;
	case COMM_LIVE:
		*nc = c->nc;
		c->nc = NULL;
		atomic_store(&c->state, COMM_ENDING);
		took = true;
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&c->lock);
	return took;
}

/* Ends nc now on this thread, holding no lock: ncclCommAbort, or
 * ncclCommDestroy after a finalize that completed. Then publishes it. */
static void end_now(struct cuda_comm *c, bool abort)
{
	ncclComm_t nc;

	if (!take(c, &nc))
		return;
	if (abort)
		ncclCommAbort(nc);
	else
		ncclCommDestroy(nc);
	pthread_mutex_lock(&c->lock);
	atomic_store(&c->state, COMM_ENDED);
	pthread_mutex_unlock(&c->lock);
}

/* An aborter's work, holding the reference start_abort took. */
static void abort_and_put(void *arg)
{
	struct cuda_comm *c = arg;

	cudaSetDevice(c->cd->dev->index);
	end_now(c, true);
	put(c);
}

/* Marks the communicator aborted (every call from now on fails, without a
 * lock) and hands it to an aborter thread, once. Any thread, no lock held;
 * never waits for NCCL. */
static void start_abort(struct cuda_comm *c)
{
	atomic_store(&c->aborted, true);
	if (atomic_load(&c->state) == COMM_ENDED || atomic_exchange(&c->abort_started, true))
		return;
	atomic_fetch_add(&c->refs, 1);
	/* With no thread to be had (out of memory) this one aborts, still
	 * holding no lock, so only the caller waits. */
	rd_aborters_run(&c->cd->comms->aborters, abort_and_put, c);
}

/* Polls a non-blocking operation to its end, the lock taken only to look,
 * so that an abort can get in. 0; or -EIO, the communicator failed (its
 * reason set) or aborted, an abort under way. deadline_ms 0: none. */
static int wait_done(struct cuda_comm *c, const char *what, unsigned deadline_ms)
{
	uint64_t deadline_ns = deadline_ms ? rd_now_ns() + (uint64_t)deadline_ms * 1000000u : 0;

	for (;;) {
		ncclResult_t st = ncclInProgress;
		ncclResult_t r;
		bool bad;

		pthread_mutex_lock(&c->lock);
		if (broken(c) || atomic_load(&c->state) != COMM_LIVE) {
			pthread_mutex_unlock(&c->lock);
			start_abort(c);
			return -EIO;
		}
		r = ncclCommGetAsyncError(c->nc, &st);
		bad = r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress);
		if (bad) {
			fail_nccl_locked(c, r != ncclSuccess ? r : st, what);
		} else if (st == ncclInProgress && deadline_ns && rd_now_ns() > deadline_ns) {
			fail_locked(c, "%s did not finish within %u ms", what, deadline_ms);
			bad = true;
		}
		pthread_mutex_unlock(&c->lock);
		if (bad) {
			start_abort(c);
			return -EIO;
		}
		if (st == ncclSuccess)
			return 0;
		sleep_us(COMM_POLL_US);
	}
}

/* ---- The watch ---- */

static void *watch_main(void *arg)
{
	struct cuda_comms *cs = arg;

	for (;;) {
		struct cuda_comm *failing[COMM_WATCH_BATCH];
		unsigned n = 0;

		pthread_mutex_lock(&cs->lock);
		if (cs->stop) {
			pthread_mutex_unlock(&cs->lock);
			return NULL;
		}
		for (struct cuda_comm *c = cs->head; c && n < COMM_WATCH_BATCH; c = c->next) {
			ncclResult_t st = ncclSuccess;

			/* Busy (an init, an enqueue, a finalize's poll): next time. */
			if (pthread_mutex_trylock(&c->lock) != 0)
				continue;
			if (atomic_load(&c->state) == COMM_LIVE && !broken(c) &&
			    ncclCommGetAsyncError(c->nc, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
				fail_nccl_locked(c, st, "asynchronous error");
				/* Held past the list's lock: a close cannot free it. */
				atomic_fetch_add(&c->refs, 1);
				failing[n++] = c;
			}
			pthread_mutex_unlock(&c->lock);
		}
		pthread_mutex_unlock(&cs->lock);
		/* Outside every lock: with no thread to be had the abort runs
		 * here, inline. */
		for (unsigned i = 0; i < n; i++) {
			start_abort(failing[i]);
			put(failing[i]);
		}
		rd_aborters_reap(&cs->aborters, false);
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
	rd_aborters_init(&cs->aborters);
	/* Without its watch a peer's loss would be a hang: no communicator. */
	if (pthread_create(&cs->thread, NULL, watch_main, cs) != 0) {
		rd_aborters_finish(&cs->aborters);
		pthread_mutex_destroy(&cs->lock);
		free(cs);
		rp_err_out_of_memory(err, cd->dev->index, "no thread for the communicators' watch");
		return -ENOMEM;
	}
	cd->comms = cs;
	return 0;
}

void cuda_comm_quiesce(struct cuda_dev *cd)
{
	if (cd->comms)
		rd_aborters_reap(&cd->comms->aborters, true);
}

void cuda_comm_finish(struct cuda_dev *cd)
{
	struct cuda_comms *cs = cd->comms;

	if (!cs)
		return;
	rd_aborters_reap(&cs->aborters, true);
	pthread_mutex_lock(&cs->lock);
	cs->stop = true;
	pthread_mutex_unlock(&cs->lock);
	pthread_join(cs->thread, NULL);
	/* Joins an aborter the watch's last pass started too. */
	rd_aborters_finish(&cs->aborters);
	pthread_mutex_destroy(&cs->lock);
	free(cs);
	cd->comms = NULL;
}

/* ---- The resource ---- */

static int comm_res_init(struct rd_resource *res)
{
	return 0;
}

/* CUDA usable, nothing in flight: finalize (peers too, bounded), destroy.
 * One that failed or was aborted is its aborter's to end. */
static void comm_res_release(struct rd_resource *res)
{
	struct cuda_comm *c = (struct cuda_comm *)res;
	ncclResult_t r;

	pthread_mutex_lock(&c->lock);
	if (atomic_load(&c->state) != COMM_LIVE || broken(c)) {
		pthread_mutex_unlock(&c->lock);
		start_abort(c);
		return;
	}
	cudaSetDevice(c->cd->dev->index);
	r = ncclCommFinalize(c->nc);
	if (r != ncclSuccess && r != ncclInProgress)
		fail_nccl_locked(c, r, "ncclCommFinalize");
	pthread_mutex_unlock(&c->lock);
	if (r != ncclSuccess && r != ncclInProgress) {
		start_abort(c);
		return;
	}
	if (wait_done(c, "ncclCommFinalize", COMM_FINALIZE_MS) == 0)
		end_now(c, false);
}

/* The context is lost: ncclCommAbort is documented safe then. Here, not
 * on an aborter: the reset must not go on under it; and nobody else waits,
 * every call fails at `aborted` without the lock. */
static void comm_res_invalidate(struct rd_resource *res)
{
	struct cuda_comm *c = (struct cuda_comm *)res;

	atomic_store(&c->aborted, true);
	end_now(c, true);
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
	atomic_init(&c->state, COMM_EMPTY);
	atomic_init(&c->refs, 1);
	rd_resource_register(&dev->registry, &c->base.res, &comm_ops);
	rd_resource_ensure_valid(&c->base.res);
	pthread_mutex_lock(&cd->comms->lock);
	c->next = cd->comms->head;
	cd->comms->head = c;
	pthread_mutex_unlock(&cd->comms->lock);
	*out = &c->base;
	return 0;
}

void cuda_comm_abort(struct rd_comm *comm, const char *why)
{
	start_abort(cc_of(comm));
}

int cuda_comm_status(struct rd_comm *comm, struct rp_error *err)
{
	struct cuda_comm *c = cc_of(comm);
	const char *why = broken(c);

	if (!why)
		return 0;
	set_failed(c, err, why);
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
	/* Released (a lifecycle change finalizes a healthy one) if still
	 * valid; anything left of it goes to an aborter, and the last holder
	 * frees it. */
	rd_resource_unregister(&c->base.res);
	start_abort(c);
	put(c);
}

/* ---- Work on a lane ---- */

static int init(struct cuda_comm *c, struct rd_op *op)
{
	const struct rp_comm_call *call = &op->compute.comm;
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclComm_t nc = NULL;
	ncclUniqueId u;
	ncclResult_t r;

	config.blocking = 0;
	memcpy(u.internal, call->unique_id, RP_COMM_ID_SIZE);
	pthread_mutex_lock(&c->lock);
	if (broken(c) || atomic_load(&c->state) != COMM_EMPTY) {
		pthread_mutex_unlock(&c->lock);
		set_failed(c, &op->err, broken(c) ? broken(c) : "aborted");
		return -EIO;
	}
	r = ncclCommInitRankConfig(&nc, (int)call->nranks, u, (int)call->rank, &config);
	if (nc) {
		c->nc = nc;
		atomic_store(&c->state, COMM_LIVE);
	}
	if (r != ncclSuccess && r != ncclInProgress)
		fail_nccl_locked(c, r, "ncclCommInitRankConfig");
	pthread_mutex_unlock(&c->lock);
	if ((r != ncclSuccess && r != ncclInProgress) || wait_done(c, "ncclCommInitRankConfig", 0) < 0) {
		start_abort(c);
		set_failed(c, &op->err, broken(c) ? broken(c) : "aborted");
		return -EIO;
	}
	return 0;
}

static ncclDataType_t nccl_dtype(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_F16:
		return ncclFloat16;
	case RP_DTYPE_BF16:
		return ncclBfloat16;
	case RP_DTYPE_F64:
		return ncclFloat64;
	case RP_DTYPE_I32:
		return ncclInt32;
	case RP_DTYPE_I64:
		return ncclInt64;
	case RP_DTYPE_U8:
		return ncclUint8;
	default:
		return ncclFloat32;
	}
}

static ncclRedOp_t nccl_op(enum rp_reduce_op op)
{
	switch (op) {
	case RP_REDUCE_MAX:
		return ncclMax;
	case RP_REDUCE_AVG:
		return ncclAvg;
	case RP_REDUCE_MIN:
		return ncclMin;
	case RP_REDUCE_PROD:
		return ncclProd;
	default:
		return ncclSum;
	}
}

static void *operand_ptr(const struct rd_op *op, int slot)
{
	return (char *)op->buffers[slot]->ptr + op->compute.operands[slot].offset;
}

/* AllToAll as NCCL writes it: a group of a Send and a Recv per peer
 * (itself too: NCCL pairs them within the group). */
static ncclResult_t all_to_all(struct cuda_comm *c, struct cuda_lane *l, const char *send, char *recv, size_t n,
			       ncclDataType_t dt, size_t es)
{
	ncclResult_t r = ncclGroupStart(), end;

	for (uint32_t k = 0; r == ncclSuccess && k < c->base.nranks; k++) {
		r = ncclSend(send + k * n * es, n, dt, (int)k, c->nc, l->stream);
		if (r == ncclSuccess)
			r = ncclRecv(recv + k * n * es, n, dt, (int)k, c->nc, l->stream);
	}
	end = ncclGroupEnd();
	return r != ncclSuccess ? r : end;
}

static int collective(struct cuda_comm *c, struct cuda_lane *l, struct rd_op *op)
{
	const struct rp_compute *cp = &op->compute;
	enum rp_dtype dtype = cp->operands[RP_COMM_SEND].dtype;
	ncclDataType_t dt = nccl_dtype(dtype);
	size_t n = (size_t)rp_comm_count(cp);
	bool p2p = cp->comm.kind == RP_COMM_P2P_SEND || cp->comm.kind == RP_COMM_P2P_RECV;
	void *send = p2p ? NULL : operand_ptr(op, RP_COMM_SEND), *recv = p2p ? NULL : operand_ptr(op, RP_COMM_RECV);
	const char *what = cp->spec->method;
	ncclResult_t r;

	pthread_mutex_lock(&c->lock);
	if (broken(c) || atomic_load(&c->state) != COMM_LIVE) {
		pthread_mutex_unlock(&c->lock);
		set_failed(c, &op->err, broken(c) ? broken(c) : "aborted");
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
	case RP_COMM_ALL_TO_ALL:
		r = all_to_all(c, l, send, recv, n / c->base.nranks, dt, rp_dtype_size(dtype));
		break;
	case RP_COMM_P2P_SEND:
		r = ncclSend(operand_ptr(op, RP_COMM_PEER_BUF), n, dt, (int)cp->comm.peer, c->nc, l->stream);
		break;
	case RP_COMM_P2P_RECV:
		r = ncclRecv(operand_ptr(op, RP_COMM_PEER_BUF), n, dt, (int)cp->comm.peer, c->nc, l->stream);
		break;
	default:
		r = ncclBroadcast(send, recv, n, dt, (int)cp->comm.root, c->nc, l->stream);
		break;
	}
	if (r != ncclSuccess && r != ncclInProgress)
		fail_nccl_locked(c, r, what);
	pthread_mutex_unlock(&c->lock);
	/* Enqueued once the communicator's state leaves ncclInProgress; the
	 * work itself completes on the stream, as a GEMM's. */
	if ((r != ncclSuccess && r != ncclInProgress) || (r == ncclInProgress && wait_done(c, what, 0) < 0)) {
		start_abort(c);
		set_failed(c, &op->err, broken(c) ? broken(c) : "aborted");
		return -EIO;
	}
	return 0;
}

/* Destroy's op: finalize (the peers finalize too; the core's deadline for
 * Destroy aborts a finalize whose peers never come, which ends the wait),
 * then ncclCommDestroy here, on the caller's lane and outside the lock. */
static int destroy(struct cuda_comm *c, struct rd_op *op)
{
	ncclResult_t r;

	pthread_mutex_lock(&c->lock);
	if (broken(c) || atomic_load(&c->state) != COMM_LIVE) {
		pthread_mutex_unlock(&c->lock);
		start_abort(c);
		return 0;
	}
	r = ncclCommFinalize(c->nc);
	if (r != ncclSuccess && r != ncclInProgress)
		fail_nccl_locked(c, r, "ncclCommFinalize");
	pthread_mutex_unlock(&c->lock);
	if ((r != ncclSuccess && r != ncclInProgress) || wait_done(c, "ncclCommFinalize", 0) < 0) {
		start_abort(c);
		return 0;
	}
	end_now(c, false);
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
	const char *why;

	if (op->err.name || op->compute.comm.kind == RP_COMM_DESTROY)
		return;
	/* The stream finished, but an abort or a peer's loss cut the
	 * collective short: its output is not to be trusted. */
	if ((why = broken(c)))
		set_failed(c, &op->err, why);
}
