/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program.Define: the definition parsed into tensors and nodes,
 * its composites lowered into primitives, and the whole checked before
 * anything is kept (proto/program.h says what is checked). This file
 * reads the definition; the op table and each op's own rules are
 * program_ops.c's, the composites' lowering program_lower.c's, the check
 * of the whole program_check.c's. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "params.h"
#include "program_build.h"

/* An element index a tensor may reach in its memory: JSON's exact
 * integers, so that a backend's index arithmetic (times an element size,
 * plus an offset) stays far inside int64. */
#define ELEMENT_INDEX_MAX (INT64_C(1) << 53)
/* Slots of a name table: a power of two, over twice the most names it
 * holds (tensors; or nodes, the definition's and the lowered ones). */
#define NAME_SLOTS 16384
_Static_assert(NAME_SLOTS >= 2 * (RP_PROG_TENSORS_MAX + RP_PROG_NODES_MAX), "name table too small");
#define REASON_MAX 480

static const char *const kind_names[] = { "input", "output", "inout", "scalar", "intermediate", "view", NULL };

const char *rp_prog_kind_name(enum rp_prog_tensor_kind kind)
{
	return (unsigned)kind < RP_PT_KINDS ? kind_names[kind] : "?";
}

/* ---- Errors ---------------------------------------------------------------------- */

static int invalid_program(struct rp_error *err, const char *node, const char *reason)
{
	rp_err_invalid_program(err, node, reason, "%s: %s", node, reason);
	return -EINVAL;
}

int rp_prog_node_error(struct rp_prog_builder *b, int n, const char *fmt, ...)
{
	const struct rp_prog_node *node = &b->p->nodes[n];
	const char *source = b->source_names[node->source];
	char label[RP_PROG_NAME_MAX + 32], reason[REASON_MAX];
	size_t len = 0;
	va_list ap;

	snprintf(label, sizeof(label), "nodes[%d] (%s)", node->source, source);
	if (strcmp(node->name, source) != 0) {
		len = (size_t)snprintf(reason, sizeof(reason), "its lowered node %s (%s): ", node->name, node->op->name);
	}
	va_start(ap, fmt);
	vsnprintf(reason + len, sizeof(reason) - len, fmt, ap);
	va_end(ap);
	return invalid_program(b->err, label, reason);
}

int rp_prog_source_error(struct rp_prog_builder *b, const char *fmt, ...)
{
	char label[RP_PROG_NAME_MAX + 32], reason[REASON_MAX];
	va_list ap;

	snprintf(label, sizeof(label), "nodes[%d] (%s)", b->source, b->source_names[b->source]);
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	return invalid_program(b->err, label, reason);
}

int rp_prog_tensor_error(struct rp_prog_builder *b, int t, const char *fmt, ...)
{
	char label[RP_PROG_NAME_MAX + 32], reason[REASON_MAX];
	va_list ap;

	snprintf(label, sizeof(label), "tensors[%d] (%s)", t, b->p->tensors[t].name);
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	return invalid_program(b->err, label, reason);
}

int rp_prog_param_error(struct rp_prog_builder *b, const char *fmt, ...)
{
	char path[RP_PROG_NAME_MAX + 96];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	return rp_error_invalid_parameter(b->err, path);
}

int rp_prog_param_under(struct rp_prog_builder *b, const char *prefix)
{
	const cJSON *param = b->err->params ? cJSON_GetObjectItemCaseSensitive(b->err->params, "parameter") : NULL;
	char path[RP_PROG_NAME_MAX + 96];

	if (b->err->name == NULL || strcmp(b->err->name, RP_ERR_INVALID_PARAMETER) != 0 || !cJSON_IsString(param)) {
		return -EINVAL;
	}
	/* A getter names the whole object "parameters" when it is not one. */
	if (strcmp(param->valuestring, "parameters") == 0) {
		snprintf(path, sizeof(path), "%s", prefix);
	} else {
		snprintf(path, sizeof(path), "%s.%.*s", prefix, RP_PROG_NAME_MAX, param->valuestring);
	}
	return rp_error_invalid_parameter(b->err, path);
}

static int limit(struct rp_prog_builder *b, const char *resource, long long max, const char *what)
{
	rp_err_limit_exceeded(b->err, resource, max, "a program holds at most %lld %s%s", max, resource, what);
	return -E2BIG;
}

const char *rp_prog_shape(const struct rp_prog_tensor *t, char buf[96])
{
	size_t n = (size_t)snprintf(buf, 96, "[");

	for (int i = 0; i < t->rank && n < 96; i++) {
		n += (size_t)snprintf(buf + n, 96 - n, "%s%" PRId64, i ? ", " : "", t->shape[i]);
	}
	if (n < 96) {
		snprintf(buf + n, 96 - n, "]");
	}
	return buf;
}

/* ---- Names ------------------------------------------------------------------------- */

/* 1 to RP_PROG_NAME_MAX bytes of A-Z a-z 0-9 _ . : - (a name that reads
 * the same in a log, a Python identifier's neighbourhood and a path). */
static bool name_valid(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > RP_PROG_NAME_MAX) {
		return false;
	}
	for (const char *c = s; *c; c++) {
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
		      *c == '.' || *c == ':' || *c == '-')) {
			return false;
		}
	}
	return true;
}

static unsigned name_hash(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++) {
		h = (h ^ (unsigned char)*s) * 16777619u;
	}
	return h;
}

/* Node names: entries tagged by where the name lives (bit 0: 1 for the
 * definition's names, source_names[]; 0 for p->nodes[]). */
static const char *entry_name(struct rp_prog_builder *b, const struct rp_prog_names *nt, int entry)
{
	if (nt == &b->tensor_names) {
		return b->p->tensors[entry].name;
	}
	return entry & 1 ? b->source_names[entry >> 1] : b->p->nodes[entry >> 1].name;
}

/* The slot holding name, or the empty one where it would go. */
static unsigned names_probe(struct rp_prog_builder *b, const struct rp_prog_names *nt, const char *name)
{
	unsigned i = name_hash(name) & nt->mask;

	while (nt->slot[i] != 0 && strcmp(entry_name(b, nt, nt->slot[i] - 1), name) != 0) {
		i = (i + 1) & nt->mask;
	}
	return i;
}

/* The entry named so, or -1. */
static int names_find(struct rp_prog_builder *b, const struct rp_prog_names *nt, const char *name)
{
	return nt->slot[names_probe(b, nt, name)] - 1;
}

/* Adds entry under its name; the entry already there when taken, else -1. */
static int names_add(struct rp_prog_builder *b, struct rp_prog_names *nt, int entry)
{
	unsigned i = names_probe(b, nt, entry_name(b, nt, entry));

	if (nt->slot[i] != 0) {
		return nt->slot[i] - 1;
	}
	nt->slot[i] = entry + 1;
	return -1;
}

int rp_prog_tensor_find(struct rp_prog_builder *b, const char *name)
{
	return names_find(b, &b->tensor_names, name);
}

/* ---- Tensors ----------------------------------------------------------------------- */

size_t rp_prog_tensor_elem_size(const struct rp_prog_tensor *t)
{
	return t->kind == RP_PT_SCALAR ? 8 : rp_dtype_size(t->dtype);
}

bool rp_prog_tensor_contiguous(const struct rp_prog_tensor *t)
{
	int64_t want = 1;

	for (int i = t->rank - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->strides[i] != want) {
			return false;
		}
		want *= t->shape[i];
	}
	return true;
}

static bool is_bound(enum rp_prog_tensor_kind kind)
{
	return kind == RP_PT_INPUT || kind == RP_PT_OUTPUT || kind == RP_PT_INOUT || kind == RP_PT_SCALAR;
}

static int grow(void **array, int *cap, int need, size_t size, int max)
{
	void *more;
	int n;

	if (need <= *cap) {
		return 0;
	}
	n = *cap ? *cap * 2 : 64;
	n = n < need ? need : n > max ? max : n;
	more = realloc(*array, (size_t)n * size);
	if (more == NULL) {
		return -ENOMEM;
	}
	memset((char *)more + (size_t)*cap * size, 0, (size_t)(n - *cap) * size);
	*array = more;
	*cap = n;
	return 0;
}

/* numel, strides (when not given) and the span, each within its limit. */
static int derive_layout(struct rp_prog_builder *b, int i, bool strides_given)
{
	struct rp_prog_tensor *t = rp_prog_t(b, i);
	int64_t numel = 1, span = 0;

	for (int d = 0; d < t->rank; d++) {
		if (__builtin_mul_overflow(numel, t->shape[d], &numel) || numel > RP_PROG_NUMEL_MAX) {
			rp_err_limit_exceeded(b->err, "tensor elements", (long long)RP_PROG_NUMEL_MAX,
					      "tensors[%d] (%s) has more than %" PRId64 " elements, the most a tensor may have",
					      i, t->name, RP_PROG_NUMEL_MAX);
			return -E2BIG;
		}
	}
	t->numel = numel;
	if (!strides_given && t->rank > 0) {
		t->strides[t->rank - 1] = 1;
		for (int d = t->rank - 2; d >= 0; d--) {
			t->strides[d] = t->strides[d + 1] * t->shape[d + 1];   /* <= numel: no overflow */
		}
	}
	for (int d = 0; d < t->rank; d++) {
		int64_t reach;

		if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &reach) ||
		    __builtin_add_overflow(span, reach, &span) || span > ELEMENT_INDEX_MAX) {
			return rp_prog_tensor_error(b, i,
						    "its strides reach past element 2^53 of its memory; strides and "
						    "offsets must keep every element below that");
		}
	}
	return 0;
}

/* A view: its base defined before it, one dtype, every element inside
 * the base's extent; root and root offset from the base's. */
static int derive_view(struct rp_prog_builder *b, int i)
{
	struct rp_prog_tensor *t = rp_prog_t(b, i);
	const struct rp_prog_tensor *base = rp_prog_t(b, t->base);
	int64_t span = rp_prog_span(t), base_span = rp_prog_span(base), last;

	if (t->dtype != base->dtype) {
		return rp_prog_tensor_error(b, i, "a view is %s but its base %s is %s; a view has its base's dtype",
					    rp_dtype_name(t->dtype), base->name, rp_dtype_name(base->dtype));
	}
	if (__builtin_add_overflow(t->offset, span, &last) || last > base_span) {
		return rp_prog_tensor_error(b, i,
					    "its elements reach element %" PRId64 " of its base %s (offset %" PRId64
					    " plus %" PRId64 " from its shape and strides), but %s's last element is %" PRId64
					    "; a view lies inside its base",
					    t->offset + span, base->name, t->offset, span, base->name, base_span);
	}
	t->root = base->root;
	t->root_offset = base->root_offset + t->offset;
	return 0;
}

int rp_prog_tensor_add(struct rp_prog_builder *b, const struct rp_prog_tensor *src, bool strides_given)
{
	struct rp_program *p = b->p;
	struct rp_prog_tensor *t;
	int i = p->ntensors, r, taken;

	if (i == RP_PROG_TENSORS_MAX) {
		return limit(b, "tensors", RP_PROG_TENSORS_MAX, " after lowering; split the program");
	}
	if (grow((void **)&p->tensors, &b->tensors_cap, i + 1, sizeof(*p->tensors), RP_PROG_TENSORS_MAX) < 0) {
		return -ENOMEM;
	}
	t = &p->tensors[i];
	*t = *src;
	p->ntensors++;
	if ((taken = names_add(b, &b->tensor_names, i)) >= 0) {
		if (b->lowering) {
			return rp_prog_source_error(b,
						    "the name %s of a tensor it lowers into is taken by tensors[%d]; "
						    "rename one of them",
						    t->name, taken);
		}
		return rp_prog_tensor_error(b, i, "tensors[%d] has the same name; tensor names are unique", taken);
	}
	t->root = i;
	t->root_offset = 0;
	t->bind_index = -1;
	t->first_write = t->last_read = t->last_write = -1;
	if (t->kind != RP_PT_VIEW) {
		t->base = -1;
		t->offset = 0;
	}
	if ((r = derive_layout(b, i, strides_given)) < 0 || (t->kind == RP_PT_VIEW && (r = derive_view(b, i)) < 0)) {
		return r;
	}
	t->extent_bytes = (uint64_t)(t->root_offset + rp_prog_span(t) + 1) * rp_prog_tensor_elem_size(t);
	if (is_bound(t->kind)) {
		if (p->nbound == RP_PROG_BOUND_MAX) {
			return limit(b, "bound tensors", RP_PROG_BOUND_MAX, " (inputs, outputs, inouts and scalars together)");
		}
		t->bind_index = p->nbound;
		p->bind[p->nbound++] = i;
	}
	return i;
}

/* A list of integers in [lo, hi], at most RP_PROG_RANK_MAX. */
static int int_list(const cJSON *array, int64_t lo, int64_t hi, int64_t *out, int *count)
{
	const cJSON *item;
	int n = 0;

	if (!cJSON_IsArray(array)) {
		return -EINVAL;
	}
	cJSON_ArrayForEach(item, array) {
		double d;

		if (n == RP_PROG_RANK_MAX || !cJSON_IsNumber(item)) {
			return -EINVAL;
		}
		d = item->valuedouble;
		/* In double first: a cast of an out-of-range double is undefined. */
		if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d) {
			return -EINVAL;
		}
		out[n++] = (int64_t)d;
	}
	*count = n;
	return 0;
}

static const struct rp_field tensor_fields[] = {
	{ "name", RP_T_STRING, true },   { "kind", RP_T_STRING, true },   { "dtype", RP_T_STRING, false },
	{ "shape", RP_T_ARRAY, false },  { "strides", RP_T_ARRAY, false }, { "base", RP_T_STRING, false },
	{ "offset", RP_T_INT, false },   { NULL, 0, false },
};

static bool given(const cJSON *obj, const char *name)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);

	return item != NULL && !cJSON_IsNull(item);
}

/* What each kind may say: scalars are f64 rank 0 and nothing else;
 * intermediates are contiguous; only views have a base. */
static int tensor_fields_fit(struct rp_prog_builder *b, const cJSON *j, const char *path, enum rp_prog_tensor_kind kind)
{
	if (kind == RP_PT_SCALAR && given(j, "strides")) {
		return rp_prog_param_error(b, "%s.strides", path);
	}
	if (kind == RP_PT_INTERMEDIATE && given(j, "strides")) {
		return rp_prog_param_error(b, "%s.strides", path);
	}
	if (kind != RP_PT_VIEW && given(j, "base")) {
		return rp_prog_param_error(b, "%s.base", path);
	}
	if (kind != RP_PT_VIEW && given(j, "offset")) {
		return rp_prog_param_error(b, "%s.offset", path);
	}
	if (kind == RP_PT_VIEW && !given(j, "base")) {
		return rp_prog_param_error(b, "%s.base", path);
	}
	if (kind != RP_PT_SCALAR && !given(j, "shape")) {
		return rp_prog_param_error(b, "%s.shape", path);
	}
	if (kind != RP_PT_SCALAR && kind != RP_PT_VIEW && !given(j, "dtype")) {
		return rp_prog_param_error(b, "%s.dtype", path);
	}
	return 0;
}

static int parse_tensor(struct rp_prog_builder *b, const cJSON *j, int i)
{
	struct rp_prog_tensor t = { 0 };
	const char *name, *text;
	char path[32];
	int kind, nstrides = 0, r;
	uint64_t offset;

	snprintf(path, sizeof(path), "tensors[%d]", i);
	if (rp_params_check(j, tensor_fields, b->err) < 0) {
		return rp_prog_param_under(b, path);
	}
	if (rp_params_string(j, "name", 0, NULL, &name, b->err) < 0 || !name_valid(name)) {
		return rp_prog_param_error(b, "%s.name", path);
	}
	snprintf(t.name, sizeof(t.name), "%s", name);
	if (rp_params_enum(j, "kind", kind_names, 0, &kind, b->err) < 0) {
		return rp_prog_param_error(b, "%s.kind", path);
	}
	t.kind = (enum rp_prog_tensor_kind)kind;
	if ((r = tensor_fields_fit(b, j, path, t.kind)) < 0) {
		return r;
	}
	if (given(j, "shape") && int_list(cJSON_GetObjectItemCaseSensitive(j, "shape"), 1, RP_DIM_MAX, t.shape,
					  &t.rank) < 0) {
		return rp_prog_param_error(b, "%s.shape", path);
	}
	if (t.kind == RP_PT_SCALAR && t.rank != 0) {
		return rp_prog_param_error(b, "%s.shape", path);
	}
	if (given(j, "strides") &&
	    (int_list(cJSON_GetObjectItemCaseSensitive(j, "strides"), 0, ELEMENT_INDEX_MAX, t.strides, &nstrides) < 0 ||
	     nstrides != t.rank)) {
		return rp_prog_param_error(b, "%s.strides", path);
	}
	if (t.kind == RP_PT_VIEW) {
		if (rp_params_string(j, "base", 0, NULL, &text, b->err) != 0) {
			return rp_prog_param_error(b, "%s.base", path);
		}
		t.base = rp_prog_tensor_find(b, text);
		if (t.base < 0) {
			char label[RP_PROG_NAME_MAX + 64];

			snprintf(label, sizeof(label), "%s (%s)", path, t.name);
			return invalid_program(b->err, label, "its base is not a tensor defined before it");
		}
		if (rp_params_uint(j, "offset", (uint64_t)ELEMENT_INDEX_MAX, 0, &offset, b->err) < 0) {
			return rp_prog_param_error(b, "%s.offset", path);
		}
		t.offset = (int64_t)offset;
		t.dtype = rp_prog_t(b, t.base)->dtype;
	}
	if (t.kind == RP_PT_SCALAR) {
		t.dtype = RP_DTYPE_F64;
	}
	if (given(j, "dtype")) {
		if (rp_params_string(j, "dtype", 0, NULL, &text, b->err) != 0 || (r = rp_dtype_from_name(text)) < 0 ||
		    (t.kind == RP_PT_SCALAR && r != RP_DTYPE_F64)) {
			return rp_prog_param_error(b, "%s.dtype", path);
		}
		t.dtype = (enum rp_dtype)r;
	}
	r = rp_prog_tensor_add(b, &t, nstrides > 0);
	return r < 0 ? r : 0;
}

/* ---- Nodes ------------------------------------------------------------------------- */

int rp_prog_node_add(struct rp_prog_builder *b, const struct rp_prog_node *src)
{
	struct rp_program *p = b->p;
	int i = p->nnodes, taken;

	if (i == RP_PROG_NODES_MAX) {
		return limit(b, "nodes", RP_PROG_NODES_MAX, " after lowering; split the program");
	}
	if (grow((void **)&p->nodes, &b->nodes_cap, i + 1, sizeof(*p->nodes), RP_PROG_NODES_MAX) < 0) {
		return -ENOMEM;
	}
	p->nodes[i] = *src;
	p->nodes[i].source = b->source;
	p->nnodes++;
	if ((taken = names_add(b, &b->node_names, i << 1)) >= 0) {
		return rp_prog_source_error(b, "the node name %s is taken by %s; node names are unique", p->nodes[i].name,
					    taken & 1 ? "another of the definition's nodes" : "a node another lowered into");
	}
	return i;
}

/* "<node>.<k>": the next name the node being lowered gives out (its
 * tensors and its nodes counted apart). */
static int gen_name(struct rp_prog_builder *b, char name[RP_PROG_NAME_MAX + 1], int *counter)
{
	int n = snprintf(name, RP_PROG_NAME_MAX + 1, "%s.%d", b->source_names[b->source], (*counter)++);

	if (n > RP_PROG_NAME_MAX) {
		return rp_prog_source_error(b,
					    "its name is too long for the names of what it lowers into (\"%s.<k>\" must "
					    "fit in %d bytes); shorten it",
					    b->source_names[b->source], RP_PROG_NAME_MAX);
	}
	return 0;
}

int rp_prog_gen_tensor(struct rp_prog_builder *b, enum rp_dtype dtype, int rank, const int64_t *shape)
{
	struct rp_prog_tensor t = { .kind = RP_PT_INTERMEDIATE, .dtype = dtype, .rank = rank };
	int r;

	if ((r = gen_name(b, t.name, &b->generated_tensors)) < 0) {
		return r;
	}
	memcpy(t.shape, shape, sizeof(*shape) * (size_t)rank);
	return rp_prog_tensor_add(b, &t, false);
}

int rp_prog_gen_view(struct rp_prog_builder *b, int base, int64_t offset, int rank, const int64_t *shape,
		     const int64_t *strides)
{
	struct rp_prog_tensor t = { .kind = RP_PT_VIEW, .rank = rank, .base = base, .offset = offset };
	int r;

	if ((r = gen_name(b, t.name, &b->generated_tensors)) < 0) {
		return r;
	}
	t.dtype = rp_prog_t(b, base)->dtype;
	memcpy(t.shape, shape, sizeof(*shape) * (size_t)rank);
	memcpy(t.strides, strides, sizeof(*strides) * (size_t)rank);
	return rp_prog_tensor_add(b, &t, true);
}

int rp_prog_gen_node(struct rp_prog_builder *b, const struct rp_prog_node *src)
{
	struct rp_prog_node n = *src;
	int r;

	if ((r = gen_name(b, n.name, &b->generated_nodes)) < 0) {
		return r;
	}
	return rp_prog_node_add(b, &n);
}

/* One operand's tensor by name (or null: absent, where allowed). */
static int operand_ref(struct rp_prog_builder *b, const cJSON *item, const char *path, bool may_be_null, int *t)
{
	if (cJSON_IsNull(item) && may_be_null) {
		*t = -1;
		return 0;
	}
	if (!cJSON_IsString(item)) {
		return rp_prog_param_error(b, "%s", path);
	}
	*t = rp_prog_tensor_find(b, item->valuestring);
	if (*t < 0) {
		return rp_prog_source_error(b, "%s names tensor '%.*s', which is not declared in tensors",
					    strchr(path, '.') ? strchr(path, '.') + 1 : path, RP_PROG_NAME_MAX, item->valuestring);
	}
	return 0;
}

/* A compute node's operands: {slot: name} under inputs (the table's
 * inputs) and outputs (its outputs). */
static int compute_operands(struct rp_prog_builder *b, struct rp_prog_node *n, const cJSON *j, const char *path)
{
	const struct rp_op_spec *spec = rp_op_get((enum rp_op_id)n->op->fn);
	static const char *const lists[2] = { "inputs", "outputs" };
	char where[RP_PROG_NAME_MAX + 96];
	int r;

	n->nin = (int)spec->noperands;
	n->nout = 0;
	for (int i = 0; i < RP_PROG_NODE_IN_MAX; i++) {
		n->in[i] = -1;
	}
	for (int l = 0; l < 2; l++) {
		const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, lists[l]), *item, *other;

		cJSON_ArrayForEach(item, list) {
			int slot = rp_op_slot(spec, item->string);

			snprintf(where, sizeof(where), "%s.%s.%.*s", path, lists[l], RP_PROG_NAME_MAX, item->string);
			for (other = list->child; other != item; other = other->next) {
				if (strcmp(other->string, item->string) == 0) {
					return rp_error_invalid_parameter(b->err, where);
				}
			}
			if (slot == RP_NO_SLOT) {
				return rp_error_invalid_parameter(b->err, where);
			}
			if ((spec->operands[slot].role == RP_ROLE_OUT) != (l == 1)) {
				return rp_prog_source_error(b, "%s is an %s of %s; name it under %s", item->string,
							    l ? "input" : "output", spec->name, lists[!l]);
			}
			if ((r = operand_ref(b, item, where, !spec->operands[slot].required, &n->in[slot])) < 0) {
				return r;
			}
		}
	}
	for (unsigned s = 0; s < spec->noperands; s++) {
		if (spec->operands[s].required && n->in[s] < 0) {
			return rp_prog_param_error(b, "%s.%s.%s", path, spec->operands[s].role == RP_ROLE_OUT ? "outputs" : "inputs",
						   spec->operands[s].name);
		}
	}
	n->compute.spec = spec;
	return 0;
}

/* "relu takes 1 input, not 2"; "sgd takes 2 to 3 inputs, not 1";
 * "dropout_mask takes 1 input, not 0: [seed] -> [mask], ...". */
static int count_error(struct rp_prog_builder *b, const struct rp_prog_op *op, const char *what, int lo, int hi,
		       int given)
{
	const char *sep = op->operands ? ": " : "", *usage = op->operands ? op->operands : "";

	if (lo == hi) {
		return rp_prog_source_error(b, "%s takes %d %s%s, not %d%s%s", op->name, lo, what, lo == 1 ? "" : "s",
					    given, sep, usage);
	}
	return rp_prog_source_error(b, "%s takes %d to %d %ss, not %d%s%s", op->name, lo, hi, what, given, sep, usage);
}

/* Other nodes' operands: lists of names, in the op's order; a
 * composite's optional operands may be null (or, last, left off). */
static int listed_operands(struct rp_prog_builder *b, struct rp_prog_node *n, const cJSON *j, const char *path)
{
	const struct rp_prog_op *op = n->op;
	const cJSON *ins = cJSON_GetObjectItemCaseSensitive(j, "inputs");
	const cJSON *outs = cJSON_GetObjectItemCaseSensitive(j, "outputs");
	int nin = cJSON_GetArraySize(ins), nout = cJSON_GetArraySize(outs), k = 0, r;
	bool composite = op->cls == RP_PC_COMPOSITE;
	const cJSON *item;
	char where[96];

	if (nin < op->min_in || nin > op->max_in) {
		return count_error(b, op, "input", op->min_in, op->max_in, nin);
	}
	if (nout < op->min_out || nout > op->nout) {
		return count_error(b, op, "output", op->min_out, op->nout, nout);
	}
	for (int i = 0; i < RP_PROG_NODE_IN_MAX; i++) {
		n->in[i] = -1;
	}
	for (int i = 0; i < RP_PROG_NODE_OUT_MAX; i++) {
		n->out[i] = -1;
	}
	cJSON_ArrayForEach(item, ins) {
		snprintf(where, sizeof(where), "%s.inputs[%d]", path, k);
		if ((r = operand_ref(b, item, where, composite && rp_prog_optional(op, false, k), &n->in[k])) < 0) {
			return r;
		}
		k++;
	}
	k = 0;
	cJSON_ArrayForEach(item, outs) {
		snprintf(where, sizeof(where), "%s.outputs[%d]", path, k);
		if ((r = operand_ref(b, item, where, composite && rp_prog_optional(op, true, k), &n->out[k])) < 0) {
			return r;
		}
		k++;
	}
	n->nin = nin;
	n->nout = nout;
	return 0;
}

static int parse_node(struct rp_prog_builder *b, const cJSON *j, int i)
{
	struct rp_prog_node n = { 0 };
	const struct rp_prog_op *op;
	const char *text;
	char path[32];
	int r, taken;

	snprintf(path, sizeof(path), "nodes[%d]", i);
	if (!cJSON_IsObject(j)) {
		return rp_error_invalid_parameter(b->err, path);
	}
	if (rp_params_string(j, "op", RP_PROG_NAME_MAX, NULL, &text, b->err) != 0) {
		return rp_prog_param_error(b, "%s.op", path);
	}
	op = rp_prog_op_find(text);
	/* Name it first: the error for an unknown op names the node. */
	{
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");

		if (name != NULL && !cJSON_IsNull(name)) {
			if (!cJSON_IsString(name) || !name_valid(name->valuestring)) {
				return rp_prog_param_error(b, "%s.name", path);
			}
			snprintf(b->source_names[i], RP_PROG_NAME_MAX + 1, "%s", name->valuestring);
		} else {
			snprintf(b->source_names[i], RP_PROG_NAME_MAX + 1, "%s_%d", op ? op->name : "node", i);
		}
	}
	b->source = i;
	b->generated_tensors = b->generated_nodes = 0;
	if (op == NULL) {
		return rp_prog_source_error(b, "unknown op '%s' (docs/protocol.md, io.regen.Program, lists the ops)", text);
	}
	/* Compute nodes name their operands by slot, the others list them. */
	const enum rp_type list_type = op->cls == RP_PC_COMPUTE ? RP_T_OBJECT : RP_T_ARRAY;
	const struct rp_field fields[] = {
		{ "op", RP_T_STRING, true },   { "name", RP_T_STRING, false }, { "inputs", list_type, false },
		{ "outputs", list_type, false }, { "attrs", RP_T_OBJECT, false }, { NULL, 0, false },
	};
	if (rp_params_check(j, fields, b->err) < 0) {
		return rp_prog_param_under(b, path);
	}
	/* A primitive's name is its node's, taken when the node is added; a
	 * composite's is reserved here, its lowered nodes taking "<name>.<k>". */
	if (op->cls == RP_PC_COMPOSITE && (taken = names_add(b, &b->node_names, i << 1 | 1)) >= 0) {
		return rp_prog_source_error(b, "%s has the same name; node names are unique",
					    taken & 1 ? "an earlier node" : "a node an earlier one lowered into");
	}
	n.op = op;
	n.source = i;
	snprintf(n.name, sizeof(n.name), "%s", b->source_names[i]);
	r = op->cls == RP_PC_COMPUTE ? compute_operands(b, &n, j, path) : listed_operands(b, &n, j, path);
	if (r < 0) {
		return r;
	}
	snprintf(path, sizeof(path), "nodes[%d].attrs", i);
	const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(j, "attrs");
	if (cJSON_IsNull(attrs)) {
		attrs = NULL;
	}
	if (op->cls == RP_PC_COMPOSITE) {
		b->lowering = true;
		r = rp_prog_lower(b, &n, attrs, path);
		b->lowering = false;
		return r;
	}
	if ((r = rp_prog_read_attrs(b, &n, attrs, path)) < 0) {
		return r;
	}
	r = rp_prog_node_add(b, &n);
	return r < 0 ? r : 0;
}

static const struct rp_field program_fields[] = {
	{ "name", RP_T_STRING, false },
	{ "tensors", RP_T_ARRAY, true },
	{ "nodes", RP_T_ARRAY, true },
	{ NULL, 0, false },
};

static int compare_bound_names(const void *a, const void *b, void *program)
{
	const struct rp_program *p = program;

	return strcmp(p->tensors[p->bind[*(const int *)a]].name, p->tensors[p->bind[*(const int *)b]].name);
}

void rp_program_index_bound(struct rp_program *p)
{
	for (int i = 0; i < p->nbound; i++) {
		p->bound_by_name[i] = i;
	}
	qsort_r(p->bound_by_name, (size_t)p->nbound, sizeof(int), compare_bound_names, p);
}

static int parse(struct rp_prog_builder *b, const cJSON *params)
{
	struct rp_program *p = b->p;
	const cJSON *tensors, *nodes, *item;
	const char *name;
	int i, r;

	if (rp_params_check(params, program_fields, b->err) < 0) {
		return -EINVAL;
	}
	r = rp_params_string(params, "name", 0, NULL, &name, b->err);
	if (r < 0 || (r == 0 && !name_valid(name))) {
		return rp_error_invalid_parameter(b->err, "name");
	}
	snprintf(p->name, sizeof(p->name), "%s", r == 0 ? name : "");
	tensors = cJSON_GetObjectItemCaseSensitive(params, "tensors");
	nodes = cJSON_GetObjectItemCaseSensitive(params, "nodes");
	if (cJSON_GetArraySize(tensors) > RP_PROG_TENSORS_MAX) {
		return limit(b, "tensors", RP_PROG_TENSORS_MAX, "; split the program");
	}
	b->nsources = cJSON_GetArraySize(nodes);
	if (b->nsources > RP_PROG_NODES_MAX) {
		return limit(b, "nodes", RP_PROG_NODES_MAX, "; split the program");
	}
	b->source_names = calloc((size_t)b->nsources + 1, sizeof(*b->source_names));
	b->tensor_names.slot = calloc(NAME_SLOTS, sizeof(int));
	b->node_names.slot = calloc(NAME_SLOTS, sizeof(int));
	if (!b->source_names || !b->tensor_names.slot || !b->node_names.slot) {
		return -ENOMEM;
	}
	b->tensor_names.mask = b->node_names.mask = NAME_SLOTS - 1;
	i = 0;
	cJSON_ArrayForEach(item, tensors) {
		if ((r = parse_tensor(b, item, i++)) < 0) {
			return r;
		}
	}
	i = 0;
	cJSON_ArrayForEach(item, nodes) {
		if ((r = parse_node(b, item, i++)) < 0) {
			return r;
		}
	}
	if ((r = rp_prog_check(b)) < 0) {
		return r;
	}
	rp_program_index_bound(p);
	p->definition = cJSON_Duplicate(params, true);
	return p->definition ? 0 : -ENOMEM;
}

int rp_program_parse(const cJSON *params, struct rp_program *p, struct rp_error *err)
{
	struct rp_prog_builder b = { .p = p, .err = err, .source = -1 };
	int r;

	memset(p, 0, sizeof(*p));
	r = parse(&b, params);
	free(b.source_names);
	free(b.tensor_names.slot);
	free(b.node_names.slot);
	if (r < 0) {
		rp_program_finish(p);
	}
	return r;
}

void rp_program_finish(struct rp_program *p)
{
	if (p == NULL) {
		return;
	}
	free(p->tensors);
	free(p->nodes);
	cJSON_Delete(p->definition);
	memset(p, 0, sizeof(*p));
}

/* "[1, 3]": the multi-index of row-major position l in t. */
void rp_prog_format_position(const struct rp_prog_tensor *t, int64_t l, char *out, size_t size)
{
	int64_t idx[RP_PROG_RANK_MAX];
	size_t len = 0;

	for (int d = t->rank - 1; d >= 0; d--) {
		idx[d] = l % t->shape[d];
		l /= t->shape[d];
	}
	out[0] = '\0';
	for (int d = 0; d < t->rank && len < size; d++)
		len += (size_t)snprintf(out + len, size - len, "%s%lld", d ? ", " : "[", (long long)idx[d]);
	if (t->rank && len < size)
		snprintf(out + len, size - len, "]");
}
