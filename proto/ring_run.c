/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program.Run as ring records (ring.h): a Run's own record and its
 * continuations become the struct rp_program_run that rp_program_run_parse
 * makes of a Varlink call's parameters, through the same steps
 * (program_run.c), so that the ring can carry no Run that Varlink refuses
 * and refuses none that Varlink carries. What is the records' own (their
 * indexes, counts, reserved fields, the continuations' order) is checked
 * here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "ring.h"

int rp_ring_run_check_span(const struct rp_ring_run *run, uint32_t ring_entries, struct rp_error *err)
{
	if (run->continuations > RP_RING_RUN_CONTINUATIONS_MAX || run->continuations + 1u > ring_entries)
		return rp_error_invalid_parameter(err, "continuations");
	return 0;
}

int rp_ring_run_program(const struct rp_ring_run *run, const struct rp_id *ids, uint32_t nids, struct rp_id *program,
			struct rp_error *err)
{
	memset(program, 0, sizeof(*program));
	if (run->program >= nids || ids[run->program].kind != RP_ID_PROGRAM)
		return rp_error_invalid_parameter(err, "program");
	*program = ids[run->program];
	return 0;
}

/* The id at index, or a zero id (kind 0, which no check takes for a buffer
 * or an event) where the index is past the table. */
static struct rp_id id_at(const struct rp_id *ids, uint32_t nids, uint32_t index)
{
	struct rp_id none = { 0 };

	return index < nids ? ids[index] : none;
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

/* Entry n of the Run's list, wherever it lies. */
static const union rp_ring_run_entry *entry_at(const union rp_ring_slot *recs, unsigned n)
{
	if (n < RP_RING_RUN_ENTRIES)
		return &recs[0].run.entries[n];
	n -= RP_RING_RUN_ENTRIES;
	return &recs[1 + n / RP_RING_CONTINUATION_ENTRIES].continuation.entries[n % RP_RING_CONTINUATION_ENTRIES];
}

static int position_past(struct rp_error *err, const char *list, uint32_t bound)
{
	char name[48];

	snprintf(name, sizeof(name), "%s[%u]", list, bound);
	return rp_error_invalid_parameter(err, name);
}

/* What the records say of their own shape: reserved fields, flags, the
 * counts, each continuation in its place. */
static int check_records(const union rp_ring_slot *recs, uint32_t head, struct rp_error *err)
{
	const struct rp_ring_run *run = &recs[0].run;
	const unsigned entries = (unsigned)run->nbind + run->nscalars;

	if (run->reserved0 || run->reserved1)
		return rp_error_invalid_parameter(err, "reserved");
	if (run->flags & ~(RP_RING_RUN_RETRY | RP_RING_RUN_JOURNAL_MARKS))
		return rp_error_invalid_parameter(err, "flags");
	if (run->nbind > RP_PROG_BOUND_MAX)
		return rp_error_invalid_parameter(err, "nbind");
	if (entries > RP_PROG_BOUND_MAX)
		return rp_error_invalid_parameter(err, "nscalars");
	if (run->continuations + 1u != RP_RING_RUN_RECORDS(entries))
		return rp_error_invalid_parameter(err, "continuations");
	for (unsigned k = 1; k <= run->continuations; k++) {
		const struct rp_ring_continuation *c = &recs[k].continuation;

		if (c->op != RP_RING_CONTINUATION || c->part != k || c->head != head) {
			char name[32];

			snprintf(name, sizeof(name), "continuations[%u]", k);
			return rp_error_invalid_parameter(err, name);
		}
	}
	/* The last record's entries past the list are reserved. */
	for (unsigned n = entries; n < RP_RING_RUN_ENTRIES + run->continuations * RP_RING_CONTINUATION_ENTRIES; n++) {
		static const union rp_ring_run_entry zero;

		if (memcmp(entry_at(recs, n), &zero, sizeof(zero)) != 0)
			return rp_error_invalid_parameter(err, "reserved");
	}
	return 0;
}

static int decode(const union rp_ring_slot *recs, uint32_t head, const struct rp_id *ids, uint32_t nids,
		  const struct rp_program *p, struct rp_program_run *run, bool *seen, struct rp_error *err)
{
	const struct rp_ring_run *rec = &recs[0].run;
	const bool has_journal = rec->journal != RP_RING_NONE;
	struct rp_id journal = id_at(ids, nids, rec->journal);
	int r;

	if ((r = check_records(recs, head, err)) < 0 || (r = rp_ring_run_program(rec, ids, nids, &run->program, err)) < 0 ||
	    (r = decode_event(rec->wait_event, "wait_event", ids, nids, &run->wait_event, err)) < 0 ||
	    (r = decode_event(rec->signal_event, "signal_event", ids, nids, &run->signal_event, err)) < 0)
		return r;
	/* 0 is the worker's default, as an absent deadline_ms in a call. */
	if (rec->deadline_ms > RP_DEADLINE_MS_MAX)
		return rp_error_invalid_parameter(err, "deadline_ms");
	run->deadline_ms = rec->deadline_ms;
	/* Without a journal, a seq of 0 is an absent one; and what the journal's
	 * offset would be must be 0, as a call names none. */
	if (!has_journal && rec->journal_offset != 0)
		return rp_error_invalid_parameter(err, "journal.offset");
	if ((r = rp_program_run_journal(run, has_journal, &journal, rec->journal_offset,
					rec->flags & RP_RING_RUN_JOURNAL_MARKS ? RP_JOURNAL_MARKS : RP_JOURNAL_COPY,
					has_journal || rec->seq != 0, rec->seq, rec->flags & RP_RING_RUN_RETRY, err)) < 0)
		return r;
	for (unsigned n = 0; n < rec->nbind; n++) {
		const struct rp_ring_binding *b = &entry_at(recs, n)->binding;
		struct rp_id buffer;

		if (b->bound >= (uint32_t)p->nbound)
			return position_past(err, "bind", b->bound);
		buffer = id_at(ids, nids, b->buffer);
		if ((r = rp_program_run_bind(p, (int)b->bound, &buffer, b->offset, run, seen, err)) < 0)
			return r;
	}
	for (unsigned n = rec->nbind; n < (unsigned)rec->nbind + rec->nscalars; n++) {
		const struct rp_ring_scalar *s = &entry_at(recs, n)->scalar;

		if (s->bound >= (uint32_t)p->nbound)
			return position_past(err, "scalars", s->bound);
		if (s->reserved)
			return rp_error_invalid_parameter(err, "reserved");
		if ((r = rp_program_run_scalar(p, (int)s->bound, s->value, run, seen, err)) < 0)
			return r;
	}
	return rp_program_run_complete(p, seen, err);
}

int rp_ring_decode_run(const union rp_ring_slot *recs, uint32_t head, const struct rp_id *ids, uint32_t nids,
		       const struct rp_program *p, struct rp_program_run *run, struct rp_error *err)
{
	bool *seen;
	int r = rp_program_run_alloc(p, run, &seen);

	if (r < 0)
		return r;
	r = decode(recs, head, ids, nids, p, run, seen, err);
	free(seen);
	if (r < 0)
		rp_program_run_finish(run);
	return r;
}

/* Entry n of the Run's list as the client gives it. */
static union rp_ring_run_entry call_entry(const struct rp_ring_run_call *call, unsigned n)
{
	union rp_ring_run_entry e;

	memset(&e, 0, sizeof(e));
	if (n < call->nbind)
		e.binding = call->bind[n];
	else
		e.scalar = call->scalars[n - call->nbind];
	return e;
}

void rp_ring_encode_run(const struct rp_ring_run_call *call, uint64_t tag, uint32_t head, unsigned part,
			union rp_ring_slot *rec)
{
	const unsigned entries = call->nbind + call->nscalars;
	unsigned from, count;
	union rp_ring_run_entry *out;

	memset(rec, 0, sizeof(*rec));
	if (part == 0) {
		struct rp_ring_run *run = &rec->run;

		run->tag = tag;
		run->op = RP_OP_PROGRAM;
		run->flags = (uint16_t)((call->retry ? RP_RING_RUN_RETRY : 0) |
					(call->journal_marks ? RP_RING_RUN_JOURNAL_MARKS : 0));
		run->continuations = (uint16_t)(RP_RING_RUN_RECORDS(entries) - 1);
		run->wait_event = call->wait_event;
		run->signal_event = call->signal_event;
		run->deadline_ms = call->deadline_ms;
		run->program = call->program;
		run->journal = call->journal;
		run->nbind = (uint16_t)call->nbind;
		run->nscalars = (uint16_t)call->nscalars;
		run->journal_offset = call->journal_offset;
		run->seq = call->seq;
		from = 0;
		count = RP_RING_RUN_ENTRIES;
		out = run->entries;
	} else {
		struct rp_ring_continuation *c = &rec->continuation;

		c->tag = tag + part;
		c->op = RP_RING_CONTINUATION;
		c->part = (uint16_t)part;
		c->head = head;
		from = RP_RING_RUN_ENTRIES + (part - 1) * RP_RING_CONTINUATION_ENTRIES;
		count = RP_RING_CONTINUATION_ENTRIES;
		out = c->entries;
	}
	for (unsigned i = 0; i < count && from + i < entries; i++)
		out[i] = call_entry(call, from + i);
}
