/* SPDX-License-Identifier: Apache-2.0 */
/* The control channel: the supervisor's verbs to this worker (io.regen.Worker:
 * Drain, Release, Reset, Stats, InjectFault, Reload) and what the worker reports
 * upward (Ready, Faulted). Stats is also the supervisor's heartbeat: it
 * carries the device's health, so Status answers from what the last one
 * said. Lifecycle verbs run with no call in flight and
 * move the device to the generation the supervisor names; every verb that
 * carries the node's epoch updates the one the worker reports. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/backend/health.h"
#include "daemon/dispatch.h"
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "daemon/worker/worker.h"
#include "proto/device.h"
#include "proto/errors.h"
#include "proto/idl.h"
#include "proto/params.h"

static struct rd_worker *worker_of(const struct rd_call *call)
{
	return call->conn->data;
}

static cJSON *memory_json(struct rd_worker *w)
{
	uint64_t used = 0, base = 0;
	cJSON *o = cJSON_CreateObject();

	w->dev.backend->memory(&w->dev, &used, &base);
	cJSON_AddNumberToObject(o, "memory_used", (double)used);
	cJSON_AddNumberToObject(o, "memory_baseline", (double)base);
	return o;
}

static void reply_lifecycle(struct rd_call *call, bool healthy)
{
	cJSON *reply = memory_json(worker_of(call));

	cJSON_AddBoolToObject(reply, "healthy", healthy);
	rd_call_reply(call, reply, false);
}

/* The supervisor sends the node's epoch with its verbs and whenever another
 * device changes it. It only goes up: a late word never takes it back. */
static void take_epoch(struct rd_worker *w, const cJSON *params)
{
	uint64_t epoch;
	struct rp_error err = { 0 };

	if (rp_params_uint(params, "epoch", UINT64_MAX, 0, &epoch, &err) == 0 && epoch > w->epoch)
		w->epoch = epoch;
	rp_error_clear(&err);
}

static void ctl_epoch(struct rd_call *call)
{
	take_epoch(worker_of(call), call->msg.params);
	rd_call_reply(call, NULL, false);
}

static void drain_reply(struct rd_worker *w, bool drained)
{
	cJSON *reply = cJSON_CreateObject();

	cJSON_AddBoolToObject(reply, "drained", drained);
	cJSON_AddNumberToObject(reply, "in_flight", w->in_flight);
	uv_timer_stop(&w->drain_timer);
	rd_call_reply(w->drain_call, reply, false);
	w->drain_call = NULL;
}

void rd_control_maybe_finish_drain(struct rd_worker *w)
{
	if (w->drain_call && w->in_flight == 0)
		drain_reply(w, true);
}

static void on_drain_deadline(uv_timer_t *t)
{
	struct rd_worker *w = t->data;

	if (w->drain_call) {
		rd_warn("lifecycle", w->dev.index, rd_worker_generation(w), 0,
			"drain deadline passed with %u call(s) in flight", w->in_flight);
		drain_reply(w, false);
	}
}

static void ctl_drain(struct rd_call *call)
{
	struct rd_worker *w = worker_of(call);
	struct rp_error err = { 0 };
	uint64_t deadline;

	if (rp_params_uint(call->msg.params, "deadline_ms", 3600000, w->opts->drain_deadline_ms, &deadline, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	take_epoch(w, call->msg.params);
	if (w->drain_call) {
		rd_call_failf(call, RP_ERR_DRAINING, "a drain is already in progress");
		return;
	}
	if (w->state == RD_WORKER_READY)
		w->state = RD_WORKER_DRAINING;
	rd_info("lifecycle", w->dev.index, rd_worker_generation(w), 0, "draining %u call(s), deadline %llu ms",
		w->in_flight, (unsigned long long)deadline);
	w->drain_call = call;
	/* A communicator's call may wait for a peer that never comes; every
	 * communicator ends with the lifecycle change anyway. */
	rd_comm_abort_busy(w, "the device is draining for a lifecycle change");
	if (w->in_flight == 0) {
		drain_reply(w, true);
		return;
	}
	uv_timer_start(&w->drain_timer, on_drain_deadline, deadline, 0);
}

/* The generation a lifecycle verb moves to; it must be newer, and nothing
 * may be in flight. */
static int lifecycle_generation(struct rd_call *call, uint64_t *gen)
{
	struct rd_worker *w = worker_of(call);
	struct rp_error err = { 0 };

	if (rp_params_uint(call->msg.params, "generation", UINT64_MAX, 0, gen, &err) < 0 ||
	    *gen <= rd_worker_generation(w)) {
		rp_error_clear(&err);
		rd_call_failf(call, RP_ERR_BACKEND, "a lifecycle verb needs a generation above %llu",
			      (unsigned long long)rd_worker_generation(w));
		return -EINVAL;
	}
	if (w->in_flight) {
		rd_call_failf(call, RP_ERR_DRAINING, "%u call(s) still in flight: drain first", w->in_flight);
		return -EBUSY;
	}
	take_epoch(w, call->msg.params);
	return 0;
}

/* Release (the context is usable: destroy every resource properly) or
 * reset (it may be dead: forget every native handle without calling into
 * it), then the new generation. Every id goes stale with the generation, so
 * every object goes too: before the registry on release (their mappings are
 * destroyed properly), after it on reset (their resources are invalid
 * already). */
static void lifecycle(struct rd_call *call, bool reset)
{
	struct rd_worker *w = worker_of(call);
	struct rp_error err = { 0 };
	uint64_t gen, t0;
	unsigned n;
	int r;

	if (lifecycle_generation(call, &gen) < 0)
		return;
	t0 = uv_hrtime();
	/* A worker that found a fault resets, whatever it was asked: a
	 * released context that faulted stays faulted, and the fault, reported
	 * once, would not be reported again. */
	pthread_mutex_lock(&w->lock);
	if (w->fault_reported)
		reset = true;
	pthread_mutex_unlock(&w->lock);
	/* A restart's release aborts the communicators instead of finalizing
	 * them: it is asked for when a rank of the job failed, and a peer that
	 * is gone would hold each finalize for its whole bound. */
	if (!reset && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(call->msg.params, "abort_comms")))
		rd_comm_abort_all(w, "the device restarts");
	if (reset) {
		n = rd_registry_invalidate(&w->dev.registry);
		rd_objects_close_all(&w->objects);
		r = w->dev.backend->reset(&w->dev, &err);
	} else {
		rd_objects_close_all(&w->objects);
		n = rd_registry_release(&w->dev.registry);
		r = w->dev.backend->release(&w->dev, &err);
	}
	atomic_store(&w->dev.generation, gen);
	if (reset) {
		pthread_mutex_lock(&w->lock);
		w->fault_reported = false;
		w->fault_pending = false;
		pthread_mutex_unlock(&w->lock);
	}
	/* A release that failed serves nothing either: the supervisor replaces
	 * this worker (healthy: false), and ids made here in the new generation
	 * would die with it as NoSuchObject, not StaleGeneration. */
	w->state = r == 0 ? RD_WORKER_READY : RD_WORKER_LOST;
	if (r < 0 && !reset)
		snprintf(w->fault_reason, sizeof(w->fault_reason), "its release failed; it is being replaced");
	const char *outcome = r == 0 ? (reset ? "canary passed" : "done") : (reset ? "canary FAILED: " : "backend: ");
	const char *why = r < 0 && err.params ? cJSON_GetStringValue(cJSON_GetObjectItem(err.params, "message")) : NULL;
	rd_info("lifecycle", w->dev.index, gen, 0, "%s %u resource(s) in %.1f ms; %s%s",
		reset ? "reset: invalidated" : "released", n, (double)(uv_hrtime() - t0) / 1e6, outcome, why ? why : "");
	rp_error_clear(&err);
	reply_lifecycle(call, r == 0);
}

static void ctl_release(struct rd_call *call)
{
	lifecycle(call, false);
}

static void ctl_reset(struct rd_call *call)
{
	lifecycle(call, true);
}

/* Sharing is optional on the wire: left out while the backend has not
 * said. */
static void add_sharing(struct rd_worker *w, cJSON *params)
{
	cJSON *sharing = rd_sharing_json(w);

	if (sharing)
		cJSON_AddItemToObject(params, "sharing", sharing);
}

static void ctl_stats(struct rd_call *call)
{
	struct rd_worker *w = worker_of(call);
	cJSON *reply = memory_json(w);

	take_epoch(w, call->msg.params);
	cJSON_AddNumberToObject(reply, "in_flight", w->in_flight);
	cJSON_AddNumberToObject(reply, "buffers", w->objects.count[RD_OBJECT_BUFFER]);
	cJSON_AddNumberToObject(reply, "events", w->objects.count[RD_OBJECT_EVENT]);
	cJSON_AddNumberToObject(reply, "connections", w->nsessions);
	cJSON_AddItemToObject(reply, "jobs", rd_usage_json(&w->usage));
	cJSON_AddNumberToObject(reply, "calls", (double)w->calls_done);
	cJSON_AddNumberToObject(reply, "call_errors", (double)w->calls_failed);
	cJSON_AddNumberToObject(reply, "call_us", (double)w->calls_us);
	cJSON_AddItemToObject(reply, "health", rd_health_json(w));
	add_sharing(w, reply);
	rd_call_reply(call, reply, false);
}

/* SIGHUP in the supervisor: every option it hands on to workers and
 * reloads, by key, as text. Each is checked again by the rule it met there;
 * one that fails (its group gone in between) keeps its old value. What
 * changes applies from now on: the log level, the next connection's limit,
 * the drain deadline of a stop that begins later. */
static void ctl_reload(struct rd_call *call)
{
	struct rd_worker *w = worker_of(call);
	const cJSON *options = cJSON_GetObjectItemCaseSensitive(call->msg.params, "options");
	const cJSON *opt;
	char why[256];

	cJSON_ArrayForEach(opt, options) {
		if (!cJSON_IsString(opt) || !opt->string) {
			rd_warn("worker", w->dev.index, rd_worker_generation(w), 0, "reload: %s is not text",
				opt->string ? opt->string : "an option");
			continue;
		}
		if (rd_options_set_worker_reload(w->opts, opt->string, opt->valuestring, why, sizeof(why)) < 0)
			rd_warn("worker", w->dev.index, rd_worker_generation(w), 0, "reload: %s: %s; it keeps its value",
				opt->string, why);
	}
	rd_log_set_default_level(w->opts->log_level);
	rd_info("worker", w->dev.index, rd_worker_generation(w), 0,
		"reloaded: log level %d, drain deadline %u ms, max_connections %u", w->opts->log_level,
		w->opts->drain_deadline_ms, w->opts->max_connections);
	rd_call_reply(call, NULL, false);
}

static void ctl_inject_fault(struct rd_call *call)
{
	struct rd_worker *w = worker_of(call);
	struct rp_error err = { 0 };
	const char *kind = NULL;
	uint64_t xid = 0;
	char xid_kind[32];

	if (!w->opts->fault_injection) {
		rd_call_failf(call, RP_ERR_FAULT_INJECTION_DISABLED, "fault injection is disabled");
		return;
	}
	if (rp_params_string(call->msg.params, "kind", 32, NULL, &kind, &err) < 0 || !kind) {
		rp_error_clear(&err);
		rd_call_fail(call, (rp_error_invalid_parameter(&err, "kind"), &err));
		return;
	}
	if (strcmp(kind, "xid") == 0) {
		/* The backend takes a simulated XID as "xid:N". */
		if (rp_params_uint(call->msg.params, "xid", 65535, 0, &xid, &err) != 0 || xid == 0) {
			rp_error_clear(&err);
			rd_call_fail(call, (rp_error_invalid_parameter(&err, "xid"), &err));
			return;
		}
		snprintf(xid_kind, sizeof(xid_kind), "xid:%u", (unsigned)xid);
		kind = xid_kind;
	}
	if (strcmp(kind, "crash") == 0) {
		rd_warn("lifecycle", w->dev.index, rd_worker_generation(w), 0, "injected crash");
		abort();
	}
	if (!w->dev.backend->inject_fault || w->dev.backend->inject_fault(&w->dev, kind, &err) < 0) {
		if (!err.name)
			rp_error_set(&err, RP_ERR_BACKEND, "the %s backend cannot inject '%s'", w->dev.backend->name, kind);
		rd_call_fail(call, &err);
		return;
	}
	/* The call that hangs next did not cause it: nobody is charged. */
	if (strcmp(kind, "hang") == 0)
		w->hang_injected = true;
	rd_call_reply(call, NULL, false);
}

/* The supervisor's table of uids cooling down after a hang
 * (daemon/hang_charge.h), whole, whenever it changes. */
static void ctl_charged(struct rd_call *call)
{
	struct rd_worker *w = worker_of(call);
	const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call->msg.params, "charges"));

	if (!text || rd_hang_charges_parse(&w->hang_charges, text, uv_hrtime()) < 0)
		rd_warn("worker", w->dev.index, rd_worker_generation(w), 0, "Charged: '%s' is not a list of charges",
			text ? text : "(none)");
	rd_call_reply(call, NULL, false);
}

/* The supervisor's question before it keeps CUDA memory for a rank. */
static void ctl_check_export(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "kind", RP_T_STRING, true },
		{ "fd", RP_T_INT, true },
		{ "size", RP_T_INT, true },
		{ NULL },
	};
	struct rd_worker *w = worker_of(call);
	struct rp_error err = { 0 };
	const char *kind = NULL;
	uint64_t fd = 0, size = 0;

	if (rp_params_check(call->msg.params, fields, &err) < 0 ||
	    rp_params_string(call->msg.params, "kind", 16, NULL, &kind, &err) < 0 ||
	    rp_params_uint(call->msg.params, "fd", RP_FDS_MAX - 1, 0, &fd, &err) < 0 ||
	    rp_params_uint(call->msg.params, "size", UINT64_C(1) << 48, 0, &size, &err) < 0)
		goto fail;
	if (strcmp(kind, "cuda_fd") != 0 || fd >= call->raw.nfds || call->raw.fds[fd] < 0) {
		rp_err_import_failed(&err, kind, "CheckExport takes a cuda_fd passed with the call");
		goto fail;
	}
	if (!w->dev.backend->check_export) {
		rp_err_import_failed(&err, kind, "the %s backend holds no CUDA memory: keep host memory (host_fd)",
				     w->dev.backend->name);
		goto fail;
	}
	if (w->dev.backend->check_export(&w->dev, call->raw.fds[fd], size, &err) < 0)
		goto fail;
	rd_call_reply(call, NULL, false);
	return;
fail:
	rd_call_fail(call, &err);
}

static void ctl_process_sessions(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "pid", RP_T_INT, true },
		{ "uid", RP_T_INT, true },
		{ "gid", RP_T_INT, true },
		{ "start_time", RP_T_INT, true },
		{ "pidfs_inode", RP_T_INT, true },
		{ NULL },
	};
	struct rd_worker *w = worker_of(call);
	struct rp_error err = { 0 };
	struct rd_peer peer = { 0 };
	uint64_t pid = 0, uid = 0, gid = 0;
	unsigned sessions = 0;

	if (rp_params_check(call->msg.params, fields, &err) < 0 ||
	    rp_params_uint(call->msg.params, "pid", INT32_MAX, 0, &pid, &err) < 0 ||
	    rp_params_uint(call->msg.params, "uid", UINT32_MAX, 0, &uid, &err) < 0 ||
	    rp_params_uint(call->msg.params, "gid", UINT32_MAX, 0, &gid, &err) < 0 ||
	    rp_params_uint(call->msg.params, "start_time", UINT64_MAX, 0, &peer.start_time, &err) < 0 ||
	    rp_params_uint(call->msg.params, "pidfs_inode", UINT64_MAX, 0, &peer.pidfs_inode, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	peer.pid = (pid_t)pid;
	peer.uid = (uid_t)uid;
	peer.gid = (gid_t)gid;
	for (const struct rd_session *s = w->sessions; s; s = s->next)
		if (rd_peer_same_process(&s->conn->peer, &peer))
			sessions++;
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddNumberToObject(reply, "sessions", sessions);
	cJSON_AddBoolToObject(reply, "alive", rd_peer_alive(&peer));
	rd_call_reply(call, reply, false);
}

static const struct rd_method ctl_methods[] = {
	{ "io.regen.Worker.ProcessSessions", ctl_process_sessions },
	{ "io.regen.Worker.CheckExport", ctl_check_export, .takes_fds = true },
	{ "io.regen.Worker.Drain", ctl_drain },
	{ "io.regen.Worker.Epoch", ctl_epoch },
	{ "io.regen.Worker.Release", ctl_release },
	{ "io.regen.Worker.Reset", ctl_reset },
	{ "io.regen.Worker.Stats", ctl_stats },
	{ "io.regen.Worker.InjectFault", ctl_inject_fault },
	{ "io.regen.Worker.Reload", ctl_reload },
	{ "io.regen.Worker.Charged", ctl_charged },
	{ NULL },
};
static const struct rd_endpoint ctl_endpoint = { ctl_methods, rp_control_interfaces, NULL };

static void ctl_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(&ctl_endpoint, call);
}

static void ctl_on_close(struct rd_conn *conn)
{
	struct rd_worker *w = conn->data;

	w->ctl = NULL;
	/* Without a supervisor nobody would restart or reset us: go. */
	rd_worker_begin_stop(w, "the supervisor is gone");
}

static const struct rd_conn_ops ctl_ops = { .on_call = ctl_on_call, .on_close = ctl_on_close };

int rd_control_open(struct rd_worker *w, int ctl_fd)
{
	w->drain_timer.data = w;
	if (ctl_fd < 0)
		return -EBADF;
	int r = rd_conn_new(w->loop, ctl_fd, &ctl_ops, w, &w->ctl);
	if (r < 0)
		return r;
	/* The supervisor's heartbeat is answered whatever clients send. */
	rd_conn_make_control(w->ctl);
	return 0;
}

void rd_control_ready(struct rd_worker *w)
{
	cJSON *p = memory_json(w);

	cJSON_AddNumberToObject(p, "pid", getpid());
	cJSON_AddStringToObject(p, "worker_socket", w->socket_path);
	cJSON_AddStringToObject(p, "backend", w->dev.backend->name);
	cJSON_AddItemToObject(p, "health", rd_health_json(w));
	add_sharing(w, p);
	rd_conn_call(w->ctl, "io.regen.Worker.Ready", p, true, NULL, NULL);
}

static void on_cannot_serve_heard(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	*(bool *)userdata = true;
}

static void on_cannot_serve_deadline(uv_timer_t *t)
{
	*(bool *)t->data = true;
}

void rd_control_cannot_serve(struct rd_worker *w, const char *kind, const char *reason)
{
	/* The supervisor hears it before it sees the exit: without an answer
	 * (a supervisor stuck or gone) the exit status alone must do. */
	enum { HEARD_WITHIN_MS = 3000 };
	struct rd_health h;
	bool heard = false;
	uv_timer_t deadline;

	if (!w->ctl)
		return;
	/* No backend opened, so nothing is known of the GPU; the health says
	 * why, where Status shows it. */
	rd_health_unknown(&h);
	snprintf(h.detail, sizeof(h.detail), "%s", reason);
	struct rp_device_health out = {
		.source = h.source,
		.detail = h.detail,
		.ecc_dbe_volatile = -1,
		.ecc_dbe_aggregate = -1,
		.retired_pages_pending = -1,
		.remap_pending = -1,
		.remap_failed = -1,
	};
	cJSON *p = cJSON_CreateObject();
	cJSON_AddStringToObject(p, "kind", kind);
	cJSON_AddStringToObject(p, "reason", reason);
	cJSON_AddItemToObject(p, "health", rp_device_health_encode(&out));
	if (rd_conn_call(w->ctl, "io.regen.Worker.CannotServe", p, false, on_cannot_serve_heard, &heard) < 0)
		return;
	uv_timer_init(w->loop, &deadline);
	deadline.data = &heard;
	uv_timer_start(&deadline, on_cannot_serve_deadline, HEARD_WITHIN_MS, 0);
	while (!heard && uv_run(w->loop, UV_RUN_ONCE))
		;
	uv_close((uv_handle_t *)&deadline, NULL);
	uv_run(w->loop, UV_RUN_NOWAIT);
}

void rd_control_report_fault(struct rd_worker *w, enum rd_fault_kind kind, const char *reason, int64_t uid)
{
	if (w->ctl) {
		cJSON *p = cJSON_CreateObject();
		cJSON_AddStringToObject(p, "reason", reason);
		cJSON_AddStringToObject(p, "kind", rd_fault_kind_name(kind));
		if (uid >= 0)
			cJSON_AddNumberToObject(p, "uid", (double)uid);
		cJSON_AddItemToObject(p, "health", rd_health_json(w));
		rd_conn_call(w->ctl, "io.regen.Worker.Faulted", p, true, NULL, NULL);
	}
}
