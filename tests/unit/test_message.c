/* SPDX-License-Identifier: Apache-2.0 */
/* Varlink messages: what a call or reply may look like, how a bad one is
 * refused (io.regen.InvalidMessage with a reason a person can act on), and
 * what the builders put on the wire. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/message.h"

static const char *param_str(const struct rp_error *err, const char *key)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(err->params, key);

	return cJSON_IsString(item) ? item->valuestring : NULL;
}

/* Parses text, expecting success. */
static void parse_ok(const char *text, struct rp_call *call)
{
	struct rp_error err = { 0 };

	ck_assert_msg(rp_call_parse(text, strlen(text), call, &err) == 0, "refused %s: %s", text,
		      err.params ? param_str(&err, "reason") : "?");
	ck_assert_ptr_null(err.name);
	ck_assert_ptr_nonnull(call->root);
	ck_assert(cJSON_IsObject(call->params));
}

/* Nested arrays: depth levels in all, the outer object included. */
static char *nested(int depth)
{
	char *s = malloc((size_t)depth * 2 + 64), *p = s;

	p += sprintf(p, "{\"method\":\"a.B\",\"parameters\":{\"x\":");
	for (int i = 0; i < depth - 2; i++)
		*p++ = '[';
	for (int i = 0; i < depth - 2; i++)
		*p++ = ']';
	strcpy(p, "}}");
	return s;
}

START_TEST(call_with_everything)
{
	struct rp_call call;

	parse_ok("{\"method\":\"io.regen.Device.Watch\",\"parameters\":{\"device\":0},\"more\":true}", &call);
	ck_assert_str_eq(call.method, "io.regen.Device.Watch");
	ck_assert(call.more);
	ck_assert(!call.oneway);
	ck_assert(!call.upgrade);
	ck_assert_ptr_null(call.error);
	ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(call.params, "device")->valueint, 0);
	rp_call_finish(&call);

	parse_ok(" {\"method\":\"a.B\",\"oneway\":true,\"upgrade\":false} \n", &call);
	ck_assert(call.oneway);
	ck_assert(!call.upgrade);
	rp_call_finish(&call);
}
END_TEST

START_TEST(absent_parameters_become_an_empty_object)
{
	struct rp_call call;

	parse_ok("{\"method\":\"org.varlink.service.GetInfo\"}", &call);
	ck_assert_ptr_null(call.params->child);
	rp_call_finish(&call);
}
END_TEST

START_TEST(null_parameters_are_no_parameters)
{
	/* What Debian's Go varlink sends for a call without parameters. */
	struct rp_call call;

	parse_ok("{\"method\":\"org.varlink.service.GetInfo\",\"parameters\":null}", &call);
	ck_assert(cJSON_IsObject(call.params));
	ck_assert_ptr_null(call.params->child);
	rp_call_finish(&call);
}
END_TEST

START_TEST(utf8_and_escapes_that_are_fine)
{
	/* Multi-byte UTF-8, escaped and paired surrogates, an escaped
	 * backslash before a u. */
	struct rp_call call;

	parse_ok("{\"method\":\"a.B\",\"parameters\":{\"r\":\"gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80 "
		 "\\u00e9 \\ud83d\\ude00 \\\\u0000\"}}", &call);
	ck_assert_str_eq(cJSON_GetObjectItem(call.params, "r")->valuestring,
			 "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80 \xc3\xa9 \xf0\x9f\x98\x80 \\u0000");
	rp_call_finish(&call);
}
END_TEST

START_TEST(replies_and_errors)
{
	struct rp_call call;

	parse_ok("{\"parameters\":{\"generation\":3},\"continues\":true}", &call);
	ck_assert_ptr_null(call.method);
	ck_assert(call.continues);
	rp_call_finish(&call);

	parse_ok("{\"error\":\"io.regen.Draining\",\"parameters\":{\"message\":\"later\"}}", &call);
	ck_assert_ptr_null(call.method);
	ck_assert_str_eq(call.error, "io.regen.Draining");
	rp_call_finish(&call);

	parse_ok("{}", &call);
	ck_assert_ptr_null(call.method);
	ck_assert_ptr_null(call.error);
	rp_call_finish(&call);
}
END_TEST

static const struct {
	const char *text;
	const char *reason;
} refused[] = {
	{ "", "empty message" },
	/* Where cJSON stops is its own business: only the start is fixed. */
	{ "{\"method\":", "not valid JSON (error at byte *" },
	{ "{'method':'a.B'}", "not valid JSON (error at byte *" },
	{ "{\"a\":tru}", "not valid JSON (error at byte *" },
	{ "{\"method\":\"a.B\"} {}", "trailing data after the JSON value at byte 17" },
	{ "[1,2]", "not a JSON object" },
	{ "\"method\"", "not a JSON object" },
	{ "null", "not a JSON object" },
	{ "{\"method\":\"a.B\",\"extra\":1}", "unknown key 'extra'" },
	{ "{\"Method\":\"a.B\"}", "unknown key 'Method'" },
	{ "{\"method\":\"a.B\",\"method\":\"c.D\"}", "duplicate key 'method'" },
	{ "{\"method\":42}", "'method' must be a non-empty string" },
	{ "{\"method\":\"\"}", "'method' must be a non-empty string" },
	{ "{\"method\":\"a.B\",\"parameters\":[]}", "'parameters' must be an object" },
	{ "{\"method\":\"a.B\",\"parameters\":7}", "'parameters' must be an object" },
	/* Bytes that are not UTF-8 never reach cJSON, so no reply can echo
	 * them raw: a lone continuation byte, an overlong '/', a surrogate
	 * encoded directly, a truncated sequence, a code point past U+10FFFF. */
	{ "{\"method\":\"a.\x80" "B\"}", "not valid UTF-8" },
	{ "{\"method\":\"a.\xc0\xaf" "B\"}", "not valid UTF-8" },
	{ "{\"method\":\"a.\xed\xa0\x80" "B\"}", "not valid UTF-8" },
	{ "{\"me\xe2\x82thod\":\"a.B\"}", "not valid UTF-8" },
	{ "{\"method\":\"a.\xf4\x90\x80\x80\"}", "not valid UTF-8" },
	{ "{\"method\":\"a.B\",\"\xff\":1}", "not valid UTF-8" },
	/* cJSON would end the string at the NUL: the method would read as
	 * io.regen.Device.Generation and the junk vanish. */
	{ "{\"method\":\"io.regen.Device.Generation\\u0000junk\"}", "a string holds \\u0000" },
	{ "{\"method\":\"a.B\",\"parameters\":{\"buffer\":\"b0.1.1\\u0000x\"}}", "a string holds \\u0000" },
	{ "{\"method\":\"a.B\",\"parameters\":{\"x\":\"\\udc00\"}}", "a string holds an unpaired surrogate escape" },
	{ "{\"method\":\"a.B\",\"parameters\":{\"x\":\"\\ud800z\"}}", "a string holds an unpaired surrogate escape" },
	{ "{\"method\":\"a.B\",\"more\":1}", "'more' must be a boolean" },
	{ "{\"method\":\"a.B\",\"oneway\":\"yes\"}", "'oneway' must be a boolean" },
	{ "{\"method\":\"a.B\",\"upgrade\":null}", "'upgrade' must be a boolean" },
	{ "{\"method\":\"a.B\",\"oneway\":true,\"more\":true}", "'oneway' and 'more' cannot both be set" },
	{ "{\"method\":\"a.B\",\"continues\":true}", "'continues' belongs in a reply, not in a call" },
	{ "{\"method\":\"a.B\",\"error\":\"x.Y\"}", "'error' belongs in a reply, not in a call" },
	{ "{\"more\":true}", "missing 'method'" },
	{ "{\"error\":7}", "'error' must be a non-empty string" },
	{ "{\"continues\":\"no\"}", "'continues' must be a boolean" },
};

/* Exact, or a prefix when the pattern ends in '*'. */
static bool matches(const char *s, const char *pattern)
{
	size_t n = strlen(pattern);

	if (s == NULL)
		return false;
	if (n > 0 && pattern[n - 1] == '*')
		return strncmp(s, pattern, n - 1) == 0;
	return strcmp(s, pattern) == 0;
}

START_TEST(refused_with_a_reason)
{
	const char *text = refused[_i].text;
	struct rp_error err = { 0 };
	struct rp_call call;

	ck_assert_int_eq(rp_call_parse(text, strlen(text), &call, &err), -EINVAL);
	ck_assert_ptr_null(call.root);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_MESSAGE);
	ck_assert_msg(matches(param_str(&err, "reason"), refused[_i].reason), "%s: reason '%s', expected '%s'",
		      text, param_str(&err, "reason"), refused[_i].reason);
	/* The message is the reason in a sentence. */
	ck_assert_ptr_nonnull(strstr(param_str(&err, "message"), param_str(&err, "reason")));
	rp_error_clear(&err);
}
END_TEST

START_TEST(embedded_nul_is_refused)
{
	static const char text[] = "{\"method\":\"a.B\"}\0{}";
	struct rp_error err = { 0 };
	struct rp_call call;

	ck_assert_int_eq(rp_call_parse(text, sizeof(text) - 1, &call, &err), -EINVAL);
	ck_assert_str_eq(param_str(&err, "reason"), "contains a NUL byte");
	rp_error_clear(&err);
}
END_TEST

START_TEST(nesting_of_32_accepted_33_refused)
{
	struct rp_error err = { 0 };
	struct rp_call call;
	char *ok = nested(RP_NESTING_MAX), *deep = nested(RP_NESTING_MAX + 1);

	parse_ok(ok, &call);
	rp_call_finish(&call);

	ck_assert_int_eq(rp_call_parse(deep, strlen(deep), &call, &err), -EINVAL);
	ck_assert_str_eq(param_str(&err, "reason"), "nested deeper than 32 levels");
	rp_error_clear(&err);
	free(ok);
	free(deep);
}
END_TEST

START_TEST(brackets_inside_strings_do_not_count)
{
	struct rp_call call;
	char text[512], *p = text;

	/* 40 brackets and braces in a string, with an escaped quote before
	 * them that must not end the string early. */
	p += sprintf(p, "{\"method\":\"a.B\",\"parameters\":{\"s\":\"\\\"");
	for (int i = 0; i < 40; i++)
		*p++ = (i % 2) ? '[' : '{';
	strcpy(p, "\\\\\"}}");
	parse_ok(text, &call);
	rp_call_finish(&call);
}
END_TEST

START_TEST(a_very_deep_message_does_not_reach_cjson)
{
	/* 100000 levels would overflow a recursive parser's stack. */
	size_t n = 100000;
	char *s = malloc(n + 1);
	struct rp_error err = { 0 };
	struct rp_call call;

	memset(s, '[', n);
	s[n] = '\0';
	ck_assert_int_eq(rp_call_parse(s, n, &call, &err), -EINVAL);
	ck_assert_str_eq(param_str(&err, "reason"), "nested deeper than 32 levels");
	rp_error_clear(&err);
	free(s);
}
END_TEST

START_TEST(errors_carry_a_message_and_their_parameters)
{
	struct rp_error err = { 0 }, other = { 0 };
	char *text;

	rp_error_set(&err, RP_ERR_STALE_GENERATION, "buffer %s is from generation %d", "b0.1.3", 1);
	rp_error_add_int(&err, "device", 0);
	rp_error_add_int(&err, "generation", 2);
	rp_error_add_int(&err, "generation", 3);   /* replaces, never duplicates */
	text = rp_build_error(&err);
	ck_assert_str_eq(text, "{\"error\":\"io.regen.StaleGeneration\",\"parameters\":{\"message\":"
			       "\"buffer b0.1.3 is from generation 1\",\"device\":0,\"generation\":3}}");
	free(text);

	rp_error_move(&other, &err);
	ck_assert_ptr_null(err.name);
	ck_assert_ptr_null(err.params);
	ck_assert_str_eq(other.name, RP_ERR_STALE_GENERATION);

	/* Setting again frees the earlier parameters (valgrind/ASan would see). */
	ck_assert_int_eq(rp_error_invalid_parameter(&other, "a.shape"), -EINVAL);
	text = rp_build_error(&other);
	ck_assert_str_eq(text, "{\"error\":\"org.varlink.service.InvalidParameter\",\"parameters\":{\"parameter\":\"a.shape\"}}");
	free(text);
	rp_error_clear(&other);
	ck_assert_ptr_null(rp_build_error(&other));
}
END_TEST

START_TEST(builders_write_compact_json)
{
	cJSON *params = cJSON_CreateObject();
	char *text;

	cJSON_AddNumberToObject(params, "device", 1);
	text = rp_build_call("io.regen.Device.Watch", params, true, false);
	ck_assert_str_eq(text, "{\"method\":\"io.regen.Device.Watch\",\"parameters\":{\"device\":1},\"more\":true}");
	free(text);
	text = rp_build_call("io.regen.Worker.Faulted", NULL, false, true);
	ck_assert_str_eq(text, "{\"method\":\"io.regen.Worker.Faulted\",\"parameters\":{},\"oneway\":true}");
	free(text);
	text = rp_build_reply(params, true);
	ck_assert_str_eq(text, "{\"parameters\":{\"device\":1},\"continues\":true}");
	free(text);
	text = rp_build_reply(NULL, false);
	ck_assert_str_eq(text, "{\"parameters\":{}}");
	free(text);
	/* params is not consumed: still whole and ours to free. */
	ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(params, "device")->valueint, 1);
	cJSON_Delete(params);
}
END_TEST

/* A string cut to a bounded buffer may end in half a character: the
 * builders drop the stray bytes and keep every whole character around
 * them, so what goes out is UTF-8 a peer can decode. */
START_TEST(half_characters_are_dropped_whole_ones_kept)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "plain ascii", "plain ascii" },
		{ "caf\xc3\xa9 \xe2\x82\xac", "caf\xc3\xa9 \xe2\x82\xac" },
		{ "cut \xe2\x82", "cut " },
		{ "\xc3\xa9\xe2\x82\xc3\xbc" " and on", "\xc3\xa9\xc3\xbc" " and on" },
		{ "\xff\xfe", "" },
		{ "a\xf0\x9f\x98\x80\x80" "b\xed\xa0\x80" "c", "a\xf0\x9f\x98\x80" "bc" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cJSON *params = cJSON_CreateObject();
		char want[128], *text;

		cJSON_AddStringToObject(params, "reason", cases[i].in);
		text = rp_build_reply(params, false);
		snprintf(want, sizeof(want), "{\"parameters\":{\"reason\":\"%s\"}}", cases[i].out);
		ck_assert_str_eq(text, want);
		ck_assert_ptr_null(rp_text_refusal(text, strlen(text)));
		free(text);
		cJSON_Delete(params);
	}
}
END_TEST

START_TEST(built_messages_parse_back)
{
	cJSON *params = cJSON_CreateObject();
	struct rp_call call;
	char *text;

	cJSON_AddStringToObject(params, "s", "quote \" and brace {");
	text = rp_build_call("io.regen.Memory.CloseBuffer", params, false, true);
	parse_ok(text, &call);
	ck_assert_str_eq(call.method, "io.regen.Memory.CloseBuffer");
	ck_assert(call.oneway);
	ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(call.params, "s")->valuestring, "quote \" and brace {");
	rp_call_finish(&call);
	free(text);
	cJSON_Delete(params);
}
END_TEST

static Suite *message_suite(void)
{
	Suite *s = suite_create("message");
	TCase *tc = tcase_create("parse");

	tcase_add_test(tc, call_with_everything);
	tcase_add_test(tc, absent_parameters_become_an_empty_object);
	tcase_add_test(tc, null_parameters_are_no_parameters);
	tcase_add_test(tc, utf8_and_escapes_that_are_fine);
	tcase_add_test(tc, replies_and_errors);
	tcase_add_loop_test(tc, refused_with_a_reason, 0, sizeof(refused) / sizeof(refused[0]));
	tcase_add_test(tc, embedded_nul_is_refused);
	tcase_add_test(tc, nesting_of_32_accepted_33_refused);
	tcase_add_test(tc, brackets_inside_strings_do_not_count);
	tcase_add_test(tc, a_very_deep_message_does_not_reach_cjson);
	suite_add_tcase(s, tc);

	tc = tcase_create("build");
	tcase_add_test(tc, errors_carry_a_message_and_their_parameters);
	tcase_add_test(tc, builders_write_compact_json);
	tcase_add_test(tc, built_messages_parse_back);
	tcase_add_test(tc, half_characters_are_dropped_whole_ones_kept);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(message_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
