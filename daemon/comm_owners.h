/* SPDX-License-Identifier: Apache-2.0 */
/* Whose a communicator's unique id is, on this node: the rule that binds
 * io.regen.Comm's membership to uids.
 *
 * A unique id is all a process needs to join a communicator as any rank
 * it names, and it travels between the ranks in the clear (a store, a file,
 * the environment). So a communicator's ranks are all of one uid, on every
 * device of the node: an id a worker made (GetUniqueId) is the uid's that
 * asked for it; one made elsewhere (another node, NCCL itself) is the
 * uid's whose process first joined with it on any device here. Init with
 * an id that is another uid's is refused (io.regen.NotPermitted) before it
 * reaches the backend, so no other user can take a rank, read the ranks'
 * data or hold the rendezvous.
 *
 * The supervisor keeps the one table; a worker asks it
 * (io.regen.Worker.CommOwner) before it hands a new id to its client and
 * before an Init joins with an id none of its own communicators holds.
 * Each uid has at most RD_COMM_OWNERS_PER_UID ids, RD_COMM_OWNERS_MAX in
 * all; past either, the oldest id of the uid that has most goes first, so
 * that another uid's asking cannot push out the ids of a uid that asked
 * less. An id forgotten is bound again by the next Init that names it, as
 * one made elsewhere. On the supervisor's loop. */
#pragma once

#include <stdint.h>
#include <sys/types.h>
#include "proto/compute.h"

#define RD_COMM_OWNERS_MAX 256
#define RD_COMM_OWNERS_PER_UID 16

struct rd_comm_owners {
	struct {
		uint64_t serial;        /* 0: free; else the order it was made in */
		uid_t uid;
		unsigned char id[RP_COMM_ID_SIZE];
	} ids[RD_COMM_OWNERS_MAX];
	uint64_t next_serial;
};

/* A worker made `id` for uid. */
void rd_comm_owners_made(struct rd_comm_owners *t, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE]);
/* 0 and *uid when the table holds `id`; -ENOENT. */
int rd_comm_owners_find(const struct rd_comm_owners *t, const unsigned char id[RP_COMM_ID_SIZE], uid_t *uid);
/* A process of uid joins with `id`: its owner, which an id the table does
 * not hold becomes uid (the first to join with it). */
uid_t rd_comm_owners_claim(struct rd_comm_owners *t, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE]);
