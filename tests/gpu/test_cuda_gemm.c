/* SPDX-License-Identifier: Apache-2.0 */
/* GEMM through rd_backend_cuda against a float64 host reference: every
 * dtype (f32, tf32, f16, bf16, and bf16/f16 inputs with f32 output) x
 * transposes x alpha/beta with C x bias/GELU epilogues x tight/padded
 * leading dimensions x two shapes (one odd). Fresh random inputs each run
 * (the seed is printed; REGEN_TEST_SEED repeats it), D poisoned with NaN
 * before every call, every element checked, padding must stay poisoned.
 * Then the dgelu epilogue (cuBLASLt's DGELU) the same way, its aux across
 * GELU's tails, and an aux whose row stride cuBLASLt cannot take refused
 * by name with D untouched; and gelu_aux / gelu_aux_bias (GELU_AUX), D and
 * the pre-activation written to aux_out both checked, an aux_out whose row
 * stride is off 8 refused by name with D and aux_out untouched. */
#include "gpu_common.h"

#include <math.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "proto/errors.h"

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
	/* dgelu: D = (alpha op(A) op(B) + beta C) * GELU'(aux). aux's row
	 * stride is N rounded up to 8 (cuBLASLt's rule), plus 8 when padded;
	 * the odd shape also runs with aux's rows tight (45), to be refused. */
	double dgelu_worst[sizeof(dtypes) / sizeof(dtypes[0])] = { 0 };
	unsigned dgelu_refused = 0;
	for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++) {
		const struct dt_case *dc = &dtypes[di];
		for (int tr = 0; tr < 4; tr++) {
			bool ta = tr & 1, tb = tr & 2;
			for (int with_c = 0; with_c < 2; with_c++) {
				for (int variant = 0; variant < 3; variant++) {
					for (size_t si = 0; si < 2; si++) {
						int64_t M = shapes[si].m, N = shapes[si].n, K = shapes[si].k;
						int64_t pad = variant == 1 ? 8 : 0;
						int64_t aux_ld = (N + 7) / 8 * 8 + pad;
						bool refuse = variant == 2;
						if (refuse) {
							if (N % 8 == 0)
								continue;
							aux_ld = N;
						}
						struct gt_mat a, b, c, d, aux;
						int64_t ar = ta ? K : M, ac = ta ? M : K;
						int64_t br = tb ? N : K, bc = tb ? K : N;
						gt_mat_alloc(&t, &a, dc->in, ar, ac, ac + pad);
						gt_mat_alloc(&t, &b, dc->in, br, bc, bc + pad);
						gt_mat_alloc(&t, &d, dc->out, M, N, N + pad);
						gt_mat_alloc(&t, &aux, dc->out, M, N, aux_ld);
						gt_mat_fill(&a, ++s, 0);
						gt_mat_fill(&b, ++s, 0);
						gt_mat_fill(&aux, ++s, 2);     /* [-4, 4) */
						gt_mat_poison(&d);
						if (with_c) {
							gt_mat_alloc(&t, &c, dc->out, M, N, N + 2 * pad);
							gt_mat_fill(&c, ++s, 0);
						}
						double alpha = with_c ? 0.75 : 1.5, beta = with_c ? -0.5 : 0.0;
						struct rd_op op;
						gt_gemm(&op, &a, &b, with_c ? &c : NULL, &d, NULL, ta, tb, alpha, beta,
							RP_EPILOGUE_DGELU, dc->compute);
						gt_gemm_set_aux(&op, &aux);
						int r = gt_run(&t, lane, &op, 60);
						double *ref = malloc(sizeof(double) * (size_t)(M * N));
						double rel = INFINITY;
						unsigned long nans = 0, pad_touched = 0;
						bool ok;
						if (refuse) {
							cJSON *operand = op.err.params ? cJSON_GetObjectItem(op.err.params, "operand") : NULL;
							double *hd = gt_mat_download(&d);
							unsigned long written = 0;
							for (int64_t e = 0; e < M * d.ld; e++)
								written += !isnan(hd[e]);
							free(hd);
							ok = r != 0 && op.err.name && strcmp(op.err.name, RP_ERR_INVALID_OPERAND) == 0 &&
							     cJSON_IsString(operand) && strcmp(operand->valuestring, "aux") == 0 &&
							     written == 0;
							dgelu_refused += ok;
							rel = 0;
						} else {
							if (r == 0) {
								gt_gemm_reference(&op, &a, &b, with_c ? &c : NULL, NULL, ref, false);
								gt_gemm_reference_dgelu(&op, &aux, ref);
								rel = gt_rel_error(&d, ref, &nans, &pad_touched);
							}
							ok = r == 0 && rel < dc->tol && nans == 0 && pad_touched == 0;
							if (rel > dgelu_worst[di] || isnan(rel))
								dgelu_worst[di] = rel;
						}
						cases++;
						if (!ok) {
							failed++;
							if (failed <= 40)
								printf("FAIL %-9s %s%s C=%d epi=dgelu ld=%s aux_ld=%lld %lldx%lldx%lld: %s%s%s "
								       "rel=%.3g nan=%lu pad_touched=%lu tol=%.0e%s\n",
								       dc->name, ta ? "T" : "N", tb ? "T" : "N", with_c,
								       pad ? "padded" : "tight", (long long)aux_ld, (long long)M,
								       (long long)N, (long long)K, gt_err_name(&op), r ? ": " : "",
								       r ? gt_err_message(&op.err) : "", rel, nans, pad_touched, dc->tol,
								       refuse ? " (want InvalidOperand aux, D untouched)" : "");
						}
						rp_error_clear(&op.err);
						free(ref);
						gt_mat_free(&t, &a);
						gt_mat_free(&t, &b);
						gt_mat_free(&t, &d);
						gt_mat_free(&t, &aux);
						if (with_c)
							gt_mat_free(&t, &c);
					}
				}
			}
		}
	}

	/* gelu_aux and gelu_aux_bias: D = GELU(x) and aux_out = x, x = alpha
	 * op(A) op(B) + beta C (+ bias). aux_out's row stride as dgelu's aux. */
	double aux_worst[sizeof(dtypes) / sizeof(dtypes[0])] = { 0 };
	unsigned aux_refused = 0;
	for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++) {
		const struct dt_case *dc = &dtypes[di];
		for (int tr = 0; tr < 4; tr++) {
			bool ta = tr & 1, tb = tr & 2;
			for (int with_bias = 0; with_bias < 2; with_bias++) {
				for (int variant = 0; variant < 3; variant++) {
					for (size_t si = 0; si < 2; si++) {
						int64_t M = shapes[si].m, N = shapes[si].n, K = shapes[si].k;
						int64_t pad = variant == 1 ? 8 : 0;
						int64_t aux_ld = (N + 7) / 8 * 8 + pad;
						bool refuse = variant == 2, with_c = (tr + si) % 2 == 1;
						if (refuse) {
							if (N % 8 == 0)
								continue;
							aux_ld = N;
						}
						enum rp_epilogue epi = with_bias ? RP_EPILOGUE_GELU_AUX_BIAS : RP_EPILOGUE_GELU_AUX;
						struct gt_mat a, b, c, d, bias, aux;
						int64_t ar = ta ? K : M, ac = ta ? M : K;
						int64_t br = tb ? N : K, bc = tb ? K : N;
						gt_mat_alloc(&t, &a, dc->in, ar, ac, ac + pad);
						gt_mat_alloc(&t, &b, dc->in, br, bc, bc + pad);
						gt_mat_alloc(&t, &d, dc->out, M, N, N + pad);
						gt_mat_alloc(&t, &aux, dc->out, M, N, aux_ld);
						gt_mat_fill(&a, ++s, 0);
						gt_mat_fill(&b, ++s, 0);
						gt_mat_poison(&d);
						gt_mat_poison(&aux);
						if (with_c) {
							gt_mat_alloc(&t, &c, dc->out, M, N, N + 2 * pad);
							gt_mat_fill(&c, ++s, 0);
						}
						if (with_bias) {
							gt_mat_alloc(&t, &bias, dc->out, 1, N, N);
							bias.is_vector = true;
							gt_mat_fill(&bias, ++s, 0);
						}
						double alpha = with_c ? 0.75 : 1.5, beta = with_c ? -0.5 : 0.0;
						struct rd_op op;
						gt_gemm(&op, &a, &b, with_c ? &c : NULL, &d, with_bias ? &bias : NULL, ta, tb, alpha,
							beta, epi, dc->compute);
						gt_gemm_set_aux_out(&op, &aux);
						int r = gt_run(&t, lane, &op, 60);
						double *ref = malloc(sizeof(double) * (size_t)(M * N));
						double *ref_pre = malloc(sizeof(double) * (size_t)(M * N));
						double rel = INFINITY, rel_pre = INFINITY;
						unsigned long nans = 0, pad_touched = 0, nans_pre = 0, pad_touched_pre = 0;
						bool ok;
						if (refuse) {
							cJSON *operand = op.err.params ? cJSON_GetObjectItem(op.err.params, "operand") : NULL;
							double *hd = gt_mat_download(&d), *ha = gt_mat_download(&aux);
							unsigned long written = 0;
							for (int64_t e = 0; e < M * d.ld; e++)
								written += !isnan(hd[e]);
							for (int64_t e = 0; e < M * aux.ld; e++)
								written += !isnan(ha[e]);
							free(hd);
							free(ha);
							ok = r != 0 && op.err.name && strcmp(op.err.name, RP_ERR_INVALID_OPERAND) == 0 &&
							     cJSON_IsString(operand) && strcmp(operand->valuestring, "aux_out") == 0 &&
							     written == 0;
							aux_refused += ok;
							rel = rel_pre = 0;
						} else {
							if (r == 0) {
								struct rd_op pre_op = op;
								gt_gemm_reference(&op, &a, &b, with_c ? &c : NULL, with_bias ? &bias : NULL,
										  ref, false);
								rel = gt_rel_error(&d, ref, &nans, &pad_touched);
								pre_op.compute.gemm.epilogue = with_bias ? RP_EPILOGUE_BIAS : RP_EPILOGUE_NONE;
								gt_gemm_reference(&pre_op, &a, &b, with_c ? &c : NULL,
										  with_bias ? &bias : NULL, ref_pre, false);
								rel_pre = gt_rel_error(&aux, ref_pre, &nans_pre, &pad_touched_pre);
							}
							ok = r == 0 && rel < dc->tol && rel_pre < dc->tol && nans == 0 && pad_touched == 0 &&
							     nans_pre == 0 && pad_touched_pre == 0;
							if (rel > aux_worst[di] || isnan(rel))
								aux_worst[di] = rel;
							if (rel_pre > aux_worst[di] || isnan(rel_pre))
								aux_worst[di] = rel_pre;
						}
						cases++;
						if (!ok) {
							failed++;
							if (failed <= 40)
								printf("FAIL %-9s %s%s C=%d epi=%s ld=%s aux_ld=%lld %lldx%lldx%lld: %s%s%s "
								       "rel D=%.3g aux_out=%.3g nan=%lu/%lu pad_touched=%lu/%lu tol=%.0e%s\n",
								       dc->name, ta ? "T" : "N", tb ? "T" : "N", with_c,
								       with_bias ? "gelu_aux_bias" : "gelu_aux", pad ? "padded" : "tight",
								       (long long)aux_ld, (long long)M, (long long)N, (long long)K,
								       gt_err_name(&op), r ? ": " : "", r ? gt_err_message(&op.err) : "", rel,
								       rel_pre, nans, nans_pre, pad_touched, pad_touched_pre, dc->tol,
								       refuse ? " (want InvalidOperand aux_out, D and aux_out untouched)" : "");
						}
						rp_error_clear(&op.err);
						free(ref);
						free(ref_pre);
						gt_mat_free(&t, &a);
						gt_mat_free(&t, &b);
						gt_mat_free(&t, &d);
						gt_mat_free(&t, &aux);
						if (with_c)
							gt_mat_free(&t, &c);
						if (with_bias)
							gt_mat_free(&t, &bias);
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
	for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
		printf("  dgelu %-9s worst rel error %.3g (tolerance %.0e)\n", dtypes[di].name, dgelu_worst[di],
		       dtypes[di].tol);
	printf("  dgelu: %u calls with an aux row stride off 8 refused by name\n", dgelu_refused);
	for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
		printf("  gelu_aux %-9s worst rel error of D and aux_out %.3g (tolerance %.0e)\n", dtypes[di].name,
		       aux_worst[di], dtypes[di].tol);
	printf("  gelu_aux: %u calls with an aux_out row stride off 8 refused by name\n", aux_refused);

	t.dev.backend->lane_destroy(lane);
	gt_close(&t);
	printf("%s: test_cuda_gemm\n", failed ? "FAIL" : "PASS");
	return failed ? 1 : 0;
}
