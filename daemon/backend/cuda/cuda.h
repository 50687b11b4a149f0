/* The CUDA backend (rd_backend_cuda): one worker process owns device
 * dev->index through its primary context. Every native object (lane
 * streams, the cuBLASLt handle, GEMM plans, the scratch pool, imported
 * mappings, events) is a registry resource of dev->registry.
 *
 * The first part of this header is what tests and tools may call; the
 * second is shared by the files of daemon/backend/cuda/ only. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "regen-config.h"
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include "daemon/backend/backend.h"

/* ---- For tests and tools ------------------------------------------------ */

/* Wraps device memory this process allocated (cudaMalloc) as a buffer,
 * registered like any import; close it with rd_backend_cuda.close_buffer,
 * which never frees the memory. 0 or -errno. */
int rd_cuda_buffer_wrap_local(struct rd_device *dev, void *devptr, uint64_t size, struct rd_buffer **out);

/* What the cached plan for a GEMM chose. */
struct rd_cuda_plan_info {
	size_t workspace_size;      /* the chosen algorithm's need, bytes */
	int algo_id, splitk, reduction_scheme, tile, stages;
	int heuristic_results;      /* how many the heuristic returned */
	int chosen_index;           /* which of them the plan took */
	size_t max_result_workspace; /* largest workspace among the results */
};
/* Builds (or finds) the plan op's GEMM would use and describes it. The op
 * needs only gemm and buffers[] filled. 0 or -errno with err set. */
int rd_cuda_gemm_plan_info(struct rd_device *dev, struct rd_op *op, struct rd_cuda_plan_info *info, struct rp_error *err);

/* Algorithm choice among the heuristic's results. DEFAULT takes the first;
 * PREFER_WORKSPACE the first that uses a workspace (split-K and the like),
 * else the first: the workspace regression test uses it so that its shapes
 * exercise scratch whatever the heuristic ranks first. Applies to plans
 * made afterwards. */
enum rd_cuda_algo_policy { RD_CUDA_ALGO_DEFAULT = 0, RD_CUDA_ALGO_PREFER_WORKSPACE };
void rd_cuda_set_algo_policy(struct rd_device *dev, enum rd_cuda_algo_policy policy);

/* Device address of the scratch the lane's last GEMM used (NULL if none):
 * per-call memory normally, the one shared buffer with
 * -Ddebug_shared_workspace=true. */
void *rd_cuda_lane_last_workspace(struct rd_lane *lane);

/* Distinct imported mappings now held (cuda_ipc dedupes by handle). */
unsigned rd_cuda_mapping_count(struct rd_device *dev);

/* The scratch size the heuristic is asked with. */
#define RD_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

/* cuDNN attention plans cached now (attention.c). */
unsigned rd_cuda_attention_plan_count(struct rd_device *dev);
/* Attention plans kept per device (default 64, least recently used
 * evicted past it) and scratch bytes one attention call may take (default
 * 4 GiB, LimitExceeded past it); 0 restores a default. */
void rd_cuda_set_attention_limits(struct rd_device *dev, unsigned plans_max, size_t scratch_max);

/* ---- Internal to daemon/backend/cuda/ ----------------------------------------- */

struct cuda_dev;

/* A resource with a CUDA state: what init last failed with. */
struct cuda_status {
	const char *name;     /* RP_ERR_* */
	char message[256];
};

struct cuda_pool {
	struct rd_resource res;
	struct cuda_dev *cd;
	cudaMemPool_t pool;
};

struct cuda_handle {
	struct rd_resource res;
	struct cuda_dev *cd;
	cublasLtHandle_t lt;
};

/* One buffer every GEMM shares: -Ddebug_shared_workspace=true only. */
struct cuda_shared_ws {
	struct rd_resource res;
	struct cuda_dev *cd;
	void *ptr;
};

/* Fault injection: a stream for the kernels, an event lanes wait on, and
 * the host-mapped flag that ends a "hang". */
struct cuda_fault {
	struct rd_resource res;
	struct cuda_dev *cd;
	cudaStream_t stream;        /* hang */
	cudaStream_t lost_stream;   /* device_lost */
	cudaEvent_t event;
	int *flag_host;
	int *flag_dev;
};

struct cuda_gemm_plan;
struct cuda_mapping;
struct cuda_attention;

struct cuda_dev {
	struct rd_device *dev;
	struct cuda_pool pool;
	struct cuda_handle handle;
	struct cuda_shared_ws shared_ws;
	struct cuda_fault fault;
	enum rd_cuda_algo_policy policy;

	pthread_mutex_t plans_lock;
	struct cuda_gemm_plan *plans;
	unsigned plan_count;

	pthread_mutex_t maps_lock;
	struct cuda_mapping *maps;
	unsigned map_count;

	/* attention.c: the cuDNN handle and plans, made on first use. */
	_Atomic(struct cuda_attention *) attention;

	/* Bumped when a fault kernel was enqueued; lanes whose seen value is
	 * older make their next op wait on fault.event first. */
	/* Bumped (and broadcast) by a host function each lane enqueues after a
	 * call: completers sleep on it instead of polling at a coarse period. */
	pthread_mutex_t done_lock;
	pthread_cond_t done_cond;
	uint64_t done_seq;

	pthread_mutex_t fault_lock;
	uint64_t fault_seq;

	uint64_t baseline;
	/* Set once a sticky error was seen, until reset. */
	_Atomic bool lost;
	/* Bumped when a reset starts: an op that began before it and fails
	 * afterwards does not mark the new context lost. */
	_Atomic uint64_t resets;
};

/* Calls a lane may have launched and not yet seen complete. */
#define RD_CUDA_LANE_DEPTH 8

struct cuda_lane {
	struct rd_lane base;
	struct cuda_dev *cd;
	cudaStream_t stream;
	/* Waits for each call's completion event and then runs the host
	 * function that wakes the completer: on a stream of its own, since a
	 * host function in `stream` would stall the next call's kernels. */
	cudaStream_t notify;
	cudaEvent_t done[RD_CUDA_LANE_DEPTH];
	unsigned next_done;
	uint64_t fault_seen;
	uint64_t op_resets;                /* cd->resets when the op being launched started */
	void *last_workspace;

	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stopping;
};

struct cuda_mapping {
	struct rd_resource res;
	struct cuda_dev *cd;
	enum rd_buffer_kind kind;
	unsigned char handle[64];          /* cuda_ipc */
	int fd;                            /* cuda_fd, owned */
	uint64_t want;                     /* cuda_fd: bytes to map (offset + size) */
	CUdeviceptr base;
	size_t size;                       /* bytes mapped (ipc: the allocation's) */
	CUmemGenericAllocationHandle alloc;
	unsigned refs;                     /* buffers on it, under cd->maps_lock */
	struct cuda_mapping *next;
};

struct cuda_buffer {
	struct rd_buffer base;
	struct cuda_dev *cd;
	struct cuda_mapping *map;          /* NULL for wrapped local memory */
	uint64_t offset;
	void *local;
};

struct cuda_event {
	struct rd_event base;
	struct cuda_dev *cd;
	cudaIpcEventHandle_t handle;
	cudaEvent_t ev;
};

static inline struct cuda_dev *cuda_dev_of(struct rd_device *dev)
{
	return dev->backend_data;
}

/* Thread-local record of the last failure an init callback saw, since
 * rd_resource_ensure_valid() can only return -errno. */
struct cuda_status *cuda_last_status(void);
int cuda_status_set(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* err from the last status, prefixed with what was being done. */
int cuda_status_to_error(struct rp_error *err, const char *what);

/* Error name for a CUDA runtime error: DeviceLost for sticky errors,
 * OutOfMemory, else BackendError. */
const char *cuda_error_name(cudaError_t e);
bool cuda_error_is_sticky(cudaError_t e);
const char *cublas_error_name(cublasStatus_t s);

/* The few driver-API entry points imports need, fetched through the
 * runtime (cudaGetDriverEntryPointByVersion) so that nothing links
 * libcuda.so.1 directly: regend and the tests then start, and fall back or
 * skip, on a machine without the driver. */
struct cuda_driver_api {
	__typeof__(cuGetErrorString) *GetErrorString;
	__typeof__(cuGetErrorName) *GetErrorName;
	__typeof__(cuMemGetAddressRange) *MemGetAddressRange;
	__typeof__(cuMemImportFromShareableHandle) *MemImportFromShareableHandle;
	__typeof__(cuMemGetAllocationPropertiesFromHandle) *MemGetAllocationPropertiesFromHandle;
	__typeof__(cuMemGetAllocationGranularity) *MemGetAllocationGranularity;
	__typeof__(cuMemAddressReserve) *MemAddressReserve;
	__typeof__(cuMemAddressFree) *MemAddressFree;
	__typeof__(cuMemMap) *MemMap;
	__typeof__(cuMemUnmap) *MemUnmap;
	__typeof__(cuMemSetAccess) *MemSetAccess;
	__typeof__(cuMemRelease) *MemRelease;
};
extern struct cuda_driver_api cuda_drv;
/* Fills cuda_drv once; 0 or -errno with err set. */
int cuda_driver_load(struct rp_error *err);

/* Makes dev->index current on the calling thread. */
int cuda_bind(struct cuda_dev *cd, struct rp_error *err);

/* gemm.c */
void cuda_gemm_plans_init(struct cuda_dev *cd);
void cuda_gemm_plans_finish(struct cuda_dev *cd);
/* Enqueues op's GEMM on the lane's stream (scratch included). 0 or -errno
 * with op->err set; nothing to wait for beyond the stream. */
int cuda_gemm_enqueue(struct cuda_lane *lane, struct rd_op *op);

/* ipc.c */
void cuda_ipc_init(struct cuda_dev *cd);
int cuda_import_buffer(struct rd_device *dev, struct rd_import *req, struct rd_buffer **out, struct rp_error *err);
void cuda_close_buffer(struct rd_buffer *buf);
int cuda_import_event(struct rd_device *dev, const unsigned char handle[64], struct rd_event **out, struct rp_error *err);
void cuda_close_event(struct rd_event *ev);
uint64_t cuda_ipc_mapped_bytes(struct cuda_dev *cd);

/* attention.c: enqueues op's attention (forward or backward) on the lane's
 * stream through cuDNN. 0 or -errno with op->err set. */
int cuda_attention_enqueue(struct cuda_lane *lane, struct rd_op *op);
/* Unregisters and frees the attention state (close: device synchronized). */
void cuda_attention_finish(struct cuda_dev *cd);
