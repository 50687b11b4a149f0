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
 * 32 GEMMs of another's ahead on an H100). With `alone_ns`, the bound is a
 * window of calls that follows the time the uid's calls take from entering
 * to their end (what a uid that came when they entered would have waited
 * for): past alone_ns the window narrows by a quarter, under half of it
 * (while the window is full) it widens by a quarter, from
 * RD_SHARE_WINDOW_START, never under two calls (one on the device and the
 * next launched behind it) nor over RD_SHARE_WINDOW_MAX. Small calls keep
 * a deep queue (what hides a launch's latency), large ones a short one
 * (which alone keeps the device busy). Beside the window, the least times
 * of the calls running (GEMMs', attention's, known from their shapes) fit
 * in alone_ns: a uid that widened its window with small calls and then
 * sends large ones gets few of them in at once. An untimed call (struct
 * rd_share_call) runs whatever the window, up to RD_SHARE_WINDOW_MAX,
 * and is not followed. alone_ns 0: a uid alone runs at most `capacity`
 * calls (the host backend's CPUs: more threads than CPUs do no more work,
 * and a uid that comes waits for one of them, not all).
 * Beside other uids, at most `capacity` calls run at once, and each uid's
 * at most its part of it (at least one) among the uids active: a call of a
 * uid waits for at most that many of each other's (which the work estimate
 * bounds). A uid is active while it has calls running or waiting, and for
 * `linger_ns` after its last one ended: a client's next call follows its
 * last one's answer, and in between the others would otherwise take its
 * part too (its part idles that long; a uid that stops calling frees it
 * after the linger). A call that may run goes first when its uid runs the
 * fewest, then when its uid had a turn longest ago (the uids take turns,
 * however many lanes each has waiting), then in the order the calls came.
 * The host backend's capacity is its CPUs, the CUDA backend's a few calls
 * in flight (so that a uid's call waits on the GPU behind that many of
 * each other uid's).
 *
 * A call that waits on the device for a client's event (CUDA's
 * cuda_client_wait = stream) enters the share as any other: attaching an
 * event to every call would otherwise take the device from the other uids.
 * It may hold its uid's part while the client's work it waits for waits
 * in turn for a later call of the same uid that the share holds back (a
 * client's stream between two of its calls, taken by the lanes in another
 * order). So while a uid has such a call running, one of its calls that
 * has waited `linger_ns` enters past every bound, one each `linger_ns`:
 * such a wait costs its uid that long, not forever, and gives it at most
 * one call each linger over its part; calls let in so do not count against
 * the capacity the other uids' calls wait for.
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
/* The window of calls a uid alone runs at once (with alone_ns): where a
 * uid's starts (a constant, not the capacity: a test lifts that, and a
 * window made meanwhile would stay lifted), and the widest. */
#define RD_SHARE_WINDOW_START 4
#define RD_SHARE_WINDOW_MAX 64

struct rd_share_waiter;

struct rd_share {
	pthread_mutex_t lock;
	pthread_cond_t cond;           /* a uid waits for an entry (every one in use) */
	unsigned capacity;
	uint64_t linger_ns;
	uint64_t alone_ns;
	unsigned running;              /* calls running, every uid's */
	unsigned escaped;              /* of them, let in past the bounds (a uid's client wait) */
	struct rd_share_user {
		bool used;
		uid_t uid;
		unsigned running, waiting;
		unsigned window;           /* calls it may run at once alone (with alone_ns) */
		uint64_t least_ns;         /* its running calls' least times, together */
		uint64_t idle_ns;          /* when its last call ended (CLOCK_MONOTONIC); 0: none yet */
		uint64_t served;           /* the turn it last had; 0: none yet */
		unsigned client_waits;     /* its running calls that wait for a client's event */
		uint64_t escaped_ns;       /* when a call of its last entered past the bounds; 0: never */
	} users[RD_SHARE_USERS];
	unsigned top;                  /* entries [0, top) have been used */
	struct rd_share_waiter *waiting;
	/* The one waiting call that wakes every RECHECK_NS (a uid's linger
	 * ends with no call ending); the others sleep until they are let in. */
	struct rd_share_waiter *timekeeper;
	unsigned for_entry;            /* calls waiting for an entry */
	uint64_t turns, tickets;
};

/* A call that asks to enter. */
struct rd_share_call {
	uint64_t least_ns;             /* the least time it takes on the device; 0: not known */
	/* Its uid alone runs it whatever its window (up to the widest), and
	 * its time is not followed: it may wait on the device for a client's own work (a CUDA
	 * call behind another that waits on a client's event), which is not
	 * what a uid that comes would find ahead of it. */
	bool untimed;
	/* It waits on the device for a client's event: while it runs, its
	 * uid's waiting calls may enter past the bounds, one each linger. */
	bool waits;
};

/* What a call that entered carries to its end. */
struct rd_share_ticket {
	uint64_t entered_ns;           /* CLOCK_MONOTONIC */
	struct rd_share_call call;
	bool escaped;                  /* let in past the bounds */
};

/* capacity: the calls at once divided among the uids beside each other;
 * linger_ns: how long a uid counts after its last call ended; alone_ns:
 * the time a uid alone keeps its calls from entering to their end, at most
 * (UINT64_MAX: as many at once as it asks; 0: capacity calls at once). */
void rd_share_init(struct rd_share *s, unsigned capacity, uint64_t linger_ns, uint64_t alone_ns);
void rd_share_destroy(struct rd_share *s);
/* Waits until a call of uid may run, then counts it running. */
struct rd_share_ticket rd_share_enter(struct rd_share *s, uid_t uid, struct rd_share_call call);
/* Counts a call of uid running if it may run now and no waiting call
 * would go first: never blocks (the worker's loop runs small calls
 * itself). */
bool rd_share_try_enter(struct rd_share *s, uid_t uid, struct rd_share_call call, struct rd_share_ticket *ticket);
/* A call of uid that entered with ticket is done. */
void rd_share_leave(struct rd_share *s, uid_t uid, struct rd_share_ticket ticket);
