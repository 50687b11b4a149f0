/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute.Attention and AttentionBackward: scaled dot-product
 * attention and its gradients.
 *
 * q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], o [B, H, Sq, Dv],
 * stats f32 [B, H, Sq]; H a multiple of Hkv (grouped-query attention: query
 * head h reads key/value head h / (H / Hkv); Hkv = 1 is multi-query). The
 * table says what each operand is on its own and that gradients have their
 * primal's shape; attention_check derives B, H, Hkv, Sq, Skv, D, Dv from q,
 * k and v and checks the others against them.
 *
 * seq_len_q and seq_len_kv, i32 [B], optional and only together: each batch
 * entry's sequences are the first seq_len_q[b] rows of q (o, d_o, d_q) and
 * seq_len_kv[b] rows of k and v (d_k, d_v), the rest padding. Their values
 * live in the client's memory, out of the parser's sight: the backends
 * check or bound them (the host backend refuses a length outside [0, S];
 * the CUDA backend clamps to it, daemon/backend/cuda/attention.c). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>

#include "compute.h"
#include "compute_check.h"
#include "errors.h"
#include "ring.h"

#define ATT_DTYPES RP_DTYPES_ANY
#define STATS_DTYPES RP_DTYPE_BIT(RP_DTYPE_F32)
#define LEN_DTYPES RP_DTYPE_BIT(RP_DTYPE_I32)
#define ROW "[batch, heads, sequence, head_dim]"
#define STATS_ROW "[batch, heads, seq_q] of f32 (log-sum-exp is kept in f32)"
#define LEN_ROW "[batch] of i32 (each batch entry's sequence length)"

static const struct rp_operand_spec attention_operands[RP_ATT_OPERANDS] = {
	[RP_ATT_Q] = { "q", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATT_K] = { "k", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_ATT_Q, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATT_V] = { "v", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_ATT_Q, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATT_O] = { "o", RP_ROLE_OUT, true, 4, ROW, ATT_DTYPES, RP_ATT_Q, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATT_STATS] = { "stats", RP_ROLE_OUT, false, 3, STATS_ROW, STATS_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false,
			   RP_NO_SLOT },
	[RP_ATT_SEQ_LEN_Q] = { "seq_len_q", RP_ROLE_IN, false, 1, LEN_ROW, LEN_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false,
			       RP_NO_SLOT },
	[RP_ATT_SEQ_LEN_KV] = { "seq_len_kv", RP_ROLE_IN, false, 1, LEN_ROW, LEN_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false,
				RP_NO_SLOT },
};

static const struct rp_operand_spec attention_backward_operands[RP_ATB_OPERANDS] = {
	[RP_ATB_Q] = { "q", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATB_K] = { "k", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATB_V] = { "v", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATB_O] = { "o", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_NO_SLOT, false, RP_NO_SLOT },
	[RP_ATB_DO] = { "d_o", RP_ROLE_IN, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_ATB_O, false, RP_NO_SLOT },
	[RP_ATB_STATS] = { "stats", RP_ROLE_IN, true, 3, STATS_ROW, STATS_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false,
			   RP_NO_SLOT },
	/* Each gradient is written while every input is still read (and dK,
	 * dV accumulate across query rows and, with grouped-query attention,
	 * across the query heads of a group). */
	[RP_ATB_DQ] = { "d_q", RP_ROLE_OUT, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_ATB_Q, false, RP_NO_SLOT },
	[RP_ATB_DK] = { "d_k", RP_ROLE_OUT, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_ATB_K, false, RP_NO_SLOT },
	[RP_ATB_DV] = { "d_v", RP_ROLE_OUT, true, 4, ROW, ATT_DTYPES, RP_ATB_Q, RP_ATB_V, false, RP_NO_SLOT },
	[RP_ATB_SEQ_LEN_Q] = { "seq_len_q", RP_ROLE_IN, false, 1, LEN_ROW, LEN_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false,
			       RP_NO_SLOT },
	[RP_ATB_SEQ_LEN_KV] = { "seq_len_kv", RP_ROLE_IN, false, 1, LEN_ROW, LEN_DTYPES, RP_NO_SLOT, RP_NO_SLOT, false,
				RP_NO_SLOT },
};

static const struct rp_field attention_scalars[] = {
	{ "scale", RP_T_FLOAT, false },
	{ "causal", RP_T_BOOL, false },
	{ "causal_alignment", RP_T_STRING, false },
	{ NULL, 0, false },
};

/* In enum rp_causal_alignment order. */
static const char *const alignment_names[] = { "top_left", "bottom_right", NULL };

/* The slots forward and backward share. */
struct att_slots {
	int q, k, v, o, stats, seq_len_q, seq_len_kv;
};

static const struct att_slots forward_slots = {
	RP_ATT_Q, RP_ATT_K, RP_ATT_V, RP_ATT_O, RP_ATT_STATS, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV,
};
static const struct att_slots backward_slots = {
	RP_ATB_Q, RP_ATB_K, RP_ATB_V, RP_ATB_O, RP_ATB_STATS, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV,
};

/* seq_len_q and seq_len_kv: both or neither (cuDNN's padding mask takes
 * both; a side whose sequences do not vary passes its full lengths), each
 * one length per batch entry. */
static int check_lengths(struct rp_compute *c, const struct att_slots *s, struct rp_error *err)
{
	struct rp_attention *a = &c->attention;
	const struct rp_operand *lq = rp_compute_operand(c, s->seq_len_q), *lkv = rp_compute_operand(c, s->seq_len_kv);
	const int64_t want[1] = { a->batch };

	a->padded = lq && lkv;
	if (!lq != !lkv) {
		const char *given = lq ? "seq_len_q" : "seq_len_kv", *missing = lq ? "seq_len_kv" : "seq_len_q";
		return rp_error_invalid_operand(err, missing,
						"%s is given without %s: sequence lengths come in pairs (pass the full "
						"length %" PRId64 " for every entry of the side that does not vary)",
						given, missing, lq ? a->seq_kv : a->seq_q);
	}
	if (lq && !rp_operand_shape_is(lq, 1, want)) {
		return rp_error_invalid_operand(err, "seq_len_q", "seq_len_q is %s but must be [B] = %s (B from q)",
						rp_operand_shape_text(lq).s, rp_shape_fmt(1, want).s);
	}
	if (lkv && !rp_operand_shape_is(lkv, 1, want)) {
		return rp_error_invalid_operand(err, "seq_len_kv", "seq_len_kv is %s but must be [B] = %s (B from q)",
						rp_operand_shape_text(lkv).s, rp_shape_fmt(1, want).s);
	}
	return 0;
}

static int check_shapes(struct rp_compute *c, const struct att_slots *s, struct rp_error *err)
{
	struct rp_attention *a = &c->attention;
	const struct rp_operand *q = &c->operands[s->q], *k = &c->operands[s->k], *v = &c->operands[s->v];
	const struct rp_operand *o = &c->operands[s->o], *stats = rp_compute_operand(c, s->stats);

	a->batch = q->shape[0];
	a->heads = q->shape[1];
	a->seq_q = q->shape[2];
	a->head_dim = q->shape[3];
	a->heads_kv = k->shape[1];
	a->seq_kv = k->shape[2];
	a->head_dim_v = v->shape[3];

	const int64_t kwant[4] = { a->batch, a->heads_kv, a->seq_kv, a->head_dim };
	const int64_t vwant[4] = { a->batch, a->heads_kv, a->seq_kv, a->head_dim_v };
	const int64_t owant[4] = { a->batch, a->heads, a->seq_q, a->head_dim_v };
	const int64_t statswant[3] = { a->batch, a->heads, a->seq_q };

	if (!rp_operand_shape_is(k, 4, kwant)) {
		return rp_error_invalid_operand(err, "k", "k is %s but q is %s: k must be [B, Hkv, Skv, D] = %s",
						rp_operand_shape_text(k).s, rp_operand_shape_text(q).s,
						rp_shape_fmt(4, kwant).s);
	}
	if (a->heads % a->heads_kv != 0) {
		return rp_error_invalid_operand(err, "k",
						"k has %" PRId64 " heads, which does not divide q's %" PRId64
						"; grouped-query attention needs H a multiple of Hkv",
						a->heads_kv, a->heads);
	}
	if (!rp_operand_shape_is(v, 4, vwant)) {
		return rp_error_invalid_operand(err, "v",
						"v is %s but must be [B, Hkv, Skv, Dv] = %s (B from q, Hkv and Skv from k)",
						rp_operand_shape_text(v).s, rp_shape_fmt(4, vwant).s);
	}
	if (!rp_operand_shape_is(o, 4, owant)) {
		return rp_error_invalid_operand(err, "o",
						"o is %s but must be [B, H, Sq, Dv] = %s (B, H, Sq from q, Dv from v)",
						rp_operand_shape_text(o).s, rp_shape_fmt(4, owant).s);
	}
	if (stats && !rp_operand_shape_is(stats, 3, statswant)) {
		return rp_error_invalid_operand(err, "stats", "stats is %s but must be [B, H, Sq] = %s",
						rp_operand_shape_text(stats).s, rp_shape_fmt(3, statswant).s);
	}
	return check_lengths(c, s, err);
}

/* scale: absent is 0 here, the default 1/sqrt(D), filled in once D is
 * known; given, it must be a positive finite number. */
static int attention_read_scalars(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	struct rp_attention *a = &c->attention;
	int r, alignment;

	if ((r = rp_params_bool(params, "causal", false, &a->causal, err)) < 0 ||
	    (r = rp_params_enum(params, "causal_alignment", alignment_names, RP_CAUSAL_TOP_LEFT, &alignment, err)) < 0 ||
	    (r = rp_params_double(params, "scale", 0.0, &a->scale, err)) < 0) {
		return r;
	}
	a->alignment = (enum rp_causal_alignment)alignment;
	const cJSON *given = cJSON_GetObjectItemCaseSensitive(params, "scale");
	if (given != NULL && !cJSON_IsNull(given) && !(a->scale > 0.0)) {
		return rp_error_invalid_parameter(err, "scale");
	}
	return 0;
}

static int check_scalars(struct rp_attention *a, struct rp_error *err)
{
	if ((unsigned)a->alignment > RP_CAUSAL_BOTTOM_RIGHT) {
		return rp_error_invalid_parameter(err, "causal_alignment");
	}
	if (a->scale == 0.0) {
		a->scale = 1.0 / sqrt((double)a->head_dim);
	}
	if (!isfinite(a->scale) || !(a->scale > 0.0)) {
		return rp_error_invalid_parameter(err, "scale");
	}
	/* Aligned to the bottom right, query i sees keys up to
	 * i + Skv - Sq: with more queries than keys, the first rows would see
	 * no key at all, and their softmax is undefined. With sequence
	 * lengths the diagonal is each entry's own (i + seq_len_kv[b] -
	 * seq_len_q[b]), and Sq, Skv are only the padded sizes: the lengths
	 * decide, where a backend can see them. */
	if (a->causal && a->alignment == RP_CAUSAL_BOTTOM_RIGHT && a->seq_q > a->seq_kv && !a->padded) {
		return rp_error_invalid_operand(err, "q",
						"causal attention aligned bottom_right with Sq %" PRId64 " > Skv %" PRId64
						" leaves the first %" PRId64 " query rows no key to attend to; use top_left or "
						"Sq <= Skv",
						a->seq_q, a->seq_kv, a->seq_q - a->seq_kv);
	}
	return 0;
}

static int attention_check(struct rp_compute *c, struct rp_error *err)
{
	int r = check_shapes(c, &forward_slots, err);

	return r < 0 ? r : check_scalars(&c->attention, err);
}

static int attention_backward_check(struct rp_compute *c, struct rp_error *err)
{
	int r = check_shapes(c, &backward_slots, err);

	return r < 0 ? r : check_scalars(&c->attention, err);
}

static void attention_encode(const struct rp_compute *c, cJSON *params)
{
	const struct rp_attention *a = &c->attention;

	/* 0 leaves the default, 1/sqrt(D), to the parser; any other value is
	 * sent, so that a negative one is refused there by name rather than
	 * dropped here for the default. */
	if (a->scale != 0.0) {
		cJSON_AddNumberToObject(params, "scale", a->scale);
	}
	if (a->causal) {
		cJSON_AddTrueToObject(params, "causal");
	}
	if (a->alignment != RP_CAUSAL_TOP_LEFT) {
		cJSON_AddStringToObject(params, "causal_alignment", alignment_names[a->alignment]);
	}
}

/* Both directions' records: scale 0 is the default (1/sqrt(D)). */
#define AT(field) offsetof(struct rp_compute, attention.field)
static const struct rp_op_ring_scalar attention_ring_scalars[] = {
	{ "causal", RP_RING_FIELD_FLAG, RP_RING_CAUSAL, AT(causal), NULL },
	{ "causal_alignment", RP_RING_FIELD_ALIGNMENT, 0, AT(alignment), alignment_names },
	{ "scale", RP_RING_FIELD_SCALE, 0, AT(scale), NULL },
	{ NULL },
};
#undef AT

const struct rp_op_spec rp_op_attention = {
	.id = RP_OP_ATTENTION,
	.method = "io.regen.Compute.Attention",
	.name = "attention",
	.noperands = RP_ATT_OPERANDS,
	.operands = attention_operands,
	.scalars = attention_scalars,
	.read_scalars = attention_read_scalars,
	.check = attention_check,
	.encode = attention_encode,
	.ring_scalars = attention_ring_scalars,
};

const struct rp_op_spec rp_op_attention_backward = {
	.id = RP_OP_ATTENTION_BACKWARD,
	.method = "io.regen.Compute.AttentionBackward",
	.name = "attention_backward",
	.noperands = RP_ATB_OPERANDS,
	.operands = attention_backward_operands,
	.scalars = attention_scalars,
	.read_scalars = attention_read_scalars,
	.check = attention_backward_check,
	.encode = attention_encode,
	.ring_scalars = attention_ring_scalars,
};
