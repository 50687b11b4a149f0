/* SPDX-License-Identifier: Apache-2.0 */
/* The data-plane fast path of a lane (io.regen.Lane): a submission ring and
 * a completion ring in one memfd the client shares with its worker, binary
 * records that name buffers, events and programs by their index in the
 * lane's id table (filled over Varlink with io.regen.Lane.Bind), and
 * doorbells on a datagram socket pair. One format for daemon and clients.
 *
 * The memfd holds, at offset 0, struct rp_ring_header (RP_RING_HEADER_SIZE
 * bytes), then `entries` submission records of RP_RING_RECORD_SIZE bytes,
 * then `entries` completions of RP_RING_COMPLETION_SIZE bytes. Counters
 * run freely (uint32, wrapping); record n lives in slot n % entries.
 *
 * The client writes a record into slot sq_tail % entries, then publishes
 * sq_tail + 1 (a release store); the worker copies the record out before
 * it looks at it, and never trusts what the client can still change. The
 * worker writes completion n (for record n: completions come in record
 * order) into slot n % entries and publishes cq_tail; the client reads it
 * and moves cq_head. A client keeps at most `entries` records between
 * submission and the reading of their completion.
 *
 * Doorbells: whoever goes to sleep says so first (sq_sleeping: the worker,
 * cq_waiting: the client), then looks at the ring once more; whoever
 * publishes, after a full barrier, sends one byte on its end of the socket
 * pair when the other side sleeps. Both sides spin a while before they do. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "compute.h"
#include "ids.h"
#include "message.h"
#include "program.h"

#define RP_RING_MAGIC 0x52474e52u       /* "RNGR" little-endian */
/* 2: eleven operand slots (attention's seq_len_q and seq_len_kv), where
 * version 1 had nine and left the bytes after them to padding; and the
 * worker's stage times at the end of each completion.
 * 3: io.regen.Program.Run as records (struct rp_ring_run and its
 * continuations), a continuation's completion (status 2, its `head`), and
 * so the error text 8 bytes shorter. */
#define RP_RING_VERSION 3
#define RP_RING_ENTRIES_MIN 2
#define RP_RING_ENTRIES_MAX 1024        /* a power of two in between */
#define RP_RING_IDS_DEFAULT 256
#define RP_RING_IDS_MAX 4096            /* entries of a lane's id table */
#define RP_RING_NONE 0xffffffffu        /* an index that names nothing */
#define RP_RING_HEADER_SIZE 4096
#define RP_RING_RECORD_SIZE 1024
#define RP_RING_COMPLETION_SIZE 1024
#define RP_RING_ERROR_MAX 896           /* the error's Varlink text, NUL included */

/* Each counter on a cache line of its own: the side that writes it is the
 * only one that moves the line. The counters and flags are atomic: the
 * other process reads them while they are written, and a counter read in
 * pieces (255 becoming 256 a byte at a time reads as 0 or 511) would look
 * like a ring gone wrong. Every client must load and store each as one
 * aligned 4-byte access (the Python client: a memoryview cast to 'I'). */
struct rp_ring_header {
	uint32_t magic, version, entries, reserved0;
	uint8_t pad0[48];
	_Atomic uint32_t sq_tail;        /* client: records written */
	uint8_t pad1[60];
	_Atomic uint32_t sq_head;        /* worker: records taken */
	_Atomic uint32_t sq_sleeping;            /* worker: 1 = ring the doorbell after publishing */
	uint8_t pad2[56];
	_Atomic uint32_t cq_tail;        /* worker: completions written */
	uint8_t pad3[60];
	_Atomic uint32_t cq_head;        /* client: completions read */
	_Atomic uint32_t cq_waiting;     /* client: 1 = ring the doorbell after publishing */
	uint8_t pad4[56];
};

/* Flags of a record. */
#define RP_RING_TRANS_A 0x1u             /* Gemm */
#define RP_RING_TRANS_B 0x2u             /* Gemm */
#define RP_RING_CAUSAL 0x4u              /* Attention, AttentionBackward */

/* A tensor operand, or an absent one (index RP_RING_NONE). Strides are
 * always given (no contiguous default). */
struct rp_ring_operand {
	uint32_t index;                  /* into the lane's id table */
	uint8_t dtype;                   /* enum rp_dtype */
	uint8_t rank;
	uint16_t reserved;
	uint64_t offset;
	int64_t shape[4];
	int64_t strides[4];
};

/* One call: what a parsed struct rp_compute carries, with buffers and
 * events by index. Scalars that the op does not take must be 0; which it
 * takes, and in which field, its op table says (rp_op_spec.ring_scalars). */
struct rp_ring_record {
	uint64_t tag;                    /* the client's, echoed in the completion */
	uint16_t op;                     /* enum rp_op_id (proto/compute.h) */
	uint16_t flags;                  /* RP_RING_* */
	uint8_t epilogue;                /* Gemm: enum rp_epilogue; ScaleUpdate: enum rp_fp8_format */
	uint8_t compute;                 /* Gemm: enum rp_compute_mode; ScaleUpdate: enum rp_amax_compute */
	uint8_t alignment;               /* attention: enum rp_causal_alignment */
	uint8_t reserved0;
	uint32_t wait_event, signal_event;   /* indexes, or RP_RING_NONE */
	uint32_t deadline_ms;            /* 0: the worker's default; at most RP_DEADLINE_MS_MAX */
	uint32_t reserved1;
	double alpha, beta;              /* Gemm (no defaults: 1 and 0 are written) */
	double scale;                    /* attention: 0 = 1/sqrt(D); LayerNorm: eps, 0 = 1e-5; ScaleUpdate: margin */
	uint64_t reserved2;
	struct rp_ring_operand operands[RP_OP_OPERANDS_MAX];   /* by the op's slots */
	uint8_t pad[RP_RING_RECORD_SIZE - 64 - RP_OP_OPERANDS_MAX * sizeof(struct rp_ring_operand)];
};

/* io.regen.Program.Run as records: the Run's own record (op RP_OP_PROGRAM)
 * and, where its bindings and scalars do not fit in it, `continuations`
 * records right after it in the ring (op RP_RING_CONTINUATION), which carry
 * the rest. Bindings come first, then scalars, as one list of entries: the
 * Run's record holds entries 0 .. RP_RING_RUN_ENTRIES - 1, continuation k
 * (1-based) the next RP_RING_CONTINUATION_ENTRIES. A Run names exactly the
 * continuations its entries need (rp_ring_run_records), and the client
 * publishes them with the Run's record (one store of sq_tail for all): the
 * worker takes a Run only once all its records are published and their
 * completion slots free, copies them all out of shared memory, and only
 * then looks at them. Every record still gets a completion in record order:
 * the Run's says what the Run answered, each continuation's has status
 * RP_RING_STATUS_CONTINUATION and names the Run's record (`head`). A record
 * taken alone that is a continuation is refused (InvalidParameter "op").
 *
 * A bound tensor is named by its position in Define's `bound` (binding
 * order), a program, buffers and events by id table index. */
#define RP_RING_CONTINUATION 0xffffu      /* the op of a Run's continuation record */
/* Flags of a Run: retry, and a journal of marks only
 * (proto/program_journal.h); both with a journal. */
#define RP_RING_RUN_RETRY 0x1u
#define RP_RING_RUN_JOURNAL_MARKS 0x2u

/* An input, output or inout bound to a buffer. */
struct rp_ring_binding {
	uint32_t bound;                  /* position in Define's bound list */
	uint32_t buffer;                 /* id table index of a buffer */
	uint64_t offset;                 /* bytes */
};

/* A scalar's value. */
struct rp_ring_scalar {
	uint32_t bound;
	uint32_t reserved;
	double value;                    /* finite */
};

union rp_ring_run_entry {
	struct rp_ring_binding binding;
	struct rp_ring_scalar scalar;
};

#define RP_RING_RUN_HEADER_SIZE 64
#define RP_RING_CONTINUATION_HEADER_SIZE 16
#define RP_RING_RUN_ENTRIES ((RP_RING_RECORD_SIZE - RP_RING_RUN_HEADER_SIZE) / sizeof(union rp_ring_run_entry))
#define RP_RING_CONTINUATION_ENTRIES \
	((RP_RING_RECORD_SIZE - RP_RING_CONTINUATION_HEADER_SIZE) / sizeof(union rp_ring_run_entry))

/* The Run's own record. Where a field is as a call's record, it lies where
 * a call's record has it (tag, op, flags, the events, deadline_ms). */
struct rp_ring_run {
	uint64_t tag;                    /* the client's, echoed in the completion */
	uint16_t op;                     /* RP_OP_PROGRAM */
	uint16_t flags;                  /* RP_RING_RUN_RETRY, RP_RING_RUN_JOURNAL_MARKS */
	uint16_t continuations;          /* records after this one that carry its entries */
	uint16_t reserved0;
	uint32_t wait_event, signal_event;   /* indexes, or RP_RING_NONE */
	uint32_t deadline_ms;            /* 0: the worker's default; at most RP_DEADLINE_MS_MAX */
	uint32_t program;                /* index of the program's id */
	uint32_t journal;                /* index of the journal's buffer, or RP_RING_NONE: none */
	uint16_t nbind, nscalars;        /* entries: nbind bindings, then nscalars scalars */
	uint64_t journal_offset;         /* bytes, 8-byte aligned; 0 without a journal */
	uint64_t seq;                    /* with a journal; 0 without */
	uint64_t reserved1;
	union rp_ring_run_entry entries[RP_RING_RUN_ENTRIES];
};

/* A record that carries more of a Run's entries. */
struct rp_ring_continuation {
	uint64_t tag;                    /* its own (it has its own completion) */
	uint16_t op;                     /* RP_RING_CONTINUATION */
	uint16_t part;                   /* 1 for the record right after the Run's, then 2, ... */
	uint32_t head;                   /* the number of the Run's record (its sq_tail before it) */
	union rp_ring_run_entry entries[RP_RING_CONTINUATION_ENTRIES];
};

/* Records a Run of `entries` bindings and scalars takes. */
#define RP_RING_RUN_RECORDS(entries)                                                              \
	((entries) <= RP_RING_RUN_ENTRIES ? 1u                                                    \
					  : 1u + (unsigned)(((entries) - RP_RING_RUN_ENTRIES +     \
							     RP_RING_CONTINUATION_ENTRIES - 1) /   \
							    RP_RING_CONTINUATION_ENTRIES))
/* A Run names each bound tensor once: no more entries than a program binds. */
#define RP_RING_RUN_CONTINUATIONS_MAX (RP_RING_RUN_RECORDS(RP_PROG_BOUND_MAX) - 1)

/* A slot of the submission ring, whichever record it holds (op says which;
 * it lies at the same offset in all). */
union rp_ring_slot {
	struct rp_ring_record call;
	struct rp_ring_run run;
	struct rp_ring_continuation continuation;
	uint8_t bytes[RP_RING_RECORD_SIZE];
};

/* Where a record's time went, on the worker's side: when it was taken out
 * of the ring, its work handed to the device, found finished, and its
 * completion published (CLOCK_MONOTONIC nanoseconds, the clock every
 * process of the machine shares; 0 for a stage the record never reached,
 * as for one refused before it ran, and finished_ns 0 for one answered
 * before its work ended: at launch, or past its deadline). For benchmarks
 * and tracing: with the client's own submit and read times it splits a
 * call's added latency into doorbells, launch, device and completion. */
struct rp_ring_timing {
	uint64_t taken_ns, launched_ns, finished_ns, published_ns;
};

/* A completion's status. */
#define RP_RING_STATUS_OK 0
#define RP_RING_STATUS_ERROR 1
#define RP_RING_STATUS_CONTINUATION 2    /* a Run's continuation: the Run's record answers */

/* The outcome of record n, in completion slot n. */
struct rp_ring_completion {
	uint64_t tag;
	uint32_t status;                 /* RP_RING_STATUS_* */
	uint32_t error_len;              /* bytes of `error` before its NUL */
	uint64_t elapsed_us;             /* as a Varlink reply's */
	char error_name[64];             /* "io.regen.StaleGeneration", NUL-terminated */
	/* The error as a Varlink reply carries it, {"error":...,"parameters":
	 * {...}}, NUL-terminated; long strings in it are cut to fit. */
	char error[RP_RING_ERROR_MAX];
	uint32_t head;                   /* a continuation's: the number of its Run's record */
	uint32_t reserved;
	struct rp_ring_timing timing;
};

_Static_assert(sizeof(struct rp_ring_header) == 320, "header layout");
_Static_assert(sizeof(_Atomic uint32_t) == 4 && ATOMIC_INT_LOCK_FREE == 2,
	       "the counters are shared with another process: plain 4-byte words, lock-free");
_Static_assert(sizeof(struct rp_ring_operand) == 80, "operand layout");
_Static_assert(sizeof(struct rp_ring_record) == RP_RING_RECORD_SIZE, "record layout");
_Static_assert(sizeof(struct rp_ring_completion) == RP_RING_COMPLETION_SIZE, "completion layout");
_Static_assert(offsetof(struct rp_ring_completion, error) == 88 && offsetof(struct rp_ring_completion, head) == 984 &&
		       offsetof(struct rp_ring_completion, timing) == 992,
	       "completion fields");
_Static_assert(sizeof(union rp_ring_run_entry) == 16 && sizeof(struct rp_ring_binding) == 16 &&
		       sizeof(struct rp_ring_scalar) == 16 && offsetof(struct rp_ring_binding, offset) == 8 &&
		       offsetof(struct rp_ring_scalar, value) == 8,
	       "Run entry layout");
_Static_assert(offsetof(struct rp_ring_run, entries) == RP_RING_RUN_HEADER_SIZE && RP_RING_RUN_ENTRIES == 60 &&
		       sizeof(struct rp_ring_run) == RP_RING_RECORD_SIZE,
	       "Run record layout");
_Static_assert(offsetof(struct rp_ring_run, wait_event) == offsetof(struct rp_ring_record, wait_event) &&
		       offsetof(struct rp_ring_run, signal_event) == offsetof(struct rp_ring_record, signal_event) &&
		       offsetof(struct rp_ring_run, deadline_ms) == offsetof(struct rp_ring_record, deadline_ms) &&
		       offsetof(struct rp_ring_run, flags) == offsetof(struct rp_ring_record, flags) &&
		       offsetof(struct rp_ring_run, continuations) == 12 && offsetof(struct rp_ring_run, program) == 28 &&
		       offsetof(struct rp_ring_run, journal) == 32 && offsetof(struct rp_ring_run, nbind) == 36 &&
		       offsetof(struct rp_ring_run, nscalars) == 38 &&
		       offsetof(struct rp_ring_run, journal_offset) == 40 && offsetof(struct rp_ring_run, seq) == 48,
	       "Run record fields");
_Static_assert(offsetof(struct rp_ring_continuation, entries) == RP_RING_CONTINUATION_HEADER_SIZE &&
		       offsetof(struct rp_ring_continuation, part) == 10 &&
		       offsetof(struct rp_ring_continuation, head) == 12 && RP_RING_CONTINUATION_ENTRIES == 63 &&
		       sizeof(struct rp_ring_continuation) == RP_RING_RECORD_SIZE,
	       "continuation record layout");
_Static_assert(offsetof(struct rp_ring_run, op) == offsetof(struct rp_ring_record, op) &&
		       offsetof(struct rp_ring_continuation, op) == offsetof(struct rp_ring_record, op) &&
		       sizeof(union rp_ring_slot) == RP_RING_RECORD_SIZE,
	       "every record says its op in the same place");
_Static_assert(RP_RING_RUN_CONTINUATIONS_MAX == 16 && RP_RING_RUN_RECORDS(60) == 1 && RP_RING_RUN_RECORDS(61) == 2 &&
		       RP_RING_RUN_RECORDS(123) == 2 && RP_RING_RUN_RECORDS(124) == 3,
	       "records a Run takes");

/* Bytes of the memfd for `entries` (0 when entries is not a power of two
 * in range). */
size_t rp_ring_size(uint32_t entries);
bool rp_ring_entries_valid(uint32_t entries);

static inline struct rp_ring_header *rp_ring_header(void *base)
{
	return (struct rp_ring_header *)base;
}
static inline struct rp_ring_record *rp_ring_record_at(void *base, uint32_t entries, uint32_t n)
{
	return (struct rp_ring_record *)((char *)base + RP_RING_HEADER_SIZE + (size_t)(n & (entries - 1)) * RP_RING_RECORD_SIZE);
}
static inline struct rp_ring_completion *rp_ring_completion_at(void *base, uint32_t entries, uint32_t n)
{
	return (struct rp_ring_completion *)((char *)base + RP_RING_HEADER_SIZE + (size_t)entries * RP_RING_RECORD_SIZE +
					     (size_t)(n & (entries - 1)) * RP_RING_COMPLETION_SIZE);
}

/* Shared counters: a load acquires (what the other side wrote before it
 * published is seen after), a store releases (what this side wrote before
 * is seen by whoever loads it). */
static inline uint32_t rp_ring_load(const _Atomic uint32_t *p)
{
	return atomic_load_explicit(p, memory_order_acquire);
}
static inline void rp_ring_store(_Atomic uint32_t *p, uint32_t v)
{
	atomic_store_explicit(p, v, memory_order_release);
}
/* The sleeping and waiting flags take part in the doorbell handshake,
 * which needs a total order: sequentially consistent. */
static inline uint32_t rp_ring_flag(const _Atomic uint32_t *p)
{
	return atomic_load_explicit(p, memory_order_seq_cst);
}
static inline void rp_ring_flag_set(_Atomic uint32_t *p, uint32_t v)
{
	atomic_store_explicit(p, v, memory_order_seq_cst);
}
static inline uint32_t rp_ring_flag_take(_Atomic uint32_t *p)
{
	return atomic_exchange_explicit(p, 0, memory_order_seq_cst);
}
/* Orders a publication before the look at the other side's sleeping flag
 * (and a sleeping flag before the last look at the ring). */
static inline void rp_ring_fence(void)
{
	atomic_thread_fence(memory_order_seq_cst);
}

/* Fills c from a record the caller copied out of shared memory, its
 * indexes resolved through ids (nids entries; an entry of kind 0 is not
 * bound), then runs rp_compute_check: a record is held to every check a
 * Varlink call is. Errors as for a call: InvalidParameter naming the field
 * ("op", "flags", "a.shape", "wait_event"...), InvalidOperand for an
 * operand whose index is not bound or does not name a buffer. 0 or -EINVAL
 * with err set (and *c zeroed). */
int rp_ring_decode(const struct rp_ring_record *rec, const struct rp_id *ids, uint32_t nids, struct rp_compute *c,
		   struct rp_error *err);
/* rp_ring_decode without rp_compute_check: what a record's fields say,
 * for a client that takes calls in the record's terms (libregen's
 * regen_record_submit) and leaves the checks to the worker, as for any
 * call it sends. */
int rp_ring_decode_fields(const struct rp_ring_record *rec, const struct rp_id *ids, uint32_t nids,
			  struct rp_compute *c, struct rp_error *err);

/* A record of a descriptor (clients): index_of[slot] is the id table index
 * of each present operand's buffer, wait/signal those of the events (or
 * RP_RING_NONE). Strides are taken as they are in c. */
void rp_ring_encode(const struct rp_compute *c, const uint32_t index_of[RP_OP_OPERANDS_MAX], uint32_t wait,
		    uint32_t signal, uint64_t tag, struct rp_ring_record *rec);

/* Writes a completion: success (err NULL or unnamed) or the error, its
 * Varlink text cut to fit RP_RING_ERROR_MAX. */
void rp_ring_complete(struct rp_ring_completion *cqe, uint64_t tag, const struct rp_error *err, uint64_t elapsed_us);
/* Writes the completion of a Run's continuation: status
 * RP_RING_STATUS_CONTINUATION, head the number of the Run's record. */
void rp_ring_complete_continuation(struct rp_ring_completion *cqe, uint64_t tag, uint32_t head);

/* The error a completion carries (clients; cqe copied out of the ring
 * first), as a Varlink reply would give it: its name into name[64] and its
 * parameters (*params, the caller's to delete). 0 for a success, 1 for an
 * error, 2 for a continuation's (cqe->head names its Run's record, whose
 * completion answers), -EPROTO when the completion is malformed. */
int rp_ring_completion_error(const struct rp_ring_completion *cqe, char name[64], cJSON **params);

/* ---- io.regen.Program.Run in records (ring_run.c) ---- */

/* The worker, with a Run's record copied out, before it waits for the
 * records the Run says follow: 0 when they may be waited for (at most
 * RP_RING_RUN_CONTINUATIONS_MAX, and with the Run's own no more than a ring
 * of `ring_entries` holds, as they could never all be published), else
 * InvalidParameter "continuations". */
int rp_ring_run_check_span(const struct rp_ring_run *run, uint32_t ring_entries, struct rp_error *err);

/* The program id a Run's record names through ids (nids entries; kind 0:
 * not bound). 0, or InvalidParameter "program" for an index that holds no
 * program id. */
int rp_ring_run_program(const struct rp_ring_run *run, const struct rp_id *ids, uint32_t nids, struct rp_id *program,
			struct rp_error *err);

/* A Run's records, recs[0] the Run's own and recs[1 ..] its continuations
 * (1 + recs[0].run.continuations, all copied out of shared memory; head the
 * number of recs[0]), decoded against the program p they run into *run:
 * what rp_program_run_parse makes of the same Run's parameters, through the
 * same checks with the same errors (program_run.c states them once). What
 * only records can get wrong: InvalidParameter "reserved", "flags",
 * "continuations" (not the number its entries need), "nbind" or "nscalars"
 * (past RP_PROG_BOUND_MAX together), "continuations[k]" (continuation k's
 * op, part or head is not this Run's), "bind[i]" or "scalars[i]" (position
 * i binds nothing in p), "bind.<name>.buffer" and "journal.buffer" (an
 * index that holds no buffer id), "wait_event" and "signal_event" (one that
 * holds no event id); a journal is given by its index, a seq without one
 * is InvalidParameter "journal" as Varlink's, and the marks flag without
 * one "journal.mode". 0, or -EINVAL with err
 * set and *run zeroed; -ENOMEM with err unset. */
int rp_ring_decode_run(const union rp_ring_slot *recs, uint32_t head, const struct rp_id *ids, uint32_t nids,
		       const struct rp_program *p, struct rp_program_run *run, struct rp_error *err);

/* A Run as a client writes it: the program, events and journal by id table
 * index (RP_RING_NONE: no event, no journal), its bindings and scalars by
 * bound position. */
struct rp_ring_run_call {
	uint32_t program, wait_event, signal_event, journal;
	uint32_t deadline_ms;
	uint64_t journal_offset, seq;
	bool retry;
	bool journal_marks;              /* the journal holds marks only */
	const struct rp_ring_binding *bind;
	unsigned nbind;
	const struct rp_ring_scalar *scalars;
	unsigned nscalars;
};

/* Writes record `part` of the Run (0 its own, then its continuations;
 * RP_RING_RUN_RECORDS(nbind + nscalars) in all, nbind + nscalars at most
 * RP_PROG_BOUND_MAX): tag `tag + part`, `head` the number the Run's own
 * record gets in the ring. */
void rp_ring_encode_run(const struct rp_ring_run_call *call, uint64_t tag, uint32_t head, unsigned part,
			union rp_ring_slot *rec);
