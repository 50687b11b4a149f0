/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: communicators (io.regen.Comm). A communicator is an object of
 * the client's list like a buffer (one device, one generation); the
 * collectives are encoded by proto/comm.h's tables, the ones the worker
 * parses them with. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "private.h"
#include "proto/comm.h"

_Static_assert(REGEN_COMM_UNIQUE_ID_BYTES == RP_COMM_ID_SIZE, "a unique id is the protocol's");
_Static_assert((int)REGEN_REDUCE_PROD == (int)RP_REDUCE_PROD && (int)REGEN_REDUCE_AVG == (int)RP_REDUCE_AVG,
	       "libregen's reductions are the protocol's");

static bool device_ok(int device)
{
	return device >= 0 && device < REGEN_DEVICES_MAX;
}

REGEN_EXPORT int regen_comm_unique_id(regen_client *c, int device, unsigned char id[REGEN_COMM_UNIQUE_ID_BYTES])
{
	struct rp_error err = { 0 };
	cJSON *reply = NULL;
	int r;

	if (c == NULL || id == NULL || !device_ok(device))
		return -EINVAL;
	r = rc_call(c, device, RP_COMM_METHOD_GET_UNIQUE_ID, NULL, NULL, 0, &reply);
	if (r < 0)
		return r;
	r = rp_comm_unique_id_reply_decode(reply, id, &err);
	cJSON_Delete(reply);
	return r < 0 ? rc_malformed_reply(c, RP_COMM_METHOD_GET_UNIQUE_ID, &err) : 0;
}

/* Sends Init or Attach (params consumed) and makes the handle. */
static int open_comm(regen_client *c, int device, const char *method, cJSON *params, regen_comm **out)
{
	struct rp_comm_reply rep;
	struct rp_error err = { 0 };
	cJSON *reply = NULL;
	regen_comm *comm;
	int r;

	if (params == NULL)
		return -ENOMEM;
	r = rc_call(c, device, method, params, NULL, 0, &reply);
	cJSON_Delete(params);
	if (r < 0)
		return r;
	r = rp_comm_reply_decode(reply, &rep, &err);
	cJSON_Delete(reply);
	if (r < 0)
		return rc_malformed_reply(c, method, &err);
	comm = calloc(1, sizeof(*comm));
	if (comm == NULL)
		return -ENOMEM;
	comm->rank = rep.rank;
	comm->nranks = rep.nranks;
	comm->collectives = rep.collectives;
	rc_object_add(c, &comm->obj, device, &rep.comm);
	*out = comm;
	return 0;
}

REGEN_EXPORT int regen_comm_init(regen_client *c, const struct regen_comm_init_args *a, regen_comm **out)
{
	struct rp_comm_init req = { 0 };

	if (c == NULL || a == NULL || out == NULL || a->unique_id == NULL || !device_ok(a->device) ||
	    (a->key != NULL && strlen(a->key) > RP_COMM_KEY_MAX))
		return -EINVAL;
	memcpy(req.unique_id, a->unique_id, RP_COMM_ID_SIZE);
	req.rank = a->rank;
	req.nranks = a->nranks;
	req.deadline_ms = a->deadline_ms;
	if (a->key != NULL) {
		req.has_key = true;
		snprintf(req.key, sizeof(req.key), "%s", a->key);
	}
	return open_comm(c, a->device, RP_COMM_METHOD_INIT, rp_comm_init_encode(&req), out);
}

REGEN_EXPORT int regen_comm_attach(regen_client *c, int device, const char *key, regen_comm **out)
{
	if (c == NULL || key == NULL || out == NULL || !device_ok(device))
		return -EINVAL;
	return open_comm(c, device, RP_COMM_METHOD_ATTACH, rp_comm_attach_encode(key), out);
}

/* A tensor as a collective's operand: rank 1, contiguous. */
static int put_tensor(regen_client *c, const regen_comm *comm, const struct regen_tensor *t, const char *name,
		      struct rp_operand *op)
{
	if (t->buffer == NULL || t->buffer->obj.client != c || t->buffer->obj.device != comm->obj.device ||
	    (unsigned)t->dtype > REGEN_U8 || t->rank != 1) {
		rc_set_local_error(c, "%s must be a rank-1 tensor in a buffer of this client on device %d", name,
				   comm->obj.device);
		return -EINVAL;
	}
	op->buffer = t->buffer->obj.rid;
	op->offset = t->offset;
	op->dtype = (enum rp_dtype)t->dtype;
	op->rank = 1;
	op->shape[0] = t->shape[0];
	op->strides[0] = 1;
	return 0;
}

static int put_event(regen_client *c, const regen_comm *comm, const regen_event *ev, struct rp_event_ref *ref)
{
	if (ev == NULL)
		return 0;
	if (ev->obj.client != c || ev->obj.device != comm->obj.device) {
		rc_set_local_error(c, "event %s is not this client's on device %d", ev->obj.id, comm->obj.device);
		return -EINVAL;
	}
	ref->present = true;
	ref->id = ev->obj.rid;
	return 0;
}

static int collective(regen_client *c, const struct regen_collective_args *a, const struct rp_op_spec *spec)
{
	struct rp_compute call = { .spec = spec };
	cJSON *params;
	int r;

	bool sends = spec != &rp_comm_recv, receives = spec != &rp_comm_send;
	/* Send's and Recv's one operand is the op's slot 0 (RP_COMM_PEER_BUF). */
	int send_slot = RP_COMM_SEND, recv_slot = spec == &rp_comm_recv ? RP_COMM_PEER_BUF : RP_COMM_RECV;

	if (c == NULL || a == NULL || a->comm == NULL || (unsigned)a->op > REGEN_REDUCE_PROD)
		return -EINVAL;
	/* In a forked child the parent's communicators are not this client's. */
	rc_check_fork(c);
	if (a->comm->obj.client != c) {
		rc_set_local_error(c, "communicator %s belongs to another client", a->comm->obj.id);
		return -EINVAL;
	}
	if ((sends && (r = put_tensor(c, a->comm, &a->send, "send", &call.operands[send_slot])) < 0) ||
	    (receives && (r = put_tensor(c, a->comm, &a->recv, "recv", &call.operands[recv_slot])) < 0) ||
	    (r = put_event(c, a->comm, a->wait_event, &call.wait_event)) < 0 ||
	    (r = put_event(c, a->comm, a->signal_event, &call.signal_event)) < 0)
		return r;
	call.present[send_slot] = sends;
	call.present[recv_slot] = receives;
	call.deadline_ms = a->deadline_ms;
	call.comm.comm = a->comm->obj.rid;
	call.comm.op = (enum rp_reduce_op)a->op;
	call.comm.root = a->root;
	call.comm.peer = a->peer;
	for (int k = RP_COMM_ALL_REDUCE; k < RP_COMM_KINDS; k++)
		if (rp_comm_op_get((enum rp_comm_kind)k) == spec)
			call.comm.kind = (enum rp_comm_kind)k;
	params = rp_compute_to_json(&call);
	if (params == NULL)
		return -ENOMEM;
	r = rc_call(c, a->comm->obj.device, spec->method, params, NULL, 0, NULL);
	cJSON_Delete(params);
	return r;
}

REGEN_EXPORT int regen_comm_all_reduce(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_all_reduce);
}

REGEN_EXPORT int regen_comm_all_gather(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_all_gather);
}

REGEN_EXPORT int regen_comm_reduce_scatter(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_reduce_scatter);
}

REGEN_EXPORT int regen_comm_broadcast(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_broadcast);
}

REGEN_EXPORT int regen_comm_all_to_all(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_all_to_all);
}

REGEN_EXPORT int regen_comm_send(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_send);
}

REGEN_EXPORT int regen_comm_recv(regen_client *c, const struct regen_collective_args *a)
{
	return collective(c, a, &rp_comm_recv);
}

static int end(regen_comm *comm, bool destroy, bool abort, uint32_t deadline_ms)
{
	regen_client *c;
	struct rp_comm_end req = { .comm = comm->obj.rid, .abort = abort, .deadline_ms = deadline_ms };
	const char *method = destroy ? RP_COMM_METHOD_DESTROY : RP_COMM_METHOD_ABORT;
	cJSON *p;
	int r;

	rc_check_fork(comm->obj.client);
	c = comm->obj.client;
	if (c == NULL)
		return -ENOTCONN;
	if (c->known_generation[comm->obj.device] > comm->obj.rid.generation)
		return destroy ? 0 : -ESTALE;   /* ended with its generation */
	p = rp_comm_end_encode(&req, destroy);
	if (p == NULL)
		return -ENOMEM;
	r = rc_call(c, comm->obj.device, method, p, NULL, 0, NULL);
	cJSON_Delete(p);
	if (r == -EREMOTE && destroy) {
		const char *name = regen_client_error_name(c);

		if (name != NULL && (strcmp(name, REGEN_ERROR_STALE_GENERATION) == 0 ||
				     strcmp(name, REGEN_ERROR_DEVICE_LOST) == 0))
			r = 0;
	}
	return r;
}

REGEN_EXPORT int regen_comm_abort(regen_comm *comm)
{
	return comm == NULL ? -EINVAL : end(comm, false, false, 0);
}

REGEN_EXPORT int regen_comm_destroy(regen_comm *comm, bool abort, uint32_t deadline_ms)
{
	int r;

	if (comm == NULL)
		return 0;
	r = end(comm, true, abort, deadline_ms);
	rc_object_unlink(&comm->obj);
	free(comm);
	return r;
}

REGEN_EXPORT const char *regen_comm_id(const regen_comm *comm)
{
	return comm ? comm->obj.id : NULL;
}

REGEN_EXPORT uint64_t regen_comm_generation(const regen_comm *comm)
{
	return comm ? comm->obj.rid.generation : 0;
}

REGEN_EXPORT int regen_comm_device(const regen_comm *comm)
{
	return comm ? comm->obj.device : -1;
}

REGEN_EXPORT uint32_t regen_comm_rank(const regen_comm *comm)
{
	return comm ? comm->rank : 0;
}

REGEN_EXPORT uint32_t regen_comm_nranks(const regen_comm *comm)
{
	return comm ? comm->nranks : 0;
}

REGEN_EXPORT uint64_t regen_comm_collectives(const regen_comm *comm)
{
	return comm ? comm->collectives : 0;
}
