/* SPDX-License-Identifier: Apache-2.0 */
/* Every kind of kernel the code generator writes (daemon/program/codegen.c)
 * compiles with NVRTC for sm_90, no GPU needed: each pointwise op in each
 * dtype, constants and scalars, broadcasts and strided views, iotas,
 * every reduction over either axis with and without a prologue, the
 * embedding and its backward, 64-bit indexing. Each compiled image holds
 * the kernels the plan names. Whether they compute the right numbers is
 * the GPU tests' (tests/gpu/test_program_kernels.c).
 *
 * NVRTC is opened at run time (libnvrtc from REGEN_TEST_NVRTC, else the
 * loader's path); without it, or without the toolkit's cuda_bf16.h, the
 * test is skipped (exit 77). */
#include <check.h>
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/program/plan.h"
#include "tests/lib/program_check.h"
#include "tests/unit/prog_builder.h"
#include "tests/unit/unit.h"

/* The few NVRTC entry points used, declared here: no toolkit header. */
typedef int nvrtc_result;
typedef struct nvrtc_program *nvrtc_program;
static struct {
	nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int, const char *const *,
			       const char *const *);
	nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
	nvrtc_result (*log_size)(nvrtc_program, size_t *);
	nvrtc_result (*log)(nvrtc_program, char *);
	nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
	nvrtc_result (*cubin)(nvrtc_program, char *);
	nvrtc_result (*destroy)(nvrtc_program *);
	nvrtc_result (*version)(int *, int *);
} nvrtc;
static char include_opt[4200];

static void *open_nvrtc(void)
{
	const char *names[] = { getenv("REGEN_TEST_NVRTC"), "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		void *h = names[i] ? dlopen(names[i], RTLD_NOW | RTLD_LOCAL) : NULL;
		if (h)
			return h;
	}
	return NULL;
}

/* -I for cuda_bf16.h: REGEN_TEST_CUDA_INCLUDE, else the include folder
 * beside the library NVRTC was loaded from. */
static bool find_include(void)
{
	char dir[4096], probe[4200];
	const char *env = getenv("REGEN_TEST_CUDA_INCLUDE");
	Dl_info info;

	if (env && *env) {
		snprintf(dir, sizeof(dir), "%s", env);
	} else {
		if (!dladdr((void *)nvrtc.version, &info) || !info.dli_fname)
			return false;
		char lib[4096];
		snprintf(lib, sizeof(lib), "%s", info.dli_fname);
		snprintf(dir, sizeof(dir), "%s/../include", dirname(lib));
	}
	snprintf(probe, sizeof(probe), "%s/cuda_bf16.h", dir);
	if (access(probe, R_OK) != 0)
		return false;
	snprintf(include_opt, sizeof(include_opt), "-I%s", dir);
	return true;
}

/* Compiles every step's source of the plan; fails with NVRTC's log. */
static void compile_plan(const struct rd_prog_plan *plan, const char *arch)
{
	for (int s = 0; s < plan->nsteps; s++) {
		const struct rd_prog_step *st = &plan->steps[s];
		nvrtc_program prog;
		const char *opts[] = { arch, "-default-device", "--std=c++17", include_opt };
		size_t n = 0;

		if (!st->source)
			continue;
		ck_assert_int_eq(nvrtc.create(&prog, st->source, "step.cu", 0, NULL, NULL), 0);
		int r = nvrtc.compile(prog, 4, opts);
		nvrtc.log_size(prog, &n);
		char *log = calloc(1, n + 1);
		nvrtc.log(prog, log);
		if (r == 0 && getenv("REGEN_TEST_SHOW_LOG") && *log)
			fprintf(stderr, "---- step %d: NVRTC's log ----\n%s\n", s, log);
		if (r != 0)
			fprintf(stderr, "---- step %d's source ----\n%s\n---- NVRTC's log ----\n%s\n", s, st->source, log);
		ck_assert_msg(r == 0, "step %d (%s) does not compile for %s: %.300s", s,
			      rd_prog_step_kind_name(st->kind), arch, log);
		free(log);
		ck_assert_int_eq(nvrtc.cubin_size(prog, &n), 0);
		char *img = malloc(n);
		ck_assert_int_eq(nvrtc.cubin(prog, img), 0);
		/* The image names every kernel the plan will look up. */
		for (int k = 0; k < st->nkernels; k++) {
			const char *name = st->kernels[k].name;
			size_t len = strlen(name) + 1;
			ck_assert_msg(memmem(img, n, name, len) != NULL, "kernel %s is not in step %d's image", name, s);
		}
		free(img);
		nvrtc.destroy(&prog);
	}
}

static struct pb b;

static void build_and_compile(void)
{
	struct rd_prog_plan plan;
	struct rp_error err = { 0 };

	pb_finish(&b);
	int r = rd_prog_plan_build(&b.p, &plan, &err);
	ck_assert_msg(r == 0, "plan: %d", r);
	compile_plan(&plan, "-arch=sm_90");
	rd_prog_plan_finish(&plan);
}

static bool binary(enum rp_pointwise fn)
{
	return fn <= RP_PW_GE || (fn >= RP_PW_GELU_BACKWARD && fn <= RP_PW_RELU_BACKWARD);
}

/* Every op with tensor inputs, chained, in one dtype (the loop's dtype);
 * comparisons write u8. */
static const enum rp_dtype dtypes[] = { RP_DTYPE_F32, RP_DTYPE_BF16, RP_DTYPE_F16, RP_DTYPE_F64 };

START_TEST(every_pointwise_op)
{
	enum rp_dtype dt = dtypes[_i];
	pb_init(&b, "ops");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, dt, PB_DIMS(3, 1000));
	int y = pb_tensor(&b, "y", RP_PT_INPUT, dt, PB_DIMS(3, 1000));
	int prev = x;
	for (int fn = 0; fn <= RP_PW_RELU_BACKWARD; fn++) {
		bool cmp = fn >= RP_PW_EQ && fn <= RP_PW_GE;
		int out = pb_tensor(&b, "t", RP_PT_OUTPUT, cmp ? RP_DTYPE_U8 : dt, PB_DIMS(3, 1000));
		if (binary(fn))
			pb_pw(&b, fn, out, prev, y, -1);
		else
			pb_pw(&b, fn, out, prev, -1);
		if (!cmp)
			prev = out;
	}
	int cond = pb_tensor(&b, "cond", RP_PT_INPUT, RP_DTYPE_U8, PB_DIMS(3, 1000));
	int w = pb_tensor(&b, "w", RP_PT_OUTPUT, dt, PB_DIMS(3, 1000));
	pb_pw(&b, RP_PW_WHERE, w, cond, prev, y, -1);
	build_and_compile();
}
END_TEST

/* The node's constant in either place, pow's special exponents, a scalar
 * bound at Run, where with a constant, fill, iota, casts to every dtype. */
START_TEST(constants_scalars_casts)
{
	pb_init(&b, "consts");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(4, 5, 6));
	int lr = pb_scalar(&b, "lr");
	double exps[] = { 2, 3, 0.5, -0.5, -1, -2, 1.7 };
	int prev = x;
	for (size_t i = 0; i < sizeof(exps) / sizeof(exps[0]); i++) {
		int t = pb_tensor(&b, "p", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4, 5, 6));
		pb_pw_const(&b, RP_PW_POW, t, prev, exps[i], false);
		prev = t;
	}
	int t1 = pb_tensor(&b, "t1", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(4, 5, 6));
	pb_pw_const(&b, RP_PW_SUB, t1, prev, 1.0 / 3.0, true);
	int t2 = pb_tensor(&b, "t2", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(4, 5, 6));
	pb_pw_const(&b, RP_PW_MAXIMUM, t2, t1, -1e30, false);
	int t3 = pb_tensor(&b, "t3", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(4, 5, 6));
	pb_pw(&b, RP_PW_MUL, t3, t2, lr, -1);
	int c = pb_tensor(&b, "c", RP_PT_INTERMEDIATE, RP_DTYPE_U8, PB_DIMS(4, 5, 6));
	pb_pw_const(&b, RP_PW_GT, c, t3, 0.0, false);
	int t4 = pb_tensor(&b, "t4", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(4, 5, 6));
	pb_where_const(&b, t4, c, t3, -__builtin_inf(), false);
	int t5 = pb_tensor(&b, "t5", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(4, 5, 6));
	pb_where_const(&b, t5, c, t4, __builtin_nan(""), true);
	int f = pb_tensor(&b, "f", RP_PT_OUTPUT, RP_DTYPE_F16, PB_DIMS(4, 5, 6));
	pb_fill(&b, f, 0.1);
	int io = pb_tensor(&b, "io", RP_PT_OUTPUT, RP_DTYPE_I64, PB_DIMS(4, 5, 6));
	pb_iota(&b, io, 1);
	enum rp_dtype to[] = { RP_DTYPE_F32, RP_DTYPE_F16, RP_DTYPE_BF16, RP_DTYPE_I32, RP_DTYPE_F64, RP_DTYPE_I64,
			       RP_DTYPE_U8 };
	for (size_t i = 0; i < sizeof(to) / sizeof(to[0]); i++) {
		int o = pb_tensor(&b, "cast", RP_PT_OUTPUT, to[i], PB_DIMS(4, 5, 6));
		pb_pw(&b, RP_PW_CAST, o, t5, -1);
	}
	/* From an integer: f64 compute. */
	int back = pb_tensor(&b, "back", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(4, 5, 6));
	pb_pw(&b, RP_PW_CAST, back, io, -1);
	build_and_compile();
}
END_TEST

/* dropout masks: stored (u8, and f32 through a transposed view), computed
 * inline where a fused chain reads them (the vector path), broadcast
 * along a row, in a reduction's prologue over either axis, of rank 0, and
 * past 2^30 elements (64-bit flat indices). */
START_TEST(dropout_masks)
{
	pb_init(&b, "dropout");
	int seed = pb_scalar(&b, "seed");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64, 1024));
	int m = pb_tensor(&b, "m", RP_PT_OUTPUT, RP_DTYPE_U8, PB_DIMS(64, 1024));
	pb_dropout_mask(&b, m, seed, 0.1, 0);
	int mem = pb_tensor(&b, "mem", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(1024, 64));
	int mt = pb_view(&b, "mt", mem, 0, 2, (const int64_t[]){ 64, 1024 }, (const int64_t[]){ 1, 64 });
	pb_dropout_mask(&b, mt, seed, 0.5, 1);
	/* y = x * mask / (1 - p), the mask never stored. */
	int k = pb_tensor(&b, "k", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(64, 1024));
	int t = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(64, 1024));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(64, 1024));
	pb_dropout_mask(&b, k, seed, 0.1, 2);
	pb_pw(&b, RP_PW_MUL, t, x, k, -1);
	pb_pw_const(&b, RP_PW_MUL, y, t, 1 / 0.9, false);
	/* A mask per row, broadcast along it. */
	int kr = pb_tensor(&b, "kr", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(64, 1));
	int yr = pb_tensor(&b, "yr", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(64, 1024));
	pb_dropout_mask(&b, kr, seed, 0.25, 3);
	pb_pw(&b, RP_PW_MUL, yr, x, kr, -1);
	/* Reductions of a masked x, over rows and over columns. */
	int kl = pb_tensor(&b, "kl", RP_PT_INTERMEDIATE, RP_DTYPE_F16, PB_DIMS(64, 1024));
	int xl = pb_tensor(&b, "xl", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(64, 1024));
	int rl = pb_tensor(&b, "rl", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(64));
	int rc = pb_tensor(&b, "rc", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(1024));
	pb_dropout_mask(&b, kl, seed, 0.3, 4);
	pb_pw(&b, RP_PW_MUL, xl, x, kl, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, rl, xl);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LEADING, rc, xl);
	/* Rank 0, in f64 and i64. */
	int m0 = pb_tensor(&b, "m0", RP_PT_OUTPUT, RP_DTYPE_F64, 0, NULL);
	int mi = pb_tensor(&b, "mi", RP_PT_OUTPUT, RP_DTYPE_I64, PB_DIMS(7, 3));
	pb_dropout_mask(&b, m0, seed, 0.5, 5);
	pb_dropout_mask(&b, mi, seed, 0.5, 6);
	build_and_compile();

	/* Past 2^30 elements. */
	pb_init(&b, "dropout_wide");
	seed = pb_scalar(&b, "seed");
	x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(1 << 16, 1 << 15));
	k = pb_tensor(&b, "k", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(1 << 16, 1 << 15));
	y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(1 << 16, 1 << 15));
	pb_dropout_mask(&b, k, seed, 0.1, 0);
	pb_pw(&b, RP_PW_MUL, y, x, k, -1);
	pb_finish(&b);

	struct rd_prog_plan plan;
	struct rp_error err = { 0 };
	ck_assert_int_eq(rd_prog_plan_build(&b.p, &plan, &err), 0);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "typedef long long idx_t;"));
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "(unsigned long long)(base + j)"));
	compile_plan(&plan, "-arch=sm_90");
	rd_prog_plan_finish(&plan);
}
END_TEST

/* Broadcasts of every kind, a transposed input, a strided output view,
 * an offset view, a rank-0 input. */
START_TEST(broadcasts_and_views)
{
	pb_init(&b, "views");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(2, 3, 4, 5));
	int row = pb_tensor(&b, "row", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(5));
	int col = pb_tensor(&b, "col", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(2, 1, 4, 1));
	int one = pb_tensor(&b, "one", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(1));
	int r0 = pb_tensor(&b, "r0", RP_PT_INPUT, RP_DTYPE_F32, 0, NULL);
	int m = pb_tensor(&b, "m", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(5, 4, 3, 2));
	int mt = pb_view(&b, "mt", m, 0, 4, (const int64_t[]){ 2, 3, 4, 5 }, (const int64_t[]){ 1, 2, 6, 24 });
	int big = pb_tensor(&b, "big", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(2, 3, 4, 10));
	int half = pb_view(&b, "half", big, 5, 4, (const int64_t[]){ 2, 3, 4, 5 }, (const int64_t[]){ 120, 40, 10, 1 });
	int t[5];
	for (int i = 0; i < 5; i++)
		t[i] = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(2, 3, 4, 5));
	pb_pw(&b, RP_PW_ADD, t[0], x, row, -1);
	pb_pw(&b, RP_PW_MUL, t[1], t[0], col, -1);
	pb_pw(&b, RP_PW_SUB, t[2], t[1], one, -1);
	pb_pw(&b, RP_PW_DIV, t[3], t[2], r0, -1);
	pb_pw(&b, RP_PW_ADD, t[4], t[3], mt, -1);
	pb_pw(&b, RP_PW_EXP, half, t[4], -1);
	build_and_compile();
}
END_TEST

static const enum rp_reduction reds[] = { RP_RED_SUM,  RP_RED_MEAN, RP_RED_MAX,
					   RP_RED_MIN,  RP_RED_AMAX, RP_RED_LOGSUMEXP };

/* Each reduction over short rows (a warp a row), long rows (a block a
 * row), few leading rows (one pass) and many (two), with a prologue. */
START_TEST(every_reduction)
{
	enum rp_reduction fn = reds[_i];
	int64_t shapes[4][2] = { { 64, 100 }, { 8, 50000 }, { 64, 10 }, { 20000, 300 } };
	pb_init(&b, "reductions");
	/* logsumexp: the last axis only. */
	for (int i = 0; i < (fn == RP_RED_LOGSUMEXP ? 2 : 4); i++) {
		enum rp_reduce_axis axis = i < 2 ? RP_AXIS_LAST : RP_AXIS_LEADING;
		int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, 2, shapes[i]);
		int sq = pb_tensor(&b, "sq", RP_PT_INTERMEDIATE, RP_DTYPE_F32, 2, shapes[i]);
		int out = axis == RP_AXIS_LAST ? pb_tensor(&b, "r", RP_PT_OUTPUT, RP_DTYPE_BF16, 1, &shapes[i][0])
					       : pb_tensor(&b, "c", RP_PT_OUTPUT, RP_DTYPE_F32, 1, &shapes[i][1]);
		pb_pw(&b, RP_PW_MUL, sq, x, x, -1);
		pb_reduce(&b, fn, axis, out, sq);
		/* And without a prologue, in f64 (f64 accumulation). */
		int y = pb_tensor(&b, "y", RP_PT_INPUT, RP_DTYPE_F64, 2, shapes[i]);
		int o2 = axis == RP_AXIS_LAST ? pb_tensor(&b, "r2", RP_PT_OUTPUT, RP_DTYPE_F64, 2,
							  (const int64_t[]){ shapes[i][0], 1 })
					      : pb_tensor(&b, "c2", RP_PT_OUTPUT, RP_DTYPE_F64, 2,
							  (const int64_t[]){ 1, shapes[i][1] });
		pb_reduce(&b, fn, axis, o2, y);
	}
	build_and_compile();
}
END_TEST

/* The prologue's output read later is stored by the reduction kernel. */
START_TEST(softmax_cross_entropy)
{
	pb_init(&b, "xent");
	int x = pb_tensor(&b, "logits", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(512, 50304));
	int tgt = pb_tensor(&b, "target", RP_PT_INPUT, RP_DTYPE_I64, PB_DIMS(512, 1));
	int loss = pb_tensor(&b, "loss", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(512, 1));
	int m = pb_tensor(&b, "m", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 1));
	int d = pb_tensor(&b, "d", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 50304));
	int e = pb_tensor(&b, "e", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 50304));
	int s = pb_tensor(&b, "s", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 1));
	int ls = pb_tensor(&b, "ls", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 1));
	int io = pb_tensor(&b, "io", RP_PT_INTERMEDIATE, RP_DTYPE_I64, PB_DIMS(512, 50304));
	int hit = pb_tensor(&b, "hit", RP_PT_INTERMEDIATE, RP_DTYPE_U8, PB_DIMS(512, 50304));
	int pick = pb_tensor(&b, "pick", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 50304));
	int picked = pb_tensor(&b, "picked", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(512, 1));
	pb_reduce(&b, RP_RED_MAX, RP_AXIS_LAST, m, x);
	pb_pw(&b, RP_PW_SUB, d, x, m, -1);
	pb_pw(&b, RP_PW_EXP, e, d, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, e);
	pb_pw(&b, RP_PW_LOG, ls, s, -1);
	pb_iota(&b, io, 1);
	pb_pw(&b, RP_PW_EQ, hit, io, tgt, -1);
	pb_where_const(&b, pick, hit, d, 0.0, false);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, picked, pick);
	pb_pw(&b, RP_PW_SUB, loss, ls, picked, -1);
	build_and_compile();
}
END_TEST

START_TEST(embeddings)
{
	pb_init(&b, "embed");
	enum rp_dtype idx[2] = { RP_DTYPE_I32, RP_DTYPE_I64 };
	for (int i = 0; i < 2; i++) {
		int table = pb_tensor(&b, "wte", RP_PT_INOUT, RP_DTYPE_BF16, PB_DIMS(1000, 3000));
		int ids = pb_tensor(&b, "ids", RP_PT_INPUT, idx[i], PB_DIMS(4, 64));
		int e = pb_tensor(&b, "e", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(256, 3000));
		int de = pb_tensor(&b, "de", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 3000));
		int dt = pb_tensor(&b, "dwte", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(1000, 3000));
		pb_embedding(&b, e, table, ids);
		pb_embedding_backward(&b, dt, de, ids);
	}
	/* Strided index and rows. */
	int table = pb_tensor(&b, "t2", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(10, 8));
	int ids = pb_tensor(&b, "ids2", RP_PT_INPUT, RP_DTYPE_I64, PB_DIMS(6, 4));
	int idt = pb_view(&b, "idt", ids, 0, 2, (const int64_t[]){ 4, 6 }, (const int64_t[]){ 1, 4 });
	int e = pb_tensor(&b, "e2", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(24, 16));
	int ev = pb_view(&b, "ev", e, 8, 2, (const int64_t[]){ 24, 8 }, (const int64_t[]){ 16, 1 });
	pb_embedding(&b, ev, table, idt);
	/* A backward over 6000 positions: its sort merges in three passes. */
	int ids3 = pb_tensor(&b, "ids3", RP_PT_INPUT, RP_DTYPE_I32, PB_DIMS(3, 2000));
	int de3 = pb_tensor(&b, "de3", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(6000, 64));
	int dt3 = pb_tensor(&b, "dt3", RP_PT_OUTPUT, RP_DTYPE_F64, PB_DIMS(500, 64));
	pb_embedding_backward(&b, dt3, de3, ids3);
	build_and_compile();
}
END_TEST

/* Past 2^30 elements, indices are 64-bit. */
START_TEST(wide_indices)
{
	pb_init(&b, "wide");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(1 << 16, 1 << 15));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(1 << 16, 1 << 15));
	int r = pb_tensor(&b, "r", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(1 << 16));
	pb_pw(&b, RP_PW_SILU, y, x, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, r, x);
	pb_finish(&b);

	struct rd_prog_plan plan;
	struct rp_error err = { 0 };
	ck_assert_int_eq(rd_prog_plan_build(&b.p, &plan, &err), 0);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "typedef long long idx_t;"));
	compile_plan(&plan, "-arch=sm_90");
	/* And for the A100's architecture. */
	compile_plan(&plan, "-arch=sm_80");
	rd_prog_plan_finish(&plan);
}
END_TEST

/* An embedding backward past 2^30 elements of d_out: its sort's and rows'
 * indices are 64-bit too. */
START_TEST(wide_embedding_backward)
{
	pb_init(&b, "wide_embed");
	int ids = pb_tensor(&b, "ids", RP_PT_INPUT, RP_DTYPE_I64, PB_DIMS(1 << 17));
	int de = pb_tensor(&b, "de", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(1 << 17, 1 << 14));
	int dt = pb_tensor(&b, "dwte", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(50304, 1 << 14));
	pb_embedding_backward(&b, dt, de, ids);
	pb_finish(&b);

	struct rd_prog_plan plan;
	struct rp_error err = { 0 };
	ck_assert_int_eq(rd_prog_plan_build(&b.p, &plan, &err), 0);
	ck_assert_int_eq(plan.steps[0].nkernels, 4 + 7);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "typedef long long idx_t;"));
	compile_plan(&plan, "-arch=sm_90");
	rd_prog_plan_finish(&plan);
}
END_TEST

/* Programs as clients define them, through the parser: the composites'
 * lowerings (softmax, rms_norm, cross_entropy, rotary, adamw, sgd, and
 * their backwards) at a model's sizes. */
static const char *const defined[] = {
	"{'tensors':[{'name':'x','kind':'input','dtype':'bf16','shape':[1024,4096]},"
	"{'name':'w','kind':'input','dtype':'bf16','shape':[4096]},"
	"{'name':'dy','kind':'input','dtype':'bf16','shape':[1024,4096]},"
	"{'name':'y','kind':'output','dtype':'bf16','shape':[1024,4096]},"
	"{'name':'rstd','kind':'output','dtype':'f32','shape':[1024,1]},"
	"{'name':'dx','kind':'output','dtype':'bf16','shape':[1024,4096]},"
	"{'name':'dw','kind':'output','dtype':'f32','shape':[4096]}],"
	"'nodes':[{'op':'rms_norm','name':'norm','inputs':['x','w'],'outputs':['y','rstd'],'attrs':{'eps':1e-6}},"
	"{'op':'rms_norm_backward','name':'norm_bwd','inputs':['dy','x','w','rstd'],'outputs':['dx','dw']}]}",

	"{'tensors':[{'name':'x','kind':'input','dtype':'f32','shape':[8,16,128,128]},"
	"{'name':'y','kind':'output','dtype':'f32','shape':[8,16,128,128]},"
	"{'name':'ly','kind':'output','dtype':'bf16','shape':[8,16,128,128]},"
	"{'name':'dy','kind':'input','dtype':'f32','shape':[8,16,128,128]},"
	"{'name':'dx','kind':'output','dtype':'f32','shape':[8,16,128,128]},"
	"{'name':'dlx','kind':'output','dtype':'f32','shape':[8,16,128,128]}],"
	"'nodes':[{'op':'softmax','inputs':['x'],'outputs':['y']},"
	"{'op':'log_softmax','inputs':['x'],'outputs':['ly']},"
	"{'op':'softmax_backward','inputs':['dy','y'],'outputs':['dx']},"
	"{'op':'log_softmax_backward','inputs':['dy','y'],'outputs':['dlx']}]}",

	"{'tensors':[{'name':'logits','kind':'input','dtype':'bf16','shape':[4096,50304]},"
	"{'name':'t','kind':'input','dtype':'i64','shape':[4096]},"
	"{'name':'loss','kind':'output','dtype':'f32','shape':[4096]},"
	"{'name':'lse','kind':'output','dtype':'f32','shape':[4096,1]},"
	"{'name':'dloss','kind':'input','dtype':'f32','shape':[4096]},"
	"{'name':'dlogits','kind':'output','dtype':'bf16','shape':[4096,50304]}],"
	"'nodes':[{'op':'cross_entropy','name':'ce','inputs':['logits','t'],'outputs':['loss','lse'],"
	"'attrs':{'ignore_index':-100}},"
	"{'op':'cross_entropy_backward','name':'ce_bwd','inputs':['dloss','logits','t','lse'],'outputs':['dlogits']}]}",

	"{'tensors':[{'name':'q','kind':'input','dtype':'bf16','shape':[4,1024,16,128]},"
	"{'name':'cos','kind':'input','dtype':'f32','shape':[1024,64]},"
	"{'name':'sin','kind':'input','dtype':'f32','shape':[1024,64]},"
	"{'name':'qr','kind':'output','dtype':'bf16','shape':[4,1024,16,128]},"
	"{'name':'dq','kind':'output','dtype':'bf16','shape':[4,1024,16,128]}],"
	"'nodes':[{'op':'rotary','inputs':['q','cos','sin'],'outputs':['qr']},"
	"{'op':'rotary_backward','inputs':['qr','cos','sin'],'outputs':['dq']}]}",

	"{'tensors':[{'name':'p','kind':'inout','dtype':'f32','shape':[4096,1024]},"
	"{'name':'g','kind':'input','dtype':'bf16','shape':[4096,1024]},"
	"{'name':'m','kind':'inout','dtype':'f32','shape':[4096,1024]},"
	"{'name':'v','kind':'inout','dtype':'f32','shape':[4096,1024]},"
	"{'name':'b','kind':'inout','dtype':'bf16','shape':[1024]},"
	"{'name':'gb','kind':'input','dtype':'bf16','shape':[1024]},"
	"{'name':'mb','kind':'inout','dtype':'f32','shape':[1024]},"
	"{'name':'lr','kind':'scalar'},{'name':'step','kind':'scalar'}],"
	"'nodes':[{'op':'adamw','inputs':['p','g','m','v'],'attrs':{'lr':'lr','step':'step','weight_decay':0.1}},"
	"{'op':'sgd','inputs':['b','gb','mb'],'attrs':{'lr':'lr','momentum':0.9,'nesterov':true}}]}",
};

static cJSON *json(const char *text)
{
	char *s = strdup(text);
	cJSON *j;

	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	j = cJSON_Parse(s);
	free(s);
	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

START_TEST(defined_composites)
{
	cJSON *params = json(defined[_i]);
	struct rp_program p;
	struct rd_prog_plan plan;
	struct rp_error err = { 0 };

	int r = rp_program_parse(params, &p, &err);
	ck_assert_msg(r == 0, "the test's program is refused: %s",
		      err.params ? cJSON_PrintUnformatted(err.params) : "?");
	ck_assert_int_eq(rd_prog_plan_build(&p, &plan, &err), 0);
	compile_plan(&plan, "-arch=sm_90");
	rd_prog_plan_finish(&plan);
	rp_program_finish(&p);
	cJSON_Delete(params);
}
END_TEST

/* The programs whose kernels the emulated and GPU tests run
 * (tests/lib/program_check.h), as the CUDA backend would compile them. */
START_TEST(checked_programs)
{
	struct tl_prog t;
	char why[256];

	ck_assert_msg(tl_prog_open(&t, &tl_prog_cases[_i], 1, why, sizeof(why)) == 0, "%s: %s", tl_prog_cases[_i].name,
		      why);
	compile_plan(&t.plan, "-arch=sm_90");
	tl_prog_close(&t);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("program_codegen");
	TCase *tc = tcase_create("nvrtc");

	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, every_pointwise_op, 0, (int)(sizeof(dtypes) / sizeof(dtypes[0])));
	tcase_add_test(tc, constants_scalars_casts);
	tcase_add_test(tc, broadcasts_and_views);
	tcase_add_test(tc, dropout_masks);
	tcase_add_loop_test(tc, every_reduction, 0, (int)(sizeof(reds) / sizeof(reds[0])));
	tcase_add_test(tc, softmax_cross_entropy);
	tcase_add_test(tc, embeddings);
	tcase_add_test(tc, wide_indices);
	tcase_add_test(tc, wide_embedding_backward);
	tcase_add_loop_test(tc, defined_composites, 0, (int)(sizeof(defined) / sizeof(defined[0])));
	tcase_add_loop_test(tc, checked_programs, 0, (int)tl_prog_ncases);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	void *h = open_nvrtc();
	int major = 0, minor = 0;

	if (!h) {
		printf("skipped: no NVRTC (libnvrtc.so) to compile the generated kernels with\n");
		return 77;
	}
#define SYM(field, name) *(void **)&nvrtc.field = dlsym(h, name)
	SYM(create, "nvrtcCreateProgram");
	SYM(compile, "nvrtcCompileProgram");
	SYM(log_size, "nvrtcGetProgramLogSize");
	SYM(log, "nvrtcGetProgramLog");
	SYM(cubin_size, "nvrtcGetCUBINSize");
	SYM(cubin, "nvrtcGetCUBIN");
	SYM(destroy, "nvrtcDestroyProgram");
	SYM(version, "nvrtcVersion");
#undef SYM
	if (!nvrtc.create || !nvrtc.compile || !nvrtc.cubin || !nvrtc.version) {
		printf("skipped: libnvrtc lacks the entry points this test uses\n");
		return 77;
	}
	if (!find_include()) {
		printf("skipped: no cuda_bf16.h beside NVRTC (set REGEN_TEST_CUDA_INCLUDE)\n");
		return 77;
	}
	nvrtc.version(&major, &minor);
	printf("NVRTC %d.%d, %s\n", major, minor, include_opt);
	return unit_run(suite());
}
