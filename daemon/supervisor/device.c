/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/supervisor/device.h"
#include "proto/errors.h"

/* How long a worker may take to answer Release/Reset, and to come back. */
#define LIFECYCLE_TIMEOUT_MS 30000
/* What a worker gets beyond the drain deadline to say how its drain went. */
#define DRAIN_GRACE_MS 2000
/* The drain deadline of the Reset that a reported fault queues. */
#define FAULT_DRAIN_DEADLINE_MS 2000
/* A worker lost sooner than this after it came up adds to the crash streak,
 * and the next one starts after 200 ms, 400 ms, ... up to the max; one that
 * served longer ends the streak. Far above the longest pause: a worker that
 * dies every few seconds is a crash loop whatever the few (each loss a
 * generation for every client of the device), and a streak that ended
 * whenever one outlived a short window (it was 2 s) never let a loop of
 * 2.5 s reach a pause at all. */
#define STABLE_NS (60 * 1000000000ull)
#define RESPAWN_BACKOFF_MAX_MS 5000
/* A failed GPU's pause before the next worker: failed_retry_ms, doubled
 * with each failure in a row, up to this many times it. */
#define FAILED_BACKOFF_MAX_FACTOR 16

/* Where a lifecycle operation stands. */
enum op_step {
	OP_QUEUED,            /* waits for the one before it, or for the worker to serve */
	OP_DRAINING,          /* Worker.Drain sent: the calls in flight finish, until the deadline */
	OP_APPLYING,          /* Worker.Release or Worker.Reset sent */
	OP_AWAITING_WORKER,   /* the worker was lost or killed: ends when the next one reports Ready */
};

struct rd_sv_op {
	enum rd_sv_verb verb;
	enum op_step step;
	char reason[RD_SV_REASON_MAX];
	unsigned deadline_ms;
	void *request;        /* the client's, handed back through request_finished; NULL for a fault's Reset */
	struct rd_sv_op *next;
};

static void op_start(struct rd_sv_device *d);
static void spawn(struct rd_sv_device *d);
static void detached_listen(struct rd_sv_device *d);
static void detached_unlisten(struct rd_sv_device *d);

const char *rd_sv_verb_name(enum rd_sv_verb verb)
{
	static const char *const names[] = { "release", "reset", "restart", "detach", "attach" };
	return names[verb];
}

static const struct rd_sv_device_events *events(const struct rd_sv_device *d)
{
	return d->env->events;
}

/* The one place the state changes, and with it (bump) the generation:
 * whoever watches hears of each transition once, with the state entered
 * and why (reason NULL: the reason stays). */
static void transition(struct rd_sv_device *d, enum rp_state state, bool bump, const char *reason)
{
	if (d->state == state && !bump)
		return;
	if (reason)
		snprintf(d->reason, sizeof(d->reason), "%s", reason);
	if (bump) {
		d->generation++;
		rd_info("lifecycle", d->index, d->generation, 0, "generation %llu (%s): %s",
			(unsigned long long)d->generation, rp_state_name(state), d->reason);
	}
	rd_debug("lifecycle", d->index, d->generation, 0, "%s -> %s: %s", rp_state_name(d->state), rp_state_name(state),
		 d->reason);
	d->state = state;
	events(d)->state_changed(d, bump, d->env->data);
}

static void set_state(struct rd_sv_device *d, enum rp_state state)
{
	transition(d, state, false, NULL);
}

/* The worker is gone or going: its ids die with it, so the generation goes
 * up as the device starts respawning (only once for a worker that is lost
 * while the device already respawns, or that never served). */
static void bump_for_lost_worker(struct rd_sv_device *d, const char *why)
{
	transition(d, RP_STATE_RESPAWNING, d->state != RP_STATE_RESPAWNING, why);
}

/* A count the worker reported, or what we had when it sent none. */
static uint64_t count_of(const cJSON *params, const char *name, uint64_t had)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, name);

	return cJSON_IsNumber(v) && v->valuedouble >= 0 ? (uint64_t)v->valuedouble : had;
}

/* The most Job entries the supervisor takes from a worker: its own limit,
 * none and other (daemon/worker/usage.h), with room to spare. */
#define JOBS_MAX 128

static void clear_jobs(struct rd_sv_device *d)
{
	free(d->jobs);
	cJSON_Delete(d->jobs_json);
	d->jobs = NULL;
	d->jobs_json = NULL;
	d->njobs = 0;
}

/* A worker's jobs (absent: it sent none; malformed: what it said before
 * stays, and the log says why). */
static void take_jobs(struct rd_sv_device *d, const cJSON *jobs)
{
	struct rp_error err = { 0 };
	struct rp_device_job *decoded;
	cJSON *copy;
	size_t n;

	if (!jobs)
		return;
	copy = cJSON_Duplicate(jobs, true);
	if (!copy)
		return;
	if (rp_device_jobs_decode(copy, JOBS_MAX, &decoded, &n, &err) < 0) {
		const char *bad = err.params ? cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "parameter")) : NULL;

		rd_warn("supervisor", d->index, d->generation, 0, "worker %d sent jobs Status cannot use: %s",
			d->worker.pid, bad ? bad : "out of memory");
		rp_error_clear(&err);
		cJSON_Delete(copy);
		return;
	}
	clear_jobs(d);
	d->jobs_json = copy;
	d->jobs = decoded;
	d->njobs = n;
}

static void take_memory(struct rd_sv_device *d, const cJSON *params)
{
	struct rp_device_counters *w = &d->worker_counts;

	d->memory_used = count_of(params, "memory_used", d->memory_used);
	d->memory_baseline = count_of(params, "memory_baseline", d->memory_baseline);
	w->in_flight = count_of(params, "in_flight", w->in_flight);
	w->buffers = count_of(params, "buffers", w->buffers);
	w->events = count_of(params, "events", w->events);
	w->connections = count_of(params, "connections", w->connections);
	/* A worker's own counts only go up. */
	w->calls = count_of(params, "calls", w->calls);
	w->call_errors = count_of(params, "call_errors", w->call_errors);
	w->call_us = count_of(params, "call_us", w->call_us);
	take_jobs(d, cJSON_GetObjectItemCaseSensitive(params, "jobs"));
}

/* The worker is gone: what it counted stays in the device's totals, what
 * it held went with it. */
static void fold_worker_counts(struct rd_sv_device *d)
{
	d->counters.calls += d->worker_counts.calls;
	d->counters.call_errors += d->worker_counts.call_errors;
	d->counters.call_us += d->worker_counts.call_us;
	memset(&d->worker_counts, 0, sizeof(d->worker_counts));
	clear_jobs(d);
}

/* A worker's io.regen.Device.Health (NULL: it sent none). */
static void take_health(struct rd_sv_device *d, const cJSON *health)
{
	struct rd_sv_health *h = &d->health;
	struct rp_device_health in;
	struct rp_error err = { 0 };

	if (!health)
		return;
	if (rp_device_health_decode(health, &in, &err) < 0) {
		rp_error_clear(&err);
		return;
	}
	h->known = true;
	snprintf(h->source, sizeof(h->source), "%s", in.source);
	snprintf(h->detail, sizeof(h->detail), "%s", in.detail);
	/* A worker that could not open the GPU does not know it: the one
	 * before it did, and the GPU is still the same. */
	if (in.uuid[0] || !h->uuid[0])
		snprintf(h->uuid, sizeof(h->uuid), "%s", in.uuid);
	if (in.pci_bus_id[0] || !h->pci_bus_id[0])
		snprintf(h->pci_bus_id, sizeof(h->pci_bus_id), "%s", in.pci_bus_id);
	/* A new worker has seen no XID yet: the last one stays known. */
	if (in.last_xid) {
		h->last_xid = in.last_xid;
		h->last_xid_unix_ms = in.last_xid_unix_ms;
		snprintf(h->last_xid_text, sizeof(h->last_xid_text), "%s", in.last_xid_text);
	}
	h->ecc_dbe_volatile = in.ecc_dbe_volatile;
	h->ecc_dbe_aggregate = in.ecc_dbe_aggregate;
	h->retired_pages_pending = in.retired_pages_pending;
	h->remap_pending = in.remap_pending;
	h->remap_failed = in.remap_failed;
	/* As the UUID: what a worker that could not open the GPU does not know
	 * stays what the one before it said. */
	if (in.has_minor_number || in.uuid[0]) {
		h->has_minor_number = in.has_minor_number;
		h->minor_number = in.minor_number;
		h->nmig = 0;
		for (size_t i = 0; i < in.nmig && i < RP_MIG_DEVICES_MAX; i++)
			snprintf(h->mig_devices[h->nmig++], sizeof(h->mig_devices[0]), "%s", in.mig_devices[i]);
	}
}

/* A worker's io.regen.Device.Sharing (NULL: it sent none). MPS is a mode
 * an operator chooses, with a cost: the log says so once per device, and
 * says so too when a pipe directory was named and CUDA made a context of
 * its own anyway. */
static void take_sharing(struct rd_sv_device *d, const cJSON *sharing)
{
	struct rd_sv_sharing *s = &d->sharing;
	struct rp_device_sharing in;
	struct rp_error err = { 0 };

	if (!sharing)
		return;
	if (rp_device_sharing_decode(sharing, &in, &err) < 0) {
		rp_error_clear(&err);
		return;
	}
	s->known = true;
	s->mps = in.mps;
	snprintf(s->mps_pipe_directory, sizeof(s->mps_pipe_directory), "%s", in.mps_pipe_directory);
	snprintf(s->compute_mode, sizeof(s->compute_mode), "%s", in.compute_mode);
	snprintf(s->reason, sizeof(s->reason), "%s", in.reason);
	s->mps_clients = in.mps_clients;
	if (s->mps && !s->warned_mps) {
		s->warned_mps = true;
		rd_warn("lifecycle", d->index, d->generation, 0,
			"the worker runs as an MPS client (CUDA_MPS_PIPE_DIRECTORY=%s): a fatal fault in any MPS client "
			"of this GPU reaches every client, so the ranks lose their contexts with the worker's and regend's "
			"isolation is gone (docs/operations.md, MPS)",
			s->mps_pipe_directory[0] ? s->mps_pipe_directory : "unset, /tmp/nvidia-mps");
	} else if (!s->mps && s->mps_pipe_directory[0] && strcmp(d->backend, "cuda") == 0 && !s->warned_not_mps) {
		s->warned_not_mps = true;
		rd_warn("lifecycle", d->index, d->generation, 0,
			"the worker is not an MPS client although CUDA_MPS_PIPE_DIRECTORY=%s is set: is an MPS control "
			"daemon of regend's user running there? (%s)",
			s->mps_pipe_directory, s->reason);
	}
}

/* ---- Lifecycle operations ---- */

/* The worker serves and no operation runs: a faulted device waits only
 * for its reset. */
static bool can_start_op(const struct rd_sv_device *d)
{
	return d->state == RP_STATE_READY || d->state == RP_STATE_FAULTED || d->state == RP_STATE_DETACHED;
}

/* A Detach past its drain: the worker's exit makes the device detached. */
static bool detaching(const struct rd_sv_device *d)
{
	return d->ops && d->ops->verb == RD_SV_DETACH && d->ops->step != OP_QUEUED;
}

static void op_finish(struct rd_sv_device *d, const char *failure)
{
	struct rd_sv_op *op = d->ops;

	if (!op)
		return;
	uv_timer_stop(&d->timer);
	d->ops = op->next;
	rd_info("lifecycle", d->index, d->generation, 0, "%s done%s%s", rd_sv_verb_name(op->verb),
		failure ? ": " : "", failure ? failure : "");
	if (!failure && op->verb <= RD_SV_RESTART) {
		uint64_t *count[] = { &d->counters.releases, &d->counters.resets, &d->counters.restarts };
		(*count[op->verb])++;
	}
	if (op->request)
		events(d)->request_finished(d, op->request, failure, d->env->data);
	free(op);
	if (d->ops && can_start_op(d))
		op_start(d);
}

void rd_sv_device_enqueue(struct rd_sv_device *d, enum rd_sv_verb verb, const char *reason, unsigned deadline_ms,
			  void *request)
{
	struct rd_sv_op *op, **tail;

	/* After rd_sv_device_stop nothing runs: its timers are closed (a
	 * worker may still report a fault while it drains). */
	op = *d->env->stopping ? NULL : calloc(1, sizeof(*op));
	if (!op) {
		if (request)
			events(d)->request_finished(d, request, *d->env->stopping ? "regend is stopping" : "out of memory",
						    d->env->data);
		return;
	}
	op->verb = verb;
	op->step = OP_QUEUED;
	op->deadline_ms = deadline_ms;
	op->request = request;
	snprintf(op->reason, sizeof(op->reason), "%s", reason);
	for (tail = &d->ops; *tail; tail = &(*tail)->next)
		;
	*tail = op;
	if (d->ops == op && can_start_op(d))
		op_start(d);
}

static void kill_worker(struct rd_sv_device *d, const char *why)
{
	rd_warn("lifecycle", d->index, d->generation, 0, "killing worker %d: %s", d->worker.pid, why);
	d->worker_told_to_exit = true;
	rd_sv_worker_kill(&d->worker, SIGKILL);
}

static void on_op_timeout(uv_timer_t *t);

/* The operation now ends when the next worker reports Ready, or fails when
 * none does within the lifecycle timeout. */
static void op_await_worker(struct rd_sv_device *d)
{
	if (!d->ops || d->ops->step == OP_QUEUED)
		return;
	d->ops->step = OP_AWAITING_WORKER;
	uv_timer_start(&d->timer, on_op_timeout, LIFECYCLE_TIMEOUT_MS, 0);
}

/* The worker did not answer in time, or cannot recover in process: the one
 * cleanup that never leaks vendor state is its exit. */
static void op_escalate(struct rd_sv_device *d, const char *why)
{
	if (detaching(d)) {
		/* The worker was to exit anyway: its exit detaches the device. */
		d->ops->step = OP_APPLYING;
		kill_worker(d, why);
		return;
	}
	bump_for_lost_worker(d, why);
	op_await_worker(d);
	kill_worker(d, why);
}

static void on_op_timeout(uv_timer_t *t)
{
	struct rd_sv_device *d = t->data;

	if (d->ops && d->ops->step == OP_AWAITING_WORKER) {
		char why[96];
		snprintf(why, sizeof(why), "the worker did not come back within %d s", LIFECYCLE_TIMEOUT_MS / 1000);
		op_finish(d, why);
		return;
	}
	if (rd_sv_worker_running(&d->worker))
		op_escalate(d, "worker did not answer before the deadline");
}

static void on_lifecycle_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct rd_sv_device *d = userdata;
	struct rd_sv_op *op = d->ops;

	if (!op || op->step != OP_APPLYING)
		return;
	if (!reply) {
		/* The worker died mid-release; its exit respawns it. */
		op_await_worker(d);
		return;
	}
	if (reply->error) {
		op_escalate(d, reply->error);
		return;
	}
	if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply->params, "healthy"))) {
		op_escalate(d, "worker reset failed its canary");
		return;
	}
	take_memory(d, reply->params);
	transition(d, RP_STATE_READY, true, op->reason);
	op_finish(d, NULL);
}

static void send_lifecycle(struct rd_sv_device *d, bool reset)
{
	cJSON *params = cJSON_CreateObject();

	d->ops->step = OP_APPLYING;
	set_state(d, reset ? RP_STATE_RESETTING : RP_STATE_RELEASED);
	/* The generation the worker serves next, and the epoch then: ours go
	 * up to them when the worker says it does (another device's change in
	 * between reaches the worker as an Epoch call). */
	cJSON_AddNumberToObject(params, "generation", (double)(d->generation + 1));
	cJSON_AddNumberToObject(params, "epoch", (double)(*d->env->epoch + 1));
	if (d->ops && d->ops->verb == RD_SV_RESTART)
		cJSON_AddTrueToObject(params, "abort_comms");
	uv_timer_start(&d->timer, on_op_timeout, LIFECYCLE_TIMEOUT_MS, 0);
	if (rd_sv_device_call(d, reset ? "io.regen.Worker.Reset" : "io.regen.Worker.Release", params, on_lifecycle_reply,
			      d) < 0)
		op_escalate(d, "control channel to the worker is gone");
}

/* A Reset resets; so does a Restart or a Release of a device whose worker
 * reported a fault, before the operation started (it drains as RESETTING)
 * or while it drained (FAULTED): releasing a context that faulted would
 * serve the next generation on it, every call DeviceLost and no reset to
 * come. A Release of a healthy device releases. */
static bool op_resets(const struct rd_sv_device *d, const struct rd_sv_op *op)
{
	return op->verb == RD_SV_RESET || d->state == RP_STATE_FAULTED || d->state == RP_STATE_RESETTING;
}

static void on_drain_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct rd_sv_device *d = userdata;
	struct rd_sv_op *op = d->ops;

	if (!op || op->step != OP_DRAINING)
		return;
	uv_timer_stop(&d->timer);
	if (!reply) {
		op_await_worker(d);
		return;
	}
	if (reply->error || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply->params, "drained"))) {
		/* Calls still in flight past the deadline: the worker may be hung
		 * in a kernel or a vendor library. */
		op_escalate(d, "drain deadline passed with calls in flight");
		return;
	}
	if (op->verb == RD_SV_DETACH) {
		/* Drained: the worker exits on SIGTERM, destroying what it holds,
		 * and is killed if it does not within the lifecycle timeout. */
		op->step = OP_APPLYING;
		uv_timer_start(&d->timer, on_op_timeout, LIFECYCLE_TIMEOUT_MS, 0);
		d->worker_told_to_exit = true;
		rd_sv_worker_kill(&d->worker, SIGTERM);
		return;
	}
	send_lifecycle(d, op_resets(d, op));
}

/* The counts as the drain begins: Status (and regenctl --wait) can say how
 * many calls the drain waits for. */
static void on_drain_stats(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	if (reply && !reply->error)
		take_memory(userdata, reply->params);
}

static void op_start(struct rd_sv_device *d)
{
	struct rd_sv_op *op = d->ops;
	cJSON *params;

	if (!op || op->step != OP_QUEUED)
		return;
	if (d->state == RP_STATE_DETACHED || op->verb == RD_SV_ATTACH) {
		if (op->verb == RD_SV_ATTACH && d->state == RP_STATE_DETACHED) {
			/* A new worker in a new generation; ends when it is ready. */
			rd_info("lifecycle", d->index, d->generation, 0, "attach: %s", op->reason);
			detached_unlisten(d);
			op->step = OP_AWAITING_WORKER;
			d->crash_streak = 0;
			transition(d, RP_STATE_RESPAWNING, true, op->reason);
			uv_timer_start(&d->timer, on_op_timeout, LIFECYCLE_TIMEOUT_MS, 0);
			spawn(d);
		} else if (op->verb == RD_SV_ATTACH || op->verb == RD_SV_DETACH) {
			op_finish(d, NULL);    /* attached already, or detached already */
		} else {
			op_finish(d, "the device is detached: attach it first (regenctl attach)");
		}
		return;
	}
	rd_info("lifecycle", d->index, d->generation, 0, "%s: %s", rd_sv_verb_name(op->verb), op->reason);
	op->step = OP_DRAINING;
	/* A faulted device's own Reset keeps the fault as its reason. */
	transition(d, op->verb == RD_SV_RESET || d->state == RP_STATE_FAULTED ? RP_STATE_RESETTING : RP_STATE_DRAINING,
		   false, op->request || d->state != RP_STATE_FAULTED ? op->reason : NULL);
	/* Answered before the Drain: the channel answers in order. */
	rd_sv_device_call(d, "io.regen.Worker.Stats", NULL, on_drain_stats, d);
	params = cJSON_CreateObject();
	cJSON_AddNumberToObject(params, "deadline_ms", op->deadline_ms);
	uv_timer_start(&d->timer, on_op_timeout, (uint64_t)op->deadline_ms + DRAIN_GRACE_MS, 0);
	if (rd_sv_device_call(d, "io.regen.Worker.Drain", params, on_drain_reply, d) < 0)
		op_escalate(d, "control channel to the worker is gone");
}

/* ---- The heartbeat ---- */

/* How often the heartbeat asks, as a share of heartbeat_ms: a worker that
 * stops answering is found within heartbeat_ms. */
#define HEARTBEAT_ASKS 4
/* A GPU that served this long since it last failed starts its failure
 * count again. */
#define FAILED_STREAK_RESET_NS 60000000000ull

static uint64_t heartbeat_interval_ms(const struct rd_sv_device *d)
{
	unsigned ms = d->env->opts->heartbeat_ms / HEARTBEAT_ASKS;
	return ms ? ms : 1;
}

static void on_heartbeat_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct rd_sv_device *d = userdata;

	d->ping_outstanding = false;
	if (!reply)
		return;
	d->last_answer_ns = uv_hrtime();
	if (!reply->error) {
		take_memory(d, reply->params);
		take_health(d, cJSON_GetObjectItemCaseSensitive(reply->params, "health"));
		take_sharing(d, cJSON_GetObjectItemCaseSensitive(reply->params, "sharing"));
	}
	if (d->failed_streak && d->last_answer_ns - d->up_since_ns > FAILED_STREAK_RESET_NS)
		d->failed_streak = 0;
}

/* The worker answers nothing (stopped, deadlocked, spinning): Status keeps
 * answering from what it last said, and the process is replaced. */
static void unresponsive(struct rd_sv_device *d, uint64_t silent_ms)
{
	char why[128];

	snprintf(why, sizeof(why), "unresponsive: worker %d answered no heartbeat for %llu ms", d->worker.pid,
		 (unsigned long long)silent_ms);
	transition(d, RP_STATE_UNRESPONSIVE, false, why);
	op_await_worker(d);
	kill_worker(d, why);
}

/* The supervisor judges a worker's silence only over time it was there to
 * hear an answer. A tick later than its interval says the supervisor's own
 * loop stalled (a long turn, the machine swapped or stopped it): an answer
 * may be in the channel, unread, and the heartbeat's clock ran on without
 * it. The lateness moves the last answer on by as much, so that a stalled
 * judge never kills workers that answered in time (issue 30: a client's
 * flood stalled the supervisor and every worker was killed as silent). */
static void forgive_own_lateness(struct rd_sv_device *d, uint64_t now, uint64_t interval_ms)
{
	uint64_t since_tick = now - d->last_tick_ns, interval_ns = interval_ms * 1000000u;

	d->last_tick_ns = now;
	if (since_tick <= interval_ns + interval_ns / 2)
		return;
	d->last_answer_ns += since_tick - interval_ns;
	if (d->last_answer_ns > now)
		d->last_answer_ns = now;
	rd_debug("lifecycle", d->index, d->generation, 0,
		 "the heartbeat ticked %llu ms late: the supervisor's loop stalled, not counted as the worker's silence",
		 (unsigned long long)((since_tick - interval_ns) / 1000000u));
}

static void on_heartbeat(uv_timer_t *t)
{
	struct rd_sv_device *d = t->data;
	uint64_t now = uv_hrtime(), interval = heartbeat_interval_ms(d);

	forgive_own_lateness(d, now, uv_timer_get_repeat(t));
	uint64_t silent_ms = (now - d->last_answer_ns) / 1000000u;
	if (!d->worker.ctl || d->state == RP_STATE_UNRESPONSIVE || d->state == RP_STATE_FAILED ||
	    d->state == RP_STATE_UNSUPPORTED || d->state == RP_STATE_RESPAWNING)
		return;
	/* heartbeat_ms changed (SIGHUP): the timer goes at the new pace from
	 * now and the silence is counted afresh. The verdict below holds the
	 * last answer against the new heartbeat_ms: with the old, longer
	 * interval still between ticks, a healthy worker read as silent too
	 * long (every worker killed by a reload that lowered it 3 times). */
	if (uv_timer_get_repeat(t) != interval) {
		d->last_answer_ns = now;
		uv_timer_start(t, on_heartbeat, interval, interval);
		return;
	}
	/* A Drain or a Release/Reset holds the answers behind it (the channel
	 * answers in order) and has its own deadline: no verdict meanwhile. */
	if (d->ops && (d->ops->step == OP_DRAINING || d->ops->step == OP_APPLYING)) {
		d->last_answer_ns = now;
		return;
	}
	/* The last answer is at most one interval old on a healthy worker;
	 * this verdict comes within heartbeat_ms of the last one. */
	if (silent_ms + interval > d->env->opts->heartbeat_ms) {
		unresponsive(d, silent_ms);
		return;
	}
	if (!d->ping_outstanding && rd_sv_device_call(d, "io.regen.Worker.Stats", NULL, on_heartbeat_reply, d) == 0)
		d->ping_outstanding = true;
}

static void heartbeat_start(struct rd_sv_device *d)
{
	uint64_t interval = heartbeat_interval_ms(d);

	d->last_answer_ns = d->last_tick_ns = uv_hrtime();
	d->ping_outstanding = false;
	uv_timer_start(&d->heartbeat_timer, on_heartbeat, interval, interval);
}

/* ---- The worker process ---- */

/* The device's first start is over, one way or the other: its worker
 * serves, or one could not start and Status says why while the next is
 * tried. Once. */
static void start_settled(struct rd_sv_device *d)
{
	if (d->start_settled)
		return;
	d->start_settled = true;
	if (events(d)->start_settled)
		events(d)->start_settled(d, d->env->data);
}

static void on_worker_ready(void *data, const struct rd_sv_worker_ready *ready)
{
	struct rd_sv_device *d = data;

	snprintf(d->backend, sizeof(d->backend), "%s", ready->backend);
	snprintf(d->worker_socket, sizeof(d->worker_socket), "%s", ready->worker_socket);
	d->memory_used = ready->memory_used;
	d->memory_baseline = ready->memory_baseline;
	take_health(d, ready->health);
	take_sharing(d, ready->sharing);
	/* Until now up_since_ns was the spawn: how long a worker takes to
	 * serve is most of what a fault costs a rank. */
	uint64_t started_ms = (uv_hrtime() - d->up_since_ns) / 1000000u;
	d->up_since_ns = uv_hrtime();
	d->worker_served = true;
	uv_timer_stop(&d->start_timer);
	rd_info("lifecycle", d->index, d->generation, 0, "worker %d ready (%s backend) %llu ms after its spawn",
		d->worker.pid, d->backend, (unsigned long long)started_ms);
	heartbeat_start(d);
	/* The device serves again: the lost worker already gave it its new
	 * generation, and its reason stays the one that made it respawn. */
	set_state(d, RP_STATE_READY);
	if (d->ops && d->ops->step == OP_AWAITING_WORKER)
		op_finish(d, NULL);
	else if (d->ops)
		op_start(d);
	if (events(d)->worker_ready)
		events(d)->worker_ready(d, d->env->data);
	start_settled(d);
}

static void on_respawn_timer(uv_timer_t *t)
{
	struct rd_sv_device *d = t->data;

	if (rd_sv_worker_running(&d->worker) || *d->env->stopping || d->state == RP_STATE_DETACHED)
		return;
	/* A failed GPU's next try: shown as a respawn until it serves. */
	set_state(d, RP_STATE_RESPAWNING);
	spawn(d);
}

static unsigned failed_backoff_ms(const struct rd_sv_device *d)
{
	unsigned shift = d->failed_streak > 1 ? d->failed_streak - 1 : 0;
	uint64_t ms = (uint64_t)d->env->opts->failed_retry_ms << (shift < 4 ? shift : 4);

	return ms > 86400000u ? 86400000u : (unsigned)ms;
}

/* The GPU needs a reset or is gone (state failed), or the node's software
 * cannot drive it (unsupported: the driver, the CUDA backend): no worker
 * helps now. The device says so (the state, with why and when the next
 * try comes), every queued request ends, the worker goes, and the next one
 * starts after a pause that doubles with each failure in a row: no
 * respawn loop onto a GPU that is not there, or that nothing here can
 * drive until the driver or the packages change. */
static void fail_as(struct rd_sv_device *d, enum rp_state state, const char *what)
{
	char why[RD_SV_REASON_MAX];
	unsigned backoff;
	struct rd_sv_op *op;

	d->failed_streak++;
	backoff = failed_backoff_ms(d);
	snprintf(why, sizeof(why), "%s: %.260s (next try in %u ms)", rp_state_name(state), what, backoff);
	rd_err("lifecycle", d->index, d->generation, 0, "%s", why);
	uv_timer_stop(&d->timer);
	while ((op = d->ops)) {
		d->ops = op->next;
		if (op->request)
			events(d)->request_finished(d, op->request, why, d->env->data);
		free(op);
	}
	transition(d, state,
		   d->state != RP_STATE_RESPAWNING && d->state != RP_STATE_FAILED && d->state != RP_STATE_UNSUPPORTED, why);
	uv_timer_stop(&d->heartbeat_timer);
	if (rd_sv_worker_running(&d->worker))
		kill_worker(d, why);    /* its exit starts the pause */
	else
		uv_timer_start(&d->respawn_timer, on_respawn_timer, backoff, 0);
	start_settled(d);
}

static void fail(struct rd_sv_device *d, const char *what)
{
	fail_as(d, RP_STATE_FAILED, what);
}

static void on_worker_faulted(void *data, enum rd_sv_fault kind, const char *reason, const cJSON *health,
			      int64_t uid)
{
	struct rd_sv_device *d = data;
	char why[192];

	take_health(d, health);
	/* Charged before the worker is replaced: its successor starts with the
	 * charge. */
	if (kind == RD_SV_FAULT_HUNG && uid >= 0 && d->env->events->hang_of_uid)
		d->env->events->hang_of_uid(d, (uid_t)uid, reason, d->env->data);
	if (d->state == RP_STATE_FAILED || d->state == RP_STATE_UNSUPPORTED || d->state == RP_STATE_UNRESPONSIVE)
		return;    /* the worker is on its way out */
	d->counters.faults++;
	if (kind == RD_SV_FAULT_FAILED) {
		fail(d, reason);
		return;
	}
	if (kind == RD_SV_FAULT_HUNG) {
		/* No call that never ends is known to stop short of the process's
		 * exit: the worker is replaced at once, not drained first. */
		snprintf(why, sizeof(why), "%.180s", reason);
		rd_warn("lifecycle", d->index, d->generation, 0, "worker reports %s", why);
		transition(d, RP_STATE_FAULTED, false, why);
		op_escalate(d, why);
		return;
	}
	snprintf(why, sizeof(why), "fault: %.180s", reason);
	rd_warn("lifecycle", d->index, d->generation, 0, "worker reports %s", why);
	if (!d->ops) {
		/* Shown until the reset below starts. */
		transition(d, RP_STATE_FAULTED, false, why);
		rd_sv_device_enqueue(d, RD_SV_RESET, why, FAULT_DRAIN_DEADLINE_MS, NULL);
	} else if (d->state == RP_STATE_DRAINING) {
		/* A Restart or Release draining now resets instead of releasing
		 * (op_resets). */
		transition(d, RP_STATE_FAULTED, false, why);
	}
}

/* Kept until the worker's exit, which says the same in its status. */
static void on_worker_cannot_serve(void *data, enum rd_sv_exit how, const char *reason, const cJSON *health)
{
	struct rd_sv_device *d = data;

	take_health(d, health);
	snprintf(d->cannot_serve, sizeof(d->cannot_serve), "%s", reason);
}

static void on_worker_exited(void *data, const char *why, enum rd_sv_exit how)
{
	struct rd_sv_device *d = data;
	char cannot_serve[sizeof(d->cannot_serve)];
	unsigned backoff;

	uv_timer_stop(&d->heartbeat_timer);
	uv_timer_stop(&d->start_timer);
	d->ping_outstanding = false;
	fold_worker_counts(d);
	snprintf(cannot_serve, sizeof(cannot_serve), "%s", d->cannot_serve);
	d->cannot_serve[0] = '\0';
	if (*d->env->stopping)
		return;
	/* Killed at its start deadline: that, not the signal, is why. */
	char timed_out[128];
	if (d->start_timed_out) {
		d->start_timed_out = false;
		snprintf(timed_out, sizeof(timed_out), "worker %d was not ready within %u ms of its start (killed)",
			 d->worker.pid, d->env->opts->worker_start_timeout_ms);
		why = timed_out;
	}
	if (detaching(d)) {
		/* No worker, no handle on the GPU, no respawn until Attach. */
		rd_info("lifecycle", d->index, d->generation, 0, "detached: %s", why);
		d->memory_used = 0;
		transition(d, RP_STATE_DETACHED, true, d->ops->reason);
		detached_listen(d);
		op_finish(d, NULL);
		return;
	}
	rd_warn("lifecycle", d->index, d->generation, 0, "%s", why);
	if (d->state == RP_STATE_FAILED || d->state == RP_STATE_UNSUPPORTED) {
		/* Killed by fail_as(): the pause starts now. */
		uv_timer_start(&d->respawn_timer, on_respawn_timer, failed_backoff_ms(d), 0);
		return;
	}
	if (how == RD_SV_EXIT_UNSUPPORTED) {
		fail_as(d, RP_STATE_UNSUPPORTED,
			cannot_serve[0] ? cannot_serve : "the worker cannot drive the device (its log says why)");
		return;
	}
	if (how == RD_SV_EXIT_DEVICE_FAILED) {
		fail(d, cannot_serve[0] ? cannot_serve : "the worker cannot open the device (its log says why)");
		return;
	}
	/* A fault of the device's worker, as a lost context is: one that had
	 * served and died unasked (a crash: a signal regend did not send, an
	 * exit of its own), or stopped answering. A hung call was counted
	 * when the worker reported it; a start that failed is no fault. */
	if ((d->worker_served && !d->worker_told_to_exit) || d->state == RP_STATE_UNRESPONSIVE)
		d->counters.faults++;
	/* A worker found unresponsive, or replaced for a hang, keeps that as
	 * the reason; any other loss is the exit. */
	bump_for_lost_worker(d, d->state == RP_STATE_UNRESPONSIVE ? NULL : why);
	/* A worker that keeps dying is not respawned in a loop. */
	if (uv_hrtime() - d->up_since_ns < STABLE_NS)
		d->crash_streak++;
	else
		d->crash_streak = 0;
	/* One loss is not a loop: its successor starts at once, as the rank
	 * whose step it cost waits for it. From the second in a row: 200 ms,
	 * doubling. */
	backoff = d->crash_streak >= 2 ? 200u << (d->crash_streak < 7 ? d->crash_streak - 2 : 5) : 0;
	if (backoff > RESPAWN_BACKOFF_MAX_MS)
		backoff = RESPAWN_BACKOFF_MAX_MS;
	op_await_worker(d);
	/* A worker handed kept programs that died before it served may have
	 * died of one of them: the next starts without, rather than in a
	 * loop (their processes define them again on NoSuchObject). */
	if (!d->worker_served && d->kept_programs.count) {
		rd_warn("lifecycle", d->index, d->generation, 0,
			"the %u programs kept for the worker are forgotten: it exited before it served",
			d->kept_programs.count);
		rd_sv_kept_programs_finish(&d->kept_programs);
	}
	/* A worker that never served makes no transition (the device was
	 * respawning already): its exit is still why the device does not
	 * serve, which Status and Watch say. Worded to stay true once a later
	 * worker serves, as a reason does. */
	if (!d->worker_served) {
		char next[48] = "; retried at once";

		if (backoff)
			snprintf(next, sizeof(next), "; retried after %u ms", backoff);
		snprintf(d->reason, sizeof(d->reason), "%.200s before it served%s", why, next);
		/* No transition, but news for a scheduler that watches: why the
		 * device still does not serve. */
		events(d)->state_changed(d, false, d->env->data);
	}
	if (backoff) {
		rd_info("lifecycle", d->index, d->generation, 0,
			"next worker in %u ms: %u lost in a row, each within %llu s of coming up", backoff,
			d->crash_streak, STABLE_NS / 1000000000ull);
		uv_timer_start(&d->respawn_timer, on_respawn_timer, backoff, 0);
	} else {
		spawn(d);
	}
	start_settled(d);
}

static uid_t on_worker_comm_owner(void *data, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE])
{
	struct rd_sv_device *d = data;

	return rd_comm_owners_claim(d->env->comm_owners, uid, id);
}

static void on_program_kept(void *data, const struct rd_sv_program_kept *kept)
{
	struct rd_sv_device *d = data;
	int r;

	if (*d->env->stopping)
		return;
	r = rd_sv_kept_programs_add(&d->kept_programs, kept->id, &kept->owner, kept->nodes, kept->message, kept->len,
				    d->env->opts);
	if (r < 0)
		rd_warn("lifecycle", d->index, d->generation, kept->owner.pid,
			"program %s is not kept for the next worker: %s", kept->id,
			r == -E2BIG ? "past a program limit (the worker's options changed?)" : strerror(-r));
}

static void on_program_forgotten(void *data, const char *id)
{
	struct rd_sv_device *d = data;

	rd_sv_kept_programs_forget(&d->kept_programs, id);
}

static const struct rd_sv_worker_events worker_events = {
	.ready = on_worker_ready,
	.faulted = on_worker_faulted,
	.exited = on_worker_exited,
	.cannot_serve = on_worker_cannot_serve,
	.comm_owner = on_worker_comm_owner,
	.program_kept = on_program_kept,
	.program_forgotten = on_program_forgotten,
};

/* A worker that hangs in its start (a driver that never answers its
 * init) would hold the device, and READY=1 with it, for ever: past the
 * deadline it goes the way of a worker that crashed before it served
 * (backoff, respawn, the reason in Status). */
static void on_start_timeout(uv_timer_t *t)
{
	struct rd_sv_device *d = t->data;

	if (d->worker_served || !rd_sv_worker_running(&d->worker) || *d->env->stopping)
		return;
	d->start_timed_out = true;
	kill_worker(d, "not ready within worker_start_timeout_ms of its start");
}

static void spawn(struct rd_sv_device *d)
{
	struct rd_options wopts = *d->env->opts;
	int r;

	/* The worker runs the backend "auto" resolved to, in our generation. */
	snprintf(wopts.backend, sizeof(wopts.backend), "%s", d->backend);
	wopts.worker_device = d->index;
	wopts.worker_generation = d->generation;
	wopts.worker_epoch = *d->env->epoch;
	if (d->env->hang_charges)
		rd_hang_charges_format(d->env->hang_charges, uv_hrtime(), wopts.worker_charged,
				       sizeof(wopts.worker_charged));
	/* Without the memfd the worker starts with no programs: their
	 * processes define them again on NoSuchObject. */
	int programs = -1;
	if (d->kept_programs.count && (programs = rd_sv_kept_programs_memfd(&d->kept_programs)) < 0) {
		rd_warn("lifecycle", d->index, d->generation, 0,
			"cannot hand the next worker the %u programs defined on the device: %s",
			d->kept_programs.count, strerror(-programs));
		programs = -1;
	}
	r = rd_sv_worker_spawn(&d->worker, d->env->exe, &wopts, programs);
	if (programs >= 0)
		close(programs);
	if (r < 0) {
		snprintf(d->reason, sizeof(d->reason),
			 "cannot start a worker process (the log says why); retried after %d ms", RESPAWN_BACKOFF_MAX_MS);
		uv_timer_start(&d->respawn_timer, on_respawn_timer, RESPAWN_BACKOFF_MAX_MS, 0);
		start_settled(d);
		return;
	}
	if (d->up_since_ns)
		d->respawns++;
	d->up_since_ns = uv_hrtime();
	d->worker_served = false;
	d->worker_told_to_exit = false;
	uv_timer_start(&d->start_timer, on_start_timeout, d->env->opts->worker_start_timeout_ms, 0);
}

/* ---- A detached device's socket ---- */

/* Every call on a detached device's worker socket is told so by name,
 * rather than finding no socket ("is regend running?"). */
static void detached_on_call(struct rd_conn *conn, struct rd_call *call)
{
	struct rd_sv_device *d = conn->data;
	struct rp_error err = { 0 };

	rp_err_detached(&err, d->index, (long long)d->generation,
			"device %d is detached (regenctl detach); an admin brings it back with regenctl attach", d->index);
	rd_call_fail(call, &err);
}

static void detached_on_close(struct rd_conn *conn)
{
	struct rd_sv_device *d = conn->data;

	for (struct rd_conn **c = &d->detached_conns; *c; c = &(*c)->next) {
		if (*c == conn) {
			*c = conn->next;
			break;
		}
	}
}

static const struct rd_conn_ops detached_ops = { detached_on_call, detached_on_close, NULL };

/* Connections are counted per uid as on every socket of regend: this one
 * is the supervisor's own, and a uid that filled it without bound would
 * take the fds the admin's Attach needs. */
static void detached_accept(int fd, void *data)
{
	struct rd_sv_device *d = data;
	struct rd_conn *conn;
	unsigned same_uid, limit = d->env->opts->max_connections;

	if (rd_conn_new(d->env->loop, fd, &detached_ops, d, &conn) < 0)
		return;
	same_uid = rd_conns_of_uid(d->detached_conns, conn->peer.uid);
	conn->next = d->detached_conns;
	d->detached_conns = conn;
	if (same_uid >= limit) {
		rd_warn("conn", d->index, d->generation, conn->peer.pid,
			"refusing connection to detached device %d: uid %u has %u open", d->index,
			(unsigned)conn->peer.uid, same_uid);
		rd_conn_refuse(conn, "connections", limit);
	}
}

static void detached_listen(struct rd_sv_device *d)
{
	const struct rd_options *o = d->env->opts;
	int r = rd_listener_open(&d->detached_listener, d->env->loop, d->env->socket_dir, d->worker_socket, o->socket_mode,
				 o->have_socket_gid ? o->socket_gid : (gid_t)-1, -1, detached_accept, d);

	if (r < 0)
		rd_warn("lifecycle", d->index, d->generation, 0, "cannot listen on %s while detached: %s",
			d->worker_socket, strerror(-r));
}

static void detached_unlisten(struct rd_sv_device *d)
{
	while (d->detached_conns)
		rd_conn_close(d->detached_conns);    /* detached_on_close unlinks it */
	if (d->detached_listener.open)
		rd_listener_close(&d->detached_listener);
}

/* ---- Start, stop, and what the supervisor asks ---- */

void rd_sv_device_init(struct rd_sv_device *d, const struct rd_sv_device_env *env, int index, const char *backend)
{
	memset(d, 0, sizeof(*d));
	d->env = env;
	d->index = index;
	d->generation = 1;
	d->state = RP_STATE_RESPAWNING;
	snprintf(d->backend, sizeof(d->backend), "%s", backend);
	snprintf(d->reason, sizeof(d->reason), "started");
	rd_worker_socket_path(env->opts, index, d->worker_socket, sizeof(d->worker_socket));
	rd_sv_worker_init(&d->worker, env->loop, index, &worker_events, d);
	rd_sv_kept_programs_init(&d->kept_programs);
	uv_timer_init(env->loop, &d->timer);
	d->timer.data = d;
	uv_timer_init(env->loop, &d->respawn_timer);
	d->respawn_timer.data = d;
	uv_timer_init(env->loop, &d->heartbeat_timer);
	d->heartbeat_timer.data = d;
	uv_timer_init(env->loop, &d->start_timer);
	d->start_timer.data = d;
	d->health.ecc_dbe_volatile = d->health.ecc_dbe_aggregate = -1;
	d->health.retired_pages_pending = d->health.remap_pending = d->health.remap_failed = -1;
	d->sharing.mps_clients = -1;
}

void rd_sv_device_start(struct rd_sv_device *d)
{
	spawn(d);
}

void rd_sv_device_stop(struct rd_sv_device *d, const char *why)
{
	struct rd_sv_op *op;

	while ((op = d->ops)) {
		d->ops = op->next;
		if (op->request)
			events(d)->request_finished(d, op->request, why, d->env->data);
		free(op);
	}
	uv_timer_stop(&d->timer);
	uv_close((uv_handle_t *)&d->timer, NULL);
	uv_timer_stop(&d->respawn_timer);
	uv_close((uv_handle_t *)&d->respawn_timer, NULL);
	uv_timer_stop(&d->heartbeat_timer);
	uv_close((uv_handle_t *)&d->heartbeat_timer, NULL);
	uv_timer_stop(&d->start_timer);
	uv_close((uv_handle_t *)&d->start_timer, NULL);
	detached_unlisten(d);
	rd_sv_kept_programs_finish(&d->kept_programs);
	/* The worker drains on SIGTERM and exits. */
	d->worker_told_to_exit = true;
	rd_sv_worker_kill(&d->worker, SIGTERM);
}

void rd_sv_device_kill(struct rd_sv_device *d, const char *why)
{
	if (rd_sv_worker_running(&d->worker))
		kill_worker(d, why);
}

void rd_sv_device_tell_epoch(struct rd_sv_device *d)
{
	cJSON *params = cJSON_CreateObject();

	cJSON_AddNumberToObject(params, "epoch", (double)*d->env->epoch);
	/* A worker without a channel starts with the epoch on its command line. */
	rd_sv_worker_call(&d->worker, "io.regen.Worker.Epoch", params, true, NULL, NULL);
}

static void add_option(const char *key, const char *value, void *data)
{
	cJSON_AddStringToObject(data, key, value);
}

void rd_sv_device_reload(struct rd_sv_device *d)
{
	cJSON *params = cJSON_CreateObject();
	cJSON *options = cJSON_AddObjectToObject(params, "options");

	if (options)
		rd_options_each_worker_reload(d->env->opts, add_option, options);
	/* A worker without a channel starts with the reloaded values on its
	 * command line. */
	rd_sv_worker_call(&d->worker, "io.regen.Worker.Reload", params, true, NULL, NULL);
}

void rd_sv_device_tell_charges(struct rd_sv_device *d)
{
	/* The whole table, however long: the command line holds the newest
	 * that fit. */
	size_t size = RD_HANG_CHARGES_MAX * RD_HANG_CHARGE_TEXT_MAX + 1;
	char *text = malloc(size);
	cJSON *params;

	if (!d->env->hang_charges || !text) {
		free(text);
		return;
	}
	rd_hang_charges_format(d->env->hang_charges, uv_hrtime(), text, size);
	params = cJSON_CreateObject();
	cJSON_AddStringToObject(params, "charges", text);
	free(text);
	rd_sv_worker_call(&d->worker, "io.regen.Worker.Charged", params, true, NULL, NULL);
}

bool rd_sv_device_serving(const struct rd_sv_device *d)
{
	return d->state == RP_STATE_READY && d->worker.ctl;
}

int rd_sv_device_call(struct rd_sv_device *d, const char *method, cJSON *params, rd_reply_cb cb, void *userdata)
{
	return rd_sv_worker_call(&d->worker, method, params, false, cb, userdata);
}

int rd_sv_device_call_fds(struct rd_sv_device *d, const char *method, cJSON *params, const int *fds, size_t nfds,
			  rd_reply_cb cb, void *userdata)
{
	if (!d->worker.ctl) {
		cJSON_Delete(params);
		return -ENOTCONN;
	}
	return rd_conn_call_fds(d->worker.ctl, method, params, fds, nfds, false, cb, userdata);
}

struct memory_refresh {
	struct rd_sv_device *d;
	void (*done)(void *data);
	void *data;
};

static void on_stats_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct memory_refresh *r = userdata;

	if (reply && !reply->error) {
		r->d->last_answer_ns = uv_hrtime();
		take_memory(r->d, reply->params);
		take_health(r->d, cJSON_GetObjectItemCaseSensitive(reply->params, "health"));
		take_sharing(r->d, cJSON_GetObjectItemCaseSensitive(reply->params, "sharing"));
	}
	r->done(r->data);
	free(r);
}

int rd_sv_device_refresh_memory(struct rd_sv_device *d, void (*done)(void *data), void *data)
{
	struct memory_refresh *r;
	int ret;

	/* A worker whose heartbeat is unanswered may be stopped: Status then
	 * answers from what it said last rather than wait. */
	if (!rd_sv_device_serving(d) || d->ping_outstanding)
		return -EAGAIN;
	r = malloc(sizeof(*r));
	if (!r)
		return -ENOMEM;
	*r = (struct memory_refresh){ d, done, data };
	ret = rd_sv_device_call(d, "io.regen.Worker.Stats", NULL, on_stats_reply, r);
	if (ret < 0)
		free(r);
	return ret;
}

void rd_sv_device_info(const struct rd_sv_device *d, struct rp_device_info *out)
{
	*out = (struct rp_device_info){
		.index = (uint32_t)d->index,
		.generation = d->generation,
		.state = d->state,
		.backend = d->backend,
		.worker_socket = d->worker_socket,
		/* A worker that exited is no worker of the device's: a detached,
		 * failed or respawning device names none (its pid may be another
		 * process's by now). */
		.worker_pid = rd_sv_worker_running(&d->worker) ? d->worker.pid : 0,
		.respawns = d->respawns,
		.memory_used = d->memory_used,
		.memory_baseline = d->memory_baseline,
		.reason = d->reason,
		.has_health = d->health.known,
		.has_sharing = d->sharing.known,
		.sharing = {
			.mps = d->sharing.mps,
			.mps_pipe_directory = d->sharing.mps_pipe_directory,
			.compute_mode = d->sharing.compute_mode,
			.mps_clients = d->sharing.mps_clients,
			.reason = d->sharing.reason,
		},
		.has_counters = true,
		.counters = {
			.releases = d->counters.releases,
			.resets = d->counters.resets,
			.restarts = d->counters.restarts,
			.faults = d->counters.faults,
			.calls = d->counters.calls + d->worker_counts.calls,
			.call_errors = d->counters.call_errors + d->worker_counts.call_errors,
			.call_us = d->counters.call_us + d->worker_counts.call_us,
			.in_flight = d->worker_counts.in_flight,
			.buffers = d->worker_counts.buffers,
			.events = d->worker_counts.events,
			.connections = d->worker_counts.connections,
		},
		.has_jobs = true,
		.jobs = d->jobs,
		.njobs = d->njobs,
		.health = {
			.source = d->health.source,
			.detail = d->health.detail,
			.uuid = d->health.uuid,
			.pci_bus_id = d->health.pci_bus_id,
			.last_xid = d->health.last_xid,
			.last_xid_unix_ms = d->health.last_xid_unix_ms,
			.last_xid_text = d->health.last_xid_text,
			.ecc_dbe_volatile = d->health.ecc_dbe_volatile,
			.ecc_dbe_aggregate = d->health.ecc_dbe_aggregate,
			.retired_pages_pending = d->health.retired_pages_pending,
			.remap_pending = d->health.remap_pending,
			.remap_failed = d->health.remap_failed,
			.has_minor_number = d->health.has_minor_number,
			.minor_number = d->health.minor_number,
			.nmig = d->health.nmig,
		},
	};
	for (unsigned i = 0; i < d->health.nmig; i++)
		out->health.mig_devices[i] = d->health.mig_devices[i];
}
