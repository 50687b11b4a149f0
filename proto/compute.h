/* io.regen.Compute calls as descriptors: parsed from parameters and checked
 * for consistency among their operands (not yet against buffers: the worker
 * does that once it has resolved the buffer ids). */
#pragma once

#include <stdbool.h>
#include <cjson/cJSON.h>
#include "ids.h"
#include "message.h"
#include "operand.h"

enum rp_epilogue { RP_EPILOGUE_NONE = 0, RP_EPILOGUE_BIAS, RP_EPILOGUE_GELU, RP_EPILOGUE_GELU_BIAS };
enum rp_compute_mode { RP_COMPUTE_F32 = 0, RP_COMPUTE_TF32 };

struct rp_event_ref {
	bool present;
	struct rp_id id;
};

struct rp_gemm {
	struct rp_operand a, b, c, d, bias;
	bool has_c, has_bias;
	bool trans_a, trans_b;
	double alpha, beta;          /* defaults 1 and 0 */
	enum rp_epilogue epilogue;
	enum rp_compute_mode compute;
	int64_t m, n, k;             /* derived */
	struct rp_event_ref wait_event, signal_event;
};

/* Rules (each violation an InvalidOperand {operand, reason} or
 * InvalidParameter naming the field):
 * - a, b, c, d rank 2; bias rank 1 [N].
 * - op(A) [M,K], op(B) [K,N] agree on K; d is [M,N]; c, when present, [M,N].
 * - a and b share a dtype; c and d share a dtype; bias has d's dtype;
 *   tf32 only with f32 inputs.
 * - beta != 0 needs c; epilogue bias/gelu_bias needs bias and vice versa.
 * - strides: the last dimension's stride is 1 (row-major leading dimension
 *   layout the libraries support), the first >= the last dim's size.
 * - d must not overlap a, b or bias in the same buffer (c may alias d exactly). */
int rp_gemm_parse(const cJSON *params, struct rp_gemm *g, struct rp_error *err);

struct rp_attention {
	struct rp_operand q, k, v, o, stats;
	bool has_stats;
	double scale;                /* default 1/sqrt(D) */
	bool causal;
	int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_v;   /* derived */
	struct rp_event_ref wait_event, signal_event;
};

/* Rules: q, k, v, o rank 4, [B,H,Sq,D], [B,H,Skv,D], [B,H,Skv,Dv], [B,H,Sq,Dv];
 * all one dtype; stats f32 rank 3 [B,H,Sq]; last stride 1; o must not overlap
 * q, k or v. scale finite and > 0. */
int rp_attention_parse(const cJSON *params, struct rp_attention *a, struct rp_error *err);

struct rp_attention_backward {
	struct rp_operand q, k, v, o, d_o, stats, d_q, d_k, d_v;
	double scale;
	bool causal;
	int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_v;
	struct rp_event_ref wait_event, signal_event;
};

/* Rules as Attention; d_o like o, d_q like q, d_k like k, d_v like v, stats
 * required; outputs must not overlap inputs or each other. */
int rp_attention_backward_parse(const cJSON *params, struct rp_attention_backward *a, struct rp_error *err);
