/* Attention kernels of the CUDA backend (kernels/attention.cu). Tensors are
 * [B, H, S, D] with strides in elements; stats [B, H, Sq] f32 (log-sum-exp
 * of the scaled scores, natural log). Causal = key j > query i masked
 * (top-left aligned). */
#pragma once

#include <cuda_runtime_api.h>
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_ATTN_DMAX 256

typedef struct rk_attn_tensor {
	void *ptr;           /* NULL: absent */
	long stride[4];
} rk_attn_tensor;

typedef struct rk_attn_fwd_args {
	rk_attn_tensor q, k, v, o, stats;
	long batch, heads, seq_q, seq_kv;
	int head_dim, head_dim_v;
	float scale;
	int causal;
} rk_attn_fwd_args;

typedef struct rk_attn_bwd_args {
	rk_attn_tensor q, k, v, o, d_o, stats, d_q, d_k, d_v;
	long batch, heads, seq_q, seq_kv;
	int head_dim, head_dim_v;
	float scale;
	int causal;
} rk_attn_bwd_args;

/* cudaErrorInvalidValue for head dims over RK_ATTN_DMAX. */
cudaError_t rk_attention_forward(const rk_attn_fwd_args *a, enum rk_dtype dtype, cudaStream_t stream);
/* delta: f32 scratch of B*H*Sq elements. */
cudaError_t rk_attention_backward(const rk_attn_bwd_args *a, enum rk_dtype dtype, float *delta, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
