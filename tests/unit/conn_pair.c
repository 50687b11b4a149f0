/* SPDX-License-Identifier: Apache-2.0 */
/* A connection and its peer; see conn_pair.h. */
#include <check.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "conn_pair.h"

static void pump(void *data)
{
	struct conn_pair *p = data;

	uv_run(&p->loop, UV_RUN_NOWAIT);
}

static void on_close(struct rd_conn *conn)
{
	struct conn_pair *p = conn->data;

	p->closes++;
	if (p->on_close != NULL) {
		p->on_close(conn);
	}
}

void conn_pair_open(struct conn_pair *p, void (*on_call)(struct rd_conn *conn, struct rd_call *call),
		    void (*on_close_)(struct rd_conn *conn))
{
	int sv[2];

	memset(p, 0, sizeof(*p));
	p->ops.on_call = on_call;
	p->ops.on_close = on_close;
	p->on_close = on_close_;
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(uv_loop_init(&p->loop), 0);
	ck_assert_int_eq(rd_conn_new(&p->loop, sv[0], &p->ops, p, &p->conn), 0);
	tl_conn_adopt(&p->peer, sv[1]);
	p->peer.pump = pump;
	p->peer.pump_data = p;
}

void conn_pair_close(struct conn_pair *p)
{
	if (p->peer.fd >= 0) {
		tl_conn_close(&p->peer);
	}
	if (p->closes == 0) {
		rd_conn_close(p->conn);
	}
	uv_run(&p->loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(&p->loop), 0);
}

void conn_pair_pump(struct conn_pair *p)
{
	pump(p);
}

void conn_pair_pump_until(struct conn_pair *p, const int *counter, int want)
{
	for (int i = 0; i < 2000 && *counter < want; i++) {
		pump(p);
		usleep(1000);
	}
	ck_assert_int_ge(*counter, want);
}
