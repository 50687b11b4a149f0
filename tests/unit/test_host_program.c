/* SPDX-License-Identifier: Apache-2.0 */
/* Programs on the host backend, end to end below the worker: definitions
 * parsed, lowered and checked by proto (rp_program_parse), made by the
 * backend's program_create, run as RP_OP_PROGRAM ops on a lane, and every
 * output compared with a reference computed here in long double from the
 * inputs as stored.
 *
 * Every run draws fresh random inputs (the seed is printed at start;
 * REGEN_TEST_SEED=<n> replays one). Every bound tensor gets a buffer of
 * its own, bound at an offset, poisoned before the Run: afterwards each
 * output element must hold a value and every byte around it the poison.
 *
 * Tolerances. The host computes pointwise, reduction and gather nodes in
 * double and rounds once to the output's dtype (f16/bf16 via f32), so a
 * result is within an ulp of its dtype of the exact value: f64 1e-12
 * relative (libm's few ulps, with room), f32 2^-23, bf16 2^-7, f16 2^-10,
 * plus, for sums, a term relative to the sum of the magnitudes. GEMMs
 * accumulate in f32 (math.c): a chain through them is held to 1e-5
 * relative in norm. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "daemon/backend/backend.h"
#include "proto/errors.h"
#include "proto/philox.h"
#include "proto/program.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"
#include "tests/lib/reference.h"
#include "unit.h"

#define PI_L 3.141592653589793238462643383279502884L

/* ---- the device ---------------------------------------------------------- */

static struct {
	struct rd_device dev;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned completed;
	struct rd_lane *lane;
} H;

static void on_completion(struct rd_device *dev, struct rd_op *op)
{
	pthread_mutex_lock(&H.lock);
	H.completed++;
	pthread_cond_broadcast(&H.cond);
	pthread_mutex_unlock(&H.lock);
}

static void on_fault(struct rd_device *dev, enum rd_fault_kind kind, const char *reason)
{
	ck_abort_msg("unexpected fault %d: %s", (int)kind, reason);
}

static void setup(void)
{
	struct rp_error err = { 0 };

	memset(&H, 0, sizeof(H));
	pthread_mutex_init(&H.lock, NULL);
	pthread_cond_init(&H.cond, NULL);
	atomic_init(&H.dev.generation, 1);
	H.dev.backend = &rd_backend_host;
	H.dev.post_completion = on_completion;
	H.dev.on_fault = on_fault;
	rd_registry_init(&H.dev.registry, 0);
	ck_assert_int_eq(H.dev.backend->open(&H.dev, &err), 0);
	H.lane = H.dev.backend->lane_create(&H.dev, 0, &err);
	ck_assert_ptr_nonnull(H.lane);
	tl_rand_init();
}

static void teardown(void)
{
	H.dev.backend->lane_destroy(H.lane);
	H.dev.backend->close(&H.dev);
	rd_registry_finish(&H.dev.registry);
}

static const char *err_message(const struct rp_error *err)
{
	const cJSON *m = err->params ? cJSON_GetObjectItemCaseSensitive(err->params, "message") : NULL;

	return cJSON_IsString(m) ? m->valuestring : "";
}

static const char *err_param(const struct rp_error *err, const char *key)
{
	const cJSON *m = err->params ? cJSON_GetObjectItemCaseSensitive(err->params, key) : NULL;

	return cJSON_IsString(m) ? m->valuestring : "";
}

/* ---- definitions as JSON ------------------------------------------------- */

struct jb {
	char s[65536];
	size_t n;
};

static void jb_add(struct jb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void jb_add(struct jb *b, const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = vsnprintf(b->s + b->n, sizeof(b->s) - b->n, fmt, ap);
	va_end(ap);
	ck_assert(r >= 0 && (size_t)r < sizeof(b->s) - b->n);
	b->n += (size_t)r;
}

/* ---- a program and its buffers -------------------------------------------- */

/* Elements of poison before a bound tensor's first element and after its
 * last: a write outside the tensor shows there. */
#define LEAD 3
#define TRAIL 5

struct bound {
	const struct rp_prog_tensor *t;
	struct rd_buffer buf;
	size_t elems;                  /* of the buffer, in the tensor's dtype */
	unsigned char *inside;         /* per buffer element: one of the tensor's */
};

struct prog {
	cJSON *json;
	struct rp_program def;
	struct rd_program *rp;
	struct bound *b;               /* by bind index */
	struct rd_buffer **buffers;
	uint64_t *offsets;
	double *scalars;
	struct rp_error err;           /* the last Run's */
};

/* Element offset of the row-major position l of t (from its root's start). */
static int64_t phys_of(const struct rp_prog_tensor *t, int64_t l)
{
	int64_t phys = t->root_offset;

	for (int d = t->rank - 1; d >= 0; d--) {
		phys += (l % t->shape[d]) * t->strides[d];
		l /= t->shape[d];
	}
	return phys;
}

static int define(struct prog *pg, const char *text, struct rp_error *err)
{
	memset(pg, 0, sizeof(*pg));
	pg->json = cJSON_Parse(text);
	ck_assert_msg(pg->json, "test JSON does not parse: %s", text);
	int r = rp_program_parse(pg->json, &pg->def, err);
	ck_assert_msg(r == 0, "Define refused: %s: %s\n%s", err->name, err_message(err), text);
	r = H.dev.backend->program_create(&H.dev, &pg->def, &pg->rp, err);
	/* As the worker does: the definition is the core's, named after
	 * create. */
	if (r == 0)
		pg->rp->def = &pg->def;
	return r;
}

/* Parses and makes the program; a buffer per bound tensor, poisoned. */
static void prog_define(struct prog *pg, const char *text)
{
	struct rp_error err = { 0 };
	int r = define(pg, text, &err);

	ck_assert_msg(r == 0, "program_create: %s: %s", err.name, err_message(&err));
	const int nb = pg->def.nbound;
	pg->b = calloc((size_t)nb + 1, sizeof(*pg->b));
	pg->buffers = calloc((size_t)nb + 1, sizeof(*pg->buffers));
	pg->offsets = calloc((size_t)nb + 1, sizeof(*pg->offsets));
	pg->scalars = calloc((size_t)nb + 1, sizeof(*pg->scalars));
	ck_assert(pg->b && pg->buffers && pg->offsets && pg->scalars);
	for (int i = 0; i < nb; i++) {
		const struct rp_prog_tensor *t = &pg->def.tensors[pg->def.bind[i]];
		struct bound *b = &pg->b[t->bind_index];
		const size_t elem = rp_dtype_size(t->dtype);

		b->t = t;
		if (t->kind == RP_PT_SCALAR)
			continue;
		b->elems = LEAD + (t->extent_bytes + elem - 1) / elem + TRAIL;
		b->buf.ptr = calloc(b->elems, elem);
		b->inside = calloc(b->elems, 1);
		ck_assert(b->buf.ptr && b->inside);
		b->buf.size = b->elems * elem;
		b->buf.kind = RD_BUFFER_LOCAL;
		b->buf.device = &H.dev;
		tl_poison(t->dtype, b->buf.ptr, b->elems);
		for (int64_t l = 0; l < t->numel; l++)
			b->inside[LEAD + phys_of(t, l)] = 1;
		pg->buffers[t->bind_index] = &b->buf;
		pg->offsets[t->bind_index] = LEAD * elem;
	}
}

static void prog_finish(struct prog *pg)
{
	H.dev.backend->program_destroy(pg->rp);
	for (int i = 0; i < pg->def.nbound; i++) {
		free(pg->b[i].buf.ptr);
		free(pg->b[i].inside);
	}
	free(pg->b);
	free(pg->buffers);
	free(pg->offsets);
	free(pg->scalars);
	rp_error_clear(&pg->err);
	rp_program_finish(&pg->def);
	cJSON_Delete(pg->json);
}

static struct bound *bound_of(struct prog *pg, const char *name)
{
	for (int i = 0; i < pg->def.nbound; i++)
		if (strcmp(pg->b[i].t->name, name) == 0)
			return &pg->b[i];
	ck_abort_msg("no bound tensor '%s'", name);
	return NULL;
}

static const struct rp_prog_tensor *tensor_of(struct prog *pg, const char *name)
{
	return bound_of(pg, name)->t;
}

static double get(struct prog *pg, const char *name, int64_t l)
{
	struct bound *b = bound_of(pg, name);

	return tl_load(b->t->dtype, b->buf.ptr, (size_t)(LEAD + phys_of(b->t, l)));
}

static double set(struct prog *pg, const char *name, int64_t l, double v)
{
	struct bound *b = bound_of(pg, name);

	return tl_store(b->t->dtype, b->buf.ptr, (size_t)(LEAD + phys_of(b->t, l)), v);
}

static void set_scalar(struct prog *pg, const char *name, double v)
{
	pg->scalars[tensor_of(pg, name)->bind_index] = v;
}

/* Uniform in [lo, hi), stored; the stored values are what get() reads. */
static void fill_uniform(struct prog *pg, const char *name, struct tl_rng *r, double lo, double hi)
{
	const struct rp_prog_tensor *t = tensor_of(pg, name);

	for (int64_t l = 0; l < t->numel; l++)
		set(pg, name, l, tl_rng_uniform(r, lo, hi));
}

/* The stored values, row-major (malloc'ed). */
static double *values(struct prog *pg, const char *name)
{
	const struct rp_prog_tensor *t = tensor_of(pg, name);
	double *v = malloc((size_t)(t->numel + 1) * sizeof(*v));

	ck_assert(v);
	for (int64_t l = 0; l < t->numel; l++)
		v[l] = get(pg, name, l);
	return v;
}

/* Every element of the tensor written, and nothing around it. */
static void check_written(struct prog *pg, const char *name)
{
	struct bound *b = bound_of(pg, name);

	for (size_t e = 0; e < b->elems; e++) {
		if (b->inside[e])
			ck_assert_msg(!tl_is_poison(b->t->dtype, b->buf.ptr, e), "%s: element %zu not written (seed %llu)",
				      name, e - LEAD, (unsigned long long)tl_seed());
		else
			ck_assert_msg(tl_is_poison(b->t->dtype, b->buf.ptr, e),
				      "%s: element %zd outside the tensor was written (seed %llu)", name, (ssize_t)e - LEAD,
				      (unsigned long long)tl_seed());
	}
}

static void check_untouched(struct prog *pg, const char *name)
{
	struct bound *b = bound_of(pg, name);

	for (size_t e = 0; e < b->elems; e++)
		ck_assert_msg(tl_is_poison(b->t->dtype, b->buf.ptr, e), "%s: element %zd written by a refused Run", name,
			      (ssize_t)e - LEAD);
}

/* Submits a Run on lane; completions so far + 1 is what to wait for. */
static unsigned submit_run(struct rd_lane *lane, struct rd_op *op, struct rd_program_run *run)
{
	unsigned target;

	memset(op, 0, sizeof(*op));
	op->compute.spec = &rp_op_program_run;
	op->run = run;
	pthread_mutex_lock(&H.lock);
	target = H.completed + 1;
	pthread_mutex_unlock(&H.lock);
	ck_assert_int_eq(H.dev.backend->submit(lane, op), 0);
	return target;
}

static void wait_completed(unsigned target)
{
	pthread_mutex_lock(&H.lock);
	while (H.completed < target)
		pthread_cond_wait(&H.cond, &H.lock);
	pthread_mutex_unlock(&H.lock);
}

/* Runs the program once; 0, or -1 with pg->err set. */
static int prog_run(struct prog *pg)
{
	struct rd_program_run run = { pg->rp, pg->def.nbound, pg->buffers, pg->offsets, pg->scalars };
	struct rd_op op;

	wait_completed(submit_run(H.lane, &op, &run));
	rp_error_clear(&pg->err);
	rp_error_move(&pg->err, &op.err);
	return pg->err.name ? -1 : 0;
}

static void run_ok(struct prog *pg)
{
	ck_assert_msg(prog_run(pg) == 0, "Run failed: %s: %s (seed %llu)", pg->err.name, err_message(&pg->err),
		      (unsigned long long)tl_seed());
}

/* ---- comparing ---------------------------------------------------------------- */

/* A result stored in dt is within this of the exact value, relative. */
static double tol_of(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F64 ? 1e-12 : tl_dtype_eps(dt);
}

/* got against ref, element by element: equal NaN-ness and infinities,
 * integers exactly, floats within tol |ref| + abs. */
static void expect_within(struct prog *pg, const char *name, const long double *ref, double tol, double abs_tol,
			  const char *what)
{
	const struct rp_prog_tensor *t = tensor_of(pg, name);

	check_written(pg, name);
	for (int64_t l = 0; l < t->numel; l++) {
		const double got = get(pg, name, l);
		const long double r = ref[l];
		bool ok;

		if (isnan(r))
			ok = isnan(got);
		else if (!rp_dtype_is_float(t->dtype))
			ok = got == (double)r;
		else if (isinf(r) || isinf(got))
			ok = (long double)got == r;
		else
			ok = fabsl((long double)got - r) <= tol * fabsl(r) + abs_tol + tl_dtype_quantum(t->dtype);
		ck_assert_msg(ok, "%s: %s[%lld] = %.17g, want %.17Lg (%s, tolerance %.3g rel + %.3g; seed %llu)", what,
			      name, (long long)l, got, r, rp_dtype_name(t->dtype), tol, abs_tol,
			      (unsigned long long)tl_seed());
	}
}

/* Within an ulp of the output's dtype (tol_of), plus abs_tol. */
static void expect_close(struct prog *pg, const char *name, const long double *ref, double abs_tol, const char *what)
{
	expect_within(pg, name, ref, tol_of(tensor_of(pg, name)->dtype), abs_tol, what);
}

/* What a value becomes stored in dt (the reference's intermediates). */
static long double stored(enum rp_dtype dt, long double v)
{
	unsigned char cell[8];

	if (dt == RP_DTYPE_F64)
		return v;
	return tl_store(dt, cell, 0, (double)v);
}

/* ---- pointwise references ------------------------------------------------------ */

static const char *const pw_names[RP_PW_COUNT] = {
	[RP_PW_ADD] = "add", [RP_PW_SUB] = "sub", [RP_PW_MUL] = "mul", [RP_PW_DIV] = "div", [RP_PW_POW] = "pow",
	[RP_PW_MAXIMUM] = "maximum", [RP_PW_MINIMUM] = "minimum", [RP_PW_EQ] = "eq", [RP_PW_NE] = "ne",
	[RP_PW_LT] = "lt", [RP_PW_LE] = "le", [RP_PW_GT] = "gt", [RP_PW_GE] = "ge", [RP_PW_NEG] = "neg",
	[RP_PW_EXP] = "exp", [RP_PW_LOG] = "log", [RP_PW_TANH] = "tanh", [RP_PW_ERF] = "erf",
	[RP_PW_SIGMOID] = "sigmoid", [RP_PW_SILU] = "silu", [RP_PW_GELU] = "gelu", [RP_PW_GELU_TANH] = "gelu_tanh",
	[RP_PW_RELU] = "relu", [RP_PW_SQRT] = "sqrt", [RP_PW_RSQRT] = "rsqrt", [RP_PW_ABS] = "abs",
	[RP_PW_RECIPROCAL] = "reciprocal", [RP_PW_SQUARE] = "square", [RP_PW_CAST] = "cast",
	[RP_PW_GELU_BACKWARD] = "gelu_backward", [RP_PW_GELU_TANH_BACKWARD] = "gelu_tanh_backward",
	[RP_PW_SILU_BACKWARD] = "silu_backward", [RP_PW_SIGMOID_BACKWARD] = "sigmoid_backward",
	[RP_PW_TANH_BACKWARD] = "tanh_backward", [RP_PW_RELU_BACKWARD] = "relu_backward", [RP_PW_WHERE] = "where",
	[RP_PW_FILL] = "fill", [RP_PW_IOTA] = "iota", [RP_PW_DROPOUT_MASK] = "dropout_mask",
};

/* Tensor inputs of each function (without a constant). */
static int pw_inputs(enum rp_pointwise fn)
{
	if (fn <= RP_PW_GE)
		return 2;
	if (fn <= RP_PW_CAST)
		return 1;
	if (fn <= RP_PW_RELU_BACKWARD)
		return 2;
	return fn == RP_PW_WHERE ? 3 : 0;
}

static bool pw_is_comparison(enum rp_pointwise fn)
{
	return fn >= RP_PW_EQ && fn <= RP_PW_GE;
}

static long double sigmoid_l(long double x)
{
	return 1.0L / (1.0L + expl(-x));
}

#define GELU_C sqrtl(2.0L / PI_L)
#define GELU_K 0.044715L

static long double gelu_tanh_l(long double x)
{
	return 0.5L * x * (1.0L + tanhl(GELU_C * (x + GELU_K * x * x * x)));
}

/* The functions from their definitions; gradients from differentiating
 * them by hand (reference_gradients_are_derivatives checks those). */
static long double ref_pointwise(enum rp_pointwise fn, const long double *a)
{
	const long double x = a[0], y = a[1];

	switch (fn) {
	case RP_PW_ADD: return x + y;
	case RP_PW_SUB: return x - y;
	case RP_PW_MUL: return x * y;
	case RP_PW_DIV: return x / y;
	case RP_PW_POW: return powl(x, y);
	case RP_PW_MAXIMUM: return x > y ? x : y;
	case RP_PW_MINIMUM: return x < y ? x : y;
	case RP_PW_EQ: return x == y;
	case RP_PW_NE: return x != y;
	case RP_PW_LT: return x < y;
	case RP_PW_LE: return x <= y;
	case RP_PW_GT: return x > y;
	case RP_PW_GE: return x >= y;
	case RP_PW_NEG: return -x;
	case RP_PW_EXP: return expl(x);
	case RP_PW_LOG: return logl(x);
	case RP_PW_TANH: return tanhl(x);
	case RP_PW_ERF: return erfl(x);
	case RP_PW_SIGMOID: return sigmoid_l(x);
	case RP_PW_SILU: return x * sigmoid_l(x);
	case RP_PW_GELU: return 0.5L * x * (1.0L + erfl(x / sqrtl(2.0L)));
	case RP_PW_GELU_TANH: return gelu_tanh_l(x);
	case RP_PW_RELU: return x > 0 ? x : 0.0L;
	case RP_PW_SQRT: return sqrtl(x);
	case RP_PW_RSQRT: return 1.0L / sqrtl(x);
	case RP_PW_ABS: return fabsl(x);
	case RP_PW_RECIPROCAL: return 1.0L / x;
	case RP_PW_SQUARE: return x * x;
	case RP_PW_CAST: return x;
	/* (dy, x): dy (Phi(x) + x phi(x)) */
	case RP_PW_GELU_BACKWARD:
		return x * (0.5L * (1.0L + erfl(y / sqrtl(2.0L))) + y * expl(-0.5L * y * y) / sqrtl(2.0L * PI_L));
	case RP_PW_GELU_TANH_BACKWARD: {
		const long double u = GELU_C * (y + GELU_K * y * y * y), t = tanhl(u);
		return x * (0.5L * (1.0L + t) + 0.5L * y * (1.0L - t * t) * GELU_C * (1.0L + 3.0L * GELU_K * y * y));
	}
	case RP_PW_SILU_BACKWARD: {
		const long double s = sigmoid_l(y);
		return x * (s + y * s * (1.0L - s));
	}
	case RP_PW_SIGMOID_BACKWARD: return x * y * (1.0L - y);
	case RP_PW_TANH_BACKWARD: return x * (1.0L - y * y);
	case RP_PW_RELU_BACKWARD: return y > 0 ? x : 0.0L;
	case RP_PW_WHERE: return x != 0 ? y : a[2];
	case RP_PW_FILL: return x;
	default: return NAN;
	}
}

/* An argument k of fn drawn where the function is defined and well
 * conditioned. */
static double draw(enum rp_pointwise fn, int k, struct tl_rng *r)
{
	switch (fn) {
	case RP_PW_LOG:
	case RP_PW_SQRT:
	case RP_PW_RSQRT:
		return tl_rng_uniform(r, 0.05, 4.0);
	case RP_PW_POW:
		return k == 0 ? tl_rng_uniform(r, 0.1, 2.0) : tl_rng_uniform(r, -2.0, 2.0);
	case RP_PW_DIV:
	case RP_PW_RECIPROCAL:
		if (k == (fn == RP_PW_DIV ? 1 : 0))
			return tl_rng_uniform(r, 0.25, 2.0) * (tl_rng_int(r, 0, 1) ? 1 : -1);
		return tl_rng_uniform(r, -3.0, 3.0);
	case RP_PW_SIGMOID_BACKWARD:
		return k == 1 ? tl_rng_uniform(r, 0.0, 1.0) : tl_rng_uniform(r, -2.0, 2.0);
	case RP_PW_TANH_BACKWARD:
		return tl_rng_uniform(r, -1.0, 1.0);
	case RP_PW_RELU_BACKWARD:
		/* Some exact zeros: relu's derivative there is 0. */
		return k == 1 && tl_rng_int(r, 0, 7) == 0 ? 0.0 : tl_rng_uniform(r, -2.0, 2.0);
	case RP_PW_WHERE:
		if (k == 0)
			return tl_rng_int(r, 0, 2) == 0 ? 0.0 : tl_rng_uniform(r, -1.0, 1.0);
		return tl_rng_uniform(r, -3.0, 3.0);
	default:
		return tl_rng_uniform(r, -4.0, 4.0);
	}
}

/* ---- pointwise: every op, every float dtype ---------------------------------- */

static const enum rp_dtype float_dtypes[] = { RP_DTYPE_F64, RP_DTYPE_F32, RP_DTYPE_BF16, RP_DTYPE_F16 };

/* [2, 3, 300]: the inner dim crosses the interpreter's chunk of 256. */
#define PW_SHAPE "[2, 3, 300]"
#define PW_NUMEL (2 * 3 * 300)

START_TEST(every_pointwise_op_matches_long_double)
{
	struct tl_rng r;

	tl_rng_init(&r, 1);
	for (int fn = 0; fn < RP_PW_COUNT; fn++) {
		const struct rp_prog_op *op;

		ck_assert_msg(pw_names[fn], "pointwise function %d has no name in this test", fn);
		op = rp_prog_op_find(pw_names[fn]);
		ck_assert_msg(op && op->cls == RP_PC_POINTWISE && op->fn == fn, "op '%s' is not pointwise %d", pw_names[fn],
			      fn);
		/* A mask has no formula to hold it to: the dropout_mask tests
		 * below check its statistics and its indexing. */
		if (fn == RP_PW_DROPOUT_MASK)
			continue;
		for (size_t di = 0; di < sizeof(float_dtypes) / sizeof(float_dtypes[0]); di++) {
			const enum rp_dtype dt = float_dtypes[di];
			const enum rp_dtype out_dt = pw_is_comparison(fn) ? RP_DTYPE_U8 : dt;
			const int nin = pw_inputs(fn);
			const double fill_value = tl_rng_uniform(&r, -3.0, 3.0);
			struct jb j = { .n = 0 };
			struct prog pg;
			long double *ref = malloc(PW_NUMEL * sizeof(*ref));
			double *in[3] = { NULL };
			char what[96];

			ck_assert(ref);
			jb_add(&j, "{\"tensors\": [");
			for (int k = 0; k < nin; k++)
				jb_add(&j, "{\"name\": \"x%d\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": " PW_SHAPE "},",
				       k, rp_dtype_name(dt));
			jb_add(&j, "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": " PW_SHAPE "}],",
			       rp_dtype_name(out_dt));
			jb_add(&j, "\"nodes\": [{\"op\": \"%s\", \"inputs\": [", pw_names[fn]);
			for (int k = 0; k < nin; k++)
				jb_add(&j, "%s\"x%d\"", k ? ", " : "", k);
			jb_add(&j, "], \"outputs\": [\"y\"]");
			if (fn == RP_PW_FILL)
				jb_add(&j, ", \"attrs\": {\"scalar\": %.17g}", fill_value);
			if (fn == RP_PW_IOTA)
				jb_add(&j, ", \"attrs\": {\"axis\": 2}");
			jb_add(&j, "}]}");
			prog_define(&pg, j.s);

			for (int k = 0; k < nin; k++) {
				char name[8];

				snprintf(name, sizeof(name), "x%d", k);
				for (int64_t l = 0; l < PW_NUMEL; l++)
					set(&pg, name, l, draw(fn, k, &r));
				/* Comparisons: half the pairs equal. */
				if (pw_is_comparison(fn) && k == 1)
					for (int64_t l = 0; l < PW_NUMEL; l += 2)
						set(&pg, name, l, get(&pg, "x0", l));
				in[k] = values(&pg, name);
			}
			for (int64_t l = 0; l < PW_NUMEL; l++) {
				long double a[3] = { 0, 0, 0 };

				for (int k = 0; k < nin; k++)
					a[k] = in[k][l];
				if (fn == RP_PW_FILL)
					a[0] = fill_value;
				ref[l] = fn == RP_PW_IOTA ? (long double)(l % 300) : ref_pointwise(fn, a);
			}
			run_ok(&pg);
			snprintf(what, sizeof(what), "%s (%s)", pw_names[fn], rp_dtype_name(dt));
			/* Where the formula cancels (1 + tanh(u) for GELU's tanh
			 * form at x = -4), double keeps its error against the
			 * terms, at most 16 here: 4 ulps of them. */
			expect_close(&pg, "y", ref, 16 * 4 * 0x1p-52, what);
			for (int k = 0; k < nin; k++)
				free(in[k]);
			free(ref);
			prog_finish(&pg);
		}
	}
}
END_TEST

START_TEST(reference_gradients_are_derivatives)
{
	static const struct {
		enum rp_pointwise grad, fwd;
		bool of_output;        /* the gradient takes y = f(x) rather than x */
	} pairs[] = {
		{ RP_PW_GELU_BACKWARD, RP_PW_GELU, false }, { RP_PW_GELU_TANH_BACKWARD, RP_PW_GELU_TANH, false },
		{ RP_PW_SILU_BACKWARD, RP_PW_SILU, false }, { RP_PW_SIGMOID_BACKWARD, RP_PW_SIGMOID, true },
		{ RP_PW_TANH_BACKWARD, RP_PW_TANH, true },  { RP_PW_RELU_BACKWARD, RP_PW_RELU, false },
	};
	struct tl_rng r;

	tl_rng_init(&r, 2);
	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		for (int s = 0; s < 200; s++) {
			const long double x = tl_rng_uniform(&r, -4.0, 4.0), dy = tl_rng_uniform(&r, -2.0, 2.0);
			const long double h = 1e-6L;
			long double xp[3] = { x + h }, xm[3] = { x - h }, xx[3] = { x };
			const long double fd = (ref_pointwise(pairs[i].fwd, xp) - ref_pointwise(pairs[i].fwd, xm)) / (2 * h);
			long double g[3] = { dy, pairs[i].of_output ? ref_pointwise(pairs[i].fwd, xx) : x };

			if (pairs[i].grad == RP_PW_RELU_BACKWARD && fabsl(x) < 2 * h)
				continue;
			ck_assert_msg(fabsl(ref_pointwise(pairs[i].grad, g) - dy * fd) < 1e-8L, "%s at %Lg: %Lg vs %Lg",
				      pw_names[pairs[i].grad], x, ref_pointwise(pairs[i].grad, g), dy * fd);
		}
	}
}
END_TEST

START_TEST(pointwise_mixed_dtypes_and_casts)
{
	/* bf16 + f32 -> f64, and casts across every pair of kinds: float to
	 * integer truncates toward zero and saturates. */
	struct prog pg;
	struct tl_rng r;
	long double ref[40];

	tl_rng_init(&r, 3);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"a\", \"kind\": \"input\", \"dtype\": \"bf16\", \"shape\": [4, 10]},"
			 "{\"name\": \"b\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [4, 10]},"
			 "{\"name\": \"big\", \"kind\": \"input\", \"dtype\": \"f64\", \"shape\": [4, 10]},"
			 "{\"name\": \"s\", \"kind\": \"output\", \"dtype\": \"f64\", \"shape\": [4, 10]},"
			 "{\"name\": \"i\", \"kind\": \"output\", \"dtype\": \"i32\", \"shape\": [4, 10]},"
			 "{\"name\": \"u\", \"kind\": \"output\", \"dtype\": \"u8\", \"shape\": [4, 10]},"
			 "{\"name\": \"l\", \"kind\": \"output\", \"dtype\": \"i64\", \"shape\": [4, 10]},"
			 "{\"name\": \"h\", \"kind\": \"output\", \"dtype\": \"f16\", \"shape\": [4, 10]},"
			 "{\"name\": \"back\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [4, 10]}],"
			 "\"nodes\": ["
			 "{\"op\": \"add\", \"inputs\": [\"a\", \"b\"], \"outputs\": [\"s\"]},"
			 "{\"op\": \"cast\", \"inputs\": [\"big\"], \"outputs\": [\"i\"]},"
			 "{\"op\": \"cast\", \"inputs\": [\"big\"], \"outputs\": [\"u\"]},"
			 "{\"op\": \"cast\", \"inputs\": [\"big\"], \"outputs\": [\"l\"]},"
			 "{\"op\": \"cast\", \"inputs\": [\"big\"], \"outputs\": [\"h\"]},"
			 "{\"op\": \"cast\", \"inputs\": [\"l\"], \"outputs\": [\"back\"]}]}");
	fill_uniform(&pg, "a", &r, -2, 2);
	fill_uniform(&pg, "b", &r, -2, 2);
	/* Below 189: u8's poison is 0xbd, and a value that is it would read
	 * as never written. */
	fill_uniform(&pg, "big", &r, -300, 180);
	set(&pg, "big", 0, 3e9);      /* past i32: saturates */
	set(&pg, "big", 1, -7.9);     /* toward zero: -7 */
	set(&pg, "big", 2, 70000.0);  /* past f16: inf */
	run_ok(&pg);
	for (int l = 0; l < 40; l++)
		ref[l] = (long double)get(&pg, "a", l) + get(&pg, "b", l);
	expect_close(&pg, "s", ref, 0, "bf16 + f32 -> f64");
	for (int l = 0; l < 40; l++) {
		const long double v = truncl(get(&pg, "big", l));
		ref[l] = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v;
	}
	expect_close(&pg, "i", ref, 0, "f64 -> i32");
	for (int l = 0; l < 40; l++) {
		const long double v = truncl(get(&pg, "big", l));
		ref[l] = v > 255 ? 255 : v < 0 ? 0 : v;
	}
	expect_close(&pg, "u", ref, 0, "f64 -> u8");
	for (int l = 0; l < 40; l++)
		ref[l] = truncl(get(&pg, "big", l));
	expect_close(&pg, "l", ref, 0, "f64 -> i64");
	expect_close(&pg, "back", ref, 0, "i64 -> f32");
	/* Past 65520 (half an ulp over f16's largest) is infinite. */
	for (int l = 0; l < 40; l++)
		ref[l] = fabs(get(&pg, "big", l)) >= 65520 ? copysign(INFINITY, get(&pg, "big", l)) : get(&pg, "big", l);
	expect_close(&pg, "h", ref, 0, "f64 -> f16");
	prog_finish(&pg);
}
END_TEST

/* ---- broadcasting, constants, in place, views ---------------------------------- */

START_TEST(broadcasting_and_constants)
{
	/* t = a[4,1,6] * b[5,1] -> [4,5,6]; y = t + s (a Run's scalar);
	 * z = c[2,1,1,1] - t -> [2,4,5,6]; w = 2 / t; v = t - 0.5;
	 * q = where(t > 0, t, -1) (a comparison into an intermediate). */
	struct prog pg;
	struct tl_rng r;
	const double sv = tl_rand_uniform(-1, 1);

	tl_rng_init(&r, 4);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"a\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [4, 1, 6]},"
			 "{\"name\": \"b\", \"kind\": \"input\", \"dtype\": \"bf16\", \"shape\": [5, 1]},"
			 "{\"name\": \"c\", \"kind\": \"input\", \"dtype\": \"f64\", \"shape\": [2, 1, 1, 1]},"
			 "{\"name\": \"s\", \"kind\": \"scalar\"},"
			 "{\"name\": \"t\", \"kind\": \"intermediate\", \"dtype\": \"f64\", \"shape\": [4, 5, 6]},"
			 "{\"name\": \"pos\", \"kind\": \"intermediate\", \"dtype\": \"u8\", \"shape\": [4, 5, 6]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [4, 5, 6]},"
			 "{\"name\": \"z\", \"kind\": \"output\", \"dtype\": \"f64\", \"shape\": [2, 4, 5, 6]},"
			 "{\"name\": \"w\", \"kind\": \"output\", \"dtype\": \"f64\", \"shape\": [4, 5, 6]},"
			 "{\"name\": \"v\", \"kind\": \"output\", \"dtype\": \"f64\", \"shape\": [4, 5, 6]},"
			 "{\"name\": \"q\", \"kind\": \"output\", \"dtype\": \"f64\", \"shape\": [4, 5, 6]}],"
			 "\"nodes\": ["
			 "{\"op\": \"mul\", \"inputs\": [\"a\", \"b\"], \"outputs\": [\"t\"]},"
			 "{\"op\": \"add\", \"inputs\": [\"t\", \"s\"], \"outputs\": [\"y\"]},"
			 "{\"op\": \"sub\", \"inputs\": [\"c\", \"t\"], \"outputs\": [\"z\"]},"
			 "{\"op\": \"div\", \"inputs\": [\"t\"], \"outputs\": [\"w\"], "
			 "\"attrs\": {\"scalar\": 2.0, \"scalar_first\": true}},"
			 "{\"op\": \"sub\", \"inputs\": [\"t\"], \"outputs\": [\"v\"], \"attrs\": {\"scalar\": 0.5}},"
			 "{\"op\": \"gt\", \"inputs\": [\"t\"], \"outputs\": [\"pos\"], \"attrs\": {\"scalar\": 0}},"
			 "{\"op\": \"where\", \"inputs\": [\"pos\", \"t\"], \"outputs\": [\"q\"], \"attrs\": {\"scalar\": -1}}]}");
	fill_uniform(&pg, "a", &r, -2, 2);
	fill_uniform(&pg, "b", &r, 0.25, 2);
	fill_uniform(&pg, "c", &r, -2, 2);
	set_scalar(&pg, "s", sv);
	run_ok(&pg);

	long double t[120], y[120], z[240], w[120], v[120], q[120];
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 5; j++)
			for (int k = 0; k < 6; k++) {
				const int l = (i * 5 + j) * 6 + k;
				t[l] = (long double)get(&pg, "a", i * 6 + k) * get(&pg, "b", j);
				y[l] = t[l] + sv;
				w[l] = 2.0L / t[l];
				v[l] = t[l] - 0.5L;
				q[l] = t[l] > 0 ? t[l] : -1.0L;
				for (int m = 0; m < 2; m++)
					z[m * 120 + l] = get(&pg, "c", m) - t[l];
			}
	expect_close(&pg, "y", y, 0, "broadcast + run scalar");
	expect_close(&pg, "z", z, 0, "rank-4 broadcast");
	expect_close(&pg, "w", w, 0, "scalar first");
	expect_close(&pg, "v", v, 0, "scalar second");
	expect_close(&pg, "q", q, 0, "where with a constant b");
	prog_finish(&pg);
}
END_TEST

START_TEST(in_place_updates_read_before_they_write)
{
	/* p = p * g + p (two nodes in place on an inout, g broadcast along
	 * rows), the rows long enough to cross chunks. */
	struct prog pg;
	struct tl_rng r;
	enum { R = 7, C = 300 };
	static long double want[R * C];

	tl_rng_init(&r, 5);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"p\", \"kind\": \"inout\", \"dtype\": \"f32\", \"shape\": [7, 300]},"
			 "{\"name\": \"g\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [300]}],"
			 "\"nodes\": ["
			 "{\"op\": \"mul\", \"inputs\": [\"p\", \"g\"], \"outputs\": [\"p\"]},"
			 "{\"op\": \"exp\", \"inputs\": [\"p\"], \"outputs\": [\"p\"]}]}");
	fill_uniform(&pg, "p", &r, -1, 1);
	fill_uniform(&pg, "g", &r, -1, 1);
	for (int l = 0; l < R * C; l++)
		want[l] = expl(stored(RP_DTYPE_F32, (long double)get(&pg, "p", l) * get(&pg, "g", l % C)));
	run_ok(&pg);
	expect_close(&pg, "p", want, 0, "in place");
	prog_finish(&pg);
}
END_TEST

START_TEST(views_transpose_slice_and_stride_zero)
{
	/* x [6, 9]; xt its transpose [9, 6] (strides [1, 9]); xs the slice
	 * x[2:5, 1:6] (offset 19, strides [9, 1]); vb the row v [9] repeated
	 * six times (strides [0, 1]). */
	struct prog pg;
	struct tl_rng r;
	long double yt[54], ys[15], yb[54];

	tl_rng_init(&r, 6);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [6, 9]},"
			 "{\"name\": \"v\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [9]},"
			 "{\"name\": \"xt\", \"kind\": \"view\", \"base\": \"x\", \"dtype\": \"f32\", \"shape\": [9, 6], "
			 "\"strides\": [1, 9]},"
			 "{\"name\": \"xs\", \"kind\": \"view\", \"base\": \"x\", \"dtype\": \"f32\", \"shape\": [3, 5], "
			 "\"offset\": 19, \"strides\": [9, 1]},"
			 "{\"name\": \"vb\", \"kind\": \"view\", \"base\": \"v\", \"dtype\": \"f32\", \"shape\": [6, 9], "
			 "\"strides\": [0, 1]},"
			 "{\"name\": \"yt\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [9, 6]},"
			 "{\"name\": \"ys\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [3, 5], \"strides\": [7, 1]},"
			 "{\"name\": \"yb\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [6, 9], \"strides\": [1, 6]}],"
			 "\"nodes\": ["
			 "{\"op\": \"neg\", \"inputs\": [\"xt\"], \"outputs\": [\"yt\"]},"
			 "{\"op\": \"exp\", \"inputs\": [\"xs\"], \"outputs\": [\"ys\"]},"
			 "{\"op\": \"mul\", \"inputs\": [\"x\", \"vb\"], \"outputs\": [\"yb\"]}]}");
	fill_uniform(&pg, "x", &r, -2, 2);
	fill_uniform(&pg, "v", &r, -2, 2);
	for (int i = 0; i < 9; i++)
		for (int j = 0; j < 6; j++)
			yt[i * 6 + j] = -(long double)get(&pg, "x", j * 9 + i);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 5; j++)
			ys[i * 5 + j] = expl(get(&pg, "x", (i + 2) * 9 + j + 1));
	for (int i = 0; i < 6; i++)
		for (int j = 0; j < 9; j++)
			yb[i * 9 + j] = (long double)get(&pg, "x", i * 9 + j) * get(&pg, "v", j);
	run_ok(&pg);
	expect_close(&pg, "yt", yt, 0, "transposed view");
	expect_close(&pg, "ys", ys, 0, "slice view into a padded output");
	expect_close(&pg, "yb", yb, 0, "stride-0 view into a column-major output");
	prog_finish(&pg);
}
END_TEST

START_TEST(a_chain_through_intermediates_of_every_width)
{
	/* y = 0.5 gelu_tanh(x * w + b) with t1 f32, t2 bf16, t3 f64 and y f16:
	 * each intermediate rounds to its dtype, which the reference does too. */
	struct prog pg;
	struct tl_rng r;
	enum { R = 5, C = 260 };
	static long double want[R * C];

	tl_rng_init(&r, 11);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [5, 260]},"
			 "{\"name\": \"w\", \"kind\": \"input\", \"dtype\": \"bf16\", \"shape\": [260]},"
			 "{\"name\": \"b\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [5, 1]},"
			 "{\"name\": \"t1\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [5, 260]},"
			 "{\"name\": \"t2\", \"kind\": \"intermediate\", \"dtype\": \"bf16\", \"shape\": [5, 260]},"
			 "{\"name\": \"t3\", \"kind\": \"intermediate\", \"dtype\": \"f64\", \"shape\": [5, 260]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f16\", \"shape\": [5, 260]}],"
			 "\"nodes\": ["
			 "{\"op\": \"mul\", \"inputs\": [\"x\", \"w\"], \"outputs\": [\"t1\"]},"
			 "{\"op\": \"add\", \"inputs\": [\"t1\", \"b\"], \"outputs\": [\"t2\"]},"
			 "{\"op\": \"gelu_tanh\", \"inputs\": [\"t2\"], \"outputs\": [\"t3\"]},"
			 "{\"op\": \"mul\", \"inputs\": [\"t3\"], \"outputs\": [\"y\"], \"attrs\": {\"scalar\": 0.5}}]}");
	fill_uniform(&pg, "x", &r, -2, 2);
	fill_uniform(&pg, "w", &r, -2, 2);
	fill_uniform(&pg, "b", &r, -1, 1);
	for (int i = 0; i < R; i++)
		for (int j = 0; j < C; j++) {
			const long double t1 = stored(RP_DTYPE_F32, (long double)get(&pg, "x", i * C + j) * get(&pg, "w", j));
			const long double t2 = stored(RP_DTYPE_BF16, t1 + get(&pg, "b", i));

			want[i * C + j] = 0.5L * gelu_tanh_l(t2);
		}
	run_ok(&pg);
	expect_close(&pg, "y", want, 0, "mul, add, gelu_tanh, mul");
	prog_finish(&pg);
}
END_TEST

/* ---- dropout_mask ---------------------------------------------------------------- */

/* A seed as a Run gives it: a fresh integer below 2^53. */
static double fresh_seed(void)
{
	return (double)(tl_rng_next(tl_rand()) >> 11);
}

/* Zeros of a mask of n elements with drop probability p: binomial, within
 * five standard deviations (a false alarm about once in 1.7 million). */
static void expect_binomial(int64_t zeros, int64_t n, double p, const char *what)
{
	const double mean = (double)n * p, sd = sqrt((double)n * p * (1 - p));

	ck_assert_msg(fabs((double)zeros - mean) <= 5 * sd + 1,
		      "%s: %lld zeros of %lld, want %.1f +- %.1f (5 sd; seed %llu)", what, (long long)zeros,
		      (long long)n, mean, 5 * sd, (unsigned long long)tl_seed());
}

/* Every element 0 or 1, element l (row-major in the output's shape, its
 * strides whatever they are) the draw proto/philox.h defines; the zeros a
 * fraction p of them. */
static void expect_mask(struct prog *pg, const char *name, double seed, uint32_t stream, double p, const char *what)
{
	const struct rp_prog_tensor *t = tensor_of(pg, name);
	const uint32_t threshold = rp_dropout_threshold(p);
	int64_t zeros = 0;

	check_written(pg, name);
	for (int64_t l = 0; l < t->numel; l++) {
		const double v = get(pg, name, l);
		const bool keep = rp_dropout_keep((uint64_t)seed, stream, (uint64_t)l, threshold);

		ck_assert_msg(v == (keep ? 1.0 : 0.0), "%s: %s[%lld] = %g, want %d (seed %llu)", what, name, (long long)l,
			      v, keep, (unsigned long long)tl_seed());
		zeros += v == 0.0;
	}
	expect_binomial(zeros, t->numel, p, what);
}

START_TEST(dropout_mask_drops_a_fraction_p)
{
	static const char *const shapes[] = { "[1000]", "[3, 70, 300]", "[256, 1024]", "[]" };
	static const enum rp_dtype dtypes[] = { RP_DTYPE_U8, RP_DTYPE_F32, RP_DTYPE_BF16, RP_DTYPE_I64 };
	static const double ps[] = { 0, 0.1, 0.5, 0.9, 0.999 };

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
		for (size_t pi = 0; pi < sizeof(ps) / sizeof(ps[0]); pi++) {
			const enum rp_dtype dt = dtypes[(si + pi) % 4];
			const uint32_t stream = (uint32_t)tl_rand_int(0, 3);
			const double seed = fresh_seed();
			struct jb j = { .n = 0 };
			struct prog pg;
			char what[96];

			jb_add(&j, "{\"tensors\": [{\"name\": \"seed\", \"kind\": \"scalar\"},"
				   "{\"name\": \"m\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": %s}],"
				   "\"nodes\": [{\"op\": \"dropout_mask\", \"inputs\": [\"seed\"], \"outputs\": [\"m\"],"
				   "\"attrs\": {\"p\": %.17g, \"stream\": %u}}]}",
			       rp_dtype_name(dt), shapes[si], ps[pi], stream);
			prog_define(&pg, j.s);
			set_scalar(&pg, "seed", seed);
			run_ok(&pg);
			snprintf(what, sizeof(what), "p %g, %s %s", ps[pi], rp_dtype_name(dt), shapes[si]);
			expect_mask(&pg, "m", seed, stream, ps[pi], what);
			prog_finish(&pg);
		}
}
END_TEST

/* A mask written through a transposed view is indexed by the view's own
 * row-major order, not by memory: the same mask a contiguous tensor of
 * its shape gets. */
START_TEST(dropout_mask_indexes_its_output_row_major)
{
	const double seed = fresh_seed();
	struct prog pg;

	prog_define(&pg, "{\"tensors\": [{\"name\": \"seed\", \"kind\": \"scalar\"},"
			 "{\"name\": \"mem\", \"kind\": \"output\", \"dtype\": \"u8\", \"shape\": [8, 300]},"
			 "{\"name\": \"mt\", \"kind\": \"view\", \"base\": \"mem\", \"shape\": [300, 8], "
			 "\"strides\": [1, 300]},"
			 "{\"name\": \"flat\", \"kind\": \"output\", \"dtype\": \"f16\", \"shape\": [300, 8]}],"
			 "\"nodes\": [{\"op\": \"dropout_mask\", \"inputs\": [\"seed\"], \"outputs\": [\"mt\"],"
			 "\"attrs\": {\"p\": 0.3, \"stream\": 9}},"
			 "{\"op\": \"dropout_mask\", \"inputs\": [\"seed\"], \"outputs\": [\"flat\"],"
			 "\"attrs\": {\"p\": 0.3, \"stream\": 9}}]}");
	set_scalar(&pg, "seed", seed);
	run_ok(&pg);
	expect_mask(&pg, "flat", seed, 9, 0.3, "contiguous");
	for (int64_t r = 0; r < 300; r++)
		for (int64_t c = 0; c < 8; c++)
			ck_assert_msg(get(&pg, "mem", c * 300 + r) == get(&pg, "flat", r * 8 + c),
				      "the transposed mask's [%lld, %lld] is not the contiguous one's", (long long)r,
				      (long long)c);
	prog_finish(&pg);
}
END_TEST

/* Two streams of a seed, and two seeds, draw independent masks (they
 * agree where two fair coins would: half the time); the same seed and
 * stream draw the same mask at every Run, as a Run retried after a fault
 * must. */
START_TEST(dropout_masks_differ_by_seed_and_stream_and_repeat)
{
	enum { N = 1 << 16 };
	const double a = fresh_seed(), b = a == 0 ? 1 : a - 1;
	struct prog pg;
	double *m[3], *again[3];
	static const char *const names[3] = { "m0", "m1", "m2" };

	prog_define(&pg, "{\"tensors\": [{\"name\": \"s1\", \"kind\": \"scalar\"}, {\"name\": \"s2\", \"kind\": \"scalar\"},"
			 "{\"name\": \"m0\", \"kind\": \"output\", \"dtype\": \"u8\", \"shape\": [256, 256]},"
			 "{\"name\": \"m1\", \"kind\": \"output\", \"dtype\": \"u8\", \"shape\": [256, 256]},"
			 "{\"name\": \"m2\", \"kind\": \"output\", \"dtype\": \"u8\", \"shape\": [256, 256]}],"
			 "\"nodes\": [{\"op\": \"dropout_mask\", \"inputs\": [\"s1\"], \"outputs\": [\"m0\"], \"attrs\": {\"p\": 0.5}},"
			 "{\"op\": \"dropout_mask\", \"inputs\": [\"s1\"], \"outputs\": [\"m1\"], "
			 "\"attrs\": {\"p\": 0.5, \"stream\": 1}},"
			 "{\"op\": \"dropout_mask\", \"inputs\": [\"s2\"], \"outputs\": [\"m2\"], \"attrs\": {\"p\": 0.5}}]}");
	set_scalar(&pg, "s1", a);
	set_scalar(&pg, "s2", b);
	run_ok(&pg);
	for (int k = 0; k < 3; k++)
		m[k] = values(&pg, names[k]);
	int64_t same_stream = 0, same_seed = 0;
	for (int64_t l = 0; l < N; l++) {
		same_stream += m[0][l] == m[1][l];
		same_seed += m[0][l] == m[2][l];
	}
	expect_binomial(same_stream, N, 0.5, "streams 0 and 1 of one seed agree");
	expect_binomial(same_seed, N, 0.5, "seeds a and a - 1 agree");

	/* Again, poisoned first: every bit the same. Then s2 = s1: m2 is m0. */
	for (int k = 0; k < 3; k++)
		tl_poison(RP_DTYPE_U8, bound_of(&pg, names[k])->buf.ptr, bound_of(&pg, names[k])->elems);
	set_scalar(&pg, "s2", a);
	run_ok(&pg);
	for (int k = 0; k < 3; k++)
		again[k] = values(&pg, names[k]);
	ck_assert_msg(memcmp(m[0], again[0], N * sizeof(double)) == 0, "a second Run drew another m0");
	ck_assert_msg(memcmp(m[1], again[1], N * sizeof(double)) == 0, "a second Run drew another m1");
	ck_assert_msg(memcmp(m[0], again[2], N * sizeof(double)) == 0, "one seed and stream drew two masks");
	for (int k = 0; k < 3; k++) {
		free(m[k]);
		free(again[k]);
	}
	prog_finish(&pg);
}
END_TEST

/* ---- reductions ------------------------------------------------------------------ */

static const char *const red_names[RP_RED_COUNT] = {
	[RP_RED_SUM] = "sum", [RP_RED_MEAN] = "mean", [RP_RED_MAX] = "max", [RP_RED_MIN] = "min", [RP_RED_AMAX] = "amax",
	[RP_RED_LOGSUMEXP] = "logsumexp",
};

START_TEST(every_reduction_both_axes)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F64, RP_DTYPE_F32, RP_DTYPE_BF16 };
	enum { A = 3, B = 4, N = 301 };
	struct tl_rng r;

	tl_rng_init(&r, 7);
	for (int fn = 0; fn < RP_RED_COUNT; fn++) {
		const struct rp_prog_op *op = rp_prog_op_find(red_names[fn]);

		ck_assert_msg(op && op->cls == RP_PC_REDUCTION && op->fn == fn, "op '%s'", red_names[fn]);
		for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
			/* logsumexp is the last axis's only (the check refuses the
			 * other: refusals below). */
			for (int leading = 0; leading < (fn == RP_RED_LOGSUMEXP ? 1 : 2); leading++) {
				for (int keep = 0; keep < 2; keep++) {
					const enum rp_dtype dt = dts[di];
					const char *out_shape = leading ? (keep ? "[1, 1, 301]" : "[301]") : (keep ? "[3, 4, 1]" : "[3, 4]");
					const int nout = leading ? N : A * B, span = leading ? A * B : N;
					static long double ref[A * B * N];
					double mag[A * B * N];
					struct jb j = { .n = 0 };
					struct prog pg;
					char what[64];

					jb_add(&j, "{\"tensors\": ["
						   "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [3, 4, 301]},"
						   "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": %s}],"
						   "\"nodes\": [{\"op\": \"%s\", \"inputs\": [\"x\"], \"outputs\": [\"y\"], "
						   "\"attrs\": {\"axis\": \"%s\"}}]}",
					       rp_dtype_name(dt), rp_dtype_name(dt), out_shape, red_names[fn],
					       leading ? "leading" : "last");
					prog_define(&pg, j.s);
					/* An offset keeps sums from cancelling to nothing. */
					fill_uniform(&pg, "x", &r, -1.0, 1.5);
					for (int o = 0; o < nout; o++) {
						long double acc = fn == RP_RED_MAX ? -INFINITY : fn == RP_RED_MIN ? INFINITY : 0;
						mag[o] = 0;
						for (int k = 0; k < span; k++) {
							const long double xv = get(&pg, "x", leading ? k * N + o : o * N + k);
							mag[o] += fabsl(xv);
							if (fn == RP_RED_SUM || fn == RP_RED_MEAN)
								acc += xv;
							else if (fn == RP_RED_MAX)
								acc = xv > acc ? xv : acc;
							else if (fn == RP_RED_MIN)
								acc = xv < acc ? xv : acc;
							else if (fn == RP_RED_LOGSUMEXP)
								acc += expl(xv);
							else
								acc = fabsl(xv) > acc ? fabsl(xv) : acc;
						}
						ref[o] = fn == RP_RED_MEAN ? acc / span : fn == RP_RED_LOGSUMEXP ? logl(acc) : acc;
					}
					run_ok(&pg);
					snprintf(what, sizeof(what), "%s %s%s (%s)", red_names[fn], leading ? "leading" : "last",
						 keep ? " keepdim" : "", rp_dtype_name(dt));
					/* Sums: double's error over the magnitudes, then one rounding. */
					double worst = 0;
					for (int o = 0; o < nout; o++)
						worst = mag[o] > worst ? mag[o] : worst;
					expect_close(&pg, "y", ref, 1e-14 * worst, what);
					prog_finish(&pg);
				}
			}
		}
	}
}
END_TEST

/* ---- gather ------------------------------------------------------------------------ */

START_TEST(embedding_and_its_backward)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F32, RP_DTYPE_BF16, RP_DTYPE_F64 };
	enum { V = 11, D = 300, N = 6 };
	struct tl_rng r;

	tl_rng_init(&r, 8);
	for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
		for (int wide = 0; wide < 2; wide++) {
			const enum rp_dtype dt = dts[di];
			static long double out[N * D], dtab[V * D];
			struct jb j = { .n = 0 };
			struct prog pg;
			int idx[N];

			jb_add(&j, "{\"tensors\": ["
				   "{\"name\": \"table\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [11, 300]},"
				   "{\"name\": \"idx\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [2, 3]},"
				   "{\"name\": \"d_out\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [6, 300]},"
				   "{\"name\": \"out\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [6, 300]},"
				   "{\"name\": \"d_table\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [11, 300]}],"
				   "\"nodes\": ["
				   "{\"op\": \"embedding\", \"inputs\": [\"table\", \"idx\"], \"outputs\": [\"out\"]},"
				   "{\"op\": \"embedding_backward\", \"inputs\": [\"d_out\", \"idx\"], \"outputs\": [\"d_table\"]}]}",
			       rp_dtype_name(dt), wide ? "i64" : "i32", rp_dtype_name(dt), rp_dtype_name(dt), rp_dtype_name(dt));
			prog_define(&pg, j.s);
			fill_uniform(&pg, "table", &r, -1, 1);
			fill_uniform(&pg, "d_out", &r, -1, 1);
			/* Repeats (row 3 thrice), and rows nobody names. */
			const int pick[N] = { 3, 0, 3, 10, (int)tl_rng_int(&r, 0, V - 1), 3 };
			for (int i = 0; i < N; i++)
				idx[i] = (int)set(&pg, "idx", i, pick[i]);
			memset(dtab, 0, sizeof(dtab));
			for (int i = 0; i < N; i++)
				for (int c = 0; c < D; c++) {
					out[i * D + c] = get(&pg, "table", idx[i] * D + c);
					dtab[idx[i] * D + c] += get(&pg, "d_out", i * D + c);
				}
			run_ok(&pg);
			expect_close(&pg, "out", out, 0, "embedding");
			expect_close(&pg, "d_table", dtab, 0, "embedding_backward");

			/* Deterministic: the same bits again. */
			struct bound *b = bound_of(&pg, "d_table");
			void *first = malloc(b->buf.size);
			ck_assert(first);
			memcpy(first, b->buf.ptr, b->buf.size);
			run_ok(&pg);
			ck_assert_int_eq(memcmp(first, b->buf.ptr, b->buf.size), 0);
			free(first);
			prog_finish(&pg);
		}
	}
}
END_TEST

START_TEST(an_index_out_of_range_refuses_the_run_before_any_write)
{
	/* y = neg(x) runs before the gather, yet a bad index is found first:
	 * nothing is written, and the error names the index and where. */
	struct prog pg;
	struct tl_rng r;

	tl_rng_init(&r, 9);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [4]},"
			 "{\"name\": \"table\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [5, 8]},"
			 "{\"name\": \"ids\", \"kind\": \"input\", \"dtype\": \"i64\", \"shape\": [2, 3]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [4]},"
			 "{\"name\": \"out\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [6, 8]}],"
			 "\"nodes\": ["
			 "{\"op\": \"neg\", \"inputs\": [\"x\"], \"outputs\": [\"y\"]},"
			 "{\"op\": \"embedding\", \"name\": \"embed\", \"inputs\": [\"table\", \"ids\"], \"outputs\": [\"out\"]}]}");
	fill_uniform(&pg, "x", &r, -1, 1);
	fill_uniform(&pg, "table", &r, -1, 1);
	for (int i = 0; i < 6; i++)
		set(&pg, "ids", i, i % 5);
	set(&pg, "ids", 5, 5);
	ck_assert_int_eq(prog_run(&pg), -1);
	ck_assert_str_eq(pg.err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(err_param(&pg.err, "operand"), "ids");
	ck_assert_msg(strstr(err_message(&pg.err), "ids[1, 2] is 5, outside [0, 5)") &&
			      strstr(err_message(&pg.err), "embed") && strstr(err_message(&pg.err), "wrote nothing"),
		      "%s", err_message(&pg.err));
	check_untouched(&pg, "y");
	check_untouched(&pg, "out");

	set(&pg, "ids", 5, -1);
	ck_assert_int_eq(prog_run(&pg), -1);
	ck_assert_msg(strstr(err_message(&pg.err), "ids[1, 2] is -1"), "%s", err_message(&pg.err));
	check_untouched(&pg, "y");

	/* Fixed, the same program runs. */
	set(&pg, "ids", 5, 4);
	run_ok(&pg);
	check_written(&pg, "y");
	check_written(&pg, "out");
	prog_finish(&pg);
}
END_TEST

START_TEST(an_index_a_node_computes_is_checked_before_its_gather)
{
	/* ids = cast(f): computed in the Run, so checked when the gather's
	 * turn comes, and the error says the Run stopped part way. */
	struct prog pg;

	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"f\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [3]},"
			 "{\"name\": \"table\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [4, 2]},"
			 "{\"name\": \"ids\", \"kind\": \"intermediate\", \"dtype\": \"i32\", \"shape\": [3]},"
			 "{\"name\": \"out\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [3, 2]}],"
			 "\"nodes\": ["
			 "{\"op\": \"cast\", \"inputs\": [\"f\"], \"outputs\": [\"ids\"]},"
			 "{\"op\": \"embedding\", \"inputs\": [\"table\", \"ids\"], \"outputs\": [\"out\"]}]}");
	fill_uniform(&pg, "table", tl_rand(), -1, 1);
	set(&pg, "f", 0, 1.5);
	set(&pg, "f", 1, 3.9);
	set(&pg, "f", 2, 4.2);
	ck_assert_int_eq(prog_run(&pg), -1);
	ck_assert_str_eq(pg.err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(err_param(&pg.err, "operand"), "ids");
	ck_assert_msg(strstr(err_message(&pg.err), "ids[2] is 4") && strstr(err_message(&pg.err), "stopped"), "%s",
		      err_message(&pg.err));
	check_untouched(&pg, "out");
	set(&pg, "f", 2, 0.0);
	run_ok(&pg);
	for (int c = 0; c < 2; c++) {
		ck_assert(get(&pg, "out", 0 * 2 + c) == get(&pg, "table", 1 * 2 + c));
		ck_assert(get(&pg, "out", 1 * 2 + c) == get(&pg, "table", 3 * 2 + c));
		ck_assert(get(&pg, "out", 2 * 2 + c) == get(&pg, "table", 0 * 2 + c));
	}
	prog_finish(&pg);
}
END_TEST

START_TEST(a_bad_fp8_scale_refuses_the_run_by_name)
{
	/* Scales the Run is given are checked before any node writes (y =
	 * neg(x) comes first); one a node computes (a scale update that keeps
	 * a bad old scale, its history empty) when its quantization's turn
	 * comes. Either way the error names the tensor and the node. */
	static const double bad[] = { 0.0, -1.0, INFINITY, NAN };
	struct prog pg;

	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [2, 16]},"
			 "{\"name\": \"s\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1]},"
			 "{\"name\": \"sb\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1]},"
			 "{\"name\": \"hist\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [3, 1]},"
			 "{\"name\": \"old\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [1]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [2, 16]},"
			 "{\"name\": \"q\", \"kind\": \"output\", \"dtype\": \"e4m3\", \"shape\": [2, 16]},"
			 "{\"name\": \"hist2\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [3, 1]},"
			 "{\"name\": \"fresh\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [1]},"
			 "{\"name\": \"q2\", \"kind\": \"output\", \"dtype\": \"e4m3\", \"shape\": [2, 16]},"
			 "{\"name\": \"d\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [2, 2]}],"
			 "\"nodes\": ["
			 "{\"op\": \"neg\", \"inputs\": [\"x\"], \"outputs\": [\"y\"]},"
			 "{\"op\": \"quantize\", \"name\": \"qx\", \"inputs\": {\"x\": \"x\", \"scale\": \"s\"}, "
			 "\"outputs\": {\"y\": \"q\"}},"
			 "{\"op\": \"scale_update\", \"inputs\": {\"amax_history\": \"hist\", \"scale\": \"old\"}, "
			 "\"outputs\": {\"amax_history_out\": \"hist2\", \"scale_out\": \"fresh\"}},"
			 "{\"op\": \"quantize\", \"name\": \"q_fresh\", \"inputs\": {\"x\": \"x\", \"scale\": \"fresh\"}, "
			 "\"outputs\": {\"y\": \"q2\"}},"
			 "{\"op\": \"gemm\", \"name\": \"mm\", \"inputs\": {\"a\": \"q\", \"b\": \"q2\", \"a_scale\": \"s\", "
			 "\"b_scale\": \"sb\"}, \"outputs\": {\"d\": \"d\"}, \"attrs\": {\"trans_b\": true}}]}");
	fill_uniform(&pg, "x", tl_rand(), -1, 1);
	for (int i = 0; i < 3; i++)
		set(&pg, "hist", i, 0.0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *const given[] = { "s", "sb" };
		const char *const node[] = { "qx", "mm" };

		for (int g = 0; g < 2; g++) {
			/* Outputs poisoned again: the last case's Run wrote some. */
			for (int k = 0; k < 4; k++) {
				const char *const out[] = { "y", "q", "q2", "d" };
				struct bound *b = bound_of(&pg, out[k]);

				tl_poison(b->t->dtype, b->buf.ptr, b->elems);
			}
			set(&pg, "s", 0, g == 0 ? bad[i] : 2.0);
			set(&pg, "sb", 0, g == 1 ? bad[i] : 0.5);
			set(&pg, "old", 0, 1.0);
			ck_assert_int_eq(prog_run(&pg), -1);
			ck_assert_str_eq(pg.err.name, RP_ERR_INVALID_OPERAND);
			ck_assert_str_eq(err_param(&pg.err, "operand"), given[g]);
			ck_assert_msg(strstr(err_message(&pg.err), "finite and positive") &&
					      strstr(err_message(&pg.err), node[g]) &&
					      strstr(err_message(&pg.err), "wrote nothing"),
				      "%s", err_message(&pg.err));
			check_untouched(&pg, "y");
			check_untouched(&pg, "q");
		}
		/* The update makes an infinite old scale FLT_MAX (Transformer
		 * Engine's rule), which quantizes: no refusal to see there. */
		if (isinf(bad[i]))
			continue;
		set(&pg, "s", 0, 2.0);
		set(&pg, "sb", 0, 0.5);
		set(&pg, "old", 0, bad[i]);
		ck_assert_int_eq(prog_run(&pg), -1);
		ck_assert_str_eq(err_param(&pg.err, "operand"), "fresh");
		ck_assert_msg(strstr(err_message(&pg.err), "q_fresh") && strstr(err_message(&pg.err), "stopped"), "%s",
			      err_message(&pg.err));
		check_untouched(&pg, "q2");
		check_untouched(&pg, "d");
	}
	set(&pg, "old", 0, 1.0);
	run_ok(&pg);
	check_written(&pg, "q2");
	check_written(&pg, "d");
	prog_finish(&pg);
}
END_TEST

/* ---- compute nodes: a small MLP forward and backward --------------------------------- */

START_TEST(mlp_forward_and_backward)
{
	/* h = x W1; a = gelu_tanh(h); y = a W2; given dy:
	 * dW2 = a^T dy; da = dy W2^T; dh = gelu_tanh_backward(da, h);
	 * dW1 = x^T dh; dx = dh W1^T. All f32, the GEMMs f32-accumulated. */
	enum { B = 8, DI = 16, HD = 32, DO = 8 };
	struct prog pg;
	struct tl_rng r;

	tl_rng_init(&r, 10);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [8, 16]},"
			 "{\"name\": \"w1\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [16, 32]},"
			 "{\"name\": \"w2\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [32, 8]},"
			 "{\"name\": \"dy\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [8, 8]},"
			 "{\"name\": \"h\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [8, 32]},"
			 "{\"name\": \"a\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [8, 32]},"
			 "{\"name\": \"da\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [8, 32]},"
			 "{\"name\": \"dh\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [8, 32]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [8, 8]},"
			 "{\"name\": \"dw1\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [16, 32]},"
			 "{\"name\": \"dw2\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [32, 8]},"
			 "{\"name\": \"dx\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [8, 16]}],"
			 "\"nodes\": ["
			 "{\"op\": \"gemm\", \"inputs\": {\"a\": \"x\", \"b\": \"w1\"}, \"outputs\": {\"d\": \"h\"}},"
			 "{\"op\": \"gelu_tanh\", \"inputs\": [\"h\"], \"outputs\": [\"a\"]},"
			 "{\"op\": \"gemm\", \"inputs\": {\"a\": \"a\", \"b\": \"w2\"}, \"outputs\": {\"d\": \"y\"}},"
			 "{\"op\": \"gemm\", \"inputs\": {\"a\": \"a\", \"b\": \"dy\"}, \"outputs\": {\"d\": \"dw2\"}, "
			 "\"attrs\": {\"trans_a\": true}},"
			 "{\"op\": \"gemm\", \"inputs\": {\"a\": \"dy\", \"b\": \"w2\"}, \"outputs\": {\"d\": \"da\"}, "
			 "\"attrs\": {\"trans_b\": true}},"
			 "{\"op\": \"gelu_tanh_backward\", \"inputs\": [\"da\", \"h\"], \"outputs\": [\"dh\"]},"
			 "{\"op\": \"gemm\", \"inputs\": {\"a\": \"x\", \"b\": \"dh\"}, \"outputs\": {\"d\": \"dw1\"}, "
			 "\"attrs\": {\"trans_a\": true}},"
			 "{\"op\": \"gemm\", \"inputs\": {\"a\": \"dh\", \"b\": \"w1\"}, \"outputs\": {\"d\": \"dx\"}, "
			 "\"attrs\": {\"trans_b\": true}}]}");
	fill_uniform(&pg, "x", &r, -1, 1);
	fill_uniform(&pg, "w1", &r, -0.5, 0.5);
	fill_uniform(&pg, "w2", &r, -0.5, 0.5);
	fill_uniform(&pg, "dy", &r, -1, 1);
	run_ok(&pg);

	/* The reference in double throughout (reference.c's GEMM). */
	double *x = values(&pg, "x"), *w1 = values(&pg, "w1"), *w2 = values(&pg, "w2"), *dy = values(&pg, "dy");
	double h[B * HD], a[B * HD], y[B * DO], dw2[HD * DO], da[B * HD], dh[B * HD], dw1[DI * HD], dx[B * DI];
	struct tl_gemm g = { .m = B, .n = HD, .k = DI, .alpha = 1 };

	tl_gemm_ref(&g, x, w1, NULL, NULL, h, NULL);
	for (int l = 0; l < B * HD; l++)
		a[l] = tl_gelu_tanh(h[l]);
	g = (struct tl_gemm){ .m = B, .n = DO, .k = HD, .alpha = 1 };
	tl_gemm_ref(&g, a, w2, NULL, NULL, y, NULL);
	g = (struct tl_gemm){ .m = HD, .n = DO, .k = B, .trans_a = true, .alpha = 1 };
	tl_gemm_ref(&g, a, dy, NULL, NULL, dw2, NULL);
	g = (struct tl_gemm){ .m = B, .n = HD, .k = DO, .trans_b = true, .alpha = 1 };
	tl_gemm_ref(&g, dy, w2, NULL, NULL, da, NULL);
	for (int l = 0; l < B * HD; l++)
		dh[l] = da[l] * tl_dgelu_tanh(h[l]);
	g = (struct tl_gemm){ .m = DI, .n = HD, .k = B, .trans_a = true, .alpha = 1 };
	tl_gemm_ref(&g, x, dh, NULL, NULL, dw1, NULL);
	g = (struct tl_gemm){ .m = B, .n = DI, .k = HD, .trans_b = true, .alpha = 1 };
	tl_gemm_ref(&g, dh, w1, NULL, NULL, dx, NULL);

	static const char *const outs[] = { "y", "dw2", "dw1", "dx" };
	const double *refs[] = { y, dw2, dw1, dx };
	for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
		double *got = values(&pg, outs[i]);
		const double err = tl_rel_error(got, refs[i], (size_t)tensor_of(&pg, outs[i])->numel);

		check_written(&pg, outs[i]);
		ck_assert_msg(err < 1e-5, "%s: relative error %g (seed %llu)", outs[i], err, (unsigned long long)tl_seed());
		free(got);
	}
	free(x);
	free(w1);
	free(w2);
	free(dy);
	prog_finish(&pg);
}
END_TEST

START_TEST(attention_lengths_are_checked_with_the_tensors_names)
{
	/* A padded attention node: its output against reference.c's, then a
	 * length out of range refused before the neg node before it writes. */
	enum { B = 2, NH = 2, S = 5, D = 8 };
	struct tl_attention at = { .b = B, .h = NH, .sq = S, .skv = S, .d = D, .dv = D, .scale = 0.35 };
	struct prog pg;
	struct tl_rng r;
	int32_t lq[B] = { 5, 3 }, lkv[B] = { 4, 5 };
	double o[B * NH * S * D];

	tl_rng_init(&r, 16);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [3]},"
			 "{\"name\": \"q\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [2, 2, 5, 8]},"
			 "{\"name\": \"k\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [2, 2, 5, 8]},"
			 "{\"name\": \"v\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [2, 2, 5, 8]},"
			 "{\"name\": \"lens_q\", \"kind\": \"input\", \"dtype\": \"i32\", \"shape\": [2]},"
			 "{\"name\": \"lens_kv\", \"kind\": \"input\", \"dtype\": \"i32\", \"shape\": [2]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [3]},"
			 "{\"name\": \"o\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [2, 2, 5, 8]}],"
			 "\"nodes\": ["
			 "{\"op\": \"neg\", \"inputs\": [\"x\"], \"outputs\": [\"y\"]},"
			 "{\"op\": \"attention\", \"name\": \"attn\", \"inputs\": {\"q\": \"q\", \"k\": \"k\", \"v\": \"v\", "
			 "\"seq_len_q\": \"lens_q\", \"seq_len_kv\": \"lens_kv\"}, \"outputs\": {\"o\": \"o\"}, "
			 "\"attrs\": {\"scale\": 0.35}}]}");
	fill_uniform(&pg, "x", &r, -1, 1);
	fill_uniform(&pg, "q", &r, -1, 1);
	fill_uniform(&pg, "k", &r, -1, 1);
	fill_uniform(&pg, "v", &r, -1, 1);
	for (int b = 0; b < B; b++) {
		set(&pg, "lens_q", b, lq[b]);
		set(&pg, "lens_kv", b, lkv[b]);
	}
	set(&pg, "lens_kv", 1, 6);
	ck_assert_int_eq(prog_run(&pg), -1);
	ck_assert_str_eq(pg.err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(err_param(&pg.err, "operand"), "lens_kv");
	ck_assert_msg(strstr(err_message(&pg.err), "attn") && strstr(err_message(&pg.err), "seq_len_kv[1] is 6") &&
			      strstr(err_message(&pg.err), "wrote nothing"),
		      "%s", err_message(&pg.err));
	check_untouched(&pg, "y");
	check_untouched(&pg, "o");

	set(&pg, "lens_kv", 1, lkv[1]);
	run_ok(&pg);
	double *q = values(&pg, "q"), *k = values(&pg, "k"), *v = values(&pg, "v"), *got = values(&pg, "o");
	at.seq_len_q = lq;
	at.seq_len_kv = lkv;
	tl_attention_ref(&at, q, k, v, o, NULL, NULL);
	check_written(&pg, "o");
	ck_assert_msg(tl_rel_error(got, o, B * NH * S * D) < 1e-5, "attention: relative error %g",
		      tl_rel_error(got, o, B * NH * S * D));
	free(q);
	free(k);
	free(v);
	free(got);
	prog_finish(&pg);
}
END_TEST

START_TEST(memory_gone_under_a_run_is_named)
{
	/* x's buffer is a memfd cut to nothing after it was mapped: the Run
	 * touches it under the SIGBUS guard and names x. */
	struct prog pg;
	struct bound *b;
	void *saved;
	long page = sysconf(_SC_PAGESIZE);
	int fd;

	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"w\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [16]},"
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [16]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [16]}],"
			 "\"nodes\": [{\"op\": \"mul\", \"inputs\": [\"w\", \"x\"], \"outputs\": [\"y\"]}]}");
	b = bound_of(&pg, "x");
	saved = b->buf.ptr;
	fd = memfd_create("x", MFD_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, page), 0);
	b->buf.ptr = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(b->buf.ptr, MAP_FAILED);
	b->buf.size = (uint64_t)page;
	ck_assert_int_eq(ftruncate(fd, 0), 0);
	ck_assert_int_eq(prog_run(&pg), -1);
	ck_assert_str_eq(pg.err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(err_param(&pg.err, "operand"), "x");
	ck_assert_str_eq(err_param(&pg.err, "reason"), "its memory is gone");
	munmap(b->buf.ptr, (size_t)page);
	close(fd);
	b->buf.ptr = saved;
	/* The worker goes on: the next Run over live memory works. */
	fill_uniform(&pg, "w", tl_rand(), -1, 1);
	fill_uniform(&pg, "x", tl_rand(), -1, 1);
	run_ok(&pg);
	for (int l = 0; l < 16; l++)
		ck_assert(get(&pg, "y", l) == (double)((float)get(&pg, "w", l) * (float)get(&pg, "x", l)));
	prog_finish(&pg);
}
END_TEST

START_TEST(runs_on_two_lanes_keep_their_intermediates_apart)
{
	/* One program, two bindings, Runs on two lanes at once, many times:
	 * each output is its own input's, whatever the other lane does with
	 * the program's arena. */
	enum { N = 64 * 1024, ROUNDS = 20 };
	struct prog pg;
	struct rp_error err = { 0 };
	struct rd_lane *lane2 = H.dev.backend->lane_create(&H.dev, 1, &err);
	float *x2 = malloc(N * sizeof(float)), *y2 = malloc(N * sizeof(float));
	struct rd_buffer bx2 = { .ptr = x2, .size = N * sizeof(float), .kind = RD_BUFFER_LOCAL, .device = &H.dev };
	struct rd_buffer by2 = { .ptr = y2, .size = N * sizeof(float), .kind = RD_BUFFER_LOCAL, .device = &H.dev };

	ck_assert(lane2 && x2 && y2);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [65536]},"
			 "{\"name\": \"t\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [65536]},"
			 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [65536]}],"
			 "\"nodes\": ["
			 "{\"op\": \"mul\", \"inputs\": [\"x\"], \"outputs\": [\"t\"], \"attrs\": {\"scalar\": 2}},"
			 "{\"op\": \"add\", \"inputs\": [\"t\"], \"outputs\": [\"y\"], \"attrs\": {\"scalar\": 1}}]}");
	struct rd_buffer *buffers2[2];
	uint64_t offsets2[2] = { 0, 0 };
	double scalars2[2] = { 0, 0 };
	buffers2[tensor_of(&pg, "x")->bind_index] = &bx2;
	buffers2[tensor_of(&pg, "y")->bind_index] = &by2;
	for (int l = 0; l < N; l++) {
		set(&pg, "x", l, l);
		x2[l] = (float)-l;
	}
	for (int round = 0; round < ROUNDS; round++) {
		struct rd_program_run run1 = { pg.rp, pg.def.nbound, pg.buffers, pg.offsets, pg.scalars };
		struct rd_program_run run2 = { pg.rp, pg.def.nbound, buffers2, offsets2, scalars2 };
		struct rd_op op1, op2;
		/* Both are done when the count has grown by two since the
		 * first was submitted. */
		const unsigned first = submit_run(H.lane, &op1, &run1);

		submit_run(lane2, &op2, &run2);
		wait_completed(first + 1);
		ck_assert_ptr_null(op1.err.name);
		ck_assert_ptr_null(op2.err.name);
		for (int l = 0; l < N; l++) {
			ck_assert_msg(get(&pg, "y", l) == 2.0 * l + 1 && y2[l] == -2.0f * l + 1, "round %d, [%d]: %g and %g",
				      round, l, get(&pg, "y", l), y2[l]);
		}
	}
	ck_assert_uint_eq(pg.rp->stream_runs, 2 * ROUNDS);
	prog_finish(&pg);
	H.dev.backend->lane_destroy(lane2);
	free(x2);
	free(y2);
}
END_TEST

/* ---- composites, lowered by proto and run as primitives ---------------------------------- */

/* Composites keep their intermediates in f32 (f64 where the data is):
 * a few roundings of f32 add up to a few of its ulps, against the
 * magnitude of the terms where they cancel. */
static double composite_tol(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F64 ? 1e-12 : 1e-6;
}

static long double max_abs(const long double *v, int n)
{
	long double m = 0;

	for (int i = 0; i < n; i++)
		m = fabsl(v[i]) > m ? fabsl(v[i]) : m;
	return m;
}

START_TEST(rms_norm_and_its_backward)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F64, RP_DTYPE_F32 };
	enum { R = 4, N = 37 };
	struct tl_rng r;

	tl_rng_init(&r, 12);
	for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
		const enum rp_dtype dt = dts[di];
		const char *d = rp_dtype_name(dt);
		const double tol = composite_tol(dt), eps = 1e-5;
		long double y[R * N], rstd[R], dx[R * N], dw[N], mag_dx = 0;
		struct jb j = { .n = 0 };
		struct prog pg;

		jb_add(&j, "{\"tensors\": ["
			   "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [4, 37]},"
			   "{\"name\": \"w\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [37]},"
			   "{\"name\": \"dy\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [4, 37]},"
			   "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [4, 37]},"
			   "{\"name\": \"rstd\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [4]},"
			   "{\"name\": \"dx\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [4, 37]},"
			   "{\"name\": \"dw\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [37]}],"
			   "\"nodes\": ["
			   "{\"op\": \"rms_norm\", \"inputs\": [\"x\", \"w\"], \"outputs\": [\"y\", \"rstd\"], "
			   "\"attrs\": {\"eps\": 1e-5}},"
			   "{\"op\": \"rms_norm_backward\", \"inputs\": [\"dy\", \"x\", \"w\", \"rstd\"], "
			   "\"outputs\": [\"dx\", \"dw\"]}]}",
		       d, d, d, d, d, d, d);
		prog_define(&pg, j.s);
		fill_uniform(&pg, "x", &r, -2, 2);
		fill_uniform(&pg, "w", &r, 0.5, 1.5);
		fill_uniform(&pg, "dy", &r, -1, 1);
		memset(dw, 0, sizeof(dw));
		for (int i = 0; i < R; i++) {
			long double ms = 0, gx = 0;

			for (int c = 0; c < N; c++)
				ms += (long double)get(&pg, "x", i * N + c) * get(&pg, "x", i * N + c);
			rstd[i] = 1.0L / sqrtl(ms / N + eps);
			for (int c = 0; c < N; c++) {
				const long double xh = get(&pg, "x", i * N + c) * rstd[i];

				y[i * N + c] = xh * get(&pg, "w", c);
				gx += get(&pg, "dy", i * N + c) * get(&pg, "w", c) * xh;
				dw[c] += get(&pg, "dy", i * N + c) * xh;
			}
			for (int c = 0; c < N; c++) {
				const long double xh = get(&pg, "x", i * N + c) * rstd[i];
				const long double g = get(&pg, "dy", i * N + c) * get(&pg, "w", c);

				dx[i * N + c] = rstd[i] * (g - xh * gx / N);
				mag_dx = fmaxl(mag_dx, rstd[i] * (fabsl(g) + fabsl(xh * gx / N)));
			}
		}
		run_ok(&pg);
		expect_within(&pg, "y", y, tol, 0, "rms_norm y");
		expect_within(&pg, "rstd", rstd, tol, 0, "rms_norm rstd");
		expect_within(&pg, "dx", dx, tol, tol * (double)mag_dx, "rms_norm_backward dx");
		expect_within(&pg, "dw", dw, tol, tol * (double)max_abs(dw, N) * R, "rms_norm_backward dw");
		prog_finish(&pg);
	}
}
END_TEST

START_TEST(softmaxes_and_softmax_backward)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F64, RP_DTYPE_F32 };
	enum { R = 5, N = 300 };
	struct tl_rng r;

	tl_rng_init(&r, 13);
	for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
		const enum rp_dtype dt = dts[di];
		const char *d = rp_dtype_name(dt);
		const double tol = composite_tol(dt);
		static long double y[R * N], ly[R * N], dx[R * N];
		long double mag = 0;
		struct jb j = { .n = 0 };
		struct prog pg;

		jb_add(&j, "{\"tensors\": ["
			   "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [5, 300]},"
			   "{\"name\": \"dy\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [5, 300]},"
			   "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [5, 300]},"
			   "{\"name\": \"ly\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [5, 300]},"
			   "{\"name\": \"dx\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [5, 300]}],"
			   "\"nodes\": ["
			   "{\"op\": \"softmax\", \"inputs\": [\"x\"], \"outputs\": [\"y\"]},"
			   "{\"op\": \"log_softmax\", \"inputs\": [\"x\"], \"outputs\": [\"ly\"]},"
			   "{\"op\": \"softmax_backward\", \"inputs\": [\"dy\", \"y\"], \"outputs\": [\"dx\"]}]}",
		       d, d, d, d, d);
		prog_define(&pg, j.s);
		/* Large logits: the max must come off first. */
		fill_uniform(&pg, "x", &r, -30, 90);
		fill_uniform(&pg, "dy", &r, -1, 1);
		for (int i = 0; i < R; i++) {
			long double m = -INFINITY, s = 0;

			for (int c = 0; c < N; c++)
				m = fmaxl(m, get(&pg, "x", i * N + c));
			for (int c = 0; c < N; c++)
				s += expl(get(&pg, "x", i * N + c) - m);
			for (int c = 0; c < N; c++) {
				y[i * N + c] = expl(get(&pg, "x", i * N + c) - m) / s;
				ly[i * N + c] = get(&pg, "x", i * N + c) - m - logl(s);
			}
		}
		run_ok(&pg);
		/* The backward reads y as the forward stored it. */
		for (int i = 0; i < R; i++) {
			long double dot = 0;

			for (int c = 0; c < N; c++)
				dot += (long double)get(&pg, "dy", i * N + c) * get(&pg, "y", i * N + c);
			for (int c = 0; c < N; c++) {
				const long double yv = get(&pg, "y", i * N + c), g = get(&pg, "dy", i * N + c);

				dx[i * N + c] = yv * (g - dot);
				mag = fmaxl(mag, fabsl(yv) * (fabsl(g) + fabsl(dot)));
			}
		}
		/* x - max is rounded to the intermediate's dtype first, as
		 * torch's f32 softmax does: an error of an ulp of 120 in the
		 * exponent, 7e-6 relative in f32. */
		const double shift_tol = dt == RP_DTYPE_F64 ? tol : 128 * tl_dtype_eps(dt);
		expect_within(&pg, "y", y, tol + shift_tol, 0, "softmax");
		expect_within(&pg, "ly", ly, tol, shift_tol, "log_softmax");
		expect_within(&pg, "dx", dx, tol, tol * (double)mag, "softmax_backward");
		prog_finish(&pg);
	}
}
END_TEST

START_TEST(cross_entropy_and_its_backward)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F64, RP_DTYPE_F32 };
	enum { R = 6, V = 50 };
	struct tl_rng r;

	tl_rng_init(&r, 14);
	for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
		const enum rp_dtype dt = dts[di];
		const char *d = rp_dtype_name(dt);
		const double tol = composite_tol(dt);
		long double loss[R], lse[R], dl[R * V];
		int target[R];
		struct jb j = { .n = 0 };
		struct prog pg;

		jb_add(&j, "{\"tensors\": ["
			   "{\"name\": \"logits\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [6, 50]},"
			   "{\"name\": \"target\", \"kind\": \"input\", \"dtype\": \"i64\", \"shape\": [6]},"
			   "{\"name\": \"dloss\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [6]},"
			   "{\"name\": \"loss\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [6]},"
			   "{\"name\": \"lse\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [6]},"
			   "{\"name\": \"dlogits\", \"kind\": \"output\", \"dtype\": \"%s\", \"shape\": [6, 50]}],"
			   "\"nodes\": ["
			   "{\"op\": \"cross_entropy\", \"inputs\": [\"logits\", \"target\"], \"outputs\": [\"loss\", \"lse\"]},"
			   "{\"op\": \"cross_entropy_backward\", \"inputs\": [\"dloss\", \"logits\", \"target\", \"lse\"], "
			   "\"outputs\": [\"dlogits\"]}]}",
		       d, d, d, d, d);
		prog_define(&pg, j.s);
		fill_uniform(&pg, "logits", &r, -8, 8);
		fill_uniform(&pg, "dloss", &r, 0.5, 1.5);
		for (int i = 0; i < R; i++)
			target[i] = (int)set(&pg, "target", i, i == 2 ? -100 : (double)tl_rng_int(&r, 0, V - 1));
		for (int i = 0; i < R; i++) {
			long double m = -INFINITY, s = 0;

			for (int c = 0; c < V; c++)
				m = fmaxl(m, get(&pg, "logits", i * V + c));
			for (int c = 0; c < V; c++)
				s += expl(get(&pg, "logits", i * V + c) - m);
			lse[i] = m + logl(s);
			loss[i] = target[i] < 0 ? 0 : lse[i] - get(&pg, "logits", i * V + target[i]);
			for (int c = 0; c < V; c++)
				dl[i * V + c] = target[i] < 0 ? 0 : (expl(get(&pg, "logits", i * V + c) - lse[i]) - (c == target[i])) *
									     get(&pg, "dloss", i);
		}
		run_ok(&pg);
		expect_within(&pg, "lse", lse, tol, 0, "cross_entropy lse");
		/* lse - logit cancels: against lse's magnitude. */
		expect_within(&pg, "loss", loss, tol, tol * 16, "cross_entropy loss");
		expect_within(&pg, "dlogits", dl, tol, tol * 2, "cross_entropy_backward");
		prog_finish(&pg);
	}
}
END_TEST

START_TEST(adamw_matches_the_textbook_step)
{
	/* Three steps of torch.optim.AdamW's update, the step count a scalar
	 * bound per Run, against the textbook formulas in long double (bias
	 * corrections applied to m and v) whose state is stored in the
	 * dtype after each step as the program's is. */
	static const enum rp_dtype dts[] = { RP_DTYPE_F64, RP_DTYPE_F32 };
	enum { N = 3 * 300 };
	const long double lr = 1e-2L, b1 = 0.9L, b2 = 0.99L, eps = 1e-8L, wd = 0.1L;
	struct tl_rng r;

	tl_rng_init(&r, 15);
	for (size_t di = 0; di < sizeof(dts) / sizeof(dts[0]); di++) {
		const enum rp_dtype dt = dts[di];
		const char *d = rp_dtype_name(dt);
		const double tol = composite_tol(dt);
		static long double p[N], m[N], v[N];
		struct jb j = { .n = 0 };
		struct prog pg;

		jb_add(&j, "{\"tensors\": ["
			   "{\"name\": \"p\", \"kind\": \"inout\", \"dtype\": \"%s\", \"shape\": [3, 300]},"
			   "{\"name\": \"g\", \"kind\": \"input\", \"dtype\": \"%s\", \"shape\": [3, 300]},"
			   "{\"name\": \"m\", \"kind\": \"inout\", \"dtype\": \"%s\", \"shape\": [3, 300]},"
			   "{\"name\": \"v\", \"kind\": \"inout\", \"dtype\": \"%s\", \"shape\": [3, 300]},"
			   "{\"name\": \"step\", \"kind\": \"scalar\"}],"
			   "\"nodes\": [{\"op\": \"adamw\", \"inputs\": [\"p\", \"g\", \"m\", \"v\"], \"outputs\": [], "
			   "\"attrs\": {\"lr\": 1e-2, \"beta1\": 0.9, \"beta2\": 0.99, \"eps\": 1e-8, "
			   "\"weight_decay\": 0.1, \"step\": \"step\"}}]}",
		       d, d, d, d);
		prog_define(&pg, j.s);
		ck_assert(pg.def.updates_in_place);
		fill_uniform(&pg, "p", &r, -1, 1);
		for (int l = 0; l < N; l++) {
			p[l] = get(&pg, "p", l);
			m[l] = set(&pg, "m", l, 0);
			v[l] = set(&pg, "v", l, 0);
		}
		for (int t = 1; t <= 3; t++) {
			fill_uniform(&pg, "g", &r, -1, 1);
			set_scalar(&pg, "step", t);
			for (int l = 0; l < N; l++) {
				const long double g = get(&pg, "g", l);

				p[l] *= 1 - lr * wd;
				m[l] = stored(dt, b1 * m[l] + (1 - b1) * g);
				v[l] = stored(dt, b2 * v[l] + (1 - b2) * g * g);
				const long double mh = m[l] / (1 - powl(b1, t)), vh = v[l] / (1 - powl(b2, t));
				p[l] = stored(dt, p[l] - lr * mh / (sqrtl(vh) + eps));
			}
			run_ok(&pg);
			/* m + (1 - b1)(g - m) and b2 v + (1 - b2) g^2: their errors
			 * are against the terms, (1 - b) |g| at most. */
			expect_within(&pg, "m", m, tol, tol * (double)(1 - b1), "adamw exp_avg");
			expect_within(&pg, "v", v, tol, tol * (double)(1 - b2), "adamw exp_avg_sq");
			/* The update's own error is relative to lr. */
			expect_within(&pg, "p", p, tol, tol * (double)lr * 4, "adamw param");
			/* Carry on from what the program stored. */
			for (int l = 0; l < N; l++) {
				p[l] = get(&pg, "p", l);
				m[l] = get(&pg, "m", l);
				v[l] = get(&pg, "v", l);
			}
		}
		prog_finish(&pg);
	}
}
END_TEST

START_TEST(rotary_and_its_backward)
{
	/* Rotate-half over x [B, S, H, D] ("bshd"): out = (x1 cos - x2 sin,
	 * x2 cos + x1 sin), and the backward rotating back. */
	enum { B = 2, S = 3, NH = 2, D = 8, HALF = D / 2, N = B * S * NH * D };
	struct prog pg;
	struct tl_rng r;
	long double out[N], dx[N];

	tl_rng_init(&r, 17);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [2, 3, 2, 8]},"
			 "{\"name\": \"g\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [2, 3, 2, 8]},"
			 "{\"name\": \"cos\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [3, 4]},"
			 "{\"name\": \"sin\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [3, 4]},"
			 "{\"name\": \"out\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [2, 3, 2, 8]},"
			 "{\"name\": \"dx\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [2, 3, 2, 8]}],"
			 "\"nodes\": ["
			 "{\"op\": \"rotary\", \"inputs\": [\"x\", \"cos\", \"sin\"], \"outputs\": [\"out\"]},"
			 "{\"op\": \"rotary_backward\", \"inputs\": [\"g\", \"cos\", \"sin\"], \"outputs\": [\"dx\"]}]}");
	fill_uniform(&pg, "x", &r, -2, 2);
	fill_uniform(&pg, "g", &r, -2, 2);
	for (int sq = 0; sq < S; sq++)
		for (int i = 0; i < HALF; i++) {
			const double th = tl_rng_uniform(&r, -3.2, 3.2);
			set(&pg, "cos", sq * HALF + i, cos(th));
			set(&pg, "sin", sq * HALF + i, sin(th));
		}
	for (int l = 0; l < N; l += D) {
		const int sq = (l / (NH * D)) % S;

		for (int i = 0; i < HALF; i++) {
			const long double c = get(&pg, "cos", sq * HALF + i), sn = get(&pg, "sin", sq * HALF + i);
			const long double x1 = get(&pg, "x", l + i), x2 = get(&pg, "x", l + HALF + i);
			const long double g1 = get(&pg, "g", l + i), g2 = get(&pg, "g", l + HALF + i);

			out[l + i] = x1 * c - x2 * sn;
			out[l + HALF + i] = x2 * c + x1 * sn;
			dx[l + i] = g1 * c + g2 * sn;
			dx[l + HALF + i] = g2 * c - g1 * sn;
		}
	}
	run_ok(&pg);
	/* Two products and a sum in f32: against the terms, |x| <= 2. */
	expect_within(&pg, "out", out, 1e-6, 4e-7, "rotary");
	expect_within(&pg, "dx", dx, 1e-6, 4e-7, "rotary_backward");
	prog_finish(&pg);
}
END_TEST

START_TEST(sgd_with_momentum_matches_torch)
{
	/* torch.optim.SGD, momentum 0.9, dampening 0, weight decay and
	 * Nesterov, three steps in f64 against long double. */
	enum { N = 500 };
	const long double lr = 0.05L, mom = 0.9L, wd = 0.01L;
	struct prog pg;
	struct tl_rng r;
	long double p[N], buf[N];

	tl_rng_init(&r, 18);
	prog_define(&pg, "{\"tensors\": ["
			 "{\"name\": \"p\", \"kind\": \"inout\", \"dtype\": \"f64\", \"shape\": [500]},"
			 "{\"name\": \"g\", \"kind\": \"input\", \"dtype\": \"f64\", \"shape\": [500]},"
			 "{\"name\": \"buf\", \"kind\": \"inout\", \"dtype\": \"f64\", \"shape\": [500]},"
			 "{\"name\": \"lr\", \"kind\": \"scalar\"}],"
			 "\"nodes\": [{\"op\": \"sgd\", \"inputs\": [\"p\", \"g\", \"buf\"], \"outputs\": [], "
			 "\"attrs\": {\"lr\": \"lr\", \"momentum\": 0.9, \"weight_decay\": 0.01, \"nesterov\": true}}]}");
	fill_uniform(&pg, "p", &r, -1, 1);
	for (int l = 0; l < N; l++) {
		p[l] = get(&pg, "p", l);
		buf[l] = set(&pg, "buf", l, 0);
	}
	set_scalar(&pg, "lr", (double)lr);
	for (int t = 0; t < 3; t++) {
		fill_uniform(&pg, "g", &r, -1, 1);
		for (int l = 0; l < N; l++) {
			const long double g = get(&pg, "g", l) + wd * p[l];

			buf[l] = mom * buf[l] + g;
			p[l] -= lr * (g + mom * buf[l]);
		}
		run_ok(&pg);
		expect_within(&pg, "buf", buf, 1e-12, 1e-12, "sgd momentum_buffer");
		expect_within(&pg, "p", p, 1e-12, 1e-13, "sgd param");
	}
	prog_finish(&pg);
}
END_TEST

/* ---- scratch and counters -------------------------------------------------------------- */

START_TEST(scratch_is_bounded_counted_and_given_back)
{
	static const char *def = "{\"tensors\": ["
				 "{\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"f32\", \"shape\": [64, 64]},"
				 "{\"name\": \"t\", \"kind\": \"intermediate\", \"dtype\": \"f32\", \"shape\": [64, 64]},"
				 "{\"name\": \"u\", \"kind\": \"intermediate\", \"dtype\": \"f64\", \"shape\": [64, 64]},"
				 "{\"name\": \"y\", \"kind\": \"output\", \"dtype\": \"f32\", \"shape\": [64]}],"
				 "\"nodes\": ["
				 "{\"op\": \"exp\", \"inputs\": [\"x\"], \"outputs\": [\"t\"]},"
				 "{\"op\": \"mul\", \"inputs\": [\"t\", \"x\"], \"outputs\": [\"u\"]},"
				 "{\"op\": \"sum\", \"inputs\": [\"u\"], \"outputs\": [\"y\"], \"attrs\": {\"axis\": \"leading\"}}]}";
	struct rp_error err = { 0 };
	struct prog pg;
	uint64_t used0, used, base;

	/* 16 KiB + 32 KiB of intermediates and a leading sum's accumulators
	 * do not fit 32 KiB. */
	H.dev.max_scratch = 32 << 10;
	ck_assert_int_eq(define(&pg, def, &err), -E2BIG);
	ck_assert_str_eq(err.name, RP_ERR_LIMIT_EXCEEDED);
	ck_assert_str_eq(err_param(&err, "resource"), "scratch");
	ck_assert_msg(strstr(err_message(&err), "max_scratch"), "%s", err_message(&err));
	rp_error_clear(&err);
	rp_program_finish(&pg.def);
	cJSON_Delete(pg.json);

	H.dev.max_scratch = 1 << 20;
	H.dev.backend->memory(&H.dev, &used0, &base);
	prog_define(&pg, def);
	ck_assert_uint_eq(pg.rp->kernels, 3);
	ck_assert_str_eq(pg.rp->not_captured, "host backend: no graphs");
	ck_assert_uint_eq(pg.rp->stream_runs, 0);
	fill_uniform(&pg, "x", tl_rand(), -1, 1);
	run_ok(&pg);
	run_ok(&pg);
	ck_assert_uint_eq(pg.rp->stream_runs, 2);
	ck_assert_uint_eq(pg.rp->stream_runs, 2);
	ck_assert_uint_eq(pg.rp->graph_launches, 0);
	ck_assert_uint_ge(pg.rp->scratch_bytes, (64 * 64) * (4 + 8));
	ck_assert_uint_le(pg.rp->scratch_bytes, 1 << 20);
	H.dev.backend->memory(&H.dev, &used, &base);
	ck_assert_uint_eq(used - used0, pg.rp->scratch_bytes);

	long double ref[64];
	for (int c = 0; c < 64; c++) {
		ref[c] = 0;
		for (int i = 0; i < 64; i++) {
			const double xv = get(&pg, "x", i * 64 + c);
			ref[c] += stored(RP_DTYPE_F32, expl(xv)) * xv;
		}
	}
	expect_close(&pg, "y", ref, 1e-12, "exp, mul, sum through the arena");
	prog_finish(&pg);
	H.dev.backend->memory(&H.dev, &used, &base);
	ck_assert_uint_eq(used, used0);
}
END_TEST

Suite *host_program_suite(void);

Suite *host_program_suite(void)
{
	Suite *s = suite_create("host_program");
	TCase *tc = tcase_create("programs");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, every_pointwise_op_matches_long_double);
	tcase_add_test(tc, reference_gradients_are_derivatives);
	tcase_add_test(tc, pointwise_mixed_dtypes_and_casts);
	tcase_add_test(tc, broadcasting_and_constants);
	tcase_add_test(tc, in_place_updates_read_before_they_write);
	tcase_add_test(tc, views_transpose_slice_and_stride_zero);
	tcase_add_test(tc, a_chain_through_intermediates_of_every_width);
	tcase_add_test(tc, dropout_mask_drops_a_fraction_p);
	tcase_add_test(tc, dropout_mask_indexes_its_output_row_major);
	tcase_add_test(tc, dropout_masks_differ_by_seed_and_stream_and_repeat);
	tcase_add_test(tc, every_reduction_both_axes);
	tcase_add_test(tc, embedding_and_its_backward);
	tcase_add_test(tc, an_index_out_of_range_refuses_the_run_before_any_write);
	tcase_add_test(tc, an_index_a_node_computes_is_checked_before_its_gather);
	tcase_add_test(tc, a_bad_fp8_scale_refuses_the_run_by_name);
	tcase_add_test(tc, mlp_forward_and_backward);
	tcase_add_test(tc, attention_lengths_are_checked_with_the_tensors_names);
	tcase_add_test(tc, memory_gone_under_a_run_is_named);
	tcase_add_test(tc, runs_on_two_lanes_keep_their_intermediates_apart);
	tcase_add_test(tc, rms_norm_and_its_backward);
	tcase_add_test(tc, softmaxes_and_softmax_backward);
	tcase_add_test(tc, cross_entropy_and_its_backward);
	tcase_add_test(tc, adamw_matches_the_textbook_step);
	tcase_add_test(tc, rotary_and_its_backward);
	tcase_add_test(tc, sgd_with_momentum_matches_torch);
	tcase_add_test(tc, scratch_is_bounded_counted_and_given_back);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	tl_rand_init();
	return unit_run(host_program_suite());
}
