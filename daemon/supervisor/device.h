/* SPDX-License-Identifier: Apache-2.0 */
/* One device, as the supervisor holds it: its state and generation, its
 * queue of lifecycle operations, and its worker process, respawned (with a
 * growing pause when it keeps dying) whenever it is lost, and watched by a
 * heartbeat (a worker that stops answering is unresponsive: killed and
 * respawned) that also brings its memory and health numbers for Status.
 *
 * A lifecycle operation (Release, Reset, Restart; a reported fault queues a
 * Reset of its own) runs alone on its device: Drain with the deadline, then
 * Release (CUDA usable) or Reset (context lost) in the worker, and the
 * generation goes up by one when the worker serves again. A worker that
 * does not answer in time, fails its canary or leaves calls stuck past the
 * drain deadline is killed and respawned instead: process exit is the one
 * cleanup that never leaks vendor state. A worker that reports a hung call
 * is respawned at once; one that reports its GPU failed (or cannot open
 * it) leaves the device `failed`, and the next worker starts only after a
 * pause that doubles with each failure. Every worker starts with the
 * programs its predecessors were told to define (kept_programs.h).
 * docs/lifecycle.md tells it for people.
 *
 * Every change of state goes through one function, which bumps the
 * generation when the change comes with one, and reports it once: Watch
 * hears each transition, with the state entered, in order.
 *
 * The device reports upward through rd_sv_device_events and reads what all
 * devices share through rd_sv_device_env; it never reaches into the
 * supervisor. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "daemon/comm_owners.h"
#include "daemon/hang_charge.h"
#include "daemon/listen.h"
#include "daemon/options.h"
#include "proto/device.h"
#include "daemon/supervisor/kept_programs.h"
#include "daemon/supervisor/worker_process.h"

/* The longest reason a device keeps: a verb, the caller's pid and job (its
 * cgroup's and the one it stated) and the words it gave. */
#define RD_SV_REASON_MAX 320

enum rd_sv_verb { RD_SV_RELEASE, RD_SV_RESET, RD_SV_RESTART, RD_SV_DETACH, RD_SV_ATTACH };

const char *rd_sv_verb_name(enum rd_sv_verb verb);

struct rd_sv_device;

struct rd_sv_device_events {
	/* d entered d->state for d->reason; bumped: its generation went up by
	 * one with it (the node's epoch goes with it). Once per transition. */
	void (*state_changed)(struct rd_sv_device *d, bool bumped, void *data);
	/* A worker reported Ready (after d's operations moved on). May be
	 * NULL, as may start_settled. */
	void (*worker_ready)(struct rd_sv_device *d, void *data);
	/* d's first start is over, once per device: its first worker to
	 * serve reported Ready, or before that a worker could not start (it
	 * exited, could not be spawned, or found the GPU failed); d->state and
	 * d->reason say which. */
	void (*start_settled)(struct rd_sv_device *d, void *data);
	/* d's part of a request given to rd_sv_device_enqueue ended; failure
	 * is NULL on success. */
	void (*request_finished)(struct rd_sv_device *d, void *request, const char *failure, void *data);
	/* d's worker reports that a call of uid's hung (reason: its words);
	 * the worker is being replaced. May be NULL. */
	void (*hang_of_uid)(struct rd_sv_device *d, uid_t uid, const char *reason, void *data);
};

/* What every device reads and the supervisor owns. */
struct rd_sv_device_env {
	uv_loop_t *loop;
	int socket_dir;                         /* where the sockets are (daemon/socket_dir.h); -1: none */
	const char *exe;                        /* regend itself, run again as a worker */
	const struct rd_options *opts;          /* the live settings */
	const uint64_t *epoch;                  /* the node's, which every worker answers in Generation */
	const bool *stopping;                   /* regend is stopping: nothing is respawned */
	/* The uids cooling down after a hang (daemon/hang_charge.h): a new
	 * worker starts with them; NULL: none. */
	const struct rd_hang_charges *hang_charges;
	/* Whose each communicator unique id is, node-wide
	 * (daemon/comm_owners.h): the devices' workers ask. */
	struct rd_comm_owners *comm_owners;
	const struct rd_sv_device_events *events;
	void *data;
};

struct rd_sv_op;

/* What the last worker said of the GPU's health (io.regen.Device.Health),
 * copied: it outlives the worker, and the last XID outlives a worker that
 * saw none. */
struct rd_sv_health {
	bool known;
	char source[16], detail[128], uuid[96], pci_bus_id[32], last_xid_text[96];
	uint32_t last_xid;
	int64_t last_xid_unix_ms;
	int64_t ecc_dbe_volatile, ecc_dbe_aggregate;
	int retired_pages_pending, remap_pending, remap_failed;
	bool has_minor_number;
	uint32_t minor_number;
	unsigned nmig;
	char mig_devices[RP_MIG_DEVICES_MAX][96];
};

/* What the last worker said of how its context shares the GPU
 * (io.regen.Device.Sharing), copied; and which warnings the device's log
 * already has, so that each is given once per device, not per worker. */
struct rd_sv_sharing {
	bool known;
	bool mps;
	char mps_pipe_directory[108], compute_mode[24], reason[256];
	int64_t mps_clients;
	bool warned_mps, warned_not_mps;
};

struct rd_sv_device {
	const struct rd_sv_device_env *env;
	int index;
	uint64_t generation;           /* starts at 1, up by one per release, reset and respawn */
	enum rp_state state;
	char reason[RD_SV_REASON_MAX]; /* why the device is in its state */
	char backend[16];
	char worker_socket[108];
	struct rd_sv_worker worker;
	uint64_t respawns;
	uint64_t memory_used, memory_baseline;
	unsigned crash_streak;         /* workers in a row lost within a minute of coming up (device.c) */
	uint64_t up_since_ns;          /* when the worker last started or reported Ready; 0 before the first */
	bool worker_served;            /* the last worker started reported Ready */
	bool worker_told_to_exit;      /* the supervisor signalled the last worker (its exit is no crash) */
	bool start_settled;            /* the first start is over (rd_sv_device_events.start_settled) */
	struct rd_sv_op *ops;          /* the first runs, the rest wait */
	uv_timer_t timer;              /* the running operation's deadline */
	uv_timer_t respawn_timer;      /* the pause before a respawn */
	uv_timer_t heartbeat_timer;    /* asks the worker for Stats; finds it unresponsive */
	uv_timer_t start_timer;        /* a starting worker's deadline to report Ready */
	bool start_timed_out;          /* the last worker was killed at that deadline */
	uint64_t last_answer_ns;       /* when the worker last answered (or started), moved on by the
					* supervisor's own lateness (device.c) */
	uint64_t last_tick_ns;         /* the heartbeat's last tick */
	bool ping_outstanding;
	unsigned failed_streak;        /* failures of the GPU in a row: the pause before the next try doubles */
	char cannot_serve[RD_SV_REASON_MAX - 64]; /* why the running worker will exit unserved, as it said */
	struct rd_sv_health health;
	struct rd_sv_sharing sharing;
	/* io.regen.Device.Counters: the lifecycle counts are the supervisor's;
	 * the call counts are the workers' that are gone (folded in as each
	 * goes) plus the current one's as its last Stats said. */
	struct rp_device_counters counters;
	struct rp_device_counters worker_counts;
	/* io.regen.Device.Job: what each job uses of the current worker, as
	 * its last Stats said (the strings point into jobs_json, a copy of
	 * that array). Gone with the worker. */
	cJSON *jobs_json;
	struct rp_device_job *jobs;
	size_t njobs;
	/* The programs its workers were told to define, which the next
	 * worker defines again before it serves (kept_programs.h). */
	struct rd_sv_kept_programs kept_programs;
	/* While detached: the worker socket's path, where every call gets
	 * io.regen.Detached, and its connections. */
	struct rd_listener detached_listener;
	struct rd_conn *detached_conns;
};

/* Device `index`, in generation 1, respawning until its first worker is
 * ready. */
void rd_sv_device_init(struct rd_sv_device *d, const struct rd_sv_device_env *env, int index, const char *backend);
/* Starts its first worker. */
void rd_sv_device_start(struct rd_sv_device *d);
/* regend stops: every queued request finishes with `why`, the timers close
 * and the worker gets SIGTERM (it drains and exits). */
void rd_sv_device_stop(struct rd_sv_device *d, const char *why);
/* SIGKILL to a worker that is still running, saying why in the log. */
void rd_sv_device_kill(struct rd_sv_device *d, const char *why);

/* Queues a lifecycle operation; request (NULL: none) comes back through
 * request_finished. */
void rd_sv_device_enqueue(struct rd_sv_device *d, enum rd_sv_verb verb, const char *reason, unsigned deadline_ms,
			  void *request);

/* Tells the worker the node's epoch (it changed). */
void rd_sv_device_tell_epoch(struct rd_sv_device *d);
/* Hands the running worker, if any, what SIGHUP reloaded of its options
 * (the live ones now in env->opts). */
void rd_sv_device_reload(struct rd_sv_device *d);
/* Hands the running worker, if any, the uids cooling down now (a worker
 * without a channel starts with them on its command line). */
void rd_sv_device_tell_charges(struct rd_sv_device *d);
/* Ready, with a control channel to its worker. */
bool rd_sv_device_serving(const struct rd_sv_device *d);
/* A call to the worker (params consumed); -ENOTCONN while there is none. */
int rd_sv_device_call(struct rd_sv_device *d, const char *method, cJSON *params, rd_reply_cb cb, void *userdata);
/* The same with fds sent along (duplicated: the caller keeps its own). */
int rd_sv_device_call_fds(struct rd_sv_device *d, const char *method, cJSON *params, const int *fds, size_t nfds,
			  rd_reply_cb cb, void *userdata);
/* Asks a serving worker that answers its heartbeat for fresh memory and
 * health numbers; done(data) follows, with or without them. -EAGAIN (not
 * serving, or behind with its heartbeat), -ENOMEM: done never comes. */
int rd_sv_device_refresh_memory(struct rd_sv_device *d, void (*done)(void *data), void *data);
/* io.regen.Device.DeviceInfo. */
/* The device as io.regen.Device.DeviceInfo says it (strings point into d). */
void rd_sv_device_info(const struct rd_sv_device *d, struct rp_device_info *out);
