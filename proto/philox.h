/* SPDX-License-Identifier: Apache-2.0 */
/* Philox4x32-10, the counter-based generator of dropout_mask
 * (proto/program.h), and the mask it draws.
 *
 * Philox (Salmon, Moraes, Dror and Shaw, "Parallel Random Numbers: As Easy
 * as 1, 2, 3", SC11; D. E. Shaw Research's Random123) maps a 128-bit
 * counter and a 64-bit key to 128 random bits in ten rounds of two 32x32
 * to 64-bit products: no state, so every element of a mask is drawn on its
 * own, in any order, on any backend, the same bits every time.
 *
 * dropout_mask draws element i (its flat row-major index in the mask's
 * shape) from counter (i low 32 bits, i high 32 bits, stream, 0) under key
 * (seed low 32 bits, seed high 32 bits); u = (word 0 >> 8) * 2^-24 is
 * uniform in [0, 1), and the element is kept (1) where u >= p, dropped (0)
 * otherwise. The host backend draws with these functions; the CUDA
 * kernels regend writes (daemon/program/codegen.c, rg_dropout_keep) with
 * the same arithmetic, and the tests hold the two to each other bit for
 * bit. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* out = Philox4x32-10(counter, key). */
void rp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* The draws below the threshold are dropped: with k = word 0 >> 8, u = k
 * 2^-24 >= p exactly when k >= ceil(p 2^24) (p 2^24 is exact in double).
 * p in [0, 1]; 2^24 (every element dropped) for p above 1 - 2^-24. */
uint32_t rp_dropout_threshold(double p);

/* Whether element i of the mask drawn from seed and stream is kept. */
bool rp_dropout_keep(uint64_t seed, uint32_t stream, uint64_t i, uint32_t threshold);

/* A seed as a Run gives it (an f64 scalar) as the key's 64 bits. A Run
 * refuses a seed that is not an integer in [0, 2^53) (rp_program_run_scalar);
 * anything else reads as 0 here, as in the kernels, so that no value is
 * undefined behaviour. */
uint64_t rp_dropout_seed(double value);
#define RP_DROPOUT_SEED_LIMIT 9007199254740992.0   /* 2^53: integers below it are exact in f64 */
