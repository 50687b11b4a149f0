/* SPDX-License-Identifier: Apache-2.0 */
/* Philox4x32-10 and dropout_mask's draw: see philox.h. */
#include <math.h>

#include "philox.h"

/* Random123's constants: the two multipliers, and the Weyl sequence's
 * increments (the golden ratio's and sqrt(3) - 1's fractions) that bump
 * the key between rounds. */
#define PHILOX_M0 UINT32_C(0xD2511F53)
#define PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PHILOX_W0 UINT32_C(0x9E3779B9)
#define PHILOX_W1 UINT32_C(0xBB67AE85)
#define PHILOX_ROUNDS 10

void rp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
	uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
	uint32_t k0 = key[0], k1 = key[1];

	for (int r = 0; r < PHILOX_ROUNDS; r++) {
		const uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;

		if (r > 0) {
			k0 += PHILOX_W0;
			k1 += PHILOX_W1;
		}
		c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		c1 = (uint32_t)p1;
		c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		c3 = (uint32_t)p0;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

uint32_t rp_dropout_threshold(double p)
{
	if (!(p > 0))
		return 0;
	if (p >= 1)
		return UINT32_C(1) << 24;
	return (uint32_t)ceil(p * 0x1p24);
}

bool rp_dropout_keep(uint64_t seed, uint32_t stream, uint64_t i, uint32_t threshold)
{
	const uint32_t counter[4] = { (uint32_t)i, (uint32_t)(i >> 32), stream, 0 };
	const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
	uint32_t out[4];

	rp_philox4x32_10(counter, key, out);
	return out[0] >> 8 >= threshold;
}

uint64_t rp_dropout_seed(double value)
{
	return value >= 0 && value < RP_DROPOUT_SEED_LIMIT ? (uint64_t)value : 0;
}
