/* SPDX-License-Identifier: Apache-2.0 */
/* What the composites of io.regen.Program lower into computes what they
 * are documented to: each composite's primitives are run by a plain f64
 * interpreter (below: views, broadcasting, every pointwise op, the
 * reductions) on fresh random inputs and compared with the formula written
 * out directly, and each backward with central differences of its forward.
 * The tensors are f64, so the tolerances are f64's (the backends' own
 * precision is their tests'); the seed is printed with every failure. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/errors.h"
#include "proto/program.h"
#include "unit.h"

/* ---- random inputs ------------------------------------------------------------------- */

static unsigned long long seed, state;

static void reseed(void)
{
	seed = state = ((unsigned long long)time(NULL) << 20) ^ (unsigned long long)getpid() ^ 0x9e3779b97f4a7c15ull;
}

/* Uniform in [lo, hi). */
static double uniform(double lo, double hi)
{
	state ^= state << 13;
	state ^= state >> 7;
	state ^= state << 17;
	return lo + (hi - lo) * (double)(state >> 11) / 9007199254740992.0;
}

/* ---- the interpreter --------------------------------------------------------------------- */

struct machine {
	struct rp_program p;
	double **mem;   /* by root: its elements, root_offset + strides apart */
	double *scalars;
};

static double *cell(struct machine *m, int t, const int64_t *idx)
{
	const struct rp_prog_tensor *x = &m->p.tensors[t];
	int64_t at = x->root_offset;

	for (int d = 0; d < x->rank; d++)
		at += idx[d] * x->strides[d];
	if (m->p.tensors[x->root].kind == RP_PT_SCALAR)
		return &m->scalars[m->p.tensors[x->root].bind_index];
	return &m->mem[x->root][at];
}

/* Advances idx over shape, row-major; false past the end. */
static bool next(int rank, const int64_t *shape, int64_t *idx)
{
	for (int d = rank - 1; d >= 0; d--) {
		if (++idx[d] < shape[d])
			return true;
		idx[d] = 0;
	}
	return false;
}

/* The element of `in` that broadcasts to out's idx. */
static double bcast(struct machine *m, int in, const int64_t *out_idx, int out_rank)
{
	const struct rp_prog_tensor *x = &m->p.tensors[in];
	int64_t idx[RP_PROG_RANK_MAX];

	for (int d = 0; d < x->rank; d++)
		idx[d] = x->shape[d] == 1 ? 0 : out_idx[out_rank - x->rank + d];
	return *cell(m, in, idx);
}

static double gelu_tanh(double x)
{
	return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double convert(double v, enum rp_dtype dt)
{
	return rp_dtype_is_float(dt) ? v : trunc(v);
}

static double pointwise(enum rp_pointwise fn, const double *a, double s, int axis_index)
{
	const double x = a[0], y = a[1];

	switch (fn) {
	case RP_PW_ADD: return x + y;
	case RP_PW_SUB: return x - y;
	case RP_PW_MUL: return x * y;
	case RP_PW_DIV: return x / y;
	case RP_PW_POW: return pow(x, y);
	case RP_PW_MAXIMUM: return fmax(x, y);
	case RP_PW_MINIMUM: return fmin(x, y);
	case RP_PW_EQ: return x == y;
	case RP_PW_NE: return x != y;
	case RP_PW_LT: return x < y;
	case RP_PW_LE: return x <= y;
	case RP_PW_GT: return x > y;
	case RP_PW_GE: return x >= y;
	case RP_PW_NEG: return -x;
	case RP_PW_EXP: return exp(x);
	case RP_PW_LOG: return log(x);
	case RP_PW_TANH: return tanh(x);
	case RP_PW_ERF: return erf(x);
	case RP_PW_SIGMOID: return 1 / (1 + exp(-x));
	case RP_PW_SILU: return x / (1 + exp(-x));
	case RP_PW_GELU: return 0.5 * x * (1 + erf(x / sqrt(2)));
	case RP_PW_GELU_TANH: return gelu_tanh(x);
	case RP_PW_RELU: return x > 0 ? x : 0;
	case RP_PW_SQRT: return sqrt(x);
	case RP_PW_RSQRT: return 1 / sqrt(x);
	case RP_PW_ABS: return fabs(x);
	case RP_PW_RECIPROCAL: return 1 / x;
	case RP_PW_SQUARE: return x * x;
	case RP_PW_CAST: return x;
	case RP_PW_WHERE: return x != 0 ? y : a[2];
	case RP_PW_FILL: return s;
	case RP_PW_IOTA: return axis_index;
	default: ck_abort_msg("the lowerings use no %d", fn); return NAN;
	}
}

/* The operands in the op's order: the tensor inputs, with the scalar in
 * its place (a binary op's second, or first with scalar_first; where's b,
 * or a). fill's scalar is its value, not an operand. */
static void run_pointwise(struct machine *m, const struct rp_prog_node *n)
{
	const struct rp_prog_tensor *out = &m->p.tensors[n->out[0]];
	const bool operand = n->pw.has_scalar && n->pw.fn != RP_PW_FILL;
	const int arity = n->nin + operand;
	const int at = n->pw.fn == RP_PW_WHERE ? (n->pw.scalar_first ? 1 : 2) : (n->pw.scalar_first ? 0 : 1);
	int64_t idx[RP_PROG_RANK_MAX] = { 0 };

	do {
		double a[3];

		for (int pos = 0, k = 0; pos < arity; pos++)
			a[pos] = operand && pos == at ? n->pw.scalar : bcast(m, n->in[k++], idx, out->rank);
		*cell(m, n->out[0], idx) = convert(pointwise(n->pw.fn, a, n->pw.scalar,
							     out->rank ? (int)idx[n->pw.axis] : 0), out->dtype);
	} while (next(out->rank, out->shape, idx));
}

static void run_reduction(struct machine *m, const struct rp_prog_node *n)
{
	const struct rp_prog_tensor *in = &m->p.tensors[n->in[0]], *out = &m->p.tensors[n->out[0]];
	int64_t idx[RP_PROG_RANK_MAX] = { 0 }, oidx[RP_PROG_RANK_MAX];
	const int r = in->rank;
	const bool last = n->red.axis == RP_AXIS_LAST;

	do {
		double v = *cell(m, n->in[0], idx), *o;
		bool first = true;

		memset(oidx, 0, sizeof(oidx));
		if (last) {
			/* [.., n] -> [..] or [.., 1]: the leading indices. */
			memcpy(oidx, idx, sizeof(oidx[0]) * (size_t)(r - 1));
			first = idx[r - 1] == 0;
		} else {
			/* -> [n] or [1, .., 1, n]: the last index. */
			oidx[out->rank - 1] = idx[r - 1];
			for (int d = 0; d < r - 1; d++)
				first = first && idx[d] == 0;
		}
		o = cell(m, n->out[0], oidx);
		if (n->red.fn == RP_RED_AMAX)
			v = fabs(v);
		/* logsumexp: the sum of exponentials here, its log below
		 * (the tests' values are small). */
		if (n->red.fn == RP_RED_LOGSUMEXP)
			v = exp(v);
		if (first)
			*o = v;
		else if (n->red.fn == RP_RED_SUM || n->red.fn == RP_RED_MEAN || n->red.fn == RP_RED_LOGSUMEXP)
			*o += v;
		else if (n->red.fn == RP_RED_MIN)
			*o = fmin(*o, v);
		else
			*o = fmax(*o, v);
	} while (next(r, in->shape, idx));
	if (n->red.fn == RP_RED_MEAN || n->red.fn == RP_RED_LOGSUMEXP) {
		const double count = last ? (double)in->shape[r - 1] : (double)in->numel / (double)in->shape[r - 1];

		memset(oidx, 0, sizeof(oidx));
		do {
			double *o = cell(m, n->out[0], oidx);
			*o = n->red.fn == RP_RED_MEAN ? *o / count : log(*o);
		} while (next(out->rank, out->shape, oidx));
	}
}

/* Defines text (single quotes for double) and gives every root memory. */
static void machine_init(struct machine *m, const char *text)
{
	char *s = strdup(text);
	struct rp_error err = { 0 };
	cJSON *j;

	for (char *c = s; *c; c++)
		if (*c == '\'')
			*c = '"';
	j = cJSON_Parse(s);
	ck_assert_ptr_nonnull(j);
	if (rp_program_parse(j, &m->p, &err) < 0) {
		char *e = cJSON_PrintUnformatted(err.params);
		ck_abort_msg("refused: %s %s", err.name, e);
	}
	m->mem = calloc((size_t)m->p.ntensors, sizeof(*m->mem));
	m->scalars = calloc((size_t)m->p.nbound + 1, sizeof(*m->scalars));
	for (int t = 0; t < m->p.ntensors; t++) {
		const struct rp_prog_tensor *x = &m->p.tensors[t];

		if (x->root == t)
			m->mem[t] = calloc(x->extent_bytes / rp_prog_tensor_elem_size(x) + 1, sizeof(double));
	}
	cJSON_Delete(j);
	free(s);
}

static void machine_run(struct machine *m)
{
	for (int i = 0; i < m->p.nnodes; i++) {
		const struct rp_prog_node *n = &m->p.nodes[i];

		if (n->op->cls == RP_PC_POINTWISE)
			run_pointwise(m, n);
		else if (n->op->cls == RP_PC_REDUCTION)
			run_reduction(m, n);
		else
			ck_abort_msg("a lowering made a %s", n->op->name);
	}
}

static void machine_finish(struct machine *m)
{
	for (int t = 0; t < m->p.ntensors; t++)
		free(m->mem[t]);
	free(m->mem);
	free(m->scalars);
	rp_program_finish(&m->p);
}

/* A bound tensor's elements, contiguous row-major, by name. */
static double *data(struct machine *m, const char *name)
{
	for (int t = 0; t < m->p.ntensors; t++)
		if (strcmp(m->p.tensors[t].name, name) == 0) {
			ck_assert_int_eq(m->p.tensors[t].root, t);
			return m->p.tensors[t].kind == RP_PT_SCALAR ? &m->scalars[m->p.tensors[t].bind_index] : m->mem[t];
		}
	ck_abort_msg("no tensor %s", name);
	return NULL;
}

static void fill_random(double *x, int n, double lo, double hi)
{
	for (int i = 0; i < n; i++)
		x[i] = uniform(lo, hi);
}

static void expect_close(const double *got, const double *want, int n, double tol, const char *what)
{
	for (int i = 0; i < n; i++)
		ck_assert_msg(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i])), "%s[%d] = %.17g, want %.17g (seed %llu)",
			      what, i, got[i], want[i], seed);
}

/* ---- norms -------------------------------------------------------------------------------- */

enum { R = 3, N = 5 };

#define NORM_TENSORS                                                                                                  \
	"{'name':'x','kind':'input','dtype':'f64','shape':[3,5]},{'name':'w','kind':'input','dtype':'f64','shape':[5]}," \
	"{'name':'y','kind':'output','dtype':'f64','shape':[3,5]},{'name':'r','kind':'output','dtype':'f64','shape':[3]}," \
	"{'name':'dy','kind':'input','dtype':'f64','shape':[3,5]},{'name':'rs','kind':'input','dtype':'f64','shape':[3]}," \
	"{'name':'dx','kind':'output','dtype':'f64','shape':[3,5]},{'name':'dw','kind':'output','dtype':'f64','shape':[5]}"

static void rms_norm_ref(const double *x, const double *w, double eps, double *y, double *rstd)
{
	for (int i = 0; i < R; i++) {
		double ms = 0;

		for (int j = 0; j < N; j++)
			ms += x[i * N + j] * x[i * N + j] / N;
		rstd[i] = 1 / sqrt(ms + eps);
		for (int j = 0; j < N; j++)
			y[i * N + j] = x[i * N + j] * rstd[i] * w[j];
	}
}

START_TEST(rms_norm_computes_and_its_backward_is_the_gradient)
{
	struct machine f, b;
	double y[R * N], rstd[R], yp[R * N], ym[R * N], dx[R * N], dw[N];
	const double eps = 1e-5, h = 1e-6;

	reseed();
	machine_init(&f, "{'tensors':[" NORM_TENSORS "],'nodes':[{'op':'rms_norm','inputs':['x','w'],'outputs':['y','r'],"
			 "'attrs':{'eps':1e-5}},{'op':'fill','outputs':['dx'],'attrs':{'scalar':0}},"
			 "{'op':'fill','outputs':['dw'],'attrs':{'scalar':0}}]}");
	fill_random(data(&f, "x"), R * N, -2, 2);
	fill_random(data(&f, "w"), N, 0.5, 1.5);
	machine_run(&f);
	rms_norm_ref(data(&f, "x"), data(&f, "w"), eps, y, rstd);
	expect_close(data(&f, "y"), y, R * N, 1e-12, "y");
	expect_close(data(&f, "r"), rstd, R, 1e-12, "rstd");

	machine_init(&b, "{'tensors':[" NORM_TENSORS "],'nodes':[{'op':'rms_norm_backward','inputs':['dy','x','w','rs'],"
			 "'outputs':['dx','dw']},{'op':'fill','outputs':['y'],'attrs':{'scalar':0}},"
			 "{'op':'fill','outputs':['r'],'attrs':{'scalar':0}}]}");
	memcpy(data(&b, "x"), data(&f, "x"), sizeof(y));
	memcpy(data(&b, "w"), data(&f, "w"), sizeof(dw));
	memcpy(data(&b, "rs"), rstd, sizeof(rstd));
	fill_random(data(&b, "dy"), R * N, -1, 1);
	machine_run(&b);
	/* d/dx_k and d/dw_k of sum(dy * y(x, w)), centred differences. */
	for (int k = 0; k < R * N + N; k++) {
		double xs[R * N], ws[N], lp = 0, lm = 0, r2[R];
		double *v = k < R * N ? &xs[k] : &ws[k - R * N];

		memcpy(xs, data(&f, "x"), sizeof(xs));
		memcpy(ws, data(&f, "w"), sizeof(ws));
		*v += h;
		rms_norm_ref(xs, ws, eps, yp, r2);
		*v -= 2 * h;
		rms_norm_ref(xs, ws, eps, ym, r2);
		for (int i = 0; i < R * N; i++) {
			lp += data(&b, "dy")[i] * yp[i];
			lm += data(&b, "dy")[i] * ym[i];
		}
		(k < R * N ? dx : dw)[k < R * N ? k : k - R * N] = (lp - lm) / (2 * h);
	}
	expect_close(data(&b, "dx"), dx, R * N, 1e-7, "dx");
	expect_close(data(&b, "dw"), dw, N, 1e-7, "dweight");
	machine_finish(&f);
	machine_finish(&b);
}
END_TEST

static void softmax_ref(const double *x, double *y, bool log_)
{
	for (int i = 0; i < R; i++) {
		double mx = -INFINITY, s = 0;

		for (int j = 0; j < N; j++)
			mx = fmax(mx, x[i * N + j]);
		for (int j = 0; j < N; j++)
			s += exp(x[i * N + j] - mx);
		for (int j = 0; j < N; j++)
			y[i * N + j] = log_ ? x[i * N + j] - mx - log(s) : exp(x[i * N + j] - mx) / s;
	}
}

START_TEST(softmaxes_compute_and_their_backwards_are_the_gradients)
{
	static const char *const forward[2] = { "softmax", "log_softmax" };
	static const char *const backward[2] = { "softmax_backward", "log_softmax_backward" };
	char text[2048];
	const double h = 1e-6;

	reseed();
	for (int lg = 0; lg < 2; lg++) {
		struct machine m;
		double want[R * N], dx[R * N];

		snprintf(text, sizeof(text),
			 "{'tensors':[" NORM_TENSORS "],'nodes':[{'op':'%s','inputs':['x'],'outputs':['y']},"
			 "{'op':'%s','inputs':['dy','y'],'outputs':['dx']},{'op':'fill','outputs':['r'],'attrs':{'scalar':0}},"
			 "{'op':'fill','outputs':['dw'],'attrs':{'scalar':0}}]}",
			 forward[lg], backward[lg]);
		machine_init(&m, text);
		/* Large values: the row's max is subtracted first. */
		fill_random(data(&m, "x"), R * N, -30, 700);
		fill_random(data(&m, "dy"), R * N, -1, 1);
		machine_run(&m);
		softmax_ref(data(&m, "x"), want, lg);
		expect_close(data(&m, "y"), want, R * N, 1e-12, forward[lg]);
		fill_random(data(&m, "x"), R * N, -3, 3);
		machine_run(&m);
		for (int k = 0; k < R * N; k++) {
			double xs[R * N], yp[R * N], ym[R * N], l = 0;

			memcpy(xs, data(&m, "x"), sizeof(xs));
			xs[k] += h;
			softmax_ref(xs, yp, lg);
			xs[k] -= 2 * h;
			softmax_ref(xs, ym, lg);
			for (int i = 0; i < R * N; i++)
				l += data(&m, "dy")[i] * (yp[i] - ym[i]);
			dx[k] = l / (2 * h);
		}
		expect_close(data(&m, "dx"), dx, R * N, 1e-7, backward[lg]);
		machine_finish(&m);
	}
}
END_TEST

/* ---- cross-entropy ----------------------------------------------------------------------- */

static double ce_ref(const double *logits, const double *target, int i, double ignore)
{
	double mx = -INFINITY, s = 0;

	if (target[i] == ignore)
		return 0;
	for (int j = 0; j < N; j++)
		mx = fmax(mx, logits[i * N + j]);
	for (int j = 0; j < N; j++)
		s += exp(logits[i * N + j] - mx);
	return mx + log(s) - logits[i * N + (int)target[i]];
}

START_TEST(cross_entropy_computes_and_its_backward_is_the_gradient)
{
	struct machine m;
	double loss[R], dl[R * N];
	const double h = 1e-6;

	reseed();
	machine_init(&m, "{'tensors':[{'name':'x','kind':'input','dtype':'f64','shape':[3,5]},"
			 "{'name':'t','kind':'input','dtype':'i64','shape':[3]},"
			 "{'name':'loss','kind':'output','dtype':'f64','shape':[3]},"
			 "{'name':'lse','kind':'output','dtype':'f64','shape':[3]},"
			 "{'name':'dloss','kind':'input','dtype':'f64','shape':[3]},"
			 "{'name':'dx','kind':'output','dtype':'f64','shape':[3,5]}],'nodes':["
			 "{'op':'cross_entropy','inputs':['x','t'],'outputs':['loss','lse'],'attrs':{'ignore_index':-7}},"
			 "{'op':'cross_entropy_backward','inputs':['dloss','x','t','lse'],'outputs':['dx'],"
			 "'attrs':{'ignore_index':-7}}]}");
	fill_random(data(&m, "x"), R * N, -4, 4);
	fill_random(data(&m, "dloss"), R, 0.5, 2);
	data(&m, "t")[0] = 3;
	data(&m, "t")[1] = -7;   /* ignored */
	data(&m, "t")[2] = 0;
	machine_run(&m);
	for (int i = 0; i < R; i++)
		loss[i] = ce_ref(data(&m, "x"), data(&m, "t"), i, -7);
	expect_close(data(&m, "loss"), loss, R, 1e-12, "loss");
	for (int k = 0; k < R * N; k++) {
		double xs[R * N], l = 0;

		memcpy(xs, data(&m, "x"), sizeof(xs));
		for (int sgn = 1; sgn >= -1; sgn -= 2) {
			xs[k] = data(&m, "x")[k] + sgn * h;
			for (int i = 0; i < R; i++)
				l += sgn * data(&m, "dloss")[i] * ce_ref(xs, data(&m, "t"), i, -7);
		}
		dl[k] = l / (2 * h);
	}
	expect_close(data(&m, "dx"), dl, R * N, 1e-7, "dlogits");
	machine_finish(&m);
}
END_TEST

/* ---- rotary --------------------------------------------------------------------------------- */

enum { RB = 2, RS = 3, RH = 2, RD = 6 };

/* x [B, S, H, D] (bshd) or [B, H, S, D]; cos, sin [S, D/2]. */
static void rotary_ref(const double *x, const double *c, const double *s, double *out, bool bhsd, bool back)
{
	for (int b = 0; b < RB; b++)
		for (int p = 0; p < RS; p++)
			for (int hh = 0; hh < RH; hh++) {
				int row = bhsd ? ((b * RH + hh) * RS + p) * RD : ((b * RS + p) * RH + hh) * RD;

				for (int j = 0; j < RD / 2; j++) {
					double x1 = x[row + j], x2 = x[row + j + RD / 2];
					double cs = c[p * RD / 2 + j], sn = back ? -s[p * RD / 2 + j] : s[p * RD / 2 + j];

					out[row + j] = x1 * cs - x2 * sn;
					out[row + j + RD / 2] = x2 * cs + x1 * sn;
				}
			}
}

START_TEST(rotary_rotates_and_its_backward_is_the_gradient)
{
	enum { NX = RB * RS * RH * RD };
	const double h = 1e-6;
	char text[2048];

	reseed();
	for (int bhsd = 0; bhsd < 2; bhsd++) {
		struct machine m;
		double want[NX], dx[NX];

		snprintf(text, sizeof(text),
			 "{'tensors':[{'name':'x','kind':'input','dtype':'f64','shape':%s},"
			 "{'name':'c','kind':'input','dtype':'f64','shape':[3,3]},{'name':'s','kind':'input','dtype':'f64','shape':[3,3]},"
			 "{'name':'y','kind':'output','dtype':'f64','shape':%s},{'name':'g','kind':'input','dtype':'f64','shape':%s},"
			 "{'name':'dx','kind':'output','dtype':'f64','shape':%s}],'nodes':["
			 "{'op':'rotary','inputs':['x','c','s'],'outputs':['y'],'attrs':{'layout':'%s'}},"
			 "{'op':'rotary_backward','inputs':['g','c','s'],'outputs':['dx'],'attrs':{'layout':'%s'}}]}",
			 bhsd ? "[2,2,3,6]" : "[2,3,2,6]", bhsd ? "[2,2,3,6]" : "[2,3,2,6]",
			 bhsd ? "[2,2,3,6]" : "[2,3,2,6]", bhsd ? "[2,2,3,6]" : "[2,3,2,6]", bhsd ? "bhsd" : "bshd",
			 bhsd ? "bhsd" : "bshd");
		machine_init(&m, text);
		fill_random(data(&m, "x"), NX, -2, 2);
		fill_random(data(&m, "g"), NX, -1, 1);
		for (int i = 0; i < RS * RD / 2; i++) {
			double a = uniform(0, 6.3);

			data(&m, "c")[i] = cos(a);
			data(&m, "s")[i] = sin(a);
		}
		machine_run(&m);
		rotary_ref(data(&m, "x"), data(&m, "c"), data(&m, "s"), want, bhsd, false);
		expect_close(data(&m, "y"), want, NX, 1e-12, bhsd ? "rotary bhsd" : "rotary bshd");
		for (int k = 0; k < NX; k++) {
			double xs[NX], yp[NX], ym[NX], l = 0;

			memcpy(xs, data(&m, "x"), sizeof(xs));
			xs[k] += h;
			rotary_ref(xs, data(&m, "c"), data(&m, "s"), yp, bhsd, false);
			xs[k] -= 2 * h;
			rotary_ref(xs, data(&m, "c"), data(&m, "s"), ym, bhsd, false);
			for (int i = 0; i < NX; i++)
				l += data(&m, "g")[i] * (yp[i] - ym[i]);
			dx[k] = l / (2 * h);
		}
		expect_close(data(&m, "dx"), dx, NX, 1e-7, "rotary_backward");
		machine_finish(&m);
	}
}
END_TEST

/* ---- optimizers -------------------------------------------------------------------------------- */

enum { P = 7 };

/* torch.optim.AdamW's step, as its documentation writes it. */
static void adamw_ref(double *p, const double *g, double *m, double *v, double lr, double b1, double b2, double eps,
		      double wd, int t)
{
	for (int i = 0; i < P; i++) {
		p[i] *= 1 - lr * wd;
		m[i] = b1 * m[i] + (1 - b1) * g[i];
		v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
		double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
		p[i] -= lr * mhat / (sqrt(vhat) + eps);
	}
}

START_TEST(adamw_steps_as_torch)
{
	struct machine mc;
	double p[P], m[P] = { 0 }, v[P] = { 0 };

	reseed();
	machine_init(&mc, "{'tensors':[{'name':'p','kind':'inout','dtype':'f64','shape':[7]},"
			  "{'name':'g','kind':'input','dtype':'f64','shape':[7]},{'name':'m','kind':'inout','dtype':'f64','shape':[7]},"
			  "{'name':'v','kind':'inout','dtype':'f64','shape':[7]},{'name':'t','kind':'scalar'},{'name':'lr','kind':'scalar'}],"
			  "'nodes':[{'op':'adamw','inputs':['p','g','m','v'],'attrs':{'lr':'lr','beta1':0.8,'beta2':0.99,"
			  "'eps':1e-6,'weight_decay':0.1,'step':'t'}}]}");
	fill_random(data(&mc, "p"), P, -1, 1);
	memcpy(p, data(&mc, "p"), sizeof(p));
	for (int t = 1; t <= 4; t++) {
		double lr = uniform(1e-3, 1e-1);

		fill_random(data(&mc, "g"), P, -1, 1);
		*data(&mc, "t") = t;
		*data(&mc, "lr") = lr;
		machine_run(&mc);
		adamw_ref(p, data(&mc, "g"), m, v, lr, 0.8, 0.99, 1e-6, 0.1, t);
		expect_close(data(&mc, "p"), p, P, 1e-12, "param");
		expect_close(data(&mc, "m"), m, P, 1e-12, "exp_avg");
		expect_close(data(&mc, "v"), v, P, 1e-12, "exp_avg_sq");
	}
	machine_finish(&mc);
}
END_TEST

START_TEST(sgd_steps_as_torch)
{
	struct machine mc;
	double p[P], buf[P] = { 0 };
	const double lr = 0.05, mom = 0.9, damp = 0.25, wd = 0.01;

	reseed();
	for (int nesterov = 0; nesterov < 2; nesterov++) {
		char text[1024];

		snprintf(text, sizeof(text),
			 "{'tensors':[{'name':'p','kind':'inout','dtype':'f64','shape':[7]},"
			 "{'name':'g','kind':'input','dtype':'f64','shape':[7]},{'name':'b','kind':'inout','dtype':'f64','shape':[7]}],"
			 "'nodes':[{'op':'sgd','inputs':['p','g','b'],'attrs':{'lr':0.05,'momentum':0.9,'dampening':%s,"
			 "'weight_decay':0.01,'nesterov':%s}}]}",
			 nesterov ? "0" : "0.25", nesterov ? "true" : "false");
		machine_init(&mc, text);
		fill_random(data(&mc, "p"), P, -1, 1);
		memcpy(p, data(&mc, "p"), sizeof(p));
		memset(buf, 0, sizeof(buf));
		for (int t = 0; t < 3; t++) {
			fill_random(data(&mc, "g"), P, -1, 1);
			machine_run(&mc);
			for (int i = 0; i < P; i++) {
				double g = data(&mc, "g")[i] + wd * p[i];

				buf[i] = mom * buf[i] + (1 - (nesterov ? 0 : damp)) * g;
				p[i] -= lr * (nesterov ? g + mom * buf[i] : buf[i]);
			}
			expect_close(data(&mc, "p"), p, P, 1e-12, "param");
			expect_close(data(&mc, "b"), buf, P, 1e-12, "momentum_buffer");
		}
		machine_finish(&mc);
	}
}
END_TEST

static Suite *lower_suite(void)
{
	Suite *s = suite_create("program_lower");
	TCase *tc = tcase_create("numerics");

	tcase_add_test(tc, rms_norm_computes_and_its_backward_is_the_gradient);
	tcase_add_test(tc, softmaxes_compute_and_their_backwards_are_the_gradients);
	tcase_add_test(tc, cross_entropy_computes_and_its_backward_is_the_gradient);
	tcase_add_test(tc, rotary_rotates_and_its_backward_is_the_gradient);
	tcase_add_test(tc, adamw_steps_as_torch);
	tcase_add_test(tc, sgd_steps_as_torch);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(lower_suite());
}
