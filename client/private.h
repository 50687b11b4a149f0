/* SPDX-License-Identifier: Apache-2.0 */
/* libregen internals shared by its source files. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "include/regen.h"
#include "conn.h"
#include "proto/ids.h"
#include "proto/job.h"
#include "proto/message.h"

struct rc_object;
struct rc_ring;

/* A device's lane: the compute calls of its worker connection, over the
 * ring or as Varlink calls (lane.c). Tickets count calls queued and
 * answers read. */
struct rc_lane {
	bool decided;                     /* the transport is picked for this connection */
	unsigned transport_epoch;         /* the client's transport_epoch when it was */
	struct rc_ring *ring;             /* the one in use; NULL: Varlink */
	struct rc_ring *open_ring;        /* the connection's, used or not */
	uint64_t submitted, completed;
	/* Tickets of calls lost with a connection (0: none): their wait says so,
	 * and a wait past them once (lost_told). */
	uint64_t lost_from, lost_upto;
	bool lost_told;
	bool lost_in_fork;                /* they were the parent process's (rc_client_forget_parent) */
	uint64_t last_elapsed_us;
	struct regen_call_timing last_timing;
	uint64_t idle_since_ns;           /* when the last answer was read */
	char err_name[128];               /* the first error since the last wait */
	cJSON *err_params;
	uint64_t err_ticket;              /* the call it answered */
};

struct regen_client {
	char socket_path[sizeof(((struct rc_conn *)0)->path)];
	struct rc_conn main;
	struct rc_conn worker[REGEN_DEVICES_MAX];
	double timeout_s;
	/* The last named error. */
	char err_name[128];
	char err_message[512];
	char *err_params;                 /* JSON text, malloc'ed */
	uint64_t err_ticket;              /* the call whose error regen_wait returned; 0: none */
	/* The newest generation seen per device (Status, Watch, imports, errors). */
	uint64_t known_generation[REGEN_DEVICES_MAX];
	struct rc_object *objects;        /* open buffers, events and communicators, so destroy can detach them */
	enum regen_transport transport;   /* REGEN_TRANSPORT, regen_client_set_transport */
	unsigned transport_epoch;          /* bumped by regen_client_set_transport */
	/* The job it states on every connection it opens (io.regen.SetJob):
	 * $REGEN_JOB, regen_client_set_job; "" none. */
	char job[RP_JOB_MAX + 1];
	bool job_unsupported;             /* regend knows no SetJob: states none */
	struct rc_lane lanes[REGEN_DEVICES_MAX];
	uint64_t doorbells;               /* rung on the lanes' rings */
	unsigned long forks;              /* rc_forks when this process made it or took it over */
};

/* Forks of this process's ancestry so far: bumped in every forked child
 * (pthread_atfork). A client whose count differs was made before a fork:
 * its connections, rings and objects are the parent's. */
extern unsigned long rc_forks;
/* In a forked child: lets go of what the client held for the parent,
 * writing nothing to it, so that its next call connects as the child. */
void rc_client_forget_parent(regen_client *c);
/* Every path that reaches a connection or a ring of c begins here. */
static inline void rc_check_fork(regen_client *c)
{
	if (c != NULL && __builtin_expect(c->forks != rc_forks, 0))
		rc_client_forget_parent(c);
}

/* What buffers and events share: an id in one device's worker, made in one
 * generation, open until closed. */
struct rc_object {
	regen_client *client;             /* NULL once the client is gone */
	struct rc_object *prev, *next;
	int device;
	struct rp_id rid;
	char id[RP_ID_MAX];
};

struct regen_buffer {
	struct rc_object obj;
	uint64_t size;
};

struct regen_event {
	struct rc_object obj;
};

/* A program: its id (generation 0: it outlives generations) and what
 * Define answered. */
struct regen_program {
	struct rc_object obj;
	char **bound;                     /* the bound tensors' names, in binding order */
	uint32_t nbound;
	uint64_t journal_bytes;
};

/* A program's Run as program.c hands it to the lane (lane.c): the ids it
 * names, and its bindings and scalars by bound position and by name (a
 * Varlink call names them). */
struct rc_run_binding {
	uint32_t bound;
	const char *name;
	struct rp_id buffer;
	uint64_t offset;
};
struct rc_run_scalar {
	uint32_t bound;
	const char *name;
	double value;
};
struct rc_run {
	struct rp_id program;
	struct rp_id wait_event, signal_event;   /* kind 0: none */
	uint32_t deadline_ms;
	bool has_journal;
	struct rp_id journal;
	uint64_t journal_offset, seq;
	bool retry;
	bool journal_marks;               /* the journal holds marks only */
	const struct rc_run_binding *bind;
	unsigned nbind;
	const struct rc_run_scalar *scalars;
	unsigned nscalars;
};
/* The Run's parameters as an io.regen.Program.Run call carries them
 * (program.c). NULL on ENOMEM. */
cJSON *rc_run_params(const struct rc_run *run);

struct regen_comm {
	struct rc_object obj;
	uint32_t rank, nranks;
	uint64_t collectives;
};

/* objects.c: fills in obj and links it into the client's list; unlinks it. */
void rc_object_add(regen_client *c, struct rc_object *obj, int device, const struct rp_id *rid);
void rc_object_unlink(struct rc_object *obj);
/* regen_buffer_close for the pool: 0 when b is closed (or went with its
 * generation) and freed; -errno when regend could not be told (no answer:
 * the connection broke, the time ran out), b kept as it was to be closed
 * again later. */
int rc_buffer_close_or_keep(regen_buffer *b);

/* Calls `method` on the main socket (device < 0) or the device's worker
 * socket, connecting (or reconnecting) first when needed. `params` (may be
 * NULL) is not consumed. On success, *reply (when not NULL) receives the
 * reply's parameters, a cJSON object the caller deletes. */
int rc_call(regen_client *c, int device, const char *method, const cJSON *params,
	    const int *fds, size_t nfds, cJSON **reply);
/* The same, and the first fd that came with the reply into *reply_fd
 * (-1 when none came; the caller owns it). */
int rc_call_fd(regen_client *c, int device, const char *method, const cJSON *params,
	       const int *fds, size_t nfds, cJSON **reply, int *reply_fd);
/* The same on a connection the caller holds, with a deadline. */
int rc_exchange(regen_client *c, struct rc_conn *conn, const char *method, const cJSON *params,
		const int *fds, size_t nfds, int64_t deadline, cJSON **reply);
int rc_exchange_fd(regen_client *c, struct rc_conn *conn, const char *method, const cJSON *params,
		   const int *fds, size_t nfds, int64_t deadline, cJSON **reply, int *reply_fd);
void rc_clear_error(regen_client *c);
/* Records a failure made on this side: message only, no name. */
void rc_set_local_error(regen_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records a named error regend sent. */
void rc_set_remote_error(regen_client *c, const char *name, const cJSON *params);
/* A reply the codec refused: -EPROTO, with the field it named. */
int rc_malformed_reply(regen_client *c, const char *method, struct rp_error *err);
/* Remembers that `device` has reached `generation`: ids of older
 * generations are gone with it. */
void rc_note_generation(regen_client *c, int64_t device, uint64_t generation);

/* The device's worker connection, (re)opened when needed; a new one starts
 * its lane afresh. */
int rc_ensure_worker(regen_client *c, int device, int64_t deadline);

/* lane.c */
enum regen_transport rc_transport_from_env(void);
/* Queues a parsed call on the device's lane; *ticket (may be NULL) names it. */
struct rp_compute;
int rc_lane_submit(regen_client *c, int device, const struct rp_compute *call, uint64_t *ticket);
/* Queues a program's Run on the device's lane: the ring's records, or the
 * Varlink call (also where the Run names more ids than the ring's id table
 * holds: then after the lane's outstanding calls, answered at once). */
int rc_lane_submit_run(regen_client *c, int device, const struct rc_run *run, uint64_t *ticket);
/* Reads answers up to ticket; the first error among them, named. */
int rc_lane_wait(regen_client *c, int device, uint64_t ticket);
/* Reads the answers of Varlink calls still outstanding on the lane, keeping
 * their first error for the next wait (before another call on the
 * connection). */
int rc_lane_settle(regen_client *c, int device);
/* Reads the answers of every call outstanding on the lane, ring or Varlink,
 * keeping their first error for the next wait: before an index of the
 * lane's id table is taken back or an id closed, which a queued record may
 * still name. Negative only when the connection broke or timed out. */
int rc_lane_drain(regen_client *c, int device);
/* The local error a lane's broken connection (r: -ETIMEDOUT or another
 * failure) leaves: "no completion ... before the timeout" or "broke with
 * calls in flight". */
void rc_lane_say_broken(regen_client *c, int device, int r);
/* An id closed: the lane's table no longer holds it. */
void rc_lane_forget(regen_client *c, int device, const struct rp_id *rid);
void rc_lane_reset(struct rc_lane *lane);
/* Frees everything of the lane, for its client's end. */
void rc_lane_finish(struct rc_lane *lane);

/* Makes a regen_status of a Status-shaped reply (which it takes over,
 * also on failure). */
int rc_status_from_reply(regen_client *c, const char *method, cJSON *reply, regen_status **out);
