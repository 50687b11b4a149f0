/* The lifecycle of rd_backend_cuda, driven the way the worker core drives it:
 * work -> release (memory back to baseline, next GEMM right) -> injected
 * device_lost (the in-flight op fails io.regen.DeviceLost, on_fault called
 * once) -> registry invalidate + backend reset (canary healthy, next GEMM
 * right) -> injected hang (the next op blocks; invalidate lets it finish;
 * reset) -> final GEMM right. */
#include "gpu_common.h"

#include <math.h>
#include <string.h>
#include <unistd.h>
#include "proto/errors.h"

static int failures;

#define CHECK(cond, ...)                                  \
	do {                                              \
		if (cond) {                               \
			printf("  ok: ");                 \
		} else {                                  \
			printf("  FAIL: ");               \
			failures++;                       \
		}                                         \
		printf(__VA_ARGS__);                      \
		printf("\n");                             \
	} while (0)

struct problem {
	struct gt_mat a, b, d;
	double *ref;
};

static void problem_make(struct gt *t, struct problem *p, enum rp_dtype dt, int64_t m, int64_t n, int64_t k,
			 uint64_t seed)
{
	gt_mat_alloc(t, &p->a, dt, m, k, k);
	gt_mat_alloc(t, &p->b, dt, k, n, n);
	gt_mat_alloc(t, &p->d, dt, m, n, n);
	gt_mat_fill(&p->a, seed, 0);
	gt_mat_fill(&p->b, seed + 1, 0);
	struct rd_op op;
	gt_gemm(&op, &p->a, &p->b, NULL, &p->d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	p->ref = malloc(sizeof(double) * (size_t)(m * n));
	gt_gemm_reference(&op, &p->a, &p->b, NULL, NULL, p->ref, false);
}

static void problem_free(struct gt *t, struct problem *p)
{
	gt_mat_free(t, &p->a);
	gt_mat_free(t, &p->b);
	gt_mat_free(t, &p->d);
	free(p->ref);
}

/* Runs the problem's GEMM on the lane and checks it. */
static bool gemm_right(struct gt *t, struct rd_lane *lane, struct problem *p, const char *what)
{
	gt_mat_poison(&p->d);
	struct rd_op op;
	gt_gemm(&op, &p->a, &p->b, NULL, &p->d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	int r = gt_run(t, lane, &op, 60);
	double rel = INFINITY;
	unsigned long nans = 0, pad = 0;
	if (r == 0)
		rel = gt_rel_error(&p->d, p->ref, &nans, &pad);
	double tol = p->d.dt == RP_DTYPE_F32 ? 1e-5 : 1e-2;
	bool ok = r == 0 && rel < tol && nans == 0;
	CHECK(ok, "%s: GEMM %s rel error %.3g, %llu us%s%s", what, gt_err_name(&op), rel,
	      (unsigned long long)op.elapsed_us, r ? ": " : "", r ? gt_err_message(&op.err) : "");
	rp_error_clear(&op.err);
	return ok;
}

static uint64_t device_used(void)
{
	size_t free_b = 0, total = 0;
	CUDA_OK(cudaMemGetInfo(&free_b, &total));
	return (uint64_t)(total - free_b);
}

int main(void)
{
	if (gt_have_gpu())
		return GT_SKIP;
	setenv("REGEN_HANG_SECONDS", "30", 1);
	uint64_t seed = gt_seed();
	printf("test_cuda_lifecycle: seed %llu\n", (unsigned long long)seed);
	struct gt t;
	struct rp_error err = { 0 };
	gt_open(&t);
	uint64_t used, base;
	t.dev.backend->memory(&t.dev, &used, &base);
	uint64_t dev_base = device_used();
	printf("  after open: memory() used %llu B, baseline %llu B; device-wide used %.1f MiB\n",
	       (unsigned long long)used, (unsigned long long)base, dev_base / 1048576.0);

	struct rd_lane *l0 = t.dev.backend->lane_create(&t.dev, 0, &err);
	struct rd_lane *l1 = t.dev.backend->lane_create(&t.dev, 1, &err);
	if (!l0 || !l1) {
		printf("FAIL: lane_create: %s\n", gt_err_message(&err));
		return 1;
	}
	struct problem p32, p16;
	problem_make(&t, &p32, RP_DTYPE_F32, 256, 384, 512, seed);
	problem_make(&t, &p16, RP_DTYPE_BF16, 128, 256, 4096, seed + 10);
	uint64_t dev_with_buffers = device_used();
	gemm_right(&t, l0, &p32, "initial f32");
	gemm_right(&t, l1, &p16, "initial bf16 (split-K shape)");
	t.dev.backend->memory(&t.dev, &used, &base);
	uint64_t dev_work = device_used();
	printf("  after work: memory() used %llu B; device-wide %.1f MiB (%.1f MiB of it the test's own buffers)\n",
	       (unsigned long long)used, dev_work / 1048576.0, (dev_with_buffers - dev_base) / 1048576.0);

	/* ---- release ---- */
	uint64_t lane_inits = l0->res.init_count;
	double t0 = gt_now();
	unsigned n = rd_registry_release(&t.dev.registry);
	int r = t.dev.backend->release(&t.dev, &err);
	double rel_ms = (gt_now() - t0) * 1e3;
	t.dev.backend->memory(&t.dev, &used, &base);
	uint64_t dev_rel = device_used();
	CHECK(r == 0, "release: %u resources torn down in %.2f ms%s%s", n, rel_ms, r ? ": " : "",
	      r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	CHECK(used <= base + base / 100, "memory() after release %llu B, baseline %llu B (within 1%%)",
	      (unsigned long long)used, (unsigned long long)base);
	int64_t dev_delta = (int64_t)dev_rel - (int64_t)dev_with_buffers;
	CHECK(llabs(dev_delta) <= (int64_t)(dev_with_buffers / 100),
	      "device-wide used after release %.1f MiB vs %.1f MiB before any GEMM (delta %+.1f MiB, within 1%%)",
	      dev_rel / 1048576.0, dev_with_buffers / 1048576.0, dev_delta / 1048576.0);
	gemm_right(&t, l0, &p32, "after release");
	gemm_right(&t, l1, &p16, "after release");
	CHECK(l0->res.init_count == lane_inits + 1, "the lane's stream was rebuilt lazily (init_count %llu -> %llu)",
	      (unsigned long long)lane_inits, (unsigned long long)l0->res.init_count);

	/* ---- device_lost ---- */
	struct problem big = { .ref = NULL };
	gt_mat_alloc(&t, &big.a, RP_DTYPE_F32, 8192, 8192, 8192);
	gt_mat_alloc(&t, &big.b, RP_DTYPE_F32, 8192, 8192, 8192);
	gt_mat_alloc(&t, &big.d, RP_DTYPE_F32, 8192, 8192, 8192);
	gt_mat_fill(&big.a, seed + 21, 0);
	gt_mat_fill(&big.b, seed + 22, 0);
	struct rd_op inflight, next;
	gt_gemm(&inflight, &big.a, &big.b, NULL, &big.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	pthread_mutex_lock(&t.lock);
	unsigned target = t.completed + 1;
	pthread_mutex_unlock(&t.lock);
	inflight.lane = l0;
	CHECK(t.dev.backend->submit(l0, &inflight) == 0, "a long GEMM (8192^3 f32, 1.1 TFLOP) submitted");
	usleep(2000);
	r = t.dev.backend->inject_fault(&t.dev, "device_lost", &err);
	CHECK(r == 0, "inject_fault(device_lost) while it runs%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	if (gt_wait(&t, target, 60) < 0) {
		printf("FAIL: the in-flight op never completed\n");
		return 1;
	}
	CHECK(inflight.err.name && strcmp(inflight.err.name, RP_ERR_DEVICE_LOST) == 0,
	      "the in-flight op failed %s: %s (%llu us)", gt_err_name(&inflight), gt_err_message(&inflight.err),
	      (unsigned long long)inflight.elapsed_us);
	rp_error_clear(&inflight.err);
	gt_gemm(&next, &p32.a, &p32.b, NULL, &p32.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	next.lane = l1;
	r = t.dev.backend->submit(l1, &next);
	if (r == 0) {
		gt_wait(&t, target + 1, 60);
	}
	CHECK(next.err.name && strcmp(next.err.name, RP_ERR_DEVICE_LOST) == 0,
	      "the next op on another lane fails too (%s at %s): %s", gt_err_name(&next), r ? "submit" : "completion",
	      gt_err_message(&next.err));
	rp_error_clear(&next.err);
	CHECK(t.faults == 1, "on_fault called %u time(s): \"%s\"", t.faults, t.fault_reason);

	/* ---- reset, as the core does it ---- */
	t0 = gt_now();
	n = rd_registry_invalidate(&t.dev.registry);
	double inv_ms = (gt_now() - t0) * 1e3;
	r = t.dev.backend->reset(&t.dev, &err);
	double reset_ms = (gt_now() - t0) * 1e3;
	CHECK(r == 0, "invalidate (%u resources, %.2f ms) + reset + canary: healthy in %.1f ms total%s%s", n, inv_ms,
	      reset_ms, r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	/* The context's memory went with it: the test's buffers are new ones. */
	problem_free(&t, &big);
	for (struct problem *p = &p32; p; p = p == &p32 ? &p16 : NULL) {
		gt_mat_free(&t, &p->a);
		gt_mat_free(&t, &p->b);
		gt_mat_free(&t, &p->d);
		free(p->ref);
	}
	cudaGetLastError();
	problem_make(&t, &p32, RP_DTYPE_F32, 256, 384, 512, seed + 30);
	problem_make(&t, &p16, RP_DTYPE_BF16, 128, 256, 4096, seed + 40);
	gemm_right(&t, l0, &p32, "after reset");
	gemm_right(&t, l1, &p16, "after reset");
	t.dev.backend->memory(&t.dev, &used, &base);
	printf("  after reset: memory() used %llu B; device-wide %.1f MiB\n", (unsigned long long)used,
	       device_used() / 1048576.0);

	/* ---- hang ---- */
	r = t.dev.backend->inject_fault(&t.dev, "hang", &err);
	CHECK(r == 0, "inject_fault(hang)%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	gt_mat_poison(&p32.d);
	gt_gemm(&next, &p32.a, &p32.b, NULL, &p32.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	pthread_mutex_lock(&t.lock);
	target = t.completed + 1;
	pthread_mutex_unlock(&t.lock);
	next.lane = l0;
	t.dev.backend->submit(l0, &next);
	CHECK(gt_wait(&t, target, 1.5) < 0, "the next op is blocked by the hang (not done after 1.5 s)");
	t0 = gt_now();
	n = rd_registry_invalidate(&t.dev.registry);
	bool done = gt_wait(&t, target, 30) == 0;
	CHECK(done, "invalidate ended the hang: the blocked op completed %.1f ms later (%s)", (gt_now() - t0) * 1e3,
	      gt_err_name(&next));
	rp_error_clear(&next.err);
	r = t.dev.backend->reset(&t.dev, &err);
	CHECK(r == 0, "reset after the hang: healthy%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	for (struct problem *p = &p32; p; p = p == &p32 ? &p16 : NULL) {
		gt_mat_free(&t, &p->a);
		gt_mat_free(&t, &p->b);
		gt_mat_free(&t, &p->d);
		free(p->ref);
	}
	cudaGetLastError();
	problem_make(&t, &p32, RP_DTYPE_F32, 256, 384, 512, seed + 50);
	gemm_right(&t, l0, &p32, "after the hang's reset");
	gemm_right(&t, l1, &p32, "after the hang's reset, other lane");
	CHECK(t.faults == 1, "no further on_fault calls (%u)", t.faults);

	problem_free(&t, &p32);
	t.dev.backend->lane_destroy(l0);
	t.dev.backend->lane_destroy(l1);
	gt_close(&t);
	printf("%s: test_cuda_lifecycle (%d failures)\n", failures ? "FAIL" : "PASS", failures);
	return failures ? 1 : 0;
}
