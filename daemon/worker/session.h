/* SPDX-License-Identifier: Apache-2.0 */
/* A connection to a worker socket: one client process's lane. Its calls run
 * in order on the lane (a CUDA stream on the cuda backend); the session
 * lives until the connection closed and its last call finished. */
#pragma once

#include <stdbool.h>
#include "daemon/conn.h"
#include "daemon/worker/worker.h"

struct rp_program_run;

struct rd_session {
	struct rd_session *next;        /* the worker's list */
	struct rd_worker *worker;
	struct rd_conn *conn;
	struct rd_client *client;       /* the process, shared by its connections */
	struct rd_usage *usage;         /* the job that names the connection (usage.h) */
	struct rd_lane *lane;           /* made on first compute call */
	struct rd_ring *ring;           /* io.regen.Lane.Open's, NULL until then */
	unsigned in_flight;
	bool closed;
	/* Closed with calls in flight: watched until none of them waits on
	 * an event of its process's that will never be done (orphan.c). */
	bool orphan_watch;
	uint64_t closed_ns, gone_ns;    /* uv_hrtime() of the close, of seeing the process gone */
	unsigned orphan_ahead;          /* the most calls seen running ahead of the waiting ones */
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
/* Gives back the counts rd_session_call_started took, nothing else: for a
 * started call its backend refused (no completion follows, the caller
 * answers it), and as the first step of rd_session_call_finished. */
void rd_session_call_uncount(struct rd_session *s);

/* A session just closed with calls in flight: if its process is gone and
 * a call of it still waits on that process's GPU work after a grace, the
 * device is reported hung at once (orphan.c). */
void rd_orphan_watch(struct rd_session *s);
void rd_orphan_init(struct rd_worker *w);
void rd_orphan_stop(struct rd_worker *w);

/* The methods of a worker socket, by interface: memory.c, compute.c. */
void rd_memory_import_buffer(struct rd_call *call);
void rd_memory_close_buffer(struct rd_call *call);
void rd_memory_import_event(struct rd_call *call);
void rd_memory_close_event(struct rd_call *call);
/* Every io.regen.Compute method (the op table of proto/compute.h says
 * which), and io.regen.Comm's collectives (proto/comm.h's tables). */
void rd_compute_call(struct rd_call *call);
/* The one way into the backend for a Varlink call or a ring record whose
 * cc->op.compute is parsed and checked, op.done (and op.completed), and
 * cc->call or cc->answer_early set: the worker takes work, every operand
 * and event is resolved for the session's process and checked against its
 * buffer, the call gets its deadline (the health watch follows it) and the
 * op goes to the session's lane. 0: op.done follows on the loop thread,
 * which calls rd_compute_finished. < 0: err set, nothing held, cc not
 * freed. */
int rd_compute_submit(struct rd_session *s, struct rd_compute_call *cc, struct rp_error *err);
/* rd_compute_submit for a Varlink call: answers `call` when the op
 * finishes (or cc->finish does). < 0: err set, nothing held, cc freed. */
int rd_compute_submit_call(struct rd_session *s, struct rd_compute_call *cc, struct rd_call *call,
			   struct rp_error *err);
/* io.regen.Program (program.c). */
void rd_program_define(struct rd_call *call);
/* A checked program of owner's, within its process's and uid's limits,
 * given to the backend and to the table: under a new id, or with the serial
 * an earlier worker gave it (serial != 0). 0: *out holds def; < 0: err set,
 * def still the caller's. */
int rd_program_add(struct rd_worker *w, struct rd_client *owner, struct rp_program *def, uint64_t serial,
		   struct rd_program **out, struct rp_error *err);
/* The programs that outlive this worker (program_keep.c). A program just
 * defined, its Define call's text as the client sent it: the supervisor
 * keeps it for the next worker (a process bound to its connection has no
 * next, and nothing is kept of it). */
void rd_program_keep(struct rd_worker *w, const struct rd_program *prog, const struct rd_client *owner,
		     const char *message, size_t len);
/* Defines again, before the worker serves, the programs the supervisor
 * kept (--programs-fd): each for its process, under its id, if that
 * process is still there; the others are forgotten. Watches each owner
 * with no connection yet, and lets its programs go when it exits. Tells
 * the supervisor of every program this worker lets go from then on. */
void rd_program_keep_start(struct rd_worker *w, int fd);
/* Lets go of the owners' watches (the worker stops). */
void rd_program_keep_stop(struct rd_worker *w);
void rd_program_run(struct rd_call *call);
/* The caller's program of that id: 0, or NoSuchObject (or StaleGeneration,
 * for another device's) in err. */
int rd_program_find(struct rd_worker *w, struct rd_session *s, const struct rp_id *id, struct rd_program **out,
		    struct rp_error *err);
/* A Run of prog, as parsed from either transport (req), into cc's op: every
 * binding and the journal resolved for the session's process and checked
 * against its buffer (each held), the op's spec, events and deadline set;
 * cc->op.launched, done and the submit are the caller's. 0, or < 0 with err
 * set; what is held stays on cc->op either way (rd_compute_release). */
int rd_program_run_prepare(struct rd_session *s, struct rd_program *prog, const struct rp_program_run *req,
			   struct rd_compute_call *cc, struct rp_error *err);
void rd_program_drop(struct rd_call *call);
void rd_program_status(struct rd_call *call);
/* Any thread (the backend's op.launched of a Varlink call with a
 * signal_event): the call is answered on the loop thread, before its done. */
void rd_compute_post_launched(struct rd_op *op);
/* What a call answered at launch reports as its elapsed_us: the time from
 * its arrival until its work was enqueued. */
static inline uint64_t rd_compute_launch_us(const struct rd_op *op)
{
	return (op->launched_ns - op->submitted_ns) / 1000;
}
/* The loop thread: answers a call posted by rd_compute_post_launched. */
void rd_compute_launched(struct rd_op *op);
/* The loop thread, as a call answered at launch is done: an error its
 * completion found goes to the log (its caller heard success). */
void rd_compute_log_after_launch(struct rd_compute_call *cc);
/* Lets go of the objects an op held (each once). */
void rd_compute_release(struct rd_worker *w, struct rd_op *op);
/* A submitted call is done (op.done): its objects and its deadline go. */
void rd_compute_finished(struct rd_worker *w, struct rd_compute_call *cc);
/* Adds to an error what the endpoint knows and its raiser may not (the
 * device and its generation, where the IDL gives the error those); any
 * thread. */
void rd_session_complete_error(struct rd_session *s, struct rp_error *err);

/* io.regen.Lane (ring.c): the lane's submission and completion rings. */
void rd_ring_open(struct rd_call *call);
void rd_ring_bind(struct rd_call *call);
/* The ring takes no more records (its handles close). */
void rd_ring_stop(struct rd_ring *ring);
/* The connection closed: the records published before now are taken and
 * run (their completions written to the ring as ever), then the ring
 * stops. Accepts NULL. */
void rd_ring_finish(struct rd_ring *ring);
/* The session goes: the ring's memory and doorbell with it (after its
 * handles closed). Accepts NULL. */
void rd_ring_destroy(struct rd_ring *ring);
/* Last words (the worker stops with records in flight): each gets err. */
void rd_ring_fail_unfinished(struct rd_ring *ring, const struct rp_error *err);
/* io.regen.Comm: comm.c. */
void rd_comm_get_unique_id(struct rd_call *call);
void rd_comm_init(struct rd_call *call);
void rd_comm_attach(struct rd_call *call);
void rd_comm_abort(struct rd_call *call);
void rd_comm_destroy(struct rd_call *call);
/* A collective, its communicator resolved for the caller, checked against
 * it and held by op (a reference, and one call in flight on it, which
 * compute.c's release of the op's references gives back). */
int rd_comm_resolve(struct rd_worker *w, struct rd_op *op, const struct rd_client *who, struct rp_error *err);
/* A call on a communicator passed its deadline: it is answered with
 * CommTimeout and the communicator aborted (the device is not at fault). */
void rd_comm_deadline(struct rd_worker *w, struct rd_compute_call *cc, uint64_t now);
/* A process's last connection closed: whether its communicator `o` stays,
 * detached, for Attach (keyed and healthy); one that does not is aborted
 * before it closes. */
bool rd_comm_keep_detached(struct rd_object *o, void *worker);
/* A drain: communicators with calls in flight are aborted, so a peer that
 * never calls cannot hold the lifecycle change. */
void rd_comm_abort_busy(struct rd_worker *w, const char *why);
/* A restart: every communicator is aborted, none finalized (a rank of the
 * job failed: its peers will not finalize). */
void rd_comm_abort_all(struct rd_worker *w, const char *why);
