/* SPDX-License-Identifier: Apache-2.0 */
/* Whose a communicator's unique id is, on this worker: the rule that binds
 * io.regen.Comm's membership to uids.
 *
 * A unique id is all a process needs to join a communicator as any rank
 * it names, and it travels between the ranks in the clear (a store, a file,
 * the environment). So a communicator's ranks on a worker are all of one
 * uid: an id this worker made (GetUniqueId) is the uid's that asked for
 * it; one made elsewhere (another device's worker, another node, NCCL
 * itself) is the uid's whose process first joined with it here. Init with
 * an id that is another uid's is refused (io.regen.NotPermitted) before it
 * reaches the backend, so no other user can take a rank, read the ranks'
 * data or hold the rendezvous.
 *
 * The ids this worker made are remembered, at most RD_COMM_OWNERS_PER_UID
 * per uid and RD_COMM_OWNERS_MAX in all; past either, the oldest id of
 * the uid that has most goes first, so that another uid's asking cannot
 * push out the ids of a uid that asked less. An id forgotten before its
 * first Init is bound by that Init, as one made elsewhere. On the loop
 * thread. */
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

/* This worker made `id` for uid. */
void rd_comm_owners_made(struct rd_comm_owners *t, uid_t uid, const unsigned char id[RP_COMM_ID_SIZE]);
/* 0 and *uid when this worker made `id` and still remembers it; -ENOENT. */
int rd_comm_owners_find(const struct rd_comm_owners *t, const unsigned char id[RP_COMM_ID_SIZE], uid_t *uid);
