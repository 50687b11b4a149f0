/* SPDX-License-Identifier: Apache-2.0 */
// LayerNorm and its backward on the CUDA backend (io.regen.Compute.LayerNorm
// and LayerNormBackward), f32 statistics and sums whatever the storage type.
//
// Forward and d_x: a block per row (a grid-stride loop over the rows), each
// thread a strided share of the row's columns, the row's sums reduced over
// the block (warp shuffles, then one value per warp through shared memory).
// The row is read from memory again for each pass: the passes after the
// first find it in L1/L2, and no length of row needs registers it may not
// have. d_weight and d_bias: blocks of 32 columns by a chunk of rows write
// f32 partial sums into the caller's scratch, and a second kernel adds up
// each column's chunks. No atomics: the same inputs give the same bits.
//
// Rows of 16-byte vectors (n a multiple of 32 vectors of 16 bytes, at most
// 1024 of them, every row 16-byte aligned: a model's widths) take the
// vectorised kernels instead: a group of threads per row, each thread one
// 16-byte vector of the row held in registers, so x (and d_y) is read from
// memory once; several rows per block at a time. The backward's d_weight
// and d_bias sums ride along in each thread's registers over the block's
// rows, one partial row per block (scratch), added up by the same second
// kernel: d_y and x are read once in all, where the scalar kernels read
// them twice and 2-byte loads kept them at a quarter of the bandwidth.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "kernels.h"

namespace {

/* A partial-sum block: 32 columns (a warp along a row, so its loads are
 * adjacent) by 8 threads down the rows. */
constexpr int PARTIAL_COLS = 32;
constexpr int PARTIAL_ROWS = 8;
/* The rows of one chunk: at least 64 (each thread then sums 8 rows or
 * more), and few enough chunks that the second pass stays short. */
constexpr int64_t CHUNK_ROWS_MIN = 64;
constexpr int64_t CHUNKS_MAX = 128;
/* Blocks over the rows: more rows take several rounds of the grid. */
constexpr int64_t ROW_BLOCKS_MAX = 65536;

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
__device__ __forceinline__ void store(float *p, int64_t i, float v)
{
	p[i] = v;
}
__device__ __forceinline__ void store(__half *p, int64_t i, float v)
{
	p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void store(__nv_bfloat16 *p, int64_t i, float v)
{
	p[i] = __float2bfloat16_rn(v);
}

/* The vectorised kernels: 16 bytes a thread, FUSED_THREADS a block (more
 * when a row needs more), at most FUSED_BLOCKS_MAX blocks (each one partial
 * row of d_weight and d_bias for the second pass to add). */
constexpr int VEC_BYTES = 16;
constexpr int FUSED_THREADS = 256;
constexpr int FUSED_BLOCKS_MAX = 512;
constexpr int FUSED_GROUPS_MAX = FUSED_THREADS / 32;

template <typename T>
__host__ __device__ constexpr int vec_len()
{
	return VEC_BYTES / (int)sizeof(T);
}

template <typename T, int V>
__device__ __forceinline__ void load_vec(const T *p, float (&out)[V])
{
	const uint4 raw = *reinterpret_cast<const uint4 *>(p);
	const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
	for (int i = 0; i < V; i++)
		out[i] = load(e, i);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T *p, const float (&v)[V])
{
	uint4 raw;
	T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
	for (int i = 0; i < V; i++)
		store(e, i, v[i]);
	*reinterpret_cast<uint4 *>(p) = raw;
}

/* The sums of v.x and v.y over the threads of this row's group (threadIdx.y;
 * blockDim.x threads, a multiple of 32: every warp whole, as the shuffles'
 * full mask needs), in each of them; the scalar kernels' group is their
 * block. Every thread of the block calls it together (its barriers); sh
 * holds a float2 per warp of each group. The first barrier keeps a warp
 * from writing sh while another still reads the sums of the call before. */
__device__ float2 group_sum2(float2 v, float2 (*sh)[32])
{
	for (int o = 16; o > 0; o >>= 1) {
		v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
		v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
	}
	const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0)
		sh[threadIdx.y][warp] = v;
	__syncthreads();
	v = lane < warps ? sh[threadIdx.y][lane] : make_float2(0.0f, 0.0f);
	for (int o = 16; o > 0; o >>= 1) {
		v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
		v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
	}
	return v;
}

/* A row's statistics, where the caller wants them. */
__device__ __forceinline__ void store_stats(float *mean_out, float *rstd_out, int64_t r, float mean, float rstd)
{
	if (mean_out)
		mean_out[r] = mean;
	if (rstd_out)
		rstd_out[r] = rstd;
}

/* Two passes over the row for the statistics, the variance from the
 * centred values (no cancellation between E[x^2] and E[x]^2), then y. */
template <typename T>
__global__ void layer_norm_forward(const T *x, int64_t x_ld, const T *w, const T *b, T *y, int64_t y_ld,
				   float *mean_out, float *rstd_out, int64_t rows, int64_t n, float eps)
{
	__shared__ float2 sh[1][32];

	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *xr = x + r * x_ld;
		T *yr = y + r * y_ld;
		float s = 0.0f;

		for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
			s += load(xr, j);
		const float mean = group_sum2(make_float2(s, 0.0f), sh).x / (float)n;
		float q = 0.0f;

		for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
			const float d = load(xr, j) - mean;
			q += d * d;
		}
		const float var = group_sum2(make_float2(q, 0.0f), sh).x / (float)n;
		const float rstd = 1.0f / sqrtf(var + eps);

		for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
			float v = (load(xr, j) - mean) * rstd * load(w, j);
			if (b)
				v += load(b, j);
			store(yr, j, v);
		}
		if (threadIdx.x == 0)
			store_stats(mean_out, rstd_out, r, mean, rstd);
	}
}

/* g rounded once, the same in both passes over a row: left to itself the
 * compiler fuses the product into g - mean(g) in one pass and not in the
 * other, and rstd (316 for a row of one element) multiplies the rounding
 * of the product it kept, where the true difference is 0. */
template <typename T>
__device__ __forceinline__ float grad_times_weight(const T *dyr, const T *w, int64_t j)
{
	return __fmul_rn(load(dyr, j), load(w, j));
}

/* d_x = rstd (g - mean(g) - xhat mean(g xhat)) + d_residual, with
 * g = d_y w and xhat = (x - mean) rstd. d_x may be d_residual itself: each
 * element is read and then written by the one thread that owns it. */
template <typename T>
__global__ void layer_norm_backward_dx(const T *dy, int64_t dy_ld, const T *x, int64_t x_ld, const T *w,
				       const float *mean, const float *rstd, T *dx, int64_t dx_ld, const T *res,
				       int64_t res_ld, int64_t rows, int64_t n)
{
	__shared__ float2 sh[1][32];

	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *dyr = dy + r * dy_ld, *xr = x + r * x_ld;
		const T *resr = res ? res + r * res_ld : nullptr;
		T *dxr = dx + r * dx_ld;
		const float mu = mean[r], rs = rstd[r];
		float sg = 0.0f, sgx = 0.0f;

		for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
			const float g = grad_times_weight(dyr, w, j), xh = (load(xr, j) - mu) * rs;
			sg += g;
			sgx += g * xh;
		}
		const float2 t = group_sum2(make_float2(sg, sgx), sh);
		const float mean_g = t.x / (float)n, mean_gx = t.y / (float)n;

		for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
			const float g = grad_times_weight(dyr, w, j), xh = (load(xr, j) - mu) * rs;
			float v = rs * (g - mean_g - xh * mean_gx);
			if (resr)
				v += load(resr, j);
			store(dxr, j, v);
		}
	}
}

/* The forward, a row a group (threadIdx.y), its x in registers: the same
 * arithmetic as layer_norm_forward's, x read once. */
template <typename T>
__global__ void __launch_bounds__(1024) layer_norm_forward_vec(const T *x, int64_t x_ld, const T *w, const T *b,
							       T *y, int64_t y_ld, float *mean_out, float *rstd_out,
							       int64_t rows, int64_t n, float eps)
{
	constexpr int V = vec_len<T>();
	__shared__ float2 sh[FUSED_GROUPS_MAX][32];
	const int64_t col = (int64_t)threadIdx.x * V;
	float wv[V], bv[V];

	load_vec(w + col, wv);
	if (b)
		load_vec(b + col, bv);
	for (int64_t base = (int64_t)blockIdx.x * blockDim.y; base < rows; base += (int64_t)gridDim.x * blockDim.y) {
		const int64_t r = base + threadIdx.y;
		const bool active = r < rows;
		float xv[V], s = 0.0f;

		if (active) {
			load_vec(x + r * x_ld + col, xv);
#pragma unroll
			for (int i = 0; i < V; i++)
				s += xv[i];
		}
		const float mean = group_sum2(make_float2(s, 0.0f), sh).x / (float)n;
		float q = 0.0f;

		if (active) {
#pragma unroll
			for (int i = 0; i < V; i++) {
				const float d = xv[i] - mean;
				q += d * d;
			}
		}
		const float var = group_sum2(make_float2(q, 0.0f), sh).x / (float)n;
		const float rstd = 1.0f / sqrtf(var + eps);

		if (!active)
			continue;
#pragma unroll
		for (int i = 0; i < V; i++) {
			xv[i] = (xv[i] - mean) * rstd * wv[i];
			if (b)
				xv[i] += bv[i];
		}
		store_vec(y + r * y_ld + col, xv);
		if (threadIdx.x == 0)
			store_stats(mean_out, rstd_out, r, mean, rstd);
	}
}

/* d_x as layer_norm_backward_dx computes it, a row a group, d_y and x read
 * once into registers; with part_w and part_b, this block's sums over its
 * rows of d_y xhat and of d_y (the groups' added up in group order through
 * buf, n floats of shared memory) into row blockIdx.x of each. */
template <typename T>
__global__ void __launch_bounds__(1024) layer_norm_backward_vec(const T *dy, int64_t dy_ld, const T *x, int64_t x_ld,
								const T *w, const float *mean, const float *rstd, T *dx,
								int64_t dx_ld, const T *res, int64_t res_ld,
								float *part_w, float *part_b, int64_t rows, int64_t n)
{
	constexpr int V = vec_len<T>();
	__shared__ float2 sh[FUSED_GROUPS_MAX][32];
	extern __shared__ float buf[];
	const int64_t col = (int64_t)threadIdx.x * V;
	float wv[V], acc_w[V], acc_b[V];

	load_vec(w + col, wv);
#pragma unroll
	for (int i = 0; i < V; i++)
		acc_w[i] = acc_b[i] = 0.0f;
	for (int64_t base = (int64_t)blockIdx.x * blockDim.y; base < rows; base += (int64_t)gridDim.x * blockDim.y) {
		const int64_t r = base + threadIdx.y;
		const bool active = r < rows;
		float g[V], xh[V], sg = 0.0f, sgx = 0.0f, rs = 0.0f;

		if (active) {
			float d[V];
			const float mu = mean[r];
			rs = rstd[r];
			load_vec(dy + r * dy_ld + col, d);
			load_vec(x + r * x_ld + col, xh);
#pragma unroll
			for (int i = 0; i < V; i++) {
				xh[i] = (xh[i] - mu) * rs;
				g[i] = __fmul_rn(d[i], wv[i]);
				sg += g[i];
				sgx += g[i] * xh[i];
				acc_w[i] += d[i] * xh[i];
				acc_b[i] += d[i];
			}
		}
		const float2 t = group_sum2(make_float2(sg, sgx), sh);
		const float mean_g = t.x / (float)n, mean_gx = t.y / (float)n;

		if (!active)
			continue;
		if (res) {
			float rv[V];
			load_vec(res + r * res_ld + col, rv);
#pragma unroll
			for (int i = 0; i < V; i++)
				g[i] = rs * (g[i] - mean_g - xh[i] * mean_gx) + rv[i];
		} else {
#pragma unroll
			for (int i = 0; i < V; i++)
				g[i] = rs * (g[i] - mean_g - xh[i] * mean_gx);
		}
		store_vec(dx + r * dx_ld + col, g);
	}
	if (!part_w)
		return;
#pragma unroll
	for (int pass = 0; pass < 2; pass++) {
		const float *acc = pass ? acc_b : acc_w;
		for (unsigned group = 0; group < blockDim.y; group++) {
			if (threadIdx.y == group) {
#pragma unroll
				for (int i = 0; i < V; i++)
					buf[col + i] = group ? buf[col + i] + acc[i] : acc[i];
			}
			__syncthreads();
		}
		float *part = (pass ? part_b : part_w) + (int64_t)blockIdx.x * n;
		for (int64_t j = (int64_t)threadIdx.y * blockDim.x + threadIdx.x; j < n; j += (int64_t)blockDim.x * blockDim.y)
			part[j] = buf[j];
		__syncthreads();
	}
}

/* Block (cols, chunk): the sums over the chunk's rows of d_y xhat and of
 * d_y for 32 columns, into part_w[chunk][col] and part_b[chunk][col]. */
template <typename T>
__global__ void layer_norm_backward_partial(const T *dy, int64_t dy_ld, const T *x, int64_t x_ld, const float *mean,
					    const float *rstd, float *part_w, float *part_b, int64_t rows, int64_t n,
					    int64_t chunk_rows)
{
	__shared__ float2 sh[PARTIAL_ROWS][PARTIAL_COLS + 1];
	const int64_t col = (int64_t)blockIdx.x * PARTIAL_COLS + threadIdx.x;
	const int64_t first = (int64_t)blockIdx.y * chunk_rows;
	const int64_t end = first + chunk_rows < rows ? first + chunk_rows : rows;
	float sw = 0.0f, sb = 0.0f;

	if (col < n) {
		for (int64_t r = first + threadIdx.y; r < end; r += PARTIAL_ROWS) {
			const float d = load(dy + r * dy_ld, col);
			sw += d * ((load(x + r * x_ld, col) - mean[r]) * rstd[r]);
			sb += d;
		}
	}
	sh[threadIdx.y][threadIdx.x] = make_float2(sw, sb);
	__syncthreads();
	if (threadIdx.y == 0 && col < n) {
		float2 s = sh[0][threadIdx.x];
		for (int k = 1; k < PARTIAL_ROWS; k++) {
			s.x += sh[k][threadIdx.x].x;
			s.y += sh[k][threadIdx.x].y;
		}
		part_w[blockIdx.y * n + col] = s.x;
		part_b[blockIdx.y * n + col] = s.y;
	}
}

/* Each column's chunks added up: a block of 32 columns by REDUCE_ROWS
 * threads, each thread summing every REDUCE_ROWS-th chunk, then the
 * threads' sums in thread order (the same bits every time). */
constexpr int REDUCE_ROWS = 16;

template <typename T>
__global__ void layer_norm_backward_reduce(const float *part_w, const float *part_b, int64_t chunks, int64_t n, T *dw,
					   T *db)
{
	__shared__ float2 sh[REDUCE_ROWS][PARTIAL_COLS + 1];
	const int64_t col = (int64_t)blockIdx.x * PARTIAL_COLS + threadIdx.x;
	float sw = 0.0f, sb = 0.0f;

	if (col < n) {
		for (int64_t c = threadIdx.y; c < chunks; c += REDUCE_ROWS) {
			sw += part_w[c * n + col];
			sb += part_b[c * n + col];
		}
	}
	sh[threadIdx.y][threadIdx.x] = make_float2(sw, sb);
	__syncthreads();
	if (threadIdx.y != 0 || col >= n)
		return;
	float2 s = sh[0][threadIdx.x];
	for (int k = 1; k < REDUCE_ROWS; k++) {
		s.x += sh[k][threadIdx.x].x;
		s.y += sh[k][threadIdx.x].y;
	}
	if (dw)
		store(dw, col, s.x);
	if (db)
		store(db, col, s.y);
}

/* Threads of a row's block: about 8 columns each, 32 to 1024. */
unsigned row_threads(int64_t n)
{
	unsigned t = 32;
	while (t < 1024 && (int64_t)t * 8 < n)
		t *= 2;
	return t;
}

unsigned row_blocks(int64_t rows)
{
	return (unsigned)(rows < ROW_BLOCKS_MAX ? rows : ROW_BLOCKS_MAX);
}

int64_t chunk_rows_for(int64_t rows)
{
	int64_t c = (rows + CHUNKS_MAX - 1) / CHUNKS_MAX;
	return c < CHUNK_ROWS_MIN ? CHUNK_ROWS_MIN : c;
}

int64_t chunks_for(int64_t rows)
{
	const int64_t c = chunk_rows_for(rows);
	return (rows + c - 1) / c;
}

/* The vectorised kernels' shape for rows of n of T: threads of a row
 * (x), rows at once (y); false where they do not apply (n not a multiple
 * of 32 vectors, more than 1024 vectors, or a row not 16-byte aligned). */
template <typename T>
bool vec_shape(int64_t n, const void *const *ptrs, const int64_t *lds, int count, dim3 *block)
{
	constexpr int V = vec_len<T>();
	if (n % (32 * V) != 0 || n / V > 1024)
		return false;
	for (int i = 0; i < count; i++)
		if (ptrs[i] && (((uintptr_t)ptrs[i] % VEC_BYTES) != 0 || lds[i] % V != 0))
			return false;
	const unsigned threads = (unsigned)(n / V);
	*block = dim3(threads, threads < FUSED_THREADS ? FUSED_THREADS / threads : 1);
	return true;
}

unsigned vec_blocks(int64_t rows, unsigned rows_at_once)
{
	const int64_t b = (rows + rows_at_once - 1) / rows_at_once;
	return (unsigned)(b < FUSED_BLOCKS_MAX ? b : FUSED_BLOCKS_MAX);
}

template <typename T>
cudaError_t forward(const struct rk_layer_norm *a, cudaStream_t stream)
{
	/* cudaGetLastError after the launch answers for this thread's last
	 * failed runtime call, whichever it was: an error a lane's earlier
	 * call left (a scratch allocation that ran out) is read off first, so
	 * that it is not reported as this launch's. */
	(void)cudaGetLastError();
	const void *ptrs[] = { a->x, a->y, a->weight, a->bias };
	const int64_t lds[] = { a->x_ld, a->y_ld, 0, 0 };
	dim3 block;
	if (vec_shape<T>(a->n, ptrs, lds, 4, &block)) {
		layer_norm_forward_vec<T><<<vec_blocks(a->rows, block.y), block, 0, stream>>>(
			(const T *)a->x, a->x_ld, (const T *)a->weight, (const T *)a->bias, (T *)a->y, a->y_ld, a->mean,
			a->rstd, a->rows, a->n, a->eps);
		return cudaGetLastError();
	}
	layer_norm_forward<T><<<row_blocks(a->rows), row_threads(a->n), 0, stream>>>(
		(const T *)a->x, a->x_ld, (const T *)a->weight, (const T *)a->bias, (T *)a->y, a->y_ld, a->mean, a->rstd,
		a->rows, a->n, a->eps);
	return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const struct rk_layer_norm_backward *a, cudaStream_t stream)
{
	(void)cudaGetLastError();   /* as in forward() */
	const bool sums = a->d_weight || a->d_bias;
	const void *ptrs[] = { a->d_y, a->x, a->d_x, a->d_residual, a->weight };
	const int64_t lds[] = { a->d_y_ld, a->x_ld, a->d_x_ld, a->d_residual_ld, 0 };
	const unsigned col_blocks = (unsigned)((a->n + PARTIAL_COLS - 1) / PARTIAL_COLS);
	int64_t chunks;
	dim3 block;
	cudaError_t e;
	/* d_x, and the partial sums of d_weight and d_bias in `chunks` rows
	 * of scratch: in one kernel (vectorised), or two. */
	if (vec_shape<T>(a->n, ptrs, lds, 5, &block)) {
		chunks = vec_blocks(a->rows, block.y);
		layer_norm_backward_vec<T><<<(unsigned)chunks, block, sums ? (size_t)a->n * sizeof(float) : 0, stream>>>(
			(const T *)a->d_y, a->d_y_ld, (const T *)a->x, a->x_ld, (const T *)a->weight, a->mean, a->rstd,
			(T *)a->d_x, a->d_x_ld, (const T *)a->d_residual, a->d_residual_ld, sums ? a->partial : nullptr,
			sums ? a->partial + chunks * a->n : nullptr, a->rows, a->n);
		e = cudaGetLastError();
		if (e != cudaSuccess || !sums)
			return e;
	} else {
		layer_norm_backward_dx<T><<<row_blocks(a->rows), row_threads(a->n), 0, stream>>>(
			(const T *)a->d_y, a->d_y_ld, (const T *)a->x, a->x_ld, (const T *)a->weight, a->mean, a->rstd,
			(T *)a->d_x, a->d_x_ld, (const T *)a->d_residual, a->d_residual_ld, a->rows, a->n);
		e = cudaGetLastError();
		if (e != cudaSuccess || !sums)
			return e;
		chunks = chunks_for(a->rows);
		layer_norm_backward_partial<T><<<dim3(col_blocks, (unsigned)chunks), dim3(PARTIAL_COLS, PARTIAL_ROWS), 0,
						 stream>>>((const T *)a->d_y, a->d_y_ld, (const T *)a->x, a->x_ld, a->mean,
							   a->rstd, a->partial, a->partial + chunks * a->n, a->rows,
							   a->n, chunk_rows_for(a->rows));
		e = cudaGetLastError();
		if (e != cudaSuccess)
			return e;
	}
	layer_norm_backward_reduce<T><<<col_blocks, dim3(PARTIAL_COLS, REDUCE_ROWS), 0, stream>>>(
		a->partial, a->partial + chunks * a->n, chunks, a->n, (T *)a->d_weight, (T *)a->d_bias);
	return cudaGetLastError();
}

} // namespace

extern "C" size_t rk_layer_norm_backward_scratch(int64_t rows, int64_t n)
{
	if (rows < 1 || n < 1 || n > RK_LAYER_NORM_N_MAX)
		return 0;
	/* The scalar kernels' chunks or the vectorised kernels' blocks, the
	 * more of the two (at most one a row either way). */
	const int64_t vec = rows < FUSED_BLOCKS_MAX ? rows : FUSED_BLOCKS_MAX;
	const int64_t parts = chunks_for(rows) > vec ? chunks_for(rows) : vec;
	return 2 * (size_t)parts * (size_t)n * sizeof(float);
}

extern "C" cudaError_t rk_layer_norm(const struct rk_layer_norm *a, cudaStream_t stream)
{
	if (!a || a->rows < 1 || a->n < 1 || a->n > RK_LAYER_NORM_N_MAX || !a->x || !a->weight || !a->y)
		return cudaErrorInvalidValue;
	switch (a->dtype) {
	case RK_F32: return forward<float>(a, stream);
	case RK_F16: return forward<__half>(a, stream);
	case RK_BF16: return forward<__nv_bfloat16>(a, stream);
	}
	return cudaErrorInvalidValue;
}

extern "C" cudaError_t rk_layer_norm_backward(const struct rk_layer_norm_backward *a, cudaStream_t stream)
{
	if (!a || a->rows < 1 || a->n < 1 || a->n > RK_LAYER_NORM_N_MAX || !a->d_y || !a->x || !a->weight ||
	    !a->mean || !a->rstd || !a->d_x || ((a->d_weight || a->d_bias) && !a->partial))
		return cudaErrorInvalidValue;
	switch (a->dtype) {
	case RK_F32: return backward<float>(a, stream);
	case RK_F16: return backward<__half>(a, stream);
	case RK_BF16: return backward<__nv_bfloat16>(a, stream);
	}
	return cudaErrorInvalidValue;
}
