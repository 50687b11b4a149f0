/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Lane records: any bytes as a submission record (proto/ring.h),
 * decoded as the worker decodes the copy it takes out of shared memory,
 * against an id table with buffers, events, a program and holes. A refusal
 * must be a named error naming an operand or a parameter. An accepted
 * record must be one that Varlink accepts too: its descriptor, written as
 * the call's parameters, parses back through rp_compute_parse into the
 * same descriptor, so that the ring cannot let through what a call may not
 * carry. A record whose op is a program's Run takes the bytes after it as
 * its continuations (as many as it says, where the ring may hold them) and
 * is held to the same rule against a program of 142 bound tensors: what
 * rp_ring_decode_run accepts, rp_program_run_parse reads back from its
 * parameters into the same Run. The bytes also go in as a completion,
 * which the client's parser must take or refuse without harm; and an error
 * written into a completion must come back out with its name. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "fuzz_common.h"
#include "proto/compute.h"
#include "proto/program.h"
#include "proto/ring.h"

#define NIDS 8
/* The ring a Run's span is judged against. */
#define RING_ENTRIES 32

static const struct rp_id ids[NIDS] = {
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 3, .serial = 11 },
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 3, .serial = 12 },
	{ .kind = RP_ID_EVENT, .device = 0, .generation = 3, .serial = 13 },
	{ 0 },   /* unbound */
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 2, .serial = 14 },
	{ .kind = RP_ID_EVENT, .device = 0, .generation = 3, .serial = 15 },
	{ .kind = RP_ID_BUFFER, .device = 1, .generation = 3, .serial = 16 },
	{ .kind = RP_ID_PROGRAM, .device = 0, .generation = 0, .serial = 17 },
};

/* The program Runs are decoded against: pairs y<i> = x<i> * a (f32 [4],
 * and an f16 pair for another element size) and the scalars a and b. */
#define PAIRS 70
static struct rp_program *program(void)
{
	static struct rp_program p;
	static bool defined;
	char name[16];

	if (defined)
		return &p;
	cJSON *d = cJSON_CreateObject(), *tensors = cJSON_AddArrayToObject(d, "tensors"),
	      *nodes = cJSON_AddArrayToObject(d, "nodes");
	struct rp_error err = { 0 };
	int four = 4;
	for (int i = 0; i < PAIRS; i++) {
		for (int io = 0; io < 2; io++) {
			cJSON *t = cJSON_CreateObject();

			snprintf(name, sizeof(name), "%c%d", io ? 'y' : 'x', i);
			cJSON_AddStringToObject(t, "name", name);
			cJSON_AddStringToObject(t, "kind", io ? "output" : "input");
			cJSON_AddStringToObject(t, "dtype", i == 1 ? "f16" : "f32");
			cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray(&four, 1));
			cJSON_AddItemToArray(tensors, t);
		}
		cJSON *n = cJSON_CreateObject(), *in = cJSON_AddArrayToObject(n, "inputs"),
		      *out = cJSON_AddArrayToObject(n, "outputs");
		cJSON_AddStringToObject(n, "op", "mul");
		snprintf(name, sizeof(name), "x%d", i);
		cJSON_AddItemToArray(in, cJSON_CreateString(name));
		cJSON_AddItemToArray(in, cJSON_CreateString("a"));
		snprintf(name, sizeof(name), "y%d", i);
		cJSON_AddItemToArray(out, cJSON_CreateString(name));
		cJSON_AddItemToArray(nodes, n);
	}
	for (int k = 0; k < 2; k++) {
		cJSON *t = cJSON_CreateObject();
		cJSON_AddStringToObject(t, "name", k ? "b" : "a");
		cJSON_AddStringToObject(t, "kind", "scalar");
		cJSON_AddItemToArray(tensors, t);
	}
	FZ_CHECK(rp_program_parse(d, &p, &err) == 0, "the Run's program is refused: %s", err.name);
	cJSON_Delete(d);
	defined = true;
	return &p;
}

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

static bool same_id(const struct rp_id *x, const struct rp_id *y)
{
	return x->kind == y->kind && x->device == y->device && x->generation == y->generation && x->serial == y->serial;
}

/* What Varlink makes of the Run's parameters must be the Run. */
static void check_varlink_agrees_run(const struct rp_program *p, const struct rp_program_run *run)
{
	cJSON *params = rp_program_run_to_json(p, run);
	struct rp_program_run back;
	struct rp_error err = { 0 };

	FZ_CHECK(params != NULL, "an accepted Run does not encode as a call");
	if (rp_program_run_parse(p, params, &back, &err) < 0) {
		char *text = cJSON_PrintUnformatted(params);
		FZ_CHECK(false, "the ring accepted a Run that Varlink refuses (%s): %s", err.name, text ? text : "?");
	}
	FZ_CHECK(same_id(&back.program, &run->program) && back.nbound == run->nbound, "the program differs");
	for (int i = 0; i < run->nbound; i++) {
		if (p->tensors[p->bind[i]].kind == RP_PT_SCALAR)
			FZ_CHECK(back.scalars[i] == run->scalars[i] && isfinite(run->scalars[i]), "scalar %d differs", i);
		else
			FZ_CHECK(same_id(&back.bind[i].buffer, &run->bind[i].buffer) &&
					 back.bind[i].offset == run->bind[i].offset,
				 "binding %d differs", i);
	}
	FZ_CHECK(back.wait_event.present == run->wait_event.present &&
			 back.signal_event.present == run->signal_event.present && back.deadline_ms == run->deadline_ms,
		 "events or deadline differ");
	FZ_CHECK(back.has_journal == run->has_journal && back.seq == run->seq && back.retry == run->retry &&
			 back.journal_mode == run->journal_mode &&
			 (!run->has_journal || (same_id(&back.journal.buffer, &run->journal.buffer) &&
						back.journal.offset == run->journal.offset)),
		 "the journal differs");
	rp_program_run_finish(&back);
	cJSON_Delete(params);
}

/* The bytes as a Run's records: its own (the first RECORD_SIZE bytes) and
 * the continuations it says follow, where a ring may hold them all (the
 * worker takes none of a longer span: it refuses the Run's record alone). */
static void fuzz_run(const uint8_t *data, size_t size)
{
	static union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
	const struct rp_program *p = program();
	struct rp_program_run run;
	struct rp_error err = { 0 };
	struct rp_id id;
	unsigned n;
	int r;

	memset(recs, 0, sizeof(recs));
	memcpy(recs, data, size < sizeof(recs) ? size : sizeof(recs));
	if ((r = rp_ring_run_check_span(&recs[0].run, RING_ENTRIES, &err)) < 0) {
		check_refusal(r, &err);
		rp_error_clear(&err);
		return;
	}
	n = 1u + recs[0].run.continuations;
	FZ_CHECK(n <= RP_RING_RUN_CONTINUATIONS_MAX + 1, "a span of %u records passed", n);
	if ((r = rp_ring_run_program(&recs[0].run, ids, NIDS, &id, &err)) < 0) {
		check_refusal(r, &err);
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(id.kind == RP_ID_PROGRAM, "a program index named %c", id.kind);
	r = rp_ring_decode_run(recs, 0xfffffff0u, ids, NIDS, p, &run, &err);
	if (r < 0) {
		check_refusal(r, &err);
		FZ_CHECK(run.bind == NULL, "a refused Run keeps its tables");
		rp_error_clear(&err);
		return;
	}
	FZ_CHECK(err.name == NULL && (unsigned)recs[0].run.nbind + recs[0].run.nscalars == (unsigned)p->nbound,
		 "accepted a Run of %u entries for %d bound tensors", recs[0].run.nbind + recs[0].run.nscalars,
		 p->nbound);
	check_varlink_agrees_run(p, &run);
	rp_program_run_finish(&run);
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
	if (rec.op == RP_OP_PROGRAM)
		fuzz_run(data, size);
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
	FZ_CHECK(r == 0 || r == 1 || r == 2 || r == -EPROTO, "completion parser returned %d", r);
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
