/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's public face: the one entry point of its module, and
 * what the GPU tests may call on a device it opened. Everything else is
 * internal to daemon/backend/cuda/ (common.h). No CUDA header here: a test
 * includes the CUDA API it uses itself. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include "daemon/backend/backend.h"

/* The module's one exported symbol, an rd_backend_entry_fn (backend.h).
 * The GPU tests, linked with the backend's static library, call it too. */
__attribute__((visibility("default"))) const struct rd_backend_ops *rd_backend_cuda_entry(const char *version);

/* Wraps device memory this process allocated (cudaMalloc) as a buffer,
 * registered like any import; close it with the ops table's close_buffer,
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
 * the lane's own block normally (scratch.c), the one shared buffer with
 * -Ddebug_shared_workspace=true. */
void *rd_cuda_lane_last_workspace(struct rd_lane *lane);
/* The block of scratch the lane keeps for its next call (scratch.c): its
 * size (0 once the lane has been idle a while), and how many blocks the
 * lane has taken from the pool so far. */
struct rd_cuda_lane_scratch {
	size_t kept_bytes;
	uint64_t kept_allocs;
};
void rd_cuda_lane_scratch_info(struct rd_lane *lane, struct rd_cuda_lane_scratch *info);

/* Distinct imported mappings now held (cuda_ipc dedupes by handle). */
unsigned rd_cuda_mapping_count(struct rd_device *dev);

/* cuBLASLt GEMM plans cached now (gemm.c): at most the limit below once no
 * call is planning or enqueueing. */
unsigned rd_cuda_gemm_plan_count(struct rd_device *dev);
/* GEMM plans kept per device (default 256, the least recently used that no
 * call holds destroyed past it; 0 restores the default). The backend's open
 * starts the cache with dev->gemm_plans_max (the worker's gemm_plans_max);
 * this changes the limit afterwards, at any time, trimming at once. */
void rd_cuda_set_gemm_plan_limit(struct rd_device *dev, unsigned plans_max);

/* cuDNN attention plans cached now (attention.c). */
unsigned rd_cuda_attention_plan_count(struct rd_device *dev);
/* Attention plans kept per device (default 64, the least recently used
 * evicted past it; 0 restores the default). */
void rd_cuda_set_attention_plan_limit(struct rd_device *dev, unsigned plans_max);
/* How many engine configurations a new attention problem's plan is timed
 * among on its first call (the attention_autotune option's setting; 0 or 1:
 * none, the heuristics' first). Applies to plans built afterwards. */
void rd_cuda_set_attention_autotune(struct rd_device *dev, unsigned candidates);
/* The most recently used attention plan: how many candidates it still
 * holds (1 once chosen), the chosen one's place among the heuristics'
 * results and its engine. 0, or -ENOENT when there is none. */
int rd_cuda_attention_plan_choice(struct rd_device *dev, unsigned *candidates, int *heuristic_index, long long *engine);
