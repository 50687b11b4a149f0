/* Scaled dot-product attention, forward and backward, for the CUDA backend.
 *
 * One warp per row: a query row in the forward pass and for dQ, a key row
 * for dK/dV. Each lane holds head-dimension elements lane, lane+32, ...;
 * dot products are warp reductions; the softmax is the online (running max)
 * form, so nothing of size Skv is stored. Accumulation is f32 whatever the
 * storage type. Simple rather than fast: it is correct for any strides and
 * shapes the protocol allows (head dims up to RK_ATTN_DMAX). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include "attention.h"

#define WARP 32
#define PER_LANE (RK_ATTN_DMAX / WARP)
#define WARPS_PER_BLOCK 4

template <typename T> __device__ __forceinline__ float ld(const T *p);
template <> __device__ __forceinline__ float ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ float ld<__half>(const __half *p) { return __half2float(*p); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

template <typename T> __device__ __forceinline__ void st(T *p, float v);
template <> __device__ __forceinline__ void st<float>(float *p, float v) { *p = v; }
template <> __device__ __forceinline__ void st<__half>(__half *p, float v) { *p = __float2half_rn(v); }
template <> __device__ __forceinline__ void st<__nv_bfloat16>(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = WARP / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

template <typename T>
__device__ __forceinline__ const T *at(const rk_attn_tensor &t, long b, long h, long s)
{
	return (const T *)t.ptr + b * t.stride[0] + h * t.stride[1] + s * t.stride[2];
}

/* Loads a row's elements owned by this lane into x (zeros past d). */
template <typename T>
__device__ __forceinline__ void load_row(float *x, const T *p, long dim_stride, int d, int lane)
{
#pragma unroll
	for (int i = 0; i < PER_LANE; i++) {
		int e = lane + i * WARP;
		x[i] = e < d ? ld<T>(p + e * dim_stride) : 0.0f;
	}
}

__device__ __forceinline__ float dot_row(const float *x, const float *y)
{
	float acc = 0.0f;
#pragma unroll
	for (int i = 0; i < PER_LANE; i++)
		acc += x[i] * y[i];
	return warp_sum(acc);
}

template <typename T>
__global__ void attn_fwd(rk_attn_fwd_args a)
{
	int lane = threadIdx.x % WARP;
	long rowid = (long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
	if (rowid >= a.batch * a.heads * a.seq_q)
		return;
	long i = rowid % a.seq_q, h = (rowid / a.seq_q) % a.heads, b = rowid / (a.seq_q * a.heads);

	float q[PER_LANE], kv[PER_LANE], acc[PER_LANE];
	load_row(q, at<T>(a.q, b, h, i), a.q.stride[3], a.head_dim, lane);
#pragma unroll
	for (int e = 0; e < PER_LANE; e++)
		acc[e] = 0.0f;
	float m = -INFINITY, l = 0.0f;
	long last = a.causal ? min(i, a.seq_kv - 1) : a.seq_kv - 1;
	for (long j = 0; j <= last; j++) {
		load_row(kv, at<T>(a.k, b, h, j), a.k.stride[3], a.head_dim, lane);
		float s = dot_row(q, kv) * a.scale;
		float m_new = fmaxf(m, s);
		float corr = __expf(m - m_new), p = __expf(s - m_new);
		l = l * corr + p;
		load_row(kv, at<T>(a.v, b, h, j), a.v.stride[3], a.head_dim_v, lane);
#pragma unroll
		for (int e = 0; e < PER_LANE; e++)
			acc[e] = acc[e] * corr + p * kv[e];
		m = m_new;
	}
	T *o = (T *)at<T>(a.o, b, h, i);
#pragma unroll
	for (int e = 0; e < PER_LANE; e++) {
		int d = lane + e * WARP;
		if (d < a.head_dim_v)
			st<T>(o + d * a.o.stride[3], acc[e] / l);
	}
	if (a.stats.ptr && lane == 0) {
		float *st_row = (float *)a.stats.ptr + b * a.stats.stride[0] + h * a.stats.stride[1] + i * a.stats.stride[2];
		*st_row = m + logf(l);
	}
}

/* delta[b,h,i] = dO_i . O_i, the softmax backward's row term. */
template <typename T>
__global__ void attn_bwd_delta(rk_attn_bwd_args a, float *delta)
{
	int lane = threadIdx.x % WARP;
	long rowid = (long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
	if (rowid >= a.batch * a.heads * a.seq_q)
		return;
	long i = rowid % a.seq_q, h = (rowid / a.seq_q) % a.heads, b = rowid / (a.seq_q * a.heads);
	float x[PER_LANE], y[PER_LANE];
	load_row(x, at<T>(a.d_o, b, h, i), a.d_o.stride[3], a.head_dim_v, lane);
	load_row(y, at<T>(a.o, b, h, i), a.o.stride[3], a.head_dim_v, lane);
	float d = dot_row(x, y);
	if (lane == 0)
		delta[rowid] = d;
}

__device__ __forceinline__ float lse_at(const rk_attn_bwd_args &a, long b, long h, long i)
{
	return *((const float *)a.stats.ptr + b * a.stats.stride[0] + h * a.stats.stride[1] + i * a.stats.stride[2]);
}

/* dQ_i = scale * sum_j P_ij (dP_ij - delta_i) K_j, one warp per query row. */
template <typename T>
__global__ void attn_bwd_dq(rk_attn_bwd_args a, const float *delta)
{
	int lane = threadIdx.x % WARP;
	long rowid = (long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
	if (rowid >= a.batch * a.heads * a.seq_q)
		return;
	long i = rowid % a.seq_q, h = (rowid / a.seq_q) % a.heads, b = rowid / (a.seq_q * a.heads);
	float q[PER_LANE], g[PER_LANE], kv[PER_LANE], acc[PER_LANE];
	load_row(q, at<T>(a.q, b, h, i), a.q.stride[3], a.head_dim, lane);
	load_row(g, at<T>(a.d_o, b, h, i), a.d_o.stride[3], a.head_dim_v, lane);
#pragma unroll
	for (int e = 0; e < PER_LANE; e++)
		acc[e] = 0.0f;
	float lse = lse_at(a, b, h, i), di = delta[rowid];
	long last = a.causal ? min(i, a.seq_kv - 1) : a.seq_kv - 1;
	for (long j = 0; j <= last; j++) {
		load_row(kv, at<T>(a.k, b, h, j), a.k.stride[3], a.head_dim, lane);
		float p = __expf(dot_row(q, kv) * a.scale - lse);
		float kreg[PER_LANE];
#pragma unroll
		for (int e = 0; e < PER_LANE; e++)
			kreg[e] = kv[e];
		load_row(kv, at<T>(a.v, b, h, j), a.v.stride[3], a.head_dim_v, lane);
		float ds = p * (dot_row(g, kv) - di);
#pragma unroll
		for (int e = 0; e < PER_LANE; e++)
			acc[e] += ds * kreg[e];
	}
	T *dq = (T *)at<T>(a.d_q, b, h, i);
#pragma unroll
	for (int e = 0; e < PER_LANE; e++) {
		int d = lane + e * WARP;
		if (d < a.head_dim)
			st<T>(dq + d * a.d_q.stride[3], acc[e] * a.scale);
	}
}

/* dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i dS_ij Q_i, one warp per key row. */
template <typename T>
__global__ void attn_bwd_dkdv(rk_attn_bwd_args a, const float *delta)
{
	int lane = threadIdx.x % WARP;
	long rowid = (long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
	if (rowid >= a.batch * a.heads * a.seq_kv)
		return;
	long j = rowid % a.seq_kv, h = (rowid / a.seq_kv) % a.heads, b = rowid / (a.seq_kv * a.heads);
	float k[PER_LANE], v[PER_LANE], x[PER_LANE], dk[PER_LANE], dv[PER_LANE];
	load_row(k, at<T>(a.k, b, h, j), a.k.stride[3], a.head_dim, lane);
	load_row(v, at<T>(a.v, b, h, j), a.v.stride[3], a.head_dim_v, lane);
#pragma unroll
	for (int e = 0; e < PER_LANE; e++)
		dk[e] = dv[e] = 0.0f;
	long first = a.causal ? j : 0;
	long row_base = (b * a.heads + h) * a.seq_q;
	for (long i = first; i < a.seq_q; i++) {
		load_row(x, at<T>(a.q, b, h, i), a.q.stride[3], a.head_dim, lane);
		float p = __expf(dot_row(x, k) * a.scale - lse_at(a, b, h, i));
		float qreg[PER_LANE];
#pragma unroll
		for (int e = 0; e < PER_LANE; e++)
			qreg[e] = x[e];
		load_row(x, at<T>(a.d_o, b, h, i), a.d_o.stride[3], a.head_dim_v, lane);
		float ds = p * (dot_row(x, v) - delta[row_base + i]);
#pragma unroll
		for (int e = 0; e < PER_LANE; e++) {
			dv[e] += p * x[e];
			dk[e] += ds * qreg[e];
		}
	}
	T *pk = (T *)at<T>(a.d_k, b, h, j);
	T *pv = (T *)at<T>(a.d_v, b, h, j);
#pragma unroll
	for (int e = 0; e < PER_LANE; e++) {
		int d = lane + e * WARP;
		if (d < a.head_dim)
			st<T>(pk + d * a.d_k.stride[3], dk[e] * a.scale);
		if (d < a.head_dim_v)
			st<T>(pv + d * a.d_v.stride[3], dv[e]);
	}
}

static unsigned blocks_for(long rows)
{
	return (unsigned)((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
}

template <typename T>
static cudaError_t launch_fwd(const rk_attn_fwd_args *a, cudaStream_t s)
{
	long rows = a->batch * a->heads * a->seq_q;
	attn_fwd<T><<<blocks_for(rows), WARPS_PER_BLOCK * WARP, 0, s>>>(*a);
	return cudaGetLastError();
}

template <typename T>
static cudaError_t launch_bwd(const rk_attn_bwd_args *a, float *delta, cudaStream_t s)
{
	long rows_q = a->batch * a->heads * a->seq_q, rows_kv = a->batch * a->heads * a->seq_kv;
	attn_bwd_delta<T><<<blocks_for(rows_q), WARPS_PER_BLOCK * WARP, 0, s>>>(*a, delta);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	attn_bwd_dq<T><<<blocks_for(rows_q), WARPS_PER_BLOCK * WARP, 0, s>>>(*a, delta);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	attn_bwd_dkdv<T><<<blocks_for(rows_kv), WARPS_PER_BLOCK * WARP, 0, s>>>(*a, delta);
	return cudaGetLastError();
}

extern "C" cudaError_t rk_attention_forward(const rk_attn_fwd_args *a, enum rk_dtype dtype, cudaStream_t stream)
{
	if (a->head_dim > RK_ATTN_DMAX || a->head_dim_v > RK_ATTN_DMAX)
		return cudaErrorInvalidValue;
	switch (dtype) {
	case RK_F32: return launch_fwd<float>(a, stream);
	case RK_F16: return launch_fwd<__half>(a, stream);
	case RK_BF16: return launch_fwd<__nv_bfloat16>(a, stream);
	}
	return cudaErrorInvalidValue;
}

extern "C" cudaError_t rk_attention_backward(const rk_attn_bwd_args *a, enum rk_dtype dtype, float *delta,
					     cudaStream_t stream)
{
	if (a->head_dim > RK_ATTN_DMAX || a->head_dim_v > RK_ATTN_DMAX)
		return cudaErrorInvalidValue;
	switch (dtype) {
	case RK_F32: return launch_bwd<float>(a, delta, stream);
	case RK_F16: return launch_bwd<__half>(a, delta, stream);
	case RK_BF16: return launch_bwd<__nv_bfloat16>(a, delta, stream);
	}
	return cudaErrorInvalidValue;
}
