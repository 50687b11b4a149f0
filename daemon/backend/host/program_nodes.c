/* SPDX-License-Identifier: Apache-2.0 */
/* Reference math of a program's nodes on the host; see program_nodes.h.
 *
 * Pointwise, reduction and gather nodes compute in double whatever the
 * storage: a value is read as stored (f16 and bf16 widened exactly,
 * integers converted), computed in double, and rounded once to the
 * output's dtype, except that f16 and bf16 results are rounded to f32
 * first and then to their type (rd_f32_to_bf16, rd_f32_to_f16): a
 * double rounding, which differs from rounding the double directly only
 * when the f32 rounding lands exactly on a half-way point of the narrow
 * type (at most one ulp of it, rarely), and which is what a GPU kernel
 * computing in f32 does. Integer results are truncated toward zero and
 * saturated to their type (NaN stores 0, u8 holds 0..255); integers pass
 * through double, exact up to 2^53. Compute nodes run math.c's kernels
 * (f32 accumulation, as the GPU libraries).
 *
 * Rows are processed in chunks of CHUNK elements converted into double
 * buffers on the stack, so that the dtype's switch sits outside the
 * element loops, and so that an output that is exactly one of its inputs
 * (in place) has each chunk read whole before it is written. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "daemon/backend/host/math.h"
#include "daemon/backend/host/program_nodes.h"
#include "proto/errors.h"
#include "proto/philox.h"

#define CHUNK 256

/* ---- elements ------------------------------------------------------------ */

/* Loads are by memcpy: an element is only as aligned as the client's
 * binding offset made it. */
#define LOAD_LOOP(T, conv)                                              \
	do {                                                            \
		const int64_t step = stride * (int64_t)sizeof(T);       \
		for (int64_t t = 0; t < n; t++) {                       \
			T v_;                                           \
			memcpy(&v_, base + t * step, sizeof(v_));       \
			dst[t] = (conv);                                \
		}                                                       \
	} while (0)

/* n elements of dtype dt, `stride` elements apart from base, as doubles. */
static void load_row(double *restrict dst, const char *base, enum rp_dtype dt, int64_t stride, int64_t n)
{
	switch (dt) {
	case RP_DTYPE_F32:
		LOAD_LOOP(float, (double)v_);
		break;
	case RP_DTYPE_F16:
		LOAD_LOOP(uint16_t, (double)rd_f16_to_f32(v_));
		break;
	case RP_DTYPE_BF16:
		LOAD_LOOP(uint16_t, (double)rd_bf16_to_f32(v_));
		break;
	case RP_DTYPE_F64:
		LOAD_LOOP(double, v_);
		break;
	case RP_DTYPE_I32:
		LOAD_LOOP(int32_t, (double)v_);
		break;
	case RP_DTYPE_I64:
		LOAD_LOOP(int64_t, (double)v_);
		break;
	case RP_DTYPE_U8:
		LOAD_LOOP(uint8_t, (double)v_);
		break;
	default:
		for (int64_t t = 0; t < n; t++)
			dst[t] = NAN;
		break;
	}
}

/* Truncated toward zero and saturated to [lo, hi]; NaN is 0. */
static int64_t int_of(double v, int64_t lo, int64_t hi)
{
	if (isnan(v))
		return 0;
	v = trunc(v);
	if (v <= (double)lo)
		return lo;
	if (v >= (double)hi)
		return hi;
	return (int64_t)v;
}

#define STORE_LOOP(T, conv)                                             \
	do {                                                            \
		const int64_t step = stride * (int64_t)sizeof(T);       \
		for (int64_t t = 0; t < n; t++) {                       \
			const double x_ = src[t];                       \
			const T v_ = (conv);                            \
			memcpy(base + t * step, &v_, sizeof(v_));       \
		}                                                       \
	} while (0)

static void store_row(char *base, enum rp_dtype dt, int64_t stride, const double *restrict src, int64_t n)
{
	switch (dt) {
	case RP_DTYPE_F32:
		STORE_LOOP(float, (float)x_);
		break;
	case RP_DTYPE_F16:
		STORE_LOOP(uint16_t, rd_f32_to_f16((float)x_));
		break;
	case RP_DTYPE_BF16:
		STORE_LOOP(uint16_t, rd_f32_to_bf16((float)x_));
		break;
	case RP_DTYPE_F64:
		STORE_LOOP(double, x_);
		break;
	case RP_DTYPE_I32:
		STORE_LOOP(int32_t, (int32_t)int_of(x_, INT32_MIN, INT32_MAX));
		break;
	case RP_DTYPE_I64:
		STORE_LOOP(int64_t, int_of(x_, INT64_MIN, INT64_MAX));
		break;
	case RP_DTYPE_U8:
		STORE_LOOP(uint8_t, (uint8_t)int_of(x_, 0, UINT8_MAX));
		break;
	default:
		break;
	}
}

static size_t elem_size(const struct rp_prog_tensor *t)
{
	return rp_dtype_size(t->dtype);
}

/* Element offset of the row-major position l over the first ndims dims of
 * t (a tensor's element when ndims is its rank, a row's start when it is
 * one less). */
static int64_t phys_of(const struct rp_prog_tensor *t, int ndims, int64_t l)
{
	int64_t phys = 0;

	for (int d = ndims - 1; d >= 0; d--) {
		phys += (l % t->shape[d]) * t->strides[d];
		l /= t->shape[d];
	}
	return phys;
}

static int64_t numel_of(const struct rp_prog_tensor *t, int ndims)
{
	int64_t n = 1;

	for (int d = 0; d < ndims; d++)
		n *= t->shape[d];
	return n;
}

/* ---- pointwise ------------------------------------------------------------- */

/* Operands of each function, its constant scalar included. */
static int pw_arity(enum rp_pointwise fn)
{
	if (fn <= RP_PW_GE)
		return 2;
	if (fn <= RP_PW_CAST)
		return 1;
	if (fn <= RP_PW_RELU_BACKWARD)
		return 2;
	if (fn == RP_PW_WHERE)
		return 3;
	return fn == RP_PW_FILL || fn == RP_PW_DROPOUT_MASK ? 1 : 0;   /* the constant; the seed */
}

/* sqrt(2/pi) and the cubic's coefficient of GELU's tanh form, as torch's
 * ATen writes them. */
#define GELU_BETA (M_SQRT2 * M_2_SQRTPI * 0.5)
#define GELU_KAPPA 0.044715

static double sigmoid(double x)
{
	return 1.0 / (1.0 + exp(-x));
}

static double gelu_tanh(double x)
{
	return 0.5 * x * (1.0 + tanh(GELU_BETA * (x + GELU_KAPPA * x * x * x)));
}

/* torch's gelu_backward(dy, x): the erf form's exact derivative. */
static double gelu_backward(double dy, double x)
{
	const double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
	const double pdf = exp(-0.5 * x * x) * (M_2_SQRTPI * M_SQRT1_2 * 0.5);

	return dy * (cdf + x * pdf);
}

/* torch's gelu_backward(dy, x, approximate="tanh"). */
static double gelu_tanh_backward(double dy, double x)
{
	const double x_sq = x * x;
	const double inner = GELU_BETA * (x + GELU_KAPPA * x_sq * x);
	const double t = tanh(inner);
	const double left = 0.5 * x, right = 1.0 + t;
	const double left_derivative = 0.5 * right;
	const double right_derivative = left * (1.0 - t * t) * GELU_BETA * (1.0 + 3.0 * GELU_KAPPA * x_sq);

	return dy * (left_derivative + right_derivative);
}

static double silu_backward(double dy, double x)
{
	const double s = sigmoid(x);

	return dy * s * (1.0 + x * (1.0 - s));
}

/* torch's maximum and minimum: a NaN on either side is the answer. */
static double maximum(double x, double y)
{
	return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
}

static double minimum(double x, double y)
{
	return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
}

#define EACH(expr)                              \
	for (int64_t t = 0; t < m; t++)         \
		r[t] = (expr);                  \
	break

/* r[t] = fn(a[0][t], a[1][t], a[2][t]) for t < m. */
static void pw_apply(enum rp_pointwise fn, int64_t m, const double *const *a, double *restrict r)
{
	const double *x = a[0], *y = a[1], *z = a[2];

	switch (fn) {
	case RP_PW_ADD: EACH(x[t] + y[t]);
	case RP_PW_SUB: EACH(x[t] - y[t]);
	case RP_PW_MUL: EACH(x[t] * y[t]);
	case RP_PW_DIV: EACH(x[t] / y[t]);
	case RP_PW_POW: EACH(pow(x[t], y[t]));
	case RP_PW_MAXIMUM: EACH(maximum(x[t], y[t]));
	case RP_PW_MINIMUM: EACH(minimum(x[t], y[t]));
	case RP_PW_EQ: EACH(x[t] == y[t]);
	case RP_PW_NE: EACH(x[t] != y[t]);
	case RP_PW_LT: EACH(x[t] < y[t]);
	case RP_PW_LE: EACH(x[t] <= y[t]);
	case RP_PW_GT: EACH(x[t] > y[t]);
	case RP_PW_GE: EACH(x[t] >= y[t]);
	case RP_PW_NEG: EACH(-x[t]);
	case RP_PW_EXP: EACH(exp(x[t]));
	case RP_PW_LOG: EACH(log(x[t]));
	case RP_PW_TANH: EACH(tanh(x[t]));
	case RP_PW_ERF: EACH(erf(x[t]));
	case RP_PW_SIGMOID: EACH(sigmoid(x[t]));
	case RP_PW_SILU: EACH(x[t] * sigmoid(x[t]));
	case RP_PW_GELU: EACH(0.5 * x[t] * (1.0 + erf(x[t] * M_SQRT1_2)));
	case RP_PW_GELU_TANH: EACH(gelu_tanh(x[t]));
	/* NaN stays NaN, as torch's relu (clamp_min) keeps it. */
	case RP_PW_RELU: EACH(isnan(x[t]) ? x[t] : x[t] > 0.0 ? x[t] : 0.0);
	case RP_PW_SQRT: EACH(sqrt(x[t]));
	case RP_PW_RSQRT: EACH(1.0 / sqrt(x[t]));
	case RP_PW_ABS: EACH(fabs(x[t]));
	case RP_PW_RECIPROCAL: EACH(1.0 / x[t]);
	case RP_PW_SQUARE: EACH(x[t] * x[t]);
	case RP_PW_CAST: EACH(x[t]);
	case RP_PW_GELU_BACKWARD: EACH(gelu_backward(x[t], y[t]));
	case RP_PW_GELU_TANH_BACKWARD: EACH(gelu_tanh_backward(x[t], y[t]));
	case RP_PW_SILU_BACKWARD: EACH(silu_backward(x[t], y[t]));
	case RP_PW_SIGMOID_BACKWARD: EACH(x[t] * (1.0 - y[t]) * y[t]);
	case RP_PW_TANH_BACKWARD: EACH(x[t] * (1.0 - y[t] * y[t]));
	/* threshold_backward(dy, x, 0): 0 where x <= 0, so a NaN x passes dy. */
	case RP_PW_RELU_BACKWARD: EACH(y[t] <= 0.0 ? 0.0 : x[t]);
	case RP_PW_WHERE: EACH(x[t] != 0.0 ? y[t] : z[t]);
	case RP_PW_FILL: EACH(x[t]);
	case RP_PW_IOTA:
	case RP_PW_DROPOUT_MASK:
	case RP_PW_COUNT:
		break;
	}
}

/* An operand of a pointwise node over the output's dims: strides 0 where
 * it broadcasts (a dim of 1, or a dim it lacks on the left). */
struct pw_operand {
	const char *base;
	enum rp_dtype dtype;
	size_t esize;
	int64_t strides[RP_PROG_RANK_MAX];
};

static int run_pointwise(const struct rp_program *p, const struct rp_prog_node *n, void *const *addr)
{
	const struct rp_prog_tensor *o = &p->tensors[n->out[0]];
	const enum rp_pointwise fn = n->pw.fn;
	const int rank = o->rank ? o->rank : 1;
	const size_t oesize = elem_size(o);
	int64_t shape[RP_PROG_RANK_MAX], ostrides[RP_PROG_RANK_MAX], idx[RP_PROG_RANK_MAX] = { 0 };
	struct pw_operand in[RP_PROG_NODE_IN_MAX];
	double buf[3][CHUNK], scalar[CHUNK], res[CHUNK];
	const double *args[3] = { NULL, NULL, NULL };
	int ntensor = n->nin, k = 0;

	shape[0] = 1;
	ostrides[0] = 0;
	for (int d = 0; d < o->rank; d++) {
		shape[d] = o->shape[d];
		ostrides[d] = o->strides[d];
	}
	for (int i = 0; i < ntensor; i++) {
		const struct rp_prog_tensor *t = &p->tensors[n->in[i]];
		const int lead = rank - t->rank;

		in[i].base = addr[n->in[i]];
		in[i].dtype = t->dtype;
		in[i].esize = elem_size(t);
		for (int d = 0; d < rank; d++)
			in[i].strides[d] = d < lead || t->shape[d - lead] == 1 ? 0 : t->strides[d - lead];
	}
	/* The arguments in the function's order, the constant in its place:
	 * a binary op's second (first with scalar_first), where's b (a), or
	 * fill's only one. */
	int scalar_at = -1;

	if (n->pw.has_scalar) {
		for (int t = 0; t < CHUNK; t++)
			scalar[t] = n->pw.scalar;
		scalar_at = fn == RP_PW_WHERE ? (n->pw.scalar_first ? 1 : 2) : n->pw.scalar_first ? 0 : ntensor;
	}
	for (int i = 0; k < ntensor + (scalar_at >= 0); k++)
		args[k] = k == scalar_at ? scalar : buf[i++];

	const int64_t inner = shape[rank - 1];
	const int64_t outer = numel_of(o, o->rank) / inner;
	const int last = rank - 1;
	/* dropout_mask draws from the seed its input holds. */
	uint64_t seed = 0;
	uint32_t threshold = 0;

	if (fn == RP_PW_DROPOUT_MASK) {
		double value;

		memcpy(&value, addr[n->in[0]], sizeof(value));
		seed = rp_dropout_seed(value);
		threshold = rp_dropout_threshold(n->pw.p);
	}

	for (int64_t row = 0; row < outer; row++) {
		int64_t obase = 0, ibase[RP_PROG_NODE_IN_MAX] = { 0 };

		for (int d = 0; d < last; d++) {
			obase += idx[d] * ostrides[d];
			for (int i = 0; i < ntensor; i++)
				ibase[i] += idx[d] * in[i].strides[d];
		}
		for (int64_t j0 = 0; j0 < inner; j0 += CHUNK) {
			const int64_t m = inner - j0 < CHUNK ? inner - j0 : CHUNK;

			for (int i = 0; i < ntensor; i++) {
				const int64_t s = in[i].strides[last];
				load_row(buf[i], in[i].base + (size_t)(ibase[i] + j0 * s) * in[i].esize, in[i].dtype, s, m);
			}
			if (fn == RP_PW_IOTA) {
				const int axis = n->pw.axis;
				for (int64_t t = 0; t < m; t++)
					res[t] = o->rank == 0 ? 0.0 : axis == last ? (double)(j0 + t) : (double)idx[axis];
			} else if (fn == RP_PW_DROPOUT_MASK) {
				/* The element's flat row-major index: rows run in order. */
				for (int64_t t = 0; t < m; t++)
					res[t] = rp_dropout_keep(seed, n->pw.stream, (uint64_t)(row * inner + j0 + t), threshold);
			} else {
				pw_apply(fn, m, args, res);
			}
			store_row((char *)addr[n->out[0]] + (size_t)(obase + j0 * ostrides[last]) * oesize, o->dtype,
				  ostrides[last], res, m);
		}
		for (int d = last - 1; d >= 0; d--) {
			if (++idx[d] < shape[d])
				break;
			idx[d] = 0;
		}
	}
	return 0;
}

/* ---- reductions ------------------------------------------------------------ */

/* Sums are Neumaier's compensated sums in double (Kahan's, robust to a
 * term larger than the running sum): an error of about two ulps of double
 * whatever the length, in a fixed order (the same bits every run). */
struct acc {
	double s, c;
};

static double acc_start(enum rp_reduction fn)
{
	return fn == RP_RED_MAX || fn == RP_RED_LOGSUMEXP ? -INFINITY : fn == RP_RED_MIN ? INFINITY : 0.0;
}

static inline void acc_add(enum rp_reduction fn, struct acc *a, double x)
{
	switch (fn) {
	case RP_RED_SUM:
	case RP_RED_MEAN: {
		const double t = a->s + x;
		a->c += fabs(a->s) >= fabs(x) ? (a->s - t) + x : (x - t) + a->s;
		a->s = t;
		break;
	}
	/* A NaN is the answer once seen, as torch's max, min and amax. */
	case RP_RED_MAX:
		if (isnan(x) || x > a->s)
			a->s = isnan(a->s) ? a->s : x;
		break;
	case RP_RED_MIN:
		if (isnan(x) || x < a->s)
			a->s = isnan(a->s) ? a->s : x;
		break;
	case RP_RED_AMAX:
		x = fabs(x);
		if (isnan(x) || x > a->s)
			a->s = isnan(a->s) ? a->s : x;
		break;
	/* s the running max, c the sum of exp(x - s) so far: one pass, as
	 * the kernels do it, in double. */
	case RP_RED_LOGSUMEXP:
		if (isnan(x) || isnan(a->s))
			a->s = NAN;
		else if (x == a->s)
			a->c += 1.0;     /* inf and inf too, where x - s is NaN */
		else if (x > a->s) {
			a->c = a->c * exp(a->s - x) + 1.0;
			a->s = x;
		} else
			a->c += exp(x - a->s);
		break;
	case RP_RED_COUNT:
		break;
	}
}

static double acc_result(enum rp_reduction fn, const struct acc *a, int64_t count)
{
	/* An infinite sum made its compensation NaN (inf - inf): the sum is
	 * the answer. */
	const double sum = isinf(a->s) ? a->s : a->s + a->c;

	if (fn == RP_RED_LOGSUMEXP)
		return isinf(a->s) || isnan(a->s) ? a->s : a->s + log(a->c);
	return fn == RP_RED_SUM ? sum : fn == RP_RED_MEAN ? sum / (double)count : a->s;
}

static void store_one(const struct rp_prog_tensor *o, void *base, int64_t l, double v)
{
	store_row((char *)base + (size_t)phys_of(o, o->rank, l) * elem_size(o), o->dtype, 1, &v, 1);
}

static int run_reduction(const struct rp_program *p, const struct rp_prog_node *n, void *const *addr, void *ws,
			 size_t ws_size)
{
	const struct rp_prog_tensor *x = &p->tensors[n->in[0]], *o = &p->tensors[n->out[0]];
	const enum rp_reduction fn = n->red.fn;
	const int last = x->rank - 1;
	const int64_t cols = x->shape[last], rows = numel_of(x, last), s = x->strides[last];
	const char *xbase = addr[n->in[0]];
	const size_t esize = elem_size(x);
	double buf[CHUNK];

	if (n->red.axis == RP_AXIS_LAST) {
		for (int64_t row = 0; row < rows; row++) {
			const char *rbase = xbase + (size_t)phys_of(x, last, row) * esize;
			struct acc a = { acc_start(fn), 0.0 };

			for (int64_t j0 = 0; j0 < cols; j0 += CHUNK) {
				const int64_t m = cols - j0 < CHUNK ? cols - j0 : CHUNK;

				load_row(buf, rbase + (size_t)(j0 * s) * esize, x->dtype, s, m);
				for (int64_t t = 0; t < m; t++)
					acc_add(fn, &a, buf[t]);
			}
			store_one(o, addr[n->out[0]], row, acc_result(fn, &a, cols));
		}
		return 0;
	}
	/* Every dim but the last: one accumulator per column, the rows added
	 * in order. */
	struct acc *a = ws;

	if (ws_size < (size_t)cols * sizeof(*a))
		return -ENOSPC;
	for (int64_t j = 0; j < cols; j++)
		a[j] = (struct acc){ acc_start(fn), 0.0 };
	for (int64_t row = 0; row < rows; row++) {
		const char *rbase = xbase + (size_t)phys_of(x, last, row) * esize;

		for (int64_t j0 = 0; j0 < cols; j0 += CHUNK) {
			const int64_t m = cols - j0 < CHUNK ? cols - j0 : CHUNK;

			load_row(buf, rbase + (size_t)(j0 * s) * esize, x->dtype, s, m);
			for (int64_t t = 0; t < m; t++)
				acc_add(fn, &a[j0 + t], buf[t]);
		}
	}
	for (int64_t j = 0; j < cols; j++)
		store_one(o, addr[n->out[0]], j, acc_result(fn, &a[j], rows));
	return 0;
}

/* ---- gather ---------------------------------------------------------------- */

/* The tensors of an embedding node and its sizes: table or d_table
 * [V, D], the index flattened to [N], rows (the output's or d_out's) [N, D]. */
struct embedding {
	const struct rp_prog_tensor *table, *index, *rows;
	int table_slot, index_slot, rows_slot;   /* tensor indices */
	int64_t V, D, N;
};

static struct embedding embedding_of(const struct rp_program *p, const struct rp_prog_node *n)
{
	struct embedding e;

	if (n->gather.fn == RP_GATHER_EMBEDDING) {
		e.table_slot = n->in[0];
		e.rows_slot = n->out[0];
	} else {
		e.rows_slot = n->in[0];
		e.table_slot = n->out[0];
	}
	e.index_slot = n->in[1];
	e.table = &p->tensors[e.table_slot];
	e.index = &p->tensors[e.index_slot];
	e.rows = &p->tensors[e.rows_slot];
	e.V = e.table->shape[0];
	e.D = e.table->shape[1];
	e.N = numel_of(e.index, e.index->rank);
	return e;
}

static int64_t read_index(const struct embedding *e, void *const *addr, int64_t i)
{
	const char *p = (const char *)addr[e->index_slot] + (size_t)phys_of(e->index, e->index->rank, i) * elem_size(e->index);

	if (e->index->dtype == RP_DTYPE_I32) {
		int32_t v;
		memcpy(&v, p, sizeof(v));
		return v;
	}
	int64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static int check_indices(const struct rp_program *p, const struct rp_prog_node *n, void *const *addr,
			 const char *outcome, struct rp_error *err)
{
	const struct embedding e = embedding_of(p, n);

	for (int64_t i = 0; i < e.N; i++) {
		const int64_t v = read_index(&e, addr, i);
		char pos[RP_PROG_RANK_MAX * 24];

		if (v >= 0 && v < e.V)
			continue;
		rp_prog_format_position(e.index, i, pos, sizeof(pos));
		return rp_error_invalid_operand(err, e.index->name,
						"%s%s is %lld, outside [0, %lld): the rows of '%s' (node '%s', %s); %s",
						e.index->name, pos, (long long)v, (long long)e.V, e.table->name, n->name,
						n->op->name, outcome);
	}
	return 0;
}

static int run_embedding(const struct rp_program *p, const struct rp_prog_node *n, void *const *addr)
{
	const struct embedding e = embedding_of(p, n);
	const int rlast = e.rows->rank - 1;
	const int64_t ts = e.table->strides[1], rs = e.rows->strides[rlast];
	const size_t tes = elem_size(e.table), res = elem_size(e.rows);
	double buf[CHUNK];

	for (int64_t i = 0; i < e.N; i++) {
		const int64_t v = read_index(&e, addr, i);
		char *dst = (char *)addr[e.rows_slot] + (size_t)phys_of(e.rows, rlast, i) * res;
		const char *src = (const char *)addr[e.table_slot] + (size_t)(v * e.table->strides[0]) * tes;

		for (int64_t j0 = 0; j0 < e.D; j0 += CHUNK) {
			const int64_t m = e.D - j0 < CHUNK ? e.D - j0 : CHUNK;

			/* An index the client changed since the check: zeros,
			 * never a read outside the table. */
			if (v < 0 || v >= e.V)
				memset(buf, 0, sizeof(buf));
			else
				load_row(buf, src + (size_t)(j0 * ts) * tes, e.table->dtype, ts, m);
			store_row(dst + (size_t)(j0 * rs) * res, e.rows->dtype, rs, buf, m);
		}
	}
	return 0;
}

static size_t embedding_backward_workspace(const struct embedding *e)
{
	return ((size_t)e->N * 2 + (size_t)e->V + 1) * sizeof(int64_t) + (size_t)e->D * sizeof(double);
}

/* d_table[v] = the sum of d_out[i] over i with index[i] == v, in
 * increasing i, in double, each row rounded once. The positions are put
 * in order by a counting sort (stable: increasing i within a row). */
static int run_embedding_backward(const struct rp_program *p, const struct rp_prog_node *n, void *const *addr,
				  void *ws, size_t ws_size)
{
	const struct embedding e = embedding_of(p, n);
	const int rlast = e.rows->rank - 1;
	const int64_t ts = e.table->strides[1], rs = e.rows->strides[rlast];
	const size_t tes = elem_size(e.table), res = elem_size(e.rows);
	double buf[CHUNK];

	if (ws_size < embedding_backward_workspace(&e))
		return -ENOSPC;
	/* Each index read once: a value the client changes meanwhile cannot
	 * make the two passes disagree. */
	int64_t *index = ws;
	int64_t *begin = index + e.N;      /* [V + 1]: where each row's positions start in order[] */
	int64_t *order = begin + e.V + 1;
	double *acc = (double *)(order + e.N);

	memset(begin, 0, (size_t)(e.V + 1) * sizeof(*begin));
	for (int64_t i = 0; i < e.N; i++) {
		const int64_t v = read_index(&e, addr, i);

		index[i] = v >= 0 && v < e.V ? v : -1;
		if (index[i] >= 0)
			begin[v]++;
	}
	for (int64_t v = 1; v < e.V; v++)
		begin[v] += begin[v - 1];
	begin[e.V] = e.V ? begin[e.V - 1] : 0;
	/* Filled from the end: begin[v] ends as row v's first position, and
	 * each row's positions increase. */
	for (int64_t i = e.N - 1; i >= 0; i--)
		if (index[i] >= 0)
			order[--begin[index[i]]] = i;

	for (int64_t v = 0; v < e.V; v++) {
		char *dst = (char *)addr[e.table_slot] + (size_t)(v * e.table->strides[0]) * tes;

		memset(acc, 0, (size_t)e.D * sizeof(*acc));
		for (int64_t k = begin[v]; k < begin[v + 1]; k++) {
			const char *src = (const char *)addr[e.rows_slot] + (size_t)phys_of(e.rows, rlast, order[k]) * res;

			for (int64_t j0 = 0; j0 < e.D; j0 += CHUNK) {
				const int64_t m = e.D - j0 < CHUNK ? e.D - j0 : CHUNK;

				load_row(buf, src + (size_t)(j0 * rs) * res, e.rows->dtype, rs, m);
				for (int64_t t = 0; t < m; t++)
					acc[j0 + t] += buf[t];
			}
		}
		store_row(dst, e.table->dtype, ts, acc, e.D);
	}
	return 0;
}

/* ---- compute ---------------------------------------------------------------- */

static void compute_pointers(const struct rp_prog_node *n, void *const *addr, void **ptr)
{
	for (unsigned slot = 0; slot < n->compute.spec->noperands; slot++)
		ptr[slot] = n->compute.present[slot] && n->in[slot] >= 0 ? addr[n->in[slot]] : NULL;
}

/* rd_host_check names the compute op's slot ("seq_len_q"); the client
 * knows the tensor. */
static int check_compute(const struct rp_program *p, const struct rp_prog_node *n, void *const *addr,
			 const char *outcome, struct rp_error *err)
{
	void *ptr[RP_OP_OPERANDS_MAX] = { 0 };
	struct rp_error inner = { 0 };
	int r;

	compute_pointers(n, addr, ptr);
	r = rd_host_check(&n->compute, ptr, &inner);
	if (r == 0)
		return 0;
	const cJSON *operand = inner.params ? cJSON_GetObjectItemCaseSensitive(inner.params, "operand") : NULL;
	const cJSON *reason = inner.params ? cJSON_GetObjectItemCaseSensitive(inner.params, "reason") : NULL;
	const int slot = cJSON_IsString(operand) ? rp_op_slot(n->compute.spec, operand->valuestring) : RP_NO_SLOT;

	if (slot == RP_NO_SLOT || n->in[slot] < 0) {
		rp_error_move(err, &inner);
		return r;
	}
	rp_error_invalid_operand(err, p->tensors[n->in[slot]].name, "node '%s' (%s's %s): %s; %s",
				 n->name, n->op->name, operand->valuestring,
				 cJSON_IsString(reason) ? reason->valuestring : "refused", outcome);
	rp_error_clear(&inner);
	return r;
}

/* ---- the node's entry points ------------------------------------------------- */

int rd_host_node_data_tensors(const struct rp_program *p, int node, int *t)
{
	const struct rp_prog_node *n = &p->nodes[node];

	if (n->op->cls == RP_PC_GATHER) {
		t[0] = n->in[1];
		return 1;
	}
	if (n->op->cls != RP_PC_COMPUTE)
		return 0;
	if (n->compute.spec->id == RP_OP_ATTENTION && n->compute.attention.padded) {
		t[0] = n->in[RP_ATT_SEQ_LEN_Q];
		t[1] = n->in[RP_ATT_SEQ_LEN_KV];
		return 2;
	}
	if (n->compute.spec->id == RP_OP_ATTENTION_BACKWARD && n->compute.attention.padded) {
		t[0] = n->in[RP_ATB_SEQ_LEN_Q];
		t[1] = n->in[RP_ATB_SEQ_LEN_KV];
		return 2;
	}
	/* FP8's scales: the host backend refuses one that is 0, negative,
	 * infinite or NaN (rd_host_fp8_check_scales), in a program as in a
	 * call. */
	if (n->compute.spec->id == RP_OP_QUANTIZE || n->compute.spec->id == RP_OP_TRANSPOSE_QUANTIZE) {
		t[0] = n->in[RP_QUANT_SCALE];
		return 1;
	}
	if (n->compute.spec->id == RP_OP_GEMM) {
		int count = 0;

		for (int slot = RP_GEMM_A_SCALE; slot <= RP_GEMM_D_SCALE; slot++)
			if (n->compute.present[slot] && n->in[slot] >= 0)
				t[count++] = n->in[slot];
		return count;
	}
	return 0;
}

int rd_host_node_outputs(const struct rp_program *p, int node, int *t)
{
	const struct rp_prog_node *n = &p->nodes[node];
	int count = 0;

	if (n->op->cls != RP_PC_COMPUTE) {
		for (int i = 0; i < n->nout; i++)
			t[count++] = n->out[i];
		return count;
	}
	for (unsigned slot = 0; slot < n->compute.spec->noperands; slot++)
		if (n->in[slot] >= 0 && n->compute.spec->operands[slot].role == RP_ROLE_OUT)
			t[count++] = n->in[slot];
	return count;
}

int rd_host_node_check(const struct rp_program *p, int node, void *const *addr, const char *outcome,
		       struct rp_error *err)
{
	const struct rp_prog_node *n = &p->nodes[node];

	if (n->op->cls == RP_PC_GATHER)
		return check_indices(p, n, addr, outcome, err);
	if (n->op->cls == RP_PC_COMPUTE)
		return check_compute(p, n, addr, outcome, err);
	return 0;
}

size_t rd_host_node_workspace(const struct rp_program *p, int node)
{
	const struct rp_prog_node *n = &p->nodes[node];

	switch (n->op->cls) {
	case RP_PC_COMPUTE:
		return rd_host_scratch_size(&n->compute);
	case RP_PC_REDUCTION: {
		const struct rp_prog_tensor *x = &p->tensors[n->in[0]];
		return n->red.axis == RP_AXIS_LEADING ? (size_t)x->shape[x->rank - 1] * sizeof(struct acc) : 0;
	}
	case RP_PC_GATHER: {
		const struct embedding e = embedding_of(p, n);
		return n->gather.fn == RP_GATHER_EMBEDDING_BACKWARD ? embedding_backward_workspace(&e) : 0;
	}
	default:
		return 0;
	}
}

int rd_host_node_run(const struct rp_program *p, int node, void *const *addr, void *workspace, size_t workspace_size)
{
	const struct rp_prog_node *n = &p->nodes[node];

	switch (n->op->cls) {
	case RP_PC_COMPUTE: {
		void *ptr[RP_OP_OPERANDS_MAX] = { 0 };

		compute_pointers(n, addr, ptr);
		return rd_host_run(&n->compute, ptr, workspace, workspace_size);
	}
	case RP_PC_POINTWISE:
		return run_pointwise(p, n, addr);
	case RP_PC_REDUCTION:
		return run_reduction(p, n, addr, workspace, workspace_size);
	case RP_PC_GATHER:
		return n->gather.fn == RP_GATHER_EMBEDDING ? run_embedding(p, n, addr)
							   : run_embedding_backward(p, n, addr, workspace, workspace_size);
	default:
		return -EINVAL;
	}
}

/* ---- what the interpreter relies on ------------------------------------------ */

static int refuse(struct rp_error *err, const struct rp_prog_node *n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int refuse(struct rp_error *err, const struct rp_prog_node *n, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	rp_error_set(err, RP_ERR_BACKEND,
		     "the host backend cannot run node '%s' (%s): %s; the definition checker let it through, "
		     "which is a bug of regend's to report", n->name, n->op ? n->op->name : "?", why);
	return -EINVAL;
}

static bool tensor_ok(const struct rp_program *p, int t)
{
	return t >= 0 && t < p->ntensors && rp_dtype_size(p->tensors[t].dtype) > 0 && p->tensors[t].rank >= 0 &&
	       p->tensors[t].rank <= RP_PROG_RANK_MAX;
}

static int validate_pointwise(const struct rp_program *p, const struct rp_prog_node *n, struct rp_error *err)
{
	const struct rp_prog_tensor *o = &p->tensors[n->out[0]];
	const int operands = n->nin + (n->pw.has_scalar ? 1 : 0);

	if ((unsigned)n->pw.fn >= RP_PW_COUNT || operands != pw_arity(n->pw.fn) || n->nin > 3)
		return refuse(err, n, "%d operands (the constant included) for a function of %d", operands,
			      (unsigned)n->pw.fn < RP_PW_COUNT ? pw_arity(n->pw.fn) : -1);
	if (n->pw.fn == RP_PW_IOTA && o->rank > 0 && (n->pw.axis < 0 || n->pw.axis >= o->rank))
		return refuse(err, n, "axis %d of a rank-%d output", n->pw.axis, o->rank);
	if (n->pw.fn == RP_PW_DROPOUT_MASK && (n->nin != 1 || p->tensors[n->in[0]].kind != RP_PT_SCALAR))
		return refuse(err, n, "seed '%s' is not a scalar", p->tensors[n->in[0]].name);
	for (int i = 0; i < n->nin; i++) {
		const struct rp_prog_tensor *t = &p->tensors[n->in[i]];
		const int lead = o->rank - t->rank;

		if (lead < 0)
			return refuse(err, n, "input '%s' has rank %d, more than the output's %d", t->name, t->rank,
				      o->rank);
		for (int d = 0; d < t->rank; d++)
			if (t->shape[d] != 1 && t->shape[d] != o->shape[d + lead])
				return refuse(err, n, "input '%s' dim %d is %lld, neither 1 nor the output's %lld",
					      t->name, d, (long long)t->shape[d], (long long)o->shape[d + lead]);
	}
	return 0;
}

static int validate_reduction(const struct rp_program *p, const struct rp_prog_node *n, struct rp_error *err)
{
	const struct rp_prog_tensor *x = &p->tensors[n->in[0]], *o = &p->tensors[n->out[0]];

	if (n->nin != 1 || (unsigned)n->red.fn >= RP_RED_COUNT || x->rank < 1)
		return refuse(err, n, "a reduction takes one input of rank 1 or more");
	if (n->red.fn == RP_RED_LOGSUMEXP && n->red.axis != RP_AXIS_LAST)
		return refuse(err, n, "logsumexp reduces the last dimension only");
	const int64_t cols = x->shape[x->rank - 1], rows = numel_of(x, x->rank - 1);
	const int64_t want = n->red.axis == RP_AXIS_LAST ? rows : cols;

	if (numel_of(o, o->rank) != want)
		return refuse(err, n, "output '%s' holds %lld elements, not %lld", o->name,
			      (long long)numel_of(o, o->rank), (long long)want);
	return 0;
}

static int validate_gather(const struct rp_program *p, const struct rp_prog_node *n, struct rp_error *err)
{
	if (n->nin != 2)
		return refuse(err, n, "an embedding takes two inputs");
	const struct embedding e = embedding_of(p, n);

	if (e.table->rank != 2)
		return refuse(err, n, "table '%s' has rank %d, not 2", e.table->name, e.table->rank);
	if (e.index->dtype != RP_DTYPE_I32 && e.index->dtype != RP_DTYPE_I64)
		return refuse(err, n, "index '%s' is %s, not i32 or i64", e.index->name, rp_dtype_name(e.index->dtype));
	if (e.rows->rank < 1 || e.rows->shape[e.rows->rank - 1] != e.D ||
	    numel_of(e.rows, e.rows->rank - 1) != e.N)
		return refuse(err, n, "'%s' is not [%lld, %lld] (the index's elements, the table's columns)",
			      e.rows->name, (long long)e.N, (long long)e.D);
	return 0;
}

static int validate_compute(const struct rp_program *p, const struct rp_prog_node *n, struct rp_error *err)
{
	const struct rp_op_spec *spec = n->compute.spec;

	if (!spec || spec->id >= RP_OP_COUNT || n->nin != (int)spec->noperands)
		return refuse(err, n, "not a compute op the host math knows");
	for (unsigned slot = 0; slot < spec->noperands; slot++) {
		const int t = n->in[slot];

		if (n->compute.present[slot] != (t >= 0))
			return refuse(err, n, "operand %s is %s but %s a tensor", spec->operands[slot].name,
				      n->compute.present[slot] ? "present" : "absent", t >= 0 ? "names" : "names no");
		/* math.c and fp8.c load and store these only. */
		if (t >= 0 && p->tensors[t].dtype != RP_DTYPE_F32 && p->tensors[t].dtype != RP_DTYPE_F16 &&
		    p->tensors[t].dtype != RP_DTYPE_BF16 && p->tensors[t].dtype != RP_DTYPE_I32 &&
		    !rp_dtype_is_fp8(p->tensors[t].dtype))
			return refuse(err, n, "operand %s ('%s') is %s; the host's compute math takes f32, f16, "
				      "bf16, e4m3, e5m2 (and i32 lengths)", spec->operands[slot].name, p->tensors[t].name,
				      rp_dtype_name(p->tensors[t].dtype));
	}
	return 0;
}

int rd_host_node_validate(const struct rp_program *p, int node, struct rp_error *err)
{
	const struct rp_prog_node *n = &p->nodes[node];

	if (!n->op)
		return refuse(err, n, "no op");
	if (n->nin < 0 || n->nin > RP_PROG_NODE_IN_MAX || n->nout < 0 || n->nout > RP_PROG_NODE_OUT_MAX)
		return refuse(err, n, "%d inputs and %d outputs", n->nin, n->nout);
	for (int i = 0; i < n->nin; i++)
		if (n->in[i] != -1 && !tensor_ok(p, n->in[i]))
			return refuse(err, n, "input %d is not a tensor the backend can address", i);
	for (int i = 0; i < n->nout; i++)
		if (!tensor_ok(p, n->out[i]))
			return refuse(err, n, "output %d is not a tensor the backend can address", i);
	switch (n->op->cls) {
	case RP_PC_COMPUTE:
		return validate_compute(p, n, err);
	case RP_PC_POINTWISE:
		for (int i = 0; i < n->nin; i++)
			if (n->in[i] < 0)
				return refuse(err, n, "input %d is absent", i);
		return n->nout == 1 ? validate_pointwise(p, n, err) : refuse(err, n, "%d outputs", n->nout);
	case RP_PC_REDUCTION:
		return n->nout == 1 && n->in[0] >= 0 ? validate_reduction(p, n, err) : refuse(err, n, "not one in, one out");
	case RP_PC_GATHER:
		return n->nout == 1 && n->in[0] >= 0 && n->in[1] >= 0 ? validate_gather(p, n, err)
								      : refuse(err, n, "not two in, one out");
	default:
		return refuse(err, n, "class %d is not a primitive", (int)n->op->cls);
	}
}
