/* The SDPA graphs of cudnn_graph.h, op for op as cudnn-frontend (1.x, for
 * cuDNN 9.19) builds them in its CompositeSDPANode and
 * CompositeSDPABackwardNode: the fused engines match on this shape, data
 * types and all, so where the frontend does something odd (a virtual
 * tensor's strides, an f32 reshape of a bf16 tensor) this file does the
 * same and says so.
 *
 * The frontend's context for these graphs: io data type bf16 or f16,
 * intermediate (virtual tensors) f32, compute f32; by-value scalars are 4-d
 * [1, 1, 1, 1]; every tensor declares 16-byte alignment. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/backend/cuda/cudnn_graph.h"

/* Operations in the largest graph (backward, bottom-right mask, GQA): 30. */
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

/* c = a @ b over the last two dimensions, batched (and broadcast: k and v
 * have Hkv heads against q's H) over the first two. */
static void matmul(struct graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
		   const char *what)
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
 * group of H / Hkv query heads by a reduction. */
static void grouped_matmul(struct graph *g, const struct cuda_sdpa_key *k, cudnnBackendDescriptor_t a,
			   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out, int64_t d, const char *what,
			   const char *per_head, const char *group_sum)
{
	int64_t full[4], full_s[4];

	if (k->h == k->h_kv) {
		matmul(g, a, b, out, what);
		return;
	}
	dims4(full, k->b, k->h, k->s_kv, d);
	packed(full_s, full);
	cudnnBackendDescriptor_t per_query_head = virt(g, g->io, full, full_s, per_head);
	matmul(g, a, b, per_query_head, what);
	reduction(g, CUDNN_REDUCE_TENSOR_ADD, per_query_head, out, group_sum);
}

/* The operand's strides with the last two dimensions swapped: k and v as
 * the transposes the matmuls read them as. */
static void swapped(int64_t out[4], const int64_t s[4])
{
	dims4(out, s[0], s[1], s[3], s[2]);
}

/* ---- Graphs --------------------------------------------------------------- */

/* The causal mask on scores x [B, H, Sq, Skv] (frontend: sliding_window_mask
 * with right bound 0, CompositeDiagonalBandMaskNode): keep (i, j) where
 * i >= j (top-left) or i + Skv - Sq >= j (bottom-right), else -inf. */
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
		cudnnBackendDescriptor_t skv = scalar(g, CUDA_SDPA_SEQ_KV, CUDNN_DATA_INT32, "Skv scalar");
		cudnnBackendDescriptor_t shifted = virt(g, CUDNN_DATA_INT32, sd, ss, "row + Skv");
		pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, row, skv, NULL, shifted, 0, "row + Skv");
		cudnnBackendDescriptor_t sq = scalar(g, CUDA_SDPA_SEQ_Q, CUDNN_DATA_INT32, "Sq scalar");
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

	cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, sd, ss, "q k^T");
	matmul(g, q, kt, s, "q k^T");
	cudnnBackendDescriptor_t scaled = virt(g, CUDNN_DATA_FLOAT, sd, ss, "scaled scores");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, NULL, scaled, 0, "scale");
	s = causal_mask(g, k, scaled, sd, ss);

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
	matmul(g, p, v, o, "p v");
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

	/* P = exp(scale q k^T - stats), masked. */
	cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, sd, ss, "q k^T");
	matmul(g, q, kt, s, "q k^T");
	cudnnBackendDescriptor_t scaled = virt(g, CUDNN_DATA_FLOAT, sd, ss, "scaled scores");
	pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, NULL, scaled, 0, "scale");
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
	matmul(g, d_o, vt, dp, "d_o v^T");
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
	matmul(g, ds_scaled, kk, acc, "ds k");
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

/* Heuristics (mode A, what the frontend's SDPA samples and PyTorch use),
 * then the first engine configuration that finalizes into a plan. */
static void choose_plan(struct graph *g, cudnnBackendDescriptor_t opgraph, cudnnHandle_t handle,
			cudnnBackendDescriptor_t devprop)
{
	struct cuda_sdpa_plan *p = g->plan;
	cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
	cudnnBackendDescriptor_t *cfgs = NULL;
	int64_t n = 0, got = 0;
	cudnnStatus_t s, last = CUDNN_STATUS_NOT_SUPPORTED;
	char last_why[384] = "";

	cudnnBackendDescriptor_t heur = create(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
	set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opgraph, "heuristics");
	set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
	if (devprop)
		set(g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop, "heuristics");
	finalize(g, heur, "heuristics query");
	if (g->status)
		return;
	s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL);
	if (s != CUDNN_STATUS_SUCCESS) {
		fail(g, s, "counting cuDNN's engines for this attention");
		return;
	}
	if (n <= 0) {
		fail(g, CUDNN_STATUS_NOT_SUPPORTED, "cuDNN's heuristics found no engine for this attention");
		return;
	}
	cfgs = calloc((size_t)n, sizeof(*cfgs));
	if (!cfgs) {
		fail(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "no memory for engine configurations");
		return;
	}
	for (got = 0; got < n; got++) {
		s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[got]);
		if (s != CUDNN_STATUS_SUCCESS) {
			fail(g, s, "creating an engine configuration descriptor");
			goto out;
		}
	}
	s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs);
	if (s != CUDNN_STATUS_SUCCESS) {
		got = n;
		fail(g, s, "reading cuDNN's engine configurations");
		goto out;
	}
	if (got == 0) {
		/* Every result failed cuDNN's support checks: their reasons are
		 * in the last error string. */
		fail(g, CUDNN_STATUS_NOT_SUPPORTED, "cuDNN has no engine for this attention");
		got = n;
		goto out;
	}
	for (int64_t i = 0; i < got && !p->plan; i++) {
		cudnnBackendDescriptor_t plan = NULL;
		s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
		if (s == CUDNN_STATUS_SUCCESS)
			s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
						     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
		if (s == CUDNN_STATUS_SUCCESS)
			s = handle ? cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
							      &handle)
				   : cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
							      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
		if (s == CUDNN_STATUS_SUCCESS)
			s = cudnnBackendFinalize(plan);
		if (s != CUDNN_STATUS_SUCCESS) {
			/* This engine does not take the problem after all: the
			 * next one may. Keep the reason for when none does. */
			last = s;
			last_reason(last_why, sizeof(last_why));
			if (plan)
				cudnnBackendDestroyDescriptor(plan);
			continue;
		}
		if (!keep(g, plan) || !keep(g, cfgs[i])) {
			/* keep() destroyed what it could not hold. */
			p->plan = NULL;
			cfgs[i] = NULL;
			goto out;
		}
		p->plan = plan;
		cfgs[i] = NULL;
	}
	if (!p->plan) {
		g->status = last;
		if (g->why && g->why_len)
			snprintf(g->why, g->why_len, "none of cuDNN's %lld engines for this attention takes it: %s%s%s%s",
				 (long long)got, cudnnGetErrorString(last), last_why[0] ? " (" : "", last_why,
				 last_why[0] ? ")" : "");
	}
out:
	for (int64_t i = 0; i < n; i++) {
		if (cfgs[i])
			cudnnBackendDestroyDescriptor(cfgs[i]);
	}
	free(cfgs);
}

int cuda_sdpa_plan_build(const struct cuda_sdpa_key *key, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
			 struct cuda_sdpa_plan *plan, char *why, size_t why_len)
{
	struct graph g = { .plan = plan, .next_uid = 1000, .io = (cudnnDataType_t)key->dtype, .why = why,
			   .why_len = why_len };

	memset(plan, 0, sizeof(*plan));
	if (why && why_len)
		why[0] = '\0';
	plan->backward = key->backward != 0;
	plan->masked = key->mask != CUDA_SDPA_NO_MASK;
	plan->bottom_right = key->mask == CUDA_SDPA_CAUSAL_BOTTOM_RIGHT;
	plan->s_q = (int32_t)key->s_q;
	plan->s_kv = (int32_t)key->s_kv;
	if (key->backward)
		build_backward(&g, key);
	else
		build_forward(&g, key);

	cudnnBackendDescriptor_t opgraph = create(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
	set(&g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops, "operation graph");
	if (handle)
		set(&g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
	finalize(&g, opgraph, "attention graph");
	if (!g.status)
		choose_plan(&g, opgraph, handle, devprop);
	if (g.status)
		goto fail;

	int64_t ws = 0, count = 0;
	cudnnStatus_t s = cudnnBackendGetAttribute(plan->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
						   1, &count, &ws);
	if (s != CUDNN_STATUS_SUCCESS) {
		fail(&g, s, "reading the plan's workspace size");
		goto fail;
	}
	plan->cudnn_workspace = ws > 0 ? (size_t)ws : 0;

	/* The chosen engine's index, for logs and tests; not worth failing over. */
	plan->engine = -1;
	cudnnBackendDescriptor_t cfg = NULL, engine = NULL;
	if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg) == CUDNN_STATUS_SUCCESS &&
	    cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) == CUDNN_STATUS_SUCCESS &&
	    cudnnBackendGetAttribute(plan->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
				     &count, &cfg) == CUDNN_STATUS_SUCCESS &&
	    cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
				     &engine) == CUDNN_STATUS_SUCCESS) {
		cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &plan->engine);
	}
	if (engine)
		cudnnBackendDestroyDescriptor(engine);
	if (cfg)
		cudnnBackendDestroyDescriptor(cfg);

	size_t off = 0;
	if (key->backward) {
		plan->softmax_sum_offset = off;
		off += align_up((size_t)(key->b * key->h * key->s_q) * sizeof(float));
		plan->dq_accum_offset = off;
		off += align_up((size_t)(key->b * key->h * key->s_q * key->d) * sizeof(float));
	}
	plan->cudnn_offset = off;
	plan->workspace = off + plan->cudnn_workspace;
	return 0;

fail:;
	int r = errno_of(g.status);
	cuda_sdpa_plan_destroy(plan);
	return r;
}

void cuda_sdpa_plan_destroy(struct cuda_sdpa_plan *plan)
{
	if (!plan)
		return;
	/* The plan first, then what it was built from, newest first. */
	if (plan->descs) {
		for (unsigned i = plan->ndescs; i-- > 0;)
			cudnnBackendDestroyDescriptor(plan->descs[i]);
	}
	free(plan->descs);
	memset(plan, 0, sizeof(*plan));
}

cudnnStatus_t cuda_sdpa_execute(cudnnHandle_t handle, const struct cuda_sdpa_plan *plan,
				void *const ptr[CUDA_SDPA_OPERANDS], float scale, void *workspace, char *why,
				size_t why_len)
{
	int64_t uids[CUDA_SDPA_UID_COUNT];
	void *data[CUDA_SDPA_UID_COUNT];
	unsigned n = 0;
	float neg_inf = -INFINITY, one = 1.0f;
	int32_t s_q = plan->s_q, s_kv = plan->s_kv;
	char *ws = workspace;
	cudnnBackendDescriptor_t pack = NULL;
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
	if (plan->bottom_right) {
		uids[n] = CUDA_SDPA_SEQ_Q;
		data[n++] = &s_q;
		uids[n] = CUDA_SDPA_SEQ_KV;
		data[n++] = &s_kv;
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
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cudnn_ws);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendFinalize(pack);
	if (s == CUDNN_STATUS_SUCCESS)
		s = cudnnBackendExecute(handle, plan->plan, pack);
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
