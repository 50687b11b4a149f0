/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Keep's codecs (proto/keep.h): what one side encodes the other
 * decodes to the same struct; every refusal names the field, with the
 * error the supervisor sends. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/keep.h"

static cJSON *json(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

/* err is `name` with parameter `key` equal to `value`; cleared after. */
static void assert_error(struct rp_error *err, const char *name, const char *key, const char *value)
{
	const cJSON *p;

	ck_assert_ptr_nonnull(err->name);
	ck_assert_str_eq(err->name, name);
	p = cJSON_GetObjectItemCaseSensitive(err->params, key);
	ck_assert_msg(cJSON_IsString(p), "%s lacks %s", name, key);
	ck_assert_str_eq(p->valuestring, value);
	rp_error_clear(err);
}

START_TEST(keep_round_trip)
{
	struct rp_keep req = { .key = { .has_job = true, .job = "slurm:42", .has_rank = true, .rank = 7,
					.has_name = true, .name = "chunk-3" },
			       .kind = RP_MEMORY_CUDA_FD, .fd = 2, .size = 1ull << 40, .has_device = true, .device = 3,
			       .has_lease = true, .lease_ms = 120000 };
	struct rp_keep got;
	struct rp_error err = { 0 };
	cJSON *p = rp_keep_encode(&req);

	ck_assert_int_eq(rp_keep_decode(p, &got, &err), 0);
	ck_assert(got.key.has_job && got.key.has_rank && got.key.has_name);
	ck_assert_str_eq(got.key.job, "slurm:42");
	ck_assert_uint_eq(got.key.rank, 7);
	ck_assert_str_eq(got.key.name, "chunk-3");
	ck_assert_int_eq(got.kind, RP_MEMORY_CUDA_FD);
	ck_assert_uint_eq(got.fd, 2);
	ck_assert_uint_eq(got.size, 1ull << 40);
	ck_assert(got.has_device && got.device == 3 && got.has_lease && got.lease_ms == 120000);
	cJSON_Delete(p);
	/* No job (the connection's), no lease (regend's): absent, not zero. */
	p = json("{\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":4096}");
	ck_assert_int_eq(rp_keep_decode(p, &got, &err), 0);
	ck_assert(!got.key.has_job && !got.has_lease && !got.has_device);
	ck_assert_int_eq(got.kind, RP_MEMORY_HOST_FD);
	cJSON_Delete(p);
}
END_TEST

static const struct {
	const char *params, *error, *key, *value;
} keep_refusals[] = {
	{ "{\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter", "rank" },
	{ "{\"rank\":-1,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "rank" },
	{ "{\"rank\":2147483648,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER,
	  "parameter", "rank" },
	{ "{\"rank\":0,\"name\":\"w x\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "name" },
	{ "{\"rank\":0,\"name\":\"\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "name" },
	{ "{\"rank\":0,\"name\":\"0123456789012345678901234567890123456789012345678901234567890123x\",\"kind\":"
	  "\"host_fd\",\"fd\":0,\"size\":1}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "name" },
	{ "{\"rank\":0,\"name\":\"w\",\"kind\":\"cuda_ipc\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "kind" },
	{ "{\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":16,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "fd" },
	{ "{\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":0}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "size" },
	{ "{\"rank\":0,\"name\":\"w\",\"kind\":\"cuda_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER, "parameter",
	  "device" },
	{ "{\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1,\"device\":0}", RP_ERR_INVALID_PARAMETER,
	  "parameter", "device" },
	{ "{\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1,\"lease\":5}", RP_ERR_INVALID_PARAMETER,
	  "parameter", "lease" },
	{ "{\"job\":\"-x\",\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_JOB, "reason",
	  "character" },
	{ "{\"job\":\"\",\"rank\":0,\"name\":\"w\",\"kind\":\"host_fd\",\"fd\":0,\"size\":1}", RP_ERR_INVALID_PARAMETER,
	  "parameter", "job" },
};

START_TEST(keep_refused)
{
	struct rp_error err = { 0 };
	struct rp_keep got;
	cJSON *p = json(keep_refusals[_i].params);

	ck_assert_int_lt(rp_keep_decode(p, &got, &err), 0);
	assert_error(&err, keep_refusals[_i].error, keep_refusals[_i].key, keep_refusals[_i].value);
	cJSON_Delete(p);
}
END_TEST

START_TEST(selects)
{
	struct rp_error err = { 0 };
	struct rp_keep_select sel;
	struct rp_keep_commit commit;
	cJSON *p;

	p = json("{\"job\":\"j\",\"rank\":1,\"name\":\"w\",\"uid\":1000}");
	ck_assert_int_eq(rp_keep_take_back_decode(p, &sel, &err), 0);
	ck_assert(sel.has_uid && sel.uid == 1000 && sel.key.has_name && sel.key.rank == 1);
	cJSON_Delete(p);
	p = rp_keep_select_encode(&sel);
	ck_assert_int_eq(rp_keep_take_back_decode(p, &sel, &err), 0);
	ck_assert_str_eq(sel.key.name, "w");
	cJSON_Delete(p);
	/* TakeBack names one: a name it must have. */
	p = json("{\"rank\":1}");
	ck_assert_int_lt(rp_keep_take_back_decode(p, &sel, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "name");
	cJSON_Delete(p);
	/* Drop: a job it must have, and a name only beside a rank. */
	p = json("{\"rank\":1}");
	ck_assert_int_lt(rp_keep_drop_decode(p, &sel, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "job");
	cJSON_Delete(p);
	p = json("{\"job\":\"j\",\"name\":\"w\"}");
	ck_assert_int_lt(rp_keep_drop_decode(p, &sel, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "name");
	cJSON_Delete(p);
	p = json("{\"job\":\"j\"}");
	ck_assert_int_eq(rp_keep_drop_decode(p, &sel, &err), 0);
	ck_assert(!sel.key.has_rank && !sel.key.has_name && !sel.has_uid);
	cJSON_Delete(p);
	/* List takes no rank. */
	p = json("{\"job\":\"j\",\"rank\":0}");
	ck_assert_int_lt(rp_keep_list_decode(p, &sel, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "rank");
	cJSON_Delete(p);
	/* A step past what a JSON number holds exactly. */
	p = json("{\"rank\":0,\"step\":9007199254740994}");
	ck_assert_int_lt(rp_keep_commit_decode(p, &commit, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "step");
	cJSON_Delete(p);
}
END_TEST

static void assert_kept_eq(const struct rp_kept *a, const struct rp_kept *b)
{
	ck_assert_str_eq(a->job, b->job);
	ck_assert_str_eq(a->name, b->name);
	ck_assert_uint_eq(a->rank, b->rank);
	ck_assert_uint_eq(a->uid, b->uid);
	ck_assert_int_eq(a->kind, b->kind);
	ck_assert(a->has_device == b->has_device && a->device == b->device);
	ck_assert_uint_eq(a->size, b->size);
	ck_assert(a->has_step == b->has_step && a->step == b->step);
	ck_assert(a->held == b->held && a->has_holder_pid == b->has_holder_pid && a->holder_pid == b->holder_pid);
	ck_assert_uint_eq(a->lease_ms, b->lease_ms);
	ck_assert(a->has_expires == b->has_expires && a->expires_unix_ms == b->expires_unix_ms);
	ck_assert_uint_eq(a->kept_unix_ms, b->kept_unix_ms);
}

START_TEST(kept_round_trip)
{
	struct rp_kept k = { .job = "train", .rank = 3, .name = "opt", .uid = 1000, .kind = RP_MEMORY_CUDA_FD,
			     .has_device = true, .device = 1, .size = 1ull << 33, .has_step = true, .step = 12345,
			     .held = false, .lease_ms = 300000, .has_expires = true, .expires_unix_ms = 1800000000000,
			     .kept_unix_ms = 1700000000000 };
	struct rp_kept got;
	struct rp_error err = { 0 };
	cJSON *o = rp_kept_encode(&k);

	ck_assert_int_eq(rp_kept_decode(o, "kept.", &got, &err), 0);
	assert_kept_eq(&k, &got);
	/* A field missing is named with the caller's prefix. */
	cJSON_DeleteItemFromObject(o, "size");
	ck_assert_int_lt(rp_kept_decode(o, "kept[2].", &got, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "kept[2].size");
	cJSON_Delete(o);
	k.held = true;
	k.has_holder_pid = true;
	k.holder_pid = 4242;
	k.has_expires = false;
	k.expires_unix_ms = 0;
	k.has_step = false;
	k.step = 0;
	k.has_device = false;
	k.device = 0;
	k.kind = RP_MEMORY_HOST_FD;
	o = rp_kept_encode(&k);
	ck_assert_int_eq(rp_kept_decode(o, "kept.", &got, &err), 0);
	assert_kept_eq(&k, &got);
	cJSON_Delete(o);
}
END_TEST

START_TEST(key_text)
{
	char buf[RP_KEPT_KEY_TEXT_MAX];
	uint32_t rank = 4;

	ck_assert_str_eq(rp_kept_key_text("j", &rank, "w", buf, sizeof(buf)), "j/4/w");
	ck_assert_str_eq(rp_kept_key_text("j", &rank, NULL, buf, sizeof(buf)), "j/4");
	ck_assert_str_eq(rp_kept_key_text("j", NULL, NULL, buf, sizeof(buf)), "j");
}
END_TEST

#define N(a) (sizeof(a) / sizeof((a)[0]))

static Suite *keep_suite(void)
{
	Suite *s = suite_create("keep");
	TCase *tc = tcase_create("codecs");

	tcase_add_test(tc, keep_round_trip);
	tcase_add_loop_test(tc, keep_refused, 0, N(keep_refusals));
	tcase_add_test(tc, selects);
	tcase_add_test(tc, kept_round_trip);
	tcase_add_test(tc, key_text);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(keep_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
