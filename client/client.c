/* libregen: connections, calls, errors, status and lifecycle. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "regen-config.h"
#include "private.h"
#include "proto/errors.h"
#include "proto/message.h"

#define DEFAULT_TIMEOUT_S 60.0

int64_t rc_json_int(const cJSON *obj, const char *key, int64_t def)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);

	if (!cJSON_IsNumber(it)) {
		return def;
	}
	return (int64_t)it->valuedouble;
}

void rc_json_str(const cJSON *obj, const char *key, char *dst, size_t size)
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
}

void rc_set_local_error(regen_client *c, const char *fmt, ...)
{
	va_list ap;

	rc_clear_error(c);
	va_start(ap, fmt);
	vsnprintf(c->err_message, sizeof(c->err_message), fmt, ap);
	va_end(ap);
}

static void note_generation(regen_client *c, int64_t device, int64_t generation)
{
	if (device >= 0 && device < REGEN_DEVICES_MAX && generation > 0 &&
	    (uint64_t)generation > c->known_generation[device]) {
		c->known_generation[device] = (uint64_t)generation;
	}
}

static void set_remote_error(regen_client *c, const char *name, const cJSON *params)
{
	rc_clear_error(c);
	snprintf(c->err_name, sizeof(c->err_name), "%s", name);
	if (params != NULL) {
		rc_json_str(params, "message", c->err_message, sizeof(c->err_message));
		c->err_params = cJSON_PrintUnformatted(params);
		if (strcmp(name, RP_ERR_STALE_GENERATION) == 0 ||
		    strcmp(name, RP_ERR_DEVICE_LOST) == 0 ||
		    strcmp(name, RP_ERR_DRAINING) == 0) {
			note_generation(c, rc_json_int(params, "device", -1),
					rc_json_int(params, "generation", 0));
		}
	}
}

REGEN_EXPORT int regen_client_connect(const char *socket_path, regen_client **out)
{
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
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		return -ENOMEM;
	}
	if (strlen(socket_path) >= sizeof(c->socket_path)) {
		r = -ENAMETOOLONG;
		goto fail;
	}
	snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path);
	c->timeout_s = DEFAULT_TIMEOUT_S;
	rc_conn_init(&c->main);
	for (i = 0; i < REGEN_DEVICES_MAX; i++) {
		rc_conn_init(&c->worker[i]);
	}
	/* The first connection is tried once: a daemon that is not there is
	 * reported at once, not waited for. */
	r = rc_conn_open(&c->main, c->socket_path, rc_deadline(c->timeout_s), false);
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
	struct regen_buffer *b;
	int i;

	if (c == NULL) {
		return;
	}
	/* Buffers still open outlive their client only as ids: closing one
	 * later just frees it. */
	for (b = c->buffers; b != NULL; b = b->next) {
		b->client = NULL;
	}
	rc_conn_close(&c->main);
	rp_rx_finish(&c->main.rx);
	for (i = 0; i < REGEN_DEVICES_MAX; i++) {
		rc_conn_close(&c->worker[i]);
		rp_rx_finish(&c->worker[i].rx);
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

REGEN_EXPORT const char *regen_client_socket_path(const regen_client *c)
{
	return c != NULL ? c->socket_path : NULL;
}

static int ensure_main(regen_client *c, int64_t deadline)
{
	if (rc_conn_is_open(&c->main) && !rc_conn_peer_gone(&c->main)) {
		return 0;
	}
	/* The daemon may be restarting: wait for it until the deadline. */
	return rc_conn_open(&c->main, c->socket_path, deadline, true);
}

static int exchange(regen_client *c, struct rc_conn *conn, const char *text,
		    const int *fds, size_t nfds, int64_t deadline, cJSON **reply);

/* Finds the device's worker socket through Status and connects to it. A
 * worker being respawned has no socket for a moment, or an old path that
 * refuses: both are retried until the deadline. */
static int ensure_worker(regen_client *c, int device, int64_t deadline)
{
	struct rc_conn *w = &c->worker[device];
	struct regen_status *st = NULL;
	char *text = NULL;
	cJSON *reply = NULL;
	int i, r, delay_ms = 10;
	const char *path;

	if (rc_conn_is_open(w) && !rc_conn_peer_gone(w)) {
		return 0;
	}
	rc_conn_close(w);
	st = malloc(sizeof(*st));
	text = rp_build_call("io.regen.Device.Status", NULL, false, false);
	if (st == NULL || text == NULL) {
		r = -ENOMEM;
		goto out;
	}
	for (;;) {
		r = ensure_main(c, deadline);
		if (r < 0) {
			goto out;
		}
		r = exchange(c, &c->main, text, NULL, 0, deadline, &reply);
		if (r < 0) {
			goto out;
		}
		r = rc_parse_status(c, reply, st);
		cJSON_Delete(reply);
		reply = NULL;
		if (r < 0) {
			goto out;
		}
		path = NULL;
		for (i = 0; i < st->ndevices; i++) {
			if (st->devices[i].index == device) {
				path = st->devices[i].worker_socket;
				break;
			}
		}
		if (path == NULL) {
			rc_set_local_error(c, "regend serves no device %d", device);
			r = -ENODEV;
			goto out;
		}
		if (path[0] != '\0') {
			r = rc_conn_open(w, path, deadline, false);
			if (r == 0) {
				goto out;
			}
			if (r != -ENOENT && r != -ECONNREFUSED && r != -EAGAIN) {
				goto out;
			}
		}
		if (deadline != RC_FOREVER && rc_now_ms() + delay_ms >= deadline) {
			r = -ETIMEDOUT;
			goto out;
		}
		usleep((useconds_t)delay_ms * 1000);
		if (delay_ms < 200) {
			delay_ms *= 2;
		}
	}
out:
	cJSON_Delete(reply);
	free(text);
	free(st);
	return r;
}

/* One call and its reply on `conn`. A broken connection or a timeout closes
 * it: the next call opens a fresh one (a late reply must not be taken for
 * the next call's). */
static int exchange(regen_client *c, struct rc_conn *conn, const char *text,
		    const int *fds, size_t nfds, int64_t deadline, cJSON **reply)
{
	struct rp_msg msg = { 0 };
	struct rp_call call = { 0 };
	struct rp_error perr = { 0 };
	bool parsed = false;
	int r;

	rc_clear_error(c);
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
		set_remote_error(c, call.error, call.params);
		r = -EREMOTE;
		goto out;
	}
	if (reply != NULL) {
		*reply = call.params != NULL ? cJSON_Duplicate(call.params, true) : cJSON_CreateObject();
		if (*reply == NULL) {
			r = -ENOMEM;
			goto out;
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
	return r;
}

int rc_call(regen_client *c, int device, const char *method, const cJSON *params,
	    const int *fds, size_t nfds, cJSON **reply)
{
	int64_t deadline = rc_deadline(c->timeout_s);
	struct rc_conn *conn;
	char *text = NULL;
	int r;

	if (reply != NULL) {
		*reply = NULL;
	}
	if (device >= REGEN_DEVICES_MAX) {
		return -ENODEV;
	}
	text = rp_build_call(method, params, false, false);
	if (text == NULL) {
		return -ENOMEM;
	}
	if (device < 0) {
		conn = &c->main;
		r = ensure_main(c, deadline);
	} else {
		conn = &c->worker[device];
		r = ensure_worker(c, device, deadline);
	}
	if (r < 0) {
		if (r != -EREMOTE && regen_client_error_message(c) == NULL) {
			rc_set_local_error(c, "cannot connect to %s: %s",
					   device < 0 ? c->socket_path : "the worker socket", strerror(-r));
		}
		goto out;
	}
	r = exchange(c, conn, text, fds, nfds, deadline, reply);
out:
	free(text);
	return r;
}

int rc_parse_status(regen_client *c, const cJSON *params, struct regen_status *out)
{
	const cJSON *devs, *d;
	struct regen_device_info *di;

	memset(out, 0, sizeof(*out));
	out->epoch = (uint64_t)rc_json_int(params, "epoch", 0);
	out->elapsed_us = (uint64_t)rc_json_int(params, "elapsed_us", 0);
	devs = cJSON_GetObjectItemCaseSensitive(params, "devices");
	if (devs == NULL) {
		return 0;
	}
	if (!cJSON_IsArray(devs)) {
		return -EPROTO;
	}
	cJSON_ArrayForEach(d, devs) {
		if (out->ndevices >= REGEN_DEVICES_MAX) {
			break;
		}
		if (!cJSON_IsObject(d)) {
			return -EPROTO;
		}
		di = &out->devices[out->ndevices++];
		di->index = (int)rc_json_int(d, "index", out->ndevices - 1);
		di->generation = (uint64_t)rc_json_int(d, "generation", 0);
		rc_json_str(d, "state", di->state, sizeof(di->state));
		rc_json_str(d, "backend", di->backend, sizeof(di->backend));
		rc_json_str(d, "worker_socket", di->worker_socket, sizeof(di->worker_socket));
		di->worker_pid = rc_json_int(d, "worker_pid", 0);
		di->respawns = (uint64_t)rc_json_int(d, "respawns", 0);
		di->memory_used = (uint64_t)rc_json_int(d, "memory_used", 0);
		di->memory_baseline = (uint64_t)rc_json_int(d, "memory_baseline", 0);
		rc_json_str(d, "reason", di->reason, sizeof(di->reason));
		if (c != NULL) {
			note_generation(c, di->index, (int64_t)di->generation);
		}
	}
	return 0;
}

static int status_call(regen_client *c, const char *method, const cJSON *params, struct regen_status *out)
{
	struct regen_status tmp;
	cJSON *reply = NULL;
	int r;

	if (c == NULL) {
		return -EINVAL;
	}
	r = rc_call(c, -1, method, params, NULL, 0, &reply);
	if (r < 0) {
		return r;
	}
	r = rc_parse_status(c, reply, out != NULL ? out : &tmp);
	if (r < 0) {
		rc_set_local_error(c, "%s: reply has a malformed device list", method);
	}
	cJSON_Delete(reply);
	return r;
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
	rc_json_str(reply, "vendor", out->vendor, sizeof(out->vendor));
	rc_json_str(reply, "product", out->product, sizeof(out->product));
	rc_json_str(reply, "version", out->version, sizeof(out->version));
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

REGEN_EXPORT int regen_status(regen_client *c, struct regen_status *out)
{
	return status_call(c, "io.regen.Device.Status", NULL, out);
}

REGEN_EXPORT int regen_generation(regen_client *c, struct regen_status *out)
{
	return status_call(c, "io.regen.Device.Generation", NULL, out);
}

static int lifecycle(regen_client *c, const char *method, int device, const char *reason,
		     int deadline_ms, struct regen_status *out)
{
	cJSON *p = cJSON_CreateObject();
	int r = -ENOMEM;

	if (p == NULL) {
		return -ENOMEM;
	}
	if (device >= 0 && cJSON_AddNumberToObject(p, "device", device) == NULL) {
		goto out;
	}
	if (reason != NULL && reason[0] != '\0' && cJSON_AddStringToObject(p, "reason", reason) == NULL) {
		goto out;
	}
	if (deadline_ms > 0 && cJSON_AddNumberToObject(p, "deadline_ms", deadline_ms) == NULL) {
		goto out;
	}
	r = status_call(c, method, p, out);
out:
	cJSON_Delete(p);
	return r;
}

REGEN_EXPORT int regen_release(regen_client *c, int device, const char *reason, struct regen_status *out)
{
	return lifecycle(c, "io.regen.Device.Release", device, reason, 0, out);
}

REGEN_EXPORT int regen_reset(regen_client *c, int device, const char *reason, struct regen_status *out)
{
	return lifecycle(c, "io.regen.Device.Reset", device, reason, 0, out);
}

REGEN_EXPORT int regen_restart(regen_client *c, int device, const char *reason, int deadline_ms, struct regen_status *out)
{
	return lifecycle(c, "io.regen.Device.Restart", device, reason, deadline_ms, out);
}

REGEN_EXPORT int regen_inject_fault(regen_client *c, int device, const char *kind)
{
	cJSON *p;
	int r = -ENOMEM;

	if (c == NULL || kind == NULL) {
		return -EINVAL;
	}
	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	if (cJSON_AddNumberToObject(p, "device", device) == NULL ||
	    cJSON_AddStringToObject(p, "kind", kind) == NULL) {
		goto out;
	}
	r = rc_call(c, -1, "io.regen.Device.InjectFault", p, NULL, 0, NULL);
out:
	cJSON_Delete(p);
	return r;
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

/* Watch: its own connection, one call with "more", one callback per reply. */
REGEN_EXPORT int regen_watch_full(regen_client *c, double timeout_s, double total_s,
				  regen_watch_cb cb, void *userdata)
{
	int64_t total = rc_deadline(total_s);
	struct rc_conn conn;
	struct rp_msg msg = { 0 };
	struct rp_call call = { 0 };
	struct rp_error perr = { 0 };
	struct regen_watch_event ev;
	bool parsed = false;
	int64_t deadline;
	char *text = NULL;
	int r;

	if (c == NULL || cb == NULL) {
		return -EINVAL;
	}
	rc_clear_error(c);
	rc_conn_init(&conn);
	text = rp_build_call("io.regen.Device.Watch", NULL, true, false);
	if (text == NULL) {
		r = -ENOMEM;
		goto out;
	}
	deadline = rc_deadline(c->timeout_s);
	if (total < deadline) {
		deadline = total;
	}
	r = rc_conn_open(&conn, c->socket_path, deadline, false);
	if (r < 0) {
		rc_set_local_error(c, "cannot connect to %s: %s", c->socket_path, strerror(-r));
		goto out;
	}
	r = rc_conn_send(&conn, text, NULL, 0, deadline);
	if (r < 0) {
		goto out;
	}
	for (;;) {
		deadline = rc_deadline(timeout_s);
		if (total < deadline) {
			deadline = total;
		}
		r = rc_conn_recv(&conn, &msg, deadline);
		if (r < 0) {
			if (r == -ETIMEDOUT) {
				rc_set_local_error(c, "no Watch event before the timeout");
			} else if (r == -ECONNRESET) {
				rc_set_local_error(c, "the Watch connection ended");
			}
			goto out;
		}
		r = rp_call_parse(msg.text, msg.len, &call, &perr);
		rc_msg_drop(&msg);
		if (r < 0) {
			rc_set_local_error(c, "unparsable Watch reply");
			rp_error_clear(&perr);
			r = -EPROTO;
			goto out;
		}
		parsed = true;
		if (call.error != NULL) {
			set_remote_error(c, call.error, call.params);
			r = -EREMOTE;
			goto out;
		}
		memset(&ev, 0, sizeof(ev));
		ev.epoch = (uint64_t)rc_json_int(call.params, "epoch", 0);
		ev.device = (int)rc_json_int(call.params, "device", -1);
		ev.generation = (uint64_t)rc_json_int(call.params, "generation", 0);
		rc_json_str(call.params, "state", ev.state, sizeof(ev.state));
		rc_json_str(call.params, "reason", ev.reason, sizeof(ev.reason));
		note_generation(c, ev.device, (int64_t)ev.generation);
		if (cb(&ev, userdata) != 0) {
			r = 0;
			goto out;
		}
		if (!call.continues) {
			/* The daemon ended the stream. */
			r = 0;
			goto out;
		}
		rp_call_finish(&call);
		parsed = false;
	}
out:
	if (parsed) {
		rp_call_finish(&call);
	}
	rc_msg_drop(&msg);
	rc_conn_close(&conn);
	rp_rx_finish(&conn.rx);
	free(text);
	return r;
}

REGEN_EXPORT int regen_watch(regen_client *c, double timeout_s, regen_watch_cb cb, void *userdata)
{
	return regen_watch_full(c, timeout_s, 0, cb, userdata);
}
