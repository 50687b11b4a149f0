/* SPDX-License-Identifier: Apache-2.0 */
/* A host communicator's group: what the ranks of one unique id share, in
 * memory every worker process of one regend with a rank in it maps. So a
 * communicator spans devices (one worker process each) as NCCL's do, and
 * several ranks on one worker share one mapping.
 *
 * The memory is a file in regend's socket directory, named after the
 * unique id's first 16 bytes (regen.comm-<32 hex digits>) and made 0600 by
 * the first worker to join; the others open it and compare the whole id.
 * The last rank to leave removes the name. Two regends that share a socket
 * directory share their host communicators too: the host backend's stand-in
 * for the network between nodes (tests/ops/test_netns.py runs two in two
 * network namespaces so). A worker that drives the backend without
 * regend's options (a test) keeps its groups in anonymous memory, seen by
 * its own ranks alone.
 *
 * In it: a robust process-shared mutex (a worker that dies holding it fails
 * the group instead of hanging it), a futex word every change bumps and
 * every waiter sleeps on, the ranks' table (their worker's pid, what each
 * posted for the step in progress, its point-to-point channel), and per rank
 * a staging slot for collectives and one for Send. A wait wakes at every
 * change and every GROUP_WAIT_SLICE_MS, and then looks whether each peer's
 * worker is still there: a worker that died fails the group, so its peers
 * end with CommFailed within a slice, not at their deadline.
 *
 * A group that failed stays failed: its reason, written once under the
 * lock before `failed` is set, is read without it. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "proto/compute.h"

#define HOST_GROUP_REASON_MAX 200

/* What a rank posted for the step in progress: the call, and which step
 * of it (a collective moves through the slots in steps). */
struct host_group_post {
	uint32_t kind;                 /* enum rp_comm_kind */
	uint32_t dtype;
	uint32_t op;
	uint32_t root;
	uint64_t count;                /* rp_comm_count */
	uint64_t call;                 /* the rank's collectives begun before it */
	uint64_t part;                 /* the step within the call */
};

/* A rank's Send in progress: the chunk in its p2p slot, for `dst`. */
enum { HOST_P2P_IDLE = 0, HOST_P2P_POSTED };

struct host_group_p2p {
	uint32_t state;
	uint32_t dst;
	uint32_t dtype;
	uint64_t count;                /* the message's elements */
	uint64_t offset, bytes;        /* the chunk's place in the message */
};

struct host_group_rank {
	_Atomic int32_t pid;           /* its worker's; 0: not joined */
	uint32_t present;              /* joined and not left */
	struct host_group_post post;
	struct host_group_p2p p2p;
};

struct host_group_shm {
	_Atomic uint32_t magic;        /* set last by the maker: the rest is ready */
	uint32_t nranks;
	uint64_t slot_bytes;           /* each rank's staging, and again its p2p slot */
	uint64_t map_bytes;
	unsigned char id[RP_COMM_ID_SIZE];
	pthread_mutex_t lock;
	_Atomic uint32_t seq;          /* the futex word */
	_Atomic uint32_t failed;
	char reason[HOST_GROUP_REASON_MAX];
	uint32_t joined;               /* ranks that ever joined */
	uint32_t members;              /* ranks in it now */
	uint32_t arrived, departed;    /* the step in progress */
	uint64_t arrivals_done;        /* steps every rank posted to */
	uint64_t steps;                /* steps every rank finished */
	uint32_t named;                /* its file still has its name */
	struct host_group_rank ranks[];
};

/* One worker's handle on a group: its mapping, shared by its ranks. */
struct host_group {
	unsigned char id[RP_COMM_ID_SIZE];
	struct host_group_shm *shm;
	size_t map_bytes;
	char name[96];                 /* in the directory; "" when anonymous */
	unsigned refs;                 /* this worker's ranks in it, and calls waiting in it */
	struct host_group *next;
};

/* Where groups are made (at the backend's open): the socket directory of
 * `socket_path`, or nowhere (NULL: anonymous memory). Returns 0 or
 * -errno with why. */
int host_groups_open(const char *socket_path, char *why, size_t why_size);
void host_groups_close(void);

/* The group of `id` for a rank joining it with nranks: this worker's
 * handle, or the group's memory opened (made by the first), with a
 * reference. -errno and why (a sentence for CommFailed's reason). */
int host_group_get(const unsigned char id[RP_COMM_ID_SIZE], uint32_t nranks, struct host_group **out, char *why,
		   size_t why_size);
/* Another reference (a call that waits in it). */
void host_group_hold(struct host_group *g);
/* Drops a reference; the last unmaps it. */
void host_group_put(struct host_group *g);

/* Takes the group's lock; a worker that died holding it fails the group. */
void host_group_lock(struct host_group *g);
void host_group_unlock(struct host_group *g);
/* With the lock: fails the group (the first reason stays) and wakes
 * every waiter. */
void host_group_fail_locked(struct host_group *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* With the lock: wakes every waiter. */
void host_group_wake_locked(struct host_group *g);
/* Why the group failed, or NULL. Any thread, no lock. */
const char *host_group_failed(const struct host_group *g);

/* With the lock: sleeps (the lock let go meanwhile) until done(arg) holds
 * or the group failed, looking at the peers' workers each slice. 0, or
 * -EIO when the group failed (done not holding). */
int host_group_wait_locked(struct host_group *g, bool (*done)(struct host_group *g, void *arg), void *arg);

/* With the lock: joins rank (0), or refuses with why (-EINVAL: the
 * group's nranks differ, the rank joined already, the group failed). */
int host_group_join_locked(struct host_group *g, uint32_t rank, uint32_t nranks, char *why, size_t why_size);
/* With the lock: the rank leaves (a collective under way fails, as it
 * could never complete; the others fail when they next need the rank).
 * The last one out removes the name. */
void host_group_leave_locked(struct host_group *g, uint32_t rank, const char *why);
/* With the lock, once every rank joined: a rank that left, or -1. */
int host_group_absent_locked(const struct host_group *g);

/* A rank's collective staging slot and its p2p slot, slot_bytes each. */
static inline char *host_group_slot(const struct host_group *g, uint32_t rank)
{
	size_t table = sizeof(struct host_group_shm) + (size_t)g->shm->nranks * sizeof(struct host_group_rank);

	table = (table + 63) & ~(size_t)63;
	return (char *)g->shm + table + (size_t)rank * g->shm->slot_bytes;
}

static inline char *host_group_p2p_slot(const struct host_group *g, uint32_t rank)
{
	return host_group_slot(g, g->shm->nranks + rank);
}
