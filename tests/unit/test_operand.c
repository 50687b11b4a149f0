/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor operands: parsing io.regen.Operand, the bytes an operand touches,
 * and the check against its buffer that runs before any work starts. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/operand.h"

static cJSON *json(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

static const char *param_str(const struct rp_error *err, const char *key)
{
	const cJSON *item = cJSON_GetObjectItemCaseSensitive(err->params, key);

	return cJSON_IsString(item) ? item->valuestring : NULL;
}

/* Parses {"a": <operand>} as required operand "a". */
static int parse(const char *operand, struct rp_operand *op, struct rp_error *err)
{
	char text[1024];
	cJSON *params;
	int r;

	snprintf(text, sizeof(text), "{\"a\":%s}", operand);
	params = json(text);
	r = rp_operand_parse(params, "a", true, op, err);
	cJSON_Delete(params);
	return r;
}

START_TEST(dtypes)
{
	ck_assert_str_eq(rp_dtype_name(RP_DTYPE_F32), "f32");
	ck_assert_str_eq(rp_dtype_name(RP_DTYPE_F16), "f16");
	ck_assert_str_eq(rp_dtype_name(RP_DTYPE_BF16), "bf16");
	ck_assert_ptr_null(rp_dtype_name(RP_DTYPE_COUNT));
	ck_assert_int_eq(rp_dtype_from_name("bf16"), RP_DTYPE_BF16);
	ck_assert_int_eq(rp_dtype_from_name("F32"), -1);
	ck_assert_int_eq(rp_dtype_from_name("fp8"), -1);
	ck_assert_uint_eq(rp_dtype_size(RP_DTYPE_F32), 4);
	ck_assert_uint_eq(rp_dtype_size(RP_DTYPE_F16), 2);
	ck_assert_uint_eq(rp_dtype_size(RP_DTYPE_BF16), 2);
}
END_TEST

START_TEST(contiguous_by_default)
{
	struct rp_error err = { 0 };
	struct rp_operand op;
	uint64_t begin, end;

	ck_assert_int_eq(parse("{\"buffer\":\"b0.3.17\",\"dtype\":\"f16\",\"shape\":[2,3,4]}", &op, &err), 0);
	ck_assert_int_eq(op.buffer.kind, 'b');
	ck_assert_uint_eq(op.buffer.generation, 3);
	ck_assert_uint_eq(op.buffer.serial, 17);
	ck_assert_uint_eq(op.offset, 0);
	ck_assert_int_eq(op.dtype, RP_DTYPE_F16);
	ck_assert_int_eq(op.rank, 3);
	ck_assert_int_eq(op.strides[0], 12);
	ck_assert_int_eq(op.strides[1], 4);
	ck_assert_int_eq(op.strides[2], 1);
	ck_assert_int_eq(rp_operand_numel(&op), 24);
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), 0);
	ck_assert_uint_eq(begin, 0);
	ck_assert_uint_eq(end, 48);
}
END_TEST

START_TEST(strided_extent)
{
	struct rp_error err = { 0 };
	struct rp_operand op;
	uint64_t begin, end;

	/* A [4, 8] view with leading dimension 16, 64 bytes in: the last
	 * element is index 3*16 + 7 = 55, so 56 f32 after the offset. */
	ck_assert_int_eq(parse("{\"buffer\":\"b1.1.0\",\"offset\":64,\"dtype\":\"f32\",\"shape\":[4,8],"
			       "\"strides\":[16,1]}", &op, &err), 0);
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), 0);
	ck_assert_uint_eq(begin, 64);
	ck_assert_uint_eq(end, 64 + 56 * 4);

	/* Stride 0 broadcasts: one row read four times. */
	ck_assert_int_eq(parse("{\"buffer\":\"b1.1.0\",\"dtype\":\"bf16\",\"shape\":[4,8],\"strides\":[0,1]}", &op, &err),
			 0);
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), 0);
	ck_assert_uint_eq(end, 16);

	/* null strides are absent strides. */
	ck_assert_int_eq(parse("{\"buffer\":\"b1.1.0\",\"dtype\":\"f32\",\"shape\":[5],\"strides\":null}", &op, &err), 0);
	ck_assert_int_eq(op.strides[0], 1);
}
END_TEST

/* Refusals naming "a.<field>" in InvalidParameter. */
static const struct {
	const char *operand;
	const char *parameter;
} bad_fields[] = {
	{ "[]", "a" },
	{ "\"b0.1.2\"", "a" },
	{ "{\"dtype\":\"f32\",\"shape\":[1]}", "a.buffer" },
	{ "{\"buffer\":7,\"dtype\":\"f32\",\"shape\":[1]}", "a.buffer" },
	{ "{\"buffer\":\"\",\"dtype\":\"f32\",\"shape\":[1]}", "a.buffer" },
	{ "{\"buffer\":\"b0.1.2\",\"shape\":[1]}", "a.dtype" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"fp8\",\"shape\":[1]}", "a.dtype" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":4,\"shape\":[1]}", "a.dtype" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\"}", "a.shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[]}", "a.shape" },            /* rank 0 */
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[1,1,1,1,1]}", "a.shape" },   /* rank 5 */
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2,0]}", "a.shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[-1]}", "a.shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[1.5]}", "a.shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2147483649]}", "a.shape" },  /* > 2^31 */
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[\"4\"]}", "a.shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":{}}", "a.shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2,2],\"strides\":[1]}", "a.strides" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2,2],\"strides\":[2,1,1]}", "a.strides" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2,2],\"strides\":[-2,1]}", "a.strides" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2,2],\"strides\":[2,0.5]}", "a.strides" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"strides\":[1e17]}", "a.strides" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"offset\":-4}", "a.offset" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"offset\":4.5}", "a.offset" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"offset\":\"0\"}", "a.offset" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"offset\":1e17}", "a.offset" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"layout\":\"nchw\"}", "a.layout" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"Shape\":[2]}", "a.Shape" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2],\"shape\":[4]}", "a.shape" },  /* twice */
};

START_TEST(bad_field_is_named)
{
	struct rp_error err = { 0 };
	struct rp_operand op;

	ck_assert_msg(parse(bad_fields[_i].operand, &op, &err) == -EINVAL, "accepted %s", bad_fields[_i].operand);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_PARAMETER);
	ck_assert_msg(strcmp(param_str(&err, "parameter"), bad_fields[_i].parameter) == 0, "%s: named %s",
		      bad_fields[_i].operand, param_str(&err, "parameter"));
	/* A refused operand is left zeroed, never half-filled. */
	ck_assert_int_eq(op.rank, 0);
	rp_error_clear(&err);
}
END_TEST

/* Refusals with InvalidOperand {operand, reason}. */
static const struct {
	const char *operand;
	const char *reason_prefix;
} bad_operands[] = {
	{ "{\"buffer\":\"b0.0.2\",\"dtype\":\"f32\",\"shape\":[1]}", "'b0.0.2' is not a buffer id" },
	{ "{\"buffer\":\"buffer7\",\"dtype\":\"f32\",\"shape\":[1]}", "'buffer7' is not a buffer id" },
	{ "{\"buffer\":\"e0.1.2\",\"dtype\":\"f32\",\"shape\":[1]}", "'e0.1.2' is not a buffer id" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[1],\"offset\":6}", "misaligned" },
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f16\",\"shape\":[1],\"offset\":3}", "misaligned" },
	/* Contiguous strides of four dims of 2^31 need 2^93. */
	{ "{\"buffer\":\"b0.1.2\",\"dtype\":\"f32\",\"shape\":[2147483648,2147483648,2147483648,2]}", "too large" },
};

START_TEST(bad_operand_has_a_reason)
{
	struct rp_error err = { 0 };
	struct rp_operand op;
	const char *reason;

	ck_assert_msg(parse(bad_operands[_i].operand, &op, &err) == -EINVAL, "accepted %s",
		      bad_operands[_i].operand);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(param_str(&err, "operand"), "a");
	reason = param_str(&err, "reason");
	ck_assert_msg(strncmp(reason, bad_operands[_i].reason_prefix, strlen(bad_operands[_i].reason_prefix)) == 0,
		      "%s: reason '%s'", bad_operands[_i].operand, reason);
	ck_assert_ptr_nonnull(param_str(&err, "message"));
	rp_error_clear(&err);
}
END_TEST

START_TEST(optional_and_required)
{
	struct rp_error err = { 0 };
	struct rp_operand op;
	cJSON *params = json("{\"c\":null}");

	ck_assert_int_eq(rp_operand_parse(params, "bias", false, &op, &err), 1);
	ck_assert_int_eq(op.rank, 0);
	ck_assert_int_eq(rp_operand_parse(params, "c", false, &op, &err), 1);
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(rp_operand_parse(params, "d", true, &op, &err), -EINVAL);
	ck_assert_str_eq(param_str(&err, "parameter"), "d");
	rp_error_clear(&err);
	cJSON_Delete(params);
}
END_TEST

START_TEST(bounds_against_the_buffer)
{
	struct rp_error err = { 0 };
	struct rp_operand op;

	/* [4, 8] f32 at offset 64: bytes [64, 192). */
	ck_assert_int_eq(parse("{\"buffer\":\"b0.1.3\",\"offset\":64,\"dtype\":\"f32\",\"shape\":[4,8]}", &op, &err), 0);
	ck_assert_int_eq(rp_operand_check_bounds(&op, "a", 192, &err), 0);
	ck_assert_ptr_null(err.name);
	ck_assert_int_eq(rp_operand_check_bounds(&op, "a", 191, &err), -EINVAL);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_str_eq(param_str(&err, "operand"), "a");
	ck_assert_str_eq(param_str(&err, "reason"), "extends to byte 192 past the end of buffer b0.1.3 (191 bytes)");
	rp_error_clear(&err);
}
END_TEST

START_TEST(overflow_is_caught_not_wrapped)
{
	struct rp_error err = { 0 };
	struct rp_operand op;
	uint64_t begin = 7, end = 7;

	/* (2^31 - 1) * 2^53 overflows int64 in one term. */
	ck_assert_int_eq(parse("{\"buffer\":\"b0.1.3\",\"dtype\":\"f32\",\"shape\":[2147483648],"
			       "\"strides\":[9007199254740992]}", &op, &err), 0);
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EOVERFLOW);
	ck_assert_uint_eq(end, 7);
	ck_assert_int_eq(rp_operand_check_bounds(&op, "a", UINT64_MAX, &err), -EINVAL);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_OPERAND);
	ck_assert_ptr_nonnull(strstr(param_str(&err, "reason"), "overflows"));
	rp_error_clear(&err);

	/* Each term fits, their sum does not. */
	ck_assert_int_eq(parse("{\"buffer\":\"b0.1.3\",\"dtype\":\"f32\",\"shape\":[1024,1024],"
			       "\"strides\":[9007199254740992,9007199254740992]}", &op, &err), 0);
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EOVERFLOW);

	/* The span fits in int64, times the element size it does not. */
	op = (struct rp_operand){ .dtype = RP_DTYPE_F32, .rank = 1, .shape = { 2 }, .strides = { INT64_C(1) << 62 } };
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EOVERFLOW);

	/* Bytes fit, the offset pushes the end past 2^64. */
	op = (struct rp_operand){ .offset = UINT64_MAX - 8, .dtype = RP_DTYPE_F32, .rank = 1, .shape = { 4 },
				  .strides = { 1 } };
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EOVERFLOW);

	/* Two of the largest dims: 2^62 f16 elements end at byte 2^63. */
	ck_assert_int_eq(parse("{\"buffer\":\"b0.1.3\",\"dtype\":\"f16\",\"shape\":[2147483648,2147483648]}", &op, &err),
			 0);
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), 0);
	ck_assert_uint_eq(end, UINT64_C(1) << 63);
	/* As f32 the same shape ends at 2^64: one past what 64 bits hold. */
	op.dtype = RP_DTYPE_F32;
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EOVERFLOW);
}
END_TEST

START_TEST(malformed_operands_never_pass)
{
	struct rp_error err = { 0 };
	struct rp_operand op = { .dtype = RP_DTYPE_F32, .rank = 0 };
	uint64_t begin, end;

	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EINVAL);
	ck_assert_int_eq(rp_operand_numel(&op), -1);
	op = (struct rp_operand){ .dtype = RP_DTYPE_F32, .rank = 1, .shape = { 0 }, .strides = { 1 } };
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EINVAL);
	ck_assert_int_eq(rp_operand_check_bounds(&op, "a", 1 << 20, &err), -EINVAL);
	ck_assert_str_eq(err.name, RP_ERR_INVALID_OPERAND);
	rp_error_clear(&err);
	op = (struct rp_operand){ .dtype = RP_DTYPE_COUNT, .rank = 1, .shape = { 1 }, .strides = { 1 } };
	ck_assert_int_eq(rp_operand_extent(&op, &begin, &end), -EINVAL);
	op = (struct rp_operand){ .dtype = RP_DTYPE_F32, .rank = 4,
				  .shape = { INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31, 2 } };
	ck_assert_int_eq(rp_operand_numel(&op), -1);
}
END_TEST

START_TEST(to_json_parses_back)
{
	struct rp_error err = { 0 };
	struct rp_operand op = { 0 }, back;
	cJSON *j, *params;
	char *text;

	ck_assert_int_eq(parse("{\"buffer\":\"b2.5.9\",\"offset\":128,\"dtype\":\"bf16\",\"shape\":[3,5],"
			       "\"strides\":[8,1]}", &op, &err), 0);
	j = rp_operand_to_json(&op);
	ck_assert_ptr_nonnull(j);
	text = cJSON_PrintUnformatted(j);
	ck_assert_str_eq(text, "{\"buffer\":\"b2.5.9\",\"offset\":128,\"dtype\":\"bf16\",\"shape\":[3,5],\"strides\":[8,1]}");
	params = cJSON_CreateObject();
	cJSON_AddItemToObject(params, "x", j);
	ck_assert_int_eq(rp_operand_parse(params, "x", true, &back, &err), 0);
	ck_assert(memcmp(back.shape, op.shape, sizeof(op.shape)) == 0);
	ck_assert(memcmp(back.strides, op.strides, sizeof(op.strides)) == 0);
	ck_assert_uint_eq(back.offset, 128);
	ck_assert_uint_eq(back.buffer.serial, 9);
	cJSON_Delete(params);
	free(text);
}
END_TEST

static Suite *operand_suite(void)
{
	Suite *s = suite_create("operand");
	TCase *tc = tcase_create("parse");

	tcase_add_test(tc, dtypes);
	tcase_add_test(tc, contiguous_by_default);
	tcase_add_test(tc, strided_extent);
	tcase_add_loop_test(tc, bad_field_is_named, 0, sizeof(bad_fields) / sizeof(bad_fields[0]));
	tcase_add_loop_test(tc, bad_operand_has_a_reason, 0, sizeof(bad_operands) / sizeof(bad_operands[0]));
	tcase_add_test(tc, optional_and_required);
	suite_add_tcase(s, tc);

	tc = tcase_create("extent");
	tcase_add_test(tc, bounds_against_the_buffer);
	tcase_add_test(tc, overflow_is_caught_not_wrapped);
	tcase_add_test(tc, malformed_operands_never_pass);
	tcase_add_test(tc, to_json_parses_back);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(operand_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
