/* SPDX-License-Identifier: Apache-2.0 */
/* A daemon connection and its peer on one thread, for the unit tests of
 * conn and dispatch: one end of a socketpair is an rd_conn on a libuv loop,
 * the other a raw Varlink peer (tests/lib/varlink.h) that runs the loop
 * while it waits for a reply. */
#pragma once

#include "daemon/conn.h"
#include "tests/lib/varlink.h"

struct conn_pair {
	uv_loop_t loop;
	struct rd_conn *conn;
	struct tl_conn peer;
	struct rd_conn_ops ops;
	void (*on_close)(struct rd_conn *conn);
	int closes;                 /* on_close calls */
};

/* on_call answers; on_close (may be NULL) is told after the pair counted. */
void conn_pair_open(struct conn_pair *p, void (*on_call)(struct rd_conn *conn, struct rd_call *call),
		    void (*on_close)(struct rd_conn *conn));
/* Closes both ends (the daemon's unless it closed already) and runs the
 * loop until every handle is gone. */
void conn_pair_close(struct conn_pair *p);
/* One turn of the loop without waiting. */
void conn_pair_pump(struct conn_pair *p);
/* Turns the loop until *counter reaches want; fails the test after 2 s. */
void conn_pair_pump_until(struct conn_pair *p, const int *counter, int want);
