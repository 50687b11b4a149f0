/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's compile of a program's kernels (cuda/rtc_compile.c)
 * on the host, no GPU: NVRTC itself, for sm_90. A compile is charged to its
 * uid's account (daemon/program/compile_budget.h); one whose uid's budget
 * runs out while NVRTC works is stopped (NVRTC_ERROR_CANCELLED under the
 * hood) with io.regen.LimitExceeded {resource: "compile time per uid",
 * limit: ms} and no image; the next does not start (no NVRTC time spent).
 *
 * Skipped (77) without the toolkit's cuda_bf16.h (REGEN_TEST_CUDA_INCLUDE). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/backend/cuda/rtc_compile.h"
#include "proto/errors.h"
#include "tests/unit/prog_builder.h"
#include "tests/unit/unit.h"

#define MS (UINT64_C(1000000))

static char include_opt[4200];
static struct pb b;
static struct rd_prog_plan plan;

/* A step with something to compile: a chain of math over bf16. */
static const struct rd_prog_step *planned_step(void)
{
	struct rp_error err = { 0 };

	pb_init(&b, "budget");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(512, 1024));
	int t1 = pb_tensor(&b, "t1", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 1024));
	int t2 = pb_tensor(&b, "t2", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 1024));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(512, 1024));
	pb_pw(&b, RP_PW_GELU, t1, x, -1);
	pb_pw(&b, RP_PW_TANH, t2, t1, -1);
	pb_pw(&b, RP_PW_MUL, y, t2, t1, -1);
	pb_finish(&b);
	ck_assert_int_eq(rd_prog_plan_build(&b.p, &plan, &err), 0);
	ck_assert_int_eq(plan.nsteps, 1);
	return &plan.steps[0];
}

static void assert_limit(struct rp_error *err, long long limit_ms)
{
	ck_assert_str_eq(err->name, RP_ERR_LIMIT_EXCEEDED);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(err->params, "resource")), "compile time per uid");
	ck_assert_int_eq((long long)cJSON_GetNumberValue(cJSON_GetObjectItem(err->params, "limit")), limit_ms);
	rp_error_clear(err);
}

START_TEST(compiles_are_charged_and_stopped_at_the_uids_budget)
{
	const struct rd_prog_step *st = planned_step();
	struct rd_compile_account ample, tight;
	struct rp_error err = { 0 };
	uint64_t spent = 0;
	void *image;
	size_t size;
	int r;

	rd_compile_account_init(&ample, 1000, 0, 600000 * MS, 1 << 30, rd_compile_clock_ns());
	r = cuda_rtc_compile(st, 90, false, include_opt, &ample, &image, &size, &spent, &err);
	ck_assert_msg(r == 0, "%s", err.params ? cJSON_PrintUnformatted(err.params) : "?");
	ck_assert_ptr_nonnull(image);
	ck_assert_uint_gt(size, 0);
	ck_assert_uint_gt(spent, 0);
	ck_assert_uint_eq(ample.compile_ns, spent);
	ck_assert_int_lt(ample.left_ns, (int64_t)ample.budget_ns);
	free(image);
	printf("a compile took %.1f ms of NVRTC\n", (double)spent / 1e6);

	/* A budget of 2 ms, far below what it takes: NVRTC is stopped. */
	rd_compile_account_init(&tight, 1000, 0, 2 * MS, 1 << 30, rd_compile_clock_ns());
	r = cuda_rtc_compile(st, 90, false, include_opt, &tight, &image, &size, &spent, &err);
	ck_assert_int_eq(r, -EDQUOT);
	assert_limit(&err, 2);
	ck_assert_ptr_null(image);
	ck_assert_int_le(tight.left_ns, 0);
	ck_assert_uint_ge(tight.compile_ns, 2 * MS);
	printf("stopped after %.1f ms (charged %.1f ms)\n", (double)spent / 1e6, (double)tight.compile_ns / 1e6);

	/* Spent: the next compile does not start. */
	r = cuda_rtc_compile(st, 90, false, include_opt, &tight, &image, &size, &spent, &err);
	ck_assert_int_eq(r, -EDQUOT);
	assert_limit(&err, 2);
	ck_assert_uint_eq(spent, 0);

	/* No account: nothing charged, nothing stopped. */
	r = cuda_rtc_compile(st, 90, false, include_opt, NULL, &image, &size, &spent, &err);
	ck_assert_int_eq(r, 0);
	free(image);
	rd_compile_account_finish(&ample);
	rd_compile_account_finish(&tight);
	rd_prog_plan_finish(&plan);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("rtc_compile");
	TCase *tc = tcase_create("nvrtc");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, compiles_are_charged_and_stopped_at_the_uids_budget);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *dir = getenv("REGEN_TEST_CUDA_INCLUDE");
	char probe[4200];

	snprintf(probe, sizeof(probe), "%s/cuda_bf16.h", dir ? dir : "");
	if (!dir || access(probe, R_OK) != 0) {
		printf("skipped: no cuda_bf16.h in REGEN_TEST_CUDA_INCLUDE (%s)\n", dir ? dir : "unset");
		return 77;
	}
	snprintf(include_opt, sizeof(include_opt), "-I%s", dir);
	return unit_run(suite());
}
