/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Memory's codecs (proto/memory.h): the hex handle codec, and the
 * parameters and replies of ImportBuffer, ImportEvent, CloseBuffer and
 * CloseEvent. What one side encodes the other decodes to the same struct;
 * every refusal names the field, with the error a worker sends. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/frame.h"
#include "proto/memory.h"

static cJSON *json(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

/* Asserts err is `name` and, when key is set, that its parameter `key` is
 * `value` (a string, or a number written as text); then clears it. */
static void assert_error(struct rp_error *err, const char *name, const char *key, const char *value)
{
	const cJSON *p;
	char num[32];

	ck_assert_ptr_nonnull(err->name);
	ck_assert_str_eq(err->name, name);
	if (key != NULL) {
		p = cJSON_GetObjectItemCaseSensitive(err->params, key);
		ck_assert_msg(p != NULL, "%s lacks %s", name, key);
		if (cJSON_IsNumber(p)) {
			snprintf(num, sizeof(num), "%.0f", p->valuedouble);
			ck_assert_str_eq(num, value);
		} else {
			ck_assert(cJSON_IsString(p));
			ck_assert_str_eq(p->valuestring, value);
		}
	}
	if (strcmp(name, RP_ERR_INVALID_PARAMETER) == 0)
		ck_assert_int_eq(cJSON_GetArraySize(err->params), 1);
	rp_error_clear(err);
}

static void assert_id_eq(const struct rp_id *got, const struct rp_id *want)
{
	ck_assert_int_eq(got->kind, want->kind);
	ck_assert_uint_eq(got->device, want->device);
	ck_assert_uint_eq(got->generation, want->generation);
	ck_assert_uint_eq(got->serial, want->serial);
}

/* A handle of 64 distinct bytes, and its hex. */
static void sample_handle(unsigned char h[RP_HANDLE_SIZE], char hex[RP_HANDLE_HEX_LEN + 1])
{
	for (int i = 0; i < RP_HANDLE_SIZE; i++)
		h[i] = (unsigned char)(i * 0x11 + 3);
	rp_handle_to_hex(h, hex);
}

START_TEST(hex_round_trip)
{
	unsigned char h[RP_HANDLE_SIZE], back[RP_HANDLE_SIZE];
	char hex[RP_HANDLE_HEX_LEN + 1];

	/* Every byte value, in four handles. */
	for (int base = 0; base < 256; base += RP_HANDLE_SIZE) {
		for (int i = 0; i < RP_HANDLE_SIZE; i++)
			h[i] = (unsigned char)(base + i);
		ck_assert_ptr_eq(rp_handle_to_hex(h, hex), hex);
		ck_assert_uint_eq(strlen(hex), RP_HANDLE_HEX_LEN);
		ck_assert_int_eq(rp_handle_from_hex(hex, back), 0);
		ck_assert_mem_eq(h, back, RP_HANDLE_SIZE);
	}
	h[0] = 0xab;
	h[1] = 0x0f;
	rp_handle_to_hex(h, hex);
	ck_assert(strncmp(hex, "ab0f", 4) == 0);
	/* Upper case is read too. */
	hex[0] = 'A';
	hex[1] = 'B';
	hex[3] = 'F';
	ck_assert_int_eq(rp_handle_from_hex(hex, back), 0);
	ck_assert_mem_eq(h, back, RP_HANDLE_SIZE);
}
END_TEST

START_TEST(hex_refusals)
{
	static const char *const bad_pairs[] = { "0g", "g0", " 0", "0 ", "+f", "0x", "-1", "\t1" };
	unsigned char h[RP_HANDLE_SIZE];
	char hex[RP_HANDLE_HEX_LEN + 2];

	ck_assert_int_eq(rp_handle_from_hex(NULL, h), -EINVAL);
	ck_assert_int_eq(rp_handle_from_hex("", h), -EINVAL);
	memset(hex, '0', sizeof(hex));
	hex[RP_HANDLE_HEX_LEN - 1] = '\0';
	ck_assert_int_eq(rp_handle_from_hex(hex, h), -EINVAL);   /* 127 digits */
	hex[RP_HANDLE_HEX_LEN - 1] = '0';
	hex[RP_HANDLE_HEX_LEN + 1] = '\0';
	ck_assert_int_eq(rp_handle_from_hex(hex, h), -EINVAL);   /* 129 digits */
	hex[RP_HANDLE_HEX_LEN] = '\0';
	ck_assert_int_eq(rp_handle_from_hex(hex, h), 0);
	/* A bad character in either digit of a pair, anywhere. */
	for (size_t i = 0; i < sizeof(bad_pairs) / sizeof(bad_pairs[0]); i++) {
		for (int at = 0; at < RP_HANDLE_HEX_LEN; at += 62) {
			memset(hex, '0', RP_HANDLE_HEX_LEN);
			memcpy(hex + at, bad_pairs[i], 2);
			ck_assert_msg(rp_handle_from_hex(hex, h) == -EINVAL, "'%s' at %d accepted", bad_pairs[i], at);
		}
	}
}
END_TEST

START_TEST(import_buffer_round_trip)
{
	struct rp_import_buffer in = { 0 }, out;
	struct rp_error err = { 0 };
	char hex[RP_HANDLE_HEX_LEN + 1];
	cJSON *p;

	/* cuda_ipc: handle and offset. */
	in.device = 3;
	in.kind = RP_BUFFER_CUDA_IPC;
	in.size = 1 << 20;
	in.offset = 4096;
	in.has_handle = true;
	sample_handle(in.handle, hex);
	p = rp_import_buffer_encode(&in);
	ck_assert_ptr_nonnull(p);
	ck_assert_str_eq(cJSON_GetObjectItem(p, "kind")->valuestring, "cuda_ipc");
	ck_assert_str_eq(cJSON_GetObjectItem(p, "handle")->valuestring, hex);
	ck_assert_ptr_null(cJSON_GetObjectItem(p, "fd"));
	ck_assert_int_eq(rp_import_buffer_decode(p, 3, &out, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_uint_eq(out.device, 3);
	ck_assert_int_eq(out.kind, RP_BUFFER_CUDA_IPC);
	ck_assert_uint_eq(out.size, 1 << 20);
	ck_assert_uint_eq(out.offset, 4096);
	ck_assert(out.has_handle && out.handle_valid && !out.has_fd);
	ck_assert_mem_eq(out.handle, in.handle, RP_HANDLE_SIZE);
	cJSON_Delete(p);

	/* host_fd and cuda_fd: an fd index; offset 0 is left out. */
	for (int kind = RP_BUFFER_HOST_FD; kind <= RP_BUFFER_CUDA_FD; kind += 2) {
		memset(&in, 0, sizeof(in));
		in.kind = (enum rp_buffer_kind)kind;
		in.size = 12345;
		in.has_fd = true;
		in.fd = 2;
		p = rp_import_buffer_encode(&in);
		ck_assert_ptr_nonnull(p);
		ck_assert_str_eq(cJSON_GetObjectItem(p, "kind")->valuestring, rp_buffer_kind_name(in.kind));
		ck_assert_ptr_null(cJSON_GetObjectItem(p, "offset"));
		ck_assert_ptr_null(cJSON_GetObjectItem(p, "handle"));
		ck_assert_int_eq(rp_import_buffer_decode(p, -1, &out, &err), 0);
		ck_assert_int_eq(out.kind, kind);
		ck_assert(out.has_fd && out.fd == 2 && !out.has_handle);
		ck_assert_uint_eq(out.size, 12345);
		ck_assert_uint_eq(out.offset, 0);
		cJSON_Delete(p);
	}
	ck_assert_ptr_null(rp_buffer_kind_name(RP_BUFFER_KIND_COUNT));
}
END_TEST

#define H128 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff" \
	     "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

/* Decoder refusals: parameters, the device the socket serves, the error and
 * its parameter (InvalidParameter's "parameter", NoSuchDevice's "device"). */
static const struct {
	const char *params;
	int served;
	const char *error;
	const char *key, *value;
} import_refusals[] = {
	{ "[]", 0, RP_ERR_INVALID_PARAMETER, "parameter", "parameters" },
	{ "{\"kind\":\"host_fd\",\"size\":1,\"fd\":0}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "device" },
	{ "{\"device\":0,\"size\":1,\"fd\":0}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "kind" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"fd\":0}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "size" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"bogus\":1}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "bogus" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"size\":2}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "size" },
	{ "{\"device\":\"0\",\"kind\":\"host_fd\",\"size\":1}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "device" },
	{ "{\"device\":-1,\"kind\":\"host_fd\",\"size\":1}", -1, RP_ERR_INVALID_PARAMETER, "parameter", "device" },
	{ "{\"device\":4294967296,\"kind\":\"host_fd\",\"size\":1}", -1, RP_ERR_INVALID_PARAMETER, "parameter", "device" },
	{ "{\"device\":1,\"kind\":\"host_fd\",\"size\":1,\"fd\":0}", 0, RP_ERR_NO_SUCH_DEVICE, "device", "1" },
	/* The device is judged before the other fields' values. */
	{ "{\"device\":1,\"kind\":\"tape\",\"size\":0}", 0, RP_ERR_NO_SUCH_DEVICE, "device", "1" },
	{ "{\"device\":0,\"kind\":\"tape\",\"size\":1}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "kind" },
	{ "{\"device\":0,\"kind\":7,\"size\":1}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "kind" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":0,\"fd\":0}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "size" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1.5}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "size" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":-1}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "size" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":281474976710657}", 0, RP_ERR_INVALID_PARAMETER, "parameter",
	  "size" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"offset\":281474976710657}", 0, RP_ERR_INVALID_PARAMETER,
	  "parameter", "offset" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"offset\":-4}", 0, RP_ERR_INVALID_PARAMETER, "parameter",
	  "offset" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"fd\":16}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "fd" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"fd\":-1}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "fd" },
	{ "{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1,\"handle\":\"\"}", 0, RP_ERR_INVALID_PARAMETER, "parameter",
	  "handle" },
	{ "{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1,\"handle\":\"" H128 "0\"}", 0, RP_ERR_INVALID_PARAMETER,
	  "parameter", "handle" },
	{ "{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1,\"handle\":\"" H128 "\",\"fd\":0}", 0,
	  RP_ERR_INVALID_PARAMETER, "parameter", "fd" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"fd\":0,\"handle\":\"" H128 "\"}", 0,
	  RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
	{ "{\"device\":0,\"kind\":\"cuda_fd\",\"size\":1,\"fd\":0,\"handle\":\"" H128 "\"}", 0,
	  RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
};

START_TEST(import_buffer_refusals)
{
	struct rp_import_buffer out;
	struct rp_error err = { 0 };
	cJSON *p = json(import_refusals[_i].params);

	ck_assert_msg(rp_import_buffer_decode(p, import_refusals[_i].served, &out, &err) == -EINVAL, "%s accepted",
		      import_refusals[_i].params);
	assert_error(&err, import_refusals[_i].error, import_refusals[_i].key, import_refusals[_i].value);
	cJSON_Delete(p);
}
END_TEST

START_TEST(import_buffer_accepts)
{
	static const char *const good[] = {
		"{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"fd\":0}",
		"{\"device\":0,\"kind\":\"host_fd\",\"size\":281474976710656,\"offset\":281474976710656,\"fd\":15}",
		"{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"offset\":null,\"handle\":null}",
		/* A missing fd or handle is the source check's to refuse. */
		"{\"device\":0,\"kind\":\"cuda_fd\",\"size\":1}",
		"{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1}",
		"{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1,\"handle\":\"zz\"}",
	};
	struct rp_import_buffer out;
	struct rp_error err = { 0 };

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		cJSON *p = json(good[i]);

		ck_assert_msg(rp_import_buffer_decode(p, 0, &out, &err) == 0, "%s refused: %s", good[i],
			      err.name ? err.name : "");
		cJSON_Delete(p);
	}
}
END_TEST

/* Decodes text (served device 0) and asserts the source check's answer. */
static void check_source(const char *text, const int *fds, size_t nfds, const char *kind, const char *in_message)
{
	struct rp_import_buffer req;
	struct rp_error err = { 0 };
	cJSON *p = json(text);
	const cJSON *msg;

	ck_assert_int_eq(rp_import_buffer_decode(p, 0, &req, &err), 0);
	if (kind == NULL) {
		ck_assert_msg(rp_import_buffer_check_source(&req, fds, nfds, &err) == 0, "%s: source refused", text);
	} else {
		ck_assert_msg(rp_import_buffer_check_source(&req, fds, nfds, &err) == -EINVAL, "%s: source accepted",
			      text);
		msg = cJSON_GetObjectItemCaseSensitive(err.params, "message");
		ck_assert(cJSON_IsString(msg));
		ck_assert_msg(strstr(msg->valuestring, in_message) != NULL, "message: %s", msg->valuestring);
		assert_error(&err, RP_ERR_IMPORT_FAILED, "kind", kind);
	}
	cJSON_Delete(p);
}

START_TEST(import_buffer_source)
{
	const int one[] = { 7 }, taken[] = { -1 }, two[] = { 7, 8 };

	check_source("{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1,\"handle\":\"" H128 "\"}", NULL, 0, NULL, NULL);
	check_source("{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1}", NULL, 0, "cuda_ipc", "needs 'handle'");
	check_source("{\"device\":0,\"kind\":\"cuda_ipc\",\"size\":1,\"handle\":\"zz\"}", NULL, 0, "cuda_ipc",
		     "128 hex digits");
	check_source("{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"fd\":0}", one, 1, NULL, NULL);
	check_source("{\"device\":0,\"kind\":\"cuda_fd\",\"size\":1,\"fd\":1}", two, 2, NULL, NULL);
	check_source("{\"device\":0,\"kind\":\"host_fd\",\"size\":1}", one, 1, "host_fd", "(1 passed)");
	check_source("{\"device\":0,\"kind\":\"host_fd\",\"size\":1,\"fd\":0}", NULL, 0, "host_fd", "(0 passed)");
	check_source("{\"device\":0,\"kind\":\"cuda_fd\",\"size\":1,\"fd\":1}", one, 1, "cuda_fd", "needs 'fd'");
	check_source("{\"device\":0,\"kind\":\"cuda_fd\",\"size\":1,\"fd\":0}", taken, 1, "cuda_fd", "needs 'fd'");
}
END_TEST

START_TEST(import_buffer_reply)
{
	struct rp_import_buffer_reply in = { .buffer = { RP_ID_BUFFER, 2, 5, 17 }, .size = 4096 }, out;
	struct rp_error err = { 0 };
	cJSON *p = rp_import_buffer_reply_encode(&in);

	ck_assert_ptr_nonnull(p);
	ck_assert_str_eq(cJSON_GetObjectItem(p, "buffer")->valuestring, "b2.5.17");
	ck_assert_int_eq((int)cJSON_GetObjectItem(p, "generation")->valuedouble, 5);
	/* A field this side does not know is a newer daemon's, not an error. */
	cJSON_AddNumberToObject(p, "later", 1);
	ck_assert_int_eq(rp_import_buffer_reply_decode(p, &out, &err), 0);
	assert_id_eq(&out.buffer, &in.buffer);
	ck_assert_uint_eq(out.size, 4096);
	cJSON_Delete(p);
}
END_TEST

static const struct {
	const char *params;
	const char *parameter;
} buffer_reply_refusals[] = {
	{ "7", "parameters" },
	{ "{\"generation\":1,\"size\":1}", "buffer" },
	{ "{\"buffer\":\"b0.1\",\"generation\":1,\"size\":1}", "buffer" },
	{ "{\"buffer\":\"e0.1.1\",\"generation\":1,\"size\":1}", "buffer" },
	{ "{\"buffer\":\"b0.1.1\",\"size\":1}", "generation" },
	{ "{\"buffer\":\"b0.1.1\",\"generation\":2,\"size\":1}", "generation" },
	{ "{\"buffer\":\"b0.1.1\",\"generation\":1}", "size" },
	{ "{\"buffer\":\"b0.1.1\",\"generation\":1,\"size\":0}", "size" },
	{ "{\"buffer\":\"b0.1.1\",\"generation\":1,\"size\":\"1\"}", "size" },
};

START_TEST(import_buffer_reply_refusals)
{
	struct rp_import_buffer_reply out;
	struct rp_error err = { 0 };
	cJSON *p = json(buffer_reply_refusals[_i].params);

	ck_assert_msg(rp_import_buffer_reply_decode(p, &out, &err) == -EINVAL, "%s accepted",
		      buffer_reply_refusals[_i].params);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", buffer_reply_refusals[_i].parameter);
	cJSON_Delete(p);
}
END_TEST

START_TEST(import_event_round_trip)
{
	struct rp_import_event in = { .device = 1 }, out;
	struct rp_import_event_reply rin = { .event = { RP_ID_EVENT, 1, 3, 9 } }, rout;
	struct rp_error err = { 0 };
	char hex[RP_HANDLE_HEX_LEN + 1];
	cJSON *p;

	sample_handle(in.handle, hex);
	p = rp_import_event_encode(&in);
	ck_assert_ptr_nonnull(p);
	ck_assert_str_eq(cJSON_GetObjectItem(p, "handle")->valuestring, hex);
	ck_assert_int_eq(rp_import_event_decode(p, 1, &out, &err), 0);
	ck_assert_uint_eq(out.device, 1);
	ck_assert_mem_eq(out.handle, in.handle, RP_HANDLE_SIZE);
	cJSON_Delete(p);

	p = rp_import_event_reply_encode(&rin);
	ck_assert_ptr_nonnull(p);
	ck_assert_str_eq(cJSON_GetObjectItem(p, "event")->valuestring, "e1.3.9");
	ck_assert_int_eq(rp_import_event_reply_decode(p, &rout, &err), 0);
	assert_id_eq(&rout.event, &rin.event);
	cJSON_Delete(p);
}
END_TEST

static const struct {
	const char *params;
	int served;
	const char *error;
	const char *key, *value;
} event_refusals[] = {
	{ "null", 0, RP_ERR_INVALID_PARAMETER, "parameter", "parameters" },
	{ "{\"device\":0}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
	{ "{\"handle\":\"" H128 "\"}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "device" },
	{ "{\"device\":0,\"handle\":\"" H128 "\",\"kind\":\"x\"}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "kind" },
	{ "{\"device\":2,\"handle\":\"" H128 "\"}", 0, RP_ERR_NO_SUCH_DEVICE, "device", "2" },
	{ "{\"device\":2,\"handle\":\"zz\"}", 0, RP_ERR_NO_SUCH_DEVICE, "device", "2" },
	{ "{\"device\":0,\"handle\":\"\"}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
	{ "{\"device\":0,\"handle\":\"zz\"}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
	{ "{\"device\":0,\"handle\":\"" H128 "0\"}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
	{ "{\"device\":0,\"handle\":7}", 0, RP_ERR_INVALID_PARAMETER, "parameter", "handle" },
	{ "{\"device\":0,\"handle\":\"x0112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	  "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}", 0, RP_ERR_INVALID_PARAMETER,
	  "parameter", "handle" },
};

START_TEST(import_event_refusals)
{
	struct rp_import_event out;
	struct rp_error err = { 0 };
	cJSON *p = json(event_refusals[_i].params);

	ck_assert_msg(rp_import_event_decode(p, event_refusals[_i].served, &out, &err) == -EINVAL, "%s accepted",
		      event_refusals[_i].params);
	assert_error(&err, event_refusals[_i].error, event_refusals[_i].key, event_refusals[_i].value);
	cJSON_Delete(p);
}
END_TEST

START_TEST(import_event_reply_refusals)
{
	static const struct {
		const char *params, *parameter;
	} bad[] = {
		{ "[]", "parameters" },
		{ "{\"generation\":1}", "event" },
		{ "{\"event\":\"b0.1.1\",\"generation\":1}", "event" },
		{ "{\"event\":\"e0.1.1\"}", "generation" },
		{ "{\"event\":\"e0.1.1\",\"generation\":3}", "generation" },
	};
	struct rp_import_event_reply out;
	struct rp_error err = { 0 };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cJSON *p = json(bad[i].params);

		ck_assert_msg(rp_import_event_reply_decode(p, &out, &err) == -EINVAL, "%s accepted", bad[i].params);
		assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", bad[i].parameter);
		cJSON_Delete(p);
	}
}
END_TEST

START_TEST(close_round_trip)
{
	const struct rp_id buffer = { RP_ID_BUFFER, 0, 4, 2 }, event = { RP_ID_EVENT, 1, 1, 0 };
	struct rp_error err = { 0 };
	struct rp_id out;
	cJSON *p;

	p = rp_close_object_encode(RP_ID_BUFFER, &buffer);
	ck_assert_str_eq(cJSON_GetObjectItem(p, "buffer")->valuestring, "b0.4.2");
	ck_assert_int_eq(rp_close_object_decode(p, RP_ID_BUFFER, &out, &err), 0);
	assert_id_eq(&out, &buffer);
	cJSON_Delete(p);
	p = rp_close_object_encode(RP_ID_EVENT, &event);
	ck_assert_str_eq(cJSON_GetObjectItem(p, "event")->valuestring, "e1.1.0");
	ck_assert_int_eq(rp_close_object_decode(p, RP_ID_EVENT, &out, &err), 0);
	assert_id_eq(&out, &event);
	cJSON_Delete(p);
	/* An id of the other kind is the worker's to refuse (NoSuchObject). */
	p = json("{\"buffer\":\"e0.1.1\"}");
	ck_assert_int_eq(rp_close_object_decode(p, RP_ID_BUFFER, &out, &err), 0);
	ck_assert_int_eq(out.kind, RP_ID_EVENT);
	cJSON_Delete(p);
}
END_TEST

static const struct {
	const char *params;
	enum rp_id_kind kind;
	const char *parameter;
} close_refusals[] = {
	{ "\"b0.1.1\"", RP_ID_BUFFER, "parameters" },
	{ "{}", RP_ID_BUFFER, "buffer" },
	{ "{}", RP_ID_EVENT, "event" },
	{ "{\"event\":\"e0.1.1\"}", RP_ID_BUFFER, "event" },
	{ "{\"buffer\":\"b0.1.1\",\"x\":1}", RP_ID_BUFFER, "x" },
	{ "{\"buffer\":null}", RP_ID_BUFFER, "buffer" },
	{ "{\"buffer\":\"\"}", RP_ID_BUFFER, "buffer" },
	{ "{\"buffer\":1}", RP_ID_BUFFER, "buffer" },
	{ "{\"buffer\":\"b0.0.1\"}", RP_ID_BUFFER, "buffer" },
	{ "{\"buffer\":\"b0.1.1 \"}", RP_ID_BUFFER, "buffer" },
	{ "{\"event\":\"x0.1.1\"}", RP_ID_EVENT, "event" },
	{ "{\"event\":\"e0.1.0000000000000000000000000000000000000000000000000000000000000001\"}", RP_ID_EVENT,
	  "event" },
};

START_TEST(close_refused)
{
	struct rp_error err = { 0 };
	struct rp_id out;
	cJSON *p = json(close_refusals[_i].params);

	ck_assert_msg(rp_close_object_decode(p, close_refusals[_i].kind, &out, &err) == -EINVAL, "%s accepted",
		      close_refusals[_i].params);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", close_refusals[_i].parameter);
	cJSON_Delete(p);
}
END_TEST

#define N(a) (sizeof(a) / sizeof((a)[0]))

static Suite *memory_suite(void)
{
	Suite *s = suite_create("memory");
	TCase *tc = tcase_create("handle");

	tcase_add_test(tc, hex_round_trip);
	tcase_add_test(tc, hex_refusals);
	suite_add_tcase(s, tc);

	tc = tcase_create("buffers");
	tcase_add_test(tc, import_buffer_round_trip);
	tcase_add_loop_test(tc, import_buffer_refusals, 0, N(import_refusals));
	tcase_add_test(tc, import_buffer_accepts);
	tcase_add_test(tc, import_buffer_source);
	tcase_add_test(tc, import_buffer_reply);
	tcase_add_loop_test(tc, import_buffer_reply_refusals, 0, N(buffer_reply_refusals));
	suite_add_tcase(s, tc);

	tc = tcase_create("events");
	tcase_add_test(tc, import_event_round_trip);
	tcase_add_loop_test(tc, import_event_refusals, 0, N(event_refusals));
	tcase_add_test(tc, import_event_reply_refusals);
	suite_add_tcase(s, tc);

	tc = tcase_create("close");
	tcase_add_test(tc, close_round_trip);
	tcase_add_loop_test(tc, close_refused, 0, N(close_refusals));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(memory_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
