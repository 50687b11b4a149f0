/* io.regen.Program.Run's parameters, parsed against the program they run:
 * every bound tensor named once (buffers for inputs, outputs and inouts,
 * numbers for scalars), nothing else named, and the events and deadline
 * every call takes. Buffers are resolved and checked against their extents
 * by the worker; this file sees only ids and offsets. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "params.h"
#include "program.h"

/* JSON's exact integers: no byte offset goes past them. */
#define OFFSET_MAX (UINT64_C(1) << 53)

static const struct rp_field run_fields[] = {
	{ "program", RP_T_STRING, true },
	{ "bind", RP_T_OBJECT, true },
	{ "scalars", RP_T_OBJECT, false },
	{ "wait_event", RP_T_STRING, false },
	{ "signal_event", RP_T_STRING, false },
	{ "deadline_ms", RP_T_INT, false },
	{ "journal", RP_T_OBJECT, false },
	{ "seq", RP_T_INT, false },
	{ "retry", RP_T_BOOL, false },
	{ NULL, 0, false },
};

static const struct rp_field binding_fields[] = {
	{ "buffer", RP_T_STRING, true },
	{ "offset", RP_T_INT, false },
	{ NULL, 0, false },
};

static int bad(struct rp_error *err, const char *list, const char *name, const char *field)
{
	char path[RP_PROG_NAME_MAX * 2 + 32];

	snprintf(path, sizeof(path), "%s.%.*s%s%s", list, RP_PROG_NAME_MAX * 2, name, field ? "." : "", field ? field : "");
	return rp_error_invalid_parameter(err, path);
}

int rp_program_run_id(const cJSON *params, struct rp_id *id, struct rp_error *err)
{
	const cJSON *item = cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, "program") : NULL;

	memset(id, 0, sizeof(*id));
	if (!cJSON_IsString(item) || rp_id_parse(item->valuestring, id) < 0 || id->kind != RP_ID_PROGRAM) {
		memset(id, 0, sizeof(*id));
		return rp_error_invalid_parameter(err, "program");
	}
	return 0;
}

/* The bound tensor named so, or -1. */
static int bound_find(const struct rp_program *p, const char *name)
{
	int lo = 0, hi = p->nbound - 1;

	while (lo <= hi) {
		const int mid = lo + (hi - lo) / 2, i = p->bound_by_name[mid];
		const int c = strcmp(name, p->tensors[p->bind[i]].name);
		if (c == 0) {
			return i;
		}
		if (c < 0) {
			hi = mid - 1;
		} else {
			lo = mid + 1;
		}
	}
	return -1;
}

static int parse_binding(const struct rp_program *p, const cJSON *item, struct rp_program_run *run, bool *seen,
			 struct rp_error *err)
{
	const int i = bound_find(p, item->string);
	const struct rp_prog_tensor *t = i >= 0 ? &p->tensors[p->bind[i]] : NULL;
	struct rp_prog_binding *b;
	const char *buffer;
	uint64_t offset;
	size_t elem;

	if (t == NULL || t->kind == RP_PT_SCALAR || seen[i]) {
		return bad(err, "bind", item->string, NULL);
	}
	if (rp_params_check(item, binding_fields, err) < 0) {
		const cJSON *param = err->params ? cJSON_GetObjectItemCaseSensitive(err->params, "parameter") : NULL;

		return bad(err, "bind", item->string,
			   cJSON_IsString(param) && strcmp(param->valuestring, "parameters") != 0 ? param->valuestring : NULL);
	}
	b = &run->bind[i];
	if (rp_params_string(item, "buffer", 0, NULL, &buffer, err) != 0 || rp_id_parse(buffer, &b->buffer) < 0 ||
	    b->buffer.kind != RP_ID_BUFFER) {
		return bad(err, "bind", item->string, "buffer");
	}
	if (rp_params_uint(item, "offset", OFFSET_MAX, 0, &offset, err) < 0) {
		return bad(err, "bind", item->string, "offset");
	}
	elem = rp_prog_tensor_elem_size(t);
	if (offset % elem != 0) {
		return rp_error_invalid_operand(err, t->name,
						"misaligned: offset %" PRIu64 " into buffer %s is not a multiple of %zu, the size of %s",
						offset, buffer, elem, rp_dtype_name(t->dtype));
	}
	b->offset = offset;
	seen[i] = true;
	return 0;
}

static int parse_scalar(const struct rp_program *p, const cJSON *item, struct rp_program_run *run, bool *seen,
			struct rp_error *err)
{
	const int i = bound_find(p, item->string);

	if (i < 0 || p->tensors[p->bind[i]].kind != RP_PT_SCALAR || seen[i] || !cJSON_IsNumber(item) ||
	    !isfinite(item->valuedouble)) {
		return bad(err, "scalars", item->string, NULL);
	}
	run->scalars[i] = item->valuedouble;
	seen[i] = true;
	return 0;
}

/* journal, seq and retry: a journal and a seq together, a retry only with
 * them; the journal 8-byte aligned (its header's words). */
static int parse_journal(const cJSON *params, struct rp_program_run *run, struct rp_error *err)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(params, "journal");
	const char *buffer;
	int r;

	if ((r = rp_params_uint(params, "seq", OFFSET_MAX, 0, &run->seq, err)) < 0 ||
	    (r = rp_params_bool(params, "retry", false, &run->retry, err)) < 0)
		return r;
	run->has_journal = j != NULL && !cJSON_IsNull(j);
	if (run->has_journal != cJSON_HasObjectItem(params, "seq"))
		return rp_error_invalid_parameter(err, run->has_journal ? "seq" : "journal");
	if (run->retry && !run->has_journal)
		return rp_error_invalid_parameter(err, "retry");
	if (!run->has_journal)
		return 0;
	if (rp_params_check(j, binding_fields, err) < 0 || rp_params_string(j, "buffer", 0, NULL, &buffer, err) < 0 ||
	    rp_id_parse(buffer, &run->journal.buffer) < 0 || run->journal.buffer.kind != RP_ID_BUFFER)
		return rp_error_invalid_parameter(err, "journal.buffer");
	if (rp_params_uint(j, "offset", OFFSET_MAX, 0, &run->journal.offset, err) < 0 || run->journal.offset % 8 != 0)
		return rp_error_invalid_parameter(err, "journal.offset");
	return 0;
}

static int parse(const struct rp_program *p, const cJSON *params, struct rp_program_run *run, bool *seen,
		 struct rp_error *err)
{
	const cJSON *bind, *scalars, *item;
	int r;

	if ((r = rp_params_check(params, run_fields, err)) < 0 || (r = rp_program_run_id(params, &run->program, err)) < 0 ||
	    (r = rp_compute_parse_common(params, &run->wait_event, &run->signal_event, &run->deadline_ms, err)) < 0 ||
	    (r = parse_journal(params, run, err)) < 0) {
		return r;
	}
	bind = cJSON_GetObjectItemCaseSensitive(params, "bind");
	scalars = cJSON_GetObjectItemCaseSensitive(params, "scalars");
	/* seen[] also refuses a name given twice (cJSON would take the
	 * first, another parser the last). */
	cJSON_ArrayForEach(item, bind) {
		if ((r = parse_binding(p, item, run, seen, err)) < 0) {
			return r;
		}
	}
	cJSON_ArrayForEach(item, scalars) {
		if ((r = parse_scalar(p, item, run, seen, err)) < 0) {
			return r;
		}
	}
	for (int i = 0; i < p->nbound; i++) {
		if (!seen[i]) {
			const struct rp_prog_tensor *t = &p->tensors[p->bind[i]];

			return bad(err, t->kind == RP_PT_SCALAR ? "scalars" : "bind", t->name, NULL);
		}
	}
	return 0;
}

int rp_program_run_parse(const struct rp_program *p, const cJSON *params, struct rp_program_run *run,
			 struct rp_error *err)
{
	/* One entry at least: calloc(0) may give NULL. */
	const size_t n = p->nbound > 0 ? (size_t)p->nbound : 1;
	bool *seen;
	int r;

	memset(run, 0, sizeof(*run));
	run->bind = calloc(n, sizeof(*run->bind));
	run->scalars = calloc(n, sizeof(*run->scalars));
	seen = calloc(n, sizeof(*seen));
	if (run->bind == NULL || run->scalars == NULL || seen == NULL) {
		free(seen);
		rp_program_run_finish(run);
		return -ENOMEM;
	}
	run->nbound = p->nbound;
	r = parse(p, params, run, seen, err);
	free(seen);
	if (r < 0) {
		rp_program_run_finish(run);
	}
	return r;
}

void rp_program_run_finish(struct rp_program_run *run)
{
	if (run == NULL) {
		return;
	}
	free(run->bind);
	free(run->scalars);
	memset(run, 0, sizeof(*run));
}

/* ---- The spec the worker's generic path knows a Run by ---------------------------------- */

static const struct rp_field no_scalars[] = {
	{ NULL, 0, false },
};

/* A Run's parameters are the program's, not a table's: rp_program_run_parse
 * reads them; these are never asked for anything. */
static int no_read_scalars(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	(void)params;
	(void)c;
	(void)err;
	return 0;
}

static int no_check(struct rp_compute *c, struct rp_error *err)
{
	(void)c;
	(void)err;
	return 0;
}

static void no_encode(const struct rp_compute *c, cJSON *params)
{
	(void)c;
	(void)params;
}

const struct rp_op_spec rp_op_program_run = {
	.id = RP_OP_PROGRAM,
	.method = "io.regen.Program.Run",
	.name = "program",
	.noperands = 0,
	.operands = NULL,
	.scalars = no_scalars,
	.read_scalars = no_read_scalars,
	.check = no_check,
	.encode = no_encode,
};
