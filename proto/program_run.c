/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program.Run's parameters, parsed against the program they run:
 * every bound tensor named once (buffers for inputs, outputs and inouts,
 * numbers for scalars), nothing else named, and the events and deadline
 * every call takes. Buffers are resolved and checked against their extents
 * by the worker; this file sees only ids and offsets. The checks of each
 * binding, scalar and journal are the rp_program_run_* steps, which a
 * ring's records (ring_run.c) go through as well: one set of rules and
 * errors for both transports. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "params.h"
#include "philox.h"
#include "program.h"
#include "program_journal.h"

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

static const struct rp_field journal_fields[] = {
	{ "buffer", RP_T_STRING, true },
	{ "offset", RP_T_INT, false },
	{ "mode", RP_T_STRING, false },
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

/* ---- The checks every parser of a Run goes through (program.h) ----------------------- */

int rp_program_run_alloc(const struct rp_program *p, struct rp_program_run *run, bool **seen)
{
	/* One entry at least: calloc(0) may give NULL. */
	const size_t n = p->nbound > 0 ? (size_t)p->nbound : 1;

	memset(run, 0, sizeof(*run));
	run->bind = calloc(n, sizeof(*run->bind));
	run->scalars = calloc(n, sizeof(*run->scalars));
	*seen = calloc(n, sizeof(**seen));
	if (run->bind == NULL || run->scalars == NULL || *seen == NULL) {
		free(*seen);
		*seen = NULL;
		rp_program_run_finish(run);
		return -ENOMEM;
	}
	run->nbound = p->nbound;
	return 0;
}

int rp_program_run_bind(const struct rp_program *p, int i, const struct rp_id *buffer, uint64_t offset,
			struct rp_program_run *run, bool *seen, struct rp_error *err)
{
	const struct rp_prog_tensor *t = &p->tensors[p->bind[i]];
	struct rp_prog_binding *b = &run->bind[i];
	char id[RP_ID_MAX];
	size_t elem;

	/* seen[] also refuses a name given twice (cJSON would take the
	 * first, another parser the last). */
	if (t->kind == RP_PT_SCALAR || seen[i]) {
		return bad(err, "bind", t->name, NULL);
	}
	if (buffer->kind != RP_ID_BUFFER) {
		return bad(err, "bind", t->name, "buffer");
	}
	if (offset > OFFSET_MAX) {
		return bad(err, "bind", t->name, "offset");
	}
	elem = rp_prog_tensor_elem_size(t);
	if (offset % elem != 0) {
		return rp_error_invalid_operand(err, t->name,
						"misaligned: offset %" PRIu64 " into buffer %s is not a multiple of %zu, the size of %s",
						offset, rp_id_format(buffer, id), elem, rp_dtype_name(t->dtype));
	}
	b->buffer = *buffer;
	b->offset = offset;
	seen[i] = true;
	return 0;
}

int rp_program_run_scalar(const struct rp_program *p, int i, double value, struct rp_program_run *run, bool *seen,
			  struct rp_error *err)
{
	const struct rp_prog_tensor *t = &p->tensors[p->bind[i]];

	if (t->kind != RP_PT_SCALAR || seen[i] || !isfinite(value)) {
		return bad(err, "scalars", t->name, NULL);
	}
	/* A seed is a Philox key (proto/philox.h): a fraction or a value past
	 * f64's exact integers would stand for another seed. */
	if (t->seed && !(value >= 0 && value < RP_DROPOUT_SEED_LIMIT && value == trunc(value))) {
		return bad(err, "scalars", t->name, NULL);
	}
	run->scalars[i] = value;
	seen[i] = true;
	return 0;
}

/* A journal and a seq together, a retry and a mode only with them; the
 * journal 8-byte aligned (its header's words). */
int rp_program_run_journal(struct rp_program_run *run, bool has_journal, const struct rp_id *buffer, uint64_t offset,
			   enum rp_prog_journal_mode mode, bool has_seq, uint64_t seq, bool retry, struct rp_error *err)
{
	if (seq > OFFSET_MAX)
		return rp_error_invalid_parameter(err, "seq");
	if (has_journal != has_seq)
		return rp_error_invalid_parameter(err, has_journal ? "seq" : "journal");
	if (retry && !has_journal)
		return rp_error_invalid_parameter(err, "retry");
	if ((mode != RP_JOURNAL_COPY && !has_journal) || (mode != RP_JOURNAL_COPY && mode != RP_JOURNAL_MARKS))
		return rp_error_invalid_parameter(err, "journal.mode");
	run->has_journal = has_journal;
	run->journal_mode = mode;
	run->seq = seq;
	run->retry = retry;
	if (!has_journal)
		return 0;
	if (buffer->kind != RP_ID_BUFFER)
		return rp_error_invalid_parameter(err, "journal.buffer");
	if (offset > OFFSET_MAX || offset % 8 != 0)
		return rp_error_invalid_parameter(err, "journal.offset");
	run->journal.buffer = *buffer;
	run->journal.offset = offset;
	return 0;
}

static void run_torn(struct rp_error *err, const struct rp_program *p, const struct rp_id *program, uint64_t seq)
{
	char id[RP_ID_MAX];

	rp_err_run_torn(err, rp_id_format(program, id), (long long)seq,
			"Run %" PRIu64 " of program '%s' was cut by a fault of regend's after it began writing its inouts; "
			"its journal holds marks only (mode marks), no copy to put them back from, so nothing was "
			"retried: the inouts may hold part of the update (load them from a checkpoint)",
			seq, p->name);
}

static void run_mode_changed(struct rp_error *err, const struct rp_program *p, uint64_t seq)
{
	rp_error_set(err, RP_ERR_INVALID_PARAMETER,
		     "Run %" PRIu64 " of program '%s' saved copies of its inouts in its journal (mode copy): retry it in "
		     "mode copy, with the journal it had", seq, p->name);
	rp_error_add_str(err, "parameter", "journal.mode");
}

enum rp_prog_journal_retry rp_program_journal_retry(const struct rp_prog_journal_header *h, uint64_t seq,
						     enum rp_prog_journal_mode mode, const struct rp_program *p,
						     const struct rp_id *program, struct rp_error *err)
{
	if (h->magic != RP_PROG_JOURNAL_MAGIC || h->seq != seq)
		return RP_RETRY_RUN;
	switch (h->state) {
	case RP_JOURNAL_DONE:
		return RP_RETRY_APPLIED;
	case RP_JOURNAL_BEGUN:
		run_torn(err, p, program, seq);
		return RP_RETRY_TORN;
	case RP_JOURNAL_SAVED:
		if (mode != RP_JOURNAL_COPY) {
			run_mode_changed(err, p, seq);
			return RP_RETRY_MODE_CHANGED;
		}
		return RP_RETRY_RESTORE;
	default:
		return RP_RETRY_RUN;
	}
}

int rp_program_run_complete(const struct rp_program *p, const bool *seen, struct rp_error *err)
{
	for (int i = 0; i < p->nbound; i++) {
		if (!seen[i]) {
			const struct rp_prog_tensor *t = &p->tensors[p->bind[i]];

			return bad(err, t->kind == RP_PT_SCALAR ? "scalars" : "bind", t->name, NULL);
		}
	}
	return 0;
}

/* ---- Varlink's parameters --------------------------------------------------------------- */

static int parse_binding(const struct rp_program *p, const cJSON *item, struct rp_program_run *run, bool *seen,
			 struct rp_error *err)
{
	const int i = bound_find(p, item->string);
	const struct rp_prog_tensor *t = i >= 0 ? &p->tensors[p->bind[i]] : NULL;
	struct rp_id buffer = { 0 };
	const char *text;
	uint64_t offset;

	if (t == NULL || t->kind == RP_PT_SCALAR || seen[i]) {
		return bad(err, "bind", item->string, NULL);
	}
	if (rp_params_check(item, binding_fields, err) < 0) {
		const cJSON *param = err->params ? cJSON_GetObjectItemCaseSensitive(err->params, "parameter") : NULL;

		return bad(err, "bind", item->string,
			   cJSON_IsString(param) && strcmp(param->valuestring, "parameters") != 0 ? param->valuestring : NULL);
	}
	/* The kind is looked at here too, so that a binding wrong twice is
	 * refused for its buffer first, as the shared check orders it. */
	if (rp_params_string(item, "buffer", 0, NULL, &text, err) != 0 || rp_id_parse(text, &buffer) < 0 ||
	    buffer.kind != RP_ID_BUFFER) {
		return bad(err, "bind", item->string, "buffer");
	}
	if (rp_params_uint(item, "offset", OFFSET_MAX, 0, &offset, err) < 0) {
		return bad(err, "bind", item->string, "offset");
	}
	return rp_program_run_bind(p, i, &buffer, offset, run, seen, err);
}

static int parse_scalar(const struct rp_program *p, const cJSON *item, struct rp_program_run *run, bool *seen,
			struct rp_error *err)
{
	const int i = bound_find(p, item->string);

	if (i < 0 || !cJSON_IsNumber(item)) {
		return bad(err, "scalars", item->string, NULL);
	}
	return rp_program_run_scalar(p, i, item->valuedouble, run, seen, err);
}

/* The journal's mode by its name: "copy" (the default) or "marks". */
static int parse_journal_mode(const cJSON *j, enum rp_prog_journal_mode *mode, struct rp_error *err)
{
	static const char *const modes[] = { [RP_JOURNAL_COPY] = "copy", [RP_JOURNAL_MARKS] = "marks", NULL };
	int m;

	if (rp_params_enum(j, "mode", modes, RP_JOURNAL_COPY, &m, err) < 0)
		return rp_error_invalid_parameter(err, "journal.mode");
	*mode = (enum rp_prog_journal_mode)m;
	return 0;
}

static int parse_journal(const cJSON *params, struct rp_program_run *run, struct rp_error *err)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(params, "journal");
	const bool has_journal = j != NULL && !cJSON_IsNull(j);
	enum rp_prog_journal_mode mode = RP_JOURNAL_COPY;
	struct rp_id buffer = { 0 };
	uint64_t seq, offset = 0;
	const char *text;
	bool retry;
	int r;

	if ((r = rp_params_uint(params, "seq", OFFSET_MAX, 0, &seq, err)) < 0 ||
	    (r = rp_params_bool(params, "retry", false, &retry, err)) < 0)
		return r;
	/* What the journal's object holds is read only where the rest
	 * allows a journal: the shared checks come first. */
	if (has_journal != cJSON_HasObjectItem(params, "seq") || (retry && !has_journal))
		return rp_program_run_journal(run, has_journal, &buffer, 0, RP_JOURNAL_COPY,
					      cJSON_HasObjectItem(params, "seq"), seq, retry, err);
	if (has_journal) {
		if (rp_params_check(j, journal_fields, err) < 0) {
			const cJSON *param = err->params ? cJSON_GetObjectItemCaseSensitive(err->params, "parameter") : NULL;
			char path[RP_PROG_NAME_MAX + 16];

			/* The field the check names, inside the journal. */
			snprintf(path, sizeof(path), "journal.%.*s", RP_PROG_NAME_MAX,
				 cJSON_IsString(param) ? param->valuestring : "buffer");
			return rp_error_invalid_parameter(err, path);
		}
		if (rp_params_string(j, "buffer", 0, NULL, &text, err) < 0 || rp_id_parse(text, &buffer) < 0 ||
		    buffer.kind != RP_ID_BUFFER)
			return rp_error_invalid_parameter(err, "journal.buffer");
		if (rp_params_uint(j, "offset", OFFSET_MAX, 0, &offset, err) < 0)
			return rp_error_invalid_parameter(err, "journal.offset");
		if ((r = parse_journal_mode(j, &mode, err)) < 0)
			return r;
	}
	return rp_program_run_journal(run, has_journal, &buffer, offset, mode, has_journal, seq, retry, err);
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
	return rp_program_run_complete(p, seen, err);
}

int rp_program_run_parse(const struct rp_program *p, const cJSON *params, struct rp_program_run *run,
			 struct rp_error *err)
{
	bool *seen;
	int r = rp_program_run_alloc(p, run, &seen);

	if (r < 0) {
		return r;
	}
	r = parse(p, params, run, seen, err);
	free(seen);
	if (r < 0) {
		rp_program_run_finish(run);
	}
	return r;
}

cJSON *rp_program_run_to_json(const struct rp_program *p, const struct rp_program_run *run)
{
	cJSON *params = cJSON_CreateObject(), *bind = NULL, *scalars = NULL;
	char id[RP_ID_MAX];

	if (params == NULL)
		return NULL;
	cJSON_AddStringToObject(params, "program", rp_id_format(&run->program, id));
	bind = cJSON_AddObjectToObject(params, "bind");
	for (int i = 0; i < p->nbound && bind != NULL; i++) {
		const struct rp_prog_tensor *t = &p->tensors[p->bind[i]];
		cJSON *b;

		if (t->kind == RP_PT_SCALAR) {
			if (scalars == NULL)
				scalars = cJSON_AddObjectToObject(params, "scalars");
			cJSON_AddNumberToObject(scalars, t->name, run->scalars[i]);
			continue;
		}
		b = cJSON_AddObjectToObject(bind, t->name);
		cJSON_AddStringToObject(b, "buffer", rp_id_format(&run->bind[i].buffer, id));
		cJSON_AddNumberToObject(b, "offset", (double)run->bind[i].offset);
	}
	if (run->wait_event.present)
		cJSON_AddStringToObject(params, "wait_event", rp_id_format(&run->wait_event.id, id));
	if (run->signal_event.present)
		cJSON_AddStringToObject(params, "signal_event", rp_id_format(&run->signal_event.id, id));
	if (run->deadline_ms)
		cJSON_AddNumberToObject(params, "deadline_ms", run->deadline_ms);
	if (run->has_journal) {
		cJSON *j = cJSON_AddObjectToObject(params, "journal");

		cJSON_AddStringToObject(j, "buffer", rp_id_format(&run->journal.buffer, id));
		cJSON_AddNumberToObject(j, "offset", (double)run->journal.offset);
		if (run->journal_mode == RP_JOURNAL_MARKS)
			cJSON_AddStringToObject(j, "mode", "marks");
		cJSON_AddNumberToObject(params, "seq", (double)run->seq);
		if (run->retry)
			cJSON_AddTrueToObject(params, "retry");
	}
	return params;
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
