/* SPDX-License-Identifier: Apache-2.0 */
// The host as a GPU for regend's generated kernels (daemon/program/codegen.c),
// for test_program_emulated (and kernels/fp8_quantize.cuh, for test_fp8_emulated): compiled as C++ in front of a step's source,
// it runs a kernel's blocks one after the other, each block's threads as
// coroutines of one host thread (started with makecontext, switched with
// _setjmp/_longjmp, which leave the signal mask alone: no system call per
// switch), switched at every barrier:
// __syncthreads waits for the block, a warp's shuffle for the warp (its
// lanes exchange values through a slot each). Slow, and enough to check
// the kernels' indexing, their vector and scalar paths and their numbers
// without a GPU. The math is the host's libm, not CUDA's: results agree
// within the tests' tolerances, not bit for bit.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <csetjmp>
#include <ucontext.h>

struct rg_dim3 {
	unsigned x, y, z;
};
static rg_dim3 threadIdx, blockIdx, blockDim, gridDim;

#undef __global__
#define __global__
#undef __launch_bounds__
#define __launch_bounds__(x)
#undef __shared__
#define __shared__ static

static inline double __longlong_as_double(long long v)
{
	double d;
	std::memcpy(&d, &v, 8);
	return d;
}
static inline float __int_as_float(int v)
{
	float f;
	std::memcpy(&f, &v, 4);
	return f;
}
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
using std::min;

/* The block's threads: their contexts, and the barrier each waits at
 * (-1: none; 0: the block's; 1 + w: warp w's). */
enum { RG_MAX_THREADS = 1024, RG_STACK = 256 * 1024 };
static ucontext_t rg_ctx[RG_MAX_THREADS];
static jmp_buf rg_sched_env, rg_env[RG_MAX_THREADS];
static bool rg_started[RG_MAX_THREADS];
static int rg_waiting[RG_MAX_THREADS];
static bool rg_done[RG_MAX_THREADS];
static unsigned rg_arrived[1 + RG_MAX_THREADS / 32], rg_current;
static double rg_slot[RG_MAX_THREADS];
static int rg_or_value;

/* Waits at barrier b, of `count` threads. */
static void rg_barrier(int b, unsigned count)
{
	unsigned me = rg_current;

	if (++rg_arrived[b] == count) {
		rg_arrived[b] = 0;
		for (unsigned t = 0; t < blockDim.x; t++)
			if (rg_waiting[t] == b)
				rg_waiting[t] = -1;
		return;
	}
	rg_waiting[me] = b;
	if (!_setjmp(rg_env[me]))
		_longjmp(rg_sched_env, 1);
	rg_current = me;
	threadIdx.x = me;
}

static inline void __syncthreads() { rg_barrier(0, blockDim.x); }

static inline int __syncthreads_or(int p)
{
	__syncthreads();
	if (p)
		rg_or_value = 1;
	__syncthreads();
	int r = rg_or_value;
	__syncthreads();
	if (threadIdx.x == 0)
		rg_or_value = 0;
	__syncthreads();
	return r;
}

template <class T> static inline T __shfl_xor_sync(unsigned, T v, int lane_mask)
{
	unsigned t = threadIdx.x;
	T r;

	std::memcpy(&rg_slot[t], &v, sizeof(T));
	rg_barrier(1 + (int)(t / 32), 32);
	std::memcpy(&r, &rg_slot[t ^ (unsigned)lane_mask], sizeof(T));
	rg_barrier(1 + (int)(t / 32), 32);
	return r;
}

/* One thread runs at a time, switched only at barriers: plain code is
 * atomic here. */
static inline unsigned atomicCAS(unsigned *p, unsigned expected, unsigned desired)
{
	unsigned old = *p;

	if (old == expected)
		*p = desired;
	return old;
}

static inline int atomicMax(int *p, int v)
{
	int old = *p;

	if (v > old)
		*p = v;
	return old;
}

static inline int __float_as_int(float v)
{
	int i;
	std::memcpy(&i, &v, 4);
	return i;
}

static inline void __threadfence_system() {}

// What follows the step's source: the launcher the test calls.
#define RG_EMULATOR_LAUNCHER                                                                              \
	static void (*rg_fn)(const rg_args *);                                                            \
	static const rg_args *rg_a;                                                                       \
	static void rg_entry(void)                                                                        \
	{                                                                                                 \
		rg_fn(rg_a);                                                                              \
		rg_done[rg_current] = true;                                                               \
		_longjmp(rg_sched_env, 1);                                                                \
	}                                                                                                 \
	extern "C" int rg_emulate(void (*fn)(const rg_args *), const rg_args *a, unsigned grid, unsigned block) \
	{                                                                                                 \
		static char *stacks[RG_MAX_THREADS];                                                      \
		if (block == 0 || block > RG_MAX_THREADS || block % 32)                                   \
			return -1;                                                                        \
		rg_fn = fn;                                                                               \
		rg_a = a;                                                                                 \
		gridDim = { grid, 1, 1 };                                                                 \
		blockDim = { block, 1, 1 };                                                               \
		for (unsigned t = 0; t < block; t++)                                                      \
			if (!stacks[t] && !(stacks[t] = (char *)std::malloc(RG_STACK)))                   \
				return -1;                                                                \
		for (unsigned b = 0; b < grid; b++) {                                                     \
			blockIdx = { b, 0, 0 };                                                           \
			std::memset(rg_arrived, 0, sizeof(rg_arrived));                                   \
			for (unsigned t = 0; t < block; t++) {                                            \
				getcontext(&rg_ctx[t]);                                                   \
				rg_ctx[t].uc_stack.ss_sp = stacks[t];                                     \
				rg_ctx[t].uc_stack.ss_size = RG_STACK;                                    \
				rg_ctx[t].uc_link = 0;                                                    \
				makecontext(&rg_ctx[t], rg_entry, 0);                                     \
				rg_waiting[t] = -1;                                                       \
				rg_done[t] = false;                                                       \
				rg_started[t] = false;                                                    \
			}                                                                                 \
			for (unsigned left = block; left;) {                                              \
				unsigned ran = 0;                                                         \
				for (unsigned t = 0; t < block; t++) {                                    \
					if (rg_done[t] || rg_waiting[t] >= 0)                             \
						continue;                                                 \
					rg_current = t;                                                   \
					threadIdx = { t, 0, 0 };                                          \
					if (!_setjmp(rg_sched_env)) {                                     \
						if (rg_started[t]) {                                      \
							_longjmp(rg_env[t], 1);                           \
						} else {                                                  \
							ucontext_t here;                                  \
							rg_started[t] = true;                             \
							swapcontext(&here, &rg_ctx[t]);                   \
						}                                                         \
					}                                                                 \
					ran++;                                                            \
					left -= rg_done[t];                                               \
				}                                                                         \
				if (!ran)                                                                 \
					return -2; /* every thread waits: a barrier not all reach */     \
			}                                                                                 \
		}                                                                                         \
		return 0;                                                                                 \
	}
