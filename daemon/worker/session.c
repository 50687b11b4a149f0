/* SPDX-License-Identifier: Apache-2.0 */
/* Connections to the worker socket: accept, the method table, the lane,
 * the one place every error a client gets is completed, and the close. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include "daemon/dispatch.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/comm.h"
#include "proto/compute.h"
#include "proto/errors.h"
#include "proto/idl.h"

static void session_maybe_free(struct rd_session *s)
{
	struct rd_worker *w = s->worker;

	if (!s->closed || s->in_flight)
		return;
	rd_ring_destroy(s->ring);
	if (s->lane)
		w->dev.backend->lane_destroy(s->lane);
	if (s->client)
		rd_objects_client_put(&w->objects, s->client);
	if (s->usage)
		s->usage->sessions--;
	rd_usage_put(s->usage);
	for (struct rd_session **p = &w->sessions; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	rd_conn_release(s->conn);
	free(s);
	w->nsessions--;
}

struct rd_lane *rd_session_lane(struct rd_session *s, struct rp_error *err)
{
	struct rd_worker *w = s->worker;

	if (!s->lane) {
		s->lane = w->dev.backend->lane_create(&w->dev, w->next_lane++, err);
		if (s->lane)
			s->lane->uid = s->conn->peer.uid;
	}
	return s->lane;
}

void rd_session_call_started(struct rd_session *s)
{
	s->in_flight++;
	s->worker->in_flight++;
	if (s->usage)
		s->usage->in_flight++;
}

void rd_session_call_uncount(struct rd_session *s)
{
	s->in_flight--;
	s->worker->in_flight--;
	if (s->usage)
		s->usage->in_flight--;
}

void rd_session_call_finished(struct rd_session *s)
{
	struct rd_worker *w = s->worker;

	rd_session_call_uncount(s);
	session_maybe_free(s);
	rd_worker_call_finished(w);
}

/* Generation is the one io.regen.Device method a worker answers: what its
 * own device is at, cheaply, for a client that holds only this socket. */
static void method_generation(struct rd_call *call)
{
	static const struct rp_field fields[] = { { NULL } };
	struct rd_worker *w = rd_session_of(call)->worker;
	struct rp_error err = { 0 };
	cJSON *reply, *devices, *d;

	if (rp_params_check(call->msg.params, fields, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	reply = cJSON_CreateObject();
	devices = cJSON_AddArrayToObject(reply, "devices");
	d = cJSON_CreateObject();
	cJSON_AddNumberToObject(reply, "epoch", (double)w->epoch);
	cJSON_AddNumberToObject(d, "index", w->dev.index);
	cJSON_AddNumberToObject(d, "generation", (double)rd_worker_generation(w));
	cJSON_AddStringToObject(d, "state", w->state == RD_WORKER_READY ? "ready"
					  : w->state == RD_WORKER_LOST ? "faulted" : "draining");
	cJSON_AddStringToObject(d, "backend", w->dev.backend->name);
	cJSON_AddItemToArray(devices, d);
	rd_call_reply(call, reply, false);
}

/* Counts the session in the job that names its connection now: at accept,
 * and again when the client states another. Its calls in flight move with
 * it; what it imported stays counted where it was made. */
static int session_count_job(struct rd_session *s)
{
	const char *job;
	enum rp_job_source source = rd_job_of(s->conn, &job);
	struct rd_usage *u = rd_usage_get(&s->worker->usage, source, job, s->conn->peer.uid);

	if (!u)
		return -ENOMEM;
	if (s->usage) {
		s->usage->sessions--;
		s->usage->in_flight -= s->in_flight;
		rd_usage_put(s->usage);
	}
	s->usage = u;
	u->sessions++;
	u->in_flight += s->in_flight;
	return 0;
}

static void method_set_job(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	char job[2 * RP_JOB_MAX + 16];

	/* The call is gone once answered: the session is not. */
	if (rd_job_set(call) < 0)
		return;
	/* Out of memory: the session keeps counting where it did. */
	session_count_job(s);
	rd_debug("conn", w->dev.index, rd_worker_generation(w), s->conn->peer.pid, "job %s",
		 rd_job_describe(s->conn, job, sizeof(job))[0] ? job : "none");
}

/* Lifecycle verbs belong on the main socket: say where. */
static void method_main_endpoint(struct rd_call *call)
{
	struct rd_worker *w = rd_session_of(call)->worker;
	struct rp_error err = { 0 };

	rp_err_wrong_endpoint(&err, call->msg.method, w->opts->socket_path,
			      "%s is served on regend's main socket %s, not on a worker socket", call->msg.method,
			      w->opts->socket_path);
	rd_call_fail(call, &err);
}

static const struct rd_method data_methods[] = {
	{ "io.regen.Memory.ImportBuffer", rd_memory_import_buffer, .takes_fds = true },
	{ "io.regen.Memory.CloseBuffer", rd_memory_close_buffer },
	{ "io.regen.Memory.ImportEvent", rd_memory_import_event },
	{ "io.regen.Memory.CloseEvent", rd_memory_close_event },
	{ "io.regen.Lane.Open", rd_ring_open, .takes_fds = true },
	{ "io.regen.Lane.Bind", rd_ring_bind },
	{ "io.regen.Comm.GetUniqueId", rd_comm_get_unique_id },
	{ "io.regen.Comm.Init", rd_comm_init },
	{ "io.regen.Comm.Attach", rd_comm_attach },
	{ "io.regen.Comm.Abort", rd_comm_abort },
	{ "io.regen.Comm.Destroy", rd_comm_destroy },
	{ "io.regen.Program.Define", rd_program_define },
	{ "io.regen.Program.Run", rd_program_run },
	{ "io.regen.Program.Drop", rd_program_drop },
	{ "io.regen.Program.Status", rd_program_status },
	{ "io.regen.SetJob", method_set_job },
	{ "io.regen.Device.Generation", method_generation },
	{ NULL },
};

static void (*find_compute(const char *method))(struct rd_call *call)
{
	return rp_op_find(method) || rp_comm_op_find(method) ? rd_compute_call : NULL;
}

/* io.regen.Device is the main socket's: the worker answers only Generation
 * of it and points the rest there (elsewhere), so it does not claim the
 * interface. */
static const struct rd_endpoint data_endpoint = {
	.methods = data_methods, .interfaces = rp_worker_interfaces, .find = find_compute,
	.elsewhere = method_main_endpoint
};

static void data_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(&data_endpoint, call);
}

/* Every error a client of this worker gets passes here: an error whose IDL
 * type carries the device and its generation gets them, whichever path or
 * backend raised it without. */
static void data_complete_error(struct rd_conn *conn, struct rp_error *err)
{
	rd_session_complete_error(conn->data, err);
}

void rd_session_complete_error(struct rd_session *s, struct rp_error *err)
{
	struct rd_worker *w = s->worker;

	if (!err->name || !err->params)
		return;
	if (rp_error_type_has(err->name, "device") && !cJSON_HasObjectItem(err->params, "device"))
		rp_error_add_int(err, "device", w->dev.index);
	if (rp_error_type_has(err->name, "generation") && !cJSON_HasObjectItem(err->params, "generation"))
		rp_error_add_int(err, "generation", (long long)rd_worker_generation(w));
}

static void data_on_close(struct rd_conn *conn)
{
	struct rd_session *s = conn->data;

	s->closed = true;
	rd_ring_finish(s->ring);
	rd_debug("conn", s->worker->dev.index, rd_worker_generation(s->worker), conn->peer.pid, "client gone");
	if (s->in_flight)
		rd_orphan_watch(s);
	session_maybe_free(s);
}

static const struct rd_conn_ops data_ops = {
	.on_call = data_on_call,
	.on_close = data_on_close,
	.complete_error = data_complete_error,
};

void rd_session_accept(int fd, void *worker)
{
	struct rd_worker *w = worker;
	struct rd_session *s = calloc(1, sizeof(*s));
	struct rd_conn *conn;

	if (!s) {
		close(fd);
		return;
	}
	s->worker = w;
	if (rd_conn_new(w->loop, fd, &data_ops, s, &conn) < 0) {
		free(s);
		return;
	}
	s->conn = conn;
	/* The session outlives its connection's close while its calls run
	 * (ring records hold no call): what it reads of the connection then
	 * (closed, peer) must still be there. */
	rd_conn_hold(conn);
	w->nsessions++;
	s->next = w->sessions;
	w->sessions = s;
	s->client = rd_objects_client_get(&w->objects, &conn->peer);
	if (!s->client || session_count_job(s) < 0) {
		s->closed = true;
		rd_conn_close(conn);
		return;
	}
	/* Counted per uid, as on the main socket: many processes of one user
	 * are one user's connections. */
	if (rd_objects_connections_of_uid(&w->objects, conn->peer.uid) > w->opts->max_connections) {
		rd_warn("conn", w->dev.index, rd_worker_generation(w), conn->peer.pid,
			"refusing connection: uid %u has %u open", (unsigned)conn->peer.uid, w->opts->max_connections);
		rd_conn_refuse(conn, "connections", w->opts->max_connections);
		return;
	}
	rd_debug("conn", w->dev.index, rd_worker_generation(w), conn->peer.pid, "client connected (uid %u%s%s)",
		 (unsigned)conn->peer.uid, conn->peer.job[0] ? ", " : "", conn->peer.job);
}
