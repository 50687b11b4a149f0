/* SPDX-License-Identifier: Apache-2.0 */
/* Kernels regen launches itself: fills and comparisons for the GPU tests,
 * the canary the backend runs after a reset, the fault-injection kernels
 * (illegal address, spin), attention's sequence-length helpers,
 * LayerNorm forward and backward, and FP8's quantize and scale update. Plain C API; every function enqueues on
 * `stream` and returns the launch's cudaError_t (cudaGetLastError after the
 * launch), so callers check each one. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, numbered like enum rp_dtype (f32, f16, bf16). */
enum rk_dtype { RK_F32 = 0, RK_F16 = 1, RK_BF16 = 2 };

/* The value rk_fill_uniform() writes at index i before conversion to the
 * element type: a hash of (seed, i) mapped to k / 2^23 - 1 for an integer k
 * in [0, 2^24), so every value is exact in f32 and host and device agree
 * bit for bit. Scaled by 2^scale_log2 (exact too). */
#ifdef __CUDACC__
#define RK_HOST_DEVICE __host__ __device__
#else
#define RK_HOST_DEVICE
#endif

static inline RK_HOST_DEVICE float rk_uniform_value(uint64_t seed, uint64_t i, int scale_log2)
{
	uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	int32_t k = (int32_t)(z >> 40);                   /* [0, 2^24) */
	float v = (float)(k - (1 << 23)) * (1.0f / 8388608.0f); /* [-1, 1) exact */
	while (scale_log2 > 0) { v *= 2.0f; scale_log2--; }
	while (scale_log2 < 0) { v *= 0.5f; scale_log2++; }
	return v;
}

/* p[i] = rk_uniform_value(seed, i, scale_log2) converted (round to nearest
 * even) to `dtype`, for i in [0, n). Never zero-filled: a zero appears only
 * where the hash gives exactly 2^23. */
cudaError_t rk_fill_uniform(void *p, size_t n, enum rk_dtype dtype, uint64_t seed, int scale_log2, cudaStream_t stream);

/* Poisons n elements of `dtype` with a quiet NaN. */
cudaError_t rk_fill_nan(void *p, size_t n, enum rk_dtype dtype, cudaStream_t stream);

/* Counts 32-bit words that differ bitwise between a and b (nbytes a
 * multiple of 4) into *d_count (device memory, accumulated: zero it first). */
cudaError_t rk_count_mismatch(const void *a, const void *b, size_t nbytes, unsigned long long *d_count, cudaStream_t stream);

/* Writes through a wild pointer: the context gets a sticky
 * cudaErrorIllegalAddress at the next synchronisation. */
cudaError_t rk_illegal_address(cudaStream_t stream);

/* The faults bench_fault_latency times: each kernel first sets *ran
 * (host-mapped memory, device pointer) to 1 and makes it visible to the
 * host, then faults one way. */
enum rk_fault_kind {
	RK_FAULT_STORE_UNMAPPED, /* a store to an address nothing maps: an MMU fault */
	RK_FAULT_LOAD_UNMAPPED,  /* a load from one */
	RK_FAULT_TRAP,           /* the trap instruction: an SM exception, no MMU */
	RK_FAULT_MISALIGNED,     /* a misaligned 8-byte store to mapped memory */
};
cudaError_t rk_fault_after_flag(enum rk_fault_kind kind, volatile int *ran, void *mapped, cudaStream_t stream);

/* Spins until *flag (host-mapped memory, device pointer) is non-zero or
 * max_ns nanoseconds of the GPU's global timer passed. */
cudaError_t rk_spin(const volatile int *flag, uint64_t max_ns, cudaStream_t stream);

/* Attention's sequence lengths (the CUDA backend): copies n entries of
 * in_q and in_kv to out_q and out_kv, each clamped into [0, max_q] or
 * [0, max_kv], so that whatever a client wrote, what cuDNN reads next
 * stays inside the operands. */
cudaError_t rk_clamp_lengths(const int32_t *in_q, const int32_t *in_kv, int32_t *out_q, int32_t *out_kv, int64_t n,
			     int32_t max_q, int32_t max_kv, cudaStream_t stream);

/* A tensor [B, H, S, W] (element strides) whose rows i >= len[b] (len:
 * B device int32s, each in [0, S]) are set to `value`; with `gate`, every
 * row of an entry whose gate[b] is 0 too (a key's gradient in an entry
 * without queries). */
#define RK_ROWS_MAX 3
struct rk_rows {
	void *p;
	enum rk_dtype dtype;
	int64_t dims[4];
	int64_t strides[4];
	const int32_t *len, *gate;
	float value;
};

/* Writes the padding rows of n (1 to RK_ROWS_MAX) tensors, in one launch. */
cudaError_t rk_fill_padding_rows(const struct rk_rows *t, int n, cudaStream_t stream);

/* LayerNorm over the last dimension of x [rows, n] (row stride x_ld, last
 * stride 1): y = (x - mean) rstd weight + bias, each row's mean and biased
 * variance in f32, rstd = 1 / sqrt(variance + eps). x, weight, bias and y
 * are of `dtype`, weight and bias [n] contiguous; bias, mean and rstd (f32
 * [rows]) may be NULL. Every pointer aligned to its element's size. */
#define RK_LAYER_NORM_N_MAX 65536
struct rk_layer_norm {
	enum rk_dtype dtype;
	int64_t rows, n;
	const void *x, *weight, *bias;
	void *y;
	int64_t x_ld, y_ld;
	float *mean, *rstd;
	float eps;
};
cudaError_t rk_layer_norm(const struct rk_layer_norm *args, cudaStream_t stream);

/* Its gradients from the forward's x, weight, mean and rstd and d_y:
 * d_x = rstd (g - mean(g) - xhat mean(g xhat)) (+ d_residual), g = d_y
 * weight, xhat = (x - mean) rstd; d_x may be d_residual exactly. d_weight
 * = sum over rows of d_y xhat and d_bias = sum of d_y (either may be NULL)
 * go through `partial`, f32 scratch of rk_layer_norm_backward_scratch()
 * bytes (NULL when neither is wanted). Every tensor of `dtype` but the
 * statistics and the scratch. */
struct rk_layer_norm_backward {
	enum rk_dtype dtype;
	int64_t rows, n;
	const void *d_y, *x, *weight, *d_residual;
	const float *mean, *rstd;
	void *d_x, *d_weight, *d_bias;
	int64_t d_y_ld, x_ld, d_x_ld, d_residual_ld;
	float *partial;
};
size_t rk_layer_norm_backward_scratch(int64_t rows, int64_t n);
cudaError_t rk_layer_norm_backward(const struct rk_layer_norm_backward *args, cudaStream_t stream);

/* FP8 (kernels/fp8.cu). Quantize and TransposeQuantize: y (optional) and
 * y_t (optional) = fp8(x * *scale), round to nearest even, saturating;
 * *amax (optional) = max |x|. x [rows, cols] of `dtype`, rows x_ld apart;
 * y rows y_ld apart; y_t [cols, rows], rows y_t_ld apart. e5m2 picks the
 * format (else e4m3). rows and cols each below 2^31 * 32 (the grid's). */
struct rk_quantize {
	enum rk_dtype dtype;
	int e5m2;
	int64_t rows, cols, x_ld, y_ld, y_t_ld;
	const void *x;
	const float *scale;
	void *y, *y_t;
	float *amax;
};
cudaError_t rk_quantize(const struct rk_quantize *args, cudaStream_t stream);

/* ScaleUpdate over n columns of a [history, n] amax history (rows *_ld
 * apart; out may be the input), scale_out = scaled_max / amax (the
 * column's max, or row 0 when most_recent) or the old scale, FLT_MAX for
 * an infinite quotient; scale_inv (optional) its reciprocal. scaled_max is
 * fp8_max * 2^-margin, in f32. */
struct rk_scale_update {
	int64_t history, n, history_ld, history_out_ld;
	int most_recent;
	float scaled_max;
	const float *amax_history, *scale;
	float *amax_history_out, *scale_out, *scale_inv;
};
cudaError_t rk_scale_update(const struct rk_scale_update *args, cudaStream_t stream);

/* Runs a small kernel with a known answer on `stream`, copies it back and
 * checks it; synchronises the stream. cudaSuccess when the answer was right,
 * cudaErrorUnknown when it ran but was wrong, else the CUDA error. */
cudaError_t rk_canary(cudaStream_t stream);

#ifdef __cplusplus
}
#endif
