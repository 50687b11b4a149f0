/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend's reference math, checked against double precision.
 *
 * Every run draws fresh random inputs (the seed is printed at start and in
 * every failure; REGEN_TEST_SEED=<n> replays one). Inputs are rounded to
 * their storage type first and the double reference computes from exactly
 * those stored values, so what the tolerances measure is the f32
 * accumulation and the output's rounding, nothing else.
 *
 * Outputs are poisoned with NaN before each call: afterwards every element
 * inside the shape must hold a number and every padding element between
 * rows must still hold the poison, i.e. was never written. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/backend/host/math.h"
#include "proto/errors.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"
#include "tests/lib/reference.h"
#include "unit.h"

/* ---- tensors with padding ----------------------------------------------- */

/* Expected relative error of a result stored in dt (f32 accumulation in
 * every case; the half types add their rounding of the output). */
static double dt_tol(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F32 ? 1e-5 : dt == RP_DTYPE_F16 ? 2e-3 : 1e-2;
}

struct tens {
	struct rp_operand op;
	void *buf;
	size_t len;             /* elements in buf */
	unsigned char *inside;  /* per buf element: inside the shape */
	int64_t numel;
};

/* A tensor of `shape` whose every dimension but the last is padded by
 * `pad` elements (pad 0 = contiguous). The last stride is 1 unless
 * `inner_stride` asks otherwise. */
static void tens_init(struct tens *t, enum rp_dtype dt, int rank, const int64_t *shape, int64_t pad, int64_t inner_stride)
{
	int64_t span = 1, extent = 0;

	memset(t, 0, sizeof(*t));
	t->op.dtype = dt;
	t->op.rank = rank;
	t->op.buffer.kind = RP_ID_BUFFER;
	t->numel = 1;
	for (int d = rank - 1; d >= 0; d--) {
		t->op.shape[d] = shape[d];
		t->op.strides[d] = d == rank - 1 ? inner_stride : span + pad;
		span = t->op.strides[d] * shape[d];
		extent += (shape[d] - 1) * t->op.strides[d];
		t->numel *= shape[d];
	}
	/* A trailing pad too, so a write one row past the end shows. */
	t->len = (size_t)(extent + 1 + pad);
	t->buf = malloc(t->len * rp_dtype_size(dt));
	t->inside = calloc(t->len, 1);
	ck_assert(t->buf && t->inside);
	for (int64_t l = 0; l < t->numel; l++) {
		int64_t rem = l, phys = 0;
		for (int d = rank - 1; d >= 0; d--) {
			phys += (rem % shape[d]) * t->op.strides[d];
			rem /= shape[d];
		}
		t->inside[phys] = 1;
	}
}

static void tens_finish(struct tens *t)
{
	free(t->buf);
	free(t->inside);
}

/* Physical element index of the logical (row-major) index l. */
static int64_t tens_phys(const struct tens *t, int64_t l)
{
	int64_t phys = 0;

	for (int d = t->op.rank - 1; d >= 0; d--) {
		phys += (l % t->op.shape[d]) * t->op.strides[d];
		l /= t->op.shape[d];
	}
	return phys;
}

static double tens_get_phys(const struct tens *t, int64_t phys)
{
	return tl_load(t->op.dtype, t->buf, (size_t)phys);
}

static double tens_get(const struct tens *t, int64_t l)
{
	return tens_get_phys(t, tens_phys(t, l));
}

static void tens_set(struct tens *t, int64_t l, double v)
{
	tl_store(t->op.dtype, t->buf, (size_t)tens_phys(t, l), v);
}

/* The NaN every output element starts as; padding must keep exactly it. */
static void tens_poison(struct tens *t)
{
	tl_poison(t->op.dtype, t->buf, t->len);
}

static bool tens_is_poison(const struct tens *t, size_t e)
{
	return tl_is_poison(t->op.dtype, t->buf, e);
}

/* The logical elements as doubles, for the references (malloc'ed). */
static double *tens_values(const struct tens *t)
{
	double *v = malloc((size_t)(t->numel + 1) * sizeof(double));

	ck_assert(v);
	for (int64_t l = 0; l < t->numel; l++) {
		v[l] = tens_get(t, l);
	}
	return v;
}

/* Poisoned padding, random values in [-1, 1) inside (stored rounded). */
static void tens_random(struct tens *t, struct tl_rng *r)
{
	tens_poison(t);
	for (int64_t l = 0; l < t->numel; l++) {
		tens_set(t, l, tl_rng_uniform(r, -1.0, 1.0));
	}
}

/* Every element inside the shape written (not NaN), all padding intact. */
static void tens_check_written(const struct tens *t, const char *what)
{
	for (size_t e = 0; e < t->len; e++) {
		if (t->inside[e]) {
			ck_assert_msg(!isnan(tens_get_phys(t, (int64_t)e)),
				      "%s: element at %zu was not written (seed %llu)", what, e, (unsigned long long)tl_seed());
		} else {
			ck_assert_msg(tens_is_poison(t, e),
				      "%s: padding element %zu was overwritten (seed %llu)", what, e, (unsigned long long)tl_seed());
		}
	}
}

/* ||out - ref|| / ||ref|| over the logical elements. */
static double tens_rel_err(const struct tens *t, const double *ref)
{
	double *got = tens_values(t), err = tl_rel_error(got, ref, (size_t)t->numel);

	free(got);
	return err;
}

/* ---- GEMM ----------------------------------------------------------------- */

struct gemm_case {
	int64_t m, n, k;
	bool ta, tb;
	enum rp_dtype in, out;
	bool with_c, c_is_d, with_bias;
	enum rp_epilogue epilogue;     /* dgelu takes an aux shaped like d */
	double alpha, beta;
	int64_t pad;            /* leading-dimension padding of every operand */
	int64_t inner_stride;   /* 1, or more to exercise general strides */
};

/* Puts tensor t in slot of a call, with its base pointer. */
static void gemm_operand(struct rp_compute *call, void **p, int slot, const struct tens *t)
{
	call->operands[slot] = t->op;
	call->present[slot] = true;
	p[slot] = t->buf;
}

/* Runs one case and returns the relative error; asserts on the way that
 * every output element was written and no padding was. */
static double run_gemm(const struct gemm_case *gc, struct tl_rng *r)
{
	struct tens a, b, c, d, bias, aux;
	struct rp_compute call = { .spec = &rp_op_gemm };
	struct rp_gemm *g = &call.gemm;
	void *p[RP_OP_OPERANDS_MAX] = { 0 };
	int64_t ashape[2] = { gc->ta ? gc->k : gc->m, gc->ta ? gc->m : gc->k };
	int64_t bshape[2] = { gc->tb ? gc->n : gc->k, gc->tb ? gc->k : gc->n };
	int64_t dshape[2] = { gc->m, gc->n };
	double *av, *bv, *biasv, *ref, *cval = NULL, *auxv = NULL, err;

	tens_init(&a, gc->in, 2, ashape, gc->pad, gc->inner_stride);
	tens_init(&b, gc->in, 2, bshape, gc->pad + 1, gc->inner_stride);
	tens_init(&d, gc->out, 2, dshape, gc->pad + 2, gc->inner_stride);
	tens_init(&c, gc->out, 2, dshape, gc->pad + 3, gc->inner_stride);
	tens_init(&bias, gc->out, 1, &dshape[1], 0, gc->inner_stride);
	tens_init(&aux, gc->out, 2, dshape, gc->pad + 4, gc->inner_stride);
	tens_random(&a, r);
	tens_random(&b, r);
	tens_random(&c, r);
	tens_random(&bias, r);
	/* A pre-activation across GELU's bend and into both tails, where its
	 * slope passes 0 (about -0.75), peaks (about 1.13 at 1.5) and levels. */
	tens_poison(&aux);
	for (int64_t l = 0; l < aux.numel; l++) {
		tens_set(&aux, l, tl_rng_uniform(r, -5.0, 5.0));
	}
	tens_poison(&d);

	ref = calloc((size_t)(gc->m * gc->n), sizeof(double));
	ck_assert(ref);

	gemm_operand(&call, p, RP_GEMM_A, &a);
	gemm_operand(&call, p, RP_GEMM_B, &b);
	gemm_operand(&call, p, RP_GEMM_D, &d);
	g->trans_a = gc->ta;
	g->trans_b = gc->tb;
	g->alpha = gc->alpha;
	g->beta = gc->beta;
	g->epilogue = gc->epilogue;
	g->m = gc->m;
	g->n = gc->n;
	g->k = gc->k;
	if (gc->with_c) {
		if (gc->c_is_d) {
			/* C lives in D's memory: fill D's elements with C's
			 * values (padding stays poisoned). */
			for (int64_t l = 0; l < d.numel; l++) {
				tens_set(&d, l, tens_get(&c, l));
			}
			gemm_operand(&call, p, RP_GEMM_C, &d);
		} else {
			gemm_operand(&call, p, RP_GEMM_C, &c);
		}
		cval = tens_values(&c);
	}
	if (gc->with_bias) {
		gemm_operand(&call, p, RP_GEMM_BIAS, &bias);
	}
	if (gc->epilogue == RP_EPILOGUE_DGELU) {
		gemm_operand(&call, p, RP_GEMM_AUX, &aux);
		auxv = tens_values(&aux);
	}

	av = tens_values(&a);
	bv = tens_values(&b);
	biasv = tens_values(&bias);
	tl_gemm_ref(&(struct tl_gemm){ .m = gc->m, .n = gc->n, .k = gc->k, .trans_a = gc->ta, .trans_b = gc->tb,
				       .alpha = gc->alpha, .beta = gc->beta, .epilogue = gc->epilogue, .aux = auxv },
		    av, bv, cval,
		    gc->epilogue == RP_EPILOGUE_BIAS || gc->epilogue == RP_EPILOGUE_GELU_BIAS ? biasv : NULL, ref, NULL);

	ck_assert_int_eq(rd_host_run(&call, p, NULL, 0), 0);
	tens_check_written(&d, "gemm d");
	err = tens_rel_err(&d, ref);
	if (auxv != NULL) {
		/* An input: read, never written. */
		for (int64_t l = 0; l < aux.numel; l++) {
			ck_assert(tens_get(&aux, l) == auxv[l]);
		}
		for (size_t e = 0; e < aux.len; e++) {
			ck_assert(aux.inside[e] || tens_is_poison(&aux, e));
		}
	}

	free(ref);
	free(cval);
	free(av);
	free(bv);
	free(biasv);
	free(auxv);
	tens_finish(&aux);
	tens_finish(&a);
	tens_finish(&b);
	tens_finish(&c);
	tens_finish(&d);
	tens_finish(&bias);
	return err;
}

static void check_gemm(const struct gemm_case *gc, struct tl_rng *r, double tol)
{
	double err = run_gemm(gc, r);

	ck_assert_msg(err <= tol,
		      "gemm m=%lld n=%lld k=%lld ta=%d tb=%d %s->%s c=%d c_is_d=%d bias=%d epilogue=%d "
		      "alpha=%g beta=%g pad=%lld: relative error %.3g > %.3g (seed %llu)",
		      (long long)gc->m, (long long)gc->n, (long long)gc->k, gc->ta, gc->tb,
		      rp_dtype_name(gc->in), rp_dtype_name(gc->out), gc->with_c, gc->c_is_d, gc->with_bias, gc->epilogue,
		      gc->alpha, gc->beta, (long long)gc->pad, err, tol, (unsigned long long)tl_seed());
}

START_TEST(gemm_every_transpose_and_dtype)
{
	/* op(A) op(B) for all four transpose combinations and every
	 * storage pairing the descriptor allows (a, b share one dtype; d
	 * may be wider). Sizes cross the kernel's row and panel blocks. */
	static const enum rp_dtype pairs[][2] = {
		{ RP_DTYPE_F32, RP_DTYPE_F32 }, { RP_DTYPE_F16, RP_DTYPE_F16 }, { RP_DTYPE_BF16, RP_DTYPE_BF16 },
		{ RP_DTYPE_F16, RP_DTYPE_F32 }, { RP_DTYPE_BF16, RP_DTYPE_F32 },
	};
	struct tl_rng r;

	tl_rng_init(&r, 1);
	for (size_t pi = 0; pi < sizeof(pairs) / sizeof(pairs[0]); pi++) {
		for (int t = 0; t < 4; t++) {
			struct gemm_case gc = {
				.m = tl_rng_int(&r, 1, 37), .n = tl_rng_int(&r, 1, 300), .k = tl_rng_int(&r, 1, 90),
				.ta = t & 1, .tb = t >> 1, .in = pairs[pi][0], .out = pairs[pi][1],
				.alpha = 1.0, .inner_stride = 1,
			};
			check_gemm(&gc, &r, dt_tol(gc.out));
		}
	}
}
END_TEST

START_TEST(gemm_alpha_beta_with_c)
{
	/* D = alpha op(A) op(B) + beta C, C in its own buffer and, as the
	 * protocol allows, C aliasing D exactly (read before written). */
	struct tl_rng r;

	tl_rng_init(&r, 2);
	for (int alias = 0; alias < 2; alias++) {
		for (int dt = 0; dt < RP_DTYPE_FLOATS; dt++) {
			struct gemm_case gc = {
				.m = tl_rng_int(&r, 2, 40), .n = tl_rng_int(&r, 2, 200), .k = tl_rng_int(&r, 2, 64),
				.ta = tl_rng_int(&r, 0, 1), .tb = tl_rng_int(&r, 0, 1), .in = dt, .out = dt,
				.with_c = true, .c_is_d = alias,
				.alpha = tl_rng_uniform(&r, -2.0, 2.0), .beta = tl_rng_uniform(&r, 0.25, 1.5),
				.pad = tl_rng_int(&r, 0, 5), .inner_stride = 1,
			};
			check_gemm(&gc, &r, dt_tol(gc.out));
		}
	}
}
END_TEST

START_TEST(gemm_beta_zero_ignores_c)
{
	/* beta = 0 means C is not read at all (as in BLAS): NaN in C must
	 * not leak into D. */
	float a[4] = { 1, 2, 3, 4 }, b[4] = { 1, 0, 0, 1 }, c[4], d[4];
	const struct rp_operand m2 = { .dtype = RP_DTYPE_F32, .rank = 2, .shape = { 2, 2 }, .strides = { 2, 1 } };
	struct rp_compute call = {
		.spec = &rp_op_gemm,
		.operands = { [RP_GEMM_A] = m2, [RP_GEMM_B] = m2, [RP_GEMM_C] = m2, [RP_GEMM_D] = m2 },
		.present = { [RP_GEMM_A] = true, [RP_GEMM_B] = true, [RP_GEMM_C] = true, [RP_GEMM_D] = true },
		.gemm = { .alpha = 1.0, .beta = 0.0, .m = 2, .n = 2, .k = 2 },
	};
	void *p[RP_OP_OPERANDS_MAX] = { [RP_GEMM_A] = a, [RP_GEMM_B] = b, [RP_GEMM_C] = c, [RP_GEMM_D] = d };

	for (int e = 0; e < 4; e++) {
		c[e] = NAN;
	}
	ck_assert_int_eq(rd_host_run(&call, p, NULL, 0), 0);
	for (int e = 0; e < 4; e++) {
		ck_assert_float_eq(d[e], a[e]);
	}
}
END_TEST

START_TEST(gemm_bias_and_gelu_epilogues)
{
	/* Epilogues in cuBLASLt's order: + bias, then GELU (tanh form). */
	static const enum rp_epilogue epis[] = {
		RP_EPILOGUE_NONE, RP_EPILOGUE_BIAS, RP_EPILOGUE_GELU, RP_EPILOGUE_GELU_BIAS,
	};
	struct tl_rng r;

	tl_rng_init(&r, 3);
	for (size_t e = 0; e < 4; e++) {
		for (int dt = 0; dt < RP_DTYPE_FLOATS; dt++) {
			struct gemm_case gc = {
				.m = tl_rng_int(&r, 1, 30), .n = tl_rng_int(&r, 1, 150), .k = tl_rng_int(&r, 1, 50),
				.ta = tl_rng_int(&r, 0, 1), .tb = tl_rng_int(&r, 0, 1), .in = dt, .out = dt,
				.with_c = true, .beta = 0.5, .alpha = 1.5,
				.with_bias = epis[e] == RP_EPILOGUE_BIAS || epis[e] == RP_EPILOGUE_GELU_BIAS,
				.epilogue = epis[e], .pad = 2, .inner_stride = 1,
			};
			check_gemm(&gc, &r, dt_tol(gc.out));
		}
	}
}
END_TEST

START_TEST(dgelu_reference_is_gelus_slope)
{
	/* The double reference's derivative against a central difference of
	 * the GELU it differentiates, and at x = 1 against its value written
	 * down once (so that the formula cannot drift with the difference). */
	struct tl_rng r;

	tl_rng_init(&r, 5);
	for (int i = 0; i < 1000; i++) {
		const double x = tl_rng_uniform(&r, -8.0, 8.0), h = 1e-5;
		const double numeric = (tl_gelu_tanh(x + h) - tl_gelu_tanh(x - h)) / (2 * h);

		ck_assert_msg(fabs(tl_dgelu_tanh(x) - numeric) < 1e-8, "x=%.17g: %.17g vs %.17g (seed %llu)", x,
			      tl_dgelu_tanh(x), numeric, (unsigned long long)tl_seed());
	}
	ck_assert(fabs(tl_dgelu_tanh(1.0) - 1.0829640838457826) < 1e-12);
}
END_TEST

START_TEST(gemm_dgelu_epilogue)
{
	/* D = (alpha op(A) op(B) + beta C) * GELU'(aux): every storage pairing
	 * (aux has d's dtype), with and without C, C aliasing D, padded
	 * leading dimensions on every operand and aux, transposes at random. */
	static const enum rp_dtype pairs[][2] = {
		{ RP_DTYPE_F32, RP_DTYPE_F32 }, { RP_DTYPE_F16, RP_DTYPE_F16 }, { RP_DTYPE_BF16, RP_DTYPE_BF16 },
		{ RP_DTYPE_F16, RP_DTYPE_F32 }, { RP_DTYPE_BF16, RP_DTYPE_F32 },
	};
	struct tl_rng r;

	tl_rng_init(&r, 6);
	for (size_t pi = 0; pi < sizeof(pairs) / sizeof(pairs[0]); pi++) {
		for (int cmode = 0; cmode < 3; cmode++) {
			struct gemm_case gc = {
				.m = tl_rng_int(&r, 1, 33), .n = tl_rng_int(&r, 1, 290), .k = tl_rng_int(&r, 1, 70),
				.ta = tl_rng_int(&r, 0, 1), .tb = tl_rng_int(&r, 0, 1), .in = pairs[pi][0],
				.out = pairs[pi][1], .with_c = cmode > 0, .c_is_d = cmode == 2,
				.alpha = tl_rng_uniform(&r, -2.0, 2.0), .beta = cmode > 0 ? tl_rng_uniform(&r, 0.25, 1.5) : 0.0,
				.epilogue = RP_EPILOGUE_DGELU, .pad = tl_rng_int(&r, 0, 5), .inner_stride = 1,
			};
			check_gemm(&gc, &r, dt_tol(gc.out));
		}
	}
}
END_TEST

START_TEST(gemm_strided_operands)
{
	/* Padded leading dimensions on every operand, and, though the
	 * protocol requires a last stride of 1, general strides too: the
	 * reference must not depend on the validator for correctness. */
	struct tl_rng r;

	tl_rng_init(&r, 4);
	for (int inner = 1; inner <= 3; inner++) {
		for (int t = 0; t < 4; t++) {
			struct gemm_case gc = {
				.m = tl_rng_int(&r, 1, 25), .n = tl_rng_int(&r, 1, 140), .k = tl_rng_int(&r, 1, 40),
				.ta = t & 1, .tb = t >> 1, .in = RP_DTYPE_BF16, .out = RP_DTYPE_F32,
				.with_c = true, .alpha = 0.75, .beta = -1.25, .with_bias = true,
				.epilogue = RP_EPILOGUE_BIAS, .pad = tl_rng_int(&r, 1, 9), .inner_stride = inner,
			};
			check_gemm(&gc, &r, dt_tol(gc.out));
		}
	}
}
END_TEST

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(gemm_512_cubed_is_fast_and_right)
{
	/* Host calls serve real clients: 512^3 in f32 must be well under a
	 * second even unoptimized-for-the-machine, and still right. */
	const int64_t n = 512;
	struct tl_rng r;
	struct tens a, b, d;
	struct rp_compute call = { .spec = &rp_op_gemm, .gemm = { .alpha = 1.0, .m = n, .n = n, .k = n } };
	void *p[RP_OP_OPERANDS_MAX] = { 0 };
	int64_t shape[2] = { n, n };
	double *av, *bv, *ref, t0, dt;

	tl_rng_init(&r, 5);
	tens_init(&a, RP_DTYPE_F32, 2, shape, 0, 1);
	tens_init(&b, RP_DTYPE_F32, 2, shape, 0, 1);
	tens_init(&d, RP_DTYPE_F32, 2, shape, 0, 1);
	tens_random(&a, &r);
	tens_random(&b, &r);
	tens_poison(&d);
	gemm_operand(&call, p, RP_GEMM_A, &a);
	gemm_operand(&call, p, RP_GEMM_B, &b);
	gemm_operand(&call, p, RP_GEMM_D, &d);

	t0 = now_s();
	ck_assert_int_eq(rd_host_run(&call, p, NULL, 0), 0);
	dt = now_s() - t0;
	printf("host GEMM 512x512x512 f32: %.1f ms\n", dt * 1e3);

	av = tens_values(&a);
	bv = tens_values(&b);
	ref = malloc((size_t)(n * n) * sizeof(double));
	ck_assert(ref);
	tl_gemm_ref(&(struct tl_gemm){ .m = n, .n = n, .k = n, .alpha = 1.0 }, av, bv, NULL, NULL, ref, NULL);
	tens_check_written(&d, "gemm 512");
	ck_assert_double_le(tens_rel_err(&d, ref), 1e-5);
	ck_assert_msg(dt < 1.0, "512^3 host GEMM took %.3f s (seed %llu)", dt, (unsigned long long)tl_seed());

	free(ref);
	free(av);
	free(bv);
	tens_finish(&a);
	tens_finish(&b);
	tens_finish(&d);
}
END_TEST

struct gemm_thread {
	uint64_t salt;
	double err;
};

static void *gemm_thread_main(void *arg)
{
	struct gemm_thread *t = arg;
	struct tl_rng r;

	tl_rng_init(&r, t->salt);
	struct gemm_case gc = {
		.m = 64, .n = 96 + (int64_t)t->salt, .k = 80, .ta = t->salt & 1, .tb = (t->salt >> 1) & 1,
		.in = RP_DTYPE_F32, .out = RP_DTYPE_F32, .with_c = true, .alpha = 1.0, .beta = 1.0,
		.pad = 1, .inner_stride = 1,
	};
	t->err = 0.0;
	for (int rep = 0; rep < 4; rep++) {
		double e = run_gemm(&gc, &r);
		t->err = e > t->err ? e : t->err;
	}
	return NULL;
}

START_TEST(gemm_concurrent_threads)
{
	/* Eight lanes at once, as the integration tests' clients do: no
	 * shared state may leak between calls. */
	pthread_t th[8];
	struct gemm_thread ts[8];

	for (int t = 0; t < 8; t++) {
		ts[t].salt = 100 + (uint64_t)t;
		ck_assert_int_eq(pthread_create(&th[t], NULL, gemm_thread_main, &ts[t]), 0);
	}
	for (int t = 0; t < 8; t++) {
		ck_assert_int_eq(pthread_join(th[t], NULL), 0);
		ck_assert_msg(ts[t].err <= 1e-5, "thread %d: relative error %.3g (seed %llu)", t, ts[t].err, (unsigned long long)tl_seed());
	}
}
END_TEST

/* ---- attention -------------------------------------------------------------- */

static int64_t kv_heads(const struct tl_attention *dm)
{
	return dm->hkv ? dm->hkv : dm->h;
}

struct att_tensors {
	struct tens q, k, v, o, stats;
};

static void att_init(struct att_tensors *t, const struct tl_attention *dm, enum rp_dtype dt, int64_t pad)
{
	int64_t qs[4] = { dm->b, dm->h, dm->sq, dm->d };
	int64_t ks[4] = { dm->b, kv_heads(dm), dm->skv, dm->d };
	int64_t vs[4] = { dm->b, kv_heads(dm), dm->skv, dm->dv };
	int64_t os[4] = { dm->b, dm->h, dm->sq, dm->dv };
	int64_t ss[3] = { dm->b, dm->h, dm->sq };

	tens_init(&t->q, dt, 4, qs, pad, 1);
	tens_init(&t->k, dt, 4, ks, pad + 1, 1);
	tens_init(&t->v, dt, 4, vs, pad + 2, 1);
	tens_init(&t->o, dt, 4, os, pad + 3, 1);
	tens_init(&t->stats, RP_DTYPE_F32, 3, ss, pad, 1);
}

static void att_finish(struct att_tensors *t)
{
	tens_finish(&t->q);
	tens_finish(&t->k);
	tens_finish(&t->v);
	tens_finish(&t->o);
	tens_finish(&t->stats);
}

/* Double-precision forward from whatever q, k, v hold: o [B,H,Sq,Dv] and
 * lse [B,H,Sq] in logical order. */
static void att_forward_ref(const struct tl_attention *dm, const struct tens *q, const struct tens *k,
			    const struct tens *v, double *o, double *lse)
{
	double *qv = tens_values(q), *kv = tens_values(k), *vv = tens_values(v);

	tl_attention_ref(dm, qv, kv, vv, o, lse, NULL);
	free(qv);
	free(kv);
	free(vv);
}

static struct rp_attention att_args(const struct tl_attention *dm)
{
	return (struct rp_attention){
		.scale = dm->scale, .causal = dm->causal,
		.alignment = dm->bottom_right ? RP_CAUSAL_BOTTOM_RIGHT : RP_CAUSAL_TOP_LEFT,
		.batch = dm->b, .heads = dm->h, .heads_kv = kv_heads(dm), .seq_q = dm->sq, .seq_kv = dm->skv,
		.head_dim = dm->d, .head_dim_v = dm->dv, .padded = dm->seq_len_q != NULL,
	};
}

static void att_slot(struct rp_compute *call, void **p, int slot, const struct tens *t)
{
	call->operands[slot] = t->op;
	call->present[slot] = true;
	p[slot] = t->buf;
}

/* dm's sequence lengths, when it has them, as i32 [B] operands. */
static void att_length_slots(struct rp_compute *call, void **p, const struct tl_attention *dm, int slot_q,
			     int slot_kv)
{
	const struct rp_operand len = { .buffer.kind = RP_ID_BUFFER, .dtype = RP_DTYPE_I32, .rank = 1,
					.shape = { dm->b }, .strides = { 1 } };

	if (!dm->seq_len_q) {
		return;
	}
	call->operands[slot_q] = call->operands[slot_kv] = len;
	call->present[slot_q] = call->present[slot_kv] = true;
	p[slot_q] = (void *)dm->seq_len_q;
	p[slot_kv] = (void *)dm->seq_len_kv;
}

static void att_run_forward(const struct tl_attention *dm, struct att_tensors *t, bool with_stats)
{
	struct rp_compute call = { .spec = &rp_op_attention, .attention = att_args(dm) };
	void *p[RP_OP_OPERANDS_MAX] = { 0 };

	att_slot(&call, p, RP_ATT_Q, &t->q);
	att_slot(&call, p, RP_ATT_K, &t->k);
	att_slot(&call, p, RP_ATT_V, &t->v);
	att_slot(&call, p, RP_ATT_O, &t->o);
	if (with_stats) {
		att_slot(&call, p, RP_ATT_STATS, &t->stats);
	}
	att_length_slots(&call, p, dm, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV);
	ck_assert_int_eq(rd_host_check(&call, p, NULL), 0);
	size_t need = rd_host_scratch_size(&call);
	void *scratch = malloc(need);

	ck_assert(scratch);
	/* One float short is refused, not overrun. */
	ck_assert_int_eq(rd_host_run(&call, p, scratch, need - sizeof(float)), -ENOSPC);
	ck_assert_int_eq(rd_host_run(&call, p, scratch, need), 0);
	free(scratch);
}

/* Random q, k and v from r, in that order; o and stats poisoned. */
static void att_random(struct att_tensors *t, struct tl_rng *r)
{
	tens_random(&t->q, r);
	tens_random(&t->k, r);
	tens_random(&t->v, r);
	tens_poison(&t->o);
	tens_poison(&t->stats);
}

/* NaN in every padding row of a [B, heads, S, width] input: the reference
 * must never read one. */
static void poison_padding_rows(struct tens *t, const int32_t *len)
{
	const int64_t *sh = t->op.shape;

	for (int64_t l = 0; l < t->numel; l++) {
		int64_t row = (l / sh[3]) % sh[2], b = l / (sh[1] * sh[2] * sh[3]);
		if (row >= len[b]) {
			tens_set(t, l, NAN);
		}
	}
}

/* Rows past their entry's length hold exactly `want` (0 or -inf). */
static void check_padding_rows(const struct tens *t, const int32_t *len, int64_t width, double want, const char *what)
{
	const int64_t *sh = t->op.shape;
	const int64_t rows = sh[2], heads = sh[1];

	for (int64_t l = 0; l < t->numel; l++) {
		int64_t row = (l / width) % rows, b = l / (heads * rows * width);
		if (row >= len[b]) {
			ck_assert_msg(tens_get(t, l) == want, "%s[%lld] (entry %lld row %lld, length %d) is %g, not %g (seed %llu)",
				      what, (long long)l, (long long)b, (long long)row, (int)len[b], tens_get(t, l), want,
				      (unsigned long long)tl_seed());
		}
	}
}

/* Runs dm's forward with stats on t (inputs set, outputs poisoned) and
 * checks it against the double-precision reference: o within dt's
 * tolerance, stats to f32 accuracy (they are f32 whatever o's dtype,
 * computed from the stored inputs). With sequence lengths, the padding
 * rows hold exactly 0 in o and -inf in stats. */
static void att_check_forward(const struct tl_attention *dm, struct att_tensors *t, enum rp_dtype dt, int causal)
{
	const char *what = dm->seq_len_q ? "varlen attention" : "attention";
	double *oref = malloc((size_t)t->o.numel * sizeof(double));
	double *lref = malloc((size_t)t->stats.numel * sizeof(double));
	double err;

	ck_assert(oref && lref);
	att_forward_ref(dm, &t->q, &t->k, &t->v, oref, lref);
	att_run_forward(dm, t, true);
	if (dm->seq_len_q) {
		tens_check_written(&t->o, "varlen o");
		check_padding_rows(&t->o, dm->seq_len_q, dm->dv, 0.0, "o");
		check_padding_rows(&t->stats, dm->seq_len_q, 1, -INFINITY, "stats");
	} else {
		tens_check_written(&t->o, "attention o");
		tens_check_written(&t->stats, "attention stats");
	}
	err = tens_rel_err(&t->o, oref);
	ck_assert_msg(err <= dt_tol(dt),
		      "%s %s causal=%d B=%lld H=%lld Hkv=%lld Sq=%lld Skv=%lld D=%lld Dv=%lld: relative error %.3g "
		      "(seed %llu)", what, rp_dtype_name(dt), causal, (long long)dm->b, (long long)dm->h,
		      (long long)kv_heads(dm), (long long)dm->sq, (long long)dm->skv, (long long)dm->d, (long long)dm->dv,
		      err, (unsigned long long)tl_seed());
	/* Equal also covers a padding row's -inf. */
	for (int64_t l = 0; l < t->stats.numel; l++) {
		double got = tens_get(&t->stats, l);
		ck_assert_msg(got == lref[l] || fabs(got - lref[l]) <= 1e-5 * (1.0 + fabs(lref[l])),
			      "%s stats[%lld] = %.9g, reference %.9g (seed %llu)", what, (long long)l, got, lref[l],
			      (unsigned long long)tl_seed());
	}
	free(oref);
	free(lref);
}

START_TEST(attention_forward_matches_reference)
{
	struct tl_rng r;

	tl_rng_init(&r, 6);
	for (int dt = 0; dt < RP_DTYPE_FLOATS; dt++) {
		for (int causal = 0; causal < 3; causal++) {
			for (int shape = 0; shape < 2; shape++) {
				/* Sq < Skv and Sq > Skv (causal rows past Skv see
				 * every key), Dv != D in both; causal 2 is aligned
				 * bottom-right, which needs Sq <= Skv; the odd
				 * shapes group their query heads over fewer
				 * key/value heads. */
				if (causal == 2 && shape == 1) {
					continue;
				}
				struct tl_attention dm = {
					.b = tl_rng_int(&r, 1, 2), .hkv = tl_rng_int(&r, 1, 2),
					.sq = shape ? tl_rng_int(&r, 9, 17) : tl_rng_int(&r, 1, 8),
					.skv = shape ? tl_rng_int(&r, 1, 8) : tl_rng_int(&r, 9, 24),
					.d = tl_rng_int(&r, 8, 40), .causal = causal > 0, .bottom_right = causal == 2,
				};
				dm.h = dm.hkv * (dt % 2 ? tl_rng_int(&r, 2, 3) : 1);
				struct att_tensors t;

				dm.dv = dm.d + tl_rng_int(&r, 1, 9);
				/* Larger logits than 1/sqrt(D) make the softmax
				 * peaky, so the max subtraction matters. */
				dm.scale = tl_rng_uniform(&r, 0.5, 3.0) / sqrt((double)dm.d);
				att_init(&t, &dm, dt, tl_rng_int(&r, 0, 3));
				att_random(&t, &r);
				att_check_forward(&dm, &t, dt, causal);
				att_finish(&t);
			}
		}
	}
}
END_TEST

START_TEST(attention_forward_without_stats)
{
	/* stats is optional: NULL means none written, o still right. */
	struct tl_attention dm = { .b = 1, .h = 2, .sq = 5, .skv = 6, .d = 16, .dv = 8, .causal = true };
	struct att_tensors t;
	double oref[1 * 2 * 5 * 8], lref[10];
	struct tl_rng r;

	tl_rng_init(&r, 7);
	dm.scale = 1.0 / sqrt(16.0);
	att_init(&t, &dm, RP_DTYPE_F32, 1);
	att_random(&t, &r);
	att_forward_ref(&dm, &t.q, &t.k, &t.v, oref, lref);
	att_run_forward(&dm, &t, false);
	tens_check_written(&t.o, "attention o");
	ck_assert_double_le(tens_rel_err(&t.o, oref), 1e-5);
	for (size_t e = 0; e < t.stats.len; e++) {
		ck_assert(tens_is_poison(&t.stats, e));
	}
	att_finish(&t);
}
END_TEST

struct att_grads {
	double *dq, *dk, *dv;
};

/* Double-precision gradients of L with dL/dO = dO: softmax recomputed
 * exactly, D_i = rowsum(dO * O) from o as stored, the input the backward
 * is given. With the exact O instead, a row whose softmax has one key
 * (causal, Skv < Sq) has dP - D exactly 0 in the reference but o's
 * rounding in the backward: an error no backward could avoid. */
static void att_backward_ref(const struct tl_attention *dm, const struct tens *q, const struct tens *k,
			     const struct tens *v, const struct tens *o, const struct tens *d_o, struct att_grads *g)
{
	double *qv = tens_values(q), *kv = tens_values(k), *vv = tens_values(v), *ov = tens_values(o),
	       *dov = tens_values(d_o);

	tl_attention_backward_ref(dm, qv, kv, vv, ov, dov, g->dq, g->dk, g->dv, NULL);
	free(qv);
	free(kv);
	free(vv);
	free(ov);
	free(dov);
}

struct att_bwd_tensors {
	struct att_tensors f;
	struct tens d_o, d_q, d_k, d_v;
};

/* Forward on the host (as a client would: its o and stats feed the
 * backward), then backward; outputs poisoned first. */
static void att_run_backward(const struct tl_attention *dm, struct att_bwd_tensors *t)
{
	struct rp_compute call = { .spec = &rp_op_attention_backward, .attention = att_args(dm) };
	void *p[RP_OP_OPERANDS_MAX] = { 0 };

	att_slot(&call, p, RP_ATB_Q, &t->f.q);
	att_slot(&call, p, RP_ATB_K, &t->f.k);
	att_slot(&call, p, RP_ATB_V, &t->f.v);
	att_slot(&call, p, RP_ATB_O, &t->f.o);
	att_slot(&call, p, RP_ATB_DO, &t->d_o);
	att_slot(&call, p, RP_ATB_STATS, &t->f.stats);
	att_slot(&call, p, RP_ATB_DQ, &t->d_q);
	att_slot(&call, p, RP_ATB_DK, &t->d_k);
	att_slot(&call, p, RP_ATB_DV, &t->d_v);
	att_length_slots(&call, p, dm, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV);
	ck_assert_int_eq(rd_host_check(&call, p, NULL), 0);
	size_t need = rd_host_scratch_size(&call);
	void *scratch = malloc(need);

	ck_assert(scratch);
	tens_poison(&t->f.o);
	tens_poison(&t->f.stats);
	att_run_forward(dm, &t->f, true);
	tens_poison(&t->d_q);
	tens_poison(&t->d_k);
	tens_poison(&t->d_v);
	ck_assert_int_eq(rd_host_run(&call, p, scratch, need - 1), -ENOSPC);
	ck_assert_int_eq(rd_host_run(&call, p, scratch, need), 0);
	tens_check_written(&t->d_q, "d_q");
	tens_check_written(&t->d_k, "d_k");
	tens_check_written(&t->d_v, "d_v");
	free(scratch);
}

static void att_bwd_init(struct att_bwd_tensors *t, const struct tl_attention *dm, enum rp_dtype dt, int64_t pad)
{
	att_init(&t->f, dm, dt, pad);
	tens_init(&t->d_o, dt, 4, t->f.o.op.shape, pad + 1, 1);
	tens_init(&t->d_q, dt, 4, t->f.q.op.shape, pad + 2, 1);
	tens_init(&t->d_k, dt, 4, t->f.k.op.shape, pad + 3, 1);
	tens_init(&t->d_v, dt, 4, t->f.v.op.shape, pad + 4, 1);
}

static void att_bwd_finish(struct att_bwd_tensors *t)
{
	att_finish(&t->f);
	tens_finish(&t->d_o);
	tens_finish(&t->d_q);
	tens_finish(&t->d_k);
	tens_finish(&t->d_v);
}

/* The backward's inputs from r: q, k, v, then dO. */
static void att_bwd_random(struct att_bwd_tensors *t, struct tl_rng *r)
{
	att_random(&t->f, r);
	tens_random(&t->d_o, r);
}

/* Runs dm's backward on t (inputs set) and checks its gradients against
 * the double-precision ones; with sequence lengths, the padding rows of
 * d_q, d_k and d_v hold exactly 0. */
static void att_check_backward(const struct tl_attention *dm, struct att_bwd_tensors *t, enum rp_dtype dt, int causal)
{
	/* The gradients mix many rounded terms: twice the forward's bound. */
	const double tol = 2.0 * (dt == RP_DTYPE_F32 ? 5e-5 : dt_tol(dt));
	const char *what = dm->seq_len_q ? "varlen attention" : "attention";
	struct att_grads g;
	double edq, edk, edv;

	g.dq = malloc((size_t)t->d_q.numel * sizeof(double));
	g.dk = malloc((size_t)t->d_k.numel * sizeof(double));
	g.dv = malloc((size_t)t->d_v.numel * sizeof(double));
	ck_assert(g.dq && g.dk && g.dv);

	att_run_backward(dm, t);
	att_backward_ref(dm, &t->f.q, &t->f.k, &t->f.v, &t->f.o, &t->d_o, &g);
	if (dm->seq_len_q) {
		check_padding_rows(&t->d_q, dm->seq_len_q, dm->d, 0.0, "d_q");
		check_padding_rows(&t->d_k, dm->seq_len_kv, dm->d, 0.0, "d_k");
		check_padding_rows(&t->d_v, dm->seq_len_kv, dm->dv, 0.0, "d_v");
	}
	edq = tens_rel_err(&t->d_q, g.dq);
	edk = tens_rel_err(&t->d_k, g.dk);
	edv = tens_rel_err(&t->d_v, g.dv);
	ck_assert_msg(edq <= tol && edk <= tol && edv <= tol,
		      "%s backward %s causal=%d B=%lld H=%lld Hkv=%lld Sq=%lld Skv=%lld D=%lld Dv=%lld: relative errors "
		      "dq %.3g dk %.3g dv %.3g > %.3g (seed %llu)", what, rp_dtype_name(dt), causal, (long long)dm->b,
		      (long long)dm->h, (long long)kv_heads(dm), (long long)dm->sq, (long long)dm->skv, (long long)dm->d,
		      (long long)dm->dv, edq, edk, edv, tol, (unsigned long long)tl_seed());
	free(g.dq);
	free(g.dk);
	free(g.dv);
}

START_TEST(attention_backward_matches_reference)
{
	struct tl_rng r;

	tl_rng_init(&r, 8);
	for (int dt = 0; dt < RP_DTYPE_FLOATS; dt++) {
		for (int causal = 0; causal < 3; causal++) {
			/* causal 2: aligned bottom-right (Sq <= Skv); f16 and
			 * f32 runs group two or three query heads per k/v head. */
			struct tl_attention dm = {
				.b = tl_rng_int(&r, 1, 2), .hkv = tl_rng_int(&r, 1, 2), .sq = tl_rng_int(&r, 2, 12),
				.skv = tl_rng_int(&r, 2, 12), .d = tl_rng_int(&r, 4, 24), .causal = causal > 0,
				.bottom_right = causal == 2,
			};
			dm.h = dm.hkv * (dt != RP_DTYPE_BF16 ? tl_rng_int(&r, 2, 3) : 1);
			if (dm.bottom_right && dm.sq > dm.skv) {
				dm.skv = dm.sq + tl_rng_int(&r, 0, 4);
			}
			struct att_bwd_tensors t;

			dm.dv = tl_rng_int(&r, 4, 24);
			dm.scale = tl_rng_uniform(&r, 0.5, 2.0) / sqrt((double)dm.d);
			att_bwd_init(&t, &dm, dt, tl_rng_int(&r, 0, 2));
			att_bwd_random(&t, &r);
			att_check_backward(&dm, &t, dt, causal);
			att_bwd_finish(&t);
		}
	}
}
END_TEST

/* ---- variable sequence lengths ------------------------------------------------ */

/* Random lengths for dm's batch: some query sides empty, every entry
 * with queries given keys (and, bottom-right, no more queries than keys),
 * now and then the full length. */
static void random_lengths(struct tl_attention *dm, struct tl_rng *r, int32_t *lq, int32_t *lkv)
{
	for (int64_t b = 0; b < dm->b; b++) {
		lkv[b] = (int32_t)(tl_rng_int(r, 0, 4) == 0 ? dm->skv : tl_rng_int(r, 1, (int)dm->skv));
		lq[b] = (int32_t)(tl_rng_int(r, 0, 5) == 0 ? 0 : tl_rng_int(r, 1, (int)dm->sq));
		if (dm->bottom_right && lq[b] > lkv[b]) {
			lq[b] = lkv[b];
		}
	}
	dm->seq_len_q = lq;
	dm->seq_len_kv = lkv;
}

START_TEST(attention_varlen_forward_matches_reference)
{
	struct tl_rng r;

	tl_rng_init(&r, 10);
	for (int dt = 0; dt < RP_DTYPE_FLOATS; dt++) {
		for (int causal = 0; causal < 3; causal++) {
			/* Bottom-right with Sq > Skv too: the lengths decide. */
			struct tl_attention dm = {
				.b = tl_rng_int(&r, 2, 4), .hkv = tl_rng_int(&r, 1, 2), .sq = tl_rng_int(&r, 2, 14),
				.skv = tl_rng_int(&r, 2, 14), .d = tl_rng_int(&r, 4, 24), .causal = causal > 0,
				.bottom_right = causal == 2,
			};
			int32_t lq[4], lkv[4];
			struct att_tensors t;

			dm.h = dm.hkv * tl_rng_int(&r, 1, 3);
			dm.dv = tl_rng_int(&r, 4, 20);
			dm.scale = tl_rng_uniform(&r, 0.5, 2.5) / sqrt((double)dm.d);
			random_lengths(&dm, &r, lq, lkv);
			att_init(&t, &dm, dt, tl_rng_int(&r, 0, 3));
			att_random(&t, &r);
			poison_padding_rows(&t.q, lq);
			poison_padding_rows(&t.k, lkv);
			poison_padding_rows(&t.v, lkv);
			att_check_forward(&dm, &t, dt, causal);
			att_finish(&t);
		}
	}
}
END_TEST

START_TEST(attention_varlen_backward_matches_reference)
{
	struct tl_rng r;

	tl_rng_init(&r, 11);
	for (int dt = 0; dt < RP_DTYPE_FLOATS; dt++) {
		for (int causal = 0; causal < 3; causal++) {
			struct tl_attention dm = {
				.b = tl_rng_int(&r, 2, 4), .hkv = tl_rng_int(&r, 1, 2), .sq = tl_rng_int(&r, 2, 12),
				.skv = tl_rng_int(&r, 2, 12), .d = tl_rng_int(&r, 4, 20), .causal = causal > 0,
				.bottom_right = causal == 2,
			};
			int32_t lq[4], lkv[4];
			struct att_bwd_tensors t;

			dm.h = dm.hkv * tl_rng_int(&r, 1, 3);
			dm.dv = tl_rng_int(&r, 4, 20);
			dm.scale = tl_rng_uniform(&r, 0.5, 2.0) / sqrt((double)dm.d);
			random_lengths(&dm, &r, lq, lkv);
			att_bwd_init(&t, &dm, dt, tl_rng_int(&r, 0, 2));
			att_bwd_random(&t, &r);
			poison_padding_rows(&t.f.q, lq);
			poison_padding_rows(&t.f.k, lkv);
			poison_padding_rows(&t.f.v, lkv);
			poison_padding_rows(&t.d_o, lq);
			att_check_backward(&dm, &t, dt, causal);
			att_bwd_finish(&t);
		}
	}
}
END_TEST

/* Lengths the parser cannot see are checked before anything is written;
 * run without the check (as a client could change them in between), the
 * reference clamps them and stays inside its operands. */
START_TEST(attention_varlen_bad_lengths)
{
	struct tl_attention dm = { .b = 2, .h = 2, .sq = 5, .skv = 6, .d = 8, .dv = 8, .scale = 0.3 };
	static const struct {
		int32_t lq[2], lkv[2];
		bool causal, bottom_right;
		const char *operand, *says;
	} cases[] = {
		{ { 5, 6 }, { 6, 6 }, false, false, "seq_len_q", "seq_len_q[1] is 6, outside [0, 5]" },
		{ { -1, 5 }, { 6, 6 }, false, false, "seq_len_q", "seq_len_q[0] is -1" },
		{ { 5, 5 }, { 7, 6 }, false, false, "seq_len_kv", "seq_len_kv[0] is 7, outside [0, 6]" },
		{ { 5, 3 }, { 6, 0 }, false, false, "seq_len_kv", "seq_len_kv[1] is 0 while seq_len_q[1] is 3" },
		{ { 4, 3 }, { 3, 3 }, true, true, "seq_len_q", "seq_len_q[0] is 4 > seq_len_kv[0] 3" },
	};
	struct tl_rng r;

	tl_rng_init(&r, 12);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct att_tensors t;
		struct rp_compute call;
		struct rp_error err = { 0 };
		void *p[RP_OP_OPERANDS_MAX] = { 0 };
		int32_t lq[2], lkv[2];

		memcpy(lq, cases[i].lq, sizeof(lq));
		memcpy(lkv, cases[i].lkv, sizeof(lkv));
		dm.causal = cases[i].causal;
		dm.bottom_right = cases[i].bottom_right;
		dm.seq_len_q = lq;
		dm.seq_len_kv = lkv;
		call = (struct rp_compute){ .spec = &rp_op_attention, .attention = att_args(&dm) };
		att_init(&t, &dm, RP_DTYPE_F32, 1);
		tens_random(&t.q, &r);
		tens_random(&t.k, &r);
		tens_random(&t.v, &r);
		tens_poison(&t.o);
		tens_poison(&t.stats);
		att_slot(&call, p, RP_ATT_Q, &t.q);
		att_slot(&call, p, RP_ATT_K, &t.k);
		att_slot(&call, p, RP_ATT_V, &t.v);
		att_slot(&call, p, RP_ATT_O, &t.o);
		att_slot(&call, p, RP_ATT_STATS, &t.stats);
		att_length_slots(&call, p, &dm, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV);

		ck_assert_int_eq(rd_host_check(&call, p, &err), -EINVAL);
		ck_assert_str_eq(err.name, RP_ERR_INVALID_OPERAND);
		ck_assert_str_eq(cJSON_GetObjectItem(err.params, "operand")->valuestring, cases[i].operand);
		ck_assert_msg(strstr(cJSON_GetObjectItem(err.params, "reason")->valuestring, cases[i].says),
			      "case %zu: %s", i, cJSON_GetObjectItem(err.params, "reason")->valuestring);
		rp_error_clear(&err);

		size_t need = rd_host_scratch_size(&call);
		void *scratch = malloc(need);
		ck_assert(scratch);
		ck_assert_int_eq(rd_host_run(&call, p, scratch, need), 0);
		/* Inside its operands, every element written (NaN-free where
		 * a row saw a key; padding rows 0 and -inf). */
		tens_check_written(&t.o, "clamped o");
		free(scratch);
		att_finish(&t);
	}
}
END_TEST

/* L = sum(o * W) with o from the double-precision forward. */
static double att_loss(const struct tl_attention *dm, const struct tens *q, const struct tens *k, const struct tens *v,
		       const struct tens *w)
{
	int64_t no = dm->b * dm->h * dm->sq * dm->dv;
	double *o = malloc((size_t)no * sizeof(double));
	double *lse = malloc((size_t)(dm->b * dm->h * dm->sq) * sizeof(double));
	double l = 0.0;

	ck_assert(o && lse);
	att_forward_ref(dm, q, k, v, o, lse);
	for (int64_t e = 0; e < no; e++) {
		l += o[e] * tens_get(w, e);
	}
	free(o);
	free(lse);
	return l;
}

/* Central difference of L in every element of x, against the host's
 * gradient `grad`. x is f32 and perturbed in place (then restored). */
static void check_fd(const struct tl_attention *dm, struct att_bwd_tensors *t, struct tens *x, const struct tens *grad,
		     const char *name)
{
	const double h = 1e-3;

	for (int64_t l = 0; l < x->numel; l++) {
		double x0 = tens_get(x, l), lp, lm, fd, got;

		double xp, xm;

		/* x0 +- h round in f32: divide by the step actually taken. */
		tens_set(x, l, x0 + h);
		xp = tens_get(x, l);
		lp = att_loss(dm, &t->f.q, &t->f.k, &t->f.v, &t->d_o);
		tens_set(x, l, x0 - h);
		xm = tens_get(x, l);
		lm = att_loss(dm, &t->f.q, &t->f.k, &t->f.v, &t->d_o);
		tens_set(x, l, x0);
		fd = (lp - lm) / (xp - xm);
		got = tens_get(grad, l);
		ck_assert_msg(fabs(got - fd) <= 1e-4 + 1e-3 * fabs(fd),
			      "d%s[%lld]: backward %.7g, finite difference %.7g (causal=%d, seed %llu)", name,
			      (long long)l, got, fd, dm->causal, (unsigned long long)tl_seed());
	}
}

START_TEST(attention_backward_matches_finite_differences)
{
	/* Independent of any formula: the gradient of L = sum(o * W), with
	 * dO = W, against central differences of L itself. */
	struct tl_rng r;

	tl_rng_init(&r, 9);
	for (int causal = 0; causal < 3; causal++) {
		/* Two query heads share one k/v head; causal 2 is aligned
		 * bottom-right. */
		struct tl_attention dm = { .b = 1, .h = 2, .hkv = causal == 1 ? 2 : 1, .sq = 3, .skv = 4, .d = 3, .dv = 2,
				       .causal = causal > 0, .bottom_right = causal == 2, .scale = 0.7 };
		struct att_bwd_tensors t;

		att_bwd_init(&t, &dm, RP_DTYPE_F32, 1);
		att_bwd_random(&t, &r);
		att_run_backward(&dm, &t);
		check_fd(&dm, &t, &t.f.q, &t.d_q, "q");
		check_fd(&dm, &t, &t.f.k, &t.d_k, "k");
		check_fd(&dm, &t, &t.f.v, &t.d_v, "v");
		att_bwd_finish(&t);
	}
}
END_TEST

/* ---- LayerNorm -------------------------------------------------------------- */

/* A LayerNorm's tensors: x, y, d_y, d_x, d_residual [rows, n] with padded
 * rows (each its own padding, so that strides differ), weight, bias,
 * d_weight, d_bias [n], mean and rstd f32 [rows]. */
struct ln_tensors {
	struct tens x, w, b, y, mean, rstd, dy, dx, res, dw, db;
};

static void ln_init(struct ln_tensors *t, enum rp_dtype dt, int64_t rows, int64_t n, struct tl_rng *r)
{
	const int64_t mat[2] = { rows, n }, vec[1] = { n }, stat[1] = { rows };

	tens_init(&t->x, dt, 2, mat, tl_rng_int(r, 0, 3), 1);
	tens_init(&t->y, dt, 2, mat, tl_rng_int(r, 0, 3), 1);
	tens_init(&t->dy, dt, 2, mat, tl_rng_int(r, 0, 3), 1);
	tens_init(&t->dx, dt, 2, mat, tl_rng_int(r, 0, 3), 1);
	tens_init(&t->res, dt, 2, mat, tl_rng_int(r, 0, 3), 1);
	tens_init(&t->w, dt, 1, vec, 0, 1);
	tens_init(&t->b, dt, 1, vec, 0, 1);
	tens_init(&t->dw, dt, 1, vec, 0, 1);
	tens_init(&t->db, dt, 1, vec, 0, 1);
	tens_init(&t->mean, RP_DTYPE_F32, 1, stat, 0, 1);
	tens_init(&t->rstd, RP_DTYPE_F32, 1, stat, 0, 1);
	/* x off centre and wider than 1: a mean and a variance to get right. */
	tens_poison(&t->x);
	for (int64_t l = 0; l < t->x.numel; l++) {
		tens_set(&t->x, l, tl_rng_uniform(r, -3.0, 5.0));
	}
	tens_random(&t->w, r);
	tens_random(&t->b, r);
	tens_random(&t->dy, r);
	tens_random(&t->res, r);
	tens_poison(&t->y);
	tens_poison(&t->mean);
	tens_poison(&t->rstd);
	tens_poison(&t->dx);
	tens_poison(&t->dw);
	tens_poison(&t->db);
}

static void ln_finish(struct ln_tensors *t)
{
	struct tens *all[] = { &t->x, &t->w, &t->b, &t->y, &t->mean, &t->rstd, &t->dy, &t->dx, &t->res, &t->dw, &t->db };

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		tens_finish(all[i]);
	}
}

/* Runs a call, and first shows that one float less scratch is refused. */
static void ln_run(struct rp_compute *call, void **p)
{
	size_t need = rd_host_scratch_size(call);
	void *scratch = malloc(need);

	ck_assert(scratch);
	ck_assert_int_eq(rd_host_check(call, p, NULL), 0);
	ck_assert_int_eq(rd_host_run(call, p, scratch, need - sizeof(float)), -ENOSPC);
	ck_assert_int_eq(rd_host_run(call, p, scratch, need), 0);
	free(scratch);
}

static void ln_forward(struct ln_tensors *t, double eps, bool bias, bool stats)
{
	struct rp_compute call = { .spec = &rp_op_layer_norm };
	void *p[RP_OP_OPERANDS_MAX] = { 0 };

	att_slot(&call, p, RP_LN_X, &t->x);
	att_slot(&call, p, RP_LN_WEIGHT, &t->w);
	if (bias) {
		att_slot(&call, p, RP_LN_BIAS, &t->b);
	}
	att_slot(&call, p, RP_LN_Y, &t->y);
	if (stats) {
		att_slot(&call, p, RP_LN_MEAN, &t->mean);
		att_slot(&call, p, RP_LN_RSTD, &t->rstd);
	}
	call.layer_norm = (struct rp_layer_norm){ .eps = eps, .rows = t->x.op.shape[0], .n = t->x.op.shape[1] };
	ln_run(&call, p);
}

/* residual: 0 none, 1 apart, 2 d_x in place of d_residual. */
static void ln_backward(struct ln_tensors *t, int residual, bool param_grads)
{
	struct rp_compute call = { .spec = &rp_op_layer_norm_backward };
	void *p[RP_OP_OPERANDS_MAX] = { 0 };

	att_slot(&call, p, RP_LNB_DY, &t->dy);
	att_slot(&call, p, RP_LNB_X, &t->x);
	att_slot(&call, p, RP_LNB_WEIGHT, &t->w);
	att_slot(&call, p, RP_LNB_MEAN, &t->mean);
	att_slot(&call, p, RP_LNB_RSTD, &t->rstd);
	att_slot(&call, p, RP_LNB_DX, residual == 2 ? &t->res : &t->dx);
	if (residual) {
		att_slot(&call, p, RP_LNB_DRESIDUAL, &t->res);
	}
	if (param_grads) {
		att_slot(&call, p, RP_LNB_DWEIGHT, &t->dw);
		att_slot(&call, p, RP_LNB_DBIAS, &t->db);
	}
	call.layer_norm = (struct rp_layer_norm){ .rows = t->x.op.shape[0], .n = t->x.op.shape[1] };
	ln_run(&call, p);
}

static void ln_close(const char *what, enum rp_dtype dt, const struct tens *got, const double *ref, const double *mag,
		     double tol, const char *label)
{
	double *g = tens_values(got);
	char why[512] = "";

	ck_assert_msg(tl_check_close(what, dt, g, ref, mag, (size_t)got->numel, tol, why, sizeof(why)) == 0,
		      "%s: %s (seed %llu)", label, why, (unsigned long long)tl_seed());
	free(g);
}

START_TEST(layer_norm_matches_reference)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F32, RP_DTYPE_F16, RP_DTYPE_BF16 };
	struct tl_rng *r = tl_rand();

	for (int c = 0; c < 24; c++) {
		const enum rp_dtype dt = dts[c % 3];
		/* The longest row once, one element now and then. */
		const int64_t rows = c == 0 ? 2 : tl_rng_int(r, 1, 24);
		const int64_t n = c == 0 ? RP_LAYER_NORM_N_MAX : c % 7 == 1 ? 1 : tl_rng_int(r, 2, 300);
		const bool bias = c % 4 != 3, stats = c % 5 != 4;
		const double eps = c % 2 ? 1e-5 : tl_rng_uniform(r, 1e-6, 0.5);
		const struct tl_layer_norm ln = { rows, n, eps };
		struct ln_tensors t;
		char label[128];

		snprintf(label, sizeof(label), "%s [%lld, %lld] bias %d stats %d eps %g", rp_dtype_name(dt),
			 (long long)rows, (long long)n, bias, stats, eps);
		ln_init(&t, dt, rows, n, r);
		ln_forward(&t, eps, bias, stats);
		tens_check_written(&t.y, label);

		double *x = tens_values(&t.x), *w = tens_values(&t.w), *b = tens_values(&t.b);
		double *y = malloc(sizeof(double) * (size_t)(rows * n)), *mag = malloc(sizeof(double) * (size_t)(rows * n));
		double *mean = malloc(sizeof(double) * (size_t)rows), *rstd = malloc(sizeof(double) * (size_t)rows);
		double *mean_mag = malloc(sizeof(double) * (size_t)rows);

		ck_assert(y && mag && mean && rstd && mean_mag);
		tl_layer_norm_ref(&ln, x, w, bias ? b : NULL, y, mean, rstd, mag);
		ln_close("y", dt, &t.y, y, mag, 1e-5, label);
		if (stats) {
			tens_check_written(&t.mean, label);
			tens_check_written(&t.rstd, label);
			/* A mean is off by the rounding of its terms, which the
			 * row's largest bounds; rstd is relative. */
			for (int64_t i = 0; i < rows; i++) {
				mean_mag[i] = 0;
				for (int64_t j = 0; j < n; j++) {
					mean_mag[i] = fmax(mean_mag[i], fabs(x[i * n + j]));
				}
			}
			ln_close("mean", RP_DTYPE_F32, &t.mean, mean, mean_mag, 1e-6, label);
			ln_close("rstd", RP_DTYPE_F32, &t.rstd, rstd, rstd, 1e-5, label);
		} else {
			for (size_t e = 0; e < t.mean.len; e++) {
				ck_assert_msg(tens_is_poison(&t.mean, e), "%s: mean written without being asked", label);
			}
		}
		free(x);
		free(w);
		free(b);
		free(y);
		free(mag);
		free(mean);
		free(rstd);
		free(mean_mag);
		ln_finish(&t);
	}
}
END_TEST

START_TEST(layer_norm_backward_matches_reference)
{
	static const enum rp_dtype dts[] = { RP_DTYPE_F32, RP_DTYPE_F16, RP_DTYPE_BF16 };
	struct tl_rng *r = tl_rand();

	for (int c = 0; c < 27; c++) {
		const enum rp_dtype dt = dts[c % 3];
		const int residual = (c / 3) % 3;
		const bool param_grads = c % 4 != 3;
		const int64_t rows = tl_rng_int(r, 1, 40), n = c == 4 ? 1 : tl_rng_int(r, 2, 200);
		const struct tl_layer_norm ln = { rows, n, 1e-5 };
		const size_t nn = (size_t)(rows * n);
		struct tl_layer_norm_grad_magnitude gm;
		struct ln_tensors t;
		char label[128];

		snprintf(label, sizeof(label), "%s [%lld, %lld] residual %d d_weight/d_bias %d", rp_dtype_name(dt),
			 (long long)rows, (long long)n, residual, param_grads);
		ln_init(&t, dt, rows, n, r);
		ln_forward(&t, 1e-5, true, true);

		double *dy = tens_values(&t.dy), *x = tens_values(&t.x), *w = tens_values(&t.w);
		double *mean = tens_values(&t.mean), *rstd = tens_values(&t.rstd), *res = tens_values(&t.res);
		double *dx = malloc(sizeof(double) * nn), *dw = malloc(sizeof(double) * (size_t)n);
		double *db = malloc(sizeof(double) * (size_t)n);

		gm.d_x = malloc(sizeof(double) * nn);
		gm.d_weight = malloc(sizeof(double) * (size_t)n);
		gm.d_bias = malloc(sizeof(double) * (size_t)n);
		ck_assert(dx && dw && db && gm.d_x && gm.d_weight && gm.d_bias);
		/* From the statistics as the forward stored them, as a backward
		 * on the device reads them. */
		tl_layer_norm_backward_ref(&ln, dy, x, w, mean, rstd, residual ? res : NULL, dx, dw, db, &gm);
		ln_backward(&t, residual, param_grads);
		const struct tens *out = residual == 2 ? &t.res : &t.dx;

		if (residual != 2) {
			tens_check_written(out, label);
		}
		ln_close("d_x", dt, out, dx, gm.d_x, 1e-5, label);
		if (param_grads) {
			tens_check_written(&t.dw, label);
			tens_check_written(&t.db, label);
			ln_close("d_weight", dt, &t.dw, dw, gm.d_weight, 1e-5, label);
			ln_close("d_bias", dt, &t.db, db, gm.d_bias, 1e-5, label);
		} else {
			for (size_t e = 0; e < t.dw.len; e++) {
				ck_assert_msg(tens_is_poison(&t.dw, e), "%s: d_weight written without being asked", label);
			}
		}
		if (residual == 1) {
			double *after = tens_values(&t.res);

			ck_assert_msg(memcmp(after, res, sizeof(double) * nn) == 0, "%s: d_residual written", label);
			free(after);
		}
		free(dy);
		free(x);
		free(w);
		free(mean);
		free(rstd);
		free(res);
		free(dx);
		free(dw);
		free(db);
		free(gm.d_x);
		free(gm.d_weight);
		free(gm.d_bias);
		ln_finish(&t);
	}
}
END_TEST

/* L = sum(y * d_y) of the float64 forward, for the finite differences. */
static double ln_loss(const struct tl_layer_norm *ln, const struct ln_tensors *t)
{
	double *x = tens_values(&t->x), *w = tens_values(&t->w), *b = tens_values(&t->b), *dy = tens_values(&t->dy);
	double *y = malloc(sizeof(double) * (size_t)(ln->rows * ln->n)), l = 0.0;

	ck_assert(y);
	tl_layer_norm_ref(ln, x, w, b, y, NULL, NULL, NULL);
	for (int64_t e = 0; e < ln->rows * ln->n; e++) {
		l += y[e] * dy[e];
	}
	free(x);
	free(w);
	free(b);
	free(dy);
	free(y);
	return l;
}

/* The standard deviation of x's row `row` (biased, as LayerNorm's). */
static double ln_row_std(const struct tl_layer_norm *ln, const struct tens *x, int64_t row)
{
	double mean = 0.0, var = 0.0;

	for (int64_t j = 0; j < ln->n; j++)
		mean += tens_get(x, row * ln->n + j);
	mean /= (double)ln->n;
	for (int64_t j = 0; j < ln->n; j++) {
		const double d = tens_get(x, row * ln->n + j) - mean;
		var += d * d;
	}
	return sqrt(var / (double)ln->n);
}

/* Central differences of L in every element of `in`, against the host's
 * gradient `grad` (+ `plus`, d_residual, for d_x). For x the step is
 * 1e-3 of its row's spread: L's curvature in x grows as the row's
 * variance shrinks (rstd^2), and a fixed step let the differences' own
 * error pass the bound on a row of two close values (CI seed
 * 4679921047812003: 0.45% off). */
static void ln_check_fd(const struct tl_layer_norm *ln, struct ln_tensors *t, struct tens *in, const struct tens *grad,
			const struct tens *plus, const char *name)
{
	const bool is_x = in == &t->x;

	for (int64_t l = 0; l < in->numel; l++) {
		const double v0 = tens_get(in, l);
		const double h = is_x ? 1e-3 * fmax(ln_row_std(ln, in, l / ln->n), 1e-2) : 1e-3;
		double vp, vm, lp, lm;

		/* v0 +- h round in f32: divide by the step actually taken. */
		tens_set(in, l, v0 + h);
		vp = tens_get(in, l);
		lp = ln_loss(ln, t);
		tens_set(in, l, v0 - h);
		vm = tens_get(in, l);
		lm = ln_loss(ln, t);
		tens_set(in, l, v0);
		const double fd = (lp - lm) / (vp - vm) + (plus ? tens_get(plus, l) : 0.0);
		const double got = tens_get(grad, l);

		ck_assert_msg(fabs(got - fd) <= 1e-4 + 1e-3 * fabs(fd),
			      "d_%s[%lld]: backward %.7g, finite difference %.7g (seed %llu)", name, (long long)l, got, fd,
			      (unsigned long long)tl_seed());
	}
}

START_TEST(layer_norm_backward_matches_finite_differences)
{
	/* Independent of any formula: the gradients of L = sum(y * d_y)
	 * against central differences of L, the forward's eps and biased
	 * variance (torch's) included. */
	struct tl_rng r;

	tl_rng_init(&r, 11);
	for (int c = 0; c < 3; c++) {
		const int64_t rows = 3, n = c == 2 ? 2 : 7;
		const struct tl_layer_norm ln = { rows, n, c == 1 ? 0.3 : 1e-5 };
		struct ln_tensors t;

		ln_init(&t, RP_DTYPE_F32, rows, n, &r);
		ln_forward(&t, ln.eps, true, true);
		ln_backward(&t, 1, true);
		ln_check_fd(&ln, &t, &t.x, &t.dx, &t.res, "x");
		ln_check_fd(&ln, &t, &t.w, &t.dw, NULL, "weight");
		ln_check_fd(&ln, &t, &t.b, &t.db, NULL, "bias");
		ln_finish(&t);
	}
}
END_TEST

/* ---- conversions ------------------------------------------------------------ */

static float f32_from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t bits_from_f32(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

START_TEST(bf16_known_patterns)
{
	ck_assert_uint_eq(rd_f32_to_bf16(1.0f), 0x3f80);
	ck_assert_uint_eq(rd_f32_to_bf16(-2.0f), 0xc000);
	ck_assert_uint_eq(rd_f32_to_bf16(0.0f), 0x0000);
	ck_assert_uint_eq(rd_f32_to_bf16(-0.0f), 0x8000);
	ck_assert_uint_eq(rd_f32_to_bf16(3.140625f), 0x4049);
	/* Ties go to the even neighbour, in both directions. */
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x3f808000)), 0x3f80);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x3f818000)), 0x3f82);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x3f808001)), 0x3f81);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x3f817fff)), 0x3f81);
	/* Inf stays Inf; FLT_MAX rounds up to Inf (RNE). */
	ck_assert_uint_eq(rd_f32_to_bf16(INFINITY), 0x7f80);
	ck_assert_uint_eq(rd_f32_to_bf16(-INFINITY), 0xff80);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x7f7fffff)), 0x7f80);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x7f7f7fff)), 0x7f7f);
	/* A NaN whose payload is only in the dropped bits must not become
	 * Inf; the sign survives. */
	uint16_t n1 = rd_f32_to_bf16(f32_from_bits(0x7f800001));
	uint16_t n2 = rd_f32_to_bf16(f32_from_bits(0xffffffff));
	ck_assert_uint_eq(n1 & 0x7f80, 0x7f80);
	ck_assert_uint_ne(n1 & 0x007f, 0);
	ck_assert_uint_eq(n2 & 0xff80, 0xff80);
	ck_assert_uint_ne(n2 & 0x007f, 0);
	ck_assert(isnan(rd_bf16_to_f32(rd_f32_to_bf16(NAN))));
	/* Subnormals round like everything else. */
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x00010000)), 0x0001);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x00008000)), 0x0000);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x00018000)), 0x0002);
	ck_assert_uint_eq(rd_f32_to_bf16(f32_from_bits(0x007fffff)), 0x0080);
	/* Widening is exact. */
	ck_assert_uint_eq(bits_from_f32(rd_bf16_to_f32(0x0001)), 0x00010000);
	ck_assert_uint_eq(bits_from_f32(rd_bf16_to_f32(0xff80)), 0xff800000);
	ck_assert_float_eq(rd_bf16_to_f32(0x3f80), 1.0f);
}
END_TEST

START_TEST(f16_known_patterns)
{
	ck_assert_uint_eq(rd_f32_to_f16(1.0f), 0x3c00);
	ck_assert_uint_eq(rd_f32_to_f16(-2.0f), 0xc000);
	ck_assert_uint_eq(rd_f32_to_f16(-0.0f), 0x8000);
	ck_assert_uint_eq(rd_f32_to_f16(65504.0f), 0x7bff);
	ck_assert_uint_eq(rd_f32_to_f16(65519.996f), 0x7bff);
	ck_assert_uint_eq(rd_f32_to_f16(65520.0f), 0x7c00);   /* tie: rounds to even = Inf */
	ck_assert_uint_eq(rd_f32_to_f16(1e10f), 0x7c00);
	ck_assert_uint_eq(rd_f32_to_f16(-INFINITY), 0xfc00);
	/* Ties to even around 1.0: 1 + 2^-11 is half an ulp. */
	ck_assert_uint_eq(rd_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	ck_assert_uint_eq(rd_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	ck_assert_uint_eq(rd_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
	/* Smallest normal, subnormals, and the ties below them. */
	ck_assert_uint_eq(rd_f32_to_f16(0x1p-14f), 0x0400);
	ck_assert_uint_eq(rd_f32_to_f16(0x1p-24f), 0x0001);
	ck_assert_uint_eq(rd_f32_to_f16(0x1p-25f), 0x0000);
	ck_assert_uint_eq(rd_f32_to_f16(-0x1p-25f), 0x8000);
	ck_assert_uint_eq(rd_f32_to_f16(0x1.8p-25f), 0x0001);
	ck_assert_uint_eq(rd_f32_to_f16(0x1.8p-24f), 0x0002);   /* 1.5 ulp: tie to 2 */
	ck_assert_uint_eq(rd_f32_to_f16(0x1.4p-23f), 0x0002);   /* 2.5 ulp: tie to 2 */
	ck_assert_uint_eq(rd_f32_to_f16(1023.5f * 0x1p-24f), 0x0400);   /* rounds up into normals */
	ck_assert_uint_eq(rd_f32_to_f16(1e-30f), 0x0000);
	/* NaN stays NaN even with a payload only in the dropped bits. */
	uint16_t n = rd_f32_to_f16(f32_from_bits(0x7f800001));
	ck_assert_uint_eq(n & 0x7c00, 0x7c00);
	ck_assert_uint_ne(n & 0x03ff, 0);
	ck_assert_uint_eq(rd_f32_to_f16(f32_from_bits(0xffc00000)) & 0x8000, 0x8000);
	/* Widening. */
	ck_assert_float_eq(rd_f16_to_f32(0x0001), 0x1p-24f);
	ck_assert_float_eq(rd_f16_to_f32(0x03ff), 1023.0f * 0x1p-24f);
	ck_assert_float_eq(rd_f16_to_f32(0x0400), 0x1p-14f);
	ck_assert_float_eq(rd_f16_to_f32(0x7bff), 65504.0f);
	ck_assert_float_eq(rd_f16_to_f32(0x3555), 0.333251953125f);
	ck_assert_uint_eq(bits_from_f32(rd_f16_to_f32(0x8000)), 0x80000000);
	ck_assert_uint_eq(bits_from_f32(rd_f16_to_f32(0xfc00)), 0xff800000);
	ck_assert(isnan(rd_f16_to_f32(0x7e00)));
	ck_assert(isnan(rd_f16_to_f32(0x7c01)));
}
END_TEST

START_TEST(half_types_round_trip_every_value)
{
	/* Every 16-bit pattern widens exactly and narrows back to itself
	 * (NaNs to some NaN). */
	for (uint32_t h = 0; h <= 0xffff; h++) {
		float f16 = rd_f16_to_f32((uint16_t)h), bf = rd_bf16_to_f32((uint16_t)h);
		if (isnan(f16)) {
			ck_assert(isnan(rd_f16_to_f32(rd_f32_to_f16(f16))));
		} else {
			ck_assert_uint_eq(rd_f32_to_f16(f16), h);
		}
		if (isnan(bf)) {
			ck_assert(isnan(rd_bf16_to_f32(rd_f32_to_bf16(bf))));
		} else {
			ck_assert_uint_eq(rd_f32_to_bf16(bf), h);
		}
	}
}
END_TEST

/* The nearest of the representable neighbours, ties to even, judged in
 * double (exact for these differences). */
static void check_nearest(float x, uint16_t got, float (*widen)(uint16_t), const char *what)
{
	double gx = widen(got);
	uint16_t up = (uint16_t)(got + 1), down = (uint16_t)(got - 1);

	/* Neighbours in magnitude, same sign; skip past the ends. */
	for (int s = 0; s < 2; s++) {
		uint16_t nb = s ? up : down;
		double nx = widen(nb);
		if (isnan(nx) || (nb & 0x7fff) == 0x7fff || ((nb ^ got) & 0x8000)) {
			continue;
		}
		double dg = fabs((double)x - gx), dn = fabs((double)x - nx);
		ck_assert_msg(dg < dn || (dg == dn && (got & 1) == 0),
			      "%s(%a) = 0x%04x (%a) but 0x%04x (%a) is nearer or the even tie", what, (double)x, got, gx,
			      nb, nx);
	}
}

START_TEST(half_types_round_to_nearest_random)
{
	struct tl_rng r;

	tl_rng_init(&r, 10);
	for (int t = 0; t < 200000; t++) {
		uint32_t u = (uint32_t)tl_rng_next(&r);
		float x;

		/* f16 bits: keep exponents in f16's range most of the time. */
		uint32_t e = 103 + (uint32_t)tl_rng_int(&r, 0, 39);
		x = f32_from_bits((u & 0x807fffffu) | (e << 23));
		if (fabsf(x) < 65504.0f) {
			check_nearest(x, rd_f32_to_f16(x), rd_f16_to_f32, "f16");
		}
		x = f32_from_bits(u);
		if (isfinite(x) && fabsf(x) < 3.38e38f) {
			check_nearest(x, rd_f32_to_bf16(x), rd_bf16_to_f32, "bf16");
		}
	}
}
END_TEST

/* The host backend has an entry for every operation of the op table: an
 * empty call of each (every dimension 0) has its cost, scratch and memory
 * check answered, not a missing entry's crash. An op added without its
 * host kernels fails here. */
START_TEST(every_op_of_the_table_has_host_kernels)
{
	struct rp_compute call = { .spec = rp_op_get((enum rp_op_id)_i) };
	void *p[RP_OP_OPERANDS_MAX] = { 0 };

	ck_assert_ptr_nonnull(call.spec);
	ck_assert(rd_host_macs(&call) == 0.0);
	ck_assert_uint_eq(rd_host_scratch_size(&call), 0);
	ck_assert_int_eq(rd_host_check(&call, p, NULL), 0);
}
END_TEST

static Suite *host_math_suite(void)
{
	Suite *s = suite_create("host_math");
	TCase *conv = tcase_create("conversions");
	TCase *gemm = tcase_create("gemm");
	TCase *att = tcase_create("attention");
	TCase *ln = tcase_create("layer_norm");

	tcase_add_test(conv, bf16_known_patterns);
	tcase_add_test(conv, f16_known_patterns);
	tcase_add_test(conv, half_types_round_trip_every_value);
	tcase_add_test(conv, half_types_round_to_nearest_random);
	suite_add_tcase(s, conv);

	tcase_add_test(gemm, gemm_every_transpose_and_dtype);
	tcase_add_test(gemm, gemm_alpha_beta_with_c);
	tcase_add_test(gemm, gemm_beta_zero_ignores_c);
	tcase_add_test(gemm, gemm_bias_and_gelu_epilogues);
	tcase_add_test(gemm, dgelu_reference_is_gelus_slope);
	tcase_add_test(gemm, gemm_dgelu_epilogue);
	tcase_add_test(gemm, gemm_strided_operands);
	tcase_add_test(gemm, gemm_512_cubed_is_fast_and_right);
	tcase_add_test(gemm, gemm_concurrent_threads);
	suite_add_tcase(s, gemm);

	tcase_add_test(att, attention_forward_matches_reference);
	tcase_add_test(att, attention_forward_without_stats);
	tcase_add_test(att, attention_backward_matches_reference);
	tcase_add_test(att, attention_backward_matches_finite_differences);
	tcase_add_test(att, attention_varlen_forward_matches_reference);
	tcase_add_test(att, attention_varlen_backward_matches_reference);
	tcase_add_test(att, attention_varlen_bad_lengths);
	suite_add_tcase(s, att);

	tcase_add_test(ln, layer_norm_matches_reference);
	tcase_add_test(ln, layer_norm_backward_matches_reference);
	tcase_add_test(ln, layer_norm_backward_matches_finite_differences);
	suite_add_tcase(s, ln);

	TCase *table = tcase_create("table");
	tcase_add_loop_test(table, every_op_of_the_table_has_host_kernels, 0, RP_OP_COUNT);
	suite_add_tcase(s, table);
	return s;
}

int main(void)
{
	tl_rand_init();
	fflush(stderr);
	return unit_run(host_math_suite());
}
