/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 codecs and reference math for the host backend (fp8.h). The GEMM
 * sums in f64, so its answers are the exact products of the dequantized
 * operands up to f64 rounding: what the GPU's f32 accumulation is measured
 * against. Like math.c, no globals: several lane threads run these at
 * once. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/backend/host/fp8.h"
#include "daemon/backend/host/math.h"
#include "proto/errors.h"

/* The two formats: mantissa bits, exponent bias, the smallest normal's
 * exponent. */
struct fp8_format {
	int mbits, bias, emin;
	double max;
};

static const struct fp8_format e4m3 = { 3, 7, -6, 448.0 };
static const struct fp8_format e5m2 = { 2, 15, -14, 57344.0 };

static const struct fp8_format *format_of(enum rp_dtype dt)
{
	return dt == RP_DTYPE_E5M2 ? &e5m2 : &e4m3;
}

uint8_t rd_fp8_encode(double v, enum rp_dtype dt)
{
	const struct fp8_format *f = format_of(dt);
	const uint8_t sign = signbit(v) ? 0x80 : 0;
	double a = fabs(v), q, r;
	int e, exponent;

	if (isnan(v)) {
		return sign | 0x7f;
	}
	/* Clamping first gives what rounding then saturating would: the
	 * largest value is on the grid, and rounding is monotonic. */
	if (a > f->max) {
		a = f->max;
	}
	frexp(a, &e);
	exponent = a == 0.0 || e - 1 < f->emin ? f->emin : e - 1;
	/* The grid's step in a's binade (the subnormals' below the smallest
	 * normal); a / q is exact, and nearbyint rounds ties to even in the
	 * default rounding mode. */
	q = ldexp(1.0, exponent - f->mbits);
	r = nearbyint(a / q) * q;
	if (r == 0.0) {
		return sign;
	}
	frexp(r, &e);
	if (e - 1 < f->emin) {
		return sign | (uint8_t)(r / ldexp(1.0, f->emin - f->mbits));
	}
	const int mant = (int)((ldexp(r, -(e - 1)) - 1.0) * (double)(1 << f->mbits));

	return sign | (uint8_t)((e - 1 + f->bias) << f->mbits) | (uint8_t)mant;
}

double rd_fp8_decode(uint8_t b, enum rp_dtype dt)
{
	const struct fp8_format *f = format_of(dt);
	const int exp_field = (b & 0x7f) >> f->mbits, mant = b & ((1 << f->mbits) - 1);
	const double sign = b & 0x80 ? -1.0 : 1.0;

	if (dt == RP_DTYPE_E4M3 && (b & 0x7f) == 0x7f) {
		return NAN;
	}
	if (dt == RP_DTYPE_E5M2 && exp_field == 31) {
		return mant ? NAN : sign * INFINITY;
	}
	if (exp_field == 0) {
		return sign * ldexp((double)mant, f->emin - f->mbits);
	}
	return sign * ldexp(1.0 + (double)mant / (double)(1 << f->mbits), exp_field - f->bias);
}

/* ---- elements ------------------------------------------------------------------- */

static double load(const void *base, enum rp_dtype dt, int64_t i)
{
	switch (dt) {
	case RP_DTYPE_F32:
		return ((const float *)base)[i];
	case RP_DTYPE_F16:
		return rd_f16_to_f32(((const uint16_t *)base)[i]);
	case RP_DTYPE_BF16:
		return rd_bf16_to_f32(((const uint16_t *)base)[i]);
	default:
		return rd_fp8_decode(((const uint8_t *)base)[i], dt);
	}
}

/* One rounding into an FP8 dtype; f16 and bf16 go through f32 (a double
 * rounding the reference accepts: the GPU's own result is f32). */
static void store(void *base, enum rp_dtype dt, int64_t i, double v)
{
	switch (dt) {
	case RP_DTYPE_F32:
		((float *)base)[i] = (float)v;
		break;
	case RP_DTYPE_F16:
		((uint16_t *)base)[i] = rd_f32_to_f16((float)v);
		break;
	case RP_DTYPE_BF16:
		((uint16_t *)base)[i] = rd_f32_to_bf16((float)v);
		break;
	default:
		((uint8_t *)base)[i] = rd_fp8_encode(v, dt);
		break;
	}
}

static float scalar(void *const *ptr, int slot)
{
	return *(const float *)ptr[slot];
}

/* GELU's tanh approximation, cuBLASLt's epilogue's, in f64. */
static double gelu_tanh(double x)
{
	const double c = 0.7978845608028654;    /* sqrt(2/pi) */

	return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

/* ---- the GEMM --------------------------------------------------------------------- */

int rd_host_fp8_gemm(const struct rp_compute *c, void *const *ptr)
{
	const struct rp_gemm *g = &c->gemm;
	const struct rp_operand *A = &c->operands[RP_GEMM_A], *B = &c->operands[RP_GEMM_B];
	const struct rp_operand *C = &c->operands[RP_GEMM_C], *D = &c->operands[RP_GEMM_D];
	const struct rp_operand *bias = &c->operands[RP_GEMM_BIAS];
	const int64_t M = g->m, N = g->n, K = g->k;
	const bool read_c = c->present[RP_GEMM_C] && g->beta != 0.0;
	const bool add_bias = c->present[RP_GEMM_BIAS];
	const bool gelu = g->epilogue == RP_EPILOGUE_GELU || g->epilogue == RP_EPILOGUE_GELU_BIAS;
	const bool fp8_d = rp_dtype_is_fp8(D->dtype);
	const double ab_scale = (double)scalar(ptr, RP_GEMM_A_SCALE) * (double)scalar(ptr, RP_GEMM_B_SCALE);
	const double d_scale = fp8_d ? (double)scalar(ptr, RP_GEMM_D_SCALE) : 1.0;
	const uint8_t *pa = ptr[RP_GEMM_A], *pb = ptr[RP_GEMM_B];
	double table_a[256], table_b[256], *arow;
	float amax = 0.0f;

	if (M <= 0 || N <= 0 || K <= 0) {
		return -EINVAL;
	}
	arow = malloc((size_t)K * sizeof(*arow));
	if (!arow) {
		return -ENOMEM;
	}
	for (int v = 0; v < 256; v++) {
		table_a[v] = rd_fp8_decode((uint8_t)v, A->dtype);
		table_b[v] = rd_fp8_decode((uint8_t)v, B->dtype);
	}
	/* The one layout FP8 takes (proto/compute_gemm.c): A [M, K] and B
	 * [N, K], rows strided, K contiguous. */
	for (int64_t i = 0; i < M; i++) {
		const uint8_t *a = pa + i * A->strides[0];

		for (int64_t q = 0; q < K; q++) {
			arow[q] = table_a[a[q]];
		}
		for (int64_t j = 0; j < N; j++) {
			const uint8_t *b = pb + j * B->strides[0];
			double acc = 0.0, v;

			for (int64_t q = 0; q < K; q++) {
				acc += arow[q] * table_b[b[q]];
			}
			v = g->alpha * ab_scale * acc;
			if (read_c) {
				v += g->beta * load(ptr[RP_GEMM_C], C->dtype, i * C->strides[0] + j);
			}
			if (add_bias) {
				v += load(ptr[RP_GEMM_BIAS], bias->dtype, j * bias->strides[0]);
			}
			if (gelu) {
				v = gelu_tanh(v);
			}
			/* fmaxf's way: a NaN leaves the amax as it was. */
			amax = fmaxf(amax, (float)fabs(v));
			store(ptr[RP_GEMM_D], D->dtype, i * D->strides[0] + j, v * d_scale);
		}
	}
	if (c->present[RP_GEMM_AMAX_D]) {
		*(float *)ptr[RP_GEMM_AMAX_D] = amax;
	}
	free(arow);
	return 0;
}

/* ---- quantizing ------------------------------------------------------------------- */

int rd_host_quantize(const struct rp_compute *c, void *const *ptr)
{
	const struct rp_operand *x = &c->operands[RP_QUANT_X];
	const struct rp_operand *y = rp_compute_operand(c, RP_QUANT_Y);
	const struct rp_operand *y_t = c->spec->noperands > RP_QUANT_Y_T ? rp_compute_operand(c, RP_QUANT_Y_T) : NULL;
	const enum rp_dtype dt = y ? y->dtype : y_t->dtype;
	const float scale = scalar(ptr, RP_QUANT_SCALE);
	float amax = 0.0f;

	for (int64_t i = 0; i < c->quantize.rows; i++) {
		for (int64_t j = 0; j < c->quantize.cols; j++) {
			const float v = (float)load(ptr[RP_QUANT_X], x->dtype, i * x->strides[0] + j);
			/* An f32 product, then one rounding: the GPU's order. */
			const uint8_t q = rd_fp8_encode((double)(v * scale), dt);

			if (y) {
				((uint8_t *)ptr[RP_QUANT_Y])[i * y->strides[0] + j] = q;
			}
			if (y_t) {
				((uint8_t *)ptr[RP_QUANT_Y_T])[j * y_t->strides[0] + i] = q;
			}
			amax = fmaxf(amax, fabsf(v));
		}
	}
	if (c->present[RP_QUANT_AMAX]) {
		*(float *)ptr[RP_QUANT_AMAX] = amax;
	}
	return 0;
}

/* ---- the delayed-scaling update ---------------------------------------------------- */

int rd_host_scale_update(const struct rp_compute *c, void *const *ptr)
{
	const struct rp_scale_update *u = &c->scale_update;
	const int64_t H = u->history, N = u->n;
	const int64_t hs = c->operands[RP_SCU_AMAX_HISTORY].strides[0];
	const int64_t hos = c->operands[RP_SCU_AMAX_HISTORY_OUT].strides[0];
	const float *hist = ptr[RP_SCU_AMAX_HISTORY], *scale = ptr[RP_SCU_SCALE];
	float *hist_out = ptr[RP_SCU_AMAX_HISTORY_OUT], *scale_out = ptr[RP_SCU_SCALE_OUT];
	float *scale_inv = ptr[RP_SCU_SCALE_INV];
	/* Transformer Engine's arithmetic, in f32: fp8_max * 2^-margin. */
	const float scaled_max = (float)rp_fp8_max(rp_fp8_format_dtype(u->format)) * powf(2.0f, -(float)u->margin);
	float *column = malloc((size_t)H * sizeof(*column));

	if (!column) {
		return -ENOMEM;
	}
	for (int64_t n = 0; n < N; n++) {
		float amax = 0.0f, s;

		/* The column first, whole: the output may be the input. */
		for (int64_t i = 0; i < H; i++) {
			column[i] = hist[i * hs + n];
			amax = fmaxf(amax, column[i]);
		}
		if (u->amax_compute == RP_AMAX_COMPUTE_MOST_RECENT) {
			amax = column[0];
		}
		for (int64_t i = 0; i < H; i++) {
			hist_out[i * hos + n] = i == 0 ? 0.0f : i < H - 1 ? column[i + 1] : column[0];
		}
		s = isfinite(amax) && amax > 0.0f ? scaled_max / amax : scale[n];
		if (isinf(s)) {
			s = FLT_MAX;
		}
		scale_out[n] = s;
		if (scale_inv) {
			scale_inv[n] = 1.0f / s;
		}
	}
	free(column);
	return 0;
}

/* ---- what lives in memory ------------------------------------------------------------ */

static int check_scale(const struct rp_compute *c, void *const *ptr, int slot, struct rp_error *err)
{
	const char *name = c->spec->operands[slot].name;
	float s;

	if (!c->present[slot] || !ptr[slot]) {
		return 0;
	}
	s = scalar(ptr, slot);
	if (!(isfinite(s) && s > 0.0f)) {
		return rp_error_invalid_operand(err, name,
						"%s holds %g; a scale must be finite and positive (a quantization's "
						"scale, or 1 / it)",
						name, (double)s);
	}
	return 0;
}

int rd_host_fp8_check_scales(const struct rp_compute *c, void *const *ptr, struct rp_error *err)
{
	int r = 0;

	switch (c->spec->id) {
	case RP_OP_GEMM:
		if ((r = check_scale(c, ptr, RP_GEMM_A_SCALE, err)) < 0 || (r = check_scale(c, ptr, RP_GEMM_B_SCALE, err)) < 0 ||
		    (r = check_scale(c, ptr, RP_GEMM_D_SCALE, err)) < 0) {
			return r;
		}
		return 0;
	case RP_OP_QUANTIZE:
	case RP_OP_TRANSPOSE_QUANTIZE:
		return check_scale(c, ptr, RP_QUANT_SCALE, err);
	default:
		return 0;
	}
}
