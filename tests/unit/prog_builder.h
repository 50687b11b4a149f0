/* SPDX-License-Identifier: Apache-2.0 */
/* Checked programs built by hand for the planner's tests, filled as the
 * checker (proto/program*.c) leaves them: roots, offsets, element counts,
 * extents, binding indices and first writes / last reads derived by
 * pb_finish. Tensors are contiguous unless a view says otherwise; ops are
 * this file's own table entries (the names the definition uses). */
#pragma once

#include <stdint.h>
#include "proto/program.h"

#define PB_TENSORS_MAX 128
#define PB_NODES_MAX 128

struct pb {
	struct rp_program p;
	struct rp_prog_tensor tensors[PB_TENSORS_MAX];
	struct rp_prog_node nodes[PB_NODES_MAX];
};

void pb_init(struct pb *b, const char *name);

/* A tensor of `kind` (any but a view), contiguous: its index. */
int pb_tensor(struct pb *b, const char *name, enum rp_prog_tensor_kind kind, enum rp_dtype dt, int rank,
	      const int64_t *shape);
/* Shorthand for the shape argument: PB_DIMS(4, 8) is a rank and dims. */
#define PB_DIMS(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }
/* A scalar (bound, f64). */
int pb_scalar(struct pb *b, const char *name);
/* A view of `base` with its own shape, strides (elements) and offset. */
int pb_view(struct pb *b, const char *name, int base, int64_t offset, int rank, const int64_t *shape,
	    const int64_t *strides);

/* Pointwise: out = fn(inputs...), -1 ends the inputs. */
int pb_pw(struct pb *b, enum rp_pointwise fn, int out, ...);
/* Pointwise with the node's constant: x OP c (c OP x with scalar_first). */
int pb_pw_const(struct pb *b, enum rp_pointwise fn, int out, int x, double c, bool scalar_first);
int pb_where_const(struct pb *b, int out, int cond, int x, double c, bool scalar_first);
int pb_fill(struct pb *b, int out, double c);
int pb_iota(struct pb *b, int out, int axis);
/* A mask drawn from a scalar seed (pb_scalar). */
int pb_dropout_mask(struct pb *b, int out, int seed, double p, uint32_t stream);
int pb_reduce(struct pb *b, enum rp_reduction fn, enum rp_reduce_axis axis, int out, int in);
int pb_embedding(struct pb *b, int out, int table, int index);
int pb_embedding_backward(struct pb *b, int d_table, int d_out, int index);
/* D = A B (row-major, no epilogue): a compute node. */
int pb_gemm(struct pb *b, int d, int a, int bm);
/* Names the last node. */
void pb_name(struct pb *b, const char *name);

/* Derives what the checker derives. The program is b->p. */
void pb_finish(struct pb *b);

/* The op table entry of a pointwise function (its definition name). */
const struct rp_prog_op *pb_pw_op(enum rp_pointwise fn);
