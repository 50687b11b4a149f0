/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute parameter validation: any JSON as the parameters of
 * Gemm (FUZZ_GEMM), Attention (FUZZ_ATTENTION), AttentionBackward
 * (FUZZ_ATTENTION_BACKWARD), LayerNorm (FUZZ_LAYER_NORM) or
 * LayerNormBackward (FUZZ_LAYER_NORM_BACKWARD), as the worker gets them
 * before it resolves a buffer. A refusal must be a named error that names an operand or a
 * parameter; an accepted call must satisfy the rules compute.h states, so
 * that the worker and the backends can trust the descriptor: consistent
 * shapes, last strides 1, extents that do not overflow, outputs that share
 * no byte with another operand of their buffer, a finite positive scale
 * or eps. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "proto/compute.h"

static void check_named(int r, struct rp_error *err, const char *where)
{
	const cJSON *named;

	fz_check_error(r, err, where);
	if (strcmp(err->name, RP_ERR_INVALID_OPERAND) == 0) {
		named = cJSON_GetObjectItemCaseSensitive(err->params, "operand");
		FZ_CHECK(cJSON_IsString(named) && named->valuestring[0], "InvalidOperand names no operand");
		FZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err->params, "reason")), "InvalidOperand without reason");
	} else {
		FZ_CHECK(strcmp(err->name, RP_ERR_INVALID_PARAMETER) == 0, "unexpected error %s", err->name);
		named = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");
		FZ_CHECK(cJSON_IsString(named), "InvalidParameter names no parameter");
	}
}

/* An extent may overflow 64 bits in an accepted call (the worker's bounds
 * check against the buffer refuses it); only where the parser compared two
 * operands' bytes must it have been computable. */
static void extent_of(const struct rp_operand *op, const char *name, uint64_t *b, uint64_t *e, bool must)
{
	int r = rp_operand_extent(op, b, e);

	FZ_CHECK(r == 0 || (!must && r == -EOVERFLOW), "accepted operand %s has no extent (%d)", name, r);
	FZ_CHECK(op->strides[op->rank - 1] == 1, "accepted operand %s with last stride %lld", name,
		 (long long)op->strides[op->rank - 1]);
}

static bool same_buffer(const struct rp_operand *x, const struct rp_operand *y)
{
	return x->buffer.device == y->buffer.device && x->buffer.generation == y->buffer.generation &&
	       x->buffer.serial == y->buffer.serial;
}

/* Byte offsets of op's elements (at most LIST_MAX of them), sorted;
 * how many, or 0 when there are more. */
enum { LIST_MAX = 1 << 14 };

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static size_t element_offsets(const struct rp_operand *op, uint64_t *out)
{
	uint64_t numel = 1, elem = rp_dtype_size(op->dtype);
	int64_t idx[RP_RANK_MAX] = { 0 };

	for (int i = 0; i < op->rank; i++) {
		if (op->shape[i] < 0 || (op->shape[i] > 0 && numel > LIST_MAX / (uint64_t)op->shape[i]))
			return 0;
		numel *= (uint64_t)op->shape[i];
	}
	for (uint64_t n = 0; n < numel; n++) {
		uint64_t at = op->offset;

		for (int i = 0; i < op->rank; i++)
			at += (uint64_t)idx[i] * (uint64_t)op->strides[i] * elem;
		out[n] = at;
		for (int i = op->rank - 1; i >= 0 && ++idx[i] == op->shape[i]; i--)
			idx[i] = 0;
	}
	qsort(out, numel, sizeof(*out), cmp_u64);
	return numel;
}

/* An accepted output shares no byte with another operand of its buffer:
 * their extents apart, or (interleaved ones, which the parser may accept
 * when their elements are apart) no element of one inside one of the
 * other's, counted one by one where both are small enough to list. */
static void no_overlap(const struct rp_operand *out, const char *on, const struct rp_operand *in, const char *in_name)
{
	static uint64_t a[LIST_MAX], b[LIST_MAX];
	uint64_t b0, e0, b1, e1;
	size_t na, nb, j = 0;

	bool same = same_buffer(out, in);

	extent_of(out, on, &b0, &e0, same);
	extent_of(in, in_name, &b1, &e1, same);
	if (!same || !(b0 < e1 && b1 < e0))
		return;
	na = element_offsets(out, a);
	nb = element_offsets(in, b);
	if (na == 0 || nb == 0)
		return;   /* too many to list: the parser's exact check stands alone */
	uint64_t ea = rp_dtype_size(out->dtype), eb = rp_dtype_size(in->dtype);

	for (size_t i = 0; i < na; i++) {
		while (j < nb && b[j] + eb <= a[i])
			j++;
		FZ_CHECK(j == nb || b[j] >= a[i] + ea, "output %s shares bytes with %s (at %llu)", on, in_name,
			 (unsigned long long)a[i]);
	}
}

static bool shape_is(const struct rp_operand *op, int rank, const int64_t *dims)
{
	if (op->rank != rank)
		return false;
	for (int i = 0; i < rank; i++)
		if (op->shape[i] != dims[i])
			return false;
	return true;
}

/* A call the parser accepted is encoded again as a client would send it,
 * and must parse to the same descriptor: the table drives both ways. */
static void check_round_trip(const struct rp_compute *c)
{
	struct rp_error err = { 0 };
	struct rp_compute again;
	cJSON *params = rp_compute_to_json(c);

	FZ_CHECK(params != NULL, "rp_compute_to_json failed");
	FZ_CHECK(rp_compute_parse(c->spec, params, &again, &err) == 0, "re-encoded call refused: %s",
		 err.name ? err.name : "?");
	FZ_CHECK(memcmp(again.operands, c->operands, sizeof(c->operands)) == 0 &&
		 memcmp(again.present, c->present, sizeof(c->present)) == 0, "operands differ after a round trip");
	cJSON_Delete(params);
}

static bool parse_or_named_error(const struct rp_op_spec *spec, const cJSON *params, struct rp_compute *c)
{
	struct rp_error err = { 0 };
	int r = rp_compute_parse(spec, params, c, &err);

	if (r < 0) {
		check_named(r, &err, spec->method);
		rp_error_clear(&err);
		return false;
	}
	check_round_trip(c);
	return true;
}

#define OP(slot) (&c.operands[slot])

#if defined(FUZZ_ATTENTION) || defined(FUZZ_ATTENTION_BACKWARD)
/* Sequence lengths: both or neither, i32 [B], and no output over them. */
static void check_lengths(const struct rp_compute *c, int slot_q, int slot_kv, int out)
{
	const bool q = c->present[slot_q], kv = c->present[slot_kv];
	const int64_t b[1] = { c->attention.batch };

	FZ_CHECK(q == kv && c->attention.padded == q, "lengths given apart (q %d, kv %d, padded %d)", q, kv,
		 c->attention.padded);
	if (!q)
		return;
	for (int i = 0; i < 2; i++) {
		const struct rp_operand *l = &c->operands[i ? slot_kv : slot_q];
		FZ_CHECK(shape_is(l, 1, b) && l->dtype == RP_DTYPE_I32 && l->strides[0] == 1, "lengths not i32 [B]");
		no_overlap(&c->operands[out], c->spec->operands[out].name, l, c->spec->operands[i ? slot_kv : slot_q].name);
	}
}
#endif

#if defined(FUZZ_GEMM)
static void run(const cJSON *params)
{
	struct rp_compute c;

	if (!parse_or_named_error(&rp_op_gemm, params, &c))
		return;
	const struct rp_gemm g = c.gemm;
	const bool has_c = c.present[RP_GEMM_C], has_bias = c.present[RP_GEMM_BIAS], has_aux = c.present[RP_GEMM_AUX];
	const bool has_aux_out = c.present[RP_GEMM_AUX_OUT];
	FZ_CHECK(g.m >= 1 && g.n >= 1 && g.k >= 1, "m n k %lld %lld %lld", (long long)g.m, (long long)g.n, (long long)g.k);
	int64_t a_dims[2] = { g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k };
	int64_t b_dims[2] = { g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n };
	int64_t d_dims[2] = { g.m, g.n };
	FZ_CHECK(shape_is(OP(RP_GEMM_A), 2, a_dims) && shape_is(OP(RP_GEMM_B), 2, b_dims) &&
		 shape_is(OP(RP_GEMM_D), 2, d_dims), "shapes disagree");
	FZ_CHECK(!has_c || shape_is(OP(RP_GEMM_C), 2, d_dims), "c's shape disagrees");
	FZ_CHECK(!has_bias || shape_is(OP(RP_GEMM_BIAS), 1, &g.n), "bias's shape disagrees");
	FZ_CHECK(!has_aux || shape_is(OP(RP_GEMM_AUX), 2, d_dims), "aux's shape disagrees");
	FZ_CHECK(!has_aux_out || shape_is(OP(RP_GEMM_AUX_OUT), 2, d_dims), "aux_out's shape disagrees");
	/* FP8 inputs may mix e4m3 and e5m2 (not two e5m2); others match. */
	const enum rp_dtype da = OP(RP_GEMM_A)->dtype, db = OP(RP_GEMM_B)->dtype;
	const bool fp8_in = rp_dtype_is_fp8(da);
	FZ_CHECK(fp8_in == rp_dtype_is_fp8(db), "one FP8 input");
	FZ_CHECK(fp8_in ? !(da == RP_DTYPE_E5M2 && db == RP_DTYPE_E5M2) : da == db, "input dtypes disagree");
	FZ_CHECK(c.present[RP_GEMM_A_SCALE] == fp8_in && c.present[RP_GEMM_B_SCALE] == fp8_in,
		 "scales without FP8 inputs, or FP8 inputs without scales");
	FZ_CHECK(c.present[RP_GEMM_D_SCALE] == rp_dtype_is_fp8(OP(RP_GEMM_D)->dtype), "d_scale and d's dtype disagree");
	FZ_CHECK(!fp8_in || (!g.trans_a && g.trans_b), "FP8 inputs in other than the TN layout");
	FZ_CHECK(g.compute != RP_COMPUTE_FP8_FAST_ACCUM || fp8_in, "fp8_fast_accum with non-FP8 inputs");
	FZ_CHECK((!has_c || OP(RP_GEMM_C)->dtype == OP(RP_GEMM_D)->dtype) &&
		 (!has_bias || OP(RP_GEMM_BIAS)->dtype == OP(RP_GEMM_D)->dtype) &&
		 (!has_aux || OP(RP_GEMM_AUX)->dtype == OP(RP_GEMM_D)->dtype) &&
		 (!has_aux_out || OP(RP_GEMM_AUX_OUT)->dtype == OP(RP_GEMM_D)->dtype), "dtypes disagree");
	FZ_CHECK(g.compute != RP_COMPUTE_TF32 || OP(RP_GEMM_A)->dtype == RP_DTYPE_F32, "tf32 with non-f32 inputs");
	FZ_CHECK(isfinite(g.alpha) && isfinite(g.beta), "non-finite alpha or beta");
	FZ_CHECK(g.beta == 0 || has_c, "beta without c");
	FZ_CHECK((g.epilogue == RP_EPILOGUE_BIAS || g.epilogue == RP_EPILOGUE_GELU_BIAS ||
		  g.epilogue == RP_EPILOGUE_GELU_AUX_BIAS) == has_bias,
		 "bias and epilogue disagree");
	FZ_CHECK((g.epilogue == RP_EPILOGUE_DGELU) == has_aux, "aux and epilogue disagree");
	FZ_CHECK((g.epilogue == RP_EPILOGUE_GELU_AUX || g.epilogue == RP_EPILOGUE_GELU_AUX_BIAS) == has_aux_out,
		 "aux_out and epilogue disagree");
	no_overlap(OP(RP_GEMM_D), "d", OP(RP_GEMM_A), "a");
	no_overlap(OP(RP_GEMM_D), "d", OP(RP_GEMM_B), "b");
	if (has_bias)
		no_overlap(OP(RP_GEMM_D), "d", OP(RP_GEMM_BIAS), "bias");
	if (has_aux)
		no_overlap(OP(RP_GEMM_D), "d", OP(RP_GEMM_AUX), "aux");
	if (has_aux_out) {
		/* An output: it shares no byte with any other operand. */
		no_overlap(OP(RP_GEMM_AUX_OUT), "aux_out", OP(RP_GEMM_D), "d");
		no_overlap(OP(RP_GEMM_AUX_OUT), "aux_out", OP(RP_GEMM_A), "a");
		no_overlap(OP(RP_GEMM_AUX_OUT), "aux_out", OP(RP_GEMM_B), "b");
		if (has_c)
			no_overlap(OP(RP_GEMM_AUX_OUT), "aux_out", OP(RP_GEMM_C), "c");
		if (has_bias)
			no_overlap(OP(RP_GEMM_AUX_OUT), "aux_out", OP(RP_GEMM_BIAS), "bias");
	}
	if (has_c) {
		uint64_t b, e;
		extent_of(OP(RP_GEMM_C), "c", &b, &e, same_buffer(OP(RP_GEMM_C), OP(RP_GEMM_D)));
	}
	for (int i = 0; i < 4; i++) {
		const struct rp_operand *x = i == 0 ? OP(RP_GEMM_A) : i == 1 ? OP(RP_GEMM_B) : i == 2 ? OP(RP_GEMM_AUX)
												   : OP(RP_GEMM_AUX_OUT);
		if (i < 2 || (i == 2 && has_aux) || (i == 3 && has_aux_out))
			FZ_CHECK(x->strides[0] >= x->shape[1], "row stride below the row length");
	}
	FZ_CHECK(!c.wait_event.present || c.wait_event.id.kind == RP_ID_EVENT, "wait_event not an event id");
	FZ_CHECK(!c.signal_event.present || c.signal_event.id.kind == RP_ID_EVENT, "signal_event not an event id");
}
#elif defined(FUZZ_ATTENTION)
static void run(const cJSON *params)
{
	struct rp_compute c;

	if (!parse_or_named_error(&rp_op_attention, params, &c))
		return;
	const struct rp_attention a = c.attention;
	int64_t q[4] = { a.batch, a.heads, a.seq_q, a.head_dim };
	int64_t k[4] = { a.batch, a.heads_kv, a.seq_kv, a.head_dim };
	int64_t v[4] = { a.batch, a.heads_kv, a.seq_kv, a.head_dim_v };
	int64_t o[4] = { a.batch, a.heads, a.seq_q, a.head_dim_v };
	FZ_CHECK(shape_is(OP(RP_ATT_Q), 4, q) && shape_is(OP(RP_ATT_K), 4, k) && shape_is(OP(RP_ATT_V), 4, v) &&
		 shape_is(OP(RP_ATT_O), 4, o), "shapes disagree");
	FZ_CHECK(a.heads_kv >= 1 && a.heads % a.heads_kv == 0, "Hkv %lld does not divide H %lld", (long long)a.heads_kv,
		 (long long)a.heads);
	/* With lengths the diagonal is each entry's: Sq > Skv is then the
	 * backends' to judge (by the lengths' values). */
	FZ_CHECK(!a.causal || a.alignment == RP_CAUSAL_TOP_LEFT || a.seq_q <= a.seq_kv || a.padded,
		 "bottom-right rows without keys");
	check_lengths(&c, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV, RP_ATT_O);
	FZ_CHECK(OP(RP_ATT_Q)->dtype == OP(RP_ATT_K)->dtype && OP(RP_ATT_K)->dtype == OP(RP_ATT_V)->dtype &&
		 OP(RP_ATT_V)->dtype == OP(RP_ATT_O)->dtype, "dtypes disagree");
	FZ_CHECK(isfinite(a.scale) && a.scale > 0, "scale %g", a.scale);
	if (c.present[RP_ATT_STATS]) {
		FZ_CHECK(shape_is(OP(RP_ATT_STATS), 3, q) && OP(RP_ATT_STATS)->dtype == RP_DTYPE_F32, "stats disagree");
		no_overlap(OP(RP_ATT_STATS), "stats", OP(RP_ATT_Q), "q");
		no_overlap(OP(RP_ATT_STATS), "stats", OP(RP_ATT_K), "k");
		no_overlap(OP(RP_ATT_STATS), "stats", OP(RP_ATT_V), "v");
		no_overlap(OP(RP_ATT_STATS), "stats", OP(RP_ATT_O), "o");
	}
	no_overlap(OP(RP_ATT_O), "o", OP(RP_ATT_Q), "q");
	no_overlap(OP(RP_ATT_O), "o", OP(RP_ATT_K), "k");
	no_overlap(OP(RP_ATT_O), "o", OP(RP_ATT_V), "v");
}
#elif defined(FUZZ_ATTENTION_BACKWARD)
static void run(const cJSON *params)
{
	struct rp_compute c;

	if (!parse_or_named_error(&rp_op_attention_backward, params, &c))
		return;
	const struct rp_attention a = c.attention;
	int64_t q[4] = { a.batch, a.heads, a.seq_q, a.head_dim };
	int64_t k[4] = { a.batch, a.heads_kv, a.seq_kv, a.head_dim };
	int64_t v[4] = { a.batch, a.heads_kv, a.seq_kv, a.head_dim_v };
	int64_t o[4] = { a.batch, a.heads, a.seq_q, a.head_dim_v };
	FZ_CHECK(shape_is(OP(RP_ATB_Q), 4, q) && shape_is(OP(RP_ATB_K), 4, k) && shape_is(OP(RP_ATB_V), 4, v) &&
		 shape_is(OP(RP_ATB_O), 4, o) && shape_is(OP(RP_ATB_DO), 4, o) && shape_is(OP(RP_ATB_DQ), 4, q) &&
		 shape_is(OP(RP_ATB_DK), 4, k) && shape_is(OP(RP_ATB_DV), 4, v) && shape_is(OP(RP_ATB_STATS), 3, q),
		 "shapes disagree");
	FZ_CHECK(a.heads_kv >= 1 && a.heads % a.heads_kv == 0, "Hkv does not divide H");
	FZ_CHECK(OP(RP_ATB_STATS)->dtype == RP_DTYPE_F32, "stats not f32");
	FZ_CHECK(isfinite(a.scale) && a.scale > 0, "scale %g", a.scale);
	check_lengths(&c, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV, RP_ATB_DQ);
	check_lengths(&c, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV, RP_ATB_DK);
	check_lengths(&c, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV, RP_ATB_DV);
	static const int ins[] = { RP_ATB_Q, RP_ATB_K, RP_ATB_V, RP_ATB_O, RP_ATB_DO, RP_ATB_STATS };
	static const int outs[] = { RP_ATB_DQ, RP_ATB_DK, RP_ATB_DV };
	for (int i = 0; i < 3; i++) {
		const char *on = rp_op_attention_backward.operands[outs[i]].name;
		for (int j = 0; j < 6; j++)
			no_overlap(OP(outs[i]), on, OP(ins[j]), rp_op_attention_backward.operands[ins[j]].name);
		for (int j = 0; j < i; j++)
			no_overlap(OP(outs[i]), on, OP(outs[j]), rp_op_attention_backward.operands[outs[j]].name);
	}
}
#elif defined(FUZZ_LAYER_NORM)
static void run(const cJSON *params)
{
	struct rp_compute c;

	if (!parse_or_named_error(&rp_op_layer_norm, params, &c))
		return;
	const struct rp_layer_norm ln = c.layer_norm;
	const int64_t mat[2] = { ln.rows, ln.n };
	FZ_CHECK(ln.rows >= 1 && ln.n >= 1 && ln.n <= RP_LAYER_NORM_N_MAX, "rows %lld n %lld", (long long)ln.rows,
		 (long long)ln.n);
	FZ_CHECK(shape_is(OP(RP_LN_X), 2, mat) && shape_is(OP(RP_LN_Y), 2, mat) && shape_is(OP(RP_LN_WEIGHT), 1, &ln.n),
		 "shapes disagree");
	FZ_CHECK(!c.present[RP_LN_BIAS] || shape_is(OP(RP_LN_BIAS), 1, &ln.n), "bias's shape disagrees");
	FZ_CHECK(OP(RP_LN_WEIGHT)->dtype == OP(RP_LN_X)->dtype && OP(RP_LN_Y)->dtype == OP(RP_LN_X)->dtype &&
		 (!c.present[RP_LN_BIAS] || OP(RP_LN_BIAS)->dtype == OP(RP_LN_X)->dtype), "dtypes disagree");
	FZ_CHECK(isfinite(ln.eps) && ln.eps > 0, "eps %g", ln.eps);
	FZ_CHECK(OP(RP_LN_X)->strides[0] >= ln.n && OP(RP_LN_Y)->strides[0] >= ln.n, "row stride below the row length");
	FZ_CHECK(OP(RP_LN_WEIGHT)->strides[0] == 1, "weight not contiguous");
	static const int ins[] = { RP_LN_X, RP_LN_WEIGHT, RP_LN_BIAS };
	static const int outs[] = { RP_LN_Y, RP_LN_MEAN, RP_LN_RSTD };
	for (int i = 0; i < 3; i++) {
		if (!c.present[outs[i]])
			continue;
		const char *on = rp_op_layer_norm.operands[outs[i]].name;
		if (outs[i] != RP_LN_Y)
			FZ_CHECK(shape_is(OP(outs[i]), 1, &ln.rows) && OP(outs[i])->dtype == RP_DTYPE_F32,
				 "%s not f32 [rows]", on);
		for (int j = 0; j < 3; j++)
			if (c.present[ins[j]])
				no_overlap(OP(outs[i]), on, OP(ins[j]), rp_op_layer_norm.operands[ins[j]].name);
		for (int j = 0; j < i; j++)
			if (c.present[outs[j]])
				no_overlap(OP(outs[i]), on, OP(outs[j]), rp_op_layer_norm.operands[outs[j]].name);
	}
}
#elif defined(FUZZ_LAYER_NORM_BACKWARD)
static bool same_tensor(const struct rp_operand *x, const struct rp_operand *y)
{
	return same_buffer(x, y) && x->offset == y->offset && x->dtype == y->dtype && shape_is(x, y->rank, y->shape) &&
	       memcmp(x->strides, y->strides, sizeof(x->strides[0]) * (size_t)x->rank) == 0;
}

static void run(const cJSON *params)
{
	struct rp_compute c;

	if (!parse_or_named_error(&rp_op_layer_norm_backward, params, &c))
		return;
	const struct rp_layer_norm ln = c.layer_norm;
	const int64_t mat[2] = { ln.rows, ln.n };
	FZ_CHECK(ln.rows >= 1 && ln.n >= 1 && ln.n <= RP_LAYER_NORM_N_MAX && ln.eps == 0, "rows %lld n %lld eps %g",
		 (long long)ln.rows, (long long)ln.n, ln.eps);
	FZ_CHECK(shape_is(OP(RP_LNB_DY), 2, mat) && shape_is(OP(RP_LNB_X), 2, mat) && shape_is(OP(RP_LNB_DX), 2, mat) &&
		 shape_is(OP(RP_LNB_WEIGHT), 1, &ln.n) && shape_is(OP(RP_LNB_MEAN), 1, &ln.rows) &&
		 shape_is(OP(RP_LNB_RSTD), 1, &ln.rows), "shapes disagree");
	FZ_CHECK(OP(RP_LNB_MEAN)->dtype == RP_DTYPE_F32 && OP(RP_LNB_RSTD)->dtype == RP_DTYPE_F32, "stats not f32");
	for (int s = 0; s < RP_LNB_OPERANDS; s++) {
		if (!c.present[s] || s == RP_LNB_MEAN || s == RP_LNB_RSTD)
			continue;
		FZ_CHECK(OP(s)->dtype == OP(RP_LNB_X)->dtype, "%s's dtype disagrees", rp_op_layer_norm_backward.operands[s].name);
		if (OP(s)->rank == 2)
			FZ_CHECK(shape_is(OP(s), 2, mat) && OP(s)->strides[0] >= ln.n, "%s's rows disagree",
				 rp_op_layer_norm_backward.operands[s].name);
		else
			FZ_CHECK(shape_is(OP(s), 1, &ln.n), "%s's length disagrees", rp_op_layer_norm_backward.operands[s].name);
	}
	static const int ins[] = { RP_LNB_DY, RP_LNB_X, RP_LNB_WEIGHT, RP_LNB_MEAN, RP_LNB_RSTD, RP_LNB_DRESIDUAL };
	static const int outs[] = { RP_LNB_DX, RP_LNB_DWEIGHT, RP_LNB_DBIAS };
	for (int i = 0; i < 3; i++) {
		if (!c.present[outs[i]])
			continue;
		const char *on = rp_op_layer_norm_backward.operands[outs[i]].name;
		for (int j = 0; j < 6; j++) {
			if (!c.present[ins[j]])
				continue;
			/* d_x may be d_residual, exactly. */
			if (outs[i] == RP_LNB_DX && ins[j] == RP_LNB_DRESIDUAL && same_tensor(OP(RP_LNB_DX), OP(RP_LNB_DRESIDUAL)))
				continue;
			no_overlap(OP(outs[i]), on, OP(ins[j]), rp_op_layer_norm_backward.operands[ins[j]].name);
		}
		for (int j = 0; j < i; j++)
			if (c.present[outs[j]])
				no_overlap(OP(outs[i]), on, OP(outs[j]), rp_op_layer_norm_backward.operands[outs[j]].name);
	}
}
#else
#error "define FUZZ_GEMM, FUZZ_ATTENTION, FUZZ_ATTENTION_BACKWARD, FUZZ_LAYER_NORM or FUZZ_LAYER_NORM_BACKWARD"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *params = fz_json(data, size);

	if (params == NULL)
		return 0;
	run(params);
	cJSON_Delete(params);
	return 0;
}
