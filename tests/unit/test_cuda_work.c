/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's deadline budget (daemon/backend/cuda/work.c) without
 * a GPU: a device of a known peak, calls of known work, a lane's backlog.
 * A call no GPU of the kind could finish within half the deadline is
 * refused with LimitExceeded {resource: "work"} and counts nothing in;
 * one that could is counted in until its return; what the estimate cannot
 * see (padded attention, an unknown peak, no deadline) is never refused. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"
#include "tests/unit/unit.h"

/* About an H100's peak, twice over: 2e15 multiply-adds a second. */
#define PEAK 2.0e6

static struct rd_device dev;
static struct cuda_dev cd;
static struct cuda_lane lane;

static void setup(void)
{
	memset(&dev, 0, sizeof(dev));
	memset(&cd, 0, sizeof(cd));
	memset(&lane, 0, sizeof(lane));
	dev.call_deadline_ms = 60000;
	cd.dev = &dev;
	cd.peak_macs_per_ns = PEAK;
	lane.cd = &cd;
}

/* The error's message, as the client reads it. */
static const char *message(const struct rp_error *err)
{
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(err->params, "message");

	return cJSON_IsString(m) ? m->valuestring : "";
}

/* Its parameter "resource". */
static const char *resource(const struct rp_error *err)
{
	const cJSON *r = cJSON_GetObjectItemCaseSensitive(err->params, "resource");

	return cJSON_IsString(r) ? r->valuestring : "";
}

static struct rd_op gemm(int64_t m, int64_t n, int64_t k)
{
	struct rd_op op;

	memset(&op, 0, sizeof(op));
	op.compute.spec = &rp_op_gemm;
	op.compute.gemm.m = m;
	op.compute.gemm.n = n;
	op.compute.gemm.k = k;
	return op;
}

static struct rd_op attention(const struct rp_op_spec *spec, int64_t seq, bool causal, bool padded)
{
	struct rd_op op;

	memset(&op, 0, sizeof(op));
	op.compute.spec = spec;
	op.compute.attention = (struct rp_attention){ .causal = causal, .padded = padded, .batch = 1, .heads = 1,
						      .heads_kv = 1, .seq_q = seq, .seq_kv = seq, .head_dim = 64,
						      .head_dim_v = 64 };
	return op;
}

START_TEST(a_models_call_is_counted_in_and_returned)
{
	struct rd_op op = gemm(8192, 8192, 8192);

	ck_assert_int_eq(cuda_work_take(&lane, &op), 0);
	ck_assert_uint_eq(op.work_ns, (uint64_t)(8192.0 * 8192.0 * 8192.0 / PEAK));
	ck_assert_uint_eq(atomic_load(&lane.backlog_ns), op.work_ns);
	ck_assert_ptr_null(op.err.name);
	cuda_work_return(&lane, &op);
	ck_assert_uint_eq(atomic_load(&lane.backlog_ns), 0);
	ck_assert_uint_eq(op.work_ns, 0);
}
END_TEST

START_TEST(a_call_past_half_the_deadline_is_refused_by_name)
{
	/* 2^63 multiply-adds: 53 days at the peak. */
	struct rd_op op = gemm(1 << 21, 1 << 21, 1 << 21);

	ck_assert_int_eq(cuda_work_take(&lane, &op), -E2BIG);
	ck_assert_str_eq(op.err.name, RP_ERR_LIMIT_EXCEEDED);
	ck_assert_str_eq(resource(&op.err), "work");
	ck_assert_ptr_nonnull(strstr(message(&op.err), "io.regen.Compute.Gemm"));
	ck_assert_ptr_nonnull(strstr(message(&op.err), "call_deadline_ms"));
	ck_assert_uint_eq(atomic_load(&lane.backlog_ns), 0);
	ck_assert_uint_eq(op.work_ns, 0);
	rp_error_clear(&op.err);
}
END_TEST

START_TEST(the_lanes_backlog_counts)
{
	/* 20 s each at the peak: one fits half of 60 s, a second behind it
	 * does not; once the first returns, it does. */
	const int64_t k = (int64_t)(20e9 * PEAK / (65536.0 * 65536.0));
	struct rd_op first = gemm(65536, 65536, k), second = gemm(65536, 65536, k);

	ck_assert_int_eq(cuda_work_take(&lane, &first), 0);
	ck_assert_int_eq(cuda_work_take(&lane, &second), -E2BIG);
	ck_assert_ptr_nonnull(strstr(message(&second.err), "queued on its lane"));
	rp_error_clear(&second.err);
	cuda_work_return(&lane, &first);
	ck_assert_int_eq(cuda_work_take(&lane, &second), 0);
	cuda_work_return(&lane, &second);
	ck_assert_uint_eq(atomic_load(&lane.backlog_ns), 0);
}
END_TEST

START_TEST(attention_work)
{
	struct rd_op fwd = attention(&rp_op_attention, 1 << 16, false, false);
	struct rd_op causal = attention(&rp_op_attention, 1 << 16, true, false);
	struct rd_op bwd = attention(&rp_op_attention_backward, 1 << 16, false, false);
	struct rd_op padded = attention(&rp_op_attention, 1 << 30, false, true);
	struct rd_op huge = attention(&rp_op_attention, 1 << 30, true, false);
	const double scores = 65536.0 * 65536.0;

	ck_assert(cuda_work_macs(&fwd.compute) == scores * 128.0);
	ck_assert(cuda_work_macs(&causal.compute) == scores * 64.0);
	ck_assert(cuda_work_macs(&bwd.compute) == scores * 256.0);
	ck_assert_msg(cuda_work_macs(&padded.compute) == 0.0, "the real lengths are in device memory");
	ck_assert_int_eq(cuda_work_take(&lane, &padded), 0);
	ck_assert_int_eq(cuda_work_take(&lane, &huge), -E2BIG);
	ck_assert_ptr_nonnull(strstr(message(&huge.err), "io.regen.Compute.Attention"));
	rp_error_clear(&huge.err);
}
END_TEST

START_TEST(nothing_refused_without_a_deadline_or_a_peak)
{
	struct rd_op op = gemm(1 << 21, 1 << 21, 1 << 21);

	dev.call_deadline_ms = 0;
	ck_assert_int_eq(cuda_work_take(&lane, &op), 0);
	cuda_work_return(&lane, &op);
	dev.call_deadline_ms = 60000;
	cd.peak_macs_per_ns = 0.0;
	ck_assert_int_eq(cuda_work_take(&lane, &op), 0);
	ck_assert_uint_eq(op.work_ns, 0);
	ck_assert_uint_eq(atomic_load(&lane.backlog_ns), 0);
}
END_TEST

START_TEST(memory_bound_calls_and_runs_take_no_budget)
{
	struct rd_op ln;

	memset(&ln, 0, sizeof(ln));
	ln.compute.spec = &rp_op_layer_norm;
	ln.compute.layer_norm.rows = 1 << 30;
	ln.compute.layer_norm.n = 1 << 20;
	ck_assert(cuda_work_macs(&ln.compute) == 0.0);
	ck_assert_int_eq(cuda_work_take(&lane, &ln), 0);
	ck_assert_uint_eq(ln.work_ns, 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("cuda_work");
	TCase *tc = tcase_create("budget");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, a_models_call_is_counted_in_and_returned);
	tcase_add_test(tc, a_call_past_half_the_deadline_is_refused_by_name);
	tcase_add_test(tc, the_lanes_backlog_counts);
	tcase_add_test(tc, attention_work);
	tcase_add_test(tc, nothing_refused_without_a_deadline_or_a_peak);
	tcase_add_test(tc, memory_bound_calls_and_runs_take_no_budget);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
