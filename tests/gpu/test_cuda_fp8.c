/* SPDX-License-Identifier: Apache-2.0 */
/* FP8 through rd_backend_cuda from C, as the worker core drives it (each
 * descriptor through rp_compute_check, then the lane): Quantize and
 * TransposeQuantize byte for byte against tests/lib's own codec of the f32
 * product (bf16, f16, f32 inputs; e4m3, e5m2; padded rows; odd shapes),
 * amax exactly; the cuBLASLt FP8 GEMM (e4m3 x e4m3, e5m2 x e4m3; into bf16,
 * f16, f32, e4m3 and e5m2 with d_scale and amax_d; scales apart, or packed
 * at addresses cuBLASLt does not take, as regen.torch.fp8's scale_inv[1])
 * against float64 of the dequantized operands, within the FP8 tensor
 * cores' accumulation error (ACC_EPS) and one rounding into D's format,
 * a bound each case checks a scale off by 2 would fail; ScaleUpdate in
 * place, bit for bit against the host backend's
 * (Transformer Engine's formula); an FP8 row stride cuBLASLt cannot take
 * refused by name. Fresh random inputs (seed printed; REGEN_TEST_SEED
 * repeats it). Exit 77 without a GPU. */
#include "gpu_common.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/host/fp8.h"
#include "proto/errors.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"

static void put(struct rd_op *op, int slot, struct gt_mat *m, uint32_t serial)
{
	gt_operand(&op->compute.operands[slot], m);
	op->compute.operands[slot].buffer.serial = serial;
	op->compute.present[slot] = true;
	op->buffers[slot] = m->buf;
}

static void vec_alloc(struct gt *t, struct gt_mat *m, int64_t n)
{
	gt_mat_alloc(t, m, RP_DTYPE_F32, 1, n, n);
	m->is_vector = true;
}

static bool checked(struct rd_op *op, const char *label)
{
	struct rp_error err = { 0 };
	bool ok = rp_compute_check(&op->compute, &err) == 0;

	if (!ok) {
		gt_failures++;
		printf("  FAIL: %s: refused by the parser: %s: %s\n", label, err.name, gt_err_message(&err));
	}
	rp_error_clear(&err);
	return ok;
}

static void *download(const struct gt_mat *m)
{
	void *h = malloc(m->bytes);
	if (!h)
		exit(1);
	if (cudaMemcpy(h, m->ptr, m->bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
		exit(1);
	return h;
}

static void upload(struct gt_mat *m, const void *h)
{
	if (cudaMemcpy(m->ptr, h, m->bytes, cudaMemcpyHostToDevice) != cudaSuccess)
		exit(1);
}

static void set_f32(struct gt_mat *m, float v)
{
	upload(m, &v);
}

static float get_f32(const struct gt_mat *m)
{
	float v;
	if (cudaMemcpy(&v, m->ptr, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
		exit(1);
	return v;
}

/* Random FP8 bytes over [-2^e, 2^e) values for e in [-3, 6]. */
static void fill_fp8(struct gt_mat *m, struct tl_rng *r)
{
	uint8_t *h = malloc(m->bytes);
	for (size_t i = 0; i < m->bytes; i++)
		h[i] = tl_fp8_encode(m->dt, ldexp(tl_rng_uniform(r, -1, 1), (int)tl_rng_int(r, -3, 6)));
	upload(m, h);
	free(h);
}

static void quantize_case(struct gt *t, struct rd_lane *lane, enum rp_dtype xt, enum rp_dtype yt, int64_t rows,
			  int64_t cols, int64_t pad, struct tl_rng *r, uint64_t *seed)
{
	struct gt_mat x, s, y, yt_, amax;
	struct rd_op op;
	char label[128];

	snprintf(label, sizeof(label), "quantize %s -> %s [%lld, %lld] pad %lld", rp_dtype_name(xt), rp_dtype_name(yt),
		 (long long)rows, (long long)cols, (long long)pad);
	gt_mat_alloc(t, &x, xt, rows, cols, cols + pad);
	gt_mat_alloc(t, &y, yt, rows, cols, cols + pad);
	gt_mat_alloc(t, &yt_, yt, cols, rows, rows + pad);
	vec_alloc(t, &s, 1);
	vec_alloc(t, &amax, 1);
	gt_mat_fill(&x, ++*seed, 1);
	const float scale = (float)ldexp(tl_rng_uniform(r, 0.5, 1), (int)tl_rng_int(r, -2, 9));
	set_f32(&s, scale);
	memset(&op, 0, sizeof(op));
	op.compute.spec = &rp_op_transpose_quantize;
	put(&op, RP_QUANT_X, &x, 1);
	put(&op, RP_QUANT_SCALE, &s, 2);
	put(&op, RP_QUANT_Y, &y, 3);
	put(&op, RP_QUANT_AMAX, &amax, 4);
	put(&op, RP_QUANT_Y_T, &yt_, 5);
	if (checked(&op, label) && gt_run(t, lane, &op, 30) == 0) {
		double *hx = gt_mat_download(&x);
		uint8_t *hy = download(&y), *hyt = download(&yt_);
		unsigned long wrong = 0;
		double want_amax = 0;

		for (int64_t i = 0; i < rows; i++) {
			for (int64_t j = 0; j < cols; j++) {
				const float v = (float)hx[i * (cols + pad) + j];
				const uint8_t want = tl_fp8_encode(yt, (double)(v * scale));

				wrong += hy[i * (cols + pad) + j] != want;
				wrong += hyt[j * (rows + pad) + i] != want;
				want_amax = fmax(want_amax, fabs(v));
			}
		}
		GT_CHECK(wrong == 0, "%s: %lu bytes differ from the reference", label, wrong);
		GT_CHECK(get_f32(&amax) == (float)want_amax, "%s: amax %g, want %g", label, (double)get_f32(&amax),
			 want_amax);
		free(hx);
		free(hy);
		free(hyt);
	} else {
		GT_CHECK(0, "%s: %s", label, gt_err_message(&op.err));
	}
	gt_mat_free(t, &x);
	gt_mat_free(t, &y);
	gt_mat_free(t, &yt_);
	gt_mat_free(t, &s);
	gt_mat_free(t, &amax);
}

/* TransposeQuantize's kernel alone on a model's shapes (y, y_t and amax,
 * bf16 in), on a stream of this test: µs per call averaged, and the
 * bandwidth of its bytes (x read, y and y_t written). */
static void quantize_timing(int64_t rows, int64_t cols)
{
	cudaStream_t s;
	cudaEvent_t e0, e1;
	void *x = NULL, *y = NULL, *y_t = NULL;
	float *scale = NULL, *amax = NULL, ms = 0, one = 1.0f;
	const int reps = 20;

	CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CUDA_OK(cudaEventCreate(&e0));
	CUDA_OK(cudaEventCreate(&e1));
	CUDA_OK(cudaMalloc(&x, (size_t)(rows * cols) * 2));
	CUDA_OK(cudaMalloc(&y, (size_t)(rows * cols)));
	CUDA_OK(cudaMalloc(&y_t, (size_t)(rows * cols)));
	CUDA_OK(cudaMalloc((void **)&scale, sizeof(float)));
	CUDA_OK(cudaMalloc((void **)&amax, sizeof(float)));
	CUDA_OK(cudaMemset(x, 0x3c, (size_t)(rows * cols) * 2));
	CUDA_OK(cudaMemcpy(scale, &one, sizeof(one), cudaMemcpyHostToDevice));
	const struct rk_quantize a = { .dtype = RK_BF16, .rows = rows, .cols = cols, .x_ld = cols, .y_ld = cols,
				       .y_t_ld = rows, .x = x, .scale = scale, .y = y, .y_t = y_t, .amax = amax };
	CUDA_OK(rk_quantize(&a, s));
	CUDA_OK(cudaEventRecord(e0, s));
	for (int i = 0; i < reps; i++)
		CUDA_OK(rk_quantize(&a, s));
	CUDA_OK(cudaEventRecord(e1, s));
	CUDA_OK(cudaEventSynchronize(e1));
	CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
	const double us = 1e3 * ms / reps, bytes = (double)rows * (double)cols * 4;
	printf("  timing transpose_quantize bf16 [%lld, %lld]: %.1f us/call (%.0f GB/s of x, y and y_t)\n",
	       (long long)rows, (long long)cols, us, bytes / (us * 1e3));
	cudaFree(x);
	cudaFree(y);
	cudaFree(y_t);
	cudaFree(scale);
	cudaFree(amax);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaStreamDestroy(s);
}

/* The accumulation's error bound, relative to sum_k |a_k b_k| (of the
 * dequantized operands): Hopper's FP8 tensor cores keep about 14 bits of
 * the running sum (DeepSeek-V3's report, arXiv 2412.19437, 3.3.2: "limited
 * to retaining around 14 bits" on H800), and cuBLASLt, fast accumulation
 * off (CUBLASLT_MATMUL_DESC_FAST_ACCUM 0: "intermediate results will ...
 * periodically be promoted to a higher precision"), promotes the partial
 * sums to f32 every few MMAs. So the error is about 2^-13 of the sum of
 * the magnitudes per addition before a promotion, not f32's 2^-24 of the
 * result. An H100's first run, measured against f32's bound (an e4m3 D 8
 * "ulps" off near zero, amax_d 1.4e-4 off, an f32 D 2.5e-4 off in norm),
 * comes to about 2^-14 of sum |a b| for these inputs' magnitudes (an
 * estimate: the run kept no per-element data). 2^-9 leaves a factor of 16
 * or more; each case checks that a scale off by 2 still fails it. */
#define ACC_EPS 0x1p-9
/* With fast accumulation (compute fp8_fast_accum) the partial sums are
 * never promoted: about 2^-14 of the running sum per addition over all
 * of K. DeepSeek-V3's report (H800) measured up to 2% of the result at
 * K 4096; against the sum of magnitudes, which bounds the running sum,
 * 2^-7 holds that with room. */
#define FAST_ACC_EPS 0x1p-7

/* Half an ulp, relative (the unit roundoff), of D's format, and half its
 * smallest subnormal (the absolute rounding error near zero). */
static double unit_roundoff(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_E4M3: return 0x1p-4;
	case RP_DTYPE_E5M2: return 0x1p-3;
	case RP_DTYPE_BF16: return 0x1p-8;
	case RP_DTYPE_F16: return 0x1p-11;
	default: return 0x1p-24;
	}
}

static double half_subnormal(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_E4M3: return 0x1p-10;
	case RP_DTYPE_E5M2: return 0x1p-17;
	case RP_DTYPE_F16: return 0x1p-25;
	default: return 0;
	}
}

/* An f32 [1] operand at element `index` of vector m (a scale packed with
 * others, as a ScaleUpdate's scale_inv holds them). */
static void put_scalar(struct rd_op *op, int slot, struct gt_mat *m, uint32_t serial, int index)
{
	put(op, slot, m, serial);
	op->compute.operands[slot].shape[0] = 1;
	op->compute.operands[slot].offset = (uint64_t)index * sizeof(float);
}

static void set_f32_at(struct gt_mat *m, int index, float v)
{
	if (cudaMemcpy((float *)m->ptr + index, &v, 4, cudaMemcpyHostToDevice) != cudaSuccess)
		exit(1);
}

static float get_f32_at(const struct gt_mat *m, int index)
{
	float v;
	if (cudaMemcpy(&v, (const float *)m->ptr + index, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
		exit(1);
	return v;
}

/* Where the scales and amax_d lie in their vector: each its own (index 0
 * of a vector of one), or packed in one vector at 4, 8, 12 and 20 bytes,
 * none 16-byte aligned (cuBLASLt takes them only so: the backend stages
 * them). */
enum scales { SCALES_APART, SCALES_PACKED };
static const int packed_at[4] = { 1, 2, 3, 5 };

static void gemm_case(struct gt *t, struct rd_lane *lane, enum rp_dtype at, enum rp_dtype bt, enum rp_dtype dt,
		      int64_t M, int64_t N, int64_t K, enum scales where, enum rp_compute_mode compute,
		      struct tl_rng *r)
{
	struct gt_mat a, b, d, sv[4];
	struct rd_op op;
	char label[160];
	const bool fp8_d = rp_dtype_is_fp8(dt), packed = where == SCALES_PACKED;
	const int64_t lda = (K + 31) / 16 * 16;
	enum { SA, SB, SD, AMAX };
	int idx[4] = { 0, 0, 0, 0 };

	const bool fast = compute == RP_COMPUTE_FP8_FAST_ACCUM;
	const double acc_eps = fast ? FAST_ACC_EPS : ACC_EPS;

	snprintf(label, sizeof(label), "gemm %s x %s -> %s [%lld, %lld, %lld]%s%s", rp_dtype_name(at),
		 rp_dtype_name(bt), rp_dtype_name(dt), (long long)M, (long long)N, (long long)K,
		 packed ? ", scales and amax_d at 4, 8, 12, 20 bytes" : "", fast ? ", fast accumulation" : "");
	gt_mat_alloc(t, &a, at, M, K, lda);
	gt_mat_alloc(t, &b, bt, N, K, K);
	gt_mat_alloc(t, &d, dt, M, N, fp8_d ? (N + 15) / 16 * 16 : N);
	if (packed) {
		vec_alloc(t, &sv[0], 8);
		if (cudaMemset(sv[0].ptr, 0, sv[0].bytes) != cudaSuccess)
			exit(1);
		for (int i = 0; i < 4; i++) {
			sv[i] = sv[0];
			idx[i] = packed_at[i];
		}
	} else {
		for (int i = 0; i < 4; i++)
			vec_alloc(t, &sv[i], 1);
	}
	fill_fp8(&a, r);
	fill_fp8(&b, r);
	const float scale_a = (float)tl_rng_uniform(r, 0.01, 1), scale_b = (float)tl_rng_uniform(r, 0.01, 1);
	set_f32_at(&sv[SA], idx[SA], scale_a);
	set_f32_at(&sv[SB], idx[SB], scale_b);
	uint8_t *ha = download(&a), *hb = download(&b);
	/* The product of the dequantized operands in float64, and the sum of
	 * its terms' magnitudes (the accumulation's error scale). */
	double *ref = malloc((size_t)(M * N) * sizeof(double)), *mag = malloc((size_t)(M * N) * sizeof(double));
	double ref_amax = 0, mag_max = 0;
	for (int64_t i = 0; i < M; i++) {
		for (int64_t j = 0; j < N; j++) {
			double acc = 0, sum_abs = 0;
			for (int64_t q = 0; q < K; q++) {
				const double p = tl_fp8_decode(at, ha[i * lda + q]) * tl_fp8_decode(bt, hb[j * K + q]);
				acc += p;
				sum_abs += fabs(p);
			}
			ref[i * N + j] = acc * scale_a * scale_b;
			mag[i * N + j] = sum_abs * scale_a * scale_b;
			ref_amax = fmax(ref_amax, fabs(ref[i * N + j]));
			mag_max = fmax(mag_max, mag[i * N + j]);
		}
	}
	const float scale_d = fp8_d ? (float)(rp_fp8_max(dt) / 2 / ref_amax) : 1.0f;
	set_f32_at(&sv[SD], idx[SD], scale_d);
	set_f32_at(&sv[AMAX], idx[AMAX], -1.0f);
	memset(&op, 0, sizeof(op));
	op.compute.spec = &rp_op_gemm;
	put(&op, RP_GEMM_A, &a, 1);
	put(&op, RP_GEMM_B, &b, 2);
	put(&op, RP_GEMM_D, &d, 3);
	/* One buffer, one serial, when packed. */
	put_scalar(&op, RP_GEMM_A_SCALE, &sv[SA], packed ? 4 : 4 + SA, idx[SA]);
	put_scalar(&op, RP_GEMM_B_SCALE, &sv[SB], packed ? 4 : 4 + SB, idx[SB]);
	if (fp8_d) {
		put_scalar(&op, RP_GEMM_D_SCALE, &sv[SD], packed ? 4 : 4 + SD, idx[SD]);
		put_scalar(&op, RP_GEMM_AMAX_D, &sv[AMAX], packed ? 4 : 4 + AMAX, idx[AMAX]);
	}
	op.compute.gemm = (struct rp_gemm){ .trans_b = true, .alpha = 1.0, .compute = compute };
	if (checked(&op, label) && gt_run(t, lane, &op, 60) == 0) {
		unsigned char *hd = download(&d);
		const double u = unit_roundoff(dt), tiny = half_subnormal(dt);
		/* Each element within the accumulation's error, then one
		 * rounding into D's format; and the same bound against what a
		 * scale off by 2 would give (|2 want - want|), which must fail
		 * it somewhere: the bound is not so loose that a wrong scale or
		 * layout passes. */
		double worst = 0, scale_off_by_2 = 0;
		for (int64_t i = 0; i < M; i++) {
			for (int64_t j = 0; j < N; j++) {
				const double got = tl_load(dt, hd, (size_t)(i * d.ld + j)), want = ref[i * N + j] * scale_d;
				const double acc = acc_eps * mag[i * N + j] * scale_d;
				const double bound = acc + u * (fabs(want) + acc) + tiny;

				worst = fmax(worst, fabs(got - want) / bound);
				scale_off_by_2 = fmax(scale_off_by_2, fabs(want) / bound);
			}
		}
		GT_CHECK(worst <= 1.0, "%s: an element is %.3g of its bound off (accumulation %g of sum |a b|, then "
			 "one rounding into %s)", label, worst, acc_eps, rp_dtype_name(dt));
		GT_CHECK(scale_off_by_2 > 1.0, "%s: the bound passes a scale off by 2 (at worst %.3g of it)", label,
			 scale_off_by_2);
		if (fp8_d) {
			/* amax_d is of the result before d_scale, from the same
			 * accumulation; with d_scale applied it would be off by
			 * d_scale (> 2 here). */
			const double got_amax = get_f32_at(&sv[AMAX], idx[AMAX]);
			GT_CHECK(fabs(got_amax - ref_amax) <= acc_eps * mag_max, "%s: amax_d %.9g, want %.9g within %.3g",
				 label, got_amax, ref_amax, acc_eps * mag_max);
		}
		if (packed) {
			/* The backend's staging copies out, never in place. */
			GT_CHECK(get_f32_at(&sv[SA], idx[SA]) == scale_a && get_f32_at(&sv[SB], idx[SB]) == scale_b &&
					 get_f32_at(&sv[SD], idx[SD]) == scale_d && get_f32_at(&sv[0], 0) == 0.0f &&
					 get_f32_at(&sv[0], 4) == 0.0f,
				 "%s: the packed scales or their neighbours changed", label);
		}
		free(hd);
	} else {
		GT_CHECK(0, "%s: %s", label, gt_err_message(&op.err));
	}
	free(ha);
	free(hb);
	free(ref);
	free(mag);
	gt_mat_free(t, &a);
	gt_mat_free(t, &b);
	gt_mat_free(t, &d);
	for (int i = 0; i < (packed ? 1 : 4); i++)
		gt_mat_free(t, &sv[i]);
}

static void scale_update_case(struct gt *t, struct rd_lane *lane, int64_t H, int64_t N, bool recent, struct tl_rng *r)
{
	struct gt_mat h, s, si;
	struct rd_op op;
	char label[96];

	snprintf(label, sizeof(label), "scale_update [%lld, %lld]%s", (long long)H, (long long)N,
		 recent ? " most_recent" : "");
	gt_mat_alloc(t, &h, RP_DTYPE_F32, H, N, N);
	vec_alloc(t, &s, N);
	vec_alloc(t, &si, N);
	float *hh = malloc(h.bytes), *hs = malloc(s.bytes), *want_si = malloc(s.bytes);
	for (int64_t i = 0; i < H * N; i++)
		hh[i] = i % N == 0 ? 0.0f : (float)ldexp(tl_rng_uniform(r, 0, 1), (int)tl_rng_int(r, -130, 20));
	for (int64_t n = 0; n < N; n++)
		hs[n] = (float)tl_rng_uniform(r, 0.5, 100);
	upload(&h, hh);
	upload(&s, hs);
	memset(&op, 0, sizeof(op));
	op.compute.spec = &rp_op_scale_update;
	put(&op, RP_SCU_AMAX_HISTORY, &h, 1);
	put(&op, RP_SCU_SCALE, &s, 2);
	put(&op, RP_SCU_AMAX_HISTORY_OUT, &h, 1);
	put(&op, RP_SCU_SCALE_OUT, &s, 2);
	put(&op, RP_SCU_SCALE_INV, &si, 3);
	op.compute.scale_update = (struct rp_scale_update){ .format = RP_FP8_E4M3, .margin = 1,
							   .amax_compute = recent ? RP_AMAX_COMPUTE_MOST_RECENT
									     : RP_AMAX_COMPUTE_MAX };
	if (checked(&op, label)) {
		/* The host backend's answer, in place on host copies. */
		void *p[RP_OP_OPERANDS_MAX] = { hh, hs, hh, hs, want_si };
		rd_host_scale_update(&op.compute, p);
		if (gt_run(t, lane, &op, 30) == 0) {
			float *gh = download(&h), *gs = download(&s), *gsi = download(&si);
			GT_CHECK(memcmp(gh, hh, h.bytes) == 0, "%s: history differs from the host's", label);
			GT_CHECK(memcmp(gs, hs, s.bytes) == 0, "%s: scales differ from the host's", label);
			GT_CHECK(memcmp(gsi, want_si, s.bytes) == 0, "%s: scale_inv differs from the host's", label);
			free(gh);
			free(gs);
			free(gsi);
		} else {
			GT_CHECK(0, "%s: %s", label, gt_err_message(&op.err));
		}
	}
	free(hh);
	free(hs);
	free(want_si);
	gt_mat_free(t, &h);
	gt_mat_free(t, &s);
	gt_mat_free(t, &si);
}

/* A row stride cuBLASLt's FP8 kernels cannot read, refused by name. */
static void refusal(struct gt *t, struct rd_lane *lane)
{
	struct gt_mat a, b, d, sa, sb;
	struct rd_op op;

	gt_mat_alloc(t, &a, RP_DTYPE_E4M3, 32, 40, 40);
	gt_mat_alloc(t, &b, RP_DTYPE_E4M3, 32, 40, 48);
	gt_mat_alloc(t, &d, RP_DTYPE_BF16, 32, 32, 32);
	vec_alloc(t, &sa, 1);
	vec_alloc(t, &sb, 1);
	memset(&op, 0, sizeof(op));
	op.compute.spec = &rp_op_gemm;
	put(&op, RP_GEMM_A, &a, 1);
	put(&op, RP_GEMM_B, &b, 2);
	put(&op, RP_GEMM_D, &d, 3);
	put(&op, RP_GEMM_A_SCALE, &sa, 4);
	put(&op, RP_GEMM_B_SCALE, &sb, 5);
	op.compute.gemm = (struct rp_gemm){ .trans_b = true, .alpha = 1.0 };
	if (checked(&op, "a row stride of 40")) {
		GT_CHECK(gt_run(t, lane, &op, 30) != 0 && strcmp(gt_err_name(&op), RP_ERR_INVALID_OPERAND) == 0,
			 "an FP8 a with a row stride of 40 is refused with InvalidOperand (got %s)", gt_err_name(&op));
	}
	struct gt_mat *all[] = { &a, &b, &d, &sa, &sb };
	for (size_t i = 0; i < 5; i++)
		gt_mat_free(t, all[i]);
}

int main(void)
{
	if (gt_have_gpu())
		return GT_SKIP;
	struct gt t;
	uint64_t seed;
	struct rd_lane *lane = gt_start(&t, "test_cuda_fp8", &seed);
	struct tl_rng r;

	tl_rng_init(&r, seed);
	quantize_case(&t, lane, RP_DTYPE_BF16, RP_DTYPE_E4M3, 1, 1, 0, &r, &seed);
	quantize_case(&t, lane, RP_DTYPE_F16, RP_DTYPE_E5M2, 33, 47, 3, &r, &seed);
	quantize_case(&t, lane, RP_DTYPE_F32, RP_DTYPE_E4M3, 1000, 2049, 0, &r, &seed);
	quantize_case(&t, lane, RP_DTYPE_BF16, RP_DTYPE_E4M3, 4096, 768, 16, &r, &seed);
	/* Whole 64 x 64 tiles with aligned rows: the tiled kernel. */
	quantize_case(&t, lane, RP_DTYPE_F32, RP_DTYPE_E4M3, 512, 256, 0, &r, &seed);
	quantize_case(&t, lane, RP_DTYPE_F16, RP_DTYPE_E5M2, 256, 512, 16, &r, &seed);
	quantize_case(&t, lane, RP_DTYPE_BF16, RP_DTYPE_E5M2, 8192, 2048, 0, &r, &seed);
	quantize_timing(8192, 2048);
	quantize_timing(8192, 8192);
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_BF16, 128, 96, 64, SCALES_APART, RP_COMPUTE_F32, &r);
	gemm_case(&t, lane, RP_DTYPE_E5M2, RP_DTYPE_E4M3, RP_DTYPE_F32, 256, 128, 512, SCALES_APART, RP_COMPUTE_F32, &r);
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_E4M3, 512, 256, 1024, SCALES_APART, RP_COMPUTE_F32, &r);
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E5M2, RP_DTYPE_BF16, 33, 48, 80, SCALES_APART, RP_COMPUTE_F32, &r);
	/* regen.torch.fp8's forward: b_scale is scale_inv[1]. */
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_BF16, 256, 128, 256, SCALES_PACKED, RP_COMPUTE_F32, &r);
	gemm_case(&t, lane, RP_DTYPE_E5M2, RP_DTYPE_E4M3, RP_DTYPE_E5M2, 64, 96, 128, SCALES_PACKED, RP_COMPUTE_F32, &r);
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_F16, 64, 32, 96, SCALES_PACKED, RP_COMPUTE_F32, &r);
	/* Transformer Engine's forward GEMM: fast accumulation, K up to 4096. */
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_BF16, 256, 128, 4096, SCALES_PACKED,
		  RP_COMPUTE_FP8_FAST_ACCUM, &r);
	gemm_case(&t, lane, RP_DTYPE_E4M3, RP_DTYPE_E4M3, RP_DTYPE_E4M3, 128, 64, 512, SCALES_APART,
		  RP_COMPUTE_FP8_FAST_ACCUM, &r);
	scale_update_case(&t, lane, 1, 5, false, &r);
	scale_update_case(&t, lane, 1024, 37, false, &r);
	scale_update_case(&t, lane, 300, 8, true, &r);
	refusal(&t, lane);
	t.dev.backend->lane_destroy(lane);
	gt_close(&t);
	if (gt_failures) {
		printf("test_cuda_fp8: %d failures (seed %llu)\n", gt_failures, (unsigned long long)seed);
		return 1;
	}
	printf("test_cuda_fp8: PASS\n");
	return 0;
}
