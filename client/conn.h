/* SPDX-License-Identifier: Apache-2.0 */
/* One blocking Varlink connection of libregen: connect with a deadline,
 * send a call (with fds), receive replies. Private to libregen. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>
#include "proto/frame.h"

/* Monotonic milliseconds; deadlines are absolute values of this clock.
 * RC_FOREVER means no deadline. */
#define RC_FOREVER INT64_MAX
int64_t rc_now_ms(void);
int64_t rc_deadline(double seconds);

struct rc_conn {
	int fd;                       /* -1 when closed */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct rp_rx rx;
};

/* Sleeps *delay_ms before a retry, then doubles it (up to about max_ms).
 * -ETIMEDOUT, without sleeping, when the retry would come past the deadline. */
int rc_backoff(int64_t deadline, int *delay_ms, int max_ms);

void rc_conn_init(struct rc_conn *c);
/* Connects to `path`. With `retry`, ENOENT and ECONNREFUSED (a daemon or
 * worker on its way back) are retried until the deadline. Returns 0 or
 * -errno (-ETIMEDOUT when retrying ran out of time). */
int rc_conn_open(struct rc_conn *c, const char *path, int64_t deadline, bool retry);
/* The errors of a socket that is not there yet, or not yet listening: a
 * daemon or worker on its way back. */
static inline bool rc_conn_retryable(int r)
{
	return r == -ENOENT || r == -ECONNREFUSED || r == -EAGAIN;
}
void rc_conn_close(struct rc_conn *c);
static inline bool rc_conn_is_open(const struct rc_conn *c) { return c->fd >= 0; }
/* True when an idle connection was closed by the peer (checked without
 * blocking). Buffered bytes that arrived unasked are kept. */
bool rc_conn_peer_gone(struct rc_conn *c);
/* Sends one message (NUL appended) with fds. -ECONNRESET when the peer is
 * gone, -ETIMEDOUT at the deadline. */
int rc_conn_send(struct rc_conn *c, const char *text, const int *fds, size_t nfds, int64_t deadline);
/* Receives one message. -ECONNRESET when the peer closed the connection,
 * -ETIMEDOUT at the deadline, -EMSGSIZE for a message over the limit. */
int rc_conn_recv(struct rc_conn *c, struct rp_msg *msg, int64_t deadline);

/* rp_msg_finish for a message that may never have been filled. */
static inline void rc_msg_drop(struct rp_msg *m)
{
	if (m->text != NULL) {
		rp_msg_finish(m);
	}
	m->text = NULL;
	m->nfds = 0;
}
