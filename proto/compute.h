/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Compute: one table per operation.
 *
 * Each operation (Gemm, Attention, AttentionBackward, LayerNorm,
 * LayerNormBackward, Quantize, TransposeQuantize, ScaleUpdate) is one struct
 * rp_op_spec: its method, its operands (name, role, rank, dtypes, which
 * operand's dtype or shape it shares), its scalar parameters, and one
 * function for what a table cannot say (the shape relations among
 * operands, options that depend on each other), and where a ring record
 * carries its scalars. The parser, the ring's codec, the worker's operand
 * resolution, both backends' dispatch and the clients (regen/ops.py is
 * generated from it) walk the same table: a new operation is one table
 * entry plus its kernels (docs/testing.md, "Adding an operation").
 *
 * Parsing checks everything a client can get wrong without looking at a
 * buffer (the worker checks the bounds once it has resolved the ids), and
 * reports each mistake by name: InvalidParameter {parameter} for a field of
 * the wrong type or value, InvalidOperand {operand, reason} for a tensor
 * whose rank, dtype, shape, strides or placement disagrees with the others. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "ids.h"
#include "message.h"
#include "operand.h"
#include "params.h"

enum rp_op_id {
	RP_OP_GEMM = 0, RP_OP_ATTENTION, RP_OP_ATTENTION_BACKWARD, RP_OP_LAYER_NORM, RP_OP_LAYER_NORM_BACKWARD,
	RP_OP_QUANTIZE, RP_OP_TRANSPOSE_QUANTIZE, RP_OP_SCALE_UPDATE,
	RP_OP_COUNT,
	/* io.regen.Comm's calls (proto/comm.h): parsed by this machinery from
	 * tables of their own, and not in the compute table. */
	RP_OP_COMM = RP_OP_COUNT,
	/* io.regen.Program.Run (proto/program.h): a whole program on the lane
	 * as one call; rd_op.run says which and with what. */
	RP_OP_PROGRAM,
};

/* Operand slots, in each table's order. */
/* aux came after bias, and aux_out after aux, so that the slots before each
 * kept their numbers; FP8's scales and amax came last for the same reason. */
enum {
	RP_GEMM_A = 0, RP_GEMM_B, RP_GEMM_C, RP_GEMM_D, RP_GEMM_BIAS, RP_GEMM_AUX, RP_GEMM_AUX_OUT, RP_GEMM_A_SCALE,
	RP_GEMM_B_SCALE, RP_GEMM_D_SCALE, RP_GEMM_AMAX_D, RP_GEMM_OPERANDS
};
/* The sequence lengths come last in both attention tables, so that the
 * slots before them kept their numbers (ring records name operands by
 * slot). */
enum {
	RP_ATT_Q = 0, RP_ATT_K, RP_ATT_V, RP_ATT_O, RP_ATT_STATS, RP_ATT_SEQ_LEN_Q, RP_ATT_SEQ_LEN_KV, RP_ATT_OPERANDS
};
enum {
	RP_ATB_Q = 0, RP_ATB_K, RP_ATB_V, RP_ATB_O, RP_ATB_DO, RP_ATB_STATS, RP_ATB_DQ, RP_ATB_DK, RP_ATB_DV,
	RP_ATB_SEQ_LEN_Q, RP_ATB_SEQ_LEN_KV, RP_ATB_OPERANDS
};
/* LayerNorm's, and its backward's: d_residual, an input, comes after the
 * outputs it is added into. */
enum { RP_LN_X = 0, RP_LN_WEIGHT, RP_LN_BIAS, RP_LN_Y, RP_LN_MEAN, RP_LN_RSTD, RP_LN_OPERANDS };
enum {
	RP_LNB_DY = 0, RP_LNB_X, RP_LNB_WEIGHT, RP_LNB_MEAN, RP_LNB_RSTD, RP_LNB_DX, RP_LNB_DWEIGHT, RP_LNB_DBIAS,
	RP_LNB_DRESIDUAL, RP_LNB_OPERANDS
};
/* Quantize and TransposeQuantize (proto/compute_fp8.c): y_t only in the
 * latter, where y is optional. */
enum { RP_QUANT_X = 0, RP_QUANT_SCALE, RP_QUANT_Y, RP_QUANT_AMAX, RP_QUANT_Y_T, RP_QUANT_OPERANDS };
/* ScaleUpdate: each output may be its input itself (an update in place). */
enum {
	RP_SCU_AMAX_HISTORY = 0, RP_SCU_SCALE, RP_SCU_AMAX_HISTORY_OUT, RP_SCU_SCALE_OUT, RP_SCU_SCALE_INV,
	RP_SCU_OPERANDS
};
#define RP_OP_OPERANDS_MAX 11

#define RP_DTYPE_BIT(dt) (1u << (dt))
#define RP_DTYPES_ANY (RP_DTYPE_BIT(RP_DTYPE_F32) | RP_DTYPE_BIT(RP_DTYPE_F16) | RP_DTYPE_BIT(RP_DTYPE_BF16))
/* What a communicator carries: the floats, f64 and the integers (NCCL's
 * own types); fp8 is not among them. */
#define RP_DTYPES_COMM                                                                                 \
	(RP_DTYPES_ANY | RP_DTYPE_BIT(RP_DTYPE_F64) | RP_DTYPE_BIT(RP_DTYPE_I32) | RP_DTYPE_BIT(RP_DTYPE_I64) | \
	 RP_DTYPE_BIT(RP_DTYPE_U8))
#define RP_DTYPES_FP8 (RP_DTYPE_BIT(RP_DTYPE_E4M3) | RP_DTYPE_BIT(RP_DTYPE_E5M2))
#define RP_NO_SLOT (-1)

enum rp_operand_role { RP_ROLE_IN = 0, RP_ROLE_OUT };

struct rp_operand_spec {
	const char *name;            /* the parameter: "q" */
	enum rp_operand_role role;   /* outputs may share no byte with another operand */
	bool required;
	int rank;
	const char *dims;            /* "[B, H, Sq, D]": in reasons and docs */
	unsigned dtypes;             /* RP_DTYPE_BIT mask */
	int dtype_like;              /* slot whose dtype this one shares, or RP_NO_SLOT */
	int shape_like;              /* slot whose shape this one has (a gradient), or RP_NO_SLOT */
	bool padded_rows;            /* a matrix whose rows may be padded: row stride >= row length */
	int may_alias;               /* an output: the one input it may alias exactly, or RP_NO_SLOT */
};

/* Where a ring record (proto/ring.h) carries one of an op's scalars. The
 * record's scalar fields are shared by every op: each op names the ones
 * it uses, and a record whose other fields are not 0 is refused. */
enum rp_ring_field {
	RP_RING_FIELD_FLAG = 0,      /* a bit of `flags` (`flag`): a bool */
	RP_RING_FIELD_EPILOGUE,      /* the byte fields: an enum */
	RP_RING_FIELD_COMPUTE,
	RP_RING_FIELD_ALIGNMENT,
	RP_RING_FIELD_ALPHA,         /* the doubles */
	RP_RING_FIELD_BETA,
	RP_RING_FIELD_SCALE,
	RP_RING_FIELDS
};

struct rp_op_ring_scalar {
	const char *name;            /* what refusals name: the call's parameter ("trans_a", "eps") */
	enum rp_ring_field field;
	uint16_t flag;               /* RP_RING_FIELD_FLAG: the bit (RP_RING_TRANS_A) */
	size_t offset;               /* the value in struct rp_compute: a bool, an enum or a double */
	const char *const *choices;  /* an enum's names, in its order (NULL terminated); else NULL */
};

struct rp_compute;

struct rp_op_spec {
	enum rp_op_id id;
	const char *method;          /* "io.regen.Compute.Gemm" */
	const char *name;            /* "gemm": logs and the Python client */
	unsigned noperands;
	const struct rp_operand_spec *operands;
	const struct rp_field *scalars;   /* NULL-name terminated */
	/* Reads the scalars of a call's parameters into the op's part of c
	 * (their types and names only). 0 or -EINVAL with err set. */
	int (*read_scalars)(const cJSON *params, struct rp_compute *c, struct rp_error *err);
	/* Checks what the table cannot say, whichever way c was filled (a
	 * Varlink call, a ring record): the scalars' values, the shapes among
	 * operands, options that depend on each other; fills the derived
	 * dimensions. Runs after every operand passed its own checks. 0 or
	 * -EINVAL with err set. */
	int (*check)(struct rp_compute *c, struct rp_error *err);
	/* Writes the op's scalars into a call's parameters (clients). */
	void (*encode)(const struct rp_compute *c, cJSON *params);
	/* Its scalars in a ring record (proto/ring.c reads and writes them by
	 * this list alone), NULL-name terminated. */
	const struct rp_op_ring_scalar *ring_scalars;
};

/* DGELU: GELU's gradient, D = (alpha op(A) op(B) + beta C) * GELU'(aux).
 * GELU_AUX and GELU_AUX_BIAS: GELU and GELU_BIAS that also write GELU's
 * input to aux_out, for a DGELU to read in the backward pass. */
enum rp_epilogue {
	RP_EPILOGUE_NONE = 0, RP_EPILOGUE_BIAS, RP_EPILOGUE_GELU, RP_EPILOGUE_GELU_BIAS, RP_EPILOGUE_DGELU,
	RP_EPILOGUE_GELU_AUX, RP_EPILOGUE_GELU_AUX_BIAS,
	RP_EPILOGUE_LAST = RP_EPILOGUE_GELU_AUX_BIAS
};
/* FP8_FAST_ACCUM: FP8 inputs' partial sums kept in the tensor cores'
 * narrower accumulator, never promoted to f32 midway (cuBLASLt's
 * FAST_ACCUM; Transformer Engine's forward GEMMs). */
enum rp_compute_mode { RP_COMPUTE_F32 = 0, RP_COMPUTE_TF32, RP_COMPUTE_FP8_FAST_ACCUM,
		       RP_COMPUTE_LAST = RP_COMPUTE_FP8_FAST_ACCUM };
enum rp_causal_alignment { RP_CAUSAL_TOP_LEFT = 0, RP_CAUSAL_BOTTOM_RIGHT };

struct rp_event_ref {
	bool present;
	struct rp_id id;
};

/* Gemm: D = epilogue(alpha op(A) op(B) + beta C + bias), or with dgelu
 * (alpha op(A) op(B) + beta C) * GELU'(aux); gelu_aux and gelu_aux_bias
 * write GELU's input to aux_out besides. With FP8 inputs (proto/compute_gemm.c)
 * op(A) op(B) is of the dequantized inputs, a_scale A and b_scale B; an FP8
 * D stores d_scale times the result, whose amax goes to amax_d. */
struct rp_gemm {
	bool trans_a, trans_b;
	double alpha, beta;          /* defaults 1 and 0 */
	enum rp_epilogue epilogue;
	enum rp_compute_mode compute;
	int64_t m, n, k;             /* derived */
};

/* Attention and AttentionBackward. */
struct rp_attention {
	double scale;                /* default 1/sqrt(D) */
	bool causal;
	enum rp_causal_alignment alignment;
	int64_t batch, heads, heads_kv, seq_q, seq_kv, head_dim, head_dim_v;   /* derived */
	/* Derived: seq_len_q and seq_len_kv are given, so each batch entry's
	 * sequences are the first seq_len_q[b] rows of q and seq_len_kv[b]
	 * rows of k and v, the rest padding (seq_q, seq_kv are then the
	 * padded lengths). */
	bool padded;
};

/* LayerNorm and LayerNormBackward: statistics over the last dimension of
 * x [rows, n]. */
struct rp_layer_norm {
	double eps;                  /* LayerNorm's; default RP_LAYER_NORM_EPS_DEFAULT; 0 in the backward */
	int64_t rows, n;             /* derived */
};
#define RP_LAYER_NORM_EPS_DEFAULT 1e-5
/* The longest row a LayerNorm takes: what the backends size their per-row
 * scratch and per-column partial sums by. */
#define RP_LAYER_NORM_N_MAX 65536

/* Quantize and TransposeQuantize: y = fp8(x * scale), rounded to nearest
 * even and saturated to the FP8 dtype's largest finite value; amax =
 * max |x|. x [rows, cols]; TransposeQuantize's y_t is [cols, rows]. */
struct rp_quantize {
	int64_t rows, cols;          /* derived */
};

/* ScaleUpdate: Transformer Engine's delayed-scaling step over N scales
 * with histories of H amaxes (proto/compute_fp8.c). */
enum rp_amax_compute { RP_AMAX_COMPUTE_MAX = 0, RP_AMAX_COMPUTE_MOST_RECENT };
enum rp_fp8_format { RP_FP8_E4M3 = 0, RP_FP8_E5M2 };
static inline enum rp_dtype rp_fp8_format_dtype(enum rp_fp8_format f)
{
	return f == RP_FP8_E5M2 ? RP_DTYPE_E5M2 : RP_DTYPE_E4M3;
}
struct rp_scale_update {
	enum rp_fp8_format format;   /* the FP8 dtype whose largest value the scale aims at */
	enum rp_amax_compute amax_compute;
	double margin;               /* scale = fp8_max * 2^-margin / amax */
	int64_t history, n;          /* derived: H and N */
};

/* io.regen.Comm's calls that run on a lane (proto/comm.h). */
enum rp_comm_kind {
	RP_COMM_INIT = 0, RP_COMM_DESTROY, RP_COMM_ALL_REDUCE, RP_COMM_ALL_GATHER, RP_COMM_REDUCE_SCATTER,
	RP_COMM_BROADCAST, RP_COMM_ALL_TO_ALL, RP_COMM_P2P_SEND, RP_COMM_P2P_RECV, RP_COMM_KINDS
};
enum rp_reduce_op { RP_REDUCE_SUM = 0, RP_REDUCE_MAX, RP_REDUCE_AVG, RP_REDUCE_MIN, RP_REDUCE_PROD };
#define RP_COMM_ID_SIZE 128        /* ncclUniqueId */

struct rp_comm_call {
	enum rp_comm_kind kind;
	struct rp_id comm;           /* collectives and Destroy */
	enum rp_reduce_op op;        /* AllReduce, ReduceScatter */
	uint32_t root;               /* Broadcast */
	uint32_t peer;               /* Send, Recv: the other rank */
	/* Init */
	uint32_t rank, nranks;
	unsigned char unique_id[RP_COMM_ID_SIZE];
	/* Destroy */
	bool abort;
};

/* What every operation's call may carry besides its own parameters: the
 * events it waits for and signals, and its deadline. NULL-name terminated,
 * RP_COMPUTE_COMMON_FIELDS entries. */
#define RP_COMPUTE_COMMON_FIELDS 3
extern const struct rp_field rp_compute_common_fields[RP_COMPUTE_COMMON_FIELDS + 1];
/* The largest deadline_ms a call may name: a day. */
#define RP_DEADLINE_MS_MAX 86400000u
/* Reads those fields of a call's parameters (types already checked):
 * events as event ids, deadline_ms 1 ms to a day (0 when absent).
 * InvalidParameter naming the field. */
int rp_compute_parse_common(const cJSON *params, struct rp_event_ref *wait_event, struct rp_event_ref *signal_event,
			    uint32_t *deadline_ms, struct rp_error *err);

/* One parsed call. operands[] and present[] are indexed by the op's slots. */
struct rp_compute {
	const struct rp_op_spec *spec;
	struct rp_operand operands[RP_OP_OPERANDS_MAX];
	bool present[RP_OP_OPERANDS_MAX];
	struct rp_event_ref wait_event, signal_event;
	/* How long the call may take, from its arrival to its completion,
	 * before the device counts as hung; 0: not given (the worker's default
	 * applies). */
	uint32_t deadline_ms;
	union {
		struct rp_gemm gemm;
		struct rp_attention attention;
		struct rp_layer_norm layer_norm;
		struct rp_quantize quantize;
		struct rp_scale_update scale_update;
		struct rp_comm_call comm;
	};
};

extern const struct rp_op_spec rp_op_gemm, rp_op_attention, rp_op_attention_backward;
extern const struct rp_op_spec rp_op_layer_norm, rp_op_layer_norm_backward;
extern const struct rp_op_spec rp_op_quantize, rp_op_transpose_quantize, rp_op_scale_update;
/* io.regen.Program.Run's spec (id RP_OP_PROGRAM, no operands): what the
 * worker's generic path and the logs know of a Run. */
extern const struct rp_op_spec rp_op_program_run;

/* The table of every operation, indexed by enum rp_op_id. */
const struct rp_op_spec *rp_op_get(enum rp_op_id id);
/* By method name ("io.regen.Compute.Gemm"); NULL when none. */
const struct rp_op_spec *rp_op_find(const char *method);
/* The slot of an operand by name, or RP_NO_SLOT. */
int rp_op_slot(const struct rp_op_spec *spec, const char *name);

/* Parses and checks one call's parameters. On failure *c is zeroed (a
 * half-filled descriptor must not look usable). */
int rp_compute_parse(const struct rp_op_spec *spec, const cJSON *params, struct rp_compute *c, struct rp_error *err);

/* The checks of rp_compute_parse for a descriptor filled another way (a
 * ring record, proto/ring.h): each operand's fields (rp_operand_validate),
 * then everything the table says, in the same order and with the same
 * errors. c->spec, operands, present[], events and the op's scalars must be
 * set; derived dimensions are filled. On failure *c is zeroed. */
int rp_compute_check(struct rp_compute *c, struct rp_error *err);

/* The part of those checks that reads no buffer and no offset: each
 * operand's rank, strides and dtype, the dtypes operands share, the op's
 * own check (scalars, shapes; derived dimensions filled), gradients shaped
 * like their primals. What rp_compute_check adds is where the operands lie
 * in their buffers; a program's checker (proto/program.h) judges that by
 * its tensors instead. c->spec, operands (dtype, rank, shape, strides),
 * present[] and the op's scalars must be set; *c is not zeroed on failure. */
int rp_compute_check_operands(struct rp_compute *c, struct rp_error *err);

/* The call's parameters as a client sends them: operands by the table,
 * then the scalars the op's encoder writes. NULL on ENOMEM. */
cJSON *rp_compute_to_json(const struct rp_compute *c);

/* The operand at slot, or NULL when the optional operand is absent. */
static inline const struct rp_operand *rp_compute_operand(const struct rp_compute *c, int slot)
{
	return c->present[slot] ? &c->operands[slot] : NULL;
}
