/* SPDX-License-Identifier: Apache-2.0 */
/* libregen: the compute calls. Each fills the operation's descriptor of
 * proto/compute.h by the op table's slots, and the table's encoder writes
 * the call: the same table the daemon parses it with. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "private.h"
#include "proto/compute.h"
#include "proto/ring.h"

/* An op's two entry points over its static name(c, args, ticket): the call
 * answered (no ticket), and the call queued, its ticket given back. */
#define ENTRY_POINTS(name)                                                                            \
	REGEN_EXPORT int regen_##name(regen_client *c, const struct regen_##name##_args *a)           \
	{                                                                                             \
		return name(c, a, NULL);                                                              \
	}                                                                                             \
	REGEN_EXPORT int regen_##name##_submit(regen_client *c, const struct regen_##name##_args *a,  \
					       uint64_t *ticket)                                      \
	{                                                                                             \
		return ticket != NULL ? name(c, a, ticket) : -EINVAL;                                 \
	}

_Static_assert((int)REGEN_F32 == (int)RP_DTYPE_F32 && (int)REGEN_F16 == (int)RP_DTYPE_F16 &&
		       (int)REGEN_BF16 == (int)RP_DTYPE_BF16 && (int)REGEN_I32 == (int)RP_DTYPE_I32 &&
		       (int)REGEN_E4M3 == (int)RP_DTYPE_E4M3 && (int)REGEN_E5M2 == (int)RP_DTYPE_E5M2 &&
		       (int)REGEN_FP8_E5M2 == (int)RP_FP8_E5M2 &&
		       (int)REGEN_AMAX_COMPUTE_MOST_RECENT == (int)RP_AMAX_COMPUTE_MOST_RECENT &&
		       (int)REGEN_F64 == (int)RP_DTYPE_F64 && (int)REGEN_I64 == (int)RP_DTYPE_I64 &&
		       (int)REGEN_U8 == (int)RP_DTYPE_U8 &&
		       (int)REGEN_EPILOGUE_GELU_BIAS == (int)RP_EPILOGUE_GELU_BIAS &&
		       (int)REGEN_EPILOGUE_DGELU == (int)RP_EPILOGUE_DGELU &&
		       (int)REGEN_EPILOGUE_GELU_AUX == (int)RP_EPILOGUE_GELU_AUX &&
		       (int)REGEN_EPILOGUE_GELU_AUX_BIAS == (int)RP_EPILOGUE_GELU_AUX_BIAS &&
		       RP_EPILOGUE_LAST == RP_EPILOGUE_GELU_AUX_BIAS,
	       "libregen's dtypes and epilogues are the protocol's");
_Static_assert(REGEN_RECORD_OPERANDS == RP_OP_OPERANDS_MAX, "a record call has the record's slots");

/* The dtypes a compute call's operand may have (f64, i64 and u8 are
 * programs' alone): an operation's table says which operands take which. */
static bool compute_dtype(unsigned dtype)
{
	return dtype <= REGEN_I32 || dtype == REGEN_E4M3 || dtype == REGEN_E5M2;
}

/* Every buffer and event a call names belongs to this client and lives on
 * one device (*device, -1 before the first). */
static int check_object(regen_client *c, const char *what, const char *name, const struct rc_object *obj,
			int *device)
{
	if (obj->client == NULL) {
		rc_set_local_error(c, "%s %s: %s belongs to no client here (its client was destroyed, or it was "
				      "imported by the parent process before this one was forked)", what, name, obj->id);
		return -EINVAL;
	}
	if (obj->client != c) {
		rc_set_local_error(c, "%s %s: %s belongs to another client", what, name, obj->id);
		return -EINVAL;
	}
	if (*device >= 0 && obj->device != *device) {
		rc_set_local_error(c, "%s %s is on device %d, the call on device %d", what, name, obj->device, *device);
		return -EINVAL;
	}
	*device = obj->device;
	return 0;
}

/* A tensor into the operand at `slot`; strides all zero mean contiguous. */
static int put_operand(regen_client *c, struct rp_compute *call, int slot, const struct regen_tensor *t, int *device)
{
	const char *name = call->spec->operands[slot].name;
	struct rp_operand *op = &call->operands[slot];
	bool any_stride = false;

	if (t == NULL)
		return 0;
	if (t->buffer == NULL) {
		rc_set_local_error(c, "operand %s has no buffer", name);
		return -EINVAL;
	}
	if (check_object(c, "operand", name, &t->buffer->obj, device) < 0)
		return -EINVAL;
	if (!compute_dtype((unsigned)t->dtype) || t->rank < 1 || t->rank > RP_RANK_MAX) {
		rc_set_local_error(c, "operand %s: bad dtype or rank", name);
		return -EINVAL;
	}
	op->buffer = t->buffer->obj.rid;
	op->offset = t->offset;
	op->dtype = (enum rp_dtype)t->dtype;
	op->rank = t->rank;
	for (int i = 0; i < t->rank; i++) {
		op->shape[i] = t->shape[i];
		any_stride |= t->strides[i] != 0;
	}
	int64_t step = 1;
	for (int i = t->rank - 1; i >= 0; i--) {
		op->strides[i] = any_stride ? t->strides[i] : step;
		step *= t->shape[i] > 0 ? t->shape[i] : 1;
	}
	call->present[slot] = true;
	return 0;
}

static int put_event(regen_client *c, struct rp_event_ref *ref, const char *name, const regen_event *ev, int *device)
{
	if (ev == NULL)
		return 0;
	if (check_object(c, "event", name, &ev->obj, device) < 0)
		return -EINVAL;
	ref->present = true;
	ref->id = ev->obj.rid;
	return 0;
}

/* Checks the objects and queues the call on its device's lane (the ring's
 * record or the Varlink call, both from the same descriptor). With ticket
 * NULL, waits for its answer. */
static int send_call(regen_client *c, struct rp_compute *call, const struct regen_tensor *const *tensors,
		     const regen_event *wait, const regen_event *signal, uint64_t *ticket)
{
	int device = -1, r = 0;
	uint64_t t;

	/* Before the operands are checked: in a forked child the parent's
	 * buffers are not this client's any more. */
	rc_check_fork(c);
	for (unsigned i = 0; i < call->spec->noperands && r == 0; i++)
		r = put_operand(c, call, (int)i, tensors[i], &device);
	if (r == 0)
		r = put_event(c, &call->wait_event, "wait_event", wait, &device);
	if (r == 0)
		r = put_event(c, &call->signal_event, "signal_event", signal, &device);
	if (r < 0)
		return r;
	r = rc_lane_submit(c, device, call, &t);
	if (r < 0)
		return r;
	if (ticket != NULL) {
		*ticket = t;
		return 0;
	}
	return rc_lane_wait(c, device, t);
}

/* A scalar JSON has no words for (NaN, an infinity) would reach regend as
 * absent over Varlink (its default, silently) and be refused over the ring:
 * refused here, unsent, on either. */
static int refuse_unless_finite(regen_client *c, const char *name, double value)
{
	if (isfinite(value))
		return 0;
	rc_set_local_error(c, "%s must be finite", name);
	return -EINVAL;
}

static int gemm(regen_client *c, const struct regen_gemm_args *g, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_gemm };
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_GEMM_A] = g ? &g->a : NULL, [RP_GEMM_B] = g ? &g->b : NULL, [RP_GEMM_C] = g ? g->c : NULL,
		[RP_GEMM_D] = g ? &g->d : NULL, [RP_GEMM_BIAS] = g ? g->bias : NULL, [RP_GEMM_AUX] = g ? g->aux : NULL,
		[RP_GEMM_AUX_OUT] = g ? g->aux_out : NULL, [RP_GEMM_A_SCALE] = g ? g->a_scale : NULL,
		[RP_GEMM_B_SCALE] = g ? g->b_scale : NULL, [RP_GEMM_D_SCALE] = g ? g->d_scale : NULL,
		[RP_GEMM_AMAX_D] = g ? g->amax_d : NULL,
	};

	if (c == NULL || g == NULL || (unsigned)g->epilogue > REGEN_EPILOGUE_GELU_AUX_BIAS ||
	    (g->tf32 && g->fp8_fast_accum))
		return -EINVAL;
	if (refuse_unless_finite(c, "alpha", g->alpha) < 0 || refuse_unless_finite(c, "beta", g->beta) < 0)
		return -EINVAL;
	call.gemm = (struct rp_gemm){
		.trans_a = g->trans_a,
		.trans_b = g->trans_b,
		.alpha = !g->alpha_set && g->alpha == 0 ? 1.0 : g->alpha,
		.beta = g->beta,
		.epilogue = (enum rp_epilogue)g->epilogue,
		.compute = g->fp8_fast_accum ? RP_COMPUTE_FP8_FAST_ACCUM : g->tf32 ? RP_COMPUTE_TF32 : RP_COMPUTE_F32,
	};
	call.deadline_ms = g->deadline_ms;
	return send_call(c, &call, tensors, g->wait_event, g->signal_event, ticket);
}

ENTRY_POINTS(gemm)

static struct rp_attention attention_scalars(double scale, bool causal, enum regen_causal_alignment alignment)
{
	return (struct rp_attention){
		.scale = scale,
		.causal = causal,
		.alignment = alignment == REGEN_CAUSAL_BOTTOM_RIGHT ? RP_CAUSAL_BOTTOM_RIGHT : RP_CAUSAL_TOP_LEFT,
	};
}

static int attention(regen_client *c, const struct regen_attention_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_attention };

	if (c == NULL || a == NULL)
		return -EINVAL;
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_ATT_Q] = &a->q, [RP_ATT_K] = &a->k, [RP_ATT_V] = &a->v, [RP_ATT_O] = &a->o, [RP_ATT_STATS] = a->stats,
		[RP_ATT_SEQ_LEN_Q] = a->seq_len_q, [RP_ATT_SEQ_LEN_KV] = a->seq_len_kv,
	};
	/* A negative scale goes to regend, which refuses it by name. */
	if (refuse_unless_finite(c, "scale", a->scale) < 0)
		return -EINVAL;
	call.attention = attention_scalars(a->scale, a->causal, a->causal_alignment);
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(attention)

static int attention_backward(regen_client *c, const struct regen_attention_backward_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_attention_backward };

	if (c == NULL || a == NULL)
		return -EINVAL;
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_ATB_Q] = &a->q, [RP_ATB_K] = &a->k, [RP_ATB_V] = &a->v, [RP_ATB_O] = &a->o,
		[RP_ATB_DO] = &a->d_o, [RP_ATB_STATS] = &a->stats, [RP_ATB_DQ] = &a->d_q, [RP_ATB_DK] = &a->d_k,
		[RP_ATB_DV] = &a->d_v, [RP_ATB_SEQ_LEN_Q] = a->seq_len_q, [RP_ATB_SEQ_LEN_KV] = a->seq_len_kv,
	};
	/* A negative scale goes to regend, which refuses it by name. */
	if (refuse_unless_finite(c, "scale", a->scale) < 0)
		return -EINVAL;
	call.attention = attention_scalars(a->scale, a->causal, a->causal_alignment);
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(attention_backward)

static int layer_norm(regen_client *c, const struct regen_layer_norm_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_layer_norm };

	if (c == NULL || a == NULL)
		return -EINVAL;
	if (refuse_unless_finite(c, "eps", a->eps) < 0)
		return -EINVAL;
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_LN_X] = &a->x, [RP_LN_WEIGHT] = &a->weight, [RP_LN_BIAS] = a->bias, [RP_LN_Y] = &a->y,
		[RP_LN_MEAN] = a->mean, [RP_LN_RSTD] = a->rstd,
	};
	call.layer_norm.eps = a->eps;
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(layer_norm)

static int layer_norm_backward(regen_client *c, const struct regen_layer_norm_backward_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_layer_norm_backward };

	if (c == NULL || a == NULL)
		return -EINVAL;
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_LNB_DY] = &a->d_y, [RP_LNB_X] = &a->x, [RP_LNB_WEIGHT] = &a->weight, [RP_LNB_MEAN] = &a->mean,
		[RP_LNB_RSTD] = &a->rstd, [RP_LNB_DX] = &a->d_x, [RP_LNB_DWEIGHT] = a->d_weight,
		[RP_LNB_DBIAS] = a->d_bias, [RP_LNB_DRESIDUAL] = a->d_residual,
	};
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(layer_norm_backward)

static int quantize(regen_client *c, const struct regen_quantize_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_quantize };

	if (c == NULL || a == NULL)
		return -EINVAL;
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_QUANT_X] = &a->x, [RP_QUANT_SCALE] = &a->scale, [RP_QUANT_Y] = &a->y, [RP_QUANT_AMAX] = a->amax,
	};
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(quantize)

static int transpose_quantize(regen_client *c, const struct regen_transpose_quantize_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_transpose_quantize };

	if (c == NULL || a == NULL)
		return -EINVAL;
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_QUANT_X] = &a->x, [RP_QUANT_SCALE] = &a->scale, [RP_QUANT_Y] = a->y, [RP_QUANT_AMAX] = a->amax,
		[RP_QUANT_Y_T] = &a->y_t,
	};
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(transpose_quantize)

static int scale_update(regen_client *c, const struct regen_scale_update_args *a, uint64_t *ticket)
{
	struct rp_compute call = { .spec = &rp_op_scale_update };

	if (c == NULL || a == NULL)
		return -EINVAL;
	if (refuse_unless_finite(c, "margin", a->margin) < 0)
		return -EINVAL;
	/* Values past the enums go to regend, which refuses them by name. */
	const struct regen_tensor *tensors[RP_OP_OPERANDS_MAX] = {
		[RP_SCU_AMAX_HISTORY] = &a->amax_history, [RP_SCU_SCALE] = &a->scale,
		[RP_SCU_AMAX_HISTORY_OUT] = &a->amax_history_out, [RP_SCU_SCALE_OUT] = &a->scale_out,
		[RP_SCU_SCALE_INV] = a->scale_inv,
	};
	call.scale_update = (struct rp_scale_update){
		.format = (enum rp_fp8_format)a->fp8_format,
		.amax_compute = (enum rp_amax_compute)a->amax_compute,
		.margin = a->margin,
	};
	call.deadline_ms = a->deadline_ms;
	return send_call(c, &call, tensors, a->wait_event, a->signal_event, ticket);
}

ENTRY_POINTS(scale_update)

/* A refusal made here that regend would make of the same call, named as
 * regend names it. */
static int refuse_named(regen_client *c, struct rp_error *err)
{
	rc_set_remote_error(c, err->name, err->params);
	rp_error_clear(err);
	return -EINVAL;
}

/* The record a call in its terms makes, its ids at indexes 0 .. 10 (the
 * slots) and 11, 12 (the events) of `ids`. What a record cannot hold is
 * refused as the worker's decoding of it would (an op, a rank, a field of
 * a byte past 255), an id that parses to no buffer or event as regend's
 * parsing of the same call. */
static int record_of(const struct regen_record_call *call, struct rp_ring_record *rec,
		     struct rp_id ids[RP_OP_OPERANDS_MAX + 2], struct rp_error *err)
{
	const struct rp_op_spec *spec = call->op <= UINT16_MAX ? rp_op_get((enum rp_op_id)call->op) : NULL;
	const char *events[2] = { call->wait_event, call->signal_event };
	const char *event_names[2] = { "wait_event", "signal_event" };

	memset(rec, 0, offsetof(struct rp_ring_record, pad));
	memset(ids, 0, (RP_OP_OPERANDS_MAX + 2) * sizeof(*ids));
	if (spec == NULL)
		return rp_error_invalid_parameter(err, "op");
	if (call->flags > UINT16_MAX)
		return rp_error_invalid_parameter(err, "flags");
	if (call->epilogue > UINT8_MAX || call->compute > UINT8_MAX || call->alignment > UINT8_MAX)
		return rp_error_invalid_parameter(err, call->epilogue > UINT8_MAX ? "epilogue"
						       : call->compute > UINT8_MAX ? "compute" : "causal_alignment");
	rec->op = (uint16_t)call->op;
	rec->flags = (uint16_t)call->flags;
	rec->epilogue = (uint8_t)call->epilogue;
	rec->compute = (uint8_t)call->compute;
	rec->alignment = (uint8_t)call->alignment;
	rec->alpha = call->alpha;
	rec->beta = call->beta;
	rec->scale = call->scale;
	rec->deadline_ms = call->deadline_ms;
	for (unsigned i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		const struct regen_record_operand *o = &call->operands[i];
		struct rp_ring_operand *ro = &rec->operands[i];
		const char *name = i < spec->noperands ? spec->operands[i].name : "operands";

		ro->index = RP_RING_NONE;
		if (o->buffer == NULL)
			continue;
		if (i >= spec->noperands)
			return rp_error_invalid_parameter(err, "operands");
		if (rp_id_parse(o->buffer, &ids[i]) < 0 || ids[i].kind != RP_ID_BUFFER)
			return rp_error_invalid_operand(err, name, "'%.80s' is not a buffer id (like b0.1.3)", o->buffer);
		if (!compute_dtype((unsigned)o->dtype)) {
			char field[96];

			snprintf(field, sizeof(field), "%s.dtype", name);
			return rp_error_invalid_parameter(err, field);
		}
		ro->index = i;
		ro->dtype = (uint8_t)o->dtype;
		/* Past a record's ranks: 0, which its decoding refuses by name. */
		ro->rank = o->rank <= RP_RANK_MAX ? (uint8_t)o->rank : 0;
		ro->offset = o->offset;
		for (unsigned d = 0; d < ro->rank; d++) {
			ro->shape[d] = o->shape[d];
			ro->strides[d] = o->strides[d];
		}
	}
	rec->wait_event = rec->signal_event = RP_RING_NONE;
	for (unsigned e = 0; e < 2; e++) {
		struct rp_id *id = &ids[RP_OP_OPERANDS_MAX + e];

		if (events[e] == NULL)
			continue;
		if (rp_id_parse(events[e], id) < 0 || id->kind != RP_ID_EVENT)
			return rp_error_invalid_parameter(err, event_names[e]);
		*(e ? &rec->signal_event : &rec->wait_event) = RP_OP_OPERANDS_MAX + e;
	}
	return 0;
}

/* The op's own floating scalars must be numbers JSON can say: over Varlink
 * a NaN or an infinity would arrive as absent (its default, silently), and
 * the worker refuses them in a record. Refused here on either transport,
 * as regend's check names them. */
static int check_finite(const struct rp_compute *call, struct rp_error *err)
{
	switch (call->spec->id) {
	case RP_OP_GEMM:
		if (!isfinite(call->gemm.alpha) || !isfinite(call->gemm.beta))
			return rp_error_invalid_parameter(err, isfinite(call->gemm.alpha) ? "beta" : "alpha");
		return 0;
	case RP_OP_LAYER_NORM:
	case RP_OP_LAYER_NORM_BACKWARD:
		return isfinite(call->layer_norm.eps) ? 0 : rp_error_invalid_parameter(err, "eps");
	case RP_OP_QUANTIZE:
	case RP_OP_TRANSPOSE_QUANTIZE:
		return 0;
	case RP_OP_SCALE_UPDATE:
		return isfinite(call->scale_update.margin) ? 0 : rp_error_invalid_parameter(err, "margin");
	default:
		return isfinite(call->attention.scale) ? 0 : rp_error_invalid_parameter(err, "scale");
	}
}

REGEN_EXPORT int regen_record_submit(regen_client *c, int device, const struct regen_record_call *call,
				     uint64_t *ticket)
{
	struct rp_id ids[RP_OP_OPERANDS_MAX + 2];
	struct rp_ring_record rec;
	struct rp_compute desc;
	struct rp_error err = { 0 };

	if (c == NULL || call == NULL || ticket == NULL)
		return -EINVAL;
	rc_check_fork(c);
	if (record_of(call, &rec, ids, &err) < 0 ||
	    rp_ring_decode_fields(&rec, ids, RP_OP_OPERANDS_MAX + 2, &desc, &err) < 0 || check_finite(&desc, &err) < 0)
		return refuse_named(c, &err);
	return rc_lane_submit(c, device, &desc, ticket);
}
