/* SPDX-License-Identifier: Apache-2.0 */
/* The worker process: opens its device's backend, serves its socket, hands
 * completions and faults from backend threads to the loop, and stops. */
#include "regen-config.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/backend/health.h"
#include "daemon/backend/load.h"
#include "daemon/log.h"
#include "daemon/socket_dir.h"
#include "daemon/worker/session.h"
#include "daemon/worker/worker.h"
#include "proto/errors.h"

uint64_t rd_worker_generation(const struct rd_worker *w)
{
	return atomic_load(&w->dev.generation);
}

/* ---- Completions and faults from backend threads ---- */

static struct rd_worker *worker_of_device(struct rd_device *dev)
{
	return dev->core;
}

/* Any thread. The op's own answer (a ring record's completion) goes out
 * under the lock that queues its done: whoever saw that answer and then
 * asks the loop (rd_worker_finish_posted) finds the op queued. */
static void post_completion(struct rd_device *dev, struct rd_op *op)
{
	struct rd_worker *w = worker_of_device(dev);

	pthread_mutex_lock(&w->lock);
	if (op->completed)
		op->completed(op);
	op->next = NULL;
	if (w->done_tail)
		w->done_tail->next = op;
	else
		w->done_head = op;
	w->done_tail = op;
	pthread_mutex_unlock(&w->lock);
	uv_async_send(&w->wakeup);
}

/* Any thread: a Varlink call with a signal_event whose work is enqueued. */
void rd_compute_post_launched(struct rd_op *op)
{
	struct rd_worker *w = worker_of_device(op->lane->device);

	pthread_mutex_lock(&w->lock);
	op->launched_next = NULL;
	if (w->launched_tail)
		w->launched_tail->launched_next = op;
	else
		w->launched_head = op;
	w->launched_tail = op;
	pthread_mutex_unlock(&w->lock);
	uv_async_send(&w->wakeup);
}

/* Any thread: the backend found the context lost or the GPU failed, or the
 * core a hung call. Reported once until a reset, except that a failed GPU
 * is told even after a loss was: it changes what the supervisor does. */
static void fault(struct rd_worker *w, enum rd_fault_kind kind, const char *reason, int64_t uid)
{
	bool worse;

	pthread_mutex_lock(&w->lock);
	worse = kind == RD_FAULT_FAILED && (w->fault_pending ? w->fault_kind : w->reported_kind) != RD_FAULT_FAILED;
	if ((!w->fault_pending && !w->fault_reported) || worse) {
		snprintf(w->fault_reason, sizeof(w->fault_reason), "%s", reason);
		w->fault_kind = kind;
		w->fault_uid = uid;
		w->fault_pending = true;
	}
	pthread_mutex_unlock(&w->lock);
	uv_async_send(&w->wakeup);
}

static void on_fault(struct rd_device *dev, enum rd_fault_kind kind, const char *reason)
{
	fault(worker_of_device(dev), kind, reason, -1);
}

void rd_worker_fault(struct rd_worker *w, enum rd_fault_kind kind, const char *reason)
{
	fault(w, kind, reason, -1);
}

void rd_worker_fault_hung(struct rd_worker *w, const char *reason, int64_t uid)
{
	fault(w, RD_FAULT_HUNG, reason, uid);
}

void rd_worker_finish_posted(struct rd_worker *w)
{
	struct rd_op *op, *launched;

	pthread_mutex_lock(&w->lock);
	op = w->done_head;
	w->done_head = w->done_tail = NULL;
	launched = w->launched_head;
	w->launched_head = w->launched_tail = NULL;
	pthread_mutex_unlock(&w->lock);
	/* An op launched and done in one wake-up is answered before its done
	 * frees it: a launch is always posted before its completion. */
	while (launched) {
		struct rd_op *next = launched->launched_next;
		rd_compute_launched(launched);
		launched = next;
	}
	while (op) {
		struct rd_op *next = op->next;
		op->done(op);
		op = next;
	}
}

static void on_wakeup(uv_async_t *a)
{
	struct rd_worker *w = a->data;
	char reason[sizeof(w->fault_reason)];
	enum rd_fault_kind kind = RD_FAULT_LOST;
	int64_t uid = -1;
	bool faulted = false;

	pthread_mutex_lock(&w->lock);
	if (w->fault_pending) {
		w->fault_pending = false;
		w->fault_reported = true;
		w->reported_kind = kind = w->fault_kind;
		uid = w->fault_uid;
		faulted = true;
		snprintf(reason, sizeof(reason), "%s", w->fault_reason);
	}
	pthread_mutex_unlock(&w->lock);

	if (faulted) {
		/* New work fails fast until the supervisor resets us. */
		if (w->state == RD_WORKER_READY || w->state == RD_WORKER_DRAINING)
			w->state = RD_WORKER_LOST;
		rd_err("worker", w->dev.index, rd_worker_generation(w), 0, "device fault (%s): %s", rd_fault_kind_name(kind),
		       reason);
		rd_control_report_fault(w, kind, reason, uid);
	}
	rd_worker_finish_posted(w);
}

int rd_worker_refuse_if_not_ready(struct rd_worker *w, struct rp_error *err)
{
	long long gen = (long long)rd_worker_generation(w);

	switch (w->state) {
	case RD_WORKER_READY:
		return 0;
	case RD_WORKER_LOST:
		rp_err_device_lost(err, w->dev.index, gen, "device %d faulted (%s); wait for the next generation",
				   w->dev.index, w->fault_reason);
		break;
	case RD_WORKER_DRAINING:
	case RD_WORKER_STOPPING:
		rp_err_draining(err, w->dev.index, gen, "device %d is draining for a lifecycle change; retry after it",
				w->dev.index);
		break;
	}
	return -EAGAIN;
}

/* ---- Stop ---- */

static void maybe_stop(struct rd_worker *w)
{
	if (w->state != RD_WORKER_STOPPING || w->in_flight)
		return;
	/* The last replies wait for the end of this loop iteration, which a
	 * stopped loop does not reach: out with them now. */
	for (struct rd_session *s = w->sessions; s; s = s->next)
		rd_conn_flush(s->conn);
	uv_stop(w->loop);
}

void rd_worker_call_finished(struct rd_worker *w)
{
	rd_control_maybe_finish_drain(w);
	maybe_stop(w);
}

static void on_stop_deadline(uv_timer_t *t)
{
	struct rd_worker *w = t->data;
	struct rp_error err = { 0 };

	rd_warn("worker", w->dev.index, rd_worker_generation(w), 0, "stopping with %u call(s) still in flight: failing them",
		w->in_flight);
	rp_err_draining(&err, w->dev.index, (long long)rd_worker_generation(w),
			"regend is stopping and the call did not finish within the drain deadline; it may or may not have run");
	for (struct rd_session *s = w->sessions; s; s = s->next) {
		rd_ring_fail_unfinished(s->ring, &err);
		rd_conn_fail_unfinished(s->conn, &err, 200);
	}
	rp_error_clear(&err);
	/* The calls still run on backend threads: leave without unwinding. */
	_exit(0);
}

void rd_worker_begin_stop(struct rd_worker *w, const char *why)
{
	if (w->state == RD_WORKER_STOPPING)
		return;
	rd_info("worker", w->dev.index, rd_worker_generation(w), 0, "stopping: %s", why);
	w->state = RD_WORKER_STOPPING;
	rd_listener_close(&w->listener);
	rd_comm_abort_busy(w, "regend is stopping");
	uv_timer_start(&w->stop_timer, on_stop_deadline, w->opts->drain_deadline_ms + 1000, 0);
	maybe_stop(w);
}

static void on_sigterm(uv_signal_t *s, int signum)
{
	rd_worker_begin_stop(s->data, "SIGTERM");
}

static void walk_close(uv_handle_t *h, void *arg)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

/* ---- Start ---- */

int rd_worker_run(const struct rd_options *opts)
{
	static struct rd_worker worker;
	static struct rd_options own_opts;
	struct rd_worker *w = &worker;
	struct rp_error err = { 0 };
	int r;

	const uint64_t t_start = uv_hrtime();
	uint64_t t_loaded, t_opened, t_programs;

	memset(w, 0, sizeof(*w));
	own_opts = *opts;
	w->opts = &own_opts;
	opts = w->opts;
	w->epoch = opts->worker_epoch;
	if (rd_hang_charges_parse(&w->hang_charges, opts->worker_charged, uv_hrtime()) < 0)
		rd_warn("worker", opts->worker_device, 0, 0, "--charged '%s' is not a list of charges: none taken",
			opts->worker_charged);
	w->loop = uv_default_loop();
	signal(SIGPIPE, SIG_IGN);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	pthread_mutex_init(&w->lock, NULL);

	w->dev.index = opts->worker_device;
	atomic_init(&w->dev.generation, opts->worker_generation ? opts->worker_generation : 1);
	rd_registry_init(&w->dev.registry, w->dev.index);
	w->dev.on_fault = on_fault;
	w->dev.post_completion = post_completion;
	w->dev.core = w;
	w->dev.max_scratch = opts->max_scratch_mib << 20;
	w->dev.call_deadline_ms = opts->call_deadline_ms;
	w->dev.gemm_plans_max = opts->gemm_plans_max;
	_Static_assert(sizeof(w->dev.rtc_cache_dir) == sizeof(opts->rtc_cache_dir), "rtc_cache_dir's size");
	memcpy(w->dev.rtc_cache_dir, opts->rtc_cache_dir, sizeof(w->dev.rtc_cache_dir));
	w->dev.options = opts;
	uv_async_init(w->loop, &w->wakeup, on_wakeup);
	w->wakeup.data = w;
	uv_timer_init(w->loop, &w->drain_timer);
	uv_timer_init(w->loop, &w->stop_timer);
	w->stop_timer.data = w;
	uv_signal_init(w->loop, &w->sigterm);
	w->sigterm.data = w;
	uv_signal_start(&w->sigterm, on_sigterm, SIGTERM);

	char why[512];
	/* The channel first: a backend that cannot be loaded is told to the
	 * supervisor, in words Status shows. */
	if (rd_control_open(w, opts->ctl_fd) < 0) {
		rd_err("worker", w->dev.index, rd_worker_generation(w), 0, "no control channel");
		return 1;
	}
	if (rd_backend_load(&w->dev, opts->backend, why, sizeof(why)) < 0) {
		rd_err("worker", w->dev.index, rd_worker_generation(w), 0, "cannot serve: %s", why);
		rd_control_cannot_serve(w, "unsupported", why);
		return RD_WORKER_EXIT_UNSUPPORTED;
	}
	t_loaded = uv_hrtime();
	rd_objects_init(&w->objects, &w->dev);
	w->objects.keep = rd_comm_keep_detached;
	w->objects.keep_data = w;
	rd_health_init(w);
	rd_orphan_init(w);

	r = w->dev.backend->open(&w->dev, &err);
	if (r < 0) {
		cJSON *m = err.params ? cJSON_GetObjectItem(err.params, "message") : NULL;
		snprintf(why, sizeof(why), "%s", cJSON_IsString(m) ? m->valuestring : strerror(-r));
		rd_err("worker", w->dev.index, rd_worker_generation(w), 0, "cannot open the %s backend: %s",
		       w->dev.backend->name, why);
		/* -ENOTSUP: the backend says the node's software cannot drive
		 * the device (backend.h); a device lost or not there is a
		 * failed GPU; anything else a start that failed, tried again. */
		bool unusable = err.name && (strcmp(err.name, RP_ERR_DEVICE_LOST) == 0 ||
					     strcmp(err.name, RP_ERR_NO_SUCH_DEVICE) == 0);
		rp_error_clear(&err);
		if (r == -ENOTSUP) {
			rd_control_cannot_serve(w, "unsupported", why);
			return RD_WORKER_EXIT_UNSUPPORTED;
		}
		if (unusable) {
			rd_control_cannot_serve(w, "failed", why);
			return RD_WORKER_EXIT_DEVICE_FAILED;
		}
		return 1;
	}
	t_opened = uv_hrtime();
	/* The programs of earlier workers, back before anyone can ask. */
	rd_program_keep_start(w, opts->programs_fd);
	t_programs = uv_hrtime();
	rd_worker_socket_path(opts, w->dev.index, w->socket_path, sizeof(w->socket_path));
	int dir = rd_socket_dir_open(w->socket_path, why, sizeof(why));
	if (dir < 0) {
		rd_err("worker", w->dev.index, rd_worker_generation(w), 0, "refusing to serve: %s", why);
		return 1;
	}
	r = rd_listener_open(&w->listener, w->loop, dir, w->socket_path, opts->socket_mode,
			     opts->have_socket_gid ? opts->socket_gid : (gid_t)-1, -1, rd_session_accept, w);
	close(dir);
	if (r < 0) {
		rd_err("worker", w->dev.index, rd_worker_generation(w), 0, "cannot listen on %s: %s", w->socket_path,
		       strerror(-r));
		return 1;
	}
	rd_control_ready(w);
	rd_health_start(w);
	/* What a respawn costs a rank, by phase. */
	rd_info("worker", w->dev.index, rd_worker_generation(w), 0,
		"serving on %s, %.0f ms after its start: backend loaded in %.0f ms, opened in %.0f ms, "
		"kept programs defined in %.0f ms", w->socket_path, (double)(uv_hrtime() - t_start) / 1e6,
		(double)(t_loaded - t_start) / 1e6, (double)(t_opened - t_loaded) / 1e6,
		(double)(t_programs - t_opened) / 1e6);

	uv_run(w->loop, UV_RUN_DEFAULT);

	rd_listener_close(&w->listener);
	rd_health_stop(w);
	rd_orphan_stop(w);
	rd_program_keep_stop(w);
	w->dev.backend->close(&w->dev);
	uv_walk(w->loop, walk_close, NULL);
	uv_run(w->loop, UV_RUN_DEFAULT);
	return 0;
}
