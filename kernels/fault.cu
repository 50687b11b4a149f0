/* SPDX-License-Identifier: Apache-2.0 */
// Kernels of the backend's lifecycle: fault injection (illegal address,
// spin) and the canary that proves a context healthy after a reset.
#include "kernels.h"

namespace {

__global__ void illegal_address(int *wild)
{
	/* A store far outside any allocation; volatile so it is not elided. */
	*(volatile int *)wild = 42;
}

__global__ void fault_after_flag(int kind, volatile int *ran, char *mapped, int *sink)
{
	*ran = 1;
	__threadfence_system();
	switch (kind) {
	case RK_FAULT_STORE_UNMAPPED:
		*(volatile int *)(uintptr_t)0xdead00000000ull = 42;
		break;
	case RK_FAULT_LOAD_UNMAPPED:
		*sink = *(volatile int *)(uintptr_t)0xdead00000000ull;
		break;
	case RK_FAULT_TRAP:
		__trap();
		break;
	default:
		*(volatile unsigned long long *)(mapped + 1) = 42;
		break;
	}
}

__global__ void spin(const volatile int *flag, uint64_t max_ns)
{
	uint64_t start, now;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
	do {
		if (*flag)
			return;
		__nanosleep(1000);
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
	} while (now - start < max_ns);
}

__global__ void canary(unsigned *out, unsigned n)
{
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		out[i] = i * 2654435761u + 12345u;
}

} // namespace

extern "C" cudaError_t rk_illegal_address(cudaStream_t stream)
{
	illegal_address<<<1, 1, 0, stream>>>((int *)(uintptr_t)0xdead00000000ull);
	return cudaGetLastError();
}

extern "C" cudaError_t rk_fault_after_flag(enum rk_fault_kind kind, volatile int *ran, void *mapped,
					   cudaStream_t stream)
{
	fault_after_flag<<<1, 1, 0, stream>>>((int)kind, ran, (char *)mapped, (int *)mapped);
	return cudaGetLastError();
}

extern "C" cudaError_t rk_spin(const volatile int *flag, uint64_t max_ns, cudaStream_t stream)
{
	spin<<<1, 1, 0, stream>>>(flag, max_ns);
	return cudaGetLastError();
}

extern "C" cudaError_t rk_canary(cudaStream_t stream)
{
	enum { N = 4096 };
	unsigned host[N];
	unsigned *dev = nullptr;
	cudaError_t e = cudaMalloc((void **)&dev, N * sizeof(unsigned));
	if (e != cudaSuccess)
		return e;
	e = cudaMemsetAsync(dev, 0xff, N * sizeof(unsigned), stream);
	if (e == cudaSuccess) {
		canary<<<N / 256, 256, 0, stream>>>(dev, N);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(host, dev, sizeof(host), cudaMemcpyDeviceToHost, stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(stream);
	cudaError_t f = cudaFree(dev);
	if (e == cudaSuccess)
		e = f;
	if (e != cudaSuccess)
		return e;
	for (unsigned i = 0; i < N; i++)
		if (host[i] != i * 2654435761u + 12345u)
			return cudaErrorUnknown;
	return cudaSuccess;
}
