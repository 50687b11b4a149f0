/* SPDX-License-Identifier: Apache-2.0 */
/* Composites, lowered at Define into the primitives a backend runs:
 * pointwise chains, row reductions and views, with the intermediates they
 * need named "<node>.<k>". A composite checks its own operands first, so
 * that a mistake is named as the client wrote it ("rms_norm's weight is
 * [5] but x's rows are 4 long"); what it lowers into is checked again with
 * every other node.
 *
 * The math follows torch's (the references the tests hold it to):
 * intermediates in f32 (f64 where the data is f64), each composite's reads
 * of its inputs placed before its writes of its outputs, so that an output
 * may be its input's very tensor (in place) without reading what it wrote. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "params.h"
#include "program_build.h"

/* What a lowering carries around: the builder and the composite's node. */
struct lower {
	struct rp_prog_builder *b;
	const struct rp_prog_node *node;
	const char *path;             /* "nodes[3].attrs" */
	enum rp_dtype acc;            /* the intermediates' dtype */
};

static const struct rp_prog_tensor *T(const struct lower *l, int t)
{
	return rp_prog_t(l->b, t);
}

static const char *shape_of(const struct lower *l, int t, char buf[96])
{
	return rp_prog_shape(T(l, t), buf);
}

/* f64 where any of the data is, else f32. */
static enum rp_dtype acc_of(const struct lower *l, const int *t, int n)
{
	for (int i = 0; i < n; i++) {
		if (t[i] >= 0 && T(l, t[i])->dtype == RP_DTYPE_F64) {
			return RP_DTYPE_F64;
		}
	}
	return RP_DTYPE_F32;
}

/* ---- Emitting primitives ------------------------------------------------------------- */

static int emit(struct lower *l, enum rp_prog_class cls, int fn, const int *in, int nin, int out,
		struct rp_prog_node *n)
{
	n->op = rp_prog_op_of(cls, fn);
	for (int i = 0; i < RP_PROG_NODE_IN_MAX; i++) {
		n->in[i] = i < nin ? in[i] : -1;
	}
	for (int i = 0; i < RP_PROG_NODE_OUT_MAX; i++) {
		n->out[i] = -1;
	}
	n->nin = nin;
	n->out[0] = out;
	n->nout = 1;
	n->source = l->b->source;
	return rp_prog_gen_node(l->b, n);
}

/* out = fn(a) or fn(a, c): c < 0 for a unary fn. */
static int pw(struct lower *l, enum rp_pointwise fn, int a, int c, int out)
{
	struct rp_prog_node n = { .pw.fn = fn };
	const int in[2] = { a, c };

	return emit(l, RP_PC_POINTWISE, fn, in, c < 0 ? 1 : 2, out, &n);
}

/* out = fn(a, s), or fn(s, a) with first. */
static int pw_scalar(struct lower *l, enum rp_pointwise fn, int a, double s, bool first, int out)
{
	struct rp_prog_node n = { .pw = { .fn = fn, .has_scalar = true, .scalar = s, .scalar_first = first } };

	return emit(l, RP_PC_POINTWISE, fn, &a, 1, out, &n);
}

/* out = cond ? a : s */
static int where_else(struct lower *l, int cond, int a, double s, int out)
{
	struct rp_prog_node n = { .pw = { .fn = RP_PW_WHERE, .has_scalar = true, .scalar = s } };
	const int in[2] = { cond, a };

	return emit(l, RP_PC_POINTWISE, RP_PW_WHERE, in, 2, out, &n);
}

/* out = the index along dimension axis */
static int iota(struct lower *l, int axis, int out)
{
	struct rp_prog_node n = { .pw = { .fn = RP_PW_IOTA, .axis = axis } };

	return emit(l, RP_PC_POINTWISE, RP_PW_IOTA, NULL, 0, out, &n);
}

static int reduce(struct lower *l, enum rp_reduction fn, enum rp_reduce_axis axis, int in, int out)
{
	struct rp_prog_node n = { .red = { .fn = fn, .axis = axis } };

	return emit(l, RP_PC_REDUCTION, fn, &in, 1, out, &n);
}

/* A new intermediate: *out its index. (Each helper copies what it reads
 * of a tensor before it adds one: adding may move the table.) */
static int fresh(struct lower *l, enum rp_dtype dtype, int rank, const int64_t *shape, int *out)
{
	int t = rp_prog_gen_tensor(l->b, dtype, rank, shape);

	*out = t;
	return t < 0 ? t : 0;
}

static int view(struct lower *l, int base, int64_t offset, int rank, const int64_t *shape, const int64_t *strides,
		int *out)
{
	int t = rp_prog_gen_view(l->b, base, offset, rank, shape, strides);

	*out = t;
	return t < 0 ? t : 0;
}

/* Of the accumulation dtype, shaped like t. */
static int like(struct lower *l, int t, int *out)
{
	int64_t shape[RP_PROG_RANK_MAX];
	int rank = T(l, t)->rank;

	memcpy(shape, T(l, t)->shape, sizeof(shape));
	return fresh(l, l->acc, rank, shape, out);
}

/* Shaped like t with its last dimension 1 (a row statistic that
 * broadcasts back over the row). */
static int row_stat(struct lower *l, enum rp_dtype dtype, int t, int *out)
{
	int64_t shape[RP_PROG_RANK_MAX];
	int rank = T(l, t)->rank;

	memcpy(shape, T(l, t)->shape, sizeof(shape));
	shape[rank - 1] = 1;
	return fresh(l, dtype, rank, shape, out);
}

/* A row statistic given shaped [..] (or already [.., 1]) seen as
 * [.., 1], so that it broadcasts over rows. */
static int keep_dim(struct lower *l, int stat, int rows_rank, int *out)
{
	int64_t shape[RP_PROG_RANK_MAX], strides[RP_PROG_RANK_MAX];
	int rank = T(l, stat)->rank;

	if (rank == rows_rank) {
		*out = stat;
		return 0;
	}
	memcpy(shape, T(l, stat)->shape, sizeof(shape));
	memcpy(strides, T(l, stat)->strides, sizeof(strides));
	shape[rank] = 1;
	strides[rank] = 1;
	return view(l, stat, 0, rank + 1, shape, strides, out);
}

/* ---- What composites check of their operands ------------------------------------------- */

static int need_float(struct lower *l, int t, const char *role)
{
	if (!rp_dtype_is_float(T(l, t)->dtype)) {
		return rp_prog_source_error(l->b, "%s's %s %s is %s but must be a float", l->node->op->name, role,
					    T(l, t)->name, rp_dtype_name(T(l, t)->dtype));
	}
	return 0;
}

static bool same_shape(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y)
{
	if (x->rank != y->rank) {
		return false;
	}
	for (int i = 0; i < x->rank; i++) {
		if (x->shape[i] != y->shape[i]) {
			return false;
		}
	}
	return true;
}

/* t, a float, shaped like ref. */
static int need_like(struct lower *l, int t, const char *role, int ref, const char *ref_role)
{
	char a[96], c[96];
	int r = need_float(l, t, role);

	if (r == 0 && !same_shape(T(l, t), T(l, ref))) {
		return rp_prog_source_error(l->b, "%s's %s %s is %s but must be shaped like its %s %s, %s",
					    l->node->op->name, role, T(l, t)->name, shape_of(l, t, a), ref_role,
					    T(l, ref)->name, shape_of(l, ref, c));
	}
	return r;
}

/* x's rank is at least 1 (a composite that works on rows). */
static int need_rows(struct lower *l, int x, const char *role)
{
	int r = need_float(l, x, role);

	if (r == 0 && T(l, x)->rank == 0) {
		return rp_prog_source_error(l->b, "%s's %s %s has rank 0; it works on rows (the last dimension)",
					    l->node->op->name, role, T(l, x)->name);
	}
	return r;
}

/* A vector [n] (weights): rank 1, the rows' length. */
static int need_vector(struct lower *l, int v, const char *role, int rows)
{
	const struct rp_prog_tensor *x = T(l, rows);
	char a[96], c[96];
	int r = need_float(l, v, role);

	if (r == 0 && (T(l, v)->rank != 1 || T(l, v)->shape[0] != x->shape[x->rank - 1])) {
		return rp_prog_source_error(l->b, "%s's %s %s is %s but %s is %s: it must be [%" PRId64 "], one per column",
					    l->node->op->name, role, T(l, v)->name, shape_of(l, v, a), x->name,
					    shape_of(l, rows, c), x->shape[x->rank - 1]);
	}
	return r;
}

/* A row statistic of rows: shaped rows' shape without the last
 * dimension, or with it as 1. */
static int need_stat(struct lower *l, int s, const char *role, int rows)
{
	const struct rp_prog_tensor *x = T(l, rows), *st = T(l, s);
	char a[96], c[96];
	bool fits = st->rank == x->rank || st->rank == x->rank - 1;
	int r = need_float(l, s, role);

	for (int i = 0; fits && i < st->rank; i++) {
		fits = st->shape[i] == (i == x->rank - 1 ? 1 : x->shape[i]);
	}
	if (r == 0 && !fits) {
		return rp_prog_source_error(l->b,
					    "%s's %s %s is %s but %s is %s: it must have one element per row (%s's "
					    "shape without its last dimension, or with it as 1)",
					    l->node->op->name, role, st->name, shape_of(l, s, a), x->name,
					    shape_of(l, rows, c), x->name);
	}
	return r;
}

static int read_eps(struct lower *l, const cJSON *attrs, const char *name, double def, double *eps)
{
	if (rp_params_double(attrs, name, def, eps, l->b->err) < 0 || !(*eps > 0)) {
		return rp_prog_param_error(l->b, "%s.%s", l->path, name);
	}
	return 0;
}

/* Attrs: no name outside the list, none twice. */
static int check_attr_names(struct lower *l, const cJSON *attrs, const char *const *names)
{
	const cJSON *item, *other;

	cJSON_ArrayForEach(item, attrs) {
		bool known = false;

		for (int i = 0; names[i]; i++) {
			known = known || strcmp(names[i], item->string) == 0;
		}
		for (other = attrs->child; other != item && known; other = other->next) {
			known = strcmp(other->string, item->string) != 0;
		}
		if (!known) {
			return rp_prog_param_error(l->b, "%s.%.*s", l->path, RP_PROG_NAME_MAX, item->string);
		}
	}
	return 0;
}

/* ---- Norms and softmaxes --------------------------------------------------------------- */

/* rms_norm (x, weight?) -> (y, rstd?): y = x / sqrt(mean(x^2) + eps) * weight
 * over the last dimension; rstd the per-row 1 / sqrt(mean(x^2) + eps). */
static int lower_rms_norm(struct lower *l, const cJSON *attrs)
{
	const struct rp_prog_node *n = l->node;
	const int x = n->in[0], w = n->in[1], y = n->out[0], rstd = n->out[1];
	double eps;
	int r, sq, ms, ve, rs, xn;

	if ((r = need_rows(l, x, "x")) < 0 ||
	    (w >= 0 && (r = need_vector(l, w, "weight", x)) < 0) || (r = need_like(l, y, "y", x, "x")) < 0 ||
	    (rstd >= 0 && (r = need_stat(l, rstd, "rstd", x)) < 0) ||
	    (r = read_eps(l, attrs, "eps", 1e-6, &eps)) < 0) {
		return r;
	}
	l->acc = acc_of(l, (int[]){ x, y }, 2);
	if ((r = like(l, x, &sq)) < 0 || (r = pw(l, RP_PW_SQUARE, x, -1, sq)) < 0 || (r = row_stat(l, l->acc, x, &ms)) < 0 ||
	    (r = reduce(l, RP_RED_MEAN, RP_AXIS_LAST, sq, ms)) < 0 || (r = row_stat(l, l->acc, x, &ve)) < 0 ||
	    (r = pw_scalar(l, RP_PW_ADD, ms, eps, false, ve)) < 0) {
		return r;
	}
	r = rstd >= 0 ? keep_dim(l, rstd, T(l, x)->rank, &rs) : row_stat(l, l->acc, x, &rs);
	if (r < 0 || (r = pw(l, RP_PW_RSQRT, ve, -1, rs)) < 0) {
		return r;
	}
	if (w < 0) {
		return pw(l, RP_PW_MUL, x, rs, y);
	}
	if ((r = like(l, x, &xn)) < 0 || (r = pw(l, RP_PW_MUL, x, rs, xn)) < 0) {
		return r;
	}
	return pw(l, RP_PW_MUL, xn, w, y);
}

/* rms_norm_backward (dy, x, weight | null, rstd) -> (dx, dweight?), with
 * xhat = x * rstd and g = dy * weight:
 * dx = rstd * (g - xhat * mean(g * xhat)), dweight = sum over rows of dy * xhat. */
static int lower_rms_norm_backward(struct lower *l, const cJSON *attrs)
{
	const struct rp_prog_node *n = l->node;
	const int dy = n->in[0], x = n->in[1], w = n->in[2], rstd = n->in[3], dx = n->out[0], dw = n->out[1];
	int r, rs, xh, g, gx, m, t, u, p;

	if ((r = check_attr_names(l, attrs, (const char *const[]){ NULL })) < 0 || (r = need_rows(l, x, "x")) < 0 ||
	    (r = need_like(l, dy, "dy", x, "x")) < 0 || (w >= 0 && (r = need_vector(l, w, "weight", x)) < 0) ||
	    (r = need_stat(l, rstd, "rstd", x)) < 0 || (r = need_like(l, dx, "dx", x, "x")) < 0 ||
	    (dw >= 0 && (r = need_vector(l, dw, "dweight", x)) < 0)) {
		return r;
	}
	if (dw >= 0 && w < 0) {
		return rp_prog_source_error(l->b, "dweight is asked for but no weight was given (inputs[2] is null)");
	}
	l->acc = acc_of(l, (int[]){ dy, x, dx }, 3);
	if ((r = keep_dim(l, rstd, T(l, x)->rank, &rs)) < 0 || (r = like(l, x, &xh)) < 0 ||
	    (r = pw(l, RP_PW_MUL, x, rs, xh)) < 0) {
		return r;
	}
	if (dw >= 0 && ((r = like(l, x, &p)) < 0 || (r = pw(l, RP_PW_MUL, dy, xh, p)) < 0 ||
			(r = reduce(l, RP_RED_SUM, RP_AXIS_LEADING, p, dw)) < 0)) {
		return r;
	}
	g = dy;
	if (w >= 0 && ((r = like(l, x, &g)) < 0 || (r = pw(l, RP_PW_MUL, dy, w, g)) < 0)) {
		return r;
	}
	if ((r = like(l, x, &gx)) < 0 || (r = pw(l, RP_PW_MUL, g, xh, gx)) < 0 || (r = row_stat(l, l->acc, x, &m)) < 0 ||
	    (r = reduce(l, RP_RED_MEAN, RP_AXIS_LAST, gx, m)) < 0 || (r = like(l, x, &t)) < 0 ||
	    (r = pw(l, RP_PW_MUL, xh, m, t)) < 0 || (r = like(l, x, &u)) < 0 || (r = pw(l, RP_PW_SUB, g, t, u)) < 0) {
		return r;
	}
	return pw(l, RP_PW_MUL, u, rs, dx);
}

/* softmax (x) -> y = exp(x - lse) and log_softmax (x) -> y = x - lse over
 * the last dimension, lse the row's logsumexp: one pass over x for it
 * (the running max and the sum scaled to it, online), one for y. */
static int lower_softmax(struct lower *l, const cJSON *attrs, bool log)
{
	const int x = l->node->in[0], y = l->node->out[0];
	int r, lse, shifted;

	if ((r = check_attr_names(l, attrs, (const char *const[]){ NULL })) < 0 || (r = need_rows(l, x, "x")) < 0 ||
	    (r = need_like(l, y, "y", x, "x")) < 0) {
		return r;
	}
	l->acc = acc_of(l, (int[]){ x, y }, 2);
	if ((r = row_stat(l, l->acc, x, &lse)) < 0 || (r = reduce(l, RP_RED_LOGSUMEXP, RP_AXIS_LAST, x, lse)) < 0) {
		return r;
	}
	if (log) {
		return pw(l, RP_PW_SUB, x, lse, y);
	}
	if ((r = like(l, x, &shifted)) < 0 || (r = pw(l, RP_PW_SUB, x, lse, shifted)) < 0) {
		return r;
	}
	return pw(l, RP_PW_EXP, shifted, -1, y);
}

/* softmax_backward (dy, y) -> dx = y * (dy - sum(dy * y));
 * log_softmax_backward (dy, y) -> dx = dy - exp(y) * sum(dy). */
static int lower_softmax_backward(struct lower *l, const cJSON *attrs, bool log)
{
	const int dy = l->node->in[0], y = l->node->in[1], dx = l->node->out[0];
	int r, p, s, d, e;

	if ((r = check_attr_names(l, attrs, (const char *const[]){ NULL })) < 0 || (r = need_rows(l, y, "y")) < 0 ||
	    (r = need_like(l, dy, "dy", y, "y")) < 0 || (r = need_like(l, dx, "dx", y, "y")) < 0) {
		return r;
	}
	l->acc = acc_of(l, (int[]){ dy, y, dx }, 3);
	if ((r = row_stat(l, l->acc, y, &s)) < 0) {
		return s;
	}
	if (log) {
		if ((r = reduce(l, RP_RED_SUM, RP_AXIS_LAST, dy, s)) < 0 || (r = like(l, y, &e)) < 0 ||
		    (r = pw(l, RP_PW_EXP, y, -1, e)) < 0 || (r = like(l, y, &p)) < 0 || (r = pw(l, RP_PW_MUL, e, s, p)) < 0) {
			return r;
		}
		return pw(l, RP_PW_SUB, dy, p, dx);
	}
	if ((r = like(l, y, &p)) < 0 || (r = pw(l, RP_PW_MUL, dy, y, p)) < 0 ||
	    (r = reduce(l, RP_RED_SUM, RP_AXIS_LAST, p, s)) < 0 || (r = like(l, y, &d)) < 0 ||
	    (r = pw(l, RP_PW_SUB, dy, s, d)) < 0) {
		return r;
	}
	return pw(l, RP_PW_MUL, y, d, dx);
}

/* ---- Cross-entropy ----------------------------------------------------------------------- */

#define IGNORE_INDEX_DEFAULT (-100)

/* target [N] (i32 or i64) against logits [N, V]; per-row vectors [N] or [N, 1]. */
static int need_targets(struct lower *l, int logits, int target, double *ignore, const cJSON *attrs)
{
	const struct rp_prog_tensor *lg = T(l, logits), *tg = T(l, target);
	char a[96], c[96];
	int r;

	if ((r = need_float(l, logits, "logits")) < 0) {
		return r;
	}
	if (lg->rank != 2) {
		return rp_prog_source_error(l->b, "%s's logits %s is %s but must be [N, V]", l->node->op->name, lg->name,
					    shape_of(l, logits, a));
	}
	if ((tg->dtype != RP_DTYPE_I32 && tg->dtype != RP_DTYPE_I64) || tg->rank != 1 || tg->shape[0] != lg->shape[0]) {
		return rp_prog_source_error(l->b,
					    "%s's target %s is %s %s but must be i32 or i64 [%" PRId64
					    "], one class per row of %s %s",
					    l->node->op->name, tg->name, rp_dtype_name(tg->dtype), shape_of(l, target, a),
					    lg->shape[0], lg->name, shape_of(l, logits, c));
	}
	if (rp_params_double(attrs, "ignore_index", IGNORE_INDEX_DEFAULT, ignore, l->b->err) < 0 ||
	    *ignore != trunc(*ignore) || fabs(*ignore) > 9007199254740992.0) {
		return rp_prog_param_error(l->b, "%s.ignore_index", l->path);
	}
	return 0;
}

/* target [N] seen as [N, 1]. */
static int target_column(struct lower *l, int target, int *out)
{
	const int64_t shape[2] = { T(l, target)->shape[0], 1 }, strides[2] = { T(l, target)->strides[0], 1 };

	return view(l, target, 0, 2, shape, strides, out);
}

/* 1 where the row's class is the column's, 0 elsewhere, in dtype: [N, V]. */
static int one_hot(struct lower *l, int logits, int target_col, enum rp_dtype dtype, int *out)
{
	const int64_t nv[2] = { T(l, logits)->shape[0], T(l, logits)->shape[1] };
	int r, cls;

	if ((r = fresh(l, T(l, target_col)->dtype, 1, &nv[1], &cls)) < 0 || (r = iota(l, 0, cls)) < 0 ||
	    (r = fresh(l, dtype, 2, nv, out)) < 0) {
		return r;
	}
	return pw(l, RP_PW_EQ, cls, target_col, *out);
}

/* Whether each row's target is a class (not ignore_index): u8 [N, 1]. */
static int kept_rows(struct lower *l, int target_col, double ignore, int *out)
{
	const int64_t shape[2] = { T(l, target_col)->shape[0], 1 };
	int r = fresh(l, RP_DTYPE_U8, 2, shape, out);

	return r < 0 ? r : pw_scalar(l, RP_PW_NE, target_col, ignore, false, *out);
}

/* cross_entropy (logits [N, V], target [N]) -> (loss [N], lse [N]?), per
 * row: loss = logsumexp(logits) - logits[target]; 0 where target is
 * ignore_index (default -100, torch's). */
static int lower_cross_entropy(struct lower *l, const cJSON *attrs)
{
	const struct rp_prog_node *n = l->node;
	const int logits = n->in[0], target = n->in[1], loss = n->out[0], lse = n->out[1];
	double ignore;
	int r, tc, lt, oh, picked, pk, raw, valid, lv;

	if ((r = check_attr_names(l, attrs, (const char *const[]){ "ignore_index", NULL })) < 0 ||
	    (r = need_targets(l, logits, target, &ignore, attrs)) < 0 || (r = need_stat(l, loss, "loss", logits)) < 0 ||
	    (lse >= 0 && (r = need_stat(l, lse, "lse", logits)) < 0)) {
		return r;
	}
	l->acc = acc_of(l, (int[]){ logits }, 1);
	/* The row's logsumexp, in one pass (into lse where it is wanted). */
	r = lse >= 0 ? keep_dim(l, lse, 2, &lt) : row_stat(l, l->acc, logits, &lt);
	if (r < 0 || (r = target_column(l, target, &tc)) < 0 ||
	    (r = reduce(l, RP_RED_LOGSUMEXP, RP_AXIS_LAST, logits, lt)) < 0) {
		return r;
	}
	/* The logit of the target's class: the row's sum where the one-hot
	 * is 1 (where, not a product, so that an inf elsewhere in the row
	 * does not make it NaN). */
	if ((r = one_hot(l, logits, tc, RP_DTYPE_U8, &oh)) < 0 || (r = like(l, logits, &picked)) < 0 ||
	    (r = where_else(l, oh, logits, 0.0, picked)) < 0 || (r = row_stat(l, l->acc, logits, &pk)) < 0 ||
	    (r = reduce(l, RP_RED_SUM, RP_AXIS_LAST, picked, pk)) < 0 || (r = row_stat(l, l->acc, logits, &raw)) < 0 ||
	    (r = kept_rows(l, tc, ignore, &valid)) < 0 || (r = keep_dim(l, loss, 2, &lv)) < 0) {
		return r;
	}
	if ((r = pw(l, RP_PW_SUB, lt, pk, raw)) < 0) {
		return r;
	}
	return where_else(l, valid, raw, 0.0, lv);
}

/* cross_entropy_backward (dloss [N], logits [N, V], target [N], lse [N])
 * -> dlogits [N, V] = (softmax(logits) - onehot(target)) * dloss, rows of
 * ignore_index 0. */
static int lower_cross_entropy_backward(struct lower *l, const cJSON *attrs)
{
	const struct rp_prog_node *n = l->node;
	const int dloss = n->in[0], logits = n->in[1], target = n->in[2], lse = n->in[3], dl = n->out[0];
	double ignore;
	int r, tc, lv, dv, s0, p, oh, d0, valid, g;

	if ((r = check_attr_names(l, attrs, (const char *const[]){ "ignore_index", NULL })) < 0 ||
	    (r = need_targets(l, logits, target, &ignore, attrs)) < 0 || (r = need_stat(l, dloss, "dloss", logits)) < 0 ||
	    (r = need_stat(l, lse, "lse", logits)) < 0 || (r = need_like(l, dl, "dlogits", logits, "logits")) < 0) {
		return r;
	}
	l->acc = acc_of(l, (int[]){ logits, dl }, 2);
	if ((r = target_column(l, target, &tc)) < 0 || (r = keep_dim(l, lse, 2, &lv)) < 0 ||
	    (r = keep_dim(l, dloss, 2, &dv)) < 0 || (r = like(l, logits, &s0)) < 0 ||
	    (r = pw(l, RP_PW_SUB, logits, lv, s0)) < 0 || (r = like(l, logits, &p)) < 0 ||
	    (r = pw(l, RP_PW_EXP, s0, -1, p)) < 0 || (r = one_hot(l, logits, tc, l->acc, &oh)) < 0 ||
	    (r = like(l, logits, &d0)) < 0 || (r = pw(l, RP_PW_SUB, p, oh, d0)) < 0 ||
	    (r = kept_rows(l, tc, ignore, &valid)) < 0 || (r = like(l, logits, &g)) < 0 ||
	    (r = where_else(l, valid, dv, 0.0, g)) < 0) {
		return r;
	}
	return pw(l, RP_PW_MUL, d0, g, dl);
}

/* ---- Rotary embeddings --------------------------------------------------------------------- */

/* x [B, S, H, D] ("bshd", the default) or [B, H, S, D] ("bhsd"), cos and
 * sin [S, D/2]; rotate-half (GPT-NeoX, llama): with x1, x2 the halves of
 * the last dimension, out = (x1 cos - x2 sin, x2 cos + x1 sin). The
 * backward rotates back: dx = (g1 cos + g2 sin, g2 cos - g1 sin). */
static int lower_rotary(struct lower *l, const cJSON *attrs, bool backward)
{
	static const struct rp_field fields[] = { { "layout", RP_T_STRING, false }, { NULL, 0, false } };
	static const char *const layouts[] = { "bshd", "bhsd", NULL };
	const int x = l->node->in[0], cs = l->node->in[1], sn = l->node->in[2], out = l->node->out[0];
	const struct rp_prog_tensor *xt = T(l, x), *ot = T(l, out);
	int64_t half[4], x_strides[4], out_strides[4];
	int layout, r, x1, x2, o1, o2, c, s, a, bb, d, e;
	char sa[96], sc[96];

	if (rp_params_check(attrs, fields, l->b->err) < 0) {
		return rp_prog_param_under(l->b, l->path);
	}
	if (rp_params_enum(attrs, "layout", layouts, 0, &layout, l->b->err) < 0) {
		return rp_prog_param_error(l->b, "%s.layout", l->path);
	}
	if ((r = need_float(l, x, "x")) < 0 || (r = need_float(l, cs, "cos")) < 0 || (r = need_float(l, sn, "sin")) < 0 ||
	    (r = need_like(l, out, backward ? "dx" : "out", x, backward ? "dout" : "x")) < 0) {
		return r;
	}
	if (xt->rank != 4 || xt->shape[3] % 2 != 0) {
		return rp_prog_source_error(l->b, "%s's %s %s is %s but must be [B, %s, D] with D even",
					    l->node->op->name, backward ? "dout" : "x", xt->name, shape_of(l, x, sa),
					    layout ? "H, S" : "S, H");
	}
	const int64_t seq = xt->shape[layout ? 2 : 1], hd = xt->shape[3] / 2;
	for (int i = 0; i < 2; i++) {
		const struct rp_prog_tensor *t = T(l, i ? sn : cs);

		if (t->rank != 2 || t->shape[0] != seq || t->shape[1] != hd) {
			return rp_prog_source_error(l->b, "%s's %s %s is %s but must be [S, D/2] = [%" PRId64 ", %" PRId64 "] for %s %s",
						    l->node->op->name, i ? "sin" : "cos", t->name, rp_prog_shape(t, sc), seq, hd,
						    xt->name, shape_of(l, x, sa));
		}
	}
	l->acc = acc_of(l, (int[]){ x, out }, 2);
	/* Copied: adding the views may move the tensor table. */
	memcpy(half, xt->shape, sizeof(half));
	memcpy(x_strides, xt->strides, sizeof(x_strides));
	memcpy(out_strides, ot->strides, sizeof(out_strides));
	half[3] = hd;
	if ((r = view(l, x, 0, 4, half, x_strides, &x1)) < 0 ||
	    (r = view(l, x, hd * x_strides[3], 4, half, x_strides, &x2)) < 0 ||
	    (r = view(l, out, 0, 4, half, out_strides, &o1)) < 0 ||
	    (r = view(l, out, hd * out_strides[3], 4, half, out_strides, &o2)) < 0) {
		return r;
	}
	c = cs;
	s = sn;
	if (layout == 0) {
		/* [S, D/2] seen as [S, 1, D/2]: it broadcasts over B and H. */
		for (int i = 0; i < 2; i++) {
			const int64_t trig[3] = { seq, 1, hd };
			const int64_t trig_strides[3] = { T(l, i ? sn : cs)->strides[0], 0, T(l, i ? sn : cs)->strides[1] };

			if ((r = view(l, i ? sn : cs, 0, 3, trig, trig_strides, i ? &s : &c)) < 0) {
				return r;
			}
		}
	}
	/* Every product first (x read whole), then the halves written: out
	 * may be x itself. */
	if ((r = like(l, x1, &a)) < 0 || (r = pw(l, RP_PW_MUL, x1, c, a)) < 0 || (r = like(l, x1, &bb)) < 0 ||
	    (r = pw(l, RP_PW_MUL, x2, s, bb)) < 0 || (r = like(l, x1, &d)) < 0 || (r = pw(l, RP_PW_MUL, x2, c, d)) < 0 ||
	    (r = like(l, x1, &e)) < 0 || (r = pw(l, RP_PW_MUL, x1, s, e)) < 0) {
		return r;
	}
	if (!backward) {
		return (r = pw(l, RP_PW_SUB, a, bb, o1)) < 0 ? r : pw(l, RP_PW_ADD, d, e, o2);
	}
	return (r = pw(l, RP_PW_ADD, a, bb, o1)) < 0 ? r : pw(l, RP_PW_SUB, d, e, o2);
}

/* ---- Optimizers ------------------------------------------------------------------------------ */

static bool hp_same(const struct rp_prog_hp *x, const struct rp_prog_hp *y)
{
	return x->is_tensor == y->is_tensor && (x->is_tensor ? x->tensor == y->tensor : x->value == y->value);
}

static struct rp_prog_hp number(double v)
{
	return (struct rp_prog_hp){ .is_tensor = false, .tensor = -1, .value = v };
}

/* A hyperparameter: a number, or the name of a rank-0 float tensor (a
 * scalar bound per Run). Numbers must lie in [lo, hi]. */
static int read_hp(struct lower *l, const cJSON *attrs, const char *name, bool required, double def, double lo,
		   double hi, struct rp_prog_hp *hp)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(attrs, name);

	if (item == NULL || cJSON_IsNull(item)) {
		if (required) {
			return rp_prog_param_error(l->b, "%s.%s", l->path, name);
		}
		*hp = number(def);
		return 0;
	}
	if (cJSON_IsString(item)) {
		int t = rp_prog_tensor_find(l->b, item->valuestring);

		if (t < 0 || T(l, t)->rank != 0 || !rp_dtype_is_float(T(l, t)->dtype)) {
			return rp_prog_source_error(l->b,
						    "attrs.%s names '%.*s', which is not a rank-0 float tensor (a scalar "
						    "declared in tensors)",
						    name, RP_PROG_NAME_MAX, item->valuestring);
		}
		*hp = (struct rp_prog_hp){ .is_tensor = true, .tensor = t };
		return 0;
	}
	if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble) || item->valuedouble < lo || item->valuedouble > hi) {
		return rp_prog_param_error(l->b, "%s.%s", l->path, name);
	}
	*hp = number(item->valuedouble);
	return 0;
}

/* A rank-0 f64 result of fn(x, y): folded when both are numbers. */
static int hp_op(struct lower *l, enum rp_pointwise fn, struct rp_prog_hp x, struct rp_prog_hp y,
		 struct rp_prog_hp *out)
{
	int t, r;

	if (!x.is_tensor && !y.is_tensor) {
		switch (fn) {
		case RP_PW_ADD: *out = number(x.value + y.value); return 0;
		case RP_PW_SUB: *out = number(x.value - y.value); return 0;
		case RP_PW_MUL: *out = number(x.value * y.value); return 0;
		case RP_PW_DIV: *out = number(x.value / y.value); return 0;
		case RP_PW_POW: *out = number(pow(x.value, y.value)); return 0;
		case RP_PW_SQRT: *out = number(sqrt(x.value)); return 0;
		default: return -EINVAL;
		}
	}
	static const int64_t scalar_shape[1] = { 1 };   /* rank 0: not read */

	if ((t = rp_prog_gen_tensor(l->b, RP_DTYPE_F64, 0, scalar_shape)) < 0) {
		return t;
	}
	if (fn == RP_PW_SQRT) {
		r = pw(l, fn, x.tensor, -1, t);
	} else if (x.is_tensor && y.is_tensor) {
		r = pw(l, fn, x.tensor, y.tensor, t);
	} else if (x.is_tensor) {
		r = pw_scalar(l, fn, x.tensor, y.value, false, t);
	} else {
		r = pw_scalar(l, fn, y.tensor, x.value, true, t);
	}
	*out = (struct rp_prog_hp){ .is_tensor = true, .tensor = t };
	return r < 0 ? r : 0;
}

/* out = fn(a, hp) for a tensor a. */
static int pw_hp(struct lower *l, enum rp_pointwise fn, int a, struct rp_prog_hp h, int out)
{
	return h.is_tensor ? pw(l, fn, a, h.tensor, out) : pw_scalar(l, fn, a, h.value, false, out);
}

/* What an optimizer updates: floats shaped like the parameter, writable. */
static int need_state(struct lower *l, int t, const char *role, int param, bool updated)
{
	const struct rp_prog_tensor *root;
	int r = need_like(l, t, role, param, "param");

	if (r < 0 || !updated) {
		return r;
	}
	root = T(l, T(l, t)->root);
	if (root->kind == RP_PT_INPUT || root->kind == RP_PT_SCALAR) {
		return rp_prog_source_error(l->b, "%s updates its %s %s in place, but %s is %s; declare it inout",
					    l->node->op->name, role, T(l, t)->name, root->name,
					    root->kind == RP_PT_INPUT ? "an input" : "a scalar");
	}
	return 0;
}

/* AdamW's per-step scalars, from lr, betas, weight decay and step:
 * step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step),
 * decay = 1 - lr * weight_decay. Shared with the previous adamw node
 * when its hyperparameters are the same. */
static int adamw_scalars(struct lower *l, struct rp_prog_hp lr, struct rp_prog_hp b1, struct rp_prog_hp b2,
			 struct rp_prog_hp wd, struct rp_prog_hp step)
{
	struct rp_prog_adamw_scalars *c = &l->b->adamw;
	struct rp_prog_hp p1, p2, bc1, bc2, lw;
	int r;

	if (c->valid && hp_same(&c->lr, &lr) && hp_same(&c->beta1, &b1) && hp_same(&c->beta2, &b2) &&
	    hp_same(&c->weight_decay, &wd) && hp_same(&c->step, &step)) {
		return 0;
	}
	c->valid = false;
	if ((r = hp_op(l, RP_PW_POW, b1, step, &p1)) < 0 || (r = hp_op(l, RP_PW_SUB, number(1), p1, &bc1)) < 0 ||
	    (r = hp_op(l, RP_PW_DIV, lr, bc1, &c->step_size)) < 0 || (r = hp_op(l, RP_PW_POW, b2, step, &p2)) < 0 ||
	    (r = hp_op(l, RP_PW_SUB, number(1), p2, &bc2)) < 0 ||
	    (r = hp_op(l, RP_PW_SQRT, bc2, number(0), &c->bc2_sqrt)) < 0 || (r = hp_op(l, RP_PW_MUL, lr, wd, &lw)) < 0 ||
	    (r = hp_op(l, RP_PW_SUB, number(1), lw, &c->decay)) < 0) {
		return r;
	}
	c->lr = lr;
	c->beta1 = b1;
	c->beta2 = b2;
	c->weight_decay = wd;
	c->step = step;
	c->valid = true;
	return 0;
}

/* adamw (param, grad, exp_avg, exp_avg_sq), torch.optim.AdamW's step with
 * the step count t already advanced:
 *   param *= 1 - lr wd; m = m + (1 - b1)(g - m); v = b2 v + (1 - b2) g^2;
 *   param -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 * New values go to intermediates, then casts assign them to the state, so
 * that a fuser can make the update one kernel that reads each old value
 * before it writes the new one. */
static int lower_adamw(struct lower *l, const cJSON *attrs)
{
	static const char *const names[] = { "lr", "beta1", "beta2", "eps", "weight_decay", "step", NULL };
	const int p = l->node->in[0], g = l->node->in[1], m = l->node->in[2], v = l->node->in[3];
	struct rp_prog_hp lr, b1, b2, eps, wd, step, om1, om2;
	int r, d, e, m1, a, gg, c, v1, q, rr, den, u, s, pd, p1;

	if ((r = check_attr_names(l, attrs, names)) < 0 || (r = read_hp(l, attrs, "lr", false, 1e-3, 0, INFINITY, &lr)) < 0 ||
	    (r = read_hp(l, attrs, "beta1", false, 0.9, 0, 0x1.fffffffffffffp-1, &b1)) < 0 ||
	    (r = read_hp(l, attrs, "beta2", false, 0.999, 0, 0x1.fffffffffffffp-1, &b2)) < 0 ||
	    (r = read_hp(l, attrs, "eps", false, 1e-8, 0x1p-1074, INFINITY, &eps)) < 0 ||
	    (r = read_hp(l, attrs, "weight_decay", false, 1e-2, 0, INFINITY, &wd)) < 0 ||
	    (r = read_hp(l, attrs, "step", true, 0, 0, 0, &step)) < 0) {
		return r;
	}
	if (!step.is_tensor) {
		return rp_prog_param_error(l->b, "%s.step", l->path);
	}
	if ((r = need_state(l, p, "param", p, true)) < 0 || (r = need_state(l, g, "grad", p, false)) < 0 ||
	    (r = need_state(l, m, "exp_avg", p, true)) < 0 || (r = need_state(l, v, "exp_avg_sq", p, true)) < 0) {
		return r;
	}
	l->acc = acc_of(l, (int[]){ p }, 1);
	if ((r = adamw_scalars(l, lr, b1, b2, wd, step)) < 0 || (r = hp_op(l, RP_PW_SUB, number(1), b1, &om1)) < 0 ||
	    (r = hp_op(l, RP_PW_SUB, number(1), b2, &om2)) < 0) {
		return r;
	}
	const struct rp_prog_hp ss = l->b->adamw.step_size, sb2 = l->b->adamw.bc2_sqrt, decay = l->b->adamw.decay;
	if ((r = like(l, p, &d)) < 0 || (r = pw(l, RP_PW_SUB, g, m, d)) < 0 || (r = like(l, p, &e)) < 0 ||
	    (r = pw_hp(l, RP_PW_MUL, d, om1, e)) < 0 || (r = like(l, p, &m1)) < 0 || (r = pw(l, RP_PW_ADD, m, e, m1)) < 0 ||
	    (r = like(l, p, &a)) < 0 || (r = pw_hp(l, RP_PW_MUL, v, b2, a)) < 0 || (r = like(l, p, &gg)) < 0 ||
	    (r = pw(l, RP_PW_MUL, g, g, gg)) < 0 || (r = like(l, p, &c)) < 0 || (r = pw_hp(l, RP_PW_MUL, gg, om2, c)) < 0 ||
	    (r = like(l, p, &v1)) < 0 || (r = pw(l, RP_PW_ADD, a, c, v1)) < 0 || (r = like(l, p, &q)) < 0 ||
	    (r = pw(l, RP_PW_SQRT, v1, -1, q)) < 0 || (r = like(l, p, &rr)) < 0 || (r = pw_hp(l, RP_PW_DIV, q, sb2, rr)) < 0 ||
	    (r = like(l, p, &den)) < 0 || (r = pw_hp(l, RP_PW_ADD, rr, eps, den)) < 0 || (r = like(l, p, &u)) < 0 ||
	    (r = pw(l, RP_PW_DIV, m1, den, u)) < 0 || (r = like(l, p, &s)) < 0 || (r = pw_hp(l, RP_PW_MUL, u, ss, s)) < 0) {
		return r;
	}
	pd = p;
	if ((decay.is_tensor || decay.value != 1.0) &&
	    ((r = like(l, p, &pd)) < 0 || (r = pw_hp(l, RP_PW_MUL, p, decay, pd)) < 0)) {
		return r;
	}
	if ((r = like(l, p, &p1)) < 0 || (r = pw(l, RP_PW_SUB, pd, s, p1)) < 0 || (r = pw(l, RP_PW_CAST, p1, -1, p)) < 0 ||
	    (r = pw(l, RP_PW_CAST, m1, -1, m)) < 0) {
		return r;
	}
	return pw(l, RP_PW_CAST, v1, -1, v);
}

/* sgd (param, grad, momentum_buffer?), torch.optim.SGD's step:
 *   g = grad + weight_decay param; buf = momentum buf + (1 - dampening) g;
 *   g = nesterov ? g + momentum buf : buf; param -= lr g.
 * The buffer is the client's (zeros before the first step: with dampening
 * 0 that is torch's first step too). With no buffer, momentum must be 0. */
static int lower_sgd(struct lower *l, const cJSON *attrs)
{
	static const char *const names[] = { "lr", "momentum", "dampening", "weight_decay", "nesterov", NULL };
	const int p = l->node->in[0], g = l->node->in[1], buf = l->node->in[2];
	struct rp_prog_hp lr, mom, damp, wd, keep;
	bool nesterov;
	int r, t, g1, b1, t2, b2, t3, g2, s, p1;

	if ((r = check_attr_names(l, attrs, names)) < 0 || (r = read_hp(l, attrs, "lr", true, 0, 0, INFINITY, &lr)) < 0 ||
	    (r = read_hp(l, attrs, "momentum", false, 0, 0, INFINITY, &mom)) < 0 ||
	    (r = read_hp(l, attrs, "dampening", false, 0, 0, 1, &damp)) < 0 ||
	    (r = read_hp(l, attrs, "weight_decay", false, 0, 0, INFINITY, &wd)) < 0) {
		return r;
	}
	if (rp_params_bool(attrs, "nesterov", false, &nesterov, l->b->err) < 0) {
		return rp_prog_param_error(l->b, "%s.nesterov", l->path);
	}
	if ((r = need_state(l, p, "param", p, true)) < 0 || (r = need_state(l, g, "grad", p, false)) < 0 ||
	    (buf >= 0 && (r = need_state(l, buf, "momentum_buffer", p, true)) < 0)) {
		return r;
	}
	const bool uses_momentum = mom.is_tensor || mom.value != 0;
	if (uses_momentum != (buf >= 0)) {
		return rp_prog_source_error(l->b, buf >= 0 ? "a momentum_buffer is given but momentum is 0; leave one out"
							   : "momentum is set but no momentum_buffer (inputs[2], inout) is given");
	}
	if (nesterov && (!uses_momentum || damp.is_tensor || damp.value != 0)) {
		return rp_prog_source_error(l->b, "nesterov needs momentum and dampening 0");
	}
	l->acc = acc_of(l, (int[]){ p }, 1);
	g1 = g;
	if ((wd.is_tensor || wd.value != 0) &&
	    ((r = like(l, p, &t)) < 0 || (r = pw_hp(l, RP_PW_MUL, p, wd, t)) < 0 || (r = like(l, p, &g1)) < 0 ||
	     (r = pw(l, RP_PW_ADD, g, t, g1)) < 0)) {
		return r;
	}
	g2 = g1;
	b2 = -1;
	if (uses_momentum) {
		if ((r = hp_op(l, RP_PW_SUB, number(1), damp, &keep)) < 0 || (r = like(l, p, &b1)) < 0 ||
		    (r = pw_hp(l, RP_PW_MUL, buf, mom, b1)) < 0) {
			return r;
		}
		t2 = g1;
		if ((keep.is_tensor || keep.value != 1.0) &&
		    ((r = like(l, p, &t2)) < 0 || (r = pw_hp(l, RP_PW_MUL, g1, keep, t2)) < 0)) {
			return r;
		}
		if ((r = like(l, p, &b2)) < 0 || (r = pw(l, RP_PW_ADD, b1, t2, b2)) < 0) {
			return r;
		}
		g2 = b2;
		if (nesterov && ((r = like(l, p, &t3)) < 0 || (r = pw_hp(l, RP_PW_MUL, b2, mom, t3)) < 0 ||
				 (r = like(l, p, &g2)) < 0 || (r = pw(l, RP_PW_ADD, g1, t3, g2)) < 0)) {
			return r;
		}
	}
	if ((r = like(l, p, &s)) < 0 || (r = pw_hp(l, RP_PW_MUL, g2, lr, s)) < 0 || (r = like(l, p, &p1)) < 0 ||
	    (r = pw(l, RP_PW_SUB, p, s, p1)) < 0 || (r = pw(l, RP_PW_CAST, p1, -1, p)) < 0) {
		return r;
	}
	return b2 >= 0 ? pw(l, RP_PW_CAST, b2, -1, buf) : 0;
}

/* ---- The table ----------------------------------------------------------------------------- */

bool rp_prog_optional(const struct rp_prog_op *op, bool output, int k)
{
	switch ((enum rp_composite)op->fn) {
	case RP_CO_RMS_NORM:
		return k == 1;                    /* weight; rstd */
	case RP_CO_RMS_NORM_BACKWARD:
		return output ? k == 1 : k == 2;  /* dweight; weight */
	case RP_CO_CROSS_ENTROPY:
		return output && k == 1;          /* lse */
	case RP_CO_SGD:
		return !output && k == 2;         /* momentum_buffer */
	default:
		return false;
	}
}

static const cJSON no_attrs = { .type = cJSON_Object };

int rp_prog_lower(struct rp_prog_builder *b, const struct rp_prog_node *node, const cJSON *attrs, const char *path)
{
	struct lower l = { .b = b, .node = node, .path = path, .acc = RP_DTYPE_F32 };
	int r;

	if (attrs == NULL) {
		attrs = &no_attrs;
	}
	switch ((enum rp_composite)node->op->fn) {
	case RP_CO_RMS_NORM: {
		static const struct rp_field fields[] = { { "eps", RP_T_FLOAT, false }, { NULL, 0, false } };

		if (rp_params_check(attrs, fields, b->err) < 0) {
			return rp_prog_param_under(b, path);
		}
		r = lower_rms_norm(&l, attrs);
		break;
	}
	case RP_CO_RMS_NORM_BACKWARD:
		r = lower_rms_norm_backward(&l, attrs);
		break;
	case RP_CO_SOFTMAX:
		r = lower_softmax(&l, attrs, false);
		break;
	case RP_CO_LOG_SOFTMAX:
		r = lower_softmax(&l, attrs, true);
		break;
	case RP_CO_SOFTMAX_BACKWARD:
		r = lower_softmax_backward(&l, attrs, false);
		break;
	case RP_CO_LOG_SOFTMAX_BACKWARD:
		r = lower_softmax_backward(&l, attrs, true);
		break;
	case RP_CO_CROSS_ENTROPY:
		r = lower_cross_entropy(&l, attrs);
		break;
	case RP_CO_CROSS_ENTROPY_BACKWARD:
		r = lower_cross_entropy_backward(&l, attrs);
		break;
	case RP_CO_ROTARY:
		r = lower_rotary(&l, attrs, false);
		break;
	case RP_CO_ROTARY_BACKWARD:
		r = lower_rotary(&l, attrs, true);
		break;
	case RP_CO_ADAMW:
		r = lower_adamw(&l, attrs);
		break;
	case RP_CO_SGD:
		r = lower_sgd(&l, attrs);
		break;
	default:
		r = rp_prog_source_error(b, "%s has no lowering", node->op->name);
	}
	return r < 0 ? r : 0;
}
