/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/program/compile_budget.h on a clock the test moves: a uid's
 * compile time is spent as compiles tick, shared by its compiles, stops
 * the one that runs it out and keeps the next from starting, comes back
 * at the budget per hour and no further; its compiled modules' bytes are
 * held and given back against their bound. Each refusal is
 * io.regen.LimitExceeded naming the resource and the limit. */
#include <check.h>
#include <errno.h>
#include <string.h>
#include "daemon/program/compile_budget.h"
#include "proto/errors.h"
#include "tests/unit/unit.h"

#define MS (UINT64_C(1000000))
#define T0 (UINT64_C(1000) * 1000 * MS)

/* What a test's clock moved refills in passing: at 100 ms an hour, under
 * 2 µs for the 60 ms these tests move it. */
#define ASSERT_NEAR_NS(a, b) ck_assert_msg((a) >= (int64_t)(b) && (a) - (int64_t)(b) < 10000, "%lld ns, want %lld", \
					   (long long)(a), (long long)(b))

static void assert_limit(struct rp_error *err, const char *resource, long long limit)
{
	ck_assert_str_eq(err->name, RP_ERR_LIMIT_EXCEEDED);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "resource")), resource);
	ck_assert_int_eq((long long)cJSON_GetNumberValue(cJSON_GetObjectItem(err->params, "limit")), limit);
	ck_assert_ptr_nonnull(cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "message")));
	rp_error_clear(err);
}

START_TEST(a_compile_spends_the_budget_and_is_stopped_where_it_runs_out)
{
	struct rd_compile_account a;
	struct rd_compile c;
	struct rp_error err = { 0 };
	uint64_t spent;

	rd_compile_account_init(&a, 1000, 0, 100 * MS, 1 << 20, T0);
	ck_assert_int_eq(rd_compile_begin(&c, &a, T0, &err), 0);
	ck_assert(!rd_compile_tick(&c, T0 + 30 * MS));
	ck_assert(!rd_compile_tick(&c, T0 + 60 * MS));
	ASSERT_NEAR_NS(a.left_ns, 40 * MS);
	ck_assert_int_eq(rd_compile_end(&c, T0 + 70 * MS, &spent, &err), 0);
	ck_assert_uint_eq(spent, 70 * MS);
	ASSERT_NEAR_NS(a.left_ns, 30 * MS);
	ck_assert_ptr_null(err.name);

	/* The next runs it out: stopped at that tick and from then on; what
	 * it took past the budget (a tick comes when NVRTC says) is owed. */
	ck_assert_int_eq(rd_compile_begin(&c, &a, T0 + 70 * MS, &err), 0);
	ck_assert(!rd_compile_tick(&c, T0 + 90 * MS));
	ck_assert(rd_compile_tick(&c, T0 + 110 * MS));
	ck_assert(rd_compile_tick(&c, T0 + 112 * MS));
	ck_assert_int_eq(rd_compile_end(&c, T0 + 115 * MS, &spent, &err), -EDQUOT);
	assert_limit(&err, "compile time per uid", 100);
	ck_assert_uint_eq(spent, 45 * MS);
	ck_assert_uint_eq(a.compile_ns, 115 * MS);
	ck_assert_int_le(a.left_ns, -15 * (int64_t)MS + 10000);

	/* Owing: nothing starts until the refill paid it back, at 100 ms an
	 * hour (15 ms in 9 minutes). */
	ck_assert_int_eq(rd_compile_begin(&c, &a, T0 + 115 * MS, &err), -EDQUOT);
	assert_limit(&err, "compile time per uid", 100);
	ck_assert_int_eq(rd_compile_begin(&c, &a, T0 + RD_COMPILE_REFILL_NS / 60 * 8, &err), -EDQUOT);
	rp_error_clear(&err);
	ck_assert_int_eq(rd_compile_begin(&c, &a, T0 + RD_COMPILE_REFILL_NS / 60 * 10, &err), 0);
	ck_assert_int_eq(rd_compile_end(&c, T0 + RD_COMPILE_REFILL_NS / 60 * 10, NULL, &err), 0);
	rd_compile_account_finish(&a);
}
END_TEST

START_TEST(the_budget_comes_back_over_an_hour_and_no_further)
{
	struct rd_compile_account a;
	struct rd_compile c;
	struct rp_error err = { 0 };
	const uint64_t hour = RD_COMPILE_REFILL_NS, budget = 3600 * MS;

	rd_compile_account_init(&a, 7, 1, budget, 1 << 20, T0);
	ck_assert_int_eq(rd_compile_begin(&c, &a, T0, &err), 0);
	ck_assert(rd_compile_tick(&c, T0 + budget));
	ck_assert_int_eq(rd_compile_end(&c, T0 + budget, NULL, &err), -EDQUOT);
	rp_error_clear(&err);
	ck_assert_int_eq(a.left_ns, 0);
	/* A quarter of an hour later, a quarter of it: 900 ms. */
	uint64_t t = T0 + budget + hour / 4;
	ck_assert_int_eq(rd_compile_begin(&c, &a, t, &err), 0);
	ck_assert_int_eq(a.left_ns, (int64_t)budget / 4);
	ck_assert(!rd_compile_tick(&c, t + 899 * MS));
	ck_assert(rd_compile_tick(&c, t + 901 * MS));
	ck_assert_int_eq(rd_compile_end(&c, t + 901 * MS, NULL, &err), -EDQUOT);
	rp_error_clear(&err);
	/* A day later, the budget whole, not 24 of it. */
	t += 24 * hour;
	ck_assert_int_eq(rd_compile_begin(&c, &a, t, &err), 0);
	ck_assert_int_eq(a.left_ns, (int64_t)budget);
	ck_assert_int_eq(rd_compile_end(&c, t, NULL, &err), 0);
	rd_compile_account_finish(&a);
}
END_TEST

/* Two compiles of one uid at once (two lanes) draw on one budget: the
 * one that ticks past it stops, and so does the other at its next tick. */
START_TEST(compiles_of_one_uid_share_its_budget)
{
	struct rd_compile_account a;
	struct rd_compile c1, c2;
	struct rp_error err = { 0 };

	rd_compile_account_init(&a, 1000, 0, 100 * MS, 1 << 20, T0);
	ck_assert_int_eq(rd_compile_begin(&c1, &a, T0, &err), 0);
	ck_assert_int_eq(rd_compile_begin(&c2, &a, T0, &err), 0);
	ck_assert(!rd_compile_tick(&c1, T0 + 40 * MS));
	ck_assert(!rd_compile_tick(&c2, T0 + 40 * MS));
	ck_assert(rd_compile_tick(&c1, T0 + 61 * MS));
	ck_assert(rd_compile_tick(&c2, T0 + 62 * MS));
	ck_assert_int_eq(rd_compile_end(&c1, T0 + 62 * MS, NULL, &err), -EDQUOT);
	rp_error_clear(&err);
	ck_assert_int_eq(rd_compile_end(&c2, T0 + 62 * MS, NULL, &err), -EDQUOT);
	rp_error_clear(&err);
	/* Another uid's account is its own. */
	struct rd_compile_account b;
	rd_compile_account_init(&b, 1001, 0, 100 * MS, 1 << 20, T0);
	ck_assert_int_eq(rd_compile_begin(&c1, &b, T0 + 62 * MS, &err), 0);
	ck_assert_int_eq(rd_compile_end(&c1, T0 + 63 * MS, NULL, &err), 0);
	rd_compile_account_finish(&a);
	rd_compile_account_finish(&b);
}
END_TEST

START_TEST(compiled_modules_are_held_within_their_bound)
{
	struct rd_compile_account a;
	struct rp_error err = { 0 };

	rd_compile_account_init(&a, 1000, 3, 100 * MS, 1000, T0);
	ck_assert_int_eq(rd_compile_hold(&a, 600, &err), 0);
	ck_assert_int_eq(rd_compile_hold(&a, 400, &err), 0);
	ck_assert_int_eq(rd_compile_hold(&a, 1, &err), -EDQUOT);
	assert_limit(&err, "compiled module bytes per uid", 1000);
	rd_compile_release(&a, 600);
	ck_assert_uint_eq(a.module_bytes, 400);
	ck_assert_int_eq(rd_compile_hold(&a, 601, &err), -EDQUOT);
	assert_limit(&err, "compiled module bytes per uid", 1000);
	ck_assert_int_eq(rd_compile_hold(&a, 600, &err), 0);
	/* Bigger than the bound alone, without overflowing. */
	rd_compile_release(&a, 1000);
	ck_assert_int_eq(rd_compile_hold(&a, UINT64_MAX, &err), -EDQUOT);
	rp_error_clear(&err);
	ck_assert_uint_eq(a.module_bytes, 0);
	/* No account: nothing charged, nothing refused. */
	struct rd_compile c;
	ck_assert_int_eq(rd_compile_hold(NULL, UINT64_MAX, &err), 0);
	ck_assert_int_eq(rd_compile_begin(&c, NULL, T0, &err), 0);
	ck_assert(!rd_compile_tick(&c, T0 + 1000000 * MS));
	ck_assert_int_eq(rd_compile_end(&c, T0 + 1000000 * MS, NULL, &err), 0);
	rd_compile_account_finish(&a);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("compile_budget");
	TCase *tc = tcase_create("budget");

	tcase_add_test(tc, a_compile_spends_the_budget_and_is_stopped_where_it_runs_out);
	tcase_add_test(tc, the_budget_comes_back_over_an_hour_and_no_further);
	tcase_add_test(tc, compiles_of_one_uid_share_its_budget);
	tcase_add_test(tc, compiled_modules_are_held_within_their_bound);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
