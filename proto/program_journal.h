/* SPDX-License-Identifier: Apache-2.0 */
/* A Run that a fault interrupts, retried, applies a program's in-place
 * updates exactly once, or says that it cannot.
 *
 * A program that writes inout tensors (an optimizer step) cannot simply be
 * run again after a fault: some of its updates may have landed and others
 * not. So a Run may name a journal, memory of the rank's (a buffer bound as
 * "journal": it survives the worker's context, its reset and its respawn),
 * and a sequence number `seq` of the client's choosing. The journal is of
 * one of two modes, the Run's choice:
 *
 * copy (the default; at least rp_program_journal_bytes long). In stream
 * order, such a Run:
 *
 *   1. copies every inout root's bytes into the journal,
 *   2. writes the header {magic, seq, SAVED},
 *   3. runs the program's nodes,
 *   4. writes the header {magic, seq, DONE}.
 *
 * marks (at least RP_PROG_JOURNAL_MARKS_BYTES long: the header alone). No
 * copy: the inouts are not there twice, and no step pays a copy of them.
 *
 *   1. writes the header {magic, seq, BEGUN},
 *   2. runs the program's nodes,
 *   3. writes the header {magic, seq, DONE}.
 *
 * Its retry (the same seq, with "retry": true, once the device serves
 * again) reads the header first: DONE with this seq: everything was
 * applied, nothing runs again; SAVED with this seq: the inouts are put back
 * from the journal, then the Run goes as a first one; BEGUN with this seq:
 * the fault came after the Run began writing, and nothing can put the
 * inouts back: the retry runs nothing and fails with io.regen.RunTorn;
 * anything else: the fault came before step 1 (marks) or 2 (copy) finished,
 * so no inout was written, and the Run goes as a first one. The program's
 * kernels are deterministic, so the retried Run writes the same bits the
 * first would have.
 *
 * Only a fault of regend's own (a lost context, a worker's respawn) cuts a
 * Run in the middle: a Run whose rank dies runs whole, or not at all where
 * it waits on the rank's unfinished work (daemon/worker/orphan.c). So a
 * rank killed around a marks Run finds its header DONE or, for a Run that
 * never started, the previous Run's.
 *
 * The layout, stated once for both backends and the clients: the header,
 * then (copy) each inout root's bytes in binding order, each at a multiple
 * of RP_PROG_JOURNAL_ALIGN. */
#pragma once

#include <stdint.h>
#include "program.h"

#define RP_PROG_JOURNAL_MAGIC UINT64_C(0x6c6e72756f6a6772)   /* "rgjournl" */
#define RP_PROG_JOURNAL_ALIGN 256

enum rp_prog_journal_state {
	RP_JOURNAL_EMPTY = 0,
	RP_JOURNAL_SAVED = 1,    /* copy: the inouts are in the journal, the nodes may have run */
	RP_JOURNAL_DONE = 2,     /* every node ran */
	RP_JOURNAL_BEGUN = 3,    /* marks: the nodes may have run */
};

struct rp_prog_journal_header {
	uint64_t magic;
	uint64_t seq;
	uint64_t state;          /* enum rp_prog_journal_state */
	uint64_t reserved;
};

#define RP_PROG_JOURNAL_MARKS_BYTES ((uint64_t)sizeof(struct rp_prog_journal_header))

/* What a retried Run (seq, in mode) does, by its journal's header as the
 * backend read it; both backends alike. */
enum rp_prog_journal_retry {
	RP_RETRY_RUN,            /* the header is of another Run (or none): run it as a first one */
	RP_RETRY_APPLIED,        /* DONE: applied whole already, run nothing */
	RP_RETRY_RESTORE,        /* SAVED: put the inouts back from the journal, then run */
	RP_RETRY_TORN,           /* BEGUN, marks only: nothing to put back; err is RunTorn */
	RP_RETRY_MODE_CHANGED,   /* SAVED, retried in mode marks: err is InvalidParameter "journal.mode" */
};

enum rp_prog_journal_retry rp_program_journal_retry(const struct rp_prog_journal_header *h, uint64_t seq,
						     enum rp_prog_journal_mode mode, const struct rp_program *p,
						     const struct rp_id *program, struct rp_error *err);

static inline uint64_t rp_prog_journal_align(uint64_t v)
{
	return (v + RP_PROG_JOURNAL_ALIGN - 1) & ~(uint64_t)(RP_PROG_JOURNAL_ALIGN - 1);
}

/* Where bound tensor b's saved bytes start in a copy journal, and how many
 * bytes it needs in all (0 for a program that updates nothing in place:
 * it takes no journal). Bound indices of tensors that are not inouts have
 * no place (their offset is that of the next inout). */
static inline uint64_t rp_program_journal_offset(const struct rp_program *p, int b)
{
	uint64_t off = RP_PROG_JOURNAL_ALIGN;

	for (int i = 0; i < b && i < p->nbound; i++)
		if (p->tensors[p->bind[i]].kind == RP_PT_INOUT)
			off += rp_prog_journal_align(p->tensors[p->bind[i]].extent_bytes);
	return off;
}

static inline uint64_t rp_program_journal_bytes(const struct rp_program *p)
{
	return p->updates_in_place ? rp_program_journal_offset(p, p->nbound) : 0;
}

/* The bytes a journal of this mode needs (0: the program takes none). */
static inline uint64_t rp_program_journal_need(const struct rp_program *p, enum rp_prog_journal_mode mode)
{
	if (!p->updates_in_place)
		return 0;
	return mode == RP_JOURNAL_MARKS ? RP_PROG_JOURNAL_MARKS_BYTES : rp_program_journal_bytes(p);
}
