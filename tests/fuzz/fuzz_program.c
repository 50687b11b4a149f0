/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program: any JSON as Define's parameters, and as a Run's
 * against the program Define accepted. The input is [define, run] (or
 * [define], or define alone).
 *
 * A refusal must be a named error (InvalidProgram naming a node or a
 * tensor with a reason, InvalidParameter naming the parameter,
 * LimitExceeded naming the resource) that builds into a reply, with
 * nothing kept. An accepted program must satisfy what proto/program.h
 * promises a backend, checked here again from scratch: primitives only,
 * operands in range, every read after a write, views inside their bases,
 * no write through a shared address, no output over an input unless the
 * very same tensor of an in-place op, bind indices in definition order;
 * and its kept definition must define the same program again. A Run the
 * parser accepted names every bound tensor once. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "proto/program.h"

static void check_named(int r, struct rp_error *err, const char *where)
{
	const char *key;
	const cJSON *v;

	fz_check_error(r, err, where);
	if (strcmp(err->name, RP_ERR_INVALID_PROGRAM) == 0) {
		key = "node";
		FZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err->params, "reason")), "%s: no reason", where);
		FZ_CHECK(r == -EINVAL, "%s: InvalidProgram with %d", where, r);
	} else if (strcmp(err->name, RP_ERR_LIMIT_EXCEEDED) == 0) {
		key = "resource";
		FZ_CHECK(r == -E2BIG, "%s: LimitExceeded with %d", where, r);
	} else if (strcmp(err->name, RP_ERR_INVALID_OPERAND) == 0) {
		key = "operand";   /* a Run's misaligned offset */
	} else {
		FZ_CHECK(strcmp(err->name, RP_ERR_INVALID_PARAMETER) == 0, "%s: unexpected error %s", where, err->name);
		key = "parameter";
		FZ_CHECK(r == -EINVAL, "%s: InvalidParameter with %d", where, r);
	}
	v = cJSON_GetObjectItemCaseSensitive(err->params, key);
	FZ_CHECK(cJSON_IsString(v) && (v->valuestring[0] || strcmp(key, "parameter") == 0), "%s: %s names no %s", where,
		 err->name, key);
}

static int64_t span(const struct rp_prog_tensor *t)
{
	int64_t s = 0;

	for (int i = 0; i < t->rank; i++)
		s += (t->shape[i] - 1) * t->strides[i];
	return s;
}

static bool overlap(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y)
{
	return x->root == y->root && x->root_offset <= y->root_offset + span(y) && y->root_offset <= x->root_offset + span(x);
}

static bool same(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y)
{
	if (x->root != y->root || x->root_offset != y->root_offset || x->rank != y->rank)
		return false;
	for (int i = 0; i < x->rank; i++)
		if (x->shape[i] != y->shape[i] || (x->shape[i] > 1 && x->strides[i] != y->strides[i]))
			return false;
	return true;
}

static void check_tensors(const struct rp_program *p)
{
	int bound = 0;

	FZ_CHECK(p->ntensors >= 0 && p->ntensors <= RP_PROG_TENSORS_MAX, "%d tensors", p->ntensors);
	FZ_CHECK(p->nbound <= RP_PROG_BOUND_MAX, "%d bound", p->nbound);
	for (int i = 0; i < p->ntensors; i++) {
		const struct rp_prog_tensor *t = &p->tensors[i];
		int64_t numel = 1;

		FZ_CHECK(t->name[0] && strlen(t->name) <= RP_PROG_NAME_MAX, "tensor %d unnamed", i);
		for (int j = 0; j < i; j++)
			FZ_CHECK(strcmp(p->tensors[j].name, t->name) != 0, "two tensors named %s", t->name);
		FZ_CHECK(t->rank >= 0 && t->rank <= RP_PROG_RANK_MAX, "%s: rank %d", t->name, t->rank);
		FZ_CHECK((unsigned)t->dtype < RP_DTYPE_COUNT && (unsigned)t->kind < RP_PT_KINDS, "%s: dtype or kind", t->name);
		for (int d = 0; d < t->rank; d++) {
			FZ_CHECK(t->shape[d] >= 1 && t->shape[d] <= RP_DIM_MAX && t->strides[d] >= 0, "%s: dim %d", t->name, d);
			numel *= t->shape[d];
		}
		FZ_CHECK(numel == t->numel && numel <= RP_PROG_NUMEL_MAX, "%s: numel", t->name);
		FZ_CHECK(t->root >= 0 && t->root <= i && p->tensors[t->root].root == t->root, "%s: root", t->name);
		if (t->kind == RP_PT_VIEW) {
			FZ_CHECK(t->base >= 0 && t->base < i, "%s: base", t->name);
			const struct rp_prog_tensor *b = &p->tensors[t->base];

			FZ_CHECK(b->dtype == t->dtype, "%s: base's dtype", t->name);
			FZ_CHECK(t->offset >= 0 && t->offset + span(t) <= span(b), "%s: outside its base", t->name);
			FZ_CHECK(t->root == b->root && t->root_offset == b->root_offset + t->offset, "%s: root offset", t->name);
		} else {
			FZ_CHECK(t->root == i && t->root_offset == 0 && t->base == -1, "%s: not a view but has a base", t->name);
		}
		FZ_CHECK(t->kind != RP_PT_INTERMEDIATE || rp_prog_tensor_contiguous(t), "%s: strided intermediate", t->name);
		FZ_CHECK(t->kind != RP_PT_SCALAR || (t->rank == 0 && t->dtype == RP_DTYPE_F64), "%s: scalar", t->name);
		FZ_CHECK(t->extent_bytes == (uint64_t)(t->root_offset + span(t) + 1) * rp_prog_tensor_elem_size(t),
			 "%s: extent", t->name);
		if (t->kind == RP_PT_INPUT || t->kind == RP_PT_OUTPUT || t->kind == RP_PT_INOUT || t->kind == RP_PT_SCALAR) {
			FZ_CHECK(t->bind_index == bound && p->bind[bound] == i, "%s: bind index", t->name);
			bound++;
		} else {
			FZ_CHECK(t->bind_index == -1, "%s: bound", t->name);
		}
	}
	FZ_CHECK(bound == p->nbound, "bound %d of %d", bound, p->nbound);
}

/* Every element of a written tensor at its own address (a conservative
 * restatement: sorted by stride, each steps over what is inside it). */
static void check_own_addresses(const struct rp_prog_tensor *t)
{
	int64_t st[RP_PROG_RANK_MAX], sz[RP_PROG_RANK_MAX], reach = 1;
	int n = 0;

	for (int i = 0; i < t->rank; i++)
		if (t->shape[i] > 1) {
			st[n] = t->strides[i];
			sz[n++] = t->shape[i];
		}
	for (int i = 0; i < n; i++) {
		int m = i;

		for (int j = i + 1; j < n; j++)
			if (st[j] < st[m])
				m = j;
		int64_t a = st[i], b = sz[i];
		st[i] = st[m];
		sz[i] = sz[m];
		st[m] = a;
		sz[m] = b;
		FZ_CHECK(st[i] >= reach, "written %s shares addresses", t->name);
		reach = st[i] * sz[i];
	}
}

static void check_nodes(const struct rp_program *p)
{
	bool *written = calloc((size_t)p->ntensors + 1, 1);

	FZ_CHECK(written != NULL, "calloc");
	FZ_CHECK(p->nnodes >= 0 && p->nnodes <= RP_PROG_NODES_MAX, "%d nodes", p->nnodes);
	for (int n = 0; n < p->nnodes; n++) {
		const struct rp_prog_node *node = &p->nodes[n];
		const bool compute = node->op->cls == RP_PC_COMPUTE;
		int reads[RP_PROG_NODE_IN_MAX], rslot[RP_PROG_NODE_IN_MAX], nr = 0;
		int writes[RP_PROG_NODE_IN_MAX], wslot[RP_PROG_NODE_IN_MAX], nw = 0;

		FZ_CHECK(node->op == rp_prog_op_find(node->op->name) && node->op->cls != RP_PC_COMPOSITE, "node %d op", n);
		FZ_CHECK(node->nin >= 0 && node->nin <= RP_PROG_NODE_IN_MAX && node->nout >= 0 &&
			 node->nout <= RP_PROG_NODE_OUT_MAX, "node %d counts", n);
		for (int s = 0; s < node->nin; s++) {
			FZ_CHECK(node->in[s] >= -1 && node->in[s] < p->ntensors, "node %d operand", n);
			if (node->in[s] < 0)
				continue;
			if (compute && node->compute.spec->operands[s].role == RP_ROLE_OUT) {
				wslot[nw] = s;
				writes[nw++] = node->in[s];
			} else {
				rslot[nr] = s;
				reads[nr++] = node->in[s];
			}
		}
		for (int s = 0; s < node->nout; s++) {
			FZ_CHECK(node->out[s] >= 0 && node->out[s] < p->ntensors, "node %d output", n);
			wslot[nw] = s;
			writes[nw++] = node->out[s];
		}
		FZ_CHECK(nw >= 1, "node %d writes nothing", n);
		if (compute)
			FZ_CHECK(node->compute.spec == rp_op_get(node->compute.spec->id), "node %d spec", n);
		for (int i = 0; i < nr; i++) {
			const struct rp_prog_tensor *t = &p->tensors[reads[i]], *root = &p->tensors[t->root];

			FZ_CHECK(written[t->root] || root->kind == RP_PT_INPUT || root->kind == RP_PT_INOUT ||
				 root->kind == RP_PT_SCALAR, "node %d reads %s unwritten", n, t->name);
		}
		for (int w = 0; w < nw; w++) {
			const struct rp_prog_tensor *t = &p->tensors[writes[w]], *root = &p->tensors[t->root];

			FZ_CHECK(root->kind != RP_PT_INPUT && root->kind != RP_PT_SCALAR, "node %d writes read-only %s", n,
				 t->name);
			check_own_addresses(t);
			for (int i = 0; i < nr; i++) {
				const struct rp_prog_tensor *x = &p->tensors[reads[i]];
				bool may = compute ? node->compute.spec->operands[wslot[w]].may_alias == rslot[i] : node->op->in_place;

				FZ_CHECK(!overlap(t, x) || (may && same(t, x)), "node %d: %s over its input %s", n, t->name,
					 x->name);
			}
			for (int v = 0; v < w; v++)
				FZ_CHECK(!overlap(t, &p->tensors[writes[v]]), "node %d: outputs overlap", n);
		}
		for (int w = 0; w < nw; w++)
			written[p->tensors[writes[w]].root] = true;
	}
	for (int i = 0; i < p->ntensors; i++)
		FZ_CHECK(p->tensors[i].kind != RP_PT_OUTPUT || written[i], "output %s unwritten", p->tensors[i].name);
	free(written);
}

/* The kept definition defines the same program. */
static void check_again(const struct rp_program *p)
{
	struct rp_program q;
	struct rp_error err = { 0 };

	FZ_CHECK(rp_program_parse(p->definition, &q, &err) == 0, "the kept definition is refused: %s",
		 err.name ? err.name : "?");
	FZ_CHECK(q.ntensors == p->ntensors && q.nnodes == p->nnodes && q.nbound == p->nbound &&
		 q.intermediate_bytes == p->intermediate_bytes && q.updates_in_place == p->updates_in_place,
		 "defined again, the program differs");
	for (int n = 0; n < p->nnodes; n++)
		FZ_CHECK(q.nodes[n].op == p->nodes[n].op && strcmp(q.nodes[n].name, p->nodes[n].name) == 0,
			 "node %d differs", n);
	rp_program_finish(&q);
}

static void run(const struct rp_program *p, const cJSON *params)
{
	struct rp_program_run r;
	struct rp_error err = { 0 };
	struct rp_id id;
	int rc = rp_program_run_parse(p, params, &r, &err);

	if (rc < 0) {
		if (rc != -ENOMEM)
			check_named(rc, &err, "Run");
		FZ_CHECK(r.bind == NULL && r.scalars == NULL, "refused Run keeps its tables");
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(rp_program_run_id(params, &id, &err) == 0 && id.kind == RP_ID_PROGRAM && id.generation == 0 &&
		 id.serial == r.program.serial, "program id");
	FZ_CHECK(r.nbound == p->nbound, "Run binds %d of %d", r.nbound, p->nbound);
	for (int i = 0; i < p->nbound; i++) {
		const struct rp_prog_tensor *t = &p->tensors[p->bind[i]];

		if (t->kind == RP_PT_SCALAR) {
			FZ_CHECK(isfinite(r.scalars[i]), "scalar %s not finite", t->name);
		} else {
			FZ_CHECK(r.bind[i].buffer.kind == RP_ID_BUFFER, "%s bound to no buffer", t->name);
			FZ_CHECK(r.bind[i].offset % rp_prog_tensor_elem_size(t) == 0, "%s misaligned", t->name);
		}
	}
	rp_program_run_finish(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *input = fz_json(data, size);
	const cJSON *define, *run_params;
	struct rp_program p;
	struct rp_error err = { 0 };
	int r;

	if (input == NULL)
		return 0;
	define = cJSON_IsArray(input) ? cJSON_GetArrayItem(input, 0) : input;
	run_params = cJSON_IsArray(input) ? cJSON_GetArrayItem(input, 1) : NULL;
	r = rp_program_parse(define, &p, &err);
	if (r < 0) {
		if (r != -ENOMEM)
			check_named(r, &err, "Define");
		FZ_CHECK(p.tensors == NULL && p.nodes == NULL && p.definition == NULL && p.ntensors == 0 && p.nnodes == 0,
			 "a refused program keeps something");
		rp_error_clear(&err);
		cJSON_Delete(input);
		return 0;
	}
	FZ_CHECK(err.name == NULL, "accepted with an error set");
	check_tensors(&p);
	check_nodes(&p);
	check_again(&p);
	if (run_params)
		run(&p, run_params);
	rp_program_finish(&p);
	cJSON_Delete(input);
	return 0;
}
