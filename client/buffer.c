/* libregen: buffers imported into a device's worker. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "private.h"
#include "proto/errors.h"

static int import(regen_client *c, int device, cJSON *p, const int *fds, size_t nfds, regen_buffer **out)
{
	struct regen_buffer *b = NULL;
	cJSON *reply = NULL;
	const cJSON *id;
	int r;

	r = rc_call(c, device, "io.regen.Memory.ImportBuffer", p, fds, nfds, &reply);
	if (r < 0) {
		goto out;
	}
	id = cJSON_GetObjectItemCaseSensitive(reply, "buffer");
	if (!cJSON_IsString(id) || strlen(id->valuestring) >= sizeof(b->id)) {
		rc_set_local_error(c, "ImportBuffer reply has no buffer id");
		r = -EPROTO;
		goto out;
	}
	b = calloc(1, sizeof(*b));
	if (b == NULL) {
		r = -ENOMEM;
		goto out;
	}
	b->client = c;
	b->device = device;
	snprintf(b->id, sizeof(b->id), "%s", id->valuestring);
	b->generation = (uint64_t)rc_json_int(reply, "generation", 0);
	b->size = (uint64_t)rc_json_int(reply, "size", 0);
	if (b->generation > c->known_generation[device]) {
		c->known_generation[device] = b->generation;
	}
	b->next = c->buffers;
	if (c->buffers != NULL) {
		c->buffers->prev = b;
	}
	c->buffers = b;
	*out = b;
	r = 0;
out:
	cJSON_Delete(reply);
	return r;
}

REGEN_EXPORT int regen_buffer_import_fd(regen_client *c, int device, int fd, uint64_t size, regen_buffer **out)
{
	cJSON *p;
	int r = -ENOMEM;

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL || out == NULL || fd < 0 || device < 0 || device >= REGEN_DEVICES_MAX) {
		return -EINVAL;
	}
	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	if (cJSON_AddNumberToObject(p, "device", device) == NULL ||
	    cJSON_AddStringToObject(p, "kind", "host_fd") == NULL ||
	    cJSON_AddNumberToObject(p, "size", (double)size) == NULL ||
	    cJSON_AddNumberToObject(p, "fd", 0) == NULL) {
		goto out;
	}
	r = import(c, device, p, &fd, 1, out);
out:
	cJSON_Delete(p);
	return r;
}

REGEN_EXPORT int regen_buffer_import_cuda_ipc(regen_client *c, int device, const void *handle, uint64_t offset,
					      uint64_t size, regen_buffer **out)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *h = handle;
	char text[129];
	cJSON *p;
	int i, r = -ENOMEM;

	if (out != NULL) {
		*out = NULL;
	}
	if (c == NULL || out == NULL || handle == NULL || device < 0 || device >= REGEN_DEVICES_MAX) {
		return -EINVAL;
	}
	for (i = 0; i < 64; i++) {
		text[2 * i] = hex[h[i] >> 4];
		text[2 * i + 1] = hex[h[i] & 15];
	}
	text[128] = '\0';
	p = cJSON_CreateObject();
	if (p == NULL) {
		return -ENOMEM;
	}
	if (cJSON_AddNumberToObject(p, "device", device) == NULL ||
	    cJSON_AddStringToObject(p, "kind", "cuda_ipc") == NULL ||
	    cJSON_AddNumberToObject(p, "size", (double)size) == NULL ||
	    cJSON_AddNumberToObject(p, "offset", (double)offset) == NULL ||
	    cJSON_AddStringToObject(p, "handle", text) == NULL) {
		goto out;
	}
	r = import(c, device, p, NULL, 0, out);
out:
	cJSON_Delete(p);
	return r;
}

static void unlink_buffer(struct regen_buffer *b)
{
	if (b->client == NULL) {
		return;
	}
	if (b->prev != NULL) {
		b->prev->next = b->next;
	} else {
		b->client->buffers = b->next;
	}
	if (b->next != NULL) {
		b->next->prev = b->prev;
	}
}

REGEN_EXPORT int regen_buffer_close(regen_buffer *b)
{
	regen_client *c;
	cJSON *p = NULL;
	const char *name;
	int r = 0;

	if (b == NULL) {
		return 0;
	}
	c = b->client;
	/* A buffer of a generation that is gone was closed with it. */
	if (c == NULL || c->known_generation[b->device] > b->generation) {
		goto out;
	}
	p = cJSON_CreateObject();
	if (p == NULL || cJSON_AddStringToObject(p, "buffer", b->id) == NULL) {
		r = -ENOMEM;
		goto out;
	}
	r = rc_call(c, b->device, "io.regen.Memory.CloseBuffer", p, NULL, 0, NULL);
	if (r == -EREMOTE) {
		name = regen_client_error_name(c);
		if (name != NULL && (strcmp(name, RP_ERR_STALE_GENERATION) == 0 ||
				     strcmp(name, RP_ERR_DEVICE_LOST) == 0)) {
			r = 0;
		}
	}
out:
	cJSON_Delete(p);
	unlink_buffer(b);
	free(b);
	return r;
}

REGEN_EXPORT const char *regen_buffer_id(const regen_buffer *b)
{
	return b != NULL ? b->id : NULL;
}

REGEN_EXPORT uint64_t regen_buffer_generation(const regen_buffer *b)
{
	return b != NULL ? b->generation : 0;
}

REGEN_EXPORT int regen_buffer_device(const regen_buffer *b)
{
	return b != NULL ? b->device : -1;
}
