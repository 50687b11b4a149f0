/* Attention on the CUDA backend: regen's own kernels (kernels/attention.cu),
 * f32 accumulation, any strides the protocol allows. The backward pass's
 * row terms take per-call scratch from the device pool on the call's
 * stream, like GEMM workspaces: nothing is shared between lanes. */
#include <errno.h>
#include "daemon/backend/cuda/common.h"
#include "kernels/attention.h"
#include "proto/errors.h"

static void tensor(rk_attn_tensor *t, struct rd_buffer *buf, const struct rp_operand *op)
{
	t->ptr = buf ? (char *)buf->ptr + op->offset : NULL;
	for (int i = 0; i < 4; i++)
		t->stride[i] = i < op->rank ? (long)op->strides[i] : 0;
}

static int launch_failed(struct rd_op *op, const char *what, cudaError_t e)
{
	if (e == cudaErrorInvalidValue)
		return rp_error_set(&op->err, RP_ERR_INVALID_OPERAND,
				    "%s: head dimensions above %d are not supported by the CUDA attention kernels", what,
				    RK_ATTN_DMAX);
	return rp_error_set(&op->err, cuda_error_name(e), "%s: %s", what, cudaGetErrorString(e));
}

int cuda_attention_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	struct rd_buffer **b = op->buffers;
	cudaError_t e;

	if (op->kind == RD_OP_ATTENTION) {
		const struct rp_attention *a = &op->attention;
		rk_attn_fwd_args args = {
			.batch = a->batch, .heads = a->heads, .seq_q = a->seq_q, .seq_kv = a->seq_kv,
			.head_dim = (int)a->head_dim, .head_dim_v = (int)a->head_dim_v,
			.scale = (float)a->scale, .causal = a->causal,
		};
		tensor(&args.q, b[RD_ATT_Q], &a->q);
		tensor(&args.k, b[RD_ATT_K], &a->k);
		tensor(&args.v, b[RD_ATT_V], &a->v);
		tensor(&args.o, b[RD_ATT_O], &a->o);
		tensor(&args.stats, a->has_stats ? b[RD_ATT_STATS] : NULL, &a->stats);
		e = rk_attention_forward(&args, (enum rk_dtype)a->q.dtype, lane->stream);
		return e == cudaSuccess ? 0 : launch_failed(op, "attention forward", e);
	}

	const struct rp_attention_backward *a = &op->attention_backward;
	rk_attn_bwd_args args = {
		.batch = a->batch, .heads = a->heads, .seq_q = a->seq_q, .seq_kv = a->seq_kv,
		.head_dim = (int)a->head_dim, .head_dim_v = (int)a->head_dim_v,
		.scale = (float)a->scale, .causal = a->causal,
	};
	tensor(&args.q, b[RD_ATB_Q], &a->q);
	tensor(&args.k, b[RD_ATB_K], &a->k);
	tensor(&args.v, b[RD_ATB_V], &a->v);
	tensor(&args.o, b[RD_ATB_O], &a->o);
	tensor(&args.d_o, b[RD_ATB_DO], &a->d_o);
	tensor(&args.stats, b[RD_ATB_STATS], &a->stats);
	tensor(&args.d_q, b[RD_ATB_DQ], &a->d_q);
	tensor(&args.d_k, b[RD_ATB_DK], &a->d_k);
	tensor(&args.d_v, b[RD_ATB_DV], &a->d_v);

	struct cuda_dev *cd = lane->cd;
	size_t bytes = (size_t)(a->batch * a->heads * a->seq_q) * sizeof(float);
	void *delta = NULL;
	if (rd_resource_ensure_valid(&cd->pool.res))
		return cuda_status_to_error(&op->err, "scratch memory pool");
	e = cudaMallocFromPoolAsync(&delta, bytes, cd->pool.pool, lane->stream);
	if (e != cudaSuccess)
		return rp_error_set(&op->err, cuda_error_name(e), "attention scratch of %zu bytes: %s", bytes,
				    cudaGetErrorString(e));
	int r = 0;
	e = rk_attention_backward(&args, (enum rk_dtype)a->q.dtype, delta, lane->stream);
	if (e != cudaSuccess)
		r = launch_failed(op, "attention backward", e);
	e = cudaFreeAsync(delta, lane->stream);
	if (e != cudaSuccess && r == 0)
		r = rp_error_set(&op->err, cuda_error_name(e), "freeing attention scratch: %s", cudaGetErrorString(e));
	return r;
}
