/* SPDX-License-Identifier: Apache-2.0 */
/* The lifecycle of rd_backend_cuda, driven the way the worker core drives it
 * (registry walk, then the backend hook). Each scenario runs in its own
 * process, forked before anything touches CUDA, so one that leaves the
 * context unusable cannot spoil the next (as the supervisor's respawn would):
 *  release:          work -> release: memory back to baseline, next GEMM right
 *  device_lost_next: inject device_lost -> the next ops fail DeviceLost,
 *                    on_fault once -> invalidate + reset: canary healthy,
 *                    next GEMM right
 *  device_lost_inflight: an op blocked in flight (behind a hang) when the
 *                    context faults fails DeviceLost (the health watch) or,
 *                    should the driver not report the fault, is ended by
 *                    its deadline's recovery -> reset -> GEMM right
 *  hang:             the next op blocks -> invalidate ends the hang, the op
 *                    completes -> reset -> GEMM right */
#include "gpu_common.h"

#include <cuda.h>

#include <math.h>
#include <string.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proto/errors.h"

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
	GT_CHECK(ok, "%s: GEMM %s rel error %.3g, %llu us%s%s", what, gt_err_name(&op), rel,
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

struct env {
	struct gt t;
	struct rd_lane *l0, *l1;
	struct problem p32, p16;
	uint64_t seed;
};

static void env_open(struct env *v)
{
	struct rp_error err = { 0 };
	v->seed = gt_seed();
	gt_open(&v->t);
	v->l0 = v->t.dev.backend->lane_create(&v->t.dev, 0, &err);
	v->l1 = v->t.dev.backend->lane_create(&v->t.dev, 1, &err);
	if (!v->l0 || !v->l1) {
		printf("FAIL: lane_create: %s\n", gt_err_message(&err));
		exit(1);
	}
	problem_make(&v->t, &v->p32, RP_DTYPE_F32, 256, 384, 512, v->seed);
	problem_make(&v->t, &v->p16, RP_DTYPE_BF16, 128, 256, 4096, v->seed + 10);
}

static void env_close(struct env *v)
{
	problem_free(&v->t, &v->p32);
	problem_free(&v->t, &v->p16);
	v->t.dev.backend->lane_destroy(v->l0);
	v->t.dev.backend->lane_destroy(v->l1);
	gt_close(&v->t);
}

/* After a reset the old context's memory is gone: new test buffers. */
static void env_new_buffers(struct env *v)
{
	for (struct problem *p = &v->p32; p; p = p == &v->p32 ? &v->p16 : NULL) {
		gt_mat_free(&v->t, &p->a);
		gt_mat_free(&v->t, &p->b);
		gt_mat_free(&v->t, &p->d);
		free(p->ref);
	}
	cudaGetLastError();
	v->seed += 100;
	problem_make(&v->t, &v->p32, RP_DTYPE_F32, 256, 384, 512, v->seed);
	problem_make(&v->t, &v->p16, RP_DTYPE_BF16, 128, 256, 4096, v->seed + 10);
}

/* Core-style reset: invalidate every resource, then the backend's reset.
 * sticky: the context took a sticky error whether or not on_fault said so
 * (it is not found while a kernel spins), so an unhealthy reset is the
 * respawn it leads to, not a failure. */
static bool env_reset_after(struct env *v, const char *what, bool sticky)
{
	struct rp_error err = { 0 };
	double t0 = gt_now();
	unsigned n = rd_registry_invalidate(&v->t.dev.registry);
	double inv_ms = (gt_now() - t0) * 1e3;
	int r = v->t.dev.backend->reset(&v->t.dev, &err);
	double ms = (gt_now() - t0) * 1e3;
	/* After a sticky error the design allows either outcome: healthy in
	 * process, or unhealthy (named DeviceLost) so that the supervisor
	 * respawns the worker; the next scenario's fresh process then proves
	 * the device healthy. REGEN_REQUIRE_INPROCESS_RESET=1 demands the first. */
	const char *strict = getenv("REGEN_REQUIRE_INPROCESS_RESET");
	bool accept_unhealthy = (v->t.faults > 0 || sticky) && !(strict && *strict == '1') && err.name &&
				strcmp(err.name, RP_ERR_DEVICE_LOST) == 0;
	GT_CHECK(r == 0 || accept_unhealthy, "%s: invalidate (%u resources, %.2f ms) + reset + canary: %s in %.1f ms%s%s", what,
	      n, inv_ms, r == 0 ? "healthy" : accept_unhealthy ? "unhealthy, reported for a respawn" : "UNHEALTHY", ms,
	      r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	return r == 0;
}

static bool env_reset(struct env *v, const char *what)
{
	return env_reset_after(v, what, false);
}

static unsigned completed(struct gt *t)
{
	pthread_mutex_lock(&t->lock);
	unsigned c = t->completed;
	pthread_mutex_unlock(&t->lock);
	return c;
}

static int scenario_release(void)
{
	struct env v;
	struct rp_error err = { 0 };
	uint64_t used, base;
	gt_open(&v.t);
	v.t.dev.backend->memory(&v.t.dev, &used, &base);
	uint64_t dev_open = device_used();
	printf("  after open: memory() used %llu B, baseline %llu B; device-wide used %.1f MiB\n",
	       (unsigned long long)used, (unsigned long long)base, dev_open / 1048576.0);
	gt_close(&v.t);
	env_open(&v);
	uint64_t dev_before = device_used();
	gemm_right(&v.t, v.l0, &v.p32, "initial f32");
	gemm_right(&v.t, v.l1, &v.p16, "initial bf16 (split-K shape)");
	v.t.dev.backend->memory(&v.t.dev, &used, &base);
	printf("  after work: memory() used %llu B (baseline %llu B); device-wide %.1f MiB, %.1f MiB before the first GEMM\n",
	       (unsigned long long)used, (unsigned long long)base, device_used() / 1048576.0, dev_before / 1048576.0);

	uint64_t lane_inits = v.l0->res.init_count;
	double t0 = gt_now();
	unsigned n = rd_registry_release(&v.t.dev.registry);
	int r = v.t.dev.backend->release(&v.t.dev, &err);
	double rel_ms = (gt_now() - t0) * 1e3;
	v.t.dev.backend->memory(&v.t.dev, &used, &base);
	uint64_t dev_rel = device_used();
	GT_CHECK(r == 0, "release: %u resources torn down in %.2f ms%s%s", n, rel_ms, r ? ": " : "",
	      r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	GT_CHECK(used <= base + base / 100, "memory() after release %llu B, baseline %llu B (within 1%%)",
	      (unsigned long long)used, (unsigned long long)base);
	int64_t delta = (int64_t)dev_rel - (int64_t)dev_before;
	GT_CHECK(llabs(delta) <= (int64_t)(dev_before / 100),
	      "device-wide used after release %.1f MiB vs %.1f MiB before the first GEMM (delta %+.2f MiB, within 1%%)",
	      dev_rel / 1048576.0, dev_before / 1048576.0, delta / 1048576.0);
	gemm_right(&v.t, v.l0, &v.p32, "after release");
	gemm_right(&v.t, v.l1, &v.p16, "after release");
	GT_CHECK(v.l0->res.init_count == lane_inits + 1, "the lane's stream was rebuilt lazily (init_count %llu -> %llu)",
	      (unsigned long long)lane_inits, (unsigned long long)v.l0->res.init_count);
	GT_CHECK(v.t.faults == 0, "no on_fault (%u)", v.t.faults);
	env_close(&v);
	return gt_failures ? 1 : 0;
}

/* When the primary context cannot be made again in this process: can a
 * fresh non-primary context run the canary? (Diagnostic only: it tells
 * whether a backend on created contexts could recover in-process.) */
static void diagnose_fresh_context(void)
{
	typedef CUresult (*create_v2)(CUcontext *, unsigned int, CUdevice);
	void *p = NULL, *q = NULL;
	enum cudaDriverEntryPointQueryResult qr;
	cudaGetDriverEntryPointByVersion("cuCtxCreate", &p, 12000, cudaEnableDefault, &qr);
	cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &q, 12000, cudaEnableDefault, &qr);
	if (!p || !q) {
		printf("  diagnostic: no cuCtxCreate entry point\n");
		return;
	}
	CUcontext c = NULL;
	CUresult r = ((create_v2)p)(&c, 0, 0);
	printf("  diagnostic: cuCtxCreate of a fresh context after the failed reset: %d\n", (int)r);
	if (r == CUDA_SUCCESS) {
		((__typeof__(cuCtxSetCurrent) *)q)(c);
		cudaError_t e = rk_canary(0);
		printf("  diagnostic: canary in that fresh context: %s\n", cudaGetErrorString(e));
	}
}

static void *fresh_thread(void *arg)
{
	(void)arg;
	cudaError_t e = cudaSetDevice(0);
	if (e == cudaSuccess)
		e = cudaFree(NULL);
	printf("  diagnostic: a thread that never used the old context: cudaSetDevice + cudaFree(0): %s\n",
	       cudaGetErrorString(e));
	return NULL;
}

static int scenario_lost_next(void)
{
	struct env v;
	struct rp_error err = { 0 };
	env_open(&v);
	gemm_right(&v.t, v.l0, &v.p32, "before the fault");
	int r = v.t.dev.backend->inject_fault(&v.t.dev, "device_lost", &err);
	GT_CHECK(r == 0, "inject_fault(device_lost)%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	struct rd_op op;
	gt_gemm(&op, &v.p32.a, &v.p32.b, NULL, &v.p32.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	gt_run(&v.t, v.l0, &op, 30);
	GT_CHECK(op.err.name && strcmp(op.err.name, RP_ERR_DEVICE_LOST) == 0, "the next op fails %s: %s (%llu us)",
	      gt_err_name(&op), gt_err_message(&op.err), (unsigned long long)op.elapsed_us);
	rp_error_clear(&op.err);
	gt_gemm(&op, &v.p16.a, &v.p16.b, NULL, &v.p16.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	unsigned target = completed(&v.t) + 1;
	op.lane = v.l1;
	r = v.t.dev.backend->submit(v.l1, &op);
	if (r == 0)
		gt_wait(&v.t, target, 30);
	GT_CHECK(op.err.name && strcmp(op.err.name, RP_ERR_DEVICE_LOST) == 0, "an op on the other lane fails %s at %s: %s",
	      gt_err_name(&op), r ? "submit" : "completion", gt_err_message(&op.err));
	rp_error_clear(&op.err);
	GT_CHECK(v.t.faults == 1, "on_fault called %u time(s): \"%s\"", v.t.faults, v.t.fault_reason);
	if (env_reset(&v, "after device_lost")) {
		env_new_buffers(&v);
		gemm_right(&v.t, v.l0, &v.p32, "after reset");
		gemm_right(&v.t, v.l1, &v.p16, "after reset");
		GT_CHECK(v.t.faults == 1, "no further on_fault (%u)", v.t.faults);
		env_close(&v);
	} else {
		/* Is it the lane threads (which had the old context current)? */
		v.t.dev.backend->lane_destroy(v.l0);
		v.t.dev.backend->lane_destroy(v.l1);
		struct rp_error e2 = { 0 };
		rd_registry_invalidate(&v.t.dev.registry);
		r = v.t.dev.backend->reset(&v.t.dev, &e2);
		printf("  diagnostic: reset again with every lane thread gone: %s%s%s\n", r ? "UNHEALTHY" : "healthy",
		       r ? ": " : "", r ? gt_err_message(&e2) : "");
		rp_error_clear(&e2);
		pthread_t th;
		pthread_create(&th, NULL, fresh_thread, NULL);
		pthread_join(th, NULL);
		diagnose_fresh_context();
	}
	return gt_failures ? 1 : 0;
}

/* A call queued behind a spinning kernel when the context faults on another
 * stream. With the health watch on, a fault the driver reports is found
 * without the call's help and the call fails DeviceLost. On H200 with
 * driver 580 the driver reports nothing while the spin runs (not to the
 * call's event, not to the context check, no XID): the call's deadline is
 * what ends it (the core answers it with Timeout and reports a hang, and
 * the worker is respawned). Here, as an in-process recovery would,
 * invalidate + reset: the call completes, and the reset may find the
 * context unusable (the respawn the design falls back to). */
#define INFLIGHT_DEADLINE_S 3.0
static int scenario_lost_inflight(void)
{
	struct env v;
	struct rp_error err = { 0 };
	env_open(&v);
	int r = v.t.dev.backend->health_start(&v.t.dev, 5, &err);
	GT_CHECK(r == 0, "health watch started%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	gemm_right(&v.t, v.l0, &v.p32, "before the fault");
	r = v.t.dev.backend->inject_fault(&v.t.dev, "hang", &err);
	GT_CHECK(r == 0, "inject_fault(hang), to hold the next op in flight%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	struct rd_op op;
	gt_gemm(&op, &v.p32.a, &v.p32.b, NULL, &v.p32.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	unsigned target = completed(&v.t) + 1;
	op.lane = v.l0;
	v.t.dev.backend->submit(v.l0, &op);
	GT_CHECK(gt_wait(&v.t, target, 0.5) < 0, "the op is in flight (not done after 0.5 s)");
	double t0 = gt_now();
	r = v.t.dev.backend->inject_fault(&v.t.dev, "device_lost", &err);
	GT_CHECK(r == 0, "inject_fault(device_lost) while it is in flight%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	bool done = gt_wait(&v.t, target, INFLIGHT_DEADLINE_S) == 0;
	if (done) {
		GT_CHECK(op.err.name && strcmp(op.err.name, RP_ERR_DEVICE_LOST) == 0,
		      "the in-flight op failed %s %.1f ms after the fault (found by the health watch): %s",
		      gt_err_name(&op), (gt_now() - t0) * 1e3, gt_err_message(&op.err));
		GT_CHECK(v.t.faults == 1, "on_fault called %u time(s) after %.1f ms: \"%s\"", v.t.faults,
		      (v.t.first_fault_at - t0) * 1e3, v.t.fault_reason);
	} else {
		printf("  the fault was not reported while the spin runs (on_fault %u time(s)); the call's deadline "
		       "of %.0f s passed: the worker would answer it with Timeout and report a hang\n",
		       v.t.faults, INFLIGHT_DEADLINE_S);
		unsigned n = rd_registry_invalidate(&v.t.dev.registry);
		done = gt_wait(&v.t, target, 20) == 0;
		GT_CHECK(done, "invalidate (%u resources) let the hung op complete %.1f ms after the fault (%s)", n,
		      (gt_now() - t0) * 1e3, gt_err_name(&op));
		if (!done)
			_exit(1);
	}
	rp_error_clear(&op.err);
	v.t.dev.backend->health_stop(&v.t.dev);
	if (env_reset_after(&v, "after device_lost in flight", true)) {
		env_new_buffers(&v);
		gemm_right(&v.t, v.l0, &v.p32, "after reset");
		gemm_right(&v.t, v.l1, &v.p16, "after reset");
		env_close(&v);
	}
	return gt_failures ? 1 : 0;
}

/* What the supervisor's respawn gives: a new process right after one whose
 * context faulted. */
static int scenario_fresh_process(void)
{
	struct env v;
	env_open(&v);
	gemm_right(&v.t, v.l0, &v.p32, "fresh process after the faults");
	gemm_right(&v.t, v.l1, &v.p16, "fresh process after the faults, other lane");
	env_close(&v);
	return gt_failures ? 1 : 0;
}

static int scenario_hang(void)
{
	struct env v;
	struct rp_error err = { 0 };
	env_open(&v);
	gemm_right(&v.t, v.l1, &v.p32, "before the hang");
	int r = v.t.dev.backend->inject_fault(&v.t.dev, "hang", &err);
	GT_CHECK(r == 0, "inject_fault(hang)%s%s", r ? ": " : "", r ? gt_err_message(&err) : "");
	rp_error_clear(&err);
	gt_mat_poison(&v.p32.d);
	struct rd_op op;
	gt_gemm(&op, &v.p32.a, &v.p32.b, NULL, &v.p32.d, NULL, false, false, 1.0, 0.0, RP_EPILOGUE_NONE, RP_COMPUTE_F32);
	unsigned target = completed(&v.t) + 1;
	op.lane = v.l0;
	v.t.dev.backend->submit(v.l0, &op);
	GT_CHECK(gt_wait(&v.t, target, 1.5) < 0, "the next op is blocked by the hang (not done after 1.5 s)");
	double t0 = gt_now();
	unsigned n = rd_registry_invalidate(&v.t.dev.registry);
	bool done = gt_wait(&v.t, target, 30) == 0;
	GT_CHECK(done, "invalidate (%u resources) ended the hang: the blocked op completed %.1f ms later (%s)", n,
	      (gt_now() - t0) * 1e3, gt_err_name(&op));
	if (!done)
		_exit(1);
	rp_error_clear(&op.err);
	struct rp_error rerr = { 0 };
	r = v.t.dev.backend->reset(&v.t.dev, &rerr);
	GT_CHECK(r == 0, "reset after the hang: %s in %.1f ms%s%s", r ? "UNHEALTHY" : "healthy", (gt_now() - t0) * 1e3,
	      r ? ": " : "", r ? gt_err_message(&rerr) : "");
	rp_error_clear(&rerr);
	if (r == 0) {
		env_new_buffers(&v);
		gemm_right(&v.t, v.l0, &v.p32, "after the hang's reset");
		gemm_right(&v.t, v.l1, &v.p16, "after the hang's reset, other lane");
		GT_CHECK(v.t.faults == 0, "no on_fault for a hang (%u)", v.t.faults);
		env_close(&v);
	}
	return gt_failures ? 1 : 0;
}

static void at_exit_trace(void)
{
	void *frames[64];
	int n = backtrace(frames, 64);
	dprintf(1, "  (exit() called; backtrace follows)\n");
	backtrace_symbols_fd(frames, n, 1);
}

static void on_crash(int sig)
{
	void *frames[64];
	int n = backtrace(frames, 64);
	dprintf(1, "  CRASH: signal %d\n", sig);
	backtrace_symbols_fd(frames, n, 1);
	_exit(128 + sig);
}

int main(void)
{
	/* known: a failure seen on the device and understood; it is reported
	 * as XFAIL and not counted unless REGEN_STRICT=1. */
	static const struct {
		const char *name;
		int (*fn)(void);
		const char *known;
	} scenarios[] = {
		{ "release", scenario_release, NULL },
		{ "device_lost_next", scenario_lost_next, NULL },
		{ "device_lost_inflight", scenario_lost_inflight, NULL },
		{ "fresh_process", scenario_fresh_process, NULL },
		{ "hang", scenario_hang, NULL },
	};
	const char *strict_env = getenv("REGEN_STRICT");
	bool strict = strict_env && *strict_env == '1';
	/* Before any output: children end with _exit(), which flushes nothing. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	setenv("REGEN_HANG_SECONDS", "30", 1);
	int failed = 0, skipped = 0;
	double ended = gt_now();
	const char *only = getenv("REGEN_LIFECYCLE_ONLY");
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
		if (only && strcmp(only, scenarios[i].name) != 0)
			continue;
		printf("scenario %s\n", scenarios[i].name);
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			signal(SIGSEGV, on_crash);
			signal(SIGABRT, on_crash);
			signal(SIGBUS, on_crash);
			atexit(at_exit_trace);
			printf("  [pid %d started %.3f s after the previous scenario ended]\n", (int)getpid(), gt_now() - ended);
			if (gt_have_gpu())
				_exit(GT_SKIP);
			int r = scenarios[i].fn();
			fflush(stdout);
			_exit(r);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		ended = gt_now();
		bool xfail = code != 0 && code != GT_SKIP && scenarios[i].known && !strict;
		printf("scenario %s: %s (exit %d)\n", scenarios[i].name,
		       code == 0 ? "PASS" : code == GT_SKIP ? "SKIP" : xfail ? "XFAIL" : "FAIL", code);
		if (xfail)
			printf("  known limitation: %s\n", scenarios[i].known);
		if (code == GT_SKIP)
			skipped++;
		else if (code && !xfail)
			failed++;
	}
	if (skipped && !failed)
		return GT_SKIP;
	printf("%s: test_cuda_lifecycle (%d scenario(s) failed)\n", failed ? "FAIL" : "PASS", failed);
	return failed ? 1 : 0;
}
