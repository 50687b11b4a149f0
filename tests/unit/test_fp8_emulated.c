/* SPDX-License-Identifier: Apache-2.0 */
/* TransposeQuantize's tiled kernel (kernels/fp8_quantize.cuh) run without
 * a GPU: compiled as C++ behind tests/unit/program_emulator.hpp (the host
 * playing the GPU: blocks in turn, a block's threads as coroutines switched
 * at __syncthreads and at shuffles) and launched as kernels/fp8.cu launches
 * it, its bytes against tests/lib's own FP8 codec of the f32 product (the
 * host backend's order), byte for byte: y, y_t and amax, every input dtype
 * and both FP8 formats, rows with padding (which must stay as it was),
 * values past the format's largest (saturated), grids that stride over
 * the tiles, and y or y_t alone. Which shapes the kernel takes
 * (rk_quantize_tiles_fit) is checked too.
 *
 * What this cannot see: the GPU's memory model and speed
 * (tests/gpu/test_cuda_fp8.c runs the launcher on a GPU).
 *
 * Needs a C++ compiler (REGEN_TEST_CXX) and the toolkit's headers
 * (REGEN_TEST_CUDA_INCLUDE); skipped (exit 77) without them. */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/kernels.h"
#include "tests/lib/dtype.h"
#include "tests/lib/rand.h"
#include "tests/unit/emulated.h"
#include "tests/unit/unit.h"

static struct tl_emulated emu;
static const char *kernels_dir;
static void *lib;

typedef int emulate_fn(void *kernel, const void *args, unsigned grid, unsigned block);
static emulate_fn *emulate;
static int (*tiles_fit)(const struct rk_quantize *);
static void *kernel_of[3];   /* by enum rk_dtype */

/* The kernel for each input dtype, and the launcher, as one shared object. */
static const char harness[] =
	"#include <cstdint>\n"
	"#include \"fp8_quantize.cuh\"\n"
	"typedef struct rk_quantize rg_args;\n"
	"static void tiles_f32(const rg_args *a) { rk_fp8::quantize_tiles_kernel<float>(*a); }\n"
	"static void tiles_f16(const rg_args *a) { rk_fp8::quantize_tiles_kernel<__half>(*a); }\n"
	"static void tiles_bf16(const rg_args *a) { rk_fp8::quantize_tiles_kernel<__nv_bfloat16>(*a); }\n"
	"extern \"C\" void *fp8_kernel(int dtype) {\n"
	"\treturn dtype == RK_F32 ? (void *)tiles_f32 : dtype == RK_F16 ? (void *)tiles_f16 : (void *)tiles_bf16;\n"
	"}\n"
	"extern \"C\" int fp8_tiles_fit(const struct rk_quantize *a) { return rk_quantize_tiles_fit(a); }\n"
	"RG_EMULATOR_LAUNCHER\n";

static void build(void)
{
	lib = tl_emulated_load(&emu, "fp8_quantize", harness, kernels_dir);
	emulate = (emulate_fn *)dlsym(lib, "rg_emulate");
	tiles_fit = (int (*)(const struct rk_quantize *))dlsym(lib, "fp8_tiles_fit");
	void *(*kernel)(int) = (void *(*)(int))dlsym(lib, "fp8_kernel");
	ck_assert(emulate && tiles_fit && kernel);
	for (int d = RK_F32; d <= RK_BF16; d++)
		kernel_of[d] = kernel(d);
}

static const enum rp_dtype rp_of[] = { [RK_F32] = RP_DTYPE_F32, [RK_F16] = RP_DTYPE_F16, [RK_BF16] = RP_DTYPE_BF16 };

struct tq_case {
	enum rk_dtype x;
	int e5m2;
	int64_t rows, cols, x_pad, y_pad, y_t_pad;
	bool y, y_t;
	unsigned grid;
};

static const struct tq_case cases[] = {
	{ RK_BF16, 0, 64, 64, 0, 0, 0, true, true, 1 },
	{ RK_BF16, 0, 128, 192, 8, 8, 16, true, true, 2 },
	{ RK_BF16, 1, 192, 128, 0, 0, 0, true, true, 5 },
	{ RK_F16, 1, 128, 128, 16, 24, 32, true, true, 3 },
	{ RK_F16, 0, 64, 256, 0, 0, 0, false, true, 4 },
	{ RK_F32, 0, 128, 64, 4, 0, 0, true, false, 2 },
	{ RK_F32, 1, 64, 192, 0, 8, 16, true, true, 3 },
};

#define SENTINEL 0xa5

START_TEST(tiles_match_the_codec)
{
	const struct tq_case *c = &cases[_i];
	const enum rp_dtype xdt = rp_of[c->x], ydt = c->e5m2 ? RP_DTYPE_E5M2 : RP_DTYPE_E4M3;
	const int64_t x_ld = c->cols + c->x_pad, y_ld = c->cols + c->y_pad, y_t_ld = c->rows + c->y_t_pad;
	const size_t esize = rp_dtype_size(xdt);
	void *x = aligned_alloc(64, (size_t)(c->rows * x_ld) * esize);
	unsigned char *y = aligned_alloc(64, (size_t)(c->rows * y_ld));
	unsigned char *y_t = aligned_alloc(64, (size_t)(c->cols * y_t_ld));
	double *v = malloc(sizeof(double) * (size_t)(c->rows * x_ld));
	float amax = 0.0f, scale = ydt == RP_DTYPE_E4M3 ? 448.0f / 3.0f : 57344.0f / 3.0f;

	ck_assert(x && y && y_t && v);
	/* |x| up to 4: a quarter of the values past the format's largest. */
	tl_fill_random(NULL, xdt, x, (size_t)(c->rows * x_ld), -4.0, 4.0, v);
	memset(y, SENTINEL, (size_t)(c->rows * y_ld));
	memset(y_t, SENTINEL, (size_t)(c->cols * y_t_ld));
	const struct rk_quantize a = {
		.dtype = c->x, .e5m2 = c->e5m2, .rows = c->rows, .cols = c->cols, .x_ld = x_ld, .y_ld = y_ld,
		.y_t_ld = y_t_ld, .x = x, .scale = &scale, .y = c->y ? y : NULL, .y_t = c->y_t ? y_t : NULL,
		.amax = &amax,
	};
	ck_assert_msg(tiles_fit(&a), "the tiled kernel refuses case %d", _i);
	ck_assert_int_eq(emulate(kernel_of[c->x], &a, c->grid, 256), 0);

	double want_amax = 0.0;
	int64_t wrong = 0;
	for (int64_t i = 0; i < c->rows; i++) {
		for (int64_t j = 0; j < x_ld; j++) {
			const double xv = v[i * x_ld + j];
			if (j < c->cols) {
				const uint8_t q = tl_fp8_encode(ydt, (double)((float)xv * scale));
				want_amax = xv < 0 ? (-xv > want_amax ? -xv : want_amax) : (xv > want_amax ? xv : want_amax);
				if (c->y && y[i * y_ld + j] != q && wrong++ < 5)
					fprintf(stderr, "y[%lld][%lld] = 0x%02x, not 0x%02x (x %g)\n", (long long)i, (long long)j,
						y[i * y_ld + j], q, xv);
				if (c->y_t && y_t[j * y_t_ld + i] != q && wrong++ < 5)
					fprintf(stderr, "y_t[%lld][%lld] = 0x%02x, not 0x%02x\n", (long long)j, (long long)i,
						y_t[j * y_t_ld + i], q);
			}
		}
		for (int64_t j = c->cols; j < y_ld; j++)
			wrong += y[i * y_ld + j] != SENTINEL;
		if (!c->y)
			for (int64_t j = 0; j < c->cols; j++)
				wrong += y[i * y_ld + j] != SENTINEL;
	}
	for (int64_t j = 0; j < c->cols; j++) {
		for (int64_t i = c->rows; i < y_t_ld; i++)
			wrong += y_t[j * y_t_ld + i] != SENTINEL;
		if (!c->y_t)
			for (int64_t i = 0; i < c->rows; i++)
				wrong += y_t[j * y_t_ld + i] != SENTINEL;
	}
	ck_assert_msg(wrong == 0, "case %d: %lld byte(s) other than the codec's, or padding written", _i,
		      (long long)wrong);
	ck_assert_msg((double)amax == want_amax, "case %d: amax %.9g, not %.9g", _i, amax, want_amax);
	free(x);
	free(y);
	free(y_t);
	free(v);
}
END_TEST

START_TEST(other_shapes_go_to_the_general_kernel)
{
	static _Alignas(64) unsigned char buf[1 << 16];
	float scale = 1.0f;
	struct rk_quantize a = { .dtype = RK_BF16, .rows = 128, .cols = 128, .x_ld = 128, .y_ld = 128, .y_t_ld = 128,
				 .x = buf, .scale = &scale, .y = buf, .y_t = buf };

	ck_assert(tiles_fit(&a));
	a.rows = 100;
	ck_assert_msg(!tiles_fit(&a), "rows not a multiple of 64");
	a.rows = 128, a.cols = 96;
	ck_assert_msg(!tiles_fit(&a), "cols not a multiple of 64");
	a.cols = 128, a.x = buf + 2;
	ck_assert_msg(!tiles_fit(&a), "x off its 16-byte boundary");
	a.x = buf, a.x_ld = 132;
	ck_assert_msg(!tiles_fit(&a), "x's rows off their 16-byte boundary");
	a.x_ld = 128, a.y = buf + 4;
	ck_assert_msg(!tiles_fit(&a), "y off its 8-byte boundary");
	a.y = buf, a.y_t_ld = 136;
	ck_assert_msg(!tiles_fit(&a), "y_t's rows off their 16-byte boundary");
	a.y_t = NULL;
	ck_assert_msg(tiles_fit(&a), "y_t absent: its stride does not matter");
	a.rows = 0;
	ck_assert_msg(!tiles_fit(&a), "an empty matrix");
}
END_TEST

static void setup(void)
{
	if (!lib)
		build();
}

static Suite *suite(void)
{
	Suite *s = suite_create("fp8_emulated");
	TCase *tc = tcase_create("emulated");

	tcase_set_timeout(tc, 600);
	tcase_add_unchecked_fixture(tc, setup, NULL);
	tcase_add_loop_test(tc, tiles_match_the_codec, 0, (int)(sizeof(cases) / sizeof(cases[0])));
	tcase_add_test(tc, other_shapes_go_to_the_general_kernel);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int r;

	kernels_dir = getenv("REGEN_TEST_KERNELS");
	if (!kernels_dir) {
		printf("skipped: no kernels folder named (REGEN_TEST_KERNELS; meson sets it)\n");
		return 77;
	}
	r = tl_emulated_open(&emu, "cuda_fp8.h");
	if (r)
		return r;
	tl_rand_init();
	r = unit_run(suite());
	tl_emulated_close(&emu);
	return r;
}
