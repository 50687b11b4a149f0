/* SPDX-License-Identifier: Apache-2.0 */
/* A peer's text made safe to show (proto/text.c): what a terminal or a
 * reader would act on is escaped, in each output's own syntax, and
 * everything else is kept. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "proto/text.h"
#include "unit.h"

static const char *escape(const char *in, enum rp_text_style style)
{
	static char out[512];

	rp_text_escape(in, style, out, sizeof(out));
	return out;
}

START_TEST(text_is_kept_and_controls_are_escaped)
{
	static const struct {
		const char *in, *line, *json, *label;
	} cases[] = {
		{ "plain ascii, caf\xc3\xa9, \xe6\x97\xa5\xe6\x9c\xac, \xf0\x9f\x98\x80", NULL, NULL, NULL },
		{ "a\nb\tc\rd", "a\\nb\\tc\\rd", "a\nb\tc\rd", "a\\nb\\\\tc\\\\rd" },
		{ "\x1b[2J\x07\x7f", "\\x1b[2J\\x07\\x7f", "\\u001b[2J\\u0007\\u007f", "\\\\x1b[2J\\\\x07\\\\x7f" },
		/* C1: CSI and OSC as one character each. */
		{ "x\xc2\x9b" "31m\xc2\x9d", "x\\u009b31m\\u009d", "x\\u009b31m\\u009d", "x\\\\u009b31m\\\\u009d" },
		/* Right-to-left override, isolate, mark. */
		{ "\xe2\x80\xae" "evil\xe2\x81\xa6\xe2\x80\x8f", "\\u202eevil\\u2066\\u200f", "\\u202eevil\\u2066\\u200f", NULL },
		/* Not UTF-8: a lone continuation, an overlong NUL, a surrogate, a
		 * cut sequence. */
		{ "\x80\xc0\x80\xed\xa0\x80\xe2\x80", "\\x80\\xc0\\x80\\xed\\xa0\\x80\\xe2\\x80",
		  "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd", NULL },
		{ "say \"hi\" \\", NULL, NULL, "say \\\"hi\\\" \\\\" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *line = cases[i].line ? cases[i].line : cases[i].in;
		const char *json = cases[i].json ? cases[i].json : cases[i].in;

		ck_assert_str_eq(escape(cases[i].in, RP_TEXT_LINE), line);
		/* JSON style is given text inside a JSON string that cJSON wrote:
		 * C0 is escaped there already. */
		if (strpbrk(cases[i].in, "\n\t\r\x1b\x07") == NULL)
			ck_assert_str_eq(escape(cases[i].in, RP_TEXT_JSON), json);
		if (cases[i].label)
			ck_assert_str_eq(escape(cases[i].in, RP_TEXT_LABEL), cases[i].label);
		ck_assert(rp_text_is_plain(cases[i].in) == (cases[i].line == NULL));
	}
}
END_TEST

START_TEST(escaped_json_reads_back_as_the_same_text)
{
	const char *text = "job \x7f\xc2\x9b\xe2\x80\xae end \xe6\x97\xa5";
	cJSON *s = cJSON_CreateString(text), *back;
	char *printed = cJSON_PrintUnformatted(s);
	char *safe = rp_text_escape_dup(printed, RP_TEXT_JSON);

	ck_assert_ptr_null(strchr(safe, 0x7f));
	ck_assert_ptr_null(strstr(safe, "\xc2\x9b"));
	ck_assert_ptr_null(strstr(safe, "\xe2\x80\xae"));
	back = cJSON_Parse(safe);
	ck_assert(cJSON_IsString(back));
	ck_assert_str_eq(back->valuestring, text);
	cJSON_Delete(back);
	cJSON_Delete(s);
	free(printed);
	free(safe);
}
END_TEST

START_TEST(a_short_buffer_cuts_at_a_whole_escape)
{
	char out[7];

	ck_assert_uint_eq(rp_text_escape("\x1b\x1b", RP_TEXT_LINE, out, sizeof(out)), 4);
	ck_assert_str_eq(out, "\\x1b");
	ck_assert_uint_eq(rp_text_escape("ab\xe6\x97\xa5\xe6\x97\xa5", RP_TEXT_LINE, out, sizeof(out)), 5);
	ck_assert_str_eq(out, "ab\xe6\x97\xa5");
	ck_assert_uint_eq(rp_text_escape(NULL, RP_TEXT_LINE, out, 1), 0);
	ck_assert_str_eq(out, "");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("text");
	TCase *tc = tcase_create("text");

	tcase_add_test(tc, text_is_kept_and_controls_are_escaped);
	tcase_add_test(tc, escaped_json_reads_back_as_the_same_text);
	tcase_add_test(tc, a_short_buffer_cuts_at_a_whole_escape);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
