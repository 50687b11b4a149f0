/* SPDX-License-Identifier: Apache-2.0 */
/* A device's worker process, as the supervisor runs it: started with a
 * command line built from the option table, its control channel (a
 * socketpair on the worker's fd 3 that speaks io.regen.Worker, see
 * proto/idl/io.regen.Worker.varlink), signalled, and reaped. What the worker
 * says on that channel, and its exit, go to its owner (the device) through
 * rd_sv_worker_events; this file decides nothing about the device. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>
#include "daemon/conn.h"
#include "daemon/options.h"
#include "proto/compute.h"
#include "daemon/supervisor/kept_programs.h"

/* What a worker's Ready carries. */
struct rd_sv_worker_ready {
	const char *backend;
	const char *worker_socket;
	uint64_t memory_used, memory_baseline;
	const cJSON *health;        /* io.regen.Device.Health, NULL when absent */
	const cJSON *sharing;       /* io.regen.Device.Sharing, NULL when absent */
};

/* io.regen.Worker.FaultKind. */
enum rd_sv_fault { RD_SV_FAULT_LOST = 0, RD_SV_FAULT_HUNG, RD_SV_FAULT_FAILED };

/* How a worker's process ended, from its exit status (daemon/worker/worker.h). */
enum rd_sv_exit {
	RD_SV_EXIT_OTHER = 0,         /* a crash, a signal, any other status */
	RD_SV_EXIT_DEVICE_FAILED,     /* RD_WORKER_EXIT_DEVICE_FAILED: the device is unusable */
	RD_SV_EXIT_UNSUPPORTED,       /* RD_WORKER_EXIT_UNSUPPORTED: the node's software cannot drive it */
};


/* What a worker's KeepProgram carries (kept_programs.h). */
struct rd_sv_program_kept {
	const char *id;
	struct rd_sv_program_owner owner;
	unsigned nodes;
	const char *message;        /* the Define call's text, len bytes, no NUL inside */
	size_t len;
};

struct rd_sv_worker_events {
	/* The worker listens on its socket and its backend is open. */
	void (*ready)(void *data, const struct rd_sv_worker_ready *ready);
	/* The worker found a fault (reason: what it saw). health: its Health
	 * then, NULL when absent. uid: a hung call's uid, which the
	 * supervisor charges (daemon/hang_charge.h); -1: nobody's. */
	void (*faulted)(void *data, enum rd_sv_fault kind, const char *reason, const cJSON *health, int64_t uid);
	/* The process is gone; why: "worker exited (signal 9)". Its control
	 * channel is closed by then, and every call on it got reply NULL.
	 * how: what its exit status says of the device. */
	void (*exited)(void *data, const char *why, enum rd_sv_exit how);
	/* Before a worker exits without serving because of its device
	 * (io.regen.Worker.CannotServe), why in words a person can act on:
	 * how is RD_SV_EXIT_UNSUPPORTED or RD_SV_EXIT_DEVICE_FAILED, as its
	 * exit status will say. health: NULL when absent. May be NULL. */
	void (*cannot_serve)(void *data, enum rd_sv_exit how, const char *reason, const cJSON *health);
	/* Whose a communicator's unique id is on the node, asked by the
	 * worker for a process of uid that made or joins with it
	 * (io.regen.Worker.CommOwner, daemon/comm_owners.h). May be NULL:
	 * the worker is refused. */
	uid_t (*comm_owner)(void *data, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE]);
	/* A process defined a program the worker asks to be kept for the
	 * next worker (io.regen.Worker.KeepProgram), and one it let go
	 * (ForgetProgram). */
	void (*program_kept)(void *data, const struct rd_sv_program_kept *kept);
	void (*program_forgotten)(void *data, const char *id);
};

struct rd_sv_worker {
	uv_loop_t *loop;
	int device;                 /* for the log */
	uv_process_t *proc;         /* the running process, NULL once it exited; one per spawn, as a closing
				     * handle is never reused */
	int pid;                    /* the last process's, for Status */
	struct rd_conn *ctl;        /* NULL while there is no channel */
	const struct rd_sv_worker_events *events;
	void *data;
};

void rd_sv_worker_init(struct rd_sv_worker *w, uv_loop_t *loop, int device, const struct rd_sv_worker_events *events,
		       void *data);
/* Starts exe as a worker with wopts (worker_device, worker_generation and
 * the rest; ctl_fd and programs_fd are set here). programs_fd: the
 * programs it defines before it serves (rd_sv_kept_programs_memfd), or -1;
 * the caller keeps and closes it. Returns 0, or -errno when no process
 * runs. */
int rd_sv_worker_spawn(struct rd_sv_worker *w, const char *exe, const struct rd_options *wopts, int programs_fd);
bool rd_sv_worker_running(const struct rd_sv_worker *w);
/* Sends signum to the running process, if any; exited follows. */
void rd_sv_worker_kill(struct rd_sv_worker *w, int signum);
/* A call on the control channel (params consumed); -ENOTCONN without one. */
int rd_sv_worker_call(struct rd_sv_worker *w, const char *method, cJSON *params, bool oneway, rd_reply_cb cb,
		      void *userdata);
