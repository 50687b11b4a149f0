/* SPDX-License-Identifier: Apache-2.0 */
/* proto/ring.c: a record written by rp_ring_encode decodes into the
 * descriptor it came from (every op's, LayerNorm's eps in the scale); what a record may not say (another op's flags or
 * scalars, reserved bits, operand slots past the op's, unbound indexes,
 * events where buffers go) is refused by name, as a call would be; a
 * completion carries success or the error as Varlink would send it, cut to
 * fit and still parseable; the sizes are what the protocol says. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/compute.h"
#include "proto/errors.h"
#include "proto/ring.h"

static const struct rp_id ids[4] = {
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 2, .serial = 5 },
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 2, .serial = 6 },
	{ .kind = RP_ID_EVENT, .device = 0, .generation = 2, .serial = 7 },
	{ 0 },
};

static void matrix(struct rp_compute *c, int slot, const struct rp_id *buf, uint64_t offset, int rows, int cols)
{
	struct rp_operand *o = &c->operands[slot];

	o->buffer = *buf;
	o->offset = offset;
	o->dtype = RP_DTYPE_F32;
	o->rank = 2;
	o->shape[0] = rows;
	o->shape[1] = cols;
	o->strides[0] = cols;
	o->strides[1] = 1;
	c->present[slot] = true;
}

/* A GEMM with C, a bias epilogue, transposed A and both events. */
static void gemm_call(struct rp_compute *c)
{
	memset(c, 0, sizeof(*c));
	c->spec = &rp_op_gemm;
	matrix(c, RP_GEMM_A, &ids[0], 0, 8, 4);            /* op(A) [4, 8] */
	matrix(c, RP_GEMM_B, &ids[0], 1024, 8, 6);
	matrix(c, RP_GEMM_C, &ids[1], 0, 4, 6);
	matrix(c, RP_GEMM_D, &ids[1], 0, 4, 6);             /* aliases C exactly */
	c->operands[RP_GEMM_BIAS] = (struct rp_operand){ .buffer = ids[1], .offset = 512, .dtype = RP_DTYPE_F32,
							 .rank = 1, .shape = { 6 }, .strides = { 1 } };
	c->present[RP_GEMM_BIAS] = true;
	c->wait_event = (struct rp_event_ref){ true, ids[2] };
	c->signal_event = (struct rp_event_ref){ true, ids[2] };
	c->gemm = (struct rp_gemm){ .trans_a = true, .alpha = 0.5, .beta = 2.0, .epilogue = RP_EPILOGUE_GELU_BIAS };
}

static void encode(const struct rp_compute *c, struct rp_ring_record *rec)
{
	uint32_t index_of[RP_OP_OPERANDS_MAX];

	for (int i = 0; i < RP_OP_OPERANDS_MAX; i++)
		index_of[i] = c->present[i] && c->operands[i].buffer.serial == ids[1].serial ? 1 : 0;
	rp_ring_encode(c, index_of, c->wait_event.present ? 2 : RP_RING_NONE,
		       c->signal_event.present ? 2 : RP_RING_NONE, 42, rec);
}

static const char *refused(const struct rp_ring_record *rec, const char **named)
{
	static struct rp_error err;
	struct rp_compute c;
	const cJSON *p;

	rp_error_clear(&err);
	ck_assert_int_lt(rp_ring_decode(rec, ids, 4, &c, &err), 0);
	ck_assert_ptr_nonnull(err.name);
	p = cJSON_GetObjectItemCaseSensitive(err.params, "parameter");
	if (!p)
		p = cJSON_GetObjectItemCaseSensitive(err.params, "operand");
	*named = cJSON_IsString(p) ? p->valuestring : "";
	return err.name;
}

START_TEST(sizes_are_the_protocols)
{
	ck_assert_uint_eq(sizeof(struct rp_ring_record), 1024);
	ck_assert_uint_eq(sizeof(struct rp_ring_completion), 1024);
	ck_assert_uint_eq(offsetof(struct rp_ring_header, sq_tail), 64);
	ck_assert_uint_eq(offsetof(struct rp_ring_header, sq_head), 128);
	ck_assert_uint_eq(offsetof(struct rp_ring_header, sq_sleeping), 132);
	ck_assert_uint_eq(offsetof(struct rp_ring_header, cq_tail), 192);
	ck_assert_uint_eq(offsetof(struct rp_ring_header, cq_head), 256);
	ck_assert_uint_eq(offsetof(struct rp_ring_header, cq_waiting), 260);
	ck_assert_uint_eq(offsetof(struct rp_ring_record, operands), 64);
	ck_assert_uint_eq(offsetof(struct rp_ring_completion, error), 88);
	ck_assert_uint_eq(rp_ring_size(256), 4096 + 256 * 2048);
	ck_assert_uint_eq(rp_ring_size(3), 0);
	ck_assert_uint_eq(rp_ring_size(2048), 0);
	ck_assert_uint_eq(rp_ring_size(1), 0);
}
END_TEST

START_TEST(a_record_decodes_into_its_descriptor)
{
	struct rp_compute c, back;
	struct rp_ring_record rec;
	struct rp_error err = { 0 };

	gemm_call(&c);
	c.deadline_ms = 250;
	encode(&c, &rec);
	ck_assert_uint_eq(rec.tag, 42);
	ck_assert_uint_eq(rec.deadline_ms, 250);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_ptr_eq(back.spec, &rp_op_gemm);
	for (int i = 0; i < RP_GEMM_OPERANDS; i++) {
		ck_assert(back.present[i] == (i != RP_GEMM_AUX && i != RP_GEMM_AUX_OUT && i < RP_GEMM_A_SCALE));
		if (!back.present[i])
			continue;
		ck_assert_mem_eq(&back.operands[i], &c.operands[i], sizeof(struct rp_operand));
	}
	ck_assert(back.gemm.trans_a && !back.gemm.trans_b);
	ck_assert(back.gemm.alpha == 0.5 && back.gemm.beta == 2.0);
	ck_assert_int_eq(back.gemm.epilogue, RP_EPILOGUE_GELU_BIAS);
	ck_assert_int_eq(back.gemm.m, 4);
	ck_assert_int_eq(back.gemm.n, 6);
	ck_assert_int_eq(back.gemm.k, 8);
	ck_assert(back.wait_event.present && back.wait_event.id.serial == 7);
	ck_assert_uint_eq(back.deadline_ms, 250);
	/* 0: the worker's default, as an absent deadline_ms in a call. */
	rec.deadline_ms = 0;
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert_uint_eq(back.deadline_ms, 0);
	rec.deadline_ms = RP_DEADLINE_MS_MAX;
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert_uint_eq(back.deadline_ms, RP_DEADLINE_MS_MAX);
}
END_TEST

/* dgelu's aux travels in gemm's sixth slot, the epilogue as its number. */
START_TEST(a_dgelu_record_carries_aux)
{
	struct rp_compute c, back;
	struct rp_ring_record rec;
	struct rp_error err = { 0 };

	gemm_call(&c);
	c.present[RP_GEMM_BIAS] = false;
	memset(&c.operands[RP_GEMM_BIAS], 0, sizeof(c.operands[RP_GEMM_BIAS]));
	matrix(&c, RP_GEMM_AUX, &ids[1], 4096, 4, 6);
	c.gemm.epilogue = RP_EPILOGUE_DGELU;
	encode(&c, &rec);
	ck_assert_uint_eq(rec.epilogue, 4);
	ck_assert_uint_eq(rec.operands[RP_GEMM_AUX].index, 1);
	ck_assert_uint_eq(rec.operands[RP_GEMM_BIAS].index, RP_RING_NONE);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(back.gemm.epilogue, RP_EPILOGUE_DGELU);
	ck_assert(back.present[RP_GEMM_AUX] && !back.present[RP_GEMM_BIAS]);
	ck_assert_mem_eq(&back.operands[RP_GEMM_AUX], &c.operands[RP_GEMM_AUX], sizeof(struct rp_operand));

	/* D on aux's bytes is refused by name, not run in place. */
	c.operands[RP_GEMM_AUX].offset = 0;
	encode(&c, &rec);
	const char *named;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(named, "d");
}
END_TEST

/* gelu_aux_bias's aux_out travels in gemm's seventh slot: written, so it
 * may overlap no other operand. */
START_TEST(a_gelu_aux_record_carries_aux_out)
{
	struct rp_compute c, back;
	struct rp_ring_record rec;
	struct rp_error err = { 0 };

	gemm_call(&c);
	matrix(&c, RP_GEMM_AUX_OUT, &ids[1], 4096, 4, 6);
	c.gemm.epilogue = RP_EPILOGUE_GELU_AUX_BIAS;
	encode(&c, &rec);
	ck_assert_uint_eq(rec.epilogue, 6);
	ck_assert_uint_eq(rec.operands[RP_GEMM_AUX_OUT].index, 1);
	ck_assert_uint_eq(rec.operands[RP_GEMM_AUX].index, RP_RING_NONE);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(back.gemm.epilogue, RP_EPILOGUE_GELU_AUX_BIAS);
	ck_assert(back.present[RP_GEMM_AUX_OUT] && back.present[RP_GEMM_BIAS] && !back.present[RP_GEMM_AUX]);
	ck_assert_mem_eq(&back.operands[RP_GEMM_AUX_OUT], &c.operands[RP_GEMM_AUX_OUT], sizeof(struct rp_operand));

	/* aux_out on C's bytes: an output over an input, refused by name. */
	c.operands[RP_GEMM_AUX_OUT] = c.operands[RP_GEMM_C];
	encode(&c, &rec);
	const char *named;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(named, "aux_out");
	/* Without aux_out, gelu_aux_bias is refused naming it. */
	c.present[RP_GEMM_AUX_OUT] = false;
	memset(&c.operands[RP_GEMM_AUX_OUT], 0, sizeof(c.operands[RP_GEMM_AUX_OUT]));
	encode(&c, &rec);
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(named, "aux_out");
}
END_TEST

START_TEST(attention_scale_zero_is_the_default)
{
	struct rp_compute c = { .spec = &rp_op_attention }, back;
	struct rp_ring_record rec;
	struct rp_error err = { 0 };
	uint32_t index_of[RP_OP_OPERANDS_MAX] = { 0 };

	for (int s = 0; s < 4; s++) {
		struct rp_operand *o = &c.operands[s];
		*o = (struct rp_operand){ .buffer = ids[0], .offset = (uint64_t)s * 4096, .dtype = RP_DTYPE_F32,
					  .rank = 4, .shape = { 1, 2, 3, 16 }, .strides = { 96, 48, 16, 1 } };
		c.present[s] = true;
	}
	c.attention.causal = true;
	rp_ring_encode(&c, index_of, RP_RING_NONE, RP_RING_NONE, 1, &rec);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert(back.attention.causal);
	ck_assert(fabs(back.attention.scale - 0.25) < 1e-12);
	rec.scale = -1.0;
	const char *named;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "scale");
	rec.scale = NAN;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "scale");
}
END_TEST

/* The backward with sequence lengths uses every slot a record has: the
 * last two (version 2's) come back as they went, and a length operand in
 * a slot the op does not have (the forward has seven) is refused. */
START_TEST(attention_lengths_travel_in_the_last_slots)
{
	struct rp_compute c = { .spec = &rp_op_attention_backward }, back;
	struct rp_ring_record rec;
	struct rp_error err = { 0 };
	uint32_t index_of[RP_OP_OPERANDS_MAX] = { 0 };
	const char *named;

	ck_assert_int_eq(RP_ATB_OPERANDS, RP_OP_OPERANDS_MAX);
	for (int s = 0; s < RP_ATB_SEQ_LEN_Q; s++) {
		c.operands[s] = (struct rp_operand){ .buffer = ids[0], .offset = (uint64_t)s * 4096, .dtype = RP_DTYPE_F16,
						     .rank = 4, .shape = { 3, 2, 5, 8 }, .strides = { 80, 40, 8, 1 } };
		c.present[s] = true;
	}
	c.operands[RP_ATB_STATS] = (struct rp_operand){ .buffer = ids[0], .offset = 5 * 4096, .dtype = RP_DTYPE_F32,
						       .rank = 3, .shape = { 3, 2, 5 }, .strides = { 10, 5, 1 } };
	for (int s = RP_ATB_SEQ_LEN_Q; s <= RP_ATB_SEQ_LEN_KV; s++) {
		c.operands[s] = (struct rp_operand){ .buffer = ids[1], .offset = (uint64_t)(s - RP_ATB_SEQ_LEN_Q) * 16,
						     .dtype = RP_DTYPE_I32, .rank = 1, .shape = { 3 }, .strides = { 1 } };
		c.present[s] = true;
		index_of[s] = 1;
	}
	rp_ring_encode(&c, index_of, RP_RING_NONE, RP_RING_NONE, 7, &rec);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert(back.attention.padded);
	for (int s = RP_ATB_SEQ_LEN_Q; s <= RP_ATB_SEQ_LEN_KV; s++) {
		ck_assert(back.present[s]);
		ck_assert_mem_eq(&back.operands[s], &c.operands[s], sizeof(struct rp_operand));
	}
	/* Without the kv side, the pair is refused by the parser's rule. */
	rec.operands[RP_ATB_SEQ_LEN_KV].index = RP_RING_NONE;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(named, "seq_len_kv");

	/* A forward record has no tenth slot. */
	struct rp_compute f = { .spec = &rp_op_attention };
	uint32_t fidx[RP_OP_OPERANDS_MAX] = { 0 };
	for (int s = 0; s < 4; s++) {
		f.operands[s] = c.operands[s];
		f.present[s] = true;
	}
	rp_ring_encode(&f, fidx, RP_RING_NONE, RP_RING_NONE, 8, &rec);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert(!back.attention.padded);
	rec.operands[RP_ATB_SEQ_LEN_KV] = rec.operands[0];
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "operands");
}
END_TEST

/* LayerNorm's records: operands by its slots, eps in the scale (0: the
 * default; what a call may not say refused by name), no flags; the
 * backward's d_residual in its ninth slot, and no eps at all. */
START_TEST(layer_norm_records)
{
	struct rp_compute c = { .spec = &rp_op_layer_norm }, back;
	struct rp_ring_record rec;
	struct rp_error err = { 0 };
	uint32_t index_of[RP_OP_OPERANDS_MAX] = { 0 };
	const char *named;

	matrix(&c, RP_LN_X, &ids[0], 0, 5, 12);
	c.operands[RP_LN_X].strides[0] = 16;
	matrix(&c, RP_LN_Y, &ids[0], 4096, 5, 12);
	c.operands[RP_LN_WEIGHT] = (struct rp_operand){ .buffer = ids[1], .dtype = RP_DTYPE_F32, .rank = 1,
							.shape = { 12 }, .strides = { 1 } };
	c.present[RP_LN_WEIGHT] = true;
	c.operands[RP_LN_RSTD] = (struct rp_operand){ .buffer = ids[1], .offset = 64, .dtype = RP_DTYPE_F32, .rank = 1,
						      .shape = { 5 }, .strides = { 1 } };
	c.present[RP_LN_RSTD] = true;
	index_of[RP_LN_WEIGHT] = index_of[RP_LN_RSTD] = 1;
	c.layer_norm.eps = 0.125;
	rp_ring_encode(&c, index_of, RP_RING_NONE, 2, 5, &rec);
	ck_assert_uint_eq(rec.op, 3);
	ck_assert_uint_eq(rec.flags, 0);
	ck_assert(rec.scale == 0.125);
	ck_assert_uint_eq(rec.operands[RP_LN_BIAS].index, RP_RING_NONE);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert_ptr_eq(back.spec, &rp_op_layer_norm);
	ck_assert(back.layer_norm.eps == 0.125 && back.layer_norm.rows == 5 && back.layer_norm.n == 12);
	ck_assert(back.signal_event.present && !back.present[RP_LN_MEAN] && back.present[RP_LN_RSTD]);
	for (int s = 0; s < RP_LN_OPERANDS; s++) {
		if (back.present[s])
			ck_assert_mem_eq(&back.operands[s], &c.operands[s], sizeof(struct rp_operand));
	}
	rec.scale = 0.0;
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert(back.layer_norm.eps == RP_LAYER_NORM_EPS_DEFAULT);
	static const double bad_eps[] = { -1e-5, NAN, INFINITY };
	for (size_t i = 0; i < sizeof(bad_eps) / sizeof(bad_eps[0]); i++) {
		rec.scale = bad_eps[i];
		ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
		ck_assert_str_eq(named, "eps");
	}
	rec.scale = 0.0;
	rec.flags = RP_RING_CAUSAL;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "flags");
	rec.flags = 0;
	rec.alpha = 1.0;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "alpha");
	rec.alpha = 0.0;
	rec.alignment = 1;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "causal_alignment");
	rec.alignment = 0;
	rec.epilogue = 1;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "epilogue");
	rec.epilogue = 0;
	rec.operands[RP_LNB_DRESIDUAL] = rec.operands[RP_LN_X];
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "operands");

	/* The backward, d_residual in its last slot and d_x in place of it. */
	struct rp_compute b = { .spec = &rp_op_layer_norm_backward };
	uint32_t bidx[RP_OP_OPERANDS_MAX] = { 0 };
	matrix(&b, RP_LNB_DY, &ids[0], 0, 5, 12);
	matrix(&b, RP_LNB_X, &ids[0], 512, 5, 12);
	matrix(&b, RP_LNB_DX, &ids[1], 1024, 5, 12);
	matrix(&b, RP_LNB_DRESIDUAL, &ids[1], 1024, 5, 12);
	bidx[RP_LNB_DX] = bidx[RP_LNB_DRESIDUAL] = 1;
	b.operands[RP_LNB_WEIGHT] = c.operands[RP_LN_WEIGHT];
	b.operands[RP_LNB_WEIGHT].buffer = ids[0];
	b.operands[RP_LNB_WEIGHT].offset = 2048;
	b.operands[RP_LNB_MEAN] = c.operands[RP_LN_RSTD];
	b.operands[RP_LNB_MEAN].buffer = ids[0];
	b.operands[RP_LNB_MEAN].offset = 3072;
	b.operands[RP_LNB_RSTD] = b.operands[RP_LNB_MEAN];
	b.operands[RP_LNB_RSTD].offset = 3200;
	b.present[RP_LNB_WEIGHT] = b.present[RP_LNB_MEAN] = b.present[RP_LNB_RSTD] = true;
	rp_ring_encode(&b, bidx, RP_RING_NONE, RP_RING_NONE, 6, &rec);
	ck_assert_uint_eq(rec.op, 4);
	ck_assert(rec.scale == 0.0);
	ck_assert_int_eq(rp_ring_decode(&rec, ids, 4, &back, &err), 0);
	ck_assert(back.present[RP_LNB_DRESIDUAL] && !back.present[RP_LNB_DWEIGHT]);
	ck_assert_mem_eq(&back.operands[RP_LNB_DRESIDUAL], &b.operands[RP_LNB_DRESIDUAL], sizeof(struct rp_operand));
	rec.scale = 1e-5;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_PARAMETER);
	ck_assert_str_eq(named, "eps");
	rec.scale = 0.0;
	rec.operands[RP_LNB_DRESIDUAL].offset += 4;
	ck_assert_str_eq(refused(&rec, &named), RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(named, "d_residual");
}
END_TEST

/* Each way a record may be wrong, and the name its refusal gives. */
struct bad {
	const char *what, *error, *named;
	void (*spoil)(struct rp_ring_record *rec);
};

static void op_unknown(struct rp_ring_record *r) { r->op = RP_OP_COUNT; }
static void flag_of_attention(struct rp_ring_record *r) { r->flags |= RP_RING_CAUSAL; }
static void reserved_set(struct rp_ring_record *r) { r->reserved1 = 1; }
static void scale_on_gemm(struct rp_ring_record *r) { r->scale = 1.0; }
/* Gemm has a slot for every place a record holds; Quantize has four, and
 * the record's bias is in the fifth. */
static void slot_past_the_op(struct rp_ring_record *r) { r->op = RP_OP_QUANTIZE; }
static void unbound_index(struct rp_ring_record *r) { r->operands[RP_GEMM_B].index = 3; }
static void index_past_table(struct rp_ring_record *r) { r->operands[RP_GEMM_B].index = 4; }
static void event_as_buffer(struct rp_ring_record *r) { r->operands[RP_GEMM_A].index = 2; }
static void buffer_as_event(struct rp_ring_record *r) { r->wait_event = 0; }
static void rank_five(struct rp_ring_record *r) { r->operands[RP_GEMM_D].rank = 5; }
static void zero_dim(struct rp_ring_record *r) { r->operands[RP_GEMM_D].shape[1] = 0; }
static void huge_stride(struct rp_ring_record *r) { r->operands[RP_GEMM_D].strides[0] = INT64_C(1) << 60; }
static void bad_dtype(struct rp_ring_record *r) { r->operands[RP_GEMM_A].dtype = 9; }
static void odd_offset(struct rp_ring_record *r) { r->operands[RP_GEMM_A].offset = 3; }
static void bad_epilogue(struct rp_ring_record *r) { r->epilogue = RP_EPILOGUE_LAST + 1; }
static void dgelu_with_bias(struct rp_ring_record *r) { r->epilogue = RP_EPILOGUE_DGELU; }
static void dgelu_without_aux(struct rp_ring_record *r)
{
	r->epilogue = RP_EPILOGUE_DGELU;
	r->operands[RP_GEMM_BIAS].index = RP_RING_NONE;
}
/* aux on D's rows of buffer 1, past the bias: a gelu_bias call may not carry it. */
static void aux_without_dgelu(struct rp_ring_record *r)
{
	r->operands[RP_GEMM_AUX] = r->operands[RP_GEMM_D];
	r->operands[RP_GEMM_AUX].offset = 4096;
}
static void inf_alpha(struct rp_ring_record *r) { r->alpha = INFINITY; }
static void missing_d(struct rp_ring_record *r) { r->operands[RP_GEMM_D].index = RP_RING_NONE; }
static void k_disagrees(struct rp_ring_record *r) { r->flags &= (uint16_t)~RP_RING_TRANS_A; }
static void reserved_operand(struct rp_ring_record *r) { r->operands[RP_GEMM_A].reserved = 1; }
static void deadline_past_a_day(struct rp_ring_record *r) { r->deadline_ms = RP_DEADLINE_MS_MAX + 1; }

static const struct bad bads[] = {
	{ "an unknown op", RP_ERR_INVALID_PARAMETER, "op", op_unknown },
	{ "attention's flag", RP_ERR_INVALID_PARAMETER, "flags", flag_of_attention },
	{ "a reserved field", RP_ERR_INVALID_PARAMETER, "reserved", reserved_set },
	{ "attention's scale", RP_ERR_INVALID_PARAMETER, "scale", scale_on_gemm },
	{ "a slot the op has not", RP_ERR_INVALID_PARAMETER, "operands", slot_past_the_op },
	{ "an unbound index", RP_ERR_INVALID_OPERAND, "b", unbound_index },
	{ "an index past the table", RP_ERR_INVALID_OPERAND, "b", index_past_table },
	{ "an event as a buffer", RP_ERR_INVALID_OPERAND, "a", event_as_buffer },
	{ "a buffer as an event", RP_ERR_INVALID_PARAMETER, "wait_event", buffer_as_event },
	{ "rank 5", RP_ERR_INVALID_PARAMETER, "d.shape", rank_five },
	{ "a zero dim", RP_ERR_INVALID_PARAMETER, "d.shape", zero_dim },
	{ "a stride past 2^53", RP_ERR_INVALID_PARAMETER, "d.strides", huge_stride },
	{ "an unknown dtype", RP_ERR_INVALID_PARAMETER, "a.dtype", bad_dtype },
	{ "a misaligned offset", RP_ERR_INVALID_OPERAND, "a", odd_offset },
	{ "an unknown epilogue", RP_ERR_INVALID_PARAMETER, "epilogue", bad_epilogue },
	{ "dgelu with a bias", RP_ERR_INVALID_OPERAND, "bias", dgelu_with_bias },
	{ "dgelu without aux", RP_ERR_INVALID_OPERAND, "aux", dgelu_without_aux },
	{ "aux with gelu_bias", RP_ERR_INVALID_OPERAND, "aux", aux_without_dgelu },
	{ "an infinite alpha", RP_ERR_INVALID_PARAMETER, "alpha", inf_alpha },
	{ "no d", RP_ERR_INVALID_PARAMETER, "d", missing_d },
	{ "K disagreeing", RP_ERR_INVALID_OPERAND, "b", k_disagrees },
	{ "a reserved operand field", RP_ERR_INVALID_PARAMETER, "reserved", reserved_operand },
	{ "a deadline past a day", RP_ERR_INVALID_PARAMETER, "deadline_ms", deadline_past_a_day },
};

START_TEST(bad_records_are_refused_by_name)
{
	const struct bad *b = &bads[_i];
	struct rp_compute c;
	struct rp_ring_record rec;
	const char *named, *name;

	gemm_call(&c);
	encode(&c, &rec);
	b->spoil(&rec);
	name = refused(&rec, &named);
	ck_assert_msg(strcmp(name, b->error) == 0, "%s: %s, want %s", b->what, name, b->error);
	ck_assert_msg(strcmp(named, b->named) == 0, "%s: names %s, want %s", b->what, named, b->named);
}
END_TEST

START_TEST(completions_carry_the_varlink_error)
{
	struct rp_ring_completion cqe;
	struct rp_error err = { 0 };
	char name[64], longtext[3000];
	cJSON *params = NULL;

	rp_ring_complete(&cqe, 9, NULL, 77);
	ck_assert_uint_eq(cqe.status, 0);
	ck_assert_uint_eq(cqe.tag, 9);
	ck_assert_uint_eq(cqe.elapsed_us, 77);
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), 0);

	rp_err_stale_generation(&err, 0, 4, "ids went stale");
	rp_ring_complete(&cqe, 10, &err, 0);
	rp_error_clear(&err);
	ck_assert_uint_eq(cqe.status, 1);
	ck_assert_str_eq(cqe.error_name, RP_ERR_STALE_GENERATION);
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), 1);
	ck_assert_str_eq(name, RP_ERR_STALE_GENERATION);
	ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(params, "generation")), 4);
	cJSON_Delete(params);

	/* Too long for the slot: the strings are cut, name and keys stay. */
	memset(longtext, 'x', sizeof(longtext) - 1);
	longtext[sizeof(longtext) - 1] = '\0';
	rp_error_set(&err, RP_ERR_INVALID_OPERAND, "%s", longtext);
	rp_error_add_str(&err, "operand", "d");
	rp_error_add_str(&err, "reason", longtext);
	rp_ring_complete(&cqe, 11, &err, 0);
	rp_error_clear(&err);
	ck_assert_uint_lt(cqe.error_len, RP_RING_ERROR_MAX);
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), 1);
	ck_assert_str_eq(name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(params, "operand")), "d");
	ck_assert_ptr_nonnull(cJSON_GetStringValue(cJSON_GetObjectItem(params, "reason")));
	cJSON_Delete(params);

	/* Garbage in a completion is refused, not trusted. */
	memset(&cqe, 0xff, sizeof(cqe));
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), -EPROTO);
	cqe.status = 1;
	strcpy(cqe.error, "{\"parameters\":{}}");
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), -EPROTO);
}
END_TEST

/* Every scalar a call of the op may carry has its place in a record (or
 * a record could not say what the call says), named as the call names it,
 * of the kind its type needs (a bool a flag, an enum names), each field
 * taken once. */
START_TEST(every_scalar_has_a_place_in_a_record)
{
	const struct rp_op_spec *spec = rp_op_get((enum rp_op_id)_i);
	unsigned fields = 0;
	uint16_t flags = 0;

	ck_assert_ptr_nonnull(spec->ring_scalars);
	for (const struct rp_field *f = spec->scalars; f->name; f++) {
		const struct rp_op_ring_scalar *rs = spec->ring_scalars;

		while (rs->name && strcmp(rs->name, f->name) != 0)
			rs++;
		ck_assert_msg(rs->name != NULL, "%s: scalar %s has no place in a ring record", spec->name, f->name);
		ck_assert_msg((rs->field == RP_RING_FIELD_FLAG) == (f->type == RP_T_BOOL), "%s.%s", spec->name, f->name);
		ck_assert_msg((rs->choices != NULL) == (f->type == RP_T_STRING), "%s.%s", spec->name, f->name);
	}
	for (const struct rp_op_ring_scalar *rs = spec->ring_scalars; rs->name; rs++) {
		if (rs->field == RP_RING_FIELD_FLAG) {
			ck_assert_msg(rs->flag != 0 && !(flags & rs->flag), "%s.%s: flag %#x", spec->name, rs->name, rs->flag);
			flags |= rs->flag;
		} else {
			ck_assert_msg(!(fields & (1u << rs->field)), "%s.%s: field %d taken twice", spec->name, rs->name,
				      rs->field);
			fields |= 1u << rs->field;
		}
		ck_assert_uint_lt(rs->offset, sizeof(struct rp_compute));
	}
}
END_TEST

static Suite *ring_suite(void)
{
	Suite *s = suite_create("ring");
	TCase *tc = tcase_create("records");

	tcase_add_test(tc, sizes_are_the_protocols);
	tcase_add_test(tc, a_record_decodes_into_its_descriptor);
	tcase_add_test(tc, a_dgelu_record_carries_aux);
	tcase_add_test(tc, a_gelu_aux_record_carries_aux_out);
	tcase_add_test(tc, attention_scale_zero_is_the_default);
	tcase_add_test(tc, attention_lengths_travel_in_the_last_slots);
	tcase_add_test(tc, layer_norm_records);
	tcase_add_loop_test(tc, bad_records_are_refused_by_name, 0, sizeof(bads) / sizeof(bads[0]));
	tcase_add_test(tc, completions_carry_the_varlink_error);
	tcase_add_loop_test(tc, every_scalar_has_a_place_in_a_record, 0, RP_OP_COUNT);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ring_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
