/* io.regen.Compute calls: parameters into descriptors, and the consistency
 * of the operands among themselves.
 *
 * Everything a client can get wrong without looking at a buffer is caught
 * here, before a worker resolves ids or touches a device, and each mistake
 * is reported by name: InvalidParameter {parameter} for a field of the
 * wrong type or value, InvalidOperand {operand, reason} for a tensor whose
 * rank, dtype, shape, strides or placement disagrees with the others. The
 * reason is a sentence with the numbers in it, so a person can fix the call
 * without reading this file. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compute.h"
#include "errors.h"
#include "params.h"


/* "[64, 32]": shapes in reasons read like the client's own code. */
struct shape_text {
	char s[96];
};

static struct shape_text shape_fmt(int rank, const int64_t *dims)
{
	struct shape_text t;
	size_t n = 0;

	n += (size_t)snprintf(t.s + n, sizeof(t.s) - n, "[");
	for (int i = 0; i < rank && n < sizeof(t.s); i++) {
		n += (size_t)snprintf(t.s + n, sizeof(t.s) - n, "%s%" PRId64, i ? ", " : "", dims[i]);
	}
	if (n < sizeof(t.s)) {
		snprintf(t.s + n, sizeof(t.s) - n, "]");
	}
	return t;
}

static struct shape_text op_shape(const struct rp_operand *op)
{
	return shape_fmt(op->rank, op->shape);
}

static bool shape_eq(const struct rp_operand *op, int rank, const int64_t *dims)
{
	if (op->rank != rank) {
		return false;
	}
	for (int i = 0; i < rank; i++) {
		if (op->shape[i] != dims[i]) {
			return false;
		}
	}
	return true;
}

static bool same_buffer(const struct rp_operand *x, const struct rp_operand *y)
{
	return x->buffer.kind == y->buffer.kind && x->buffer.device == y->buffer.device &&
	       x->buffer.generation == y->buffer.generation && x->buffer.serial == y->buffer.serial;
}

/* The same tensor: same bytes, same element order. Only then may a GEMM
 * read C and write D in one place, element by element. */
static bool same_tensor(const struct rp_operand *x, const struct rp_operand *y)
{
	if (!same_buffer(x, y) || x->offset != y->offset || x->dtype != y->dtype || x->rank != y->rank) {
		return false;
	}
	for (int i = 0; i < x->rank; i++) {
		if (x->shape[i] != y->shape[i] || x->strides[i] != y->strides[i]) {
			return false;
		}
	}
	return true;
}

static int check_rank(const struct rp_operand *op, const char *name, int rank, const char *what, struct rp_error *err)
{
	if (op->rank != rank) {
		return rp_error_invalid_operand(err, name, "%s has rank %d (shape %s) but must be rank %d, %s", name, op->rank,
				       op_shape(op).s, rank, what);
	}
	return 0;
}

/* The libraries take row-major tensors with a leading dimension: elements
 * of a row adjacent, rows apart by at least a row. */
static int check_strides(const struct rp_operand *op, const char *name, bool leading_dim, struct rp_error *err)
{
	int last = op->rank - 1;

	if (op->strides[last] != 1) {
		return rp_error_invalid_operand(err, name, "%s's last stride is %" PRId64 " but must be 1 (elements of a row adjacent)",
				       name, op->strides[last]);
	}
	if (leading_dim && op->rank == 2 && op->strides[0] < op->shape[1]) {
		return rp_error_invalid_operand(err, name,
				       "%s's row stride is %" PRId64 " but must be at least its row length %" PRId64
				       " (rows may be padded, not overlap)",
				       name, op->strides[0], op->shape[1]);
	}
	return 0;
}

static int check_dtype(const struct rp_operand *op, const char *name, const struct rp_operand *ref,
		       const char *ref_name, struct rp_error *err)
{
	if (op->dtype != ref->dtype) {
		return rp_error_invalid_operand(err, name, "%s is %s but %s is %s: they must share a dtype", name,
				       rp_dtype_name(op->dtype), ref_name, rp_dtype_name(ref->dtype));
	}
	return 0;
}

static int extent(const struct rp_operand *op, const char *name, uint64_t *begin, uint64_t *end, struct rp_error *err)
{
	int r = rp_operand_extent(op, begin, end);

	if (r == -EOVERFLOW) {
		return rp_error_invalid_operand(err, name, "its extent overflows 64 bits (shape, strides or offset too large)");
	}
	if (r < 0) {
		return rp_error_invalid_operand(err, name, "malformed shape or strides");
	}
	return 0;
}

/* An output `out` that shares bytes with another operand would read
 * partial results (or clobber an input) in an order no library defines.
 * Extents are conservative: two interleaved tensors with disjoint elements
 * but intersecting byte ranges are refused too. */
static int check_no_overlap(const struct rp_operand *out, const char *out_name, const struct rp_operand *other,
			    const char *other_name, struct rp_error *err)
{
	uint64_t b0, e0, b1, e1;
	char id[RP_ID_MAX];

	if (!same_buffer(out, other)) {
		return 0;
	}
	if (extent(out, out_name, &b0, &e0, err) < 0 || extent(other, other_name, &b1, &e1, err) < 0) {
		return -EINVAL;
	}
	if (b0 < e1 && b1 < e0) {
		return rp_error_invalid_operand(err, out_name,
				       "%s (bytes [%" PRIu64 ", %" PRIu64 ")) overlaps %s (bytes [%" PRIu64 ", %" PRIu64
				       ")) in buffer %s; an output must not share memory with another operand",
				       out_name, b0, e0, other_name, b1, e1, rp_id_format(&out->buffer, id));
	}
	return 0;
}

/* An output whose elements share addresses (a zero or too small stride)
 * would be written by many threads at once. Conservative: with the
 * dimensions of size > 1 ordered by stride, each stride must step over the
 * whole extent of the ones inside it. */
static int check_no_self_overlap(const struct rp_operand *out, const char *name, struct rp_error *err)
{
	int64_t stride[RP_RANK_MAX], size[RP_RANK_MAX];
	int n = 0;

	for (int i = 0; i < out->rank; i++) {
		if (out->shape[i] > 1) {
			stride[n] = out->strides[i];
			size[n] = out->shape[i];
			n++;
		}
	}
	for (int i = 1; i < n; i++) {
		for (int j = i; j > 0 && stride[j] < stride[j - 1]; j--) {
			int64_t t = stride[j];
			stride[j] = stride[j - 1];
			stride[j - 1] = t;
			t = size[j];
			size[j] = size[j - 1];
			size[j - 1] = t;
		}
	}
	int64_t reach = 1;
	for (int i = 0; i < n; i++) {
		if (stride[i] < reach) {
			return rp_error_invalid_operand(err, name,
					       "its strides make elements share memory (stride %" PRId64 " where at least %" PRId64
					       " is needed); an output needs every element at its own address",
					       stride[i], reach);
		}
		if (__builtin_mul_overflow(stride[i], size[i], &reach)) {
			return 0;   /* larger than any buffer: bounds will refuse it */
		}
	}
	return 0;
}

/* wait_event / signal_event: an event id ("e0.1.7") or absent. */
static int parse_event(const cJSON *params, const char *name, struct rp_event_ref *ev, struct rp_error *err)
{
	const char *text;
	int r;

	memset(ev, 0, sizeof(*ev));
	r = rp_params_string(params, name, RP_ID_MAX - 1, NULL, &text, err);
	if (r < 0) {
		return r;
	}
	if (r == 1) {
		return 0;
	}
	if (rp_id_parse(text, &ev->id) < 0 || ev->id.kind != RP_ID_EVENT) {
		memset(ev, 0, sizeof(*ev));
		return rp_error_invalid_parameter(err, name);
	}
	ev->present = true;
	return 0;
}

static int parse_events(const cJSON *params, struct rp_event_ref *wait, struct rp_event_ref *signal,
			struct rp_error *err)
{
	int r = parse_event(params, "wait_event", wait, err);

	if (r < 0) {
		return r;
	}
	return parse_event(params, "signal_event", signal, err);
}

/* ---- Gemm ------------------------------------------------------------------- */

static const struct rp_field gemm_fields[] = {
	{ "a", RP_T_OBJECT, true },
	{ "b", RP_T_OBJECT, true },
	{ "c", RP_T_OBJECT, false },
	{ "d", RP_T_OBJECT, true },
	{ "bias", RP_T_OBJECT, false },
	{ "trans_a", RP_T_BOOL, false },
	{ "trans_b", RP_T_BOOL, false },
	{ "alpha", RP_T_FLOAT, false },
	{ "beta", RP_T_FLOAT, false },
	{ "epilogue", RP_T_STRING, false },
	{ "compute", RP_T_STRING, false },
	{ "wait_event", RP_T_STRING, false },
	{ "signal_event", RP_T_STRING, false },
	{ NULL, 0, false },
};

/* In enum rp_epilogue / rp_compute_mode order. */
static const char *const epilogue_names[] = { "none", "bias", "gelu", "gelu_bias", NULL };
static const char *const compute_names[] = { "f32", "tf32", NULL };

static bool epilogue_adds_bias(enum rp_epilogue e)
{
	return e == RP_EPILOGUE_BIAS || e == RP_EPILOGUE_GELU_BIAS;
}

static int gemm_parse_fields(const cJSON *params, struct rp_gemm *g, struct rp_error *err)
{
	int r, e, c;

	r = rp_params_check(params, gemm_fields, err);
	if (r < 0) {
		return r;
	}
	if ((r = rp_operand_parse(params, "a", true, &g->a, err)) < 0 ||
	    (r = rp_operand_parse(params, "b", true, &g->b, err)) < 0) {
		return r;
	}
	r = rp_operand_parse(params, "c", false, &g->c, err);
	if (r < 0) {
		return r;
	}
	g->has_c = r == 0;
	if ((r = rp_operand_parse(params, "d", true, &g->d, err)) < 0) {
		return r;
	}
	r = rp_operand_parse(params, "bias", false, &g->bias, err);
	if (r < 0) {
		return r;
	}
	g->has_bias = r == 0;

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
	/* The getters refuse what JSON cannot say; cJSON still turns 1e999
	 * into infinity, which must not reach a kernel. */
	if (!isfinite(g->alpha)) {
		return rp_error_invalid_parameter(err, "alpha");
	}
	if (!isfinite(g->beta)) {
		return rp_error_invalid_parameter(err, "beta");
	}
	return parse_events(params, &g->wait_event, &g->signal_event, err);
}

static int gemm_check_layout(const struct rp_gemm *g, struct rp_error *err)
{
	int r;

	if ((r = check_rank(&g->a, "a", 2, "a matrix", err)) < 0 ||
	    (r = check_rank(&g->b, "b", 2, "a matrix", err)) < 0 ||
	    (g->has_c && (r = check_rank(&g->c, "c", 2, "a matrix", err)) < 0) ||
	    (r = check_rank(&g->d, "d", 2, "a matrix", err)) < 0 ||
	    (g->has_bias && (r = check_rank(&g->bias, "bias", 1, "a vector of N", err)) < 0)) {
		return r;
	}
	if ((r = check_strides(&g->a, "a", true, err)) < 0 ||
	    (r = check_strides(&g->b, "b", true, err)) < 0 ||
	    (g->has_c && (r = check_strides(&g->c, "c", true, err)) < 0) ||
	    (r = check_strides(&g->d, "d", true, err)) < 0 ||
	    (g->has_bias && (r = check_strides(&g->bias, "bias", false, err)) < 0)) {
		return r;
	}
	/* Inputs share a type, outputs share a type; d may be wider than
	 * a and b (bf16 in, f32 out), as cuBLASLt allows. */
	if ((r = check_dtype(&g->b, "b", &g->a, "a", err)) < 0 ||
	    (g->has_c && (r = check_dtype(&g->c, "c", &g->d, "d", err)) < 0) ||
	    (g->has_bias && (r = check_dtype(&g->bias, "bias", &g->d, "d", err)) < 0)) {
		return r;
	}
	return 0;
}

static int gemm_check_shapes(struct rp_gemm *g, struct rp_error *err)
{
	const int64_t ma = g->trans_a ? g->a.shape[1] : g->a.shape[0];
	const int64_t ka = g->trans_a ? g->a.shape[0] : g->a.shape[1];
	const int64_t kb = g->trans_b ? g->b.shape[1] : g->b.shape[0];
	const int64_t nb = g->trans_b ? g->b.shape[0] : g->b.shape[1];
	const int64_t opa[2] = { ma, ka }, opb[2] = { kb, nb }, mn[2] = { ma, nb };

	if (ka != kb) {
		/* The usual cause is a transpose flag: say so when flipping
		 * one would make the shapes agree. */
		const int64_t ka_flip = g->trans_a ? g->a.shape[1] : g->a.shape[0];
		const int64_t kb_flip = g->trans_b ? g->b.shape[0] : g->b.shape[1];
		bool flip_helps = ka_flip == kb || ka == kb_flip || ka_flip == kb_flip;

		return rp_error_invalid_operand(err, "b",
				       "op(A) is %s but op(B) is %s: K must agree (%" PRId64 " vs %" PRId64 ")%s",
				       shape_fmt(2, opa).s, shape_fmt(2, opb).s, ka, kb,
				       flip_helps ? "; check trans_a and trans_b" : "");
	}
	if (!shape_eq(&g->d, 2, mn)) {
		return rp_error_invalid_operand(err, "d", "d is %s but op(A) op(B) is %s", op_shape(&g->d).s,
				       shape_fmt(2, mn).s);
	}
	if (g->has_c && !shape_eq(&g->c, 2, mn)) {
		return rp_error_invalid_operand(err, "c", "c is %s but op(A) op(B) is %s", op_shape(&g->c).s,
				       shape_fmt(2, mn).s);
	}
	if (g->has_bias && g->bias.shape[0] != nb) {
		return rp_error_invalid_operand(err, "bias", "bias is %s but op(A) op(B) has %" PRId64 " columns; bias must be [%" PRId64 "]",
				       op_shape(&g->bias).s, nb, nb);
	}
	g->m = ma;
	g->n = nb;
	g->k = ka;
	return 0;
}

static int gemm_check_options(const struct rp_gemm *g, struct rp_error *err)
{
	if (g->beta != 0.0 && !g->has_c) {
		return rp_error_invalid_operand(err, "c", "beta is %g, which scales c, but no c was given; pass c or leave beta 0",
				       g->beta);
	}
	if (epilogue_adds_bias(g->epilogue) && !g->has_bias) {
		return rp_error_invalid_operand(err, "bias", "epilogue %s adds a bias but no bias was given",
				       epilogue_names[g->epilogue]);
	}
	if (!epilogue_adds_bias(g->epilogue) && g->has_bias) {
		return rp_error_invalid_operand(err, "bias",
				       "a bias was given but epilogue %s does not add one; use bias or gelu_bias",
				       epilogue_names[g->epilogue]);
	}
	/* TF32 is a way of multiplying f32 inputs; it means nothing for
	 * inputs that are already 16-bit. */
	if (g->compute == RP_COMPUTE_TF32 && g->a.dtype != RP_DTYPE_F32) {
		return rp_error_invalid_parameter(err, "compute");
	}
	return 0;
}

static int gemm_check_overlap(const struct rp_gemm *g, struct rp_error *err)
{
	int r;

	if ((r = check_no_overlap(&g->d, "d", &g->a, "a", err)) < 0 ||
	    (r = check_no_overlap(&g->d, "d", &g->b, "b", err)) < 0 ||
	    (g->has_bias && (r = check_no_overlap(&g->d, "d", &g->bias, "bias", err)) < 0)) {
		return r;
	}
	/* C is read and D written per element: the same tensor is fine,
	 * any other sharing would read elements already overwritten. */
	if (g->has_c && !same_tensor(&g->c, &g->d)) {
		uint64_t b0, e0, b1, e1;

		if (!same_buffer(&g->c, &g->d)) {
			return 0;
		}
		if (extent(&g->c, "c", &b0, &e0, err) < 0 || extent(&g->d, "d", &b1, &e1, err) < 0) {
			return -EINVAL;
		}
		if (b0 < e1 && b1 < e0) {
			return rp_error_invalid_operand(err, "c",
					       "c (bytes [%" PRIu64 ", %" PRIu64 ")) overlaps d (bytes [%" PRIu64 ", %" PRIu64
					       ")) without being the same tensor; c may alias d only exactly (same offset, dtype, shape and strides)",
					       b0, e0, b1, e1);
		}
	}
	return 0;
}

int rp_gemm_parse(const cJSON *params, struct rp_gemm *g, struct rp_error *err)
{
	int r;

	memset(g, 0, sizeof(*g));
	if ((r = gemm_parse_fields(params, g, err)) < 0 ||
	    (r = gemm_check_layout(g, err)) < 0 ||
	    (r = gemm_check_shapes(g, err)) < 0 ||
	    (r = gemm_check_options(g, err)) < 0 ||
	    (r = gemm_check_overlap(g, err)) < 0) {
		goto fail;
	}
	return 0;

fail:
	/* A half-filled descriptor must not look usable. */
	memset(g, 0, sizeof(*g));
	return r;
}

/* ---- Attention ----------------------------------------------------------------- */

/* What forward and backward share: q, k, v, o, stats and the dimensions
 * they agree on. */
struct att_core {
	const struct rp_operand *q, *k, *v, *o, *stats;   /* stats may be NULL */
	int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_v;
};

static int check_att_operand(const struct rp_operand *op, const char *name, const struct rp_operand *q,
			     struct rp_error *err)
{
	int r;

	if ((r = check_rank(op, name, 4, "[batch, heads, sequence, head_dim]", err)) < 0 ||
	    (r = check_strides(op, name, false, err)) < 0) {
		return r;
	}
	if (q != NULL && q != op) {
		return check_dtype(op, name, q, "q", err);
	}
	return 0;
}

static int check_stats(const struct rp_operand *stats, const struct att_core *c, struct rp_error *err)
{
	const int64_t want[3] = { c->batch, c->heads, c->seq_q };
	int r;

	if ((r = check_rank(stats, "stats", 3, "[batch, heads, seq_q]", err)) < 0 ||
	    (r = check_strides(stats, "stats", false, err)) < 0) {
		return r;
	}
	if (stats->dtype != RP_DTYPE_F32) {
		return rp_error_invalid_operand(err, "stats", "stats is %s but must be f32 (log-sum-exp is kept in f32)",
				       rp_dtype_name(stats->dtype));
	}
	if (!shape_eq(stats, 3, want)) {
		return rp_error_invalid_operand(err, "stats", "stats is %s but must be [B, H, Sq] = %s", op_shape(stats).s,
				       shape_fmt(3, want).s);
	}
	return 0;
}

static int check_att_core(struct att_core *c, struct rp_error *err)
{
	const int64_t *qs = c->q->shape;
	int r;

	if ((r = check_att_operand(c->q, "q", NULL, err)) < 0 ||
	    (r = check_att_operand(c->k, "k", c->q, err)) < 0 ||
	    (r = check_att_operand(c->v, "v", c->q, err)) < 0 ||
	    (r = check_att_operand(c->o, "o", c->q, err)) < 0) {
		return r;
	}
	c->batch = qs[0];
	c->heads = qs[1];
	c->seq_q = qs[2];
	c->head_dim = qs[3];
	c->seq_kv = c->k->shape[2];
	c->head_dim_v = c->v->shape[3];

	const int64_t kwant[4] = { c->batch, c->heads, c->seq_kv, c->head_dim };
	const int64_t vwant[4] = { c->batch, c->heads, c->seq_kv, c->head_dim_v };
	const int64_t owant[4] = { c->batch, c->heads, c->seq_q, c->head_dim_v };

	if (!shape_eq(c->k, 4, kwant)) {
		return rp_error_invalid_operand(err, "k", "k is %s but q is %s: k must be [B, H, Skv, D] = %s",
				       op_shape(c->k).s, op_shape(c->q).s, shape_fmt(4, kwant).s);
	}
	if (!shape_eq(c->v, 4, vwant)) {
		return rp_error_invalid_operand(err, "v", "v is %s but must be [B, H, Skv, Dv] = %s (B, H from q, Skv from k)",
				       op_shape(c->v).s, shape_fmt(4, vwant).s);
	}
	if (!shape_eq(c->o, 4, owant)) {
		return rp_error_invalid_operand(err, "o", "o is %s but must be [B, H, Sq, Dv] = %s (B, H, Sq from q, Dv from v)",
				       op_shape(c->o).s, shape_fmt(4, owant).s);
	}
	if (c->stats != NULL && (r = check_stats(c->stats, c, err)) < 0) {
		return r;
	}
	return 0;
}

/* scale defaults to 1/sqrt(D), so it is read once D is known. */
static int parse_scale(const cJSON *params, int64_t head_dim, double *scale, struct rp_error *err)
{
	int r = rp_params_double(params, "scale", 1.0 / sqrt((double)head_dim), scale, err);

	if (r < 0) {
		return r;
	}
	if (!isfinite(*scale) || !(*scale > 0.0)) {
		return rp_error_invalid_parameter(err, "scale");
	}
	return 0;
}

static const struct rp_field attention_fields[] = {
	{ "q", RP_T_OBJECT, true },
	{ "k", RP_T_OBJECT, true },
	{ "v", RP_T_OBJECT, true },
	{ "o", RP_T_OBJECT, true },
	{ "stats", RP_T_OBJECT, false },
	{ "scale", RP_T_FLOAT, false },
	{ "causal", RP_T_BOOL, false },
	{ "wait_event", RP_T_STRING, false },
	{ "signal_event", RP_T_STRING, false },
	{ NULL, 0, false },
};

int rp_attention_parse(const cJSON *params, struct rp_attention *a, struct rp_error *err)
{
	struct att_core c = { 0 };
	int r;

	memset(a, 0, sizeof(*a));
	if ((r = rp_params_check(params, attention_fields, err)) < 0 ||
	    (r = rp_operand_parse(params, "q", true, &a->q, err)) < 0 ||
	    (r = rp_operand_parse(params, "k", true, &a->k, err)) < 0 ||
	    (r = rp_operand_parse(params, "v", true, &a->v, err)) < 0 ||
	    (r = rp_operand_parse(params, "o", true, &a->o, err)) < 0 ||
	    (r = rp_operand_parse(params, "stats", false, &a->stats, err)) < 0) {
		goto fail;
	}
	a->has_stats = r == 0;
	if ((r = rp_params_bool(params, "causal", false, &a->causal, err)) < 0 ||
	    (r = parse_events(params, &a->wait_event, &a->signal_event, err)) < 0) {
		goto fail;
	}

	c.q = &a->q;
	c.k = &a->k;
	c.v = &a->v;
	c.o = &a->o;
	c.stats = a->has_stats ? &a->stats : NULL;
	if ((r = check_att_core(&c, err)) < 0 ||
	    (r = parse_scale(params, c.head_dim, &a->scale, err)) < 0) {
		goto fail;
	}

	/* o and stats are written; nothing read may share their bytes. */
	if ((r = check_no_self_overlap(&a->o, "o", err)) < 0 ||
	    (a->has_stats && (r = check_no_self_overlap(&a->stats, "stats", err)) < 0) ||
	    (r = check_no_overlap(&a->o, "o", &a->q, "q", err)) < 0 ||
	    (r = check_no_overlap(&a->o, "o", &a->k, "k", err)) < 0 ||
	    (r = check_no_overlap(&a->o, "o", &a->v, "v", err)) < 0) {
		goto fail;
	}
	if (a->has_stats &&
	    ((r = check_no_overlap(&a->stats, "stats", &a->q, "q", err)) < 0 ||
	     (r = check_no_overlap(&a->stats, "stats", &a->k, "k", err)) < 0 ||
	     (r = check_no_overlap(&a->stats, "stats", &a->v, "v", err)) < 0 ||
	     (r = check_no_overlap(&a->stats, "stats", &a->o, "o", err)) < 0)) {
		goto fail;
	}

	a->batch = c.batch;
	a->heads = c.heads;
	a->seq_q = c.seq_q;
	a->seq_kv = c.seq_kv;
	a->head_dim = c.head_dim;
	a->head_dim_v = c.head_dim_v;
	return 0;

fail:
	memset(a, 0, sizeof(*a));
	return r;
}

static const struct rp_field attention_backward_fields[] = {
	{ "q", RP_T_OBJECT, true },
	{ "k", RP_T_OBJECT, true },
	{ "v", RP_T_OBJECT, true },
	{ "o", RP_T_OBJECT, true },
	{ "d_o", RP_T_OBJECT, true },
	{ "stats", RP_T_OBJECT, true },
	{ "d_q", RP_T_OBJECT, true },
	{ "d_k", RP_T_OBJECT, true },
	{ "d_v", RP_T_OBJECT, true },
	{ "scale", RP_T_FLOAT, false },
	{ "causal", RP_T_BOOL, false },
	{ "wait_event", RP_T_STRING, false },
	{ "signal_event", RP_T_STRING, false },
	{ NULL, 0, false },
};

/* A gradient has its primal's shape and dtype. */
static int check_like(const struct rp_operand *op, const char *name, const struct rp_operand *like,
		      const char *like_name, const struct rp_operand *q, struct rp_error *err)
{
	int r = check_att_operand(op, name, q, err);

	if (r < 0) {
		return r;
	}
	if (!shape_eq(op, like->rank, like->shape)) {
		return rp_error_invalid_operand(err, name, "%s is %s but must be shaped like %s, %s", name, op_shape(op).s,
				       like_name, op_shape(like).s);
	}
	return 0;
}

int rp_attention_backward_parse(const cJSON *params, struct rp_attention_backward *a, struct rp_error *err)
{
	struct att_core c = { 0 };
	int r;

	memset(a, 0, sizeof(*a));
	if ((r = rp_params_check(params, attention_backward_fields, err)) < 0 ||
	    (r = rp_operand_parse(params, "q", true, &a->q, err)) < 0 ||
	    (r = rp_operand_parse(params, "k", true, &a->k, err)) < 0 ||
	    (r = rp_operand_parse(params, "v", true, &a->v, err)) < 0 ||
	    (r = rp_operand_parse(params, "o", true, &a->o, err)) < 0 ||
	    (r = rp_operand_parse(params, "d_o", true, &a->d_o, err)) < 0 ||
	    (r = rp_operand_parse(params, "stats", true, &a->stats, err)) < 0 ||
	    (r = rp_operand_parse(params, "d_q", true, &a->d_q, err)) < 0 ||
	    (r = rp_operand_parse(params, "d_k", true, &a->d_k, err)) < 0 ||
	    (r = rp_operand_parse(params, "d_v", true, &a->d_v, err)) < 0 ||
	    (r = rp_params_bool(params, "causal", false, &a->causal, err)) < 0 ||
	    (r = parse_events(params, &a->wait_event, &a->signal_event, err)) < 0) {
		goto fail;
	}

	c.q = &a->q;
	c.k = &a->k;
	c.v = &a->v;
	c.o = &a->o;
	c.stats = &a->stats;
	if ((r = check_att_core(&c, err)) < 0 ||
	    (r = check_like(&a->d_o, "d_o", &a->o, "o", &a->q, err)) < 0 ||
	    (r = check_like(&a->d_q, "d_q", &a->q, "q", &a->q, err)) < 0 ||
	    (r = check_like(&a->d_k, "d_k", &a->k, "k", &a->q, err)) < 0 ||
	    (r = check_like(&a->d_v, "d_v", &a->v, "v", &a->q, err)) < 0 ||
	    (r = parse_scale(params, c.head_dim, &a->scale, err)) < 0) {
		goto fail;
	}

	/* Each gradient is written while every input is still read (and dK,
	 * dV accumulate across query rows): no output may share bytes with
	 * an input or with another output. */
	const struct {
		const struct rp_operand *op;
		const char *name;
	} outs[] = {
		{ &a->d_q, "d_q" }, { &a->d_k, "d_k" }, { &a->d_v, "d_v" },
	}, ins[] = {
		{ &a->q, "q" }, { &a->k, "k" }, { &a->v, "v" }, { &a->o, "o" }, { &a->d_o, "d_o" }, { &a->stats, "stats" },
	};
	for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
		if ((r = check_no_self_overlap(outs[i].op, outs[i].name, err)) < 0) {
			goto fail;
		}
		for (size_t j = 0; j < sizeof(ins) / sizeof(ins[0]); j++) {
			if ((r = check_no_overlap(outs[i].op, outs[i].name, ins[j].op, ins[j].name, err)) < 0) {
				goto fail;
			}
		}
		for (size_t j = i + 1; j < sizeof(outs) / sizeof(outs[0]); j++) {
			if ((r = check_no_overlap(outs[i].op, outs[i].name, outs[j].op, outs[j].name, err)) < 0) {
				goto fail;
			}
		}
	}

	a->batch = c.batch;
	a->heads = c.heads;
	a->seq_q = c.seq_q;
	a->seq_kv = c.seq_kv;
	a->head_dim = c.head_dim;
	a->head_dim_v = c.head_dim_v;
	return 0;

fail:
	memset(a, 0, sizeof(*a));
	return r;
}
