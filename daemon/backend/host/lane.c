/* SPDX-License-Identifier: Apache-2.0 */
/* Host lanes: one thread each, running its ops in order with the reference
 * math of math.c; a small call finding its lane idle runs on the submitting
 * thread instead (run_inline). Either way a call runs once the device's
 * share lets it: its CPUs go round the uids rather than the lanes
 * (../share.h). A lane's scratch grows to its largest call's need.
 *
 * The deadline's budget: regend counts the device as hung when a call is
 * still running call_deadline_ms after it was submitted, and respawns the
 * worker, every user's ids and calls with it. A call that needs little
 * memory and much time (attention over stride-0 K/V of 2^22 keys: minutes)
 * would do that at will. So each call's work is estimated as it is
 * submitted: its multiply-adds at the pace the reference math showed at
 * open, behind the work queued on its lane, with the work of every lane
 * shared among the CPUs. A call that would not finish within half of
 * call_deadline_ms is refused (io.regen.LimitExceeded {resource: "work",
 * limit: call_deadline_ms}); half, because the pace is measured on a small
 * GEMM that fits the caches and larger calls run slower. An estimate can
 * still be wrong: a call that hangs the device anyway is charged to its
 * uid (daemon/hang_charge.h). REGEN_HOST_NS_PER_MAC (a test knob, env.h) sets the
 * pace the estimate assumes instead of the measured one, so that tests can
 * make such a call. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/backend/host/common.h"
#include "daemon/env.h"
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
	uint64_t backlog_ns;           /* work_ns of its ops submitted and not finished */
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

void host_lane_calibrate(struct rd_device *dev)
{
	enum { N = 64 };
	static float a[N * N], b[N * N], d[N * N];
	const struct rp_operand m = { .dtype = RP_DTYPE_F32, .rank = 2, .shape = { N, N }, .strides = { N, 1 } };
	struct rp_compute c = {
		.spec = &rp_op_gemm,
		.operands = { [RP_GEMM_A] = m, [RP_GEMM_B] = m, [RP_GEMM_D] = m },
		.present = { [RP_GEMM_A] = true, [RP_GEMM_B] = true, [RP_GEMM_D] = true },
		.gemm = { .alpha = 1, .m = N, .n = N, .k = N },
	};
	void *ptr[RP_OP_OPERANDS_MAX] = { [RP_GEMM_A] = a, [RP_GEMM_B] = b, [RP_GEMM_D] = d };
	uint64_t best = UINT64_MAX;
	cpu_set_t set;

	/* The fastest of a few: the pace this machine allows at best. */
	for (int i = 0; i < 5; i++) {
		uint64_t t0 = rd_now_ns();
		rd_host_run(&c, ptr, NULL, 0);
		uint64_t t = rd_now_ns() - t0;
		best = t < best ? t : best;
	}
	hd(dev)->ns_per_mac = rd_env_number(RD_ENV_HOST_NS_PER_MAC, 1e-12, 1e6, (double)best / ((double)N * N * N));
	hd(dev)->cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? (unsigned)CPU_COUNT(&set) : 1;
	if (!hd(dev)->cpus)
		hd(dev)->cpus = 1;
}

/* Refuses op when the work of the lanes, its own with it, would keep it
 * running past regend's deadline; else counts its work in. */
static int take_budget(struct host_lane *lane, struct rd_op *op)
{
	struct rd_device *dev = lane->base.device;
	struct host_device *h = hd(dev);
	uint64_t budget_ns = (uint64_t)dev->call_deadline_ms * 1000000u / 2, ahead, all;

	op->work_ns = (uint64_t)(rd_host_macs(&op->compute) * h->ns_per_mac);
	if (!op->work_ns)
		return 0;
	pthread_mutex_lock(&lane->lock);
	ahead = lane->backlog_ns;
	all = atomic_load(&h->backlog_ns);
	/* At worst it runs while every CPU is busy with all the lanes' work
	 * (all / cpus), and alone the rest of its lane's. */
	double finish_ns = (double)(all + op->work_ns) / h->cpus + (double)(ahead + op->work_ns);
	if (dev->call_deadline_ms && finish_ns > (double)budget_ns) {
		pthread_mutex_unlock(&lane->lock);
		rp_err_limit_exceeded(&op->err, "work", dev->call_deadline_ms,
				      "%s would take about %.0f s on the host backend (%.3g multiply-adds, behind %.0f s "
				      "of work queued on %s lane and %.0f s on device %d's %u CPUs), past half of the "
				      "%u ms within which every call must finish (call_deadline_ms); split it into smaller "
				      "calls",
				      op->compute.spec->method, (double)op->work_ns / 1e9, rd_host_macs(&op->compute),
				      (double)ahead / 1e9, "its", (double)all / 1e9, dev->index, h->cpus,
				      dev->call_deadline_ms);
		op->work_ns = 0;
		return -E2BIG;
	}
	lane->backlog_ns += op->work_ns;
	atomic_fetch_add(&h->backlog_ns, op->work_ns);
	pthread_mutex_unlock(&lane->lock);
	return 0;
}

/* Its work is done (or never ran): out of the budget. Under lane->lock. */
static void return_budget(struct host_lane *lane, struct rd_op *op)
{
	if (!op->work_ns)
		return;
	lane->backlog_ns -= op->work_ns;
	atomic_fetch_sub(&hd(lane->base.device)->backlog_ns, op->work_ns);
	op->work_ns = 0;
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
		} else if (op->compute.spec->id == RP_OP_COMM) {
			run_op(lane, op);   /* waits for its peers: no slot held meanwhile */
		} else {
			struct rd_share_ticket ticket =
				rd_share_enter(&hd(dev)->share, lane->base.uid, (struct rd_share_call){ 0 });
			run_op(lane, op);
			rd_share_leave(&hd(dev)->share, lane->base.uid, ticket);
		}
		pthread_mutex_lock(&lane->lock);
		lane->busy = false;
		return_budget(lane, op);
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

/* A call this small (a 32^3 GEMM: tens of microseconds) runs on the
 * submitting thread, the worker's loop, when its lane is idle: two thread
 * hand-offs (to the lane and back) would cost more than the call. */
#define INLINE_COST_MAX 32768.0

/* Runs op now if the lane is idle and it is small; false if it must queue.
 * Never a communicator's op: it waits for its peers, whose calls this very
 * loop has yet to read. */
static bool run_inline(struct host_lane *lane, struct rd_op *op)
{
	struct rd_device *dev = lane->base.device;

	double cost = rd_host_macs(&op->compute);

	if (cost == 0 || cost > INLINE_COST_MAX || atomic_load(&hd(dev)->hang) || atomic_load(&hd(dev)->lost))
		return false;
	pthread_mutex_lock(&lane->lock);
	if (lane->head || lane->busy) {
		pthread_mutex_unlock(&lane->lock);
		return false;
	}
	struct rd_share_ticket ticket;
	if (!rd_share_try_enter(&hd(dev)->share, lane->base.uid, (struct rd_share_call){ 0 }, &ticket)) {
		pthread_mutex_unlock(&lane->lock);
		return false;
	}
	lane->busy = true;
	pthread_mutex_unlock(&lane->lock);
	run_op(lane, op);
	rd_share_leave(&hd(dev)->share, lane->base.uid, ticket);
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
	r = take_budget(lane, op);
	if (r < 0)
		return r;
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
