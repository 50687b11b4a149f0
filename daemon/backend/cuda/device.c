/* SPDX-License-Identifier: Apache-2.0 */
/* The device-level resources every lane shares: the scratch pool (GEMM
 * workspaces, attention scratch), the cuBLASLt handle, the one shared
 * workspace of -Ddebug_shared_workspace=true, and the fault-injection state
 * (its streams, the event lanes wait on, the flag that ends a "hang"). */
#include "regen-config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "daemon/backend/cuda/common.h"

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

void cuda_device_resources_register(struct cuda_dev *cd)
{
	struct rd_registry *reg = &cd->dev->registry;

	cd->pool.cd = cd->handle.cd = cd->shared_ws.cd = cd->fault.cd = cd;
	rd_resource_register(reg, &cd->pool.res, &pool_ops);
	rd_resource_register(reg, &cd->handle.res, &handle_ops);
#if REGEN_SHARED_WORKSPACE_DEBUG
	rd_resource_register(reg, &cd->shared_ws.res, &shared_ws_ops);
	fprintf(stderr, "regend: cuda: DEBUG build: every GEMM shares one workspace (debug_shared_workspace)\n");
#else
	(void)shared_ws_ops;
#endif
	rd_resource_register(reg, &cd->fault.res, &fault_ops);
}

void cuda_device_resources_unregister(struct cuda_dev *cd)
{
	rd_resource_unregister(&cd->fault.res);
#if REGEN_SHARED_WORKSPACE_DEBUG
	rd_resource_unregister(&cd->shared_ws.res);
#endif
	rd_resource_unregister(&cd->handle.res);
	rd_resource_unregister(&cd->pool.res);
}
