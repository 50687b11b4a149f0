/* SPDX-License-Identifier: Apache-2.0 */
// Attention with sequence lengths on the CUDA backend: the lengths a client
// hands over, bounded before cuDNN reads them, and the padding rows of the
// outputs written as the protocol defines them (cuDNN leaves o's undefined).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "kernels.h"

namespace {

/* Rows one block looks at: a tile of a (b, h) slice. */
constexpr int TILE_ROWS = 32;
constexpr int THREADS = 128;

__global__ void clamp_lengths(const int32_t *in_q, const int32_t *in_kv, int32_t *out_q, int32_t *out_kv, int64_t n,
			      int32_t max_q, int32_t max_kv)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int32_t q = in_q[i], kv = in_kv[i];
		out_q[i] = q < 0 ? 0 : q > max_q ? max_q : q;
		out_kv[i] = kv < 0 ? 0 : kv > max_kv ? max_kv : kv;
	}
}

__device__ void store(void *p, enum rk_dtype dt, int64_t at, float v)
{
	switch (dt) {
	case RK_F32: ((float *)p)[at] = v; break;
	case RK_F16: ((__half *)p)[at] = __float2half_rn(v); break;
	case RK_BF16: ((__nv_bfloat16 *)p)[at] = __float2bfloat16_rn(v); break;
	}
}

struct rows_set {
	struct rk_rows t[RK_ROWS_MAX];
};

/* blockIdx.y picks the tensor; the x blocks walk its (b, h, row tile)s.
 * A tile wholly inside its entry's length is left at once. */
__global__ void fill_padding_rows(rows_set set)
{
	const struct rk_rows &t = set.t[blockIdx.y];
	const int64_t B = t.dims[0], H = t.dims[1], S = t.dims[2], W = t.dims[3];
	const int64_t tiles_per_slice = (S + TILE_ROWS - 1) / TILE_ROWS, tiles = B * H * tiles_per_slice;

	for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
		const int64_t slice = tile / tiles_per_slice, b = slice / H, h = slice % H;
		const int64_t first = (tile % tiles_per_slice) * TILE_ROWS;
		const int64_t end = first + TILE_ROWS < S ? first + TILE_ROWS : S;
		const int64_t len = t.gate && t.gate[b] == 0 ? 0 : t.len[b];
		const int64_t from = len > first ? len : first;

		if (from >= end)
			continue;
		const int64_t base = b * t.strides[0] + h * t.strides[1];
		for (int64_t e = threadIdx.x; e < (end - from) * W; e += blockDim.x) {
			const int64_t i = from + e / W, w = e % W;
			store(t.p, t.dtype, base + i * t.strides[2] + w * t.strides[3], t.value);
		}
	}
}

unsigned blocks_for(int64_t n, int64_t per_block)
{
	int64_t blocks = (n + per_block - 1) / per_block;
	if (blocks > 65535)
		blocks = 65535;
	return blocks < 1 ? 1u : (unsigned)blocks;
}

} // namespace

extern "C" cudaError_t rk_clamp_lengths(const int32_t *in_q, const int32_t *in_kv, int32_t *out_q, int32_t *out_kv,
				       int64_t n, int32_t max_q, int32_t max_kv, cudaStream_t stream)
{
	if (n <= 0)
		return cudaErrorInvalidValue;
	/* An earlier failed runtime call's error, read off first: the check
	 * after the launch is this launch's alone. */
	(void)cudaGetLastError();
	clamp_lengths<<<blocks_for(n, 256), 256, 0, stream>>>(in_q, in_kv, out_q, out_kv, n, max_q, max_kv);
	return cudaGetLastError();
}

extern "C" cudaError_t rk_fill_padding_rows(const struct rk_rows *t, int n, cudaStream_t stream)
{
	rows_set set = {};
	int64_t most = 0;

	if (n < 1 || n > RK_ROWS_MAX)
		return cudaErrorInvalidValue;
	for (int i = 0; i < n; i++) {
		if (t[i].dtype != RK_F32 && t[i].dtype != RK_F16 && t[i].dtype != RK_BF16)
			return cudaErrorInvalidValue;
		set.t[i] = t[i];
		int64_t tiles = t[i].dims[0] * t[i].dims[1] * ((t[i].dims[2] + TILE_ROWS - 1) / TILE_ROWS);
		most = tiles > most ? tiles : most;
	}
	dim3 grid(blocks_for(most, 1), (unsigned)n);
	(void)cudaGetLastError();   /* as in rk_clamp_lengths */
	fill_padding_rows<<<grid, THREADS, 0, stream>>>(set);
	return cudaGetLastError();
}
