/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA C for a plan's FUSED, REDUCTION and GATHER steps, written from the
 * checked IR alone: op names and tensor names only ever reach the source
 * inside comments, filtered to identifier characters, and every number is
 * one the checker bounded. Shapes, strides and offsets are literals.
 *
 * Numerics follow the contract of proto/program.h (node_ctype says which
 * type each node computes in): a node reads its inputs converted from their
 * dtype and rounds its result to its output's dtype, in registers too, so
 * a fused chain gives the bits the same chain gives node by node. The formulas are ATen's (gelu, gelu_tanh, silu, the
 * *_backward ops, pow's special exponents, NaN-propagating max and min).
 * Reductions accumulate in f32 (f64 where the input or the output is f64)
 * in a fixed order, with no atomics: the same bits every run. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/program/codegen.h"
#include "proto/errors.h"
#include "proto/philox.h"

/* Launch shapes. Pointwise kernels: 256 threads; gathers a grid of at
 * most 8 blocks per SM (a full SM), looping over the rest. A fused
 * pointwise kernel's grid covers its work once, one vector a thread (no
 * cap): measured on an H200 (y = x * 2 + z, bf16, 1.5 GiB moved), that
 * reached 91% of the memory's peak where a grid of 4 to 16 blocks per SM
 * looping over the rest, with 1 to 4 vectors a thread at a time, reached
 * 83 to 87% (cudaMemcpy: 87%). */
#define PW_BLOCK 256
#define PW_BLOCKS_PER_SM 8
#define PW_FUSED_BLOCKS_PER_SM RD_PROG_GRID_UNCAPPED
/* Rows up to this long are reduced by one warp each (8 rows a block),
 * longer ones by a block of ROW_BLOCK threads. */
#define ROW_WARP_MAX 1024
#define ROW_BLOCK 512
/* Leading-axis reductions: a block sums 32 columns over a chunk of rows (8
 * threads down each column); with several chunks the partial sums go to
 * the arena and a second kernel adds them in chunk order. Chunks are sized
 * so that about COL_TARGET_BLOCKS blocks run, each chunk at least
 * COL_CHUNK_ROWS_MIN rows. */
#define COL_TILE 32
#define COL_ROW_THREADS 8
#define COL_TARGET_BLOCKS 1024
#define COL_CHUNK_ROWS_MIN 64
/* Embedding backward: positions sorted by index in tiles of EMB_SORT_TILE
 * keys (a block of EMB_SORT_BLOCK threads each), then each index's rows
 * summed by blocks of EMB_BLOCK columns. */
#define EMB_SORT_TILE 1024
#define EMB_SORT_BLOCK 256
#define EMB_BLOCK 256
/* A step's kernels, but for an embedding backward's (emb_sort_of): a
 * leading reduction's two, an embedding's gather and its report. */
#define STEP_KERNELS_MAX 2
/* Above this, indices and offsets are 64-bit. */
#define IDX32_MAX (INT64_C(1) << 30)

/* ---- text ---------------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t len, cap;
	bool failed;
};

static void sb_vprintf(struct sbuf *b, const char *fmt, va_list ap)
{
	va_list aq;
	int n;

	if (b->failed)
		return;
	va_copy(aq, ap);
	n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, aq);
	va_end(aq);
	if (n < 0) {
		b->failed = true;
		return;
	}
	if (!b->p || b->len + (size_t)n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + (size_t)n + 1)
			cap *= 2;
		char *q = realloc(b->p, cap);
		if (!q) {
			b->failed = true;
			return;
		}
		b->p = q;
		b->cap = cap;
		vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	}
	b->len += (size_t)n;
}

static void __attribute__((format(printf, 2, 3))) out(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	sb_vprintf(b, fmt, ap);
	va_end(ap);
}

/* A name from the definition, fit for a comment: identifier characters,
 * dots, colons and dashes only (no comment can be ended from it). */
static const char *safe_name(const char *s, char buf[RP_PROG_NAME_MAX + 1])
{
	size_t i;

	for (i = 0; s[i] && i < RP_PROG_NAME_MAX; i++) {
		char c = s[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
			  c == '.' || c == ':' || c == '-';
		buf[i] = ok ? c : '?';
	}
	buf[i] = '\0';
	return buf;
}

/* An integer literal, typed wide enough. */
static const char *lit(int64_t v, char buf[32])
{
	if (v >= INT32_MIN && v <= INT32_MAX)
		snprintf(buf, 32, "%lld", (long long)v);
	else
		snprintf(buf, 32, "%lldLL", (long long)v);
	return buf;
}

/* A double literal that reads back as exactly v, as short as that allows. */
static void out_double(struct sbuf *b, double v)
{
	char buf[40];

	if (isnan(v)) {
		out(b, "__longlong_as_double(0x7ff8000000000000LL)");
		return;
	}
	if (isinf(v)) {
		out(b, v > 0 ? "__longlong_as_double(0x7ff0000000000000LL)" : "__longlong_as_double((long long)0xfff0000000000000ULL)");
		return;
	}
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	out(b, "%s", buf);
	if (!strpbrk(buf, ".en"))
		out(b, ".0");
}

/* ---- what every source starts with ------------------------------------- */

static const char preamble[] =
	"#include <cuda_fp16.h>\n"
	"#include <cuda_bf16.h>\n"
	"\n"
	"#define RG_DEV __device__ __forceinline__\n"
	"\n"
	"/* A vector of N elements, loaded and stored in one access when aligned. */\n"
	"template <class T, int N> struct alignas(sizeof(T) * N) rg_vec { T v[N]; };\n"
	"\n"
	"/* Reading a stored value into the compute type. */\n"
	"RG_DEV float rg_f32(float x) { return x; }\n"
	"RG_DEV float rg_f32(double x) { return (float)x; }\n"
	"RG_DEV float rg_f32(__half x) { return __half2float(x); }\n"
	"RG_DEV float rg_f32(__nv_bfloat16 x) { return __bfloat162float(x); }\n"
	"RG_DEV float rg_f32(int x) { return (float)x; }\n"
	"RG_DEV float rg_f32(long long x) { return (float)x; }\n"
	"RG_DEV float rg_f32(unsigned char x) { return (float)x; }\n"
	"RG_DEV double rg_f64(float x) { return x; }\n"
	"RG_DEV double rg_f64(double x) { return x; }\n"
	"RG_DEV double rg_f64(__half x) { return __half2float(x); }\n"
	"RG_DEV double rg_f64(__nv_bfloat16 x) { return __bfloat162float(x); }\n"
	"RG_DEV double rg_f64(int x) { return x; }\n"
	"RG_DEV double rg_f64(long long x) { return (double)x; }\n"
	"RG_DEV double rg_f64(unsigned char x) { return x; }\n"
	"\n"
	"/* Rounding a computed value to a tensor's dtype, once (f64 to bf16\n"
	" * directly, not through f32). Integers truncate toward 0, saturated to\n"
	" * their range (the hardware's conversion: NaN is 0). */\n"
	"template <class To> RG_DEV To rg_cvt(float x);\n"
	"template <class To> RG_DEV To rg_cvt(double x);\n"
	"template <> RG_DEV float rg_cvt<float>(float x) { return x; }\n"
	"template <> RG_DEV float rg_cvt<float>(double x) { return (float)x; }\n"
	"template <> RG_DEV double rg_cvt<double>(float x) { return x; }\n"
	"template <> RG_DEV double rg_cvt<double>(double x) { return x; }\n"
	"template <> RG_DEV __half rg_cvt<__half>(float x) { return __float2half_rn(x); }\n"
	"template <> RG_DEV __half rg_cvt<__half>(double x) { return __double2half(x); }\n"
	"template <> RG_DEV __nv_bfloat16 rg_cvt<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }\n"
	"template <> RG_DEV __nv_bfloat16 rg_cvt<__nv_bfloat16>(double x) { return __double2bfloat16(x); }\n"
	"template <> RG_DEV int rg_cvt<int>(float x) { return (int)x; }\n"
	"template <> RG_DEV int rg_cvt<int>(double x) { return (int)x; }\n"
	"template <> RG_DEV long long rg_cvt<long long>(float x) { return (long long)x; }\n"
	"template <> RG_DEV long long rg_cvt<long long>(double x) { return (long long)x; }\n"
	"template <> RG_DEV unsigned char rg_cvt<unsigned char>(float x) { return x != x || x <= 0.0f ? 0 : x >= 255.0f ? 255 : (unsigned char)x; }\n"
	"template <> RG_DEV unsigned char rg_cvt<unsigned char>(double x) { return x != x || x <= 0.0 ? 0 : x >= 255.0 ? 255 : (unsigned char)x; }\n"
	"\n"
	"/* The math library, by compute type. */\n"
	"RG_DEV float rg_exp(float x) { return expf(x); }\n"
	"RG_DEV double rg_exp(double x) { return exp(x); }\n"
	"RG_DEV float rg_log(float x) { return logf(x); }\n"
	"RG_DEV double rg_log(double x) { return log(x); }\n"
	"RG_DEV float rg_tanh(float x) { return tanhf(x); }\n"
	"RG_DEV double rg_tanh(double x) { return tanh(x); }\n"
	"RG_DEV float rg_erf(float x) { return erff(x); }\n"
	"RG_DEV double rg_erf(double x) { return erf(x); }\n"
	"RG_DEV float rg_sqrt(float x) { return sqrtf(x); }\n"
	"RG_DEV double rg_sqrt(double x) { return sqrt(x); }\n"
	"RG_DEV float rg_rsqrt(float x) { return rsqrtf(x); }\n"
	"RG_DEV double rg_rsqrt(double x) { return rsqrt(x); }\n"
	"RG_DEV float rg_abs(float x) { return fabsf(x); }\n"
	"RG_DEV double rg_abs(double x) { return fabs(x); }\n"
	"RG_DEV float rg_pow(float x, float y) { return powf(x, y); }\n"
	"RG_DEV double rg_pow(double x, double y) { return pow(x, y); }\n"
	"\n"
	"/* ATen's definitions (torch/aten/src/ATen/native/cuda). */\n"
	"template <class T> RG_DEV T rg_maximum(T a, T b) { return a != a ? a : b != b ? b : a > b ? a : b; }\n"
	"template <class T> RG_DEV T rg_minimum(T a, T b) { return a != a ? a : b != b ? b : a < b ? a : b; }\n"
	"template <class T> RG_DEV T rg_sigmoid(T x) { return T(1) / (T(1) + rg_exp(-x)); }\n"
	"template <class T> RG_DEV T rg_silu(T x) { return x / (T(1) + rg_exp(-x)); }\n"
	"template <class T> RG_DEV T rg_relu(T x) { return x <= T(0) ? T(0) : x; }\n"
	"/* x/2 (1 + erf(x / sqrt 2)) */\n"
	"template <class T> RG_DEV T rg_gelu(T x) { return x * T(0.5) * (T(1) + rg_erf(x * T(0.70710678118654752440))); }\n"
	"/* kBeta = sqrt(2) * 2/sqrt(pi) / 2, kKappa = 0.044715 */\n"
	"template <class T> RG_DEV T rg_gelu_tanh(T x)\n"
	"{\n"
	"\tconst T beta = T(0.79788456080286535588), kappa = T(0.044715);\n"
	"\tconst T inner = beta * (x + kappa * (x * x * x));\n"
	"\treturn T(0.5) * x * (T(1) + rg_tanh(inner));\n"
	"}\n"
	"template <class T> RG_DEV T rg_gelu_backward(T dy, T x)\n"
	"{\n"
	"\tconst T beta = T(0.39894228040143267794), alpha = T(0.70710678118654752440);\n"
	"\tconst T cdf = T(0.5) * (T(1) + rg_erf(x * alpha));\n"
	"\tconst T pdf = rg_exp(T(-0.5) * x * x) * beta;\n"
	"\treturn dy * (cdf + x * pdf);\n"
	"}\n"
	"template <class T> RG_DEV T rg_gelu_tanh_backward(T dy, T x)\n"
	"{\n"
	"\tconst T beta = T(0.79788456080286535588), kappa = T(0.044715);\n"
	"\tconst T x_sq = x * x, x_cube = x_sq * x;\n"
	"\tconst T tanh_inner = rg_tanh(beta * (x + kappa * x_cube));\n"
	"\tconst T left = T(0.5) * x, right = T(1) + tanh_inner;\n"
	"\tconst T left_derivative = T(0.5) * right;\n"
	"\tconst T tanh_derivative = T(1) - tanh_inner * tanh_inner;\n"
	"\tconst T inner_derivative = beta * (T(1) + T(3) * kappa * x_sq);\n"
	"\tconst T right_derivative = left * tanh_derivative * inner_derivative;\n"
	"\treturn dy * (left_derivative + right_derivative);\n"
	"}\n"
	"template <class T> RG_DEV T rg_silu_backward(T dy, T x)\n"
	"{\n"
	"\tconst T sigmoid = T(1) / (T(1) + rg_exp(-x));\n"
	"\treturn dy * sigmoid * (T(1) + x * (T(1) - sigmoid));\n"
	"}\n"
	"template <class T> RG_DEV T rg_sigmoid_backward(T dy, T y) { return dy * (T(1) - y) * y; }\n"
	"template <class T> RG_DEV T rg_tanh_backward(T dy, T y) { return dy * (T(1) - y * y); }\n"
	"template <class T> RG_DEV T rg_relu_backward(T dy, T x) { return x <= T(0) ? T(0) : dy; }\n"
	"\n"
	"/* Reductions' steps: NaN wins in max and min, as in torch. */\n"
	"template <class T> RG_DEV T rg_red_sum(T a, T b) { return a + b; }\n"
	"template <class T> RG_DEV T rg_red_max(T a, T b) { return (a != a || a > b) ? a : b; }\n"
	"template <class T> RG_DEV T rg_red_min(T a, T b) { return (a != a || a < b) ? a : b; }\n"
	"/* logsumexp online: m the running max, s the sum of exp(x - m) so far\n"
	" * (proto/program.h); the host's acc_add, step for step. */\n"
	"template <class T> struct rg_lse { T m, s; };\n"
	"RG_DEV rg_lse<float> rg_lse_start(float) { return rg_lse<float>{ -__int_as_float(0x7f800000), 0.0f }; }\n"
	"RG_DEV rg_lse<double> rg_lse_start(double)\n"
	"{\n"
	"\treturn rg_lse<double>{ -__longlong_as_double(0x7ff0000000000000LL), 0.0 };\n"
	"}\n"
	"template <class T> RG_DEV rg_lse<T> rg_lse_add(rg_lse<T> a, T x)\n"
	"{\n"
	"\tif (x != x || a.m != a.m)\n"
	"\t\treturn rg_lse<T>{ x != x ? x : a.m, a.s };\n"
	"\tif (x == a.m)\n"
	"\t\treturn rg_lse<T>{ a.m, a.s + T(1) };\n"
	"\tif (x > a.m)\n"
	"\t\treturn rg_lse<T>{ x, a.s * rg_exp(a.m - x) + T(1) };\n"
	"\treturn rg_lse<T>{ a.m, a.s + rg_exp(x - a.m) };\n"
	"}\n"
	"template <class T> RG_DEV rg_lse<T> rg_red_lse(rg_lse<T> a, rg_lse<T> b)\n"
	"{\n"
	"\tif (a.m != a.m || b.m != b.m)\n"
	"\t\treturn a.m != a.m ? a : b;\n"
	"\tif (b.s == T(0))\n"
	"\t\treturn a;\n"
	"\tif (a.s == T(0))\n"
	"\t\treturn b;\n"
	"\tif (a.m == b.m)\n"
	"\t\treturn rg_lse<T>{ a.m, a.s + b.s };\n"
	"\treturn a.m > b.m ? rg_lse<T>{ a.m, a.s + b.s * rg_exp(b.m - a.m) }\n"
	"\t\t\t : rg_lse<T>{ b.m, b.s + a.s * rg_exp(a.m - b.m) };\n"
	"}\n"
	"template <class T> RG_DEV T rg_lse_result(rg_lse<T> a)\n"
	"{\n"
	"\t/* NaN, and an infinite max (m - m is NaN), are the answer. */\n"
	"\treturn a.m != a.m || a.m - a.m != T(0) ? a.m : a.m + rg_log(a.s);\n"
	"}\n"
	"/* A warp's shuffle of an accumulator, whatever it holds. */\n"
	"RG_DEV float rg_shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }\n"
	"RG_DEV double rg_shfl_xor(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }\n"
	"template <class T> RG_DEV rg_lse<T> rg_shfl_xor(rg_lse<T> v, int o)\n"
	"{\n"
	"\treturn rg_lse<T>{ rg_shfl_xor(v.m, o), rg_shfl_xor(v.s, o) };\n"
	"}\n"
	"\n"
	"/* dropout_mask's draw (proto/philox.h, the host's rp_dropout_keep, bit for\n"
	" * bit): Philox4x32-10's word 0 at counter (i, i >> 32, stream, 0) under\n"
	" * the seed's halves, kept where word >> 8 >= threshold = ceil(p 2^24). A\n"
	" * seed a Run would refuse reads as 0, as on the host. */\n"
	"RG_DEV bool rg_dropout_keep(double seed_value, unsigned int stream, unsigned long long i, unsigned int threshold)\n"
	"{\n"
	"\tconst unsigned long long seed =\n"
	"\t\tseed_value >= 0.0 && seed_value < 9007199254740992.0 ? (unsigned long long)seed_value : 0ull;\n"
	"\tunsigned int c0 = (unsigned int)i, c1 = (unsigned int)(i >> 32), c2 = stream, c3 = 0u;\n"
	"\tunsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);\n"
	"#pragma unroll\n"
	"\tfor (int r = 0; r < 10; r++) {\n"
	"\t\tconst unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;\n"
	"\t\tif (r > 0) {\n"
	"\t\t\tk0 += 0x9E3779B9u;\n"
	"\t\t\tk1 += 0xBB67AE85u;\n"
	"\t\t}\n"
	"\t\tc0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;\n"
	"\t\tc1 = (unsigned int)p1;\n"
	"\t\tc2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;\n"
	"\t\tc3 = (unsigned int)p0;\n"
	"\t}\n"
	"\treturn c0 >> 8 >= threshold;\n"
	"}\n"
	"\n";

/* ---- dtypes ----------------------------------------------------------------- */

static const char *ctype(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_F32:
		return "float";
	case RP_DTYPE_F16:
		return "__half";
	case RP_DTYPE_BF16:
		return "__nv_bfloat16";
	case RP_DTYPE_I32:
		return "int";
	case RP_DTYPE_F64:
		return "double";
	case RP_DTYPE_I64:
		return "long long";
	case RP_DTYPE_U8:
		return "unsigned char";
	default:
		return NULL;
	}
}

/* Computing with this dtype takes f64: f64 itself, and integers, which
 * f32 would round past 2^24. */
static bool needs_f64(enum rp_dtype dt)
{
	return dt == RP_DTYPE_F64 || dt == RP_DTYPE_I32 || dt == RP_DTYPE_I64;
}

/* ---- a step being written ------------------------------------------------ */

enum { VEC_NONE = 0, VEC_FLAT, VEC_ROW };

struct gen {
	const struct rp_program *p;
	const struct rd_prog_plan *plan;
	struct rd_prog_step *st;
	int s;
	struct sbuf b;
	/* The iteration domain: a FUSED step's output shape, a reduction's
	 * input shape. */
	const struct rp_prog_tensor *dom;
	/* The pointwise nodes written at each element, in the order they
	 * run: a FUSED step's; a reduction's prologue, then its epilogue over
	 * the domain (elem[], nelem; pw[] is the pass being written: the
	 * prologue alone on the reduction's pass, all of them on the pass
	 * after it, which computes the prologue anew and stores from
	 * store_from on). */
	const int *pw;
	int npw;
	int store_from;
	int *elem;
	int nelem, nprologue;
	int cur;              /* the position in pw[] being written (npw: the reduction) */
	int red;              /* the reduction node, or -1 */
	/* A last-axis reduction's epilogue over rows (rsqrt(mean + eps)), in
	 * the order it runs: each row's values in v<node>, once the row's
	 * result is (rows_ready); row_scope while one of them is written
	 * (what it reads from memory is r<t>, loaded once a row). */
	int *rows;
	int nrows;
	/* The pass after the reduction: the prologue nodes the epilogue
	 * reads (first nrecomputed), then the epilogue over the domain. */
	int *pass2;
	int npass2, nrecomputed;
	bool rows_ready, row_scope;
	bool *row_loaded;
	/* Recomputed roots (plan.h): what node rec_node reads of one is in
	 * u<rec_node>_<rec_depth>_<t>; while a writer of one is written (at
	 * depth rec_depth - 1), at is its coordinates' prefix (its frame of
	 * at_rank dims), where it loads what it reads from memory. */
	int rec_node, rec_depth;
	const char *at;
	int at_rank;
	bool idx64;
	int vec;              /* elements a thread takes at once on the vector path (1: no such path) */
	/* The element body being written is the vector path's: the element's
	 * flat index in the domain is base + j there, idx on the scalar path. */
	bool in_vector;
	int *mem;             /* tensors read from memory, each once */
	int nmem;
	bool *root_written;   /* per tensor: its root is written by the step */
	bool *declared;       /* per tensor: p<t> is declared */
	bool unplaced;        /* a tensor in memory that the arena has no place for */
	bool coord_used[RP_PROG_RANK_MAX];   /* the domain's coordinates the element body reads */
	/* The vector path: per tensor, how a thread's `vec` elements of it
	 * are one access (VEC_FLAT, VEC_ROW; VEC_NONE: element by element),
	 * and the coordinates b<d> of the vector's first element it needs. */
	unsigned char *vmode;
	bool base_used[RP_PROG_RANK_MAX];
	int *loaded_as;       /* per tensor read from memory: the tensor of g->mem holding its view */
	struct rp_error *err;
};

static const struct rp_prog_tensor *T(const struct gen *g, int t)
{
	return &g->p->tensors[t];
}

static bool is_scalar(const struct gen *g, int t)
{
	return T(g, t)->kind == RP_PT_SCALAR;
}

static int64_t numel_of(const struct rp_prog_tensor *t)
{
	int64_t n = 1;

	for (int k = 0; k < t->rank; k++)
		n *= t->shape[k];
	return n;
}

/* The largest element offset t reaches past its first element. */
static int64_t span_of(const struct rp_prog_tensor *t)
{
	int64_t s = 0;

	for (int k = 0; k < t->rank; k++)
		s += (t->shape[k] - 1) * t->strides[k];
	return s;
}

static bool contiguous(const struct rp_prog_tensor *t)
{
	int64_t expect = 1;

	for (int k = t->rank - 1; k >= 0; k--) {
		if (t->shape[k] == 1)
			continue;
		if (t->strides[k] != expect)
			return false;
		expect *= t->shape[k];
	}
	return true;
}

/* t covers the domain element for element, in its order: the element at
 * flat index idx is t's element idx. */
static bool flat_in_domain(const struct gen *g, int t)
{
	const struct rp_prog_tensor *x = T(g, t), *d = g->dom;

	if (x->rank > d->rank || numel_of(x) != numel_of(d))
		return false;
	for (int k = 0; k < x->rank; k++)
		if (x->shape[k] != d->shape[d->rank - x->rank + k])
			return false;
	return contiguous(x);
}

/* The latest pointwise node of the step before position `pos` whose
 * output is the very view t (its value is in v<m>), or -1. */
static int reg_of(const struct gen *g, int pos, int t)
{
	for (int k = pos - 1; k >= 0; k--)
		if (rd_prog_same_view(g->p, g->p->nodes[g->pw[k]].out[0], t))
			return g->pw[k];
	return -1;
}

/* The reduction or the row node of the epilogue whose value for the row
 * is t's (rd_prog_same_row; in v<m> once the row's result is known), or
 * -1. */
static int row_value_of(const struct gen *g, int t)
{
	if (g->red < 0 || g->nelem + g->nrows == g->nprologue)
		return -1;
	if (rd_prog_same_row(g->p, g->dom, g->p->nodes[g->red].out[0], t))
		return g->red;
	for (int k = 0; k < g->nrows; k++)
		if (rd_prog_same_row(g->p, g->dom, g->p->nodes[g->rows[k]].out[0], t))
			return g->rows[k];
	return -1;
}

/* row_value_of where the row's values are known (rows_ready). */
static int row_of(const struct gen *g, int t)
{
	return g->rows_ready ? row_value_of(g, t) : -1;
}

/* Adds t to the loads, once per view: two tensors that are the same view
 * (cos as two composites name it) load once. A later pass of the kernel
 * (a reduction's epilogue over the row) loads a view through the pointer
 * the kernel declared for it, whichever name the pass reads it by: the
 * pointers and the vector plan are the step's, made before the passes. */
static void mem_add(struct gen *g, int t)
{
	for (int i = 0; i < g->nmem; i++)
		if (rd_prog_same_view(g->p, g->mem[i], t)) {
			g->loaded_as[t] = g->mem[i];
			return;
		}
	int as = t;
	if (!g->declared[t])
		for (int u = 0; u < g->p->ntensors; u++)
			if (g->declared[u] && rd_prog_same_view(g->p, u, t)) {
				as = u;
				break;
			}
	g->loaded_as[t] = as;
	g->mem[g->nmem++] = as;
}

/* p<t>: the tensor's first element, typed. */
static void declare_pointer(struct gen *g, int t)
{
	const struct rp_prog_tensor *x = T(g, t), *root = T(g, x->root);
	const char *ty = ctype(x->dtype);
	bool ro = !g->root_written[t];
	uint64_t skip = (uint64_t)x->root_offset * rp_dtype_size(x->dtype);
	char name[RP_PROG_NAME_MAX + 1];

	if (g->declared[t])
		return;
	g->declared[t] = true;
	out(&g->b, "\t%s%s *%sp%d = (%s%s *)(", ro ? "const " : "", ty, ro ? "__restrict__ " : "", t, ro ? "const " : "",
	    ty);
	if (root->kind == RP_PT_INTERMEDIATE && g->plan->arena_offset[t] == RD_PROG_NOT_IN_ARENA)
		g->unplaced = true;   /* the plan kept it in registers: a planner's bug */
	if (root->kind == RP_PT_INTERMEDIATE)
		out(&g->b, "a->arena + %llu", (unsigned long long)(g->plan->arena_offset[t] + skip));
	else
		out(&g->b, "(%schar *)a->bound[%d] + %llu", ro ? "const " : "", root->bind_index, (unsigned long long)skip);
	out(&g->b, ");   /* %s %s", safe_name(x->name, name), rp_dtype_name(x->dtype));
	for (int k = 0; k < x->rank; k++)
		out(&g->b, "%s%lld", k ? "x" : " [", (long long)x->shape[k]);
	out(&g->b, "%s */\n", x->rank ? "]" : "");
}

/* Coordinates <prefix><d> of the domain's dims [0, ndims) marked in used[],
 * from the flat index in `var` over those dims. */
static void emit_coords_as(struct gen *g, const char *var, int ndims, const char *ind, const char *prefix,
			   const bool *used)
{
	const struct rp_prog_tensor *d = g->dom;
	int lowest = ndims;
	char l[32];

	for (int k = 0; k < ndims; k++)
		if (used[k]) {
			lowest = k;
			break;
		}
	if (lowest == ndims)
		return;
	out(&g->b, "%sidx_t %sq_ = %s;\n", ind, prefix, var);
	for (int k = ndims - 1; k > lowest; k--) {
		if (d->shape[k] == 1)
			continue;
		if (used[k])
			out(&g->b, "%sconst idx_t %s%d = %sq_ %% %s;\n", ind, prefix, k, prefix, lit(d->shape[k], l));
		out(&g->b, "%s%sq_ /= %s;\n", ind, prefix, lit(d->shape[k], l));
	}
	if (d->shape[lowest] > 1 && lowest > 0)
		out(&g->b, "%sconst idx_t %s%d = %sq_ %% %s;\n", ind, prefix, lowest, prefix, lit(d->shape[lowest], l));
	else
		out(&g->b, "%sconst idx_t %s%d = %sq_;\n", ind, prefix, lowest, prefix);
}

/* The element's coordinates c<d> that the element body reads. */
static void emit_coords(struct gen *g, const char *var, int ndims, const char *ind)
{
	emit_coords_as(g, var, ndims, ind, "c", g->coord_used);
}

/* Marks the coordinates t's offset in the domain uses. */
static void use_coords_of(struct gen *g, int t)
{
	const struct rp_prog_tensor *x = T(g, t);

	for (int k = 0; k < x->rank; k++)
		if (x->shape[k] > 1 && x->strides[k] != 0)
			g->coord_used[g->dom->rank - x->rank + k] = true;
}

/* t's element offset at coordinates <prefix><d> of a frame of `rank`
 * dims, t broadcast against it (right-aligned; its dims of one element
 * stretch). */
static void emit_offset_in(struct gen *g, int t, const char *prefix, int rank)
{
	const struct rp_prog_tensor *x = T(g, t);
	int terms = 0;
	char l[32];

	for (int k = 0; k < x->rank; k++) {
		int dd = rank - x->rank + k;
		if (x->shape[k] == 1 || x->strides[k] == 0)
			continue;
		out(&g->b, "%s%s%d", terms++ ? " + " : "", prefix, dd);
		if (x->strides[k] != 1)
			out(&g->b, " * %s", lit(x->strides[k], l));
	}
	if (!terms)
		out(&g->b, "0");
}

/* t's element offset at the domain's coordinates <prefix><d>. */
static void emit_offset_at(struct gen *g, int t, const char *prefix)
{
	emit_offset_in(g, t, prefix, g->dom->rank);
}

static void emit_offset(struct gen *g, int t)
{
	emit_offset_at(g, t, "c");
}

/* The digit of the flat index `var` for a dim of `size` elements with
 * `below` elements under each step of it, in parentheses: (var / below) %
 * size, without the modulo for the outermost dim. */
static void emit_digit(struct gen *g, const char *var, int64_t below, int64_t size, bool outermost)
{
	char l[32], l2[32];

	if (outermost && below == 1)
		out(&g->b, "%s", var);
	else if (outermost)
		out(&g->b, "(%s / %s)", var, lit(below, l));
	else if (below == 1)
		out(&g->b, "(%s %% %s)", var, lit(size, l));
	else
		out(&g->b, "((%s / %s) %% %s)", var, lit(below, l), lit(size, l2));
}

/* The offset of t's element number `var` (row-major over its shape) with
 * its strides. */
static void emit_flat_offset(struct gen *g, int t, const char *var)
{
	const struct rp_prog_tensor *x = T(g, t);
	int64_t below = 1;
	int terms = 0, lowest = -1;
	char l[32];

	if (contiguous(x)) {
		out(&g->b, "%s", var);
		return;
	}
	for (int k = 0; k < x->rank; k++)
		if (x->shape[k] > 1) {
			lowest = k;
			break;
		}
	for (int k = x->rank - 1; k >= 0; k--) {
		if (x->shape[k] > 1 && x->strides[k] != 0) {
			out(&g->b, "%s", terms++ ? " + " : "");
			emit_digit(g, var, below, x->shape[k], k == lowest);
			out(&g->b, " * %s", lit(x->strides[k], l));
		}
		below *= x->shape[k];
	}
	if (!terms)
		out(&g->b, "0");
}

/* ---- pointwise nodes ---------------------------------------------------- */

/* The type a node computes in (proto/program.h): arithmetic, math and
 * gradients in f32, or f64 where the output is f64; comparisons in f64
 * where an input is f64 or an integer (exact to 2^53), else f32; cast,
 * where, fill, iota and dropout_mask in f64 where any of their tensors is. Scalars are
 * values, not tensors: they promote nothing. */
static const char *node_ctype(const struct gen *g, const struct rp_prog_node *n)
{
	const enum rp_pointwise fn = n->pw.fn;
	bool wide_in = false, wide_out = needs_f64(T(g, n->out[0])->dtype);

	for (int i = 0; i < n->nin; i++)
		if (n->in[i] >= 0 && !is_scalar(g, n->in[i]) && needs_f64(T(g, n->in[i])->dtype))
			wide_in = true;
	if (fn >= RP_PW_EQ && fn <= RP_PW_GE)
		return wide_in ? "double" : "float";
	if (fn == RP_PW_CAST || fn == RP_PW_WHERE || fn == RP_PW_FILL || fn == RP_PW_IOTA || fn == RP_PW_DROPOUT_MASK)
		return wide_in || wide_out ? "double" : "float";
	return T(g, n->out[0])->dtype == RP_DTYPE_F64 ? "double" : "float";
}

/* The dim of the domain an iota computed inline counts along, or -1 when
 * it counts along a dim of one element (always 0). */
static int inline_iota_dim(const struct gen *g, int t)
{
	const struct rp_prog_node *n = &g->p->nodes[g->plan->computed_inline[t]];
	const struct rp_prog_tensor *x = T(g, t);

	if (x->shape[n->pw.axis] == 1)
		return -1;
	return g->dom->rank - x->rank + n->pw.axis;
}

/* Whether the value maker node n (an iota, a dropout_mask) gives tensor t
 * (its output, or that view read where it is computed inline) at the
 * domain's element reads the domain's coordinate d: an iota's dim, if it
 * has more than one element; every dim of more than one element of a
 * mask (its flat index). */
static bool maker_reads_coord(const struct gen *g, const struct rp_prog_node *n, int t, int d)
{
	const struct rp_prog_tensor *x = T(g, t);
	int k = d - (g->dom->rank - x->rank);

	if (n->op->cls != RP_PC_POINTWISE || k < 0 || k >= x->rank || x->shape[k] == 1)
		return false;
	if (n->pw.fn == RP_PW_IOTA)
		return k == n->pw.axis;
	return n->pw.fn == RP_PW_DROPOUT_MASK && !flat_in_domain(g, t);
}

/* Whether a node of the step, or an iota or mask one of them computes
 * inline, reads coordinate d for its value. */
static bool makers_read_coord(const struct gen *g, int d)
{
	for (int k = 0; k < g->npw; k++) {
		const struct rp_prog_node *n = &g->p->nodes[g->pw[k]];
		if (maker_reads_coord(g, n, n->out[0], d))
			return true;
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i], by = t >= 0 ? g->plan->computed_inline[t] : -1;
			if (by >= 0 && maker_reads_coord(g, &g->p->nodes[by], t, d))
				return true;
		}
	}
	return false;
}

/* dropout_mask node n's draw for tensor t (its output, or that view read
 * inline) at the domain's element: true where kept. Its flat index is
 * row-major over t's shape: the domain's own where t covers the domain,
 * else from the coordinates. */
static void emit_dropout_keep(struct gen *g, const struct rp_prog_node *n, int t)
{
	const struct rp_prog_tensor *x = T(g, t);
	int64_t below = 1;
	int terms = 0;

	out(&g->b, "rg_dropout_keep(a->scalar[%d], %uu, ", T(g, n->in[0])->bind_index, (unsigned)n->pw.stream);
	if (flat_in_domain(g, t)) {
		out(&g->b, "(unsigned long long)(%s), %uu)", g->in_vector ? "base + j" : "idx",
		    (unsigned)rp_dropout_threshold(n->pw.p));
		return;
	}
	for (int k = x->rank - 1; k >= 0; k--) {
		if (x->shape[k] > 1) {
			out(&g->b, "%s(unsigned long long)c%d", terms++ ? " + " : "", g->dom->rank - x->rank + k);
			if (below > 1)
				out(&g->b, " * %lluull", (unsigned long long)below);
		}
		below *= x->shape[k];
	}
	out(&g->b, "%s, %uu)", terms ? "" : "0ull", (unsigned)rp_dropout_threshold(n->pw.p));
}

/* The value of tensor t where its iota, fill or dropout_mask is computed
 * inline: its node's value at the element, rounded to t's dtype as a
 * stored one would be, then read with conv. */
static void emit_inline_value(struct gen *g, int t, const char *conv)
{
	const struct rp_prog_node *n = &g->p->nodes[g->plan->computed_inline[t]];
	const char *ty = ctype(T(g, t)->dtype);

	out(&g->b, "%s(rg_cvt<%s>(double(", conv, ty);
	if (n->pw.fn == RP_PW_FILL) {
		out_double(&g->b, n->pw.scalar);
	} else if (n->pw.fn == RP_PW_DROPOUT_MASK) {
		out(&g->b, "(");
		emit_dropout_keep(g, n, t);
		out(&g->b, " ? 1 : 0)");
	} else {
		int d = inline_iota_dim(g, t);
		if (d < 0)
			out(&g->b, "0");
		else
			out(&g->b, "c%d", d);
	}
	out(&g->b, ")))");
}

/* Input i's value in the compute type c. */
static void emit_input(struct gen *g, int node, int t, const char *c)
{
	const char *conv = strcmp(c, "double") == 0 ? "rg_f64" : "rg_f32";
	int m;

	if (is_scalar(g, t)) {
		out(&g->b, "%s(a->scalar[%d])", c, T(g, t)->bind_index);
		return;
	}
	if (g->plan->computed_inline[t] >= 0) {
		emit_inline_value(g, t, conv);
		return;
	}
	if (g->plan->recomputed[t]) {
		out(&g->b, "%s(u%d_%d_%d)", conv, g->rec_node, g->rec_depth, t);
		return;
	}
	if (g->at) {
		out(&g->b, "%s(p%d[", conv, t);
		emit_offset_in(g, t, g->at, g->at_rank);
		out(&g->b, "])");
		return;
	}
	m = g->row_scope ? -1 : reg_of(g, g->cur, t);
	if (m < 0)
		m = row_of(g, t);
	if (m >= 0)
		out(&g->b, "%s(v%d)", conv, m);
	else if (g->row_scope)
		out(&g->b, "%s(r%d)", conv, t);
	else
		out(&g->b, "%s(m%d)", conv, g->loaded_as[t]);
}

static void emit_constant(struct gen *g, double v, const char *c)
{
	out(&g->b, "%s(", c);
	out_double(&g->b, v);
	out(&g->b, ")");
}

/* The operands of a pointwise node in the order its formula takes them,
 * its constant scalar in its place: -2 stands for the constant. */
static int pw_operands(const struct rp_prog_node *n, int ops[4])
{
	int k = 0, i = 0;

	if (!n->pw.has_scalar) {
		for (i = 0; i < n->nin && k < 3; i++)
			ops[k++] = n->in[i];
		return k;
	}
	if (n->pw.fn == RP_PW_WHERE) {
		/* (cond, a, constant), or (cond, constant, b) with scalar_first. */
		ops[k++] = n->nin > 0 ? n->in[0] : -1;
		if (n->pw.scalar_first)
			ops[k++] = -2;
		ops[k++] = n->nin > 1 ? n->in[1] : -1;
		if (!n->pw.scalar_first)
			ops[k++] = -2;
		return k;
	}
	if (n->pw.scalar_first)
		ops[k++] = -2;
	for (i = 0; i < n->nin && k < 3; i++)
		ops[k++] = n->in[i];
	if (!n->pw.scalar_first)
		ops[k++] = -2;
	return k;
}

static void emit_operand(struct gen *g, int node, int op, const char *c)
{
	const struct rp_prog_node *n = &g->p->nodes[node];

	if (op == -2)
		emit_constant(g, n->pw.scalar, c);
	else
		emit_input(g, node, op, c);
}

/* pow with a constant exponent: ATen's special cases (pow_tensor_scalar). */
static bool emit_pow_special(struct gen *g, int node, int x, double e, const char *c)
{
	const char *fmt;

	if (e == 2)
		fmt = "(X * X)";
	else if (e == 3)
		fmt = "(X * X * X)";
	else if (e == 0.5)
		fmt = "rg_sqrt(X)";
	else if (e == -0.5)
		fmt = "rg_rsqrt(X)";
	else if (e == -1)
		fmt = "(C(1) / X)";
	else if (e == -2)
		fmt = "(C(1) / (X * X))";
	else
		return false;
	for (const char *f = fmt; *f; f++) {
		if (*f == 'X')
			emit_input(g, node, x, c);
		else if (*f == 'C')
			out(&g->b, "%s", c);
		else
			out(&g->b, "%c", *f);
	}
	return true;
}

static int emit_pointwise_expr(struct gen *g, int node, const char *c)
{
	const struct rp_prog_node *n = &g->p->nodes[node];
	int ops[4], nops = pw_operands(n, ops);
	const char *infix = NULL, *call = NULL, *cmp = NULL;

	switch (n->pw.fn) {
	case RP_PW_ADD: infix = "+"; break;
	case RP_PW_SUB: infix = "-"; break;
	case RP_PW_MUL: infix = "*"; break;
	case RP_PW_DIV: infix = "/"; break;
	case RP_PW_POW:
		if (n->pw.has_scalar && !n->pw.scalar_first && nops == 2 &&
		    emit_pow_special(g, node, ops[0], n->pw.scalar, c))
			return 0;
		call = "rg_pow";
		break;
	case RP_PW_MAXIMUM: call = "rg_maximum"; break;
	case RP_PW_MINIMUM: call = "rg_minimum"; break;
	case RP_PW_EQ: cmp = "=="; break;
	case RP_PW_NE: cmp = "!="; break;
	case RP_PW_LT: cmp = "<"; break;
	case RP_PW_LE: cmp = "<="; break;
	case RP_PW_GT: cmp = ">"; break;
	case RP_PW_GE: cmp = ">="; break;
	case RP_PW_NEG: infix = "-"; break;
	case RP_PW_EXP: call = "rg_exp"; break;
	case RP_PW_LOG: call = "rg_log"; break;
	case RP_PW_TANH: call = "rg_tanh"; break;
	case RP_PW_ERF: call = "rg_erf"; break;
	case RP_PW_SIGMOID: call = "rg_sigmoid"; break;
	case RP_PW_SILU: call = "rg_silu"; break;
	case RP_PW_GELU: call = "rg_gelu"; break;
	case RP_PW_GELU_TANH: call = "rg_gelu_tanh"; break;
	case RP_PW_RELU: call = "rg_relu"; break;
	case RP_PW_SQRT: call = "rg_sqrt"; break;
	case RP_PW_RSQRT: call = "rg_rsqrt"; break;
	case RP_PW_ABS: call = "rg_abs"; break;
	case RP_PW_RECIPROCAL:
		out(&g->b, "(%s(1) / ", c);
		emit_operand(g, node, ops[0], c);
		out(&g->b, ")");
		return nops == 1 ? 0 : -EINVAL;
	case RP_PW_SQUARE:
		out(&g->b, "(");
		emit_operand(g, node, ops[0], c);
		out(&g->b, " * ");
		emit_operand(g, node, ops[0], c);
		out(&g->b, ")");
		return nops == 1 ? 0 : -EINVAL;
	case RP_PW_CAST:
		emit_operand(g, node, ops[0], c);
		return nops == 1 ? 0 : -EINVAL;
	case RP_PW_GELU_BACKWARD: call = "rg_gelu_backward"; break;
	case RP_PW_GELU_TANH_BACKWARD: call = "rg_gelu_tanh_backward"; break;
	case RP_PW_SILU_BACKWARD: call = "rg_silu_backward"; break;
	case RP_PW_SIGMOID_BACKWARD: call = "rg_sigmoid_backward"; break;
	case RP_PW_TANH_BACKWARD: call = "rg_tanh_backward"; break;
	case RP_PW_RELU_BACKWARD: call = "rg_relu_backward"; break;
	case RP_PW_WHERE:
		if (nops != 3)
			return -EINVAL;
		out(&g->b, "(");
		emit_operand(g, node, ops[0], c);
		out(&g->b, " != %s(0) ? ", c);
		emit_operand(g, node, ops[1], c);
		out(&g->b, " : ");
		emit_operand(g, node, ops[2], c);
		out(&g->b, ")");
		return 0;
	case RP_PW_FILL:
		emit_constant(g, n->pw.scalar, c);
		return 0;
	case RP_PW_IOTA: {
		const struct rp_prog_tensor *o = T(g, n->out[0]);
		int axis = n->pw.axis, dd = g->dom->rank - o->rank + axis;
		if (axis < 0 || axis >= o->rank)
			return -EINVAL;
		if (o->shape[axis] == 1)
			out(&g->b, "%s(0)", c);
		else
			out(&g->b, "%s(c%d)", c, dd);
		return 0;
	}
	case RP_PW_DROPOUT_MASK:
		if (n->nin != 1 || !is_scalar(g, n->in[0]))
			return -EINVAL;
		out(&g->b, "(");
		emit_dropout_keep(g, n, n->out[0]);
		out(&g->b, " ? %s(1) : %s(0))", c, c);
		return 0;
	default:
		return -EINVAL;
	}
	if (infix && nops == 1) {
		out(&g->b, "(%s", infix);
		emit_operand(g, node, ops[0], c);
		out(&g->b, ")");
		return 0;
	}
	if ((infix || cmp) && nops == 2) {
		out(&g->b, "(");
		emit_operand(g, node, ops[0], c);
		out(&g->b, " %s ", infix ? infix : cmp);
		emit_operand(g, node, ops[1], c);
		if (cmp)
			out(&g->b, " ? %s(1) : %s(0)", c, c);
		out(&g->b, ")");
		return 0;
	}
	if (call && nops >= 1 && nops <= 2) {
		out(&g->b, "%s(", call);
		for (int i = 0; i < nops; i++) {
			if (i)
				out(&g->b, ", ");
			emit_operand(g, node, ops[i], c);
		}
		out(&g->b, ")");
		return 0;
	}
	return -EINVAL;
}

/* The node as the definition wrote it, in a comment: its name, and
 * out = op(inputs). */
static void emit_node_comment(struct gen *g, int node, const char *ind)
{
	const struct rp_prog_node *n = &g->p->nodes[node];
	char name[RP_PROG_NAME_MAX + 1];
	int ops[4], nops = 0;

	out(&g->b, "%s/* node %d \"%s\": ", ind, node, safe_name(n->name, name));
	for (int i = 0; i < n->nout; i++)
		out(&g->b, "%s%s", i ? ", " : "", n->out[i] >= 0 ? safe_name(T(g, n->out[i])->name, name) : "-");
	out(&g->b, " = %s(", n->op->name);
	if (n->op->cls == RP_PC_POINTWISE) {
		nops = pw_operands(n, ops);
	} else {
		for (int i = 0; i < n->nin && nops < 4; i++)
			ops[nops++] = n->in[i];
	}
	for (int i = 0; i < nops; i++) {
		out(&g->b, "%s", i ? ", " : "");
		if (ops[i] == -2)
			out(&g->b, "%g", n->pw.scalar);
		else if (ops[i] >= 0)
			out(&g->b, "%s", safe_name(T(g, ops[i])->name, name));
	}
	if (n->op->cls == RP_PC_POINTWISE && n->pw.fn == RP_PW_IOTA)
		out(&g->b, "axis %d", n->pw.axis);
	if (n->op->cls == RP_PC_POINTWISE && n->pw.fn == RP_PW_DROPOUT_MASK) {
		out(&g->b, ", p ");
		out_double(&g->b, n->pw.p);
		out(&g->b, ", stream %u", (unsigned)n->pw.stream);
	}
	if (n->op->cls == RP_PC_REDUCTION)
		out(&g->b, ", %s", n->red.axis == RP_AXIS_LAST ? "last" : "leading");
	out(&g->b, ") */\n");
}

/* Whether node n reads its input i at an input before: a recomputed
 * one's value is written once for the node. */
static bool read_before(const struct gen *g, const struct rp_prog_node *n, int i)
{
	for (int k = 0; k < i; k++)
		if (n->in[k] == n->in[i])
			return true;
	return false;
}

/* u<reader>_<depth>_<t>: the element of recomputed tensor t that node
 * `reader` reads at its coordinates <prefix><d> (a frame of `rank` dims):
 * at the coordinates e<depth>_<k> of the root's frame (plan.h) that hold
 * it, from the last writer whose box holds those, computed at that
 * writer's element (w<depth>_<k>), what it reads there loaded (or
 * recomputed in turn), rounded to the root's dtype as a store would. */
static int emit_recomputed(struct gen *g, int reader, int depth, int t, const char *prefix, int rank, const char *ind)
{
	const struct rp_prog_tensor *x = T(g, t), *root = T(g, x->root);
	const struct rd_prog_frame *f = &g->plan->frame[x->root];
	const char *ty = ctype(root->dtype);
	int64_t start[RP_PROG_RANK_MAX], box[RP_PROG_RANK_MAX];
	char in2[32], in3[32], wp[16], l[32], l2[32], name[RP_PROG_NAME_MAX + 1];
	int r;

	snprintf(in2, sizeof(in2), "%s\t", ind);
	snprintf(in3, sizeof(in3), "%s\t\t", ind);
	snprintf(wp, sizeof(wp), "w%d_", depth);
	if (depth > 8)
		return -EINVAL;
	out(&g->b, "%s%s u%d_%d_%d;   /* %s, recomputed */\n", ind, ty, reader, depth, t, safe_name(root->name, name));
	out(&g->b, "%s{\n", ind);
	if (rd_prog_box_in(g->p, f, t, start)) {
		for (int k = 0; k < f->rank; k++) {
			out(&g->b, "%sconst idx_t e%d_%d = %s", in2, depth, k, lit(start[k], l));
			if (x->shape[k] > 1 && x->strides[k] != 0)
				out(&g->b, " + %s%d", prefix, rank - x->rank + k);
			out(&g->b, ";\n");
		}
	} else {
		/* Another view (a reshape, a transpose): the frame's
		 * coordinates are the digits of the element's offset. */
		out(&g->b, "%sconst idx_t o%d = %s + ", in2, depth, lit(x->root_offset, l));
		emit_offset_in(g, t, prefix, rank);
		out(&g->b, ";\n");
		for (int k = 0; k < f->rank; k++) {
			out(&g->b, "%sconst idx_t e%d_%d = ", in2, depth, k);
			if (f->shape[k] > 1)
				out(&g->b, "o%d / %s %% %s;\n", depth, lit(f->strides[k], l), lit(f->shape[k], l2));
			else
				out(&g->b, "0;\n");
		}
	}
	/* The writers from the last: the first whose box holds the element
	 * (the plan made sure one does: the last tried needs no test). */
	int writers[RD_PROG_RECOMPUTE_WRITERS_MAX], nw = 0;
	for (int i = g->p->nnodes - 1; i >= 0; i--) {
		const struct rp_prog_node *w = &g->p->nodes[i];
		if (w->op->cls != RP_PC_POINTWISE || w->nout != 1 || w->out[0] < 0 || T(g, w->out[0])->root != x->root)
			continue;
		if (nw == RD_PROG_RECOMPUTE_WRITERS_MAX)
			return -EINVAL;
		writers[nw++] = i;
		if (rd_prog_covers_frame(T(g, w->out[0]), f))
			break;   /* it holds every element: those before it are overwritten */
	}
	for (int j = 0; j < nw; j++) {
		const int i = writers[j];
		const struct rp_prog_node *w = &g->p->nodes[i];
		const struct rp_prog_tensor *o = T(g, w->out[0]);
		int terms = 0;
		if (!rd_prog_box_in(g->p, f, w->out[0], box))
			return -EINVAL;
		if (j < nw - 1) {
			out(&g->b, "%s%sif (", in2, j ? "} else " : "");
			for (int k = 0; k < f->rank; k++) {
				if (box[k] > 0)
					out(&g->b, "%se%d_%d >= %s", terms++ ? " && " : "", depth, k, lit(box[k], l));
				if (box[k] + o->shape[k] < f->shape[k])
					out(&g->b, "%se%d_%d < %s", terms++ ? " && " : "", depth, k,
					    lit(box[k] + o->shape[k], l2));
			}
			out(&g->b, ") {\n");
		} else {
			out(&g->b, "%s%s{\n", in2, j ? "} else " : "");
		}
		for (int k = 0; k < f->rank; k++)
			out(&g->b, "%sconst idx_t w%d_%d = e%d_%d - %s;\n", in3, depth, k, depth, k, lit(box[k], l));
		for (int k = 0; k < w->nin; k++)
			if (w->in[k] >= 0 && g->plan->recomputed[w->in[k]] && !read_before(g, w, k) &&
			    (r = emit_recomputed(g, i, depth + 1, w->in[k], wp, f->rank, in3)) < 0)
				return r;
		emit_node_comment(g, i, in3);
		const char *save_at = g->at;
		int save_rank = g->at_rank, save_node = g->rec_node, save_depth = g->rec_depth;
		g->at = wp;
		g->at_rank = f->rank;
		g->rec_node = i;
		g->rec_depth = depth + 1;
		out(&g->b, "%su%d_%d_%d = rg_cvt<%s>(", in3, reader, depth, t, ty);
		r = emit_pointwise_expr(g, i, node_ctype(g, w));
		out(&g->b, ");\n");
		g->at = save_at;
		g->at_rank = save_rank;
		g->rec_node = save_node;
		g->rec_depth = save_depth;
		if (r < 0)
			return r;
	}
	out(&g->b, "%s}\n%s}\n", in2, ind);
	return 0;
}

/* The step's pointwise nodes at one element: its loads, each node's value
 * (v<node>, in its output's dtype) and the stores of what leaves the step.
 * `vec`: on the vector path, where flat operands come from and go to the
 * vectors x<t> and y<t> at element j. Coordinates and idx are set. */
static int emit_element(struct gen *g, bool vec, const char *ind)
{
	g->in_vector = vec;
	for (int i = 0; i < g->nmem; i++) {
		int t = g->mem[i];
		const char *ty = ctype(T(g, t)->dtype);
		if (vec && g->vmode[t]) {
			out(&g->b, "%sconst %s m%d = x%d.v[j];\n", ind, ty, t, t);
		} else if (flat_in_domain(g, t)) {
			out(&g->b, "%sconst %s m%d = p%d[idx];\n", ind, ty, t, t);
		} else {
			out(&g->b, "%sconst %s m%d = p%d[", ind, ty, t, t);
			emit_offset(g, t);
			out(&g->b, "];\n");
		}
	}
	for (int k = 0; k < g->npw; k++) {
		const int node = g->pw[k];
		const struct rp_prog_node *n = &g->p->nodes[node];
		int o = n->out[0];
		const char *c = node_ctype(g, n);
		g->cur = k;
		for (int i = 0; i < n->nin; i++)
			if (n->in[i] >= 0 && g->plan->recomputed[n->in[i]] && !read_before(g, n, i) &&
			    emit_recomputed(g, node, 0, n->in[i], "c", g->dom->rank, ind) < 0)
				return -EINVAL;
		g->rec_node = node;
		g->rec_depth = 0;
		emit_node_comment(g, node, ind);
		out(&g->b, "%sconst %s v%d = rg_cvt<%s>(", ind, ctype(T(g, o)->dtype), node, ctype(T(g, o)->dtype));
		if (emit_pointwise_expr(g, node, c) < 0) {
			char name[RP_PROG_NAME_MAX + 1];
			rp_error_set(g->err, RP_ERR_BACKEND,
				     "program %s: node %d (%s) has operands the code generator does not take",
				     safe_name(g->p->name, name), node, n->op->name);
			return -EINVAL;
		}
		out(&g->b, ");\n");
		if (!g->plan->node_stored[node] || k < g->store_from)
			continue;
		if (vec && g->vmode[o]) {
			out(&g->b, "%sy%d.v[j] = v%d;\n", ind, o, node);
		} else if (flat_in_domain(g, o)) {
			out(&g->b, "%sp%d[idx] = v%d;\n", ind, o, node);
		} else {
			out(&g->b, "%sp%d[", ind, o);
			emit_offset(g, o);
			out(&g->b, "] = v%d;\n", node);
		}
	}
	return 0;
}

/* Which coordinates the element body reads: operands that are not flat,
 * iotas, and (reductions) the result's place. */
static void mark_coords(struct gen *g)
{
	for (int i = 0; i < g->nmem; i++)
		if (!flat_in_domain(g, g->mem[i]))
			use_coords_of(g, g->mem[i]);
	for (int k = 0; k < g->npw; k++) {
		const int node = g->pw[k];
		const struct rp_prog_node *n = &g->p->nodes[node];
		if (g->plan->node_stored[node] && !flat_in_domain(g, n->out[0]))
			use_coords_of(g, n->out[0]);
		for (int i = 0; i < n->nin; i++)
			if (n->in[i] >= 0 && g->plan->recomputed[n->in[i]])
				use_coords_of(g, n->in[i]);
	}
	for (int d = 0; d < g->dom->rank; d++)
		if (makers_read_coord(g, d))
			g->coord_used[d] = true;
	if (g->red >= 0 && g->p->nodes[g->red].red.axis == RP_AXIS_LAST) {
		const struct rp_prog_tensor *o = T(g, g->p->nodes[g->red].out[0]);
		for (int k = 0; k < g->dom->rank - 1 && k < o->rank; k++)
			if (g->dom->shape[k] > 1 && o->strides[k] != 0)
				g->coord_used[k] = true;
	}
	/* The epilogue over rows: what it loads and stores at the row's
	 * coordinates, and the iotas it computes there. */
	for (int k = 0; k < g->nrows; k++) {
		const int node = g->rows[k];
		const struct rp_prog_node *n = &g->p->nodes[node];
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i], by = t >= 0 ? g->plan->computed_inline[t] : -1;
			if (t < 0 || is_scalar(g, t))
				continue;
			for (int d = 0; by >= 0 && d < g->dom->rank; d++)
				g->coord_used[d] |= maker_reads_coord(g, &g->p->nodes[by], t, d);
			if (by < 0 && row_of(g, t) < 0)
				use_coords_of(g, t);
		}
		if (g->plan->node_stored[node])
			use_coords_of(g, n->out[0]);
	}
}

/* ---- step setup --------------------------------------------------------- */

static void kernel_name(struct gen *g, char *name, const char *kind, const int *nodes, int count, const char *suffix)
{
	size_t len = (size_t)snprintf(name, RD_PROG_KERNEL_NAME_MAX, "k%d_%s", g->s, kind);
	size_t room = RD_PROG_KERNEL_NAME_MAX - 1 - strlen(suffix) - 5;

	for (int k = 0; k < count; k++) {
		const char *op = g->p->nodes[nodes[k]].op->name;
		size_t n = strlen(op);
		if (len + 1 + n > room) {
			len += (size_t)snprintf(name + len, RD_PROG_KERNEL_NAME_MAX - len, "_etc");
			break;
		}
		name[len++] = '_';
		for (size_t i = 0; i < n; i++) {
			char ch = op[i];
			bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
			name[len++] = ok ? ch : '_';
		}
		name[len] = '\0';
	}
	snprintf(name + len, RD_PROG_KERNEL_NAME_MAX - len, "%s", suffix);
}

static void emit_header(struct gen *g)
{
	const struct rd_prog_step *st = g->st;
	char name[RP_PROG_NAME_MAX + 1];
	int nb = g->plan->nbound > 0 ? g->plan->nbound : 1;

	out(&g->b, "/* regend program \"%s\", step %d (%s): node%s", safe_name(g->p->name, name), g->s,
	    rd_prog_step_kind_name(st->kind), st->nnodes > 1 ? "s" : "");
	for (int k = 0; k < st->nnodes; k++)
		out(&g->b, "%s %d", k ? "," : "", st->nodes[k]);
	out(&g->b, ".\n * Written by regend from the checked program (daemon/program/codegen.c);\n"
		   " * compiled with NVRTC. */\n");
	out(&g->b, "%s", preamble);
	out(&g->b, "/* The one parameter of every kernel: daemon/program/plan.h. */\n"
		   "struct rg_fault { unsigned int raised; int node; long long position, value, reserved; };\n"
		   "struct rg_args {\n"
		   "\tvoid *bound[%d];\n"
		   "\tchar *arena;\n"
		   "\tstruct rg_fault *fault;\n"
		   "\tdouble scalar[%d];\n"
		   "};\n\n"
		   "/* The first index outside its table, noted in the arena (the report\n"
		   " * kernel hands it to the Run). */\n"
		   "RG_DEV void rg_raise(const struct rg_args *a, unsigned long long at, int node, long long position,\n"
		   "\t\t     long long value)\n"
		   "{\n"
		   "\tstruct rg_fault *f = (struct rg_fault *)(a->arena + at);\n"
		   "\tif (atomicCAS(&f->raised, 0u, 1u) == 0u) {\n"
		   "\t\tf->node = node;\n"
		   "\t\tf->position = position;\n"
		   "\t\tf->value = value;\n"
		   "\t}\n"
		   "}\n\n",
	    nb, nb);
}

static void emit_idx_type(struct gen *g)
{
	out(&g->b, "\ttypedef %s idx_t;\n", g->idx64 ? "long long" : "int");
}

/* The epilogue over rows reads tensor t from memory (r<t>): not a
 * scalar, a value computed where it is read, nor a row value. */
static bool row_loads(const struct gen *g, int t)
{
	return t >= 0 && !is_scalar(g, t) && g->plan->computed_inline[t] < 0 && row_value_of(g, t) < 0;
}

/* Pointers for every tensor the step reads from memory or stores. */
static void declare_step_pointers(struct gen *g)
{
	for (int i = 0; i < g->nmem; i++)
		declare_pointer(g, g->mem[i]);
	for (int k = 0; k < g->npw; k++) {
		const struct rp_prog_node *n = &g->p->nodes[g->pw[k]];
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i], root = t >= 0 ? T(g, t)->root : -1;
			for (int j = 0; t >= 0 && g->plan->recomputed[t] && j < g->plan->nsources[root]; j++)
				declare_pointer(g, g->plan->sources[root][j]);
		}
	}
	for (int k = 0; k < g->npw; k++)
		if (g->plan->node_stored[g->pw[k]])
			declare_pointer(g, g->p->nodes[g->pw[k]].out[0]);
	for (int k = 0; k < g->nrows; k++) {
		const struct rp_prog_node *n = &g->p->nodes[g->rows[k]];
		for (int i = 0; i < n->nin; i++)
			if (row_loads(g, n->in[i]))
				declare_pointer(g, n->in[i]);
		if (g->plan->node_stored[g->rows[k]])
			declare_pointer(g, n->out[0]);
	}
	if (g->red >= 0 && g->plan->node_stored[g->red])
		declare_pointer(g, g->p->nodes[g->red].out[0]);
}

static bool offsets_fit_int(const struct gen *g)
{
	if (numel_of(g->dom) > IDX32_MAX)
		return false;
	for (int k = 0; k < g->npw; k++) {
		const int node = g->pw[k];
		const struct rp_prog_node *n = &g->p->nodes[node];
		if (span_of(T(g, n->out[0])) > IDX32_MAX)
			return false;
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i], root = t >= 0 ? T(g, t)->root : -1;
			if (t >= 0 && span_of(T(g, t)) > IDX32_MAX)
				return false;
			for (int j = 0; t >= 0 && g->plan->recomputed[t] && j < g->plan->nsources[root]; j++)
				if (span_of(T(g, g->plan->sources[root][j])) > IDX32_MAX ||
				    numel_of(T(g, root)) > IDX32_MAX)
					return false;
		}
	}
	if (g->red >= 0) {
		const struct rp_prog_node *n = &g->p->nodes[g->red];
		if (span_of(T(g, n->in[0])) > IDX32_MAX || span_of(T(g, n->out[0])) > IDX32_MAX)
			return false;
	}
	for (int k = 0; k < g->nrows; k++) {
		const struct rp_prog_node *n = &g->p->nodes[g->rows[k]];
		if (span_of(T(g, n->out[0])) > IDX32_MAX)
			return false;
		for (int i = 0; i < n->nin; i++)
			if (n->in[i] >= 0 && span_of(T(g, n->in[i])) > IDX32_MAX)
				return false;
	}
	return true;
}

/* The loads (g->mem) of the nodes pw[0, npw) and, `with_red`, of the
 * reduction: what they read from memory, not from registers. */
static void collect_loads(struct gen *g, bool with_red)
{
	const struct rp_program *p = g->p;

	g->nmem = 0;
	for (int k = 0; k < g->npw; k++) {
		const int node = g->pw[k];
		const struct rp_prog_node *n = &p->nodes[node];
		for (int i = 0; i < n->nin; i++) {
			int t = n->in[i];
			if (t >= 0 && !is_scalar(g, t) && g->plan->computed_inline[t] < 0 && !g->plan->recomputed[t] &&
			    reg_of(g, k, t) < 0 && row_of(g, t) < 0)
				mem_add(g, t);
		}
	}
	if (with_red && g->red >= 0 && reg_of(g, g->nprologue, p->nodes[g->red].in[0]) < 0)
		mem_add(g, p->nodes[g->red].in[0]);
}

/* Marks the roots the step writes. */
static void mark_written(struct gen *g)
{
	const struct rp_program *p = g->p;
	int *stored = malloc((size_t)(g->st->nnodes + 1) * sizeof(*stored)), n = 0;

	if (!stored) {
		g->b.failed = true;
		return;
	}
	for (int k = 0; k < g->st->nnodes; k++)
		if (g->plan->node_stored[g->st->nodes[k]] && p->nodes[g->st->nodes[k]].nout > 0)
			stored[n++] = p->tensors[p->nodes[g->st->nodes[k]].out[0]].root;
	for (int t = 0; t < p->ntensors; t++)
		for (int k = 0; k < n && !g->root_written[t]; k++)
			g->root_written[t] = p->tensors[t].root == stored[k];
	free(stored);
}

/* ---- FUSED -------------------------------------------------------------------- */

/* Whether t's elements along the domain's last dim are its own last dim,
 * contiguous: a run of elements of one row of the domain is one run of t. */
static bool row_contiguous(const struct gen *g, int t)
{
	const struct rp_prog_tensor *x = T(g, t), *d = g->dom;
	int64_t len = d->rank ? d->shape[d->rank - 1] : 1;

	return len > 1 && x->rank >= 1 && x->shape[x->rank - 1] == len && x->strides[x->rank - 1] == 1;
}

/* Whether t's row runs of `vec` elements start vec-aligned (relative to
 * the root's start): its other strides and its offset are multiples. */
static bool row_runs_aligned(const struct gen *g, int t, int vec)
{
	const struct rp_prog_tensor *x = T(g, t);

	if (g->dom->shape[g->dom->rank - 1] % vec != 0 || x->root_offset % vec != 0)
		return false;
	for (int k = 0; k < x->rank - 1; k++)
		if (x->shape[k] > 1 && x->strides[k] % vec != 0)
			return false;
	return true;
}

/* The tensors the step moves: read from memory, or stored. */
static int step_tensors(const struct gen *g, int *list)
{
	int n = 0;

	for (int i = 0; i < g->nmem; i++)
		list[n++] = g->mem[i];
	for (int k = 0; k < g->npw; k++)
		if (g->plan->node_stored[g->pw[k]])
			list[n++] = g->p->nodes[g->pw[k]].out[0];
	return n;
}

/* The vector path: `vec` elements a thread takes at once, and which
 * tensors move as vectors (g->vmode): those flat in the domain, and those
 * whose rows are contiguous runs when the domain's rows split into whole
 * vectors. 16 bytes of the narrowest such tensor, at most 32 bytes of the
 * widest; 1 (no vector path) when none. */
static void choose_vec(struct gen *g)
{
	int *list = malloc((size_t)(g->nmem + g->npw + 1) * sizeof(*list));
	int n = list ? step_tensors(g, list) : 0;
	size_t lo = 0, hi = 0;

	g->vec = 1;
	for (int i = 0; i < n; i++) {
		int t = list[i];
		g->vmode[t] = flat_in_domain(g, t) ? VEC_FLAT : row_contiguous(g, t) ? VEC_ROW : VEC_NONE;
		if (g->vmode[t] == VEC_NONE)
			continue;
		size_t e = rp_dtype_size(T(g, t)->dtype);
		lo = lo && lo < e ? lo : e;
		hi = hi > e ? hi : e;
	}
	if (lo) {
		int v = (int)(16 / lo);
		while (v > 1 && (size_t)v * hi > 32)
			v /= 2;
		g->vec = v > 8 ? 8 : v;
	}
	if (numel_of(g->dom) < g->vec)
		g->vec = 1;
	bool any = false;
	for (int i = 0; i < n; i++) {
		int t = list[i];
		if (g->vec == 1 || (g->vmode[t] == VEC_ROW && !row_runs_aligned(g, t, g->vec)))
			g->vmode[t] = VEC_NONE;
		any |= g->vmode[t] != VEC_NONE;
		if (g->vmode[t] == VEC_ROW) {
			const struct rp_prog_tensor *x = T(g, t);
			for (int k = 0; k < x->rank; k++)
				if (x->shape[k] > 1 && x->strides[k] != 0)
					g->base_used[g->dom->rank - x->rank + k] = true;
		}
	}
	if (!any)
		g->vec = 1;
	free(list);
}

/* Whether the vector path's element body reads coordinates: a tensor
 * moved element by element that is not flat, an iota or a mask. */
static bool offset_uses_coords(const struct gen *g, int t)
{
	const struct rp_prog_tensor *x = T(g, t);

	if (g->vmode[t] || flat_in_domain(g, t))
		return false;
	for (int k = 0; k < x->rank; k++)
		if (x->shape[k] > 1 && x->strides[k] != 0)
			return true;
	return false;
}

/* Whether a node of the step reads a recomputed tensor at coordinate d
 * of the domain (any, with d < 0). */
static bool recomputed_reads_coord(const struct gen *g, int d)
{
	for (int k = 0; k < g->npw; k++) {
		const struct rp_prog_node *n = &g->p->nodes[g->pw[k]];
		for (int i = 0; i < n->nin; i++) {
			const struct rp_prog_tensor *x = n->in[i] >= 0 ? T(g, n->in[i]) : NULL;
			if (!x || !g->plan->recomputed[n->in[i]])
				continue;
			for (int j = 0; j < x->rank; j++)
				if (x->shape[j] > 1 && x->strides[j] != 0 && (d < 0 || g->dom->rank - x->rank + j == d))
					return true;
		}
	}
	return false;
}

static bool vector_body_needs_coords(const struct gen *g)
{
	if (recomputed_reads_coord(g, -1))
		return true;
	for (int i = 0; i < g->nmem; i++)
		if (offset_uses_coords(g, g->mem[i]))
			return true;
	for (int k = 0; k < g->npw; k++) {
		const struct rp_prog_node *n = &g->p->nodes[g->pw[k]];
		if (g->plan->node_stored[g->pw[k]] && offset_uses_coords(g, n->out[0]))
			return true;
	}
	for (int d = 0; d < g->dom->rank; d++)
		if (makers_read_coord(g, d))
			return true;
	return false;
}

/* Whether the vector path's element body reads coordinate c<d>. */
static bool vector_body_reads_coord(const struct gen *g, int d)
{
	if (recomputed_reads_coord(g, d))
		return true;
	for (int i = 0; i < g->nmem + g->npw; i++) {
		int t = i < g->nmem ? g->mem[i] : g->p->nodes[g->pw[i - g->nmem]].out[0];
		const struct rp_prog_tensor *x = T(g, t);
		int k = x->rank - g->dom->rank + d;
		if (i >= g->nmem && !g->plan->node_stored[g->pw[i - g->nmem]])
			continue;
		if (offset_uses_coords(g, t) && k >= 0 && x->shape[k] > 1 && x->strides[k] != 0)
			return true;
	}
	return makers_read_coord(g, d);
}

/* Where tensor t's vector starts: base for a flat one, its offset at the
 * vector's first element for the others. */
static void emit_vector_at(struct gen *g, int t)
{
	if (g->vmode[t] == VEC_FLAT) {
		out(&g->b, "p%d + base", t);
		return;
	}
	out(&g->b, "p%d + (", t);
	emit_offset_at(g, t, "b");
	out(&g->b, ")");
}

/* vec_ok: every tensor moved as a vector is aligned to it (the Run's
 * offsets decide for the bound ones, so the kernel asks). */
static void emit_vec_ok(struct gen *g)
{
	int *list = malloc((size_t)(g->nmem + g->npw + 1) * sizeof(*list));
	int nt = list ? step_tensors(g, list) : 0;

	if (!list)
		g->b.failed = true;
	out(&g->b, "\t/* %d elements at a time where every tensor moved as a vector is aligned to it. */\n", g->vec);
	out(&g->b, "\tconst bool vec_ok = true");
	for (int i = 0; i < nt; i++)
		if (g->vmode[list[i]])
			out(&g->b, " &&\n\t\t(unsigned long long)p%d %% %zu == 0", list[i],
			    (size_t)g->vec * rp_dtype_size(T(g, list[i])->dtype));
	out(&g->b, ";\n");
	free(list);
}

/* The loads of a vector's tensors, at `base` (flat) or the coordinates b<d>. */
static void emit_vector_loads(struct gen *g, const char *ind)
{
	for (int i = 0; i < g->nmem; i++) {
		int t = g->mem[i];
		const char *ty = ctype(T(g, t)->dtype);
		if (!g->vmode[t])
			continue;
		out(&g->b, "%sconst rg_vec<%s, %d> x%d = *(const rg_vec<%s, %d> *)(", ind, ty, g->vec, t, ty, g->vec);
		emit_vector_at(g, t);
		out(&g->b, ");\n");
	}
	for (int i = g->store_from; i < g->npw; i++) {
		const int node = g->pw[i];
		int o = g->p->nodes[node].out[0];
		if (g->plan->node_stored[node] && g->vmode[o])
			out(&g->b, "%srg_vec<%s, %d> y%d;\n", ind, ctype(T(g, o)->dtype), g->vec, o);
	}
}

static void emit_vector_stores(struct gen *g, const char *ind)
{
	for (int i = g->store_from; i < g->npw; i++) {
		const int node = g->pw[i];
		int o = g->p->nodes[node].out[0];
		if (!g->plan->node_stored[node] || !g->vmode[o])
			continue;
		out(&g->b, "%s*(rg_vec<%s, %d> *)(", ind, ctype(T(g, o)->dtype), g->vec);
		emit_vector_at(g, o);
		out(&g->b, ") = y%d;\n", o);
	}
}

struct red_shape;
static void emit_accumulate(struct gen *g, const struct red_shape *rs, const char *ind, const char *var);

/* A row's elements `vec` at a time: a thread takes vectors first, first + step, ...
 * of the row (whose coordinates c<d> are set); rs: each element into the
 * reduction's accumulator (NULL: the pass after it). */
static int emit_row_vectors(struct gen *g, const struct red_shape *rs, const char *first, const char *step)
{
	int rank = g->dom->rank, r;

	out(&g->b, "\t\tfor (idx_t jv = %s; jv < cols / %d; jv += %s) {\n", first, g->vec, step);
	out(&g->b, "\t\t\tconst idx_t jb = jv * %d, base = row * cols + jb;\n", g->vec);
	for (int d = 0; d < rank - 1; d++)
		if (g->base_used[d])
			out(&g->b, "\t\t\tconst idx_t b%d = c%d;\n", d, d);
	if (g->base_used[rank - 1])
		out(&g->b, "\t\t\tconst idx_t b%d = jb;\n", rank - 1);
	emit_vector_loads(g, "\t\t\t");
	out(&g->b, "#pragma unroll\n");
	out(&g->b, "\t\t\tfor (int j = 0; j < %d; j++) {\n", g->vec);
	if (g->coord_used[rank - 1] && vector_body_reads_coord(g, rank - 1))
		out(&g->b, "\t\t\t\tconst idx_t c%d = jb + j;\n", rank - 1);
	r = emit_element(g, true, "\t\t\t\t");
	if (r < 0)
		return r;
	if (rs)
		emit_accumulate(g, rs, "\t\t\t\t", "acc");
	out(&g->b, "\t\t\t}\n");
	emit_vector_stores(g, "\t\t\t");
	out(&g->b, "\t\t}\n");
	return 0;
}

static int gen_fused(struct gen *g)
{
	struct rd_prog_kernel *k = &g->st->kernels[0];
	int64_t n = numel_of(g->dom);
	char l[32];
	int r;

	kernel_name(g, k->name, "fused", g->st->nodes, g->st->nnodes, "");
	k->block = PW_BLOCK;
	k->blocks_per_sm = PW_FUSED_BLOCKS_PER_SM;
	choose_vec(g);
	k->blocks = (uint64_t)((n + (int64_t)g->vec * PW_BLOCK - 1) / ((int64_t)g->vec * PW_BLOCK));
	g->st->nkernels = 1;

	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    PW_BLOCK, k->name);
	emit_idx_type(g);
	declare_step_pointers(g);
	out(&g->b, "\tconst idx_t n = %s;\n", lit(n, l));
	out(&g->b, "\tconst idx_t stride = (idx_t)gridDim.x * blockDim.x;\n");
	out(&g->b, "\tidx_t start = 0;\n\n");
	if (g->vec > 1) {
		emit_vec_ok(g);
		out(&g->b, "\tif (vec_ok) {\n");
		out(&g->b, "\t\tfor (idx_t vi = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; vi < n / %d; vi += stride) {\n",
		    g->vec);
		out(&g->b, "\t\t\tconst idx_t base = vi * %d;\n", g->vec);
		emit_coords_as(g, "base", g->dom->rank, "\t\t\t", "b", g->base_used);
		emit_vector_loads(g, "\t\t\t");
		out(&g->b, "#pragma unroll\n");
		out(&g->b, "\t\t\tfor (int j = 0; j < %d; j++) {\n", g->vec);
		if (vector_body_needs_coords(g)) {
			out(&g->b, "\t\t\t\tconst idx_t idx = base + j;\n");
			emit_coords(g, "idx", g->dom->rank, "\t\t\t\t");
		}
		r = emit_element(g, true, "\t\t\t\t");
		if (r < 0)
			return r;
		out(&g->b, "\t\t\t}\n");
		emit_vector_stores(g, "\t\t\t");
		out(&g->b, "\t\t}\n");
		out(&g->b, "\t\tstart = n / %d * %d;\n", g->vec, g->vec);
		out(&g->b, "\t}\n");
	}
	out(&g->b, "\tfor (idx_t idx = start + (idx_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += stride) {\n");
	emit_coords(g, "idx", g->dom->rank, "\t\t");
	r = emit_element(g, false, "\t\t");
	if (r < 0)
		return r;
	out(&g->b, "\t}\n}\n");
	return 0;
}

/* ---- REDUCTION ---------------------------------------------------------------- */

struct red_shape {
	bool last;            /* over the last dim, else over the leading ones */
	int64_t rows, cols;   /* the input as [rows, cols] */
	bool acc64;
	/* Leading: tiles of COL_TILE columns, chunks of rows. */
	int64_t tiles, chunks, chunk_rows;
};

static void red_shape_of(const struct rp_program *p, const struct rp_prog_node *n, struct red_shape *rs)
{
	const struct rp_prog_tensor *x = &p->tensors[n->in[0]];
	int64_t numel = numel_of(x);

	memset(rs, 0, sizeof(*rs));
	rs->last = n->red.axis == RP_AXIS_LAST;
	rs->cols = x->rank ? x->shape[x->rank - 1] : 1;
	rs->rows = rs->cols ? numel / rs->cols : 0;
	rs->acc64 = x->dtype == RP_DTYPE_F64 || p->tensors[n->out[0]].dtype == RP_DTYPE_F64;
	if (rs->last)
		return;
	rs->tiles = (rs->cols + COL_TILE - 1) / COL_TILE;
	/* Chunks for the widest tiles (8 columns a thread, the vector
	 * path's), which the scalar path shares so that both sum each column
	 * in one order. */
	int64_t wide = (rs->cols + COL_TILE * 8 - 1) / (COL_TILE * 8);
	int64_t want = (COL_TARGET_BLOCKS + wide - 1) / (wide ? wide : 1);
	int64_t most = (rs->rows + COL_CHUNK_ROWS_MIN - 1) / COL_CHUNK_ROWS_MIN;
	rs->chunks = want < most ? want : most;
	if (rs->chunks < 1)
		rs->chunks = 1;
	rs->chunk_rows = (rs->rows + rs->chunks - 1) / rs->chunks;
	if (rs->chunk_rows < 1)
		rs->chunk_rows = 1;
	rs->chunks = (rs->rows + rs->chunk_rows - 1) / rs->chunk_rows;
	if (rs->chunks < 1)
		rs->chunks = 1;
}

/* An embedding backward's sort (emb_sort_of): its keys and its passes. */
struct emb_sort {
	int64_t rows;           /* index positions */
	int64_t padded;         /* rows up to whole tiles */
	int pbits;              /* a key's low bits: the position */
	int passes;             /* merge passes after the tiles are sorted */
	int64_t chunks;         /* the rows kernel's column blocks per key */
};

static int bits_for(int64_t max)
{
	int b = 1;

	while (b < 63 && (max >> b) != 0)
		b++;
	return b;
}

/* 0, or -EINVAL where a key (row, position) takes more than 63 bits. */
static int emb_sort_of(const struct rp_program *p, const struct rp_prog_node *n, struct emb_sort *es)
{
	const struct rp_prog_tensor *index = &p->tensors[n->in[1]], *o = &p->tensors[n->out[0]];

	es->rows = 1;
	for (int k = 0; k < index->rank; k++)
		es->rows *= index->shape[k];
	es->padded = (es->rows + EMB_SORT_TILE - 1) / EMB_SORT_TILE * EMB_SORT_TILE;
	es->pbits = bits_for(es->rows - 1);
	es->passes = 0;
	for (int64_t run = EMB_SORT_TILE; run < es->padded; run *= 2)
		es->passes++;
	es->chunks = (o->shape[1] + EMB_BLOCK - 1) / EMB_BLOCK;
	return bits_for(o->shape[0] - 1) + es->pbits > 63 ? -EINVAL : 0;
}

static bool is_embedding_backward(const struct rp_program *p, const struct rd_prog_step *st)
{
	return st->kind == RD_STEP_GATHER && st->nnodes == 1 &&
	       p->nodes[st->nodes[0]].gather.fn == RP_GATHER_EMBEDDING_BACKWARD;
}

/* The sort's two buffers of keys, one after the other. */
static uint64_t emb_sort_scratch(const struct emb_sort *es)
{
	return 2 * (uint64_t)es->padded * sizeof(uint64_t);
}

/* The pass after a reduction (g->pass2): its epilogue over the domain and
 * the prologue nodes it reads, by the very view (their values are
 * computed anew; the others would be dead code). */
static int plan_pass2(struct gen *g)
{
	bool *needed = calloc((size_t)g->nelem + 1, sizeof(*needed));

	g->pass2 = malloc((size_t)(g->nelem + 1) * sizeof(*g->pass2));
	if (!needed || !g->pass2) {
		free(needed);
		return -ENOMEM;
	}
	for (int k = g->nelem - 1; k >= 0; k--) {
		if (k >= g->nprologue) {
			needed[k] = true;
			continue;
		}
		int o = g->p->nodes[g->elem[k]].out[0];
		for (int j = k + 1; j < g->nelem && !needed[k]; j++) {
			const struct rp_prog_node *m = &g->p->nodes[g->elem[j]];
			for (int i = 0; i < m->nin && needed[j] && !needed[k]; i++)
				needed[k] = m->in[i] >= 0 && rd_prog_same_view(g->p, m->in[i], o);
		}
	}
	g->npass2 = g->nrecomputed = 0;
	for (int k = 0; k < g->nelem; k++)
		if (needed[k]) {
			g->pass2[g->npass2++] = g->elem[k];
			g->nrecomputed += k < g->nprologue;
		}
	free(needed);
	return 0;
}

/* The position of a REDUCTION step's reduction among its nodes: its
 * prologue before it, its epilogue after. */
static int reduction_at(const struct rp_program *p, const struct rd_prog_step *st)
{
	for (int k = 0; k < st->nnodes; k++)
		if (p->nodes[st->nodes[k]].op->cls == RP_PC_REDUCTION)
			return k;
	return st->nnodes - 1;
}

uint64_t rd_prog_codegen_scratch_bytes(const struct rp_program *p, const struct rd_prog_plan *plan, int s)
{
	const struct rd_prog_step *st = &plan->steps[s];
	struct red_shape rs;

	if (is_embedding_backward(p, st)) {
		struct emb_sort es;
		return emb_sort_of(p, &p->nodes[st->nodes[0]], &es) == 0 ? emb_sort_scratch(&es) : 0;
	}
	if (st->kind != RD_STEP_REDUCTION)
		return 0;
	red_shape_of(p, &p->nodes[st->nodes[reduction_at(p, st)]], &rs);
	if (rs.last || rs.chunks <= 1)
		return 0;
	return (uint64_t)rs.chunks * (uint64_t)rs.cols * (rs.acc64 ? 8 : 4);
}

/* Each reduction's code, stated once: the accumulator's type and start
 * (f32, f64), the step that takes an element (the combine where NULL),
 * the combine of two accumulators (warp shuffles, a block's partials), and
 * the call around the finished one (none where NULL). The functions are
 * the prelude's. */
#define INF32 "__int_as_float(0x7f800000)"
#define INF64 "__longlong_as_double(0x7ff0000000000000LL)"
static const struct red_code {
	const char *type[2], *start[2], *add, *combine, *result;
} red_codes[RP_RED_COUNT] = {
	[RP_RED_SUM] = { { "float", "double" }, { "0", "0" }, NULL, "rg_red_sum", NULL },
	[RP_RED_MEAN] = { { "float", "double" }, { "0", "0" }, NULL, "rg_red_sum", NULL },
	[RP_RED_MAX] = { { "float", "double" }, { "-" INF32, "-" INF64 }, NULL, "rg_red_max", NULL },
	[RP_RED_MIN] = { { "float", "double" }, { INF32, INF64 }, NULL, "rg_red_min", NULL },
	[RP_RED_AMAX] = { { "float", "double" }, { "0", "0" }, NULL, "rg_red_max", NULL },
	[RP_RED_LOGSUMEXP] = { { "rg_lse<float>", "rg_lse<double>" }, { "rg_lse_start(0.0f)", "rg_lse_start(0.0)" },
			       "rg_lse_add", "rg_red_lse", "rg_lse_result" },
};
#undef INF32
#undef INF64

static const struct red_code *red_code_of(enum rp_reduction fn)
{
	return (unsigned)fn < RP_RED_COUNT ? &red_codes[fn] : NULL;
}

/* acc = step(acc, the element's input value). */
static void emit_accumulate(struct gen *g, const struct red_shape *rs, const char *ind, const char *var)
{
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	const struct red_code *rc = red_code_of(n->red.fn);
	int x = n->in[0], m = reg_of(g, g->npw, x);
	const char *conv = rs->acc64 ? "rg_f64" : "rg_f32";

	emit_node_comment(g, g->red, ind);
	out(&g->b, "%s%s = %s(%s, %s%s(", ind, var, rc->add ? rc->add : rc->combine, var,
	    n->red.fn == RP_RED_AMAX ? "rg_abs(" : "", conv);
	if (m >= 0)
		out(&g->b, "v%d", m);
	else
		out(&g->b, "m%d", g->loaded_as[x]);
	out(&g->b, ")%s);\n", n->red.fn == RP_RED_AMAX ? ")" : "");
}

/* The finished value of accumulator `value` over `count` elements,
 * rounded to the output's dtype. */
static void emit_result_value(struct gen *g, const struct red_shape *rs, const char *value, int64_t count)
{
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	const struct red_code *rc = red_code_of(n->red.fn);
	int o = n->out[0];
	char l[32];

	out(&g->b, "rg_cvt<%s>(%s%s%s", ctype(T(g, o)->dtype), rc->result ? rc->result : "", rc->result ? "(" : "",
	    value);
	if (rc->result)
		out(&g->b, ")");
	if (n->red.fn == RP_RED_MEAN)
		out(&g->b, " / %s(%s)", rc->type[rs->acc64], lit(count, l));
	out(&g->b, ")");
}

/* The finished value into the output at its offset (`off`, an expression). */
static void emit_result_store(struct gen *g, const struct red_shape *rs, const char *value, int64_t count,
			      const char *ind)
{
	out(&g->b, "%sp%d[off] = ", ind, g->p->nodes[g->red].out[0]);
	emit_result_value(g, rs, value, count);
	out(&g->b, ";\n");
}

static void emit_warp_reduce(struct gen *g, const char *fn, const char *var, const char *ind)
{
	out(&g->b, "%sfor (int o = 16; o > 0; o /= 2)\n", ind);
	out(&g->b, "%s\t%s = %s(%s, rg_shfl_xor(%s, o));\n", ind, var, fn, var, var);
}

/* The output's offset for a row of a last-axis reduction: the row's
 * coordinates (c0..) with the output's strides. */
static void emit_row_out_offset(struct gen *g)
{
	const struct rp_prog_tensor *o = T(g, g->p->nodes[g->red].out[0]);
	int terms = 0;
	char l[32];

	out(&g->b, "const idx_t off = ");
	for (int k = 0; k < g->dom->rank - 1 && k < o->rank; k++) {
		if (g->dom->shape[k] == 1 || o->strides[k] == 0)
			continue;
		out(&g->b, "%sc%d * %s", terms++ ? " + " : "", k, lit(o->strides[k], l));
	}
	out(&g->b, "%s;\n", terms ? "" : "0");
}

/* The elements of a row, each once, by the row's warp or block: vectors
 * where vec_ok, else one element at a time; rs: into the accumulator acc
 * (NULL: the pass after the reduction, the same elements to the same
 * threads). */
static int emit_row_pass(struct gen *g, const struct red_shape *rs, bool per_warp)
{
	int rank = g->dom->rank, r;

	if (g->vec > 1) {
		out(&g->b, "\t\tif (vec_ok) {\n");
		r = emit_row_vectors(g, rs, per_warp ? "lane" : "threadIdx.x", per_warp ? "32" : "blockDim.x");
		if (r < 0)
			return r;
		out(&g->b, "\t\t} else {\n");
	}
	out(&g->b, "\t\tfor (idx_t j = %s; j < cols; j += %s) {\n", per_warp ? "lane" : "threadIdx.x",
	    per_warp ? "32" : "blockDim.x");
	if (g->coord_used[rank - 1])
		out(&g->b, "\t\t\tconst idx_t c%d = j;\n", rank - 1);
	out(&g->b, "\t\t\tconst idx_t idx = row * cols + j;\n");
	r = emit_element(g, false, "\t\t\t");
	if (r < 0)
		return r;
	if (rs)
		emit_accumulate(g, rs, "\t\t\t", "acc");
	out(&g->b, "\t\t}\n");
	if (g->vec > 1)
		out(&g->b, "\t\t}\n");
	return 0;
}

/* Once the row's result is in acc (every thread's): the row values, v<red>
 * rounded as it is stored and the epilogue over rows, and their stores by
 * the row's first thread (`lead`). */
static int emit_row_values(struct gen *g, const struct red_shape *rs, const char *lead)
{
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	int o = n->out[0];

	out(&g->b, "\t\tconst %s v%d = ", ctype(T(g, o)->dtype), g->red);
	emit_result_value(g, rs, "acc", rs->cols);
	out(&g->b, ";\n");
	g->rows_ready = true;
	g->row_scope = true;
	for (int k = 0; k < g->nrows; k++) {
		const int node = g->rows[k];
		const struct rp_prog_node *m = &g->p->nodes[node];
		int mo = m->out[0];
		for (int i = 0; i < m->nin; i++) {
			int t = m->in[i];
			if (!row_loads(g, t) || g->row_loaded[t])
				continue;
			g->row_loaded[t] = true;
			out(&g->b, "\t\tconst %s r%d = p%d[", ctype(T(g, t)->dtype), t, t);
			emit_offset(g, t);
			out(&g->b, "];\n");
		}
		emit_node_comment(g, node, "\t\t");
		out(&g->b, "\t\tconst %s v%d = rg_cvt<%s>(", ctype(T(g, mo)->dtype), node, ctype(T(g, mo)->dtype));
		if (emit_pointwise_expr(g, node, node_ctype(g, m)) < 0)
			return -EINVAL;
		out(&g->b, ");\n");
	}
	g->row_scope = false;
	bool stores = g->plan->node_stored[g->red];
	for (int k = 0; k < g->nrows; k++)
		stores |= g->plan->node_stored[g->rows[k]];
	if (!stores)
		return 0;
	out(&g->b, "\t\tif (%s) {\n", lead);
	if (g->plan->node_stored[g->red]) {
		out(&g->b, "\t\t\t");
		emit_row_out_offset(g);
		out(&g->b, "\t\t\tp%d[off] = v%d;\n", o, g->red);
	}
	for (int k = 0; k < g->nrows; k++) {
		if (!g->plan->node_stored[g->rows[k]])
			continue;
		int mo = g->p->nodes[g->rows[k]].out[0];
		out(&g->b, "\t\t\tp%d[", mo);
		emit_offset(g, mo);
		out(&g->b, "] = v%d;\n", g->rows[k]);
	}
	out(&g->b, "\t\t}\n");
	return 0;
}

/* A last-axis reduction, a warp or a block a row. With an epilogue the
 * row's result goes to every thread of the row, which computes the row
 * values and passes over the row again: its prologue computed anew from
 * what it reads (the row was just read: in L1 or L2 now), the epilogue's
 * element nodes after it; nothing is stored between the two passes but
 * what a later step reads. */
static int gen_row_reduction(struct gen *g, const struct red_shape *rs)
{
	struct rd_prog_kernel *k = &g->st->kernels[0];
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	const struct red_code *rc = red_code_of(n->red.fn);
	const char *acc = rc->type[rs->acc64], *fn = rc->combine;
	bool per_warp = rs->cols <= ROW_WARP_MAX, epilogue = g->nrows > 0 || g->nelem > g->nprologue;
	int rank = g->dom->rank;
	char l[32], l2[32];
	int r;

	kernel_name(g, k->name, "reduce", g->st->nodes, g->st->nnodes, "_last");
	g->st->nkernels = 1;
	choose_vec(g);
	if (g->vec > 1 && rs->cols % g->vec != 0)
		g->vec = 1;
	/* The vectors' coordinates b<d> of a row are the row's own. */
	for (int d = 0; d < rank - 1 && g->vec > 1; d++)
		g->coord_used[d] |= g->base_used[d];
	k->block = per_warp ? PW_BLOCK : ROW_BLOCK;
	k->blocks_per_sm = 2048 / k->block;
	k->blocks = per_warp ? (uint64_t)(rs->rows + PW_BLOCK / 32 - 1) / (PW_BLOCK / 32) : (uint64_t)rs->rows;

	out(&g->b, "/* One %s per row of %lld; %s accumulation in a fixed order (%s)%s. */\n",
	    per_warp ? "warp" : "block", (long long)rs->cols, acc,
	    g->vec > 1 ? "one order where the tensors are aligned to their vectors, another where not" : "one order",
	    g->nelem > g->nprologue ? "; then the epilogue, over the row again" : epilogue ? "; then the epilogue" : "");
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%u) %s(const struct rg_args *__restrict__ a)\n{\n",
	    k->block, k->name);
	emit_idx_type(g);
	declare_step_pointers(g);
	out(&g->b, "\tconst idx_t rows = %s, cols = %s;\n", lit(rs->rows, l), lit(rs->cols, l2));
	out(&g->b, "\tconst int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n");
	if (g->vec > 1)
		emit_vec_ok(g);
	if (per_warp) {
		out(&g->b, "\tfor (idx_t row = (idx_t)blockIdx.x * %d + warp; row < rows; row += (idx_t)gridDim.x * %d) {\n",
		    PW_BLOCK / 32, PW_BLOCK / 32);
	} else {
		out(&g->b, "\t__shared__ %s part[%d];\n", acc, ROW_BLOCK / 32);
		out(&g->b, "\tfor (idx_t row = blockIdx.x; row < rows; row += gridDim.x) {\n");
	}
	emit_coords(g, "row", rank - 1, "\t\t");
	out(&g->b, "\t\t%s acc = %s;\n", acc, rc->start[rs->acc64]);
	/* The reduction's pass: the prologue and the accumulation. */
	g->pw = g->elem;
	g->npw = g->nprologue;
	g->store_from = 0;
	collect_loads(g, true);
	if ((r = emit_row_pass(g, rs, per_warp)) < 0)
		return r;
	emit_warp_reduce(g, fn, "acc", "\t\t");
	if (!per_warp) {
		out(&g->b, "\t\tif (lane == 0)\n\t\t\tpart[warp] = acc;\n");
		out(&g->b, "\t\t__syncthreads();\n");
		if (epilogue) {
			/* Every warp combines the partials, in the same order. */
			out(&g->b, "\t\tacc = lane < %d ? part[lane] : %s;\n", ROW_BLOCK / 32, rc->start[rs->acc64]);
			emit_warp_reduce(g, fn, "acc", "\t\t");
		} else {
			out(&g->b, "\t\tif (warp == 0) {\n");
			out(&g->b, "\t\t\tacc = lane < %d ? part[lane] : %s;\n", ROW_BLOCK / 32, rc->start[rs->acc64]);
			emit_warp_reduce(g, fn, "acc", "\t\t\t");
			out(&g->b, "\t\t}\n");
		}
	}
	if (epilogue) {
		/* A butterfly leaves every lane the same value: the combines
		 * are commutative, bit for bit. */
		if ((r = emit_row_values(g, rs, per_warp ? "lane == 0" : "threadIdx.x == 0")) < 0)
			return r;
		g->pw = g->pass2;
		g->npw = g->npass2;
		g->store_from = g->nrecomputed;
		collect_loads(g, false);
		if (g->nelem > g->nprologue && (r = emit_row_pass(g, NULL, per_warp)) < 0)
			return r;
	} else {
		out(&g->b, "\t\tif (threadIdx.x %% 32 == 0%s) {\n", per_warp ? "" : " && warp == 0");
		out(&g->b, "\t\t\t");
		emit_row_out_offset(g);
		emit_result_store(g, rs, "acc", rs->cols, "\t\t\t");
		out(&g->b, "\t\t}\n");
	}
	if (!per_warp)
		out(&g->b, "\t\t__syncthreads();\n");
	out(&g->b, "\t}\n}\n");
	return 0;
}

/* One pass of a leading-axis reduction over a tile of `width` columns,
 * a thread taking `per` consecutive columns (vec > 1: as one vector) down
 * its rows of the chunk; then the 8 threads of a column combined in order.
 * The order of every column's sum is the same whatever per is. */
static int emit_column_tile(struct gen *g, const struct red_shape *rs, int per, const char *ind)
{
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	const struct red_code *rc = red_code_of(n->red.fn);
	const char *acc = rc->type[rs->acc64], *fn = rc->combine;
	const struct rp_prog_tensor *o = T(g, n->out[0]);
	int64_t out_stride = o->rank ? o->strides[o->rank - 1] : 0, tiles = (rs->cols + COL_TILE * per - 1) / (COL_TILE * per);
	int rank = g->dom->rank, r;
	bool vec = per > 1, two_pass = rs->chunks > 1;
	char in2[24], in3[24], in4[24], l[32], l2[32];

	snprintf(in2, sizeof(in2), "%s\t", ind);
	snprintf(in3, sizeof(in3), "%s\t\t", ind);
	snprintf(in4, sizeof(in4), "%s\t\t\t", ind);
	out(&g->b, "%sfor (idx_t b = blockIdx.x; b < %s; b += gridDim.x) {\n", ind, lit(tiles * rs->chunks, l));
	out(&g->b, "%sconst idx_t col0 = (b %% %s) * %d + tx * %d, chunk = b / %s;\n", in2, lit(tiles, l),
	    COL_TILE * per, per, l);
	out(&g->b, "%s%s acc[%d];\n", in2, acc, per);
	out(&g->b, "#pragma unroll\n%sfor (int j = 0; j < %d; j++)\n%s\tacc[j] = %s;\n", in2, per, in2,
	    rc->start[rs->acc64]);
	out(&g->b, "%sif (col0 < cols) {\n", in2);
	out(&g->b, "%sconst idx_t end = min(rows, (chunk + 1) * %s);\n", in3, lit(rs->chunk_rows, l2));
	out(&g->b, "%sfor (idx_t row = chunk * %s + ty; row < end; row += %d) {\n", in3, l2, COL_ROW_THREADS);
	emit_coords(g, "row", rank - 1, in4);
	if (vec) {
		out(&g->b, "%sconst idx_t base = row * cols + col0;\n", in4);
		for (int d = 0; d < rank - 1; d++)
			if (g->base_used[d])
				out(&g->b, "%sconst idx_t b%d = c%d;\n", in4, d, d);
		if (g->base_used[rank - 1])
			out(&g->b, "%sconst idx_t b%d = col0;\n", in4, rank - 1);
		emit_vector_loads(g, in4);
	}
	out(&g->b, "#pragma unroll\n%sfor (int j = 0; j < %d; j++) {\n", in4, per);
	char in5[32];
	snprintf(in5, sizeof(in5), "%s\t", in4);
	if (g->coord_used[rank - 1] && (!vec || vector_body_reads_coord(g, rank - 1)))
		out(&g->b, "%sconst idx_t c%d = col0 + j;\n", in5, rank - 1);
	if (!vec)
		out(&g->b, "%sconst idx_t idx = row * cols + col0 + j;\n", in5);
	r = emit_element(g, vec, in5);
	if (r < 0)
		return r;
	emit_accumulate(g, rs, in5, "acc[j]");
	out(&g->b, "%s}\n", in4);
	if (vec)
		emit_vector_stores(g, in4);
	out(&g->b, "%s}\n%s}\n", in3, in2);
	out(&g->b, "#pragma unroll\n%sfor (int j = 0; j < %d; j++)\n%s\tpart_sh[ty][tx * %d + j] = acc[j];\n", in2, per,
	    in2, per);
	out(&g->b, "%s__syncthreads();\n", in2);
	out(&g->b, "%sif (ty == 0 && col0 < cols) {\n", in2);
	out(&g->b, "#pragma unroll\n%sfor (int j = 0; j < %d; j++) {\n", in3, per);
	out(&g->b, "%s%s s = part_sh[0][tx * %d + j];\n", in4, acc, per);
	out(&g->b, "%sfor (int k = 1; k < %d; k++)\n%s\ts = %s(s, part_sh[k][tx * %d + j]);\n", in4, COL_ROW_THREADS,
	    in4, fn, per);
	if (two_pass) {
		out(&g->b, "%spart[chunk * cols + col0 + j] = s;\n", in4);
	} else {
		out(&g->b, "%sconst idx_t off = (col0 + j) * %s;\n", in4, lit(out_stride, l));
		emit_result_store(g, rs, "s", rs->rows, in4);
	}
	out(&g->b, "%s}\n%s}\n%s__syncthreads();\n%s}\n", in3, in2, in2, ind);
	return 0;
}

static int gen_column_reduction(struct gen *g, const struct red_shape *rs)
{
	struct rd_prog_kernel *k = &g->st->kernels[0];
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	const struct red_code *rc = red_code_of(n->red.fn);
	const char *acc = rc->type[rs->acc64], *fn = rc->combine;
	bool two_pass = rs->chunks > 1;
	int rank = g->dom->rank;
	char l[32], l2[32];
	int r;

	kernel_name(g, k->name, "reduce", g->st->nodes, g->st->nnodes, two_pass ? "_leading_part" : "_leading");
	k->block = COL_TILE * COL_ROW_THREADS;
	k->blocks_per_sm = 2048 / k->block;
	k->blocks = (uint64_t)(rs->tiles * rs->chunks);
	g->st->nkernels = 1;
	choose_vec(g);
	if (g->vec > 1 && rs->cols % g->vec != 0)
		g->vec = 1;
	for (int d = 0; d < rank - 1 && g->vec > 1; d++)
		g->coord_used[d] |= g->base_used[d];

	out(&g->b, "/* Columns %d at a time, %lld rows of %lld in chunks of %lld%s; %s accumulation in a fixed order%s. */\n",
	    COL_TILE, (long long)rs->rows, (long long)rs->cols, (long long)rs->chunk_rows,
	    two_pass ? " (partials to the arena, added by the next kernel)" : "", acc,
	    g->vec > 1 ? ", the same whether or not the vector path runs" : "");
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%u) %s(const struct rg_args *__restrict__ a)\n{\n",
	    k->block, k->name);
	emit_idx_type(g);
	declare_step_pointers(g);
	if (two_pass)
		out(&g->b, "\t%s *part = (%s *)(a->arena + %llu);\n", acc, acc,
		    (unsigned long long)g->st->scratch_offset);
	else
		declare_pointer(g, n->out[0]);
	out(&g->b, "\tconst idx_t rows = %s, cols = %s;\n", lit(rs->rows, l), lit(rs->cols, l2));
	out(&g->b, "\tconst int tx = threadIdx.x %% %d, ty = threadIdx.x / %d;\n", COL_TILE, COL_TILE);
	out(&g->b, "\t__shared__ %s part_sh[%d][%d];\n", acc, COL_ROW_THREADS, COL_TILE * g->vec + 1);
	if (g->vec > 1) {
		emit_vec_ok(g);
		out(&g->b, "\tif (vec_ok) {\n");
		if ((r = emit_column_tile(g, rs, g->vec, "\t\t")) < 0)
			return r;
		out(&g->b, "\t} else {\n");
		if ((r = emit_column_tile(g, rs, 1, "\t\t")) < 0)
			return r;
		out(&g->b, "\t}\n}\n\n");
	} else {
		if ((r = emit_column_tile(g, rs, 1, "\t")) < 0)
			return r;
		out(&g->b, "}\n\n");
	}
	if (!two_pass)
		return 0;

	/* The partials, added in chunk order. */
	k = &g->st->kernels[1];
	g->st->nkernels = 2;
	kernel_name(g, k->name, "reduce", &g->red, 1, "_leading_final");
	k->block = PW_BLOCK;
	k->blocks_per_sm = PW_BLOCKS_PER_SM;
	k->blocks = (uint64_t)((rs->cols + PW_BLOCK - 1) / PW_BLOCK);
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    PW_BLOCK, k->name);
	emit_idx_type(g);
	out(&g->b, "\tconst %s *part = (const %s *)(a->arena + %llu);\n", acc, acc,
	    (unsigned long long)g->st->scratch_offset);
	g->declared[n->out[0]] = false;
	declare_pointer(g, n->out[0]);
	out(&g->b, "\tconst idx_t cols = %s;\n", lit(rs->cols, l));
	out(&g->b, "\tfor (idx_t col = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; col < cols; col += (idx_t)gridDim.x * blockDim.x) {\n");
	out(&g->b, "\t\t%s acc = part[col];\n", acc);
	out(&g->b, "\t\tfor (idx_t k = 1; k < %s; k++)\n", lit(rs->chunks, l));
	out(&g->b, "\t\t\tacc = %s(acc, part[k * cols + col]);\n", fn);
	out(&g->b, "\t\tconst idx_t off = col * %s;\n", lit(T(g, n->out[0])->rank ? T(g, n->out[0])->strides[T(g, n->out[0])->rank - 1] : 0, l));
	emit_result_store(g, rs, "acc", rs->rows, "\t\t");
	out(&g->b, "\t}\n}\n");
	return 0;
}

static int gen_reduction(struct gen *g)
{
	const struct rp_prog_node *n = &g->p->nodes[g->red];
	struct red_shape rs;

	if (n->nin < 1 || n->in[0] < 0 || n->nout != 1 || !red_code_of(n->red.fn) || T(g, n->in[0])->rank < 1)
		return -EINVAL;
	red_shape_of(g->p, n, &rs);
	if (n->red.fn == RP_RED_LOGSUMEXP && !rs.last)
		return -EINVAL;   /* the check refuses it (proto/program_ops.c) */
	if (rs.rows == 0 || rs.cols == 0) {
		g->st->nkernels = 0;
		return 0;
	}
	return rs.last ? gen_row_reduction(g, &rs) : gen_column_reduction(g, &rs);
}

/* ---- GATHER --------------------------------------------------------------------- */

/* The output's offset of element (i, d) of an [N, D] view: i row-major over
 * its leading dims, d along the last. */
static void emit_rows_offset(struct gen *g, int t, const char *row, const char *col)
{
	const struct rp_prog_tensor *x = T(g, t);
	char l[32];
	struct rp_prog_tensor lead = *x;

	/* The leading dims as a tensor of their own. */
	lead.rank = x->rank - 1;
	out(&g->b, "(");
	if (lead.rank > 0) {
		int64_t below = 1;
		int lowest = -1, terms = 0;
		for (int k = 0; k < lead.rank; k++)
			if (lead.shape[k] > 1) {
				lowest = k;
				break;
			}
		for (int k = lead.rank - 1; k >= 0; k--) {
			if (lead.shape[k] > 1 && lead.strides[k] != 0) {
				out(&g->b, "%s", terms++ ? " + " : "");
				emit_digit(g, row, below, lead.shape[k], k == lowest);
				out(&g->b, " * %s", lit(lead.strides[k], l));
			}
			below *= lead.shape[k];
		}
		if (!terms)
			out(&g->b, "0");
	} else {
		out(&g->b, "0");
	}
	out(&g->b, ") + %s", col);
	if (x->strides[x->rank - 1] != 1)
		out(&g->b, " * %s", lit(x->strides[x->rank - 1], l));
}

/* rg_raise for this step's node at flat index position `pos`. */
static void emit_raise(struct gen *g, const char *ind, const char *pos)
{
	out(&g->b, "%srg_raise(a, %lluull, %d, (long long)%s, v);\n", ind, (unsigned long long)g->plan->fault_offset,
	    g->st->nodes[0], pos);
}

/* Kernel k of a gather step: one thread hands a fault its step's kernels
 * noted to the Run (the first of the Run's, when several steps noted one)
 * and clears the note for the next Run. */
static int emit_report_kernel(struct gen *g, int k)
{
	struct rd_prog_kernel *kr = &g->st->kernels[k];
	unsigned long long at = (unsigned long long)g->plan->fault_offset;

	kernel_name(g, kr->name, "gather", g->st->nodes, 1, "_report");
	g->st->nkernels = k + 1;
	kr->block = 32;
	kr->blocks_per_sm = 1;
	kr->blocks = 1;
	out(&g->b, "\n/* The first index outside the table, handed to the Run. */\n");
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(32) %s(const struct rg_args *__restrict__ a)\n{\n",
	    kr->name);
	out(&g->b, "\tstruct rg_fault *f = (struct rg_fault *)(a->arena + %lluull);\n", at);
	out(&g->b, "\tif (threadIdx.x != 0 || !f->raised)\n\t\treturn;\n");
	out(&g->b, "\tif (a->fault && !a->fault->raised) {\n");
	out(&g->b, "\t\ta->fault->node = f->node;\n\t\ta->fault->position = f->position;\n");
	out(&g->b, "\t\ta->fault->value = f->value;\n\t\t__threadfence_system();\n\t\ta->fault->raised = 1;\n\t}\n");
	out(&g->b, "\tf->raised = 0;\n}\n");
	return 0;
}

/* Elements of a row an embedding copies at once: 16 bytes, when the table
 * and the output have one dtype, contiguous rows that split into whole
 * vectors, and vector-aligned row starts; 1 otherwise. */
static int embedding_vec(const struct gen *g, int table, int o)
{
	const struct rp_prog_tensor *tt = T(g, table), *ot = T(g, o);
	int vec = (int)(16 / rp_dtype_size(tt->dtype));
	int64_t dim = tt->shape[1];

	if (vec > 8)
		vec = 8;
	if (tt->dtype != ot->dtype || tt->strides[1] != 1 || ot->strides[ot->rank - 1] != 1 || dim % vec != 0 ||
	    tt->strides[0] % vec != 0)
		return 1;
	for (int k = 0; k < ot->rank - 1; k++)
		if (ot->shape[k] > 1 && ot->strides[k] % vec != 0)
			return 1;
	return vec;
}

static int gen_embedding(struct gen *g, const struct rp_prog_node *n)
{
	struct rd_prog_kernel *k = &g->st->kernels[0];
	int table = n->in[0], index = n->in[1], o = n->out[0];
	const struct rp_prog_tensor *tt = T(g, table), *ot = T(g, o);
	int64_t rows = numel_of(T(g, index)), dim = tt->shape[1], vocab = tt->shape[0];
	char l[32], l2[32], l3[32];

	kernel_name(g, k->name, "gather", g->st->nodes, 1, "");
	g->st->nkernels = 1;
	k->block = PW_BLOCK;
	k->blocks_per_sm = PW_BLOCKS_PER_SM;
	k->blocks = (uint64_t)((rows * dim + PW_BLOCK - 1) / PW_BLOCK);
	g->root_written[o] = true;
	emit_node_comment(g, g->st->nodes[0], "");
	out(&g->b, "/* out[i, :] = table[index[i], :]; an index outside [0, %lld) reads as a row of zeros and is reported. */\n",
	    (long long)vocab);
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    PW_BLOCK, k->name);
	emit_idx_type(g);
	declare_pointer(g, table);
	declare_pointer(g, index);
	declare_pointer(g, o);
	out(&g->b, "\tconst idx_t n = %s, dim = %s;\n", lit(rows * dim, l), lit(dim, l2));
	out(&g->b, "\tidx_t start = 0;\n");
	int vec = embedding_vec(g, table, o);
	if (vec > 1) {
		const char *ty = ctype(tt->dtype);
		out(&g->b, "\t/* Rows %d elements at a time where both rows are aligned to it. */\n", vec);
		out(&g->b, "\tif ((unsigned long long)p%d %% %zu == 0 && (unsigned long long)p%d %% %zu == 0) {\n", table,
		    (size_t)vec * rp_dtype_size(tt->dtype), o, (size_t)vec * rp_dtype_size(ot->dtype));
		out(&g->b, "\t\tfor (idx_t e = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; e < n / %d; e += (idx_t)gridDim.x * blockDim.x) {\n",
		    vec);
		out(&g->b, "\t\t\tconst idx_t i = e / %s, d = (e - i * %s) * %d;\n", lit(dim / vec, l), l, vec);
		out(&g->b, "\t\t\tconst long long v = (long long)p%d[", index);
		emit_flat_offset(g, index, "i");
		out(&g->b, "];\n");
		out(&g->b, "\t\t\trg_vec<%s, %d> x;\n", ty, vec);
		out(&g->b, "\t\t\tif (v >= 0 && v < %s)\n", lit(vocab, l));
		out(&g->b, "\t\t\t\tx = *(const rg_vec<%s, %d> *)(p%d + v * %s + d);\n", ty, vec, table,
		    lit(tt->strides[0], l2));
		out(&g->b, "\t\t\telse {\n");
		emit_raise(g, "\t\t\t\t", "i");
		out(&g->b, "#pragma unroll\n\t\t\t\tfor (int j = 0; j < %d; j++)\n", vec);
		out(&g->b, "\t\t\t\t\tx.v[j] = rg_cvt<%s>(0.0f);\n\t\t\t}\n", ty);
		out(&g->b, "\t\t\t*(rg_vec<%s, %d> *)(p%d + ", ty, vec, o);
		emit_rows_offset(g, o, "i", "d");
		out(&g->b, ") = x;\n\t\t}\n\t\tstart = n;\n\t}\n");
	}
	out(&g->b, "\tfor (idx_t e = start + (idx_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (idx_t)gridDim.x * blockDim.x) {\n");
	out(&g->b, "\t\tconst idx_t i = e / dim, d = e - i * dim;\n");
	out(&g->b, "\t\tconst long long v = (long long)p%d[", index);
	emit_flat_offset(g, index, "i");
	out(&g->b, "];\n");
	out(&g->b, "\t\tif ((v < 0 || v >= %s) && d == 0)\n", lit(vocab, l));
	emit_raise(g, "\t\t\t", "i");
	out(&g->b, "\t\tconst %s x = v >= 0 && v < %s ? p%d[v * %s + d * %s] : rg_cvt<%s>(0.0f);\n", ctype(tt->dtype),
	    lit(vocab, l), table, lit(tt->strides[0], l2), lit(tt->strides[1], l3), ctype(tt->dtype));
	out(&g->b, "\t\tp%d[", o);
	emit_rows_offset(g, o, "i", "d");
	if (ot->dtype == tt->dtype)
		out(&g->b, "] = x;\n");
	else
		out(&g->b, "] = rg_cvt<%s>(rg_f32(x));\n", ctype(ot->dtype));
	out(&g->b, "\t}\n}\n");
	return emit_report_kernel(g, 1);
}

/* Merge pass `pass` (from 1) of the tiles' sorted runs: runs of
 * EMB_SORT_TILE << (pass - 1) keys merged pairwise from one buffer into the
 * other. A block writes a tile of the output: the merge path (the keys it
 * takes from each run) found for the tile's first and last outputs, those
 * keys brought into shared memory, each thread merging its share after its
 * own search there: O(rows) a pass. */
static void emit_merge_kernel(struct gen *g, const struct emb_sort *es, int pass, struct rd_prog_kernel *k)
{
	uint64_t base = g->st->scratch_offset, half = (uint64_t)es->padded * sizeof(uint64_t);
	int per = EMB_SORT_TILE / EMB_SORT_BLOCK;
	char suffix[24], l[32], l2[32];

	snprintf(suffix, sizeof(suffix), "_merge%d", pass);
	kernel_name(g, k->name, "gather", g->st->nodes, 1, suffix);
	k->block = EMB_SORT_BLOCK;
	k->blocks_per_sm = PW_BLOCKS_PER_SM;
	k->blocks = (uint64_t)(es->padded / EMB_SORT_TILE);
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    EMB_SORT_BLOCK, k->name);
	emit_idx_type(g);
	out(&g->b, "\tconst unsigned long long *src = (const unsigned long long *)(a->arena + %lluull);\n",
	    (unsigned long long)(base + (pass % 2 ? 0 : half)));
	out(&g->b, "\tunsigned long long *dst = (unsigned long long *)(a->arena + %lluull);\n",
	    (unsigned long long)(base + (pass % 2 ? half : 0)));
	out(&g->b, "\tconst idx_t n = %s, run = %s;\n", lit(es->padded, l), lit((int64_t)EMB_SORT_TILE << (pass - 1), l2));
	out(&g->b, "\t__shared__ unsigned long long sh[%d];\n\t__shared__ idx_t cut[2];\n", EMB_SORT_TILE);
	out(&g->b, "\tfor (idx_t t = blockIdx.x; t < n / %d; t += gridDim.x) {\n", EMB_SORT_TILE);
	out(&g->b, "\t\tconst idx_t out0 = t * %d, pair = out0 / (2 * run) * (2 * run);\n", EMB_SORT_TILE);
	out(&g->b, "\t\tconst idx_t na = n - pair < run ? n - pair : run;\n");
	out(&g->b, "\t\tconst idx_t nb = n - pair - na < run ? n - pair - na : run;\n");
	out(&g->b, "\t\tconst unsigned long long *A = src + pair, *B = A + na;\n");
	out(&g->b, "\t\tconst idx_t d0 = out0 - pair;\n");
	out(&g->b, "\t\tif (threadIdx.x < 2)\n");
	out(&g->b, "\t\t\tcut[threadIdx.x] = (idx_t)rg_merge_split(A, na, B, nb, d0 + (idx_t)threadIdx.x * %d);\n",
	    EMB_SORT_TILE);
	out(&g->b, "\t\t__syncthreads();\n");
	out(&g->b, "\t\tconst int la = (int)(cut[1] - cut[0]), lb = %d - la;\n", EMB_SORT_TILE);
	out(&g->b, "\t\tconst idx_t a0 = cut[0], b0 = d0 - a0;\n");
	out(&g->b, "\t\tfor (int e = threadIdx.x; e < %d; e += blockDim.x)\n", EMB_SORT_TILE);
	out(&g->b, "\t\t\tsh[e] = e < la ? A[a0 + e] : B[b0 + e - la];\n");
	out(&g->b, "\t\t__syncthreads();\n");
	out(&g->b, "\t\tconst int d = threadIdx.x * %d;\n", per);
	out(&g->b, "\t\tint i = (int)rg_merge_split(sh, la, sh + la, lb, d), j = d - i;\n");
	out(&g->b, "#pragma unroll\n\t\tfor (int k = 0; k < %d; k++) {\n", per);
	out(&g->b, "\t\t\tconst bool from_a = i < la && (j >= lb || sh[i] <= sh[la + j]);\n");
	out(&g->b, "\t\t\tdst[out0 + d + k] = from_a ? sh[i++] : sh[la + j++];\n\t\t}\n");
	out(&g->b, "\t\t__syncthreads();\n\t}\n}\n\n");
}

/* d_table = 0; then the positions sorted by (index, position) as 64-bit
 * keys, unique, so that any correct sort gives the one order: tiles sorted
 * in shared memory, then merged pairwise (O(N log N) in all, no atomics);
 * then each key's rows of d_out summed in position order by the blocks that
 * find its first key. The same bits every run. */
static int gen_embedding_backward(struct gen *g, const struct rp_prog_node *n)
{
	struct rd_prog_kernel *k = &g->st->kernels[0];
	int dout = n->in[0], index = n->in[1], o = n->out[0];
	const struct rp_prog_tensor *ot = T(g, o), *dt = T(g, dout);
	int64_t dim = ot->shape[1], vocab = ot->shape[0];
	bool acc64 = needs_f64(dt->dtype) || needs_f64(ot->dtype);
	const char *acc = acc64 ? "double" : "float", *conv = acc64 ? "rg_f64" : "rg_f32";
	uint64_t keys = g->st->scratch_offset;
	struct emb_sort es;
	char l[32], l2[32], l3[32];

	if (emb_sort_of(g->p, n, &es) < 0) {
		rp_error_set(g->err, RP_ERR_BACKEND,
			     "embedding_backward over %lld positions of a table of %lld rows: a (row, position) key "
			     "takes more than 63 bits",
			     (long long)es.rows, (long long)vocab);
		return -EINVAL;
	}
	g->root_written[o] = true;
	g->st->nkernels = 4 + es.passes;
	kernel_name(g, k->name, "gather", g->st->nodes, 1, "_zero");
	k->block = PW_BLOCK;
	k->blocks_per_sm = PW_BLOCKS_PER_SM;
	k->blocks = (uint64_t)((vocab * dim + PW_BLOCK - 1) / PW_BLOCK);
	emit_node_comment(g, g->st->nodes[0], "");
	out(&g->b, "/* d_table = 0, then each index's rows of d_out summed in position order; an index outside the table adds to no row and is reported. */\n");
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    PW_BLOCK, k->name);
	emit_idx_type(g);
	declare_pointer(g, o);
	out(&g->b, "\tconst idx_t n = %s, dim = %s;\n", lit(vocab * dim, l), lit(dim, l2));
	out(&g->b, "\tfor (idx_t e = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (idx_t)gridDim.x * blockDim.x) {\n");
	out(&g->b, "\t\tconst idx_t v = e / dim, d = e - v * dim;\n");
	out(&g->b, "\t\tp%d[", o);
	emit_rows_offset(g, o, "v", "d");
	out(&g->b, "] = rg_cvt<%s>(0.0f);\n", ctype(ot->dtype));
	out(&g->b, "\t}\n}\n\n");

	out(&g->b, "/* How many of the first d keys of the merge of A and B come from A (a tie\n"
		   " * takes A's first). */\n");
	out(&g->b, "RG_DEV long long rg_merge_split(const unsigned long long *A, long long na, const unsigned long long *B,\n"
		   "\t\t\t\t  long long nb, long long d)\n{\n");
	out(&g->b, "\tlong long lo = d > nb ? d - nb : 0, hi = d < na ? d : na;\n");
	out(&g->b, "\twhile (lo < hi) {\n\t\tconst long long mid = (lo + hi) / 2;\n");
	out(&g->b, "\t\tif (A[mid] <= B[d - 1 - mid])\n\t\t\tlo = mid + 1;\n\t\telse\n\t\t\thi = mid;\n\t}\n");
	out(&g->b, "\treturn lo;\n}\n\n");

	/* Each tile of positions as keys, sorted (bitonic, in shared memory). */
	k = &g->st->kernels[1];
	kernel_name(g, k->name, "gather", g->st->nodes, 1, "_sort");
	k->block = EMB_SORT_BLOCK;
	k->blocks_per_sm = PW_BLOCKS_PER_SM;
	k->blocks = (uint64_t)(es.padded / EMB_SORT_TILE);
	memset(g->declared, 0, (size_t)g->p->ntensors * sizeof(*g->declared));
	out(&g->b, "/* Key (index << %d) | position, or ~0 (last) past the positions and for an index\n"
		   " * outside the table, which is reported; each tile of %d keys sorted. */\n",
	    es.pbits, EMB_SORT_TILE);
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    EMB_SORT_BLOCK, k->name);
	emit_idx_type(g);
	declare_pointer(g, index);
	out(&g->b, "\tunsigned long long *keys = (unsigned long long *)(a->arena + %lluull);\n", (unsigned long long)keys);
	out(&g->b, "\tconst idx_t rows = %s, tiles = %s;\n", lit(es.rows, l), lit(es.padded / EMB_SORT_TILE, l2));
	out(&g->b, "\t__shared__ unsigned long long sh[%d];\n", EMB_SORT_TILE);
	out(&g->b, "\tfor (idx_t t = blockIdx.x; t < tiles; t += gridDim.x) {\n");
	out(&g->b, "\t\tfor (int e = threadIdx.x; e < %d; e += blockDim.x) {\n", EMB_SORT_TILE);
	out(&g->b, "\t\t\tconst idx_t i = t * %d + e;\n", EMB_SORT_TILE);
	out(&g->b, "\t\t\tunsigned long long key = ~0ull;\n");
	out(&g->b, "\t\t\tif (i < rows) {\n");
	out(&g->b, "\t\t\t\tconst long long v = (long long)p%d[", index);
	emit_flat_offset(g, index, "i");
	out(&g->b, "];\n");
	out(&g->b, "\t\t\t\tif (v >= 0 && v < %s)\n", lit(vocab, l));
	out(&g->b, "\t\t\t\t\tkey = (unsigned long long)v << %d | (unsigned long long)i;\n", es.pbits);
	out(&g->b, "\t\t\t\telse\n");
	emit_raise(g, "\t\t\t\t\t", "i");
	out(&g->b, "\t\t\t}\n\t\t\tsh[e] = key;\n\t\t}\n\t\t__syncthreads();\n");
	out(&g->b, "\t\tfor (int size = 2; size <= %d; size <<= 1)\n", EMB_SORT_TILE);
	out(&g->b, "\t\t\tfor (int half = size >> 1; half > 0; half >>= 1) {\n");
	out(&g->b, "\t\t\t\tfor (int e = threadIdx.x; e < %d; e += blockDim.x) {\n", EMB_SORT_TILE / 2);
	out(&g->b, "\t\t\t\t\tconst int lo = e / half * 2 * half + e %% half, hi = lo + half;\n");
	out(&g->b, "\t\t\t\t\tconst unsigned long long x = sh[lo], y = sh[hi];\n");
	out(&g->b, "\t\t\t\t\tif ((x > y) == ((lo & size) == 0)) {\n");
	out(&g->b, "\t\t\t\t\t\tsh[lo] = y;\n\t\t\t\t\t\tsh[hi] = x;\n\t\t\t\t\t}\n\t\t\t\t}\n");
	out(&g->b, "\t\t\t\t__syncthreads();\n\t\t\t}\n");
	out(&g->b, "\t\tfor (int e = threadIdx.x; e < %d; e += blockDim.x)\n", EMB_SORT_TILE);
	out(&g->b, "\t\t\tkeys[t * %d + e] = sh[e];\n", EMB_SORT_TILE);
	out(&g->b, "\t\t__syncthreads();\n\t}\n}\n\n");

	for (int pass = 1; pass <= es.passes; pass++)
		emit_merge_kernel(g, &es, pass, &g->st->kernels[1 + pass]);
	if (es.passes % 2)
		keys += (uint64_t)es.padded * sizeof(uint64_t);

	k = &g->st->kernels[2 + es.passes];
	kernel_name(g, k->name, "gather", g->st->nodes, 1, "_rows");
	k->block = EMB_BLOCK;
	k->blocks_per_sm = 2048 / EMB_BLOCK;
	k->blocks = (uint64_t)(es.padded * es.chunks);
	memset(g->declared, 0, (size_t)g->p->ntensors * sizeof(*g->declared));
	out(&g->b, "/* A block per sorted key and %d columns: where the key is its index's first,\n"
		   " * the index's rows of d_out summed in position order (the keys' order). */\n",
	    EMB_BLOCK);
	out(&g->b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const struct rg_args *__restrict__ a)\n{\n",
	    EMB_BLOCK, k->name);
	emit_idx_type(g);
	declare_pointer(g, dout);
	declare_pointer(g, o);
	out(&g->b, "\tconst unsigned long long *keys = (const unsigned long long *)(a->arena + %lluull);\n",
	    (unsigned long long)keys);
	out(&g->b, "\tconst idx_t n = %s, dim = %s, chunks = %s;\n", lit(es.padded, l), lit(dim, l2), lit(es.chunks, l3));
	out(&g->b, "\tfor (idx_t w = blockIdx.x; w < n * chunks; w += gridDim.x) {\n");
	out(&g->b, "\t\tconst idx_t s = w / chunks, d = (w - s * chunks) * %d + threadIdx.x;\n", EMB_BLOCK);
	out(&g->b, "\t\tconst long long v = (long long)(keys[s] >> %d);\n", es.pbits);
	out(&g->b, "\t\tif (v >= %s || (s > 0 && (long long)(keys[s - 1] >> %d) == v) || d >= dim)\n",
	    lit(vocab, l), es.pbits);
	out(&g->b, "\t\t\tcontinue;\n");
	out(&g->b, "\t\t%s acc = 0;\n", acc);
	out(&g->b, "\t\tfor (idx_t j = s; j < n && (long long)(keys[j] >> %d) == v; j++) {\n", es.pbits);
	out(&g->b, "\t\t\tconst idx_t i = (idx_t)(keys[j] & %lluull);\n",
	    (unsigned long long)((UINT64_C(1) << es.pbits) - 1));
	out(&g->b, "\t\t\tacc += %s(p%d[", conv, dout);
	emit_rows_offset(g, dout, "i", "d");
	out(&g->b, "]);\n\t\t}\n");
	out(&g->b, "\t\tp%d[", o);
	emit_rows_offset(g, o, "v", "d");
	out(&g->b, "] = rg_cvt<%s>(acc);\n\t}\n}\n", ctype(ot->dtype));
	return emit_report_kernel(g, 3 + es.passes);
}

static int gen_gather(struct gen *g)
{
	const struct rp_prog_node *n = &g->p->nodes[g->st->nodes[0]];

	if (n->nin < 2 || n->in[0] < 0 || n->in[1] < 0 || n->nout != 1 || n->out[0] < 0)
		return -EINVAL;
	if (n->gather.fn == RP_GATHER_EMBEDDING) {
		if (T(g, n->in[0])->rank != 2 || T(g, n->out[0])->rank < 2)
			return -EINVAL;
		g->idx64 = numel_of(T(g, n->out[0])) > IDX32_MAX || span_of(T(g, n->out[0])) > IDX32_MAX ||
			   span_of(T(g, n->in[1])) > IDX32_MAX;
		return gen_embedding(g, n);
	}
	if (n->gather.fn == RP_GATHER_EMBEDDING_BACKWARD) {
		if (T(g, n->out[0])->rank != 2 || T(g, n->in[0])->rank < 2)
			return -EINVAL;
		struct emb_sort es;
		if (emb_sort_of(g->p, n, &es) == 0 && es.padded * es.chunks > IDX32_MAX)
			g->idx64 = true;
		g->idx64 |= numel_of(T(g, n->out[0])) > IDX32_MAX || span_of(T(g, n->out[0])) > IDX32_MAX ||
			    numel_of(T(g, n->in[0])) > IDX32_MAX || span_of(T(g, n->in[0])) > IDX32_MAX ||
			    span_of(T(g, n->in[1])) > IDX32_MAX;
		return gen_embedding_backward(g, n);
	}
	return -EINVAL;
}

/* ---- the step ---------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

int rd_prog_codegen_step(const struct rp_program *p, struct rd_prog_plan *plan, int s, struct rp_error *err)
{
	struct rd_prog_step *st = &plan->steps[s];
	struct gen g = { .p = p, .plan = plan, .st = st, .s = s, .red = -1, .vec = 1, .err = err };
	int last = st->nnodes ? st->nodes[st->nnodes - 1] : -1;
	int r = -ENOMEM, cap = STEP_KERNELS_MAX, nt = p->ntensors ? p->ntensors : 1;
	struct emb_sort es;

	g.mem = malloc((size_t)(st->nnodes * RP_PROG_NODE_IN_MAX + 1) * sizeof(*g.mem));
	g.elem = malloc((size_t)(st->nnodes + 1) * sizeof(*g.elem));
	g.rows = malloc((size_t)(st->nnodes + 1) * sizeof(*g.rows));
	g.root_written = calloc((size_t)nt, sizeof(*g.root_written));
	g.declared = calloc((size_t)nt, sizeof(*g.declared));
	g.vmode = calloc((size_t)nt, sizeof(*g.vmode));
	g.loaded_as = calloc((size_t)nt, sizeof(*g.loaded_as));
	g.row_loaded = calloc((size_t)nt, sizeof(*g.row_loaded));
	if (!g.mem || !g.elem || !g.rows || !g.root_written || !g.declared || !g.vmode || !g.loaded_as ||
	    !g.row_loaded)
		goto out;
	switch (st->kind) {
	case RD_STEP_FUSED:
		g.pw = st->nodes;
		g.npw = g.nelem = g.nprologue = st->nnodes;
		g.dom = &p->tensors[p->nodes[st->nodes[0]].out[0]];
		break;
	case RD_STEP_REDUCTION: {
		/* The prologue and the epilogue over the domain in elem[], the
		 * epilogue over rows in rows[] (it reads no element value: the
		 * plan's epilogue_joins). */
		int at = reduction_at(p, st);
		g.red = last = st->nodes[at];
		g.dom = &p->tensors[p->nodes[g.red].in[0]];
		for (int k = 0; k < st->nnodes; k++) {
			const struct rp_prog_tensor *o = &p->tensors[p->nodes[st->nodes[k]].out[0]];
			if (k < at || (k > at && rd_prog_same_shape(o, g.dom)))
				g.elem[g.nelem++] = st->nodes[k];
			else if (k > at)
				g.rows[g.nrows++] = st->nodes[k];
		}
		g.nprologue = at;
		g.pw = g.elem;
		g.npw = g.nelem;
		if ((r = plan_pass2(&g)) < 0)
			goto out;
		r = -ENOMEM;
		break;
	}
	case RD_STEP_GATHER:
		break;
	default:
		r = 0;
		goto out;
	}
	if (is_embedding_backward(p, st) && emb_sort_of(p, &p->nodes[st->nodes[0]], &es) == 0)
		cap = 4 + es.passes;
	st->kernels = calloc((size_t)cap, sizeof(*st->kernels));
	if (!st->kernels)
		goto out;
	if (g.dom) {
		/* Everything any pass loads (for the pointers, the vectors and
		 * the coordinates); each pass collects its own loads anew. */
		g.rows_ready = true;
		collect_loads(&g, true);
		mark_written(&g);
		mark_coords(&g);
		g.idx64 = !offsets_fit_int(&g);
		g.rows_ready = false;
	}
	emit_header(&g);
	switch (st->kind) {
	case RD_STEP_FUSED:
		r = gen_fused(&g);
		break;
	case RD_STEP_REDUCTION:
		r = gen_reduction(&g);
		break;
	default:
		r = gen_gather(&g);
		break;
	}
	if (r == -EINVAL && !err->name) {
		char name[RP_PROG_NAME_MAX + 1];
		rp_error_set(err, RP_ERR_BACKEND, "program %s: node %d (%s) has a form the code generator does not take",
			     safe_name(p->name, name), last, p->nodes[last].op->name);
	}
	if (r == 0 && g.unplaced) {
		char name[RP_PROG_NAME_MAX + 1];
		rp_error_set(err, RP_ERR_BACKEND, "program %s: step %d reads an intermediate the plan never stores",
			     safe_name(p->name, name), s);
		r = -EINVAL;
	}
	if (r < 0)
		goto out;
	if (g.b.failed) {
		r = -ENOMEM;
		goto out;
	}
	st->source = g.b.p;
	st->source_len = g.b.len;
	st->source_hash = fnv1a(g.b.p, g.b.len);
	g.b.p = NULL;
	r = 0;
out:
	if (r == -ENOMEM && !err->name)
		rp_error_set(err, RP_ERR_OUT_OF_MEMORY, "no memory to write program %s's kernels", p->name);
	free(g.b.p);
	free(g.mem);
	free(g.elem);
	free(g.rows);
	free(g.pass2);
	free(g.row_loaded);
	free(g.root_written);
	free(g.declared);
	free(g.vmode);
	free(g.loaded_as);
	return r;
}
