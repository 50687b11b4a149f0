/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute on a worker socket: every operation of the op table
 * (proto/compute.h), and io.regen.Comm's collectives (proto/comm.h),
 * through one path. The call is parsed and checked, each
 * operand resolved for the caller and checked against its buffer, before
 * anything reaches the backend; the objects it names stay open until it
 * finished. Each call has a deadline (health.c watches it). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/comm.h"
#include "proto/compute.h"
#include "proto/errors.h"

void rd_compute_release(struct rd_worker *w, struct rd_op *op)
{
	for (int i = 0; i < RP_OP_OPERANDS_MAX; i++)
		if (op->buffers[i])
			rd_objects_unref(&w->objects, &op->buffers[i]->obj);
	if (op->wait_event)
		rd_objects_unref(&w->objects, &op->wait_event->obj);
	if (op->signal_event)
		rd_objects_unref(&w->objects, &op->signal_event->obj);
	if (op->comm) {
		op->comm->in_flight--;
		rd_objects_unref(&w->objects, &op->comm->obj);
	}
	if (op->run) {
		struct rd_program_run *run = op->run;

		for (int i = 0; i < run->nbound; i++)
			if (run->buffers && run->buffers[i])
				rd_objects_unref(&w->objects, &run->buffers[i]->obj);
		if (run->journal)
			rd_objects_unref(&w->objects, &run->journal->obj);
		if (run->prog)
			rd_objects_unref(&w->objects, &run->prog->obj);
		free(run->buffers);
		free(run->offsets);
		free(run->scalars);
		free(run);
	}
	memset(op->buffers, 0, sizeof(op->buffers));
	op->wait_event = op->signal_event = NULL;
	op->comm = NULL;
	op->run = NULL;
}

void rd_compute_finished(struct rd_worker *w, struct rd_compute_call *cc)
{
	bool failed = cc->answered || cc->op.err.name;

	/* Before the references go: finish settles the communicator op holds. */
	if (cc->finish)
		cc->finish(cc);
	if (cc->op.run && !failed) {
		cc->op.run->prog->runs++;
		cc->op.run->prog->run_us += cc->op.elapsed_us;
	}
	rd_compute_release(w, &cc->op);
	rd_health_call_finished(w, cc);
	/* Counted here, where Varlink calls and ring records both end. */
	w->calls_done++;
	w->calls_failed += failed;
	w->calls_us += cc->op.elapsed_us;
	if (cc->session && cc->session->usage) {
		cc->session->usage->calls++;
		cc->session->usage->call_errors += failed;
	}
}

/* The time from a call's arrival to now, as its reply says it. */
static void reply_elapsed(struct rd_call *call, uint64_t elapsed_us)
{
	cJSON *reply = cJSON_CreateObject();

	cJSON_AddNumberToObject(reply, "elapsed_us", (double)elapsed_us);
	rd_call_reply(call, reply, false);
}

void rd_compute_launched(struct rd_op *op)
{
	struct rd_compute_call *cc = op->userdata;

	if (!cc->call || cc->answered)
		return;
	reply_elapsed(cc->call, rd_compute_launch_us(op));
	cc->call = NULL;
	cc->answered_at_launch = true;
}

/* A call answered at launch succeeded as far as its caller knows: an error
 * found at its completion is the device's (a fault, reported as such), so
 * it is logged. */
void rd_compute_log_after_launch(struct rd_compute_call *cc)
{
	struct rd_session *s = cc->session;

	if (cc->answered_at_launch && cc->op.err.name)
		rd_warn("compute", s->worker->dev.index, rd_worker_generation(s->worker),
			s->client ? (int)s->client->peer.pid : 0,
			"%s failed after it was answered at launch (its signal_event): %s", cc->op.compute.spec->method,
			cc->op.err.name);
}

/* On the loop thread, once the backend finished the op. A call answered
 * early (past its deadline, or at launch) has nobody left to tell. */
static void on_op_done(struct rd_op *op)
{
	struct rd_compute_call *cc = op->userdata;
	struct rd_session *s = cc->session;

	rd_compute_log_after_launch(cc);
	rd_compute_finished(s->worker, cc);
	if (cc->finish) {
		/* Answered by finish. */
	} else if (!cc->call) {
		rp_error_clear(&op->err);
	} else if (op->err.name) {
		rd_call_fail(cc->call, &op->err);
	} else {
		reply_elapsed(cc->call, op->elapsed_us);
	}
	free(cc);
	rd_session_call_finished(s);
}

/* The parser held an operand's offset to a multiple of its element size;
 * a buffer imported at an offset that is not one can still put the
 * operand's elements at misaligned addresses. cuBLASLt answers those with
 * no algorithm (a BackendError that names nothing), a kernel with a
 * misaligned access that costs the context: refused here, by name, the
 * same on every backend and over both transports (the ring's records come
 * through here too). */
static int check_alignment(const struct rp_operand *op, const char *name, const struct rd_buffer *buf,
			   struct rp_error *err)
{
	size_t elem = rp_dtype_size(op->dtype);
	char id[RP_ID_MAX];

	if (elem == 0 || (buf->offset + op->offset) % elem == 0)
		return 0;
	return rp_error_invalid_operand(err, name,
					"misaligned: buffer %s was imported at offset %llu of its memory, so %s's first "
					"element (offset %llu in the buffer) is not aligned to %zu bytes, the size of %s; "
					"import the buffer at an offset that is a multiple of %zu",
					rp_id_format(&op->buffer, id), (unsigned long long)buf->offset, name,
					(unsigned long long)op->offset, elem, rp_dtype_name(op->dtype), elem);
}

static int resolve_operands(struct rd_worker *w, struct rd_op *op, const struct rd_client *who,
			    struct rp_error *err)
{
	const struct rp_compute *c = &op->compute;
	struct rd_object *o;
	int r;

	for (unsigned i = 0; i < c->spec->noperands; i++) {
		const char *name = c->spec->operands[i].name;
		struct rd_buffer *buf;

		if (!c->present[i])
			continue;
		r = rd_objects_find(&w->objects, &c->operands[i].buffer, RD_OBJECT_BUFFER, who, name, &o, err);
		if (r < 0)
			return r;
		buf = rd_object_buffer(o);
		r = rp_operand_check_bounds(&c->operands[i], name, buf->size, err);
		if (r < 0)
			return r;
		r = check_alignment(&c->operands[i], name, buf, err);
		if (r < 0)
			return r;
		rd_objects_ref(o);
		op->buffers[i] = buf;
	}
	return 0;
}

static int resolve_event(struct rd_worker *w, const struct rp_event_ref *ref, const char *name,
			 const struct rd_client *who, struct rd_event **out, struct rp_error *err)
{
	struct rd_object *o;
	int r;

	if (!ref->present)
		return 0;
	r = rd_objects_find(&w->objects, &ref->id, RD_OBJECT_EVENT, who, name, &o, err);
	if (r < 0)
		return r;
	rd_objects_ref(o);
	*out = rd_object_event(o);
	return 0;
}

/* A uid whose call hung a device of this node (daemon/hang_charge.h): no
 * compute work of its until its cool-down ends. A communicator's calls
 * pass: theirs end with the communicator at their deadline, never with
 * the device. */
static int refuse_if_cooling_down(struct rd_worker *w, const struct rd_session *s, const struct rd_op *op,
				  struct rp_error *err)
{
	const struct rd_hang_charge *c;
	uint64_t now = uv_hrtime();

	if (op->compute.spec->id == RP_OP_COMM || !s->client ||
	    !(c = rd_hang_charges_find(&w->hang_charges, s->client->peer.uid, now)))
		return 0;
	rp_err_limit_exceeded(err, "hang cool-down", (long long)c->cooldown_ms,
			      "a compute call of uid %u ran past regend's deadline on a device of this node, which "
			      "was reset for every user (strike %u): uid %u's compute calls are refused on every "
			      "device for %.1f s more (hang_cooldown_ms, doubling with each hang soon after the "
			      "last); split the work into calls that finish well within call_deadline_ms (%u ms)",
			      (unsigned)c->uid, c->strikes, (unsigned)c->uid, (double)(c->until_ns - now) / 1e9,
			      w->opts->call_deadline_ms);
	return -EAGAIN;
}

int rd_compute_submit(struct rd_session *s, struct rd_compute_call *cc, struct rp_error *err)
{
	struct rd_worker *w = s->worker;
	struct rd_op *op = &cc->op;
	int r;

	r = rd_worker_refuse_if_not_ready(w, err);
	if (r == 0)
		r = refuse_if_cooling_down(w, s, op, err);
	if (r == 0)
		r = resolve_operands(w, op, s->client, err);
	if (r == 0)
		r = resolve_event(w, &op->compute.wait_event, "wait_event", s->client, &op->wait_event, err);
	if (r == 0)
		r = resolve_event(w, &op->compute.signal_event, "signal_event", s->client, &op->signal_event, err);
	/* A collective names its communicator; Init and Destroy hold theirs. */
	if (r == 0 && op->compute.spec->id == RP_OP_COMM && !op->comm)
		r = rd_comm_resolve(w, op, s->client, err);
	if (r == 0) {
		op->lane = rd_session_lane(s, err);
		if (!op->lane)
			r = -ENOMEM;
	}
	if (r < 0)
		goto fail;
	op->submitted_ns = uv_hrtime();
	cc->session = s;
	cc->answered = false;
	cc->timed_out = false;
	cc->deadline_ns = op->submitted_ns +
			  (uint64_t)(op->compute.deadline_ms ? op->compute.deadline_ms : w->opts->call_deadline_ms) *
				  1000000u;
	/* Any client may name a deadline of 1 ms: that may end its own call,
	 * but only regend's own deadline says the device hung, which costs
	 * every client its objects. */
	uint64_t own_ns = op->submitted_ns + (uint64_t)w->opts->call_deadline_ms * 1000000u;
	cc->hang_ns = cc->deadline_ns > own_ns ? cc->deadline_ns : own_ns;
	if (op->comm && rp_comm_is_collective(&op->compute))
		op->comm->collectives++;
	rd_session_call_started(s);
	rd_health_call_started(w, cc);
	r = w->dev.backend->submit(op->lane, op);
	if (r < 0) {
		/* Refused: no completion follows. The session stays, as the
		 * call is still being answered by the caller. */
		rd_health_call_finished(w, cc);
		rd_session_call_uncount(s);
		if (op->comm && rp_comm_is_collective(&op->compute))
			op->comm->collectives--;
		rp_error_move(err, &op->err);
		if (!err->name)
			rp_err_backend_error(err, w->dev.index, "submit failed: %s", strerror(-r));
		goto fail;
	}
	return 0;
fail:
	rd_compute_release(w, op);
	return r;
}

int rd_compute_submit_call(struct rd_session *s, struct rd_compute_call *cc, struct rd_call *call,
			   struct rp_error *err)
{
	int r;

	cc->op.done = on_op_done;
	cc->op.userdata = cc;
	cc->call = call;
	r = rd_compute_submit(s, cc, err);
	if (r < 0)
		free(cc);
	return r;
}

void rd_compute_call(struct rd_call *call)
{
	const struct rp_op_spec *spec = rp_op_find(call->msg.method);
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rd_compute_call *cc = calloc(1, sizeof(*cc));
	struct rd_op *op = cc ? &cc->op : NULL;
	int r;

	if (!spec)
		spec = rp_comm_op_find(call->msg.method);
	if (!cc) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for the call");
		rd_call_fail(call, &err);
		return;
	}
	r = rp_compute_parse(spec, call->msg.params, &op->compute, &err);
	/* A compute call with a signal_event is answered once its work is
	 * enqueued (io.regen.Compute); a communicator's calls when they end. */
	if (r == 0 && op->compute.signal_event.present && op->compute.spec->id != RP_OP_COMM)
		op->launched = rd_compute_post_launched;
	if (r == 0)
		r = rd_compute_submit_call(s, cc, call, &err);
	else
		free(cc);
	if (r < 0)
		rd_call_fail(call, &err);
}
