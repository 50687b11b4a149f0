/* SPDX-License-Identifier: Apache-2.0 */
/* float64 references; see reference.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/lib/asserts.h"
#include "tests/lib/dtype.h"
#include "tests/lib/reference.h"

double tl_gelu_tanh(double x)
{
	return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). */
double tl_dgelu_tanh(double x)
{
	const double c = 0.7978845608028654, t = tanh(c * (x + 0.044715 * x * x * x));

	return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static double gelu_erf(double x)
{
	return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

void tl_gemm_ref(const struct tl_gemm *g, const double *a, const double *b, const double *c, const double *bias,
		 double *d, double *magnitude)
{
	const int64_t M = g->m, N = g->n, K = g->k;
	const bool gelu = g->epilogue == RP_EPILOGUE_GELU || g->epilogue == RP_EPILOGUE_GELU_BIAS ||
			  g->epilogue == RP_EPILOGUE_GELU_AUX || g->epilogue == RP_EPILOGUE_GELU_AUX_BIAS;
	double *bt = NULL, *acc = calloc((size_t)N + 1, sizeof(double)), *abs_ = calloc((size_t)N + 1, sizeof(double));
	const double *opb = b;

	ASSERT(acc != NULL && abs_ != NULL, "out of memory");
	/* op(B) as [K, N] rows, so that the inner loop walks memory in order. */
	if (g->trans_b) {
		bt = malloc((size_t)(K * N + 1) * sizeof(double));
		ASSERT_NOT_NULL(bt);
		for (int64_t k = 0; k < K; k++) {
			for (int64_t j = 0; j < N; j++) {
				bt[k * N + j] = b[j * K + k];
			}
		}
		opb = bt;
	}
	for (int64_t i = 0; i < M; i++) {
		memset(acc, 0, (size_t)N * sizeof(double));
		memset(abs_, 0, (size_t)N * sizeof(double));
		for (int64_t k = 0; k < K; k++) {
			const double aik = g->trans_a ? a[k * M + i] : a[i * K + k];
			const double *bk = opb + k * N;

			for (int64_t j = 0; j < N; j++) {
				double x = aik * bk[j];

				acc[j] += x;
				abs_[j] += fabs(x);
			}
		}
		for (int64_t j = 0; j < N; j++) {
			double ref = g->alpha * acc[j], mag = fabs(g->alpha) * abs_[j];

			if (c != NULL) {
				ref += g->beta * c[i * N + j];
				mag += fabs(g->beta * c[i * N + j]);
			}
			if (bias != NULL) {
				ref += bias[j];
				mag += fabs(bias[j]);
			}
			if (g->pre != NULL) {
				g->pre[i * N + j] = ref;
			}
			if (g->pre_magnitude != NULL) {
				g->pre_magnitude[i * N + j] = mag;
			}
			if (gelu) {
				ref = g->gelu_erf ? gelu_erf(ref) : tl_gelu_tanh(ref);
				/* GELU's slope stays below 1.13. */
				mag *= 1.2;
			}
			if (g->epilogue == RP_EPILOGUE_DGELU && g->aux != NULL) {
				const double x = g->aux[i * N + j], slope = tl_dgelu_tanh(x);
				const double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));

				/* The slope is 0.5 + 0.5 t + the rest, which cancel
				 * in the tails (t near -1): its rounding is relative
				 * to their magnitudes, not to the slope. */
				ref *= slope;
				mag *= 0.5 + 0.5 * fabs(t) + fabs(slope - 0.5 * (1.0 + t));
			}
			d[i * N + j] = ref;
			if (magnitude != NULL) {
				magnitude[i * N + j] = mag;
			}
		}
	}
	free(bt);
	free(acc);
	free(abs_);
}

static int64_t kv_heads(const struct tl_attention *at)
{
	return at->hkv > 0 ? at->hkv : at->h;
}

/* Row of k and v ([b, hkv, skv] order) that key j of query head bh reads. */
static int64_t kv_row(const struct tl_attention *at, int64_t bh, int64_t j)
{
	int64_t b = bh / at->h, h = bh % at->h, hkv = kv_heads(at);

	return (b * hkv + h / (at->h / hkv)) * at->skv + j;
}

/* The lengths of the entry of query head bh. */
static void lengths(const struct tl_attention *at, int64_t bh, int64_t *lq, int64_t *lkv)
{
	int64_t b = bh / at->h;

	*lq = at->seq_len_q ? at->seq_len_q[b] : at->sq;
	*lkv = at->seq_len_kv ? at->seq_len_kv[b] : at->skv;
}

/* Whether query i of head bh does not see key j: padding on either side,
 * or past the causal diagonal. */
static bool masked(const struct tl_attention *at, int64_t bh, int64_t i, int64_t j)
{
	int64_t lq, lkv;

	lengths(at, bh, &lq, &lkv);
	if (i >= lq || j >= lkv) {
		return true;
	}
	return at->causal && j > i + (at->bottom_right ? lkv - lq : 0);
}

static double dot(const double *x, const double *y, int64_t n)
{
	double s = 0;

	for (int64_t t = 0; t < n; t++) {
		s += x[t] * y[t];
	}
	return s;
}

void tl_attention_ref(const struct tl_attention *at, const double *q, const double *k, const double *v, double *o,
		      double *lse, double *o_magnitude)
{
	const int64_t D = at->d, DV = at->dv;
	double *p = malloc((size_t)(at->skv + 1) * sizeof(double));

	ASSERT_NOT_NULL(p);
	for (int64_t bh = 0; bh < at->b * at->h; bh++) {
		for (int64_t i = 0; i < at->sq; i++) {
			const int64_t qi = bh * at->sq + i;
			double mx = -INFINITY, sum = 0;

			for (int64_t j = 0; j < at->skv; j++) {
				p[j] = at->scale * dot(q + qi * D, k + kv_row(at, bh, j) * D, D);
				if (!masked(at, bh, i, j) && p[j] > mx) {
					mx = p[j];
				}
			}
			for (int64_t j = 0; j < at->skv; j++) {
				p[j] = masked(at, bh, i, j) ? 0.0 : exp(p[j] - mx);
				sum += p[j];
			}
			/* No key seen (a padding row): the empty sum. */
			for (int64_t j = 0; j < at->skv; j++) {
				p[j] = sum > 0 ? p[j] / sum : 0.0;
			}
			for (int64_t t = 0; t < DV; t++) {
				double acc = 0, mag = 0;

				for (int64_t j = 0; j < at->skv; j++) {
					/* A masked key's value is never read: padding
					 * may hold anything. */
					if (masked(at, bh, i, j)) {
						continue;
					}
					double x = v[kv_row(at, bh, j) * DV + t];

					acc += p[j] * x;
					mag += p[j] * fabs(x);
				}
				o[qi * DV + t] = acc;
				if (o_magnitude != NULL) {
					o_magnitude[qi * DV + t] = mag;
				}
			}
			if (lse != NULL) {
				lse[qi] = sum > 0 ? mx + log(sum) : -INFINITY;
			}
		}
	}
	free(p);
}

void tl_attention_backward_ref(const struct tl_attention *at, const double *q, const double *k, const double *v,
			       const double *o, const double *d_o, double *dq, double *dk, double *dv,
			       const struct tl_attention_grad_magnitude *magnitude)
{
	const int64_t D = at->d, DV = at->dv;
	const size_t nq = (size_t)(at->b * at->h * at->sq), nk = (size_t)(at->b * kv_heads(at) * at->skv);
	double *o_exact = malloc((nq * (size_t)DV + 1) * sizeof(double)), *lse = malloc((nq + 1) * sizeof(double));

	ASSERT(o_exact != NULL && lse != NULL, "out of memory");
	tl_attention_ref(at, q, k, v, o_exact, lse, NULL);
	if (o == NULL) {
		o = o_exact;
	}
	memset(dq, 0, nq * (size_t)D * sizeof(double));
	memset(dk, 0, nk * (size_t)D * sizeof(double));
	memset(dv, 0, nk * (size_t)DV * sizeof(double));
	if (magnitude != NULL) {
		memset(magnitude->dq, 0, nq * (size_t)D * sizeof(double));
		memset(magnitude->dk, 0, nk * (size_t)D * sizeof(double));
		memset(magnitude->dv, 0, nk * (size_t)DV * sizeof(double));
	}
	for (int64_t bh = 0; bh < at->b * at->h; bh++) {
		for (int64_t i = 0; i < at->sq; i++) {
			const int64_t qi = bh * at->sq + i;
			const double *qrow = q + qi * D, *dorow = d_o + qi * DV;
			double di = 0, di_abs = 0;

			for (int64_t t = 0; t < DV; t++) {
				di += dorow[t] * o[qi * DV + t];
				di_abs += fabs(dorow[t] * o[qi * DV + t]);
			}
			for (int64_t j = 0; j < at->skv; j++) {
				const int64_t kj = kv_row(at, bh, j);
				const double *krow = k + kj * D, *vrow = v + kj * DV;
				double pij, dp = 0, dp_abs = 0, ds, ds_abs;

				if (masked(at, bh, i, j)) {
					continue;
				}
				pij = exp(at->scale * dot(qrow, krow, D) - lse[qi]);
				for (int64_t t = 0; t < DV; t++) {
					dp += dorow[t] * vrow[t];
					dp_abs += fabs(dorow[t] * vrow[t]);
					dv[kj * DV + t] += pij * dorow[t];
					if (magnitude != NULL) {
						magnitude->dv[kj * DV + t] += pij * fabs(dorow[t]);
					}
				}
				ds = pij * (dp - di);
				ds_abs = pij * (dp_abs + di_abs);
				for (int64_t t = 0; t < D; t++) {
					dq[qi * D + t] += at->scale * ds * krow[t];
					dk[kj * D + t] += at->scale * ds * qrow[t];
					if (magnitude != NULL) {
						magnitude->dq[qi * D + t] += at->scale * ds_abs * fabs(krow[t]);
						magnitude->dk[kj * D + t] += at->scale * ds_abs * fabs(qrow[t]);
					}
				}
			}
		}
	}
	free(o_exact);
	free(lse);
}

void tl_layer_norm_ref(const struct tl_layer_norm *ln, const double *x, const double *weight, const double *bias,
		       double *y, double *mean, double *rstd, double *y_magnitude)
{
	const int64_t n = ln->n;

	for (int64_t i = 0; i < ln->rows; i++) {
		const double *xr = x + i * n;
		double s = 0, q = 0;

		for (int64_t j = 0; j < n; j++) {
			s += xr[j];
		}
		const double mu = s / (double)n;
		for (int64_t j = 0; j < n; j++) {
			q += (xr[j] - mu) * (xr[j] - mu);
		}
		const double rs = 1.0 / sqrt(q / (double)n + ln->eps);
		if (mean) {
			mean[i] = mu;
		}
		if (rstd) {
			rstd[i] = rs;
		}
		for (int64_t j = 0; j < n; j++) {
			const double b = bias ? bias[j] : 0.0;

			y[i * n + j] = (xr[j] - mu) * rs * weight[j] + b;
			/* x and its mean are subtracted in f32: each carries its
			 * rounding into y, scaled by rstd and the weight. */
			if (y_magnitude) {
				y_magnitude[i * n + j] = (fabs(xr[j]) + fabs(mu)) * rs * fabs(weight[j]) + fabs(b);
			}
		}
	}
}

void tl_layer_norm_backward_ref(const struct tl_layer_norm *ln, const double *d_y, const double *x,
				const double *weight, const double *mean, const double *rstd, const double *d_residual,
				double *d_x, double *d_weight, double *d_bias,
				const struct tl_layer_norm_grad_magnitude *magnitude)
{
	const int64_t n = ln->n;

	for (int64_t j = 0; j < n; j++) {
		d_weight[j] = d_bias[j] = 0;
		if (magnitude) {
			magnitude->d_weight[j] = magnitude->d_bias[j] = 0;
		}
	}
	for (int64_t i = 0; i < ln->rows; i++) {
		const double *dy = d_y + i * n, *xr = x + i * n;
		double sg = 0, sgx = 0, ag = 0, agx = 0;

		for (int64_t j = 0; j < n; j++) {
			const double xh = (xr[j] - mean[i]) * rstd[i], g = dy[j] * weight[j];

			sg += g;
			sgx += g * xh;
			ag += fabs(g);
			agx += fabs(g * xh);
			d_weight[j] += dy[j] * xh;
			d_bias[j] += dy[j];
			if (magnitude) {
				magnitude->d_weight[j] += fabs(dy[j] * xh);
				magnitude->d_bias[j] += fabs(dy[j]);
			}
		}
		for (int64_t j = 0; j < n; j++) {
			const double xh = (xr[j] - mean[i]) * rstd[i], g = dy[j] * weight[j];
			const double r = d_residual ? d_residual[i * n + j] : 0.0;

			d_x[i * n + j] = rstd[i] * (g - sg / (double)n - xh * sgx / (double)n) + r;
			/* The terms before they cancel; xhat's own rounding is
			 * that of x - mean, as in the forward. */
			if (magnitude) {
				const double xh_mag = (fabs(xr[j]) + fabs(mean[i])) * rstd[i];

				magnitude->d_x[i * n + j] =
					rstd[i] * (fabs(g) + ag / (double)n + xh_mag * agx / (double)n) + fabs(r);
			}
		}
	}
}

double tl_rel_error(const double *got, const double *ref, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		if (isnan(got[i])) {
			return INFINITY;
		}
		num += (got[i] - ref[i]) * (got[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

size_t tl_check_close(const char *what, enum rp_dtype dt, const double *got, const double *ref, const double *magnitude,
		      size_t n, double tol, char *why, size_t why_size)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		double bound = tol * magnitude[i] + tl_dtype_eps(dt) * fabs(ref[i]) + tl_dtype_quantum(dt);

		/* Equal is close; an infinite reference (a padding row's -inf)
		 * only is. */
		bool close = got[i] == ref[i] || (isfinite(ref[i]) && fabs(got[i] - ref[i]) <= bound);

		if (!close && bad++ == 0) {
			first = i;
		}
	}
	if (bad > 0) {
		snprintf(why, why_size, "%s: %zu of %zu wrong; first [%zu] = %.9g, reference %.9g (bound %.3g)", what,
			 bad, n, first, got[first], ref[first],
			 tol * magnitude[first] + tl_dtype_eps(dt) * fabs(ref[first]) + tl_dtype_quantum(dt));
	}
	return bad;
}
