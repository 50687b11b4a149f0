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

	const struct rp_compute *c = &op->compute;
	const struct rp_attention *a = &c->attention;

	/* The hand-written kernels know neither grouped-query heads nor a
	 * bottom-right diagonal: refuse what they would get wrong. */
	if (a->heads_kv != a->heads || (a->causal && a->alignment != RP_CAUSAL_TOP_LEFT))
		return rp_error_set(&op->err, RP_ERR_INVALID_OPERAND,
				    "the CUDA attention kernels need as many k/v heads as q heads and a top-left causal "
				    "mask");
	if (c->spec->id == RP_OP_ATTENTION) {
		rk_attn_fwd_args args = {
			.batch = a->batch, .heads = a->heads, .seq_q = a->seq_q, .seq_kv = a->seq_kv,
			.head_dim = (int)a->head_dim, .head_dim_v = (int)a->head_dim_v,
			.scale = (float)a->scale, .causal = a->causal,
		};
		tensor(&args.q, b[RP_ATT_Q], &c->operands[RP_ATT_Q]);
		tensor(&args.k, b[RP_ATT_K], &c->operands[RP_ATT_K]);
		tensor(&args.v, b[RP_ATT_V], &c->operands[RP_ATT_V]);
		tensor(&args.o, b[RP_ATT_O], &c->operands[RP_ATT_O]);
		tensor(&args.stats, b[RP_ATT_STATS], &c->operands[RP_ATT_STATS]);
		e = rk_attention_forward(&args, (enum rk_dtype)c->operands[RP_ATT_Q].dtype, lane->stream);
		return e == cudaSuccess ? 0 : launch_failed(op, "attention forward", e);
	}

	rk_attn_bwd_args args = {
		.batch = a->batch, .heads = a->heads, .seq_q = a->seq_q, .seq_kv = a->seq_kv,
		.head_dim = (int)a->head_dim, .head_dim_v = (int)a->head_dim_v,
		.scale = (float)a->scale, .causal = a->causal,
	};
	tensor(&args.q, b[RP_ATB_Q], &c->operands[RP_ATB_Q]);
	tensor(&args.k, b[RP_ATB_K], &c->operands[RP_ATB_K]);
	tensor(&args.v, b[RP_ATB_V], &c->operands[RP_ATB_V]);
	tensor(&args.o, b[RP_ATB_O], &c->operands[RP_ATB_O]);
	tensor(&args.d_o, b[RP_ATB_DO], &c->operands[RP_ATB_DO]);
	tensor(&args.stats, b[RP_ATB_STATS], &c->operands[RP_ATB_STATS]);
	tensor(&args.d_q, b[RP_ATB_DQ], &c->operands[RP_ATB_DQ]);
	tensor(&args.d_k, b[RP_ATB_DK], &c->operands[RP_ATB_DK]);
	tensor(&args.d_v, b[RP_ATB_DV], &c->operands[RP_ATB_DV]);

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
	e = rk_attention_backward(&args, (enum rk_dtype)c->operands[RP_ATB_Q].dtype, delta, lane->stream);
	if (e != cudaSuccess)
		r = launch_failed(op, "attention backward", e);
	e = cudaFreeAsync(delta, lane->stream);
	if (e != cudaSuccess && r == 0)
		r = rp_error_set(&op->err, cuda_error_name(e), "freeing attention scratch: %s", cudaGetErrorString(e));
	return r;
}
