/* SPDX-License-Identifier: Apache-2.0 */
/* A worker process: owns one device (its backend context and resource
 * registry), serves Memory and Compute on its own socket, and obeys the
 * supervisor's lifecycle verbs on the control channel (fd --ctl-fd).
 *
 * The worker's parts share one struct rd_worker, passed explicitly:
 * worker.c (the process: start, loop, completions, faults, stop),
 * session.c (a connection to the worker socket: one lane), memory.c
 * (io.regen.Memory), compute.c (io.regen.Compute), control.c (the
 * supervisor's verbs), objects.c (the ids handed out), program.c and
 * program_keep.c (io.regen.Program, and the programs that outlive the
 * worker), usage.c (what each job uses of the device), health.c (faults
 * found without waiting for a call: the backend's health watch, calls past
 * their deadline). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "daemon/backend/backend.h"
#include "daemon/conn.h"
#include "daemon/hang_charge.h"
#include "daemon/listen.h"
#include "daemon/options.h"
#include "daemon/worker/objects.h"
#include "daemon/worker/usage.h"

/* Whether the worker takes new work. */
enum rd_worker_state {
	RD_WORKER_READY = 0,
	RD_WORKER_DRAINING,     /* a lifecycle verb waits for the calls in flight */
	RD_WORKER_LOST,         /* the context faulted, a call hung or the GPU failed: new work fails until a reset */
	RD_WORKER_STOPPING,     /* SIGTERM or the supervisor gone */
};

struct rd_session;
struct rd_kept_owner;

/* The worker's exit status when it could not open its device because the
 * device is unusable (gone, needing a GPU reset, not there): the supervisor
 * treats it as a failed GPU, not as a crash to respawn at once. */
#define RD_WORKER_EXIT_DEVICE_FAILED 3
/* ... because the node's software cannot drive it: no CUDA backend module,
 * a library it needs missing, a driver older than the CUDA runtime, a GPU
 * older than regen supports. The supervisor shows the device unsupported
 * and tries again after a pause, as for a failed GPU. */
#define RD_WORKER_EXIT_UNSUPPORTED 4

/* A compute call the worker runs, a Varlink call or a ring record: the op
 * the backend finishes, and what the core keeps beside it. */
struct rd_compute_call {
	struct rd_op op;                 /* first: the backend hands it back */
	struct rd_call *call;            /* a Varlink call's; NULL for a record, and once answered early */
	/* A ring record's answer when its deadline passed (its completion):
	 * loop thread, err the callee's to clear. */
	void (*answer_early)(struct rd_compute_call *cc, struct rp_error *err);
	bool answered;                   /* answered early (its deadline passed): nobody waits for it */
	/* Answered once its work was enqueued (it names a signal_event):
	 * what its completion says later reaches nobody but the log. */
	bool answered_at_launch;
	struct rd_session *session;
	uint64_t deadline_ns;            /* uv_hrtime() by which it must finish; 0: none */
	/* uv_hrtime() past which the device counts as hung: the later of the
	 * caller's deadline and regend's call_deadline_ms. A caller's shorter
	 * deadline ends its own call (timed_out), never the device. */
	uint64_t hang_ns;
	bool timed_out;
	/* Set for io.regen.Comm's Init and Destroy: answers the call (call may
	 * be NULL: answered early) and settles the communicator, instead of
	 * the {elapsed_us} reply. */
	void (*finish)(struct rd_compute_call *cc);
	struct rd_compute_call *prev, *next;   /* the worker's calls in flight */
};

struct rd_worker {
	uv_loop_t *loop;
	/* The worker's own: io.regen.Worker.Reload changes what SIGHUP
	 * reloads of them (rd_options_set_worker_reload). */
	struct rd_options *opts;
	struct rd_device dev;
	struct rd_objects objects;
	struct rd_usage_table usage;    /* what each job uses (usage.h) */
	/* The uids cooling down after a hang, as the supervisor last said:
	 * their compute calls are refused (compute.c). */
	struct rd_hang_charges hang_charges;
	bool hang_injected;             /* InjectFault "hang": the hang to come is nobody's */
	struct rd_listener listener;
	char socket_path[108];
	struct rd_conn *ctl;            /* to the supervisor */
	enum rd_worker_state state;
	uint64_t epoch;                 /* the node's, as the supervisor last said */

	unsigned in_flight;             /* compute calls submitted and not finished */
	unsigned abandoned;             /* of those, answered early: past their deadline */
	/* Compute calls this worker finished, those that failed (or were
	 * answered early), and their time in the backend: io.regen.Worker.Stats
	 * reports them, the supervisor sums them over workers for metrics. */
	uint64_t calls_done, calls_failed, calls_us;
	struct rd_compute_call *running;   /* the calls in flight, oldest first */
	struct rd_compute_call *running_tail;
	uv_timer_t deadline_timer;      /* looks for calls past their deadline while any runs */
	uv_timer_t orphan_timer;        /* while a closed session is watched (orphan.c) */
	bool health_started;
	struct rd_session *sessions;
	unsigned nsessions;
	/* Processes whose programs came back from an earlier worker before
	 * they connected, watched until they do or exit (program_keep.c). */
	struct rd_kept_owner *kept_owners;
	/* What compiling programs' kernels may still cost each uid that
	 * defined one (daemon/program/compile_budget.h); kept for the
	 * worker's life, so that a Drop gives back no compile time. */
	struct rd_compile_account *compile_accounts;
	unsigned next_lane;

	struct rd_call *drain_call;     /* the supervisor's Drain, while it waits */
	uv_timer_t drain_timer;
	uv_timer_t stop_timer;
	uv_signal_t sigterm;

	/* Completions and faults posted from backend threads. */
	uv_async_t wakeup;
	pthread_mutex_t lock;
	struct rd_op *done_head, *done_tail;
	struct rd_op *launched_head, *launched_tail;   /* Varlink calls to answer at launch */
	char fault_reason[160];
	/* A hung call's uid, which the supervisor charges (daemon/hang_charge.h);
	 * -1: nobody's (not a hang, or one that fault injection caused). */
	int64_t fault_uid;
	enum rd_fault_kind fault_kind;
	bool fault_pending, fault_reported;
	enum rd_fault_kind reported_kind;
};

int rd_worker_run(const struct rd_options *opts);

/* worker.c */
uint64_t rd_worker_generation(const struct rd_worker *w);
/* 0, or -EAGAIN with Draining or DeviceLost in err when no new work is
 * taken now. */
int rd_worker_refuse_if_not_ready(struct rd_worker *w, struct rp_error *err);
/* A call finished: a drain or a stop waiting for it may go on. */
void rd_worker_call_finished(struct rd_worker *w);
/* The loop thread: finishes now the ops the backend's threads handed back
 * (answers at launch, then each op's done), as the wake-up they posted
 * would. A ring's record is answered in its completion before its done
 * runs: what counts it (a program's runs and time) is up to date once this
 * ran. */
void rd_worker_finish_posted(struct rd_worker *w);
/* Stops serving: no new connections, calls in flight get the drain
 * deadline, then the process leaves. */
void rd_worker_begin_stop(struct rd_worker *w, const char *why);
/* A fault found on the loop thread (a hung call): as a backend's. */
void rd_worker_fault(struct rd_worker *w, enum rd_fault_kind kind, const char *reason);
/* The same for a call of uid's that hung (uid < 0: nobody's). */
void rd_worker_fault_hung(struct rd_worker *w, const char *reason, int64_t uid);

/* health.c */
void rd_health_init(struct rd_worker *w);
/* Starts the backend's health watch once the worker serves. */
void rd_health_start(struct rd_worker *w);
void rd_health_stop(struct rd_worker *w);
/* A compute call starts or ends: the deadline watch follows them. */
void rd_health_call_started(struct rd_worker *w, struct rd_compute_call *cc);
void rd_health_call_finished(struct rd_worker *w, struct rd_compute_call *cc);
/* The device's health for the supervisor (Ready, Stats). */
cJSON *rd_health_json(struct rd_worker *w);
/* How the worker's context shares the GPU (io.regen.Device.Sharing), for
 * the supervisor (Ready, Stats); NULL while the backend has not said. */
cJSON *rd_sharing_json(struct rd_worker *w);

/* session.c: accepts a connection on the worker socket. */
void rd_session_accept(int fd, void *worker);

/* control.c: the control channel from the supervisor (takes ctl_fd). */
int rd_control_open(struct rd_worker *w, int ctl_fd);
/* Tells the supervisor the worker serves, and how much memory it holds. */
void rd_control_ready(struct rd_worker *w);
/* Tells the supervisor why this worker exits without serving
 * (io.regen.Worker.CannotServe; kind "unsupported" or "failed"), and waits
 * (a few seconds at most) until it has heard: the exit status that follows
 * says the same, the reason is what Status shows. */
void rd_control_cannot_serve(struct rd_worker *w, const char *kind, const char *reason);
void rd_control_report_fault(struct rd_worker *w, enum rd_fault_kind kind, const char *reason, int64_t uid);
/* A drain in progress ends when the last call in flight finished. */
void rd_control_maybe_finish_drain(struct rd_worker *w);
