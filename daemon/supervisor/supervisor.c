#include "regen-config.h"
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/conn.h"
#include "daemon/dispatch.h"
#include "daemon/listen.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "proto/errors.h"
#include "proto/params.h"
#include "daemon/state.h"
#include "daemon/supervisor/supervisor.h"

/* How long a worker may take to answer Release/Reset, and to come up. */
#define LIFECYCLE_TIMEOUT_MS 30000
#define DRAIN_GRACE_MS 2000
#define RESPAWN_BACKOFF_MAX_MS 5000

enum sv_verb { SV_RELEASE, SV_RESET, SV_RESTART };
static const char *const verb_names[] = { "release", "reset", "restart" };

struct sv_request;

/* One lifecycle operation on one device; a device runs one at a time. */
struct sv_op {
	enum sv_verb verb;
	char reason[128];
	unsigned deadline_ms;
	uint64_t start_generation;
	int stage;                  /* 0 queued, 1 draining, 2 releasing/resetting, 3 awaiting respawn */
	struct sv_request *request; /* NULL for internal ops (a fault report) */
	struct sv_op *next;
};

/* A client's Release/Reset/Restart over one or all devices. */
struct sv_request {
	struct rd_call *call;
	enum sv_verb verb;
	unsigned remaining;
	uint64_t start_ns;
	char failure[256];
	int failed_device;
	uint64_t failed_generation;
};

struct sv_device {
	int index;
	uint64_t generation;
	enum rd_state state;
	char reason[128];
	char backend[16];
	char worker_socket[108];
	uv_process_t *proc;       /* one per spawn: a closing handle is never reused */
	bool proc_alive;
	bool bumped_for_exit;     /* this exit's generation bump already happened */
	int pid;
	struct rd_conn *ctl;
	uint64_t respawns;
	uint64_t memory_used, memory_baseline;
	unsigned crash_streak;
	uint64_t ready_since_ns;
	struct sv_op *ops;
	uv_timer_t timer;         /* the current op's deadline */
	uv_timer_t respawn_timer; /* backoff before a respawn */
	bool faulted;
};

struct sv_watcher {
	struct rd_call *call;
	struct sv_watcher *next;
};

static struct {
	uv_loop_t *loop;
	struct rd_options opts_live;
	const struct rd_options *opts;
	int argc;
	char **argv;
	struct rd_listener listener;
	struct rd_conn *conns;
	struct sv_device devices[RD_DEVICES_MAX];
	int ndevices;
	uint64_t epoch;
	struct sv_watcher *watchers;
	char exe[PATH_MAX];
	uv_signal_t sigterm, sigint, sighup;
	uv_timer_t stop_timer;
	bool stopping;
	uv_timer_t watchdog;
} sv;

static void op_start(struct sv_device *d);
static void op_await_respawn(struct sv_device *d);
static void spawn_worker(struct sv_device *d);

/* ---- Status and Watch ---- */

static cJSON *device_json(const struct sv_device *d)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "index", d->index);
	cJSON_AddNumberToObject(o, "generation", (double)d->generation);
	cJSON_AddStringToObject(o, "state", rd_state_name(d->state));
	cJSON_AddStringToObject(o, "backend", d->backend);
	cJSON_AddStringToObject(o, "worker_socket", d->worker_socket);
	cJSON_AddNumberToObject(o, "worker_pid", d->pid);
	cJSON_AddNumberToObject(o, "respawns", (double)d->respawns);
	cJSON_AddNumberToObject(o, "memory_used", (double)d->memory_used);
	cJSON_AddNumberToObject(o, "memory_baseline", (double)d->memory_baseline);
	cJSON_AddStringToObject(o, "reason", d->reason);
	return o;
}

static cJSON *status_json(int only)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *arr;

	cJSON_AddNumberToObject(o, "epoch", (double)sv.epoch);
	arr = cJSON_AddArrayToObject(o, "devices");
	for (int i = 0; i < sv.ndevices; i++)
		if (only < 0 || only == i)
			cJSON_AddItemToArray(arr, device_json(&sv.devices[i]));
	return o;
}

static cJSON *watch_event_json(const struct sv_device *d)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "epoch", (double)sv.epoch);
	cJSON_AddNumberToObject(o, "device", d->index);
	cJSON_AddNumberToObject(o, "generation", (double)d->generation);
	cJSON_AddStringToObject(o, "state", rd_state_name(d->state));
	cJSON_AddStringToObject(o, "reason", d->reason);
	return o;
}

static void notify_watchers(const struct sv_device *d)
{
	for (struct sv_watcher *w = sv.watchers; w; w = w->next)
		rd_call_reply(w->call, watch_event_json(d), true);
}

/* The one place a generation changes: it bumps the node epoch with it and
 * tells every watcher. */
static void bump_generation(struct sv_device *d, const char *reason)
{
	d->generation++;
	sv.epoch++;
	snprintf(d->reason, sizeof(d->reason), "%s", reason);
	rd_info("lifecycle", d->index, d->generation, 0, "generation %llu: %s", (unsigned long long)d->generation, reason);
	notify_watchers(d);
}

static void set_state(struct sv_device *d, enum rd_state state)
{
	if (d->state == state)
		return;
	rd_debug("lifecycle", d->index, d->generation, 0, "%s -> %s", rd_state_name(d->state), rd_state_name(state));
	d->state = state;
	rd_notify_statusf("%d device(s); device %d %s, generation %llu", sv.ndevices, d->index,
			  rd_state_name(state), (unsigned long long)d->generation);
}

/* ---- Requests and ops ---- */

/* The worker is up and no lifecycle op runs: a faulted device waits only
 * for its reset. */
static bool worker_can_start_op(const struct sv_device *d)
{
	return d->state == RD_STATE_READY || d->state == RD_STATE_FAULTED;
}

static void request_finish_one(struct sv_request *req, const struct sv_device *d, const char *failure)
{
	if (failure && !req->failure[0]) {
		snprintf(req->failure, sizeof(req->failure), "%s", failure);
		req->failed_device = d->index;
		req->failed_generation = d->generation;
	}
	if (--req->remaining)
		return;
	if (req->failure[0]) {
		struct rp_error err = { 0 };
		rp_error_set(&err, sv.stopping ? RP_ERR_DRAINING : RP_ERR_TIMEOUT, "device %d: %s", req->failed_device,
			     req->failure);
		rp_error_add_int(&err, "device", req->failed_device);
		if (sv.stopping)
			rp_error_add_int(&err, "generation", (long long)req->failed_generation);
		else
			rp_error_add_int(&err, "elapsed_ms", (long long)((uv_hrtime() - req->start_ns) / 1000000));
		rd_call_fail(req->call, &err);
	} else {
		cJSON *reply = status_json(-1);
		if (req->verb == SV_RESTART)
			cJSON_AddNumberToObject(reply, "elapsed_us", (double)((uv_hrtime() - req->start_ns) / 1000));
		rd_call_reply(req->call, reply, false);
	}
	free(req);
}

static void op_finish(struct sv_device *d, const char *failure)
{
	struct sv_op *op = d->ops;

	if (!op)
		return;
	uv_timer_stop(&d->timer);
	d->ops = op->next;
	rd_info("lifecycle", d->index, d->generation, 0, "%s done%s%s", verb_names[op->verb],
		failure ? ": " : "", failure ? failure : "");
	if (op->request)
		request_finish_one(op->request, d, failure);
	free(op);
	if (d->ops && worker_can_start_op(d))
		op_start(d);
}

static void op_enqueue(struct sv_device *d, enum sv_verb verb, const char *reason, unsigned deadline_ms,
		       struct sv_request *req)
{
	struct sv_op *op = calloc(1, sizeof(*op)), **tail;

	if (!op) {
		if (req)
			request_finish_one(req, d, "out of memory");
		return;
	}
	op->verb = verb;
	op->deadline_ms = deadline_ms;
	op->request = req;
	snprintf(op->reason, sizeof(op->reason), "%s", reason);
	for (tail = &d->ops; *tail; tail = &(*tail)->next)
		;
	*tail = op;
	if (d->ops == op && worker_can_start_op(d))
		op_start(d);
}

static void kill_worker(struct sv_device *d, const char *why)
{
	rd_warn("lifecycle", d->index, d->generation, 0, "killing worker %d: %s", d->pid, why);
	if (d->proc_alive)
		uv_process_kill(d->proc, SIGKILL);
}

/* The worker did not answer in time, or cannot recover in process: the one
 * cleanup that never leaks vendor state is its exit. The op completes when
 * the respawned worker reports Ready. */
static void op_escalate(struct sv_device *d, const char *why)
{
	if (!d->bumped_for_exit) {
		bump_generation(d, why);
		d->bumped_for_exit = true;
	}
	set_state(d, RD_STATE_RESPAWNING);
	op_await_respawn(d);
	kill_worker(d, why);
}

static void on_op_timeout(uv_timer_t *t)
{
	struct sv_device *d = t->data;

	if (d->ops && d->ops->stage == 3) {
		char why[96];
		snprintf(why, sizeof(why), "the worker did not come back within %d s", LIFECYCLE_TIMEOUT_MS / 1000);
		op_finish(d, why);
		return;
	}
	if (d->proc_alive)
		op_escalate(d, "worker did not answer before the deadline");
}

/* The op now ends when the respawned worker reports Ready, or fails when it
 * does not within the lifecycle timeout. */
static void op_await_respawn(struct sv_device *d)
{
	if (!d->ops || d->ops->stage == 0)
		return;
	d->ops->stage = 3;
	uv_timer_start(&d->timer, on_op_timeout, LIFECYCLE_TIMEOUT_MS, 0);
}

static void on_respawn_timer(uv_timer_t *t)
{
	struct sv_device *d = t->data;

	if (!d->proc_alive && !sv.stopping)
		spawn_worker(d);
}

static void on_lifecycle_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct sv_device *d = userdata;
	struct sv_op *op = d->ops;

	if (!op || op->stage != 2)
		return;
	if (!reply) {
		/* The worker died mid-release; its exit handler respawns it. */
		op_await_respawn(d);
		return;
	}
	if (reply->error) {
		op_escalate(d, reply->error);
		return;
	}
	cJSON *healthy = cJSON_GetObjectItemCaseSensitive(reply->params, "healthy");
	if (!cJSON_IsTrue(healthy)) {
		op_escalate(d, "worker reset failed its canary");
		return;
	}
	cJSON *used = cJSON_GetObjectItemCaseSensitive(reply->params, "memory_used");
	cJSON *base = cJSON_GetObjectItemCaseSensitive(reply->params, "memory_baseline");
	if (cJSON_IsNumber(used))
		d->memory_used = (uint64_t)used->valuedouble;
	if (cJSON_IsNumber(base))
		d->memory_baseline = (uint64_t)base->valuedouble;
	d->faulted = false;
	set_state(d, RD_STATE_READY);
	bump_generation(d, op->reason);
	op_finish(d, NULL);
}

static void send_lifecycle(struct sv_device *d, bool reset)
{
	cJSON *params = cJSON_CreateObject();

	d->ops->stage = 2;
	set_state(d, reset ? RD_STATE_RESETTING : RD_STATE_RELEASED);
	cJSON_AddNumberToObject(params, "generation", (double)(d->generation + 1));
	uv_timer_start(&d->timer, on_op_timeout, LIFECYCLE_TIMEOUT_MS, 0);
	if (rd_conn_call(d->ctl, reset ? "io.regen.Worker.Reset" : "io.regen.Worker.Release", params, false,
			 on_lifecycle_reply, d) < 0)
		op_escalate(d, "control channel to the worker is gone");
}

static void on_drain_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct sv_device *d = userdata;
	struct sv_op *op = d->ops;

	if (!op || op->stage != 1)
		return;
	uv_timer_stop(&d->timer);
	if (!reply) {
		op_await_respawn(d);
		return;
	}
	bool drained = !reply->error && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply->params, "drained"));
	if (!drained) {
		/* Calls still in flight past the deadline: the worker may be hung
		 * in a kernel or a vendor library. */
		op_escalate(d, "drain deadline passed with calls in flight");
		return;
	}
	bool reset = op->verb == SV_RESET || (op->verb == SV_RESTART && d->faulted);
	send_lifecycle(d, reset);
}

static void op_start(struct sv_device *d)
{
	struct sv_op *op = d->ops;
	cJSON *params;

	if (!op || op->stage != 0)
		return;
	op->start_generation = d->generation;
	rd_info("lifecycle", d->index, d->generation, 0, "%s: %s", verb_names[op->verb], op->reason);
	op->stage = 1;
	set_state(d, op->verb == SV_RESET || d->faulted ? RD_STATE_RESETTING : RD_STATE_DRAINING);
	params = cJSON_CreateObject();
	cJSON_AddNumberToObject(params, "deadline_ms", op->deadline_ms);
	uv_timer_start(&d->timer, on_op_timeout, (uint64_t)op->deadline_ms + DRAIN_GRACE_MS, 0);
	if (rd_conn_call(d->ctl, "io.regen.Worker.Drain", params, false, on_drain_reply, d) < 0)
		op_escalate(d, "control channel to the worker is gone");
}

/* ---- The worker's control channel ---- */

static struct sv_device *device_of_ctl(struct rd_conn *conn)
{
	return conn->data;
}

static void ctl_ready(struct rd_call *call)
{
	struct sv_device *d = device_of_ctl(call->conn);
	cJSON *p = call->msg.params;
	const char *backend = NULL, *sock = NULL;
	struct rp_error err = { 0 };
	uint64_t used = 0, base = 0;

	rp_params_string(p, "backend", 15, "", &backend, &err);
	rp_params_string(p, "worker_socket", 107, "", &sock, &err);
	rp_params_uint(p, "memory_used", UINT64_MAX, 0, &used, &err);
	rp_params_uint(p, "memory_baseline", UINT64_MAX, 0, &base, &err);
	rp_error_clear(&err);
	snprintf(d->backend, sizeof(d->backend), "%s", backend ? backend : "");
	snprintf(d->worker_socket, sizeof(d->worker_socket), "%s", sock ? sock : "");
	d->memory_used = used;
	d->memory_baseline = base;
	d->bumped_for_exit = false;
	d->ready_since_ns = uv_hrtime();
	d->faulted = false;
	rd_info("lifecycle", d->index, d->generation, 0, "worker %d ready (%s backend)", d->pid, d->backend);
	rd_call_reply(call, NULL, false);
	set_state(d, RD_STATE_READY);
	if (d->ops && d->ops->stage == 3) {
		/* The respawn already gave the device a new generation. */
		notify_watchers(d);
		op_finish(d, NULL);
	} else if (d->ops) {
		op_start(d);
	} else if (d->respawns) {
		notify_watchers(d);
	}
	int all_ready = 1;
	for (int i = 0; i < sv.ndevices; i++)
		all_ready &= sv.devices[i].state == RD_STATE_READY;
	if (all_ready)
		rd_notify_ready();
}

static void ctl_faulted(struct rd_call *call)
{
	struct sv_device *d = device_of_ctl(call->conn);
	const char *reason = NULL;
	struct rp_error err = { 0 };
	char why[128];

	rp_params_string(call->msg.params, "reason", 120, "device fault", &reason, &err);
	rp_error_clear(&err);
	snprintf(why, sizeof(why), "fault: %.110s", reason ? reason : "device fault");
	rd_warn("lifecycle", d->index, d->generation, 0, "worker reports %s", why);
	rd_call_reply(call, NULL, false);
	d->faulted = true;
	if (!d->ops) {
		/* Reported until the reset below starts. */
		set_state(d, RD_STATE_FAULTED);
		op_enqueue(d, SV_RESET, why, 2000, NULL);
	}
}

static const struct rd_method ctl_methods[] = {
	{ "io.regen.Worker.Ready", ctl_ready },
	{ "io.regen.Worker.Faulted", ctl_faulted },
	{ NULL },
};
static const char *const ctl_interfaces[] = { "io.regen.Worker", NULL };
static const struct rd_endpoint ctl_endpoint = { ctl_methods, ctl_interfaces };

static void ctl_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_dispatch(&ctl_endpoint, call);
}

static void ctl_on_close(struct rd_conn *conn)
{
	struct sv_device *d = conn->data;

	if (d->ctl == conn)
		d->ctl = NULL;
}

static const struct rd_conn_ops ctl_ops = { ctl_on_call, ctl_on_close };

/* ---- Worker processes ---- */

static void free_process(uv_handle_t *h)
{
	free(h);
}

static void on_worker_exit(uv_process_t *proc, int64_t status, int signal)
{
	struct sv_device *d = proc->data;
	char why[96];

	d->proc_alive = false;
	if (d->proc == proc)
		d->proc = NULL;
	uv_close((uv_handle_t *)proc, free_process);
	if (d->ctl)
		rd_conn_close(d->ctl);
	if (sv.stopping)
		return;
	if (signal)
		snprintf(why, sizeof(why), "worker exited (signal %d)", signal);
	else
		snprintf(why, sizeof(why), "worker exited (status %lld)", (long long)status);
	rd_warn("lifecycle", d->index, d->generation, 0, "%s", why);
	if (!d->bumped_for_exit)
		bump_generation(d, why);
	d->bumped_for_exit = true;
	set_state(d, RD_STATE_RESPAWNING);
	/* A worker that keeps dying right after start is not respawned in a
	 * tight loop. */
	if (uv_hrtime() - d->ready_since_ns < 2000000000ull)
		d->crash_streak++;
	else
		d->crash_streak = 0;
	unsigned backoff = d->crash_streak ? 100u << (d->crash_streak < 6 ? d->crash_streak : 6) : 0;
	if (backoff > RESPAWN_BACKOFF_MAX_MS)
		backoff = RESPAWN_BACKOFF_MAX_MS;
	op_await_respawn(d);
	if (backoff)
		uv_timer_start(&d->respawn_timer, on_respawn_timer, backoff, 0);
	else
		spawn_worker(d);
}

static void spawn_worker(struct sv_device *d)
{
	struct rd_options wopts = *sv.opts;
	struct rd_argv args;
	int sv_pair[2];
	int r;

	/* The worker's command line: every option the table hands on, with the
	 * backend resolved and the worker's own options. fd 3 is the control
	 * channel (stdio[3] below). */
	snprintf(wopts.backend, sizeof(wopts.backend), "%s", d->backend);
	wopts.worker_device = d->index;
	wopts.worker_generation = d->generation;
	wopts.ctl_fd = 3;
	if (rd_options_worker_argv(&wopts, sv.exe, &args) < 0) {
		rd_err("lifecycle", d->index, d->generation, 0, "the worker's command line does not fit");
		return;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv_pair) < 0) {
		rd_err("lifecycle", d->index, d->generation, 0, "socketpair: %s", strerror(errno));
		return;
	}

	uv_stdio_container_t stdio[4] = {
		{ .flags = UV_IGNORE },
		{ .flags = UV_INHERIT_FD, .data.fd = STDOUT_FILENO },
		{ .flags = UV_INHERIT_FD, .data.fd = STDERR_FILENO },
		{ .flags = UV_INHERIT_FD, .data.fd = sv_pair[1] },
	};
	uv_process_options_t po = {
		.exit_cb = on_worker_exit,
		.file = sv.exe,
		.args = args.argv,
		.stdio_count = 4,
		.stdio = stdio,
	};
	uv_process_t *proc = calloc(1, sizeof(*proc));
	if (!proc) {
		close(sv_pair[0]);
		close(sv_pair[1]);
		uv_timer_start(&d->respawn_timer, on_respawn_timer, RESPAWN_BACKOFF_MAX_MS, 0);
		return;
	}
	proc->data = d;
	r = uv_spawn(sv.loop, proc, &po);
	close(sv_pair[1]);
	if (r < 0) {
		rd_err("lifecycle", d->index, d->generation, 0, "cannot start worker: %s", uv_strerror(r));
		close(sv_pair[0]);
		uv_close((uv_handle_t *)proc, free_process);
		uv_timer_start(&d->respawn_timer, on_respawn_timer, RESPAWN_BACKOFF_MAX_MS, 0);
		return;
	}
	d->proc = proc;
	d->proc_alive = true;
	d->pid = proc->pid;
	if (d->respawns || d->ready_since_ns)
		d->respawns++;
	d->ready_since_ns = uv_hrtime();
	if (rd_conn_new(sv.loop, sv_pair[0], &ctl_ops, d, &d->ctl) < 0) {
		d->ctl = NULL;
		kill_worker(d, "cannot watch its control channel");
		return;
	}
	d->ctl->admin = true;
	rd_debug("lifecycle", d->index, d->generation, 0, "started worker %d", d->pid);
}

/* ---- io.regen.Device ---- */

static int parse_device_param(struct rd_call *call, int *device)
{
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
	if (v >= (uint64_t)sv.ndevices) {
		rp_error_set(&err, RP_ERR_NO_SUCH_DEVICE, "device %llu is not served; this regend has %d device(s)",
			     (unsigned long long)v, sv.ndevices);
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

static void status_gathered(struct rd_call *call);

struct status_gather {
	struct rd_call *call;
	unsigned remaining;
};

static void on_stats_reply(struct rd_conn *conn, const struct rp_call *reply, void *userdata)
{
	struct status_gather *g = userdata;
	struct sv_device *d = conn->data;

	if (reply && !reply->error) {
		cJSON *used = cJSON_GetObjectItemCaseSensitive(reply->params, "memory_used");
		cJSON *base = cJSON_GetObjectItemCaseSensitive(reply->params, "memory_baseline");
		if (cJSON_IsNumber(used))
			d->memory_used = (uint64_t)used->valuedouble;
		if (cJSON_IsNumber(base))
			d->memory_baseline = (uint64_t)base->valuedouble;
	}
	if (--g->remaining == 0) {
		status_gathered(g->call);
		free(g);
	}
}

static void status_gathered(struct rd_call *call)
{
	rd_call_reply(call, status_json(-1), false);
}

static void method_status(struct rd_call *call)
{
	static const struct rp_field fields[] = { { NULL } };
	struct status_gather *g;

	if (!check_fields(call, fields))
		return;
	g = calloc(1, sizeof(*g));
	if (!g) {
		status_gathered(call);
		return;
	}
	g->call = call;
	g->remaining = 1;
	/* Fresh memory numbers from every worker that is up. */
	for (int i = 0; i < sv.ndevices; i++) {
		struct sv_device *d = &sv.devices[i];
		if (d->ctl && d->state == RD_STATE_READY &&
		    rd_conn_call(d->ctl, "io.regen.Worker.Stats", NULL, false, on_stats_reply, g) == 0)
			g->remaining++;
	}
	if (--g->remaining == 0) {
		status_gathered(call);
		free(g);
	}
}

static void method_generation(struct rd_call *call)
{
	static const struct rp_field fields[] = { { NULL } };

	if (check_fields(call, fields))
		rd_call_reply(call, status_json(-1), false);
}

static void method_watch(struct rd_call *call)
{
	static const struct rp_field fields[] = { { NULL } };
	struct rp_error err = { 0 };
	struct sv_watcher *w;

	if (!check_fields(call, fields))
		return;
	w = calloc(1, sizeof(*w));
	if (!w) {
		rd_call_fail(call, (rp_error_set(&err, RP_ERR_OUT_OF_MEMORY, "no memory for a watcher"),
				    rp_error_add_int(&err, "device", -1), &err));
		return;
	}
	w->call = call;
	w->next = sv.watchers;
	sv.watchers = w;
	for (int i = 0; i < sv.ndevices; i++) {
		cJSON *ev = watch_event_json(&sv.devices[i]);
		cJSON_ReplaceItemInObject(ev, "reason", cJSON_CreateString("subscribed"));
		rd_call_reply(call, ev, true);
	}
}

static void lifecycle_method(struct rd_call *call, enum sv_verb verb)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, false },
		{ "reason", RP_T_STRING, false },
		{ "deadline_ms", RP_T_INT, false },
		{ NULL },
	};
	static const struct rp_field fields_no_deadline[] = {
		{ "device", RP_T_INT, false },
		{ "reason", RP_T_STRING, false },
		{ NULL },
	};
	struct rp_error err = { 0 };
	struct sv_request *req;
	const char *reason = NULL;
	uint64_t deadline;
	char reason_buf[128];
	int device;

	if (!check_fields(call, verb == SV_RESTART ? fields : fields_no_deadline) || parse_device_param(call, &device) < 0)
		return;
	if (rp_params_string(call->msg.params, "reason", 120, NULL, &reason, &err) < 0 ||
	    rp_params_uint(call->msg.params, "deadline_ms", 3600000, sv.opts->drain_deadline_ms, &deadline, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	if (sv.stopping) {
		rp_error_set(&err, RP_ERR_DRAINING, "regend is shutting down");
		rp_error_add_int(&err, "device", device);
		rp_error_add_int(&err, "generation", device >= 0 ? (long long)sv.devices[device].generation : 0);
		rd_call_fail(call, &err);
		return;
	}
	snprintf(reason_buf, sizeof(reason_buf), "%s by pid %d%s%s", verb_names[verb], (int)call->conn->peer.pid,
		 reason ? ": " : "", reason ? reason : "");
	req = calloc(1, sizeof(*req));
	if (!req) {
		rp_error_set(&err, RP_ERR_OUT_OF_MEMORY, "no memory for the request");
		rp_error_add_int(&err, "device", device);
		rd_call_fail(call, &err);
		return;
	}
	req->call = call;
	req->verb = verb;
	req->start_ns = uv_hrtime();
	req->remaining = device < 0 ? (unsigned)sv.ndevices : 1;
	rd_info("lifecycle", device, 0, call->conn->peer.pid, "%s requested", reason_buf);
	for (int i = 0; i < sv.ndevices; i++)
		if (device < 0 || device == i)
			op_enqueue(&sv.devices[i], verb, reason_buf, (unsigned)deadline, req);
}

static void method_release(struct rd_call *call) { lifecycle_method(call, SV_RELEASE); }
static void method_reset(struct rd_call *call) { lifecycle_method(call, SV_RESET); }
static void method_restart(struct rd_call *call) { lifecycle_method(call, SV_RESTART); }

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
		{ NULL },
	};
	static const char *const kinds[] = { "crash", "device_lost", "hang", NULL };
	struct rp_error err = { 0 };
	int device, kind;

	if (!check_fields(call, fields) || parse_device_param(call, &device) < 0)
		return;
	if (rp_params_enum(call->msg.params, "kind", kinds, -1, &kind, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	if (!sv.opts->fault_injection) {
		rd_call_failf(call, RP_ERR_FAULT_INJECTION_DISABLED,
			      "regend was started without --enable-fault-injection");
		return;
	}
	struct sv_device *d = &sv.devices[device];
	if (!d->ctl || d->state != RD_STATE_READY) {
		struct rp_error e = { 0 };
		rp_error_set(&e, RP_ERR_DRAINING, "device %d is %s; try again when it is ready", device,
			     rd_state_name(d->state));
		rp_error_add_int(&e, "device", device);
		rp_error_add_int(&e, "generation", (long long)d->generation);
		rd_call_fail(call, &e);
		return;
	}
	cJSON *params = cJSON_CreateObject();
	cJSON_AddStringToObject(params, "kind", kinds[kind]);
	rd_warn("lifecycle", device, d->generation, call->conn->peer.pid, "injecting fault: %s", kinds[kind]);
	if (rd_conn_call(d->ctl, "io.regen.Worker.InjectFault", params, false, on_inject_reply, call) < 0) {
		rp_error_set(&err, RP_ERR_BACKEND, "the control channel to device %d's worker is gone", device);
		rp_error_add_int(&err, "device", device);
		rd_call_fail(call, &err);
	}
}

/* Memory and Compute belong on the worker's socket: say where. */
static void method_wrong_endpoint(struct rd_call *call)
{
	struct rp_error err = { 0 };
	cJSON *dev = cJSON_GetObjectItemCaseSensitive(call->msg.params, "device");
	int index = cJSON_IsNumber(dev) && dev->valuedouble >= 0 && dev->valuedouble < sv.ndevices ? (int)dev->valuedouble : 0;

	rp_error_set(&err, RP_ERR_WRONG_ENDPOINT, "%s is served on the device's worker socket %s, not here",
		     call->msg.method, sv.devices[index].worker_socket);
	rp_error_add_str(&err, "method", call->msg.method);
	rp_error_add_str(&err, "socket", sv.devices[index].worker_socket);
	rd_call_fail(call, &err);
}

static const struct rd_method main_methods[] = {
	{ "io.regen.Device.Status", method_status },
	{ "io.regen.Device.Generation", method_generation },
	{ "io.regen.Device.Watch", method_watch, false, true },
	{ "io.regen.Device.Release", method_release, true },
	{ "io.regen.Device.Reset", method_reset, true },
	{ "io.regen.Device.Restart", method_restart, true },
	{ "io.regen.Device.InjectFault", method_inject_fault, true },
	{ "io.regen.Memory.ImportBuffer", method_wrong_endpoint },
	{ "io.regen.Memory.CloseBuffer", method_wrong_endpoint },
	{ "io.regen.Memory.ImportEvent", method_wrong_endpoint },
	{ "io.regen.Memory.CloseEvent", method_wrong_endpoint },
	{ "io.regen.Compute.Gemm", method_wrong_endpoint },
	{ "io.regen.Compute.Attention", method_wrong_endpoint },
	{ "io.regen.Compute.AttentionBackward", method_wrong_endpoint },
	{ NULL },
};
static const char *const main_interfaces[] = { "io.regen", "io.regen.Device", NULL };
static const struct rd_endpoint main_endpoint = { main_methods, main_interfaces };

static void main_on_call(struct rd_conn *conn, struct rd_call *call)
{
	rd_trace("conn", -1, 0, conn->peer.pid, "call %s", call->msg.method);
	rd_dispatch(&main_endpoint, call);
}

static void main_on_close(struct rd_conn *conn)
{
	struct sv_watcher **w = &sv.watchers;

	while (*w) {
		if ((*w)->call->conn == conn) {
			struct sv_watcher *gone = *w;
			*w = gone->next;
			rd_call_reply(gone->call, NULL, false);
			free(gone);
		} else {
			w = &(*w)->next;
		}
	}
	for (struct rd_conn **c = &sv.conns; *c; c = &(*c)->next) {
		if (*c == conn) {
			*c = conn->next;
			break;
		}
	}
	rd_debug("conn", -1, 0, conn->peer.pid, "client gone");
}

static const struct rd_conn_ops main_ops = { main_on_call, main_on_close };

static void on_accept(int fd, void *data)
{
	struct rd_conn *conn;
	unsigned same_uid = 0;

	if (rd_conn_new(sv.loop, fd, &main_ops, NULL, &conn) < 0)
		return;
	for (struct rd_conn *c = sv.conns; c; c = c->next)
		same_uid += c->peer.uid == conn->peer.uid;
	conn->admin = rd_peer_is_admin(&conn->peer, sv.opts->admin_gid, sv.opts->have_admin_gid);
	conn->next = sv.conns;
	sv.conns = conn;
	if (same_uid >= sv.opts->max_connections) {
		rd_warn("conn", -1, 0, conn->peer.pid, "refusing connection: uid %u has %u open", (unsigned)conn->peer.uid,
			same_uid);
		rd_conn_refuse(conn, "connections", sv.opts->max_connections);
		return;
	}
	rd_debug("conn", -1, 0, conn->peer.pid, "client connected (uid %u%s)", (unsigned)conn->peer.uid,
		 conn->admin ? ", admin" : "");
}

/* ---- Start and stop ---- */

static void on_stop_deadline(uv_timer_t *t)
{
	for (int i = 0; i < sv.ndevices; i++)
		if (sv.devices[i].proc_alive)
			kill_worker(&sv.devices[i], "still running after the drain deadline at shutdown");
	uv_close((uv_handle_t *)t, NULL);
}

static void on_stop_signal(uv_signal_t *sig, int signum)
{
	if (sv.stopping)
		return;
	sv.stopping = true;
	rd_info("supervisor", -1, 0, 0, "signal %d: stopping", signum);
	rd_notify_stopping();
	rd_listener_close(&sv.listener);
	/* Every call still waiting gets its answer before the connections go. */
	for (int i = 0; i < sv.ndevices; i++) {
		struct sv_device *d = &sv.devices[i];
		struct sv_op *op;
		while ((op = d->ops)) {
			d->ops = op->next;
			if (op->request)
				request_finish_one(op->request, d, "regend is stopping");
			free(op);
		}
	}
	while (sv.watchers) {
		struct sv_watcher *w = sv.watchers;
		struct rp_error err = { 0 };
		sv.watchers = w->next;
		rp_error_set(&err, RP_ERR_DRAINING, "regend is stopping");
		rp_error_add_int(&err, "device", -1);
		rp_error_add_int(&err, "generation", 0);
		rd_call_fail(w->call, &err);
		free(w);
	}
	for (struct rd_conn *c = sv.conns, *next; c; c = next) {
		next = c->next;
		rd_conn_close(c);
	}
	for (int i = 0; i < sv.ndevices; i++) {
		struct sv_device *d = &sv.devices[i];
		uv_timer_stop(&d->timer);
		uv_close((uv_handle_t *)&d->timer, NULL);
		uv_timer_stop(&d->respawn_timer);
		uv_close((uv_handle_t *)&d->respawn_timer, NULL);
		/* The worker drains on SIGTERM and exits. */
		if (d->proc_alive)
			uv_process_kill(d->proc, SIGTERM);
	}
	uv_close((uv_handle_t *)&sv.sigterm, NULL);
	uv_close((uv_handle_t *)&sv.sigint, NULL);
	uv_close((uv_handle_t *)&sv.sighup, NULL);
	rd_notify_close();
	/* A worker hung in a kernel never finishes its drain: it gets the
	 * drain deadline and a grace period, then SIGKILL. */
	uv_timer_init(sv.loop, &sv.stop_timer);
	uv_timer_start(&sv.stop_timer, on_stop_deadline, (uint64_t)sv.opts->drain_deadline_ms + DRAIN_GRACE_MS, 0);
	uv_unref((uv_handle_t *)&sv.stop_timer);
}

/* Applies what can change while serving; the rest waits for a restart. */
static void on_sighup(uv_signal_t *sig, int signum)
{
	struct rd_options fresh;
	struct rd_options *live = &sv.opts_live;
	char restart_only[256];

	if (rd_options_load(&fresh, sv.argc, sv.argv) != 0) {
		rd_warn("supervisor", -1, 0, 0, "SIGHUP: configuration has errors; keeping the running one");
		return;
	}
	rd_options_reload(live, &fresh, restart_only, sizeof(restart_only));
	rd_log_set_default_level(live->log_level);
	/* Admin rights are decided per connection, at accept: re-decide. */
	for (struct rd_conn *c = sv.conns; c; c = c->next)
		c->admin = rd_peer_is_admin(&c->peer, live->admin_gid, live->have_admin_gid);
	if (restart_only[0])
		rd_warn("supervisor", -1, 0, 0, "SIGHUP: %s change only with a restart of regend", restart_only);
	rd_info("supervisor", -1, 0, 0, "SIGHUP: reloaded %s (log level %d, drain deadline %u ms, admin group '%s')",
		fresh.config_path[0] ? fresh.config_path : "(no file)", live->log_level, live->drain_deadline_ms,
		live->admin_group);
}

static int count_devices(const struct rd_options *opts, const char **backend)
{
	*backend = opts->backend;
	if (strcmp(opts->backend, "auto") == 0) {
#if REGEN_HAVE_CUDA
		*backend = access("/dev/nvidiactl", F_OK) == 0 ? "cuda" : "host";
#else
		*backend = "host";
#endif
	}
	if (opts->devices > 0)
		return opts->devices;
	if (strcmp(*backend, "host") == 0)
		return 1;
	/* Without touching CUDA in this process: count the device nodes. */
	int n = 0;
	for (int i = 0; i < RD_DEVICES_MAX; i++) {
		char path[32];
		snprintf(path, sizeof(path), "/dev/nvidia%d", i);
		if (access(path, F_OK) == 0)
			n++;
	}
	return n ? n : 1;
}

int rd_supervisor_run(const struct rd_options *opts, int listen_fd, int argc, char **argv)
{
	const char *backend;
	ssize_t len;
	int r;

	memset(&sv, 0, sizeof(sv));
	sv.opts_live = *opts;
	sv.opts = &sv.opts_live;
	opts = sv.opts;
	sv.argc = argc;
	sv.argv = argv;
	sv.loop = uv_default_loop();
	sv.epoch = 1;
	len = readlink("/proc/self/exe", sv.exe, sizeof(sv.exe) - 1);
	if (len <= 0) {
		rd_err("supervisor", -1, 0, 0, "cannot find my own executable: %s", strerror(errno));
		return 1;
	}
	sv.exe[len] = '\0';
	signal(SIGPIPE, SIG_IGN);

	sv.ndevices = count_devices(opts, &backend);
#if !REGEN_HAVE_CUDA
	if (strcmp(backend, "cuda") == 0) {
		rd_err("supervisor", -1, 0, 0, "this regend was built without CUDA; use --backend host");
		return 1;
	}
#endif
	r = rd_listener_open(&sv.listener, sv.loop, opts->socket_path, opts->socket_mode, opts->have_socket_gid ? opts->socket_gid : (gid_t)-1,
			     listen_fd, on_accept, NULL);
	if (r < 0) {
		rd_err("supervisor", -1, 0, 0, "cannot listen on %s: %s", opts->socket_path, strerror(-r));
		return 1;
	}
	rd_info("supervisor", -1, 0, 0, "listening on %s; %d %s device(s)", opts->socket_path, sv.ndevices, backend);

	for (int i = 0; i < sv.ndevices; i++) {
		struct sv_device *d = &sv.devices[i];
		d->index = i;
		d->generation = 1;
		d->state = RD_STATE_RESPAWNING;
		snprintf(d->backend, sizeof(d->backend), "%s", backend);
		snprintf(d->reason, sizeof(d->reason), "started");
		rd_worker_socket_path(opts, i, d->worker_socket, sizeof(d->worker_socket));
		uv_timer_init(sv.loop, &d->timer);
		d->timer.data = d;
		uv_timer_init(sv.loop, &d->respawn_timer);
		d->respawn_timer.data = d;
		spawn_worker(d);
	}
	uv_signal_init(sv.loop, &sv.sigterm);
	uv_signal_start(&sv.sigterm, on_stop_signal, SIGTERM);
	uv_signal_init(sv.loop, &sv.sigint);
	uv_signal_start(&sv.sigint, on_stop_signal, SIGINT);
	uv_signal_init(sv.loop, &sv.sighup);
	uv_signal_start(&sv.sighup, on_sighup, SIGHUP);
	rd_notify_watchdog_start(sv.loop);

	uv_run(sv.loop, UV_RUN_DEFAULT);
	rd_info("supervisor", -1, 0, 0, "stopped");
	return 0;
}
