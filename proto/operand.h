/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor operands: dtype, shape, strides and the bytes they touch. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "ids.h"
#include "message.h"

#define RP_RANK_MAX 4
/* No dimension may exceed this; keeps every extent computation in int64. */
#define RP_DIM_MAX (INT64_C(1) << 31)

/* i32 is for integer operands only (attention's sequence lengths): an
 * operation's table says which operands take which dtypes. f64, i64 and u8
 * (bool) came later, for programs (proto/program.h): the host backend's f64
 * reference runs, torch's int64 indices, comparisons' results. e4m3 and
 * e5m2 are the FP8 formats (OCP's E4M3 "fn": no infinities, one NaN, 448
 * the largest; E5M2: IEEE-like, 57344 the largest), storage only: the FP8
 * GEMM's inputs and output and the quantize ops' outputs, never arithmetic
 * of a program's pointwise ops. */
enum rp_dtype {
	RP_DTYPE_F32 = 0, RP_DTYPE_F16, RP_DTYPE_BF16, RP_DTYPE_I32, RP_DTYPE_F64, RP_DTYPE_I64, RP_DTYPE_U8,
	RP_DTYPE_E4M3, RP_DTYPE_E5M2,
	RP_DTYPE_COUNT
};
/* The floating-point dtypes of io.regen.Compute are the first
 * RP_DTYPE_FLOATS (f64 is a program's only). */
#define RP_DTYPE_FLOATS (RP_DTYPE_BF16 + 1)
static inline bool rp_dtype_is_float(enum rp_dtype dt)
{
	return dt < RP_DTYPE_FLOATS || dt == RP_DTYPE_F64;
}
/* FP8: floats to a GEMM and the quantize ops, to nothing else. */
static inline bool rp_dtype_is_fp8(enum rp_dtype dt)
{
	return dt == RP_DTYPE_E4M3 || dt == RP_DTYPE_E5M2;
}
/* The largest finite value of an FP8 dtype (0 for any other). */
static inline double rp_fp8_max(enum rp_dtype dt)
{
	return dt == RP_DTYPE_E4M3 ? 448.0 : dt == RP_DTYPE_E5M2 ? 57344.0 : 0.0;
}

const char *rp_dtype_name(enum rp_dtype dt);
int rp_dtype_from_name(const char *name);       /* -1 when unknown */
size_t rp_dtype_size(enum rp_dtype dt);

struct rp_operand {
	struct rp_id buffer;
	uint64_t offset;           /* bytes into the buffer */
	enum rp_dtype dtype;
	int rank;
	int64_t shape[RP_RANK_MAX];
	int64_t strides[RP_RANK_MAX];   /* elements; contiguous row-major when omitted */
};

/* Parses the io.regen.Operand object under params[name]. Errors:
 * InvalidParameter naming "<name>.<field>" for type/shape problems (rank 1..4,
 * every dim >= 1 and <= RP_DIM_MAX, strides same rank and >= 0, unknown
 * fields), InvalidOperand {operand: name, reason} for a bad buffer id syntax
 * (or an event id), an offset not a multiple of the element size (reason
 * starts "misaligned"), or a shape whose contiguous strides overflow.
 * Returns 1 (and leaves *op zeroed) when optional and absent. */
int rp_operand_parse(const cJSON *params, const char *name, bool required, struct rp_operand *op, struct rp_error *err);

/* The checks rp_operand_parse makes of each field, for an operand filled
 * another way (a ring record): the same errors, named "<name>.<field>"
 * (rank 1..4, dims 1..RP_DIM_MAX, strides 0..2^53, offset up to 2^53 and a
 * multiple of the element size, a known dtype, a buffer id). */
int rp_operand_validate(const struct rp_operand *op, const char *name, struct rp_error *err);

/* Bytes [*begin, *end) the operand touches; -EOVERFLOW on overflow. */
int rp_operand_extent(const struct rp_operand *op, uint64_t *begin, uint64_t *end);

/* InvalidOperand {operand: name, reason} unless the extent fits in size. */
int rp_operand_check_bounds(const struct rp_operand *op, const char *name, uint64_t buffer_size, struct rp_error *err);

/* Product of the shape; -1 on overflow or a malformed operand. */
/* io.regen.InvalidOperand {operand: name, reason, message}. Returns -EINVAL. */
int rp_error_invalid_operand(struct rp_error *err, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

int64_t rp_operand_numel(const struct rp_operand *op);
/* cJSON object for an operand (clients build calls with it); strides are
 * always written. NULL on ENOMEM or a malformed operand. */
cJSON *rp_operand_to_json(const struct rp_operand *op);
