/* SPDX-License-Identifier: Apache-2.0 */
/* Ring records and completions (ring.h): a record becomes a struct
 * rp_compute and goes through rp_compute_check, the checks a Varlink call
 * goes through; a completion carries an error as Varlink would send it.
 * Which of a record's scalar fields an op takes, and where they go, is the
 * op table's (rp_op_spec.ring_scalars): nothing here is op by op. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "ring.h"

bool rp_ring_entries_valid(uint32_t entries)
{
	return entries >= RP_RING_ENTRIES_MIN && entries <= RP_RING_ENTRIES_MAX && (entries & (entries - 1)) == 0;
}

size_t rp_ring_size(uint32_t entries)
{
	if (!rp_ring_entries_valid(entries))
		return 0;
	return RP_RING_HEADER_SIZE + (size_t)entries * (RP_RING_RECORD_SIZE + RP_RING_COMPLETION_SIZE);
}

/* A record's scalar fields: where each lies, and what a refusal names it
 * by when its op does not take it. */
static const struct {
	size_t offset;               /* of a byte (the enums) or a double; flags apart */
	const char *name;
} fields[RP_RING_FIELDS] = {
	[RP_RING_FIELD_FLAG] = { offsetof(struct rp_ring_record, flags), "flags" },
	[RP_RING_FIELD_EPILOGUE] = { offsetof(struct rp_ring_record, epilogue), "epilogue" },
	[RP_RING_FIELD_COMPUTE] = { offsetof(struct rp_ring_record, compute), "compute" },
	[RP_RING_FIELD_ALIGNMENT] = { offsetof(struct rp_ring_record, alignment), "causal_alignment" },
	[RP_RING_FIELD_ALPHA] = { offsetof(struct rp_ring_record, alpha), "alpha" },
	[RP_RING_FIELD_BETA] = { offsetof(struct rp_ring_record, beta), "beta" },
	[RP_RING_FIELD_SCALE] = { offsetof(struct rp_ring_record, scale), "scale" },
};

static bool is_byte(enum rp_ring_field f)
{
	return f == RP_RING_FIELD_EPILOGUE || f == RP_RING_FIELD_COMPUTE || f == RP_RING_FIELD_ALIGNMENT;
}

/* The enums of struct rp_compute are stored as unsigned-sized values. */
_Static_assert(sizeof(enum rp_epilogue) == sizeof(unsigned) && sizeof(enum rp_compute_mode) == sizeof(unsigned) &&
		       sizeof(enum rp_causal_alignment) == sizeof(unsigned) && sizeof(enum rp_fp8_format) == sizeof(unsigned) &&
		       sizeof(enum rp_amax_compute) == sizeof(unsigned),
	       "enums are unsigned-sized");

/* Whether the record's field f (not the flags) holds anything but 0. */
static bool field_set(const struct rp_ring_record *rec, enum rp_ring_field f)
{
	const char *at = (const char *)rec + fields[f].offset;
	double d;

	if (is_byte(f))
		return *(const uint8_t *)at != 0;
	memcpy(&d, at, sizeof(d));
	return d != 0.0;
}

/* The record's scalars into c, by the op's list: a field the op does not
 * take must be 0, and a flag it does not take unset, as a call may not
 * carry another operation's parameters. */
static int decode_scalars(const struct rp_ring_record *rec, struct rp_compute *c, struct rp_error *err)
{
	unsigned taken = 1u << RP_RING_FIELD_FLAG;
	uint16_t flags = 0;
	const struct rp_op_ring_scalar *rs;

	for (rs = c->spec->ring_scalars; rs && rs->name; rs++) {
		if (rs->field == RP_RING_FIELD_FLAG)
			flags |= rs->flag;
		else
			taken |= 1u << rs->field;
	}
	if (rec->flags & ~flags)
		return rp_error_invalid_parameter(err, "flags");
	for (int f = 0; f < RP_RING_FIELDS; f++)
		if (!(taken & (1u << f)) && field_set(rec, (enum rp_ring_field)f))
			return rp_error_invalid_parameter(err, fields[f].name);
	for (rs = c->spec->ring_scalars; rs && rs->name; rs++) {
		const char *from = (const char *)rec + fields[rs->field].offset;
		char *to = (char *)c + rs->offset;

		if (rs->field == RP_RING_FIELD_FLAG) {
			*(bool *)to = (rec->flags & rs->flag) != 0;
		} else if (is_byte(rs->field)) {
			unsigned v = *(const uint8_t *)from;
			memcpy(to, &v, sizeof(v));
		} else {
			memcpy(to, from, sizeof(double));
		}
	}
	return 0;
}

static void encode_scalars(const struct rp_compute *c, struct rp_ring_record *rec)
{
	for (const struct rp_op_ring_scalar *rs = c->spec->ring_scalars; rs && rs->name; rs++) {
		const char *from = (const char *)c + rs->offset;
		char *to = (char *)rec + fields[rs->field].offset;

		if (rs->field == RP_RING_FIELD_FLAG) {
			if (*(const bool *)from)
				rec->flags |= rs->flag;
		} else if (is_byte(rs->field)) {
			unsigned v;
			memcpy(&v, from, sizeof(v));
			*(uint8_t *)to = (uint8_t)v;
		} else {
			memcpy(to, from, sizeof(double));
		}
	}
}

static int decode_operand(const struct rp_ring_operand *ro, const char *name, const struct rp_id *ids, uint32_t nids,
			  struct rp_operand *op, struct rp_error *err)
{
	if (ro->index >= nids || ids[ro->index].kind == 0)
		return rp_error_invalid_operand(err, name,
						"index %u is not bound on this lane (io.regen.Lane.Bind fills the id table)",
						ro->index);
	if (ro->reserved != 0)
		return rp_error_invalid_parameter(err, "reserved");
	op->buffer = ids[ro->index];
	op->offset = ro->offset;
	op->dtype = (enum rp_dtype)ro->dtype;
	op->rank = ro->rank;
	if (ro->rank < 1 || ro->rank > RP_RANK_MAX) {
		char field[96];
		snprintf(field, sizeof(field), "%s.shape", name);
		return rp_error_invalid_parameter(err, field);
	}
	for (int i = 0; i < ro->rank; i++) {
		op->shape[i] = ro->shape[i];
		op->strides[i] = ro->strides[i];
	}
	return 0;
}

static int decode_event(uint32_t index, const char *name, const struct rp_id *ids, uint32_t nids,
			struct rp_event_ref *ev, struct rp_error *err)
{
	memset(ev, 0, sizeof(*ev));
	if (index == RP_RING_NONE)
		return 0;
	if (index >= nids || ids[index].kind != RP_ID_EVENT)
		return rp_error_invalid_parameter(err, name);
	ev->present = true;
	ev->id = ids[index];
	return 0;
}

static int decode(const struct rp_ring_record *rec, const struct rp_id *ids, uint32_t nids, struct rp_compute *c,
		  struct rp_error *err)
{
	const struct rp_op_spec *spec = rp_op_get((enum rp_op_id)rec->op);
	int r;

	if (spec == NULL)
		return rp_error_invalid_parameter(err, "op");
	c->spec = spec;
	if (rec->reserved0 || rec->reserved1 || rec->reserved2)
		return rp_error_invalid_parameter(err, "reserved");
	for (unsigned i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		const struct rp_ring_operand *ro = &rec->operands[i];

		if (ro->index == RP_RING_NONE)
			continue;
		if (i >= spec->noperands)
			return rp_error_invalid_parameter(err, "operands");
		if ((r = decode_operand(ro, spec->operands[i].name, ids, nids, &c->operands[i], err)) < 0)
			return r;
		c->present[i] = true;
	}
	if ((r = decode_event(rec->wait_event, "wait_event", ids, nids, &c->wait_event, err)) < 0 ||
	    (r = decode_event(rec->signal_event, "signal_event", ids, nids, &c->signal_event, err)) < 0)
		return r;
	/* 0 is the worker's default, as an absent deadline_ms in a call. */
	if (rec->deadline_ms > RP_DEADLINE_MS_MAX)
		return rp_error_invalid_parameter(err, "deadline_ms");
	c->deadline_ms = rec->deadline_ms;
	return decode_scalars(rec, c, err);
}

int rp_ring_decode_fields(const struct rp_ring_record *rec, const struct rp_id *ids, uint32_t nids,
			  struct rp_compute *c, struct rp_error *err)
{
	int r;

	memset(c, 0, sizeof(*c));
	r = decode(rec, ids, nids, c, err);
	if (r < 0)
		memset(c, 0, sizeof(*c));
	return r;
}

int rp_ring_decode(const struct rp_ring_record *rec, const struct rp_id *ids, uint32_t nids, struct rp_compute *c,
		   struct rp_error *err)
{
	int r = rp_ring_decode_fields(rec, ids, nids, c, err);

	return r < 0 ? r : rp_compute_check(c, err);
}

void rp_ring_encode(const struct rp_compute *c, const uint32_t index_of[RP_OP_OPERANDS_MAX], uint32_t wait,
		    uint32_t signal, uint64_t tag, struct rp_ring_record *rec)
{
	memset(rec, 0, offsetof(struct rp_ring_record, pad));
	rec->tag = tag;
	rec->op = (uint16_t)c->spec->id;
	rec->wait_event = wait;
	rec->signal_event = signal;
	rec->deadline_ms = c->deadline_ms;
	for (unsigned i = 0; i < RP_OP_OPERANDS_MAX; i++) {
		struct rp_ring_operand *ro = &rec->operands[i];
		const struct rp_operand *op = &c->operands[i];

		if (i >= c->spec->noperands || !c->present[i]) {
			ro->index = RP_RING_NONE;
			continue;
		}
		ro->index = index_of[i];
		ro->dtype = (uint8_t)op->dtype;
		ro->rank = (uint8_t)op->rank;
		ro->offset = op->offset;
		for (int d = 0; d < op->rank && d < RP_RANK_MAX; d++) {
			ro->shape[d] = op->shape[d];
			ro->strides[d] = op->strides[d];
		}
	}
	encode_scalars(c, rec);
}

/* Cuts every string parameter to `keep` characters. */
static void shorten_strings(cJSON *params, size_t keep)
{
	cJSON *item;

	cJSON_ArrayForEach(item, params) {
		if (cJSON_IsString(item) && strlen(item->valuestring) > keep) {
			char cut[512];
			size_t at = keep;

			/* Never inside a character: the text must stay UTF-8. */
			while (at > 0 && ((unsigned char)item->valuestring[at] & 0xc0) == 0x80)
				at--;
			snprintf(cut, sizeof(cut), "%.*s...", (int)at, item->valuestring);
			cJSON_SetValuestring(item, cut);
		}
	}
}

void rp_ring_complete(struct rp_ring_completion *cqe, uint64_t tag, const struct rp_error *err, uint64_t elapsed_us)
{
	char *text = NULL;

	cqe->tag = tag;
	cqe->elapsed_us = elapsed_us;
	cqe->head = 0;
	cqe->reserved = 0;
	if (err == NULL || err->name == NULL) {
		cqe->status = RP_RING_STATUS_OK;
		cqe->error_len = 0;
		cqe->error_name[0] = '\0';
		cqe->error[0] = '\0';
		return;
	}
	cqe->status = RP_RING_STATUS_ERROR;
	snprintf(cqe->error_name, sizeof(cqe->error_name), "%s", err->name);
	text = rp_build_error(err);
	if (text != NULL && strlen(text) >= RP_RING_ERROR_MAX && err->params != NULL) {
		/* Messages and reasons are the long parts: cut them, so that the
		 * error keeps its name and every parameter. */
		struct rp_error shorter = { .name = err->name, .params = cJSON_Duplicate(err->params, true) };

		free(text);
		text = NULL;
		for (size_t keep = 256; shorter.params != NULL && keep >= 16; keep /= 2) {
			shorten_strings(shorter.params, keep);
			text = rp_build_error(&shorter);
			if (text == NULL || strlen(text) < RP_RING_ERROR_MAX)
				break;
			free(text);
			text = NULL;
		}
		cJSON_Delete(shorter.params);
	}
	if (text == NULL || strlen(text) >= RP_RING_ERROR_MAX) {
		free(text);
		snprintf(cqe->error, sizeof(cqe->error), "{\"error\":\"%s\",\"parameters\":{}}", cqe->error_name);
	} else {
		memcpy(cqe->error, text, strlen(text) + 1);
		free(text);
	}
	cqe->error_len = (uint32_t)strlen(cqe->error);
}

void rp_ring_complete_continuation(struct rp_ring_completion *cqe, uint64_t tag, uint32_t head)
{
	rp_ring_complete(cqe, tag, NULL, 0);
	cqe->status = RP_RING_STATUS_CONTINUATION;
	cqe->head = head;
}

int rp_ring_completion_error(const struct rp_ring_completion *cqe, char name[64], cJSON **params)
{
	struct rp_call reply = { 0 };
	struct rp_error perr = { 0 };
	size_t len;

	*params = NULL;
	name[0] = '\0';
	if (cqe->status == RP_RING_STATUS_OK)
		return 0;
	if (cqe->status == RP_RING_STATUS_CONTINUATION)
		return 2;
	len = strnlen(cqe->error, sizeof(cqe->error));
	if (cqe->status != RP_RING_STATUS_ERROR || len == sizeof(cqe->error))
		return -EPROTO;
	if (rp_call_parse(cqe->error, len, &reply, &perr) < 0 || reply.error == NULL || reply.method != NULL) {
		rp_error_clear(&perr);
		rp_call_finish(&reply);
		return -EPROTO;
	}
	snprintf(name, 64, "%s", reply.error);
	*params = cJSON_Duplicate(reply.params, true);
	rp_call_finish(&reply);
	return 1;
}
