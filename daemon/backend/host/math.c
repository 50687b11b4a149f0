/* SPDX-License-Identifier: Apache-2.0 */
/* Reference GEMM, attention and LayerNorm for the host backend.
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

#include "daemon/backend/host/fp8.h"
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

/* d/dx of gelu_tanh, as cuBLASLt's DGELU epilogue and torch's
 * gelu_backward(approximate="tanh") take it:
 * 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
 * t = tanh(sqrt(2/pi) (x + 0.044715 x^3)). */
static float dgelu_tanh(float x)
{
	const float c = 0.7978845608028654f;    /* sqrt(2/pi) */
	const float t = tanhf(c * (x + 0.044715f * x * x * x));

	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

static int gemm(const struct rp_compute *c, void *const *ptr)
{
	const struct rp_gemm *g = &c->gemm;
	const struct rp_operand *A = &c->operands[RP_GEMM_A], *B = &c->operands[RP_GEMM_B];
	const struct rp_operand *C = &c->operands[RP_GEMM_C], *D = &c->operands[RP_GEMM_D];
	const struct rp_operand *bias_op = &c->operands[RP_GEMM_BIAS], *aux_op = &c->operands[RP_GEMM_AUX];
	const struct rp_operand *aux_out_op = &c->operands[RP_GEMM_AUX_OUT];
	const void *pa = ptr[RP_GEMM_A], *pb = ptr[RP_GEMM_B], *pc = ptr[RP_GEMM_C], *pbias = ptr[RP_GEMM_BIAS];
	const void *paux = ptr[RP_GEMM_AUX];
	void *pd = ptr[RP_GEMM_D], *paux_out = ptr[RP_GEMM_AUX_OUT];
	const int64_t M = g->m, N = g->n, K = g->k;
	/* op(A)[i][q] = A[i*as_i + q*as_q]; op(B)[q][j] = B[q*bs_q + j*bs_j]. */
	const int64_t as_i = g->trans_a ? A->strides[1] : A->strides[0];
	const int64_t as_q = g->trans_a ? A->strides[0] : A->strides[1];
	const int64_t bs_q = g->trans_b ? B->strides[1] : B->strides[0];
	const int64_t bs_j = g->trans_b ? B->strides[0] : B->strides[1];
	const bool read_c = c->present[RP_GEMM_C] && pc && g->beta != 0.0;
	const bool add_bias = c->present[RP_GEMM_BIAS] && pbias &&
		(g->epilogue == RP_EPILOGUE_BIAS || g->epilogue == RP_EPILOGUE_GELU_BIAS ||
		 g->epilogue == RP_EPILOGUE_GELU_AUX_BIAS);
	const bool write_aux = (g->epilogue == RP_EPILOGUE_GELU_AUX || g->epilogue == RP_EPILOGUE_GELU_AUX_BIAS) &&
		c->present[RP_GEMM_AUX_OUT] && paux_out;
	const bool gelu = g->epilogue == RP_EPILOGUE_GELU || g->epilogue == RP_EPILOGUE_GELU_BIAS || write_aux;
	const bool dgelu = g->epilogue == RP_EPILOGUE_DGELU && c->present[RP_GEMM_AUX] && paux;
	const float alpha = (float)g->alpha, beta = (float)g->beta;
	float *panel = NULL, *arows = NULL, *acc = NULL, *crow = NULL, *bias = NULL, *auxrow = NULL;
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
	auxrow = malloc((size_t)nb_max * sizeof(float));
	if (!panel || !arows || !acc || !crow || !bias || !auxrow) {
		r = -ENOMEM;
		goto cleanup;
	}

	for (int64_t j0 = 0; j0 < N; j0 += GEMM_NB) {
		const int64_t nb = N - j0 < GEMM_NB ? N - j0 : GEMM_NB;

		/* Pack op(B)[:, j0:j0+nb] as K contiguous rows of nb floats,
		 * converted once for every row of A that uses them. */
		for (int64_t q = 0; q < K; q++) {
			load_f32(panel + q * nb, pb, B->dtype, q * bs_q + j0 * bs_j, bs_j, nb);
		}
		if (add_bias) {
			load_f32(bias, pbias, bias_op->dtype, j0 * bias_op->strides[0], bias_op->strides[0], nb);
		}

		for (int64_t i0 = 0; i0 < M; i0 += GEMM_MR) {
			const int64_t mr = M - i0 < GEMM_MR ? M - i0 : GEMM_MR;

			for (int64_t rr = 0; rr < mr; rr++) {
				load_f32(arows + rr * K, pa, A->dtype, (i0 + rr) * as_i, as_q, K);
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
					load_f32(crow, pc, C->dtype, i * C->strides[0] + j0 * C->strides[1],
						 C->strides[1], nb);
				}
				if (dgelu) {
					load_f32(auxrow, paux, aux_op->dtype, i * aux_op->strides[0] + j0 * aux_op->strides[1],
						 aux_op->strides[1], nb);
				}
				for (int64_t j = 0; j < nb; j++) {
					float v = alpha * out[j];
					if (read_c) {
						v += beta * crow[j];
					}
					if (add_bias) {
						v += bias[j];
					}
					if (write_aux) {
						auxrow[j] = v;
					}
					if (gelu) {
						v = gelu_tanh(v);
					}
					if (dgelu) {
						v *= dgelu_tanh(auxrow[j]);
					}
					out[j] = v;
				}
				store_f32(pd, D->dtype, i * D->strides[0] + j0 * D->strides[1], D->strides[1], out, nb);
				if (write_aux) {
					store_f32(paux_out, aux_out_op->dtype,
						  i * aux_out_op->strides[0] + j0 * aux_out_op->strides[1],
						  aux_out_op->strides[1], auxrow, nb);
				}
			}
		}
	}

cleanup:
	free(panel);
	free(arows);
	free(acc);
	free(crow);
	free(bias);
	free(auxrow);
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

/* One batch entry's sequence lengths: the padded sizes Sq and Skv, or,
 * with seq_len_q and seq_len_kv, the entry's own, clamped into [0, Sq] and
 * [0, Skv]. rd_host_check refuses values outside before a call runs; the
 * clamp keeps a value the client changed since (its memory is shared)
 * from reaching past the operands. */
struct lengths {
	int64_t q, kv;
};

static int64_t clamp_len(int64_t v, int64_t max)
{
	return v < 0 ? 0 : v > max ? max : v;
}

static int32_t read_len(const void *base, const struct rp_operand *op, int64_t b)
{
	int32_t v;

	memcpy(&v, (const char *)base + (size_t)(b * op->strides[0]) * sizeof(int32_t), sizeof(v));
	return v;
}

static struct lengths entry_lengths(const struct rp_compute *c, void *const *ptr, int slot_q, int slot_kv, int64_t b)
{
	const struct rp_attention *a = &c->attention;

	if (!a->padded) {
		return (struct lengths){ a->seq_q, a->seq_kv };
	}
	return (struct lengths){
		clamp_len(read_len(ptr[slot_q], &c->operands[slot_q], b), a->seq_q),
		clamp_len(read_len(ptr[slot_kv], &c->operands[slot_kv], b), a->seq_kv),
	};
}

/* The keys query row i (< len.q) sees: all of the entry's, or up to its
 * causal diagonal (top-left: key i; bottom-right: key i + len.kv - len.q).
 * The parser and rd_host_check refuse lengths that would leave a row no
 * key; where one does anyway, the row is written as padding. */
static int64_t visible_keys(const struct rp_attention *a, struct lengths len, int64_t i)
{
	int64_t n;

	if (!a->causal) {
		return len.kv;
	}
	n = (a->alignment == RP_CAUSAL_BOTTOM_RIGHT ? i + len.kv - len.q : i) + 1;
	return n < 0 ? 0 : n > len.kv ? len.kv : n;
}

/* Forward scratch: K and V of one (b, kv head) as f32, then one q row, one
 * row of scores and one output row. */
static size_t attention_scratch_size(const struct rp_compute *c)
{
	const struct rp_attention *a = &c->attention;
	size_t skv = (size_t)a->seq_kv, d = (size_t)a->head_dim, dv = (size_t)a->head_dim_v;
	size_t n = mul_sat(skv, add_sat(d, dv));

	n = add_sat(n, add_sat(add_sat(d, skv), dv));
	return floats_to_bytes(n);
}

static int attention(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	const struct rp_attention *a = &c->attention;
	const struct rp_operand *Q = &c->operands[RP_ATT_Q], *K = &c->operands[RP_ATT_K];
	const struct rp_operand *V = &c->operands[RP_ATT_V], *O = &c->operands[RP_ATT_O];
	const struct rp_operand *S = &c->operands[RP_ATT_STATS];
	float *stats = c->present[RP_ATT_STATS] ? ptr[RP_ATT_STATS] : NULL;
	const int64_t B = a->batch, Hkv = a->heads_kv, group = a->heads / a->heads_kv, Sq = a->seq_q, Skv = a->seq_kv;
	const int64_t D = a->head_dim, Dv = a->head_dim_v;
	const float scale = (float)a->scale;
	int r = 0;

	if (!scratch_ok(scratch, scratch_size, attention_scratch_size(c), &r)) {
		return r;
	}
	float *kf = scratch;
	float *vf = kf + Skv * D;
	float *qrow = vf + Skv * Dv;
	float *s = qrow + D;
	float *orow = s + Skv;

	for (int64_t b = 0; b < B; b++) {
		const struct lengths len = entry_lengths(c, ptr, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV, b);

		for (int64_t hk = 0; hk < Hkv; hk++) {
			/* K and V once for every query head of the group; padding
			 * rows are never read. */
			for (int64_t j = 0; j < len.kv; j++) {
				load_f32(kf + j * D, ptr[RP_ATT_K], K->dtype, off4(K, b, hk, j), K->strides[3], D);
				load_f32(vf + j * Dv, ptr[RP_ATT_V], V->dtype, off4(V, b, hk, j), V->strides[3], Dv);
			}
			for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
				for (int64_t i = 0; i < Sq; i++) {
					const int64_t nj = i < len.q ? visible_keys(a, len, i) : 0;
					float mx = -INFINITY, sum = 0.0f;

					/* A padding row (or one that sees no key):
					 * the sum over no key, o 0 and log-sum-exp
					 * -inf. */
					if (nj == 0) {
						memset(orow, 0, (size_t)Dv * sizeof(float));
						store_f32(ptr[RP_ATT_O], O->dtype, off4(O, b, h, i), O->strides[3], orow, Dv);
						if (stats) {
							stats[b * S->strides[0] + h * S->strides[1] + i * S->strides[2]] =
								-INFINITY;
						}
						continue;
					}
					load_f32(qrow, ptr[RP_ATT_Q], Q->dtype, off4(Q, b, h, i), Q->strides[3], D);
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
					store_f32(ptr[RP_ATT_O], O->dtype, off4(O, b, h, i), O->strides[3], orow, Dv);
					if (stats) {
						stats[b * S->strides[0] + h * S->strides[1] + i * S->strides[2]] = mx + logf(sum);
					}
				}
			}
		}
	}
	return 0;
}

/* Backward scratch: K, V, dK, dV of one (b, kv head) as f32, then the rows
 * q, dQ, o and dO of one query. */
static size_t attention_backward_scratch_size(const struct rp_compute *c)
{
	const struct rp_attention *a = &c->attention;
	size_t skv = (size_t)a->seq_kv, d = (size_t)a->head_dim, dv = (size_t)a->head_dim_v;
	size_t n = mul_sat(mul_sat(skv, add_sat(d, dv)), 2);

	n = add_sat(n, mul_sat(add_sat(d, dv), 2));
	return floats_to_bytes(n);
}

static int attention_backward(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	const struct rp_attention *a = &c->attention;
	const struct rp_operand *Q = &c->operands[RP_ATB_Q], *K = &c->operands[RP_ATB_K];
	const struct rp_operand *V = &c->operands[RP_ATB_V], *O = &c->operands[RP_ATB_O];
	const struct rp_operand *DO = &c->operands[RP_ATB_DO], *S = &c->operands[RP_ATB_STATS];
	const struct rp_operand *DQ = &c->operands[RP_ATB_DQ], *DK = &c->operands[RP_ATB_DK];
	const struct rp_operand *DV = &c->operands[RP_ATB_DV];
	const float *stats = ptr[RP_ATB_STATS];
	const int64_t B = a->batch, Hkv = a->heads_kv, group = a->heads / a->heads_kv, Sq = a->seq_q, Skv = a->seq_kv;
	const int64_t D = a->head_dim, Dv = a->head_dim_v;
	const float scale = (float)a->scale;
	int r = 0;

	if (!scratch_ok(scratch, scratch_size, attention_backward_scratch_size(c), &r)) {
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
		const struct lengths len = entry_lengths(c, ptr, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV, b);

		for (int64_t hk = 0; hk < Hkv; hk++) {
			for (int64_t j = 0; j < len.kv; j++) {
				load_f32(kf + j * D, ptr[RP_ATB_K], K->dtype, off4(K, b, hk, j), K->strides[3], D);
				load_f32(vf + j * Dv, ptr[RP_ATB_V], V->dtype, off4(V, b, hk, j), V->strides[3], Dv);
			}
			/* dK and dV of a shared head sum over every query head of
			 * its group. */
			memset(dk, 0, (size_t)(Skv * D) * sizeof(float));
			memset(dv, 0, (size_t)(Skv * Dv) * sizeof(float));

			for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
				for (int64_t i = 0; i < Sq; i++) {
					const int64_t nj = i < len.q ? visible_keys(a, len, i) : 0;

					/* A padding row has no gradient (and its
					 * stats, -inf, are not to be read). */
					if (nj == 0) {
						memset(dq, 0, (size_t)D * sizeof(float));
						store_f32(ptr[RP_ATB_DQ], DQ->dtype, off4(DQ, b, h, i), DQ->strides[3], dq, D);
						continue;
					}
					const float lse = stats[b * S->strides[0] + h * S->strides[1] + i * S->strides[2]];

					load_f32(qrow, ptr[RP_ATB_Q], Q->dtype, off4(Q, b, h, i), Q->strides[3], D);
					load_f32(orow, ptr[RP_ATB_O], O->dtype, off4(O, b, h, i), O->strides[3], Dv);
					load_f32(dorow, ptr[RP_ATB_DO], DO->dtype, off4(DO, b, h, i), DO->strides[3], Dv);
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
					store_f32(ptr[RP_ATB_DQ], DQ->dtype, off4(DQ, b, h, i), DQ->strides[3], dq, D);
				}
			}
			for (int64_t j = 0; j < Skv; j++) {
				store_f32(ptr[RP_ATB_DK], DK->dtype, off4(DK, b, hk, j), DK->strides[3], dk + j * D, D);
				store_f32(ptr[RP_ATB_DV], DV->dtype, off4(DV, b, hk, j), DV->strides[3], dv + j * Dv, Dv);
			}
		}
	}
	return 0;
}

/* ---- LayerNorm ---------------------------------------------------------------------- */

/* A row's sum in f32, pairwise: the rounding error grows with log n, not
 * n, as a GPU's tree reduction's does, so a row of 65536 sums as well as
 * one of 64. */
static float sum_pairwise(const float *x, int64_t n)
{
	if (n <= 16) {
		float s = 0.0f;

		for (int64_t t = 0; t < n; t++) {
			s += x[t];
		}
		return s;
	}
	return sum_pairwise(x, n / 2) + sum_pairwise(x + n / 2, n - n / 2);
}

/* Forward scratch: the row, its centred values, weight and bias, as f32. */
static size_t layer_norm_scratch_size(const struct rp_compute *c)
{
	return floats_to_bytes(mul_sat((size_t)c->layer_norm.n, 4));
}

static int layer_norm(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	const struct rp_layer_norm *ln = &c->layer_norm;
	const struct rp_operand *X = &c->operands[RP_LN_X], *W = &c->operands[RP_LN_WEIGHT];
	const struct rp_operand *Bo = &c->operands[RP_LN_BIAS], *Y = &c->operands[RP_LN_Y];
	float *mean_out = c->present[RP_LN_MEAN] ? ptr[RP_LN_MEAN] : NULL;
	float *rstd_out = c->present[RP_LN_RSTD] ? ptr[RP_LN_RSTD] : NULL;
	const int64_t rows = ln->rows, n = ln->n;
	const float eps = (float)ln->eps;
	int r = 0;

	if (!scratch_ok(scratch, scratch_size, layer_norm_scratch_size(c), &r)) {
		return r;
	}
	float *row = scratch;
	float *dev = row + n;
	float *w = dev + n;
	float *b = w + n;

	load_f32(w, ptr[RP_LN_WEIGHT], W->dtype, 0, 1, n);
	if (c->present[RP_LN_BIAS]) {
		load_f32(b, ptr[RP_LN_BIAS], Bo->dtype, 0, 1, n);
	} else {
		memset(b, 0, (size_t)n * sizeof(float));
	}
	for (int64_t i = 0; i < rows; i++) {
		load_f32(row, ptr[RP_LN_X], X->dtype, i * X->strides[0], 1, n);
		/* Two passes, the variance from the centred values: no
		 * cancellation between E[x^2] and E[x]^2. */
		const float mean = sum_pairwise(row, n) / (float)n;

		for (int64_t j = 0; j < n; j++) {
			dev[j] = (row[j] - mean) * (row[j] - mean);
		}
		const float var = sum_pairwise(dev, n) / (float)n;
		const float rstd = 1.0f / sqrtf(var + eps);

		for (int64_t j = 0; j < n; j++) {
			row[j] = (row[j] - mean) * rstd * w[j] + b[j];
		}
		store_f32(ptr[RP_LN_Y], Y->dtype, i * Y->strides[0], 1, row, n);
		if (mean_out) {
			mean_out[i] = mean;
		}
		if (rstd_out) {
			rstd_out[i] = rstd;
		}
	}
	return 0;
}

/* Backward scratch: the rows d_y, x (then x's normalized values), d_residual
 * and d_x, weight, and the f32 sums of d_weight and d_bias. */
static size_t layer_norm_backward_scratch_size(const struct rp_compute *c)
{
	return floats_to_bytes(mul_sat((size_t)c->layer_norm.n, 7));
}

static int layer_norm_backward(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	const struct rp_layer_norm *ln = &c->layer_norm;
	const struct rp_operand *DY = &c->operands[RP_LNB_DY], *X = &c->operands[RP_LNB_X];
	const struct rp_operand *W = &c->operands[RP_LNB_WEIGHT], *DX = &c->operands[RP_LNB_DX];
	const struct rp_operand *DR = &c->operands[RP_LNB_DRESIDUAL];
	const float *mean = ptr[RP_LNB_MEAN], *rstd = ptr[RP_LNB_RSTD];
	const bool with_residual = c->present[RP_LNB_DRESIDUAL];
	const int64_t rows = ln->rows, n = ln->n;
	int r = 0;

	if (!scratch_ok(scratch, scratch_size, layer_norm_backward_scratch_size(c), &r)) {
		return r;
	}
	float *dy = scratch;
	float *xhat = dy + n;
	float *res = xhat + n;
	float *dx = res + n;
	float *w = dx + n;
	float *dw = w + n;
	float *db = dw + n;

	load_f32(w, ptr[RP_LNB_WEIGHT], W->dtype, 0, 1, n);
	memset(dw, 0, (size_t)n * sizeof(float));
	memset(db, 0, (size_t)n * sizeof(float));
	if (!with_residual) {
		memset(res, 0, (size_t)n * sizeof(float));
	}
	for (int64_t i = 0; i < rows; i++) {
		const float mu = mean[i], rs = rstd[i];

		load_f32(dy, ptr[RP_LNB_DY], DY->dtype, i * DY->strides[0], 1, n);
		load_f32(xhat, ptr[RP_LNB_X], X->dtype, i * X->strides[0], 1, n);
		/* d_residual is read whole before d_x is written: d_x may be
		 * d_residual itself. */
		if (with_residual) {
			load_f32(res, ptr[RP_LNB_DRESIDUAL], DR->dtype, i * DR->strides[0], 1, n);
		}
		/* With g = d_y * weight and xhat the normalized x,
		 * d_x = rstd (g - mean(g) - xhat mean(g xhat)). */
		for (int64_t j = 0; j < n; j++) {
			xhat[j] = (xhat[j] - mu) * rs;
			dw[j] += dy[j] * xhat[j];
			db[j] += dy[j];
			dx[j] = dy[j] * w[j];
		}
		const float mean_g = sum_pairwise(dx, n) / (float)n;

		/* The products g xhat, in d_x's place until their sum. */
		for (int64_t j = 0; j < n; j++) {
			dx[j] *= xhat[j];
		}
		const float mean_gx = sum_pairwise(dx, n) / (float)n;

		for (int64_t j = 0; j < n; j++) {
			dx[j] = rs * (dy[j] * w[j] - mean_g - xhat[j] * mean_gx) + res[j];
		}
		store_f32(ptr[RP_LNB_DX], DX->dtype, i * DX->strides[0], 1, dx, n);
	}
	if (c->present[RP_LNB_DWEIGHT]) {
		store_f32(ptr[RP_LNB_DWEIGHT], c->operands[RP_LNB_DWEIGHT].dtype, 0, 1, dw, n);
	}
	if (c->present[RP_LNB_DBIAS]) {
		store_f32(ptr[RP_LNB_DBIAS], c->operands[RP_LNB_DBIAS].dtype, 0, 1, db, n);
	}
	return 0;
}

/* ---- values in the client's memory ---------------------------------------------- */

/* Sequence lengths, one batch entry at a time: in [0, Sq] and [0, Skv],
 * and every query row left a key. */
static int check_lengths(const struct rp_compute *c, void *const *ptr, int slot_q, int slot_kv, struct rp_error *err)
{
	const struct rp_attention *a = &c->attention;
	const bool bottom_right = a->causal && a->alignment == RP_CAUSAL_BOTTOM_RIGHT;

	for (int64_t b = 0; b < a->batch; b++) {
		const int32_t lq = read_len(ptr[slot_q], &c->operands[slot_q], b);
		const int32_t lkv = read_len(ptr[slot_kv], &c->operands[slot_kv], b);

		if (lq < 0 || lq > a->seq_q) {
			return rp_error_invalid_operand(err, "seq_len_q",
							"seq_len_q[%lld] is %d, outside [0, %lld] (q's rows, Sq)",
							(long long)b, (int)lq, (long long)a->seq_q);
		}
		if (lkv < 0 || lkv > a->seq_kv) {
			return rp_error_invalid_operand(err, "seq_len_kv",
							"seq_len_kv[%lld] is %d, outside [0, %lld] (k's rows, Skv)",
							(long long)b, (int)lkv, (long long)a->seq_kv);
		}
		if (lq > 0 && lkv == 0) {
			return rp_error_invalid_operand(err, "seq_len_kv",
							"seq_len_kv[%lld] is 0 while seq_len_q[%lld] is %d: those queries "
							"would see no key, and their softmax is undefined",
							(long long)b, (long long)b, (int)lq);
		}
		if (bottom_right && lq > lkv) {
			return rp_error_invalid_operand(err, "seq_len_q",
							"seq_len_q[%lld] is %d > seq_len_kv[%lld] %d: aligned bottom_right, "
							"the entry's first %d queries would see no key; use top_left or "
							"seq_len_q <= seq_len_kv",
							(long long)b, (int)lq, (long long)b, (int)lkv, (int)(lq - lkv));
		}
	}
	return 0;
}

static int attention_check(const struct rp_compute *c, void *const *ptr, struct rp_error *err)
{
	return c->attention.padded ? check_lengths(c, ptr, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV, err) : 0;
}

static int attention_backward_check(const struct rp_compute *c, void *const *ptr, struct rp_error *err)
{
	return c->attention.padded ? check_lengths(c, ptr, RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV, err) : 0;
}

/* ---- one entry per operation ------------------------------------------------ */

/* An exp() of the softmax, in multiply-adds of the reference math. */
#define EXP_MACS 8.0

static double gemm_macs(const struct rp_compute *c)
{
	return (double)c->gemm.m * (double)c->gemm.n * (double)c->gemm.k;
}

static double attention_scores(const struct rp_attention *a)
{
	return (double)a->batch * a->heads * a->seq_q * a->seq_kv;
}

static double attention_macs(const struct rp_compute *c)
{
	const struct rp_attention *a = &c->attention;

	return attention_scores(a) * (a->head_dim + a->head_dim_v + EXP_MACS);
}

static double attention_backward_macs(const struct rp_compute *c)
{
	return 2.0 * attention_macs(c);
}

static double layer_norm_macs(const struct rp_compute *c)
{
	return 8.0 * (double)c->layer_norm.rows * (double)c->layer_norm.n;
}

static double layer_norm_backward_macs(const struct rp_compute *c)
{
	return 2.0 * layer_norm_macs(c);
}

static size_t no_scratch(const struct rp_compute *c)
{
	return 0;
}

static int gemm_entry(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	return rp_dtype_is_fp8(c->operands[RP_GEMM_A].dtype) ? rd_host_fp8_gemm(c, ptr) : gemm(c, ptr);
}

static double quantize_macs(const struct rp_compute *c)
{
	return 2.0 * (double)c->quantize.rows * (double)c->quantize.cols;
}

static double scale_update_macs(const struct rp_compute *c)
{
	return 2.0 * (double)c->scale_update.history * (double)c->scale_update.n;
}

static int quantize_entry(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	return rd_host_quantize(c, ptr);
}

static int scale_update_entry(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	return rd_host_scale_update(c, ptr);
}

/* What the host backend knows of each operation of the op table. */
static const struct {
	/* Its work, in multiply-adds, roughly: the lanes' deadline budget. */
	double (*macs)(const struct rp_compute *c);
	/* What lives in the operands' memory; NULL: nothing to check. */
	int (*check)(const struct rp_compute *c, void *const *ptr, struct rp_error *err);
	size_t (*scratch_size)(const struct rp_compute *c);
	int (*run)(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size);
} kernels[RP_OP_COUNT] = {
	[RP_OP_GEMM] = { gemm_macs, rd_host_fp8_check_scales, no_scratch, gemm_entry },
	[RP_OP_ATTENTION] = { attention_macs, attention_check, attention_scratch_size, attention },
	[RP_OP_ATTENTION_BACKWARD] = { attention_backward_macs, attention_backward_check,
				       attention_backward_scratch_size, attention_backward },
	[RP_OP_LAYER_NORM] = { layer_norm_macs, NULL, layer_norm_scratch_size, layer_norm },
	[RP_OP_LAYER_NORM_BACKWARD] = { layer_norm_backward_macs, NULL, layer_norm_backward_scratch_size,
					layer_norm_backward },
	[RP_OP_QUANTIZE] = { quantize_macs, rd_host_fp8_check_scales, no_scratch, quantize_entry },
	[RP_OP_TRANSPOSE_QUANTIZE] = { quantize_macs, rd_host_fp8_check_scales, no_scratch, quantize_entry },
	[RP_OP_SCALE_UPDATE] = { scale_update_macs, NULL, no_scratch, scale_update_entry },
};

double rd_host_macs(const struct rp_compute *c)
{
	return c->spec->id < RP_OP_COUNT ? kernels[c->spec->id].macs(c) : 0.0;
}

int rd_host_check(const struct rp_compute *c, void *const *ptr, struct rp_error *err)
{
	return kernels[c->spec->id].check ? kernels[c->spec->id].check(c, ptr, err) : 0;
}

size_t rd_host_scratch_size(const struct rp_compute *c)
{
	return kernels[c->spec->id].scratch_size(c);
}

int rd_host_run(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size)
{
	return kernels[c->spec->id].run(c, ptr, scratch, scratch_size);
}
