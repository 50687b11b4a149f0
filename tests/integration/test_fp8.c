/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's FP8 calls against a real regend (host backend), on memfd
 * buffers, with fresh random inputs (the seed is logged; REGEN_TEST_SEED
 * replays one) and outputs poisoned before each call:
 *
 * - regen_quantize and regen_transpose_quantize byte for byte against the
 *   tests' own codec (tests/lib/dtype.c) of the f32 product x * scale, and
 *   their amax;
 * - regen_gemm with FP8 a and b and their scales, into f32, bf16 and e4m3
 *   (with d_scale and amax_d), against float64 of the dequantized
 *   operands;
 * - regen_scale_update out of place and in place, both formats and both
 *   amax algorithms, bit for bit against Transformer Engine's arithmetic
 *   written here in f32;
 * - the same calls queued (the _submit forms) and waited for at once;
 * - a bad scale (0, negative, infinite, NaN), a wrong dtype, a missing
 *   scale and a margin out of range refused by name, nothing written.
 *
 * Run once per transport (tests/integration/meson.build): the ring's
 * records carry the same calls. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/lib/client.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"

static struct tl_daemon daemon_;

static enum rp_dtype rp(enum regen_dtype dt)
{
	return (enum rp_dtype)dt;
}

static struct regen_tensor matrix(struct tl_buffer *b, uint64_t offset, enum regen_dtype dt, int64_t rows,
				  int64_t cols, int64_t ld)
{
	return (struct regen_tensor){ .buffer = b->buf, .offset = offset, .dtype = dt, .rank = 2,
				      .shape = { rows, cols }, .strides = { ld, 1 } };
}

static struct regen_tensor vector(struct tl_buffer *b, uint64_t offset, int64_t n)
{
	return (struct regen_tensor){ .buffer = b->buf, .offset = offset, .dtype = REGEN_F32, .rank = 1,
				      .shape = { n } };
}

static float *f32_at(struct tl_buffer *b, uint64_t offset)
{
	return (float *)((char *)b->mem.ptr + offset);
}

static uint8_t *u8_at(struct tl_buffer *b, uint64_t offset)
{
	return (uint8_t *)b->mem.ptr + offset;
}

/* The error parameters name `operand`. */
static void assert_names(regen_client *c, const char *key, const char *value, const char *what)
{
	const char *params = regen_client_error_parameters(c);
	char want[128];

	snprintf(want, sizeof(want), "\"%s\":\"%s\"", key, value);
	ASSERT(params != NULL && strstr(params, want) != NULL, "%s: the refusal %s does not name %s", what,
	       params ? params : "(none)", want);
	tl_log("ok  %s: %s %s", what, regen_client_error_name(c), params);
}

/* ---- quantize ------------------------------------------------------------------- */

static void quantize_cases(regen_client *c, struct tl_buffer *b)
{
	static const enum regen_dtype ins[] = { REGEN_F32, REGEN_F16, REGEN_BF16 };
	static const enum regen_dtype fp8s[] = { REGEN_E4M3, REGEN_E5M2 };
	enum { X = 0, Y = 1 << 16, YT = 2 << 16, S = 3 << 16, AMAX = S + 64 };

	for (int t = 0; t < 12; t++) {
		const enum regen_dtype in = ins[t % 3], out = fp8s[(t / 3) % 2];
		const int rows = tl_rand_int(1, 40), cols = tl_rand_int(1, 40), pad = t & 1 ? tl_rand_int(1, 5) : 0;
		const int ldx = cols + pad, ldy = cols + pad, ldt = rows + pad;
		/* Scales that put values past the format's range, and well inside. */
		const float scale = (float)(t < 6 ? tl_rand_uniform(0.01, 4) : tl_rand_uniform(50, 400));
		const bool transpose = t >= 6;
		double x[40 * 40];
		char desc[160];

		snprintf(desc, sizeof(desc), "%squantize %s [%d, %d] pad %d into %s, scale %g", transpose ? "transpose-" : "",
			 rp_dtype_name(rp(in)), rows, cols, pad, rp_dtype_name(rp(out)), scale);
		for (int i = 0; i < rows; i++) {
			tl_fill_random(NULL, rp(in), (char *)b->mem.ptr + X + (size_t)i * ldx * rp_dtype_size(rp(in)),
				       (size_t)cols, -3, 3, x + i * cols);
		}
		memset(u8_at(b, Y), 0xa5, (size_t)rows * ldy);
		memset(u8_at(b, YT), 0xa5, (size_t)cols * ldt);
		*f32_at(b, S) = scale;
		*f32_at(b, AMAX) = NAN;
		struct regen_tensor xt = matrix(b, X, in, rows, cols, ldx), st = vector(b, S, 1), at = vector(b, AMAX, 1);
		struct regen_tensor yt = matrix(b, Y, out, rows, cols, ldy), ytt = matrix(b, YT, out, cols, rows, ldt);
		if (transpose) {
			struct regen_transpose_quantize_args a = { .x = xt, .scale = st, .y_t = ytt, .amax = &at };

			a.y = t % 2 ? &yt : NULL;
			ASSERT_REGEN_OK(c, regen_transpose_quantize(c, &a), "%s", desc);
		} else {
			struct regen_quantize_args a = { .x = xt, .scale = st, .y = yt, .amax = &at };

			ASSERT_REGEN_OK(c, regen_quantize(c, &a), "%s", desc);
		}
		tl_check_transport(c, 0);
		double amax = 0;
		for (int i = 0; i < rows; i++) {
			for (int j = 0; j < cols; j++) {
				const double v = x[i * cols + j];
				/* An f32 product, then the one rounding to FP8. */
				const uint8_t want = tl_fp8_encode(rp(out), (double)((float)v * scale));

				amax = fmax(amax, fabs(v));
				if (!transpose || t % 2) {
					ASSERT_EQ(u8_at(b, Y)[i * ldy + j], want, "%s: y[%d][%d] of %g", desc, i, j, v);
				}
				if (transpose) {
					ASSERT_EQ(u8_at(b, YT)[j * ldt + i], want, "%s: y_t[%d][%d] of %g", desc, j, i, v);
				}
			}
			/* Row padding stays as it was. */
			for (int j = cols; j < ldy && (!transpose || t % 2); j++) {
				ASSERT_EQ(u8_at(b, Y)[i * ldy + j], 0xa5, "%s: y's padding written", desc);
			}
		}
		if (transpose && t % 2 == 0) {
			ASSERT_EQ(u8_at(b, Y)[0], 0xa5, "%s: y written though not given", desc);
		}
		ASSERT(*f32_at(b, AMAX) == (float)amax, "%s: amax %g, want %g", desc, *f32_at(b, AMAX), amax);
	}
	tl_log("ok  quantize and transpose-quantize byte for byte");
}

/* ---- the FP8 GEMM ------------------------------------------------------------------ */

/* Whether the FP8 byte `got` is what `v` (computed in another order than
 * regend's) rounds to, allowing for a tie either side. */
static bool fp8_near(enum rp_dtype dt, uint8_t got, double v)
{
	return got == tl_fp8_encode(dt, v) || got == tl_fp8_encode(dt, v * (1 + 1e-12)) ||
	       got == tl_fp8_encode(dt, v * (1 - 1e-12));
}

static void gemm_cases(regen_client *c, struct tl_buffer *b)
{
	static const enum regen_dtype outs[] = { REGEN_F32, REGEN_BF16, REGEN_E4M3 };
	enum { A = 0, B = 1 << 16, D = 2 << 16, SCALES = 3 << 16 };

	for (int t = 0; t < 9; t++) {
		const enum regen_dtype ta = REGEN_E4M3, tb = t % 2 ? REGEN_E5M2 : REGEN_E4M3, td = outs[t % 3];
		const int m = tl_rand_int(1, 33), n = tl_rand_int(1, 33), k = tl_rand_int(1, 48);
		const int lda = k + (t & 2 ? 3 : 0), ldb = k + (t & 4 ? 5 : 0), ldd = n;
		const float sa = (float)tl_rand_uniform(0.05, 3), sb = (float)tl_rand_uniform(0.05, 3);
		const float sd = (float)tl_rand_uniform(0.01, 0.5);
		static double ref[33 * 33];
		double amax = 0;
		char desc[160];

		snprintf(desc, sizeof(desc), "gemm %s x %s -> %s, %dx%dx%d", rp_dtype_name(rp(ta)), rp_dtype_name(rp(tb)),
			 rp_dtype_name(rp(td)), m, n, k);
		/* Random bytes are random FP8 values; NaN codes are redrawn. */
		for (int i = 0; i < m * lda; i++) {
			do {
				u8_at(b, A)[i] = (uint8_t)tl_rand_int(0, 255);
			} while (isnan(tl_fp8_decode(rp(ta), u8_at(b, A)[i])) || isinf(tl_fp8_decode(rp(ta), u8_at(b, A)[i])));
		}
		for (int i = 0; i < n * ldb; i++) {
			do {
				u8_at(b, B)[i] = (uint8_t)tl_rand_int(0, 255);
			} while (isnan(tl_fp8_decode(rp(tb), u8_at(b, B)[i])) || isinf(tl_fp8_decode(rp(tb), u8_at(b, B)[i])));
		}
		tl_poison(rp(td), u8_at(b, D), (size_t)m * ldd);
		f32_at(b, SCALES)[0] = sa;
		f32_at(b, SCALES)[1] = sb;
		f32_at(b, SCALES)[2] = sd;
		f32_at(b, SCALES)[3] = NAN;
		for (int i = 0; i < m; i++) {
			for (int j = 0; j < n; j++) {
				double acc = 0;

				for (int q = 0; q < k; q++) {
					acc += tl_fp8_decode(rp(ta), u8_at(b, A)[i * lda + q]) *
					       tl_fp8_decode(rp(tb), u8_at(b, B)[j * ldb + q]);
				}
				ref[i * n + j] = (double)sa * (double)sb * acc;
				amax = fmax(amax, fabs(ref[i * n + j]));
			}
		}
		struct regen_tensor as = vector(b, SCALES, 1), bs = vector(b, SCALES + 4, 1);
		struct regen_tensor ds = vector(b, SCALES + 8, 1), amax_d = vector(b, SCALES + 12, 1);
		struct regen_gemm_args g = {
			.a = matrix(b, A, ta, m, k, lda), .b = matrix(b, B, tb, n, k, ldb), .d = matrix(b, D, td, m, n, ldd),
			.trans_b = true, .a_scale = &as, .b_scale = &bs,
		};
		if (td == REGEN_E4M3) {
			g.d_scale = &ds;
			g.amax_d = &amax_d;
		}
		ASSERT_REGEN_OK(c, regen_gemm(c, &g), "%s", desc);
		for (int i = 0; i < m * n; i++) {
			if (td == REGEN_E4M3) {
				const uint8_t got = u8_at(b, D)[i];

				ASSERT(fp8_near(rp(td), got, (double)sd * ref[i]), "%s: d[%d] = %g, want fp8(%g)", desc, i,
				       tl_fp8_decode(rp(td), got), (double)sd * ref[i]);
			} else {
				const double got = tl_load(rp(td), u8_at(b, D), (size_t)i);

				/* One rounding to d's dtype of an exact (f64) sum. */
				ASSERT_DOUBLE_LE(fabs(got - ref[i]), tl_dtype_eps(rp(td)) * fabs(ref[i]) + 1e-30,
						 "%s: d[%d] = %.9g, want %.9g", desc, i, got, ref[i]);
			}
		}
		if (td == REGEN_E4M3) {
			ASSERT_DOUBLE_LE(fabs(f32_at(b, SCALES)[3] - amax), 2e-7 * amax, "%s: amax_d %g, want %g", desc,
					 f32_at(b, SCALES)[3], amax);
		}
	}
	tl_log("ok  FP8 GEMMs against float64 of the dequantized operands");
}

/* ---- the delayed-scaling update ---------------------------------------------------- */

/* Transformer Engine's update of one column, in f32. */
static float te_scale(const float *column, int h, float old, enum regen_fp8_format f,
		      enum regen_amax_compute algo, double margin)
{
	const float fp8_max = f == REGEN_FP8_E5M2 ? 57344.0f : 448.0f;
	const float scaled_max = fp8_max * powf(2.0f, -(float)margin);
	float amax = 0.0f, s;

	for (int i = 0; i < h; i++) {
		amax = fmaxf(amax, column[i]);
	}
	if (algo == REGEN_AMAX_COMPUTE_MOST_RECENT) {
		amax = column[0];
	}
	s = isfinite(amax) && amax > 0.0f ? scaled_max / amax : old;
	return isinf(s) ? FLT_MAX : s;
}

static void scale_update_cases(regen_client *c, struct tl_buffer *b)
{
	enum { HIST = 0, SCALE = 1 << 14, HIST_OUT = 2 << 14, SCALE_OUT = 3 << 14, INV = 4 << 14 };

	for (int t = 0; t < 8; t++) {
		const int h = tl_rand_int(1, 16), n = tl_rand_int(4, 12), ld = n + (t & 1 ? 2 : 0);
		const bool in_place = t & 2;
		const enum regen_fp8_format f = t & 4 ? REGEN_FP8_E5M2 : REGEN_FP8_E4M3;
		const enum regen_amax_compute algo = (t / 3) % 2 ? REGEN_AMAX_COMPUTE_MOST_RECENT : REGEN_AMAX_COMPUTE_MAX;
		const double margin = (double)tl_rand_int(-2, 3);
		float hist[16 * 12], scale[12];
		char desc[160];

		snprintf(desc, sizeof(desc), "scale_update H %d N %d %s %s margin %g%s", h, n, f ? "e5m2" : "e4m3",
			 algo ? "most_recent" : "max", margin, in_place ? " in place" : "");
		for (int i = 0; i < h; i++) {
			for (int j = 0; j < n; j++) {
				hist[i * n + j] = (float)tl_rand_uniform(0, 100);
			}
		}
		/* Column 0 never saw a value (the old scale stays), column 1 an
		 * infinite one (it stays too), column 2 one so small that the
		 * quotient overflows (FLT_MAX). */
		for (int i = 0; i < h; i++) {
			hist[i * n] = 0;
			hist[i * n + 1] = i == 0 ? INFINITY : 1;
			hist[i * n + 2] = 0;
		}
		hist[2] = 1e-38f;
		for (int j = 0; j < n; j++) {
			scale[j] = (float)tl_rand_uniform(0.5, 2);
		}
		for (int i = 0; i < h; i++) {
			memcpy(f32_at(b, HIST) + i * ld, hist + i * n, (size_t)n * sizeof(float));
		}
		memcpy(f32_at(b, SCALE), scale, sizeof(scale));
		tl_poison(RP_DTYPE_F32, f32_at(b, HIST_OUT), (size_t)h * ld);
		tl_poison(RP_DTYPE_F32, f32_at(b, SCALE_OUT), 12);
		tl_poison(RP_DTYPE_F32, f32_at(b, INV), 12);
		struct regen_tensor inv = vector(b, INV, n);
		struct regen_scale_update_args u = {
			.amax_history = matrix(b, HIST, REGEN_F32, h, n, ld), .scale = vector(b, SCALE, n),
			.amax_history_out = matrix(b, in_place ? HIST : HIST_OUT, REGEN_F32, h, n, ld),
			.scale_out = vector(b, in_place ? SCALE : SCALE_OUT, n), .scale_inv = &inv,
			.fp8_format = f, .amax_compute = algo, .margin = margin,
		};
		ASSERT_REGEN_OK(c, regen_scale_update(c, &u), "%s", desc);
		const float *hist_out = f32_at(b, in_place ? HIST : HIST_OUT), *scale_out = f32_at(b, in_place ? SCALE : SCALE_OUT);
		for (int j = 0; j < n; j++) {
			float column[16];

			for (int i = 0; i < h; i++) {
				column[i] = hist[i * n + j];
			}
			const float want = te_scale(column, h, scale[j], f, algo, margin);
			ASSERT(memcmp(&scale_out[j], &want, sizeof(want)) == 0, "%s: scale[%d] %.9g, want %.9g", desc, j,
			       scale_out[j], want);
			ASSERT(f32_at(b, INV)[j] == 1.0f / want, "%s: scale_inv[%d] %.9g, want %.9g", desc, j,
			       f32_at(b, INV)[j], 1.0f / want);
			for (int i = 0; i < h; i++) {
				/* Rolled: row i takes row i + 1, the last the old row
				 * 0, and row 0 is zeroed for the next amax. */
				const float w = i == 0 ? 0.0f : i < h - 1 ? column[i + 1] : column[0];

				ASSERT(memcmp(&hist_out[i * ld + j], &w, sizeof(w)) == 0, "%s: history[%d][%d] %g, want %g",
				       desc, i, j, hist_out[i * ld + j], w);
			}
		}
		if (ld > n && !in_place) {
			ASSERT(tl_is_poison(RP_DTYPE_F32, f32_at(b, HIST_OUT), (size_t)n), "%s: padding written", desc);
		}
	}
	tl_log("ok  scale updates bit for bit");
}

/* ---- queued ------------------------------------------------------------------------ */

/* A layer's forward as a queue: the update, both quantizations (their amax
 * into the history's row 0), the GEMM with the new scale_inv; one wait. The
 * result is the same GEMM computed from the bytes the quantizations wrote. */
static void queued_forward(regen_client *c, struct tl_buffer *b)
{
	enum { X = 0, W = 8192, XQ = 16384, WQ = 20480, Y = 24576, HIST = 32768, SCALE = 33792, INV = 34048 };
	const int m = 12, n = 10, k = 16, h = 4;
	uint64_t ticket = 0;
	double x[12 * 16], w[10 * 16];

	tl_fill_random(NULL, RP_DTYPE_F32, f32_at(b, X), (size_t)m * k, -2, 2, x);
	tl_fill_random(NULL, RP_DTYPE_F32, f32_at(b, W), (size_t)n * k, -1, 1, w);
	for (int i = 0; i < h * 2; i++) {
		f32_at(b, HIST)[i] = (float)(i + 1);
	}
	f32_at(b, SCALE)[0] = f32_at(b, SCALE)[1] = 1;
	tl_poison(RP_DTYPE_F32, f32_at(b, Y), (size_t)m * n);
	struct regen_tensor hist = matrix(b, HIST, REGEN_F32, h, 2, 2), scale = vector(b, SCALE, 2);
	struct regen_tensor inv = vector(b, INV, 2);
	struct regen_tensor sx = vector(b, SCALE, 1), sw = vector(b, SCALE + 4, 1);
	struct regen_tensor ix = vector(b, INV, 1), iw = vector(b, INV + 4, 1);
	struct regen_tensor ax = vector(b, HIST, 1), aw = vector(b, HIST + 4, 1);
	struct regen_scale_update_args u = { .amax_history = hist, .scale = scale, .amax_history_out = hist,
					     .scale_out = scale, .scale_inv = &inv };
	struct regen_quantize_args qx = { .x = matrix(b, X, REGEN_F32, m, k, k), .scale = sx,
					  .y = matrix(b, XQ, REGEN_E4M3, m, k, k), .amax = &ax };
	struct regen_quantize_args qw = { .x = matrix(b, W, REGEN_F32, n, k, k), .scale = sw,
					  .y = matrix(b, WQ, REGEN_E4M3, n, k, k), .amax = &aw };
	struct regen_gemm_args g = { .a = qx.y, .b = qw.y, .d = matrix(b, Y, REGEN_F32, m, n, n), .trans_b = true,
				     .a_scale = &ix, .b_scale = &iw };

	ASSERT_REGEN_OK(c, regen_scale_update_submit(c, &u, &ticket));
	ASSERT_REGEN_OK(c, regen_quantize_submit(c, &qx, &ticket));
	ASSERT_REGEN_OK(c, regen_quantize_submit(c, &qw, &ticket));
	ASSERT_REGEN_OK(c, regen_gemm_submit(c, &g, &ticket));
	ASSERT_REGEN_OK(c, regen_wait(c, 0, ticket));
	/* The history's max was 7 for x and 8 for w. */
	ASSERT(f32_at(b, SCALE)[0] == 448.0f / 7.0f && f32_at(b, SCALE)[1] == 448.0f / 8.0f, "scales %g %g",
	       f32_at(b, SCALE)[0], f32_at(b, SCALE)[1]);
	double amax_x = 0, amax_w = 0;
	for (int i = 0; i < m * k; i++) {
		amax_x = fmax(amax_x, fabs(x[i]));
		ASSERT_EQ(u8_at(b, XQ)[i], tl_fp8_encode(RP_DTYPE_E4M3, (double)((float)x[i] * f32_at(b, SCALE)[0])),
			  "x's byte %d", i);
	}
	for (int i = 0; i < n * k; i++) {
		amax_w = fmax(amax_w, fabs(w[i]));
	}
	ASSERT(f32_at(b, HIST)[0] == (float)amax_x && f32_at(b, HIST)[1] == (float)amax_w,
	       "the quantizations' amax went to row 0: %g %g, want %g %g", f32_at(b, HIST)[0], f32_at(b, HIST)[1],
	       amax_x, amax_w);
	for (int i = 0; i < m; i++) {
		for (int j = 0; j < n; j++) {
			double acc = 0;

			for (int q = 0; q < k; q++) {
				acc += tl_fp8_decode(RP_DTYPE_E4M3, u8_at(b, XQ)[i * k + q]) *
				       tl_fp8_decode(RP_DTYPE_E4M3, u8_at(b, WQ)[j * k + q]);
			}
			acc *= (double)f32_at(b, INV)[0] * (double)f32_at(b, INV)[1];
			/* Against x @ w.T itself: FP8's own error, a few percent. */
			double exact = 0;
			for (int q = 0; q < k; q++) {
				exact += x[i * k + q] * w[j * k + q];
			}
			ASSERT_DOUBLE_LE(fabs(f32_at(b, Y)[i * n + j] - acc), 1.2e-7 * fabs(acc) + 1e-30, "y[%d][%d]", i, j);
			ASSERT_DOUBLE_LE(fabs(acc - exact), 0.1 * sqrt((double)k) + 0.05 * fabs(exact), "y[%d][%d] vs exact",
					 i, j);
		}
	}
	tl_log("ok  a forward queued and waited for once");
}

/* ---- refusals ---------------------------------------------------------------------- */

static void refusals(regen_client *c, struct tl_buffer *b)
{
	static const float bad[] = { 0.0f, -1.0f, INFINITY, NAN };
	enum { X = 0, Y = 4096, S = 8192, W = 12288 };
	struct regen_tensor x = matrix(b, X, REGEN_F32, 4, 16, 16), y = matrix(b, Y, REGEN_E4M3, 4, 16, 16);
	struct regen_tensor s = vector(b, S, 1), s2 = vector(b, S + 4, 1), w = matrix(b, W, REGEN_E4M3, 4, 16, 16);
	struct regen_tensor d = matrix(b, X, REGEN_F32, 4, 4, 4);
	unsigned char before[4096];
	char what[96];

	tl_fill_random(NULL, RP_DTYPE_F32, f32_at(b, X), 64, -1, 1, NULL);
	memset(u8_at(b, W), 0x38, 64);   /* e4m3 1.0 */
	memset(u8_at(b, Y), 0x5a, 64);
	f32_at(b, S)[1] = 1;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		f32_at(b, S)[0] = bad[i];
		memcpy(before, u8_at(b, Y), sizeof(before));
		snprintf(what, sizeof(what), "quantize with scale %g", bad[i]);
		ASSERT_REGEN_ERROR(c, regen_quantize(c, &(struct regen_quantize_args){ .x = x, .scale = s, .y = y }),
				   REGEN_ERROR_INVALID_OPERAND, "%s", what);
		assert_names(c, "operand", "scale", what);
		ASSERT(memcmp(before, u8_at(b, Y), sizeof(before)) == 0, "%s: y written", what);
		snprintf(what, sizeof(what), "an FP8 GEMM with a_scale %g", bad[i]);
		ASSERT_REGEN_ERROR(c, regen_gemm(c, &(struct regen_gemm_args){ .a = y, .b = w, .d = d, .trans_b = true,
									       .a_scale = &s, .b_scale = &s2 }),
				   REGEN_ERROR_INVALID_OPERAND, "%s", what);
		assert_names(c, "operand", "a_scale", what);
	}
	f32_at(b, S)[0] = 1;
	/* y in f32: a quantization writes FP8. */
	ASSERT_REGEN_ERROR(c, regen_quantize(c, &(struct regen_quantize_args){ .x = x, .scale = s,
									      .y = matrix(b, Y, REGEN_F32, 4, 16, 16) }),
			   REGEN_ERROR_INVALID_OPERAND);
	assert_names(c, "operand", "y", "quantize into f32");
	/* A scale in f16. */
	struct regen_tensor s16 = s;
	s16.dtype = REGEN_F16;
	ASSERT_REGEN_ERROR(c, regen_quantize(c, &(struct regen_quantize_args){ .x = x, .scale = s16, .y = y }),
			   REGEN_ERROR_INVALID_OPERAND);
	assert_names(c, "operand", "scale", "an f16 scale");
	/* FP8 a without its scale. */
	ASSERT_REGEN_ERROR(c, regen_gemm(c, &(struct regen_gemm_args){ .a = y, .b = w, .d = d, .trans_b = true,
								       .b_scale = &s2 }),
			   REGEN_ERROR_INVALID_OPERAND);
	assert_names(c, "operand", "a_scale", "an FP8 GEMM without a_scale");
	/* A scale where no FP8 operand needs one. */
	ASSERT_REGEN_ERROR(c, regen_gemm(c, &(struct regen_gemm_args){ .a = matrix(b, X, REGEN_F32, 4, 16, 16),
								       .b = matrix(b, X, REGEN_F32, 4, 16, 16),
								       .d = matrix(b, W, REGEN_F32, 4, 4, 4),
								       .trans_b = true, .a_scale = &s }),
			   REGEN_ERROR_INVALID_OPERAND);
	assert_names(c, "operand", "a_scale", "a scale for an f32 operand");
	/* Both e5m2: cuBLASLt has no such kernel. */
	struct regen_tensor y5 = y, w5 = w;
	y5.dtype = w5.dtype = REGEN_E5M2;
	ASSERT_REGEN_ERROR(c, regen_gemm(c, &(struct regen_gemm_args){ .a = y5, .b = w5, .d = d, .trans_b = true,
								       .a_scale = &s, .b_scale = &s2 }),
			   REGEN_ERROR_INVALID_OPERAND);
	tl_log("ok  two e5m2 operands: %s", regen_client_error_parameters(c));
	/* A margin past what an f32 scale can carry. */
	struct regen_tensor hist = matrix(b, W, REGEN_F32, 2, 1, 1);
	ASSERT_REGEN_ERROR(c, regen_scale_update(c, &(struct regen_scale_update_args){
					 .amax_history = hist, .scale = s, .amax_history_out = hist, .scale_out = s,
					 .margin = 200 }),
			   REGEN_ERROR_INVALID_PARAMETER);
	assert_names(c, "parameter", "margin", "margin 200");
}

int main(void)
{
	struct tl_buffer b;
	regen_client *c;

	tl_init(110);
	tl_daemon_start(&daemon_, &(struct tl_daemon_opts){ .devices = 1 });
	c = tl_client_connect(&daemon_);
	tl_buffer_create(c, 0, 1 << 20, &b);
	quantize_cases(c, &b);
	gemm_cases(c, &b);
	scale_update_cases(c, &b);
	queued_forward(c, &b);
	refusals(c, &b);
	tl_buffer_free(&b);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
