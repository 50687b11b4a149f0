/* SPDX-License-Identifier: Apache-2.0 */
/* Call parameters: the schema check and the typed getters. Every refusal is
 * org.varlink.service.InvalidParameter naming the parameter, so a client
 * learns exactly which field was wrong. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/params.h"

static cJSON *json(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

/* Asserts err is InvalidParameter {parameter: name} and nothing else. */
static void assert_invalid_parameter(struct rp_error *err, const char *name)
{
	const cJSON *p;

	ck_assert_str_eq(err->name, RP_ERR_INVALID_PARAMETER);
	p = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");
	ck_assert(cJSON_IsString(p));
	ck_assert_str_eq(p->valuestring, name);
	ck_assert_int_eq(cJSON_GetArraySize(err->params), 1);
	rp_error_clear(err);
}

/* rp_params_uint with max 1000 on {"v": <value>}. */
static const struct {
	const char *value;
	int result;
	uint64_t out;
} uints[] = {
	{ "0", 0, 0 },
	{ "7", 0, 7 },
	{ "1000", 0, 1000 },
	{ "1e3", 0, 1000 },       /* integral, however written */
	{ "7.0", 0, 7 },
	{ "-0", 0, 0 },
	{ "null", 1, 42 },        /* null is "not given" */
	{ "1001", -EINVAL, 0 },
	{ "-1", -EINVAL, 0 },
	{ "2.5", -EINVAL, 0 },
	{ "1e999", -EINVAL, 0 },  /* cJSON reads it as infinity */
	{ "\"7\"", -EINVAL, 0 },
	{ "true", -EINVAL, 0 },
	{ "[7]", -EINVAL, 0 },
	{ "{}", -EINVAL, 0 },
};

START_TEST(uint_getter)
{
	char text[64];
	struct rp_error err = { 0 };
	uint64_t out = 99;
	cJSON *params;
	int r;

	snprintf(text, sizeof(text), "{\"v\":%s}", uints[_i].value);
	params = json(text);
	r = rp_params_uint(params, "v", 1000, 42, &out, &err);
	ck_assert_msg(r == uints[_i].result, "%s: got %d, expected %d", text, r, uints[_i].result);
	if (r >= 0) {
		ck_assert_uint_eq(out, uints[_i].out);
		ck_assert_ptr_null(err.name);
	} else {
		assert_invalid_parameter(&err, "v");
	}
	cJSON_Delete(params);
}
END_TEST

START_TEST(uint_stops_at_two_to_the_53)
{
	struct rp_error err = { 0 };
	uint64_t out = 0;
	cJSON *params = json("{\"ok\":9007199254740992,\"over\":9007199254740994,\"huge\":1e300}");

	ck_assert_int_eq(rp_params_uint(params, "ok", UINT64_MAX, 0, &out, &err), 0);
	ck_assert_uint_eq(out, UINT64_C(9007199254740992));
	/* Past 2^53 a double no longer holds every integer: refused, even
	 * with no smaller max. */
	ck_assert_int_eq(rp_params_uint(params, "over", UINT64_MAX, 0, &out, &err), -EINVAL);
	assert_invalid_parameter(&err, "over");
	ck_assert_int_eq(rp_params_uint(params, "huge", UINT64_MAX, 0, &out, &err), -EINVAL);
	assert_invalid_parameter(&err, "huge");
	cJSON_Delete(params);
}
END_TEST

START_TEST(absent_gives_the_default)
{
	struct rp_error err = { 0 };
	cJSON *params = json("{}");
	uint64_t u;
	double d;
	bool b;
	const char *s;
	int e;

	ck_assert_int_eq(rp_params_uint(params, "x", 10, 5, &u, &err), 1);
	ck_assert_uint_eq(u, 5);
	ck_assert_int_eq(rp_params_double(params, "x", 0.5, &d, &err), 1);
	ck_assert(d == 0.5);
	ck_assert_int_eq(rp_params_bool(params, "x", true, &b, &err), 1);
	ck_assert(b);
	ck_assert_int_eq(rp_params_string(params, "x", 16, "dflt", &s, &err), 1);
	ck_assert_str_eq(s, "dflt");
	ck_assert_int_eq(rp_params_enum(params, "x", (const char *const[]){ "a", "b", NULL }, 1, &e, &err), 1);
	ck_assert_int_eq(e, 1);
	ck_assert_ptr_null(err.name);
	cJSON_Delete(params);
}
END_TEST

/* RP_T_REAL: a finite number, or "inf", "-inf", "nan" as strings (a
 * program's constants: a mask's -inf); any other string, a JSON 1e999 and
 * a bool are refused by name. */
START_TEST(real_takes_the_spelled_non_finite_values)
{
	static const struct rp_field fields[] = { { "a", RP_T_REAL, false }, { "b", RP_T_REAL, false },
						  { "c", RP_T_REAL, false }, { "d", RP_T_REAL, false },
						  { NULL, 0, false } };
	struct rp_error err = { 0 };
	cJSON *ok = json("{\"a\":\"-inf\",\"b\":\"inf\",\"c\":\"nan\",\"d\":2.5}");
	cJSON *bad = json("{\"a\":\"Infinity\",\"b\":-1e999,\"c\":true}");
	double d;

	ck_assert_int_eq(rp_params_check(ok, fields, &err), 0);
	ck_assert_int_eq(rp_params_real(ok, "a", 0, &d, &err), 0);
	ck_assert(isinf(d) && d < 0);
	ck_assert_int_eq(rp_params_real(ok, "b", 0, &d, &err), 0);
	ck_assert(isinf(d) && d > 0);
	ck_assert_int_eq(rp_params_real(ok, "c", 0, &d, &err), 0);
	ck_assert(isnan(d));
	ck_assert_int_eq(rp_params_real(ok, "d", 0, &d, &err), 0);
	ck_assert(d == 2.5);
	ck_assert_int_eq(rp_params_real(ok, "absent", 7, &d, &err), 1);
	ck_assert(d == 7);
	for (const char *const *name = (const char *const[]){ "a", "b", "c", NULL }; *name; name++) {
		ck_assert_int_eq(rp_params_real(bad, *name, 0, &d, &err), -EINVAL);
		assert_invalid_parameter(&err, *name);
	}
	ck_assert_int_lt(rp_params_check(bad, fields, &err), 0);
	rp_error_clear(&err);
	cJSON_Delete(ok);
	cJSON_Delete(bad);
}
END_TEST

START_TEST(double_bool_string_enum_getters)
{
	static const char *const modes[] = { "f32", "tf32", NULL };
	struct rp_error err = { 0 };
	cJSON *params = json("{\"alpha\":-1.5,\"beta\":3,\"inf\":-1e999,\"flag\":false,\"one\":1,"
			     "\"name\":\"b0.1.2\",\"empty\":\"\",\"long\":\"abcdefghijklmnopq\",\"num\":5,"
			     "\"mode\":\"tf32\",\"badmode\":\"fp8\",\"Mode\":\"f32\"}");
	double d;
	bool b;
	const char *s;
	int e;

	ck_assert_int_eq(rp_params_double(params, "alpha", 0, &d, &err), 0);
	ck_assert(d == -1.5);
	ck_assert_int_eq(rp_params_double(params, "beta", 0, &d, &err), 0);
	ck_assert(d == 3.0);
	ck_assert_int_eq(rp_params_double(params, "inf", 0, &d, &err), -EINVAL);
	assert_invalid_parameter(&err, "inf");
	ck_assert_int_eq(rp_params_double(params, "flag", 0, &d, &err), -EINVAL);
	assert_invalid_parameter(&err, "flag");

	ck_assert_int_eq(rp_params_bool(params, "flag", true, &b, &err), 0);
	ck_assert(!b);
	/* 1 is not true. */
	ck_assert_int_eq(rp_params_bool(params, "one", false, &b, &err), -EINVAL);
	assert_invalid_parameter(&err, "one");

	ck_assert_int_eq(rp_params_string(params, "name", 16, NULL, &s, &err), 0);
	ck_assert_str_eq(s, "b0.1.2");
	ck_assert_int_eq(rp_params_string(params, "empty", 16, NULL, &s, &err), -EINVAL);
	assert_invalid_parameter(&err, "empty");
	ck_assert_int_eq(rp_params_string(params, "long", 16, NULL, &s, &err), -EINVAL);
	assert_invalid_parameter(&err, "long");
	ck_assert_int_eq(rp_params_string(params, "long", 0, NULL, &s, &err), 0);   /* 0: no bound */
	ck_assert_int_eq(rp_params_string(params, "num", 16, NULL, &s, &err), -EINVAL);
	assert_invalid_parameter(&err, "num");

	ck_assert_int_eq(rp_params_enum(params, "mode", modes, 0, &e, &err), 0);
	ck_assert_int_eq(e, 1);
	ck_assert_int_eq(rp_params_enum(params, "badmode", modes, 0, &e, &err), -EINVAL);
	assert_invalid_parameter(&err, "badmode");
	ck_assert_int_eq(rp_params_enum(params, "num", modes, 0, &e, &err), -EINVAL);
	assert_invalid_parameter(&err, "num");
	/* Names are case-sensitive: "Mode" is not "mode". */
	ck_assert_int_eq(rp_params_enum(params, "MODE", modes, 0, &e, &err), 1);
	cJSON_Delete(params);
}
END_TEST

static const struct rp_field import_fields[] = {
	{ "device", RP_T_INT, true },
	{ "kind", RP_T_STRING, true },
	{ "size", RP_T_INT, true },
	{ "offset", RP_T_INT, false },
	{ "scale", RP_T_FLOAT, false },
	{ "causal", RP_T_BOOL, false },
	{ "a", RP_T_OBJECT, false },
	{ "list", RP_T_ARRAY, false },
	{ NULL, 0, false },
};

/* rp_params_check against import_fields: NULL parameter = accepted. */
static const struct {
	const char *params;
	const char *parameter;
} checks[] = {
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096}", NULL },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"offset\":null,\"scale\":0.5,\"causal\":true,"
	  "\"a\":{},\"list\":[]}", NULL },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"scale\":2}", NULL },   /* an int is a float */
	{ "{\"kind\":\"host_fd\",\"size\":4096}", "device" },                    /* missing required */
	{ "{\"device\":null,\"kind\":\"host_fd\",\"size\":4096}", "device" },      /* null required */
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"color\":1}", "color" }, /* unknown */
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"Size\":1}", "Size" },   /* case matters */
	{ "{\"device\":0.5,\"kind\":\"host_fd\",\"size\":4096}", "device" },       /* fraction */
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":1e16}", "size" },          /* past 2^53 */
	{ "{\"device\":0,\"kind\":7,\"size\":4096}", "kind" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"causal\":\"yes\"}", "causal" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"a\":[]}", "a" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"list\":{}}", "list" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"scale\":\"1\"}", "scale" },
	{ "{\"device\":0,\"kind\":\"host_fd\",\"size\":4096,\"size\":8}", "size" },  /* given twice */
	{ "[]", "parameters" },
};

START_TEST(schema_check)
{
	struct rp_error err = { 0 };
	cJSON *params = json(checks[_i].params);
	int r = rp_params_check(params, import_fields, &err);

	if (checks[_i].parameter == NULL) {
		ck_assert_msg(r == 0, "%s refused", checks[_i].params);
		ck_assert_ptr_null(err.name);
	} else {
		ck_assert_msg(r == -EINVAL, "%s accepted", checks[_i].params);
		assert_invalid_parameter(&err, checks[_i].parameter);
	}
	cJSON_Delete(params);
}
END_TEST

static Suite *params_suite(void)
{
	Suite *s = suite_create("params");
	TCase *tc = tcase_create("getters");

	tcase_add_loop_test(tc, uint_getter, 0, sizeof(uints) / sizeof(uints[0]));
	tcase_add_test(tc, uint_stops_at_two_to_the_53);
	tcase_add_test(tc, absent_gives_the_default);
	tcase_add_test(tc, double_bool_string_enum_getters);
	tcase_add_test(tc, real_takes_the_spelled_non_finite_values);
	suite_add_tcase(s, tc);

	tc = tcase_create("check");
	tcase_add_loop_test(tc, schema_check, 0, sizeof(checks) / sizeof(checks[0]));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(params_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
