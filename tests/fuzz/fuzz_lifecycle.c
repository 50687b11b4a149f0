/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor's per-device lifecycle state machine
 * (daemon/supervisor/device.c) driven by events decoded from the bytes, on
 * two devices, with the worker processes played by the harness
 * (fuzz_worker_process.c), a clock of its own (uv_hrtime, which device.c
 * reads for the heartbeat, the crash streak and the failure streak, is
 * defined here) and the timers fired when the bytes say.
 *
 * Each step is one byte: its high bit picks the device, its low nibble the
 * event, then arguments:
 *   0 a client's Release, Reset or Restart with a deadline;
 *   1 the oldest control call answered as a healthy worker would;
 *   2 the oldest control call answered otherwise: not drained, not
 *     healthy, an error, or without the fields;
 *   3 the worker says Ready, with or without its health (once per
 *     process, on its channel, unless it was killed);
 *   4 the worker reports a fault: lost, hung or failed (once it said
 *     Ready, unless killed);
 *   5 the worker process exits: a crash, a status, or the status that says
 *     it cannot open its device;
 *   6 the control channel closes under a live worker;
 *   7 the running operation's deadline passes (its timer fires);
 *   8 the respawn pause ends (its timer fires);
 *   9 a worker that was sent a signal dies of it;
 *  10 spawning fails from now on, or works again;
 *  11 the supervisor kills the worker (the stop deadline);
 *  12 the node's epoch is told, or a Status asks for memory numbers;
 *  13 the heartbeat's timer fires;
 *  14 time passes (1 ms to 61 s).
 * After the events a healthy worker plays every device until it rests
 * (without timers or time passing), then regend stops.
 *
 * Invariants: the state is always an io.regen.Device.State; the generation
 * changes only with a transition that says so, by one; a bump enters READY
 * only when a Release or Reset completed, else it enters RESPAWNING or
 * FAILED for a lost worker, once per worker; every request gets exactly one
 * answer, a success only after its device's generation went up; with a
 * healthy worker every request is answered without a timer; no lifecycle
 * operation runs while another does on the same device (at most one Drain,
 * Release or Reset on the channel, and a Release or Reset only right after
 * a Drain said drained); READY only while a worker process runs that said
 * Ready; a respawn pause only with no worker running, and never no worker
 * and none coming; each memory refresh ends once; nothing leaks. */
#include <signal.h>
#include "fuzz_daemon.h"
#include "daemon/log.h"
#include "daemon/supervisor/device.h"

#define DEVICES 2
#define REQUESTS_MAX 64

struct request {
	int device;
	unsigned answers;
	bool ok;
	uint64_t generation;            /* the device's when it was asked */
};

static struct {
	uv_loop_t loop;
	struct rd_options opts;
	uint64_t epoch;
	bool stopping;
	struct rd_sv_device_env env;
	struct rd_sv_device dev[DEVICES];
	struct request req[REQUESTS_MAX];
	unsigned nreq;
	uint64_t generation[DEVICES];   /* as last seen */
	unsigned bumps[DEVICES];
	unsigned lost_bumps[DEVICES];   /* bumps for a lost worker since its device last served */
	bool healthy_reply[DEVICES];    /* this step answered a Release/Reset healthy */
	bool drained_reply[DEVICES];    /* this step answered a Drain drained */
	unsigned refreshes, refreshes_done;
	unsigned step;
	uint64_t now;                   /* the clock device.c reads */
	cJSON *health;                  /* a Health a worker may send */
} S;

/* device.c's clock. libuv's own timers do not read it (their callbacks are
 * called by fire(), never by the loop). */
uint64_t uv_hrtime(void)
{
	return S.now;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	rd_log_init("fuzz", getenv("REGEN_DEBUG") ? getenv("REGEN_DEBUG") : "E");
	FZ_CHECK(uv_loop_init(&S.loop) == 0, "uv_loop_init");
	struct rp_device_health h = {
		.source = "nvml", .detail = "XID 79", .uuid = "GPU-0", .pci_bus_id = "0000:01:00.0", .last_xid = 79,
		.last_xid_unix_ms = 1, .last_xid_text = "fell off the bus", .ecc_dbe_volatile = 1,
		.ecc_dbe_aggregate = 2, .retired_pages_pending = 1, .remap_pending = 0, .remap_failed = -1,
	};
	S.health = rp_device_health_encode(&h);
	return 0;
}

static int index_of(const struct rd_sv_device *d)
{
	FZ_CHECK(d >= S.dev && d < S.dev + DEVICES, "an event from no device of ours");
	return (int)(d - S.dev);
}

static void on_state_changed(struct rd_sv_device *d, bool bumped, void *data)
{
	int i = index_of(d);

	FZ_CHECK(rp_state_name(d->state) != NULL, "device %d entered state %d, no io.regen.Device.State", d->index,
		 (int)d->state);
	FZ_CHECK(d->generation == S.generation[i] + (bumped ? 1 : 0), "device %d went from generation %llu to %llu (%s)",
		 i, (unsigned long long)S.generation[i], (unsigned long long)d->generation, bumped ? "bumped" : "no bump");
	S.generation[i] = d->generation;
	if (!bumped)
		return;
	S.bumps[i]++;
	S.epoch++;
	/* A Release or Reset that completed makes the device ready (once per
	 * healthy reply); any other bump is for a lost worker, once per
	 * worker. */
	if (d->state == RP_STATE_READY) {
		FZ_CHECK(S.healthy_reply[i], "device %d bumped into READY without a completed release or reset", i);
		S.healthy_reply[i] = false;
		return;
	}
	FZ_CHECK(d->state == RP_STATE_RESPAWNING || d->state == RP_STATE_FAILED, "device %d bumped into %s", i,
		 rp_state_name(d->state));
	S.lost_bumps[i]++;
	FZ_CHECK(S.lost_bumps[i] == 1, "device %d bumped %u times for one lost worker", i, S.lost_bumps[i]);
}

static void on_worker_ready(struct rd_sv_device *d, void *data)
{
	S.lost_bumps[index_of(d)] = 0;
}

static void on_request_finished(struct rd_sv_device *d, void *request, const char *failure, void *data)
{
	struct request *r = request;

	FZ_CHECK(r >= S.req && r < S.req + S.nreq, "an answer to no request");
	FZ_CHECK(r->device == index_of(d), "request of device %d answered by device %d", r->device, index_of(d));
	r->answers++;
	FZ_CHECK(r->answers == 1, "request %d answered %u times", (int)(r - S.req), r->answers);
	r->ok = failure == NULL;
	if (r->ok)
		FZ_CHECK(d->generation > r->generation, "request %d succeeded with device %d still in generation %llu",
			 (int)(r - S.req), r->device, (unsigned long long)d->generation);
}

static const struct rd_sv_device_events events = {
	.state_changed = on_state_changed,
	.worker_ready = on_worker_ready,
	.request_finished = on_request_finished,
};

static bool lifecycle_call(const struct fz_ctl_call *c)
{
	return strcmp(c->method, "io.regen.Worker.Drain") == 0 || strcmp(c->method, "io.regen.Worker.Release") == 0 ||
	       strcmp(c->method, "io.regen.Worker.Reset") == 0;
}

static bool fire(uv_timer_t *t)
{
	uv_timer_cb cb;

	if (!uv_is_active((uv_handle_t *)t))
		return false;
	/* As libuv runs a due timer: stopped, started again when it repeats,
	 * then its callback. */
	cb = t->timer_cb;
	uv_timer_stop(t);
	if (uv_timer_get_repeat(t))
		uv_timer_again(t);
	cb(t);
	return true;
}

static void check(unsigned first_serial)
{
	for (int i = 0; i < DEVICES; i++) {
		struct rd_sv_device *d = &S.dev[i];
		struct fz_worker *fw = fz_worker_of(&d->worker);
		unsigned lifecycle = 0;

		FZ_CHECK(rp_state_name(d->state) != NULL, "device %d in state %d", i, (int)d->state);
		FZ_CHECK(d->generation == S.generation[i] && d->generation == 1 + S.bumps[i],
			 "device %d in generation %llu after %u bumps", i, (unsigned long long)d->generation, S.bumps[i]);
		for (struct fz_ctl_call *c = fw->calls; c; c = c->next) {
			if (!lifecycle_call(c))
				continue;
			lifecycle++;
			if (c->serial >= first_serial && strcmp(c->method, "io.regen.Worker.Drain") != 0)
				FZ_CHECK(S.drained_reply[i], "device %d sent %s without a drain before it", i, c->method);
		}
		FZ_CHECK(lifecycle <= 1, "device %d has %u lifecycle calls on its channel at once", i, lifecycle);
		if (d->state == RP_STATE_READY)
			FZ_CHECK(fw->running && fw->ready, "device %d READY with no worker serving (running %d, ready %d)", i,
				 fw->running, fw->ready);
		if (uv_is_active((uv_handle_t *)&d->respawn_timer))
			FZ_CHECK(!fw->running, "device %d waits to respawn a worker that runs", i);
		if (S.stopping)
			continue;
		FZ_CHECK(fw->running || uv_is_active((uv_handle_t *)&d->respawn_timer),
			 "device %d has no worker and none coming", i);
	}
}

static void answer(int i, struct fz_worker *fw, uint8_t how)
{
	struct fz_ctl_call *c = fw->calls;
	struct rp_call reply = { 0 };
	bool drain = strcmp(c->method, "io.regen.Worker.Drain") == 0;
	bool apply = strcmp(c->method, "io.regen.Worker.Release") == 0 || strcmp(c->method, "io.regen.Worker.Reset") == 0;

	reply.params = cJSON_CreateObject();
	reply.root = reply.params;
	switch (how % 4) {
	case 0:
		/* Not drained, not healthy. */
		cJSON_AddBoolToObject(reply.params, drain ? "drained" : "healthy", false);
		break;
	case 1:
		reply.error = how & 4 ? "io.regen.Draining" : "io.regen.BackendError";
		cJSON_AddStringToObject(reply.params, "message", "no");
		break;
	case 2:
		/* No fields at all. */
		break;
	case 3:
		/* Drained or healthy, with a field no worker sends. */
		cJSON_AddBoolToObject(reply.params, drain ? "drained" : "healthy", true);
		cJSON_AddStringToObject(reply.params, "extra", "\x01");
		S.drained_reply[i] = drain;
		S.healthy_reply[i] = apply;
		break;
	}
	fz_worker_answer(fw, &reply);
	cJSON_Delete(reply.root);
}

static void refresh_done(void *data)
{
	S.refreshes_done++;
	FZ_CHECK(S.refreshes_done <= S.refreshes, "a refresh ended twice");
}

static void event(uint8_t op, struct fz_bytes *b)
{
	int i = op >> 7;
	struct rd_sv_device *d = &S.dev[i];
	struct fz_worker *fw = fz_worker_of(&d->worker);
	uint8_t arg;

	switch (op & 0xf) {
	case 0: {
		static const unsigned deadlines[] = { 0, 1, 100, 2000, 30000, 3600000 };
		enum rd_sv_verb verb = (enum rd_sv_verb)(fz_u8(b) % 3);
		struct request *r;
		if (S.nreq == REQUESTS_MAX)
			break;
		r = &S.req[S.nreq++];
		*r = (struct request){ .device = i, .generation = d->generation };
		rd_sv_device_enqueue(d, verb, "fuzz", deadlines[fz_u8(b) % 6], r);
		break;
	}
	case 1:
		if (fw->calls) {
			S.drained_reply[i] = strcmp(fw->calls->method, "io.regen.Worker.Drain") == 0;
			S.healthy_reply[i] = strcmp(fw->calls->method, "io.regen.Worker.Release") == 0 ||
					     strcmp(fw->calls->method, "io.regen.Worker.Reset") == 0;
			fz_worker_answer_ok(fw);
		}
		break;
	case 2:
		arg = fz_u8(b);
		if (fw->calls)
			answer(i, fw, arg);
		break;
	/* A worker sent SIGKILL says nothing new: only what it had sent
	 * before (replies) may still arrive. */
	case 3:
		arg = fz_u8(b);
		if (fw->running && !fw->ready && !fw->killed)
			fz_worker_ready(fw, arg & 1 ? S.health : NULL);
		break;
	case 4: {
		static const char *const reasons[] = { "device lost", "Xid 79: \"fell off the bus\"\n\x01",
						       "hung: gemm from pid 7 on lane 0 passed its deadline of 1 ms", "" };
		arg = fz_u8(b);
		if (fw->running && fw->ready && !fw->killed)
			fz_worker_faulted(fw, (enum rd_sv_fault)(arg % 3), reasons[(arg >> 2) & 3],
					  arg & 0x10 ? S.health : NULL, arg & 0x20 ? 1000 : -1);
		break;
	}
	case 5:
		arg = fz_u8(b);
		fz_worker_exit(fw, arg & 1 ? SIGSEGV : 0, arg & 2);
		break;
	case 6:
		fz_worker_channel_lost(fw);
		break;
	case 7:
		fire(&d->timer);
		break;
	case 8:
		fire(&d->respawn_timer);
		break;
	case 9:
		if (fw->killed)
			fz_worker_exit(fw, fw->killed, false);
		break;
	case 10:
		fz_worker_spawn_fails = !fz_worker_spawn_fails;
		break;
	case 11:
		rd_sv_device_kill(d, "fuzz");
		break;
	case 12:
		if (fz_u8(b) & 1) {
			rd_sv_device_tell_epoch(d);
		} else if (rd_sv_device_refresh_memory(d, refresh_done, NULL) == 0) {
			FZ_CHECK(rd_sv_device_serving(d), "memory refreshed from a device not serving");
			S.refreshes++;
		}
		break;
	case 13:
		fire(&d->heartbeat_timer);
		break;
	case 14: {
		static const uint64_t ms[] = { 1, 10, 100, 600, 1000, 2500, 30000, 61000 };
		S.now += ms[fz_u8(b) % 8] * 1000000u;
		break;
	}
	default:
		break;
	}
}

/* A healthy worker on every device, until nothing is left to do. Returns
 * whether anything happened. */
static bool autopilot_round(void)
{
	bool progress = false;

	fz_worker_spawn_fails = false;
	for (int i = 0; i < DEVICES; i++) {
		struct rd_sv_device *d = &S.dev[i];
		struct fz_worker *fw = fz_worker_of(&d->worker);
		unsigned first = fz_ctl_next_serial();

		S.drained_reply[i] = S.healthy_reply[i] = false;
		if (fw->running && (fw->killed || !fw->channel)) {
			/* A worker without its channel leaves (ctl_on_close). */
			fz_worker_exit(fw, fw->killed, false);
		} else if (fw->running && !fw->ready) {
			fz_worker_ready(fw, NULL);
		} else if (fw->calls) {
			S.drained_reply[i] = strcmp(fw->calls->method, "io.regen.Worker.Drain") == 0;
			S.healthy_reply[i] = strcmp(fw->calls->method, "io.regen.Worker.Release") == 0 ||
					     strcmp(fw->calls->method, "io.regen.Worker.Reset") == 0;
			fz_worker_answer_ok(fw);
		} else if (!fw->running) {
			FZ_CHECK(fire(&d->respawn_timer), "device %d: no worker and no respawn coming", i);
		} else {
			continue;
		}
		progress = true;
		check(first);
	}
	return progress;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_bytes b = { data, size, 0 };

	fz_workers_reset();
	memset(&S.dev, 0, sizeof(S.dev));
	memset(S.req, 0, sizeof(S.req));
	S.nreq = 0;
	S.refreshes = S.refreshes_done = 0;
	S.stopping = false;
	S.epoch = 1;
	S.now = UINT64_C(1) << 40;
	rd_options_defaults(&S.opts);
	S.env = (struct rd_sv_device_env){
		.loop = &S.loop,
		.socket_dir = -1,
		.exe = "/nonexistent/regend",
		.opts = &S.opts,
		.epoch = &S.epoch,
		.stopping = &S.stopping,
		.events = &events,
	};
	for (int i = 0; i < DEVICES; i++) {
		rd_sv_device_init(&S.dev[i], &S.env, i, "host");
		S.generation[i] = 1;
		S.bumps[i] = 0;
		S.lost_bumps[i] = 0;
		rd_sv_device_start(&S.dev[i]);
		FZ_CHECK(S.dev[i].state == RP_STATE_RESPAWNING && S.dev[i].generation == 1,
			 "a device starts in %s, generation %llu", rp_state_name(S.dev[i].state),
			 (unsigned long long)S.dev[i].generation);
	}

	for (S.step = 0; fz_more(&b) && S.step < 1024; S.step++) {
		uint8_t op = fz_u8(&b);
		unsigned first = fz_ctl_next_serial();
		for (int i = 0; i < DEVICES; i++)
			S.drained_reply[i] = S.healthy_reply[i] = false;
		event(op, &b);
		check(first);
	}

	/* Liveness: with a healthy worker and no timer, every request ends. */
	for (unsigned round = 0; round < 16384; round++) {
		bool waiting = false;
		for (unsigned r = 0; r < S.nreq; r++)
			waiting |= S.req[r].answers == 0;
		if (!waiting)
			break;
		FZ_CHECK(autopilot_round(), "requests wait and nothing moves");
	}
	for (unsigned r = 0; r < S.nreq; r++)
		FZ_CHECK(S.req[r].answers == 1, "request %u (device %d) never answered with a healthy worker", r,
			 S.req[r].device);

	/* regend stops: the devices stop, their workers exit on SIGTERM. */
	S.stopping = true;
	for (int i = 0; i < DEVICES; i++)
		rd_sv_device_stop(&S.dev[i], "regend is stopping");
	for (int i = 0; i < DEVICES; i++) {
		struct fz_worker *fw = fz_worker_of(&S.dev[i].worker);
		fz_worker_exit(fw, fw->killed, false);
		FZ_CHECK(fw->calls == NULL, "calls left on a closed channel");
	}
	FZ_CHECK(S.refreshes_done == S.refreshes, "%u of %u memory refreshes ended", S.refreshes_done, S.refreshes);
	uv_run(&S.loop, UV_RUN_NOWAIT);
	FZ_CHECK(!uv_loop_alive(&S.loop), "handles left on the loop after stop");
	fz_workers_reset();
	return 0;
}
