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
 *  - xid 31:       recorded in Status's health, no transition
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
#include "itest.h"

#define DEV 1

static struct it_daemon daemon_;
static struct it_raw watch_;

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
	char *text = it_raw_recv(&watch_, timeout_s);
	cJSON *j, *p;

	if (!text)
		return false;
	j = cJSON_Parse(text);
	CHECK(j != NULL, "Watch reply is not JSON: %s", text);
	p = cJSON_GetObjectItem(j, "parameters");
	CHECK(cJSON_IsObject(p) && cJSON_IsTrue(cJSON_GetObjectItem(j, "continues")), "Watch reply: %s", text);
	ev->device = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(p, "device"));
	ev->generation = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(p, "generation"));
	snprintf(ev->state, sizeof(ev->state), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(p, "state")));
	snprintf(ev->reason, sizeof(ev->reason), "%s", cJSON_GetStringValue(cJSON_GetObjectItem(p, "reason")));
	ev->at = it_now();
	it_log("watch: device %d generation %llu %s: %s", ev->device, (unsigned long long)ev->generation, ev->state,
	       ev->reason);
	cJSON_Delete(j);
	free(text);
	return true;
}

static void subscribe(void)
{
	struct event ev;

	CHECK(it_raw_connect(&watch_, daemon_.sock) == 0, "connect for Watch");
	CHECK(it_raw_send_str(&watch_, "{\"method\":\"io.regen.Device.Watch\",\"more\":true}", NULL, 0) == 0, "send");
	for (int i = 0; i < daemon_.ndevices; i++) {
		CHECK(next_event(5, &ev), "no subscription reply");
		CHECK(strcmp(ev.reason, "subscribed") == 0 && strcmp(ev.state, "ready") == 0, "first reply: %s %s",
		      ev.state, ev.reason);
	}
}

static const struct regen_device_info *device_now(regen_client *c, regen_status **st)
{
	*st = it_status(c);
	return it_device(*st, DEV);
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
	struct it_raw r;
	char *reply;

	CHECK(it_raw_connect(&r, d->worker_socket) == 0, "%s: the worker socket %s refuses a connection after ready",
	      what, d->worker_socket);
	CHECK(it_raw_send_str(&r, "{\"method\":\"io.regen.Device.Generation\"}", NULL, 0) == 0, "send");
	reply = it_raw_recv(&r, 5);
	CHECK(reply != NULL && strstr(reply, "\"error\"") == NULL, "%s: Generation on the worker socket: %s", what,
	      reply ? reply : "(no reply)");
	free(reply);
	it_raw_close(&r);
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
		CHECK(next_event(timeout_s, &ev), "%s: no event %d (%s) within %.1f s", what, i, steps[i].state, timeout_s);
		CHECK(ev.device == DEV, "%s: an event of device %d (%s: %s): only device %d changed", what, ev.device,
		      ev.state, ev.reason, DEV);
		CHECK(strcmp(ev.state, steps[i].state) == 0, "%s: event %d is %s (%s), want %s", what, i, ev.state, ev.reason,
		      steps[i].state);
		CHECK(ev.generation == g + (uint64_t)steps[i].bump, "%s: %s at generation %llu, want %llu", what, ev.state,
		      (unsigned long long)ev.generation, (unsigned long long)(g + (uint64_t)steps[i].bump));
		CHECK(!steps[i].reason || strstr(ev.reason, steps[i].reason), "%s: %s's reason '%s' lacks '%s'", what,
		      ev.state, ev.reason, steps[i].reason);
		if (i == 0)
			first = ev.at;
	}
	/* Nothing more: one event per transition. */
	CHECK(!next_event(0.3, &ev), "%s: one more event after the sequence: device %d %s (%s)", what, ev.device, ev.state,
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

	CHECK_OK(c, regen_inject_fault(c, DEV, "crash"));
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
	double t0 = it_now(), first;

	CHECK_OK(c, regen_inject_fault(c, DEV, "device_lost"));
	first = expect_sequence("device_lost", g, steps, 3, 10);
	it_log("measured: device_lost (no call in flight) -> faulted event %.1f ms", (first - t0) * 1e3);
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
	CHECK(kill(pid, SIGSTOP) == 0, "SIGSTOP %d: %s", (int)pid, strerror(errno));
	t0 = it_now();
	/* Status answers at once all along, while the worker is stopped and
	 * while it is replaced; the events come meanwhile. */
	while (n < 3 && it_now() - t0 < 10) {
		double s = it_now();

		st = it_status(c);
		if (it_now() - s > worst)
			worst = it_now() - s;
		polls++;
		regen_status_free(st);
		if (next_event(0.01, &evs[n])) {
			CHECK(evs[n].device == DEV, "stopped: an event of device %d", evs[n].device);
			CHECK(strcmp(evs[n].state, steps[n].state) == 0 &&
				      evs[n].generation == g + (uint64_t)steps[n].bump && strstr(evs[n].reason, steps[n].reason),
			      "stopped: event %d is %s at %llu (%s), want %s", n, evs[n].state,
			      (unsigned long long)evs[n].generation, evs[n].reason, steps[n].state);
			n++;
		}
	}
	CHECK(n == 3, "stopped: %d of 3 events within 10 s", n);
	it_log("measured: SIGSTOP -> unresponsive %.0f ms (heartbeat 500 ms) -> ready %.0f ms; %d Status calls "
	       "meanwhile, the slowest %.1f ms",
	       (evs[0].at - t0) * 1e3, (evs[2].at - t0) * 1e3, polls, worst * 1e3);
	CHECK(evs[0].at - t0 < 1.0, "unresponsive only %.2f s after SIGSTOP (heartbeat 500 ms)", evs[0].at - t0);
	CHECK(worst < 0.5, "a Status took %.3f s around the stopped worker", worst);
	CHECK(!next_event(0.3, &evs[0]), "stopped: one more event: %s", evs[0].state);
	worker_serves(c, "stopped");
	CHECK(kill(pid, 0) != 0, "the stopped worker %d still exists", (int)pid);
}

/* A host buffer on DEV through a raw worker connection; returns its id. */
static void raw_import(struct it_raw *r, size_t size, char *id, size_t id_size)
{
	int fd = memfd_create("health", MFD_CLOEXEC);
	char msg[256], *reply;
	cJSON *j;

	CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0, "memfd");
	snprintf(msg, sizeof(msg),
		 "{\"method\":\"io.regen.Memory.ImportBuffer\",\"parameters\":{\"device\":%d,\"kind\":\"host_fd\","
		 "\"size\":%zu,\"fd\":0}}",
		 DEV, size);
	CHECK(it_raw_send_str(r, msg, &fd, 1) == 0, "send ImportBuffer");
	close(fd);
	reply = it_raw_recv(r, 5);
	j = reply ? cJSON_Parse(reply) : NULL;
	CHECK(j && cJSON_GetObjectItem(cJSON_GetObjectItem(j, "parameters"), "buffer"), "ImportBuffer: %s",
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

	CHECK(j != NULL, "reply is not JSON: %s", reply);
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
	struct it_raw r;
	char buf[64], msg[1024], *reply, *name;
	uint64_t g = d->generation;
	cJSON *p;
	double t0;

	CHECK(it_raw_connect(&r, d->worker_socket) == 0, "connect %s", d->worker_socket);
	regen_status_free(st);
	raw_import(&r, 4096, buf, sizeof(buf));
	CHECK_OK(c, regen_inject_fault(c, DEV, "hang"));
	gemm_msg(msg, sizeof(msg), buf, ",\"deadline_ms\":300");
	t0 = it_now();
	CHECK(it_raw_send_str(&r, msg, NULL, 0) == 0, "send Gemm");
	reply = it_raw_recv(&r, 10);
	CHECK(reply != NULL, "no answer to the hung Gemm within 10 s");
	it_log("measured: hung Gemm (deadline_ms 300) answered after %.0f ms: %s", (it_now() - t0) * 1e3, reply);
	name = reply_error(reply, &p);
	CHECK(name && strcmp(name, "io.regen.Timeout") == 0, "the hung Gemm failed with %s", name ? name : "success");
	CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(p, "device")) == DEV, "Timeout carries device %d", DEV);
	CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(p, "elapsed_ms")) >= 300, "Timeout after %g ms",
	      cJSON_GetNumberValue(cJSON_GetObjectItem(p, "elapsed_ms")));
	CHECK(it_now() - t0 < 2, "the Timeout came %.2f s after the call", it_now() - t0);
	free(name);
	free(reply);
	cJSON_Delete(p);
	expect_sequence("hang", g, steps, 3, 10);
	it_raw_close(&r);
	worker_serves(c, "hang");
}

static void inject_xid(regen_client *c, int xid)
{
	char msg[256], *reply;
	struct it_raw r;

	snprintf(msg, sizeof(msg),
		 "{\"method\":\"io.regen.Device.InjectFault\",\"parameters\":{\"device\":%d,\"kind\":\"xid\",\"xid\":%d}}",
		 DEV, xid);
	CHECK(it_raw_connect(&r, daemon_.sock) == 0, "connect");
	CHECK(it_raw_send_str(&r, msg, NULL, 0) == 0, "send");
	reply = it_raw_recv(&r, 5);
	CHECK(reply && strstr(reply, "\"error\"") == NULL, "InjectFault xid %d: %s", xid, reply ? reply : "(none)");
	free(reply);
	it_raw_close(&r);
	(void)c;
}

static void wait_health_xid(regen_client *c, unsigned xid, const char *text)
{
	double t0 = it_now();
	regen_status *st;

	for (;;) {
		const struct regen_device_info *d = device_now(c, &st);
		CHECK(d->has_health, "Status has no health for device %d", DEV);
		if (d->last_xid == xid) {
			CHECK(strstr(d->last_xid_text, text) != NULL, "last XID text '%s' lacks '%s'", d->last_xid_text, text);
			CHECK(d->last_xid_unix_ms > 0, "no time for the last XID");
			CHECK(strcmp(d->health_source, "simulated") == 0, "health source %s", d->health_source);
			regen_status_free(st);
			return;
		}
		CHECK(it_now() - t0 < 5, "Status's last XID is %u, not %u, after 5 s", d->last_xid, xid);
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
	CHECK(!next_event(0.5, &ev), "XID 31 changed the state: device %d %s (%s)", ev.device, ev.state, ev.reason);
	CHECK(generation_now(c) == g, "XID 31 bumped the generation");

	inject_xid(c, 48);
	expect_sequence("xid 48", g, lost, 3, 10);
	g = generation_now(c);

	t0 = it_now();
	inject_xid(c, 79);
	CHECK(next_event(5, &ev) && strcmp(ev.state, "failed") == 0, "XID 79: first event %s", ev.state);
	{
		const struct regen_device_info *d = device_now(c, &st);
		CHECK(strcmp(d->state, "failed") == 0, "Status says %s after XID 79", d->state);
		CHECK(strstr(d->reason, "next try in") != NULL, "the reason says when the next try comes: %s", d->reason);
		regen_status_free(st);
	}
	CHECK(ev.generation == g + 1 && strstr(ev.reason, failed[0].reason), "failed event: gen %llu, %s",
	      (unsigned long long)ev.generation, ev.reason);
	expect_sequence("xid 79 after failed", g, failed + 1, 2, 10);
	it_log("measured: XID 79 -> failed -> ready again after %.0f ms (first pause 500 ms)", (it_now() - t0) * 1e3);
	wait_health_xid(c, 79, "fallen off the bus");
	worker_serves(c, "xid 79");
}

static void scenario_deadline_refused(regen_client *c)
{
	static const char *const bad[] = { ",\"deadline_ms\":0", ",\"deadline_ms\":86400001", ",\"deadline_ms\":\"1\"" };
	regen_status *st;
	const struct regen_device_info *d = device_now(c, &st);
	struct it_raw r;
	char buf[64], msg[1024], *reply, *name;
	cJSON *p;

	CHECK(it_raw_connect(&r, d->worker_socket) == 0, "connect");
	regen_status_free(st);
	raw_import(&r, 4096, buf, sizeof(buf));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		gemm_msg(msg, sizeof(msg), buf, bad[i]);
		CHECK(it_raw_send_str(&r, msg, NULL, 0) == 0, "send");
		reply = it_raw_recv(&r, 5);
		CHECK(reply, "no reply");
		name = reply_error(reply, &p);
		CHECK(name && strcmp(name, "org.varlink.service.InvalidParameter") == 0 &&
			      strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(p, "parameter")), "deadline_ms") == 0,
		      "deadline %s: %s", bad[i], reply);
		free(name);
		free(reply);
		cJSON_Delete(p);
	}
	/* A good one runs. */
	gemm_msg(msg, sizeof(msg), buf, ",\"deadline_ms\":5000");
	CHECK(it_raw_send_str(&r, msg, NULL, 0) == 0, "send");
	reply = it_raw_recv(&r, 5);
	CHECK(reply && strstr(reply, "elapsed_us"), "Gemm with deadline_ms 5000: %s", reply ? reply : "(none)");
	free(reply);
	it_raw_close(&r);
}

/* Part 7: whatever a call on a faulted device gets (DeviceLost while the
 * worker waits for its reset, Draining while it resets, StaleGeneration
 * after), the error carries the device and a generation. */
static void scenario_errors_carry_generation(regen_client *c)
{
	regen_status *st;
	const struct regen_device_info *d = device_now(c, &st);
	struct it_raw r;
	char buf[64], msg[1024], *reply, *name;
	int named = 0;
	cJSON *p;
	struct event ev;

	CHECK(it_raw_connect(&r, d->worker_socket) == 0, "connect");
	regen_status_free(st);
	raw_import(&r, 4096, buf, sizeof(buf));
	CHECK_OK(c, regen_inject_fault(c, DEV, "device_lost"));
	gemm_msg(msg, sizeof(msg), buf, "");
	for (int i = 0; i < 50 && named < 5; i++) {
		if (it_raw_send_str(&r, msg, NULL, 0) < 0)
			break;
		reply = it_raw_recv(&r, 5);
		if (!reply)
			break;
		name = reply_error(reply, &p);
		if (name) {
			CHECK(strcmp(name, "io.regen.DeviceLost") == 0 || strcmp(name, "io.regen.Draining") == 0 ||
				      strcmp(name, "io.regen.StaleGeneration") == 0,
			      "a call on a faulted device: %s", reply);
			CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(p, "device")) == DEV &&
				      cJSON_GetNumberValue(cJSON_GetObjectItem(p, "generation")) >= 1,
			      "%s lacks device or generation: %s", name, reply);
			named++;
		}
		free(name);
		free(reply);
		cJSON_Delete(p);
		usleep(10000);
	}
	CHECK(named > 0, "no call failed after device_lost");
	it_raw_close(&r);
	/* Drain the events of this recovery. */
	while (next_event(2, &ev) && strcmp(ev.state, "ready") != 0)
		;
	while (next_event(0.3, &ev))
		;
}

int main(void)
{
	static const char *const args[] = { "--heartbeat-ms", "500", "--failed-retry-ms", "500", NULL };
	struct it_daemon_opts opts = { .extra_args = args };
	regen_client *c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	it_daemon_start(&daemon_, &opts, 200);
	c = it_connect(&daemon_);
	subscribe();
	it_log("scenario: crash");
	scenario_crash(c);
	it_log("scenario: device_lost");
	scenario_device_lost(c);
	it_log("scenario: stopped worker");
	scenario_stopped(c);
	it_log("scenario: hang");
	scenario_hang(c);
	it_log("scenario: XIDs");
	scenario_xids(c);
	it_log("scenario: deadline_ms refused");
	scenario_deadline_refused(c);
	it_log("scenario: errors carry device and generation");
	scenario_errors_carry_generation(c);
	regen_client_destroy(c);
	it_raw_close(&watch_);
	it_log("PASS");
	return 0;
}
