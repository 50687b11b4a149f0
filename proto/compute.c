/* SPDX-License-Identifier: Apache-2.0 */
/* The table machinery of io.regen.Compute: what every operation's call
 * goes through, driven by its struct rp_op_spec. The checks that belong to
 * one operation alone live beside its table (compute_gemm.c,
 * compute_attention.c, compute_layernorm.c, compute_fp8.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "compute.h"
#include "compute_check.h"
#include "errors.h"

#define FIELDS_MAX (RP_OP_OPERANDS_MAX + 16 + RP_COMPUTE_COMMON_FIELDS + 1)

/* Parameters every operation takes besides its operands and scalars. */
const struct rp_field rp_compute_common_fields[RP_COMPUTE_COMMON_FIELDS + 1] = {
	{ "wait_event", RP_T_STRING, false },
	{ "signal_event", RP_T_STRING, false },
	{ "deadline_ms", RP_T_INT, false },
	{ NULL, 0, false },
};

static const struct rp_op_spec *const ops[RP_OP_COUNT] = {
	[RP_OP_GEMM] = &rp_op_gemm,
	[RP_OP_ATTENTION] = &rp_op_attention,
	[RP_OP_ATTENTION_BACKWARD] = &rp_op_attention_backward,
	[RP_OP_LAYER_NORM] = &rp_op_layer_norm,
	[RP_OP_LAYER_NORM_BACKWARD] = &rp_op_layer_norm_backward,
	[RP_OP_QUANTIZE] = &rp_op_quantize,
	[RP_OP_TRANSPOSE_QUANTIZE] = &rp_op_transpose_quantize,
	[RP_OP_SCALE_UPDATE] = &rp_op_scale_update,
};

const struct rp_op_spec *rp_op_get(enum rp_op_id id)
{
	return (unsigned)id < RP_OP_COUNT ? ops[id] : NULL;
}

const struct rp_op_spec *rp_op_find(const char *method)
{
	for (int i = 0; i < RP_OP_COUNT; i++) {
		if (method && strcmp(ops[i]->method, method) == 0) {
			return ops[i];
		}
	}
	return NULL;
}

int rp_op_slot(const struct rp_op_spec *spec, const char *name)
{
	for (unsigned i = 0; i < spec->noperands; i++) {
		if (strcmp(spec->operands[i].name, name) == 0) {
			return (int)i;
		}
	}
	return RP_NO_SLOT;
}

struct rp_shape_text rp_shape_fmt(int rank, const int64_t *dims)
{
	struct rp_shape_text t;
	size_t n = 0;

	n += (size_t)snprintf(t.s + n, sizeof(t.s) - n, "[");
	for (int i = 0; i < rank && n < sizeof(t.s); i++) {
		n += (size_t)snprintf(t.s + n, sizeof(t.s) - n, "%s%" PRId64, i ? ", " : "", dims[i]);
	}
	if (n < sizeof(t.s)) {
		snprintf(t.s + n, sizeof(t.s) - n, "]");
	}
	return t;
}

bool rp_operand_shape_is(const struct rp_operand *op, int rank, const int64_t *dims)
{
	if (op->rank != rank) {
		return false;
	}
	for (int i = 0; i < rank; i++) {
		if (op->shape[i] != dims[i]) {
			return false;
		}
	}
	return true;
}

static bool same_buffer(const struct rp_operand *x, const struct rp_operand *y)
{
	return x->buffer.kind == y->buffer.kind && x->buffer.device == y->buffer.device &&
	       x->buffer.generation == y->buffer.generation && x->buffer.serial == y->buffer.serial;
}

/* The same tensor: same bytes, same element order. Only then may an output
 * read and write one place element by element (a GEMM's C as its D). */
static bool same_tensor(const struct rp_operand *x, const struct rp_operand *y)
{
	if (!same_buffer(x, y) || x->offset != y->offset || x->dtype != y->dtype || x->rank != y->rank) {
		return false;
	}
	for (int i = 0; i < x->rank; i++) {
		if (x->shape[i] != y->shape[i] || x->strides[i] != y->strides[i]) {
			return false;
		}
	}
	return true;
}

/* ---- One operand on its own ---------------------------------------------------- */

static int check_rank(const struct rp_operand *op, const struct rp_operand_spec *s, struct rp_error *err)
{
	if (op->rank != s->rank) {
		return rp_error_invalid_operand(err, s->name, "%s has rank %d (shape %s) but must be rank %d, %s", s->name,
						op->rank, rp_operand_shape_text(op).s, s->rank, s->dims);
	}
	return 0;
}

/* The libraries take tensors whose elements of a row are adjacent; a
 * matrix's rows are apart by at least a row. */
static int check_strides(const struct rp_operand *op, const struct rp_operand_spec *s, struct rp_error *err)
{
	int last = op->rank - 1;

	if (op->strides[last] != 1) {
		return rp_error_invalid_operand(err, s->name,
						"%s's last stride is %" PRId64 " but must be 1 (elements of a row adjacent)",
						s->name, op->strides[last]);
	}
	if (s->padded_rows && op->rank == 2 && op->strides[0] < op->shape[1]) {
		return rp_error_invalid_operand(err, s->name,
						"%s's row stride is %" PRId64 " but must be at least its row length %" PRId64
						" (rows may be padded, not overlap)",
						s->name, op->strides[0], op->shape[1]);
	}
	return 0;
}

static int check_dtype(const struct rp_operand *op, const struct rp_operand_spec *s, struct rp_error *err)
{
	char allowed[32] = "";

	if (s->dtypes & RP_DTYPE_BIT(op->dtype)) {
		return 0;
	}
	for (int dt = 0; dt < RP_DTYPE_COUNT; dt++) {
		if (s->dtypes & RP_DTYPE_BIT(dt)) {
			snprintf(allowed + strlen(allowed), sizeof(allowed) - strlen(allowed), "%s%s", allowed[0] ? " or " : "",
				 rp_dtype_name(dt));
		}
	}
	return rp_error_invalid_operand(err, s->name, "%s is %s but must be %s", s->name, rp_dtype_name(op->dtype),
					allowed);
}

/* ---- Operands among each other ------------------------------------------------ */

static int check_dtype_like(const struct rp_compute *c, int slot, struct rp_error *err)
{
	const struct rp_operand_spec *s = &c->spec->operands[slot];
	const struct rp_operand *op = &c->operands[slot], *ref;

	if (s->dtype_like == RP_NO_SLOT || !c->present[s->dtype_like]) {
		return 0;
	}
	ref = &c->operands[s->dtype_like];
	if (op->dtype != ref->dtype) {
		return rp_error_invalid_operand(err, s->name, "%s is %s but %s is %s: they must share a dtype", s->name,
						rp_dtype_name(op->dtype), c->spec->operands[s->dtype_like].name,
						rp_dtype_name(ref->dtype));
	}
	return 0;
}

/* A gradient has its primal's shape. Checked once the op's own check has
 * accepted the primals, so a wrong primal is named, not its gradient. */
static int check_shape_like(const struct rp_compute *c, int slot, struct rp_error *err)
{
	const struct rp_operand_spec *s = &c->spec->operands[slot];
	const struct rp_operand *op = &c->operands[slot], *like;

	if (s->shape_like == RP_NO_SLOT || !c->present[s->shape_like]) {
		return 0;
	}
	like = &c->operands[s->shape_like];
	if (!rp_operand_shape_is(op, like->rank, like->shape)) {
		return rp_error_invalid_operand(err, s->name, "%s is %s but must be shaped like %s, %s", s->name,
						rp_operand_shape_text(op).s, c->spec->operands[s->shape_like].name,
						rp_operand_shape_text(like).s);
	}
	return 0;
}

static int extent(const struct rp_operand *op, const char *name, uint64_t *begin, uint64_t *end, struct rp_error *err)
{
	int r = rp_operand_extent(op, begin, end);

	if (r == -EOVERFLOW) {
		return rp_error_invalid_operand(err, name, "its extent overflows 64 bits (shape, strides or offset too large)");
	}
	if (r < 0) {
		return rp_error_invalid_operand(err, name, "malformed shape or strides");
	}
	return 0;
}

/* Whether two operands of one buffer share bytes. Extents are conservative:
 * two interleaved tensors with disjoint elements but intersecting byte
 * ranges are taken to overlap (interleaved_disjoint tells those apart where
 * the two are laid out alike). */
static int overlaps(const struct rp_operand *x, const char *x_name, const struct rp_operand *y, const char *y_name,
		    uint64_t range[4], struct rp_error *err)
{
	if (!same_buffer(x, y)) {
		return 0;
	}
	if (extent(x, x_name, &range[0], &range[1], err) < 0 || extent(y, y_name, &range[2], &range[3], err) < 0) {
		return -EINVAL;
	}
	return range[0] < range[3] && range[2] < range[1];
}

/* The dimensions of op larger than 1, their strides and sizes sorted by
 * stride, ascending; returns how many. */
static int dims_by_stride(const struct rp_operand *op, int64_t *stride, int64_t *size)
{
	int n = 0;

	for (int i = 0; i < op->rank; i++) {
		if (op->shape[i] > 1) {
			stride[n] = op->strides[i];
			size[n++] = op->shape[i];
		}
	}
	for (int i = 1; i < n; i++) {
		for (int j = i; j > 0 && stride[j] < stride[j - 1]; j--) {
			int64_t t = stride[j];
			stride[j] = stride[j - 1];
			stride[j - 1] = t;
			t = size[j];
			size[j] = size[j - 1];
			size[j - 1] = t;
		}
	}
	return n;
}

/* Whether some element offset d - sum(c[i] * stride[i]) reaches 0 with
 * |c[i]| < size[i] for the dimensions from k on (strides descending, each
 * above what the ones after it reach together: reach[k] is what dimensions
 * k.. can add up to). With that nesting only the two multiples of a stride
 * nearest d can leave a remainder the inner dimensions reach. */
static bool offset_reachable(int64_t d, const int64_t *stride, const int64_t *size, const int64_t *reach, int n, int k)
{
	if (k == n) {
		return d == 0;
	}
	int64_t lo = d / stride[k] - (d % stride[k] != 0 && d < 0), hi = lo + 1;

	for (int64_t c = lo; c <= hi; c++) {
		int64_t rest = d - c * stride[k];

		if (c > -size[k] && c < size[k] && rest <= reach[k + 1] && rest >= -reach[k + 1] &&
		    offset_reachable(rest, stride, size, reach, n, k + 1)) {
			return true;
		}
	}
	return false;
}

/* Two operands laid out alike (dtype, shape and strides) a whole number of
 * elements apart, in one non-self-overlapping layout, whose elements are
 * nonetheless disjoint: q's, k's and v's gradients interleaved in one
 * [B, S, 3, H, D] buffer, which a byte range alone would call overlapping.
 * Exact: they share an element only when their distance is a sum of
 * strides times index differences within the shape. */
static bool interleaved_disjoint(const struct rp_operand *x, const struct rp_operand *y)
{
	int64_t up[RP_RANK_MAX], up_size[RP_RANK_MAX], stride[RP_RANK_MAX], size[RP_RANK_MAX], reach[RP_RANK_MAX + 1];
	size_t elem = rp_dtype_size(x->dtype);

	if (x->dtype != y->dtype || x->rank != y->rank || elem == 0) {
		return false;
	}
	for (int i = 0; i < x->rank; i++) {
		if (x->shape[i] != y->shape[i] || x->strides[i] != y->strides[i] || x->strides[i] < 0) {
			return false;
		}
	}
	uint64_t a = x->offset, b = y->offset, gap = a > b ? a - b : b - a;

	if (gap % elem != 0 || gap / elem > (uint64_t)INT64_MAX / 2) {
		return false;
	}
	/* Strides descending, then each must step over everything inside it. */
	int n = dims_by_stride(x, up, up_size);

	for (int i = 0; i < n; i++) {
		stride[i] = up[n - 1 - i];
		size[i] = up_size[n - 1 - i];
	}
	reach[n] = 0;
	for (int i = n - 1; i >= 0; i--) {
		if (stride[i] <= reach[i + 1] || (size[i] - 1) > (INT64_MAX / 2 - reach[i + 1]) / stride[i]) {
			return false;
		}
		reach[i] = reach[i + 1] + (size[i] - 1) * stride[i];
	}
	return !offset_reachable((int64_t)(gap / elem), stride, size, reach, n, 0);
}

/* An output that shares bytes with another operand would read partial
 * results (or clobber an input) in an order no library defines. The one
 * exception an output's table names (a GEMM's C) may alias it, but only
 * exactly: read and written per element. */
static int check_output_placement(const struct rp_compute *c, int out, int other, struct rp_error *err)
{
	const struct rp_operand_spec *so = &c->spec->operands[out], *sx = &c->spec->operands[other];
	const struct rp_operand *o = &c->operands[out], *x = &c->operands[other];
	uint64_t r[4];
	char id[RP_ID_MAX];
	int hit;

	if (so->may_alias == other && same_tensor(o, x)) {
		return 0;
	}
	hit = overlaps(o, so->name, x, sx->name, r, err);
	if (hit <= 0 || interleaved_disjoint(o, x)) {
		return hit < 0 ? hit : 0;
	}
	if (so->may_alias == other) {
		return rp_error_invalid_operand(err, sx->name,
						"%s (bytes [%" PRIu64 ", %" PRIu64 ")) overlaps %s (bytes [%" PRIu64 ", %" PRIu64
						")) without being the same tensor; %s may alias %s only exactly (same offset, dtype, shape and strides)",
						sx->name, r[2], r[3], so->name, r[0], r[1], sx->name, so->name);
	}
	return rp_error_invalid_operand(err, so->name,
					"%s (bytes [%" PRIu64 ", %" PRIu64 ")) overlaps %s (bytes [%" PRIu64 ", %" PRIu64
					")) in buffer %s; an output must not share memory with another operand",
					so->name, r[0], r[1], sx->name, r[2], r[3], rp_id_format(&o->buffer, id));
}

/* An output whose elements share addresses (a zero or too small stride)
 * would be written by many threads at once. Conservative: with the
 * dimensions of size > 1 ordered by stride, each stride must step over the
 * whole extent of the ones inside it. */
static int check_no_self_overlap(const struct rp_operand *out, const char *name, struct rp_error *err)
{
	int64_t stride[RP_RANK_MAX], size[RP_RANK_MAX];
	int n = dims_by_stride(out, stride, size);
	int64_t reach = 1;
	for (int i = 0; i < n; i++) {
		if (stride[i] < reach) {
			return rp_error_invalid_operand(err, name,
							"its strides make elements share memory (stride %" PRId64
							" where at least %" PRId64
							" is needed); an output needs every element at its own address",
							stride[i], reach);
		}
		if (__builtin_mul_overflow(stride[i], size[i], &reach)) {
			return 0;   /* larger than any buffer: bounds will refuse it */
		}
	}
	return 0;
}

/* Each output against itself, every input, and the outputs before it. */
static int check_placement(const struct rp_compute *c, struct rp_error *err)
{
	const struct rp_op_spec *spec = c->spec;
	int r;

	for (unsigned i = 0; i < spec->noperands; i++) {
		if (!c->present[i] || spec->operands[i].role != RP_ROLE_OUT) {
			continue;
		}
		if ((r = check_no_self_overlap(&c->operands[i], spec->operands[i].name, err)) < 0) {
			return r;
		}
		for (unsigned j = 0; j < spec->noperands; j++) {
			bool earlier_output = spec->operands[j].role == RP_ROLE_OUT && j < i;

			if (j == i || !c->present[j] || (spec->operands[j].role == RP_ROLE_OUT && !earlier_output)) {
				continue;
			}
			if ((r = check_output_placement(c, (int)i, (int)j, err)) < 0) {
				return r;
			}
		}
	}
	return 0;
}

/* ---- Events -------------------------------------------------------------------- */

/* wait_event / signal_event: an event id ("e0.1.7") or absent. */
static int parse_event(const cJSON *params, const char *name, struct rp_event_ref *ev, struct rp_error *err)
{
	const char *text;
	int r;

	memset(ev, 0, sizeof(*ev));
	r = rp_params_string(params, name, RP_ID_MAX - 1, NULL, &text, err);
	if (r < 0) {
		return r;
	}
	if (r == 1) {
		return 0;
	}
	if (rp_id_parse(text, &ev->id) < 0 || ev->id.kind != RP_ID_EVENT) {
		memset(ev, 0, sizeof(*ev));
		return rp_error_invalid_parameter(err, name);
	}
	ev->present = true;
	return 0;
}

/* ---- The call ---------------------------------------------------------------------- */

/* The op's whole field list: operands, scalars, the common fields. */
static unsigned op_fields(const struct rp_op_spec *spec, struct rp_field *fields)
{
	unsigned n = 0;

	for (unsigned i = 0; i < spec->noperands; i++) {
		fields[n++] = (struct rp_field){ spec->operands[i].name, RP_T_OBJECT, spec->operands[i].required };
	}
	for (const struct rp_field *f = spec->scalars; f && f->name && n < FIELDS_MAX - RP_COMPUTE_COMMON_FIELDS - 1;
	     f++) {
		fields[n++] = *f;
	}
	for (const struct rp_field *f = rp_compute_common_fields; f->name; f++) {
		fields[n++] = *f;
	}
	fields[n] = (struct rp_field){ NULL, 0, false };
	return n;
}

int rp_compute_check_operands(struct rp_compute *c, struct rp_error *err)
{
	const struct rp_op_spec *spec = c->spec;
	int r;

	for (unsigned i = 0; i < spec->noperands; i++) {
		if (c->present[i] && ((r = check_rank(&c->operands[i], &spec->operands[i], err)) < 0 ||
				      (r = check_strides(&c->operands[i], &spec->operands[i], err)) < 0 ||
				      (r = check_dtype(&c->operands[i], &spec->operands[i], err)) < 0)) {
			return r;
		}
	}
	for (unsigned i = 0; i < spec->noperands; i++) {
		if (c->present[i] && (r = check_dtype_like(c, (int)i, err)) < 0) {
			return r;
		}
	}
	if ((r = spec->check(c, err)) < 0) {
		return r;
	}
	for (unsigned i = 0; i < spec->noperands; i++) {
		if (c->present[i] && (r = check_shape_like(c, (int)i, err)) < 0) {
			return r;
		}
	}
	return 0;
}

/* Everything after the operands' own parsing: one path for a call and for
 * a ring record. */
static int check(struct rp_compute *c, struct rp_error *err)
{
	int r = rp_compute_check_operands(c, err);

	return r < 0 ? r : check_placement(c, err);
}

/* deadline_ms: 1 ms to a day, or absent. 0 would be a call that is late
 * before it starts. */
static int parse_deadline(const cJSON *params, uint32_t *deadline_ms, struct rp_error *err)
{
	uint64_t v = 0;
	int r = rp_params_uint(params, "deadline_ms", RP_DEADLINE_MS_MAX, 0, &v, err);

	if (r < 0) {
		return r;
	}
	if (r == 0 && v == 0) {
		return rp_error_invalid_parameter(err, "deadline_ms");
	}
	*deadline_ms = (uint32_t)v;
	return 0;
}

int rp_compute_parse_common(const cJSON *params, struct rp_event_ref *wait_event, struct rp_event_ref *signal_event,
			    uint32_t *deadline_ms, struct rp_error *err)
{
	int r;

	if ((r = parse_event(params, "wait_event", wait_event, err)) < 0 ||
	    (r = parse_event(params, "signal_event", signal_event, err)) < 0) {
		return r;
	}
	return parse_deadline(params, deadline_ms, err);
}

static int parse(const struct rp_op_spec *spec, const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	struct rp_field fields[FIELDS_MAX];
	int r;

	op_fields(spec, fields);
	if ((r = rp_params_check(params, fields, err)) < 0) {
		return r;
	}
	for (unsigned i = 0; i < spec->noperands; i++) {
		r = rp_operand_parse(params, spec->operands[i].name, spec->operands[i].required, &c->operands[i], err);
		if (r < 0) {
			return r;
		}
		c->present[i] = r == 0;
	}
	if ((r = rp_compute_parse_common(params, &c->wait_event, &c->signal_event, &c->deadline_ms, err)) < 0) {
		return r;
	}
	if ((r = spec->read_scalars(params, c, err)) < 0) {
		return r;
	}
	return check(c, err);
}

int rp_compute_parse(const struct rp_op_spec *spec, const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	int r;

	memset(c, 0, sizeof(*c));
	c->spec = spec;
	r = parse(spec, params, c, err);
	if (r < 0) {
		memset(c, 0, sizeof(*c));
	}
	return r;
}

int rp_compute_check(struct rp_compute *c, struct rp_error *err)
{
	int r = 0;

	if (c->spec == NULL || rp_op_get(c->spec->id) != c->spec) {
		r = rp_error_invalid_parameter(err, "op");
	}
	for (unsigned i = 0; r == 0 && i < c->spec->noperands; i++) {
		if (!c->present[i] && c->spec->operands[i].required) {
			r = rp_error_invalid_parameter(err, c->spec->operands[i].name);
		} else if (c->present[i]) {
			r = rp_operand_validate(&c->operands[i], c->spec->operands[i].name, err);
		}
	}
	for (unsigned i = c->spec ? c->spec->noperands : 0; r == 0 && i < RP_OP_OPERANDS_MAX; i++) {
		if (c->present[i]) {
			r = rp_error_invalid_parameter(err, "operands");
		}
	}
	if (r == 0 && ((c->wait_event.present && c->wait_event.id.kind != RP_ID_EVENT) ||
		       (c->signal_event.present && c->signal_event.id.kind != RP_ID_EVENT))) {
		r = rp_error_invalid_parameter(err, c->wait_event.present && c->wait_event.id.kind != RP_ID_EVENT
							 ? "wait_event" : "signal_event");
	}
	if (r == 0) {
		r = check(c, err);
	}
	if (r < 0) {
		memset(c, 0, sizeof(*c));
	}
	return r;
}

cJSON *rp_compute_to_json(const struct rp_compute *c)
{
	cJSON *params = cJSON_CreateObject();
	char id[RP_ID_MAX];

	if (!params) {
		return NULL;
	}
	for (unsigned i = 0; i < c->spec->noperands; i++) {
		cJSON *op;

		if (!c->present[i]) {
			continue;
		}
		op = rp_operand_to_json(&c->operands[i]);
		if (!op || !cJSON_AddItemToObject(params, c->spec->operands[i].name, op)) {
			cJSON_Delete(op);
			goto fail;
		}
	}
	if ((c->wait_event.present &&
	     !cJSON_AddStringToObject(params, "wait_event", rp_id_format(&c->wait_event.id, id))) ||
	    (c->signal_event.present &&
	     !cJSON_AddStringToObject(params, "signal_event", rp_id_format(&c->signal_event.id, id))) ||
	    (c->deadline_ms && !cJSON_AddNumberToObject(params, "deadline_ms", c->deadline_ms))) {
		goto fail;
	}
	c->spec->encode(c, params);
	return params;

fail:
	cJSON_Delete(params);
	return NULL;
}
