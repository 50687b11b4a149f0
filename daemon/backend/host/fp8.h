/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 on the host backend: the E4M3 and E5M2 codecs, and the reference math
 * of the FP8 GEMM, Quantize, TransposeQuantize and ScaleUpdate
 * (proto/compute_fp8.c says what each computes). math.c's table dispatches
 * to these. */
#pragma once

#include <stdint.h>
#include "proto/compute.h"

/* v rounded to nearest even in dt (RP_DTYPE_E4M3 or RP_DTYPE_E5M2),
 * saturated: a finite or infinite v beyond the largest finite value gives
 * it, with v's sign (torch's float8 training casts, x.clamp(-max,
 * max).to(float8); cuda_fp8.h's __NV_SATFINITE). NaN gives 0x7f with v's
 * sign bit. */
uint8_t rd_fp8_encode(double v, enum rp_dtype dt);
/* The value of an FP8 byte: exact in a double (and in a float). E4M3's
 * 0x7f and 0xff are NaN; E5M2's exponent 31 is infinity or NaN. */
double rd_fp8_decode(uint8_t b, enum rp_dtype dt);

/* The FP8 GEMM: the products of the dequantized operands summed in f64,
 * then alpha, beta C, bias and GELU in f64; amax_d of that result; D
 * rounded once to its dtype (an FP8 D after d_scale). 0, -ENOMEM, -EINVAL
 * for an empty shape. */
int rd_host_fp8_gemm(const struct rp_compute *c, void *const *ptr);
/* Quantize and TransposeQuantize. 0. */
int rd_host_quantize(const struct rp_compute *c, void *const *ptr);
/* ScaleUpdate, in f32 as Transformer Engine's kernel computes it, so the
 * host's scales are the GPU's bit for bit. 0, or -ENOMEM. */
int rd_host_scale_update(const struct rp_compute *c, void *const *ptr);

/* The scales a call reads (Gemm's a_scale, b_scale, d_scale; the quantize
 * ops' scale) are finite and positive; 0 or -EINVAL with InvalidOperand
 * naming the first that is not. */
int rd_host_fp8_check_scales(const struct rp_compute *c, void *const *ptr, struct rp_error *err);
