/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Memory's messages: ImportBuffer, CloseBuffer, ImportEvent and
 * CloseEvent, and the hex handle codec. */
#include <errno.h>
#include <string.h>

#include "errors.h"
#include "frame.h"
#include "hex.h"
#include "memory.h"
#include "params.h"

int rp_handle_from_hex(const char *hex, unsigned char out[RP_HANDLE_SIZE])
{
	return rp_hex_decode(hex, out, RP_HANDLE_SIZE);
}

char *rp_handle_to_hex(const unsigned char handle[RP_HANDLE_SIZE], char out[RP_HANDLE_HEX_LEN + 1])
{
	return rp_hex_encode(handle, RP_HANDLE_SIZE, out);
}

static const char *const kind_names[] = { "host_fd", "cuda_ipc", "cuda_fd", NULL };

const char *rp_buffer_kind_name(enum rp_buffer_kind kind)
{
	return (unsigned)kind < RP_BUFFER_KIND_COUNT ? kind_names[kind] : NULL;
}

/* `device`: the index, and with served >= 0 the device this socket serves. */
static int decode_device(const cJSON *params, int64_t served, uint32_t *out, struct rp_error *err)
{
	uint64_t device;
	int r = rp_params_uint(params, "device", UINT32_MAX, 0, &device, err);

	if (r < 0)
		return r;
	if (served >= 0 && device != (uint64_t)served) {
		rp_err_no_such_device(err, (long long)device, "this socket serves device %lld, not %llu",
				      (long long)served, (unsigned long long)device);
		return -EINVAL;
	}
	*out = (uint32_t)device;
	return 0;
}

int rp_import_buffer_decode(const cJSON *params, int64_t served_device, struct rp_import_buffer *out,
			    struct rp_error *err)
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
	const char *handle = NULL;
	uint64_t fd = 0;
	int kind = -1, has_fd = 1;

	memset(out, 0, sizeof(*out));
	if (rp_params_check(params, fields, err) < 0 || decode_device(params, served_device, &out->device, err) < 0 ||
	    rp_params_enum(params, "kind", kind_names, -1, &kind, err) < 0 ||
	    rp_params_uint(params, "size", RP_IMPORT_SIZE_MAX, 0, &out->size, err) < 0 ||
	    rp_params_uint(params, "offset", RP_IMPORT_SIZE_MAX, 0, &out->offset, err) < 0 ||
	    (has_fd = rp_params_uint(params, "fd", RP_FDS_MAX - 1, 0, &fd, err)) < 0 ||
	    rp_params_string(params, "handle", RP_HANDLE_HEX_LEN, NULL, &handle, err) < 0)
		return -EINVAL;
	if (out->size == 0)
		return rp_error_invalid_parameter(err, "size");
	/* Each kind takes its own field; the other one is a mistake, not noise. */
	if (kind == RP_BUFFER_CUDA_IPC && has_fd == 0)
		return rp_error_invalid_parameter(err, "fd");
	if (kind != RP_BUFFER_CUDA_IPC && handle != NULL)
		return rp_error_invalid_parameter(err, "handle");
	out->kind = (enum rp_buffer_kind)kind;
	out->has_fd = has_fd == 0;
	out->fd = (uint32_t)fd;
	out->has_handle = handle != NULL;
	out->handle_valid = handle != NULL && rp_handle_from_hex(handle, out->handle) == 0;
	if (!out->handle_valid)
		memset(out->handle, 0, sizeof(out->handle));
	return 0;
}

int rp_import_buffer_check_source(const struct rp_import_buffer *req, const int *fds, size_t nfds,
				  struct rp_error *err)
{
	const char *kind = rp_buffer_kind_name(req->kind);

	if (req->kind == RP_BUFFER_CUDA_IPC) {
		if (req->handle_valid)
			return 0;
		rp_err_import_failed(err, kind, "cuda_ipc needs 'handle': the 64-byte cudaIpcMemHandle_t as 128 hex digits");
	} else {
		if (req->has_fd && req->fd < nfds && fds[req->fd] >= 0)
			return 0;
		rp_err_import_failed(err, kind,
				     "%s needs 'fd': the index of a file descriptor passed with this message (%zu passed)",
				     kind, nfds);
	}
	return -EINVAL;
}

cJSON *rp_import_buffer_encode(const struct rp_import_buffer *req)
{
	const char *kind = rp_buffer_kind_name(req->kind);
	cJSON *p = cJSON_CreateObject();
	char hex[RP_HANDLE_HEX_LEN + 1];

	if (p == NULL || kind == NULL || cJSON_AddNumberToObject(p, "device", req->device) == NULL ||
	    cJSON_AddStringToObject(p, "kind", kind) == NULL ||
	    cJSON_AddNumberToObject(p, "size", (double)req->size) == NULL ||
	    (req->offset != 0 && cJSON_AddNumberToObject(p, "offset", (double)req->offset) == NULL) ||
	    (req->has_fd && cJSON_AddNumberToObject(p, "fd", req->fd) == NULL) ||
	    (req->has_handle && cJSON_AddStringToObject(p, "handle", rp_handle_to_hex(req->handle, hex)) == NULL)) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

/* An id of `kind` under `name`, for replies. */
static int decode_reply_id(const cJSON *params, const char *name, enum rp_id_kind kind, struct rp_id *out,
			   struct rp_error *err)
{
	const char *text;
	int r = rp_params_string(params, name, RP_ID_MAX - 1, NULL, &text, err);

	if (r < 0)
		return r;
	if (r == 1 || rp_id_parse(text, out) < 0 || out->kind != (char)kind)
		return rp_error_invalid_parameter(err, name);
	return 0;
}

/* `generation`, present and the one the id carries. */
static int decode_reply_generation(const cJSON *params, const struct rp_id *id, struct rp_error *err)
{
	uint64_t generation;
	int r = rp_params_uint(params, "generation", UINT64_MAX, 0, &generation, err);

	if (r < 0)
		return r;
	if (r == 1 || generation != id->generation)
		return rp_error_invalid_parameter(err, "generation");
	return 0;
}

cJSON *rp_import_buffer_reply_encode(const struct rp_import_buffer_reply *reply)
{
	cJSON *p = cJSON_CreateObject();
	char id[RP_ID_MAX];

	if (p == NULL || cJSON_AddStringToObject(p, "buffer", rp_id_format(&reply->buffer, id)) == NULL ||
	    cJSON_AddNumberToObject(p, "generation", (double)reply->buffer.generation) == NULL ||
	    cJSON_AddNumberToObject(p, "size", (double)reply->size) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

int rp_import_buffer_reply_decode(const cJSON *params, struct rp_import_buffer_reply *out, struct rp_error *err)
{
	int r;

	memset(out, 0, sizeof(*out));
	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");
	if (decode_reply_id(params, "buffer", RP_ID_BUFFER, &out->buffer, err) < 0 ||
	    decode_reply_generation(params, &out->buffer, err) < 0)
		return -EINVAL;
	r = rp_params_uint(params, "size", RP_IMPORT_SIZE_MAX, 0, &out->size, err);
	if (r < 0)
		return r;
	if (r == 1 || out->size == 0)
		return rp_error_invalid_parameter(err, "size");
	return 0;
}

int rp_import_event_decode(const cJSON *params, int64_t served_device, struct rp_import_event *out,
			   struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "device", RP_T_INT, true },
		{ "handle", RP_T_STRING, true },
		{ NULL },
	};
	const char *hex;

	memset(out, 0, sizeof(*out));
	if (rp_params_check(params, fields, err) < 0 || decode_device(params, served_device, &out->device, err) < 0 ||
	    rp_params_string(params, "handle", RP_HANDLE_HEX_LEN, NULL, &hex, err) < 0)
		return -EINVAL;
	if (rp_handle_from_hex(hex, out->handle) < 0)
		return rp_error_invalid_parameter(err, "handle");
	return 0;
}

cJSON *rp_import_event_encode(const struct rp_import_event *req)
{
	cJSON *p = cJSON_CreateObject();
	char hex[RP_HANDLE_HEX_LEN + 1];

	if (p == NULL || cJSON_AddNumberToObject(p, "device", req->device) == NULL ||
	    cJSON_AddStringToObject(p, "handle", rp_handle_to_hex(req->handle, hex)) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

cJSON *rp_import_event_reply_encode(const struct rp_import_event_reply *reply)
{
	cJSON *p = cJSON_CreateObject();
	char id[RP_ID_MAX];

	if (p == NULL || cJSON_AddStringToObject(p, "event", rp_id_format(&reply->event, id)) == NULL ||
	    cJSON_AddNumberToObject(p, "generation", (double)reply->event.generation) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

int rp_import_event_reply_decode(const cJSON *params, struct rp_import_event_reply *out, struct rp_error *err)
{
	memset(out, 0, sizeof(*out));
	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");
	if (decode_reply_id(params, "event", RP_ID_EVENT, &out->event, err) < 0 ||
	    decode_reply_generation(params, &out->event, err) < 0)
		return -EINVAL;
	return 0;
}

static const char *close_param(enum rp_id_kind kind)
{
	return kind == RP_ID_EVENT ? "event" : "buffer";
}

int rp_close_object_decode(const cJSON *params, enum rp_id_kind kind, struct rp_id *out, struct rp_error *err)
{
	static const struct rp_field buffer_fields[] = { { "buffer", RP_T_STRING, true }, { NULL } };
	static const struct rp_field event_fields[] = { { "event", RP_T_STRING, true }, { NULL } };
	const char *name = close_param(kind);
	const char *text;
	int r;

	memset(out, 0, sizeof(*out));
	if (rp_params_check(params, kind == RP_ID_EVENT ? event_fields : buffer_fields, err) < 0)
		return -EINVAL;
	r = rp_params_string(params, name, RP_ID_MAX - 1, NULL, &text, err);
	if (r < 0)
		return r;
	if (r == 1 || rp_id_parse(text, out) < 0)
		return rp_error_invalid_parameter(err, name);
	return 0;
}

cJSON *rp_close_object_encode(enum rp_id_kind kind, const struct rp_id *id)
{
	cJSON *p = cJSON_CreateObject();
	char text[RP_ID_MAX];

	if (p == NULL || cJSON_AddStringToObject(p, close_param(kind), rp_id_format(id, text)) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}
