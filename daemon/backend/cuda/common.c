/* SPDX-License-Identifier: Apache-2.0 */
/* What every file of the CUDA backend uses: error mapping, the thread-local
 * status init callbacks leave, binding a thread to the device, the driver
 * entry points, marking the device lost, and operands' device addresses. */
#include "regen-config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

static __thread struct cuda_status last_status;

int cuda_status_set(const char *name, const char *fmt, ...)
{
	va_list ap;
	rp_error_clear(&last_status.whole);
	last_status.name = name;
	va_start(ap, fmt);
	vsnprintf(last_status.message, sizeof(last_status.message), fmt, ap);
	va_end(ap);
	return strcmp(name, RP_ERR_OUT_OF_MEMORY) == 0 ? -ENOMEM : -EIO;
}

int cuda_status_keep(struct rp_error *err)
{
	const char *name = err->name ? err->name : RP_ERR_BACKEND;
	int r = strcmp(name, RP_ERR_OUT_OF_MEMORY) == 0 ? -ENOMEM : strcmp(name, RP_ERR_LIMIT_EXCEEDED) == 0 ? -EDQUOT : -EIO;

	rp_error_clear(&last_status.whole);
	rp_error_move(&last_status.whole, err);
	last_status.name = name;
	snprintf(last_status.message, sizeof(last_status.message), "(kept whole)");
	return r;
}

int cuda_status_to_error(struct rp_error *err, const char *what)
{
	if (last_status.whole.name) {
		rp_error_move(err, &last_status.whole);
		last_status.name = NULL;
		return -EIO;
	}
	if (!last_status.name) {
		rp_error_set(err, RP_ERR_BACKEND, "%s failed", what);
		return -EIO;
	}
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
	/* Under MPS: the server ended this client, after a fatal fault of any
	 * client of the GPU; only a new process gets a context again. */
	case cudaErrorMpsClientTerminated:
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

const char *cuda_mps_hint(cudaError_t e)
{
	switch (e) {
	case cudaErrorMpsServerNotReady:
		return " (under MPS, after a fatal fault the server takes no new client until every client of the GPU, "
		       "the ranks too, has exited)";
	case cudaErrorMpsConnectionFailed:
	case cudaErrorMpsRpcFailure:
	case cudaErrorMpsMaxClientsReached:
	case cudaErrorMpsMaxConnectionsReached:
	case cudaErrorMpsClientTerminated:
		return " (an MPS error: the MPS control daemon's log, in CUDA_MPS_LOG_DIRECTORY, says more)";
	default:
		return "";
	}
}

const char *cublas_error_name(cublasStatus_t s)
{
	if (s == CUBLAS_STATUS_ALLOC_FAILED)
		return RP_ERR_OUT_OF_MEMORY;
	return RP_ERR_BACKEND;
}

int cuda_bind(struct cuda_dev *cd, struct rp_error *err)
{
	/* Every call's launch binds (0.4 µs of a 64³ GEMM's ~10 µs launch,
	 * measured on the H200): a thread that bound this device in its
	 * current context skips it. A worker drives one device, so nothing
	 * else moves the thread's device; a reset makes a new context, which
	 * the first bind after it enters. */
	static __thread int bound_index = -1;
	static __thread uint64_t bound_resets;
	uint64_t resets = atomic_load(&cd->resets);
	if (bound_index == cd->dev->index && bound_resets == resets)
		return 0;
	cudaError_t e = cudaSetDevice(cd->dev->index);
	if (e != cudaSuccess) {
		rp_error_set(err, cuda_error_name(e), "cudaSetDevice(%d): %s%s", cd->dev->index, cudaGetErrorString(e),
			     cuda_mps_hint(e));
		return -EIO;
	}
	bound_index = cd->dev->index;
	bound_resets = resets;
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
		FN(MemAddressFree), FN(MemMap), FN(MemUnmap), FN(MemSetAccess), FN(MemRelease), FN(ModuleLoadData),
		FN(ModuleGetFunction), FN(ModuleUnload), FN(LaunchKernel),
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
	if (!cuda_drv.MemRelease) {
		rp_error_set(err, RP_ERR_BACKEND, "%s", driver_error);
		return -EIO;
	}
	return 0;
}

void cuda_report_fault(struct cuda_dev *cd, enum rd_fault_kind kind, const char *reason)
{
	bool was = atomic_exchange(&cd->lost, true);
	bool tell = !was;
	if (kind == RD_FAULT_FAILED)
		tell = !atomic_exchange(&cd->failed, true);
	if (tell && cd->dev->on_fault)
		cd->dev->on_fault(cd->dev, kind, reason);
}

void cuda_mark_lost(struct cuda_dev *cd, const char *reason)
{
	cuda_report_fault(cd, RD_FAULT_LOST, reason);
}

cudaError_t cuda_context_check(void)
{
	/* The legacy stream is never used by the backend (every stream of
	 * ours is non-blocking), so the query waits for nothing and answers
	 * with the context's sticky error when it has one. */
	cudaError_t e = cudaStreamQuery(cudaStreamLegacy);
	return cuda_error_is_sticky(e) ? e : cudaSuccess;
}

int cuda_refuse_if_lost(struct cuda_dev *cd, struct rp_error *err)
{
	if (!atomic_load(&cd->lost))
		return 0;
	rp_error_set(err, RP_ERR_DEVICE_LOST, "device %d lost its context; it needs a reset", cd->dev->index);
	return -EIO;
}

int cuda_check_failure(struct cuda_dev *cd, struct rp_error *err, uint64_t resets)
{
	const char *msg;
	char reason[256];

	if (!err->name || atomic_load(&cd->resets) != resets)
		return -EIO;
	msg = err->params ? cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "message")) : NULL;
	if (strcmp(err->name, RP_ERR_DEVICE_LOST) != 0) {
		if (strcmp(err->name, RP_ERR_BACKEND) != 0 && strcmp(err->name, RP_ERR_IMPORT_FAILED) != 0 &&
		    strcmp(err->name, RP_ERR_OUT_OF_MEMORY) != 0)
			return -EIO;
		/* A library's own status (cuBLASLt, cuDNN, the driver's
		 * import calls) does not say whether the context died under
		 * it: ask the context. */
		cudaError_t e = cuda_context_check();
		if (e == cudaSuccess)
			return -EIO;
		snprintf(reason, sizeof(reason), "%s; the context is lost: %s (%s)", msg ? msg : err->name,
			 cudaGetErrorString(e), cudaGetErrorName(e));
		rp_error_clear(err);
		rp_error_set(err, RP_ERR_DEVICE_LOST, "%s", reason);
	} else {
		snprintf(reason, sizeof(reason), "%s", msg ? msg : "a sticky CUDA error");
	}
	cuda_mark_lost(cd, reason);
	return -EIO;
}

int cuda_operand_pointers(const struct rd_op *op, void *ptr[RP_OP_OPERANDS_MAX], struct rp_error *err)
{
	const struct rp_compute *c = &op->compute;

	for (unsigned i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		const char *name = i < c->spec->noperands ? c->spec->operands[i].name : "?";
		size_t elem;

		ptr[i] = NULL;
		if (i >= c->spec->noperands || !c->present[i])
			continue;
		if (!op->buffers[i])
			return rp_error_invalid_operand(err, name, "%s has no buffer", name);
		if (!op->buffers[i]->ptr) {
			rp_error_set(err, RP_ERR_BACKEND, "%s's buffer is not mapped", name);
			return -EIO;
		}
		ptr[i] = (char *)op->buffers[i]->ptr + c->operands[i].offset;
		elem = rp_dtype_size(c->operands[i].dtype);
		/* The offset is a whole number of elements (the parser says so);
		 * the buffer's own start need not be, as an IPC import may begin
		 * anywhere in its allocation. */
		if (elem > 1 && (uintptr_t)ptr[i] % elem != 0)
			return rp_error_invalid_operand(err, name,
							"%s's first element is not %zu-byte aligned in device memory (its "
							"buffer starts at an odd place of its allocation)",
							name, elem);
	}
	return 0;
}
