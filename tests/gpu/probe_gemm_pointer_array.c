/* SPDX-License-Identifier: Apache-2.0 */
/* Whether cuBLASLt's pointer-array batch mode (batch count one) would let a
 * program's captured graph read its GEMMs' operands from the Run's argument
 * block, as the planner's own kernels do (issue 32: a Run whose GEMM
 * operands moved is launched kernel by kernel instead of replayed). For the
 * bf16 GEMMs of the bench's models at d1024 (8192 tokens), in the three
 * layouts a Linear's forward and backward take: how many algorithms the
 * heuristic offers each mode, each mode's best one timed, and, captured
 * once in a CUDA graph, whether replays with the pointer arrays rewritten
 * write where the arrays say and what an eager call on those operands
 * writes, bit for bit. A probe, not a test (exit 1 only where a replay
 * wrote wrong); on the GPU,
 *   .device/build-gpu/tests/gpu/probe_gemm_pointer_array   (scripts/gpu-check probe-pa) */
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include "tests/gpu/gpu_common.h"

#define WORKSPACE ((size_t)64 << 20)

struct shape {
	const char *what;
	int m, n, k;
	cublasOperation_t ta, tb;
};

/* Column-major, as a row-major Linear's y = x W^T is handed to cuBLASLt:
 * forward TN (m = out features, n = tokens), input gradient NN, weight
 * gradient NT. */
static const struct shape SHAPES[] = {
	{ "qkv forward", 3072, 8192, 1024, CUBLAS_OP_T, CUBLAS_OP_N },
	{ "proj forward", 1024, 8192, 1024, CUBLAS_OP_T, CUBLAS_OP_N },
	{ "swiglu up forward", 5632, 8192, 1024, CUBLAS_OP_T, CUBLAS_OP_N },
	{ "swiglu down forward", 1024, 8192, 2816, CUBLAS_OP_T, CUBLAS_OP_N },
	{ "lm head forward", 50304, 8192, 1024, CUBLAS_OP_T, CUBLAS_OP_N },
	{ "qkv input grad", 1024, 8192, 3072, CUBLAS_OP_N, CUBLAS_OP_N },
	{ "lm head input grad", 1024, 8192, 50304, CUBLAS_OP_N, CUBLAS_OP_N },
	{ "qkv weight grad", 1024, 3072, 8192, CUBLAS_OP_N, CUBLAS_OP_T },
	{ "lm head weight grad", 1024, 50304, 8192, CUBLAS_OP_N, CUBLAS_OP_T },
};

struct gemm {
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
	int offered;
};

static cublasLtMatrixLayout_t layout(int rows, int cols, bool pointer_array)
{
	cublasLtMatrixLayout_t l;
	LT_OK(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, rows, cols, rows));
	if (pointer_array) {
		uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
		LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
	}
	return l;
}

static struct gemm plan(cublasLtHandle_t h, const struct shape *s, bool pointer_array)
{
	struct gemm g;

	memset(&g, 0, sizeof(g));
	LT_OK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT_OK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &s->ta, sizeof(s->ta)));
	LT_OK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &s->tb, sizeof(s->tb)));
	bool ta = s->ta == CUBLAS_OP_T, tb = s->tb == CUBLAS_OP_T;
	g.la = layout(ta ? s->k : s->m, ta ? s->m : s->k, pointer_array);
	g.lb = layout(tb ? s->n : s->k, tb ? s->k : s->n, pointer_array);
	g.lc = layout(s->m, s->n, pointer_array);
	cublasLtMatmulPreference_t pref;
	LT_OK(cublasLtMatmulPreferenceCreate(&pref));
	uint64_t ws = WORKSPACE;
	LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
	cublasLtMatmulHeuristicResult_t res[16];
	cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, g.desc, g.la, g.lb, g.lc, g.lc, pref, 16, res, &g.offered);
	if (st != CUBLAS_STATUS_SUCCESS)
		g.offered = 0;
	if (g.offered)
		g.algo = res[0].algo;
	LT_OK(cublasLtMatmulPreferenceDestroy(pref));
	return g;
}

static void call(cublasLtHandle_t h, const struct gemm *g, const void *a, const void *b, void *d, void *ws, cudaStream_t st)
{
	const float one = 1.f, zero = 0.f;
	LT_OK(cublasLtMatmul(h, g->desc, &one, a, g->la, b, g->lb, &zero, d, g->lc, d, g->lc, &g->algo, ws, WORKSPACE, st));
}

/* The GPU's milliseconds a call of g, over 20 after 5. */
static float time_calls(cublasLtHandle_t h, const struct gemm *g, const void *a, const void *b, void *d, void *ws,
			cudaStream_t st)
{
	cudaEvent_t t0, t1;
	float ms = 0;

	CUDA_OK(cudaEventCreate(&t0));
	CUDA_OK(cudaEventCreate(&t1));
	for (int i = 0; i < 5; i++)
		call(h, g, a, b, d, ws, st);
	CUDA_OK(cudaEventRecord(t0, st));
	for (int i = 0; i < 20; i++)
		call(h, g, a, b, d, ws, st);
	CUDA_OK(cudaEventRecord(t1, st));
	CUDA_OK(cudaEventSynchronize(t1));
	CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
	cudaEventDestroy(t0);
	cudaEventDestroy(t1);
	return ms / 20;
}

/* Captured with set 0's arrays, replayed with set 1's: whether it wrote
 * d[1] (and not d[0]) what an eager call on set 1 writes. arrays: A, B, D
 * (one pointer each). */
static const char *replay(cublasLtHandle_t h, const struct gemm *pa, void **arrays, void *const a[2],
			  void *const b[2], void *const d[2], size_t nd, void *ws, cudaStream_t st)
{
	void *set0[3] = { a[0], b[0], d[0] }, *set1[3] = { a[1], b[1], d[1] };
	size_t bytes = nd * 2;
	void *ref, *zero;
	cudaGraph_t graph;
	cudaGraphExec_t exec;

	CUDA_OK(cudaMalloc(&ref, bytes));
	CUDA_OK(cudaMalloc(&zero, bytes));
	CUDA_OK(cudaMemset(zero, 0, bytes));
	CUDA_OK(cudaMemcpy(arrays, set1, sizeof(set1), cudaMemcpyHostToDevice));
	call(h, pa, &arrays[0], &arrays[1], &arrays[2], ws, st);
	CUDA_OK(cudaStreamSynchronize(st));
	CUDA_OK(cudaMemcpy(ref, d[1], bytes, cudaMemcpyDeviceToDevice));
	CUDA_OK(cudaMemcpy(arrays, set0, sizeof(set0), cudaMemcpyHostToDevice));
	CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
	call(h, pa, &arrays[0], &arrays[1], &arrays[2], ws, st);
	CUDA_OK(cudaStreamEndCapture(st, &graph));
	CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
	CUDA_OK(cudaMemset(d[0], 0, bytes));
	CUDA_OK(cudaMemset(d[1], 0, bytes));
	CUDA_OK(cudaMemcpy(arrays, set1, sizeof(set1), cudaMemcpyHostToDevice));
	CUDA_OK(cudaGraphLaunch(exec, st));
	CUDA_OK(cudaStreamSynchronize(st));
	bool untouched = gt_mismatched_words(d[0], zero, bytes) == 0, right = gt_mismatched_words(d[1], ref, bytes) == 0;
	CUDA_OK(cudaGraphExecDestroy(exec));
	CUDA_OK(cudaGraphDestroy(graph));
	CUDA_OK(cudaFree(ref));
	CUDA_OK(cudaFree(zero));
	return untouched && right ? NULL : !untouched ? "WRONG: wrote the captured D" : "WRONG: not the eager call's result";
}

static void gemm_destroy(struct gemm *g)
{
	cublasLtMatrixLayoutDestroy(g->la);
	cublasLtMatrixLayoutDestroy(g->lb);
	cublasLtMatrixLayoutDestroy(g->lc);
	cublasLtMatmulDescDestroy(g->desc);
}

int main(void)
{
	int r = gt_have_gpu();
	if (r != 0)
		return r;
	struct cudaDeviceProp prop;
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));
	printf("%s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
	cublasLtHandle_t h;
	LT_OK(cublasLtCreate(&h));
	cudaStream_t st;
	CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	void *ws;
	CUDA_OK(cudaMalloc(&ws, WORKSPACE));
	/* Each array one pointer (batch count one): A, B, D. */
	void **arrays;
	CUDA_OK(cudaMalloc((void **)&arrays, 3 * sizeof(void *)));
	int failures = 0;

	printf("| GEMM | m n k | strided algos | pointer-array algos | strided TFLOP/s | pointer-array TFLOP/s | ratio | "
	       "graph replay, arrays rewritten |\n|---|---|---|---|---|---|---|---|\n");
	for (size_t i = 0; i < sizeof(SHAPES) / sizeof(SHAPES[0]); i++) {
		const struct shape *s = &SHAPES[i];
		struct gemm strided = plan(h, s, false), pa = plan(h, s, true);
		size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nd = (size_t)s->m * s->n;
		void *a[2], *b[2], *d[2];
		for (int j = 0; j < 2; j++) {
			CUDA_OK(cudaMalloc(&a[j], na * 2));
			CUDA_OK(cudaMalloc(&b[j], nb * 2));
			CUDA_OK(cudaMalloc(&d[j], nd * 2));
			CUDA_OK(rk_fill_uniform(a[j], na, RK_BF16, 11u + j, 0, 0));
			CUDA_OK(rk_fill_uniform(b[j], nb, RK_BF16, 23u + j, 0, 0));
		}
		CUDA_OK(cudaStreamSynchronize(0));   /* the fills, before st's calls read them */
		double flop = 2.0 * s->m * s->n * s->k, tf_strided = 0, tf_pa = 0;
		if (strided.offered)
			tf_strided = flop / time_calls(h, &strided, a[0], b[0], d[0], ws, st) / 1e9;
		const char *verdict = "-";
		if (pa.offered) {
			void *set0[3] = { a[0], b[0], d[0] };
			CUDA_OK(cudaMemcpy(arrays, set0, sizeof(set0), cudaMemcpyHostToDevice));
			tf_pa = flop / time_calls(h, &pa, &arrays[0], &arrays[1], &arrays[2], ws, st) / 1e9;
			const char *wrong = replay(h, &pa, arrays, a, b, d, nd, ws, st);
			verdict = wrong ? wrong : "follows the arrays, bit for bit";
			failures += wrong != NULL;
		}
		printf("| %s | %d %d %d | %d | %d | %.0f | %.0f | %.3f | %s |\n", s->what, s->m, s->n, s->k, strided.offered,
		       pa.offered, tf_strided, tf_pa, tf_strided > 0 && tf_pa > 0 ? tf_pa / tf_strided : 0.0, verdict);
		for (int j = 0; j < 2; j++) {
			CUDA_OK(cudaFree(a[j]));
			CUDA_OK(cudaFree(b[j]));
			CUDA_OK(cudaFree(d[j]));
		}
		gemm_destroy(&strided);
		gemm_destroy(&pa);
	}
	CUDA_OK(cudaFree(arrays));
	CUDA_OK(cudaFree(ws));
	cublasLtDestroy(h);
	if (failures)
		printf("FAIL: %d replays did not follow the arrays\n", failures);
	return failures ? 1 : 0;
}
