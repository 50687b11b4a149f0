/* SPDX-License-Identifier: Apache-2.0 */
/* proto/ring_run.c: a program's Run as ring records. A Run written by
 * rp_ring_encode_run decodes into the struct rp_program_run that Varlink's
 * parser makes of the same Run's parameters, whatever its size (one record,
 * exactly full, spilling into one or several continuations); every refusal
 * is by name, the ones a call can make too with the name Varlink gives;
 * continuations that are not the Run's (another op, part or head), counts
 * past the limits, and mutated continuation bytes are refused by name or
 * decode into what Varlink agrees with, never anything else; a
 * continuation's completion says whose it is. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/errors.h"
#include "proto/program.h"
#include "proto/ring.h"
#include "unit.h"

/* Pairs x<i> -> y<i> (neg), then the scalar "lr": 2 * PAIRS + 1 bound
 * tensors, in binding order x0, y0, x1, y1, ..., lr. */
#define PAIRS 70
#define NBOUND (2 * PAIRS + 1)
#define LR (NBOUND - 1)

/* The lane's id table: buffers 0 and 1, an event, a hole, the program, a
 * buffer of another generation. */
#define NIDS 6
static const struct rp_id ids[NIDS] = {
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 2, .serial = 5 },
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 2, .serial = 6 },
	{ .kind = RP_ID_EVENT, .device = 0, .generation = 2, .serial = 7 },
	{ 0 },
	{ .kind = RP_ID_PROGRAM, .device = 0, .generation = 0, .serial = 9 },
	{ .kind = RP_ID_BUFFER, .device = 0, .generation = 1, .serial = 10 },
};
#define BUF0 0
#define BUF1 1
#define EVENT 2
#define HOLE 3
#define PROGRAM 4

static struct rp_program prog;

static void define(void)
{
	cJSON *d = cJSON_CreateObject(), *tensors = cJSON_AddArrayToObject(d, "tensors"),
	      *nodes = cJSON_AddArrayToObject(d, "nodes");
	struct rp_error err = { 0 };
	char name[16];

	cJSON_AddStringToObject(d, "name", "pairs");
	for (int i = 0; i < PAIRS; i++) {
		for (int io = 0; io < 2; io++) {
			cJSON *t = cJSON_CreateObject();
			int four = 4;

			snprintf(name, sizeof(name), "%c%d", io ? 'y' : 'x', i);
			cJSON_AddStringToObject(t, "name", name);
			cJSON_AddStringToObject(t, "kind", io ? "output" : "input");
			cJSON_AddStringToObject(t, "dtype", "f32");
			cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray(&four, 1));
			cJSON_AddItemToArray(tensors, t);
		}
		cJSON *n = cJSON_CreateObject(), *in = cJSON_AddArrayToObject(n, "inputs"),
		      *out = cJSON_AddArrayToObject(n, "outputs");
		cJSON_AddStringToObject(n, "op", "neg");
		snprintf(name, sizeof(name), "x%d", i);
		cJSON_AddItemToArray(in, cJSON_CreateString(name));
		snprintf(name, sizeof(name), "y%d", i);
		cJSON_AddItemToArray(out, cJSON_CreateString(name));
		cJSON_AddItemToArray(nodes, n);
	}
	cJSON *lr = cJSON_CreateObject();
	cJSON_AddStringToObject(lr, "name", "lr");
	cJSON_AddStringToObject(lr, "kind", "scalar");
	cJSON_AddItemToArray(tensors, lr);
	ck_assert_msg(rp_program_parse(d, &prog, &err) == 0, "the test's program: %s", err.name);
	ck_assert_int_eq(prog.nbound, NBOUND);
	ck_assert_str_eq(prog.tensors[prog.bind[LR]].name, "lr");
	cJSON_Delete(d);
}

static void setup(void)
{
	define();
}

static void teardown(void)
{
	rp_program_finish(&prog);
}

/* A Run of the first `n` positions of PAIRS' tensors bound (x on buffer 0,
 * y on buffer 1, each 16 bytes further), lr given, events and a journal. */
struct run_spec {
	struct rp_ring_binding bind[NBOUND];
	struct rp_ring_scalar scalars[1];
	struct rp_ring_run_call call;
};

static void full_run(struct run_spec *s)
{
	memset(s, 0, sizeof(*s));
	for (int i = 0; i < NBOUND - 1; i++)
		s->bind[i] = (struct rp_ring_binding){ .bound = (uint32_t)i, .buffer = i % 2 ? BUF1 : BUF0,
						       .offset = (uint64_t)(i / 2) * 16 };
	s->scalars[0] = (struct rp_ring_scalar){ .bound = LR, .value = 1e-3 };
	s->call = (struct rp_ring_run_call){
		.program = PROGRAM, .wait_event = EVENT, .signal_event = RP_RING_NONE, .journal = BUF1,
		.journal_offset = 4096, .seq = 17, .retry = true, .deadline_ms = 250,
		.bind = s->bind, .nbind = NBOUND - 1, .scalars = s->scalars, .nscalars = 1,
	};
}

/* The records of a Run, as the ring holds them from `head` on. */
static unsigned encode(const struct rp_ring_run_call *call, uint32_t head, union rp_ring_slot *recs)
{
	unsigned n = RP_RING_RUN_RECORDS(call->nbind + call->nscalars);

	for (unsigned part = 0; part < n; part++)
		rp_ring_encode_run(call, 100, head, part, &recs[part]);
	return n;
}

/* Ids by their fields (a struct copy leaves its padding undefined). */
static void assert_same_id(const struct rp_id *a, const struct rp_id *b)
{
	ck_assert_int_eq(a->kind, b->kind);
	ck_assert_uint_eq(a->device, b->device);
	ck_assert_uint_eq(a->generation, b->generation);
	ck_assert_uint_eq(a->serial, b->serial);
}

/* What Varlink makes of the decoded Run's parameters is the decoded Run. */
static void assert_varlink_agrees(const struct rp_program_run *run)
{
	cJSON *params = rp_program_run_to_json(&prog, run);
	struct rp_program_run back;
	struct rp_error err = { 0 };

	ck_assert_ptr_nonnull(params);
	ck_assert_msg(rp_program_run_parse(&prog, params, &back, &err) == 0, "Varlink refuses what the ring took: %s",
		      err.name);
	assert_same_id(&back.program, &run->program);
	ck_assert_int_eq(back.nbound, run->nbound);
	for (int i = 0; i < run->nbound; i++) {
		if (prog.tensors[prog.bind[i]].kind == RP_PT_SCALAR) {
			ck_assert(back.scalars[i] == run->scalars[i]);
		} else {
			assert_same_id(&back.bind[i].buffer, &run->bind[i].buffer);
			ck_assert_uint_eq(back.bind[i].offset, run->bind[i].offset);
		}
	}
	ck_assert(back.wait_event.present == run->wait_event.present &&
		  back.signal_event.present == run->signal_event.present);
	if (back.wait_event.present)
		assert_same_id(&back.wait_event.id, &run->wait_event.id);
	if (back.signal_event.present)
		assert_same_id(&back.signal_event.id, &run->signal_event.id);
	ck_assert_uint_eq(back.deadline_ms, run->deadline_ms);
	ck_assert(back.has_journal == run->has_journal && back.retry == run->retry);
	ck_assert_int_eq(back.journal_mode, run->journal_mode);
	ck_assert_uint_eq(back.seq, run->seq);
	if (back.has_journal) {
		assert_same_id(&back.journal.buffer, &run->journal.buffer);
		ck_assert_uint_eq(back.journal.offset, run->journal.offset);
	}
	rp_program_run_finish(&back);
	cJSON_Delete(params);
}

START_TEST(a_run_spans_the_records_its_entries_need)
{
	ck_assert_uint_eq(RP_RING_RUN_ENTRIES, 60);
	ck_assert_uint_eq(RP_RING_CONTINUATION_ENTRIES, 63);
	ck_assert_uint_eq(RP_RING_RUN_RECORDS(0), 1);
	ck_assert_uint_eq(RP_RING_RUN_RECORDS(60), 1);
	ck_assert_uint_eq(RP_RING_RUN_RECORDS(61), 2);
	ck_assert_uint_eq(RP_RING_RUN_RECORDS(123), 2);
	ck_assert_uint_eq(RP_RING_RUN_RECORDS(124), 3);
	ck_assert_uint_eq(RP_RING_RUN_RECORDS(RP_PROG_BOUND_MAX), 17);
	ck_assert_uint_eq(RP_RING_RUN_CONTINUATIONS_MAX, 16);
	ck_assert_uint_eq(offsetof(struct rp_ring_run, entries), 64);
	ck_assert_uint_eq(offsetof(struct rp_ring_continuation, entries), 16);
	ck_assert_uint_eq(offsetof(struct rp_ring_completion, head), 984);
}
END_TEST

START_TEST(a_run_decodes_as_varlink_parses_it)
{
	struct run_spec s;
	union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
	struct rp_program_run run;
	struct rp_error err = { 0 };
	struct rp_id pid;

	full_run(&s);
	ck_assert_uint_eq(encode(&s.call, 7, recs), 3);   /* 141 entries: 60 + 63 + 18 */
	ck_assert_uint_eq(recs[0].run.continuations, 2);
	ck_assert_uint_eq(recs[1].continuation.part, 1);
	ck_assert_uint_eq(recs[2].continuation.head, 7);
	ck_assert_uint_eq(recs[2].continuation.tag, 102);
	ck_assert_int_eq(rp_ring_run_check_span(&recs[0].run, 4, &err), 0);
	ck_assert_int_eq(rp_ring_run_program(&recs[0].run, ids, NIDS, &pid, &err), 0);
	ck_assert_uint_eq(pid.serial, 9);
	ck_assert_int_eq(rp_ring_decode_run(recs, 7, ids, NIDS, &prog, &run, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_uint_eq(run.program.serial, 9);
	for (int i = 0; i < NBOUND - 1; i++) {
		ck_assert_uint_eq(run.bind[i].buffer.serial, i % 2 ? 6 : 5);
		ck_assert_uint_eq(run.bind[i].offset, (uint64_t)(i / 2) * 16);
	}
	ck_assert(run.scalars[LR] == 1e-3);
	ck_assert(run.wait_event.present && run.wait_event.id.serial == 7 && !run.signal_event.present);
	ck_assert(run.has_journal && run.retry && run.seq == 17 && run.journal.offset == 4096);
	ck_assert_uint_eq(run.journal.buffer.serial, 6);
	ck_assert_uint_eq(run.deadline_ms, 250);
	ck_assert_int_eq(run.journal_mode, RP_JOURNAL_COPY);
	assert_varlink_agrees(&run);
	rp_program_run_finish(&run);
}
END_TEST

/* A journal of marks only: its flag in the record, "mode": "marks" in
 * the call, the same Run either way. */
START_TEST(a_marks_journal_decodes_as_varlink_parses_it)
{
	struct run_spec s;
	union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
	struct rp_program_run run;
	struct rp_error err = { 0 };

	full_run(&s);
	s.call.journal_marks = true;
	encode(&s.call, 7, recs);
	ck_assert_uint_eq(recs[0].run.flags, RP_RING_RUN_RETRY | RP_RING_RUN_JOURNAL_MARKS);
	ck_assert_int_eq(rp_ring_decode_run(recs, 7, ids, NIDS, &prog, &run, &err), 0);
	ck_assert(run.has_journal && run.retry && run.seq == 17 && run.journal_mode == RP_JOURNAL_MARKS);
	assert_varlink_agrees(&run);
	cJSON *params = rp_program_run_to_json(&prog, &run);
	const cJSON *mode = cJSON_GetObjectItem(cJSON_GetObjectItem(params, "journal"), "mode");
	ck_assert(cJSON_IsString(mode) && strcmp(mode->valuestring, "marks") == 0);
	cJSON_Delete(params);
	rp_program_run_finish(&run);
}
END_TEST

/* The sizes around each record's edge: the program cut to its first n - 1
 * bound positions and its scalar (moved to position n - 1), so that a Run
 * of n entries is complete. */
START_TEST(every_size_round_trips)
{
	static const unsigned sizes[] = { 1, 59, 60, 61, 62, 122, 123, 124, 125, NBOUND };

	for (unsigned k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		struct run_spec s;
		union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
		struct rp_program_run run;
		struct rp_error err = { 0 };
		unsigned n = sizes[k];
		const int saved = prog.nbound, saved_bind = prog.bind[n - 1];

		full_run(&s);
		/* The program's first n - 1 positions and its scalar. */
		s.call.nbind = n - 1;
		prog.bind[n - 1] = prog.bind[LR];
		s.scalars[0].bound = n - 1;
		prog.nbound = (int)n;
		rp_program_index_bound(&prog);
		s.call.journal = RP_RING_NONE;
		s.call.journal_offset = s.call.seq = 0;
		s.call.retry = false;
		unsigned records = encode(&s.call, 0xfffffffeu, recs);   /* its head about to wrap */
		ck_assert_uint_eq(records, n <= 60 ? 1 : n <= 123 ? 2 : 3);
		int r = rp_ring_decode_run(recs, 0xfffffffeu, ids, NIDS, &prog, &run, &err);
		ck_assert_msg(r == 0, "%u entries: %s", n, err.name);
		ck_assert_int_eq(run.nbound, (int)n);
		ck_assert(run.scalars[n - 1] == 1e-3);
		assert_varlink_agrees(&run);
		rp_program_run_finish(&run);
		prog.nbound = saved;
		prog.bind[n - 1] = saved_bind;
		rp_program_index_bound(&prog);
	}
}
END_TEST

/* Refused, with `error` naming `value` under `key`. */
static void expect_refused(const union rp_ring_slot *recs, uint32_t head, const char *error, const char *key,
			   const char *value, const char *what)
{
	struct rp_program_run run;
	struct rp_error err = { 0 };
	const cJSON *v;

	ck_assert_msg(rp_ring_decode_run(recs, head, ids, NIDS, &prog, &run, &err) == -EINVAL, "%s: accepted", what);
	ck_assert_msg(err.name && strcmp(err.name, error) == 0, "%s: %s, not %s", what, err.name, error);
	v = cJSON_GetObjectItemCaseSensitive(err.params, key);
	ck_assert_msg(cJSON_IsString(v) && strcmp(v->valuestring, value) == 0, "%s: %s is '%s', not '%s'", what, key,
		      cJSON_IsString(v) ? v->valuestring : "(none)", value);
	ck_assert_ptr_null(run.bind);
	rp_error_clear(&err);
}

/* The same mistake in a call's parameters: refused with the same name. */
static void varlink_refuses_alike(const char *params_text, const char *error, const char *key, const char *value)
{
	cJSON *params = cJSON_Parse(params_text);
	struct rp_program_run run;
	struct rp_error err = { 0 };
	const cJSON *v;

	ck_assert_ptr_nonnull(params);
	ck_assert_int_eq(rp_program_run_parse(&prog, params, &run, &err), -EINVAL);
	ck_assert_str_eq(err.name, error);
	v = cJSON_GetObjectItemCaseSensitive(err.params, key);
	ck_assert_msg(cJSON_IsString(v) && strcmp(v->valuestring, value) == 0, "Varlink names '%s', the ring '%s'",
		      cJSON_IsString(v) ? v->valuestring : "(none)", value);
	rp_error_clear(&err);
	cJSON_Delete(params);
}

/* full_run's Run as a call, its last binding or its scalar changed by
 * `edit` (a JSON fragment that replaces the tail). */
static char *varlink_text(const char *tail)
{
	static char text[16384];
	size_t n = 0;

	n += (size_t)snprintf(text + n, sizeof(text) - n, "{\"program\":\"p0.0.9\",\"bind\":{");
	for (int i = 0; i < NBOUND - 1; i++)
		n += (size_t)snprintf(text + n, sizeof(text) - n, "%s\"%c%d\":{\"buffer\":\"%s\",\"offset\":%d}",
				      i ? "," : "", i % 2 ? 'y' : 'x', i / 2, i % 2 ? "b0.2.6" : "b0.2.5", (i / 2) * 16);
	snprintf(text + n, sizeof(text) - n, "}%s}", tail);
	return text;
}

START_TEST(what_only_records_say_is_refused_by_name)
{
	struct run_spec s;
	union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1], bad[RP_RING_RUN_CONTINUATIONS_MAX + 1];
	struct rp_error err = { 0 };
	struct rp_id pid;

	full_run(&s);
	encode(&s.call, 7, recs);
#define AGAIN() memcpy(bad, recs, sizeof(recs))
	AGAIN();
	bad[0].run.reserved0 = 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "reserved", "reserved0");
	AGAIN();
	bad[0].run.reserved1 = 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "reserved", "reserved1");
	AGAIN();
	bad[0].run.flags |= 0x8;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "flags", "an unknown flag");
	AGAIN();
	bad[0].run.nbind = RP_PROG_BOUND_MAX + 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "nbind", "nbind past the bound maximum");
	AGAIN();
	bad[0].run.nscalars = RP_PROG_BOUND_MAX;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "nscalars", "entries past the bound maximum");
	AGAIN();
	bad[0].run.continuations = 3;   /* 141 entries need 2 */
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "continuations", "one continuation too many");
	AGAIN();
	bad[0].run.continuations = 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "continuations", "one continuation too few");
	/* A torn or stale continuation: another op, part or head. */
	AGAIN();
	bad[2].continuation.op = RP_OP_GEMM;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "continuations[2]", "a call where a part goes");
	AGAIN();
	bad[1].continuation.part = 2;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "continuations[1]", "parts out of order");
	AGAIN();
	expect_refused(bad, 7 - 256, RP_ERR_INVALID_PARAMETER, "parameter", "continuations[1]",
		       "a previous lap's continuations");
	AGAIN();
	bad[2].continuation.entries[62].binding.bound = 1;   /* past the list's end */
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "reserved", "an entry past the list");
	/* Positions past the program's bound tensors. */
	AGAIN();
	bad[0].run.entries[3].binding.bound = NBOUND + 4;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "bind[145]", "a binding past the program's");
	AGAIN();
	bad[2].continuation.entries[17].scalar.bound = 5000;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "scalars[5000]", "a scalar past the program's");
	AGAIN();
	bad[2].continuation.entries[17].scalar.reserved = 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "reserved", "a scalar's reserved word");
	/* Indexes that hold the wrong thing. */
	AGAIN();
	bad[0].run.entries[0].binding.buffer = HOLE;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "bind.x0.buffer", "a hole for a buffer");
	AGAIN();
	bad[1].continuation.entries[0].binding.buffer = EVENT;   /* entry 60: x30 */
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "bind.x30.buffer", "an event for a buffer");
	AGAIN();
	bad[0].run.entries[1].binding.buffer = 4096;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "bind.y0.buffer", "an index past the table");
	AGAIN();
	bad[0].run.wait_event = BUF0;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "wait_event", "a buffer for an event");
	AGAIN();
	bad[0].run.signal_event = NIDS;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "signal_event", "an event past the table");
	AGAIN();
	bad[0].run.program = BUF0;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "program", "a buffer for a program");
	ck_assert_int_eq(rp_ring_run_program(&bad[0].run, ids, NIDS, &pid, &err), -EINVAL);
	rp_error_clear(&err);
	bad[0].run.program = RP_RING_NONE;
	ck_assert_int_eq(rp_ring_run_program(&bad[0].run, ids, NIDS, &pid, &err), -EINVAL);
	rp_error_clear(&err);
	AGAIN();
	bad[0].run.journal = EVENT;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "journal.buffer", "an event for a journal");
	AGAIN();
	bad[0].run.journal = RP_RING_NONE;
	bad[0].run.journal_offset = 0;
	bad[0].run.flags = 0;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "journal", "a seq without a journal");
	bad[0].run.seq = 0;
	bad[0].run.flags = RP_RING_RUN_RETRY;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "retry", "a retry without a journal");
	bad[0].run.flags = RP_RING_RUN_JOURNAL_MARKS;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "journal.mode", "marks without a journal");
	bad[0].run.flags = 0;
	bad[0].run.journal_offset = 8;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "journal.offset", "an offset without a journal");
	AGAIN();
	bad[0].run.journal_offset = 4100;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "journal.offset", "a journal not 8-aligned");
	AGAIN();
	bad[0].run.seq = (UINT64_C(1) << 53) + 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "seq", "a seq JSON cannot say");
	AGAIN();
	bad[0].run.deadline_ms = RP_DEADLINE_MS_MAX + 1;
	expect_refused(bad, 7, RP_ERR_INVALID_PARAMETER, "parameter", "deadline_ms", "a deadline past a day");
#undef AGAIN
}
END_TEST

/* The checks a call makes too: the ring names them as Varlink does. */
START_TEST(what_a_call_says_wrong_is_refused_as_varlink_refuses_it)
{
	struct run_spec s;
	union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];

	/* A position given twice (y69's binding names x0's position). */
	full_run(&s);
	s.bind[NBOUND - 2].bound = 0;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "bind.x0", "a position bound twice");
	/* The scalar bound as a buffer, a buffer given as a scalar. */
	full_run(&s);
	s.bind[0].bound = LR;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "bind.lr", "a scalar bound to a buffer");
	full_run(&s);
	s.scalars[0].bound = 4;
	s.call.nbind = 4;   /* x0 .. y1 bound; x2 given a value */
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "scalars.x2", "a buffer's tensor given a value");
	/* A scalar not finite. */
	full_run(&s);
	s.scalars[0].value = NAN;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "scalars.lr", "NaN");
	s.scalars[0].value = -INFINITY;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "scalars.lr", "an infinity");
	/* One missing. */
	full_run(&s);
	s.call.nscalars = 0;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "scalars.lr", "the scalar missing");
	varlink_refuses_alike(varlink_text(""), RP_ERR_INVALID_PARAMETER, "parameter", "scalars.lr");
	full_run(&s);
	s.call.nbind = NBOUND - 2;   /* y69 unbound */
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "bind.y69", "a binding missing");
	/* An offset past what JSON says exactly, and a misaligned one. */
	full_run(&s);
	s.bind[5].offset = (UINT64_C(1) << 53) + 4;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "bind.y2.offset", "an offset past 2^53");
	full_run(&s);
	s.bind[5].offset = 18;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_OPERAND, "operand", "y2", "a misaligned offset");
	/* A journal and its offset. */
	full_run(&s);
	s.call.journal_offset = 4;
	encode(&s.call, 3, recs);
	expect_refused(recs, 3, RP_ERR_INVALID_PARAMETER, "parameter", "journal.offset", "a journal at 4");
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":0.001},\"journal\":{\"buffer\":\"b0.2.6\",\"offset\":4},"
					   "\"seq\":17"),
			      RP_ERR_INVALID_PARAMETER, "parameter", "journal.offset");
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":0.001},\"seq\":17"), RP_ERR_INVALID_PARAMETER,
			      "parameter", "journal");
	/* A journal's mode: copy or marks, a string. */
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":0.001},\"journal\":{\"buffer\":\"b0.2.6\","
					   "\"mode\":\"twice\"},\"seq\":17"),
			      RP_ERR_INVALID_PARAMETER, "parameter", "journal.mode");
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":0.001},\"journal\":{\"buffer\":\"b0.2.6\","
					   "\"mode\":1},\"seq\":17"),
			      RP_ERR_INVALID_PARAMETER, "parameter", "journal.mode");
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":0.001},\"journal\":{\"buffer\":\"b0.2.6\","
					   "\"marks\":true},\"seq\":17"),
			      RP_ERR_INVALID_PARAMETER, "parameter", "journal.marks");
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":0.001},\"retry\":true"), RP_ERR_INVALID_PARAMETER,
			      "parameter", "retry");
	varlink_refuses_alike(varlink_text(",\"scalars\":{\"lr\":\"x\"}"), RP_ERR_INVALID_PARAMETER, "parameter",
			      "scalars.lr");
}
END_TEST

/* A continuation's count past the limits is refused before the worker
 * waits for it: past RP_RING_RUN_CONTINUATIONS_MAX, or more records than
 * the ring holds. */
START_TEST(a_span_past_the_limits_is_refused)
{
	struct rp_ring_run run;
	struct rp_error err = { 0 };
	const cJSON *v;

	memset(&run, 0, sizeof(run));
	run.op = RP_OP_PROGRAM;
	run.continuations = RP_RING_RUN_CONTINUATIONS_MAX;
	ck_assert_int_eq(rp_ring_run_check_span(&run, 32, &err), 0);
	ck_assert_int_eq(rp_ring_run_check_span(&run, 17, &err), 0);
	ck_assert_int_eq(rp_ring_run_check_span(&run, 16, &err), -EINVAL);
	v = cJSON_GetObjectItemCaseSensitive(err.params, "parameter");
	ck_assert_str_eq(v->valuestring, "continuations");
	rp_error_clear(&err);
	run.continuations = RP_RING_RUN_CONTINUATIONS_MAX + 1;
	ck_assert_int_eq(rp_ring_run_check_span(&run, 1024, &err), -EINVAL);
	rp_error_clear(&err);
	run.continuations = 0xffff;
	ck_assert_int_eq(rp_ring_run_check_span(&run, 1024, &err), -EINVAL);
	rp_error_clear(&err);
	run.continuations = 1;
	ck_assert_int_eq(rp_ring_run_check_span(&run, 2, &err), 0);
}
END_TEST

/* A record decoder for calls takes neither a Run's record nor a lone
 * continuation: the worker sends Runs to rp_ring_decode_run, and a
 * continuation is never a call of its own. */
START_TEST(a_lone_continuation_is_no_call)
{
	struct run_spec s;
	union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
	struct rp_compute c;
	struct rp_error err = { 0 };

	full_run(&s);
	encode(&s.call, 0, recs);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(rp_ring_decode(&recs[k].call, ids, NIDS, &c, &err), -EINVAL);
		ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(err.params, "parameter")->valuestring, "op");
		rp_error_clear(&err);
	}
}
END_TEST

/* Random bytes written over a continuation (a client still writing it, or
 * writing nonsense): each Run is refused by name or decodes into what
 * Varlink agrees with. */
START_TEST(a_mutated_continuation_is_refused_or_agreed)
{
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
	unsigned accepted = 0, refused = 0;

	srand(seed);
	for (int trial = 0; trial < 4000; trial++) {
		struct run_spec s;
		union rp_ring_slot recs[RP_RING_RUN_CONTINUATIONS_MAX + 1];
		struct rp_program_run run;
		struct rp_error err = { 0 };
		int flips = 1 + rand() % 8;

		full_run(&s);
		encode(&s.call, 40, recs);
		for (int f = 0; f < flips; f++) {
			int k = 1 + rand() % 2, at = rand() % RP_RING_RECORD_SIZE;
			/* Mostly small changes where they matter (positions,
			 * indexes), sometimes any byte anywhere. */
			if (rand() % 2 && at >= RP_RING_CONTINUATION_HEADER_SIZE)
				at -= (at - RP_RING_CONTINUATION_HEADER_SIZE) % 16;
			recs[k].bytes[at] = (uint8_t)(rand() % 4 == 0 ? (unsigned)rand() : recs[k].bytes[at] ^ (1u << (rand() % 8)));
		}
		int r = rp_ring_decode_run(recs, 40, ids, NIDS, &prog, &run, &err);
		if (r == 0) {
			assert_varlink_agrees(&run);
			rp_program_run_finish(&run);
			accepted++;
		} else {
			const cJSON *p = cJSON_GetObjectItemCaseSensitive(err.params, "parameter");
			const cJSON *o = cJSON_GetObjectItemCaseSensitive(err.params, "operand");

			ck_assert_msg(r == -EINVAL && err.name && (cJSON_IsString(p) || cJSON_IsString(o)),
				      "seed %u trial %d: refused without a name (%d)", seed, trial, r);
			ck_assert_ptr_null(run.bind);
			rp_error_clear(&err);
			refused++;
		}
	}
	/* Both happen: a flip in an offset's high bits that stays aligned, or
	 * in padding, is still a good Run; most are not. */
	ck_assert_msg(accepted > 0 && refused > 0, "seed %u: %u accepted, %u refused", seed, accepted, refused);
}
END_TEST

START_TEST(a_continuations_completion_names_its_run)
{
	struct rp_ring_completion cqe;
	char name[64];
	cJSON *params = NULL;

	memset(&cqe, 0xa5, sizeof(cqe));
	rp_ring_complete_continuation(&cqe, 12, 0xfffffffeu);
	ck_assert_uint_eq(cqe.tag, 12);
	ck_assert_uint_eq(cqe.status, RP_RING_STATUS_CONTINUATION);
	ck_assert_uint_eq(cqe.head, 0xfffffffeu);
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), 2);
	ck_assert_ptr_null(params);
	ck_assert_str_eq(name, "");
	/* A completion written after it in the same slot says head 0 again. */
	rp_ring_complete(&cqe, 13, NULL, 5);
	ck_assert_uint_eq(cqe.head, 0);
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), 0);
	cqe.status = 3;
	ck_assert_int_eq(rp_ring_completion_error(&cqe, name, &params), -EPROTO);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ring_run");
	TCase *tc = tcase_create("runs");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, a_run_spans_the_records_its_entries_need);
	tcase_add_test(tc, a_run_decodes_as_varlink_parses_it);
	tcase_add_test(tc, a_marks_journal_decodes_as_varlink_parses_it);
	tcase_add_test(tc, every_size_round_trips);
	tcase_add_test(tc, what_only_records_say_is_refused_by_name);
	tcase_add_test(tc, what_a_call_says_wrong_is_refused_as_varlink_refuses_it);
	tcase_add_test(tc, a_span_past_the_limits_is_refused);
	tcase_add_test(tc, a_lone_continuation_is_no_call);
	tcase_add_test(tc, a_mutated_continuation_is_refused_or_agreed);
	tcase_add_test(tc, a_continuations_completion_names_its_run);
	suite_add_tcase(s, tc);
	return unit_run(s);
}
