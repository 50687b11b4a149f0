/* SPDX-License-Identifier: Apache-2.0 */
/* Attention through rd_backend_cuda (cuDNN's fused attention) from C, as
 * the worker core drives it: the forward against a float64 host reference
 * on the same bf16 inputs (o and stats; causal, grouped-query), the
 * backward's outputs written; one cached plan per problem and the cache's
 * bound (least recently used evicted); plans and the cuDNN handle dropped
 * by a release and by a reset and built again by the next call; refusals
 * by name (f32, a head dimension cuDNN does not take) with the lane still
 * serving; the per-call scratch cap (LimitExceeded); autotuning (a choice
 * kept, right, and remembered across a release). Fresh random inputs
 * (seed printed; REGEN_TEST_SEED repeats it). */
#include "gpu_common.h"

#include <math.h>
#include <string.h>
#include "proto/errors.h"

/* A [B, H, S, D] tensor (BHSD, contiguous) as a matrix of B*H*S rows. */
struct tensor {
	struct gt_mat m;
	int64_t dims[4];
};

static void tensor_alloc(struct gt *t, struct tensor *x, enum rp_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d)
{
	gt_mat_alloc(t, &x->m, dt, b * h * s, d, d);
	x->dims[0] = b;
	x->dims[1] = h;
	x->dims[2] = s;
	x->dims[3] = d;
}

static void operand4(struct rp_operand *op, const struct tensor *x)
{
	memset(op, 0, sizeof(*op));
	op->buffer.kind = RP_ID_BUFFER;
	op->dtype = x->m.dt;
	op->rank = 4;
	for (int i = 0; i < 4; i++)
		op->shape[i] = x->dims[i];
	op->strides[3] = 1;
	for (int i = 2; i >= 0; i--)
		op->strides[i] = op->strides[i + 1] * x->dims[i + 1];
}

/* stats [B, H, S] f32, allocated as a matrix of B*H rows of S. */
static void stats_operand(struct rp_operand *op, const struct gt_mat *m, int64_t b, int64_t h, int64_t s)
{
	memset(op, 0, sizeof(*op));
	op->buffer.kind = RP_ID_BUFFER;
	op->dtype = RP_DTYPE_F32;
	op->rank = 3;
	op->shape[0] = b;
	op->shape[1] = h;
	op->shape[2] = s;
	op->strides[0] = h * s;
	op->strides[1] = s;
	op->strides[2] = 1;
}

struct problem {
	enum rp_dtype dt;
	int64_t b, h, h_kv, sq, skv, d;
	bool causal;
};

struct att {
	struct problem p;
	struct tensor q, k, v, o, d_o, dq, dk, dv;
	struct gt_mat stats;
};

static void att_alloc(struct gt *t, struct att *a, const struct problem *p, uint64_t *seed)
{
	memset(a, 0, sizeof(*a));
	a->p = *p;
	tensor_alloc(t, &a->q, p->dt, p->b, p->h, p->sq, p->d);
	tensor_alloc(t, &a->k, p->dt, p->b, p->h_kv, p->skv, p->d);
	tensor_alloc(t, &a->v, p->dt, p->b, p->h_kv, p->skv, p->d);
	tensor_alloc(t, &a->o, p->dt, p->b, p->h, p->sq, p->d);
	tensor_alloc(t, &a->d_o, p->dt, p->b, p->h, p->sq, p->d);
	tensor_alloc(t, &a->dq, p->dt, p->b, p->h, p->sq, p->d);
	tensor_alloc(t, &a->dk, p->dt, p->b, p->h_kv, p->skv, p->d);
	tensor_alloc(t, &a->dv, p->dt, p->b, p->h_kv, p->skv, p->d);
	gt_mat_alloc(t, &a->stats, RP_DTYPE_F32, p->b * p->h, p->sq, p->sq);
	gt_mat_fill(&a->q.m, ++*seed, 0);
	gt_mat_fill(&a->k.m, ++*seed, 0);
	gt_mat_fill(&a->v.m, ++*seed, 0);
	gt_mat_fill(&a->d_o.m, ++*seed, 0);
	gt_mat_poison(&a->o.m);
	gt_mat_poison(&a->stats);
	gt_mat_poison(&a->dq.m);
	gt_mat_poison(&a->dk.m);
	gt_mat_poison(&a->dv.m);
}

static void att_free(struct gt *t, struct att *a)
{
	struct tensor *all[] = { &a->q, &a->k, &a->v, &a->o, &a->d_o, &a->dq, &a->dk, &a->dv };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		gt_mat_free(t, &all[i]->m);
	gt_mat_free(t, &a->stats);
}

static void set_dims(struct rp_attention *ra, const struct problem *p)
{
	ra->scale = 1.0 / sqrt((double)p->d);
	ra->causal = p->causal;
	ra->alignment = RP_CAUSAL_TOP_LEFT;
	ra->batch = p->b;
	ra->heads = p->h;
	ra->heads_kv = p->h_kv;
	ra->seq_q = p->sq;
	ra->seq_kv = p->skv;
	ra->head_dim = p->d;
	ra->head_dim_v = p->d;
}

static void forward_op(struct rd_op *op, struct att *a)
{
	memset(op, 0, sizeof(*op));
	struct rp_compute *c = &op->compute;
	c->spec = &rp_op_attention;
	struct tensor *ts[] = { [RP_ATT_Q] = &a->q, [RP_ATT_K] = &a->k, [RP_ATT_V] = &a->v, [RP_ATT_O] = &a->o };
	for (int i = RP_ATT_Q; i <= RP_ATT_O; i++) {
		operand4(&c->operands[i], ts[i]);
		c->present[i] = true;
		op->buffers[i] = ts[i]->m.buf;
	}
	stats_operand(&c->operands[RP_ATT_STATS], &a->stats, a->p.b, a->p.h, a->p.sq);
	c->present[RP_ATT_STATS] = true;
	op->buffers[RP_ATT_STATS] = a->stats.buf;
	set_dims(&c->attention, &a->p);
}

static void backward_op(struct rd_op *op, struct att *a)
{
	memset(op, 0, sizeof(*op));
	struct rp_compute *c = &op->compute;
	c->spec = &rp_op_attention_backward;
	struct tensor *ts[] = {
		[RP_ATB_Q] = &a->q, [RP_ATB_K] = &a->k, [RP_ATB_V] = &a->v, [RP_ATB_O] = &a->o, [RP_ATB_DO] = &a->d_o,
		[RP_ATB_STATS] = NULL, [RP_ATB_DQ] = &a->dq, [RP_ATB_DK] = &a->dk, [RP_ATB_DV] = &a->dv,
	};
	/* The backward's operands without the optional sequence lengths. */
	for (int i = 0; i <= RP_ATB_DV; i++) {
		c->present[i] = true;
		if (i == RP_ATB_STATS) {
			stats_operand(&c->operands[i], &a->stats, a->p.b, a->p.h, a->p.sq);
			op->buffers[i] = a->stats.buf;
			continue;
		}
		operand4(&c->operands[i], ts[i]);
		op->buffers[i] = ts[i]->m.buf;
	}
	set_dims(&c->attention, &a->p);
}

/* float64 attention of the downloaded inputs: o and the rows' log-sum-exp,
 * compared with what the op wrote. */
static void check_forward(struct att *a, const char *label, double tol)
{
	const struct problem *p = &a->p;
	double *q = gt_mat_download(&a->q.m), *k = gt_mat_download(&a->k.m), *v = gt_mat_download(&a->v.m);
	double *o = gt_mat_download(&a->o.m), *st = gt_mat_download(&a->stats);
	double *s = malloc(sizeof(double) * (size_t)p->skv);
	double num_o = 0, den_o = 0, num_l = 0, den_l = 0;
	unsigned long nans = 0;
	int64_t group = p->h / p->h_kv;
	for (int64_t b = 0; b < p->b; b++) {
		for (int64_t h = 0; h < p->h; h++) {
			const double *kh = k + ((b * p->h_kv + h / group) * p->skv) * p->d;
			const double *vh = v + ((b * p->h_kv + h / group) * p->skv) * p->d;
			for (int64_t i = 0; i < p->sq; i++) {
				const double *qi = q + ((b * p->h + h) * p->sq + i) * p->d;
				int64_t last = p->causal ? (i < p->skv ? i : p->skv - 1) : p->skv - 1;
				double mx = -INFINITY;
				for (int64_t j = 0; j <= last; j++) {
					double dot = 0;
					for (int64_t x = 0; x < p->d; x++)
						dot += qi[x] * kh[j * p->d + x];
					s[j] = dot / sqrt((double)p->d);
					if (s[j] > mx)
						mx = s[j];
				}
				double z = 0;
				for (int64_t j = 0; j <= last; j++)
					z += exp(s[j] - mx);
				double lse = mx + log(z), got_l = st[(b * p->h + h) * p->sq + i];
				num_l += (got_l - lse) * (got_l - lse);
				den_l += lse * lse;
				nans += !isfinite(got_l);
				for (int64_t x = 0; x < p->d; x++) {
					double ref = 0;
					for (int64_t j = 0; j <= last; j++)
						ref += exp(s[j] - mx) / z * vh[j * p->d + x];
					double got = o[((b * p->h + h) * p->sq + i) * p->d + x];
					num_o += (got - ref) * (got - ref);
					den_o += ref * ref;
					nans += !isfinite(got);
				}
			}
		}
	}
	double e_o = sqrt(num_o / den_o), e_l = sqrt(num_l / den_l);
	GT_CHECK(nans == 0 && e_o < tol && e_l < tol, "%s: o rel %.3g, stats rel %.3g, %lu not finite (tol %.0e)", label,
	      e_o, e_l, nans, tol);
	printf("  %s: o rel %.2e, stats rel %.2e\n", label, e_o, e_l);
	free(q);
	free(k);
	free(v);
	free(o);
	free(st);
	free(s);
}

/* Every element of the gradients written, finite, not all zero. */
static void check_backward_written(struct att *a, const char *label)
{
	struct tensor *ts[] = { &a->dq, &a->dk, &a->dv };
	const char *names[] = { "d_q", "d_k", "d_v" };
	for (int i = 0; i < 3; i++) {
		double *x = gt_mat_download(&ts[i]->m);
		size_t n = (size_t)(ts[i]->m.rows * ts[i]->m.ld);
		unsigned long bad = 0;
		double norm = 0;
		for (size_t j = 0; j < n; j++) {
			bad += !isfinite(x[j]);
			norm += x[j] * x[j];
		}
		GT_CHECK(bad == 0 && norm > 0, "%s: %s has %lu elements not finite, norm %.3g", label, names[i], bad, sqrt(norm));
		free(x);
	}
}

struct plan_census {
	unsigned plans, valid;
	uint64_t inits;
	unsigned handles, handles_valid;
};

static void census_one(struct rd_resource *res, void *data)
{
	struct plan_census *c = data;
	if (strcmp(res->ops->kind, "cudnn_sdpa_plan") == 0) {
		c->plans++;
		c->valid += rd_resource_is_valid(res);
		c->inits += res->init_count;
	} else if (strcmp(res->ops->kind, "cudnn_handle") == 0) {
		c->handles++;
		c->handles_valid += rd_resource_is_valid(res);
	}
}

static struct plan_census census(struct gt *t)
{
	struct plan_census c = { 0 };
	rd_registry_foreach(&t->dev.registry, census_one, &c);
	return c;
}

static int run(struct gt *t, struct rd_lane *lane, struct rd_op *op, const char *label)
{
	int r = gt_run(t, lane, op, 120);
	if (r)
		printf("  %s: %s: %s\n", label, gt_err_name(op), gt_err_message(&op->err));
	return r;
}

int main(void)
{
	if (gt_have_gpu())
		return GT_SKIP;
	uint64_t seed = gt_seed();
	printf("test_cuda_attention: seed %llu (REGEN_TEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
	       (unsigned long long)seed);
	double t0 = gt_now();
	struct gt t;
	gt_open(&t);
	struct rp_error err = { 0 };
	struct rd_lane *lane = t.dev.backend->lane_create(&t.dev, 0, &err);
	if (!lane) {
		fprintf(stderr, "FAIL: lane_create: %s\n", gt_err_message(&err));
		return 1;
	}
	struct rd_op op;
	struct att a;

	/* Forward and backward, and the plan each builds once. */
	const struct problem causal_gqa = { RP_DTYPE_BF16, 2, 4, 2, 128, 128, 64, true };
	att_alloc(&t, &a, &causal_gqa, &seed);
	forward_op(&op, &a);
	double t1 = gt_now();
	GT_CHECK(run(&t, lane, &op, "forward") == 0, "forward bf16 B2 H4/2 S128 D64 causal failed");
	printf("  first forward (handle and plan built): %.0f ms\n", (gt_now() - t1) * 1e3);
	check_forward(&a, "forward bf16 B2 H4/2 S128 D64 causal", 1e-2);
	struct plan_census c = census(&t);
	GT_CHECK(c.plans == 1 && c.valid == 1 && c.inits == 1 && c.handles == 1,
	      "after one forward: %u plans (%u valid, %llu inits), %u handles", c.plans, c.valid,
	      (unsigned long long)c.inits, c.handles);
	gt_mat_poison(&a.o.m);
	forward_op(&op, &a);
	t1 = gt_now();
	GT_CHECK(run(&t, lane, &op, "forward again") == 0, "second forward failed");
	printf("  second forward (plan cached): %.2f ms\n", (gt_now() - t1) * 1e3);
	c = census(&t);
	GT_CHECK(c.plans == 1 && c.inits == 1, "the same problem again built another plan: %u plans, %llu inits", c.plans,
	      (unsigned long long)c.inits);
	backward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "backward") == 0, "backward failed");
	check_backward_written(&a, "backward bf16 B2 H4/2 S128 D64 causal");
	GT_CHECK(rd_cuda_attention_plan_count(&t.dev) == 2, "forward + backward: %u plans",
		 rd_cuda_attention_plan_count(&t.dev));

	/* Refusals by name; the lane serves on. */
	struct att f32;
	const struct problem f32p = { RP_DTYPE_F32, 1, 2, 2, 64, 64, 64, false };
	att_alloc(&t, &f32, &f32p, &seed);
	forward_op(&op, &f32);
	GT_CHECK(gt_run(&t, lane, &op, 60) < 0 && strcmp(gt_err_name(&op), RP_ERR_INVALID_OPERAND) == 0 &&
		      strstr(gt_err_message(&op.err), "bf16 or f16"),
	      "f32 attention: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
	rp_error_clear(&op.err);
	att_free(&t, &f32);
	/* A head dimension that is no multiple of 8 (its row stride is not
	 * either), and one cuDNN's backward does not take: its own reason. */
	struct att odd;
	const struct problem oddp = { RP_DTYPE_BF16, 1, 2, 2, 64, 64, 36, false };
	att_alloc(&t, &odd, &oddp, &seed);
	forward_op(&op, &odd);
	GT_CHECK(gt_run(&t, lane, &op, 60) < 0 && strcmp(gt_err_name(&op), RP_ERR_INVALID_OPERAND) == 0 &&
		      strstr(gt_err_message(&op.err), "multiple"),
	      "head dim 36: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
	printf("  head dim 36: %s\n", gt_err_message(&op.err));
	rp_error_clear(&op.err);
	att_free(&t, &odd);
	const struct problem widep = { RP_DTYPE_BF16, 1, 2, 2, 64, 64, 264, false };
	att_alloc(&t, &odd, &widep, &seed);
	backward_op(&op, &odd);
	GT_CHECK(gt_run(&t, lane, &op, 60) < 0 && strcmp(gt_err_name(&op), RP_ERR_INVALID_OPERAND) == 0 &&
		      strstr(gt_err_message(&op.err), "256"),
	      "backward head dim 264: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
	printf("  backward head dim 264: %s\n", gt_err_message(&op.err));
	rp_error_clear(&op.err);
	att_free(&t, &odd);

	/* The scratch cap (--max-scratch-mib): the backward needs its f32
	 * accumulators. */
	uint64_t max_scratch = t.dev.max_scratch;
	t.dev.max_scratch = 1024;
	backward_op(&op, &a);
	bool refused = gt_run(&t, lane, &op, 60) < 0 && strcmp(gt_err_name(&op), RP_ERR_LIMIT_EXCEEDED) == 0;
	cJSON *res = op.err.params ? cJSON_GetObjectItem(op.err.params, "resource") : NULL;
	GT_CHECK(refused && cJSON_IsString(res) && strcmp(res->valuestring, "scratch") == 0,
	      "backward over a 1 KiB scratch cap: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
	rp_error_clear(&op.err);
	t.dev.max_scratch = max_scratch;

	/* Work no GPU could finish within half the deadline (2^50 scores of
	 * 128 multiply-adds: over a minute at this device's peak): refused by
	 * its dimensions (cuda/work.c), before anything reads the operands. */
	unsigned deadline_ms = t.dev.call_deadline_ms;
	t.dev.call_deadline_ms = 60000;
	forward_op(&op, &a);
	op.compute.attention.seq_q = (int64_t)1 << 24;
	op.compute.attention.seq_kv = (int64_t)1 << 26;
	refused = gt_run(&t, lane, &op, 60) < 0 && strcmp(gt_err_name(&op), RP_ERR_LIMIT_EXCEEDED) == 0;
	res = op.err.params ? cJSON_GetObjectItem(op.err.params, "resource") : NULL;
	GT_CHECK(refused && cJSON_IsString(res) && strcmp(res->valuestring, "work") == 0,
	      "attention of 2^50 scores: %s: %s", gt_err_name(&op), gt_err_message(&op.err));
	printf("  attention of 2^50 scores: %s\n", gt_err_message(&op.err));
	rp_error_clear(&op.err);
	t.dev.call_deadline_ms = deadline_ms;

	/* Release: plans and handle torn down, rebuilt by the next call. */
	unsigned n = rd_registry_release(&t.dev.registry);
	GT_CHECK(t.dev.backend->release(&t.dev, &err) == 0, "release: %s", gt_err_message(&err));
	c = census(&t);
	GT_CHECK(c.valid == 0 && c.handles_valid == 0, "after release %u resources: %u plans valid, handle valid %u", n,
	      c.valid, c.handles_valid);
	gt_mat_poison(&a.o.m);
	forward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "forward after release") == 0, "forward after release failed");
	check_forward(&a, "forward after release", 1e-2);
	c = census(&t);
	GT_CHECK(c.valid == 1 && c.handles_valid == 1, "after release and a forward: %u plans valid, handle valid %u", c.valid,
	      c.handles_valid);

	/* Reset: forgotten, not destroyed; the device's memory went with the
	 * context, so the tensors are made again. */
	rd_registry_invalidate(&t.dev.registry);
	GT_CHECK(t.dev.backend->reset(&t.dev, &err) == 0, "reset: %s", gt_err_message(&err));
	att_free(&t, &a);
	cudaGetLastError();   /* freeing the old context's memory failed, as it must */
	att_alloc(&t, &a, &causal_gqa, &seed);
	forward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "forward after reset") == 0, "forward after reset failed");
	check_forward(&a, "forward after reset", 1e-2);
	backward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "backward after reset") == 0, "backward after reset failed");
	check_backward_written(&a, "backward after reset");
	att_free(&t, &a);

	/* Autotuning (REGEN_ATTENTION_AUTOTUNE's setting): a new problem's
	 * plan is built from several configurations, its first call runs
	 * them timed, the next one reads the timing and keeps one, and the
	 * answer is the same; a release rebuilds the plan with that
	 * configuration alone. */
	rd_cuda_set_attention_autotune(&t.dev, 4);
	const struct problem tuned = { RP_DTYPE_BF16, 2, 4, 4, 256, 256, 64, false };
	att_alloc(&t, &a, &tuned, &seed);
	forward_op(&op, &a);
	t1 = gt_now();
	GT_CHECK(run(&t, lane, &op, "autotuned forward") == 0, "autotuned forward failed");
	printf("  autotuned first forward (candidates built and run timed): %.0f ms\n", (gt_now() - t1) * 1e3);
	check_forward(&a, "autotuned forward bf16 B2 H4 S256 D64", 1e-2);
	unsigned kept = 0;
	int index = -1, index_again = -1;
	long long engine = -1;
	GT_CHECK(rd_cuda_attention_plan_choice(&t.dev, &kept, &index, &engine) == 0 && kept >= 1 && index >= 0,
	      "after the first autotuned call: %u candidates, index %d", kept, index);
	printf("  candidates after the first call: %u\n", kept);
	gt_mat_poison(&a.o.m);
	forward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "autotuned forward, second call") == 0, "second autotuned forward failed");
	check_forward(&a, "autotuned forward, second call", 1e-2);
	GT_CHECK(rd_cuda_attention_plan_choice(&t.dev, &kept, &index, &engine) == 0 && kept == 1 && index >= 0,
	      "after the second autotuned call: %u candidates left, index %d", kept, index);
	printf("  autotuning kept configuration %d (engine %lld)\n", index, engine);
	n = rd_registry_release(&t.dev.registry);
	GT_CHECK(t.dev.backend->release(&t.dev, &err) == 0, "release: %s", gt_err_message(&err));
	gt_mat_poison(&a.o.m);
	forward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "autotuned forward after release") == 0, "autotuned forward after release failed");
	check_forward(&a, "autotuned forward after release", 1e-2);
	GT_CHECK(rd_cuda_attention_plan_choice(&t.dev, &kept, &index_again, &engine) == 0 && kept == 1 &&
		      index_again == index,
	      "after a release the tuned plan came back as configuration %d (%u candidates), not %d", index_again, kept,
	      index);
	backward_op(&op, &a);
	GT_CHECK(run(&t, lane, &op, "autotuned backward") == 0, "autotuned backward failed");
	check_backward_written(&a, "autotuned backward");
	att_free(&t, &a);
	rd_cuda_set_attention_autotune(&t.dev, 0);

	/* The cache's bound: with room for 2, three new problems leave 2. */
	rd_cuda_set_attention_plan_limit(&t.dev, 2);
	for (int64_t s = 64; s <= 192; s += 64) {
		const struct problem p = { RP_DTYPE_F16, 1, 2, 2, s, s, 64, false };
		struct att x;
		char label[64];
		snprintf(label, sizeof(label), "forward f16 S%lld", (long long)s);
		att_alloc(&t, &x, &p, &seed);
		forward_op(&op, &x);
		GT_CHECK(run(&t, lane, &op, label) == 0, "%s failed", label);
		check_forward(&x, label, 3e-3);
		att_free(&t, &x);
	}
	c = census(&t);
	GT_CHECK(rd_cuda_attention_plan_count(&t.dev) == 2 && c.plans == 2,
	      "with room for 2 plans: %u cached, %u registered", rd_cuda_attention_plan_count(&t.dev), c.plans);
	rd_cuda_set_attention_plan_limit(&t.dev, 0);

	t.dev.backend->lane_destroy(lane);
	gt_close(&t);
	printf("test_cuda_attention: %.1f s, %d failed\n", gt_now() - t0, gt_failures);
	printf("%s: test_cuda_attention\n", gt_failures ? "FAIL" : "PASS");
	return gt_failures ? 1 : 0;
}
