/* SPDX-License-Identifier: Apache-2.0 */
/* The SDPA graphs of cudnn_graph.h, op for op as cudnn-frontend (1.x, for
 * cuDNN 9.19) builds them in its CompositeSDPANode and
 * CompositeSDPABackwardNode: the fused engines match on this shape, data
 * types and all, so where the frontend does something odd (a virtual
 * tensor's strides, an f32 reshape of a bf16 tensor) this file does the
 * same and says so.
 *
 * The frontend's context for these graphs: io data type bf16 or f16,
 * intermediate (virtual tensors) f32, compute f32; by-value scalars are 4-d
 * [1, 1, 1, 1]; every tensor declares 16-byte alignment.
 *
 * Sequence lengths are the frontend's padding mask (its padding_mask score
 * modifier, attn_score_modifiers.h): the lengths as int32 [B, 1, 1, 1]
 * tensors, the scores past them set to -inf (row < seq_len_q and column <
 * seq_len_kv, after the scale and before the causal mask, whose
 * bottom-right diagonal then uses the lengths instead of Sq and Skv), and
 * the lengths as the M, N or K overrides of every matmul over a sequence
 * dimension, as the frontend sets them. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/cudnn_graph.h"

/* Operations in the largest graph (backward, padding and bottom-right
 * masks, GQA): 36. */
#define GRAPH_OPS_MAX 48
#define SCRATCH_ALIGN 256

void cuda_sdpa_key_init(struct cuda_sdpa_key *key)
{
	memset(key, 0, sizeof(*key));
}

struct graph {
	struct cuda_sdpa_plan *plan;          /* owns every descriptor made */
	cudnnBackendDescriptor_t ops[GRAPH_OPS_MAX];
	unsigned nops;
	int64_t next_uid;                      /* virtual tensors */
	cudnnDataType_t io;
	/* The lengths' tensors ([B, 1, 1, 1] int32), NULL without them. */
	cudnnBackendDescriptor_t seq_q, seq_kv;
	/* The first failure; every helper does nothing once it is set, so a
	 * graph is built straight through and checked once. */
	cudnnStatus_t status;
	char *why;
	size_t why_len;
};

/* cuDNN's last error string is a stack, one "Warning: STATUS; Reason: what
 * at: where" line per frame, innermost first, sometimes behind an engine's
 * JSON: the first reason is what a person can act on. */
static void last_reason(char *out, size_t n)
{
	char raw[2048] = "";
	const char *r, *end;

	out[0] = '\0';
	cudnnGetLastErrorString(raw, sizeof(raw));
	if (!raw[0])
		return;
	r = strstr(raw, "Reason: ");
	r = r ? r + strlen("Reason: ") : raw;
	end = strstr(r, " at: ");
	const char *nl = strchr(r, '\n');
	if (!end || (nl && nl < end))
		end = nl ? nl : r + strlen(r);
	snprintf(out, n, "%.*s", (int)(end - r), r);
}

static void fail(struct graph *g, cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct graph *g, cudnnStatus_t s, const char *fmt, ...)
{
	char what[160], detail[384];
	va_list ap;

	if (g->status != CUDNN_STATUS_SUCCESS)
		return;
	g->status = s ? s : CUDNN_STATUS_INTERNAL_ERROR;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	last_reason(detail, sizeof(detail));
	if (g->why && g->why_len) {
		if (detail[0])
			snprintf(g->why, g->why_len, "%s: %s (%s)", what, cudnnGetErrorString(s), detail);
		else
			snprintf(g->why, g->why_len, "%s: %s", what, cudnnGetErrorString(s));
	}
}

static bool keep(struct graph *g, cudnnBackendDescriptor_t d)
{
	struct cuda_sdpa_plan *p = g->plan;

	if (p->ndescs == p->cap) {
		unsigned cap = p->cap ? p->cap * 2 : 64;
		cudnnBackendDescriptor_t *n = realloc(p->descs, cap * sizeof(*n));
		if (!n) {
			cudnnBackendDestroyDescriptor(d);
			fail(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "no memory for the graph's descriptors");
			return false;
		}
		p->descs = n;
		p->cap = cap;
	}
	p->descs[p->ndescs++] = d;
	return true;
}

static cudnnBackendDescriptor_t create(struct graph *g, cudnnBackendDescriptorType_t type, const char *what)
{
	cudnnBackendDescriptor_t d = NULL;

	if (g->status)
		return NULL;
	cudnnStatus_t s = cudnnBackendCreateDescriptor(type, &d);
	if (s != CUDNN_STATUS_SUCCESS) {
		fail(g, s, "creating the %s descriptor", what);
		return NULL;
	}
	return keep(g, d) ? d : NULL;
}

static void set(struct graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
		cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what)
{
	if (g->status)
		return;
	cudnnStatus_t s = cudnnBackendSetAttribute(d, name, type, count, value);
	if (s != CUDNN_STATUS_SUCCESS)
		fail(g, s, "setting attribute %d of the %s", (int)name, what);
}

static void finalize(struct graph *g, cudnnBackendDescriptor_t d, const char *what)
{
	if (g->status)
		return;
	cudnnStatus_t s = cudnnBackendFinalize(d);
	if (s != CUDNN_STATUS_SUCCESS)
		fail(g, s, "cuDNN refuses the %s", what);
}

static void add_op(struct graph *g, cudnnBackendDescriptor_t op)
{
	if (g->status)
		return;
	if (g->nops == GRAPH_OPS_MAX) {
		fail(g, CUDNN_STATUS_INTERNAL_ERROR, "the attention graph has more than %d operations", GRAPH_OPS_MAX);
		return;
	}
	g->ops[g->nops++] = op;
}

/* ---- Tensors and operations ---------------------------------------------- */

static const int64_t ONES[4] = { 1, 1, 1, 1 };

static cudnnBackendDescriptor_t tensor(struct graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
				       const int64_t strides[4], bool is_virtual, bool by_value, const char *what)
{
	cudnnBackendDescriptor_t t = create(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
	int64_t alignment = 16;
	bool yes = true;

	set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, what);
	set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, what);
	set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, what);
	set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
	set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
	if (is_virtual)
		set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
	if (by_value)
		set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
	finalize(g, t, what);
	return t;
}

static cudnnBackendDescriptor_t virt(struct graph *g, cudnnDataType_t dt, const int64_t dims[4],
				     const int64_t strides[4], const char *what)
{
	return tensor(g, g->next_uid++, dt, dims, strides, true, false, what);
}

static cudnnBackendDescriptor_t scalar(struct graph *g, int64_t uid, cudnnDataType_t dt, const char *what)
{
	return tensor(g, uid, dt, ONES, ONES, false, true, what);
}

/* y = mode(x[, b[, t]]), math in `prec`. GEN_INDEX takes the axis. */
static void pointwise(struct graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
		      cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis,
		      const char *what)
{
	cudnnBackendDescriptor_t pw = create(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
	set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
	set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
	if (mode == CUDNN_POINTWISE_GEN_INDEX)
		set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
	finalize(g, pw, what);

	cudnnBackendDescriptor_t op = create(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
	set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
	set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
	if (b)
		set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
	if (t)
		set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
	set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
	finalize(g, op, what);
	add_op(g, op);
}

/* Which matmul dimensions the sequence lengths override (the frontend's
 * set_m/n/k_override), each one of the graph's length tensors or none. */
enum seq { SEQ_NONE = 0, SEQ_Q, SEQ_KV };

static cudnnBackendDescriptor_t seq_tensor(const struct graph *g, enum seq which)
{
	return which == SEQ_Q ? g->seq_q : which == SEQ_KV ? g->seq_kv : NULL;
}

/* c = a @ b over the last two dimensions, batched (and broadcast: k and v
 * have Hkv heads against q's H) over the first two. With lengths, the
 * dimensions m, n, k name are each entry's own. */
static void matmul(struct graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
		   enum seq m, enum seq n, enum seq k, const char *what)
{
	cudnnDataType_t comp = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t mm = create(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
	set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
	finalize(g, mm, what);

	cudnnBackendDescriptor_t op = create(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
	set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
	set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
	set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
	set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what);
	const struct {
		cudnnBackendAttributeName_t name;
		cudnnBackendDescriptor_t t;
	} overrides[] = {
		{ CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, seq_tensor(g, m) },
		{ CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, seq_tensor(g, n) },
		{ CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, seq_tensor(g, k) },
	};
	for (int i = 0; i < 3; i++) {
		if (overrides[i].t)
			set(g, op, overrides[i].name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &overrides[i].t, what);
	}
	finalize(g, op, what);
	add_op(g, op);
}

/* y = reduce(x) over the dimensions where y has extent 1. */
static void reduction(struct graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
		      cudnnBackendDescriptor_t y, const char *what)
{
	cudnnDataType_t comp = CUDNN_DATA_FLOAT;
	bool deterministic = false;
	cudnnBackendDescriptor_t rd = create(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
	set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
	set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, what);
	set(g, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic, what);
	finalize(g, rd, what);

	cudnnBackendDescriptor_t op = create(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
	set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
	set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
	set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
	finalize(g, op, what);
	add_op(g, op);
}

/* A view of x with other dimensions and strides (transposes, here). */
static void reshape(struct graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *what)
{
	cudnnBackendDescriptor_t op = create(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
	set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
	set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
	finalize(g, op, what);
	add_op(g, op);
}

static void dims4(int64_t out[4], int64_t a, int64_t b, int64_t c, int64_t d)
{
	out[0] = a;
	out[1] = b;
	out[2] = c;
	out[3] = d;
}

/* Row-major strides of dims. */
static void packed(int64_t out[4], const int64_t dims[4])
{
	out[3] = 1;
	for (int i = 2; i >= 0; i--)
		out[i] = out[i + 1] * dims[i + 1];
}

/* out = a @ b for a key or value gradient (Hkv heads of width d): computed
 * per query head, then, for grouped-query attention, summed over each
 * group of H / Hkv query heads by a reduction. Rows are keys, the inner
 * dimension queries (the lengths' overrides say so). */
static void grouped_matmul(struct graph *g, const struct cuda_sdpa_key *k, cudnnBackendDescriptor_t a,
			   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out, int64_t d, const char *what,
			   const char *per_head, const char *group_sum)
{
	int64_t full[4], full_s[4];

	if (k->h == k->h_kv) {
		matmul(g, a, b, out, SEQ_KV, SEQ_NONE, SEQ_Q, what);
		return;
	}
	dims4(full, k->b, k->h, k->s_kv, d);
	packed(full_s, full);
	cudnnBackendDescriptor_t per_query_head = virt(g, g->io, full, full_s, per_head);
	matmul(g, a, b, per_query_head, SEQ_KV, SEQ_NONE, SEQ_Q, what);
	reduction(g, CUDNN_REDUCE_TENSOR_ADD, per_query_head, out, group_sum);
}

/* The operand's strides with the last two dimensions swapped: k and v as
 * the transposes the matmuls read them as. */
static void swapped(int64_t out[4], const int64_t s[4])
{
	dims4(out, s[0], s[1], s[3], s[2]);
}

/* ---- Graphs --------------------------------------------------------------- */

/* The lengths' tensors, int32 [B, 1, 1, 1] in the workspace, when the key
 * has them: built first, as the frontend lists its inputs. */
static void length_tensors(struct graph *g, const struct cuda_sdpa_key *k)
{
	int64_t dims[4];

	if (!k->padded)
		return;
	dims4(dims, k->b, 1, 1, 1);
	g->seq_q = tensor(g, CUDA_SDPA_SEQ_LEN_Q, CUDNN_DATA_INT32, dims, ONES, false, false, "seq_len_q");
	g->seq_kv = tensor(g, CUDA_SDPA_SEQ_LEN_KV, CUDNN_DATA_INT32, dims, ONES, false, false, "seq_len_kv");
}

/* The padding mask on scores x [B, H, Sq, Skv] (frontend: padding_mask):
 * keep (i, j) where i < seq_len_q[b] and j < seq_len_kv[b], else -inf. */
static cudnnBackendDescriptor_t padding_mask(struct graph *g, const struct cuda_sdpa_key *k, cudnnBackendDescriptor_t x,
					     const int64_t sd[4], const int64_t ss[4])
{
	if (!k->padded)
		return x;
	cudnnBackendDescriptor_t row = virt(g, CUDNN_DATA_INT32, sd, ss, "padding row index");
	pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, row, 2, "padding row index");
	cudnnBackendDescriptor_t col = virt(g, CUDNN_DATA_INT32, sd, ss, "padding column index");
	pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, col, 3, "padding column index");
	cudnnBackendDescriptor_t row_in = virt(g, CUDNN_DATA_BOOLEAN, sd, ss, "row < seq_len_q");
	pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, g->seq_q, NULL, row_in, 0, "row < seq_len_q");
	cudnnBackendDescriptor_t col_in = virt(g, CUDNN_DATA_BOOLEAN, sd, ss, "column < seq_len_kv");
	pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, g->seq_kv, NULL, col_in, 0, "column < seq_len_kv");
	cudnnBackendDescriptor_t inside = virt(g, CUDNN_DATA_BOOLEAN, sd, ss, "inside both lengths");
	pointwise(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_in, col_in, NULL, inside, 0,
		  "inside both lengths");
	cudnnBackendDescriptor_t ninf = scalar(g, CUDA_SDPA_PAD_NEG_INF, CUDNN_DATA_FLOAT, "padding -inf scalar");
	cudnnBackendDescriptor_t y = virt(g, CUDNN_DATA_FLOAT, sd, ss, "padded scores");
	pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, ninf, inside, y, 0, "padding select");
	return y;
}

/* The causal mask on scores x [B, H, Sq, Skv] (frontend: sliding_window_mask
 * with right bound 0, CompositeDiagonalBandMaskNode): keep (i, j) where
 * i >= j (top-left) or i + Skv - Sq >= j (bottom-right; with lengths,
 * i + seq_len_kv[b] - seq_len_q[b] >= j), else -inf. */
static cudnnBackendDescriptor_t causal_mask(struct graph *g, const struct cuda_sdpa_key *k, cudnnBackendDescriptor_t x,
					    const int64_t sd[4], const int64_t ss[4])
{
	if (k->mask == CUDA_SDPA_NO_MASK)
		return x;
	cudnnBackendDescriptor_t row = virt(g, CUDNN_DATA_INT32, sd, ss, "row index");
	pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, row, 2, "row index");
	cudnnBackendDescriptor_t col = virt(g, CUDNN_DATA_INT32, sd, ss, "column index");
	pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, col, 3, "column index");
	if (k->mask == CUDA_SDPA_CAUSAL_BOTTOM_RIGHT) {
		cudnnBackendDescriptor_t skv = k->padded ? g->seq_kv
							 : scalar(g, CUDA_SDPA_SEQ_KV, CUDNN_DATA_INT32, "Skv scalar");
		cudnnBackendDescriptor_t shifted = virt(g, CUDNN_DATA_INT32, sd, ss, "row + Skv");
		pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, row, skv, NULL, shifted, 0, "row + Skv");
		cudnnBackendDescriptor_t sq = k->padded ? g->seq_q : scalar(g, CUDA_SDPA_SEQ_Q, CUDNN_DATA_INT32, "Sq scalar");
		row = virt(g, CUDNN_DATA_INT32, sd, ss, "row + Skv - Sq");
		pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, shifted, sq, NULL, row, 0, "row + Skv - Sq");
	}
	cudnnBackendDescriptor_t keep_it = virt(g, CUDNN_DATA_BOOLEAN, sd, ss, "causal comparison");
	pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep_it, 0, "causal comparison");
	cudnnBackendDescriptor_t ninf = scalar(g, CUDA_SDPA_NEG_INF, CUDNN_DATA_FLOAT, "-inf scalar");
	cudnnBackendDescriptor_t y = virt(g, CUDNN_DATA_FLOAT, sd, ss, "masked scores");
	pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, ninf, keep_it, y, 0, "causal select");
	return y;
}

/* o = softmax(scale q k^T, masked) v; stats = max + log(sum exp(s - max)). */
static void build_forward(struct graph *g, const struct cuda_sdpa_key *k)
{
	const int64_t (*st)[4] = k->strides;
	int64_t qd[4], ktd[4], vd[4], od[4], sd[4], ss[4], rd[4], rs[4], kts[4], stats_s[4];

	dims4(qd, k->b, k->h, k->s_q, k->d);
	dims4(ktd, k->b, k->h_kv, k->d, k->s_kv);
	dims4(vd, k->b, k->h_kv, k->s_kv, k->d_v);
	dims4(od, k->b, k->h, k->s_q, k->d_v);
	dims4(sd, k->b, k->h, k->s_q, k->s_kv);
	packed(ss, sd);
	dims4(rd, k->b, k->h, k->s_q, 1);
	dims4(rs, k->h * k->s_q, k->s_q, 1, 1);
	swapped(kts, st[CUDA_SDPA_K]);

	cudnnBackendDescriptor_t q = tensor(g, CUDA_SDPA_Q, g->io, qd, st[CUDA_SDPA_Q], false, false, "q");
	cudnnBackendDescriptor_t kt = tensor(g, CUDA_SDPA_K, g->io, ktd, kts, false, false, "k");
	cudnnBackendDescriptor_t v = tensor(g, CUDA_SDPA_V, g->io, vd, st[CUDA_SDPA_V], false, false, "v");
	cudnnBackendDescriptor_t o = tensor(g, CUDA_SDPA_O, g->io, od, st[CUDA_SDPA_O], false, false, "o");
	cudnnBackendDescriptor_t scale = scalar(g, CUDA_SDPA_SCALE, CUDNN_DATA_FLOAT, "scale scalar");
	length_tensors(g, k);

	cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, sd, ss, "q k^T");
	matmul(g, q, kt, s, SEQ_Q, SEQ_KV, SEQ_NONE, "q k^T");
	cudnnBackendDescriptor_t scaled = virt(g, CUDNN_DATA_FLOAT, sd, ss, "scaled scores");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, NULL, scaled, 0, "scale");
	s = padding_mask(g, k, scaled, sd, ss);
	s = causal_mask(g, k, s, sd, ss);

	/* The frontend's composite softmax. */
	cudnnBackendDescriptor_t max = virt(g, CUDNN_DATA_FLOAT, rd, rs, "row max");
	reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, max, "row max");
	cudnnBackendDescriptor_t sub = virt(g, CUDNN_DATA_FLOAT, sd, ss, "s - max");
	pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s, max, NULL, sub, 0, "s - max");
	cudnnBackendDescriptor_t e = virt(g, CUDNN_DATA_FLOAT, sd, ss, "exp(s - max)");
	pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, e, 0, "exp(s - max)");
	cudnnBackendDescriptor_t sum = virt(g, CUDNN_DATA_FLOAT, rd, rs, "row sum");
	reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum, "row sum");
	/* Without a stats operand the frontend still computes them, into a
	 * virtual tensor (its softmax node always has a stats output): the
	 * fused engines do not recognise the graph otherwise. */
	cudnnBackendDescriptor_t log_sum = virt(g, CUDNN_DATA_FLOAT, rd, rs, "log(row sum)");
	pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, NULL, NULL, log_sum, 0, "log(row sum)");
	cudnnBackendDescriptor_t stats;
	if (k->stats) {
		dims4(stats_s, st[CUDA_SDPA_STATS][0], st[CUDA_SDPA_STATS][1], st[CUDA_SDPA_STATS][2], 1);
		stats = tensor(g, CUDA_SDPA_STATS, CUDNN_DATA_FLOAT, rd, stats_s, false, false, "stats");
	} else {
		stats = virt(g, CUDNN_DATA_FLOAT, rd, rs, "stats");
	}
	pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, NULL, stats, 0, "stats");
	/* The probabilities are what the second matmul reads: io type. */
	cudnnBackendDescriptor_t p = virt(g, g->io, sd, ss, "softmax");
	pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, NULL, p, 0, "softmax");
	matmul(g, p, v, o, SEQ_Q, SEQ_NONE, SEQ_KV, "p v");
}

/* dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)) * scale, dK = dS^T Q,
 * dQ = dS K, with P recomputed from the stats (frontend:
 * CompositeSDPABackwardNode, no dropout, no bias). For grouped-query
 * attention dK and dV are computed per query head and summed over each
 * group by a reduction. dQ goes through an f32 accumulator in the
 * workspace. */
static void build_backward(struct graph *g, const struct cuda_sdpa_key *k)
{
	const int64_t (*st)[4] = k->strides;
	int64_t qd[4], ktd[4], vtd[4], od[4], sd[4], ss[4], td[4], ts[4], rd[4], rs[4], kts[4], vts[4], stats_s[4];
	int64_t dod_s[4], kd[4], vd[4], acc_s[4];
	const int64_t b = k->b, h = k->h, sq = k->s_q, skv = k->s_kv;

	dims4(qd, b, h, sq, k->d);
	dims4(ktd, b, k->h_kv, k->d, skv);
	dims4(vtd, b, k->h_kv, k->d_v, skv);
	dims4(kd, b, k->h_kv, skv, k->d);
	dims4(vd, b, k->h_kv, skv, k->d_v);
	dims4(od, b, h, sq, k->d_v);
	dims4(sd, b, h, sq, skv);
	packed(ss, sd);
	dims4(td, b, h, skv, sq);                      /* transposed scores */
	dims4(ts, h * sq * skv, sq * skv, 1, skv);
	dims4(rd, b, h, sq, 1);
	dims4(rs, h * sq, sq, 1, 1);
	swapped(kts, st[CUDA_SDPA_K]);
	swapped(vts, st[CUDA_SDPA_V]);
	dims4(stats_s, st[CUDA_SDPA_STATS][0], st[CUDA_SDPA_STATS][1], st[CUDA_SDPA_STATS][2], 1);

	cudnnBackendDescriptor_t q = tensor(g, CUDA_SDPA_Q, g->io, qd, st[CUDA_SDPA_Q], false, false, "q");
	cudnnBackendDescriptor_t kt = tensor(g, CUDA_SDPA_K, g->io, ktd, kts, false, false, "k");
	cudnnBackendDescriptor_t vt = tensor(g, CUDA_SDPA_V, g->io, vtd, vts, false, false, "v");
	cudnnBackendDescriptor_t o = tensor(g, CUDA_SDPA_O, g->io, od, st[CUDA_SDPA_O], false, false, "o");
	cudnnBackendDescriptor_t d_o = tensor(g, CUDA_SDPA_DO, g->io, od, st[CUDA_SDPA_DO], false, false, "d_o");
	cudnnBackendDescriptor_t stats = tensor(g, CUDA_SDPA_STATS, CUDNN_DATA_FLOAT, rd, stats_s, false, false, "stats");
	cudnnBackendDescriptor_t dq = tensor(g, CUDA_SDPA_DQ, g->io, qd, st[CUDA_SDPA_DQ], false, false, "d_q");
	cudnnBackendDescriptor_t dk = tensor(g, CUDA_SDPA_DK, g->io, kd, st[CUDA_SDPA_DK], false, false, "d_k");
	cudnnBackendDescriptor_t dv = tensor(g, CUDA_SDPA_DV, g->io, vd, st[CUDA_SDPA_DV], false, false, "d_v");
	cudnnBackendDescriptor_t scale = scalar(g, CUDA_SDPA_SCALE, CUDNN_DATA_FLOAT, "scale scalar");
	cudnnBackendDescriptor_t one = scalar(g, CUDA_SDPA_ONE, CUDNN_DATA_FLOAT, "one scalar");
	length_tensors(g, k);

	/* softmax_sum = rowsum(dO * O), kept in the workspace. The product's
	 * strides are the frontend's (immaterial for a virtual tensor). */
	dims4(dod_s, h * sq * k->d_v, sq * k->d_v, h * k->d_v, 1);
	cudnnBackendDescriptor_t dodo = virt(g, CUDNN_DATA_FLOAT, od, dod_s, "d_o * o");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, o, NULL, dodo, 0, "d_o * o");
	cudnnBackendDescriptor_t rowsum = virt(g, CUDNN_DATA_FLOAT, rd, rs, "rowsum(d_o * o)");
	reduction(g, CUDNN_REDUCE_TENSOR_ADD, dodo, rowsum, "rowsum(d_o * o)");
	cudnnBackendDescriptor_t softmax_sum = tensor(g, CUDA_SDPA_SOFTMAX_SUM, CUDNN_DATA_FLOAT, rd, rs, false, false,
						      "softmax sum");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rowsum, one, NULL, softmax_sum, 0, "softmax sum");

	/* P = exp(scale q k^T - stats), masked (the padding before the stats
	 * come in, the causal diagonal after, as the frontend orders them). */
	cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, sd, ss, "q k^T");
	matmul(g, q, kt, s, SEQ_Q, SEQ_KV, SEQ_NONE, "q k^T");
	cudnnBackendDescriptor_t scaled = virt(g, CUDNN_DATA_FLOAT, sd, ss, "scaled scores");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, NULL, scaled, 0, "scale");
	scaled = padding_mask(g, k, scaled, sd, ss);
	cudnnBackendDescriptor_t shifted = virt(g, CUDNN_DATA_FLOAT, sd, ss, "s - stats");
	pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, stats, NULL, shifted, 0, "s - stats");
	s = causal_mask(g, k, shifted, sd, ss);
	cudnnBackendDescriptor_t p = virt(g, CUDNN_DATA_FLOAT, sd, ss, "p");
	pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, s, NULL, NULL, p, 0, "p");

	/* dV = P^T dO (per query head, then summed over each group). */
	cudnnBackendDescriptor_t pt = virt(g, g->io, td, ts, "p^T");
	reshape(g, p, pt, "p^T");
	grouped_matmul(g, k, pt, d_o, dv, k->d_v, "p^T d_o", "d_v per query head", "d_v group sum");

	/* dS = P * (dO V^T - softmax_sum) * scale. */
	cudnnBackendDescriptor_t dp = virt(g, CUDNN_DATA_FLOAT, sd, ss, "d_o v^T");
	matmul(g, d_o, vt, dp, SEQ_Q, SEQ_KV, SEQ_NONE, "d_o v^T");
	cudnnBackendDescriptor_t dp_sub = virt(g, CUDNN_DATA_FLOAT, sd, ss, "dp - softmax sum");
	pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, softmax_sum, NULL, dp_sub, 0, "dp - softmax sum");
	cudnnBackendDescriptor_t ds = virt(g, CUDNN_DATA_FLOAT, sd, ss, "ds");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_sub, p, NULL, ds, 0, "ds");
	cudnnBackendDescriptor_t ds_scaled = virt(g, CUDNN_DATA_FLOAT, sd, ss, "scaled ds");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds, scale, NULL, ds_scaled, 0, "scale ds");

	/* dK = dS^T Q (per query head, then summed over each group). */
	cudnnBackendDescriptor_t dst = virt(g, g->io, td, ts, "ds^T");
	reshape(g, ds_scaled, dst, "ds^T");
	grouped_matmul(g, k, dst, q, dk, k->d, "ds^T q", "d_k per query head", "d_k group sum");

	/* dQ = dS K through the f32 accumulator. K comes back from k^T by a
	 * reshape whose output the frontend leaves at the intermediate type. */
	cudnnBackendDescriptor_t kk = virt(g, CUDNN_DATA_FLOAT, kd, st[CUDA_SDPA_K], "k from k^T");
	reshape(g, kt, kk, "k from k^T");
	packed(acc_s, qd);
	cudnnBackendDescriptor_t acc = tensor(g, CUDA_SDPA_DQ_ACCUM, CUDNN_DATA_FLOAT, qd, acc_s, false, false,
					      "d_q accumulator");
	matmul(g, ds_scaled, kk, acc, SEQ_Q, SEQ_NONE, SEQ_KV, "ds k");
	pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, dq, 0, "d_q");
}

static size_t align_up(size_t n)
{
	return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

static int errno_of(cudnnStatus_t s)
{
	switch (CUDNN_STATUS_CATEGORY(s)) {
	case CUDNN_STATUS_BAD_PARAM:
	case CUDNN_STATUS_NOT_SUPPORTED:
		return -ENOTSUP;
	default:
		return s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
		       s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ? -ENOMEM : -EIO;
	}
}

/* Sets an attribute of d unless an earlier step failed: *s keeps the first
 * failure, so that a descriptor is made as a list of steps and checked
 * once at the end. */
static void set_if_ok(cudnnStatus_t *s, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
		      cudnnBackendAttributeType_t type, int64_t count, const void *value)
{
	if (*s == CUDNN_STATUS_SUCCESS)
		*s = cudnnBackendSetAttribute(d, name, type, count, value);
}

/* An engine configuration's engine and knob choices: the engine's global
 * index, and "engine 8 knobs 1=0,2=3" into text (empty if unreadable). */
static int64_t describe_config(cudnnBackendDescriptor_t cfg, char *text, size_t n)
{
	cudnnBackendDescriptor_t engine = NULL, knobs[32] = { 0 };
	int64_t index = -1, count = 0, nknobs = 0;
	size_t at = 0;

	if (text && n)
		text[0] = '\0';
	if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) == CUDNN_STATUS_SUCCESS &&
	    cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
				     &engine) == CUDNN_STATUS_SUCCESS)
		cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index);
	if (engine)
		cudnnBackendDestroyDescriptor(engine);
	if (!text || !n)
		return index;
	at += (size_t)snprintf(text + at, n - at, "engine %lld", (long long)index);
	for (int i = 0; i < 32; i++) {
		if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[i]) != CUDNN_STATUS_SUCCESS)
			goto out;
	}
	if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 32, &nknobs,
				     knobs) != CUDNN_STATUS_SUCCESS)
		goto out;
	for (int64_t i = 0; i < nknobs && i < 32 && at < n; i++) {
		cudnnBackendKnobType_t type = 0;
		int64_t value = 0;
		cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &count, &type);
		cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &count, &value);
		at += (size_t)snprintf(text + at, n - at, "%s%d=%lld", i ? "," : " knobs ", (int)type, (long long)value);
	}
out:
	for (int i = 0; i < 32; i++) {
		if (knobs[i])
			cudnnBackendDestroyDescriptor(knobs[i]);
	}
	return index;
}

/* Appends the engine configurations cuDNN's heuristics rank for the graph
 * in `mode` to *cfgs (*n of them so far). Those that fail cuDNN's support
 * checks are left out by cuDNN itself. */
static cudnnStatus_t heuristics(cudnnBackendDescriptor_t opgraph, cudnnBackendDescriptor_t devprop,
				cudnnBackendHeurMode_t mode, cudnnBackendDescriptor_t **cfgs, int64_t *n)
{
	cudnnBackendDescriptor_t heur = NULL;
	int64_t count = 0, got = 0, made = 0;
	cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);

	set_if_ok(&s, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opgraph);
	set_if_ok(&s, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
	if (devprop)
		set_if_ok(&s, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendFinalize(heur);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
					     NULL);
	if (s == CUDNN_STATUS_SUCCESS && count > 0) {
		cudnnBackendDescriptor_t *grown = realloc(*cfgs, (size_t)(*n + count) * sizeof(*grown));
		if (!grown) {
			s = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
			goto out;
		}
		*cfgs = grown;
		for (made = 0; made < count && s == CUDNN_STATUS_SUCCESS; made++) {
			grown[*n + made] = NULL;
			s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &grown[*n + made]);
		}
		if (s == CUDNN_STATUS_SUCCESS)
			s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
						     count, &got, grown + *n);
		if (s != CUDNN_STATUS_SUCCESS)
			got = 0;
		/* Those cuDNN did not fill are of no use. */
		for (int64_t i = got; i < made; i++) {
			if (grown[*n + i])
				cudnnBackendDestroyDescriptor(grown[*n + i]);
		}
		*n += got;
	}
out:
	if (heur)
		cudnnBackendDestroyDescriptor(heur);
	return s;
}

/* Configurations the heuristics do not rank, made by hand: for each engine
 * the first `offered` configurations name, every combination of its knobs'
 * values (on an H200, cuDNN 9.19's forward SDPA engines have KERNEL_CFG,
 * the backward ones STAGES and KERNEL_CFG), at most SWEEP_MAX per engine.
 * cuDNN refuses most combinations at once (the configuration does not
 * finalize), some when their plans are finalized, and the rest compile:
 * that is what autotuning times. Appended to *cfgs; each one's engine and
 * knob choice descriptors (which it refers to) go to aux[k - first], with
 * first the *n on entry. */
#define SWEEP_MAX 512
#define SWEEP_KNOBS 4
struct sweep {
	cudnnBackendDescriptor_t (*aux)[SWEEP_KNOBS + 1];   /* the engine, then the knob choices */
	int64_t first;
};

struct knob_range {
	cudnnBackendKnobType_t type;
	int64_t lo, hi, stride;
};

/* A finalized engine descriptor of engine `index` for opgraph, or NULL. */
static cudnnBackendDescriptor_t make_engine(cudnnBackendDescriptor_t opgraph, cudnnBackendDescriptor_t devprop,
					    int64_t index)
{
	cudnnBackendDescriptor_t e = NULL;
	cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e);

	set_if_ok(&s, e, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opgraph);
	set_if_ok(&s, e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
	if (devprop)
		set_if_ok(&s, e, CUDNN_ATTR_ENGINE_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendFinalize(e);
	if (s != CUDNN_STATUS_SUCCESS && e) {
		cudnnBackendDestroyDescriptor(e);
		e = NULL;
	}
	return e;
}

/* The engine's knobs and their ranges; how many (0 if unreadable or more
 * than SWEEP_KNOBS). */
static int knob_ranges(cudnnBackendDescriptor_t engine, struct knob_range *k)
{
	cudnnBackendDescriptor_t info[32] = { 0 };
	int64_t n = 0, count = 0;
	cudnnStatus_t s = CUDNN_STATUS_SUCCESS;

	for (int i = 0; i < 32 && s == CUDNN_STATUS_SUCCESS; i++)
		s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, &info[i]);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR, 32, &n,
					     info);
	if (s != CUDNN_STATUS_SUCCESS || n > SWEEP_KNOBS)
		n = 0;
	for (int64_t i = 0; i < n; i++) {
		k[i] = (struct knob_range){ 0, 0, -1, 1 };
		cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &count, &k[i].type);
		cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &count, &k[i].lo);
		cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &count, &k[i].hi);
		cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &count, &k[i].stride);
		if (k[i].stride < 1)
			k[i].stride = 1;
		if (k[i].hi < k[i].lo)
			n = 0;   /* a knob with no value: not sweepable */
	}
	for (int i = 0; i < 32; i++) {
		if (info[i])
			cudnnBackendDestroyDescriptor(info[i]);
	}
	return (int)n;
}

/* A finalized configuration of engine `index` with knobs[i] = values[i]
 * into aux (engine, knob choices) and *cfg; false when cuDNN refuses it. */
static bool make_config(cudnnBackendDescriptor_t opgraph, cudnnBackendDescriptor_t devprop, int64_t index,
			const struct knob_range *knobs, const int64_t *values, int nknobs,
			cudnnBackendDescriptor_t aux[SWEEP_KNOBS + 1], cudnnBackendDescriptor_t *cfg)
{
	cudnnStatus_t s = CUDNN_STATUS_SUCCESS;

	memset(aux, 0, (SWEEP_KNOBS + 1) * sizeof(aux[0]));
	*cfg = NULL;
	/* Every configuration its own engine descriptor: a configuration
	 * refers to its engine, and each goes its own way. */
	aux[0] = make_engine(opgraph, devprop, index);
	if (!aux[0])
		return false;
	for (int i = 0; i < nknobs && s == CUDNN_STATUS_SUCCESS; i++) {
		s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &aux[1 + i]);
		set_if_ok(&s, aux[1 + i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &knobs[i].type);
		set_if_ok(&s, aux[1 + i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &values[i]);
		if (s == CUDNN_STATUS_SUCCESS)
			s = cudnnBackendFinalize(aux[1 + i]);
	}
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, cfg);
	set_if_ok(&s, *cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &aux[0]);
	if (nknobs > 0)
		set_if_ok(&s, *cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, nknobs, &aux[1]);
	/* A combination the engine does not have for this problem is
	 * refused here, at once. */
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendFinalize(*cfg);
	if (s == CUDNN_STATUS_SUCCESS)
		return true;
	if (*cfg)
		cudnnBackendDestroyDescriptor(*cfg);
	*cfg = NULL;
	for (int i = SWEEP_KNOBS; i >= 0; i--) {
		if (aux[i])
			cudnnBackendDestroyDescriptor(aux[i]);
		aux[i] = NULL;
	}
	return false;
}

static void sweep_knobs(cudnnBackendDescriptor_t opgraph, cudnnBackendDescriptor_t devprop, int64_t offered,
			cudnnBackendDescriptor_t **cfgs, int64_t *n, struct sweep *sw)
{
	int64_t engines[CUDA_SDPA_CANDIDATES_MAX];
	int nengines = 0;

	sw->first = *n;
	for (int64_t i = 0; i < offered && nengines < CUDA_SDPA_CANDIDATES_MAX; i++) {
		int64_t e = (*cfgs)[i] ? describe_config((*cfgs)[i], NULL, 0) : -1;
		bool seen = e < 0;
		for (int j = 0; j < nengines && !seen; j++)
			seen = engines[j] == e;
		if (!seen)
			engines[nengines++] = e;
	}
	for (int j = 0; j < nengines; j++) {
		struct knob_range knobs[SWEEP_KNOBS];
		int64_t values[SWEEP_KNOBS];
		cudnnBackendDescriptor_t engine = make_engine(opgraph, devprop, engines[j]);
		int nknobs = engine ? knob_ranges(engine, knobs) : 0;

		if (engine)
			cudnnBackendDestroyDescriptor(engine);
		if (nknobs == 0)
			continue;
		for (int k = 0; k < nknobs; k++)
			values[k] = knobs[k].lo;
		/* Every combination, as an odometer: the last knob turns
		 * fastest. */
		for (int made = 0; made < SWEEP_MAX; made++) {
			cudnnBackendDescriptor_t aux[SWEEP_KNOBS + 1], cfg;
			if (make_config(opgraph, devprop, engines[j], knobs, values, nknobs, aux, &cfg)) {
				cudnnBackendDescriptor_t *grown = realloc(*cfgs, (size_t)(*n + 1) * sizeof(*grown));
				cudnnBackendDescriptor_t (*grown_aux)[SWEEP_KNOBS + 1] = NULL;
				if (grown) {
					*cfgs = grown;
					grown_aux = realloc(sw->aux, (size_t)(*n + 1 - sw->first) * sizeof(*grown_aux));
				}
				if (!grown_aux) {
					cudnnBackendDestroyDescriptor(cfg);
					for (int i = SWEEP_KNOBS; i >= 0; i--) {
						if (aux[i])
							cudnnBackendDestroyDescriptor(aux[i]);
					}
					return;
				}
				sw->aux = grown_aux;
				(*cfgs)[*n] = cfg;
				memcpy(sw->aux[*n - sw->first], aux, sizeof(aux));
				(*n)++;
			}
			int k = nknobs - 1;
			while (k >= 0 && (values[k] += knobs[k].stride) > knobs[k].hi) {
				values[k] = knobs[k].lo;
				k--;
			}
			if (k < 0)
				break;
		}
	}
}

/* Whether configuration i offers nothing an earlier one did not: the same
 * engine with the same knob choices. */
static bool repeated(cudnnBackendDescriptor_t *cfgs, int64_t i, char (*texts)[96])
{
	for (int64_t j = 0; j < i; j++) {
		if (cfgs[j] && strcmp(texts[j], texts[i]) == 0)
			return true;
	}
	return false;
}

/* Finalizes an execution plan of configuration cfg; NULL (and *s, with
 * the reason in why) when this engine does not take the problem. */
static cudnnBackendDescriptor_t finalize_plan(cudnnBackendDescriptor_t cfg, cudnnHandle_t handle,
					      cudnnBackendDescriptor_t devprop, cudnnStatus_t *s, char *why,
					      size_t why_len)
{
	cudnnBackendDescriptor_t plan = NULL;

	*s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
	set_if_ok(s, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
	if (handle)
		set_if_ok(s, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
	else
		set_if_ok(s, plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
	if (*s == CUDNN_STATUS_SUCCESS)
		*s = cudnnBackendFinalize(plan);
	if (*s != CUDNN_STATUS_SUCCESS) {
		last_reason(why, why_len);
		if (plan)
			cudnnBackendDestroyDescriptor(plan);
		return NULL;
	}
	return plan;
}

/* The engine configurations offered for a graph, in order: mode A's
 * ranking; with `more`, mode B's and the knob sweep's after it. Repeats
 * are dropped (NULL, as are those taken into a plan). */
struct configs {
	cudnnBackendDescriptor_t *cfgs;
	char (*texts)[96];
	struct sweep sw;
	int64_t n;
	int offered;                 /* distinct */
};

static void configs_free(struct configs *l)
{
	for (int64_t i = 0; i < l->n; i++) {
		if (l->cfgs[i])
			cudnnBackendDestroyDescriptor(l->cfgs[i]);
		/* After the configuration that refers to them. */
		for (int j = 0; i >= l->sw.first && l->sw.aux && j <= SWEEP_KNOBS; j++) {
			if (l->sw.aux[i - l->sw.first][j])
				cudnnBackendDestroyDescriptor(l->sw.aux[i - l->sw.first][j]);
		}
	}
	free(l->cfgs);
	free(l->sw.aux);
	free(l->texts);
	memset(l, 0, sizeof(*l));
}

/* Fills l (zeroed) for opgraph; on failure g's status says why. */
static void configs_list(struct graph *g, cudnnBackendDescriptor_t opgraph, cudnnBackendDescriptor_t devprop, bool more,
			 struct configs *l)
{
	cudnnStatus_t s;

	if (g->status)
		return;
	s = heuristics(opgraph, devprop, CUDNN_HEUR_MODE_A, &l->cfgs, &l->n);
	if (s != CUDNN_STATUS_SUCCESS) {
		fail(g, s, "asking cuDNN's heuristics for an engine for this attention");
		return;
	}
	if (more) {
		int64_t ranked;
		heuristics(opgraph, devprop, CUDNN_HEUR_MODE_B, &l->cfgs, &l->n);   /* more to offer, if it can */
		ranked = l->n;
		sweep_knobs(opgraph, devprop, ranked, &l->cfgs, &l->n, &l->sw);
	} else {
		l->sw.first = l->n;
	}
	if (l->n == 0) {
		/* Every result failed cuDNN's support checks: their reasons are
		 * in the last error string. */
		fail(g, CUDNN_STATUS_NOT_SUPPORTED, "cuDNN has no engine for this attention");
		return;
	}
	l->texts = calloc((size_t)l->n, sizeof(*l->texts));
	if (!l->texts) {
		fail(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "no memory for engine configurations");
		return;
	}
	for (int64_t i = 0; i < l->n; i++) {
		describe_config(l->cfgs[i], l->texts[i], sizeof(l->texts[i]));
		if (repeated(l->cfgs, i, l->texts)) {
			cudnnBackendDestroyDescriptor(l->cfgs[i]);
			l->cfgs[i] = NULL;
		} else {
			l->offered++;
		}
	}
}

/* Configuration i into the plan's candidates, its descriptors into the
 * plan's keeping. false (and g failed) when that could not be done. */
static bool take_candidate(struct graph *g, struct configs *l, int64_t i, cudnnBackendDescriptor_t plan)
{
	struct cuda_sdpa_plan *p = g->plan;
	int64_t ws = 0, count = 0;
	cudnnBackendDescriptor_t cfg = l->cfgs[i];

	if (!keep(g, plan))
		return false;   /* keep() destroyed it */
	l->cfgs[i] = NULL;
	if (!keep(g, cfg))
		return false;
	/* A swept configuration's engine and knob choices go with it. */
	if (i >= l->sw.first) {
		cudnnBackendDescriptor_t *aux = l->sw.aux[i - l->sw.first];
		bool kept = true;
		for (int j = 0; j <= SWEEP_KNOBS; j++) {
			if (aux[j])
				kept = keep(g, aux[j]) && kept;
			aux[j] = NULL;
		}
		if (!kept)
			return false;
	}
	struct cuda_sdpa_candidate *c = &p->candidate[p->ncandidates++];
	c->plan = plan;
	c->cfg = cfg;
	c->index = (int)i;
	c->engine = describe_config(cfg, NULL, 0);
	snprintf(c->knobs, sizeof(c->knobs), "%s", l->texts[i]);
	cudnnStatus_t s = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
						   &count, &ws);
	if (s != CUDNN_STATUS_SUCCESS) {
		fail(g, s, "reading the plan's workspace size");
		return false;
	}
	c->cudnn_workspace = ws > 0 ? (size_t)ws : 0;
	return true;
}

/* Execution plans of the first `want` configurations that finalize, from
 * the start-th on. Mode A is what the frontend's SDPA samples and PyTorch
 * use, and its first configuration that finalizes is the plan when only
 * one is wanted; to offer more to time (autotuning), mode B's ranking is
 * appended, then the knob sweep's (sweep_knobs), less what came before.
 * The list is the same for the same problem on the same device and cuDNN,
 * so a place in it names a configuration; a remembered start that no
 * longer finalizes falls back to the list's beginning. */
static void choose_plan(struct graph *g, cudnnBackendDescriptor_t opgraph, cudnnHandle_t handle,
			cudnnBackendDescriptor_t devprop, int start, unsigned want)
{
	struct cuda_sdpa_plan *p = g->plan;
	struct configs l = { 0 };
	cudnnStatus_t s, last = CUDNN_STATUS_NOT_SUPPORTED;
	char last_why[384] = "";

	configs_list(g, opgraph, devprop, want > 1 || start > 0, &l);
	if (g->status)
		goto out;
	p->heuristic_results = l.offered;
	if (want < 1)
		want = 1;
	if (want > CUDA_SDPA_CANDIDATES_MAX)
		want = CUDA_SDPA_CANDIDATES_MAX;
	if (start < 0 || start >= l.n)
		start = 0;
	for (int pass = 0; pass < 2 && p->ncandidates == 0; pass++) {
		int64_t from = pass ? 0 : start, to = pass ? start : l.n;
		for (int64_t i = from; i < to && p->ncandidates < want; i++) {
			if (!l.cfgs[i])
				continue;
			cudnnBackendDescriptor_t plan = finalize_plan(l.cfgs[i], handle, devprop, &s, last_why,
								      sizeof(last_why));
			if (!plan) {
				/* This engine does not take the problem after
				 * all: the next one may. Keep the reason for
				 * when none does. */
				last = s;
				continue;
			}
			if (!take_candidate(g, &l, i, plan))
				goto out;
		}
	}
	if (p->ncandidates == 0) {
		g->status = last;
		if (g->why && g->why_len)
			snprintf(g->why, g->why_len, "none of cuDNN's %d engines for this attention takes it: %s%s%s%s",
				 l.offered, cudnnGetErrorString(last), last_why[0] ? " (" : "", last_why,
				 last_why[0] ? ")" : "");
	}
out:
	configs_free(&l);
}

/* The chosen candidate's engine and workspace become the plan's; while
 * several remain, the workspace fits the largest. */
static void settle(struct cuda_sdpa_plan *plan)
{
	size_t most = 0;

	for (unsigned i = 0; i < plan->ncandidates; i++) {
		if (plan->candidate[i].cudnn_workspace > most)
			most = plan->candidate[i].cudnn_workspace;
	}
	plan->plan = plan->candidate[plan->chosen].plan;
	plan->engine = plan->candidate[plan->chosen].engine;
	plan->cudnn_workspace = most;
	plan->workspace = plan->cudnn_offset + most;
}

/* The key's operation graph, its descriptors kept by g's plan. */
static cudnnBackendDescriptor_t operation_graph(struct graph *g, const struct cuda_sdpa_key *key, cudnnHandle_t handle)
{
	if (key->backward)
		build_backward(g, key);
	else
		build_forward(g, key);

	cudnnBackendDescriptor_t opgraph = create(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
	set(g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "operation graph");
	if (handle)
		set(g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
	finalize(g, opgraph, "attention graph");
	return opgraph;
}

int cuda_sdpa_configurations(const struct cuda_sdpa_key *key, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
			     bool more, char (*texts)[96], int max, char *why, size_t why_len)
{
	struct cuda_sdpa_plan scratch;
	struct graph g = { .plan = &scratch, .next_uid = 1000, .io = (cudnnDataType_t)key->dtype, .why = why,
			   .why_len = why_len };
	struct configs l = { 0 };
	int r = 0;

	memset(&scratch, 0, sizeof(scratch));
	if (why && why_len)
		why[0] = '\0';
	cudnnBackendDescriptor_t opgraph = operation_graph(&g, key, handle);
	configs_list(&g, opgraph, devprop, more, &l);
	for (int64_t i = 0; !g.status && i < l.n; i++) {
		if (l.cfgs[i] && r++ < max)
			snprintf(texts[r - 1], sizeof(texts[0]), "%s", l.texts[i]);
	}
	if (g.status)
		r = errno_of(g.status);
	configs_free(&l);
	cuda_sdpa_plan_destroy(&scratch);
	return r;
}

int cuda_sdpa_plan_build(const struct cuda_sdpa_key *key, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
			 int start, unsigned candidates, struct cuda_sdpa_plan *plan, char *why, size_t why_len)
{
	struct graph g = { .plan = plan, .next_uid = 1000, .io = (cudnnDataType_t)key->dtype, .why = why,
			   .why_len = why_len };

	memset(plan, 0, sizeof(*plan));
	if (why && why_len)
		why[0] = '\0';
	plan->backward = key->backward != 0;
	plan->masked = key->mask != CUDA_SDPA_NO_MASK;
	plan->bottom_right = key->mask == CUDA_SDPA_CAUSAL_BOTTOM_RIGHT;
	plan->padded = key->padded != 0;
	plan->s_q = (int32_t)key->s_q;
	plan->s_kv = (int32_t)key->s_kv;
	plan->batch = key->b;
	cudnnBackendDescriptor_t opgraph = operation_graph(&g, key, handle);
	choose_plan(&g, opgraph, handle, devprop, start, candidates);
	if (g.status)
		goto fail;

	size_t off = 0;
	if (key->padded) {
		plan->seq_len_q_offset = off;
		off += align_up((size_t)key->b * sizeof(int32_t));
		plan->seq_len_kv_offset = off;
		off += align_up((size_t)key->b * sizeof(int32_t));
	}
	if (key->backward) {
		plan->softmax_sum_offset = off;
		off += align_up((size_t)(key->b * key->h * key->s_q) * sizeof(float));
		plan->dq_accum_offset = off;
		off += align_up((size_t)(key->b * key->h * key->s_q * key->d) * sizeof(float));
	}
	plan->cudnn_offset = off;
	settle(plan);
	return 0;

fail:;
	int r = errno_of(g.status);
	cuda_sdpa_plan_destroy(plan);
	return r;
}

/* Destroys one descriptor the plan holds and forgets it. */
static void drop(struct cuda_sdpa_plan *plan, cudnnBackendDescriptor_t d)
{
	for (unsigned i = 0; d && i < plan->ndescs; i++) {
		if (plan->descs[i] == d) {
			cudnnBackendDestroyDescriptor(d);
			plan->descs[i] = NULL;
			return;
		}
	}
}

void cuda_sdpa_plan_keep(struct cuda_sdpa_plan *plan, unsigned i)
{
	if (i >= plan->ncandidates)
		return;
	for (unsigned j = 0; j < plan->ncandidates; j++) {
		if (j != i) {
			drop(plan, plan->candidate[j].plan);
			drop(plan, plan->candidate[j].cfg);
		}
	}
	plan->candidate[0] = plan->candidate[i];
	memset(&plan->candidate[1], 0, sizeof(plan->candidate) - sizeof(plan->candidate[0]));
	plan->ncandidates = 1;
	plan->chosen = 0;
	/* Not settle(): the workspace stays the largest candidate's. */
	plan->plan = plan->candidate[0].plan;
	plan->engine = plan->candidate[0].engine;
}

void cuda_sdpa_plan_destroy(struct cuda_sdpa_plan *plan)
{
	if (!plan)
		return;
	/* The plans first, then what they were built from, newest first. */
	if (plan->descs) {
		for (unsigned i = plan->ndescs; i-- > 0;) {
			if (plan->descs[i])
				cudnnBackendDestroyDescriptor(plan->descs[i]);
		}
	}
	free(plan->descs);
	memset(plan, 0, sizeof(*plan));
}

/* What cuDNN does with a plan and its variant pack. */
enum sdpa_action { SDPA_EXECUTE, SDPA_POPULATE_GRAPH, SDPA_UPDATE_GRAPH };

/* The plan's variant pack for ptr[] and workspace, handed to cuDNN as
 * `action` says (graph: the native CUDA graph's, else unused). */
static cudnnStatus_t with_pack(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan, unsigned which,
			       void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace,
			       enum sdpa_action action, cudaGraph_t graph, char *why, size_t why_len)
{
	int64_t uids[CUDA_SDPA_UID_COUNT];
	void *data[CUDA_SDPA_UID_COUNT];
	unsigned n = 0;
	float neg_inf = -INFINITY, one = 1.0f;
	int32_t s_q = plan->s_q, s_kv = plan->s_kv;
	char *ws = workspace;
	cudnnBackendDescriptor_t pack = NULL;
	cudnnBackendDescriptor_t run = which < plan->ncandidates ? plan->candidate[which].plan : plan->plan;
	cudnnStatus_t s;

	for (int uid = CUDA_SDPA_Q; uid <= CUDA_SDPA_DV; uid++) {
		if (ptr[uid]) {
			uids[n] = uid;
			data[n++] = ptr[uid];
		}
	}
	uids[n] = CUDA_SDPA_SCALE;
	data[n++] = &scale;
	/* Only the graph's own tensors: cuDNN refuses ids it does not know. */
	if (plan->bottom_right && !plan->padded) {
		uids[n] = CUDA_SDPA_SEQ_Q;
		data[n++] = &s_q;
		uids[n] = CUDA_SDPA_SEQ_KV;
		data[n++] = &s_kv;
	}
	if (plan->padded) {
		uids[n] = CUDA_SDPA_SEQ_LEN_Q;
		data[n++] = ws + plan->seq_len_q_offset;
		uids[n] = CUDA_SDPA_SEQ_LEN_KV;
		data[n++] = ws + plan->seq_len_kv_offset;
		uids[n] = CUDA_SDPA_PAD_NEG_INF;
		data[n++] = &neg_inf;
	}
	if (plan->backward) {
		uids[n] = CUDA_SDPA_ONE;
		data[n++] = &one;
		uids[n] = CUDA_SDPA_SOFTMAX_SUM;
		data[n++] = ws + plan->softmax_sum_offset;
		uids[n] = CUDA_SDPA_DQ_ACCUM;
		data[n++] = ws + plan->dq_accum_offset;
	}
	if (plan->masked) {
		uids[n] = CUDA_SDPA_NEG_INF;
		data[n++] = &neg_inf;
	}
	void *cudnn_ws = plan->cudnn_workspace ? ws + plan->cudnn_offset : NULL;

	s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
	set_if_ok(&s, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
	set_if_ok(&s, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data);
	set_if_ok(&s, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cudnn_ws);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendFinalize(pack);
	if (s == CUDNN_STATUS_SUCCESS) {
		switch (action) {
		case SDPA_EXECUTE:
			s = cudnnBackendExecute(handle, run, pack);
			break;
		case SDPA_POPULATE_GRAPH:
			s = cudnnBackendPopulateCudaGraph(handle, run, pack, graph);
			break;
		case SDPA_UPDATE_GRAPH:
			s = cudnnBackendUpdateCudaGraph(handle, run, pack, graph);
			break;
		}
	}
	if (s != CUDNN_STATUS_SUCCESS && why && why_len) {
		char detail[384];
		last_reason(detail, sizeof(detail));
		snprintf(why, why_len, "%s%s%s%s", cudnnGetErrorString(s), detail[0] ? " (" : "", detail,
			 detail[0] ? ")" : "");
	}
	if (pack)
		cudnnBackendDestroyDescriptor(pack);
	return s;
}

cudnnStatus_t cuda_sdpa_execute(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan, unsigned which,
				void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace, char *why,
				size_t why_len)
{
	return with_pack(handle, plan, which, ptr, scale, workspace, SDPA_EXECUTE, NULL, why, why_len);
}

cudnnStatus_t cuda_sdpa_graph(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan,
			      void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace, cudaGraph_t graph,
			      bool update, char *why, size_t why_len)
{
	return with_pack(handle, plan, plan->chosen, ptr, scale, workspace,
			 update ? SDPA_UPDATE_GRAPH : SDPA_POPULATE_GRAPH, graph, why, why_len);
}

bool cuda_sdpa_graph_native(const struct cuda_sdpa_plan *plan)
{
	cudnnBackendDescriptor_t cfg = plan->chosen < plan->ncandidates ? plan->candidate[plan->chosen].cfg : NULL;
	cudnnBackendDescriptor_t engine = NULL;
	cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
	int64_t n = 0;
	bool native = false;

	if (!cfg || cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS)
		return false;
	if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
				     &engine) == CUDNN_STATUS_SUCCESS &&
	    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
				     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS)
		for (int64_t i = 0; i < n; i++)
			native |= notes[i] == CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API;
	cudnnBackendDestroyDescriptor(engine);
	return native;
}
