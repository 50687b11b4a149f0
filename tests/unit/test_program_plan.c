/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's plan of a program (daemon/program/plan.h), no GPU
 * needed: which nodes one kernel takes, what stays in registers, where
 * each materialized intermediate lives in the arena and when two share
 * bytes, and what the generated source says of itself. Whether the source
 * compiles is test_program_codegen's. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/program/plan.h"
#include "tests/unit/prog_builder.h"
#include "tests/unit/unit.h"

static struct pb b;
static struct rd_prog_plan plan;

static void build(void)
{
	struct rp_error err = { 0 };

	pb_finish(&b);
	int r = rd_prog_plan_build(&b.p, &plan, &err);
	ck_assert_msg(r == 0, "plan: %d %s", r, err.name ? err.name : "");
	rp_error_clear(&err);
}

static void teardown(void)
{
	rd_prog_plan_finish(&plan);
}

static void assert_step(int s, enum rd_prog_step_kind kind, int first, int count)
{
	ck_assert_int_lt(s, plan.nsteps);
	ck_assert_msg(plan.steps[s].kind == kind, "step %d is %s, not %s", s, rd_prog_step_kind_name(plan.steps[s].kind),
		      rd_prog_step_kind_name(kind));
	ck_assert_int_eq(plan.steps[s].first_node, first);
	ck_assert_int_eq(plan.steps[s].nodes[0], first);
	ck_assert_int_eq(plan.steps[s].nnodes, count);
	for (int k = 1; k < count; k++)
		ck_assert_int_gt(plan.steps[s].nodes[k], plan.steps[s].nodes[k - 1]);
}

/* y = gelu((x + bias) * 2) * x - 1: five nodes over one shape, the bias
 * broadcast; one kernel, the four intermediates in registers, no arena. */
START_TEST(chain_of_five_is_one_kernel)
{
	pb_init(&b, "chain");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64, 1024));
	int bias = pb_tensor(&b, "bias", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(1024));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(64, 1024));
	int t[4];
	for (int i = 0; i < 4; i++)
		t[i] = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(64, 1024));
	pb_pw(&b, RP_PW_ADD, t[0], x, bias, -1);
	pb_pw_const(&b, RP_PW_MUL, t[1], t[0], 2.0, false);
	pb_pw(&b, RP_PW_GELU, t[2], t[1], -1);
	pb_pw(&b, RP_PW_MUL, t[3], t[2], x, -1);
	pb_pw_const(&b, RP_PW_SUB, y, t[3], 1.0, false);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_FUSED, 0, 5);
	for (int i = 0; i < 4; i++) {
		ck_assert(!plan.node_stored[i]);
		ck_assert(plan.arena_offset[t[i]] == RD_PROG_NOT_IN_ARENA);
	}
	ck_assert(plan.node_stored[4]);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	ck_assert_int_eq(plan.steps[0].nkernels, 1);
	ck_assert_str_eq(plan.steps[0].kernels[0].name, "k0_fused_add_mul_gelu_mul_sub");
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "k0_fused_add_mul_gelu_mul_sub("));
	/* x and y are contiguous bf16: 8 elements a thread on the vector path. */
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "rg_vec<__nv_bfloat16, 8>"));
	ck_assert_uint_eq(plan.steps[0].kernels[0].blocks, (64 * 1024 + 8 * 256 - 1) / (8 * 256));
	ck_assert_uint_eq(plan.fused_kernels, 1);
}
END_TEST

/* A node of another shape starts another kernel. */
START_TEST(shape_change_splits)
{
	pb_init(&b, "shapes");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	int r = pb_tensor(&b, "r", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(8, 1));
	int t0 = pb_tensor(&b, "t0", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(8, 1));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	pb_pw(&b, RP_PW_RSQRT, t0, r, -1);
	pb_pw(&b, RP_PW_MUL, y, x, t0, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_FUSED, 0, 1);
	assert_step(1, RD_STEP_FUSED, 1, 1);
	ck_assert(plan.node_stored[0]);
	ck_assert(plan.arena_offset[t0] == 0);
	ck_assert_uint_eq(plan.arena_bytes, 256);
}
END_TEST

/* s = sum(x * x, last): the square is the reduction's prologue, never
 * stored; mean of the same square read again later is stored. */
START_TEST(reduction_takes_its_prologue)
{
	pb_init(&b, "rms");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(32, 4096));
	int sq = pb_tensor(&b, "sq", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(32, 4096));
	int s = pb_tensor(&b, "s", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(32));
	pb_pw(&b, RP_PW_MUL, sq, x, x, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, sq);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_REDUCTION, 0, 2);
	ck_assert(!plan.node_stored[0]);
	ck_assert(plan.arena_offset[sq] == RD_PROG_NOT_IN_ARENA);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	/* 4096 a row: a block per row. */
	ck_assert_int_eq(plan.steps[0].nkernels, 1);
	ck_assert_uint_eq(plan.steps[0].kernels[0].blocks, 32);
	ck_assert_str_eq(plan.steps[0].kernels[0].name, "k0_reduce_mul_sum_last");
}
END_TEST

/* Softmax in three passes as a model may write it: the subtraction and
 * the exp consume the max, so they are its epilogue; the sum's kernel
 * takes the division as its own. exp's output, which the second kernel
 * reads twice, is stored; the max and the sum never leave registers. */
START_TEST(prologue_read_later_is_stored)
{
	pb_init(&b, "softmax");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(16, 100));
	int m = pb_tensor(&b, "m", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16, 1));
	int d = pb_tensor(&b, "d", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16, 100));
	int e = pb_tensor(&b, "e", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16, 100));
	int s = pb_tensor(&b, "s", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16, 1));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(16, 100));
	pb_reduce(&b, RP_RED_MAX, RP_AXIS_LAST, m, x);
	pb_pw(&b, RP_PW_SUB, d, x, m, -1);
	pb_pw(&b, RP_PW_EXP, e, d, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, e);
	pb_pw(&b, RP_PW_DIV, y, e, s, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_REDUCTION, 0, 3);
	assert_step(1, RD_STEP_REDUCTION, 3, 2);
	ck_assert(!plan.node_stored[0]);     /* m: its epilogue alone reads it */
	ck_assert(!plan.node_stored[1]);     /* d: only exp reads it */
	ck_assert(plan.node_stored[2]);      /* e: the next kernel reads it */
	ck_assert(!plan.node_stored[3]);     /* s: the division, in its kernel */
	ck_assert(plan.node_stored[4]);
	ck_assert(plan.arena_offset[d] == RD_PROG_NOT_IN_ARENA);
	ck_assert(plan.arena_offset[m] == RD_PROG_NOT_IN_ARENA);
	ck_assert(plan.arena_offset[s] == RD_PROG_NOT_IN_ARENA);
	ck_assert(plan.arena_offset[e] == 0);
	ck_assert_uint_eq(plan.arena_bytes, 16 * 100 * 4);
	/* Rows of 100: a warp each, 8 rows a block. */
	ck_assert_uint_eq(plan.steps[1].kernels[0].blocks, 2);
	ck_assert_str_eq(plan.steps[0].kernels[0].name, "k0_reduce_max_sub_exp_last");
	ck_assert_str_eq(plan.steps[1].kernels[0].name, "k1_reduce_sum_div_last");
}
END_TEST

/* A reduction of another shape than the group before it runs alone. */
START_TEST(reduction_of_other_shape_runs_alone)
{
	pb_init(&b, "alone");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(16, 100));
	int z = pb_tensor(&b, "z", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(4, 4));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(16, 100));
	int s = pb_tensor(&b, "s", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4));
	pb_pw(&b, RP_PW_EXP, y, x, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, z);
	build();

	/* Independent of the exp, the reduction may run first, and does: a
	 * new group goes right after the last one it depends on. */
	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_REDUCTION, 1, 1);
	assert_step(1, RD_STEP_FUSED, 0, 1);
}
END_TEST

/* y = exp(x) * rsqrt(v): the [N, 1] rsqrt between the chain's nodes runs
 * ahead of it, and the chain stays one kernel with exp(x) in registers. */
START_TEST(small_nodes_run_ahead)
{
	pb_init(&b, "ahead");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	int v = pb_tensor(&b, "v", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(8, 1));
	int t = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(8, 16));
	int r = pb_tensor(&b, "r", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(8, 1));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	pb_pw(&b, RP_PW_EXP, t, x, -1);
	pb_pw(&b, RP_PW_RSQRT, r, v, -1);
	pb_pw(&b, RP_PW_MUL, y, t, r, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_FUSED, 1, 1);
	assert_step(1, RD_STEP_FUSED, 0, 2);
	ck_assert_int_eq(plan.steps[1].nodes[1], 2);
	ck_assert(!plan.node_stored[0]);
	ck_assert(plan.node_stored[1]);
	ck_assert(plan.arena_offset[t] == RD_PROG_NOT_IN_ARENA);
	ck_assert(plan.arena_offset[r] != RD_PROG_NOT_IN_ARENA);
}
END_TEST

/* A node that depends on a later group waits for it: here the division
 * reads what a leading reduction (which takes no epilogue) wrote. */
START_TEST(dependencies_keep_their_order)
{
	pb_init(&b, "deps");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	int t = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(8, 16));
	int s = pb_tensor(&b, "s", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	pb_pw(&b, RP_PW_EXP, t, x, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LEADING, s, t);
	pb_pw(&b, RP_PW_DIV, y, t, s, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_REDUCTION, 0, 2);
	assert_step(1, RD_STEP_FUSED, 2, 1);
	ck_assert(plan.node_stored[0]);   /* the division reads exp(x) again */
	ck_assert(plan.node_stored[1]);
}
END_TEST

/* The same over rows: the division consumes the sum, so it is the
 * reduction's epilogue, reading exp(x) from registers on the kernel's
 * second pass over the row: one kernel, nothing stored but y. */
START_TEST(row_reduction_takes_its_epilogue)
{
	pb_init(&b, "epilogue");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	int t = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(8, 16));
	int s = pb_tensor(&b, "s", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(8, 1));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8, 16));
	pb_pw(&b, RP_PW_EXP, t, x, -1);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, t);
	pb_pw(&b, RP_PW_DIV, y, t, s, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_REDUCTION, 0, 3);
	ck_assert(!plan.node_stored[0]);
	ck_assert(!plan.node_stored[1]);
	ck_assert(plan.node_stored[2]);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	ck_assert_str_eq(plan.steps[0].kernels[0].name, "k0_reduce_exp_sum_div_last");
}
END_TEST

/* One-hot picking as cross_entropy lowers it: the iota is computed where
 * the comparison reads it, never stored; the pick is the reduction's
 * prologue: one kernel, no arena. */
START_TEST(iota_is_computed_inline)
{
	pb_init(&b, "pick");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	int tgt = pb_tensor(&b, "target", RP_PT_INPUT, RP_DTYPE_I64, PB_DIMS(64, 1));
	int io = pb_tensor(&b, "io", RP_PT_INTERMEDIATE, RP_DTYPE_I64, PB_DIMS(1000));
	int hit = pb_tensor(&b, "hit", RP_PT_INTERMEDIATE, RP_DTYPE_U8, PB_DIMS(64, 1000));
	int pick = pb_tensor(&b, "pick", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(64, 1000));
	int s = pb_tensor(&b, "s", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(64));
	pb_iota(&b, io, 0);
	pb_pw(&b, RP_PW_EQ, hit, io, tgt, -1);
	pb_where_const(&b, pick, hit, x, 0.0, false);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, pick);
	build();

	ck_assert_int_eq(plan.computed_inline[io], 0);
	ck_assert_int_eq(plan.computed_inline[hit], -1);
	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_REDUCTION, 1, 3);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	ck_assert(!plan.node_stored[0]);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "rg_cvt<long long>(double(c1))"));
}
END_TEST

/* Dropout as a model writes it, y = x * mask / (1 - p) forward and dx =
 * dy * mask / (1 - p) backward from the same seed and stream: each mask
 * is drawn where it is read, so neither takes memory nor a kernel; the
 * seed is the Run's scalar. */
START_TEST(dropout_mask_is_computed_inline)
{
	pb_init(&b, "dropout");
	int seed = pb_scalar(&b, "seed");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	int dy = pb_tensor(&b, "dy", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	int k = pb_tensor(&b, "k", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	int k2 = pb_tensor(&b, "k2", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	int t = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(64, 1000));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	int s = pb_tensor(&b, "s", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(64));
	int dx = pb_tensor(&b, "dx", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(64, 1000));
	pb_dropout_mask(&b, k, seed, 0.1, 7);
	pb_pw(&b, RP_PW_MUL, t, x, k, -1);
	pb_pw_const(&b, RP_PW_MUL, y, t, 1 / 0.9, false);
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LAST, s, t);
	pb_dropout_mask(&b, k2, seed, 0.1, 7);
	pb_pw(&b, RP_PW_MUL, dx, dy, k2, -1);
	build();

	ck_assert_int_eq(plan.computed_inline[k], 0);
	ck_assert_int_eq(plan.computed_inline[k2], 4);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	for (int st = 0; st < plan.nsteps; st++) {
		for (int i = 0; i < plan.steps[st].nnodes; i++)
			ck_assert(plan.steps[st].nodes[i] != 0 && plan.steps[st].nodes[i] != 4);
		/* The mask's flat index is the domain's: no coordinates. */
		ck_assert_msg(strstr(plan.steps[st].source, "rg_dropout_keep(a->scalar[0], 7u, (unsigned long long)(idx), "
						      "1677722u)"),
			      "step %d draws no mask:\n%s", st, plan.steps[st].source);
	}
}
END_TEST

/* An optimizer's in-place update: w = w - lr * g, m = 0.9 m + g, all one
 * kernel over the parameter's shape, each inout written once. */
START_TEST(in_place_update_is_one_kernel)
{
	pb_init(&b, "sgd");
	int w = pb_tensor(&b, "w", RP_PT_INOUT, RP_DTYPE_F32, PB_DIMS(1000));
	int m = pb_tensor(&b, "m", RP_PT_INOUT, RP_DTYPE_F32, PB_DIMS(1000));
	int g = pb_tensor(&b, "g", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(1000));
	int lr = pb_scalar(&b, "lr");
	int t0 = pb_tensor(&b, "t0", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(1000));
	int t1 = pb_tensor(&b, "t1", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(1000));
	pb_pw_const(&b, RP_PW_MUL, t0, m, 0.9, false);
	pb_pw(&b, RP_PW_ADD, m, t0, g, -1);           /* m written in place */
	pb_pw(&b, RP_PW_MUL, t1, m, lr, -1);          /* reads the new m from a register */
	pb_pw(&b, RP_PW_SUB, w, w, t1, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_FUSED, 0, 4);
	ck_assert(plan.node_stored[1]);
	ck_assert(plan.node_stored[3]);
	ck_assert(!plan.node_stored[0]);
	ck_assert(!plan.node_stored[2]);
	const char *src = plan.steps[0].source;
	/* The new m is v1; mul reads it, not memory. */
	ck_assert_ptr_nonnull(strstr(src, "rg_f32(v1) * float(a->scalar[3])"));
	ck_assert_uint_eq(plan.arena_bytes, 0);
	ck_assert(b.p.updates_in_place);
}
END_TEST

/* Writing x after a node read it broadcast (another element) must wait
 * for a new kernel; so must reading a written tensor through another
 * view. */
START_TEST(conflicting_views_split)
{
	pb_init(&b, "views");
	int x = pb_tensor(&b, "x", RP_PT_INOUT, RP_DTYPE_F32, PB_DIMS(4, 8));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4, 8));
	int z = pb_tensor(&b, "z", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8, 4));
	int row0 = pb_view(&b, "row0", x, 0, 2, (const int64_t[]){ 1, 8 }, (const int64_t[]){ 8, 1 });
	int xt = pb_view(&b, "xt", x, 0, 2, (const int64_t[]){ 8, 4 }, (const int64_t[]){ 1, 8 });
	pb_pw(&b, RP_PW_ADD, y, x, row0, -1);      /* reads row 0 of x everywhere */
	pb_pw_const(&b, RP_PW_MUL, x, x, 2.0, false);    /* writes all of x: another step */
	pb_pw_const(&b, RP_PW_MUL, z, xt, 3.0, false);   /* reads x transposed: another step */
	build();

	ck_assert_int_eq(plan.nsteps, 3);
	assert_step(0, RD_STEP_FUSED, 0, 1);
	assert_step(1, RD_STEP_FUSED, 1, 1);
	assert_step(2, RD_STEP_FUSED, 2, 1);
}
END_TEST

/* Two halves of one output written by two nodes: disjoint, one kernel. */
START_TEST(disjoint_views_share_a_kernel)
{
	pb_init(&b, "halves");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(4, 8));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4, 16));
	int left = pb_view(&b, "left", y, 0, 2, (const int64_t[]){ 4, 8 }, (const int64_t[]){ 16, 1 });
	int right = pb_view(&b, "right", y, 8, 2, (const int64_t[]){ 4, 8 }, (const int64_t[]){ 16, 1 });
	pb_pw(&b, RP_PW_EXP, left, x, -1);
	pb_pw(&b, RP_PW_NEG, right, x, -1);
	build();

	/* Rows of y interleave (left spans elements 0-55, right 8-63), but
	 * modulo the row stride 16 left is 0-7 and right 8-15. */
	ck_assert_int_eq(plan.nsteps, 1);
	ck_assert(plan.node_stored[0] && plan.node_stored[1]);

	/* Columns 4-11 and 0-7 of each row do meet: two kernels. */
	rd_prog_plan_finish(&plan);
	pb_init(&b, "overlapping");
	x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(4, 8));
	y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4, 16));
	left = pb_view(&b, "left", y, 0, 2, (const int64_t[]){ 4, 8 }, (const int64_t[]){ 16, 1 });
	right = pb_view(&b, "middle", y, 4, 2, (const int64_t[]){ 4, 8 }, (const int64_t[]){ 16, 1 });
	pb_pw(&b, RP_PW_EXP, left, x, -1);
	pb_pw(&b, RP_PW_NEG, right, x, -1);
	build();
	ck_assert_int_eq(plan.nsteps, 2);

	rd_prog_plan_finish(&plan);
	pb_init(&b, "stacked");
	x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(4, 8));
	y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8, 8));
	int top = pb_view(&b, "top", y, 0, 2, (const int64_t[]){ 4, 8 }, (const int64_t[]){ 8, 1 });
	int bottom = pb_view(&b, "bottom", y, 32, 2, (const int64_t[]){ 4, 8 }, (const int64_t[]){ 8, 1 });
	pb_pw(&b, RP_PW_EXP, top, x, -1);
	pb_pw(&b, RP_PW_NEG, bottom, x, -1);
	build();
	ck_assert_int_eq(plan.nsteps, 1);
	ck_assert(plan.node_stored[0] && plan.node_stored[1]);
}
END_TEST

/* h = x W (library), g = gelu(h) (fused), o = g W2 (library), y = o + x:
 * h and g go through memory, and h (dead after step 1) and o (born at
 * step 2) share the arena's bytes. */
START_TEST(library_steps_and_arena_sharing)
{
	pb_init(&b, "mlp");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int w1 = pb_tensor(&b, "w1", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 256));
	int w2 = pb_tensor(&b, "w2", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 256));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int h = pb_tensor(&b, "h", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int g = pb_tensor(&b, "g", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int o = pb_tensor(&b, "o", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 256));
	pb_gemm(&b, h, x, w1);
	pb_pw(&b, RP_PW_GELU, g, h, -1);
	pb_gemm(&b, o, g, w2);
	pb_pw(&b, RP_PW_ADD, y, o, x, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 4);
	assert_step(0, RD_STEP_LIBRARY, 0, 1);
	assert_step(1, RD_STEP_FUSED, 1, 1);
	assert_step(2, RD_STEP_LIBRARY, 2, 1);
	assert_step(3, RD_STEP_FUSED, 3, 1);
	ck_assert_ptr_null(plan.steps[0].source);
	ck_assert_int_eq(plan.steps[0].nkernels, 0);
	uint64_t bytes = 128 * 256 * 2;
	/* h over steps 0-1, g over 1-2, o over 2-3. */
	ck_assert(plan.arena_offset[h] != plan.arena_offset[g]);
	ck_assert(plan.arena_offset[g] != plan.arena_offset[o]);
	ck_assert_uint_eq(plan.arena_offset[h], plan.arena_offset[o]);
	ck_assert_uint_eq(plan.arena_bytes, 2 * bytes);
	ck_assert_uint_eq(plan.fused_kernels, 2);

	/* Addresses for the executor: bound roots at their binding, the
	 * arena's at their offsets. */
	char *bound[4] = { (char *)0x100000, (char *)0x200000, (char *)0x300000, (char *)0x400000 };
	char *arena = (char *)0x900000;
	ck_assert_ptr_eq(rd_prog_tensor_address(&plan, &b.p, x, (void *const *)bound, arena), bound[0]);
	ck_assert_ptr_eq(rd_prog_tensor_address(&plan, &b.p, y, (void *const *)bound, arena), bound[3]);
	ck_assert_ptr_eq(rd_prog_tensor_address(&plan, &b.p, g, (void *const *)bound, arena),
			 arena + plan.arena_offset[g]);
}
END_TEST

/* Lifetimes that overlap never share bytes; every offset is aligned; and
 * the arena is smaller than every intermediate side by side. A chain of
 * 40 GEMMs (each its own step), each writing an intermediate of a random
 * size and reading two random earlier ones. */
/* SwiGLU, w2(silu(x w1) * x w3): the second GEMM, which does not read
 * silu's output, runs before it, so the product joins silu's kernel and
 * silu's output never leaves registers. */
START_TEST(pointwise_waits_past_an_independent_library_call)
{
	pb_init(&b, "swiglu");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int w1 = pb_tensor(&b, "w1", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 512));
	int w3 = pb_tensor(&b, "w3", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 512));
	int w2 = pb_tensor(&b, "w2", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(512, 256));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int h1 = pb_tensor(&b, "h1", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int s = pb_tensor(&b, "s", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int h3 = pb_tensor(&b, "h3", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int m = pb_tensor(&b, "m", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	pb_gemm(&b, h1, x, w1);
	pb_pw(&b, RP_PW_SILU, s, h1, -1);
	pb_gemm(&b, h3, x, w3);
	pb_pw(&b, RP_PW_MUL, m, s, h3, -1);
	pb_gemm(&b, y, m, w2);
	build();

	ck_assert_int_eq(plan.nsteps, 4);
	assert_step(0, RD_STEP_LIBRARY, 0, 1);
	assert_step(1, RD_STEP_LIBRARY, 2, 1);
	assert_step(2, RD_STEP_FUSED, 1, 2);
	assert_step(3, RD_STEP_LIBRARY, 4, 1);
	ck_assert(!plan.node_stored[1]);
	ck_assert(plan.arena_offset[s] == RD_PROG_NOT_IN_ARENA);
	ck_assert_uint_eq(plan.fused_kernels, 1);
}
END_TEST

/* Its backward: silu's backward, which no GEMM between reads, joins the
 * gradient's two products ahead of the GEMMs that read one of them; the
 * other product stays in registers. A GEMM that reads a group's output
 * still runs after it, and the library calls keep their order. */
START_TEST(pointwise_runs_ahead_of_independent_library_calls)
{
	pb_init(&b, "swiglu_bwd");
	int dy = pb_tensor(&b, "dy", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int xt = pb_tensor(&b, "xt", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 128));
	int w2t = pb_tensor(&b, "w2t", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(256, 512));
	int w3t = pb_tensor(&b, "w3t", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(512, 256));
	int h1 = pb_tensor(&b, "h1", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int h3 = pb_tensor(&b, "h3", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int s = pb_tensor(&b, "s", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int dm = pb_tensor(&b, "dm", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int ds = pb_tensor(&b, "ds", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int dh3 = pb_tensor(&b, "dh3", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(128, 512));
	int dw3 = pb_tensor(&b, "dw3", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(256, 512));
	int dx3 = pb_tensor(&b, "dx3", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(128, 256));
	int dh1 = pb_tensor(&b, "dh1", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(128, 512));
	pb_gemm(&b, dm, dy, w2t);
	pb_pw(&b, RP_PW_MUL, ds, dm, h3, -1);
	pb_pw(&b, RP_PW_MUL, dh3, dm, s, -1);
	pb_gemm(&b, dw3, xt, dh3);
	pb_gemm(&b, dx3, dh3, w3t);
	pb_pw(&b, RP_PW_SILU_BACKWARD, dh1, ds, h1, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 4);
	assert_step(0, RD_STEP_LIBRARY, 0, 1);
	assert_step(1, RD_STEP_FUSED, 1, 3);
	ck_assert_int_eq(plan.steps[1].nodes[2], 5);
	assert_step(2, RD_STEP_LIBRARY, 3, 1);
	assert_step(3, RD_STEP_LIBRARY, 4, 1);
	ck_assert(!plan.node_stored[1]);
	ck_assert(plan.node_stored[2]);
	ck_assert(plan.arena_offset[ds] == RD_PROG_NOT_IN_ARENA);
}
END_TEST

/* rotate_half(x) * s + x * c over x's halves (rotary embeddings as a model
 * writes them): the cat of neg(x2) and x1 is recomputed where the product
 * reads it, from x itself (neg's output too: only the cat's writer reads
 * it). One kernel; the cat's writers in no step; nothing in the arena. */
START_TEST(cat_is_recomputed_where_it_is_read)
{
	pb_init(&b, "rope");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(16, 64));
	int x1 = pb_view(&b, "x1", x, 0, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int x2 = pb_view(&b, "x2", x, 32, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int c = pb_tensor(&b, "c", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64));
	int sn = pb_tensor(&b, "s", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(64));
	int n = pb_tensor(&b, "n", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(16, 32));
	int rot = pb_tensor(&b, "rot", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(16, 64));
	int ra = pb_view(&b, "ra", rot, 0, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int rb = pb_view(&b, "rb", rot, 32, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int t1 = pb_tensor(&b, "t1", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(16, 64));
	int t2 = pb_tensor(&b, "t2", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(16, 64));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(16, 64));
	pb_pw(&b, RP_PW_MUL, t1, x, c, -1);
	pb_pw(&b, RP_PW_NEG, n, x2, -1);
	pb_pw(&b, RP_PW_CAST, ra, n, -1);
	pb_pw(&b, RP_PW_CAST, rb, x1, -1);
	pb_pw(&b, RP_PW_MUL, t2, rot, sn, -1);
	pb_pw(&b, RP_PW_ADD, y, t1, t2, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_FUSED, 0, 3);
	ck_assert_int_eq(plan.steps[0].nodes[1], 4);
	ck_assert(plan.recomputed[rot] && plan.recomputed[ra] && plan.recomputed[n]);
	ck_assert(!plan.recomputed[x] && !plan.recomputed[t1]);
	/* The cat is read from x's halves, at other elements than the product's. */
	ck_assert_int_eq(plan.nsources[rot], 2);
	ck_assert(plan.arena_offset[rot] == RD_PROG_NOT_IN_ARENA);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "rot, recomputed"));
}
END_TEST

/* The same cat where something writes x between the cat and its reader:
 * computed at the reader, the cat would see the new x; it is materialized
 * by its own kernel instead. */
START_TEST(cat_of_what_changes_before_it_is_read_is_stored)
{
	pb_init(&b, "rope_inplace");
	int x = pb_tensor(&b, "x", RP_PT_INOUT, RP_DTYPE_F32, PB_DIMS(16, 64));
	int x1 = pb_view(&b, "x1", x, 0, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int x2 = pb_view(&b, "x2", x, 32, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int rot = pb_tensor(&b, "rot", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16, 64));
	int ra = pb_view(&b, "ra", rot, 0, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int rb = pb_view(&b, "rb", rot, 32, PB_DIMS(16, 32), (const int64_t[]){ 64, 1 });
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(16, 64));
	pb_pw(&b, RP_PW_NEG, ra, x2, -1);
	pb_pw(&b, RP_PW_CAST, rb, x1, -1);
	pb_pw_const(&b, RP_PW_MUL, x, x, 3.0, false);
	pb_pw(&b, RP_PW_ADD, y, rot, x, -1);
	build();

	ck_assert(!plan.recomputed[rot]);
	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_FUSED, 0, 2);
	assert_step(1, RD_STEP_FUSED, 2, 2);
	ck_assert(plan.arena_offset[rot] != RD_PROG_NOT_IN_ARENA);
}
END_TEST

/* Rotary embeddings as torch 2.11 gives them: the projection read in
 * [B,S,H,D] order, neg(x2) written to a flat storage in that same order
 * (a pointwise output keeps its input's strides), then cast into the
 * cat's half. The neg's storage is recomputed in its writer's frame (its
 * own view's dims), the cat in its own: one kernel, nothing in the arena. */
START_TEST(storage_written_in_a_permuted_order_is_recomputed)
{
	const int64_t bhsd[] = { 5120, 32, 128, 1 }, half[] = { 2560, 16, 64, 1 }, cat[] = { 5120, 1280, 32, 1 };
	const int64_t half_dims[] = { 2, 4, 40, 16 };

	pb_init(&b, "rope_torch");
	int qh = pb_tensor(&b, "qh", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(80, 128));
	int q = pb_view(&b, "q", qh, 0, PB_DIMS(2, 4, 40, 32), bhsd);
	int x1 = pb_view(&b, "x1", qh, 0, PB_DIMS(2, 4, 40, 16), bhsd);
	int x2 = pb_view(&b, "x2", qh, 16, PB_DIMS(2, 4, 40, 16), bhsd);
	int c = pb_tensor(&b, "c", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(40, 32));
	int sn = pb_tensor(&b, "s", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(40, 32));
	int s54 = pb_tensor(&b, "s54", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(10240));
	int t1 = pb_view(&b, "t1", s54, 0, PB_DIMS(2, 4, 40, 32), bhsd);
	int s58 = pb_tensor(&b, "s58", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(5120));
	int n = pb_view(&b, "n", s58, 0, PB_DIMS(2, 4, 40, 16), half);
	int rot = pb_tensor(&b, "rot", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(2, 4, 40, 32));
	int ra = pb_view(&b, "ra", rot, 0, PB_DIMS(2, 4, 40, 16), cat);
	int rb = pb_view(&b, "rb", rot, 16, PB_DIMS(2, 4, 40, 16), cat);
	int t2 = pb_tensor(&b, "t2", RP_PT_INTERMEDIATE, RP_DTYPE_BF16, PB_DIMS(2, 4, 40, 32));
	int s65 = pb_tensor(&b, "s65", RP_PT_OUTPUT, RP_DTYPE_BF16, PB_DIMS(10240));
	int y = pb_view(&b, "y", s65, 0, PB_DIMS(2, 4, 40, 32), bhsd);
	pb_pw(&b, RP_PW_MUL, t1, q, c, -1);
	pb_pw(&b, RP_PW_NEG, n, x2, -1);
	pb_pw(&b, RP_PW_CAST, ra, n, -1);
	pb_pw(&b, RP_PW_CAST, rb, x1, -1);
	pb_pw(&b, RP_PW_MUL, t2, rot, sn, -1);
	pb_pw(&b, RP_PW_ADD, y, t1, t2, -1);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	assert_step(0, RD_STEP_FUSED, 0, 3);
	ck_assert(plan.recomputed[s58] && plan.recomputed[n] && plan.recomputed[rot]);
	ck_assert(!plan.recomputed[s54] && !plan.recomputed[qh]);
	/* s58's frame: [B,H,S,D/2] stepped as neg wrote it. */
	const struct rd_prog_frame *f = &plan.frame[s58];
	ck_assert_int_eq(f->rank, 4);
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(f->shape[k], half_dims[k]);
		ck_assert_int_eq(f->strides[k], half[k]);
	}
	/* The cat is read from x's halves through the neg: x2 and x1. */
	ck_assert_int_eq(plan.nsources[rot], 2);
	ck_assert_uint_eq(plan.arena_bytes, 0);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "s58, recomputed"));
}
END_TEST

/* A cat read through a broadcast (one column of it stretched over a row
 * of 64): recomputed, its writers would run 64 times for each element. It
 * is stored, by its own kernel. */
START_TEST(broadcast_read_is_stored)
{
	pb_init(&b, "cat_broadcast");
	int a = pb_tensor(&b, "a", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(16, 1));
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(16, 64));
	int c = pb_tensor(&b, "c", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(16, 2));
	int c0 = pb_view(&b, "c0", c, 0, PB_DIMS(16, 1), (const int64_t[]){ 2, 1 });
	int c1 = pb_view(&b, "c1", c, 1, PB_DIMS(16, 1), (const int64_t[]){ 2, 1 });
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(16, 64));
	pb_pw(&b, RP_PW_EXP, c0, a, -1);
	pb_pw(&b, RP_PW_NEG, c1, a, -1);
	pb_pw(&b, RP_PW_MUL, y, x, c1, -1);
	build();

	ck_assert(!plan.recomputed[c]);
	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_FUSED, 0, 2);
	assert_step(1, RD_STEP_FUSED, 2, 1);
}
END_TEST

START_TEST(arena_never_overlaps_live_roots)
{
	enum { K = 40 };
	unsigned seed = (unsigned)time(NULL);
	int t[K], first[K], last[K];
	uint64_t bytes[K];

	printf("arena_never_overlaps_live_roots: seed %u\n", seed);
	srand(seed);
	pb_init(&b, "arena");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(16, 16));
	for (int i = 0; i < K; i++) {
		int64_t rows = 1 + rand() % 300;
		t[i] = pb_tensor(&b, "t", RP_PT_INTERMEDIATE, RP_DTYPE_F32, PB_DIMS(rows, 16));
		bytes[i] = (uint64_t)rows * 16 * 4;
		first[i] = last[i] = i;
		int a = i ? rand() % i : -1, c = i ? rand() % i : -1;
		pb_gemm(&b, t[i], a >= 0 ? t[a] : x, c >= 0 ? t[c] : x);
		if (a >= 0)
			last[a] = i;
		if (c >= 0 && i > last[c])
			last[c] = i;
	}
	build();

	ck_assert_int_eq(plan.nsteps, K);
	uint64_t sum = 0;
	for (int i = 0; i < K; i++) {
		uint64_t a0 = plan.arena_offset[t[i]];
		ck_assert(a0 != RD_PROG_NOT_IN_ARENA);
		ck_assert_uint_eq(a0 % RD_PROG_ARENA_ALIGN, 0);
		ck_assert_uint_le(a0 + bytes[i], plan.arena_bytes);
		sum += (bytes[i] + RD_PROG_ARENA_ALIGN - 1) / RD_PROG_ARENA_ALIGN * RD_PROG_ARENA_ALIGN;
		for (int j = 0; j < i; j++) {
			if (last[j] < first[i] || last[i] < first[j])
				continue;
			uint64_t b0 = plan.arena_offset[t[j]];
			ck_assert_msg(a0 + bytes[i] <= b0 || b0 + bytes[j] <= a0,
				      "t%d [%d, %d] and t%d [%d, %d] overlap in the arena", i, first[i], last[i], j,
				      first[j], last[j]);
		}
	}
	ck_assert_uint_lt(plan.arena_bytes, sum);
}
END_TEST

/* Column sums over many rows: partials in the arena, two kernels. */
START_TEST(leading_reduction_two_passes)
{
	pb_init(&b, "dbias");
	int dy = pb_tensor(&b, "dy", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(16384, 1024));
	int db = pb_tensor(&b, "db", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(1024));
	pb_reduce(&b, RP_RED_SUM, RP_AXIS_LEADING, db, dy);
	build();

	ck_assert_int_eq(plan.nsteps, 1);
	const struct rd_prog_step *st = &plan.steps[0];
	ck_assert_int_eq(st->nkernels, 2);
	ck_assert_uint_gt(st->scratch_bytes, 0);
	ck_assert_uint_le(st->scratch_offset + st->scratch_bytes, plan.arena_bytes);
	ck_assert_str_eq(st->kernels[1].name, "k0_reduce_sum_leading_final");
	/* 32 tiles of columns, chunks of rows: about 1024 blocks. */
	ck_assert_uint_ge(st->kernels[0].blocks, 512);

	/* Few rows: one pass, no scratch. */
	rd_prog_plan_finish(&plan);
	pb_init(&b, "small");
	dy = pb_tensor(&b, "dy", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(64, 10));
	db = pb_tensor(&b, "db", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(1, 10));
	pb_reduce(&b, RP_RED_MEAN, RP_AXIS_LEADING, db, dy);
	build();
	ck_assert_int_eq(plan.steps[0].nkernels, 1);
	ck_assert_uint_eq(plan.steps[0].scratch_bytes, 0);
	ck_assert_uint_eq(plan.arena_bytes, 0);
}
END_TEST

START_TEST(gather_steps)
{
	pb_init(&b, "embed");
	int table = pb_tensor(&b, "wte", RP_PT_INOUT, RP_DTYPE_F32, PB_DIMS(50304, 768));
	int ids = pb_tensor(&b, "ids", RP_PT_INPUT, RP_DTYPE_I64, PB_DIMS(8, 1024));
	int e = pb_tensor(&b, "e", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(8192, 768));
	int de = pb_tensor(&b, "de", RP_PT_INPUT, RP_DTYPE_BF16, PB_DIMS(8192, 768));
	int dt = pb_tensor(&b, "dwte", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(50304, 768));
	pb_embedding(&b, e, table, ids);
	pb_embedding_backward(&b, dt, de, ids);
	build();

	ck_assert_int_eq(plan.nsteps, 2);
	assert_step(0, RD_STEP_GATHER, 0, 1);
	assert_step(1, RD_STEP_GATHER, 1, 1);
	ck_assert_int_eq(plan.steps[0].nkernels, 2);
	ck_assert_str_eq(plan.steps[0].kernels[1].name, "k0_gather_embedding_report");
	/* The backward sorts 8192 positions: tiles of 1024, merged in three
	 * passes (2048, 4096, 8192), through two buffers of 64-bit keys. */
	ck_assert_int_eq(plan.steps[1].nkernels, 7);
	ck_assert_str_eq(plan.steps[1].kernels[0].name, "k1_gather_embedding_backward_zero");
	ck_assert_str_eq(plan.steps[1].kernels[1].name, "k1_gather_embedding_backward_sort");
	ck_assert_uint_eq(plan.steps[1].kernels[1].blocks, 8);
	ck_assert_str_eq(plan.steps[1].kernels[2].name, "k1_gather_embedding_backward_merge1");
	ck_assert_str_eq(plan.steps[1].kernels[4].name, "k1_gather_embedding_backward_merge3");
	ck_assert_uint_eq(plan.steps[1].kernels[4].blocks, 8);
	ck_assert_str_eq(plan.steps[1].kernels[5].name, "k1_gather_embedding_backward_rows");
	ck_assert_uint_eq(plan.steps[1].kernels[5].blocks, 8192 * 3);
	ck_assert_str_eq(plan.steps[1].kernels[6].name, "k1_gather_embedding_backward_report");
	ck_assert_uint_eq(plan.steps[1].scratch_bytes, 2 * 8192 * 8);
	ck_assert_uint_eq(plan.steps[0].scratch_bytes, 0);
	/* One note of a bad index for both, past everything else in the arena. */
	ck_assert_uint_ne(plan.fault_offset, RD_PROG_NOT_IN_ARENA);
	ck_assert_uint_eq(plan.fault_offset % RD_PROG_ARENA_ALIGN, 0);
	ck_assert_uint_le(plan.fault_offset + sizeof(struct rd_prog_fault), plan.arena_bytes);
}
END_TEST

/* What a client named reaches the source only in comments, and only as
 * identifier characters: no comment can be closed from a name. */
START_TEST(names_cannot_escape_comments)
{
	pb_init(&b, "evil */ int x; /*");
	int x = pb_tensor(&b, "x*/#include </etc/passwd>", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(4));
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4));
	pb_pw(&b, RP_PW_EXP, y, x, -1);
	pb_name(&b, "*/ asm(\"trap;\"); /*");
	build();

	const char *src = plan.steps[0].source;
	ck_assert_ptr_null(strstr(src, "passwd>"));
	ck_assert_ptr_null(strstr(src, "asm("));
	ck_assert_ptr_null(strstr(src, "int x;"));
	/* Every comment closes where it should: count the openings and
	 * closings. */
	int open = 0, close = 0;
	for (const char *s = src; (s = strstr(s, "/*")); s += 2)
		open++;
	for (const char *s = src; (s = strstr(s, "*/")); s += 2)
		close++;
	ck_assert_int_eq(open, close);
}
END_TEST

START_TEST(args_layout)
{
	pb_init(&b, "args");
	int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, PB_DIMS(4));
	int lr = pb_scalar(&b, "lr");
	int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, PB_DIMS(4));
	pb_pw(&b, RP_PW_MUL, y, x, lr, -1);
	build();

	ck_assert_int_eq(plan.nbound, 3);
	ck_assert_uint_eq(rd_prog_args_size(&plan), 3 * 8 + 8 + 8 + 3 * 8);
	void *bound[3] = { (void *)0x1000, NULL, (void *)0x3000 };
	double scalars[3] = { 0, 0.5, 0 };
	unsigned char buf[64];
	rd_prog_args_fill(&plan, buf, bound, (void *)0x7000, (struct rd_prog_fault *)0x9000, scalars);
	void *p;
	double d;
	memcpy(&p, buf, 8);
	ck_assert_ptr_eq(p, (void *)0x1000);
	memcpy(&p, buf + 16, 8);
	ck_assert_ptr_eq(p, (void *)0x3000);
	memcpy(&p, buf + 24, 8);
	ck_assert_ptr_eq(p, (void *)0x7000);
	memcpy(&p, buf + 32, 8);
	ck_assert_ptr_eq(p, (void *)0x9000);
	memcpy(&d, buf + 40 + 8, 8);
	ck_assert(d == 0.5);
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "void *bound[3];"));
	ck_assert_ptr_nonnull(strstr(plan.steps[0].source, "double scalar[3];"));

	/* A fused pointwise kernel's grid covers its work once. */
	ck_assert_uint_eq(plan.steps[0].kernels[0].blocks_per_sm, RD_PROG_GRID_UNCAPPED);
	struct rd_prog_kernel whole = { .blocks = 100000, .blocks_per_sm = RD_PROG_GRID_UNCAPPED };
	ck_assert_uint_eq(rd_prog_kernel_grid(&whole, 132), 100000);
	struct rd_prog_kernel k = { .blocks = 100000, .blocks_per_sm = 8 };
	ck_assert_uint_eq(rd_prog_kernel_grid(&k, 132), 1056);
	k.blocks = 10;
	ck_assert_uint_eq(rd_prog_kernel_grid(&k, 132), 10);
}
END_TEST

/* The same program gives the same source and hash; another shape another. */
START_TEST(source_hash_is_structural)
{
	uint64_t h[3];
	int64_t n[3] = { 4096, 4096, 4097 };

	for (int i = 0; i < 3; i++) {
		pb_init(&b, "h");
		int x = pb_tensor(&b, "x", RP_PT_INPUT, RP_DTYPE_F32, 1, &n[i]);
		int y = pb_tensor(&b, "y", RP_PT_OUTPUT, RP_DTYPE_F32, 1, &n[i]);
		pb_pw(&b, RP_PW_TANH, y, x, -1);
		build();
		h[i] = plan.steps[0].source_hash;
		ck_assert_uint_eq(strlen(plan.steps[0].source), plan.steps[0].source_len);
		rd_prog_plan_finish(&plan);
	}
	ck_assert_uint_eq(h[0], h[1]);
	ck_assert_uint_ne(h[0], h[2]);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("program_plan");
	TCase *tc = tcase_create("plan");

	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, chain_of_five_is_one_kernel);
	tcase_add_test(tc, shape_change_splits);
	tcase_add_test(tc, reduction_takes_its_prologue);
	tcase_add_test(tc, prologue_read_later_is_stored);
	tcase_add_test(tc, reduction_of_other_shape_runs_alone);
	tcase_add_test(tc, small_nodes_run_ahead);
	tcase_add_test(tc, dependencies_keep_their_order);
	tcase_add_test(tc, row_reduction_takes_its_epilogue);
	tcase_add_test(tc, iota_is_computed_inline);
	tcase_add_test(tc, dropout_mask_is_computed_inline);
	tcase_add_test(tc, in_place_update_is_one_kernel);
	tcase_add_test(tc, conflicting_views_split);
	tcase_add_test(tc, disjoint_views_share_a_kernel);
	tcase_add_test(tc, library_steps_and_arena_sharing);
	tcase_add_test(tc, pointwise_waits_past_an_independent_library_call);
	tcase_add_test(tc, pointwise_runs_ahead_of_independent_library_calls);
	tcase_add_test(tc, cat_is_recomputed_where_it_is_read);
	tcase_add_test(tc, cat_of_what_changes_before_it_is_read_is_stored);
	tcase_add_test(tc, storage_written_in_a_permuted_order_is_recomputed);
	tcase_add_test(tc, broadcast_read_is_stored);
	tcase_add_test(tc, arena_never_overlaps_live_roots);
	tcase_add_test(tc, leading_reduction_two_passes);
	tcase_add_test(tc, gather_steps);
	tcase_add_test(tc, names_cannot_escape_comments);
	tcase_add_test(tc, args_layout);
	tcase_add_test(tc, source_hash_is_structural);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_run(suite());
}
