/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute.LayerNorm and LayerNormBackward: layer normalization
 * over the last dimension, as torch.nn.functional.layer_norm with
 * normalized_shape [n], and its gradients.
 *
 * x [rows, n], rows strided (last stride 1, row stride >= n); weight and
 * bias [n], contiguous, x's dtype; y [rows, n] in x's dtype; mean and rstd
 * f32 [rows]. The backward takes the forward's x, weight, mean and rstd with
 * d_y [rows, n], writes d_x [rows, n] and optionally d_weight and d_bias
 * [n], and adds an optional d_residual [rows, n] (the gradient arriving
 * through a residual connection) into d_x. The table says what each operand
 * is on its own and that the gradients have x's shape; layer_norm_check
 * derives rows and n from x and checks the vectors and the statistics
 * against them. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>

#include "compute.h"
#include "compute_check.h"
#include "errors.h"

#define F32 RP_DTYPE_BIT(RP_DTYPE_F32)
#define ROWS "a matrix [rows, n]"
#define VEC "a vector [n]"
#define STAT "a vector [rows] of f32 (the statistics are kept in f32)"

static const struct rp_operand_spec layer_norm_operands[RP_LN_OPERANDS] = {
	[RP_LN_X] = { "x", RP_ROLE_IN, true, 2, ROWS, RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_LN_WEIGHT] = { "weight", RP_ROLE_IN, true, 1, VEC, RP_DTYPES_ANY, RP_LN_X, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_LN_BIAS] = { "bias", RP_ROLE_IN, false, 1, VEC, RP_DTYPES_ANY, RP_LN_X, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_LN_Y] = { "y", RP_ROLE_OUT, true, 2, ROWS, RP_DTYPES_ANY, RP_LN_X, RP_LN_X, true, RP_NO_SLOT },
	[RP_LN_MEAN] = { "mean", RP_ROLE_OUT, false, 1, STAT, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_LN_RSTD] = { "rstd", RP_ROLE_OUT, false, 1, STAT, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
};

static const struct rp_operand_spec layer_norm_backward_operands[RP_LNB_OPERANDS] = {
	[RP_LNB_DY] = { "d_y", RP_ROLE_IN, true, 2, ROWS, RP_DTYPES_ANY, RP_LNB_X, RP_LNB_X, true, RP_NO_SLOT },
	[RP_LNB_X] = { "x", RP_ROLE_IN, true, 2, ROWS, RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_LNB_WEIGHT] = { "weight", RP_ROLE_IN, true, 1, VEC, RP_DTYPES_ANY, RP_LNB_X, RP_NO_SLOT, false,
			    RP_NO_SLOT },
	[RP_LNB_MEAN] = { "mean", RP_ROLE_IN, true, 1, STAT, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_LNB_RSTD] = { "rstd", RP_ROLE_IN, true, 1, STAT, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	/* d_x may be d_residual exactly: each element of the sum is read and
	 * written by one thread, so the sum can land in place. */
	[RP_LNB_DX] = { "d_x", RP_ROLE_OUT, true, 2, ROWS, RP_DTYPES_ANY, RP_LNB_X, RP_LNB_X, true, RP_LNB_DRESIDUAL },
	[RP_LNB_DWEIGHT] = { "d_weight", RP_ROLE_OUT, false, 1, VEC, RP_DTYPES_ANY, RP_LNB_WEIGHT, RP_LNB_WEIGHT, false,
			     RP_NO_SLOT },
	[RP_LNB_DBIAS] = { "d_bias", RP_ROLE_OUT, false, 1, VEC, RP_DTYPES_ANY, RP_LNB_WEIGHT, RP_LNB_WEIGHT, false,
			   RP_NO_SLOT },
	[RP_LNB_DRESIDUAL] = { "d_residual", RP_ROLE_IN, false, 2, ROWS, RP_DTYPES_ANY, RP_LNB_X, RP_LNB_X, true,
			       RP_NO_SLOT },
};

static const struct rp_field layer_norm_scalars[] = {
	{ "eps", RP_T_FLOAT, false },
	{ NULL, 0, false },
};

static const struct rp_field no_scalars[] = {
	{ NULL, 0, false },
};

/* eps: absent is 0 here, the default filled in by the check (a ring
 * record says "default" the same way); given, it must be a positive
 * finite number. */
static int layer_norm_read_scalars(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	int r = rp_params_double(params, "eps", 0.0, &c->layer_norm.eps, err);

	if (r < 0) {
		return r;
	}
	if (r == 0 && !(c->layer_norm.eps > 0.0)) {
		return rp_error_invalid_parameter(err, "eps");
	}
	return 0;
}

static int no_read_scalars(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	(void)params;
	(void)c;
	(void)err;
	return 0;
}

/* rows and n from x; the longest row the backends take. */
static int derive(struct rp_compute *c, int slot_x, struct rp_error *err)
{
	const struct rp_operand *x = &c->operands[slot_x];

	c->layer_norm.rows = x->shape[0];
	c->layer_norm.n = x->shape[1];
	if (c->layer_norm.n > RP_LAYER_NORM_N_MAX) {
		return rp_error_invalid_operand(err, "x",
						"x's rows are %" PRId64 " long; LayerNorm takes rows of at most %d "
						"elements",
						c->layer_norm.n, RP_LAYER_NORM_N_MAX);
	}
	return 0;
}

/* A vector operand of `len` elements (weight, bias: n; mean, rstd: rows). */
static int check_vector(const struct rp_compute *c, int slot, int64_t len, const char *of, struct rp_error *err)
{
	const struct rp_operand *v = rp_compute_operand(c, slot);
	const char *name = c->spec->operands[slot].name;

	if (v && v->shape[0] != len) {
		return rp_error_invalid_operand(err, name,
						"%s is %s but x is [%" PRId64 ", %" PRId64 "]: %s must be [%" PRId64
						"], one element per %s",
						name, rp_operand_shape_text(v).s, c->layer_norm.rows, c->layer_norm.n, name, len,
						of);
	}
	return 0;
}

static int layer_norm_check(struct rp_compute *c, struct rp_error *err)
{
	struct rp_layer_norm *ln = &c->layer_norm;
	int r;

	if ((r = derive(c, RP_LN_X, err)) < 0 || (r = check_vector(c, RP_LN_WEIGHT, ln->n, "column", err)) < 0 ||
	    (r = check_vector(c, RP_LN_BIAS, ln->n, "column", err)) < 0 ||
	    (r = check_vector(c, RP_LN_MEAN, ln->rows, "row", err)) < 0 ||
	    (r = check_vector(c, RP_LN_RSTD, ln->rows, "row", err)) < 0) {
		return r;
	}
	/* JSON's getters refuse what JSON cannot say, but cJSON turns 1e999
	 * into infinity, and a ring record carries any bits. */
	if (ln->eps == 0.0) {
		ln->eps = RP_LAYER_NORM_EPS_DEFAULT;
	}
	if (!isfinite(ln->eps) || !(ln->eps > 0.0)) {
		return rp_error_invalid_parameter(err, "eps");
	}
	return 0;
}

static int layer_norm_backward_check(struct rp_compute *c, struct rp_error *err)
{
	struct rp_layer_norm *ln = &c->layer_norm;
	int r;

	if ((r = derive(c, RP_LNB_X, err)) < 0 || (r = check_vector(c, RP_LNB_WEIGHT, ln->n, "column", err)) < 0 ||
	    (r = check_vector(c, RP_LNB_MEAN, ln->rows, "row", err)) < 0 ||
	    (r = check_vector(c, RP_LNB_RSTD, ln->rows, "row", err)) < 0) {
		return r;
	}
	/* The backward reads the forward's statistics, never eps: a record
	 * that carries one is another op's. */
	if (ln->eps != 0.0) {
		return rp_error_invalid_parameter(err, "eps");
	}
	return 0;
}

static void layer_norm_encode(const struct rp_compute *c, cJSON *params)
{
	/* 0 leaves the default to the parser; any other value goes as it is,
	 * for regend to judge (a negative one is refused there by name). */
	if (c->layer_norm.eps != 0.0) {
		cJSON_AddNumberToObject(params, "eps", c->layer_norm.eps);
	}
}

static void no_encode(const struct rp_compute *c, cJSON *params)
{
	(void)c;
	(void)params;
}

/* eps travels as the record's scale, 0 the default; the backward's record
 * carries it too, so that one that is not 0 is refused by name (the
 * backward's check). */
static const struct rp_op_ring_scalar layer_norm_ring_scalars[] = {
	{ "eps", RP_RING_FIELD_SCALE, 0, offsetof(struct rp_compute, layer_norm.eps), NULL },
	{ NULL },
};

const struct rp_op_spec rp_op_layer_norm = {
	.id = RP_OP_LAYER_NORM,
	.method = "io.regen.Compute.LayerNorm",
	.name = "layer_norm",
	.noperands = RP_LN_OPERANDS,
	.operands = layer_norm_operands,
	.scalars = layer_norm_scalars,
	.read_scalars = layer_norm_read_scalars,
	.check = layer_norm_check,
	.encode = layer_norm_encode,
	.ring_scalars = layer_norm_ring_scalars,
};

const struct rp_op_spec rp_op_layer_norm_backward = {
	.id = RP_OP_LAYER_NORM_BACKWARD,
	.method = "io.regen.Compute.LayerNormBackward",
	.name = "layer_norm_backward",
	.noperands = RP_LNB_OPERANDS,
	.operands = layer_norm_backward_operands,
	.scalars = no_scalars,
	.read_scalars = no_read_scalars,
	.check = layer_norm_backward_check,
	.encode = no_encode,
	.ring_scalars = layer_norm_ring_scalars,
};
