/* SPDX-License-Identifier: Apache-2.0 */
/* The plan of a program: its nodes grouped into steps, what each step keeps
 * in registers, and the arena every materialized intermediate lives in.
 * plan.h says what a step is; codegen.c writes each step's kernels. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/program/codegen.h"
#include "daemon/program/plan.h"
#include "proto/errors.h"

/* One tensor a node touches in memory; `row`: at a row of a last-axis
 * reduction's domain (its result, and the nodes of its epilogue over
 * rows), not at one of the domain's elements. */
struct access {
	int tensor;
	bool write;
	bool row;
	/* A read at other elements than the node's own: a source of a
	 * recomputed root the node reads (plan.h). */
	bool shifted;
};
#define NODE_ACCESSES_MAX (RP_PROG_NODE_IN_MAX * RD_PROG_SOURCES_MAX + RP_PROG_NODE_OUT_MAX)

/* A step being grown: its nodes in the order they will run, and every
 * tensor they touch. A closed group (a leading reduction's, a library
 * call's, a gather's) takes no more nodes; a last-axis reduction's takes
 * its epilogue (epilogue_joins). */
struct group {
	enum rd_prog_step_kind kind;
	bool closed;
	const struct rp_prog_tensor *domain;   /* a FUSED group's output shape, a REDUCTION's input shape */
	int red;                               /* a REDUCTION's reduction node, else -1 */
	bool second_pass;                      /* the epilogue has nodes over the domain */
	int *nodes;
	int nnodes, nodes_cap;
	struct access *acc;
	int nacc, cap;
};

/* Groups still open to new nodes wait in a window of this many, in the
 * order they will run; past it the oldest is emitted. */
#define WINDOW_MAX 16

const char *rd_prog_step_kind_name(enum rd_prog_step_kind kind)
{
	switch (kind) {
	case RD_STEP_LIBRARY:
		return "library";
	case RD_STEP_FUSED:
		return "fused";
	case RD_STEP_REDUCTION:
		return "reduction";
	case RD_STEP_GATHER:
		return "gather";
	}
	return "?";
}

bool rd_prog_same_shape(const struct rp_prog_tensor *a, const struct rp_prog_tensor *b)
{
	if (a->rank != b->rank)
		return false;
	for (int k = 0; k < a->rank; k++)
		if (a->shape[k] != b->shape[k])
			return false;
	return true;
}

bool rd_prog_covers_frame(const struct rp_prog_tensor *x, const struct rd_prog_frame *f)
{
	if (x->rank != f->rank)
		return false;
	for (int k = 0; k < f->rank; k++)
		if (x->shape[k] != f->shape[k])
			return false;
	return true;
}

bool rd_prog_same_view(const struct rp_program *p, int a, int b)
{
	const struct rp_prog_tensor *x = &p->tensors[a], *y = &p->tensors[b];

	if (a == b)
		return true;
	if (x->root != y->root || x->root_offset != y->root_offset || x->dtype != y->dtype || !rd_prog_same_shape(x, y))
		return false;
	/* A dimension of one element is never stepped along: its stride
	 * says nothing. */
	for (int k = 0; k < x->rank; k++)
		if (x->shape[k] > 1 && x->strides[k] != y->strides[k])
			return false;
	return true;
}

/* The element offset (in its root) of tensor t at each row of domain d
 * (ranks up to RP_PROG_RANK_MAX): coef[k] per row coordinate k < d's last
 * dim. `written`: t as a last-axis reduction writes its result, its dims
 * the row's from the left (the result's shape is d's without its last dim,
 * or with it as 1); else t as a node reads it, broadcast against d from
 * the right. False where t as read varies along d's last dim. */
static bool row_coefs(const struct rp_prog_tensor *d, const struct rp_prog_tensor *t, bool written, int64_t *coef)
{
	int lead = written ? 0 : d->rank - t->rank;

	if (t->rank > d->rank || (!written && t->rank >= 1 && t->shape[t->rank - 1] > 1 && t->strides[t->rank - 1] != 0))
		return false;
	for (int k = 0; k < d->rank - 1; k++) {
		int i = k - lead;
		coef[k] = d->shape[k] > 1 && i >= 0 && i < t->rank && t->shape[i] > 1 ? t->strides[i] : 0;
	}
	return true;
}

bool rd_prog_same_row(const struct rp_program *p, const struct rp_prog_tensor *d, int w, int t)
{
	const struct rp_prog_tensor *x = &p->tensors[w], *y = &p->tensors[t];
	int64_t cw[RP_PROG_RANK_MAX], ct[RP_PROG_RANK_MAX];

	if (x->root != y->root || x->root_offset != y->root_offset || x->dtype != y->dtype)
		return false;
	if (!row_coefs(d, x, true, cw) || !row_coefs(d, y, false, ct))
		return false;
	for (int k = 0; k < d->rank - 1; k++)
		if (cw[k] != ct[k])
			return false;
	return true;
}

/* The first and last element of t in its root. Strides are never negative
 * (proto/program.h). */
static void element_range(const struct rp_prog_tensor *t, int64_t *lo, int64_t *hi)
{
	*lo = *hi = t->root_offset;
	for (int k = 0; k < t->rank; k++)
		*hi += (t->shape[k] - 1) * t->strides[k];
}

bool rd_prog_disjoint(const struct rp_program *p, int a, int b)
{
	return rp_prog_disjoint(&p->tensors[a], &p->tensors[b]);
}

/* Bytes from the root's start past t's last element. */
static uint64_t view_extent_bytes(const struct rp_prog_tensor *t)
{
	int64_t lo, hi;

	if (t->numel == 0)
		return 0;
	element_range(t, &lo, &hi);
	return (uint64_t)(hi + 1) * rp_dtype_size(t->dtype);
}

static bool is_scalar(const struct rp_program *p, int t)
{
	return p->tensors[t].kind == RP_PT_SCALAR;
}

/* What node n reads and writes in memory: not scalars (values in rg_args)
 * nor tensors computed where they are read (plan.h's computed_inline),
 * but for a recomputed one the memory it is computed from (its sources,
 * read at other elements). */
static int node_accesses(const struct rp_program *p, const struct rd_prog_plan *plan, const struct rp_prog_node *n,
			 struct access acc[NODE_ACCESSES_MAX])
{
	const int *inl = plan->computed_inline;
	int k = 0;

	if (n->op->cls == RP_PC_COMPUTE) {
		/* Inputs and outputs in one list, by the compute table's slots. */
		const struct rp_op_spec *spec = n->compute.spec;
		for (int i = 0; i < n->nin && i < RP_PROG_NODE_IN_MAX; i++) {
			if (n->in[i] < 0 || is_scalar(p, n->in[i]))
				continue;
			bool out = spec && i < (int)spec->noperands && spec->operands[i].role == RP_ROLE_OUT;
			acc[k++] = (struct access){ n->in[i], out, false, false };
		}
	} else {
		for (int i = 0; i < n->nin && i < RP_PROG_NODE_IN_MAX; i++) {
			int t = n->in[i];
			if (t < 0 || is_scalar(p, t) || inl[t] >= 0)
				continue;
			if (!plan->recomputed[t]) {
				acc[k++] = (struct access){ t, false, false, false };
				continue;
			}
			int root = p->tensors[t].root;
			for (int j = 0; j < plan->nsources[root]; j++)
				acc[k++] = (struct access){ plan->sources[root][j], false, false, true };
		}
	}
	for (int i = 0; i < n->nout && i < RP_PROG_NODE_OUT_MAX; i++)
		if (n->out[i] >= 0 && inl[n->out[i]] < 0 && !plan->recomputed[n->out[i]])
			acc[k++] = (struct access){ n->out[i], true, false, false };
	return k;
}

/* Iotas, fills and dropout masks whose output only pointwise nodes read,
 * each as that very tensor (a fill through any view of it: its value is
 * the same everywhere): those readers compute the value where they need
 * it (an index, a constant, a draw from the Run's seed), so it never
 * takes memory nor a kernel of its own. */
static void find_inline(const struct rp_program *p, int *inl)
{
	for (int t = 0; t < p->ntensors; t++)
		inl[t] = -1;
	for (int i = 0; i < p->nnodes; i++) {
		const struct rp_prog_node *n = &p->nodes[i];
		if (n->op->cls != RP_PC_POINTWISE ||
		    (n->pw.fn != RP_PW_IOTA && n->pw.fn != RP_PW_FILL && n->pw.fn != RP_PW_DROPOUT_MASK))
			continue;
		int o = n->out[0];
		if (p->tensors[o].kind != RP_PT_INTERMEDIATE)
			continue;
		bool only_pointwise = true;
		for (int j = 0; j < p->nnodes && only_pointwise; j++) {
			const struct rp_prog_node *m = &p->nodes[j];
			for (int k = 0; k < m->nin && only_pointwise; k++) {
				int t = m->in[k];
				if (t >= 0 && p->tensors[t].root == o)
					only_pointwise = m->op->cls == RP_PC_POINTWISE &&
							 (n->pw.fn == RP_PW_FILL || rd_prog_same_view(p, t, o));
			}
			for (int k = 0; k < m->nout && only_pointwise; k++)
				if (j != i && m->out[k] >= 0 && p->tensors[m->out[k]].root == o)
					only_pointwise = false;
		}
		if (!only_pointwise)
			continue;
		for (int t = 0; t < p->ntensors; t++)
			if (p->tensors[t].root == o)
				inl[t] = i;
	}
}

/* ---- recomputed roots (plan.h) ---------------------------------------------------- */

/* The frame of root r that view t steps through (plan.h): t's dims, each
 * of more than one element at a stride of its own, the innermost at 1,
 * each one's length the next outer one's stride over its own (the
 * outermost's the root's elements over its stride). False where t does
 * not step so through the whole root. */
static bool frame_of_view(const struct rp_program *p, int t, struct rd_prog_frame *f)
{
	const struct rp_prog_tensor *x = &p->tensors[t], *r = &p->tensors[x->root];
	int64_t inner = r->numel;   /* the stride of the dim outside the one being placed */
	bool placed[RP_PROG_RANK_MAX] = { false };

	if (x->dtype != r->dtype || r->numel == 0)
		return false;
	f->rank = x->rank;
	for (int k = 0; k < x->rank; k++) {
		f->shape[k] = 1;
		f->strides[k] = 0;
		placed[k] = x->shape[k] == 1;
	}
	/* From the outermost dim in: the largest stride not yet placed. */
	for (;;) {
		int k = -1;
		for (int j = 0; j < x->rank; j++)
			if (!placed[j] && (k < 0 || x->strides[j] > x->strides[k]))
				k = j;
		if (k < 0)
			break;
		if (x->strides[k] <= 0 || inner % x->strides[k] != 0 || inner == x->strides[k])
			return false;
		f->shape[k] = inner / x->strides[k];
		f->strides[k] = x->strides[k];
		inner = x->strides[k];
		placed[k] = true;
	}
	return inner == 1;
}

bool rd_prog_box_in(const struct rp_program *p, const struct rd_prog_frame *f, int t, int64_t *start)
{
	const struct rp_prog_tensor *x = &p->tensors[t], *r = &p->tensors[x->root];
	int64_t at = 0;

	if (x->rank != f->rank || x->dtype != r->dtype)
		return false;
	for (int k = 0; k < f->rank; k++) {
		if (x->shape[k] > 1 && (f->shape[k] == 1 || x->strides[k] != f->strides[k]))
			return false;
		/* The frame is dense: its coordinates are the offset's digits. */
		start[k] = f->shape[k] > 1 ? x->root_offset / f->strides[k] % f->shape[k] : 0;
		if (start[k] + x->shape[k] > f->shape[k])
			return false;
		at += start[k] * f->strides[k];
	}
	return at == x->root_offset;
}

/* Whether the boxes (of frame f of root r: rd_prog_box_in) of the writers
 * w[0, n) hold every element of r: one of them all of it, or all of them
 * whole but along one dim, whose length they cover together. */
static bool boxes_cover(const struct rp_program *p, const struct rd_prog_frame *f, const int *w, int n)
{
	int64_t start[RP_PROG_RANK_MAX];
	int along = -1;

	for (int i = 0; i < n; i++)
		if (rd_prog_covers_frame(&p->tensors[p->nodes[w[i]].out[0]], f))
			return true;
	for (int i = 0; i < n; i++) {
		const struct rp_prog_tensor *x = &p->tensors[p->nodes[w[i]].out[0]];
		int partial = -1, count = 0;
		for (int k = 0; k < f->rank; k++)
			if (x->shape[k] != f->shape[k]) {
				partial = k;
				count++;
			}
		if (count > 1 || (along >= 0 && along != partial))
			return false;
		along = partial;
	}
	if (along < 0)
		return false;
	/* The writers' intervals along that dim, swept from 0. */
	for (int64_t at = 0, moved = 1; moved;) {
		if (at >= f->shape[along])
			return true;
		moved = 0;
		for (int i = 0; i < n; i++) {
			const struct rp_prog_tensor *x = &p->tensors[p->nodes[w[i]].out[0]];
			rd_prog_box_in(p, f, p->nodes[w[i]].out[0], start);
			if (start[along] <= at && start[along] + x->shape[along] > at) {
				at = start[along] + x->shape[along];
				moved = 1;
			}
		}
	}
	return false;
}

/* The facts about each intermediate root that the choice of recomputed
 * roots reads: its writers and readers in program order. */
struct root_use {
	int *writers, nwriters;
	int *readers, nreaders;
	bool candidate;     /* the shapes allow it: pointwise writers and readers, boxes, cover, order */
	struct rd_prog_frame frame;   /* where the writers' boxes are, when a candidate */
	bool shifted;       /* a reader reads it at other elements than a writer wrote (or it has several writers) */
	bool rejected;      /* its sources fail (too many, or written before its last reader) */
};

/* Each root's writers and readers (a node that does both is a writer),
 * from one pass over the nodes: the lists point into *buf. */
static int list_uses(const struct rp_program *p, struct root_use *use, int **buf)
{
	int total = 0, at = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < p->nnodes; i++) {
			const struct rp_prog_node *n = &p->nodes[i];
			int roots[RP_PROG_NODE_IN_MAX + RP_PROG_NODE_OUT_MAX], nroots = 0;
			for (int k = 0; k < n->nout + n->nin; k++) {
				int t = k < n->nout ? n->out[k] : n->in[k - n->nout];
				bool seen = false;
				if (t < 0)
					continue;
				for (int j = 0; j < nroots; j++)
					seen |= roots[j] == p->tensors[t].root;
				if (seen)
					continue;
				int r = roots[nroots++] = p->tensors[t].root;
				bool writes = k < n->nout;
				for (int j = 0; j < n->nout && !writes; j++)
					writes = n->out[j] >= 0 && p->tensors[n->out[j]].root == r;
				if (pass == 0) {
					use[r].nwriters += writes;
					use[r].nreaders += !writes;
					total++;
				} else if (writes) {
					use[r].writers[use[r].nwriters++] = i;
				} else {
					use[r].readers[use[r].nreaders++] = i;
				}
			}
		}
		if (pass == 1)
			break;
		*buf = malloc((size_t)(total ? total : 1) * sizeof(**buf));
		if (!*buf)
			return -ENOMEM;
		for (int r = 0; r < p->ntensors; r++) {
			use[r].writers = *buf + at;
			at += use[r].nwriters;
			use[r].readers = *buf + at;
			at += use[r].nreaders;
			use[r].nwriters = use[r].nreaders = 0;
		}
	}
	return 0;
}

/* Whether pointwise node n reads tensor t at more than one of its
 * elements: t stretched against n's output (or its iteration domain), or
 * stepped by a stride of 0. */
static bool broadcast_read(const struct rp_program *p, const struct rp_prog_node *n, int t)
{
	const struct rp_prog_tensor *x = &p->tensors[t];

	if (n->nout < 1 || n->out[0] < 0 || x->numel != p->tensors[n->out[0]].numel)
		return true;
	for (int k = 0; k < x->rank; k++)
		if (x->shape[k] > 1 && x->strides[k] == 0)
			return true;
	return false;
}

/* Whether every writer of the root writes a box of frame f. */
static bool writers_boxed(const struct rp_program *p, const struct root_use *u, const struct rd_prog_frame *f)
{
	int64_t start[RP_PROG_RANK_MAX];

	for (int k = 0; k < u->nwriters; k++)
		if (!rd_prog_box_in(p, f, p->nodes[u->writers[k]].out[0], start))
			return false;
	return true;
}

/* Whether the root's writers and readers allow recomputing it (see
 * plan.h), and in which frame: the root's own, else the first writer's
 * that boxes every writer. */
static void judge_root(const struct rp_program *p, const int *inl, int r, struct root_use *u)
{
	u->candidate = false;
	if (u->nwriters == 0 || u->nwriters > RD_PROG_RECOMPUTE_WRITERS_MAX || u->nreaders == 0)
		return;
	for (int k = 0; k < u->nwriters; k++) {
		const struct rp_prog_node *n = &p->nodes[u->writers[k]];
		if (n->op->cls != RP_PC_POINTWISE || n->nout != 1 || n->out[0] < 0 || inl[n->out[0]] >= 0 ||
		    n->pw.fn == RP_PW_IOTA || n->pw.fn == RP_PW_DROPOUT_MASK)
			return;
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i];
			/* In place, or an iota or a mask, which the writer
			 * would draw at the reader's elements: not here. */
			if (t >= 0 && (p->tensors[t].root == r || (inl[t] >= 0 && p->nodes[inl[t]].pw.fn != RP_PW_FILL)))
				return;
		}
	}
	bool framed = frame_of_view(p, r, &u->frame) && writers_boxed(p, u, &u->frame);
	for (int k = 0; k < u->nwriters && !framed; k++)
		framed = frame_of_view(p, p->nodes[u->writers[k]].out[0], &u->frame) && writers_boxed(p, u, &u->frame);
	if (!framed)
		return;
	for (int k = 0; k < u->nreaders; k++) {
		const struct rp_prog_node *n = &p->nodes[u->readers[k]];
		/* Every read after the last write: a reader sees every
		 * writer's part. */
		if (n->op->cls != RP_PC_POINTWISE || u->readers[k] < u->writers[u->nwriters - 1])
			return;
		/* Any view of the root's dtype (the element it reads is
		 * found in the frame by its offset), each element read at
		 * one element of the reader's: a broadcast would compute it
		 * again for every element it is stretched over. */
		for (int i = 0; i < n->nin; i++) {
			const struct rp_prog_tensor *x = n->in[i] >= 0 ? &p->tensors[n->in[i]] : NULL;
			if (x && x->root == r && (x->dtype != p->tensors[r].dtype || broadcast_read(p, n, n->in[i])))
				return;
		}
	}
	if (!boxes_cover(p, &u->frame, u->writers, u->nwriters))
		return;
	u->shifted = u->nwriters > 1;
	for (int k = 0; k < u->nreaders && !u->shifted; k++) {
		const struct rp_prog_node *n = &p->nodes[u->readers[k]];
		for (int j = 0; j < n->nin; j++)
			if (n->in[j] >= 0 && p->tensors[n->in[j]].root == r &&
			    !rd_prog_same_view(p, n->in[j], p->nodes[u->writers[0]].out[0]))
				u->shifted = true;
	}
	u->candidate = true;
}

/* Whether every reader of root r writes a recomputed root. */
static bool read_by_recomputed_writers(const struct rp_program *p, const struct root_use *use, const bool *rec,
				       int r)
{
	const struct root_use *u = &use[r];

	for (int k = 0; k < u->nreaders; k++) {
		const struct rp_prog_node *n = &p->nodes[u->readers[k]];
		if (n->nout != 1 || !rec[p->tensors[n->out[0]].root])
			return false;
	}
	return true;
}

/* The first writer and last real reader (not itself a recomputed root's
 * writer) of recomputed root r, through the roots it is computed from and
 * those computed from it. */
static int first_write_of(const struct rp_program *p, const struct root_use *use, const bool *rec, int r, int depth)
{
	int lo = use[r].writers[0];

	for (int k = 0; k < use[r].nwriters && depth < 8; k++) {
		const struct rp_prog_node *n = &p->nodes[use[r].writers[k]];
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i];
			if (t >= 0 && rec[p->tensors[t].root]) {
				int l = first_write_of(p, use, rec, p->tensors[t].root, depth + 1);
				lo = l < lo ? l : lo;
			}
		}
	}
	return lo;
}

static int last_read_of(const struct rp_program *p, const struct root_use *use, const bool *rec, int r, int depth)
{
	int hi = -1;

	for (int k = 0; k < use[r].nreaders; k++) {
		const struct rp_prog_node *n = &p->nodes[use[r].readers[k]];
		int h = n->nout == 1 && rec[p->tensors[n->out[0]].root] && depth < 8
				? last_read_of(p, use, rec, p->tensors[n->out[0]].root, depth + 1)
				: use[r].readers[k];
		hi = h > hi ? h : hi;
	}
	return hi;
}

/* Root r's sources (its writers' inputs in memory, through the recomputed
 * roots they read) into src[], and the writers its element may take
 * (every writer of every root on the way) into *cost. False past
 * RD_PROG_SOURCES_MAX sources. */
static bool gather_sources(const struct rp_program *p, const int *inl, const struct root_use *use, const bool *rec,
			   int r, int *src, int *nsrc, int *cost, int depth)
{
	if (depth > 8)
		return false;
	for (int k = 0; k < use[r].nwriters; k++) {
		const struct rp_prog_node *n = &p->nodes[use[r].writers[k]];
		(*cost)++;
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i];
			bool seen = false;
			if (t < 0 || is_scalar(p, t) || inl[t] >= 0)
				continue;
			if (rec[p->tensors[t].root]) {
				if (!gather_sources(p, inl, use, rec, p->tensors[t].root, src, nsrc, cost, depth + 1))
					return false;
				continue;
			}
			for (int j = 0; j < *nsrc; j++)
				seen |= src[j] == t;
			if (seen)
				continue;
			if (*nsrc == RD_PROG_SOURCES_MAX)
				return false;
			src[(*nsrc)++] = t;
		}
	}
	return true;
}

/* Writer expressions a reader of a recomputed root may compute at one
 * element, through the roots it reads in turn. */
#define RECOMPUTE_COST_MAX 12

/* Chooses the recomputed roots (plan.h): the candidates that are worth
 * it (read at other elements, several writers, or read only by writers of
 * recomputed roots) whose sources fit and stay as they are until their
 * last reader; a root given up gives up those only it made worth it. */
static int find_recomputed(const struct rp_program *p, struct rd_prog_plan *plan)
{
	const int *inl = plan->computed_inline;
	struct root_use *use = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof(*use));
	bool *rec = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof(*rec));
	struct access acc[NODE_ACCESSES_MAX];
	int *buf = NULL, r = -ENOMEM;

	if (!use || !rec || list_uses(p, use, &buf) < 0)
		goto out;
	for (int t = 0; t < p->ntensors; t++)
		if (p->tensors[t].root == t && p->tensors[t].kind == RP_PT_INTERMEDIATE && inl[t] < 0)
			judge_root(p, inl, t, &use[t]);
	for (bool settled = false; !settled;) {
		for (int t = 0; t < p->ntensors; t++)
			rec[t] = use[t].candidate && !use[t].rejected && use[t].shifted;
		for (bool grew = true; grew;) {
			grew = false;
			for (int t = 0; t < p->ntensors; t++)
				if (!rec[t] && use[t].candidate && !use[t].rejected &&
				    read_by_recomputed_writers(p, use, rec, t)) {
					rec[t] = true;
					grew = true;
				}
		}
		settled = true;
		for (int t = 0; t < p->ntensors; t++) {
			int nsrc = 0, cost = 0;
			if (!rec[t])
				continue;
			if (!gather_sources(p, inl, use, rec, t, plan->sources[t], &nsrc, &cost, 0) ||
			    cost > RECOMPUTE_COST_MAX) {
				use[t].rejected = true;
				settled = false;
				continue;
			}
			plan->nsources[t] = nsrc;
			/* Nothing between the first write and the last read
			 * writes what the element is computed from. */
			int lo = first_write_of(p, use, rec, t, 0), hi = last_read_of(p, use, rec, t, 0);
			for (int i = lo + 1; i < hi && !use[t].rejected; i++) {
				const struct rp_prog_node *n = &p->nodes[i];
				if (n->op->cls == RP_PC_POINTWISE && n->nout == 1 && rec[p->tensors[n->out[0]].root])
					continue;
				for (int k = 0; k < n->nout; k++)
					for (int j = 0; j < nsrc && n->out[k] >= 0; j++)
						if (!rp_prog_disjoint(&p->tensors[n->out[k]], &p->tensors[plan->sources[t][j]]))
							use[t].rejected = true;
				if (n->op->cls == RP_PC_COMPUTE) {
					/* A compute node's outputs are among its in[]. */
					int na = node_accesses(p, plan, n, acc);
					for (int a = 0; a < na; a++)
						for (int j = 0; j < nsrc && acc[a].write; j++)
							if (!rp_prog_disjoint(&p->tensors[acc[a].tensor],
									      &p->tensors[plan->sources[t][j]]))
								use[t].rejected = true;
				}
			}
			settled &= !use[t].rejected;
		}
	}
	for (int t = 0; t < p->ntensors; t++) {
		plan->recomputed[t] = rec[p->tensors[t].root];
		if (rec[t])
			plan->frame[t] = use[t].frame;
	}
	r = 0;
out:
	free(use);
	free(buf);
	free(rec);
	return r;
}

/* Where a node of a group runs: at each element of the group's domain
 * (a pointwise node, a reduction's prologue or epilogue over the domain),
 * as the reduction (its input at the elements, its result at the rows), or
 * once a row of a last-axis reduction's domain (its epilogue over the
 * reduced shape). */
enum role { AT_ELEMENT = 0, AT_REDUCTION, AT_ROW };

static int group_add(struct group *g, const struct rp_program *p, const struct rd_prog_plan *plan, int node,
		     enum role role)
{
	struct access acc[NODE_ACCESSES_MAX];
	int n = node_accesses(p, plan, &p->nodes[node], acc);

	for (int i = 0; i < n; i++)
		acc[i].row = role == AT_ROW || (role == AT_REDUCTION && acc[i].write);
	if (role == AT_REDUCTION)
		g->red = node;

	if (g->nacc + n > g->cap) {
		int cap = g->cap ? g->cap * 2 : 64;
		while (cap < g->nacc + n)
			cap *= 2;
		struct access *a = realloc(g->acc, (size_t)cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		g->acc = a;
		g->cap = cap;
	}
	if (g->nnodes == g->nodes_cap) {
		int cap = g->nodes_cap ? g->nodes_cap * 2 : 8;
		int *nodes = realloc(g->nodes, (size_t)cap * sizeof(*nodes));
		if (!nodes)
			return -ENOMEM;
		g->nodes = nodes;
		g->nodes_cap = cap;
	}
	memcpy(g->acc + g->nacc, acc, (size_t)n * sizeof(*acc));
	g->nacc += n;
	g->nodes[g->nnodes++] = node;
	return 0;
}

/* Whether the group may read tensor t at its elements' own index: nothing
 * the group wrote overlaps t, unless it wrote exactly t (then the value is
 * in a register). */
static bool group_may_read(const struct rp_program *p, const struct group *g, int t)
{
	for (int i = 0; i < g->nacc; i++) {
		const struct access *a = &g->acc[i];
		if (a->write && !rd_prog_same_view(p, a->tensor, t) && !rd_prog_disjoint(p, a->tensor, t))
			return false;
	}
	return true;
}

/* Whether the group writes nothing of t: what a node may read at other
 * elements than its own (a recomputed root's sources). */
static bool group_leaves(const struct rp_program *p, const struct group *g, int t)
{
	for (int i = 0; i < g->nacc; i++)
		if (g->acc[i].write && !rd_prog_disjoint(p, g->acc[i].tensor, t))
			return false;
	return true;
}

/* Whether node n may read its inputs in the group at its own elements:
 * each as group_may_read says, a recomputed one's sources untouched by
 * the group. */
static bool group_may_read_inputs(const struct rp_program *p, const struct rd_prog_plan *plan,
				  const struct group *g, const struct rp_prog_node *n)
{
	for (int i = 0; i < n->nin; i++) {
		int t = n->in[i];
		if (t < 0 || is_scalar(p, t))
			continue;
		if (!plan->recomputed[t]) {
			if (!group_may_read(p, g, t))
				return false;
			continue;
		}
		int root = p->tensors[t].root;
		for (int j = 0; j < plan->nsources[root]; j++)
			if (!group_leaves(p, g, plan->sources[root][j]))
				return false;
	}
	return true;
}

/* Whether a node of the group's domain may write t: what the group touched
 * of t's root it touched as t exactly (the same thread, the same element,
 * in program order), or not at all. `same_index`: false for a write at
 * another index than the element's (a reduction's result), which must then
 * meet nothing the group touched. */
static bool group_may_write(const struct rp_program *p, const struct group *g, int t, bool same_index)
{
	for (int i = 0; i < g->nacc; i++) {
		int u = g->acc[i].tensor;
		if (rd_prog_disjoint(p, u, t))
			continue;
		if (!same_index || g->acc[i].shifted || !rd_prog_same_view(p, u, t))
			return false;
	}
	return true;
}

static bool pointwise_joins(const struct rp_program *p, const struct rd_prog_plan *plan, const struct group *g,
			    const struct rp_prog_node *n)
{
	if (g->closed || g->kind != RD_STEP_FUSED || !rd_prog_same_shape(&p->tensors[n->out[0]], g->domain))
		return false;
	return group_may_read_inputs(p, plan, g, n) && group_may_write(p, g, n->out[0], true);
}

/* A reduction takes the group as its prologue when the group runs over its
 * input's shape: every element of the input is visited once by the
 * reduction kernel, which computes the group's nodes there first. */
static bool reduction_joins(const struct rp_program *p, const struct group *g, const struct rp_prog_node *n)
{
	if (g->closed || g->kind != RD_STEP_FUSED || n->nin < 1 || n->in[0] < 0 || n->nout != 1 || n->out[0] < 0)
		return false;
	if (!rd_prog_same_shape(&p->tensors[n->in[0]], g->domain))
		return false;
	return group_may_read(p, g, n->in[0]) && group_may_write(p, g, n->out[0], false);
}

/* Whether a node of the group writes what the group read from memory
 * before (in place: a read, then a write of it; a write, then a read is
 * a value in registers): a second pass over the domain would read the new
 * value where the first read the old one. */
static bool group_writes_what_it_read(const struct rp_program *p, const struct group *g)
{
	for (int i = 0; i < g->nacc; i++) {
		if (!g->acc[i].write)
			continue;
		for (int k = 0; k < i; k++)
			if (!g->acc[k].write && !rd_prog_disjoint(p, g->acc[i].tensor, g->acc[k].tensor))
				return true;
	}
	return false;
}

/* Whether o is the shape of a row of domain d: d's own but its last dim,
 * which is 1; or a scalar where d is a vector (its one row: a loss's
 * sum over the rows' losses, divided by their count). */
static bool row_shape(const struct rp_prog_tensor *o, const struct rp_prog_tensor *d)
{
	if (o->rank == 0 && d->rank == 1)
		return true;
	if (o->rank != d->rank || o->rank < 1 || o->shape[o->rank - 1] != 1)
		return false;
	for (int k = 0; k < o->rank - 1; k++)
		if (o->shape[k] != d->shape[k])
			return false;
	return true;
}

/* Whether only pointwise nodes read root r (no reduction would take its
 * writer as a prologue). */
static bool read_only_by_pointwise(const struct rp_program *p, int r)
{
	for (int i = 0; i < p->nnodes; i++) {
		const struct rp_prog_node *m = &p->nodes[i];
		for (int k = 0; k < m->nin && m->op->cls != RP_PC_POINTWISE; k++)
			if (m->in[k] >= 0 && p->tensors[m->in[k]].root == r)
				return false;
	}
	return true;
}

/* Whether pointwise node n joins a last-axis reduction's group as its
 * epilogue, in the reduction's kernel once the row's result is known:
 * over the domain (*row false: the kernel passes over the row again,
 * computing the prologue anew where n reads it) or over the row (*row
 * true: once a row, e.g. rsqrt(mean + eps)). It must read what the group
 * made (the result, the prologue's or the epilogue's values: elsewhere
 * they would have to be stored for it), or join a pass over the domain
 * that the epilogue makes anyway, or be a row's value that only pointwise
 * nodes read (rstd^3, which a later norm backward's epilogue reads: once
 * a row, nearly free, where it would else take a kernel): what does
 * none of these is left to groups of its own (a second reduction's
 * prologue, which would else be stored for it);
 * what it reads that the group wrote it reads from registers: the very
 * element the group wrote at this element, or the very row value
 * (rd_prog_same_row); everything else it reads is memory the group does
 * not write. Its output the group touched nowhere else but as this very
 * element (element nodes), or nowhere (row nodes). */
static bool epilogue_joins(const struct rp_program *p, const struct rd_prog_plan *plan, const struct group *g,
			   const struct rp_prog_node *n, bool *row)
{
	const struct rp_prog_tensor *d = g->domain, *o = &p->tensors[n->out[0]];
	const int *inl = plan->computed_inline;
	bool consumes = false;

	if (g->closed || g->kind != RD_STEP_REDUCTION || g->red < 0 || d->rank < 1 || d->shape[d->rank - 1] < 2)
		return false;
	if (rd_prog_same_shape(o, d))
		*row = false;
	else if (row_shape(o, d))
		*row = true;
	else
		return false;
	for (int i = 0; i < n->nin; i++) {
		int t = n->in[i];
		if (t < 0 || is_scalar(p, t))
			continue;
		if (inl[t] >= 0) {
			/* A mask's draw is numbered by the element: not a row's. */
			if (*row && p->nodes[inl[t]].pw.fn == RP_PW_DROPOUT_MASK)
				return false;
			continue;
		}
		if (plan->recomputed[t]) {
			int root = p->tensors[t].root;
			if (*row)
				return false;
			for (int j = 0; j < plan->nsources[root]; j++)
				if (!group_leaves(p, g, plan->sources[root][j]))
					return false;
			continue;
		}
		for (int k = 0; k < g->nacc; k++) {
			const struct access *a = &g->acc[k];
			if (!a->write || rd_prog_disjoint(p, a->tensor, t))
				continue;
			if (a->row ? !rd_prog_same_row(p, d, a->tensor, t) : *row || !rd_prog_same_view(p, a->tensor, t))
				return false;
			consumes = true;
		}
	}
	if (!consumes && (*row ? !read_only_by_pointwise(p, o->root) : !g->second_pass))
		return false;
	/* The second pass computes the prologue anew from memory: it must
	 * find there what the first pass found. */
	if (!*row && !g->second_pass && group_writes_what_it_read(p, g))
		return false;
	for (int k = 0; k < g->nacc; k++) {
		const struct access *a = &g->acc[k];
		if (!rd_prog_disjoint(p, a->tensor, n->out[0]) &&
		    (*row || a->row || a->shifted || !rd_prog_same_view(p, a->tensor, n->out[0])))
			return false;
	}
	return true;
}

/* Whether node n must run after the group: it reads what the group writes,
 * or writes what the group reads or writes (any overlap). */
static bool depends_on(const struct rp_program *p, const struct group *g, const struct access *acc, int nacc)
{
	for (int i = 0; i < nacc; i++)
		for (int k = 0; k < g->nacc; k++)
			if ((acc[i].write || g->acc[k].write) && !rd_prog_disjoint(p, acc[i].tensor, g->acc[k].tensor))
				return true;
	return false;
}

/* Grouping. Nodes are taken in program order; each joins a group of the
 * window or starts one. A node may run ahead of groups it does not depend
 * on: it joins the earliest group, at or after the last one it depends on,
 * that takes it (see pointwise_joins, reduction_joins), else starts a new
 * one at the end. So a chain over one shape stays one kernel though small
 * nodes of other shapes (a row's statistic, an iota) sit between its
 * nodes in the definition; those run first. Library calls and gathers
 * are closed groups of the window, in program order among themselves,
 * each right after the last group it depends on: a pointwise group they
 * do not depend on runs after them, where what reads their output may
 * still join it (SwiGLU's silu(x W1) waits for x W3 and takes the
 * product), and a node may join a group ahead of library calls it does
 * not depend on (silu's backward joins the products of the gradient that
 * the weights' GEMMs read). */
struct builder {
	const struct rp_program *p;
	struct rd_prog_plan *plan;
	int cap;
	int norder;
	struct group window[WINDOW_MAX + 1];   /* one spare past the end */
	int nwindow;
};

static int emit_step(struct builder *b, struct group *g)
{
	struct rd_prog_plan *plan = b->plan;

	if (plan->nsteps == b->cap) {
		int cap = b->cap ? b->cap * 2 : 16;
		struct rd_prog_step *s = realloc(plan->steps, (size_t)cap * sizeof(*s));
		if (!s)
			return -ENOMEM;
		plan->steps = s;
		b->cap = cap;
	}
	struct rd_prog_step *s = &plan->steps[plan->nsteps++];
	memset(s, 0, sizeof(*s));
	s->kind = g->kind;
	/* plan->order has room for every node: nodes[] is set once the
	 * steps stop moving (plan_finish_order). */
	s->first_node = g->nodes[0];
	s->nnodes = g->nnodes;
	memcpy(plan->order + b->norder, g->nodes, (size_t)g->nnodes * sizeof(int));
	b->norder += g->nnodes;
	return 0;
}

static void group_clear(struct group *g)
{
	g->nnodes = 0;
	g->nacc = 0;
	g->closed = false;
	g->domain = NULL;
	g->red = -1;
	g->second_pass = false;
}

/* Node `node`, a reduction, joins or starts group g: a last-axis one stays
 * open to its epilogue. */
static int group_add_reduction(struct group *g, const struct rp_program *p, const struct rd_prog_plan *plan,
			       int node)
{
	g->kind = RD_STEP_REDUCTION;
	g->closed = p->nodes[node].red.axis != RP_AXIS_LAST;
	g->domain = &p->tensors[p->nodes[node].in[0]];
	return group_add(g, p, plan, node, AT_REDUCTION);
}

/* Emits the window's first n groups, in order. */
static int flush(struct builder *b, int n)
{
	for (int i = 0; i < n; i++) {
		int r = emit_step(b, &b->window[i]);
		if (r < 0)
			return r;
	}
	/* Keep the groups' buffers: rotate the emptied ones past the end. */
	for (int i = 0; i < n; i++) {
		struct group g = b->window[0];
		memmove(&b->window[0], &b->window[1], (size_t)WINDOW_MAX * sizeof(g));
		group_clear(&g);
		b->window[WINDOW_MAX] = g;
	}
	b->nwindow -= n;
	return 0;
}

/* A new group holding node, at window position `at` (the groups from
 * there on move one place later). */
static int open_group(struct builder *b, int at, enum rd_prog_step_kind kind, bool closed, int node)
{
	int r;

	if (b->nwindow == WINDOW_MAX) {
		if ((r = flush(b, 1)) < 0)
			return r;
		at = at > 0 ? at - 1 : 0;
	}
	/* The spare group past the window's end keeps its buffers. */
	struct group g = b->window[b->nwindow];
	memmove(&b->window[at + 1], &b->window[at], (size_t)(b->nwindow - at) * sizeof(g));
	b->window[at] = g;
	b->nwindow++;
	group_clear(&b->window[at]);
	b->window[at].kind = kind;
	b->window[at].closed = closed;
	if (kind == RD_STEP_REDUCTION)
		return group_add_reduction(&b->window[at], b->p, b->plan, node);
	if (kind == RD_STEP_FUSED)
		b->window[at].domain = &b->p->tensors[b->p->nodes[node].out[0]];
	return group_add(&b->window[at], b->p, b->plan, node, AT_ELEMENT);
}

static int64_t group_size(const struct group *g)
{
	return g->domain ? g->domain->numel : INT64_MAX;
}

/* Where a new group of `size` elements goes: after the last group it
 * depends on, and after every group smaller than it, so that the window
 * runs small work (a row's statistics, a scalar's bias correction) before
 * the large groups that read it, which can then take more nodes; and
 * before the groups of its size it does not depend on, which so stay
 * open past the library calls that will read it (a sum of two GEMMs'
 * outputs waits past the GEMM of a transposing cast's output, whose own
 * output joins it). */
static int new_group_place(const struct builder *b, int last_dep, int64_t size)
{
	int at = last_dep + 1;

	for (int i = b->nwindow - 1; i >= at; i--)
		if (group_size(&b->window[i]) < size)
			return i + 1;
	return at;
}

/* Places node in the window: in the earliest group at or after the last
 * one it depends on that takes it, else in a new group (new_group_place). */
static int place(struct builder *b, int node)
{
	const struct rp_program *p = b->p;
	const struct rp_prog_node *n = &p->nodes[node];
	const struct rd_prog_plan *plan = b->plan;
	struct access acc[NODE_ACCESSES_MAX];
	int nacc = node_accesses(p, plan, n, acc), last_dep = -1;

	for (int i = b->nwindow - 1; i >= 0; i--)
		if (depends_on(p, &b->window[i], acc, nacc)) {
			last_dep = i;
			break;
		}
	for (int i = last_dep < 0 ? 0 : last_dep; i < b->nwindow; i++) {
		struct group *g = &b->window[i];
		bool row;
		if (n->op->cls == RP_PC_POINTWISE && pointwise_joins(p, plan, g, n))
			return group_add(g, p, plan, node, AT_ELEMENT);
		if (n->op->cls == RP_PC_POINTWISE && epilogue_joins(p, plan, g, n, &row)) {
			g->second_pass |= !row;
			return group_add(g, p, plan, node, row ? AT_ROW : AT_ELEMENT);
		}
		if (n->op->cls == RP_PC_REDUCTION && reduction_joins(p, g, n))
			return group_add_reduction(g, p, plan, node);
	}
	switch (n->op->cls) {
	case RP_PC_POINTWISE:
		return open_group(b, new_group_place(b, last_dep, p->tensors[n->out[0]].numel), RD_STEP_FUSED, false,
				  node);
	case RP_PC_REDUCTION:
		return open_group(b, new_group_place(b, last_dep, p->tensors[n->in[0]].numel), RD_STEP_REDUCTION, false,
				  node);
	case RP_PC_GATHER:
	case RP_PC_COMPUTE: {
		int at = last_dep + 1;
		for (int i = b->nwindow - 1; i >= at; i--)
			if (b->window[i].kind == RD_STEP_LIBRARY || b->window[i].kind == RD_STEP_GATHER) {
				at = i + 1;
				break;
			}
		return open_group(b, at, n->op->cls == RP_PC_GATHER ? RD_STEP_GATHER : RD_STEP_LIBRARY, true, node);
	}
	default:
		return -EINVAL;
	}
}

static int group_nodes(struct builder *b, struct rp_error *err)
{
	const struct rp_program *p = b->p;
	int r = 0;

	for (int i = 0; i < p->nnodes && r == 0; i++) {
		const struct rp_prog_node *n = &p->nodes[i];
		bool one_out = n->nout == 1 && n->out[0] >= 0;
		if ((n->op->cls == RP_PC_POINTWISE || n->op->cls == RP_PC_REDUCTION || n->op->cls == RP_PC_GATHER) &&
		    !one_out) {
			rp_error_set(err, RP_ERR_BACKEND, "program %s: node %d (%s) has no output", p->name, i,
				     n->op->name);
			return -EINVAL;
		}
		if (n->op->cls == RP_PC_POINTWISE &&
		    (b->plan->computed_inline[n->out[0]] == i || b->plan->recomputed[n->out[0]]))
			continue;   /* computed by its readers */
		r = place(b, i);
		if (r == -EINVAL) {
			rp_error_set(err, RP_ERR_BACKEND, "program %s: node %d (%s) is of a class the CUDA backend does not run",
				     p->name, i, n->op->name);
			return r;
		}
	}
	if (r == 0)
		r = flush(b, b->nwindow);
	for (int i = 0; i <= WINDOW_MAX; i++) {
		free(b->window[i].nodes);
		free(b->window[i].acc);
	}
	if (r == -ENOMEM)
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory to plan program %s", p->name);
	return r;
}

/* Which outputs go to memory: see node_stored in plan.h. */
static int decide_stores(const struct rp_program *p, struct rd_prog_plan *plan)
{
	int *last_read = malloc((size_t)(p->ntensors ? p->ntensors : 1) * sizeof(*last_read));
	struct access acc[NODE_ACCESSES_MAX];

	if (!last_read)
		return -ENOMEM;
	/* The last step that reads each root, in memory or not. */
	for (int t = 0; t < p->ntensors; t++)
		last_read[t] = -1;
	for (int s = 0; s < plan->nsteps; s++) {
		const struct rd_prog_step *st = &plan->steps[s];
		for (int k = 0; k < st->nnodes; k++) {
			int n = node_accesses(p, plan, &p->nodes[st->nodes[k]], acc);
			for (int a = 0; a < n; a++)
				if (!acc[a].write)
					last_read[p->tensors[acc[a].tensor].root] = s;
		}
	}
	for (int s = 0; s < plan->nsteps; s++) {
		const struct rd_prog_step *st = &plan->steps[s];
		for (int k = 0; k < st->nnodes; k++) {
			int i = st->nodes[k];
			const struct rp_prog_node *n = &p->nodes[i];
			plan->node_stored[i] = true;
			if (n->op->cls == RP_PC_REDUCTION && k < st->nnodes - 1) {
				/* A result its own epilogue alone reads stays in registers. */
				int root = p->tensors[n->out[0]].root;
				plan->node_stored[i] = p->tensors[root].kind != RP_PT_INTERMEDIATE || last_read[root] > s;
				continue;
			}
			if (n->op->cls != RP_PC_POINTWISE)
				continue;
			int o = n->out[0], root = p->tensors[o].root;
			bool superseded = false;
			for (int j = k + 1; j < st->nnodes && !superseded; j++) {
				const struct rp_prog_node *m = &p->nodes[st->nodes[j]];
				superseded = m->op->cls == RP_PC_POINTWISE && rd_prog_same_view(p, m->out[0], o);
			}
			plan->node_stored[i] = !superseded && (p->tensors[root].kind != RP_PT_INTERMEDIATE ||
							      last_read[root] > s);
		}
	}
	free(last_read);
	return 0;
}

/* A block of the arena and the steps it must hold its bytes over. */
struct arena_item {
	uint64_t size;
	int first, last;
	uint64_t offset;
	int root;        /* a tensor's root, or -1 - s for step s's own scratch */
};

static int by_size_desc(const void *x, const void *y)
{
	const struct arena_item *a = x, *b = y;

	if (a->size != b->size)
		return a->size < b->size ? 1 : -1;
	if (a->first != b->first)
		return a->first < b->first ? -1 : 1;
	return a->root < b->root ? -1 : a->root > b->root;
}

static int by_offset(const void *x, const void *y)
{
	const struct arena_item *const *a = x, *const *b = y;

	return (*a)->offset < (*b)->offset ? -1 : (*a)->offset > (*b)->offset;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* First fit, largest first: each block goes to the lowest offset where it
 * meets no placed block whose steps overlap its own. */
static int place_items(struct arena_item *items, int n, uint64_t *total)
{
	struct arena_item **live = malloc((size_t)(n ? n : 1) * sizeof(*live));

	if (!live)
		return -ENOMEM;
	qsort(items, (size_t)n, sizeof(*items), by_size_desc);
	*total = 0;
	for (int i = 0; i < n; i++) {
		int nlive = 0;
		for (int j = 0; j < i; j++)
			if (items[j].first <= items[i].last && items[i].first <= items[j].last)
				live[nlive++] = &items[j];
		qsort(live, (size_t)nlive, sizeof(*live), by_offset);
		uint64_t at = 0;
		for (int j = 0; j < nlive; j++) {
			if (live[j]->offset >= at + items[i].size)
				break;
			uint64_t end = live[j]->offset + live[j]->size;
			if (end > at)
				at = end;
		}
		items[i].offset = at;
		if (at + items[i].size > *total)
			*total = at + items[i].size;
	}
	free(live);
	return 0;
}

static int lay_out_arena(const struct rp_program *p, struct rd_prog_plan *plan)
{
	int *first = malloc((size_t)p->ntensors * sizeof(*first));
	int *last = malloc((size_t)p->ntensors * sizeof(*last));
	uint64_t *size = calloc((size_t)p->ntensors, sizeof(*size));
	struct arena_item *items = malloc((size_t)(p->ntensors + plan->nsteps + 1) * sizeof(*items));
	struct access acc[NODE_ACCESSES_MAX];
	int nitems = 0, r = -ENOMEM;

	if (!first || !last || !size || !items)
		goto out;
	for (int t = 0; t < p->ntensors; t++) {
		first[t] = -1;
		last[t] = -1;
		plan->arena_offset[t] = RD_PROG_NOT_IN_ARENA;
	}
	/* A root's bytes: past the furthest of its views. */
	for (int t = 0; t < p->ntensors; t++) {
		uint64_t e = view_extent_bytes(&p->tensors[t]);
		int root = p->tensors[t].root;
		if (e > size[root])
			size[root] = e;
	}
	for (int s = 0; s < plan->nsteps; s++) {
		const struct rd_prog_step *st = &plan->steps[s];
		for (int j = 0; j < st->nnodes; j++) {
			int i = st->nodes[j];
			int n = node_accesses(p, plan, &p->nodes[i], acc);
			for (int k = 0; k < n; k++) {
				int root = p->tensors[acc[k].tensor].root;
				if (p->tensors[root].kind != RP_PT_INTERMEDIATE)
					continue;
				if (acc[k].write && plan->node_stored[i] && first[root] < 0)
					first[root] = s;
				if (s > last[root])
					last[root] = s;
			}
		}
	}
	for (int t = 0; t < p->ntensors; t++) {
		if (first[t] < 0 || size[t] == 0)
			continue;
		items[nitems++] = (struct arena_item){ align_up(size[t], RD_PROG_ARENA_ALIGN), first[t], last[t], 0, t };
	}
	for (int s = 0; s < plan->nsteps; s++)
		if (plan->steps[s].scratch_bytes)
			items[nitems++] = (struct arena_item){
				align_up(plan->steps[s].scratch_bytes, RD_PROG_ARENA_ALIGN), s, s, 0, -1 - s };
	r = place_items(items, nitems, &plan->arena_bytes);
	if (r < 0)
		goto out;
	for (int i = 0; i < nitems; i++) {
		if (items[i].root >= 0)
			plan->arena_offset[items[i].root] = items[i].offset;
		else
			plan->steps[-1 - items[i].root].scratch_offset = items[i].offset;
	}
	/* Views share their root's offset. */
	for (int t = 0; t < p->ntensors; t++)
		plan->arena_offset[t] = plan->arena_offset[p->tensors[t].root];
out:
	free(first);
	free(last);
	free(size);
	free(items);
	return r;
}

void rd_prog_plan_finish(struct rd_prog_plan *plan)
{
	if (!plan)
		return;
	for (int s = 0; s < plan->nsteps; s++) {
		free(plan->steps[s].source);
		free(plan->steps[s].kernels);
	}
	free(plan->steps);
	free(plan->arena_offset);
	free(plan->node_stored);
	free(plan->order);
	free(plan->computed_inline);
	free(plan->recomputed);
	free(plan->sources);
	free(plan->nsources);
	free(plan->frame);
	memset(plan, 0, sizeof(*plan));
}

int rd_prog_plan_build(const struct rp_program *p, struct rd_prog_plan *plan, struct rp_error *err)
{
	struct builder b = { .p = p, .plan = plan };
	int r;

	memset(plan, 0, sizeof(*plan));
	plan->ntensors = p->ntensors;
	plan->nbound = p->nbound;
	plan->arena_offset = malloc((size_t)(p->ntensors ? p->ntensors : 1) * sizeof(*plan->arena_offset));
	plan->node_stored = calloc((size_t)(p->nnodes ? p->nnodes : 1), sizeof(*plan->node_stored));
	plan->order = malloc((size_t)(p->nnodes ? p->nnodes : 1) * sizeof(*plan->order));
	plan->computed_inline = malloc((size_t)(p->ntensors ? p->ntensors : 1) * sizeof(*plan->computed_inline));
	plan->recomputed = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof(*plan->recomputed));
	plan->sources = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof(*plan->sources));
	plan->nsources = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof(*plan->nsources));
	plan->frame = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof(*plan->frame));
	if (!plan->arena_offset || !plan->node_stored || !plan->order || !plan->computed_inline || !plan->recomputed ||
	    !plan->sources || !plan->nsources || !plan->frame) {
		r = -ENOMEM;
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory to plan program %s", p->name);
		goto fail;
	}
	find_inline(p, plan->computed_inline);
	if ((r = find_recomputed(p, plan)) < 0) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory to plan program %s", p->name);
		goto fail;
	}
	r = group_nodes(&b, err);
	if (r < 0)
		goto fail;
	for (int s = 0, at = 0; s < plan->nsteps; s++) {
		plan->steps[s].nodes = plan->order + at;
		at += plan->steps[s].nnodes;
	}
	r = decide_stores(p, plan);
	if (r == 0)
		for (int s = 0; s < plan->nsteps; s++)
			plan->steps[s].scratch_bytes = rd_prog_codegen_scratch_bytes(p, plan, s);
	if (r == 0)
		r = lay_out_arena(p, plan);
	plan->fault_offset = RD_PROG_NOT_IN_ARENA;
	for (int s = 0; r == 0 && s < plan->nsteps; s++)
		if (plan->steps[s].kind == RD_STEP_GATHER && plan->fault_offset == RD_PROG_NOT_IN_ARENA) {
			plan->fault_offset = plan->arena_bytes;
			plan->arena_bytes += RD_PROG_ARENA_ALIGN;
		}
	if (r < 0) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory to plan program %s", p->name);
		goto fail;
	}
	for (int s = 0; s < plan->nsteps; s++) {
		if (plan->steps[s].kind == RD_STEP_LIBRARY)
			continue;
		r = rd_prog_codegen_step(p, plan, s, err);
		if (r < 0)
			goto fail;
		plan->fused_kernels += (uint64_t)plan->steps[s].nkernels;
	}
	return 0;
fail:
	rd_prog_plan_finish(plan);
	return r;
}

void *rd_prog_tensor_address(const struct rd_prog_plan *plan, const struct rp_program *p, int t, void *const *bound,
			     void *arena)
{
	const struct rp_prog_tensor *x = &p->tensors[t];
	const struct rp_prog_tensor *root = &p->tensors[x->root];
	size_t skip = (size_t)x->root_offset * rp_dtype_size(x->dtype);

	if (x->kind == RP_PT_SCALAR)
		return NULL;
	if (root->kind == RP_PT_INTERMEDIATE) {
		if (plan->arena_offset[t] == RD_PROG_NOT_IN_ARENA)
			return NULL;
		return (char *)arena + plan->arena_offset[t] + skip;
	}
	return (char *)bound[root->bind_index] + skip;
}

/* rg_args: void *bound[NB]; char *arena; double scalar[NB]. */
static int args_slots(const struct rd_prog_plan *plan)
{
	return plan->nbound > 0 ? plan->nbound : 1;
}

size_t rd_prog_args_size(const struct rd_prog_plan *plan)
{
	return (size_t)args_slots(plan) * (sizeof(void *) + sizeof(double)) + 2 * sizeof(void *);
}

void rd_prog_args_fill(const struct rd_prog_plan *plan, void *dst, void *const *bound, void *arena,
		       struct rd_prog_fault *fault, const double *scalars)
{
	size_t nb = (size_t)args_slots(plan);
	char *d = dst;

	memset(d, 0, rd_prog_args_size(plan));
	if (plan->nbound > 0) {
		memcpy(d, bound, (size_t)plan->nbound * sizeof(void *));
		memcpy(d + (nb + 2) * sizeof(void *), scalars, (size_t)plan->nbound * sizeof(double));
	}
	memcpy(d + nb * sizeof(void *), &arena, sizeof(void *));
	memcpy(d + (nb + 1) * sizeof(void *), &fault, sizeof(void *));
}

unsigned rd_prog_kernel_grid(const struct rd_prog_kernel *k, unsigned sm_count)
{
	uint64_t cap = (uint64_t)k->blocks_per_sm * (sm_count ? sm_count : 1);
	uint64_t g = k->blocks_per_sm == RD_PROG_GRID_UNCAPPED || k->blocks < cap ? k->blocks : cap;

	/* gridDim.x's limit; every kernel loops over its blocks of work. */
	if (g > 0x7fffffffu)
		g = 0x7fffffffu;
	return (unsigned)g;
}
