/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: the client, its connections, calls and errors. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "regen-config.h"
#include "private.h"
#include "proto/device.h"

#define DEFAULT_TIMEOUT_S 60.0

unsigned long rc_forks;

static void fork_child(void)
{
	rc_forks++;
}

__attribute__((constructor)) static void client_watch_forks(void)
{
	pthread_atfork(NULL, NULL, fork_child);
}

/* A child shares its parent's sockets and MAP_SHARED rings: a call written
 * there would interleave with the parent's on the same stream, read the
 * parent's answers, or move the ring's counters under it, and regend would
 * take it for the parent's (the peer it knows is the parent's pid). The
 * child closes only its own copies of the fds and unmaps its own view:
 * close() and munmap() touch nothing the parent holds. The calls the parent
 * had queued are lost to the child (their answers go to the parent), and
 * the objects are the parent process's in regend: bare ids here. */
void rc_client_forget_parent(regen_client *c)
{
	struct rc_object *o;

	for (o = c->objects; o != NULL; o = o->next)
		o->client = NULL;
	c->objects = NULL;
	rc_conn_close(&c->main);
	for (int i = 0; i < REGEN_DEVICES_MAX; i++) {
		struct rc_lane *lane = &c->lanes[i];
		bool outstanding = lane->completed < lane->submitted;

		rc_conn_close(&c->worker[i]);
		rc_lane_reset(lane);
		if (outstanding)
			lane->lost_in_fork = true;
	}
	c->forks = rc_forks;
}

/* A string field of a reply into dst, "" when absent. */
static void json_str(const cJSON *obj, const char *key, char *dst, size_t size)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (size == 0) {
		return;
	}
	if (cJSON_IsString(it) && it->valuestring != NULL) {
		snprintf(dst, size, "%s", it->valuestring);
	} else {
		dst[0] = '\0';
	}
}

void rc_clear_error(regen_client *c)
{
	c->err_name[0] = '\0';
	c->err_message[0] = '\0';
	free(c->err_params);
	c->err_params = NULL;
	c->err_ticket = 0;
}

void rc_set_local_error(regen_client *c, const char *fmt, ...)
{
	va_list ap;

	rc_clear_error(c);
	va_start(ap, fmt);
	vsnprintf(c->err_message, sizeof(c->err_message), fmt, ap);
	va_end(ap);
}

void rc_note_generation(regen_client *c, int64_t device, uint64_t generation)
{
	if (device >= 0 && device < REGEN_DEVICES_MAX && generation > c->known_generation[device]) {
		c->known_generation[device] = generation;
	}
}

/* A JSON number that is an exact non-negative integer, else 0. */
static uint64_t json_uint(const cJSON *obj, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0) || it->valuedouble > 9007199254740992.0) {
		return 0;
	}
	return (uint64_t)it->valuedouble;
}

void rc_set_remote_error(regen_client *c, const char *name, const cJSON *params)
{
	const cJSON *device;

	rc_clear_error(c);
	snprintf(c->err_name, sizeof(c->err_name), "%s", name);
	if (params == NULL) {
		return;
	}
	json_str(params, "message", c->err_message, sizeof(c->err_message));
	c->err_params = cJSON_PrintUnformatted(params);
	/* These carry the device's current generation: ids older than it are
	 * gone, and closing them needs no call. */
	device = cJSON_GetObjectItemCaseSensitive(params, "device");
	if (cJSON_IsNumber(device) &&
	    (strcmp(name, REGEN_ERROR_STALE_GENERATION) == 0 || strcmp(name, REGEN_ERROR_DEVICE_LOST) == 0 ||
	     strcmp(name, REGEN_ERROR_DRAINING) == 0)) {
		rc_note_generation(c, (int64_t)device->valuedouble, json_uint(params, "generation"));
	}
}

int rc_malformed_reply(regen_client *c, const char *method, struct rp_error *err)
{
	const cJSON *field = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");

	rc_set_local_error(c, "%s: malformed reply (%s)", method,
			   cJSON_IsString(field) ? field->valuestring : "out of memory");
	rp_error_clear(err);
	return -EPROTO;
}

/* Says the client's job on a connection just opened: nothing when it has
 * none, or regend knows no SetJob (an older one: the job is metadata, not
 * worth failing for). */
static int state_job(regen_client *c, struct rc_conn *conn, int64_t deadline)
{
	cJSON *params;
	int r;

	if (c->job[0] == '\0' || c->job_unsupported) {
		return 0;
	}
	params = cJSON_CreateObject();
	if (params == NULL || cJSON_AddStringToObject(params, "job", c->job) == NULL) {
		cJSON_Delete(params);
		return -ENOMEM;
	}
	r = rc_exchange(c, conn, "io.regen.SetJob", params, NULL, 0, deadline, NULL);
	cJSON_Delete(params);
	if (r == -EREMOTE && strcmp(c->err_name, REGEN_ERROR_METHOD_NOT_FOUND) == 0) {
		c->job_unsupported = true;
		rc_clear_error(c);
		r = 0;
	}
	return r;
}

REGEN_EXPORT int regen_client_connect(const char *socket_path, regen_client **out)
{
	const char *job = getenv("REGEN_JOB");
	regen_client *c;
	int i, r;

	if (out == NULL) {
		return -EINVAL;
	}
	*out = NULL;
	if (socket_path == NULL || socket_path[0] == '\0') {
		socket_path = getenv("REGEN_SOCKET");
	}
	if (socket_path == NULL || socket_path[0] == '\0') {
		socket_path = REGEN_DEFAULT_SOCKET;
	}
	/* A job regend would refuse fails here, before any connection. */
	if (job != NULL && job[0] != '\0' && rp_job_check(job, NULL) < 0) {
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		return -ENOMEM;
	}
	rc_conn_init(&c->main);
	for (i = 0; i < REGEN_DEVICES_MAX; i++) {
		rc_conn_init(&c->worker[i]);
	}
	if (strlen(socket_path) >= sizeof(c->socket_path)) {
		r = -ENAMETOOLONG;
		goto fail;
	}
	snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path);
	c->timeout_s = DEFAULT_TIMEOUT_S;
	c->forks = rc_forks;
	c->transport = rc_transport_from_env();
	snprintf(c->job, sizeof(c->job), "%s", job != NULL ? job : "");
	/* The first connection is tried once: a daemon that is not there is
	 * reported at once, not waited for. */
	r = rc_conn_open(&c->main, c->socket_path, rc_deadline(c->timeout_s), false);
	if (r == 0) {
		r = state_job(c, &c->main, rc_deadline(c->timeout_s));
		r = r == -EREMOTE ? -EINVAL : r;
	}
	if (r < 0) {
		goto fail;
	}
	*out = c;
	return 0;
fail:
	regen_client_destroy(c);
	return r;
}

REGEN_EXPORT void regen_client_destroy(regen_client *c)
{
	struct rc_object *o;
	int i;

	if (c == NULL) {
		return;
	}
	/* Buffers and events still open outlive their client only as ids:
	 * closing one later just frees it. */
	for (o = c->objects; o != NULL; o = o->next) {
		o->client = NULL;
	}
	rc_conn_close(&c->main);
	rp_rx_finish(&c->main.rx);
	for (i = 0; i < REGEN_DEVICES_MAX; i++) {
		rc_conn_close(&c->worker[i]);
		rp_rx_finish(&c->worker[i].rx);
		rc_lane_finish(&c->lanes[i]);
	}
	rc_clear_error(c);
	free(c);
}

REGEN_EXPORT const char *regen_client_error_name(const regen_client *c)
{
	return c != NULL && c->err_name[0] != '\0' ? c->err_name : NULL;
}

REGEN_EXPORT const char *regen_client_error_message(const regen_client *c)
{
	return c != NULL && c->err_message[0] != '\0' ? c->err_message : NULL;
}

REGEN_EXPORT const char *regen_client_error_parameters(const regen_client *c)
{
	return c != NULL ? c->err_params : NULL;
}

REGEN_EXPORT void regen_client_set_timeout(regen_client *c, double seconds)
{
	if (c != NULL) {
		c->timeout_s = seconds > 0 ? seconds : 0;
	}
}

REGEN_EXPORT int regen_client_set_job(regen_client *c, const char *job)
{
	cJSON *params;
	int d, r;

	if (c == NULL) {
		return -EINVAL;
	}
	if (job == NULL) {
		job = "";
	}
	params = cJSON_CreateObject();
	if (params == NULL || (job[0] != '\0' && cJSON_AddStringToObject(params, "job", job) == NULL)) {
		cJSON_Delete(params);
		return -ENOMEM;
	}
	/* regend judges the job (the same rule as rp_job_check), on the main
	 * connection first: a job it refuses changes nothing. */
	r = rc_call(c, -1, "io.regen.SetJob", params, NULL, 0, NULL);
	c->job_unsupported = false;
	if (r == -EREMOTE && strcmp(c->err_name, REGEN_ERROR_METHOD_NOT_FOUND) == 0) {
		/* An older regend: as at connect, no job is stated. */
		c->job_unsupported = true;
		rc_clear_error(c);
		r = 0;
	}
	if (r < 0) {
		cJSON_Delete(params);
		return r;
	}
	snprintf(c->job, sizeof(c->job), "%s", job);
	/* Each open worker connection is told after the answers it owes; one
	 * that broke states the job when it is opened again. */
	for (d = 0; d < REGEN_DEVICES_MAX; d++) {
		struct rc_conn *w = &c->worker[d];

		if (rc_conn_is_open(w) && rc_lane_settle(c, d) == 0 && rc_conn_is_open(w)) {
			rc_exchange(c, w, "io.regen.SetJob", params, NULL, 0, rc_deadline(c->timeout_s), NULL);
		}
	}
	rc_clear_error(c);
	cJSON_Delete(params);
	return 0;
}

REGEN_EXPORT const char *regen_client_job(const regen_client *c)
{
	return c != NULL ? c->job : NULL;
}

REGEN_EXPORT const char *regen_client_socket_path(const regen_client *c)
{
	return c != NULL ? c->socket_path : NULL;
}

static int ensure_main(regen_client *c, int64_t deadline)
{
	int r;

	if (rc_conn_is_open(&c->main) && !rc_conn_peer_gone(&c->main)) {
		return 0;
	}
	/* The daemon may be restarting: wait for it until the deadline. */
	r = rc_conn_open(&c->main, c->socket_path, deadline, true);
	return r < 0 ? r : state_job(c, &c->main, deadline);
}

/* Where the worker socket `reported` (Status's path, in regend's view of
 * the filesystem) is from here: beside the main socket this client uses,
 * which is where regend puts it (PATH.devN). A container that mounts
 * /run/regen elsewhere reaches it at its own path. "" stays "". */
static void worker_path_here(const regen_client *c, const char *reported, char *path, size_t size)
{
	const char *base = strrchr(reported, '/'), *dir_end = strrchr(c->socket_path, '/');

	if (!reported[0] || !base || !dir_end) {
		snprintf(path, size, "%s", reported);
		return;
	}
	snprintf(path, size, "%.*s%s", (int)(dir_end - c->socket_path), c->socket_path, base);
}

/* The device's worker socket, as Status names it, from here: "" while the
 * worker is being respawned. */
static int worker_path(regen_client *c, int device, int64_t deadline, char *path, size_t size)
{
	const struct regen_device_info *info;
	regen_status *st = NULL;
	cJSON *reply = NULL;
	int r;

	r = ensure_main(c, deadline);
	if (r == 0) {
		r = rc_exchange(c, &c->main, RP_DEVICE_STATUS, NULL, NULL, 0, deadline, &reply);
	}
	if (r == 0) {
		r = rc_status_from_reply(c, RP_DEVICE_STATUS, reply, &st);
	}
	if (r < 0) {
		return r;
	}
	info = regen_status_find_device(st, device);
	if (info == NULL) {
		rc_set_local_error(c, "regend serves no device %d", device);
		r = -ENODEV;
	} else {
		worker_path_here(c, info->worker_socket, path, size);
	}
	regen_status_free(st);
	return r;
}

/* Finds the device's worker socket through Status and connects to it. A
 * worker being respawned has no socket for a moment, or an old path that
 * refuses: both are retried until the deadline. */
int rc_ensure_worker(regen_client *c, int device, int64_t deadline)
{
	struct rc_conn *w = &c->worker[device];
	char path[sizeof(w->path)];
	int r, delay_ms = 10;

	if (rc_conn_is_open(w) && !rc_conn_peer_gone(w)) {
		return 0;
	}
	/* The lane (its ring, its calls outstanding) went with the connection.
	 * Calls it still had outstanding are told of, as a Varlink lane's
	 * settle tells (a ring lane has no replies to settle): a caller that
	 * went on silently would wait later on tickets handed out again. */
	bool lost = c->lanes[device].completed < c->lanes[device].submitted;
	rc_conn_close(w);
	rc_lane_reset(&c->lanes[device]);
	if (lost) {
		c->lanes[device].lost_told = true;   /* this return tells */
		rc_set_local_error(c, "connection to device %d's worker broke with calls in flight; they may or may "
				      "not have run", device);
		return -ECONNRESET;
	}
	for (;;) {
		r = worker_path(c, device, deadline, path, sizeof(path));
		if (r < 0) {
			return r;
		}
		if (path[0] != '\0') {
			r = rc_conn_open(w, path, deadline, false);
			if (r == 0) {
				return state_job(c, w, deadline);
			}
			if (!rc_conn_retryable(r)) {
				return r;
			}
		}
		r = rc_backoff(deadline, &delay_ms, 200);
		if (r < 0) {
			return r;
		}
	}
}

/* One call and its reply on `conn`. A broken connection or a timeout closes
 * it: the next call opens a fresh one (a late reply must not be taken for
 * the next call's). */
int rc_exchange(regen_client *c, struct rc_conn *conn, const char *method, const cJSON *params,
		const int *fds, size_t nfds, int64_t deadline, cJSON **reply)
{
	return rc_exchange_fd(c, conn, method, params, fds, nfds, deadline, reply, NULL);
}

int rc_exchange_fd(regen_client *c, struct rc_conn *conn, const char *method, const cJSON *params,
		   const int *fds, size_t nfds, int64_t deadline, cJSON **reply, int *reply_fd)
{
	struct rp_msg msg = { 0 };
	struct rp_call call = { 0 };
	struct rp_error perr = { 0 };
	bool parsed = false;
	char *text;
	int r;

	rc_clear_error(c);
	text = rp_build_call(method, params, false, false);
	if (text == NULL) {
		return -ENOMEM;
	}
	r = rc_conn_send(conn, text, fds, nfds, deadline);
	if (r < 0) {
		goto broken;
	}
	r = rc_conn_recv(conn, &msg, deadline);
	if (r < 0) {
		goto broken;
	}
	r = rp_call_parse(msg.text, msg.len, &call, &perr);
	if (r < 0) {
		rc_set_local_error(c, "unparsable reply from %s", conn->path);
		rp_error_clear(&perr);
		rc_conn_close(conn);
		r = -EPROTO;
		goto out;
	}
	parsed = true;
	if (call.method != NULL) {
		rc_set_local_error(c, "%s sent a call where a reply was expected", conn->path);
		rc_conn_close(conn);
		r = -EPROTO;
		goto out;
	}
	if (call.error != NULL) {
		rc_set_remote_error(c, call.error, call.params);
		r = -EREMOTE;
		goto out;
	}
	if (reply != NULL) {
		/* The reply's parameters move out of the parsed message. */
		*reply = cJSON_DetachItemViaPointer(call.root, call.params);
		if (*reply == NULL) {
			r = -ENOMEM;
			goto out;
		}
	}
	if (reply_fd != NULL) {
		*reply_fd = msg.nfds > 0 ? msg.fds[0] : -1;
		if (msg.nfds > 0) {
			msg.fds[0] = -1;
		}
	}
	r = 0;
	goto out;
broken:
	if (r == -ECONNRESET || r == -EPIPE) {
		rc_set_local_error(c, "connection to %s broke with the call in flight", conn->path);
		r = -ECONNRESET;
	} else if (r == -ETIMEDOUT) {
		rc_set_local_error(c, "no reply from %s before the timeout", conn->path);
	} else if (r == -EMSGSIZE) {
		rc_set_local_error(c, "reply from %s over the message size limit", conn->path);
		r = -EPROTO;
	}
	rc_conn_close(conn);
out:
	if (parsed) {
		rp_call_finish(&call);
	}
	rc_msg_drop(&msg);
	free(text);
	return r;
}

int rc_call(regen_client *c, int device, const char *method, const cJSON *params,
	    const int *fds, size_t nfds, cJSON **reply)
{
	return rc_call_fd(c, device, method, params, fds, nfds, reply, NULL);
}

int rc_call_fd(regen_client *c, int device, const char *method, const cJSON *params,
	       const int *fds, size_t nfds, cJSON **reply, int *reply_fd)
{
	int64_t deadline = rc_deadline(c->timeout_s);
	struct rc_conn *conn;
	int r;

	if (reply != NULL) {
		*reply = NULL;
	}
	rc_check_fork(c);
	if (device >= REGEN_DEVICES_MAX) {
		rc_set_local_error(c, "device %d is past the %d devices libregen reaches", device, REGEN_DEVICES_MAX);
		return -ENODEV;
	}
	if (device < 0) {
		conn = &c->main;
		r = ensure_main(c, deadline);
	} else {
		conn = &c->worker[device];
		/* Replies of calls queued without waiting come first. */
		r = rc_lane_settle(c, device);
		if (r == 0)
			r = rc_ensure_worker(c, device, deadline);
	}
	if (r < 0) {
		if (r != -EREMOTE && regen_client_error_message(c) == NULL) {
			rc_set_local_error(c, "cannot connect to %s: %s",
					   device < 0 ? c->socket_path : "the worker socket", strerror(-r));
		}
		return r;
	}
	return rc_exchange_fd(c, conn, method, params, fds, nfds, deadline, reply, reply_fd);
}

REGEN_EXPORT int regen_hello(regen_client *c, struct regen_info *out)
{
	cJSON *reply = NULL, *ifaces, *it;
	bool serves = false;
	int r;

	if (c == NULL || out == NULL) {
		return -EINVAL;
	}
	r = rc_call(c, -1, "org.varlink.service.GetInfo", NULL, NULL, 0, &reply);
	if (r < 0) {
		return r;
	}
	json_str(reply, "vendor", out->vendor, sizeof(out->vendor));
	json_str(reply, "product", out->product, sizeof(out->product));
	json_str(reply, "version", out->version, sizeof(out->version));
	ifaces = cJSON_GetObjectItemCaseSensitive(reply, "interfaces");
	cJSON_ArrayForEach(it, ifaces) {
		if (cJSON_IsString(it) && strcmp(it->valuestring, "io.regen.Device") == 0) {
			serves = true;
		}
	}
	cJSON_Delete(reply);
	if (!serves) {
		rc_set_local_error(c, "%s answers Varlink but does not serve io.regen.Device", c->socket_path);
		return -EPROTONOSUPPORT;
	}
	return 0;
}

REGEN_EXPORT int regen_call(regen_client *c, int device, const char *method, const char *params_json,
			    const int *fds, size_t nfds, char **reply)
{
	cJSON *p = NULL, *rep = NULL;
	int r;

	if (reply != NULL) {
		*reply = NULL;
	}
	if (c == NULL || method == NULL) {
		return -EINVAL;
	}
	if (params_json != NULL) {
		p = cJSON_Parse(params_json);
		if (!cJSON_IsObject(p)) {
			rc_set_local_error(c, "parameters are not a JSON object");
			cJSON_Delete(p);
			return -EINVAL;
		}
	}
	r = rc_call(c, device, method, p, fds, nfds, reply != NULL ? &rep : NULL);
	if (r == 0 && reply != NULL) {
		*reply = cJSON_PrintUnformatted(rep);
		if (*reply == NULL) {
			r = -ENOMEM;
		}
	}
	cJSON_Delete(rep);
	cJSON_Delete(p);
	return r;
}
