/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Memory on a worker socket: imports of buffers and events, and
 * their close. Parameters and replies go through proto/memory.h's codecs;
 * an import's id is the caller's alone (objects.c). */
#include <errno.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/worker/session.h"
#include "proto/errors.h"
#include "proto/memory.h"

_Static_assert((int)RD_BUFFER_HOST_FD == (int)RP_BUFFER_HOST_FD && (int)RD_BUFFER_CUDA_IPC == (int)RP_BUFFER_CUDA_IPC &&
		       (int)RD_BUFFER_CUDA_FD == (int)RP_BUFFER_CUDA_FD,
	       "the backend's buffer kinds are the protocol's");

void rd_memory_import_buffer(struct rd_call *call)
{
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_import_buffer req;
	struct rd_import imp = { .fd = -1 };
	struct rd_buffer *buf = NULL;
	const char *kind;
	char id[RP_ID_MAX];
	int r;

	if (rp_import_buffer_decode(call->msg.params, w->dev.index, &req, &err) < 0 ||
	    rd_worker_refuse_if_not_ready(w, &err) < 0)
		goto fail;
	kind = rp_buffer_kind_name(req.kind);
	if (s->client->count[RD_OBJECT_BUFFER] >= w->opts->max_buffers) {
		rp_err_limit_exceeded(&err, "buffers", w->opts->max_buffers, "process %d already has %u buffers on device %d",
				      (int)s->client->peer.pid, s->client->count[RD_OBJECT_BUFFER], w->dev.index);
		goto fail;
	}
	/* Each import is mapped into this worker: its address space is
	 * shared by every user, so a uid's imports together are bounded,
	 * whatever their files hold (a sparse memfd of 128 TiB holds
	 * nothing). */
	uint64_t uid_bytes = rd_objects_use_of_uid(&w->objects, s->client->peer.uid).import_bytes;
	uint64_t uid_max = w->opts->max_import_gib << 30;
	if (req.size > uid_max || uid_bytes > uid_max - req.size) {
		rp_err_limit_exceeded(&err, "import bytes", (long long)uid_max,
				      "uid %u's imports on device %d would span %llu bytes with this one of %llu, more "
				      "than max_import_gib (%llu GiB); close some",
				      (unsigned)s->client->peer.uid, w->dev.index,
				      (unsigned long long)(uid_bytes + req.size), (unsigned long long)req.size,
				      (unsigned long long)w->opts->max_import_gib);
		goto fail;
	}
	if (rp_import_buffer_check_source(&req, call->raw.fds, call->raw.nfds, &err) < 0)
		goto fail;
	imp.kind = (enum rd_buffer_kind)req.kind;
	imp.size = req.size;
	imp.offset = req.offset;
	if (req.kind == RP_BUFFER_CUDA_IPC)
		memcpy(imp.handle, req.handle, sizeof(imp.handle));
	else
		imp.fd = call->raw.fds[req.fd];
	r = w->dev.backend->import_buffer(&w->dev, &imp, &buf, &err);
	if (r < 0) {
		if (!err.name)
			rp_err_import_failed(&err, kind, "%s import failed: %s", kind, strerror(-r));
		goto fail;
	}
	if (req.kind != RP_BUFFER_CUDA_IPC)
		call->raw.fds[req.fd] = -1;   /* the backend owns it now */
	buf->device = &w->dev;
	buf->kind = imp.kind;
	buf->offset = imp.offset;
	rd_objects_add(&w->objects, &buf->obj, RD_OBJECT_BUFFER, s->client);
	rd_usage_object_added(s->usage, &buf->obj, RD_OBJECT_BUFFER, buf->size);
	rd_debug("memory", w->dev.index, rd_worker_generation(w), s->client->peer.pid, "imported %s %s, %llu bytes",
		 kind, rp_id_format(&buf->obj.id, id), (unsigned long long)buf->size);
	struct rp_import_buffer_reply reply = { .buffer = buf->obj.id, .size = buf->size };
	rd_call_reply(call, rp_import_buffer_reply_encode(&reply), false);
	return;
fail:
	rd_call_fail(call, &err);
}

/* CloseBuffer and CloseEvent: the id must name an object of the caller's
 * process in the current generation. */
static void close_object(struct rd_call *call, enum rd_object_kind kind)
{
	const char *param = kind == RD_OBJECT_EVENT ? "event" : "buffer";
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rd_object *o;
	struct rp_id id;

	if (rp_close_object_decode(call->msg.params, kind == RD_OBJECT_EVENT ? RP_ID_EVENT : RP_ID_BUFFER, &id, &err) < 0 ||
	    rd_objects_find(&w->objects, &id, kind, s->client, param, &o, &err) < 0) {
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
	struct rd_session *s = rd_session_of(call);
	struct rd_worker *w = s->worker;
	struct rp_error err = { 0 };
	struct rp_import_event req;
	struct rd_event *ev;

	if (rp_import_event_decode(call->msg.params, w->dev.index, &req, &err) < 0)
		goto fail;
	if (!w->dev.backend->import_event) {
		rp_error_set(&err, RP_ERR_METHOD_NOT_IMPLEMENTED, "%s", "");
		cJSON_DeleteItemFromObject(err.params, "message");
		rp_error_add_str(&err, "method", call->msg.method);
		goto fail;
	}
	/* Each event is a driver object of this worker's, open until closed:
	 * a process holds a bounded number, as it does buffers. */
	if (s->client->count[RD_OBJECT_EVENT] >= w->opts->max_events) {
		rp_err_limit_exceeded(&err, "events", w->opts->max_events,
				      "process %d already has %u events on device %d (max_events): close one first",
				      (int)s->client->peer.pid, s->client->count[RD_OBJECT_EVENT], w->dev.index);
		goto fail;
	}
	if (rd_worker_refuse_if_not_ready(w, &err) < 0 || w->dev.backend->import_event(&w->dev, req.handle, &ev, &err) < 0)
		goto fail;
	ev->device = &w->dev;
	rd_objects_add(&w->objects, &ev->obj, RD_OBJECT_EVENT, s->client);
	rd_usage_object_added(s->usage, &ev->obj, RD_OBJECT_EVENT, 0);
	struct rp_import_event_reply reply = { .event = ev->obj.id };
	rd_call_reply(call, rp_import_event_reply_encode(&reply), false);
	return;
fail:
	rd_call_fail(call, &err);
}
