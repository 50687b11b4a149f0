/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend on top: the ops table the worker drives, the module's
 * entry point, and the lifecycle hooks (open, close, release, reset,
 * memory, fault injection). Lanes live in lane.c, GEMM in gemm.c,
 * attention in attention.c, LayerNorm in layernorm.c, NCCL communicators
 * in comm.c, imports in ipc.c, the device-level resources in device.c,
 * the health watch in health.c. */
#include "regen-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/env.h"
#include "daemon/options.h"
#include "proto/errors.h"
#if REGEN_HAVE_KERNELS
#include "kernels/kernels.h"
#endif

/* What the lanes call for each operation. */
static cuda_enqueue_fn *const enqueue_table[CUDA_OP_KINDS] = {
	[RP_OP_GEMM] = cuda_gemm_enqueue,
	[RP_OP_ATTENTION] = cuda_attention_enqueue,
	[RP_OP_ATTENTION_BACKWARD] = cuda_attention_enqueue,
	[RP_OP_LAYER_NORM] = cuda_layer_norm_enqueue,
	[RP_OP_LAYER_NORM_BACKWARD] = cuda_layer_norm_enqueue,
	[RP_OP_QUANTIZE] = cuda_fp8_enqueue,
	[RP_OP_TRANSPOSE_QUANTIZE] = cuda_fp8_enqueue,
	[RP_OP_SCALE_UPDATE] = cuda_fp8_enqueue,
#if REGEN_HAVE_NCCL
	[RP_OP_COMM] = cuda_comm_enqueue,
#endif
	[RP_OP_PROGRAM] = cuda_program_enqueue,
};

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
	used += atomic_load(&cd->program_bytes);
	return used;
}

/* The oldest GPU regen's kernels are built for (kernels/meson.build). */
#define MIN_COMPUTE_CAPABILITY 80

/* The errors of a driver that cannot serve this runtime: the node's
 * software, not the GPU, is what must change. */
static bool driver_mismatch(cudaError_t e)
{
	return e == cudaErrorInsufficientDriver || e == cudaErrorSystemDriverMismatch ||
	       e == cudaErrorCompatNotSupportedOnDevice || e == cudaErrorStubLibrary;
}

/* Says which, in words that name what to install: the device is then
 * unsupported (backend.h's -ENOTSUP), not failed. */
static int driver_unsupported(struct rp_error *err, const char *what, cudaError_t e)
{
	int driver = 0, runtime = 0;

	cudaDriverGetVersion(&driver);
	cudaRuntimeGetVersion(&runtime);
	if (e == cudaErrorStubLibrary)
		rp_error_set(err, RP_ERR_BACKEND, "%s: %s: the CUDA toolkit's stub libcuda.so was loaded, not the NVIDIA "
			     "driver's: take the toolkit's stubs folder out of the library path", what, cudaGetErrorString(e));
	else if (driver == 0)
		rp_error_set(err, RP_ERR_BACKEND, "%s: %s: no NVIDIA driver is installed (no libcuda.so.1 found): install "
			     "a driver for CUDA %d.%d or newer (README, Platforms)", what, cudaGetErrorString(e),
			     runtime / 1000, runtime % 1000 / 10);
	else if (driver < runtime)
		rp_error_set(err, RP_ERR_BACKEND, "%s: %s: the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d "
			     "runtime regen's CUDA backend uses: upgrade the driver (README, Platforms)", what,
			     cudaGetErrorString(e), driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
	else
		rp_error_set(err, RP_ERR_BACKEND, "%s: %s: the NVIDIA driver's libraries (CUDA %d.%d) do not fit its "
			     "loaded kernel module or this GPU: reload the driver (or reboot) after a driver upgrade",
			     what, cudaGetErrorString(e), driver / 1000, driver % 1000 / 10);
	return -ENOTSUP;
}

/* The options this backend reads (daemon/options.h), or their defaults
 * where a test drives it without any. */
static void read_tuning(struct cuda_dev *cd, const struct rd_options *o)
{
	struct cuda_tuning *t = &cd->tuning;

	if (!o) {
		*t = (struct cuda_tuning){ .spin_ns = RD_CUDA_SPIN_US_DEFAULT * 1000ull,
					   .share_alone_ns = RD_CUDA_SHARE_ALONE_US_DEFAULT * 1000ull,
					   .inline_launch = true, .reset_retry_ms = -1, .nvml = true };
		return;
	}
	t->spin_ns = (uint64_t)o->cuda_spin_us * 1000u;
	t->share_alone_ns = o->cuda_share_alone_us ? (uint64_t)o->cuda_share_alone_us * 1000u : UINT64_MAX;
	t->wake_at_launch = strcmp(o->cuda_wake, "launch") == 0;
	t->inline_launch = o->cuda_inline_launch;
	t->host_client_waits = strcmp(o->cuda_client_wait, "host") == 0;
	t->launch_profile = o->cuda_launch_profile;
	t->reset_retry_ms = o->reset_retry_ms;
	t->attention_autotune = o->attention_autotune;
	t->program_gemm_slots = o->program_gemm_slots;
	t->nvml = o->nvml;
}

static int cuda_open(struct rd_device *dev, struct rp_error *err)
{
	int count = 0, major = 0, minor = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (driver_mismatch(e))
		return driver_unsupported(err, "cudaGetDeviceCount", e);
	if (e != cudaSuccess) {
		rp_error_set(err, RP_ERR_NO_SUCH_DEVICE, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
		return -ENODEV;
	}
	if (dev->index < 0 || dev->index >= count) {
		rp_error_set(err, RP_ERR_NO_SUCH_DEVICE, "CUDA device %d does not exist (%d visible)", dev->index,
			     count);
		return -ENODEV;
	}
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev->index) == cudaSuccess &&
	    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev->index) == cudaSuccess &&
	    major * 10 + minor < MIN_COMPUTE_CAPABILITY) {
		rp_error_set(err, RP_ERR_BACKEND, "CUDA device %d has compute capability %d.%d; regen needs %d.%d or "
			     "newer (its kernels are built for sm_%d and up: README, Platforms)", dev->index, major, minor,
			     MIN_COMPUTE_CAPABILITY / 10, MIN_COMPUTE_CAPABILITY % 10, MIN_COMPUTE_CAPABILITY);
		return -ENOTSUP;
	}
	struct cuda_dev *cd = calloc(1, sizeof(*cd));
	if (!cd) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for the CUDA backend");
		return -ENOMEM;
	}
	cd->dev = dev;
	dev->backend_data = cd;
	cd->enqueue = enqueue_table;
	read_tuning(cd, dev->options);
	pthread_mutex_init(&cd->fault_lock, NULL);
	if (cuda_bind(cd, err))
		goto fail;
	/* The primary context, created now so open reports a broken device. */
	e = cudaFree(NULL);
	if (driver_mismatch(e)) {
		int r = driver_unsupported(err, "creating the context", e);
		dev->backend_data = NULL;
		pthread_mutex_destroy(&cd->fault_lock);
		free(cd);
		return r;
	}
	if (e != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "creating the context of device %d: %s%s", dev->index,
			     cudaGetErrorString(e), cuda_mps_hint(e));
		goto fail;
	}
	if (cuda_driver_load(err) < 0)
		goto fail;
	if (cuda_health_open(cd) < 0) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for the health watch");
		goto fail;
	}
	cuda_gemm_plans_init(cd);
	cuda_work_open(cd);
	rd_share_init(&cd->share, RD_CUDA_SHARE_CAPACITY, RD_CUDA_SHARE_LINGER_NS, cd->tuning.share_alone_ns);
	cuda_ipc_init(cd);
	cuda_device_resources_register(cd);
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
	cuda_device_resources_unregister(cd);
	cuda_gemm_plans_finish(cd);
	cuda_health_close(cd);
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
	cuda_health_close(cd);
	cudaSetDevice(dev->index);
	if (!atomic_load(&cd->lost))
		cudaDeviceSynchronize();
	/* Plans were registered after these: they go first. */
	cuda_attention_finish(cd);
#if REGEN_HAVE_NCCL
	cuda_comm_finish(cd);
#endif
	cuda_gemm_plans_finish(cd);
	cuda_device_resources_unregister(cd);
	dev->backend_data = NULL;
	pthread_mutex_destroy(&cd->fault_lock);
	free(cd);
}

static int cuda_release(struct rd_device *dev, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
#if REGEN_HAVE_NCCL
	cuda_comm_quiesce(cd);
#endif
	if (cuda_bind(cd, err))
		return -EIO;
	cudaError_t e = cudaDeviceSynchronize();
	if (e != cudaSuccess) {
		if (cuda_error_is_sticky(e))
			cuda_mark_lost(cd, "release found the context lost");
		rp_error_set(err, cuda_error_name(e), "cudaDeviceSynchronize: %s", cudaGetErrorString(e));
		return -EIO;
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

static int reset_context(struct rd_device *dev, struct cuda_dev *cd, struct rp_error *err)
{
	/* The registry was invalidated: nothing of ours holds a handle into the
	 * old context. A spinning "hang" kernel was told to stop then. */
	uint64_t t0 = rd_now_ns();
	cudaSetDevice(dev->index);
	cudaError_t sync = cudaDeviceSynchronize();   /* the sticky error when lost; ends a hang otherwise */
	/* CUDA's word on a sticky error: the process must be terminated and
	 * relaunched. cudaDeviceReset and the new context's first call cost
	 * ~95 ms on driver 580 and then fail anyway: fail at once, and the
	 * respawn that follows is what the rank waits for (an explicit
	 * reset_retry_ms still tries, for a driver that behaves otherwise). */
	if (cuda_error_is_sticky(sync) && cd->tuning.reset_retry_ms < 0) {
		rp_error_set(err, RP_ERR_DEVICE_LOST,
			     "device %d's context is lost (%s, sticky): only a new worker process gets a new one",
			     dev->index, cudaGetErrorName(sync));
		return -EIO;
	}
	cudaError_t rst = cudaDeviceReset();
	cudaError_t e = cudaSuccess;
	int attempts;
	/* The first call on the new primary context can find the device busy
	 * while the old one is torn down: retry a little (reset_retry_ms,
	 * default 250 ms). */
	int retry_ms = cd->tuning.reset_retry_ms >= 0 ? cd->tuning.reset_retry_ms : 250;
	int max_attempts = retry_ms / 25;
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
	double ms = (double)(rd_now_ns() - t0) / 1e6;
	if (e != cudaSuccess) {
		rp_error_set(err, RP_ERR_DEVICE_LOST,
			     "resetting device %d: synchronize gave %s, cudaDeviceReset %s, then the new context: %s "
			     "(%s) after %d attempts in %.0f ms%s",
			     dev->index, cudaGetErrorName(sync), cudaGetErrorName(rst), cudaGetErrorString(e),
			     cudaGetErrorName(e), attempts - 1, ms, cuda_mps_hint(e));
		return -EIO;
	}
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
	if (e != cudaSuccess) {
		rp_error_set(err, RP_ERR_DEVICE_LOST, "canary after reset of device %d: %s", dev->index,
			     e == cudaErrorUnknown ? "wrong result" : cudaGetErrorString(e));
		return -EIO;
	}
	if (attempts > 1)
		fprintf(stderr, "regend: cuda: device %d: new context after %d attempts (%.0f ms)\n", dev->index, attempts,
			ms);
	pthread_mutex_lock(&cd->fault_lock);
	cd->fault_seq = 0;
	pthread_mutex_unlock(&cd->fault_lock);
	atomic_store(&cd->failed, false);
	atomic_store(&cd->lost, false);
	return 0;
}

static int cuda_reset(struct rd_device *dev, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
#if REGEN_HAVE_NCCL
	cuda_comm_quiesce(cd);
#endif
	atomic_fetch_add(&cd->resets, 1);
	/* The context check makes no CUDA call while the primary context is
	 * thrown away and made again. */
	cuda_health_pause(cd);
	int r = reset_context(dev, cd, err);
	cuda_health_resume(cd);
	return r;
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
	if (!lost && strcmp(kind, "hang") != 0) {
		rp_error_set(err, RP_ERR_INVALID_PARAMETER, "fault kind \"%s\" is not one the CUDA backend injects", kind);
		return -EINVAL;
	}
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
		double seconds = rd_env_number(RD_ENV_HANG_SECONDS, 1e-3, 1e7, 600.0);
		*(volatile int *)cd->fault.flag_host = 0;
		e = rk_spin(cd->fault.flag_dev, (uint64_t)(seconds * 1e9), cd->fault.stream);
	}
	if (e == cudaSuccess)
		e = cudaEventRecord(cd->fault.event, s);
	if (e != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "injecting %s: %s", kind, cudaGetErrorString(e));
		return -EIO;
	}
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

static const struct rd_backend_ops rd_backend_cuda = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
	.import_buffer = cuda_import_buffer,
	.close_buffer = cuda_close_buffer,
	.check_export = cuda_check_export,
	.import_event = cuda_import_event,
	.close_event = cuda_close_event,
	.event_done = cuda_event_done,
	.abandon_client_waits = cuda_lane_abandon_client_waits,
	.lane_create = cuda_lane_create,
	.lane_destroy = cuda_lane_destroy,
	.submit = cuda_submit,
#if REGEN_HAVE_NCCL
	.comm_unique_id = cuda_comm_unique_id,
	.comm_create = cuda_comm_create,
	.comm_abort = cuda_comm_abort,
	.comm_status = cuda_comm_status,
	.comm_close = cuda_comm_close,
#endif
	.release = cuda_release,
	.reset = cuda_reset,
	.program_create = cuda_program_create,
	.program_destroy = cuda_program_destroy,
	.memory = cuda_memory,
	.inject_fault = cuda_inject_fault,
	.health_start = cuda_health_start,
	.health_stop = cuda_health_stop,
	.health = cuda_health_info,
};

const struct rd_backend_ops *rd_backend_cuda_entry(const char *version)
{
	return version && strcmp(version, REGEN_VERSION) == 0 ? &rd_backend_cuda : NULL;
}
