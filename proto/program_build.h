/* SPDX-License-Identifier: Apache-2.0 */
/* What the parts of io.regen.Program's Define share, and no one else: the
 * program under construction, how errors name its nodes and tensors, and
 * how a composite adds the tensors and nodes it lowers into.
 *
 * program.c parses the definition; program_ops.c holds the op table and
 * each primitive's own rules; program_lower.c lowers each composite into
 * primitives; program_check.c checks the whole. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "program.h"

/* The composites, lowered by program_lower.c (rp_prog_op.fn of class
 * RP_PC_COMPOSITE). */
enum rp_composite {
	RP_CO_RMS_NORM = 0, RP_CO_RMS_NORM_BACKWARD, RP_CO_SOFTMAX, RP_CO_SOFTMAX_BACKWARD, RP_CO_LOG_SOFTMAX,
	RP_CO_LOG_SOFTMAX_BACKWARD, RP_CO_CROSS_ENTROPY, RP_CO_CROSS_ENTROPY_BACKWARD, RP_CO_ROTARY,
	RP_CO_ROTARY_BACKWARD, RP_CO_ADAMW, RP_CO_SGD, RP_CO_COUNT
};

/* A hyperparameter that is either a number fixed at Define or a rank-0
 * tensor read at each Run (a scalar the client sets per step, or one a
 * composite computed). */
struct rp_prog_hp {
	bool is_tensor;
	int tensor;
	double value;
};

/* Tensor names -> indices, open addressing; also node names. */
struct rp_prog_names {
	int *slot;        /* index + 1; 0 empty */
	unsigned mask;
};

struct rp_prog_builder {
	struct rp_program *p;
	struct rp_error *err;
	int tensors_cap, nodes_cap;
	struct rp_prog_names tensor_names, node_names;
	/* The definition's nodes: how many, and each one's name (the one
	 * given, or "<op>_<index>"), which errors name. */
	int nsources;
	char (*source_names)[RP_PROG_NAME_MAX + 1];
	/* The client's node being parsed or lowered, and the counters of the
	 * "<node>.<k>" names its lowering gives its tensors and its nodes. */
	int source;
	bool lowering;
	int generated_tensors, generated_nodes;
	/* The last AdamW's bias corrections, shared with the next one that
	 * has the same hyperparameters (one optimizer over many tensors
	 * would otherwise compute them once per tensor). */
	struct rp_prog_adamw_scalars {
		bool valid;
		struct rp_prog_hp lr, beta1, beta2, weight_decay, step;
		struct rp_prog_hp step_size, bc2_sqrt, decay;
	} adamw;
};

/* ---- Errors (each returns -EINVAL) ---- */

/* io.regen.InvalidProgram naming node n ("nodes[3] (fc1)"; a lowered node
 * by its composite, the reason saying which of its parts). */
int rp_prog_node_error(struct rp_prog_builder *b, int n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* io.regen.InvalidProgram naming the definition's node being parsed or
 * lowered (b->source). */
int rp_prog_source_error(struct rp_prog_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* io.regen.InvalidProgram naming tensor t ("tensors[2] (x)"). */
int rp_prog_tensor_error(struct rp_prog_builder *b, int t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* org.varlink.service.InvalidParameter with the parameter's path formatted
 * ("nodes[3].attrs.alpha"). */
int rp_prog_param_error(struct rp_prog_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An InvalidParameter set by a table's getter ({parameter: "eps"}) moved
 * under a path ("nodes[3].attrs" -> "nodes[3].attrs.eps"). */
int rp_prog_param_under(struct rp_prog_builder *b, const char *prefix);

/* ---- The program under construction ---- */

static inline struct rp_prog_tensor *rp_prog_t(struct rp_prog_builder *b, int t)
{
	return &b->p->tensors[t];
}

/* A tensor's index by name, or -1. */
int rp_prog_tensor_find(struct rp_prog_builder *b, const char *name);
/* Appends a tensor (name, kind, dtype, rank, shape and, for views, base,
 * offset and strides set by the caller; strides of others derived when
 * rank > 0 and strides_given is false), checks it and derives root,
 * root_offset, numel and extent. Its index, or -EINVAL / -E2BIG with the
 * error set. */
int rp_prog_tensor_add(struct rp_prog_builder *b, const struct rp_prog_tensor *t, bool strides_given);
/* Appends a node with the op and the operands set by the caller, name and
 * source filled. Its index, or -E2BIG with the error set. */
int rp_prog_node_add(struct rp_prog_builder *b, const struct rp_prog_node *n);

/* The index of a tensor's last element from its first in its memory: 0
 * for one element. */
static inline int64_t rp_prog_span(const struct rp_prog_tensor *t)
{
	int64_t span = 0;

	for (int i = 0; i < t->rank; i++) {
		span += (t->shape[i] - 1) * t->strides[i];
	}
	return span;
}

/* The check of the whole program once lowered (program_check.c): each
 * node's rules, reads after writes, placement, lifetimes, the
 * intermediates' bytes. */
int rp_prog_check(struct rp_prog_builder *b);

/* ---- What composites lower with (program_lower.c) ---- */

/* An intermediate named "<node>.<k>", contiguous. */
int rp_prog_gen_tensor(struct rp_prog_builder *b, enum rp_dtype dtype, int rank, const int64_t *shape);
/* A view named "<node>.<k>" over base: offset and strides in elements of
 * the base's memory. */
int rp_prog_gen_view(struct rp_prog_builder *b, int base, int64_t offset, int rank, const int64_t *shape,
		     const int64_t *strides);
/* A lowered node named "<node>.<k>". */
int rp_prog_gen_node(struct rp_prog_builder *b, const struct rp_prog_node *n);

/* ---- Ops (program_ops.c) ---- */

/* The op of a class and function (a composite's lowering names its
 * primitives so). */
const struct rp_prog_op *rp_prog_op_of(enum rp_prog_class cls, int fn);
/* Reads a primitive node's attrs (JSON object or NULL) into n. The path
 * names the attrs in errors ("nodes[3].attrs"). */
int rp_prog_read_attrs(struct rp_prog_builder *b, struct rp_prog_node *n, const cJSON *attrs, const char *path);
/* Node n's own rules: operand counts, dtypes, shapes, attrs' values;
 * compute nodes' descriptors filled. Placement and order are program.c's. */
int rp_prog_check_node(struct rp_prog_builder *b, int n);
/* Whether node n may write tensor `out` into the very memory of its input
 * `in` (same root, offset, shape and strides): the op is in place (and for
 * compute, the output's slot names the input's). */
bool rp_prog_may_alias(const struct rp_prog_node *n, int out_slot, int in_slot);

/* ---- Composites (program_lower.c) ---- */

/* Whether a composite's input (or output) k may be absent (null). */
bool rp_prog_optional(const struct rp_prog_op *op, bool output, int k);
/* Lowers node (its op a composite, operands resolved, attrs unread) into
 * primitives appended to the program. */
int rp_prog_lower(struct rp_prog_builder *b, const struct rp_prog_node *node, const cJSON *attrs, const char *path);

/* Shapes in reasons: "[2, 3]". */
const char *rp_prog_shape(const struct rp_prog_tensor *t, char buf[96]);
/* "input", "scalar", ...: the kind as a definition spells it. */
const char *rp_prog_kind_name(enum rp_prog_tensor_kind kind);
