/* SPDX-License-Identifier: Apache-2.0 */
/* The ops a program may name, and each primitive's own rules: how many
 * operands, which dtypes, which shapes, which attrs (proto/program.h).
 * Compute ops are io.regen.Compute's, checked by its tables
 * (proto/compute.h); composites are lowered by program_lower.c. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "params.h"
#include "program_build.h"

/* Pointwise: inputs counted without the scalar; in place. */
#define PW(n, fn, lo, hi) { n, RP_PC_POINTWISE, fn, lo, hi, 1, 1, true }
#define RED(n, fn) { n, RP_PC_REDUCTION, fn, 1, 1, 1, 1, false }
#define GATHER(n, fn) { n, RP_PC_GATHER, fn, 2, 2, 1, 1, false }
#define COMPOSITE(n, fn, lo, hi, olo, ohi) { n, RP_PC_COMPOSITE, fn, lo, hi, olo, ohi, false }
/* A pointwise op that makes a tensor from a seed (no element of its input
 * is read at the output's index): errors about its count name it. */
#define SEEDED(n, fn, usage) { n, RP_PC_POINTWISE, fn, 1, 1, 1, 1, true, usage }

static const struct rp_prog_op ops[] = {
	PW("add", RP_PW_ADD, 1, 2), PW("sub", RP_PW_SUB, 1, 2), PW("mul", RP_PW_MUL, 1, 2),
	PW("div", RP_PW_DIV, 1, 2), PW("pow", RP_PW_POW, 1, 2), PW("maximum", RP_PW_MAXIMUM, 1, 2),
	PW("minimum", RP_PW_MINIMUM, 1, 2), PW("eq", RP_PW_EQ, 1, 2), PW("ne", RP_PW_NE, 1, 2),
	PW("lt", RP_PW_LT, 1, 2), PW("le", RP_PW_LE, 1, 2), PW("gt", RP_PW_GT, 1, 2), PW("ge", RP_PW_GE, 1, 2),
	PW("neg", RP_PW_NEG, 1, 1), PW("exp", RP_PW_EXP, 1, 1), PW("log", RP_PW_LOG, 1, 1),
	PW("tanh", RP_PW_TANH, 1, 1), PW("erf", RP_PW_ERF, 1, 1), PW("sigmoid", RP_PW_SIGMOID, 1, 1),
	PW("silu", RP_PW_SILU, 1, 1), PW("gelu", RP_PW_GELU, 1, 1), PW("gelu_tanh", RP_PW_GELU_TANH, 1, 1),
	PW("relu", RP_PW_RELU, 1, 1), PW("sqrt", RP_PW_SQRT, 1, 1), PW("rsqrt", RP_PW_RSQRT, 1, 1),
	PW("abs", RP_PW_ABS, 1, 1), PW("reciprocal", RP_PW_RECIPROCAL, 1, 1), PW("square", RP_PW_SQUARE, 1, 1),
	PW("cast", RP_PW_CAST, 1, 1),
	PW("gelu_backward", RP_PW_GELU_BACKWARD, 2, 2), PW("gelu_tanh_backward", RP_PW_GELU_TANH_BACKWARD, 2, 2),
	PW("silu_backward", RP_PW_SILU_BACKWARD, 2, 2), PW("sigmoid_backward", RP_PW_SIGMOID_BACKWARD, 2, 2),
	PW("tanh_backward", RP_PW_TANH_BACKWARD, 2, 2), PW("relu_backward", RP_PW_RELU_BACKWARD, 2, 2),
	PW("where", RP_PW_WHERE, 2, 3),
	PW("fill", RP_PW_FILL, 0, 0), PW("iota", RP_PW_IOTA, 0, 0),
	SEEDED("dropout_mask", RP_PW_DROPOUT_MASK, "[seed] -> [mask], seed a scalar tensor (an integer given at Run)"),

	RED("sum", RP_RED_SUM), RED("mean", RP_RED_MEAN), RED("max", RP_RED_MAX), RED("min", RP_RED_MIN),
	RED("amax", RP_RED_AMAX), RED("logsumexp", RP_RED_LOGSUMEXP),

	GATHER("embedding", RP_GATHER_EMBEDDING),
	GATHER("embedding_backward", RP_GATHER_EMBEDDING_BACKWARD),

	COMPOSITE("rms_norm", RP_CO_RMS_NORM, 1, 2, 1, 2),
	COMPOSITE("rms_norm_backward", RP_CO_RMS_NORM_BACKWARD, 4, 4, 1, 2),
	COMPOSITE("softmax", RP_CO_SOFTMAX, 1, 1, 1, 1),
	COMPOSITE("softmax_backward", RP_CO_SOFTMAX_BACKWARD, 2, 2, 1, 1),
	COMPOSITE("log_softmax", RP_CO_LOG_SOFTMAX, 1, 1, 1, 1),
	COMPOSITE("log_softmax_backward", RP_CO_LOG_SOFTMAX_BACKWARD, 2, 2, 1, 1),
	COMPOSITE("cross_entropy", RP_CO_CROSS_ENTROPY, 2, 2, 1, 2),
	COMPOSITE("cross_entropy_backward", RP_CO_CROSS_ENTROPY_BACKWARD, 4, 4, 1, 1),
	COMPOSITE("rotary", RP_CO_ROTARY, 3, 3, 1, 1),
	COMPOSITE("rotary_backward", RP_CO_ROTARY_BACKWARD, 3, 3, 1, 1),
	COMPOSITE("adamw", RP_CO_ADAMW, 4, 4, 0, 0),
	COMPOSITE("sgd", RP_CO_SGD, 2, 3, 0, 0),
};

/* Every io.regen.Compute op is a program op of its name: made from the
 * compute table (proto/compute.h) at first use, not listed again here. */
static struct rp_prog_op compute_ops[RP_OP_COUNT];
static pthread_once_t compute_ops_once = PTHREAD_ONCE_INIT;

static void compute_ops_make(void)
{
	for (int id = 0; id < RP_OP_COUNT; id++) {
		compute_ops[id] = (struct rp_prog_op){ rp_op_get((enum rp_op_id)id)->name, RP_PC_COMPUTE, id, 0, 0, 0, 0,
						       false };
	}
}

const struct rp_prog_op *rp_prog_op_of(enum rp_prog_class cls, int fn)
{
	if (cls == RP_PC_COMPUTE) {
		pthread_once(&compute_ops_once, compute_ops_make);
		return fn >= 0 && fn < RP_OP_COUNT ? &compute_ops[fn] : NULL;
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		if (ops[i].cls == cls && ops[i].fn == fn) {
			return &ops[i];
		}
	}
	return NULL;
}

const struct rp_prog_op *rp_prog_op_find(const char *name)
{
	if (!name) {
		return NULL;
	}
	pthread_once(&compute_ops_once, compute_ops_make);
	for (int id = 0; id < RP_OP_COUNT; id++) {
		if (strcmp(compute_ops[id].name, name) == 0) {
			return &compute_ops[id];
		}
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		if (strcmp(ops[i].name, name) == 0) {
			return &ops[i];
		}
	}
	return NULL;
}

/* ---- Pointwise ---------------------------------------------------------------------- */

enum pw_dtypes {
	PW_FLOATS,     /* floats in, floats out */
	PW_COMPARE,    /* any in, any out (1 or 0) */
	PW_ANY,        /* cast: any to any */
	PW_SELECT,     /* where: cond any; a, b, out all floats or all integers */
	PW_MAKE,       /* fill, iota, dropout_mask: any out */
};

static int pw_arity(enum rp_pointwise fn)
{
	if (fn <= RP_PW_GE || (fn >= RP_PW_GELU_BACKWARD && fn <= RP_PW_RELU_BACKWARD)) {
		return 2;
	}
	if (fn == RP_PW_WHERE) {
		return 3;
	}
	if (fn == RP_PW_FILL || fn == RP_PW_IOTA) {
		return 0;
	}
	return 1;   /* unary ops, and dropout_mask's seed */
}

static enum pw_dtypes pw_dtypes(enum rp_pointwise fn)
{
	if (fn >= RP_PW_EQ && fn <= RP_PW_GE) {
		return PW_COMPARE;
	}
	switch (fn) {
	case RP_PW_CAST:
		return PW_ANY;
	case RP_PW_WHERE:
		return PW_SELECT;
	case RP_PW_FILL:
	case RP_PW_IOTA:
	case RP_PW_DROPOUT_MASK:
		return PW_MAKE;
	default:
		return PW_FLOATS;
	}
}

/* Binary ops and where may take the constant scalar for one operand. */
static bool pw_takes_scalar(enum rp_pointwise fn)
{
	return pw_arity(fn) >= 2 && !(fn >= RP_PW_GELU_BACKWARD && fn <= RP_PW_RELU_BACKWARD);
}

/* A pointwise op's constant may be infinite or NaN ("-inf" for a mask). */
static const struct rp_field pw_scalar_fields[] = {
	{ "scalar", RP_T_REAL, false },
	{ "scalar_first", RP_T_BOOL, false },
	{ NULL, 0, false },
};
static const struct rp_field fill_fields[] = {
	{ "scalar", RP_T_REAL, true },
	{ NULL, 0, false },
};
static const struct rp_field iota_fields[] = {
	{ "axis", RP_T_INT, false },
	{ NULL, 0, false },
};
static const struct rp_field dropout_fields[] = {
	{ "p", RP_T_FLOAT, true },
	{ "stream", RP_T_INT, false },
	{ NULL, 0, false },
};
static const struct rp_field reduction_fields[] = {
	{ "axis", RP_T_STRING, false },
	{ NULL, 0, false },
};
static const struct rp_field no_fields[] = {
	{ NULL, 0, false },
};
static const char *const axis_names[] = { "last", "leading", NULL };

/* A node without attrs reads them from this empty object. */
static const cJSON no_attrs = { .type = cJSON_Object };

static const struct rp_field *attr_fields(const struct rp_prog_node *n)
{
	switch (n->op->cls) {
	case RP_PC_COMPUTE:
		return n->compute.spec->scalars;
	case RP_PC_POINTWISE:
		if (n->op->fn == RP_PW_FILL) {
			return fill_fields;
		}
		if (n->op->fn == RP_PW_IOTA) {
			return iota_fields;
		}
		if (n->op->fn == RP_PW_DROPOUT_MASK) {
			return dropout_fields;
		}
		return pw_takes_scalar((enum rp_pointwise)n->op->fn) ? pw_scalar_fields : no_fields;
	case RP_PC_REDUCTION:
		return reduction_fields;
	default:
		return no_fields;
	}
}

/* p in [0, 1): 1 would drop everything (and scale by 1 / (1 - p) = inf).
 * stream below 2^32, the counter's third word. */
static int read_dropout(struct rp_prog_node *n, const cJSON *attrs, struct rp_error *err)
{
	uint64_t stream;

	if (rp_params_double(attrs, "p", 0, &n->pw.p, err) < 0 || !(n->pw.p >= 0 && n->pw.p < 1)) {
		return rp_error_invalid_parameter(err, "p");
	}
	if (rp_params_uint(attrs, "stream", UINT32_MAX, 0, &stream, err) < 0) {
		return -EINVAL;
	}
	n->pw.stream = (uint32_t)stream;
	return 0;
}

int rp_prog_read_attrs(struct rp_prog_builder *b, struct rp_prog_node *n, const cJSON *attrs, const char *path)
{
	uint64_t axis;
	int r, e;

	if (attrs == NULL) {
		attrs = &no_attrs;
	}
	if (rp_params_check(attrs, attr_fields(n), b->err) < 0) {
		return rp_prog_param_under(b, path);
	}
	switch (n->op->cls) {
	case RP_PC_COMPUTE:
		r = n->compute.spec->read_scalars(attrs, &n->compute, b->err);
		break;
	case RP_PC_POINTWISE:
		n->pw.fn = (enum rp_pointwise)n->op->fn;
		r = rp_params_real(attrs, "scalar", 0.0, &n->pw.scalar, b->err);
		n->pw.has_scalar = r == 0;
		if (r >= 0) {
			r = rp_params_bool(attrs, "scalar_first", false, &n->pw.scalar_first, b->err);
		}
		if (r >= 0) {
			/* Absent: the last dimension, resolved by the check
			 * (iota's only; 0 for the others). */
			r = rp_params_uint(attrs, "axis", RP_PROG_RANK_MAX - 1, RP_PROG_RANK_MAX, &axis, b->err);
			n->pw.axis = n->pw.fn == RP_PW_IOTA ? (int)axis : 0;
		}
		if (r >= 0 && n->pw.fn == RP_PW_DROPOUT_MASK) {
			r = read_dropout(n, attrs, b->err);
		}
		break;
	case RP_PC_REDUCTION:
		n->red.fn = (enum rp_reduction)n->op->fn;
		r = rp_params_enum(attrs, "axis", axis_names, RP_AXIS_LAST, &e, b->err);
		n->red.axis = (enum rp_reduce_axis)e;
		break;
	case RP_PC_GATHER:
		n->gather.fn = (enum rp_gather)n->op->fn;
		r = 0;
		break;
	default:
		r = -EINVAL;
	}
	return r < 0 ? rp_prog_param_under(b, path) : 0;
}

static bool is_integer(enum rp_dtype dt)
{
	return !rp_dtype_is_float(dt);
}

/* The input broadcasts to the output's shape, NumPy's way: right-aligned,
 * each of its dims the output's or 1, no more dims than the output. */
static int check_broadcast(struct rp_prog_builder *b, int n, const struct rp_prog_tensor *in,
			   const struct rp_prog_tensor *out)
{
	char si[96], so[96];
	bool fits = in->rank <= out->rank;

	for (int i = 1; fits && i <= in->rank; i++) {
		int64_t d = in->shape[in->rank - i];

		fits = d == 1 || d == out->shape[out->rank - i];
	}
	if (!fits) {
		return rp_prog_node_error(b, n,
					  "its input %s is %s, which does not broadcast to its output %s's %s (aligned "
					  "from the right, each dim must be the output's or 1)",
					  in->name, rp_prog_shape(in, si), out->name, rp_prog_shape(out, so));
	}
	return 0;
}

static const char *dtype_of(const struct rp_prog_tensor *t)
{
	return rp_dtype_name(t->dtype);
}

/* dropout_mask's input is its seed: a scalar tensor itself (a view of one
 * would be read as a tensor), which a Run must then give as an integer. */
static int check_seed(struct rp_prog_builder *b, int n)
{
	struct rp_prog_tensor *seed = rp_prog_t(b, b->p->nodes[n].in[0]);

	if (seed->kind != RP_PT_SCALAR) {
		return rp_prog_node_error(b, n,
					  "its seed %s is a tensor of kind %s, but must be one of kind scalar (an "
					  "integer in [0, 2^53) given at each Run)",
					  seed->name, rp_prog_kind_name(seed->kind));
	}
	seed->seed = true;
	return 0;
}

static int check_pointwise(struct rp_prog_builder *b, int n)
{
	const struct rp_prog_node *node = &b->p->nodes[n];
	const enum rp_pointwise fn = node->pw.fn;
	/* fill's scalar is its value, not an operand. */
	const int arity = pw_arity(fn), want = arity - (node->pw.has_scalar && pw_takes_scalar(fn) ? 1 : 0);
	const struct rp_prog_tensor *out = rp_prog_t(b, node->out[0]);
	int r;

	if (node->nin != want) {
		return rp_prog_node_error(b, n, "%s takes %d tensor input%s%s, not %d", node->op->name, want,
					  want == 1 ? "" : "s", node->pw.has_scalar ? " besides its scalar" : "", node->nin);
	}
	if (node->pw.scalar_first && !node->pw.has_scalar) {
		return rp_prog_node_error(b, n, "scalar_first is set but no scalar is given");
	}
	if (fn == RP_PW_DROPOUT_MASK && (r = check_seed(b, n)) < 0) {
		return r;
	}
	for (int i = 0; i < node->nin; i++) {
		if ((r = check_broadcast(b, n, rp_prog_t(b, node->in[i]), out)) < 0) {
			return r;
		}
	}
	switch (pw_dtypes(fn)) {
	case PW_FLOATS:
		for (int i = 0; i < node->nin; i++) {
			if (is_integer(rp_prog_t(b, node->in[i])->dtype)) {
				return rp_prog_node_error(b, n, "%s computes on floats but its input %s is %s; cast it first",
							  node->op->name, rp_prog_t(b, node->in[i])->name,
							  dtype_of(rp_prog_t(b, node->in[i])));
			}
		}
		if (is_integer(out->dtype)) {
			return rp_prog_node_error(b, n, "%s computes on floats but its output %s is %s; cast the result",
						  node->op->name, out->name, dtype_of(out));
		}
		break;
	case PW_SELECT: {
		/* cond is always in[0]; the scalar, if any, stands for a or b. */
		bool ints = is_integer(out->dtype);

		for (int i = 1; i < node->nin; i++) {
			const struct rp_prog_tensor *v = rp_prog_t(b, node->in[i]);

			if (is_integer(v->dtype) != ints) {
				return rp_prog_node_error(b, n,
							  "where's values and output are all floats or all integers, but "
							  "%s is %s and %s is %s",
							  v->name, dtype_of(v), out->name, dtype_of(out));
			}
		}
		break;
	}
	case PW_MAKE:
		if (fn == RP_PW_IOTA) {
			int axis = node->pw.axis == RP_PROG_RANK_MAX ? out->rank - 1 : node->pw.axis;

			if (out->rank == 0 || axis >= out->rank) {
				return rp_prog_node_error(b, n, "iota counts along axis %d but its output %s has rank %d",
							  axis, out->name, out->rank);
			}
			b->p->nodes[n].pw.axis = axis;
		}
		if (fn == RP_PW_FILL && is_integer(out->dtype) &&
		    (node->pw.scalar != trunc(node->pw.scalar) ||
		     (out->dtype == RP_DTYPE_U8 && (node->pw.scalar < 0 || node->pw.scalar > 255)) ||
		     (out->dtype == RP_DTYPE_I32 && fabs(node->pw.scalar) > 2147483647.0) ||
		     fabs(node->pw.scalar) > 9007199254740992.0)) {
			return rp_prog_node_error(b, n, "fills %s (%s) with %g, which %s does not hold", out->name,
						  dtype_of(out), node->pw.scalar, dtype_of(out));
		}
		break;
	case PW_COMPARE:
	case PW_ANY:
		break;
	}
	return 0;
}

/* ---- Reductions and gathers ------------------------------------------------------------ */

static bool dims_are(const struct rp_prog_tensor *t, int rank, const int64_t *dims)
{
	if (t->rank != rank) {
		return false;
	}
	for (int i = 0; i < rank; i++) {
		if (t->shape[i] != dims[i]) {
			return false;
		}
	}
	return true;
}

static int check_reduction(struct rp_prog_builder *b, int n)
{
	const struct rp_prog_node *node = &b->p->nodes[n];
	const struct rp_prog_tensor *in = rp_prog_t(b, node->in[0]), *out = rp_prog_t(b, node->out[0]);
	int64_t without[RP_PROG_RANK_MAX], with[RP_PROG_RANK_MAX];
	int r = in->rank;
	char si[96], so[96];
	bool fits;

	if (r == 0) {
		return rp_prog_node_error(b, n, "its input %s has rank 0: there is nothing to reduce", in->name);
	}
	if (is_integer(in->dtype) || is_integer(out->dtype)) {
		return rp_prog_node_error(b, n, "%s reduces floats, but %s is %s", node->op->name,
					  is_integer(in->dtype) ? in->name : out->name,
					  dtype_of(is_integer(in->dtype) ? in : out));
	}
	if (node->red.fn == RP_RED_LOGSUMEXP && node->red.axis != RP_AXIS_LAST) {
		return rp_prog_node_error(b, n, "logsumexp reduces the last dimension only, not every dimension but the last");
	}
	if (node->red.axis == RP_AXIS_LAST) {
		/* [.., n] -> [..] or [.., 1] */
		memcpy(without, in->shape, sizeof(*without) * (size_t)(r - 1));
		memcpy(with, in->shape, sizeof(*with) * (size_t)r);
		with[r - 1] = 1;
		fits = dims_are(out, r - 1, without) || dims_are(out, r, with);
	} else {
		/* [.., n] -> [n] or [1, .., 1, n] */
		for (int i = 0; i < r; i++) {
			with[i] = i == r - 1 ? in->shape[i] : 1;
		}
		fits = dims_are(out, 1, &in->shape[r - 1]) || dims_are(out, r, with);
	}
	if (!fits) {
		return rp_prog_node_error(b, n,
					  "reducing %s %s over %s gives %s but its output %s is %s",
					  in->name, rp_prog_shape(in, si),
					  node->red.axis == RP_AXIS_LAST ? "the last dimension" : "every dimension but the last",
					  node->red.axis == RP_AXIS_LAST ? "its shape without the last dim (or with it as 1)"
									 : "[last] (or 1s and the last)",
					  out->name, rp_prog_shape(out, so));
	}
	return 0;
}

/* rows (an embedding's out, its backward's d_out) hold one row of D per
 * index: shaped index's shape plus [D], or [N, D] with N the indices. */
static bool rows_fit(const struct rp_prog_tensor *rows, const struct rp_prog_tensor *index, int64_t d)
{
	int64_t flat[2] = { index->numel, d };

	if (dims_are(rows, 2, flat)) {
		return true;
	}
	if (rows->rank != index->rank + 1 || rows->shape[rows->rank - 1] != d) {
		return false;
	}
	return dims_are(index, index->rank, rows->shape);
}

static int check_gather(struct rp_prog_builder *b, int n)
{
	const struct rp_prog_node *node = &b->p->nodes[n];
	const bool forward = node->gather.fn == RP_GATHER_EMBEDDING;
	const struct rp_prog_tensor *index = rp_prog_t(b, node->in[1]);
	const struct rp_prog_tensor *table = rp_prog_t(b, forward ? node->in[0] : node->out[0]);
	const struct rp_prog_tensor *rows = rp_prog_t(b, forward ? node->out[0] : node->in[0]);
	char st[96], sr[96], si[96];

	if (index->dtype != RP_DTYPE_I32 && index->dtype != RP_DTYPE_I64) {
		return rp_prog_node_error(b, n, "its index %s is %s but must be i32 or i64", index->name, dtype_of(index));
	}
	if (table->rank != 2 || is_integer(table->dtype)) {
		return rp_prog_node_error(b, n, "its table %s is %s %s but must be a float matrix [V, D]", table->name,
					  dtype_of(table), rp_prog_shape(table, st));
	}
	if (is_integer(rows->dtype) || !rows_fit(rows, index, table->shape[1])) {
		return rp_prog_node_error(b, n,
					  "%s is %s %s but with index %s %s and table %s %s it must be floats shaped "
					  "[N, %" PRId64 "] or the index's shape plus [%" PRId64 "]",
					  rows->name, dtype_of(rows), rp_prog_shape(rows, sr), index->name,
					  rp_prog_shape(index, si), table->name, rp_prog_shape(table, st), table->shape[1],
					  table->shape[1]);
	}
	return 0;
}

/* ---- Compute ------------------------------------------------------------------------------ */

/* The compute descriptor from the tensors: each operand's dtype, rank,
 * shape and strides, no buffer, offset 0; then the table's checks. */
static int check_compute(struct rp_prog_builder *b, int n)
{
	struct rp_prog_node *node = &b->p->nodes[n];
	struct rp_compute *c = &node->compute;
	const struct rp_op_spec *spec = c->spec;
	struct rp_error inner = { 0 };
	int r;

	for (unsigned s = 0; s < spec->noperands; s++) {
		const struct rp_prog_tensor *t;
		struct rp_operand *op = &c->operands[s];
		char st[96];

		c->present[s] = node->in[s] >= 0;
		memset(op, 0, sizeof(*op));
		if (!c->present[s]) {
			continue;
		}
		t = rp_prog_t(b, node->in[s]);
		if (t->rank != spec->operands[s].rank) {
			return rp_prog_node_error(b, n, "operand %s (tensor %s) is %s but must be rank %d, %s",
						  spec->operands[s].name, t->name, rp_prog_shape(t, st), spec->operands[s].rank,
						  spec->operands[s].dims);
		}
		op->dtype = t->dtype;
		op->rank = t->rank;
		memcpy(op->shape, t->shape, sizeof(op->shape[0]) * (size_t)t->rank);
		memcpy(op->strides, t->strides, sizeof(op->strides[0]) * (size_t)t->rank);
	}
	r = rp_compute_check_operands(c, &inner);
	if (r == 0) {
		return 0;
	}
	if (inner.name && strcmp(inner.name, RP_ERR_INVALID_OPERAND) == 0) {
		const cJSON *operand = cJSON_GetObjectItemCaseSensitive(inner.params, "operand");
		const cJSON *reason = cJSON_GetObjectItemCaseSensitive(inner.params, "reason");
		const char *on = cJSON_IsString(operand) ? operand->valuestring : "?";
		int slot = rp_op_slot(spec, on);

		r = rp_prog_node_error(b, n, "operand %s (tensor %s): %s", on,
				       slot != RP_NO_SLOT && node->in[slot] >= 0 ? rp_prog_t(b, node->in[slot])->name : "?",
				       cJSON_IsString(reason) ? reason->valuestring : "invalid");
	} else {
		char path[32];

		rp_error_move(b->err, &inner);
		snprintf(path, sizeof(path), "nodes[%d].attrs", node->source);
		r = rp_prog_param_under(b, path);
	}
	rp_error_clear(&inner);
	return r;
}

/* FP8 tensors are storage for the compute ops that take them (a GEMM, the
 * quantize ops): no pointwise op, reduction or gather computes on them. */
static int check_no_fp8(struct rp_prog_builder *b, int n)
{
	const struct rp_prog_node *node = &b->p->nodes[n];

	for (int i = 0; i < node->nin + node->nout; i++) {
		int t = i < node->nin ? node->in[i] : node->out[i - node->nin];

		if (t >= 0 && rp_dtype_is_fp8(rp_prog_t(b, t)->dtype)) {
			return rp_prog_node_error(b, n,
						  "%s does not take %s, which is %s: FP8 tensors are the operands of "
						  "gemm, quantize and transpose_quantize only",
						  node->op->name, rp_prog_t(b, t)->name, dtype_of(rp_prog_t(b, t)));
		}
	}
	return 0;
}

int rp_prog_check_node(struct rp_prog_builder *b, int n)
{
	if (b->p->nodes[n].op->cls != RP_PC_COMPUTE && check_no_fp8(b, n) < 0) {
		return -EINVAL;
	}
	switch (b->p->nodes[n].op->cls) {
	case RP_PC_COMPUTE:
		return check_compute(b, n);
	case RP_PC_POINTWISE:
		return check_pointwise(b, n);
	case RP_PC_REDUCTION:
		return check_reduction(b, n);
	case RP_PC_GATHER:
		return check_gather(b, n);
	default:
		return rp_prog_node_error(b, n, "a composite was left unlowered");
	}
}

bool rp_prog_may_alias(const struct rp_prog_node *n, int out_slot, int in_slot)
{
	if (n->op->cls == RP_PC_COMPUTE) {
		return n->compute.spec->operands[out_slot].may_alias == in_slot;
	}
	return n->op->in_place;
}
