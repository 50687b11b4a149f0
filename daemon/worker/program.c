/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program on a worker socket: Define, Run, Drop, Status.
 *
 * A program is an id of the process that defined it (objects.c), checked
 * whole at Define (proto/program.h) and handed to the backend, which keeps
 * what it compiles per generation. A Run binds the program's inputs,
 * outputs and inouts to the caller's buffers, each checked against its
 * buffer's extent before anything reaches the backend, and goes down the
 * same path as every compute call (compute.c): its deadline, the health
 * watch, the lane, the reply. A Run that comes as ring records (ring.c) is
 * decoded into the same struct rp_program_run a call's parameters become
 * and goes through the same rd_program_run_prepare. The program and the
 * buffers stay open until the Run finished, whatever Drop or CloseBuffer
 * say meanwhile. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/program/compile_budget.h"
#include "daemon/worker/session.h"
#include "proto/errors.h"
#include "proto/program.h"
#include "proto/program_journal.h"

static int not_implemented(struct rd_call *call, struct rp_error *err)
{
	rp_error_set(err, RP_ERR_METHOD_NOT_IMPLEMENTED, "%s", "");
	cJSON_DeleteItemFromObject(err->params, "message");
	rp_error_add_str(err, "method", call->msg.method);
	return -ENOSYS;
}

/* Per process (max_programs, max_program_nodes), and per uid, all its
 * processes together (max_uid_programs, max_uid_program_nodes): each
 * program's lowered nodes are held in this worker for every user to
 * share, and a uid with many processes would multiply a process's
 * bound. */
static int check_limits(struct rd_worker *w, const struct rd_client *c, const struct rp_program *def,
			struct rp_error *err)
{
	const struct rd_options *o = w->opts;
	struct rd_uid_use uid = rd_objects_use_of_uid(&w->objects, c->peer.uid);
	uint64_t nodes = (uint64_t)def->nnodes;

	if (c->count[RD_OBJECT_PROGRAM] >= o->max_programs) {
		rp_err_limit_exceeded(err, "programs", o->max_programs,
				      "process %d already has %u programs on device %d (max_programs): Drop one first",
				      (int)c->peer.pid, c->count[RD_OBJECT_PROGRAM], w->dev.index);
		return -E2BIG;
	}
	if (c->program_nodes + nodes > o->max_program_nodes) {
		rp_err_limit_exceeded(err, "program nodes", o->max_program_nodes,
				      "process %d holds programs of %llu nodes on device %d and this one has %d "
				      "(max_program_nodes): Drop one first",
				      (int)c->peer.pid, (unsigned long long)c->program_nodes, w->dev.index, def->nnodes);
		return -E2BIG;
	}
	if (uid.programs >= o->max_uid_programs) {
		rp_err_limit_exceeded(err, "programs per uid", o->max_uid_programs,
				      "uid %u's processes already have %u programs on device %d together "
				      "(max_uid_programs): Drop one first",
				      (unsigned)c->peer.uid, uid.programs, w->dev.index);
		return -E2BIG;
	}
	if (uid.program_nodes + nodes > o->max_uid_program_nodes) {
		rp_err_limit_exceeded(err, "program nodes per uid", o->max_uid_program_nodes,
				      "uid %u's processes hold programs of %llu nodes on device %d together and this one "
				      "has %d (max_uid_program_nodes): Drop one first",
				      (unsigned)c->peer.uid, (unsigned long long)uid.program_nodes, w->dev.index,
				      def->nnodes);
		return -E2BIG;
	}
	return 0;
}

/* The uid's compile account on this device, made on its first program. */
static struct rd_compile_account *compile_account(struct rd_worker *w, uid_t uid, struct rp_error *err)
{
	struct rd_compile_account *a;

	for (a = w->compile_accounts; a; a = a->next)
		if (a->uid == uid)
			return a;
	a = malloc(sizeof(*a));
	if (!a) {
		rp_err_out_of_memory(err, w->dev.index, "no host memory for the program");
		return NULL;
	}
	rd_compile_account_init(a, uid, w->dev.index, (uint64_t)w->opts->max_uid_compile_ms * 1000000,
				(uint64_t)w->opts->max_uid_module_mib << 20, rd_compile_clock_ns());
	a->next = w->compile_accounts;
	w->compile_accounts = a;
	return a;
}

int rd_program_add(struct rd_worker *w, struct rd_client *owner, struct rp_program *def, uint64_t serial,
		   struct rd_program **out, struct rp_error *err)
{
	struct rd_program *prog = NULL;
	struct rd_compile_account *account = compile_account(w, owner->peer.uid, err);

	if (!account)
		return -ENOMEM;
	if (!w->dev.backend->program_create) {
		rp_err_backend_error(err, w->dev.index, "the %s backend runs no programs", w->dev.backend->name);
		return -ENOSYS;
	}
	if (check_limits(w, owner, def, err) < 0)
		return -E2BIG;
	if (w->dev.backend->program_create(&w->dev, def, &prog, err) < 0) {
		if (!err->name)
			rp_err_backend_error(err, w->dev.index, "the backend could not take the program");
		return -EIO;
	}
	prog->device = &w->dev;
	prog->def = def;
	prog->compile = account;
	if (serial)
		rd_objects_add_as(&w->objects, &prog->obj, RD_OBJECT_PROGRAM, owner, serial);
	else
		rd_objects_add(&w->objects, &prog->obj, RD_OBJECT_PROGRAM, owner);
	*out = prog;
	return 0;
}

void rd_program_define(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_program *def = calloc(1, sizeof(*def));
	struct rd_program *prog = NULL;
	char id[RP_ID_MAX];

	if (!def) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for the program");
		goto fail;
	}
	if (!w->dev.backend->program_create) {
		not_implemented(call, &err);
		goto fail;
	}
	if (rp_program_parse(call->msg.params, def, &err) < 0 ||
	    rd_program_add(w, s->client, def, 0, &prog, &err) < 0)
		goto fail;
	rp_id_format(&prog->obj.id, id);
	rd_debug("program", w->dev.index, rd_worker_generation(w), s->client->peer.pid,
		 "defined %s '%s': %d nodes, %d tensors, %llu bytes of intermediates", id,
		 def->name, def->nnodes, def->ntensors, (unsigned long long)def->intermediate_bytes);
	/* Told before the reply goes: a worker that dies after its caller
	 * heard of the program leaves it to the next (program_keep.c). */
	rd_program_keep(w, prog, s->client, call->raw.text, call->raw.len);

	cJSON *reply = cJSON_CreateObject();
	cJSON *bound = cJSON_AddArrayToObject(reply, "bound");
	cJSON_AddStringToObject(reply, "program", id);
	cJSON_AddNumberToObject(reply, "nodes", def->nnodes);
	cJSON_AddNumberToObject(reply, "tensors", def->ntensors);
	cJSON_AddNumberToObject(reply, "scratch_bytes", (double)def->intermediate_bytes);
	cJSON_AddNumberToObject(reply, "journal_bytes", (double)rp_program_journal_bytes(def));
	for (int i = 0; i < def->nbound; i++)
		cJSON_AddItemToArray(bound, cJSON_CreateString(def->tensors[def->bind[i]].name));
	rd_call_reply(call, reply, false);
	return;
fail:
	if (def) {
		rp_program_finish(def);
		free(def);
	}
	rd_call_fail(call, &err);
}

int rd_program_find(struct rd_worker *w, struct rd_session *s, const struct rp_id *id, struct rd_program **out,
		    struct rp_error *err)
{
	struct rd_object *o;
	int r = rd_objects_find(&w->objects, id, RD_OBJECT_PROGRAM, s->client, "program", &o, err);

	if (r == 0)
		*out = rd_object_program(o);
	return r;
}

/* A Run's journal (proto/program_journal.h): the program must update
 * something in place, and the buffer hold what the journal's mode needs. */
static int bind_journal(struct rd_worker *w, struct rd_session *s, const struct rp_program *def,
			const struct rp_program_run *req, struct rd_program_run *run, struct rp_error *err)
{
	uint64_t need = rp_program_journal_need(def, req->journal_mode);
	struct rd_object *o;
	struct rd_buffer *buf;
	int r;

	run->seq = req->seq;
	run->retry = req->retry;
	run->journal_mode = req->journal_mode;
	if (!req->has_journal)
		return 0;
	if (!def->updates_in_place) {
		rp_error_set(err, RP_ERR_INVALID_PARAMETER,
			     "program '%s' updates nothing in place: it takes no journal (a plain Run is safe to retry)",
			     def->name);
		rp_error_add_str(err, "parameter", "bind.journal");
		return -EINVAL;
	}
	r = rd_objects_find(&w->objects, &req->journal.buffer, RD_OBJECT_BUFFER, s->client, "bind.journal", &o, err);
	if (r < 0)
		return r;
	buf = rd_object_buffer(o);
	rd_objects_ref(o);
	run->journal = buf;
	run->journal_offset = req->journal.offset;
	if (req->journal.offset > buf->size || need > buf->size - req->journal.offset)
		return rp_error_invalid_operand(err, "bind.journal",
						"the journal needs %llu bytes from offset %llu (%s), but its buffer holds %llu",
						(unsigned long long)need, (unsigned long long)req->journal.offset,
						req->journal_mode == RP_JOURNAL_MARKS ? "mode marks: the header"
										      : "mode copy: a header and the program's inouts",
						(unsigned long long)buf->size);
	if ((buf->offset + req->journal.offset) % 8 != 0)
		return rp_error_invalid_operand(err, "bind.journal", "misaligned: the journal must start 8-byte aligned");
	return 0;
}

/* Every binding's buffer resolved for the caller, the tensor's extent and
 * alignment checked against it; each holds a reference on success and on
 * failure alike (rd_compute_release drops them). */
static int bind_buffers(struct rd_worker *w, struct rd_session *s, const struct rp_program *def,
			const struct rp_program_run *req, struct rd_program_run *run, struct rp_error *err)
{
	for (int i = 0; i < def->nbound; i++) {
		const struct rp_prog_tensor *t = &def->tensors[def->bind[i]];
		const struct rp_prog_binding *b = &req->bind[i];
		size_t elem = rp_prog_tensor_elem_size(t);
		struct rd_object *o;
		struct rd_buffer *buf;
		char what[RP_PROG_NAME_MAX + 16];
		int r;

		if (t->kind == RP_PT_SCALAR) {
			run->scalars[i] = req->scalars[i];
			continue;
		}
		snprintf(what, sizeof(what), "bind.%s", t->name);
		r = rd_objects_find(&w->objects, &b->buffer, RD_OBJECT_BUFFER, s->client, what, &o, err);
		if (r < 0)
			return r;
		buf = rd_object_buffer(o);
		rd_objects_ref(o);
		run->buffers[i] = buf;
		run->offsets[i] = b->offset;
		if (b->offset > buf->size || t->extent_bytes > buf->size - b->offset)
			return rp_error_invalid_operand(err, what,
							"%s needs %llu bytes from offset %llu, but its buffer holds %llu",
							t->name, (unsigned long long)t->extent_bytes,
							(unsigned long long)b->offset, (unsigned long long)buf->size);
		if (elem > 1 && (buf->offset + b->offset) % elem != 0)
			return rp_error_invalid_operand(err, what,
							"misaligned: %s's first element, at offset %llu of a buffer imported "
							"at offset %llu of its memory, is not aligned to %zu bytes",
							t->name, (unsigned long long)b->offset,
							(unsigned long long)buf->offset, elem);
	}
	return bind_journal(w, s, def, req, run, err);
}

int rd_program_run_prepare(struct rd_session *s, struct rd_program *prog, const struct rp_program_run *req,
			   struct rd_compute_call *cc, struct rp_error *err)
{
	struct rd_worker *w = s->worker;
	struct rd_program_run *run = calloc(1, sizeof(*run));

	if (!run) {
		rp_err_out_of_memory(err, w->dev.index, "no host memory for the run");
		return -ENOMEM;
	}
	/* The op owns the run from here: rd_compute_release frees it, and
	 * drops what it holds, whatever is filled in by then. */
	cc->op.run = run;
	rd_objects_ref(&prog->obj);
	run->prog = prog;
	run->nbound = prog->def->nbound;
	run->buffers = calloc((size_t)run->nbound + 1, sizeof(*run->buffers));
	run->offsets = calloc((size_t)run->nbound + 1, sizeof(*run->offsets));
	run->scalars = calloc((size_t)run->nbound + 1, sizeof(*run->scalars));
	if (!run->buffers || !run->offsets || !run->scalars) {
		rp_err_out_of_memory(err, w->dev.index, "no host memory for the run's bindings");
		return -ENOMEM;
	}
	int r = bind_buffers(w, s, prog->def, req, run, err);
	if (r < 0)
		return r;
	cc->op.compute.spec = &rp_op_program_run;
	cc->op.compute.wait_event = req->wait_event;
	cc->op.compute.signal_event = req->signal_event;
	cc->op.compute.deadline_ms = req->deadline_ms;
	return 0;
}

void rd_program_run(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_program_run req = { 0 };
	struct rd_compute_call *cc = calloc(1, sizeof(*cc));
	struct rd_program *prog = NULL;
	struct rp_id id;

	if (!cc) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for the run");
		goto fail;
	}
	if (rp_program_run_id(call->msg.params, &id, &err) < 0 || rd_program_find(w, s, &id, &prog, &err) < 0 ||
	    rp_program_run_parse(prog->def, call->msg.params, &req, &err) < 0 ||
	    rd_program_run_prepare(s, prog, &req, cc, &err) < 0)
		goto fail;
	if (req.signal_event.present)
		cc->op.launched = rd_compute_post_launched;
	rp_program_run_finish(&req);
	/* From here the submit owns cc (and its run) whatever it answers. */
	if (rd_compute_submit_call(s, cc, call, &err) < 0)
		rd_call_fail(call, &err);
	return;
fail:
	rp_program_run_finish(&req);
	if (cc)
		rd_compute_release(w, &cc->op);
	free(cc);
	if (!err.name)
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for the run");
	rd_call_fail(call, &err);
}

void rd_program_drop(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	static const struct rp_field fields[] = { { "program", RP_T_STRING, true }, { NULL } };
	struct rd_program *prog = NULL;
	struct rp_id id;

	if (rp_params_check(call->msg.params, fields, &err) < 0 || rp_program_run_id(call->msg.params, &id, &err) < 0 ||
	    rd_program_find(w, s, &id, &prog, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	/* A Run in flight keeps it (its reference) until it finished. */
	rd_objects_close(&w->objects, &prog->obj);
	rd_call_reply(call, NULL, false);
}

static cJSON *program_status(const struct rd_program *p)
{
	cJSON *o = cJSON_CreateObject();
	char id[RP_ID_MAX];

	cJSON_AddStringToObject(o, "program", rp_id_format(&p->obj.id, id));
	cJSON_AddStringToObject(o, "name", p->def->name);
	cJSON_AddNumberToObject(o, "nodes", p->def->nnodes);
	cJSON_AddNumberToObject(o, "runs", (double)p->runs);
	cJSON_AddNumberToObject(o, "run_us", (double)p->run_us);
	cJSON_AddNumberToObject(o, "launch_us", (double)p->launch_ns / 1e3);
	cJSON_AddNumberToObject(o, "scratch_bytes", (double)p->scratch_bytes);
	cJSON_AddNumberToObject(o, "modules", (double)p->modules);
	cJSON_AddNumberToObject(o, "module_bytes", (double)p->module_bytes);
	cJSON_AddNumberToObject(o, "compile_us", (double)p->compile_us);
	cJSON_AddNumberToObject(o, "kernels", (double)p->kernels);
	cJSON_AddNumberToObject(o, "graph_captures", (double)p->graph_captures);
	cJSON_AddNumberToObject(o, "graph_launches", (double)p->graph_launches);
	cJSON_AddNumberToObject(o, "stream_runs", (double)p->stream_runs);
	cJSON_AddNumberToObject(o, "retries_applied", (double)p->retries_applied);
	cJSON_AddNumberToObject(o, "retries_restored", (double)p->retries_restored);
	cJSON_AddNumberToObject(o, "retries_torn", (double)p->retries_torn);
	cJSON_AddStringToObject(o, "not_captured", p->not_captured);
	return o;
}

/* Status of one program of the caller's, or of all of them. */
void rd_program_status(struct rd_call *call)
{
	static const struct rp_field fields[] = { { "program", RP_T_STRING, false }, { NULL } };
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	cJSON *reply, *list;
	struct rd_program *prog = NULL;
	struct rp_id id;

	if (rp_params_check(call->msg.params, fields, &err) < 0)
		goto fail;
	/* A Run over the ring is answered in its completion before the loop
	 * counts it: a Status asked after that answer counts it too, as it
	 * would a Varlink Run's. */
	rd_worker_finish_posted(w);
	reply = cJSON_CreateObject();
	list = cJSON_AddArrayToObject(reply, "programs");
	if (cJSON_HasObjectItem(call->msg.params, "program")) {
		if (rp_program_run_id(call->msg.params, &id, &err) < 0 || rd_program_find(w, s, &id, &prog, &err) < 0) {
			cJSON_Delete(reply);
			goto fail;
		}
		cJSON_AddItemToArray(list, program_status(prog));
	} else {
		for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++)
			for (struct rd_object *o = w->objects.table[b]; o; o = o->next_in_table)
				if (o->owner == s->client && rd_object_kind_of(o) == RD_OBJECT_PROGRAM)
					cJSON_AddItemToArray(list, program_status(rd_object_program(o)));
	}
	rd_call_reply(call, reply, false);
	return;
fail:
	rd_call_fail(call, &err);
}
