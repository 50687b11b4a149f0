/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend's reference math for one node of a program
 * (proto/program.h): compute nodes through math.c, pointwise, reduction
 * and gather nodes here, every value in double whatever its storage.
 *
 * A node finds its tensors through addr[], one address per tensor of the
 * program (each tensor's first element: its root's memory plus its
 * root_offset), with the tensor's own dtype, shape and strides. program.c
 * resolves those per Run and owns the scratch; these functions only read
 * and write what addr[] points at, and a workspace it hands them. */
#pragma once

#include <stddef.h>
#include "proto/message.h"
#include "proto/program.h"

/* What the interpreter relies on beyond the checker's rules, checked once
 * when the program is made (a broadcast that would read past an input, a
 * compute operand math.c has no loader for, an arity the op does not
 * have): 0, or -EINVAL with err set to io.regen.BackendError naming the
 * node. */
int rd_host_node_validate(const struct rp_program *p, int node, struct rp_error *err);

/* Bytes of workspace the node needs besides its tensors: a compute op's
 * scratch (math.h), a reduction's per-column accumulators, the embedding
 * backward's order of indices. */
size_t rd_host_node_workspace(const struct rp_program *p, int node);

/* The tensors whose values can make the node refuse the Run (a gather's
 * index, a padded attention's sequence lengths, FP8's scales), at most
 * RD_HOST_DATA_TENSORS_MAX, into t[]; returns how many (0: the node has
 * no check below). */
#define RD_HOST_DATA_TENSORS_MAX 3
int rd_host_node_data_tensors(const struct rp_program *p, int node, int *t);

/* The tensors the node writes (a compute node's output slots, the others'
 * out[]), at most RP_PROG_NODE_IN_MAX, into t[]; returns how many. */
int rd_host_node_outputs(const struct rp_program *p, int node, int *t);

/* The checks on values in memory: every index of a gather in [0, V), the
 * sequence lengths of an attention node (math.h). 0, or -EINVAL with err
 * set to io.regen.InvalidOperand naming the tensor and the position, its
 * message ending with `outcome` (what the Run did before it stopped). */
int rd_host_node_check(const struct rp_program *p, int node, void *const *addr, const char *outcome,
		       struct rp_error *err);

/* Runs the node. 0, -ENOMEM (a GEMM's panels), -ENOSPC when the
 * workspace is smaller than rd_host_node_workspace says. A value the
 * check refused and the client changed since is not read past its
 * tensor: a gather row whose index left [0, V) is written as zeros. */
int rd_host_node_run(const struct rp_program *p, int node, void *const *addr, void *workspace,
		     size_t workspace_size);
