/* SPDX-License-Identifier: Apache-2.0 */
/* regend's two endpoints in the fuzzing process, on one libuv loop, each
 * reached over a socketpair through its real accept function:
 *
 * - a worker (struct rd_worker set up as rd_worker_run does, less the
 *   control channel, the listener and the signals) on the stub backend,
 *   with a connection accepted by rd_session_accept: the worker's own
 *   method table, memory.c, compute.c, objects.c;
 * - the supervisor's main socket (struct rd_supervisor set up as
 *   rd_supervisor_run does, less the listener and the signals) with two
 *   devices whose workers fuzz_worker_process.c plays as healthy ones, and
 *   a connection accepted by rd_sv_session_accept, made admin: methods.c,
 *   watch.c, device.c.
 *
 * Between inputs everything is torn down and checked: every handle closed,
 * every object, lane and fd returned. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "fuzz_daemon.h"
#include "daemon/supervisor/methods.h"
#include "daemon/supervisor/session.h"
#include "daemon/supervisor/supervisor.h"
#include "daemon/worker/session.h"
#include "daemon/worker/worker.h"

#define MAIN_DEVICES 2

static uv_loop_t loop;
static bool loop_ready;
static enum fz_endpoint running = FZ_NONE;
static struct rd_options worker_opts;
static struct rd_worker worker;

/* The supervisor's end of the worker's control channel: the harness sends
 * its lifecycle verbs there, one at a time, as device.c would. */
static struct {
	struct fz_client end;
	unsigned queued;                /* lifecycles asked for and not begun */
	bool reset;                     /* of the one running: Reset, else Release */
	enum { CTL_IDLE, CTL_DRAINING, CTL_APPLYING } step;
	uint64_t generation;            /* the worker's when the verb was sent */
	unsigned done;
} ctl;
static struct rd_supervisor supervisor;

unsigned fz_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	FZ_CHECK(d != NULL, "cannot read /proc/self/fd");
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static int memfd = -1;

void fz_inproc_init(void)
{
	if (loop_ready)
		return;
	FZ_CHECK(uv_loop_init(&loop) == 0, "uv_loop_init");
	memfd = memfd_create("fuzz", MFD_CLOEXEC);
	FZ_CHECK(memfd >= 0 && ftruncate(memfd, 4096) == 0, "memfd: %s", strerror(errno));
	rd_options_defaults(&worker_opts);
	snprintf(worker_opts.socket_path, sizeof(worker_opts.socket_path), "/run/regen/fuzz.sock");
	loop_ready = true;
}

/* ---- The worker ---- */

static void on_fault_posted(uv_async_t *a)
{
	FZ_CHECK(false, "the in-process worker posted a fault or a completion through its async");
}

static void worker_start(void)
{
	struct rd_worker *w = &worker;

	memset(w, 0, sizeof(*w));
	w->opts = &worker_opts;
	w->epoch = 1;
	w->loop = &loop;
	pthread_mutex_init(&w->lock, NULL);
	fz_device_init(&w->dev);
	w->dev.core = w;
	rd_objects_init(&w->objects, &w->dev);
	/* Ids the bytes can name: b0.1.1, b0.1.2, ... */
	w->objects.next_serial = 1;
	uv_timer_init(&loop, &w->drain_timer);
	w->drain_timer.data = w;
	uv_timer_init(&loop, &w->stop_timer);
	w->stop_timer.data = w;
	rd_health_init(w);
	/* Faults come only from a backend (the stub has none) or a call past
	 * its deadline (every stub call ends at the next pump, before the
	 * loop runs its timers again). */
	uv_async_init(&loop, &w->wakeup, on_fault_posted);
	w->wakeup.data = w;
	rd_worker_socket_path(&worker_opts, 0, w->socket_path, sizeof(w->socket_path));
	w->state = RD_WORKER_READY;

	int pair[2];
	FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0, "socketpair: %s",
		 strerror(errno));
	FZ_CHECK(rd_control_open(w, pair[0]) == 0, "rd_control_open");
	memset(&ctl, 0, sizeof(ctl));
	ctl.end.fd = pair[1];
}

void fz_inproc_worker_lifecycle(bool reset)
{
	FZ_CHECK(running == FZ_WORKER, "no worker in process");
	ctl.queued += 1;
	ctl.reset |= reset && ctl.step == CTL_IDLE;
}

bool fz_inproc_worker_idle(void)
{
	return ctl.step == CTL_IDLE && ctl.queued == 0;
}

static void ctl_send(const char *method, cJSON *params)
{
	char *text = rp_build_call(method, params, false, false);

	cJSON_Delete(params);
	FZ_CHECK(text && fz_client_send(ctl.end.fd, text, strlen(text) + 1, 0, false) == strlen(text) + 1,
		 "the control call did not go out whole");
	free(text);
}

/* What a worker answers the supervisor: Drain says drained (the stub
 * finishes every call), Release and Reset move it to the generation asked
 * for, with every object closed. */
static void on_ctl_reply(const char *text, size_t len, void *data)
{
	struct rd_worker *w = &worker;
	struct rp_call reply;
	cJSON *params;

	fz_check_reply(text, len, &reply, "control channel");
	FZ_CHECK(!reply.error, "the worker refused %s: %.*s", ctl.step == CTL_DRAINING ? "Drain" : "its lifecycle verb",
		 (int)len, text);
	if (ctl.step == CTL_DRAINING) {
		FZ_CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply.params, "drained")) && w->in_flight == 0,
			 "the drain ended with %u calls in flight: %.*s", w->in_flight, (int)len, text);
		FZ_CHECK(w->state == RD_WORKER_DRAINING, "a drained worker in state %d", (int)w->state);
		params = cJSON_CreateObject();
		cJSON_AddNumberToObject(params, "generation", (double)(ctl.generation + 1));
		cJSON_AddNumberToObject(params, "epoch", (double)(w->epoch + 1));
		ctl_send(ctl.reset ? "io.regen.Worker.Reset" : "io.regen.Worker.Release", params);
		ctl.step = CTL_APPLYING;
	} else {
		FZ_CHECK(ctl.step == CTL_APPLYING, "a control reply to no call");
		FZ_CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply.params, "healthy")), "the stub came back unhealthy");
		FZ_CHECK(atomic_load(&w->dev.generation) == ctl.generation + 1 && w->state == RD_WORKER_READY,
			 "after the verb: generation %llu (was %llu), state %d",
			 (unsigned long long)atomic_load(&w->dev.generation), (unsigned long long)ctl.generation,
			 (int)w->state);
		/* Calls the client sent before the verb may have run since, in
		 * the new generation: only objects of an older one are wrong. */
		for (unsigned b = 0; b < RD_OBJECT_BUCKETS; b++)
			for (struct rd_object *o = w->objects.table[b]; o; o = o->next_in_table)
				FZ_CHECK(o->id.generation == ctl.generation + 1,
					 "object %c%u.%llu.%llu left across a generation (now %llu)", o->id.kind, o->id.device,
					 (unsigned long long)o->id.generation, (unsigned long long)o->id.serial,
					 (unsigned long long)(ctl.generation + 1));
		ctl.step = CTL_IDLE;
		ctl.done++;
	}
	rp_call_finish(&reply);
}

static bool ctl_pump(void)
{
	bool progress = fz_client_read(&ctl.end, on_ctl_reply, NULL) > 0;

	if (ctl.step == CTL_IDLE && ctl.queued) {
		cJSON *params = cJSON_CreateObject();
		ctl.queued--;
		ctl.generation = atomic_load(&worker.dev.generation);
		cJSON_AddNumberToObject(params, "deadline_ms", 3600000);
		ctl_send("io.regen.Worker.Drain", params);
		ctl.step = CTL_DRAINING;
		progress = true;
	}
	return progress;
}

struct rd_worker *fz_inproc_worker(void)
{
	FZ_CHECK(running == FZ_WORKER, "no worker in process");
	return &worker;
}

static bool worker_gone(void)
{
	return worker.sessions == NULL && worker.nsessions == 0;
}

static void worker_finish(void)
{
	struct rd_worker *w = &worker;

	/* The supervisor's end closes: the worker begins to stop. */
	FZ_CHECK(ctl.step == CTL_IDLE && ctl.queued == 0, "a lifecycle verb never finished");
	fz_client_finish(&ctl.end);
	for (unsigned rounds = 0; w->ctl && rounds < 1000; rounds++)
		uv_run(&loop, UV_RUN_NOWAIT);
	FZ_CHECK(w->ctl == NULL && w->state == RD_WORKER_STOPPING, "the worker did not see its supervisor go");

	FZ_CHECK(w->in_flight == 0, "%u calls still in flight at the end", w->in_flight);
	FZ_CHECK(w->objects.clients == NULL, "clients left after every connection closed");
	FZ_CHECK(w->objects.count[0] == 0 && w->objects.count[1] == 0, "objects left: %u buffers, %u events",
		 w->objects.count[0], w->objects.count[1]);
	FZ_CHECK(fz_backend_stats.buffers_open == 0 && fz_backend_stats.events_open == 0 &&
			 fz_backend_stats.lanes_open == 0 && fz_backend_stats.ops_pending == 0,
		 "the backend still holds %u buffers, %u events, %u lanes, %u ops", fz_backend_stats.buffers_open,
		 fz_backend_stats.events_open, fz_backend_stats.lanes_open, fz_backend_stats.ops_pending);
	rd_health_stop(w);
	uv_close((uv_handle_t *)&w->deadline_timer, NULL);
	uv_close((uv_handle_t *)&w->wakeup, NULL);
	uv_close((uv_handle_t *)&w->drain_timer, NULL);
	uv_close((uv_handle_t *)&w->stop_timer, NULL);
	pthread_mutex_destroy(&w->lock);
}

/* ---- The supervisor's main socket ---- */

/* As supervisor.c's device events, less sd_notify. */
static void main_state_changed(struct rd_sv_device *d, bool bumped, void *data)
{
	struct rd_supervisor *sv = data;

	FZ_CHECK(rp_state_name(d->state) != NULL, "device %d in state %d", d->index, (int)d->state);
	if (bumped) {
		rd_sv_watch_bump(&sv->watch);
		for (int i = 0; i < sv->ndevices; i++)
			rd_sv_device_tell_epoch(&sv->devices[i]);
	}
	rd_sv_watch_announce(&sv->watch, d);
}

static void main_worker_ready(struct rd_sv_device *d, void *data)
{
}

static const struct rd_sv_device_events main_device_events = {
	.state_changed = main_state_changed,
	.worker_ready = main_worker_ready,
	.request_finished = rd_sv_request_finished,
};

static void main_start(void)
{
	struct rd_supervisor *sv = &supervisor;

	memset(sv, 0, sizeof(*sv));
	rd_options_defaults(&sv->opts);
	snprintf(sv->opts.socket_path, sizeof(sv->opts.socket_path), "/run/regen/fuzz.sock");
	sv->opts.fault_injection = true;
	/* The heartbeat runs on real time: as seldom as it may, so that what
	 * the bytes do does not depend on how fast this machine is. */
	sv->opts.heartbeat_ms = 600000;
	sv->loop = &loop;
	snprintf(sv->exe, sizeof(sv->exe), "/nonexistent/regend");
	rd_sv_watch_init(&sv->watch);
	sv->ndevices = MAIN_DEVICES;
	sv->device_env = (struct rd_sv_device_env){
		.loop = &loop,
		.socket_dir = -1,
		.exe = sv->exe,
		.opts = &sv->opts,
		.epoch = &sv->watch.epoch,
		.stopping = &sv->stopping,
		.events = &main_device_events,
		.data = sv,
	};
	fz_workers_reset();
	for (int i = 0; i < sv->ndevices; i++) {
		rd_sv_device_init(&sv->devices[i], &sv->device_env, i, "host");
		rd_sv_device_start(&sv->devices[i]);
		fz_worker_ready(fz_worker_of(&sv->devices[i].worker), NULL);
		FZ_CHECK(sv->devices[i].state == RP_STATE_READY, "device %d did not come up", i);
	}
}

/* Healthy workers: a worker sent a signal exits, a new one says Ready,
 * every call on a channel is answered. */
static bool main_autopilot(void)
{
	struct rd_supervisor *sv = &supervisor;
	bool progress = false;

	for (int i = 0; i < sv->ndevices; i++) {
		struct rd_sv_device *d = &sv->devices[i];
		struct fz_worker *fw = fz_worker_of(&d->worker);

		if (fw->running && fw->killed) {
			fz_worker_exit(fw, fw->killed, false);
			progress = true;
		}
		if (!fw->running && uv_is_active((uv_handle_t *)&d->respawn_timer) && !sv->stopping) {
			/* The pause before a respawn is over at once. */
			uv_timer_cb cb = d->respawn_timer.timer_cb;
			uv_timer_stop(&d->respawn_timer);
			cb(&d->respawn_timer);
			progress = true;
		}
		if (fw->running && !fw->ready && !fw->killed) {
			fz_worker_ready(fw, NULL);
			progress = true;
		}
		while (fz_worker_answer_ok(fw))
			progress = true;
	}
	return progress;
}

static bool main_gone(void)
{
	return supervisor.sessions == NULL;
}

static void main_finish(void)
{
	struct rd_supervisor *sv = &supervisor;

	/* What regend does on SIGTERM, less the listener and signals. */
	sv->stopping = true;
	for (int i = 0; i < sv->ndevices; i++)
		rd_sv_device_stop(&sv->devices[i], "regend is stopping");
	rd_sv_watch_end(&sv->watch);
	FZ_CHECK(sv->watch.watchers == NULL, "watchers left after stop");
	for (int i = 0; i < sv->ndevices; i++) {
		struct fz_worker *fw = fz_worker_of(&sv->devices[i].worker);
		fz_worker_exit(fw, SIGTERM, false);
		FZ_CHECK(fw->calls == NULL, "calls left on a closed channel");
	}
	fz_workers_reset();
}

/* ---- Either ---- */

void fz_inproc_start(enum fz_endpoint which)
{
	fz_inproc_init();
	FZ_CHECK(running == FZ_NONE, "two endpoints at once");
	memset(&fz_backend_stats, 0, sizeof(fz_backend_stats));
	fz_backend_outcomes = true;
	if (which == FZ_WORKER)
		worker_start();
	else
		main_start();
	running = which;
}

int fz_inproc_connect(void)
{
	int pair[2];

	FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0, "socketpair: %s",
		 strerror(errno));
	if (running == FZ_WORKER) {
		rd_session_accept(pair[0], &worker);
		FZ_CHECK(worker.sessions && worker.sessions->client, "the worker refused the connection");
	} else {
		rd_sv_session_accept(pair[0], &supervisor);
		FZ_CHECK(supervisor.sessions && !supervisor.sessions->closed, "the supervisor refused the connection");
		/* Whatever uid runs the fuzzer: the admin methods are reached. */
		supervisor.sessions->admin = true;
	}
	return pair[1];
}

bool fz_inproc_pump(void)
{
	bool progress = false;

	uv_run(&loop, UV_RUN_NOWAIT);
	if (running == FZ_WORKER) {
		progress |= fz_backend_complete_all() > 0;
		progress |= ctl_pump();
	}
	else if (running == FZ_MAIN)
		progress |= main_autopilot();
	return progress;
}

void fz_inproc_stop(void)
{
	unsigned rounds;

	/* The client closed its end: the connection sees it, its calls
	 * finish, the session goes. */
	for (rounds = 0; rounds < 10000; rounds++) {
		fz_inproc_pump();
		if (running == FZ_WORKER ? worker_gone() && ctl.step == CTL_IDLE && !ctl.queued : main_gone())
			break;
	}
	FZ_CHECK(rounds < 10000, "the connection outlived its client");
	if (running == FZ_WORKER)
		worker_finish();
	else
		main_finish();
	running = FZ_NONE;
	/* Closing handles finish on the next turn of the loop. */
	uv_run(&loop, UV_RUN_NOWAIT);
	FZ_CHECK(!uv_loop_alive(&loop), "handles left on the loop");
}

/* ---- The client's end ---- */

size_t fz_client_send(int fd, const char *buf, size_t len, unsigned nfds, bool may_be_closed)
{
	int fds[FZ_SEND_FDS_MAX];
	char control[CMSG_SPACE(sizeof(fds))];
	struct iovec iov = { (void *)buf, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (nfds > FZ_SEND_FDS_MAX)
		nfds = FZ_SEND_FDS_MAX;
	if (nfds) {
		struct cmsghdr *cm;
		FZ_CHECK(memfd >= 0, "fz_inproc_init first");
		for (unsigned i = 0; i < nfds; i++)
			FZ_CHECK((fds[i] = dup(memfd)) >= 0, "dup: %s", strerror(errno));
		memset(control, 0, sizeof(control));
		mh.msg_control = control;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	if (n < 0) {
		FZ_CHECK(errno == EAGAIN || errno == EWOULDBLOCK ||
				 (may_be_closed && (errno == EPIPE || errno == ECONNRESET)),
			 "send to the daemon: %s", strerror(errno));
		return 0;
	}
	return (size_t)n;
}

size_t fz_client_read(struct fz_client *c, void (*on_reply)(const char *text, size_t len, void *data), void *data)
{
	size_t total = 0;

	for (;;) {
		char chunk[65536];
		ssize_t n = recv(c->fd, chunk, sizeof(chunk), MSG_DONTWAIT);
		char *nul;

		if (n <= 0) {
			FZ_CHECK(n == 0 || errno == EAGAIN || errno == EWOULDBLOCK, "recv from the daemon: %s",
				 strerror(errno));
			c->eof |= n == 0;
			return total;
		}
		total += (size_t)n;
		if (c->len + (size_t)n > c->cap) {
			c->cap = (c->len + (size_t)n) * 2;
			c->buf = realloc(c->buf, c->cap);
			FZ_CHECK(c->buf != NULL, "out of memory");
		}
		memcpy(c->buf + c->len, chunk, (size_t)n);
		c->len += (size_t)n;
		size_t start = 0;
		while ((nul = memchr(c->buf + start, '\0', c->len - start))) {
			size_t len = (size_t)(nul - (c->buf + start));
			on_reply(c->buf + start, len, data);
			start += len + 1;
		}
		memmove(c->buf, c->buf + start, c->len - start);
		c->len -= start;
	}
}

void fz_client_finish(struct fz_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->buf);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}
