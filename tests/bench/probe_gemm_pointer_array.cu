// SPDX-License-Identifier: Apache-2.0
// Whether cuBLASLt's pointer-array batch mode (batch count one) would let a
// program's captured graph read its GEMMs' operands from the Run's argument
// block, as the planner's own kernels do (issue 32: a Run whose GEMM operands
// moved is launched kernel by kernel instead of replayed). For the bf16 GEMMs
// of the bench's models at d1024 (8192 tokens), in the three layouts a
// Linear's forward and backward take: how many algorithms the heuristic
// offers each mode, each mode's best one timed, and, captured once in a CUDA
// graph, whether replays with the pointer arrays rewritten write where the
// arrays say and what an eager call on those operands writes, bit for bit.
// Not built by meson: on the GPU,
//   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o /tmp/probe-pa \
//     tests/bench/probe_gemm_pointer_array.cu -lcublasLt && /tmp/probe-pa
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(call)                                                                                          \
	do {                                                                                              \
		cudaError_t e_ = (call);                                                                  \
		if (e_ != cudaSuccess) {                                                                  \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			exit(1);                                                                          \
		}                                                                                         \
	} while (0)
#define CB(call)                                                                                       \
	do {                                                                                           \
		cublasStatus_t s_ = (call);                                                            \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
			fprintf(stderr, "%s:%d: %s: cublasStatus %d\n", __FILE__, __LINE__, #call, (int)s_); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

static const size_t WORKSPACE = (size_t)64 << 20;

struct shape {
	const char *what;
	int m, n, k;
	cublasOperation_t ta, tb;
};

// Column-major, as a row-major Linear's y = x W^T is handed to cuBLASLt:
// forward TN (m = out features, n = tokens), input gradient NN, weight
// gradient NT.
static const shape SHAPES[] = {
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
	CB(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, rows, cols, rows));
	if (pointer_array) {
		uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
		CB(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
	}
	return l;
}

static gemm plan(cublasLtHandle_t h, const shape &s, bool pointer_array)
{
	gemm g = {};
	CB(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CB(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta, sizeof(s.ta)));
	CB(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb, sizeof(s.tb)));
	bool ta = s.ta == CUBLAS_OP_T, tb = s.tb == CUBLAS_OP_T;
	g.la = layout(ta ? s.k : s.m, ta ? s.m : s.k, pointer_array);
	g.lb = layout(tb ? s.n : s.k, tb ? s.k : s.n, pointer_array);
	g.lc = layout(s.m, s.n, pointer_array);
	cublasLtMatmulPreference_t pref;
	CB(cublasLtMatmulPreferenceCreate(&pref));
	uint64_t ws = WORKSPACE;
	CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
	cublasLtMatmulHeuristicResult_t res[16];
	cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, g.desc, g.la, g.lb, g.lc, g.lc, pref, 16, res, &g.offered);
	if (st != CUBLAS_STATUS_SUCCESS)
		g.offered = 0;
	if (g.offered)
		g.algo = res[0].algo;
	CB(cublasLtMatmulPreferenceDestroy(pref));
	return g;
}

static void call(cublasLtHandle_t h, const gemm &g, const void *a, const void *b, void *d, void *ws, cudaStream_t st)
{
	const float one = 1.f, zero = 0.f;
	CB(cublasLtMatmul(h, g.desc, &one, a, g.la, b, g.lb, &zero, d, g.lc, d, g.lc, &g.algo, ws, WORKSPACE, st));
}

static void fill(__nv_bfloat16 *dev, size_t n, unsigned seed)
{
	std::vector<__nv_bfloat16> host(n);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		host[i] = __float2bfloat16(((seed >> 8) & 0xffff) / 65536.f - 0.5f);
	}
	CK(cudaMemcpy(dev, host.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
}

static bool same(const void *x, const void *y, size_t bytes)
{
	std::vector<char> a(bytes), b(bytes);
	CK(cudaMemcpy(a.data(), x, bytes, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(b.data(), y, bytes, cudaMemcpyDeviceToHost));
	return memcmp(a.data(), b.data(), bytes) == 0;
}

int main()
{
	int dev = 0;
	if (cudaGetDeviceCount(&dev) != cudaSuccess || dev == 0) {
		printf("SKIP: no GPU\n");
		return 77;
	}
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("%s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
	cublasLtHandle_t h;
	CB(cublasLtCreate(&h));
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	void *ws;
	CK(cudaMalloc(&ws, WORKSPACE));
	// Each array one pointer (batch count one): A, B, D of set 0, then of set 1.
	void **arrays;
	CK(cudaMalloc((void **)&arrays, 3 * sizeof(void *)));
	cudaEvent_t t0, t1;
	CK(cudaEventCreate(&t0));
	CK(cudaEventCreate(&t1));
	int failures = 0;

	printf("| GEMM | m n k | strided algos | pointer-array algos | strided TFLOP/s | pointer-array TFLOP/s | ratio | graph replay, arrays rewritten |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	for (const shape &s : SHAPES) {
		gemm strided = plan(h, s, false), pa = plan(h, s, true);
		size_t na = (size_t)s.m * s.k, nb = (size_t)s.k * s.n, nd = (size_t)s.m * s.n;
		__nv_bfloat16 *a[2], *b[2], *d[2], *ref;
		for (int i = 0; i < 2; i++) {
			CK(cudaMalloc((void **)&a[i], na * 2));
			CK(cudaMalloc((void **)&b[i], nb * 2));
			CK(cudaMalloc((void **)&d[i], nd * 2));
			fill(a[i], na, 11u + i);
			fill(b[i], nb, 23u + i);
			CK(cudaMemset(d[i], 0, nd * 2));
		}
		CK(cudaMalloc((void **)&ref, nd * 2));
		double flop = 2.0 * s.m * s.n * s.k;
		float ms[2] = { 0, 0 };
		for (int mode = 0; mode < 2; mode++) {
			const gemm &g = mode ? pa : strided;
			if (!g.offered)
				continue;
			void *set0[3] = { a[0], b[0], d[0] };
			if (mode)
				CK(cudaMemcpy(arrays, set0, sizeof(set0), cudaMemcpyHostToDevice));
			const void *A = mode ? (const void *)&arrays[0] : a[0];
			const void *B = mode ? (const void *)&arrays[1] : b[0];
			void *D = mode ? (void *)&arrays[2] : d[0];
			for (int i = 0; i < 5; i++)
				call(h, g, A, B, D, ws, st);
			const int iters = 20;
			CK(cudaEventRecord(t0, st));
			for (int i = 0; i < iters; i++)
				call(h, g, A, B, D, ws, st);
			CK(cudaEventRecord(t1, st));
			CK(cudaEventSynchronize(t1));
			CK(cudaEventElapsedTime(&ms[mode], t0, t1));
			ms[mode] /= iters;
		}
		// Captured with set 0's arrays, replayed with set 1's: it must
		// write d[1] (not d[0]) what an eager call on set 1 writes.
		const char *replay = "-";
		if (pa.offered) {
			void *set0[3] = { a[0], b[0], d[0] }, *set1[3] = { a[1], b[1], d[1] };
			CK(cudaMemcpy(arrays, set1, sizeof(set1), cudaMemcpyHostToDevice));
			call(h, pa, &arrays[0], &arrays[1], (void *)&arrays[2], ws, st);
			CK(cudaMemcpyAsync(ref, d[1], nd * 2, cudaMemcpyDeviceToDevice, st));
			CK(cudaMemsetAsync(d[1], 0, nd * 2, st));
			CK(cudaMemcpyAsync(arrays, set0, sizeof(set0), cudaMemcpyHostToDevice, st));
			CK(cudaStreamSynchronize(st));
			cudaGraph_t graph;
			cudaGraphExec_t exec;
			CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
			call(h, pa, &arrays[0], &arrays[1], (void *)&arrays[2], ws, st);
			CK(cudaStreamEndCapture(st, &graph));
			CK(cudaGraphInstantiate(&exec, graph, 0));
			CK(cudaMemset(d[0], 0, nd * 2));
			CK(cudaMemcpy(arrays, set1, sizeof(set1), cudaMemcpyHostToDevice));
			CK(cudaGraphLaunch(exec, st));
			CK(cudaStreamSynchronize(st));
			std::vector<char> zero(nd * 2, 0), got0(nd * 2);
			CK(cudaMemcpy(got0.data(), d[0], nd * 2, cudaMemcpyDeviceToHost));
			bool untouched = memcmp(zero.data(), got0.data(), nd * 2) == 0;
			bool right = same(d[1], ref, nd * 2);
			replay = untouched && right ? "follows the arrays, bit for bit"
			       : !untouched        ? "FAILED: wrote the captured D"
						   : "FAILED: not the eager call's result";
			failures += !(untouched && right);
			CK(cudaGraphExecDestroy(exec));
			CK(cudaGraphDestroy(graph));
		}
		double tf[2] = { ms[0] ? flop / ms[0] / 1e9 : 0, ms[1] ? flop / ms[1] / 1e9 : 0 };
		printf("| %s | %d %d %d | %d | %d | %.0f | %.0f | %.3f | %s |\n", s.what, s.m, s.n, s.k, strided.offered,
		       pa.offered, tf[0], tf[1], tf[0] && tf[1] ? tf[1] / tf[0] : 0.0, replay);
		for (int i = 0; i < 2; i++) {
			CK(cudaFree(a[i]));
			CK(cudaFree(b[i]));
			CK(cudaFree(d[i]));
		}
		CK(cudaFree(ref));
		for (gemm *g : { &strided, &pa }) {
			cublasLtMatrixLayoutDestroy(g->la);
			cublasLtMatrixLayoutDestroy(g->lb);
			cublasLtMatrixLayoutDestroy(g->lc);
			cublasLtMatmulDescDestroy(g->desc);
		}
	}
	CK(cudaFree(arrays));
	CK(cudaFree(ws));
	cublasLtDestroy(h);
	if (failures)
		printf("FAIL: %d replays did not follow the arrays\n", failures);
	else
		printf("done\n");
	return failures ? 1 : 0;
}
