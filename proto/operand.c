/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor operands: parsing io.regen.Operand, and the bytes it touches. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "operand.h"
#include "params.h"

/* JSON numbers hold integers exactly up to 2^53; no offset or stride may
 * go beyond that on the wire. */
#define WIRE_INT_MAX (UINT64_C(1) << 53)

static const char *const dtype_names[RP_DTYPE_COUNT + 1] = {
	[RP_DTYPE_F32] = "f32",
	[RP_DTYPE_F16] = "f16",
	[RP_DTYPE_BF16] = "bf16",
	[RP_DTYPE_I32] = "i32",
	[RP_DTYPE_F64] = "f64",
	[RP_DTYPE_I64] = "i64",
	[RP_DTYPE_U8] = "u8",
	[RP_DTYPE_E4M3] = "e4m3",
	[RP_DTYPE_E5M2] = "e5m2",
	[RP_DTYPE_COUNT] = NULL,
};

const char *rp_dtype_name(enum rp_dtype dt)
{
	if ((unsigned)dt >= RP_DTYPE_COUNT)
		return NULL;
	return dtype_names[dt];
}

int rp_dtype_from_name(const char *name)
{
	if (name == NULL)
		return -1;
	for (int i = 0; i < RP_DTYPE_COUNT; i++) {
		if (strcmp(dtype_names[i], name) == 0)
			return i;
	}
	return -1;
}

size_t rp_dtype_size(enum rp_dtype dt)
{
	switch (dt) {
	case RP_DTYPE_F32:
	case RP_DTYPE_I32:
		return 4;
	case RP_DTYPE_F16:
	case RP_DTYPE_BF16:
		return 2;
	case RP_DTYPE_F64:
	case RP_DTYPE_I64:
		return 8;
	case RP_DTYPE_U8:
	case RP_DTYPE_E4M3:
	case RP_DTYPE_E5M2:
		return 1;
	default:
		return 0;
	}
}

/* InvalidParameter naming "<operand>.<field>". */
static int bad_field(struct rp_error *err, const char *name, const char *field)
{
	char full[128];

	snprintf(full, sizeof(full), "%s.%s", name, field);
	return rp_error_invalid_parameter(err, full);
}

int rp_error_invalid_operand(struct rp_error *err, const char *name, const char *fmt, ...)
{
	char reason[320];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	rp_error_set(err, RP_ERR_INVALID_OPERAND, "Operand '%s' is invalid: %s", name, reason);
	rp_error_add_str(err, "operand", name);
	rp_error_add_str(err, "reason", reason);
	return -EINVAL;
}

static const char *const operand_fields[] = { "buffer", "offset", "dtype", "shape", "strides", NULL };

/* Reads a list of integers in [lo, hi] into out; -EINVAL if anything else. */
static int int_list(const cJSON *array, int64_t lo, int64_t hi, int64_t *out, int max_count, int *count)
{
	const cJSON *item;
	int n = 0;

	if (!cJSON_IsArray(array))
		return -EINVAL;
	cJSON_ArrayForEach(item, array) {
		double d;

		if (n == max_count)
			return -EINVAL;
		if (!cJSON_IsNumber(item))
			return -EINVAL;
		d = item->valuedouble;
		/* In double first: a cast of an out-of-range double is undefined. */
		if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d)
			return -EINVAL;
		out[n++] = (int64_t)d;
	}
	*count = n;
	return 0;
}

int rp_operand_parse(const cJSON *params, const char *name, bool required, struct rp_operand *op,
		     struct rp_error *err)
{
	const cJSON *obj, *item, *other;
	const char *buffer;
	uint64_t offset;
	size_t elem;
	int dtype, nstrides = 0;

	memset(op, 0, sizeof(*op));
	obj = cJSON_GetObjectItemCaseSensitive(params, name);
	if (obj == NULL || cJSON_IsNull(obj)) {
		if (required)
			return rp_error_invalid_parameter(err, name);
		return 1;
	}
	if (!cJSON_IsObject(obj))
		return rp_error_invalid_parameter(err, name);

	cJSON_ArrayForEach(item, obj) {
		bool known = false;

		for (int i = 0; operand_fields[i] != NULL; i++)
			known = known || strcmp(operand_fields[i], item->string) == 0;
		if (!known)
			return bad_field(err, name, item->string);
		for (other = obj->child; other != item; other = other->next) {
			if (strcmp(other->string, item->string) == 0)
				return bad_field(err, name, item->string);
		}
	}

	item = cJSON_GetObjectItemCaseSensitive(obj, "buffer");
	if (!cJSON_IsString(item) || item->valuestring[0] == '\0')
		return bad_field(err, name, "buffer");
	buffer = item->valuestring;
	if (rp_id_parse(buffer, &op->buffer) < 0 || op->buffer.kind != RP_ID_BUFFER) {
		memset(op, 0, sizeof(*op));
		return rp_error_invalid_operand(err, name, "'%.80s' is not a buffer id (like b0.1.3)", buffer);
	}

	if (rp_params_uint(obj, "offset", WIRE_INT_MAX, 0, &offset, err) < 0)
		goto bad_offset;
	op->offset = offset;

	item = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
	dtype = cJSON_IsString(item) ? rp_dtype_from_name(item->valuestring) : -1;
	if (dtype < 0) {
		memset(op, 0, sizeof(*op));
		return bad_field(err, name, "dtype");
	}
	op->dtype = (enum rp_dtype)dtype;

	if (int_list(cJSON_GetObjectItemCaseSensitive(obj, "shape"), 1, RP_DIM_MAX, op->shape, RP_RANK_MAX,
		     &op->rank) < 0 || op->rank < 1) {
		memset(op, 0, sizeof(*op));
		return bad_field(err, name, "shape");
	}

	item = cJSON_GetObjectItemCaseSensitive(obj, "strides");
	if (item != NULL && !cJSON_IsNull(item)) {
		if (int_list(item, 0, (int64_t)WIRE_INT_MAX, op->strides, RP_RANK_MAX, &nstrides) < 0 ||
		    nstrides != op->rank) {
			memset(op, 0, sizeof(*op));
			return bad_field(err, name, "strides");
		}
	} else {
		/* Contiguous row-major; the product of four dims of 2^31 does
		 * not fit in 64 bits. */
		op->strides[op->rank - 1] = 1;
		for (int i = op->rank - 2; i >= 0; i--) {
			if (__builtin_mul_overflow(op->strides[i + 1], op->shape[i + 1], &op->strides[i])) {
				memset(op, 0, sizeof(*op));
				return rp_error_invalid_operand(err, name, "too large: its elements cannot be addressed in 64 bits");
			}
		}
	}

	elem = rp_dtype_size(op->dtype);
	if (op->offset % elem != 0) {
		char id[RP_ID_MAX];
		int r = rp_error_invalid_operand(err, name,
					"misaligned: offset %" PRIu64 " into buffer %s is not a multiple of %zu, the size of %s",
					op->offset, rp_id_format(&op->buffer, id), elem, rp_dtype_name(op->dtype));
		memset(op, 0, sizeof(*op));
		return r;
	}
	/* What every other way into an operand is held to, this one is too. */
	if (rp_operand_validate(op, name, err) < 0) {
		memset(op, 0, sizeof(*op));
		return -EINVAL;
	}
	return 0;

bad_offset:
	memset(op, 0, sizeof(*op));
	return bad_field(err, name, "offset");
}

int rp_operand_validate(const struct rp_operand *op, const char *name, struct rp_error *err)
{
	char id[RP_ID_MAX];
	size_t elem;

	if (op->buffer.kind != RP_ID_BUFFER)
		return rp_error_invalid_operand(err, name, "'%s' is not a buffer id (like b0.1.3)",
						rp_id_format(&op->buffer, id));
	if (op->offset > WIRE_INT_MAX)
		return bad_field(err, name, "offset");
	if ((unsigned)op->dtype >= RP_DTYPE_COUNT)
		return bad_field(err, name, "dtype");
	if (op->rank < 1 || op->rank > RP_RANK_MAX)
		return bad_field(err, name, "shape");
	for (int i = 0; i < op->rank; i++) {
		if (op->shape[i] < 1 || op->shape[i] > RP_DIM_MAX)
			return bad_field(err, name, "shape");
	}
	for (int i = 0; i < op->rank; i++) {
		if (op->strides[i] < 0 || (uint64_t)op->strides[i] > WIRE_INT_MAX)
			return bad_field(err, name, "strides");
	}
	elem = rp_dtype_size(op->dtype);
	if (op->offset % elem != 0)
		return rp_error_invalid_operand(err, name,
						"misaligned: offset %" PRIu64 " into buffer %s is not a multiple of %zu, the size of %s",
						op->offset, rp_id_format(&op->buffer, id), elem, rp_dtype_name(op->dtype));
	return 0;
}

int rp_operand_extent(const struct rp_operand *op, uint64_t *begin, uint64_t *end)
{
	size_t elem = rp_dtype_size(op->dtype);
	int64_t span = 0;
	uint64_t bytes, last;

	if (elem == 0 || op->rank < 1 || op->rank > RP_RANK_MAX)
		return -EINVAL;
	for (int i = 0; i < op->rank; i++) {
		int64_t t;

		if (op->shape[i] < 1 || op->strides[i] < 0)
			return -EINVAL;
		if (__builtin_mul_overflow(op->shape[i] - 1, op->strides[i], &t) ||
		    __builtin_add_overflow(span, t, &span))
			return -EOVERFLOW;
	}
	/* span is the index of the last element touched; end is one past its
	 * last byte. */
	if (__builtin_add_overflow((uint64_t)span, 1, &last) || __builtin_mul_overflow(last, (uint64_t)elem, &bytes) ||
	    __builtin_add_overflow(op->offset, bytes, &bytes))
		return -EOVERFLOW;
	*begin = op->offset;
	*end = bytes;
	return 0;
}

int rp_operand_check_bounds(const struct rp_operand *op, const char *name, uint64_t buffer_size,
			    struct rp_error *err)
{
	char id[RP_ID_MAX];
	uint64_t begin, end;
	int r;

	r = rp_operand_extent(op, &begin, &end);
	if (r == -EOVERFLOW)
		return rp_error_invalid_operand(err, name, "its extent overflows 64 bits (shape, strides or offset too large)");
	if (r < 0)
		return rp_error_invalid_operand(err, name, "malformed shape or strides");
	if (end > buffer_size)
		return rp_error_invalid_operand(err, name, "extends to byte %" PRIu64 " past the end of buffer %s (%" PRIu64 " bytes)",
				       end, rp_id_format(&op->buffer, id), buffer_size);
	return 0;
}

int64_t rp_operand_numel(const struct rp_operand *op)
{
	int64_t n = 1;

	if (op->rank < 1 || op->rank > RP_RANK_MAX)
		return -1;
	for (int i = 0; i < op->rank; i++) {
		if (op->shape[i] < 0 || __builtin_mul_overflow(n, op->shape[i], &n))
			return -1;
	}
	return n;
}

cJSON *rp_operand_to_json(const struct rp_operand *op)
{
	char id[RP_ID_MAX];
	cJSON *obj, *shape, *strides;
	const char *dtype = rp_dtype_name(op->dtype);

	if (dtype == NULL || op->rank < 1 || op->rank > RP_RANK_MAX)
		return NULL;
	obj = cJSON_CreateObject();
	if (obj == NULL)
		return NULL;
	if (cJSON_AddStringToObject(obj, "buffer", rp_id_format(&op->buffer, id)) == NULL ||
	    cJSON_AddNumberToObject(obj, "offset", (double)op->offset) == NULL ||
	    cJSON_AddStringToObject(obj, "dtype", dtype) == NULL)
		goto error;
	shape = cJSON_AddArrayToObject(obj, "shape");
	strides = cJSON_AddArrayToObject(obj, "strides");
	if (shape == NULL || strides == NULL)
		goto error;
	for (int i = 0; i < op->rank; i++) {
		cJSON *a = cJSON_CreateNumber((double)op->shape[i]);
		cJSON *b = cJSON_CreateNumber((double)op->strides[i]);

		if (a == NULL || b == NULL) {
			cJSON_Delete(a);
			cJSON_Delete(b);
			goto error;
		}
		cJSON_AddItemToArray(shape, a);
		cJSON_AddItemToArray(strides, b);
	}
	return obj;

error:
	cJSON_Delete(obj);
	return NULL;
}
