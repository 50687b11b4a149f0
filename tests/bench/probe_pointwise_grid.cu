// SPDX-License-Identifier: Apache-2.0
// Which launch shape of a fused pointwise kernel reaches the memory's bandwidth
// (docs/performance.md, Programs, H200): y = x * 2 + z in bf16 over 256 Mi elements,
// grids capped at 4/8/16 blocks per SM or covering the work once (0), 1 to 4 vectors
// of 8 to 32 elements a thread, against cudaMemcpy. Not built by meson: on the GPU,
//   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o /tmp/probe tests/bench/probe_pointwise_grid.cu && /tmp/probe
#include <cuda_bf16.h>
#include <cstdio>
template <class T, int N> struct alignas(sizeof(T) * N) vec { T v[N]; };
typedef long long idx_t;

template <int V, int U>
__global__ void __launch_bounds__(256) k_add(const __nv_bfloat16 *x, const __nv_bfloat16 *z, __nv_bfloat16 *y, idx_t n)
{
	const idx_t stride = (idx_t)gridDim.x * blockDim.x;
	for (idx_t vi = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; vi < n / V; vi += stride * U) {
		vec<__nv_bfloat16, V> a[U], b[U], c[U];
#pragma unroll
		for (int u = 0; u < U; u++)
			if (vi + u * stride < n / V) {
				a[u] = *(const vec<__nv_bfloat16, V> *)(x + (vi + u * stride) * V);
				b[u] = *(const vec<__nv_bfloat16, V> *)(z + (vi + u * stride) * V);
			}
#pragma unroll
		for (int u = 0; u < U; u++)
#pragma unroll
			for (int j = 0; j < V; j++)
				c[u].v[j] = __float2bfloat16(__bfloat162float(a[u].v[j]) * 2.f + __bfloat162float(b[u].v[j]));
#pragma unroll
		for (int u = 0; u < U; u++)
			if (vi + u * stride < n / V)
				*(vec<__nv_bfloat16, V> *)(y + (vi + u * stride) * V) = c[u];
	}
}

template <int V, int U> float run(int bps, const __nv_bfloat16 *x, const __nv_bfloat16 *z, __nv_bfloat16 *y, idx_t n, int sms)
{
	long long blocks = n / V / 256;
	long long g = bps > 0 ? (long long)bps * sms : blocks;
	if (g > blocks) g = blocks;
	cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
	k_add<V, U><<<g, 256>>>(x, z, y, n);
	cudaEventRecord(e0);
	for (int i = 0; i < 20; i++) k_add<V, U><<<g, 256>>>(x, z, y, n);
	cudaEventRecord(e1); cudaEventSynchronize(e1);
	float ms; cudaEventElapsedTime(&ms, e0, e1);
	return 3.0 * n * 2 * 20 / (ms * 1e-3) / 1e9;
}

int main()
{
	idx_t n = 16384LL * 16384;
	int sms, clk, bus; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, 0); cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, 0);
	double peak = 2.0 * clk * 1e3 * bus / 8 / 1e9;
	__nv_bfloat16 *x, *z, *y; cudaMalloc(&x, n * 2); cudaMalloc(&z, n * 2); cudaMalloc(&y, n * 2);
	cudaMemset(x, 0, n * 2); cudaMemset(z, 0, n * 2);
	printf("peak %.0f GB/s, %d SMs\n", peak, sms);
	cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
	cudaMemcpy(y, x, n * 2, cudaMemcpyDeviceToDevice);
	cudaEventRecord(e0); for (int i = 0; i < 20; i++) cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice); cudaEventRecord(e1); cudaEventSynchronize(e1);
	float ms; cudaEventElapsedTime(&ms, e0, e1);
	double cp = 2.0 * n * 2 * 20 / (ms * 1e-3) / 1e9;
	printf("cudaMemcpy D2D: %.0f GB/s (%.1f%%)\n", cp, 100 * cp / peak);
	int bpss[] = { 4, 8, 16, 0 };
	for (int b : bpss) {
		float r[6] = { run<8, 1>(b, x, z, y, n, sms), run<8, 2>(b, x, z, y, n, sms), run<8, 4>(b, x, z, y, n, sms),
			       run<16, 1>(b, x, z, y, n, sms), run<16, 2>(b, x, z, y, n, sms), run<32, 1>(b, x, z, y, n, sms) };
		printf("blocks/SM %-3d v8u1 %.0f v8u2 %.0f v8u4 %.0f v16u1 %.0f v16u2 %.0f v32u1 %.0f  (%% peak: %.1f %.1f %.1f %.1f %.1f %.1f)\n",
		       b, r[0], r[1], r[2], r[3], r[4], r[5], 100 * r[0] / peak, 100 * r[1] / peak, 100 * r[2] / peak,
		       100 * r[3] / peak, 100 * r[4] / peak, 100 * r[5] / peak);
	}
	printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
