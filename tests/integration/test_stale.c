/* Stale ids: a buffer imported in one generation, used after a Release of
 * its device, is refused with io.regen.StaleGeneration carrying the
 * device's current generation. A device not released keeps its ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "itest.h"

static struct it_daemon daemon_;

static int64_t param_int(regen_client *c, const char *key)
{
	const char *text = regen_client_error_parameters(c);
	cJSON *p = text ? cJSON_Parse(text) : NULL;
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(p, key);
	int64_t v = cJSON_IsNumber(it) ? (int64_t)it->valuedouble : -1;

	cJSON_Delete(p);
	return v;
}

static void gemm_ok(regen_client *c, struct it_mem *m, const char *what)
{
	struct it_gemm_case gc;
	char why[512] = "";
	int r;

	it_gemm_random_case(&gc, 24);
	r = it_gemm_run(c, m, 0, &gc, why, sizeof(why));
	if (r < 0) {
		it_fail_call(__FILE__, __LINE__, what, c, r);
	}
	CHECK(r == 0, "%s: wrong result: %s", what, why);
}

static void expect_stale(regen_client *c, int r, int device, uint64_t generation, const char *what)
{
	CHECK(r == -EREMOTE, "%s: expected io.regen.StaleGeneration, got %d (%s)", what, r, strerror(-r));
	CHECK(strcmp(regen_client_error_name(c), REGEN_ERROR_STALE_GENERATION) == 0, "%s: got %s: %s", what,
	      regen_client_error_name(c), regen_client_error_message(c) ? regen_client_error_message(c) : "");
	CHECK(param_int(c, "device") == device, "%s: error names device %lld, want %d (%s)", what,
	      (long long)param_int(c, "device"), device, regen_client_error_parameters(c));
	CHECK(param_int(c, "generation") == (int64_t)generation,
	      "%s: error carries generation %lld, the device is in %llu (%s)", what,
	      (long long)param_int(c, "generation"), (unsigned long long)generation, regen_client_error_parameters(c));
	CHECK(regen_client_error_message(c) != NULL, "%s: StaleGeneration without a message", what);
}

int main(void)
{
	regen_status *before, *after, *st;
	struct it_mem m0, m1;
	struct it_gemm_case gc;
	regen_client *c;
	char params[256], why[512];
	uint64_t g0, g1, was0, was1;
	int r;

	it_rand_seed(it_rand_seed_default());
	it_daemon_start(&daemon_, NULL, 110);
	c = it_connect(&daemon_);
	before = it_status(c);
	CHECK(regen_status_device_count(before) == 2, "%d devices", regen_status_device_count(before));
	was0 = it_device(before, 0)->generation;
	was1 = it_device(before, 1)->generation;

	it_mem_create(c, 0, 1 << 18, &m0);
	it_mem_create(c, 1, 1 << 18, &m1);
	CHECK(regen_buffer_generation(m0.buf) == was0, "buffer generation %llu, device generation %llu",
	      (unsigned long long)regen_buffer_generation(m0.buf), (unsigned long long)was0);
	CHECK(regen_buffer_size(m0.buf) == 1 << 18, "buffer of %llu bytes", (unsigned long long)regen_buffer_size(m0.buf));
	it_log("imported %s and %s", regen_buffer_id(m0.buf), regen_buffer_id(m1.buf));
	gemm_ok(c, &m0, "gemm on device 0 before release");
	gemm_ok(c, &m1, "gemm on device 1 before release");

	/* Release device 0 only. */
	CHECK_OK(c, regen_release(c, 0, "test_stale", &after));
	g0 = it_device(after, 0)->generation;
	CHECK(g0 > was0, "Release returned generation %llu for device 0, was %llu", (unsigned long long)g0,
	      (unsigned long long)was0);
	CHECK(regen_status_epoch(after) > regen_status_epoch(before), "epoch %llu -> %llu",
	      (unsigned long long)regen_status_epoch(before), (unsigned long long)regen_status_epoch(after));
	regen_status_free(after);
	st = it_status(c);
	CHECK(it_device(st, 0)->generation == g0, "Status generation %llu != Release's %llu",
	      (unsigned long long)it_device(st, 0)->generation, (unsigned long long)g0);
	CHECK(it_device(st, 1)->generation == was1, "device 1's generation moved: %llu -> %llu",
	      (unsigned long long)was1, (unsigned long long)it_device(st, 1)->generation);
	regen_status_free(st);

	/* The old id through the GEMM path. */
	it_gemm_random_case(&gc, 16);
	r = it_gemm_run(c, &m0, 0, &gc, why, sizeof(why));
	expect_stale(c, r, 0, g0, "gemm with a buffer of the old generation");

	/* And raw, for CloseBuffer. */
	snprintf(params, sizeof(params), "{\"buffer\":\"%s\"}", regen_buffer_id(m0.buf));
	r = regen_call(c, 0, "io.regen.Memory.CloseBuffer", params, NULL, 0, NULL);
	expect_stale(c, r, 0, g0, "CloseBuffer of a buffer of the old generation");

	/* Device 1 was not released: its buffer still works. */
	gemm_ok(c, &m1, "gemm on device 1 after device 0's release");

	/* Re-import and work again. */
	CHECK_OK(c, it_mem_import(c, 0, &m0));
	CHECK(regen_buffer_generation(m0.buf) == g0, "re-imported buffer in generation %llu, want %llu",
	      (unsigned long long)regen_buffer_generation(m0.buf), (unsigned long long)g0);
	gemm_ok(c, &m0, "gemm after re-import");

	/* Reset bumps too; so does a release of every device. */
	CHECK_OK(c, regen_reset(c, 0, "test_stale reset", NULL));
	g1 = it_wait_generation(c, 0, g0, 20);
	r = it_gemm_run(c, &m0, 0, &gc, why, sizeof(why));
	expect_stale(c, r, 0, g1, "gemm after Reset");
	CHECK_OK(c, regen_release(c, -1, "test_stale all", NULL));
	st = it_status(c);
	CHECK(it_device(st, 1)->generation > was1, "Release of all left device 1 in %llu",
	      (unsigned long long)it_device(st, 1)->generation);
	r = it_gemm_run(c, &m1, 0, &gc, why, sizeof(why));
	expect_stale(c, r, 1, it_device(st, 1)->generation, "gemm on device 1 after Release of all");
	regen_status_free(st);
	regen_status_free(before);
	CHECK_OK(c, it_mem_import(c, 0, &m0));
	CHECK_OK(c, it_mem_import(c, 1, &m1));
	gemm_ok(c, &m0, "device 0 after re-import");
	gemm_ok(c, &m1, "device 1 after re-import");

	it_mem_free(&m0);
	it_mem_free(&m1);
	regen_client_destroy(c);
	CHECK(it_daemon_alive(&daemon_), "regend died");
	it_log("PASS");
	return 0;
}
