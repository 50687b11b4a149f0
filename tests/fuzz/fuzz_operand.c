/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Operand: any JSON under params.x through rp_operand_parse, and
 * what the daemon then does with an accepted operand (extent, bounds
 * against a buffer size taken from the input, numel, to_json).
 * Invariants: a refusal is a named error (InvalidParameter naming "x" or
 * "x.<field>", or InvalidOperand naming "x");
 * an accepted operand has rank 1..4, dims 1..RP_DIM_MAX, an aligned offset,
 * and survives rp_operand_to_json + rp_operand_parse unchanged. */
#include <errno.h>

#include "fuzz_common.h"
#include "proto/operand.h"

static void check_refusal(int r, struct rp_error *err, const struct rp_operand *op)
{
	const cJSON *named;

	(void)op;
	fz_check_error(r, err, "rp_operand_parse");
	if (strcmp(err->name, RP_ERR_INVALID_OPERAND) == 0) {
		named = cJSON_GetObjectItemCaseSensitive(err->params, "operand");
		FZ_CHECK(cJSON_IsString(named) && strcmp(named->valuestring, "x") == 0, "InvalidOperand names another operand");
		FZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err->params, "reason")), "InvalidOperand without reason");
	} else {
		FZ_CHECK(strcmp(err->name, RP_ERR_INVALID_PARAMETER) == 0, "unexpected error %s", err->name);
		named = cJSON_GetObjectItemCaseSensitive(err->params, "parameter");
		FZ_CHECK(cJSON_IsString(named) && strncmp(named->valuestring, "x", 1) == 0 &&
			 (named->valuestring[1] == '\0' || named->valuestring[1] == '.'),
			 "InvalidParameter names %s", cJSON_IsString(named) ? named->valuestring : "(nothing)");
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rp_error err = { 0 };
	struct rp_operand op, back;
	cJSON *params, *json, *wrap;
	uint64_t begin, end, bufsize = 0;
	bool required;
	int r;

	if (size < 9)
		return 0;
	/* 8 bytes of buffer size, 1 byte of flags, then the operand's JSON. */
	memcpy(&bufsize, data, 8);
	required = data[8] & 1;
	if (data[8] & 2)
		bufsize &= 0xffffffu;
	json = fz_json(data + 9, size - 9);
	if (json == NULL)
		return 0;
	params = cJSON_CreateObject();
	cJSON_AddItemToObject(params, "x", json);

	r = rp_operand_parse(params, "x", required, &op, &err);
	if (r < 0) {
		check_refusal(r, &err, &op);
		goto out;
	}
	if (r == 1) {
		FZ_CHECK(!required && cJSON_IsNull(json), "absent operand reported for a present one");
		goto out;
	}
	FZ_CHECK(r == 0 && err.name == NULL, "odd success %d", r);
	FZ_CHECK(op.rank >= 1 && op.rank <= RP_RANK_MAX, "rank %d", op.rank);
	FZ_CHECK(op.buffer.kind == RP_ID_BUFFER, "buffer id of kind %c", op.buffer.kind);
	FZ_CHECK(op.offset % rp_dtype_size(op.dtype) == 0, "misaligned offset accepted");
	for (int i = 0; i < op.rank; i++)
		FZ_CHECK(op.shape[i] >= 1 && op.shape[i] <= RP_DIM_MAX && op.strides[i] >= 0, "dim %d out of range", i);

	r = rp_operand_extent(&op, &begin, &end);
	FZ_CHECK(r == 0 || r == -EOVERFLOW, "extent of an accepted operand: %d", r);
	if (r == 0)
		FZ_CHECK(begin == op.offset && end > begin && end - begin >= rp_dtype_size(op.dtype), "extent [%llu, %llu)",
			 (unsigned long long)begin, (unsigned long long)end);
	r = rp_operand_check_bounds(&op, "x", bufsize, &err);
	if (r < 0) {
		fz_check_error(r, &err, "rp_operand_check_bounds");
		FZ_CHECK(strcmp(err.name, RP_ERR_INVALID_OPERAND) == 0, "bounds error %s", err.name);
		rp_error_clear(&err);
	} else {
		FZ_CHECK(end <= bufsize, "operand past the end of its buffer accepted");
	}
	(void)rp_operand_numel(&op);

	/* Contiguous strides derived from a huge shape may pass 2^53, which
	 * explicit strides may not (the wire holds integers exactly only that
	 * far): such an operand cannot be written back, and needs no round trip. */
	for (int i = 0; i < op.rank; i++)
		if (op.strides[i] > (INT64_C(1) << 53))
			goto out;
	wrap = cJSON_CreateObject();
	cJSON *again = rp_operand_to_json(&op);
	FZ_CHECK(again != NULL, "to_json of an accepted operand");
	cJSON_AddItemToObject(wrap, "x", again);
	r = rp_operand_parse(wrap, "x", true, &back, &err);
	FZ_CHECK(r == 0, "operand does not survive to_json: %s", err.name ? err.name : "");
	FZ_CHECK(op.buffer.kind == back.buffer.kind && op.buffer.device == back.buffer.device &&
		 op.buffer.generation == back.buffer.generation && op.buffer.serial == back.buffer.serial &&
		 op.offset == back.offset &&
		 op.dtype == back.dtype && op.rank == back.rank, "operand changed through to_json");
	for (int i = 0; i < op.rank; i++)
		FZ_CHECK(op.shape[i] == back.shape[i] && op.strides[i] == back.strides[i], "dim %d changed", i);
	cJSON_Delete(wrap);
out:
	rp_error_clear(&err);
	cJSON_Delete(params);
	return 0;
}
