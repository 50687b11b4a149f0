/* io.regen.Compute parameter validation: any JSON as the parameters of
 * Gemm (FUZZ_GEMM), Attention (FUZZ_ATTENTION) or AttentionBackward
 * (FUZZ_ATTENTION_BACKWARD), as the worker gets them before it resolves a
 * buffer. A refusal must be a named error that names an operand or a
 * parameter; an accepted call must satisfy the rules compute.h states, so
 * that the worker and the backends can trust the descriptor: consistent
 * shapes, last strides 1, extents that do not overflow, outputs that do not
 * overlap inputs in the same buffer, a finite positive scale. */
#include <errno.h>
#include <math.h>

#include "fuzz_common.h"
#include "proto/compute.h"

static void check_named(int r, struct rp_error *err, const char *where)
{
	const cJSON *named;

	fz_check_error(r, err, where);
	if (strcmp(err->name, RP_ERR_INVALID_OPERAND) == 0) {
		named = cJSON_GetObjectItemCaseSensitive(err->params, "operand");
		FZ_CHECK(cJSON_IsString(named) && named->valuestring[0], "InvalidOperand names no operand");
		FZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err->params, "reason")), "InvalidOperand without reason");
	} else {
		FZ_CHECK(strcmp(err->name, RP_ERR_INVALID_PARAMETER) == 0, "unexpected error %s", err->name);
		named = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");
		FZ_CHECK(cJSON_IsString(named), "InvalidParameter names no parameter");
	}
}

/* An extent may overflow 64 bits in an accepted call (the worker's bounds
 * check against the buffer refuses it); only where the parser compared two
 * operands' bytes must it have been computable. */
static void extent_of(const struct rp_operand *op, const char *name, uint64_t *b, uint64_t *e, bool must)
{
	int r = rp_operand_extent(op, b, e);

	FZ_CHECK(r == 0 || (!must && r == -EOVERFLOW), "accepted operand %s has no extent (%d)", name, r);
	FZ_CHECK(op->strides[op->rank - 1] == 1, "accepted operand %s with last stride %lld", name,
		 (long long)op->strides[op->rank - 1]);
}

static bool same_buffer(const struct rp_operand *x, const struct rp_operand *y)
{
	return x->buffer.device == y->buffer.device && x->buffer.generation == y->buffer.generation &&
	       x->buffer.serial == y->buffer.serial;
}

static void no_overlap(const struct rp_operand *out, const char *on, const struct rp_operand *in, const char *in_name)
{
	uint64_t b0, e0, b1, e1;

	bool same = same_buffer(out, in);

	extent_of(out, on, &b0, &e0, same);
	extent_of(in, in_name, &b1, &e1, same);
	if (same)
		FZ_CHECK(!(b0 < e1 && b1 < e0), "output %s overlaps %s", on, in_name);
}

static bool shape_is(const struct rp_operand *op, int rank, const int64_t *dims)
{
	if (op->rank != rank)
		return false;
	for (int i = 0; i < rank; i++)
		if (op->shape[i] != dims[i])
			return false;
	return true;
}

#if defined(FUZZ_GEMM)
static void run(const cJSON *params)
{
	struct rp_error err = { 0 };
	struct rp_gemm g;
	int r = rp_gemm_parse(params, &g, &err);

	if (r < 0) {
		check_named(r, &err, "rp_gemm_parse");
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(g.m >= 1 && g.n >= 1 && g.k >= 1, "m n k %lld %lld %lld", (long long)g.m, (long long)g.n, (long long)g.k);
	int64_t a_dims[2] = { g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k };
	int64_t b_dims[2] = { g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n };
	int64_t d_dims[2] = { g.m, g.n };
	FZ_CHECK(shape_is(&g.a, 2, a_dims) && shape_is(&g.b, 2, b_dims) && shape_is(&g.d, 2, d_dims), "shapes disagree");
	FZ_CHECK(!g.has_c || shape_is(&g.c, 2, d_dims), "c's shape disagrees");
	FZ_CHECK(!g.has_bias || shape_is(&g.bias, 1, &g.n), "bias's shape disagrees");
	FZ_CHECK(g.a.dtype == g.b.dtype && (!g.has_c || g.c.dtype == g.d.dtype) && (!g.has_bias || g.bias.dtype == g.d.dtype),
		 "dtypes disagree");
	FZ_CHECK(g.compute != RP_COMPUTE_TF32 || g.a.dtype == RP_DTYPE_F32, "tf32 with non-f32 inputs");
	FZ_CHECK(isfinite(g.alpha) && isfinite(g.beta), "non-finite alpha or beta");
	FZ_CHECK(g.beta == 0 || g.has_c, "beta without c");
	FZ_CHECK((g.epilogue == RP_EPILOGUE_BIAS || g.epilogue == RP_EPILOGUE_GELU_BIAS) == g.has_bias,
		 "bias and epilogue disagree");
	no_overlap(&g.d, "d", &g.a, "a");
	no_overlap(&g.d, "d", &g.b, "b");
	if (g.has_bias)
		no_overlap(&g.d, "d", &g.bias, "bias");
	if (g.has_c) {
		uint64_t b, e;
		extent_of(&g.c, "c", &b, &e, same_buffer(&g.c, &g.d));
	}
	for (int i = 0; i < 2; i++) {
		const struct rp_operand *x = i == 0 ? &g.a : i == 1 ? &g.b : &g.d;
		FZ_CHECK(x->strides[0] >= x->shape[1], "row stride below the row length");
	}
	FZ_CHECK(!g.wait_event.present || g.wait_event.id.kind == RP_ID_EVENT, "wait_event not an event id");
	FZ_CHECK(!g.signal_event.present || g.signal_event.id.kind == RP_ID_EVENT, "signal_event not an event id");
}
#elif defined(FUZZ_ATTENTION)
static void run(const cJSON *params)
{
	struct rp_error err = { 0 };
	struct rp_attention a;
	int r = rp_attention_parse(params, &a, &err);

	if (r < 0) {
		check_named(r, &err, "rp_attention_parse");
		rp_error_clear(&err);
		return;
	}
	int64_t q[4] = { a.batch, a.heads, a.seq_q, a.head_dim };
	int64_t k[4] = { a.batch, a.heads, a.seq_kv, a.head_dim };
	int64_t v[4] = { a.batch, a.heads, a.seq_kv, a.head_dim_v };
	int64_t o[4] = { a.batch, a.heads, a.seq_q, a.head_dim_v };
	FZ_CHECK(shape_is(&a.q, 4, q) && shape_is(&a.k, 4, k) && shape_is(&a.v, 4, v) && shape_is(&a.o, 4, o),
		 "shapes disagree");
	FZ_CHECK(a.q.dtype == a.k.dtype && a.k.dtype == a.v.dtype && a.v.dtype == a.o.dtype, "dtypes disagree");
	FZ_CHECK(isfinite(a.scale) && a.scale > 0, "scale %g", a.scale);
	if (a.has_stats) {
		FZ_CHECK(shape_is(&a.stats, 3, q) && a.stats.dtype == RP_DTYPE_F32, "stats disagree");
		no_overlap(&a.stats, "stats", &a.q, "q");
		no_overlap(&a.stats, "stats", &a.k, "k");
		no_overlap(&a.stats, "stats", &a.v, "v");
	}
	no_overlap(&a.o, "o", &a.q, "q");
	no_overlap(&a.o, "o", &a.k, "k");
	no_overlap(&a.o, "o", &a.v, "v");
}
#elif defined(FUZZ_ATTENTION_BACKWARD)
static void run(const cJSON *params)
{
	struct rp_error err = { 0 };
	struct rp_attention_backward a;
	int r = rp_attention_backward_parse(params, &a, &err);

	if (r < 0) {
		check_named(r, &err, "rp_attention_backward_parse");
		rp_error_clear(&err);
		return;
	}
	int64_t q[4] = { a.batch, a.heads, a.seq_q, a.head_dim };
	int64_t k[4] = { a.batch, a.heads, a.seq_kv, a.head_dim };
	int64_t v[4] = { a.batch, a.heads, a.seq_kv, a.head_dim_v };
	int64_t o[4] = { a.batch, a.heads, a.seq_q, a.head_dim_v };
	FZ_CHECK(shape_is(&a.q, 4, q) && shape_is(&a.k, 4, k) && shape_is(&a.v, 4, v) && shape_is(&a.o, 4, o) &&
		 shape_is(&a.d_o, 4, o) && shape_is(&a.d_q, 4, q) && shape_is(&a.d_k, 4, k) && shape_is(&a.d_v, 4, v) &&
		 shape_is(&a.stats, 3, q), "shapes disagree");
	FZ_CHECK(a.stats.dtype == RP_DTYPE_F32, "stats not f32");
	FZ_CHECK(isfinite(a.scale) && a.scale > 0, "scale %g", a.scale);
	const struct rp_operand *ins[] = { &a.q, &a.k, &a.v, &a.o, &a.d_o, &a.stats };
	const char *in_names[] = { "q", "k", "v", "o", "d_o", "stats" };
	const struct rp_operand *outs[] = { &a.d_q, &a.d_k, &a.d_v };
	const char *out_names[] = { "d_q", "d_k", "d_v" };
	for (int i = 0; i < 3; i++) {
		for (int j = 0; j < 6; j++)
			no_overlap(outs[i], out_names[i], ins[j], in_names[j]);
		for (int j = 0; j < i; j++)
			no_overlap(outs[i], out_names[i], outs[j], out_names[j]);
	}
}
#else
#error "define FUZZ_GEMM, FUZZ_ATTENTION or FUZZ_ATTENTION_BACKWARD"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *params = fz_json(data, size);

	if (params == NULL)
		return 0;
	run(params);
	cJSON_Delete(params);
	return 0;
}
