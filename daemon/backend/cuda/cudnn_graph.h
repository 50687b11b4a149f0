/* SPDX-License-Identifier: Apache-2.0 */
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
 * elements with the last one 1. With sequence lengths (key.padded) the
 * graph carries cuDNN's padding mask: int32 [B, 1, 1, 1] tensors of each
 * entry's lengths, which the plan reads from its workspace (the caller
 * puts them there, bounded, before each execution). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

/* The graph's tensors that live in memory, by the unique id cuDNN knows them
 * by. Q..DV are the caller's; the scalars travel by value; SOFTMAX_SUM and
 * DQ_ACCUM are f32 scratch the backward graph keeps in its workspace, as are
 * SEQ_LEN_Q and SEQ_LEN_KV, the padding mask's lengths (int32 [B,1,1,1]). */
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
	CUDA_SDPA_SEQ_LEN_Q,
	CUDA_SDPA_SEQ_LEN_KV,
	CUDA_SDPA_PAD_NEG_INF,
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
	int32_t padded;        /* per-entry sequence lengths: cuDNN's padding mask */
	int32_t unused;        /* zero: no implicit padding in a memcmp'ed key */
	int64_t b, h, h_kv, s_q, s_kv, d, d_v;
	/* Element strides of q, k, v, o, stats (its three), d_o, d_q, d_k, d_v,
	 * indexed by enum cuda_sdpa_uid; unused rows zero. */
	int64_t strides[CUDA_SDPA_OPERANDS][4];
};

void cuda_sdpa_key_init(struct cuda_sdpa_key *key);

/* Execution plans built for one problem, to be timed against each other
 * (cuda_sdpa_plan_build with more than one candidate) before one is kept. */
#define CUDA_SDPA_CANDIDATES_MAX 16

struct cuda_sdpa_candidate {
	cudnnBackendDescriptor_t plan, cfg;   /* in the plan's descs[] too */
	int index;                 /* its place among the heuristics' results (mode A, then B) */
	int64_t engine;            /* cuDNN's global engine index */
	size_t cudnn_workspace;
	char knobs[96];            /* "engine 8 knobs 2=1,12=0", for logs */
};

struct cuda_sdpa_plan {
	cudnnBackendDescriptor_t plan;   /* the one that runs: candidate[chosen]'s */
	/* Every descriptor the graph was built from: the plan was made from
	 * them and they go with it (NULL where a candidate was dropped). */
	cudnnBackendDescriptor_t *descs;
	unsigned ndescs, cap;
	int64_t engine;            /* cuDNN's global engine index, for logs */
	size_t cudnn_workspace;    /* bytes the engine asks for */
	/* Bytes one call needs: the lengths (padded), the backward's f32
	 * scratch tensors, at these offsets (256-byte aligned), then cuDNN's
	 * workspace. While candidates remain, the largest one's. */
	size_t workspace;
	size_t seq_len_q_offset, seq_len_kv_offset, softmax_sum_offset, dq_accum_offset, cudnn_offset;
	bool backward, masked, bottom_right, padded;
	int32_t s_q, s_kv;         /* by-value scalars of the bottom-right mask without lengths */
	int64_t batch;
	/* What cuda_sdpa_plan_build made: one, or several to time (then
	 * cuda_sdpa_plan_keep picks one and destroys the others). */
	struct cuda_sdpa_candidate candidate[CUDA_SDPA_CANDIDATES_MAX];
	unsigned ncandidates, chosen;
	int heuristic_results;     /* how many configurations the heuristics offered */
};

/* Builds the plan for `key`. With `handle` the plan runs on its device; a
 * NULL handle and a device-properties descriptor build it for the device
 * that descriptor describes (cuDNN's deviceless compilation: tests).
 * cuDNN's heuristics (mode A, then mode B for what A did not offer) rank
 * engine configurations; from the `start`-th of them on, the first
 * `candidates` (at least 1, at most CUDA_SDPA_CANDIDATES_MAX) that
 * finalize are built, each compiling its kernels. The first built runs
 * until cuda_sdpa_plan_keep says otherwise. 0; -ENOTSUP when cuDNN takes
 * no such problem (no engine, or a descriptor it refuses), -ENOMEM, or
 * -EIO for other failures; `why` then holds cuDNN's reason. On failure
 * the plan holds nothing. */
int cuda_sdpa_plan_build(const struct cuda_sdpa_key *key, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
			 int start, unsigned candidates, struct cuda_sdpa_plan *plan, char *why, size_t why_len);
/* Keeps candidate i as the plan and destroys the others (unloading their
 * kernels). Nothing may run the others any more. The workspace stays what
 * it was (the largest candidate's): callers may have sized their scratch
 * by it already. */
void cuda_sdpa_plan_keep(struct cuda_sdpa_plan *plan, unsigned i);
/* The engine configurations cuda_sdpa_plan_build would consider for key,
 * in its order, as "engine E knobs T=V,...", without finalizing any plan
 * (no kernel compiled): mode A's alone, or with `more` everything
 * autotuning offers. Up to max into texts; how many there are, or -errno
 * as cuda_sdpa_plan_build (why set). */
int cuda_sdpa_configurations(const struct cuda_sdpa_key *key, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
			     bool more, char (*texts)[96], int max, char *why, size_t why_len);
/* Destroys the plan's descriptors; accepts a zeroed plan. */
void cuda_sdpa_plan_destroy(struct cuda_sdpa_plan *plan);

/* Enqueues the plan (candidate `which`, while there are several) on the
 * handle's stream: ptr[] are the device addresses of q..d_v (by enum
 * cuda_sdpa_uid; absent ones NULL), `workspace` plan->workspace bytes,
 * 256-byte aligned, its sequence lengths (padded plans) written by the
 * caller at seq_len_q_offset and seq_len_kv_offset, int32 each, already
 * bounded to [0, Sq] and [0, Skv]. The handle must not be used by another
 * thread meanwhile. CUDNN_STATUS_SUCCESS or cuDNN's failure, with `why`
 * set. */
cudnnStatus_t cuda_sdpa_execute(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan, unsigned which,
				void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace, char *why,
				size_t why_len);

/* cuDNN 9's native CUDA graph of the plan's kept configuration for these
 * operands (as cuda_sdpa_execute takes them): into `graph`, an empty graph
 * (update false), or one it filled for this plan before, its nodes then
 * changed to read and write the new addresses (update true): what a
 * program's captured graph would need so that an attention whose operands
 * moved still replays (issue 32). Only configurations whose engine says
 * so take it (cuda_sdpa_graph_native); others give
 * CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API. */
cudnnStatus_t cuda_sdpa_graph(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan,
			      void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace, cudaGraph_t graph,
			      bool update, char *why, size_t why_len);
/* Whether the plan's kept configuration's engine supports cuDNN's native
 * CUDA graph API (CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API). */
bool cuda_sdpa_graph_native(const struct cuda_sdpa_plan *plan);
