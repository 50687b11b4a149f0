/* SPDX-License-Identifier: Apache-2.0 */
/* The io.regen.Memory and io.regen.Device codecs (proto/memory.h,
 * proto/device.h): any JSON through one decoder (the first input byte picks
 * it). Invariants: a refusal is a named error that can be sent; what a
 * decoder accepts, its encoder writes back into JSON that decodes to the
 * same struct. */
#include <errno.h>

#include "fuzz_common.h"
#include "proto/device.h"
#include "proto/frame.h"
#include "proto/memory.h"

static void same_id(const struct rp_id *a, const struct rp_id *b, const char *where)
{
	FZ_CHECK(a->kind == b->kind && a->device == b->device && a->generation == b->generation &&
		 a->serial == b->serial, "%s: the id changed on the way back", where);
}

static void import_buffer(const cJSON *params)
{
	static const int fds[RP_FDS_MAX] = { 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18 };
	struct rp_import_buffer req, back;
	struct rp_error err = { 0 };
	cJSON *again;
	int r = rp_import_buffer_decode(params, 0, &req, &err);

	if (r < 0) {
		fz_check_error(r, &err, "ImportBuffer");
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(req.device == 0 && req.size > 0 && req.size <= RP_IMPORT_SIZE_MAX && req.offset <= RP_IMPORT_SIZE_MAX,
		 "ImportBuffer: accepted device %u size %llu offset %llu", req.device, (unsigned long long)req.size,
		 (unsigned long long)req.offset);
	FZ_CHECK(!(req.kind == RP_BUFFER_CUDA_IPC && req.has_fd) && !(req.kind != RP_BUFFER_CUDA_IPC && req.has_handle),
		 "ImportBuffer: a field of the other kind passed");
	r = rp_import_buffer_check_source(&req, fds, RP_FDS_MAX, &err);
	if (r < 0) {
		fz_check_error(r, &err, "ImportBuffer source");
		FZ_CHECK(strcmp(err.name, RP_ERR_IMPORT_FAILED) == 0, "ImportBuffer source: %s", err.name);
		rp_error_clear(&err);
	}
	again = rp_import_buffer_encode(&req);
	FZ_CHECK(again != NULL, "ImportBuffer: cannot encode what was decoded");
	FZ_CHECK(rp_import_buffer_decode(again, 0, &back, &err) == 0, "ImportBuffer: the encoding does not decode");
	FZ_CHECK(back.kind == req.kind && back.size == req.size && back.offset == req.offset &&
		 back.has_fd == req.has_fd && back.fd == req.fd && back.has_handle == req.has_handle,
		 "ImportBuffer: changed on the way back");
	FZ_CHECK(!req.handle_valid || memcmp(back.handle, req.handle, RP_HANDLE_SIZE) == 0,
		 "ImportBuffer: the handle changed on the way back");
	cJSON_Delete(again);
}

static void import_event(const cJSON *params)
{
	struct rp_import_event req, back;
	struct rp_error err = { 0 };
	cJSON *again;
	int r = rp_import_event_decode(params, -1, &req, &err);

	if (r < 0) {
		fz_check_error(r, &err, "ImportEvent");
		rp_error_clear(&err);
		return;
	}
	again = rp_import_event_encode(&req);
	FZ_CHECK(again != NULL && rp_import_event_decode(again, req.device, &back, &err) == 0,
		 "ImportEvent: the encoding does not decode");
	FZ_CHECK(back.device == req.device && memcmp(back.handle, req.handle, RP_HANDLE_SIZE) == 0,
		 "ImportEvent: changed on the way back");
	cJSON_Delete(again);
}

static void close_object(const cJSON *params, enum rp_id_kind kind)
{
	struct rp_error err = { 0 };
	struct rp_id id, back;
	cJSON *again;
	int r = rp_close_object_decode(params, kind, &id, &err);

	if (r < 0) {
		fz_check_error(r, &err, "Close");
		rp_error_clear(&err);
		return;
	}
	again = rp_close_object_encode(kind, &id);
	FZ_CHECK(again != NULL && rp_close_object_decode(again, kind, &back, &err) == 0,
		 "Close: the encoding does not decode");
	same_id(&id, &back, "Close");
	cJSON_Delete(again);
}

static void replies(const cJSON *params)
{
	struct rp_import_buffer_reply buffer, buffer_back;
	struct rp_import_event_reply event, event_back;
	struct rp_error err = { 0 };
	cJSON *again;

	if (rp_import_buffer_reply_decode(params, &buffer, &err) == 0) {
		FZ_CHECK(buffer.buffer.kind == RP_ID_BUFFER && buffer.size > 0, "ImportBuffer reply: accepted a bad id");
		again = rp_import_buffer_reply_encode(&buffer);
		FZ_CHECK(again != NULL && rp_import_buffer_reply_decode(again, &buffer_back, &err) == 0,
			 "ImportBuffer reply: the encoding does not decode");
		same_id(&buffer.buffer, &buffer_back.buffer, "ImportBuffer reply");
		cJSON_Delete(again);
	} else {
		fz_check_error(-EINVAL, &err, "ImportBuffer reply");
	}
	rp_error_clear(&err);
	if (rp_import_event_reply_decode(params, &event, &err) == 0) {
		again = rp_import_event_reply_encode(&event);
		FZ_CHECK(again != NULL && rp_import_event_reply_decode(again, &event_back, &err) == 0,
			 "ImportEvent reply: the encoding does not decode");
		same_id(&event.event, &event_back.event, "ImportEvent reply");
		cJSON_Delete(again);
	} else {
		fz_check_error(-EINVAL, &err, "ImportEvent reply");
	}
	rp_error_clear(&err);
}

static void status(const cJSON *params)
{
	struct rp_status st, back;
	struct rp_error err = { 0 };
	cJSON *again;
	int r = rp_status_decode(params, &st, &err);

	if (r < 0) {
		if (r != -ENOMEM)
			fz_check_error(r, &err, "Status");
		rp_error_clear(&err);
		return;
	}
	again = rp_status_encode(&st);
	FZ_CHECK(again != NULL && rp_status_decode(again, &back, &err) == 0, "Status: the encoding does not decode");
	FZ_CHECK(back.epoch == st.epoch && back.ndevices == st.ndevices && back.has_elapsed_us == st.has_elapsed_us,
		 "Status: changed on the way back");
	for (size_t i = 0; i < st.ndevices; i++) {
		const struct rp_device_info *a = &st.devices[i], *b = &back.devices[i];

		FZ_CHECK(a->index == b->index && a->generation == b->generation && a->state == b->state &&
			 a->worker_pid == b->worker_pid && strcmp(a->reason, b->reason) == 0 &&
			 strcmp(a->worker_socket, b->worker_socket) == 0, "Status: device %zu changed on the way back", i);
	}
	rp_status_finish(&back);
	rp_status_finish(&st);
	cJSON_Delete(again);
}

static void watch_event(const cJSON *params)
{
	struct rp_watch_event ev, back;
	struct rp_error err = { 0 };
	cJSON *again;
	int r = rp_watch_event_decode(params, &ev, &err);

	if (r < 0) {
		fz_check_error(r, &err, "Watch");
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(rp_state_name(ev.state) != NULL, "Watch: accepted an unknown state");
	again = rp_watch_event_encode(&ev);
	FZ_CHECK(again != NULL && rp_watch_event_decode(again, &back, &err) == 0, "Watch: the encoding does not decode");
	FZ_CHECK(back.epoch == ev.epoch && back.device == ev.device && back.generation == ev.generation &&
		 back.state == ev.state && strcmp(back.reason, ev.reason) == 0, "Watch: changed on the way back");
	cJSON_Delete(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *params;

	if (size < 1)
		return 0;
	params = fz_json(data + 1, size - 1);
	if (params == NULL)
		return 0;
	switch (data[0] % 7) {
	case 0:
		import_buffer(params);
		break;
	case 1:
		import_event(params);
		break;
	case 2:
		close_object(params, RP_ID_BUFFER);
		break;
	case 3:
		close_object(params, RP_ID_EVENT);
		break;
	case 4:
		replies(params);
		break;
	case 5:
		status(params);
		break;
	default:
		watch_event(params);
		break;
	}
	cJSON_Delete(params);
	return 0;
}
