/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Comm's messages (proto/comm.h): the collectives' tables held to
 * the IDL as the compute tables are, what a collective's parse refuses, the
 * checks that need the communicator, and the codecs of GetUniqueId, Init,
 * Attach, Abort and Destroy (what one side encodes the other decodes to
 * the same struct; every refusal names the field). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/comm.h"
#include "proto/errors.h"
#include "proto/idl.h"
#include "op_table_idl.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static cJSON *json(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	ck_assert_msg(j != NULL, "test JSON does not parse: %s", text);
	return j;
}

/* err is `name`, and its parameter `key` (when given) the string `value`. */
static void assert_error(struct rp_error *err, const char *name, const char *key, const char *value)
{
	const cJSON *p;

	ck_assert_ptr_nonnull(err->name);
	ck_assert_msg(strcmp(err->name, name) == 0, "got %s, want %s", err->name, name);
	if (key) {
		p = cJSON_GetObjectItemCaseSensitive(err->params, key);
		ck_assert_msg(cJSON_IsString(p), "%s lacks %s", name, key);
		ck_assert_msg(strcmp(p->valuestring, value) == 0, "%s: %s is %s, want %s", name, key, p->valuestring,
			      value);
	}
	rp_error_clear(err);
}

/* ---- The tables against the IDL ----------------------------------------------- */

static const struct rp_op_spec *const specs[] = {
	&rp_comm_all_reduce, &rp_comm_all_gather, &rp_comm_reduce_scatter, &rp_comm_broadcast,
	&rp_comm_all_to_all, &rp_comm_send, &rp_comm_recv,
};

/* Each collective's parameters in the IDL are exactly its table's, with
 * the same optionality. */
START_TEST(every_collective_table_matches_its_method)
{
	const struct rp_op_spec *spec = specs[_i];

	ck_assert_ptr_eq(rp_comm_op_find(spec->method), spec);
	ck_assert_ptr_null(rp_op_find(spec->method));   /* not in the compute table */
	ck_assert_int_eq(spec->id, RP_OP_COMM);
	op_table_matches_idl(spec, "io.regen.Comm");
}
END_TEST

/* The parameters one IDL method lists, as "a,b?,c" (? = optional). */
static void idl_params(const char *method, char *out, size_t size)
{
	const char *text = rp_interface_description("io.regen.Comm");
	char opener[96];
	const char *p;
	size_t n = 0;

	snprintf(opener, sizeof(opener), "\nmethod %s(", method);
	p = strstr(text, opener);
	ck_assert_msg(p != NULL, "no method %s", method);
	p += strlen(opener);
	out[0] = '\0';
	while (*p && *p != ')') {
		size_t len;

		p += strspn(p, " \n\t,");
		if (*p == ')')
			break;
		len = strcspn(p, ":");
		n += (size_t)snprintf(out + n, size - n, "%s%.*s", n ? "," : "", (int)len, p);
		p += len + 1;
		p += strspn(p, " ");
		if (*p == '?')
			n += (size_t)snprintf(out + n, size - n, "?");
		p += strcspn(p, ",)");
	}
}

/* The hand-written codecs take what the IDL lists: the field lists are
 * written out here once more, so a change to either shows. */
START_TEST(the_other_methods_match_the_idl)
{
	char got[256];

	idl_params("GetUniqueId", got, sizeof(got));
	ck_assert_str_eq(got, "");
	idl_params("Init", got, sizeof(got));
	ck_assert_str_eq(got, "unique_id,rank,nranks,key?,deadline_ms?");
	idl_params("Attach", got, sizeof(got));
	ck_assert_str_eq(got, "key");
	idl_params("Abort", got, sizeof(got));
	ck_assert_str_eq(got, "comm");
	idl_params("Destroy", got, sizeof(got));
	ck_assert_str_eq(got, "comm,abort?,deadline_ms?");
}
END_TEST

/* ---- Collectives ----------------------------------------------------------------- */

struct parse_case {
	const struct rp_op_spec *spec;
	const char *params;
	const char *error;      /* NULL: accepted */
	const char *key, *value;
};

#define B0 "\"buffer\":\"b0.1.1\""
#define B1 "\"buffer\":\"b0.1.2\""
#define OP(buf, off, dt, n) "{" buf ",\"offset\":" #off ",\"dtype\":\"" dt "\",\"shape\":[" #n "]}"

static const struct parse_case parse_cases[] = {
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 16) ",\"recv\":" OP(B1, 0, "f32", 16) "}" },
	/* In place: recv is send. */
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"max\",\"send\":" OP(B0, 0, "bf16", 8) ",\"recv\":" OP(B0, 0, "bf16", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"avg\",\"send\":" OP(B0, 0, "f16", 8) ",\"recv\":" OP(B0, 64, "f16", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"min\",\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"prod\",\"send\":" OP(B0, 0, "i64", 8) ",\"recv\":" OP(B1, 0, "i64", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f64", 8) ",\"recv\":" OP(B0, 0, "f64", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"max\",\"send\":" OP(B0, 0, "i32", 8) ",\"recv\":" OP(B1, 0, "i32", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "u8", 8) ",\"recv\":" OP(B1, 0, "u8", 8) "}" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"band\",\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "op" },
	/* An average of integers is refused: NCCL would round its own way. */
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"op\":\"avg\",\"send\":" OP(B0, 0, "i64", 8) ",\"recv\":" OP(B1, 0, "i64", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "op" },
	{ &rp_comm_reduce_scatter, "{\"comm\":\"c0.1.5\",\"op\":\"avg\",\"send\":" OP(B0, 0, "i32", 16) ",\"recv\":" OP(B1, 0, "i32", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "op" },
	/* fp8 is not a communicator's dtype. */
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "e4m3", 8) ",\"recv\":" OP(B1, 0, "e4m3", 8) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "send" },
	{ &rp_comm_all_reduce, "{\"comm\":\"b0.1.5\",\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "comm" },
	{ &rp_comm_all_reduce, "{\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "comm" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 9) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "recv" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f16", 8) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "recv" },
	/* Overlapping without being the same tensor. */
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B0, 4, "f32", 8) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "send" },
	/* Rank 2 is not a collective's operand. */
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":{" B0 ",\"dtype\":\"f32\",\"shape\":[2,2]},\"recv\":" OP(B1, 0, "f32", 4) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "send" },
	/* Not contiguous. */
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"send\":{" B0 ",\"dtype\":\"f32\",\"shape\":[4],\"strides\":[2]},\"recv\":" OP(B1, 0, "f32", 4) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "send" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"root\":0,\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "root" },
	{ &rp_comm_all_reduce, "{\"comm\":\"c0.1.5\",\"deadline_ms\":0,\"send\":" OP(B0, 0, "f32", 8) ",\"recv\":" OP(B1, 0, "f32", 8) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "deadline_ms" },
	{ &rp_comm_all_gather, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 16) "}" },
	{ &rp_comm_all_gather, "{\"comm\":\"c0.1.5\",\"op\":\"sum\",\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 16) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "op" },
	/* AllGather's recv may not be its send. */
	{ &rp_comm_all_gather, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B0, 0, "f32", 4) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "recv" },
	{ &rp_comm_reduce_scatter, "{\"comm\":\"c0.1.5\",\"op\":\"avg\",\"send\":" OP(B0, 0, "bf16", 16) ",\"recv\":" OP(B1, 0, "bf16", 4) "}" },
	{ &rp_comm_broadcast, "{\"comm\":\"c0.1.5\",\"root\":3,\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B0, 0, "f32", 4) "}" },
	{ &rp_comm_broadcast, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 4) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "root" },
	{ &rp_comm_broadcast, "{\"comm\":\"c0.1.5\",\"root\":-1,\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 4) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "root" },
	{ &rp_comm_all_to_all, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "i64", 16) ",\"recv\":" OP(B1, 0, "i64", 16) "}" },
	{ &rp_comm_all_to_all, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 16) ",\"recv\":" OP(B1, 0, "f32", 8) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "recv" },
	{ &rp_comm_all_to_all, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 16) ",\"recv\":" OP(B0, 0, "f32", 16) "}",
	  RP_ERR_INVALID_OPERAND, "operand", "recv" },
	{ &rp_comm_send, "{\"comm\":\"c0.1.5\",\"peer\":1,\"send\":" OP(B0, 0, "bf16", 16) "}" },
	{ &rp_comm_recv, "{\"comm\":\"c0.1.5\",\"peer\":0,\"recv\":" OP(B0, 0, "bf16", 16) "}" },
	{ &rp_comm_send, "{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 16) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "peer" },
	/* Send takes no recv, Recv no send. */
	{ &rp_comm_send, "{\"comm\":\"c0.1.5\",\"peer\":1,\"send\":" OP(B0, 0, "f32", 16) ",\"recv\":" OP(B1, 0, "f32", 16) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "recv" },
	{ &rp_comm_recv, "{\"comm\":\"c0.1.5\",\"peer\":1,\"send\":" OP(B0, 0, "f32", 16) "}",
	  RP_ERR_INVALID_PARAMETER, NULL, NULL },
	{ &rp_comm_broadcast, "{\"comm\":\"c0.1.5\",\"root\":65536,\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 4) "}",
	  RP_ERR_INVALID_PARAMETER, "parameter", "root" },
};

START_TEST(collectives_parse)
{
	const struct parse_case *t = &parse_cases[_i];
	cJSON *p = json(t->params);
	struct rp_error err = { 0 };
	struct rp_compute c;
	int r = rp_compute_parse(t->spec, p, &c, &err);

	if (!t->error) {
		ck_assert_msg(r == 0, "case %d refused: %s", _i, err.name ? err.name : "?");
		ck_assert_ptr_eq(c.spec, t->spec);
		ck_assert(rp_comm_is_collective(&c));
		ck_assert_int_eq(c.comm.comm.kind, RP_ID_COMM);
		ck_assert_uint_eq(c.comm.comm.serial, 5);
		/* What the client encodes parses back to the same call. */
		cJSON *again = rp_compute_to_json(&c);
		struct rp_compute c2;
		ck_assert_int_eq(rp_compute_parse(t->spec, again, &c2, &err), 0);
		ck_assert_int_eq(c2.comm.kind, c.comm.kind);
		ck_assert_int_eq(c2.comm.op, c.comm.op);
		ck_assert_uint_eq(c2.comm.root, c.comm.root);
		ck_assert_uint_eq(c2.comm.peer, c.comm.peer);
		ck_assert_int_eq(rp_comm_count(&c2), rp_comm_count(&c));
		cJSON_Delete(again);
	} else {
		ck_assert_msg(r < 0, "case %d accepted", _i);
		ck_assert_ptr_null(c.spec);
		assert_error(&err, t->error, t->key, t->value);
	}
	cJSON_Delete(p);
}
END_TEST

START_TEST(the_communicator_decides_lengths_and_root)
{
	struct rp_error err = { 0 };
	struct rp_compute c;
	cJSON *p;

	p = json("{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 16) "}");
	ck_assert_int_eq(rp_compute_parse(&rp_comm_all_gather, p, &c, &err), 0);
	ck_assert_int_eq(rp_comm_count(&c), 4);
	ck_assert_int_eq(rp_comm_check_ranks(&c, 0, 4, &err), 0);
	ck_assert_int_lt(rp_comm_check_ranks(&c, 0, 2, &err), 0);
	assert_error(&err, RP_ERR_INVALID_OPERAND, "operand", "recv");
	cJSON_Delete(p);

	p = json("{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 16) ",\"recv\":" OP(B1, 0, "f32", 8) "}");
	ck_assert_int_eq(rp_compute_parse(&rp_comm_reduce_scatter, p, &c, &err), 0);
	ck_assert_int_eq(rp_comm_count(&c), 8);
	ck_assert_int_eq(rp_comm_check_ranks(&c, 0, 2, &err), 0);
	ck_assert_int_lt(rp_comm_check_ranks(&c, 0, 1, &err), 0);
	assert_error(&err, RP_ERR_INVALID_OPERAND, "operand", "send");
	cJSON_Delete(p);

	p = json("{\"comm\":\"c0.1.5\",\"root\":1,\"send\":" OP(B0, 0, "f32", 4) ",\"recv\":" OP(B1, 0, "f32", 4) "}");
	ck_assert_int_eq(rp_compute_parse(&rp_comm_broadcast, p, &c, &err), 0);
	ck_assert_int_eq(rp_comm_check_ranks(&c, 0, 2, &err), 0);
	ck_assert_int_lt(rp_comm_check_ranks(&c, 0, 1, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "root");
	cJSON_Delete(p);

	/* AllToAll: nranks blocks of one length. */
	p = json("{\"comm\":\"c0.1.5\",\"send\":" OP(B0, 0, "f32", 12) ",\"recv\":" OP(B1, 0, "f32", 12) "}");
	ck_assert_int_eq(rp_compute_parse(&rp_comm_all_to_all, p, &c, &err), 0);
	ck_assert_int_eq(rp_comm_count(&c), 12);
	ck_assert_int_eq(rp_comm_check_ranks(&c, 0, 3, &err), 0);
	ck_assert_int_lt(rp_comm_check_ranks(&c, 0, 5, &err), 0);
	assert_error(&err, RP_ERR_INVALID_OPERAND, "operand", "send");
	cJSON_Delete(p);

	/* A peer below nranks, and not the caller. */
	p = json("{\"comm\":\"c0.1.5\",\"peer\":1,\"recv\":" OP(B0, 0, "f32", 4) "}");
	ck_assert_int_eq(rp_compute_parse(&rp_comm_recv, p, &c, &err), 0);
	ck_assert_int_eq(rp_comm_count(&c), 4);
	ck_assert_int_eq(rp_comm_check_ranks(&c, 0, 2, &err), 0);
	ck_assert_int_lt(rp_comm_check_ranks(&c, 1, 2, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "peer");
	ck_assert_int_lt(rp_comm_check_ranks(&c, 0, 1, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "peer");
	cJSON_Delete(p);
}
END_TEST

/* ---- Unique ids, Init, Attach ------------------------------------------------------ */

static void sample_id(unsigned char id[RP_COMM_ID_SIZE])
{
	for (int i = 0; i < RP_COMM_ID_SIZE; i++)
		id[i] = (unsigned char)(i * 7 + 1);
}

START_TEST(unique_ids_round_trip)
{
	unsigned char id[RP_COMM_ID_SIZE], back[RP_COMM_ID_SIZE];
	char hex[RP_COMM_ID_HEX_LEN + 1], bad[RP_COMM_ID_HEX_LEN + 2];
	struct rp_error err = { 0 };
	cJSON *p;

	sample_id(id);
	rp_comm_id_to_hex(id, hex);
	ck_assert_uint_eq(strlen(hex), RP_COMM_ID_HEX_LEN);
	ck_assert_int_eq(rp_comm_id_from_hex(hex, back), 0);
	ck_assert_mem_eq(id, back, RP_COMM_ID_SIZE);
	snprintf(bad, sizeof(bad), "%s0", hex);
	ck_assert_int_lt(rp_comm_id_from_hex(bad, back), 0);
	memcpy(bad, hex, sizeof(hex));
	bad[5] = 'g';
	ck_assert_int_lt(rp_comm_id_from_hex(bad, back), 0);
	ck_assert_int_lt(rp_comm_id_from_hex(NULL, back), 0);

	p = rp_comm_unique_id_reply_encode(id);
	memset(back, 0, sizeof(back));
	ck_assert_int_eq(rp_comm_unique_id_reply_decode(p, back, &err), 0);
	ck_assert_mem_eq(id, back, RP_COMM_ID_SIZE);
	cJSON_Delete(p);

	p = json("{}");
	ck_assert_int_eq(rp_comm_get_unique_id_decode(p, &err), 0);
	cJSON_Delete(p);
	p = json("{\"device\":0}");
	ck_assert_int_lt(rp_comm_get_unique_id_decode(p, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "device");
	cJSON_Delete(p);
}
END_TEST

START_TEST(init_round_trips)
{
	struct rp_comm_init in = { .rank = 3, .nranks = 8, .has_key = true, .key = "job42/rank3", .deadline_ms = 5000 };
	struct rp_comm_init out;
	struct rp_error err = { 0 };
	cJSON *p;

	sample_id(in.unique_id);
	p = rp_comm_init_encode(&in);
	ck_assert_int_eq(rp_comm_init_decode(p, &out, &err), 0);
	ck_assert_mem_eq(out.unique_id, in.unique_id, RP_COMM_ID_SIZE);
	ck_assert_uint_eq(out.rank, 3);
	ck_assert_uint_eq(out.nranks, 8);
	ck_assert(out.has_key);
	ck_assert_str_eq(out.key, "job42/rank3");
	ck_assert_uint_eq(out.deadline_ms, 5000);
	cJSON_Delete(p);

	in.has_key = false;
	in.deadline_ms = 0;
	p = rp_comm_init_encode(&in);
	ck_assert_int_eq(rp_comm_init_decode(p, &out, &err), 0);
	ck_assert(!out.has_key);
	ck_assert_uint_eq(out.deadline_ms, 0);
	cJSON_Delete(p);
}
END_TEST

/* Init with one field replaced: the field it must name. */
struct init_bad {
	const char *field;      /* to set or delete (value NULL) */
	const char *value;      /* JSON */
	const char *named;
};

static const struct init_bad init_bad_cases[] = {
	{ "unique_id", NULL, "unique_id" },
	{ "unique_id", "\"abcd\"", "unique_id" },
	{ "unique_id", "7", "unique_id" },
	{ "nranks", "0", "nranks" },
	{ "nranks", "65537", "nranks" },
	{ "nranks", "-1", "nranks" },
	{ "nranks", "1.5", "nranks" },
	{ "rank", "8", "rank" },
	{ "rank", "-1", "rank" },
	{ "rank", NULL, "rank" },
	{ "key", "\"\"", "key" },
	{ "key", "\"has space\"", "key" },
	{ "key", "\"tab\\there\"", "key" },
	{ "key", "\"\\u00e9t\\u00e9\"", "key" },
	{ "key", "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"", "key" },
	{ "key", "1", "key" },
	{ "deadline_ms", "0", "deadline_ms" },
	{ "deadline_ms", "86400001", "deadline_ms" },
	{ "extra", "1", "extra" },
};

START_TEST(init_refuses)
{
	const struct init_bad *t = &init_bad_cases[_i];
	struct rp_comm_init in = { .rank = 3, .nranks = 8, .has_key = true, .key = "k" }, out;
	struct rp_error err = { 0 };
	cJSON *p;

	sample_id(in.unique_id);
	p = rp_comm_init_encode(&in);
	cJSON_DeleteItemFromObject(p, t->field);
	if (t->value)
		cJSON_AddItemToObject(p, t->field, json(t->value));
	ck_assert_int_lt(rp_comm_init_decode(p, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", t->named);
	ck_assert_uint_eq(out.nranks, 0);   /* a refused struct is zeroed */
	cJSON_Delete(p);
}
END_TEST

START_TEST(a_key_of_128_characters_is_the_longest)
{
	char key[RP_COMM_KEY_MAX + 1], out[RP_COMM_KEY_MAX + 1];
	struct rp_error err = { 0 };
	cJSON *p;

	memset(key, 'k', RP_COMM_KEY_MAX);
	key[RP_COMM_KEY_MAX] = '\0';
	p = rp_comm_attach_encode(key);
	ck_assert_int_eq(rp_comm_attach_decode(p, out, &err), 0);
	ck_assert_str_eq(out, key);
	cJSON_Delete(p);
	p = json("{}");
	ck_assert_int_lt(rp_comm_attach_decode(p, out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "key");
	cJSON_Delete(p);
}
END_TEST

START_TEST(replies_round_trip)
{
	struct rp_comm_reply in = { .comm = { RP_ID_COMM, 1, 4, 99 }, .rank = 1, .nranks = 2 }, out;
	struct rp_error err = { 0 };
	cJSON *p;

	p = rp_comm_reply_encode(&in);
	ck_assert_int_eq(rp_comm_reply_decode(p, &out, &err), 0);
	ck_assert_int_eq(out.comm.kind, RP_ID_COMM);
	ck_assert_uint_eq(out.comm.serial, 99);
	ck_assert_uint_eq(out.comm.generation, 4);
	ck_assert(!out.has_collectives);
	ck_assert_uint_eq(out.rank, 1);
	cJSON_Delete(p);

	in.has_collectives = true;
	in.collectives = 12345;
	p = rp_comm_reply_encode(&in);
	ck_assert_int_eq(rp_comm_reply_decode(p, &out, &err), 0);
	ck_assert(out.has_collectives);
	ck_assert_uint_eq(out.collectives, 12345);
	/* A generation that is not the id's. */
	cJSON_ReplaceItemInObject(p, "generation", cJSON_CreateNumber(5));
	ck_assert_int_lt(rp_comm_reply_decode(p, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "generation");
	cJSON_Delete(p);

	p = json("{\"comm\":\"b1.4.99\",\"generation\":4,\"rank\":0,\"nranks\":1}");
	ck_assert_int_lt(rp_comm_reply_decode(p, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "comm");
	cJSON_Delete(p);
	p = json("{\"comm\":\"c1.4.99\",\"generation\":4,\"rank\":1,\"nranks\":1}");
	ck_assert_int_lt(rp_comm_reply_decode(p, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "rank");
	cJSON_Delete(p);
}
END_TEST

START_TEST(abort_and_destroy_round_trip)
{
	struct rp_comm_end in = { .comm = { RP_ID_COMM, 0, 2, 7 }, .abort = true, .deadline_ms = 100 }, out;
	struct rp_error err = { 0 };
	cJSON *p;

	p = rp_comm_end_encode(&in, true);
	ck_assert_int_eq(rp_comm_end_decode(p, true, &out, &err), 0);
	ck_assert(out.abort);
	ck_assert_uint_eq(out.deadline_ms, 100);
	ck_assert_uint_eq(out.comm.serial, 7);
	/* Abort takes only the id. */
	ck_assert_int_lt(rp_comm_end_decode(p, false, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "abort");
	cJSON_Delete(p);

	p = rp_comm_end_encode(&in, false);
	ck_assert_int_eq(rp_comm_end_decode(p, false, &out, &err), 0);
	ck_assert(!out.abort);
	cJSON_Delete(p);

	/* Another kind of id passes: the worker says it names no communicator. */
	p = json("{\"comm\":\"b0.1.1\"}");
	ck_assert_int_eq(rp_comm_end_decode(p, false, &out, &err), 0);
	ck_assert_int_eq(out.comm.kind, RP_ID_BUFFER);
	cJSON_Delete(p);
	p = json("{\"comm\":\"c0.0.1\"}");
	ck_assert_int_lt(rp_comm_end_decode(p, false, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "comm");
	cJSON_Delete(p);
	p = json("{\"comm\":\"c0.1.1\",\"abort\":1}");
	ck_assert_int_lt(rp_comm_end_decode(p, true, &out, &err), 0);
	assert_error(&err, RP_ERR_INVALID_PARAMETER, "parameter", "abort");
	cJSON_Delete(p);
}
END_TEST

static Suite *comm_suite(void)
{
	Suite *s = suite_create("comm_codec");
	TCase *tc = tcase_create("comm");

	tcase_add_loop_test(tc, every_collective_table_matches_its_method, 0, N(specs));
	tcase_add_test(tc, the_other_methods_match_the_idl);
	tcase_add_loop_test(tc, collectives_parse, 0, N(parse_cases));
	tcase_add_test(tc, the_communicator_decides_lengths_and_root);
	tcase_add_test(tc, unique_ids_round_trip);
	tcase_add_test(tc, init_round_trips);
	tcase_add_loop_test(tc, init_refuses, 0, N(init_bad_cases));
	tcase_add_test(tc, a_key_of_128_characters_is_the_longest);
	tcase_add_test(tc, replies_round_trip);
	tcase_add_test(tc, abort_and_destroy_round_trip);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(comm_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
