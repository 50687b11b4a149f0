/* SPDX-License-Identifier: Apache-2.0 */
/* FP8's scaling state as operations: io.regen.Compute.Quantize,
 * TransposeQuantize and ScaleUpdate. The state (scales, amax histories) is
 * tensors in the rank's memory; these operations read and write it there, so
 * a restart or a respawn of regend's worker loses none of it.
 *
 * Quantize: y = fp8(x * scale) for x [rows, cols] (f32, f16 or bf16, rows
 * strided), scale an f32 [1] (Transformer Engine's scale: stored = real *
 * scale), y [rows, cols] in e4m3 or e5m2, rounded to nearest even and
 * saturated to the dtype's largest finite value (NaN stays NaN), and amax,
 * an optional f32 [1], max |x| (NaN ignored, as fmaxf does). The product
 * x * scale is an f32 multiply, then the one rounding to FP8.
 * TransposeQuantize writes y_t [cols, rows] = y's transpose (the other
 * layout an FP8 GEMM's operand may need), and y itself when given.
 *
 * ScaleUpdate: Transformer Engine's delayed-scaling update
 * (amax_and_scale_update, common/recipe/delayed_scaling.cu) over N scales
 * at once. amax_history [H, N] f32, column i the history of scale i, row 0
 * the newest (where this step's Quantize and Gemm wrote their amax); scale
 * [N] f32. Per column: amax = max of the column (amax_compute "max") or its
 * row 0 ("most_recent"); the column rolled up by one (row i takes row
 * i + 1, the last row takes the old row 0) and row 0 zeroed, into
 * amax_history_out; scale_out = fp8_max * 2^-margin / amax where amax is
 * finite and positive, else the old scale; an infinite quotient (an amax
 * too small) becomes FLT_MAX; scale_inv = 1 / scale_out. fp8_max is 448 for
 * e4m3, 57344 for e5m2. Each output may be its input itself. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>

#include "compute.h"
#include "compute_check.h"
#include "errors.h"

#define F32 RP_DTYPE_BIT(RP_DTYPE_F32)
#define SCALAR "a vector [1] of f32"
#define X "a matrix [rows, cols]"

static const struct rp_operand_spec quantize_operands[RP_QUANT_OPERANDS] = {
	[RP_QUANT_X] = { "x", RP_ROLE_IN, true, 2, X, RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_QUANT_SCALE] = { "scale", RP_ROLE_IN, true, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_QUANT_Y] = { "y", RP_ROLE_OUT, true, 2, X, RP_DTYPES_FP8, RP_NO_SLOT, RP_QUANT_X, true, RP_NO_SLOT },
	[RP_QUANT_AMAX] = { "amax", RP_ROLE_OUT, false, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
};

/* TransposeQuantize's table: Quantize's, y optional, and y_t. */
static const struct rp_operand_spec transpose_quantize_operands[RP_QUANT_OPERANDS] = {
	[RP_QUANT_X] = { "x", RP_ROLE_IN, true, 2, X, RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_QUANT_SCALE] = { "scale", RP_ROLE_IN, true, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_QUANT_Y] = { "y", RP_ROLE_OUT, false, 2, X, RP_DTYPES_FP8, RP_QUANT_Y_T, RP_QUANT_X, true, RP_NO_SLOT },
	[RP_QUANT_AMAX] = { "amax", RP_ROLE_OUT, false, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_QUANT_Y_T] = { "y_t", RP_ROLE_OUT, true, 2, "a matrix [cols, rows]", RP_DTYPES_FP8, RP_NO_SLOT, RP_NO_SLOT,
			   true, RP_NO_SLOT },
};

#define HISTORY "a matrix [H, N] of f32"
#define VEC_N "a vector [N] of f32"
static const struct rp_operand_spec scale_update_operands[RP_SCU_OPERANDS] = {
	[RP_SCU_AMAX_HISTORY] = { "amax_history", RP_ROLE_IN, true, 2, HISTORY, F32, RP_NO_SLOT, RP_NO_SLOT, true,
				  RP_NO_SLOT },
	[RP_SCU_SCALE] = { "scale", RP_ROLE_IN, true, 1, VEC_N, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_SCU_AMAX_HISTORY_OUT] = { "amax_history_out", RP_ROLE_OUT, true, 2, HISTORY, F32, RP_NO_SLOT,
				      RP_SCU_AMAX_HISTORY, true, RP_SCU_AMAX_HISTORY },
	[RP_SCU_SCALE_OUT] = { "scale_out", RP_ROLE_OUT, true, 1, VEC_N, F32, RP_NO_SLOT, RP_SCU_SCALE, false,
			       RP_SCU_SCALE },
	[RP_SCU_SCALE_INV] = { "scale_inv", RP_ROLE_OUT, false, 1, VEC_N, F32, RP_NO_SLOT, RP_SCU_SCALE, false,
			       RP_NO_SLOT },
};

static const struct rp_field no_scalars[] = {
	{ NULL, 0, false },
};

static const struct rp_field scale_update_scalars[] = {
	{ "fp8_dtype", RP_T_STRING, false },
	{ "amax_compute", RP_T_STRING, false },
	{ "margin", RP_T_FLOAT, false },
	{ NULL, 0, false },
};

/* In enum rp_fp8_format / rp_amax_compute order. */
static const char *const fp8_names[] = { "e4m3", "e5m2", NULL };
static const char *const amax_compute_names[] = { "max", "most_recent", NULL };

static int no_read_scalars(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	(void)params;
	(void)c;
	(void)err;
	return 0;
}

static void no_encode(const struct rp_compute *c, cJSON *params)
{
	(void)c;
	(void)params;
}

/* A scale or amax of one element. */
static int check_one(const struct rp_compute *c, int slot, struct rp_error *err)
{
	const struct rp_operand *op = rp_compute_operand(c, slot);
	const char *name = c->spec->operands[slot].name;

	if (op && op->shape[0] != 1) {
		return rp_error_invalid_operand(err, name,
						"%s is %s but must be [1]: one f32 for the whole tensor (per-tensor "
						"scaling)",
						name, rp_operand_shape_text(op).s);
	}
	return 0;
}

static int quantize_check(struct rp_compute *c, struct rp_error *err)
{
	const struct rp_operand *x = &c->operands[RP_QUANT_X];
	const struct rp_operand *y_t = rp_compute_operand(c, RP_QUANT_Y_T);
	int r;

	c->quantize.rows = x->shape[0];
	c->quantize.cols = x->shape[1];
	if ((r = check_one(c, RP_QUANT_SCALE, err)) < 0 || (r = check_one(c, RP_QUANT_AMAX, err)) < 0) {
		return r;
	}
	if (y_t) {
		const int64_t t[2] = { x->shape[1], x->shape[0] };

		if (!rp_operand_shape_is(y_t, 2, t)) {
			return rp_error_invalid_operand(err, "y_t", "y_t is %s but x is %s: y_t must be %s, x transposed",
							rp_operand_shape_text(y_t).s, rp_operand_shape_text(x).s,
							rp_shape_fmt(2, t).s);
		}
	}
	return 0;
}

static int scale_update_read_scalars(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	struct rp_scale_update *u = &c->scale_update;
	int r, f, a;

	if ((r = rp_params_enum(params, "fp8_dtype", fp8_names, RP_FP8_E4M3, &f, err)) < 0 ||
	    (r = rp_params_enum(params, "amax_compute", amax_compute_names, RP_AMAX_COMPUTE_MAX, &a, err)) < 0 ||
	    (r = rp_params_double(params, "margin", 0.0, &u->margin, err)) < 0) {
		return r;
	}
	u->format = (enum rp_fp8_format)f;
	u->amax_compute = (enum rp_amax_compute)a;
	return 0;
}

/* The margin is a power of two's exponent: finite, and within what an f32
 * scale can carry (2^±126 already leaves no FP8 value representable). */
#define MARGIN_MAX 126.0

static int scale_update_check(struct rp_compute *c, struct rp_error *err)
{
	struct rp_scale_update *u = &c->scale_update;
	const struct rp_operand *h = &c->operands[RP_SCU_AMAX_HISTORY], *s = &c->operands[RP_SCU_SCALE];

	if ((unsigned)u->format > RP_FP8_E5M2) {
		return rp_error_invalid_parameter(err, "fp8_dtype");
	}
	if ((unsigned)u->amax_compute > RP_AMAX_COMPUTE_MOST_RECENT) {
		return rp_error_invalid_parameter(err, "amax_compute");
	}
	if (!(fabs(u->margin) <= MARGIN_MAX)) {
		return rp_error_invalid_parameter(err, "margin");
	}
	u->history = h->shape[0];
	u->n = h->shape[1];
	if (s->shape[0] != u->n) {
		return rp_error_invalid_operand(err, "scale",
						"scale is %s but amax_history is %s: one scale per column, [%" PRId64 "]",
						rp_operand_shape_text(s).s, rp_operand_shape_text(h).s, u->n);
	}
	return 0;
}

static void scale_update_encode(const struct rp_compute *c, cJSON *params)
{
	const struct rp_scale_update *u = &c->scale_update;

	if (u->format != RP_FP8_E4M3) {
		cJSON_AddStringToObject(params, "fp8_dtype", fp8_names[u->format]);
	}
	if (u->amax_compute != RP_AMAX_COMPUTE_MAX) {
		cJSON_AddStringToObject(params, "amax_compute", amax_compute_names[u->amax_compute]);
	}
	if (u->margin != 0.0) {
		cJSON_AddNumberToObject(params, "margin", u->margin);
	}
}

/* The record's byte and double fields are shared by every op: ScaleUpdate
 * keeps its two enums in the epilogue and compute bytes and its margin in
 * the scale double. */
#define AT(field) offsetof(struct rp_compute, scale_update.field)
static const struct rp_op_ring_scalar scale_update_ring_scalars[] = {
	{ "fp8_dtype", RP_RING_FIELD_EPILOGUE, 0, AT(format), fp8_names },
	{ "amax_compute", RP_RING_FIELD_COMPUTE, 0, AT(amax_compute), amax_compute_names },
	{ "margin", RP_RING_FIELD_SCALE, 0, AT(margin), NULL },
	{ NULL },
};
#undef AT

static const struct rp_op_ring_scalar no_ring_scalars[] = {
	{ NULL },
};

const struct rp_op_spec rp_op_quantize = {
	.id = RP_OP_QUANTIZE,
	.method = "io.regen.Compute.Quantize",
	.name = "quantize",
	.noperands = RP_QUANT_Y_T,   /* no y_t */
	.operands = quantize_operands,
	.scalars = no_scalars,
	.read_scalars = no_read_scalars,
	.check = quantize_check,
	.encode = no_encode,
	.ring_scalars = no_ring_scalars,
};

const struct rp_op_spec rp_op_transpose_quantize = {
	.id = RP_OP_TRANSPOSE_QUANTIZE,
	.method = "io.regen.Compute.TransposeQuantize",
	.name = "transpose_quantize",
	.noperands = RP_QUANT_OPERANDS,
	.operands = transpose_quantize_operands,
	.scalars = no_scalars,
	.read_scalars = no_read_scalars,
	.check = quantize_check,
	.encode = no_encode,
	.ring_scalars = no_ring_scalars,
};

const struct rp_op_spec rp_op_scale_update = {
	.id = RP_OP_SCALE_UPDATE,
	.method = "io.regen.Compute.ScaleUpdate",
	.name = "scale_update",
	.noperands = RP_SCU_OPERANDS,
	.operands = scale_update_operands,
	.scalars = scale_update_scalars,
	.read_scalars = scale_update_read_scalars,
	.check = scale_update_check,
	.encode = scale_update_encode,
	.ring_scalars = scale_update_ring_scalars,
};
