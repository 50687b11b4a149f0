/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend's FP8: its codec against the tests' own (every byte, and
 * fresh random values with ties and values past the range), Quantize and
 * TransposeQuantize byte for byte, the FP8 GEMM against float64 of the
 * dequantized operands, ScaleUpdate against Transformer Engine's formula,
 * and bad scales refused by name. Calls are parsed from JSON as a client
 * sends them, and run on host arrays (one buffer an operand, offset 0).
 * Fresh random inputs each run; the seed is printed in every failure
 * (REGEN_TEST_SEED=<n> replays one). */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/backend/host/fp8.h"
#include "daemon/backend/host/math.h"
#include "proto/errors.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"
#include "unit.h"

#define SEED (unsigned long long)tl_seed()

/* ---- calls on host arrays ---------------------------------------------------------- */

struct call {
	struct rp_compute c;
	void *ptr[RP_OP_OPERANDS_MAX];
	size_t bytes[RP_OP_OPERANDS_MAX];
};

/* An operand's JSON: buffer b0.1.<slot+1>, so no two operands share one. */
static void operand_json(char *out, size_t size, const char *name, int slot, const char *dtype, int rank,
			 const int64_t *shape, int64_t row_stride)
{
	if (rank == 1) {
		snprintf(out, size, "\"%s\": {\"buffer\": \"b0.1.%d\", \"dtype\": \"%s\", \"shape\": [%lld]}", name,
			 slot + 1, dtype, (long long)shape[0]);
	} else {
		snprintf(out, size,
			 "\"%s\": {\"buffer\": \"b0.1.%d\", \"dtype\": \"%s\", \"shape\": [%lld, %lld], \"strides\": [%lld, 1]}",
			 name, slot + 1, dtype, (long long)shape[0], (long long)shape[1], (long long)row_stride);
	}
}

/* Parses {"...": ...} for spec and gives every present operand a poisoned
 * host array of its extent. */
static void call_parse(struct call *k, const struct rp_op_spec *spec, const char *params)
{
	cJSON *j = cJSON_Parse(params);
	struct rp_error err = { 0 };

	ck_assert_msg(j != NULL, "bad test JSON: %s", params);
	memset(k, 0, sizeof(*k));
	ck_assert_msg(rp_compute_parse(spec, j, &k->c, &err) == 0, "refused: %s %s", err.name ? err.name : "?",
		      err.params ? cJSON_PrintUnformatted(err.params) : "");
	for (unsigned s = 0; s < spec->noperands; s++) {
		uint64_t begin, end;

		if (!k->c.present[s]) {
			continue;
		}
		ck_assert_int_eq(rp_operand_extent(&k->c.operands[s], &begin, &end), 0);
		k->bytes[s] = end;
		k->ptr[s] = malloc(end);
		ck_assert_ptr_nonnull(k->ptr[s]);
		tl_poison(k->c.operands[s].dtype, k->ptr[s], end / rp_dtype_size(k->c.operands[s].dtype));
	}
	cJSON_Delete(j);
}

static void call_run(struct call *k)
{
	struct rp_error err = { 0 };

	ck_assert_msg(rd_host_check(&k->c, k->ptr, &err) == 0, "check refused: %s",
		      err.params ? cJSON_PrintUnformatted(err.params) : "?");
	ck_assert_int_eq(rd_host_run(&k->c, k->ptr, NULL, 0), 0);
}

static void call_free(struct call *k)
{
	for (int s = 0; s < RP_OP_OPERANDS_MAX; s++) {
		free(k->ptr[s]);
	}
}

static float *f32_at(struct call *k, int slot)
{
	return k->ptr[slot];
}

static const enum rp_dtype fp8s[] = { RP_DTYPE_E4M3, RP_DTYPE_E5M2 };
static const enum rp_dtype wides[] = { RP_DTYPE_F32, RP_DTYPE_F16, RP_DTYPE_BF16 };

/* ---- the codec ------------------------------------------------------------------- */

START_TEST(every_byte_decodes_as_its_fields_say)
{
	for (int f = 0; f < 2; f++) {
		for (int b = 0; b < 256; b++) {
			double want = tl_fp8_decode(fp8s[f], (uint8_t)b), got = rd_fp8_decode((uint8_t)b, fp8s[f]);

			ck_assert_msg((isnan(want) && isnan(got)) || want == got, "%s 0x%02x: %g, want %g",
				      rp_dtype_name(fp8s[f]), b, got, want);
			/* A value's own byte comes back (NaNs canonical). */
			if (!isnan(want) && !isinf(want)) {
				ck_assert_msg(rd_fp8_encode(want, fp8s[f]) == b, "%s 0x%02x does not round-trip",
					      rp_dtype_name(fp8s[f]), b);
			}
		}
	}
}
END_TEST

START_TEST(encoding_rounds_to_nearest_even_and_saturates)
{
	struct tl_rng r;

	tl_rng_init(&r, 1);
	/* The edges, by hand: the largest values, past them, ties. */
	ck_assert_uint_eq(rd_fp8_encode(448.0, RP_DTYPE_E4M3), 0x7e);
	ck_assert_uint_eq(rd_fp8_encode(470.0, RP_DTYPE_E4M3), 0x7e);
	ck_assert_uint_eq(rd_fp8_encode(1e30, RP_DTYPE_E4M3), 0x7e);
	ck_assert_uint_eq(rd_fp8_encode(-INFINITY, RP_DTYPE_E4M3), 0xfe);
	ck_assert_uint_eq(rd_fp8_encode(INFINITY, RP_DTYPE_E5M2), 0x7b);
	ck_assert_uint_eq(rd_fp8_encode(61440.0, RP_DTYPE_E5M2), 0x7b);
	ck_assert_uint_eq(rd_fp8_encode(1.0625, RP_DTYPE_E4M3), 0x38);   /* 1 and 1.125: to 1 */
	ck_assert_uint_eq(rd_fp8_encode(1.1875, RP_DTYPE_E4M3), 0x3a);   /* 1.125 and 1.25: to 1.25 */
	ck_assert_uint_eq(rd_fp8_encode(ldexp(1, -10), RP_DTYPE_E4M3), 0x00); /* half the smallest: to 0 */
	ck_assert_uint_eq(rd_fp8_encode(ldexp(3, -10), RP_DTYPE_E4M3), 0x02); /* 1.5 smallest: to 2 */
	ck_assert_uint_eq(rd_fp8_encode(NAN, RP_DTYPE_E4M3) & 0x7f, 0x7f);
	ck_assert(isnan(rd_fp8_decode(rd_fp8_encode(NAN, RP_DTYPE_E5M2), RP_DTYPE_E5M2)));
	for (int i = 0; i < 200000; i++) {
		const enum rp_dtype dt = fp8s[i & 1];
		/* Magnitudes from below the subnormals to past the range; every
		 * fourth a tie exactly between two neighbours. */
		double v = ldexp(tl_rng_uniform(&r, -1, 1), (int)tl_rng_int(&r, -20, 18));

		if (i % 4 == 0) {
			uint8_t b = (uint8_t)tl_rng_int(&r, 0, 0x7a);
			double lo = tl_fp8_decode(dt, b), hi = tl_fp8_decode(dt, (uint8_t)(b + 1));

			v = (lo + hi) / 2 * (i & 8 ? -1 : 1);
		}
		ck_assert_msg(rd_fp8_encode(v, dt) == tl_fp8_encode(dt, v), "%s of %.17g: 0x%02x, want 0x%02x (seed %llu)",
			      rp_dtype_name(dt), v, rd_fp8_encode(v, dt), tl_fp8_encode(dt, v), SEED);
	}
}
END_TEST

/* ---- Quantize and TransposeQuantize -------------------------------------------------- */

START_TEST(quantize_matches_byte_for_byte)
{
	struct tl_rng r;

	tl_rng_init(&r, 2);
	for (int round = 0; round < 12; round++) {
		const enum rp_dtype xt = wides[round % 3], yt = fp8s[(round / 3) & 1];
		const bool transpose = round >= 6;
		const int64_t rows = tl_rng_int(&r, 1, 40), cols = tl_rng_int(&r, 1, 70), pad = tl_rng_int(&r, 0, 3);
		const int64_t xs[2] = { rows, cols }, ts[2] = { cols, rows }, one[1] = { 1 };
		char params[1024], x[200], scale[200], y[200], yy[200], amax[200];
		struct call k;
		/* Scales that push some values past the range, some under it. */
		const float s = (float)ldexp(tl_rng_uniform(&r, 0.5, 1), (int)tl_rng_int(&r, -4, 10));
		double amax_want = 0;

		operand_json(x, sizeof(x), "x", RP_QUANT_X, rp_dtype_name(xt), 2, xs, cols + pad);
		operand_json(scale, sizeof(scale), "scale", RP_QUANT_SCALE, "f32", 1, one, 0);
		operand_json(y, sizeof(y), "y", RP_QUANT_Y, rp_dtype_name(yt), 2, xs, cols + pad + 1);
		operand_json(yy, sizeof(yy), "y_t", RP_QUANT_Y_T, rp_dtype_name(yt), 2, ts, rows + pad);
		operand_json(amax, sizeof(amax), "amax", RP_QUANT_AMAX, "f32", 1, one, 0);
		snprintf(params, sizeof(params), "{%s, %s, %s, %s%s%s}", x, scale, y, amax, transpose ? ", " : "",
			 transpose ? yy : "");
		call_parse(&k, transpose ? &rp_op_transpose_quantize : &rp_op_quantize, params);
		*f32_at(&k, RP_QUANT_SCALE) = s;
		for (int64_t i = 0; i < rows; i++) {
			for (int64_t j = 0; j < cols; j++) {
				double v = tl_store(xt, k.ptr[RP_QUANT_X], (size_t)(i * (cols + pad) + j),
						    tl_rng_uniform(&r, -2, 2));
				amax_want = fmax(amax_want, fabs(v));
			}
		}
		call_run(&k);
		for (int64_t i = 0; i < rows; i++) {
			for (int64_t j = 0; j < cols; j++) {
				const float v = (float)tl_load(xt, k.ptr[RP_QUANT_X], (size_t)(i * (cols + pad) + j));
				const uint8_t want = tl_fp8_encode(yt, (double)(v * s));
				const uint8_t got = ((uint8_t *)k.ptr[RP_QUANT_Y])[i * (cols + pad + 1) + j];

				ck_assert_msg(got == want, "y[%lld][%lld] of %g * %g: 0x%02x, want 0x%02x (seed %llu)",
					      (long long)i, (long long)j, (double)v, (double)s, got, want, SEED);
				if (transpose) {
					ck_assert_uint_eq(((uint8_t *)k.ptr[RP_QUANT_Y_T])[j * (rows + pad) + i], want);
				}
			}
			/* y's row padding (inside its extent) was never written. */
			if (i + 1 < rows) {
				ck_assert(tl_is_poison(yt, k.ptr[RP_QUANT_Y], (size_t)(i * (cols + pad + 1) + cols)));
			}
		}
		ck_assert(*f32_at(&k, RP_QUANT_AMAX) == (float)amax_want);
		call_free(&k);
	}
}
END_TEST

/* ---- the GEMM ------------------------------------------------------------------------ */

/* D = alpha a_scale b_scale A B^T (+ bias, gelu), against f64 of the
 * dequantized bytes. */
static void check_fp8_gemm(struct tl_rng *r, enum rp_dtype at, enum rp_dtype bt, enum rp_dtype dt, bool bias_gelu)
{
	const int64_t M = tl_rng_int(r, 1, 33), N = tl_rng_int(r, 1, 40), K = tl_rng_int(r, 1, 70);
	const int64_t ash[2] = { M, K }, bsh[2] = { N, K }, dsh[2] = { M, N }, one[1] = { 1 }, nsh[1] = { N };
	const bool fp8_d = rp_dtype_is_fp8(dt);
	char params[2048], a[200], b[200], d[200], as[200], bs[200], ds[200], am[200], bias[200];
	struct call k;
	const float sa = (float)tl_rng_uniform(r, 0.01, 2), sb = (float)tl_rng_uniform(r, 0.01, 2);
	double amax_want = 0, worst = 0, *ref = malloc((size_t)(M * N) * sizeof(double));

	operand_json(a, sizeof(a), "a", RP_GEMM_A, rp_dtype_name(at), 2, ash, K + 3);
	operand_json(b, sizeof(b), "b", RP_GEMM_B, rp_dtype_name(bt), 2, bsh, K);
	operand_json(d, sizeof(d), "d", RP_GEMM_D, rp_dtype_name(dt), 2, dsh, N + 1);
	operand_json(as, sizeof(as), "a_scale", RP_GEMM_A_SCALE, "f32", 1, one, 0);
	operand_json(bs, sizeof(bs), "b_scale", RP_GEMM_B_SCALE, "f32", 1, one, 0);
	operand_json(ds, sizeof(ds), "d_scale", RP_GEMM_D_SCALE, "f32", 1, one, 0);
	operand_json(am, sizeof(am), "amax_d", RP_GEMM_AMAX_D, "f32", 1, one, 0);
	operand_json(bias, sizeof(bias), "bias", RP_GEMM_BIAS, rp_dtype_name(dt), 1, nsh, 0);
	snprintf(params, sizeof(params), "{%s, %s, %s, %s, %s, \"trans_b\": true, \"alpha\": 0.75%s%s%s%s%s%s}", a, b, d,
		 as, bs, fp8_d ? ", " : "", fp8_d ? ds : "", fp8_d ? ", " : "", fp8_d ? am : "",
		 bias_gelu ? ", \"epilogue\": \"gelu_bias\", " : "", bias_gelu ? bias : "");
	call_parse(&k, &rp_op_gemm, params);
	*f32_at(&k, RP_GEMM_A_SCALE) = sa;
	*f32_at(&k, RP_GEMM_B_SCALE) = sb;
	/* Inputs spread over FP8's range, as quantized activations are. */
	for (int64_t i = 0; i < M; i++) {
		for (int64_t q = 0; q < K; q++) {
			tl_store(at, k.ptr[RP_GEMM_A], (size_t)(i * (K + 3) + q), ldexp(tl_rng_uniform(r, -1, 1), (int)tl_rng_int(r, -3, 6)));
		}
	}
	for (int64_t j = 0; j < N; j++) {
		for (int64_t q = 0; q < K; q++) {
			tl_store(bt, k.ptr[RP_GEMM_B], (size_t)(j * K + q), ldexp(tl_rng_uniform(r, -1, 1), (int)tl_rng_int(r, -3, 6)));
		}
		if (bias_gelu) {
			tl_store(dt, k.ptr[RP_GEMM_BIAS], (size_t)j, tl_rng_uniform(r, -4, 4));
		}
	}
	for (int64_t i = 0; i < M; i++) {
		for (int64_t j = 0; j < N; j++) {
			double acc = 0;

			for (int64_t q = 0; q < K; q++) {
				acc += tl_load(at, k.ptr[RP_GEMM_A], (size_t)(i * (K + 3) + q)) *
				       tl_load(bt, k.ptr[RP_GEMM_B], (size_t)(j * K + q));
			}
			acc *= 0.75 * (double)sa * (double)sb;
			if (bias_gelu) {
				acc += tl_load(dt, k.ptr[RP_GEMM_BIAS], (size_t)j);
				acc = 0.5 * acc * (1 + tanh(sqrt(2 / M_PI) * (acc + 0.044715 * acc * acc * acc)));
			}
			ref[i * N + j] = acc;
			amax_want = fmax(amax_want, fabs(acc));
		}
	}
	/* An FP8 d aims its largest value at half the format's largest. */
	const float d_scale = fp8_d ? (float)(rp_fp8_max(dt) / 2 / fmax(amax_want, 1e-30)) : 1.0f;
	if (fp8_d) {
		*f32_at(&k, RP_GEMM_D_SCALE) = d_scale;
	}
	call_run(&k);
	for (int64_t i = 0; i < M; i++) {
		for (int64_t j = 0; j < N; j++) {
			const double got = tl_load(dt, k.ptr[RP_GEMM_D], (size_t)(i * (N + 1) + j));
			const double want = ref[i * N + j] * d_scale;
			/* The output's rounding (half an ulp of its dtype) and
			 * f64's sum; an FP8 d's subnormals round by their step. */
			const double tol = tl_dtype_eps(dt) / 2 * fabs(want) * 1.0001 + tl_dtype_quantum(dt) / 2 +
					   1e-12 * amax_want * d_scale;

			ck_assert_msg(fabs(got - want) <= tol, "%s x %s -> %s [%lld,%lld,%lld] (%lld,%lld): %.9g, want %.9g (seed %llu)",
				      rp_dtype_name(at), rp_dtype_name(bt), rp_dtype_name(dt), (long long)M, (long long)N,
				      (long long)K, (long long)i, (long long)j, got, want, SEED);
			worst = fmax(worst, fabs(got - want));
		}
		if (i + 1 < M) {
			ck_assert(tl_is_poison(dt, k.ptr[RP_GEMM_D], (size_t)(i * (N + 1) + N)));
		}
	}
	if (fp8_d) {
		ck_assert_msg(fabs(*f32_at(&k, RP_GEMM_AMAX_D) - amax_want) <= 1e-6 * amax_want, "amax_d %g, want %g",
			      (double)*f32_at(&k, RP_GEMM_AMAX_D), amax_want);
	}
	free(ref);
	call_free(&k);
}

START_TEST(fp8_gemm_matches_f64_of_the_dequantized_operands)
{
	struct tl_rng r;
	const enum rp_dtype outs[] = { RP_DTYPE_F32, RP_DTYPE_F16, RP_DTYPE_BF16, RP_DTYPE_E4M3, RP_DTYPE_E5M2 };

	tl_rng_init(&r, 3);
	for (int o = 0; o < 5; o++) {
		/* No e5m2 from two e4m3: refused, as cuBLASLt has no such kernel
		 * (test_compute_parse). */
		if (outs[o] != RP_DTYPE_E5M2)
			check_fp8_gemm(&r, RP_DTYPE_E4M3, RP_DTYPE_E4M3, outs[o], false);
		check_fp8_gemm(&r, RP_DTYPE_E5M2, RP_DTYPE_E4M3, outs[o], false);
		check_fp8_gemm(&r, RP_DTYPE_E4M3, RP_DTYPE_E5M2, outs[o], false);
	}
	check_fp8_gemm(&r, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_BF16, true);
	check_fp8_gemm(&r, RP_DTYPE_E5M2, RP_DTYPE_E4M3, RP_DTYPE_F16, true);
}
END_TEST

/* ---- ScaleUpdate ---------------------------------------------------------------------- */

START_TEST(scale_update_is_transformer_engines)
{
	struct tl_rng r;

	tl_rng_init(&r, 4);
	for (int round = 0; round < 8; round++) {
		const int64_t H = tl_rng_int(&r, 1, 20), N = tl_rng_int(&r, 1, 9);
		const bool in_place = round & 1, recent = round & 2, e5m2 = round & 4;
		const double margin = (double)tl_rng_int(&r, 0, 3);
		const int64_t hs[2] = { H, N }, ns[1] = { N };
		char params[1536], h[200], s[200], ho[200], so[200], si[200];
		struct call k;

		operand_json(h, sizeof(h), "amax_history", RP_SCU_AMAX_HISTORY, "f32", 2, hs, N + 2);
		operand_json(s, sizeof(s), "scale", RP_SCU_SCALE, "f32", 1, ns, 0);
		operand_json(ho, sizeof(ho), "amax_history_out", in_place ? RP_SCU_AMAX_HISTORY : RP_SCU_AMAX_HISTORY_OUT,
			     "f32", 2, hs, N + 2);
		operand_json(so, sizeof(so), "scale_out", in_place ? RP_SCU_SCALE : RP_SCU_SCALE_OUT, "f32", 1, ns, 0);
		operand_json(si, sizeof(si), "scale_inv", RP_SCU_SCALE_INV, "f32", 1, ns, 0);
		snprintf(params, sizeof(params), "{%s, %s, %s, %s, %s, \"margin\": %g%s%s}", h, s, ho, so, si, margin,
			 recent ? ", \"amax_compute\": \"most_recent\"" : "", e5m2 ? ", \"fp8_dtype\": \"e5m2\"" : "");
		call_parse(&k, &rp_op_scale_update, params);
		if (in_place) {
			/* One array for each input and its output (the outputs' own,
			 * made by call_parse, go). */
			free(k.ptr[RP_SCU_AMAX_HISTORY_OUT]);
			free(k.ptr[RP_SCU_SCALE_OUT]);
			k.ptr[RP_SCU_AMAX_HISTORY_OUT] = k.ptr[RP_SCU_AMAX_HISTORY];
			k.ptr[RP_SCU_SCALE_OUT] = k.ptr[RP_SCU_SCALE];
		}
		float *hist = k.ptr[RP_SCU_AMAX_HISTORY], *scale = k.ptr[RP_SCU_SCALE];
		float *old_hist = malloc((size_t)(H * (N + 2)) * sizeof(float)), *old_scale = malloc((size_t)N * sizeof(float));

		for (int64_t n = 0; n < N; n++) {
			scale[n] = (float)tl_rng_uniform(&r, 0.5, 100);
			for (int64_t i = 0; i < H; i++) {
				/* Column 0 all zeros (the scale stays), column 1 an
				 * infinity (stays too), the rest random. */
				hist[i * (N + 2) + n] = n == 0 ? 0.0f : n == 1 && i == H - 1 ? INFINITY
								  : (float)ldexp(tl_rng_uniform(&r, 0, 1), (int)tl_rng_int(&r, -140, 20));
			}
		}
		/* The history's extent: its last row ends at column N, without the padding. */
		memcpy(old_hist, hist, k.bytes[RP_SCU_AMAX_HISTORY]);
		memcpy(old_scale, scale, (size_t)N * sizeof(float));
		call_run(&k);
		const float *hout = k.ptr[RP_SCU_AMAX_HISTORY_OUT], *sout = k.ptr[RP_SCU_SCALE_OUT];
		const float *sinv = k.ptr[RP_SCU_SCALE_INV];
		const float scaled_max = (e5m2 ? 57344.0f : 448.0f) * powf(2.0f, -(float)margin);

		for (int64_t n = 0; n < N; n++) {
			float amax = 0, want;

			for (int64_t i = 0; i < H; i++) {
				const float rolled = i == 0 ? 0.0f : old_hist[(i + 1 < H ? i + 1 : 0) * (N + 2) + n];

				amax = fmaxf(amax, old_hist[i * (N + 2) + n]);
				ck_assert_msg(memcmp(&hout[i * (N + 2) + n], &rolled, 4) == 0, "history[%lld][%lld]",
					      (long long)i, (long long)n);
			}
			if (recent) {
				amax = old_hist[n];
			}
			want = isfinite(amax) && amax > 0 ? scaled_max / amax : old_scale[n];
			if (isinf(want)) {
				want = FLT_MAX;
			}
			ck_assert_msg(sout[n] == want, "scale[%lld] %g, want %g (seed %llu)", (long long)n, (double)sout[n],
				      (double)want, SEED);
			ck_assert(sinv[n] == 1.0f / want);
		}
		free(old_hist);
		free(old_scale);
		if (in_place) {
			k.ptr[RP_SCU_AMAX_HISTORY_OUT] = k.ptr[RP_SCU_SCALE_OUT] = NULL;
		}
		call_free(&k);
	}
}
END_TEST

/* ---- bad scales ------------------------------------------------------------------------- */

START_TEST(bad_scales_are_refused_by_name)
{
	const float bad[] = { 0.0f, -1.0f, NAN, INFINITY };
	const int64_t xs[2] = { 4, 8 }, one[1] = { 1 };
	char params[1024], x[200], scale[200], y[200], a[200], b[200], d[200], as[200], bs[200];
	struct call q, g;

	operand_json(x, sizeof(x), "x", RP_QUANT_X, "bf16", 2, xs, 8);
	operand_json(scale, sizeof(scale), "scale", RP_QUANT_SCALE, "f32", 1, one, 0);
	operand_json(y, sizeof(y), "y", RP_QUANT_Y, "e4m3", 2, xs, 8);
	snprintf(params, sizeof(params), "{%s, %s, %s}", x, scale, y);
	call_parse(&q, &rp_op_quantize, params);
	operand_json(a, sizeof(a), "a", RP_GEMM_A, "e4m3", 2, xs, 8);
	operand_json(b, sizeof(b), "b", RP_GEMM_B, "e4m3", 2, xs, 8);
	operand_json(d, sizeof(d), "d", RP_GEMM_D, "bf16", 2, (const int64_t[]){ 4, 4 }, 4);
	operand_json(as, sizeof(as), "a_scale", RP_GEMM_A_SCALE, "f32", 1, one, 0);
	operand_json(bs, sizeof(bs), "b_scale", RP_GEMM_B_SCALE, "f32", 1, one, 0);
	snprintf(params, sizeof(params), "{%s, %s, %s, %s, %s, \"trans_b\": true}", a, b, d, as, bs);
	call_parse(&g, &rp_op_gemm, params);
	for (int i = 0; i < 4; i++) {
		struct rp_error err = { 0 };
		const cJSON *named;

		*f32_at(&q, RP_QUANT_SCALE) = bad[i];
		ck_assert_int_eq(rd_host_check(&q.c, q.ptr, &err), -EINVAL);
		ck_assert_str_eq(err.name, RP_ERR_INVALID_OPERAND);
		named = cJSON_GetObjectItemCaseSensitive(err.params, "operand");
		ck_assert_str_eq(named->valuestring, "scale");
		rp_error_clear(&err);

		*f32_at(&g, RP_GEMM_A_SCALE) = 1.0f;
		*f32_at(&g, RP_GEMM_B_SCALE) = bad[i];
		ck_assert_int_eq(rd_host_check(&g.c, g.ptr, &err), -EINVAL);
		named = cJSON_GetObjectItemCaseSensitive(err.params, "operand");
		ck_assert_str_eq(named->valuestring, "b_scale");
		rp_error_clear(&err);
	}
	call_free(&q);
	call_free(&g);
}
END_TEST

static Suite *host_fp8_suite(void)
{
	Suite *s = suite_create("host_fp8");
	TCase *t = tcase_create("fp8");

	tcase_set_timeout(t, 60);
	tcase_add_test(t, every_byte_decodes_as_its_fields_say);
	tcase_add_test(t, encoding_rounds_to_nearest_even_and_saturates);
	tcase_add_test(t, quantize_matches_byte_for_byte);
	tcase_add_test(t, fp8_gemm_matches_f64_of_the_dequantized_operands);
	tcase_add_test(t, scale_update_is_transformer_engines);
	tcase_add_test(t, bad_scales_are_refused_by_name);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return unit_run(host_fp8_suite());
}
