/* Reference GEMM and attention for the host backend.
 *
 * Everything accumulates in f32 whatever the storage type, like the GPU
 * libraries do, so the host backend's answers differ from cuBLASLt/cuDNN by
 * rounding only. These functions serve real calls (the host backend is the
 * default on machines without a GPU) and run on several lane threads at
 * once: no globals, every temporary is either malloc'ed per call or carved
 * from the scratch the caller passes. */
#include <errno.h>
#include <math.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/backend/host/math.h"

/* ---- storage conversions ------------------------------------------------ */

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

uint16_t rd_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	/* Rounding could carry a NaN's payload into the exponent (or clear
	 * it to Inf); keep the sign and the top payload bits and force the
	 * quiet bit so a NaN stays a NaN. */
	if ((u & 0x7fffffffu) > 0x7f800000u) {
		return (uint16_t)((u >> 16) | 0x0040u);
	}
	/* Round to nearest, ties to even: add just under half an ulp, plus
	 * one when the kept part is odd. A carry out of the mantissa bumps
	 * the exponent, which is the right answer (up to Inf). */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float rd_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t rd_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t x = u & 0x7fffffffu;

	if (x > 0x7f800000u) {
		/* NaN: quiet, keep the payload's top bits. */
		return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu);
	}
	if (x >= 0x477ff000u) {
		/* >= 65520 (half-way between 65504, the largest f16, and
		 * 65536) rounds to Inf, and Inf stays Inf. */
		return sign | 0x7c00u;
	}
	if (x >= 0x38800000u) {
		/* Normal in f16 (>= 2^-14): rebias the exponent from 127 to
		 * 15 and round the 23-bit mantissa to 10, ties to even. */
		uint32_t r = x - 0x38000000u;

		r += 0x0fffu + ((r >> 13) & 1u);
		return sign | (uint16_t)(r >> 13);
	}
	if (x <= 0x33000000u) {
		/* <= 2^-25, half the smallest subnormal: rounds to (signed)
		 * zero; exactly 2^-25 is a tie and 0 is the even neighbour. */
		return sign;
	}
	/* Subnormal in f16: the value is m * 2^(e-150) with the implicit
	 * bit in m; in units of 2^-24 that is m >> (126 - e), 14..24 bits
	 * of shift. A result of 0x400 is the smallest normal, correctly. */
	uint32_t e = x >> 23;
	uint32_t m = (x & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126u - e;
	uint32_t q = m >> shift;
	uint32_t rem = m & ((1u << shift) - 1u);
	uint32_t half = 1u << (shift - 1u);

	if (rem > half || (rem == half && (q & 1u))) {
		q++;
	}
	return sign | (uint16_t)q;
}

float rd_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0x1f) {
		/* Inf, or NaN with its payload moved to the top. */
		return bits_f32(sign | 0x7f800000u | (m << 13));
	}
	if (e == 0) {
		if (m == 0) {
			return bits_f32(sign);
		}
		/* Subnormal: m * 2^-24, exact in f32. */
		float v = (float)m * 0x1p-24f;
		return sign ? -v : v;
	}
	return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- strided element access --------------------------------------------- */

/* n elements at base[start + t * stride] into dst as f32. The switch sits
 * outside the loop: these loops pack every operand. */
static void load_f32(float *restrict dst, const void *base, enum rp_dtype dt, int64_t start, int64_t stride, int64_t n)
{
	switch (dt) {
	case RP_DTYPE_F32: {
		const float *s = (const float *)base + start;
		if (stride == 1) {
			memcpy(dst, s, (size_t)n * sizeof(float));
		} else {
			for (int64_t t = 0; t < n; t++) {
				dst[t] = s[t * stride];
			}
		}
		break;
	}
	case RP_DTYPE_F16: {
		const uint16_t *s = (const uint16_t *)base + start;
		for (int64_t t = 0; t < n; t++) {
			dst[t] = rd_f16_to_f32(s[t * stride]);
		}
		break;
	}
	case RP_DTYPE_BF16:
	default: {
		const uint16_t *s = (const uint16_t *)base + start;
		for (int64_t t = 0; t < n; t++) {
			dst[t] = rd_bf16_to_f32(s[t * stride]);
		}
		break;
	}
	}
}

static void store_f32(void *base, enum rp_dtype dt, int64_t start, int64_t stride, const float *restrict src, int64_t n)
{
	switch (dt) {
	case RP_DTYPE_F32: {
		float *d = (float *)base + start;
		for (int64_t t = 0; t < n; t++) {
			d[t * stride] = src[t];
		}
		break;
	}
	case RP_DTYPE_F16: {
		uint16_t *d = (uint16_t *)base + start;
		for (int64_t t = 0; t < n; t++) {
			d[t * stride] = rd_f32_to_f16(src[t]);
		}
		break;
	}
	case RP_DTYPE_BF16:
	default: {
		uint16_t *d = (uint16_t *)base + start;
		for (int64_t t = 0; t < n; t++) {
			d[t * stride] = rd_f32_to_bf16(src[t]);
		}
		break;
	}
	}
}

/* ---- GEMM ---------------------------------------------------------------- */

/* Rows of op(A) done together (each packed B row is loaded once for all
 * of them) and columns of op(B) per packed panel. A panel of K x NB floats
 * stays in L2 for moderate K; the MR x NB accumulators stay in L1. */
#define GEMM_MR 4
#define GEMM_NB 128

static float gelu_tanh(float x)
{
	/* cuBLASLt's GELU epilogue: the tanh approximation. */
	const float c = 0.7978845608028654f;    /* sqrt(2/pi) */

	return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

int rd_host_gemm(const struct rp_gemm *g, const struct rd_gemm_ptrs *p)
{
	const int64_t M = g->m, N = g->n, K = g->k;
	/* op(A)[i][q] = A[i*as_i + q*as_q]; op(B)[q][j] = B[q*bs_q + j*bs_j]. */
	const int64_t as_i = g->trans_a ? g->a.strides[1] : g->a.strides[0];
	const int64_t as_q = g->trans_a ? g->a.strides[0] : g->a.strides[1];
	const int64_t bs_q = g->trans_b ? g->b.strides[1] : g->b.strides[0];
	const int64_t bs_j = g->trans_b ? g->b.strides[0] : g->b.strides[1];
	const bool read_c = g->has_c && g->beta != 0.0;
	const bool add_bias = g->has_bias &&
		(g->epilogue == RP_EPILOGUE_BIAS || g->epilogue == RP_EPILOGUE_GELU_BIAS);
	const bool gelu = g->epilogue == RP_EPILOGUE_GELU || g->epilogue == RP_EPILOGUE_GELU_BIAS;
	const float alpha = (float)g->alpha, beta = (float)g->beta;
	float *panel = NULL, *arows = NULL, *acc = NULL, *crow = NULL, *bias = NULL;
	int r = 0;

	if (M <= 0 || N <= 0 || K <= 0) {
		return -EINVAL;
	}
	const int64_t nb_max = N < GEMM_NB ? N : GEMM_NB;
	panel = malloc((size_t)K * (size_t)nb_max * sizeof(float));
	arows = malloc((size_t)GEMM_MR * (size_t)K * sizeof(float));
	acc = malloc((size_t)GEMM_MR * (size_t)nb_max * sizeof(float));
	crow = malloc((size_t)nb_max * sizeof(float));
	bias = malloc((size_t)nb_max * sizeof(float));
	if (!panel || !arows || !acc || !crow || !bias) {
		r = -ENOMEM;
		goto cleanup;
	}

	for (int64_t j0 = 0; j0 < N; j0 += GEMM_NB) {
		const int64_t nb = N - j0 < GEMM_NB ? N - j0 : GEMM_NB;

		/* Pack op(B)[:, j0:j0+nb] as K contiguous rows of nb floats,
		 * converted once for every row of A that uses them. */
		for (int64_t q = 0; q < K; q++) {
			load_f32(panel + q * nb, p->b, g->b.dtype, q * bs_q + j0 * bs_j, bs_j, nb);
		}
		if (add_bias) {
			load_f32(bias, p->bias, g->bias.dtype, j0 * g->bias.strides[0], g->bias.strides[0], nb);
		}

		for (int64_t i0 = 0; i0 < M; i0 += GEMM_MR) {
			const int64_t mr = M - i0 < GEMM_MR ? M - i0 : GEMM_MR;

			for (int64_t rr = 0; rr < mr; rr++) {
				load_f32(arows + rr * K, p->a, g->a.dtype, (i0 + rr) * as_i, as_q, K);
			}
			memset(acc, 0, (size_t)GEMM_MR * (size_t)nb * sizeof(float));

			/* i-k-j order: the innermost loop runs along a
			 * contiguous packed row and vectorizes. */
			for (int64_t q = 0; q < K; q++) {
				const float *restrict brow = panel + q * nb;
				for (int64_t rr = 0; rr < mr; rr++) {
					float *restrict arow_acc = acc + rr * nb;
					const float av = arows[rr * K + q];
					for (int64_t j = 0; j < nb; j++) {
						arow_acc[j] += av * brow[j];
					}
				}
			}

			for (int64_t rr = 0; rr < mr; rr++) {
				const int64_t i = i0 + rr;
				float *restrict out = acc + rr * nb;

				/* C is read for the whole row before D is
				 * written: with c aliasing d every C element is
				 * consumed before its D overwrites it. */
				if (read_c) {
					load_f32(crow, p->c, g->c.dtype, i * g->c.strides[0] + j0 * g->c.strides[1],
						 g->c.strides[1], nb);
				}
				for (int64_t j = 0; j < nb; j++) {
					float v = alpha * out[j];
					if (read_c) {
						v += beta * crow[j];
					}
					if (add_bias) {
						v += bias[j];
					}
					if (gelu) {
						v = gelu_tanh(v);
					}
					out[j] = v;
				}
				store_f32(p->d, g->d.dtype, i * g->d.strides[0] + j0 * g->d.strides[1], g->d.strides[1], out, nb);
			}
		}
	}

cleanup:
	free(panel);
	free(arows);
	free(acc);
	free(crow);
	free(bias);
	return r;
}

/* ---- attention ------------------------------------------------------------ */

/* Sizes in floats, saturating: a descriptor that passed validation cannot
 * overflow, but a SIZE_MAX answer is still safer than a wrapped one. */
static size_t mul_sat(size_t a, size_t b)
{
	size_t r;

	if (__builtin_mul_overflow(a, b, &r)) {
		return SIZE_MAX;
	}
	return r;
}

static size_t add_sat(size_t a, size_t b)
{
	size_t r;

	if (__builtin_add_overflow(a, b, &r)) {
		return SIZE_MAX;
	}
	return r;
}

static size_t floats_to_bytes(size_t n)
{
	return mul_sat(n, sizeof(float));
}

static int64_t off4(const struct rp_operand *op, int64_t b, int64_t h, int64_t i)
{
	return b * op->strides[0] + h * op->strides[1] + i * op->strides[2];
}

static float dot(const float *restrict x, const float *restrict y, int64_t n)
{
	float s = 0.0f;

	for (int64_t t = 0; t < n; t++) {
		s += x[t] * y[t];
	}
	return s;
}

static bool scratch_ok(const void *scratch, size_t have, size_t need, int *r)
{
	if (have < need) {
		*r = -ENOSPC;
		return false;
	}
	if (need > 0 && (!scratch || (uintptr_t)scratch % alignof(float) != 0)) {
		*r = -EINVAL;
		return false;
	}
	return true;
}

/* Forward scratch: K and V of one (b, h) as f32, then one q row, one row
 * of scores and one output row. */
size_t rd_host_attention_scratch_size(const struct rp_attention *a)
{
	size_t skv = (size_t)a->seq_kv, d = (size_t)a->head_dim, dv = (size_t)a->head_dim_v;
	size_t n = mul_sat(skv, add_sat(d, dv));

	n = add_sat(n, add_sat(add_sat(d, skv), dv));
	return floats_to_bytes(n);
}

int rd_host_attention(const struct rp_attention *a, const struct rd_attention_ptrs *p, void *scratch, size_t scratch_size)
{
	const int64_t B = a->batch, H = a->heads, Sq = a->seq_q, Skv = a->seq_kv;
	const int64_t D = a->head_dim, Dv = a->head_dim_v;
	const float scale = (float)a->scale;
	int r = 0;

	if (!scratch_ok(scratch, scratch_size, rd_host_attention_scratch_size(a), &r)) {
		return r;
	}
	float *kf = scratch;
	float *vf = kf + Skv * D;
	float *qrow = vf + Skv * Dv;
	float *s = qrow + D;
	float *orow = s + Skv;

	for (int64_t b = 0; b < B; b++) {
		for (int64_t h = 0; h < H; h++) {
			for (int64_t j = 0; j < Skv; j++) {
				load_f32(kf + j * D, p->k, a->k.dtype, off4(&a->k, b, h, j), a->k.strides[3], D);
				load_f32(vf + j * Dv, p->v, a->v.dtype, off4(&a->v, b, h, j), a->v.strides[3], Dv);
			}
			for (int64_t i = 0; i < Sq; i++) {
				/* Causal is top-left aligned: query i sees keys
				 * 0..i, so every row sees at least key 0. */
				const int64_t nj = a->causal ? (i + 1 < Skv ? i + 1 : Skv) : Skv;
				float mx = -INFINITY, sum = 0.0f;

				load_f32(qrow, p->q, a->q.dtype, off4(&a->q, b, h, i), a->q.strides[3], D);
				for (int64_t j = 0; j < nj; j++) {
					s[j] = scale * dot(qrow, kf + j * D, D);
					mx = s[j] > mx ? s[j] : mx;
				}
				memset(orow, 0, (size_t)Dv * sizeof(float));
				for (int64_t j = 0; j < nj; j++) {
					const float pj = expf(s[j] - mx);
					const float *restrict vj = vf + j * Dv;
					sum += pj;
					for (int64_t t = 0; t < Dv; t++) {
						orow[t] += pj * vj[t];
					}
				}
				for (int64_t t = 0; t < Dv; t++) {
					orow[t] /= sum;
				}
				store_f32(p->o, a->o.dtype, off4(&a->o, b, h, i), a->o.strides[3], orow, Dv);
				if (a->has_stats && p->stats) {
					p->stats[b * a->stats.strides[0] + h * a->stats.strides[1] + i * a->stats.strides[2]] =
						mx + logf(sum);
				}
			}
		}
	}
	return 0;
}

/* Backward scratch: K, V, dK, dV of one (b, h) as f32, then the rows q, dQ,
 * o and dO of one query. */
size_t rd_host_attention_backward_scratch_size(const struct rp_attention_backward *a)
{
	size_t skv = (size_t)a->seq_kv, d = (size_t)a->head_dim, dv = (size_t)a->head_dim_v;
	size_t n = mul_sat(mul_sat(skv, add_sat(d, dv)), 2);

	n = add_sat(n, mul_sat(add_sat(d, dv), 2));
	return floats_to_bytes(n);
}

int rd_host_attention_backward(const struct rp_attention_backward *a, const struct rd_attention_backward_ptrs *p,
			       void *scratch, size_t scratch_size)
{
	const int64_t B = a->batch, H = a->heads, Sq = a->seq_q, Skv = a->seq_kv;
	const int64_t D = a->head_dim, Dv = a->head_dim_v;
	const float scale = (float)a->scale;
	int r = 0;

	if (!scratch_ok(scratch, scratch_size, rd_host_attention_backward_scratch_size(a), &r)) {
		return r;
	}
	float *kf = scratch;
	float *vf = kf + Skv * D;
	float *dk = vf + Skv * Dv;
	float *dv = dk + Skv * D;
	float *qrow = dv + Skv * Dv;
	float *dq = qrow + D;
	float *orow = dq + D;
	float *dorow = orow + Dv;

	for (int64_t b = 0; b < B; b++) {
		for (int64_t h = 0; h < H; h++) {
			for (int64_t j = 0; j < Skv; j++) {
				load_f32(kf + j * D, p->k, a->k.dtype, off4(&a->k, b, h, j), a->k.strides[3], D);
				load_f32(vf + j * Dv, p->v, a->v.dtype, off4(&a->v, b, h, j), a->v.strides[3], Dv);
			}
			memset(dk, 0, (size_t)(Skv * D) * sizeof(float));
			memset(dv, 0, (size_t)(Skv * Dv) * sizeof(float));

			for (int64_t i = 0; i < Sq; i++) {
				const int64_t nj = a->causal ? (i + 1 < Skv ? i + 1 : Skv) : Skv;
				const float lse = p->stats[b * a->stats.strides[0] + h * a->stats.strides[1] +
							   i * a->stats.strides[2]];

				load_f32(qrow, p->q, a->q.dtype, off4(&a->q, b, h, i), a->q.strides[3], D);
				load_f32(orow, p->o, a->o.dtype, off4(&a->o, b, h, i), a->o.strides[3], Dv);
				load_f32(dorow, p->d_o, a->d_o.dtype, off4(&a->d_o, b, h, i), a->d_o.strides[3], Dv);
				memset(dq, 0, (size_t)D * sizeof(float));

				/* D_i = dO_i . O_i equals sum_j p_ij dP_ij, the
				 * softmax Jacobian's diagonal correction, without
				 * a second pass over the keys. */
				const float di = dot(dorow, orow, Dv);

				for (int64_t j = 0; j < nj; j++) {
					const float *restrict kj = kf + j * D;
					const float *restrict vj = vf + j * Dv;
					float *restrict dkj = dk + j * D;
					float *restrict dvj = dv + j * Dv;
					const float pij = expf(scale * dot(qrow, kj, D) - lse);
					const float dp = dot(dorow, vj, Dv);
					const float ds = scale * pij * (dp - di);

					for (int64_t t = 0; t < Dv; t++) {
						dvj[t] += pij * dorow[t];
					}
					for (int64_t t = 0; t < D; t++) {
						dq[t] += ds * kj[t];
						dkj[t] += ds * qrow[t];
					}
				}
				store_f32(p->d_q, a->d_q.dtype, off4(&a->d_q, b, h, i), a->d_q.strides[3], dq, D);
			}
			for (int64_t j = 0; j < Skv; j++) {
				store_f32(p->d_k, a->d_k.dtype, off4(&a->d_k, b, h, j), a->d_k.strides[3], dk + j * D, D);
				store_f32(p->d_v, a->d_v.dtype, off4(&a->d_v, b, h, j), a->d_v.strides[3], dv + j * Dv, Dv);
			}
		}
	}
	return 0;
}
