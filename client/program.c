/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: programs (io.regen.Program). A program is defined once from
 * Define's parameters and run per step on its device's lane: its bindings
 * and scalars are named by the tensors' names, which Define's reply lists in
 * binding order, and travel by position over the ring (proto/ring.h) or by
 * name as a Varlink call (lane.c picks, as for compute calls). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "private.h"
#include "proto/program.h"

static void program_free(struct regen_program *p)
{
	if (p == NULL)
		return;
	for (uint32_t i = 0; i < p->nbound; i++)
		free(p->bound[i]);
	free(p->bound);
	free(p);
}

/* Define's reply: the program's id, its bound names, its journal's size. */
static int take_reply(regen_client *c, const cJSON *reply, struct regen_program *p, struct rp_id *rid)
{
	const cJSON *id = cJSON_GetObjectItemCaseSensitive(reply, "program");
	const cJSON *bound = cJSON_GetObjectItemCaseSensitive(reply, "bound");
	const cJSON *journal = cJSON_GetObjectItemCaseSensitive(reply, "journal_bytes"), *it;
	int n = cJSON_GetArraySize(bound);

	if (!cJSON_IsString(id) || rp_id_parse(id->valuestring, rid) < 0 || rid->kind != RP_ID_PROGRAM ||
	    !cJSON_IsArray(bound)) {
		rc_set_local_error(c, "io.regen.Program.Define: malformed reply (program, bound)");
		return -EPROTO;
	}
	p->bound = calloc((size_t)n + 1, sizeof(*p->bound));
	if (p->bound == NULL)
		return -ENOMEM;
	cJSON_ArrayForEach(it, bound) {
		if (!cJSON_IsString(it)) {
			rc_set_local_error(c, "io.regen.Program.Define: malformed reply (bound)");
			return -EPROTO;
		}
		p->bound[p->nbound] = strdup(it->valuestring);
		if (p->bound[p->nbound++] == NULL)
			return -ENOMEM;
	}
	p->journal_bytes = cJSON_IsNumber(journal) && journal->valuedouble > 0 ? (uint64_t)journal->valuedouble : 0;
	return 0;
}

REGEN_EXPORT int regen_program_define(regen_client *c, int device, const char *definition, regen_program **out)
{
	struct regen_program *p;
	cJSON *params, *reply = NULL;
	struct rp_id rid;
	int r;

	if (out != NULL)
		*out = NULL;
	if (c == NULL || definition == NULL || out == NULL || device < 0 || device >= REGEN_DEVICES_MAX)
		return -EINVAL;
	params = cJSON_Parse(definition);
	if (!cJSON_IsObject(params)) {
		cJSON_Delete(params);
		rc_set_local_error(c, "the program's definition is not a JSON object");
		return -EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL) {
		cJSON_Delete(params);
		return -ENOMEM;
	}
	r = rc_call(c, device, "io.regen.Program.Define", params, NULL, 0, &reply);
	cJSON_Delete(params);
	if (r == 0)
		r = take_reply(c, reply, p, &rid);
	cJSON_Delete(reply);
	if (r < 0) {
		/* Defined but not kept here: regend drops it with this
		 * process's last connection, as any of its objects. */
		program_free(p);
		return r;
	}
	rc_object_add(c, &p->obj, device, &rid);
	*out = p;
	return 0;
}

REGEN_EXPORT const char *regen_program_id(const regen_program *p)
{
	return p != NULL ? p->obj.id : NULL;
}

REGEN_EXPORT int regen_program_device(const regen_program *p)
{
	return p != NULL ? p->obj.device : -1;
}

REGEN_EXPORT uint64_t regen_program_journal_bytes(const regen_program *p)
{
	return p != NULL ? p->journal_bytes : 0;
}

REGEN_EXPORT int regen_program_drop(regen_program *p)
{
	regen_client *c;
	cJSON *params;
	int r = 0;

	if (p == NULL)
		return 0;
	rc_check_fork(p->obj.client);
	c = p->obj.client;
	if (c != NULL) {
		/* A queued Run names it: the Run is taken first, and its index
		 * is not given to another id while one might. */
		r = rc_lane_drain(c, p->obj.device);
		rc_lane_forget(c, p->obj.device, &p->obj.rid);
		params = cJSON_CreateObject();
		if (params == NULL || cJSON_AddStringToObject(params, "program", p->obj.id) == NULL)
			r = -ENOMEM;
		else if (r == 0)
			r = rc_call(c, p->obj.device, "io.regen.Program.Drop", params, NULL, 0, NULL);
		cJSON_Delete(params);
	}
	rc_object_unlink(&p->obj);
	program_free(p);
	return r;
}

/* The position of `name` in the program's binding order, looking from
 * `from` on first (callers that list the tensors in order find each at
 * once); -1 when the program binds no such tensor. */
static int position_of(const struct regen_program *p, const char *name, uint32_t from)
{
	for (uint32_t k = 0; k < p->nbound; k++) {
		uint32_t i = (from + k) % p->nbound;

		if (strcmp(p->bound[i], name) == 0)
			return (int)i;
	}
	return -1;
}

/* An object the Run names: this client's, on the program's device. */
static int check_object(regen_client *c, const struct regen_program *p, const struct rc_object *obj, const char *what,
			const char *name)
{
	if (obj->client != c) {
		rc_set_local_error(c, "%s %s: %s belongs to %s", what, name, obj->id,
				   obj->client == NULL ? "no client here" : "another client");
		return -EINVAL;
	}
	if (obj->device != p->obj.device) {
		rc_set_local_error(c, "%s %s is on device %d, program %s on device %d", what, name, obj->device,
				   p->obj.id, p->obj.device);
		return -EINVAL;
	}
	return 0;
}

/* What JSON says exactly: a larger offset or seq would reach regend as
 * another number over Varlink, and be refused over the ring. */
#define EXACT_MAX (UINT64_C(1) << 53)

static int put_run(regen_client *c, const struct regen_program_run_args *a, struct rc_run *run,
		   struct rc_run_binding *bind, struct rc_run_scalar *scalars)
{
	const struct regen_program *p = a->program;
	uint32_t next = 0;
	int pos;

	for (size_t i = 0; i < a->nbind; i++) {
		const struct regen_program_binding *b = &a->bind[i];

		if (b->name == NULL || b->buffer == NULL) {
			rc_set_local_error(c, "binding %zu has no name or no buffer", i);
			return -EINVAL;
		}
		if ((pos = position_of(p, b->name, next)) < 0) {
			rc_set_local_error(c, "program %s binds no tensor '%s'", p->obj.id, b->name);
			return -EINVAL;
		}
		if (check_object(c, p, &b->buffer->obj, "binding", b->name) < 0)
			return -EINVAL;
		if (b->offset > EXACT_MAX) {
			rc_set_local_error(c, "binding %s: offset %llu is past 2^53", b->name,
					   (unsigned long long)b->offset);
			return -EINVAL;
		}
		bind[i] = (struct rc_run_binding){ .bound = (uint32_t)pos, .name = p->bound[pos], .buffer = b->buffer->obj.rid,
						    .offset = b->offset };
		next = (uint32_t)pos + 1;
	}
	for (size_t i = 0; i < a->nscalars; i++) {
		const struct regen_program_scalar *s = &a->scalars[i];

		if (s->name == NULL || (pos = position_of(p, s->name, next)) < 0) {
			rc_set_local_error(c, "program %s has no scalar '%s'", p->obj.id, s->name ? s->name : "(null)");
			return -EINVAL;
		}
		/* JSON has no words for a NaN or an infinity: refused here,
		 * unsent, on either transport. */
		if (!isfinite(s->value)) {
			rc_set_local_error(c, "scalar %s must be finite", s->name);
			return -EINVAL;
		}
		scalars[i] = (struct rc_run_scalar){ .bound = (uint32_t)pos, .name = p->bound[pos], .value = s->value };
		next = (uint32_t)pos + 1;
	}
	if (a->seq > EXACT_MAX || a->journal_offset > EXACT_MAX) {
		rc_set_local_error(c, "the Run's seq and journal_offset must not pass 2^53");
		return -EINVAL;
	}
	if (a->journal_marks && a->journal == NULL) {
		rc_set_local_error(c, "journal_marks names a journal's mode: the Run has no journal");
		return -EINVAL;
	}
	if ((a->wait_event && check_object(c, p, &a->wait_event->obj, "event", "wait_event") < 0) ||
	    (a->signal_event && check_object(c, p, &a->signal_event->obj, "event", "signal_event") < 0) ||
	    (a->journal && check_object(c, p, &a->journal->obj, "buffer", "journal") < 0))
		return -EINVAL;
	*run = (struct rc_run){
		.program = p->obj.rid, .deadline_ms = a->deadline_ms, .has_journal = a->journal != NULL,
		.journal_offset = a->journal_offset, .seq = a->seq, .retry = a->retry,
		.journal_marks = a->journal_marks, .bind = bind,
		.nbind = (unsigned)a->nbind, .scalars = scalars, .nscalars = (unsigned)a->nscalars,
	};
	if (a->wait_event)
		run->wait_event = a->wait_event->obj.rid;
	if (a->signal_event)
		run->signal_event = a->signal_event->obj.rid;
	if (a->journal)
		run->journal = a->journal->obj.rid;
	return 0;
}

REGEN_EXPORT int regen_program_run_submit(regen_client *c, const struct regen_program_run_args *args,
					  uint64_t *ticket)
{
	struct rc_run_binding *bind;
	struct rc_run_scalar *scalars;
	struct rc_run run;
	int r;

	if (c == NULL || args == NULL || args->program == NULL || (args->nbind && args->bind == NULL) ||
	    (args->nscalars && args->scalars == NULL))
		return -EINVAL;
	/* Before the objects are checked: in a forked child the parent's are
	 * not this client's any more. */
	rc_check_fork(c);
	if (args->nbind + args->nscalars > args->program->nbound) {
		rc_set_local_error(c, "program %s binds %u tensors; the Run names %zu", args->program->obj.id,
				   args->program->nbound, args->nbind + args->nscalars);
		return -EINVAL;
	}
	bind = calloc(args->nbind + 1, sizeof(*bind));
	scalars = calloc(args->nscalars + 1, sizeof(*scalars));
	if (bind == NULL || scalars == NULL) {
		r = -ENOMEM;
		goto out;
	}
	r = put_run(c, args, &run, bind, scalars);
	if (r == 0)
		r = rc_lane_submit_run(c, args->program->obj.device, &run, ticket);
out:
	free(bind);
	free(scalars);
	return r;
}

REGEN_EXPORT int regen_program_run(regen_client *c, const struct regen_program_run_args *args)
{
	uint64_t ticket;
	int r = regen_program_run_submit(c, args, &ticket);

	if (r < 0)
		return r;
	return rc_lane_wait(c, args->program->obj.device, ticket);
}

cJSON *rc_run_params(const struct rc_run *run)
{
	cJSON *params = cJSON_CreateObject(), *bind, *scalars = NULL;
	char id[RP_ID_MAX];

	if (params == NULL || cJSON_AddStringToObject(params, "program", rp_id_format(&run->program, id)) == NULL ||
	    (bind = cJSON_AddObjectToObject(params, "bind")) == NULL)
		goto fail;
	for (unsigned i = 0; i < run->nbind; i++) {
		cJSON *b = cJSON_AddObjectToObject(bind, run->bind[i].name);

		if (b == NULL || cJSON_AddStringToObject(b, "buffer", rp_id_format(&run->bind[i].buffer, id)) == NULL ||
		    cJSON_AddNumberToObject(b, "offset", (double)run->bind[i].offset) == NULL)
			goto fail;
	}
	if (run->nscalars && (scalars = cJSON_AddObjectToObject(params, "scalars")) == NULL)
		goto fail;
	for (unsigned i = 0; i < run->nscalars; i++)
		if (cJSON_AddNumberToObject(scalars, run->scalars[i].name, run->scalars[i].value) == NULL)
			goto fail;
	if ((run->wait_event.kind &&
	     cJSON_AddStringToObject(params, "wait_event", rp_id_format(&run->wait_event, id)) == NULL) ||
	    (run->signal_event.kind &&
	     cJSON_AddStringToObject(params, "signal_event", rp_id_format(&run->signal_event, id)) == NULL) ||
	    (run->deadline_ms && cJSON_AddNumberToObject(params, "deadline_ms", run->deadline_ms) == NULL))
		goto fail;
	if (run->has_journal) {
		cJSON *j = cJSON_AddObjectToObject(params, "journal");

		if (j == NULL || cJSON_AddStringToObject(j, "buffer", rp_id_format(&run->journal, id)) == NULL ||
		    cJSON_AddNumberToObject(j, "offset", (double)run->journal_offset) == NULL ||
		    (run->journal_marks && cJSON_AddStringToObject(j, "mode", "marks") == NULL))
			goto fail;
	}
	/* A record's seq of 0 without a journal is none: the call's is
	 * absent then too, so that both transports read the same Run. */
	if ((run->has_journal || run->seq) && cJSON_AddNumberToObject(params, "seq", (double)run->seq) == NULL)
		goto fail;
	if (run->retry && cJSON_AddTrueToObject(params, "retry") == NULL)
		goto fail;
	return params;
fail:
	cJSON_Delete(params);
	return NULL;
}

/* InvalidParameter naming `what`, as regend refuses the same Run. */
static int refuse_parameter(regen_client *c, const char *what)
{
	struct rp_error err = { 0 };

	rp_error_invalid_parameter(&err, what);
	rc_set_remote_error(c, err.name, err.params);
	rp_error_clear(&err);
	return -EINVAL;
}

/* "list.name.field" (field NULL: "list.name"), as regend names a Run's
 * parameters. */
static int refuse_field(regen_client *c, const char *list, const char *name, const char *field)
{
	char path[RP_PROG_NAME_MAX * 2 + 32];

	snprintf(path, sizeof(path), "%s.%.*s%s%s", list, RP_PROG_NAME_MAX * 2, name, field ? "." : "",
		 field ? field : "");
	return refuse_parameter(c, path);
}

/* An id of `kind` from text, or regend's refusal of it (`what` names the
 * parameter). */
static int parse_id(regen_client *c, const char *text, char kind, const char *what, struct rp_id *out)
{
	if (rp_id_parse(text, out) == 0 && out->kind == kind)
		return 0;
	return refuse_parameter(c, what);
}

REGEN_EXPORT int regen_record_run_submit(regen_client *c, int device, const struct regen_record_run *a,
					 uint64_t *ticket)
{
	struct rc_run_binding *bind = NULL;
	struct rc_run_scalar *scalars = NULL;
	struct rc_run run = { 0 };
	int r = -EINVAL;

	if (c == NULL || a == NULL || ticket == NULL || a->program == NULL || (a->nbind && a->bind == NULL) ||
	    (a->nscalars && a->scalars == NULL))
		return -EINVAL;
	rc_check_fork(c);
	if (a->nbind + a->nscalars > RP_PROG_BOUND_MAX) {
		rc_set_local_error(c, "a Run names at most %d tensors and scalars, not %zu", RP_PROG_BOUND_MAX,
				   a->nbind + a->nscalars);
		return -EINVAL;
	}
	bind = calloc(a->nbind + 1, sizeof(*bind));
	scalars = calloc(a->nscalars + 1, sizeof(*scalars));
	if (bind == NULL || scalars == NULL) {
		r = -ENOMEM;
		goto out;
	}
	if (parse_id(c, a->program, RP_ID_PROGRAM, "program", &run.program) < 0)
		goto out;
	for (size_t i = 0; i < a->nbind; i++) {
		const struct regen_record_binding *b = &a->bind[i];

		if (b->name == NULL || b->buffer == NULL) {
			rc_set_local_error(c, "binding %zu has no name or no buffer", i);
			goto out;
		}
		if (rp_id_parse(b->buffer, &bind[i].buffer) < 0 || bind[i].buffer.kind != RP_ID_BUFFER) {
			r = refuse_field(c, "bind", b->name, "buffer");
			goto out;
		}
		if (b->offset > EXACT_MAX) {
			r = refuse_field(c, "bind", b->name, "offset");
			goto out;
		}
		bind[i].bound = b->bound;
		bind[i].name = b->name;
		bind[i].offset = b->offset;
	}
	for (size_t i = 0; i < a->nscalars; i++) {
		const struct regen_record_scalar *s = &a->scalars[i];

		if (s->name == NULL) {
			rc_set_local_error(c, "scalar %zu has no name", i);
			goto out;
		}
		/* JSON has no words for a NaN or an infinity. */
		if (!isfinite(s->value)) {
			r = refuse_field(c, "scalars", s->name, NULL);
			goto out;
		}
		scalars[i] = (struct rc_run_scalar){ .bound = s->bound, .name = s->name, .value = s->value };
	}
	if ((a->wait_event && parse_id(c, a->wait_event, RP_ID_EVENT, "wait_event", &run.wait_event) < 0) ||
	    (a->signal_event && parse_id(c, a->signal_event, RP_ID_EVENT, "signal_event", &run.signal_event) < 0) ||
	    (a->journal && parse_id(c, a->journal, RP_ID_BUFFER, "journal.buffer", &run.journal) < 0))
		goto out;
	if (a->journal_offset > EXACT_MAX || a->seq > EXACT_MAX) {
		r = refuse_parameter(c, a->seq > EXACT_MAX ? "seq" : "journal.offset");
		goto out;
	}
	/* A call has no words for a mode without a journal. */
	if (a->journal_marks && a->journal == NULL) {
		r = refuse_parameter(c, "journal.mode");
		goto out;
	}
	run.deadline_ms = a->deadline_ms;
	run.has_journal = a->journal != NULL;
	run.journal_offset = a->journal_offset;
	run.seq = a->seq;
	run.retry = a->retry;
	run.journal_marks = a->journal_marks;
	run.bind = bind;
	run.nbind = (unsigned)a->nbind;
	run.scalars = scalars;
	run.nscalars = (unsigned)a->nscalars;
	r = rc_lane_submit_run(c, device, &run, ticket);
out:
	free(bind);
	free(scalars);
	return r;
}
