/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Comm: the collectives' tables and the codecs of the other
 * methods. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "hex.h"
#include "compute_check.h"
#include "errors.h"
#include "params.h"

/* ---- The collectives ------------------------------------------------------------ */

/* recv may be send only where the op runs in place element by element
 * (AllReduce, Broadcast); an AllGather, ReduceScatter or AllToAll whose
 * recv shares bytes with send is refused. Send and Recv have their one
 * operand in slot RP_COMM_PEER_BUF. */
#define SEND(dims) { "send", RP_ROLE_IN, true, 1, dims, RP_DTYPES_COMM, RP_NO_SLOT, RP_NO_SLOT, false, RP_NO_SLOT }
#define RECV(dims, alias, like) { "recv", RP_ROLE_OUT, true, 1, dims, RP_DTYPES_COMM, like, RP_NO_SLOT, false, alias }

static const struct rp_operand_spec in_place_operands[RP_COMM_OPERANDS] = {
	[RP_COMM_SEND] = SEND("[n]"),
	[RP_COMM_RECV] = RECV("[n]", RP_COMM_SEND, RP_COMM_SEND),
};
static const struct rp_operand_spec gather_operands[RP_COMM_OPERANDS] = {
	[RP_COMM_SEND] = SEND("[n]"),
	[RP_COMM_RECV] = RECV("[nranks * n]", RP_NO_SLOT, RP_COMM_SEND),
};
static const struct rp_operand_spec scatter_operands[RP_COMM_OPERANDS] = {
	[RP_COMM_SEND] = SEND("[nranks * n]"),
	[RP_COMM_RECV] = RECV("[n]", RP_NO_SLOT, RP_COMM_SEND),
};
static const struct rp_operand_spec all_to_all_operands[RP_COMM_OPERANDS] = {
	[RP_COMM_SEND] = SEND("[nranks * n]"),
	[RP_COMM_RECV] = RECV("[nranks * n]", RP_NO_SLOT, RP_COMM_SEND),
};
static const struct rp_operand_spec send_operands[1] = {
	[RP_COMM_PEER_BUF] = SEND("[n]"),
};
static const struct rp_operand_spec recv_operands[1] = {
	[RP_COMM_PEER_BUF] = RECV("[n]", RP_NO_SLOT, RP_NO_SLOT),
};

static const struct rp_field reduce_scalars[] = {
	{ "comm", RP_T_STRING, true },
	{ "op", RP_T_STRING, false },
	{ NULL, 0, false },
};
static const struct rp_field gather_scalars[] = {
	{ "comm", RP_T_STRING, true },
	{ NULL, 0, false },
};
static const struct rp_field broadcast_scalars[] = {
	{ "comm", RP_T_STRING, true },
	{ "root", RP_T_INT, true },
	{ NULL, 0, false },
};
static const struct rp_field peer_scalars[] = {
	{ "comm", RP_T_STRING, true },
	{ "peer", RP_T_INT, true },
	{ NULL, 0, false },
};

/* In enum rp_reduce_op order. */
static const char *const reduce_names[] = { "sum", "max", "avg", "min", "prod", NULL };

const char *rp_reduce_op_name(enum rp_reduce_op op)
{
	return (unsigned)op <= RP_REDUCE_PROD ? reduce_names[op] : NULL;
}

static int parse_comm(const cJSON *params, struct rp_comm_call *cc, struct rp_error *err)
{
	const char *text;

	if (rp_params_string(params, "comm", RP_ID_MAX - 1, NULL, &text, err) != 0)
		return rp_error_invalid_parameter(err, "comm");
	if (rp_id_parse(text, &cc->comm) < 0 || cc->comm.kind != RP_ID_COMM)
		return rp_error_invalid_parameter(err, "comm");
	return 0;
}

static int same_length(struct rp_compute *c, struct rp_error *err)
{
	const struct rp_operand *s = &c->operands[RP_COMM_SEND], *r = &c->operands[RP_COMM_RECV];

	if (s->shape[0] != r->shape[0])
		return rp_error_invalid_operand(err, "recv", "recv is %s but send is %s: they must have one length",
						rp_operand_shape_text(r).s, rp_operand_shape_text(s).s);
	return 0;
}

/* An average of integers would round where NCCL's rounds differently (or
 * refuses): the integers take sum, max, min and prod. */
static int op_fits_dtype(const struct rp_compute *c, struct rp_error *err)
{
	enum rp_dtype dt = c->operands[RP_COMM_SEND].dtype;

	if (c->comm.op == RP_REDUCE_AVG && !rp_dtype_is_float(dt)) {
		rp_error_invalid_parameter(err, "op");
		rp_error_add_str(err, "message", "op avg needs a floating-point dtype: reduce integers with sum and "
						 "divide, or convert them first");
		return -EINVAL;
	}
	return 0;
}

static int all_reduce_check(struct rp_compute *c, struct rp_error *err)
{
	int r = same_length(c, err);

	return r < 0 ? r : op_fits_dtype(c, err);
}

static int all_to_all_check(struct rp_compute *c, struct rp_error *err)
{
	return same_length(c, err);
}

/* Send's and Recv's one operand has every shape: the peer's must match,
 * which only the peers can tell. */
static int peer_check(struct rp_compute *c, struct rp_error *err)
{
	return 0;
}

static int read_reduce(const cJSON *params, struct rp_compute *c, enum rp_comm_kind kind, struct rp_error *err)
{
	int op, r;

	c->comm.kind = kind;
	if ((r = parse_comm(params, &c->comm, err)) < 0 ||
	    (r = rp_params_enum(params, "op", reduce_names, RP_REDUCE_SUM, &op, err)) < 0)
		return r;
	c->comm.op = (enum rp_reduce_op)op;
	return 0;
}

static int all_reduce_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	return read_reduce(params, c, RP_COMM_ALL_REDUCE, err);
}

static int reduce_scatter_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	return read_reduce(params, c, RP_COMM_REDUCE_SCATTER, err);
}

static int all_to_all_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	c->comm.kind = RP_COMM_ALL_TO_ALL;
	return parse_comm(params, &c->comm, err);
}

static int read_peer(const cJSON *params, struct rp_compute *c, enum rp_comm_kind kind, struct rp_error *err)
{
	uint64_t peer = 0;
	int r;

	c->comm.kind = kind;
	if ((r = parse_comm(params, &c->comm, err)) < 0)
		return r;
	r = rp_params_uint(params, "peer", RP_COMM_RANKS_MAX - 1, 0, &peer, err);
	if (r < 0)
		return r;
	if (r == 1)
		return rp_error_invalid_parameter(err, "peer");
	c->comm.peer = (uint32_t)peer;
	return 0;
}

static int send_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	return read_peer(params, c, RP_COMM_P2P_SEND, err);
}

static int recv_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	return read_peer(params, c, RP_COMM_P2P_RECV, err);
}

static int all_gather_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	c->comm.kind = RP_COMM_ALL_GATHER;
	return parse_comm(params, &c->comm, err);
}

static int broadcast_read(const cJSON *params, struct rp_compute *c, struct rp_error *err)
{
	uint64_t root = 0;
	int r;

	c->comm.kind = RP_COMM_BROADCAST;
	if ((r = parse_comm(params, &c->comm, err)) < 0)
		return r;
	r = rp_params_uint(params, "root", RP_COMM_RANKS_MAX - 1, 0, &root, err);
	if (r < 0)
		return r;
	if (r == 1)
		return rp_error_invalid_parameter(err, "root");
	c->comm.root = (uint32_t)root;
	return 0;
}

/* AllGather's and ReduceScatter's lengths depend on nranks, which only
 * the communicator knows: the worker checks them when it resolves it. */
static int lengths_checked_by_the_worker(struct rp_compute *c, struct rp_error *err)
{
	return 0;
}

static int reduce_scatter_check(struct rp_compute *c, struct rp_error *err)
{
	return op_fits_dtype(c, err);
}

static void encode_comm(const struct rp_compute *c, cJSON *params)
{
	char id[RP_ID_MAX];

	cJSON_AddStringToObject(params, "comm", rp_id_format(&c->comm.comm, id));
	if ((c->comm.kind == RP_COMM_ALL_REDUCE || c->comm.kind == RP_COMM_REDUCE_SCATTER) &&
	    c->comm.op != RP_REDUCE_SUM)
		cJSON_AddStringToObject(params, "op", reduce_names[c->comm.op]);
	if (c->comm.kind == RP_COMM_BROADCAST)
		cJSON_AddNumberToObject(params, "root", c->comm.root);
	if (c->comm.kind == RP_COMM_P2P_SEND || c->comm.kind == RP_COMM_P2P_RECV)
		cJSON_AddNumberToObject(params, "peer", c->comm.peer);
}

#define COLLECTIVE(var, short, lower, ops, scalars_, read_, check_)                                                   \
	const struct rp_op_spec var = {                                                                        \
		.id = RP_OP_COMM,                                                                              \
		.method = "io.regen.Comm." short,                                                              \
		.name = lower,                                                                                 \
		.noperands = sizeof(ops) / sizeof((ops)[0]),                                                   \
		.operands = ops,                                                                               \
		.scalars = scalars_,                                                                           \
		.read_scalars = read_,                                                                         \
		.check = check_,                                                                               \
		.encode = encode_comm,                                                                         \
	}

COLLECTIVE(rp_comm_all_reduce, "AllReduce", "all_reduce", in_place_operands, reduce_scalars, all_reduce_read,
	   all_reduce_check);
COLLECTIVE(rp_comm_all_gather, "AllGather", "all_gather", gather_operands, gather_scalars, all_gather_read,
	   lengths_checked_by_the_worker);
COLLECTIVE(rp_comm_reduce_scatter, "ReduceScatter", "reduce_scatter", scatter_operands, reduce_scalars,
	   reduce_scatter_read, reduce_scatter_check);
COLLECTIVE(rp_comm_broadcast, "Broadcast", "broadcast", in_place_operands, broadcast_scalars, broadcast_read,
	   same_length);
COLLECTIVE(rp_comm_all_to_all, "AllToAll", "all_to_all", all_to_all_operands, gather_scalars, all_to_all_read,
	   all_to_all_check);
COLLECTIVE(rp_comm_send, "Send", "send", send_operands, peer_scalars, send_read, peer_check);
COLLECTIVE(rp_comm_recv, "Recv", "recv", recv_operands, peer_scalars, recv_read, peer_check);

static const struct rp_field no_fields[] = { { NULL, 0, false } };

const struct rp_op_spec rp_comm_init_op = {
	.id = RP_OP_COMM, .method = RP_COMM_METHOD_INIT, .name = "comm_init", .scalars = no_fields,
};
const struct rp_op_spec rp_comm_destroy_op = {
	.id = RP_OP_COMM, .method = RP_COMM_METHOD_DESTROY, .name = "comm_destroy", .scalars = no_fields,
};

static const struct rp_op_spec *const collectives[] = {
	[RP_COMM_ALL_REDUCE] = &rp_comm_all_reduce,
	[RP_COMM_ALL_GATHER] = &rp_comm_all_gather,
	[RP_COMM_REDUCE_SCATTER] = &rp_comm_reduce_scatter,
	[RP_COMM_BROADCAST] = &rp_comm_broadcast,
	[RP_COMM_ALL_TO_ALL] = &rp_comm_all_to_all,
	[RP_COMM_P2P_SEND] = &rp_comm_send,
	[RP_COMM_P2P_RECV] = &rp_comm_recv,
};

const struct rp_op_spec *rp_comm_op_get(enum rp_comm_kind kind)
{
	return kind >= RP_COMM_ALL_REDUCE && kind < RP_COMM_KINDS ? collectives[kind] : NULL;
}

const struct rp_op_spec *rp_comm_op_find(const char *method)
{
	for (int k = RP_COMM_ALL_REDUCE; method && k < RP_COMM_KINDS; k++)
		if (strcmp(collectives[k]->method, method) == 0)
			return collectives[k];
	return NULL;
}

int64_t rp_comm_count(const struct rp_compute *c)
{
	int slot = c->comm.kind == RP_COMM_REDUCE_SCATTER ? RP_COMM_RECV : RP_COMM_SEND;

	return c->operands[slot].shape[0];
}

int rp_comm_check_ranks(const struct rp_compute *c, uint32_t rank, uint32_t nranks, struct rp_error *err)
{
	const struct rp_operand *s = &c->operands[RP_COMM_SEND], *r = &c->operands[RP_COMM_RECV];
	int64_t want;

	switch (c->comm.kind) {
	case RP_COMM_ALL_GATHER:
		/* Both are at most RP_DIM_MAX and nranks at most 2^16: no overflow. */
		want = s->shape[0] * (int64_t)nranks;
		if (r->shape[0] != want)
			return rp_error_invalid_operand(err, "recv",
							"recv is %s but the communicator has %u ranks of send %s: recv "
							"must be [%" PRId64 "]",
							rp_operand_shape_text(r).s, nranks, rp_operand_shape_text(s).s, want);
		return 0;
	case RP_COMM_REDUCE_SCATTER:
		want = r->shape[0] * (int64_t)nranks;
		if (s->shape[0] != want)
			return rp_error_invalid_operand(err, "send",
							"send is %s but the communicator has %u ranks of recv %s: send "
							"must be [%" PRId64 "]",
							rp_operand_shape_text(s).s, nranks, rp_operand_shape_text(r).s, want);
		return 0;
	case RP_COMM_BROADCAST:
		if (c->comm.root >= nranks)
			return rp_error_invalid_parameter(err, "root");
		return 0;
	case RP_COMM_ALL_TO_ALL:
		if (s->shape[0] % nranks != 0)
			return rp_error_invalid_operand(err, "send",
							"send is %s but the communicator has %u ranks: send and recv "
							"must be nranks blocks of one length",
							rp_operand_shape_text(s).s, nranks);
		return 0;
	case RP_COMM_P2P_SEND:
	case RP_COMM_P2P_RECV:
		/* To itself a rank would wait for itself: NCCL hangs there. */
		if (c->comm.peer >= nranks || c->comm.peer == rank)
			return rp_error_invalid_parameter(err, "peer");
		return 0;
	default:
		return 0;
	}
}

/* ---- Unique ids ---------------------------------------------------------------- */

int rp_comm_id_from_hex(const char *hex, unsigned char out[RP_COMM_ID_SIZE])
{
	return rp_hex_decode(hex, out, RP_COMM_ID_SIZE);
}

char *rp_comm_id_to_hex(const unsigned char id[RP_COMM_ID_SIZE], char out[RP_COMM_ID_HEX_LEN + 1])
{
	return rp_hex_encode(id, RP_COMM_ID_SIZE, out);
}

int rp_comm_get_unique_id_decode(const cJSON *params, struct rp_error *err)
{
	return rp_params_check(params, no_fields, err);
}

cJSON *rp_comm_unique_id_reply_encode(const unsigned char id[RP_COMM_ID_SIZE])
{
	cJSON *p = cJSON_CreateObject();
	char hex[RP_COMM_ID_HEX_LEN + 1];

	if (p == NULL || cJSON_AddStringToObject(p, "unique_id", rp_comm_id_to_hex(id, hex)) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

static int decode_unique_id(const cJSON *params, unsigned char out[RP_COMM_ID_SIZE], struct rp_error *err)
{
	const char *hex;

	if (rp_params_string(params, "unique_id", RP_COMM_ID_HEX_LEN, NULL, &hex, err) != 0 ||
	    rp_comm_id_from_hex(hex, out) < 0)
		return rp_error_invalid_parameter(err, "unique_id");
	return 0;
}

int rp_comm_unique_id_reply_decode(const cJSON *params, unsigned char out[RP_COMM_ID_SIZE], struct rp_error *err)
{
	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");
	return decode_unique_id(params, out, err);
}

/* ---- Init and Attach ------------------------------------------------------------- */

static bool key_valid(const char *key)
{
	size_t n = strlen(key);

	if (n == 0 || n > RP_COMM_KEY_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (key[i] < 0x21 || key[i] > 0x7e)
			return false;
	return true;
}

static int decode_key(const cJSON *params, bool required, char key[RP_COMM_KEY_MAX + 1], bool *has,
		      struct rp_error *err)
{
	const char *text;
	int r;

	/* Longer than the limit is refused by key_valid, not truncated. */
	r = rp_params_string(params, "key", RP_COMM_KEY_MAX + 1, NULL, &text, err);
	if (r < 0 || (r == 1 && required))
		return rp_error_invalid_parameter(err, "key");
	*has = r == 0;
	if (r == 1)
		return 0;
	if (!key_valid(text))
		return rp_error_invalid_parameter(err, "key");
	snprintf(key, RP_COMM_KEY_MAX + 1, "%s", text);
	return 0;
}

static int decode_deadline(const cJSON *params, uint32_t *deadline_ms, struct rp_error *err)
{
	uint64_t v = 0;
	int r = rp_params_uint(params, "deadline_ms", RP_DEADLINE_MS_MAX, 0, &v, err);

	if (r < 0)
		return r;
	if (r == 0 && v == 0)
		return rp_error_invalid_parameter(err, "deadline_ms");
	*deadline_ms = (uint32_t)v;
	return 0;
}

int rp_comm_init_decode(const cJSON *params, struct rp_comm_init *out, struct rp_error *err)
{
	static const struct rp_field fields[] = {
		{ "unique_id", RP_T_STRING, true },
		{ "rank", RP_T_INT, true },
		{ "nranks", RP_T_INT, true },
		{ "key", RP_T_STRING, false },
		{ "deadline_ms", RP_T_INT, false },
		{ NULL },
	};
	uint64_t rank, nranks;
	int r;

	memset(out, 0, sizeof(*out));
	if ((r = rp_params_check(params, fields, err)) < 0 || (r = decode_unique_id(params, out->unique_id, err)) < 0)
		goto fail;
	if (rp_params_uint(params, "nranks", RP_COMM_RANKS_MAX, 0, &nranks, err) != 0 || nranks == 0) {
		r = rp_error_invalid_parameter(err, "nranks");
		goto fail;
	}
	if (rp_params_uint(params, "rank", RP_COMM_RANKS_MAX, 0, &rank, err) != 0 || rank >= nranks) {
		r = rp_error_invalid_parameter(err, "rank");
		goto fail;
	}
	out->rank = (uint32_t)rank;
	out->nranks = (uint32_t)nranks;
	if ((r = decode_key(params, false, out->key, &out->has_key, err)) < 0 ||
	    (r = decode_deadline(params, &out->deadline_ms, err)) < 0)
		goto fail;
	return 0;
fail:
	memset(out, 0, sizeof(*out));
	return r;
}

cJSON *rp_comm_init_encode(const struct rp_comm_init *req)
{
	cJSON *p = cJSON_CreateObject();
	char hex[RP_COMM_ID_HEX_LEN + 1];

	if (p == NULL || cJSON_AddStringToObject(p, "unique_id", rp_comm_id_to_hex(req->unique_id, hex)) == NULL ||
	    cJSON_AddNumberToObject(p, "rank", req->rank) == NULL ||
	    cJSON_AddNumberToObject(p, "nranks", req->nranks) == NULL ||
	    (req->has_key && cJSON_AddStringToObject(p, "key", req->key) == NULL) ||
	    (req->deadline_ms && cJSON_AddNumberToObject(p, "deadline_ms", req->deadline_ms) == NULL)) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

int rp_comm_attach_decode(const cJSON *params, char key[RP_COMM_KEY_MAX + 1], struct rp_error *err)
{
	static const struct rp_field fields[] = { { "key", RP_T_STRING, true }, { NULL } };
	bool has;

	key[0] = '\0';
	if (rp_params_check(params, fields, err) < 0)
		return -EINVAL;
	return decode_key(params, true, key, &has, err);
}

cJSON *rp_comm_attach_encode(const char *key)
{
	cJSON *p = cJSON_CreateObject();

	if (p == NULL || cJSON_AddStringToObject(p, "key", key) == NULL) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

cJSON *rp_comm_reply_encode(const struct rp_comm_reply *reply)
{
	cJSON *p = cJSON_CreateObject();
	char id[RP_ID_MAX];

	if (p == NULL || cJSON_AddStringToObject(p, "comm", rp_id_format(&reply->comm, id)) == NULL ||
	    cJSON_AddNumberToObject(p, "generation", (double)reply->comm.generation) == NULL ||
	    cJSON_AddNumberToObject(p, "rank", reply->rank) == NULL ||
	    cJSON_AddNumberToObject(p, "nranks", reply->nranks) == NULL ||
	    (reply->has_collectives && cJSON_AddNumberToObject(p, "collectives", (double)reply->collectives) == NULL)) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}

int rp_comm_reply_decode(const cJSON *params, struct rp_comm_reply *out, struct rp_error *err)
{
	uint64_t gen, rank, nranks;
	const char *text;
	int r;

	memset(out, 0, sizeof(*out));
	if (!cJSON_IsObject(params))
		return rp_error_invalid_parameter(err, "parameters");
	if (rp_params_string(params, "comm", RP_ID_MAX - 1, NULL, &text, err) != 0 || rp_id_parse(text, &out->comm) < 0 ||
	    out->comm.kind != RP_ID_COMM)
		return rp_error_invalid_parameter(err, "comm");
	if (rp_params_uint(params, "generation", UINT64_MAX, 0, &gen, err) != 0 || gen != out->comm.generation)
		return rp_error_invalid_parameter(err, "generation");
	if (rp_params_uint(params, "nranks", RP_COMM_RANKS_MAX, 0, &nranks, err) != 0 || nranks == 0)
		return rp_error_invalid_parameter(err, "nranks");
	if (rp_params_uint(params, "rank", RP_COMM_RANKS_MAX, 0, &rank, err) != 0 || rank >= nranks)
		return rp_error_invalid_parameter(err, "rank");
	out->rank = (uint32_t)rank;
	out->nranks = (uint32_t)nranks;
	r = rp_params_uint(params, "collectives", UINT64_MAX, 0, &out->collectives, err);
	if (r < 0)
		return r;
	out->has_collectives = r == 0;
	return 0;
}

/* ---- Abort and Destroy ---------------------------------------------------------- */

int rp_comm_end_decode(const cJSON *params, bool destroy, struct rp_comm_end *out, struct rp_error *err)
{
	static const struct rp_field abort_fields[] = { { "comm", RP_T_STRING, true }, { NULL } };
	static const struct rp_field destroy_fields[] = {
		{ "comm", RP_T_STRING, true },
		{ "abort", RP_T_BOOL, false },
		{ "deadline_ms", RP_T_INT, false },
		{ NULL },
	};
	const char *text;
	int r;

	memset(out, 0, sizeof(*out));
	if ((r = rp_params_check(params, destroy ? destroy_fields : abort_fields, err)) < 0)
		goto fail;
	/* Any id kind passes: the worker answers that no such communicator is
	 * the caller's, as CloseBuffer does for an event's id. */
	if (rp_params_string(params, "comm", RP_ID_MAX - 1, NULL, &text, err) != 0 || rp_id_parse(text, &out->comm) < 0) {
		r = rp_error_invalid_parameter(err, "comm");
		goto fail;
	}
	if (destroy && ((r = rp_params_bool(params, "abort", false, &out->abort, err)) < 0 ||
			(r = decode_deadline(params, &out->deadline_ms, err)) < 0))
		goto fail;
	return 0;
fail:
	memset(out, 0, sizeof(*out));
	return r;
}

cJSON *rp_comm_end_encode(const struct rp_comm_end *req, bool destroy)
{
	cJSON *p = cJSON_CreateObject();
	char id[RP_ID_MAX];

	if (p == NULL || cJSON_AddStringToObject(p, "comm", rp_id_format(&req->comm, id)) == NULL ||
	    (destroy && req->abort && cJSON_AddTrueToObject(p, "abort") == NULL) ||
	    (destroy && req->deadline_ms && cJSON_AddNumberToObject(p, "deadline_ms", req->deadline_ms) == NULL)) {
		cJSON_Delete(p);
		return NULL;
	}
	return p;
}
