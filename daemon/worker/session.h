/* A connection to a worker socket: one client process's lane. Its calls run
 * in order on the lane (a CUDA stream on the cuda backend); the session
 * lives until the connection closed and its last call finished. */
#pragma once

#include <stdbool.h>
#include "daemon/conn.h"
#include "daemon/worker/worker.h"

struct rd_session {
	struct rd_session *next;        /* the worker's list */
	struct rd_worker *worker;
	struct rd_conn *conn;
	struct rd_client *client;       /* the process, shared by its connections */
	struct rd_lane *lane;           /* made on first compute call */
	unsigned in_flight;
	bool closed;
};

static inline struct rd_session *rd_session_of(const struct rd_call *call)
{
	return call->conn->data;
}

/* The session's lane, made on first use. NULL with err set. */
struct rd_lane *rd_session_lane(struct rd_session *s, struct rp_error *err);
/* Calls in flight keep the session (and its lane) alive past a close. */
void rd_session_call_started(struct rd_session *s);
void rd_session_call_finished(struct rd_session *s);

/* The methods of a worker socket, by interface: memory.c, compute.c. */
void rd_memory_import_buffer(struct rd_call *call);
void rd_memory_close_buffer(struct rd_call *call);
void rd_memory_import_event(struct rd_call *call);
void rd_memory_close_event(struct rd_call *call);
/* Every io.regen.Compute method (the op table of proto/compute.h says
 * which). */
void rd_compute_call(struct rd_call *call);
