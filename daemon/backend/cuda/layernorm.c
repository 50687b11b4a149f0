/* SPDX-License-Identifier: Apache-2.0 */
/* LayerNorm and LayerNormBackward on the CUDA backend: regen's own kernels
 * (kernels/layernorm.cu), enqueued on the lane's stream with nothing to
 * wait for on the way. The backward's d_weight and d_bias go through f32
 * partial sums in scratch taken from the device's pool on the lane's stream
 * (scratch.c, as a GEMM's workspace is), counted against max_scratch. Registered only where nvcc built the kernels
 * (REGEN_HAVE_KERNELS); elsewhere the lane answers MethodNotImplemented. */
#include "regen-config.h"

#include <errno.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

#if REGEN_HAVE_KERNELS
#include "kernels/kernels.h"

_Static_assert(RK_LAYER_NORM_N_MAX == RP_LAYER_NORM_N_MAX, "the kernels take the rows the protocol allows");
_Static_assert((int)RK_F32 == (int)RP_DTYPE_F32 && (int)RK_F16 == (int)RP_DTYPE_F16 &&
		       (int)RK_BF16 == (int)RP_DTYPE_BF16,
	       "the kernels' dtypes are the protocol's");

static int launch_failed(struct rd_op *op, const char *what, cudaError_t e)
{
	rp_error_set(&op->err, cuda_error_name(e), "%s: %s", what, cudaGetErrorString(e));
	return -EIO;
}

static int forward(struct cuda_lane *lane, struct rd_op *op, void *const *p)
{
	const struct rp_compute *c = &op->compute;
	const struct rk_layer_norm a = {
		.dtype = (enum rk_dtype)c->operands[RP_LN_X].dtype,
		.rows = c->layer_norm.rows,
		.n = c->layer_norm.n,
		.x = p[RP_LN_X],
		.weight = p[RP_LN_WEIGHT],
		.bias = p[RP_LN_BIAS],
		.y = p[RP_LN_Y],
		.x_ld = c->operands[RP_LN_X].strides[0],
		.y_ld = c->operands[RP_LN_Y].strides[0],
		.mean = p[RP_LN_MEAN],
		.rstd = p[RP_LN_RSTD],
		.eps = (float)c->layer_norm.eps,
	};
	cudaError_t e = rk_layer_norm(&a, lane->stream);

	cuda_launch_mark(lane, CUDA_PHASE_KERNEL);
	return e == cudaSuccess ? 0 : launch_failed(op, "launching the LayerNorm kernel", e);
}

static int backward(struct cuda_lane *lane, struct rd_op *op, void *const *p)
{
	struct cuda_dev *cd = lane->cd;
	const struct rp_compute *c = &op->compute;
	const struct rp_layer_norm *ln = &c->layer_norm;
	struct rk_layer_norm_backward a = {
		.dtype = (enum rk_dtype)c->operands[RP_LNB_X].dtype,
		.rows = ln->rows,
		.n = ln->n,
		.d_y = p[RP_LNB_DY],
		.x = p[RP_LNB_X],
		.weight = p[RP_LNB_WEIGHT],
		.d_residual = p[RP_LNB_DRESIDUAL],
		.mean = p[RP_LNB_MEAN],
		.rstd = p[RP_LNB_RSTD],
		.d_x = p[RP_LNB_DX],
		.d_weight = p[RP_LNB_DWEIGHT],
		.d_bias = p[RP_LNB_DBIAS],
		.d_y_ld = c->operands[RP_LNB_DY].strides[0],
		.x_ld = c->operands[RP_LNB_X].strides[0],
		.d_x_ld = c->operands[RP_LNB_DX].strides[0],
		.d_residual_ld = c->present[RP_LNB_DRESIDUAL] ? c->operands[RP_LNB_DRESIDUAL].strides[0] : 0,
	};
	const size_t bytes = a.d_weight || a.d_bias ? rk_layer_norm_backward_scratch(ln->rows, ln->n) : 0;
	const uint64_t cap = cd->dev->max_scratch;
	struct cuda_scratch scratch = { 0 };
	cudaError_t e;
	int r = 0;

	if (cap && bytes > cap) {
		rp_err_limit_exceeded(&op->err, "scratch", (long long)cap,
				      "LayerNormBackward of [%lld, %lld] needs %zu bytes of scratch for d_weight and "
				      "d_bias, more than the %llu one call may take (max_scratch_mib)",
				      (long long)ln->rows, (long long)ln->n, bytes, (unsigned long long)cap);
		return -E2BIG;
	}
	if (cuda_scratch_take(lane, bytes, &scratch, "LayerNormBackward", &op->err))
		return -EIO;
	a.partial = scratch.ptr;
	cuda_launch_mark(lane, CUDA_PHASE_SCRATCH);
	e = rk_layer_norm_backward(&a, lane->stream);
	cuda_launch_mark(lane, CUDA_PHASE_KERNEL);
	if (e != cudaSuccess)
		r = launch_failed(op, "launching the LayerNormBackward kernels", e);
	e = cuda_scratch_give(lane, &scratch);
	if (e != cudaSuccess && r == 0)
		r = launch_failed(op, "freeing LayerNormBackward's scratch", e);
	cuda_launch_mark(lane, CUDA_PHASE_FREE);
	return r;
}

int cuda_layer_norm_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	void *p[RP_OP_OPERANDS_MAX];
	int r = cuda_operand_pointers(op, p, &op->err);

	if (r < 0)
		return r;
	return op->compute.spec->id == RP_OP_LAYER_NORM ? forward(lane, op, p) : backward(lane, op, p);
}

#else

int cuda_layer_norm_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	(void)lane;
	rp_error_set(&op->err, RP_ERR_METHOD_NOT_IMPLEMENTED,
		     "this regend was built without nvcc, and %s on the CUDA backend needs its kernels "
		     "(kernels/layernorm.cu)",
		     op->compute.spec->method);
	return -EOPNOTSUPP;
}

#endif
