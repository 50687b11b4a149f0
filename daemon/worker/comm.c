/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Comm on a worker socket: communicators as objects of the
 * worker's table (ids owned by the process that made them, stamped with
 * the generation) over the backend's communicators (registry resources).
 *
 * Init and Destroy wait for peers, so they run as ops on the caller's lane,
 * like the collectives (compute.c submits all three), never on the loop:
 * the loop only ever aborts, which never waits. A call on a communicator
 * past its deadline aborts the communicator and is answered with
 * CommTimeout; a drain aborts every communicator with calls in flight; a
 * process that goes away aborts its communicators, except keyed healthy
 * ones, which stay detached until a process of the same user attaches or
 * the generation ends. Who may join with a unique id: daemon/comm_owners.h,
 * which the supervisor keeps and this file asks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/comm.h"
#include "proto/errors.h"
#include "proto/params.h"

static bool comm_supported(struct rd_worker *w, struct rd_call *call)
{
	struct rp_error err = { 0 };

	if (w->dev.backend->comm_create)
		return true;
	rp_error_set(&err, RP_ERR_METHOD_NOT_IMPLEMENTED, "the %s backend has no communicators", w->dev.backend->name);
	rp_error_add_str(&err, "method", call->msg.method);
	rd_call_fail(call, &err);
	return false;
}

static const char *comm_text(const struct rd_comm *comm, char buf[RP_ID_MAX])
{
	return rp_id_format(&comm->obj.id, buf);
}

/* The caller's communicator `id`. */
static int find_comm(struct rd_worker *w, const struct rp_id *id, const struct rd_client *who, struct rd_comm **out,
		     struct rp_error *err)
{
	struct rd_object *o;
	int r = rd_objects_find(&w->objects, id, RD_OBJECT_COMM, who, "comm", &o, err);

	if (r < 0)
		return r;
	*out = rd_object_comm(o);
	return 0;
}

/* The backend's word on the communicator, with its id in the error. */
static int comm_healthy(struct rd_worker *w, struct rd_comm *comm, struct rp_error *err)
{
	char id[RP_ID_MAX];
	int r = w->dev.backend->comm_status(comm, err);

	if (r < 0 && err->name && !cJSON_HasObjectItem(err->params, "comm"))
		rp_error_add_str(err, "comm", comm_text(comm, id));
	return r;
}

/* ---- Whose a unique id is: the supervisor's word (daemon/comm_owners.h) ---- */

/* A call that waits for the supervisor to say whose its unique id is;
 * then() goes on with it once the answer came. Only this file answers it
 * meanwhile, so the call is there when the answer comes (a connection
 * keeps its unanswered calls; the session stays while calls are in
 * flight). */
struct owner_ask {
	struct rd_call *call;
	struct rd_session *session;
	unsigned char id[RP_COMM_ID_SIZE];
	void (*then)(struct rd_call *call, const unsigned char id[RP_COMM_ID_SIZE], uid_t owner);
};

/* Without the supervisor no id can be checked: the worker is on its way
 * out (its supervisor gone or going), and the device comes back with a
 * new one. */
static void fail_unasked(struct rd_call *call, struct rd_worker *w, const char *why)
{
	struct rp_error err = { 0 };

	rp_err_draining(&err, w->dev.index, (long long)rd_worker_generation(w),
			"the supervisor, which says whose each communicator unique id is on this node, %s: call "
			"again once the device serves again", why);
	rd_call_fail(call, &err);
}

static void on_owner_answer(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct owner_ask *a = userdata;
	struct rd_session *s = a->session;
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	uint64_t owner;

	if (!reply || reply->error || rp_params_uint(reply->params, "uid", UINT32_MAX, 0, &owner, &err) != 0) {
		rp_error_clear(&err);
		fail_unasked(a->call, w, reply ? "gave no owner" : "went away before it answered");
	} else if (s->closed) {
		/* Nobody waits for it, and nothing should be made for a gone
		 * process: the reply is dropped with the connection. */
		fail_unasked(a->call, w, "answered after the caller went away");
	} else {
		a->then(a->call, a->id, (uid_t)owner);
	}
	rd_session_call_finished(s);
	free(a);
}

/* Asks the supervisor whose `id` is for the caller's uid (binding it to
 * that uid if nobody's yet); then(call, id, owner) goes on. The call
 * counts as in flight meanwhile: a drain waits for the answer. */
static void ask_owner(struct rd_call *call, const unsigned char id[RP_COMM_ID_SIZE],
		      void (*then)(struct rd_call *call, const unsigned char id[RP_COMM_ID_SIZE], uid_t owner))
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	char hex[RP_COMM_ID_HEX_LEN + 1];
	struct owner_ask *a;
	cJSON *p;

	if (!w->ctl) {
		fail_unasked(call, w, "is not connected");
		return;
	}
	a = calloc(1, sizeof(*a));
	p = cJSON_CreateObject();
	if (!a || !p || !cJSON_AddStringToObject(p, "unique_id", rp_comm_id_to_hex(id, hex)) ||
	    !cJSON_AddNumberToObject(p, "uid", (double)s->client->peer.uid)) {
		struct rp_error err = { 0 };

		free(a);
		cJSON_Delete(p);
		rp_err_out_of_memory(&err, w->dev.index, "no host memory to ask whose the unique id is");
		rd_call_fail(call, &err);
		return;
	}
	a->call = call;
	a->session = s;
	memcpy(a->id, id, RP_COMM_ID_SIZE);
	a->then = then;
	if (rd_conn_call(w->ctl, "io.regen.Worker.CommOwner", p, false, on_owner_answer, a) < 0) {
		free(a);
		fail_unasked(call, w, "could not be asked");
		return;
	}
	rd_session_call_started(s);
}

/* The supervisor holds the new id for the caller's uid: it may go out. */
static void unique_id_owned(struct rd_call *call, const unsigned char id[RP_COMM_ID_SIZE], uid_t owner)
{
	struct rd_worker *w = rd_session_of(call)->worker;
	struct rp_error err = { 0 };

	if (owner != rd_session_of(call)->client->peer.uid) {
		/* 128 random bytes another uid already joined with: never
		 * seen, and never handed out. */
		rp_err_backend_error(&err, w->dev.index, "the new unique id is already another user's; ask for another");
		rd_call_fail(call, &err);
		return;
	}
	rd_call_reply(call, rp_comm_unique_id_reply_encode(id), false);
}

void rd_comm_get_unique_id(struct rd_call *call)
{
	struct rd_worker *w = rd_session_of(call)->worker;
	unsigned char id[RP_COMM_ID_SIZE];
	struct rp_error err = { 0 };

	if (!comm_supported(w, call))
		return;
	if (rp_comm_get_unique_id_decode(call->msg.params, &err) < 0 || rd_worker_refuse_if_not_ready(w, &err) < 0 ||
	    w->dev.backend->comm_unique_id(&w->dev, id, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	/* Bound to the caller's uid on every device before the caller has
	 * it: no other user can be first to join with it anywhere. */
	ask_owner(call, id, unique_id_owned);
}

/* A communicator (attached or detached) keyed `key` for uid. */
static struct rd_comm *find_key(struct rd_worker *w, const char *key, uid_t uid)
{
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		for (struct rd_object *o = w->objects.table[b]; o; o = o->next_in_table) {
			struct rd_comm *comm;

			if (rd_object_kind_of(o) != RD_OBJECT_COMM || o->closing)
				continue;
			comm = rd_object_comm(o);
			if (comm->has_key && comm->key_uid == uid && strcmp(comm->key, key) == 0)
				return comm;
		}
	}
	return NULL;
}

/* The uid of a communicator of this worker's that joined with `id`: 0
 * and *uid, or -ENOENT (then the supervisor knows). */
static int local_owner_of_unique_id(struct rd_worker *w, const unsigned char id[RP_COMM_ID_SIZE], uid_t *uid)
{
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		for (struct rd_object *o = w->objects.table[b]; o; o = o->next_in_table) {
			const struct rd_comm *comm;

			if (rd_object_kind_of(o) != RD_OBJECT_COMM || o->closing)
				continue;
			comm = rd_object_comm(o);
			if (memcmp(comm->unique_id, id, RP_COMM_ID_SIZE) == 0) {
				*uid = comm->key_uid;
				return 0;
			}
		}
	}
	return -ENOENT;
}

static void reply_comm(struct rd_call *call, const struct rd_comm *comm, bool collectives)
{
	struct rp_comm_reply reply = {
		.comm = comm->obj.id,
		.rank = comm->rank,
		.nranks = comm->nranks,
		.has_collectives = collectives,
		.collectives = comm->collectives,
	};

	rd_call_reply(call, rp_comm_reply_encode(&reply), false);
}

/* Init's op finished: the communicator is joined, or it goes. */
static void init_finished(struct rd_compute_call *cc)
{
	struct rd_worker *w = cc->session->worker;
	struct rd_comm *comm = cc->op.comm;
	char id[RP_ID_MAX];

	if (!cc->op.err.name && cc->call && !comm->obj.closing) {
		comm->joined = true;
		rd_info("comm", w->dev.index, rd_worker_generation(w), cc->session->client->peer.pid,
			"%s joined: rank %u of %u%s%s in %.1f ms", comm_text(comm, id), comm->rank, comm->nranks,
			comm->has_key ? ", key " : "", comm->has_key ? comm->key : "",
			(double)(uv_hrtime() - cc->op.submitted_ns) / 1e6);
		reply_comm(cc->call, comm, false);
		return;
	}
	/* Failed, or answered already (its deadline passed): nobody will name
	 * it. Its peers learn of it through the abort. */
	w->dev.backend->comm_abort(comm, "its Init failed");
	if (!comm->obj.closing)
		rd_objects_close(&w->objects, &comm->obj);
	if (cc->call) {
		if (!cc->op.err.name)
			rp_err_comm_failed(&cc->op.err, comm_text(comm, id), "closed", "the caller went away during Init");
		rd_call_fail(cc->call, &cc->op.err);
	} else {
		rp_error_clear(&cc->op.err);
	}
}

static void refuse_not_owner(struct rd_call *call, struct rd_worker *w)
{
	struct rp_error err = { 0 };

	/* Neither the owner's uid nor anything of its communicator is told:
	 * only that the id is not the caller's to join. */
	rp_err_not_permitted(&err, call->msg.method,
			     "this unique id belongs to another user's communicator on this node (device %d asked): "
			     "a communicator's ranks are all of one uid; ask your own rank 0 for its id",
			     w->dev.index);
	rd_call_fail(call, &err);
}

/* Init, once the unique id is known to be the caller's. */
static void init_join(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_comm_init req;
	struct rd_comm *comm = NULL;
	struct rd_compute_call *cc;

	/* Read again: the call's parameters outlive the supervisor's
	 * answer, the worker's state may not have. */
	if (rp_comm_init_decode(call->msg.params, &req, &err) < 0 || rd_worker_refuse_if_not_ready(w, &err) < 0)
		goto fail;
	if (req.has_key && find_key(w, req.key, s->client->peer.uid)) {
		rp_error_set(&err, RP_ERR_INVALID_PARAMETER,
			     "key \"%s\" already names a communicator of this user on device %d: Attach it, or Destroy "
			     "it first", req.key, w->dev.index);
		cJSON_DeleteItemFromObject(err.params, "message");
		rp_error_add_str(&err, "parameter", "key");
		goto fail;
	}
	/* A limit of their own: each holds device memory and NCCL's threads,
	 * far more than a buffer's mapping. */
	if (s->client->count[RD_OBJECT_COMM] >= w->opts->max_comms) {
		rp_err_limit_exceeded(&err, "communicators", w->opts->max_comms,
				      "process %d already has %u communicators on device %d (max_comms): Destroy one first",
				      (int)s->client->peer.pid, s->client->count[RD_OBJECT_COMM], w->dev.index);
		goto fail;
	}
	cc = calloc(1, sizeof(*cc));
	if (!cc) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for the call");
		goto fail;
	}
	if (w->dev.backend->comm_create(&w->dev, req.unique_id, req.rank, req.nranks, &comm, &err) < 0) {
		free(cc);
		goto fail;
	}
	comm->device = &w->dev;
	comm->rank = req.rank;
	comm->nranks = req.nranks;
	comm->has_key = req.has_key;
	snprintf(comm->key, sizeof(comm->key), "%s", req.key);
	comm->key_uid = s->client->peer.uid;
	memcpy(comm->unique_id, req.unique_id, RP_COMM_ID_SIZE);
	rd_objects_add(&w->objects, &comm->obj, RD_OBJECT_COMM, s->client);
	rd_objects_ref(&comm->obj);
	comm->in_flight++;
	cc->op.comm = comm;
	cc->op.compute.spec = &rp_comm_init_op;
	cc->op.compute.comm.kind = RP_COMM_INIT;
	cc->op.compute.comm.comm = comm->obj.id;
	cc->op.compute.comm.rank = req.rank;
	cc->op.compute.comm.nranks = req.nranks;
	memcpy(cc->op.compute.comm.unique_id, req.unique_id, RP_COMM_ID_SIZE);
	cc->finish = init_finished;
	cc->op.compute.deadline_ms = req.deadline_ms;
	if (rd_compute_submit_call(s, cc, call, &err) < 0) {
		/* cc and its reference are gone; the table's goes too. */
		w->dev.backend->comm_abort(comm, "its Init was refused");
		rd_objects_close(&w->objects, &comm->obj);
		goto fail;
	}
	return;
fail:
	rd_call_fail(call, &err);
}

static void init_owned(struct rd_call *call, const unsigned char id[RP_COMM_ID_SIZE], uid_t owner)
{
	struct rd_session *s = rd_session_of(call);

	if (owner != s->client->peer.uid)
		refuse_not_owner(call, s->worker);
	else
		init_join(call);
}

void rd_comm_init(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_comm_init req;
	uid_t owner;

	if (!comm_supported(w, call))
		return;
	if (rp_comm_init_decode(call->msg.params, &req, &err) < 0 || rd_worker_refuse_if_not_ready(w, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	/* A rank of a communicator this worker holds: its uid says. Else the
	 * node's table, which binds an id nobody holds yet to the caller. */
	if (local_owner_of_unique_id(w, req.unique_id, &owner) == 0)
		init_owned(call, req.unique_id, owner);
	else
		ask_owner(call, req.unique_id, init_owned);
}

void rd_comm_attach(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	char key[RP_COMM_KEY_MAX + 1], id[RP_ID_MAX];
	struct rd_comm *comm;

	if (!comm_supported(w, call))
		return;
	if (rp_comm_attach_decode(call->msg.params, key, &err) < 0 || rd_worker_refuse_if_not_ready(w, &err) < 0)
		goto fail;
	comm = find_key(w, key, s->client->peer.uid);
	if (!comm || comm->obj.owner) {
		/* Held by a live process (perhaps the caller): not to be taken. */
		rp_err_no_such_object(&err, key,
				      "no detached communicator has key \"%s\" for uid %u on device %d (never made, still "
				      "held by a live process, ended with a generation change, or failed while detached)",
				      key, (unsigned)s->client->peer.uid, w->dev.index);
		goto fail;
	}
	if (comm_healthy(w, comm, &err) < 0) {
		/* A failed one is no use to anyone: it goes now. */
		rd_objects_close(&w->objects, &comm->obj);
		goto fail;
	}
	if (s->client->count[RD_OBJECT_COMM] >= w->opts->max_comms) {
		rp_err_limit_exceeded(&err, "communicators", w->opts->max_comms,
				      "process %d already has %u communicators on device %d (max_comms): Destroy one first",
				      (int)s->client->peer.pid, s->client->count[RD_OBJECT_COMM], w->dev.index);
		goto fail;
	}
	if (comm->in_flight) {
		rp_err_comm_in_flight(&err, comm_text(comm, id), comm->in_flight,
				      "communicator %s still has %u call(s) of the process that held it in flight; "
				      "attach once they finished", id, comm->in_flight);
		goto fail;
	}
	rd_objects_adopt(&w->objects, &comm->obj, s->client);
	rd_info("comm", w->dev.index, rd_worker_generation(w), s->client->peer.pid,
		"%s (key %s, rank %u of %u) attached after %llu collectives", comm_text(comm, id), comm->key, comm->rank,
		comm->nranks, (unsigned long long)comm->collectives);
	reply_comm(call, comm, true);
	return;
fail:
	rd_call_fail(call, &err);
}

int rd_comm_resolve(struct rd_worker *w, struct rd_op *op, const struct rd_client *who, struct rp_error *err)
{
	struct rd_comm *comm;
	char id[RP_ID_MAX];
	int r;

	if (!w->dev.backend->comm_create) {
		rp_err_backend_error(err, w->dev.index, "the %s backend has no communicators", w->dev.backend->name);
		return -ENOTSUP;
	}
	if ((r = find_comm(w, &op->compute.comm.comm, who, &comm, err)) < 0)
		return r;
	if (!comm->joined) {
		rp_err_comm_failed(err, comm_text(comm, id), "not initialized",
				   "communicator %s has not finished its Init", id);
		return -EAGAIN;
	}
	if ((r = comm_healthy(w, comm, err)) < 0 ||
	    (r = rp_comm_check_ranks(&op->compute, comm->rank, comm->nranks, err)) < 0)
		return r;
	rd_objects_ref(&comm->obj);
	comm->in_flight++;
	op->comm = comm;
	return 0;
}

void rd_comm_abort(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_comm_end req;
	struct rd_comm *comm;
	char id[RP_ID_MAX];

	if (!comm_supported(w, call))
		return;
	if (rp_comm_end_decode(call->msg.params, false, &req, &err) < 0 ||
	    find_comm(w, &req.comm, s->client, &comm, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	rd_info("comm", w->dev.index, rd_worker_generation(w), s->client->peer.pid, "%s aborted by its owner (%u in flight)",
		comm_text(comm, id), comm->in_flight);
	w->dev.backend->comm_abort(comm, "aborted by its owner");
	rd_call_reply(call, NULL, false);
}

/* Destroy's finalize finished (or was cut short by an abort): the id goes. */
static void destroy_finished(struct rd_compute_call *cc)
{
	struct rd_worker *w = cc->session->worker;
	struct rd_comm *comm = cc->op.comm;

	if (!comm->obj.closing)
		rd_objects_close(&w->objects, &comm->obj);
	if (cc->call)
		rd_call_reply(cc->call, NULL, false);
	/* A finalize that failed leaves an aborted communicator to free: the
	 * caller asked for it to end, and it did. */
	rp_error_clear(&cc->op.err);
}

void rd_comm_destroy(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_comm_end req;
	struct rd_comm *comm;
	struct rd_compute_call *cc;
	char id[RP_ID_MAX];

	if (!comm_supported(w, call))
		return;
	if (rp_comm_end_decode(call->msg.params, true, &req, &err) < 0 ||
	    find_comm(w, &req.comm, s->client, &comm, &err) < 0)
		goto fail;
	if (comm->in_flight && !req.abort) {
		rp_err_comm_in_flight(&err, comm_text(comm, id), comm->in_flight,
				      "communicator %s has %u call(s) in flight: wait for them, or Destroy with abort", id,
				      comm->in_flight);
		goto fail;
	}
	/* Aborted, failed, never joined, or the caller asked: nothing to
	 * finalize. Its calls in flight end with CommFailed, and the backend
	 * closes it once they have. */
	if (req.abort || !comm->joined || w->dev.backend->comm_status(comm, &err) < 0 ||
	    w->state != RD_WORKER_READY) {
		rp_error_clear(&err);
		w->dev.backend->comm_abort(comm, req.abort ? "destroyed with abort by its owner" : "destroyed");
		rd_objects_close(&w->objects, &comm->obj);
		rd_call_reply(call, NULL, false);
		return;
	}
	cc = calloc(1, sizeof(*cc));
	if (!cc) {
		rp_err_out_of_memory(&err, w->dev.index, "no host memory for the call");
		goto fail;
	}
	rd_objects_ref(&comm->obj);
	comm->in_flight++;
	cc->op.comm = comm;
	cc->op.compute.spec = &rp_comm_destroy_op;
	cc->op.compute.comm.kind = RP_COMM_DESTROY;
	cc->op.compute.comm.comm = comm->obj.id;
	cc->finish = destroy_finished;
	cc->op.compute.deadline_ms = req.deadline_ms;
	if (rd_compute_submit_call(s, cc, call, &err) < 0)
		goto fail;
	return;
fail:
	rd_call_fail(call, &err);
}

void rd_comm_deadline(struct rd_worker *w, struct rd_compute_call *cc, uint64_t now)
{
	struct rd_comm *comm = cc->op.comm;
	uint64_t elapsed_ms = (now - cc->op.submitted_ns) / 1000000u;
	uint64_t limit_ms = (cc->deadline_ns - cc->op.submitted_ns) / 1000000u;
	int pid = cc->session && cc->session->client ? (int)cc->session->client->peer.pid : 0;
	struct rp_error err = { 0 };
	char id[RP_ID_MAX];

	rd_warn("comm", w->dev.index, rd_worker_generation(w), pid,
		"%s on %s (rank %u of %u) passed its deadline of %llu ms (%llu ms in flight): aborting the communicator",
		cc->op.compute.spec->method, comm_text(comm, id), comm->rank, comm->nranks, (unsigned long long)limit_ms,
		(unsigned long long)elapsed_ms);
	w->dev.backend->comm_abort(comm, "a call passed its deadline");
	if (cc->op.compute.comm.kind == RP_COMM_DESTROY) {
		/* Its peers did not finalize in time: the abort ends it, and
		 * Destroy's reply follows as asked. */
		cc->deadline_ns = 0;
		return;
	}
	rp_err_comm_timeout(&err, id, (long long)elapsed_ms,
			    "%s on communicator %s (rank %u of %u) did not finish within its deadline of %llu ms (a peer "
			    "that never joined or called?); the communicator was aborted: Destroy it and Init again",
			    cc->op.compute.spec->method, id, comm->rank, comm->nranks, (unsigned long long)limit_ms);
	cc->answered = true;
	rd_call_fail(cc->call, &err);
	cc->call = NULL;
	w->abandoned++;
}

/* Communicators of uid left detached by processes that are gone. */
static unsigned detached_of(struct rd_worker *w, uid_t uid)
{
	unsigned n = 0;

	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		for (struct rd_object *o = w->objects.table[b]; o; o = o->next_in_table) {
			if (rd_object_kind_of(o) == RD_OBJECT_COMM && !o->owner && !o->closing &&
			    rd_object_comm(o)->key_uid == uid)
				n++;
		}
	}
	return n;
}

bool rd_comm_keep_detached(struct rd_object *o, void *worker)
{
	struct rd_worker *w = worker;
	struct rd_comm *comm = rd_object_comm(o);
	struct rp_error err = { 0 };
	char id[RP_ID_MAX];
	bool keep = comm->has_key && comm->joined && w->state == RD_WORKER_READY &&
		    w->dev.backend->comm_status(comm, &err) == 0;

	rp_error_clear(&err);
	/* Nobody holds a detached communicator to its process's max_comms:
	 * without a bound of its own a user could pile them up, one process
	 * after another, until the generation ends. */
	if (keep && detached_of(w, comm->key_uid) >= w->opts->max_comms) {
		rd_warn("comm", w->dev.index, rd_worker_generation(w), 0,
			"%s (key %s, rank %u of %u) aborted, not detached: uid %u already has %u detached communicators "
			"(max_comms)", comm_text(comm, id), comm->key, comm->rank, comm->nranks, (unsigned)comm->key_uid,
			w->opts->max_comms);
		keep = false;
	}
	if (keep) {
		rd_info("comm", w->dev.index, rd_worker_generation(w), 0,
			"%s (key %s, rank %u of %u) detached: its process is gone", comm_text(comm, id), comm->key,
			comm->rank, comm->nranks);
		return true;
	}
	w->dev.backend->comm_abort(comm, "its process went away");
	return false;
}

static void abort_each(struct rd_worker *w, bool only_busy, const char *why)
{
	/* No backend yet: a worker that could not load one holds nothing. */
	if (!w->dev.backend || !w->dev.backend->comm_abort)
		return;
	for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++) {
		for (struct rd_object *o = w->objects.table[b]; o; o = o->next_in_table) {
			if (rd_object_kind_of(o) == RD_OBJECT_COMM && (!only_busy || rd_object_comm(o)->in_flight))
				w->dev.backend->comm_abort(rd_object_comm(o), why);
		}
	}
}

void rd_comm_abort_busy(struct rd_worker *w, const char *why)
{
	abort_each(w, true, why);
}

void rd_comm_abort_all(struct rd_worker *w, const char *why)
{
	abort_each(w, false, why);
}
