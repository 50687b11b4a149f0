/* SPDX-License-Identifier: Apache-2.0 */
/* Elements; see dtype.h. Written apart from the daemon's conversions so that
 * a test does not read results through the code it checks. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"

#define POISON_F32 0x7fc00badu
#define POISON_F16 0x7ebdu
#define POISON_BF16 0x7fbdu

#define POISON_F64 0x7ff80000000badbaull
/* Integers have no NaN: a value no test draws. */
#define POISON_I32 INT32_C(-0x5badbad)
#define POISON_I64 INT64_C(-0x5badbad5badbad)
#define POISON_U8 0xbdu
/* FP8 has one NaN pattern a side (E4M3) or a few (E5M2); the negative one
 * nothing regen writes for an input that is not a negative NaN. */
#define POISON_FP8 0xffu

double tl_dtype_eps(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_F32:
		return ldexp(1, -23);
	case RP_DTYPE_F16:
		return ldexp(1, -10);
	case RP_DTYPE_F64:
		return ldexp(1, -52);
	case RP_DTYPE_I32:
	case RP_DTYPE_I64:
	case RP_DTYPE_U8:
		return 0;
	case RP_DTYPE_E4M3:
		return ldexp(1, -3);
	case RP_DTYPE_E5M2:
		return ldexp(1, -2);
	default:
		return ldexp(1, -7);
	}
}

double tl_dtype_quantum(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_F32:
		return ldexp(1, -149);
	case RP_DTYPE_F16:
		return ldexp(1, -24);
	case RP_DTYPE_F64:
		return ldexp(1, -1074);
	case RP_DTYPE_I32:
	case RP_DTYPE_I64:
	case RP_DTYPE_U8:
		return 0;
	case RP_DTYPE_E4M3:
		return ldexp(1, -9);
	case RP_DTYPE_E5M2:
		return ldexp(1, -16);
	default:
		return ldexp(1, -133);
	}
}

/* Integers as stored from a double: truncated toward zero, saturated,
 * NaN 0 (what a float-to-integer cast does in regen). */
static int64_t int_of(double v, int64_t lo, int64_t hi)
{
	if (isnan(v)) {
		return 0;
	}
	v = trunc(v);
	if (v <= (double)lo) {
		return lo;
	}
	if (v >= (double)hi) {
		return hi;
	}
	return (int64_t)v;
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u) {
		return (uint16_t)((x >> 16) | 0x40u);
	}
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static double bf16_to_double(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;

	memcpy(&f, &x, 4);
	return f;
}

static uint16_t f32_to_f16(float f)
{
	uint32_t x, sign, exp, man, r, rem, half;
	int e, shift;

	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000u;
	exp = (x >> 23) & 0xffu;
	man = x & 0x7fffffu;
	if (exp == 0xff) {
		return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
	}
	e = (int)exp - 127 + 15;
	if (e >= 31) {
		return (uint16_t)(sign | 0x7c00u);
	}
	if (e <= 0) {
		if (e < -10) {
			return (uint16_t)sign;
		}
		man |= 0x800000u;
		shift = 14 - e;
		half = 1u << (shift - 1);
		rem = man & ((1u << shift) - 1);
		r = man >> shift;
		if (rem > half || (rem == half && (r & 1u))) {
			r++;
		}
		return (uint16_t)(sign | r);
	}
	r = man >> 13;
	rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
		r++;
	}
	return (uint16_t)(sign | (((uint32_t)e << 10) + r));
}

static double f16_to_double(uint16_t h)
{
	int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	double v;

	if (exp == 0) {
		v = ldexp(man, -24);
	} else if (exp == 31) {
		v = man ? NAN : INFINITY;
	} else {
		v = ldexp(man | 0x400, exp - 25);
	}
	return (h & 0x8000) ? -v : v;
}

/* FP8 from its bit fields: sign, exponent (bias 7 or 15), mantissa (3 or
 * 2 bits), subnormals at exponent 0. */
double tl_fp8_decode(enum rp_dtype dt, uint8_t b)
{
	const int mbits = dt == RP_DTYPE_E4M3 ? 3 : 2, bias = dt == RP_DTYPE_E4M3 ? 7 : 15;
	const int exp = (b & 0x7f) >> mbits, man = b & ((1 << mbits) - 1);
	double v;

	if (dt == RP_DTYPE_E4M3 && (b & 0x7f) == 0x7f) {
		return NAN;
	}
	if (dt == RP_DTYPE_E5M2 && exp == 31) {
		v = man ? NAN : INFINITY;
	} else if (exp == 0) {
		v = ldexp(man, 1 - bias - mbits);
	} else {
		v = ldexp(man + (1 << mbits), exp - bias - mbits);
	}
	return (b & 0x80) ? -v : v;
}

/* The nearest of all finite codes, found by looking at every one; a tie
 * goes to the code with an even mantissa; beyond the largest, the largest
 * (saturation); NaN the canonical NaN. Slow and obviously right. */
uint8_t tl_fp8_encode(enum rp_dtype dt, double v)
{
	uint8_t best = 0;
	double best_err = INFINITY;

	if (isnan(v)) {
		return (signbit(v) ? 0x80 : 0) | 0x7f;
	}
	for (int c = 0; c < 256; c++) {
		double x = tl_fp8_decode(dt, (uint8_t)c), e;

		if (!isfinite(x) || (x == 0 && signbit(x) != signbit(v))) {
			continue;
		}
		e = fabs(x - v);
		if (e < best_err || (e == best_err && (c & 1) == 0)) {
			best = (uint8_t)c;
			best_err = e;
		}
	}
	return best;
}

double tl_load(enum rp_dtype dt, const void *base, size_t i)
{
	float f;
	uint16_t h;
	double d;
	int32_t i32;
	int64_t i64;
	uint8_t u8;

	switch (dt) {
	case RP_DTYPE_F64:
		memcpy(&d, (const char *)base + 8 * i, 8);
		return d;
	case RP_DTYPE_I32:
		memcpy(&i32, (const char *)base + 4 * i, 4);
		return i32;
	case RP_DTYPE_I64:
		memcpy(&i64, (const char *)base + 8 * i, 8);
		return (double)i64;
	case RP_DTYPE_U8:
		memcpy(&u8, (const char *)base + i, 1);
		return u8;
	case RP_DTYPE_E4M3:
	case RP_DTYPE_E5M2:
		return tl_fp8_decode(dt, ((const uint8_t *)base)[i]);
	default:
		break;
	}
	if (dt == RP_DTYPE_F32) {
		memcpy(&f, (const char *)base + 4 * i, 4);
		return f;
	}
	memcpy(&h, (const char *)base + 2 * i, 2);
	return dt == RP_DTYPE_F16 ? f16_to_double(h) : bf16_to_double(h);
}

double tl_store(enum rp_dtype dt, void *base, size_t i, double v)
{
	float f = (float)v;
	uint16_t h;
	int32_t i32;
	int64_t i64;
	uint8_t u8;

	switch (dt) {
	case RP_DTYPE_F64:
		memcpy((char *)base + 8 * i, &v, 8);
		return v;
	case RP_DTYPE_I32:
		i32 = (int32_t)int_of(v, INT32_MIN, INT32_MAX);
		memcpy((char *)base + 4 * i, &i32, 4);
		return i32;
	case RP_DTYPE_I64:
		i64 = int_of(v, INT64_MIN, INT64_MAX);
		memcpy((char *)base + 8 * i, &i64, 8);
		return (double)i64;
	case RP_DTYPE_U8:
		u8 = (uint8_t)int_of(v, 0, UINT8_MAX);
		memcpy((char *)base + i, &u8, 1);
		return u8;
	case RP_DTYPE_E4M3:
	case RP_DTYPE_E5M2:
		((uint8_t *)base)[i] = tl_fp8_encode(dt, v);
		return tl_load(dt, base, i);
	default:
		break;
	}
	if (dt == RP_DTYPE_F32) {
		memcpy((char *)base + 4 * i, &f, 4);
	} else {
		h = dt == RP_DTYPE_F16 ? f32_to_f16(f) : f32_to_bf16(f);
		memcpy((char *)base + 2 * i, &h, 2);
	}
	return tl_load(dt, base, i);
}

void tl_poison(enum rp_dtype dt, void *base, size_t count)
{
	const uint32_t p32 = POISON_F32;
	const uint16_t p16 = dt == RP_DTYPE_F16 ? POISON_F16 : POISON_BF16;
	const uint64_t p64 = POISON_F64;
	const int32_t pi32 = POISON_I32;
	const int64_t pi64 = POISON_I64;
	const uint8_t pu8 = POISON_U8;

	for (size_t i = 0; i < count; i++) {
		if (dt == RP_DTYPE_F64) {
			memcpy((char *)base + 8 * i, &p64, 8);
		} else if (dt == RP_DTYPE_I32) {
			memcpy((char *)base + 4 * i, &pi32, 4);
		} else if (dt == RP_DTYPE_I64) {
			memcpy((char *)base + 8 * i, &pi64, 8);
		} else if (dt == RP_DTYPE_U8) {
			memcpy((char *)base + i, &pu8, 1);
		} else if (rp_dtype_is_fp8(dt)) {
			((uint8_t *)base)[i] = POISON_FP8;
		} else if (dt == RP_DTYPE_F32) {
			memcpy((char *)base + 4 * i, &p32, 4);
		} else {
			memcpy((char *)base + 2 * i, &p16, 2);
		}
	}
}

bool tl_is_poison(enum rp_dtype dt, const void *base, size_t i)
{
	uint32_t x32;
	uint16_t x16;
	uint64_t x64;
	int32_t i32;
	int64_t i64;
	uint8_t u8;

	switch (dt) {
	case RP_DTYPE_F64:
		memcpy(&x64, (const char *)base + 8 * i, 8);
		return x64 == POISON_F64;
	case RP_DTYPE_I32:
		memcpy(&i32, (const char *)base + 4 * i, 4);
		return i32 == POISON_I32;
	case RP_DTYPE_I64:
		memcpy(&i64, (const char *)base + 8 * i, 8);
		return i64 == POISON_I64;
	case RP_DTYPE_U8:
		memcpy(&u8, (const char *)base + i, 1);
		return u8 == POISON_U8;
	case RP_DTYPE_E4M3:
	case RP_DTYPE_E5M2:
		return ((const uint8_t *)base)[i] == POISON_FP8;
	default:
		break;
	}
	if (dt == RP_DTYPE_F32) {
		memcpy(&x32, (const char *)base + 4 * i, 4);
		return x32 == POISON_F32;
	}
	memcpy(&x16, (const char *)base + 2 * i, 2);
	return x16 == (dt == RP_DTYPE_F16 ? POISON_F16 : POISON_BF16);
}

void tl_fill_random(struct tl_rng *rng, enum rp_dtype dt, void *base, size_t n, double lo, double hi, double *out)
{
	if (rng == NULL) {
		rng = tl_rand();
	}
	for (size_t i = 0; i < n; i++) {
		double v = tl_store(dt, base, i, tl_rng_uniform(rng, lo, hi));

		if (out != NULL) {
			out[i] = v;
		}
	}
}
