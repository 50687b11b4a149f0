/* io.regen.Memory on a worker socket: imports of buffers and events, and
 * their close. An import's id is the caller's alone (objects.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/errors.h"
#include "proto/params.h"

static int check_device_param(const struct rd_worker *w, const cJSON *params, struct rp_error *err)
{
	uint64_t device;
	int r = rp_params_uint(params, "device", UINT32_MAX, 0, &device, err);

	if (r < 0)
		return r;
	if (device != (uint64_t)w->dev.index) {
		rp_err_no_such_device(err, (long long)device, "this socket serves device %d, not %llu", w->dev.index,
				      (unsigned long long)device);
		return -EINVAL;
	}
	return 0;
}

static int parse_hex64(const char *hex, unsigned char out[64])
{
	if (strlen(hex) != 128)
		return -EINVAL;
	for (int i = 0; i < 64; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1 || !((hex[2 * i] >= '0' && hex[2 * i] <= '9') ||
							     (hex[2 * i] >= 'a' && hex[2 * i] <= 'f') ||
							     (hex[2 * i] >= 'A' && hex[2 * i] <= 'F')))
			return -EINVAL;
		out[i] = (unsigned char)v;
	}
	return 0;
}

void rd_memory_import_buffer(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, true },
		{ "kind", RP_T_STRING, true },
		{ "size", RP_T_INT, true },
		{ "offset", RP_T_INT, false },
		{ "fd", RP_T_INT, false },
		{ "handle", RP_T_STRING, false },
		{ NULL },
	};
	static const char *const kinds[] = { "host_fd", "cuda_ipc", "cuda_fd", NULL };
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rd_import req = { .fd = -1 };
	struct rd_buffer *buf = NULL;
	const char *handle = NULL;
	uint64_t fd_index = 0;
	int kind, r, has_fd;
	char id[RP_ID_MAX];

	if (rp_params_check(call->msg.params, fields, &err) < 0 || check_device_param(w, call->msg.params, &err) < 0 ||
	    rp_params_enum(call->msg.params, "kind", kinds, -1, &kind, &err) < 0 ||
	    rp_params_uint(call->msg.params, "size", UINT64_C(1) << 48, 0, &req.size, &err) < 0 ||
	    rp_params_uint(call->msg.params, "offset", UINT64_C(1) << 48, 0, &req.offset, &err) < 0 ||
	    (has_fd = rp_params_uint(call->msg.params, "fd", RP_FDS_MAX - 1, 0, &fd_index, &err)) < 0 ||
	    rp_params_string(call->msg.params, "handle", 128, NULL, &handle, &err) < 0)
		goto fail;
	if (req.size == 0) {
		rp_error_invalid_parameter(&err, "size");
		goto fail;
	}
	/* Each kind takes its own field; the other one is a mistake, not noise. */
	if (kind == RD_BUFFER_CUDA_IPC && has_fd == 0) {
		rp_error_invalid_parameter(&err, "fd");
		goto fail;
	}
	if (kind != RD_BUFFER_CUDA_IPC && handle) {
		rp_error_invalid_parameter(&err, "handle");
		goto fail;
	}
	req.kind = (enum rd_buffer_kind)kind;
	if (rd_worker_refuse_if_not_ready(w, &err) < 0)
		goto fail;
	if (s->client->count[RD_OBJECT_BUFFER] >= w->opts->max_buffers) {
		rp_err_limit_exceeded(&err, "buffers", w->opts->max_buffers, "process %d already has %u buffers on device %d",
				      (int)s->client->pid, s->client->count[RD_OBJECT_BUFFER], w->dev.index);
		goto fail;
	}
	if (req.kind == RD_BUFFER_CUDA_IPC) {
		if (!handle || parse_hex64(handle, req.handle) < 0) {
			rp_err_import_failed(&err, "cuda_ipc",
					     "cuda_ipc needs 'handle': the 64-byte cudaIpcMemHandle_t as 128 hex digits");
			goto fail;
		}
	} else {
		if (has_fd == 1 || fd_index >= call->raw.nfds || call->raw.fds[fd_index] < 0) {
			rp_err_import_failed(&err, kinds[kind],
					     "%s needs 'fd': the index of a file descriptor passed with this message (%zu passed)",
					     kinds[kind], call->raw.nfds);
			goto fail;
		}
		req.fd = call->raw.fds[fd_index];
	}
	r = w->dev.backend->import_buffer(&w->dev, &req, &buf, &err);
	if (r < 0) {
		if (!err.name)
			rp_err_import_failed(&err, kinds[kind], "%s import failed: %s", kinds[kind], strerror(-r));
		goto fail;
	}
	if (req.kind != RD_BUFFER_CUDA_IPC)
		call->raw.fds[fd_index] = -1;   /* the backend owns it now */
	buf->device = &w->dev;
	buf->kind = req.kind;
	rd_objects_add(&w->objects, &buf->obj, RD_OBJECT_BUFFER, s->client);
	rd_debug("memory", w->dev.index, rd_worker_generation(w), s->client->pid, "imported %s %s, %llu bytes",
		 kinds[kind], rp_id_format(&buf->obj.id, id), (unsigned long long)buf->size);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "buffer", rp_id_format(&buf->obj.id, id));
	cJSON_AddNumberToObject(reply, "generation", (double)buf->obj.id.generation);
	cJSON_AddNumberToObject(reply, "size", (double)buf->size);
	rd_call_reply(call, reply, false);
	return;
fail:
	rd_call_fail(call, &err);
}

static int parse_id_param(const cJSON *params, const char *name, struct rp_id *id, struct rp_error *err)
{
	const char *text;
	int r = rp_params_string(params, name, RP_ID_MAX - 1, NULL, &text, err);

	if (r < 0)
		return r;
	if (r == 1 || rp_id_parse(text, id) < 0)
		return rp_error_invalid_parameter(err, name);
	return 0;
}

/* CloseBuffer and CloseEvent: the id must name an object of the caller's
 * process in the current generation. */
static void close_object(struct rd_call *call, enum rd_object_kind kind)
{
	static const struct rp_field buffer_fields[] = { { "buffer", RP_T_STRING, true }, { NULL } };
	static const struct rp_field event_fields[] = { { "event", RP_T_STRING, true }, { NULL } };
	const char *param = kind == RD_OBJECT_EVENT ? "event" : "buffer";
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rd_object *o;
	struct rp_id id;

	if (rp_params_check(call->msg.params, kind == RD_OBJECT_EVENT ? event_fields : buffer_fields, &err) < 0 ||
	    parse_id_param(call->msg.params, param, &id, &err) < 0 ||
	    rd_objects_find(&w->objects, &id, kind, s->client->pid, param, &o, &err) < 0) {
		rd_call_fail(call, &err);
		return;
	}
	rd_objects_close(&w->objects, o);
	rd_call_reply(call, NULL, false);
}

void rd_memory_close_buffer(struct rd_call *call)
{
	close_object(call, RD_OBJECT_BUFFER);
}

void rd_memory_close_event(struct rd_call *call)
{
	close_object(call, RD_OBJECT_EVENT);
}

void rd_memory_import_event(struct rd_call *call)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, true },
		{ "handle", RP_T_STRING, true },
		{ NULL },
	};
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	unsigned char handle[64];
	const char *hex;
	struct rd_event *ev;
	char id[RP_ID_MAX];

	if (rp_params_check(call->msg.params, fields, &err) < 0 || check_device_param(w, call->msg.params, &err) < 0 ||
	    rp_params_string(call->msg.params, "handle", 128, NULL, &hex, &err) < 0)
		goto fail;
	if (parse_hex64(hex, handle) < 0) {
		rp_error_invalid_parameter(&err, "handle");
		goto fail;
	}
	if (!w->dev.backend->import_event) {
		rp_error_set(&err, RP_ERR_METHOD_NOT_IMPLEMENTED, "%s", "");
		cJSON_DeleteItemFromObject(err.params, "message");
		rp_error_add_str(&err, "method", call->msg.method);
		goto fail;
	}
	if (rd_worker_refuse_if_not_ready(w, &err) < 0 || w->dev.backend->import_event(&w->dev, handle, &ev, &err) < 0)
		goto fail;
	ev->device = &w->dev;
	rd_objects_add(&w->objects, &ev->obj, RD_OBJECT_EVENT, s->client);
	cJSON *reply = cJSON_CreateObject();
	cJSON_AddStringToObject(reply, "event", rp_id_format(&ev->obj.id, id));
	cJSON_AddNumberToObject(reply, "generation", (double)ev->obj.id.generation);
	rd_call_reply(call, reply, false);
	return;
fail:
	rd_call_fail(call, &err);
}
