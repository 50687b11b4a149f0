/* SPDX-License-Identifier: Apache-2.0 */
/* libregen's io.regen.Memory calls against a real regend with the host
 * backend: a host_fd buffer's id, generation and size; the CUDA kinds
 * (cuda_ipc, cuda_fd) and ImportEvent refused by that backend with the
 * named error a client can act on; closing and naming events that do not
 * exist refused; and none of it costs a generation or a worker. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/lib/client.h"

static struct tl_daemon daemon_;

/* Asserts the last call failed with `name` and, when key is set, that its
 * parameters carry "key":"value". */
static void expect_error(regen_client *c, int r, const char *name, const char *key, const char *value,
			 const char *what)
{
	const char *params = regen_client_error_parameters(c);
	char want[256];

	ASSERT_EQ(r, -EREMOTE, "%s: %d (%s), want %s", what, r, strerror(-r), name);
	ASSERT_STR_EQ(regen_client_error_name(c), name, "%s: %s (%s), want %s", what, regen_client_error_name(c),
	              params ? params : "", name);
	if (key != NULL) {
		snprintf(want, sizeof(want), "\"%s\":\"%s\"", key, value);
		ASSERT(params != NULL && strstr(params, want) != NULL, "%s: parameters %s lack %s", what,
		       params ? params : "(none)", want);
	}
	tl_log("ok  %s: %s %s", what, name, params ? params : "");
}

int main(void)
{
	unsigned char handle[64];
	struct regen_gemm_args g = { 0 };
	const struct regen_device_info *was, *now;
	regen_status *before, *after;
	regen_buffer *buf = NULL;
	regen_event *ev = (regen_event *)&g;
	struct tl_buffer m;
	regen_client *c;
	char params[256];
	int r, i;

	tl_init(110);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);
	before = tl_status(c);

	/* host_fd: what the worker mapped. */
	tl_buffer_create(c, 1, 3 << 16, &m);
	ASSERT_EQ(regen_buffer_device(m.buf), 1, "device %d", regen_buffer_device(m.buf));
	ASSERT_UINT_EQ(regen_buffer_generation(m.buf), tl_status_device(before, 1)->generation, "generation %llu",
	               (unsigned long long)regen_buffer_generation(m.buf));
	ASSERT_UINT_EQ(regen_buffer_size(m.buf), 3 << 16, "size %llu", (unsigned long long)regen_buffer_size(m.buf));
	ASSERT(strncmp(regen_buffer_id(m.buf), "b1.", 3) == 0, "id %s", regen_buffer_id(m.buf));

	/* The host backend maps no CUDA memory and imports no CUDA events. */
	memset(handle, 0xab, sizeof(handle));
	r = regen_buffer_import_cuda_ipc(c, 0, handle, 0, 4096, &buf);
	expect_error(c, r, REGEN_ERROR_IMPORT_FAILED, "kind", "cuda_ipc", "cuda_ipc on the host backend");
	ASSERT_NULL(buf, "a buffer after a failed import");
	r = regen_buffer_import_cuda_fd(c, 0, m.mem.fd, 0, 4096, &buf);
	expect_error(c, r, REGEN_ERROR_IMPORT_FAILED, "kind", "cuda_fd", "cuda_fd on the host backend");
	ASSERT_NULL(buf, "a buffer after a failed import");
	r = regen_event_import_cuda_ipc(c, 0, handle, &ev);
	expect_error(c, r, REGEN_ERROR_METHOD_NOT_IMPLEMENTED, "method", "io.regen.Memory.ImportEvent",
		     "ImportEvent on the host backend");
	ASSERT_NULL(ev, "an event after a failed import");

	/* Ids of events nobody imported. */
	snprintf(params, sizeof(params), "{\"event\":\"e1.%llu.999\"}", (unsigned long long)regen_buffer_generation(m.buf));
	r = regen_call(c, 1, "io.regen.Memory.CloseEvent", params, NULL, 0, NULL);
	expect_error(c, r, REGEN_ERROR_NO_SUCH_OBJECT, NULL, NULL, "CloseEvent of an event never imported");
	r = regen_call(c, 1, "io.regen.Memory.CloseEvent", "{\"event\":\"e1\"}", NULL, 0, NULL);
	expect_error(c, r, REGEN_ERROR_INVALID_PARAMETER, "parameter", "event", "CloseEvent of a malformed id");
	snprintf(params, sizeof(params),
		 "{\"a\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		 "\"b\":{\"buffer\":\"%s\",\"dtype\":\"f32\",\"shape\":[4,4]},"
		 "\"d\":{\"buffer\":\"%s\",\"offset\":4096,\"dtype\":\"f32\",\"shape\":[4,4]},"
		 "\"wait_event\":\"e1.%llu.999\"}",
		 regen_buffer_id(m.buf), regen_buffer_id(m.buf), regen_buffer_id(m.buf),
		 (unsigned long long)regen_buffer_generation(m.buf));
	r = regen_call(c, 1, "io.regen.Compute.Gemm", params, NULL, 0, NULL);
	expect_error(c, r, REGEN_ERROR_NO_SUCH_OBJECT, NULL, NULL, "Gemm waiting for an event never imported");

	/* The buffer still serves, and nothing changed generation. */
	g.a.buffer = g.b.buffer = g.d.buffer = m.buf;
	g.a.rank = g.b.rank = g.d.rank = 2;
	g.a.shape[0] = g.a.shape[1] = g.b.shape[0] = g.b.shape[1] = g.d.shape[0] = g.d.shape[1] = 4;
	g.d.offset = 4096;
	ASSERT_REGEN_OK(c, regen_gemm(c, &g));
	after = tl_status(c);
	for (i = 0; i < regen_status_device_count(before); i++) {
		was = regen_status_device(before, i);
		now = tl_status_device(after, was->index);
		ASSERT(now->generation == was->generation && now->worker_pid == was->worker_pid,
		       "device %d: generation %llu -> %llu, worker %lld -> %lld", was->index,
		       (unsigned long long)was->generation, (unsigned long long)now->generation, (long long)was->worker_pid,
		       (long long)now->worker_pid);
	}
	regen_status_free(before);
	regen_status_free(after);
	tl_buffer_free(&m);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
