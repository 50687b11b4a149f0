/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's GEMM plan cache stays within its limit
 * (gemm_plans_max, which the backend's open takes from the worker; here a
 * small one set with rd_cuda_set_gemm_plan_limit, which sets the same
 * cache's limit) and stays right while it evicts:
 *
 * 1. LIMIT + 100 GEMMs of distinct shapes (M = 1, 2, 3, ...; f32, bf16
 *    and f16 in turn), one at a time: each result checked against a
 *    float64 reference from fresh random inputs (D poisoned with NaN
 *    first, its padding must stay poisoned), the cached plan count never
 *    above LIMIT, the registry not growing with the shapes (evicted plans
 *    are unregistered and freed); then the first shape again, long
 *    evicted, built again and right.
 * 2. Calls in flight past the limit: a large GEMM keeps lane 0 busy while
 *    4 lanes get LIMIT + 60 GEMMs of new shapes submitted without a wait,
 *    so plans are evicted and destroyed while calls made with them are
 *    still enqueued and not run; then every result checked, and the count
 *    back within the limit. With a limit of 2 and 4 lanes enqueueing at
 *    once, a lookup may find every cached plan held: the new shape must
 *    still be planned and run.
 *
 * Exit 77 without a GPU. */
#include "gpu_common.h"

#include <math.h>
#include <string.h>
#include "proto/errors.h"

#define LIMIT 16
#define SHAPES (LIMIT + 100)
#define LANES 4
#define QUEUED (LIMIT + 60)

struct dt_case {
	const char *name;
	enum rp_dtype dt;
	double tol;
};

static const struct dt_case dtypes[] = {
	{ "f32", RP_DTYPE_F32, 1e-5 },
	{ "bf16", RP_DTYPE_BF16, 1e-2 },
	{ "f16", RP_DTYPE_F16, 1e-2 },
};

/* One GEMM and its matrices: D = 1.25 op(A) op(B), rows of D padded by 8
 * so that a write past N shows. */
struct call {
	struct rd_op op;
	struct gt_mat a, b, d;
	const struct dt_case *dc;
	int64_t m, n, k;
	bool ta;
};

static void call_make(struct gt *t, struct call *c, int64_t m, int64_t n, int64_t k, bool ta,
		      const struct dt_case *dc, uint64_t *s)
{
	memset(c, 0, sizeof(*c));
	c->m = m;
	c->n = n;
	c->k = k;
	c->ta = ta;
	c->dc = dc;
	gt_mat_alloc(t, &c->a, dc->dt, ta ? k : m, ta ? m : k, ta ? m : k);
	gt_mat_alloc(t, &c->b, dc->dt, k, n, n);
	gt_mat_alloc(t, &c->d, dc->dt, m, n, n + 8);
	gt_mat_fill(&c->a, ++*s, 0);
	gt_mat_fill(&c->b, ++*s, 0);
	gt_mat_poison(&c->d);
	gt_gemm(&c->op, &c->a, &c->b, NULL, &c->d, NULL, ta, false, 1.25, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
}

/* Whether the call succeeded and D is right; prints why not. */
static bool call_check(struct call *c, const char *what)
{
	double rel = INFINITY;
	unsigned long nans = 0, pad = 0;

	if (!c->op.err.name) {
		double *ref = malloc(sizeof(double) * (size_t)(c->m * c->n));
		gt_gemm_reference(&c->op, &c->a, &c->b, NULL, NULL, ref, false);
		rel = gt_rel_error(&c->d, ref, &nans, &pad);
		free(ref);
	}
	bool ok = !c->op.err.name && rel < c->dc->tol && nans == 0 && pad == 0;
	if (!ok)
		printf("  FAIL: %s %s %s [%lld, %lld, %lld]: %s%s%s rel=%.3g nan=%lu pad_touched=%lu tol=%.0e\n", what,
		       c->dc->name, c->ta ? "TN" : "NN", (long long)c->m, (long long)c->n, (long long)c->k,
		       gt_err_name(&c->op), c->op.err.name ? ": " : "", c->op.err.name ? gt_err_message(&c->op.err) : "",
		       rel, nans, pad, c->dc->tol);
	return ok;
}

static void call_free(struct gt *t, struct call *c)
{
	rp_error_clear(&c->op.err);
	gt_mat_free(t, &c->a);
	gt_mat_free(t, &c->b);
	gt_mat_free(t, &c->d);
}

/* Shape i of case 1: M = i + 1 makes every key distinct. */
static void shape_of(int i, int64_t *m, int64_t *n, int64_t *k, bool *ta, const struct dt_case **dc)
{
	*m = i + 1;
	*n = 24 + (i % 5) * 8;
	*k = 16 + (i % 3) * 8;
	*ta = i % 4 == 3;
	*dc = &dtypes[i % 3];
}

static void one_at_a_time(struct gt *t, struct rd_lane *lane, uint64_t *s)
{
	struct call c;
	unsigned most = 0, wrong = 0, registered_at_limit = 0;

	printf("%d GEMMs of distinct shapes, one at a time, limit %d:\n", SHAPES, LIMIT);
	for (int i = 0; i < SHAPES; i++) {
		int64_t m, n, k;
		bool ta;
		const struct dt_case *dc;
		shape_of(i, &m, &n, &k, &ta, &dc);
		call_make(t, &c, m, n, k, ta, dc, s);
		gt_run(t, lane, &c.op, 60);
		wrong += !call_check(&c, "distinct shape");
		call_free(t, &c);
		unsigned n_plans = rd_cuda_gemm_plan_count(&t->dev);
		if (n_plans > most)
			most = n_plans;
		if (i == LIMIT - 1)
			registered_at_limit = t->dev.registry.count;
	}
	GT_CHECK(wrong == 0, "%d distinct shapes computed right (%u wrong)", SHAPES, wrong);
	GT_CHECK(most <= LIMIT, "cached GEMM plans never above the limit: at most %u of %d", most, LIMIT);
	GT_CHECK(rd_cuda_gemm_plan_count(&t->dev) == LIMIT, "%u plans cached after %d shapes, want %d",
		 rd_cuda_gemm_plan_count(&t->dev), SHAPES, LIMIT);
	/* Buffers were closed after each call; plans beyond the limit must
	 * have left the registry too. */
	GT_CHECK(t->dev.registry.count <= registered_at_limit,
		 "the registry holds %u resources after %d shapes, %u once %d plans were cached", t->dev.registry.count,
		 SHAPES, registered_at_limit, LIMIT);

	/* The first shape, evicted long ago: built again, right, within the limit. */
	for (int again = 0; again < 2; again++) {
		int64_t m, n, k;
		bool ta;
		const struct dt_case *dc;
		shape_of(0, &m, &n, &k, &ta, &dc);
		call_make(t, &c, m, n, k, ta, dc, s);
		gt_run(t, lane, &c.op, 60);
		GT_CHECK(call_check(&c, "the first shape again"), "the first shape (evicted) computed right, %s time",
			 again ? "second" : "first");
		call_free(t, &c);
	}
	GT_CHECK(rd_cuda_gemm_plan_count(&t->dev) <= LIMIT, "%u plans cached after the first shape came back",
		 rd_cuda_gemm_plan_count(&t->dev));
}

/* Shapes with M from `base` up: none made before. */
static void in_flight(struct gt *t, struct rd_lane *const *lanes, uint64_t *s, unsigned limit, int64_t base)
{
	struct call *calls = calloc(QUEUED, sizeof(*calls));
	struct call big;
	unsigned wrong = 0, refused = 0;

	printf("%d GEMMs of new shapes queued on %d lanes behind a large one, limit %u:\n", QUEUED, LANES, limit);
	rd_cuda_set_gemm_plan_limit(&t->dev, limit);
	GT_CHECK(rd_cuda_gemm_plan_count(&t->dev) <= limit, "a lower limit trims at once: %u cached, limit %u",
		 rd_cuda_gemm_plan_count(&t->dev), limit);
	/* Every call's inputs first: filling them runs on the legacy stream
	 * and waits for it, which would wait for the large GEMM too. */
	for (int i = 0; i < QUEUED; i++)
		call_make(t, &calls[i], base + i, 16 + (i % 4) * 8, 24 + (i % 3) * 8, i % 2 == 1, &dtypes[i % 3], s);
	/* Tens of milliseconds of f32 work ahead of lane 0's queue (not
	 * checked: its float64 reference would take minutes). */
	call_make(t, &big, 8192, 8192, 8192, false, &dtypes[0], s);
	pthread_mutex_lock(&t->lock);
	unsigned target = t->completed + 1 + QUEUED;
	pthread_mutex_unlock(&t->lock);
	big.op.lane = lanes[0];
	if (t->dev.backend->submit(lanes[0], &big.op) < 0) {
		printf("  FAIL: submitting the large GEMM: %s\n", gt_err_message(&big.op.err));
		exit(1);
	}
	for (int i = 0; i < QUEUED; i++) {
		calls[i].op.lane = lanes[i % LANES];
		if (t->dev.backend->submit(lanes[i % LANES], &calls[i].op) < 0) {
			printf("  FAIL: submitting call %d: %s %s\n", i, gt_err_name(&calls[i].op),
			       gt_err_message(&calls[i].op.err));
			refused++;
			target--;
		}
	}
	unsigned during = rd_cuda_gemm_plan_count(&t->dev);
	if (gt_wait(t, target, 120) < 0) {
		printf("  FAIL: the queued GEMMs did not complete within 120 s\n");
		exit(1);
	}
	GT_CHECK(!big.op.err.name, "the large GEMM: %s %s", gt_err_name(&big.op), gt_err_message(&big.op.err));
	for (int i = 0; i < QUEUED; i++)
		wrong += !call_check(&calls[i], "queued");
	GT_CHECK(refused == 0 && wrong == 0, "%d queued GEMMs of new shapes computed right (%u refused, %u wrong)",
		 QUEUED, refused, wrong);
	GT_CHECK(rd_cuda_gemm_plan_count(&t->dev) <= limit,
		 "with nothing enqueueing, %u plans cached of at most %u (%u seen while submitting)",
		 rd_cuda_gemm_plan_count(&t->dev), limit, during);
	call_free(t, &big);
	for (int i = 0; i < QUEUED; i++)
		call_free(t, &calls[i]);
	free(calls);
}

int main(void)
{
	if (gt_have_gpu())
		return GT_SKIP;
	struct gt t;
	uint64_t seed;
	struct rd_lane *lanes[LANES];
	struct rp_error err = { 0 };

	lanes[0] = gt_start(&t, "test_gemm_plans", &seed);
	for (int i = 1; i < LANES; i++) {
		lanes[i] = t.dev.backend->lane_create(&t.dev, (unsigned)i, &err);
		if (!lanes[i]) {
			fprintf(stderr, "FAIL: lane_create %d: %s\n", i, gt_err_message(&err));
			return 1;
		}
	}
	uint64_t s = seed;
	GT_CHECK(rd_cuda_gemm_plan_count(&t.dev) == 0, "no GEMM plan before the first GEMM (%u)",
		 rd_cuda_gemm_plan_count(&t.dev));
	rd_cuda_set_gemm_plan_limit(&t.dev, LIMIT);
	one_at_a_time(&t, lanes[0], &s);
	in_flight(&t, lanes, &s, LIMIT, 1000);
	in_flight(&t, lanes, &s, 2, 2000);

	for (int i = 0; i < LANES; i++)
		t.dev.backend->lane_destroy(lanes[i]);
	gt_close(&t);
	printf("%s: test_gemm_plans\n", gt_failures ? "FAIL" : "PASS");
	return gt_failures ? 1 : 0;
}
