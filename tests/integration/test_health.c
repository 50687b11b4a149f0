/* SPDX-License-Identifier: Apache-2.0 */
/* Faults found without waiting for a call, and a Watch that tells the truth
 * (issue 10), on the host backend: regend runs with a 500 ms heartbeat and a
 * 500 ms first pause before a failed GPU is tried again.
 *
 * One Watch subscription (a raw connection) follows every scenario, and each
 * scenario checks the exact sequence of device 1's events (state entered,
 * generation, reason), that device 0 hears nothing, and that `ready` comes
 * only once the worker serves (a call on its socket works right after):
 *  - crash:        respawning (g+1) -> ready (g+1)
 *  - device_lost:  found by the health watch with no call: faulted (g) ->
 *                  resetting (g) -> ready (g+1); fault -> event time printed
 *  - stopped:      SIGSTOP: Status keeps answering at once and shows
 *                  unresponsive (g) -> respawning (g+1) -> ready (g+1)
 *  - hang:         a Gemm with deadline_ms 300 behind a hung device is
 *                  answered with io.regen.Timeout {device, elapsed_ms};
 *                  faulted ("hung: ...") -> respawning (g+1) -> ready (g+1)
 *                  (regend runs with --call-deadline-ms 300: only its own
 *                  deadline says the device hung); again through libregen's
 *                  regen_gemm on the run's transport
 *  - xid 31:       recorded in Status's health, no transition; Status's
 *                  sharing says the host backend shares no GPU (not MPS)
 *  - xid 48:       faulted (g) -> resetting -> ready (g+1)
 *  - xid 79:       failed (g+1, "XID 79: GPU has fallen off the bus") ->
 *                  respawning after the pause -> ready; the last XID stays
 *                  in Status after the respawn
 *  - deadline_ms:  0 and more than a day are refused by name
 *  - errors of a faulted device carry device and generation (part 7). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"
#include "tests/lib/memfd.h"
#include "tests/lib/varlink.h"

#define DEV 1

static struct tl_daemon daemon_;
static struct tl_conn watch_;

struct event {
	int device;
	uint64_t generation;
	char state[16];
	char reason[256];
	double at;
};

/* The next Watch event of any device, or false after timeout_s. */
static bool next_event(double timeout_s, struct event *ev)
{
	char *text = tl_recv_text(&watch_, timeout_s);
	cJSON *j, *p;

	if (!text)
		return false;
	j = cJSON_Parse(text);
	ASSERT(j != NULL, "Watch reply is not JSON: %s", text);
	p = cJSON_GetObjectItem(j, "parameters");
	ASSERT(cJSON_IsObject(p) && cJSON_IsTrue(cJSON_GetObjectItem(j, "continues")), "Watch reply: %s", text);
	ev->device = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(p, "device"));
	ev->generation = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(p, "generation"));
	snprintf(ev->state, sizeof(ev->state), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(p, "state")));
	snprintf(ev->reason, sizeof(ev->reason), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(p, "reason")));
	ev->at = tl_now();
	tl_log("watch: device %d generation %llu %s: %s", ev->device, (unsigned long long)ev->generation, ev->state,
	       ev->reason);
	cJSON_Delete(j);
	free(text);
	return true;
}

static void subscribe(void)
{
	struct event ev;

	ASSERT(tl_conn_open(&watch_, daemon_.sock) == 0, "connect for Watch");
	ASSERT(tl_send_text(&watch_, "{\"method\":\"io.regen.Device.Watch\",\"more\":true}", NULL, 0) == 0, "send");
	for (int i = 0; i < daemon_.ndevices; i++) {
		ASSERT(next_event(5, &ev), "no subscription reply");
		ASSERT(strcmp(ev.reason, "subscribed") == 0 && strcmp(ev.state, "ready") == 0, "first reply: %s %s",
		      ev.state, ev.reason);
	}
}

static const struct regen_device_info *device_now(regen_client *c, regen_status **st)
{
	*st = tl_status(c);
	return tl_status_device(*st, DEV);
}

static uint64_t generation_now(regen_client *c)
{
	regen_status *st;
	uint64_t g = device_now(c, &st)->generation;

	regen_status_free(st);
	return g;
}

/* A call on the device's worker socket works: Generation answers. */
static void worker_serves(regen_client *c, const char *what)
{
	regen_status *st;
	const struct regen_device_info *d = device_now(c, &st);
	struct tl_conn r;
	char *reply;

	ASSERT(tl_conn_open(&r, d->worker_socket) == 0, "%s: the worker socket %s refuses a connection after ready",
	      what, d->worker_socket);
	ASSERT(tl_send_text(&r, "{\"method\":\"io.regen.Device.Generation\"}", NULL, 0) == 0, "send");
	reply = tl_recv_text(&r, 5);
	ASSERT(reply != NULL && strstr(reply, "\"error\"") == NULL, "%s: Generation on the worker socket: %s", what,
	      reply ? reply : "(no reply)");
	free(reply);
	tl_conn_close(&r);
	regen_status_free(st);
}

struct step {
	const char *state;
	int bump;                /* generation relative to the scenario's start */
	const char *reason;      /* a part the reason must contain, or NULL */
};

/* The exact sequence of device DEV's events, each within timeout_s of the
 * one before; returns the time of the first. */
static double expect_sequence(const char *what, uint64_t g, const struct step *steps, int n, double timeout_s)
{
	struct event ev;
	double first = 0;

	for (int i = 0; i < n; i++) {
		ASSERT(next_event(timeout_s, &ev), "%s: no event %d (%s) within %.1f s", what, i, steps[i].state, timeout_s);
		ASSERT(ev.device == DEV, "%s: an event of device %d (%s: %s): only device %d changed", what, ev.device,
		      ev.state, ev.reason, DEV);
		ASSERT(strcmp(ev.state, steps[i].state) == 0, "%s: event %d is %s (%s), want %s", what, i, ev.state, ev.reason,
		      steps[i].state);
		ASSERT(ev.generation == g + (uint64_t)steps[i].bump, "%s: %s at generation %llu, want %llu", what, ev.state,
		      (unsigned long long)ev.generation, (unsigned long long)(g + (uint64_t)steps[i].bump));
		ASSERT(!steps[i].reason || strstr(ev.reason, steps[i].reason), "%s: %s's reason '%s' lacks '%s'", what,
		      ev.state, ev.reason, steps[i].reason);
		if (i == 0)
			first = ev.at;
	}
	/* Nothing more: one event per transition. */
	ASSERT(!next_event(0.3, &ev), "%s: one more event after the sequence: device %d %s (%s)", what, ev.device, ev.state,
	      ev.reason);
	return first;
}

static void scenario_crash(regen_client *c)
{
	static const struct step steps[] = {
		{ "respawning", 1, "worker exited (signal 6)" },
		{ "ready", 1, "worker exited (signal 6)" },
	};
	uint64_t g = generation_now(c);

	ASSERT_REGEN_OK(c, regen_inject_fault(c, DEV, "crash"));
	expect_sequence("crash", g, steps, 2, 10);
	worker_serves(c, "crash");
}

static void scenario_device_lost(regen_client *c)
{
	static const struct step steps[] = {
		{ "faulted", 0, "health watch" },
		{ "resetting", 0, "device_lost" },
		{ "ready", 1, "device_lost" },
	};
	uint64_t g = generation_now(c);
	double t0 = tl_now(), first;

	ASSERT_REGEN_OK(c, regen_inject_fault(c, DEV, "device_lost"));
	first = expect_sequence("device_lost", g, steps, 3, 10);
	tl_log("measured: device_lost (no call in flight) -> faulted event %.1f ms", (first - t0) * 1e3);
	worker_serves(c, "device_lost");
}

static void scenario_stopped(regen_client *c)
{
	static const struct step steps[] = {
		{ "unresponsive", 0, "no heartbeat" },
		{ "respawning", 1, "no heartbeat" },
		{ "ready", 1, "no heartbeat" },
	};
	regen_status *st;
	struct event evs[3];
	uint64_t g = generation_now(c);
	pid_t pid = (pid_t)device_now(c, &st)->worker_pid;
	double t0, worst = 0;
	int n = 0, polls = 0;

	regen_status_free(st);
	ASSERT(kill(pid, SIGSTOP) == 0, "SIGSTOP %d: %s", (int)pid, strerror(errno));
	t0 = tl_now();
	/* Status answers at once all along, while the worker is stopped and
	 * while it is replaced; the events come meanwhile. */
	while (n < 3 && tl_now() - t0 < 10) {
		double s = tl_now();

		st = tl_status(c);
		if (tl_now() - s > worst)
			worst = tl_now() - s;
		polls++;
		regen_status_free(st);
		if (next_event(0.01, &evs[n])) {
			ASSERT(evs[n].device == DEV, "stopped: an event of device %d", evs[n].device);
			ASSERT(strcmp(evs[n].state, steps[n].state) == 0 &&
				      evs[n].generation == g + (uint64_t)steps[n].bump && strstr(evs[n].reason, steps[n].reason),
			      "stopped: event %d is %s at %llu (%s), want %s", n, evs[n].state,
			      (unsigned long long)evs[n].generation, evs[n].reason, steps[n].state);
			n++;
		}
	}
	ASSERT(n == 3, "stopped: %d of 3 events within 10 s", n);
	tl_log("measured: SIGSTOP -> unresponsive %.0f ms (heartbeat 500 ms) -> ready %.0f ms; %d Status calls "
	       "meanwhile, the slowest %.1f ms",
	       (evs[0].at - t0) * 1e3, (evs[2].at - t0) * 1e3, polls, worst * 1e3);
	ASSERT(evs[0].at - t0 < 1.0, "unresponsive only %.2f s after SIGSTOP (heartbeat 500 ms)", evs[0].at - t0);
	ASSERT(worst < 0.5, "a Status took %.3f s around the stopped worker", worst);
	ASSERT(!next_event(0.3, &evs[0]), "stopped: one more event: %s", evs[0].state);
	worker_serves(c, "stopped");
	ASSERT(kill(pid, 0) != 0, "the stopped worker %d still exists", (int)pid);
}

/* A host buffer on DEV through a raw worker connection; returns its id. */
static void raw_import(struct tl_conn *r, size_t size, char *id, size_t id_size)
{
	int fd = tl_memfd_open(size);
	char msg[256], *reply;
	cJSON *j;

	ASSERT(fd >= 0, "memfd");
	snprintf(msg, sizeof(msg),
		 "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":%d,\"kind\":\"host_fd\","
		 "\"size\":%zu,\"fd\":0}}",
		 DEV, size);
	ASSERT(tl_send_text(r, msg, &fd, 1) == 0, "send ImportBuffer");
	close(fd);
	reply = tl_recv_text(r, 5);
	j = reply ? cJSON_Parse(reply) : NULL;
	ASSERT(j && cJSON_GetObjectItem(cJSON_GetObjectItem(j, "parameters"), "buffer"), "ImportBuffer: %s",
	      reply ? reply : "(none)");
	snprintf(id, id_size, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "parameters"), "buffer")));
	cJSON_Delete(j);
	free(reply);
}

static void gemm_msg(char *msg, size_t size, const char *buf, const char *extra)
{
	snprintf(msg, size,
		 "{\"method\":\"io.regen.Compute.Gemm\",\"parameters\":{"
		 "\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		 "\"b\":{\"buffer\":\"%s\",\"offset\":64,\"dtype\":\"f32\",\"shape\":[4,4]},"
		 "\"d\":{\"buffer\":\"%s\",\"offset\":128,\"dtype\":\"f32\",\"shape\":[4,4]}%s}}",
		 buf, buf, buf, extra);
}

/* The error a raw reply names, with its device and generation checked
 * present where its IDL type carries them. */
static char *reply_error(const char *reply, cJSON **params)
{
	cJSON *j = cJSON_Parse(reply);
	char *name;

	ASSERT(j != NULL, "reply is not JSON: %s", reply);
	name = cJSON_IsString(cJSON_GetObjectItem(j, "error")) ? strdup(cJSON_GetObjectItem(j, "error")->valuestring)
								 : NULL;
	*params = cJSON_DetachItemFromObject(j, "parameters");
	cJSON_Delete(j);
	return name;
}

static void scenario_hang(regen_client *c)
{
	static const struct step steps[] = {
		{ "faulted", 0, "hung: gemm" },
		{ "respawning", 1, "deadline of 300 ms" },
		{ "ready", 1, "hung" },
	};
	regen_status *st;
	const struct regen_device_info *d = device_now(c, &st);
	struct tl_conn r;
	char buf[64], msg[1024], *reply, *name;
	uint64_t g = d->generation;
	cJSON *p;
	double t0;

	ASSERT(tl_conn_open(&r, d->worker_socket) == 0, "connect %s", d->worker_socket);
	regen_status_free(st);
	raw_import(&r, 4096, buf, sizeof(buf));
	ASSERT_REGEN_OK(c, regen_inject_fault(c, DEV, "hang"));
	gemm_msg(msg, sizeof(msg), buf, ",\"deadline_ms\":300");
	t0 = tl_now();
	ASSERT(tl_send_text(&r, msg, NULL, 0) == 0, "send Gemm");
	reply = tl_recv_text(&r, 10);
	ASSERT(reply != NULL, "no answer to the hung Gemm within 10 s");
	tl_log("measured: hung Gemm (deadline_ms 300) answered after %.0f ms: %s", (tl_now() - t0) * 1e3, reply);
	name = reply_error(reply, &p);
	ASSERT(name && strcmp(name, "io.regen.Timeout") == 0, "the hung Gemm failed with %s", name ? name : "success");
	ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(p, "device")) == DEV, "Timeout carries device %d", DEV);
	ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(p, "elapsed_ms")) >= 300, "Timeout after %g ms",
	      cJSON_GetNumberValue(cJSON_GetObjectItem(p, "elapsed_ms")));
	ASSERT(tl_now() - t0 < 2, "the Timeout came %.2f s after the call", tl_now() - t0);
	free(name);
	free(reply);
	cJSON_Delete(p);
	expect_sequence("hang", g, steps, 3, 10);
	tl_conn_close(&r);
	worker_serves(c, "hang");
}

/* The same through libregen's regen_gemm (deadline_ms in its arguments), on
 * the transport the suite's run picks: the ring's record carries the
 * deadline as a Varlink call does. */
static void scenario_hang_client(regen_client *c)
{
	static const struct step steps[] = {
		{ "faulted", 0, "hung: gemm" },
		{ "respawning", 1, "deadline of 300 ms" },
		{ "ready", 1, "hung" },
	};
	struct tl_buffer b;
	struct regen_gemm_args g = { .deadline_ms = 300 };
	uint64_t gen = generation_now(c);
	const char *name;
	double t0;
	int r;

	tl_buffer_create(c, DEV, 3 * 8 * 8 * sizeof(float), &b);
	for (int i = 0; i < 3; i++) {
		struct regen_tensor *t = i == 0 ? &g.a : i == 1 ? &g.b : &g.d;
		t->buffer = b.buf;
		t->offset = (uint64_t)i * 8 * 8 * sizeof(float);
		t->dtype = REGEN_F32;
		t->rank = 2;
		t->shape[0] = t->shape[1] = 8;
	}
	ASSERT_REGEN_OK(c, regen_gemm(c, &g));
	tl_check_transport(c, DEV);
	ASSERT_REGEN_OK(c, regen_inject_fault(c, DEV, "hang"));
	t0 = tl_now();
	r = regen_gemm(c, &g);
	name = regen_client_error_name(c);
	tl_log("measured: hung regen_gemm (deadline_ms 300) returned after %.0f ms: %d %s", (tl_now() - t0) * 1e3, r,
	       name ? name : "");
	ASSERT(r < 0 && name && strcmp(name, "io.regen.Timeout") == 0, "the hung regen_gemm: %d %s", r,
	       name ? name : "(no error name)");
	ASSERT(tl_now() - t0 < 2, "the Timeout came %.2f s after the call", tl_now() - t0);
	expect_sequence("hang (libregen)", gen, steps, 3, 10);
	worker_serves(c, "hang (libregen)");
	tl_buffer_free(&b);
}

static void inject_xid(regen_client *c, int xid)
{
	char msg[256], *reply;
	struct tl_conn r;

	snprintf(msg, sizeof(msg),
		 "{\"method\":\"io.regen.Device.InjectFault\",\"parameters\":{\"device\":%d,\"kind\":\"xid\",\"xid\":%d}}",
		 DEV, xid);
	ASSERT(tl_conn_open(&r, daemon_.sock) == 0, "connect");
	ASSERT(tl_send_text(&r, msg, NULL, 0) == 0, "send");
	reply = tl_recv_text(&r, 5);
	ASSERT(reply && strstr(reply, "\"error\"") == NULL, "InjectFault xid %d: %s", xid, reply ? reply : "(none)");
	free(reply);
	tl_conn_close(&r);
	(void)c;
}

static void wait_health_xid(regen_client *c, unsigned xid, const char *text)
{
	double t0 = tl_now();
	regen_status *st;

	for (;;) {
		const struct regen_device_info *d = device_now(c, &st);
		ASSERT(d->has_health, "Status has no health for device %d", DEV);
		if (d->last_xid == xid) {
			ASSERT(strstr(d->last_xid_text, text) != NULL, "last XID text '%s' lacks '%s'", d->last_xid_text, text);
			ASSERT(d->last_xid_unix_ms > 0, "no time for the last XID");
			ASSERT(strcmp(d->health_source, "simulated") == 0, "health source %s", d->health_source);
			/* Sharing comes with the health: the host backend shares no GPU. */
			ASSERT(REGEN_HAS_FIELD(d, sharing_reason) && d->has_sharing && !d->mps &&
				       strstr(d->sharing_reason, "host backend") != NULL && d->mps_clients == -1,
			       "sharing of device %d: has %d, mps %d, reason '%s', clients %lld", DEV, d->has_sharing,
			       d->mps, d->sharing_reason, (long long)d->mps_clients);
			regen_status_free(st);
			return;
		}
		ASSERT(tl_now() - t0 < 5, "Status's last XID is %u, not %u, after 5 s", d->last_xid, xid);
		regen_status_free(st);
		usleep(50000);
	}
}

static void scenario_xids(regen_client *c)
{
	static const struct step lost[] = {
		{ "faulted", 0, "XID 48: double-bit ECC error" },
		{ "resetting", 0, "XID 48" },
		{ "ready", 1, "XID 48" },
	};
	static const struct step failed[] = {
		{ "failed", 1, "XID 79: GPU has fallen off the bus" },
		{ "respawning", 1, "XID 79" },
		{ "ready", 1, "XID 79" },
	};
	struct event ev;
	uint64_t g = generation_now(c);
	double t0;
	regen_status *st;

	/* A page fault may be another process's: recorded, nothing else. */
	inject_xid(c, 31);
	wait_health_xid(c, 31, "page fault");
	ASSERT(!next_event(0.5, &ev), "XID 31 changed the state: device %d %s (%s)", ev.device, ev.state, ev.reason);
	ASSERT(generation_now(c) == g, "XID 31 bumped the generation");

	inject_xid(c, 48);
	expect_sequence("xid 48", g, lost, 3, 10);
	g = generation_now(c);

	t0 = tl_now();
	inject_xid(c, 79);
	ASSERT(next_event(5, &ev) && strcmp(ev.state, "failed") == 0, "XID 79: first event %s", ev.state);
	{
		const struct regen_device_info *d = device_now(c, &st);
		ASSERT(strcmp(d->state, "failed") == 0, "Status says %s after XID 79", d->state);
		ASSERT(strstr(d->reason, "next try in") != NULL, "the reason says when the next try comes: %s", d->reason);
		regen_status_free(st);
	}
	ASSERT(ev.generation == g + 1 && strstr(ev.reason, failed[0].reason), "failed event: gen %llu, %s",
	      (unsigned long long)ev.generation, ev.reason);
	expect_sequence("xid 79 after failed", g, failed + 1, 2, 10);
	tl_log("measured: XID 79 -> failed -> ready again after %.0f ms (first pause 500 ms)", (tl_now() - t0) * 1e3);
	wait_health_xid(c, 79, "fallen off the bus");
	worker_serves(c, "xid 79");
}

static void scenario_deadline_refused(regen_client *c)
{
	static const char *const bad[] = { ",\"deadline_ms\":0", ",\"deadline_ms\":86400001", ",\"deadline_ms\":\"1\"" };
	regen_status *st;
	const struct regen_device_info *d = device_now(c, &st);
	struct tl_conn r;
	char buf[64], msg[1024], *reply, *name;
	cJSON *p;

	ASSERT(tl_conn_open(&r, d->worker_socket) == 0, "connect");
	regen_status_free(st);
	raw_import(&r, 4096, buf, sizeof(buf));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		gemm_msg(msg, sizeof(msg), buf, bad[i]);
		ASSERT(tl_send_text(&r, msg, NULL, 0) == 0, "send");
		reply = tl_recv_text(&r, 5);
		ASSERT(reply, "no reply");
		name = reply_error(reply, &p);
		ASSERT(name && strcmp(name, "org.varlink.service.InvalidParameter") == 0 &&
			      strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(p, "parameter")), "deadline_ms") == 0,
		      "deadline %s: %s", bad[i], reply);
		free(name);
		free(reply);
		cJSON_Delete(p);
	}
	/* A good one runs. */
	gemm_msg(msg, sizeof(msg), buf, ",\"deadline_ms\":5000");
	ASSERT(tl_send_text(&r, msg, NULL, 0) == 0, "send");
	reply = tl_recv_text(&r, 5);
	ASSERT(reply && strstr(reply, "elapsed_us"), "Gemm with deadline_ms 5000: %s", reply ? reply : "(none)");
	free(reply);
	tl_conn_close(&r);
}

/* Part 7: whatever a call on a faulted device gets (DeviceLost while the
 * worker waits for its reset, Draining while it resets, StaleGeneration
 * after), the error carries the device and a generation. */
static void scenario_errors_carry_generation(regen_client *c)
{
	regen_status *st;
	const struct regen_device_info *d = device_now(c, &st);
	struct tl_conn r;
	char buf[64], msg[1024], *reply, *name;
	int named = 0;
	cJSON *p;
	struct event ev;

	ASSERT(tl_conn_open(&r, d->worker_socket) == 0, "connect");
	regen_status_free(st);
	raw_import(&r, 4096, buf, sizeof(buf));
	ASSERT_REGEN_OK(c, regen_inject_fault(c, DEV, "device_lost"));
	gemm_msg(msg, sizeof(msg), buf, "");
	for (int i = 0; i < 50 && named < 5; i++) {
		if (tl_send_text(&r, msg, NULL, 0) < 0)
			break;
		reply = tl_recv_text(&r, 5);
		if (!reply)
			break;
		name = reply_error(reply, &p);
		if (name) {
			ASSERT(strcmp(name, "io.regen.DeviceLost") == 0 || strcmp(name, "io.regen.Draining") == 0 ||
				      strcmp(name, "io.regen.StaleGeneration") == 0,
			      "a call on a faulted device: %s", reply);
			ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(p, "device")) == DEV &&
				      cJSON_GetNumberValue(cJSON_GetObjectItem(p, "generation")) >= 1,
			      "%s lacks device or generation: %s", name, reply);
			named++;
		}
		free(name);
		free(reply);
		cJSON_Delete(p);
		usleep(10000);
	}
	ASSERT(named > 0, "no call failed after device_lost");
	tl_conn_close(&r);
	/* Drain the events of this recovery. */
	while (next_event(2, &ev) && strcmp(ev.state, "ready") != 0)
		;
	while (next_event(0.3, &ev))
		;
}

int main(void)
{
	/* regend's own call deadline 300 ms: the hang scenarios' calls name
	 * the same, and only regend's deadline says a device hung. */
	static const char *const args[] = { "--heartbeat-ms", "500", "--failed-retry-ms", "500", "--call-deadline-ms",
					    "300", NULL };
	struct tl_daemon_opts opts = { .extra = args };
	regen_client *c;

	tl_init(200);
	tl_daemon_start(&daemon_, &opts);
	c = tl_client_connect(&daemon_);
	subscribe();
	tl_log("scenario: crash");
	scenario_crash(c);
	tl_log("scenario: device_lost");
	scenario_device_lost(c);
	tl_log("scenario: stopped worker");
	scenario_stopped(c);
	tl_log("scenario: hang");
	scenario_hang(c);
	tl_log("scenario: hang, through libregen");
	scenario_hang_client(c);
	tl_log("scenario: XIDs");
	scenario_xids(c);
	tl_log("scenario: deadline_ms refused");
	scenario_deadline_refused(c);
	tl_log("scenario: errors carry device and generation");
	scenario_errors_carry_generation(c);
	regen_client_destroy(c);
	tl_conn_close(&watch_);
	tl_daemon_stop(&daemon_);
	tl_log("PASS");
	return 0;
}
