/* SPDX-License-Identifier: Apache-2.0 */
/* A hang charged to its uid (daemon/hang_charge.c): strikes double the
 * cool-down up to 64 times, a quiet time as long as the last cool-down
 * forgets them, the table stays bounded, and its text (a worker's
 * --charged and io.regen.Worker.Charged) reads back. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "daemon/hang_charge.h"
#include "unit.h"

#define MS 1000000ull

static struct rd_hang_charges t;

START_TEST(strikes_double_the_cool_down_and_quiet_forgets_them)
{
	const struct rd_hang_charge *c;
	uint64_t now = 1000 * MS;

	memset(&t, 0, sizeof(t));
	ck_assert_ptr_null(rd_hang_charge(&t, 1000, 0, now));
	ck_assert_ptr_null(rd_hang_charges_find(&t, 1000, now));
	c = rd_hang_charge(&t, 1000, 100, now);
	ck_assert_uint_eq(c->strikes, 1);
	ck_assert_uint_eq(c->cooldown_ms, 100);
	ck_assert_ptr_eq(rd_hang_charges_find(&t, 1000, now + 99 * MS), c);
	ck_assert_ptr_null(rd_hang_charges_find(&t, 1000, now + 100 * MS));
	ck_assert_ptr_null(rd_hang_charges_find(&t, 1001, now));
	/* Hangs soon after each other: 200, 400, ... up to 6400 ms. */
	for (unsigned s = 2; s <= 9; s++) {
		now = c->until_ns + 10 * MS;
		c = rd_hang_charge(&t, 1000, 100, now);
		ck_assert_uint_eq(c->strikes, s < RD_HANG_STRIKES_MAX ? s : RD_HANG_STRIKES_MAX);
		ck_assert_uint_eq(c->cooldown_ms, 100ull << (c->strikes - 1));
	}
	ck_assert_uint_eq(c->cooldown_ms, 6400);
	/* Quiet for as long as the last cool-down: strike 1 again. */
	now = c->until_ns + 6400 * MS;
	c = rd_hang_charge(&t, 1000, 100, now);
	ck_assert_uint_eq(c->strikes, 1);
	ck_assert_uint_eq(t.n, 1);
}
END_TEST

START_TEST(the_table_is_bounded_and_keeps_those_cooling_down)
{
	uint64_t now = 1000 * MS;

	memset(&t, 0, sizeof(t));
	/* One long charge first, then more uids than the table holds with
	 * short ones that end before it. */
	rd_hang_charge(&t, 42, 100000, now);
	for (unsigned u = 0; u < 2 * RD_HANG_CHARGES_MAX; u++)
		rd_hang_charge(&t, 5000 + u, 10, now + u * MS);
	ck_assert_uint_eq(t.n, RD_HANG_CHARGES_MAX);
	ck_assert_ptr_nonnull(rd_hang_charges_find(&t, 42, now + 1000 * MS));
	ck_assert_ptr_nonnull(rd_hang_charges_find(&t, 5000 + 2 * RD_HANG_CHARGES_MAX - 1, now + 2 * RD_HANG_CHARGES_MAX * MS));
}
END_TEST

START_TEST(the_text_reads_back_newest_first)
{
	struct rd_hang_charges back;
	uint64_t now = 5000 * MS;
	char text[256], small[24];
	const struct rd_hang_charge *c;

	memset(&t, 0, sizeof(t));
	rd_hang_charge(&t, 7, 1000, now - 2000 * MS);     /* ended */
	rd_hang_charge(&t, 1000, 1000, now - 100 * MS);
	rd_hang_charge(&t, 65534, 3000, now);
	ck_assert_uint_eq(rd_hang_charges_format(&t, now, text, sizeof(text)), 2);
	ck_assert_str_eq(text, "65534:3000:3000:1,1000:900:1000:1");
	ck_assert_int_eq(rd_hang_charges_parse(&back, text, 100 * MS), 0);
	ck_assert_uint_eq(back.n, 2);
	c = rd_hang_charges_find(&back, 1000, 100 * MS + 899 * MS);
	ck_assert(c && c->cooldown_ms == 1000 && c->strikes == 1);
	ck_assert_ptr_null(rd_hang_charges_find(&back, 1000, 100 * MS + 900 * MS));
	ck_assert_ptr_null(rd_hang_charges_find(&back, 7, 100 * MS));
	/* What does not fit is left out whole: the newest go first. */
	ck_assert_uint_eq(rd_hang_charges_format(&t, now, small, sizeof(small)), 1);
	ck_assert_str_eq(small, "65534:3000:3000:1");
	ck_assert_int_eq(rd_hang_charges_parse(&back, "", 0), 0);
	ck_assert_uint_eq(back.n, 0);
	for (const char *bad = "x\0" "1:2:3\0" "1:2:3:0\0" "1:2:3:8\0" "1:2:3:1;2:2:3:1\0" "99999999999:1:1:1\0";
	     *bad; bad += strlen(bad) + 1) {
		ck_assert_msg(rd_hang_charges_parse(&back, bad, 0) == -EINVAL, "took '%s'", bad);
		ck_assert_uint_eq(back.n, 0);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hang_charge");
	TCase *tc = tcase_create("hang_charge");

	tcase_add_test(tc, strikes_double_the_cool_down_and_quiet_forgets_them);
	tcase_add_test(tc, the_table_is_bounded_and_keeps_those_cooling_down);
	tcase_add_test(tc, the_text_reads_back_newest_first);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
