/* SPDX-License-Identifier: Apache-2.0 */
/* A call's scratch (a GEMM's workspace, attention's, LayerNormBackward's
 * partial sums), taken from the device's pool stream-ordered on the call's
 * lane.
 *
 * Each lane keeps the block its last call used, up to
 * CUDA_SCRATCH_KEEP_MAX, while it is busy, and gives it back once it has
 * been idle a while (lane.c's completer, before it sleeps). A pair of
 * stream-ordered allocation and free costs the GPU about 0.9 µs per call
 * whatever the size (H200, driver 580: 8192x4096x128 bf16 GEMMs pipelined in
 * process, 28.5 µs each against 27.6 without the pair; .dev-batch's probe
 * and bench_latency), which a pipelined round of small GEMMs cannot
 * afford. Reusing the lane's block keeps what seed 001 needs: the calls
 * that use it are on one stream, so one finishes with it before the next
 * starts, and no two streams ever share a block. A larger call takes its
 * own block for itself and gives it back after it, as every call did
 * before.
 *
 * The launching thread (one at a time per lane) takes and gives; the
 * completer drops the kept block only while it holds the lane's launch (so
 * no launch uses it meanwhile); release and invalidate may come from the
 * registry on any thread: the block is held under scratch_lock. */
#include "regen-config.h"

#include <errno.h>
#include <string.h>
#include "daemon/backend/cuda/common.h"
#include "daemon/backend/cuda/cuda.h"
#include "proto/errors.h"

/* A call that needs more takes a block of its own. GEMM workspaces are at
 * most RD_CUDA_WORKSPACE_BYTES (the heuristic's limit), so every GEMM
 * reuses the lane's block. */
#define CUDA_SCRATCH_KEEP_MAX RD_CUDA_WORKSPACE_BYTES

int cuda_scratch_take(struct cuda_lane *l, size_t bytes, struct cuda_scratch *s, const char *call,
		      struct rp_error *err)
{
	struct cuda_dev *cd = l->cd;
	cudaError_t e = cudaSuccess;

	memset(s, 0, sizeof(*s));
	if (bytes == 0)
		return 0;
	if (l->scratch_fixed) {
		if (bytes > l->scratch_fixed_bytes) {
			l->scratch_fixed_wanted = bytes;
			rp_error_set(err, RP_ERR_BACKEND, "%s needs %zu bytes of scratch; the program's workspace holds %zu",
				     call, bytes, l->scratch_fixed_bytes);
			return -ENOSPC;
		}
		s->ptr = l->scratch_fixed;
		return 0;
	}
	if (rd_resource_ensure_valid(&cd->pool.res))
		return cuda_status_to_error(err, "scratch memory pool");
	if (bytes > CUDA_SCRATCH_KEEP_MAX) {
		e = cudaMallocFromPoolAsync(&s->ptr, bytes, cd->pool.pool, l->stream);
		s->owned = e == cudaSuccess;
	} else {
		pthread_mutex_lock(&l->scratch_lock);
		if (l->scratch_kept && l->scratch_kept_bytes < bytes) {
			/* Stream-ordered: the calls before this one are done with
			 * it when the pool hands it out again. */
			e = cudaFreeAsync(l->scratch_kept, l->stream);
			l->scratch_kept = NULL;
			l->scratch_kept_bytes = 0;
		}
		if (e == cudaSuccess && !l->scratch_kept) {
			e = cudaMallocFromPoolAsync(&l->scratch_kept, bytes, cd->pool.pool, l->stream);
			if (e == cudaSuccess) {
				l->scratch_kept_bytes = bytes;
				l->scratch_kept_allocs++;
			}
			else
				l->scratch_kept = NULL;
		}
		s->ptr = l->scratch_kept;
		pthread_mutex_unlock(&l->scratch_lock);
	}
	if (e != cudaSuccess) {
		s->ptr = NULL;
		rp_error_set(err, cuda_error_name(e), "%s's scratch of %zu bytes: %s", call, bytes, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

cudaError_t cuda_scratch_give(struct cuda_lane *l, struct cuda_scratch *s)
{
	cudaError_t e = cudaSuccess;

	if (s->owned)
		e = cudaFreeAsync(s->ptr, l->stream);
	memset(s, 0, sizeof(*s));
	return e;
}

void cuda_scratch_drop_kept(struct cuda_lane *l)
{
	pthread_mutex_lock(&l->scratch_lock);
	if (l->scratch_kept && l->stream)
		(void)cudaFreeAsync(l->scratch_kept, l->stream);   /* a failure is the context's: its next call says */
	l->scratch_kept = NULL;
	l->scratch_kept_bytes = 0;
	pthread_mutex_unlock(&l->scratch_lock);
}

void cuda_scratch_forget_kept(struct cuda_lane *l)
{
	pthread_mutex_lock(&l->scratch_lock);
	l->scratch_kept = NULL;
	l->scratch_kept_bytes = 0;
	pthread_mutex_unlock(&l->scratch_lock);
}

void rd_cuda_lane_scratch_info(struct rd_lane *lane, struct rd_cuda_lane_scratch *info)
{
	struct cuda_lane *l = (struct cuda_lane *)lane;

	pthread_mutex_lock(&l->scratch_lock);
	info->kept_bytes = l->scratch_kept ? l->scratch_kept_bytes : 0;
	info->kept_allocs = l->scratch_kept_allocs;
	pthread_mutex_unlock(&l->scratch_lock);
}
