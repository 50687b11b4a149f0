/* SPDX-License-Identifier: Apache-2.0 */
/* bench_latency: what a GEMM through regend costs over the same GEMM run
 * in-process with cuBLASLt.
 *
 *   bench_latency REGEND_PATH [--iters N]
 *
 * Starts its own regend (CUDA backend, one device) on a socket in a fresh
 * temporary directory, imports three cudaMalloc'ed matrices through CUDA IPC
 * and times regen_gemm (submit -> reply; the reply means the GEMM finished)
 * of a 64x64x64 bf16 GEMM against cublasLtMatmul + cudaStreamSynchronize of
 * the same GEMM in this process, after checking once that both agree, on
 * each transport of libregen (the lane's ring, io.regen.Lane, and Varlink).
 * Then 4096^3 bf16 one call at a time, and 8192x4096x128 and 128x4096x16384
 * pipelined (PIPE calls queued with regen_gemm_submit, then regen_wait;
 * against PIPE launches and one synchronize; the ring's, Varlink's and the
 * in-process rounds taking turns, each after an untimed call of its own),
 * each transport against in process.
 * Prints markdown tables.
 *
 * Exit codes: 0 done, 1 failure, 2 usage, 77 skipped (no CUDA device). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>
#include <stdatomic.h>

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "regen.h"
#include "bench_daemon.h"
#include "tests/lib/cuda_check.h"

#define SKIP 77
#define WARMUP 200
#define BIG 4096
#define BIG_WARMUP 3
#define BIG_ITERS 20
#define PIPE 20
/* Rounds of PIPE calls per path, the paths taking turns round by round (ring,
 * Varlink, in process): a spell of the shared machine that lasts longer
 * than a round falls on all three, where three blocks one after the other
 * each met their own. */
#define PIPE_ROUNDS 50
#define WORKSPACE_BYTES (32u << 20)

/* ---- the regend child: started here, always stopped and cleaned up ---- */

/* The lanes' launch phases (REGEN_CUDA_LAUNCH_PROFILE in regend's
 * environment: each lane prints its own when it goes). */
static void print_launch_profile(void)
{
	char line[512];
	FILE *f;

	usleep(300000);   /* the lanes go after the connections close */
	if ((f = fopen(bench_log(), "r")) == NULL)
		return;
	printf("\n");
	while (fgets(line, sizeof(line), f) != NULL)
		if (strstr(line, "launch phases") != NULL || strstr(line, "completions of") != NULL)
			fputs(line, stdout);
	fclose(f);
}

/* ---- matrices ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rand_uniform(void)   /* [-1, 1) */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static uint16_t float_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest even (no NaN inputs here) */
	return (uint16_t)(u >> 16);
}

static float bf16_to_float(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

struct mat {
	int64_t rows, cols;
	size_t bytes;
	void *ptr;
	regen_buffer *buf;
};

/* c NULL: not imported into regend. */
static void mat_alloc(regen_client *c, struct mat *m, int64_t rows, int64_t cols, bool fill)
{
	cudaIpcMemHandle_t h;
	int r;

	m->rows = rows;
	m->cols = cols;
	m->bytes = (size_t)rows * (size_t)cols * sizeof(uint16_t);
	CUDA_OK(cudaMalloc(&m->ptr, m->bytes));
	if (fill) {
		size_t n = (size_t)rows * (size_t)cols, i;
		uint16_t *host = malloc(m->bytes);

		if (host == NULL) {
			bench_die("malloc %zu", m->bytes);
		}
		for (i = 0; i < n; i++) {
			host[i] = float_to_bf16((float)rand_uniform());
		}
		CUDA_OK(cudaMemcpy(m->ptr, host, m->bytes, cudaMemcpyHostToDevice));
		free(host);
	} else {
		CUDA_OK(cudaMemset(m->ptr, 0, m->bytes));
	}
	if (c == NULL) {
		return;
	}
	CUDA_OK(cudaIpcGetMemHandle(&h, m->ptr));
	r = regen_buffer_import_cuda_ipc(c, 0, &h, 0, m->bytes, &m->buf);
	if (r < 0) {
		bench_die_regen(c, "regen_buffer_import_cuda_ipc", r);
	}
}

static void mat_free(struct mat *m)
{
	if (m->buf != NULL) {
		regen_buffer_close(m->buf);
		m->buf = NULL;
	}
	if (m->ptr != NULL) {
		CUDA_OK(cudaFree(m->ptr));
		m->ptr = NULL;
	}
}

static float *mat_download(const struct mat *m)
{
	size_t n = (size_t)m->rows * (size_t)m->cols, i;
	uint16_t *raw = malloc(m->bytes);
	float *out = malloc(n * sizeof(float));

	if (raw == NULL || out == NULL) {
		bench_die("malloc");
	}
	CUDA_OK(cudaMemcpy(raw, m->ptr, m->bytes, cudaMemcpyDeviceToHost));
	for (i = 0; i < n; i++) {
		out[i] = bf16_to_float(raw[i]);
	}
	free(raw);
	return out;
}

static void tensor2(struct regen_tensor *t, const struct mat *m)
{
	memset(t, 0, sizeof(*t));
	t->buffer = m->buf;
	t->offset = 0;
	t->dtype = REGEN_BF16;
	t->rank = 2;
	t->shape[0] = m->rows;
	t->shape[1] = m->cols;
}

/* ---- the two paths ---- */

struct gemm {
	int64_t m, n, k;
	struct mat a, b, d_regen, d_local;
	struct regen_gemm_args args;
	/* cuBLASLt, in this process */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, ld;
	cublasLtMatmulAlgo_t algo;
	size_t ws_size;                  /* what the heuristic's algorithm asks for */
	/* Host time inside cublasLtMatmul, in process: what the worker's
	 * "kernel" launch phase is to be compared with. */
	double launch_us_sum;
	long launches;
};

struct lt {
	cublasLtHandle_t handle;
	cudaStream_t stream;
	void *workspace;
	cudaMemPool_t pool;
};

static void gemm_setup(regen_client *c, struct lt *lt, struct gemm *g, int64_t m, int64_t n, int64_t k)
{
	cublasLtMatmulPreference_t pref;
	cublasLtMatmulHeuristicResult_t heur;
	cublasOperation_t op = CUBLAS_OP_N;
	size_t ws = WORKSPACE_BYTES;
	int found = 0;

	memset(g, 0, sizeof(*g));
	g->m = m;
	g->n = n;
	g->k = k;
	mat_alloc(c, &g->a, m, k, true);
	mat_alloc(c, &g->b, k, n, true);
	mat_alloc(c, &g->d_regen, m, n, false);
	mat_alloc(NULL, &g->d_local, m, n, false);

	/* regend: D[M,N] = A[M,K] @ B[K,N], row-major, alpha 1, beta 0. */
	tensor2(&g->args.a, &g->a);
	tensor2(&g->args.b, &g->b);
	tensor2(&g->args.d, &g->d_regen);
	g->args.alpha = 1.0;
	g->args.alpha_set = true;
	g->args.beta = 0.0;
	g->args.epilogue = REGEN_EPILOGUE_NONE;

	/* cuBLASLt is column-major: the row-major D[M,N] is the column-major
	 * D^T [N,M] (ld N), and D^T = B^T A^T with B^T [N,K] (ld N) and
	 * A^T [K,M] (ld K) as B and A are stored. */
	LT_OK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT_OK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)));
	LT_OK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof(op)));
	LT_OK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, (uint64_t)n, (uint64_t)k, n));   /* B^T */
	LT_OK(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, (uint64_t)k, (uint64_t)m, k));   /* A^T */
	LT_OK(cublasLtMatrixLayoutCreate(&g->ld, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, n));   /* D^T */
	LT_OK(cublasLtMatmulPreferenceCreate(&pref));
	LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
	LT_OK(cublasLtMatmulAlgoGetHeuristic(lt->handle, g->desc, g->la, g->lb, g->ld, g->ld, pref, 1, &heur, &found));
	if (found < 1) {
		bench_die("cublasLtMatmulAlgoGetHeuristic: no algorithm for %lldx%lldx%lld bf16", (long long)m, (long long)n,
		    (long long)k);
	}
	g->algo = heur.algo;
	g->ws_size = heur.workspaceSize;
	LT_OK(cublasLtMatmulPreferenceDestroy(pref));
}

static void gemm_teardown(struct gemm *g)
{
	cublasLtMatrixLayoutDestroy(g->la);
	cublasLtMatrixLayoutDestroy(g->lb);
	cublasLtMatrixLayoutDestroy(g->ld);
	cublasLtMatmulDescDestroy(g->desc);
	mat_free(&g->a);
	mat_free(&g->b);
	mat_free(&g->d_regen);
	mat_free(&g->d_local);
}

static void run_regen(regen_client *c, struct gemm *g)
{
	int r = regen_gemm(c, &g->args);

	if (r < 0) {
		bench_die_regen(c, "regen_gemm", r);
	}
}

static void local_launch(struct lt *lt, struct gemm *g, void *ws, size_t ws_size)
{
	const float alpha = 1.0f, beta = 0.0f;
	double t0 = bench_now_s();

	LT_OK(cublasLtMatmul(lt->handle, g->desc, &alpha, g->b.ptr, g->la, g->a.ptr, g->lb, &beta, g->d_local.ptr,
			     g->ld, g->d_local.ptr, g->ld, &g->algo, ws, ws_size, lt->stream));
	g->launch_us_sum += (bench_now_s() - t0) * 1e6;
	g->launches++;
}

static void run_local(struct lt *lt, struct gemm *g)
{
	local_launch(lt, g, lt->workspace, WORKSPACE_BYTES);
	CUDA_OK(cudaStreamSynchronize(lt->stream));
}

/* As regend launches: the workspace the algorithm asks for, taken from a
 * stream-ordered pool for this call and given back after it. */
static void run_local_pooled(struct lt *lt, struct gemm *g)
{
	void *ws = NULL;

	if (g->ws_size > 0)
		CUDA_OK(cudaMallocFromPoolAsync(&ws, g->ws_size, lt->pool, lt->stream));
	local_launch(lt, g, ws, g->ws_size);
	if (ws != NULL)
		CUDA_OK(cudaFreeAsync(ws, lt->stream));
	CUDA_OK(cudaStreamSynchronize(lt->stream));
}

/* ---- how the end of a call is learned, in process ---- */

/* The worker learns a call ended on a thread other than the one that
 * launched it: these time, in this process, each way it could, so that the
 * completion stage of a ring call can be compared with its floor. */
enum finish_way { FW_EVENT_SAME, FW_EVENT_OTHER, FW_FLAG_SAME, FW_WAYS };
static const char *const finish_way_names[FW_WAYS] = {
	"cudaEventRecord, then cudaEventQuery polled on the launching thread",
	"cudaEventRecord, then cudaEventQuery polled by another spinning thread (as the worker)",
	"cuStreamWriteValue32 of a mapped host word, polled (no driver call)",
};

static __typeof__(cuStreamWriteValue32) *write_value32;

struct finisher {
	pthread_t thread;
	cudaEvent_t ev;
	_Atomic int armed;    /* 1: poll ev; 2: stop */
	_Atomic int done;
};

static void *finisher_main(void *arg)
{
	struct finisher *f = arg;

	CUDA_OK(cudaSetDevice(0));
	for (;;) {
		int a = atomic_load_explicit(&f->armed, memory_order_acquire);
		if (a == 2)
			return NULL;
		if (a == 0) {
			__builtin_ia32_pause();
			continue;
		}
		cudaError_t e;
		while ((e = cudaEventQuery(f->ev)) == cudaErrorNotReady)
			;
		CUDA_OK(e);
		atomic_store_explicit(&f->armed, 0, memory_order_relaxed);
		atomic_store_explicit(&f->done, 1, memory_order_release);
	}
}

struct finish_state {
	cudaEvent_t ev;
	struct finisher other;
	volatile uint32_t *word;    /* mapped host memory */
	CUdeviceptr word_dev;
	uint32_t seq;
};

static void finish_setup(struct finish_state *fs)
{
	void *p = NULL;
	enum cudaDriverEntryPointQueryResult q;

	memset(fs, 0, sizeof(*fs));
	CUDA_OK(cudaEventCreateWithFlags(&fs->ev, cudaEventDisableTiming));
	CUDA_OK(cudaEventCreateWithFlags(&fs->other.ev, cudaEventDisableTiming));
	if (pthread_create(&fs->other.thread, NULL, finisher_main, &fs->other) != 0)
		bench_die("pthread_create");
	CUDA_OK(cudaHostAlloc((void **)&p, 64, cudaHostAllocMapped));
	fs->word = p;
	*fs->word = 0;
	CUDA_OK(cudaHostGetDevicePointer((void **)&fs->word_dev, p, 0));
	CUDA_OK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void **)&write_value32, 12000,
						 cudaEnableDefault, &q));
	if (q != cudaDriverEntryPointSuccess || write_value32 == NULL)
		bench_die("no cuStreamWriteValue32");
}

static void finish_teardown(struct finish_state *fs)
{
	atomic_store(&fs->other.armed, 2);
	pthread_join(fs->other.thread, NULL);
	CUDA_OK(cudaEventDestroy(fs->ev));
	CUDA_OK(cudaEventDestroy(fs->other.ev));
	CUDA_OK(cudaFreeHost((void *)fs->word));
}

static void run_local_finish(struct lt *lt, struct gemm *g, struct finish_state *fs, enum finish_way w)
{
	cudaError_t e;

	local_launch(lt, g, lt->workspace, WORKSPACE_BYTES);
	switch (w) {
	case FW_EVENT_SAME:
		CUDA_OK(cudaEventRecord(fs->ev, lt->stream));
		while ((e = cudaEventQuery(fs->ev)) == cudaErrorNotReady)
			;
		CUDA_OK(e);
		break;
	case FW_EVENT_OTHER:
		CUDA_OK(cudaEventRecord(fs->other.ev, lt->stream));
		atomic_store_explicit(&fs->other.done, 0, memory_order_relaxed);
		atomic_store_explicit(&fs->other.armed, 1, memory_order_release);
		while (!atomic_load_explicit(&fs->other.done, memory_order_acquire))
			__builtin_ia32_pause();
		break;
	case FW_FLAG_SAME: {
		uint32_t want = ++fs->seq;
		if (write_value32((CUstream)lt->stream, fs->word_dev, want, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS)
			bench_die("cuStreamWriteValue32 failed");
		while ((int32_t)(*fs->word - want) < 0)
			__builtin_ia32_pause();
		break;
	}
	default:
		break;
	}
}

static double local_launch_mean_us(struct gemm *g)
{
	double mean = g->launches ? g->launch_us_sum / (double)g->launches : 0;

	g->launch_us_sum = 0;
	g->launches = 0;
	return mean;
}

/* Where a pipelined ring round's time goes, call by call: each stage's
 * moment from the round's first submission, summed over rounds. */
enum pipe_mark { PM_TAKEN, PM_LAUNCHED, PM_FINISHED, PM_PUBLISHED, PM_COUNT };
struct pipe_timeline {
	double us[PIPE][PM_COUNT];
	int rounds;
};

static void run_regen_pipelined(regen_client *c, struct gemm *g, struct pipe_timeline *tl)
{
	uint64_t t[PIPE];
	struct regen_call_timing ct[PIPE];
	bool timed = tl != NULL;
	int r;

	for (int i = 0; i < PIPE; i++) {
		r = regen_gemm_submit(c, &g->args, &t[i]);
		if (r < 0) {
			bench_die_regen(c, "regen_gemm_submit", r);
		}
	}
	/* One wait per call reaps the same completions in the same order as
	 * one wait for the last, and lets each call's stamps be read. */
	for (int i = 0; i < PIPE; i++) {
		r = regen_wait(c, 0, t[i]);
		if (r < 0) {
			bench_die_regen(c, "regen_wait", r);
		}
		if (timed && (regen_client_last_timing(c, 0, &ct[i]) != 0 || !ct[i].submitted_ns ||
			      !ct[i].published_ns))
			timed = false;
	}
	if (!timed)
		return;
	for (int i = 0; i < PIPE; i++) {
		const uint64_t at[PM_COUNT] = { ct[i].taken_ns, ct[i].launched_ns, ct[i].finished_ns, ct[i].published_ns };
		for (int m = 0; m < PM_COUNT; m++)
			tl->us[i][m] += ((double)at[m] - (double)ct[0].submitted_ns) / 1e3;
	}
	tl->rounds++;
}

static void pipe_timeline_print(const struct pipe_timeline *tl, const int64_t shape[3], double local_us_per_gemm)
{
	if (tl->rounds == 0)
		return;
	printf("\n%lldx%lldx%lld over the ring, pipelined, call by call (µs from the round's first submission, "
	       "mean of %d rounds; in process takes %.1f µs per GEMM):\n\n",
	       (long long)shape[0], (long long)shape[1], (long long)shape[2], tl->rounds, local_us_per_gemm);
	printf("| call | taken | launched | finished | published | finished - previous finished | launched - previous "
	       "finished |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
	for (int i = 0; i < PIPE; i++) {
		double at[PM_COUNT];
		for (int m = 0; m < PM_COUNT; m++)
			at[m] = tl->us[i][m] / tl->rounds;
		if (i == 0) {
			printf("| %d | %.1f | %.1f | %.1f | %.1f | | |\n", i + 1, at[0], at[1], at[2], at[3]);
			continue;
		}
		double prev_finished = tl->us[i - 1][PM_FINISHED] / tl->rounds;
		printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", i + 1, at[0], at[1], at[2], at[3],
		       at[2] - prev_finished, at[1] - prev_finished);
	}
}

static void run_local_pipelined(struct lt *lt, struct gemm *g)
{
	for (int i = 0; i < PIPE; i++)
		local_launch(lt, g, lt->workspace, WORKSPACE_BYTES);
	CUDA_OK(cudaStreamSynchronize(lt->stream));
}

static const char *transport_name(enum regen_transport t)
{
	return t == REGEN_TRANSPORT_RING ? "ring" : "Varlink";
}

/* Switches c's lane to t and checks that it took. */
static void use_transport(regen_client *c, struct gemm *g, enum regen_transport t)
{
	regen_client_set_transport(c, t);
	run_regen(c, g);
	if (regen_client_transport(c, 0) != t) {
		bench_die("device 0's lane does not use %s (regend offers no ring?)", transport_name(t));
	}
}

/* Max |regend - local| <= 1e-2 * max |value|. */
static void check_agree(struct gemm *g)
{
	float *x = mat_download(&g->d_regen), *y = mat_download(&g->d_local);
	size_t n = (size_t)g->m * (size_t)g->n, i;
	double maxabs = 0, maxdiff = 0;

	for (i = 0; i < n; i++) {
		double d = fabs((double)x[i] - (double)y[i]);

		if (!isfinite(x[i]) || !isfinite(y[i])) {
			bench_die("%lldx%lldx%lld: non-finite result at %zu (regend %g, in-process %g)", (long long)g->m,
			    (long long)g->n, (long long)g->k, i, x[i], y[i]);
		}
		maxabs = fmax(maxabs, fmax(fabs(x[i]), fabs(y[i])));
		maxdiff = fmax(maxdiff, d);
	}
	free(x);
	free(y);
	if (maxabs == 0 || maxdiff > 1e-2 * maxabs) {
		bench_die("%lldx%lldx%lld: regend and in-process results differ: max |diff| %g, max |value| %g",
		    (long long)g->m, (long long)g->n, (long long)g->k, maxdiff, maxabs);
	}
	fprintf(stderr, "bench_latency: %lldx%lldx%lld results agree (max |diff| %.3g, max |value| %.3g)\n",
		(long long)g->m, (long long)g->n, (long long)g->k, maxdiff, maxabs);
}

/* ---- where a ring call's time goes (regen_client_last_timing) ---- */

enum stage { ST_DOORBELL, ST_LAUNCH, ST_DEVICE, ST_PUBLISH, ST_WAKE, ST_COUNT };
static const char *const stage_names[ST_COUNT] = {
	"submit -> worker took the record",
	"took -> work handed to the GPU (launch)",
	"handed -> found finished (GPU and completion wait)",
	"found finished -> completion published",
	"published -> client read it",
};

struct breakdown {
	double *us[ST_COUNT];
	int n;
};

static void breakdown_init(struct breakdown *b, long iters)
{
	for (int s = 0; s < ST_COUNT; s++) {
		b->us[s] = malloc(sizeof(double) * (size_t)iters);
		if (b->us[s] == NULL)
			bench_die("malloc");
	}
	b->n = 0;
}

static void breakdown_note(struct breakdown *b, regen_client *c)
{
	struct regen_call_timing t;

	if (regen_client_last_timing(c, 0, &t) != 0 || !t.submitted_ns || !t.taken_ns || !t.launched_ns ||
	    !t.finished_ns || !t.published_ns)
		return;
	const uint64_t at[ST_COUNT + 1] = { t.submitted_ns, t.taken_ns, t.launched_ns, t.finished_ns, t.published_ns,
					    t.completed_ns };
	for (int s = 0; s < ST_COUNT; s++)
		b->us[s][b->n] = ((double)at[s + 1] - (double)at[s]) / 1e3;
	b->n++;
}

static void breakdown_print(struct breakdown *b, const char *what)
{
	printf("\n%s over the ring, by stage (%d calls; the worker's clock is the client's):\n\n", what, b->n);
	printf("| stage | p50 µs | p99 µs | min µs |\n| --- | ---: | ---: | ---: |\n");
	for (int s = 0; s < ST_COUNT; s++) {
		if (b->n == 0)
			break;
		struct bench_stats st = bench_summarize(b->us[s], (size_t)b->n);
		printf("| %s | %.1f | %.1f | %.1f |\n", stage_names[s], st.p50, st.p99, st.min);
	}
	for (int s = 0; s < ST_COUNT; s++)
		free(b->us[s]);
}

int main(int argc, char **argv)
{
	const char *regend = NULL;
	long iters = 2000;
	int i, ndev = 0;
	cudaError_t ce;
	regen_client *c;
	struct lt lt;
	struct gemm small, big;
	struct bench_stats s_regen, s_local, s_local_pooled, s_finish[FW_WAYS];
	struct finish_state fs;
	double small_launch_us, small_pooled_launch_us, big_launch_us, pipe_launch_us[2];
	size_t small_ws_size;
	struct breakdown small_stages, big_stages;
	double *us, t0, t_regen, t_local, flop;

	for (i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
			char *end;
			iters = strtol(argv[++i], &end, 10);
			if (*end != '\0' || iters < 1 || iters > 100000000) {
				fprintf(stderr, "bench_latency: bad --iters %s\n", argv[i]);
				return 2;
			}
		} else if (argv[i][0] != '-' && regend == NULL) {
			regend = argv[i];
		} else {
			regend = NULL;
			break;
		}
	}
	if (regend == NULL) {
		fprintf(stderr, "usage: bench_latency REGEND_PATH [--iters N]   (default N 2000)\n");
		return 2;
	}
	if (access(regend, X_OK) != 0) {
		fprintf(stderr, "bench_latency: %s: %s\n", regend, strerror(errno));
		return 2;
	}

	ce = cudaGetDeviceCount(&ndev);
	if (ce != cudaSuccess || ndev == 0) {
		printf("SKIP: no CUDA device (%s, %d devices)\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "ok",
		       ndev);
		return SKIP;
	}
	CUDA_OK(cudaSetDevice(0));
	CUDA_OK(cudaFree(NULL));   /* context now, not inside the first timing */

	bench_init("bench_latency");
	signal(SIGPIPE, SIG_IGN);
	bench_start_regend(regend, "cuda");
	c = bench_wait_ready(60);
	regen_client_set_timeout(c, 120);
	fprintf(stderr, "bench_latency: regend pid %d ready on %s\n", (int)bench_regend_pid(), bench_socket());

	LT_OK(cublasLtCreate(&lt.handle));
	CUDA_OK(cudaStreamCreateWithFlags(&lt.stream, cudaStreamNonBlocking));
	CUDA_OK(cudaMalloc(&lt.workspace, WORKSPACE_BYTES));
	{
		/* As the worker's scratch pool (daemon/backend/cuda/device.c). */
		struct cudaMemPoolProps props = { .allocType = cudaMemAllocationTypePinned,
					   .location = { .type = cudaMemLocationTypeDevice, .id = 0 } };
		uint64_t keep = UINT64_MAX;

		CUDA_OK(cudaMemPoolCreate(&lt.pool, &props));
		CUDA_OK(cudaMemPoolSetAttribute(lt.pool, cudaMemPoolAttrReleaseThreshold, &keep));
	}

	us = malloc(sizeof(double) * (size_t)iters);
	if (us == NULL) {
		bench_die("malloc");
	}

	static const enum regen_transport transports[2] = { REGEN_TRANSPORT_RING, REGEN_TRANSPORT_VARLINK };
	struct bench_stats s_t[2];
	double big_t[2], pipe_t[2][2], pipe_local[2];
	static struct pipe_timeline pipe_tl[2];
	static const int64_t pipe_shapes[2][3] = { { 8192, 4096, 128 }, { 128, 4096, 16384 } };

	/* ---- latency: 64x64x64 ---- */
	gemm_setup(c, &lt, &small, 64, 64, 64);
	run_regen(c, &small);
	run_local(&lt, &small);
	check_agree(&small);

	breakdown_init(&small_stages, iters);
	breakdown_init(&big_stages, BIG_ITERS);
	for (int t = 0; t < 2; t++) {
		use_transport(c, &small, transports[t]);
		for (i = 0; i < WARMUP; i++) {
			run_regen(c, &small);
		}
		for (i = 0; i < iters; i++) {
			t0 = bench_now_s();
			run_regen(c, &small);
			us[i] = (bench_now_s() - t0) * 1e6;
			if (transports[t] == REGEN_TRANSPORT_RING)
				breakdown_note(&small_stages, c);
		}
		s_t[t] = bench_summarize(us, (size_t)iters);
	}
	s_regen = s_t[0];

	for (i = 0; i < WARMUP; i++) {
		run_local(&lt, &small);
	}
	for (i = 0; i < iters; i++) {
		t0 = bench_now_s();
		run_local(&lt, &small);
		us[i] = (bench_now_s() - t0) * 1e6;
	}
	s_local = bench_summarize(us, (size_t)iters);
	small_launch_us = local_launch_mean_us(&small);
	for (i = 0; i < WARMUP; i++) {
		run_local_pooled(&lt, &small);
	}
	local_launch_mean_us(&small);
	for (i = 0; i < iters; i++) {
		t0 = bench_now_s();
		run_local_pooled(&lt, &small);
		us[i] = (bench_now_s() - t0) * 1e6;
	}
	s_local_pooled = bench_summarize(us, (size_t)iters);
	small_pooled_launch_us = local_launch_mean_us(&small);
	small_ws_size = small.ws_size;
	finish_setup(&fs);
	for (int w = 0; w < FW_WAYS; w++) {
		for (i = 0; i < WARMUP; i++)
			run_local_finish(&lt, &small, &fs, (enum finish_way)w);
		for (i = 0; i < iters; i++) {
			t0 = bench_now_s();
			run_local_finish(&lt, &small, &fs, (enum finish_way)w);
			us[i] = (bench_now_s() - t0) * 1e6;
		}
		s_finish[w] = bench_summarize(us, (size_t)iters);
	}
	finish_teardown(&fs);
	local_launch_mean_us(&small);
	gemm_teardown(&small);

	/* ---- throughput: 4096^3, one call at a time ---- */
	gemm_setup(c, &lt, &big, BIG, BIG, BIG);
	run_regen(c, &big);
	run_local(&lt, &big);
	check_agree(&big);
	for (int t = 0; t < 2; t++) {
		use_transport(c, &big, transports[t]);
		for (i = 0; i < BIG_WARMUP; i++) {
			run_regen(c, &big);
		}
		t0 = bench_now_s();
		for (i = 0; i < BIG_ITERS; i++) {
			run_regen(c, &big);
			if (transports[t] == REGEN_TRANSPORT_RING)
				breakdown_note(&big_stages, c);
		}
		big_t[t] = (bench_now_s() - t0) / BIG_ITERS;
	}
	t_regen = big_t[0];
	for (i = 0; i < BIG_WARMUP; i++) {
		run_local(&lt, &big);
	}
	local_launch_mean_us(&big);   /* the launch times from here: the first call's plan and load left out */
	t_local = 0;
	for (i = 0; i < BIG_ITERS; i++) {
		t0 = bench_now_s();
		run_local(&lt, &big);
		t_local += bench_now_s() - t0;
	}
	t_local /= BIG_ITERS;
	big_launch_us = local_launch_mean_us(&big);
	gemm_teardown(&big);

	/* ---- pipelined: the skinny shapes ---- */
	for (int s = 0; s < 2; s++) {
		struct gemm pg;

		gemm_setup(c, &lt, &pg, pipe_shapes[s][0], pipe_shapes[s][1], pipe_shapes[s][2]);
		run_regen(c, &pg);
		run_local(&lt, &pg);
		check_agree(&pg);
		double regen_s[2] = { 0, 0 }, local_s = 0;

		for (int t = 0; t < 2; t++) {
			use_transport(c, &pg, transports[t]);
			run_regen_pipelined(c, &pg, NULL);
		}
		run_local_pipelined(&lt, &pg);
		local_launch_mean_us(&pg);
		for (i = 0; i < PIPE_ROUNDS; i++) {
			for (int t = 0; t < 2; t++) {
				/* The switch and its check are one blocking call,
				 * outside the round's time. */
				use_transport(c, &pg, transports[t]);
				t0 = bench_now_s();
				run_regen_pipelined(c, &pg, transports[t] == REGEN_TRANSPORT_RING ? &pipe_tl[s] : NULL);
				regen_s[t] += bench_now_s() - t0;
			}
			/* Its own untimed call first, as the regend rounds have
			 * theirs: the GPU's switch back to this process's
			 * context (after regend's rounds) is outside every
			 * path's time alike. Without it the in-process round
			 * alone paid the switch: ~6 µs per GEMM on the H200,
			 * and ring/in process read 1.15-1.21. */
			run_local(&lt, &pg);
			t0 = bench_now_s();
			run_local_pipelined(&lt, &pg);
			local_s += bench_now_s() - t0;
		}
		for (int t = 0; t < 2; t++)
			pipe_t[s][t] = regen_s[t] / (PIPE_ROUNDS * PIPE);
		pipe_local[s] = local_s / (PIPE_ROUNDS * PIPE);
		pipe_launch_us[s] = local_launch_mean_us(&pg);
		gemm_teardown(&pg);
	}

	flop = 2.0 * BIG * BIG * BIG;
	printf("64x64x64 bf16 GEMM, %ld iterations after %d warm-up, submit -> completion:\n\n", iters, WARMUP);
	printf("| path | p50 µs | p99 µs | min µs | added p50 µs | added p99 µs |\n");
	printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
	for (int t = 0; t < 2; t++) {
		printf("| regend, %s (regen_gemm, CUDA IPC buffers) | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
		       transport_name(transports[t]), s_t[t].p50, s_t[t].p99, s_t[t].min, s_t[t].p50 - s_local.p50,
		       s_t[t].p99 - s_local.p99);
	}
	printf("| in-process (cublasLtMatmul + cudaStreamSynchronize) | %.1f | %.1f | %.1f | | |\n", s_local.p50,
	       s_local.p99, s_local.min);
	printf("| in-process, workspace from a pool per call (as the worker) | %.1f | %.1f | %.1f | | |\n",
	       s_local_pooled.p50, s_local_pooled.p99, s_local_pooled.min);
	printf("\nin process, host time inside cublasLtMatmul, mean: %.2f µs (fixed workspace), %.2f µs "
	       "(%zu bytes from a pool per call); compare the worker's `kernel` launch phase "
	       "(REGEN_CUDA_LAUNCH_PROFILE=1)\n", small_launch_us, small_pooled_launch_us, small_ws_size);
	printf("\nadded by regend (ring): p50 %.1f µs, p99 %.1f µs (targets: 8 and 20)\n", s_regen.p50 - s_local.p50,
	       s_regen.p99 - s_local.p99);
	breakdown_print(&small_stages, "64x64x64");
	printf("\n64x64x64 in process, launch -> end learned, by how the end is learned:\n\n");
	printf("| way | p50 µs | p99 µs | min µs |\n| --- | ---: | ---: | ---: |\n");
	printf("| cudaStreamSynchronize | %.1f | %.1f | %.1f |\n", s_local.p50, s_local.p99, s_local.min);
	for (int w = 0; w < FW_WAYS; w++)
		printf("| %s | %.1f | %.1f | %.1f |\n", finish_way_names[w], s_finish[w].p50, s_finish[w].p99,
		       s_finish[w].min);
	printf("\n4096^3 bf16, one call at a time (%d iterations after %d warm-up):\n\n", BIG_ITERS, BIG_WARMUP);
	printf("| path | TFLOP/s | / in process |\n| --- | ---: | ---: |\n");
	for (int t = 0; t < 2; t++) {
		printf("| regend, %s | %.1f | %.3f |\n", transport_name(transports[t]), flop / big_t[t] * 1e-12,
		       t_local / big_t[t]);
	}
	printf("| in process (launch + sync each) | %.1f | 1 |\n", flop / t_local * 1e-12);
	printf("\nin process, host time inside cublasLtMatmul, mean: %.2f µs\n", big_launch_us);
	breakdown_print(&big_stages, "4096^3");
	printf("\npipelined, %d calls queued then one wait (%d rounds, the paths taking turns), against %d launches and "
	       "one synchronize:\n\n",
	       PIPE, PIPE_ROUNDS, PIPE);
	printf("| shape | path | µs per GEMM | TFLOP/s | / in process |\n| --- | --- | ---: | ---: | ---: |\n");
	for (int s = 0; s < 2; s++) {
		double f = 2.0 * (double)pipe_shapes[s][0] * (double)pipe_shapes[s][1] * (double)pipe_shapes[s][2];
		for (int t = 0; t < 2; t++) {
			printf("| %lldx%lldx%lld | regend, %s | %.1f | %.1f | %.3f |\n", (long long)pipe_shapes[s][0],
			       (long long)pipe_shapes[s][1], (long long)pipe_shapes[s][2], transport_name(transports[t]),
			       pipe_t[s][t] * 1e6, f / pipe_t[s][t] * 1e-12, pipe_local[s] / pipe_t[s][t]);
		}
		printf("| %lldx%lldx%lld | in process | %.1f | %.1f | 1 |\n", (long long)pipe_shapes[s][0],
		       (long long)pipe_shapes[s][1], (long long)pipe_shapes[s][2], pipe_local[s] * 1e6,
		       f / pipe_local[s] * 1e-12);
	}
	printf("\nin process, host time inside cublasLtMatmul, mean: %.2f µs (%lldx%lldx%lld), %.2f µs (%lldx%lldx%lld)\n",
	       pipe_launch_us[0], (long long)pipe_shapes[0][0], (long long)pipe_shapes[0][1], (long long)pipe_shapes[0][2],
	       pipe_launch_us[1], (long long)pipe_shapes[1][0], (long long)pipe_shapes[1][1], (long long)pipe_shapes[1][2]);
	for (int s = 0; s < 2; s++)
		pipe_timeline_print(&pipe_tl[s], pipe_shapes[s], pipe_local[s] * 1e6);
	(void)t_regen;
	fflush(stdout);

	free(us);
	regen_client_destroy(c);
	if (getenv("REGEN_CUDA_LAUNCH_PROFILE") != NULL)
		print_launch_profile();
	CUDA_OK(cudaFree(lt.workspace));
	CUDA_OK(cudaMemPoolDestroy(lt.pool));
	CUDA_OK(cudaStreamDestroy(lt.stream));
	cublasLtDestroy(lt.handle);
	return 0; /* atexit: regend stopped, its directory removed */
}
