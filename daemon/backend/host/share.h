/* SPDX-License-Identifier: Apache-2.0 */
/* The host device's CPUs shared among uids, not among lanes.
 *
 * Each lane is a thread, and the kernel shares the CPUs among threads: a
 * uid with sixteen lanes busy would take sixteen shares of them, and the
 * call of a uid with one lane would run at a seventeenth of its pace
 * (issue 30: "nor delay another user's call by more than its own fair
 * share"). So a lane runs a call only in one of the device's slots, one a
 * CPU, and a slot that frees goes to a waiting lane of the uid that runs
 * the fewest calls, of those the uid given a slot longest ago (round robin
 * among uids, however many lanes each has), its lane that came first. A
 * uid alone uses every slot; beside others, a call waits for at most one
 * call of each other uid waiting (the work estimate bounds each:
 * host/lane.c), and then runs on a CPU of its own.
 *
 * A communicator's calls take no slot: they wait for their peers, whose
 * calls would need the slots they held. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* A lane's place at the share: waiting for a slot, or holding one. Each
 * lane has one, and runs one call at a time. */
struct host_share_seat {
	uid_t uid;
	uint64_t ticket;               /* the order the waiting came in */
	struct host_share_seat *next;  /* in waiting or running */
};

/* The uids given a slot most recently, and when (the round robin's
 * memory: a uid not among them is taken as served longest ago). */
#define HOST_SHARE_UIDS 64

struct host_share {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned slots;
	unsigned nrunning;
	struct host_share_seat *running, *waiting;
	uint64_t next_ticket, grants;
	struct {
		uid_t uid;
		uint64_t grant;            /* 0: the entry is free */
	} served[HOST_SHARE_UIDS];
};

void host_share_init(struct host_share *s, unsigned slots);
void host_share_destroy(struct host_share *s);
/* Waits for a slot for seat (its uid set), then holds it. */
void host_share_enter(struct host_share *s, struct host_share_seat *seat);
/* Holds a slot if one is free and no lane waits for one: never blocks
 * (the worker's loop runs small calls inline). */
bool host_share_try_enter(struct host_share *s, struct host_share_seat *seat);
/* Gives seat's slot to the lane the rule picks. */
void host_share_leave(struct host_share *s, struct host_share_seat *seat);
