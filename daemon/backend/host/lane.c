/* Host lanes: one thread each, running its ops in order with the reference
 * math of math.c; a small call finding its lane idle runs on the submitting
 * thread instead (run_inline). A lane's scratch grows to its largest
 * call's need. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/backend/host/common.h"
#include "daemon/backend/host/guard.h"
#include "daemon/backend/host/math.h"
#include "proto/errors.h"

struct host_lane {
	struct rd_lane base;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct rd_op *head, *tail;
	bool busy;                     /* an op is running (on the lane's thread or inline) */
	bool stop;
	void *scratch;                 /* grows to the largest call's need */
	size_t scratch_size;
};

struct guarded_call {
	const struct rp_compute *c;
	void **ptr;
	void *scratch;
	size_t scratch_size;
	struct rp_error *err;
};

/* The values the parser could not see are checked first, under the same
 * guard: they live in the client's memory too. */
static int run_guarded(void *arg)
{
	struct guarded_call *g = arg;
	int r = rd_host_check(g->c, g->ptr, g->err);

	return r < 0 ? r : rd_host_run(g->c, g->ptr, g->scratch, g->scratch_size);
}

/* Runs the op's math over the client's memory; on failure sets op->err. */
static void compute_op(struct host_lane *lane, struct rd_op *op)
{
	struct rd_device *dev = lane->base.device;
	const struct rp_compute *c = &op->compute;
	void *ptr[RP_OP_OPERANDS_MAX] = { 0 };
	size_t need;
	uintptr_t fault = 0;
	int r;

	if (c->spec->id == RP_OP_COMM) {
		host_comm_run(op);
		return;
	}
	if (c->spec->id == RP_OP_PROGRAM) {
		host_program_run(op);
		return;
	}
	need = rd_host_scratch_size(c);

	for (unsigned i = 0; i < c->spec->noperands; i++)
		if (op->buffers[i])
			ptr[i] = (char *)op->buffers[i]->ptr + c->operands[i].offset;
	if (dev->max_scratch && need > dev->max_scratch) {
		rp_err_limit_exceeded(&op->err, "scratch", (long long)dev->max_scratch,
				      "the call needs %zu bytes of scratch, more than the %llu one call may take "
				      "(max_scratch_mib)", need, (unsigned long long)dev->max_scratch);
		return;
	}
	if (need > lane->scratch_size) {
		void *s = realloc(lane->scratch, need);
		if (!s) {
			rp_err_out_of_memory(&op->err, dev->index, "no host memory for %zu bytes of scratch", need);
			return;
		}
		atomic_fetch_add(&hd(dev)->scratch_bytes, need - lane->scratch_size);
		lane->scratch = s;
		lane->scratch_size = need;
	}
	struct guarded_call g = { c, ptr, lane->scratch, lane->scratch_size, &op->err };
	r = rd_host_guarded(run_guarded, &g, &fault);
	/* One large call must not leave its scratch to the lane for good. */
	if (lane->scratch_size > HOST_SCRATCH_KEEP) {
		atomic_fetch_sub(&hd(dev)->scratch_bytes, lane->scratch_size);
		free(lane->scratch);
		lane->scratch = NULL;
		lane->scratch_size = 0;
	}
	if (r == -EFAULT) {
		/* Name the operand whose memory went away under us. */
		for (unsigned i = 0; i < c->spec->noperands; i++) {
			struct rd_buffer *b = op->buffers[i];
			if (b && fault >= (uintptr_t)b->ptr && fault < (uintptr_t)b->ptr + b->size) {
				rp_err_invalid_operand(&op->err, c->spec->operands[i].name, "its memory is gone",
						       "%s's buffer is no longer backed by its file (it was truncated); "
						       "the call did not complete", c->spec->operands[i].name);
				return;
			}
		}
		rp_err_backend_error(&op->err, dev->index, "host compute touched memory that is gone (address %#lx)",
				     (unsigned long)fault);
	} else if (r < 0 && op->err.name) {
		/* rd_host_check refused a value and named it. */
	} else if (r < 0) {
		if (r == -ENOMEM)
			rp_err_out_of_memory(&op->err, dev->index, "host compute ran out of memory");
		else
			rp_err_backend_error(&op->err, dev->index, "host compute failed: %s", strerror(-r));
	}
}

/* Runs op and says when it began and ended (elapsed_us, and the stage
 * times a ring reports). */
static void run_op(struct host_lane *lane, struct rd_op *op)
{
	atomic_store_explicit(&op->launched_ns, rd_now_ns(), memory_order_relaxed);
	compute_op(lane, op);
	op->finished_ns = rd_now_ns();
	op->elapsed_us = (op->finished_ns - op->launched_ns) / 1000u;
}

static void *lane_thread(void *arg)
{
	struct host_lane *lane = arg;
	struct rd_device *dev = lane->base.device;

	for (;;) {
		struct rd_op *op;

		pthread_mutex_lock(&lane->lock);
		while (!lane->head && !lane->stop)
			pthread_cond_wait(&lane->cond, &lane->lock);
		op = lane->head;
		if (!op) {
			pthread_mutex_unlock(&lane->lock);
			break;
		}
		lane->head = op->next;
		if (!lane->head)
			lane->tail = NULL;
		lane->busy = true;
		pthread_mutex_unlock(&lane->lock);

		/* A hung kernel: nothing but the process's death ends it. */
		while (atomic_load(&hd(dev)->hang))
			sleep(1);
		if (atomic_load(&hd(dev)->lost)) {
			host_report_lost(dev, RD_FAULT_LOST, "the simulated context is lost (injected device_lost), found by a call");
			rp_error_set(&op->err, RP_ERR_DEVICE_LOST, "device %d lost its context before the call ran",
				     dev->index);
			rp_error_add_int(&op->err, "device", dev->index);
			rp_error_add_int(&op->err, "generation", (long long)atomic_load(&dev->generation));
		} else {
			run_op(lane, op);
		}
		pthread_mutex_lock(&lane->lock);
		lane->busy = false;
		pthread_mutex_unlock(&lane->lock);
		rd_op_complete(op);
	}
	return NULL;
}

static int lane_init(struct rd_resource *res)
{
	struct host_lane *lane = (struct host_lane *)res;

	lane->stop = false;
	return -pthread_create(&lane->thread, NULL, lane_thread, lane);
}

/* Called with no op queued (the core drains first). */
static void lane_release(struct rd_resource *res)
{
	struct host_lane *lane = (struct host_lane *)res;

	pthread_mutex_lock(&lane->lock);
	lane->stop = true;
	pthread_cond_signal(&lane->cond);
	pthread_mutex_unlock(&lane->lock);
	pthread_join(lane->thread, NULL);
	if (lane->scratch_size)
		atomic_fetch_sub(&hd(lane->base.device)->scratch_bytes, lane->scratch_size);
	free(lane->scratch);
	lane->scratch = NULL;
	lane->scratch_size = 0;
}

static const struct rd_resource_ops lane_ops = {
	.kind = "host_lane", .init = lane_init, .release = lane_release, .invalidate = lane_release,
};

struct rd_lane *host_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err)
{
	struct host_lane *lane = calloc(1, sizeof(*lane));

	if (!lane) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a lane");
		return NULL;
	}
	lane->base.device = dev;
	lane->base.index = index;
	pthread_mutex_init(&lane->lock, NULL);
	pthread_cond_init(&lane->cond, NULL);
	rd_resource_register(&dev->registry, &lane->base.res, &lane_ops);
	return &lane->base;
}

void host_lane_destroy(struct rd_lane *base)
{
	struct host_lane *lane = (struct host_lane *)base;

	rd_resource_unregister(&base->res);
	pthread_mutex_destroy(&lane->lock);
	pthread_cond_destroy(&lane->cond);
	free(lane);
}

/* Multiply-adds of a call, roughly: what decides whether it may run on
 * the submitting thread. */
static double call_cost(const struct rp_compute *c)
{
	const struct rp_attention *a = &c->attention;

	switch (c->spec->id) {
	case RP_OP_GEMM:
		return (double)c->gemm.m * (double)c->gemm.n * (double)c->gemm.k;
	case RP_OP_ATTENTION:
		return (double)a->batch * a->heads * a->seq_q * a->seq_kv * (a->head_dim + a->head_dim_v);
	case RP_OP_LAYER_NORM:
		return 8.0 * (double)c->layer_norm.rows * (double)c->layer_norm.n;
	case RP_OP_LAYER_NORM_BACKWARD:
		return 16.0 * (double)c->layer_norm.rows * (double)c->layer_norm.n;
	default:
		return 2.0 * a->batch * a->heads * a->seq_q * a->seq_kv * (a->head_dim + a->head_dim_v);
	}
}

/* A call this small (a 32^3 GEMM: tens of microseconds) runs on the
 * submitting thread, the worker's loop, when its lane is idle: two thread
 * hand-offs (to the lane and back) would cost more than the call. */
#define INLINE_COST_MAX 32768.0

/* Runs op now if the lane is idle and it is small; false if it must queue.
 * Never a communicator's op: it waits for its peers, whose calls this very
 * loop has yet to read. Never a program's Run: its nodes add up to more
 * than the loop may spend. */
static bool run_inline(struct host_lane *lane, struct rd_op *op)
{
	struct rd_device *dev = lane->base.device;

	if (op->compute.spec->id == RP_OP_COMM || op->compute.spec->id == RP_OP_PROGRAM || call_cost(&op->compute) > INLINE_COST_MAX || atomic_load(&hd(dev)->hang) || atomic_load(&hd(dev)->lost))
		return false;
	pthread_mutex_lock(&lane->lock);
	if (lane->head || lane->busy) {
		pthread_mutex_unlock(&lane->lock);
		return false;
	}
	lane->busy = true;
	pthread_mutex_unlock(&lane->lock);
	run_op(lane, op);
	pthread_mutex_lock(&lane->lock);
	lane->busy = false;
	pthread_mutex_unlock(&lane->lock);
	rd_op_complete(op);
	return true;
}

int host_submit(struct rd_lane *base, struct rd_op *op)
{
	struct host_lane *lane = (struct host_lane *)base;
	int r = rd_resource_ensure_valid(&base->res);

	if (r < 0) {
		rp_error_set(&op->err, RP_ERR_BACKEND, "cannot start the lane: %s", strerror(-r));
		return r;
	}
	op->lane = base;
	if (run_inline(lane, op))
		return 0;
	op->next = NULL;
	pthread_mutex_lock(&lane->lock);
	if (lane->tail)
		lane->tail->next = op;
	else
		lane->head = op;
	lane->tail = op;
	pthread_cond_signal(&lane->cond);
	pthread_mutex_unlock(&lane->lock);
	return 0;
}
