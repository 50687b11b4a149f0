/* SPDX-License-Identifier: Apache-2.0 */
/* Lanes: one connection's ordered work on a CUDA stream of its own. A
 * launcher thread takes the lane's ops in order and enqueues them without
 * waiting (at most RD_CUDA_LANE_DEPTH in flight); a call that finds its
 * lane idle is enqueued by the submitting thread itself (launch_inline); a
 * completer thread waits for each call's completion event, in order, and
 * hands the op back. An
 * injected fault kernel is waited for before a lane's next op, so that op's
 * synchronisation is the one that finds it. The work itself comes from the
 * enqueue functions the device's table names (cuda_dev.enqueue). */
#include "regen-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

static void lane_destroy_events(struct cuda_lane *l)
{
	for (int i = 0; i < RD_CUDA_LANE_DEPTH; i++) {
		if (l->done[i])
			cudaEventDestroy(l->done[i]);
		l->done[i] = NULL;
	}
	if (l->faults)
		cudaFreeHost(l->faults);
	l->faults = l->faults_dev = NULL;
}

static int lane_init(struct rd_resource *res)
{
	struct cuda_lane *l = (struct cuda_lane *)res;
	const char *what;
	cudaError_t e_ = cudaSetDevice(l->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaSetDevice");
	e_ = cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaStreamCreateWithFlags");
	e_ = cudaStreamCreateWithFlags(&l->notify, cudaStreamNonBlocking);
	if (e_ != cudaSuccess) {
		cudaStreamDestroy(l->stream);
		l->stream = NULL;
		return STATUS_CUDA("cudaStreamCreateWithFlags");
	}
	/* One per call in flight on the lane; polled by lane_wait(), never
	 * synchronised on. */
	for (int i = 0; i < RD_CUDA_LANE_DEPTH; i++) {
		e_ = cudaEventCreateWithFlags(&l->done[i], cudaEventDisableTiming);
		if (e_ != cudaSuccess) {
			what = "cudaEventCreateWithFlags";
			goto fail;
		}
	}
	e_ = cudaHostAlloc((void **)&l->faults, RD_CUDA_LANE_DEPTH * sizeof(*l->faults), cudaHostAllocMapped);
	if (e_ == cudaSuccess)
		e_ = cudaHostGetDevicePointer((void **)&l->faults_dev, l->faults, 0);
	if (e_ != cudaSuccess) {
		what = "cudaHostAlloc(the lane's fault reports)";
		goto fail;
	}
	memset(l->faults, 0, RD_CUDA_LANE_DEPTH * sizeof(*l->faults));
	pthread_mutex_lock(&l->cd->fault_lock);
	l->fault_seen = l->cd->fault_seq;
	pthread_mutex_unlock(&l->cd->fault_lock);
	return 0;
fail:
	lane_destroy_events(l);
	cudaStreamDestroy(l->notify);
	cudaStreamDestroy(l->stream);
	l->stream = l->notify = NULL;
	return STATUS_CUDA(what);
}

static void lane_release(struct rd_resource *res)
{
	struct cuda_lane *l = (struct cuda_lane *)res;
	cudaSetDevice(l->cd->dev->index);
	cuda_scratch_drop_kept(l);
	cudaStreamSynchronize(l->stream);
	cudaStreamSynchronize(l->notify);
	lane_destroy_events(l);
	cudaStreamDestroy(l->notify);
	cudaStreamDestroy(l->stream);
	l->stream = l->notify = NULL;
}

static void lane_invalidate(struct rd_resource *res)
{
	struct cuda_lane *l = (struct cuda_lane *)res;
	cuda_scratch_forget_kept(l);
	l->stream = l->notify = NULL;
	for (int i = 0; i < RD_CUDA_LANE_DEPTH; i++)
		l->done[i] = NULL;
	l->faults = l->faults_dev = NULL;
}

static const struct rd_resource_ops lane_ops = {
	.kind = "lane", .init = lane_init, .release = lane_release, .invalidate = lane_invalidate,
};

/* Sets op->err from a CUDA failure; a sticky one marks the device lost. */
static int lane_fail_cuda_at(struct cuda_lane *l, uint64_t op_resets, struct rd_op *op, const char *what, cudaError_t e)
{
	char reason[256];
	snprintf(reason, sizeof(reason), "%s on lane %u: %s (%s)", what, l->base.index, cudaGetErrorString(e),
		 cudaGetErrorName(e));
	rp_error_set(&op->err, cuda_error_name(e), "%s", reason);
	if (cuda_error_is_sticky(e) && atomic_load(&l->cd->resets) == op_resets)
		cuda_mark_lost(l->cd, reason);
	return -EIO;
}

/* From the launching thread, for the op it is launching. */
static int lane_fail_cuda(struct cuda_lane *l, struct rd_op *op, const char *what, cudaError_t e)
{
	return lane_fail_cuda_at(l, l->op_resets, op, what, e);
}

static int lane_prepare(struct cuda_lane *l, struct rd_op *op)
{
	struct cuda_dev *cd = l->cd;
	if (rd_resource_ensure_valid(&l->base.res))
		return cuda_status_to_error(&op->err, "lane stream");
	for (int i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		if (op->buffers[i] && rd_resource_ensure_valid(&op->buffers[i]->res))
			return cuda_status_to_error(&op->err, "restoring a buffer mapping");
	}
	if (op->wait_event && rd_resource_ensure_valid(&op->wait_event->res))
		return cuda_status_to_error(&op->err, "restoring wait_event");
	if (op->signal_event && rd_resource_ensure_valid(&op->signal_event->res))
		return cuda_status_to_error(&op->err, "restoring signal_event");

	/* A fault kernel enqueued since this lane's last op goes first. */
	pthread_mutex_lock(&cd->fault_lock);
	uint64_t seq = cd->fault_seq;
	pthread_mutex_unlock(&cd->fault_lock);
	if (seq != l->fault_seen) {
		l->fault_seen = seq;
		if (rd_resource_ensure_valid(&cd->fault.res))
			return cuda_status_to_error(&op->err, "fault injection state");
		cudaError_t e = cudaStreamWaitEvent(l->stream, cd->fault.event, 0);
		if (e != cudaSuccess)
			return lane_fail_cuda(l, op, "cudaStreamWaitEvent(injected fault)", e);
	}
	if (op->wait_event && !cd->tuning.host_client_waits) {
		struct cuda_event *ev = (struct cuda_event *)op->wait_event;
		cudaError_t e = cudaStreamWaitEvent(l->stream, ev->ev, 0);
		if (e != cudaSuccess)
			return lane_fail_cuda(l, op, "cudaStreamWaitEvent(wait_event)", e);
	}
	return 0;
}

/* How the completer learns that a call finished. It polls the call's
 * completion event for a while (a small call finishes within microseconds,
 * and waking a sleeping thread costs tens), then sleeps until a host
 * function behind the event wakes it. By default that host function is
 * enqueued by the completer itself when it stops spinning, so a call that
 * finishes within the spin costs no more than its event record (a host
 * function and a cross-stream wait are two more driver calls per launch);
 * cuda_wake = launch enqueues one with every call instead (to measure
 * against). cuda_spin_us sets the spin. */
#define LANE_POLL_MS 2
/* How long a completer holds its next event query back at most while a
 * launch is in progress on its device. A query takes the context's lock,
 * which a launch takes for each of its driver calls: polled without pause
 * beside a pipelined lane's launches, the queries made each launch 2-5 µs
 * slower (H200: cublasLtMatmul 10.3 µs in the worker against 5.7 in
 * process), and a round of calls started that much later. A call that ends
 * while the next is being launched is seen at most this much later; its
 * GPU is busy with the next meanwhile. */
#define LANE_QUERY_HOLDOFF_NS 20000

/* Runs on CUDA's callback thread once a lane's notify stream reaches it
 * (after a call's completion event): wakes the completers. It must not
 * call CUDA. */
static void CUDART_CB host_done_cb(void *arg)
{
	struct cuda_dev *cd = arg;

	pthread_mutex_lock(&cd->done_lock);
	cd->done_seq++;
	pthread_cond_broadcast(&cd->done_cond);
	pthread_mutex_unlock(&cd->done_lock);
}

/* Enqueues the host function that wakes the completers once `done` is
 * reached. A failure here is not the call's: the completer then looks
 * every LANE_POLL_MS, and the call's own event says what happened. */
static void lane_arm_wake(struct cuda_lane *l, cudaEvent_t done)
{
	if (!l->notify)
		return;
	if (cudaStreamWaitEvent(l->notify, done, 0) == cudaSuccess)
		(void)cudaLaunchHostFunc(l->notify, host_done_cb, l->cd);
}

/* Waits for a call's completion event. Not cudaEventSynchronize: a thread
 * blocked there is not woken when the context takes a sticky error while an
 * unrelated kernel keeps running (seen on H200, driver 580: a call queued
 * behind a spinning kernel stayed blocked after an illegal address
 * elsewhere); cudaEventQuery reports a sticky error at once. After the
 * spin the completer sleeps until the host function behind the call wakes
 * it (exact, unlike a polling period), and at least every LANE_POLL_MS
 * looks again, since after a fault no host function runs. Gives up early
 * when another lane marked the device lost (cudaErrorNotReady then). */
static cudaError_t lane_wait(struct cuda_lane *l, cudaEvent_t done, uint64_t *queries)
{
	struct cuda_dev *cd = l->cd;
	uint64_t last_query = rd_now_ns(), spin_until = last_query + cd->tuning.spin_ns;
	bool armed = cd->tuning.wake_at_launch;

	for (;;) {
		if (atomic_load_explicit(&cd->launching, memory_order_relaxed) &&
		    rd_now_ns() - last_query < LANE_QUERY_HOLDOFF_NS && !atomic_load(&cd->lost)) {
			__builtin_ia32_pause();
			continue;
		}
		pthread_mutex_lock(&cd->done_lock);
		uint64_t seq = cd->done_seq;
		pthread_mutex_unlock(&cd->done_lock);
		cudaError_t e = cudaEventQuery(done);
		last_query = rd_now_ns();
		(*queries)++;
		if (e != cudaErrorNotReady)
			return e;
		if (atomic_load(&cd->lost))
			return cudaErrorNotReady;
		if (rd_now_ns() < spin_until) {
			__builtin_ia32_pause();
			continue;
		}
		if (!armed) {
			/* seq was read before the query: a wake-up from here on
			 * is seen. */
			lane_arm_wake(l, done);
			armed = true;
		}
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += LANE_POLL_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&cd->done_lock);
		while (cd->done_seq == seq)
			if (pthread_cond_timedwait(&cd->done_cond, &cd->done_lock, &until) != 0)
				break;
		pthread_mutex_unlock(&cd->done_lock);
	}
}

/* A launched call waiting for its completion event. */
struct lane_pending {
	struct rd_op *op;
	cudaEvent_t done;          /* a copy: an invalidate forgets the lane's */
	uint64_t t0, resets;
	int r;
	bool enqueued;
	bool alone;                /* the only call in flight when the completer took it */
	bool shared;               /* it entered the device's share: leaves it once complete */
	struct rd_share_ticket ticket;   /* what it entered the share with */
};

static void lane_profile_print(const struct cuda_lane *l)
{
	const struct cuda_launch_profile *pr = &l->profile;
	char line[512];
	int n = 0;

	if (!l->cd->tuning.launch_profile || pr->calls == 0)
		return;
	for (int i = 0; i < CUDA_LAUNCH_PHASES && n >= 0 && (size_t)n < sizeof(line); i++)
		n += snprintf(line + n, sizeof(line) - (size_t)n, " %s %.2f", cuda_launch_phase_names[i],
			      (double)pr->ns[i] / 1e3 / (double)pr->calls);
	fprintf(stderr,
		"regend: cuda lane %u launch phases over %llu calls (%llu over 1 ms left out: plans built), mean µs:%s\n",
		l->base.index, (unsigned long long)pr->calls, (unsigned long long)pr->slow, line);
	if (pr->completions)
		fprintf(stderr,
			"regend: cuda lane %u completions of %llu calls alone in flight (under 1 ms), mean: launched -> completer waits "
			"%.2f µs, its wait %.2f µs, %.1f event queries\n",
			l->base.index, (unsigned long long)pr->completions, (double)pr->handoff_ns / 1e3 / (double)pr->completions,
			(double)pr->wait_ns / 1e3 / (double)pr->completions, (double)pr->queries / (double)pr->completions);
}

/* Enqueues op's work on the lane's stream and records its completion
 * event; does not wait. */
static void lane_launch_counted(struct cuda_lane *l, struct rd_op *op, struct lane_pending *p)
{
	struct cuda_dev *cd = l->cd;
	int r = 0;

	p->op = op;
	p->t0 = rd_now_ns();
	l->profile.last_ns = p->t0;
	memset(l->profile.cur, 0, sizeof(l->profile.cur));
	p->enqueued = false;
	p->done = NULL;
	l->op_resets = p->resets = atomic_load(&cd->resets);
	p->r = cuda_refuse_if_lost(cd, &op->err);
	if (p->r)
		return;
	r = cuda_bind(cd, &op->err);
	cuda_launch_mark(l, CUDA_PHASE_BIND);
	if (r == 0)
		r = lane_prepare(l, op);
	cuda_launch_mark(l, CUDA_PHASE_PREPARE);
	/* The lane's stream, a buffer's mapping, an event: a sticky error
	 * found while restoring them is the device's. */
	if (r != 0)
		cuda_check_failure(cd, &op->err, p->resets);
	if (r == 0) {
		p->enqueued = true;
		cuda_enqueue_fn *enqueue = cuda_enqueue_of(cd, op);
		if (enqueue) {
			r = enqueue(l, op);
		} else {
			rp_error_set(&op->err, RP_ERR_METHOD_NOT_IMPLEMENTED, "no CUDA kernel for %s",
				     op->compute.spec->method);
			r = -EOPNOTSUPP;
		}
		/* A plan, a library handle, the call's scratch allocation or
		 * its launch: whatever failed, the context may be why. */
		if (r != 0)
			cuda_check_failure(cd, &op->err, p->resets);
		if (r == 0 && op->signal_event) {
			struct cuda_event *ev = (struct cuda_event *)op->signal_event;
			cudaError_t e = cudaEventRecord(ev->ev, l->stream);
			if (e != cudaSuccess)
				r = lane_fail_cuda(l, op, "cudaEventRecord(signal_event)", e);
		}
	}
	p->r = r;
	if (p->enqueued && l->stream) {
		p->done = l->done[l->next_done];
		l->next_done = (l->next_done + 1) % RD_CUDA_LANE_DEPTH;
		cudaError_t e = cudaEventRecord(p->done, l->stream);
		if (e == cudaSuccess && cd->tuning.wake_at_launch)
			e = cudaStreamWaitEvent(l->notify, p->done, 0);
		if (e == cudaSuccess && cd->tuning.wake_at_launch)
			e = cudaLaunchHostFunc(l->notify, host_done_cb, cd);
		if (e != cudaSuccess) {
			p->done = NULL;
			if (p->r == 0 || cuda_error_is_sticky(e))
				p->r = lane_fail_cuda(l, op, "recording the call's completion", e);
		}
	}
	if (p->enqueued)
		atomic_store_explicit(&op->launched_ns, rd_now_ns(), memory_order_relaxed);
	/* Its signal_event will fire when the work does: the caller may go on
	 * (the completer has not seen this op yet, so nothing races). */
	if (p->r == 0 && p->done && op->signal_event && op->launched)
		op->launched(op);
	if (cd->tuning.launch_profile) {
		/* A launch that built a plan (milliseconds to seconds) would hide
		 * the steady state in the means: counted apart. */
		cuda_launch_mark(l, CUDA_PHASE_RECORD);
		if (l->profile.last_ns - p->t0 > 1000000) {
			l->profile.slow++;
		} else {
			for (int i = 0; i < CUDA_LAUNCH_PHASES; i++)
				l->profile.ns[i] += l->profile.cur[i];
			l->profile.calls++;
		}
	}
}

/* cuda_client_wait = host: how the lane's thread waits for a client's
 * event before it launches the call behind it. No stream of regend's waits
 * on a client's work then, so nothing of the device waits for a client that
 * died with its work unfinished (orphan.c fails such a wait instead of
 * replacing the device), and a kernel's first load, which synchronizes the
 * context (lazy loading), waits for regend's own work only. It queries the
 * event, briefly in a spin (as the completer does: held back while a
 * launch holds the context's lock), then between sleeps that grow to
 * CLIENT_WAIT_SLEEP_MAX_NS: a Run behind a rank's step is launched at most
 * that much after the rank's work is done, beside the ~140 µs the GPU takes
 * to switch from the rank's context to the worker's (DESIGN.md). */
#define CLIENT_WAIT_SPIN_NS 20000
#define CLIENT_WAIT_SLEEP_MAX_NS 50000

static bool lane_abandoned(struct cuda_lane *l, struct rd_op *op)
{
	if (!atomic_load_explicit(&l->abandoned, memory_order_acquire))
		return false;
	rp_error_set(&op->err, RP_ERR_BACKEND, "%s", l->abandoned_why);
	return true;
}

/* 0 once op's wait_event is done (or the device is lost: the launch finds
 * that); -ECANCELED with op->err set when the lane was abandoned; -EIO when
 * the event cannot be asked. */
static int lane_wait_client(struct cuda_lane *l, struct rd_op *op)
{
	struct cuda_dev *cd = l->cd;
	struct cuda_event *ev = (struct cuda_event *)op->wait_event;
	uint64_t start = rd_now_ns(), last_query = 0, sleep_ns = 1000;

	if (cuda_bind(cd, &op->err))
		return -EIO;
	if (rd_resource_ensure_valid(&op->wait_event->res))
		return cuda_status_to_error(&op->err, "restoring wait_event");
	for (;;) {
		if (lane_abandoned(l, op))
			return -ECANCELED;
		if (atomic_load(&cd->lost))
			return 0;
		uint64_t now = rd_now_ns();
		if (atomic_load_explicit(&cd->launching, memory_order_relaxed) && now - last_query < LANE_QUERY_HOLDOFF_NS) {
			__builtin_ia32_pause();
			continue;
		}
		cudaError_t e = cudaEventQuery(ev->ev);
		last_query = rd_now_ns();
		if (e == cudaSuccess)
			return 0;
		if (e != cudaErrorNotReady) {
			/* The client's event, not this context: nothing is marked
			 * lost here (a launch would find a sticky error of ours). */
			rp_error_set(&op->err, cuda_error_name(e), "waiting for the client's wait_event on lane %u: %s (%s)",
				     l->base.index, cudaGetErrorString(e), cudaGetErrorName(e));
			return -EIO;
		}
		if (last_query - start < CLIENT_WAIT_SPIN_NS) {
			__builtin_ia32_pause();
			continue;
		}
		struct timespec ts = { 0, (long)sleep_ns };
		nanosleep(&ts, NULL);
		sleep_ns = sleep_ns * 2 < CLIENT_WAIT_SLEEP_MAX_NS ? sleep_ns * 2 : CLIENT_WAIT_SLEEP_MAX_NS;
	}
}

/* Whether op takes part in the device's share among uids (../share.h):
 * not a communicator's call, which waits for its peers. A call that waits
 * on a client's event does (every call could carry one): the share lets a
 * uid with one running past its bounds, a call each linger, should the
 * event wait for a call of the uid's that the share holds back. */
static bool lane_shares(const struct rd_op *op)
{
	return op->comm == NULL;
}

/* What op asks the device's share for: its least time; whether it may
 * wait on the GPU for a client's work (while any call that waits on a
 * client's event is in flight on the device, a call behind it on its
 * lane's stream waits too: its time is the client's, not the queue a uid
 * that comes would find); whether it waits on a client's event itself
 * (with cuda_client_wait = stream: on the GPU, holding its share). */
static struct rd_share_call share_call(struct cuda_lane *l, const struct rd_op *op)
{
	return (struct rd_share_call){ .least_ns = op->work_ns,
				       .untimed = atomic_load_explicit(&l->cd->client_waits, memory_order_relaxed) != 0,
				       .waits = op->wait_event != NULL && !l->cd->tuning.host_client_waits };
}

/* As lane_launch_counted, counted among the device's launches in progress
 * (the completers' queries wait for it: LANE_QUERY_HOLDOFF_NS), once the
 * device's share among uids lets it run (`entered`: the caller saw to
 * that, and the share gave it ticket); with cuda_client_wait = host, once
 * its wait_event is done (before it enters the share: a client's work
 * holds no share), and never on an abandoned lane: such a call goes to the
 * completer unlaunched, with its error. */
static void lane_launch(struct cuda_lane *l, struct rd_op *op, struct lane_pending *p, bool entered,
			struct rd_share_ticket ticket)
{
	int r = 0;

	if (l->cd->tuning.host_client_waits) {
		if (lane_abandoned(l, op))
			r = -ECANCELED;
		else if (op->wait_event)
			r = lane_wait_client(l, op);
	}
	if (r) {
		*p = (struct lane_pending){ .op = op, .t0 = rd_now_ns(), .resets = atomic_load(&l->cd->resets), .r = r,
					    .shared = entered, .ticket = ticket };
		return;
	}
	if (!entered && lane_shares(op)) {
		ticket = rd_share_enter(&l->cd->share, l->base.uid, share_call(l, op));
		entered = true;
	}
	atomic_fetch_add_explicit(&l->cd->launching, 1, memory_order_relaxed);
	lane_launch_counted(l, op, p);
	atomic_fetch_sub_explicit(&l->cd->launching, 1, memory_order_relaxed);
	p->shared = entered;
	p->ticket = ticket;
}

/* What cuda_submit counted op in for (its work, its client wait), given
 * back: at its completion, or where the lane could not take it. */
static void op_counted_out(struct cuda_lane *l, struct rd_op *op)
{
	cuda_work_return(l, op);
	if (op->wait_event)
		atomic_fetch_sub(&l->cd->client_waits, 1);
}

/* The one synchronisation point of a call: whatever it enqueued finishes
 * here, and a sticky error of the context shows up here. */
static void lane_complete(struct cuda_lane *l, struct lane_pending *p)
{
	struct cuda_dev *cd = l->cd;
	struct rd_op *op = p->op;

	if (p->done) {
		uint64_t queries = 0, wait_start = rd_now_ns();
		cudaError_t e = lane_wait(l, p->done, &queries);
		op->finished_ns = rd_now_ns();
		/* A call behind others waits for them first: only a lone call's
		 * hand-off is the completer's own. */
		uint64_t launched = l->cd->tuning.launch_profile && p->alone ? atomic_load(&op->launched_ns) : 0;
		if (launched && op->finished_ns - launched < 1000000) {
			struct cuda_launch_profile *pr = &l->profile;
			pr->completions++;
			pr->handoff_ns += wait_start > launched ? wait_start - launched : 0;
			pr->wait_ns += op->finished_ns - wait_start;
			pr->queries += queries;
		}
		if (e == cudaErrorNotReady) {
			/* Another lane found the context lost while this call was
			 * in flight behind a kernel that may never finish. */
			rp_error_clear(&op->err);
			rp_error_set(&op->err, RP_ERR_DEVICE_LOST,
				     "device %d lost its context while this call was in flight on lane %u",
				     cd->dev->index, l->base.index);
		} else if (e != cudaSuccess && atomic_load(&cd->resets) != p->resets) {
			/* The context this call ran in was reset under it (a
			 * hang's reset): its events are gone with it. */
			rp_error_clear(&op->err);
			rp_error_set(&op->err, RP_ERR_DEVICE_LOST,
				     "device %d was reset while this call was in flight on lane %u (%s)", cd->dev->index,
				     l->base.index, cudaGetErrorName(e));
		} else if (e != cudaSuccess && (p->r == 0 || cuda_error_is_sticky(e))) {
			rp_error_clear(&op->err);
			lane_fail_cuda_at(l, p->resets, op, "completing the call", e);
			cuda_check_failure(cd, &op->err, p->resets);
		}
	}
#if REGEN_HAVE_NCCL
	if (op->comm)
		cuda_comm_completed(op);
#endif
	if (op->run && p->done)
		cuda_program_completed(op);
	op->elapsed_us = (rd_now_ns() - p->t0) / 1000;
	if (p->shared)
		rd_share_leave(&cd->share, l->base.uid, p->ticket);
	op_counted_out(l, op);
	rd_op_complete(op);
}

/* The queue is a ring of op pointers: rd_op.next belongs to the core. */
struct lane_queue {
	struct rd_op **ops;
	size_t cap, head, count;
};

struct cuda_lane_impl {
	struct cuda_lane lane;
	pthread_t thread;      /* the launcher */
	pthread_t completer;
	pthread_mutex_t lock;
	/* One condition each, and a flag saying its thread sleeps there: a
	 * launch then wakes only the thread that waits for it, and only when
	 * it sleeps. With one condition broadcast at every launch, each small
	 * call paid a futex wake of the idle launcher while holding the lock
	 * the completer needed to start its wait. */
	pthread_cond_t launcher_cond;   /* work queued, room in flight, the inline launch over, or stopping */
	pthread_cond_t completer_cond;  /* a call launched, or the launcher done */
	bool launcher_asleep, completer_asleep;
	bool stopping;
	struct lane_queue q;
	struct lane_pending pending[RD_CUDA_LANE_DEPTH];
	unsigned pending_head, npending;
	bool launcher_done;
	bool launching;        /* an op is being launched (by the launcher or inline): the next waits */
	int wake_seq;          /* set by submit: ends the launcher's spin */
	int done_seq;          /* set by a launch: ends the completer's spin */
};

static int queue_push(struct lane_queue *q, struct rd_op *op)
{
	if (q->count == q->cap) {
		size_t ncap = q->cap ? q->cap * 2 : 16;
		struct rd_op **n = malloc(ncap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		for (size_t i = 0; i < q->count; i++)
			n[i] = q->ops[(q->head + i) % q->cap];
		free(q->ops);
		q->ops = n;
		q->cap = ncap;
		q->head = 0;
	}
	q->ops[(q->head + q->count) % q->cap] = op;
	q->count++;
	return 0;
}

static struct rd_op *queue_pop(struct lane_queue *q)
{
	if (!q->count)
		return NULL;
	struct rd_op *op = q->ops[q->head];
	q->head = (q->head + 1) % q->cap;
	q->count--;
	return op;
}

/* With li->lock held. */
static void wake_launcher(struct cuda_lane_impl *li)
{
	if (li->launcher_asleep)
		pthread_cond_signal(&li->launcher_cond);
}

static void wake_completer(struct cuda_lane_impl *li)
{
	if (li->completer_asleep)
		pthread_cond_signal(&li->completer_cond);
}

static void launcher_sleep(struct cuda_lane_impl *li)
{
	li->launcher_asleep = true;
	pthread_cond_wait(&li->launcher_cond, &li->lock);
	li->launcher_asleep = false;
}

static void completer_sleep(struct cuda_lane_impl *li)
{
	li->completer_asleep = true;
	pthread_cond_wait(&li->completer_cond, &li->lock);
	li->completer_asleep = false;
}

/* Both threads go: each wakes whether it said it sleeps or not. */
static void wake_both_to_stop(struct cuda_lane_impl *li)
{
	li->stopping = true;
	pthread_cond_broadcast(&li->launcher_cond);
	pthread_cond_broadcast(&li->completer_cond);
}

/* Waits, with li->lock held, until ready(li) or stopping. A call arriving
 * while the lane is busy should not pay a futex wake-up (tens of
 * microseconds, more than a small GEMM): spin unlocked for a short while
 * first, then sleep on the condition variable. */
#define LANE_IDLE_SPIN_NS 200000
static void lane_idle_wait(struct cuda_lane_impl *li, bool (*ready)(struct cuda_lane_impl *li))
{
	if (ready(li) || li->stopping)
		return;
	pthread_mutex_unlock(&li->lock);
	uint64_t until = rd_now_ns() + LANE_IDLE_SPIN_NS;
	while (rd_now_ns() < until && !__atomic_load_n(&li->wake_seq, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	pthread_mutex_lock(&li->lock);
	while (!ready(li) && !li->stopping)
		launcher_sleep(li);
}

/* With li->lock held, as the completer is about to sleep with nothing in
 * flight: the lane's kept scratch goes back to the pool, so that an idle
 * lane holds no device memory. It holds the lane's launch meanwhile (a
 * launch that comes waits, as for any launch under way). */
static void lane_drop_scratch_idle(struct cuda_lane_impl *li)
{
	if (li->launching || li->q.count || li->npending || li->stopping)
		return;
	li->launching = true;
	pthread_mutex_unlock(&li->lock);
	cuda_scratch_drop_kept(&li->lane);
	pthread_mutex_lock(&li->lock);
	li->launching = false;
	if (li->q.count)
		wake_launcher(li);
}

/* The completer's wait: it must not return on `stopping` alone (the
 * launcher may still be draining), only once completer_ready(). */
static void lane_idle_wait_completer(struct cuda_lane_impl *li)
{
	pthread_mutex_unlock(&li->lock);
	uint64_t until = rd_now_ns() + LANE_IDLE_SPIN_NS;
	while (rd_now_ns() < until && !__atomic_load_n(&li->done_seq, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	pthread_mutex_lock(&li->lock);
	lane_drop_scratch_idle(li);
	while (!li->npending && !li->launcher_done)
		completer_sleep(li);
}

/* With li->lock held, after a launch by either thread: the call goes to
 * the completer, and a call queued meanwhile (which waited for this launch
 * to end) to the launcher, unless the launcher is the one that launched. */
static void launch_over(struct cuda_lane_impl *li, const struct lane_pending *p)
{
	li->launching = false;
	li->pending[(li->pending_head + li->npending) % RD_CUDA_LANE_DEPTH] = *p;
	li->npending++;
	__atomic_store_n(&li->done_seq, 1, __ATOMIC_RELEASE);
	wake_completer(li);
	if (li->q.count)
		wake_launcher(li);
}

static bool launcher_ready(struct cuda_lane_impl *li)
{
	return li->q.count && li->npending < RD_CUDA_LANE_DEPTH;
}

static bool completer_ready(struct cuda_lane_impl *li)
{
	return li->npending || li->launcher_done;
}

/* The launching thread: takes ops in order and enqueues them without
 * waiting, so a client that pipelines its calls keeps the GPU busy; at most
 * RD_CUDA_LANE_DEPTH calls are launched and not yet completed. */
static void *lane_main(void *arg)
{
	struct cuda_lane_impl *li = arg;
	struct cuda_lane *l = &li->lane;
	pthread_mutex_lock(&li->lock);
	for (;;) {
		__atomic_store_n(&li->wake_seq, 0, __ATOMIC_RELEASE);
		lane_idle_wait(li, launcher_ready);
		if (!li->q.count && li->stopping)
			break;
		if (li->npending == RD_CUDA_LANE_DEPTH) {
			launcher_sleep(li);
			continue;
		}
		if (li->launching) {
			/* The submitting thread launches one inline: after it. */
			launcher_sleep(li);
			continue;
		}
		struct rd_op *op = queue_pop(&li->q);
		li->launching = true;
		pthread_mutex_unlock(&li->lock);
		struct lane_pending p;
		lane_launch(l, op, &p, false, (struct rd_share_ticket){ 0 });
		pthread_mutex_lock(&li->lock);
		launch_over(li, &p);
	}
	li->launcher_done = true;
	pthread_cond_broadcast(&li->completer_cond);
	pthread_mutex_unlock(&li->lock);
	return NULL;
}

/* The completing thread: waits for launched calls in order. */
static void *lane_completer_main(void *arg)
{
	struct cuda_lane_impl *li = arg;
	struct cuda_lane *l = &li->lane;
	/* Its event queries, waits and context checks are the lane's device's:
	 * unbound, a thread's runtime calls go to device 0 (a context made
	 * there in every worker, and a loss asked of the wrong GPU). */
	cudaSetDevice(l->cd->dev->index);
	/* lane_wait's short sleeps mean what they say (default slack is 50 us). */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	pthread_mutex_lock(&li->lock);
	for (;;) {
		while (!completer_ready(li)) {
			__atomic_store_n(&li->done_seq, 0, __ATOMIC_RELEASE);
			lane_idle_wait_completer(li);
		}
		if (!li->npending)
			break;
		struct lane_pending p = li->pending[li->pending_head];
		p.alone = li->npending == 1;
		pthread_mutex_unlock(&li->lock);
		lane_complete(l, &p);
		pthread_mutex_lock(&li->lock);
		li->pending_head = (li->pending_head + 1) % RD_CUDA_LANE_DEPTH;
		li->npending--;
		/* Room in flight: only a launcher with calls queued waits for it. */
		if (li->q.count)
			wake_launcher(li);
	}
	pthread_mutex_unlock(&li->lock);
	return NULL;
}

struct rd_lane *cuda_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	uint64_t resets = atomic_load(&cd->resets);
	if (cuda_refuse_if_lost(cd, err))
		return NULL;
	if (cuda_bind(cd, err)) {
		cuda_check_failure(cd, err, resets);
		return NULL;
	}
	struct cuda_lane_impl *li = calloc(1, sizeof(*li));
	if (!li) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a lane");
		return NULL;
	}
	struct cuda_lane *l = &li->lane;
	l->base.device = dev;
	l->base.index = index;
	l->cd = cd;
	pthread_mutex_init(&li->lock, NULL);
	pthread_mutex_init(&l->scratch_lock, NULL);
	pthread_cond_init(&li->launcher_cond, NULL);
	pthread_cond_init(&li->completer_cond, NULL);
	rd_resource_register(&dev->registry, &l->base.res, &lane_ops);
	if (rd_resource_ensure_valid(&l->base.res)) {
		cuda_status_to_error(err, "creating the lane's stream");
		cuda_check_failure(cd, err, resets);
		goto fail;
	}
	int r = pthread_create(&li->thread, NULL, lane_main, li);
	if (r) {
		rp_error_set(err, RP_ERR_BACKEND, "pthread_create: %s", strerror(r));
		goto fail;
	}
	r = pthread_create(&li->completer, NULL, lane_completer_main, li);
	if (r) {
		pthread_mutex_lock(&li->lock);
		wake_both_to_stop(li);
		pthread_mutex_unlock(&li->lock);
		pthread_join(li->thread, NULL);
		rp_error_set(err, RP_ERR_BACKEND, "pthread_create: %s", strerror(r));
		goto fail;
	}
	return &l->base;
fail:
	rd_resource_unregister(&l->base.res);
	pthread_cond_destroy(&li->launcher_cond);
	pthread_cond_destroy(&li->completer_cond);
	pthread_mutex_destroy(&l->scratch_lock);
	pthread_mutex_destroy(&li->lock);
	free(li);
	return NULL;
}

void cuda_lane_destroy(struct rd_lane *lane)
{
	if (!lane)
		return;
	struct cuda_lane_impl *li = (struct cuda_lane_impl *)lane;
	struct cuda_lane *l = &li->lane;
	pthread_mutex_lock(&li->lock);
	wake_both_to_stop(li);
	pthread_mutex_unlock(&li->lock);
	pthread_join(li->thread, NULL);
	pthread_join(li->completer, NULL);
	lane_profile_print(l);
	rd_resource_unregister(&l->base.res);
	pthread_cond_destroy(&li->launcher_cond);
	pthread_cond_destroy(&li->completer_cond);
	pthread_mutex_destroy(&l->scratch_lock);
	pthread_mutex_destroy(&li->lock);
	free(li->q.ops);
	free(li);
}

/* Launches op on this thread if the lane is idle: nothing queued, nothing
 * being launched, room among the calls in flight. Its completion goes to
 * the completer as the launcher's do. Launched on the submitting thread
 * (the worker's loop) instead of handed to the launcher: one thread
 * hand-off less per call (cuda_inline_launch = false turns it off, to
 * measure against). */
static bool launch_inline(struct cuda_lane_impl *li, struct rd_op *op)
{
	struct lane_pending p;

	/* A communicator's Init and Destroy wait for NCCL (and its peers), and
	 * a new attention problem builds its cuDNN plan (0.4–1 s of NVRTC, many
	 * times that when autotuning: long enough for the supervisor's
	 * heartbeat to find the loop stuck and kill the worker, seen on the
	 * H200): on the lane's thread, never the worker's loop. A GEMM's plan
	 * is a cuBLASLt heuristic query, microseconds to milliseconds. Nor a
	 * call that waits on a client's event: CUDA loads a kernel at its
	 * first launch (lazy loading), and loading synchronizes the context,
	 * so a launch behind a wait on work the client has not done (a kernel
	 * of its that runs for seconds, or a dead process's) spins in the
	 * driver until that work is done: seen on the H100, a fresh worker's
	 * loop stuck 2 s in its first GEMM behind a rank's 20 s kernel, the
	 * supervisor killing it for its heartbeat, over and over. Nor any
	 * call while another waits so: the load waits for that wait too
	 * (client_waits counts op itself where it waits). With
	 * cuda_client_wait = host no stream waits on a client, but the call
	 * that waits does so on its lane's thread. */
	const struct cuda_tuning *t = &li->lane.cd->tuning;
	if (!t->inline_launch || op->comm || op->compute.spec->id != RP_OP_GEMM ||
	    (t->host_client_waits ? op->wait_event != NULL
				  : atomic_load_explicit(&li->lane.cd->client_waits, memory_order_relaxed) != 0))
		return false;
	pthread_mutex_lock(&li->lock);
	if (li->stopping || li->launching || li->q.count || li->npending == RD_CUDA_LANE_DEPTH) {
		pthread_mutex_unlock(&li->lock);
		return false;
	}
	/* The loop never waits for the share: a call it may not run now goes
	 * to the launcher, which does. */
	struct rd_share_ticket ticket;
	if (!rd_share_try_enter(&li->lane.cd->share, li->lane.base.uid, share_call(&li->lane, op), &ticket)) {
		pthread_mutex_unlock(&li->lock);
		return false;
	}
	li->launching = true;
	pthread_mutex_unlock(&li->lock);
	lane_launch(&li->lane, op, &p, true, ticket);
	pthread_mutex_lock(&li->lock);
	launch_over(li, &p);
	pthread_mutex_unlock(&li->lock);
	return true;
}

int cuda_submit(struct rd_lane *lane, struct rd_op *op)
{
	struct cuda_lane_impl *li = (struct cuda_lane_impl *)lane;
	struct cuda_lane *l = &li->lane;
	if (cuda_refuse_if_lost(l->cd, &op->err))
		return -EIO;
	op->lane = lane;
	if (cuda_work_take(l, op))
		return -E2BIG;
	if (op->wait_event)
		atomic_fetch_add(&l->cd->client_waits, 1);
	if (launch_inline(li, op))
		return 0;
	pthread_mutex_lock(&li->lock);
	int r = li->stopping ? -ESHUTDOWN : queue_push(&li->q, op);
	if (r == 0) {
		__atomic_store_n(&li->wake_seq, 1, __ATOMIC_RELEASE);
		wake_launcher(li);
	}
	pthread_mutex_unlock(&li->lock);
	if (r) {
		op_counted_out(l, op);
		rp_error_set(&op->err, r == -ENOMEM ? RP_ERR_OUT_OF_MEMORY : RP_ERR_DRAINING,
			     "lane %u cannot take work", lane->index);
		return r;
	}
	return 0;
}

void *rd_cuda_lane_last_workspace(struct rd_lane *lane)
{
	return ((struct cuda_lane *)lane)->last_workspace;
}

int cuda_lane_abandon_client_waits(struct rd_lane *lane, const char *why)
{
	struct cuda_lane *l = (struct cuda_lane *)lane;

	if (!l->cd->tuning.host_client_waits)
		return -ENOTSUP;
	snprintf(l->abandoned_why, sizeof(l->abandoned_why), "%s", why);
	atomic_store_explicit(&l->abandoned, true, memory_order_release);
	return 0;
}
