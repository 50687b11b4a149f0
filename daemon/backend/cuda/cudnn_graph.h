/* cuDNN's fused scaled-dot-product attention, driven from C through the
 * backend API (cudnn_graph.h). cuDNN has no single "attention" call that
 * masks: the fused flash-attention engines recognise a graph of backend
 * operations (matmul, pointwise scale, the causal mask as index generation,
 * comparison and select, max/sum reductions, exp/log, matmul), the graph
 * cudnn-frontend's SDPA nodes build. This file builds that graph for one
 * problem, asks cuDNN's heuristics for an engine and finalizes an execution
 * plan, and runs a plan on given pointers. It knows nothing of regen's
 * operands or registry (attention.c does), so a test can build plans for a
 * described device without one.
 *
 * Shapes follow the protocol: q and o [B, H, Sq, D|Dv], k and v
 * [B, Hkv, Skv, D|Dv] (Hkv divides H: grouped-query attention), stats f32
 * [B, H, Sq] (natural log-sum-exp of the scaled, masked scores), strides in
 * elements with the last one 1. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cudnn.h>

/* The graph's tensors that live in memory, by the unique id cuDNN knows them
 * by. Q..DV are the caller's; the scalars travel by value; SOFTMAX_SUM and
 * DQ_ACCUM are f32 scratch the backward graph keeps in its workspace. */
enum cuda_sdpa_uid {
	CUDA_SDPA_Q = 1,
	CUDA_SDPA_K,
	CUDA_SDPA_V,
	CUDA_SDPA_O,
	CUDA_SDPA_STATS,
	CUDA_SDPA_DO,
	CUDA_SDPA_DQ,
	CUDA_SDPA_DK,
	CUDA_SDPA_DV,
	CUDA_SDPA_SCALE,
	CUDA_SDPA_NEG_INF,
	CUDA_SDPA_ONE,
	CUDA_SDPA_SEQ_Q,
	CUDA_SDPA_SEQ_KV,
	CUDA_SDPA_SOFTMAX_SUM,
	CUDA_SDPA_DQ_ACCUM,
	CUDA_SDPA_UID_COUNT,
};
#define CUDA_SDPA_OPERANDS (CUDA_SDPA_DV + 1)   /* indexes Q..DV of the arrays below */

enum cuda_sdpa_mask { CUDA_SDPA_NO_MASK = 0, CUDA_SDPA_CAUSAL_TOP_LEFT, CUDA_SDPA_CAUSAL_BOTTOM_RIGHT };

/* Everything a plan depends on; compared with memcmp, so fill it from a
 * zeroed struct (cuda_sdpa_key_init). The scale is not part of it: it
 * travels by value at execution. */
struct cuda_sdpa_key {
	int32_t backward;      /* 0: forward (o, stats), 1: backward (d_q, d_k, d_v) */
	int32_t dtype;         /* cudnnDataType_t: CUDNN_DATA_HALF or CUDNN_DATA_BFLOAT16 */
	int32_t mask;          /* enum cuda_sdpa_mask */
	int32_t stats;         /* forward: writes stats (always true backward, which reads them) */
	int64_t b, h, h_kv, s_q, s_kv, d, d_v;
	/* Element strides of q, k, v, o, stats (its three), d_o, d_q, d_k, d_v,
	 * indexed by enum cuda_sdpa_uid; unused rows zero. */
	int64_t strides[CUDA_SDPA_OPERANDS][4];
};

void cuda_sdpa_key_init(struct cuda_sdpa_key *key);

struct cuda_sdpa_plan {
	cudnnBackendDescriptor_t plan;
	/* Every descriptor the graph was built from: the plan was made from
	 * them and they go with it. */
	cudnnBackendDescriptor_t *descs;
	unsigned ndescs, cap;
	int64_t engine;            /* cuDNN's global engine index, for logs */
	size_t cudnn_workspace;    /* bytes the engine asks for */
	/* Bytes one call needs: the backward's f32 scratch tensors first, at
	 * these offsets (256-byte aligned), then cuDNN's workspace. */
	size_t workspace;
	size_t softmax_sum_offset, dq_accum_offset, cudnn_offset;
	bool backward, masked, bottom_right;
	int32_t s_q, s_kv;         /* by-value scalars of the bottom-right mask */
};

/* Builds the plan for `key`. With `handle` the plan runs on its device; a
 * NULL handle and a device-properties descriptor build it for the device
 * that descriptor describes (cuDNN's deviceless compilation: tests). 0;
 * -ENOTSUP when cuDNN takes no such problem (no engine, or a descriptor it
 * refuses), -ENOMEM, or -EIO for other failures; `why` then holds cuDNN's
 * reason. On failure the plan holds nothing. */
int cuda_sdpa_plan_build(const struct cuda_sdpa_key *key, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
			 struct cuda_sdpa_plan *plan, char *why, size_t why_len);
/* Destroys the plan's descriptors; accepts a zeroed plan. */
void cuda_sdpa_plan_destroy(struct cuda_sdpa_plan *plan);

/* Enqueues the plan on the handle's stream: ptr[] are the device addresses
 * of q..d_v (by enum cuda_sdpa_uid; absent ones NULL), `workspace`
 * plan->workspace bytes, 256-byte aligned. The handle must not be used by
 * another thread meanwhile. CUDNN_STATUS_SUCCESS or cuDNN's failure, with
 * `why` set. */
cudnnStatus_t cuda_sdpa_execute(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan,
				void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace, char *why,
				size_t why_len);
