/* SPDX-License-Identifier: Apache-2.0 */
/* Stale ids: a buffer imported in one generation, used after a Release of
 * its device, is refused with io.regen.StaleGeneration carrying the
 * device's current generation. A device not released keeps its ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "tests/lib/client.h"

static struct tl_daemon daemon_;

static int64_t param_int(regen_client *c, const char *key)
{
	const char *text = regen_client_error_parameters(c);
	cJSON *p = text ? cJSON_Parse(text) : NULL;
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(p, key);
	int64_t v = cJSON_IsNumber(it) ? (int64_t)it->valuedouble : -1;

	cJSON_Delete(p);
	return v;
}

static void expect_stale(regen_client *c, int r, int device, uint64_t generation, const char *what)
{
	ASSERT_EQ(r, -EREMOTE, "%s: expected io.regen.StaleGeneration, got %d (%s)", what, r, strerror(-r));
	ASSERT_STR_EQ(regen_client_error_name(c), REGEN_ERROR_STALE_GENERATION, "%s: got %s: %s", what,
	              regen_client_error_name(c), regen_client_error_message(c) ? regen_client_error_message(c) : "");
	ASSERT_EQ(param_int(c, "device"), device, "%s: error names device %lld, want %d (%s)", what,
	          (long long)param_int(c, "device"), device, regen_client_error_parameters(c));
	ASSERT_EQ(param_int(c, "generation"), (int64_t)generation,
	          "%s: error carries generation %lld, the device is in %llu (%s)", what,
	          (long long)param_int(c, "generation"), (unsigned long long)generation, regen_client_error_parameters(c));
	ASSERT_NOT_NULL(regen_client_error_message(c), "%s: StaleGeneration without a message", what);
}

int main(void)
{
	regen_status *before, *after, *st;
	struct tl_buffer m0, m1;
	struct tl_gemm_case gc;
	regen_client *c;
	char params[256], why[512];
	uint64_t g0, g1, was0, was1;
	int r;

	tl_init(110);
	tl_daemon_start(&daemon_, NULL);
	c = tl_client_connect(&daemon_);
	before = tl_status(c);
	ASSERT_EQ(regen_status_device_count(before), 2, "%d devices", regen_status_device_count(before));
	was0 = tl_status_device(before, 0)->generation;
	was1 = tl_status_device(before, 1)->generation;

	tl_buffer_create(c, 0, 1 << 18, &m0);
	tl_buffer_create(c, 1, 1 << 18, &m1);
	ASSERT_UINT_EQ(regen_buffer_generation(m0.buf), was0, "buffer generation %llu, device generation %llu",
	               (unsigned long long)regen_buffer_generation(m0.buf), (unsigned long long)was0);
	ASSERT_UINT_EQ(regen_buffer_size(m0.buf), 1 << 18, "the buffer's size");
	tl_log("imported %s and %s", regen_buffer_id(m0.buf), regen_buffer_id(m1.buf));
	ASSERT_GEMM_OK(c, &m0, "gemm on device 0 before release");
	ASSERT_GEMM_OK(c, &m1, "gemm on device 1 before release");

	/* Release device 0 only. */
	ASSERT_REGEN_OK(c, regen_release(c, 0, "test_stale", &after));
	g0 = tl_status_device(after, 0)->generation;
	ASSERT_UINT_GT(g0, was0, "Release returned generation %llu for device 0, was %llu", (unsigned long long)g0,
	               (unsigned long long)was0);
	ASSERT_UINT_GT(regen_status_epoch(after), regen_status_epoch(before), "epoch %llu -> %llu",
	               (unsigned long long)regen_status_epoch(before), (unsigned long long)regen_status_epoch(after));
	regen_status_free(after);
	st = tl_status(c);
	ASSERT_UINT_EQ(tl_status_device(st, 0)->generation, g0, "Status generation %llu != Release's %llu",
	               (unsigned long long)tl_status_device(st, 0)->generation, (unsigned long long)g0);
	ASSERT_UINT_EQ(tl_status_device(st, 1)->generation, was1, "device 1's generation moved: %llu -> %llu",
	               (unsigned long long)was1, (unsigned long long)tl_status_device(st, 1)->generation);
	regen_status_free(st);

	/* The old id through the GEMM path. */
	tl_gemm_random_case(&gc, 16);
	r = tl_gemm_run(c, &m0, 0, &gc, why, sizeof(why));
	expect_stale(c, r, 0, g0, "gemm with a buffer of the old generation");

	/* And raw, for CloseBuffer. */
	snprintf(params, sizeof(params), "{\"buffer\":\"%s\"}", regen_buffer_id(m0.buf));
	r = regen_call(c, 0, "io.regen.Memory.CloseBuffer", params, NULL, 0, NULL);
	expect_stale(c, r, 0, g0, "CloseBuffer of a buffer of the old generation");

	/* Device 1 was not released: its buffer still works. */
	ASSERT_GEMM_OK(c, &m1, "gemm on device 1 after device 0's release");

	/* Re-import and work again. */
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &m0));
	ASSERT_UINT_EQ(regen_buffer_generation(m0.buf), g0, "re-imported buffer in generation %llu, want %llu",
	               (unsigned long long)regen_buffer_generation(m0.buf), (unsigned long long)g0);
	ASSERT_GEMM_OK(c, &m0, "gemm after re-import");

	/* Reset bumps too; so does a release of every device. */
	ASSERT_REGEN_OK(c, regen_reset(c, 0, "test_stale reset", NULL));
	g1 = tl_wait_generation(c, 0, g0, 20);
	r = tl_gemm_run(c, &m0, 0, &gc, why, sizeof(why));
	expect_stale(c, r, 0, g1, "gemm after Reset");
	ASSERT_REGEN_OK(c, regen_release(c, -1, "test_stale all", NULL));
	st = tl_status(c);
	ASSERT_UINT_GT(tl_status_device(st, 1)->generation, was1, "Release of all left device 1 in %llu",
	               (unsigned long long)tl_status_device(st, 1)->generation);
	r = tl_gemm_run(c, &m1, 0, &gc, why, sizeof(why));
	expect_stale(c, r, 1, tl_status_device(st, 1)->generation, "gemm on device 1 after Release of all");
	regen_status_free(st);
	regen_status_free(before);
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 0, &m0));
	ASSERT_REGEN_OK(c, tl_buffer_import(c, 1, &m1));
	ASSERT_GEMM_OK(c, &m0, "device 0 after re-import");
	ASSERT_GEMM_OK(c, &m1, "device 1 after re-import");

	tl_buffer_free(&m0);
	tl_buffer_free(&m1);
	regen_client_destroy(c);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	tl_log("PASS");
	return 0;
}
