/* SPDX-License-Identifier: Apache-2.0 */
/* GEMM through cuBLASLt.
 *
 * regen's operands are row-major. A row-major [r, c] matrix with leading
 * dimension ld is, read column-major, its transpose [c, r] with the same ld.
 * So D = op(A) op(B) (row-major [M, N]) is computed as the column-major
 * D^T = op(B)^T op(A)^T ([N, M]): cuBLASLt's "A" is our B and its "B" is our
 * A, with the transpose flags swapped over. Bias ([N], per column of D) is
 * then per row of D^T, which is exactly cuBLASLt's bias vector. The dgelu
 * epilogue's aux (GELU's pre-activation, [M, N] like D) is read as D is:
 * column-major [N, M] with its row stride as leading dimension, which
 * cuBLASLt needs a multiple of 8 elements (refused before launch); the
 * gelu_aux epilogues' aux_out is the same matrix, written (GELU_AUX).
 *
 * A plan (matmul descriptor, four layouts, the chosen algorithm and its
 * workspace size) is made once per (shape, dtypes, transposes, leading
 * dimensions, epilogue, compute mode, pointer alignments, policy), kept in
 * the registry and rebuilt lazily after a release or reset. At most
 * gemm_plans_max plans stay cached per device (default GEMM_PLANS_MAX;
 * rd_cuda_set_gemm_plan_limit), in a hashed cache (../plan_cache.c): a
 * client sending ever new shapes costs a bounded amount of memory, and the
 * lookup does not slow with the count. Past the limit the least recently
 * used plans nobody holds are destroyed. A call holds its plan from the
 * lookup until cublasLtMatmul has returned, no longer: a plan is host
 * objects only (descriptors, layouts, an algorithm struct) that cuBLASLt
 * reads while it enqueues, and the kernel it launched does not refer to
 * them. (This file already relies on that: it rewrites a plan's bias and
 * aux pointers for each call while earlier calls with that plan may still
 * run.) So destroying an evicted plan never waits for the GPU, and a call
 * in flight (enqueued, not finished) holds nothing. When every cached plan
 * is held (as many lanes inside an enqueue as the limit), a new shape is
 * still planned and cached over the limit, by at most one plan per lane
 * enqueueing at that moment, and the first call to let go trims back:
 * a legal call is never refused because of the cache, and the excess is
 * bounded by the threads that enqueue.
 *
 * FP8 (proto/compute_gemm.c): A and B in e4m3 or e5m2 with per-tensor
 * scales, which cuBLASLt reads from device memory (its A scale is our
 * b_scale, its B scale our a_scale: the operands swap over as above).
 * cuBLASLt's FP8 kernels on Hopper take only its "TN" layout, A transposed
 * and B not; ours, row-major D = A B^T with A [M, K] and B [N, K], is exactly
 * that once swapped (its A = our B read column-major [K, N], transposed),
 * which is why the protocol takes FP8 only with trans_a false and trans_b
 * true and TransposeQuantize gives the other layout: nothing is transposed
 * here. Fast accumulation is on only where the call's compute is
 * fp8_fast_accum; otherwise FP8 sums are promoted to f32 as cuBLASLt goes.
 * An FP8 D takes d_scale and, when given,
 * amax_d (AMAX_D_POINTER: the GEMM computes it); its C layout is bf16
 * (cuBLASLt's table has no FP8 C) and never read, the protocol giving no C
 * and so beta 0 (gemm_resolve points it at A). Scale and amax pointers are
 * set per call, beside the bias pointer, with 256-byte aligned stand-ins at
 * planning. cuBLASLt (since 12.9.1; CUDA 13's) takes them only 16-byte
 * aligned: cublasLtMatmul answers NOT_SUPPORTED for a scale at 4 bytes past
 * such an address, which its heuristic, given the stand-ins, cannot see.
 * The protocol takes a scale at any f32 address (Transformer Engine's
 * scale_inv[i], a program's view of one element of a ScaleUpdate's
 * scale_inv), so such a scalar goes through a 16-byte slot of the call's
 * scratch, after its workspace: copied in before the matmul (a scale) or
 * out after it (amax_d), on the lane's stream (stage_scalars).
 *
 * Pointer-array plans (program_gemm_slots, a program's library steps):
 * A, B, C and D each a device array of one pointer, which a captured
 * graph reads when it replays, so a program's graph holds for whatever
 * addresses its Run wrote there (cuda_gemm_slots). Their key takes
 * 16-byte alignment for all four whatever the addresses it was planned
 * on; a call whose operands are less aligned goes by address.
 *
 * Scratch: each call's workspace is taken on its lane's stream from the
 * device's pool (scratch.c: the lane's own block, reused by its calls one
 * after the other in stream order while it is busy), so concurrent GEMMs
 * never share partial sums (seed 001). Only -Ddebug_shared_workspace=true
 * makes every call on every lane use one buffer, to prove the regression
 * test catches the bug. */
#include "regen-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/common.h"
#include "proto/errors.h"

/* Plans kept per device unless gemm_plans_max (regend.conf) or
 * rd_cuda_set_gemm_plan_limit says otherwise. A plan is host memory only
 * (its struct and cuBLASLt's descriptors); 256 covers a training job's
 * shapes (each layer's forward and two backward GEMMs, a few dtypes) many
 * times over. */
#define GEMM_PLANS_MAX 256

struct gemm_key {
	int64_t m, n, k;
	int64_t lda, ldb, ldc, ldd, ldaux;
	int32_t dtype_ab, dtype_b, dtype_cd;   /* dtype_ab: A's (and B's, but for FP8) */
	int32_t fp8_amax;
	int32_t trans_a, trans_b;
	int32_t epilogue, compute;
	int32_t align_a, align_b, align_c, align_d, align_bias, align_aux;
	int32_t policy;
	int32_t pointer_array;   /* A, B, C and D read from arrays of one pointer each (cuda_gemm_enqueue_slots) */
};

struct cuda_gemm_plan {
	struct rd_resource res;
	struct cuda_dev *cd;
	struct gemm_key key;
	/* Held while the bias and aux pointers are set and the matmul
	 * enqueued: lanes share the descriptor. Execution itself is not
	 * serialised. */
	pthread_mutex_t lock;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc, ld;
	cublasLtMatmulAlgo_t algo;
	size_t ws_size;
	struct rd_cuda_plan_info info;
	/* In cd->plans, under cd->plans_lock; holds its key. */
	struct rd_plan_entry entry;
};

static cudaDataType_t cuda_type(int32_t dt)
{
	switch (dt) {
	case RP_DTYPE_F16: return CUDA_R_16F;
	case RP_DTYPE_BF16: return CUDA_R_16BF;
	case RP_DTYPE_E4M3: return CUDA_R_8F_E4M3;
	case RP_DTYPE_E5M2: return CUDA_R_8F_E5M2;
	default: return CUDA_R_32F;
	}
}

static int32_t alignment_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	int32_t al = 256;
	while (al > 1 && (a & (uintptr_t)(al - 1)))
		al /= 2;
	return al;
}

static void plan_destroy_descs(struct cuda_gemm_plan *p)
{
	/* Host-only objects: safe to destroy even when the context is lost. */
	if (p->ld)
		cublasLtMatrixLayoutDestroy(p->ld);
	if (p->lc)
		cublasLtMatrixLayoutDestroy(p->lc);
	if (p->lb)
		cublasLtMatrixLayoutDestroy(p->lb);
	if (p->la)
		cublasLtMatrixLayoutDestroy(p->la);
	if (p->desc)
		cublasLtMatmulDescDestroy(p->desc);
	p->la = p->lb = p->lc = p->ld = NULL;
	p->desc = NULL;
}

#define LT(call)                                                                                     \
	do {                                                                                         \
		cublasStatus_t s_ = (call);                                                          \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
			r = cuda_status_set(cublas_error_name(s_), "%s: %s", #call,                  \
					    cublasLtGetStatusString(s_));                            \
			goto fail;                                                                   \
		}                                                                                    \
	} while (0)

static int plan_init(struct rd_resource *res)
{
	struct cuda_gemm_plan *p = (struct cuda_gemm_plan *)res;
	struct cuda_dev *cd = p->cd;
	const struct gemm_key *k = &p->key;
	cublasLtMatmulPreference_t pref = NULL;
	int r = 0;

	if (rd_resource_ensure_valid(&cd->handle.res))
		return -EIO;   /* the handle's init left its status */

	cudaDataType_t ta_type = cuda_type(k->dtype_ab), tb_type = cuda_type(k->dtype_b), tcd = cuda_type(k->dtype_cd);
	const bool fp8 = rp_dtype_is_fp8((enum rp_dtype)k->dtype_ab);
	const bool fp8_d = rp_dtype_is_fp8((enum rp_dtype)k->dtype_cd);
	/* cuBLASLt has no FP8 C: an FP8 D's C (never read) is bf16. */
	cudaDataType_t tc = fp8_d ? CUDA_R_16BF : tcd;
	cublasComputeType_t ct = k->compute == RP_COMPUTE_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
	LT(cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F));
	cublasOperation_t ta = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   /* cuBLASLt's A is our B */
	cublasOperation_t tb = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
	LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
	LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
	cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
	switch (k->epilogue) {
	case RP_EPILOGUE_BIAS: epi = CUBLASLT_EPILOGUE_BIAS; break;
	case RP_EPILOGUE_GELU: epi = CUBLASLT_EPILOGUE_GELU; break;
	case RP_EPILOGUE_GELU_BIAS: epi = CUBLASLT_EPILOGUE_GELU_BIAS; break;
	case RP_EPILOGUE_DGELU: epi = CUBLASLT_EPILOGUE_DGELU; break;
	case RP_EPILOGUE_GELU_AUX: epi = CUBLASLT_EPILOGUE_GELU_AUX; break;
	case RP_EPILOGUE_GELU_AUX_BIAS: epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
	default: break;
	}
	LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
	if (fp8) {
		/* Stand-ins: the real pointers are set per call (gemm_launch). */
		const void *stand_in = (const void *)(uintptr_t)256;
		int8_t fast_accum = k->compute == RP_COMPUTE_FP8_FAST_ACCUM;
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof(stand_in)));
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof(stand_in)));
		if (fp8_d)
			LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &stand_in,
							  sizeof(stand_in)));
		if (k->fp8_amax)
			LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &stand_in,
							  sizeof(stand_in)));
	}
	if (k->epilogue == RP_EPILOGUE_BIAS || k->epilogue == RP_EPILOGUE_GELU_BIAS ||
	    k->epilogue == RP_EPILOGUE_GELU_AUX_BIAS) {
		int32_t bt = (int32_t)tcd;
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
		/* The heuristic reads the bias pointer's alignment, not its
		 * memory: a stand-in with the real one's alignment. */
		const void *stand_in = (const void *)(uintptr_t)k->align_bias;
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &stand_in, sizeof(stand_in)));
	}
	if (k->ldaux) {
		/* dgelu reads aux, gelu_aux writes aux_out. Its type is left
		 * at its default, D's: the protocol gives both D's dtype. Its
		 * pointer is a stand-in too. */
		int64_t ldaux = k->ldaux;
		const void *stand_in = (const void *)(uintptr_t)k->align_aux;
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof(ldaux)));
		LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &stand_in,
						  sizeof(stand_in)));
	}
	/* Column-major views (see the top of this file). */
	uint64_t a_rows = k->trans_b ? (uint64_t)k->k : (uint64_t)k->n;
	uint64_t a_cols = k->trans_b ? (uint64_t)k->n : (uint64_t)k->k;
	uint64_t b_rows = k->trans_a ? (uint64_t)k->m : (uint64_t)k->k;
	uint64_t b_cols = k->trans_a ? (uint64_t)k->k : (uint64_t)k->m;
	LT(cublasLtMatrixLayoutCreate(&p->la, tb_type, a_rows, a_cols, k->ldb));
	LT(cublasLtMatrixLayoutCreate(&p->lb, ta_type, b_rows, b_cols, k->lda));
	LT(cublasLtMatrixLayoutCreate(&p->lc, tc, (uint64_t)k->n, (uint64_t)k->m, k->ldc));
	LT(cublasLtMatrixLayoutCreate(&p->ld, tcd, (uint64_t)k->n, (uint64_t)k->m, k->ldd));
	if (k->pointer_array) {
		const cublasLtMatrixLayout_t layouts[] = { p->la, p->lb, p->lc, p->ld };
		const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
		for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
			LT(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode,
							    sizeof(mode)));
	}

	LT(cublasLtMatmulPreferenceCreate(&pref));
	uint64_t max_ws = RD_CUDA_WORKSPACE_BYTES;
	uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a;
	uint32_t al_c = (uint32_t)k->align_c, al_d = (uint32_t)k->align_d;
	LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));
	LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
	LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
	LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
	LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));

	enum { WANT = 16 };
	cublasLtMatmulHeuristicResult_t results[WANT];
	int found = 0;
	memset(results, 0, sizeof(results));
	cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(cd->handle.lt, p->desc, p->la, p->lb, p->lc, p->ld, pref,
							   WANT, results, &found);
	if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
		r = cuda_status_set(RP_ERR_BACKEND,
				    "cuBLASLt has no %salgorithm for m=%lld n=%lld k=%lld (%s inputs, %s output, trans_a=%d "
				    "trans_b=%d, ld %lld/%lld/%lld/%lld, alignment %d/%d/%d/%d, epilogue %d): %s",
				    k->pointer_array ? "pointer-array " : "", (long long)k->m, (long long)k->n, (long long)k->k,
				    rp_dtype_name((enum rp_dtype)k->dtype_ab), rp_dtype_name((enum rp_dtype)k->dtype_cd),
				    k->trans_a, k->trans_b, (long long)k->lda, (long long)k->ldb, (long long)k->ldc,
				    (long long)k->ldd, k->align_a, k->align_b, k->align_c, k->align_d, k->epilogue,
				    hs != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(hs) : "no result");
		goto fail;
	}
	int chosen = 0;
	size_t max_result_ws = 0;
	for (int i = 0; i < found; i++) {
		if (results[i].workspaceSize > max_result_ws)
			max_result_ws = results[i].workspaceSize;
	}
	if (k->policy == RD_CUDA_ALGO_PREFER_WORKSPACE) {
		for (int i = 0; i < found; i++) {
			if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize > 0) {
				chosen = i;
				break;
			}
		}
	}
	p->algo = results[chosen].algo;
	p->ws_size = results[chosen].workspaceSize;

	memset(&p->info, 0, sizeof(p->info));
	p->info.workspace_size = p->ws_size;
	p->info.heuristic_results = found;
	p->info.chosen_index = chosen;
	p->info.max_result_workspace = max_result_ws;
	int32_t id = 0;
	uint32_t splitk = 0, scheme = 0, tile = 0, stages = 0;
	cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), NULL);
	cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), NULL);
	cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), NULL);
	cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), NULL);
	cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), NULL);
	p->info.algo_id = id;
	p->info.splitk = (int)splitk;
	p->info.reduction_scheme = (int)scheme;
	p->info.tile = (int)tile;
	p->info.stages = (int)stages;
	cublasLtMatmulPreferenceDestroy(pref);
	return 0;

fail:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	plan_destroy_descs(p);
	return r ? r : -EIO;
}

static void plan_release(struct rd_resource *res)
{
	plan_destroy_descs((struct cuda_gemm_plan *)res);
}

static const struct rd_resource_ops plan_ops = {
	.kind = "cublaslt_gemm_plan", .init = plan_init, .release = plan_release, .invalidate = plan_release,
};

void cuda_gemm_plans_init(struct cuda_dev *cd)
{
	pthread_mutex_init(&cd->plans_lock, NULL);
	/* The worker's gemm_plans_max; a test's rd_cuda_set_gemm_plan_limit
	 * may change it later. */
	rd_plan_cache_init(&cd->plans, sizeof(struct gemm_key),
			   cd->dev->gemm_plans_max ? cd->dev->gemm_plans_max : GEMM_PLANS_MAX);
}

static struct cuda_gemm_plan *plan_of_entry(struct rd_plan_entry *e)
{
	return (struct cuda_gemm_plan *)((char *)e - offsetof(struct cuda_gemm_plan, entry));
}

/* Plans out of the cache, held by nobody: their descriptors are host
 * objects no enqueued kernel refers to (see the top of this file), so they
 * go at once. Outside plans_lock (unregistering takes the registry's). */
static void plans_free(struct rd_plan_entry *e)
{
	while (e) {
		struct cuda_gemm_plan *p = plan_of_entry(e);
		e = e->next;
		rd_resource_unregister(&p->res);
		pthread_mutex_destroy(&p->lock);
		free(p);
	}
}

void cuda_gemm_plans_finish(struct cuda_dev *cd)
{
	pthread_mutex_lock(&cd->plans_lock);
	struct rd_plan_entry *all = rd_plan_cache_take_all(&cd->plans);
	rd_plan_cache_finish(&cd->plans);
	pthread_mutex_unlock(&cd->plans_lock);
	/* No call is left to hold one: the lanes are gone. */
	plans_free(all);
	pthread_mutex_destroy(&cd->plans_lock);
}

/* aux: dgelu's aux, read, or gelu_aux's aux_out, written (one epilogue
 * pointer either way). */
struct gemm_ptrs {
	const void *a, *b, *c, *bias;
	void *d, *aux;
	const void *a_scale, *b_scale, *d_scale;   /* FP8's, else NULL */
	void *amax_d;
};

/* A pointer-array plan takes its operands at any address this aligned:
 * its key's alignments, whatever the addresses of the call it was made
 * for (the graph that replays it will be handed others). */
#define GEMM_SLOTS_ALIGN 16

static void gemm_key_make(struct cuda_dev *cd, const struct rp_compute *c, const struct gemm_ptrs *ptr,
			  bool pointer_array, struct gemm_key *k)
{
	const struct rp_gemm *g = &c->gemm;

	memset(k, 0, sizeof(*k));
	k->m = g->m;
	k->n = g->n;
	k->k = g->k;
	k->lda = c->operands[RP_GEMM_A].strides[0];
	k->ldb = c->operands[RP_GEMM_B].strides[0];
	k->ldd = c->operands[RP_GEMM_D].strides[0];
	k->ldc = c->present[RP_GEMM_C] ? c->operands[RP_GEMM_C].strides[0] : k->ldd;
	k->dtype_ab = (int32_t)c->operands[RP_GEMM_A].dtype;
	k->dtype_b = (int32_t)c->operands[RP_GEMM_B].dtype;
	k->fp8_amax = c->present[RP_GEMM_AMAX_D];
	k->dtype_cd = (int32_t)c->operands[RP_GEMM_D].dtype;
	k->trans_a = g->trans_a;
	k->trans_b = g->trans_b;
	k->epilogue = (int32_t)g->epilogue;
	k->compute = (int32_t)g->compute;
	k->pointer_array = pointer_array;
	k->align_a = pointer_array ? GEMM_SLOTS_ALIGN : alignment_of(ptr->a);
	k->align_b = pointer_array ? GEMM_SLOTS_ALIGN : alignment_of(ptr->b);
	k->align_c = pointer_array ? GEMM_SLOTS_ALIGN : alignment_of(ptr->c);
	k->align_d = pointer_array ? GEMM_SLOTS_ALIGN : alignment_of(ptr->d);
	k->align_bias = ptr->bias ? alignment_of(ptr->bias) : 256;
	k->ldaux = c->present[RP_GEMM_AUX]       ? c->operands[RP_GEMM_AUX].strides[0]
		   : c->present[RP_GEMM_AUX_OUT] ? c->operands[RP_GEMM_AUX_OUT].strides[0]
						 : 0;
	k->align_aux = ptr->aux ? alignment_of(ptr->aux) : 256;
	k->policy = (int32_t)cd->policy;
}

/* Finds or makes the plan for k (registered, maybe not yet valid), held
 * until plan_put. NULL on ENOMEM. */
static struct cuda_gemm_plan *plan_get(struct cuda_dev *cd, const struct gemm_key *k)
{
	uint64_t h = rd_plan_cache_hash(k, sizeof(*k));
	struct cuda_gemm_plan *p = NULL;
	struct rd_plan_entry *doomed = NULL;

	pthread_mutex_lock(&cd->plans_lock);
	struct rd_plan_entry *e = rd_plan_cache_get(&cd->plans, k, h);
	if (e) {
		p = plan_of_entry(e);
	} else {
		p = calloc(1, sizeof(*p));
		if (p) {
			p->cd = cd;
			p->key = *k;
			if (rd_plan_cache_add(&cd->plans, &p->entry, &p->key, h) == 0) {
				pthread_mutex_init(&p->lock, NULL);
				rd_resource_register(&cd->dev->registry, &p->res, &plan_ops);
				doomed = rd_plan_cache_trim(&cd->plans);
			} else {
				free(p);
				p = NULL;
			}
		}
	}
	pthread_mutex_unlock(&cd->plans_lock);
	plans_free(doomed);
	return p;
}

/* Lets go of a plan plan_get returned; past the limit, the cache trims. */
static void plan_put(struct cuda_dev *cd, struct cuda_gemm_plan *p)
{
	pthread_mutex_lock(&cd->plans_lock);
	rd_plan_cache_put(&cd->plans, &p->entry);
	struct rd_plan_entry *doomed = rd_plan_cache_trim(&cd->plans);
	pthread_mutex_unlock(&cd->plans_lock);
	plans_free(doomed);
}

static int gemm_resolve(struct rd_op *op, struct gemm_ptrs *ptr, struct rp_error *err)
{
	const struct rp_compute *c = &op->compute;
	void *p[RP_OP_OPERANDS_MAX] = { 0 };

	for (int i = 0; i < RP_GEMM_OPERANDS; i++) {
		if (!c->present[i])
			continue;
		if (!op->buffers[i]) {
			rp_error_set(err, RP_ERR_INVALID_OPERAND, "GEMM operand %s has no buffer",
				     c->spec->operands[i].name);
			return -EINVAL;
		}
		if (!op->buffers[i]->ptr) {
			rp_error_set(err, RP_ERR_BACKEND, "GEMM operand %s's buffer is not mapped",
				     c->spec->operands[i].name);
			return -EIO;
		}
		p[i] = (char *)op->buffers[i]->ptr + c->operands[i].offset;
		/* The worker refuses these by the buffer's import offset
		 * (compute.c); this is for whoever drives the backend directly.
		 * cuBLASLt would find no algorithm and say nothing of which. */
		size_t elem = rp_dtype_size(c->operands[i].dtype);
		if (elem && (uintptr_t)p[i] % elem != 0)
			return rp_error_invalid_operand(err, c->spec->operands[i].name,
							"misaligned: %s's first element is at an address that is not a "
							"multiple of %zu, the size of %s",
							c->spec->operands[i].name, elem, rp_dtype_name(c->operands[i].dtype));
	}
	ptr->a = p[RP_GEMM_A];
	ptr->b = p[RP_GEMM_B];
	ptr->d = p[RP_GEMM_D];
	ptr->c = c->present[RP_GEMM_C] ? p[RP_GEMM_C] : ptr->d;
	/* An FP8 D's C is never read (beta is 0), but cuBLAS takes neither
	 * NULL nor D itself there (D would be C in place with another type):
	 * any other device address does, A's (PyTorch's scaled_gemm passes a
	 * dummy the same way). */
	if (rp_dtype_is_fp8(c->operands[RP_GEMM_D].dtype))
		ptr->c = ptr->a;
	ptr->bias = p[RP_GEMM_BIAS];
	ptr->aux = c->present[RP_GEMM_AUX] ? p[RP_GEMM_AUX] : p[RP_GEMM_AUX_OUT];
	ptr->a_scale = p[RP_GEMM_A_SCALE];
	ptr->b_scale = p[RP_GEMM_B_SCALE];
	ptr->d_scale = p[RP_GEMM_D_SCALE];
	ptr->amax_d = p[RP_GEMM_AMAX_D];
	return 0;
}

/* cuBLASLt's FP8 kernels read 16-byte rows: the FP8 matrices' row strides
 * a multiple of 16 elements and their first elements 16-byte aligned. */
static int fp8_aligned(const struct rp_compute *c, const struct gemm_ptrs *ptr, struct rp_error *err)
{
	const int slots[3] = { RP_GEMM_A, RP_GEMM_B, RP_GEMM_D };
	const void *at[3] = { ptr->a, ptr->b, ptr->d };

	for (int i = 0; i < 3; i++) {
		const struct rp_operand *op = &c->operands[slots[i]];
		const char *name = c->spec->operands[slots[i]].name;

		if (!rp_dtype_is_fp8(op->dtype))
			continue;
		if (op->strides[0] % 16 != 0)
			return rp_error_invalid_operand(err, name,
							"%s's row stride is %lld elements; cuBLASLt's FP8 GEMM needs it a "
							"multiple of 16 (pad %s's rows)",
							name, (long long)op->strides[0], name);
		if ((uintptr_t)at[i] % 16 != 0)
			return rp_error_invalid_operand(err, name,
							"%s's first element is not 16-byte aligned; cuBLASLt's FP8 GEMM "
							"needs it so (its buffer's import offset plus its offset a multiple "
							"of 16)",
							name);
	}
	return 0;
}

/* What the protocol allows but cuBLASLt's epilogues cannot take, refused
 * by name before anything is planned or launched. */
static int gemm_supported(const struct rp_compute *c, struct rp_error *err)
{
	if (c->gemm.epilogue == RP_EPILOGUE_DGELU && c->present[RP_GEMM_AUX] &&
	    c->operands[RP_GEMM_AUX].strides[0] % 8 != 0) {
		return rp_error_invalid_operand(err, "aux",
						"aux's row stride is %lld elements; cuBLASLt's DGELU epilogue needs it a "
						"multiple of 8 (pad aux's rows)",
						(long long)c->operands[RP_GEMM_AUX].strides[0]);
	}
	if (c->present[RP_GEMM_AUX_OUT] && c->operands[RP_GEMM_AUX_OUT].strides[0] % 8 != 0) {
		return rp_error_invalid_operand(err, "aux_out",
						"aux_out's row stride is %lld elements; cuBLASLt's GELU_AUX epilogue needs "
						"it a multiple of 8 (pad aux_out's rows)",
						(long long)c->operands[RP_GEMM_AUX_OUT].strides[0]);
	}
	return 0;
}

/* The plan for op's GEMM, valid and held (plan_put when done). */
static struct cuda_gemm_plan *gemm_plan_for(struct cuda_dev *cd, struct rd_op *op, struct gemm_ptrs *ptr,
					    bool pointer_array, struct rp_error *err)
{
	if (gemm_supported(&op->compute, err) || gemm_resolve(op, ptr, err) || fp8_aligned(&op->compute, ptr, err))
		return NULL;
	struct gemm_key key;
	gemm_key_make(cd, &op->compute, ptr, pointer_array, &key);
	struct cuda_gemm_plan *p = plan_get(cd, &key);
	if (!p) {
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory for a GEMM plan");
		return NULL;
	}
	if (rd_resource_ensure_valid(&p->res)) {
		cuda_status_to_error(err, "planning the GEMM");
		plan_put(cd, p);
		return NULL;
	}
	return p;
}

void rd_cuda_set_algo_policy(struct rd_device *dev, enum rd_cuda_algo_policy policy)
{
	cuda_dev_of(dev)->policy = policy;
}

int rd_cuda_gemm_plan_info(struct rd_device *dev, struct rd_op *op, struct rd_cuda_plan_info *info, struct rp_error *err)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	if (cuda_bind(cd, err))
		return -EIO;
	for (int i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		if (op->buffers[i] && rd_resource_ensure_valid(&op->buffers[i]->res))
			return cuda_status_to_error(err, "restoring a buffer mapping");
	}
	struct gemm_ptrs ptr;
	struct cuda_gemm_plan *p = gemm_plan_for(cd, op, &ptr, false, err);
	if (!p)
		return -EIO;
	*info = p->info;
	plan_put(cd, p);
	return 0;
}

unsigned rd_cuda_gemm_plan_count(struct rd_device *dev)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	pthread_mutex_lock(&cd->plans_lock);
	unsigned n = cd->plans.count;
	pthread_mutex_unlock(&cd->plans_lock);
	return n;
}

void rd_cuda_set_gemm_plan_limit(struct rd_device *dev, unsigned plans_max)
{
	struct cuda_dev *cd = cuda_dev_of(dev);
	pthread_mutex_lock(&cd->plans_lock);
	rd_plan_cache_set_max(&cd->plans, plans_max ? plans_max : GEMM_PLANS_MAX);
	struct rd_plan_entry *doomed = rd_plan_cache_trim(&cd->plans);
	pthread_mutex_unlock(&cd->plans_lock);
	plans_free(doomed);
}

/* The scalars cuBLASLt's FP8 GEMM reads or writes through a pointer, each
 * staged in a slot of its own when its address is not 16-byte aligned (see
 * the top of this file). */
#define FP8_SCALAR_ALIGN 16
enum { STAGE_A_SCALE, STAGE_B_SCALE, STAGE_D_SCALE, STAGE_AMAX_D, STAGE_SLOTS };
#define STAGE_BYTES ((size_t)STAGE_SLOTS * FP8_SCALAR_ALIGN)

static bool scalar_misaligned(const void *p)
{
	return p && (uintptr_t)p % FP8_SCALAR_ALIGN != 0;
}

static bool needs_staging(const struct gemm_ptrs *ptr)
{
	return scalar_misaligned(ptr->a_scale) || scalar_misaligned(ptr->b_scale) ||
	       scalar_misaligned(ptr->d_scale) || scalar_misaligned(ptr->amax_d);
}

/* The misaligned scales copied into their slots (16-byte aligned, at
 * `slots`) and ptr pointed there; amax_d pointed at its slot, its own
 * address left in *amax_out for stage_amax_out (NULL: not staged). */
static cudaError_t stage_scalars(struct cuda_lane *lane, char *slots, struct gemm_ptrs *ptr, void **amax_out)
{
	const void **scales[] = { [STAGE_A_SCALE] = &ptr->a_scale, [STAGE_B_SCALE] = &ptr->b_scale,
				  [STAGE_D_SCALE] = &ptr->d_scale };
	cudaError_t e = cudaSuccess;

	*amax_out = NULL;
	for (int i = 0; i < STAGE_AMAX_D && e == cudaSuccess; i++) {
		char *slot = slots + (size_t)i * FP8_SCALAR_ALIGN;

		if (!scalar_misaligned(*scales[i]))
			continue;
		e = cudaMemcpyAsync(slot, *scales[i], sizeof(float), cudaMemcpyDeviceToDevice, lane->stream);
		*scales[i] = slot;
	}
	if (scalar_misaligned(ptr->amax_d)) {
		*amax_out = ptr->amax_d;
		ptr->amax_d = slots + (size_t)STAGE_AMAX_D * FP8_SCALAR_ALIGN;
	}
	return e;
}

/* Enqueues op's matmul with plan p (held); with a pointer-array plan,
 * its A, B, C and D from `operand_slots` (device memory, as
 * cuda_gemm_slots fills them), else from pp. */
static int gemm_launch(struct cuda_lane *lane, struct rd_op *op, struct cuda_gemm_plan *p, const struct gemm_ptrs *pp,
		       void *const *operand_slots)
{
	struct cuda_dev *cd = lane->cd;
	const struct rp_gemm *g = &op->compute.gemm;
	struct gemm_ptrs ptr = *pp;
	if (rd_resource_ensure_valid(&cd->handle.res))
		return cuda_status_to_error(&op->err, "cuBLASLt handle");
	cuda_launch_mark(lane, CUDA_PHASE_PLAN);

	void *ws = NULL;
	size_t ws_size = p->ws_size;
	struct cuda_scratch scratch = { 0 };
	const bool staged = needs_staging(&ptr);
	char *slots = NULL;
	void *amax_out = NULL;
	cudaError_t e;
#if REGEN_SHARED_WORKSPACE_DEBUG
	/* DEBUG ONLY: the bug of seed 001, on purpose. */
	if (rd_resource_ensure_valid(&cd->shared_ws.res))
		return cuda_status_to_error(&op->err, "shared workspace");
	ws = cd->shared_ws.ptr;
	ws_size = RD_CUDA_WORKSPACE_BYTES;
	if (staged && cuda_scratch_take(lane, STAGE_BYTES, &scratch, "GEMM", &op->err))
		return -EIO;
	slots = scratch.ptr;
#else
	/* The slots after the workspace, 256-byte aligned as a workspace is. */
	const size_t slots_at = (ws_size + 255) & ~(size_t)255;
	if (cuda_scratch_take(lane, staged ? slots_at + STAGE_BYTES : ws_size, &scratch, "GEMM", &op->err))
		return -EIO;
	ws = scratch.ptr;
	slots = staged ? (char *)scratch.ptr + slots_at : NULL;
#endif
	lane->last_workspace = ws;
	cuda_launch_mark(lane, CUDA_PHASE_SCRATCH);

	float alpha = (float)g->alpha;
	float beta = op->compute.present[RP_GEMM_C] ? (float)g->beta : 0.0f;
	cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
	if (staged && (e = stage_scalars(lane, slots, &ptr, &amax_out)) != cudaSuccess) {
		rp_error_set(&op->err, cuda_error_name(e), "staging an FP8 scale at a 16-byte aligned address: %s",
			     cudaGetErrorString(e));
		cuda_scratch_give(lane, &scratch);
		return -EIO;
	}
	pthread_mutex_lock(&p->lock);
	if (ptr.bias)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr.bias, sizeof(ptr.bias));
	/* cuBLASLt's A is our B: their scales swap over too. */
	if (ptr.b_scale && s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptr.b_scale,
						   sizeof(ptr.b_scale));
	if (ptr.a_scale && s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ptr.a_scale,
						   sizeof(ptr.a_scale));
	if (ptr.d_scale && s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &ptr.d_scale,
						   sizeof(ptr.d_scale));
	if (ptr.amax_d && s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &ptr.amax_d,
						   sizeof(ptr.amax_d));
	if (ptr.aux && s == CUBLAS_STATUS_SUCCESS) {
		/* aux's leading dimension is the plan's (it is in the key);
		 * set again beside the pointer, so that the descriptor holds
		 * this call's pair whatever an earlier call left. */
		int64_t ldaux = p->key.ldaux;
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof(ldaux));
		if (s == CUBLAS_STATUS_SUCCESS)
			s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr.aux,
							   sizeof(ptr.aux));
	}
	if (s == CUBLAS_STATUS_SUCCESS && operand_slots)
		s = cublasLtMatmul(cd->handle.lt, p->desc, &alpha, &operand_slots[CUDA_GEMM_SLOT_B], p->la,
				   &operand_slots[CUDA_GEMM_SLOT_A], p->lb, &beta, &operand_slots[CUDA_GEMM_SLOT_C],
				   p->lc, (void *)&operand_slots[CUDA_GEMM_SLOT_D], p->ld, &p->algo, ws, ws_size,
				   lane->stream);
	else if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmul(cd->handle.lt, p->desc, &alpha, ptr.b, p->la, ptr.a, p->lb, &beta, ptr.c, p->lc, ptr.d,
				   p->ld, &p->algo, ws, ws_size, lane->stream);
	pthread_mutex_unlock(&p->lock);
	cuda_launch_mark(lane, CUDA_PHASE_KERNEL);

	int r = 0;
	if (s != CUBLAS_STATUS_SUCCESS) {
		/* An execution failure may be the context's: the lane's
		 * synchronisation that follows tells. */
		rp_error_set(&op->err, cublas_error_name(s), "cublasLtMatmul (m=%lld n=%lld k=%lld): %s",
			     (long long)g->m, (long long)g->n, (long long)g->k, cublasLtGetStatusString(s));
		r = -EIO;
	} else if (amax_out &&
		   (e = cudaMemcpyAsync(amax_out, ptr.amax_d, sizeof(float), cudaMemcpyDeviceToDevice, lane->stream)) !=
			   cudaSuccess) {
		rp_error_set(&op->err, cuda_error_name(e), "copying amax_d out of its 16-byte aligned slot: %s",
			     cudaGetErrorString(e));
		r = -EIO;
	}
	e = cuda_scratch_give(lane, &scratch);
	if (e != cudaSuccess && r == 0) {
		rp_error_set(&op->err, cuda_error_name(e), "freeing the workspace: %s", cudaGetErrorString(e));
		r = -EIO;
	}
	cuda_launch_mark(lane, CUDA_PHASE_FREE);
	return r;
}

/* op's GEMM by address (operand_slots NULL) or through its slots. */
static int gemm_enqueue(struct cuda_lane *lane, struct rd_op *op, void *const *operand_slots)
{
	struct gemm_ptrs ptr;
	struct cuda_gemm_plan *p = gemm_plan_for(lane->cd, op, &ptr, operand_slots != NULL, &op->err);
	if (!p)
		return -EIO;
	int r = gemm_launch(lane, op, p, &ptr, operand_slots);
	/* cublasLtMatmul has returned: the kernel needs nothing of the plan. */
	plan_put(lane->cd, p);
	return r;
}

int cuda_gemm_enqueue(struct cuda_lane *lane, struct rd_op *op)
{
	return gemm_enqueue(lane, op, NULL);
}

static bool slots_aligned(const struct gemm_ptrs *ptr)
{
	const void *at[] = { ptr->a, ptr->b, ptr->c, ptr->d };

	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
		if ((uintptr_t)at[i] % GEMM_SLOTS_ALIGN)
			return false;
	return true;
}

int cuda_gemm_slots(struct cuda_dev *cd, struct rd_op *op, void *slots[CUDA_GEMM_SLOTS])
{
	const struct rp_compute *c = &op->compute;
	struct rp_error err = { 0 };
	struct gemm_ptrs ptr;

	/* FP8's scales and amax are pointers of the descriptor, taken at
	 * capture as a bias is, and its kernels have no pointer arrays. */
	if (rp_dtype_is_fp8(c->operands[RP_GEMM_A].dtype) || rp_dtype_is_fp8(c->operands[RP_GEMM_D].dtype))
		return -EOPNOTSUPP;
	struct cuda_gemm_plan *p = gemm_plan_for(cd, op, &ptr, true, &err);
	rp_error_clear(&err);
	if (!p)
		return -EOPNOTSUPP;
	plan_put(cd, p);
	if (!slots_aligned(&ptr))
		return 1;
	slots[CUDA_GEMM_SLOT_B] = (void *)ptr.b;
	slots[CUDA_GEMM_SLOT_A] = (void *)ptr.a;
	slots[CUDA_GEMM_SLOT_C] = (void *)ptr.c;
	slots[CUDA_GEMM_SLOT_D] = ptr.d;
	return 0;
}

int cuda_gemm_enqueue_slots(struct cuda_lane *lane, struct rd_op *op, void *const *slots)
{
	return gemm_enqueue(lane, op, slots);
}
