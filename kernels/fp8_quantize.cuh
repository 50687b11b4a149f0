/* SPDX-License-Identifier: Apache-2.0 */
// TransposeQuantize's kernel where the matrix is whole 64 x 64 tiles and
// every row is aligned to the vectors it moves in (rk_quantize_tiles_fit):
// the shapes of a model's Linears. Device code only, so that the host can
// run it too: tests/unit/test_fp8_emulated.c compiles this file behind
// tests/unit/program_emulator.hpp and compares its bytes with the host's.
//
// A block of 256 threads takes tiles in turn (a grid of a few blocks an SM
// strides over all of them). A thread loads 8 consecutive elements of a
// row (one 16-byte load of bf16 or f16, two of f32), quantizes each (an f32
// product with the scale, then cuda_fp8.h's round-to-nearest-even with
// __NV_SATFINITE: the host reference's bytes), stores them to y as 8 bytes
// and into the tile in shared memory; then each thread gathers 16 bytes of
// one of the tile's columns and stores them to y_t, one row of it, at
// once. amax: each thread's |x| max, the block's max of those, one
// atomicMax a block (the int of a non-negative float orders as the float).
#pragma once

#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "kernels.h"

namespace rk_fp8 {

constexpr int EDGE = 64;         // a tile's rows and columns
constexpr int THREADS = 256;
constexpr int PER_THREAD = 8;    // consecutive elements of a row a thread loads
constexpr int OUT_BYTES = 16;    // bytes of a y_t row a thread stores

struct alignas(16) v16 {
	unsigned int w[4];
};
struct alignas(8) v8 {
	unsigned int w[2];
};

__device__ __forceinline__ float to_float(float v)
{
	return v;
}
__device__ __forceinline__ float to_float(__half v)
{
	return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}

/* The 8 elements at p (16-byte aligned) as floats. */
template <typename T>
__device__ __forceinline__ void load8(const T *p, float out[PER_THREAD])
{
	constexpr int PER_LOAD = (int)(sizeof(v16) / sizeof(T));
	for (int l = 0; l < PER_THREAD / PER_LOAD; l++) {
		union {
			v16 v;
			T e[PER_LOAD];
		} u;
		u.v = reinterpret_cast<const v16 *>(p)[l];
		for (int j = 0; j < PER_LOAD; j++)
			out[l * PER_LOAD + j] = to_float(u.e[j]);
	}
}

template <typename T>
__global__ void __launch_bounds__(THREADS) quantize_tiles_kernel(struct rk_quantize a)
{
	__shared__ unsigned char tile[EDGE][EDGE + 4];
	__shared__ float warp_max[THREADS / 32];
	const T *x = static_cast<const T *>(a.x);
	const __nv_fp8_interpretation_t kind = a.e5m2 ? __NV_E5M2 : __NV_E4M3;
	const float scale = *a.scale;
	const int t = threadIdx.x;
	const int64_t tiles_across = a.cols / EDGE, tiles = (a.rows / EDGE) * tiles_across;
	float amax = 0.0f;

	for (int64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
		const int64_t row0 = i / tiles_across * EDGE, col0 = i % tiles_across * EDGE;
		for (int r = t / (EDGE / PER_THREAD); r < EDGE; r += THREADS / (EDGE / PER_THREAD)) {
			const int c = t % (EDGE / PER_THREAD) * PER_THREAD;
			float v[PER_THREAD];
			union {
				v8 v;
				unsigned char b[PER_THREAD];
			} q;
			load8(x + (row0 + r) * a.x_ld + col0 + c, v);
			for (int j = 0; j < PER_THREAD; j++) {
				q.b[j] = __nv_cvt_float_to_fp8(v[j] * scale, __NV_SATFINITE, kind);
				amax = fmaxf(amax, fabsf(v[j]));
			}
			if (a.y)
				*reinterpret_cast<v8 *>(static_cast<unsigned char *>(a.y) + (row0 + r) * a.y_ld + col0 + c) = q.v;
			for (int j = 0; j < PER_THREAD; j++)
				tile[r][c + j] = q.b[j];
		}
		if (a.y_t) {
			__syncthreads();
			// y_t's row col0 + c is the tile's column c, its rows in order.
			const int c = t / (EDGE / OUT_BYTES), r0 = t % (EDGE / OUT_BYTES) * OUT_BYTES;
			union {
				v16 v;
				unsigned char b[OUT_BYTES];
			} out;
			for (int j = 0; j < OUT_BYTES; j++)
				out.b[j] = tile[r0 + j][c];
			*reinterpret_cast<v16 *>(static_cast<unsigned char *>(a.y_t) + (col0 + c) * a.y_t_ld + row0 + r0) =
				out.v;
			__syncthreads();   // the tile is the next one's
		}
	}
	if (a.amax) {
		for (int o = 16; o > 0; o /= 2)
			amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
		if (t % 32 == 0)
			warp_max[t / 32] = amax;
		__syncthreads();
		if (t == 0) {
			for (int w = 1; w < THREADS / 32; w++)
				amax = fmaxf(amax, warp_max[w]);
			if (amax > 0.0f)
				atomicMax(reinterpret_cast<int *>(a.amax), __float_as_int(amax));
		}
	}
}

} // namespace rk_fp8

/* Whether quantize_tiles_kernel takes a: whole tiles, and every row of x,
 * y and y_t starting on a boundary of the vectors it moves in. */
static inline bool rk_quantize_tiles_fit(const struct rk_quantize *a)
{
	const int64_t esize = a->dtype == RK_F32 ? 4 : 2;
	if (a->rows % rk_fp8::EDGE || a->cols % rk_fp8::EDGE || a->rows == 0)
		return false;
	if ((uintptr_t)a->x % 16 || (a->x_ld * esize) % 16)
		return false;
	if (a->y && ((uintptr_t)a->y % 8 || a->y_ld % 8))
		return false;
	if (a->y_t && ((uintptr_t)a->y_t % 16 || a->y_t_ld % 16))
		return false;
	return true;
}
