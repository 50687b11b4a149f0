/* SPDX-License-Identifier: Apache-2.0 */
/* The attention graphs of daemon/backend/cuda/cudnn_graph.c against cuDNN
 * itself, without a GPU. Since 9.8 cuDNN builds execution plans for a
 * described device (a device-properties descriptor; here an H200's): its
 * heuristics pick engines for the graph, their support checks run, and the
 * chosen engine compiles its kernels; only loading them needs a driver.
 * meson runs this test with the toolkit's stub libcuda.so.1 first on the
 * library path, so a problem cuDNN takes gets as far as that load (which
 * the stub fails: "cuLibraryLoadData"), and one it refuses stops at the
 * support checks with cuDNN's reason. A graph cuDNN's fused attention does
 * not recognise is refused, so this catches a wrong graph here rather than
 * on the GPU. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/cudnn_graph.h"

/* An H200 as cuDNN serializes one (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION). */
static const char H200[] =
	"{\"deviceName\":\"NVIDIA H200\",\"cudaDeviceId\":0,\"deviceVer\":900,\"driverVer\":13000,\"isTccDriver\":0,"
	"\"l2CacheSize\":52428800,\"maxCtasPerSM\":32,\"maxRegistersPerSM\":65536,\"maxSharedMemoryPerBlock\":49152,"
	"\"maxSharedMemoryPerBlockOptin\":232448,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,"
	"\"memClockRateKHz\":3201000,\"multiProcessorCount\":132,\"pciDeviceId\":0,\"regsPerBlock\":65536,"
	"\"reservedSharedMemoryPerBlock\":1024,\"smClockRateKHz\":1980000,\"supportCoopLaunch\":1,"
	"\"totalGlobalMem\":150754820096,\"warpSize\":32,\"maxBlockSize\":[1024,1024,64],"
	"\"maxGridSize\":[2147483647,65535,65535]}";

static cudnnBackendDescriptor_t devprop;

enum layout { BHSD, BSHD };

struct problem {
	int backward, mask, stats;
	cudnnDataType_t dtype;
	int64_t b, h, h_kv, s_q, s_kv, d, d_v;
	enum layout layout;
	int padded;              /* with sequence lengths: the padding mask */
};

static void strides(int64_t s[4], enum layout l, int64_t h, int64_t seq, int64_t d)
{
	s[0] = h * seq * d;
	s[1] = l == BHSD ? seq * d : d;
	s[2] = l == BHSD ? d : h * d;
	s[3] = 1;
}

static void key_of(const struct problem *p, struct cuda_sdpa_key *k)
{
	cuda_sdpa_key_init(k);
	k->backward = p->backward;
	k->dtype = p->dtype;
	k->mask = p->mask;
	k->stats = p->backward || p->stats;
	k->padded = p->padded;
	k->b = p->b;
	k->h = p->h;
	k->h_kv = p->h_kv;
	k->s_q = p->s_q;
	k->s_kv = p->s_kv;
	k->d = p->d;
	k->d_v = p->d_v;
	strides(k->strides[CUDA_SDPA_Q], p->layout, p->h, p->s_q, p->d);
	strides(k->strides[CUDA_SDPA_K], p->layout, p->h_kv, p->s_kv, p->d);
	strides(k->strides[CUDA_SDPA_V], p->layout, p->h_kv, p->s_kv, p->d_v);
	strides(k->strides[CUDA_SDPA_O], p->layout, p->h, p->s_q, p->d_v);
	strides(k->strides[CUDA_SDPA_DO], p->layout, p->h, p->s_q, p->d_v);
	strides(k->strides[CUDA_SDPA_DQ], p->layout, p->h, p->s_q, p->d);
	strides(k->strides[CUDA_SDPA_DK], p->layout, p->h_kv, p->s_kv, p->d);
	strides(k->strides[CUDA_SDPA_DV], p->layout, p->h_kv, p->s_kv, p->d_v);
	k->strides[CUDA_SDPA_STATS][0] = p->h * p->s_q;
	k->strides[CUDA_SDPA_STATS][1] = p->s_q;
	k->strides[CUDA_SDPA_STATS][2] = 1;
}

static int build(const struct problem *p, char *why, size_t n)
{
	struct cuda_sdpa_key k;
	struct cuda_sdpa_plan plan;

	key_of(p, &k);
	int r = cuda_sdpa_plan_build(&k, NULL, devprop, 0, 1, &plan, why, n);
	cuda_sdpa_plan_destroy(&plan);
	return r;
}

/* cuDNN took the problem: an engine compiled it and only the load into a
 * context (absent here) failed, or, where a real driver answered, the plan
 * exists. */
static void assert_taken(const struct problem *p)
{
	char why[1024];
	int r = build(p, why, sizeof(why));
	ck_assert_msg(r == 0 || (r == -EIO && strstr(why, "cuLibraryLoadData")),
		      "%s mask %d%s B%lld H%lld/%lld Sq%lld Skv%lld D%lld/%lld: r=%d, %s",
		      p->backward ? "backward" : "forward", p->mask, p->padded ? " padded" : "", (long long)p->b,
		      (long long)p->h, (long long)p->h_kv, (long long)p->s_q, (long long)p->s_kv, (long long)p->d,
		      (long long)p->d_v, r, why);
}

START_TEST(forward_graphs_are_taken)
{
	const struct problem cases[] = {
		{ 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 2, 4, 4, 128, 128, 64, 64, BHSD },
		{ 0, CUDA_SDPA_CAUSAL_TOP_LEFT, 1, CUDNN_DATA_HALF, 2, 4, 4, 128, 128, 128, 128, BSHD },
		{ 0, CUDA_SDPA_CAUSAL_BOTTOM_RIGHT, 1, CUDNN_DATA_BFLOAT16, 2, 8, 2, 77, 200, 128, 128, BSHD },
		{ 0, CUDA_SDPA_CAUSAL_TOP_LEFT, 1, CUDNN_DATA_BFLOAT16, 1, 4, 1, 100, 300, 96, 96, BHSD },
		{ 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 1, 4, 4, 256, 256, 128, 64, BHSD },
		{ 0, CUDA_SDPA_NO_MASK, 0, CUDNN_DATA_HALF, 1, 4, 4, 256, 256, 256, 256, BSHD },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_taken(&cases[i]);
}
END_TEST

/* Sequence lengths (cuDNN's padding mask), forward and backward: every
 * mask, grouped-query heads, BSHD, Sq > Skv aligned bottom-right (the
 * lengths decide). */
START_TEST(padded_graphs_are_taken)
{
	const struct problem cases[] = {
		{ 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 3, 4, 4, 128, 128, 64, 64, BHSD, 1 },
		{ 0, CUDA_SDPA_CAUSAL_TOP_LEFT, 0, CUDNN_DATA_HALF, 2, 8, 2, 100, 200, 128, 128, BSHD, 1 },
		{ 0, CUDA_SDPA_CAUSAL_BOTTOM_RIGHT, 1, CUDNN_DATA_BFLOAT16, 2, 4, 1, 300, 77, 64, 64, BHSD, 1 },
		{ 1, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 3, 4, 4, 128, 128, 64, 64, BHSD, 1 },
		{ 1, CUDA_SDPA_CAUSAL_TOP_LEFT, 1, CUDNN_DATA_HALF, 2, 8, 2, 100, 200, 128, 128, BSHD, 1 },
		{ 1, CUDA_SDPA_CAUSAL_BOTTOM_RIGHT, 1, CUDNN_DATA_BFLOAT16, 2, 4, 1, 300, 77, 64, 64, BHSD, 1 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_taken(&cases[i]);
}
END_TEST

START_TEST(backward_graphs_are_taken)
{
	const struct problem cases[] = {
		{ 1, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 2, 4, 4, 128, 128, 64, 64, BHSD },
		{ 1, CUDA_SDPA_CAUSAL_TOP_LEFT, 1, CUDNN_DATA_HALF, 2, 4, 4, 128, 128, 128, 128, BSHD },
		{ 1, CUDA_SDPA_CAUSAL_BOTTOM_RIGHT, 1, CUDNN_DATA_BFLOAT16, 2, 8, 2, 77, 200, 128, 128, BSHD },
		{ 1, CUDA_SDPA_CAUSAL_TOP_LEFT, 1, CUDNN_DATA_BFLOAT16, 1, 4, 1, 100, 300, 96, 96, BHSD },
		{ 1, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 1, 4, 4, 256, 256, 128, 64, BHSD },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_taken(&cases[i]);
}
END_TEST

/* What cuDNN does not take comes back as -ENOTSUP with its reason, fast
 * (the support checks run before any compilation). */
START_TEST(refusals_carry_cudnns_reason)
{
	char why[1024];
	const struct problem odd_dim = { 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 1, 2, 2, 64, 64, 36, 36, BHSD };
	ck_assert_int_eq(build(&odd_dim, why, sizeof(why)), -ENOTSUP);
	ck_assert_msg(strstr(why, "multiple of 8"), "%s", why);

	const struct problem wide = { 1, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 1, 2, 2, 64, 64, 512, 512, BHSD };
	ck_assert_int_eq(build(&wide, why, sizeof(why)), -ENOTSUP);
	ck_assert_msg(strstr(why, "256"), "%s", why);

	const struct problem f32 = { 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_INT32, 1, 2, 2, 64, 64, 64, 64, BHSD };
	ck_assert_int_eq(build(&f32, why, sizeof(why)), -ENOTSUP);
}
END_TEST

/* What autotuning times: the heuristics' ranking first, as a plan without
 * autotuning takes it, then more (mode B, and every value of a
 * single-knob engine's knob: on an H200 cuDNN 9.19's SDPA engines have one,
 * KERNEL_CFG), never one configuration twice. Listed without compiling. */
START_TEST(autotuning_offers_more_configurations)
{
	const struct problem probs[] = {
		{ 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 16, 16, 16, 1024, 1024, 64, 64, BHSD },
		{ 1, CUDA_SDPA_CAUSAL_TOP_LEFT, 1, CUDNN_DATA_BFLOAT16, 2, 8, 2, 512, 512, 128, 128, BSHD, 1 },
	};
	static char ranked[64][96], all[256][96];
	char why[1024];

	for (size_t p = 0; p < sizeof(probs) / sizeof(probs[0]); p++) {
		struct cuda_sdpa_key k;
		key_of(&probs[p], &k);
		int n = cuda_sdpa_configurations(&k, NULL, devprop, false, ranked, 64, why, sizeof(why));
		int m = cuda_sdpa_configurations(&k, NULL, devprop, true, all, 256, why, sizeof(why));
		ck_assert_msg(n >= 1 && n <= 64, "problem %zu: %d ranked (%s)", p, n, why);
		ck_assert_msg(m > n && m <= 256, "problem %zu: %d configurations with autotuning, %d without; cuDNN "
			      "offers no knob to sweep any more? (%s)", p, m, n, why);
		for (int i = 0; i < n; i++)
			ck_assert_str_eq(all[i], ranked[i]);
		for (int i = 0; i < m; i++) {
			ck_assert_msg(strncmp(all[i], "engine ", 7) == 0, "%s", all[i]);
			for (int j = 0; j < i; j++)
				ck_assert_msg(strcmp(all[i], all[j]) != 0, "problem %zu: %s offered twice", p, all[i]);
		}
	}
}
END_TEST

START_TEST(a_zeroed_plan_destroys)
{
	struct cuda_sdpa_plan plan;
	memset(&plan, 0, sizeof(plan));
	cuda_sdpa_plan_destroy(&plan);
	cuda_sdpa_plan_destroy(NULL);
}
END_TEST

/* Whether this cuDNN can build for a described device and reach the kernel
 * load: not before 9.8, and not without (the stub of) libcuda.so.1. */
static const char *unavailable(void)
{
	static char why[1024];
	if (cudnnGetVersion() < 90800)
		return "cuDNN older than 9.8 builds no plans without a device";
	if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &devprop) != CUDNN_STATUS_SUCCESS ||
	    cudnnBackendSetAttribute(devprop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
				     (int64_t)strlen(H200), H200) != CUDNN_STATUS_SUCCESS ||
	    cudnnBackendFinalize(devprop) != CUDNN_STATUS_SUCCESS)
		return "cuDNN refuses the H200's device properties";
	const struct problem probe = { 0, CUDA_SDPA_NO_MASK, 1, CUDNN_DATA_BFLOAT16, 1, 1, 1, 64, 64, 64, 64, BHSD };
	if (build(&probe, why, sizeof(why)) == -ENOTSUP &&
	    (strcasestr(why, "libcuda") || strcasestr(why, "nvrtc") || strcasestr(why, "dll")))
		return "cuDNN's runtime compilation lacks libcuda.so.1 (not even the toolkit's stub) or NVRTC";
	return NULL;
}

int main(void)
{
	const char *why = unavailable();
	if (why) {
		printf("SKIP: %s\n", why);
		return 77;
	}
	Suite *s = suite_create("cudnn_graph");
	TCase *tc = tcase_create("plans");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, forward_graphs_are_taken);
	tcase_add_test(tc, backward_graphs_are_taken);
	tcase_add_test(tc, padded_graphs_are_taken);
	tcase_add_test(tc, autotuning_offers_more_configurations);
	tcase_add_test(tc, refusals_carry_cudnns_reason);
	tcase_add_test(tc, a_zeroed_plan_destroys);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	cudnnBackendDestroyDescriptor(devprop);
	return failed ? 1 : 0;
}
