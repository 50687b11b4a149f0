/* SPDX-License-Identifier: Apache-2.0 */
/* Quantize, TransposeQuantize and ScaleUpdate on the CUDA backend: regen's
 * own kernels (kernels/fp8.cu) on the lane's stream, no scratch. (The FP8
 * GEMM is gemm.c's, through cuBLASLt.) Registered only where nvcc built the
 * kernels (REGEN_HAVE_KERNELS); elsewhere the lane answers
 * MethodNotImplemented. */
#include "regen-config.h"

#include <errno.h>
#include <math.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

#if REGEN_HAVE_KERNELS
#include "kernels/kernels.h"

static int launch_failed(struct rd_op *op, const char *what, cudaError_t e)
{
	rp_error_set(&op->err, cuda_error_name(e), "%s: %s", what, cudaGetErrorString(e));
	return -EIO;
}

static int quantize(struct cuda_lane *lane, struct rd_op *op, void *const *p)
{
	const struct rp_compute *c = &op->compute;
	const struct rp_operand *y = rp_compute_operand(c, RP_QUANT_Y);
	const struct rp_operand *y_t = c->spec->noperands > RP_QUANT_Y_T ? rp_compute_operand(c, RP_QUANT_Y_T) : NULL;
	const struct rk_quantize a = {
		.dtype = (enum rk_dtype)c->operands[RP_QUANT_X].dtype,
		.e5m2 = (y ? y->dtype : y_t->dtype) == RP_DTYPE_E5M2,
		.rows = c->quantize.rows,
		.cols = c->quantize.cols,
		.x_ld = c->operands[RP_QUANT_X].strides[0],
		.y_ld = y ? y->strides[0] : 0,
		.y_t_ld = y_t ? y_t->strides[0] : 0,
		.x = p[RP_QUANT_X],
		.scale = p[RP_QUANT_SCALE],
		.y = y ? p[RP_QUANT_Y] : NULL,
		.y_t = y_t ? p[RP_QUANT_Y_T] : NULL,
		.amax = c->present[RP_QUANT_AMAX] ? p[RP_QUANT_AMAX] : NULL,
	};
	cudaError_t e = rk_quantize(&a, lane->stream);

	cuda_launch_mark(lane, CUDA_PHASE_KERNEL);
	return e == cudaSuccess ? 0 : launch_failed(op, "launching the quantize kernel", e);
}

static int scale_update(struct cuda_lane *lane, struct rd_op *op, void *const *p)
{
	const struct rp_compute *c = &op->compute;
	const struct rp_scale_update *u = &c->scale_update;
	const struct rk_scale_update a = {
		.history = u->history,
		.n = u->n,
		.history_ld = c->operands[RP_SCU_AMAX_HISTORY].strides[0],
		.history_out_ld = c->operands[RP_SCU_AMAX_HISTORY_OUT].strides[0],
		.most_recent = u->amax_compute == RP_AMAX_COMPUTE_MOST_RECENT,
		/* Transformer Engine's f32 arithmetic, as the host's. */
		.scaled_max = (float)rp_fp8_max(rp_fp8_format_dtype(u->format)) * powf(2.0f, -(float)u->margin),
		.amax_history = p[RP_SCU_AMAX_HISTORY],
		.scale = p[RP_SCU_SCALE],
		.amax_history_out = p[RP_SCU_AMAX_HISTORY_OUT],
		.scale_out = p[RP_SCU_SCALE_OUT],
		.scale_inv = c->present[RP_SCU_SCALE_INV] ? p[RP_SCU_SCALE_INV] : NULL,
	};
	cudaError_t e = rk_scale_update(&a, lane->stream);

	cuda_launch_mark(lane, CUDA_PHASE_KERNEL);
	return e == cudaSuccess ? 0 : launch_failed(op, "launching the scale update kernel", e);
}

int cuda_fp8_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	void *p[RP_OP_OPERANDS_MAX];
	int r = cuda_operand_pointers(op, p, &op->err);

	if (r < 0)
		return r;
	return op->compute.spec->id == RP_OP_SCALE_UPDATE ? scale_update(lane, op, p) : quantize(lane, op, p);
}

#else

int cuda_fp8_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	(void)lane;
	rp_error_set(&op->err, RP_ERR_METHOD_NOT_IMPLEMENTED,
		     "this regend was built without nvcc, and %s on the CUDA backend needs its kernels "
		     "(kernels/fp8.cu)",
		     op->compute.spec->method);
	return -EOPNOTSUPP;
}

#endif
