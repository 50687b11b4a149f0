/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/supervisor/methods.h"
#include "proto/errors.h"
#include "proto/idl.h"
#include "proto/params.h"

/* The longest deadline_ms a Restart may ask for, as for drain_deadline_ms. */
#define DEADLINE_MAX_MS 3600000

static struct rd_supervisor *supervisor_of(const struct rd_call *call)
{
	return call->conn->data;
}

/* Status, Generation and the lifecycle verbs' replies; Restart's also say
 * how long it took. */
static cJSON *status_json(const struct rd_supervisor *sv, bool restart, uint64_t elapsed_ns)
{
	struct rp_device_info devices[RD_DEVICES_MAX];
	struct rp_status st = {
		.epoch = sv->watch.epoch,
		.devices = devices,
		.ndevices = (size_t)sv->ndevices,
		.has_elapsed_us = restart,
		.elapsed_us = elapsed_ns / 1000,
	};

	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_info(&sv->devices[i], &devices[i]);
	return rp_status_encode(&st);
}

/* "device": absent = every device (-1), else one this regend serves. */
static int parse_device_param(struct rd_call *call, int *device)
{
	const struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	uint64_t v;
	int r = rp_params_uint(call->msg.params, "device", RD_DEVICES_MAX * 4, UINT64_MAX, &v, &err);

	if (r < 0) {
		rd_call_fail(call, &err);
		return -EINVAL;
	}
	if (r == 1) {
		*device = -1;
		return 0;
	}
	if (v >= (uint64_t)sv->ndevices) {
		rp_error_set(&err, RP_ERR_NO_SUCH_DEVICE, "device %llu is not served; this regend has %d device(s)",
			     (unsigned long long)v, sv->ndevices);
		rp_error_add_int(&err, "device", (long long)v);
		rd_call_fail(call, &err);
		return -EINVAL;
	}
	*device = (int)v;
	return 0;
}

static bool check_fields(struct rd_call *call, const struct rp_field *fields)
{
	struct rp_error err = { 0 };

	if (rp_params_check(call->msg.params, fields, &err) < 0) {
		rd_call_fail(call, &err);
		return false;
	}
	return true;
}

static const struct rp_field no_fields[] = { { NULL } };

/* ---- Status and Generation ---- */

/* Status's reply: the devices, the options in force, and what is kept. */
static cJSON *status_reply(const struct rd_supervisor *sv)
{
	cJSON *reply = status_json(sv, false, 0);
	cJSON *options = rd_options_to_json(&sv->opts);

	cJSON *kept = rd_sv_keep_list_json(&sv->keep, NULL, NULL);

	if (reply && options)
		cJSON_AddItemToObject(reply, "options", options);
	else
		cJSON_Delete(options);
	if (reply && kept)
		cJSON_AddItemToObject(reply, "kept", kept);
	else
		cJSON_Delete(kept);
	return reply;
}

/* A Status asks every worker that serves and answers its heartbeat for
 * fresh memory and health numbers, and waits for them at most
 * STATUS_WAIT_MS: a worker that stopped answering never holds Status up
 * (it answers from what the worker said last). */
#define STATUS_WAIT_MS 100

struct status_gather {
	struct rd_call *call;
	unsigned remaining;        /* answers still to come, and one for the method itself */
	bool answered;
	uv_timer_t timer;
};

static void gather_free(uv_handle_t *h)
{
	free(h->data);
}

static void gather_answer(struct status_gather *g)
{
	if (g->answered)
		return;
	g->answered = true;
	uv_timer_stop(&g->timer);
	rd_call_reply(g->call, status_reply(supervisor_of(g->call)), false);
}

static void status_gathered(void *data)
{
	struct status_gather *g = data;

	if (--g->remaining)
		return;
	gather_answer(g);
	uv_close((uv_handle_t *)&g->timer, gather_free);
}

static void on_status_wait(uv_timer_t *t)
{
	gather_answer(t->data);
}

static void method_status(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct status_gather *g;

	if (!check_fields(call, no_fields))
		return;
	g = calloc(1, sizeof(*g));
	if (!g) {
		rd_call_reply(call, status_reply(sv), false);
		return;
	}
	g->call = call;
	g->remaining = 1;
	uv_timer_init(sv->loop, &g->timer);
	g->timer.data = g;
	for (int i = 0; i < sv->ndevices; i++)
		if (rd_sv_device_refresh_memory(&sv->devices[i], status_gathered, g) == 0)
			g->remaining++;
	if (g->remaining > 1)
		uv_timer_start(&g->timer, on_status_wait, STATUS_WAIT_MS, 0);
	status_gathered(g);
}

static void method_generation(struct rd_call *call)
{
	if (check_fields(call, no_fields))
		rd_call_reply(call, status_json(supervisor_of(call), false, 0), false);
}

static void method_watch(struct rd_call *call)
{
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };

	if (!check_fields(call, no_fields))
		return;
	if (rd_sv_watch_subscribe(&sv->watch, call, sv->devices, sv->ndevices, &err) < 0)
		rd_call_fail(call, &err);
}

/* ---- Release, Reset, Restart ---- */

/* A client's Release/Reset/Restart over one or every device: answered when
 * the last device's part ends, with the first failure if any. */
struct request {
	struct rd_call *call;
	enum rd_sv_verb verb;
	unsigned remaining;
	uint64_t start_ns;
	char failure[256];
	int failed_device;
	uint64_t failed_generation;
	bool failed_detached;
};

void rd_sv_request_finished(struct rd_sv_device *d, void *request, const char *failure, void *data)
{
	struct rd_supervisor *sv = data;
	struct request *req = request;

	if (failure && !req->failure[0]) {
		snprintf(req->failure, sizeof(req->failure), "%s", failure);
		req->failed_device = d->index;
		req->failed_generation = d->generation;
		req->failed_detached = d->state == RP_STATE_DETACHED;
	}
	if (--req->remaining)
		return;
	if (req->failure[0] && req->failed_detached && !sv->stopping) {
		struct rp_error err = { 0 };
		rp_err_detached(&err, req->failed_device, (long long)req->failed_generation, "device %d: %s",
				req->failed_device, req->failure);
		rd_call_fail(req->call, &err);
	} else if (req->failure[0]) {
		struct rp_error err = { 0 };
		rp_error_set(&err, sv->stopping ? RP_ERR_DRAINING : RP_ERR_TIMEOUT, "device %d: %s", req->failed_device,
			     req->failure);
		rp_error_add_int(&err, "device", req->failed_device);
		if (sv->stopping)
			rp_error_add_int(&err, "generation", (long long)req->failed_generation);
		else
			rp_error_add_int(&err, "elapsed_ms", (long long)((uv_hrtime() - req->start_ns) / 1000000));
		rd_call_fail(req->call, &err);
	} else {
		rd_call_reply(req->call, status_json(sv, req->verb == RD_SV_RESTART, uv_hrtime() - req->start_ns), false);
	}
	free(req);
}

/* Which devices a lifecycle call names: "device" (one) or "devices" (a
 * list, each once), not both; neither = every device. Fills want[] and
 * returns how many; < 0 after failing the call. */
static int parse_targets(struct rd_call *call, bool want[RD_DEVICES_MAX])
{
	const struct rd_supervisor *sv = supervisor_of(call);
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(call->msg.params, "devices");
	struct rp_error err = { 0 };
	const cJSON *e;
	int device, n = 0;

	memset(want, 0, sizeof(bool) * RD_DEVICES_MAX);
	if (!cJSON_IsArray(list)) {
		if (parse_device_param(call, &device) < 0)
			return -EINVAL;
		for (int i = 0; i < sv->ndevices; i++)
			if (device < 0 || device == i)
				want[i] = true, n++;
		return n;
	}
	if (cJSON_GetObjectItemCaseSensitive(call->msg.params, "device") || cJSON_GetArraySize(list) == 0) {
		/* Both, or an empty list: a caller's mistake, never "all". */
		rd_call_fail(call, (rp_error_invalid_parameter(&err, "devices"), &err));
		return -EINVAL;
	}
	cJSON_ArrayForEach(e, list) {
		double v = cJSON_IsNumber(e) ? e->valuedouble : -1;

		if (!cJSON_IsNumber(e) || v < 0 || v != (double)(long long)v || v > RD_DEVICES_MAX * 4) {
			rd_call_fail(call, (rp_error_invalid_parameter(&err, "devices"), &err));
			return -EINVAL;
		}
		if (v >= sv->ndevices) {
			rp_error_set(&err, RP_ERR_NO_SUCH_DEVICE, "device %lld is not served; this regend has %d device(s)",
				     (long long)v, sv->ndevices);
			rp_error_add_int(&err, "device", (long long)v);
			rd_call_fail(call, &err);
			return -EINVAL;
		}
		if (want[(int)v]) {
			rd_call_fail(call, (rp_error_invalid_parameter(&err, "devices"), &err));
			return -EINVAL;
		}
		want[(int)v] = true;
		n++;
	}
	return n;
}

static void lifecycle_method(struct rd_call *call, enum rd_sv_verb verb)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, false },
		{ "devices", RP_T_ARRAY, false },
		{ "reason", RP_T_STRING, false },
		{ "deadline_ms", RP_T_INT, false },
		{ NULL },
	};
	static const struct rp_field fields_no_deadline[] = {
		{ "device", RP_T_INT, false },
		{ "devices", RP_T_ARRAY, false },
		{ "reason", RP_T_STRING, false },
		{ NULL },
	};
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct request *req;
	const char *reason = NULL;
	uint64_t deadline;
	char reason_buf[RD_SV_REASON_MAX], job[2 * RP_JOB_MAX + 16];
	bool want[RD_DEVICES_MAX];
	int n, first = -1;

	if (!check_fields(call, verb == RD_SV_RESTART || verb == RD_SV_DETACH ? fields : fields_no_deadline) ||
	    (n = parse_targets(call, want)) < 0)
		return;
	for (int i = sv->ndevices - 1; i >= 0; i--)
		if (want[i])
			first = i;
	if (rp_params_string(call->msg.params, "reason", 120, NULL, &reason, &err) < 0 ||
	    rp_params_uint(call->msg.params, "deadline_ms", DEADLINE_MAX_MS, sv->opts.drain_deadline_ms, &deadline,
			   &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	if (sv->stopping || n == 0) {
		rp_error_set(&err, RP_ERR_DRAINING, "%s", n ? "regend is shutting down" : "regend serves no device");
		rp_error_add_int(&err, "device", first);
		rp_error_add_int(&err, "generation", first >= 0 ? (long long)sv->devices[first].generation : 0);
		rd_call_fail(call, &err);
		return;
	}
	/* The job from the caller's cgroup, and its own words beside it
	 * (marked "stated") where they differ. */
	rd_job_describe(call->conn, job, sizeof(job));
	snprintf(reason_buf, sizeof(reason_buf), "%s by pid %d%s%s%s%s%s", rd_sv_verb_name(verb),
		 (int)call->conn->peer.pid, job[0] ? " (" : "", job, job[0] ? ")" : "", reason ? ": " : "",
		 reason ? reason : "");
	req = calloc(1, sizeof(*req));
	if (!req) {
		rp_error_set(&err, RP_ERR_OUT_OF_MEMORY, "no memory for the request");
		rp_error_add_int(&err, "device", first);
		rd_call_fail(call, &err);
		return;
	}
	req->call = call;
	req->verb = verb;
	req->start_ns = uv_hrtime();
	req->remaining = (unsigned)n;
	rd_info("lifecycle", n == 1 ? first : -1, 0, call->conn->peer.pid, "%s requested (%d device(s))", reason_buf, n);
	for (int i = 0; i < sv->ndevices; i++)
		if (want[i])
			rd_sv_device_enqueue(&sv->devices[i], verb, reason_buf, (unsigned)deadline, req);
}

static void method_release(struct rd_call *call) { lifecycle_method(call, RD_SV_RELEASE); }
static void method_reset(struct rd_call *call) { lifecycle_method(call, RD_SV_RESET); }
static void method_restart(struct rd_call *call) { lifecycle_method(call, RD_SV_RESTART); }
static void method_detach(struct rd_call *call) { lifecycle_method(call, RD_SV_DETACH); }
static void method_attach(struct rd_call *call) { lifecycle_method(call, RD_SV_ATTACH); }

/* ---- InjectFault ---- */

static void on_inject_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct rd_call *call = userdata;

	/* A crash takes the control channel down before any reply: that is
	 * the fault having been injected. */
	if (!reply || !reply->error) {
		rd_call_reply(call, NULL, false);
		return;
	}
	struct rp_error err = { 0 };
	rp_error_set(&err, RP_ERR_BACKEND, "the worker refused the fault");
	cJSON_Delete(err.params);
	err.params = cJSON_Duplicate(reply->params, true);
	err.name = strcmp(reply->error, RP_ERR_METHOD_NOT_IMPLEMENTED) == 0 ? RP_ERR_METHOD_NOT_IMPLEMENTED : RP_ERR_BACKEND;
	rd_call_fail(call, &err);
}

static void method_inject_fault(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, true },
		{ "kind", RP_T_STRING, true },
		{ "xid", RP_T_INT, false },
		{ NULL },
	};
	static const char *const kinds[] = { "crash", "device_lost", "hang", "xid", NULL };
	struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	struct rd_sv_device *d;
	uint64_t xid = 0;
	int device, kind, has_xid;

	if (!check_fields(call, fields) || parse_device_param(call, &device) < 0)
		return;
	if (rp_params_enum(call->msg.params, "kind", kinds, -1, &kind, &err) < 0 ||
	    (has_xid = rp_params_uint(call->msg.params, "xid", 65535, 0, &xid, &err)) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	/* An XID number goes with kind xid, and only with it. */
	if ((strcmp(kinds[kind], "xid") == 0) != (has_xid == 0) || (has_xid == 0 && xid == 0)) {
		rd_call_fail(call, (rp_error_invalid_parameter(&err, "xid"), &err));
		return;
	}
	if (!sv->opts.fault_injection) {
		rd_call_failf(call, RP_ERR_FAULT_INJECTION_DISABLED,
			      "regend was started without --enable-fault-injection");
		return;
	}
	d = &sv->devices[device];
	if (d->state == RP_STATE_DETACHED) {
		rp_err_detached(&err, device, (long long)d->generation, "device %d is detached", device);
		rd_call_fail(call, &err);
		return;
	}
	if (!rd_sv_device_serving(d)) {
		rp_error_set(&err, RP_ERR_DRAINING, "device %d is %s; try again when it is ready", device,
			     rp_state_name(d->state));
		rp_error_add_int(&err, "device", device);
		rp_error_add_int(&err, "generation", (long long)d->generation);
		rd_call_fail(call, &err);
		return;
	}
	cJSON *params = cJSON_CreateObject();
	cJSON_AddStringToObject(params, "kind", kinds[kind]);
	if (has_xid == 0)
		cJSON_AddNumberToObject(params, "xid", (double)xid);
	if (has_xid == 0)
		rd_warn("lifecycle", device, d->generation, call->conn->peer.pid, "injecting fault: XID %llu",
			(unsigned long long)xid);
	else
		rd_warn("lifecycle", device, d->generation, call->conn->peer.pid, "injecting fault: %s", kinds[kind]);
	if (rd_sv_device_call(d, "io.regen.Worker.InjectFault", params, on_inject_reply, call) < 0) {
		rp_error_set(&err, RP_ERR_BACKEND, "the control channel to device %d's worker is gone", device);
		rp_error_add_int(&err, "device", device);
		rd_call_fail(call, &err);
	}
}

/* ---- SetJob ---- */

static void method_set_job(struct rd_call *call)
{
	/* The call is gone once answered: the connection is not. */
	struct rd_conn *conn = call->conn;
	char job[2 * RP_JOB_MAX + 16];

	if (rd_job_set(call) == 0)
		rd_debug("conn", -1, 0, conn->peer.pid, "job %s",
			 rd_job_describe(conn, job, sizeof(job))[0] ? job : "none");
}

/* The data plane's methods belong on the device's worker socket: say where. */
static void method_wrong_endpoint(struct rd_call *call)
{
	const struct rd_supervisor *sv = supervisor_of(call);
	struct rp_error err = { 0 };
	cJSON *dev = cJSON_GetObjectItemCaseSensitive(call->msg.params, "device");
	int index = cJSON_IsNumber(dev) && dev->valuedouble >= 0 && dev->valuedouble < sv->ndevices ? (int)dev->valuedouble : 0;
	const char *socket = sv->devices[index].worker_socket;

	rp_error_set(&err, RP_ERR_WRONG_ENDPOINT, "%s is served on the device's worker socket %s, not here",
		     call->msg.method, socket);
	rp_error_add_str(&err, "method", call->msg.method);
	rp_error_add_str(&err, "socket", socket);
	rd_call_fail(call, &err);
}

static const struct rd_method main_methods[] = {
	{ "io.regen.SetJob", method_set_job },
	{ "io.regen.Device.Status", method_status },
	{ "io.regen.Device.Generation", method_generation },
	{ "io.regen.Device.Watch", method_watch, false, true },
	{ "io.regen.Device.Release", method_release, true },
	{ "io.regen.Device.Reset", method_reset, true },
	{ "io.regen.Device.Restart", method_restart, true },
	{ "io.regen.Device.Detach", method_detach, true },
	{ "io.regen.Device.Attach", method_attach, true },
	{ "io.regen.Device.InjectFault", method_inject_fault, true },
	{ "io.regen.Keep.Keep", rd_sv_keep_keep, .takes_fds = true },
	{ "io.regen.Keep.Commit", rd_sv_keep_commit },
	{ "io.regen.Keep.TakeBack", rd_sv_keep_take_back },
	{ "io.regen.Keep.Drop", rd_sv_keep_drop },
	{ "io.regen.Keep.List", rd_sv_keep_list },
	{ NULL },
};
/* What the IDL serves on a worker socket (Memory, Compute, Lane, Comm,
 * Program) is answered with where. */
const struct rd_endpoint rd_sv_main_endpoint = {
	.methods = main_methods, .interfaces = rp_main_interfaces, .elsewhere = method_wrong_endpoint
};
