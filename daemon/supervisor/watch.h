/* SPDX-License-Identifier: Apache-2.0 */
/* The node's epoch and the io.regen.Device.Watch subscribers. The epoch goes
 * up by one with any device's generation, here and nowhere else; every
 * subscriber hears of every state transition of every device (the state
 * entered, its generation, why) as one "continues" reply, in order. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include "daemon/conn.h"
#include "daemon/supervisor/device.h"

struct rd_sv_watcher;

struct rd_sv_watch {
	uint64_t epoch;                 /* starts at 1 */
	struct rd_sv_watcher *watchers;
	/* A reply may close its connection (a failed write), whose close
	 * drops that connection's watchers: while an announcement walks the
	 * list, drop only marks them, and the walk unlinks them after. */
	bool announcing;
};

void rd_sv_watch_init(struct rd_sv_watch *w);
/* Watches one connection, and one uid, may hold: each is served every
 * event, so without a bound a client could make every change cost the
 * supervisor as much as it likes. One per connection: replies go out in
 * order, so a second Watch behind the first (which never ends) could only
 * pile up events nobody will read. */
#define RD_WATCHES_PER_CONNECTION 1
#define RD_WATCHES_PER_UID 64

/* A Watch call: one reply per device as it is now (reason "subscribed"),
 * then every change until its connection closes. -ENOMEM: not subscribed;
 * -EUSERS: over a bound above (err set to LimitExceeded). */
int rd_sv_watch_subscribe(struct rd_sv_watch *w, struct rd_call *call, const struct rd_sv_device *devices, int n,
			  struct rp_error *err);
/* Some device's generation went up: the epoch goes with it. */
void rd_sv_watch_bump(struct rd_sv_watch *w);
/* Every watcher hears of d as it is now: a transition. */
void rd_sv_watch_announce(struct rd_sv_watch *w, const struct rd_sv_device *d);
/* conn closed: its Watch calls end. */
void rd_sv_watch_drop(struct rd_sv_watch *w, struct rd_conn *conn);
/* regend stops: every Watch call fails with io.regen.Draining. */
void rd_sv_watch_end(struct rd_sv_watch *w);
