/* SPDX-License-Identifier: Apache-2.0 */
/* float64 references for GEMM, attention and LayerNorm, written once for every test
 * that checks a result (unit tests of the host math, integration tests
 * through regend). Inputs are dense row-major arrays of the values as
 * stored, already rounded to their storage type, so that what a tolerance
 * measures is the kernel's accumulation and its output's rounding, nothing
 * else. Alongside each result a magnitude can be had: the sum of the
 * magnitudes of the terms that made it, the scale its rounding error is
 * relative to. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "proto/compute.h"

struct tl_gemm {
	int64_t m, n, k;
	bool trans_a, trans_b;      /* a stored [k, m], b stored [n, k] */
	double alpha, beta;
	/* GELU for RP_EPILOGUE_GELU, _GELU_BIAS, _GELU_AUX and _GELU_AUX_BIAS, in cuBLASLt's tanh form
	 * unless gelu_erf. The bias is added when given, whatever the epilogue. */
	enum rp_epilogue epilogue;
	bool gelu_erf;
	/* RP_EPILOGUE_DGELU: the pre-activation [m, n] whose tanh-GELU slope
	 * multiplies each element. */
	const double *aux;
	/* When not NULL: each element before GELU or its slope are applied
	 * (what gelu_aux writes to aux_out), and its magnitude. */
	double *pre, *pre_magnitude;
};

/* The tanh approximation of GELU, and its derivative (torch's
 * gelu_backward(1, x, approximate="tanh")). */
double tl_gelu_tanh(double x);
double tl_dgelu_tanh(double x);

/* d[m*n] = gelu?(alpha op(a) op(b) + beta c + bias), or for dgelu
 * (alpha op(a) op(b) + beta c) * tl_dgelu_tanh(aux): c ([m, n]) and bias
 * ([n]) may be NULL, and then add nothing. magnitude[m*n] may be NULL. */
void tl_gemm_ref(const struct tl_gemm *g, const double *a, const double *b, const double *c, const double *bias,
		 double *d, double *magnitude);

struct tl_attention {
	int64_t b, h, sq, skv, d, dv;
	int64_t hkv;                /* key/value heads, h a multiple of it; 0: h */
	double scale;
	bool causal;
	bool bottom_right;          /* the causal diagonal aligned bottom-right (needs sq <= skv) */
	/* Per batch entry (b of each), or NULL: every sequence full. Entry n's
	 * queries are its first seq_len_q[n] rows, its keys its first
	 * seq_len_kv[n]; bottom-right aligns on those. Both or neither. */
	const int32_t *seq_len_q, *seq_len_kv;
};

/* q [b, h, sq, d], k [b, hkv, skv, d], v [b, hkv, skv, dv] -> o [b, h, sq, dv]
 * and the softmax's log-sum-exp lse [b, h, sq] (may be NULL). o_magnitude
 * (may be NULL): sum_j p_ij |v_j|. A row past its entry's seq_len_q (or one
 * that sees no key) is the empty sum: o 0, lse -inf; its gradients are 0,
 * as are those of keys past seq_len_kv. */
void tl_attention_ref(const struct tl_attention *at, const double *q, const double *k, const double *v, double *o,
		      double *lse, double *o_magnitude);

/* Magnitudes of the gradients' terms before they cancel. */
struct tl_attention_grad_magnitude {
	double *dq, *dk, *dv;
};

/* Gradients for dL/dO = d_o, the softmax recomputed exactly. D_i = d_o_i . o_i
 * takes o as given (what the kernel wrote, as a backward on the device
 * reads it), or the exact forward's when o is NULL. dq, dk, dv are shaped as
 * q, k, v and overwritten; magnitude may be NULL. */
void tl_attention_backward_ref(const struct tl_attention *at, const double *q, const double *k, const double *v,
			       const double *o, const double *d_o, double *dq, double *dk, double *dv,
			       const struct tl_attention_grad_magnitude *magnitude);

struct tl_layer_norm {
	int64_t rows, n;
	double eps;
};

/* LayerNorm over the rows of x [rows, n] (dense): y = (x - mean) rstd
 * weight + bias, the biased variance, rstd = 1 / sqrt(variance + eps).
 * bias, mean, rstd and y_magnitude may be NULL. */
void tl_layer_norm_ref(const struct tl_layer_norm *ln, const double *x, const double *weight, const double *bias,
		       double *y, double *mean, double *rstd, double *y_magnitude);

/* Magnitudes of the gradients' terms before they cancel ([rows*n], [n], [n]). */
struct tl_layer_norm_grad_magnitude {
	double *d_x, *d_weight, *d_bias;
};

/* LayerNorm's gradients from the statistics given (the forward's, as it
 * stored them): d_x [rows*n] (+ d_residual unless NULL), d_weight and d_bias
 * [n], overwritten. magnitude may be NULL. */
void tl_layer_norm_backward_ref(const struct tl_layer_norm *ln, const double *d_y, const double *x,
				const double *weight, const double *mean, const double *rstd, const double *d_residual,
				double *d_x, double *d_weight, double *d_bias,
				const struct tl_layer_norm_grad_magnitude *magnitude);

/* ||got - ref|| / ||ref|| in the 2-norm (the absolute error when ref is 0;
 * infinity when got holds a NaN). */
double tl_rel_error(const double *got, const double *ref, size_t n);

/* Elementwise: |got - ref| <= tol * magnitude + eps(dt) |ref| + quantum(dt)
 * (dtype.h). Returns how many elements are out of bounds and describes the
 * first in why ("what: 3 of 64 wrong; first [5] = ..."). */
size_t tl_check_close(const char *what, enum rp_dtype dt, const double *got, const double *ref, const double *magnitude,
		      size_t n, double tol, char *why, size_t why_size);
