/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Lane records: any bytes as a submission record (proto/ring.h),
 * decoded as the worker decodes the copy it takes out of shared memory,
 * against an id table with buffers, an event and holes. A refusal must be
 * a named error naming an operand or a parameter. An accepted record must
 * be one that Varlink accepts too: its descriptor, written as the call's
 * parameters, parses back through rp_compute_parse into the same
 * descriptor, so that the ring cannot let through what a call may not
 * carry. The bytes also go in as a completion, which the client's parser
 * must take or refuse without harm; and an error written into a completion
 * must come back out with its name. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "fuzz_common.h"
#include "proto/compute.h"
#include "proto/ring.h"

#define NIDS 8

static const struct rp_id ids[NIDS] = {
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 3, .serial = 11 },
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 3, .serial = 12 },
	{ .kind = RP_ID_EVENT, .device = 0, .generation = 3, .serial = 13 },
	{ 0 },   /* unbound */
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 2, .serial = 14 },
	{ .kind = RP_ID_EVENT, .device = 0, .generation = 3, .serial = 15 },
	{ .kind = RP_ID_BUFFER, .device = 1, .generation = 3, .serial = 16 },
	{ 0 },
};

static void check_refusal(int r, struct rp_error *err)
{
	const cJSON *named;

	fz_check_error(r, err, "ring record");
	if (strcmp(err->name, RP_ERR_INVALID_OPERAND) == 0) {
		named = cJSON_GetObjectItemCaseSensitive(err->params, "operand");
		FZ_CHECK(cJSON_IsString(named) && named->valuestring[0], "InvalidOperand names no operand");
	} else {
		FZ_CHECK(strcmp(err->name, RP_ERR_INVALID_PARAMETER) == 0, "unexpected error %s", err->name);
		named = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");
		FZ_CHECK(cJSON_IsString(named), "InvalidParameter names no parameter");
	}
}

static bool same_operand(const struct rp_operand *x, const struct rp_operand *y)
{
	if (memcmp(&x->buffer, &y->buffer, sizeof(x->buffer)) != 0 || x->offset != y->offset || x->dtype != y->dtype ||
	    x->rank != y->rank)
		return false;
	for (int i = 0; i < x->rank; i++)
		if (x->shape[i] != y->shape[i] || x->strides[i] != y->strides[i])
			return false;
	return true;
}

/* What Varlink makes of the record's descriptor must be the descriptor. */
static void check_varlink_agrees(const struct rp_compute *c)
{
	struct rp_compute back;
	struct rp_error err = { 0 };
	cJSON *params = rp_compute_to_json(c);
	int r;

	FZ_CHECK(params != NULL, "an accepted record does not encode as a call");
	r = rp_compute_parse(c->spec, params, &back, &err);
	if (r < 0) {
		char *text = cJSON_PrintUnformatted(params);
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(err.params, "message");
		FZ_CHECK(false, "the ring accepted what Varlink refuses (%s: %s): %s", err.name,
			 cJSON_IsString(m) ? m->valuestring : "", text ? text : "?");
	}
	for (unsigned i = 0; i < c->spec->noperands; i++) {
		FZ_CHECK(back.present[i] == c->present[i], "operand %u presence differs", i);
		FZ_CHECK(!c->present[i] || same_operand(&back.operands[i], &c->operands[i]), "operand %s differs",
			 c->spec->operands[i].name);
	}
	FZ_CHECK(back.wait_event.present == c->wait_event.present &&
			 back.signal_event.present == c->signal_event.present,
		 "events differ");
	FZ_CHECK(back.deadline_ms == c->deadline_ms, "deadline_ms differs");
	if (c->spec->id == RP_OP_GEMM) {
		FZ_CHECK(memcmp(&back.gemm, &c->gemm, sizeof(back.gemm)) == 0, "GEMM scalars differ");
	} else if (c->spec->id == RP_OP_LAYER_NORM || c->spec->id == RP_OP_LAYER_NORM_BACKWARD) {
		FZ_CHECK(back.layer_norm.eps == c->layer_norm.eps && back.layer_norm.rows == c->layer_norm.rows &&
				 back.layer_norm.n == c->layer_norm.n,
			 "LayerNorm scalars differ");
		FZ_CHECK(c->spec->id == RP_OP_LAYER_NORM ? isfinite(c->layer_norm.eps) && c->layer_norm.eps > 0
							 : c->layer_norm.eps == 0,
			 "eps %g accepted", c->layer_norm.eps);
	} else {
		FZ_CHECK(back.attention.causal == c->attention.causal &&
				 back.attention.alignment == c->attention.alignment &&
				 back.attention.scale == c->attention.scale,
			 "attention scalars differ");
		FZ_CHECK(isfinite(c->attention.scale) && c->attention.scale > 0, "scale %g accepted", c->attention.scale);
	}
	cJSON_Delete(params);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rp_ring_record rec;
	struct rp_ring_completion cqe;
	struct rp_compute c;
	struct rp_error err = { 0 };
	char name[64];
	cJSON *params = NULL;
	int r;

	/* A record: the bytes, the rest of the slot zero. */
	memset(&rec, 0, sizeof(rec));
	memcpy(&rec, data, size < sizeof(rec) ? size : sizeof(rec));
	r = rp_ring_decode(&rec, ids, NIDS, &c, &err);
	if (r < 0) {
		check_refusal(r, &err);
		rp_error_clear(&err);
	} else {
		FZ_CHECK(r == 0 && err.name == NULL, "accepted with an error set");
		check_varlink_agrees(&c);
	}

	/* A completion of these bytes: parsed or refused, never trusted. */
	memset(&cqe, 0, sizeof(cqe));
	memcpy(&cqe, data, size < sizeof(cqe) ? size : sizeof(cqe));
	r = rp_ring_completion_error(&cqe, name, &params);
	FZ_CHECK(r == 0 || r == 1 || r == -EPROTO, "completion parser returned %d", r);
	cJSON_Delete(params);
	params = NULL;

	/* An error with the bytes as its message (printable, with two-byte
	 * characters where the bytes are high, as reasons hold "µs"):
	 * written, cut to fit, read back by name. */
	char text[4001];
	size_t n = 0;
	for (size_t i = 0; i < size && n + 2 < sizeof(text); i++) {
		if (data[i] & 0x80) {
			text[n++] = (char)0xc2;
			text[n++] = (char)0xb5;
		} else {
			text[n++] = (char)(0x20 + data[i] % 0x5f);
		}
	}
	text[n] = '\0';
	rp_error_set(&err, RP_ERR_INVALID_OPERAND, "%s", text);
	rp_error_add_str(&err, "operand", "a");
	rp_ring_complete(&cqe, 7, &err, 0);
	rp_error_clear(&err);
	FZ_CHECK(cqe.error_len < RP_RING_ERROR_MAX && cqe.error[cqe.error_len] == '\0', "completion text unbounded");
	r = rp_ring_completion_error(&cqe, name, &params);
	FZ_CHECK(r == 1 && strcmp(name, RP_ERR_INVALID_OPERAND) == 0, "an error written did not read back (%d): %s", r,
		 cqe.error);
	cJSON_Delete(params);
	return 0;
}
