/* SPDX-License-Identifier: Apache-2.0 */
/* What the operations' own checks (compute_gemm.c, compute_attention.c,
 * compute_layernorm.c) share with the table machinery (compute.c): shapes in reasons. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include "operand.h"

/* "[64, 32]": shapes in reasons read like the client's own code. */
struct rp_shape_text {
	char s[96];
};

struct rp_shape_text rp_shape_fmt(int rank, const int64_t *dims);

static inline struct rp_shape_text rp_operand_shape_text(const struct rp_operand *op)
{
	return rp_shape_fmt(op->rank, op->shape);
}

bool rp_operand_shape_is(const struct rp_operand *op, int rank, const int64_t *dims);
