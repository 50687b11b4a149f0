/* SPDX-License-Identifier: Apache-2.0 */
#include "daemon/dispatch.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/supervisor/methods.h"
#include "daemon/supervisor/session.h"
#include "proto/errors.h"

static void on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_trace("conn", -1, 0, conn->peer.pid, "call %s", call->msg.method);
	rd_dispatch(&rd_sv_main_endpoint, call);
}

static void on_close(struct rd_conn *conn)
{
	struct rd_supervisor *sv = conn->data;

	rd_sv_watch_drop(&sv->watch, conn);
	for (struct rd_conn **c = &sv->sessions; *c; c = &(*c)->next) {
		if (*c == conn) {
			*c = conn->next;
			break;
		}
	}
	rd_sv_keep_connection_closed(&sv->keep, conn, sv->sessions);
	rd_debug("conn", -1, 0, conn->peer.pid, "client gone");
}

/* Every error a client of the main socket gets passes here: one whose IDL
 * type carries a device and a generation has them, whichever method raised
 * it. The methods fill them in; what one left out names the node (device
 * -1) and no generation (0), never a missing field. */
static void complete_error(struct rd_conn *conn, struct rp_error *err)
{
	if (!err->name || !err->params)
		return;
	if (rp_error_type_has(err->name, "device") && !cJSON_HasObjectItem(err->params, "device"))
		rp_error_add_int(err, "device", -1);
	if (rp_error_type_has(err->name, "generation") && !cJSON_HasObjectItem(err->params, "generation"))
		rp_error_add_int(err, "generation", 0);
}

static const struct rd_conn_ops session_ops = { on_call, on_close, complete_error };

static bool is_admin(const struct rd_supervisor *sv, const struct rd_conn *conn)
{
	return rd_peer_is_admin(&conn->peer, conn->fd, sv->opts.admin_gid, sv->opts.have_admin_gid);
}

void rd_sv_session_accept(int fd, void *data)
{
	struct rd_supervisor *sv = data;
	struct rd_conn *conn;
	unsigned same_uid;
	char job[2 * RP_JOB_MAX + 16];

	if (rd_conn_new(sv->loop, fd, &session_ops, sv, &conn) < 0)
		return;
	same_uid = rd_conns_of_uid(sv->sessions, conn->peer.uid);
	conn->admin = is_admin(sv, conn);
	conn->next = sv->sessions;
	sv->sessions = conn;
	if (same_uid >= sv->opts.max_connections) {
		rd_warn("conn", -1, 0, conn->peer.pid, "refusing connection: uid %u has %u open", (unsigned)conn->peer.uid,
			same_uid);
		rd_conn_refuse(conn, "connections", sv->opts.max_connections);
		return;
	}
	rd_debug("conn", -1, 0, conn->peer.pid, "client connected (uid %u%s%s%s)", (unsigned)conn->peer.uid,
		 conn->admin ? ", admin" : "", conn->peer.job[0] ? ", " : "",
		 rd_job_describe(conn, job, sizeof(job)));
}

void rd_sv_sessions_readmit(struct rd_supervisor *sv)
{
	for (struct rd_conn *c = sv->sessions; c; c = c->next)
		c->admin = is_admin(sv, c);
}

void rd_sv_sessions_close(struct rd_supervisor *sv)
{
	for (struct rd_conn *c = sv->sessions, *next; c; c = next) {
		next = c->next;
		rd_conn_close(c);
	}
}
