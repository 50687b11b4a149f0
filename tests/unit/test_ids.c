/* SPDX-License-Identifier: Apache-2.0 */
/* Object ids: "<kind><device>.<generation>.<serial>", parsed strictly so
 * that one id has exactly one spelling. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/ids.h"

static const struct {
	const char *text;
	char kind;
	uint32_t device;
	uint64_t generation, serial;
} good[] = {
	{ "b0.1.0", 'b', 0, 1, 0 },
	{ "b0.3.17", 'b', 0, 3, 17 },
	{ "e7.12.345", 'e', 7, 12, 345 },
	{ "p0.0.4", 'p', 0, 0, 4 },          /* programs outlive generations: always 0 */
	{ "b4294967295.18446744073709551615.18446744073709551615", 'b', UINT32_MAX, UINT64_MAX, UINT64_MAX },
};

START_TEST(parses_and_formats_back)
{
	struct rp_id id;
	char buf[RP_ID_MAX];

	ck_assert_int_eq(rp_id_parse(good[_i].text, &id), 0);
	ck_assert_int_eq(id.kind, good[_i].kind);
	ck_assert_uint_eq(id.device, good[_i].device);
	ck_assert_uint_eq(id.generation, good[_i].generation);
	ck_assert_uint_eq(id.serial, good[_i].serial);
	ck_assert_ptr_eq(rp_id_format(&id, buf), buf);
	ck_assert_str_eq(buf, good[_i].text);
}
END_TEST

static const char *const bad[] = {
	"",
	"b",
	"b0",
	"b0.1",
	"b0.1.",
	"b0..1",
	".0.1.2",
	"x0.1.2",          /* unknown kind */
	"B0.1.2",          /* kinds are lower case */
	"b0.0.1",          /* generations start at 1 */
	"p0.1.4",          /* but a program's is always 0 */
	"b00.1.2",         /* leading zeros: one id, one spelling */
	"b0.01.2",
	"b0.1.02",
	"b-1.1.2",
	"b+1.1.2",
	"b 0.1.2",
	"b0.1.2 ",
	" b0.1.2",
	"b0.1.2.3",
	"b0.1.2x",
	"b0x1.1.2",
	"b4294967296.1.2",                 /* device past uint32 */
	"b0.18446744073709551616.1",       /* generation past uint64 */
	"b0.1.18446744073709551616",
	"b0.1.99999999999999999999999",
	"b0.1.1e3",
};

START_TEST(rejects)
{
	struct rp_id id = { .kind = 'z', .device = 9, .generation = 9, .serial = 9 };

	ck_assert_msg(rp_id_parse(bad[_i], &id) == -EINVAL, "accepted '%s'", bad[_i]);
	/* A refused parse leaves the id alone. */
	ck_assert_int_eq(id.kind, 'z');
	ck_assert_uint_eq(id.serial, 9);
}
END_TEST

START_TEST(null_is_refused)
{
	struct rp_id id;

	ck_assert_int_eq(rp_id_parse(NULL, &id), -EINVAL);
}
END_TEST

START_TEST(format_of_made_up_ids)
{
	struct rp_id id = { .kind = RP_ID_EVENT, .device = 3, .generation = 2, .serial = 0 };
	struct rp_id back;
	char buf[RP_ID_MAX];

	ck_assert_str_eq(rp_id_format(&id, buf), "e3.2.0");
	ck_assert_int_eq(rp_id_parse(buf, &back), 0);
	ck_assert_int_eq(back.kind, id.kind);
	ck_assert_uint_eq(back.device, id.device);
	ck_assert_uint_eq(back.generation, id.generation);
	ck_assert_uint_eq(back.serial, id.serial);
}
END_TEST

static Suite *ids_suite(void)
{
	Suite *s = suite_create("ids");
	TCase *tc = tcase_create("ids");

	tcase_add_loop_test(tc, parses_and_formats_back, 0, sizeof(good) / sizeof(good[0]));
	tcase_add_loop_test(tc, rejects, 0, sizeof(bad) / sizeof(bad[0]));
	tcase_add_test(tc, null_is_refused);
	tcase_add_test(tc, format_of_made_up_ids);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ids_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
