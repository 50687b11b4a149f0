/* SPDX-License-Identifier: Apache-2.0 */
/* Between plan.c and codegen.c: the CUDA C writer of one step, and the
 * view relations both need (an access that may use a value in registers,
 * one that may not). Not for the executor: plan.h is its interface. */
#pragma once

#include <stdbool.h>
#include "daemon/program/plan.h"

/* Writes step s's source, kernels and scratch size into plan->steps[s]
 * (its scratch_offset is the arena layout's, set afterwards). The plan's
 * grouping and node_stored must be final. 0, or -ENOMEM or -EINVAL with err
 * set. */
int rd_prog_codegen_step(const struct rp_program *p, struct rd_prog_plan *plan, int s, struct rp_error *err);

/* Tensors a and b are the same elements of the same root in the same
 * order: one thread that wrote a at an index may read b there from its
 * registers. */
bool rd_prog_same_view(const struct rp_program *p, int a, int b);
/* Tensor w, a row value of a last-axis reduction over domain d (its
 * result, or its epilogue's output over rows, written at each row), and
 * tensor t, read by a node of that step broadcast against d, are the same
 * element for every row: one thread that holds w's value for a row may
 * use it where t is read. */
bool rd_prog_same_row(const struct rp_program *p, const struct rp_prog_tensor *d, int w, int t);
/* Writers of one recomputed root (plan.h) the code generator takes: the
 * plan recomputes no root of more. */
#define RD_PROG_RECOMPUTE_WRITERS_MAX 8
/* Whether view t is a box of frame f of its root (plan.h): of the
 * frame's rank and the root's dtype, each dim of more than one element
 * stepped as the frame steps it, its first element at the frame's
 * coordinates start[]. */
bool rd_prog_box_in(const struct rp_program *p, const struct rd_prog_frame *f, int t, int64_t *start);
/* Whether box x of frame f is all of it. */
bool rd_prog_covers_frame(const struct rp_prog_tensor *x, const struct rd_prog_frame *f);
/* Tensors a and b share no element (conservatively: their element ranges
 * in the root do not meet). */
bool rd_prog_disjoint(const struct rp_program *p, int a, int b);
/* Same rank and dims. */
bool rd_prog_same_shape(const struct rp_prog_tensor *a, const struct rp_prog_tensor *b);
/* Arena bytes step s's kernels need for themselves (before the layout
 * places them): a leading reduction's partial sums, an embedding
 * backward's sort keys, else 0. */
uint64_t rd_prog_codegen_scratch_bytes(const struct rp_program *p, const struct rd_prog_plan *plan, int s);
