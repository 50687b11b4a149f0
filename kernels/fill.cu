/* SPDX-License-Identifier: Apache-2.0 */
// Fills and comparisons for the GPU tests (and anyone needing
// reproducible random device data).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "kernels.h"

namespace {

__device__ float uniform_value(uint64_t seed, uint64_t i, int scale_log2)
{
	return rk_uniform_value(seed, i, scale_log2);
}

__global__ void fill_f32(float *p, size_t n, uint64_t seed, int s)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = uniform_value(seed, i, s);
}

__global__ void fill_f16(__half *p, size_t n, uint64_t seed, int s)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __float2half_rn(uniform_value(seed, i, s));
}

__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed, int s)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __float2bfloat16_rn(uniform_value(seed, i, s));
}

__global__ void fill_u32(uint32_t *p, size_t n, uint32_t v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

__global__ void fill_u16(uint16_t *p, size_t n, uint16_t v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

__global__ void count_mismatch(const uint32_t *a, const uint32_t *b, size_t n, unsigned long long *count)
{
	unsigned long long local = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		local += a[i] != b[i];
	/* One atomic per warp. */
	for (int o = 16; o > 0; o /= 2)
		local += __shfl_down_sync(0xffffffffu, local, o);
	if ((threadIdx.x & 31) == 0 && local)
		atomicAdd(count, local);
}

unsigned grid_for(size_t n)
{
	size_t blocks = (n + 255) / 256;
	if (blocks > 4096)
		blocks = 4096;
	if (blocks == 0)
		blocks = 1;
	return (unsigned)blocks;
}

} // namespace

extern "C" cudaError_t rk_fill_uniform(void *p, size_t n, enum rk_dtype dtype, uint64_t seed, int scale_log2, cudaStream_t stream)
{
	switch (dtype) {
	case RK_F32: fill_f32<<<grid_for(n), 256, 0, stream>>>((float *)p, n, seed, scale_log2); break;
	case RK_F16: fill_f16<<<grid_for(n), 256, 0, stream>>>((__half *)p, n, seed, scale_log2); break;
	case RK_BF16: fill_bf16<<<grid_for(n), 256, 0, stream>>>((__nv_bfloat16 *)p, n, seed, scale_log2); break;
	default: return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}

extern "C" cudaError_t rk_fill_nan(void *p, size_t n, enum rk_dtype dtype, cudaStream_t stream)
{
	switch (dtype) {
	case RK_F32: fill_u32<<<grid_for(n), 256, 0, stream>>>((uint32_t *)p, n, 0x7fc00000u); break;
	case RK_F16: fill_u16<<<grid_for(n), 256, 0, stream>>>((uint16_t *)p, n, (uint16_t)0x7e00u); break;
	case RK_BF16: fill_u16<<<grid_for(n), 256, 0, stream>>>((uint16_t *)p, n, (uint16_t)0x7fc0u); break;
	default: return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}

extern "C" cudaError_t rk_count_mismatch(const void *a, const void *b, size_t nbytes, unsigned long long *d_count, cudaStream_t stream)
{
	if (nbytes % 4)
		return cudaErrorInvalidValue;
	size_t n = nbytes / 4;
	count_mismatch<<<grid_for(n), 256, 0, stream>>>((const uint32_t *)a, (const uint32_t *)b, n, d_count);
	return cudaGetLastError();
}
