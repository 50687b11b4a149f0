/* SPDX-License-Identifier: Apache-2.0 */
/* Elements as the tests store and read them, independent of the code under
 * test: f32, f16 and bf16 to and from double, rounding to nearest even, and
 * the NaN that marks an element nobody may write; f64 as is, and i32, i64
 * and u8 truncated toward zero and saturated (their poison a value no test
 * draws); e4m3 and e5m2 rounded to nearest even and saturated. Sizes and names are proto's (rp_dtype_size, rp_dtype_name). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include "proto/operand.h"

/* Relative spacing of the type: 2^-23, 2^-10, 2^-7, 2^-52 (f64); 0 for
 * integers. */
double tl_dtype_eps(enum rp_dtype dt);
/* Spacing of its smallest (subnormal) values: the rounding error a result
 * near zero may carry whatever its magnitude. */
double tl_dtype_quantum(enum rp_dtype dt);

/* FP8 (e4m3, e5m2) written apart from the daemon's codec: a byte's value
 * from its fields, and a value's byte as the nearest of all 256 (ties to
 * the even mantissa, saturating, NaN the canonical 0x7f with its sign). */
double tl_fp8_decode(enum rp_dtype dt, uint8_t b);
uint8_t tl_fp8_encode(enum rp_dtype dt, double v);

/* Element i of an array of dt at base. */
double tl_load(enum rp_dtype dt, const void *base, size_t i);
/* Stores v rounded to nearest even; returns the value as stored. */
double tl_store(enum rp_dtype dt, void *base, size_t i, double v);

/* A NaN with a payload of its own: outputs start as it, and padding that
 * nobody may write must still hold exactly it afterwards. */
void tl_poison(enum rp_dtype dt, void *base, size_t count);
bool tl_is_poison(enum rp_dtype dt, const void *base, size_t i);

struct tl_rng;
/* Stores n values uniform in [lo, hi) (rng NULL: the process's stream,
 * rand.h); the values as stored go to out when it is not NULL. */
void tl_fill_random(struct tl_rng *rng, enum rp_dtype dt, void *base, size_t n, double lo, double hi, double *out);
