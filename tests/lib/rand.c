/* SPDX-License-Identifier: Apache-2.0 */
/* Random test data; see rand.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "tests/lib/rand.h"

static uint64_t g_seed;
static int g_seeded;
static struct tl_rng g_rng;

void tl_rand_init(void)
{
	const char *env = getenv("REGEN_TEST_SEED");
	struct timespec ts;

	if (g_seeded) {
		return;
	}
	if (env != NULL && env[0] != '\0') {
		g_seed = strtoull(env, NULL, 0);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		g_seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
	}
	g_seeded = 1;
	fprintf(stderr, "%s: seed %llu (REGEN_TEST_SEED=%llu replays it)\n", program_invocation_short_name,
		(unsigned long long)g_seed, (unsigned long long)g_seed);
	tl_rng_init(&g_rng, 0);
}

uint64_t tl_seed(void)
{
	tl_rand_init();
	return g_seed;
}

void tl_rand_reseed_child(uint64_t nth)
{
	tl_rng_init(&g_rng, 1000003u * nth);
}

uint64_t tl_rng_next(struct tl_rng *r)
{
	/* splitmix64: tiny, and good enough for test data. */
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void tl_rng_init(struct tl_rng *r, uint64_t salt)
{
	r->s = tl_seed() ^ (salt * 0x2545f4914f6cdd1dull);
	tl_rng_next(r);
}

double tl_rng_uniform(struct tl_rng *r, double lo, double hi)
{
	return lo + (hi - lo) * ((double)(tl_rng_next(r) >> 11) * 0x1p-53);
}

int64_t tl_rng_int(struct tl_rng *r, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(tl_rng_next(r) % (uint64_t)(hi - lo + 1));
}

struct tl_rng *tl_rand(void)
{
	tl_rand_init();
	return &g_rng;
}

double tl_rand_uniform(double lo, double hi)
{
	return tl_rng_uniform(tl_rand(), lo, hi);
}

int tl_rand_int(int lo, int hi)
{
	return (int)tl_rng_int(tl_rand(), lo, hi);
}
