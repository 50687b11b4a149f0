/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute parameters into descriptors: what is accepted, what is
 * derived from it, and, for each way a call can be wrong, the exact error a
 * client gets and the operand or parameter it names.
 *
 * Each table row starts from one valid call and changes a few top-level
 * fields (a merge patch: a key set to null is removed), so a row reads as
 * "this call, except ...". JSON is written with single quotes for
 * readability; they become double quotes before parsing. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/compute.h"
#include "proto/errors.h"

/* ---- helpers ----------------------------------------------------------------- */

static cJSON *json(const char *text)
{
	char *s = strdup(text);
	cJSON *j;

	ck_assert_ptr_nonnull(s);
	for (char *p = s; *p; p++) {
		if (*p == '\'') {
			*p = '"';
		}
	}
	j = cJSON_Parse(s);
	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	free(s);
	return j;
}

/* base with patch's top-level keys replaced, added, or (null) removed. */
static cJSON *patched(const char *base, const char *patch)
{
	cJSON *b = json(base), *p, *item;

	if (patch == NULL) {
		return b;
	}
	p = json(patch);
	cJSON_ArrayForEach(item, p) {
		cJSON_DeleteItemFromObjectCaseSensitive(b, item->string);
		if (!cJSON_IsNull(item)) {
			cJSON_AddItemToObject(b, item->string, cJSON_Duplicate(item, true));
		}
	}
	cJSON_Delete(p);
	return b;
}

struct bad_case {
	const char *what;
	const char *patch;
	const char *error;      /* expected error name */
	const char *names;      /* the operand (InvalidOperand) or parameter (InvalidParameter) it names */
	const char *reason_has; /* optional: words the reason must contain */
};

/* Runs parse on base+patch, which must fail as the row says. */
static void expect_bad(const char *base, const struct bad_case *bc,
		       int (*parse)(const cJSON *, void *, struct rp_error *), void *desc, size_t desc_size)
{
	cJSON *params = patched(base, bc->patch);
	struct rp_error err = { 0 };
	const char *key = strcmp(bc->error, RP_ERR_INVALID_OPERAND) == 0 ? "operand" : "parameter";
	const cJSON *named, *reason;
	int r = parse(params, desc, &err);

	ck_assert_msg(r < 0, "%s: accepted, expected %s naming %s", bc->what, bc->error, bc->names);
	ck_assert_ptr_nonnull(err.name);
	ck_assert_msg(strcmp(err.name, bc->error) == 0, "%s: got %s, expected %s", bc->what, err.name, bc->error);
	named = cJSON_GetObjectItemCaseSensitive(err.params, key);
	ck_assert_msg(cJSON_IsString(named) && strcmp(named->valuestring, bc->names) == 0,
		      "%s: %s names %s '%s', expected '%s'", bc->what, err.name, key,
		      cJSON_IsString(named) ? named->valuestring : "(none)", bc->names);
	if (strcmp(bc->error, RP_ERR_INVALID_OPERAND) == 0) {
		/* Every InvalidOperand says why, in a sentence. */
		reason = cJSON_GetObjectItemCaseSensitive(err.params, "reason");
		ck_assert_msg(cJSON_IsString(reason) && strlen(reason->valuestring) > 10, "%s: no reason", bc->what);
		if (bc->reason_has != NULL) {
			ck_assert_msg(strstr(reason->valuestring, bc->reason_has) != NULL,
				      "%s: reason '%s' lacks '%s'", bc->what, reason->valuestring, bc->reason_has);
		}
	}
	/* A refused call leaves no half-filled descriptor behind. */
	for (size_t i = 0; i < desc_size; i++) {
		ck_assert_msg(((unsigned char *)desc)[i] == 0, "%s: descriptor not cleared", bc->what);
	}
	rp_error_clear(&err);
	cJSON_Delete(params);
}

static int gemm_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_gemm, p, d, e);
}

static int attention_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_attention, p, d, e);
}

static int attention_backward_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_attention_backward, p, d, e);
}

/* ---- Gemm -------------------------------------------------------------------------- */

/* D[64, 48] = A[64, 40] B[40, 48], each in its own buffer. */
static const char gemm_base[] =
	"{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [64, 40]},"
	" 'b': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [40, 48]},"
	" 'd': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]}}";

struct gemm_ok {
	const char *what;
	const char *patch;
	int64_t m, n, k;
};

static const struct gemm_ok gemm_ok_cases[] = {
	{ "plain A B", NULL, 64, 48, 40 },
	{ "A transposed", "{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [40, 64]}, 'trans_a': true}", 64, 48, 40 },
	{ "B transposed", "{'b': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [48, 40]}, 'trans_b': true}", 64, 48, 40 },
	{ "both transposed",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [40, 64]}, 'trans_a': true,"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [48, 40]}, 'trans_b': true}", 64, 48, 40 },
	{ "beta with its own c",
	  "{'c': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [64, 48]}, 'beta': 0.5, 'alpha': -2}", 64, 48, 40 },
	{ "c aliasing d exactly",
	  "{'c': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]}, 'beta': 1}", 64, 48, 40 },
	{ "bias epilogue", "{'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [48]}, 'epilogue': 'bias'}", 64, 48, 40 },
	{ "gelu without bias", "{'epilogue': 'gelu'}", 64, 48, 40 },
	{ "bf16 in, f32 out, gelu_bias",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [64, 40]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [40, 48]},"
	  " 'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [48]}, 'epilogue': 'gelu_bias'}", 64, 48, 40 },
	{ "padded leading dimensions",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [64, 40], 'strides': [64, 1]},"
	  " 'd': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48], 'strides': [50, 1]}}", 64, 48, 40 },
	{ "a and d side by side in one buffer",
	  "{'a': {'buffer': 'b0.1.9', 'dtype': 'f32', 'shape': [64, 40]},"
	  " 'd': {'buffer': 'b0.1.9', 'offset': 10240, 'dtype': 'f32', 'shape': [64, 48]}}", 64, 48, 40 },
	{ "dgelu with its aux", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 48]}, 'epilogue': 'dgelu'}", 64, 48, 40 },
	{ "dgelu with c, beta and a padded aux",
	  "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 48], 'strides': [56, 1]},"
	  " 'c': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]}, 'beta': 1, 'epilogue': 'dgelu'}", 64, 48, 40 },
	{ "bf16 dgelu, aux beside d in one buffer",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [64, 40]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [40, 48]},"
	  " 'd': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [64, 48]},"
	  " 'aux': {'buffer': 'b0.1.3', 'offset': 6144, 'dtype': 'bf16', 'shape': [64, 48]}, 'epilogue': 'dgelu'}",
	  64, 48, 40 },
	{ "tf32 with f32 inputs", "{'compute': 'tf32'}", 64, 48, 40 },
	{ "events", "{'wait_event': 'e0.1.5', 'signal_event': 'e0.1.6'}", 64, 48, 40 },
	{ "null optional fields", "{'c': null, 'bias': null, 'aux': null, 'beta': null, 'epilogue': null}", 64, 48, 40 },
	{ "a single element", "{'a': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [1, 1]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [1, 1]},"
	  " 'd': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [1, 1]}}", 1, 1, 1 },
};

START_TEST(gemm_accepts)
{
	const struct gemm_ok *gc = &gemm_ok_cases[_i];
	cJSON *params = patched(gemm_base, gc->patch);
	struct rp_error err = { 0 };
	struct rp_compute c;
	int r = rp_compute_parse(&rp_op_gemm, params, &c, &err);
	const struct rp_gemm g = c.gemm;

	ck_assert_msg(r == 0, "%s: refused with %s %s", gc->what, err.name ? err.name : "?",
		      err.params ? cJSON_PrintUnformatted(err.params) : "");
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(g.m, gc->m);
	ck_assert_int_eq(g.n, gc->n);
	ck_assert_int_eq(g.k, gc->k);
	cJSON_Delete(params);
}
END_TEST

START_TEST(gemm_fills_the_descriptor)
{
	/* Everything the backend needs, as given or defaulted. */
	cJSON *params = patched(gemm_base,
				"{'a': {'buffer': 'b0.1.1', 'offset': 256, 'dtype': 'f32', 'shape': [40, 64], 'strides': [72, 1]},"
				" 'trans_a': true, 'c': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]},"
				" 'alpha': 0.5, 'beta': 2, 'bias': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [48]},"
				" 'epilogue': 'gelu_bias', 'compute': 'tf32', 'signal_event': 'e1.7.3'}");
	struct rp_error err = { 0 };
	struct rp_compute c;
	const struct rp_gemm *g = &c.gemm;

	ck_assert_int_eq(rp_compute_parse(&rp_op_gemm, params, &c, &err), 0);
	ck_assert_ptr_eq(c.spec, &rp_op_gemm);
	ck_assert_int_eq(c.operands[RP_GEMM_A].offset, 256);
	ck_assert_int_eq(c.operands[RP_GEMM_A].strides[0], 72);
	ck_assert_int_eq(c.operands[RP_GEMM_D].strides[0], 48);   /* omitted strides: contiguous */
	ck_assert(g->trans_a && !g->trans_b);
	ck_assert(c.present[RP_GEMM_C] && c.present[RP_GEMM_BIAS]);
	ck_assert_double_eq(g->alpha, 0.5);
	ck_assert_double_eq(g->beta, 2.0);
	ck_assert_int_eq(g->epilogue, RP_EPILOGUE_GELU_BIAS);
	ck_assert_int_eq(g->compute, RP_COMPUTE_TF32);
	ck_assert(!c.wait_event.present);
	ck_assert(c.signal_event.present);
	ck_assert_int_eq(c.signal_event.id.kind, RP_ID_EVENT);
	ck_assert_int_eq(c.signal_event.id.device, 1);
	ck_assert_int_eq(c.signal_event.id.generation, 7);
	ck_assert_int_eq(c.signal_event.id.serial, 3);
	cJSON_Delete(params);

	/* Defaults: alpha 1, beta 0, no transposes, no epilogue, f32. */
	params = patched(gemm_base, NULL);
	ck_assert_int_eq(rp_compute_parse(&rp_op_gemm, params, &c, &err), 0);
	ck_assert_double_eq(g->alpha, 1.0);
	ck_assert_double_eq(g->beta, 0.0);
	ck_assert(!g->trans_a && !g->trans_b && !c.present[RP_GEMM_C] && !c.present[RP_GEMM_BIAS]);
	ck_assert_int_eq(g->epilogue, RP_EPILOGUE_NONE);
	ck_assert_int_eq(g->compute, RP_COMPUTE_F32);
	cJSON_Delete(params);
}
END_TEST

#define OPERAND RP_ERR_INVALID_OPERAND
#define PARAM RP_ERR_INVALID_PARAMETER

static const struct bad_case gemm_bad_cases[] = {
	{ "unknown field", "{'workspace': 1}", PARAM, "workspace", NULL },
	{ "d missing", "{'d': null}", PARAM, "d", NULL },
	{ "operand not an object", "{'a': [64, 40]}", PARAM, "a", NULL },
	{ "unknown operand field", "{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [64, 40], 'layout': 'row'}}",
	  PARAM, "a.layout", NULL },
	{ "buffer id is not one", "{'a': {'buffer': 'buf1', 'dtype': 'f32', 'shape': [64, 40]}}", OPERAND, "a", NULL },
	{ "mismatched K", "{'b': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [41, 48]}}", OPERAND, "b",
	  "K must agree (40 vs 41)" },
	{ "mismatched K after a transpose", "{'trans_b': true}", OPERAND, "b", "op(B) is [48, 40]" },
	{ "wrong d shape", "{'d': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 32]}}", OPERAND, "d",
	  "d is [64, 32] but op(A) op(B) is [64, 48]" },
	{ "d transposed", "{'d': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [48, 64]}}", OPERAND, "d", NULL },
	{ "wrong c shape", "{'c': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [64, 47]}, 'beta': 1}", OPERAND, "c",
	  "c is [64, 47]" },
	{ "a of rank 3", "{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [2, 64, 40]}}", OPERAND, "a", "rank 3" },
	{ "d of rank 1", "{'d': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [3072]}}", OPERAND, "d", "rank 1" },
	{ "bias of rank 2", "{'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [1, 48]}, 'epilogue': 'bias'}",
	  OPERAND, "bias", NULL },
	{ "bias of the wrong length", "{'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [64]}, 'epilogue': 'bias'}",
	  OPERAND, "bias", "[48]" },
	{ "a and b dtypes differ", "{'b': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [40, 48]}}", OPERAND, "b",
	  "b is f16 but a is f32" },
	{ "c and d dtypes differ", "{'c': {'buffer': 'b0.1.4', 'dtype': 'bf16', 'shape': [64, 48]}, 'beta': 1}",
	  OPERAND, "c", NULL },
	{ "bias dtype differs from d", "{'bias': {'buffer': 'b0.1.5', 'dtype': 'f16', 'shape': [48]}, 'epilogue': 'bias'}",
	  OPERAND, "bias", NULL },
	{ "beta without c", "{'beta': 0.5}", OPERAND, "c", "beta is 0.5" },
	{ "bias epilogue without bias", "{'epilogue': 'bias'}", OPERAND, "bias", NULL },
	{ "gelu_bias epilogue without bias", "{'epilogue': 'gelu_bias'}", OPERAND, "bias", NULL },
	{ "bias without a bias epilogue", "{'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [48]}}", OPERAND,
	  "bias", NULL },
	{ "unknown epilogue", "{'epilogue': 'relu'}", PARAM, "epilogue", NULL },
	{ "dgelu without aux", "{'epilogue': 'dgelu'}", OPERAND, "aux", "no aux was given" },
	{ "aux without an epilogue", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 48]}}", OPERAND, "aux", "does not read one" },
	{ "aux with gelu", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 48]}, 'epilogue': 'gelu'}", OPERAND, "aux", "epilogue gelu does not read one" },
	{ "dgelu with a bias",
	  "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 48]}, 'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [48]}, 'epilogue': 'dgelu'}", OPERAND, "bias",
	  "dgelu takes no bias" },
	{ "aux of the wrong shape", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 40]}, 'epilogue': 'dgelu'}",
	  OPERAND, "aux", "aux is [64, 40] but op(A) op(B) is [64, 48]" },
	{ "aux transposed", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [48, 64]}, 'epilogue': 'dgelu'}",
	  OPERAND, "aux", NULL },
	{ "aux of rank 1", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [3072]}, 'epilogue': 'dgelu'}",
	  OPERAND, "aux", "rank 1" },
	{ "aux dtype differs from d", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'bf16', 'shape': [64, 48]}, 'epilogue': 'dgelu'}",
	  OPERAND, "aux", "aux is bf16 but d is f32" },
	{ "aux rows overlapping",
	  "{'aux': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [64, 48], 'strides': [47, 1]}, 'epilogue': 'dgelu'}",
	  OPERAND, "aux", "row stride is 47" },
	{ "d overlapping aux", "{'aux': {'buffer': 'b0.1.3', 'offset': 64, 'dtype': 'f32', 'shape': [64, 48]},"
	  " 'epilogue': 'dgelu'}", OPERAND, "d", "overlaps aux" },
	{ "d aliasing aux exactly", "{'aux': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]}, 'epilogue': 'dgelu'}",
	  OPERAND, "d", "overlaps aux" },
	{ "tf32 with bf16 inputs",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [64, 40]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [40, 48]}, 'compute': 'tf32'}", PARAM, "compute", NULL },
	{ "unknown compute mode", "{'compute': 'fp8'}", PARAM, "compute", NULL },
	{ "fp8_fast_accum with f32 inputs", "{'compute': 'fp8_fast_accum'}", PARAM, "compute", NULL },
	{ "alpha a string", "{'alpha': '1.0'}", PARAM, "alpha", NULL },
	{ "alpha infinite", "{'alpha': 1e999}", PARAM, "alpha", NULL },
	{ "beta infinite", "{'beta': -1e999, 'c': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [64, 48]}}", PARAM,
	  "beta", NULL },
	{ "trans_a not a bool", "{'trans_a': 1}", PARAM, "trans_a", NULL },
	{ "d overlapping a in one buffer",
	  "{'a': {'buffer': 'b0.1.9', 'dtype': 'f32', 'shape': [64, 40]},"
	  " 'd': {'buffer': 'b0.1.9', 'offset': 10236, 'dtype': 'f32', 'shape': [64, 48]}}", OPERAND, "d", "overlaps a" },
	{ "d overlapping b", "{'d': {'buffer': 'b0.1.2', 'offset': 4, 'dtype': 'f32', 'shape': [64, 48]}}", OPERAND, "d",
	  "overlaps b" },
	{ "d overlapping bias",
	  "{'bias': {'buffer': 'b0.1.3', 'offset': 64, 'dtype': 'f32', 'shape': [48]}, 'epilogue': 'bias'}", OPERAND,
	  "d", "overlaps bias" },
	{ "c overlapping d but not the same tensor",
	  "{'c': {'buffer': 'b0.1.3', 'offset': 4, 'dtype': 'f32', 'shape': [64, 48]}, 'beta': 1}", OPERAND, "c",
	  "alias d only exactly" },
	{ "c aliasing d with other strides",
	  "{'c': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48], 'strides': [49, 1]}, 'beta': 1}", OPERAND, "c",
	  NULL },
	{ "last stride not 1", "{'a': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [64, 40], 'strides': [80, 2]}}",
	  OPERAND, "a", "last stride is 2" },
	{ "rows overlapping", "{'b': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [40, 48], 'strides': [47, 1]}}",
	  OPERAND, "b", "row stride is 47" },
	{ "wait_event a buffer id", "{'wait_event': 'b0.1.5'}", PARAM, "wait_event", NULL },
	{ "wait_event malformed", "{'wait_event': 'e0.1'}", PARAM, "wait_event", NULL },
	{ "signal_event of generation 0", "{'signal_event': 'e0.0.1'}", PARAM, "signal_event", NULL },
	{ "signal_event with a leading zero", "{'signal_event': 'e0.01.1'}", PARAM, "signal_event", NULL },
	{ "wait_event not a string", "{'wait_event': 5}", PARAM, "wait_event", NULL },
	{ "wait_event empty", "{'wait_event': ''}", PARAM, "wait_event", NULL },
};

START_TEST(gemm_refuses)
{
	struct rp_compute c;

	expect_bad(gemm_base, &gemm_bad_cases[_i], gemm_parse_any, &c, sizeof(c));
}
END_TEST

START_TEST(gemm_refuses_parameters_that_are_not_an_object)
{
	cJSON *params = json("[1, 2]");
	struct rp_error err = { 0 };
	struct rp_compute c;

	ck_assert_int_lt(rp_compute_parse(&rp_op_gemm, params, &c, &err), 0);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_PARAMETER);
	rp_error_clear(&err);
	cJSON_Delete(params);
}
END_TEST

/* ---- Attention ------------------------------------------------------------------------ */

/* B=2, H=4, Sq=16, Skv=24, D=32, Dv=8, f16. */
#define ATT_QKVO \
	"'q': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [2, 4, 16, 32]}," \
	" 'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 4, 24, 32]}," \
	" 'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 4, 24, 8]}," \
	" 'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 16, 8]}"

static const char attention_base[] = "{" ATT_QKVO "}";

/* Valid halves of a pair of sequence lengths, beside the half a row gets
 * wrong. */
#define GOOD_LEN_Q "'seq_len_q': {'buffer': 'b0.1.6', 'dtype': 'i32', 'shape': [2]}"
#define GOOD_LEN_KV "'seq_len_kv': {'buffer': 'b0.1.7', 'dtype': 'i32', 'shape': [2]}"

START_TEST(attention_accepts_and_derives)
{
	cJSON *params = patched(attention_base, NULL);
	struct rp_error err = { 0 };
	struct rp_compute c;
	const struct rp_attention *a = &c.attention;

	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert_int_eq(a->batch, 2);
	ck_assert_int_eq(a->heads, 4);
	ck_assert_int_eq(a->heads_kv, 4);
	ck_assert_int_eq(a->seq_q, 16);
	ck_assert_int_eq(a->seq_kv, 24);
	ck_assert_int_eq(a->head_dim, 32);
	ck_assert_int_eq(a->head_dim_v, 8);
	ck_assert(!a->causal && !c.present[RP_ATT_STATS]);
	ck_assert_int_eq(a->alignment, RP_CAUSAL_TOP_LEFT);
	/* scale defaults to 1/sqrt(D). */
	ck_assert_double_eq_tol(a->scale, 1.0 / sqrt(32.0), 1e-15);
	cJSON_Delete(params);

	params = patched(attention_base,
			 "{'stats': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [2, 4, 16]}, 'causal': true,"
			 " 'scale': 0.25, 'wait_event': 'e0.1.9', 'causal_alignment': 'bottom_right'}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert(a->causal && c.present[RP_ATT_STATS] && c.wait_event.present && !c.signal_event.present);
	ck_assert_int_eq(a->alignment, RP_CAUSAL_BOTTOM_RIGHT);
	ck_assert_double_eq(a->scale, 0.25);
	ck_assert_int_eq(c.operands[RP_ATT_STATS].shape[2], 16);
	cJSON_Delete(params);

	/* Grouped-query: 4 query heads over 2 key/value heads, and
	 * multi-query: over 1. */
	params = patched(attention_base, "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 2, 24, 32]},"
					 " 'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 2, 24, 8]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert_int_eq(a->heads, 4);
	ck_assert_int_eq(a->heads_kv, 2);
	cJSON_Delete(params);
	params = patched(attention_base, "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 1, 24, 32]},"
					 " 'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 1, 24, 8]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert_int_eq(a->heads_kv, 1);
	cJSON_Delete(params);

	/* Everything in one buffer, side by side, with padded rows. */
	params = json("{'q': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [1, 2, 3, 4], 'strides': [64, 32, 8, 1]},"
		      " 'k': {'buffer': 'b0.1.1', 'offset': 128, 'dtype': 'bf16', 'shape': [1, 2, 5, 4]},"
		      " 'v': {'buffer': 'b0.1.1', 'offset': 256, 'dtype': 'bf16', 'shape': [1, 2, 5, 6]},"
		      " 'o': {'buffer': 'b0.1.1', 'offset': 384, 'dtype': 'bf16', 'shape': [1, 2, 3, 6]},"
		      " 'stats': {'buffer': 'b0.1.1', 'offset': 512, 'dtype': 'f32', 'shape': [1, 2, 3]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert_int_eq(a->seq_kv, 5);
	ck_assert_int_eq(a->head_dim_v, 6);
	ck_assert_ptr_null(err.name);
	cJSON_Delete(params);

	/* Sequence lengths, i32 [B], both in one buffer; with them a
	 * bottom-right mask may have Sq > Skv (the lengths decide). */
	params = patched(attention_base, "{'seq_len_q': {'buffer': 'b0.1.6', 'dtype': 'i32', 'shape': [2]},"
					 " 'seq_len_kv': {'buffer': 'b0.1.6', 'offset': 8, 'dtype': 'i32', 'shape': [2]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert(a->padded && c.present[RP_ATT_SEQ_LEN_Q] && c.present[RP_ATT_SEQ_LEN_KV]);
	ck_assert_int_eq(c.operands[RP_ATT_SEQ_LEN_KV].offset, 8);
	cJSON_Delete(params);
	params = patched(attention_base, "{'q': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [2, 4, 30, 32]},"
					 " 'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 30, 8]},"
					 " 'causal': true, 'causal_alignment': 'bottom_right',"
					 " " GOOD_LEN_Q ", " GOOD_LEN_KV "}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert(a->padded && a->seq_q == 30 && a->seq_kv == 24);
	cJSON_Delete(params);
	params = patched(attention_base, NULL);
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention, params, &c, &err), 0);
	ck_assert(!a->padded);
	cJSON_Delete(params);
}
END_TEST

static const struct bad_case attention_bad_cases[] = {
	{ "unknown field", "{'dropout': 0.1}", PARAM, "dropout", NULL },
	{ "o broadcast over heads and rows (elements share memory)",
	  "{'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 16, 8], 'strides': [0, 0, 0, 1]}}", OPERAND, "o",
	  "share memory" },
	{ "stats of both batches on one address", "{'stats': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [2, 4, 16], 'strides': [0, 16, 1]}}",
	  OPERAND, "stats", "share memory" },
	{ "o missing", "{'o': null}", PARAM, "o", NULL },
	{ "q of rank 3", "{'q': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [8, 16, 32]}}", OPERAND, "q", "rank 3" },
	{ "k head_dim differs from q", "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 4, 24, 16]}}", OPERAND,
	  "k", "[2, 4, 24, 32]" },
	{ "k batch differs from q", "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [1, 4, 24, 32]}}", OPERAND, "k",
	  NULL },
	{ "v sequence differs from k", "{'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 4, 20, 8]}}", OPERAND,
	  "v", "[2, 4, 24, 8]" },
	{ "v heads differ", "{'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 2, 24, 8]}}", OPERAND, "v", NULL },
	{ "o head_dim not v's", "{'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 16, 32]}}", OPERAND, "o",
	  "[2, 4, 16, 8]" },
	{ "o sequence not q's", "{'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 24, 8]}}", OPERAND, "o",
	  NULL },
	{ "k dtype differs", "{'k': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [2, 4, 24, 32]}}", OPERAND, "k",
	  "k is bf16 but q is f16" },
	{ "o dtype differs", "{'o': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [2, 4, 16, 8]}}", OPERAND, "o", NULL },
	{ "stats not f32", "{'stats': {'buffer': 'b0.1.5', 'dtype': 'f16', 'shape': [2, 4, 16]}}", OPERAND, "stats",
	  "must be f32" },
	{ "stats of Skv rows", "{'stats': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [2, 4, 24]}}", OPERAND, "stats",
	  "[2, 4, 16]" },
	{ "stats of rank 4", "{'stats': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [2, 4, 16, 1]}}", OPERAND,
	  "stats", NULL },
	{ "scale zero", "{'scale': 0}", PARAM, "scale", NULL },
	{ "scale negative", "{'scale': -0.125}", PARAM, "scale", NULL },
	{ "scale infinite", "{'scale': 1e400}", PARAM, "scale", NULL },
	{ "causal not a bool", "{'causal': 'yes'}", PARAM, "causal", NULL },
	{ "v last stride not 1",
	  "{'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 4, 24, 8], 'strides': [1536, 384, 16, 2]}}", OPERAND,
	  "v", "last stride" },
	{ "o overlapping q", "{'o': {'buffer': 'b0.1.1', 'offset': 2048, 'dtype': 'f16', 'shape': [2, 4, 16, 8]}}",
	  OPERAND, "o", "overlaps q" },
	{ "o overlapping v", "{'o': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 4, 16, 8]}}", OPERAND, "o",
	  "overlaps v" },
	{ "stats overlapping o", "{'stats': {'buffer': 'b0.1.4', 'offset': 8, 'dtype': 'f32', 'shape': [2, 4, 16]}}",
	  OPERAND, "stats", "overlaps o" },
	{ "bad signal_event", "{'signal_event': 'e0.1.x'}", PARAM, "signal_event", NULL },
	{ "k heads not dividing q's",
	  "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 3, 24, 32]},"
	  " 'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 3, 24, 8]}}", OPERAND, "k", "does not divide" },
	{ "v heads not k's under GQA",
	  "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 2, 24, 32]}}", OPERAND, "v", "[2, 2, 24, 8]" },
	{ "unknown causal alignment", "{'causal': true, 'causal_alignment': 'center'}", PARAM, "causal_alignment",
	  NULL },
	{ "bottom-right with more queries than keys",
	  "{'q': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [2, 4, 30, 32]},"
	  " 'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 30, 8]},"
	  " 'causal': true, 'causal_alignment': 'bottom_right'}", OPERAND, "q", "no key" },
	{ "seq_len_q without seq_len_kv", "{'seq_len_q': {'buffer': 'b0.1.6', 'dtype': 'i32', 'shape': [2]}}", OPERAND,
	  "seq_len_kv", "come in pairs" },
	{ "seq_len_kv without seq_len_q", "{'seq_len_kv': {'buffer': 'b0.1.6', 'dtype': 'i32', 'shape': [2]}}", OPERAND,
	  "seq_len_q", "full length 16" },
	{ "seq_len_q of f32",
	  "{'seq_len_q': {'buffer': 'b0.1.6', 'dtype': 'f32', 'shape': [2]}, " GOOD_LEN_KV "}",
	  OPERAND, "seq_len_q", "must be i32" },
	{ "seq_len_kv of another batch",
	  "{" GOOD_LEN_Q ", 'seq_len_kv': {'buffer': 'b0.1.7', 'dtype': 'i32', 'shape': [3]}}",
	  OPERAND, "seq_len_kv", "[B] = [2]" },
	{ "seq_len_q of rank 4 ([B, 1, 1, 1], cuDNN's own shape, is not the protocol's)",
	  "{'seq_len_q': {'buffer': 'b0.1.6', 'dtype': 'i32', 'shape': [2, 1, 1, 1]}, " GOOD_LEN_KV "}",
	  OPERAND, "seq_len_q", "rank 1" },
	{ "seq_len_q strided",
	  "{'seq_len_q': {'buffer': 'b0.1.6', 'dtype': 'i32', 'shape': [2], 'strides': [2]}, " GOOD_LEN_KV "}",
	  OPERAND, "seq_len_q", "last stride" },
	{ "seq_len_q misaligned",
	  "{'seq_len_q': {'buffer': 'b0.1.6', 'offset': 2, 'dtype': 'i32', 'shape': [2]}, " GOOD_LEN_KV "}",
	  OPERAND, "seq_len_q", "misaligned" },
	{ "o over seq_len_kv",
	  "{" GOOD_LEN_Q ", 'seq_len_kv': {'buffer': 'b0.1.4', 'offset': 16, 'dtype': 'i32', 'shape': [2]}}",
	  OPERAND, "o", "overlaps seq_len_kv" },
	{ "q of i32", "{'q': {'buffer': 'b0.1.1', 'dtype': 'i32', 'shape': [2, 4, 16, 32]}}", OPERAND, "q", NULL },
};

START_TEST(attention_refuses)
{
	struct rp_compute c;

	expect_bad(attention_base, &attention_bad_cases[_i], attention_parse_any, &c, sizeof(c));
}
END_TEST

/* ---- AttentionBackward --------------------------------------------------------------- */

static const char attention_backward_base[] =
	"{" ATT_QKVO ","
	" 'd_o': {'buffer': 'b0.1.6', 'dtype': 'f16', 'shape': [2, 4, 16, 8]},"
	" 'stats': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [2, 4, 16]},"
	" 'd_q': {'buffer': 'b0.1.7', 'dtype': 'f16', 'shape': [2, 4, 16, 32]},"
	" 'd_k': {'buffer': 'b0.1.8', 'dtype': 'f16', 'shape': [2, 4, 24, 32]},"
	" 'd_v': {'buffer': 'b0.1.9', 'dtype': 'f16', 'shape': [2, 4, 24, 8]}}";

START_TEST(attention_backward_accepts_and_derives)
{
	cJSON *params = patched(attention_backward_base, "{'causal': true, 'scale': 0.5, 'signal_event': 'e0.1.2'}");
	struct rp_error err = { 0 };
	struct rp_compute c;
	const struct rp_attention *a = &c.attention;

	ck_assert_int_eq(rp_compute_parse(&rp_op_attention_backward, params, &c, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(a->batch, 2);
	ck_assert_int_eq(a->heads, 4);
	ck_assert_int_eq(a->seq_q, 16);
	ck_assert_int_eq(a->seq_kv, 24);
	ck_assert_int_eq(a->head_dim, 32);
	ck_assert_int_eq(a->head_dim_v, 8);
	ck_assert(a->causal && c.signal_event.present);
	ck_assert_double_eq(a->scale, 0.5);
	cJSON_Delete(params);

	params = patched(attention_backward_base, NULL);
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention_backward, params, &c, &err), 0);
	ck_assert_double_eq_tol(a->scale, 1.0 / sqrt(32.0), 1e-15);
	ck_assert(!a->padded);
	cJSON_Delete(params);

	params = patched(attention_backward_base, "{'seq_len_q': {'buffer': 'b0.1.10', 'dtype': 'i32', 'shape': [2]},"
						  " 'seq_len_kv': {'buffer': 'b0.1.10', 'dtype': 'i32', 'shape': [2]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_attention_backward, params, &c, &err), 0);
	ck_assert(a->padded && c.present[RP_ATB_SEQ_LEN_Q] && c.present[RP_ATB_SEQ_LEN_KV]);
	cJSON_Delete(params);
}
END_TEST

static const struct bad_case attention_backward_bad_cases[] = {
	{ "stats missing", "{'stats': null}", PARAM, "stats", NULL },
	{ "d_v rows overlapping each other",
	  "{'d_v': {'buffer': 'b0.1.9', 'dtype': 'f16', 'shape': [2, 4, 24, 8], 'strides': [768, 192, 4, 1]}}", OPERAND,
	  "d_v", "share memory" },
	{ "d_o missing", "{'d_o': null}", PARAM, "d_o", NULL },
	{ "unknown field", "{'stats_dtype': 'f32'}", PARAM, "stats_dtype", NULL },
	{ "k inconsistent with q", "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 4, 24, 64]}}", OPERAND, "k",
	  NULL },
	{ "d_q shaped like k", "{'d_q': {'buffer': 'b0.1.7', 'dtype': 'f16', 'shape': [2, 4, 24, 32]}}", OPERAND, "d_q",
	  "shaped like q" },
	{ "d_o shaped unlike o", "{'d_o': {'buffer': 'b0.1.6', 'dtype': 'f16', 'shape': [2, 4, 16, 32]}}", OPERAND,
	  "d_o", NULL },
	{ "d_v shaped unlike v", "{'d_v': {'buffer': 'b0.1.9', 'dtype': 'f16', 'shape': [2, 4, 24, 32]}}", OPERAND,
	  "d_v", NULL },
	{ "d_k dtype differs", "{'d_k': {'buffer': 'b0.1.8', 'dtype': 'f32', 'shape': [2, 4, 24, 32]}}", OPERAND, "d_k",
	  NULL },
	{ "stats not f32", "{'stats': {'buffer': 'b0.1.5', 'dtype': 'bf16', 'shape': [2, 4, 16]}}", OPERAND, "stats",
	  NULL },
	{ "d_v over v", "{'d_v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 4, 24, 8]}}", OPERAND, "d_v",
	  "overlaps v" },
	{ "d_k overlapping d_q",
	  "{'d_k': {'buffer': 'b0.1.7', 'offset': 4094, 'dtype': 'f16', 'shape': [2, 4, 24, 32]}}", OPERAND, "d_k",
	  "overlaps d_q" },
	{ "d_k shaped like k of another group",
	  "{'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 2, 24, 32]},"
	  " 'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 2, 24, 8]},"
	  " 'd_v': {'buffer': 'b0.1.9', 'dtype': 'f16', 'shape': [2, 2, 24, 8]}}", OPERAND, "d_k", "shaped like k" },
	{ "d_k overlapping stats", "{'stats': {'buffer': 'b0.1.8', 'dtype': 'f32', 'shape': [2, 4, 16]}}", OPERAND,
	  "d_k", "overlaps stats" },
	{ "d_q overlapping d_o", "{'d_o': {'buffer': 'b0.1.7', 'offset': 8190, 'dtype': 'f16', 'shape': [2, 4, 16, 8]}}",
	  OPERAND, "d_q", "overlaps d_o" },
	{ "scale negative", "{'scale': -1}", PARAM, "scale", NULL },
	{ "seq_len_kv alone", "{'seq_len_kv': {'buffer': 'b0.1.10', 'dtype': 'i32', 'shape': [2]}}", OPERAND,
	  "seq_len_q", "come in pairs" },
	{ "d_k over seq_len_q",
	  "{'seq_len_q': {'buffer': 'b0.1.8', 'dtype': 'i32', 'shape': [2]},"
	  " 'seq_len_kv': {'buffer': 'b0.1.10', 'dtype': 'i32', 'shape': [2]}}", OPERAND, "d_k", "overlaps seq_len_q" },
	{ "seq_len_q of another batch",
	  "{'seq_len_q': {'buffer': 'b0.1.10', 'dtype': 'i32', 'shape': [1]},"
	  " 'seq_len_kv': {'buffer': 'b0.1.10', 'offset': 8, 'dtype': 'i32', 'shape': [2]}}", OPERAND, "seq_len_q",
	  NULL },
};

START_TEST(attention_backward_refuses)
{
	struct rp_compute c;

	expect_bad(attention_backward_base, &attention_backward_bad_cases[_i], attention_backward_parse_any, &c,
		   sizeof(c));
}
END_TEST

START_TEST(backward_outputs_side_by_side_are_fine)
{
	/* Outputs in one buffer are fine as long as their bytes differ:
	 * d_q [2,4,16,32] f16 is 8192 bytes, d_k follows it. */
	cJSON *params = patched(attention_backward_base,
				"{'d_k': {'buffer': 'b0.1.7', 'offset': 8192, 'dtype': 'f16', 'shape': [2, 4, 24, 32]}}");
	struct rp_error err = { 0 };
	struct rp_compute c;

	ck_assert_int_eq(rp_compute_parse(&rp_op_attention_backward, params, &c, &err), 0);
	cJSON_Delete(params);
}
END_TEST

/* q's, k's and v's gradients side by side in one [B, S, 3, H, D] buffer
 * (B 2, S 16, H 4, D 32, f16): strides [S*3*H*D, D, 3*H*D, 1], each a
 * head's row apart. */
#define PACKED(name, offset, strides)                                                                 \
	" '" name "': {'buffer': 'b0.1.7', 'offset': " offset ", 'dtype': 'f16', 'shape': [2, 4, 16, 32]," \
	" 'strides': " strides "}"
#define PACKED_STRIDES "[6144, 32, 384, 1]"
#define PACKED_BASE                                                                                   \
	"{'q': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [2, 4, 16, 32]},"                        \
	" 'k': {'buffer': 'b0.1.2', 'dtype': 'f16', 'shape': [2, 4, 16, 32]},"                        \
	" 'v': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [2, 4, 16, 32]},"                        \
	" 'o': {'buffer': 'b0.1.4', 'dtype': 'f16', 'shape': [2, 4, 16, 32]},"                        \
	" 'd_o': {'buffer': 'b0.1.6', 'dtype': 'f16', 'shape': [2, 4, 16, 32]},"                      \
	" 'stats': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [2, 4, 16]},"

START_TEST(backward_outputs_interleaved_without_sharing_are_fine)
{
	/* Byte ranges intersect, elements never do: 256 bytes is 4 heads' rows
	 * of 32, exactly what no index difference within the shape makes. */
	cJSON *params = json(PACKED_BASE PACKED("d_q", "0", PACKED_STRIDES) "," PACKED("d_k", "256", PACKED_STRIDES)
				 "," PACKED("d_v", "512", PACKED_STRIDES) "}");
	struct rp_error err = { 0 };
	struct rp_compute c;

	ck_assert_int_eq(rp_compute_parse(&rp_op_attention_backward, params, &c, &err), 0);
	cJSON_Delete(params);
}
END_TEST

static const struct bad_case interleaved_bad_cases[] = {
	/* One element apart: d_q's (0, 0, 0, 1) is d_k's (0, 0, 0, 0). */
	{ "d_k one element after d_q", "{" PACKED("d_k", "2", PACKED_STRIDES) "}", OPERAND, "d_k", "overlaps d_q" },
	/* A head's row apart: d_q's head 1 is d_k's head 0. */
	{ "d_k one head after d_q", "{" PACKED("d_k", "64", PACKED_STRIDES) "}", OPERAND, "d_k", "overlaps d_q" },
	/* A whole row of the sequence apart: d_q's row 1 is d_k's row 0. */
	{ "d_k one sequence row after d_q", "{" PACKED("d_k", "768", PACKED_STRIDES) "}", OPERAND, "d_k",
	  "overlaps d_q" },
	/* Half an element apart: never even taken as an operand. */
	{ "d_k half an element after d_q", "{" PACKED("d_k", "257", PACKED_STRIDES) "}", OPERAND, "d_k",
	  "misaligned" },
	/* Laid out differently (contiguous inside d_q's bytes): judged by byte
	 * ranges, as before. */
	{ "d_k laid out otherwise", "{" PACKED("d_k", "256", "[2048, 512, 32, 1]") "}", OPERAND, "d_k",
	  "overlaps d_q" },
};

static const char interleaved_base[] = PACKED_BASE PACKED("d_q", "0", PACKED_STRIDES) ","
	PACKED("d_k", "256", PACKED_STRIDES) "," PACKED("d_v", "512", PACKED_STRIDES) "}";

START_TEST(backward_outputs_interleaved_and_sharing_are_refused)
{
	struct rp_compute c;

	expect_bad(interleaved_base, &interleaved_bad_cases[_i], attention_backward_parse_any, &c, sizeof(c));
}
END_TEST

/* ---- LayerNorm ---------------------------------------------------------------------- */

/* x [6, 40] bf16 with rows padded to 48, in buffers of their own. */
static const char layer_norm_base[] =
	"{'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [48, 1]},"
	" 'weight': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [40]},"
	" 'bias': {'buffer': 'b0.1.2', 'offset': 80, 'dtype': 'bf16', 'shape': [40]},"
	" 'y': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [6, 40]},"
	" 'mean': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [6]},"
	" 'rstd': {'buffer': 'b0.1.4', 'offset': 24, 'dtype': 'f32', 'shape': [6]}}";

static int layer_norm_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_layer_norm, p, d, e);
}

static int layer_norm_backward_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_layer_norm_backward, p, d, e);
}

START_TEST(layer_norm_accepts_and_derives)
{
	cJSON *params = patched(layer_norm_base, "{'eps': 0.001, 'wait_event': 'e0.1.9', 'deadline_ms': 500}");
	struct rp_error err = { 0 };
	struct rp_compute c, again;

	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm, params, &c, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(c.layer_norm.rows, 6);
	ck_assert_int_eq(c.layer_norm.n, 40);
	ck_assert_double_eq(c.layer_norm.eps, 0.001);
	ck_assert(c.wait_event.present && c.deadline_ms == 500);
	ck_assert(c.present[RP_LN_BIAS] && c.present[RP_LN_MEAN] && c.present[RP_LN_RSTD]);
	ck_assert_int_eq(c.operands[RP_LN_X].strides[0], 48);
	/* What a client encodes parses to the same call. */
	cJSON *sent = rp_compute_to_json(&c);
	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm, sent, &again, &err), 0);
	ck_assert_double_eq(again.layer_norm.eps, 0.001);
	ck_assert_mem_eq(again.operands, c.operands, sizeof(c.operands));
	cJSON_Delete(sent);
	cJSON_Delete(params);

	/* Only x, weight and y: eps is the default; one element a row. */
	params = patched(layer_norm_base, "{'bias': null, 'mean': null, 'rstd': null,"
					  " 'x': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [3, 1]},"
					  " 'weight': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [1]},"
					  " 'y': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [3, 1], 'strides': [5, 1]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm, params, &c, &err), 0);
	ck_assert_double_eq(c.layer_norm.eps, RP_LAYER_NORM_EPS_DEFAULT);
	ck_assert(!c.present[RP_LN_BIAS] && !c.present[RP_LN_MEAN] && !c.present[RP_LN_RSTD]);
	ck_assert_int_eq(c.layer_norm.rows, 3);
	ck_assert_int_eq(c.layer_norm.n, 1);
	cJSON_Delete(params);

	/* The longest row, and one buffer for everything, apart. */
	params = patched(layer_norm_base, "{'bias': null,"
					  " 'x': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [1, 65536]},"
					  " 'weight': {'buffer': 'b0.1.1', 'offset': 131072, 'dtype': 'f16', 'shape': [65536]},"
					  " 'y': {'buffer': 'b0.1.1', 'offset': 262144, 'dtype': 'f16', 'shape': [1, 65536]},"
					  " 'mean': {'buffer': 'b0.1.1', 'offset': 393216, 'dtype': 'f32', 'shape': [1]},"
					  " 'rstd': {'buffer': 'b0.1.1', 'offset': 393220, 'dtype': 'f32', 'shape': [1]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm, params, &c, &err), 0);
	ck_assert_int_eq(c.layer_norm.n, RP_LAYER_NORM_N_MAX);
	cJSON_Delete(params);
}
END_TEST

static const struct bad_case layer_norm_bad_cases[] = {
	{ "x missing", "{'x': null}", PARAM, "x", NULL },
	{ "weight missing", "{'weight': null}", PARAM, "weight", NULL },
	{ "y missing", "{'y': null}", PARAM, "y", NULL },
	{ "unknown field", "{'epsilon': 0.1}", PARAM, "epsilon", NULL },
	{ "eps zero", "{'eps': 0}", PARAM, "eps", NULL },
	{ "eps negative", "{'eps': -1e-5}", PARAM, "eps", NULL },
	{ "eps infinite", "{'eps': 1e999}", PARAM, "eps", NULL },
	{ "eps a string", "{'eps': 'small'}", PARAM, "eps", NULL },
	{ "x rank 3", "{'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [2, 3, 40]}}", OPERAND, "x", "rank" },
	{ "x i32", "{'x': {'buffer': 'b0.1.1', 'dtype': 'i32', 'shape': [6, 40]}}", OPERAND, "x", NULL },
	{ "x's last stride 2", "{'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [80, 2]}}",
	  OPERAND, "x", "last stride" },
	{ "x's rows overlapping", "{'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [39, 1]}}",
	  OPERAND, "x", "row stride" },
	{ "x's row longer than the limit", "{'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [1, 65537]}}", OPERAND,
	  "x", "at most 65536" },
	{ "weight of another dtype", "{'weight': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [40]}}", OPERAND,
	  "weight", "share a dtype" },
	{ "weight of another length", "{'weight': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [48]}}", OPERAND,
	  "weight", "[40]" },
	{ "weight a matrix", "{'weight': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [1, 40]}}", OPERAND, "weight",
	  "rank" },
	{ "weight strided", "{'weight': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [40], 'strides': [2]}}",
	  OPERAND, "weight", "last stride" },
	{ "bias of another length", "{'bias': {'buffer': 'b0.1.2', 'offset': 80, 'dtype': 'bf16', 'shape': [6]}}",
	  OPERAND, "bias", NULL },
	{ "bias of another dtype", "{'bias': {'buffer': 'b0.1.2', 'offset': 80, 'dtype': 'f16', 'shape': [40]}}",
	  OPERAND, "bias", NULL },
	{ "y of another dtype", "{'y': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [6, 40]}}", OPERAND, "y", NULL },
	{ "y shaped unlike x", "{'y': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [40, 6]}}", OPERAND, "y",
	  "shaped like x" },
	{ "mean bf16", "{'mean': {'buffer': 'b0.1.4', 'dtype': 'bf16', 'shape': [6]}}", OPERAND, "mean", "f32" },
	{ "mean one per column", "{'mean': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [40]}}", OPERAND, "mean",
	  "one element per row" },
	{ "rstd of another length", "{'rstd': {'buffer': 'b0.1.4', 'offset': 24, 'dtype': 'f32', 'shape': [7]}}",
	  OPERAND, "rstd", NULL },
	{ "y over x", "{'y': {'buffer': 'b0.1.1', 'offset': 16, 'dtype': 'bf16', 'shape': [6, 40]}}", OPERAND, "y",
	  "overlaps x" },
	{ "y is x", "{'y': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [48, 1]}}", OPERAND, "y",
	  "overlaps x" },
	{ "rstd over mean", "{'rstd': {'buffer': 'b0.1.4', 'offset': 20, 'dtype': 'f32', 'shape': [6]}}", OPERAND,
	  "rstd", "overlaps mean" },
	{ "mean over bias", "{'mean': {'buffer': 'b0.1.2', 'offset': 152, 'dtype': 'f32', 'shape': [6]}}", OPERAND,
	  "mean", "overlaps bias" },
	{ "y's elements sharing memory", "{'y': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [0, 1]}}",
	  OPERAND, "y", NULL },
	{ "wait_event a buffer id", "{'wait_event': 'b0.1.9'}", PARAM, "wait_event", NULL },
	{ "deadline_ms 0", "{'deadline_ms': 0}", PARAM, "deadline_ms", NULL },
};

START_TEST(layer_norm_refuses)
{
	struct rp_compute c;

	expect_bad(layer_norm_base, &layer_norm_bad_cases[_i], layer_norm_parse_any, &c, sizeof(c));
}
END_TEST

/* The backward of layer_norm_base's call, d_y and d_x contiguous. */
static const char layer_norm_backward_base[] =
	"{'d_y': {'buffer': 'b0.1.5', 'dtype': 'bf16', 'shape': [6, 40]},"
	" 'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [48, 1]},"
	" 'weight': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [40]},"
	" 'mean': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [6]},"
	" 'rstd': {'buffer': 'b0.1.4', 'offset': 24, 'dtype': 'f32', 'shape': [6]},"
	" 'd_x': {'buffer': 'b0.1.6', 'dtype': 'bf16', 'shape': [6, 40]},"
	" 'd_weight': {'buffer': 'b0.1.7', 'dtype': 'bf16', 'shape': [40]},"
	" 'd_bias': {'buffer': 'b0.1.7', 'offset': 80, 'dtype': 'bf16', 'shape': [40]},"
	" 'd_residual': {'buffer': 'b0.1.8', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [64, 1]}}";

START_TEST(layer_norm_backward_accepts_and_derives)
{
	cJSON *params = patched(layer_norm_backward_base, "{'signal_event': 'e0.1.3'}");
	struct rp_error err = { 0 };
	struct rp_compute c;

	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm_backward, params, &c, &err), 0);
	ck_assert_int_eq(c.layer_norm.rows, 6);
	ck_assert_int_eq(c.layer_norm.n, 40);
	ck_assert_double_eq(c.layer_norm.eps, 0.0);
	ck_assert(c.signal_event.present && c.present[RP_LNB_DRESIDUAL] && c.present[RP_LNB_DWEIGHT]);
	cJSON_Delete(params);

	/* Only what it needs. */
	params = patched(layer_norm_backward_base, "{'d_weight': null, 'd_bias': null, 'd_residual': null}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm_backward, params, &c, &err), 0);
	ck_assert(!c.present[RP_LNB_DWEIGHT] && !c.present[RP_LNB_DBIAS] && !c.present[RP_LNB_DRESIDUAL]);
	cJSON_Delete(params);

	/* d_x in place of d_residual: the same tensor exactly. */
	params = patched(layer_norm_backward_base,
			 "{'d_x': {'buffer': 'b0.1.8', 'dtype': 'bf16', 'shape': [6, 40], 'strides': [64, 1]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_layer_norm_backward, params, &c, &err), 0);
	cJSON_Delete(params);
}
END_TEST

static const struct bad_case layer_norm_backward_bad_cases[] = {
	{ "d_y missing", "{'d_y': null}", PARAM, "d_y", NULL },
	{ "mean missing", "{'mean': null}", PARAM, "mean", NULL },
	{ "rstd missing", "{'rstd': null}", PARAM, "rstd", NULL },
	{ "d_x missing", "{'d_x': null}", PARAM, "d_x", NULL },
	{ "eps given", "{'eps': 1e-5}", PARAM, "eps", NULL },
	{ "d_y shaped unlike x", "{'d_y': {'buffer': 'b0.1.5', 'dtype': 'bf16', 'shape': [6, 41]}}", OPERAND, "d_y",
	  "shaped like x" },
	{ "d_y of another dtype", "{'d_y': {'buffer': 'b0.1.5', 'dtype': 'f16', 'shape': [6, 40]}}", OPERAND, "d_y",
	  NULL },
	{ "d_x shaped unlike x", "{'d_x': {'buffer': 'b0.1.6', 'dtype': 'bf16', 'shape': [5, 40]}}", OPERAND, "d_x",
	  "shaped like x" },
	{ "d_weight of another length", "{'d_weight': {'buffer': 'b0.1.7', 'dtype': 'bf16', 'shape': [39]}}", OPERAND,
	  "d_weight", "shaped like weight" },
	{ "d_bias f32 beside bf16 weight", "{'d_bias': {'buffer': 'b0.1.7', 'offset': 80, 'dtype': 'f32', 'shape': [40]}}",
	  OPERAND, "d_bias", NULL },
	{ "d_residual of another shape",
	  "{'d_residual': {'buffer': 'b0.1.8', 'dtype': 'bf16', 'shape': [6, 20]}}", OPERAND, "d_residual", NULL },
	{ "mean of another length", "{'mean': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [5]}}", OPERAND, "mean",
	  NULL },
	{ "rstd f16", "{'rstd': {'buffer': 'b0.1.4', 'offset': 24, 'dtype': 'f16', 'shape': [6]}}", OPERAND, "rstd",
	  NULL },
	{ "d_x over d_y", "{'d_x': {'buffer': 'b0.1.5', 'dtype': 'bf16', 'shape': [6, 40]}}", OPERAND, "d_x",
	  "overlaps d_y" },
	{ "d_x over x", "{'d_x': {'buffer': 'b0.1.1', 'offset': 2, 'dtype': 'bf16', 'shape': [6, 40]}}", OPERAND, "d_x",
	  "overlaps x" },
	{ "d_weight over d_x", "{'d_weight': {'buffer': 'b0.1.6', 'offset': 40, 'dtype': 'bf16', 'shape': [40]}}",
	  OPERAND, "d_weight", "overlaps d_x" },
	{ "d_bias over d_weight", "{'d_bias': {'buffer': 'b0.1.7', 'offset': 40, 'dtype': 'bf16', 'shape': [40]}}",
	  OPERAND, "d_bias", "overlaps d_weight" },
	{ "d_weight over mean", "{'d_weight': {'buffer': 'b0.1.4', 'dtype': 'bf16', 'shape': [40]}}", OPERAND,
	  "d_weight", "overlaps mean" },
	/* d_x may be d_residual only exactly. */
	{ "d_x half a row into d_residual",
	  "{'d_x': {'buffer': 'b0.1.8', 'offset': 40, 'dtype': 'bf16', 'shape': [6, 40], 'strides': [64, 1]}}", OPERAND,
	  "d_residual", "only exactly" },
	{ "d_x over d_residual with other strides",
	  "{'d_x': {'buffer': 'b0.1.8', 'dtype': 'bf16', 'shape': [6, 40]}}", OPERAND, "d_residual", "only exactly" },
};

START_TEST(layer_norm_backward_refuses)
{
	struct rp_compute c;

	expect_bad(layer_norm_backward_base, &layer_norm_backward_bad_cases[_i], layer_norm_backward_parse_any, &c,
		   sizeof(c));
}
END_TEST

/* ---- FP8: Gemm, Quantize, TransposeQuantize, ScaleUpdate ---------------------------- */

/* D[64, 48] = A[64, 32] B[48, 32]^T in e4m3, scales beside the data. */
static const char fp8_gemm_base[] =
	"{'a': {'buffer': 'b0.1.1', 'dtype': 'e4m3', 'shape': [64, 32]},"
	" 'b': {'buffer': 'b0.1.2', 'dtype': 'e4m3', 'shape': [48, 32]}, 'trans_b': true,"
	" 'd': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [64, 48]},"
	" 'a_scale': {'buffer': 'b0.1.4', 'dtype': 'f32', 'shape': [1]},"
	" 'b_scale': {'buffer': 'b0.1.4', 'offset': 4, 'dtype': 'f32', 'shape': [1]}}";

#define FP8_D "'d': {'buffer': 'b0.1.3', 'dtype': 'e4m3', 'shape': [64, 48]}"
#define D_SCALE "'d_scale': {'buffer': 'b0.1.4', 'offset': 8, 'dtype': 'f32', 'shape': [1]}"
#define AMAX_D "'amax_d': {'buffer': 'b0.1.4', 'offset': 12, 'dtype': 'f32', 'shape': [1]}"

static const struct gemm_ok fp8_gemm_ok_cases[] = {
	{ "e4m3 x e4m3 into bf16", NULL, 64, 48, 32 },
	{ "e5m2 x e4m3 (a gradient times a weight) into f32",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'e5m2', 'shape': [64, 32]},"
	  " 'd': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]}}", 64, 48, 32 },
	{ "into e4m3 with its scale and amax", "{" FP8_D ", " D_SCALE ", " AMAX_D "}", 64, 48, 32 },
	{ "e5m2 x e4m3 into e5m2 without amax",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'e5m2', 'shape': [64, 32]},"
	  " 'd': {'buffer': 'b0.1.3', 'dtype': 'e5m2', 'shape': [64, 48]}, " D_SCALE "}", 64, 48, 32 },
	{ "e4m3 x e5m2 into f16 with an f16 bias",
	  "{'b': {'buffer': 'b0.1.2', 'dtype': 'e5m2', 'shape': [48, 32]},"
	  " 'd': {'buffer': 'b0.1.3', 'dtype': 'f16', 'shape': [64, 48]},"
	  " 'bias': {'buffer': 'b0.1.5', 'dtype': 'f16', 'shape': [48]}, 'epilogue': 'bias'}", 64, 48, 32 },
	{ "bf16 bias and gelu",
	  "{'bias': {'buffer': 'b0.1.5', 'dtype': 'bf16', 'shape': [48]}, 'epilogue': 'gelu_bias'}", 64, 48, 32 },
	{ "accumulating into c", "{'c': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [64, 48]}, 'beta': 1}", 64, 48,
	  32 },
	{ "fast accumulation", "{'compute': 'fp8_fast_accum'}", 64, 48, 32 },
};

START_TEST(fp8_gemm_accepts)
{
	const struct gemm_ok *gc = &fp8_gemm_ok_cases[_i];
	cJSON *params = patched(fp8_gemm_base, gc->patch);
	struct rp_error err = { 0 };
	struct rp_compute c;
	int r = rp_compute_parse(&rp_op_gemm, params, &c, &err);

	ck_assert_msg(r == 0, "%s: refused with %s %s", gc->what, err.name ? err.name : "?",
		      err.params ? cJSON_PrintUnformatted(err.params) : "");
	ck_assert_int_eq(c.gemm.m, gc->m);
	ck_assert_int_eq(c.gemm.n, gc->n);
	ck_assert_int_eq(c.gemm.k, gc->k);
	ck_assert_int_eq(c.gemm.compute, gc->patch && strstr(gc->patch, "fp8_fast_accum") ? RP_COMPUTE_FP8_FAST_ACCUM
											  : RP_COMPUTE_F32);
	cJSON_Delete(params);
}
END_TEST

static const struct bad_case fp8_gemm_bad_cases[] = {
	{ "e4m3 a with a bf16 b", "{'b': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [48, 32]}}",
	  RP_ERR_INVALID_OPERAND, "b", "both inputs in FP8" },
	{ "both e5m2",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'e5m2', 'shape': [64, 32]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'e5m2', 'shape': [48, 32]}}", RP_ERR_INVALID_OPERAND, "b", "e5m2" },
	{ "e4m3 x e4m3 into e5m2 (no cuBLASLt kernel)",
	  "{'d': {'buffer': 'b0.1.3', 'dtype': 'e5m2', 'shape': [64, 48]}, " D_SCALE "}", RP_ERR_INVALID_OPERAND, "d",
	  "does not write from two e4m3 inputs" },
	{ "no a_scale", "{'a_scale': null}", RP_ERR_INVALID_OPERAND, "a_scale", "no a_scale was given" },
	{ "no b_scale", "{'b_scale': null}", RP_ERR_INVALID_OPERAND, "b_scale", "no b_scale was given" },
	{ "an FP8 d without d_scale", "{" FP8_D "}", RP_ERR_INVALID_OPERAND, "d_scale", "no d_scale was given" },
	{ "d_scale for a bf16 d", "{" D_SCALE "}", RP_ERR_INVALID_OPERAND, "d_scale", "not FP8" },
	{ "amax_d for a bf16 d", "{" AMAX_D "}", RP_ERR_INVALID_OPERAND, "amax_d", "not FP8" },
	{ "a scale of two elements",
	  "{'a_scale': {'buffer': 'b0.1.4', 'offset': 16, 'dtype': 'f32', 'shape': [2]}}", RP_ERR_INVALID_OPERAND,
	  "a_scale", "must be [1]" },
	{ "an f16 scale", "{'a_scale': {'buffer': 'b0.1.4', 'offset': 16, 'dtype': 'f16', 'shape': [1]}}",
	  RP_ERR_INVALID_OPERAND, "a_scale", "must be f32" },
	{ "b not transposed", "{'b': {'buffer': 'b0.1.2', 'dtype': 'e4m3', 'shape': [32, 48]}, 'trans_b': false}",
	  RP_ERR_INVALID_OPERAND, "b", "TransposeQuantize" },
	{ "a transposed", "{'a': {'buffer': 'b0.1.1', 'dtype': 'e4m3', 'shape': [32, 64]}, 'trans_a': true}",
	  RP_ERR_INVALID_OPERAND, "a", "trans_a false, trans_b true" },
	{ "an FP8 d from bf16 inputs",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [64, 32]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [48, 32]}, 'a_scale': null, 'b_scale': null, " FP8_D "}",
	  RP_ERR_INVALID_OPERAND, "d", "needs FP8 inputs" },
	{ "scales for bf16 inputs",
	  "{'a': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [64, 32]},"
	  " 'b': {'buffer': 'b0.1.2', 'dtype': 'bf16', 'shape': [48, 32]}}", RP_ERR_INVALID_OPERAND, "a_scale",
	  "for FP8 inputs" },
	{ "c into an FP8 d",
	  "{" FP8_D ", " D_SCALE ", 'c': {'buffer': 'b0.1.6', 'dtype': 'bf16', 'shape': [64, 48]}, 'beta': 1}",
	  RP_ERR_INVALID_OPERAND, "c", "no c into an FP8 d" },
	{ "a bias into an f32 d",
	  "{'d': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [64, 48]},"
	  " 'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [48]}, 'epilogue': 'bias'}", RP_ERR_INVALID_OPERAND,
	  "bias", "bf16 or f16 d" },
	{ "a bias into an FP8 d",
	  "{" FP8_D ", " D_SCALE ", 'bias': {'buffer': 'b0.1.5', 'dtype': 'bf16', 'shape': [48]}, 'epilogue': 'bias'}",
	  RP_ERR_INVALID_OPERAND, "bias", "bf16 or f16 d" },
	{ "an f32 bias into a bf16 d", "{'bias': {'buffer': 'b0.1.5', 'dtype': 'f32', 'shape': [48]}, 'epilogue': 'bias'}",
	  RP_ERR_INVALID_OPERAND, "bias", "must share a dtype" },
	{ "dgelu", "{'aux': {'buffer': 'b0.1.6', 'dtype': 'bf16', 'shape': [64, 48]}, 'epilogue': 'dgelu'}",
	  RP_ERR_INVALID_OPERAND, "a", "epilogue none, bias, gelu or gelu_bias" },
	{ "amax_d overlapping d_scale",
	  "{" FP8_D ", " D_SCALE ", 'amax_d': {'buffer': 'b0.1.4', 'offset': 8, 'dtype': 'f32', 'shape': [1]}}",
	  RP_ERR_INVALID_OPERAND, "amax_d", "overlaps d_scale" },
	{ "an FP8 c", "{'c': {'buffer': 'b0.1.6', 'dtype': 'e4m3', 'shape': [64, 48]}, 'beta': 1}",
	  RP_ERR_INVALID_OPERAND, "c", "must be f32 or f16 or bf16" },
	{ "tf32 with FP8 inputs", "{'compute': 'tf32'}", RP_ERR_INVALID_PARAMETER, "compute", NULL },
};

START_TEST(fp8_gemm_refuses)
{
	struct rp_compute c;

	expect_bad(fp8_gemm_base, &fp8_gemm_bad_cases[_i], gemm_parse_any, &c, sizeof(c));
}
END_TEST

static int quantize_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_quantize, p, d, e);
}

static int transpose_quantize_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_transpose_quantize, p, d, e);
}

static int scale_update_parse_any(const cJSON *p, void *d, struct rp_error *e)
{
	return rp_compute_parse(&rp_op_scale_update, p, d, e);
}

static const char quantize_base[] =
	"{'x': {'buffer': 'b0.1.1', 'dtype': 'bf16', 'shape': [24, 40], 'strides': [48, 1]},"
	" 'scale': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [1]},"
	" 'y': {'buffer': 'b0.1.3', 'dtype': 'e4m3', 'shape': [24, 40]},"
	" 'amax': {'buffer': 'b0.1.2', 'offset': 4, 'dtype': 'f32', 'shape': [1]}}";

static const char transpose_quantize_base[] =
	"{'x': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [24, 40]},"
	" 'scale': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [1]},"
	" 'y': {'buffer': 'b0.1.3', 'dtype': 'e5m2', 'shape': [24, 40]},"
	" 'y_t': {'buffer': 'b0.1.4', 'dtype': 'e5m2', 'shape': [40, 24]}}";

static const char scale_update_base[] =
	"{'amax_history': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [16, 6]},"
	" 'scale': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [6]},"
	" 'amax_history_out': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [16, 6]},"
	" 'scale_out': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [6]},"
	" 'scale_inv': {'buffer': 'b0.1.3', 'dtype': 'f32', 'shape': [6]},"
	" 'fp8_dtype': 'e5m2', 'amax_compute': 'most_recent', 'margin': 1}";

START_TEST(fp8_ops_accept_and_derive)
{
	struct rp_error err = { 0 };
	struct rp_compute c;
	cJSON *p;

	p = patched(quantize_base, NULL);
	ck_assert_int_eq(rp_compute_parse(&rp_op_quantize, p, &c, &err), 0);
	ck_assert_int_eq(c.quantize.rows, 24);
	ck_assert_int_eq(c.quantize.cols, 40);
	cJSON_Delete(p);

	p = patched(transpose_quantize_base, "{'y': null, 'amax': {'buffer': 'b0.1.2', 'offset': 4, 'dtype': 'f32', 'shape': [1]}}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_transpose_quantize, p, &c, &err), 0);
	ck_assert(!c.present[RP_QUANT_Y] && c.present[RP_QUANT_Y_T] && c.present[RP_QUANT_AMAX]);
	cJSON_Delete(p);

	/* In place, every option set. */
	p = patched(scale_update_base, NULL);
	ck_assert_msg(rp_compute_parse(&rp_op_scale_update, p, &c, &err) == 0, "%s",
		      err.params ? cJSON_PrintUnformatted(err.params) : "?");
	ck_assert_int_eq(c.scale_update.history, 16);
	ck_assert_int_eq(c.scale_update.n, 6);
	ck_assert_int_eq(c.scale_update.format, RP_FP8_E5M2);
	ck_assert_int_eq(c.scale_update.amax_compute, RP_AMAX_COMPUTE_MOST_RECENT);
	ck_assert(c.scale_update.margin == 1.0);
	cJSON_Delete(p);

	/* Defaults: e4m3, max, margin 0. */
	p = patched(scale_update_base, "{'fp8_dtype': null, 'amax_compute': null, 'margin': null}");
	ck_assert_int_eq(rp_compute_parse(&rp_op_scale_update, p, &c, &err), 0);
	ck_assert_int_eq(c.scale_update.format, RP_FP8_E4M3);
	ck_assert_int_eq(c.scale_update.amax_compute, RP_AMAX_COMPUTE_MAX);
	ck_assert(c.scale_update.margin == 0.0);
	cJSON_Delete(p);
}
END_TEST

static const struct bad_case quantize_bad_cases[] = {
	{ "a bf16 y", "{'y': {'buffer': 'b0.1.3', 'dtype': 'bf16', 'shape': [24, 40]}}", RP_ERR_INVALID_OPERAND, "y",
	  "must be e4m3 or e5m2" },
	{ "an e4m3 x", "{'x': {'buffer': 'b0.1.1', 'dtype': 'e4m3', 'shape': [24, 40]}}", RP_ERR_INVALID_OPERAND, "x",
	  NULL },
	{ "no scale", "{'scale': null}", RP_ERR_INVALID_PARAMETER, "scale", NULL },
	{ "a scale of x's shape", "{'scale': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [24]}}",
	  RP_ERR_INVALID_OPERAND, "scale", "must be [1]" },
	{ "y not x's shape", "{'y': {'buffer': 'b0.1.3', 'dtype': 'e4m3', 'shape': [40, 24]}}", RP_ERR_INVALID_OPERAND,
	  "y", "shaped like x" },
	{ "amax on the scale", "{'amax': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [1]}}", RP_ERR_INVALID_OPERAND,
	  "amax", "overlaps scale" },
	{ "a y_t", "{'y_t': {'buffer': 'b0.1.4', 'dtype': 'e4m3', 'shape': [40, 24]}}", RP_ERR_INVALID_PARAMETER, "y_t",
	  NULL },
};

static const struct bad_case transpose_quantize_bad_cases[] = {
	{ "no y_t", "{'y_t': null}", RP_ERR_INVALID_PARAMETER, "y_t", NULL },
	{ "y_t not transposed", "{'y_t': {'buffer': 'b0.1.4', 'dtype': 'e5m2', 'shape': [24, 40]}}",
	  RP_ERR_INVALID_OPERAND, "y_t", "x transposed" },
	{ "y and y_t of two dtypes", "{'y_t': {'buffer': 'b0.1.4', 'dtype': 'e4m3', 'shape': [40, 24]}}",
	  RP_ERR_INVALID_OPERAND, "y", "must share a dtype" },
};

static const struct bad_case scale_update_bad_cases[] = {
	{ "an unknown fp8_dtype", "{'fp8_dtype': 'e3m4'}", RP_ERR_INVALID_PARAMETER, "fp8_dtype", NULL },
	{ "an unknown amax_compute", "{'amax_compute': 'mean'}", RP_ERR_INVALID_PARAMETER, "amax_compute", NULL },
	{ "an infinite margin", "{'margin': 1e999}", RP_ERR_INVALID_PARAMETER, "margin", NULL },
	{ "a margin past 126", "{'margin': 127}", RP_ERR_INVALID_PARAMETER, "margin", NULL },
	{ "a scale per row", "{'scale': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [16]},"
	  " 'scale_out': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [16]}}", RP_ERR_INVALID_OPERAND, "scale",
	  "one scale per column" },
	{ "a history rolled into other strides",
	  "{'amax_history_out': {'buffer': 'b0.1.1', 'dtype': 'f32', 'shape': [16, 6], 'strides': [8, 1]}}",
	  RP_ERR_INVALID_OPERAND, "amax_history", "only exactly" },
	{ "scale_inv on the scale", "{'scale_inv': {'buffer': 'b0.1.2', 'dtype': 'f32', 'shape': [6]}}",
	  RP_ERR_INVALID_OPERAND, "scale_inv", "overlaps" },
	{ "an f16 history", "{'amax_history': {'buffer': 'b0.1.1', 'dtype': 'f16', 'shape': [16, 6]}}",
	  RP_ERR_INVALID_OPERAND, "amax_history", "must be f32" },
};

START_TEST(quantize_refuses)
{
	struct rp_compute c;

	expect_bad(quantize_base, &quantize_bad_cases[_i], quantize_parse_any, &c, sizeof(c));
}
END_TEST

START_TEST(transpose_quantize_refuses)
{
	struct rp_compute c;

	expect_bad(transpose_quantize_base, &transpose_quantize_bad_cases[_i], transpose_quantize_parse_any, &c,
		   sizeof(c));
}
END_TEST

START_TEST(scale_update_refuses)
{
	struct rp_compute c;

	expect_bad(scale_update_base, &scale_update_bad_cases[_i], scale_update_parse_any, &c, sizeof(c));
}
END_TEST

#define N(x) ((int)(sizeof(x) / sizeof((x)[0])))

static Suite *compute_parse_suite(void)
{
	Suite *s = suite_create("compute_parse");
	TCase *gemm = tcase_create("gemm");
	TCase *att = tcase_create("attention");
	TCase *bwd = tcase_create("attention_backward");
	TCase *ln = tcase_create("layer_norm");

	tcase_add_loop_test(gemm, gemm_accepts, 0, N(gemm_ok_cases));
	tcase_add_test(gemm, gemm_fills_the_descriptor);
	tcase_add_loop_test(gemm, gemm_refuses, 0, N(gemm_bad_cases));
	tcase_add_test(gemm, gemm_refuses_parameters_that_are_not_an_object);
	suite_add_tcase(s, gemm);

	tcase_add_test(att, attention_accepts_and_derives);
	tcase_add_loop_test(att, attention_refuses, 0, N(attention_bad_cases));
	suite_add_tcase(s, att);

	tcase_add_test(bwd, attention_backward_accepts_and_derives);
	tcase_add_loop_test(bwd, attention_backward_refuses, 0, N(attention_backward_bad_cases));
	tcase_add_test(bwd, backward_outputs_side_by_side_are_fine);
	tcase_add_test(bwd, backward_outputs_interleaved_without_sharing_are_fine);
	tcase_add_loop_test(bwd, backward_outputs_interleaved_and_sharing_are_refused, 0, N(interleaved_bad_cases));
	suite_add_tcase(s, bwd);

	tcase_add_test(ln, layer_norm_accepts_and_derives);
	tcase_add_loop_test(ln, layer_norm_refuses, 0, N(layer_norm_bad_cases));
	tcase_add_test(ln, layer_norm_backward_accepts_and_derives);
	tcase_add_loop_test(ln, layer_norm_backward_refuses, 0, N(layer_norm_backward_bad_cases));
	suite_add_tcase(s, ln);

	TCase *fp8 = tcase_create("fp8");
	tcase_add_loop_test(fp8, fp8_gemm_accepts, 0, N(fp8_gemm_ok_cases));
	tcase_add_loop_test(fp8, fp8_gemm_refuses, 0, N(fp8_gemm_bad_cases));
	tcase_add_test(fp8, fp8_ops_accept_and_derive);
	tcase_add_loop_test(fp8, quantize_refuses, 0, N(quantize_bad_cases));
	tcase_add_loop_test(fp8, transpose_quantize_refuses, 0, N(transpose_quantize_bad_cases));
	tcase_add_loop_test(fp8, scale_update_refuses, 0, N(scale_update_bad_cases));
	suite_add_tcase(s, fp8);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(compute_parse_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
