/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/supervisor/worker_process.h without processes: the supervisor's
 * device code (device.c) runs unchanged on top, and the harness plays each
 * worker. What the real file does at each point is said beside it. */
#include <errno.h>
#include <stdlib.h>
#include "fuzz_daemon.h"
#include "daemon/worker/worker.h"

#define WORKERS_MAX 8

static struct fz_worker workers[WORKERS_MAX];
static unsigned nworkers;
static unsigned next_serial = 1;
bool fz_worker_spawn_fails;

/* Stand-ins for the handles: never dereferenced by device.c, only tested
 * against NULL. */
static uv_process_t fake_process;
static struct rd_conn fake_channel;

struct fz_worker *fz_worker_of(struct rd_sv_worker *w)
{
	for (unsigned i = 0; i < nworkers; i++)
		if (workers[i].w == w)
			return &workers[i];
	return NULL;
}

static void free_calls(struct fz_worker *fw)
{
	while (fw->calls) {
		struct fz_ctl_call *c = fw->calls;
		fw->calls = c->next;
		cJSON_Delete(c->params);
		free(c);
	}
	fw->ncalls = 0;
}

void fz_workers_reset(void)
{
	for (unsigned i = 0; i < nworkers; i++)
		free_calls(&workers[i]);
	memset(workers, 0, sizeof(workers));
	nworkers = 0;
	next_serial = 1;
	fz_worker_spawn_fails = false;
}

void rd_sv_worker_init(struct rd_sv_worker *w, uv_loop_t *loop, int device, const struct rd_sv_worker_events *events,
		       void *data)
{
	struct fz_worker *fw = fz_worker_of(w);

	memset(w, 0, sizeof(*w));
	w->loop = loop;
	w->device = device;
	w->events = events;
	w->data = data;
	if (!fw) {
		FZ_CHECK(nworkers < WORKERS_MAX, "more workers than the stand-in holds");
		fw = &workers[nworkers++];
	}
	free_calls(fw);
	memset(fw, 0, sizeof(*fw));
	fw->w = w;
}

/* The real one starts a process with a control channel on a socketpair. */
int rd_sv_worker_spawn(struct rd_sv_worker *w, const char *exe, const struct rd_options *wopts, int programs_fd)
{
	struct fz_worker *fw = fz_worker_of(w);

	FZ_CHECK(fw != NULL, "spawn of a worker never initialised");
	if (fz_worker_spawn_fails)
		return -EAGAIN;
	FZ_CHECK(!fw->running && w->proc == NULL, "a second worker spawned while one runs (device %d)", w->device);
	fw->running = true;
	fw->channel = true;
	fw->ready = false;
	fw->killed = 0;
	fw->spawns++;
	w->proc = &fake_process;
	w->pid = 1000 + (int)fw->spawns;
	w->ctl = &fake_channel;
	return 0;
}

bool rd_sv_worker_running(const struct rd_sv_worker *w)
{
	return w->proc != NULL;
}

/* The real one signals the process; its exit comes later, through the
 * loop: here, when the harness says. */
void rd_sv_worker_kill(struct rd_sv_worker *w, int signum)
{
	struct fz_worker *fw = fz_worker_of(w);

	if (!w->proc)
		return;
	fw->killed = signum;
	fw->kills++;
}

/* The real one makes a call on the channel's rd_conn: -ENOTCONN without a
 * channel (or once it closed), else the reply (or NULL when the channel
 * closes first) comes later. */
int rd_sv_worker_call(struct rd_sv_worker *w, const char *method, cJSON *params, bool oneway, rd_reply_cb cb,
		      void *userdata)
{
	struct fz_worker *fw = fz_worker_of(w);
	struct fz_ctl_call *c, **tail;

	if (!w->ctl || !fw->channel) {
		cJSON_Delete(params);
		return -ENOTCONN;
	}
	if (oneway) {
		fw->oneway_calls++;
		cJSON_Delete(params);
		return 0;
	}
	c = calloc(1, sizeof(*c));
	FZ_CHECK(c != NULL, "out of memory");
	c->serial = next_serial++;
	snprintf(c->method, sizeof(c->method), "%s", method);
	c->params = params;
	c->cb = cb;
	c->userdata = userdata;
	for (tail = &fw->calls; *tail; tail = &(*tail)->next)
		;
	*tail = c;
	fw->ncalls++;
	return 0;
}

void fz_worker_ready(struct fz_worker *fw, const cJSON *health)
{
	struct rd_sv_worker_ready ready = {
		.backend = "stub",
		.worker_socket = "/run/regen/fuzz.sock.dev0",
		.memory_used = 8192,
		.memory_baseline = 4096,
		.health = health,
	};

	if (!fw->channel)
		return;
	fw->ready = true;
	fw->w->events->ready(fw->w->data, &ready);
}

void fz_worker_faulted(struct fz_worker *fw, enum rd_sv_fault kind, const char *reason, const cJSON *health,
		       int64_t uid)
{
	if (fw->channel)
		fw->w->events->faulted(fw->w->data, kind, reason, health, uid);
}

unsigned fz_ctl_next_serial(void)
{
	return next_serial;
}

bool fz_worker_answer(struct fz_worker *fw, const struct rp_call *reply)
{
	struct fz_ctl_call *c = fw->calls;

	if (!c)
		return false;
	fw->calls = c->next;
	fw->ncalls--;
	c->cb(NULL, reply, c->userdata);
	cJSON_Delete(c->params);
	free(c);
	return true;
}

bool fz_worker_answer_ok(struct fz_worker *fw)
{
	struct rp_call reply = { 0 };
	bool r;

	if (!fw->calls)
		return false;
	reply.params = cJSON_CreateObject();
	reply.root = reply.params;
	if (strcmp(fw->calls->method, "io.regen.Worker.Drain") == 0) {
		cJSON_AddBoolToObject(reply.params, "drained", true);
		cJSON_AddNumberToObject(reply.params, "in_flight", 0);
	} else if (strcmp(fw->calls->method, "io.regen.Worker.Release") == 0 ||
		   strcmp(fw->calls->method, "io.regen.Worker.Reset") == 0) {
		cJSON_AddNumberToObject(reply.params, "memory_used", 8192);
		cJSON_AddNumberToObject(reply.params, "memory_baseline", 4096);
		cJSON_AddBoolToObject(reply.params, "healthy", true);
	} else if (strcmp(fw->calls->method, "io.regen.Worker.Stats") == 0) {
		cJSON_AddNumberToObject(reply.params, "memory_used", 8192);
		cJSON_AddNumberToObject(reply.params, "memory_baseline", 4096);
	}
	r = fz_worker_answer(fw, &reply);
	cJSON_Delete(reply.root);
	return r;
}

/* As rd_conn_close on the channel: no new call is taken, every call
 * waiting gets NULL in order, then the owner's on_close clears w->ctl. */
void fz_worker_channel_lost(struct fz_worker *fw)
{
	if (!fw->channel)
		return;
	fw->channel = false;
	while (fz_worker_answer(fw, NULL))
		;
	fw->w->ctl = NULL;
}

/* As on_process_exit: the handle goes, the channel closes, the owner hears. */
void fz_worker_exit(struct fz_worker *fw, int signal, bool device_failed)
{
	char why[96];

	if (!fw->running)
		return;
	fw->running = false;
	fw->w->proc = NULL;
	fz_worker_channel_lost(fw);
	if (signal)
		snprintf(why, sizeof(why), "worker exited (signal %d)", signal);
	else
		snprintf(why, sizeof(why), "worker exited (status %d)", device_failed ? RD_WORKER_EXIT_DEVICE_FAILED : 1);
	fw->w->events->exited(fw->w->data, why, device_failed ? RD_SV_EXIT_DEVICE_FAILED : RD_SV_EXIT_OTHER);
}
