/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Program: a DAG of operations over symbolic tensors, defined once
 * and run per step by one call.
 *
 * A client's definition (io.regen.Program.Define, JSON) is parsed, its
 * composite operations (rms_norm, rotary, cross_entropy, adamw, ...) are
 * lowered into primitive nodes, and the whole is checked before anything is
 * kept: known ops, each node's dtype and shape rules, tensors written once
 * and read after they are written (program order is the one order: a node
 * reads what earlier nodes wrote), no output sharing memory with another
 * operand unless the op says in place, views inside their base, size
 * limits. A checked program (struct rp_program) is what both backends run:
 * the host backend node by node (reference math), the CUDA backend fused
 * into kernels regend writes itself (daemon/program/) and captured as a
 * CUDA graph.
 *
 * Four primitive classes:
 * - compute: the operations of io.regen.Compute (proto/compute.h), whose
 *   table gives the operand names, dtypes and shape rules: gemm, attention,
 *   attention_backward, layer_norm, layer_norm_backward. Their scalars are
 *   the node's attrs, checked by the same read_scalars/check.
 * - pointwise: one output element from the same-index elements of its
 *   inputs, broadcast NumPy's way (right-aligned, a dim of 1 stretches), and
 *   at most one constant scalar; or made from the element's place alone
 *   (fill, iota, and dropout_mask, whose one input is a Run's seed).
 * - reduction: sum, mean, max, min or amax over the last dimension ("last")
 *   or over every dimension but the last ("leading").
 * - gather: embedding rows by index, and its deterministic backward.
 *
 * Everything a backend needs is here: tensors with dtype, shape, strides and
 * where their memory lives (a bound buffer, the program's scratch, or a view
 * into another tensor), nodes in program order, each naming its tensors by
 * index. Nothing here includes CUDA. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "compute.h"
#include "message.h"
#include "operand.h"

/* Limits, named once; Define refuses a program past them with
 * io.regen.LimitExceeded {resource} (the per-uid limits on how many
 * programs and nodes a user holds are the worker's, daemon/worker/). */
#define RP_PROG_TENSORS_MAX 4096     /* after lowering */
#define RP_PROG_NODES_MAX 4096       /* after lowering */
#define RP_PROG_BOUND_MAX 1024       /* inputs, outputs, inouts and scalars together */
#define RP_PROG_NAME_MAX 64          /* a tensor's or a program's name, bytes */
#define RP_PROG_RANK_MAX 6
#define RP_PROG_NODE_IN_MAX 11       /* >= RP_OP_OPERANDS_MAX */
#define RP_PROG_NODE_OUT_MAX 4
/* Elements of one tensor: keeps every index computation in int64 and every
 * kernel's flat index in range. */
#define RP_PROG_NUMEL_MAX (INT64_C(1) << 40)

enum rp_prog_tensor_kind {
	RP_PT_INPUT = 0,      /* bound at Run, read only */
	RP_PT_OUTPUT,         /* bound at Run, written (every element, by the nodes that write it) */
	RP_PT_INOUT,          /* bound at Run, read and updated in place (weights, optimizer state) */
	RP_PT_SCALAR,         /* a rank-0 f64 value given at Run ("scalars": {"lr": 1e-3}) */
	RP_PT_INTERMEDIATE,   /* the program's own scratch, contiguous, live from its writer to its last reader */
	RP_PT_VIEW,           /* other shape and strides over another tensor's memory */
	RP_PT_KINDS
};

struct rp_prog_tensor {
	char name[RP_PROG_NAME_MAX + 1];
	enum rp_prog_tensor_kind kind;
	enum rp_dtype dtype;          /* scalars: RP_DTYPE_F64 */
	int rank;                     /* 0 for a scalar or a full reduction's result */
	int64_t shape[RP_PROG_RANK_MAX];
	int64_t strides[RP_PROG_RANK_MAX];   /* elements; contiguous row-major unless given (inputs, outputs, views) */
	/* Views: the tensor whose memory this one reads (itself a view or
	 * not) and the element offset into it. -1 and 0 otherwise. */
	int base;
	int64_t offset;
	/* Derived by the checker. The tensor that owns the memory (a view's
	 * root; itself otherwise) and the element offset into it. */
	int root;
	int64_t root_offset;
	int64_t numel;
	/* Bytes from the root's start past this tensor's last element
	 * (root_offset included): what a Run binding must cover for a bound
	 * root, what the scratch must hold for an intermediate root. */
	uint64_t extent_bytes;
	/* Bound tensors (input, output, inout, scalar): the index in a Run's
	 * binding table, in definition order; -1 otherwise. */
	int bind_index;
	/* A scalar that a dropout_mask reads as its seed (derived by the
	 * checker): a Run gives it an integer in [0, 2^53). */
	bool seed;
	/* Nodes (program order) that first write, last read and last write
	 * it; -1 when none. A root's are the union of its own and its views'
	 * (an intermediate's memory is live from first_write to the later of
	 * last_read and last_write). */
	int first_write, last_read, last_write;
};

enum rp_prog_class {
	RP_PC_COMPUTE = 0,
	RP_PC_POINTWISE,
	RP_PC_REDUCTION,
	RP_PC_GATHER,
	/* Lowered at Define into the classes above (rms_norm, rotary,
	 * cross_entropy, softmax, adamw, sgd, ...): never in a checked
	 * program. */
	RP_PC_COMPOSITE,
};

/* Pointwise operations. A binary op may take one tensor and the node's
 * constant scalar instead of its second (or, with scalar_first, its first)
 * input; where may take it instead of b (or, with scalar_first, a).
 *
 * Dtypes: arithmetic, the math functions and the gradients read and write
 * floats (f32, f16, bf16, f64; mixed freely) and compute in f32, or in f64
 * where the output is f64; comparisons read any dtype and write 1 or 0 in
 * any; cast reads and writes any (floats to integers truncate toward 0);
 * where's cond is any dtype, its a, b and output all floats or all
 * integers; fill, iota and dropout_mask write any dtype. */
enum rp_pointwise {
	/* binary */
	RP_PW_ADD = 0, RP_PW_SUB, RP_PW_MUL, RP_PW_DIV, RP_PW_POW, RP_PW_MAXIMUM, RP_PW_MINIMUM,
	RP_PW_EQ, RP_PW_NE, RP_PW_LT, RP_PW_LE, RP_PW_GT, RP_PW_GE,   /* 1 or 0, in the output's dtype */
	/* unary */
	RP_PW_NEG, RP_PW_EXP, RP_PW_LOG, RP_PW_TANH, RP_PW_ERF, RP_PW_SIGMOID, RP_PW_SILU,
	RP_PW_GELU,          /* erf form: x/2 (1 + erf(x/sqrt 2)) */
	RP_PW_GELU_TANH,     /* tanh approximation, as cuBLASLt's epilogue */
	RP_PW_RELU, RP_PW_SQRT, RP_PW_RSQRT, RP_PW_ABS, RP_PW_RECIPROCAL, RP_PW_SQUARE,
	RP_PW_CAST,          /* a copy into the output's dtype (also: assign to an inout) */
	/* gradients, (dy, saved): torch's *_backward ATen ops */
	RP_PW_GELU_BACKWARD,       /* (dy, x) */
	RP_PW_GELU_TANH_BACKWARD,  /* (dy, x) */
	RP_PW_SILU_BACKWARD,       /* (dy, x) */
	RP_PW_SIGMOID_BACKWARD,    /* (dy, y): dy y (1 - y) */
	RP_PW_TANH_BACKWARD,       /* (dy, y): dy (1 - y^2) */
	RP_PW_RELU_BACKWARD,       /* (dy, x): dy where x > 0 */
	/* ternary */
	RP_PW_WHERE,               /* (cond, a, b): a where cond != 0 */
	/* no tensor input */
	RP_PW_FILL,                /* the scalar */
	RP_PW_IOTA,                /* the element's index along dim `axis` */
	/* (seed): 1 where the element's draw from seed and `stream` is at
	 * least p, else 0 (proto/philox.h). Its one input is a scalar tensor,
	 * the seed, an integer a Run gives. */
	RP_PW_DROPOUT_MASK,
	RP_PW_COUNT
};

/* Floats in, floats out, accumulated in f32 (f64 where the input or the
 * output is f64). amax is the largest absolute value (what a scaling
 * factor or a gradient norm's clip reads), max and min the signed ones.
 * logsumexp is log(sum(exp(x))) in one pass (the running max and the sum
 * scaled to it, online, as a softmax's normalizer wants it: the max
 * pass and the sum pass over the logits in one read); the last
 * dimension only. */
enum rp_reduction { RP_RED_SUM = 0, RP_RED_MEAN, RP_RED_MAX, RP_RED_MIN, RP_RED_AMAX, RP_RED_LOGSUMEXP, RP_RED_COUNT };
/* Reduces the last dimension (out: the input's shape without it, or with
 * it as 1), or every dimension but the last (out: [last] or 1s and last). */
enum rp_reduce_axis { RP_AXIS_LAST = 0, RP_AXIS_LEADING };

/* Embedding: out[i, :] = table[index[i], :] (inputs table [V, D], index
 * i32/i64 of any shape flattened to [N]; out [N, D]), and its backward
 * d_table[v, :] = sum of d_out[i, :] over i with index[i] == v, summed in
 * index order (deterministic: the same bits every run), every other row 0. */
enum rp_gather { RP_GATHER_EMBEDDING = 0, RP_GATHER_EMBEDDING_BACKWARD };

struct rp_prog_op;

struct rp_prog_node {
	const struct rp_prog_op *op;
	/* The name the client gave it (or "<client node>.<k>" for a node a
	 * composite lowered into): errors and Status name it. */
	char name[RP_PROG_NAME_MAX + 1];
	/* The index in the definition's nodes[] of the client's node this one
	 * is or was lowered from: what errors and Status name. */
	int source;
	/* Tensor indices; -1 for an absent optional operand. For compute
	 * nodes, indexed by the compute op's slots (inputs and outputs in the
	 * one list, as its table orders them: in[] only, nin = noperands). */
	int in[RP_PROG_NODE_IN_MAX];
	int nin;
	int out[RP_PROG_NODE_OUT_MAX];
	int nout;
	union {
		/* compute: the call as io.regen.Compute would parse it, each
		 * operand's dtype, rank, shape and strides its tensor's (offset
		 * 0, no buffer), scalars from attrs, derived dims filled. */
		struct rp_compute compute;
		struct {
			enum rp_pointwise fn;
			bool has_scalar;       /* the constant operand */
			bool scalar_first;     /* scalar OP x rather than x OP scalar */
			double scalar;
			int axis;              /* IOTA: the dimension counted */
			double p;              /* DROPOUT_MASK: the probability of a 0, in [0, 1) */
			uint32_t stream;       /* DROPOUT_MASK: which of a seed's masks */
		} pw;
		struct {
			enum rp_reduction fn;
			enum rp_reduce_axis axis;
		} red;
		struct {
			enum rp_gather fn;
		} gather;
	};
};

struct rp_prog_op {
	const char *name;             /* "gemm", "add", "sum", "embedding" */
	enum rp_prog_class cls;
	int fn;                       /* enum rp_pointwise / rp_reduction / rp_gather; rp_op_id for compute */
	int min_in, max_in;           /* tensor inputs (pointwise: without the scalar) */
	int min_out, nout;            /* outputs: at least min_out, at most nout (compute: 0, in in[]) */
	/* An output may be the very tensor (same root, offset, shape and
	 * strides) of an input: the op reads each element before it writes
	 * it. Pointwise ops are; others not. */
	bool in_place;
	/* Its operands by name, for an error about their count where the
	 * count alone would not tell what is missing ("[seed] -> [mask]");
	 * NULL otherwise. */
	const char *operands;
};

struct rp_program {
	char name[RP_PROG_NAME_MAX + 1];
	struct rp_prog_tensor *tensors;
	int ntensors;
	struct rp_prog_node *nodes;   /* program order: every node's inputs written before it */
	int nnodes;
	/* Bound tensors in binding order (bind[i] is a tensor index). */
	int bind[RP_PROG_BOUND_MAX];
	int nbound;
	/* The same bound indexes, sorted by their tensors' names: a Run names
	 * up to RP_PROG_BOUND_MAX tensors, each found by a binary search.
	 * Made by rp_program_index_bound (parse calls it). */
	int bound_by_name[RP_PROG_BOUND_MAX];
	/* Whether any node writes an inout tensor (the optimizer): a Run
	 * retried after a fault must then not apply it twice. */
	bool updates_in_place;
	/* Bytes of every intermediate root, summed (an upper bound of the
	 * scratch a backend needs; a backend may share memory between
	 * intermediates whose lifetimes do not overlap). */
	uint64_t intermediate_bytes;
	cJSON *definition;            /* the client's definition as given (Status, debugging); owned */
};

/* The table of every op a definition may name, primitives and composites.
 * NULL when unknown. */
const struct rp_prog_op *rp_prog_op_find(const char *name);

/* Parses, lowers and checks a Define call's parameters:
 *   {"name"?: string,
 *    "tensors": [{"name", "kind": "input"|"output"|"inout"|"scalar"|
 *                 "intermediate"|"view", "dtype", "shape": [..],
 *                 "strides"?: [..], "base"?: name, "offset"?: elements}],
 *    "nodes": [{"op", "name"?, "inputs": [name|null, ..] or {slot: name},
 *               "outputs": [name, ..] or {slot: name}, "attrs"?: {..}}]}
 * Compute nodes name their operands by the compute table's slots
 * ({"a": "x", "b": "w", "d": "y"}); others list them in order. Errors:
 * InvalidParameter {parameter} for a malformed field ("nodes[3].attrs.alpha"),
 * io.regen.InvalidProgram {node, reason} for a program that is well formed
 * but wrong (a node index and name, or "tensors[i]"), LimitExceeded
 * {resource} past the limits above. 0, or -EINVAL/-E2BIG with err set and
 * *p zeroed; -ENOMEM with err unset (the caller answers OutOfMemory,
 * naming its device). Composites' operands, in order (docs/protocol.md
 * has their attrs): rms_norm (x, weight?) -> (y, rstd?); rms_norm_backward
 * (dy, x, weight|null, rstd) -> (dx, dweight?); softmax, log_softmax (x) ->
 * (y); softmax_backward, log_softmax_backward (dy, y) -> (dx);
 * cross_entropy (logits, target) -> (loss, lse?); cross_entropy_backward
 * (dloss, logits, target, lse) -> (dlogits); rotary, rotary_backward (x,
 * cos, sin) -> (out); adamw (param, grad, exp_avg, exp_avg_sq) -> ();
 * sgd (param, grad, momentum_buffer?) -> (). */
int rp_program_parse(const cJSON *params, struct rp_program *p, struct rp_error *err);
/* Sorts bound_by_name from bind[] and the tensors' names: for a program
 * made or changed other than by rp_program_parse. */
void rp_program_index_bound(struct rp_program *p);
/* "[1, 3]": the multi-index of row-major position l in tensor t, for
 * error messages (an index outside its table). */
void rp_prog_format_position(const struct rp_prog_tensor *t, int64_t l, char *out, size_t size);
void rp_program_finish(struct rp_program *p);

/* Bytes a tensor's dtype takes; 8 for scalars (f64). */
size_t rp_prog_tensor_elem_size(const struct rp_prog_tensor *t);
/* Whether two tensors have no element in common: other roots, element
 * ranges apart, or interleaved views (a row's two halves; q, k and v as
 * column blocks of one qkv) whose offsets, modulo one of their strides,
 * cover intervals the other misses. Conservative: false may still be
 * disjoint. */
bool rp_prog_disjoint(const struct rp_prog_tensor *x, const struct rp_prog_tensor *y);
/* Whether the tensor's strides are contiguous row-major. */
bool rp_prog_tensor_contiguous(const struct rp_prog_tensor *t);

/* A Run's parameters, parsed against the program (buffers are resolved by
 * the worker):
 *   {"program": id, "bind": {name: {"buffer": id, "offset"?: bytes}},
 *    "scalars"?: {name: number}, "wait_event"?, "signal_event"?,
 *    "deadline_ms"?, "journal"?: {"buffer", "offset"?, "mode"?: "copy" | "marks"},
 *    "seq"?, "retry"?}
 * Every input, output and inout is bound exactly once, every scalar given
 * exactly once, nothing else named. */
struct rp_prog_binding {
	struct rp_id buffer;
	uint64_t offset;              /* bytes; a multiple of the element size */
};

/* What a Run's journal holds (proto/program_journal.h): copies of the
 * inouts and the header's marks, or the marks alone. */
enum rp_prog_journal_mode { RP_JOURNAL_COPY = 0, RP_JOURNAL_MARKS = 1 };

struct rp_program_run {
	struct rp_id program;
	/* A Run that may be retried after a fault (proto/program_journal.h):
	 * "journal": {buffer, offset, mode}, "seq", "retry"; given together
	 * (offset, mode and retry optional). */
	bool has_journal;
	struct rp_prog_binding journal;
	enum rp_prog_journal_mode journal_mode;
	uint64_t seq;
	bool retry;
	int nbound;
	struct rp_prog_binding *bind; /* [p->nbound], by bind_index; scalars' entries unused */
	double *scalars;              /* [p->nbound], by bind_index; only scalars' entries used */
	struct rp_event_ref wait_event, signal_event;
	uint32_t deadline_ms;
};

/* The run's program id alone (the worker looks the program up before it
 * parses the rest). */
int rp_program_run_id(const cJSON *params, struct rp_id *id, struct rp_error *err);
/* 0, or -EINVAL with err set (InvalidParameter "bind.<name>",
 * "scalars.<name>", "program", ...; InvalidOperand naming a tensor whose
 * offset is misaligned) and *run zeroed; -ENOMEM with err unset. */
int rp_program_run_parse(const struct rp_program *p, const cJSON *params, struct rp_program_run *run,
			 struct rp_error *err);
void rp_program_run_finish(struct rp_program_run *run);
/* The Run's parameters as a client sends them (tests, tools): what
 * rp_program_run_parse reads back into *run. NULL on ENOMEM. */
cJSON *rp_program_run_to_json(const struct rp_program *p, const struct rp_program_run *run);

/* The steps of a Run's parse, one set of checks for every transport:
 * rp_program_run_parse walks a Varlink call's parameters through them, a
 * ring's decoder (proto/ring.h, rp_ring_decode_run) its records. Bound
 * tensors are named by their position i in p->bind (0 <= i < p->nbound;
 * the caller refuses a name or position that binds nothing); seen[] marks
 * the positions given so far. Errors as rp_program_run_parse's. */
/* run's tables for p, and seen[]: 0, or -ENOMEM with *run zeroed. */
int rp_program_run_alloc(const struct rp_program *p, struct rp_program_run *run, bool **seen);
/* Binds position i (an input, output or inout, not given before) to
 * buffer at offset: InvalidParameter "bind.<name>" (a scalar, or given
 * twice), "bind.<name>.buffer" (not a buffer id), "bind.<name>.offset"
 * (past 2^53); InvalidOperand naming the tensor for a misaligned offset. */
int rp_program_run_bind(const struct rp_program *p, int i, const struct rp_id *buffer, uint64_t offset,
			struct rp_program_run *run, bool *seen, struct rp_error *err);
/* Gives scalar position i its value: InvalidParameter "scalars.<name>"
 * for a tensor that is no scalar, one given twice, a value not finite, or
 * a seed (rp_prog_tensor.seed) that is not an integer in [0, 2^53). */
int rp_program_run_scalar(const struct rp_program *p, int i, double value, struct rp_program_run *run, bool *seen,
			  struct rp_error *err);
/* The journal (buffer, offset, mode) where has_journal, the seq where
 * has_seq, retry: InvalidParameter "seq" (past 2^53, or missing beside a
 * journal), "journal" (a seq without one), "retry" (without a journal),
 * "journal.mode" (marks without a journal: a ring record's flag),
 * "journal.buffer", "journal.offset" (past 2^53 or not 8-byte aligned). */
int rp_program_run_journal(struct rp_program_run *run, bool has_journal, const struct rp_id *buffer, uint64_t offset,
			   enum rp_prog_journal_mode mode, bool has_seq, uint64_t seq, bool retry, struct rp_error *err);
/* Every position given: else InvalidParameter naming the first missing
 * ("bind.<name>" or "scalars.<name>"). */
int rp_program_run_complete(const struct rp_program *p, const bool *seen, struct rp_error *err);
