/* SPDX-License-Identifier: Apache-2.0 */
/* Whether cuDNN 9's native CUDA graph API would let a program's captured
 * graph keep its attention when the operands move (issue 32: a Run whose
 * library operands moved is launched kernel by kernel instead of
 * replayed): for the bench's attention (B8 H16 S1024 D64 bf16, causal),
 * forward and backward, the plan regend builds (cudnn_graph.c), whether
 * its engine supports the API, and a graph populated for one set of
 * operands, updated for another and relaunched: it must write the second
 * set's outputs, bit for bit an eager call's (or, where two eager calls
 * differ, as the backward's atomic sums may, as far from it as they are
 * from each other), and leave the first's alone.
 * A probe, not a test: it prints what it finds (exit 1 only where an
 * updated graph wrote wrong); on the GPU,
 *   .device/build-gpu/tests/gpu/probe_sdpa_graph   (scripts/gpu-check probe-sdpa-graph) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/cudnn_graph.h"
#include "tests/gpu/gpu_common.h"

enum { B = 8, H = 16, S = 1024, D = 64 };

struct set {
	void *ptr[CUDA_SDPA_OPERANDS];
};

static size_t bytes_of(int uid)
{
	return uid == CUDA_SDPA_STATS ? (size_t)B * H * S * sizeof(float) : (size_t)B * H * S * D * 2;
}

/* Random values in every operand, each set its own: the forward's o and
 * stats too, which it overwrites. */
static void fill(void *dev, int uid, uint64_t seed)
{
	CUDA_OK(rk_fill_uniform(dev, bytes_of(uid) / (uid == CUDA_SDPA_STATS ? sizeof(float) : 2),
				uid == CUDA_SDPA_STATS ? RK_F32 : RK_BF16, seed, 0, 0));
}

static void key_for(struct cuda_sdpa_key *k, bool backward)
{
	cuda_sdpa_key_init(k);
	k->backward = backward;
	k->dtype = CUDNN_DATA_BFLOAT16;
	k->mask = CUDA_SDPA_CAUSAL_TOP_LEFT;
	k->stats = 1;
	k->b = B, k->h = k->h_kv = H, k->s_q = k->s_kv = S, k->d = k->d_v = D;
	for (int uid = CUDA_SDPA_Q; uid <= CUDA_SDPA_DV; uid++) {
		if (uid == CUDA_SDPA_STATS) {
			int64_t st[4] = { H * S, S, 1, 1 };
			memcpy(k->strides[uid], st, sizeof(st));
		} else if (backward || uid <= CUDA_SDPA_O) {
			int64_t st[4] = { (int64_t)H * S * D, (int64_t)S * D, D, 1 };
			memcpy(k->strides[uid], st, sizeof(st));
		}
	}
}

/* ||a - b|| / ||b|| of two bf16 (or, stats, f32) operands on the device. */
static double rel_diff(const void *a, const void *b, int uid)
{
	const size_t bytes = bytes_of(uid), n = uid == CUDA_SDPA_STATS ? bytes / 4 : bytes / 2;
	void *ha = malloc(bytes), *hb = malloc(bytes);
	double num = 0, den = 0;

	if (!ha || !hb) {
		free(ha);
		free(hb);
		return INFINITY;
	}
	CUDA_OK(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost));
	CUDA_OK(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < n; i++) {
		const bool f32 = uid == CUDA_SDPA_STATS;
		const double x = f32 ? ((const float *)ha)[i] : gt_bf16_to_double(((const uint16_t *)ha)[i]);
		const double y = f32 ? ((const float *)hb)[i] : gt_bf16_to_double(((const uint16_t *)hb)[i]);
		num += (x - y) * (x - y);
		den += y * y;
	}
	free(ha);
	free(hb);
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The operands the direction writes. */
static bool written(int uid, bool backward)
{
	return backward ? uid >= CUDA_SDPA_DQ : uid == CUDA_SDPA_O || uid == CUDA_SDPA_STATS;
}

static int probe(cudnnHandle_t h, cudaStream_t st, bool backward, uint64_t *seed)
{
	const char *name = backward ? "backward" : "forward";
	const float scale = 0.125f;
	struct cuda_sdpa_key k;
	struct cuda_sdpa_plan plan;
	char why[512] = "";
	int failures = 0;

	key_for(&k, backward);
	memset(&plan, 0, sizeof(plan));
	if (cuda_sdpa_plan_build(&k, h, NULL, 0, 1, &plan, why, sizeof(why)) != 0) {
		printf("%s: no plan: %s\n", name, why);
		return 0;
	}
	printf("%s: engine %lld, native CUDA graph API %s\n", name, (long long)plan.engine,
	       cuda_sdpa_graph_native(&plan) ? "supported" : "not supported");
	struct set set[2], ref;
	void *ws = NULL;
	if (plan.workspace)
		CUDA_OK(cudaMalloc(&ws, plan.workspace));
	memset(set, 0, sizeof(set));
	memset(&ref, 0, sizeof(ref));
	int last = backward ? CUDA_SDPA_DV : CUDA_SDPA_STATS;
	for (int i = 0; i < 2; i++)
		for (int uid = CUDA_SDPA_Q; uid <= last; uid++) {
			CUDA_OK(cudaMalloc(&set[i].ptr[uid], bytes_of(uid)));
			fill(set[i].ptr[uid], uid, (*seed)++);
		}
	CUDA_OK(cudaStreamSynchronize(0));   /* the fills, before st's calls read them */
	for (int uid = CUDA_SDPA_Q; uid <= last; uid++)
		if (written(uid, backward))
			CUDA_OK(cudaMalloc(&ref.ptr[uid], bytes_of(uid)));
	if (backward) {
		/* o and stats from a forward of each set: the backward reads them. */
		struct cuda_sdpa_key fk;
		struct cuda_sdpa_plan fwd;
		memset(&fwd, 0, sizeof(fwd));
		key_for(&fk, false);
		if (cuda_sdpa_plan_build(&fk, h, NULL, 0, 1, &fwd, why, sizeof(why)) != 0) {
			printf("backward: no forward plan: %s\n", why);
			return 1;
		}
		void *fws = NULL;
		if (fwd.workspace)
			CUDA_OK(cudaMalloc(&fws, fwd.workspace));
		for (int i = 0; i < 2; i++) {
			void *p[CUDA_SDPA_OPERANDS] = { 0 };
			for (int uid = CUDA_SDPA_Q; uid <= CUDA_SDPA_STATS; uid++)
				p[uid] = set[i].ptr[uid];
			if (cuda_sdpa_execute(h, &fwd, fwd.chosen, p, scale, fws, why, sizeof(why)) != CUDNN_STATUS_SUCCESS) {
				printf("backward: the forward failed: %s\n", why);
				return 1;
			}
		}
		CUDA_OK(cudaStreamSynchronize(st));
		cudaFree(fws);
		cuda_sdpa_plan_destroy(&fwd);
	}

	/* The eager call on set 1: the reference. */
	if (cuda_sdpa_execute(h, &plan, plan.chosen, set[1].ptr, scale, ws, why, sizeof(why)) != CUDNN_STATUS_SUCCESS) {
		printf("%s: the eager call failed: %s\n", name, why);
		failures++;
		goto out;
	}
	for (int uid = CUDA_SDPA_Q; uid <= last; uid++)
		if (ref.ptr[uid])
			CUDA_OK(cudaMemcpyAsync(ref.ptr[uid], set[1].ptr[uid], bytes_of(uid), cudaMemcpyDeviceToDevice, st));
	CUDA_OK(cudaStreamSynchronize(st));
	/* Once more: an engine that sums with atomics (the backward's dq)
	 * gives other bits each call, so a graph's outputs are then held to
	 * how far two eager calls differ, not to the bit. */
	if (cuda_sdpa_execute(h, &plan, plan.chosen, set[1].ptr, scale, ws, why, sizeof(why)) != CUDNN_STATUS_SUCCESS) {
		printf("%s: the second eager call failed: %s\n", name, why);
		failures++;
		goto out;
	}
	CUDA_OK(cudaStreamSynchronize(st));
	double eager_spread = 0;
	for (int uid = CUDA_SDPA_Q; uid <= last; uid++)
		if (ref.ptr[uid]) {
			double d = rel_diff(set[1].ptr[uid], ref.ptr[uid], uid);
			eager_spread = d > eager_spread ? d : eager_spread;
		}
	if (eager_spread > 0)
		printf("%s: two eager calls differ (relative %.1e at most): not deterministic\n", name, eager_spread);

	cudaGraph_t graph;
	cudaGraphExec_t exec;
	CUDA_OK(cudaGraphCreate(&graph, 0));
	cudnnStatus_t s = cuda_sdpa_graph(h, &plan, set[0].ptr, scale, ws, graph, false, why, sizeof(why));
	if (s != CUDNN_STATUS_SUCCESS) {
		printf("%s: populating a graph: %s\n", name, why);
		CUDA_OK(cudaGraphDestroy(graph));
		goto out;
	}
	size_t nodes = 0;
	CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
	CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
	s = cuda_sdpa_graph(h, &plan, set[1].ptr, scale, ws, graph, true, why, sizeof(why));
	if (s != CUDNN_STATUS_SUCCESS) {
		printf("%s: updating the graph: %s\n", name, why);
		failures++;
	} else {
		cudaGraphExecUpdateResultInfo info;
		CUDA_OK(cudaGraphExecUpdate(exec, graph, &info));
		for (int i = 0; i < 2; i++)
			for (int uid = CUDA_SDPA_Q; uid <= last; uid++)
				if (written(uid, backward))
					CUDA_OK(cudaMemset(set[i].ptr[uid], 0, bytes_of(uid)));
		CUDA_OK(cudaGraphLaunch(exec, st));
		CUDA_OK(cudaStreamSynchronize(st));
		/* Zeros as large as the largest operand, to tell untouched ones by. */
		void *zero;
		CUDA_OK(cudaMalloc(&zero, bytes_of(CUDA_SDPA_Q)));
		CUDA_OK(cudaMemset(zero, 0, bytes_of(CUDA_SDPA_Q)));
		bool right = true, untouched = true;
		double worst = 0;
		for (int uid = CUDA_SDPA_Q; uid <= last; uid++)
			if (written(uid, backward)) {
				double d = rel_diff(set[1].ptr[uid], ref.ptr[uid], uid);
				worst = d > worst ? d : worst;
				/* Within four times the eager calls' own spread. */
				right &= eager_spread > 0 ? d <= 4 * eager_spread
							  : gt_mismatched_words(set[1].ptr[uid], ref.ptr[uid], bytes_of(uid)) == 0;
				untouched &= gt_mismatched_words(set[0].ptr[uid], zero, bytes_of(uid)) == 0;
			}
		CUDA_OK(cudaFree(zero));
		printf("%s: a graph of %zu nodes populated for one set, updated for another, relaunched: %s "
		       "(relative %.1e from the eager call's)\n", name, nodes,
		       right && untouched ? (eager_spread > 0 ? "the new set's outputs, as far from the eager call's as "
								"two eager calls are"
							      : "the new set's outputs, bit for bit the eager call's")
		       : !untouched ? "WRONG: it wrote the first set's outputs"
				    : "WRONG: not the eager call's outputs", worst);
		failures += !(right && untouched);

		/* What a call costs each way, the GPU's time for 20 in a row. */
		cudaEvent_t t0, t1;
		float eager_ms = 0, graph_ms = 0;
		CUDA_OK(cudaEventCreate(&t0));
		CUDA_OK(cudaEventCreate(&t1));
		CUDA_OK(cudaEventRecord(t0, st));
		for (int i = 0; i < 20; i++)
			cuda_sdpa_execute(h, &plan, plan.chosen, set[1].ptr, scale, ws, NULL, 0);
		CUDA_OK(cudaEventRecord(t1, st));
		CUDA_OK(cudaEventSynchronize(t1));
		CUDA_OK(cudaEventElapsedTime(&eager_ms, t0, t1));
		CUDA_OK(cudaEventRecord(t0, st));
		for (int i = 0; i < 20; i++)
			CUDA_OK(cudaGraphLaunch(exec, st));
		CUDA_OK(cudaEventRecord(t1, st));
		CUDA_OK(cudaEventSynchronize(t1));
		CUDA_OK(cudaEventElapsedTime(&graph_ms, t0, t1));
		printf("%s: %.1f us a call eager, %.1f us replayed\n", name, eager_ms * 50, graph_ms * 50);
		cudaEventDestroy(t0);
		cudaEventDestroy(t1);
	}
	CUDA_OK(cudaGraphExecDestroy(exec));
	CUDA_OK(cudaGraphDestroy(graph));
out:
	for (int i = 0; i < 2; i++)
		for (int uid = 0; uid < CUDA_SDPA_OPERANDS; uid++)
			cudaFree(set[i].ptr[uid]);
	for (int uid = 0; uid < CUDA_SDPA_OPERANDS; uid++)
		cudaFree(ref.ptr[uid]);
	cudaFree(ws);
	cuda_sdpa_plan_destroy(&plan);
	return failures;
}

int main(void)
{
	int r = gt_have_gpu();
	if (r != 0)
		return r;
	uint64_t seed = 0x5eed5dbaull;
	cudnnHandle_t h;
	cudaStream_t st;
	if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
		printf("cudnnCreate failed\n");
		return 1;
	}
	CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	cudnnSetStream(h, st);
	printf("cuDNN %zu\n", cudnnGetVersion());
	int failures = probe(h, st, false, &seed) + probe(h, st, true, &seed);
	cudnnDestroy(h);
	return failures ? 1 : 0;
}
