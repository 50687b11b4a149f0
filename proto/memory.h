/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Memory's messages as structs: the parameters and replies of
 * ImportBuffer, CloseBuffer, ImportEvent and CloseEvent, each encoded and
 * decoded in one place, and the hex form of the 64-byte CUDA IPC handles.
 *
 * Decoders refuse what a worker refuses, with the worker's error: an
 * org.varlink.service.InvalidParameter {parameter} naming the field, an
 * io.regen.NoSuchDevice {device} for a device the socket does not serve, an
 * io.regen.ImportFailed {kind} for a buffer whose memory is not named. A
 * reply's decoder refuses a reply that lacks a field or has one of the wrong
 * type the same way, and ignores fields it does not know (a newer daemon may
 * add some). Encoders return a new cJSON object, NULL on ENOMEM. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "ids.h"
#include "message.h"

#define RP_MEMORY_IMPORT_BUFFER "io.regen.Memory.ImportBuffer"
#define RP_MEMORY_CLOSE_BUFFER  "io.regen.Memory.CloseBuffer"
#define RP_MEMORY_IMPORT_EVENT  "io.regen.Memory.ImportEvent"
#define RP_MEMORY_CLOSE_EVENT   "io.regen.Memory.CloseEvent"

/* cudaIpcMemHandle_t and cudaIpcEventHandle_t: 64 opaque bytes, 128 hex
 * digits on the wire. */
#define RP_HANDLE_SIZE 64
#define RP_HANDLE_HEX_LEN (2 * RP_HANDLE_SIZE)

/* The largest size and offset an import takes (256 TiB): far above any
 * device, and small enough that offset + size never overflows. */
#define RP_IMPORT_SIZE_MAX (UINT64_C(1) << 48)

/* 128 hex digits, either case, into 64 bytes. 0, or -EINVAL for another
 * length or a character that is not a hex digit (out is then unspecified). */
int rp_handle_from_hex(const char *hex, unsigned char out[RP_HANDLE_SIZE]);
/* 64 bytes as 128 lowercase hex digits and a NUL. Returns out. */
char *rp_handle_to_hex(const unsigned char handle[RP_HANDLE_SIZE], char out[RP_HANDLE_HEX_LEN + 1]);

enum rp_buffer_kind { RP_BUFFER_HOST_FD = 0, RP_BUFFER_CUDA_IPC, RP_BUFFER_CUDA_FD, RP_BUFFER_KIND_COUNT };

/* "host_fd", "cuda_ipc", "cuda_fd"; NULL out of range. */
const char *rp_buffer_kind_name(enum rp_buffer_kind kind);

/* ImportBuffer's parameters. */
struct rp_import_buffer {
	uint32_t device;
	enum rp_buffer_kind kind;
	uint64_t size;               /* 1 .. RP_IMPORT_SIZE_MAX */
	uint64_t offset;             /* 0 .. RP_IMPORT_SIZE_MAX */
	/* host_fd, cuda_fd: the index of the fd among those passed with the
	 * message (< RP_FDS_MAX). */
	bool has_fd;
	uint32_t fd;
	/* cuda_ipc: the handle was given (has_handle) and is 128 hex digits
	 * (handle_valid, decoded into handle). The encoder writes handle
	 * whenever has_handle is set. */
	bool has_handle;
	bool handle_valid;
	unsigned char handle[RP_HANDLE_SIZE];
};

/* Refuses, with InvalidParameter: a field of the wrong type, an unknown
 * field, a field given twice, device past UINT32_MAX, an unknown kind, a
 * size of 0 or past RP_IMPORT_SIZE_MAX, an offset past it, an fd index of
 * RP_FDS_MAX or more, an empty handle or one over 128 characters, `fd` with
 * cuda_ipc, `handle` with host_fd or cuda_fd. With served_device >= 0, a
 * device other than it is io.regen.NoSuchDevice {device}, reported before
 * everything but the field types. Whether the memory is named is
 * rp_import_buffer_check_source's to say. */
int rp_import_buffer_decode(const cJSON *params, int64_t served_device, struct rp_import_buffer *out,
			    struct rp_error *err);
/* The memory the import names: for cuda_ipc a valid handle; for host_fd
 * and cuda_fd the index of one of the nfds fds passed with the message,
 * not yet taken (fds[i] >= 0). io.regen.ImportFailed {kind} otherwise,
 * with a message that says what is missing. A worker asks this only once
 * it takes the import (after it refused a draining device, say). */
int rp_import_buffer_check_source(const struct rp_import_buffer *req, const int *fds, size_t nfds,
				  struct rp_error *err);
/* Writes device, kind, size, offset (when not 0), fd (has_fd) and handle
 * (has_handle). */
cJSON *rp_import_buffer_encode(const struct rp_import_buffer *req);

/* ImportBuffer's reply. The id's generation is the reply's generation. */
struct rp_import_buffer_reply {
	struct rp_id buffer;         /* kind RP_ID_BUFFER */
	uint64_t size;
};
cJSON *rp_import_buffer_reply_encode(const struct rp_import_buffer_reply *reply);
/* Refuses a buffer that is not a buffer id, a generation that is not the
 * id's. */
int rp_import_buffer_reply_decode(const cJSON *params, struct rp_import_buffer_reply *out, struct rp_error *err);

/* ImportEvent's parameters. */
struct rp_import_event {
	uint32_t device;
	unsigned char handle[RP_HANDLE_SIZE];
};
/* Refuses as rp_import_buffer_decode does, and a handle that is not 128
 * hex digits (InvalidParameter "handle"). */
int rp_import_event_decode(const cJSON *params, int64_t served_device, struct rp_import_event *out,
			   struct rp_error *err);
cJSON *rp_import_event_encode(const struct rp_import_event *req);

/* ImportEvent's reply. */
struct rp_import_event_reply {
	struct rp_id event;          /* kind RP_ID_EVENT */
};
cJSON *rp_import_event_reply_encode(const struct rp_import_event_reply *reply);
int rp_import_event_reply_decode(const cJSON *params, struct rp_import_event_reply *out, struct rp_error *err);

/* CloseBuffer {buffer} (kind RP_ID_BUFFER) and CloseEvent {event} (kind
 * RP_ID_EVENT). The decoder refuses, with InvalidParameter naming
 * "buffer" or "event": a missing or unknown field, or a value that is not
 * an id's text. An id of the other kind passes: the worker answers that
 * it owns no such object. Both replies are empty. */
int rp_close_object_decode(const cJSON *params, enum rp_id_kind kind, struct rp_id *out, struct rp_error *err);
cJSON *rp_close_object_encode(enum rp_id_kind kind, const struct rp_id *id);
