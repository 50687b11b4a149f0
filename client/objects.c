/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: buffers and events imported into a device's worker
 * (io.regen.Memory). Both are objects with an id of one generation; they
 * share one list, one import path and one close path. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "private.h"
#include "proto/memory.h"

static bool device_ok(int device)
{
	return device >= 0 && device < REGEN_DEVICES_MAX;
}

/* Fills in obj and links it into the client's list. */
void rc_object_add(regen_client *c, struct rc_object *obj, int device, const struct rp_id *rid)
{
	obj->client = c;
	obj->device = device;
	obj->rid = *rid;
	rp_id_format(rid, obj->id);
	rc_note_generation(c, device, rid->generation);
	obj->next = c->objects;
	if (c->objects != NULL) {
		c->objects->prev = obj;
	}
	c->objects = obj;
}

void rc_object_unlink(struct rc_object *obj)
{
	if (obj->client == NULL) {
		return;
	}
	if (obj->prev != NULL) {
		obj->prev->next = obj->next;
	} else {
		obj->client->objects = obj->next;
	}
	if (obj->next != NULL) {
		obj->next->prev = obj->prev;
	}
}

/* Closes the object in its worker, unlinks and frees it (obj is the first
 * member of its buffer or event). An object of a generation that is gone
 * was closed with its generation. keep: when regend could not be told (the
 * call got no answer: the connection broke, the time ran out), the object
 * stays as it was, for the caller to close again later, and the -errno is
 * returned; an answer, an error too, closes it. */
static int object_close(struct rc_object *obj, const char *method, bool keep)
{
	regen_client *c;
	const char *name;
	cJSON *p = NULL;
	int r = 0;

	/* In a forked child the parent's objects become bare ids here. */
	rc_check_fork(obj->client);
	c = obj->client;

	if (c == NULL || c->known_generation[obj->device] > obj->rid.generation) {
		goto out;
	}
	/* A queued record may name the object: it runs first, as a queued
	 * Varlink call would, and its index is not given to another id
	 * while one might. */
	int drained = rc_lane_drain(c, obj->device);
	rc_lane_forget(c, obj->device, &obj->rid);
	p = rp_close_object_encode((enum rp_id_kind)obj->rid.kind, &obj->rid);
	if (p == NULL) {
		r = -ENOMEM;
		goto out;
	}
	r = rc_call(c, obj->device, method, p, NULL, 0, NULL);
	if (keep && r < 0 && r != -EREMOTE) {
		cJSON_Delete(p);
		return r;
	}
	if (r == -EREMOTE) {
		name = regen_client_error_name(c);
		if (name != NULL && (strcmp(name, REGEN_ERROR_STALE_GENERATION) == 0 ||
				     strcmp(name, REGEN_ERROR_DEVICE_LOST) == 0)) {
			r = 0;
		}
	}
	/* The object is closed (or went with its worker) either way; calls
	 * that broke with the connection before it are what the caller hears
	 * of. */
	if (r == 0 && drained < 0) {
		rc_lane_say_broken(c, obj->device, drained);
		r = drained;
	}
out:
	cJSON_Delete(p);
	rc_object_unlink(obj);
	free(obj);
	return r;
}

/* Sends an import (params consumed) and makes the object of `objsize`
 * bytes (a buffer or an event) for the id it answers with; for a buffer
 * (size != NULL) also the size the worker mapped. The object is allocated
 * before the call: an import regend made must never be left without one
 * to close it by. */
static int import_object(regen_client *c, int device, const char *method, cJSON *params, const int *fds,
			 size_t nfds, size_t objsize, struct rc_object **out, uint64_t *size)
{
	struct rp_import_buffer_reply buffer;
	struct rp_import_event_reply event;
	struct rp_error err = { 0 };
	cJSON *reply = NULL;
	struct rp_id rid;
	int r;

	if (params == NULL) {
		return -ENOMEM;
	}
	*out = calloc(1, objsize);
	if (*out == NULL) {
		cJSON_Delete(params);
		return -ENOMEM;
	}
	r = rc_call(c, device, method, params, fds, nfds, &reply);
	cJSON_Delete(params);
	if (r < 0) {
		free(*out);
		*out = NULL;
		return r;
	}
	if (size != NULL) {
		r = rp_import_buffer_reply_decode(reply, &buffer, &err);
		rid = buffer.buffer;
		*size = buffer.size;
	} else {
		r = rp_import_event_reply_decode(reply, &event, &err);
		rid = event.event;
	}
	cJSON_Delete(reply);
	if (r < 0) {
		free(*out);
		*out = NULL;
		return rc_malformed_reply(c, method, &err);
	}
	rc_object_add(c, *out, device, &rid);
	return 0;
}

/* Imports the buffer req describes. */
static int import_buffer(regen_client *c, const struct rp_import_buffer *req, const int *fds, size_t nfds,
			 regen_buffer **out)
{
	struct rc_object *obj;
	uint64_t size;
	int r;

	r = import_object(c, (int)req->device, RP_MEMORY_IMPORT_BUFFER, rp_import_buffer_encode(req), fds, nfds,
			  sizeof(struct regen_buffer), &obj, &size);
	if (r < 0) {
		return r;
	}
	*out = (struct regen_buffer *)obj;
	(*out)->size = size;
	return 0;
}

/* host_fd and cuda_fd: the fd travels with the call, as fd 0. */
static int import_fd(regen_client *c, int device, enum rp_buffer_kind kind, int fd, uint64_t offset,
		     uint64_t size, regen_buffer **out)
{
	struct rp_import_buffer req = {
		.device = (uint32_t)device, .kind = kind, .size = size, .offset = offset, .has_fd = true, .fd = 0,
	};

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL || out == NULL || fd < 0 || !device_ok(device)) {
		return -EINVAL;
	}
	return import_buffer(c, &req, &fd, 1, out);
}

REGEN_EXPORT int regen_buffer_import_fd(regen_client *c, int device, int fd, uint64_t size, regen_buffer **out)
{
	/* regend maps only memory that cannot shrink under a call: seal it for
	 * the caller. A file that cannot take the seal is refused by regend with
	 * io.regen.ImportFailed saying so. */
	if (fd >= 0)
		(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
	return import_fd(c, device, RP_BUFFER_HOST_FD, fd, 0, size, out);
}

REGEN_EXPORT int regen_buffer_import_cuda_fd(regen_client *c, int device, int fd, uint64_t offset, uint64_t size,
					     regen_buffer **out)
{
	return import_fd(c, device, RP_BUFFER_CUDA_FD, fd, offset, size, out);
}

REGEN_EXPORT int regen_buffer_import_cuda_ipc(regen_client *c, int device, const void *handle, uint64_t offset,
					      uint64_t size, regen_buffer **out)
{
	struct rp_import_buffer req = {
		.device = (uint32_t)device, .kind = RP_BUFFER_CUDA_IPC, .size = size, .offset = offset,
		.has_handle = true,
	};

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL || out == NULL || handle == NULL || !device_ok(device)) {
		return -EINVAL;
	}
	memcpy(req.handle, handle, RP_HANDLE_SIZE);
	return import_buffer(c, &req, NULL, 0, out);
}

REGEN_EXPORT int regen_buffer_close(regen_buffer *b)
{
	return b != NULL ? object_close(&b->obj, RP_MEMORY_CLOSE_BUFFER, false) : 0;
}

int rc_buffer_close_or_keep(regen_buffer *b)
{
	return b != NULL ? object_close(&b->obj, RP_MEMORY_CLOSE_BUFFER, true) : 0;
}

REGEN_EXPORT const char *regen_buffer_id(const regen_buffer *b)
{
	return b != NULL ? b->obj.id : NULL;
}

REGEN_EXPORT uint64_t regen_buffer_generation(const regen_buffer *b)
{
	return b != NULL ? b->obj.rid.generation : 0;
}

REGEN_EXPORT int regen_buffer_device(const regen_buffer *b)
{
	return b != NULL ? b->obj.device : -1;
}

REGEN_EXPORT uint64_t regen_buffer_size(const regen_buffer *b)
{
	return b != NULL ? b->size : 0;
}

REGEN_EXPORT int regen_event_import_cuda_ipc(regen_client *c, int device, const void *handle, regen_event **out)
{
	struct rp_import_event req = { .device = (uint32_t)device };
	struct rc_object *obj;
	int r;

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL || out == NULL || handle == NULL || !device_ok(device)) {
		return -EINVAL;
	}
	memcpy(req.handle, handle, RP_HANDLE_SIZE);
	r = import_object(c, device, RP_MEMORY_IMPORT_EVENT, rp_import_event_encode(&req), NULL, 0,
			  sizeof(struct regen_event), &obj, NULL);
	if (r == 0) {
		*out = (struct regen_event *)obj;
	}
	return r;
}

REGEN_EXPORT int regen_event_close(regen_event *ev)
{
	return ev != NULL ? object_close(&ev->obj, RP_MEMORY_CLOSE_EVENT, false) : 0;
}

REGEN_EXPORT const char *regen_event_id(const regen_event *ev)
{
	return ev != NULL ? ev->obj.id : NULL;
}

REGEN_EXPORT uint64_t regen_event_generation(const regen_event *ev)
{
	return ev != NULL ? ev->obj.rid.generation : 0;
}

REGEN_EXPORT int regen_event_device(const regen_event *ev)
{
	return ev != NULL ? ev->obj.device : -1;
}
