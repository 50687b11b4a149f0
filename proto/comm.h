/* SPDX-License-Identifier: Apache-2.0 */
/* io.regen.Comm's messages: the collectives as op tables (the machinery of
 * compute.h parses and checks them: operands, events, deadline), and the
 * codecs of GetUniqueId, Init, Attach, Abort and Destroy.
 *
 * A collective's operands are rank-1 contiguous tensors `send` and `recv`
 * of one dtype (Send has only send, Recv only recv). What parsing alone can check it checks (the shapes of
 * AllReduce and Broadcast agree, recv is send only where the op runs in
 * place, the reduction, the root's range); what needs the communicator
 * (nranks, rank) rp_comm_check_ranks says once the worker resolved it, and
 * the bounds the worker checks against the buffers: all before any work. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "compute.h"
#include "ids.h"
#include "message.h"

#define RP_COMM_METHOD_GET_UNIQUE_ID "io.regen.Comm.GetUniqueId"
#define RP_COMM_METHOD_INIT   "io.regen.Comm.Init"
#define RP_COMM_METHOD_ATTACH "io.regen.Comm.Attach"
#define RP_COMM_METHOD_ABORT  "io.regen.Comm.Abort"
#define RP_COMM_METHOD_DESTROY "io.regen.Comm.Destroy"

#define RP_COMM_ID_HEX_LEN (2 * RP_COMM_ID_SIZE)
/* The most ranks a communicator may have. */
#define RP_COMM_RANKS_MAX 65536u
/* A re-attach key: 1 to this many printable ASCII characters, no space. */
#define RP_COMM_KEY_MAX 128

/* Operand slots of every collective; Send and Recv have one operand, send
 * or recv, in slot RP_COMM_PEER_BUF. */
enum { RP_COMM_SEND = 0, RP_COMM_RECV, RP_COMM_OPERANDS };
#define RP_COMM_PEER_BUF 0

extern const struct rp_op_spec rp_comm_all_reduce, rp_comm_all_gather, rp_comm_reduce_scatter, rp_comm_broadcast,
	rp_comm_all_to_all, rp_comm_send, rp_comm_recv;
/* Tags for the lane work of Init and Destroy (no operands; never parsed
 * through the table): what logs and the deadline watch name. */
extern const struct rp_op_spec rp_comm_init_op, rp_comm_destroy_op;

/* The collective's table by method name ("io.regen.Comm.AllReduce"); NULL
 * when none. */
const struct rp_op_spec *rp_comm_op_find(const char *method);
/* By kind: RP_COMM_ALL_REDUCE .. RP_COMM_P2P_RECV; NULL otherwise. */
const struct rp_op_spec *rp_comm_op_get(enum rp_comm_kind kind);
/* "sum", "max", "avg", "min", "prod". */
const char *rp_reduce_op_name(enum rp_reduce_op op);
/* Whether the call is a collective or a Send or Recv (not Init or
 * Destroy): what a communicator counts and its peers must match. */
static inline bool rp_comm_is_collective(const struct rp_compute *c)
{
	return c->spec && c->spec->id == RP_OP_COMM && c->comm.kind >= RP_COMM_ALL_REDUCE;
}

/* What the communicator decides: AllGather's recv is nranks times send,
 * ReduceScatter's send nranks times recv, AllToAll's send nranks blocks,
 * Broadcast's root below nranks, a Send's or Recv's peer below nranks and
 * not `rank` itself. InvalidOperand {operand} or InvalidParameter {root,
 * peer}; 0 when they agree. */
int rp_comm_check_ranks(const struct rp_compute *c, uint32_t rank, uint32_t nranks, struct rp_error *err);
/* Elements each rank sends: send's length, or recv's for ReduceScatter
 * (AllToAll: all nranks blocks; Send and Recv: their one operand's). */
int64_t rp_comm_count(const struct rp_compute *c);

/* 256 hex digits, either case, into 128 bytes; 0 or -EINVAL. */
int rp_comm_id_from_hex(const char *hex, unsigned char out[RP_COMM_ID_SIZE]);
char *rp_comm_id_to_hex(const unsigned char id[RP_COMM_ID_SIZE], char out[RP_COMM_ID_HEX_LEN + 1]);

/* GetUniqueId takes nothing (InvalidParameter for any field); its reply. */
int rp_comm_get_unique_id_decode(const cJSON *params, struct rp_error *err);
cJSON *rp_comm_unique_id_reply_encode(const unsigned char id[RP_COMM_ID_SIZE]);
int rp_comm_unique_id_reply_decode(const cJSON *params, unsigned char out[RP_COMM_ID_SIZE], struct rp_error *err);

/* Init's parameters. */
struct rp_comm_init {
	unsigned char unique_id[RP_COMM_ID_SIZE];
	uint32_t rank, nranks;
	bool has_key;
	char key[RP_COMM_KEY_MAX + 1];
	uint32_t deadline_ms;        /* 0: not given */
};
/* Refuses, with InvalidParameter naming the field: a unique_id that is not
 * 256 hex digits, nranks of 0 or past RP_COMM_RANKS_MAX, rank not below
 * nranks, a key empty, too long or with a character that is not printable
 * ASCII or is a space, deadline_ms of 0 or past a day, unknown fields. */
int rp_comm_init_decode(const cJSON *params, struct rp_comm_init *out, struct rp_error *err);
cJSON *rp_comm_init_encode(const struct rp_comm_init *req);

/* Attach's parameters: the key, checked as Init's. */
int rp_comm_attach_decode(const cJSON *params, char key[RP_COMM_KEY_MAX + 1], struct rp_error *err);
cJSON *rp_comm_attach_encode(const char *key);

/* The reply of Init and of Attach (which also says `collectives`). */
struct rp_comm_reply {
	struct rp_id comm;           /* kind RP_ID_COMM; its generation is the reply's */
	uint32_t rank, nranks;
	bool has_collectives;
	uint64_t collectives;
};
cJSON *rp_comm_reply_encode(const struct rp_comm_reply *reply);
/* Refuses a comm that is not a communicator id, a generation not the id's,
 * rank not below nranks. */
int rp_comm_reply_decode(const cJSON *params, struct rp_comm_reply *out, struct rp_error *err);

/* Abort {comm} and Destroy {comm, abort, deadline_ms}. */
struct rp_comm_end {
	struct rp_id comm;
	bool abort;                  /* Destroy only */
	uint32_t deadline_ms;        /* Destroy only; 0: not given */
};
int rp_comm_end_decode(const cJSON *params, bool destroy, struct rp_comm_end *out, struct rp_error *err);
cJSON *rp_comm_end_encode(const struct rp_comm_end *req, bool destroy);
