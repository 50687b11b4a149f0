/* SPDX-License-Identifier: Apache-2.0 */
/* Reference math for the host backend: GEMM, attention and LayerNorm in C, f32
 * accumulation whatever the storage type. Inputs are validated descriptors
 * (proto/compute.h) with their buffers resolved to host pointers. math.c
 * holds one table with an entry per operation of the op table: its work,
 * what it checks in memory, its scratch and its kernel. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include "proto/compute.h"

/* Storage conversions, round-to-nearest-even, NaN kept NaN. */
uint16_t rd_f32_to_bf16(float f);
float rd_bf16_to_f32(uint16_t h);
uint16_t rd_f32_to_f16(float f);
float rd_f16_to_f32(uint16_t h);

/* Runs one validated call (proto/compute.h). ptr[slot] is each operand's
 * base, already at its byte offset (NULL for an absent optional operand).
 * GEMM: D = epilogue(alpha op(A) op(B) + beta C + bias), GELU the tanh
 * approximation as cuBLASLt's epilogue (gelu_aux and gelu_aux_bias store
 * its f32 input, rounded to aux_out's dtype); dgelu multiplies alpha op(A)
 * op(B) + beta C by that GELU's derivative at aux. Attention: grouped-query heads,
 * both causal alignments, sequence lengths (rows past them written o 0,
 * stats -inf, gradients 0; lengths clamped into range), the stats as
 * log-sum-exp. LayerNorm: each row's statistics in f32 (pairwise sums, the
 * variance from the centred values), its backward's d_weight and d_bias
 * summed in f32 over the rows.
 * 0, -ENOSPC when the scratch is smaller than rd_host_scratch_size()
 * says, -ENOMEM for a GEMM's per-call panels, -EINVAL for an empty shape. */
int rd_host_run(const struct rp_compute *c, void *const *ptr, void *scratch, size_t scratch_size);

/* What the parser could not check because it lives in the operands'
 * memory: attention's sequence lengths (each in [0, Sq] or [0, Skv], every
 * query row left a key). Run before rd_host_run, so that a refused call
 * writes nothing. 0, or -EINVAL with err set to InvalidOperand. */
int rd_host_check(const struct rp_compute *c, void *const *ptr, struct rp_error *err);

/* Scratch one call needs, in bytes, so the caller can take it from its
 * lane's arena rather than malloc per call. */
size_t rd_host_scratch_size(const struct rp_compute *c);

/* Multiply-adds of a call, roughly (an exp counted as 8): what decides
 * whether it may run on the submitting thread, and its share of the
 * deadline's budget. 0 for what is not the compute table's (a
 * communicator's or a program's work: bounded elsewhere). */
double rd_host_macs(const struct rp_compute *c);
