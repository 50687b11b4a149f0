/* GEMM through rd_backend_cuda against a float64 host reference: every
 * dtype (f32, tf32, f16, bf16, and bf16/f16 inputs with f32 output) x
 * transposes x alpha/beta with C x bias/GELU epilogues x tight/padded
 * leading dimensions x two shapes (one odd). Fresh random inputs each run
 * (the seed is printed; REGEN_TEST_SEED repeats it), D poisoned with NaN
 * before every call, every element checked, padding must stay poisoned. */
#include "gpu_common.h"

#include <math.h>
#include <string.h>

struct dt_case {
	const char *name;
	enum rp_dtype in, out;
	enum rp_compute_mode compute;
	double tol;
};

static const struct dt_case dtypes[] = {
	{ "f32", RP_DTYPE_F32, RP_DTYPE_F32, RP_COMPUTE_F32, 1e-5 },
	{ "tf32", RP_DTYPE_F32, RP_DTYPE_F32, RP_COMPUTE_TF32, 1e-3 },
	{ "f16", RP_DTYPE_F16, RP_DTYPE_F16, RP_COMPUTE_F32, 1e-2 },
	{ "bf16", RP_DTYPE_BF16, RP_DTYPE_BF16, RP_COMPUTE_F32, 1e-2 },
	{ "bf16->f32", RP_DTYPE_BF16, RP_DTYPE_F32, RP_COMPUTE_F32, 1e-5 },
	{ "f16->f32", RP_DTYPE_F16, RP_DTYPE_F32, RP_COMPUTE_F32, 1e-5 },
};

static const struct { int64_t m, n, k; } shapes[] = { { 64, 96, 128 }, { 67, 45, 83 } };
static const char *epi_names[] = { "none", "bias", "gelu", "gelu_bias" };

int main(void)
{
	if (gt_have_gpu())
		return GT_SKIP;
	uint64_t seed = gt_seed();
	printf("test_cuda_gemm: seed %llu (REGEN_TEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
	       (unsigned long long)seed);
	struct gt t;
	gt_open(&t);
	struct rp_error err = { 0 };
	struct rd_lane *lane = t.dev.backend->lane_create(&t.dev, 0, &err);
	if (!lane) {
		fprintf(stderr, "FAIL: lane_create: %s\n", gt_err_message(&err));
		return 1;
	}

	unsigned cases = 0, failed = 0;
	uint64_t s = seed;
	double worst[sizeof(dtypes) / sizeof(dtypes[0])] = { 0 };
	double gelu_worst_f32 = 0, gelu_worst_f32_erf = 0;
	double t_start = gt_now();
	for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++) {
		const struct dt_case *dc = &dtypes[di];
		for (int tr = 0; tr < 4; tr++) {
			bool ta = tr & 1, tb = tr & 2;
			for (int with_c = 0; with_c < 2; with_c++) {
				for (int epi = 0; epi < 4; epi++) {
					for (int padded = 0; padded < 2; padded++) {
						for (size_t si = 0; si < 2; si++) {
							int64_t M = shapes[si].m, N = shapes[si].n, K = shapes[si].k;
							int64_t pad = padded ? 8 : 0;
							struct gt_mat a, b, c, d, bias;
							int64_t ar = ta ? K : M, ac = ta ? M : K;
							int64_t br = tb ? N : K, bc = tb ? K : N;
							gt_mat_alloc(&t, &a, dc->in, ar, ac, ac + pad);
							gt_mat_alloc(&t, &b, dc->in, br, bc, bc + pad + (padded ? 3 * 8 : 0));
							gt_mat_alloc(&t, &d, dc->out, M, N, N + pad);
							gt_mat_fill(&a, ++s, 0);
							gt_mat_fill(&b, ++s, 0);
							gt_mat_poison(&d);
							bool has_bias = epi == RP_EPILOGUE_BIAS || epi == RP_EPILOGUE_GELU_BIAS;
							if (with_c) {
								gt_mat_alloc(&t, &c, dc->out, M, N, N + 2 * pad);
								gt_mat_fill(&c, ++s, 0);
							}
							if (has_bias) {
								gt_mat_alloc(&t, &bias, dc->out, 1, N, N);
								bias.is_vector = true;
								gt_mat_fill(&bias, ++s, 0);
							}
							double alpha = with_c ? 0.75 : 1.5, beta = with_c ? -0.5 : 0.0;
							struct rd_op op;
							gt_gemm(&op, &a, &b, with_c ? &c : NULL, &d, has_bias ? &bias : NULL, ta, tb,
								alpha, beta, (enum rp_epilogue)epi, dc->compute);
							int r = gt_run(&t, lane, &op, 60);
							double *ref = malloc(sizeof(double) * (size_t)(M * N));
							double rel = INFINITY, rel_erf = INFINITY;
							unsigned long nans = 0, pad_touched = 0;
							if (r == 0) {
								gt_gemm_reference(&op, &a, &b, with_c ? &c : NULL, has_bias ? &bias : NULL,
										  ref, false);
								rel = gt_rel_error(&d, ref, &nans, &pad_touched);
								if (epi >= RP_EPILOGUE_GELU) {
									gt_gemm_reference(&op, &a, &b, with_c ? &c : NULL,
											  has_bias ? &bias : NULL, ref, true);
									unsigned long n2, p2;
									rel_erf = gt_rel_error(&d, ref, &n2, &p2);
								}
							}
							bool ok = r == 0 && rel < dc->tol && nans == 0 && pad_touched == 0;
							cases++;
							if (rel > worst[di] || isnan(rel))
								worst[di] = rel;
							if (di == 0 && epi >= RP_EPILOGUE_GELU) {
								if (rel > gelu_worst_f32)
									gelu_worst_f32 = rel;
								if (rel_erf > gelu_worst_f32_erf)
									gelu_worst_f32_erf = rel_erf;
							}
							if (!ok) {
								failed++;
								if (failed <= 40)
									printf("FAIL %-9s %s%s C=%d epi=%-9s ld=%s %lldx%lldx%lld: %s%s%s rel=%.3g "
									       "(gelu erf ref %.3g) nan=%lu pad_touched=%lu tol=%.0e\n",
									       dc->name, ta ? "T" : "N", tb ? "T" : "N", with_c, epi_names[epi],
									       padded ? "padded" : "tight", (long long)M, (long long)N,
									       (long long)K, gt_err_name(&op), r ? ": " : "",
									       r ? gt_err_message(&op.err) : "", rel, rel_erf, nans, pad_touched,
									       dc->tol);
							}
							rp_error_clear(&op.err);
							free(ref);
							gt_mat_free(&t, &a);
							gt_mat_free(&t, &b);
							gt_mat_free(&t, &d);
							if (with_c)
								gt_mat_free(&t, &c);
							if (has_bias)
								gt_mat_free(&t, &bias);
						}
					}
				}
			}
		}
	}
	printf("test_cuda_gemm: %u cases in %.1f s, %u failed\n", cases, gt_now() - t_start, failed);
	for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
		printf("  %-9s worst rel error %.3g (tolerance %.0e)\n", dtypes[di].name, worst[di], dtypes[di].tol);
	printf("  f32 GELU cases: worst rel error %.3g vs tanh-GELU reference, %.3g vs erf-GELU reference\n",
	       gelu_worst_f32, gelu_worst_f32_erf);

	t.dev.backend->lane_destroy(lane);
	gt_close(&t);
	printf("%s: test_cuda_gemm\n", failed ? "FAIL" : "PASS");
	return failed ? 1 : 0;
}
