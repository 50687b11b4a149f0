/* The CUDA backend: device-level resources, lanes (a stream and a thread
 * each), submission and completion, lifecycle hooks and fault injection.
 * GEMM plans live in gemm.c, imports in ipc.c. */
#include "regen-config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include "daemon/backend/cuda/cuda.h"
#include "proto/errors.h"
#if REGEN_HAVE_KERNELS
#include "kernels/kernels.h"
#endif

/* ---- Errors ---------------------------------------------------------- */

static __thread struct cuda_status last_status;

struct cuda_status *cuda_last_status(void)
{
	return &last_status;
}

int cuda_status_set(const char *name, const char *fmt, ...)
{
	va_list ap;
	last_status.name = name;
	va_start(ap, fmt);
	vsnprintf(last_status.message, sizeof(last_status.message), fmt, ap);
	va_end(ap);
	return strcmp(name, RP_ERR_OUT_OF_MEMORY) == 0 ? -ENOMEM : -EIO;
}

int cuda_status_to_error(struct rp_error *err, const char *what)
{
	if (!last_status.name)
		return rp_error_set(err, RP_ERR_BACKEND, "%s failed", what);
	rp_error_set(err, last_status.name, "%s: %s", what, last_status.message);
	last_status.name = NULL;
	return -EIO;
}

bool cuda_error_is_sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorLaunchTimeout:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorECCUncorrectable:
	case cudaErrorNvlinkUncorrectable:
	case cudaErrorContextIsDestroyed:
	case cudaErrorExternalDevice:
	case cudaErrorTensorMemoryLeak:
		return true;
	default:
		return false;
	}
}

const char *cuda_error_name(cudaError_t e)
{
	if (cuda_error_is_sticky(e))
		return RP_ERR_DEVICE_LOST;
	if (e == cudaErrorMemoryAllocation)
		return RP_ERR_OUT_OF_MEMORY;
	return RP_ERR_BACKEND;
}

const char *cublas_error_name(cublasStatus_t s)
{
	if (s == CUBLAS_STATUS_ALLOC_FAILED)
		return RP_ERR_OUT_OF_MEMORY;
	return RP_ERR_BACKEND;
}

int cuda_bind(struct cuda_dev *cd, struct rp_error *err)
{
	cudaError_t e = cudaSetDevice(cd->dev->index);
	if (e != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "cudaSetDevice(%d): %s", cd->dev->index, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

struct cuda_driver_api cuda_drv;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static char driver_error[160];

static void driver_load_once(void)
{
	static const struct {
		const char *name;
		size_t offset;
	} fns[] = {
#define FN(x) { "cu" #x, offsetof(struct cuda_driver_api, x) }
		FN(GetErrorString), FN(GetErrorName), FN(MemGetAddressRange), FN(MemImportFromShareableHandle),
		FN(MemGetAllocationPropertiesFromHandle), FN(MemGetAllocationGranularity), FN(MemAddressReserve),
		FN(MemAddressFree), FN(MemMap), FN(MemUnmap), FN(MemSetAccess), FN(MemRelease),
#undef FN
	};
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		void *p = NULL;
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		/* 12000: the ABI of CUDA 12.0 (cuMemGetAddressRange is its _v2). */
		cudaError_t e = cudaGetDriverEntryPointByVersion(fns[i].name, &p, 12000, cudaEnableDefault, &q);
		if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
			snprintf(driver_error, sizeof(driver_error), "driver entry point %s: %s", fns[i].name,
				 e != cudaSuccess ? cudaGetErrorString(e) : "not found");
			memset(&cuda_drv, 0, sizeof(cuda_drv));
			return;
		}
		memcpy((char *)&cuda_drv + fns[i].offset, &p, sizeof(p));
	}
}

int cuda_driver_load(struct rp_error *err)
{
	pthread_once(&driver_once, driver_load_once);
	if (!cuda_drv.MemRelease)
		return rp_error_set(err, RP_ERR_BACKEND, "%s", driver_error);
	return 0;
}

/* Marks the device lost and tells whoever drives it, once per loss. */
static void cuda_mark_lost(struct cuda_dev *cd, const char *reason)
{
	bool was = atomic_exchange(&cd->lost, true);
	if (!was && cd->dev->on_fault)
		cd->dev->on_fault(cd->dev, reason);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define STATUS_CUDA(call) cuda_status_set(cuda_error_name(e_), "%s: %s", call, cudaGetErrorString(e_))

/* ---- Device-level resources ------------------------------------------- */

static int pool_init(struct rd_resource *res)
{
	struct cuda_pool *p = (struct cuda_pool *)res;
	cudaError_t e_ = cudaSetDevice(p->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaSetDevice");
	struct cudaMemPoolProps props;
	memset(&props, 0, sizeof(props));
	props.allocType = cudaMemAllocationTypePinned;
	props.handleTypes = cudaMemHandleTypeNone;
	props.location.type = cudaMemLocationTypeDevice;
	props.location.id = p->cd->dev->index;
	e_ = cudaMemPoolCreate(&p->pool, &props);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaMemPoolCreate");
	/* Keep freed scratch for the next call instead of unmapping it at
	 * every synchronisation; release trims it. */
	uint64_t threshold = UINT64_MAX;
	e_ = cudaMemPoolSetAttribute(p->pool, cudaMemPoolAttrReleaseThreshold, &threshold);
	if (e_ != cudaSuccess) {
		cudaMemPoolDestroy(p->pool);
		p->pool = NULL;
		return STATUS_CUDA("cudaMemPoolSetAttribute");
	}
	return 0;
}

static void pool_release(struct rd_resource *res)
{
	struct cuda_pool *p = (struct cuda_pool *)res;
	cudaSetDevice(p->cd->dev->index);
	cudaMemPoolTrimTo(p->pool, 0);
	cudaMemPoolDestroy(p->pool);
	p->pool = NULL;
}

static void pool_invalidate(struct rd_resource *res)
{
	((struct cuda_pool *)res)->pool = NULL;
}

static const struct rd_resource_ops pool_ops = {
	.kind = "cuda_mempool", .init = pool_init, .release = pool_release, .invalidate = pool_invalidate,
};

static int handle_init(struct rd_resource *res)
{
	struct cuda_handle *h = (struct cuda_handle *)res;
	cudaError_t e_ = cudaSetDevice(h->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaSetDevice");
	cublasStatus_t s = cublasLtCreate(&h->lt);
	if (s != CUBLAS_STATUS_SUCCESS)
		return cuda_status_set(cublas_error_name(s), "cublasLtCreate: %s", cublasLtGetStatusString(s));
	return 0;
}

static void handle_release(struct rd_resource *res)
{
	struct cuda_handle *h = (struct cuda_handle *)res;
	cudaSetDevice(h->cd->dev->index);
	cublasLtDestroy(h->lt);
	h->lt = NULL;
}

static void handle_invalidate(struct rd_resource *res)
{
	/* The handle may own device state of the dead context: forget it. */
	((struct cuda_handle *)res)->lt = NULL;
}

static const struct rd_resource_ops handle_ops = {
	.kind = "cublaslt_handle", .init = handle_init, .release = handle_release, .invalidate = handle_invalidate,
};

static int shared_ws_init(struct rd_resource *res)
{
	struct cuda_shared_ws *w = (struct cuda_shared_ws *)res;
	cudaError_t e_ = cudaSetDevice(w->cd->dev->index);
	if (e_ == cudaSuccess)
		e_ = cudaMalloc(&w->ptr, RD_CUDA_WORKSPACE_BYTES);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaMalloc(shared workspace)");
	return 0;
}

static void shared_ws_release(struct rd_resource *res)
{
	struct cuda_shared_ws *w = (struct cuda_shared_ws *)res;
	cudaSetDevice(w->cd->dev->index);
	cudaFree(w->ptr);
	w->ptr = NULL;
}

static void shared_ws_invalidate(struct rd_resource *res)
{
	((struct cuda_shared_ws *)res)->ptr = NULL;
}

static const struct rd_resource_ops shared_ws_ops = {
	.kind = "cuda_shared_workspace_DEBUG", .init = shared_ws_init, .release = shared_ws_release,
	.invalidate = shared_ws_invalidate,
};

static int fault_init(struct rd_resource *res)
{
	struct cuda_fault *f = (struct cuda_fault *)res;
	cudaError_t e_ = cudaSetDevice(f->cd->dev->index);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaSetDevice");
	e_ = cudaStreamCreateWithFlags(&f->stream, cudaStreamNonBlocking);
	if (e_ != cudaSuccess)
		return STATUS_CUDA("cudaStreamCreateWithFlags");
	e_ = cudaStreamCreateWithFlags(&f->lost_stream, cudaStreamNonBlocking);
	if (e_ != cudaSuccess) {
		cudaStreamDestroy(f->stream);
		return STATUS_CUDA("cudaStreamCreateWithFlags");
	}
	e_ = cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming);
	if (e_ != cudaSuccess) {
		cudaStreamDestroy(f->lost_stream);
		cudaStreamDestroy(f->stream);
		return STATUS_CUDA("cudaEventCreateWithFlags");
	}
	e_ = cudaHostAlloc((void **)&f->flag_host, sizeof(int), cudaHostAllocMapped);
	if (e_ == cudaSuccess) {
		*f->flag_host = 0;
		e_ = cudaHostGetDevicePointer((void **)&f->flag_dev, f->flag_host, 0);
		if (e_ != cudaSuccess)
			cudaFreeHost(f->flag_host);
	}
	if (e_ != cudaSuccess) {
		cudaEventDestroy(f->event);
		cudaStreamDestroy(f->lost_stream);
		cudaStreamDestroy(f->stream);
		return STATUS_CUDA("cudaHostAlloc(fault flag)");
	}
	return 0;
}

static void fault_release(struct rd_resource *res)
{
	struct cuda_fault *f = (struct cuda_fault *)res;
	cudaSetDevice(f->cd->dev->index);
	/* End a "hang" before waiting for the stream. */
	*(volatile int *)f->flag_host = 1;
	cudaStreamSynchronize(f->stream);
	cudaStreamSynchronize(f->lost_stream);
	cudaEventDestroy(f->event);
	cudaStreamDestroy(f->lost_stream);
	cudaStreamDestroy(f->stream);
	cudaFreeHost(f->flag_host);
	f->flag_host = f->flag_dev = NULL;
}

static void fault_invalidate(struct rd_resource *res)
{
	struct cuda_fault *f = (struct cuda_fault *)res;
	/* Plain host memory, still mapped until the context is reset: setting
	 * it lets a spinning kernel finish before cudaDeviceReset. */
	if (f->flag_host)
		*(volatile int *)f->flag_host = 1;
	f->flag_host = f->flag_dev = NULL;
	f->stream = f->lost_stream = NULL;
	f->event = NULL;
}

static const struct rd_resource_ops fault_ops = {
	.kind = "cuda_fault_injection", .init = fault_init, .release = fault_release, .invalidate = fault_invalidate,
};

/* ---- Lanes -------------------------------------------------------------- */

static void lane_destroy_events(struct cuda_lane *l)
{
	for (int i = 0; i < RD_CUDA_LANE_DEPTH; i++) {
		if (l->done[i])
			cudaEventDestroy(l->done[i]);
		l->done[i] = NULL;
	}
}

static int lane_init(struct rd_resource *res)
{
	struct cuda_lane *l = (struct cuda_lane *)res;
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
			lane_destroy_events(l);
			cudaStreamDestroy(l->notify);
			cudaStreamDestroy(l->stream);
			l->stream = l->notify = NULL;
			return STATUS_CUDA("cudaEventCreateWithFlags");
		}
	}
	pthread_mutex_lock(&l->cd->fault_lock);
	l->fault_seen = l->cd->fault_seq;
	pthread_mutex_unlock(&l->cd->fault_lock);
	return 0;
}

static void lane_release(struct rd_resource *res)
{
	struct cuda_lane *l = (struct cuda_lane *)res;
	cudaSetDevice(l->cd->dev->index);
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
	l->stream = l->notify = NULL;
	for (int i = 0; i < RD_CUDA_LANE_DEPTH; i++)
		l->done[i] = NULL;
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
	if (op->wait_event) {
		struct cuda_event *ev = (struct cuda_event *)op->wait_event;
		cudaError_t e = cudaStreamWaitEvent(l->stream, ev->ev, 0);
		if (e != cudaSuccess)
			return lane_fail_cuda(l, op, "cudaStreamWaitEvent(wait_event)", e);
	}
	return 0;
}

/* Runs on CUDA's callback thread once a lane's notify stream reaches it
 * (after the call's completion event): wakes the completers. It must not
 * call CUDA. */
static void CUDART_CB host_done_cb(void *arg)
{
	struct cuda_dev *cd = arg;

	pthread_mutex_lock(&cd->done_lock);
	cd->done_seq++;
	pthread_cond_broadcast(&cd->done_cond);
	pthread_mutex_unlock(&cd->done_lock);
}

/* Waits for a call's completion event. Not cudaEventSynchronize: a thread
 * blocked there is not woken when the context takes a sticky error while an
 * unrelated kernel keeps running (seen on H200, driver 580: a call queued
 * behind a spinning kernel stayed blocked after an illegal address
 * elsewhere); cudaEventQuery reports a sticky error at once. Small calls
 * finish within microseconds, so the first LANE_SPIN_NS are a busy poll.
 * After that the completer sleeps until the host function enqueued behind
 * the call wakes it (exact, unlike a polling period), and at least every
 * LANE_POLL_MS looks again, since after a fault no host function runs.
 * Gives up early when another lane marked the device lost
 * (cudaErrorNotReady then). */
#define LANE_SPIN_NS 200000
#define LANE_POLL_MS 2
static cudaError_t lane_wait(struct cuda_lane *l, cudaEvent_t done)
{
	struct cuda_dev *cd = l->cd;
	uint64_t spin_until = now_ns() + LANE_SPIN_NS;

	for (;;) {
		pthread_mutex_lock(&cd->done_lock);
		uint64_t seq = cd->done_seq;
		pthread_mutex_unlock(&cd->done_lock);
		cudaError_t e = cudaEventQuery(done);
		if (e != cudaErrorNotReady)
			return e;
		if (atomic_load(&cd->lost))
			return cudaErrorNotReady;
		if (now_ns() < spin_until) {
			__builtin_ia32_pause();
			continue;
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
};

/* Enqueues op's work on the lane's stream and records its completion
 * event; does not wait. */
static void lane_launch(struct cuda_lane *l, struct rd_op *op, struct lane_pending *p)
{
	struct cuda_dev *cd = l->cd;
	int r = 0;

	p->op = op;
	p->t0 = now_ns();
	p->enqueued = false;
	p->done = NULL;
	l->op_resets = p->resets = atomic_load(&cd->resets);
	if (atomic_load(&cd->lost)) {
		p->r = rp_error_set(&op->err, RP_ERR_DEVICE_LOST, "device %d lost its context; it needs a reset",
				    cd->dev->index);
		return;
	}
	r = cuda_bind(cd, &op->err);
	if (r == 0)
		r = lane_prepare(l, op);
	if (r == 0) {
		p->enqueued = true;
		switch (op->compute.spec->id) {
		case RP_OP_GEMM:
			r = cuda_gemm_enqueue(l, op);
			break;
		case RP_OP_ATTENTION:
		case RP_OP_ATTENTION_BACKWARD:
			r = cuda_attention_enqueue(l, op);
			break;
		default:
			r = rp_error_set(&op->err, RP_ERR_METHOD_NOT_IMPLEMENTED, "no CUDA kernel for %s",
					 op->compute.spec->method);
		}
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
		if (e == cudaSuccess)
			e = cudaStreamWaitEvent(l->notify, p->done, 0);
		if (e == cudaSuccess)
			e = cudaLaunchHostFunc(l->notify, host_done_cb, cd);
		if (e != cudaSuccess) {
			p->done = NULL;
			if (p->r == 0 || cuda_error_is_sticky(e))
				p->r = lane_fail_cuda(l, op, "recording the call's completion", e);
		}
	}
}

/* The one synchronisation point of a call: whatever it enqueued finishes
 * here, and a sticky error of the context shows up here. */
static void lane_complete(struct cuda_lane *l, struct lane_pending *p)
{
	struct cuda_dev *cd = l->cd;
	struct rd_op *op = p->op;

	if (p->done) {
		cudaError_t e = lane_wait(l, p->done);
		if (e == cudaErrorNotReady) {
			/* Another lane found the context lost while this call was
			 * in flight behind a kernel that may never finish. */
			rp_error_clear(&op->err);
			rp_error_set(&op->err, RP_ERR_DEVICE_LOST,
				     "device %d lost its context while this call was in flight on lane %u",
				     cd->dev->index, l->base.index);
		} else if (e != cudaSuccess && (p->r == 0 || cuda_error_is_sticky(e))) {
			rp_error_clear(&op->err);
			lane_fail_cuda_at(l, p->resets, op, "completing the call", e);
		}
	}
	op->elapsed_us = (now_ns() - p->t0) / 1000;
	rd_op_complete(op);
}

/* The queue is a ring of op pointers: rd_op.next belongs to the core. */
struct lane_queue {
	struct rd_op **ops;
	size_t cap, head, count;
};

struct cuda_lane_impl {
	struct cuda_lane lane;
	struct lane_queue q;
	struct lane_pending pending[RD_CUDA_LANE_DEPTH];
	unsigned pending_head, npending;
	bool launcher_done;
	pthread_t completer;
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

/* Waits, with l->lock held, until ready(li) or stopping. A call arriving
 * while the lane is busy should not pay a futex wake-up (tens of
 * microseconds, more than a small GEMM): spin unlocked for a short while
 * first, then sleep on the condition variable. */
#define LANE_IDLE_SPIN_NS 200000
static void lane_idle_wait(struct cuda_lane_impl *li, bool (*ready)(struct cuda_lane_impl *li))
{
	struct cuda_lane *l = &li->lane;

	if (ready(li) || l->stopping)
		return;
	pthread_mutex_unlock(&l->lock);
	uint64_t until = now_ns() + LANE_IDLE_SPIN_NS;
	while (now_ns() < until && !__atomic_load_n(&li->wake_seq, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	pthread_mutex_lock(&l->lock);
	while (!ready(li) && !l->stopping)
		pthread_cond_wait(&l->cond, &l->lock);
}

/* The completer's wait: it must not return on `stopping` alone (the
 * launcher may still be draining), only once completer_ready(). */
static void lane_idle_wait_completer(struct cuda_lane_impl *li)
{
	struct cuda_lane *l = &li->lane;

	pthread_mutex_unlock(&l->lock);
	uint64_t until = now_ns() + LANE_IDLE_SPIN_NS;
	while (now_ns() < until && !__atomic_load_n(&li->done_seq, __ATOMIC_ACQUIRE))
		__builtin_ia32_pause();
	pthread_mutex_lock(&l->lock);
	while (!li->npending && !li->launcher_done)
		pthread_cond_wait(&l->cond, &l->lock);
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
	pthread_mutex_lock(&l->lock);
	for (;;) {
		__atomic_store_n(&li->wake_seq, 0, __ATOMIC_RELEASE);
		lane_idle_wait(li, launcher_ready);
		if (!li->q.count && l->stopping)
			break;
		if (li->npending == RD_CUDA_LANE_DEPTH) {
			pthread_cond_wait(&l->cond, &l->lock);
			continue;
		}
		struct rd_op *op = queue_pop(&li->q);
		pthread_mutex_unlock(&l->lock);
		struct lane_pending p;
		lane_launch(l, op, &p);
		pthread_mutex_lock(&l->lock);
		li->pending[(li->pending_head + li->npending) % RD_CUDA_LANE_DEPTH] = p;
		li->npending++;
		__atomic_store_n(&li->done_seq, 1, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&l->cond);
	}
	li->launcher_done = true;
	pthread_cond_broadcast(&l->cond);
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

/* The completing thread: waits for launched calls in order. */
static void *lane_completer_main(void *arg)
{
	struct cuda_lane_impl *li = arg;
	struct cuda_lane *l = &li->lane;
	/* lane_wait's short sleeps mean what they say (default slack is 50 us). */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	pthread_mutex_lock(&l->lock);
	for (;;) {
		while (!completer_ready(li)) {
			__atomic_store_n(&li->done_seq, 0, __ATOMIC_RELEASE);
			lane_idle_wait_completer(li);
		}
		if (!li->npending)
			break;
		struct lane_pending p = li->pending[li->pending_head];
		pthread_mutex_unlock(&l->lock);
		lane_complete(l, &p);
		pthread_mutex_lock(&l->lock);
		li->pending_head = (li->pending_head + 1) % RD_CUDA_LANE_DEPTH;
		li->npending--;
		pthread_cond_broadcast(&l->cond);
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

static struct rd_lane *cuda_lane_create(struct rd_device *dev, unsigned index, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	if (cuda_bind(cd, err))
		return NULL;
	struct cuda_lane_impl *li = calloc(1, sizeof(*li));
	if (!li) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a lane");
		return NULL;
	}
	struct cuda_lane *l = &li->lane;
	l->base.device = dev;
	l->base.index = index;
	l->cd = cd;
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->cond, NULL);
	rd_resource_register(&dev->registry, &l->base.res, &lane_ops);
	if (rd_resource_ensure_valid(&l->base.res)) {
		cuda_status_to_error(err, "creating the lane's stream");
		goto fail;
	}
	int r = pthread_create(&l->thread, NULL, lane_main, li);
	if (r) {
		rp_error_set(err, RP_ERR_BACKEND, "pthread_create: %s", strerror(r));
		goto fail;
	}
	r = pthread_create(&li->completer, NULL, lane_completer_main, li);
	if (r) {
		pthread_mutex_lock(&l->lock);
		l->stopping = true;
		pthread_cond_broadcast(&l->cond);
		pthread_mutex_unlock(&l->lock);
		pthread_join(l->thread, NULL);
		rp_error_set(err, RP_ERR_BACKEND, "pthread_create: %s", strerror(r));
		goto fail;
	}
	return &l->base;
fail:
	rd_resource_unregister(&l->base.res);
	pthread_cond_destroy(&l->cond);
	pthread_mutex_destroy(&l->lock);
	free(li);
	return NULL;
}

static void cuda_lane_destroy(struct rd_lane *lane)
{
	if (!lane)
		return;
	struct cuda_lane_impl *li = (struct cuda_lane_impl *)lane;
	struct cuda_lane *l = &li->lane;
	pthread_mutex_lock(&l->lock);
	l->stopping = true;
	pthread_cond_broadcast(&l->cond);
	pthread_mutex_unlock(&l->lock);
	pthread_join(l->thread, NULL);
	pthread_join(li->completer, NULL);
	rd_resource_unregister(&l->base.res);
	pthread_cond_destroy(&l->cond);
	pthread_mutex_destroy(&l->lock);
	free(li->q.ops);
	free(li);
}

static int cuda_submit(struct rd_lane *lane, struct rd_op *op)
{
	struct cuda_lane_impl *li = (struct cuda_lane_impl *)lane;
	struct cuda_lane *l = &li->lane;
	if (atomic_load(&l->cd->lost))
		return rp_error_set(&op->err, RP_ERR_DEVICE_LOST, "device %d lost its context; it needs a reset",
				    l->cd->dev->index);
	op->lane = lane;
	pthread_mutex_lock(&l->lock);
	int r = l->stopping ? -ESHUTDOWN : queue_push(&li->q, op);
	if (r == 0) {
		__atomic_store_n(&li->wake_seq, 1, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&l->cond);
	}
	pthread_mutex_unlock(&l->lock);
	if (r)
		return rp_error_set(&op->err, r == -ENOMEM ? RP_ERR_OUT_OF_MEMORY : RP_ERR_DRAINING,
				    "lane %u cannot take work", lane->index);
	return 0;
}

void *rd_cuda_lane_last_workspace(struct rd_lane *lane)
{
	return ((struct cuda_lane *)lane)->last_workspace;
}

/* ---- Device ------------------------------------------------------------ */

static uint64_t cuda_used_bytes(struct cuda_dev *cd)
{
	uint64_t used = 0;
	if (rd_resource_is_valid(&cd->pool.res) && cd->pool.pool) {
		uint64_t reserved = 0;
		if (cudaMemPoolGetAttribute(cd->pool.pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess)
			used += reserved;
	}
	if (rd_resource_is_valid(&cd->shared_ws.res))
		used += RD_CUDA_WORKSPACE_BYTES;
	used += cuda_ipc_mapped_bytes(cd);
	return used;
}

static int cuda_open(struct rd_device *dev, struct rp_error *err)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess)
		return rp_error_set(err, RP_ERR_NO_SUCH_DEVICE, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
	if (dev->index < 0 || dev->index >= count)
		return rp_error_set(err, RP_ERR_NO_SUCH_DEVICE, "CUDA device %d does not exist (%d visible)", dev->index,
				    count);
	struct cuda_dev *cd = calloc(1, sizeof(*cd));
	if (!cd)
		return rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for the CUDA backend");
	cd->dev = dev;
	dev->backend_data = cd;
	pthread_mutex_init(&cd->fault_lock, NULL);
	cd->pool.cd = cd->handle.cd = cd->shared_ws.cd = cd->fault.cd = cd;
	if (cuda_bind(cd, err))
		goto fail;
	/* The primary context, created now so open reports a broken device. */
	e = cudaFree(NULL);
	if (e != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "creating the context of device %d: %s", dev->index,
			     cudaGetErrorString(e));
		goto fail;
	}
	if (cuda_driver_load(err) < 0)
		goto fail;
	cuda_gemm_plans_init(cd);
	cuda_ipc_init(cd);
	rd_resource_register(&dev->registry, &cd->pool.res, &pool_ops);
	rd_resource_register(&dev->registry, &cd->handle.res, &handle_ops);
#if REGEN_SHARED_WORKSPACE_DEBUG
	rd_resource_register(&dev->registry, &cd->shared_ws.res, &shared_ws_ops);
	fprintf(stderr, "regend: cuda: DEBUG build: every GEMM shares one workspace (debug_shared_workspace)\n");
#else
	(void)shared_ws_ops;
#endif
	rd_resource_register(&dev->registry, &cd->fault.res, &fault_ops);
	if (rd_resource_ensure_valid(&cd->pool.res)) {
		cuda_status_to_error(err, "scratch memory pool");
		goto fail_registered;
	}
	if (rd_resource_ensure_valid(&cd->handle.res)) {
		cuda_status_to_error(err, "cuBLASLt handle");
		goto fail_registered;
	}
	cd->baseline = cuda_used_bytes(cd);
	return 0;

fail_registered:
	rd_resource_unregister(&cd->fault.res);
#if REGEN_SHARED_WORKSPACE_DEBUG
	rd_resource_unregister(&cd->shared_ws.res);
#endif
	rd_resource_unregister(&cd->handle.res);
	rd_resource_unregister(&cd->pool.res);
	cuda_gemm_plans_finish(cd);
fail:
	dev->backend_data = NULL;
	pthread_mutex_destroy(&cd->fault_lock);
	free(cd);
	return -EIO;
}

static void cuda_close(struct rd_device *dev)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	if (!cd)
		return;
	cudaSetDevice(dev->index);
	if (!atomic_load(&cd->lost))
		cudaDeviceSynchronize();
	/* Plans were registered after these: they go first. */
	cuda_attention_finish(cd);
	cuda_gemm_plans_finish(cd);
	rd_resource_unregister(&cd->fault.res);
#if REGEN_SHARED_WORKSPACE_DEBUG
	rd_resource_unregister(&cd->shared_ws.res);
#endif
	rd_resource_unregister(&cd->handle.res);
	rd_resource_unregister(&cd->pool.res);
	dev->backend_data = NULL;
	pthread_mutex_destroy(&cd->fault_lock);
	free(cd);
}

static int cuda_release(struct rd_device *dev, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	if (cuda_bind(cd, err))
		return -EIO;
	cudaError_t e = cudaDeviceSynchronize();
	if (e != cudaSuccess) {
		if (cuda_error_is_sticky(e))
			cuda_mark_lost(cd, "release found the context lost");
		return rp_error_set(err, cuda_error_name(e), "cudaDeviceSynchronize: %s", cudaGetErrorString(e));
	}
	/* Our scratch pool was destroyed by its release; trim the default pool
	 * too in case a library allocated from it. */
	cudaMemPool_t def;
	if (cudaDeviceGetDefaultMemPool(&def, dev->index) == cudaSuccess)
		cudaMemPoolTrimTo(def, 0);
	pthread_mutex_lock(&cd->fault_lock);
	cd->fault_seq = 0;
	pthread_mutex_unlock(&cd->fault_lock);
	return 0;
}

static int cuda_reset(struct rd_device *dev, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	atomic_fetch_add(&cd->resets, 1);
	/* The registry was invalidated: nothing of ours holds a handle into the
	 * old context. A spinning "hang" kernel was told to stop then. */
	uint64_t t0 = now_ns();
	cudaSetDevice(dev->index);
	cudaError_t sync = cudaDeviceSynchronize();   /* the sticky error when lost; ends a hang otherwise */
	cudaError_t rst = cudaDeviceReset();
	cudaError_t e = cudaSuccess;
	int attempts;
	/* The first call on the new primary context can find the device busy
	 * while the old one is torn down: retry a little (REGEN_RESET_RETRY_MS,
	 * default 250 ms). On driver 580 after an illegal address it stays
	 * busy for this process: then only a new worker process helps. */
	const char *env = getenv("REGEN_RESET_RETRY_MS");
	/* After a sticky error one try tells: waiting longer has never helped,
	 * and the respawn the failure leads to is what costs the rank time. */
	int max_attempts = (env ? atoi(env) : cuda_error_is_sticky(sync) ? 25 : 250) / 25;
	if (max_attempts < 1)
		max_attempts = 1;
	for (attempts = 1; attempts <= max_attempts; attempts++) {
		e = cudaSetDevice(dev->index);
		if (e == cudaSuccess)
			e = cudaFree(NULL);
		if (e == cudaSuccess)
			break;
		cudaGetLastError();
		struct timespec ts = { 0, 25 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		if (attempts % 10 == 0)
			rst = cudaDeviceReset();
	}
	double ms = (double)(now_ns() - t0) / 1e6;
	if (e != cudaSuccess)
		return rp_error_set(err, RP_ERR_DEVICE_LOST,
				    "resetting device %d: synchronize gave %s, cudaDeviceReset %s, then the new context: %s "
				    "(%s) after %d attempts in %.0f ms",
				    dev->index, cudaGetErrorName(sync), cudaGetErrorName(rst), cudaGetErrorString(e),
				    cudaGetErrorName(e), attempts - 1, ms);
	cudaGetLastError();
#if REGEN_HAVE_KERNELS
	cudaStream_t s;
	e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
	if (e == cudaSuccess) {
		e = rk_canary(s);
		cudaStreamDestroy(s);
	}
#else
	e = cudaDeviceSynchronize();
#endif
	if (e != cudaSuccess)
		return rp_error_set(err, RP_ERR_DEVICE_LOST, "canary after reset of device %d: %s", dev->index,
				    e == cudaErrorUnknown ? "wrong result" : cudaGetErrorString(e));
	if (attempts > 1)
		fprintf(stderr, "regend: cuda: device %d: new context after %d attempts (%.0f ms)\n", dev->index, attempts,
			ms);
	pthread_mutex_lock(&cd->fault_lock);
	cd->fault_seq = 0;
	pthread_mutex_unlock(&cd->fault_lock);
	atomic_store(&cd->lost, false);
	return 0;
}

static void cuda_memory(struct rd_device *dev, uint64_t *used, uint64_t *baseline)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	*used = cuda_used_bytes(cd);
	*baseline = cd->baseline;
}

static int cuda_inject_fault(struct rd_device *dev, const char *kind, struct rp_error *err)
{
#if REGEN_HAVE_KERNELS
	struct cuda_dev *cd = cuda_dev_of(dev);
	bool lost = strcmp(kind, "device_lost") == 0;
	if (!lost && strcmp(kind, "hang") != 0)
		return rp_error_set(err, RP_ERR_INVALID_PARAMETER, "fault kind \"%s\" is not one the CUDA backend injects", kind);
	if (cuda_bind(cd, err))
		return -EIO;
	if (rd_resource_ensure_valid(&cd->fault.res))
		return cuda_status_to_error(err, "fault injection state");
	cudaError_t e;
	cudaStream_t s = cd->fault.stream;
	if (lost) {
		/* Its own stream: not queued behind a "hang", so a call blocked
		 * by one is in flight when the context faults. */
		s = cd->fault.lost_stream;
		e = rk_illegal_address(s);
	} else {
		const char *env = getenv("REGEN_HANG_SECONDS");
		double seconds = env ? strtod(env, NULL) : 600.0;
		if (!(seconds > 0))
			seconds = 600.0;
		*(volatile int *)cd->fault.flag_host = 0;
		e = rk_spin(cd->fault.flag_dev, (uint64_t)(seconds * 1e9), cd->fault.stream);
	}
	if (e == cudaSuccess)
		e = cudaEventRecord(cd->fault.event, s);
	if (e != cudaSuccess)
		return rp_error_set(err, cuda_error_name(e), "injecting %s: %s", kind, cudaGetErrorString(e));
	/* Every lane's next op waits for the fault kernel, so its
	 * synchronisation is the one that finds it. */
	pthread_mutex_lock(&cd->fault_lock);
	cd->fault_seq++;
	pthread_mutex_unlock(&cd->fault_lock);
	return 0;
#else
	(void)dev;
	(void)kind;
	rp_error_set(err, RP_ERR_METHOD_NOT_IMPLEMENTED, "built without kernels/: no fault injection");
	return -ENOTSUP;
#endif
}

void rd_cuda_set_algo_policy(struct rd_device *dev, enum rd_cuda_algo_policy policy)
{
	cuda_dev_of(dev)->policy = policy;
}

const struct rd_backend_ops rd_backend_cuda = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
	.import_buffer = cuda_import_buffer,
	.close_buffer = cuda_close_buffer,
	.import_event = cuda_import_event,
	.close_event = cuda_close_event,
	.lane_create = cuda_lane_create,
	.lane_destroy = cuda_lane_destroy,
	.submit = cuda_submit,
	.release = cuda_release,
	.reset = cuda_reset,
	.memory = cuda_memory,
	.inject_fault = cuda_inject_fault,
};
