/* SPDX-License-Identifier: Apache-2.0 */
/* Hand-built checked programs: see prog_builder.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "proto/compute.h"
#include "tests/unit/prog_builder.h"

#define PW(e, nm, lo, hi) [e] = { nm, RP_PC_POINTWISE, e, lo, hi, 1, true }
static const struct rp_prog_op pw_ops[RP_PW_COUNT] = {
	PW(RP_PW_ADD, "add", 1, 2),
	PW(RP_PW_SUB, "sub", 1, 2),
	PW(RP_PW_MUL, "mul", 1, 2),
	PW(RP_PW_DIV, "div", 1, 2),
	PW(RP_PW_POW, "pow", 1, 2),
	PW(RP_PW_MAXIMUM, "maximum", 1, 2),
	PW(RP_PW_MINIMUM, "minimum", 1, 2),
	PW(RP_PW_EQ, "eq", 1, 2),
	PW(RP_PW_NE, "ne", 1, 2),
	PW(RP_PW_LT, "lt", 1, 2),
	PW(RP_PW_LE, "le", 1, 2),
	PW(RP_PW_GT, "gt", 1, 2),
	PW(RP_PW_GE, "ge", 1, 2),
	PW(RP_PW_NEG, "neg", 1, 1),
	PW(RP_PW_EXP, "exp", 1, 1),
	PW(RP_PW_LOG, "log", 1, 1),
	PW(RP_PW_TANH, "tanh", 1, 1),
	PW(RP_PW_ERF, "erf", 1, 1),
	PW(RP_PW_SIGMOID, "sigmoid", 1, 1),
	PW(RP_PW_SILU, "silu", 1, 1),
	PW(RP_PW_GELU, "gelu", 1, 1),
	PW(RP_PW_GELU_TANH, "gelu_tanh", 1, 1),
	PW(RP_PW_RELU, "relu", 1, 1),
	PW(RP_PW_SQRT, "sqrt", 1, 1),
	PW(RP_PW_RSQRT, "rsqrt", 1, 1),
	PW(RP_PW_ABS, "abs", 1, 1),
	PW(RP_PW_RECIPROCAL, "reciprocal", 1, 1),
	PW(RP_PW_SQUARE, "square", 1, 1),
	PW(RP_PW_CAST, "cast", 1, 1),
	PW(RP_PW_GELU_BACKWARD, "gelu_backward", 2, 2),
	PW(RP_PW_GELU_TANH_BACKWARD, "gelu_tanh_backward", 2, 2),
	PW(RP_PW_SILU_BACKWARD, "silu_backward", 2, 2),
	PW(RP_PW_SIGMOID_BACKWARD, "sigmoid_backward", 2, 2),
	PW(RP_PW_TANH_BACKWARD, "tanh_backward", 2, 2),
	PW(RP_PW_RELU_BACKWARD, "relu_backward", 2, 2),
	PW(RP_PW_WHERE, "where", 2, 3),
	PW(RP_PW_FILL, "fill", 0, 0),
	PW(RP_PW_IOTA, "iota", 0, 0),
	PW(RP_PW_DROPOUT_MASK, "dropout_mask", 1, 1),
};
#undef PW

static const struct rp_prog_op red_ops[RP_RED_COUNT] = {
	[RP_RED_SUM] = { "sum", RP_PC_REDUCTION, RP_RED_SUM, 1, 1, 1, false },
	[RP_RED_MEAN] = { "mean", RP_PC_REDUCTION, RP_RED_MEAN, 1, 1, 1, false },
	[RP_RED_MAX] = { "max", RP_PC_REDUCTION, RP_RED_MAX, 1, 1, 1, false },
	[RP_RED_MIN] = { "min", RP_PC_REDUCTION, RP_RED_MIN, 1, 1, 1, false },
	[RP_RED_AMAX] = { "amax", RP_PC_REDUCTION, RP_RED_AMAX, 1, 1, 1, false },
	[RP_RED_LOGSUMEXP] = { "logsumexp", RP_PC_REDUCTION, RP_RED_LOGSUMEXP, 1, 1, 1, false },
};
static const struct rp_prog_op op_embedding = { "embedding", RP_PC_GATHER, RP_GATHER_EMBEDDING, 2, 2, 1, false };
static const struct rp_prog_op op_embedding_backward = { "embedding_backward", RP_PC_GATHER,
							 RP_GATHER_EMBEDDING_BACKWARD, 2, 2, 1, false };
static const struct rp_prog_op op_gemm = { "gemm", RP_PC_COMPUTE, RP_OP_GEMM, 2, 7, 0, false };

const struct rp_prog_op *pb_pw_op(enum rp_pointwise fn)
{
	return &pw_ops[fn];
}

void pb_init(struct pb *b, const char *name)
{
	memset(b, 0, sizeof(*b));
	snprintf(b->p.name, sizeof(b->p.name), "%s", name);
	b->p.tensors = b->tensors;
	b->p.nodes = b->nodes;
}

static void contiguous_strides(struct rp_prog_tensor *t)
{
	int64_t s = 1;

	for (int k = t->rank - 1; k >= 0; k--) {
		t->strides[k] = s;
		s *= t->shape[k];
	}
}

int pb_tensor(struct pb *b, const char *name, enum rp_prog_tensor_kind kind, enum rp_dtype dt, int rank,
	      const int64_t *shape)
{
	int i = b->p.ntensors++;
	struct rp_prog_tensor *t = &b->tensors[i];

	snprintf(t->name, sizeof(t->name), "%s", name);
	t->kind = kind;
	t->dtype = dt;
	t->rank = rank;
	for (int k = 0; k < rank; k++)
		t->shape[k] = shape[k];
	contiguous_strides(t);
	t->base = -1;
	return i;
}

int pb_scalar(struct pb *b, const char *name)
{
	return pb_tensor(b, name, RP_PT_SCALAR, RP_DTYPE_F64, 0, NULL);
}

int pb_view(struct pb *b, const char *name, int base, int64_t offset, int rank, const int64_t *shape,
	    const int64_t *strides)
{
	int i = b->p.ntensors++;
	struct rp_prog_tensor *t = &b->tensors[i];

	snprintf(t->name, sizeof(t->name), "%s", name);
	t->kind = RP_PT_VIEW;
	t->dtype = b->tensors[base].dtype;
	t->rank = rank;
	memcpy(t->shape, shape, (size_t)rank * sizeof(*shape));
	memcpy(t->strides, strides, (size_t)rank * sizeof(*strides));
	t->base = base;
	t->offset = offset;
	return i;
}

static struct rp_prog_node *new_node(struct pb *b, const struct rp_prog_op *op, int out)
{
	int i = b->p.nnodes++;
	struct rp_prog_node *n = &b->nodes[i];

	n->op = op;
	snprintf(n->name, sizeof(n->name), "%s%d", op->name, i);
	n->out[0] = out;
	n->nout = 1;
	for (int k = 0; k < RP_PROG_NODE_IN_MAX; k++)
		n->in[k] = -1;
	return n;
}

int pb_pw(struct pb *b, enum rp_pointwise fn, int out, ...)
{
	struct rp_prog_node *n = new_node(b, &pw_ops[fn], out);
	va_list ap;
	int t;

	n->pw.fn = fn;
	va_start(ap, out);
	while ((t = va_arg(ap, int)) >= 0)
		n->in[n->nin++] = t;
	va_end(ap);
	return b->p.nnodes - 1;
}

int pb_pw_const(struct pb *b, enum rp_pointwise fn, int out, int x, double c, bool scalar_first)
{
	int i = pb_pw(b, fn, out, x, -1);

	b->nodes[i].pw.has_scalar = true;
	b->nodes[i].pw.scalar = c;
	b->nodes[i].pw.scalar_first = scalar_first;
	return i;
}

int pb_where_const(struct pb *b, int out, int cond, int x, double c, bool scalar_first)
{
	int i = pb_pw(b, RP_PW_WHERE, out, cond, x, -1);

	b->nodes[i].pw.has_scalar = true;
	b->nodes[i].pw.scalar = c;
	b->nodes[i].pw.scalar_first = scalar_first;
	return i;
}

int pb_fill(struct pb *b, int out, double c)
{
	int i = pb_pw(b, RP_PW_FILL, out, -1);

	b->nodes[i].pw.has_scalar = true;
	b->nodes[i].pw.scalar = c;
	return i;
}

int pb_iota(struct pb *b, int out, int axis)
{
	int i = pb_pw(b, RP_PW_IOTA, out, -1);

	b->nodes[i].pw.axis = axis;
	return i;
}

int pb_dropout_mask(struct pb *b, int out, int seed, double p, uint32_t stream)
{
	int i = pb_pw(b, RP_PW_DROPOUT_MASK, out, seed, -1);

	b->nodes[i].pw.p = p;
	b->nodes[i].pw.stream = stream;
	b->tensors[seed].seed = true;
	return i;
}

int pb_reduce(struct pb *b, enum rp_reduction fn, enum rp_reduce_axis axis, int out, int in)
{
	struct rp_prog_node *n = new_node(b, &red_ops[fn], out);

	n->red.fn = fn;
	n->red.axis = axis;
	n->in[n->nin++] = in;
	return b->p.nnodes - 1;
}

int pb_embedding(struct pb *b, int out, int table, int index)
{
	struct rp_prog_node *n = new_node(b, &op_embedding, out);

	n->gather.fn = RP_GATHER_EMBEDDING;
	n->in[n->nin++] = table;
	n->in[n->nin++] = index;
	return b->p.nnodes - 1;
}

int pb_embedding_backward(struct pb *b, int d_table, int d_out, int index)
{
	struct rp_prog_node *n = new_node(b, &op_embedding_backward, d_table);

	n->gather.fn = RP_GATHER_EMBEDDING_BACKWARD;
	n->in[n->nin++] = d_out;
	n->in[n->nin++] = index;
	return b->p.nnodes - 1;
}

int pb_gemm(struct pb *b, int d, int a, int bm)
{
	struct rp_prog_node *n = new_node(b, &op_gemm, -1);

	/* Compute nodes list every slot in in[], outputs too. */
	n->nout = 0;
	n->out[0] = -1;
	n->nin = RP_GEMM_OPERANDS;
	n->in[RP_GEMM_A] = a;
	n->in[RP_GEMM_B] = bm;
	n->in[RP_GEMM_D] = d;
	n->compute.spec = &rp_op_gemm;
	n->compute.gemm.alpha = 1;
	n->compute.gemm.m = b->tensors[a].shape[0];
	n->compute.gemm.k = b->tensors[a].shape[1];
	n->compute.gemm.n = b->tensors[bm].shape[1];
	return b->p.nnodes - 1;
}

void pb_name(struct pb *b, const char *name)
{
	snprintf(b->nodes[b->p.nnodes - 1].name, sizeof(b->nodes[0].name), "%s", name);
}

static bool slot_is_output(const struct rp_prog_node *n, int i)
{
	return n->op->cls == RP_PC_COMPUTE && n->compute.spec && i < (int)n->compute.spec->noperands &&
	       n->compute.spec->operands[i].role == RP_ROLE_OUT;
}

void pb_finish(struct pb *b)
{
	struct rp_program *p = &b->p;

	for (int i = 0; i < p->ntensors; i++) {
		struct rp_prog_tensor *t = &b->tensors[i];
		t->numel = 1;
		for (int k = 0; k < t->rank; k++)
			t->numel *= t->shape[k];
		t->root = i;
		t->root_offset = 0;
		for (int v = i; b->tensors[v].kind == RP_PT_VIEW; v = b->tensors[v].base) {
			t->root_offset += b->tensors[v].offset;
			t->root = b->tensors[v].base;
		}
		int64_t last = t->root_offset;
		for (int k = 0; k < t->rank; k++)
			last += (t->shape[k] - 1) * t->strides[k];
		t->extent_bytes = t->numel ? (uint64_t)(last + 1) * rp_dtype_size(t->dtype) : 0;
		t->bind_index = -1;
		t->first_write = t->last_read = -1;
		if (t->kind <= RP_PT_SCALAR) {
			t->bind_index = p->nbound;
			p->bind[p->nbound++] = i;
		}
		if (t->kind == RP_PT_INTERMEDIATE)
			p->intermediate_bytes += t->extent_bytes;
	}
	rp_program_index_bound(p);
	for (int i = 0; i < p->nnodes; i++) {
		const struct rp_prog_node *n = &b->nodes[i];
		for (int k = 0; k < n->nin; k++) {
			int t = n->in[k];
			if (t < 0)
				continue;
			if (slot_is_output(n, k)) {
				if (b->tensors[t].first_write < 0)
					b->tensors[t].first_write = i;
			} else {
				b->tensors[t].last_read = i;
			}
		}
		for (int k = 0; k < n->nout; k++) {
			int t = n->out[k];
			if (t >= 0 && b->tensors[t].first_write < 0)
				b->tensors[t].first_write = i;
			if (t >= 0 && b->tensors[b->tensors[t].root].kind == RP_PT_INOUT)
				p->updates_in_place = true;
		}
	}
}
