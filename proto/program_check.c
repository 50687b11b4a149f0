/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program.Define's check of the whole, once every composite is
 * lowered: each node's own rules (program_ops.c), then the flow of data
 * through the program, in program order.
 *
 * Program order is the only order: a node reads what the nodes before it
 * wrote (or what the caller bound), so a cycle cannot be written down at
 * all. What can be written is a read before any write, which is refused, a
 * node reading its own output among it; and a write that would clobber
 * what the same node reads, which is refused unless the op works in place
 * on the very same tensor. The check also derives each tensor's lifetime
 * (first_write, last_read, last_write) and the intermediates' bytes. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "program_build.h"

/* A node's operands as reads and writes, with the slot each came from
 * (the compute table's slot; else the position in in[] or out[]). */
struct operands {
	int read[RP_PROG_NODE_IN_MAX], read_slot[RP_PROG_NODE_IN_MAX], nread;
	int write[RP_PROG_NODE_IN_MAX], write_slot[RP_PROG_NODE_IN_MAX], nwrite;
};

static void node_operands(const struct rp_prog_node *n, struct operands *o)
{
	o->nread = o->nwrite = 0;
	if (n->op->cls == RP_PC_COMPUTE) {
		for (int s = 0; s < n->nin; s++) {
			if (n->in[s] < 0) {
				continue;
			}
			if (n->compute.spec->operands[s].role == RP_ROLE_OUT) {
				o->write_slot[o->nwrite] = s;
				o->write[o->nwrite++] = n->in[s];
			} else {
				o->read_slot[o->nread] = s;
				o->read[o->nread++] = n->in[s];
			}
		}
		return;
	}
	for (int s = 0; s < n->nin; s++) {
		if (n->in[s] >= 0) {
			o->read_slot[o->nread] = s;
			o->read[o->nread++] = n->in[s];
		}
	}
	for (int s = 0; s < n->nout; s++) {
		if (n->out[s] >= 0) {
			o->write_slot[o->nwrite] = s;
			o->write[o->nwrite++] = n->out[s];
		}
	}
}

/* The residues modulo period of t's element offsets, when they form one
 * interval [*lo, *hi] inside [0, period): dims whose stride is a multiple
 * of the period add nothing to them, the others at most their span. */
static bool residues(const struct rp_prog_tensor *t, int64_t period, int64_t *lo, int64_t *hi)
{
	int64_t span = 0;

	for (int k = 0; k < t->rank; k++)
		if (t->shape[k] > 1 && t->strides[k] % period != 0)
			span += (t->shape[k] - 1) * t->strides[k];
	*lo = t->root_offset % period;
	*hi = *lo + span;
	return *hi < period;
}

static bool residues_apart(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y, int64_t period)
{
	int64_t xlo, xhi, ylo, yhi;

	return period > 1 && residues(x, period, &xlo, &xhi) && residues(y, period, &ylo, &yhi) &&
	       (xhi < ylo || yhi < xlo);
}

bool rp_prog_disjoint(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y)
{
	int64_t xlo, xhi, ylo, yhi;

	if (x->root != y->root)
		return true;
	if (x->numel == 0 || y->numel == 0)
		return true;
	xlo = x->root_offset;
	xhi = xlo + rp_prog_span(x);
	ylo = y->root_offset;
	yhi = ylo + rp_prog_span(y);
	if (xhi < ylo || yhi < xlo)
		return true;
	/* Interleaved views (a row's two halves, q, k and v as column blocks
	 * of one qkv): their elements meet no common offset when, modulo
	 * one of their strides, each covers an interval the other misses. */
	for (int k = 0; k < x->rank; k++)
		if (residues_apart(x, y, x->strides[k]))
			return true;
	for (int k = 0; k < y->rank; k++)
		if (residues_apart(x, y, y->strides[k]))
			return true;
	return false;
}

/* Whether two tensors share memory. */
static bool overlap(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y)
{
	return !rp_prog_disjoint(x, y);
}

/* The very same tensor: same elements in the same order. */
static bool same_tensor(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y)
{
	if (x->root != y->root || x->root_offset != y->root_offset || x->rank != y->rank) {
		return false;
	}
	for (int i = 0; i < x->rank; i++) {
		if (x->shape[i] != y->shape[i] || (x->shape[i] > 1 && x->strides[i] != y->strides[i])) {
			return false;
		}
	}
	return true;
}

/* A written tensor gives every element its own address: with the
 * dimensions of size > 1 ordered by stride, each stride steps over the
 * whole extent of the ones inside it. */
static int check_own_addresses(struct rp_prog_builder *b, int n, int ti)
{
	const struct rp_prog_tensor *t = rp_prog_t(b, ti);
	int64_t stride[RP_PROG_RANK_MAX], size[RP_PROG_RANK_MAX], reach = 1;
	int k = 0;

	for (int i = 0; i < t->rank; i++) {
		if (t->shape[i] > 1) {
			stride[k] = t->strides[i];
			size[k++] = t->shape[i];
		}
	}
	for (int i = 1; i < k; i++) {
		for (int j = i; j > 0 && stride[j] < stride[j - 1]; j--) {
			int64_t s = stride[j], z = size[j];

			stride[j] = stride[j - 1];
			size[j] = size[j - 1];
			stride[j - 1] = s;
			size[j - 1] = z;
		}
	}
	for (int i = 0; i < k; i++) {
		if (stride[i] == 0) {
			return rp_prog_node_error(b, n,
						  "writes %s through a broadcast dimension (stride 0, size %" PRId64
						  "): its elements would share one address; write a tensor whose every "
						  "element has its own",
						  t->name, size[i]);
		}
		if (stride[i] < reach) {
			return rp_prog_node_error(b, n,
						  "writes %s, whose strides make elements share memory (stride %" PRId64
						  " where at least %" PRId64 " is needed)",
						  t->name, stride[i], reach);
		}
		reach = stride[i] * size[i];   /* within the span's bound: no overflow */
	}
	return 0;
}

static int check_reads(struct rp_prog_builder *b, int n, const struct operands *o, const bool *written,
		       const struct operands *self)
{
	for (int i = 0; i < o->nread; i++) {
		const struct rp_prog_tensor *t = rp_prog_t(b, o->read[i]);
		const struct rp_prog_tensor *root = rp_prog_t(b, t->root);
		bool own = false;

		if (written[t->root] || root->kind == RP_PT_INPUT || root->kind == RP_PT_INOUT ||
		    root->kind == RP_PT_SCALAR) {
			continue;
		}
		for (int w = 0; w < self->nwrite; w++) {
			own = own || rp_prog_t(b, self->write[w])->root == t->root;
		}
		if (own) {
			return rp_prog_node_error(b, n,
						  "reads %s, its own output, which no node before it wrote; a node reads "
						  "what earlier nodes wrote",
						  t->name);
		}
		return rp_prog_node_error(b, n,
					  "reads %s before any node writes it; nodes run in program order, each "
					  "reading what the nodes before it wrote (or the inputs)",
					  t->name);
	}
	return 0;
}

static int check_writes(struct rp_prog_builder *b, int n, const struct operands *o)
{
	const struct rp_prog_node *node = &b->p->nodes[n];
	int r;

	for (int w = 0; w < o->nwrite; w++) {
		const struct rp_prog_tensor *t = rp_prog_t(b, o->write[w]);
		const struct rp_prog_tensor *root = rp_prog_t(b, t->root);

		if (root->kind == RP_PT_INPUT || root->kind == RP_PT_SCALAR) {
			return rp_prog_node_error(b, n,
						  "writes %s%s%s, %s, which is read only; declare a tensor the program "
						  "updates in place as inout",
						  t->name, t != root ? ", a view of " : "", t != root ? root->name : "",
						  root->kind == RP_PT_INPUT ? "an input" : "a scalar");
		}
		if ((r = check_own_addresses(b, n, o->write[w])) < 0) {
			return r;
		}
		for (int i = 0; i < o->nread; i++) {
			const struct rp_prog_tensor *x = rp_prog_t(b, o->read[i]);

			if (!overlap(t, x) || (rp_prog_may_alias(node, o->write_slot[w], o->read_slot[i]) && same_tensor(t, x))) {
				continue;
			}
			return rp_prog_node_error(b, n,
						  "writes %s, which shares memory with its input %s; an output may not "
						  "overlap an input%s",
						  t->name, x->name,
						  rp_prog_may_alias(node, o->write_slot[w], o->read_slot[i])
							  ? " unless it is the very same tensor (same elements, same order)"
							  : "");
		}
		for (int v = 0; v < w; v++) {
			if (overlap(t, rp_prog_t(b, o->write[v]))) {
				return rp_prog_node_error(b, n, "its outputs %s and %s share memory", rp_prog_t(b, o->write[v])->name,
							  t->name);
			}
		}
	}
	return 0;
}

static void note_access(struct rp_prog_builder *b, int n, const struct operands *o, bool *written)
{
	for (int i = 0; i < o->nread; i++) {
		struct rp_prog_tensor *t = rp_prog_t(b, o->read[i]);

		t->last_read = n;
		rp_prog_t(b, t->root)->last_read = n;
	}
	for (int w = 0; w < o->nwrite; w++) {
		struct rp_prog_tensor *t = rp_prog_t(b, o->write[w]), *root = rp_prog_t(b, t->root);

		if (t->first_write < 0) {
			t->first_write = n;
		}
		if (root->first_write < 0) {
			root->first_write = n;
		}
		t->last_write = root->last_write = n;
		written[t->root] = true;
		b->p->updates_in_place = b->p->updates_in_place || root->kind == RP_PT_INOUT;
	}
}

int rp_prog_check(struct rp_prog_builder *b)
{
	struct rp_program *p = b->p;
	struct operands o;
	bool *written = calloc((size_t)p->ntensors + 1, sizeof(*written));
	int r = 0;

	if (written == NULL) {
		return -ENOMEM;
	}
	for (int n = 0; n < p->nnodes && r == 0; n++) {
		b->source = p->nodes[n].source;
		if ((r = rp_prog_check_node(b, n)) < 0) {
			break;
		}
		node_operands(&p->nodes[n], &o);
		if ((r = check_reads(b, n, &o, written, &o)) < 0 || (r = check_writes(b, n, &o)) < 0) {
			break;
		}
		note_access(b, n, &o, written);
	}
	for (int t = 0; t < p->ntensors && r == 0; t++) {
		if (p->tensors[t].kind == RP_PT_OUTPUT && !written[t]) {
			r = rp_prog_tensor_error(b, t, "is an output but no node writes it");
		}
		if (p->tensors[t].kind == RP_PT_INTERMEDIATE) {
			p->intermediate_bytes += p->tensors[t].extent_bytes;
		}
	}
	free(written);
	return r;
}
