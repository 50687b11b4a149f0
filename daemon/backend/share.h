/* SPDX-License-Identifier: Apache-2.0 */
/* A device shared among uids, not among lanes (issue 30: "nor delay
 * another user's call by more than its own fair share").
 *
 * Each lane runs its calls on a thread or a stream of its own, and the
 * kernel shares CPUs among threads as the GPU shares itself among streams:
 * a uid with sixteen lanes busy would take sixteen shares, and the call of
 * a uid with one lane would wait behind all of them. So a lane enters the
 * share before a call runs and leaves it when the call is done.
 *
 * A uid alone runs calls at once up to a bound, so that a uid that comes
 * finds little of it ahead (issue 30: a uid calling after the linger found
 * 32 GEMMs of another's ahead on an H100). The bound is `alone_ns` of the
 * device's time: each call is charged the uid's pace (the time between
 * its calls' ends while it had calls running, a moving mean) or its own
 * least time, whichever is more, and a uid alone runs two calls at once
 * whatever they are charged, more while their charges fit alone_ns. Small
 * calls keep a deep queue (what hides a launch's latency), large ones a
 * short one (which alone keeps the device busy); a uid that made its pace
 * small with small calls and then sends large ones gets them charged at
 * their least time where it is known (GEMMs, attention), and its pace
 * follows within a few of them. alone_ns 0: a uid alone runs at most
 * `capacity` calls (the host backend's CPUs: more threads than CPUs do no
 * more work, and a uid that comes waits for one of them, not all).
 * Beside other uids, at most `capacity`
 * calls run at once, and each uid's at most its part of it (at least one)
 * among the uids with calls running or waiting: a call of a uid waits for
 * at most that many of the others' (which the work estimate bounds), and
 * no part stays idle for a uid with nothing to run. A call that may run
 * goes first when its uid runs the fewest, then when its uid had a turn
 * longest ago (the uids take turns, however many lanes each has waiting),
 * then in the order the calls came. Another uid holds the others to the
 * capacity while it has calls running or waiting, and for `linger_ns`
 * after its last one ended: a client's next call follows its last one's
 * answer, and in between the others would otherwise take every lane
 * again. The host backend's capacity is its CPUs, the CUDA backend's a
 * few calls in flight (so that a uid's call waits on the GPU behind that
 * many of each other uid's).
 *
 * A communicator's calls enter no share: they wait for their peers, whose
 * calls would need what they held. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The uids a share follows at once: those with calls running or waiting
 * or lingering. A uid past them waits until one is idle. */
#define RD_SHARE_USERS 256

struct rd_share_waiter;

struct rd_share {
	pthread_mutex_t lock;
	pthread_cond_t cond;           /* a uid waits for an entry (every one in use) */
	unsigned capacity;
	uint64_t linger_ns;
	uint64_t alone_ns;
	unsigned running;              /* calls running, every uid's */
	struct rd_share_user {
		bool used;
		uid_t uid;
		unsigned running, waiting;
		uint64_t charged_ns;       /* what its running calls were charged, together */
		uint64_t pace_ns;          /* its moving mean time between two calls' ends; 0: none yet */
		uint64_t mark_ns;          /* its last call's end, or when its calls began running */
		uint64_t idle_ns;          /* when its last call ended (CLOCK_MONOTONIC); 0: none yet */
		uint64_t served;           /* the turn it last had; 0: none yet */
	} users[RD_SHARE_USERS];
	unsigned top;                  /* entries [0, top) have been used */
	struct rd_share_waiter *waiting;
	/* The one waiting call that wakes every RECHECK_NS (a uid's linger
	 * ends with no call ending); the others sleep until they are let in. */
	struct rd_share_waiter *timekeeper;
	unsigned for_entry;            /* calls waiting for an entry */
	uint64_t turns, tickets;
};

/* capacity: the calls at once divided among the uids beside each other;
 * linger_ns: how long a uid counts after its last call ended; alone_ns:
 * the device's time a uid alone keeps charged at once (UINT64_MAX: as
 * much as it asks; 0: capacity calls). */
void rd_share_init(struct rd_share *s, unsigned capacity, uint64_t linger_ns, uint64_t alone_ns);
void rd_share_destroy(struct rd_share *s);
/* Waits until a call of uid may run, then counts it running. least_ns:
 * the least time the call takes on the device (0: not known). Returns
 * what the call is charged, for rd_share_leave. */
uint64_t rd_share_enter(struct rd_share *s, uid_t uid, uint64_t least_ns);
/* Counts a call of uid running if it may run now and no waiting call
 * would go first (its charge in *charged_ns): never blocks (the worker's
 * loop runs small calls itself). */
bool rd_share_try_enter(struct rd_share *s, uid_t uid, uint64_t least_ns, uint64_t *charged_ns);
/* A call of uid that entered, charged charged_ns, is done. */
void rd_share_leave(struct rd_share *s, uid_t uid, uint64_t charged_ns);
