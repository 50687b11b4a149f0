/* SPDX-License-Identifier: Apache-2.0 */
// FP8 scaling on the CUDA backend: Quantize and TransposeQuantize
// (io.regen.Compute), and the delayed-scaling update (ScaleUpdate), as
// proto/compute_fp8.c defines them.
//
// Quantize: a matrix of whole 64 x 64 tiles with aligned rows (a model's
// Linears) goes to fp8_quantize.cuh's kernel, vectors in and out; any other
// goes to tiles of 32 x 32 elements, a block of 32 x 8 threads each; a
// thread quantizes four elements of its column (an f32 product with the
// scale, then cuda_fp8.h's round-to-nearest-even conversion with
// __NV_SATFINITE: the host reference's bytes) and writes y at once; y_t
// goes through shared memory so that its rows, the tile's columns, are
// written adjacent too. amax: each block reduces its |x| (fmaxf: NaN left
// out) and one atomicMax per block folds it into *amax, as the int of a
// non-negative float orders as the float; *amax is zeroed on the stream
// first. ScaleUpdate: a block per scale, as Transformer Engine's kernel.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <float.h>
#include "kernels.h"
#include "fp8_quantize.cuh"

namespace {

constexpr int TILE = 32;
constexpr int ROWS_PER_PASS = 8;
constexpr int UPDATE_THREADS = 256;

__device__ __forceinline__ float load(const float *p, int64_t i)
{
	return p[i];
}
__device__ __forceinline__ float load(const __half *p, int64_t i)
{
	return __half2float(p[i]);
}
__device__ __forceinline__ float load(const __nv_bfloat16 *p, int64_t i)
{
	return __bfloat162float(p[i]);
}

__device__ __forceinline__ float block_max(float v, float *shared)
{
	for (int o = 16; o > 0; o /= 2)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	const int warp = (threadIdx.y * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
	const int warps = (blockDim.x * blockDim.y) / 32;
	if (lane == 0)
		shared[warp] = v;
	__syncthreads();
	v = 0.0f;
	for (int w = 0; w < warps; w++)
		v = fmaxf(v, shared[w]);
	return v;
}

template <typename T>
__global__ void quantize_kernel(struct rk_quantize a)
{
	__shared__ unsigned char tile[TILE][TILE + 1];
	__shared__ float warp_max[TILE * ROWS_PER_PASS / 32];
	const T *x = static_cast<const T *>(a.x);
	const __nv_fp8_interpretation_t kind = a.e5m2 ? __NV_E5M2 : __NV_E4M3;
	const float scale = *a.scale;
	const int64_t col0 = (int64_t)blockIdx.x * TILE, row0 = (int64_t)blockIdx.y * TILE;
	const int64_t col = col0 + threadIdx.x;
	float amax = 0.0f;

	for (int r = threadIdx.y; r < TILE; r += ROWS_PER_PASS) {
		const int64_t row = row0 + r;
		if (row < a.rows && col < a.cols) {
			const float v = load(x, row * a.x_ld + col);
			const unsigned char q = __nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kind);
			if (a.y)
				static_cast<unsigned char *>(a.y)[row * a.y_ld + col] = q;
			tile[r][threadIdx.x] = q;
			amax = fmaxf(amax, fabsf(v));
		}
	}
	if (a.y_t) {
		__syncthreads();
		// y_t's row col0 + c takes the tile's column c: rows of x go along it.
		for (int c = threadIdx.y; c < TILE; c += ROWS_PER_PASS) {
			const int64_t trow = col0 + c, tcol = row0 + threadIdx.x;
			if (trow < a.cols && tcol < a.rows)
				static_cast<unsigned char *>(a.y_t)[trow * a.y_t_ld + tcol] = tile[threadIdx.x][c];
		}
	}
	if (a.amax) {
		amax = block_max(amax, warp_max);
		if (threadIdx.x == 0 && threadIdx.y == 0 && amax > 0.0f)
			atomicMax(reinterpret_cast<int *>(a.amax), __float_as_int(amax));
	}
}

__global__ void scale_update_kernel(struct rk_scale_update a)
{
	__shared__ float shared[UPDATE_THREADS / 32];
	const int64_t n = blockIdx.x;
	const float *hist = a.amax_history + n;
	float *out = a.amax_history_out + n;
	const float newest = hist[0];
	float amax = 0.0f;

	// Each thread reads its rows before anyone writes: the output may be
	// the input. The history is short (Transformer Engine's default is
	// 1024 rows): a loop of passes, each read then written.
	for (int64_t off = 0; off < a.history; off += UPDATE_THREADS) {
		const int64_t i = off + threadIdx.x;
		float v = 0.0f;
		if (i < a.history) {
			v = i + 1 < a.history ? hist[(i + 1) * a.history_ld] : newest;
			amax = fmaxf(amax, v);
		}
		__syncthreads();
		if (i < a.history)
			out[i * a.history_out_ld] = i > 0 ? v : 0.0f;
		__syncthreads();
	}
	amax = block_max(amax, shared);
	if (a.most_recent)
		amax = newest;
	if (threadIdx.x == 0) {
		float s = isfinite(amax) && amax > 0.0f ? a.scaled_max / amax : a.scale[n];
		if (isinf(s))
			s = FLT_MAX;
		a.scale_out[n] = s;
		if (a.scale_inv)
			a.scale_inv[n] = 1.0f / s;
	}
}

} // namespace

extern "C" cudaError_t rk_quantize(const struct rk_quantize *a, cudaStream_t stream)
{
	if (a->amax) {
		cudaError_t e = cudaMemsetAsync(a->amax, 0, sizeof(float), stream);
		if (e != cudaSuccess)
			return e;
	}
	if (rk_quantize_tiles_fit(a)) {
		/* Blocks enough to fill the GPU, each striding over tiles: one
		 * atomicMax a block, not a tile. */
		int dev = 0, sms = 0;
		if (cudaGetDevice(&dev) != cudaSuccess ||
		    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
			sms = 132;
		const int64_t tiles = a->rows / rk_fp8::EDGE * (a->cols / rk_fp8::EDGE);
		const unsigned grid = (unsigned)(tiles < (int64_t)sms * 8 ? tiles : (int64_t)sms * 8);
		switch (a->dtype) {
		case RK_F32:
			rk_fp8::quantize_tiles_kernel<float><<<grid, rk_fp8::THREADS, 0, stream>>>(*a);
			break;
		case RK_F16:
			rk_fp8::quantize_tiles_kernel<__half><<<grid, rk_fp8::THREADS, 0, stream>>>(*a);
			break;
		default:
			rk_fp8::quantize_tiles_kernel<__nv_bfloat16><<<grid, rk_fp8::THREADS, 0, stream>>>(*a);
			break;
		}
		return cudaGetLastError();
	}
	const dim3 block(TILE, ROWS_PER_PASS);
	const dim3 grid((unsigned)((a->cols + TILE - 1) / TILE), (unsigned)((a->rows + TILE - 1) / TILE));
	switch (a->dtype) {
	case RK_F32:
		quantize_kernel<float><<<grid, block, 0, stream>>>(*a);
		break;
	case RK_F16:
		quantize_kernel<__half><<<grid, block, 0, stream>>>(*a);
		break;
	default:
		quantize_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(*a);
		break;
	}
	return cudaGetLastError();
}

extern "C" cudaError_t rk_scale_update(const struct rk_scale_update *a, cudaStream_t stream)
{
	scale_update_kernel<<<(unsigned)a->n, UPDATE_THREADS, 0, stream>>>(*a);
	return cudaGetLastError();
}
