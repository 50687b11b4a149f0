/* SPDX-License-Identifier: Apache-2.0 */
/* Random test data. One seed per test program, from $REGEN_TEST_SEED or the
 * clock, printed once at start: REGEN_TEST_SEED=<seed> replays a run.
 * Streams are derived from it with a salt (a case, a thread, the n-th
 * forked child), so a replay draws the same numbers in the same places. */
#pragma once

#include <stdint.h>

struct tl_rng {
	uint64_t s;
};

/* Picks and prints the seed (once; tl_init calls it) and starts the
 * process's own stream. */
void tl_rand_init(void);
uint64_t tl_seed(void);
/* A forked child's own stream: salt is which child it is (1, 2, ...). */
void tl_rand_reseed_child(uint64_t nth);

/* An independent stream: splitmix64 from the seed and salt. */
void tl_rng_init(struct tl_rng *r, uint64_t salt);
uint64_t tl_rng_next(struct tl_rng *r);
/* Uniform in [lo, hi). */
double tl_rng_uniform(struct tl_rng *r, double lo, double hi);
/* Uniform in [lo, hi], both included. */
int64_t tl_rng_int(struct tl_rng *r, int64_t lo, int64_t hi);

/* The process's own stream (not thread-safe). */
struct tl_rng *tl_rand(void);
double tl_rand_uniform(double lo, double hi);
int tl_rand_int(int lo, int hi);
