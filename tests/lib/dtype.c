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

double tl_dtype_eps(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F32 ? ldexp(1, -23) : dt == RP_DTYPE_F16 ? ldexp(1, -10) : ldexp(1, -7);
}

double tl_dtype_quantum(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F32 ? ldexp(1, -149) : dt == RP_DTYPE_F16 ? ldexp(1, -24) : ldexp(1, -133);
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

double tl_load(enum rp_dtype dt, const void *base, size_t i)
{
	float f;
	uint16_t h;

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

	for (size_t i = 0; i < count; i++) {
		if (dt == RP_DTYPE_F32) {
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
