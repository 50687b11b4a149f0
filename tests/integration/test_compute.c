/* SPDX-License-Identifier: Apache-2.0 */
/* Eight client processes run GEMMs (f32, f16, bf16; transposes; alpha,
 * beta with C; strided rows; epilogues, dgelu's among them), attention
 * forward + backward (with and without sequence lengths) and LayerNorm
 * forward + backward (padded rows, d_residual) on memfd buffers they
 * import, all at once, on both devices. Each checks every result against a
 * double-precision reference computed here from fresh random inputs, with
 * outputs poisoned (NaN) before each call. Then one client makes each of
 * dgelu's and LayerNorm's mistakes and sees it refused by name, its buffer
 * untouched. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "regen-config.h"
#include "tests/lib/client.h"
#include "tests/lib/rand.h"

#define NCLIENTS 8

static struct tl_daemon daemon_;

/* The failures a run of the case `desc` counts for: 0, or 1 once said why
 * (r < 0: the call failed, with the client's error; r > 0: a wrong result,
 * with why). */
static int verdict(regen_client *c, const char *desc, int r, const char *why)
{
	if (r < 0) {
		tl_log("FAIL %s: %d %s %s", desc, r, regen_client_error_name(c) ? regen_client_error_name(c) : "",
		       regen_client_error_message(c) ? regen_client_error_message(c) : "");
		return 1;
	}
	if (r > 0) {
		tl_log("FAIL %s: %s", desc, why);
		return 1;
	}
	return 0;
}

static int run_gemm(regen_client *c, struct tl_buffer *m, const struct tl_gemm_case *gc)
{
	char desc[256], why[512] = "";

	tl_gemm_describe(gc, desc, sizeof(desc));
	return verdict(c, desc, tl_gemm_run(c, m, 0, gc, why, sizeof(why)), why);
}

static int run_layer_norm(regen_client *c, int device, const struct tl_ln_case *lc)
{
	char desc[256], why[512] = "";

	tl_ln_describe(lc, desc, sizeof(desc));
	return verdict(c, desc, tl_layer_norm_run(c, device, lc, why, sizeof(why)), why);
}

static int run_attention(regen_client *c, int device, const struct tl_attn_case *ac)
{
	char desc[256], why[512] = "";

	tl_attn_describe(ac, desc, sizeof(desc));
	return verdict(c, desc, tl_attention_run(c, device, ac, why, sizeof(why)), why);
}

/* Random sequence lengths for ac: an empty query side now and then, every
 * entry with queries given keys (bottom-right: at least as many). */
static void random_lengths(struct tl_attn_case *ac)
{
	ac->varlen = true;
	for (int b = 0; b < ac->b; b++) {
		ac->seq_len_kv[b] = tl_rand_int(0, 3) == 0 ? ac->skv : tl_rand_int(1, ac->skv);
		ac->seq_len_q[b] = tl_rand_int(0, 4) == 0 ? 0 : tl_rand_int(1, ac->sq);
		if (ac->bottom_right && ac->seq_len_q[b] > ac->seq_len_kv[b]) {
			ac->seq_len_q[b] = ac->seq_len_kv[b];
		}
	}
}

/* Device 0's worker socket (static storage). */
static const char *st_worker_socket(regen_client *c)
{
	static char path[256];
	regen_status *st = tl_status(c);

	snprintf(path, sizeof(path), "%s", tl_status_device(st, 0)->worker_socket);
	regen_status_free(st);
	return path;
}

static int client_main(void *arg)
{
	static const enum regen_dtype dts[] = { REGEN_F32, REGEN_F16, REGEN_BF16 };
	int idx = (int)(long)arg, device = idx % 2, failures = 0, i, t;
	regen_client *c = tl_client_connect(&daemon_);
	struct tl_gemm_case gc;
	struct tl_attn_case ac;
	struct tl_buffer m;

	tl_buffer_create(c, device, 1 << 21, &m);
	/* Every dtype with every transpose combination, with and without C. */
	for (t = 0; t < 3; t++) {
		for (i = 0; i < 8; i++) {
			memset(&gc, 0, sizeof(gc));
			gc.in = gc.out = dts[t];
			gc.m = tl_rand_int(1, 40);
			gc.n = tl_rand_int(1, 40);
			gc.k = tl_rand_int(1, 64);
			gc.trans_a = i & 1;
			gc.trans_b = (i >> 1) & 1;
			gc.with_c = (i >> 2) & 1;
			gc.alpha = gc.with_c ? tl_rand_uniform(-2, 2) : 1.0;
			gc.beta = gc.with_c ? tl_rand_uniform(-1.5, 1.5) : 0;
			gc.pad = (i + idx) % 3 == 0 ? tl_rand_int(1, 4) : 0;
			failures += run_gemm(c, &m, &gc);
		}
	}
	/* Fixed shapes that catch swapped dimensions. */
	memset(&gc, 0, sizeof(gc));
	gc.in = gc.out = REGEN_F32;
	gc.m = 1;
	gc.n = 37;
	gc.k = 5;
	gc.alpha = 1;
	failures += run_gemm(c, &m, &gc);
	gc.m = 37;
	gc.n = 1;
	gc.trans_a = true;
	failures += run_gemm(c, &m, &gc);
	/* Low-precision inputs into an f32 output. */
	gc.in = REGEN_BF16;
	gc.m = 17;
	gc.n = 23;
	gc.k = 29;
	gc.trans_a = false;
	gc.trans_b = true;
	failures += run_gemm(c, &m, &gc);
	/* Epilogues. */
	for (t = REGEN_EPILOGUE_BIAS; t <= REGEN_EPILOGUE_GELU_AUX_BIAS; t++) {
		memset(&gc, 0, sizeof(gc));
		gc.in = gc.out = dts[(t + idx) % 3];
		gc.m = tl_rand_int(2, 24);
		gc.n = tl_rand_int(2, 24);
		gc.k = tl_rand_int(2, 24);
		gc.alpha = 1;
		gc.epilogue = (enum regen_epilogue)t;
		failures += run_gemm(c, &m, &gc);
	}
	/* dgelu with C (aliasing D or not), alpha and beta, padded rows, a
	 * wider D than the inputs. */
	for (i = 0; i < 4; i++) {
		memset(&gc, 0, sizeof(gc));
		gc.in = dts[(i + idx) % 3];
		gc.out = i == 3 ? REGEN_F32 : gc.in;
		gc.m = tl_rand_int(1, 40);
		gc.n = tl_rand_int(1, 40);
		gc.k = tl_rand_int(1, 48);
		gc.trans_a = i & 1;
		gc.trans_b = (i >> 1) & 1;
		gc.with_c = i > 0;
		gc.alpha = tl_rand_uniform(-2, 2);
		gc.beta = gc.with_c ? tl_rand_uniform(-1.5, 1.5) : 0;
		gc.pad = i >= 2 ? tl_rand_int(1, 5) : 0;
		gc.epilogue = REGEN_EPILOGUE_DGELU;
		failures += run_gemm(c, &m, &gc);
		/* The forward's side: GELU's input written to aux_out, laid
		 * out (padded) as D, with C, alpha and beta in it. */
		gc.epilogue = i & 1 ? REGEN_EPILOGUE_GELU_AUX_BIAS : REGEN_EPILOGUE_GELU_AUX;
		failures += run_gemm(c, &m, &gc);
	}
	/* Larger ones, so the clients' calls overlap in the workers. */
	for (i = 0; i < 3; i++) {
		memset(&gc, 0, sizeof(gc));
		gc.in = gc.out = dts[(i + idx) % 3];
		gc.m = tl_rand_int(64, 160);
		gc.n = tl_rand_int(64, 160);
		gc.k = tl_rand_int(64, 200);
		gc.trans_a = (i + idx) & 1;
		gc.trans_b = ((i + idx) >> 1) & 1;
		gc.with_c = true;
		gc.alpha = tl_rand_uniform(-2, 2);
		gc.beta = tl_rand_uniform(-1.5, 1.5);
		failures += run_gemm(c, &m, &gc);
	}
	/* Random cases. */
	for (i = 0; i < 12; i++) {
		tl_gemm_random_case(&gc, 48);
		failures += run_gemm(c, &m, &gc);
	}
	tl_buffer_free(&m);

	/* Attention forward + backward, each dtype, causal or not, Sq != Skv. */
	for (t = 0; t < 3; t++) {
		for (i = 0; i < 2; i++) {
			memset(&ac, 0, sizeof(ac));
			ac.dt = dts[t];
			ac.b = tl_rand_int(1, 2);
			ac.h = tl_rand_int(1, 3);
			ac.sq = tl_rand_int(3, 16);
			ac.skv = tl_rand_int(ac.sq, 24);
			ac.d = 8 * tl_rand_int(1, 3);
			ac.dv = 8 * tl_rand_int(1, 2);
			ac.causal = i == 1;
			ac.scale = (idx + i) % 2 ? 0 : tl_rand_uniform(0.1, 0.6);
			failures += run_attention(c, device, &ac);
		}
	}
	/* Variable sequence lengths: padding rows hold NaN, which must reach
	 * nothing; every mask, Sq > Skv too (aligned bottom-right, the lengths
	 * decide). */
	for (t = 0; t < 3; t++) {
		for (i = 0; i < 3; i++) {
			memset(&ac, 0, sizeof(ac));
			ac.dt = dts[t];
			ac.b = tl_rand_int(2, 5);
			ac.h = tl_rand_int(1, 3);
			ac.sq = tl_rand_int(3, 20);
			ac.skv = tl_rand_int(3, 20);
			ac.d = 8 * tl_rand_int(1, 2);
			ac.dv = 8 * tl_rand_int(1, 2);
			ac.causal = i > 0;
			ac.bottom_right = i == 2;
			random_lengths(&ac);
			failures += run_attention(c, device, &ac);
		}
	}
	/* LayerNorm forward + backward: each dtype, padded rows or not, with
	 * and without bias, d_residual apart or in place, d_weight and d_bias
	 * or d_x alone; one element a row, and a GPT-width row. */
	for (t = 0; t < 3; t++) {
		for (i = 0; i < 3; i++) {
			struct tl_ln_case lc = {
				.dt = dts[t], .rows = tl_rand_int(1, 24), .n = i == 0 && t == idx % 3 ? 1 : tl_rand_int(2, 160),
				.pad = (i + idx) % 2 ? tl_rand_int(1, 9) : 0, .eps = i == 1 ? tl_rand_uniform(1e-6, 0.3) : 0,
				.bias = (i + t + idx) % 4 != 0, .residual = (i + idx) % 3, .param_grads = (i + t) % 3 != 2,
			};
			failures += run_layer_norm(c, device, &lc);
		}
	}
	{
		struct tl_ln_case lc = { .dt = dts[idx % 3], .rows = 3, .n = 2048, .pad = idx % 2 ? 8 : 0, .bias = true,
					 .residual = 1 + idx % 2, .param_grads = true };
		failures += run_layer_norm(c, device, &lc);
	}
	regen_client_destroy(c);
	tl_log("client %d (device %d): %d failures", idx, device, failures);
	return failures == 0 ? 0 : 1;
}

/* A contiguous rows x cols matrix of buf at offset bytes. */
static struct regen_tensor mat(regen_buffer *buf, uint64_t offset, enum regen_dtype dt, int rows, int cols)
{
	return (struct regen_tensor){ .buffer = buf, .offset = offset, .dtype = dt, .rank = 2, .shape = { rows, cols } };
}

/* dgelu's and gelu_aux's mistakes, each refused with InvalidOperand naming
 * `operand` and nothing written anywhere in the buffer; a right call after
 * them works. */
static void dgelu_refusals(regen_client *c)
{
	struct tl_buffer m;

	tl_buffer_create(c, 0, 4096, &m);
	regen_buffer *b = m.buf;
	struct regen_tensor aux = mat(b, 1024, REGEN_F32, 4, 4), aux_short = mat(b, 1024, REGEN_F32, 4, 3);
	struct regen_tensor aux_bf16 = mat(b, 1024, REGEN_BF16, 4, 4), aux_past = mat(b, 4064, REGEN_F32, 4, 4);
	struct regen_tensor aux_on_d = mat(b, 512 + 16, REGEN_F32, 4, 4), aux_is_d = mat(b, 512, REGEN_F32, 4, 4);
	struct regen_tensor bias = { .buffer = b, .offset = 1536, .dtype = REGEN_F32, .rank = 1, .shape = { 4 } };
	struct regen_tensor on_a = mat(b, 16, REGEN_F32, 4, 4);
	const struct {
		const char *what;
		enum regen_epilogue epilogue;
		const struct regen_tensor *aux, *bias;
		const char *operand;
		const struct regen_tensor *aux_out;
	} cases[] = {
		{ "dgelu without aux", REGEN_EPILOGUE_DGELU, NULL, NULL, "aux" },
		{ "aux without an epilogue", REGEN_EPILOGUE_NONE, &aux, NULL, "aux" },
		{ "aux with gelu", REGEN_EPILOGUE_GELU, &aux, NULL, "aux" },
		{ "aux with gelu_bias", REGEN_EPILOGUE_GELU_BIAS, &aux, &bias, "aux" },
		{ "dgelu with a bias", REGEN_EPILOGUE_DGELU, &aux, &bias, "bias" },
		{ "aux of another shape", REGEN_EPILOGUE_DGELU, &aux_short, NULL, "aux" },
		{ "aux of another dtype", REGEN_EPILOGUE_DGELU, &aux_bf16, NULL, "aux" },
		{ "aux past its buffer's end", REGEN_EPILOGUE_DGELU, &aux_past, NULL, "aux" },
		{ "d overlapping aux", REGEN_EPILOGUE_DGELU, &aux_on_d, NULL, "d" },
		{ "d aliasing aux exactly", REGEN_EPILOGUE_DGELU, &aux_is_d, NULL, "d" },
		{ "gelu_aux without aux_out", REGEN_EPILOGUE_GELU_AUX, NULL, NULL, "aux_out" },
		{ "gelu_aux_bias without aux_out", REGEN_EPILOGUE_GELU_AUX_BIAS, NULL, &bias, "aux_out" },
		{ "gelu_aux_bias without a bias", REGEN_EPILOGUE_GELU_AUX_BIAS, NULL, NULL, "bias", &aux },
		{ "aux_out with gelu", REGEN_EPILOGUE_GELU, NULL, NULL, "aux_out", &aux },
		{ "aux_out with dgelu", REGEN_EPILOGUE_DGELU, &aux, NULL, "aux_out", &aux_short },
		{ "aux_out of another shape", REGEN_EPILOGUE_GELU_AUX, NULL, NULL, "aux_out", &aux_short },
		{ "aux_out of another dtype", REGEN_EPILOGUE_GELU_AUX, NULL, NULL, "aux_out", &aux_bf16 },
		{ "aux_out past its buffer's end", REGEN_EPILOGUE_GELU_AUX, NULL, NULL, "aux_out", &aux_past },
		{ "aux_out over a", REGEN_EPILOGUE_GELU_AUX, NULL, NULL, "aux_out", &on_a },
		{ "aux_out over d", REGEN_EPILOGUE_GELU_AUX, NULL, NULL, "aux_out", &aux_on_d },
	};
	unsigned char before[4096];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct regen_gemm_args args = {
			.a = mat(b, 0, REGEN_F32, 4, 4), .b = mat(b, 256, REGEN_F32, 4, 4), .d = mat(b, 512, REGEN_F32, 4, 4),
			.alpha = 1, .epilogue = cases[i].epilogue, .aux = cases[i].aux, .bias = cases[i].bias,
			.aux_out = cases[i].aux_out,
		};

		for (size_t e = 0; e < sizeof(before); e++) {
			m.mem.ptr[e] = (unsigned char)tl_rand_int(1, 255);
		}
		memcpy(before, m.mem.ptr, sizeof(before));
		int r = regen_gemm(c, &args);
		ASSERT(r < 0, "%s: accepted", cases[i].what);
		ASSERT_STR_EQ(regen_client_error_name(c) ? regen_client_error_name(c) : "", REGEN_ERROR_INVALID_OPERAND,
			      "%s: %s", cases[i].what, regen_client_error_message(c) ? regen_client_error_message(c) : "");
		cJSON *params = cJSON_Parse(regen_client_error_parameters(c) ? regen_client_error_parameters(c) : "");
		const cJSON *operand = cJSON_GetObjectItemCaseSensitive(params, "operand");
		ASSERT(cJSON_IsString(operand) && strcmp(operand->valuestring, cases[i].operand) == 0,
		       "%s: names %s, want %s", cases[i].what, regen_client_error_parameters(c), cases[i].operand);
		cJSON_Delete(params);
		ASSERT(memcmp(before, m.mem.ptr, sizeof(before)) == 0, "%s: the buffer changed", cases[i].what);
	}
	/* The lane still serves, dgelu and gelu_aux_bias included. */
	struct tl_gemm_case gc = { .in = REGEN_F32, .out = REGEN_F32, .m = 5, .n = 7, .k = 3, .alpha = 1,
				   .epilogue = REGEN_EPILOGUE_DGELU };
	char why[512] = "";
	int r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	ASSERT_REGEN_OK(c, r < 0 ? r : 0, "dgelu after the refusals");
	ASSERT(r == 0, "dgelu after the refusals: %s", why);
	gc.epilogue = REGEN_EPILOGUE_GELU_AUX_BIAS;
	r = tl_gemm_run(c, &m, 0, &gc, why, sizeof(why));
	ASSERT_REGEN_OK(c, r < 0 ? r : 0, "gelu_aux_bias after the refusals");
	ASSERT(r == 0, "gelu_aux_bias after the refusals: %s", why);
	tl_buffer_free(&m);
}

/* LayerNorm's mistakes, each refused by name (the operand, or eps), and
 * nothing written anywhere in the buffer; a right call after them works. */
static void layer_norm_refusals(regen_client *c)
{
	struct tl_buffer m;

	tl_buffer_create(c, 0, 8192, &m);
	regen_buffer *b = m.buf;
	const struct regen_tensor x = mat(b, 0, REGEN_F32, 4, 8), y = mat(b, 256, REGEN_F32, 4, 8);
	const struct regen_tensor w = { .buffer = b, .offset = 512, .dtype = REGEN_F32, .rank = 1, .shape = { 8 } };
	const struct regen_tensor w_short = { .buffer = b, .offset = 512, .dtype = REGEN_F32, .rank = 1, .shape = { 7 } };
	const struct regen_tensor w_bf16 = { .buffer = b, .offset = 512, .dtype = REGEN_BF16, .rank = 1, .shape = { 8 } };
	const struct regen_tensor st = { .buffer = b, .offset = 640, .dtype = REGEN_F32, .rank = 1, .shape = { 4 } };
	const struct regen_tensor st_f16 = { .buffer = b, .offset = 640, .dtype = REGEN_F16, .rank = 1, .shape = { 4 } };
	const struct regen_tensor st2 = { .buffer = b, .offset = 656, .dtype = REGEN_F32, .rank = 1, .shape = { 4 } };
	const struct regen_tensor st2_on_st = { .buffer = b, .offset = 648, .dtype = REGEN_F32, .rank = 1, .shape = { 4 } };
	const struct regen_tensor y_on_x = mat(b, 64, REGEN_F32, 4, 8), y_past = mat(b, 8160, REGEN_F32, 4, 8);
	const struct regen_tensor y_wide = mat(b, 256, REGEN_F32, 4, 9);
	const struct {
		const char *what;
		struct regen_tensor x, weight, y;
		const struct regen_tensor *mean, *rstd;
		double eps;
		const char *error, *key, *names;
	} cases[] = {
		{ "weight of another length", x, w_short, y, NULL, NULL, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "weight" },
		{ "weight of another dtype", x, w_bf16, y, NULL, NULL, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "weight" },
		{ "mean in f16", x, w, y, &st_f16, NULL, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "mean" },
		{ "rstd over mean", x, w, y, &st, &st2_on_st, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "rstd" },
		{ "y over x", x, w, y_on_x, &st, &st2, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "y" },
		{ "y of another shape", x, w, y_wide, NULL, NULL, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "y" },
		{ "y past its buffer's end", x, w, y_past, NULL, NULL, 0, REGEN_ERROR_INVALID_OPERAND, "operand", "y" },
		{ "eps negative", x, w, y, &st, &st2, -0.1, REGEN_ERROR_INVALID_PARAMETER, "parameter", "eps" },
	};
	unsigned char before[8192];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct regen_layer_norm_args args = {
			.x = cases[i].x, .weight = cases[i].weight, .y = cases[i].y, .mean = cases[i].mean,
			.rstd = cases[i].rstd, .eps = cases[i].eps,
		};

		for (size_t e = 0; e < sizeof(before); e++) {
			m.mem.ptr[e] = (unsigned char)tl_rand_int(1, 255);
		}
		memcpy(before, m.mem.ptr, sizeof(before));
		int r = regen_layer_norm(c, &args);
		ASSERT(r < 0, "%s: accepted", cases[i].what);
		ASSERT_STR_EQ(regen_client_error_name(c) ? regen_client_error_name(c) : "", cases[i].error, "%s: %s",
			      cases[i].what, regen_client_error_message(c) ? regen_client_error_message(c) : "");
		cJSON *params = cJSON_Parse(regen_client_error_parameters(c) ? regen_client_error_parameters(c) : "");
		const cJSON *named = cJSON_GetObjectItemCaseSensitive(params, cases[i].key);
		ASSERT(cJSON_IsString(named) && strcmp(named->valuestring, cases[i].names) == 0, "%s: names %s, want %s",
		       cases[i].what, regen_client_error_parameters(c), cases[i].names);
		cJSON_Delete(params);
		ASSERT(memcmp(before, m.mem.ptr, sizeof(before)) == 0, "%s: the buffer changed", cases[i].what);
	}
	/* The backward's: d_x on d_y, and d_residual overlapping d_x without
	 * being it. */
	const struct regen_tensor dx_on_res = mat(b, 1024 + 4, REGEN_F32, 4, 8), res = mat(b, 1024, REGEN_F32, 4, 8);
	struct regen_layer_norm_backward_args bargs = {
		.d_y = mat(b, 2048, REGEN_F32, 4, 8), .x = x, .weight = w, .mean = st, .rstd = st2,
		.d_x = mat(b, 2048, REGEN_F32, 4, 8),
	};
	const char *bnames[2] = { "d_x", "d_residual" };
	for (int i = 0; i < 2; i++) {
		if (i == 1) {
			bargs.d_x = dx_on_res;
			bargs.d_residual = &res;
		}
		memcpy(before, m.mem.ptr, sizeof(before));
		ASSERT_REGEN_ERROR(c, regen_layer_norm_backward(c, &bargs), REGEN_ERROR_INVALID_OPERAND, "backward %d", i);
		cJSON *params = cJSON_Parse(regen_client_error_parameters(c) ? regen_client_error_parameters(c) : "");
		const cJSON *named = cJSON_GetObjectItemCaseSensitive(params, "operand");
		ASSERT(cJSON_IsString(named) && strcmp(named->valuestring, bnames[i]) == 0, "backward: names %s, want %s",
		       regen_client_error_parameters(c), bnames[i]);
		cJSON_Delete(params);
		ASSERT(memcmp(before, m.mem.ptr, sizeof(before)) == 0, "backward %d: the buffer changed", i);
	}
	/* The lane still serves, LayerNorm included. */
	struct tl_ln_case lc = { .dt = REGEN_F32, .rows = 3, .n = 5, .bias = true, .residual = 1, .param_grads = true };
	char why[512] = "";
	int r = tl_layer_norm_run(c, 0, &lc, why, sizeof(why));
	ASSERT_REGEN_OK(c, r < 0 ? r : 0, "layer_norm after the refusals");
	ASSERT(r == 0, "layer_norm after the refusals: %s", why);
	tl_buffer_free(&m);
}

/* A negative attention scale reaches regend on either transport (the
 * Varlink encoder used to drop it, so the call ran with the default) and
 * is refused there by name, o untouched. */
static void attention_scale_refused(regen_client *c)
{
	struct tl_buffer m;
	unsigned char before[4096];

	tl_buffer_create(c, 0, 4096, &m);
	struct regen_tensor t = { .buffer = m.buf, .dtype = REGEN_F32, .rank = 4, .shape = { 1, 2, 4, 8 } };
	struct regen_attention_args args = { .q = t, .k = t, .v = t, .o = t, .scale = -0.5 };

	args.k.offset = 256;
	args.v.offset = 512;
	args.o.offset = 1024;
	for (size_t e = 0; e < sizeof(before); e++) {
		m.mem.ptr[e] = (unsigned char)tl_rand_int(1, 255);
	}
	memcpy(before, m.mem.ptr, sizeof(before));
	ASSERT_REGEN_ERROR(c, regen_attention(c, &args), REGEN_ERROR_INVALID_PARAMETER, "a negative scale");
	ASSERT(strstr(regen_client_error_parameters(c) ? regen_client_error_parameters(c) : "", "scale") != NULL,
	       "the refusal names %s, want scale", regen_client_error_parameters(c));
	ASSERT(memcmp(before, m.mem.ptr, sizeof(before)) == 0, "a refused attention changed its buffer");
	tl_buffer_free(&m);
}

int main(void)
{
	pid_t pids[NCLIENTS];
	const struct regen_device_info *d;
	regen_status *st;
	regen_client *c;
	int i, failed;

	tl_init(280);
	tl_daemon_start(&daemon_, NULL);
	for (i = 0; i < NCLIENTS; i++) {
		pids[i] = tl_fork(client_main, (void *)(long)i, 240);
	}
	failed = tl_wait_children(pids, NCLIENTS, 250);
	ASSERT(tl_daemon_alive(&daemon_), "regend died");
	c = tl_client_connect(&daemon_);
	{
		/* The handshake says who answers: this build's regend. */
		struct regen_info info;
		ASSERT_REGEN_OK(c, regen_hello(c, &info));
		ASSERT(strcmp(info.product, "regend") == 0 && strcmp(info.version, REGEN_VERSION) == 0,
		       "hello: %s %s %s", info.vendor, info.product, info.version);
		/* A worker socket speaks Varlink but is no regend main socket. */
		regen_client *w = NULL;
		ASSERT_EQ(regen_client_connect(st_worker_socket(c), &w), 0, "connect to the worker socket");
		ASSERT_EQ(regen_hello(w, &info), -EPROTONOSUPPORT, "hello on a worker socket is refused");
		regen_client_destroy(w);
	}
	dgelu_refusals(c);
	layer_norm_refusals(c);
	attention_scale_refused(c);
	st = tl_status(c);
	for (i = 0; i < regen_status_device_count(st); i++) {
		d = regen_status_device(st, i);
		ASSERT_STR_EQ(d->state, "ready", "device %d is %s", d->index, d->state);
		ASSERT_UINT_EQ(d->respawns, 0, "device %d respawned %llu times", d->index, (unsigned long long)d->respawns);
	}
	regen_status_free(st);
	regen_client_destroy(c);
	if (failed > 0) {
		tl_daemon_dump_log(&daemon_, 60);
	}
	ASSERT_EQ(failed, 0, "%d of %d clients failed", failed, NCLIENTS);
	tl_log("PASS");
	return 0;
}
