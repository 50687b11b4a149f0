/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute.Gemm: D = epilogue(alpha op(A) op(B) + beta C + bias),
 * or for dgelu (alpha op(A) op(B) + beta C) * GELU'(aux); gelu_aux and
 * gelu_aux_bias also write GELU's input to aux_out.
 *
 * The table says what each operand is on its own; gemm_check says what
 * only the call as a whole can: K agrees, D, C, aux and aux_out are [M, N],
 * bias is [N], beta needs C, a bias epilogue needs a bias and a bias needs
 * one, dgelu needs aux and aux needs dgelu, gelu_aux(_bias) needs aux_out
 * and aux_out needs one of them, tf32 only multiplies f32. Inputs
 * share a dtype, outputs share one; D may be wider than A and B (bf16 in,
 * f32 out), as cuBLASLt allows.
 *
 * FP8 (check_fp8): A and B in e4m3 or e5m2, not both e5m2 (cuBLASLt has no
 * such kernel), each with its scale, an f32 [1] in the rank's memory that
 * turns stored values into real ones (cuBLASLt's A and B scales, Transformer
 * Engine's scale_inv); op(A) op(B) is then of those real values. D in bf16,
 * f16 or f32, or in FP8 with d_scale (f32 [1], multiplying the result into
 * D's range) and optionally amax_d (f32 [1]: the largest |result| before
 * d_scale, written by the GEMM itself); e5m2 only with an e5m2 input
 * (cuBLASLt has no e4m3 x e4m3 -> e5m2 kernel). The layout is cuBLASLt's only FP8
 * one on Hopper (its "TN"): A [M, K] and B [N, K], both K-contiguous, so
 * trans_a false and trans_b true; TransposeQuantize gives the other layout
 * of an operand. Epilogues none, bias, gelu and gelu_bias; a bias takes D's
 * dtype, bf16 or f16; no C with an FP8 D. Because dtype relations differ
 * with FP8, the table shares no dtype among Gemm's operands: check_dtypes
 * says it, with the table machinery's words. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>

#include "compute.h"
#include "compute_check.h"
#include "errors.h"
#include "ring.h"

#define ANY_OR_FP8 (RP_DTYPES_ANY | RP_DTYPES_FP8)
#define F32 RP_DTYPE_BIT(RP_DTYPE_F32)
#define SCALAR "a vector [1] of f32"

static const struct rp_operand_spec gemm_operands[RP_GEMM_OPERANDS] = {
	[RP_GEMM_A] = { "a", RP_ROLE_IN, true, 2, "a matrix", ANY_OR_FP8, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_GEMM_B] = { "b", RP_ROLE_IN, true, 2, "a matrix", ANY_OR_FP8, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_GEMM_C] = { "c", RP_ROLE_IN, false, 2, "a matrix", RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, true, RP_NO_SLOT },
	[RP_GEMM_D] = { "d", RP_ROLE_OUT, true, 2, "a matrix", ANY_OR_FP8, RP_NO_SLOT, RP_NO_SLOT, true, RP_GEMM_C },
	[RP_GEMM_BIAS] = { "bias", RP_ROLE_IN, false, 1, "a vector of N", RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, false,
			   RP_NO_SLOT },
	/* dgelu's GELU input of the forward pass, laid out as D is. */
	[RP_GEMM_AUX] = { "aux", RP_ROLE_IN, false, 2, "a matrix [M, N]", RP_DTYPES_ANY, RP_NO_SLOT, RP_NO_SLOT, true,
			  RP_NO_SLOT },
	/* gelu_aux's GELU input, written for a later dgelu, laid out as D is. */
	[RP_GEMM_AUX_OUT] = { "aux_out", RP_ROLE_OUT, false, 2, "a matrix [M, N]", RP_DTYPES_ANY, RP_NO_SLOT,
			      RP_NO_SLOT, true, RP_NO_SLOT },
	/* FP8: the scales, and the output's amax. */
	[RP_GEMM_A_SCALE] = { "a_scale", RP_ROLE_IN, false, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_GEMM_B_SCALE] = { "b_scale", RP_ROLE_IN, false, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_GEMM_D_SCALE] = { "d_scale", RP_ROLE_IN, false, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_GEMM_AMAX_D] = { "amax_d", RP_ROLE_OUT, false, 1, SCALAR, F32, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
};

static const struct rp_field gemm_scalars[] = {
	{ "trans_a", RP_T_BOOL, false },
	{ "trans_b", RP_T_BOOL, false },
	{ "alpha", RP_T_FLOAT, false },
	{ "beta", RP_T_FLOAT, false },
	{ "epilogue", RP_T_STRING, false },
	{ "compute", RP_T_STRING, false },
	{ NULL, 0, false },
};

/* In enum rp_epilogue / rp_compute_mode order. */
static const char *const epilogue_names[] = { "none", "bias", "gelu", "gelu_bias", "dgelu", "gelu_aux",
					      "gelu_aux_bias", NULL };
static const char *const compute_names[] = { "f32", "tf32", "fp8_fast_accum", NULL };

static bool epilogue_adds_bias(enum rp_epilogue e)
{
	return e == RP_EPILOGUE_BIAS || e == RP_EPILOGUE_GELU_BIAS || e == RP_EPILOGUE_GELU_AUX_BIAS;
}

static bool epilogue_writes_aux(enum rp_epilogue e)
{
	return e == RP_EPILOGUE_GELU_AUX || e == RP_EPILOGUE_GELU_AUX_BIAS;
}

static int gemm_read_scalars(const cJSON *params, struct rp_compute *call, struct rp_error *err)
{
	struct rp_gemm *g = &call->gemm;
	int r, e, c;

	if ((r = rp_params_bool(params, "trans_a", false, &g->trans_a, err)) < 0 ||
	    (r = rp_params_bool(params, "trans_b", false, &g->trans_b, err)) < 0 ||
	    (r = rp_params_double(params, "alpha", 1.0, &g->alpha, err)) < 0 ||
	    (r = rp_params_double(params, "beta", 0.0, &g->beta, err)) < 0 ||
	    (r = rp_params_enum(params, "epilogue", epilogue_names, RP_EPILOGUE_NONE, &e, err)) < 0 ||
	    (r = rp_params_enum(params, "compute", compute_names, RP_COMPUTE_F32, &c, err)) < 0) {
		return r;
	}
	g->epilogue = (enum rp_epilogue)e;
	g->compute = (enum rp_compute_mode)c;
	return 0;
}

/* The scalars' values, however they came: JSON's getters refuse what JSON
 * cannot say, but cJSON still turns 1e999 into infinity, and a ring record
 * carries any bits. */
static int check_scalars(const struct rp_gemm *g, struct rp_error *err)
{
	if ((unsigned)g->epilogue > RP_EPILOGUE_LAST) {
		return rp_error_invalid_parameter(err, "epilogue");
	}
	if ((unsigned)g->compute > RP_COMPUTE_LAST) {
		return rp_error_invalid_parameter(err, "compute");
	}
	if (!isfinite(g->alpha)) {
		return rp_error_invalid_parameter(err, "alpha");
	}
	if (!isfinite(g->beta)) {
		return rp_error_invalid_parameter(err, "beta");
	}
	return 0;
}

static int check_shapes(struct rp_compute *c, struct rp_error *err)
{
	struct rp_gemm *g = &c->gemm;
	const struct rp_operand *a = &c->operands[RP_GEMM_A], *b = &c->operands[RP_GEMM_B];
	const struct rp_operand *d = &c->operands[RP_GEMM_D];
	const struct rp_operand *cm = rp_compute_operand(c, RP_GEMM_C), *bias = rp_compute_operand(c, RP_GEMM_BIAS);
	const struct rp_operand *aux = rp_compute_operand(c, RP_GEMM_AUX);
	const struct rp_operand *aux_out = rp_compute_operand(c, RP_GEMM_AUX_OUT);
	const int64_t ma = g->trans_a ? a->shape[1] : a->shape[0];
	const int64_t ka = g->trans_a ? a->shape[0] : a->shape[1];
	const int64_t kb = g->trans_b ? b->shape[1] : b->shape[0];
	const int64_t nb = g->trans_b ? b->shape[0] : b->shape[1];
	const int64_t opa[2] = { ma, ka }, opb[2] = { kb, nb }, mn[2] = { ma, nb };

	if (ka != kb) {
		/* The usual cause is a transpose flag: say so when flipping
		 * one would make the shapes agree. */
		const int64_t ka_flip = g->trans_a ? a->shape[1] : a->shape[0];
		const int64_t kb_flip = g->trans_b ? b->shape[0] : b->shape[1];
		bool flip_helps = ka_flip == kb || ka == kb_flip || ka_flip == kb_flip;

		return rp_error_invalid_operand(err, "b",
						"op(A) is %s but op(B) is %s: K must agree (%" PRId64 " vs %" PRId64 ")%s",
						rp_shape_fmt(2, opa).s, rp_shape_fmt(2, opb).s, ka, kb,
						flip_helps ? "; check trans_a and trans_b" : "");
	}
	if (!rp_operand_shape_is(d, 2, mn)) {
		return rp_error_invalid_operand(err, "d", "d is %s but op(A) op(B) is %s", rp_operand_shape_text(d).s,
						rp_shape_fmt(2, mn).s);
	}
	if (cm && !rp_operand_shape_is(cm, 2, mn)) {
		return rp_error_invalid_operand(err, "c", "c is %s but op(A) op(B) is %s", rp_operand_shape_text(cm).s,
						rp_shape_fmt(2, mn).s);
	}
	if (aux && !rp_operand_shape_is(aux, 2, mn)) {
		return rp_error_invalid_operand(err, "aux", "aux is %s but op(A) op(B) is %s; aux must be D's shape",
						rp_operand_shape_text(aux).s, rp_shape_fmt(2, mn).s);
	}
	if (aux_out && !rp_operand_shape_is(aux_out, 2, mn)) {
		return rp_error_invalid_operand(err, "aux_out",
						"aux_out is %s but op(A) op(B) is %s; aux_out must be D's shape",
						rp_operand_shape_text(aux_out).s, rp_shape_fmt(2, mn).s);
	}
	if (bias && bias->shape[0] != nb) {
		return rp_error_invalid_operand(err, "bias",
						"bias is %s but op(A) op(B) has %" PRId64 " columns; bias must be [%" PRId64 "]",
						rp_operand_shape_text(bias).s, nb, nb);
	}
	g->m = ma;
	g->n = nb;
	g->k = ka;
	return 0;
}

static int check_options(const struct rp_compute *c, struct rp_error *err)
{
	const struct rp_gemm *g = &c->gemm;
	bool has_c = c->present[RP_GEMM_C], has_bias = c->present[RP_GEMM_BIAS], has_aux = c->present[RP_GEMM_AUX];
	bool has_aux_out = c->present[RP_GEMM_AUX_OUT];

	if (g->beta != 0.0 && !has_c) {
		return rp_error_invalid_operand(err, "c",
						"beta is %g, which scales c, but no c was given; pass c or leave beta 0", g->beta);
	}
	if (epilogue_adds_bias(g->epilogue) && !has_bias) {
		return rp_error_invalid_operand(err, "bias", "epilogue %s adds a bias but no bias was given",
						epilogue_names[g->epilogue]);
	}
	if (g->epilogue == RP_EPILOGUE_DGELU && has_bias) {
		return rp_error_invalid_operand(err, "bias",
						"epilogue dgelu takes no bias (its bias gradient is a GEMM of its own); "
						"leave bias out");
	}
	if (!epilogue_adds_bias(g->epilogue) && has_bias) {
		return rp_error_invalid_operand(err, "bias",
						"a bias was given but epilogue %s does not add one; use bias or gelu_bias",
						epilogue_names[g->epilogue]);
	}
	if (g->epilogue == RP_EPILOGUE_DGELU && !has_aux) {
		return rp_error_invalid_operand(err, "aux",
						"epilogue dgelu multiplies by GELU'(aux) but no aux was given; pass the "
						"forward's pre-activation, shaped like d");
	}
	if (g->epilogue != RP_EPILOGUE_DGELU && has_aux) {
		return rp_error_invalid_operand(err, "aux",
						"an aux was given but epilogue %s does not read one; aux is for dgelu",
						epilogue_names[g->epilogue]);
	}
	if (epilogue_writes_aux(g->epilogue) && !has_aux_out) {
		return rp_error_invalid_operand(err, "aux_out",
						"epilogue %s writes GELU's input to aux_out but no aux_out was given; pass "
						"a matrix shaped like d",
						epilogue_names[g->epilogue]);
	}
	if (!epilogue_writes_aux(g->epilogue) && has_aux_out) {
		return rp_error_invalid_operand(err, "aux_out",
						"an aux_out was given but epilogue %s does not write one; aux_out is for "
						"gelu_aux and gelu_aux_bias",
						epilogue_names[g->epilogue]);
	}
	/* TF32 is a way of multiplying f32 inputs; it means nothing for
	 * inputs that are already 16-bit. */
	if (g->compute == RP_COMPUTE_TF32 && c->operands[RP_GEMM_A].dtype != RP_DTYPE_F32) {
		return rp_error_invalid_parameter(err, "compute");
	}
	/* Likewise fast accumulation is a way of summing FP8 products. */
	if (g->compute == RP_COMPUTE_FP8_FAST_ACCUM && !rp_dtype_is_fp8(c->operands[RP_GEMM_A].dtype)) {
		return rp_error_invalid_parameter(err, "compute");
	}
	return 0;
}

/* The table machinery's refusal for two operands that must share a
 * dtype, in its words. */
static int same_dtype(const struct rp_compute *c, int slot, int like, struct rp_error *err)
{
	const struct rp_operand *op = rp_compute_operand(c, slot), *ref = rp_compute_operand(c, like);
	const char *name = gemm_operands[slot].name, *ref_name = gemm_operands[like].name;

	if (op && ref && op->dtype != ref->dtype) {
		return rp_error_invalid_operand(err, name, "%s is %s but %s is %s: they must share a dtype", name,
						rp_dtype_name(op->dtype), ref_name, rp_dtype_name(ref->dtype));
	}
	return 0;
}

static bool is_fp8_at(const struct rp_compute *c, int slot)
{
	return c->present[slot] && rp_dtype_is_fp8(c->operands[slot].dtype);
}

/* A scale or amax: present exactly when wanted, and one element. */
static int check_scale(const struct rp_compute *c, int slot, bool wanted, const char *why_wanted,
		       const char *why_not, struct rp_error *err)
{
	const char *name = gemm_operands[slot].name;
	const struct rp_operand *op = rp_compute_operand(c, slot);

	if (wanted && !op) {
		return rp_error_invalid_operand(err, name, "no %s was given, but %s", name, why_wanted);
	}
	if (!wanted && op) {
		return rp_error_invalid_operand(err, name, "%s was given, but %s", name, why_not);
	}
	if (op && op->shape[0] != 1) {
		return rp_error_invalid_operand(err, name,
						"%s is %s but must be [1]: one f32 for the whole tensor (per-tensor "
						"scaling)",
						name, rp_operand_shape_text(op).s);
	}
	return 0;
}

/* FP8 inputs: their pairing, layout, scales, output and epilogue. */
static int check_fp8(const struct rp_compute *c, struct rp_error *err)
{
	const struct rp_gemm *g = &c->gemm;
	const enum rp_dtype da = c->operands[RP_GEMM_A].dtype, db = c->operands[RP_GEMM_B].dtype;
	const enum rp_dtype dd = c->operands[RP_GEMM_D].dtype;
	const bool fp8_d = rp_dtype_is_fp8(dd);
	int r;

	if (rp_dtype_is_fp8(da) != rp_dtype_is_fp8(db)) {
		const char *q = rp_dtype_is_fp8(da) ? "b" : "a";

		return rp_error_invalid_operand(err, q,
						"a is %s but b is %s: an FP8 GEMM takes both inputs in FP8; quantize %s "
						"first (io.regen.Compute.Quantize)",
						rp_dtype_name(da), rp_dtype_name(db), q);
	}
	if (da == RP_DTYPE_E5M2 && db == RP_DTYPE_E5M2) {
		return rp_error_invalid_operand(err, "b",
						"a and b are both e5m2, which cuBLASLt does not multiply; take one in e4m3 "
						"(Transformer Engine's HYBRID: e4m3 weights and activations, e5m2 "
						"gradients)");
	}
	/* cuBLASLt's FP8 table: an e5m2 D only from an e5m2 input. */
	if (dd == RP_DTYPE_E5M2 && da == RP_DTYPE_E4M3 && db == RP_DTYPE_E4M3) {
		return rp_error_invalid_operand(err, "d",
						"a and b are e4m3 and d is e5m2, which cuBLASLt does not write from two "
						"e4m3 inputs; write d in e4m3, bf16, f16 or f32, or take one input in "
						"e5m2");
	}
	if (g->trans_a || !g->trans_b) {
		const char *q = g->trans_a ? "a" : "b";

		return rp_error_invalid_operand(err, q,
						"trans_a is %s and trans_b %s, but an FP8 GEMM takes A [M, K] and B [N, K], "
						"both K-contiguous (trans_a false, trans_b true: the one FP8 layout "
						"cuBLASLt has on Hopper); give %s in the other layout "
						"(io.regen.Compute.TransposeQuantize writes both)",
						g->trans_a ? "true" : "false", g->trans_b ? "true" : "false", q);
	}
	if ((r = check_scale(c, RP_GEMM_A_SCALE, true, "a is FP8: pass its scale, an f32 [1] that turns its stored "
				     "values into real ones (1 / the scale it was quantized with)", NULL, err)) < 0 ||
	    (r = check_scale(c, RP_GEMM_B_SCALE, true, "b is FP8: pass its scale, an f32 [1] that turns its stored "
				     "values into real ones (1 / the scale it was quantized with)", NULL, err)) < 0 ||
	    (r = check_scale(c, RP_GEMM_D_SCALE, fp8_d, "d is FP8: pass the f32 [1] that scales the result into "
				     "d's range", "d is not FP8; d_scale is for an FP8 d", err)) < 0 ||
	    (r = check_scale(c, RP_GEMM_AMAX_D, c->present[RP_GEMM_AMAX_D] && fp8_d, NULL,
			     "d is not FP8; amax_d is written for an FP8 d, whose next scale it decides", err)) < 0) {
		return r;
	}
	if (g->epilogue != RP_EPILOGUE_NONE && g->epilogue != RP_EPILOGUE_BIAS && g->epilogue != RP_EPILOGUE_GELU &&
	    g->epilogue != RP_EPILOGUE_GELU_BIAS) {
		return rp_error_invalid_operand(err, "a",
						"a is %s and epilogue is %s; an FP8 GEMM takes epilogue none, bias, gelu "
						"or gelu_bias",
						rp_dtype_name(da), epilogue_names[g->epilogue]);
	}
	if (fp8_d && c->present[RP_GEMM_C]) {
		return rp_error_invalid_operand(err, "c",
						"d is %s and a c was given; an FP8 GEMM adds no c into an FP8 d: write "
						"d in bf16, f16 or f32 to accumulate",
						rp_dtype_name(dd));
	}
	if (c->present[RP_GEMM_BIAS] && (fp8_d || dd == RP_DTYPE_F32)) {
		return rp_error_invalid_operand(err, "bias",
						"d is %s and a bias was given; an FP8 GEMM adds a bias only into a bf16 or "
						"f16 d (of d's dtype)",
						rp_dtype_name(dd));
	}
	return 0;
}

/* Inputs share a dtype, and so do D and what is laid out as D (C, bias,
 * aux, aux_out); with FP8 inputs check_fp8 says the rest. */
static int check_dtypes(const struct rp_compute *c, struct rp_error *err)
{
	const bool fp8_in = is_fp8_at(c, RP_GEMM_A) || is_fp8_at(c, RP_GEMM_B);
	int r;

	if (fp8_in) {
		if ((r = check_fp8(c, err)) < 0) {
			return r;
		}
	} else {
		if ((r = same_dtype(c, RP_GEMM_B, RP_GEMM_A, err)) < 0) {
			return r;
		}
		if (is_fp8_at(c, RP_GEMM_D)) {
			return rp_error_invalid_operand(err, "d",
							"d is %s but a and b are %s: an FP8 d needs FP8 inputs (quantize "
							"them, io.regen.Compute.Quantize)",
							rp_dtype_name(c->operands[RP_GEMM_D].dtype),
							rp_dtype_name(c->operands[RP_GEMM_A].dtype));
		}
		for (int s = RP_GEMM_A_SCALE; s <= RP_GEMM_AMAX_D; s++) {
			if (c->present[s]) {
				return rp_error_invalid_operand(err, gemm_operands[s].name,
								"%s was given but a and b are %s; scales and amax are "
								"for FP8 inputs",
								gemm_operands[s].name,
								rp_dtype_name(c->operands[RP_GEMM_A].dtype));
			}
		}
	}
	if ((r = same_dtype(c, RP_GEMM_C, RP_GEMM_D, err)) < 0 || (r = same_dtype(c, RP_GEMM_BIAS, RP_GEMM_D, err)) < 0 ||
	    (r = same_dtype(c, RP_GEMM_AUX, RP_GEMM_D, err)) < 0 ||
	    (r = same_dtype(c, RP_GEMM_AUX_OUT, RP_GEMM_D, err)) < 0) {
		return r;
	}
	return 0;
}

static int gemm_check(struct rp_compute *c, struct rp_error *err)
{
	int r;

	if ((r = check_scalars(&c->gemm, err)) < 0 || (r = check_dtypes(c, err)) < 0 ||
	    (r = check_shapes(c, err)) < 0) {
		return r;
	}
	return check_options(c, err);
}

static void gemm_encode(const struct rp_compute *c, cJSON *params)
{
	const struct rp_gemm *g = &c->gemm;

	if (g->trans_a) {
		cJSON_AddTrueToObject(params, "trans_a");
	}
	if (g->trans_b) {
		cJSON_AddTrueToObject(params, "trans_b");
	}
	if (g->alpha != 1.0) {
		cJSON_AddNumberToObject(params, "alpha", g->alpha);
	}
	if (g->beta != 0.0) {
		cJSON_AddNumberToObject(params, "beta", g->beta);
	}
	if (g->epilogue != RP_EPILOGUE_NONE) {
		cJSON_AddStringToObject(params, "epilogue", epilogue_names[g->epilogue]);
	}
	if (g->compute != RP_COMPUTE_F32) {
		cJSON_AddStringToObject(params, "compute", compute_names[g->compute]);
	}
}

#define AT(field) offsetof(struct rp_compute, gemm.field)
static const struct rp_op_ring_scalar gemm_ring_scalars[] = {
	{ "trans_a", RP_RING_FIELD_FLAG, RP_RING_TRANS_A, AT(trans_a), NULL },
	{ "trans_b", RP_RING_FIELD_FLAG, RP_RING_TRANS_B, AT(trans_b), NULL },
	/* No defaults: a record always carries them (1 and 0 written). */
	{ "alpha", RP_RING_FIELD_ALPHA, 0, AT(alpha), NULL },
	{ "beta", RP_RING_FIELD_BETA, 0, AT(beta), NULL },
	{ "epilogue", RP_RING_FIELD_EPILOGUE, 0, AT(epilogue), epilogue_names },
	{ "compute", RP_RING_FIELD_COMPUTE, 0, AT(compute), compute_names },
	{ NULL },
};
#undef AT

const struct rp_op_spec rp_op_gemm = {
	.id = RP_OP_GEMM,
	.method = "io.regen.Compute.Gemm",
	.name = "gemm",
	.noperands = RP_GEMM_OPERANDS,
	.operands = gemm_operands,
	.scalars = gemm_scalars,
	.read_scalars = gemm_read_scalars,
	.check = gemm_check,
	.encode = gemm_encode,
	.ring_scalars = gemm_ring_scalars,
};
